"""What dcost predicts for a measurement record: the record's metric from the serving model.

A record (``dcost.validation.load()``) names a chip, a model, number formats, a parallel layout, a
serving pool, a concurrency and mean lengths. ``case(record)`` turns it into the specs of one
replica (``Hardware``, ``Model``, ``Workload``, ``Design``) and says which step it runs; ``predict``
evaluates it. The mapping, in the symbols of DESIGN.md:

- chip: ``dcost.hardware(record.hardware, precision=record.compute, **hardware_overrides)``, with
  attention over the context at the KV cache's rate (``attention_rate``); model:
  ``dcost.model(record.model, weights=record.weights, kv_cache=record.kv_cache)``.
- layout: ``P = pipeline_parallel`` stages of ``G = gpus/P`` chips. A dense model runs tensor
  parallel over ``tensor_parallel`` chips per stage, so an instance wider than that holds
  ``gpus/(P*tensor_parallel)`` replicas side by side. An MoE model spreads its experts over all
  ``G`` chips of a stage in ``e = expert_parallel`` expert-parallel groups (``G`` when the
  record leaves it out), each expert's matrices split over the ``G/e`` chips of its group
  (``Design.expert_parallel``; ``e = 1`` is TensorRT-LLM's and SGLang's MoE tensor parallelism),
  with ``A = max(attention_data_parallel, G/tensor_parallel)`` data-parallel attention groups,
  and a dispatch de-duplicated per scale-up domain when the experts span more than one domain
  (DeepEP-style, as every multi-node deployment in the set uses).
- batch: ``B = concurrency / (replicas * P)`` sequences per micro-batch.
- ``requests`` (optional): a finite offline run of ``N`` requests of fixed lengths through
  ``c = concurrency`` slots runs in waves (``waves``): ``k = N // c`` full waves and one of the
  ``r = N - k*c`` left over, which runs as long as a wave of ``max(r, R)`` sequences (``R``:
  micro-batch slots, ``replicas * P``; fewer leave slots idle). Throughput is the run's tokens
  over the waves' time, ``X = N / sum_j (m_j b_j / X(b_j))`` for ``m_j`` waves of batch ``b_j``
  (here ``k`` of ``c`` and one of ``max(r, R)``), each timed at its own batch: the identical
  lengths make a wave end together, so the last one runs at its own, smaller batch.
- ``comm_overlap`` (optional, 0): the share of the collectives the engine hides behind its
  kernels (``Design.comm_overlap``; two-batch overlap).
- ``wave_prompt_steps`` (optional): an aggregated run whose requests decode in lockstep waves
  (a closed-loop client of fixed lengths against an engine that runs its prompt steps alone),
  each wave's prompts in ``k`` steps. The request whose prompt runs in step ``j`` waits through
  the ``k - j`` after it; over the wave that is ``(k - 1)/2`` of the ``k`` steps' prompt work,
  where in steady state each request waits through all of it: the TPOT is
  ``t_0 + w (t_mixed - t_0)``, ``w = (k - 1)/(2k)``, between a decode step ``t_0`` (``k = 1``:
  every prompt in one step, then nothing but decodes) and the steady mixed step (``w`` -> 1/2).
  Throughputs stay the steady state's: the wave's prompts are all computed.
- workload: decode reads a mean context ``T = prompt + output/2``; speculative records set
  ``draft_tokens`` and ``acceptance``.
- step and metric, with ``n = P*G`` chips of a replica:

  ==========  ============================  ================================================
  serving     step                          metrics
  ==========  ============================  ================================================
  decode      ``dcost.decode``              tpot; step_time = tpot x accepted tokens per step;
                                            output_throughput_per_gpu = tokens_per_s / n
  prefill     ``dcost.prefill``             ttft (the prefill pass of B prompts);
                                            input_throughput_per_gpu = tokens_per_s / n
  aggregated  ``dcost.mixed_step``          tpot (with the prefill's interference); output,
              (continuous batching with     input (x T_in/T_out) and total (x (T_in+T_out)/
              chunked prefill)              T_out) throughput per GPU; ttft: the larger of the
                                            prompt's prefill alone and one decode step of the
                                            other B - 1 sequences (queueing not modelled)
  ==========  ============================  ================================================

``calibrated=False`` is pure physics: the chips' peak rates, one roofline for the whole step, no
overheads, balanced experts. Every
term it leaves out only adds time, so each prediction is a bound: a measured time is never shorter
than predicted, a measured throughput never higher (``tests/test_validation_predict.py`` checks
every shipped record). ``calibrated=True`` applies the profile fitted for the record's hardware
family (``dcost.calibrate.families``: kernels in series, each at its own roofline, and the fitted
efficiencies and overheads) and expected-maximum expert load under multinomial routing.

A record dcost cannot model raises ``SpecError`` naming the field it cannot honour.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Any

import equinox as eqx
import jax.numpy as jnp

from dcost import presets
from dcost.serving.mixed import _mixed_step, mixed_step
from dcost.serving.moe import profiled_routing
from dcost.serving.roofline import decode, prefill
from dcost.specs import Design, Hardware, Model, SpecError, Workload
from dcost.validation import check_record

__all__ = [
    "Case",
    "case",
    "waves",
    "predict",
    "evaluate_case",
    "evaluate_metrics",
    "attention_rate",
    "record_engine",
    "TIME_METRICS",
]

TIME_METRICS = ("tpot", "ttft", "step_time")
"""Metrics in seconds (a bound from below); the others are tokens/s (a bound from above)."""

STEPS = ("decode", "prefill", "mixed", "first_token")
"""What a case evaluates: a decode step, a prefill pass, a mixed step, one prompt's prefill."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One record as the serving model sees it: one replica's specs, the step and the metric.

    Attributes:
      hardware, model, workload, design: the specs of one replica (SI units).
      step: one of ``STEPS``.
      metric: the record's metric.
      chips: chips of one replica, ``P*G`` (the per-GPU throughputs divide by it).
      input_per_output: ``T_in/T_out``, for aggregated input and total throughput.
      wave_share: ``w = (k - 1)/(2k)`` of a run that decodes in waves (``wave_prompt_steps``,
        module docstring): the share of the steady state's prompt interference its TPOT
        carries; None in steady state.
    """

    hardware: Hardware
    model: Model
    workload: Workload
    design: Design
    step: str
    metric: str
    chips: float
    input_per_output: float
    wave_share: Any = None


def _fail(record: Mapping, field: str, why: str):
    raise SpecError(
        f"validation record {record.get('id')!r}: {field} = {record.get(field)!r} "
        f"cannot be modelled: {why}"
    )


def attention_rate(record: Mapping) -> float:
    """Peak FLOP/s of the record's attention over the context (``Hardware.attention_flops``).

    Attention reads its keys and values in the KV cache's number format and multiplies them in
    it (FlashAttention-3 runs fp8 only on fp8 operands; no serving engine of the set runs
    attention in a 4-bit format), so it runs at the slower of the KV cache's rate and the
    matmuls' rate (``compute``); a cache format the chip lists no rate for (an int8 or fp8 cache
    on a chip without that rate) is dequantized to the matmul precision.

    >>> import dcost.validation as v
    >>> r = dict(v.load()[0], hardware="b200", compute="fp4", kv_cache="fp8")
    >>> attention_rate(r) == float(presets.hardware("b200", precision="fp8").flops)
    True
    """
    name, compute, kv = record["hardware"], record["compute"], record["kv_cache"]
    rate = float(_chip(name, compute, ()).flops)
    if kv in presets.precisions(name):
        rate = min(rate, float(_chip(name, kv, ()).flops))
    return rate


@functools.lru_cache(maxsize=256)
def _chip(name: str, precision: str, overrides: tuple) -> Hardware:
    """``presets.hardware`` memoized (a frozen pytree: safe to share between cases)."""
    return presets.hardware(name, precision=precision, **dict(overrides))


_APPLIED: dict[tuple, tuple[Any, Hardware]] = {}
_APPLIED_MAX = 1024


def _record_chip(chip: Hardware, chip_key: tuple, net: Model, net_key: tuple, engine) -> Hardware:
    """The record's chip: ``chip`` at the record's attention rate (``chip_key[-1]``), with
    ``engine``'s profile applied for ``net`` when given; memoized by the chip's and the model's
    keys and the engine object (kept beside its chip, so that its ``id`` is not reused while the
    entry lives): the records of a run share a handful of chips, and applying a profile per record
    was a quarter of building the silicon sample's cases. The same value as computing it anew."""
    key = (chip_key, net_key, id(engine))
    hit = _APPLIED.get(key)
    if hit is not None and hit[0] is engine:
        return hit[1]
    out = eqx.tree_at(
        lambda h: h.attention_flops,
        chip,
        jnp.asarray(chip_key[-1]),
        is_leaf=lambda x: x is None,
    )
    if engine is not None:
        out = engine.apply(out, model=net)
    if len(_APPLIED) >= _APPLIED_MAX:
        _APPLIED.clear()
    _APPLIED[key] = (engine, out)
    return out


@functools.lru_cache(maxsize=256)
def _net(name: str, weights: str, kv_cache: str) -> Model:
    """``presets.model`` memoized."""
    return presets.model(name, weights=weights, kv_cache=kv_cache)


def case(record: Mapping, calibrated: bool = False, engine=None) -> Case:
    """The specs of one replica of the record's deployment, and what to evaluate (see the module
    docstring for the mapping).

    ``engine`` (a ``dcost.Engine``): the chip runs that engine's profile (``Engine.apply``), and
    ``calibrated`` is not read; None: ``calibrated`` says (the family profile or pure physics).

    >>> import dcost.validation as v
    >>> c = case(v.load()[0])
    >>> c.step, c.metric
    ('decode', 'output_throughput_per_gpu')
    """
    check_record(record)
    if record["hardware"] not in presets.hardware_names():
        known = ", ".join(presets.hardware_names())
        _fail(record, "hardware", f"not a hardware preset; known: {known}")
    overrides = tuple(record.get("hardware_overrides", {}).items())
    try:
        chip = _chip(record["hardware"], record["compute"], overrides)
    except (KeyError, ValueError) as err:
        _fail(record, "compute", str(err).strip("'\""))
    net = _net(record["model"], record["weights"], record["kv_cache"])
    chip = _record_chip(
        chip,
        (record["hardware"], record["compute"], overrides, attention_rate(record)),
        net,
        (record["model"], record["weights"], record["kv_cache"]),
        engine,
    )
    if engine is not None:
        calibrated = True  # the engine's measured kernels: expected-maximum expert load too
    elif calibrated:
        chip = presets.with_calibration_profile(chip, record["family"])
    gpus = float(record["gpus"])
    stages = float(record.get("pipeline_parallel", 1))
    tp = float(record.get("tensor_parallel", 1))
    adp = float(record.get("attention_data_parallel", 1))
    if gpus % stages:
        _fail(record, "pipeline_parallel", f"it does not divide gpus = {gpus:g}")
    per_stage = gpus / stages
    moe = float(net.n_experts) > 0
    if moe:
        chips, replicas = per_stage, 1.0
        attention_dp = min(max(adp, per_stage / tp), per_stage)
        dedup = 1.0 if per_stage > float(chip.scaleup_size) else 0.0
        expert_parallel = float(record.get("expert_parallel", per_stage))
        if expert_parallel > per_stage or per_stage % expert_parallel:
            _fail(
                record,
                "expert_parallel",
                f"it does not divide the {per_stage:g} chips of a stage",
            )
    else:
        if per_stage % tp:
            _fail(
                record, "tensor_parallel", f"it does not divide the {per_stage:g} chips of a stage"
            )
        if adp > 1:
            _fail(record, "attention_data_parallel", "data-parallel attention of a dense model")
        chips, replicas = tp, per_stage / tp
        attention_dp, dedup = 1.0, 0.0
        expert_parallel = chips  # no experts: the MoE terms are 0 whatever the groups
    batch = float(record["concurrency"]) / (replicas * stages)
    if batch < 1:
        _fail(record, "concurrency", f"fewer than one sequence per micro-batch ({batch:g})")
    t_in, t_out = float(record["prompt_tokens"]), float(record["output_tokens"])
    spec = record.get("speculative", {})
    serving, metric = record["serving"], record["metric"]
    step = {"decode": "decode", "prefill": "prefill", "aggregated": "mixed"}[serving]
    if metric == "ttft" and serving == "aggregated":
        step = "first_token"
    allowed = {
        "decode": ("tpot", "step_time", "output_throughput_per_gpu"),
        "prefill": ("ttft", "input_throughput_per_gpu"),
        "mixed": (
            "tpot",
            "step_time",
            "output_throughput_per_gpu",
            "input_throughput_per_gpu",
            "total_throughput_per_gpu",
        ),
        "first_token": ("ttft",),
    }[step]
    if metric not in allowed:
        _fail(record, "metric", f"a {serving} pool has no {metric}")
    context = t_in if step in ("prefill", "first_token") else t_in + t_out / 2.0
    workload = Workload(
        context,
        prompt=t_in,
        output=t_out,
        acceptance=float(spec.get("acceptance", 0.0)),
        expert_imbalance=profiled_routing(calibrated, net),
    )
    design = Design(
        batch=batch,
        chips=chips,
        stages=stages,
        attention_dp=attention_dp,
        dispatch_dedup=dedup,
        redundant_experts=0.0,
        expert_parallel=expert_parallel,
        draft_tokens=float(spec.get("draft_tokens", 0.0)),
        prefill_chunk=0.0,
        comm_overlap=float(record.get("comm_overlap", 0.0)),
    )
    share = None
    if "wave_prompt_steps" in record and step == "mixed":
        k = float(record["wave_prompt_steps"])
        share = (k - 1.0) / (2.0 * k)
    return Case(chip, net, workload, design, step, metric, chips * stages, t_in / t_out, share)


def evaluate_case(c: Case, hardware: Hardware | None = None, smoothness=0.0):
    """The metric of a case (seconds or tokens/s per GPU), as a JAX scalar; ``hardware`` replaces
    the case's chip (calibration differentiates through it)."""
    return evaluate_metrics(c, (c.metric,), hardware, smoothness)[0]


def evaluate_metrics(c: Case, metrics, hardware: Hardware | None = None, smoothness=0.0):
    """The case's step evaluated once, and each of ``metrics`` read from it (a JAX array in
    ``metrics`` order; each must be one the step has, see the module docstring)."""
    h = c.hardware if hardware is None else hardware
    args = (c.design, h, c.model, c.workload, smoothness)
    if c.step == "first_token":
        # the prompt's own prefill, alone, and one step of the sequences already decoding: the
        # first token can come no sooner than either (queueing for a slot comes on top)
        alone = eqx.tree_at(lambda d: d.batch, c.design, jnp.ones_like(c.design.batch))
        first = prefill(alone, *args[1:]).ttft
        others = eqx.tree_at(lambda d: d.batch, c.design, jnp.maximum(c.design.batch - 1.0, 1.0))
        busy = decode(others, *args[1:])
        return jnp.stack([jnp.maximum(first, busy.tpot * busy.tokens_per_step) for _ in metrics])
    if c.step == "prefill":
        p = prefill(*args)
        return jnp.stack([p.ttft if m == "ttft" else p.tokens_per_s / c.chips for m in metrics])
    r = decode(*args) if c.step == "decode" else mixed_step(*args)
    per_gpu = r.tokens_per_s / c.chips
    tpot = r.tpot
    if c.step == "mixed" and c.wave_share is not None:
        # a run in waves: a decode step and the share w of the prompt interference
        alone = _mixed_step(c.design, h, c.model, c.workload, smoothness, chunk_tokens=0.0)
        tpot = alone.tpot + jnp.asarray(c.wave_share) * (r.tpot - alone.tpot)
    values = {
        "tpot": tpot,
        "step_time": tpot * r.tokens_per_step,
        "output_throughput_per_gpu": per_gpu,
        "input_throughput_per_gpu": per_gpu * c.input_per_output if c.step == "mixed" else per_gpu,
        "total_throughput_per_gpu": per_gpu * (1.0 + c.input_per_output),
    }
    return jnp.stack([values[m] for m in metrics])


def waves(record: Mapping) -> tuple[tuple[float, dict], ...]:
    """The waves of a finite offline run: ``((share, run), ...)``, where ``run`` is the record
    with the concurrency of one kind of wave and ``share`` is the time weight of those waves,
    ``m * b / N`` (``m`` waves of ``b`` sequences of the run's ``N = requests``), so that the
    run's throughput is ``1 / sum(share / X(run))``.

    Without ``requests``, or with every wave full, it is ``((1.0, record),)``: the steady state.
    A partial last wave of ``r`` requests runs at ``b = max(r, R)`` (``R`` micro-batch slots of
    the layout: fewer requests leave slots idle and take the time of one sequence per slot).

    >>> import dcost.validation as v
    >>> r = next(x for x in v.load() if x["id"] == "trtllm-gpt-oss-120b-h200-tp1-1024-1024")
    >>> r = dict(r, concurrency=1000, requests=2500)
    >>> [(s, w["concurrency"]) for s, w in waves(r)]
    [(0.8, 1000), (0.2, 500)]
    """
    c = int(record["concurrency"])
    n = int(record.get("requests", c))
    full, rest = divmod(n, c)
    if rest == 0:
        return ((1.0, dict(record)),)
    slots = round(c / float(case(record).design.batch))  # replicas * P, as case() maps them
    last = max(rest, slots)
    return (
        (full * c / n, dict(record)),
        (last / n, dict(record, concurrency=last)),
    )


def record_engine(record: Mapping):
    """The shipped profile of the engine a record names, on its hardware: that version, else the
    nearest shipped version of that engine (``dcost.engines``); None when the record names no
    engine with profiles or none ships for its chip (the family profile then applies).

    Returns ``(engine or None, why)``: ``why`` says which profile was taken and why.
    """
    from dcost import engines as eng

    name = record.get("engine")
    if name not in eng.ENGINE_NAMES:
        return None, "the family profile: the record names no engine with profiles"
    rows = [r for r in eng.engines() if r[0] == name and r[2] == record["hardware"]]
    if not rows:
        return None, f"the family profile: no {name} profile ships for {record['hardware']}"
    want = record.get("engine_version")
    versions = [r[1] for r in rows]
    # the scheduler as the record's own version ran it, or its date where it names none
    # (``dcost.engines.at_version``)
    if want in versions:
        e = eng.engine(name, record["hardware"], version=want)
        return eng.at_version(e, want, record.get("measured")), f"{name} {want} (its version)"
    key = eng._version_key(want) if want else None
    nearest = min(versions, key=lambda v: _distance(eng._version_key(v), key))
    return (
        eng.at_version(
            eng.engine(name, record["hardware"], version=nearest), want, record.get("measured")
        ),
        f"{name} {nearest} (nearest shipped version to {want or 'an unstated version'})",
    )


def _distance(a, b) -> tuple:
    """How far version key ``a`` is from ``b`` (None: the latest wins)."""
    if b is None:
        return tuple((-x, "") for x, _ in a)
    out = []
    for i in range(max(len(a), len(b))):
        x = a[i][0] if i < len(a) else 0
        y = b[i][0] if i < len(b) else 0
        out.append(abs(x - y))
    return tuple(out)


def predict(
    record: Mapping,
    calibrated: bool = False,
    engine=None,
    explain: bool = False,
    interval: float | None = None,
):
    """The record's metric as dcost predicts it (SI units: seconds or tokens/s per GPU).

    ``calibrated=False``: pure physics, a bound (a measured time is never shorter, a measured
    throughput never higher). ``calibrated=True``: the profile of the engine the record names
    (``engine``, ``engine_version``; ``record_engine``), else the fitted profile of the record's
    family. ``engine`` (a ``dcost.Engine``) predicts with that engine's profile instead. A record
    with ``requests`` is a finite run: its throughput combines its ``waves``.

    ``explain=True`` returns ``(value, why)``, ``why`` naming the profile used.

    ``interval`` (0.5, 0.8 or 0.9; needs an engine profile, given or the record's): the value is
    ``(low, mid, high)``, a band that holds a measurement with that probability, from the
    engine's held-out errors on the silicon sample (``dcost.engines.interval_factors``; a time
    metric scales by the factors, a throughput by their inverses).

    >>> import dcost.validation as v
    >>> r = v.load()[0]
    >>> predict(r) >= r["value"]   # throughput: pure physics is an upper bound
    True
    """
    if not isinstance(calibrated, bool):
        raise SpecError(f"predict: calibrated = {calibrated!r} must be True or False")
    why = "pure physics (peak rates, no overheads): a bound"
    if engine is not None:
        why = f"{engine.label} on {engine.hardware_name} (given)"
    elif calibrated:
        engine, why = record_engine(record)
    parts = waves(record)
    if len(parts) == 1:
        value = float(evaluate_case(case(record, calibrated, engine)))
    else:
        value = 1.0 / sum(
            share / float(evaluate_case(case(run, calibrated, engine))) for share, run in parts
        )
    if interval is not None:
        if engine is None:
            raise SpecError(
                "predict: interval needs an engine profile (engine=dcost.engine(...), or "
                "calibrated=True on a record whose engine ships a profile for its chip)"
            )
        from dcost.engines import interval_factors

        lo, hi = interval_factors(engine, interval)
        if record["metric"] not in TIME_METRICS:
            lo, hi = 1.0 / hi, 1.0 / lo
        band = (value * lo, value, value * hi)
        return (band, why) if explain else band
    return (value, why) if explain else value


def _replace_hardware(c: Case, **fields) -> Case:
    h = eqx.tree_at(
        lambda x: tuple(getattr(x, k) for k in fields),
        c.hardware,
        tuple(jnp.asarray(v) for v in fields.values()),
        is_leaf=lambda x: x is None,
    )
    return dataclasses.replace(c, hardware=h)
