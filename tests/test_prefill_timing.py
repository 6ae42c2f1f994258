"""dcost.calibrate.prefill_timing: the timed prefill pass computes what it claims (against a NumPy
reference and against jax.nn.dot_product_attention), costs the FLOPs ``pass_flops`` says (against
XLA's own count), and its records pass the validation schema and are bounded by pure physics."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcost.calibrate import decode_timing as dt
from dcost.calibrate import prefill_timing as pt
from dcost.validation import check_record, predict

ARCH = dt.Architecture(n_layers=2, d_model=32, n_heads=4, n_kv_heads=2, d_head=8, d_ff=48, vocab=50)


def _reference(weights, tokens, a):
    """Prompt by prompt, position by position, head by head, in float64 NumPy."""
    w = {k: np.asarray(v, np.float64) for k, v in weights.items() if k != "layers"}
    layers = [{k: np.asarray(v, np.float64) for k, v in lw.items()} for lw in weights["layers"]]
    g, dh = a.n_heads // a.n_kv_heads, a.d_head

    def norm(x, s):
        return x / np.sqrt(np.mean(x * x, -1, keepdims=True) + 1e-6) * s

    out = []
    for prompt in np.asarray(tokens):
        x = w["embed"][prompt]  # [T, d]
        t = len(prompt)
        for lw in layers:
            y = norm(x, lw["norm1"])
            q = (y @ lw["wq"]).reshape(t, a.n_heads, dh)
            k = (y @ lw["wk"]).reshape(t, a.n_kv_heads, dh)
            v = (y @ lw["wv"]).reshape(t, a.n_kv_heads, dh)
            o = np.zeros_like(q)
            for i in range(t):
                for h in range(a.n_heads):
                    s = k[: i + 1, h // g] @ q[i, h] / math.sqrt(dh)
                    p = np.exp(s - s.max())
                    o[i, h] = (p / p.sum()) @ v[: i + 1, h // g]
            x = x + o.reshape(t, -1) @ lw["wo"]
            y = norm(x, lw["norm2"])
            h1, h3 = y @ lw["w1"], y @ lw["w3"]
            x = x + (h1 / (1 + np.exp(-h1)) * h3) @ lw["w2"]
        out.append(norm(x[-1], w["final_norm"]) @ w["unembed"])
    return np.array(out)


@pytest.mark.parametrize("block", [1, 3, 64])
def test_prefill_pass_matches_a_reference(block):
    w = dt.init_weights(ARCH, dtype=jnp.float32)
    tokens = jnp.array([[0, 7, 49, 3, 3, 12, 1], [5, 5, 5, 0, 1, 2, 40]])
    got = jax.jit(pt.prefill_pass, static_argnums=(2, 3, 4))(w, tokens, ARCH, "xla", block)
    np.testing.assert_allclose(np.asarray(got), _reference(w, tokens, ARCH), rtol=2e-4, atol=2e-4)


def test_blocked_attention_is_jax_causal_attention():
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    q = jax.random.normal(keys[0], (2, 11, 6, 8))
    k = jax.random.normal(keys[1], (2, 11, 3, 8))
    v = jax.random.normal(keys[2], (2, 11, 3, 8))
    want = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
    for block in (1, 4, 11, 32):
        np.testing.assert_allclose(
            np.asarray(pt.causal_attention(q, k, v, "xla", block)), np.asarray(want), atol=1e-5
        )


@pytest.mark.parametrize("batch,prompt", [(1, 16), (3, 9)])
def test_pass_flops_agree_with_xla(batch, prompt):
    """With one query per block the plain attention computes exactly the causal half."""
    w = dt.init_weights(ARCH, dtype=jnp.float32)
    tokens = jnp.zeros((batch, prompt), jnp.int32)
    step = jax.jit(pt.prefill_pass, static_argnums=(2, 3, 4))
    compiled = step.lower(w, tokens, ARCH, "xla", 1).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    xla = float(cost["flops"])
    ours = pt.pass_flops(ARCH, batch, prompt)
    # XLA adds the norms, softmax, masks and SiLU (a few percent at these tiny widths)
    assert ours <= xla <= 1.15 * ours


def test_pass_flops_by_hand():
    """Llama 3.1 8B, one 1,024-token prompt: 2 x 1024 x (7.5047e9 - 0.5253e9) matmul FLOPs, the
    last token's unembedding, and 4 x 32 layers x 4096 x 1024 x 1025 / 2 of attention."""
    a = dt.architecture("llama-3.1-8b")
    head = 4096 * 128256
    want = 2 * 1024 * (7504658432 - head) + 2 * head + 4 * 32 * 4096 * 1024 * 1025 / 2
    assert pt.pass_flops(a, 1, 1024) == pytest.approx(want, rel=1e-12)
    assert pt.pass_flops(a, 1, 1024) == pytest.approx(1.4568e13, rel=1e-3)


def test_time_prefill_reports_each_shape():
    seen = []
    out = pt.time_prefill(ARCH, [(1, 8), (2, 5)], repeats=1, block=4, on_timing=seen.append)
    assert [(t["batch"], t["prompt"]) for t in out] == [(1, 8), (2, 5)]
    assert seen == out and all(t["seconds"] > 0 and t["attention"] == "xla" for t in out)


@pytest.mark.parametrize(
    "kwargs,field",
    [
        ({"attention": "flash"}, "attention"),
        ({"block": 0}, "block"),
        ({"repeats": 0}, "repeats"),
        ({"shapes": [(0, 8)]}, "batch"),
    ],
)
def test_bad_input_is_refused(kwargs, field):
    args = {"shapes": [(1, 8)], **kwargs}
    with pytest.raises(ValueError, match=field):
        pt.time_prefill(ARCH, **args)


def test_records_are_valid_and_bounded_by_pure_physics():
    timings = [
        {"batch": 2, "prompt": 4096, "seconds": 0.2, "attention": "cudnn"},
        {"batch": 1, "prompt": 128, "seconds": 0.01, "attention": "xla"},
    ]
    recs = pt.to_records(
        timings,
        hardware="h100-sxm",
        model="llama-3.1-8b",
        source="dcost@abc:x",
        source_id="dcost-jax-prefill",
        device="NVIDIA H100",
        software="jax",
    )
    for r in recs:
        check_record(r)
        assert r["engine"] == "bare-xla" and r["serving"] == "prefill"
    assert recs[0]["value"] == pytest.approx(2 * 4096 / 0.2)
    assert "cudnn" in recs[0]["quote"] and "8192" not in recs[0]["id"]
    # pure physics of the long pass, by hand: compute bound, B T / (B T (2 N + a T / 2) / F),
    # N without the input embedding's 128,256 x 4,096 lookup table
    from dcost import presets

    h, m = presets.pair("h100-sxm", "llama-3.1-8b")
    tokens = 2 * 4096
    n = float(m.params_active) - 128256 * 4096
    flops = tokens * (2 * n + float(m.prefill_attn_flops) * 4096 / 2)
    assert predict(recs[0]) == pytest.approx(tokens / (flops / float(h.flops)), rel=1e-3)


def test_prefill_benchmark_quick_run_writes_valid_records(tmp_path):
    """benchmarks/prefill_records.py --quick: a smoke run on this machine's device."""
    import subprocess
    import sys
    import tomllib

    out = tmp_path / "records.toml"
    run = subprocess.run(
        [sys.executable, "benchmarks/prefill_records.py", "--quick", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr
    recs = tomllib.loads(out.read_text())["record"]
    assert [(r["concurrency"], r["prompt_tokens"]) for r in recs] == [(1, 16), (2, 32)]
    for r in recs:
        check_record(r)
