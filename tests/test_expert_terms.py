"""The routed experts' per-touched-expert cost and size curve, their kernel fit, and the
hierarchical all-reduce of groups spanning several scale-up domains (issue 28).

Each term is held against a closed form written out here, the kernel fit against a synthetic
table whose generating fields it must recover, and the gradients against finite differences.
"""

from __future__ import annotations

import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import dcost
from dcost.calibrate import kernels
from dcost.serving.collectives import all_reduce, group_all_reduce

E, K, L_MOE = 64.0, 4.0, 6.0


def moe_model():
    """A small MoE model: 8 layers, 6 of them MoE, 64 experts of 2.5e7 parameters over
    those layers, top-4."""
    return dcost.Model(
        8, 1024, 2e9, 2.5e7, E, K, 3e4, 2.0, n_moe_layers=L_MOE, params_attention=5e7
    )


def chip(**fields):
    return dcost.Hardware(1e15, 3e12, 8e10, 4e11, 5e10, 8, 3.0, **fields)


def phi(b):
    return 1.0 - (1.0 - K / E) ** b


# ---- expert_overhead -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "chips", "expert_parallel"), [(1.0, 1.0, None), (16.0, 4.0, None), (64.0, 8.0, 2.0)]
)
def test_expert_overhead_by_hand(batch, chips, expert_parallel):
    """The step pays ``c_e E phi(B) L_moe / e`` beside what it paid without the term."""
    m, w = moe_model(), dcost.Workload(512.0)
    d = dcost.Design(batch=batch, chips=chips, expert_parallel=expert_parallel)
    c_e = 3e-6
    a = dcost.decode(d, chip(), m, w)
    b = dcost.decode(d, chip(expert_overhead=c_e), m, w)
    e = chips if expert_parallel is None else expert_parallel
    expected = c_e * E * phi(batch) * L_MOE / e
    assert float(b.t_overhead - a.t_overhead) == pytest.approx(expected, rel=1e-6)
    assert float(b.tpot - a.tpot) == pytest.approx(expected, rel=1e-6)


def test_expert_overhead_is_nothing_for_a_dense_model():
    m, w, d = dcost.model("llama-3.1-8b"), dcost.Workload(512.0), dcost.Design(batch=8, chips=2)
    a = dcost.decode(d, chip(), m, w)
    b = dcost.decode(d, chip(expert_overhead=1e-5), m, w)
    assert float(a.tpot) == float(b.tpot)


def test_expert_overhead_in_prefill_touches_every_expert():
    """A prefill reads every expert: ``c_e E L_moe / e`` per pass."""
    m, w = moe_model(), dcost.Workload(0.0, prompt=2048.0)
    d = dcost.Design(batch=1, chips=4)
    c_e = 2e-6
    a = dcost.prefill(d, chip(), m, w)
    b = dcost.prefill(d, chip(expert_overhead=c_e), m, w)
    assert float(b.ttft - a.ttft) == pytest.approx(c_e * E * L_MOE / 4.0, rel=1e-6)


@pytest.mark.parametrize("stages", [1.0, 2.0])
def test_moe_layer_overhead_by_hand(stages):
    """Each of a stage's ``L_moe/P`` MoE layers pays ``moe_layer_overhead``; a dense model none."""
    m, w = moe_model(), dcost.Workload(512.0)
    d = dcost.Design(batch=8, chips=2, stages=stages)
    a = dcost.decode(d, chip(), m, w)
    b = dcost.decode(d, chip(moe_layer_overhead=4e-5), m, w)
    assert float(b.t_overhead - a.t_overhead) == pytest.approx(4e-5 * L_MOE / stages, rel=1e-6)
    dense = dcost.model("llama-3.1-8b")
    x = dcost.decode(d, chip(), dense, w).tpot
    assert float(dcost.decode(d, chip(moe_layer_overhead=4e-5), dense, w).tpot) == float(x)


@pytest.mark.parametrize(
    "field", ["expert_overhead", "moe_layer_overhead", "expert_half_tokens", "expert_half_width"]
)
def test_new_fields_refuse_a_negative_value(field):
    with pytest.raises(dcost.SpecError, match=rf"Hardware\.{field}"):
        chip(**{field: -1e-6})


@pytest.mark.parametrize("value", [0.0, -1.0])
def test_expert_ep_slowdown_refuses_a_value_not_above_zero(value):
    with pytest.raises(dcost.SpecError, match=r"Hardware\.expert_ep_slowdown"):
        chip(expert_ep_slowdown=value)


# ---- expert_half_tokens --------------------------------------------------------------------


def test_expert_half_tokens_defaults_to_the_gemms():
    m, w, d = moe_model(), dcost.Workload(512.0), dcost.Design(batch=32, chips=2)
    a = dcost.decode(d, chip(matmul_half_tokens=48.0), m, w)
    b = dcost.decode(d, chip(matmul_half_tokens=48.0, expert_half_tokens=48.0), m, w)
    assert float(a.tpot) == float(b.tpot)
    assert chip(matmul_half_tokens=48.0).get("expert_half_tokens") == 48.0


def test_expert_half_tokens_by_hand():
    """Only the routed experts' compute moves: by ``2 k n_e B (n_h / n_exp) / (F G)`` with
    ``n_exp = B k / (E phi(B))``."""
    m, w = moe_model(), dcost.Workload(512.0, expert_imbalance=1.0)
    batch, g, half = 32.0, 2.0, 40.0
    d = dcost.Design(batch=batch, chips=g)
    a = dcost.decode(d, chip(), m, w)
    b = dcost.decode(d, chip(expert_half_tokens=half), m, w)
    n_exp = batch * K / (E * phi(batch))
    expected = 2.0 * K * 2.5e7 * batch * (half / n_exp) / (1e15 * g)
    assert float(b.t_compute - a.t_compute) == pytest.approx(expected, rel=1e-6)


@pytest.mark.x64
def test_new_fields_have_finite_difference_gradients():
    m, w, d = moe_model(), dcost.Workload(512.0), dcost.Design(batch=24.0, chips=2.0)
    base = chip(expert_half_tokens=30.0, expert_overhead=2e-6, kernel_roofline_smoothness=0.4)

    def tpot(x):
        h = eqx.tree_at(lambda h: (h.expert_half_tokens, h.expert_overhead), base, (x[0], x[1]))
        return dcost.decode(d, h, m, w).tpot

    check_grads(tpot, (jnp.asarray([30.0, 2e-6]),), order=1, modes=["rev"], eps=1e-7)


# ---- the experts' layout: expert_half_width and expert_ep_slowdown -------------------------

INTER = 2.5e7 / (3 * 1024 * L_MOE)
"""``moe_model``'s expert intermediate size: 3 d i parameters a layer."""


@pytest.mark.x64
@pytest.mark.parametrize(("chips", "groups"), [(4.0, 1.0), (8.0, 2.0), (1.0, 1.0)])
def test_expert_half_width_by_hand(chips, groups):
    """Only the routed experts' compute moves, by ``w_e t / i`` of it, ``t = G/e`` the
    chips each expert is split over (a whole expert on each chip: no slowdown but ``w_e/i``)."""
    m, w = moe_model(), dcost.Workload(512.0, expert_imbalance=1.0)
    batch, half = 64.0, 300.0
    d = dcost.Design(batch=batch, chips=chips, expert_parallel=groups)
    a = dcost.decode(d, chip(expert_half_tokens=0.0), m, w)
    b = dcost.decode(d, chip(expert_half_tokens=0.0, expert_half_width=half), m, w)
    experts = 2.0 * K * 2.5e7 * batch / (1e15 * chips)  # the experts' FLOP time a chip
    assert float(b.t_compute - a.t_compute) == pytest.approx(
        experts * half * (chips / groups) / INTER, rel=1e-6
    )
    assert float(b.t_weights) == float(a.t_weights)


@pytest.mark.x64
@pytest.mark.parametrize("groups", [1.0, 2.0, 4.0])
def test_expert_ep_slowdown_by_hand(groups):
    """Over ``e`` expert-parallel groups the experts' compute takes ``1/e + kappa (1 - 1/e)``
    times as long: nothing at ``e = 1``; a dense model does not see it."""
    m, w = moe_model(), dcost.Workload(512.0, expert_imbalance=1.0)
    batch, kappa, g = 64.0, 3.0, 4.0
    d = dcost.Design(batch=batch, chips=g, expert_parallel=groups)
    a = dcost.decode(d, chip(expert_half_tokens=0.0), m, w)
    b = dcost.decode(d, chip(expert_half_tokens=0.0, expert_ep_slowdown=kappa), m, w)
    experts = 2.0 * K * 2.5e7 * batch / (1e15 * g)
    factor = 1.0 / groups + kappa * (1.0 - 1.0 / groups)
    assert float(b.t_compute - a.t_compute) == pytest.approx(experts * (factor - 1.0), abs=1e-15)
    dense = dcost.model("llama-3.1-8b")
    x = dcost.decode(d, chip(), dense, w).tpot
    assert float(dcost.decode(d, chip(expert_ep_slowdown=kappa), dense, w).tpot) == float(x)


@pytest.mark.x64
@pytest.mark.parametrize(("chips", "groups"), [(8.0, 1.0), (8.0, 8.0), (8.0, 2.0)])
def test_expert_layout_agrees_with_the_kernel_fit(chips, groups):
    """A compute-bound step (65,536 tokens): the time the layout adds to one MoE layer of
    ``decode`` is what it adds to ``moe_layer_time`` of the same shape, tensor-parallel over
    ``G/e`` and expert-parallel over ``e`` (the fit and the serving model share one form)."""
    m, w = moe_model(), dcost.Workload(256.0, expert_imbalance=1.0)
    batch, layout = 65536.0, {"expert_half_width": 400.0, "expert_ep_slowdown": 2.5}
    d = dcost.Design(batch=batch, chips=chips, expert_parallel=groups)
    a = dcost.decode(d, chip(expert_half_tokens=0.0), m, w).t_compute
    b = dcost.decode(d, chip(expert_half_tokens=0.0, **layout), m, w).t_compute
    v = {
        "expert_flops_efficiency": 1.0,
        "expert_half_tokens": 0.0,
        "expert_overhead": 0.0,
        "moe_layer_overhead": 0.0,
    }
    shape = (batch, 1024.0, INTER, K, E, chips / groups, groups)
    one = kernels.moe_layer_time(*shape, 2.0, 1e15, {**v, **layout}, IDEAL_GEMM)
    none = kernels.moe_layer_time(*shape, 2.0, 1e15, v, IDEAL_GEMM)
    assert float(b - a) / L_MOE == pytest.approx(float(one - none), rel=1e-6)


@pytest.mark.x64
def test_expert_layout_fields_have_finite_difference_gradients():
    m, w = moe_model(), dcost.Workload(512.0)
    d = dcost.Design(batch=512.0, chips=4.0, expert_parallel=2.0)
    base = chip(expert_half_width=200.0, expert_ep_slowdown=2.0, kernel_roofline_smoothness=0.4)

    def tpot(x):
        h = eqx.tree_at(lambda h: (h.expert_half_width, h.expert_ep_slowdown), base, (x[0], x[1]))
        return dcost.decode(d, h, m, w).tpot

    check_grads(tpot, (jnp.asarray([200.0, 2.0]),), order=1, modes=["rev"], eps=1e-4)


# ---- the kernel fit ------------------------------------------------------------------------


GEMM = {
    "precision.bf16.flops_efficiency": 0.8,
    "bandwidth_efficiency": 0.9,
    "kernel_roofline_smoothness": 0.4,
}


def synthetic_moe_table(values, rng, dtype="bfloat16", b_w=2.0, routing=kernels.ROUTING):
    """A MoE table of the H100's shape generated by ``moe_layer_time`` from ``values`` (weights
    of ``b_w`` bytes, computed at bf16: rows of ``moe_dtype`` ``dtype``), with 3 % log-normal
    noise, and a slower duplicate kernel and a two-matrix kernel that the fit must leave out;
    its rows routed as ``routing`` (the fit's ``ROUTING``, touching random routing's experts and
    timing the busiest expert-parallel rank, ``power_law_imbalance``, or ``"balanced"``, touching
    ``balanced_share``'s)."""
    grid = [
        (n, h, i, k, e, tp, ep)
        for n in (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
        for (h, i, k, e) in ((4096, 1536, 8, 128), (7168, 2048, 8, 256), (2880, 2880, 4, 128))
        for (tp, ep) in ((1, 1), (1, 8), (8, 1), (2, 4))
    ]
    cols = np.asarray(grid, float).T
    chip_ = kernels._chip("h100-sxm")
    gemm = {
        "flops_efficiency": GEMM["precision.bf16.flops_efficiency"],
        "bandwidth_efficiency": GEMM["bandwidth_efficiency"],
        "kernel_roofline_smoothness": GEMM["kernel_roofline_smoothness"],
        "hbm_bandwidth": chip_["hbm_bandwidth"],
    }
    balanced = routing == "balanced"
    share = kernels.balanced_share(cols[0], cols[3], cols[4]) if balanced else None
    imb = 1.0 if balanced else kernels.power_law_imbalance(cols[0], cols[3], cols[4], cols[6])
    t = np.asarray(kernels.moe_layer_time(*cols, b_w, chip_["flops"], values, gemm, share, imb))
    t = t * np.exp(rng.normal(0.0, 0.03, t.shape))
    n = len(t)
    table = {
        "moe_dtype": np.array([dtype] * 3 * n),
        "num_tokens": np.tile(cols[0], 3),
        "hidden_size": np.tile(cols[1], 3),
        "inter_size": np.tile(cols[2], 3),
        "topk": np.tile(cols[3], 3),
        "num_experts": np.tile(cols[4], 3),
        "moe_tp_size": np.tile(cols[5], 3),
        "moe_ep_size": np.tile(cols[6], 3),
        "distribution": np.array([routing] * 3 * n),
        "kernel_source": np.array(["fast"] * n + ["slow"] * n + ["fast_nongated"] * n),
        "latency": np.concatenate([t, 1.7 * t, 0.5 * t]) * 1e3,  # ms
    }
    return table


def literal_rank_loads(n, k, e, ep, u):
    """AIConfigurator's power-law rule step by step for one draw ``u`` (``E`` uniforms): loads
    from the inverse CDF, scaled, rounded and capped at ``n``; then, one token at a time and
    rank by rank from rank 0, the capped tokens to each rank's least loaded expert below the
    cap, and what rounding left over to (or took from) its least (most) loaded expert that can
    take it; the ranks' loads."""
    lo, hi = (1.0, 0.8 * n) if n * k > e else (0.01, 2.0)
    a = 1.0 - kernels.POWER_LAW_ALPHA
    x = ((hi**a - lo**a) * u + lo**a) ** (1.0 / a)
    c = np.round(x / x.sum() * n * k)
    over = int(np.maximum(c - n, 0).sum())
    c = np.minimum(c, n).reshape(ep, e // ep)

    def turn(left, step):
        while left > 0:
            moved = False
            for r in range(ep):
                ok = c[r] < n if step > 0 else c[r] > 0
                if not ok.any():
                    continue
                idx = np.flatnonzero(ok)
                j = idx[np.argmin(c[r][idx])] if step > 0 else idx[np.argmax(c[r][idx])]
                c[r, j] += step
                left, moved = left - 1, True
                if left == 0:
                    break
            if not moved:
                break

    turn(over, 1)
    drift = int(n * k - c.sum())
    turn(abs(drift), 1 if drift > 0 else -1)
    return c.sum(axis=1)


@pytest.mark.parametrize(
    "n, k, e, ep", [(4096, 8, 256, 8), (512, 8, 256, 32), (20, 8, 128, 16), (2, 4, 64, 64)]
)
def test_power_law_imbalance_is_the_collectors_rule(n, k, e, ep):
    """``power_law_imbalance``'s vectorized rule against the rule done token by token: the
    busiest rank's load over the mean within 2 %, between 1 and ``ep``; 1 over one rank."""
    draws = np.random.default_rng(0).random((64, e))
    loads = np.array([literal_rank_loads(n, k, e, ep, u) for u in draws])
    assert (loads.sum(axis=1) == n * k).all()
    literal = float(np.mean(loads.max(axis=1))) / (n * k / ep)
    got = float(kernels.power_law_imbalance(n, k, e, ep))
    assert got == pytest.approx(literal, rel=0.02)
    assert 1.0 <= got <= ep
    assert float(kernels.power_law_imbalance(n, k, e, 1)) == 1.0


@pytest.mark.parametrize(
    "args, field",
    [
        ((64, 8, 256, 3), "ep"),
        ((64, 8, 256, 0), "ep"),
        ((-1, 8, 256, 8), "tokens"),
        ((64, 0, 256, 8), "topk"),
        ((64, 300, 256, 8), "topk"),
        ((64.5, 8, 256, 8), "tokens"),
        ((np.nan, 8, 256, 8), "tokens"),
    ],
)
def test_power_law_imbalance_refuses_a_routing_the_collectors_cannot_draw(args, field):
    with pytest.raises(ValueError, match=f"power_law_imbalance: {field} = "):
        kernels.power_law_imbalance(*args)


def test_power_law_imbalance_grows_with_the_ranks():
    """More ranks, each with fewer experts, leave a busier busiest rank: monotone in ``ep``."""
    imb = kernels.power_law_imbalance(8192.0, 8.0, 256.0, np.array([1, 2, 4, 8, 16, 64, 256.0]))
    assert (np.diff(imb) > 0).all()
    assert imb[0] == 1.0 and 10.0 < imb[-1] <= 256.0


EXPERTS = {
    "expert_flops_efficiency": 0.55,
    "expert_half_tokens": 24.0,
    "expert_overhead": 1.5e-6,
    "moe_layer_overhead": 2.5e-5,
}
"""The grouped-expert fields the synthetic MoE tables below are generated from."""


@pytest.mark.parametrize("k, e", [(4, 128), (8, 256), (2, 8), (16, 896), (8, 384), (1, 16)])
def test_balanced_share_is_n_k_over_e_where_k_divides_e(k, e):
    """Where ``k`` divides ``E`` the balanced rule's runs are disjoint: ``min(E, n k)`` experts
    (a closed form against ``balanced_share``'s count of the rule); random routing touches
    fewer (the share a fit of the balanced rows must not assume)."""
    for n in (1, 2, 3, 4, 8, 16, 32, 48, 64, 100, 128, 512, 20480):
        share = float(kernels.balanced_share(n, k, e))
        assert share == pytest.approx(min(1.0, n * k / e)), (n, k, e)
        assert -math.expm1(n * math.log1p(-k / e)) <= share + 1e-12


@pytest.mark.parametrize("k, e", [(6, 128), (6, 256), (10, 512), (22, 512)])
def test_balanced_share_where_the_runs_wrap(k, e):
    """Where ``k`` does not divide ``E`` (the tables' 6 of 128 and 256, 10 and 22 of 512) the
    last run wraps onto the first: a few experts fewer than ``n k``, never fewer than random
    routing's expectation, and all of them from ``n = ceil(E/k)`` tokens on."""
    for n in (1, 2, 4, 8, 16, 20, 24, 32, 64, 512):
        share = float(kernels.balanced_share(n, k, e))
        closed = min(1.0, n * k / e)
        assert closed - k / e <= share <= closed + 1e-12, (n, k, e)
        assert -math.expm1(n * math.log1p(-k / e)) <= share + 1e-12
    assert float(kernels.balanced_share(math.ceil(e / k), k, e)) == 1.0


def test_fit_moe_recovers_the_generating_fields():
    truth = EXPERTS
    table = synthetic_moe_table(truth, np.random.default_rng(0))
    fit = kernels.fit_moe(table, "h100-sxm", GEMM)
    v = fit.values
    assert v["precision.bf16.expert_flops_efficiency"] == pytest.approx(0.55, rel=0.1)
    assert v["precision.bf16.expert_half_tokens"] == pytest.approx(24.0, rel=0.25)
    assert v["expert_overhead"] == pytest.approx(1.5e-6, rel=0.25)
    assert v["moe_layer_overhead"] == pytest.approx(2.5e-5, rel=0.25)
    assert v["moe_ep_overhead"] == pytest.approx(2.5e-5, rel=0.25)  # one cost: both alike
    assert fit.median_abs < 0.05  # the noise, not a misfit (the slow kernel would be 70 %)


def test_fit_moe_takes_balanced_rows_where_the_table_routes_no_other_way():
    """A table of balanced rows only (no ``ROUTING`` rows) is fitted on them, each row touching
    ``balanced_share``'s experts: the generating fields come back as from routed rows."""
    table = synthetic_moe_table(EXPERTS, np.random.default_rng(0), routing="balanced")
    fit = kernels.fit_moe(table, "h100-sxm", GEMM)
    assert fit.values["precision.bf16.expert_flops_efficiency"] == pytest.approx(0.55, rel=0.1)
    assert fit.values["expert_overhead"] == pytest.approx(1.5e-6, rel=0.25)
    assert fit.median_abs < 0.05


def test_fit_moe_leaves_out_rows_routed_otherwise():
    """Rows of another routing beside the ``ROUTING`` ones (here 3x as slow) do not move it."""
    a = synthetic_moe_table(EXPERTS, np.random.default_rng(0))
    b = synthetic_moe_table(EXPERTS, np.random.default_rng(1), routing="balanced")
    b["latency"] = b["latency"] * 3.0
    both = {k: np.concatenate([a[k], b[k]]) for k in a}
    fit = kernels.fit_moe(both, "h100-sxm", GEMM)
    assert fit.values["precision.bf16.expert_flops_efficiency"] == pytest.approx(0.55, rel=0.1)
    assert fit.median_abs < 0.05


def test_fit_moe_recovers_the_experts_own_bandwidth():
    """Tables generated with the experts' weights read at 0.7 of HBM (the dense GEMMs' 0.9 held):
    the fit finds 0.7, not the GEMMs' rate, and the other fields as before."""
    truth = dict(EXPERTS, expert_bandwidth_efficiency=0.7)
    fit = kernels.fit_moe(synthetic_moe_table(truth, np.random.default_rng(0)), "h100-sxm", GEMM)
    v = fit.values
    assert v["expert_bandwidth_efficiency"] == pytest.approx(0.7, rel=0.05)
    assert v["precision.bf16.expert_flops_efficiency"] == pytest.approx(0.55, rel=0.1)
    assert v["moe_layer_overhead"] == pytest.approx(2.5e-5, rel=0.25)
    assert fit.median_abs < 0.05


@pytest.mark.x64
def test_expert_bandwidth_efficiency_by_hand():
    """The routed experts' reads at their own rate: at half of ``eta_BW`` the experts' part of
    ``t_weights`` doubles and the dense part stays; unset, it is ``eta_BW`` (the same step to the
    last bit); a dense model does not see it."""
    m, w, d = moe_model(), dcost.Workload(512.0), dcost.Design(batch=1.0, chips=1.0)
    base = chip(bandwidth_efficiency=0.8)
    a = dcost.decode(d, base, m, w)
    b = dcost.decode(d, chip(bandwidth_efficiency=0.8, expert_bandwidth_efficiency=0.4), m, w)
    same = dcost.decode(d, chip(bandwidth_efficiency=0.8, expert_bandwidth_efficiency=0.8), m, w)
    touched = 2.5e7 * E * phi(1.0)  # one token: top-K of E experts, 2.5e7 parameters each
    expert_read = 2.0 * touched / (3e12 * 0.8)  # at 0.4 the reads take this much longer
    assert float(b.t_weights - a.t_weights) == pytest.approx(expert_read, rel=1e-9)
    assert float(same.tpot) == float(a.tpot)
    dense = dcost.model("llama-3.1-8b")
    x = dcost.decode(d, base, dense, w)
    y = dcost.decode(d, chip(bandwidth_efficiency=0.8, expert_bandwidth_efficiency=0.4), dense, w)
    assert float(x.tpot) == float(y.tpot)


def test_fit_moe_fits_weight_only_experts_apart():
    """MXFP4 experts dequantized into bf16 matmuls (AIConfigurator's ``w4a16_mxfp4`` rows) are
    their own class: generated at a rate twice bf16's, they are fitted apart (at the bf16 GEMM
    efficiency and peak, reading 4.25-bit weights) and leave the bf16 fields as they were."""
    rng = np.random.default_rng(1)
    bf16 = dict(EXPERTS, expert_flops_efficiency=0.4)
    table = synthetic_moe_table(bf16, rng)
    w4 = dict(bf16, expert_flops_efficiency=0.8, moe_layer_overhead=1.0e-5)
    # 4.25-bit weights (``moe_layer_time``'s ``b_w``), at bf16's rate and peak
    t4 = synthetic_moe_table(w4, rng, dtype="w4a16_mxfp4", b_w=4.25 / 8.0)
    # beside it, another model's kernel of the class on other shapes, half as many rows and
    # twice as slow (AIConfigurator's Marlin rows of 896 experts): not the class's kernel
    other = {k: v[: len(v) // 6] for k, v in t4.items()}
    other = dict(
        other, hidden_size=other["hidden_size"] + 512, num_experts=other["num_experts"] * 7
    )
    other = dict(other, kernel_source=np.array(["marlin"] * len(other["latency"])))
    other["latency"] = 2.0 * other["latency"]
    both = {k: np.concatenate([v, t4[k], other[k]]) for k, v in table.items()}
    fit = kernels.fit_moe(both, "h100-sxm", GEMM)
    v = fit.values
    assert v["precision.w4a16.expert_flops_efficiency"] == pytest.approx(0.8, rel=0.1)
    assert v["precision.bf16.expert_flops_efficiency"] == pytest.approx(0.4, rel=0.1)
    # the class's fused kernel has its own fixed cost; the shared one stays bf16's
    assert v["precision.w4a16.moe_layer_overhead"] == pytest.approx(1.0e-5, rel=0.25)
    assert v["moe_layer_overhead"] == pytest.approx(2.5e-5, rel=0.25)
    assert "precision.w4a16.flops_efficiency" not in v  # no GEMM rate of its own
    assert fit.median_abs < 0.05  # the Marlin rows, 2x off, were not fitted
    assert kernels.main_kernel(np.array(["a", "b", "b"])) == "b"
    assert kernels.main_kernel(np.array([], dtype=str)) == ""


def test_fit_moe_serves_fp8_experts_on_the_block_scaled_kernels():
    """Where a table times block-scaled fp8 (``fp8_block``), the fp8 expert class is fitted on
    those rows alone: per-tensor ``fp8`` rows 3x slower beside them change nothing, and the same
    per-tensor rows alone (no block-scaled ones) are what the class is fitted on."""
    rng = np.random.default_rng(2)
    truth = dict(EXPERTS, expert_flops_efficiency=0.5)
    block = synthetic_moe_table(truth, rng, dtype="fp8_block", b_w=1.0)
    tensor = dict(block, moe_dtype=np.array(["fp8"] * len(block["latency"])))
    tensor["latency"] = 3.0 * block["latency"]
    gemm = dict(GEMM, **{"precision.fp8.flops_efficiency": 0.8})
    alone = kernels.fit_moe(block, "h100-sxm", gemm).values
    both = {k: np.concatenate([v, tensor[k]]) for k, v in block.items()}
    assert kernels.fit_moe(both, "h100-sxm", gemm).values == alone
    per_tensor = kernels.fit_moe(tensor, "h100-sxm", gemm).values
    assert per_tensor["moe_layer_overhead"] > 2.0 * alone["moe_layer_overhead"]


def test_engine_runs_weight_only_experts_for_4_bit_moe_at_bf16():
    """``Engine.apply(..., model=)``: a 4-bit mixture of experts at bf16 (gpt-oss as released)
    takes the engine's ``w4a16`` expert fields; a bf16 MoE, a dense model, an fp8 chip and a
    profile without the class keep the precision's own."""
    eng = dcost.engine("vllm", hardware="h100-sxm")
    w4 = {"expert_flops_efficiency": 0.9, "expert_half_tokens": 3.0, "moe_layer_overhead": 7e-6}
    mine = dcost.engines.Engine(
        eng.name,
        eng.version,
        eng.hardware_name,
        eng.profile,
        {**eng.precision_profile, "w4a16": w4},
        eng.provenance,
        eng.scheduler,
    )
    h = dcost.hardware("h100-sxm")
    oss = dcost.model("gpt-oss-120b")
    assert float(oss.bytes_per_param) < 0.75 and float(oss.n_experts) > 1
    on = mine.apply(h, model=oss)
    assert float(on.expert_flops_efficiency) == pytest.approx(0.9)
    assert float(on.expert_half_tokens) == pytest.approx(3.0)
    assert float(on.moe_layer_overhead) == pytest.approx(7e-6)  # the class's own fixed cost
    bf16 = eng.precision_profile["bf16"]["expert_flops_efficiency"]
    for other in (dcost.model("gpt-oss-120b", weights="bf16"), dcost.model("llama-3.1-8b")):
        assert float(mine.apply(h, model=other).expert_flops_efficiency) == pytest.approx(bf16)
        shared = eng.profile["moe_layer_overhead"]
        assert float(mine.apply(h, model=other).moe_layer_overhead) == pytest.approx(shared)
    assert float(mine.apply(h).expert_flops_efficiency) == pytest.approx(bf16)  # no model
    fp8 = eng.precision_profile["fp8"]["expert_flops_efficiency"]
    on8 = mine.apply(dcost.hardware("h100-sxm", precision="fp8"), model=oss)
    assert float(on8.expert_flops_efficiency) == pytest.approx(fp8)
    # the cost functions pass the model: decode is faster on the faster expert kernels
    d, w = dcost.Design(batch=64.0, chips=2.0), dcost.Workload(1024.0)
    assert float(dcost.decode(d, h, oss, w, engine=mine).tpot) < float(
        dcost.decode(d, h, oss, w, engine=eng).tpot
    )
    # inside jit the model is traced: the same choice, made in the program
    eager = float(dcost.decode(d, h, oss, w, engine=mine).tpot)
    traced = jax.jit(lambda m: dcost.decode(d, h, m, w, engine=mine).tpot)(oss)
    assert float(traced) == pytest.approx(eager, rel=1e-6)
    dense = dcost.model("llama-3.1-8b")
    traced = jax.jit(lambda m: dcost.decode(d, h, m, w, engine=mine).tpot)(dense)
    assert float(traced) == pytest.approx(
        float(dcost.decode(d, h, dense, w, engine=mine).tpot), rel=1e-6
    )
    with pytest.raises(dcost.engines.EngineError, match="precision 'w4a16'"):
        mine.fields(h, precision="w4a16")


IDEAL_GEMM = {
    "flops_efficiency": 1.0,
    "bandwidth_efficiency": 1.0,
    "kernel_roofline_smoothness": 0.0,
    "hbm_bandwidth": 3e12,
}
"""``moe_layer_time``'s GEMM fields at their ideal: peak rates, a hard roofline, 3 TB/s."""


def test_moe_layer_time_touched_experts_agree_with_decode():
    """The kernel fit's per-touched-expert count is the serving model's: one MoE layer's share
    of ``decode``'s ``expert_overhead`` time equals ``moe_layer_time``'s ``c_e`` term."""
    c_e, b, g = 1e-6, 16.0, 4.0
    m, w, d = moe_model(), dcost.Workload(256.0), dcost.Design(batch=b, chips=g)
    step = dcost.decode(d, chip(expert_overhead=c_e), m, w).t_overhead
    v = {"expert_flops_efficiency": 1.0, "expert_half_tokens": 0.0, "moe_layer_overhead": 0.0}
    gemm = IDEAL_GEMM
    shape = (b, 1024.0, 2.5e7 / (3 * 1024 * L_MOE), K, E, 1.0, g)
    with_c = kernels.moe_layer_time(*shape, 2.0, 1e15, {**v, "expert_overhead": c_e}, gemm)
    without = kernels.moe_layer_time(*shape, 2.0, 1e15, {**v, "expert_overhead": 0.0}, gemm)
    assert float(step) / L_MOE == pytest.approx(float(with_c - without), rel=1e-6)


@pytest.mark.parametrize("e", [1.0, 2.0, 4.0])
def test_moe_layer_fixed_cost_by_expert_groups_agrees_with_decode(e):
    """``decode``'s MoE layer fixed cost over ``e`` expert-parallel groups is
    ``c_1/e + c_ep (1 - 1/e)`` (by hand), the kernel fit's (``moe_layer_time``); a chip without
    ``moe_ep_overhead`` pays ``c_1`` whatever ``e``."""
    c_1, c_ep, g = 2e-5, 6e-5, 4.0
    m, w = moe_model(), dcost.Workload(256.0)
    d = dcost.Design(batch=16.0, chips=g, expert_parallel=e)
    both = dcost.decode(d, chip(moe_layer_overhead=c_1, moe_ep_overhead=c_ep), m, w).t_overhead
    one = dcost.decode(d, chip(moe_layer_overhead=c_1), m, w).t_overhead
    none = dcost.decode(d, chip(), m, w).t_overhead
    by_hand = c_1 / e + c_ep * (1.0 - 1.0 / e)
    assert float(both - none) / L_MOE == pytest.approx(by_hand, rel=1e-6)
    assert float(one - none) / L_MOE == pytest.approx(c_1, rel=1e-6)
    v = {"expert_flops_efficiency": 1.0, "expert_half_tokens": 0.0, "expert_overhead": 0.0}
    gemm = IDEAL_GEMM
    shape = (16.0, 1024.0, 512.0, K, E, g / e, e)
    fixed = {**v, "moe_layer_overhead": c_1, "moe_ep_overhead": c_ep}
    zero = {**v, "moe_layer_overhead": 0.0, "moe_ep_overhead": 0.0}
    got = kernels.moe_layer_time(*shape, 2.0, 1e15, fixed, gemm)
    assert float(got - kernels.moe_layer_time(*shape, 2.0, 1e15, zero, gemm)) == pytest.approx(
        by_hand, rel=1e-6
    )


def test_fit_moe_recovers_the_experts_layout():
    """A table generated with narrow tensor-parallel slices at half rate at 400 columns and an
    expert-parallel path 2.5x as slow: the fit finds both, and the other fields as before."""
    truth = dict(EXPERTS, expert_half_width=400.0, expert_ep_slowdown=2.5)
    fit = kernels.fit_moe(synthetic_moe_table(truth, np.random.default_rng(3)), "h100-sxm", GEMM)
    v = fit.values
    assert v["precision.bf16.expert_half_width"] == pytest.approx(400.0, rel=0.25)
    assert v["precision.bf16.expert_ep_slowdown"] == pytest.approx(2.5, rel=0.15)
    assert v["precision.bf16.expert_flops_efficiency"] == pytest.approx(0.55, rel=0.15)
    assert fit.median_abs < 0.05


def test_fit_moe_tells_the_expert_parallel_fixed_cost_apart():
    """A table whose expert-parallel rows pay a larger fixed cost (vLLM's and SGLang's tables:
    3-4x the tensor-parallel one's on SGLang) is fitted with both, each recovered."""
    truth = dict(EXPERTS, moe_ep_overhead=6.0e-5)
    fit = kernels.fit_moe(synthetic_moe_table(truth, np.random.default_rng(2)), "h100-sxm", GEMM)
    assert fit.values["moe_layer_overhead"] == pytest.approx(2.5e-5, rel=0.25)
    assert fit.values["moe_ep_overhead"] == pytest.approx(6.0e-5, rel=0.25)
    assert fit.median_abs < 0.05


# ---- the hierarchical all-reduce -------------------------------------------------------------


LINKS = {
    "scaleup_latency": 2e-6,
    "scaleout_latency": 1.5e-5,
    "tree_collectives": 1.0,
    "hierarchical_collectives": 1.0,
}


@pytest.mark.x64
@pytest.mark.parametrize("n", [2.0, 4.0, 8.0])
def test_group_all_reduce_inside_a_domain_is_the_scaleup_all_reduce(n):
    h = chip(**LINKS)
    expected = all_reduce(1e6, n, 4e11, 2e-6, 1.0)
    assert float(group_all_reduce(1e6, n, h)) == pytest.approx(expected, rel=1e-9)


@pytest.mark.x64
@pytest.mark.parametrize("n", [16.0, 32.0, 64.0])
def test_group_all_reduce_across_domains_by_hand(n):
    """``2 log2(8) a_up + 2 (7/8) V/U`` inside, ``2 log2(D) a_out + 2 (D-1)/D (V/8)/O`` across."""
    v, d = 1e6, n / 8.0
    h = chip(**LINKS)
    inside = 2 * 3 * 2e-6 + 2 * 7 / 8 * v / 4e11
    across = 2 * math.log2(d) * 1.5e-5 + 2 * (d - 1) / d * (v / 8) / 5e10
    assert float(group_all_reduce(v, n, h)) == pytest.approx(inside + across, rel=1e-9)


@pytest.mark.parametrize("n", [16.0, 24.0, 64.0, 512.0])
@pytest.mark.parametrize("volume", [1e3, 1e6, 1e9])
def test_group_all_reduce_is_never_slower_than_all_of_it_over_scaleout(n, volume):
    h = chip(**LINKS)
    flat = all_reduce(volume, n, 5e10, 1.5e-5, 1.0)
    assert float(group_all_reduce(volume, n, h)) <= flat


@pytest.mark.x64
@pytest.mark.parametrize("h", [0.0, 0.5])
def test_group_all_reduce_mixes_in_v1s_flat_form(h):
    """``hierarchical_collectives = 0`` (and None) is v1's all-scale-out all-reduce; between 0
    and 1 the two mix linearly."""
    v, n = 1e6, 32.0
    flat = all_reduce(v, n, 5e10, 1.5e-5, 1.0)
    hier = float(group_all_reduce(v, n, chip(**LINKS)))
    got = float(group_all_reduce(v, n, chip(**{**LINKS, "hierarchical_collectives": h})))
    assert got == pytest.approx((1 - h) * flat + h * hier, rel=1e-9)
    off = {k: x for k, x in LINKS.items() if k != "hierarchical_collectives"}
    assert float(group_all_reduce(v, n, chip(**off))) == pytest.approx(flat, rel=1e-9)


def test_group_all_reduce_is_continuous_at_one_domain():
    h = chip(**LINKS)
    at = float(group_all_reduce(1e6, 8.0, h))
    past = float(group_all_reduce(1e6, 8.0 + 1e-6, h))
    assert past == pytest.approx(at, rel=1e-4)


def test_pure_physics_still_bounds_multi_node_tensor_parallelism():
    """A 16-chip tensor-parallel step on two HGX boxes: the pure chip (no latencies, every
    efficiency 1) is no slower than an engine's profile on it."""
    m, w = dcost.model("llama-3.3-70b"), dcost.Workload(2048.0)
    d = dcost.Design(batch=8, chips=16)
    pure = dcost.decode(d, dcost.hardware("h100-sxm"), m, w).tpot
    eng = dcost.engine("trtllm", hardware="h100-sxm")
    assert float(pure) <= float(dcost.decode(d, dcost.hardware("h100-sxm"), m, w, engine=eng).tpot)
