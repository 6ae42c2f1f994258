"""A GEMM kernel's intercept, charged per dense GEMM a layer runs (docs/engines.md): the kernel
count from the architecture against hand counts, the step's term against a hand calculation, the
engine's field from its profile, and bad values refused naming the field."""

import pytest

import dcost
from dcost import Design, Workload
from dcost.calibrate import kernels
from dcost.presets import _gemm_kernels, model_card
from dcost.validation import silicon


def _chip(**kw):
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


def _dense(**kw):
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


def test_gemm_kernels_by_hand():
    """Counted from each config.json by hand. GQA attention: fused QKV and output (2); a dense
    MLP: fused gate-up and down (2); an MoE layer: router (1) and shared experts' two (2).
    MLA with a query latent: q_a, q_b, kv_a, two absorbed up-projections, output (6); DSA's
    indexer 3 more; a Gated DeltaNet layer 3 (in_proj_qkvz, in_proj_ba, out_proj)."""
    hand = {
        "llama-3-70b": 2 + 2,
        "mixtral-8x7b": 2 + 1,  # no shared expert
        "qwen3-235b-a22b": 2 + 1,
        # 61 layers, the first 3 dense, 1 shared expert
        "deepseek-v3": 6 + (3 * 2 + 58 * 3) / 61,
        # 61 layers, the first dense, 1 shared expert
        "kimi-k2": 6 + (1 * 2 + 60 * 3) / 61,
        # 60 layers, 45 Gated DeltaNet and 15 full attention; router and a shared expert each
        "qwen3.5-397b-a17b": (45 * 3 + 15 * 2) / 60 + 3,
    }
    for name, want in hand.items():
        assert float(dcost.model(name).gemms_per_layer) == pytest.approx(want, rel=1e-6), name
    a = model_card("glm-5")["arch"]
    layers, dense_layers = a["n_layers"], a.get("n_dense_layers", 0)
    glm = 6 + 3 + (dense_layers * 2 + (layers - dense_layers) * 3) / layers
    assert float(dcost.model("glm-5").gemms_per_layer) == pytest.approx(glm, rel=1e-6)
    # no query latent (DeepSeek-V2-Lite's form): the query's one projection
    assert _gemm_kernels(
        {"n_layers": 4, "attention": "mla", "q_lora_rank": 0, "n_heads": 2, "d_model": 8}, 0.0
    ) == pytest.approx(5 + 2)


@pytest.mark.x64
def test_gemm_overhead_by_hand():
    """Dense 1e9 bf16 on one chip per stage, P = 2, 4 GEMMs a layer, 3 us each: the step's fixed
    cost grows by 3e-6 * 4 * 10/2 = 60 us, to 1 ms + 1e-5 * 5 + 60 us = 1.11 ms; a chunked
    prefill on one stage of 4 chunks pays 4 * 3e-6 * 4 * 10 = 480 us."""
    base = _chip(step_overhead=1e-3, layer_overhead=1e-5)
    h = _chip(step_overhead=1e-3, layer_overhead=1e-5, gemm_overhead=3e-6)
    m, d = _dense(gemms_per_layer=4.0), Design(batch=1, stages=2)
    r = dcost.decode(d, h, m, Workload(0))
    assert float(r.t_overhead) == pytest.approx(1.11e-3, rel=1e-12)
    assert float(r.t_stage - dcost.decode(d, base, m, Workload(0)).t_stage) == pytest.approx(
        60e-6, rel=1e-9
    )
    # a model that states no kernel count pays nothing, and nor does a chip without the field
    assert float(dcost.decode(d, h, _dense(), Workload(0)).t_overhead) == pytest.approx(1.05e-3)
    wp, dp = Workload(0, prompt=4000), Design(batch=1, prefill_chunk=1000)
    gap = dcost.prefill(dp, h, m, wp).ttft - dcost.prefill(dp, base, m, wp).ttft
    assert float(gap) == pytest.approx(480e-6, rel=1e-9)


def test_engine_sets_gemm_overhead_from_share_and_precision():
    """``gemm_overhead`` is the profile's share times the GEMM intercept at the chip's matmul
    precision: fp8's and bf16's differ; without a share (or an intercept) the field stays off."""
    eng = dcost.engine("trtllm", hardware="h200")
    share = eng.profile["gemm_intercept_share"]
    assert 0.0 < share
    for p in ("bf16", "fp8"):
        chip = eng.apply(dcost.hardware("h200", precision=p))
        want = share * eng.precision_profile[p]["gemm_intercept"]
        assert float(chip.gemm_overhead) == pytest.approx(want, rel=1e-6)
    bf16, fp8 = (eng.precision_profile[p]["gemm_intercept"] for p in ("bf16", "fp8"))
    assert fp8 > 2 * bf16  # a block-scaled GEMM's prologue: the tables' own finding
    off = eng.with_profile(profile={"gemm_intercept_share": 0.0})
    assert off.apply(dcost.hardware("h200")).gemm_overhead is None
    # the precision's intercept read as the silicon predictions read it
    chip = dcost.hardware("h200", precision="fp8")
    assert silicon.gemm_intercept(eng, chip) == pytest.approx(fp8)
    assert silicon.gemm_intercept(None, chip) == 0.0


def test_bad_gemm_fields_are_refused_naming_them(tmp_path):
    with pytest.raises(dcost.SpecError, match="gemm_overhead"):
        _chip(gemm_overhead=-1e-6)
    with pytest.raises(dcost.SpecError, match="gemms_per_layer"):
        _dense(gemms_per_layer=float("nan"))
    eng = dcost.engine("sglang", hardware="h200")
    path = kernels.write_profile(eng, tmp_path / "mine.toml")
    text = path.read_text()
    assert "gemm_intercept_share = " in text
    path.write_text(text.replace("gemm_intercept_share = ", "gemm_intercept_share = -", 1))
    with pytest.raises(dcost.engines.EngineError, match="gemm_intercept_share"):
        dcost.engine("sglang", hardware="h200", profile=path)


@pytest.mark.x64
def test_a_draft_layer_pays_a_target_layers_gemms():
    """Two draft passes of one layer, 4 GEMMs of 3 us: 2 * 1 * (1e-5 + 4 * 3e-6) = 44 us of
    fixed cost, 24 us more than without the GEMM term."""
    from dcost.serving.speculative import draft_time

    m = _dense(draft_params=1e8, draft_layers=1.0, gemms_per_layer=4.0)
    base = _chip(layer_overhead=1e-5)
    h = _chip(layer_overhead=1e-5, gemm_overhead=3e-6)
    plain = float(draft_time(1.0, 0.0, 2.0, 1.0, _chip(), m))
    assert float(draft_time(1.0, 0.0, 2.0, 1.0, h, m)) == pytest.approx(plain + 44e-6, rel=1e-9)
    assert float(
        draft_time(1.0, 0.0, 2.0, 1.0, h, m) - draft_time(1.0, 0.0, 2.0, 1.0, base, m)
    ) == pytest.approx(24e-6, rel=1e-9)
