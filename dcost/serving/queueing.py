"""Batch departures: how long a request waits for its decode batch (the "train" picture).

A serving replica runs one batch at a time. A request that arrives while a batch is running waits
for the next departure, rides that batch for one step, and is done (one step stands for the whole
service: a decode step, or a stretch of steps with the same members). With batches leaving every
``tau`` and a step of ``tau``, a Poisson arrival lands at a uniformly random phase of the interval,
so

.. math:: \\text{latency} = \\underbrace{U[0, \\tau]}_{\\text{wait}}
          + \\underbrace{\\tau}_{\\text{step}},
          \\qquad \\mathbb{E} = 1.5\\,\\tau, \\qquad \\max = 2\\,\\tau

(Poisson arrivals see time averages: Wolff, "Poisson Arrivals See Time Averages", Operations
Research 30(2), 1982). ``simulate_departures`` is a discrete-event simulation of three dispatch
policies, in one ``jax.lax.scan`` over requests, so a sweep over loads is one ``vmap``:

- ``"fixed"``: batches leave on the grid ``0, tau, 2 tau, ...`` (the next grid time once the server
  is free; empty departures are allowed).
- ``"when_free"``: a batch leaves as soon as the previous one finishes and someone is waiting
  (work conserving; an idle server starts at once on an arrival).
- ``"when_full"``: a batch leaves once ``capacity`` requests wait and the server is free.

The step of a batch of ``n`` requests takes ``max(step_time, n * step_time_per_sequence)``: the
roofline of one decode step, flat while weight reads bind and linear once compute binds.

Times are handled relative to the latest arrival, from the inter-arrival gaps, so the simulation is
exact to float32 rounding of quantities of the size of ``tau`` however long the run is.
"""

from __future__ import annotations

import functools
import math

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost.specs import SpecError, check

__all__ = ["POLICIES", "Departures", "poisson_gaps", "simulate_departures", "train_latency"]

POLICIES = ("fixed", "when_free", "when_full")


class Departures(eqx.Module):
    """Per-request outcome of a simulation (arrays of the requests' shape, seconds).

    Attributes:
      wait: time from arrival to the departure of the request's batch (s).
      latency: ``wait`` plus the step of that batch (s).
      batch_size: requests in the request's batch.
      batch_index: 0, 1, 2, ... numbering the batches in departure order (for ``"fixed"``, empty
        departures are not counted).
    """

    wait: jax.Array
    latency: jax.Array
    batch_size: jax.Array
    batch_index: jax.Array


def train_latency(interval):
    """Closed form of ``"fixed"`` departures with a step of one interval: ``(1.5 tau, 2 tau)``.

    .. math:: W \\sim U[0, \\tau], \\quad \\text{latency} = W + \\tau

    Args:
      interval: time between departures ``tau`` (s).

    Returns:
      ``(mean, worst)`` latency (s).

    >>> train_latency(0.02)
    (0.03, 0.04)
    """
    return 1.5 * interval, 2.0 * interval


def poisson_gaps(key, rate, n):
    """``n`` inter-arrival gaps of a Poisson process of ``rate`` requests/s (s).

    >>> import jax
    >>> g = poisson_gaps(jax.random.PRNGKey(0), 100.0, 100_000)
    >>> abs(float(g.mean()) * 100.0 - 1.0) < 0.02
    True
    """
    return jax.random.exponential(key, (n,)) / rate


def simulate_departures(
    gaps, step_time, *, policy="fixed", interval=None, capacity=math.inf, step_time_per_sequence=0.0
) -> Departures:
    """Discrete-event simulation of batch departures for one stream of requests.

    Request ``i`` arrives at ``a_i = gaps[0] + ... + gaps[i]``. A batch of ``n`` takes
    ``s(n) = max(step_time, n * step_time_per_sequence)``. With ``D`` the departure of the open
    batch and ``F`` the finish of the one before it, request ``i`` joins the open batch when it
    has room (``n < capacity``) and, except for ``"when_full"``, when ``a_i <= D``; otherwise it
    opens a new batch leaving at

    - ``"fixed"``: the first grid time ``D + m*tau >= a_i`` with ``m >= ceil(s(n)/tau)``;
    - ``"when_free"``: ``max(D + s(n), a_i)``;
    - ``"when_full"``: ``max(D + s(n), a_j)`` where ``a_j`` is its last member's arrival.

    The last batch of a finite run may be partial; under ``"when_full"`` it leaves at its last
    arrival (discard the tail when measuring).

    Args:
      gaps: inter-arrival times, shape ``(n,)`` (s, >= 0).
      step_time: step of a batch in the weight-bound regime ``tau`` (s, > 0).
      policy: one of ``POLICIES``.
      interval: time between ``"fixed"`` departures (s); defaults to ``step_time``.
      capacity: most requests per batch (>= 1; ``inf`` for no limit).
      step_time_per_sequence: compute time each request adds to a step (s, >= 0).

    Returns:
      ``Departures`` with per-request arrays of shape ``(n,)``.

    >>> import jax
    >>> gaps = poisson_gaps(jax.random.PRNGKey(0), 200.0, 50_000)
    >>> d = simulate_departures(gaps, 0.02)
    >>> round(float(d.latency.mean()) / 0.02, 2), round(float(d.latency.max()) / 0.02, 2)
    (1.5, 2.0)
    """
    if policy not in POLICIES:
        raise SpecError(
            f"simulate_departures.policy = {policy!r} is not allowed: it must be one "
            f"of {', '.join(POLICIES)}"
        )
    interval = step_time if interval is None else interval
    check("simulate_departures", "gaps", gaps)
    check("simulate_departures", "step_time", step_time, low_open=True)
    check("simulate_departures", "interval", interval, low_open=True)
    check("simulate_departures", "step_time_per_sequence", step_time_per_sequence)
    if not _all_inf(capacity):
        check("simulate_departures", "capacity", capacity, low=1.0)
    return _simulate(
        jnp.asarray(gaps), step_time, interval, capacity, step_time_per_sequence, policy=policy
    )


def _all_inf(x):
    """True when ``x`` is concrete and +inf everywhere (no capacity limit)."""
    try:
        v = np.asarray(x, dtype=float)
    except (TypeError, jax.errors.ConcretizationTypeError):
        return False
    return bool(np.all(np.isposinf(v)))


@functools.partial(jax.jit, static_argnames=("policy",))
def _simulate(gaps, step_time, interval, capacity, per_seq, *, policy):
    dtype = gaps.dtype
    step_time, interval, capacity, per_seq = (
        jnp.asarray(x, dtype) for x in (step_time, interval, capacity, per_seq)
    )

    def service(n):
        return jnp.maximum(step_time, n * per_seq)

    def forward(carry, gap):
        # r: open batch's departure minus the current arrival; fin: the previous batch's finish
        # minus the current arrival; n: members of the open batch; idx: its number.
        r, fin, n, idx = carry
        r, fin = r - gap, fin - gap
        room = n < capacity
        # n = 0 only before the first batch: an empty batch, nobody joins it (but "when_full").
        joins = room if policy == "when_full" else room & (r >= 0) & (n > 0)
        step = jnp.where(n > 0, service(n), 0.0)
        finish = r + step  # the open batch's finish, should it close now
        if policy == "fixed":
            m = jnp.maximum(jnp.ceil(step / interval), jnp.ceil(-r / interval))
            r_new = r + m * interval
        else:
            r_new = jnp.maximum(finish, 0.0)
        r_join = jnp.maximum(fin, 0.0) if policy == "when_full" else r
        carry = (
            jnp.where(joins, r_join, r_new),
            jnp.where(joins, fin, finish),
            jnp.where(joins, n + 1, 1.0),
            jnp.where(joins, idx, idx + 1),
        )
        return carry, (carry[0], carry[2], carry[3])

    neg_inf = jnp.asarray(-jnp.inf, dtype)
    # "fixed": the grid starts at t = 0; the others start with no batch ever run.
    r0 = jnp.asarray(0.0, dtype) if policy == "fixed" else neg_inf
    idx0 = 0 if policy == "when_full" else -1  # "when_full" fills batch 0 from the start
    init = (r0, neg_inf, jnp.asarray(0.0, dtype), jnp.asarray(idx0, jnp.int32))
    _, (r, n, idx) = jax.lax.scan(forward, init, gaps)

    # Backward pass: a batch's final departure and size are those seen by its last member.
    def backward(carry, x):
        wait_next, n_next, idx_next, gap_next = carry
        r_i, n_i, idx_i, gap_i = x
        same = idx_i == idx_next
        wait = jnp.where(same, wait_next + gap_next, r_i)
        size = jnp.where(same, n_next, n_i)
        return (wait, size, idx_i, gap_i), (wait, size)

    init_b = (
        jnp.asarray(0.0, dtype),
        jnp.asarray(0.0, dtype),
        jnp.asarray(-1, jnp.int32),
        jnp.asarray(0.0, dtype),
    )
    _, (wait, size) = jax.lax.scan(backward, init_b, (r, n, idx, gaps), reverse=True)
    return Departures(wait, wait + service(size), size, idx)
