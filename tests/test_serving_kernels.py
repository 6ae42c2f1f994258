"""The terms the validation work added to the serving model, each off by default: kernels in
series (``Hardware.kernel_serialization``), collectives hidden behind them
(``Design.comm_overlap``), attention at its own rate (``Hardware.attention_flops``), log-depth
all-reduces and all-to-alls (``Hardware.tree_collectives``) and the KV cache's own read efficiency
(``Hardware.kv_bandwidth_efficiency``), a smooth roofline inside each kernel
(``Hardware.kernel_roofline_smoothness``) and the routed experts' grouped-matmul rate
(``Hardware.expert_flops_efficiency``).

Hand calculations use the round-number chip of ``tests/test_serving_v2.py`` (1 PFLOP/s, 1 TB/s,
scale-up 100 GB/s) and a dense model of 1e9 bf16 parameters (L = 10, d = 1000, 1e5 KV bytes per
token); expected numbers are worked out in the comments. Gradients are checked against central
differences in ``test_serving_v2.py`` (``_all_on`` sets every one of these fields).
"""

import jax.numpy as jnp
import pytest

import dcost
from dcost import Design, Workload
from dcost.serving.attention import attention_comm_time
from dcost.serving.collectives import all_reduce, all_to_all_rounds
from dcost.serving.kernels import kernel_time
from dcost.serving.moe import all_to_all_time, expert_tensor_parallel_time
from dcost.serving.roofline import stage_time
from dcost.specs import MULTINOMIAL, SpecError


def chip(**kw):
    base = dict(
        flops=1e15,
        hbm_bandwidth=1e12,
        hbm_capacity=1e12,
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
        attn_flops_per_context_token=1e5,
    )
    return dcost.Model(**{**base, **kw})


# B = 1024 sequences at context T = 1000 on one chip:
#   weight matmuls: compute 2 * 1e9 * 1024 / 1e15 = 2.048 ms, weights 2e9 B / 1e12 = 2 ms
#   attention:      compute 1024 * 1e5 * 1000 / 1e15 = 0.1024 ms, KV 1024 * 1000 * 1e5 / 1e12
#                   = 102.4 ms
#   whole-step roofline: max(2.048 + 0.1024, 2 + 102.4) = 104.4 ms
#   kernels in series:   max(2.048, 2) + max(0.1024, 102.4) = 104.448 ms
DESIGN = Design(batch=1024, chips=1)
WORK = Workload(1000.0)


@pytest.mark.x64
@pytest.mark.parametrize(("s", "expected"), [(0.0, 0.1044), (1.0, 0.104448), (0.5, 0.104424)])
def test_kernels_in_series_by_hand(s, expected):
    r = dcost.decode(DESIGN, chip(kernel_serialization=s), dense(), WORK)
    assert float(r.t_stage) == pytest.approx(expected, rel=1e-12)
    assert float(r.tpot) == pytest.approx(expected, rel=1e-12)


@pytest.mark.x64
@pytest.mark.parametrize(
    ("r", "expected"),
    [
        # weight matmuls: (2.048^(1/r) + 2^(1/r))^r ms; attention: (0.1024^(1/r) + 102.4^(1/r))^r
        (1.0, 4.048e-3 + 102.5024e-3),  # sums: no overlap inside a kernel
        (0.5, (2.048**2 + 2.0**2) ** 0.5 * 1e-3 + (0.1024**2 + 102.4**2) ** 0.5 * 1e-3),
    ],
)
def test_kernel_roofline_smoothness_by_hand(r, expected):
    """Kernels in series, each at a smooth roofline ``(t_F^(1/r) + t_W^(1/r))^r``."""
    h = chip(kernel_serialization=1.0, kernel_roofline_smoothness=r)
    t = dcost.decode(DESIGN, h, dense(), WORK).t_stage
    assert float(t) == pytest.approx(expected, rel=1e-12)


@pytest.mark.x64
def test_kernel_time_tends_to_the_roofline_and_takes_the_larger_smoothness():
    """r -> 0 gives the exact maximum (the off value is exactly it); the optimizer's smoothness
    applies where it is the larger of the two."""
    off = chip()
    assert float(kernel_time(3.0, 4.0, off)) == 4.0
    errors = [float(kernel_time(3.0, 4.0, chip(kernel_roofline_smoothness=r))) - 4.0
              for r in (0.3, 0.1, 0.03, 0.01)]  # fmt: skip
    assert all(b < a for a, b in zip(errors, errors[1:], strict=False)) and errors[-1] < 1e-9
    assert float(kernel_time(3.0, 4.0, chip(kernel_roofline_smoothness=0.0))) == 4.0
    h = chip(kernel_roofline_smoothness=0.1)
    assert float(kernel_time(3.0, 4.0, h, 0.5)) == pytest.approx(5.0, rel=1e-12)
    assert float(kernel_time(3.0, 4.0, h, 0.05)) == float(kernel_time(3.0, 4.0, h))


@pytest.mark.x64
def test_the_draft_pass_is_a_kernel_at_the_same_roofline():
    """One draft pass of a 1e8-parameter bf16 draft at batch 1: 0.2 GFLOP = 0.2 us of compute
    against 2e8 B / 1e12 = 200 us of reads; summed at r = 1, 200.2 us a pass, two passes."""
    from dcost.serving.speculative import draft_time

    m = dense(draft_params=1e8)
    at = {r: float(draft_time(1.0, 0.0, 2.0, 1.0, chip(kernel_roofline_smoothness=r), m))
          for r in (0.0, 1.0)}  # fmt: skip
    assert at[0.0] == pytest.approx(4e-4, rel=1e-12)
    assert at[1.0] == pytest.approx(2 * (2e-4 + 2e-7), rel=1e-12)


@pytest.mark.x64
def test_every_new_term_at_its_off_value_is_v1():
    """Each new field set to the value that switches it off gives v1's numbers exactly."""
    m = dcost.model("llama-3-70b")
    base_hw = dcost.hardware("h100-sxm")
    d, w = Design(batch=96, chips=8), Workload(3000.0, prompt=2000.0, output=500.0)
    h_off = dcost.hardware(
        "h100-sxm",
        kernel_serialization=0.0,
        tree_collectives=0.0,
        attention_flops=float(base_hw.flops),
        kv_bandwidth_efficiency=float(base_hw.bandwidth_efficiency),
        kernel_roofline_smoothness=0.0,
    )
    d_off = Design(batch=96, chips=8, comm_overlap=0.0)
    for fn in (dcost.decode, dcost.mixed_step):
        a, b = fn(d, base_hw, m, w), fn(d_off, h_off, m, w)
        assert float(a.tpot) == float(b.tpot)
        assert float(a.t_comm) == float(b.t_comm)


@pytest.mark.x64
def test_comm_overlap_takes_the_longer_stream():
    """With the collectives fully hidden the stage is max(kernels, comm); without, their sum.
    The kernels are read off the o = 0 run (t_stage - t_comm - overhead): the two must agree."""
    h = dcost.hardware("h100-sxm", precision="fp8", kernel_serialization=1.0)
    m = dcost.model("deepseek-v3")
    w = Workload(2000.0)
    runs = {
        o: dcost.decode(Design(batch=2048, chips=16, comm_overlap=o), h, m, w) for o in (0, 0.5, 1)
    }
    comm = float(runs[0].t_comm)
    kernels = float(runs[0].t_stage) - comm - float(runs[0].t_overhead)
    assert comm > 0 and kernels > 0
    assert float(runs[1].t_stage) == pytest.approx(max(kernels, comm), rel=1e-9)
    assert float(runs[0.5].t_stage) == pytest.approx(
        0.5 * (kernels + comm) + 0.5 * max(kernels, comm), rel=1e-9
    )


@pytest.mark.x64
def test_attention_at_its_own_rate_by_hand():
    # attention FLOPs 0.1024 ms at 1 PFLOP/s take 0.2048 ms at 0.5 PFLOP/s: t_compute grows by
    # exactly 0.1024 ms (and the matmuls' 2.048 ms do not move)
    a = dcost.decode(DESIGN, chip(), dense(), WORK)
    b = dcost.decode(DESIGN, chip(attention_flops=0.5e15), dense(), WORK)
    assert float(b.t_compute - a.t_compute) == pytest.approx(1.024e-4, rel=1e-12)
    h = chip(attention_flops=0.5e15, flops_efficiency=0.5)
    assert float(h.attention_flops_achieved) == pytest.approx(0.25e15)


@pytest.mark.x64
def test_kv_bandwidth_efficiency_by_hand():
    # 102.4 ms of KV reads at half the bandwidth: 204.8 ms; the weights' 2 ms do not move
    r = dcost.decode(DESIGN, chip(kv_bandwidth_efficiency=0.5), dense(), WORK)
    assert float(r.t_kv) == pytest.approx(0.2048, rel=1e-12)
    assert float(r.t_weights) == pytest.approx(0.002, rel=1e-12)


@pytest.mark.x64
@pytest.mark.parametrize(
    ("n", "tree", "steps"),
    [(8.0, 0.0, 14.0), (8.0, 1.0, 6.0), (16.0, 1.0, 8.0), (8.0, 0.5, 10.0), (1.0, 1.0, 0.0)],
)
def test_all_reduce_message_counts(n, tree, steps):
    # ring 2(n-1) messages; log-depth 2 log2(n); a mix in between; none on one chip
    alpha = 1e-6
    t = all_reduce(0.0, jnp.asarray(n), 1e11, alpha, tree)
    assert float(t) == pytest.approx(steps * alpha, abs=1e-15)


@pytest.mark.x64
def test_tree_collectives_in_a_tensor_parallel_stage_by_hand():
    # dense, A = 1, G = 8, 10 layers, 2 all-reduces per layer of V = 1e3 * 1000 * 2 B = 2e6 B:
    #   bandwidth 10 * 2 * (2 * 7/8) * 2e6 / 1e11 = 0.7 ms; latency 10 * 2 * 2 log2(8) * 1 us
    #   = 0.12 ms with tree collectives (ring: 10 * 2 * 14 us = 0.28 ms)
    h = chip(scaleup_latency=1e-6, tree_collectives=1.0)
    t = attention_comm_time(1e3, 10.0, 8.0, 1.0, h, dense())
    assert float(t) == pytest.approx(0.7e-3 + 0.12e-3, rel=1e-12)
    ring = attention_comm_time(1e3, 10.0, 8.0, 1.0, chip(scaleup_latency=1e-6), dense())
    assert float(ring) == pytest.approx(0.7e-3 + 0.28e-3, rel=1e-12)


def moe(**kw):
    base = dict(
        n_layers=10,
        d_model=1000,
        params_dense=1e8,
        params_per_expert=1e7,
        n_experts=64,
        experts_active=4,
        kv_bytes_per_token=1e5,
        bytes_per_param=2.0,
        attn_flops_per_context_token=1e5,
    )
    return dcost.Model(**{**base, **kw})


@pytest.mark.x64
@pytest.mark.parametrize("tree", [0.0, 1.0, 0.25])
def test_tree_collectives_in_an_expert_parallel_all_to_all_by_hand(tree):
    # G = 16 chips over two scale-up domains of S = 8, v1 dispatch (dedup = 0), 10 MoE layers,
    # 1000 tokens, k = 4, d = 1000, 2-byte activations, imbalance 1:
    #   bytes per chip 1000 * 10 * (4 * 2 * 1000 * 2) * 15/256 = 9.375e6 B, of which 7/15 on
    #   scale-up (4.375e6 B over 1e11 B/s = 43.75 us) and 8/15 on scale-out (5e6 B over 1e10
    #   B/s = 500 us); 2 * 10 = 20 all-to-alls, each to 7 scale-up and 8 scale-out peers:
    #   latency rounds 7 and 8 one after another (tree 0), log2(8) = 3 and log2(9) (tree 1)
    up_alpha, out_alpha = 1e-6, 1e-5
    h = chip(scaleup_latency=up_alpha, scaleout_latency=out_alpha, tree_collectives=tree)
    t = all_to_all_time(1000.0, 10.0, 16.0, h, moe())
    rounds_up = (1 - tree) * 7 + tree * 3.0
    rounds_out = (1 - tree) * 8 + tree * float(jnp.log2(9.0))
    up = 20 * rounds_up * up_alpha + 43.75e-6
    out = 20 * rounds_out * out_alpha + 500e-6
    assert float(t) == pytest.approx(max(up, out), rel=1e-12)
    assert all_to_all_rounds(7.0, tree) == pytest.approx(rounds_up, rel=1e-12)


@pytest.mark.x64
def test_expert_tensor_parallel_gathers_by_hand():
    # e = 1 group over G = 8 chips, 10 MoE layers, 1000 tokens of d = 1000 in 2 bytes: V = 2e6 B,
    # one all-reduce's traffic per layer over the 8 chips (ring, 1 us a message):
    #   bandwidth 2 * 7/8 * 2e6 / 1e11 = 35 us, latency 2 * 7 * 1 us = 14 us; 10 layers: 0.49 ms
    h = chip(scaleup_latency=1e-6)
    t = expert_tensor_parallel_time(1000.0, 10.0, 8.0, 1.0, h, moe())
    assert float(t) == pytest.approx(0.49e-3, rel=1e-12)
    # e = 2 groups of 4: a token's k = 4 experts fall in 2 (1 - (1/2)^4) = 1.875 groups, so a
    # group gathers 1000 * 1.875 / 2 tokens: V = 1.875e6 B over 4 chips, busiest 1.2 times that:
    #   2 * 3/4 * 1.2 * 1.875e6 / 1e11 = 33.75 us + 2 * 3 * 1 us = 39.75 us a layer
    t2 = expert_tensor_parallel_time(1000.0, 10.0, 8.0, 2.0, h, moe(), imbalance=1.2)
    assert float(t2) == pytest.approx(0.3975e-3, rel=1e-12)
    # every expert whole on one chip (e = G): no gathers
    assert float(expert_tensor_parallel_time(1000.0, 10.0, 8.0, 8.0, h, moe())) == 0.0


@pytest.mark.x64
def test_expert_tensor_parallel_stage_is_a_dense_tensor_parallel_stage():
    """At e = 1 with tensor-parallel attention (A = 1) an MoE stage's collectives are a dense
    stage's: two all-reduces of V per layer over G (attention's and the experts'), no all-to-all,
    and the busiest chip carries the mean expert load (multinomial routing or not)."""
    h, m = chip(scaleup_latency=1e-6, tree_collectives=1.0), moe()
    w = Workload(1000.0, expert_imbalance=MULTINOMIAL)
    d = Design(batch=64, chips=8, attention_dp=1, expert_parallel=1)
    r = dcost.decode(d, h, m, w)
    by_hand = 2.0 * attention_comm_time(64.0, 10.0, 8.0, 1.0, h, m)
    assert float(r.t_comm) == pytest.approx(float(by_hand), rel=1e-12)
    balanced = dcost.decode(d, h, m, Workload(1000.0, expert_imbalance=1.0))
    assert float(r.t_compute) == pytest.approx(float(balanced.t_compute), rel=1e-12)
    # expert parallel over the same chips pays the busiest chip's load: more compute
    ep = dcost.decode(Design(batch=64, chips=8, attention_dp=1, expert_parallel=8), h, m, w)
    assert float(ep.t_compute) > float(r.t_compute)


@pytest.mark.x64
@pytest.mark.parametrize("kind", ["decode", "prefill", "mixed"])
def test_expert_parallel_over_every_chip_is_v1(kind):
    """``expert_parallel = G`` (each expert whole on one chip) is what None (v1) computes."""
    fn = {"decode": dcost.decode, "prefill": dcost.prefill, "mixed": dcost.mixed_step}[kind]
    h = dcost.hardware("h100-sxm", calibrated=True)
    m = dcost.model("deepseek-v3")
    w = Workload(2000.0, prompt=1500.0, output=500.0, expert_imbalance=MULTINOMIAL)
    for a in (1.0, 16.0):
        v1 = fn(Design(batch=256, chips=16, attention_dp=a, prefill_chunk=512), h, m, w)
        d = Design(batch=256, chips=16, attention_dp=a, prefill_chunk=512, expert_parallel=16)
        v2 = fn(d, h, m, w)
        for field in ("t_comm", "t_compute", "cost_per_token"):
            assert float(getattr(v2, field)) == pytest.approx(float(getattr(v1, field)), rel=1e-12)


@pytest.mark.x64
def test_draft_passes_pay_a_target_layers_collectives_by_hand():
    # dense, G = 8 chips, tensor-parallel attention, 2 draft tokens of a 1-layer draft at B = 4:
    # each pass exchanges one layer's two all-reduces of V = 4 * 1000 * 2 B = 8e3 B over 8
    # chips, 2 * 7/8 * 8e3 / 1e11 = 0.14 us + 2 * 7 * 1 us = 14.14 us each: 28.28 us a pass.
    # Its reads, 2e7 B over 8 chips at 1e12 B/s, take 2.5 us.
    from dcost.serving.speculative import draft_time

    m = dense(draft_params=1e7, draft_layers=1)
    w = Workload(1000.0, acceptance=0.5)
    d = Design(batch=4, chips=8, draft_tokens=2)
    # kernels in series (the calibrated profiles): reads, then the collectives
    serial = chip(scaleup_latency=1e-6, kernel_serialization=1.0)
    r = dcost.decode(d, serial, m, w)
    bare = float(draft_time(4.0, 1000.0, 2.0, 8.0, serial, m))
    assert bare == pytest.approx(2 * 2.5e-6, rel=1e-9)
    assert float(r.t_draft) == pytest.approx(bare + 2 * 28.28e-6, rel=1e-9)
    # pure physics overlaps them: each pass takes the longer, the collectives' 28.28 us
    r0 = dcost.decode(d, chip(scaleup_latency=1e-6), m, w)
    assert float(r0.t_draft) == pytest.approx(2 * 28.28e-6, rel=1e-9)
    # on one chip there is nothing to exchange: the draft costs its passes alone
    one = dcost.decode(Design(batch=4, chips=1, draft_tokens=2), serial, m, w)
    assert float(one.t_draft) == pytest.approx(float(draft_time(4.0, 1000.0, 2.0, 1.0, serial, m)))


@pytest.mark.parametrize("e", [16.0, 0.5])
def test_expert_parallel_outside_one_to_the_chips_is_refused(e):
    with pytest.raises(SpecError, match=r"Design\.expert_parallel"):
        Design(batch=8, chips=8, expert_parallel=e)


@pytest.mark.x64
@pytest.mark.parametrize("overlap", [0.0, 1.0])
def test_stage_time_smooth_tends_to_exact(overlap):
    pairs = ((2.0, 1.0), (0.5, 3.0), (1.0, 4.0))
    exact = float(stage_time(*pairs, 9.5, 0.0, overlap))
    errors = [abs(float(stage_time(*pairs, 9.5, s, overlap)) - exact) for s in (0.1, 0.03, 0.01)]
    assert errors[0] > 0
    assert all(b <= a for a, b in zip(errors, errors[1:], strict=False))
    assert errors[-1] < 1e-2 * exact


def test_serial_kernels_never_beat_the_whole_step_roofline():
    """A sum of per-kernel maxima is at least the maximum of the sums: the calibrated (series)
    step is never faster than v1's, at any batch and context, so pure physics stays a bound."""
    h1 = dcost.hardware("h100-sxm", kernel_serialization=1.0)
    h0 = dcost.hardware("h100-sxm")
    m = dcost.model("llama-3-70b")
    b = jnp.asarray([1.0, 8.0, 64.0, 512.0, 4096.0])
    for context in (0.0, 1000.0, 32000.0):
        d, w = Design(batch=b, chips=8), Workload(context)
        t1 = dcost.decode(d, h1, m, w).t_stage
        t0 = dcost.decode(d, h0, m, w).t_stage
        assert bool(jnp.all(t1 >= t0 * (1 - 1e-6)))


@pytest.mark.x64
@pytest.mark.parametrize(
    ("eta", "expected"), [(None, 9.8304e-3), (1.0, 9.8304e-3), (0.5, 11.4688e-3)]
)
def test_expert_flops_efficiency_by_hand(eta, expected):
    """8 experts of 1e8 parameters, 2 active, and 1e9 dense parameters; B = 4096 at context 0 on
    one chip (every expert touched, balanced). Compute: dense 2 * 1e9 * 4096 / 1e15 = 8.192 ms,
    experts 2 * 2e8 * 4096 / 1e15 = 1.6384 ms at eta_e = 1 (or off: v1), 3.2768 ms at 0.5."""
    m = dcost.Model(10, 1000, 1e9, 1e8, 8, 2, 1e5, 2.0)
    h = chip() if eta is None else chip(expert_flops_efficiency=eta)
    r = dcost.decode(Design(batch=4096, chips=1), h, m, Workload(0.0))
    assert float(r.t_compute) == pytest.approx(expected, rel=1e-12)
    # a dense model has no grouped matmuls: the field changes nothing
    d = dcost.decode(Design(batch=4096, chips=1), h, dense(), Workload(0.0))
    assert float(d.t_compute) == pytest.approx(2 * 1e9 * 4096 / 1e15, rel=1e-12)


@pytest.mark.parametrize("eta", [0.0, 1.5, -0.2])
def test_expert_flops_efficiency_outside_zero_one_is_refused(eta):
    with pytest.raises(SpecError, match=r"Hardware\.expert_flops_efficiency"):
        chip(expert_flops_efficiency=eta)
