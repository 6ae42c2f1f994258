"""``dcost.plan``: the cheapest fleet that serves a traffic within latency percentiles.

    p = dcost.plan(hardware, model, traffic, ttft_slo=(2.0, 0.99), tpot_slo=(0.05, 0.90))

minimizes dollars per hour, ``sum over pools of n P G p``, over the serving mode (one
aggregated pool, or a prefill and a decode pool), each pool's layout (chips per stage, stages,
attention layout, prefill chunk, speculative length where the model has a draft) and its whole
number of replicas, subject to the traffic being served (every queue stable) with TTFT and TPOT
at their percentiles within the targets and enough KV memory for the batch slots
(``dcost.planning.search``). The answer is exact over the layouts enumerated (``Options``):
``plan_grid`` evaluates every layout at every replica count and gives the same fleet.

Prices per million tokens split the bill between input and output: a disaggregated fleet's
prefill pool is the input's, its decode pool the output's; an aggregated pool's share of input is
the share of its step time that prefill chunks add, ``1 - t(B, 0)/t_bar``, against the decode
time each sequence takes of its steps (``Latency.input_share``: the same when the pool is busy,
each request's own prefill and decode time when it is nearly idle).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import time
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from dcost import _programs
from dcost.engines import on_engine
from dcost.engines import resolve as resolve_engine
from dcost.planning import search as S
from dcost.planning._jit import jit as _small_jit
from dcost.planning.designs import (
    Layout,
    step_table,
    unused_table,
    workload_from_stats,
    workload_stats,
)
from dcost.planning.traffic import Traffic
from dcost.presets import model as model_preset
from dcost.presets import serving_hardware
from dcost.search._jit import jit
from dcost.search.buckets import bucket, pad
from dcost.serving.moe import profiled_routing
from dcost.specs import (
    Hardware,
    Model,
    SpecError,
    _concrete,
    check,
    check_count,
    splits_heads,
    whole_max,
)

__all__ = [
    "plan",
    "plan_grid",
    "Plan",
    "PlanBatch",
    "PoolPlan",
    "Options",
    "layouts",
    "REPORT_QUANTILES",
    "MODES",
    "traffic_at",
]

MODES = ("aggregated", "disaggregated", "best")
WIDTH = 64
"""Scenarios a batched plan's search advances together per round (``search.search``'s
``width``): the scenarios still searching are gathered from the whole batch each round."""
REPORT_QUANTILES = (0.5, 0.9, 0.99)
"""Percentiles a plan reports besides its targets'."""
_ROLES = {"aggregated": ("aggregated",), "disaggregated": ("prefill", "decode")}


class _OptionFields(NamedTuple):
    chips: tuple[int, ...] | None = None
    max_chips: int = 72
    stages: tuple[int, ...] = (1, 2, 4)
    chunks: tuple[int, ...] = (512, 1024, 2048, 4096, 8192)
    prefill_chunks: tuple[int, ...] = (4096, 8192, 16384)
    draft_tokens: tuple[int, ...] = (0, 1, 2, 3)
    attention: tuple[str, ...] = ("tp", "dp")


class Options(_OptionFields):
    """The layouts a plan chooses from (static; every combination is tried).

    Attributes:
      chips: chips per stage ``G`` to try; None: powers of two up to ``max_chips`` and the
        scale-up domain's size.
      max_chips: most chips per stage (with ``chips=None``).
      stages: pipeline depths ``P``; a depth beyond 1 only for a stage that fills its scale-up
        domain (a pipeline pays where tensor or expert parallelism would cross domains).
      chunks: prefill chunks ``C`` of an aggregated pool (tokens per step).
      prefill_chunks: prefill chunks of a disaggregated prefill pool.
      draft_tokens: speculative lengths, where the model has a draft and ``acceptance`` is given.
      attention: for an MoE model, ``"tp"`` (tensor-parallel attention, ``A = 1``) and/or
        ``"dp"`` (data-parallel attention, ``A = G``); a dense model is tensor parallel.

    Checked at construction (and again by ``plan``, for one made by ``_replace``): each tuple
    non-empty, of whole numbers (``chips``, ``stages``, ``chunks``, ``prefill_chunks`` >= 1,
    ``draft_tokens`` >= 0) or of ``"tp"`` / ``"dp"``; SpecError names the field.

    >>> try:
    ...     Options(chunks=(0,))
    ... except SpecError as err:
    ...     print(str(err)[:42])
    Options.chunks[0] = 0 is not allowed: it m
    """

    __slots__ = ()

    def __new__(cls, *args, **kwargs):
        options = super().__new__(cls, *args, **kwargs)
        check_options("Options", options)
        return options


def check_options(owner: str, options) -> None:
    """Raise SpecError unless ``options`` is an ``Options`` whose fields a plan can use, naming
    the field, its value and what is allowed (the one check of ``Options``, made at construction
    and by ``plan`` and ``plan_grid``)."""
    if not isinstance(options, _OptionFields):
        raise SpecError(f"{owner}: options must be a dcost.planning.Options, got {options!r}")
    counts = {
        "chips": 1.0,
        "stages": 1.0,
        "chunks": 1.0,
        "prefill_chunks": 1.0,
        "draft_tokens": 0.0,
    }
    for name, low in counts.items():
        values = getattr(options, name)
        if name == "chips" and values is None:
            continue
        if not isinstance(values, (tuple, list)) or not values:
            raise SpecError(
                f"Options.{name} = {values!r} is not allowed: it must be a non-empty tuple of "
                f"whole numbers >= {low:g}" + (" (or None)" if name == "chips" else "")
            )
        for i, v in enumerate(values):
            _whole(f"Options.{name}[{i}]", v, low)
    _whole("Options.max_chips", options.max_chips, 1.0)
    kinds = options.attention
    if (
        not isinstance(kinds, (tuple, list))
        or not kinds
        or any(not isinstance(k, str) or k not in ("tp", "dp") for k in kinds)
    ):
        raise SpecError(
            f"Options.attention = {kinds!r} is not allowed: it must be a non-empty tuple of "
            '"tp" (tensor-parallel attention) and/or "dp" (data-parallel attention)'
        )


def _whole(name: str, v, low: float) -> None:
    """Raise SpecError unless ``v`` is a whole number (not a boolean) >= ``low``, at most
    ``whole_max()`` (a layout's count is a float in the program)."""
    owner, _, field = name.partition(".")
    check_count(owner, field, v, int(low))
    if v > whole_max():
        raise SpecError(f"{name} = {v!r} is not allowed: it must be at most {whole_max():g}")


DEFAULT_OPTIONS = Options()


def _value(x) -> float:
    v = _concrete(x)
    if v is None or v.ndim:
        raise SpecError(f"plan: {x!r} must be one concrete number here")
    return float(v)


def layouts(
    kind: str,
    hardware: Hardware,
    model: Model,
    options: Options = DEFAULT_OPTIONS,
    acceptance=None,
    memory_reserve: float = 0.1,
    launchable: bool = True,
) -> list[tuple[float, float, float, float, float]]:
    """The ``(G, P, A, C, k)`` layouts a pool of ``kind`` may take, in search order.

    Layouts whose weights alone overflow HBM (``b_w N_total/(P G) > M (1 - r)``) are left out,
    and (``launchable``) those whose tensor-parallel attention, over ``G/A`` chips, no engine
    launches (``dcost.specs.attention_splits``: the degree must divide the query heads, and
    divide or be a multiple of the KV heads; llama-3-70b's 64 heads split over 64 chips of a
    72-chip domain, not 72). A pipeline's stages each take the most chips of a scale-up domain
    that its attention splits over.

    >>> import dcost
    >>> h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    >>> [x[:2] for x in layouts("decode", h, m)][:5]
    [(2.0, 1.0), (4.0, 1.0), (8.0, 1.0), (8.0, 2.0), (8.0, 4.0)]
    """
    domain = _value(hardware.scaleup_size)
    chips = options.chips
    if chips is None:
        top = options.max_chips
        chips = tuple(2**i for i in range(int(math.log2(top)) + 1))
        if domain <= top and domain not in chips:
            chips = tuple(sorted((*chips, int(domain))))
    moe = _value(model.n_experts) > 0
    attention = options.attention if moe else ("tp",)

    # attention_splits' rule on the head counts read once: a plan's three calls had read the two
    # device arrays at every degree tried, 360 reads
    heads, kv_heads = _value(model.attention_heads), _value(model.kv_heads)

    def splits(g, a):  # tensor-parallel attention over G/A chips, as an engine can launch it
        degree = float(g) if a == "tp" else 1.0
        return not launchable or bool(splits_heads(heads, kv_heads, degree, np))

    # a stage of a pipeline fills a scale-up domain: the most chips of it attention splits over
    filling = {
        a: max((g for g in chips if g <= domain and splits(g, a)), default=min(chips))
        for a in ("tp", "dp")
    }
    drafts: tuple[int, ...] = (0,)
    if kind != "prefill" and acceptance is not None and _value(model.draft_params) > 0:
        drafts = tuple(options.draft_tokens)
    chunk_options = {
        "aggregated": options.chunks,
        "prefill": options.prefill_chunks,
        "decode": (0,),
    }[kind]
    weights = _value(model.bytes_per_param) * _value(model.params_total)
    room = _value(hardware.hbm_capacity) * (1.0 - memory_reserve)
    out = []
    for g in chips:
        for p in options.stages:
            if weights / (p * g) > room:
                continue
            for a in dict.fromkeys("tp" if (x == "dp" and g == 1) else x for x in attention):
                if (p > 1 and g != filling[a]) or not splits(g, a):
                    continue
                for c in chunk_options:
                    for k in drafts:
                        out.append((float(g), float(p), 1.0 if a == "tp" else float(g), c, k))
    return [tuple(float(v) for v in x) for x in out]  # type: ignore[misc]


def _layout_size(n: int) -> int:
    """How many layout rows every kind's tables hold: the least of 128, 256, 512, ... that is
    ``>= n``. One size for every kind and most questions: the planner's programs depend on
    the shapes of their arguments alone (a model and a chip are numbers in them), so questions
    about other models, chips and traffic load the programs an earlier one compiled.

    >>> [_layout_size(n) for n in (1, 40, 64, 85, 300)]
    [128, 128, 128, 128, 512]
    """
    return max(128, 1 << (n - 1).bit_length())


def _stack(rows, size: int | None = None) -> Layout:
    """The layouts ``rows`` as one ``Layout`` of arrays, padded to ``size`` rows (default: no
    padding) with rows of ``chips = NaN``: a layout the search never opens (its bound on
    chips is not finite) and that no reason for infeasibility counts (it fits nothing)."""
    a = np.asarray(rows, dtype=float).reshape(-1, 5)
    n = len(a)
    if size is not None and size > n:
        a = np.concatenate([a, np.repeat(a[:1], size - n, axis=0)])
        a[n:, 0] = np.nan
    return Layout(*(a[:, i] for i in range(5)))


# ------------------------------------------------------------------------------ the programs


_CHUNK = 16
"""Layouts a step of the tables' loop tabulates (``_tables_one``); ``_layout_size``'s sizes are
multiples of it."""


def _tables_one(kind, hardware, model, layouts_k, stats, acceptance, imbalance):
    """Every layout's step table for each of the ``U`` workloads ``stats`` (leading axes ``(U,
    L)``), ``_CHUNK`` layouts a step of a loop: a chunk of padding rows alone (``_stack``:
    ``chips = NaN``, most rows of a padded stack) gets the table ``step_table`` gives them
    (``designs.unused_table``) without evaluating the model, so the work follows the model's
    layouts, not the padded size (40 of 128 rows for a dense model on an 8-chip domain). The
    loop is outermost, the workloads vmapped inside it (a loop under ``vmap`` would trace its
    body twice). A stack that is not a whole number of chunks is tabulated at once."""

    def each(fn, lay):  # (U, len(lay)) tables
        def one_workload(st):
            work = workload_from_stats(st, kind, acceptance, imbalance)
            return jax.vmap(lambda one: fn(one, work))(lay)

        return jax.vmap(one_workload)(stats)

    def tabulate(lay):
        return each(lambda one, work: step_table(one, hardware, model, work, kind), lay)

    def unused(lay):
        return each(lambda one, work: unused_table(one, hardware, model, work), lay)

    n = layouts_k.chips.shape[0]
    if n % _CHUNK:
        return tabulate(layouts_k)
    chunks = jax.tree.map(lambda x: x.reshape(n // _CHUNK, _CHUNK), layouts_k)

    def step(lay):
        return jax.lax.cond(jnp.all(jnp.isnan(lay.chips)), unused, tabulate, lay)

    tables = jax.lax.map(step, chunks)  # (chunks, U, _CHUNK, ...)
    return jax.tree.map(
        lambda x: jnp.moveaxis(x, 1, 0).reshape(x.shape[1], n, *x.shape[3:]), tables
    )


# the planner's programs run many evaluations a call: compiled optimized unless the process asks
# even these to compile fast (``dcost plan`` on its own, ``DCOST_FAST_COMPILE=all``: the suite;
# dcost.search._jit), which costs 0.2-0.3 s a plan and saves about 7 s of compiling
@functools.partial(jit, static_argnames=("kinds",), optimized=True)
def _tables(kinds, hardware, model, layouts_by_kind, stats, acceptance, imbalance):
    """Step tables of every kind's layouts for each of ``U`` workloads, flattened to rows
    ``u * L + l`` (``search.Tables``); ``imbalance``: the expert load the steps are timed at
    (``dcost.serving.moe.profiled_routing`` of the chip before it was filled)."""
    out = {}
    for kind in kinds:
        t = _tables_one(kind, hardware, model, layouts_by_kind[kind], stats, acceptance, imbalance)
        flat = jax.tree.map(lambda x: x.reshape((-1, *x.shape[2:])), t)
        out[kind] = S.Tables(layouts_by_kind[kind], flat)
    return out


def _search_all(kinds, tables, index, traffic, targets, hardware, model, settings, width):
    """Every kind's search of every scenario (``search.search`` over the batch, advancing
    ``width`` scenarios that still search per round): ``_search``'s function, one program
    when jitted whole (``dcost.planning.sweep`` does, as ``_search.__wrapped__``)."""
    return {
        k: S.search(
            k,
            tables[k],
            index,
            traffic,
            targets,
            hardware,
            model,
            settings,
            REPORT_QUANTILES,
            width,
        )
        for k in kinds
    }


@functools.partial(jit, static_argnames=("kind", "settings", "width"), optimized=True)
def _search_kind(kind, tables, index, traffic, targets, hardware, model, settings, width):
    """One kind's search (``_search_all`` of one kind, its tables alone)."""
    return _search_all(
        (kind,), {kind: tables}, index, traffic, targets, hardware, model, settings, width
    )[kind]


def _search(kinds, tables, index, traffic, targets, hardware, model, settings, width):
    """``_search_all``, each kind's search its own program: on an empty store the later kinds'
    programs trace and compile in a helper process while this one traces and compiles the first
    (``dcost._programs.prepare_elsewhere``: on two cores or more), else on other threads while
    the first one's compiles (XLA compiles without Python's lock:
    ``dcost._programs.during_compile``); a later process loads each one while it runs the one
    before (``dcost._programs``' successors)."""

    def args(kind):
        return (kind, tables[kind], index, traffic, targets, hardware, model, settings, width)

    first, *rest = kinds
    helper = _programs.prepare_elsewhere([_search_kind.elsewhere(*args(k)) for k in rest])
    if helper is not None:  # the later kinds' programs compile in a second process
        start = time.perf_counter()
        try:
            out = {first: _search_kind(*args(first))}
        except BaseException:
            helper.stop()
            raise
        # it does about what this process just did: much longer, and something is wrong with it
        helper.wait(
            timeout=min(_programs.HELPER_TIMEOUT, 30.0 + 4.0 * (time.perf_counter() - start))
        )
        return out | {kind: _search_kind(*args(kind)) for kind in rest}
    with contextlib.ExitStack() as stack:
        for kind in rest:
            stack.enter_context(
                _programs.during_compile(functools.partial(_search_kind.prepare, *args(kind)))
            )
        out = {first: _search_kind(*args(first))}
    for kind in rest:
        out[kind] = _search_kind(*args(kind))
    return out


_search.__wrapped__ = _search_all  # type: ignore[attr-defined]


# ------------------------------------------------------------------------------ the answer


@dataclasses.dataclass(frozen=True)
class PoolPlan:
    """One pool of a plan (SI units; $ per hour).

    Attributes:
      role: ``"aggregated"``, ``"prefill"`` or ``"decode"``.
      chips_per_stage: ``G`` (tensor parallel for a dense model, expert parallel for MoE).
      stages: ``P`` (pipeline parallel).
      attention_dp: data-parallel attention groups per stage ``A`` (1: tensor parallel).
      chunk: prefill chunk ``C`` (tokens per step; 0 for a decode pool).
      draft_tokens: speculative length ``k``.
      replicas: ``n``.
      batch_cap: most running sequences per replica: as many as HBM holds the KV cache of (at
        the traffic's mean context), which keeps the chance of waiting for a slot within
        ``slot_wait``.
      chips: ``n P G``.
      cost_per_hour: ``n P G p``.
      binding: the constraint that one replica fewer would break (``"ttft_p99"``,
        ``"tpot_p90"``, ``"memory"`` for the batch slots, ``"utilisation"`` for the prefill
        queue's headroom), or ``"one replica"`` when one replica meets every target.
      elasticity: ``d log(n*) / d log(limit)`` of the relaxed replica count at the binding
        latency limit (secant between ``n - 1`` and ``n``; 0 otherwise).
      shadow_price: ``d($/hour) / d(limit)``, $/hour per second of the binding latency target
        (negative: a looser target saves), from ``elasticity``.
      decode_batch: mean running sequences per replica; step_time: mean step (s).
      memory_per_chip: HBM bytes per chip with ``batch_cap`` sequences.
    """

    role: str
    chips_per_stage: int
    stages: int
    attention_dp: int
    chunk: int
    draft_tokens: int
    replicas: int
    batch_cap: int
    chips: int
    cost_per_hour: float
    binding: str
    elasticity: float
    shadow_price: float
    decode_batch: float
    step_time: float
    memory_per_chip: float

    @property
    def chips_per_replica(self) -> int:
        """``P G``."""
        return self.chips_per_stage * self.stages

    def describe(self) -> str:
        """``8 x (8 GPUs: TP8), cap 256, chunk 2048`` and the like."""
        par = f"EP{self.chips_per_stage}" if self.attention_dp > 1 else f"TP{self.chips_per_stage}"
        if self.attention_dp > 1:
            par += f" DP-attn{self.attention_dp}"
        if self.stages > 1:
            par += f" PP{self.stages}"
        bits = [
            f"{self.replicas} x {self.chips_per_replica} chips ({par})",
            f"cap {self.batch_cap}",
        ]
        if self.chunk:
            bits.append(f"chunk {self.chunk}")
        if self.draft_tokens:
            bits.append(f"draft {self.draft_tokens}")
        return ", ".join(bits)


@dataclasses.dataclass(frozen=True)
class Plan:
    """The cheapest fleet for one traffic (``dcost.plan``).

    Attributes:
      mode: ``"aggregated"`` or ``"disaggregated"``.
      pools: its ``PoolPlan`` s (one, or prefill then decode).
      chips: chips in all.
      cost_per_hour: $ per hour of the fleet.
      cost_per_million_input, cost_per_million_output: $ per million prompt and output tokens
        (the bill split as the module docstring says).
      ttft, tpot: predicted percentiles ``{quantile: seconds}`` (the targets' and p50/p90/p99).
      binding: the binding constraint (per pool when disaggregated), or the limit that makes
        the traffic infeasible.
      shadow_price: $/hour per second of the binding latency target (summed over pools).
      feasible: whether any fleet meets the targets; message: why not.
      alternative: the other mode's plan when ``mode="best"`` compared both (else None).
      evaluations: closed-form evaluations the search made.
      hardware, model, traffic, ttft_slo, tpot_slo: the question (for ``dcost.simulate``).
    """

    mode: str
    pools: tuple[PoolPlan, ...]
    chips: int
    cost_per_hour: float
    cost_per_million_input: float
    cost_per_million_output: float
    ttft: dict
    tpot: dict
    binding: str | None
    shadow_price: float
    feasible: bool
    message: str
    alternative: Plan | None
    evaluations: int
    hardware: Hardware = dataclasses.field(repr=False)
    model: Model = dataclasses.field(repr=False)
    traffic: Traffic = dataclasses.field(repr=False)
    ttft_slo: tuple[float, float] = dataclasses.field(repr=False)
    tpot_slo: tuple[float, float] = dataclasses.field(repr=False)
    acceptance: float | None = dataclasses.field(repr=False, default=None)
    memory_reserve: float = dataclasses.field(repr=False, default=0.1)
    slot_wait: float = dataclasses.field(repr=False, default=1e-3)
    max_utilisation: float | None = dataclasses.field(repr=False, default=None)

    @property
    def expert_imbalance(self) -> float:
        """The expert load its steps are timed at: the expected maximum under multinomial
        routing for a mixture of experts on a profiled chip, balanced on pure physics or for a
        dense model (``dcost.serving.moe.profiled_routing``)."""
        return profiled_routing(not self.hardware.pure, self.model)

    def __str__(self) -> str:
        if not self.feasible:
            return f"Plan(infeasible: {self.message})"
        pools = "; ".join(f"{p.role}: {p.describe()}" for p in self.pools)
        return (
            f"Plan({self.mode}: {pools}; {self.chips} chips, ${self.cost_per_hour:,.2f}/h; "
            f"binding {self.binding})"
        )


@dataclasses.dataclass(frozen=True)
class PlanBatch:
    """Plans for many traffic scenarios (``dcost.plan`` with a batched ``Traffic``).

    ``batch[i]`` is scenario ``i``'s ``Plan``; the arrays below line up with the scenarios.

    Attributes:
      plans: the ``Plan`` s.
      mode: modes (strings); chips, cost_per_hour, cost_per_million_input,
        cost_per_million_output: arrays; feasible: booleans.
    """

    plans: tuple[Plan, ...]

    def __len__(self) -> int:
        return len(self.plans)

    def __getitem__(self, i) -> Plan:
        return self.plans[i]

    def __iter__(self):
        return iter(self.plans)

    def _array(self, name, dtype=float):
        return np.asarray([getattr(p, name) for p in self.plans], dtype=dtype)

    @property
    def mode(self) -> np.ndarray:
        return self._array("mode", dtype=object)

    @property
    def chips(self) -> np.ndarray:
        return self._array("chips")

    @property
    def cost_per_hour(self) -> np.ndarray:
        return self._array("cost_per_hour")

    @property
    def cost_per_million_input(self) -> np.ndarray:
        return self._array("cost_per_million_input")

    @property
    def cost_per_million_output(self) -> np.ndarray:
        return self._array("cost_per_million_output")

    @property
    def feasible(self) -> np.ndarray:
        return self._array("feasible", dtype=bool)


# ------------------------------------------------------------------------------ the API


def _rho(max_utilisation) -> dict:
    if max_utilisation is None:
        return dict(S.MAX_UTILISATION)
    return {k: float(max_utilisation) for k in S.MAX_UTILISATION}


def _check_question(
    owner,
    traffic,
    mode,
    ttft_slo,
    tpot_slo,
    acceptance,
    memory_reserve,
    slot_wait,
    max_utilisation,
    options,
) -> tuple[tuple[float, float], tuple[float, float]]:
    """The checks of a planning question, shared by ``plan`` and ``plan_grid``: SpecError naming
    the argument, its value and what is allowed; returns the two targets as ``(s, q)`` pairs."""
    if not isinstance(traffic, Traffic):
        raise SpecError(f"{owner}.traffic must be a dcost.Traffic, got {type(traffic).__name__}")
    if not isinstance(mode, str) or mode not in MODES:
        raise SpecError(f"{owner}.mode = {mode!r} is not allowed: choose from {', '.join(MODES)}")
    slos = _slo("ttft_slo", ttft_slo, owner), _slo("tpot_slo", tpot_slo, owner)
    for name, value in (
        ("memory_reserve", memory_reserve),
        ("slot_wait", slot_wait),
        ("max_utilisation", max_utilisation),
        ("acceptance", acceptance),
    ):
        if value is not None and not isinstance(value, str) and np.ndim(value) != 0:
            raise SpecError(
                f"{owner}.{name} = {value!r} is not allowed: it must be one number (a plan "
                "answers one question; traffic fields take arrays of scenarios)"
            )
    check(owner, "memory_reserve", memory_reserve, high=0.999)
    check(owner, "slot_wait", slot_wait, low_open=True, high=0.5)
    if max_utilisation is not None:
        check(owner, "max_utilisation", max_utilisation, low_open=True, high=0.99)
    if acceptance is not None:
        check(owner, "acceptance", acceptance, high=0.999)
    check_options(owner, options)
    return slos


def _slo(name: str, slo, owner: str = "plan") -> tuple[float, float]:
    try:
        limit, q = slo
    except (TypeError, ValueError):
        raise SpecError(
            f"{owner}.{name} = {slo!r} is not allowed: it must be a pair (seconds, percentile), "
            "e.g. (2.0, 0.99)"
        ) from None
    check(owner, f"{name}[0]", limit, low_open=True)
    check(owner, f"{name}[1]", q, low=0.5, high=0.999)
    return limit, float(q)


def _specs(hardware, model):
    if isinstance(hardware, str) and isinstance(model, str):
        return serving_hardware(hardware, model), model_preset(model)
    if isinstance(model, str):
        model = model_preset(model)
    if isinstance(hardware, str):
        raise SpecError(
            "plan.hardware: give a dcost.Hardware, or preset names for both hardware and model "
            "(the chip's FLOP/s then match the model's serving precision)"
        )
    if not isinstance(hardware, Hardware):
        raise SpecError(f"plan.hardware must be a dcost.Hardware, got {type(hardware).__name__}")
    if not isinstance(model, Model):
        raise SpecError(f"plan.model must be a dcost.Model, got {type(model).__name__}")
    return hardware, model


def _scenarios(traffic: Traffic) -> int | None:
    shapes = {np.shape(x) for x in jax.tree.leaves(traffic) if x is not None}
    shapes.discard(())
    if traffic.prompt_sample is not None:
        raise SpecError(
            "plan.traffic: an empirical sample (Traffic.from_sample) is planned by its means "
            "and cvs; build Traffic(rate, prompt_tokens, output_tokens, prompt_cv=..., "
            "output_cv=...) from them"
        )
    if not shapes:
        return None
    if len(shapes) > 1 or len(next(iter(shapes))) != 1:
        raise SpecError(
            f"plan.traffic: fields must be numbers or arrays of one shape (n,), got {shapes}"
        )
    return next(iter(shapes))[0]


def plan(
    hardware,
    model,
    traffic: Traffic,
    ttft_slo=(2.0, 0.99),
    tpot_slo=(0.05, 0.90),
    mode: str = "best",
    *,
    acceptance=None,
    memory_reserve: float = 0.1,
    slot_wait: float = 1e-3,
    max_utilisation: float | None = None,
    options: Options = DEFAULT_OPTIONS,
    settings: S.Settings = S.DEFAULT,
    engine=None,
    confidence: float | None = None,
):
    """The cheapest fleet that serves ``traffic`` within the latency targets.

    Minimizes $/hour over the mode, each pool's layout and its whole number of replicas, subject
    to stable queues, ``TTFT_q <= ttft_slo`` and ``TPOT_q <= tpot_slo`` at their percentiles
    (the closed forms of ``dcost.planning.latency``, step times from the serving model) and the
    batch slots' KV fitting in HBM (see ``dcost.planning.search``).

    Args:
      hardware: a ``dcost.Hardware`` (e.g. ``dcost.hardware("h100-sxm", calibrated=True)``), or
        a preset name when ``model`` is one too.
      model: a ``dcost.Model`` or a preset name.
      traffic: a ``dcost.Traffic``; fields with a leading axis ``(n,)`` are ``n`` scenarios,
        planned in one vmapped call (a ``PlanBatch`` is returned).
      ttft_slo: ``(seconds, percentile)`` of time to first token, percentile in [0.5, 0.999].
      tpot_slo: ``(seconds, percentile)`` of a request's mean time per output token.
      mode: ``"aggregated"``, ``"disaggregated"`` or ``"best"`` (the cheaper; aggregated on a
        tie).
      acceptance: draft-token acceptance rate for speculative layouts (models with a draft,
        e.g. DeepSeek-V3's MTP module); None: no speculation.
      memory_reserve: share of HBM kept free.
      slot_wait: most probability that an arrival waits for a batch slot.
      max_utilisation: most busy share of a prefill queue (headroom); None: 0.85 for an
        aggregated pool, 0.6 for a disaggregated prefill pool
        (``dcost.planning.search.MAX_UTILISATION``: where the closed forms match the
        simulation).
      options: the layouts to choose from (``Options``).
      settings: search knobs (``dcost.planning.search.Settings``).
      engine: a ``dcost.Engine`` (or, with ``hardware`` a preset name, an engine name such as
        "vllm"): step times from that engine's profile on the chip (``Engine.apply``); None: the
        chip as given.
      confidence: with an engine, plan so that its targets hold with this probability under
        the model's own error (0.5, 0.75, 0.9 or 0.95): step times slowed by the engine's
        held-out error at that quantile (``dcost.engines.confidence_factor``: a calibrated
        engine's error on its own deployment, a shipped one's on a new model;
        ``dcost.engines.slower``); None: the model's prediction as it is. Compare the chips of a
        plan with and without it for what the confidence costs.

    Returns:
      A ``Plan`` (or ``PlanBatch``): ``.mode .pools .chips .cost_per_hour
      .cost_per_million_input .cost_per_million_output .ttft .tpot .binding .shadow_price``;
      ``.feasible`` False with ``.message`` naming the binding limit when nothing meets the
      targets.

    >>> import dcost
    >>> h100 = dcost.hardware("h100-sxm", calibrated=True)
    >>> p = dcost.plan(h100, "llama-3-70b", dcost.traffic("chat", rate=100.0))
    >>> p.feasible, p.ttft[0.99] <= 2.0, p.tpot[0.9] <= 0.05, p.alternative.mode != p.mode
    (True, True, True, True)
    >>> p.cost_per_hour == p.chips * float(h100.price_per_hour)
    True
    """
    prepared = _prepare(
        hardware,
        model,
        traffic,
        ttft_slo,
        tpot_slo,
        mode,
        acceptance=acceptance,
        memory_reserve=memory_reserve,
        slot_wait=slot_wait,
        max_utilisation=max_utilisation,
        options=options,
        settings=settings,
        engine=engine,
        confidence=confidence,
    )
    if prepared.plans is not None:
        return _answer(prepared, None)
    found = _search(*prepared.search_arguments(), min(prepared.size, WIDTH))
    return _answer(prepared, found)


@_small_jit
def _workload_stats(traffic):
    """``workload_stats`` of each scenario: one small program (op by op, its two dozen
    operations cost a warm ``dcost plan`` about a second of dispatching)."""
    return jax.vmap(workload_stats)(traffic)


class Prepared(NamedTuple):
    """A planning question made ready for its search: ``plan`` is ``_prepare``, the search
    (``_search(*prepared.search_arguments(), width)``) and ``_answer``; ``dcost.planning.sweep``
    runs the same search with its scenarios sharded over devices and processes.

    Attributes:
      n: scenarios asked (None: one, unbatched); batch: ``n`` or 1; size: the padded batch.
      modes, rows, traffic_b, question: what ``_assemble`` reads (``traffic_b``: the traffic
        with every field of shape ``(batch,)``).
      kinds, tables, mix, traffic, targets, hardware, model, settings: the search's arguments
        (``mix``: each scenario's row of the tables' length mixes; ``mix``, ``traffic`` and
        ``targets`` with a leading axis ``size``).
      plans: the answers when no search is needed (no layout fits), else None.
    """

    n: int | None
    batch: int
    size: int
    modes: tuple
    rows: dict
    traffic_b: Traffic
    question: dict
    kinds: tuple
    tables: dict
    mix: jax.Array | None
    traffic: Traffic | None
    targets: S.Targets
    hardware: Hardware
    model: Model
    settings: S.Settings
    plans: tuple | None

    def search_arguments(self) -> tuple[Any, Any, Any, Any, Any, Any, Any, Any]:
        """``_search``'s arguments but ``width``."""
        return (
            self.kinds,
            self.tables,
            self.mix,
            self.traffic,
            self.targets,
            self.hardware,
            self.model,
            self.settings,
        )


def _prepare(
    hardware,
    model,
    traffic,
    ttft_slo,
    tpot_slo,
    mode,
    *,
    acceptance,
    memory_reserve,
    slot_wait,
    max_utilisation,
    options,
    settings,
    engine,
    confidence,
) -> Prepared:
    """``plan``'s checks, layouts, step tables and padded scenarios (``Prepared``)."""
    chip_name = hardware if isinstance(hardware, str) else None
    hardware, model = _specs(hardware, model)
    eng = resolve_engine(engine, chip_name)
    hardware = on_engine(eng, hardware, model)
    if confidence is not None:
        from dcost.engines import EngineError, confidence_factor, slower

        if eng is None:
            raise EngineError(
                f"plan: confidence = {confidence!r} needs an engine (its held-out error says how "
                "far off a step time can be): pass engine=..."
            )
        hardware = slower(hardware, confidence_factor(eng, confidence))
    ttft_slo, tpot_slo = _check_question(
        "plan",
        traffic,
        mode,
        ttft_slo,
        tpot_slo,
        acceptance,
        memory_reserve,
        slot_wait,
        max_utilisation,
        options,
    )
    rho = _rho(max_utilisation)
    n = _scenarios(traffic)
    modes = ("aggregated", "disaggregated") if mode == "best" else (mode,)
    kinds = tuple(k for k in S.KINDS if any(k in _ROLES[m] for m in modes))
    rows = {
        k: layouts(k, hardware, model, options, acceptance, float(memory_reserve)) for k in S.KINDS
    }
    empty = [k for k in kinds if not rows[k]]
    batch = 1 if n is None else n
    traffic_b = jax.tree.map(lambda x: np.broadcast_to(np.asarray(x), (batch,)), traffic)
    # the program's scenarios: a batch padded to a bucket (repeating its last scenario), so
    # that batches of 2 to 16 scenarios share one compilation, 17 to 32 the next
    size = 1 if n is None else bucket(n)
    dtype = jnp.result_type(float)
    targets = S.Targets(
        jnp.full((size,), ttft_slo[0], dtype),
        jnp.full((size,), tpot_slo[0], dtype),
        jnp.full((size,), float(memory_reserve), dtype),
        jnp.full((size,), float(slot_wait), dtype),
        jnp.full((size,), rho["aggregated"], dtype),
        jnp.full((size,), rho["prefill"], dtype),
        ttft_slo[1],
        tpot_slo[1],
    )
    question = dict(
        hardware=hardware,
        model=model,
        ttft_slo=ttft_slo,
        tpot_slo=tpot_slo,
        acceptance=acceptance,
        memory_reserve=float(memory_reserve),
        slot_wait=float(slot_wait),
        max_utilisation=None if max_utilisation is None else float(max_utilisation),
    )
    if empty:
        # the weights fit some layout, but no engine could launch it: say so, not "memory"
        heads = any(
            layouts(k, hardware, model, options, acceptance, float(memory_reserve), False)
            for k in empty
        )
        plans = [
            _no_fit(modes, hardware, model, traffic_at(traffic_b, i), question, options, heads)
            for i in range(batch)
        ]
        return Prepared(
            n,
            batch,
            size,
            modes,
            rows,
            traffic_b,
            question,
            (),
            {},
            None,
            None,
            targets,
            hardware,
            model,
            settings,
            tuple(plans),
        )
    traffic_p = jax.tree.map(lambda x: jnp.asarray(x, dtype), pad(traffic_b, batch, size))
    stats = np.asarray(_workload_stats(traffic_p))
    unique, index = np.unique(stats, axis=0, return_inverse=True)
    # distinct length mixes padded too (step tables are per mix, a few ms each): 1 to 8 mixes
    # share the program of 8, then powers of two
    mixes = len(unique) if n is None else bucket(len(unique), 8)
    unique = pad(unique, len(unique), mixes)
    # every kind that has layouts is searched, whatever the mode: one program for all modes
    searched = tuple(k for k in S.KINDS if rows[k])
    size = _layout_size(max(len(rows[k]) for k in searched))
    layouts_by_kind = {k: _stack(rows[k], size) for k in searched}
    acc = None if acceptance is None else jnp.asarray(acceptance, dtype)
    # the programs take the chip filled (``Hardware.filled``): one structure for pure physics,
    # family and engine profiles, so that each loads the programs another compiled (pure
    # physics too, unlike the searches' ``shared_form``: its programs compile as long filled)
    chip = hardware.filled()
    imbalance = jnp.asarray(profiled_routing(not hardware.pure, model), dtype)  # before filling
    tables = _tables(searched, chip, model, layouts_by_kind, jnp.asarray(unique), acc, imbalance)
    settings = settings if settings.group else settings._replace(group=1)
    return Prepared(
        n,
        batch,
        size,
        modes,
        rows,
        traffic_b,
        question,
        searched,
        tables,
        jnp.asarray(index.reshape(-1), jnp.int32),
        traffic_p,
        targets,
        chip,
        model,
        settings,
        None,
    )


def _answer(prepared: Prepared, found):
    """The ``Plan`` (or ``PlanBatch``) from a search's results (``found``: per kind, fields with
    a leading axis of at least ``prepared.batch``) or from ``prepared.plans``."""
    if prepared.plans is not None:
        plans = list(prepared.plans)
    else:
        batch = prepared.batch
        found = jax.tree.map(lambda x: np.asarray(x)[:batch], jax.device_get(found))
        plans = [
            _assemble(
                prepared.modes,
                prepared.rows,
                found,
                i,
                traffic_at(prepared.traffic_b, i),
                prepared.question,
            )
            for i in range(batch)
        ]
    return plans[0] if prepared.n is None else PlanBatch(tuple(plans))


def traffic_at(traffic: Traffic, i: int) -> Traffic:
    """Scenario ``i`` of a batched traffic (NumPy scalars)."""
    return jax.tree.map(lambda x: np.asarray(x)[i], traffic)


def _label(constraint: str, question) -> str:
    if constraint == "ttft":
        return f"ttft_p{_pct(question['ttft_slo'][1])}"
    if constraint == "tpot":
        return f"tpot_p{_pct(question['tpot_slo'][1])}"
    return constraint


def _pct(q: float) -> str:
    return f"{q * 100:g}"


def _binding(at, below, reason, n):
    """The constraint one replica fewer breaks (``below``, the log-ratios at ``n - 1``): the one
    broken most, except that a queue that overflows (an unbounded latency) is the
    utilisation's doing; where the search never tried ``n - 1`` (its lower bound was tight),
    the necessary condition that set the bound (``reason``); ``"one replica"`` when a single
    replica meets every target (nothing binds its count)."""
    if n <= 1:
        return "one replica"
    if not np.all(np.isfinite(below)):
        return S.CONSTRAINTS[reason] if reason >= 0 else "one replica"
    u = S.CONSTRAINTS.index("utilisation")
    if below.max() >= S._BIG - 1.0 and below[u] > 0:
        return "utilisation"
    return S.CONSTRAINTS[int(np.argmax(below))]


def _pool(kind, rows, found, i, price, question) -> PoolPlan:
    f = jax.tree.map(lambda x: np.asarray(x)[i], found[kind])
    row = int(f.row)
    g, p, a, c, k = rows[kind][row]
    n = int(round(float(f.replicas)))
    chips = int(n * p * g)
    cost = chips * price
    at, below = np.asarray(f.ratios), np.asarray(f.ratios_below)
    binding = _binding(at, below, int(f.bounds.reason[row]), n)
    elasticity = shadow = 0.0
    if binding in ("ttft", "tpot") and n > 1 and np.all(np.isfinite(below)):
        j = S.CONSTRAINTS.index(binding)
        slope = (at[j] - below[j]) / math.log(n / (n - 1))
        if slope < 0:
            elasticity = float(1.0 / slope)
            limit = question["ttft_slo" if binding == "ttft" else "tpot_slo"][0]
            shadow = float(elasticity * cost / float(limit))
    info = f.info
    return PoolPlan(
        role=kind,
        chips_per_stage=int(g),
        stages=int(p),
        attention_dp=int(a),
        chunk=int(c),
        draft_tokens=int(k),
        replicas=n,
        batch_cap=int(info["capacity"]),
        chips=chips,
        cost_per_hour=float(cost),
        binding=_label(binding, question),
        elasticity=elasticity,
        shadow_price=shadow,
        decode_batch=float(info["batch"]),
        step_time=float(info["step_time"]),
        memory_per_chip=float(info["memory"]),
    )


def _percentiles(values, target_q) -> dict:
    qs = (target_q, *REPORT_QUANTILES)
    return {q: float(v) for q, v in sorted(zip(qs, np.asarray(values).tolist(), strict=True))}


def _assemble(modes, rows, found, i, traffic, question) -> Plan:
    price = float(question["hardware"].price_per_hour)
    rate = float(traffic.rate)
    candidates = []
    for m in modes:
        roles = _ROLES[m]
        ok = all(int(found[k].row[i]) >= 0 for k in roles)
        evaluations = int(sum(float(found[k].evaluations[i]) for k in roles))
        if not ok:
            candidates.append(_infeasible(m, rows, found, i, traffic, question, evaluations))
            continue
        pools = tuple(_pool(k, rows, found, i, price, question) for k in roles)
        cost = sum(p.cost_per_hour for p in pools)
        q_ttft, q_tpot = question["ttft_slo"][1], question["tpot_slo"][1]
        ttft_src = "aggregated" if m == "aggregated" else "prefill"
        tpot_src = "aggregated" if m == "aggregated" else "decode"
        ttft = _percentiles(found[ttft_src].info["ttft"][i], q_ttft)
        tpot = _percentiles(found[tpot_src].info["tpot"][i], q_tpot)
        if m == "aggregated":
            share_in = float(found["aggregated"].info["input_share"][i])
            cost_in, cost_out = cost * share_in, cost * (1.0 - share_in)
        else:
            cost_in, cost_out = pools[0].cost_per_hour, pools[1].cost_per_hour
        per_hour_in = rate * float(traffic.prompt_tokens) * 3600.0 / 1e6
        per_hour_out = rate * float(traffic.output_tokens) * 3600.0 / 1e6
        if m == "aggregated":
            binding = pools[0].binding
        else:
            binding = ", ".join(f"{p.binding} ({p.role})" for p in pools)
        exhausted = any(bool(found[k].exhausted[i]) for k in roles)
        message = (
            "the search stopped at its round limit (Settings.max_rounds) before it could prove "
            "this the cheapest; raise it"
            if exhausted
            else ""
        )
        candidates.append(
            Plan(
                mode=m,
                pools=pools,
                chips=sum(p.chips for p in pools),
                cost_per_hour=float(cost),
                cost_per_million_input=cost_in / per_hour_in,
                cost_per_million_output=cost_out / per_hour_out,
                ttft=ttft,
                tpot=tpot,
                binding=binding,
                shadow_price=float(sum(p.shadow_price for p in pools)),
                feasible=True,
                message=message,
                alternative=None,
                evaluations=evaluations,
                traffic=traffic,
                **question,
            )
        )
    best = min(
        range(len(candidates)),
        key=lambda j: (not candidates[j].feasible, candidates[j].cost_per_hour, j),
    )
    chosen = candidates[best]
    if len(candidates) > 1:
        other = candidates[1 - best]
        if not chosen.feasible:  # both infeasible: name the aggregated pool's limit first
            chosen = dataclasses.replace(candidates[0], alternative=candidates[1])
        else:
            chosen = dataclasses.replace(chosen, alternative=other)
    return chosen


def _infeasible(m, rows, found, i, traffic, question, evaluations) -> Plan:
    reasons = []
    for kind in _ROLES[m]:
        if int(found[kind].row[i]) >= 0:
            continue  # this pool has a fleet; the other one cannot
        b = jax.tree.map(lambda x: np.asarray(x)[i], found[kind].bounds)
        reasons.append(_why(kind, b, question))
    label, text = next((x for x in reasons if x[0]), reasons[0])
    return _empty(m, traffic, question, label, text, evaluations)


def _why(kind, b, question) -> tuple[str, str]:
    """The limit that rules out every layout of a pool kind (``b``: their ``Bounds``), and a
    sentence saying so."""
    fits = np.asarray(b.fits)
    who = "" if kind == "aggregated" else f" ({kind} pool)"
    if not fits.any():
        return "memory", f"memory{who}: no layout leaves HBM room for a sequence's KV cache"
    q_ttft = question["ttft_slo"][1]
    ttft_floor = np.where(fits, np.asarray(b.ttft_floor), np.inf)
    if kind != "decode" and np.all(ttft_floor > 1.0 - q_ttft):
        share = float(np.min(ttft_floor))
        return _label("ttft", question), (
            f"{_label('ttft', question)}{who}: even an idle fleet misses "
            f"{question['ttft_slo'][0]:g} s for {share:.1%} of requests (the prompt's own "
            f"prefill{' and KV transfer' if kind == 'prefill' else ''}), more than the "
            f"{1.0 - q_ttft:.1%} allowed"
        )
    tpot_floor = np.where(fits, np.asarray(b.tpot_floor), np.inf)
    if kind != "prefill" and np.all(tpot_floor > question["tpot_slo"][0]):
        return _label("tpot", question), (
            f"{_label('tpot', question)}{who}: the fastest layout's step at batch 1 takes "
            f"{float(np.min(tpot_floor)) * 1e3:.3g} ms, over the "
            f"{question['tpot_slo'][0] * 1e3:g} ms target"
        )
    ok = np.asarray(b.ok)
    need = np.where(ok, np.asarray(b.replicas), np.inf)
    if ok.any() and np.min(need) > S.N_MAX:
        i = int(np.argmin(need))
        reason = int(np.asarray(b.reason)[i])
        label = _label(S.CONSTRAINTS[reason], question) if reason >= 0 else "replicas"
        return label, (
            f"{label}{who}: every layout needs more replicas than the {int(S.N_MAX):,} the "
            f"search tries (at least {float(need[i]):,.0f}); plan a share of the traffic "
            "(its rate divided by k) and multiply the fleet by k"
        )
    label = _label("tpot" if kind != "prefill" else "ttft", question)
    return label, (
        f"{label}{who}: no layout meets the latency targets at any replica count up to "
        f"{int(S.N_MAX):,} (the percentiles stay above them as the load per replica vanishes)"
    )


def _empty(m, traffic, question, label, text, evaluations) -> Plan:
    nan = float("nan")
    return Plan(
        mode=m,
        pools=(),
        chips=0,
        cost_per_hour=nan,
        cost_per_million_input=nan,
        cost_per_million_output=nan,
        ttft={},
        tpot={},
        binding=label,
        shadow_price=nan,
        feasible=False,
        message=text,
        alternative=None,
        evaluations=evaluations,
        traffic=traffic,
        **question,
    )


def _no_fit(modes, hardware, model, traffic, question, options, heads=False) -> Plan:
    """The plan of a question no layout can serve: the weights fit none, or (``heads``) those
    they fit split the model's attention over a number of chips no engine launches."""
    if heads:
        kv = float(np.asarray(model.kv_heads))
        text = (
            f"layout: no layout tried splits the model's attention heads "
            f"({float(np.asarray(model.attention_heads)):g} query heads, {kv:g} KV heads) over "
            f"its tensor-parallel chips (Options.chips = {options.chips!r}): an engine needs the "
            "degree to divide the query heads, and to divide or be a multiple of the KV heads"
        )
        return _empty(modes[0], traffic, question, "layout", text, 0)
    need = float(model.bytes_per_param) * float(model.params_total) / 1e9
    text = (
        f"memory: the weights ({need:,.0f} GB) do not fit in HBM in any layout tried "
        "(raise Options.max_chips or stages)"
    )
    return _empty(modes[0], traffic, question, "memory", text, 0)


# ------------------------------------------------------------------------------ ground truth


# every layout at every replica count: a vectorized sweep, compiled optimized unless the process
# asks even these to compile fast (XLA's level 0 runs it about five times more slowly at n_max 64
# on large tables; the suite's small grids compile in less than that costs; dcost.search._jit)
@functools.partial(jit, static_argnames=("kind", "n_max"), optimized=True)
def _grid_one(kind, tables, traffic, targets, hardware, model, n_max):
    return S.grid(kind, tables, 0, traffic, targets, hardware, model, n_max)


def plan_grid(
    hardware,
    model,
    traffic: Traffic,
    ttft_slo=(2.0, 0.99),
    tpot_slo=(0.05, 0.90),
    mode: str = "best",
    *,
    n_max: int = 64,
    acceptance=None,
    memory_reserve: float = 0.1,
    slot_wait: float = 1e-3,
    max_utilisation: float | None = None,
    options: Options = DEFAULT_OPTIONS,
) -> dict:
    """Exhaustive ground truth: every layout at every replica count ``1..n_max``, exact.

    Returns ``{mode: (chips, pools)}`` for the modes asked (``"best"``: both), where ``pools``
    lists ``(role, layout (G, P, A, C, k), replicas)`` of the cheapest feasible fleet (ties to
    the first layout), or ``(inf, None)`` when none is feasible within ``n_max``.

    >>> import dcost
    >>> from dcost.planning import plan_grid
    >>> h100 = dcost.hardware("h100-sxm", calibrated=True)
    >>> traffic = dcost.traffic("chat", rate=100.0)
    >>> g = plan_grid(h100, "llama-3-70b", traffic, mode="aggregated", n_max=64)
    >>> p = dcost.plan(h100, "llama-3-70b", traffic)
    >>> g["aggregated"][0] == (p if p.mode == "aggregated" else p.alternative).chips
    True
    """
    hardware, model = _specs(hardware, model)
    ttft_slo, tpot_slo = _check_question(
        "plan_grid",
        traffic,
        mode,
        ttft_slo,
        tpot_slo,
        acceptance,
        memory_reserve,
        slot_wait,
        max_utilisation,
        options,
    )
    _whole("plan_grid.n_max", n_max, 1.0)
    if _scenarios(traffic) is not None:
        raise SpecError("plan_grid takes one traffic scenario")
    modes = ("aggregated", "disaggregated") if mode == "best" else (mode,)
    targets = S.Targets(
        jnp.asarray(ttft_slo[0], jnp.result_type(float)),
        jnp.asarray(tpot_slo[0], jnp.result_type(float)),
        jnp.asarray(float(memory_reserve)),
        jnp.asarray(float(slot_wait)),
        jnp.asarray(_rho(max_utilisation)["aggregated"]),
        jnp.asarray(_rho(max_utilisation)["prefill"]),
        ttft_slo[1],
        tpot_slo[1],
    )
    acc = None if acceptance is None else jnp.asarray(acceptance, jnp.result_type(float))
    kinds = tuple(k for k in S.KINDS if any(k in _ROLES[m] for m in modes))
    rows = {
        k: layouts(k, hardware, model, options, acceptance, float(memory_reserve)) for k in kinds
    }
    best: dict = {}
    per_kind: dict[str, tuple] = {k: (math.inf, None) for k in kinds if not rows[k]}
    built = [k for k in kinds if rows[k]]
    chip = hardware.filled()  # as ``plan``'s programs take it
    imbalance = jnp.asarray(profiled_routing(not hardware.pure, model), jnp.result_type(float))
    if built:  # the tables of every kind at once: the program ``plan`` compiled for this mode
        stats = jnp.asarray(np.asarray(workload_stats(traffic))[None])
        layouts_k = {k: _stack(rows[k]) for k in built}
        tabs = _tables(tuple(built), chip, model, layouts_k, stats, acc, imbalance)
    for kind in built:
        feasible, chips = _grid_one(kind, tabs[kind], traffic, targets, chip, model, n_max)
        feasible, chips = np.asarray(feasible), np.asarray(chips)
        cost = np.where(feasible, chips, np.inf)
        # the least chips; ties to the first layout (row-major: layouts, then replicas)
        flat = int(np.argmin(cost.reshape(-1)))
        l, n = divmod(flat, n_max)
        per_kind[kind] = (
            (float(cost[l, n]), (kind, rows[kind][l], n + 1))
            if np.isfinite(cost[l, n])
            else (math.inf, None)
        )
    for m in modes:
        parts = [per_kind[k] for k in _ROLES[m]]
        total = sum(p[0] for p in parts)
        best[m] = (total, [p[1] for p in parts] if np.isfinite(total) else None)
    return best
