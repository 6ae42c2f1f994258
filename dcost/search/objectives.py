"""What a search minimizes: objectives as values, each a pure function of a design.

An objective maps ``(design, problem, smoothness)`` to its cost and to the *quantities* that
constraints bound (``tpot`` in s, ``ttft`` in s, ``memory`` in bytes per chip, ``replica_chips``
``P*G``, ``loss`` in nats). ``dcost.Problem`` holds one as a static field and pairs its quantities
with their limits; the optimizer and the grid search only ever call ``problem.objective.evaluate``.

The built-in objectives are the constants ``COST_PER_TOKEN`` ($ per output token, decode),
``COST_PER_INPUT_TOKEN`` ($ per input token, prefill), ``LIFETIME_COST`` ($ of pretraining + RL
+ inference, ``dcost.search.lifetime_objective``) and ``TCO`` ($ per output token of owned chips,
electricity at the step's own power, ``dcost.pricing.ownership``); ``BUILTIN`` maps their names
to them (read only), which is how ``Problem(objective="cost_per_token")`` resolves a string
(``resolve``).

Writing an objective: ``evaluate(design, problem, smoothness) -> (cost, quantities, report)`` from
pure JAX (``quantities`` holding every constraint it bounds, e.g. ``"loss"`` for ``loss_target``;
objective-specific inputs come from ``problem.extras``, whose leaves are numbers or arrays with the
problem's batch axis), then pass ``Objective(name, unit, evaluate, variables, constraints)`` as
``Problem(objective=...)``. ``batch_monotone=True`` only when cost never rises and no constraint
quantity ever falls as the batch grows (the integer search relies on it).

>>> import dcost
>>> from dcost.search import objectives
>>> sorted(objectives.BUILTIN)
['cost_per_input_token', 'cost_per_token', 'lifetime_cost', 'tco']
>>> objectives.resolve("cost_per_token") is objectives.COST_PER_TOKEN
True
>>> print(objectives.COST_PER_TOKEN)
cost_per_token
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import MappingProxyType

from dcost.search import lifetime_objective
from dcost.serving.roofline import SECONDS_PER_HOUR, decode, prefill
from dcost.specs import SpecError

__all__ = [
    "Objective",
    "COST_PER_TOKEN",
    "COST_PER_INPUT_TOKEN",
    "LIFETIME_COST",
    "TCO",
    "BUILTIN",
    "resolve",
]


@dataclass(frozen=True)
class Objective:
    """What a search minimizes: a frozen, hashable value (``Problem`` keeps it static).

    Attributes:
      name: a short name, e.g. ``"cost_per_token"`` (printed, and used in reports).
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
      prefill: True when the cost is that of a prefill pass, so that ``prefill_chunk`` changes it
        (other objectives run a prefill only for a ``ttft`` constraint).
    """

    name: str
    unit: str
    evaluate: Callable = field(repr=False)
    variables: frozenset
    constraints: frozenset
    batch_monotone: bool = False
    overtrain_monotone: bool = False
    validate: Callable | None = field(default=None, repr=False)
    prefill: bool = False

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise SpecError(f"Objective.name = {self.name!r} is not allowed: it must be a name")
        if not callable(self.evaluate):
            raise SpecError(f"Objective.evaluate of {self.name!r} must be callable")
        for attr in ("variables", "constraints"):
            value = getattr(self, attr)
            if isinstance(value, str) or not isinstance(value, Iterable):
                raise SpecError(
                    f"Objective.{attr} = {value!r} is not allowed: it must be a set of names"
                )
            object.__setattr__(self, attr, frozenset(value))

    def __str__(self) -> str:
        return self.name


def _replica_chips(design):
    return design.chips_per_replica


def _cost_per_token(design, problem, smoothness) -> tuple:
    """Decode: $ per output token; bounds tpot, ttft (prefill of the same batch), memory and
    chips per replica."""
    h, m, w = problem.hardware, problem.model, problem.workload
    r = decode(design, h, m, w, smoothness)
    q = {"tpot": r.tpot, "memory": r.memory_per_chip, "replica_chips": _replica_chips(design)}
    if problem.ttft_slo is not None:
        q["ttft"] = prefill(design, h, m, w, smoothness).ttft
    return r.cost_per_token, q, r


def _cost_per_input_token(design, problem, smoothness) -> tuple:
    """Prefill: $ per input token; bounds ttft (the prefill pass), memory, chips per replica."""
    r = prefill(design, problem.hardware, problem.model, problem.workload, smoothness)
    q = {"ttft": r.ttft, "memory": r.memory_per_chip, "replica_chips": _replica_chips(design)}
    return r.cost_per_token, q, r


_SERVING = frozenset({"batch", "chips", "stages", "experts"})
_LAYOUT = frozenset({"attention_dp", "dispatch_dedup", "redundant_experts", "prefill_chunk"})
"""Serving model v2's layout variables every serving objective takes (``prefill_chunk`` acts on
a decode objective through its ``ttft`` constraint); decode adds ``draft_tokens``."""

COST_PER_TOKEN = Objective(
    "cost_per_token",
    "$ per output token",
    _cost_per_token,
    _SERVING | _LAYOUT | {"draft_tokens"},
    frozenset({"tpot", "ttft", "memory", "replica_chips"}),
    batch_monotone=True,
)
"""$ per output token of decode (``dcost.decode``); its report is a ``dcost.Report``."""

COST_PER_INPUT_TOKEN = Objective(
    "cost_per_input_token",
    "$ per input token",
    _cost_per_input_token,
    _SERVING | _LAYOUT,
    frozenset({"ttft", "memory", "replica_chips"}),
    batch_monotone=True,
    prefill=True,
)
"""$ per input token of prefill (``dcost.prefill``); its report is a ``dcost.PrefillReport``."""

LIFETIME_COST = Objective(
    "lifetime_cost",
    "$ over the model's life (pretraining + RL + inference)",
    lifetime_objective.evaluate,
    _SERVING | _LAYOUT | {"draft_tokens", "overtrain"},
    frozenset({"tpot", "ttft", "memory", "replica_chips", "loss"}),
    # pretraining $ and the loss do not depend on the batch; the rest is cost_per_token's.
    # Over-training raises pretraining $ and lowers the loss, nothing else.
    batch_monotone=True,
    overtrain_monotone=True,
    validate=lifetime_objective.validate,
)
"""$ of pretraining + RL + inference (``dcost.search.lifetime_objective``); needs
``Problem(extras=dcost.LifetimeInputs(...))``; its report is a ``dcost.LifetimeReport``."""


def _tco(design, problem, smoothness) -> tuple:
    """Decode: $ per output token of owned chips (``dcost.pricing.ownership.tco_per_token``:
    capital, hosting and the step's own electricity); bounds as ``cost_per_token``."""
    from dcost.pricing.ownership import chip_hour_cost
    from dcost.serving.power import energy

    h, m, w = problem.hardware, problem.model, problem.workload
    r = decode(design, h, m, w, smoothness)
    e = energy(design, h, m, w, smoothness)
    per_hour = chip_hour_cost(problem.extras, h, e.power_per_chip).total
    cost = _replica_chips(design) * per_hour / SECONDS_PER_HOUR / r.tokens_per_s
    q = {"tpot": r.tpot, "memory": r.memory_per_chip, "replica_chips": _replica_chips(design)}
    if problem.ttft_slo is not None:
        q["ttft"] = prefill(design, h, m, w, smoothness).ttft
    return cost, q, r


def _validate_tco(problem) -> None:
    """A tco problem needs ``Problem(extras=dcost.Ownership(...))`` and a chip with power."""
    from dcost.pricing.ownership import Ownership
    from dcost.serving.power import require_power

    if not isinstance(problem.extras, Ownership):
        raise SpecError(
            "Problem.extras must be a dcost.Ownership for objective 'tco' (e.g. "
            f"dcost.ownership('h100-sxm')), got {type(problem.extras).__name__}"
        )
    require_power(problem.hardware, "objective 'tco'")


TCO = Objective(
    "tco",
    "$ per output token",
    _tco,
    _SERVING | _LAYOUT | {"draft_tokens"},
    frozenset({"tpot", "ttft", "memory", "replica_chips"}),
    validate=_validate_tco,
)
"""$ per output token of owned chips; needs ``Problem(extras=dcost.Ownership(...))``; its
report is a ``dcost.Report`` (whose ``cost_per_token`` is still the rental price's)."""

BUILTIN = MappingProxyType(
    {o.name: o for o in (COST_PER_TOKEN, COST_PER_INPUT_TOKEN, LIFETIME_COST, TCO)}
)
"""The built-in objectives by name (read only)."""


def resolve(objective) -> Objective:
    """``objective`` itself when it is an ``Objective``; the built-in of that name for a string.

    An unknown name raises SpecError listing the known ones.
    """
    if isinstance(objective, Objective):
        return objective
    if isinstance(objective, str) and objective in BUILTIN:
        return BUILTIN[objective]
    known = ", ".join(sorted(BUILTIN))
    raise SpecError(
        f"Problem.objective = {objective!r} is not allowed: it must be a "
        f"dcost.search.objectives.Objective or one of the names {known}"
    )
