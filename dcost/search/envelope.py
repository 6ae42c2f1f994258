"""Elasticities of the optimal cost from what ``optimize`` found: the envelope theorem, no polish.

``dcost.sensitivity`` first polishes the continuous optimum to a KKT point by damped Newton steps
from every start under several guesses of the active set, then differentiates the KKT conditions:
a large program (about 11 MB compiled, 10 s of CPU to compile on 2 cores). When only the cost's
elasticities are wanted, ``optimize``'s own result has what the envelope theorem needs: its best
continuous point ``v*`` (``Solution.stats.continuous_x``, at the last smoothness ``s``) and its
dimensionless multipliers ``lambda*`` (``Solution.lambdas``, least-squares multipliers of
stationarity there). With ``f = log cost`` and ``c_j = log(value_j/limit_j)`` on the smooth model:

    d log cost* / d log theta = theta d/dtheta [f(v*; theta) + sum_j lambda*_j c_j(v*; theta)]

    d log cost* / d log limit_j = -lambda*_j

the formula ``sensitivity`` evaluates at its polished point, here one gradient of the smooth model
at ``optimize``'s point. It is exact at a KKT point and first-order accurate near one (the error
is the distance to it times the mixed second derivatives); ``tests/test_envelope.py`` holds it
against ``sensitivity``. The command line prints these by default (``--sensitivity kkt`` runs
``sensitivity``). The optimal design's own elasticities need the implicit function theorem on the
KKT system: ``sensitivity`` gives them.

Reference: Nocedal & Wright, "Numerical Optimization" (2006), 12.8.
"""

from __future__ import annotations

import functools
from typing import cast

import equinox as eqx
import jax
import jax.numpy as jnp

from dcost.search._jit import jit
from dcost.search.problem import Problem, batch_size, broadcast, evaluate
from dcost.search.sensitivity import Sensitivity
from dcost.search.solution import Solution
from dcost.specs import Hardware, Model, SpecError, Workload

__all__ = ["Envelope", "envelope"]


class Envelope(eqx.Module):
    """Result of ``envelope``: ``d log(optimal cost) / d log(input)``.

    Attributes:
      hardware, model, workload: pytrees shaped like the inputs holding the elasticities (e.g.
        ``.hardware.hbm_bandwidth``); a batched problem gives them its batch axis.
      limits: ``{constraint: d log(optimal cost) / d log(limit)}`` (``= -lambda``).
    """

    hardware: Hardware
    model: Model
    workload: Workload
    limits: dict

    def ranked(self, top: int | None = None) -> list[tuple[str, float]]:
        """``[(name, elasticity), ...]``, largest magnitude first, zeros dropped (a single
        scenario), as ``Sensitivity.ranked``."""
        return Sensitivity.ranked(cast(Sensitivity, self), top)


def envelope(problem: Problem, solution: Solution) -> Envelope:
    """Elasticities of the optimal cost at ``optimize``'s continuous optimum (module docstring).

    Args:
      problem: the problem ``solution`` solves.
      solution: ``dcost.optimize(problem)`` (a grid search has no continuous optimum).

    >>> import dcost
    >>> from dcost.search.envelope import envelope
    >>> p = dcost.Problem(dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"),
    ...                   dcost.Workload(2048), free={"batch": (1, 4096)}, tpot_slo=0.02)
    >>> e = envelope(p, dcost.optimize(p))
    >>> round(float(e.hardware.price_per_hour), 4)  # cost is proportional to the price
    1.0
    """
    if not isinstance(problem, Problem) or not isinstance(solution, Solution):
        raise SpecError(
            "envelope(problem, solution) takes a dcost.Problem and the dcost.Solution that "
            f"dcost.optimize gave for it, got {type(problem).__name__}, {type(solution).__name__}"
        )
    stats = solution.stats
    return _envelope(
        problem, stats.continuous_x, solution.lambdas, stats.smoothness, batch_size(problem)
    )


def _one(problem: Problem, v, lambdas, smoothness) -> Envelope:
    inputs = (problem.hardware, problem.model, problem.workload)

    def lagrangian(parts):
        p = eqx.tree_at(lambda q: (q.hardware, q.model, q.workload), problem, parts)
        ev = evaluate(p, v, smoothness)
        return jnp.log(ev.cost) + jnp.dot(lambdas, ev.log_ratios)

    grads = jax.grad(lagrangian)(inputs)
    hw, model, work = jax.tree.map(lambda g, x: g * x, grads, inputs)  # in log(field)
    limits = {name: -lambdas[j] for j, name in enumerate(problem.constraints)}
    return Envelope(hardware=hw, model=model, workload=work, limits=limits)


@functools.partial(jit, static_argnames=("batch",))
def _envelope(problem, v, lambdas, smoothness, batch):
    if batch is None:
        return _one(problem, v, lambdas, smoothness)
    return jax.vmap(_one)(broadcast(problem, batch), v, lambdas, smoothness)
