"""experiments/speculative.py: its breakeven acceptance against the memory-bound closed form,
written here from the presets' fields, and its compute-bound limit."""

import pathlib
import sys

import numpy as np
import pytest

import dcost
from dcost.presets import pair

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import speculative  # noqa: E402


@pytest.fixture(scope="module")
def res():
    return speculative.compute(n_batches=40)


def phi(b, e, k):
    return 1.0 - (1.0 - k / e) ** b


def test_breakeven_is_the_memory_bound_closed_form(res):
    """Where both steps are memory bound, a* = t_1/t_0 - 1 with
    t_0 = [b_w (N_dense - N_emb + E n_e phi(B)) + B T b_kv] / (G BW) (N_emb the input
    embedding's 129,280 x 7,168 lookup table, read by row only),
    t_1 = t_0 with phi(2B), plus the MTP pass
    [b_w (N_d + (N_d,tot - N_d) phi(B)) + B T b_kv,d] / (G BW)."""
    s = res["setups"][0]  # 8 x H200, T = 4096, k = 1
    h, m = pair(s["hardware"], "deepseek-r1")
    g, t = s["chips"], s["context"]
    bw = float(h.hbm_bandwidth) * g
    e, k, ne = float(m.n_experts), float(m.experts_active), float(m.params_per_expert)
    nd, bw_ = float(m.params_dense) - 129_280 * 7168, float(m.bytes_per_param)
    checked = 0
    for i, b in enumerate(s["batch"]):
        t0 = (bw_ * (nd + e * ne * phi(b, e, k)) + b * t * float(m.kv_bytes_per_token)) / bw
        t1 = (bw_ * (nd + e * ne * phi(2 * b, e, k)) + b * t * float(m.kv_bytes_per_token)) / bw
        draft = float(m.draft_params) + (float(m.draft_total) - float(m.draft_params)) * phi(
            b, e, k
        )
        t1 += (bw_ * draft + b * t * float(m.draft_kv_bytes_per_token)) / bw
        flops = 2 * b * (2 * float(m.params_active) + float(m.attn_flops_per_context_token) * t)
        if flops / (g * float(h.flops)) > 0.5 * t0:  # not clearly memory bound: skip
            continue
        assert s["breakeven"][i] == pytest.approx(t1 / t0 - 1.0, rel=1e-4)
        checked += 1
    assert checked >= 20
    # a fine-grained MoE: at batch 1 the second token touches 8 more experts a layer
    assert 0.5 < s["breakeven_batch1"] < 0.65
    assert s["min_breakeven"] < 0.03


def test_compute_bound_speculation_never_pays(res):
    """T = 1024 on 8 x H200: past the batch where the verify pass is compute bound the step ratio
    exceeds k + 1 = 2 >= tau for any acceptance, so the breakeven is undefined (NaN)."""
    s = res["setups"][1]
    assert np.isnan(s["breakeven"][-1])
    assert s["ratio"][-1] > 2.0
    assert str(s["bound_spec"][-1]) == "compute"
    assert s["max_batch_paying_at_085"] < s["batch"][-1]


def test_speedup_at_deepseeks_acceptance_is_its_reported_one(res):
    """DeepSeek-V3 report section 5.4.3: 85-90 % acceptance, 1.8x TPS. The memory-bound plateau
    at a = 0.85 is tau = 1.85 less the MTP module's reads: 1.8x."""
    s = res["setups"][0]
    assert s["speedup_at_085"]["best"] == pytest.approx(1.8, abs=0.05)
    assert float(dcost.accepted_tokens(0.85, 1.0)) == pytest.approx(1.85)
