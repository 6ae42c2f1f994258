"""Serving model v2 (docs/serving_v2.md): every new term against hand calculations, finite
differences and published numbers; and, with every new term off, v1's numbers on every preset pair.

Hand calculations use the round-number specs of ``tests/test_roofline.py``: a chip of 1 PFLOP/s and
1 TB/s, scale-up 100 GB/s, scale-out 10 GB/s, 8 chips per domain, $3.6 per chip-hour; a dense model
of 1e9 parameters in bf16 (L = 10, d = 1000) and an MoE model of N_dense = 1e9, n_e = 1e8, E = 64,
k = 4 in fp8. Expected numbers are worked out in the comments, never taken from the code.
"""

import dataclasses
import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import v1_reference as v1

import dcost
from dcost import Design, Workload
from dcost.serving import attention, collectives, mixed, moe, speculative
from dcost.serving.roofline import admitted_share, chunks, matmul_efficiency
from dcost.smooth import smin

# --------------------------------------------------------------------------------------- specs


def chip(**kw):
    base = dict(
        flops=1e15,
        hbm_bandwidth=1e12,
        hbm_capacity=1e11,
        scaleup_bandwidth=1e11,
        scaleout_bandwidth=1e10,
        scaleup_size=8,
        price_per_hour=3.6,
    )
    return dcost.Hardware(**{**base, **kw})


def dense(**kw):
    base = dict(
        n_layers=10,
        d_model=1000,
        params_dense=1e9,
        params_per_expert=0.0,
        n_experts=0,
        experts_active=0,
        kv_bytes_per_token=1e5,
        bytes_per_param=2.0,
    )
    return dcost.Model(**{**base, **kw})


def moe_model(**kw):
    base = dict(
        n_layers=10,
        d_model=1000,
        params_dense=1e9,
        params_per_expert=1e8,
        n_experts=64,
        experts_active=4,
        kv_bytes_per_token=1e5,
        bytes_per_param=1.0,
    )
    return dcost.Model(**{**base, **kw})


V1_MODEL = (
    "n_layers",
    "d_model",
    "params_dense",
    "params_per_expert",
    "n_experts",
    "experts_active",
    "kv_bytes_per_token",
    "bytes_per_param",
    "attn_flops_per_context_token",
    "act_bytes",
    "n_moe_layers",
)
V1_HARDWARE = (
    "flops",
    "hbm_bandwidth",
    "hbm_capacity",
    "scaleup_bandwidth",
    "scaleout_bandwidth",
    "scaleup_size",
    "price_per_hour",
    "flops_efficiency",
    "bandwidth_efficiency",
)


def v1_only(spec, names):
    """The spec rebuilt from its v1 fields only: every v2 field back at its default (None)."""
    return type(spec)(**{n: getattr(spec, n) for n in names})


def stack(specs):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *specs)


# ------------------------------------------------------------- v2 with its terms off is v1

DESIGNS = [  # (batch, chips, stages): one chip; one domain; spilling; pipelined; a rack
    (1.0, 1.0, 1.0),
    (64.0, 8.0, 1.0),
    (256.0, 16.0, 2.0),
    (8.0, 4.0, 4.0),
    (512.0, 72.0, 1.0),
]


@pytest.mark.x64
@pytest.mark.parametrize("smoothness", [0.0, 0.05])
def test_v2_with_new_terms_off_is_v1_on_every_preset_pair(smoothness):
    """All 11 report fields of decode and prefill, every hardware x model preset, five designs,
    with the presets' v2 model fields (kv_heads, params_attention, ...) set back to None."""
    hws = [v1_only(dcost.hardware(n), V1_HARDWARE) for n in dcost.hardware_names()]
    models = [v1_only(dcost.model(n), V1_MODEL) for n in dcost.model_names()]
    assert len(hws) >= 15 and len(models) >= 14
    pairs = list(itertools.product(range(len(hws)), range(len(models)), range(len(DESIGNS))))
    hw = stack([hws[i] for i, _, _ in pairs])
    m = stack([models[j] for _, j, _ in pairs])
    b, g, p = (jnp.asarray([DESIGNS[k][c] for _, _, k in pairs]) for c in range(3))
    design = Design(batch=b, chips=g, stages=p)
    n = len(pairs)
    workload = Workload(jnp.full(n, 2048.0), prompt=jnp.full(n, 1000.0), output=jnp.zeros(n))

    def both(fn_new, fn_old):
        new = jax.jit(jax.vmap(lambda d, h, mm, w: fn_new(d, h, mm, w, smoothness)))(
            design, hw, m, workload
        )
        old = jax.jit(jax.vmap(lambda d, h, mm, w: fn_old(d, h, mm, w, smoothness)))(
            design, hw, m, workload
        )
        return new, old

    for kind, fn_new, fn_old in (
        ("decode", dcost.decode, v1.decode),
        ("prefill", dcost.prefill, v1.prefill),
    ):
        new, old = both(fn_new, fn_old)
        for field in v1.FIELDS:
            # v1's prefill called the time of the pass ``tpot``; a PrefillReport calls it ``ttft``
            name = "ttft" if kind == "prefill" and field == "tpot" else field
            got, want = np.asarray(getattr(new, name)), np.asarray(old[field])
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, err_msg=f"{kind} {field}")
        assert np.all(np.asarray(new.t_overhead) == 0.0)
        if kind == "decode":
            assert np.all(np.asarray(new.t_draft) == 0.0)
            assert np.all(np.asarray(new.tokens_per_step) == 1.0)


def test_reference_is_not_trivially_equal():
    """The comparison can fail: a v2 term switched on moves the numbers away from v1."""
    h, m, w = chip(step_overhead=1e-3), dense(), Workload(100)
    d = Design(batch=8)
    assert float(dcost.decode(d, h, m, w).tpot) != pytest.approx(
        float(v1.decode(d, h, m, w)["tpot"])
    )


# ------------------------------------------------------------------ fixed costs and collectives


@pytest.mark.x64
def test_overheads_by_hand():
    """Dense 1e9 bf16 on one chip per stage, P = 2, T = 0: weights 2e9 B / (2 chips * 1e12 B/s)
    = 1 ms; overhead 1 ms + 1e-5 s * 10/2 layers = 1.05 ms; t_stage = 2.05 ms; hop over
    scale-up 1*1000*2 B / 1e11 = 2e-8 s; tpot = 2 * 2.05 ms + 2e-8 s."""
    h = chip(step_overhead=1e-3, layer_overhead=1e-5)
    r = dcost.decode(Design(batch=1, stages=2), h, dense(), Workload(0))
    assert float(r.t_overhead) == pytest.approx(1.05e-3, rel=1e-12)
    assert float(r.t_stage) == pytest.approx(2.05e-3, rel=1e-9)
    assert float(r.tpot) == pytest.approx(4.1e-3 + 2e-8, rel=1e-9)


@pytest.mark.x64
def test_sequence_overhead_by_hand():
    """Host time per scheduled sequence: ``sequence_overhead * B/A`` per pass, added to the
    step. Dense, one chip, B = 8: 1 ms + 10 * 1e-5 s + 8 * 2e-6 s = 1.116 ms of overhead, and the
    step grows by exactly the 16 us against the same chip without the term. MoE on 4 chips with
    4 data-parallel attention groups: each schedules 2 of the 8, 4 us. A prefill of 2 prompts in
    4 chunks pays it once per chunk: 4 * 2 * 2e-6 s."""
    base = chip(step_overhead=1e-3, layer_overhead=1e-5)
    h = chip(step_overhead=1e-3, layer_overhead=1e-5, sequence_overhead=2e-6)
    d, w = Design(batch=8), Workload(100)
    r, r0 = dcost.decode(d, h, dense(), w), dcost.decode(d, base, dense(), w)
    assert float(r.t_overhead) == pytest.approx(1.116e-3, rel=1e-12)
    assert float(r.tpot - r0.tpot) == pytest.approx(16e-6, rel=1e-9)
    m, dp = moe_model(), Design(batch=8, chips=4, attention_dp=4)
    gap = dcost.decode(dp, h, m, w).t_overhead - dcost.decode(dp, base, m, w).t_overhead
    assert float(gap) == pytest.approx(4e-6, rel=1e-9)
    wp, dpf = Workload(0, prompt=4000), Design(batch=2, prefill_chunk=1000)
    gap = dcost.prefill(dpf, h, dense(), wp).ttft - dcost.prefill(dpf, base, dense(), wp).ttft
    assert float(gap) == pytest.approx(4 * 2 * 2e-6, rel=1e-9)
    mixed = dcost.mixed_step(d, h, dense(), Workload(100, prompt=50, output=50))
    mixed0 = dcost.mixed_step(d, base, dense(), Workload(100, prompt=50, output=50))
    assert float(mixed.t_overhead - mixed0.t_overhead) == pytest.approx(16e-6, rel=1e-9)


@pytest.mark.x64
def test_gemm_overhead_by_hand():
    """Dense 1e9 bf16 on one chip per stage, P = 2, 4 GEMMs a layer, 3 us each: the step's fixed
    cost grows by 3e-6 * 4 * 10/2 = 60 us, to 1 ms + 1e-5 * 5 + 60 us = 1.11 ms; a chunked
    prefill on one stage of 4 chunks pays 4 * 3e-6 * 4 * 10 = 480 us."""
    base = chip(step_overhead=1e-3, layer_overhead=1e-5)
    h = chip(step_overhead=1e-3, layer_overhead=1e-5, gemm_overhead=3e-6)
    m, d = dense(gemms_per_layer=4.0), Design(batch=1, stages=2)
    r = dcost.decode(d, h, m, Workload(0))
    assert float(r.t_overhead) == pytest.approx(1.11e-3, rel=1e-12)
    assert float(r.t_stage - dcost.decode(d, base, m, Workload(0)).t_stage) == pytest.approx(
        60e-6, rel=1e-9
    )
    # a model that states no kernel count pays nothing, and nor does a chip without the field
    assert float(dcost.decode(d, h, dense(), Workload(0)).t_overhead) == pytest.approx(1.05e-3)
    wp, dp = Workload(0, prompt=4000), Design(batch=1, prefill_chunk=1000)
    gap = dcost.prefill(dp, h, m, wp).ttft - dcost.prefill(dp, base, m, wp).ttft
    assert float(gap) == pytest.approx(480e-6, rel=1e-9)


@pytest.mark.x64
def test_prefill_step_overhead_by_hand():
    """A step that carries prompt tokens pays ``prefill_step_overhead`` once; a decode step
    never. Dense, one chip: decode unchanged to the last bit; a prefill of 2 prompts of 4,000
    tokens in chunks of 1,000 pays it 4 times; a mixed step of B = 8, prompts of 400 and outputs
    of 100 (c = 8 * 400/100 = 32 prompt tokens a step on average, carried whole: c* = 400)
    carries a prompt in f = 32/400 = 0.08 of its steps, so its mean step gains 0.08 * 5 ms =
    0.4 ms; with a chunk of 16 tokens every step carries one (f = 1: 5 ms)."""
    base = chip(step_overhead=1e-3, layer_overhead=1e-5)
    h = chip(step_overhead=1e-3, layer_overhead=1e-5, prefill_step_overhead=5e-3)
    d, w = Design(batch=8), Workload(100)
    assert float(dcost.decode(d, h, dense(), w).tpot) == float(
        dcost.decode(d, base, dense(), w).tpot
    )
    wp, dpf = Workload(0, prompt=4000), Design(batch=2, prefill_chunk=1000)
    gap = dcost.prefill(dpf, h, dense(), wp).ttft - dcost.prefill(dpf, base, dense(), wp).ttft
    assert float(gap) == pytest.approx(4 * 5e-3, rel=1e-9)
    wm = Workload(100, prompt=400, output=100)
    gap = dcost.mixed_step(d, h, dense(), wm).tpot - dcost.mixed_step(d, base, dense(), wm).tpot
    assert float(gap) == pytest.approx(0.08 * 5e-3, rel=1e-9)
    dc = Design(batch=8, prefill_chunk=16)
    gap = dcost.mixed_step(dc, h, dense(), wm).tpot - dcost.mixed_step(dc, base, dense(), wm).tpot
    assert float(gap) == pytest.approx(5e-3, rel=1e-9)
    with pytest.raises(dcost.SpecError, match="prefill_step_overhead"):
        chip(prefill_step_overhead=-1e-3)


@pytest.mark.x64
def test_eager_moe_layer_floor_by_hand():
    """``eager_moe_layer_overhead`` h is a floor on a pass with prompt tokens: ``h L_moe / P``.
    MoE, one chip, 10 MoE layers: with h = 1 s the floor binds, and a mixed step whose every step
    carries a prompt (chunk 16) takes 10 s, a prefill of 4 chunks 40 s, two pipeline stages 5 s
    a stage; with h = 1 ns it lies under the kernels and nothing moves to the last bit; a decode
    step and a dense model never pay it; a negative value is refused."""
    base = chip(step_overhead=1e-3, layer_overhead=1e-5)
    slow, tiny = (
        chip(step_overhead=1e-3, layer_overhead=1e-5, eager_moe_layer_overhead=h)
        for h in (1.0, 1e-9)
    )
    m, wm = moe_model(), Workload(100, prompt=400, output=100)
    dc = Design(batch=8, prefill_chunk=16)
    assert float(dcost.mixed_step(dc, slow, m, wm).tpot) == pytest.approx(10.0, rel=1e-12)
    wp, dpf = Workload(0, prompt=4000), Design(batch=2, prefill_chunk=1000)
    assert float(dcost.prefill(dpf, slow, m, wp).ttft) == pytest.approx(40.0, rel=1e-12)
    staged = Design(batch=8, prefill_chunk=16, stages=2)
    assert float(dcost.mixed_step(staged, slow, m, wm).t_stage) == pytest.approx(5.0, rel=1e-12)
    for d, w in ((dc, wm), (Design(batch=8), wm)):
        assert float(dcost.mixed_step(d, tiny, m, w).tpot) == float(
            dcost.mixed_step(d, base, m, w).tpot
        )
    d, w = Design(batch=8), Workload(100)
    assert float(dcost.decode(d, slow, m, w).tpot) == float(dcost.decode(d, base, m, w).tpot)
    assert float(dcost.mixed_step(dc, slow, dense(), wm).tpot) == float(
        dcost.mixed_step(dc, base, dense(), wm).tpot
    )
    with pytest.raises(dcost.SpecError, match="eager_moe_layer_overhead"):
        chip(eager_moe_layer_overhead=-1e-3)


@pytest.mark.x64
def test_decode_pool_admissions_by_hand():
    """A decode step with an output length admits ``min(1, B tau / T_out)`` sequences a step on
    average (Little's law), each such step paying ``prefill_step_overhead``. Dense, one chip,
    5 ms: B = 8 and T_out = 100 admit in 0.08 of the steps (0.4 ms a step); B = 8 and T_out = 4
    would admit 2 a step, at most every step admits (5 ms); with 2 draft tokens accepted at
    a = 0.5 (tau = 1 + 0.5 + 0.25 = 1.75) B = 8 and T_out = 100 admit in 0.14 (0.7 ms a step,
    0.4 ms a token). Without an output length, or on a chip without the field, nothing."""
    base = chip(step_overhead=1e-3, layer_overhead=1e-5)
    h = chip(step_overhead=1e-3, layer_overhead=1e-5, prefill_step_overhead=5e-3)
    d = Design(batch=8)

    def gap(design, work, m=None):
        m = dense() if m is None else m
        return float(dcost.decode(design, h, m, work).tpot) - float(
            dcost.decode(design, base, m, work).tpot
        )

    assert gap(d, Workload(100, output=100)) == pytest.approx(0.08 * 5e-3, rel=1e-9)
    assert gap(d, Workload(100, output=4)) == pytest.approx(5e-3, rel=1e-9)
    assert gap(d, Workload(100)) == 0.0
    spec = Design(batch=8, draft_tokens=2)
    ws = Workload(100, output=100, acceptance=0.5)
    drafted = dense(draft_params=1e8)
    tau = float(dcost.decode(spec, h, drafted, ws).tokens_per_step)
    assert tau == pytest.approx(1.75, rel=1e-9)
    assert gap(spec, ws, drafted) * tau == pytest.approx(0.14 * 5e-3, rel=1e-9)
    # pure physics stays a bound: no field, no charge
    w = Workload(100, output=100)
    assert float(dcost.decode(d, base, dense(), w).tpot) == float(
        dcost.decode(d, base, dense(), Workload(100)).tpot
    )
    # the smooth share equals the exact one away from the kink and is below it there
    assert float(admitted_share(8.0, 1.0, 100.0, 0.2)) == pytest.approx(0.08, rel=1e-5)
    assert float(admitted_share(100.0, 1.0, 100.0, 0.2)) == pytest.approx(2.0**-0.2, rel=1e-9)
    # the exact model's gradient in B carries the share's slope, fee / T_out
    grad = jax.grad(lambda b: dcost.decode(Design(batch=b), h, dense(), w).tpot)
    no_fee = jax.grad(lambda b: dcost.decode(Design(batch=b), base, dense(), w).tpot)
    assert float(grad(8.0) - no_fee(8.0)) == pytest.approx(5e-3 / 100, rel=1e-6)


@pytest.mark.x64
def test_collectives_by_hand():
    # ring all-reduce of 8e6 B over 8 chips: 14 alpha + 2*(7/8)*8e6/1e11 = 14 us + 140 us
    assert float(collectives.all_reduce(8e6, 8.0, 1e11, 1e-6)) == pytest.approx(1.54e-4)
    # all-gather = reduce-scatter: 7 us + 70 us; all-to-all to 7 peers of 1e6 B: 7 us + 10 us
    assert float(collectives.all_gather(8e6, 8.0, 1e11, 1e-6)) == pytest.approx(7.7e-5)
    assert float(collectives.reduce_scatter(8e6, 8.0, 1e11, 1e-6)) == pytest.approx(7.7e-5)
    assert float(collectives.all_to_all(1e6, 7.0, 1e11, 1e-6)) == pytest.approx(1.7e-5)
    assert float(collectives.all_reduce(8e6, 1.0, 1e11, 1e-6)) == 0.0  # one chip: free


@pytest.mark.x64
def test_tensor_parallel_all_reduce_with_latency_and_efficiency_by_hand():
    """Dense, G = 4, B = 100: V = 100*1000*2 = 2e5 B; one all-reduce = 2*3*1 us +
    2*(3/4)*2e5 B/(0.5*1e11 B/s) = 6 us + 6 us = 12 us; two per layer, 10 layers: 240 us."""
    h = chip(scaleup_latency=1e-6, scaleup_efficiency=0.5)
    r = dcost.decode(Design(batch=100, chips=4), h, dense(), Workload(0))
    assert float(r.t_comm) == pytest.approx(2.4e-4, rel=1e-12)


# --------------------------------------------------------------------------- attention layout


@pytest.mark.x64
def test_data_parallel_attention_dense_by_hand():
    """Dense, G = 8, A = 2 (t = 4), B = 64, T = 100, N_attn = 2e8, 2 KV heads.
    Comm per layer: AR_4(V/2) + AR_8(V), V = 64*1000*2 = 1.28e5 B:
    2*(3/4)*6.4e4/1e11 + 2*(7/8)*1.28e5/1e11 = 0.96 us + 2.24 us = 3.2 us; 10 layers: 32 us.
    Weights: (1e9 + (2-1)*2e8)*2 B / (8*1e12) = 0.3 ms. KV: t = 4 > 2 heads, rep = 2:
    64*100*1e5*2 / (8*1e12) = 0.16 ms. Memory: 1.2e9*2/8 + 64*100*1e5*2/8 = 3e8 + 1.6e8 B."""
    m = dense(params_attention=2e8, kv_heads=2)
    r = dcost.decode(Design(batch=64, chips=8, attention_dp=2), chip(), m, Workload(100))
    assert float(r.t_comm) == pytest.approx(3.2e-5, rel=1e-12)
    assert float(r.t_weights) == pytest.approx(3e-4, rel=1e-12)
    assert float(r.t_kv) == pytest.approx(1.6e-4, rel=1e-12)
    assert float(r.memory_per_chip) == pytest.approx(4.6e8, rel=1e-12)
    # A = G: every chip holds attention whole (8 copies) and the MLP's all-gather/reduce-scatter
    # is one all-reduce of V over 8: 10 * 2.24 us
    r = dcost.decode(Design(batch=64, chips=8, attention_dp=8), chip(), m, Workload(100))
    assert float(r.t_comm) == pytest.approx(2.24e-5, rel=1e-12)
    assert float(r.t_weights) == pytest.approx((1e9 + 7 * 2e8) * 2 / 8e12, rel=1e-12)
    assert float(r.t_kv) == pytest.approx(64 * 100 * 1e5 / 8e12, rel=1e-12)  # rep = 1


@pytest.mark.x64
def test_tensor_parallel_attention_around_moe_by_hand():
    """MoE, G = 8, A = 2 (t = 4), B = 64: the scatter/gather around the MoE layer is
    AR_4(V/2) = 0.96 us per layer (as above), 9.6 us over 10 layers, on top of the all-to-all
    (v1's: bytes_chip = 64*10*2*4*1000*2*(7/64) = 1.12e6 B, all inside: 1.12e6/1e11 = 11.2 us).
    MLA-like cache (1 KV head): rep = t = 4."""
    m = moe_model(kv_heads=1)
    r = dcost.decode(Design(batch=64, chips=8, attention_dp=2), chip(), m, Workload(100))
    assert float(r.t_comm) == pytest.approx(9.6e-6 + 1.12e-5, rel=1e-12)
    assert float(r.t_kv) == pytest.approx(4 * 64 * 100 * 1e5 / 8e12, rel=1e-12)
    # v1's convention (None) for MoE: data-parallel, no layout traffic, no replication
    r = dcost.decode(Design(batch=64, chips=8), chip(), m, Workload(100))
    assert float(r.t_comm) == pytest.approx(1.12e-5, rel=1e-12)
    assert float(r.t_kv) == pytest.approx(64 * 100 * 1e5 / 8e12, rel=1e-12)


def test_kv_replication_by_hand():
    assert float(attention.kv_replication(16.0, 8.0)) == 2.0  # Llama-3-70B over 16 chips
    assert float(attention.kv_replication(8.0, 1.0)) == 8.0  # MLA: the latent on every rank
    assert float(attention.kv_replication(4.0, 8.0)) == 1.0
    assert float(attention.kv_replication(64.0, 0.0)) == 1.0  # unknown heads: v1


def test_attention_dp_above_chips_is_refused():
    with pytest.raises(dcost.SpecError, match="attention_dp"):
        Design(batch=1, chips=4, attention_dp=8)


# ------------------------------------------------------------------- wide expert parallelism


@pytest.mark.x64
def test_deduplicated_dispatch_by_hand():
    """MoE (k = 4, d = 1000, b_a = 2, 10 MoE layers), G = 16, S = 8: D = 2 domains.
    Distinct domains 2*(1 - (1/2)**4) = 1.875, remote 1.875/2 = 0.9375 per token.
    Scale-out per chip: 64 tokens * 10 layers * 4000 B * 0.9375 / 16 = 1.5e5 B -> 15 us;
    scale-up: 64*10*4000*4*(7/8)/16 = 5.6e5 B -> 5.6 us. v1: bytes_chip = 64*10*16000*15/256
    = 6e5 B, out share 8/15: 3.2e5 B -> 32 us."""
    w, m = Workload(0), moe_model()
    v1_comm = dcost.decode(Design(batch=64, chips=16), chip(), m, w).t_comm
    assert float(v1_comm) == pytest.approx(3.2e-5, rel=1e-12)
    dd = dcost.decode(Design(batch=64, chips=16, dispatch_dedup=1.0), chip(), m, w)
    assert float(dd.t_comm) == pytest.approx(1.5e-5, rel=1e-12)
    # half and half: out (3.2e5 + 1.5e5)/2 = 2.35e5 B -> 23.5 us
    half = dcost.decode(Design(batch=64, chips=16, dispatch_dedup=0.5), chip(), m, w)
    assert float(half.t_comm) == pytest.approx(2.35e-5, rel=1e-12)
    # node limit M = 1: one domain per token, remote 1/2: 64*10*4000*0.5/16 = 8e4 B -> 8 us
    capped = dcost.decode(
        Design(batch=64, chips=16, dispatch_dedup=1.0),
        chip(),
        moe_model(max_domains_per_token=1),
        w,
    )
    assert float(capped.t_comm) == pytest.approx(8e-6, rel=1e-12)
    # latency 1 us per scale-out message, 2 all-to-alls x 10 layers: de-duplicated 1 peer
    # (D - 1) -> +20 us; v1 8 peers (G - S') -> +160 us
    h = chip(scaleout_latency=1e-6)
    dd = dcost.decode(Design(batch=64, chips=16, dispatch_dedup=1.0), h, m, w)
    assert float(dd.t_comm) == pytest.approx(1.5e-5 + 2e-5, rel=1e-12)
    v1_lat = dcost.decode(Design(batch=64, chips=16), h, m, w)
    assert float(v1_lat.t_comm) == pytest.approx(3.2e-5 + 1.6e-4, rel=1e-12)


def test_deepseek_v3_node_limited_dispatch_published():
    """DeepSeek-V3 Technical Report, section 2.1.2 / 3.2.2: each token is sent to at most
    M = 4 nodes. Over D = 8 nodes its k = 8 experts fall in 8*(1 - (7/8)**8) = 5.25 nodes on
    average, which the limit cuts to 4; a token then crosses InfiniBand 4*(7/8) = 3.5 times
    against the 8*(56/64) = 7 copies of undeduplicated dispatch (EP64, 8 GPUs a node): half."""
    m = dcost.model("deepseek-v3")
    assert float(m.max_domains_per_token) == 4.0
    assert float(moe.domains_reached(8.0, 8.0)) == pytest.approx(5.2511, abs=1e-4)
    assert float(moe.domains_reached(8.0, 8.0, 4.0)) == 4.0
    h = dcost.hardware("h800")
    w = Workload(0)
    base = dcost.decode(Design(batch=256, chips=64), h, m, w)
    dd = dcost.decode(Design(batch=256, chips=64, dispatch_dedup=1.0), h, m, w)
    # scale-out bound in both: the ratio of times is the ratio of IB copies, 3.5 / 7
    assert float(dd.t_comm) / float(base.t_comm) == pytest.approx(3.5 / 7.0, rel=1e-5)


@pytest.mark.x64
def test_expert_imbalance_given_by_hand():
    """MoE, B = 4096, G = 4, imbalance 1.5, T = 0: dense FLOPs 2*1e9*4096 = 8.192e12, expert
    FLOPs 2*4*1e8*4096*1.5 = 4.9152e12; (8.192e12 + 4.9152e12)/(4*1e15) = 3.2768 ms. The
    all-to-all bytes grow 1.5x too."""
    d = Design(batch=4096, chips=4)
    r = dcost.decode(d, chip(), moe_model(), Workload(0, expert_imbalance=1.5))
    assert float(r.t_compute) == pytest.approx(3.2768e-3, rel=1e-12)
    r1 = dcost.decode(d, chip(), moe_model(), Workload(0))
    assert float(r.t_comm) == pytest.approx(1.5 * float(r1.t_comm), rel=1e-12)


@pytest.mark.x64
def test_multinomial_imbalance_by_hand():
    """m = 1024 tokens * 8 = 8192 copies over G = 8 chips: 1 + sqrt(2*8*ln 8*(7/8)/8192)
    = 1 + sqrt(0.0035537) = 1.059613. G = 1: 1. One copy on G = 2 chips:
    1 + sqrt(2*2*ln 2*(1/2)/1) = 2.177 > 2, capped at G = 2 (all the load on one chip)."""
    assert float(moe.expected_max_load(1024.0, 8.0, 8.0)) == pytest.approx(1.059613, rel=1e-6)
    assert float(moe.expected_max_load(1024.0, 1.0, 8.0)) == 1.0
    assert float(moe.expected_max_load(1.0, 2.0, 1.0)) == pytest.approx(2.0)
    assert float(moe.expected_max_load(1.0, 64.0, 1.0)) == pytest.approx(
        1 + np.sqrt(2 * 64 * np.log(64) * 63 / 64)
    )  # 23.9 < 64: uncapped
    w = Workload(0, expert_imbalance="multinomial")
    assert float(w.expert_imbalance) == 0.0
    m = moe_model(experts_active=8)
    imb = moe.expert_imbalance(w, 1024.0, 8.0, m)
    assert float(imb) == pytest.approx(1.059613, rel=1e-6)


@pytest.mark.x64
def test_redundant_experts_by_hand():
    """R = 4 over G = 4 chips halves the excess: 1.5 -> 1.25; memory per chip gains
    4 * 1e8 * 1 B / 4 = 1e8 B; weight reads of touched replicas 4*1e8*phi."""
    w = Workload(0, expert_imbalance=1.5)
    m = moe_model()
    assert float(moe.expert_imbalance(w, 64.0, 4.0, m, 4.0)) == pytest.approx(1.25)
    d0, d1 = Design(batch=4096, chips=4), Design(batch=4096, chips=4, redundant_experts=4)
    r0, r1 = (dcost.decode(d, chip(), m, w) for d in (d0, d1))
    assert float(r1.memory_per_chip - r0.memory_per_chip) == pytest.approx(1e8, rel=1e-12)
    # phi(4096) = 1 to float precision: 4e8 B more read over 4 chips at 1e12 B/s = 0.1 ms
    assert float(r1.t_weights - r0.t_weights) == pytest.approx(1e-4, rel=1e-9)
    # expert compute at 1.25 instead of 1.5: 2*4*1e8*4096*0.25/(4*1e15) = 0.2048 ms less
    assert float(r0.t_compute - r1.t_compute) == pytest.approx(2.048e-4, rel=1e-9)


def test_bad_imbalance_and_acceptance_are_refused():
    with pytest.raises(dcost.SpecError, match="expert_imbalance"):
        Workload(0, expert_imbalance=0.5)
    with pytest.raises(dcost.SpecError, match="expert_imbalance"):
        Workload(0, expert_imbalance="uniform")
    with pytest.raises(dcost.SpecError, match="acceptance"):
        Workload(0, acceptance=1.5)
    with pytest.raises(dcost.SpecError, match="dispatch_dedup"):
        Design(batch=1, dispatch_dedup=2.0)


# ---------------------------------------------------------------------- matmul size, prefill


@pytest.mark.x64
def test_matmul_efficiency_by_hand():
    """n_half = 64 tokens at B = 64: eta = 1/2, so dense compute doubles:
    2*1e9*64 FLOP / (1e15 * 0.5) = 0.256 ms; experts see B k / (E phi) tokens each."""
    h = chip(matmul_half_tokens=64.0)
    assert float(matmul_efficiency(64.0, h)) == 0.5
    r = dcost.decode(Design(batch=64), h, dense(), Workload(0))
    assert float(r.t_compute) == pytest.approx(2.56e-4, rel=1e-12)
    # MoE at B = 1: one token per touched expert, eta = 1/65 for the experts and the dense part:
    # (2*1e9 + 2*4*1e8) * 65 / 1e15 = 1.82e-4 s
    r = dcost.decode(Design(batch=1), h, moe_model(), Workload(0))
    assert float(r.t_compute) == pytest.approx(2.8e9 * 65 / 1e15, rel=1e-9)


def test_mla_prefill_form_published():
    """DeepSeek-V3 (61 layers, 128 heads, nope 128, rope 64, v 128, latent 512): the prefill
    (non-absorbed) form 2*61*128*(128 + 64 + 128) = 4,997,120 FLOP per (token x context token),
    5.0 MFLOP; the absorbed decode form 2*61*128*(576 + 512) = 16,990,208, 17.0 MFLOP."""
    m = dcost.model("deepseek-v3")
    assert float(m.prefill_attn_flops_per_context_token) == 4_997_120.0
    assert float(m.attn_flops_per_context_token) == 16_990_208.0
    h, w = dcost.hardware("h800", precision="fp8"), Workload(0, prompt=32768)
    d = Design(batch=1, chips=8)
    with_form = dcost.prefill(d, h, m, w)
    absorbed = dcost.prefill(
        d, h, eqx.tree_at(lambda m: m.prefill_attn_flops_per_context_token, m, 0.0), w
    )
    # compute: 32768 * (2 (N_active - N_emb) + a * 32768/2) for each form; N_emb the untied
    # input embedding, vocabulary 129,280 x width 7,168, multiplied by no token
    assert float(m.params_embedding) == 129_280 * 7168
    n = 2 * (float(m.params_active) - 129_280 * 7168)
    ratio = (n + 4_997_120.0 * 16384) / (n + 16_990_208.0 * 16384)
    assert float(with_form.t_compute / absorbed.t_compute) == pytest.approx(ratio, rel=1e-5)


@pytest.mark.x64
def test_chunked_prefill_by_hand():
    """Dense, B = 1, T_in = 4000, C = 1000: 4 passes. Weights 4 * 2e9 B / 1e12 = 8 ms; KV writes
    4000*1e5 = 4e8 B plus reads 1e5 * 4000 * (4-1)/2 = 6e8 B: 1 ms; compute 4000*2e9/1e15 = 8 ms;
    t_stage = 9 ms (+ 4 passes of 1 ms step overhead = 13 ms)."""
    w = Workload(0, prompt=4000)
    assert float(chunks(4000.0, 1000.0)) == 4.0
    r = dcost.prefill(Design(batch=1, prefill_chunk=1000), chip(), dense(), w)
    assert float(r.t_weights) == pytest.approx(8e-3, rel=1e-12)
    assert float(r.t_kv) == pytest.approx(1e-3, rel=1e-12)
    assert float(r.t_stage) == pytest.approx(9e-3, rel=1e-12)
    r = dcost.prefill(Design(batch=1, prefill_chunk=1000), chip(step_overhead=1e-3), dense(), w)
    assert float(r.t_stage) == pytest.approx(1.3e-2, rel=1e-12)
    # a chunk longer than the prompt is one pass: v1
    one = dcost.prefill(Design(batch=1, prefill_chunk=8000), chip(), dense(), w)
    assert float(one.t_weights) == pytest.approx(2e-3, rel=1e-12)


# ----------------------------------------------------------------------------- speculation


def test_accepted_tokens_by_hand():
    assert float(speculative.accepted_tokens(0.8, 1.0)) == pytest.approx(1.8)
    assert float(speculative.accepted_tokens(0.5, 3.0)) == pytest.approx(1.875)  # 1+.5+.25+.125
    assert float(speculative.accepted_tokens(1.0, 3.0)) == 4.0
    assert float(speculative.accepted_tokens(0.0, 3.0)) == 1.0
    assert float(speculative.accepted_tokens(0.9, 0.0)) == pytest.approx(1.0)


@pytest.mark.x64
def test_speculative_decode_by_hand():
    """Dense on one chip, B = 1, T = 0, k = 1, a = 0.8: the verify pass reads 2e9 B (2 ms) for 2
    tokens, compute 2*2e9*2/1e15 = 4 us; tau = 1.8 so tpot = 2 ms / 1.8 = 1.1111 ms. A draft of
    1e8 bf16 parameters adds one pass of 2e8 B / 1e12 = 0.2 ms: tpot = 2.2 ms / 1.8."""
    w = Workload(0, acceptance=0.8)
    d = Design(batch=1, draft_tokens=1)
    with pytest.raises(dcost.SpecError, match="no draft"):  # a draft that costs nothing
        dcost.decode(d, chip(), dense(), w)
    r = dcost.decode(d, chip(), dense(draft_params=1e8), w)
    assert float(r.tokens_per_step) == pytest.approx(1.8, rel=1e-12)
    assert float(r.t_compute) == pytest.approx(4e-6, rel=1e-12)
    assert float(r.t_draft) == pytest.approx(2e-4, rel=1e-12)
    assert float(r.tpot) == pytest.approx(2.2e-3 / 1.8, rel=1e-12)
    assert float(r.tokens_per_s) == pytest.approx(1.8 / 2.2e-3, rel=1e-12)
    # the draft's weights and KV sit in memory only while it drafts: + 2e8 B
    m0 = dcost.decode(Design(batch=1), chip(), dense(draft_params=1e8), w).memory_per_chip
    assert float(r.memory_per_chip - m0) == pytest.approx(2e8, rel=1e-12)


def test_deepseek_mtp_speedup_published():
    """DeepSeek-V3 Technical Report, section 5.4.3: the second token's acceptance is 85-90 %,
    which gives 1.8x tokens per second. At a memory-bound batch that touches every expert
    (B = 256 on 16 chips: weights 671 GB / (16 * 3.35 TB/s) = 12.5 ms against 1.2 ms of compute)
    the model predicts the accepted length 1.85-1.9 less the MTP module's reads (12.5 GB in fp8,
    0.23 ms a pass): 1.8x-1.9x. (At B = 16 the verify pass's 32 tokens touch 64 % of the experts
    against 40 % for 16, and the speed-up falls to 1.2x: see experiments/speculative.py.)"""
    m, h = dcost.model("deepseek-v3"), dcost.hardware("h800", precision="fp8")
    for a in (0.85, 0.90):
        w = Workload(4096, acceptance=a)
        base = dcost.decode(Design(batch=256, chips=16), h, m, w)
        mtp = dcost.decode(Design(batch=256, chips=16, draft_tokens=1), h, m, w)
        speedup = float(mtp.tokens_per_s / base.tokens_per_s)
        assert 1.75 < speedup < 1.0 + a


# ------------------------------------------------------------------------------ mixed steps


@pytest.mark.x64
def test_mixed_step_by_hand():
    """Dense on one chip, B = 64, T = 1500, T_in = 1000, T_out = 500: c = 64*1000/500 = 128
    prompt tokens a step on average, admitted a whole prompt at a time, so f = 128/1000 of the
    steps carry 1000 and the rest none. A decode step: compute 64 * 2e9 / 1e15 = 0.128 ms,
    weights 2 ms, KV 64*1500*1e5 = 9.6e9 B: 11.6 ms. A step with a prompt: compute
    1064 * 2e9 / 1e15 = 2.128 ms, KV + 1000*1e5 written: 11.7 ms. Mean: compute 0.384 ms,
    t_stage 0.872 * 11.6 + 0.128 * 11.7 = 11.6128 ms."""
    w = Workload(1500, prompt=1000, output=500)
    r = mixed.mixed_step(Design(batch=64), chip(), dense(), w)
    assert float(r.t_compute) == pytest.approx(3.84e-4, rel=1e-12)
    assert float(r.t_weights + r.t_kv) == pytest.approx(1.16128e-2, rel=1e-12)
    assert float(r.tpot) == pytest.approx(1.16128e-2, rel=1e-12)
    assert float(r.tokens_per_s) == pytest.approx(64 / 1.16128e-2, rel=1e-12)
    # decode alone: 2 ms + 9.6 ms; the prefill interference is 0.0128 ms a token here
    alone = dcost.decode(Design(batch=64), chip(), dense(), w)
    assert float(r.tpot - alone.tpot) == pytest.approx(1.28e-5, rel=1e-9)
    # chunks of 250: f = 128/250 of the steps carry 250 tokens, which read the prompt's earlier
    # chunks, 250 * 1e5 * (4 - 1)/2 = 3.75e7 B more: KV 9.6e9 + 2.5e7 + 3.75e7 B
    chunked = mixed.mixed_step(Design(batch=64, prefill_chunk=250), chip(), dense(), w)
    f = 128 / 250
    want = (1 - f) * 11.6e-3 + f * (2e-3 + (9.6e9 + 2.5e7 + 3.75e7) / 1e12)
    assert float(chunked.tpot) == pytest.approx(want, rel=1e-12)
    with pytest.raises(dcost.SpecError, match="output"):
        mixed.mixed_step(Design(batch=64), chip(), dense(), Workload(1500, prompt=1000))


@pytest.mark.x64
def test_mixed_step_is_one_step_when_every_step_carries_prompts():
    """At c >= T_in (B tau / T_out >= 1 prompt a step) every step carries the mean c, and the
    mean step is the one step ``_mixed_step`` prices for the planner at ``chunk_tokens = c``."""
    w = Workload(1500, prompt=1000, output=500)
    m, h = moe_model(), chip(matmul_half_tokens=32.0, kernel_serialization=1.0)
    d = Design(batch=2048, chips=8)
    c = float(mixed.prefill_tokens_per_step(d, w))
    assert c == pytest.approx(4096.0)
    whole = mixed.mixed_step(d, h, m, w)
    one = mixed._mixed_step(d, h, m, w, 0.0, chunk_tokens=c)
    for k in ("tpot", "t_compute", "t_weights", "t_comm", "tokens_per_s", "mfu"):
        assert float(getattr(whole, k)) == pytest.approx(float(getattr(one, k)), rel=1e-12)


@pytest.mark.x64
def test_mixed_step_reads_the_experts_of_the_steps_it_runs():
    """MoE at a small batch: B = 4 sequences read at most B k = 16 of the 64 experts a step,
    and one step in T_out/B admits a whole prompt, whose 1,024 tokens read nearly all of them.
    The expected expert reads are the mean over those steps, below the reads of prompt tokens
    spread evenly, B + c tokens in every step (phi is concave: Jensen's inequality), and above
    a decode step's."""
    w = Workload(1536, prompt=1024, output=1024)
    m, h = moe_model(), chip()
    d = Design(batch=4, chips=8)
    c = float(mixed.prefill_tokens_per_step(d, w))  # 4 tokens a step on average
    f = c / 1024.0
    r = mixed.mixed_step(d, h, m, w)
    decode_only = mixed._mixed_step(d, h, m, w, 0.0, chunk_tokens=0.0)
    carrying = mixed._mixed_step(d, h, m, w, 0.0, chunk_tokens=1024.0)
    spread = mixed._mixed_step(d, h, m, w, 0.0, chunk_tokens=c)
    want = (1 - f) * float(decode_only.t_weights) + f * float(carrying.t_weights)
    assert float(r.t_weights) == pytest.approx(want, rel=1e-12)
    assert float(decode_only.t_weights) < float(r.t_weights) < float(spread.t_weights)


def test_kv_transfer_by_hand():
    """1000 tokens of 1e5 B over 4 chips' NICs at 1e10 B/s: 10 us + 1e8/(4e10) = 2.51 ms."""
    h = chip(scaleout_latency=1e-5)
    assert float(dcost.kv_transfer_time(1000.0, h, dense(), 4.0)) == pytest.approx(2.51e-3)


# ----------------------------------------------------- smooth forms tend to the exact ones


@pytest.mark.x64
@pytest.mark.parametrize(
    "fn",
    [
        lambda s: smin([3.0, 4.0], s),
        lambda s: chunks(4000.0, 1000.0, s),
        lambda s: chunks(1000.0, 4000.0, s),
        lambda s: moe.domains_reached(8.0, 8.0, 4.0, s),
        lambda s: moe.expected_max_load(1.0, 2.0, 1.0, s),
        lambda s: mixed.prefill_tokens_per_step(
            Design(batch=64, prefill_chunk=100), Workload(1, prompt=1000, output=500), s
        ),
        lambda s: mixed.chunk_step_tokens(
            Design(batch=64, prefill_chunk=300), Workload(1, prompt=1000, output=500), 128.0, s
        ),
        lambda s: mixed.chunk_step_tokens(
            Design(batch=64), Workload(1, prompt=1000, output=500), 900.0, s
        ),
    ],
)
def test_smooth_forms_tend_to_the_exact_ones(fn):
    """Every new min/max has a p-norm form; its error shrinks towards 0 with the smoothness."""
    exact = float(fn(0.0))
    errors = [abs(float(fn(s)) - exact) for s in (0.1, 0.03, 0.01, 0.001)]
    assert errors[0] > 0
    assert all(b <= a for a, b in zip(errors, errors[1:], strict=False))
    assert errors[-1] < 1e-2 * max(abs(exact), 1.0)


# ------------------------------------------------------------ gradients, jit, vmap, checks


def _all_on():
    """A design point with every v2 term on, away from the kinks of the exact model."""
    h = chip(
        step_overhead=2e-4,
        layer_overhead=1e-6,
        scaleup_latency=2e-6,
        scaleout_latency=5e-6,
        scaleup_efficiency=0.8,
        scaleout_efficiency=0.7,
        matmul_half_tokens=32.0,
        flops_efficiency=0.7,
        bandwidth_efficiency=0.85,
        kernel_serialization=0.7,
        attention_flops=0.6e15,
        tree_collectives=0.6,
        kv_bandwidth_efficiency=0.65,
        sequence_overhead=3e-6,
        kernel_roofline_smoothness=0.35,
        expert_flops_efficiency=0.75,
    )
    m = moe_model(
        params_attention=2e8,
        params_embedding=5e7,
        kv_heads=2,
        attn_flops_per_context_token=1e5,
        prefill_attn_flops_per_context_token=4e4,
        max_domains_per_token=2,  # a whole count; below the 2.41 domains reached: the cap binds
        draft_params=5e7,
        draft_params_total=3e8,
        draft_layers=1,
        draft_kv_bytes_per_token=1e4,
        n_moe_layers=9,
    )
    d = Design(
        batch=48,
        chips=24,
        stages=2,
        attention_dp=6,
        dispatch_dedup=0.7,
        redundant_experts=6,
        expert_parallel=12,  # 12 groups (over two scale-up domains), each expert split in 2
        draft_tokens=2,
        prefill_chunk=700,
        comm_overlap=0.4,
    )
    w = Workload(1800, prompt=1500, output=600, acceptance=0.7, expert_imbalance=1.3)
    return d, h, m, w


@pytest.mark.x64
@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
@pytest.mark.parametrize("smoothness", [0.0, 0.1])
def test_gradients_match_central_differences_with_every_term_on(kind, smoothness):
    """d log(cost)/d log(field) by autodiff against central differences, for every float field
    of the four specs (the v2 ones included), exact and smooth."""
    fn = {"decode": dcost.decode, "prefill": dcost.prefill, "mixed": dcost.mixed_step}[kind]
    specs = _all_on()

    def cost(*specs):
        return fn(*specs, smoothness).cost_per_token

    f0 = float(cost(*specs))
    grads = jax.grad(cost, argnums=(0, 1, 2, 3))(*specs)
    failures, checked = [], 0
    for i, spec in enumerate(specs):
        for field in dataclasses.fields(spec):
            x0 = getattr(spec, field.name)
            if x0 is None or isinstance(x0, str):
                continue
            x0 = float(x0)
            g = float(getattr(grads[i], field.name))
            assert np.isfinite(g), f"{type(spec).__name__}.{field.name}"
            if x0 == 0.0:
                continue
            step = 1e-6 * abs(x0)

            def at(x, i=i, spec=spec, name=field.name):
                moved = eqx.tree_at(lambda t: getattr(t, name), spec, jnp.asarray(x, jnp.float64))
                return float(cost(*specs[:i], moved, *specs[i + 1 :]))

            fd = (at(x0 + step) - at(x0 - step)) / (2 * step)
            e_ad, e_fd = g * x0 / f0, fd * x0 / f0
            checked += 1
            if abs(e_ad - e_fd) > 1e-5 * (1 + abs(e_fd)):
                failures.append(f"{type(spec).__name__}.{field.name}: {e_ad:.9g} vs {e_fd:.9g}")
    assert not failures, "\n".join(failures)
    assert checked >= 40


def test_jit_and_vmap_over_v2_designs_equal_one_by_one():
    d, h, m, w = _all_on()
    dedup = jnp.asarray([0.0, 0.5, 1.0])
    k = jnp.asarray([0.0, 1.0, 3.0])
    designs = Design(
        batch=jnp.full(3, 48.0),
        chips=jnp.full(3, 24.0),
        stages=jnp.full(3, 2.0),
        attention_dp=jnp.full(3, 6.0),
        dispatch_dedup=dedup,
        redundant_experts=jnp.full(3, 6.0),
        draft_tokens=k,
        prefill_chunk=jnp.full(3, 700.0),
    )
    batched = jax.jit(jax.vmap(dcost.decode, in_axes=(0, None, None, None)))(designs, h, m, w)
    for i in range(3):
        one = dcost.decode(
            Design(48, 24, 2, attention_dp=6, dispatch_dedup=dedup[i], redundant_experts=6,
                   draft_tokens=k[i], prefill_chunk=700),
            h, m, w,
        )  # fmt: skip
        np.testing.assert_allclose(float(batched.tpot[i]), float(one.tpot), rtol=1e-5)


# ------------------------------------------------------------------------- precisions apart


def test_precisions_apart_by_hand():
    """Llama-3-70B (80 layers, 8 KV heads of 128): KV 2*80*8*128 = 163,840 elements a token; in
    fp8 163,840 B (bf16: 327,680 B). MXFP4 weights 4.25 bits = 0.53125 B; NVFP4 4.5 bits."""
    base = dcost.model("llama-3-70b")
    assert float(base.kv_bytes_per_token) == 327_680.0
    m = dcost.model("llama-3-70b", weights="mxfp4", kv_cache="fp8", activations="fp8")
    assert float(m.bytes_per_param) == 0.53125
    assert float(m.kv_bytes_per_token) == 163_840.0
    assert float(m.act_bytes) == 1.0
    assert float(dcost.model("llama-3-70b", weights="nvfp4").bytes_per_param) == 0.5625
    # the MTP draft's KV (one MLA layer, 576 elements) follows the cache format
    r1 = dcost.model("deepseek-r1", kv_cache="fp8")
    assert float(r1.draft_kv_bytes_per_token) == 576.0
    assert float(r1.kv_bytes_per_token) == 61 * 576.0
    # NVFP4 and MXFP4 matmuls at the chip's fp4 rate
    fp4 = dcost.hardware("b200", precision="fp4").flops
    assert float(dcost.hardware("b200", precision="nvfp4").flops) == float(fp4)
    with pytest.raises(dcost.PresetError, match="mxfp4"):
        dcost.model("llama-3-70b", weights="fp6")


def test_presets_carry_the_v2_model_fields():
    """Every preset sets every v2 model field (so presets stack); spot values by hand:
    Llama-3-70B attention 80 * (2*8192*64*128 + 2*8192*8*128) = 80 * 150,994,944; 8 KV heads;
    DeepSeek-V3 node limit 4, MLA one latent head, MTP draft 1 layer."""
    for name in dcost.model_names():
        m = dcost.model(name)
        for field in (
            "params_attention",
            "kv_heads",
            "attention_heads",
            "max_domains_per_token",
            "draft_params",
        ):
            assert getattr(m, field) is not None, (name, field)
        assert 0 < float(m.params_attention) < float(m.params_dense)
    llama = dcost.model("llama-3-70b")
    assert float(llama.params_attention) == 80 * 150_994_944
    assert float(llama.kv_heads) == 8.0 and float(llama.attention_heads) == 64.0
    v3 = dcost.model("deepseek-v3")
    assert float(v3.max_domains_per_token) == 4.0 and float(v3.kv_heads) == 1.0
    assert float(v3.draft_layers) == 1.0 and float(v3.draft_params) > 1e9
    assert float(dcost.model("kimi-k2").max_domains_per_token) == 0.0
    assert float(dcost.model("llama-3-70b").draft_params) == 0.0


def test_jitted_v2_decode_does_not_recompile():
    """New values of the v2 fields (ints or floats) reuse the compiled decode: the second call
    does not trace again. (Traces are counted by a side effect of a fresh function; the size of
    ``jax.jit(dcost.decode)``'s dispatch cache is shared with every other jit of ``decode`` in
    the process and counts more than compilations.)"""
    traces = []

    def decode(*specs):
        traces.append(1)  # runs only while JAX traces
        return dcost.decode(*specs)

    f = jax.jit(decode)
    d, h, m, w = _all_on()
    first = f(d, h, m, w)
    d2 = Design(
        batch=64,
        chips=16,
        stages=1,
        attention_dp=4,
        dispatch_dedup=1,
        redundant_experts=0,
        expert_parallel=4,
        draft_tokens=1,
        prefill_chunk=256,
        comm_overlap=1,
    )
    w2 = Workload(900, prompt=700, output=100, acceptance=0.9, expert_imbalance=1.0)
    second = f(d2, h, m, w2)
    assert len(traces) == 1
    assert float(second.tpot) != float(first.tpot)  # the new values were used
    np.testing.assert_allclose(
        float(second.tpot), float(dcost.decode(d2, h, m, w2).tpot), rtol=1e-6
    )


# ----------------------------------------------------------------- linear-attention state


@pytest.mark.x64
def test_linear_attention_state_by_hand():
    """A recurrent state of sigma = 1e8 bytes a sequence (``state_bytes_per_sequence``), against
    the same dense model without it. Decode, B = 4, T = 100, one chip: the state is read and
    written, 2 * 4 * 1e8 = 8e8 B, 0.8 ms more of KV time; each sequence holds it, 4e8 B more
    memory. On 4 tensor-parallel chips both split: 0.2 ms and 1e8 B a chip. Its FLOPs (1e6 a
    token) go at the attention rate: 4 tokens * 1e6 / 1e15 = 4 ns of compute. A prefill of one
    4,000-token prompt in 4 chunks reads and writes it 2 * 4 - 1 = 7 times: 0.7 ms. A mixed step
    (B = 8, prompts of 400, outputs of 100) whose 16-token chunks run every step carries one
    prompt's state beside the 8 decodes': 2 * 9 * 1e8 B, 1.8 ms; carrying whole prompts in
    f = 0.08 of its steps, 0.92 * 1.6 ms + 0.08 * 1.8 ms = 1.616 ms on the mean step."""
    h, w = chip(), Workload(100)
    m0, m = dense(), dense(state_bytes_per_sequence=1e8, state_flops_per_token=1e6)
    for g, kv, mem in ((1, 0.8e-3, 4e8), (4, 0.2e-3, 1e8)):
        d = Design(batch=4, chips=g)
        r, r0 = dcost.decode(d, h, m, w), dcost.decode(d, h, m0, w)
        assert float(r.t_kv - r0.t_kv) == pytest.approx(kv, rel=1e-9)
        assert float(r.memory_per_chip - r0.memory_per_chip) == pytest.approx(mem, rel=1e-9)
        assert float(r.t_compute - r0.t_compute) == pytest.approx(4e6 / 1e15 / g, rel=1e-9)
    wp, dp = Workload(0, prompt=4000), Design(batch=1, prefill_chunk=1000)
    gap = dcost.prefill(dp, h, m, wp).t_kv - dcost.prefill(dp, h, m0, wp).t_kv
    assert float(gap) == pytest.approx(0.7e-3, rel=1e-9)
    wm = Workload(100, prompt=400, output=100)
    for d, expected in ((Design(batch=8, prefill_chunk=16), 1.8e-3), (Design(batch=8), 1.616e-3)):
        gap = dcost.mixed_step(d, h, m, wm).t_kv - dcost.mixed_step(d, h, m0, wm).t_kv
        assert float(gap) == pytest.approx(expected, rel=1e-9)
    with pytest.raises(dcost.SpecError, match="state_bytes_per_sequence"):
        dense(state_bytes_per_sequence=-1.0)


def test_qwen35_state_binds_at_long_batches():
    """Qwen3.5-397B-A17B on 8 B200s, batch 256: its 15 attention layers' KV (30,720 B a token,
    its 2 KV heads held 4 times over 8 tensor-parallel chips) grows with the context, the 45
    Gated DeltaNet layers' state (192 MB a sequence, read and written every step) does not: at
    1,024 tokens the state's traffic is 3x the KV's, at 65,536 a twentieth of it."""
    h = dcost.hardware("b200")
    m = dcost.model("qwen3.5-397b-a17b", weights="fp8")
    d = Design(batch=256, chips=8, attention_dp=1)  # attention over 8 tensor-parallel chips
    short, long = (dcost.decode(d, h, m, Workload(t)) for t in (1024, 65536))
    bw = float(h.hbm_bandwidth)
    kv = lambda t: 256 * t * 30720 * 4 / (8 * bw)  # noqa: E731  (2 KV heads over 8 chips: x4)
    state = 2 * 256 * float(m.state_bytes_per_sequence) / (8 * bw)
    assert float(short.t_kv) == pytest.approx(kv(1024) + state, rel=1e-4)
    assert float(long.t_kv) == pytest.approx(kv(65536) + state, rel=1e-4)


# ------------------------------------------------------------------ sparse attention (DSA)


@pytest.mark.x64
def test_sparse_attention_by_hand():
    """Top-k attention (``attention_topk = k = 2048``) with an indexer of 1e4 B a token and 1e5
    FLOPs per context token, against dense attention of the same model (a = 1e6 FLOPs, 1e5 B of
    KV a token). Decode, B = 4, T = 8192, one chip: the attention reads the top 2,048 tokens'
    KV and the indexer every token's key: 4 * (2048 * 1e5 + 8192 * 1e4) B = 1.1469e9 B against
    4 * 8192 * 1e5 = 3.2768e9 B dense; FLOPs 4 * (1e6 * 2048 + 1e5 * 8192) = 1.1469e10. Memory
    holds every token's KV and key: 4 * 8192 * 1.1e5 B. Below k (T = 1000) the attention is
    dense and only the indexer is added. A prefill of 8,192 tokens attends to a mean of
    2048 - 2048^2/(2 * 8192) = 1,792 tokens a token (4,096 dense). An indexer's fixed cost
    (``index_layer_overhead`` 30 us) is paid on each of the 10 layers of a sparse model only."""
    h = chip()
    dense_m = dense(attn_flops_per_context_token=1e6)
    sparse_m = dense(
        attn_flops_per_context_token=1e6,
        attention_topk=2048,
        index_bytes_per_token=1e4,
        index_flops_per_context_token=1e5,
    )
    d = Design(batch=4)
    r, r0 = (dcost.decode(d, h, m, Workload(8192)) for m in (sparse_m, dense_m))
    assert float(r.t_kv) == pytest.approx(4 * (2048 * 1e5 + 8192 * 1e4) / 1e12, rel=1e-9)
    assert float(r0.t_kv) == pytest.approx(4 * 8192 * 1e5 / 1e12, rel=1e-9)
    ctx = r.t_compute - r0.t_compute  # the same weights' FLOPs; attention 1e6*(2048 - 8192) + ...
    assert float(ctx) == pytest.approx(4 * (1e6 * (2048 - 8192) + 1e5 * 8192) / 1e15, rel=1e-9)
    assert float(r.memory_per_chip - r0.memory_per_chip) == pytest.approx(4 * 8192 * 1e4)
    short = dcost.decode(d, h, sparse_m, Workload(1000)).t_kv
    assert float(short) == pytest.approx(4 * 1000 * 1.1e5 / 1e12, rel=1e-9)
    wp, one = Workload(0, prompt=8192), Design(batch=1)
    p, p0 = (dcost.prefill(one, h, m, wp) for m in (sparse_m, dense_m))
    gap = p.t_compute - p0.t_compute
    assert float(gap) == pytest.approx(8192 * (1e6 * (1792 - 4096) + 1e5 * 4096) / 1e15, rel=1e-9)
    ho = chip(index_layer_overhead=3e-5)
    assert float(dcost.decode(d, ho, sparse_m, Workload(8192)).t_overhead) == pytest.approx(3e-4)
    assert float(dcost.decode(d, ho, dense_m, Workload(8192)).t_overhead) == 0.0
    with pytest.raises(dcost.SpecError, match="attention_topk"):
        dense(attention_topk=2.5)


def test_sparse_attention_is_smooth():
    """The top-k's ``min(T, k)`` is smooth under ``smoothness > 0``: the gradient of a decode
    step's time against the context is finite and positive on both sides of ``k``, and at
    ``smoothness = 0`` it is the exact minimum."""
    h, m = dcost.hardware("h200"), dcost.model("glm-5", weights="fp8")
    d = Design(batch=64, chips=8)

    def tpot(t):
        return dcost.decode(d, h, m, Workload(t), smoothness=0.05).tpot

    for t in (1024.0, 2048.0, 8192.0):
        g = float(jax.grad(tpot)(t))
        assert np.isfinite(g) and g > 0
    from dcost.serving.roofline import attended

    assert float(attended(8192.0, 2048.0, 0.0)) == 2048.0
    assert 1500.0 < float(attended(2048.0, 2048.0, 0.05)) < 2048.0


@pytest.mark.x64
@pytest.mark.parametrize("context", [0.0, 1000.0, 4000.0])
def test_balance_batch_with_state_and_top_k_is_decodes_crossing(context):
    """``balance_batch`` is the batch at which ``decode``'s compute equals its weight and KV
    time, for a model with a linear-attention state and top-k attention too (a dense model, so
    every weight is read: ``phi = 1``); ``critical_context`` is where that batch runs off to
    infinity: just below it the batch is finite, just above no batch is compute bound. Here
    (F/BW = 1000) that is past the top 2,048: ((2e9 + 1e7) 1e12 - 2e5 1e15 + 2048 (2e5 1e12 -
    500 1e15)) / (200 1e15 - 1e4 1e12) = 6,293 tokens."""
    h = chip()
    m = dense(
        attn_flops_per_context_token=2e5,
        kv_bytes_per_token=500.0,
        state_bytes_per_sequence=1e5,
        state_flops_per_token=1e7,
        attention_topk=2048,
        index_bytes_per_token=2e2,
        index_flops_per_context_token=1e4,
    )
    b = float(dcost.balance_batch(h, m, context))
    assert np.isfinite(b)
    r = dcost.decode(Design(batch=b), h, m, Workload(context))
    assert float(r.t_compute) == pytest.approx(float(r.t_weights + r.t_kv), rel=1e-9)
    tc = float(dcost.critical_context(h, m))
    assert tc == pytest.approx((2.01e21 - 2e20 - 2048 * 3e17) / 1.9e17, rel=1e-9)  # past k
    assert np.isfinite(float(dcost.balance_batch(h, m, 0.99 * tc)))
    assert float(dcost.balance_batch(h, m, 1.01 * tc)) == np.inf
    # a state too large for any batch to be compute bound: no crossing, a critical context of 0
    heavy = dense(state_bytes_per_sequence=1e9)
    assert float(dcost.balance_batch(h, heavy, 0.0)) == np.inf
    assert float(dcost.critical_context(h, heavy)) == 0.0


@pytest.mark.x64
def test_a_draft_layer_pays_a_target_layers_gemms():
    """Two draft passes of one layer, 4 GEMMs of 3 us: 2 * 1 * (1e-5 + 4 * 3e-6) = 44 us of
    fixed cost, 24 us more than without the GEMM term."""
    draft_time = speculative.draft_time
    m = dense(draft_params=1e8, draft_layers=1.0, gemms_per_layer=4.0)
    base = chip(layer_overhead=1e-5)
    h = chip(layer_overhead=1e-5, gemm_overhead=3e-6)
    plain = float(draft_time(1.0, 0.0, 2.0, 1.0, chip(), m))
    assert float(draft_time(1.0, 0.0, 2.0, 1.0, h, m)) == pytest.approx(plain + 44e-6, rel=1e-9)
    assert float(
        draft_time(1.0, 0.0, 2.0, 1.0, h, m) - draft_time(1.0, 0.0, 2.0, 1.0, base, m)
    ) == pytest.approx(24e-6, rel=1e-9)
