"""The inputs of every cost model: hardware, model, workload and design, as frozen pytrees.

Every numeric field is a float leaf (SI units: s, bytes, FLOP, FLOP/s, bytes/s, $), so a spec can be
differentiated with ``jax.grad`` and a batch of specs is the same class with array fields under
``jax.vmap``. Values are checked when a spec is built from concrete numbers: a bad field raises
``ValueError`` naming the field, the value and what is allowed. Inside ``jit`` (traced fields) the
checks are skipped; specs built outside and passed in were already checked.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.tree_util import PyTreeDef

from dcost._types import FloatLeaf, OptionalFloatLeaf

__all__ = [
    "Hardware",
    "Model",
    "Workload",
    "Design",
    "SpecError",
    "stack",
    "shared_form",
    "attention_splits",
]


class SpecError(ValueError):
    """A spec field holds a value the model cannot use."""


_FLOAT32, _FLOAT64 = np.dtype(np.float32), np.dtype(np.float64)
# each float dtype's largest finite number, smallest positive normal one, and the whole number
# below which it holds every integer exactly (2**(mantissa bits + 1))
_LIMITS = {
    d: (float(np.finfo(d).max), float(np.finfo(d).tiny), float(2 ** (np.finfo(d).nmant + 1)))
    for d in (_FLOAT32, _FLOAT64)
}


def _default_float() -> np.dtype:
    """JAX's default float dtype now: float32, or float64 under x64 (``jnp.result_type(float)``,
    read from the x64 setting, which ``jax.enable_x64`` changes, at a fraction of its cost: a spec
    converts every field)."""
    return _FLOAT64 if jax.config.read("jax_enable_x64") else _FLOAT32


def float_max() -> float:
    """The largest finite number of JAX's default float dtype (float32, or float64 under x64)."""
    return _LIMITS[_default_float()][0]


def float_tiny() -> float:
    """The smallest positive normal number of JAX's default float dtype (``1.18e-38`` in
    float32): a nonzero value below it becomes 0 or keeps only a few digits."""
    return _LIMITS[_default_float()][1]


def whole_max() -> float:
    """The largest whole number below which JAX's default float holds every integer exactly.

    ``2**24 = 16,777,216`` in float32 (``2**53`` under x64): past it ``n`` and ``n + 1`` are the
    same number, so a count (batch, chips, layers) no longer means what it says.
    """
    return _LIMITS[_default_float()][2]


def _dtype_problem(x) -> str | None:
    """Why ``x`` cannot be a numeric field (a string, None, a boolean, a complex number, an array
    of such), or None when it can."""
    if x is None:
        return "None"
    if isinstance(x, (str, bytes)):
        return "a string"
    if isinstance(x, (bool, np.bool_)):
        return "a boolean"
    if isinstance(x, (int, float, np.integer, np.floating)):
        return None  # a Python int of any size is a number (70_000_000_000, 10**30)
    if isinstance(x, complex):
        return "a complex number"
    if isinstance(x, (jax.Array, np.ndarray, np.generic)):
        kind = np.dtype(x.dtype).kind
    else:
        try:
            kind = np.asarray(x).dtype.kind
        except Exception:  # noqa: BLE001 - anything NumPy cannot hold is not a number
            return f"a {type(x).__name__}"
    if kind in "fiu":
        if isinstance(x, (list, tuple, np.ndarray)) and np.size(x) == 0:
            return "an empty array"  # no number at all (every check of it would pass)
        return None
    what = {"b": "booleans", "c": "complex numbers", "U": "strings", "S": "bytes"}
    if kind == "O":
        return f"a {type(x).__name__} holding things that are not numbers"
    return f"an array of {what.get(kind, f'dtype {kind}')}"


class _Invalid:
    """What the converter makes of a value that is not a real number (``why`` says what it is), or
    of a number beyond the float dtype's range (``why`` None): ``check`` reports it by name (a
    converter does not know the field it converts)."""

    __slots__ = ("value", "why")

    def __init__(self, value, why):
        self.value, self.why = value, why

    def __repr__(self) -> str:
        return f"<not a number: {_short(self.value)}>"


def _short(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _float(x):
    """Converter: Python/NumPy numbers become JAX float arrays; tracers pass through.

    The result is always strongly typed (never a weak-typed Python-float array), so ``64`` and
    ``64.0`` give leaves of the same abstract value and a jitted cost function is not recompiled.
    ``None`` stays None (optional fields; ``check`` refuses it for required ones); a string, a
    boolean, a complex number or an array of them becomes a marker that ``check`` reports with the
    field's name.
    """
    if x is None:
        return None
    if isinstance(x, jax.core.Tracer):
        return x
    kind = type(x)
    if kind is float or kind is int:  # the common case, without NumPy's checks (bool is not int)
        dtype = _default_float()
        fmax, tiny, _ = _LIMITS[dtype]
        try:
            v = float(x)
        except OverflowError:  # an int past float64's range (10**400): not a number we can hold
            return _Invalid(x, "a number beyond any float's range")
        if math.isfinite(v) and (abs(v) > fmax or (v != 0 and abs(v) < tiny)):
            return _Invalid(x, None)
        return jax.device_put(np.asarray(v, dtype))
    if isinstance(x, jax.Array) and not x.weak_type and np.dtype(x.dtype).kind == "f":
        return x  # a strongly typed float array already (``jnp.asarray`` would give it back)
    why = _dtype_problem(x)
    if why is not None:
        return _Invalid(x, why)
    if not isinstance(x, jax.Array):
        x = np.asarray(x)  # a Python int above 2**31 (70_000_000_000) must not pass through int32
        if not np.issubdtype(x.dtype, np.floating):
            x = x.astype(float)
        if np.any(np.isfinite(x) & (np.abs(x) > float_max())):
            return _Invalid(x, None)  # would become inf: ``check`` names the range
        if np.any((x != 0) & (np.abs(x) < float_tiny())):
            return _Invalid(x, None)  # would become 0 or lose its digits: ``check`` names it
        if x.dtype == np.float64 and jnp.result_type(float) != np.float64:
            x = x.astype(jnp.result_type(float))  # JAX's default float (float32 without x64)
        # a plain transfer: jnp.asarray would run an XLA program of its own (compiled, or loaded
        # from the cache: 30 ms in a fresh process)
        return jax.device_put(x)
    arr = jnp.asarray(x)
    dtype = arr.dtype if jnp.issubdtype(arr.dtype, jnp.floating) else jnp.result_type(float)
    return jnp.asarray(arr, dtype=dtype)


def _concrete(x):
    """The value as a NumPy array, or None when it is traced (inside jit/grad/vmap)."""
    if x is None or isinstance(x, (jax.core.Tracer, _Invalid)):
        return None
    try:
        return np.asarray(x, dtype=float)
    except (TypeError, ValueError, jax.errors.ConcretizationTypeError):
        return None


def _scalar(x: np.ndarray | float) -> float:
    """``x`` as people typed it: a float32 value prints at float32's own precision (1e+30, not
    1.0000000150474662e+30)."""
    x = float(x)
    if np.isfinite(x) and abs(x) <= float(np.finfo(np.float32).max) and float(np.float32(x)) == x:
        return float(str(np.float32(x)))
    return x


def _show(v: np.ndarray) -> str:
    if v.ndim == 0:
        return repr(_scalar(v))
    return f"array of shape {v.shape} with {[_scalar(x) for x in v.ravel()[:3]]}..."


def check_share(owner: str, name: str, x, high: float = 0.5) -> float:
    """``x`` as a ``float``, or SpecError unless it is a real number in ``[0, high)`` (never a
    boolean or a string): a share given as an argument (a simulation's warmup).

    >>> check_share("simulate", "warmup", 0.1)
    0.1
    >>> try:
    ...     check_share("simulate", "warmup", "x")
    ... except SpecError as err:
    ...     print(err)
    simulate.warmup = 'x' is not allowed: it must be a number in [0, 0.5)
    """
    number = isinstance(x, (int, float, np.integer, np.floating))
    if not number or isinstance(x, (bool, np.bool_)) or not 0.0 <= float(x) < high:
        raise SpecError(
            f"{owner}.{name} = {x!r} is not allowed: it must be a number in [0, {high})"
        )
    return float(x)


def check_count(owner: str, name: str, x, low: int = 1) -> int:
    """``x`` as an ``int``, or SpecError unless it is a whole number ``>= low`` (a Python or
    NumPy integer, or a float with a whole value; never a boolean, a string or NaN): the one
    check of a count given as an argument (requests, events, replicas, chunks, layouts).

    >>> import numpy as np
    >>> check_count("simulate", "requests", np.int64(1000))
    1000
    >>> try:
    ...     check_count("simulate", "max_events", 0)
    ... except SpecError as err:
    ...     print(err)
    simulate.max_events = 0 is not allowed: it must be a whole number >= 1
    """
    number = isinstance(x, (int, float, np.integer, np.floating))
    if (
        not number
        or isinstance(x, (bool, np.bool_))
        or not math.isfinite(float(x))
        or float(x) != round(float(x))
        or x < low
    ):
        raise SpecError(
            f"{owner}.{name} = {x!r} is not allowed: it must be a whole number >= {low}"
        )
    return int(x)


def check_flag(owner: str, name: str, x) -> None:
    """Raise SpecError unless ``x`` is a boolean (``True``, ``False`` or a NumPy bool): a switch
    is never read by truthiness (``calibrated="no"`` is a string, not False).

    >>> check_flag("hardware", "calibrated", True)
    >>> try:
    ...     check_flag("hardware", "calibrated", "no")
    ... except SpecError as err:
    ...     print(err)
    hardware.calibrated = 'no' is not allowed: it must be True or False
    """
    if not isinstance(x, (bool, np.bool_)):
        raise SpecError(f"{owner}.{name} = {x!r} is not allowed: it must be True or False")


def check(owner: str, name: str, x, *, low=0.0, low_open=False, high=None, integer=False):
    """Raise SpecError unless every element of ``x`` is a finite real number within the range.

    ``None``, strings, booleans, complex numbers and arrays of them are refused by name. A value
    beyond the largest number of JAX's default float (``float_max()``) is refused, since it would
    become ``inf`` in the computation; a whole number must also be at most ``whole_max()``.

    Args:
      owner: class or function name used in the message, e.g. "Hardware".
      name: the field name.
      x: the value (skipped when traced).
      low: smallest allowed value.
      low_open: True when ``low`` itself is not allowed (strictly positive fields).
      high: largest allowed value, or None.
      integer: True when the value must be a whole number (reported, never rounded).
    """
    if isinstance(x, jax.core.Tracer):
        return
    if isinstance(x, _Invalid):
        value, why = x.value, x.why
        if why is None:  # a number out of the dtype's range: checked below as the number it is
            x = value
    else:
        value, why = x, _dtype_problem(x)
    if integer:
        high = whole_max() if high is None else min(high, whole_max())

    def allowed() -> str:  # what the message says is allowed (built only to raise)
        text = f"{'>' if low_open else '>='} {_bound(low)}"
        if high is not None:
            text += f" and <= {_bound(high)}"
        return "a whole number " + text if integer else text

    if why is not None:
        raise SpecError(
            f"{owner}.{name} = {_short(value)} is not allowed: it must be a real number "
            f"{allowed()}, not {why}"
        )
    v = _concrete(x)
    if v is None:
        return
    fmax = float_max()
    bad = ~np.isfinite(v)
    bad |= (v <= low) if low_open else (v < low)
    if high is not None:
        bad |= v > high
    if integer:
        bad |= np.isfinite(v) & (v != np.round(v))
    huge = np.isfinite(v) & (np.abs(v) > fmax)
    huge |= (v != 0) & (np.abs(v) < float_tiny())
    if np.any(bad | huge):
        first = v[bad | huge].ravel()[0] if v.ndim else v
        note = ""
        if high is not None and high == whole_max() and first > high:
            dtype = np.dtype(jnp.result_type(float)).name
            note = (
                f" (the largest whole number {dtype} holds exactly; enable jax_enable_x64 for more)"
            )
        if np.isfinite(first) and abs(first) > fmax:
            dtype = np.dtype(jnp.result_type(float)).name
            note = f" (and at most {fmax:g}, the largest {dtype}; enable jax_enable_x64 for more)"
        elif 0 < abs(first) < float_tiny() and (first > low if low_open else first >= low):
            dtype = np.dtype(jnp.result_type(float)).name
            note = (
                f" (and 0 or at least {float_tiny():g} in size, the smallest normal {dtype}: "
                "smaller, it becomes 0; enable jax_enable_x64 for more)"
            )
        raise SpecError(
            f"{owner}.{name} = {_show(np.asarray(first))} is not allowed: "
            f"it must be finite and {allowed()}{note}"
        )


def _bound(x: float) -> str:
    """A limit for a message: whole numbers in full (16777216), others in ``%g``."""
    return str(int(x)) if x == round(x) and abs(x) < 1e16 else f"{x:g}"


def readable(obj) -> str:
    """``Class(field=number, ...)`` with the numbers of concrete fields (a ``__repr__``).

    Scalars print as numbers, small arrays as lists, traced fields as equinox prints them
    (``f32[]``); fields left None at their default None are omitted.
    """
    parts = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name, None)
        if value is None and f.default is None:
            continue
        parts.append(f"{f.name}={_number(value)}")
    return f"{type(obj).__name__}({', '.join(parts)})"


def _number(value) -> str:
    if isinstance(value, jax.core.Tracer):
        return eqx.tree_pformat(value)
    if isinstance(value, (jax.Array, np.ndarray, np.generic, float, int)) and not isinstance(
        value, bool
    ):
        v = np.asarray(value)
        if v.dtype.kind == "b":
            return repr(bool(v)) if v.ndim == 0 else np.array2string(v, threshold=8)
        if v.ndim == 0:
            return f"{float(v):.6g}"
        return np.array2string(v, precision=6, threshold=8, separator=", ")
    return repr(value)


def _get(self, name):
    """The field ``name``, or its "off" value from ``OFF`` when it is None (v2 fields). An "off"
    value that is a field's name means "the same as that field" (``attention_flops`` off runs
    attention at ``flops``)."""
    value = getattr(self, name)
    if value is not None:
        return value
    off = self.OFF[name]
    return _get(self, off) if isinstance(off, str) else off


class Hardware(eqx.Module):
    """One accelerator chip and the networks around it (per-chip figures, SI units).

    Attributes:
      flops: peak dense FLOP/s at the serving precision ``F`` (never the 2:4-sparse headline).
      hbm_bandwidth: HBM bytes/s ``BW``.
      hbm_capacity: HBM bytes ``M``.
      scaleup_bandwidth: scale-up (NVLink / ICI) bytes/s per chip, one direction ``U``.
      scaleout_bandwidth: scale-out (NIC) bytes/s per chip, one direction ``O``.
      scaleup_size: chips in one scale-up domain ``S`` (8 for an HGX box, 72 for GB200 NVL72).
      price_per_hour: $ per chip-hour ``p``.
      flops_efficiency: achievable fraction of ``flops`` ``eta_F`` (1 = pure roofline).
      bandwidth_efficiency: achievable fraction of ``hbm_bandwidth`` ``eta_BW``.

    Serving model v2 (``docs/serving_v2.md``). Each defaults to None, which switches its term
    off (the value in ``OFF``, returned by ``.get(name)``), giving v1; a None is no leaf, so a
    vmap over specs built with array fields is unchanged:

    Attributes:
      step_overhead: fixed time of every stage step (scheduler, sampling, launches) (s, 0).
      layer_overhead: kernel-launch and synchronisation time per layer per step; a stage step pays
        ``layer_overhead * L/P`` (s, 0).
      scaleup_latency: per-message latency ``alpha`` of a scale-up link (s, 0).
      scaleout_latency: per-message latency ``alpha`` of a scale-out link (s, 0).
      scaleup_efficiency: achieved fraction of ``scaleup_bandwidth`` (1).
      scaleout_efficiency: achieved fraction of ``scaleout_bandwidth`` (1).
      matmul_half_tokens: tokens through one weight matrix at which a matmul reaches half of
        ``flops_achieved``: ``eta(n) = eta_F * n/(n + n_half)`` (tokens, 0 = always ``eta_F``).
      kernel_serialization: how a step's operations share the chip, ``s`` in [0, 1]: 0 overlaps
        them all in one roofline of the whole step (v1); 1 runs them one after another, each at
        its own roofline (weight matmuls, attention over the context, collectives:
        ``dcost.serving.roofline.stage_time``); between: that mix (1, 0).
      attention_flops: peak FLOP/s of attention over the context (``QK^T`` and ``PV``), which runs
        at the KV cache's number format rather than the weights' (a 4-bit matmul rate does not
        apply to it); None: ``flops`` (v1). ``flops_efficiency`` applies to it too (FLOP/s).
      tree_collectives: latency rounds of collectives, ``tau`` in [0, 1]: 0 one message after
        another, an all-reduce's ring ``2(n-1)`` and an all-to-all's ``p`` peers (v2); 1 the
        log-depth algorithms' ``2 log2 n`` and ``log2(p + 1)``
        (``dcost.serving.collectives.all_reduce``, ``all_to_all_rounds``) (1, 0).
      kv_bandwidth_efficiency: achieved fraction of ``hbm_bandwidth`` of attention's reads of the
        KV cache (gathered from pages, split over heads and sequences) where it differs from the
        weights' ``eta_BW``; None: ``bandwidth_efficiency`` (v1).
      expert_bandwidth_efficiency: achieved fraction of ``hbm_bandwidth`` of the routed
        experts' weight reads (one grouped kernel streaming many experts' matrices) where it
        differs from the dense matmuls' ``eta_BW`` (each matrix streamed by its own kernel);
        None: ``bandwidth_efficiency``.
      sequence_overhead: time a serving engine spends per sequence it schedules in a step
        (batching, input metadata, sampling, output processing, on the host); a stage step of
        ``B`` sequences over ``A`` attention groups, each scheduling its own share, pays
        ``sequence_overhead * B/A`` per pass (s, 0).
      prefill_step_overhead: time a serving engine spends on a step that carries prompt tokens
        beyond what a decode step costs: such a step runs outside the decode steps' CUDA graph
        (its kernels launched one by one) and prepares its prompts on the host; paid once per
        pass that carries prompt tokens (prefill chunks, mixed steps) and by the share of a
        decode pool's steps that admit a sequence (``dcost.serving.roofline.admitted_share``)
        (s, 0).
      eager_moe_layer_overhead: the host's time to dispatch one MoE layer of a step that carries
        prompt tokens, run kernel by kernel outside the CUDA graphs (routing, sorting, the
        grouped GEMMs, the combine): such a pass takes at least ``L_moe/P`` times it, the
        longer of its kernels and that floor (``smax``), so that a light step waits on the
        host and a heavy one hides it (s, 0: no floor).
      kernel_roofline_smoothness: how one kernel's compute and memory traffic overlap, ``r`` in
        [0, 1]: its time is ``smax_r(t_F, t_W) = (t_F^(1/r) + t_W^(1/r))^r``, the roofline's
        maximum at 0 (v1: streaming fully hides the arithmetic or the other way round), their
        sum at 1, and between the two near the ridge point, where a real kernel is neither
        purely compute- nor memory-bound (``dcost.serving.roofline.kernel_time``) (0).
      expert_flops_efficiency: achieved fraction of the dense matmul rate by the routed
        experts' grouped matmuls, ``eta_e`` in (0, 1]: their FLOPs take ``1/eta_e`` times as long
        as a dense matmul's of the same size (tokens scattered to experts and gathered back,
        many small groups in one launch, each padded to the kernel's tile) (1).
      expert_half_tokens: the routed experts' own ``matmul_half_tokens``: tokens through one
        expert at which a grouped matmul reaches half of its rate; None: ``matmul_half_tokens``
        (tokens).
      expert_half_width: the routed experts' matmul width at which their grouped matmuls run at
        half of their rate, ``w_e``: an expert split over ``t`` tensor-parallel chips multiplies
        ``h x 2i/t`` and ``i/t x h`` matrices (``i`` its intermediate size), and its FLOPs take
        ``1 + w_e t / i`` times as long as the same FLOPs of an unbounded width (narrow output
        tiles and short reductions) (``dcost.serving.roofline.expert_rate_slowdown``) (0).
      expert_ep_slowdown: how much longer the routed experts' FLOPs take on the engine's
        expert-parallel path than on its tensor-parallel one, ``kappa``: ``e`` expert-parallel
        groups take ``1/e + kappa (1 - 1/e)`` times as long (tokens permuted to the local
        experts, their count padded per expert) (1).
      expert_overhead: time a chip spends per routed expert a step touches in one MoE layer,
        beyond its weight read and arithmetic (the expert's small GEMM launched, its tile
        filled, its tokens gathered and scattered): a stage step pays it for each of the
        ``E phi(B)/e`` experts its group touches, per MoE layer (s, 0).
      hierarchical_collectives: how an all-reduce over a group spanning several scale-up
        domains runs, ``h`` in [0, 1]: 0 every step over scale-out (v1), 1 inside each domain
        over scale-up and across domains over scale-out, as NCCL does across nodes
        (``dcost.serving.collectives.group_all_reduce``); between: that mix (1, 0).
      moe_layer_overhead: time of an MoE layer's kernels beside the expert matmuls (routing,
        sorting tokens by expert, the gather and the weighted combine), paid per MoE layer of a
        stage step whatever its tokens, with every expert on the chip's group (``e = 1``: the
        experts tensor parallel) (s, 0).
      moe_ep_overhead: the same when the experts are spread over many expert-parallel groups
        (``e`` large: a chip holds few of them and masks or maps the tokens routed elsewhere);
        ``e`` groups pay ``c_1/e + c_ep (1 - 1/e)`` (``dcost.serving.roofline.moe_layer_fixed``)
        (s; None: ``moe_layer_overhead``, one cost whatever the layout).
      index_layer_overhead: time of a sparse-attention indexer's kernels beyond their work
        (its projections, scoring and top-k launched), paid per layer of a stage step of a
        model with ``attention_topk > 0`` (s, 0).
      gemm_overhead: time one dense GEMM kernel costs beyond its roofline, paid per kernel a
        layer launches outside the grouped experts (``Model.gemms_per_layer``): a stage step
        pays ``gemm_overhead * gemms_per_layer * L/P``. An engine profile sets it to
        ``gemm_intercept_share`` times its GEMM table's intercept at the matmul precision
        (a block-scaled fp8 GEMM's is 2-5x a bf16 one's; ``dcost.engines``) (s, 0).

    Power (``dcost.serving.power``; None: no power model, and ``dcost.energy`` says which field
    it needs). Neither changes a step's time or its cost:

    Attributes:
      idle_power: power of a chip that is powered and clocked up in a serving process but whose
        units are idle (between kernels, launch-bound steps): the floor of
        ``P = P_idle + (P_max - P_idle) * activity`` (W; not the lower parked idle of a GPU with
        no process).
      max_power: board power limit (TDP) ``P_max``, the most the chip draws (W).

    >>> import dcost
    >>> h = dcost.Hardware(989e12, 3.35e12, 80e9, 450e9, 50e9, 8, 2.5)
    >>> round(float(h.flops / h.hbm_bandwidth))
    295
    """

    flops: FloatLeaf = eqx.field(converter=_float)
    hbm_bandwidth: FloatLeaf = eqx.field(converter=_float)
    hbm_capacity: FloatLeaf = eqx.field(converter=_float)
    scaleup_bandwidth: FloatLeaf = eqx.field(converter=_float)
    scaleout_bandwidth: FloatLeaf = eqx.field(converter=_float)
    scaleup_size: FloatLeaf = eqx.field(converter=_float)
    price_per_hour: FloatLeaf = eqx.field(converter=_float)
    flops_efficiency: FloatLeaf = eqx.field(default=1.0, converter=_float)
    bandwidth_efficiency: FloatLeaf = eqx.field(default=1.0, converter=_float)
    step_overhead: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    layer_overhead: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    scaleup_latency: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    scaleout_latency: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    scaleup_efficiency: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    scaleout_efficiency: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    matmul_half_tokens: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    kernel_serialization: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    attention_flops: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    tree_collectives: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    kv_bandwidth_efficiency: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    sequence_overhead: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    kernel_roofline_smoothness: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    expert_flops_efficiency: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    expert_half_tokens: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    expert_overhead: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    moe_layer_overhead: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    hierarchical_collectives: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    idle_power: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    max_power: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    prefill_step_overhead: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    moe_ep_overhead: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    expert_bandwidth_efficiency: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    expert_half_width: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    expert_ep_slowdown: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    index_layer_overhead: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    eager_moe_layer_overhead: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    gemm_overhead: OptionalFloatLeaf = eqx.field(default=None, converter=_float)

    OFF: ClassVar[dict] = {
        "step_overhead": 0.0,
        "layer_overhead": 0.0,
        "scaleup_latency": 0.0,
        "scaleout_latency": 0.0,
        "scaleup_efficiency": 1.0,
        "scaleout_efficiency": 1.0,
        "matmul_half_tokens": 0.0,
        "kernel_serialization": 0.0,
        "tree_collectives": 0.0,
        "attention_flops": "flops",
        "kv_bandwidth_efficiency": "bandwidth_efficiency",
        "expert_bandwidth_efficiency": "bandwidth_efficiency",
        "sequence_overhead": 0.0,
        "prefill_step_overhead": 0.0,
        "kernel_roofline_smoothness": 0.0,
        "expert_flops_efficiency": 1.0,
        "expert_half_tokens": "matmul_half_tokens",
        "expert_half_width": 0.0,
        "expert_ep_slowdown": 1.0,
        "expert_overhead": 0.0,
        "moe_layer_overhead": 0.0,
        "moe_ep_overhead": "moe_layer_overhead",
        "hierarchical_collectives": 0.0,
        "index_layer_overhead": 0.0,
        "eager_moe_layer_overhead": 0.0,
        "gemm_overhead": 0.0,
    }
    get = _get

    def __check_init__(self):
        for name in (
            "flops",
            "hbm_bandwidth",
            "hbm_capacity",
            "scaleup_bandwidth",
            "scaleout_bandwidth",
        ):
            check("Hardware", name, getattr(self, name), low_open=True)
        check("Hardware", "scaleup_size", self.scaleup_size, low=1.0, integer=True)
        check("Hardware", "price_per_hour", self.price_per_hour)
        for name in ("flops_efficiency", "bandwidth_efficiency"):
            check("Hardware", name, getattr(self, name), low_open=True, high=1.0)
        # v2 fields: None is "off" (no leaf); anything else is checked like the v1 fields
        for name in (
            "step_overhead",
            "layer_overhead",
            "scaleup_latency",
            "scaleout_latency",
            "matmul_half_tokens",
            "sequence_overhead",
            "prefill_step_overhead",
            "expert_half_tokens",
            "expert_half_width",
            "expert_overhead",
            "moe_layer_overhead",
            "moe_ep_overhead",
            "index_layer_overhead",
            "eager_moe_layer_overhead",
            "gemm_overhead",
        ):
            if getattr(self, name) is not None:
                check("Hardware", name, getattr(self, name))
        if self.expert_ep_slowdown is not None:
            check("Hardware", "expert_ep_slowdown", self.expert_ep_slowdown, low_open=True)
        for name in (
            "scaleup_efficiency",
            "scaleout_efficiency",
            "kv_bandwidth_efficiency",
            "expert_flops_efficiency",
            "expert_bandwidth_efficiency",
        ):
            if getattr(self, name) is not None:
                check("Hardware", name, getattr(self, name), low_open=True, high=1.0)
        for name in (
            "kernel_serialization",
            "tree_collectives",
            "kernel_roofline_smoothness",
            "hierarchical_collectives",
        ):
            if getattr(self, name) is not None:
                check("Hardware", name, getattr(self, name), high=1.0)
        if self.attention_flops is not None:
            check("Hardware", "attention_flops", self.attention_flops, low_open=True)
        if self.idle_power is not None:
            check("Hardware", "idle_power", self.idle_power)
        if self.max_power is not None:
            check("Hardware", "max_power", self.max_power, low_open=True)
        idle, top = _concrete(self.idle_power), _concrete(self.max_power)
        if idle is not None and top is not None and np.any(idle >= top):
            raise SpecError(
                f"Hardware.idle_power = {_show(np.asarray(idle))} is not allowed: it must be "
                f"below max_power = {_show(np.asarray(top))} (W)"
            )

    __repr__ = readable

    def filled(self) -> Hardware:
        """The same chip with every serving-model-v2 field that is None set to its "off" value
        (``OFF``; a field whose off value names another field takes that field's value): the
        same step times to the last bit, in one pytree structure whatever the chip's profile.

        A jitted program of a ``Hardware`` compiles once per pytree structure, and pure physics
        (every v2 field None), a family profile (``dcost.hardware(name, calibrated=True)``:
        some None) and an engine profile (none) are three structures of it. The planner's
        programs take every chip filled, so that a plan on one profile loads the programs a
        plan on another compiled (17-20 s on 2 cores); the searches take a profiled chip filled
        (``shared_form``). Not for derivatives by field as it is: a filled ``attention_flops``
        is a leaf of its own, where None runs attention at ``flops`` (``dcost.sensitivity``
        folds them back).

        >>> import dcost
        >>> h = dcost.hardware("h100-sxm")
        >>> f = h.filled()
        >>> h.step_overhead is None, float(f.step_overhead), bool(f.attention_flops == h.flops)
        (True, 0.0, True)
        >>> d, w = dcost.Design(batch=64, chips=8), dcost.Workload(2048)
        >>> m = dcost.model("llama-3-70b")
        >>> float(dcost.decode(d, f, m, w).tpot) == float(dcost.decode(d, h, m, w).tpot)
        True
        """
        shape = np.shape(self.flops)
        values = {}
        for name in self.OFF:
            if getattr(self, name) is not None:
                continue
            value = self.get(name)  # an alias's field, or a constant
            values[name] = value if isinstance(value, jax.Array) else np.full(shape, value, float)
        return dataclasses.replace(self, **values) if values else self

    @property
    def pure(self) -> bool:
        """Whether every serving-model-v2 field is off (None): pure physics, no profile."""
        return all(getattr(self, name) is None for name in self.OFF)

    @property
    def flops_achieved(self):
        """Achievable FLOP/s, ``F * eta_F``."""
        return self.flops * self.flops_efficiency

    @property
    def attention_flops_achieved(self):
        """Achievable FLOP/s of attention over the context, ``attention_flops * eta_F``
        (``flops_achieved`` when ``attention_flops`` is None)."""
        return self.get("attention_flops") * self.flops_efficiency

    @property
    def bandwidth_achieved(self):
        """Achievable HBM bytes/s, ``BW * eta_BW``."""
        return self.hbm_bandwidth * self.bandwidth_efficiency

    @property
    def kv_bandwidth_achieved(self):
        """Achievable HBM bytes/s of KV-cache reads, ``BW * kv_bandwidth_efficiency``
        (``bandwidth_achieved`` when it is None)."""
        return self.hbm_bandwidth * self.get("kv_bandwidth_efficiency")

    @property
    def expert_bandwidth_achieved(self):
        """Achievable HBM bytes/s of the routed experts' weight reads, ``BW *
        expert_bandwidth_efficiency`` (``bandwidth_achieved`` when it is None)."""
        return self.hbm_bandwidth * self.get("expert_bandwidth_efficiency")

    @property
    def scaleup_achieved(self):
        """Achieved scale-up bytes/s per chip, ``U * scaleup_efficiency``."""
        return self.scaleup_bandwidth * self.get("scaleup_efficiency")

    @property
    def scaleout_achieved(self):
        """Achieved scale-out bytes/s per chip, ``O * scaleout_efficiency``."""
        return self.scaleout_bandwidth * self.get("scaleout_efficiency")


def shared_form(hardware: Hardware) -> Hardware:
    """The chip as the searches' programs take it (``dcost.optimize``, ``dcost.sensitivity``):
    a profiled chip filled (``Hardware.filled``), so that a family profile, an engine profile and
    a profile fitted to a user's runs share one compiled program of each kind (a calibrated
    search after an engine's loads its programs instead of compiling them for 10-15 s); pure
    physics as it is, whose programs leave the v2 terms out (the optimizer and sensitivity
    programs of llama-3-70b on a pure H100 filled compiled in 15.5 s against 13.1-14.3 s
    unfilled, one run each on 2 cores).

    >>> import dcost, jax
    >>> cal, vllm = dcost.hardware("h100-sxm", calibrated=True), dcost.engine("vllm", "h100-sxm")
    >>> s = jax.tree.structure
    >>> s(shared_form(cal)) == s(shared_form(vllm.apply(cal))), s(cal) == s(vllm.apply(cal))
    (True, False)
    >>> pure = dcost.hardware("h100-sxm")
    >>> shared_form(pure) is pure
    True
    """
    return hardware if hardware.pure else hardware.filled()


class Model(eqx.Module):
    """A transformer, dense or Mixture-of-Experts, as the cost model sees it.

    ``N_total = N_dense + E*n_e`` and ``N_active = N_dense + k*n_e``. A dense model has
    ``n_experts = experts_active = params_per_expert = 0``.

    Attributes:
      n_layers: transformer blocks ``L``.
      d_model: residual width ``d``.
      params_dense: parameters every token uses ``N_dense`` (attention, embeddings, dense MLPs,
        shared experts).
      params_per_expert: parameters of one routed expert summed over all MoE layers ``n_e``.
      n_experts: routed experts per MoE layer ``E`` (0 for a dense model).
      experts_active: routed experts each token uses ``k``.
      kv_bytes_per_token: KV-cache bytes per token over all layers ``b_kv``.
      bytes_per_param: bytes per weight ``b_w`` (2 for bf16, 1 for fp8).
      attn_flops_per_context_token: attention FLOPs per (token x context token) ``a``; for plain
        attention ``4*L*n_heads*d_head``.
      act_bytes: bytes per activation element ``b_a`` (what all-to-all and pipeline hops move).
      n_moe_layers: MoE layers ``L_moe``; None: every layer for an MoE model, 0 for a dense one.

    Serving model v2 (``docs/serving_v2.md``). Each is a float leaf whose default 0 switches
    its term off, giving v1 (presets set them all, so presets and hand-built models stack into
    one batched ``Model``):

    Attributes:
      params_attention: attention parameters over all layers ``N_attn`` (part of
        ``params_dense``); data-parallel attention holds them whole on every chip (0).
      kv_heads: KV heads per layer ``h_kv``; tensor-parallel attention of degree ``t`` holds the
        KV cache ``t/min(t, h_kv)`` times (MLA: 1 latent head). 0: splits over any number of
        chips (v1).
      attention_heads: query heads per layer ``h`` (0: any). No term of the cost uses it: an
        engine splits attention over ``t`` chips only where ``t`` divides ``h`` (and ``t``
        divides ``h_kv`` or ``h_kv`` divides ``t``: each chip holds whole KV heads), so the
        planner offers no layout it could not launch (``attention_splits``).
      prefill_attn_flops_per_context_token: attention FLOPs per (token x context token) of a
        prefill ``a_pf`` (MLA runs its non-absorbed form there); 0: ``a``.
      max_domains_per_token: most scale-up domains a token's experts may span ``M``
        (node-limited routing, DeepSeek-V3 report section 2.1.2); 0: unlimited.
      draft_params: parameters one draft pass computes with per token (speculative decoding:
        a draft model's active parameters, or an MTP module's) ``N_draft`` (0).
      draft_params_total: the draft's parameters held in memory ``N_draft,total``; those beyond
        ``draft_params`` are routed experts with the model's ``E, k`` routing (an MTP module);
        0: ``draft_params``.
      draft_layers: transformer layers of one draft pass (each pays a target layer's fixed
        cost, ``layer_overhead + gemm_overhead * gemms_per_layer``, and attention of ``a/L``
        FLOPs per context token) (0).
      draft_kv_bytes_per_token: the draft's KV-cache bytes per token (0).
      params_embedding: input-embedding parameters ``N_emb`` (part of ``params_dense``): the
        lookup tables of an untied model (token embedding ``V*d``, learned positions
        ``n_positions*d``). A token reads its own rows and multiplies by none, so they take
        no FLOPs and no weight read in a step (``params_multiplied``), only memory. A tied
        model's table is also its output layer, a matmul: 0 there. 0: every dense parameter is
        multiplied (v1).
      state_bytes_per_sequence: bytes of recurrent state a sequence holds whatever its length
        ``sigma``: linear-attention layers (Gated DeltaNet: each head's ``d_k x d_v`` matrix and
        the short convolution's last inputs) keep a fixed state in place of a KV cache. A
        decode step reads and writes it (``2 B sigma``), a prefill once per chunk, and each
        running sequence holds it (``memory_per_chip``) (0).
      state_flops_per_token: FLOPs per token of the linear-attention recurrence beyond its
        projections' matmuls (state update and read-out), at the attention rate (0).
      attention_topk: context tokens each query attends to ``k`` (sparse attention: DeepSeek
        sparse attention's top-k, 2048 for DeepSeek-V3.2 and GLM-5): the attention's FLOPs and
        KV reads go with ``min(T, k)`` in place of ``T``; 0: every token (dense attention).
      index_bytes_per_token: bytes a token's entry in a sparse-attention indexer's cache takes
        over all layers (its keys, read whole by every decode step to choose the top-k; held
        and replicated like the KV cache) (0).
      index_flops_per_context_token: the indexer's FLOPs per (token x context token) (0).
      kv_bytes_per_element: bytes of one KV-cache element, the cache's number format (2 bf16,
        1 fp8): an engine whose attention kernels read an 8-bit cache at another rate than a
        16-bit one (``fp8_kv_bandwidth_ratio``) reads it at that rate where this is <= 1. 0: not
        stated (the 16-bit rate).
      gemms_per_layer: dense GEMM kernels a layer runs per pass outside the grouped experts,
        averaged over the layers (attention's projections, a dense MLP's two, an MoE layer's
        router and shared experts; ``dcost.presets.derive_model``): what pays
        ``Hardware.gemm_overhead`` (0).

    >>> import dcost
    >>> m = dcost.Model(2, 8, 100.0, 10.0, 8, 2, 64.0, 2.0)
    >>> float(m.params_total), float(m.params_active), float(m.sparsity)
    (180.0, 120.0, 1.5)
    """

    n_layers: FloatLeaf = eqx.field(converter=_float)
    d_model: FloatLeaf = eqx.field(converter=_float)
    params_dense: FloatLeaf = eqx.field(converter=_float)
    params_per_expert: FloatLeaf = eqx.field(converter=_float)
    n_experts: FloatLeaf = eqx.field(converter=_float)
    experts_active: FloatLeaf = eqx.field(converter=_float)
    kv_bytes_per_token: FloatLeaf = eqx.field(converter=_float)
    bytes_per_param: FloatLeaf = eqx.field(converter=_float)
    attn_flops_per_context_token: FloatLeaf = eqx.field(default=0.0, converter=_float)
    act_bytes: FloatLeaf = eqx.field(default=2.0, converter=_float)
    n_moe_layers: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    params_attention: FloatLeaf = eqx.field(default=0.0, converter=_float)
    kv_heads: FloatLeaf = eqx.field(default=0.0, converter=_float)
    attention_heads: FloatLeaf = eqx.field(default=0.0, converter=_float)
    prefill_attn_flops_per_context_token: FloatLeaf = eqx.field(default=0.0, converter=_float)
    max_domains_per_token: FloatLeaf = eqx.field(default=0.0, converter=_float)
    draft_params: FloatLeaf = eqx.field(default=0.0, converter=_float)
    draft_params_total: FloatLeaf = eqx.field(default=0.0, converter=_float)
    draft_layers: FloatLeaf = eqx.field(default=0.0, converter=_float)
    draft_kv_bytes_per_token: FloatLeaf = eqx.field(default=0.0, converter=_float)
    params_embedding: FloatLeaf = eqx.field(default=0.0, converter=_float)
    state_bytes_per_sequence: FloatLeaf = eqx.field(default=0.0, converter=_float)
    state_flops_per_token: FloatLeaf = eqx.field(default=0.0, converter=_float)
    attention_topk: FloatLeaf = eqx.field(default=0.0, converter=_float)
    index_bytes_per_token: FloatLeaf = eqx.field(default=0.0, converter=_float)
    index_flops_per_context_token: FloatLeaf = eqx.field(default=0.0, converter=_float)
    kv_bytes_per_element: FloatLeaf = eqx.field(default=0.0, converter=_float)
    gemms_per_layer: FloatLeaf = eqx.field(default=0.0, converter=_float)

    get = _get  # every v2 field of a Model is a float leaf: ``get`` is plain attribute access

    __repr__ = readable

    def __check_init__(self):
        check("Model", "n_layers", self.n_layers, low_open=True, integer=True)
        check("Model", "d_model", self.d_model, low_open=True)
        check("Model", "params_dense", self.params_dense, low_open=True)
        for name in ("n_experts", "experts_active"):
            check("Model", name, getattr(self, name), integer=True)
        for name in ("params_per_expert", "kv_bytes_per_token", "attn_flops_per_context_token"):
            check("Model", name, getattr(self, name))
        check("Model", "bytes_per_param", self.bytes_per_param, low_open=True)
        check("Model", "act_bytes", self.act_bytes, low_open=True)
        if self.n_moe_layers is not None:
            check("Model", "n_moe_layers", self.n_moe_layers, integer=True)
            _at_most("Model", "n_moe_layers", self.n_moe_layers, "n_layers", self.n_layers)
        e, k, ne = (
            _concrete(v) for v in (self.n_experts, self.experts_active, self.params_per_expert)
        )
        if e is not None and k is not None and np.any(k > e):
            raise SpecError(
                f"Model.experts_active = {_show(k)} is not allowed: it must be <= n_experts "
                f"({_show(e)})"
            )
        if e is not None and k is not None and ne is not None:
            moe = e > 0
            if np.any(moe & (k <= 0)):
                raise SpecError(
                    "Model.experts_active = 0 is not allowed for an MoE model "
                    "(n_experts > 0): it must be >= 1"
                )
            if np.any(moe & (ne <= 0)):
                raise SpecError(
                    "Model.params_per_expert = 0 is not allowed for an MoE model "
                    "(n_experts > 0): it must be > 0"
                )
            if np.any(~moe & ((k > 0) | (ne > 0))):
                raise SpecError(
                    "a dense model (Model.n_experts = 0) must have experts_active = 0 "
                    "and params_per_expert = 0"
                )
        self._check_v2()

    def _check_v2(self):
        # v2 fields: float leaves, 0 = off; counts are whole numbers (like n_experts)
        for name in (
            "kv_heads",
            "attention_heads",
            "max_domains_per_token",
            "draft_layers",
            "attention_topk",
        ):
            check("Model", name, getattr(self, name), integer=True)
        for name in (
            "params_attention",
            "prefill_attn_flops_per_context_token",
            "draft_params",
            "draft_params_total",
            "draft_kv_bytes_per_token",
            "params_embedding",
            "state_bytes_per_sequence",
            "state_flops_per_token",
            "index_bytes_per_token",
            "index_flops_per_context_token",
            "kv_bytes_per_element",
            "gemms_per_layer",
        ):
            check("Model", name, getattr(self, name))
        _at_most(
            "Model", "params_attention", self.params_attention, "params_dense", self.params_dense
        )
        n_emb = _concrete(self.params_embedding)
        dense, attn = _concrete(self.params_dense), _concrete(self.params_attention)
        if n_emb is not None and dense is not None and attn is not None:
            n_emb, dense, attn = np.broadcast_arrays(n_emb, dense, attn)
            bad = n_emb + attn >= dense
            if np.any(bad):
                raise SpecError(
                    f"Model.params_embedding = {_show(n_emb[bad].ravel()[0])} is not allowed: "
                    f"it must be < params_dense - params_attention "
                    f"({_show((dense - attn)[bad].ravel()[0])}), the dense parameters that "
                    "are not attention's"
                )
        total, active = _concrete(self.draft_params_total), _concrete(self.draft_params)
        if total is not None and active is not None:
            total, active = np.broadcast_arrays(total, active)
            bad = (total > 0) & (total < active)
            if np.any(bad):
                raise SpecError(
                    f"Model.draft_params_total = {_show(total[bad].ravel()[0])} is not allowed: "
                    f"it must be 0 (= draft_params) or >= draft_params "
                    f"({_show(active[bad].ravel()[0])})"
                )

    @property
    def moe_layers(self):
        """``L_moe``: ``n_moe_layers`` if given, else ``L`` for an MoE model, 0 for a dense one."""
        if self.n_moe_layers is not None:
            return self.n_moe_layers
        return jnp.where(self.n_experts > 0, self.n_layers, 0.0)

    @property
    def params_total(self):
        """``N_total = N_dense + E*n_e`` (parameters)."""
        return self.params_dense + self.n_experts * self.params_per_expert

    @property
    def params_active(self):
        """``N_active = N_dense + k*n_e`` (parameters a token uses)."""
        return self.params_dense + self.experts_active * self.params_per_expert

    @property
    def params_multiplied(self):
        """``N_dense - N_emb``: the dense parameters a token multiplies by, whose FLOPs and
        weight read a step pays (the input-embedding lookup tables pay neither)."""
        return self.params_dense - self.params_embedding

    @property
    def params_active_multiplied(self):
        """``N_active - N_emb``: the parameters a token multiplies by, ``2*(N_active - N_emb)``
        FLOPs per token (Kaplan et al. 2020 likewise leave the embedding out of the FLOPs)."""
        return self.params_active - self.params_embedding

    @property
    def sparsity(self):
        """``N_total / N_active`` (1 for a dense model)."""
        return self.params_total / self.params_active

    @property
    def prefill_attn_flops(self):
        """``a_pf``: ``prefill_attn_flops_per_context_token`` when > 0, else ``a`` (FLOP)."""
        a_pf = self.prefill_attn_flops_per_context_token
        return jnp.where(a_pf > 0, a_pf, self.attn_flops_per_context_token)

    @property
    def latent_attention(self):
        """Whether the model attends through one latent a token (multi-head latent attention,
        DeepSeek-V2 Technical Report, arXiv 2405.04434, section 2.1): one KV "head"
        (``kv_heads = 1``) and a prompt's attention in its own, non-absorbed form
        (``prefill_attn_flops_per_context_token > 0``), as ``dcost.presets``' ``derive_model``
        sets an MLA card. A boolean array, element by element of a batch of models; engines
        time its kernels apart (``dcost.engines.Engine.fields``).

        >>> import dcost
        >>> bool(dcost.model("deepseek-v3").latent_attention), bool(
        ...     dcost.model("llama-3-70b").latent_attention)
        (True, False)
        """
        return (jnp.asarray(self.kv_heads) == 1.0) & (
            jnp.asarray(self.prefill_attn_flops_per_context_token) > 0.0
        )

    @property
    def draft_total(self):
        """``N_draft,total``: ``draft_params_total`` when > 0, else ``draft_params`` (params)."""
        return jnp.where(self.draft_params_total > 0, self.draft_params_total, self.draft_params)


def _at_most(owner, name, x, other, y):
    """Raise SpecError unless ``x <= y`` element by element (a batch of specs is checked pairwise,
    never against the smallest ``y`` of the batch)."""
    a, b = _concrete(x), _concrete(y)
    if a is None or b is None:
        return
    try:
        a, b = np.broadcast_arrays(a, b)
    except ValueError:
        raise SpecError(
            f"{owner}.{name} has shape {a.shape} and {owner}.{other} shape {b.shape}: "
            "a batch of specs needs one shape"
        ) from None
    over = a > b
    if np.any(over):
        raise SpecError(
            f"{owner}.{name} = {_show(a[over].ravel()[0])} is not allowed: it must be <= "
            f"{other} ({_show(b[over].ravel()[0])})"
        )


class Workload(eqx.Module):
    """What the model is asked to do, in tokens.

    Attributes:
      context: mean context length during decode ``T`` (prompt plus half the output, typically).
      prompt: prompt length ``T_in`` (default: ``context``).
      output: output length ``T_out`` (default: 0 tokens).
      acceptance: probability ``a`` that a draft token is accepted (speculative decoding; 0).
      expert_imbalance: tokens on the busiest chip's experts over the mean, applied to the
        routed-expert compute and all-to-all bytes: None or 1.0 balanced (v1), a number >= 1
        that factor, ``"multinomial"`` the expected maximum under multinomial routing
        (``dcost.serving.moe.expected_max_load``), stored as 0 (``MULTINOMIAL``) so that it
        stays a float leaf.

    The v2 fields default to None, which means "off" (``Workload.OFF`` holds the value used;
    ``w.get(name)`` returns it): a None is no leaf, so a vmap over specs built with array fields
    is unchanged.

    >>> import dcost
    >>> float(dcost.Workload(4096).prompt)
    4096.0
    """

    context: FloatLeaf = eqx.field(converter=_float)
    prompt: FloatLeaf = eqx.field(default=None, converter=_float)
    output: FloatLeaf = eqx.field(default=None, converter=_float)
    acceptance: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    expert_imbalance: OptionalFloatLeaf = eqx.field(default=None, converter=_float)

    OFF: ClassVar[dict] = {"acceptance": 0.0, "expert_imbalance": 1.0}

    def __init__(self, context, prompt=None, output=None, acceptance=None, expert_imbalance=None):
        self.context = context
        self.prompt = context if prompt is None else prompt
        self.output = 0.0 if output is None else output
        self.acceptance = acceptance
        if isinstance(expert_imbalance, str):
            if expert_imbalance != "multinomial":
                raise SpecError(
                    f"Workload.expert_imbalance = {expert_imbalance!r} is not allowed: it must "
                    "be a number >= 1, 0 or 'multinomial' (expected maximum), or None (balanced)"
                )
            expert_imbalance = MULTINOMIAL
        self.expert_imbalance = expert_imbalance

    get = _get

    __repr__ = readable

    def __check_init__(self):
        for name in ("context", "prompt", "output"):
            check("Workload", name, getattr(self, name))
        if self.acceptance is not None:
            check("Workload", "acceptance", self.acceptance, high=1.0)
        if self.expert_imbalance is not None:
            check("Workload", "expert_imbalance", self.expert_imbalance)
        v = _concrete(self.expert_imbalance)
        if v is not None:
            bad = (v > 0) & (v < 1)
            if np.any(bad):
                raise SpecError(
                    f"Workload.expert_imbalance = {_show(v[bad].ravel()[0] if v.ndim else v)} "
                    "is not allowed: it must be >= 1, or 0 ('multinomial')"
                )


class Design(eqx.Module):
    """What the optimizer chooses: a serving (or training) layout.

    Attributes:
      batch: sequences per micro-batch ``B`` (>= 1).
      chips: chips per pipeline stage ``G`` (>= 1).
      stages: pipeline stages ``P`` (>= 1); chips per replica ``P*G`` (``chips_per_replica``).
      experts: routed experts ``E``; None keeps the model's own.
      overtrain: over-training ratio ``r = D / (20 N_active)``; None where it does not apply.
      attention_dp: data-parallel attention groups per stage ``A`` in ``[1, G]``; attention is
        tensor parallel of degree ``G/A`` inside each group. None: v1's convention (MoE: data
        parallel, ``A = G``, without the cost of holding attention weights whole; dense: tensor
        parallel, ``A = 1``).
      dispatch_dedup: 1 sends a token once per destination scale-up domain (and to at most
        ``max_domains_per_token``), 0 each of its ``k`` copies (v1); between: that mix (0).
      redundant_experts: extra expert replicas per MoE layer ``R`` (EPLB; 0).
      expert_parallel: expert-parallel groups per stage ``e`` in ``[1, G]``: the routed experts
        are spread over ``e`` groups, and inside each group every expert's matrices are split
        over its ``G/e`` chips (expert tensor parallelism). None: ``e = G`` (v1: each expert
        whole on one chip); 1: every chip holds a slice of every expert (TensorRT-LLM's and
        SGLang's MoE tensor parallelism, ``ep 1``).
      draft_tokens: speculative length ``k_d``: draft tokens verified per step (0).
      prefill_chunk: chunked prefill: prompt tokens of one sequence per pass ``C``; 0: the whole
        prompt in one pass (v1).
      comm_overlap: fraction ``o`` of the collectives the engine hides behind the kernels
        (two micro-batches in flight, one communicating while the other computes: DeepSeek-V3's
        dual micro-batch overlap, SGLang's two-batch overlap; or a collective fused into a
        GEMM). Applies where a step's kernels run in series (``Hardware.
        kernel_serialization``; ``dcost.serving.roofline.stage_time``); in [0, 1] (0).

    Fields are floats so that a relaxed design can be differentiated (fractional values are
    allowed: the smooth relaxation evaluates them); the exact model is meant for whole numbers,
    which ``dcost.optimize`` and ``dcost.grid_search`` return. ``batch``, ``chips``, ``stages``
    and ``experts`` are at most ``whole_max()`` (16,777,216 in float32, where consecutive whole
    numbers stay distinct).

    >>> import dcost
    >>> d = dcost.Design(batch=64, chips=8)
    >>> float(d.batch * d.chips * d.stages)
    512.0
    """

    batch: FloatLeaf = eqx.field(converter=_float)
    chips: FloatLeaf = eqx.field(default=1.0, converter=_float)
    stages: FloatLeaf = eqx.field(default=1.0, converter=_float)
    experts: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    overtrain: OptionalFloatLeaf = eqx.field(default=None, converter=_float)

    attention_dp: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    dispatch_dedup: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    redundant_experts: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    expert_parallel: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    draft_tokens: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    prefill_chunk: OptionalFloatLeaf = eqx.field(default=None, converter=_float)
    comm_overlap: OptionalFloatLeaf = eqx.field(default=None, converter=_float)

    OFF: ClassVar[dict] = {
        "dispatch_dedup": 0.0,
        "redundant_experts": 0.0,
        "expert_parallel": "chips",
        "draft_tokens": 0.0,
        "prefill_chunk": 0.0,
        "comm_overlap": 0.0,
    }
    get = _get

    __repr__ = readable

    def __check_init__(self):
        top = whole_max()
        check("Design", "batch", self.batch, low=1.0, high=top)
        check("Design", "chips", self.chips, low=1.0, high=top)
        check("Design", "stages", self.stages, low=1.0, high=top)
        if self.attention_dp is not None:
            check("Design", "attention_dp", self.attention_dp, low=1.0, high=top)
            _at_most("Design", "attention_dp", self.attention_dp, "chips", self.chips)
        if self.expert_parallel is not None:
            check("Design", "expert_parallel", self.expert_parallel, low=1.0, high=top)
            _at_most("Design", "expert_parallel", self.expert_parallel, "chips", self.chips)
        if self.dispatch_dedup is not None:
            check("Design", "dispatch_dedup", self.dispatch_dedup, high=1.0)
        for name in ("redundant_experts", "draft_tokens", "prefill_chunk"):
            if getattr(self, name) is not None:
                check("Design", name, getattr(self, name), high=top)
        if self.experts is not None:
            check("Design", "experts", self.experts, low=1.0, high=top)
        if self.overtrain is not None:
            check("Design", "overtrain", self.overtrain, low_open=True)
        if self.comm_overlap is not None:
            check("Design", "comm_overlap", self.comm_overlap, high=1.0)

    @property
    def chips_per_replica(self):
        """Chips of one serving replica, ``P*G`` (``stages * chips``)."""
        return self.stages * self.chips


def with_experts(model: Model, design: Design) -> Model:
    """The model with ``design.experts`` routed experts (unchanged when the design leaves it None).

    Raises SpecError when a concrete expert count is below ``experts_active``, or when the model
    is dense (``experts_active = 0``): it has no routed experts to count.
    """
    if design.experts is None:
        return model
    e, k = _concrete(design.experts), _concrete(model.experts_active)
    if e is not None and k is not None and np.any(k <= 0):
        raise SpecError(
            f"Design.experts = {_show(e)} is not allowed for a dense model "
            "(Model.experts_active = 0): leave it None"
        )
    if e is not None and k is not None and np.any(e < k):
        raise SpecError(
            f"Design.experts = {_show(e)} is not allowed: it must be >= the model's "
            f"experts_active ({_show(k)})"
        )
    return eqx.tree_at(lambda m: m.n_experts, model, design.experts)


def check_groups(owner: str, design: Design) -> None:
    """Raise SpecError unless a concrete whole ``attention_dp`` and ``expert_parallel`` divide
    the stage's chips when ``chips`` is a whole number too (the groups split the stage's ``G``
    chips evenly; relaxed, fractional values are the smooth model's, left to it).

    The one check of the layout's groups, shared by ``decode``, ``prefill``, ``mixed_step``,
    ``Problem`` (its fixed design) and the CLI.

    >>> check_groups("decode", Design(64, chips=8, attention_dp=4))
    >>> try:
    ...     check_groups("decode", Design(64, chips=8, attention_dp=3))
    ... except SpecError as err:
    ...     print(str(err)[:59])
    decode: Design.attention_dp = 3.0 is not allowed with chips
    """
    g = _concrete(design.chips)
    if g is None or not np.all(g == np.round(g)):
        return
    for name in ("attention_dp", "expert_parallel"):
        v = _concrete(getattr(design, name))
        if v is None:
            continue
        a, b = np.broadcast_arrays(v, g)
        bad = (a == np.round(a)) & (np.fmod(b, np.maximum(a, 1.0)) != 0)
        if np.any(bad):
            i = np.flatnonzero(bad.ravel())[0]
            raise SpecError(
                f"{owner}: Design.{name} = {_show(a.ravel()[i])} is not allowed with chips = "
                f"{_show(b.ravel()[i])}: its groups split a stage's chips evenly, so it must be "
                "a whole number dividing Design.chips"
            )


def attention_splits(model: Model, degree) -> bool:
    """Whether a serving engine can split one model's attention over ``degree`` chips (tensor
    parallel attention of degree ``t``): ``t`` divides the query heads ``h``, and either divides
    the KV heads ``h_kv`` (each chip holds ``h_kv/t`` of them) or is a multiple of them (each KV
    head is held ``t/h_kv`` times). vLLM, SGLang and TensorRT-LLM refuse any other degree at
    launch (vLLM: "Total number of attention heads must be divisible by tensor parallel size").
    A head count of 0 (``Model.attention_heads``, ``kv_heads``) is not checked: any degree.

    >>> import dcost
    >>> m = dcost.model("llama-3-70b")  # 64 query heads, 8 KV heads
    >>> [t for t in (1, 2, 3, 8, 16, 24, 64, 72, 128) if attention_splits(m, t)]
    [1, 2, 8, 16, 64]
    """
    h, kv = np.asarray(model.attention_heads), np.asarray(model.kv_heads)
    return bool(np.all(splits_heads(h, kv, np.asarray(float(degree)), np)))


def splits_heads(heads, kv_heads, degree, xp):
    """``attention_splits``' rule elementwise, in the array module ``xp`` (``numpy`` for concrete
    values, ``jax.numpy`` inside a traced search: ``dcost.search.problem.splits``)."""
    whole = (degree >= 1) & (degree == xp.round(degree))
    t = xp.where(whole, degree, 1.0)
    by_query = (heads <= 0) | (xp.mod(heads, t) == 0)
    kv = xp.where(kv_heads > 0, kv_heads, 1.0)
    by_kv = (kv_heads <= 0) | (xp.mod(kv, t) == 0) | (xp.mod(t, kv) == 0)
    return whole & by_query & by_kv


def check_speculation(owner: str, design: Design, model: Model, workload: Workload | None):
    """Raise SpecError when a concrete ``design.draft_tokens > 0`` meets a model without a draft
    (``Model.draft_params = 0``), or a ``workload`` without ``acceptance`` (None: not checked).

    Without a draft the draft's passes would cost nothing and each step would still emit
    ``tau(a, k)`` tokens: speculation for free, a wrong answer. A draft that truly costs next
    to nothing (n-gram prompt lookup) is not modelled by leaving the draft out; give it as a
    model with a tiny draft. Without an acceptance rate no draft token would be accepted, which
    is never what a user asking for speculation means. The one check of speculation, shared by
    ``decode``, ``mixed_step``, ``Problem`` and the CLI.

    >>> import dcost
    >>> try:
    ...     check_speculation("decode", Design(8, draft_tokens=2), dcost.model("llama-3-70b"), None)
    ... except SpecError as err:
    ...     print(str(err)[:72])
    decode: Design.draft_tokens = 2.0 is not allowed: the model has no draft
    """
    k = _concrete(design.draft_tokens)
    if k is None or not np.any(k > 0):
        return
    d = _concrete(model.draft_params)
    if d is not None and np.any(d <= 0):
        raise SpecError(
            f"{owner}: Design.draft_tokens = {_show(k)} is not allowed: the model has no draft "
            "(Model.draft_params = 0), so its draft passes would cost nothing; use a model with "
            "a draft or multi-token-prediction module (e.g. dcost.model('deepseek-v3')), give "
            "your draft's size (Model(..., draft_params=..., draft_layers=...)), or "
            "draft_tokens = 0"
        )
    if workload is not None and workload.acceptance is None:
        raise SpecError(
            f"{owner}: Design.draft_tokens = {_show(k)} is not allowed without "
            "Workload.acceptance: speculation needs the draft's acceptance rate in [0, 1], "
            "e.g. Workload(..., acceptance=0.8)"
        )


INF = math.inf
MULTINOMIAL = 0.0
"""``Workload.expert_imbalance`` value meaning "expected maximum under multinomial routing"."""


def stack(trees):
    """A batch from equally shaped pytrees: every leaf stacked along a new leading axis.

    How a problem of many scenarios is built (``dcost.Problem(dcost.stack([h1, h2]), ...)``);
    the fields of the result carry the batch axis.

    Args:
      trees: a non-empty sequence of pytrees of one structure (e.g. several ``dcost.Hardware``).

    >>> import dcost
    >>> hw = dcost.stack([dcost.hardware("h100-sxm"), dcost.hardware("b200")])
    >>> hw.flops.shape
    (2,)
    """
    trees = list(trees)
    if not trees:
        raise SpecError("stack: trees = [] is not allowed: give at least one pytree")
    # annotated: jax's own annotation of jax.tree.structure does not resolve for type checkers
    first: PyTreeDef = jax.tree.structure(trees[0])
    for i, tree in enumerate(trees[1:], start=1):
        if first != jax.tree.structure(tree):
            raise SpecError(
                f"stack: trees[{i}] has another structure than trees[0] "
                f"({type(tree).__name__} with fields set differently); all must match"
            )
    return jax.tree.map(_stack_leaf, *trees)


def _stack_leaf(*xs):
    """One leaf of ``stack``: concrete, strongly typed arrays stacked on the host in one NumPy
    call and moved once (``jnp.stack`` of thousands of scalars converts each one: a batch of
    6,000 chips took seconds); tracers and weakly typed values (Python numbers) through
    ``jnp.stack``, whose types they keep."""
    if all(
        isinstance(x, (np.ndarray, jax.Array))
        and not isinstance(x, jax.core.Tracer)
        and not getattr(x, "weak_type", False)
        for x in xs
    ):
        return jnp.asarray(np.stack([np.asarray(x) for x in xs]))
    return jnp.stack([jnp.asarray(x) for x in xs])
