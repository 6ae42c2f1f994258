"""The answer of a search: an integer design checked with the exact model, and why it is there.

``dcost.optimize`` and ``dcost.grid_search`` both end in ``finish``: the chosen integer design is
evaluated with the exact model (smoothness 0), and the solution records whether it is feasible,
which constraints bind, and the multipliers of the continuous relaxation where there is one.
Fields of a solution to a batched problem carry the batch axis.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost.search.problem import Problem, evaluate, repair
from dcost.specs import Design, _number

__all__ = ["Solution", "Stats", "finish", "CHEAPER_RTOL"]

CHEAPER_RTOL = 1e-6
"""A neighbour counts as cheaper when its cost is below ``cost*(1 - CHEAPER_RTOL)``."""
BINDING_LAMBDA = 1e-3
BINDING_NEAR = 0.95
"""A constraint also binds when the continuous relaxation prices it (multiplier above
``BINDING_LAMBDA``) and the design uses at least ``BINDING_NEAR`` of its limit: a joint move (more
chips *and* a larger batch) may be what it blocks."""


class Stats(eqx.Module):
    """How a solution was found (NaN where a method has no such figure).

    Attributes:
      evaluations: exact-model evaluations of integer designs.
      steps: gradient steps per starting point (0 for grid search).
      starts: starting points of the continuous search (0 for grid search).
      continuous_x: the best continuous optimum, free variables ``(..., d)``.
      continuous_cost: the smooth model's objective there.
      smoothness: the smoothness of the last continuous phase.
    """

    evaluations: jax.Array
    steps: jax.Array
    starts: jax.Array
    continuous_x: jax.Array
    continuous_cost: jax.Array
    smoothness: jax.Array


def _summary(sol) -> str:
    """``Solution(design=Design(batch=64, ...), cost=..., feasible=True, binding=(...), ...)``
    with numbers when concrete; equinox's tree printout when traced."""
    if any(isinstance(x, jax.core.Tracer) for x in jax.tree.leaves(sol)):
        return eqx.tree_pformat(sol)
    return (
        f"Solution(design={sol.design!r}, cost={_number(sol.cost)}, "
        f"feasible={_number(sol.feasible)}, binding={sol.binding!r}, "
        f"at_bound={sol.at_bound!r}, message={sol.message!r})"
    )


class Solution(eqx.Module):
    """Result of ``dcost.optimize`` / ``dcost.grid_search`` (optimistix-style solution object).

    Attributes:
      x: the free variables of the design, whole numbers, shape ``(..., d)``.
      design: the full ``dcost.Design`` (free variables from ``x``, the rest from
        ``problem.fixed``).
      report: the exact model's report of the design (``dcost.Report`` for decode,
        ``dcost.PrefillReport`` for prefill, ``dcost.LifetimeReport`` for lifetime_cost).
      cost: the exact objective at the design (e.g. $ per output token).
      feasible: True only when the exact model confirms every constraint.
      values, limits: the constrained quantities and their limits, ``(..., n_constraints)``.
      active: which constraints bind, ``(..., n_constraints)`` booleans: for a feasible design, the
        constraints that some cheaper neighbouring design (one variable moved by 1) violates, or
        that the continuous relaxation prices while the design uses 95 % of the limit; for an
        infeasible one, the constraints it violates.
      bounds: which free variables sit at a bound that stops a cheaper feasible design (one step
        beyond it), ``(..., d)`` booleans; see ``at_bound``.
      lambdas: dimensionless multipliers of the continuous relaxation,
        ``lambda_j = -d log(cost*) / d log(limit_j)`` (NaN for grid search).
      stats: a ``Stats``.
      problem: the problem solved.
    """

    __repr__ = _summary

    x: jax.Array
    design: Design
    report: object
    cost: jax.Array
    feasible: jax.Array
    values: jax.Array
    limits: jax.Array
    active: jax.Array
    bounds: jax.Array
    lambdas: jax.Array
    stats: Stats
    problem: Problem

    @property
    def constraints(self) -> tuple[str, ...]:
        """Constraint names, the last axis of ``values``, ``limits``, ``active``, ``lambdas``."""
        return self.problem.constraints

    @property
    def binding(self):
        """Names of the binding constraints: a tuple, or for a batched problem a list of tuples
        (empty for a problem without constraints)."""
        active = np.asarray(self.active)
        names = self.constraints
        scenarios = int(np.prod(active.shape[:-1]))  # 1 for one scenario, also when no constraint
        rows = [
            tuple(n for n, a in zip(names, row, strict=True) if a)
            for row in active.reshape(scenarios, len(names))
        ]
        return rows[0] if active.ndim == 1 else rows

    @property
    def at_bound(self):
        """``("batch <= 4096", ...)``: the bounds that bind (a list of tuples if batched)."""
        b = np.asarray(self.bounds)
        x = np.asarray(self.x).reshape(int(np.prod(b.shape[:-1])), b.shape[-1])
        hi = {n: v for n, _, v in self.problem.free}
        rows = [
            tuple(
                f"{n} {'<=' if xi == hi[n] else '>='} {xi:.0f}"
                for n, xi, a in zip(self.problem.names, xr, row, strict=True)
                if a
            )
            for xr, row in zip(x, b.reshape(-1, b.shape[-1]), strict=True)
        ]
        return rows[0] if b.ndim == 1 else rows

    @property
    def multipliers(self) -> dict:
        """Shadow prices ``{constraint: -d cost* / d log(limit)}``: $ (the objective's unit) per
        unit of relative slack, i.e. how much cheaper the optimum gets, per token, when the limit
        is raised by a fraction ``eps`` is about ``eps * multiplier``. From the continuous
        relaxation: ``lambda_j * continuous_cost``; NaN for grid search."""
        # operators, not jnp functions: a Solution of NumPy leaves (as the CLI prints one) stays
        # in NumPy and runs no XLA program
        m = self.lambdas * self.stats.continuous_cost[..., None]
        return {n: m[..., i] for i, n in enumerate(self.constraints)}

    @property
    def message(self):
        """A sentence: "feasible", or which constraint cannot be met and why (a list if batched)."""
        msgs = [_message(self, i) for i in range(int(np.size(np.asarray(self.feasible))))]
        return msgs[0] if np.ndim(self.feasible) == 0 else msgs


def finish(problem: Problem, x, lambdas, stats: Stats) -> Solution:
    """Evaluate the integer design vector ``x`` of one scenario exactly and build its Solution.

    Pure and jit/vmap friendly (vmap it over scenarios).
    """
    lo, hi = jnp.asarray(problem.lower), jnp.asarray(problem.upper)
    d = x.shape[-1]
    steps = jnp.concatenate([jnp.zeros((1, d)), jnp.eye(d), -jnp.eye(d)])
    floors = problem.floors  # 1, or 0 for a variable whose 0 means off
    # one step either way, the bounds ignored
    moved = jnp.maximum(x + steps, floors if problem.offsets.any() else 1.0)
    valid = None
    if problem.divides is not None:  # the next valid layout in the step's direction
        i = problem.names.index(problem.divides)
        moved, valid = jax.vmap(lambda v, s: repair(problem, v, s))(moved, steps[:, i])
    everything = jax.vmap(lambda v: evaluate(problem, v))(moved)
    ev = jax.tree.map(lambda a: a[0], everything)  # the design itself, then its neighbours
    nev = jax.tree.map(lambda a: a[1:], everything)
    inside = jnp.all((moved[1:] >= lo) & (moved[1:] <= hi), axis=-1)
    if valid is not None:  # no valid layout that way: no neighbour
        inside = inside & valid[1:]
    cheaper = (nev.cost < ev.cost * (1.0 - CHEAPER_RTOL)) & jnp.any(moved[1:] != x, axis=-1)
    blocks = jnp.any((inside & cheaper)[:, None] & ~nev.feasible_each, axis=0)
    lambdas = jnp.asarray(lambdas, ev.values.dtype)
    priced = (lambdas > BINDING_LAMBDA) & (ev.values >= ev.limits * BINDING_NEAR)
    active = jnp.where(ev.feasible, blocks | priced, ~ev.feasible_each)
    beyond = ~inside & cheaper & nev.feasible  # a bound stops a cheaper feasible design
    bounds = ev.feasible & (beyond[:d] | beyond[d:])
    return Solution(
        x=x,
        design=problem.design(x),
        report=ev.report,
        cost=ev.cost,
        feasible=ev.feasible,
        values=ev.values,
        limits=ev.limits,
        active=active,
        bounds=bounds,
        lambdas=lambdas,
        stats=stats,
        problem=problem,
    )


def _pick(tree, i):
    return jax.tree.map(lambda a: np.asarray(a) if np.ndim(a) == 0 else np.asarray(a)[i], tree)


def _message(sol: Solution, i: int) -> str:
    """Explain scenario ``i`` of a solution in one sentence."""
    s = _pick(sol, i) if np.ndim(sol.feasible) else jax.tree.map(np.asarray, sol)
    if bool(s.feasible):
        return "feasible"
    p = s.problem
    parts = []
    for j, name in enumerate(p.constraints):
        value, limit = float(s.values[j]), float(s.limits[j])
        if not s.active[j]:  # an infeasible design's active constraints are those it violates
            continue
        if name == "memory":
            parts.append(_memory_message(p, value, limit))
        elif name in ("tpot", "ttft"):
            what = "per output token" if name == "tpot" else "for the prefill pass"
            parts.append(
                f"{name}: the closest design found takes {value * 1e3:.4g} ms {what}, "
                f"above the {limit * 1e3:.4g} ms target"
            )
        elif name == "replica_chips":
            parts.append(
                f"replica_chips: the closest design found uses {value:.0f} chips per replica, "
                f"above the budget of {limit:.0f}"
            )
        else:
            parts.append(
                f"{name}: {value:.4g} at the closest design found, above the limit {limit:.4g}"
            )
    return "infeasible: " + "; ".join(parts)


def _memory_message(p: Problem, value: float, limit: float) -> str:
    highs = {n: hi for n, _, hi in p.free}
    lows = {n: lo for n, lo, _ in p.free}
    chips = highs.get("chips", float(p.fixed.chips)) * highs.get("stages", float(p.fixed.stages))
    if p.chip_budget is not None:
        chips = min(chips, float(p.chip_budget))
    m = p.model
    experts = lows.get("experts")
    if experts is None:
        experts = float(m.n_experts) if p.fixed.experts is None else float(p.fixed.experts)
    weights = (
        float(m.bytes_per_param)
        * (float(m.params_dense) + experts * float(m.params_per_expert))
        / chips
    )
    if weights > limit:
        return (
            f"memory: the weights alone ({weights / 1e9:.4g} GB per chip on the most chips "
            f"allowed, {chips:.0f} per replica) do not fit in {limit / 1e9:.4g} GB"
        )
    return (
        f"memory: the closest design found needs {value / 1e9:.4g} GB per chip, above the "
        f"{limit / 1e9:.4g} GB available"
    )
