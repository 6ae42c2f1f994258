"""What the explorer page asks, answered from dcost's public API as plain JSON-ready dicts.

A ``Query`` is one position of the page's controls: hardware, model and engine by name; the prompt
(``context``) and output lengths in tokens; the batch ``B`` and chips per stage ``G`` of the design
on show; the TPOT target (s) and the traffic's arrival rate (requests/s). ``parse`` turns the
strings of a request into one, checking every value with the API's own constructors
(``dcost.Workload``, ``dcost.Design``, ``dcost.Limits``, ``dcost.Traffic``, the presets), so that
a bad value gets the API's message, with the request field it came from (``QueryError``).

Four answers, each a function of a ``Query`` (SI units throughout; the page converts):

- ``curve``: time and cost per output token against the batch, with the roofline's terms
  (``t_compute``, ``t_weights``, ``t_kv``, ``t_comm``, ``t_overhead``), from one jitted, vmapped
  ``dcost.decode`` over a geometric grid of batches (the design on show is the grid's last row);
- ``optimum``: ``dcost.optimize`` of a ``dcost.Problem`` freeing the batch at the chips given,
  with its binding constraint;
- ``elasticities``: ``dcost.sensitivity`` of that problem, ranked;
- ``fleet``: ``dcost.plan``, the cheapest fleet for the traffic at the TPOT target (p90) and a TTFT
  target of ``TTFT_SLO``.

The decode context is the mean over a request's output, ``T = context + output/2`` (as
``dcost.Workload`` describes it); the prompt is ``context``. The engine is "physics" (the
datasheet: a bound), "calibrated" (``dcost.hardware(name, calibrated=True)``, the family profile)
or a shipped engine profile ``"name@version"`` (``dcost.engines()``; ``dcost.engine``).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import dcost
from dcost.presets import PresetError
from dcost.serving.moe import profiled_routing
from dcost.specs import SpecError

__all__ = [
    "Query",
    "QueryError",
    "parse",
    "parse_cached",
    "choices",
    "curve",
    "optimum",
    "elasticities",
    "fleet",
    "answer",
    "ANSWERS",
    "DEPENDS",
    "DEFAULTS",
    "BATCH_MAX",
    "GRID_POINTS",
    "TTFT_SLO",
    "TPOT_PERCENTILE",
    "TERMS",
    "ELASTICITY_FLOOR",
    "MEMORY_RESERVE",
    "ENGINE_PHYSICS",
    "ENGINE_CALIBRATED",
]

BATCH_MAX = 4096
"""Largest batch on the curve and in the optimum's search (sequences)."""
GRID_POINTS = 96
"""Batches on the curve, geometric from 1 to ``BATCH_MAX``."""
TTFT_SLO = (2.0, 0.99)
"""The fleet's time-to-first-token target: (s, percentile) (``dcost.plan``'s default)."""
TPOT_PERCENTILE = 0.9
"""The percentile at which the fleet meets the page's TPOT target."""
TERMS = ("t_compute", "t_weights", "t_kv", "t_comm", "t_overhead")
"""The roofline's terms of one stage step on the curve (``dcost.Report``, s)."""
MEMORY_RESERVE = 0.1
"""Share of HBM the optimum and the fleet keep free (``dcost.Limits``' and ``dcost.plan``'s
default), and the curve's memory limit."""
ELASTICITY_FLOOR = 1e-6
"""Elasticities smaller in magnitude are not shown: the multiplier of a slack constraint comes
out of the KKT solve as float32 rounding of zero (1e-19 and the like), a bar nobody could see."""
ENGINE_PHYSICS = "physics"
ENGINE_CALIBRATED = "calibrated"

DEFAULTS: dict[str, Any] = {
    "hardware": "h100-sxm",
    "model": "llama-3-70b",
    "engine": ENGINE_PHYSICS,
    "context": 2048.0,
    "output": 256.0,
    "batch": 64.0,
    "chips": 8.0,
    "tpot_slo": 0.05,
    "rate": 10.0,
}
"""A request's fields and the value each takes when the request leaves it out."""
_NUMBERS = ("context", "output", "batch", "chips", "tpot_slo", "rate")


class QueryError(ValueError):
    """A bad value in a request: ``field`` names the request's field, the message says what is
    allowed (the API's own message where the API found it)."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


@dataclasses.dataclass(frozen=True)
class Query:
    """One position of the page's controls, with the API's values it stands for.

    Attributes:
      hardware_name, model_name, engine_name: the names asked for.
      context: prompt tokens; output: output tokens per request.
      batch: sequences per step ``B`` of the design on show; chips: chips per stage ``G``.
      tpot_slo: time per output token target (s); rate: arrivals (requests/s).
      hardware, model, workload, design, traffic: the API's values (``hardware``: the
        datasheet, or the calibrated family profile).
      engine: the ``dcost.Engine`` chosen (``dcost.engine(name, hardware=..., version=...)``),
        or None (pure physics, or the calibrated family profile).
      on_chip: ``hardware`` with the engine's profile applied (``Engine.apply``; ``hardware``
        itself when ``engine`` is None): the chip a cost function evaluates, which the curve's
        jitted program takes (an engine's profile is applied outside jit).
    """

    hardware_name: str
    model_name: str
    engine_name: str
    context: float
    output: float
    batch: float
    chips: float
    tpot_slo: float
    rate: float
    hardware: dcost.Hardware
    model: dcost.Model
    workload: dcost.Workload
    design: dcost.Design
    traffic: Any
    engine: Any = None
    on_chip: Any = None


def _engine_rows() -> list[tuple[str, str, str]]:
    """``(engine, version, hardware)`` for every shipped engine profile (``dcost.engines()``), or
    none when this dcost has no engines."""
    if not hasattr(dcost, "engines"):
        return []
    listing: Any = dcost.engines  # a callable subpackage
    return [(str(e), str(v), str(h)) for e, v, h in listing()]


def choices() -> dict:
    """The page's choice lists: hardware and model presets, and the engines with the hardware
    each has a profile for (None: every hardware).

    >>> c = choices()
    >>> "h100-sxm" in c["hardware"], "llama-3-70b" in c["models"], c["engines"][0]["id"]
    (True, True, 'physics')
    """
    engines: list[dict] = [
        {"id": ENGINE_PHYSICS, "label": "pure physics (a bound)", "hardware": None},
        {"id": ENGINE_CALIBRATED, "label": "calibrated (family profile)", "hardware": None},
    ]
    by_id: dict[str, dict] = {}
    for name, version, hw in _engine_rows():
        key = f"{name}@{version}"
        entry = by_id.setdefault(key, {"id": key, "label": f"{name} {version}", "hardware": []})
        entry["hardware"].append(hw)
    engines += list(by_id.values())
    return {
        "hardware": list(dcost.hardware_names()),
        "models": list(dcost.model_names()),
        "engines": engines,
        "defaults": dict(DEFAULTS),
    }


def _number(field: str, text) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise QueryError(field, f"{field} = {text!r} is not a number") from None
    if not math.isfinite(value):
        raise QueryError(field, f"{field} = {text!r} is not allowed: it must be finite")
    return value


# the API's "Class.field = value is not allowed" messages, and the request field each comes from
_FIELD_OF = {
    "Traffic.prompt_tokens": "context",
    "Traffic.output_tokens": "output",
    "Traffic.rate": "rate",
    "Workload.context": "context",
    "Workload.prompt": "context",
    "Workload.output": "output",
    "Design.batch": "batch",
    "Design.chips": "chips",
    "Problem.tpot_slo": "tpot_slo",
}


def _api(field: str, make):
    """``make()``, with the API's own error (SpecError, PresetError) tagged with the request's
    field that the message names (``_FIELD_OF``), else ``field``."""
    try:
        return make()
    except (SpecError, PresetError) as err:
        msg = str(err.args[0] if isinstance(err, KeyError) and err.args else err)
        named = next((f for key, f in _FIELD_OF.items() if msg.startswith(key + " ")), field)
        raise QueryError(named, msg) from None


@functools.lru_cache(maxsize=64)
def _hardware(name: str, calibrated: bool) -> dcost.Hardware:
    """A hardware preset (a frozen value, so one copy serves every request)."""
    return _api("hardware", lambda: dcost.hardware(name, calibrated=calibrated))


@functools.lru_cache(maxsize=64)
def _model(name: str) -> dcost.Model:
    return _api("model", lambda: dcost.model(name))


def _engine(name: str, hardware_name: str):
    """The hardware value and the ``engine=`` value an engine choice stands for."""
    if name == ENGINE_PHYSICS:
        return _hardware(hardware_name, False), None
    if name == ENGINE_CALIBRATED:
        return _hardware(hardware_name, True), None
    rows = _engine_rows()
    known = [ENGINE_PHYSICS, ENGINE_CALIBRATED]
    known += sorted(f"{e}@{v}" for e, v, hw in rows if hw == hardware_name)
    engine, _, version = name.partition("@")
    if (engine, version, hardware_name) not in rows:
        raise QueryError(
            "engine",
            f"engine = {name!r} is not allowed for hardware {hardware_name!r}: choose from "
            + ", ".join(known),
        )
    hardware = _hardware(hardware_name, False)
    make: Any = getattr(dcost, "engine", None)  # dcost.engine, where this dcost has engines
    return hardware, _api("engine", lambda: make(engine, hardware=hardware_name, version=version))


def parse(params: Mapping[str, Any]) -> Query:
    """A ``Query`` from a request's fields (strings or numbers; a missing field takes its value
    from ``DEFAULTS``); raises ``QueryError`` naming the field of the first bad value.

    >>> q = parse({"context": "4096", "batch": "32"})
    >>> q.batch, float(q.workload.context), q.hardware_name
    (32.0, 4224.0, 'h100-sxm')
    >>> try:
    ...     parse({"context": "-1"})
    ... except QueryError as err:
    ...     print(err.field, "|", err)
    context | Traffic.prompt_tokens = -1.0 is not allowed: it must be finite and >= 1
    """
    unknown = sorted(set(params) - set(DEFAULTS))
    if unknown:
        raise QueryError(
            unknown[0],
            f"{unknown[0]} is not a field of a query: the fields are {', '.join(DEFAULTS)}",
        )
    raw = {**DEFAULTS, **params}
    nums = {k: _number(k, raw[k]) for k in _NUMBERS}
    hardware_name, model_name, engine_name = (
        str(raw["hardware"]),
        str(raw["model"]),
        str(raw["engine"]),
    )
    hardware, engine = _engine(engine_name, hardware_name)
    model = _model(model_name)
    traffic = _api(
        "context",
        lambda: dcost.Traffic(
            nums["rate"], prompt_tokens=nums["context"], output_tokens=nums["output"]
        ),
    )
    # the expert load a step is timed at: multinomial for a mixture of experts on a profiled
    # chip (the family's or an engine's: what they were fitted at), else balanced; always a
    # number, so every choice shares the page's programs
    routing = profiled_routing(engine is not None or not hardware.pure, model)
    workload = _api(
        "context",
        lambda: dcost.Workload(
            nums["context"] + nums["output"] / 2,
            prompt=nums["context"],
            output=nums["output"],
            expert_imbalance=routing,
        ),
    )
    design = _api("batch", lambda: dcost.Design(batch=nums["batch"], chips=nums["chips"]))
    _api("tpot_slo", lambda: dcost.Limits(tpot_slo=nums["tpot_slo"]))
    return Query(
        hardware_name,
        model_name,
        engine_name,
        hardware=hardware,
        model=model,
        workload=workload,
        design=design,
        traffic=traffic,
        engine=engine,
        on_chip=(
            hardware
            if engine is None
            else _api("engine", lambda: engine.apply(hardware, model=model))
        ),
        **nums,
    )


_PARSE_LOCK = threading.Lock()


@functools.lru_cache(maxsize=256)
def _parse_key(key: tuple) -> Query:
    return parse(dict(key))


def parse_cached(params: Mapping[str, Any]) -> Query:
    """``parse``, remembered: the page asks its four answers at once with the same fields, and
    building the specs is a good part of an answer's time (a lock makes the other three wait
    for the first and reuse its ``Query``). Errors are not remembered.

    >>> parse_cached({"batch": "8"}) is parse_cached({"batch": "8"})
    True
    """
    key = tuple(sorted((str(k), str(v)) for k, v in params.items()))
    with _PARSE_LOCK:
        return _parse_key(key)


def _finite(x) -> float | None:
    """A JSON number: None for NaN or inf (JSON has neither)."""
    x = float(x)
    return x if math.isfinite(x) else None


def _list(x) -> list:
    return [_finite(v) for v in np.asarray(x, dtype=float).ravel()]


def _with_engine(fn, q: Query) -> tuple[dcost.Hardware, dict]:
    """The hardware and keywords to call ``fn`` with: ``engine=`` where ``fn`` takes it (with
    the datasheet hardware), else the chip with the engine's profile applied."""
    if q.engine is None:
        return q.hardware, {}
    if "engine" in inspect.signature(fn).parameters:
        return q.hardware, {"engine": q.engine}
    return q.on_chip, {}


TRACES = [0]
"""How many times the curve's program was traced (a test guards against retracing)."""


@eqx.filter_jit
def _curve_program(batches, chips, hardware, model, workload):
    """One decode report per batch: ``vmap`` of ``dcost.decode`` over ``batches``."""
    TRACES[0] += 1

    def one(b):
        return dcost.decode(dcost.Design(batch=b, chips=chips), hardware, model, workload)

    return jax.vmap(one)(batches)


def batch_grid(batch: float) -> np.ndarray:
    """The curve's batches: ``GRID_POINTS`` geometric from 1 to ``BATCH_MAX``, then ``batch``.

    >>> g = batch_grid(64.0)
    >>> g.shape, float(g[0]), float(g[-2]), float(g[-1])
    ((97,), 1.0, 4096.0, 64.0)
    """
    grid = np.geomspace(1.0, BATCH_MAX, GRID_POINTS)
    return np.append(grid, batch).astype(np.float32)


def curve(q: Query) -> dict:
    """Time and cost per output token against the batch, with the roofline's terms.

    One jitted, vmapped ``dcost.decode`` over ``batch_grid(q.batch)`` at ``q.chips`` chips per
    stage; the last row is the design on show (``point``), the others the curve. Units: s, $ per
    output token, bytes; ``memory_limit`` is HBM less the optimum's reserve (10 %).

    >>> c = curve(parse({"batch": "8"}))
    >>> len(c["batch"]), c["point"]["batch"], c["point"]["bottleneck"]
    (96, 8.0, 'memory')
    """
    r = _curve_program(
        jnp.asarray(batch_grid(q.batch)),
        jnp.float32(q.chips),
        q.on_chip,
        q.model,
        q.workload,
    )
    names = ("tpot", "cost_per_token", "memory_per_chip", *TERMS)
    arrays = {n: np.asarray(getattr(r, n), dtype=float) for n in names}
    point: dict[str, Any] = {n: _finite(a[-1]) for n, a in arrays.items()}
    point["batch"] = float(q.batch)
    last = jax.tree.map(lambda x: x[-1], r)
    point["bottleneck"] = str(dcost.bottleneck(last))
    memory_limit = float(q.on_chip.hbm_capacity) * (1.0 - MEMORY_RESERVE)
    fits = arrays["memory_per_chip"][:-1] <= memory_limit
    return {
        "batch": _list(batch_grid(q.batch)[:-1]),
        **{n: _list(a[:-1]) for n, a in arrays.items()},
        "point": point,
        "memory_limit": memory_limit,
        "largest_batch_in_memory": _finite(batch_grid(q.batch)[:-1][fits].max())
        if fits.any()
        else None,
        "tpot_slo": q.tpot_slo,
        "units": {
            "batch": "sequences",
            "tpot": "s",
            "cost_per_token": "$ per output token",
            "memory_per_chip": "bytes",
            **dict.fromkeys(TERMS, "s"),
        },
    }


def problem(q: Query):
    """The optimum's problem: batch free in ``[1, BATCH_MAX]`` at ``q.chips`` chips per stage and
    one stage, cost per output token, TPOT at most ``q.tpot_slo`` and HBM with a 10 % reserve."""
    hardware, kw = _with_engine(dcost.Problem, q)
    return dcost.Problem(
        hardware,
        q.model,
        q.workload,
        free={"batch": (1, BATCH_MAX)},
        fixed=dcost.Design(batch=1.0, chips=q.chips),
        tpot_slo=q.tpot_slo,
        memory_reserve=MEMORY_RESERVE,
        **kw,
    )


def optimum(q: Query) -> dict:
    """The cheapest batch at the chips given (``dcost.optimize``) and what binds it.

    ``binding`` lists the constraints (``tpot``, ``memory``) and bounds (``batch <= 4096``) that
    stop a cheaper design; ``message`` says why there is none when ``feasible`` is False.
    """
    s = dcost.optimize(problem(q))
    feasible = bool(s.feasible)
    binding = list(s.binding) + list(s.at_bound)
    return {
        "feasible": feasible,
        "message": str(s.message),
        "batch": _finite(s.design.batch),
        "chips": _finite(s.design.chips),
        "cost_per_token": _finite(s.cost),
        "tpot": _finite(s.report.tpot),
        "memory_per_chip": _finite(s.report.memory_per_chip),
        "bottleneck": str(dcost.bottleneck(s.report)),
        "binding": binding,
        "units": {"cost_per_token": "$ per output token", "tpot": "s", "memory_per_chip": "bytes"},
    }


def elasticities(q: Query, top: int = 12) -> dict:
    """``d log(optimal cost) / d log(input)`` of the optimum's problem (``dcost.sensitivity``),
    the ``top`` largest in magnitude at least ``ELASTICITY_FLOOR``; ``feasible`` False with the
    API's message when the optimum does not exist (no elasticities there)."""
    try:
        sens = dcost.sensitivity(problem(q))
    except SpecError as err:  # values are checked by parse: this is an unreachable target
        return {"feasible": False, "message": str(err), "bars": []}
    rows = [(n, v) for n, v in sens.ranked(top) if abs(v) >= ELASTICITY_FLOOR]
    return {
        "feasible": bool(sens.feasible),
        "message": str(sens.message),
        "bars": [{"name": n, "elasticity": v} for n, v in rows],
        "units": {"elasticity": "d log(cost per token) / d log(input), dimensionless"},
    }


def _plan_dict(p) -> dict:
    return {
        "mode": p.mode,
        "feasible": bool(p.feasible),
        "message": str(p.message),
        "pools": [
            {"describe": x.describe(), **{k: v for k, v in vars(x).items() if _jsonable(v)}}
            for x in p.pools
        ],
        "chips": _finite(p.chips),
        "cost_per_hour": _finite(p.cost_per_hour),
        "cost_per_million_input": _finite(p.cost_per_million_input),
        "cost_per_million_output": _finite(p.cost_per_million_output),
        "ttft": {str(k): _finite(v) for k, v in p.ttft.items()},
        "tpot": {str(k): _finite(v) for k, v in p.tpot.items()},
        "binding": p.binding,
    }


def _jsonable(v) -> bool:
    return isinstance(v, str | int | bool) or (isinstance(v, float) and math.isfinite(v))


def fleet(q: Query) -> dict:
    """The cheapest fleet for ``q.rate`` requests/s (``dcost.plan``, aggregated or disaggregated)
    at TPOT ``q.tpot_slo`` at p90 and TTFT ``TTFT_SLO``; ``alternative`` is the other mode's."""
    hardware, kw = _with_engine(dcost.plan, q)
    p = dcost.plan(
        hardware,
        q.model,
        q.traffic,
        ttft_slo=TTFT_SLO,
        tpot_slo=(q.tpot_slo, TPOT_PERCENTILE),
        memory_reserve=MEMORY_RESERVE,
        **kw,
    )
    out = _plan_dict(p)
    out["alternative"] = None if p.alternative is None else _plan_dict(p.alternative)
    out["ttft_slo"] = list(TTFT_SLO)
    out["tpot_slo"] = [q.tpot_slo, TPOT_PERCENTILE]
    out["units"] = {
        "cost_per_hour": "$ per hour",
        "cost_per_million_input": "$ per million input tokens",
        "cost_per_million_output": "$ per million output tokens",
        "ttft": "s",
        "tpot": "s",
    }
    return out


ANSWERS: dict[str, Callable[[Query], dict]] = {
    "curve": curve,
    "optimum": optimum,
    "elasticities": elasticities,
    "fleet": fleet,
}
"""The four answers, by the name the page asks them by (``/api/<name>``)."""
DEPENDS = {
    "curve": ("context", "output", "batch", "chips", "tpot_slo"),
    "optimum": ("context", "output", "chips", "tpot_slo"),
    "elasticities": ("context", "output", "chips", "tpot_slo"),
    "fleet": ("context", "output", "tpot_slo", "rate"),
}
"""The numeric fields each answer reads (besides hardware, model and engine, which all read):
the optimum frees the batch and has no traffic; the fleet chooses its own layouts. A slider
move recomputes only the answers that read it (``answer``); ``tests/test_web.py`` checks that
the others do not change."""
_CACHE_SIZE = 512
_CACHE: OrderedDict = OrderedDict()
_CACHE_LOCK = threading.Lock()


def answer(name: str, q: Query) -> dict:
    """``ANSWERS[name](q)``, remembered by the fields it reads (``DEPENDS``; the last
    ``_CACHE_SIZE`` answers): moving the batch slider recomputes the curve alone, the rate the
    fleet alone. The answers are plain dicts; do not change one you are given.

    >>> q = parse({"batch": "8"})
    >>> answer("curve", q) is answer("curve", q)
    True
    """
    key = (name, q.hardware_name, q.model_name, q.engine_name)
    key += tuple(getattr(q, f) for f in DEPENDS[name])
    with _CACHE_LOCK:
        if key in _CACHE:
            _CACHE.move_to_end(key)
            return _CACHE[key]
    value = ANSWERS[name](q)
    with _CACHE_LOCK:
        _CACHE[key] = value
        while len(_CACHE) > _CACHE_SIZE:
            _CACHE.popitem(last=False)
    return value
