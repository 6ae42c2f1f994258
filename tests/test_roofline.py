"""The serving cost model against closed forms, hand calculations and finite differences.

Expected numbers are worked out by hand in the comments from round-number specs (a chip of
1 PFLOP/s and 1 TB/s, a 1 B-parameter model, $3.6 per chip-hour = $0.001 per chip-second), from the
datasheet figures of the H100 SXM (989.4 TFLOP/s dense BF16, 3.35 TB/s HBM3), or from the closed
forms of DESIGN.md section 2, never from the model's own output.
"""

import dataclasses
import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import dcost
from dcost import Design, Workload

# --------------------------------------------------------------------------------------- specs


def chip(**kw):
    """F = 1e15 FLOP/s, BW = 1e12 B/s (F/BW = 1000), U = 1e11, O = 1e10, S = 8, $3.6/h."""
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
    """N = 1e9, bf16 weights (b_w = 2), L = 10, d = 1000, b_kv = 1e5 B, a = 0."""
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


def moe(**kw):
    """N_dense = 1e9, n_e = 1e8, E = 64, k = 4: N_total = 7.4e9, N_active = 1.4e9; fp8 weights."""
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


H100_F, H100_BW = 989.4e12, 3.35e12  # NVIDIA H100 SXM datasheet: dense BF16, HBM3 bandwidth


def report_of(design, hardware, model, workload, smoothness=0.0):
    return dcost.decode(design, hardware, model, workload, smoothness)


def memory_time(r):
    return float(r.t_weights) + float(r.t_kv)


# ------------------------------------------------------------------------ balance batch B*

BALANCE_CASES = {
    # (hardware, model, context T)
    "dense T=0": lambda: (chip(), dense(), 0.0),
    "dense T>0, attention, efficiencies": lambda: (
        chip(flops_efficiency=0.6, bandwidth_efficiency=0.8),
        dense(kv_bytes_per_token=1e3, attn_flops_per_context_token=1e5),
        1000.0,
    ),
    "moe k=E (phi=1)": lambda: (chip(), moe(n_experts=4, experts_active=4), 0.0),
    "moe k=E, T>0": lambda: (
        chip(),
        moe(
            n_experts=4, experts_active=4, kv_bytes_per_token=1e3, attn_flops_per_context_token=1e5
        ),
        1000.0,
    ),
    "moe k<E, phi(B*)~1": lambda: (chip(), moe(), 0.0),
    "moe k<E, T>0": lambda: (
        chip(bandwidth_efficiency=0.7),
        moe(kv_bytes_per_token=1e3, attn_flops_per_context_token=1e5),
        1000.0,
    ),
    "llama-3-70b on h100, T=500": lambda: (
        dcost.hardware("h100-sxm"),
        dcost.model("llama-3-70b"),
        500.0,
    ),
}


@pytest.mark.x64
@pytest.mark.parametrize("case", BALANCE_CASES)
def test_balance_batch_equalizes_compute_and_memory(case):
    hw, m, t = BALANCE_CASES[case]()
    b_star = float(dcost.balance_batch(hw, m, t))
    assert 1.0 <= b_star < np.inf
    # The closed form assumes every expert is touched; check that premise at B* first.
    phi = float(dcost.expert_fraction(b_star, m.n_experts, m.experts_active))
    assert float(m.n_experts) == 0 or phi > 1 - 1e-12
    r = report_of(Design(batch=b_star), hw, m, Workload(t))
    assert float(r.t_compute) == pytest.approx(memory_time(r), rel=1e-9)
    # ... and it is where the numeric model changes regime.
    below = report_of(Design(batch=0.5 * b_star), hw, m, Workload(t))
    above = report_of(Design(batch=2.0 * b_star), hw, m, Workload(t))
    assert float(below.t_compute) < memory_time(below)
    assert float(above.t_compute) > memory_time(above)


@pytest.mark.x64
def test_balance_batch_h100_dense_bf16_is_flops_over_bandwidth():
    """Dense bf16 at T = 0: B* = (F/BW)(b_w/2) = 989.4e12 / 3.35e12 = 295.3."""
    b_star = float(dcost.balance_batch(dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")))
    assert b_star == pytest.approx(H100_F / H100_BW, rel=1e-9)
    assert 295 < b_star < 296


@pytest.mark.x64
@pytest.mark.parametrize(
    ("bytes_per_param", "dense_b", "moe_b"), [(2.0, 1000.0, 8000.0), (1.0, 500.0, 4000.0)]
)
def test_one_in_eight_sparsity_balances_eight_times_higher(bytes_per_param, dense_b, moe_b):
    """B* = (F/BW)(b_w/2)(N_total/N_active) at T = 0, with F/BW = 1000.

    MoE: N_dense = 2e9, n_e = 1e9, E = 62, k = 6, so N_total = 64e9 and N_active = 8e9 (1 in 8);
    the dense reference has the same 8e9 active parameters.
    """
    sparse = dcost.Model(10, 1000, 2e9, 1e9, 62, 6, 1e5, bytes_per_param)
    ref = dcost.Model(10, 1000, 8e9, 0.0, 0, 0, 1e5, bytes_per_param)
    b_sparse = float(dcost.balance_batch(chip(), sparse))
    b_dense = float(dcost.balance_batch(chip(), ref))
    assert b_dense == pytest.approx(dense_b, rel=1e-12)
    assert b_sparse == pytest.approx(moe_b, rel=1e-12)
    # The numeric model agrees: at B = 8000 (1 - 6/62)**8000 ~ 1e-354, every expert is read.
    r = report_of(Design(batch=moe_b), chip(), sparse, Workload(0))
    assert float(r.t_compute) == pytest.approx(float(r.t_weights), rel=1e-9)


@pytest.mark.x64
@pytest.mark.parametrize(
    "specs",
    [
        lambda: (chip(), dense()),
        lambda: (dcost.hardware("h100-sxm"), dcost.model("llama-3-8b")),
        lambda: (dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")),
    ],
    ids=["tiny", "llama-3-8b", "llama-3-70b"],
)
def test_cost_at_batch_one_over_cost_at_large_batch_is_balance_batch(specs):
    """Dense, G = P = 1, T = 0: per token, b_w N/BW at B = 1 against 2N/F once compute bound."""
    hw, m = specs()
    w = Workload(0)
    ratio = float(report_of(Design(batch=1), hw, m, w).cost_per_token) / float(
        report_of(Design(batch=1e7), hw, m, w).cost_per_token
    )
    assert ratio == pytest.approx(float(dcost.balance_batch(hw, m)), rel=1e-9)


def test_tiny_balance_batch_by_hand():
    assert float(dcost.balance_batch(chip(), dense())) == pytest.approx(1000.0, rel=1e-6)
    # N_total/N_active = 7.4/1.4 with b_w = 1: 1000 * 0.5 * 7.4/1.4
    assert float(dcost.balance_batch(chip(), moe())) == pytest.approx(500 * 7.4 / 1.4, rel=1e-6)


@pytest.mark.x64
def test_balance_batch_is_infinite_past_critical_context():
    hw, m = chip(), dense(kv_bytes_per_token=1e3, attn_flops_per_context_token=1e5)
    t_c = float(dcost.critical_context(hw, m))
    assert np.isfinite(float(dcost.balance_batch(hw, m, 0.999 * t_c)))
    assert float(dcost.balance_batch(hw, m, 1.001 * t_c)) == np.inf
    # The numeric model agrees: past T_c even a huge batch stays memory bound; before, it does not.
    past = report_of(Design(batch=1e9), hw, m, Workload(1.01 * t_c))
    before = report_of(Design(batch=1e9), hw, m, Workload(0.99 * t_c))
    assert memory_time(past) > float(past.t_compute)
    assert memory_time(before) < float(before.t_compute)


# ----------------------------------------------------------------------- critical context


@pytest.mark.x64
@pytest.mark.parametrize(("attn", "expected"), [(0.0, 200.0), (1e6, 2e21 / 9e18)])
def test_critical_context_by_hand(attn, expected):
    """T_c = 2 N BW / (b_kv F - a BW): 2e9*1e12 / (1e4*1e15 - a*1e12)."""
    m = dense(kv_bytes_per_token=1e4, attn_flops_per_context_token=attn)
    assert float(dcost.critical_context(chip(), m)) == pytest.approx(expected, rel=1e-12)


def _kv_and_compute(batch, hardware, model, workload):
    r = dcost.decode(Design(batch=batch), hardware, model, workload)
    return r.t_kv, r.t_compute


BATCH_SLOPES = jax.jit(jax.jacfwd(_kv_and_compute))


@pytest.mark.x64
@pytest.mark.parametrize(
    "specs",
    [
        lambda: (dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")),
        lambda: (
            chip(flops_efficiency=0.5, bandwidth_efficiency=0.9),
            moe(
                n_experts=8,
                experts_active=8,
                kv_bytes_per_token=1e4,
                attn_flops_per_context_token=1e6,
            ),
        ),
    ],
    ids=["llama-3-70b-h100", "moe-with-efficiencies"],
)
def test_critical_context_kv_slope_equals_compute_slope(specs):
    """At T_c one more sequence adds as much KV-read time as compute time (d/dB of each)."""
    hw, m = specs()
    t_c = float(dcost.critical_context(hw, m))
    assert 0 < t_c < np.inf
    kv_slope, compute_slope = BATCH_SLOPES(jnp.asarray(64.0), hw, m, Workload(t_c))
    assert float(kv_slope) == pytest.approx(float(compute_slope), rel=1e-9)


def test_critical_context_infinite_without_kv_cache():
    assert float(dcost.critical_context(chip(), dense(kv_bytes_per_token=0.0))) == np.inf


# ------------------------------------------------------------------------- batch 1, memory


@pytest.mark.x64
def test_batch_one_time_is_the_weight_read():
    # Tiny: 2 B * 1e9 / 1e12 B/s = 2 ms.
    assert float(report_of(Design(batch=1), chip(), dense(), Workload(0)).tpot) == pytest.approx(
        2e-3, rel=1e-12
    )
    # Llama 3 8B on one H100: b_w (N - N_emb) / BW, the untied input embedding (vocabulary
    # 128,256 x width 4,096) read by row only.
    m = dcost.model("llama-3-8b")
    assert float(m.params_embedding) == 128256 * 4096
    r = report_of(Design(batch=1), dcost.hardware("h100-sxm"), m, Workload(0))
    read = 2.0 * (float(m.params_total) - 128256 * 4096)
    assert float(r.tpot) == pytest.approx(read / H100_BW, rel=1e-12)
    # Llama 3 70B on 8 H100s: the weights split 8 ways; the all-reduces (~10 us) do not bind.
    m = dcost.model("llama-3-70b")
    r = report_of(Design(batch=1, chips=8), dcost.hardware("h100-sxm"), m, Workload(0))
    read = 2.0 * (float(m.params_total) - 128256 * 8192)
    assert float(r.tpot) == pytest.approx(read / (8 * H100_BW), rel=1e-12)
    assert 0 < float(r.t_comm) < 0.01 * float(r.tpot)


@pytest.mark.x64
@pytest.mark.parametrize(
    ("batch", "weight_bytes"),
    [
        (1, 1e9 + 4 * 1e8),  # k of E experts: N_dense + k n_e
        (2, 1e9 + 64e8 * (1 - (60 / 64) ** 2)),  # phi(2) = 1 - (15/16)^2 = 0.12109375
        (1e6, 7.4e9),  # every expert
    ],
)
def test_moe_reads_only_the_experts_a_batch_touches(batch, weight_bytes):
    r = report_of(Design(batch=batch), chip(), moe(), Workload(0))
    assert float(r.t_weights) == pytest.approx(weight_bytes / 1e12, rel=1e-12)
    if batch == 1:
        assert float(r.tpot) == pytest.approx(1.4e-3, rel=1e-12)


@pytest.mark.x64
@pytest.mark.parametrize(("n_experts", "k", "batch"), [(4, 2, 2), (4, 1, 3), (6, 3, 3), (5, 5, 2)])
def test_expert_fraction_against_exhaustive_enumeration(n_experts, k, batch):
    """phi(B) is the expected share of experts hit when B tokens each pick k of E uniformly."""
    choices = list(itertools.combinations(range(n_experts), k))
    hits = [len(set().union(*picks)) for picks in itertools.product(choices, repeat=batch)]
    expected = np.mean(hits) / n_experts
    assert float(dcost.expert_fraction(batch, n_experts, k)) == pytest.approx(expected, rel=1e-12)
    assert float(dcost.expert_fraction(batch, 0.0, 0.0)) == 0.0


@pytest.mark.x64
@pytest.mark.parametrize(("chips", "stages"), [(1, 1), (2, 1), (1, 4), (2, 4), (4, 2)])
def test_memory_per_chip(chips, stages):
    """b_w N_total/(P G) + B T b_kv / G: 7.4e9/(P G) B of fp8 weights and 32*1000*1e5/G B of KV."""
    m, w, d = moe(), Workload(1000), Design(batch=32, chips=chips, stages=stages)
    mem = float(report_of(d, chip(), m, w).memory_per_chip)
    mem_no_kv = float(report_of(d, chip(), m, Workload(0)).memory_per_chip)
    assert mem_no_kv == pytest.approx(7.4e9 / (chips * stages), rel=1e-12)
    assert mem - mem_no_kv == pytest.approx(3.2e9 / chips, rel=1e-12)
    # KV per chip is the same however many stages there are.
    one_stage = float(report_of(Design(batch=32, chips=chips), chip(), m, w).memory_per_chip)
    assert mem - mem_no_kv == pytest.approx(one_stage - 7.4e9 / chips, rel=1e-12)


# -------------------------------------------------------------------------------- prefill


@pytest.mark.x64
def test_prefill_by_hand_single_chip():
    """B = 2 prompts of 1000 tokens, a = 1e4:
    compute 2000*(2e9 + 1e4*500)/1e15 = 4.01 ms; weights 2e9/1e12 = 2 ms; KV 2000*1e5/1e12 = 0.2 ms.
    """
    r = dcost.prefill(
        Design(batch=2), chip(), dense(attn_flops_per_context_token=1e4), Workload(0, prompt=1000)
    )
    expected = dict(
        t_compute=4.01e-3,
        t_weights=2e-3,
        t_kv=2e-4,
        t_comm=0.0,
        t_stage=4.01e-3,
        ttft=4.01e-3,
        tokens_per_s=2000 / 4.01e-3,
        cost_per_token=1e-3 * 4.01e-3 / 2000,
        memory_per_chip=2e9 + 2e8,
        mfu=2e9 * (2000 / 4.01e-3) / 1e15,
    )
    for name, value in expected.items():
        assert float(getattr(r, name)) == pytest.approx(value, rel=1e-12, abs=1e-30), name


@pytest.mark.x64
def test_prefill_by_hand_tensor_and_pipeline_parallel():
    """The same prefill on P = 2 stages of G = 2 chips (4 chips, one NVLink domain of 8):
    compute 4.01e12/4e15 = 1.0025 ms; weights 2e9/4e12 = 0.5 ms; KV 2e8/4e12 = 0.05 ms;
    all-reduces (10/2 layers)*2*(2*1/2)*(2000*1000*2 B)/1e11 = 0.4 ms; hop 4e6/(2*1e11) = 20 us;
    ttft = 2*1.0025 ms + 20 us = 2.025 ms; cost 4 chips * $0.001/s * 2.025e-3 s / 4000 tokens.
    """
    r = dcost.prefill(
        Design(batch=2, chips=2, stages=2),
        chip(),
        dense(attn_flops_per_context_token=1e4),
        Workload(0, prompt=1000),
    )
    expected = dict(
        t_compute=1.0025e-3,
        t_weights=5e-4,
        t_kv=5e-5,
        t_comm=4e-4,
        t_hop=2e-5,
        t_stage=1.0025e-3,
        ttft=2.025e-3,
        tokens_per_s=4000 / 2.025e-3,
        cost_per_token=4e-3 * 2.025e-3 / 4000,
        memory_per_chip=5e8 + 1e8,
    )
    for name, value in expected.items():
        assert float(getattr(r, name)) == pytest.approx(value, rel=1e-12), name
    assert not hasattr(r, "tpot")  # a prefill has no time per output token


@pytest.mark.x64
def test_prefill_reads_every_expert():
    """Even one token of prefill reads all 7.4e9 fp8 expert and dense weights (phi = 1)."""
    r = dcost.prefill(Design(batch=1), chip(), moe(), Workload(0, prompt=1))
    assert float(r.t_weights) == pytest.approx(7.4e9 / 1e12, rel=1e-12)


# -------------------------------------------------------------------------- communication


def comm_moe(**kw):
    """L = L_moe = 2, d = 1000, b_a = 2, k = 2 of E = 8, tiny weights so communication binds."""
    base = dict(
        n_layers=2,
        d_model=1000,
        params_dense=1e6,
        params_per_expert=1e6,
        n_experts=8,
        experts_active=2,
        kv_bytes_per_token=0.0,
        bytes_per_param=2.0,
    )
    return dcost.Model(**{**base, **kw})


# B = 16 tokens, 2 k d b_a = 8000 B per token and MoE layer. Per chip with G = 4:
# 16*2*8000*(3/4)/4 = 48000 B; with G = 16: 16*2*8000*(15/16)/16 = 15000 B.
ALL_TO_ALL = [
    # (id, chips G, stages P, S, U, O, n_moe_layers, expected seconds)
    ("one domain", 4, 1, 8, 1e9, 1e8, None, 48000 / 1e9),
    ("G = S", 4, 1, 4, 1e9, 1e8, None, 48000 / 1e9),
    ("all spill (S = 1)", 4, 1, 1, 1e9, 1e8, None, 48000 / 1e8),
    # G = 16 > S = 4: 3 of 15 peers inside: 3000 B over U, 12000 B over O, both at once.
    ("partial, scale-out binds", 16, 1, 4, 1e9, 1e8, None, max(3000 / 1e9, 12000 / 1e8)),
    ("partial, scale-up binds", 16, 1, 4, 1e7, 1e8, None, max(3000 / 1e7, 12000 / 1e8)),
    ("two stages: half the layers", 4, 2, 8, 1e9, 1e8, None, 24000 / 1e9),
    ("one MoE layer of two", 4, 1, 8, 1e9, 1e8, 1, 24000 / 1e9),
    ("one chip: no traffic", 1, 1, 8, 1e9, 1e8, None, 0.0),
]


@pytest.mark.x64
@pytest.mark.parametrize(
    ("chips", "stages", "s", "u", "o", "moe_layers", "expected"),
    [c[1:] for c in ALL_TO_ALL],
    ids=[c[0] for c in ALL_TO_ALL],
)
def test_all_to_all_by_hand(chips, stages, s, u, o, moe_layers, expected):
    hw = chip(scaleup_size=s, scaleup_bandwidth=u, scaleout_bandwidth=o)
    r = report_of(
        Design(batch=16, chips=chips, stages=stages),
        hw,
        comm_moe(n_moe_layers=moe_layers),
        Workload(0),
    )
    assert float(r.t_comm) == pytest.approx(expected, rel=1e-12, abs=0.0)


@pytest.mark.x64
def test_all_to_all_binds_the_step():
    """All spilling at G = 4: 0.48 ms of all-to-all against < 5 us of weights and compute."""
    hw = chip(scaleup_size=1, scaleup_bandwidth=1e9, scaleout_bandwidth=1e8)
    r = report_of(Design(batch=16, chips=4), hw, comm_moe(), Workload(0))
    assert float(r.t_stage) == pytest.approx(4.8e-4, rel=1e-12)
    assert float(r.tpot) == pytest.approx(4.8e-4, rel=1e-12)
    assert str(dcost.bottleneck(r)) == "comm"


# Dense, L = 4, d = 1000, b_a = 2, B = 8, P = 2: (4/2 layers) * 2 all-reduces * 2(G-1)/G
# * 8*1000*2 B per link. G = 4: 2*2*1.5*16000 = 96000 B; G = 8: 2*2*1.75*16000 = 112000 B.
TENSOR_PARALLEL = [
    ("inside a domain", 4, 8, 96000 / 1e9),
    ("G = S uses scale-up", 8, 8, 112000 / 1e9),
    ("across domains uses scale-out", 4, 2, 96000 / 1e8),
    ("one chip", 1, 8, 0.0),
]


@pytest.mark.x64
@pytest.mark.parametrize(
    ("chips", "s", "expected"),
    [c[1:] for c in TENSOR_PARALLEL],
    ids=[c[0] for c in TENSOR_PARALLEL],
)
def test_tensor_parallel_by_hand(chips, s, expected):
    hw = chip(scaleup_size=s, scaleup_bandwidth=1e9, scaleout_bandwidth=1e8)
    r = report_of(Design(batch=8, chips=chips, stages=2), hw, dense(n_layers=4), Workload(0))
    assert float(r.t_comm) == pytest.approx(expected, rel=1e-12, abs=0.0)


@pytest.mark.x64
@pytest.mark.parametrize(
    ("s", "hop"),
    [(8, 8 * 1000 * 2 / 1e11), (2, 8 * 1000 * 2 / 1e10)],
    ids=["4 chips in a domain of 8", "4 chips over domains of 2"],
)
def test_pipeline_latency_by_hand(s, hop):
    """P = 4 stages of one chip, B = 8, T = 0: t_stage = 2e9 B/(4 * 1e12 B/s) = 0.5 ms (compute
    8*2e9/4e15 = 4 us); hop = 8*1000*2 B over U (all 4 chips in one domain) or O;
    tpot = 4*t_stage + 3*hop, 4*8 tokens in flight, cost = 4 chips * $0.001/s * tpot / 32."""
    r = report_of(Design(batch=8, stages=4), chip(scaleup_size=s), dense(), Workload(0))
    tpot = 4 * 5e-4 + 3 * hop
    assert float(r.t_stage) == pytest.approx(5e-4, rel=1e-12)
    assert float(r.t_hop) == pytest.approx(hop, rel=1e-12)
    assert float(r.tpot) == pytest.approx(tpot, rel=1e-12)
    assert float(r.tokens_per_s) == pytest.approx(32 / tpot, rel=1e-12)
    assert float(r.cost_per_token) == pytest.approx(4e-3 * tpot / 32, rel=1e-12)


# ----------------------------------------------------------------------------- mfu and cost

MFU_COST = [
    # (id, batch, flops_efficiency, step seconds, mfu, $ per token)
    # B = 2000 > B* = 1000: compute 2000*2e9/1e15 = 4 ms, 5e5 tokens/s, mfu 1, $1e-3/5e5.
    ("compute bound", 2000, 1.0, 4e-3, 1.0, 2e-9),
    # B = 500: weights 2e9/1e12 = 2 ms, 2.5e5 tokens/s, mfu 0.5, $1e-3/2.5e5.
    ("memory bound", 500, 1.0, 2e-3, 0.5, 4e-9),
    # eta_F = 0.5, B = 4000: compute 4000*2e9/5e14 = 16 ms, 2.5e5 tokens/s, mfu = eta_F.
    ("compute bound at half efficiency", 4000, 0.5, 16e-3, 0.5, 4e-9),
]


@pytest.mark.x64
@pytest.mark.parametrize(
    ("batch", "eta", "step", "mfu", "cost"), [c[1:] for c in MFU_COST], ids=[c[0] for c in MFU_COST]
)
def test_mfu_and_cost_by_hand(batch, eta, step, mfu, cost):
    r = report_of(Design(batch=batch), chip(flops_efficiency=eta), dense(), Workload(0))
    assert float(r.tpot) == pytest.approx(step, rel=1e-12)
    assert float(r.tokens_per_s) == pytest.approx(batch / step, rel=1e-12)
    assert float(r.mfu) == pytest.approx(mfu, rel=1e-12)
    assert float(r.cost_per_token) == pytest.approx(cost, rel=1e-12)


@pytest.mark.x64
@pytest.mark.parametrize("s", [0.02, 0.1, 0.5])
def test_smooth_step_brackets_the_exact_one(s):
    """max <= smax <= 3**s max over the three terms of a step, so tpot and cost follow."""
    specs = (chip(scaleout_bandwidth=1e8), moe(), Workload(2000))
    for d in [Design(batch=1), Design(batch=700, chips=16), Design(batch=64, chips=4, stages=2)]:
        exact, smooth = report_of(d, *specs), report_of(d, *specs, smoothness=s)
        assert float(exact.t_stage) <= float(smooth.t_stage) * (1 + 1e-12)
        assert float(smooth.t_stage) <= 3**s * float(exact.t_stage) * (1 + 1e-12)
        assert float(smooth.cost_per_token) >= float(exact.cost_per_token) * (1 - 1e-12)
        # and it is the p-norm of DESIGN.md with p = 1/s, by hand from the step's own terms
        terms = np.asarray([float(smooth.t_compute), memory_time(smooth), float(smooth.t_comm)])
        assert float(smooth.t_stage) == pytest.approx(np.sum(terms ** (1 / s)) ** s, rel=1e-9)


# ----------------------------------------------------------- gradients vs finite differences


def _cost(design, hardware, model, workload, smoothness):
    return dcost.decode(design, hardware, model, workload, smoothness).cost_per_token


COST = jax.jit(_cost)
GRAD = jax.jit(jax.grad(_cost, argnums=(0, 1, 2, 3)))

# Points away from every kink of the exact model: one term of max(compute, memory, comm) leads by
# a wide margin (checked), k < E, G != S and P*G != S. Hand estimates of the leading term:
GRADIENT_CASES = {
    # memory 0.46 ms vs compute 4 us and all-to-all 1.4 us; phi(16) = 0.64; hop over scale-out.
    "moe memory bound, pipelined": lambda: (
        Design(batch=16, chips=4, stages=3),
        chip(),
        moe(n_moe_layers=9, kv_bytes_per_token=1e4, attn_flops_per_context_token=1e5),
        Workload(2000, prompt=1500, output=500),
    ),
    # all-to-all out of the domain 3.2 ms vs weights 0.46 ms.
    "moe all-to-all bound, spilling": lambda: (
        Design(batch=64, chips=16),
        chip(scaleout_bandwidth=1e8),
        moe(kv_bytes_per_token=1e4, n_moe_layers=10),
        Workload(100, prompt=80, output=40),
    ),
    # compute 2.1 ms vs memory 0.81 ms and all-reduces 0.82 ms.
    "dense compute bound, TP and pipeline": lambda: (
        Design(batch=4096, chips=2, stages=2),
        chip(),
        dense(kv_bytes_per_token=1e3, attn_flops_per_context_token=1e5, n_moe_layers=0),
        Workload(300, prompt=200, output=200),
    ),
    # all-reduces over scale-out 19 ms vs weights 0.13 ms.
    "dense all-reduce bound across domains": lambda: (
        Design(batch=256, chips=16),
        chip(scaleout_bandwidth=1e9),
        dense(kv_bytes_per_token=1e3, n_moe_layers=0),
        Workload(100, prompt=100, output=10),
    ),
    # the design sets E = 32 (and an unused over-training ratio): memory 1.4 ms vs compute 0.18 ms.
    "moe with design experts": lambda: (
        Design(batch=256, chips=2, stages=2, experts=32, overtrain=2.0),
        chip(),
        moe(kv_bytes_per_token=1e4, attn_flops_per_context_token=1e5, n_moe_layers=10),
        Workload(500),
    ),
}


def _leading_margin(report):
    terms = sorted([float(report.t_compute), memory_time(report), float(report.t_comm)])
    return terms[-1] / terms[-2]


@pytest.mark.x64
@pytest.mark.parametrize("smoothness", [0.0, 0.1])
@pytest.mark.parametrize("case", GRADIENT_CASES)
def test_gradient_of_cost_matches_central_differences(case, smoothness):
    """d log(cost)/d log(field) by autodiff vs central differences, for every float field of the
    design, hardware, model and workload (zero-valued fields: only finiteness)."""
    specs = GRADIENT_CASES[case]()
    assert _leading_margin(report_of(*specs)) > 1.5
    f0 = float(COST(*specs, smoothness))
    grads = GRAD(*specs, smoothness)
    failures, checked = [], 0
    for i, spec in enumerate(specs):
        for field in dataclasses.fields(spec):
            x0 = getattr(spec, field.name)
            if x0 is None:
                continue
            x0 = float(x0)
            g = float(getattr(grads[i], field.name))
            assert np.isfinite(g), f"{type(spec).__name__}.{field.name}"
            if x0 == 0.0:
                continue
            h = 1e-6 * abs(x0)

            def at(x, i=i, spec=spec, name=field.name):
                moved = eqx.tree_at(lambda t: getattr(t, name), spec, jnp.asarray(x, jnp.float64))
                return float(COST(*specs[:i], moved, *specs[i + 1 :], smoothness))

            fd = (at(x0 + h) - at(x0 - h)) / (2 * h)
            e_ad, e_fd = g * x0 / f0, fd * x0 / f0
            checked += 1
            if abs(e_ad - e_fd) > 1e-6 * (1 + abs(e_fd)):
                failures.append(
                    f"{type(spec).__name__}.{field.name}: autodiff elasticity "
                    f"{e_ad:.9g}, central difference {e_fd:.9g}"
                )
    assert not failures, "\n".join(failures)
    assert checked >= 20


@pytest.mark.x64
def test_elasticities_by_hand():
    """cost is proportional to price; compute bound at G = P = 1 it is proportional to 1/(F eta_F),
    memory bound to 1/(BW eta_BW)."""
    compute_bound = (Design(batch=4096), chip(), dense(n_moe_layers=0), Workload(0))
    memory_bound = (Design(batch=8), chip(), dense(n_moe_layers=0), Workload(100))
    g = GRAD(*compute_bound, 0.0)[1]
    f0 = float(COST(*compute_bound, 0.0))
    assert float(g.price_per_hour) * 3.6 / f0 == pytest.approx(1.0, rel=1e-12)
    assert float(g.flops) * 1e15 / f0 == pytest.approx(-1.0, rel=1e-12)
    assert float(g.flops_efficiency) * 1.0 / f0 == pytest.approx(-1.0, rel=1e-12)
    assert float(g.hbm_bandwidth) == 0.0
    g = GRAD(*memory_bound, 0.0)[1]
    f0 = float(COST(*memory_bound, 0.0))
    assert float(g.hbm_bandwidth) * 1e12 / f0 == pytest.approx(-1.0, rel=1e-12)
    assert float(g.bandwidth_efficiency) * 1.0 / f0 == pytest.approx(-1.0, rel=1e-12)
    assert float(g.flops) == 0.0


# --------------------------------------------------------- properties over a drawn range


def _range_model(is_moe):
    """Llama-3-70B-like dense or DeepSeek-V3-like MoE, round numbers; n_moe_layers given in both so
    one compiled function serves both."""
    if is_moe:
        return dcost.Model(
            61,
            7168,
            1.5e10,
            2.6e9,
            256,
            8,
            7e4,
            1.0,
            attn_flops_per_context_token=1.7e7,
            n_moe_layers=58,
        )
    return dcost.Model(
        80, 8192, 7e10, 0.0, 0, 0, 3.3e5, 2.0, attn_flops_per_context_token=2.6e6, n_moe_layers=0
    )


COST_AND_GRAD = jax.jit(jax.value_and_grad(_cost, argnums=(0, 1, 2, 3)))

drawn_design = dict(
    batch=st.floats(0.0, 5.0).map(lambda e: 10.0**e),
    context=st.one_of(st.just(0.0), st.floats(0.0, 6.0).map(lambda e: 10.0**e)),
    is_moe=st.booleans(),
    chips=st.integers(1, 144),
    stages=st.integers(1, 16),
    smoothness=st.sampled_from([0.0, 0.02, 0.3]),
)


@given(**drawn_design)
def test_every_gradient_finite_over_the_range(batch, context, is_moe, chips, stages, smoothness):
    """Batch 1 to 1e5, context 0 to 1e6, dense and MoE, 1 to 144 chips, 1 to 16 stages (float32)."""
    specs = (
        Design(batch=batch, chips=chips, stages=stages),
        dcost.hardware("h100-sxm"),
        _range_model(is_moe),
        Workload(context),
    )
    value, grads = COST_AND_GRAD(*specs, smoothness)
    assert np.isfinite(float(value)) and float(value) > 0
    for leaf in jax.tree_util.tree_leaves(grads):
        assert np.isfinite(float(leaf))


SWEEP = jax.jit(jax.vmap(dcost.decode, in_axes=(0, None, None, None)))


@given(
    context=drawn_design["context"],
    is_moe=st.booleans(),
    chips=st.integers(1, 144),
    stages=st.integers(1, 16),
)
def test_cost_per_token_never_rises_with_batch(context, is_moe, chips, stages):
    """Weights are shared by the batch, everything else grows with it: cost/token is non-increasing,
    tokens/s non-decreasing."""
    batch = jnp.logspace(0, 5, 64)
    designs = Design(batch=batch, chips=jnp.full(64, chips), stages=jnp.full(64, stages))
    r = SWEEP(designs, dcost.hardware("h100-sxm"), _range_model(is_moe), Workload(context))
    cost, rate = np.asarray(r.cost_per_token), np.asarray(r.tokens_per_s)
    assert np.all(cost[1:] <= cost[:-1] * (1 + 1e-5))
    assert np.all(rate[1:] >= rate[:-1] * (1 - 1e-5))


CONTEXT_SWEEP = jax.jit(jax.vmap(dcost.decode, in_axes=(None, None, None, 0)))


@pytest.mark.x64
@given(batch=drawn_design["batch"], is_moe=st.booleans(), chips=st.integers(1, 144))
def test_step_time_grows_with_context_and_kv_memory_is_linear(batch, is_moe, chips):
    contexts = jnp.asarray([0.0, 1e3, 2e3, 4e3, 1e5, 1e6])
    m = _range_model(is_moe)
    r = CONTEXT_SWEEP(
        Design(batch=batch, chips=chips),
        dcost.hardware("h100-sxm"),
        m,
        Workload(contexts, prompt=contexts, output=jnp.zeros(6)),
    )
    assert np.all(np.diff(np.asarray(r.tpot)) >= 0)
    kv = np.asarray(r.memory_per_chip) - float(r.memory_per_chip[0])
    expected = np.asarray(contexts) * batch * float(m.kv_bytes_per_token) / chips
    np.testing.assert_allclose(kv, expected, rtol=1e-9)


# ------------------------------------------------------------------------- vmap and jit


@pytest.mark.x64
def test_vmap_over_designs_equals_one_by_one():
    batch, chips, stages = [1.0, 64.0, 4096.0, 300.0], [1.0, 8.0, 16.0, 4.0], [1.0, 2.0, 4.0, 3.0]
    hw, m, w = dcost.hardware("h100-sxm"), moe(), Workload(3000)
    swept = jax.jit(jax.vmap(dcost.decode, in_axes=(0, None, None, None, None)))(
        Design(batch=jnp.asarray(batch), chips=jnp.asarray(chips), stages=jnp.asarray(stages)),
        hw,
        m,
        w,
        0.05,
    )
    for j in range(len(batch)):
        one = dcost.decode(Design(batch=batch[j], chips=chips[j], stages=stages[j]), hw, m, w, 0.05)
        for name in [f.name for f in dataclasses.fields(one)]:
            assert float(getattr(swept, name)[j]) == pytest.approx(
                float(getattr(one, name)), rel=1e-12, abs=1e-300
            ), name


@pytest.mark.x64
def test_vmap_over_hardware_scenarios():
    """A batch of chips (array fields) is one call, and equals the chips one by one."""
    bws = [1e12, 2e12, 3.35e12]
    scenarios = jax.tree_util.tree_map(
        lambda x: jnp.broadcast_to(x, (3,)), chip(hbm_bandwidth=jnp.asarray(bws))
    )
    swept = jax.jit(jax.vmap(dcost.decode, in_axes=(None, 0, None, None)))(
        Design(batch=8), scenarios, dense(), Workload(500)
    )
    for j, bw in enumerate(bws):
        one = dcost.decode(Design(batch=8), chip(hbm_bandwidth=bw), dense(), Workload(500))
        assert float(swept.cost_per_token[j]) == pytest.approx(float(one.cost_per_token), rel=1e-12)


def test_jitted_decode_does_not_recompile():
    traces = []

    @jax.jit
    def step(design, hardware, model, workload):
        traces.append(None)
        return dcost.decode(design, hardware, model, workload)

    hw, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-8b")
    calls = [
        (Design(batch=1), Workload(0)),
        (Design(batch=64, chips=8), Workload(4096)),
        (Design(batch=64.0, chips=2.0, stages=4.0), Workload(100.5, prompt=10)),
        (Design(batch=np.float32(3)), Workload(np.int64(7))),
    ]
    for d, w in calls:
        step(d, hw, m, w)
    assert len(traces) == 1
    assert step._cache_size() == 1


# --------------------------------------------------------------------- valid edge inputs

EDGE_CASES = {
    "dense, one chip, T=0, B=1": lambda: (Design(batch=1), chip(), dense(), Workload(0, prompt=1)),
    "dense, TP and pipeline": lambda: (
        Design(batch=3, chips=8, stages=2),
        chip(),
        dense(),
        Workload(10),
    ),
    "moe k=E": lambda: (
        Design(batch=5, chips=4),
        chip(),
        moe(n_experts=4, experts_active=4),
        Workload(0, prompt=1),
    ),
    "moe k=E via design": lambda: (
        Design(batch=5, chips=2, experts=4),
        chip(),
        moe(),
        Workload(100),
    ),
    "moe spilling, one stage per chip": lambda: (
        Design(batch=1, chips=144, stages=16),
        chip(scaleup_size=1),
        moe(),
        Workload(0, prompt=1),
    ),
    "no KV cache, no attention": lambda: (
        Design(batch=100),
        chip(),
        dense(kv_bytes_per_token=0.0),
        Workload(1e6),
    ),
    "free hardware": lambda: (Design(batch=10), chip(price_per_hour=0.0), moe(), Workload(10)),
    # n_moe_layers=None (its meaning for a dense model) gives the hand-built models' structure.
    "huge batch and context": lambda: (
        Design(batch=1e5, chips=72),
        dcost.hardware("h100-sxm"),
        dcost.model("llama-3-70b", n_moe_layers=None),
        Workload(1e6),
    ),
}


def _report_and_grads(fn):
    def cost(design, hardware, model, workload, smoothness):
        report = fn(design, hardware, model, workload, smoothness)
        return report.cost_per_token, report

    return jax.jit(jax.grad(cost, argnums=(0, 1, 2, 3), has_aux=True))


REPORT_AND_GRADS = {
    "decode": _report_and_grads(dcost.decode),
    "prefill": _report_and_grads(dcost.prefill),
}


@pytest.mark.parametrize("fn", ["decode", "prefill"])
@pytest.mark.parametrize("case", EDGE_CASES)
def test_no_nan_for_valid_input(case, fn):
    specs = EDGE_CASES[case]()
    for smoothness in [0.0, 0.1]:
        grads, report = REPORT_AND_GRADS[fn](*specs, smoothness)
        for leaf in jax.tree_util.tree_leaves(report):
            assert np.all(np.isfinite(np.asarray(leaf))), report
        for leaf in jax.tree_util.tree_leaves(grads):
            assert np.isfinite(float(leaf))


@pytest.mark.parametrize("model", ["gpt-oss-120b", "llama-3-70b", "qwen3-14b", "deepseek-v3"])
def test_pure_physics_mfu_is_at_most_one(model):
    """MFU counts the FLOPs of the parameters a token multiplies by, the step's own FLOPs: on
    pure physics (every rate at its peak) no step exceeds the chip's peak. Counting the input
    embedding too (before 2026-12-01) put a prefill of gpt-oss-120b, whose embedding is 11 % of
    its active parameters, at 110 %. A mixed step counts its prompt tokens: above the decode
    step's MFU at the same batch."""
    h, m = dcost.presets.pair("h100-sxm", model)
    w = dcost.Workload(4096, prompt=4096, output=256)
    for batch in (1.0, 64.0, 512.0):
        d = dcost.Design(batch=batch, chips=8)
        reports = {
            "decode": dcost.decode(d, h, m, w),
            "prefill": dcost.prefill(d, h, m, w),
            "mixed": dcost.mixed_step(
                dcost.Design(batch=batch, chips=8, prefill_chunk=2048), h, m, w
            ),
        }
        for kind, r in reports.items():
            assert 0.0 < float(r.mfu) <= 1.0, (kind, batch, float(r.mfu))
        assert float(reports["mixed"].mfu) > float(reports["decode"].mfu)
    flops = 2.0 * float(m.params_active_multiplied) * float(reports["prefill"].tokens_per_s)
    assert float(reports["prefill"].mfu) == pytest.approx(flops / (8 * float(h.flops)), rel=1e-6)
