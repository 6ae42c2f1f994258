"""dcost.calibrate.moe_timing: the timed MoE step computes what it claims (against float64
references), its grouped matmul reads the experts its layout names, its counts agree with the
preset's card and with dcost's occupancy formula, and the shipped H200 timings follow the
experts-touched term better than the alternatives it replaces."""

import importlib.util
import json
import math
import pathlib
import tomllib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcost import presets
from dcost.calibrate import decode_timing as dt
from dcost.calibrate import families
from dcost.calibrate import moe_timing as mt
from dcost.serving.moe import expert_fraction
from dcost.validation import check_record, load, predict

ROOT = pathlib.Path(__file__).resolve().parents[1]
ARCH = mt.MoEArchitecture(2, 32, 4, 2, 8, 8, 2, 16, 40)


def _ffn_reference(y, w1, w3, w2, idx, gate):
    y, w1, w3, w2 = (np.asarray(a, np.float64) for a in (y, w1, w3, w2))
    out = np.zeros_like(y)
    for b in range(y.shape[0]):
        for j in range(idx.shape[1]):
            e = int(idx[b, j])
            h1, h3 = y[b] @ w1[e], y[b] @ w3[e]
            out[b] += float(gate[b, j]) * (h1 / (1 + np.exp(-h1)) * h3) @ w2[e]
    return out


@pytest.mark.parametrize("batch, n_experts, k", [(1, 8, 2), (5, 8, 2), (9, 4, 3), (40, 16, 4)])
def test_dispatch_lays_out_every_pair_once_by_expert(batch, n_experts, k):
    rng = np.random.default_rng(batch)
    idx = np.stack([rng.choice(n_experts, k, replace=False) for _ in range(batch)])
    block = 16
    rows, block_expert, pos = (
        np.asarray(a) for a in mt.dispatch(jnp.asarray(idx), n_experts, block)
    )
    counts = np.bincount(idx.ravel(), minlength=n_experts)
    used = int(np.sum(-(-counts // block)))
    assert block_expert.shape == (-(-batch * k // block) + min(n_experts, batch * k),)
    assert np.all(block_expert[used:] == -1) and np.all(np.diff(block_expert[:used]) >= 0)
    for e in range(n_experts):  # each expert's blocks: as many as its pairs need
        assert np.sum(block_expert == e) == -(-counts[e] // block)
    assert len(set(pos.ravel().tolist())) == batch * k  # one row per pair
    for b in range(batch):
        for j in range(k):
            r = pos[b, j]
            assert rows[r] == b and block_expert[r // block] == idx[b, j]
    assert np.sum(rows < batch) == batch * k  # the rest pad (the zero row B)


@pytest.mark.parametrize("impl", ["pallas", "ragged", "gather"])
def test_expert_ffn_matches_a_float64_reference(impl):
    w = mt.init_weights(ARCH, dtype=jnp.float32)["layers"][1]
    y = jax.random.normal(jax.random.PRNGKey(3), (11, ARCH.d_model))
    idx, gate = mt.route(y, w["wr"], ARCH.experts_active)
    args = (y, w["w1"], w["w3"], w["w2"], idx, gate)
    got = mt.expert_ffn(*args, impl=impl, interpret=True)
    np.testing.assert_allclose(got, _ffn_reference(*args), rtol=2e-5, atol=2e-6)


def test_routing_takes_the_top_k_and_normalizes_their_gates():
    y = jax.random.normal(jax.random.PRNGKey(4), (6, 32))
    wr = jax.random.normal(jax.random.PRNGKey(5), (32, 8))
    idx, gate = mt.route(y, wr, 3)
    logits = np.asarray(y @ wr, np.float64)
    top = np.argsort(-logits, 1)[:, :3]
    np.testing.assert_array_equal(np.sort(np.asarray(idx), 1), np.sort(top, 1))
    chosen = np.take_along_axis(logits, np.asarray(idx), 1)
    want = np.exp(chosen - chosen.max(1, keepdims=True))
    np.testing.assert_allclose(gate, want / want.sum(1, keepdims=True), rtol=1e-5)


def test_decode_step_kernel_agrees_with_the_gather_reference_and_counts_touched_experts():
    w = mt.init_weights(ARCH, dtype=jnp.float32)
    cache = dt.init_cache(ARCH, 7, 5, dtype=jnp.float32)
    tokens = jnp.array([0, 3, 9, 17, 21, 33, 39])
    step = jax.jit(mt.decode_step, static_argnums=(3, 4, 5, 6))
    logits, touched = step(w, cache, tokens, ARCH, "pallas", None, True)
    ref, ref_touched = step(w, cache, tokens, ARCH, "gather", None, True)
    np.testing.assert_allclose(logits, ref, rtol=1e-4, atol=1e-5)
    np.testing.assert_array_equal(touched, ref_touched)
    assert touched.shape == (ARCH.n_layers,)
    assert np.all((touched >= ARCH.experts_active) & (touched <= ARCH.n_experts))
    # without the experts' matmuls the step differs (the floor the benchmark subtracts)
    skipped, _ = step(w, cache, tokens, ARCH, "skip", None, True)
    assert not np.allclose(skipped, logits, rtol=1e-3)


def test_grouped_matmul_reads_each_blocks_expert_and_writes_zeros_past_the_last():
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.normal(size=(48, 64)), jnp.float32)
    w = jnp.asarray(rng.normal(size=(5, 64, 32)), jnp.float32)
    be = jnp.array([4, 0, -1], jnp.int32)
    got = np.asarray(mt.grouped_matmul(x, w, be, block=16, bn=16, bk=32, interpret=True))
    want = np.zeros((48, 32))
    for blk, e in enumerate([4, 0]):
        want[16 * blk : 16 * blk + 16] = np.asarray(x, np.float64)[16 * blk : 16 * blk + 16] @ w[e]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"block": 12}, "block = 12"),
        ({"block": 16, "bn": 24}, "bn = 24"),
        ({"block": 16, "bk": 8}, "bk = 8"),
        ({"block": 32}, "block divide"),
    ],
)
def test_grouped_matmul_refuses_tiles_it_cannot_run(kwargs, match):
    x, w = jnp.zeros((48, 64)), jnp.zeros((5, 64, 32))
    with pytest.raises(ValueError, match=match):
        mt.grouped_matmul(x, w, jnp.zeros((3,), jnp.int32), interpret=True, **kwargs)


@pytest.mark.parametrize(
    "blocks, k, n", [(9, 2048, 768), (192, 2048, 768), (9, 768, 2048), (2, 64, 48), (300, 96, 80)]
)
def test_default_tiles_divide_the_weight_and_fill_the_chip_where_they_can(blocks, k, n):
    bn, bk = mt.default_tiles(blocks, k, n)
    assert n % bn == 0 and k % bk == 0 and bn >= 16 and bk >= 16
    assert bn & (bn - 1) == 0 and bk & (bk - 1) == 0
    wider = [t for t in (128, 64, 32) if t > bn and n % t == 0]
    assert all(blocks * (n // t) < mt.PROGRAMS for t in wider)  # none wider makes enough


def test_counts_agree_with_the_card_and_the_cost_models_occupancy():
    a = mt.moe_architecture("qwen3-30b-a3b")
    card = presets.model_card("qwen3-30b-a3b")
    everything = mt.params_read(a, a.n_experts) + a.vocab * a.d_model  # + the embedding table
    assert everything == pytest.approx(card["published"]["params_total"], rel=2e-3)
    non_embedding = everything - 2 * a.vocab * a.d_model  # the card's 29.9B
    assert non_embedding == pytest.approx(29.9e9, rel=2e-3)
    for b in (1, 3, 16, 200):
        want = a.n_experts * float(expert_fraction(b, a.n_experts, a.experts_active))
        assert mt.expected_touched(a, b) == pytest.approx(want, rel=1e-6)
    assert mt.expected_touched(a, 1) == a.experts_active


@pytest.mark.parametrize("model", ["llama-3.1-8b", "deepseek-v3", "gpt-oss-120b"])
def test_models_it_cannot_time_are_refused(model):
    with pytest.raises(ValueError, match=f"model = '{model}' is not allowed"):
        mt.moe_architecture(model)


@pytest.mark.parametrize(
    "field, value", [("n_experts", 0), ("experts_active", 9), ("n_kv_heads", 3), ("d_model", 2.0)]
)
def test_bad_architecture_is_refused(field, value):
    fields = dict(
        n_layers=1,
        d_model=32,
        n_heads=4,
        n_kv_heads=2,
        d_head=8,
        n_experts=8,
        experts_active=2,
        d_ff_expert=16,
        vocab=40,
    )
    fields[field] = value
    with pytest.raises(ValueError, match=field):
        mt.MoEArchitecture(**fields)


def test_records_are_valid_predictable_and_not_fitted():
    timings = [
        {
            "batch": b,
            "context": 1024,
            "seconds": 0.01 * b,
            "touched": mt.expected_touched(mt.moe_architecture("qwen3-30b-a3b"), b),
            "expected_touched": 0.0,
            "bytes": 1.0,
        }
        for b in (1, 16)
    ]
    recs = mt.to_records(
        timings,
        hardware="h200",
        model="qwen3-30b-a3b",
        source="dcost@x:y",
        source_id="dcost-jax-moe-decode",
        device="cpu",
        software="jax",
    )
    assert [r["concurrency"] for r in recs] == [1, 16]
    for r in recs:
        check_record(r)
        assert families.bare_kernels(r) and not families.fitted(r)
        assert math.isfinite(predict(r, calibrated=True))
    with pytest.raises(ValueError, match="repeats"):
        mt.time_decode(ARCH, [(1, 4)], repeats=0)
    with pytest.raises(ValueError, match="impl"):
        mt.time_decode(ARCH, [(1, 4)], impl="dense")


def _shipped():
    run = json.loads((ROOT / "benchmarks/results/moe_decode_h200.json").read_text())
    records = [r for r in load() if r["source_id"] == "dcost-jax-moe-decode"]
    return run, records


def test_shipped_records_are_the_runs_timings_and_pure_physics_bounds_them():
    run, records = _shipped()
    assert len(records) == len(run["timings"]) == 9
    by_shape = {(r["concurrency"], r["prompt_tokens"]): r for r in records}
    for t in run["timings"]:
        r = by_shape[(t["batch"], t["context"])]
        assert r["value"] == t["seconds"] and f"{t['touched']:.1f} of 128" in r["quote"]
        assert predict(r) <= r["value"]  # the roofline is a bound on a real chip


def test_measured_expert_time_follows_the_experts_touched():
    """The experts' time on the lent H200 (each step less the same step without the experts'
    matmuls) against three laws of the weight read, each fitted as ``t0 + c x``: the experts
    the step touched, every expert, and one read per (token, expert) pair. The touched count
    must fit within a millisecond and far better than the others, at a marginal rate no faster
    than the chip streamed in the same run."""
    run, _ = _shipped()
    skip = {(t["batch"], t["context"]): t["seconds"] for t in run["skip"]}
    shapes = [(t["batch"], t["context"]) for t in run["timings"]]
    y = np.array([t["seconds"] - skip[(t["batch"], t["context"])] for t in run["timings"]])
    touched = np.array([t["touched"] for t in run["timings"]])
    batch = np.array([b for b, _ in shapes], float)

    def fit(x):
        a = np.stack([np.ones_like(x), x], 1)
        coef, *_ = np.linalg.lstsq(a, y, rcond=None)
        return coef, float(np.sqrt(np.mean((a @ coef - y) ** 2)))

    (t0, per_expert), rms = fit(touched)
    _, rms_all = fit(np.full_like(touched, 128.0))
    _, rms_pairs = fit(8.0 * batch)
    assert rms < 1e-3 and rms < rms_all / 4 and rms < rms_pairs / 3
    a = mt.moe_architecture("qwen3-30b-a3b")
    expert_bytes = a.n_layers * 3 * a.d_model * a.d_ff_expert * 2
    rate = expert_bytes / per_expert
    assert (
        0.5 * run["ceilings"]["read_bytes_per_s"]
        < rate
        < 1.05 * run["ceilings"]["read_bytes_per_s"]
    )
    assert 0 < t0 < 3e-3  # the three launches a layer, not a second weight read


def test_quick_benchmark_times_steps_on_cpu(tmp_path):
    """The benchmark end to end on a tiny architecture (Pallas in its interpreter): a step and
    its floor per shape, the touched count from the step's own routing, valid records."""
    spec = importlib.util.spec_from_file_location(
        "moe_bench", ROOT / "benchmarks/moe_decode_records.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out, raw = tmp_path / "moe.toml", tmp_path / "moe.json"
    assert bench.main(["--quick", "--repeats", "1", "--out", str(out), "--json", str(raw)]) == 0
    run = json.loads(raw.read_text())
    assert [(t["batch"], t["context"]) for t in run["timings"]] == bench.QUICK_SHAPES
    assert len(run["skip"]) == len(bench.QUICK_SHAPES)
    again = run["first_again"]
    assert (again["batch"], again["context"]) == bench.QUICK_SHAPES[0] and again["seconds"] > 0
    first = run["timings"][0]
    assert first["batch"] == 1 and first["touched"] == bench.QUICK_ARCH.experts_active
    for t in run["timings"]:
        assert t["seconds"] > 0 and t["touched"] <= bench.QUICK_ARCH.n_experts
    records = tomllib.loads(out.read_text())["record"]
    assert len(records) == len(bench.QUICK_SHAPES)
    for r in records:
        check_record(r)


def test_benchmark_refuses_a_model_too_large_for_the_device(monkeypatch, capfd):
    """Before any weight is made: a device whose memory cannot hold the model's bf16 weights."""
    spec = importlib.util.spec_from_file_location(
        "moe_bench", ROOT / "benchmarks/moe_decode_records.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    class Small:
        platform, device_kind = "gpu", "a small accelerator"

        def memory_stats(self):
            return {"bytes_limit": 40 * 2**30}

    monkeypatch.setattr(bench.jax, "devices", lambda: [Small()])
    with pytest.raises(SystemExit) as exit_:
        bench.main(["--model", "qwen3-30b-a3b", "--time-limit", "60"])
    err = capfd.readouterr().err
    assert exit_.value.code == 2 and "(57 GiB) do not fit this device's 40 GiB" in err
