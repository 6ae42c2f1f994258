"""A plan offers only layouts an engine can launch: tensor-parallel attention over a number of
chips that splits the model's heads (``dcost.specs.attention_splits``), checked against the
engines' own rule written the way they enforce it."""

from __future__ import annotations

import pytest

import dcost
from dcost.planning.planner import Options, layouts
from dcost.planning.search import KINDS
from dcost.presets import model_card
from dcost.specs import attention_splits


def engine_launches(heads: int, kv_heads: int, degree: int) -> bool:
    """vLLM's checks as it builds the attention of ``degree`` tensor-parallel ranks (SGLang's
    and TensorRT-LLM's are the same): ``Total number of attention heads must be divisible by
    tensor parallel size``; then ``QKVParallelLinear`` takes ``divide(tp, kv)`` replicas of each
    KV head when ``tp >= kv``, else ``divide(kv, tp)`` KV heads a rank, and ``divide`` asserts
    that the division is exact."""
    if heads % degree:
        return False
    if degree >= kv_heads:
        return degree % kv_heads == 0
    return kv_heads % degree == 0


def card_heads(name: str) -> tuple[int, int]:
    """(query heads, KV heads) as the model card states them; MLA caches one latent."""
    arch = model_card(name)["arch"]
    heads = int(arch["n_heads"])
    if arch.get("attention", "gqa") == "mla":
        return heads, 1
    return heads, int(arch.get("n_kv_heads", heads))


@pytest.mark.parametrize("name", dcost.model_names())
def test_attention_splits_is_the_engines_rule(name):
    m = dcost.model(name)
    heads, kv = card_heads(name)
    assert (float(m.attention_heads), float(m.kv_heads)) == (heads, kv)
    for t in range(1, 161):
        assert attention_splits(m, t) == engine_launches(heads, kv, t), (name, t)


def test_a_model_without_head_counts_splits_any_way():
    m = dcost.Model(2, 8, 100.0, 0.0, 0, 0, 64.0, 2.0)
    assert all(attention_splits(m, t) for t in (1, 3, 7, 72))
    h = dcost.hardware("gb200-nvl72")
    for kind in KINDS:
        assert layouts(kind, h, m) == layouts(kind, h, m, launchable=False)
    assert not attention_splits(dcost.model("llama-3-70b"), 2.5)


@pytest.mark.parametrize("chip", ["h100-sxm", "b200", "gb200-nvl72"])
@pytest.mark.parametrize("name", ["llama-3.1-8b", "llama-3-405b", "qwen3-14b", "deepseek-v3"])
def test_every_layout_offered_launches(chip, name):
    """Every layout's attention degree G/A launches; what the filter drops is exactly what does
    not; a pipeline's stages take the most chips of the domain that launch."""
    h, m = dcost.hardware(chip), dcost.model(name)
    heads, kv = card_heads(name)
    for kind in KINDS:
        kept = layouts(kind, h, m)
        every = layouts(kind, h, m, launchable=False)
        assert kept, (chip, name, kind)
        for g, _, a, *_ in kept:
            assert engine_launches(heads, kv, int(g / a)), (kind, g, a)
        dropped = [x for x in every if x not in kept]
        assert all(not engine_launches(heads, kv, int(g / a)) or p > 1 for g, p, a, *_ in dropped)
        piped = {(g, a) for g, p, a, *_ in kept if p > 1}
        domain = float(h.scaleup_size)
        for g, a in piped:
            tp = [c for c in (1, 2, 4, 8, 16, 32, 64, 72) if c <= domain]
            best = max(c for c in tp if engine_launches(heads, kv, c if a == 1 else 1))
            assert g == best, (kind, g, a)


def test_a_72_chip_domain_splits_llama_405b_over_64():
    """128 query heads do not split over 72 chips: the pipeline's stages take 64 of an NVL72
    domain, where they took 72 before the rule (an engine refuses --tensor-parallel-size 72)."""
    h, m = dcost.hardware("gb200-nvl72"), dcost.model("llama-3-405b")
    kept = {x[:2] for x in layouts("aggregated", h, m)}
    every = {x[:2] for x in layouts("aggregated", h, m, launchable=False)}
    assert (72.0, 1.0) in every and (72.0, 2.0) in every
    assert not any(g == 72.0 for g, _ in kept)
    assert {(64.0, 2.0), (64.0, 4.0)} <= kept


def test_chips_no_engine_launches_are_named():
    p = dcost.plan(
        dcost.hardware("h100-sxm"),
        dcost.model("llama-3-70b"),
        dcost.traffic("chat", rate=10.0),
        mode="aggregated",
        options=Options(chips=(3, 6)),
    )
    assert not p.feasible and p.binding == "layout"
    assert "64 query heads, 8 KV heads" in p.message and "(3, 6)" in p.message


def test_repair_moves_chips_to_a_degree_that_splits_the_heads():
    """3 chips do not split Llama 3.1 8B's 32 heads: the repair goes to 2 or 4 by its direction;
    5 divides Qwen3-14B's 40 query heads but not its 8 KV heads: to 4 or 8."""
    import jax.numpy as jnp

    from dcost.search.problem import admissible, repair

    for name, chips, down, up in (("llama-3.1-8b", 3.0, 2.0, 4.0), ("qwen3-14b", 5.0, 4.0, 8.0)):
        p = dcost.Problem(
            dcost.hardware("h100-sxm"),
            dcost.model(name),
            dcost.Workload(2048),
            free={"batch": (1, 1024), "chips": (1, 8)},
            tpot_slo=0.02,
        )
        x = jnp.array([64.0, chips])
        assert not bool(admissible(p, x))
        for direction, want in ((-1.0, down), (1.0, up)):
            moved, ok = repair(p, x, direction)
            assert bool(ok) and float(moved[1]) == want and float(moved[0]) == 64.0
            assert bool(admissible(p, moved))


def test_optimize_answers_chips_an_engine_launches():
    """Without head counts (``attention_heads=0``) the cheapest design of Llama 3.1 8B at a
    10 ms TPOT takes 3 chips, which no engine launches; with them, the search and the exhaustive
    grid agree on a degree that splits the heads, at a higher cost."""
    h = dcost.hardware("h100-sxm", calibrated=True)

    def problem(m):
        return dcost.Problem(
            h, m, dcost.Workload(2048), free={"batch": (1, 1024), "chips": (1, 8)}, tpot_slo=0.01
        )

    m = dcost.model("llama-3.1-8b")
    any_split = dcost.model("llama-3.1-8b", attention_heads=0, kv_heads=0)  # 3 <= 8: same cost
    free_grid = dcost.grid_search(problem(any_split))
    assert float(free_grid.x[1]) == 3.0 and not attention_splits(m, 3)
    best, grid = dcost.optimize(problem(m)), dcost.grid_search(problem(m))
    assert attention_splits(m, float(best.x[1])) and bool(best.feasible)
    assert float(best.cost) == pytest.approx(float(grid.cost), rel=1e-6)
    assert float(grid.cost) > float(free_grid.cost)


@pytest.mark.parametrize("name", dcost.model_names())
def test_repair_tries_every_degree_that_splits_a_preset(name):
    """``repair`` tries 27 degrees, not all 256: every degree up to 256 that splits the preset's
    heads (the engines' rule, exhaustively) is among them."""
    import numpy as np

    from dcost.search.problem import degrees

    m = dcost.model(name)
    heads, kv = card_heads(name)
    tried = {float(t) for t in np.asarray(degrees(m, np.float32))}
    assert {float(t) for t in range(1, 257) if engine_launches(heads, kv, t)} <= tried
