"""A search problem: an objective, the free design variables with their bounds, and constraints.

Every constraint bounds a quantity of the design by a limit, ``value <= limit``:

    tpot           time per output token              <= tpot_slo           (s)
    ttft           time of the prefill pass           <= ttft_slo           (s)
    memory         HBM bytes per chip                 <= M*(1 - memory_reserve)
    replica_chips  chips per replica P*G              <= chip_budget
    loss           pretraining loss (lifetime_cost)   <= loss_target        (nats)

The limits travel together as one ``Limits`` pytree; a limit of None turns its constraint off.
The optimizer works on ``log(value/limit) <= 0``, every constraint scaled to its own budget.
Numeric leaves (hardware, model, workload, fixed design, limits) may carry one leading batch axis:
the problem is then that many scenarios, solved in one vmapped call. The objective (a
``dcost.search.objectives.Objective`` value) and the free variables with their bounds are static
(they fix the shape of the search) and shared by every scenario.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost.engines import on_engine
from dcost.search.objectives import Objective, resolve
from dcost.smooth import safe_log
from dcost.specs import (
    Design,
    Hardware,
    Model,
    SpecError,
    Workload,
    _concrete,
    _float,
    check,
    check_groups,
    check_speculation,
    shared_form,
    splits_heads,
    whole_max,
)

__all__ = [
    "Problem",
    "Limits",
    "Evaluation",
    "evaluate",
    "better",
    "VARIABLES",
    "LAYOUT_VARIABLES",
    "ZERO_OFF",
    "CONSTRAINTS",
    "admissible",
    "repair",
    "to_search",
    "from_search",
    "FEASIBILITY_RTOL",
]

VARIABLES = (
    "batch",
    "chips",
    "stages",
    "experts",
    "overtrain",
    "attention_dp",
    "dispatch_dedup",
    "redundant_experts",
    "draft_tokens",
    "prefill_chunk",
)
"""Free variables, in the order of a design vector: ``chips`` is chips per pipeline stage ``G``
(``Design.chips``); the last five are serving model v2's layout fields (``LAYOUT_VARIABLES``)."""
LAYOUT_VARIABLES = VARIABLES[5:]
"""Serving model v2's fields of ``dcost.Design`` (``docs/serving_v2.md``, "What the optimizer may
free"): data-parallel attention groups ``A`` (must divide ``G``), de-duplicated dispatch (0 or 1),
redundant experts ``R``, draft tokens ``k_d`` and the prefill chunk ``C``."""
ZERO_OFF = ("dispatch_dedup", "redundant_experts", "draft_tokens")
"""Variables whose 0 means "off" (and is a valid bound): the search relaxes them in
``log(1 + x)`` rather than ``log x``, so that 0 sits at the edge of the log-space box like 1 does
for the others (a shift by a whole number keeps whole numbers whole)."""
CONSTRAINTS = ("tpot", "ttft", "memory", "replica_chips", "loss")
FEASIBILITY_RTOL = 1e-6
"""A design is feasible when ``value <= limit*(1 - FEASIBILITY_RTOL)`` for every constraint on a
computed quantity: the margin absorbs float32 rounding, so that re-evaluating a returned design
outside jit (or in another fusion) never finds it over a limit. Counts (``replica_chips``) are
compared exactly."""
EXACT = ("replica_chips",)
"""Constraints on whole-number counts, compared without the margin."""

SEARCH_RTOL = 4 * FEASIBILITY_RTOL
"""The stricter margin the searches (grid, integer polish) judge candidates by, so that the final
exact re-check (``FEASIBILITY_RTOL``), whose float32 rounding may differ by an ulp from the
vectorized search's, confirms every design the search picked as feasible."""

_DEFAULT_FREE = {"batch": (1, 4096), "chips": (1, 72), "stages": (1, 8)}
_DEFAULT = object()
_DEFAULT_TPOT_SLO = 0.05
_LIMIT_OF = {
    "tpot": "tpot_slo",
    "ttft": "ttft_slo",
    "memory": "memory_reserve",
    "replica_chips": "chip_budget",
    "loss": "loss_target",
}


class Limits(eqx.Module):
    """The limits of a problem's constraints (SI units); None turns a constraint off. Leaves may
    carry the problem's leading batch axis.

    Args:
      tpot_slo: time per output token limit (s), > 0.
      ttft_slo: time of the prefill pass limit (s), > 0.
      memory_reserve: fraction of HBM kept free (activations, fragmentation), in [0, 0.999].
      chip_budget: most chips per replica ``P*G`` (the ``replica_chips`` constraint), >= 1.
      loss_target: most pretraining loss (nats), > 0, for ``lifetime_cost``.

    >>> import dcost
    >>> lim = dcost.Limits(tpot_slo=0.03, chip_budget=16)
    >>> round(float(lim.tpot_slo), 6), round(float(lim.memory_reserve), 6), lim.ttft_slo
    (0.03, 0.1, None)
    """

    tpot_slo: jax.Array | None
    ttft_slo: jax.Array | None
    memory_reserve: jax.Array | None
    chip_budget: jax.Array | None
    loss_target: jax.Array | None

    def __init__(
        self,
        tpot_slo=None,
        ttft_slo=None,
        memory_reserve=0.1,
        chip_budget=None,
        loss_target=None,
    ):
        self.tpot_slo = _float(tpot_slo)
        self.ttft_slo = _float(ttft_slo)
        self.memory_reserve = _float(memory_reserve)
        self.chip_budget = _float(chip_budget)
        self.loss_target = _float(loss_target)

    def __check_init__(self):
        for name in ("tpot_slo", "ttft_slo", "loss_target"):
            if getattr(self, name) is not None:
                check("Problem", name, getattr(self, name), low_open=True)
        if self.chip_budget is not None:
            check("Problem", "chip_budget", self.chip_budget, low=1.0)
        if self.memory_reserve is not None:
            check("Problem", "memory_reserve", self.memory_reserve, low=0.0, high=0.999)


class Problem(eqx.Module):
    """Minimize an objective over integer designs within bounds, subject to constraints.

    Args:
      hardware, model, workload: the scenario (``dcost.Hardware``, ``dcost.Model``,
        ``dcost.Workload``); their leaves may carry a leading batch axis.
      objective: an ``Objective`` value (``dcost.search.objectives``) or the name of a built-in
        one: ``"cost_per_token"`` ($ per output token, decode), ``"cost_per_input_token"``
        ($ per input token, prefill), ``"lifetime_cost"`` ($ of pretraining + RL + inference;
        ``dcost.search.lifetime_objective``). An unknown name raises SpecError listing them.
      free: ``{name: (lo, hi)}`` for any of ``batch``, ``chips`` (per stage), ``stages``,
        ``experts`` (routed, >= the model's ``experts_active``), ``overtrain``; whole numbers with
        ``1 <= lo <= hi``. Serving model v2's layout (``LAYOUT_VARIABLES``; ``0 <= lo`` where 0
        means off): ``attention_dp`` (data-parallel attention groups, ``hi`` at most the chips
        per stage; a searched design's ``A`` divides ``G``), ``dispatch_dedup`` (MoE; within
        ``(0, 1)``), ``redundant_experts`` (MoE; ``hi`` at most the routed experts),
        ``draft_tokens`` (a model with a draft and a workload with ``acceptance > 0``; decode
        objectives), ``prefill_chunk`` (``hi`` at most the prompt; prefill, or decode with a
        ``ttft_slo``). A variable an objective cannot use, or a bound the model cannot honour,
        raises SpecError naming it.
      fixed: a ``dcost.Design`` giving the variables that are not free, and the layout fields
        no search frees (``expert_parallel``, ``comm_overlap``), which every candidate keeps; a
        fixed ``expert_parallel`` needs the chips' ``lo`` at least that many groups.
      limits: a ``Limits``; or give its fields as keywords (``tpot_slo=0.05``,
        ``memory_reserve=0.1``, ``ttft_slo``, ``chip_budget``, ``loss_target``), not both.
        ``tpot_slo`` defaults to 0.05 s for objectives that bound it.
      extras: objective-specific inputs (a pytree), e.g. the training economics of lifetime_cost
        (a ``dcost.LifetimeInputs``).
      engine: a ``dcost.Engine``: the problem's chip runs that engine's profile
        (``Engine.apply``); None: the chip as given.

    >>> import dcost
    >>> p = dcost.Problem(dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"),
    ...                   dcost.Workload(4096), free={"batch": (1, 256)}, tpot_slo=0.03)
    >>> p.names, p.constraints, str(p.objective)
    (('batch',), ('tpot', 'memory'), 'cost_per_token')
    """

    hardware: Hardware
    model: Model
    workload: Workload
    fixed: Design
    limits: Limits
    extras: Any
    objective: Objective = eqx.field(static=True)
    free: tuple = eqx.field(static=True)

    def __init__(
        self,
        hardware,
        model,
        workload,
        objective="cost_per_token",
        free=None,
        fixed=None,
        *,
        limits=None,
        extras=None,
        engine=None,
        **limit_fields,
    ):
        obj = resolve(objective)
        for name, value, cls in (
            ("hardware", hardware, Hardware),
            ("model", model, Model),
            ("workload", workload, Workload),
        ):
            if not isinstance(value, cls):
                raise SpecError(
                    f"Problem.{name} must be a dcost.{cls.__name__}, got {type(value).__name__}"
                )
        fixed = Design(batch=1.0) if fixed is None else fixed
        if not isinstance(fixed, Design):
            raise SpecError(f"Problem.fixed must be a dcost.Design, got {type(fixed).__name__}")
        # the engine's profile on the chip (None: as is)
        hardware = on_engine(engine, hardware, model)
        self.hardware, self.model, self.workload, self.fixed = hardware, model, workload, fixed
        self.limits = _limits(limits, limit_fields, obj)
        self.extras = extras
        self.objective = obj
        self.free = _check_free(_DEFAULT_FREE if free is None else free, obj, model)
        self._check_limits(obj)
        _check_layout(self)
        if obj.validate is not None:
            obj.validate(self)
        batch_size(self)  # raises when leading axes disagree

    def _check_limits(self, obj):
        for name, field in _LIMIT_OF.items():
            if name == "memory" or getattr(self.limits, field) is None:
                continue
            if name not in obj.constraints:
                raise SpecError(
                    f"Problem.{field} does not apply to objective {obj.name!r} "
                    f"(its constraints: {', '.join(sorted(obj.constraints))})"
                )
        if self.fixed.experts is not None and "experts" not in self.names:
            e, k = _concrete(self.fixed.experts), _concrete(self.model.experts_active)
            if e is not None and k is not None and np.any(e < k):
                raise SpecError(
                    f"Problem.fixed.experts = {float(np.min(e))!r} is not allowed: "
                    f"it must be >= the model's experts_active ({float(np.max(k))!r})"
                )

    @property
    def tpot_slo(self):
        """``limits.tpot_slo``: time per output token limit (s), or None."""
        return self.limits.tpot_slo

    @property
    def ttft_slo(self):
        """``limits.ttft_slo``: time of the prefill pass limit (s), or None."""
        return self.limits.ttft_slo

    @property
    def memory_reserve(self):
        """``limits.memory_reserve``: fraction of HBM kept free, or None."""
        return self.limits.memory_reserve

    @property
    def chip_budget(self):
        """``limits.chip_budget``: most chips per replica ``P*G``, or None."""
        return self.limits.chip_budget

    @property
    def loss_target(self):
        """``limits.loss_target``: most pretraining loss (nats), or None."""
        return self.limits.loss_target

    @property
    def names(self) -> tuple[str, ...]:
        """Free variables, in the order of a design vector ``x``."""
        return tuple(n for n, _, _ in self.free)

    @property
    def lower(self) -> np.ndarray:
        """Lower bounds of the free variables (float array, shape ``(d,)``)."""
        return np.array([lo for _, lo, _ in self.free], dtype=float)

    @property
    def upper(self) -> np.ndarray:
        """Upper bounds of the free variables (float array, shape ``(d,)``)."""
        return np.array([hi for _, _, hi in self.free], dtype=float)

    @property
    def offsets(self) -> np.ndarray:
        """Shift of each free variable in the search's log space, ``y = log(x + offset)``: 1 for
        the variables whose 0 means off (``ZERO_OFF``), else 0 (float array, shape ``(d,)``)."""
        return np.array([1.0 if n in ZERO_OFF else 0.0 for n in self.names])

    @property
    def search_lower(self) -> np.ndarray:
        """``lower + offsets``: the lower bounds in the search's coordinates (all >= 1)."""
        return self.lower + self.offsets

    @property
    def search_upper(self) -> np.ndarray:
        """``upper + offsets``: the upper bounds in the search's coordinates."""
        return self.upper + self.offsets

    @property
    def floors(self) -> np.ndarray:
        """The least value each free variable may take: 0 for ``ZERO_OFF``, else 1."""
        return 1.0 - self.offsets

    @property
    def divides(self) -> str | None:
        """Which variable a search repairs so that the design is a layout an engine launches
        (``admissible``): the free ``"attention_dp"``; or the free ``"chips"`` (the attention
        layout fixed, or v1's, ``A = 1``); None when neither is free."""
        if "attention_dp" in self.names:
            return "attention_dp"
        if "chips" in self.names:
            return "chips"
        return None

    @property
    def constraints(self) -> tuple[str, ...]:
        """Names of the constraints that are on, in ``CONSTRAINTS`` order."""
        return tuple(n for n in CONSTRAINTS if getattr(self.limits, _LIMIT_OF[n]) is not None)

    def limit_values(self) -> dict:
        """``{constraint: limit}`` for the constraints that are on (SI units); the memory limit is
        ``M*(1 - memory_reserve)`` bytes per chip."""
        out = {n: getattr(self.limits, f) for n, f in _LIMIT_OF.items() if n != "memory"}
        if self.memory_reserve is not None:
            out["memory"] = self.hardware.hbm_capacity * (1.0 - self.memory_reserve)
        return {n: out[n] for n in self.constraints}

    def design(self, x) -> Design:
        """The ``dcost.Design`` whose free variables are ``x`` (shape ``(d,)``), the rest fixed."""
        vals = {n: x[..., i] for i, n in enumerate(self.names)}
        f = self.fixed
        chips = vals.get("chips", f.chips)
        attention_dp = vals.get("attention_dp", f.attention_dp)
        if self.divides is not None and attention_dp is not None:
            # At most G groups: the relaxation may step past G, where t = G/A < 1 means nothing.
            # At A = G the gradient goes to G alone (A saturated: its own gradient is 0, and
            # t = G/A stays 1 as G moves), not half to each as jnp.minimum's does: the split
            # gradient made data-parallel attention look non-stationary to the KKT polish.
            attention_dp = jnp.where(attention_dp < chips, attention_dp, chips)
        return Design(
            batch=vals.get("batch", f.batch),
            chips=chips,
            stages=vals.get("stages", f.stages),
            experts=vals.get("experts", f.experts),
            overtrain=vals.get("overtrain", f.overtrain),
            attention_dp=attention_dp,
            dispatch_dedup=vals.get("dispatch_dedup", f.dispatch_dedup),
            redundant_experts=vals.get("redundant_experts", f.redundant_experts),
            draft_tokens=vals.get("draft_tokens", f.draft_tokens),
            prefill_chunk=vals.get("prefill_chunk", f.prefill_chunk),
            expert_parallel=f.expert_parallel,
            comm_overlap=f.comm_overlap,
        )


def _limits(limits, fields: dict, obj: Objective) -> Limits:
    """The problem's ``Limits``: given whole, or built from keywords (``tpot_slo`` defaulting to
    0.05 s for objectives that bound it)."""
    known = tuple(_LIMIT_OF.values())
    unknown = [k for k in fields if k not in known]
    if unknown:
        raise SpecError(
            f"Problem got an unknown keyword {unknown[0]!r}; its limits are {', '.join(known)}"
        )
    if limits is not None:
        if fields:
            raise SpecError(
                f"Problem takes limits=Limits(...) or the keywords {', '.join(sorted(fields))}, "
                "not both"
            )
        if not isinstance(limits, Limits):
            raise SpecError(f"Problem.limits must be a dcost.Limits, got {type(limits).__name__}")
        return limits
    if fields.get("tpot_slo", _DEFAULT) is _DEFAULT:
        fields["tpot_slo"] = _DEFAULT_TPOT_SLO if "tpot" in obj.constraints else None
    return Limits(**fields)


def _check_free(free, obj, model) -> tuple:
    """Validate ``{name: (lo, hi)}`` and return it as a static tuple in ``VARIABLES`` order."""
    if not isinstance(free, dict) or not free:
        raise SpecError(f"Problem.free must be a non-empty dict {{name: (lo, hi)}}, got {free!r}")
    out = []
    for name in free:
        if name not in VARIABLES:
            raise SpecError(
                f"Problem.free has unknown variable {name!r}; known: {', '.join(VARIABLES)}"
            )
        if name not in obj.variables:
            known = ", ".join(v for v in VARIABLES if v in obj.variables)
            raise SpecError(
                f"Problem.free[{name!r}] does not apply to objective {obj.name!r} "
                f"(its variables: {known})"
            )
    for name in VARIABLES:
        if name not in free:
            continue
        bounds = free[name]
        try:
            lo, hi = (float(b) for b in bounds)
        except (TypeError, ValueError):
            raise SpecError(
                f"Problem.free[{name!r}] = {bounds!r} is not allowed: it must be a "
                "pair (lo, hi) of numbers"
            ) from None
        least = 0 if name in ZERO_OFF else 1
        most = 1.0 if name == "dispatch_dedup" else whole_max()
        if (
            not (np.isfinite(lo) and np.isfinite(hi))
            or lo < least
            or lo > hi
            or lo != round(lo)
            or hi != round(hi)
            or hi > most
        ):
            raise SpecError(
                f"Problem.free[{name!r}] = {bounds!r} is not allowed: bounds must be "
                f"whole numbers with {least} <= lo <= hi <= {most:.0f}"
            )
        if name == "experts":
            e, k = _concrete(model.n_experts), _concrete(model.experts_active)
            if e is not None and np.any(e <= 0):
                raise SpecError(
                    "Problem.free['experts'] is not allowed for a dense model (Model.n_experts = 0)"
                )
            if k is not None and lo < np.max(k):
                raise SpecError(
                    f"Problem.free['experts'] = {bounds!r} is not allowed: lo must be "
                    f">= the model's experts_active ({float(np.max(k)):g})"
                )
        out.append((name, int(lo), int(hi)))
    return tuple(out)


def _most(x) -> float | None:
    """The largest value of a concrete leaf (None when traced or None)."""
    v = _concrete(x)
    return None if v is None else float(np.max(v))


def _least(x) -> float | None:
    v = _concrete(x)
    return None if v is None else float(np.min(v))


_WHOLE_FIELDS = (
    "batch",
    "chips",
    "stages",
    "experts",
    "attention_dp",
    "redundant_experts",
    "expert_parallel",
    "draft_tokens",
    "prefill_chunk",
)
"""``Design`` fields that count things: a fixed one is a whole number (the search returns whole
designs and calls them feasible by the exact model, which is meant for whole numbers)."""


def _check_fixed(problem: Problem, bounds: dict) -> None:
    """Refuse a fixed count that is not a whole number (``Design(chips=7.5)``), fixed groups that
    do not divide fixed chips (``check_groups``) and fixed draft tokens without a draft or an
    acceptance rate (``check_speculation``): the checks ``decode`` makes, made here too."""
    f = problem.fixed
    for name in _WHOLE_FIELDS:
        v = _concrete(getattr(f, name)) if name not in bounds else None
        if v is not None and np.any(v != np.round(v)):
            bad = float(v.ravel()[np.flatnonzero(v.ravel() != np.round(v.ravel()))[0]])
            raise SpecError(
                f"Problem.fixed.{name} = {bad!r} is not allowed: a fixed {name} must be a whole "
                f"number (free it, Problem.free[{name!r}] = (lo, hi), to search it)"
            )
    if "chips" not in bounds:
        check_groups("Problem.fixed", f)
    if "draft_tokens" not in bounds:
        check_speculation("Problem.fixed", f, problem.model, problem.workload)


def _check_layout(problem: Problem) -> None:
    """Refuse layout variables (``LAYOUT_VARIABLES``) the scenario cannot honour, naming the
    variable, its bounds and the field that rules it out."""
    bounds = {n: (lo, hi) for n, lo, hi in problem.free}
    m, w, f = problem.model, problem.workload, problem.fixed

    def refuse(name, why):
        raise SpecError(f"Problem.free[{name!r}] = {bounds[name]!r} is not allowed: {why}")

    _check_fixed(problem, bounds)
    if "attention_dp" in bounds:
        most: float | None = _least(f.chips)
        where = "Problem.fixed.chips"
        if "chips" in bounds:
            most, where = float(bounds["chips"][1]), "the largest chips per stage in Problem.free"
        if most is not None and bounds["attention_dp"][1] > most:
            refuse(
                "attention_dp",
                f"hi must be at most the chips per stage ({most:g}, {where}): the groups split a "
                "stage's chips",
            )
    elif problem.divides == "chips":
        a, hi = _most(f.attention_dp), bounds["chips"][1]
        if a is not None and hi < a:
            raise SpecError(
                f"Problem.free['chips'] = {bounds['chips']!r} is not allowed with "
                f"Problem.fixed.attention_dp = {a:g}: a stage needs at least as many chips as "
                "attention groups (and a multiple of them)"
            )
    groups = _most(f.expert_parallel)
    if groups is not None and "chips" in bounds and bounds["chips"][0] < groups:
        raise SpecError(
            f"Problem.free['chips'] = {bounds['chips']!r} is not allowed with "
            f"Problem.fixed.expert_parallel = {groups:g}: a stage needs at least as many chips "
            "as expert-parallel groups (lo >= the groups)"
        )
    for name in ("dispatch_dedup", "redundant_experts"):
        e = _least(m.n_experts)
        if name in bounds and e is not None and e <= 0:
            refuse(name, "the model is dense (Model.n_experts = 0): it has no experts to route")
    if "redundant_experts" in bounds:
        if "experts" in bounds:
            top: float | None = float(bounds["experts"][1])
        else:
            top = _most(m.n_experts if f.experts is None else f.experts)
        if top is not None and bounds["redundant_experts"][1] > top:
            refuse(
                "redundant_experts",
                f"hi must be at most the routed experts ({top:g}): one extra replica of each",
            )
    if "draft_tokens" in bounds:
        d = _least(m.draft_params)
        if d is not None and d <= 0:
            refuse(
                "draft_tokens",
                "the model has no draft (Model.draft_params = 0): give a model with a draft or "
                "multi-token-prediction module (e.g. dcost.model('deepseek-v3'))",
            )
        a = _least(w.get("acceptance"))
        if a is not None and a <= 0:
            refuse(
                "draft_tokens",
                "Workload.acceptance is 0 (or unset): no draft token would ever be accepted, so "
                "speculation never pays; give the draft's acceptance rate, e.g. "
                "Workload(..., acceptance=0.85)",
            )
    if "prefill_chunk" in bounds:
        if "ttft" not in problem.constraints and not problem.objective.prefill:
            refuse(
                "prefill_chunk",
                f"objective {problem.objective.name!r} without a ttft_slo never runs a prefill, so "
                "the chunk changes nothing; set Problem.ttft_slo or use cost_per_input_token",
            )
        prompt = _most(w.prompt)
        if prompt is not None and bounds["prefill_chunk"][1] > prompt:
            refuse(
                "prefill_chunk",
                f"hi must be at most the prompt (Workload.prompt = {prompt:g} tokens): a larger "
                "chunk is the whole prompt in one pass",
            )


def batch_size(problem: Problem) -> int | None:
    """Length of the leading batch axis of the problem's leaves, or None for one scenario.

    Raises SpecError when leaves have more than one axis or disagree on its length.
    """
    n = None
    for path, leaf in jax.tree_util.tree_leaves_with_path(problem):
        shape = jnp.shape(leaf)
        if not shape:
            continue
        where = "Problem" + jax.tree_util.keystr(path)
        if len(shape) > 1:
            raise SpecError(f"{where} has shape {shape}: at most one leading batch axis is allowed")
        if n is not None and shape[0] != n:
            raise SpecError(f"{where} has a batch axis of {shape[0]}, others have {n}")
        n = shape[0]
    return n


def on_shared_form(problem: Problem) -> Problem:
    """The problem on its chip's ``shared_form`` (a profiled chip filled): the same numbers in
    one pytree structure for every profile, so that the search programs compiled for one are
    loaded for the others. The searches solve this and hand back the caller's problem."""
    return eqx.tree_at(lambda p: p.hardware, problem, shared_form(problem.hardware))


def broadcast(problem: Problem, n: int) -> Problem:
    """The problem with every leaf broadcast to a leading axis of length ``n`` (for ``vmap``)."""
    return jax.tree.map(lambda x: jnp.broadcast_to(x, (n,)), problem)


class Evaluation(NamedTuple):
    """One design of one scenario, evaluated.

    Attributes:
      cost: the objective (its unit: ``problem.objective.unit``).
      values: the constrained quantities, shape ``(n_constraints,)`` in ``problem.constraints``
        order (SI units).
      limits: their limits, the same shape.
      margins: ``1 - FEASIBILITY_RTOL``, or 1 for the ``EXACT`` constraints.
      report: the objective's report of the design (a ``dcost.Report`` for decode, a
        ``dcost.PrefillReport`` for prefill).
    """

    cost: jax.Array
    values: jax.Array
    limits: jax.Array
    margins: jax.Array
    report: Any

    @property
    def log_ratios(self):
        """``log(value/limit)``: the constraints as the optimizer sees them (<= 0 is feasible)."""
        return safe_log(self.values) - safe_log(self.limits)

    @property
    def violation(self):
        """``sum_j max(0, log(value_j / (limit_j*margin_j)))``; 0 exactly when feasible."""
        over = safe_log(self.values) - safe_log(self.limits * self.margins)
        return jnp.sum(jnp.where(self.feasible_each, 0.0, jnp.maximum(over, 0.0)), axis=-1)

    @property
    def feasible_each(self):
        """Whether each constraint holds (``value <= limit*margin``)."""
        return self.values <= self.limits * self.margins

    @property
    def feasible(self):
        """Whether every constraint holds."""
        return jnp.all(self.feasible_each, axis=-1)


def evaluate(problem: Problem, x, smoothness=0.0, rtol=FEASIBILITY_RTOL) -> Evaluation:
    """Evaluate the design vector ``x`` (free variables, shape ``(d,)``) of one scenario.

    ``smoothness = 0`` is the exact model (for whole-number ``x``); ``> 0`` the smooth relaxation.
    ``rtol`` is the relative margin of feasibility (searches pass ``SEARCH_RTOL``).

    >>> import dcost, jax.numpy as jnp
    >>> from dcost.search.problem import evaluate
    >>> p = dcost.Problem(dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"),
    ...                   dcost.Workload(4096), free={"batch": (1, 256)}, tpot_slo=0.03)
    >>> ev = evaluate(p, jnp.array([16.0]))
    >>> bool(ev.feasible), ev.values.shape
    (True, (2,))
    """
    x = jnp.asarray(x)
    if isinstance(smoothness, (int, float)) and smoothness == 0:
        cost, quantities, report = _exact(problem, x)
    else:
        cost, quantities, report = problem.objective.evaluate(
            problem.design(x), problem, smoothness
        )
    names = problem.constraints
    dtype = jnp.result_type(cost)
    if names:
        values = jnp.stack([jnp.asarray(quantities[n], dtype) for n in names], axis=-1)
        limits_ = problem.limit_values()
        limits = jnp.stack([jnp.asarray(limits_[n], dtype) for n in names], axis=-1)
    else:
        values = limits = jnp.zeros((0,), dtype)
    margins = jnp.asarray([1.0 if n in EXACT else 1.0 - rtol for n in names], dtype)
    return Evaluation(cost, values, limits, margins, report)


@jax.jit
def _exact(problem: Problem, x):
    """The exact model at ``x``: ``(cost, quantities, report)``. Jitted so that it is traced once
    per program: a search evaluates the exact model in several places (the bisection on the
    batch, the local search's scores, the final check and its neighbours), and every call after
    the first reuses the traced program (``optimize``: 1.2 s of tracing on 2 cores before)."""
    return problem.objective.evaluate(problem.design(x), problem, 0.0)


def to_search(problem: Problem, x):
    """Free variables ``x`` in the search's coordinates ``x + offsets`` (``log`` of these is the
    relaxation's ``y``; ``ZERO_OFF`` variables are shifted by 1, the others unchanged)."""
    off = problem.offsets
    return x + jnp.asarray(off, jnp.result_type(x)) if off.any() else x


def from_search(problem: Problem, v):
    """Inverse of ``to_search``: ``v - offsets``."""
    off = problem.offsets
    return v - jnp.asarray(off, jnp.result_type(v)) if off.any() else v


_DOUBLINGS = 9  # powers of two 1 to 256


def degrees(model, dtype):
    """The tensor-parallel degrees ``repair`` tries beside those nearest the design: the powers
    of two, the query heads over powers of two, and the KV heads times powers of two, 1 to 256
    each. A degree that splits the heads divides the query heads and divides or is a multiple of
    the KV heads; for every 2026 preset these hold all such degrees
    (``tests/test_launchable_layouts.py`` checks them against every degree to 256), in 27
    candidates where all of 1 to 256 made ``optimize``'s batched search of 1,000 scenarios three
    times slower. Ones that do not split (a fraction, a degree past the heads) are not ``ok``."""
    twos = jnp.asarray(2.0 ** np.arange(_DOUBLINGS), dtype)
    h, kv = model.attention_heads, model.kv_heads
    return jnp.concatenate([twos, h / twos, kv * twos]).astype(dtype)


def splits(model, degree):
    """``dcost.specs.attention_splits`` traced: whether tensor-parallel attention over
    ``degree`` chips splits the model's heads (the degree divides the query heads, and divides or
    is a multiple of the KV heads; a head count of 0 allows any degree)."""
    return splits_heads(model.attention_heads, model.kv_heads, degree, jnp)


def _attention_groups(problem: Problem, x):
    """``A`` of the design vector ``x``: free, fixed, or 1 (v1's layout)."""
    if "attention_dp" in problem.names:
        return x[problem.names.index("attention_dp")]
    a = problem.fixed.attention_dp
    return jnp.ones((), x.dtype) if a is None else a


def admissible(problem: Problem, x):
    """Whether the whole-number design vector ``x`` is a layout an engine launches: its
    attention groups ``A`` divide its chips per stage ``G`` (``A <= G``, ``G mod A = 0``), and
    tensor-parallel attention over ``G/A`` chips splits the model's heads (``splits``). Always
    True when the problem frees neither."""
    if problem.divides is None:
        return jnp.ones((), bool)
    d = problem.design(jnp.asarray(x))  # A = min(A, G): compare with the A asked for
    a = _attention_groups(problem, x)
    divides = (a <= d.chips) & (jnp.mod(d.chips, a) == 0)
    return divides & splits(problem.model, d.chips / jnp.where(divides, a, 1.0))


def repair(problem: Problem, x, direction):
    """``(x', ok)``: the whole-number design ``x`` made ``admissible`` by moving one variable.

    With ``attention_dp`` free, ``A`` moves to a divisor of ``G`` within its bounds: the largest
    one ``<= A`` for ``direction < 0``, the smallest ``>= A`` for ``direction > 0``, the nearest
    (ties down) for 0, each falling back to the other side when its own has none. With the
    layout fixed (or v1's, ``A = 1``) and ``chips`` free, ``G`` moves to a multiple of ``A`` the
    same way. Either way ``G/A`` must split the model's attention heads (``splits``: 3 chips do
    not split Llama's 32 heads, so chips 3 moves to 2 or 4). ``ok`` is False when no value
    within the bounds works (the caller ranks the design last). ``x`` unchanged (and ok) when
    the problem has no such rule.

    >>> import dcost, jax.numpy as jnp
    >>> from dcost.search.problem import repair
    >>> p = dcost.Problem(dcost.hardware("h100-sxm"), dcost.model("deepseek-v3"),
    ...                   dcost.Workload(4096), free={"chips": (1, 8), "attention_dp": (1, 8)})
    >>> [float(v) for v in repair(p, jnp.array([6.0, 4.0]), 1)[0]]  # 4 does not divide 6: 6
    [6.0, 6.0]
    >>> [float(v) for v in repair(p, jnp.array([6.0, 4.0]), -1)[0]]  # 3 does
    [6.0, 3.0]
    """
    name = problem.divides
    if name is None:
        return x, jnp.ones((), bool)
    i = problem.names.index(name)
    lo, hi = problem.free[i][1:]
    v = x[i]
    d = problem.design(x)
    if name == "attention_dp":
        g = d.chips
        cand = jnp.arange(lo, hi + 1, dtype=x.dtype)
        ok = (cand <= g) & (jnp.mod(g, cand) == 0)
        ok = ok & splits(problem.model, g / jnp.where(ok, cand, 1.0))
    else:
        a = _attention_groups(problem, x)
        # the multiples of A either side, and A times the degrees that may split the heads
        near = jnp.stack([jnp.floor(v / a), jnp.ceil(v / a)]).astype(x.dtype)
        t = jnp.concatenate([near, degrees(problem.model, x.dtype)])
        cand = t * a
        ok = (cand >= jnp.maximum(lo, a)) & (cand <= hi) & splits(problem.model, t)
    side = jnp.where(direction < 0, cand <= v, jnp.where(direction > 0, cand >= v, True))
    pool = jnp.where(jnp.any(ok & side), ok & side, ok)
    # nearest in the pool; ties go to the smaller
    gap = jnp.where(pool, jnp.abs(cand - v), jnp.inf)
    k = jnp.argmin(jnp.where(gap == jnp.min(gap), cand, jnp.inf))
    return x.at[i].set(cand[k]), jnp.any(ok)


def better(a: tuple, b: tuple):
    """Whether candidate ``a`` ranks strictly before ``b``: tuples of keys compared in order,
    e.g. ``(violation, cost)`` or ``(violation, cost, index)``; less is better, ties go on to the
    next key (elementwise over arrays)."""
    out, tied = False, True
    for x, y in zip(a, b, strict=True):
        out = out | (tied & (x < y))
        tied = tied & (x == y)
    return out
