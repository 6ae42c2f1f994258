"""Power and energy of a serving step: watts per chip, joules per token, tokens per megawatt.

A chip draws between its idle power and its board limit, by how busy its units are:

    u_F = P * t_F / t_trip       # compute: the step's FLOPs at peak FLOP/s, over the time they take
    u_M = P * t_M / t_trip       # memory: weight and KV bytes at peak HBM bytes/s (weights + KV)
    u_E = P * (t_W 2/b_w + t_KV 2/b_kv) / t_trip   # the same traffic counted in 16-bit elements
    u_C = P * t_C / t_trip       # links: the step's collectives at the links' peak bytes/s
    activity = 1 - exp(-(c_F u_F + c_M u_E + c_C u_C))           # in [0, 1), smooth, saturating
    P_chip   = P_idle + (P_max - P_idle) * activity              # W
    energy_per_token = P*G * P_chip / tokens_per_s               # J per token of one replica
    tokens_per_mw    = 1e6 * tokens_per_s / (P*G * P_chip)       # tokens/s per MW of chips

``t_F, t_M, t_C`` are the pure-physics terms of the step (``dcost.decode`` on the chip at its peak
rates, every v2 term off) and ``t_trip`` the time the step really takes on ``hardware`` (a
calibrated chip: the measured-like time), so ``u`` is the fraction of the chip's peak rate the step
sustains, whatever the software; ``P`` micro-batches share the ``P`` stages of a trip. HBM
activity counts the elements the step streams, not its bytes: a byte of fp8 weights is two 16-bit
elements' worth, of fp4 four (``b_w`` the model's bytes per weight, ``b_kv`` per KV element, 2
when not stated). A memory-bound step's power goes with the elements its kernels unpack, scale
and multiply: on the ML.ENERGY runs the same model (Qwen3-235B-A22B on the same GPUs under the
same vLLM) drew 0.83x the bytes model's power in fp8 and 0.99x in bf16, gpt-oss-120b's fp4 runs
0.80x; counted in elements, 0.90x, 0.94x and 0.98x, and the held-out power error went from
10.7 % to 8.8 % with no coefficient added (``docs/how-to/energy.md``). The form was chosen after
seeing those residuals; the kernel rows neither confirm nor refute it. The shape is
the one GenZ and LLMServingSim use (a static floor and a dynamic part that grows with activity);
the coefficients ``c_F, c_M`` are fitted on the measured mean power of whole vLLM runs (the
ML.ENERGY Benchmark v3, H100 and B200; ``dcost.calibrate.power.fit_runs``; ``POWER_FIT``) and the
idle floor on AIConfigurator's measured kernel power (``IDLE_FRACTION``); ``c_C`` is assumed
equal to ``c_M`` (no public measurement of link power was found). Energy counts the chips
only: host CPUs, NICs, switches and cooling come on top (``dcost.pricing.ownership`` multiplies
by a PUE).

A power cap below what a step draws lowers the clock: dynamic power goes as ``C V^2 f`` and, in
the range where voltage follows frequency, as ``f^3`` (Rabaey, Chandrakasan & Nikolic, *Digital
Integrated Circuits*, 2nd ed., section 5.5; the ``f ~ P^(1/3)`` rule of DVFS), so a step drawing
``P`` at full clock runs under a cap ``P_cap < P`` at ``f/f_max = ((P_cap - P_idle)/(P -
P_idle))^(1/3)`` of its FLOP/s, and a cap above ``P`` does not bind; HBM runs on its own clock and
keeps its bandwidth (``power_cap``).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost._types import FloatLeaf
from dcost.engines import on_engine
from dcost.serving.mixed import mixed_step
from dcost.serving.roofline import decode, prefill
from dcost.smooth import safe_div
from dcost.specs import Design, Hardware, Model, SpecError, Workload, _float, check, readable

__all__ = [
    "PowerFit",
    "POWER_FIT",
    "Energy",
    "activity",
    "element_time",
    "chip_power",
    "power_cap",
    "clock_fraction",
    "peak_hardware",
    "energy",
    "require_power",
]

WATTS_PER_MEGAWATT = 1e6
STEPS = ("decode", "prefill", "mixed")
CAP_ITERATIONS = 4
"""Fixed-point steps ``power_cap`` takes after the first clock (each one ``energy`` call)."""
"""The steps ``energy`` prices: a decode step, a prefill pass, a mixed (chunked-prefill) step."""


class PowerFit(eqx.Module):
    """How a chip's activity grows with what its units do (dimensionless).

    Attributes:
      compute: ``c_F``, weight of compute utilisation (FLOP/s over peak).
      memory: ``c_M``, weight of HBM utilisation (``u_E``: 16-bit elements/s over what the
        peak bandwidth streams of them).
      comm: ``c_C``, weight of link utilisation (bytes/s over the links' peak).

    >>> f = PowerFit(4.0, 0.5, 0.5)
    >>> float(f.compute)
    4.0
    """

    compute: FloatLeaf = eqx.field(converter=_float)
    memory: FloatLeaf = eqx.field(converter=_float)
    comm: FloatLeaf = eqx.field(converter=_float)

    def __check_init__(self):
        for name in ("compute", "memory", "comm"):
            check("PowerFit", name, getattr(self, name))

    __repr__ = readable


# Fitted by ``dcost.calibrate.power.fit_runs`` on the mean power of the 346 whole vLLM runs of
# the ML.ENERGY Benchmark v3 that dcost expresses (H100 and B200, 11 models, one to eight GPUs;
# ``dcost.validation.energy.mlenergy_records``; tests/test_power.py refits and compares); ``comm``
# is assumed equal to ``memory``. HBM counted in bytes instead of elements, the same runs gave
# c_F 6.16 and c_M 1.43 (10.7 % held out, against 8.8 %). The kernel rows alone
# (``dcost.calibrate.power.fit``) gave c_F 9.26 and c_M 0.108: a kernel looped alone on a warm
# board says little of HBM's share.
POWER_FIT = PowerFit(compute=6.2163, memory=1.0394, comm=1.0394)
# The idle floor those rows measure, as a fraction of the 1,000 W power limit they ran under:
# ``P_idle / P_max`` (the presets' idle_power is this fraction of max_power where no public idle
# figure exists).
IDLE_FRACTION = 0.40943


class Energy(eqx.Module):
    """What a step draws (SI units). A pytree: batched designs give array fields.

    Attributes:
      power_per_chip: mean power of one chip over the step (W).
      power_per_replica: ``P*G * power_per_chip`` (W).
      energy_per_token: joules per token the step produces (output tokens for decode, input
        tokens for prefill) (J).
      tokens_per_mw: tokens per second per megawatt of chip power.
      compute_utilisation, memory_utilisation, comm_utilisation: ``u_F, u_M, u_C`` (fractions of
        the chip's peak rates).
      memory_element_utilisation: ``u_E``, the step's HBM traffic counted in 16-bit elements
        over what the peak bandwidth streams of them (``u_M`` for a bf16 model and cache; twice
        its weights' share in fp8, four times in fp4): what the activity charges.
      activity: ``1 - exp(-(c_F u_F + c_M u_E + c_C u_C))``.
    """

    power_per_chip: jax.Array
    power_per_replica: jax.Array
    energy_per_token: jax.Array
    tokens_per_mw: jax.Array
    compute_utilisation: jax.Array
    memory_utilisation: jax.Array
    comm_utilisation: jax.Array
    memory_element_utilisation: jax.Array
    activity: jax.Array

    __repr__ = readable


def require_power(hardware: Hardware, who: str = "dcost.energy") -> None:
    """Raise ``SpecError`` naming the field when ``hardware`` has no ``idle_power`` or
    ``max_power`` (the presets carry both; a hand-built chip must give them)."""
    for name in ("idle_power", "max_power"):
        if getattr(hardware, name) is None:
            raise SpecError(
                f"{who}: Hardware.{name} is None; give the chip's {name} in W "
                f"(e.g. dcost.Hardware(..., idle_power=280.0, max_power=700.0)) or use a preset, "
                f"which carries both"
            )


def _watts(hardware: Hardware, who: str) -> tuple[jax.Array, jax.Array]:
    """``(P_idle, P_max)`` of a chip that has them (else ``require_power``'s error)."""
    require_power(hardware, who)
    idle, top = hardware.idle_power, hardware.max_power
    assert idle is not None and top is not None
    return idle, top


def element_time(step, model: Model):
    """``t_W 2/b_w + t_KV 2/b_kv``: a step's weight and KV-cache read times at peak HBM bandwidth
    (``step.t_weights``, ``step.t_kv`` of a pure-physics step), each counted in 16-bit elements
    (``b_w`` = ``model.bytes_per_param``; ``b_kv`` = ``model.kv_bytes_per_element``, 2 when not
    stated): the time the same elements would take to stream at 2 bytes each (s).

    >>> import dcost
    >>> m = dcost.model("llama-3.1-8b")
    >>> r = dcost.decode(dcost.Design(batch=8), dcost.hardware("h100-sxm"), m, dcost.Workload(1024))
    >>> bool(jnp.isclose(element_time(r, m), r.t_weights + r.t_kv))   # bf16 weights and cache
    True
    """
    kv = model.kv_bytes_per_element
    s_kv = jnp.where(kv > 0.0, 2.0 / jnp.where(kv > 0.0, kv, 1.0), 1.0)
    return step.t_weights * (2.0 / model.bytes_per_param) + step.t_kv * s_kv


def activity(u_compute, u_memory, u_comm=0.0, fit: PowerFit | None = None):
    """``1 - exp(-(c_F u_F + c_M u_E + c_C u_C))``: 0 for an idle chip, towards 1 as it saturates.

    Args:
      u_compute, u_memory, u_comm: utilisations of compute, HBM and links (fractions of peak;
        HBM's counted in 16-bit elements, ``u_E``: ``Energy.memory_element_utilisation``).
      fit: the coefficients (``POWER_FIT`` when None).

    >>> float(activity(0.0, 0.0))
    0.0
    """
    f = POWER_FIT if fit is None else fit
    x = f.compute * u_compute + f.memory * u_memory + f.comm * u_comm
    return -jnp.expm1(-x)


def chip_power(hardware: Hardware, u_compute, u_memory, u_comm=0.0, fit: PowerFit | None = None):
    """``P_idle + (P_max - P_idle) * activity(u)`` (W).

    Args:
      hardware: a chip with ``idle_power`` and ``max_power`` (W).
      u_compute, u_memory, u_comm: utilisations (fractions of peak).
      fit: activity coefficients (``POWER_FIT`` when None).

    Returns:
      Mean power of one chip (W).

    >>> import dcost
    >>> h = dcost.hardware("h100-sxm")
    >>> float(chip_power(h, 0.0, 0.0)) == float(h.idle_power)
    True
    """
    idle, top = _watts(hardware, "chip_power")
    return idle + (top - idle) * activity(u_compute, u_memory, u_comm, fit)


def clock_fraction(hardware: Hardware, cap, power=None):
    """``f/f_max = min(1, ((P_cap - P_idle)/(P - P_idle))^(1/3))`` under a power cap.

    Dynamic power ``C V^2 f`` with voltage following frequency grows as ``f^3`` (Rabaey et al.,
    *Digital Integrated Circuits*, section 5.5), so a step that would draw ``P`` at full clock
    settles, under a cap below ``P``, at the clock whose dynamic power fits: the cube root of the
    share of it left. A cap above ``P`` does not bind (1).

    Args:
      hardware: a chip with ``idle_power`` and ``max_power`` (W).
      cap: the power cap (W), ``idle_power < cap <= max_power``.
      power: what the step draws at full clock (W); None: ``max_power`` (a step that saturates
        the chip).

    >>> import dcost
    >>> h = dcost.hardware("h100-sxm")
    >>> round(float(clock_fraction(h, h.idle_power + (h.max_power - h.idle_power) / 8)), 6)
    0.5
    >>> float(clock_fraction(h, 500.0, power=450.0))   # the step draws less than the cap
    1.0
    """
    idle, top = _watts(hardware, "clock_fraction")
    _check_cap(hardware, cap)
    drawn = top if power is None else power
    share = safe_div(cap - idle, drawn - idle, 1.0)
    return jnp.minimum(share, 1.0) ** (1.0 / 3.0)


def _check_cap(hardware: Hardware, cap) -> None:
    check("power_cap", "cap", cap, low_open=True)
    c = np.asarray(cap, dtype=float) if not isinstance(cap, jax.core.Tracer) else None
    idle = None if isinstance(hardware.idle_power, jax.core.Tracer) else hardware.idle_power
    top = None if isinstance(hardware.max_power, jax.core.Tracer) else hardware.max_power
    if c is None or idle is None or top is None:
        return
    if np.any(c <= np.asarray(idle)):
        raise SpecError(
            f"power_cap: cap = {float(np.min(c)):g} W is not allowed: it must be above the chip's "
            f"idle_power = {float(np.max(np.asarray(idle))):g} W (a cap at idle leaves no clock)"
        )
    if np.any(c > np.asarray(top)):
        raise SpecError(
            f"power_cap: cap = {float(np.max(c)):g} W is not allowed: it must be at most the "
            f"chip's max_power = {float(np.min(np.asarray(top))):g} W (the board limit)"
        )


def power_cap(
    hardware: Hardware,
    cap,
    design: Design | None = None,
    model: Model | None = None,
    workload: Workload | None = None,
    *,
    step: str = "decode",
    smoothness=0.0,
    fit: PowerFit | None = None,
    engine=None,
) -> Hardware:
    """The chip under a power cap, for one step: FLOP/s (and attention FLOP/s) times the clock
    the step settles at (``clock_fraction`` of the power it draws uncapped, ``energy(...)
    .power_per_chip``), and the dynamic power range shrunk by the cube of that clock,
    ``max_power = P_idle + (P_max - P_idle) f^3``, so that the step draws the cap; HBM bandwidth
    and links unchanged (HBM has its own clock). Without ``design``, ``model`` and ``workload``:
    a step that saturates the chip (``power = max_power``), the most a cap can slow it.

    Args:
      hardware: a chip with ``idle_power`` and ``max_power`` (W).
      cap: the cap (W), ``idle_power < cap <= max_power``; anything else raises ``SpecError``
        naming it.
      design, model, workload: the step the chip runs (all three, or none).
      step, smoothness, fit, engine: as ``energy`` (the engine times the uncapped step; pass
        it again to the cost function that evaluates the capped chip).

    Returns:
      A ``Hardware`` to pass to ``dcost.decode``/``prefill``/``energy`` for that step.

    >>> import dcost
    >>> h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3.1-8b")
    >>> full = power_cap(h, 500.0)                      # a saturating step: 80 % of the clock
    >>> round(float(full.flops / h.flops), 3)
    0.802
    >>> w = dcost.Workload(1024, prompt=2048, output=256)
    >>> dec = power_cap(h, 650.0, dcost.Design(batch=8), m, w)   # draws less: the cap is idle
    >>> float(dec.flops / h.flops)
    1.0
    """
    idle, top = _watts(hardware, "power_cap")
    given = [x is not None for x in (design, model, workload)]
    if any(given) and not all(given):
        raise SpecError(
            "power_cap: give design, model and workload together (the step under the cap), "
            "or none of them (a step that saturates the chip)"
        )
    if not all(given):
        return _clocked(hardware, clock_fraction(hardware, cap, top), idle, top)
    assert design is not None and model is not None and workload is not None

    def drawn(chip):
        kw = dict(step=step, fit=fit, engine=engine)
        return energy(design, chip, model, workload, smoothness, **kw).power_per_chip

    # the clock that fits the uncapped draw, then the fixed point: at clock s the step draws
    # P_s = P_idle + (P_max - P_idle) s^3 a(s), and its activity a(s) grows as the clock falls
    # where the step is not compute bound (its FLOPs are a larger share of a slower peak), so
    # s <- s ((cap - P_idle) / (P_s - P_idle))^(1/3) until it draws the cap (one step left a
    # memory-bound decode up to 0.7 % over it)
    s = clock_fraction(hardware, cap, drawn(hardware))
    for _ in range(CAP_ITERATIONS):
        ratio = safe_div(cap - idle, drawn(_clocked(hardware, s, idle, top)) - idle, 1.0)
        s = jnp.minimum(s * jnp.maximum(ratio, 0.0) ** (1.0 / 3.0), 1.0)
    return _clocked(hardware, s, idle, top)


def _clocked(hardware: Hardware, s, idle, top) -> Hardware:
    """The chip at clock fraction ``s``: FLOP/s (and attention FLOP/s) times ``s``, the dynamic
    power range times ``s^3``."""
    attn = hardware.attention_flops
    hw = eqx.tree_at(
        lambda h: (h.flops, h.max_power),
        hardware,
        (hardware.flops * s, idle + (top - idle) * s**3),
    )
    if attn is not None:
        hw = eqx.tree_at(lambda h: h.attention_flops, hw, attn * s)
    return hw


def peak_hardware(hardware: Hardware) -> Hardware:
    """The chip at its peak rates with every v2 term off (v1's pure roofline): what ``u`` divides
    by. ``attention_flops`` (the KV format's rate) and the power fields are kept."""
    return Hardware(
        hardware.flops,
        hardware.hbm_bandwidth,
        hardware.hbm_capacity,
        hardware.scaleup_bandwidth,
        hardware.scaleout_bandwidth,
        hardware.scaleup_size,
        hardware.price_per_hour,
        attention_flops=hardware.attention_flops,
        idle_power=hardware.idle_power,
        max_power=hardware.max_power,
    )


def energy(
    design: Design,
    hardware: Hardware,
    model: Model,
    workload: Workload,
    smoothness=0.0,
    *,
    step: str = "decode",
    fit: PowerFit | None = None,
    engine=None,
) -> Energy:
    """Power and energy of a decode step (a prefill pass, or a continuous-batching step that
    carries both) of one replica.

    ``u_X = P t_X(peak chip) / t_trip(hardware)``; ``P_chip = P_idle + (P_max - P_idle) *
    (1 - exp(-(c_F u_F + c_M u_E + c_C u_C)))`` with ``u_E`` the HBM traffic in 16-bit elements
    (``element_time``); ``energy_per_token = P*G*P_chip / tokens_per_s`` (module docstring).

    Args:
      design, hardware, model, workload, smoothness: as ``dcost.decode``; ``hardware`` must carry
        ``idle_power`` and ``max_power`` (every preset does). A calibrated chip gives the step the
        time it takes in practice, hence lower utilisations than the pure roofline.
      step: ``"decode"`` (J per output token), ``"prefill"`` (J per input token) or
        ``"mixed"`` (``dcost.mixed_step``'s mean step, decodes and the prompt chunks beside them;
        J per output token, its prompt's share included; ``workload`` must carry ``prompt`` and
        ``output``). An aggregated replica runs mixed steps: its power is that of their joint
        utilisations, which the decode step's and the prefill pass's powers added would
        overstate (a memory-bound decode hides part of a chunk's FLOPs; activity is concave).
      fit: activity coefficients (``POWER_FIT`` when None).
      engine: a ``dcost.Engine`` whose profile times the step (as ``dcost.decode``'s
        ``engine``); None: ``hardware`` as given.

    Returns:
      An ``Energy``.

    >>> import dcost
    >>> e = dcost.energy(dcost.Design(batch=64), dcost.hardware("h100-sxm", calibrated=True),
    ...                  dcost.model("llama-3.1-8b"), dcost.Workload(1024))
    >>> 0.0 < float(e.energy_per_token) < 1.0   # J per output token
    True

    Reference: the power shape of GenZ (Bambhaniya et al., "Demystifying AI Platform Design for
    Distributed Inference of Next-Generation LLM models", 2024) and LLMServingSim 2.0; the
    coefficients: the ML.ENERGY Benchmark v3's whole runs (``dcost.calibrate.power.fit_runs``).
    """
    hardware = on_engine(engine, hardware, model)
    idle, top = _watts(hardware, "dcost.energy")
    if step not in STEPS:
        allowed = ", ".join(map(repr, STEPS))
        raise SpecError(f"energy: step = {step!r} is not allowed: it must be one of {allowed}")
    peak = peak_hardware(hardware)
    if step in ("decode", "mixed"):
        cost = decode if step == "decode" else mixed_step
        real = cost(design, hardware, model, workload, smoothness)
        pure = cost(design, peak, model, workload, smoothness)
        trip = real.tpot * real.tokens_per_step
    else:
        real_p = prefill(design, hardware, model, workload, smoothness)
        pure_p = prefill(design, peak, model, workload, smoothness)
        trip = real_p.ttft
        real, pure = real_p, pure_p  # type: ignore[assignment]
    stages = design.stages
    u_f = safe_div(stages * pure.t_compute, trip)
    u_m = safe_div(stages * (pure.t_weights + pure.t_kv), trip)
    u_e = safe_div(stages * element_time(pure, model), trip)
    u_c = safe_div(stages * pure.t_comm, trip)
    act = activity(u_f, u_e, u_c, fit)
    watts = idle + (top - idle) * act
    replica = design.chips_per_replica * watts
    return Energy(
        power_per_chip=watts,
        power_per_replica=replica,
        energy_per_token=replica / real.tokens_per_s,
        tokens_per_mw=WATTS_PER_MEGAWATT * real.tokens_per_s / replica,
        compute_utilisation=u_f,
        memory_utilisation=u_m,
        comm_utilisation=u_c,
        memory_element_utilisation=u_e,
        activity=act,
    )
