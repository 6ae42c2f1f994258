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
import jax.scipy.special as jsp
import numpy as np

from dcost.specs import SpecError, check

__all__ = [
    "POLICIES",
    "Departures",
    "poisson_gaps",
    "simulate_departures",
    "train_latency",
    "erlang_c",
    "WaitTail",
    "mgc_wait",
    "wait_tail_survival",
]

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


# ----------------------------------------------------------------------------------------------
# Waiting for a server: Erlang-C, the Allen-Cunneen M/G/c approximation and its exponential tail.
# These are smooth in every argument (the number of servers included, through the continuous
# extension of Erlang's formulas), so a planner can differentiate a percentile of the wait.
# ----------------------------------------------------------------------------------------------


def _log_poisson_front(s, x):
    """``log(x^s e^{-x} / Gamma(s + 1))`` for ``s, x > 0``, without the cancellation of its
    terms: at ``s`` in the thousands ``s log x``, ``x`` and ``log Gamma(s + 1)`` are each near
    ``s log s`` and their sum is of order one, so in float32 the direct form loses its digits
    (Erlang's C at a million servers and 99.9 % load came out 0.30 for 0.22). With Stirling's
    series ``log Gamma(s + 1) = s log s - s + log(2 pi s)/2 + R(s)``,

    .. math:: s\\,(\\log(1 + d) - d) - \\tfrac12 \\log(2\\pi s) - R(s), \\qquad d = x/s - 1,

    ``R(s) = 1/(12 s) - 1/(360 s^3) + 1/(1260 s^5) - 1/(1680 s^7)`` for ``s >= 10`` (its next
    term below 1e-11 there) and ``log Gamma(s + 1)`` less the rest below 10, where nothing
    cancels. Reference: Abramowitz and Stegun (1964), eq. 6.1.41.
    """
    small = s < 10.0
    big = jnp.where(small, 10.0, s)  # double where: the series' lanes stay where it holds
    inv = 1.0 / big
    inv2 = inv * inv
    r_series = inv * (1.0 / 12.0 - inv2 * (1.0 / 360.0 - inv2 * (1.0 / 1260.0 - inv2 / 1680.0)))
    half_log = 0.5 * jnp.log(2.0 * math.pi * s)
    r_direct = jsp.gammaln(s + 1.0) - (s * jnp.log(s) - s + half_log)
    d = x / s - 1.0
    return s * (jnp.log1p(d) - d) - half_log - jnp.where(small, r_direct, r_series)


def _series_terms(s, x, slope: bool):
    """``(S, dS/ds)`` (the slope 0 unless ``slope``) of the lower incomplete gamma function's
    power series ``S(s, x) = sum_{n >= 0} t_n``, ``t_0 = 1``, ``t_n = t_{n-1} x/(s+n)``
    (``x > 0``, ``s > 0``), summed until a term is below the float type's epsilon of the sum
    (and, with the slope, the same for ``t_n' = t_{n-1}' x/(s+n) - t_{n-1} x/(s+n)^2``). Its
    terms fall from the first when ``x < s``: about ``sqrt(s)`` of them near ``x = s``."""
    eps = jnp.finfo(s.dtype).eps

    def going(v):
        return jnp.any(v[0])

    def step(v):
        on, r, t, total, dt, dtotal = v
        r1 = r + 1.0
        ratio = x / r1
        t1, dt1 = t * ratio, dt * ratio - t * ratio / r1
        total1, dtotal1 = total + t1, dtotal + dt1
        more = t1 > eps * total1
        if slope:
            more = more | (jnp.abs(dt1) > eps * jnp.abs(dtotal1))
        keep = functools.partial(jnp.where, on)
        return (
            on & more,
            keep(r1, r),
            keep(t1, t),
            keep(total1, total),
            keep(dt1, dt),
            keep(dtotal1, dtotal),
        )

    one, zero = jnp.ones_like(x), jnp.zeros_like(x)
    init = (jnp.ones(x.shape, bool), s, one, one, zero, zero)
    _, _, _, total, _, dtotal = jax.lax.while_loop(going, step, init)
    return total, dtotal


@jax.custom_jvp
def _gamma_series(s, x):
    """``S(s, x)``, the sum in the regularized lower incomplete gamma function's series

    .. math:: P(s, x) = \\frac{x^s e^{-x}}{\\Gamma(s+1)}\\, S(s, x), \\qquad
              S(s, x) = \\sum_{n \\ge 0} \\frac{x^n}{(s+1)(s+2)\\cdots(s+n)}

    (``_series_terms``), for ``0 < x < s``. Its derivatives: ``dS/ds`` by the series' own
    (summed only where ``s`` carries a tangent, and not differentiated again, as JAX's
    ``igamma_grad_a`` is not) and, from ``dP/dx = x^{s-1} e^{-x}/Gamma(s)``, the closed form
    ``dS/dx = S + (s/x)(1 - S)``.

    Reference: Abramowitz and Stegun, "Handbook of Mathematical Functions" (1964), eq. 6.5.29;
    Press et al., "Numerical Recipes" (3rd ed., 2007), section 6.2.
    """
    return _series_terms(s, x, slope=False)[0]


def _gamma_series_jvp(primals, tangents):
    s, x = primals
    ds, dx = tangents
    total = _gamma_series(s, x)  # through this rule again under a second derivative
    d_total = jnp.zeros_like(total)
    if not isinstance(ds, jax.custom_derivatives.SymbolicZero):
        d_total = d_total + _series_terms(s, x, slope=True)[1] * ds
    if not isinstance(dx, jax.custom_derivatives.SymbolicZero):
        d_total = d_total + (total + (s / x) * (1.0 - total)) * dx
    return total, d_total


_gamma_series.defjvp(_gamma_series_jvp, symbolic_zeros=True)


def erlang_c(servers, offered_load):
    """Probability that an arrival waits in an M/M/c queue (Erlang's C formula).

    With ``c`` servers and offered load ``a = lambda / mu`` (Erlangs, ``a < c``), Erlang's loss
    formula ``B(c, a) = (a^c / c!) / sum_{k<=c} a^k / k!`` gives the delay formula

    .. math:: C(c, a) = \\frac{B(c, a)}{1 - (a/c)\\,(1 - B(c, a))}.

    ``B`` is evaluated as ``(a^c e^{-a} / Gamma(c+1)) / Q(c+1, a)`` with ``Q`` the regularized
    upper incomplete gamma function: the same number for whole ``c`` and the standard continuous
    extension in ``c`` (Jagerman, "Some properties of the Erlang loss function", Bell System
    Technical Journal 53(3), 1974), so ``c`` can be a relaxed integer under ``jax.grad``. Computed
    in log space: no overflow for thousands of servers. ``Q(c + 1, a) = 1 - P(c + 1, a)`` comes
    from ``P``'s power series alone (``_gamma_series``: ``a < c``, its side), and ``a^c
    e^{-a}/Gamma(c + 1)`` from Stirling's series (``_log_poisson_front``), so that float32 keeps
    its digits at a million servers.

    Args:
      servers: ``c`` (>= 1; may be fractional).
      offered_load: ``a = lambda E[S]`` (Erlangs, ``0 <= a < c``); at ``a >= c`` the queue is
        unstable and the result is 1.

    Returns:
      ``C(c, a)`` in [0, 1].

    Reference: Kleinrock, "Queueing Systems, Volume 1" (1975), eq. (3.40); Erlang (1917).

    >>> round(float(erlang_c(1.0, 0.7)), 6)  # M/M/1: the utilisation
    0.7
    >>> round(float(erlang_c(2.0, 1.0)), 6)  # (1/2)/(1 + 1 + 1/2) * 2 = 1/3
    0.333333
    """
    c = jnp.asarray(servers, dtype=jnp.result_type(float))
    a = jnp.asarray(offered_load, dtype=c.dtype)
    ok = (a > 0) & (a < c)
    a_s = jnp.where(ok, a, 0.5 * c)  # double-where: a safe point where the formula is not used
    c_b, a_b = jnp.broadcast_arrays(c, a_s)
    # log(a^c e^{-a} / Gamma(c + 1)); Q(c + 1, a) = 1 - that times a/(c + 1) times the series
    # (a_s < c + 1: the series' side of Q)
    front = _log_poisson_front(c_b, a_b)
    p = jnp.exp(front + jnp.log(a_b / (c_b + 1.0))) * _gamma_series(c_b + 1.0, a_b)
    log_b = front - jnp.log1p(-p)
    b = jnp.exp(jnp.minimum(log_b, 0.0))
    rho = a_s / c
    value = b / (1.0 - rho * (1.0 - b))
    return jnp.where(ok, value, jnp.where(a <= 0, 0.0, 1.0))


class WaitTail(eqx.Module):
    """The wait ``W`` in a queue as an atom at zero plus an exponential tail.

    .. math:: P(W > t) = \\pi\\,e^{-\\theta t}, \\qquad t \\ge 0

    Attributes:
      p_wait: ``pi = P(W > 0)``.
      rate: ``theta`` (1/s), the decay rate of the tail; ``E[W | W > 0] = 1/theta``.
      mean: ``E[W] = pi / theta`` (s).
      utilisation: ``rho = lambda E[S] / c``.
    """

    p_wait: jax.Array
    rate: jax.Array
    mean: jax.Array
    utilisation: jax.Array


def mgc_wait(arrival_rate, servers, service_mean, service_cv) -> WaitTail:
    """Waiting time of an M/G/c queue (Poisson arrivals, ``c`` servers, general service).

    Erlang-C gives ``P(wait) = C(c, a)`` with ``a = lambda E[S]``; the Allen-Cunneen
    approximation scales the M/M/c mean wait by ``(c_a^2 + c_s^2)/2`` (``c_a = 1`` for Poisson
    arrivals):

    .. math:: E[W] \\approx C(c, a)\\,\\frac{1 + c_s^2}{2}\\,\\frac{1}{c\\mu - \\lambda},
              \\qquad P(W > t) \\approx C(c, a)\\,\\exp\\!\\Big(-\\frac{2 (c\\mu - \\lambda)}
              {1 + c_s^2}\\,t\\Big)

    with ``mu = 1/E[S]``. For ``c = 1`` the mean is the Pollaczek-Khinchine formula
    ``lambda E[S^2] / (2 (1 - rho))`` exactly; for exponential service (``c_s = 1``) the tail is
    the exact M/M/c one, ``C(c, a) exp(-(c mu - lambda) t)``. The exponential tail with the
    Allen-Cunneen conditional mean is the usual heavy-traffic form (Kingman, "The single server
    queue in heavy traffic", Proc. Cambridge Philos. Soc. 57, 1961; Whitt, "Approximations for the
    GI/G/m queue", Production and Operations Management 2(2), 1993, sec. 2).

    Args:
      arrival_rate: ``lambda`` (1/s, >= 0).
      servers: ``c`` (>= 1; may be fractional).
      service_mean: ``E[S]`` (s, > 0).
      service_cv: ``c_s = sd(S)/E[S]`` (>= 0).

    Returns:
      ``WaitTail``; an unstable queue (``rho >= 1``) has ``p_wait = 1`` and ``rate = 0``
      (an infinite wait), so a search sees the limit rather than NaN.

    Reference: Allen, "Probability, Statistics, and Queueing Theory" (2nd ed., 1990), sec. 6.3
    (Allen-Cunneen); Kleinrock, "Queueing Systems, Volume 1" (1975), sec. 3.5 (M/M/c).

    >>> w = mgc_wait(0.5, 1.0, 1.0, 1.0)  # M/M/1 at rho = 0.5: E[W] = rho/(mu - lambda) = 1 s
    >>> round(float(w.mean), 6), round(float(w.rate), 6)
    (1.0, 0.5)
    """
    lam = jnp.asarray(arrival_rate, dtype=jnp.result_type(float))
    c = jnp.asarray(servers, dtype=lam.dtype)
    es = jnp.asarray(service_mean, dtype=lam.dtype)
    cs2 = jnp.square(jnp.asarray(service_cv, dtype=lam.dtype))
    a = lam * es
    rho = a / c
    p = erlang_c(c, a)
    slack = c / es - lam  # c mu - lambda (1/s)
    stable = slack > 0
    rate = jnp.where(stable, 2.0 * jnp.where(stable, slack, 1.0) / (1.0 + cs2), 0.0)
    mean = jnp.where(stable, p / jnp.where(stable, rate, 1.0), jnp.inf)
    return WaitTail(p, rate, mean, rho)


def wait_tail_survival(tail: WaitTail, t):
    """``P(W > t)`` of a ``WaitTail``: 1 for ``t < 0``, ``pi exp(-theta t)`` for ``t >= 0``.

    >>> w = mgc_wait(0.5, 1.0, 1.0, 1.0)
    >>> round(float(wait_tail_survival(w, 2.0)), 6)  # 0.5 * exp(-1)
    0.18394
    """
    t = jnp.asarray(t)
    decay = tail.p_wait * jnp.exp(-tail.rate * jnp.maximum(t, 0.0))
    return jnp.where(t < 0, 1.0, decay)
