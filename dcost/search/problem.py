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

from dcost.search.objectives import Objective, resolve
from dcost.smooth import safe_log
from dcost.specs import Design, Hardware, Model, SpecError, Workload, _concrete, _float, check

__all__ = [
    "Problem",
    "Limits",
    "Evaluation",
    "evaluate",
    "better",
    "VARIABLES",
    "CONSTRAINTS",
    "FEASIBILITY_RTOL",
]

VARIABLES = ("batch", "chips", "stages", "experts", "overtrain")
"""Free variables: ``chips`` is chips per pipeline stage ``G`` (``Design.chips``)."""
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
        ``1 <= lo <= hi``.
      fixed: a ``dcost.Design`` giving the variables that are not free.
      limits: a ``Limits``; or give its fields as keywords (``tpot_slo=0.05``,
        ``memory_reserve=0.1``, ``ttft_slo``, ``chip_budget``, ``loss_target``), not both.
        ``tpot_slo`` defaults to 0.05 s for objectives that bound it.
      extras: objective-specific inputs (a pytree), e.g. the training economics of lifetime_cost
        (a ``dcost.LifetimeInputs``).

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
        self.hardware, self.model, self.workload, self.fixed = hardware, model, workload, fixed
        self.limits = _limits(limits, limit_fields, obj)
        self.extras = extras
        self.objective = obj
        self.free = _check_free(_DEFAULT_FREE if free is None else free, obj, model)
        self._check_limits(obj)
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
        return Design(
            batch=vals.get("batch", f.batch),
            chips=vals.get("chips", f.chips),
            stages=vals.get("stages", f.stages),
            experts=vals.get("experts", f.experts),
            overtrain=vals.get("overtrain", f.overtrain),
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
        if (
            not (np.isfinite(lo) and np.isfinite(hi))
            or lo < 1
            or lo > hi
            or lo != round(lo)
            or hi != round(hi)
        ):
            raise SpecError(
                f"Problem.free[{name!r}] = {bounds!r} is not allowed: bounds must be "
                "whole numbers with 1 <= lo <= hi"
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
    design = problem.design(jnp.asarray(x))
    cost, quantities, report = problem.objective.evaluate(design, problem, smoothness)
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


def better(a: tuple, b: tuple):
    """Whether candidate ``a`` ranks strictly before ``b``: tuples of keys compared in order,
    e.g. ``(violation, cost)`` or ``(violation, cost, index)``; less is better, ties go on to the
    next key (elementwise over arrays)."""
    out, tied = False, True
    for x, y in zip(a, b, strict=True):
        out = out | (tied & (x < y))
        tied = tied & (x == y)
    return out
