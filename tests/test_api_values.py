"""The API's values: objectives as frozen values (no registry), limits as one pytree, the one
bisection, ``dcost.stack``, the prefill report's ``ttft``, the one precision rule."""

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost
from dcost.bisection import bisect, ceil_midpoint, floor_midpoint, midpoint, steps_for
from dcost.search import objectives
from dcost.search.problem import better, evaluate

H100 = dcost.hardware("h100-sxm")
LLAMA = dcost.model("llama-3-8b")


def small_problem(**kw):
    return dcost.Problem(H100, LLAMA, dcost.Workload(1024), free={"batch": (1, 64)}, **kw)


# ---------------------------------------------------------------- objectives as values


def test_string_resolves_to_the_builtin_value():
    for name, value in (
        ("cost_per_token", dcost.COST_PER_TOKEN),
        ("cost_per_input_token", dcost.COST_PER_INPUT_TOKEN),
    ):
        p = small_problem(objective=name, **({"tpot_slo": None} if "input" in name else {}))
        assert p.objective is value
        assert str(p.objective) == name and p.objective.name == name
    assert small_problem(objective=dcost.COST_PER_TOKEN).objective is dcost.COST_PER_TOKEN


def test_builtin_table_is_read_only_and_has_no_register():
    assert set(objectives.BUILTIN) == {
        "cost_per_token",
        "cost_per_input_token",
        "lifetime_cost",
        "tco",
    }
    with pytest.raises(TypeError):
        objectives.BUILTIN["mine"] = dcost.COST_PER_TOKEN
    assert not hasattr(objectives, "register") and not hasattr(objectives, "OBJECTIVES")


def test_objectives_are_frozen_and_hashable():
    assert hash(dcost.COST_PER_TOKEN) == hash(dcost.COST_PER_TOKEN)
    assert len({dcost.COST_PER_TOKEN, dcost.COST_PER_INPUT_TOKEN, dcost.LIFETIME_COST}) == 3
    with pytest.raises(dataclasses.FrozenInstanceError):
        dcost.COST_PER_TOKEN.name = "other"


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(dcost.SpecError) as err:
        small_problem(objective="cheapest")
    for name in ("cost_per_token", "cost_per_input_token", "lifetime_cost", "'cheapest'"):
        assert name in str(err.value)


@pytest.mark.slow
def test_a_user_objective_runs_through_optimize_and_grid():
    """A user's own objective, passed as a value: decode's cost per token squared, whose
    minimizer is the same design as cost_per_token's."""

    def squared(design, problem, smoothness):
        r = dcost.decode(design, problem.hardware, problem.model, problem.workload, smoothness)
        q = {"tpot": r.tpot, "memory": r.memory_per_chip}
        return r.cost_per_token**2, q, r

    mine = dcost.Objective(
        "squared_cost",
        "$^2 per output token^2",
        squared,
        {"batch"},
        {"tpot", "memory"},
        batch_monotone=True,
    )
    p = small_problem(objective=mine, tpot_slo=0.02)
    ref = small_problem(tpot_slo=0.02)
    g, g_ref = dcost.grid_search(p), dcost.grid_search(ref)
    assert p.objective is mine and bool(g.feasible)
    np.testing.assert_array_equal(np.asarray(g.x), np.asarray(g_ref.x))
    assert float(g.cost) == pytest.approx(float(g_ref.cost) ** 2, rel=1e-5)


def test_objective_rejects_bad_fields():
    with pytest.raises(dcost.SpecError, match="Objective.constraints"):
        dcost.Objective("x", "$", lambda d, p, s: None, {"batch"}, "tpot")
    with pytest.raises(dcost.SpecError, match="callable"):
        dcost.Objective("x", "$", None, {"batch"}, {"tpot"})


# ---------------------------------------------------------------- limits


def test_limits_as_keywords_or_as_one_pytree():
    a = small_problem(tpot_slo=0.03, chip_budget=8)
    b = small_problem(limits=dcost.Limits(tpot_slo=0.03, chip_budget=8))
    assert a.constraints == b.constraints == ("tpot", "memory", "replica_chips")
    assert float(a.tpot_slo) == float(b.limits.tpot_slo) == pytest.approx(0.03)
    x = jnp.array([16.0])
    np.testing.assert_array_equal(evaluate(a, x).values, evaluate(b, x).values)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(tpot=0.05), "unknown keyword 'tpot'"),
        (dict(limits=dcost.Limits(), tpot_slo=0.05), "not both"),
        (dict(limits={"tpot_slo": 0.05}), "dcost.Limits"),
        (dict(limits=dcost.Limits(loss_target=2.0)), "loss_target does not apply"),
    ],
)
def test_limits_bad_input(kwargs, match):
    with pytest.raises(dcost.SpecError, match=match):
        small_problem(**kwargs)


def test_replica_chips_constraint_counts_stages_times_chips():
    p = dcost.Problem(
        H100,
        LLAMA,
        dcost.Workload(1024),
        free={"batch": (1, 64), "chips": (1, 8), "stages": (1, 4)},
        chip_budget=6,
    )
    ev = evaluate(p, jnp.array([8.0, 2.0, 4.0]))
    j = p.constraints.index("replica_chips")
    assert float(ev.values[j]) == 8.0 and not bool(ev.feasible)
    assert float(dcost.Design(batch=1, chips=2, stages=4).chips_per_replica) == 8.0


# ---------------------------------------------------------------- one bisection


def test_bisection_continuous_root():
    a, b = bisect(lambda t: t**3 - 2.0 >= 0, jnp.asarray(0.0), jnp.asarray(2.0), 40)
    assert float(midpoint(a, b)) == pytest.approx(2.0 ** (1 / 3), rel=1e-6)


@pytest.mark.parametrize("limit", [1, 2, 37, 64, 100])
def test_bisection_whole_numbers_against_a_scan(limit):
    """Largest n in [1, 100] with n <= limit (floor split), smallest with n >= limit (ceil)."""
    n = steps_for(100)
    good, _ = bisect(lambda v: v > limit, jnp.asarray(1.0), jnp.asarray(101.0), n, floor_midpoint)
    _, least = bisect(lambda v: v >= limit, jnp.asarray(0.0), jnp.asarray(100.0), n, ceil_midpoint)
    assert float(good) == max(v for v in range(1, 101) if v <= limit)
    assert float(least) == min(v for v in range(1, 101) if v >= limit)


def test_bisection_vmaps():
    roots = jax.vmap(
        lambda c: midpoint(*bisect(lambda t: t * t >= c, jnp.asarray(0.0), jnp.asarray(4.0), 40))
    )(jnp.array([1.0, 4.0, 9.0]))
    np.testing.assert_allclose(np.asarray(roots), [1.0, 2.0, 3.0], rtol=1e-6)


def test_better_is_lexicographic():
    assert bool(better((0.0, 2.0), (1.0, 1.0)))
    assert bool(better((0.0, 1.0, 5), (0.0, 1.0, 6)))
    assert not bool(better((0.0, 1.0, 6), (0.0, 1.0, 6)))
    assert not bool(better((1.0, 0.0), (0.0, 9.0)))


# ---------------------------------------------------------------- stack


def test_stack_batches_specs_and_checks_structure():
    hw = dcost.stack([H100, dcost.hardware("b200")])
    assert hw.flops.shape == (2,)
    assert float(hw.flops[1]) == float(dcost.hardware("b200").flops)
    with pytest.raises(dcost.SpecError, match="at least one"):
        dcost.stack([])
    with pytest.raises(dcost.SpecError, match=r"trees\[1\]"):
        dcost.stack([dcost.Design(batch=1), dcost.Design(batch=1, experts=8)])


def test_stack_keeps_each_leafs_type_and_works_under_jit():
    """The host fast path (``specs._stack_leaf``) gives what ``jnp.stack`` gives, leaf by leaf:
    values, dtype and weak type, for arrays, Python numbers and a mix; and traced leaves stack
    inside ``jit``."""
    trees = [
        dcost.hardware("h100-sxm"),
        dcost.hardware("b200"),
        eqx.tree_at(lambda h: h.price_per_hour, dcost.hardware("h200"), 3.5),  # a Python float
    ]
    got = dcost.stack(trees)
    want = jax.tree.map(lambda *xs: jnp.stack([jnp.asarray(x) for x in xs]), *trees)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        assert (a.dtype, a.weak_type) == (b.dtype, b.weak_type)
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    flops = jax.jit(lambda a, b: dcost.stack([a, b]).flops)(trees[0], trees[1])
    np.testing.assert_array_equal(np.asarray(flops), np.asarray(got.flops[:2]))


# ---------------------------------------------------------------- prefill report


def test_prefill_report_names_its_time_ttft():
    r = dcost.prefill(dcost.Design(batch=2), H100, LLAMA, dcost.Workload(0, prompt=512))
    assert isinstance(r, dcost.PrefillReport) and not hasattr(r, "tpot")
    assert float(r.ttft) == pytest.approx(float(r.t_stage))  # one stage: the pass is the step
    assert float(r.tokens_per_s) == pytest.approx(2 * 512 / float(r.ttft), rel=1e-6)
    d = dcost.decode(dcost.Design(batch=2), H100, LLAMA, dcost.Workload(512))
    assert not hasattr(d, "ttft")


# ---------------------------------------------------------------- one precision rule


@pytest.mark.parametrize("model_name", ["deepseek-v3", "llama-3-70b", "gpt-oss-120b"])
def test_one_precision_rule(model_name):
    precision = dcost.presets.serving_precision(model_name)
    h = dcost.presets.serving_hardware("h100-sxm", model_name)
    assert float(h.flops) == float(dcost.hardware("h100-sxm", precision=precision).flops)
    assert float(dcost.presets.pair("h100-sxm", model_name)[0].flops) == float(h.flops)


def test_auto_precision_falls_back_to_bf16_where_the_chip_has_no_rate():
    a100 = dcost.presets.serving_hardware("a100-80gb", "deepseek-v3")
    assert float(a100.flops) == float(dcost.hardware("a100-80gb").flops)
    with pytest.raises(dcost.PresetError, match="flops_fp8"):
        dcost.presets.serving_hardware("a100-80gb", "deepseek-v3", precision="fp8")
