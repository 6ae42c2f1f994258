"""Sensitivities of the optimum, checked against re-solving the relaxation with perturbed inputs.

Everything runs in float64, as ONE batched ``sensitivity`` call over the base cases and their
perturbations (one compilation): the finite differences of the re-solved optimal cost are then
compared with the envelope-theorem elasticities, the multipliers and the implicit derivatives.
"""

from __future__ import annotations

import dataclasses

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost
from dcost.search.problem import evaluate

# every test shares the relaxed and polished solutions (the ``solved`` fixture)
pytestmark = pytest.mark.slow

H = 1e-4  # relative perturbation of the finite differences
FREE = {"batch": (1, 4096), "chips": (1, 8)}
OFF = 1e3

# name: (model, context, tpot_slo, ttft_slo, the SLO whose multiplier is checked)
CASES = {
    "tpot-bound": ("llama-3-8b", 1024, 0.003, OFF, "tpot"),
    "ttft-bound": ("llama-3-8b", 8192, 0.1, 0.5, "ttft"),
    "moe-tpot-bound": ("moe64", 256, 0.004, OFF, "tpot"),
}
PERTURB = ("base", "bw+", "bw-", "flops+", "flops-", "slo+", "slo-")


def moe64():
    return dcost.Model(
        n_layers=24,
        d_model=2048,
        params_dense=1.0e9,
        params_per_expert=24 * 3 * 2048 * 1408,
        n_experts=64,
        experts_active=6,
        kv_bytes_per_token=2 * 24 * 16 * 128 * 2,
        bytes_per_param=2.0,
        attn_flops_per_context_token=4 * 24 * 16 * 128,
        n_moe_layers=24,
    )


def scenario(name, kind):
    model, ctx, tpot, ttft, slo = CASES[name]
    h = dcost.hardware("h100-sxm")
    scale = {"+": 1 + H, "-": 1 - H}.get(kind[-1], 1.0)
    if kind.startswith("bw"):
        h = dcost.hardware("h100-sxm", hbm_bandwidth=float(h.hbm_bandwidth) * scale)
    if kind.startswith("flops"):
        h = dcost.hardware("h100-sxm", flops=float(h.flops) * scale)
    if kind.startswith("slo"):
        tpot, ttft = (tpot * scale, ttft) if slo == "tpot" else (tpot, ttft * scale)
    m = moe64() if model == "moe64" else dcost.model(model)
    return h, m, dcost.Workload(ctx), tpot, ttft


@pytest.fixture(scope="module")
def solved():
    with jax.enable_x64(True):
        rows = [scenario(n, k) for n in CASES for k in PERTURB]
        rows.append(
            (
                dcost.hardware("h100-sxm"),
                dcost.model("llama-3-70b"),
                dcost.Workload(128),
                0.002,
                OFF,
            )
        )  # infeasible: the weights alone take 5 ms to read
        p = dcost.Problem(
            dcost.stack([r[0] for r in rows]),
            dcost.stack([r[1] for r in rows]),
            dcost.stack([r[2] for r in rows]),
            free=FREE,
            tpot_slo=jnp.array([r[3] for r in rows]),
            ttft_slo=jnp.array([r[4] for r in rows]),
        )
        s = dcost.sensitivity(p)
        o = dcost.optimize(p)
        jax.block_until_ready((s, o))
    return p, s, o


def index(name, kind="base"):
    return list(CASES).index(name) * len(PERTURB) + PERTURB.index(kind)


def fd(s, name, what):
    """Central difference of log(optimal cost) in log(parameter)."""
    up, down = (s.relaxed.log_cost[index(name, what + k)] for k in "+-")
    return float(up - down) / (np.log1p(H) - np.log1p(-H))


@pytest.mark.parametrize("name", list(CASES))
def test_polished_points_are_kkt_points(solved, name):
    _, s, _ = solved
    for kind in PERTURB:
        i = index(name, kind)
        assert bool(s.relaxed.kkt[i]), (name, kind)
        assert float(s.relaxed.residual[i]) < 1e-8


@pytest.mark.parametrize("name", list(CASES))
def test_price_elasticity_is_exactly_one(solved, name):
    _, s, _ = solved
    assert float(s.hardware.price_per_hour[index(name)]) == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("field, what", [("hbm_bandwidth", "bw"), ("flops", "flops")])
def test_elasticities_match_resolving(solved, name, field, what):
    _, s, _ = solved
    envelope = float(getattr(s.hardware, field)[index(name)])
    assert envelope == pytest.approx(fd(s, name, what), abs=1e-6)


def test_elasticities_are_not_trivial(solved):
    """The cases exercise both kinds of answer: -1 exactly is not all they can say."""
    _, s, _ = solved
    assert float(s.hardware.flops[index("ttft-bound")]) < -0.1
    assert float(s.hardware.hbm_bandwidth[index("tpot-bound")]) < -1.1


@pytest.mark.parametrize("name", list(CASES))
def test_multiplier_matches_relaxing_the_slo(solved, name):
    p, s, _ = solved
    slo = CASES[name][-1]
    j = p.constraints.index(slo)
    lam = float(s.relaxed.lambdas[index(name), j])
    assert lam > 0.05 and bool(s.relaxed.active[index(name), j])
    assert float(s.limits[slo][index(name)]) == -lam
    assert -lam == pytest.approx(fd(s, name, "slo"), abs=1e-6)


@pytest.mark.parametrize("name", list(CASES))
def test_optimize_shadow_prices_near_exact_multipliers(solved, name):
    """optimize's least-squares multipliers (from its rougher continuous point) are close, and its
    shadow prices are lambda times the continuous optimal cost."""
    p, s, o = solved
    slo, i = CASES[name][-1], index(name)
    j = p.constraints.index(slo)
    assert float(o.lambdas[i, j]) == pytest.approx(float(s.relaxed.lambdas[i, j]), rel=0.1)
    assert float(o.multipliers[slo][i]) == pytest.approx(
        float(o.lambdas[i, j] * o.stats.continuous_cost[i]), rel=1e-9
    )


@pytest.mark.parametrize("name", list(CASES))
def test_design_moves_match_resolving(solved, name):
    _, s, _ = solved
    for what, field in (("bw", "hbm_bandwidth"), ("flops", "flops")):
        up, down = (s.relaxed.y[index(name, what + k), 0] for k in "+-")
        moved = float(up - down) / (np.log1p(H) - np.log1p(-H))
        implicit = float(getattr(s.design["batch"].hardware, field)[index(name)])
        assert implicit == pytest.approx(moved, abs=1e-5)


@pytest.mark.parametrize("name", list(CASES))
def test_envelope_equals_chain_rule(solved, name):
    """Total derivative through the moving design, d/dlogBW f(y*(BW), BW) = f_BW + f_y . y_BW,
    equals the envelope formula (no multipliers in the first form)."""
    p, s, _ = solved
    i = index(name)
    with jax.enable_x64(True):
        one = jax.tree.map(lambda a: a[i] if jnp.ndim(a) else a, p)
        y, sm = s.relaxed.y[i], s.relaxed.smoothness[i]

        def log_cost(y, bw):
            q = eqx.tree_at(lambda q: q.hardware.hbm_bandwidth, one, bw)
            return jnp.log(evaluate(q, jnp.exp(y), sm).cost)

        bw = one.hardware.hbm_bandwidth
        f_y, f_bw = jax.jit(jax.grad(log_cost, argnums=(0, 1)))(y, bw)
        dy = jnp.array([float(s.design[n].hardware.hbm_bandwidth[i]) for n in p.names])
        chain = float(f_bw * bw + jnp.dot(f_y, dy))
    assert chain == pytest.approx(float(s.hardware.hbm_bandwidth[i]), abs=1e-6)


def test_ranked_lists_the_largest_first(solved):
    _, s, _ = solved
    one = jax.tree.map(lambda a: a[index("tpot-bound")], s)
    rows = one.ranked()
    mags = [abs(v) for _, v in rows]
    assert all(m > 0 for m in mags)
    assert all(a >= b - 1e-6 for a, b in zip(mags[:-1], mags[1:], strict=True))  # largest first
    # magnitudes equal to 6 decimals (price +1, a bandwidth -1 ...) in the order of their names
    keys = [(-round(m, 6), n) for (n, _), m in zip(rows, mags, strict=True)]
    assert keys == sorted(keys) and len({k[0] for k in keys}) < len(keys)
    names = [n for n, _ in rows]
    assert "hardware.price_per_hour" in names and "hardware.hbm_bandwidth" in names
    assert dict(rows)["hardware.hbm_bandwidth"] < -1.0 and "tpot_limit" in names
    assert len(one.ranked(top=3)) == 3


def test_infeasible_relaxation_is_flagged(solved):
    """No design meets 2 ms per token for a 70B model on 8 H100s: no KKT point is claimed."""
    _, s, o = solved
    assert not bool(s.relaxed.kkt[-1]) and not bool(o.feasible[-1])
    # a batched problem does not raise: the scenario is flagged and its constraint named
    assert not s.feasible[-1] and s.feasible[:-1].all()
    assert s.message[-1].startswith("infeasible: tpot binds:") and "2 ms target" in s.message[-1]


def test_a_profiled_chips_elasticities_fold_what_the_programs_fill():
    """A profiled chip is solved filled (``dcost.specs.shared_form``: one program for every
    profile), so ``attention_flops``, None on the family profile (attention at ``flops``), is a
    leaf of the program; its elasticity belongs to ``flops`` (the chain rule). The same chip
    with ``attention_flops = flops`` set is the same program on the same numbers, whose two
    elasticities must add up to the first chip's one."""
    cal = dcost.hardware("h100-sxm", calibrated=True)
    explicit = dataclasses.replace(cal, attention_flops=cal.flops)

    def problem(h):  # a long context: attention's arithmetic shows through the smooth roofline
        return dcost.Problem(
            h,
            dcost.model("llama-3-8b"),
            dcost.Workload(32768),
            free={"batch": (1, 4096)},
            tpot_slo=0.05,
        )

    folded, apart = dcost.sensitivity(problem(cal)), dcost.sensitivity(problem(explicit))
    assert folded.hardware.attention_flops is None  # as the chip has it
    assert folded.problem.hardware.attention_flops is None  # the question asked
    e_attn = float(apart.hardware.attention_flops)
    assert abs(e_attn) > 1e-5  # not vacuous: what a missing fold would lose
    assert float(folded.hardware.flops) == pytest.approx(
        float(apart.hardware.flops) + e_attn, abs=1e-8
    )
