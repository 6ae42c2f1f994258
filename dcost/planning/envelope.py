"""What the bill does when an input moves: the envelope theorem on the planner's relaxation.

For a plan's layouts held fixed, relax each pool's replica count to a real number: ``n*(x)`` is
the least ``n`` with every constraint met, the root of the binding one,
``h_j(n*, x) = log(value_j/limit_j) = 0``. The relaxed bill is
``$(x) = p sum_pools n*_i P_i G_i``, and by the implicit function theorem

.. math:: \\frac{d \\log n^*}{d \\log x} = -\\frac{\\partial h_j / \\partial \\log x}
          {\\partial h_j / \\partial \\log n}

at the root (the envelope theorem for ``min n s.t. h(n, x) <= 0``: only the binding constraint's
direct dependence on ``x`` counts, the layout's response is second order). The bill's
elasticity is the pools' share-weighted sum, plus 1 for the chip price. Every input is
covered at once, by ``jax.grad`` through the step tables, the latency closed forms and the
constraints: the hardware and model fields, the traffic's rate, lengths and spreads, and the
latency targets. ``tests/test_plan.py`` checks them against re-solving the relaxation with a
perturbed input. The whole-replica bill moves in steps; ``dcost.plan`` at the perturbed input
gives that (``what_if`` predicts the relaxed bill's share of it).
"""

from __future__ import annotations

import dataclasses
import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost.planning import search as S
from dcost.planning.designs import Layout, step_table, workload_of
from dcost.search._jit import jit
from dcost.serving.moe import profiled_routing
from dcost.specs import Hardware, Model, SpecError, check

__all__ = ["plan_sensitivity", "PlanSensitivity", "relaxed_replicas"]

_BISECTIONS = 28  # [log 0.05, log 4n] to 2^-28 of its width: below float32 ulp of log n
_FLOOR = 0.05  # the fewest (relaxed) replicas the root is looked for from


def _ratios(kind, layout, log_n, hardware, model, traffic, limits, consts):
    ttft_q, tpot_q, acceptance, imbalance = consts
    work = workload_of(traffic, kind, acceptance, imbalance)
    table = step_table(layout, hardware, model, work, kind)
    targets = S.Targets(
        limits["ttft_slo"],
        limits["tpot_slo"],
        limits["memory_reserve"],
        limits["slot_wait"],
        limits["max_utilisation"],
        limits["max_prefill_utilisation"],
        ttft_q,
        tpot_q,
    )
    ratios, _ = S.evaluate(
        kind, layout, table, jnp.exp(log_n), traffic, targets, hardware, model, relaxed=True
    )
    return ratios


def _root(kind, layout, n, hardware, model, traffic, limits, consts):
    """``log n*``: bisection on ``max_j h_j`` in ``log n`` over ``[log 0.05, log 4n]``."""

    def worst(x):
        return jnp.max(_ratios(kind, layout, x, hardware, model, traffic, limits, consts))

    def body(_, ab):
        a, b = ab
        mid = 0.5 * (a + b)
        ok = worst(mid) <= 0.0
        return jnp.where(ok, a, mid), jnp.where(ok, mid, b)

    dtype = jnp.result_type(float)
    lo, hi = jnp.log(jnp.asarray(_FLOOR, dtype)), jnp.log(4.0 * jnp.asarray(n, dtype))
    _, b = jax.lax.fori_loop(0, _BISECTIONS, body, (lo, hi))
    return b


# bisections of the closed forms and a gradient, at XLA's level 0: a pool's call runs about 3x
# slower there (0.11 s against 0.04 s, llama-3-70b chat on H100) but compiles in half the time
# (13.1 s against 24.7 s on 2 cores), and a plan's elasticities are asked for once
@functools.partial(jit, static_argnames=("kind", "consts"), fast_compile=True)
def _pool(kind, layout, n, hardware, model, traffic, limits, consts):
    x = jax.lax.stop_gradient(_root(kind, layout, n, hardware, model, traffic, limits, consts))

    def every(x, hardware, model, traffic, limits):
        return _ratios(kind, layout, x, hardware, model, traffic, limits, consts)

    # one forward pass gives the constraints and, pulled back along the binding one, its gradient
    ratios, pull = jax.vjp(every, x, hardware, model, traffic, limits)
    j = jnp.argmax(ratios)
    dx, dh, dm, dt, dl = pull(jax.nn.one_hot(j, ratios.shape[0], dtype=ratios.dtype))
    at_floor = x <= jnp.log(_FLOOR) + 1e-3
    scale = jnp.where(at_floor | (dx >= 0), 0.0, -1.0 / jnp.where(dx < 0, dx, -1.0))

    def elastic(value, grad):
        if value is None or grad is None:
            return None
        return scale * value * grad

    eh = jax.tree.map(elastic, hardware, dh)
    em = jax.tree.map(elastic, model, dm)
    et = jax.tree.map(elastic, traffic, dt)
    el = {k: elastic(limits[k], dl[k]) for k in limits}
    return jnp.exp(x), j, eh, em, et, el


def relaxed_replicas(plan, hardware=None, model=None, traffic=None, **limits) -> np.ndarray:
    """The relaxed replica counts ``n*`` of a plan's pools (their layouts held), for changed
    inputs: the re-solve that ``plan_sensitivity`` is checked against.

    Args:
      plan: a feasible ``dcost.Plan``.
      hardware, model, traffic: replacements for the plan's (default: its own).
      **limits: replacements among ``ttft_slo``, ``tpot_slo`` (seconds), ``memory_reserve``,
        ``slot_wait``, ``max_utilisation``, ``max_prefill_utilisation``.
    """
    return np.asarray([r[0] for r in _solve(plan, hardware, model, traffic, limits)])


def _limits(plan, changes) -> dict:
    rho = S.MAX_UTILISATION if plan.max_utilisation is None else None
    base = {
        "ttft_slo": plan.ttft_slo[0],
        "tpot_slo": plan.tpot_slo[0],
        "memory_reserve": plan.memory_reserve,
        "slot_wait": plan.slot_wait,
        "max_utilisation": rho["aggregated"] if rho else plan.max_utilisation,
        "max_prefill_utilisation": rho["prefill"] if rho else plan.max_utilisation,
    }
    unknown = set(changes) - set(base)
    if unknown:
        raise SpecError(f"unknown limit(s) {sorted(unknown)}; known: {sorted(base)}")
    base.update(changes)
    dtype = jnp.result_type(float)
    return {k: jnp.asarray(float(v), dtype) for k, v in base.items()}


def _solve(plan, hardware, model, traffic, changes):
    from dcost.planning.planner import Plan

    if not isinstance(plan, Plan) or not plan.feasible:
        raise SpecError("plan_sensitivity needs a feasible dcost.Plan")
    hardware = plan.hardware if hardware is None else hardware
    model = plan.model if model is None else model
    traffic = plan.traffic if traffic is None else traffic
    if not isinstance(hardware, Hardware) or not isinstance(model, Model):
        raise SpecError("plan_sensitivity: hardware and model must be dcost specs")
    traffic = jax.tree.map(lambda x: jnp.asarray(x, jnp.result_type(float)), traffic)
    limits = _limits(plan, changes)
    acc = None if plan.acceptance is None else float(plan.acceptance)
    # the expert load of the chip the plan is re-solved on, as the planner took it
    imbalance = profiled_routing(not hardware.pure, model)
    consts = (plan.ttft_slo[1], plan.tpot_slo[1], acc, imbalance)
    out = []
    for pool in plan.pools:
        layout = Layout(
            pool.chips_per_stage, pool.stages, pool.attention_dp, pool.chunk, pool.draft_tokens
        )
        # the replica count as an array, not a Python float: a program with a Python scalar
        # argument runs as the plain jit, never kept in dcost's program store
        n = jnp.asarray(float(pool.replicas), jnp.result_type(float))
        res = _pool(pool.role, layout, n, hardware, model, traffic, limits, consts)
        out.append(jax.tree.map(np.asarray, res))
    return out


@dataclasses.dataclass(frozen=True)
class PlanSensitivity:
    """Elasticities of a plan's relaxed bill, ``d log($/hour) / d log(x)``.

    Attributes:
      hardware, model, traffic: pytrees of the inputs' shape holding the elasticity of every
        field (``price_per_hour`` is 1: the bill is linear in it).
      limits: ``{name: elasticity}`` for the latency targets (``ttft_slo``, ``tpot_slo``, in
        seconds) and the headroom limits.
      replicas: the relaxed replica count ``n*`` per pool.
      binding: the constraint that is zero at ``n*`` per pool.
      chips: ``sum n* P G``, the relaxed fleet.
    """

    hardware: Hardware
    model: Model
    traffic: object
    limits: dict
    replicas: tuple[float, ...]
    binding: tuple[str, ...]
    chips: float

    def what_if(self, name: str, factor: float) -> float:
        """Predicted relative change of the relaxed bill when input ``name`` (a field of the
        hardware, model or traffic, or a limit) is multiplied by ``factor``: ``factor**e - 1``.

        >>> PlanSensitivity(None, None, None, {"tpot_slo": -0.5}, (), (), 0.0).what_if(
        ...     "tpot_slo", 4.0)
        -0.5
        """
        e = self.elasticity(name)
        check("what_if", "factor", factor, low_open=True)  # a ratio: 0 or below has no power
        return float(float(factor) ** e - 1.0)

    def elasticity(self, name: str) -> float:
        """The elasticity of input ``name``."""
        if name in self.limits:
            return float(self.limits[name])
        for part in (self.hardware, self.traffic, self.model):
            if part is not None and hasattr(part, name) and getattr(part, name) is not None:
                return float(getattr(part, name))
        known = sorted(
            set(self.limits)
            | {
                k
                for part in (self.hardware, self.model, self.traffic)
                if part is not None
                for k in vars(part)
                if getattr(part, k) is not None
            }
        )
        raise SpecError(
            f"what_if.name = {name!r} is not allowed: no input of the plan has that name; "
            f"known: {', '.join(known)}"
        )


def plan_sensitivity(plan) -> PlanSensitivity:
    """``d log($/hour) / d log(x)`` of a plan's relaxed bill for every input, by the envelope
    theorem (see the module docstring).

    The example is not run with the doctests (the gradient through the closed forms compiles
    for about 20 s; ``tests/test_plan.py`` runs it, marked slow):

    >>> import dcost
    >>> from dcost.planning import plan_sensitivity
    >>> h100 = dcost.hardware("h100-sxm", calibrated=True)
    >>> p = dcost.plan(h100, "llama-3-70b", dcost.traffic("chat", rate=60.0))
    >>> s = plan_sensitivity(p)  # doctest: +SKIP
    >>> round(s.elasticity("price_per_hour"), 6), s.elasticity("rate") > 0  # doctest: +SKIP
    (1.0, True)
    """
    res = _solve(plan, None, None, None, {})
    chips = [float(r[0]) * p.chips_per_replica for r, p in zip(res, plan.pools, strict=True)]
    total = sum(chips)
    weights = [c / total for c in chips] if total > 0 else [0.0 for _ in chips]

    def combine(k):
        parts = [r[k] for r in res]

        def mix(*xs):
            if any(x is None for x in xs):
                return None
            return float(sum(w * x for w, x in zip(weights, xs, strict=True)))

        return jax.tree.map(mix, *parts, is_leaf=lambda x: x is None)

    hardware = _with_price(combine(2))
    limits = {
        k: float(sum(w * float(r[5][k]) for w, r in zip(weights, res, strict=True)))
        for k in res[0][5]
    }
    binding = tuple(S.CONSTRAINTS[int(r[1])] for r in res)
    return PlanSensitivity(
        hardware=hardware,
        model=combine(3),
        traffic=combine(4),
        limits=limits,
        replicas=tuple(float(r[0]) for r in res),
        binding=binding,
        chips=float(total),
    )


def _with_price(hardware):
    """The price's elasticity is 1 (the bill is ``n P G p``; no constraint depends on it)."""
    return eqx.tree_at(lambda h: h.price_per_hour, hardware, 1.0)
