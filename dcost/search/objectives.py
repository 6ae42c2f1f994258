"""What a search minimizes: a registry of objectives, each a pure function of a design.

An objective maps ``(design, problem, smoothness)`` to its cost and to the *quantities* that
constraints bound (``tpot`` in s, ``ttft`` in s, ``memory`` in bytes per chip, ``chips`` per
replica, ``loss`` in nats). ``dcost.Problem`` pairs the quantities with their limits; the
optimizer and the grid search only ever call ``evaluate`` through this registry, so a new
objective plugs in with one ``register`` call (``lifetime_cost`` does, in
``dcost.search.lifetime_objective``):

Adding an objective: write ``evaluate(design, problem, smoothness) -> (cost, quantities, report)``
from pure JAX (``quantities`` holding every constraint it bounds, e.g. ``"loss"`` for
``loss_target``; objective-specific inputs come from ``problem.extras``, whose leaves are numbers
or arrays with the problem's batch axis), and ``register(Objective(name, unit, evaluate,
variables, constraints))``. ``batch_monotone=True`` only when cost never rises and no
constraint quantity ever falls as the batch grows (the integer search relies on it).

>>> import dcost
>>> from dcost.search.objectives import OBJECTIVES
>>> sorted(OBJECTIVES)[:2]
['cost_per_input_token', 'cost_per_token']
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dcost.serving.roofline import Report, decode, prefill

__all__ = ["Objective", "OBJECTIVES", "register", "get"]


@dataclass(frozen=True)
class Objective:
    """One entry of the registry.

    Attributes:
      name: the name a ``Problem`` uses, e.g. ``"cost_per_token"``.
      unit: what ``cost`` is, for people, e.g. ``"$ per output token"``.
      evaluate: ``(design, problem, smoothness) -> (cost, quantities, report)``; ``quantities`` is a
        dict holding at least every name in ``constraints``; ``report`` is a ``dcost.Report`` (or
        any pytree) describing the design. Pure and jit/vmap/grad friendly; ``smoothness = 0`` is
        the exact model.
      variables: the free variables that mean something for this objective.
      constraints: the constraints it can evaluate (names of ``dcost.search.problem.CONSTRAINTS``).
      batch_monotone: True when, with every other variable held, the cost never rises and no
        constraint quantity ever falls as ``batch`` grows; the integer search then takes the
        largest feasible batch by bisection.
      overtrain_monotone: True when, with every other variable held, the cost never falls and no
        constraint quantity ever rises as ``overtrain`` grows; the integer search then takes the
        smallest feasible over-training by bisection.
      validate: ``problem -> None``, called when a ``Problem`` is built; raises ``SpecError`` on
        inputs the objective cannot use (e.g. missing ``extras``). None: nothing to check.
    """

    name: str
    unit: str
    evaluate: Callable
    variables: frozenset
    constraints: frozenset
    batch_monotone: bool = False
    overtrain_monotone: bool = False
    validate: Callable | None = None


OBJECTIVES: dict[str, Objective] = {}


def register(objective: Objective) -> Objective:
    """Add (or replace) an objective in the registry; returns it."""
    OBJECTIVES[objective.name] = objective
    return objective


def get(name: str) -> Objective:
    """The registered objective ``name``; an unknown name raises ValueError listing the known."""
    if name not in OBJECTIVES:
        known = ", ".join(sorted(OBJECTIVES))
        raise ValueError(
            f"Problem.objective = {name!r} is not allowed: known objectives are {known}"
        )
    return OBJECTIVES[name]


def _chips(design):
    return design.chips * design.stages


def _cost_per_token(design, problem, smoothness) -> tuple:
    """Decode: $ per output token; bounds tpot, ttft (prefill of the same batch), memory, chips."""
    h, m, w = problem.hardware, problem.model, problem.workload
    r: Report = decode(design, h, m, w, smoothness)
    q = {"tpot": r.tpot, "memory": r.memory_per_chip, "chips": _chips(design)}
    if problem.ttft_slo is not None:
        q["ttft"] = prefill(design, h, m, w, smoothness).tpot
    return r.cost_per_token, q, r


def _cost_per_input_token(design, problem, smoothness) -> tuple:
    """Prefill: $ per input token; bounds ttft (the prefill pass), memory, chips."""
    r: Report = prefill(design, problem.hardware, problem.model, problem.workload, smoothness)
    q = {"ttft": r.tpot, "memory": r.memory_per_chip, "chips": _chips(design)}
    return r.cost_per_token, q, r


_SERVING = frozenset({"batch", "chips", "stages", "experts"})

register(
    Objective(
        "cost_per_token",
        "$ per output token",
        _cost_per_token,
        _SERVING,
        frozenset({"tpot", "ttft", "memory", "chips"}),
        batch_monotone=True,
    )
)
register(
    Objective(
        "cost_per_input_token",
        "$ per input token",
        _cost_per_input_token,
        _SERVING,
        frozenset({"ttft", "memory", "chips"}),
        batch_monotone=True,
    )
)
