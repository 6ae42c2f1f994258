"""Time the decode step of a Mixture-of-Experts preset's architecture and write the timings as
validation records: the experts-touched term of the cost model against a real chip.

dcost charges a decode step of ``B`` tokens routed to ``k`` of ``E`` experts the weights of the
experts they touch, ``E (1 - (1 - k/E)^B)`` per layer in expectation when routing is uniform
(``dcost.serving.moe.expert_fraction``): from ``k`` experts a layer at batch 1 to all ``E``. That
holds only for kernels that read an expert's weights once for the tokens it serves and skip the
experts nobody chose. This module times such a step, with random weights of the preset's real
size (``qwen3-30b-a3b``: 48 layers, 128 experts of which 8 are active, 61 GB in bf16) on one
device:

* attention as in ``dcost.calibrate.decode_timing`` (grouped-query heads, the KV cache read and
  not written; Qwen3's per-head QK norms, ``2 H dh`` multiplies a token, are left out);
* a router ``x W_r`` (``[d, E]``), its top ``k`` and a softmax over those ``k`` (Qwen3's
  ``norm_topk_prob``); a random router spreads tokens less evenly than uniform routing (on
  the lent H200, batch 16 touched 73 experts a layer where the formula expects 82), so the
  timings count the experts each step's routing touched;
* the routed experts' SwiGLU by a grouped matmul (``grouped_matmul``, a Pallas kernel): the
  ``B k`` (token, expert) pairs sorted by expert, each expert's tokens padded to blocks of
  ``block`` rows, and one program per (block, output tile) that reads its expert's weight tile;
  a block of no expert writes zeros and reads nothing. Its FLOPs are those of the padded blocks;
  its weight read is the touched experts' (once per block: more than once only for an expert
  with more than ``block`` tokens).

``impl = "gather"`` computes the same experts with ``w[idx]`` (reading ``B k`` experts, repeats
included) and ``impl = "ragged"`` with ``jax.lax.ragged_dot`` (XLA's grouped matmul; where it
lowers to a dense product over every expert it reads all ``E``, as jax 0.11.2's did on a lent
H200: 21 ms at batch 1 against the Pallas kernel's 9): the first is the tests' reference, the
second a comparison the benchmark can time. ``impl = "skip"`` routes and
dispatches as ``"pallas"`` does and returns the gated sum of the tokens' own rows, no expert
matmul: the step's cost without the experts' weights, which the benchmark subtracts. On the
lent H200 the difference followed the experts touched at a marginal 3.6 TB/s, 0.96 of the chip's
streaming read in the same run (``experiments/moe_touched.py``).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterable, Mapping

import jax
import jax.numpy as jnp

from dcost import presets
from dcost.calibrate.decode_timing import bare_record, check_shape, random_weights
from dcost.calibrate.local import _median_time, _rms_norm

__all__ = [
    "MoEArchitecture",
    "moe_architecture",
    "init_weights",
    "route",
    "dispatch",
    "grouped_matmul",
    "default_tiles",
    "expert_ffn",
    "decode_step",
    "params_read",
    "expected_touched",
    "time_decode",
    "to_records",
]

IMPLS = ("pallas", "gather", "ragged", "skip")
_IMPL_TEXT = {
    "pallas": "a grouped matmul (a Pallas kernel that reads the touched experts' weights once per "
    "block of 16 tokens)",
    "gather": "a gather of each (token, expert) pair's weights",
    "ragged": "XLA's grouped matmul (jax.lax.ragged_dot)",
    "skip": "nothing (the experts' matmuls left out: the step's floor)",
}


@dataclasses.dataclass(frozen=True)
class MoEArchitecture:
    """The shape of a decoder whose every layer is grouped-query attention and routed SwiGLU
    experts (no shared expert, no dense layer), as in a model preset's ``arch`` table (all ints
    >= 1; ``n_kv_heads`` divides ``n_heads``; ``experts_active <= n_experts``)."""

    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    n_experts: int
    experts_active: int
    d_ff_expert: int
    vocab: int

    def __post_init__(self):
        check_shape(self)
        if self.experts_active > self.n_experts:
            raise ValueError(
                f"MoEArchitecture.experts_active = {self.experts_active} is not allowed: it "
                f"must be <= n_experts = {self.n_experts}"
            )


def moe_architecture(model: str) -> MoEArchitecture:
    """The ``MoEArchitecture`` of MoE preset ``model`` (grouped-query attention, routed SwiGLU
    experts in every layer, no shared expert, untied unembedding).

    >>> a = moe_architecture("qwen3-30b-a3b")
    >>> a.n_experts, a.experts_active, a.d_ff_expert
    (128, 8, 768)
    """
    arch = presets.model_card(model)["arch"]
    ok = (
        arch.get("mlp") == "swiglu"
        and not arch.get("tied_embeddings", False)
        and arch.get("attention", "gqa") in ("gqa", "mha")
        and "n_experts" in arch
        and not arch.get("n_shared_experts", 0)
        and not arch.get("n_dense_layers", 0)
        and not arch.get("biases", False)
        and not arch.get("sliding_window", 0)
    )
    if not ok:
        raise ValueError(
            f"model = {model!r} is not allowed: moe_timing times MoE models whose every layer "
            "is grouped-query attention and routed SwiGLU experts, no shared expert, no biases, "
            "untied embeddings (e.g. qwen3-30b-a3b)"
        )
    return MoEArchitecture(
        **{f.name: int(arch[f.name]) for f in dataclasses.fields(MoEArchitecture)}
    )


def init_weights(arch: MoEArchitecture, seed: int = 0, dtype=jnp.bfloat16) -> dict:
    """Random weights made on the device: ``embed [V, d]``, ``unembed [d, V]``, ``final_norm``
    and ``layers``, a list of ``L`` dicts with the attention's ``wq wk wv wo``, the router
    ``wr [d, E]``, the experts' ``w1 w3 [E, d, f]`` and ``w2 [E, f, d]``, and two norms (each
    layer's weights their own buffers, as in ``decode_timing.init_weights``)."""
    d, f, V, E = arch.d_model, arch.d_ff_expert, arch.vocab, arch.n_experts
    hq, hkv = arch.n_heads * arch.d_head, arch.n_kv_heads * arch.d_head
    shapes = {
        "wq": (d, hq),
        "wk": (d, hkv),
        "wv": (d, hkv),
        "wo": (hq, d),
        "wr": (d, E),
        "w1": (E, d, f),
        "w3": (E, d, f),
        "w2": (E, f, d),
    }
    return random_weights(shapes, arch.n_layers, d, V, seed, dtype)


def route(y, wr, k: int):
    """The ``k`` experts of each token and their gates: ``top_k(y W_r)``, the gates a softmax
    over the ``k`` chosen logits. Returns ``(idx [B, k] int32, gate [B, k] float32)``."""
    logits = (y @ wr).astype(jnp.float32)
    top, idx = jax.lax.top_k(logits, k)
    return idx.astype(jnp.int32), jax.nn.softmax(top, -1)


def dispatch(idx, n_experts: int, block: int):
    """The padded, expert-sorted layout of the ``P = B k`` (token, expert) pairs of ``idx``.

    Each expert ``e`` with ``c_e`` pairs gets ``ceil(c_e / block)`` blocks of ``block`` rows,
    the experts in order; ``nb = ceil(P / block) + min(E, P)`` blocks bound any routing.

    Returns:
      rows: int ``[nb block]``, the token of each row (``B`` for a padding row: the caller
      appends a zero row). block_expert: int ``[nb]``, each block's expert, -1 past the last.
      pos: int ``[B, k]``, the row of each pair.
    """
    b, k = idx.shape
    p = b * k
    nb = -(-p // block) + min(n_experts, p)
    e = idx.reshape(-1)
    # No sort and no search (on a GPU each is a chain of small kernels or a host-driven loop):
    # a pair's rank among its expert's pairs is a cumulative count over a one-hot [P, E].
    onehot = (e[:, None] == jnp.arange(n_experts)[None, :]).astype(jnp.int32)
    counts = jnp.sum(onehot, 0)
    rank = jnp.take_along_axis(jnp.cumsum(onehot, 0), e[:, None], 1)[:, 0] - 1
    padded = (counts + block - 1) // block * block
    end_p = jnp.cumsum(padded)
    pos = (end_p - padded)[e] + rank
    rows = jnp.full((nb * block,), b, jnp.int32).at[pos].set(jnp.arange(p, dtype=jnp.int32) // k)
    starts = jnp.arange(nb) * block
    block_expert = jnp.where(
        starts < end_p[-1], jnp.sum(end_p[None, :] <= starts[:, None], 1), -1
    ).astype(jnp.int32)
    return rows, block_expert, pos.astype(jnp.int32).reshape(b, k)


PROGRAMS = 528
"""Programs a grouped matmul's default tiles aim for: four per multiprocessor of an H100 or H200
(132), enough in flight to stream the weights (a lent H200: with 8 experts touched, 32-column
tiles read 0.35 TB/s and 128-column ones 0.21; with all 128, 128-column tiles 1.6-1.9)."""


def default_tiles(blocks: int, k: int, n: int) -> tuple[int, int]:
    """``(bn, bk)`` of ``grouped_matmul`` for ``blocks`` row blocks of a ``K x N`` weight: the
    widest of 128, 64, 32 columns dividing ``N`` that still makes ``PROGRAMS`` programs (32
    where none does), and a 64-row ``K`` slice beside 128 columns, 128 beside fewer (each the
    largest power of two dividing ``K``, down to 16).

    >>> default_tiles(192, 2048, 768), default_tiles(9, 2048, 768)
    ((128, 64), (32, 128))
    """
    bn = next(
        (t for t in (128, 64, 32) if n % t == 0 and blocks * (n // t) >= PROGRAMS),
        next((t for t in (32, 16) if n % t == 0), 16),
    )
    bk = 64 if bn == 128 else 128
    while bk > 16 and k % bk:
        bk //= 2
    return bn, bk


def grouped_matmul(
    x,
    w,
    block_expert,
    *,
    block: int,
    bn: int | None = None,
    bk: int | None = None,
    interpret: bool = False,
):
    """``out[r] = x[r] @ w[block_expert[r // block]]`` for each row ``r``, 0 where the block's
    expert is -1: a Pallas kernel, one program per (block, ``bn``-column tile), whose loop over
    ``bk``-row slices of ``K`` reads only its expert's ``[K, bn]`` weight tile.

    Args:
      x: ``[nb block, K]``. w: ``[E, K, N]``. block_expert: int ``[nb]``.
      block, bn, bk: powers of two >= 16 (the kernel's tile); ``bn | N`` and ``bk | K``;
      by default ``default_tiles``.
      interpret: run the kernel in Pallas's interpreter (any device; the tests).
    """
    from jax.experimental import pallas as pl

    rows, kdim = x.shape
    n_e, k2, n = w.shape
    auto_bn, auto_bk = default_tiles(rows // block, kdim, n)
    bn = auto_bn if bn is None else bn
    bk = auto_bk if bk is None else bk
    for name, v in (("block", block), ("bn", bn), ("bk", bk)):
        if v < 16 or v & (v - 1):
            raise ValueError(f"grouped_matmul.{name} = {v} is not allowed: a power of two >= 16")
    if k2 != kdim or rows % block or n % bn or kdim % bk:
        raise ValueError(
            f"grouped_matmul: x {x.shape}, w {w.shape}, block {block}, bn {bn}, bk {bk} are not "
            "allowed: x's columns must equal w's K, block divide x's rows, bn divide N and bk K"
        )
    nb, steps = rows // block, kdim // bk

    def kernel(be_ref, x_ref, w_ref, o_ref):
        e = be_ref[pl.program_id(0)]
        j = pl.program_id(1)

        @pl.when(e >= 0)
        def _():
            def body(i, acc):
                xs = x_ref[:, pl.ds(i * bk, bk)]
                ws = w_ref[e, pl.ds(i * bk, bk), pl.ds(j * bn, bn)]
                return acc + jnp.dot(xs, ws, preferred_element_type=jnp.float32)

            acc = jax.lax.fori_loop(0, steps, body, jnp.zeros((block, bn), jnp.float32))
            o_ref[...] = acc.astype(o_ref.dtype)

        @pl.when(e < 0)
        def _():
            o_ref[...] = jnp.zeros((block, bn), o_ref.dtype)

    return pl.pallas_call(
        kernel,
        out_shape=jax.ShapeDtypeStruct((rows, n), x.dtype),
        grid=(nb, n // bn),
        in_specs=[
            pl.no_block_spec,
            pl.BlockSpec((block, kdim), lambda i, j: (i, 0)),
            pl.no_block_spec,
        ],
        out_specs=pl.BlockSpec((block, bn), lambda i, j: (i, j)),
        interpret=interpret,
    )(block_expert, x, w)


def expert_ffn(
    y,
    w1,
    w3,
    w2,
    idx,
    gate,
    *,
    impl: str = "pallas",
    block: int = 16,
    tiles: tuple[int, int] | None = None,
    interpret: bool = False,
):
    """The routed experts' output ``sum_j gate[b, j] FFN_{idx[b, j]}(y[b])``, ``FFN_e(y) =
    (silu(y w1[e]) * (y w3[e])) w2[e]``, by ``impl`` (module docstring; ``tiles = (bn, bk)``
    of ``grouped_matmul``, its defaults where None). ``[B, d]``."""
    if impl not in IMPLS:
        raise ValueError(f"impl = {impl!r} is not allowed: one of {IMPLS}")
    b, d = y.shape
    n_e = w1.shape[0]
    gate = gate.astype(y.dtype)
    if impl == "gather":
        h = jax.nn.silu(jnp.einsum("bd,bkdf->bkf", y, w1[idx]))
        h = h * jnp.einsum("bd,bkdf->bkf", y, w3[idx])
        return jnp.einsum("bk,bkf,bkfd->bd", gate, h, w2[idx])
    if impl == "ragged":
        e = idx.reshape(-1)
        order = jnp.argsort(e, stable=True)
        xs = y[order // idx.shape[1]]
        sizes = jnp.bincount(e, length=n_e).astype(jnp.int32)
        h = jax.nn.silu(jax.lax.ragged_dot(xs, w1, sizes)) * jax.lax.ragged_dot(xs, w3, sizes)
        o = jnp.zeros_like(xs).at[order].set(jax.lax.ragged_dot(h, w2, sizes))
        return jnp.einsum("bk,bkd->bd", gate, o.reshape(b, -1, d))
    rows, block_expert, pos = dispatch(idx, n_e, block)
    xg = jnp.concatenate([y, jnp.zeros((1, d), y.dtype)])[rows]
    if impl == "skip":
        return jnp.einsum("bk,bkd->bd", gate, xg[pos])
    bn, bk = tiles if tiles is not None else (None, None)
    gm = functools.partial(grouped_matmul, block=block, bn=bn, bk=bk, interpret=interpret)
    h = jax.nn.silu(gm(xg, w1, block_expert)) * gm(xg, w3, block_expert)
    o = gm(h, w2, block_expert)
    return jnp.einsum("bk,bkd->bd", gate, o[pos])


def decode_step(
    weights: dict,
    cache: list,
    tokens,
    arch: MoEArchitecture,
    impl: str = "pallas",
    tiles: tuple[int, int] | None = None,
    interpret: bool = False,
):
    """One decode step of ``B`` sequences (module docstring).

    Returns:
      ``(logits [B, V], touched [L])``: the experts each layer's routing chose (distinct).
    """
    from dcost.calibrate.decode_timing import attention_block

    x = weights["embed"][tokens]
    touched = []
    for w, (kc, vc) in zip(weights["layers"], cache, strict=True):
        x = attention_block(x, w, kc, vc, arch.n_heads, arch.n_kv_heads, arch.d_head)
        y = _rms_norm(x, w["norm2"])
        idx, gate = route(y, w["wr"], arch.experts_active)
        touched.append(jnp.sum(jnp.bincount(idx.reshape(-1), length=arch.n_experts) > 0))
        x = x + expert_ffn(
            y, w["w1"], w["w3"], w["w2"], idx, gate, impl=impl, tiles=tiles, interpret=interpret
        )
    return _rms_norm(x, weights["final_norm"]) @ weights["unembed"], jnp.stack(touched)


def expected_touched(arch: MoEArchitecture, batch) -> float:
    """Experts a layer's ``batch`` tokens touch in expectation under uniform routing, ``E (1 -
    (1 - k/E)^B)`` (the occupancy count ``dcost.serving.moe.expert_fraction`` times ``E``).

    >>> a = moe_architecture("qwen3-30b-a3b")
    >>> expected_touched(a, 1), round(expected_touched(a, 64), 2)
    (8.0, 125.94)
    """
    e, k = arch.n_experts, arch.experts_active
    return e * (1.0 - (1.0 - k / e) ** batch)


def params_read(arch: MoEArchitecture, touched: float) -> float:
    """Weights a step reads with ``touched`` experts in each layer: the attention and router,
    ``touched`` experts of ``3 d f``, and the unembedding (not the embedding table, of which a
    step reads ``B`` rows).

    >>> params_read(moe_architecture("qwen3-30b-a3b"), 0) == 48 * (2048 * 5120 + 4096 * 2048
    ...     + 2048 * 128) + 2048 * 151936
    True
    """
    d, f = arch.d_model, arch.d_ff_expert
    hq, hkv = arch.n_heads * arch.d_head, arch.n_kv_heads * arch.d_head
    per_layer = d * (hq + 2 * hkv) + hq * d + d * arch.n_experts + touched * 3 * d * f
    return arch.n_layers * per_layer + d * arch.vocab


def time_decode(
    arch: MoEArchitecture,
    shapes: Iterable[tuple[int, int]],
    repeats: int = 20,
    seed: int = 0,
    impl: str = "pallas",
    tiles: tuple[int, int] | None = None,
    on_result=None,
    interpret: bool | None = None,
) -> list[dict]:
    """Median seconds of one jitted ``decode_step`` at each ``(batch, context)`` of ``shapes``
    (default device), with the experts each layer touched on average in the timed step (from
    its own routing) and the bytes it must read at that count (weights and KV cache, bf16).
    ``on_result(dict)`` is called after each shape (a long run reports as it goes);
    ``interpret`` runs the Pallas kernel in its interpreter, by default where the device is a CPU.

    Returns:
      one dict per shape: ``batch, context, seconds, touched, expected_touched, n_experts,
      bytes``.
    """
    from dcost.calibrate.decode_timing import init_cache

    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ValueError(f"time_decode.repeats = {repeats!r} is not allowed: an int >= 1")
    if impl not in IMPLS:
        raise ValueError(f"impl = {impl!r} is not allowed: one of {IMPLS}")
    weights = init_weights(arch, seed)
    if interpret is None:
        interpret = jax.default_backend() == "cpu"
    step = jax.jit(decode_step, static_argnums=(3, 4, 5, 6))
    kv_per_token = 2 * arch.n_layers * arch.n_kv_heads * arch.d_head * 2
    out = []
    for batch, context in shapes:
        if batch < 1 or context < 1:
            raise ValueError(f"shape (batch={batch}, context={context}): both must be >= 1")
        cache = init_cache(arch, batch, context, seed=batch + context)
        tokens = jnp.arange(batch, dtype=jnp.int32) * 7919 % arch.vocab
        args = (weights, cache, tokens, arch, impl, tiles, interpret)
        seconds = _median_time(step, *args, repeats=repeats)
        touched = float(jnp.mean(step(*args)[1]))
        result = {
            "batch": int(batch),
            "context": int(context),
            "seconds": seconds,
            "touched": touched,
            "expected_touched": expected_touched(arch, batch),
            "n_experts": arch.n_experts,
            "bytes": 2.0 * params_read(arch, touched) + float(batch * context * kv_per_token),
        }
        out.append(result)
        if on_result is not None:
            on_result(result)
        del cache
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
    impl: str = "pallas",
) -> list[dict]:
    """Validation records (``dcost.validation`` schema, ``decode_timing.bare_record``) of
    ``time_decode``'s timings: ``engine = "bare-xla"`` (dcost's own kernels, reported apart);
    ``impl`` the experts' kernel that ran, described in each record's note."""
    if impl not in IMPLS:
        raise ValueError(f"impl = {impl!r} is not allowed: one of {IMPLS}")
    records = []
    for t in timings:
        b, T, s = int(t["batch"]), int(t["context"]), float(t["seconds"])
        n_experts = t.get("n_experts", presets.model_card(model)["arch"]["n_experts"])
        records.append(
            bare_record(
                id=f"dcost-jax-{hardware}-{model}-moe-decode-b{b}-t{T}",
                hardware=hardware,
                model=model,
                source=source,
                source_id=source_id,
                quote=(
                    f"median of timed jitted decode steps on {device} ({software}): batch {b}, "
                    f"{T} cached tokens per sequence, {t['touched']:.1f} of {n_experts} experts "
                    f"touched per layer, {s * 1e3:.4g} ms per step"
                ),
                serving="decode",
                concurrency=b,
                prompt_tokens=T,
                output_tokens=2,
                metric="step_time",
                value=s,
                note=(
                    "Measured by dcost.calibrate.moe_timing: random bf16 weights of the preset's "
                    "architecture, attention in plain jax.numpy compiled by XLA, the routed "
                    f"experts by {_IMPL_TEXT[impl]}, one device, KV cache read "
                    "and not written, routing by a random router (less even than uniform: the "
                    "quote gives the experts the step touched). "
                    "prompt_tokens = T and output_tokens = 2 make the record's mean context "
                    "T + 1, the positions the step attends to."
                ),
            )
        )
    return records
