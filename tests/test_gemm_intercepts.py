"""A GEMM kernel's intercept, charged per dense GEMM a layer runs (docs/engines.md): the kernel
count from the architecture against hand counts, the engine's field from its profile, and bad
values refused naming the field (the step's term by hand: ``tests/test_serving_v2.py``)."""

import pytest

import dcost
from dcost.calibrate import kernels
from dcost.presets import _gemm_kernels, model_card
from dcost.validation import silicon


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
        dcost.Hardware(1e15, 1e12, 1e11, 1e11, 1e10, 8, 3.6, gemm_overhead=-1e-6)
    with pytest.raises(dcost.SpecError, match="gemms_per_layer"):
        dcost.model("llama-3-8b", gemms_per_layer=float("nan"))
    eng = dcost.engine("sglang", hardware="h200")
    path = kernels.write_profile(eng, tmp_path / "mine.toml")
    text = path.read_text()
    assert "gemm_intercept_share = " in text
    path.write_text(text.replace("gemm_intercept_share = ", "gemm_intercept_share = -", 1))
    with pytest.raises(dcost.engines.EngineError, match="gemm_intercept_share"):
        dcost.engine("sglang", hardware="h200", profile=path)
