"""A pretraining run: FLOPs, wall-clock time, dollars, and whether the layout fits in HBM.

.. math::
    C = 6 N_{active} D, \\quad
    t = \\frac{C}{n F \\cdot \\mathrm{mfu}\\,(1 - \\text{bubble})}, \\quad
    \\$ = n\\, p\\, t / 3600

The run uses ``n`` chips in all (``n_chips``), laid out as ``n = data x tensor x stages``
(``TrainingSetup``): ``tensor`` chips share each stage's weights (tensor or expert parallel, with
sequence parallelism), ``stages`` pipeline stages run the 1F1B schedule over ``microbatches``
micro-batches, and the rest is data parallel. References: Kaplan et
al. 2020 (6 N D); Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU
Clusters Using Megatron-LM" (1F1B bubble); Rajbhandari et al. 2020, "ZeRO" (16 bytes of mixed
precision Adam state per parameter); Korthikanti et al. 2022, "Reducing Activation Recomputation
in Large Transformer Models" (activation memory).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost.specs import Hardware, Model, SpecError, _concrete, check

__all__ = [
    "TrainingRun",
    "TrainingSetup",
    "training_run",
    "bubble_fraction",
    "activation_bytes",
    "RECOMPUTE",
    "D_HEAD",
    "ASPECT_RATIO",
]

RECOMPUTE = ("none", "selective", "full")
D_HEAD = 128.0
"""Head width assumed when the activation estimate needs a head count: ``heads = d / 128``."""
ASPECT_RATIO = 128.0
"""Width over depth ``d / L`` assumed for a model given as a bare parameter count (GPT-3 175B:
12288 / 96 = 128), with ``N = 12 L d**2`` (Kaplan et al. 2020, table 1)."""


class TrainingRun(eqx.Module):
    """What a pretraining run costs (SI units). A pytree: batched inputs give array fields.

    Attributes:
      flops: model FLOPs ``6 N_active D`` (FLOP).
      seconds: wall-clock time, pipeline bubble included (s).
      cost: ``n_chips * price_per_hour * seconds / 3600`` ($).
      bubble: 1F1B bubble fraction of the wall-clock time ``(P-1)/(m+P-1)``.
      memory_weights: bytes per chip of weights and gradients.
      memory_optimizer: bytes per chip of optimizer state (fp32 master copy, Adam moments).
      memory_activations: bytes per chip of stored activations (first pipeline stage).
      memory_per_chip: the sum of the three (bytes).
      hbm_capacity: the chip's HBM (bytes).
      fits: ``memory_per_chip <= hbm_capacity``.
    """

    flops: jax.Array
    seconds: jax.Array
    cost: jax.Array
    bubble: jax.Array
    memory_weights: jax.Array
    memory_optimizer: jax.Array
    memory_activations: jax.Array
    memory_per_chip: jax.Array
    hbm_capacity: jax.Array
    fits: jax.Array


def bubble_fraction(stages, microbatches):
    """Idle fraction of a 1F1B (or GPipe) pipeline schedule.

    .. math:: \\text{bubble} = \\frac{P - 1}{m + P - 1}

    Each of ``P`` stages works ``m`` micro-batch slots (forward + backward) out of
    ``m + P - 1``: the pipeline fills and drains for ``P - 1`` slots.

    Args:
      stages: pipeline stages ``P`` (a whole number >= 1).
      microbatches: micro-batches per optimizer step ``m`` (a whole number >= 1).

    >>> import dcost
    >>> float(dcost.bubble_fraction(4, 13))  # 3 idle slots out of 16
    0.1875

    Reference: Narayanan et al. 2021 (arXiv:2104.04473), section 2.2.1.
    """
    check("bubble_fraction", "stages", stages, low=1.0, integer=True)
    check("bubble_fraction", "microbatches", microbatches, low=1.0, integer=True)
    p = jnp.asarray(stages, dtype=jnp.result_type(float))
    return (p - 1.0) / (microbatches + p - 1.0)


def activation_bytes(seq_len, micro_batch, d_model, heads, tensor, recompute="selective"):
    """Activation bytes one transformer layer stores for one micro-batch (16-bit activations).

    .. math::
        \\text{none:}\\ \\frac{s b h}{t}\\left(34 + \\frac{5 a s}{h}\\right), \\quad
        \\text{selective:}\\ \\frac{34\\, s b h}{t}, \\quad
        \\text{full:}\\ 2 s b h

    for ``s`` tokens per sequence, ``b`` sequences, width ``h``, ``a`` heads and ``t``-way tensor
    parallelism with sequence parallelism. ``34 sbh`` counts the layer's inputs, LayerNorms, GeLU
    input, dropout masks and attention/MLP intermediates; ``5 a s**2 b`` the attention scores,
    softmax output and its dropout mask, which selective recomputation recomputes instead of
    storing (as FlashAttention does); full recomputation keeps only the layer input.

    Args:
      seq_len: tokens per sequence ``s``.
      micro_batch: sequences per micro-batch ``b``.
      d_model: width ``h``.
      heads: attention heads ``a``.
      tensor: tensor-parallel degree ``t``.
      recompute: "none", "selective" or "full".

    Returns:
      Bytes.

    >>> from dcost.training import runs as tr
    >>> float(tr.activation_bytes(2048, 1, 12288, 96, 8)) / 1e6  # GPT-3 175B, selective
    106.954752

    Reference: Korthikanti et al. 2022 (arXiv:2205.05198), sections 4.1-5, table 2.
    """
    if recompute not in RECOMPUTE:
        raise ValueError(
            f"recompute = {recompute!r} is not allowed: it must be one of {', '.join(RECOMPUTE)}"
        )
    sbh = seq_len * micro_batch * d_model
    if recompute == "full":
        return jnp.asarray(2.0 * sbh, dtype=jnp.result_type(float))
    scores = 5.0 * heads * seq_len / d_model if recompute == "none" else 0.0
    return sbh / tensor * (34.0 + scores)


def _shape(model):
    """(N_total, N_active, layers, width) of a ``Model`` or a bare dense parameter count."""
    if isinstance(model, Model):
        return model.params_total, model.params_active, model.n_layers, model.d_model
    check("training_run", "model", model, low_open=True)
    n = jnp.asarray(model, dtype=jnp.result_type(float))
    d = (ASPECT_RATIO * n / 12.0) ** (1.0 / 3.0)
    return n, n, d / ASPECT_RATIO, d


class TrainingSetup(eqx.Module):
    """How a pretraining run is laid out and what it keeps in memory (a pytree; the numeric fields
    may be traced, e.g. vmapped over layouts).

    Args:
      stages: pipeline stages ``P`` (>= 1).
      microbatches: micro-batches per optimizer step ``m`` (>= 1).
      tensor: chips sharing one stage's weights ``t`` (tensor parallel) (>= 1).
      seq_len: tokens per sequence ``s`` (>= 1).
      micro_batch: sequences per micro-batch ``b`` (>= 1).
      recompute: "none", "selective" or "full" activation recomputation (static).
      weight_bytes: bytes per parameter of weights and gradients (bf16 + bf16 = 4).
      optimizer_bytes: bytes per parameter of optimizer state (fp32 master + Adam m, v = 12).
      shard_optimizer: split the optimizer state over data-parallel replicas (ZeRO-1) (static).

    >>> import dcost
    >>> s = dcost.TrainingSetup(tensor=8, stages=4, microbatches=32)
    >>> float(s.tensor * s.stages), s.recompute
    (32.0, 'selective')
    """

    stages: jax.Array
    microbatches: jax.Array
    tensor: jax.Array
    seq_len: jax.Array
    micro_batch: jax.Array
    weight_bytes: jax.Array
    optimizer_bytes: jax.Array
    recompute: str = eqx.field(static=True)
    shard_optimizer: bool = eqx.field(static=True)

    def __init__(
        self,
        stages=1,
        microbatches=1,
        tensor=1,
        seq_len=4096,
        micro_batch=1,
        recompute="selective",
        weight_bytes=4.0,
        optimizer_bytes=12.0,
        shard_optimizer=True,
    ):
        for name, v in (
            ("stages", stages),
            ("microbatches", microbatches),
            ("tensor", tensor),
            ("seq_len", seq_len),
            ("micro_batch", micro_batch),
        ):
            check("TrainingSetup", name, v, low=1.0, integer=True)
        check("TrainingSetup", "weight_bytes", weight_bytes)
        check("TrainingSetup", "optimizer_bytes", optimizer_bytes)
        if recompute not in RECOMPUTE:
            raise ValueError(
                f"TrainingSetup.recompute = {recompute!r} is not allowed: it must be one of "
                f"{', '.join(RECOMPUTE)}"
            )
        f = jnp.result_type(float)
        self.stages = jnp.asarray(stages, f)
        self.microbatches = jnp.asarray(microbatches, f)
        self.tensor = jnp.asarray(tensor, f)
        self.seq_len = jnp.asarray(seq_len, f)
        self.micro_batch = jnp.asarray(micro_batch, f)
        self.weight_bytes = jnp.asarray(weight_bytes, f)
        self.optimizer_bytes = jnp.asarray(optimizer_bytes, f)
        self.recompute = recompute
        self.shard_optimizer = bool(shard_optimizer)


def training_run(
    model, n_tokens, hardware: Hardware, n_chips, mfu, setup: TrainingSetup | None = None
) -> TrainingRun:
    """Time, cost and per-chip memory of pretraining ``model`` on ``n_tokens`` tokens.

    .. math::
        C = 6 N_{active} D, \\quad
        \\text{seconds} = \\frac{C}{n F\\,\\mathrm{mfu}\\,(1 - \\text{bubble})}, \\quad
        \\text{bubble} = \\frac{P-1}{m+P-1}

        \\text{memory} = \\frac{(b_{wg} + b_{opt}/\\text{data}) N_{total}}{t P}
            + \\text{activation\\_bytes} \\cdot \\frac{L}{P} \\min(m, P)

    ``data = n / (t P)`` data-parallel replicas; ``b_opt`` is divided by ``data`` only when
    ``shard_optimizer`` (ZeRO stage 1, Megatron's distributed optimizer). Under 1F1B the first
    stage holds activations of ``min(m, P)`` micro-batches for its ``L/P`` layers (Korthikanti et
    al., section 4.2.3). ``mfu`` is the utilization while a chip computes: recomputation FLOPs and
    the bubble are not in it. Neglected: embedding and output-layer activations, temporary
    buffers, fragmentation; for a routed model the weights are split only ``t P`` ways and the
    activation estimate is that of a dense layer of the same width.

    Args:
      model: a ``dcost.Model``, or a dense parameter count (shape from ``ASPECT_RATIO``).
      n_tokens: training tokens ``D``.
      hardware: the chip (peak ``flops``, ``hbm_capacity``, ``price_per_hour``).
      n_chips: all chips of the run ``n``; a multiple of ``tensor * stages``.
      mfu: model FLOP utilization in (0, 1].
      setup: the layout and memory (a ``TrainingSetup``); None: one stage, no tensor parallelism,
        the defaults of ``TrainingSetup``.

    Returns:
      A ``TrainingRun``.

    >>> import dcost
    >>> setup = dcost.TrainingSetup(tensor=8, stages=4, microbatches=32)
    >>> run = dcost.training_run(70e9, 15e12, dcost.hardware("h100-sxm"), 4096, 0.45, setup)
    >>> round(float(run.seconds) / 86400, 1), bool(run.fits)
    (43.7, True)

    References: Narayanan et al. 2021 (arXiv:2104.04473); Rajbhandari et al. 2020
    (arXiv:1910.02054), section 3.1; Korthikanti et al. 2022 (arXiv:2205.05198).
    """
    s = TrainingSetup() if setup is None else setup
    if not isinstance(s, TrainingSetup):
        raise ValueError(
            f"training_run.setup must be a dcost.TrainingSetup or None, got {type(s).__name__}"
        )
    if not isinstance(hardware, Hardware):
        hint = f" (e.g. dcost.hardware({hardware!r}))" if isinstance(hardware, str) else ""
        raise ValueError(
            f"training_run.hardware must be a dcost.Hardware{hint}, got {type(hardware).__name__}"
        )
    n_total, n_active, layers, width = _shape(model)
    check("training_run", "n_tokens", n_tokens, low_open=True)
    check("training_run", "n_chips", n_chips, low=1.0, integer=True)
    check("training_run", "mfu", mfu, low_open=True, high=1.0)
    stages, tensor, microbatches = s.stages, s.tensor, s.microbatches
    c, split = _concrete(n_chips), _concrete(stages * tensor)
    if c is not None and split is not None:
        ratio = c / split
        if np.any((ratio < 1) | (ratio != np.round(ratio))):
            raise ValueError(
                f"training_run.n_chips = {float(np.max(c))!r} is not allowed: it must "
                f"be a multiple of tensor * stages = {float(np.max(split))!r}"
            )
    data = n_chips / (stages * tensor)

    flops = 6.0 * n_active * n_tokens
    bubble = bubble_fraction(stages, microbatches)
    seconds = flops / (n_chips * hardware.flops * mfu) / (1.0 - bubble)
    cost = n_chips * hardware.price_per_hour * seconds / 3600.0

    shard = n_total / (tensor * stages)
    mem_w = s.weight_bytes * shard
    mem_opt = s.optimizer_bytes * shard / (data if s.shard_optimizer else 1.0)
    per_layer = activation_bytes(
        s.seq_len, s.micro_batch, width, width / D_HEAD, tensor, s.recompute
    )
    mem_act = per_layer * layers / stages * jnp.minimum(microbatches, stages)
    total = mem_w + mem_opt + mem_act
    run = TrainingRun(
        flops,
        seconds,
        cost,
        bubble,
        mem_w,
        mem_opt,
        mem_act,
        total,
        hardware.hbm_capacity,
        total <= hardware.hbm_capacity,
    )
    _finite_run(run, n_tokens)
    return run


def _finite_run(run: TrainingRun, n_tokens) -> None:
    """Raise SpecError when a concrete field of ``run`` is inf or NaN: inputs (a token count
    near the float dtype's largest number) whose results overflow; traced runs pass."""
    bad = []
    for name in ("flops", "seconds", "cost", "memory_per_chip"):
        v = _concrete(getattr(run, name))
        if v is not None and not np.all(np.isfinite(v)):
            bad.append(f"{name} = {float(np.ravel(v)[~np.isfinite(np.ravel(v))][0])}")
    if bad:
        dtype = np.dtype(jnp.result_type(float)).name
        raise SpecError(
            f"training_run: n_tokens = {float(np.max(np.asarray(n_tokens, dtype=float))):g} with "
            f"this model and hardware is not allowed: its results overflow {dtype} "
            f"({', '.join(bad)}); every result must be finite: train on fewer tokens or a "
            "smaller model, or enable jax_enable_x64"
        )
