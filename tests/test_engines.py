"""The engine value, its kernel-table fits, its host-cost fit and the silicon sample's records."""

import dataclasses
import math
import pathlib
import sys

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost
from dcost.calibrate import host, kernels
from dcost.engines import EngineError
from dcost.validation import check_record, silicon

DATA = pathlib.Path(__file__).parent / "data" / "aiconfigurator"


# ---- the value -----------------------------------------------------------------------------


def test_engine_picks_latest_version_and_prefix():
    rows = [r for r in dcost.engines() if r[0] == "vllm" and r[2] == "h100-sxm"]
    latest = max((r[1] for r in rows), key=dcost.engines._version_key)
    assert dcost.engine("vllm", hardware="h100-sxm").version == latest
    assert dcost.engine("vllm-" + latest, hardware="h100-sxm").version == latest
    prefix = latest.rsplit(".", 1)[0]
    assert dcost.engine("vllm", hardware="h100-sxm", version=prefix).version == latest


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "tgi", "hardware": "h100-sxm"}, "unknown engine 'tgi'; known: vllm"),
        ({"name": "vllm", "hardware": "h100-sxm", "version": "0.1"}, "shipped versions"),
        ({"name": "vllm", "hardware": "tpu-v5e"}, "no shipped vllm profile for hardware"),
        ({"name": "vllm", "hardware": "h100-sxm", "max_num_seqs": 0}, "max_num_seqs = 0"),
        ({"name": "vllm", "hardware": "h100-sxm", "max_seqs": 8}, "unknown scheduler setting"),
        (
            {"name": "vllm", "hardware": "h100-sxm", "prefix_caching": "no"},
            "prefix_caching = 'no'",
        ),
        (
            {"name": "trtllm", "hardware": "h200", "prompt_graphs": 1},
            "prompt_graphs = 1 is not allowed: it must be True or False",
        ),
    ],
)
def test_engine_refuses_bad_input(kwargs, message):
    with pytest.raises(EngineError, match=message):
        dcost.engine(**kwargs)


def test_unknown_hardware_lists_the_presets():
    with pytest.raises(dcost.PresetError, match="known: "):
        dcost.engine("vllm", hardware="h1000")


def test_scheduler_defaults_follow_the_chip():
    assert dcost.engine("vllm", hardware="h100-sxm").scheduler.max_num_seqs == 1024
    assert dcost.engine("vllm", hardware="a100-80gb").scheduler.max_num_batched_tokens == 2048
    assert dcost.engine("sglang", hardware="b200").scheduler.max_num_batched_tokens == 16384
    assert dcost.engine("sglang", hardware="h200").scheduler.max_num_batched_tokens == 8192


def test_decode_with_an_engine_is_the_applied_chip():
    h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3.3-70b")
    eng = dcost.engine("vllm", hardware="h100-sxm")
    d, w = dcost.Design(batch=16, chips=4), dcost.Workload(2048)
    a = dcost.decode(d, h, m, w, engine=eng)
    b = dcost.decode(d, eng.apply(h), m, w)
    assert float(a.tpot) == float(b.tpot)
    assert float(a.t_overhead) > 0.0


def test_prompt_graphs_leave_out_the_cost_of_a_step_with_prompt_tokens():
    """``prompt_graphs=True`` sets the chip's ``prefill_step_overhead`` to 0 and nothing else; a
    mixed step (prompt tokens in it) is then that cost shorter, by hand, and a decode step that
    admits no sequence is unchanged."""
    h, m = dcost.hardware("h200", precision="fp8"), dcost.model("llama-3.1-8b")
    shipped = dcost.engine("trtllm", hardware="h200")
    graphs = dcost.engine("trtllm", hardware="h200", prompt_graphs=True)
    cost = shipped.profile["prefill_step_overhead"]
    assert cost > 1e-3  # milliseconds: leaving it out is a test of something
    a, b = shipped.fields(h), graphs.fields(h)
    assert b["prefill_step_overhead"] == 0.0
    assert {k: v for k, v in a.items() if k != "prefill_step_overhead"} == {
        k: v for k, v in b.items() if k != "prefill_step_overhead"
    }
    # a MoE layer's dispatch floor, where a profile sets one, goes with the graphs too
    floored = shipped.with_profile(profile={"eager_moe_layer_overhead": 1e-3})
    assert floored.fields(h)["eager_moe_layer_overhead"] == 1e-3
    graphed = dataclasses.replace(floored, scheduler=graphs.scheduler)
    assert graphed.fields(h)["eager_moe_layer_overhead"] == 0.0
    d, w = (
        dcost.Design(batch=64, chips=1, prefill_chunk=1024),
        dcost.Workload(2048, prompt=1024, output=256),
    )
    with_prompts = dcost.mixed_step(d, h, m, w, engine=shipped)
    in_graphs = dcost.mixed_step(d, h, m, w, engine=graphs)
    # a step carries a chunk of C = 1,024 prompt tokens; B T_in / T_out = 256 are due a step,
    # so a share f = 256 / 1,024 of the steps carry one and pay the cost
    f = 64 * 1024 / 256 / 1024
    assert float(with_prompts.t_overhead) - float(in_graphs.t_overhead) == pytest.approx(
        f * cost, rel=1e-5
    )
    steady = dcost.Design(batch=64, chips=1)
    assert float(dcost.decode(steady, h, m, dcost.Workload(2048), engine=shipped).tpot) == float(
        dcost.decode(steady, h, m, dcost.Workload(2048), engine=graphs).tpot
    )
    assert graphs.scheduler.prompt_graphs and not shipped.scheduler.prompt_graphs


@pytest.mark.parametrize("name", ["vllm", "sglang", "trtllm"])
@pytest.mark.parametrize("batch", [1.0, 32.0, 512.0])
def test_pure_physics_bounds_every_engine(name, batch):
    """An engine's fractions are at most 1 and its costs at least 0: it is never faster."""
    h, m = dcost.presets.pair("h200", "llama-3.3-70b")
    eng = dcost.engine(name, hardware="h200")
    d, w = dcost.Design(batch=batch, chips=8), dcost.Workload(4096, prompt=2048)
    assert float(dcost.decode(d, h, m, w, engine=eng).tpot) >= float(dcost.decode(d, h, m, w).tpot)
    assert float(dcost.prefill(d, h, m, w, engine=eng).ttft) >= float(
        dcost.prefill(d, h, m, w).ttft
    )


def test_precision_follows_the_chip_rate():
    eng = dcost.engine("vllm", hardware="h100-sxm")
    fp8 = dcost.hardware("h100-sxm", precision="fp8")
    assert eng.precision_of(fp8) == "fp8"
    assert eng.precision_of(dcost.hardware("h100-sxm")) == "bf16"
    applied = eng.apply(fp8)
    assert float(applied.flops_efficiency) == pytest.approx(
        eng.precision_profile["fp8"]["flops_efficiency"], rel=1e-6
    )


def test_decode_refuses_an_engine_name():
    h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-8b")
    with pytest.raises(EngineError, match="dcost.engine"):
        dcost.decode(dcost.Design(batch=1), h, m, dcost.Workload(0), engine="vllm")


def test_profile_round_trip(tmp_path):
    eng = dcost.engine("sglang", hardware="h200")
    mine = eng.with_profile(profile={"step_overhead": 3e-4})
    path = mine.save(tmp_path / "mine.toml")
    back = dcost.engine("sglang", hardware="h200", profile=path)
    assert back.profile == pytest.approx(mine.profile)
    assert back.precision_profile == mine.precision_profile
    with pytest.raises(EngineError, match="is sglang on h200, not vllm on h200"):
        dcost.engine("vllm", hardware="h200", profile=path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[engine]\nname='vllm'\n", "an \\[engine\\] table with name, version and hardware"),
        ("not = [toml", "not a valid TOML file"),
        (
            "[engine]\nname='vllm'\nversion='1'\nhardware='h200'\n[profile]\nwarp=1\n"
            "[profile.precision.bf16]\nflops_efficiency=0.5\n",
            "profile field 'warp' is not known",
        ),
        (
            "[engine]\nname='vllm'\nversion='1'\nhardware='h200'\n[profile]\n"
            "kv_bandwidth_efficiency=1.5\n[profile.precision.bf16]\nflops_efficiency=0.5\n",
            "kv_bandwidth_efficiency = 1.5 must be in \\(0, 1\\]",
        ),
        (
            "[engine]\nname='vllm'\nversion='1'\nhardware='h200'\n"
            "[profile.precision.bf16]\nflops_efficiency=0.5\nexpert_ep_slowdown=0\n",
            "profile.precision.bf16.expert_ep_slowdown = 0.0 must be > 0",
        ),
        (  # a fixed cost of its own is a weight-only expert class's, not a precision's
            "[engine]\nname='vllm'\nversion='1'\nhardware='h200'\n"
            "[profile.precision.bf16]\nflops_efficiency=0.5\nmoe_layer_overhead=1e-5\n",
            "profile.precision.bf16 field 'moe_layer_overhead' is not known",
        ),
    ],
)
def test_a_bad_profile_file_is_named(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(EngineError, match=message) as err:
        dcost.engines.from_file(path)
    assert "bad.toml" in str(err.value)


def test_shipped_profiles_carry_their_provenance():
    for name, version, hw in dcost.engines():
        eng = dcost.engine(name, hardware=hw, version=version)
        prov = eng.provenance
        assert "aiconfigurator-core" in prov["source"]
        assert prov["residuals"]["gemm"]["heldout_median_abs"] < 0.3
        assert set(prov["tables"]) >= {"gemm"}


# ---- kernel fits ---------------------------------------------------------------------------


def _synthetic_gemm(z, n_rows=600, seed=1):
    rng = np.random.default_rng(seed)
    m = np.exp(rng.uniform(0, np.log(16384), n_rows)).round()
    n = rng.choice([1024, 4096, 8192, 28672], n_rows).astype(float)
    k = rng.choice([1024, 4096, 8192], n_rows).astype(float)
    dtype = np.where(rng.random(n_rows) < 0.5, "bfloat16", "fp8")
    chip = kernels._chip("h100-sxm")
    prec = (dtype == "fp8").astype(int)
    peak = np.where(prec == 1, chip["flops_fp8"], chip["flops"])
    b_w = np.where(prec == 1, 1.0, 2.0)
    t = kernels._gemm_time(np.asarray(z), prec, m, n, k, peak, b_w, chip["hbm_bandwidth"], 2)
    return {"gemm_dtype": dtype, "m": m, "n": n, "k": k, "latency": np.asarray(t) * 1e3}


def test_gemm_fit_recovers_the_fields_that_made_the_table():
    # eta_bf16 0.8, eta_fp8 0.6, half points 40 and 120 tokens, eta_BW 0.9, r 0.3, and each
    # precision's kernel its own intercept: 6 us (bf16), 14 us (fp8)
    def logit(p):
        return np.log(p / (1 - p))

    z = [
        logit((0.8 - 0.02) / 0.98),
        logit((0.6 - 0.02) / 0.98),
        np.log(40.0),
        np.log(120.0),
        logit((0.9 - 0.02) / 0.98),
        logit(0.3),
        np.log(6e-6),
        np.log(14e-6),
    ]
    fit = kernels.fit_gemm(_synthetic_gemm(z), "h100-sxm")
    v = fit.values
    assert v["precision.bf16.flops_efficiency"] == pytest.approx(0.8, rel=0.03)
    assert v["precision.fp8.flops_efficiency"] == pytest.approx(0.6, rel=0.03)
    assert v["bandwidth_efficiency"] == pytest.approx(0.9, rel=0.03)
    assert v["precision.bf16.gemm_intercept"] == pytest.approx(6e-6, rel=0.1)
    assert v["precision.fp8.gemm_intercept"] == pytest.approx(14e-6, rel=0.1)
    assert fit.median_abs < 0.01


def test_fits_of_a_kind_share_one_program_and_padding_weighs_nothing():
    """Every fit of a kind whose rows pad to the same size runs one compiled program (a rebuild
    compiled one a fit: about 0.5 s each), and the padded rows change nothing: the fit equals
    Adam on the rows alone (its loss a plain mean over them) within float32's rounding."""
    import optax

    from dcost.serving.collectives import all_reduce

    def table(gpus, latency_s):
        n = np.repeat(gpus, 12)
        size = np.tile(2.0 ** np.arange(10, 34, 2), len(gpus))
        u = kernels._chip("h100-sxm")["scaleup_bandwidth"]
        t = all_reduce(size * 2.0, n, u * 0.7, latency_s, 1.0)
        return {
            "allreduce_dtype": np.full(len(n), "bfloat16"),
            "num_gpus": n,
            "message_size": size,
            "latency": np.asarray(t) * 1e3,
        }

    kernels.fit_allreduce(table([2.0, 4.0, 8.0], 2e-6), "h100-sxm")
    compiled = kernels._adam._cache_size()
    a = table([2.0, 4.0], 5e-6)  # 24 rows, not 36: both pad to 64
    fit = kernels.fit_allreduce(a, "h100-sxm")
    assert kernels._adam._cache_size() == compiled

    # the same rows without padding, the loss a plain mean (the closure a fit once compiled)
    n, volume = a["num_gpus"], a["message_size"] * 2.0
    y = a["latency"] * 1e-3
    fit_i, _ = kernels._split(len(y), 0)
    u = kernels._chip("h100-sxm")["scaleup_bandwidth"]

    def loss(z):
        eff = 0.02 + 0.98 * kernels._logistic(z[0])
        t = all_reduce(volume[fit_i], n[fit_i], u * eff, jnp.exp(z[1]), 1.0)
        return jnp.mean((jnp.log(t) - np.log(y[fit_i])) ** 2)

    opt = optax.adam(kernels.LEARNING_RATE)
    z = jnp.asarray([0.5, np.log(3e-6)])
    state = opt.init(z)
    step = jax.jit(lambda z, s: opt.update(jax.grad(loss)(z), s, z))
    for _ in range(kernels.STEPS):
        updates, state = step(z, state)
        z = optax.apply_updates(z, updates)
    assert fit.values["scaleup_efficiency"] == pytest.approx(
        0.02 + 0.98 / (1 + np.exp(-float(z[0]))), rel=1e-4
    )
    assert fit.values["scaleup_latency"] == pytest.approx(float(np.exp(z[1])), rel=1e-4)


def test_allreduce_fit_recovers_link_fields():
    from dcost.serving.collectives import all_reduce

    n = np.repeat([2.0, 4.0, 8.0], 12)
    size = np.tile(2.0 ** np.arange(10, 34, 2), 3)
    u = kernels._chip("h100-sxm")["scaleup_bandwidth"]
    t = all_reduce(size * 2.0, n, u * 0.7, 2e-6, 1.0)
    table = {
        "allreduce_dtype": np.full(len(n), "bfloat16"),
        "num_gpus": n,
        "message_size": size,
        "latency": np.asarray(t) * 1e3,
    }
    fit = kernels.fit_allreduce(table, "h100-sxm")
    assert fit.values["scaleup_efficiency"] == pytest.approx(0.7, rel=0.02)
    assert fit.values["scaleup_latency"] == pytest.approx(2e-6, rel=0.05)


def test_fit_on_a_cut_of_the_real_tables():
    """400 GEMMs, 600 attention calls and 138 all-reduces of vLLM 0.24 on H100 (attributed in
    each file's first line): each kernel type within the error the shipped profiles report."""
    tables = {
        "gemm": kernels.read_table(DATA / "gemm.csv"),
        "generation_attention": kernels.read_table(DATA / "generation_attention.csv"),
        "context_attention": kernels.read_table(DATA / "context_attention.csv"),
        "allreduce": kernels.read_table(DATA / "custom_allreduce.csv"),
    }
    fits = kernels.fit_tables(tables, "h100-sxm")
    assert fits["gemm"].median_abs < 0.15
    assert fits["attention"].median_abs < 0.35
    assert fits["allreduce"].median_abs < 0.3
    # H100 bf16 GEMMs reach 0.6-0.95 of the 989 TFLOP/s peak in vLLM's tables
    assert 0.6 < fits["gemm"].values["precision.bf16.flops_efficiency"] < 0.95
    shared, precision = kernels.profile_from_fits(fits, dcost.presets.calibration_profile("hopper"))
    assert shared["layer_overhead"] == 0.0  # fitted end to end (dcost.calibrate.engines)
    assert set(precision) == {"bf16", "fp8"}


def test_attention_fit_takes_the_fastest_kernel_of_a_shape():
    """A shape the tables time with several kernels (SGLang's B200 tables: TensorRT-LLM's,
    FlashInfer's and Triton's) counts its fastest only: the real cut with every call timed again
    by a kernel 3x slower fits exactly as the cut alone; a slower kernel alone on a shape stays."""
    gen = kernels.read_table(DATA / "generation_attention.csv")
    ctx = kernels.read_table(DATA / "context_attention.csv")
    n = len(gen["latency"])

    def tagged(t, name, scale=1.0):
        out = {k: np.asarray(v) for k, v in t.items()}
        out["kernel_source"] = np.full(len(out["latency"]), name)
        out["latency"] = out["latency"] * scale
        return out

    fast = tagged(gen, "fast")
    both = {k: np.concatenate([fast[k], tagged(gen, "slow", 3.0)[k]]) for k in fast}
    alone = kernels.fit_attention(fast, ctx, "h100-sxm", 0.5).values
    assert kernels.fit_attention(both, ctx, "h100-sxm", 0.5).values == alone
    kept = kernels.fastest_kernels(both, kernels._ATTENTION_SHAPE)
    assert len(kept["latency"]) == n and set(kept["kernel_source"]) == {"fast"}
    # a shape only the slow kernel timed is kept
    lone = {k: np.concatenate([fast[k][1:], tagged(gen, "slow", 3.0)[k][:1]]) for k in fast}
    kept = kernels.fastest_kernels(lone, kernels._ATTENTION_SHAPE)
    assert len(kept["latency"]) == n and list(kept["kernel_source"]).count("slow") == 1


def _synthetic_attention(table, context, truth, smoothness=0.5):
    """``table`` (the real cut's shapes) with latencies of the fit's own form at ``truth``."""
    from dcost.serving.kernels import kernel_time

    chip = kernels._chip("h100-sxm")
    t = {k: np.asarray(v) for k, v in table.items()}
    b, h, d = (t[k].astype(float) for k in ("batch_size", "num_heads", "head_dim"))
    hkv = t["num_key_value_heads"].astype(float)
    s = t["isl"].astype(float) + (0.0 if context else t["step"].astype(float))
    b_kv = np.array([kernels._KV_BYTES[x] for x in t["kv_cache_dtype"].astype(str)])
    peak = np.array(
        [kernels._peak(chip, kernels._ATTN_PRECISION[x]) for x in t["attn_dtype"].astype(str)]
    )
    if context:
        flops, byts, c = 2 * b * s * s * h * d, b * s * (h + 2 * hkv) * d * 2.0, 8e-5
        eta_kv = truth["kv"]
    else:
        flops, byts, c = 4 * b * s * h * d, 2 * b * s * hkv * d * b_kv, 1e-5
        eta_kv = truth["kv"] * np.where(b_kv <= 1.0, truth["ratio"], 1.0)
    hw = kernels._bare(peak, chip["hbm_bandwidth"], 1.0, 1.0, 0.0, smoothness)
    tf, tw = flops / (peak * truth["eta"]), byts / (chip["hbm_bandwidth"] * eta_kv)
    t["latency"] = 1e3 * (c + 1e-8 * b + np.asarray(kernel_time(tf, tw, hw)))
    return t


def test_attention_fit_recovers_an_8bit_caches_own_bandwidth():
    """An fp8 KV cache's reads at their own share of the bandwidth (``fp8_kv_bandwidth_ratio``):
    latencies of the fit's own form on the real cut's shapes, 8-bit reads at 0.6 of the 16-bit
    rate, give back the ratio and the rates; a table with no 8-bit rows sets no ratio."""
    truth = {"eta": 0.45, "kv": 0.85, "ratio": 0.6}
    gen = _synthetic_attention(kernels.read_table(DATA / "generation_attention.csv"), False, truth)
    ctx = _synthetic_attention(kernels.read_table(DATA / "context_attention.csv"), True, truth)
    fit = kernels.fit_attention(gen, ctx, "h100-sxm", 0.5).values
    assert fit["fp8_kv_bandwidth_ratio"] == pytest.approx(0.6, rel=0.05)
    assert fit["kv_bandwidth_efficiency"] == pytest.approx(0.85, rel=0.05)
    assert fit["attention_efficiency"] == pytest.approx(0.45, rel=0.05)
    bf16 = {k: v[gen["kv_cache_dtype"] == "bfloat16"] for k, v in gen.items()}
    assert "fp8_kv_bandwidth_ratio" not in kernels.fit_attention(bf16, ctx, "h100-sxm", 0.5).values


def test_an_8bit_cache_reads_at_the_engines_own_rate(tmp_path):
    """``Engine.fields`` with a model: an fp8 cache (``kv_bytes_per_element`` 1) reads at
    ``kv_bandwidth_efficiency * fp8_kv_bandwidth_ratio``, a bf16 one and a model that states no
    format at the 16-bit rate, element by element of a batch; the decode step moves with it; a
    ratio above 1 in a profile file is refused naming the field."""
    eng = dcost.engine("vllm", hardware="h100-sxm")
    ratio, eta = eng.profile["fp8_kv_bandwidth_ratio"], eng.profile["kv_bandwidth_efficiency"]
    assert 0.3 < ratio < 0.95  # FlashAttention-3 dequantizing the cache as it reads it
    hw = dcost.hardware("h100-sxm", precision="fp8")
    m8 = dcost.model("llama-3-70b", weights="fp8", kv_cache="fp8")
    m16 = dcost.model("llama-3-70b", weights="fp8")
    assert (float(m8.kv_bytes_per_element), float(m16.kv_bytes_per_element)) == (1.0, 2.0)
    got = eng.fields(hw, model=m8)["kv_bandwidth_efficiency"]
    assert float(got) == pytest.approx(eta * ratio)
    assert float(eng.fields(hw, model=m16)["kv_bandwidth_efficiency"]) == pytest.approx(eta)
    unstated = eqx.tree_at(lambda m: m.kv_bytes_per_element, m8, 0.0)
    assert float(eng.fields(hw, model=unstated)["kv_bandwidth_efficiency"]) == pytest.approx(eta)
    both = jax.tree.map(lambda a, b: jnp.stack([a, b]), m8, m16)
    assert np.asarray(eng.fields(hw, model=both)["kv_bandwidth_efficiency"]) == pytest.approx(
        [eta * ratio, eta]
    )
    design, w = dcost.Design(batch=64, chips=8), dcost.Workload(8192)
    slow = dcost.decode(design, hw, m8, w, engine=eng).tpot
    flat = eng.with_profile(profile={"fp8_kv_bandwidth_ratio": 1.0})
    fast = dcost.decode(design, hw, m8, w, engine=flat).tpot
    assert float(slow) > float(fast)
    text = eng.save(tmp_path / "mine.toml").read_text()
    bad = tmp_path / "bad.toml"
    bad.write_text(
        text.replace(f"fp8_kv_bandwidth_ratio = {ratio!r}", "fp8_kv_bandwidth_ratio = 1.5")
    )
    with pytest.raises(EngineError, match=r"fp8_kv_bandwidth_ratio = 1.5 must be in \(0, 1\]"):
        dcost.engines.from_file(bad)


def _mla_latency(table, truth, smoothness=0.5, intercepts=(1e-5, 1e-8)):
    """``table``'s MLA generation shapes with latencies of the absorbed form written out: every
    head reads the 576-element latent a context token (512 + 64 rope) and multiplies it twice,
    ``2 h (576 + 512)`` FLOPs a token of context."""
    from dcost.serving.kernels import kernel_time

    chip = kernels._chip("h200")
    b, s, h = (np.asarray(table[k], float) for k in ("batch_size", "step", "num_heads"))
    s = s + np.asarray(table["isl"], float)
    b_kv = np.where(np.asarray(table["kv_cache_dtype"]).astype(str) == "fp8", 1.0, 2.0)
    flops, byts = 2.0 * b * s * h * (576 + 512), b * s * 576 * b_kv
    peak = kernels._peak(chip, "bf16") * np.ones_like(b)
    eta_kv = truth["kv"] * np.where(b_kv <= 1.0, truth["ratio"], 1.0)
    hw = kernels._bare(peak, chip["hbm_bandwidth"], 1.0, 1.0, 0.0, smoothness)
    t = kernel_time(flops / (peak * truth["eta"]), byts / (chip["hbm_bandwidth"] * eta_kv), hw)
    return 1e3 * (intercepts[0] + intercepts[1] * b + np.asarray(t))


def test_mla_fit_recovers_the_latent_kernels_rates():
    """Latent attention's own rates (``fit_mla``): latencies of the absorbed form on the real
    cut's shapes (TensorRT-LLM on H200) at known rates give them back, under the ``mla_``
    names; the fit to the cut's measured latencies predicts its rows within the error the
    shipped profiles report (held-out 4-12 % on the full tables), where the GQA kernels' rates
    of the shipped profile are far off them (the gap ``fit_mla`` closes)."""
    cut = kernels.read_table(DATA / "generation_mla.csv")
    truth = {"eta": 0.6, "kv": 0.8, "ratio": 0.7}
    synthetic = {**cut, "latency": _mla_latency(cut, truth)}
    fit = kernels.fit_mla(synthetic, None, "h200", 0.5)
    assert fit.kind == "mla_attention"
    assert fit.values["mla_attention_efficiency"] == pytest.approx(0.6, rel=0.05)
    assert fit.values["mla_kv_bandwidth_efficiency"] == pytest.approx(0.8, rel=0.05)
    assert fit.values["mla_fp8_kv_bandwidth_ratio"] == pytest.approx(0.7, rel=0.05)
    assert fit.median_abs < 0.02  # the fit's own form: nothing left
    real = kernels.fit_mla(cut, None, "h200", 0.5)
    c = (
        real.values["mla_generation_intercept"],
        real.values["mla_attention_sequence_intercept"],
    )
    own = _mla_latency(
        cut,
        {
            "eta": real.values["mla_attention_efficiency"],
            "kv": real.values["mla_kv_bandwidth_efficiency"],
            "ratio": real.values.get("mla_fp8_kv_bandwidth_ratio", 1.0),
        },
        intercepts=c,
    )
    gqa = dcost.engine("trtllm", hardware="h200").profile
    dense = _mla_latency(
        cut,
        {
            "eta": gqa["attention_efficiency"],
            "kv": gqa["kv_bandwidth_efficiency"],
            "ratio": gqa.get("fp8_kv_bandwidth_ratio", 1.0),
        },
        intercepts=c,
    )
    work = _mla_latency(cut, {"eta": 1.0, "kv": 1.0, "ratio": 1.0}) > 1e3 * 1.5e-5
    err = lambda pred: float(np.median(np.abs(pred[work] / cut["latency"][work] - 1.0)))  # noqa: E731
    assert real.median_abs < 0.15 and err(own) < 0.2
    assert err(dense) > 2.0 * err(own)


def test_latent_attention_takes_the_mla_kernels_rates(tmp_path):
    """``Engine.fields`` gives a model with latent attention (DeepSeek-V3) the ``mla_`` fields and
    a GQA model (Llama 3 70B) the GQA kernels', element by element of a batch of both; its
    decode step moves with them; a latent rate above 1 in a profile file is refused."""
    eng = dcost.engine("trtllm", hardware="h200")
    prof = eng.profile
    assert {"mla_attention_efficiency", "mla_kv_bandwidth_efficiency"} <= set(prof)
    hw = dcost.hardware("h200", precision="fp8")
    ds, llama = dcost.model("deepseek-v3"), dcost.model("llama-3-70b", weights="fp8")
    peak = float(hw.get("attention_flops"))

    def rates(m):
        f = eng.fields(hw, model=m)
        return np.asarray(f["attention_flops"]) * np.asarray(f["flops_efficiency"]) / peak, (
            np.asarray(f["kv_bandwidth_efficiency"])
        )

    att, kv = rates(ds)
    assert float(att) == pytest.approx(prof["mla_attention_efficiency"])
    r16 = 1.0 if float(ds.kv_bytes_per_element) > 1 else prof.get("mla_fp8_kv_bandwidth_ratio", 1)
    assert float(kv) == pytest.approx(prof["mla_kv_bandwidth_efficiency"] * r16)
    att, kv = rates(llama)
    assert float(att) == pytest.approx(prof["attention_efficiency"])
    both = jax.tree.map(lambda a, b: jnp.stack([jnp.asarray(a), jnp.asarray(b)]), ds, llama)
    att, _ = rates(both)
    assert att == pytest.approx([prof["mla_attention_efficiency"], prof["attention_efficiency"]])
    design, w = dcost.Design(batch=256, chips=8), dcost.Workload(8192)
    own = dcost.decode(design, hw, ds, w, engine=eng).tpot
    gqa = eng.with_profile(
        profile={
            "mla_attention_efficiency": prof["attention_efficiency"],
            "mla_kv_bandwidth_efficiency": prof["kv_bandwidth_efficiency"],
        }
    )
    assert float(own) != pytest.approx(float(dcost.decode(design, hw, ds, w, engine=gqa).tpot))
    # a GQA model's step does not see the latent fields
    assert float(dcost.decode(design, hw, llama, w, engine=eng).tpot) == pytest.approx(
        float(dcost.decode(design, hw, llama, w, engine=gqa).tpot), rel=1e-6
    )
    text = eng.save(tmp_path / "mine.toml").read_text()
    v = prof["mla_attention_efficiency"]
    bad = tmp_path / "bad.toml"
    bad.write_text(
        text.replace(f"mla_attention_efficiency = {v!r}", "mla_attention_efficiency = 1.5")
    )
    with pytest.raises(EngineError, match=r"mla_attention_efficiency = 1.5 must be in \(0, 1\]"):
        dcost.engines.from_file(bad)


# ---- host costs ----------------------------------------------------------------------------


def test_host_fit_holds_the_row_model_out():
    """Two models whose rows imply different host costs: each is predicted with the other's."""
    rng = np.random.default_rng(0)
    a = rng.uniform(1, 2, 40)
    b = rng.uniform(1, 256, 40)
    fold = np.repeat(["m1", "m2"], 20)
    s_true = np.where(fold == "m1", 1e-3, 2e-3)
    y = 0.01 + s_true * a + 1e-5 * b
    layers = rng.choice([32.0, 80.0], 40)
    prompt_steps = a * rng.uniform(0.0, 0.5, 40)  # a share of the steps carries prompt tokens
    y = y + 2e-5 * layers + 4e-3 * prompt_steps
    slopes = (a, layers, b, prompt_steps)
    costs = host.held_out_host(np.full(40, 0.01), slopes, y, np.full(40, "vllm"), fold)
    assert costs[:20, 0] == pytest.approx(2e-3, rel=0.03)  # m1 rows: fitted on m2's
    assert costs[20:, 0] == pytest.approx(1e-3, rel=0.03)
    assert costs[:, 1] == pytest.approx(2e-5, rel=0.05)
    assert costs[:, 2] == pytest.approx(1e-5, rel=0.05)
    assert costs[:, 3] == pytest.approx(4e-3, rel=0.05)


def test_host_fit_weighs_each_model_once():
    """``balance``: a model's rows weigh one in all. The same fit on data where the small
    model's rows are repeated until both models have as many (unbalanced) must agree; and with
    two models implying different step costs, the balanced fit lands between them where the
    unbalanced one sits at the big model's."""
    rng = np.random.default_rng(1)
    n_big, n_small = 60, 6
    model = np.r_[np.full(n_big, "big"), np.full(n_small, "small")]
    a = rng.uniform(1, 2, model.size)
    c = rng.choice([32.0, 80.0], model.size)
    b = rng.uniform(1, 256, model.size)
    p = a * rng.uniform(0.0, 0.5, model.size)
    step = np.where(model == "big", 1e-3, 3e-3)
    y = 0.01 + step * a + 2e-5 * c + 1e-5 * b + 4e-3 * p
    base = np.full(model.size, 0.01)
    balanced = host.fit_host(base, (a, c, b, p), y, balance=model)
    rep = np.r_[np.arange(n_big), np.tile(np.arange(n_big, model.size), n_big // n_small)]
    repeated = host.fit_host(base[rep], (a[rep], c[rep], b[rep], p[rep]), y[rep])
    for name in host.FIELDS:
        assert getattr(balanced, name) == pytest.approx(getattr(repeated, name), rel=0.02), name
    plain = host.fit_host(base, (a, c, b, p), y)
    assert plain.step_overhead < balanced.step_overhead < 3e-3


# ---- the silicon sample --------------------------------------------------------------------


def test_silicon_records_are_checked_records():
    recs, skipped = silicon.records()
    out = {s.id for s in skipped if s.metric == "*"}  # rows; a run counted out is its record's id
    out |= {s.id for s in skipped if s.reason in (silicon.SPECULATIVE, silicon.REPEATED)}
    assert len(recs) + len(out) > 5000
    for r in recs[::50]:
        check_record({k: v for k, v in r.items() if k != "mode"})
    reasons = {s.reason for s in skipped}
    assert not silicon.UNMODELLED
    assert not any("attention" in r and "not modelled" in r for r in reasons)
    # Qwen3.5's Gated DeltaNet layers (a recurrent state in place of a KV cache) and GLM-5's
    # sparse attention (a top-k of the context and an indexer) are modelled
    assert {"qwen3.5-397b-a17b", "glm-5"} <= {r["model"] for r in recs}
    first = next(
        r for r in recs if r["id"].startswith("silicon-minimaxm2_5_b300_vllm_fp8_agg_8192")
    )
    assert (first["hardware"], first["model"], first["concurrency"]) == (
        "b300",
        "minimax-m2.5",
        128,
    )
    assert (first["tensor_parallel"], first["expert_parallel"], first["gpus"]) == (4, 1, 4)
    assert first["value"] == pytest.approx(33.442908754168066e-3)


def test_silicon_rows_whose_experts_span_other_gpus_than_attention_are_counted_out():
    """A MoE row whose ``moe_tp_size x moe_ep_size`` is not ``tp_size x attention_dp_size`` (the
    sample's vLLM Qwen3-235B runs on H200 with tp 1 and moe_tp 2) cannot be the layout that ran
    (AIConfigurator refuses it: "Parallelism width mismatch"); the same row made consistent is
    kept, on the GPUs its attention spans; every weight fits the GPUs of every kept row."""
    rows = {r["id"]: r for r in silicon.load_rows()}
    rid = (
        "qwen_qwen3_235b_a22b_fp8_qwen_qwen3_235b_a22b_fp8_h200_sxm_vllm_agg_1000x100_c8_tp1_"
        "epnone_2"
    )
    row = rows[rid]
    assert (row["tp_size"], row["moe_tp_size"], row["moe_ep_size"]) == ("1", "2", "1")
    recs, skipped = silicon.records([row])
    assert not recs
    assert [s.reason for s in skipped] == [
        "moe_tp_size x moe_ep_size disagrees with tp_size x attention_dp_size"
    ]
    fixed = dict(row, id=rid.replace("_tp1_", "_tp2_"), tp_size="2")
    recs, _ = silicon.records([fixed])
    assert [r["gpus"] for r in recs] == [2]
    kept, _ = silicon.records()
    weights, capacity = {}, {}  # thousands of rows, a few dozen models and chips: each built once
    for r in kept:
        key = name, precision, kv = (r["model"], r["weights"], r["kv_cache"])
        if key not in weights:
            m = dcost.model(name, weights=precision, kv_cache=kv)
            weights[key] = (
                float(m.params_dense) + float(m.params_per_expert) * float(m.n_experts)
            ) * float(m.bytes_per_param)
        if r["hardware"] not in capacity:
            capacity[r["hardware"]] = float(dcost.hardware(r["hardware"]).hbm_capacity)
        assert weights[key] / r["gpus"] < capacity[r["hardware"]], r["id"]


def test_silicon_rows_whose_cap_is_below_their_clients_are_counted_out():
    """An aggregated row of one replica without attention data parallelism whose running-sequence
    cap (``batch_size``) is below its clients cannot be the layout that ran as stated (Qwen3-32B on
    GB200 under TensorRT-LLM at 2 clients and a cap of 1 measured 5x the TPOT of 1 client); the
    same row with a cap of its clients is kept, and so is every row whose batch is a rank's
    (attention data parallelism) or a share of an InferenceX launch read back
    (``silicon.inferencex_launch``)."""
    rows = silicon.load_rows()
    mine = [
        r
        for r in rows
        if r["mode"] == "agg" and r["system"] == "gb200" and r["backend"] == "trtllm"
        and r["model_path"].endswith("Qwen3-32B") and r["batch_size"] == "1"
        and silicon.source_field(r["silicon_data_source"], "silicon_concurrency") == "2"
    ]  # fmt: skip
    assert mine and all(r["attention_dp_size"] in ("", "0", "1") for r in mine)
    recs, skipped = silicon.records(mine[:1])
    assert not recs and [s.reason for s in skipped] == [silicon.BATCH_BELOW_CLIENTS]
    recs, _ = silicon.records([dict(mine[0], batch_size="2")])
    assert [r["metric"] for r in recs] == ["tpot"] and recs[0]["concurrency"] == 2
    kept, skipped = silicon.records()
    assert sum(s.reason == silicon.BATCH_BELOW_CLIENTS for s in skipped) == 29
    by_id = {x["id"]: x for x in rows}
    below = {"rank": 0, "launch": 0, "cap": 0}  # kept aggregated TPOT rows, cap below clients
    for r in kept:
        if r["metric"] != "tpot" or r["serving"] != "aggregated":
            continue
        cap = by_id[r["id"][len("silicon-") : -len("-tpot")]]["batch_size"]
        if cap and int(cap) < r["concurrency"]:
            # an InferenceX launch read back: batch_size is the adapter's share of the clients
            launch = "gpus" in r["assumed"]
            below[
                "launch" if launch else "rank" if r["attention_data_parallel"] > 1 else "cap"
            ] += 1
    # kept only where the batch is a rank's or a share of a launch read back
    assert below["cap"] == 0 and below["launch"] > 0


def test_inferencex_rows_that_count_expert_gpus_twice_run_their_launch():
    """InferenceX's April exports state a single-node launch of T GPUs with expert parallelism
    E = T as T E GPUs (16 and 64 on a node of 8); the records run the launch, with ``gpus``
    assumed. Its March export states the same runs with T GPUs: eight of them (Qwen3.5-397B on
    B200 under SGLang) are the April rows' runs to the last digit of both times, and are counted
    once only because the layouts now agree. Rows from other exports, without experts split, or
    with another split are left as stated."""
    kept, skipped = silicon.records()
    rows = {r["id"]: r for r in silicon.load_rows()}

    def row(record_id, metric):
        return rows[record_id[len("silicon-") : -len(metric) - 1]]

    fixed = [r for r in kept if "gpus" in r["assumed"]]
    assert len(fixed) > 150 and {r["engine"] for r in fixed} == {"vllm", "sglang", "trtllm"}
    for r in fixed:
        raw = row(r["id"], r["metric"])
        stated = int(raw["tp_size"]) * int(raw["attention_dp_size"] or 1)
        assert raw["silicon_data_source"].startswith(silicon.EXPERT_GPUS_COUNTED_TWICE)
        assert stated == r["gpus"] ** 2 and r["gpus"] <= 8, r["id"]  # T E stated, E = T
        assert r["expert_parallel"] == r["gpus"]  # E = T
        assert r["tensor_parallel"] * r["attention_data_parallel"] == r["gpus"]
    runs = {tuple(r.get(k) for k in silicon._SAME_RUN): r for r in kept}
    march = []
    for s in skipped:
        if s.reason != silicon.REPEATED:
            continue
        raw = row(s.id, s.metric)
        (mine,) = [r for r in silicon.records([raw])[0] if r["metric"] == s.metric]
        twin = runs[tuple(mine.get(k) for k in silicon._SAME_RUN)]
        if "gpus" in twin["assumed"] and "2026-03-25" in raw["silicon_data_source"]:
            april = row(twin["id"], s.metric)
            assert int(april["tp_size"]) == 4 * int(raw["tp_size"])  # 16 GPUs stated, 4 ran
            for t in ("silicon_ttft_ms", "silicon_tpot_ms"):
                assert float(raw[t]) == pytest.approx(float(april[t]), rel=1e-12)
            march.append(s.id)
    assert len(march) == 8
    # by hand: SGLang with data-parallel attention, vLLM; left alone: March, no split, 2 x 4
    sg = {"silicon_data_source": "db-dump/x", "backend": "trtllm", "mode": "agg",
          "moe_tp_size": "8", "moe_ep_size": "8"}  # fmt: skip
    lay = {"tensor_parallel": 1, "pipeline_parallel": 1, "attention_data_parallel": 64,
           "expert_parallel": 8, "gpus": 64}  # fmt: skip
    got = silicon.inferencex_launch(sg, lay)
    assert (got["tensor_parallel"], got["attention_data_parallel"], got["gpus"]) == (1, 8, 8)
    vl = dict(sg, backend="vllm", moe_tp_size="1", moe_ep_size="16")
    lay_v = dict(lay, tensor_parallel=4, attention_data_parallel=4, expert_parallel=16, gpus=16)
    got = silicon.inferencex_launch(vl, lay_v)
    assert (got["tensor_parallel"], got["attention_data_parallel"], got["expert_parallel"]) == (
        4,
        1,
        4,
    )
    assert got["gpus"] == 4
    assert (
        silicon.inferencex_launch(dict(vl, silicon_data_source="source_file=2026-03-25"), lay_v)
        is None
    )
    assert silicon.inferencex_launch(dict(sg, moe_ep_size="1"), lay) is None
    two_by_four = dict(sg, moe_tp_size="2", moe_ep_size="4")
    assert silicon.inferencex_launch(two_by_four, dict(lay, attention_data_parallel=8)) is None


def test_inferencex_runs_take_the_kv_cache_their_launch_script_set():
    """InferenceX's single-node runs take the KV-cache format their launch script set
    (``inferencex_kv.toml``, by date); its entries are well formed, each citing a script at a
    commit; a run's entry by hand; rows without a script (multi-node, disaggregated, not
    InferenceX's) keep the assumed format; the records say which."""
    import re
    import tomllib
    from importlib import resources

    text = resources.files("dcost.validation").joinpath("inferencex_kv.toml").read_text()
    entries = tomllib.loads(text)["script"]
    assert len(entries) > 30
    for e in entries:
        assert e["engine"] in ("vllm", "sglang", "trtllm") and e["model"] in silicon.MODELS
        assert e["system"] in silicon.SYSTEMS and e["precision"] in ("fp8", "fp4", "int4", "bf16")
        assert re.fullmatch(r"20\d\d-\d\d-\d\d", e["since"])
        script = r"SemiAnalysisAI/InferenceX@[0-9a-f]{12} benchmarks/\S+\.sh"
        assert re.fullmatch(script, e["source"])
        if e["kv_cache"] == "fp8":
            assert "fp8" in e["setting"]
        else:
            assert e["kv_cache"] == "bf16" and ("auto" in e["setting"] or "no KV" in e["setting"])
    base = {"silicon_data_source": "source_file=2026-04-06.csv; measured=2025-10-29",
            "mode": "agg", "backend": "vllm", "model_path": "meta-llama/Llama-3.1-70B",
            "system": "h200_sxm", "gemm_quant_mode": "fp8", "moe_quant_mode": ""}  # fmt: skip
    got = silicon.inferencex_kv_cache(base)
    assert got["kv_cache"] == "fp8" and "70b_fp8_h200" in got["source"]
    # MiniMax-M2.5 fp8 on B200 under vLLM: the script set fp8 from 2026-04-03 on
    mm = dict(base, model_path="MiniMaxAI/MiniMax-M2.5", system="b200_sxm", moe_quant_mode="fp8")
    at = {d: silicon.inferencex_kv_cache(dict(mm, silicon_data_source=f"db-dump/x; measured={d}"))
          for d in ("2026-03-20", "2026-04-03", "2026-04-22", "2026-01-01")}  # fmt: skip
    assert [at[d]["kv_cache"] for d in at] == ["bf16", "fp8", "fp8", "bf16"]  # before all: oldest
    assert silicon.inferencex_kv_cache(dict(base, system="gb200")) is None  # multi-node recipes
    assert silicon.inferencex_kv_cache(dict(base, mode="disagg")) is None
    assert silicon.inferencex_kv_cache(dict(base, silicon_data_source="gap_analysis")) is None
    kept, _ = silicon.records()
    rows = {r["id"]: r for r in silicon.load_rows()}
    read = [r for r in kept if "KV cache" in r["quote"]]
    assert len(read) > 1500
    for r in read:
        raw = rows[r["id"][len("silicon-") : -len(r["metric"]) - 1]]
        assert "kv_cache" not in r["assumed"] and silicon.inferencex(raw) and raw["mode"] == "agg"
        assert r["kv_cache"] == silicon.inferencex_kv_cache(raw)["kv_cache"]
    assert all("kv_cache" in r["assumed"] for r in kept if "KV cache" not in r["quote"])
    # TensorRT-LLM's gpt-oss on H200 set "auto" (bf16), against the fp8 assumed for TensorRT-LLM
    assert {r["kv_cache"] for r in read if r["engine"] == "trtllm" and r["hardware"] == "h200"
            and r["model"] == "gpt-oss-120b"} == {"bf16"}  # fmt: skip


def test_inferencex_runs_take_their_clients_mean_lengths():
    """InferenceX's client draws lengths uniformly over the integers [floor(0.8 L), L]: the
    closed form of their mean against the mean of every length, and every InferenceX record's
    lengths are those means (the others as stated)."""
    for n in (1024, 8192, 1000, 7):
        assert silicon.inferencex_mean_length(float(n)) == np.mean(np.arange(int(0.8 * n), n + 1))
    kept, _ = silicon.records()
    rows = {r["id"]: r for r in silicon.load_rows()}
    seen = 0
    for r in kept:
        raw = rows[r["id"][len("silicon-") : -len(r["metric"]) - 1]]
        isl, osl = float(raw["isl"]), float(raw["osl"])
        if silicon.inferencex(raw):
            seen += 1
            isl, osl = silicon.inferencex_mean_length(isl), silicon.inferencex_mean_length(osl)
        assert (r["prompt_tokens"], r["output_tokens"]) == (isl, osl)
    assert seen > 1500


def test_silicon_runs_listed_twice_are_counted_once():
    """The sample lists some runs twice (the same configuration, engine version and times): each
    is one record; every repeat counted out has its twin among the records, whose row gives the
    same TTFT too (to its float's last digit), and no two records left are the same run."""
    kept, skipped = silicon.records()
    runs = {tuple(r.get(k) for k in silicon._SAME_RUN): r["id"] for r in kept}
    assert len(runs) == len(kept)
    repeats = [s for s in skipped if s.reason == silicon.REPEATED]
    # 240, and 49 of Qwen3.5-397B's and 32 of GLM-5's since their runs are records (2026-12-03),
    # and 8 of Qwen3.5-397B's since InferenceX's launches are read back (2026-12-04)
    assert len(repeats) == 329
    every, _ = silicon.records(count_out=False)  # as before: repeats and speculative runs in
    speculative = [s for s in skipped if s.reason == silicon.SPECULATIVE]
    assert len(every) == len(kept) + len(repeats) + len(speculative)
    assert {r["id"] for r in kept} < {r["id"] for r in every}
    rows = {r["id"]: r for r in silicon.load_rows()}

    def row(record_id, metric):  # "silicon-<row id>-<metric>" -> the sample's row
        return rows[record_id[len("silicon-") : -len(metric) - 1]]

    for s in repeats:
        alone, _ = silicon.records([row(s.id, s.metric)])
        (mine,) = [r for r in alone if r["metric"] == s.metric]
        twin = runs[tuple(mine.get(k) for k in silicon._SAME_RUN)]
        assert twin != s.id
        ttft = (float(row(x, s.metric)["silicon_ttft_ms"]) for x in (s.id, twin))
        assert next(ttft) == pytest.approx(next(ttft), rel=1e-12), (s.id, twin)


def test_silicon_runs_that_most_likely_decoded_speculatively_are_counted_out():
    """TensorRT-LLM 1.2.0rc6.post3's DeepSeek-R1 runs against 1.2.0rc6.post2's at the same
    configurations (the sample's own evidence for ``SPECULATIVE_SUSPECTED``): 22 of them, each
    faster on post3 by 1.20-2.32x (median 1.58x), and most at the fewest clients."""
    every, _ = silicon.records(count_out=False)  # a repeat's value is its twin's: first kept
    config = [k for k in silicon._SAME_RUN if k not in ("engine_version", "value")]
    runs: dict = {}
    for r in every:
        if r["engine"] == "trtllm" and r["model"] == "deepseek-r1":
            key = tuple(r.get(k) for k in config)
            runs.setdefault(key, {}).setdefault(r.get("engine_version"), r["value"])
    pairs = [(k, v) for k, v in runs.items() if {"1.2.0rc6.post2", "1.2.0rc6.post3"} <= set(v)]
    ratio = np.array([v["1.2.0rc6.post2"] / v["1.2.0rc6.post3"] for _, v in pairs])
    assert len(pairs) == 22
    assert 1.19 < ratio.min() and ratio.max() < 2.33 and 1.55 < np.median(ratio) < 1.61
    clients = np.array([k[config.index("concurrency")] for k, _ in pairs])
    assert np.median(ratio[clients <= 8]) > np.median(ratio[clients >= 128]) + 0.3
    kept, skipped = silicon.records()
    out = [s for s in skipped if s.reason == silicon.SPECULATIVE]
    assert len(out) == 60 == sum(silicon.speculative(r) for r in every)
    assert not any(silicon.speculative(r) for r in kept)


def test_silicon_predictions_are_linear_in_host_costs():
    recs, _ = silicon.records()
    pick = [r for r in recs if r["engine"] == "vllm" and r["hardware"] == "h200"][:6]
    p = silicon.predict_all(pick)
    eng = dcost.engine("vllm", hardware="h200")
    costs = {
        "step_overhead": 2e-4,
        "layer_overhead": 5e-6,
        "sequence_overhead": 3e-6,
        "prefill_step_overhead": 1e-3,
        "gemm_intercept_share": 0.7,
    }
    mine = eng.with_profile(profile=costs)
    plain = {k: v for k, v in pick[0].items() if k != "mode"}
    running = silicon.running_sequences(dcost.validation.case(plain), plain, mine)
    direct = dcost.validation.evaluate_case(
        silicon._with_chunk(
            dcost.validation.case(dict(plain, concurrency=running), engine=mine),
            float(mine.scheduler.max_num_batched_tokens),
        )
    )
    assert p.engine(2e-4, 5e-6, 3e-6, 1e-3, 0.7)[0] == pytest.approx(float(direct), rel=1e-4)
    # the GEMM term is there to be fitted: 0.7 of the fp8 GEMMs' intercepts moves the step
    assert p.engine(2e-4, 5e-6, 3e-6, 1e-3)[0] < float(direct) * (1 - 1e-3)
    assert np.all(p.pure <= p.engine(0.0, 0.0, 0.0, 0.0) * (1 + 1e-6))


def test_silicon_ttft_holds_the_engines_frontend_time():
    """A lone-prefill TTFT row is the step and what the benchmark client measures beyond the
    engine (``Scheduler.frontend_time``), as the simulation adds it; a TPOT row has none: a
    frontend 0.5 s longer moves the TTFT by 0.5 s and the TPOT not at all."""
    import dataclasses

    from dcost.validation import cases

    recs, _ = silicon.records()
    ttft = [r for r in recs if r["metric"] == "ttft"][:1]
    tpot = [r for r in recs if r["metric"] == "tpot" and r["engine"] == ttft[0]["engine"]][:1]
    pick = ttft + tpot
    eng = cases.record_engine(ttft[0])[0]
    late = dataclasses.replace(eng, scheduler=dataclasses.replace(eng.scheduler, frontend_time=0.5))
    a = silicon.predict_all(pick, engine_for=lambda r: eng, family=False)
    b = silicon.predict_all(pick, engine_for=lambda r: late, family=False)
    assert eng.scheduler.frontend_time > 0
    assert b.engine_base[0] - a.engine_base[0] == pytest.approx(
        0.5 - eng.scheduler.frontend_time, rel=1e-6
    )
    assert b.engine_base[1] == a.engine_base[1]


# ---- the searches and the CLI ---------------------------------------------------------------


def test_problem_with_an_engine_is_the_applied_chip():
    h, m = dcost.presets.pair("h100-sxm", "llama-3.3-70b")
    eng = dcost.engine("vllm", hardware="h100-sxm")
    free = {"batch": (1, 256)}
    a = dcost.Problem(h, m, dcost.Workload(2048), free=free, tpot_slo=0.05, engine=eng)
    b = dcost.Problem(eng.apply(h), m, dcost.Workload(2048), free=free, tpot_slo=0.05)
    assert float(a.hardware.step_overhead) == float(b.hardware.step_overhead) > 0.0
    # an engine is never faster than pure physics: its cheapest token costs at least as much
    pure = dcost.grid_search(dcost.Problem(h, m, dcost.Workload(2048), free=free, tpot_slo=0.05))
    assert float(dcost.grid_search(a).cost) >= float(pure.cost)


def test_plan_takes_an_engine_name_with_preset_names():
    t = dcost.traffic("chat", rate=5.0)
    with pytest.raises(EngineError, match="names an engine but not its chip"):
        dcost.plan(dcost.hardware("h100-sxm"), "llama-3-8b", t, engine="vllm")
    p = dcost.plan("h100-sxm", "llama-3.1-8b", t, engine="vllm")
    assert p.feasible and p.chips >= dcost.plan("h100-sxm", "llama-3.1-8b", t).chips


def test_cli_engines_json_is_strict_and_matches_the_shipped_summary(capsys):
    import json

    from dcost.cli import main

    assert main(["engines", "--engine", "vllm", "--json"]) == 0
    out = json.loads(capsys.readouterr().out, parse_constant=lambda c: pytest.fail(c))
    assert {p["engine"] for p in out["profiles"]} == {"vllm"}
    assert out["silicon_heldout"] == dcost.engines.heldout()


def test_cli_engines_table_shows_the_three_hbm_rates(capsys):
    """The text table's HBM column is the profile's dense, routed-expert and KV rates; a profile
    without an expert rate (no MoE table: A100) shows the dense one there, as the model reads it."""
    from dcost.cli import main

    assert main(["engines", "--engine", "vllm"]) == 0
    text = capsys.readouterr().out
    for hw in ("h200", "a100-80gb"):
        e = dcost.engine("vllm", hardware=hw)
        h = e.apply(dcost.hardware(hw))
        rates = (h.bandwidth_efficiency, h.get("expert_bandwidth_efficiency"),
                 h.get("kv_bandwidth_efficiency"))  # fmt: skip
        cell = " / ".join(f"{float(r):.2f}" for r in rates)
        line = next(x for x in text.splitlines() if f" {hw} " in x)
        assert cell in line, (hw, cell, line)


def test_cli_eval_with_an_engine(capsys):
    from dcost.cli import main

    args = ["eval", "--hardware", "h200", "--model", "llama-3.3-70b", "--batch", "8"]
    assert main([*args, "--chips", "4", "--context", "1024", "--engine", "trtllm"]) == 0
    text = capsys.readouterr().out
    err = dcost.engines.engine_error("trtllm")
    assert f"off by {100 * err['median']:.0f} % median" in text
    assert main([*args, "--engine", "trtllm", "--calibrated"]) == 2
    assert "two profiles" in capsys.readouterr().err


def test_engines_page_table_is_the_shipped_summary():
    """docs/engines.md's held-out table (all runs and each engine) is ``heldout.toml``'s."""
    text = (pathlib.Path(__file__).parents[1] / "docs/engines.md").read_text(encoding="utf-8")
    tpot = dcost.engines.heldout()["tpot"]
    names = {"all": None, "vLLM": "vllm", "TensorRT-LLM": "trtllm", "SGLang": "sglang"}
    for label, key in names.items():
        s = tpot["overall"] if key is None else tpot["by_engine"][key]
        cells = [f"{s['rows']:,}", f"{100 * s['median']:.1f} %", f"{100 * s['p90']:.1f} %"]
        if key is None:
            cells[1:] = [f"**{c}**" for c in cells[1:]]
        row = f"| {label} | " + " | ".join(cells) + f" | {s['bias']:.2f} |"
        assert row in text, row


def test_heldout_summary_is_the_code_s(tmp_path):
    """The summary writer's table reads back as written, with the statistics of its rows."""
    from dcost.calibrate import engines as rebuild

    recs, skipped = silicon.records()
    pick = [r for r in recs if r["engine"] == "sglang" and r["hardware"] == "h100-sxm"][:8]
    p = silicon.predict_all(pick, family=False)
    costs = np.tile([5e-4, 1e-5, 1e-6, 2e-3], (len(pick), 1))
    table = rebuild.summary(p, costs, skipped)
    path = rebuild.write_summary(table, tmp_path / "heldout.toml")
    import tomllib

    back = tomllib.loads(path.read_text())["silicon"]
    ratio = p.engine(5e-4, 1e-5, 1e-6, 2e-3) / p.measured
    assert back["tpot"]["overall"]["median"] == pytest.approx(np.median(np.abs(ratio - 1)), 1e-4)
    assert back["tpot"]["by_engine"]["sglang"]["rows"] == len(pick)


# ---- your own measurements and intervals ---------------------------------------------------


def _decode_records(n=6):
    recs, _ = silicon.records()
    pick = [
        r
        for r in recs
        if r["engine"] == "trtllm" and r["serving"] == "decode" and r["hardware"] == "h200"
    ]
    return pick[:n]


@pytest.mark.slow
def test_fit_to_own_measurements_recovers_the_costs_that_made_them():
    """Measurements made by the model with a slower host (0.75 ms a step) and a 10 % slower
    HBM: the fit on six of them, from the shipped profile, predicts the other four closer than
    the prior does, and its residual falls."""
    from dcost.calibrate import user

    eng = dcost.engine("trtllm", hardware="h200")
    truth = eng.with_profile(
        profile={
            "step_overhead": 7.5e-4,
            "bandwidth_efficiency": 0.9 * eng.profile["bandwidth_efficiency"],
        }
    )
    recs = _decode_records(10)
    made = user.predict_offsets(user.prepare(recs, truth), np.zeros(len(user.FIELDS)))
    recs = [dict(r, value=float(v)) for r, v in zip(recs, made, strict=True)]
    cal = user.calibrate(recs[:6], eng)
    # six runs of one model on one chip: the step and layer costs are one direction there, and
    # the slower HBM is left in the residual (a fifth to a quarter of the prior's, depending on
    # how large the planted step cost is beside it)
    assert cal.residual_after < 0.25 * cal.residual_before
    rest = user.prepare(recs[6:], eng)
    zero = np.zeros(len(user.FIELDS))
    prior_err = np.abs(user.predict_offsets(rest, zero) / rest.measured - 1)
    mine = user.prepare(recs[6:], cal.engine)
    fitted_err = np.abs(user.predict_offsets(mine, zero) / mine.measured - 1)
    assert np.median(fitted_err) < 0.5 * np.median(prior_err)
    assert cal.engine.provenance["records"] == 6
    assert set(cal.identified) <= set(user.FIELDS)
    # the offsets a fit moves, applied to the prior, are the calibrated engine: predicting with
    # offsets z on the prior's cases equals predicting at zero on with_offsets(prior, z)'s
    z, _ = user.fit_offsets(user.prepare(recs, eng), rows=np.arange(10) < 6)
    moved = user.predict_offsets(user.prepare(recs[6:], user.with_offsets(eng, z)), zero)
    np.testing.assert_allclose(user.predict_offsets(rest, z), moved, rtol=1e-5)
    np.testing.assert_allclose(moved, user.predict_offsets(mine, zero), rtol=1e-3)
    # a profile that does not set attention's own rate (a hand-written one): the chip's
    # attention rate then moves with flops_efficiency, in the fit and in the saved engine alike
    bare = dcost.Engine(
        name=eng.name,
        version=eng.version,
        hardware_name=eng.hardware_name,
        profile={k: v for k, v in eng.profile.items() if k != "attention_efficiency"},
        precision_profile=eng.precision_profile,
        provenance={},
        scheduler=eng.scheduler,
    )
    z = np.zeros(len(user.FIELDS))
    z[user.FIELDS.index("flops_efficiency")] = -0.5
    long = [r for r in recs if float(r["prompt_tokens"]) > 4096]
    assert long  # attention over a long context: where its rate counts
    prior = user.prepare(long, bare)
    saved = user.prepare(long, user.with_offsets(bare, z))
    np.testing.assert_allclose(
        user.predict_offsets(prior, z), user.predict_offsets(saved, zero), rtol=1e-5
    )


def test_the_robust_residual_is_hubers_loss():
    """Half the square of ``_robust(r)`` is Huber's loss (``r^2/2`` within ``c``, ``c|r| -
    c^2/2`` beyond), its slope is continuous at ``c`` (finite differences), and ``_unrobust``
    undoes it."""
    from dcost.calibrate import user

    c = user.HUBER
    r = np.linspace(-6.0, 6.0, 241)
    rho = np.asarray(user._robust(jnp.asarray(r)))
    huber = np.where(np.abs(r) <= c, 0.5 * r * r, c * np.abs(r) - 0.5 * c * c)
    np.testing.assert_allclose(0.5 * rho**2, huber, rtol=1e-5, atol=1e-6)
    assert np.all(np.sign(rho) == np.sign(r))
    np.testing.assert_allclose(user._unrobust(rho), r, rtol=1e-5, atol=1e-6)
    h = 1e-3  # the loss's slope either side of c: r inside, c outside
    for x in (c - h, c + h):
        slope = (
            0.5 * float(user._robust(x + 1e-4)) ** 2 - 0.5 * float(user._robust(x - 1e-4)) ** 2
        ) / 2e-4
        assert slope == pytest.approx(min(x, c), rel=2e-3)


@pytest.mark.slow
def test_one_run_the_model_cannot_express_pulls_the_fit_a_bounded_way():
    """Ten runs made by the model with a 0.75 ms step cost, one of them reported 1.6x slower (a
    benchmark's error): fitted on all ten, the other nine are predicted within a median 2 % of
    what made them (least squares: 3.7-4.1 % as the odd run is the 1st, 4th or 8th; Huber's
    loss 1.1-1.2 %), and the odd run keeps most of its error (least squares chased it to 1.11x
    of what made it as the 4th, Huber's loss to 1.04x); the residual reported before and after
    is the log error, Huber's square root undone."""
    from dcost.calibrate import user

    eng = dcost.engine("trtllm", hardware="h200")
    truth = eng.with_profile(profile={"step_overhead": 7.5e-4})
    recs = _decode_records(10)
    made = user.predict_offsets(user.prepare(recs, truth), np.zeros(len(user.FIELDS)))
    value = made.copy()
    value[3] *= 1.6  # TPOT runs: slower
    odd = [dict(r, value=float(v)) for r, v in zip(recs, value, strict=True)]
    cal = user.calibrate(odd, eng)
    prep = user.prepare(recs, cal.engine)
    ratio = user.predict_offsets(prep, np.zeros(len(user.FIELDS))) / made
    clean = np.arange(10) != 3
    assert np.median(np.abs(ratio[clean] - 1.0)) < 0.02, ratio
    assert np.max(np.abs(ratio[clean] - 1.0)) < 0.06, ratio
    assert ratio[3] < 1.08  # the odd run stays about as far off as it was reported
    # the reported residual is the root-mean-square log error of the fitted runs
    got = user.predict_offsets(prep, np.zeros(len(user.FIELDS))) / value
    assert cal.residual_after == pytest.approx(np.sqrt(np.mean(np.log(got) ** 2)), rel=2e-3)
    assert cal.engine.provenance["loss"].startswith("Huber's")
    # least squares on the same runs chases the odd one further (the loss is one traced setting)
    plain = user.calibrate(odd, eng, robust=False)
    assert plain.engine.provenance["loss"] == "least squares"
    ratio_ls = user.predict_offsets(user.prepare(recs, plain.engine), np.zeros(len(user.FIELDS)))
    assert ratio_ls[3] / made[3] > ratio[3]
    with pytest.raises(dcost.SpecError, match="calibrate.robust = 'yes' is not allowed"):
        user.calibrate(odd, eng, robust="yes")


@pytest.mark.slow
def test_a_kv_offset_saved_is_the_offset_fitted_for_every_cache_and_kernel():
    """``with_offsets`` moves the KV rates as the fit moves the chip's: a logit offset on the
    rate a model reads at. DeepSeek-V3 with an 8-bit cache reads at the latent kernels' rate
    times their 8-bit ratio (TensorRT-LLM on H200: ``mla_fp8_kv_bandwidth_ratio`` < 1),
    gpt-oss-120b with a 16-bit cache at the GQA rate: the engine saved with the offset predicts
    what the fit's offset predicts, both; its ratios stay at most 1."""
    from dcost.calibrate import user

    eng = dcost.engine("trtllm", hardware="h200")
    assert eng.profile["mla_fp8_kv_bandwidth_ratio"] < 0.95
    recs, _ = silicon.records()

    def runs(model, kv):
        return [
            r
            for r in recs
            if r["engine"] == "trtllm"
            and r["hardware"] == "h200"
            and r["metric"] == "tpot"
            and (r["model"], r["kv_cache"]) == (model, kv)
        ][:3]

    picked = runs("deepseek-v3", "fp8") + runs("gpt-oss-120b", "bf16")
    assert len(picked) == 6
    z = np.zeros(len(user.FIELDS))
    z[user.FIELDS.index("kv_bandwidth_efficiency")] = -0.8
    moved = user.with_offsets(eng, z)
    for k in ("fp8_kv_bandwidth_ratio", "mla_fp8_kv_bandwidth_ratio"):
        assert 0.0 < moved.profile[k] <= 1.0
    zero = np.zeros(len(user.FIELDS))
    fitted = user.predict_offsets(user.prepare(picked, eng), z)
    saved = user.predict_offsets(user.prepare(picked, moved), zero)
    np.testing.assert_allclose(fitted, saved, rtol=1e-5)
    assert np.all(fitted > user.predict_offsets(user.prepare(picked, eng), zero))  # slower reads


def test_a_records_chip_is_memoized_per_engine_and_model():
    """``cases.case`` shares the chip of records alike (one object), computes it anew for
    another engine (even one equal in name and version), another model or another attention
    rate, and gives what applying the engine afresh gives."""
    import equinox as eqx

    from dcost.validation import cases

    recs, _ = silicon.records()
    r = next(x for x in recs if x["engine"] == "vllm" and x["metric"] == "tpot")
    eng = dcost.engine("vllm", hardware=r["hardware"])
    a, b = cases.case(r, engine=eng).hardware, cases.case(dict(r), engine=eng).hardware
    assert a is b
    slower = eng.with_profile(profile={"step_overhead": 1e-3})
    c = cases.case(r, engine=slower).hardware
    assert c is not a and float(c.step_overhead) == pytest.approx(1e-3) != float(a.step_overhead)
    other = next(x for x in recs if x["engine"] == "vllm" and x["model"] != r["model"])
    assert cases.case(dict(other, hardware=r["hardware"]), engine=eng).hardware is not a
    fresh = eng.apply(
        eqx.tree_at(
            lambda h: h.attention_flops,
            cases._chip(r["hardware"], r["compute"], ()),
            jnp.asarray(cases.attention_rate(r)),
            is_leaf=lambda x: x is None,
        ),
        model=cases._net(r["model"], r["weights"], r["kv_cache"]),
    )
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(fresh), strict=True):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


@pytest.mark.slow
def test_the_fit_settles_where_the_loss_is_flat():
    """Levenberg-Marquardt's answer on runs the model made at planted offsets: the loss's
    gradient (reverse mode, another derivative than the fit's forward-mode Jacobian) vanishes
    there, the loss is no higher than at the planted offsets, and the Gauss-Newton Hessian it
    returns is the exact Hessian within a few percent (the data residuals are nearly 0)."""
    import jax

    from dcost.calibrate import user

    eng = dcost.engine("trtllm", hardware="h200")
    recs = _decode_records(10)
    planted = np.zeros(len(user.FIELDS))
    planted[user.FIELDS.index("step_overhead")] = math.log(3.0)
    planted[user.FIELDS.index("bandwidth_efficiency")] = -0.3
    made = user.predict_offsets(user.prepare(recs, eng), planted)
    prep = user.prepare([dict(r, value=float(v)) for r, v in zip(recs, made, strict=True)], eng)
    args = user._arrays(prep)
    huber = user._huber(True)
    z, ggn, r_prior, r_fit = (np.asarray(x) for x in user._map(*args, user._prior_sd(), huber))
    # the residuals it returns are SIGMA-scaled log errors of the predictions under Huber's
    # square root, at 0 and at z (padding rows 0, the prior's rows last)
    for r, at in ((r_prior, np.zeros(z.size)), (r_fit, z)):
        logs = np.log(user.predict_offsets(prep, at) / prep.measured)
        rho = np.asarray(user._robust(jnp.asarray(logs / user.SIGMA)))
        # float32 logs of ratios near 1: two programs round them apart by ~1e-4 of the sum
        assert np.sum(r[: -z.size] ** 2) == pytest.approx(np.sum(rho**2), 1e-3)
        np.testing.assert_allclose(r[-z.size :], at / user._prior_sd(), rtol=1e-5, atol=1e-6)
    loss = lambda x: user._loss(*args, x, user._prior_sd(), huber)  # noqa: E731
    grad = np.asarray(jax.grad(loss)(jnp.asarray(z)))
    assert np.max(np.abs(grad)) < 1e-2 * np.max(
        np.abs(np.asarray(jax.grad(loss)(jnp.zeros(z.size))))
    )
    assert float(loss(jnp.asarray(z))) <= float(loss(jnp.asarray(planted))) * (1 + 1e-4)
    exact = np.asarray(jax.hessian(loss)(jnp.asarray(z)))
    assert np.all(np.linalg.eigvalsh(ggn) > 0)
    assert np.linalg.norm(ggn - exact) < 0.05 * np.linalg.norm(exact)


def test_with_offsets_moves_the_expert_parallel_cost_with_the_moe_layer_cost():
    """``moe_ep_overhead`` has no offset of its own (``user.TIED``): the MoE layer cost's moves
    it by the same factor, shared and a 4-bit class's own alike, in the saved profile and in the
    chips the fit evaluates."""
    import math

    from dcost.calibrate import user

    eng = dcost.engine("vllm", hardware="h200")
    z = np.zeros(len(user.FIELDS))
    z[user.FIELDS.index("moe_layer_overhead")] = math.log(0.5)
    moved = user.with_offsets(eng, z)
    for name in ("moe_layer_overhead", "moe_ep_overhead"):
        assert moved.profile[name] == pytest.approx(0.5 * eng.profile[name], rel=1e-6)
        own = eng.precision_profile["w4a16"][name]
        assert moved.precision_profile["w4a16"][name] == pytest.approx(0.5 * own, rel=1e-6)
    h = eng.apply(dcost.hardware("h200"))
    chip = user._apply(h, jnp.asarray(z))
    for name in ("moe_layer_overhead", "moe_ep_overhead"):
        assert float(getattr(chip, name)) == pytest.approx(0.5 * float(getattr(h, name)))


def test_with_offsets_moves_the_experts_hbm_rate_with_the_dense_one():
    """``expert_bandwidth_efficiency`` has no offset of its own (``user.TIED``): the dense HBM
    rate's logit offset moves it by the same logit, in the saved profile and in the chips the
    fit evaluates; a profile without it (one fitted on no MoE table) gets none."""
    from dcost.calibrate import user

    def logit(p):
        return np.log(p / (1.0 - p))

    eng = dcost.engine("vllm", hardware="h200")
    z = np.zeros(len(user.FIELDS))
    z[user.FIELDS.index("bandwidth_efficiency")] = -0.7
    moved = user.with_offsets(eng, z)
    for name in ("bandwidth_efficiency", "expert_bandwidth_efficiency"):
        assert logit(moved.profile[name]) == pytest.approx(logit(eng.profile[name]) - 0.7)
    h = eng.apply(dcost.hardware("h200"))
    chip = user._apply(h, jnp.asarray(z))
    got = float(chip.expert_bandwidth_efficiency)
    assert logit(got) == pytest.approx(logit(float(h.expert_bandwidth_efficiency)) - 0.7, rel=1e-4)
    a100 = dcost.engine("vllm", hardware="a100-80gb")
    bare = dataclasses.replace(
        a100, profile={k: v for k, v in a100.profile.items() if k != "expert_bandwidth_efficiency"}
    )
    assert "expert_bandwidth_efficiency" not in user.with_offsets(bare, z).profile


@pytest.mark.parametrize("z", [[0.0] * 7, [0.0] * 7 + [float("nan")], "abc", [[0.0] * 8]])
def test_with_offsets_refuses_bad_offsets(z):
    from dcost.calibrate import user

    eng = dcost.engine("trtllm", hardware="h200")
    with pytest.raises(ValueError, match="with_offsets: z = .* must be 8 finite numbers"):
        user.with_offsets(eng, z)
    with pytest.raises(EngineError, match="with_offsets: engine must be a dcost.Engine"):
        user.with_offsets("trtllm", [0.0] * 8)


def test_no_offset_leaves_the_prior_as_it_is():
    """Offsets of 0 move no field: a time field below ``_TIME_FLOOR`` (the grouped experts'
    ``expert_overhead``, a few 1e-8 s) keeps its own value, to the bit, in the chip a fit
    evaluates and in the engine it saves. An offset moves a field of at least the floor by its
    factor, and a smaller one (or one at 0) as the floor would: ``v0 + floor (e^z - 1)``."""
    from dcost.calibrate import user

    eng = dcost.engine("vllm", hardware="h100-sxm")
    v0 = eng.profile["expert_overhead"]
    assert 0.0 < v0 < user._TIME_FLOOR <= eng.profile["layer_overhead"]
    h = eng.apply(dcost.hardware("h100-sxm", precision="bf16"))
    same = user._apply(h, jnp.zeros(len(user.FIELDS)))
    for name, _ in user._moved():
        if getattr(h, name) is not None:
            assert float(same.get(name)) == float(h.get(name)), name
    saved = user.with_offsets(eng, np.zeros(len(user.FIELDS)))
    for name, value in eng.profile.items():  # a fraction's logit round trip: its last bit
        assert saved.profile[name] == pytest.approx(value, rel=1e-12, abs=0.0), name
    assert saved.profile["expert_overhead"] == v0
    doubled = np.zeros(len(user.FIELDS))
    for name in ("expert_overhead", "layer_overhead"):
        doubled[user.FIELDS.index(name)] = math.log(2.0)
    moved = user._apply(h, jnp.asarray(doubled))
    want = v0 + user._TIME_FLOOR
    assert float(moved.get("expert_overhead")) == pytest.approx(want, rel=1e-5)
    layer = 2.0 * eng.profile["layer_overhead"]
    assert float(moved.get("layer_overhead")) == pytest.approx(layer, rel=1e-5)
    saved = user.with_offsets(eng, doubled)
    assert saved.profile["expert_overhead"] == pytest.approx(want, rel=1e-12)
    assert saved.profile["layer_overhead"] == pytest.approx(layer, rel=1e-12)
    floor = float(user._moved_time(jnp.asarray(0.0), jnp.asarray(math.log(2.0))))
    assert floor == pytest.approx(user._TIME_FLOOR, rel=1e-6)
    assert float(user._moved_time(jnp.asarray(v0), jnp.asarray(-5.0))) == 0.0  # never below 0


@pytest.mark.slow
def test_moe_fixed_cost_offsets_are_the_saved_engine():
    """gpt-oss-120b's experts run weight-only on Hopper, a class with its own MoE-layer cost: an
    offset on the MoE layer's and each expert's fixed cost predicts what the engine
    ``with_offsets`` saves predicts at zero, and it moves an MoE model's step (by at most the
    costs it scales: a closed form) while a dense model's stays."""
    from dcost.calibrate import user

    eng = dcost.engine("vllm", hardware="h100-sxm")
    assert "moe_layer_overhead" in eng.precision_profile["w4a16"]
    recs, _ = silicon.records()
    moe = [
        r
        for r in recs
        if r["engine"] == "vllm" and r["hardware"] == "h100-sxm" and r["model"] == "gpt-oss-120b"
    ][:4]
    dense = [r for r in recs if r["engine"] == "trtllm" and r["model"] == "llama-3.3-70b"][:3]
    assert len(moe) == 4 and len(dense) == 3
    z = np.zeros(len(user.FIELDS))
    z[user.FIELDS.index("moe_layer_overhead")] = np.log(3.0)
    z[user.FIELDS.index("expert_overhead")] = np.log(2.0)
    zero = np.zeros(len(user.FIELDS))
    prep = user.prepare(moe, eng)
    base, moved = user.predict_offsets(prep, zero), user.predict_offsets(prep, z)
    saved = user.predict_offsets(user.prepare(moe, user.with_offsets(eng, z)), zero)
    np.testing.assert_allclose(moved, saved, rtol=1e-5)
    assert np.all(moved > base)
    # one step a token (aggregated, no speculation): the MoE layers' cost x3 adds twice that cost;
    # each expert's x2 adds once its cost (below the floor, the floor: ``_moved_time``) for the
    # experts a chip touches, at most all of them
    net = dcost.model("gpt-oss-120b")
    layers = float(net.moe_layers)
    cost = eng.precision_profile["w4a16"]["moe_layer_overhead"] * layers
    per_expert = max(eng.profile["expert_overhead"], user._TIME_FLOOR)
    every_expert = per_expert * float(net.n_experts) * layers
    assert all(r["serving"] == "aggregated" and r["metric"] == "tpot" for r in moe)
    assert np.all(moved - base >= 2.0 * cost * (1 - 1e-4))
    assert np.all(moved - base <= (2.0 * cost + every_expert) * (1 + 1e-4))
    flat = user.prepare(dense, dcost.engine("trtllm", hardware=dense[0]["hardware"]))
    np.testing.assert_allclose(
        user.predict_offsets(flat, z), user.predict_offsets(flat, zero), rtol=1e-6
    )


def test_interval_bands_a_prediction():
    rec = {k: v for k, v in _decode_records(1)[0].items() if k != "mode"}
    eng = dcost.engine("trtllm", hardware="h200")
    lo, mid, hi = dcost.validation.predict(rec, engine=eng, interval=0.8)
    assert lo < mid < hi
    assert mid == pytest.approx(dcost.validation.predict(rec, engine=eng))
    with pytest.raises(dcost.SpecError, match="interval needs an engine"):
        dcost.validation.predict(rec, interval=0.8)
    with pytest.raises(EngineError, match="interval level = 0.7"):
        dcost.validation.predict(rec, engine=eng, interval=0.7)


def test_shipped_intervals_hold_about_as_often_as_they_say():
    """The 80 % band, its levels chosen and its quantiles taken without the architecture checked
    (nested), holds 70-90 % of the runs of each engine whose runs span five architectures or more
    (the issue asks 75-85 %; vLLM's and TensorRT-LLM's seven). An engine with fewer (SGLang's
    four, DeepSeek's 70 % of its runs) may miss: its figure is the one docs/engines.md quotes,
    said there to be short or over. The levels widen the band, never narrow it below 80 %."""
    from dcost.calibrate.engines import architectures

    recs, _ = silicon.records()
    arch = architectures([r["model"] for r in recs])
    text = " ".join((pathlib.Path(__file__).parents[1] / "docs/engines.md").read_text().split())
    for name, table in dcost.engines.heldout()["intervals"].items():
        kinds = {arch[r["model"]] for r in recs if r["engine"] == name and r["metric"] == "tpot"}
        if len(kinds) >= 5:
            assert 0.7 <= table["coverage_80"] <= 0.9, name
        else:
            cover = 100 * table["coverage_80"]
            said = "less than it says" if cover < 75 else "more than it says"
            assert f"holds **{cover:.1f} %, {said}" in text, (name, cover)
        assert table["q05"] < table["q10"] < table["q50"] < table["q90"] < table["q95"]
        assert table["level_q90"] - table["level_q10"] >= 0.8 - 1e-9, name


def test_a_calibrated_engine_gets_the_band_of_deployments_calibrated_like_it():
    """An engine fitted to n of a deployment's runs is banded by the held-out errors of
    deployments fitted to the largest k <= n of theirs (narrower than a new model's band); a
    shipped profile, or one whose provenance is not a fit, by the shipped band; each shipped
    band's nested coverage is within 70-90 % at 80 %."""
    from dcost.calibrate import user

    eng = dcost.engine("vllm", hardware="h100-sxm")
    own = dcost.engines.own_measurements()["intervals"]["vllm"]

    def fitted(n, source="dcost.calibrate.fit: your measurements"):
        prov = {"source": source, "records": n}
        return user.with_offsets(eng, np.zeros(len(user.FIELDS)), prov)

    def factors(table):
        return math.exp(-table["q90"]), math.exp(-table["q10"])

    shipped = dcost.engines.interval_factors("vllm", 0.8)
    assert dcost.engines.interval_factors(eng, 0.8) == shipped
    assert dcost.engines.interval_factors(fitted(5, "hand-written"), 0.8) == shipped
    assert dcost.engines.interval_factors(fitted(2), 0.8) == pytest.approx(factors(own["1"]))
    three = dcost.engines.interval_factors(fitted(3), 0.8)
    assert three == pytest.approx(factors(own["3"]))
    assert dcost.engines.interval_factors(fitted(40), 0.8) == pytest.approx(factors(own["10"]))
    assert three[1] / three[0] < shipped[1] / shipped[0]
    assert dcost.engines.confidence_factor(fitted(3), 0.9) == pytest.approx(
        math.exp(-own["3"]["q10"])
    )
    for name, bands in dcost.engines.own_measurements()["intervals"].items():
        for k, table in bands.items():
            assert 0.7 <= table["coverage_80"] <= 0.9, (name, k)
            assert table["q10"] < table["q50"] < table["q90"], (name, k)


def test_adjusted_levels_cover_new_groups_as_they_say():
    """Errors shared within a group (a model's runs): the plain 10-90 % quantiles of 6 groups'
    runs hold about 72 % of a new group's, the levels ``adjusted_level`` chooses by leaving a
    group out about 80 % (mean over 60 draws of the groups; a closed form for the new group: the
    normal with the group and run spreads added)."""
    from dcost.calibrate.engines import adjusted_level

    plain, adjusted = [], []
    sd = math.hypot(1.0, 0.3)
    cdf = lambda x: 0.5 * (1.0 + math.erf(x / (sd * math.sqrt(2.0))))  # noqa: E731
    for seed in range(60):
        rng = np.random.default_rng(seed)
        group = np.repeat(np.arange(6), 60)
        r = rng.normal(size=6)[group] + 0.3 * rng.normal(size=group.size)
        lo, hi = np.quantile(r, [0.1, 0.9])
        plain.append(cdf(hi) - cdf(lo))
        levels = [adjusted_level(r, group, a) for a in (0.1, 0.9)]
        lo, hi = np.quantile(r, levels)
        adjusted.append(cdf(hi) - cdf(lo))
    assert np.mean(plain) < 0.76
    assert abs(np.mean(adjusted) - 0.8) < 0.03


def test_plan_at_a_confidence_costs_chips():
    t = dcost.traffic("chat", rate=20.0)
    base = dcost.plan("h100-sxm", "llama-3.1-8b", t, engine="vllm")
    sure = dcost.plan("h100-sxm", "llama-3.1-8b", t, engine="vllm", confidence=0.95)
    assert sure.chips >= base.chips
    with pytest.raises(EngineError, match="needs an engine"):
        dcost.plan("h100-sxm", "llama-3.1-8b", t, confidence=0.9)


@pytest.mark.slow
def test_a_profile_without_moe_costs_calibrates():
    """A profile without MoE-layer costs (one fitted on no MoE table; here TensorRT-LLM's A100
    profile without them): a fit to published runs of a dense model there leaves those costs
    unset, says the data did not identify them, and its offsets are still the saved engine's."""
    from dcost.calibrate import user
    from dcost.validation import load

    shipped = dcost.engine("trtllm", hardware="a100-80gb")
    moe = (
        "moe_layer_overhead",
        "moe_ep_overhead",
        "expert_overhead",
        "expert_bandwidth_efficiency",
    )
    eng = dataclasses.replace(
        shipped, profile={k: v for k, v in shipped.profile.items() if k not in moe}
    )
    assert "moe_layer_overhead" not in eng.profile
    recs = [
        r
        for r in load()
        if r["source_id"] == "trtllm-perf-v0.6"
        and r["hardware"] == "a100-80gb"
        and r["metric"] != "ttft"
    ]
    assert len(recs) >= 3
    cal = user.calibrate(recs, eng)
    assert cal.engine.provenance["models"] == ["llama-2-70b"]
    assert "moe_layer_overhead" not in cal.engine.profile
    assert cal.posterior_sd["moe_layer_overhead"] == pytest.approx(1.0, rel=1e-6)
    assert "moe_layer_overhead" not in cal.identified
    assert np.isfinite(cal.residual_after) and cal.residual_after <= cal.residual_before
    z, _ = user.fit_offsets(user.prepare(recs, eng))
    zero = np.zeros(len(user.FIELDS))
    np.testing.assert_allclose(
        user.predict_offsets(user.prepare(recs, eng), z),
        user.predict_offsets(user.prepare(recs, cal.engine), zero),
        rtol=1e-3,
    )


@pytest.mark.slow
def test_published_k_curve_is_what_its_groups_give():
    """The shipped curve on published sources (``own_measurements.toml``) is what its groups
    give: the same groups (a source's runs on one chip under the one engine its text names, 4
    or more, no TTFT) and, at k = 0, each group's median error of the shipped profile."""
    import importlib.util

    from dcost.calibrate import user
    from dcost.validation import load
    from dcost.validation.cases import record_engine

    experiments = pathlib.Path(__file__).parents[1] / "experiments"
    if str(experiments) not in sys.path:
        sys.path.insert(0, str(experiments))  # its _common
    spec = importlib.util.spec_from_file_location(
        "own_measurements", experiments / "own_measurements.py"
    )
    exp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(exp)
    assert exp.served_by({"note": "TensorRT-LLM 1.0 on 8 GPUs"}) == "trtllm"
    assert exp.served_by({"note": "SGLang against vLLM"}) is None  # two named: unknown
    assert exp.served_by({"note": "an engine"}) is None
    shipped = dcost.engines.own_measurements()["published"]
    groups = exp.published_groups(load())
    assert sorted("/".join(k) for k in groups) == sorted(shipped["by_group"])
    assert shipped["k"]["0"]["rows"] == sum(len(v) for v in groups.values())
    for key, rows in groups.items():
        assert all(r["metric"] != "ttft" for r in rows) and len(rows) >= exp.MIN_ROWS
        eng = record_engine(rows[0])[0]
        runtime = shipped["by_group"]["/".join(key)]["runtime"]
        # TensorRT engines (the records name the TensorRT version) carry no Python host costs
        lean = all(exp.C.runs_tensorrt_engines(r) for r in rows)
        assert runtime == ("TensorRT engines" if lean else "as profiled")
        if lean:
            eng = exp.C.without_host_costs(eng, ("prefill_step_overhead", "sequence_overhead"))
            chip = dcost.hardware(rows[0]["hardware"])
            assert eng.fields(chip)["prefill_step_overhead"] == 0.0
            assert eng.fields(chip)["sequence_overhead"] == 0.0
        prep = user.prepare(rows, eng)
        err = np.abs(user.predict_offsets(prep, np.zeros(len(user.FIELDS))) / prep.measured - 1)
        got = shipped["by_group"]["/".join(key)]["median_by_k"]["0"]
        assert float(np.median(err)) == pytest.approx(got, rel=1e-3)


def test_docs_band_table_is_the_shipped_bands():
    """docs/engines.md's table of 80 % bands is what ``interval_factors`` gives for the shipped
    profile and for engines calibrated on k = 1, 3, 10 runs, with the coverage beside it."""
    import re

    text = (pathlib.Path(__file__).parents[1] / "docs/engines.md").read_text(encoding="utf-8")
    shipped = dcost.engines.heldout()["intervals"]
    own = dcost.engines.own_measurements()["intervals"]

    def band(t):
        return f"x{math.exp(-t['q90']):.2f} to x{math.exp(-t['q10']):.2f}"

    labels = {"vllm": "vLLM", "trtllm": "TensorRT-LLM", "sglang": "SGLang"}
    for name, label in labels.items():
        assert band(shipped[name]) == "x{:.2f} to x{:.2f}".format(
            *dcost.engines.interval_factors(name, 0.8)
        )
        cells = [band(shipped[name])] + [band(own[name][k]) for k in ("1", "3", "10")]
        cover = " / ".join(f"{100 * own[name][k]['coverage_80']:.1f}" for k in ("1", "3", "10"))
        row = f"| {label} | " + " | ".join(cells) + f" | {cover} % |"
        assert row in text, row
    found = re.search(
        r"band held (\d+) % of their runs\s+uncalibrated, but a calibrated deployment's held "
        r"only (\d+) % \(k = 1\) and (\d+) % \(k = 3\)",
        text,
    )
    assert found
    cov = dcost.engines.own_measurements()["published"]["coverage_80"]
    assert found.groups() == tuple(f"{100 * cov[k]:.0f}" for k in ("0", "1", "3"))
    split = re.search(
        r"one model, as a deployment is, the band held (\d+) % and (\d+) % of its other runs; "
        r"where\s+it mixes models, (\d+) % and (\d+) %",
        text,
    )
    assert split
    pub = dcost.engines.own_measurements()["published"]
    one, several = pub["coverage_80_one_model"], pub["coverage_80_several_models"]
    want = [f"{100 * c[k]:.0f}" for c in (one, several) for k in ("1", "3")]
    assert list(split.groups()) == want


def test_a_profile_calibrated_on_several_architectures_gets_the_shipped_band():
    """``interval_factors`` of a profile calibrated on 3 runs: the calibrated deployments' band
    when the runs are of one architecture (two names of DeepSeek-V3's network count as one),
    the shipped profile's when they are of several or of a model that is no preset."""
    eng = dcost.engine("vllm", hardware="h100-sxm")

    def calibrated(models):
        prov = {"source": "dcost.calibrate.fit: test", "records": 3, "models": models}
        return eng.with_profile(provenance=prov)

    own = dcost.engines.own_measurements()["intervals"]["vllm"]["3"]
    deployment = (math.exp(-own["q90"]), math.exp(-own["q10"]))
    shipped = dcost.engines.interval_factors("vllm", 0.8)
    assert deployment != pytest.approx(shipped)
    for models, want in (
        (["llama-3.1-8b"], deployment),
        (["deepseek-v3", "deepseek-r1"], deployment),
        (["llama-3.1-8b", "qwen3-32b"], shipped),
        (["llama-3.1-8b", "my-own-model"], shipped),
    ):
        got = dcost.engines.interval_factors(calibrated(models), 0.8)
        assert got == pytest.approx(want, rel=1e-12), models
        assert dcost.engines.band_runs(calibrated(models)) == (3 if want == deployment else 0)
    assert dcost.engines.band_runs(eng) == 0  # a shipped profile
    cov = dcost.engines.own_measurements()["published"]
    assert min(cov["coverage_80_several_models_shipped_band"][k] for k in ("1", "3")) > max(
        cov["coverage_80_several_models"][k] for k in ("1", "3")
    )


def test_engines_page_k_tables_are_the_shipped_curves():
    """docs/engines.md's two tables of error against k own runs (the silicon sample's
    deployments and the published groups) are ``own_measurements.toml``'s, so a rerun that moves
    them fails here until the page says so."""
    text = (pathlib.Path(__file__).parents[1] / "docs/engines.md").read_text(encoding="utf-8")
    own = dcost.engines.own_measurements()
    labels = {"0": "0 (shipped profile)", "1": "1", "3": "3", "10": "10"}
    for curve in (own["k"], own["published"]["k"]):
        for k, label in labels.items():
            if k not in curve or (curve is own["published"]["k"] and k == "10"):
                continue  # the published groups' k = 10 is one group's five runs
            s = curve[k]
            cells = [f"{s['rows']:,}", f"{100 * s['median']:.1f} %", f"{100 * s['p90']:.1f} %"]
            if k == "3":
                cells[1:] = [f"**{c}**" for c in cells[1:]]
            row = f"| {label} | " + " | ".join(cells) + " |"
            assert row in text, row


def test_engines_page_nested_coverage_table_is_the_shipped_one():
    """docs/engines.md's table of how often each band held a new architecture's runs (nested)
    and the 80 % band it puts on a prediction are ``heldout.toml``'s and ``interval_factors``'."""
    from dcost.calibrate.engines import architectures

    text = (pathlib.Path(__file__).parents[1] / "docs/engines.md").read_text(encoding="utf-8")
    shipped = dcost.engines.heldout()["intervals"]
    names = ("vllm", "trtllm", "sglang")
    recs, _ = silicon.records()
    arch = architectures([r["model"] for r in recs])
    kinds = [
        len({arch[r["model"]] for r in recs if r["engine"] == n and r["metric"] == "tpot"})
        for n in names
    ]
    head = f"| band | vLLM ({kinds[0]} architectures) | TensorRT-LLM ({kinds[1]}) | "
    assert head + f"SGLang ({kinds[2]}) |" in text
    for level in ("50", "80", "90"):
        cells = [f"{100 * shipped[n][f'coverage_{level}']:.1f} %" for n in names]
        if level == "80":
            cells = [f"**{c}**" for c in cells]
        row = f"| {level} % | " + " | ".join(cells) + " |"
        assert row in text, row
    bands = ["x{:.2f} to x{:.2f}".format(*dcost.engines.interval_factors(n, 0.8)) for n in names]
    assert "| 80 % band on a prediction | " + " | ".join(bands) + " |" in text


def test_a_fit_takes_its_prior_spread_as_an_argument():
    """``fit_offsets(..., prior_sd=s)``: on records made by a planted offset (a cost a layer 3x
    the prior's), a wide prior fits them (its predictions within 1 %; which fields carry the offset
    the records do not say), a prior a thousand times narrower keeps every offset near 0 and the
    predictions where the prior had them (the MAP's shrinkage), both from one compiled program;
    a spread that is not one positive number a field is refused naming it."""
    from dcost.calibrate import user

    eng = dcost.engine("trtllm", hardware="h200")
    recs = _decode_records(10)
    planted = np.zeros(len(user.FIELDS))
    planted[user.FIELDS.index("layer_overhead")] = math.log(3.0)
    made = user.predict_offsets(user.prepare(recs, eng), planted)
    prep = user.prepare([dict(r, value=float(v)) for r, v in zip(recs, made, strict=True)], eng)
    wide = user.fit_offsets(prep, prior_sd=10.0 * user._prior_sd())[0]
    narrow = user.fit_offsets(prep, prior_sd=1e-3 * user._prior_sd())[0]
    prior = user.predict_offsets(prep, np.zeros(len(user.FIELDS)))
    assert np.max(np.abs(prior / made - 1.0)) > 0.05  # the planted cost shows
    np.testing.assert_allclose(user.predict_offsets(prep, wide), made, rtol=0.01)
    assert np.max(np.abs(narrow)) < 0.01
    np.testing.assert_allclose(user.predict_offsets(prep, narrow), prior, rtol=0.01)
    for bad in ([1.0, 2.0], -user._prior_sd(), np.full(len(user.FIELDS), np.nan)):
        with pytest.raises(ValueError, match="prior_sd"):
            user.fit_offsets(prep, prior_sd=bad)


def test_engines_page_counts_what_is_not_expressed_as_shipped():
    """docs/engines.md's count of the runs and metrics counted out, and each reason's count
    (by its first words), are ``heldout.toml``'s ``[silicon.skipped]``."""
    import tomllib

    root = pathlib.Path(__file__).parents[1]
    text = " ".join((root / "docs/engines.md").read_text(encoding="utf-8").split())
    skipped = tomllib.loads((root / "dcost/engines/heldout.toml").read_text())["silicon"]["skipped"]
    assert f"**Not expressed**: {sum(skipped.values()):,} runs or metrics are counted out" in text
    said = {
        "TTFT under load": "TTFT under load (",
        "disaggregated: decode workers": "whose decode workers are not stated (",
        "a run the sample lists twice": "runs the sample lists twice (",
        "tp_size disagrees": "contradicts the run's id (",
        "tensor_parallel does not divide": "or the model's heads (",
        "moe_tp_size x moe_ep_size": "than attention (",
        "quantization ['int4_wo']": "quantization (",
        "most likely speculative": "runs most likely speculative (",
        "batch_size is below": "is below their clients (",
        "fewer sequences": "fewer sequences than attention groups (",
    }
    for reason, n in skipped.items():
        phrase = next(v for k, v in said.items() if reason.startswith(k))
        assert f"{phrase}{n:,}" in text, (reason, n)


def test_a_record_s_engine_schedules_as_its_version_or_its_date_did():
    """vLLM turned async scheduling on by default in 0.14 (``schedulers.toml``'s ``since``):
    the silicon sample's vLLM runs of 0.12 run without it, of 0.19 with it, and its runs of an
    unstated version measured before 0.14 was out (``since_date``) without it."""
    from dcost.validation import silicon
    from dcost.validation.cases import record_engine

    recs, _ = silicon.records(count_out=False)
    vllm = [r for r in recs if r.get("engine") == "vllm" and r["metric"] == "tpot"]

    def first(test):
        return next(r for r in vllm if test(r))

    old = first(lambda r: r.get("engine_version") == "0.12.0")
    new = first(lambda r: r.get("engine_version") == "0.19.0")
    undated = first(lambda r: "engine_version" not in r and r.get("measured", "9") < "2026-01-21")
    assert record_engine(old)[0].scheduler.async_scheduling is False
    assert record_engine(new)[0].scheduler.async_scheduling is True
    assert record_engine(undated)[0].scheduler.async_scheduling is False
    assert record_engine({**undated, "measured": "2026-04-06"})[0].scheduler.async_scheduling
