"""The Karush-Kuhn-Tucker conditions of the smooth relaxation, in ``y = log(free variables)``.

With ``f = log cost`` and ``c_j = log(value_j/limit_j) <= 0``, a point ``(y, lam)`` is a KKT point
when the Lagrangian ``L = f + lam . c`` is stationary in every variable not held at a bound,
``lam >= 0``, ``c <= 0`` and ``lam_j c_j = 0``. ``guess`` proposes an active set at a point of the
continuous search (snapping variables near a bound onto it, and estimating the multipliers by
least squares on stationarity); ``polish`` solves that active set's equations by Newton steps and
checks the result. ``dcost.optimize`` reports the least-squares multipliers; ``dcost.sensitivity``
differentiates at polished points. Reference: Nocedal & Wright, "Numerical Optimization" (2006),
12.3 (first-order conditions), 18.1 (Newton on the KKT system).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp

from dcost.search.linalg import lstsq
from dcost.search.problem import Problem, evaluate, from_search

__all__ = [
    "Relaxed",
    "ActiveSet",
    "JUMPS",
    "jumps",
    "guess",
    "assess",
    "snap_to_bounds",
    "polish",
    "kkt_residual",
    "lagrangian",
    "log_terms",
]

SNAP = (0.1, 0.01)
"""Guesses put a variable within this distance (in log) of a bound on the bound: the search's
iterates approach a bound slowly, but an optimum may also lie just inside one."""
NEAR = (0.1, 0.01)
"""Guesses of the active set: constraints with ``log(value/limit) > -NEAR`` at a start may be
active (each guess is polished and checked; the cheapest point passing the checks wins)."""
PIN_TOL = 0.05
"""Guesses also differ in holding, or not, the variables whose stationarity residual exceeds
this: a variable at a jump of the model (e.g. the edge of a scale-up domain) must be held; one
near a sharp kink of the smooth max only looks non-stationary from a rough point."""
PIN_STEP = 0.05
"""A held variable passes the check when a step of this size (in log) downhill raises L."""
ACTIVE_TOL = 1e-6
"""A candidate constraint is active when its least-squares multiplier exceeds this."""
CHECK_TOL = 1e-4
"""Tolerance of the KKT checks after polishing (``Relaxed.kkt``), in float64."""
CHECK_TOL_F32 = 1e-2
"""The same in float32, whose gradients of a p-norm with exponent ``1/smoothness`` (hundreds)
are only good to a few 1e-3."""
NEWTON_STEPS = 12
PASSES = 2


class Relaxed(eqx.Module):
    """The polished optimum of the smooth relaxation.

    Attributes:
      y: ``log`` of the free variables in the search's coordinates, ``log(x + offset)``, shape
        ``(..., d)``.
      lambdas: multipliers ``lam*_j = -d log cost*/d log limit_j``, ``(..., n_constraints)``.
      log_cost: ``log cost*`` (smooth model).
      interior: which variables move (not at a bound, not pinned at a jump).
      active: which constraints hold with equality.
      residual: the KKT residual ``|F|`` after polishing (small at a KKT point).
      kkt: whether the polished point passes the KKT checks (residual, multiplier signs, inactive
        constraints satisfied, bounds respected, held variables pushing against their bound);
        when False the sensitivities are unreliable (a degenerate or wrongly guessed active set).
      smoothness: the smoothness of the model used.
      offset: the shift of each variable (``Problem.offsets``: 1 where 0 means off, else 0).
    """

    y: jax.Array
    lambdas: jax.Array
    log_cost: jax.Array
    interior: jax.Array
    active: jax.Array
    residual: jax.Array
    kkt: jax.Array
    smoothness: jax.Array
    offset: jax.Array

    @property
    def x(self):
        """The free variables of the continuous optimum, ``exp(y) - offset``."""
        return jnp.exp(self.y) - self.offset

    @property
    def cost(self):
        """The optimal cost of the relaxation."""
        return jnp.exp(self.log_cost)


def log_terms(problem: Problem, y, smoothness):
    """``(log cost, log(value/limit) per constraint)`` at ``y = log(free variables + offsets)``
    (``Problem.offsets``)."""
    ev = evaluate(problem, from_search(problem, jnp.exp(y)), smoothness)
    return jnp.log(ev.cost), ev.log_ratios


def lagrangian(problem, y, lam, smoothness):
    """``L = log cost + lam . log(value/limit)``."""
    f, c = log_terms(problem, y, smoothness)
    return f + jnp.dot(lam, c)


JUMPS = ("chips", "stages", "attention_dp")
"""The variables the model jumps in: the links switch from scale-up to scale-out where a stage's
``G`` chips (tensor parallel, all-to-all) or a replica's ``P*G`` (pipeline hops) outgrow one
scale-up domain, or an attention group's ``G/A`` chips do (and the KV cache replicates past the
KV heads at ``G/A = h_kv``). Only these are held where stationarity fails."""


def jumps(problem: Problem):
    """Mask of ``problem.names`` in ``JUMPS``."""
    return jnp.asarray([name in JUMPS for name in problem.names])


class ActiveSet(NamedTuple):
    y_pin: jax.Array  # where held variables stay
    interior: jax.Array  # variables that move
    active: jax.Array  # constraints that hold with equality


def kkt_residual(problem, w, aset: ActiveSet, smoothness):
    """The KKT residual ``F(y, lam)`` on an active set, and ``(grad_y L, f, c)`` beside it."""
    d = aset.y_pin.shape[0]
    y, lam = w[:d], w[d:]

    def lagrangian(y):
        f, c = log_terms(problem, y, smoothness)
        return f + jnp.dot(lam, c), (f, c)

    g, (f, c) = jax.grad(lagrangian, has_aux=True)(y)
    r = jnp.concatenate(
        [jnp.where(aset.interior, g, y - aset.y_pin), jnp.where(aset.active, c, lam)]
    )
    return r, (g, f, c)


def _jac_and_value(fun):
    """``w -> (jacobian, (value, aux))`` of ``fun(w) -> (value, aux)`` in one forward pass."""

    def both(w):
        value, aux = fun(w)
        return value, (value, aux)

    return jax.jacfwd(both, has_aux=True)


def _multipliers(gf, jc, interior, candidate):
    """Least-squares multipliers of the candidate constraints from stationarity in the interior
    variables, ``min |gf_I + jc_{A,I}^T lam_A|``, and the stationarity residual per variable."""
    m = jnp.where(interior[:, None] & candidate[None, :], jc.T, 0.0)
    lam = lstsq(m, -jnp.where(interior, gf, 0.0))
    lam = jnp.where(candidate, lam, 0.0)
    return lam, jnp.where(interior, gf + m @ lam, 0.0)


def _log_bounds(problem: Problem):
    """``(log lower, log upper)`` of the free variables in the search's coordinates."""
    return jnp.log(jnp.asarray(problem.search_lower)), jnp.log(jnp.asarray(problem.search_upper))


def snap_to_bounds(problem: Problem, y0, snap):
    """``y0`` with the variables within ``snap`` (in log) of a bound put on it; the two masks."""
    lo, hi = _log_bounds(problem)
    at_hi = (y0 > hi - snap) | (hi <= lo)
    at_lo = (y0 < lo + snap) & ~at_hi
    return jnp.where(at_lo, lo, jnp.where(at_hi, hi, y0)), at_lo, at_hi


def assess(y0, at_lo, at_hi, fc, jac, near, pin_tol=PIN_TOL, jumps=None):
    """The active-set guess from ``fc = (f, c)`` and its Jacobian ``jac`` (rows ``grad f``,
    ``grad c_j``, in ``y``) at ``y0``: constraints with ``c > -near`` and positive least-squares
    multipliers are active; while the stationarity residual of a moving variable exceeds
    ``pin_tol`` (``inf``: never), the variable among ``jumps`` (those the model jumps in, default
    all) whose holding leaves the rest nearest stationary with non-negative multipliers is held,
    and the multipliers re-estimated. One at a time: a
    variable at a jump spoils the joint estimate, and holding every variable it makes look
    non-stationary would also hold the ones the binding constraints keep stationary (e.g. the
    batch against the tpot limit), losing their prices.

    Returns the active set, the starting ``(y, lam)``, and how far that is from a KKT point (the
    largest violation of stationarity, bound signs, feasibility and complementarity).
    """
    gf, jc, c = jac[0], jac[1:], fc[1:]
    jumps = jnp.ones(y0.shape, bool) if jumps is None else jnp.asarray(jumps)
    candidate = c > -near
    interior = ~(at_lo | at_hi)
    index = jnp.arange(y0.shape[0])

    def hold_one(interior, _):  # hold the best one, re-estimate, until the rest is stationary
        # row 0: every moving variable; row 1 + i: all but variable i
        masks = jnp.concatenate([interior[None], interior[None] & (index[:, None] != index)])
        lam, resid = jax.vmap(lambda mask: _multipliers(gf, jc, mask, candidate))(masks)
        # how far from stationary with non-negative multipliers, holding variable i
        score = jnp.max(jnp.abs(resid[1:]), axis=1) + jnp.sum(jnp.maximum(-lam[1:], 0.0), axis=1)
        pick = jnp.argmin(jnp.where(jumps & interior, score, jnp.inf))
        hold = (jnp.max(jnp.abs(resid[0])) >= pin_tol) & jumps[pick] & interior[pick]
        return interior & ~((index == pick) & hold), None

    # a loop, not unrolled: one copy of the least-squares solve in the compiled code
    interior, _ = jax.lax.scan(hold_one, interior, None, length=y0.shape[0])
    moving = jnp.sum(interior)

    # More active constraints than moving variables (a layout with most variables on bounds,
    # several limits near): their gradients are dependent there and no multipliers make all of
    # them hold with equality; keep those nearest their limits (largest c), as many as move.
    # Otherwise the values are unchanged. Two estimates, the second on the constraints the first
    # keeps: a loop of two steps, so the least-squares solve is compiled once more, not twice.
    def estimate(cand, _):
        lam, _ = _multipliers(gf, jc, interior, cand)
        active = cand & (lam > ACTIVE_TOL)
        rank = jnp.argsort(jnp.argsort(-jnp.where(active, c, -jnp.inf)))
        return active & (rank < moving), lam

    # kept: the second step's (the first step's kept constraints with positive multipliers)
    kept, (lam, lam_kept) = jax.lax.scan(estimate, candidate, None, length=2)
    active = candidate & (lam > ACTIVE_TOL)
    over = jnp.sum(active) > moving
    lam = jnp.where(over, lam_kept, lam)
    active = jnp.where(over, kept & (lam_kept > ACTIVE_TOL), active)
    lam = jnp.where(active, lam, 0.0)
    g = gf + jc.T @ lam
    violation = jnp.concatenate(
        [
            jnp.where(interior, jnp.abs(g), 0.0),
            jnp.where(at_lo, jnp.maximum(-g, 0.0), 0.0),
            jnp.where(at_hi, jnp.maximum(g, 0.0), 0.0),
            jnp.maximum(c, 0.0),
            jnp.where(active, jnp.abs(c), 0.0),
        ]
    )
    return ActiveSet(y0, interior, active), jnp.concatenate([y0, lam]), jnp.max(violation)


def guess(problem: Problem, y0, near, snap, s, pin_tol=PIN_TOL):
    """``assess`` at ``y0`` snapped to its bounds, the Jacobian taken there (forward mode).

    A held variable within ``snap`` (in log) of the next whole number downhill (of the Lagrangian
    with the guessed multipliers) is put on it: the jumps sit at whole numbers (``G = S``; ``P*G
    = S`` for whole ``P``), and the search stops short of the one it pushes against.
    """
    y0, at_lo, at_hi = snap_to_bounds(problem, y0, snap)

    def f_and_c(y):
        f, c = log_terms(problem, y, s)
        return jnp.concatenate([f[None], c]), None

    jac, (fc, _) = _jac_and_value(f_and_c)(y0)
    aset, w0, left = assess(y0, at_lo, at_hi, fc, jac, near, pin_tol, jumps(problem))
    d = y0.shape[0]
    g = jac[0] + jac[1:].T @ w0[d:]
    v = jnp.exp(y0)
    whole = jnp.log(jnp.maximum(jnp.where(g < 0, jnp.ceil(v), jnp.floor(v)), 1.0))
    held = ~aset.interior & ~at_lo & ~at_hi & (jnp.abs(whole - y0) < snap)
    y_pin = jnp.where(held, whole, y0)
    return aset._replace(y_pin=y_pin), w0.at[:d].set(y_pin), left


def _newton(problem: Problem, y0, near, snap, pin_tol, s):
    """One pass: guess the active set at ``y0``, Newton steps with backtracking on its KKT
    system, the checks; ``(Relaxed, KKT Jacobian)``."""
    aset, w0, _ = guess(problem, y0, near, snap, s, pin_tol)
    jac_value = _jac_and_value(lambda w: kkt_residual(problem, w, aset, s))
    d = y0.shape[0]

    n, dt = w0.shape[0], w0.dtype

    def newton(carry, i):
        w, step, scale, norm, jac, aux = carry
        trial = w + scale * step
        jac_t, (r_t, aux_t) = jax.tree.map(lambda x: x.astype(dt), jac_value(trial))
        norm_t = jnp.linalg.norm(r_t)
        better = (jnp.isfinite(norm_t) & (norm_t < norm)) | (i == 0)  # pass 0: the start itself
        new_step = lstsq(jac_t, -r_t)
        pick = lambda a, b: jax.tree.map(lambda x, y: jnp.where(better, x, y), a, b)  # noqa: E731
        return (
            pick(trial, w),
            pick(new_step, step),
            jnp.where(better, 1.0, scale / 2.0),
            jnp.where(better, norm_t, norm),
            pick(jac_t, jac),
            pick(aux_t, aux),
        ), None

    # Pass 0 of the loop evaluates the start itself (a zero step, taken whatever its residual):
    # one copy of the KKT Jacobian in the compiled program instead of two. Its carry's shapes
    # follow from w's (r and w have n = d + n_c entries): tracing the Jacobian for them
    # (jax.eval_shape) took an eighth of the sensitivity program's trace.
    jac0 = jnp.zeros((n, n), dt)
    aux0 = (jnp.zeros((d,), dt), jnp.zeros((), dt), jnp.zeros((n - d,), dt))
    start = (
        w0,
        jnp.zeros_like(w0),
        jnp.ones((), w0.dtype),
        jnp.full((), jnp.inf, w0.dtype),
        jac0,
        aux0,
    )
    (w, _, _, residual, jac, (g, f, c)), _ = jax.lax.scan(
        newton, start, jnp.arange(NEWTON_STEPS + 1)
    )
    y, lam = jnp.where(aset.interior, w[:d], aset.y_pin), w[d:]  # held: exactly in place
    lo, hi = _log_bounds(problem)
    free = ~aset.interior & (hi > lo)  # not moving, though its bounds would let it
    on_lo, on_hi = free & (aset.y_pin <= lo), free & (aset.y_pin >= hi)
    held = free & ~on_lo & ~on_hi  # neither moving nor on a bound
    lag = functools.partial(lagrangian, problem, lam=lam, smoothness=s)
    downhill = jax.vmap(lambda e: lag(y - PIN_STEP * jnp.sign(g) * e))(jnp.eye(d))
    tol = CHECK_TOL if w.dtype == jnp.float64 else CHECK_TOL_F32
    ok = (
        (residual < tol)
        & jnp.all(lam >= -tol)
        & jnp.all(c <= tol)
        & jnp.all(jnp.where(aset.interior, (y >= lo) & (y <= hi), True))
        & jnp.all(jnp.where(on_lo, g >= -tol, True))
        & jnp.all(jnp.where(on_hi, g <= tol, True))
        & jnp.all(jnp.where(held, downhill > f + jnp.dot(lam, c), True))
    )
    relaxed = Relaxed(
        y=y,
        lambdas=jnp.maximum(lam, 0.0),
        log_cost=f,
        interior=aset.interior,
        active=aset.active,
        residual=residual,
        kkt=ok,
        smoothness=s,
        offset=jnp.asarray(problem.offsets, y.dtype),
    )
    return relaxed, jac


def polish(problem: Problem, y0, near, snap, pin_tol, s) -> tuple[Relaxed, jax.Array]:
    """The KKT point near ``y0``: ``PASSES`` rounds of (guess, Newton, checks), each starting
    where the last ended, clipped into the bounds (a variable Newton pushed past its bound is
    held there by the next guess). The cheapest pass that passes the checks (else the last), and
    the KKT Jacobian there."""
    lo, hi = _log_bounds(problem)

    def one_pass(y, _):
        out = _newton(problem, y, near, snap, pin_tol, s)
        return jnp.clip(out[0].y, lo, hi), out

    _, (passes, jacs) = jax.lax.scan(one_pass, y0, None, length=PASSES)
    score = jnp.where(passes.kkt, passes.log_cost, jnp.inf)
    k = jnp.where(jnp.any(passes.kkt), jnp.argmin(score), PASSES - 1)
    return jax.tree.map(lambda a: a[k], passes), jacs[k]
