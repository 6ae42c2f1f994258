"""Time the prefill pass of a preset's own architecture on this machine and write the timings as
validation records (the compute-bound twin of ``dcost.calibrate.decode_timing``).

A prefill pass of ``B`` prompts of ``T`` tokens each runs every prompt token through every layer
and attends causally (position ``i`` sees positions ``0..i``), then computes the logits of each
prompt's last position only (the first output token), as a serving engine does::

    q, k, v = x Wq, x Wk, x Wv                 # [B, T, H dh], [B, T, Hkv dh], [B, T, Hkv dh]
    o = causal_attention(q, k, v)              # grouped-query, softmax(q k^T / sqrt(dh)) v
    x += o Wo;   x += (silu(x W1) * x W3) W2   # RMS norms before each block
    logits = norm(x[:, -1]) Wu

The KV cache it would write (``B T`` rows per layer) is left out, as the weights' embedding
gather is. Its FLOPs are

    2 B T (N - d V) + 2 B d V + 4 B L H dh T (T + 1) / 2

(``pass_flops``): the matmuls of every token, the unembedding of the last, and the causal half
of the attention scores and their weighted sum. A test holds the count against XLA's own.

Attention runs fused where the device has a fused kernel (``attention="cudnn"``: cuDNN's flash
attention through ``jax.nn.dot_product_attention``, which skips the masked half of the scores)
and otherwise in query blocks of plain ``jax.numpy`` (``attention="xla"``: each block of
``block`` queries attends to the keys up to its last position, so the masked half is mostly
skipped too and no ``T x T`` score matrix is held). A timing becomes a record with
``serving = "prefill"``, ``metric = "input_throughput_per_gpu"`` (``B T / seconds``) and
``engine = "bare-xla"``: a bound check and an efficiency gauge, not a serving engine.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import jax
import jax.numpy as jnp

from dcost.calibrate.decode_timing import Architecture, bare_record, init_weights, matmul_params
from dcost.calibrate.local import _median_time, _rms_norm

__all__ = [
    "ATTENTION",
    "causal_attention",
    "prefill_pass",
    "pass_flops",
    "time_prefill",
    "to_records",
]

ATTENTION = ("xla", "cudnn")
"""How a pass attends: ``"xla"`` (query blocks of plain jax.numpy) or ``"cudnn"`` (the fused
flash-attention kernel of ``jax.nn.dot_product_attention``; NVIDIA GPUs only)."""


def _check_attention(attention: str, block: int) -> None:
    if attention not in ATTENTION:
        raise ValueError(f"attention = {attention!r} is not allowed: it must be one of {ATTENTION}")
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"block = {block!r} is not allowed: it must be an int >= 1")


def causal_attention(q, k, v, attention: str = "xla", block: int = 1024):
    """Causal grouped-query attention: ``q [B, T, H, dh]``, ``k, v [B, T, Hkv, dh]`` ->
    ``[B, T, H, dh]``; query ``i`` attends to keys ``0..i`` (module docstring)."""
    _check_attention(attention, block)
    if attention == "cudnn":
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    b, t, h, dh = q.shape
    hkv = k.shape[2]
    g = h // hkv
    qg = q.reshape(b, t, hkv, g, dh)
    scale = 1.0 / math.sqrt(dh)
    out = []
    for start in range(0, t, block):
        stop = min(start + block, t)
        s = jnp.einsum("bqhgd,bkhd->bhgqk", qg[:, start:stop], k[:, :stop])
        s = s.astype(jnp.float32) * scale
        pos_q = jnp.arange(start, stop)[:, None]
        pos_k = jnp.arange(stop)[None, :]
        s = jnp.where(pos_k <= pos_q, s, -jnp.inf)
        p = jax.nn.softmax(s, -1).astype(q.dtype)
        out.append(jnp.einsum("bhgqk,bkhd->bqhgd", p, v[:, :stop]))
    return jnp.concatenate(out, 1).reshape(b, t, h, dh)


def prefill_pass(weights: dict, tokens, arch: Architecture, attention="xla", block=1024):
    """One prefill pass of ``B`` prompts (module docstring); returns the last positions' logits
    ``[B, V]``.

    Args:
      weights: ``decode_timing.init_weights`` output. tokens: int ``[B, T]``.
      arch, attention, block: static under ``jit`` (``ATTENTION``; ``block`` queries per block of
        the ``"xla"`` attention).
    """
    hkv, dh = arch.n_kv_heads, arch.d_head
    x = weights["embed"][tokens]
    b, t, _ = x.shape
    for w in weights["layers"]:
        y = _rms_norm(x, w["norm1"])
        q = (y @ w["wq"]).reshape(b, t, arch.n_heads, dh)
        k = (y @ w["wk"]).reshape(b, t, hkv, dh)
        v = (y @ w["wv"]).reshape(b, t, hkv, dh)
        o = causal_attention(q, k, v, attention, block)
        x = x + o.reshape(b, t, -1) @ w["wo"]
        y = _rms_norm(x, w["norm2"])
        x = x + (jax.nn.silu(y @ w["w1"]) * (y @ w["w3"])) @ w["w2"]
    return _rms_norm(x[:, -1], weights["final_norm"]) @ weights["unembed"]


def pass_flops(arch: Architecture, batch: int, prompt: int) -> float:
    """Matmul and causal-attention FLOPs of one pass (module docstring; norms, softmax and the
    activation are left out).

    >>> a = Architecture(1, 8, 2, 1, 4, 16, 10)
    >>> pass_flops(a, 1, 1) == 2 * (matmul_params(a) - 80) + 2 * 80 + 4 * 8
    True
    """
    b, t = float(batch), float(prompt)
    head = arch.d_model * arch.vocab
    heads = arch.n_heads * arch.d_head
    return (
        2.0 * b * t * (matmul_params(arch) - head)
        + 2.0 * b * head
        + 4.0 * b * arch.n_layers * heads * t * (t + 1.0) / 2.0
    )


def time_prefill(
    arch: Architecture,
    shapes: Iterable[tuple[int, int]],
    *,
    attention: str = "xla",
    block: int = 1024,
    repeats: int = 10,
    seed: int = 0,
    on_timing=None,
) -> list[dict]:
    """Median seconds of one jitted ``prefill_pass`` at each ``(batch, prompt)`` of ``shapes``
    (default device), with its FLOPs and the weight bytes it must read (bf16).

    Args:
      on_timing: called with each timing as it is made (a long run keeps what it measured).

    Returns:
      one dict per shape: ``batch, prompt, seconds, flops, bytes, attention``.
    """
    _check_attention(attention, block)
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(
            f"time_prefill.repeats = {repeats!r} is not allowed: it must be an int >= 1"
        )
    shapes = [(int(b), int(t)) for b, t in shapes]
    for b, t in shapes:
        if b < 1 or t < 1:
            raise ValueError(f"shape (batch={b}, prompt={t}): both must be >= 1")
    weights = init_weights(arch, seed)
    step = jax.jit(prefill_pass, static_argnums=(2, 3, 4))
    out = []
    for batch, prompt in shapes:
        tokens = jax.random.randint(
            jax.random.PRNGKey(batch + prompt), (batch, prompt), 0, arch.vocab
        )
        seconds = _median_time(step, weights, tokens, arch, attention, block, repeats=repeats)
        timing = {
            "batch": batch,
            "prompt": prompt,
            "seconds": seconds,
            "flops": pass_flops(arch, batch, prompt),
            "bytes": 2.0 * matmul_params(arch),
            "attention": attention,
        }
        out.append(timing)
        if on_timing is not None:
            on_timing(timing)
    return out


def to_records(
    timings: Iterable[Mapping],
    *,
    hardware: str,
    model: str,
    source: str,
    source_id: str,
    device: str,
    software: str,
) -> list[dict]:
    """Validation records (``dcost.validation`` schema, ``engine = "bare-xla"``) of
    ``time_prefill``'s timings: ``input_throughput_per_gpu = B T / seconds`` of a prefill pool
    of one GPU.

    Args:
      hardware: the hardware preset the device is (e.g. "h200"). model: the model preset timed.
      source: ``repo@commit:path`` of the code that measured. source_id: the group for
      leave-one-source-out checks. device, software: what ran, quoted in each record.
    """
    kernel = {
        "cudnn": "cuDNN's fused flash attention (jax.nn.dot_product_attention)",
        "xla": "attention in query blocks of plain jax.numpy",
    }
    records = []
    for t in timings:
        b, n, s = int(t["batch"]), int(t["prompt"]), float(t["seconds"])
        records.append(
            bare_record(
                id=f"dcost-jax-{hardware}-{model}-prefill-b{b}-t{n}",
                hardware=hardware,
                model=model,
                source=source,
                source_id=source_id,
                quote=(
                    f"median of timed jitted prefill passes on {device} ({software}, "
                    f"{t['attention']} attention): batch {b}, {n} prompt tokens per sequence, "
                    f"{s * 1e3:.4g} ms per pass"
                ),
                serving="prefill",
                concurrency=b,
                prompt_tokens=n,
                output_tokens=1,
                metric="input_throughput_per_gpu",
                value=b * n / s,
                note=(
                    "Measured by dcost.calibrate.prefill_timing: random bf16 weights of the "
                    f"preset's architecture, matmuls compiled by XLA, {kernel[t['attention']]}, "
                    "one device, logits of each prompt's last position only, KV cache not "
                    "written. Value: prompt tokens over the pass's time."
                ),
            )
        )
    return records
