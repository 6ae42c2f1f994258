"""A pool's step time from a serving design: the serving model, tabulated for the planner.

The latency closed forms (``dcost.planning.latency``) see a pool through its **step time**
``t(B, c)``: one engine step of a replica with ``B`` running sequences that also prefills ``c``
prompt tokens. Here that time comes from the serving model's mixed step
(``dcost.mixed_step(..., chunk_tokens=c)``) for a replica **layout** (``Layout``: chips per
stage ``G``, stages ``P``, data-parallel attention groups ``A``, prefill chunk ``C``, draft tokens
``k``; expert parallelism is over the ``G`` chips of a stage, as in the serving model):

- the replica runs ``P`` micro-batches of ``B/P`` sequences, each with ``c/P`` prompt tokens, so a
  step (every sequence advances) is the pipeline trip
  ``trip(B, c) = P t_stage + (P-1) t_hop + t_draft`` of ``dcost.mixed_step`` at micro-batch
  ``B/P`` and chunk ``c/P``, with ``t_stage = max(t_compute, t_weights + t_kv, t_comm) +
  (serial excess) + t_overhead`` (the excess of kernels run one after another,
  ``dcost.serving.roofline.stage_time``);
- with speculative decoding a step advances ``tau = accepted_tokens(a, k)`` tokens, so the
  planner's step is a *token step*: ``t(B, c) = trip(B, c tau)/tau``, with a chunk budget of
  ``C/tau`` prompt tokens per token step (a prompt still takes ``P_u/C`` real steps).

The serving model is evaluated once per layout on a grid of ``(B, c)`` nodes and each of the five
parts (compute, memory, communication, serial excess, the rest) is interpolated bilinearly, the
maximum taken after: the parts are affine in ``B`` and ``c`` for a dense model (but for the
earlier chunks' KV reads, which stop at ``c = T_in``, and the serial excess, a sum of per-kernel
maxima), and MoE's expert fraction ``phi(B + c)`` and the matmul efficiency bend them a little
(the nodes are ``sqrt 2`` apart; ``tests/test_plan.py`` holds the table within 0.2 % of the
model for a dense one on the pure roofline, 2 % with a calibrated profile, 3 % for MoE). Past
the last node the last cell is extrapolated linearly.

Memory per chip is affine in the batch (``dcost.decode``'s ``memory_per_chip``): the table keeps
its value at batch 0 and its slope per running sequence of a replica.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost._types import FloatLeaf
from dcost.planning import latency as lat
from dcost.planning.latency import _take
from dcost.serving.mixed import _mixed_step, kv_transfer_time
from dcost.serving.roofline import admitted_share
from dcost.serving.speculative import _accepted_tokens
from dcost.specs import Design, Hardware, Model, Workload, _float, readable

__all__ = [
    "trip",
    "Layout",
    "StepTable",
    "step_table",
    "unused_table",
    "transfer_time",
    "workload_stats",
    "workload_of",
    "B_NODES",
    "C_NODES",
]

_B_PER_OCTAVE, _C_PER_OCTAVE = 2, 2
B_NODES = 2.0 ** (np.arange(2 * 16 + 1) / _B_PER_OCTAVE) - 1.0
"""Running sequences per replica at the table's nodes: 0, 0.41, 1, 1.83, ... 65535."""
_PARTS = 5
_C_UNIT = 16.0
C_NODES = _C_UNIT * (2.0 ** (np.arange(2 * 12 + 1) / _C_PER_OCTAVE) - 1.0)
"""Prompt tokens per replica step at the table's nodes: 0, 6.6, 16, ... 65520."""


class Layout(eqx.Module):
    """One replica's layout: what a pool's design fixes besides its replica count and batch cap.

    Attributes:
      chips: chips per pipeline stage ``G`` (tensor parallel for a dense model; expert parallel
        for an MoE model, ``Design.chips``).
      stages: pipeline stages ``P``; chips per replica ``P G``.
      attention_dp: data-parallel attention groups per stage ``A`` in ``[1, G]``
        (``Design.attention_dp``: 1 tensor-parallel attention, ``G`` data-parallel).
      chunk: prefill chunk ``C``: most prompt tokens a replica's step carries (tokens).
      draft_tokens: speculative length ``k`` (0: none).

    Every field is a float leaf, so a batch of layouts is one ``Layout`` with array fields.

    >>> Layout(8, 1, 1, 2048, 0).chips_per_replica
    Array(8., dtype=float32)
    """

    chips: FloatLeaf = eqx.field(converter=_float)
    stages: FloatLeaf = eqx.field(converter=_float)
    attention_dp: FloatLeaf = eqx.field(converter=_float)
    chunk: FloatLeaf = eqx.field(converter=_float)
    draft_tokens: FloatLeaf = eqx.field(converter=_float)

    __repr__ = readable

    @property
    def chips_per_replica(self):
        """``P G`` chips."""
        return self.stages * self.chips

    def design(self, micro_batch) -> Design:
        """The serving model's ``Design`` of one micro-batch of ``micro_batch`` sequences."""
        return Design(
            batch=micro_batch,
            chips=self.chips,
            stages=self.stages,
            attention_dp=self.attention_dp,
            draft_tokens=self.draft_tokens,
            prefill_chunk=self.chunk,
        )


class StepTable(eqx.Module):
    """The step time of one layout for one workload, tabulated (see the module docstring).

    Attributes:
      parts: ``(len(B_NODES), len(C_NODES), 5)`` seconds: one stage's compute, memory (weights
        + KV) and communication times, its kernels' serial excess over their maximum, and the
        rest of the trip (``P t_overhead + (P-1) t_hop + t_draft``).
      stages: ``P``.
      tau: tokens a sequence advances per step (1 without speculation).
      memory_base: HBM bytes per chip at batch 0 (weights, attention copies, draft).
      memory_per_sequence: HBM bytes per chip per running sequence of the replica (its KV).
      row: None for one table; for a view of a stack of tables (``select``), the one it reads
        (an integer, traced or not): ``parts`` keeps the whole stack's leading axis and is
        gathered lazily, cell by cell, never copied whole; the other fields are the row's.
    """

    parts: jax.Array
    stages: jax.Array
    tau: jax.Array
    memory_base: jax.Array
    memory_per_sequence: jax.Array
    row: jax.Array | None = None

    def select(self, row) -> StepTable:
        """The view of table ``row`` of a stack (every field with a leading axis): its scalar
        fields gathered once, its parts when a cell is read."""
        return StepTable(
            self.parts,
            _take(self.stages, row),
            _take(self.tau, row),
            _take(self.memory_base, row),
            _take(self.memory_per_sequence, row),
            row,
        )

    def _cells(self, ib, ic=None):
        at = tuple(i for i in (self.row, ib, ic) if i is not None)
        return _take(self.parts, *at)

    @property
    def p(self):
        """``P`` of this table."""
        return self.stages

    @property
    def tokens_per_step(self):
        """``tau`` of this table."""
        return self.tau

    def trip(self, batch, tokens):
        """Seconds of one replica step with ``batch`` running sequences and ``tokens`` prompt
        tokens (interpolated; arrays broadcast)."""
        if jnp.ndim(batch) == 0:  # one batch, many chunks: interpolate the row once
            ib, wb = _index(batch, 1.0, _B_PER_OCTAVE, B_NODES)
            row = self._cells(ib) * (1.0 - wb) + self._cells(ib + 1) * wb
            ic, wc = _index(tokens, _C_UNIT, _C_PER_OCTAVE, C_NODES)
            p = _take(row, ic) * (1.0 - wc[..., None]) + _take(row, ic + 1) * wc[..., None]
        else:
            batch, tokens = jnp.broadcast_arrays(batch, tokens)
            ib, wb = _index(batch, 1.0, _B_PER_OCTAVE, B_NODES)
            ic, wc = _index(tokens, _C_UNIT, _C_PER_OCTAVE, C_NODES)
            wb, wc = wb[..., None], wc[..., None]
            lo = self._cells(ib, ic) * (1.0 - wc) + self._cells(ib, ic + 1) * wc
            hi = self._cells(ib + 1, ic) * (1.0 - wc) + self._cells(ib + 1, ic + 1) * wc
            p = lo * (1.0 - wb) + hi * wb
        return self.p * (_stage(p) + p[..., 3]) + p[..., 4]

    def __call__(self, batch, tokens):
        """The planner's token step ``trip(B, c tau)/tau`` (s)."""
        tau = self.tokens_per_step
        return self.trip(batch, jnp.asarray(tokens) * tau) / tau

    def memory(self, batch):
        """HBM bytes per chip with ``batch`` running sequences per replica."""
        return self.memory_base + self.memory_per_sequence * batch


def _stage(p):
    """``max(compute, memory, comm)`` of the parts ``p[..., :3]``, as a chain of two-way
    maxima: ``jnp.max`` over the gathered parts had its reverse-mode derivative miscompiled
    under ``jit`` on XLA:CPU (JAX 0.10.2: ``grad`` 5 % off ``jacfwd`` and finite differences);
    the chain is the same value and differentiates right."""
    return jnp.maximum(jnp.maximum(p[..., 0], p[..., 1]), p[..., 2])


def _index(x, unit, per_octave, nodes):
    """Cell ``i`` and weight ``w`` of ``x`` on nodes ``unit (2**(j/r) - 1)``: linear in ``x``
    inside the cell, extrapolated past the last one."""
    x = jnp.maximum(jnp.asarray(x, dtype=jnp.result_type(float)), 0.0)
    j = jnp.floor(per_octave * jnp.log2(1.0 + x / unit))
    i = jnp.clip(j, 0, len(nodes) - 2).astype(jnp.int32)
    lo = _take(jnp.asarray(nodes, x.dtype), i)
    hi = _take(jnp.asarray(nodes, x.dtype), i + 1)
    return i, (x - lo) / (hi - lo)


def _report(layout: Layout, hardware: Hardware, model: Model, workload: Workload, batch, tokens):
    """``dcost.mixed_step`` 's report (its traced body, exact) of a replica step at ``batch``
    sequences and ``tokens`` prompt tokens: micro-batch ``batch/P``, chunk ``tokens/P``."""
    p = layout.stages
    return _mixed_step(layout.design(batch / p), hardware, model, workload, 0.0, tokens / p)


def _admission(layout: Layout, hardware: Hardware, workload: Workload, batch, kind):
    """What a ``"decode"`` pool's replica trip adds for the sequences it admits (s):
    ``P s prefill_step_overhead``, each of the ``P`` micro-batches of ``B/P`` admitting in a
    share ``s = min(1, (B/P) tau / T_out)`` of its steps (``dcost.serving.roofline.
    admitted_share``, as ``dcost.decode`` charges it); 0 for the other kinds, whose prompt
    steps pay it in ``dcost.mixed_step``. ``kind`` is the pool's role, or a traced weight (1 a
    decode pool, 0 another) so that one program serves every role."""
    if isinstance(kind, str):
        if kind != "decode":
            return 0.0
        kind = 1.0
    p = layout.stages
    tau = _accepted_tokens(workload.get("acceptance"), layout.draft_tokens)
    share = admitted_share(batch / p, tau, workload.output)
    return kind * p * share * hardware.get("prefill_step_overhead")


def trip(
    layout: Layout,
    hardware: Hardware,
    model: Model,
    workload: Workload,
    batch,
    tokens,
    kind="aggregated",
):
    """The exact replica trip ``P t_stage + (P-1) t_hop + t_draft`` (s) (``tpot`` times the
    accepted tokens per step), of a pool of ``kind`` (a ``"decode"`` pool's trips pay for the
    sequences they admit, ``_admission``; a traced 0/1 weight also works)."""
    r = _report(layout, hardware, model, workload, batch, tokens)
    return r.tpot * r.tokens_per_step + _admission(layout, hardware, workload, batch, kind)


def _parts(
    layout: Layout,
    hardware: Hardware,
    model: Model,
    workload: Workload,
    batch,
    tokens,
    kind: str = "aggregated",
):
    """The five parts (s) and memory per chip of a replica step at ``batch`` sequences and
    ``tokens`` prompt tokens, from ``dcost.mixed_step`` (exact, smoothness 0): one stage's
    compute, memory and communication times (the whole-step roofline takes their maximum), the
    excess of its kernels run in series over that roofline
    (``t_stage - t_overhead - max(...)``, 0 when ``Hardware.kernel_serialization`` is 0; see
    ``dcost.serving.roofline.stage_time``), and the rest of the trip (a ``"decode"`` pool's
    admissions, ``_admission``, included)."""
    p = layout.stages
    r = _report(layout, hardware, model, workload, batch, tokens)
    roofline = jnp.stack([r.t_compute, r.t_weights + r.t_kv, r.t_comm])
    serial = r.t_stage - r.t_overhead - _stage(roofline)
    rest = p * r.t_overhead + (p - 1.0) * r.t_hop + r.t_draft
    rest = rest + _admission(layout, hardware, workload, batch, kind)
    parts = jnp.stack([r.t_compute, r.t_weights + r.t_kv, r.t_comm, serial, rest])
    return parts, r.memory_per_chip


def step_table(
    layout: Layout, hardware: Hardware, model: Model, workload: Workload, kind: str = "aggregated"
) -> StepTable:
    """Tabulate the serving model's step for one layout (vmap over layouts for many).

    Args:
      layout: the replica's layout.
      hardware, model: the chip and the network.
      workload: ``context`` the mean context of a decoding sequence (tokens); ``prompt`` the
        mean prompt (its attention and earlier chunks' KV reads); ``output`` (unused but >= 1);
        ``acceptance`` for speculative layouts.
      kind: ``"aggregated"`` tabulates every batch and chunk node; a ``"decode"`` pool's steps
        carry no chunk and a ``"prefill"`` pool's no decode batch, so theirs are computed
        along one axis and repeated along the other (a twentieth of the work); a decode pool's
        steps also pay for the sequences they admit (``_admission``).

    Returns:
      A ``StepTable``.

    >>> import dcost
    >>> h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    >>> w = dcost.Workload(1200, prompt=1000, output=1)  # chunks capped at prefill_chunk
    >>> t = step_table(Layout(8, 1, 1, 512, 0), h, m, w)
    >>> exact = dcost.mixed_step(dcost.Design(64, 8, attention_dp=1, prefill_chunk=512), h, m, w)
    >>> bool(abs(float(t(64.0, 512.0)) / float(exact.tpot) - 1) < 1e-3)
    True
    """
    nb, nc = len(B_NODES), len(C_NODES)
    if kind == "decode":
        bb, cc = B_NODES, np.zeros(nb)
    elif kind == "prefill":
        bb, cc = np.zeros(nc), C_NODES
    else:
        grid_b, grid_c = np.meshgrid(B_NODES, C_NODES, indexing="ij")
        bb, cc = grid_b.ravel(), grid_c.ravel()
    dtype = jnp.result_type(float)
    batch = jnp.asarray(np.append(bb, [0.0, 1.0]), dtype)  # the last two nodes: memory
    tokens = jnp.asarray(np.append(cc, [0.0, 0.0]), dtype)
    parts, memory = jax.vmap(lambda b, c: _parts(layout, hardware, model, workload, b, c, kind))(
        batch, tokens
    )
    parts, m0, m1 = parts[:-2], memory[-2], memory[-1]
    if kind == "decode":
        parts = jnp.broadcast_to(parts[:, None, :], (nb, nc, _PARTS))
    elif kind == "prefill":
        parts = jnp.broadcast_to(parts[None, :, :], (nb, nc, _PARTS))
    else:
        parts = parts.reshape(nb, nc, _PARTS)
    tau = _accepted_tokens(workload.get("acceptance"), layout.draft_tokens)
    return StepTable(parts, layout.stages, tau, m0, m1 - m0)


def unused_table(layout: Layout, hardware: Hardware, model: Model, workload: Workload) -> StepTable:
    """What ``step_table`` gives a layout of ``chips = NaN`` (the planner's padding rows), without
    evaluating the serving model: every time and byte NaN (``chips`` reaches each of them), its
    stages and tokens per step as the layout's, in the dtype the inputs promote to (what the
    serving model computes in).

    >>> import dcost, jax, jax.numpy as jnp
    >>> h, m, w = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b"), dcost.Workload(1200)
    >>> pad = Layout(jnp.nan, 2, 1, 512, 0)
    >>> t = jax.jit(lambda lay: step_table(lay, h, m, w))(pad)
    >>> u = unused_table(pad, h, m, w)
    >>> all(bool(jnp.array_equal(a, b, equal_nan=True)) and a.dtype == b.dtype
    ...     for a, b in zip(jax.tree.leaves(t), jax.tree.leaves(u), strict=True))
    True
    """
    dtype = jnp.result_type(*jax.tree.leaves((layout, hardware, model, workload)), float)
    nan = jnp.asarray(jnp.nan, dtype)
    tau = _accepted_tokens(workload.get("acceptance"), layout.draft_tokens)
    return StepTable(
        jnp.full((len(B_NODES), len(C_NODES), _PARTS), nan),
        jnp.asarray(layout.stages, dtype),
        jnp.asarray(tau, dtype),
        nan,
        nan,
    )


def transfer_time(hardware: Hardware, model: Model, layout: Layout):
    """``d(T_in)``: the KV transfer of a prompt from a prefill replica of ``layout`` (s), over
    the scale-out links of its ``P G`` chips (``dcost.kv_transfer_time``)."""

    def d(tokens):
        return kv_transfer_time(tokens, hardware, model, layout.chips_per_replica)

    return d


def workload_stats(traffic):
    """``(context, prompt, output)`` means of a traffic (tokens), what a step table needs: the
    decode context is the time average of a running sequence's KV cache,
    ``E[T_in] + E[K^2] / (2 E[K])`` with ``K = T_out - 1`` (a sequence with ``K`` steps holds
    ``T_in + K/2`` tokens on average over them, and it is running for ``K`` steps)."""
    w = jnp.asarray(lat._W_OUT, dtype=jnp.result_type(float))
    k = jnp.maximum(lat._lengths(traffic, "output") - 1.0, 0.0)
    ek, ek2 = jnp.sum(w * k), jnp.sum(w * k * k)
    context = traffic.prompt_tokens + ek2 / (2.0 * jnp.maximum(ek, 1e-6))
    return jnp.stack([context, traffic.prompt_tokens, traffic.output_tokens])


def workload_from_stats(stats, kind: str, acceptance=None, expert_imbalance=None) -> Workload:
    """The ``Workload`` of a pool of ``kind`` from ``workload_stats``: a prefill pool's
    sequences in flight hold their prompt (its context is the prompt). ``expert_imbalance``:
    the expert load its steps are timed at (``dcost.serving.moe.profiled_routing``; None:
    balanced)."""
    context, prompt, output = stats[0], stats[1], stats[2]
    if kind == "prefill":
        context = prompt
    return Workload(
        context,
        prompt=prompt,
        output=jnp.maximum(output, 1.0),
        acceptance=acceptance,
        expert_imbalance=expert_imbalance,
    )


def workload_of(traffic, kind: str, acceptance=None, expert_imbalance=None) -> Workload:
    """``workload_from_stats(workload_stats(traffic), kind, acceptance, expert_imbalance)``."""
    dtype = jnp.result_type(float)
    acc = None if acceptance is None else jnp.asarray(acceptance, dtype)
    imb = None if expert_imbalance is None else jnp.asarray(expert_imbalance, dtype)
    return workload_from_stats(workload_stats(traffic), kind, acc, imb)
