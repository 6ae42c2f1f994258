"""Gradient search for the cheapest design: smooth log-space relaxation, then exact integer polish.

1. *Continuous*: the free variables live in log space with their bounds built in,
   ``v = lo*(hi/lo)**sigmoid(z)``. From a few starting points at once (vmapped), Adam (optax)
   minimizes the augmented Lagrangian of ``log cost`` and the constraints scaled to their budgets,
   ``c_j = log(value_j/limit_j) <= 0``, inside ``jax.lax.scan``::

       L(z, lam) = log cost(v) + sum_j (max(0, lam_j + rho*c_j)**2 - lam_j**2) / (2*rho)

   after every round the multipliers step ``lam_j <- max(0, lam_j + rho*c_j)``, the penalty
   ``rho`` grows and the smoothness of the model anneals towards 0.
2. *Integer*: every start's optimum is rounded to its ``2**d`` neighbouring integer designs
   (floor/ceil per variable), which are evaluated with the **exact** model; when the objective is
   monotone in batch (serving: cost per token never rises and no constraint ever eases as the
   batch grows) each candidate takes the largest feasible batch by bisection; when it is monotone
   in over-training (``lifetime_cost``: dollars rise and the loss falls with ``r``) each candidate
   then takes the smallest feasible ``r`` by bisection (the batch first, at the largest ``r``).
   A few rounds of exact local search follow (from the best design: every combination of
   -1/0/+1 over the variables, and strides of 2, 4 and 8 along each). The cheapest feasible
   design wins, infeasible ones ranked by their total violation; a result never claims
   feasibility that the exact model does not confirm.
3. *Shadow prices*: least-squares multipliers from stationarity at the best continuous point
   (``dcost.search.kkt.guess``); ``dcost.sensitivity`` polishes that point to a KKT point first.

Two jitted programs, each vmapped over the scenarios of a batched problem: step 1, then steps 2
and 3 (``_relax``, ``_round``; split so that a later process reads them from ``dcost._programs``
on two cores at once, and an empty cache compiles them side by side).
References: Nocedal & Wright, "Numerical Optimization" (2006), 17.4 (augmented Lagrangian for
inequalities); Kingma & Ba, "Adam" (2015).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost import _programs
from dcost.bisection import bisect, ceil_midpoint, floor_midpoint, steps_for
from dcost.search import kkt
from dcost.search._jit import jit
from dcost.search.buckets import bucketed
from dcost.search.problem import (
    SEARCH_RTOL,
    Problem,
    better,
    broadcast,
    evaluate,
    from_search,
    on_shared_form,
    repair,
    to_search,
)
from dcost.search.solution import Solution, Stats, finish
from dcost.smooth import MAX_SMOOTHNESS
from dcost.specs import SpecError, check

__all__ = [
    "optimize",
    "Settings",
    "to_unconstrained",
    "from_unconstrained",
    "solve_continuous",
    "best_continuous",
    "Continuous",
]


class Settings(NamedTuple):
    """Knobs of ``optimize`` (static: a new value compiles anew).

    Attributes:
      starts: starting points of the continuous search (a Halton set in the unit box).
      rounds: augmented-Lagrangian rounds (multiplier updates).
      steps: Adam steps per round.
      learning_rate: (first, last) Adam step in ``z``, geometric in between.
      smoothness: (first, last) smoothness of the model, geometric in between; each in
        ``(0, dcost.smooth.MAX_SMOOTHNESS]`` = ``(0, 1]``.
      penalty: (first, last) penalty ``rho``, geometric in between.
      local_rounds: rounds of exact local search after rounding.
    """

    starts: int = 8
    rounds: int = 12
    steps: int = 25
    learning_rate: tuple = (0.3, 0.01)
    smoothness: tuple = (0.1, 0.003)
    penalty: tuple = (10.0, 1000.0)
    local_rounds: int = 4


DEFAULT = Settings()


def check_settings(owner: str, settings) -> None:
    """Raise SpecError naming the field unless ``settings`` is a ``Settings`` the search can run:
    whole ``starts``, ``rounds``, ``steps`` >= 1 and ``local_rounds`` >= 0; ``(first, last)`` pairs
    of finite positive ``learning_rate`` and ``penalty``, and ``smoothness`` in ``(0, 1]``."""
    if not isinstance(settings, Settings):
        raise SpecError(
            f"{owner}.settings must be a dcost.search.optimize.Settings, "
            f"got {type(settings).__name__}"
        )
    where = f"{owner}.settings"
    for name in ("starts", "rounds", "steps", "local_rounds"):
        value = getattr(settings, name)
        if not isinstance(value, (int, np.integer)) or isinstance(value, bool):
            raise SpecError(
                f"{where}.{name} = {value!r} is not allowed: it must be a whole number (an int)"
            )
        check(where, name, value, low=0.0 if name == "local_rounds" else 1.0, integer=True)
    for name in ("learning_rate", "smoothness", "penalty"):
        pair = getattr(settings, name)
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise SpecError(
                f"{where}.{name} = {pair!r} is not allowed: it must be a pair (first, last)"
            )
        high = MAX_SMOOTHNESS if name == "smoothness" else None
        for value in pair:
            check(where, name, value, low_open=True, high=high)


def from_unconstrained(z, lower, upper):
    """``v = lo*(hi/lo)**sigmoid(z)``: any real ``z`` maps into ``[lo, hi]``, log-uniformly.

    >>> float(from_unconstrained(0.0, 1.0, 100.0))
    10.0
    """
    lower, upper = jnp.asarray(lower), jnp.asarray(upper)
    v = lower * jnp.exp(jax.nn.sigmoid(z) * jnp.log(upper / lower))
    return jnp.clip(v, lower, upper)


def to_unconstrained(v, lower, upper, margin=1e-4):
    """Inverse of ``from_unconstrained`` (``v`` at a bound maps ``margin`` inside it).

    >>> round(float(from_unconstrained(to_unconstrained(37.0, 1.0, 4096.0), 1.0, 4096.0)), 3)
    37.0
    """
    lower, upper = jnp.asarray(lower), jnp.asarray(upper)
    span = jnp.log(upper / lower)
    wide = span > 0
    u = jnp.where(wide, jnp.log(jnp.asarray(v) / lower) / jnp.where(wide, span, 1.0), 0.5)
    u = jnp.clip(u, margin, 1.0 - margin)
    return jnp.log(u) - jnp.log1p(-u)


def _halton(n: int, d: int) -> np.ndarray:
    """The first ``n`` points of the Halton sequence in ``(0, 1)**d`` (deterministic starts)."""
    primes = [2, 3, 5, 7, 11, 13, 17, 19, 23, 29][:d]
    out = np.empty((n, d))
    for j, base in enumerate(primes):
        for i in range(n):
            f, r, k = 1.0, 0.0, i + 1
            while k:
                f /= base
                r += f * (k % base)
                k //= base
            out[i, j] = r
    return out


class Continuous(eqx.Module):
    """Optimum of the smooth relaxation from one start.

    Attributes:
      z: unconstrained variables; ``v`` the free variables ``from_unconstrained(z)``.
      lambdas: the augmented-Lagrangian multipliers, ``-d log cost / d log limit`` per constraint.
      log_cost: ``log cost(v)`` of the smooth model at ``smoothness``.
      log_ratios: ``log(value/limit)`` per constraint there.
      jac: gradients in ``z`` of ``log cost`` and of every ``log_ratios`` there, ``(1 + n_c, d)``.
      smoothness: the last smoothness of the annealing.
    """

    z: jax.Array
    v: jax.Array
    lambdas: jax.Array
    log_cost: jax.Array
    log_ratios: jax.Array
    jac: jax.Array
    smoothness: jax.Array


def _free(z, problem):
    """The free variables at ``z``: ``from_unconstrained`` in the search's coordinates (shifted
    by ``problem.offsets``, so that a variable whose 0 means off reaches 0), shifted back."""
    return from_search(problem, from_unconstrained(z, problem.search_lower, problem.search_upper))


def _objective(z, lam, rho, smoothness, mode, weights, problem):
    """``mode * L(z, lam) + weights . (log cost, log ratios)``: the augmented Lagrangian in the
    search's steps (``mode = 1``, ``weights = 0``), one row of the Jacobian in the last steps
    (``mode = 0``, ``weights`` a unit vector); one function, so one copy of the model compiles."""
    v = _free(z, problem)
    ev = evaluate(problem, v, smoothness)
    f, c = jnp.log(ev.cost), ev.log_ratios
    penalty = jnp.square(jnp.maximum(0.0, lam + rho * c)) - jnp.square(lam)
    augmented = f + jnp.sum(penalty) / (2.0 * rho)
    return mode * augmented + weights[0] * f + jnp.dot(weights[1:], c), (f, c)


def _schedule(settings: Settings, n_c: int):
    """Per-step (smoothness, rho, learning rate, update multipliers?, mode, weights): the
    ``rounds*steps`` steps of the search, then ``1 + n_c`` steps with learning rate 0 that take
    the Jacobian of ``(log cost, log ratios)`` at the end point, one row each."""
    n, k, m = settings.rounds, settings.steps, 1 + n_c

    def rep(pair: tuple[float, float]) -> np.ndarray:
        first, last = pair
        per_round = np.geomspace(first, last, n) if n > 1 else np.array([last])
        return np.append(np.repeat(per_round, k), np.full(m, last))

    lr = rep(settings.learning_rate)
    lr[-m:] = 0.0
    update = np.append(np.tile(np.arange(k) == k - 1, n), np.zeros(m, bool))
    mode = np.append(np.ones(n * k), np.zeros(m))
    weights = np.concatenate([np.zeros((n * k, m)), np.eye(m)])
    return rep(settings.smoothness), rep(settings.penalty), lr, update, mode, weights


def solve_continuous(problem: Problem, z0, settings: Settings = DEFAULT) -> Continuous:
    """Augmented-Lagrangian Adam on the smooth relaxation of one scenario from one start ``z0``.

    One ``lax.scan`` of ``rounds*steps`` Adam steps on ``L(z, lam)``; the multipliers step every
    ``steps`` steps. Pure and jit/vmap friendly; ``optimize`` runs many starts at once
    (``_solve_starts``, the same steps).
    """
    return jax.tree.map(lambda a: a[0], _solve_starts(problem, jnp.asarray(z0)[None], settings))


def _solve_starts(problem: Problem, z0, settings: Settings) -> Continuous:
    """``solve_continuous`` from every row of ``z0`` (``(starts, d)``), in one scan whose step
    evaluates the model at every start (``vmap`` inside the step): the scan itself is never
    batched, so tracing it does not batch the model's gradient over and over (JAX batches a
    scan's body until its carry's batched parts settle). Adam and the multipliers act
    elementwise, so each start takes exactly the steps it would alone."""
    dtype = jnp.result_type(float)
    n_c = len(problem.constraints)
    sched = tuple(
        jnp.asarray(a, bool if a.dtype == bool else dtype) for a in _schedule(settings, n_c)
    )
    import optax  # here, not at the top: a search loaded from dcost._programs never traces

    adam = optax.scale_by_adam()
    value_and_grad = jax.vmap(
        jax.value_and_grad(_objective, has_aux=True), in_axes=(0, 0, None, None, None, None, None)
    )

    def step(carry, sched_t):
        z, state, lam, _, _, jac = carry
        s, rho, lr, update, mode, weights = sched_t
        (_, (f, c)), g = value_and_grad(z, lam, rho, s, mode, weights, problem)
        g = jnp.where(jnp.isfinite(g), g, 0.0)
        updates, state = adam.update(g, state)
        lam = jnp.where(update, jnp.maximum(0.0, lam + rho * c), lam)
        jac = jnp.where(weights[None, :, None] > 0, g[:, None, :], jac)
        return (z - lr * updates, state, lam, f, c, jac), None

    z0 = jnp.asarray(z0, dtype)
    n = z0.shape[0]
    init = (
        z0,
        adam.init(z0),
        jnp.zeros((n, n_c), dtype),
        jnp.zeros((n,), dtype),
        jnp.zeros((n, n_c), dtype),
        jnp.zeros((n, 1 + n_c, z0.shape[1]), dtype),
    )
    (z, _, lam, f, c, jac), _ = jax.lax.scan(step, init, sched)
    return Continuous(
        z=z,
        v=jax.vmap(lambda zi: _free(zi, problem))(z),
        lambdas=lam,
        log_cost=f,
        log_ratios=c,
        jac=jac,
        smoothness=jnp.broadcast_to(sched[0][-1], (n,)),
    )


def _max_batch(problem, x, i_batch, lo, hi):
    """``x`` with the largest feasible batch in ``[lo, hi]``, by bisection (valid because no
    constraint eases as the batch grows), and that design's (violation, cost). When even ``lo`` is
    infeasible, ``lo`` (the least violation)."""

    def infeasible(b):
        return ~evaluate(problem, x.at[i_batch].set(b), rtol=SEARCH_RTOL).feasible

    dt = x.dtype
    good, _ = bisect(
        infeasible,
        jnp.asarray(lo, dt),
        jnp.asarray(hi + 1.0, dt),
        steps_for(hi - lo + 1),
        floor_midpoint,
    )
    return _scored(problem, x.at[i_batch].set(good))


def _min_var(problem, x, i, lo, hi):
    """``x`` with the smallest feasible value of variable ``i`` in ``[lo, hi]``, by bisection
    (valid when no constraint tightens as it grows: over-training only lowers the loss), and that
    design's (violation, cost). When even ``hi`` is infeasible, ``hi`` (the least violation)."""

    def feasible(v):
        return evaluate(problem, x.at[i].set(v), rtol=SEARCH_RTOL).feasible

    dt = x.dtype
    _, good = bisect(
        feasible,
        jnp.asarray(lo - 1.0, dt),
        jnp.asarray(hi, dt),
        steps_for(hi - lo + 1),
        ceil_midpoint,
    )
    return _scored(problem, x.at[i].set(good))


def _scored(problem, x):
    """``(x, violation, cost)`` of a design vector, NaN costs ranked last."""
    ev = evaluate(problem, x, rtol=SEARCH_RTOL)
    return x, ev.violation, _finite(ev.cost)


def _finite(a):
    return jnp.where(jnp.isnan(a), jnp.inf, a)


def _stencil(d: int, moving: list[int]) -> np.ndarray:
    """Moves of the exact local search: every combination of -1/0/+1 over the moving variables
    (the first row stays put), and longer strides of 2, 4 and 8 along each one."""
    if not moving:
        return np.zeros((1, d))
    box = np.array(np.meshgrid(*[[0, 1, -1]] * len(moving), indexing="ij"))
    steps = np.zeros((3 ** len(moving), d))
    steps[:, moving] = box.reshape(len(moving), -1).T
    long = [np.eye(d)[j] * s for j in moving for s in (2, -2, 4, -4, 8, -8)]
    return np.concatenate([steps, np.array(long).reshape(-1, d)])


def _integer_search(problem: Problem, v_starts, settings: Settings):
    """Round every start to its 2**d integer neighbours, then exact local search; the best design.

    One ``lax.scan`` over ``1 + local_rounds`` rounds of a fixed number of candidates each (round 0:
    the roundings; later rounds: the best design and its neighbours one step away in every
    variable), so the exact model appears once in the compiled program.
    """
    lo, hi = problem.lower, problem.upper
    d = len(lo)
    names = problem.names
    monotone = problem.objective.batch_monotone and "batch" in names
    i_batch = names.index("batch") if monotone else None
    shrink = problem.objective.overtrain_monotone and "overtrain" in names
    i_over = names.index("overtrain") if shrink else None
    # batch is re-maximized and over-training re-minimized, never moved
    moving = [j for j in range(d) if j not in (i_batch, i_over)]
    corners = np.array(np.meshgrid(*[[0, 1]] * d, indexing="ij")).reshape(d, -1).T
    for i in (i_batch, i_over):
        if i is not None:
            corners = corners[corners[:, i] == 0]
    dtype = v_starts.dtype
    cand0 = jnp.floor(v_starts)[:, None, :] + jnp.asarray(corners, dtype)[None]
    cand0 = jnp.clip(cand0.reshape(-1, d), lo, hi)
    stencil = _stencil(d, moving)
    size = max(cand0.shape[0], stencil.shape[0])
    cand0 = jnp.concatenate([cand0, jnp.repeat(cand0[:1], size - cand0.shape[0], 0)])
    steps = jnp.asarray(np.concatenate([stencil, np.zeros((size - stencil.shape[0], d))]), dtype)
    # a variable that must divide another (or be its multiple) is moved to the nearest valid
    # value on the side its rounding (floor: down, ceil: up) or its step took
    i_fix = None if problem.divides is None else names.index(problem.divides)
    if i_fix is not None:
        up0 = np.tile(corners[:, i_fix], v_starts.shape[0])
        dir0 = jnp.asarray(np.concatenate([2.0 * up0 - 1.0, np.full(size - up0.size, -1.0)]))
        dirs = jnp.sign(steps[:, i_fix])

    def score(x, direction):
        if i_fix is not None:
            x, ok = repair(problem, x, direction)
        if shrink:  # the batch is maximized where the over-training eases every constraint most
            x = x.at[i_over].set(hi[i_over])
        if monotone:
            x, viol, cost = _max_batch(problem, x, i_batch, lo[i_batch], hi[i_batch])
        if shrink:
            x, viol, cost = _min_var(problem, x, i_over, lo[i_over], hi[i_over])
        elif not monotone:
            x, viol, cost = _scored(problem, x)
        if i_fix is not None:  # no valid value within the bounds: ranked last
            viol = jnp.where(ok, viol, jnp.inf)
        return x, viol, cost

    def one_round(carry, r):
        best = carry
        xs = jnp.where(r == 0, cand0, jnp.clip(best[0] + steps, lo, hi))
        if i_fix is None:
            xs, viol, cost = jax.vmap(lambda x: score(x, 0.0))(xs)
        else:
            xs, viol, cost = jax.vmap(score)(xs, jnp.where(r == 0, dir0, dirs))
        vmin = jnp.min(viol)
        k = jnp.argmin(jnp.where(viol == vmin, cost, jnp.inf))
        new = (xs[k], viol[k], cost[k])
        keep_old = ~better(new[1:], best[1:])
        return tuple(jnp.where(keep_old, o, n) for o, n in zip(best, new, strict=True)), None

    inf = jnp.asarray(jnp.inf, dtype)
    init = (cand0[0], inf, inf)
    (x, _, _), _ = jax.lax.scan(one_round, init, jnp.arange(1 + settings.local_rounds))
    per = 1 + steps_for(hi[i_batch] - lo[i_batch] + 1) if monotone else 1
    if shrink:
        per += 1 + steps_for(hi[i_over] - lo[i_over] + 1)
    return x, per * size * (1 + settings.local_rounds)


def best_continuous(problem: Problem, settings: Settings = DEFAULT, u0=None):
    """Solve the relaxation of one scenario from every start; the best run and all of them.

    The starts are the first ``settings.starts`` points of the Halton sequence in the unit box
    (``_halton``), or the rows of ``u0`` (``(starts, d)``, in ``(0, 1)``) where given. The best
    run is the cheapest after a penalty of 10 per unit of total log-violation.
    """
    d = len(problem.free)
    if u0 is None:
        u0 = jnp.asarray(_halton(settings.starts, d), jnp.result_type(float))
    z0 = jnp.log(u0) - jnp.log1p(-u0)
    runs = _solve_starts(problem, z0, settings)
    viol = jnp.sum(jnp.maximum(runs.log_ratios, 0.0), axis=-1)
    k = jnp.argmin(runs.log_cost + 10.0 * viol)
    return jax.tree.map(lambda a: a[k], runs), runs


def _shadow_prices(problem: Problem, best: Continuous):
    """Least-squares multipliers at the continuous optimum (``dcost.search.kkt.assess``, from the
    Jacobian the search took there, moved from ``z`` to ``y = log v``; values at a point snapped
    to its bounds to first order), where they make it stationary (with every variable moving if
    that works, else holding chips or stages at a jump); else the augmented-Lagrangian ones."""
    lo, hi = np.log(problem.search_lower), np.log(problem.search_upper)
    u = jax.nn.sigmoid(best.z)
    dy_dz = (hi - lo) * u * (1.0 - u)
    jac = jnp.where(dy_dz > 0, best.jac / jnp.where(dy_dz > 0, dy_dz, 1.0), 0.0)
    fc = jnp.concatenate([best.log_cost[None], best.log_ratios])

    y0 = jnp.log(to_search(problem, best.v))

    def at(snap, pin_tol):
        y, at_lo, at_hi = kkt.snap_to_bounds(problem, y0, snap)
        moved = fc + jac @ (y - y0)  # (log cost, log ratios) at the snapped point, to first order
        return kkt.assess(y, at_lo, at_hi, moved, jac, kkt.NEAR[0], pin_tol, kkt.jumps(problem))

    # every variable moving first; then holding chips or stages at a jump (a domain's edge)
    snaps = jnp.asarray(kkt.SNAP * 2, fc.dtype)
    pins = jnp.repeat(jnp.asarray([jnp.inf, kkt.PIN_TOL], fc.dtype), len(kkt.SNAP))
    _, w, left = jax.vmap(at)(snaps, pins)
    k = jnp.argmax(left < kkt.PIN_TOL)
    return jnp.where(left[k] < kkt.PIN_TOL, w[k, len(problem.free) :], best.lambdas)


def _relax_one(problem: Problem, settings: Settings):
    """The search's first stage for one scenario: the best continuous run, and every start's end
    point (``v``, shape ``(starts, d)``)."""
    best, runs = best_continuous(problem, settings)
    return best, runs.v


def _round_one(problem: Problem, best: Continuous, v_starts, settings: Settings) -> Solution:
    """The search's second stage for one scenario: whole numbers near every start's end point,
    the exact local search, the shadow prices at the best run, the exact report."""
    x, evaluations = _integer_search(problem, v_starts, settings)
    # Shadow prices: least-squares multipliers from stationarity at the continuous optimum where
    # they make it stationary (the augmented-Lagrangian iterates lose small multipliers to the
    # noise of the last steps), else (near a sharp kink) the iterates.
    lambdas = _shadow_prices(problem, best)
    f = jnp.result_type(float)
    stats = Stats(
        evaluations=jnp.asarray(evaluations, f),
        steps=jnp.asarray(settings.rounds * settings.steps, f),
        starts=jnp.asarray(settings.starts, f),
        continuous_x=best.v,
        continuous_cost=jnp.exp(best.log_cost),
        smoothness=best.smoothness,
    )
    return finish(problem, x, lambdas, stats)


@functools.partial(jit, static_argnames=("settings", "batch"))
def _relax(problem: Problem, settings: Settings, batch: int | None):
    if batch is None:
        return _relax_one(problem, settings)
    return jax.vmap(lambda p: _relax_one(p, settings))(broadcast(problem, batch))


@functools.partial(jit, static_argnames=("settings", "batch"))
def _round(problem: Problem, best: Continuous, v_starts, settings: Settings, batch: int | None):
    if batch is None:
        return _round_one(problem, best, v_starts, settings)
    return jax.vmap(lambda p, b, v: _round_one(p, b, v, settings))(
        broadcast(problem, batch), best, v_starts
    )


def _solve(problem: Problem, settings: Settings, batch: int | None) -> Solution:
    """The search in two compiled programs of about half its size each (the relaxation; the
    rounding, shadow prices and exact report): a later process loads the second on another core
    while it loads the first (``dcost._programs``: loading is XLA rebuilding the program's HLO,
    in time proportional to its size), and on an empty cache the second compiles while the
    first does."""
    with _programs.during_compile(functools.partial(_prepare_round, problem, settings, batch)):
        best, v_starts = _relax(problem, settings, batch)
    return _round(problem, best, v_starts, settings, batch)


def _prepare_round(problem: Problem, settings: Settings, batch: int | None) -> bool:
    """Load or compile ``_round``'s program from the problem's form alone (placeholders of the
    shapes ``_relax`` returns; transferred, not made by jnp, which would run XLA programs)."""
    dtype = jnp.result_type(float)
    d, n_c = len(problem.free), len(problem.constraints)
    lead = () if batch is None else (batch,)

    def zeros(*shape):
        return jax.device_put(np.zeros(lead + shape, dtype))

    best = Continuous(
        z=zeros(d),
        v=zeros(d),
        lambdas=zeros(n_c),
        log_cost=zeros(),
        log_ratios=zeros(n_c),
        jac=zeros(1 + n_c, d),
        smoothness=zeros(),
    )
    return _round.prepare(problem, best, zeros(settings.starts, d), settings, batch)


def optimize(problem: Problem, settings: Settings = DEFAULT) -> Solution:
    """The cheapest feasible integer design, found by gradient search and checked exactly.

    Minimizes the objective over the free variables, subject to the problem's constraints (see the
    module docstring for the method). Deterministic: the same problem gives the same answer.

    Args:
      problem: a ``dcost.Problem``; leaves with a leading batch axis are many scenarios, solved in
        one jitted, vmapped call (the result's fields carry that axis). The batch is padded to a
        bucket (``dcost.search.buckets``: 16, 32, 64, ... scenarios), so that 7, 10 and 12
        scenarios share one compilation; the padding changes no answer.
      settings: a ``Settings`` (starts, rounds, schedules).

    Returns:
      A ``dcost.Solution``: ``.design`` (whole numbers), ``.report`` (exact), ``.cost``,
      ``.feasible`` (confirmed by the exact model), ``.binding``, ``.multipliers`` (shadow prices
      from the continuous relaxation), ``.stats``, ``.message`` (which constraint cannot be met,
      when none of the designs is feasible).

    >>> import dcost
    >>> p = dcost.Problem(dcost.hardware("h100-sxm"), dcost.model("llama-3-70b"),
    ...                   dcost.Workload(4096), tpot_slo=0.05)
    >>> s = dcost.optimize(p)
    >>> bool(s.feasible), bool(s.report.tpot <= 0.05)
    (True, True)
    """
    _check_problem("optimize", problem)
    check_settings("optimize", settings)

    def solve(p, batch):  # on its chip's shared form (one program per profile), answered for p
        return eqx.tree_at(lambda s: s.problem, _solve(on_shared_form(p), settings, batch), p)

    return bucketed(solve, problem)


def _check_problem(owner: str, problem) -> None:
    if not isinstance(problem, Problem):
        raise SpecError(f"{owner}.problem must be a dcost.Problem, got {type(problem).__name__}")
