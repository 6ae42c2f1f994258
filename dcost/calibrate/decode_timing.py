"""Time the decode step of a preset's own architecture on this machine and write the timings as
validation records (a measured source beside the published ones).

``dcost.calibrate.local`` times a toy; this module times the architecture of a dense model preset
(``llama-3.1-8b``: grouped-query attention, SwiGLU MLP, untied unembedding) at its real size, with
random weights, written in plain ``jax.numpy`` and compiled by XLA for the default device (no fused
attention kernel, no paged cache, one device). One step of ``B`` sequences whose caches hold ``T``
tokens each does, per layer::

    q, k, v = x Wq, x Wk, x Wv                 # [B, H dh], [B, Hkv dh], [B, Hkv dh]
    s = q . K_cache^T / sqrt(dh)               # the T cached keys of the sequence's KV head
    o = softmax([s, q.k]) [V_cache; v]         # T + 1 positions
    x += o Wo;   x += (silu(x W1) * x W3) W2   # RMS norms before each block

and the unembedding ``x Wu`` at the end; the cache is read, not written (a serving engine writes
one row per layer, ``2 Hkv dh`` elements per sequence). Its FLOPs are

    2 B (N - d V) + 4 B L H dh (T + 1)        # the matmul weights (N less the embedding table)

which ``step_flops`` returns and a test holds against XLA's own count of the compiled step.

A timing becomes a record in the schema of ``dcost.validation`` (``serving = "decode"``,
``metric = "step_time"``, ``concurrency = B``, ``prompt_tokens = T``, ``output_tokens = 2``, so the
record's mean context ``T + 2/2`` is the ``T + 1`` positions the step attends to), its ``source``
the commit and script that produced it. What the records say about dcost: a serving engine's
kernels are faster than these, so a pure-physics prediction is still a bound, and the gap is the
efficiency of XLA's plain kernels on the chip.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Mapping
from typing import Protocol

import jax
import jax.numpy as jnp

from dcost import presets
from dcost.calibrate.local import _median_time, _rms_norm

__all__ = [
    "Architecture",
    "architecture",
    "check_shape",
    "init_weights",
    "init_cache",
    "attention_block",
    "decode_step",
    "matmul_params",
    "step_flops",
    "time_decode",
    "to_records",
    "bare_record",
    "records_toml",
    "device_ceilings",
]


@dataclasses.dataclass(frozen=True)
class Architecture:
    """The shape of a dense decoder, as in a model preset's ``arch`` table (all ints >= 1;
    ``n_kv_heads`` divides ``n_heads``)."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_ff: int
    vocab: int

    def __post_init__(self):
        check_shape(self)


def check_shape(arch) -> None:
    """Raise ValueError naming the field unless every field of the dataclass ``arch`` is an int
    >= 1 and its ``n_kv_heads`` divides its ``n_heads``."""
    name = type(arch).__name__
    for f in dataclasses.fields(arch):
        v = getattr(arch, f.name)
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise ValueError(f"{name}.{f.name} = {v!r} is not allowed: it must be an int >= 1")
    if arch.n_heads % arch.n_kv_heads:
        raise ValueError(
            f"{name}.n_kv_heads = {arch.n_kv_heads} is not allowed: it must divide "
            f"n_heads = {arch.n_heads}"
        )


def architecture(model: str) -> Architecture:
    """The ``Architecture`` of dense model preset ``model`` (SwiGLU MLP, untied unembedding).

    >>> architecture("llama-3.1-8b").n_kv_heads
    8
    """
    arch = presets.model_card(model)["arch"]
    if arch.get("mlp") != "swiglu" or arch.get("tied_embeddings", False) or "n_experts" in arch:
        raise ValueError(
            f"model = {model!r} is not allowed: decode_timing times dense SwiGLU models with "
            "untied embeddings (e.g. llama-3.1-8b)"
        )
    if arch.get("attention", "gqa") not in ("gqa", "mha"):
        raise ValueError(f"model = {model!r} is not allowed: attention {arch['attention']!r}")
    return Architecture(**{f.name: int(arch[f.name]) for f in dataclasses.fields(Architecture)})


def init_weights(arch: Architecture, seed: int = 0, dtype=jnp.bfloat16) -> dict:
    """Random weights made on the device (``jax.random``): ``embed [V, d]``, ``unembed [d, V]``,
    ``final_norm [d]`` and ``layers``, a list of ``L`` dicts with ``wq [d, H dh]``, ``wk wv
    [d, Hkv dh]``, ``wo [H dh, d]``, ``w1 w3 [d, d_ff]``, ``w2 [d_ff, d]`` and two norms. Each
    layer's weights are their own buffers (a stacked array sliced per layer makes XLA copy the
    slice, which triples the bytes a memory-bound step moves)."""
    d, f, V = arch.d_model, arch.d_ff, arch.vocab
    hq, hkv = arch.n_heads * arch.d_head, arch.n_kv_heads * arch.d_head
    shapes = {
        "wq": (d, hq),
        "wk": (d, hkv),
        "wv": (d, hkv),
        "wo": (hq, d),
        "w1": (d, f),
        "w3": (d, f),
        "w2": (f, d),
    }
    return random_weights(shapes, arch.n_layers, d, V, seed, dtype)


def random_weights(shapes: dict, n_layers: int, d: int, vocab: int, seed: int, dtype) -> dict:
    """``n_layers`` layers of the matrices ``shapes`` (``name -> shape``) and two ``[d]`` norms
    each, an ``embed [vocab, d]``, ``unembed [d, vocab]`` and ``final_norm [d]``: normal entries
    scaled by ``1/sqrt(fan_in)`` (``shape[-2]``, the input dimension of a stacked matrix too),
    one key split per array, every array its own buffer (``init_weights``)."""
    key = jax.random.PRNGKey(seed)

    def normal(shape):
        nonlocal key
        key, sub = jax.random.split(key)
        scale = jnp.asarray(1.0 / math.sqrt(shape[-2]), dtype)
        return jax.random.normal(sub, shape, dtype) * scale

    layers = []
    for _ in range(n_layers):
        layer = {name: normal(shape) for name, shape in shapes.items()}
        layer["norm1"] = jnp.ones((d,), dtype)
        layer["norm2"] = jnp.ones((d,), dtype)
        layers.append(layer)
    return {
        "embed": normal((vocab, d)),
        "unembed": normal((d, vocab)),
        "final_norm": jnp.ones((d,), dtype),
        "layers": layers,
    }


class _CacheShape(Protocol):
    @property
    def n_layers(self) -> int: ...
    @property
    def n_kv_heads(self) -> int: ...
    @property
    def d_head(self) -> int: ...


def init_cache(arch: _CacheShape, batch: int, context: int, seed: int = 1, dtype=jnp.bfloat16):
    """Random K and V caches: a list of ``L`` pairs, each ``[B, Hkv, T, dh]`` (a sequence's
    head reads one contiguous block); ``arch`` any architecture with ``n_layers, n_kv_heads,
    d_head`` (``Architecture``, ``moe_timing.MoEArchitecture``)."""
    shape = (batch, arch.n_kv_heads, context, arch.d_head)
    keys = jax.random.split(jax.random.PRNGKey(seed), 2 * arch.n_layers)
    return [
        (
            jax.random.normal(keys[2 * i], shape, dtype),
            jax.random.normal(keys[2 * i + 1], shape, dtype),
        )
        for i in range(arch.n_layers)
    ]


def attention_block(x, w, kc, vc, n_heads: int, n_kv_heads: int, d_head: int):
    """``x + Attn(RMSNorm(x))`` of one decode step's layer: grouped-query attention of the ``B``
    new tokens over their ``T`` cached positions ``kc, vc [B, Hkv, T, dh]`` and themselves,
    with ``w``'s ``norm1, wq, wk, wv, wo`` (module docstring). ``[B, d]``."""
    g = n_heads // n_kv_heads
    b = x.shape[0]
    y = _rms_norm(x, w["norm1"])
    q = (y @ w["wq"]).reshape(b, n_kv_heads, g, d_head)
    k_new = (y @ w["wk"]).reshape(b, n_kv_heads, 1, d_head)
    v_new = (y @ w["wv"]).reshape(b, n_kv_heads, 1, d_head)
    s_c = jnp.einsum("bhgd,bhtd->bhgt", q, kc)
    s_n = jnp.einsum("bhgd,bhtd->bhgt", q, k_new)
    s = jnp.concatenate([s_c, s_n], -1).astype(jnp.float32) * (1.0 / math.sqrt(d_head))
    p_att = jax.nn.softmax(s, -1).astype(x.dtype)
    o = jnp.einsum("bhgt,bhtd->bhgd", p_att[..., :-1], vc)
    o = o + jnp.einsum("bhgt,bhtd->bhgd", p_att[..., -1:], v_new)
    return x + o.reshape(b, -1) @ w["wo"]


def decode_step(weights: dict, cache: list, tokens, arch: Architecture):
    """One decode step of ``B`` sequences (module docstring); returns logits ``[B, V]``.

    Args:
      weights: ``init_weights`` output. cache: ``init_cache`` output. tokens: int ``[B]``.
      arch: the architecture (static under ``jit``).
    """
    x = weights["embed"][tokens]
    for w, (kc, vc) in zip(weights["layers"], cache, strict=True):
        x = attention_block(x, w, kc, vc, arch.n_heads, arch.n_kv_heads, arch.d_head)
        y = _rms_norm(x, w["norm2"])
        x = x + (jax.nn.silu(y @ w["w1"]) * (y @ w["w3"])) @ w["w2"]
    return _rms_norm(x, weights["final_norm"]) @ weights["unembed"]


def matmul_params(arch: Architecture) -> int:
    """Weights a step multiplies by: ``L (d (H + 2 Hkv) dh + H dh d + 3 d d_ff) + d V``.

    >>> matmul_params(architecture("llama-3.1-8b"))  # 32 x 218,103,808 + 4096 x 128,256
    7504658432
    """
    L, d, f, V = arch.n_layers, arch.d_model, arch.d_ff, arch.vocab
    hq, hkv = arch.n_heads * arch.d_head, arch.n_kv_heads * arch.d_head
    return L * (d * (hq + 2 * hkv) + hq * d + 3 * d * f) + d * V


def step_flops(arch: Architecture, batch: int, context: int) -> float:
    """Matmul and attention FLOPs of one step: ``2 B N_mm + 4 B L H dh (T + 1)`` (module
    docstring; norms, softmax and the activation are left out).

    >>> step_flops(architecture("llama-3.1-8b"), 1, 0) == 2 * 7504658432 + 4 * 32 * 4096
    True
    """
    heads = arch.n_heads * arch.d_head
    return 2.0 * batch * matmul_params(arch) + 4.0 * batch * arch.n_layers * heads * (context + 1)


def time_decode(
    arch: Architecture, shapes: Iterable[tuple[int, int]], repeats: int = 20, seed: int = 0
) -> list[dict]:
    """Median seconds of one jitted ``decode_step`` at each ``(batch, context)`` of ``shapes``
    (default device), with its FLOPs and the bytes it must read (weights and KV cache, bf16).

    Returns:
      one dict per shape: ``batch, context, seconds, flops, bytes``.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(
            f"time_decode.repeats = {repeats!r} is not allowed: it must be an int >= 1"
        )
    weights = init_weights(arch, seed)
    step = jax.jit(decode_step, static_argnums=3)
    kv_per_token = 2 * arch.n_layers * arch.n_kv_heads * arch.d_head * 2
    out = []
    for batch, context in shapes:
        if batch < 1 or context < 1:
            raise ValueError(f"shape (batch={batch}, context={context}): both must be >= 1")
        cache = init_cache(arch, batch, context, seed=batch + context)
        tokens = jnp.arange(batch, dtype=jnp.int32) % arch.vocab
        seconds = _median_time(step, weights, cache, tokens, arch, repeats=repeats)
        out.append(
            {
                "batch": int(batch),
                "context": int(context),
                "seconds": seconds,
                "flops": step_flops(arch, batch, context),
                "bytes": 2.0 * matmul_params(arch) + float(batch * context * kv_per_token),
            }
        )
        del cache
    return out


def bare_record(
    *, id: str, hardware: str, model: str, source: str, source_id: str, quote: str, **fields
) -> dict:
    """One validation record (``dcost.validation`` schema) of a step dcost timed itself: one
    device, bf16 weights, cache and matmuls, ``engine = "bare-xla"``; ``fields`` add the step's
    own (``serving``, ``concurrency``, lengths, ``metric``, ``value``, ``note``)."""
    return {
        "id": id,
        "source_id": source_id,
        "engine": "bare-xla",
        "family": presets.card_family(hardware),
        "source": source,
        "quote": quote,
        "hardware": hardware,
        "model": model,
        "weights": "bf16",
        "kv_cache": "bf16",
        "compute": "bf16",
        "gpus": 1,
        **fields,
    }


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
    """Validation records (``dcost.validation`` schema, ``bare_record``) of ``time_decode``'s
    timings.

    Args:
      hardware: the hardware preset the device is (e.g. "h200"). model: the model preset timed.
      source: ``repo@commit:path`` of the code that measured. source_id: the group for
      leave-one-source-out checks. device, software: what ran, quoted in each record.
    """
    records = []
    for t in timings:
        b, T, s = int(t["batch"]), int(t["context"]), float(t["seconds"])
        records.append(
            bare_record(
                id=f"dcost-jax-{hardware}-{model}-decode-b{b}-t{T}",
                hardware=hardware,
                model=model,
                source=source,
                source_id=source_id,
                quote=(
                    f"median of timed jitted decode steps on {device} ({software}): batch {b}, "
                    f"{T} cached tokens per sequence, {s * 1e3:.4g} ms per step"
                ),
                serving="decode",
                concurrency=b,
                prompt_tokens=T,
                output_tokens=2,
                metric="step_time",
                value=s,
                note=(
                    "Measured by dcost.calibrate.decode_timing: random bf16 weights of the "
                    "preset's architecture, plain jax.numpy compiled by XLA (no fused attention "
                    "kernel), one device, KV cache read and not written. prompt_tokens = T and "
                    "output_tokens = 2 make the record's mean context T + 1, the positions the "
                    "step attends to."
                ),
            )
        )
    return records


def _toml_value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def records_toml(records: Iterable[Mapping]) -> str:
    """``[[record]]`` tables for ``records.toml`` (flat records: numbers, strings, lists).

    >>> import tomllib
    >>> tomllib.loads(records_toml([{"id": "a", "value": 1.5}]))["record"]
    [{'id': 'a', 'value': 1.5}]
    """
    blocks = []
    for r in records:
        lines = ["[[record]]"] + [f"{k} = {_toml_value(v)}" for k, v in r.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def device_ceilings(repeats: int = 20, side: int = 8192, read_bytes: float = 4e9):
    """The default device's achieved bf16 matmul rate (``side^3``, FLOP/s) and streaming-read
    bandwidth (a float32-accumulated sum over ``read_bytes`` of bf16, bytes/s): the fastest of
    ``repeats`` calls after three warm-ups, the ceilings a timed step is held against.

    A read, not a copy: on a lent H200 (jax 0.11.2) XLA's elementwise copy moved 3.0 TB/s
    (read + written) where its sum read 4.0 TB/s and PyTorch's copy 4.2 TB/s, so a copy
    understates what the chip streams."""
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"repeats = {repeats!r} is not allowed: it must be an int >= 1")

    def best(fn, x):
        for _ in range(3):
            jax.block_until_ready(fn(x))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            jax.block_until_ready(fn(x))
            times.append(time.perf_counter() - t0)
        return min(times)

    a = jax.random.normal(jax.random.PRNGKey(0), (side, side), jnp.bfloat16)
    flops = 2 * side**3 / best(jax.jit(lambda m: m @ m), a)
    x = jax.random.normal(jax.random.PRNGKey(1), (int(read_bytes / 2),), jnp.bfloat16)
    bandwidth = x.nbytes / best(jax.jit(lambda v: jnp.sum(v, dtype=jnp.float32)), x)
    return flops, bandwidth
