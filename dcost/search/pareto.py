"""The cost-latency frontier: the cheapest token at every time-per-output-token target.

``pareto`` optimizes the problem once per SLO in one vmapped call, then makes the frontier
monotone: a design that meets a tighter SLO meets every looser one, so the cost at an SLO is the
least over all designs found at SLOs no looser than it.
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost.search._jit import jit
from dcost.search.buckets import bucket, pad, unpad
from dcost.search.optimize import DEFAULT, Settings, optimize
from dcost.search.problem import Problem, batch_size
from dcost.search.solution import Solution, finish
from dcost.specs import SpecError

__all__ = ["pareto", "Frontier"]


class Frontier(eqx.Module):
    """Cost against latency target.

    Attributes:
      tpot_slo: the targets (s), ascending, shape ``(n,)``.
      cost: the cheapest cost found meeting each target (the objective's unit, e.g. $ per output
        token); ``inf`` where no design meets it.
      tpot: the time per output token of that design (s), ``<= tpot_slo``.
      feasible: whether a design meets each target (and every other constraint).
      solution: the batched ``dcost.Solution`` behind each point.
      optimum: index of the problem's own ``tpot_slo`` in ``tpot_slo`` (-1 when it has none).
    """

    tpot_slo: jax.Array
    cost: jax.Array
    tpot: jax.Array
    feasible: jax.Array
    solution: Solution
    optimum: int = eqx.field(static=True)


def pareto(problem: Problem, tpot_slos, settings: Settings = DEFAULT) -> Frontier:
    """The frontier of cost against time per output token, one optimization per SLO, one call.

    .. math:: c^*(\\tau) = \\min_x \\{\\text{cost}(x) : \\text{tpot}(x) \\le \\tau, \\dots\\},
              \\quad c^* \\text{ non-increasing in } \\tau

    Args:
      problem: an unbatched ``dcost.Problem`` whose objective bounds ``tpot``; its own
        ``tpot_slo`` (when set) joins the list and is marked as ``optimum``.
      tpot_slos: the targets (s), any order.
      settings: passed to ``dcost.optimize``.

    Returns:
      A ``Frontier`` sorted by SLO.

    >>> import dcost, numpy as np
    >>> p = dcost.Problem(dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"),
    ...                   dcost.Workload(2048), free={"batch": (1, 512), "chips": (1, 8)})
    >>> f = dcost.pareto(p, [0.01, 0.02, 0.05])
    >>> bool(np.all(np.diff(np.asarray(f.cost)) <= 0))  # looser target, cheaper token
    True
    """
    if batch_size(problem) is not None:
        raise SpecError("pareto: the problem must be a single scenario (no batch axis)")
    if "tpot" not in problem.objective.constraints:
        raise SpecError(f"pareto: objective {problem.objective.name!r} has no tpot constraint")
    slos = np.asarray(tpot_slos, dtype=float).ravel()
    if slos.size == 0 or not np.all(np.isfinite(slos) & (slos > 0)):
        raise SpecError(
            f"pareto: tpot_slos = {tpot_slos!r} is not allowed: it must be a "
            "non-empty list of finite times > 0 (s)"
        )
    own = None if problem.tpot_slo is None else float(problem.tpot_slo)
    if own is not None:
        slos = np.append(slos, own)
    # sorted, and deduplicated at the problem's float precision (its own SLO is stored in it)
    slos = np.unique(slos.astype(np.asarray(problem.tpot_slo if own is not None else 0.0).dtype))
    batched = eqx.tree_at(
        lambda p: p.limits.tpot_slo,
        problem,
        jnp.asarray(slos, jnp.result_type(float)),
        is_leaf=lambda x: x is None,
    )
    sol = _monotone(optimize(batched, settings))  # padded to a bucket: few distinct compilations
    cost = jnp.where(sol.feasible, sol.cost, jnp.inf)
    tpot = getattr(sol.report, "tpot", jnp.full_like(cost, jnp.nan))
    optimum = -1 if own is None else int(np.searchsorted(slos, own))
    return Frontier(
        tpot_slo=jnp.asarray(slos, cost.dtype),
        cost=cost,
        tpot=tpot,
        feasible=sol.feasible,
        solution=sol,
        optimum=optimum,
    )


def _monotone(sol: Solution) -> Solution:
    """Give every SLO the best design found at it or at any tighter SLO (SLOs ascending)."""
    cost = np.where(np.asarray(sol.feasible), np.asarray(sol.cost), np.inf)
    source = np.arange(cost.size)
    best = None
    for i in range(cost.size):
        if best is not None and cost[best] < cost[i]:
            source[i] = best
        else:
            best = i
    if np.all(source == np.arange(cost.size)):
        return sol
    # the continuous relaxation (multipliers, statistics) of each SLO stays its own
    n, size = cost.size, bucket(cost.size)
    args = (sol.problem, jnp.asarray(np.asarray(sol.x)[source]), sol.lambdas, sol.stats)
    return unpad(_refinish(*pad(args, n, size)), n, size)


@jit
def _refinish(problem, x, lambdas, stats):
    return jax.vmap(finish)(problem, x, lambdas, stats)
