"""Tests of dcost.calibrate: the toy transformer's counts against hand counts, the array sizes and
XLA's own FLOP count; the measured numbers; the structure of the prediction; the CLI. Timing ratios
are reported, never asserted (a loaded CI box makes them flaky)."""

import contextlib
import io
import json
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost
from dcost.calibrate import local as cal
from dcost.cli.app import main

# L=2, d=128, heads 4, d_ff=512, V=1024, T=16 (cal.QUICK)
HAND_N = 2 * (4 * 128 * 128 + 2 * 128 * 512) + 128 * 1024  # = 524,288
HAND_FLOPS = 2 * HAND_N + 4 * 2 * 128 * 16  # 2N + 4*L*d*T
HAND_KV = 2 * 2 * 128 * 4  # 2*L*d*4 bytes (float32)


def test_toy_counts_equal_hand_counts():
    assert HAND_N == 524288
    m = cal.toy_model(cal.QUICK)
    assert float(m.params_active) == HAND_N
    assert float(m.kv_bytes_per_token) == HAND_KV
    assert cal.toy_flops_per_token(cal.QUICK) == HAND_FLOPS


def test_toy_counts_equal_the_arrays_it_reads():
    cfg = cal.QUICK
    params = cal.init_params(cfg)
    matmul = (
        sum(
            int(np.prod(w.shape))
            for lp in params["layers"]
            for k, w in lp.items()
            if k.startswith("w")
        )
        + params["unembed"].size
    )
    assert matmul == HAND_N
    cache = cal.init_cache(cfg, batch=3)
    per_token = (cache["k"].nbytes + cache["v"].nbytes) / (3 * cfg.context)
    assert per_token == HAND_KV


def test_toy_flops_agree_with_xla_cost_analysis():
    # XLA counts every op (norms, softmax, GELU too), so agreement is approximate; it can still
    # disagree with a wrong hand count by far more than this tolerance.
    cfg, b = cal.QUICK, 4
    params, cache = cal.init_params(cfg), cal.init_cache(cfg, b)
    tokens = jnp.zeros((b,), jnp.int32)
    compiled = (
        jax.jit(cal.decode_step, static_argnums=3).lower(params, cache, tokens, cfg).compile()
    )
    analysis = compiled.cost_analysis()
    if isinstance(analysis, list):  # older jax returns one dict per computation
        analysis = analysis[0]
    if not analysis or "flops" not in analysis:
        pytest.skip("this backend reports no cost analysis")
    assert float(analysis["flops"]) == pytest.approx(b * HAND_FLOPS, rel=0.1)


@pytest.mark.slow
def test_decode_step_reads_the_cache():
    cfg = cal.QUICK
    params, cache = cal.init_params(cfg), cal.init_cache(cfg, 2)
    tokens = jnp.array([1, 2], jnp.int32)
    base = cal.decode_step(params, cache, tokens, cfg)
    changed = dict(cache, v=cache["v"].at[:, :, :, 3].multiply(-1.0))  # position 3
    assert base.shape == (2, cfg.vocab)
    assert bool(jnp.all(jnp.isfinite(base)))
    assert not np.allclose(
        np.asarray(base), np.asarray(cal.decode_step(params, changed, tokens, cfg))
    )


def test_fit_knee_recovers_a_planted_roofline_and_none_without_knee():
    b = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256.0])
    knee, (alpha, gamma) = cal.fit_knee(b, np.maximum(2e-3 + 1e-5 * b, 1e-4 * b), kv_slope=1e-5)
    assert knee == pytest.approx(2e-3 / (1e-4 - 1e-5), rel=1e-6)  # 22.2
    assert (alpha, gamma) == (pytest.approx(2e-3), pytest.approx(1e-4))
    knee, _ = cal.fit_knee(b, 2e-3 + 1e-5 * b, kv_slope=1e-5)  # memory bound throughout
    assert math.isinf(knee)


@pytest.mark.parametrize("bad", [dict(d_model=130), dict(n_layers=0), dict(dtype="float16")])
def test_bad_config_names_field(bad):
    field = next(iter(bad))
    with pytest.raises(ValueError, match=f"ToyConfig.{field} = "):
        cal.ToyConfig(**{**dict(n_heads=4), **bad})


@pytest.fixture(scope="module")
def quick_json():
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["calibrate", "--quick", "--json"])
    return code, json.loads(out.getvalue())


@pytest.mark.slow
def test_cli_quick_measures_positive_finite_numbers(quick_json):
    code, res = quick_json
    assert code == 0
    assert res["flops"]["float32"] > 0 and math.isfinite(res["flops"]["float32"])
    assert res["bandwidth"] > 0 and math.isfinite(res["bandwidth"])
    assert res["batches"] == [1, 2, 4, 8, 16]
    for key in ("measured_s", "predicted_s", "ratios"):
        assert len(res[key]) == 5
        assert all(x > 0 and math.isfinite(x) for x in res[key]), key
    assert res["params"] == HAND_N and res["kv_bytes_per_token"] == HAND_KV
    assert res["knee_predicted"] > 0


@pytest.mark.slow
def test_prediction_structure(quick_json):
    _, res = quick_json
    pred = np.asarray(res["predicted_s"])
    assert np.all(np.diff(pred) >= 0)  # never faster with a bigger batch
    # The prediction is dcost.decode with the measured F and BW: rebuild it by hand.
    f, bw = res["flops"]["float32"], res["bandwidth"]
    b = np.asarray(res["batches"], dtype=float)
    hand = np.maximum(b * HAND_FLOPS / f, (4 * HAND_N + b * 16 * HAND_KV) / bw)
    np.testing.assert_allclose(pred, hand, rtol=1e-5)
    hw = cal._hardware(f, bw)
    assert res["knee_predicted"] == pytest.approx(
        float(dcost.balance_batch(hw, cal.toy_model(cal.QUICK), 16.0)), rel=1e-6
    )


@pytest.mark.slow
def test_cli_text_output(quick_json, capsys, monkeypatch):
    # The text view of the same measurement (re-measuring would double the test time).
    _, res = quick_json
    # --json writes a number that does not exist as null with a "<key>_reason" beside it (here
    # a knee that is never reached, inf in the Calibration)
    fields = {
        k: math.inf if v is None and f"{k}_reason" in res else v
        for k, v in res.items()
        if k != "ratios" and not k.endswith("_reason")
    }
    fields["config"] = cal.ToyConfig(**fields["config"])
    monkeypatch.setattr(cal, "calibrate", lambda **kw: cal.Calibration(**fields))
    assert main(["calibrate", "--quick"]) == 0
    out = capsys.readouterr().out
    assert "GFLOP/s" in out and "GB/s" in out and "knee (balance batch)" in out
    rows = [ln.split() for ln in out.splitlines() if ln.strip() and ln.split()[0].isdigit()]
    assert [int(r[0]) for r in rows] == res["batches"]
    for r, m, p in zip(rows, res["measured_s"], res["predicted_s"], strict=True):
        assert float(r[1]) == pytest.approx(m * 1e3, abs=1e-3)
        assert float(r[2]) == pytest.approx(p * 1e3, abs=1e-3)


def test_decode_step_matches_a_numpy_reference():
    # One layer, written again in float64 NumPy with a loop over heads: attention of the new token
    # over [cached keys; its own key], pre-norm residual blocks, GELU (tanh form) MLP.
    cfg = cal.ToyConfig(n_layers=1, d_model=16, n_heads=2, d_ff=32, vocab=11, context=5)
    params, cache = cal.init_params(cfg, seed=3), cal.init_cache(cfg, 2, seed=4)
    tokens = jnp.array([3, 7], jnp.int32)
    got = np.asarray(cal.decode_step(params, cache, tokens, cfg))

    def norm(x, g):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * g

    def gelu(x):
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))

    P = jax.tree_util.tree_map(lambda a: np.asarray(a, np.float64), params)
    K, V = (np.asarray(cache[n][0], np.float64) for n in ("k", "v"))  # [B, h, T, dh]
    lp = P["layers"][0]
    out = []
    for b, tok in enumerate(np.asarray(tokens)):
        x = P["embed"][tok]
        y = norm(x, lp["norm1"])
        q, k, v = y @ lp["wq"], y @ lp["wk"], y @ lp["wv"]
        heads = []
        for h in range(2):
            sl = slice(8 * h, 8 * h + 8)
            keys = np.vstack([K[b, h], k[sl]])
            vals = np.vstack([V[b, h], v[sl]])
            s = keys @ q[sl] / np.sqrt(8)
            p = np.exp(s - s.max())
            heads.append((p / p.sum()) @ vals)
        x = x + np.concatenate(heads) @ lp["wo"]
        x = x + gelu(norm(x, lp["norm2"]) @ lp["w1"]) @ lp["w2"]
        out.append(norm(x, P["final_norm"]) @ P["unembed"])
    np.testing.assert_allclose(got, np.stack(out), rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("eta_f, eta_bw", [(0.2, 0.9), (1.0, 0.5), (0.05, 0.05)])
def test_fit_efficiency_recovers_planted_fractions(eta_f, eta_bw):
    # Times generated by the roofline with known efficiencies, on both sides of the knee.
    m = cal.toy_model(cal.QUICK)
    b = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256.0])
    t = np.asarray(
        dcost.decode(
            dcost.Design(batch=b), cal._hardware(1e11, 1e10, eta_f, eta_bw), m, dcost.Workload(16.0)
        ).tpot
    )
    got_f, got_bw = cal.fit_efficiency(b, t, cal._hardware(1e11, 1e10), m, 16)
    assert got_f == pytest.approx(eta_f, rel=0.03)  # grid step is 4.4 %
    assert got_bw == pytest.approx(eta_bw, rel=0.03)


@pytest.mark.slow
def test_calibrated_prediction_fits_no_worse(quick_json):
    _, res = quick_json
    meas = np.log(res["measured_s"])
    err_pred = np.sum((meas - np.log(res["predicted_s"])) ** 2)
    err_cal = np.sum((meas - np.log(res["calibrated_s"])) ** 2)
    assert err_cal <= err_pred + 1e-12
    assert 0 < res["flops_efficiency"] <= 1 and 0 < res["bandwidth_efficiency"] <= 1
