"""dcost.calibrate.decode_timing: the timed decode step computes what it claims (against a NumPy
reference), costs the FLOPs ``step_flops`` says (against XLA's own count), and its records pass
the validation schema and can be predicted."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcost.calibrate import decode_timing as dt
from dcost.validation import check_record, predict

ARCH = dt.Architecture(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_ff=48, vocab=50)


def _reference(weights, cache, tokens, a):
    """Sequence by sequence, head by head, in float64 NumPy."""
    w = {k: np.asarray(v, np.float64) for k, v in weights.items() if k != "layers"}
    for name in weights["layers"][0]:
        w[name] = np.array([np.asarray(lw[name], np.float64) for lw in weights["layers"]])
    kc = np.array([np.asarray(k, np.float64) for k, _ in cache])
    vc = np.array([np.asarray(v, np.float64) for _, v in cache])
    g, dh = a.n_heads // a.n_kv_heads, a.d_head

    def norm(x, s):
        return x / np.sqrt(np.mean(x * x) + 1e-6) * s

    out = []
    for b, tok in enumerate(np.asarray(tokens)):
        x = w["embed"][tok]
        for i in range(a.n_layers):
            y = norm(x, w["norm1"][i])
            q = (y @ w["wq"][i]).reshape(a.n_heads, dh)
            k = (y @ w["wk"][i]).reshape(a.n_kv_heads, dh)
            v = (y @ w["wv"][i]).reshape(a.n_kv_heads, dh)
            o = np.zeros_like(q)
            for h in range(a.n_heads):
                kv = h // g
                keys = np.vstack([kc[i, b, kv], k[kv]])
                vals = np.vstack([vc[i, b, kv], v[kv]])
                s = keys @ q[h] / math.sqrt(dh)
                p = np.exp(s - s.max())
                o[h] = (p / p.sum()) @ vals
            x = x + o.reshape(-1) @ w["wo"][i]
            y = norm(x, w["norm2"][i])
            h1, h3 = y @ w["w1"][i], y @ w["w3"][i]
            x = x + (h1 / (1 + np.exp(-h1)) * h3) @ w["w2"][i]
        out.append(norm(x, w["final_norm"]) @ w["unembed"])
    return np.array(out)


def test_decode_step_matches_a_reference():
    w = dt.init_weights(ARCH, dtype=jnp.float32)
    cache = dt.init_cache(ARCH, 3, 5, dtype=jnp.float32)
    tokens = jnp.array([0, 7, 49])
    got = jax.jit(dt.decode_step, static_argnums=3)(w, cache, tokens, ARCH)
    np.testing.assert_allclose(
        np.asarray(got), _reference(w, cache, tokens, ARCH), rtol=2e-4, atol=2e-4
    )


@pytest.mark.parametrize("batch,context", [(1, 16), (6, 40)])
def test_step_flops_agree_with_xla(batch, context):
    a = ARCH
    w = dt.init_weights(a, dtype=jnp.float32)
    cache = dt.init_cache(a, batch, context, dtype=jnp.float32)
    tokens = jnp.zeros((batch,), jnp.int32)
    compiled = jax.jit(dt.decode_step, static_argnums=3).lower(w, cache, tokens, a).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    xla = float(cost["flops"])
    ours = dt.step_flops(a, batch, context)
    # XLA adds the norms, softmax and SiLU (a few percent at these tiny widths)
    assert ours <= xla <= 1.10 * ours


def test_matmul_params_are_the_preset_less_its_embedding_table():
    from dcost.presets import model_card

    a = dt.architecture("llama-3.1-8b")
    published = model_card("llama-3.1-8b")["published"]["params_total"]
    embed = a.vocab * a.d_model
    # the norms (65 x 4096) are the rest
    assert dt.matmul_params(a) + embed == pytest.approx(published, rel=2e-3)


def test_records_are_valid_and_predictable(tmp_path):
    timings = [{"batch": 4, "context": 1024, "seconds": 0.01}]
    recs = dt.to_records(
        timings,
        hardware="h200",
        model="llama-3.1-8b",
        source="dcost@abc:x",
        source_id="dcost-jax-h200",
        device="NVIDIA H200",
        software="jax",
    )
    (r,) = recs
    check_record(r)
    assert r["family"] == "hopper" and r["concurrency"] == 4
    assert r["engine"] == "bare-xla"  # reported apart and not fitted, as the shipped ones
    # the record's context is T + 1: the pure-physics step reads the weights (but the input
    # embedding's 128,256 x 4,096 table, of which it reads 4 rows) and 4 x 1025 tokens
    from dcost import presets

    h, m = presets.pair("h200", "llama-3.1-8b")
    weights = float(m.params_dense) - 128256 * 4096
    bytes_ = weights * 2 + 4 * 1025 * float(m.kv_bytes_per_token)
    assert predict(r) >= bytes_ / float(h.hbm_bandwidth) * (1 - 1e-6)
    import tomllib

    assert tomllib.loads(dt.records_toml(recs))["record"] == recs


@pytest.mark.parametrize(
    "field,value", [("n_layers", 0), ("d_model", 1.5), ("n_kv_heads", 3), ("n_heads", None)]
)
def test_bad_architecture_is_refused(field, value):
    with pytest.raises(ValueError, match=field):
        dataclasses.replace(ARCH, **{field: value})


def test_moe_preset_is_refused():
    with pytest.raises(ValueError, match="model"):
        dt.architecture("qwen3-30b-a3b")


def test_engine_field_is_checked():
    import dcost.validation as v

    bare = next(r for r in v.load() if r.get("engine") == "bare-xla")
    with pytest.raises(ValueError, match="'engine' = 'tgi'"):
        check_record(dict(bare, engine="tgi"))


def test_bare_kernel_records_are_reported_apart_and_not_fitted():
    """The shipped bare-kernel records: measured on both lent chips, never faster than the
    pure-physics bound, and outside the fit: adding them leaves a fit unchanged."""
    import dcost.validation as v
    from dcost.calibrate import families

    records = v.load()
    bare = [r for r in records if families.bare_kernels(r)]
    assert {r["hardware"] for r in bare} == {"h200", "h100-sxm"} and len(bare) >= 20
    assert all(not families.fitted(r) for r in bare)
    for r in bare[:3]:
        assert predict(r) <= r["value"]
    published = [r for r in records if families.fitted(r)][:10]
    a = families.fit(published, steps=30)
    b = families.fit(published + bare[:4], steps=30)
    np.testing.assert_allclose(np.asarray(a.z_global), np.asarray(b.z_global), rtol=1e-5)
    # the summary counts them apart (predictions made up: 10 % high on every record)
    both = published + bare[:4]
    measured = np.array([float(r["value"]) for r in both])
    cv = families.CrossValidation(tuple(both), 1.1 * measured, measured, (), None)
    s = families.summary(cv)
    assert s["bare_kernels"]["records"] == 4 and s["overall"]["records"] == 10
    assert s["bare_kernels"]["median_ratio"] == pytest.approx(1.1)


@pytest.mark.parametrize("repeats", [0, 2.5, True])
def test_bad_repeats_are_refused(repeats):
    with pytest.raises(ValueError, match="repeats"):
        dt.time_decode(ARCH, [(1, 4)], repeats=repeats)


def test_timings_come_back_per_shape():
    out = dt.time_decode(ARCH, [(1, 4), (3, 8)], repeats=2)
    assert [(t["batch"], t["context"]) for t in out] == [(1, 4), (3, 8)]
    assert all(t["seconds"] > 0 for t in out)
    assert out[1]["flops"] == dt.step_flops(ARCH, 3, 8)


def test_device_ceilings_are_rates_of_this_device():
    """A smoke run on this machine at small shapes: two positive, finite rates; a bad repeat
    count is refused."""
    flops, bandwidth = dt.device_ceilings(repeats=2, side=128, read_bytes=4e6)
    assert 0 < flops < 1e16 and 0 < bandwidth < 1e14
    with pytest.raises(ValueError, match="repeats"):
        dt.device_ceilings(repeats=0)
