"""Latency percentiles of a pool under continuous batching: smooth closed forms.

Everything here is a JAX function of the traffic and the pools (``jit``, ``vmap`` and ``grad``
work through it); ``dcost.planning.simulate`` measures the same quantities by discrete-event
simulation, and ``tests/test_planning_foundations.py`` holds the two within 10 %.

**Notation.** ``lambda`` arrivals/s, ``n`` replicas, ``lambda_r = lambda / n``; ``P_u`` a
request's uncached prompt tokens (``(1 - h) T_in``, lognormal), ``K = T_out - 1`` its decode
steps; ``t(B, c)`` the pool's step time; ``C`` the chunk budget; ``B`` the decode batch of a
replica.

**Prefill as a server.** A replica prefills one request at a time at full budget (FCFS, chunks of
``C``), so a prompt occupies ``n(P_u) = max(1, P_u / C)`` steps and the prefill "server" for

.. math:: S(P_u) = t\\big(B, \\min(P_u, C)\\big)\\,\\max(1, P_u / C)

seconds. The pool's replicas take requests from one FCFS queue: an M/G/c queue with ``c = n``
(``dcost.serving.queueing.mgc_wait``: Erlang-C for ``P(wait)``, Allen-Cunneen for the mean, an
exponential tail).

**TTFT** (arrival to first token) is the wait plus the request's own prefill, plus the KV
transfer ``d(T_in)`` when disaggregated. In an aggregated pool an arrival that finds the prefill
server free still waits for the decode step in progress, ``R ~ U(0, t(B, 0))`` when the replica
is decoding (probability ``1 - e^{-B}``, the decode batch being Poisson). So

.. math:: P(\\mathrm{TTFT} > x) = E_{P}\\big[G(x - S(P_u) - d)\\big], \\quad
          G(y) = (1 - \\pi)\\,P(R > y) + \\pi e^{-\\theta y}\\ (y \\ge 0),\\quad G(y) = 1\\ (y < 0)

with ``(pi, theta)`` the M/G/c tail; the expectation is a quadrature over the lognormal prompt
length, and the percentile solves ``P(TTFT > x) = 1 - q`` (bisection, then one Newton step so
that the gradient is the implicit-function one).

**Aggregated steps.** A fraction ``f`` of steps carries a chunk (mean time
``t_c = E[S]/E[n]``), the rest are pure decode steps ``t_0 = t(B, 0)``. Prefill needs
``lambda_r E[n]`` chunk steps per second, so ``f = lambda_r E[n] t_bar`` and

.. math:: \\bar t = (1 - f)\\,t_0 + f\\,t_c = \\frac{t_0}{1 - \\lambda_r E[n] (t_c - t_0)},

and by Little's law the decode batch is ``B = lambda_r E[K] t_bar`` (a fixed point in ``B``;
steps are evaluated at ``B + 1``, the batch a request sees with itself in it).

**TPOT** of a request is the mean over its ``K`` decode steps,
``t_0 + (t_c - t_0) N_c / K`` with ``N_c`` the steps that held a chunk. By the central limit
theorem ``N_c / K`` is normal with mean ``f`` and variance ``f (1 - f) kappa / K``, where
``kappa = (2 - p - q)/(p + q)`` is the variance factor of a two-state Markov chain of chunk and
decode steps whose chunk runs last ``1/p = E[n] / (1 - rho_p)`` steps (an M/G/1 busy period,
``rho_p = lambda_r E[S]``) and decode runs ``1/q = (1/p)(1 - f)/f`` (Kemeny and Snell, "Finite
Markov Chains", 1960, sec. 4.6). The batch itself varies (Poisson, variance ``B``); averaged over
a stay as long as its correlation time it keeps ``2/3`` of its variance (the autocorrelation of
an M/D/inf count is ``1 - tau/D``), adding ``t'(B)^2 (2/3) B``. The percentile is that of the
mixture over ``K`` (a quadrature over the lognormal output length) of these normals. In a
disaggregated decode pool ``f = 0`` and the request waits ``R ~ U(0, t)`` for its first step,
adding ``R / K``.

Limits, stated: the batch cap is assumed not to bind in the percentiles (``slot_wait`` reports
Erlang-C's probability that an arrival finds all ``n * cap`` slots full, for a search to keep
small); step times do not depend on context length; KV transfers do not contend.
"""

from __future__ import annotations

from collections.abc import Callable

import equinox as eqx
import jax
import jax.numpy as jnp
import jax.scipy.stats as jst
import numpy as np

from dcost.planning.pools import Pool
from dcost.planning.traffic import Traffic
from dcost.serving.queueing import erlang_c, mgc_wait

__all__ = ["Latency", "aggregated_latency", "disaggregated_latency", "QUANTILES"]

QUANTILES = (0.5, 0.9, 0.99)
_Z = np.linspace(-7.0, 7.0, 561)  # quadrature nodes of a standard normal (trapezoid weights)
_W = np.exp(-0.5 * _Z**2)
_W = _W / _W.sum()
_FIXED_POINT_ITERATIONS = 60
_BISECTIONS = 60


class Latency(eqx.Module):
    """Predicted latency of a fleet for a traffic (seconds unless said).

    Attributes:
      quantiles: the percentiles, e.g. ``(0.5, 0.9, 0.99)`` (static).
      ttft: time to first token at each quantile (s), shape ``(len(quantiles),)``.
      tpot: a request's mean time per output token at each quantile (s); over requests with at
        least two output tokens.
      ttft_mean, tpot_mean: the means (s).
      prefill_utilisation: busy fraction of a replica's prefill (``lambda_r E[S]``); the queue
        is unstable at >= 1.
      decode_batch: mean decode batch per replica ``B`` (sequences).
      step_time: mean step time ``t_bar`` (s) (the decode pool's when disaggregated).
      slot_wait: probability that an arrival finds every batch slot taken (Erlang-C over
        ``n * batch_cap`` slots; the largest over pools).
    """

    quantiles: tuple[float, ...] = eqx.field(static=True)
    ttft: jax.Array
    tpot: jax.Array
    ttft_mean: jax.Array
    tpot_mean: jax.Array
    prefill_utilisation: jax.Array
    decode_batch: jax.Array
    step_time: jax.Array
    slot_wait: jax.Array


def _lengths(traffic: Traffic, which: str):
    mu, sigma = traffic.lognormal(which)
    return jnp.exp(mu + sigma * jnp.asarray(_Z, dtype=jnp.result_type(float)))


def _prefill(step, batch, prompt_u, chunk):
    """A prompt's prefill: ``(n, S, S_own)``.

    ``n = max(1, P_u / C)`` chunk steps and ``S = t(B, min(P_u, C)) n`` seconds of them (the
    steps a prompt adds when prompts rarely share a step); ``S_own`` the time from its first to
    its last chunk when it is alone: ``t(B, P_u)`` up to one chunk, else ``t(B, C)`` for each
    full chunk and a last, partial one of uniform size, ``t(B, C)(P_u/C - 1/2) + E_u t(B, u)``.
    """
    n = jnp.maximum(1.0, prompt_u / chunk)
    full = step(batch, chunk)
    fluid = full * prompt_u / chunk
    u = chunk * (jnp.arange(8.0) + 0.5) / 8.0  # midpoints of (0, C)
    partial = jnp.mean(step(batch, u))
    own = jnp.where(
        prompt_u <= chunk, step(batch, jnp.minimum(prompt_u, chunk)), full * (n - 0.5) + partial
    )
    return n, step(batch, jnp.minimum(prompt_u, chunk)) * n, own, fluid


def _queue_service(rate, servers, w, fluid, packed_alone):
    """Service times of the prefill queue: a request that arrives to a waiting line shares
    steps with its neighbours (``fluid``: ``t(B, C) P_u / C``), one that finds a server free
    occupies whole steps of its own (``packed_alone``); the mix is weighted by Erlang-C's
    ``P(wait)``, a fixed point in the load. Returns ``(E[S], cv_S)``."""

    def body(_, p_wait):
        s = p_wait * fluid + (1.0 - p_wait) * packed_alone
        return erlang_c(servers, rate * jnp.sum(w * s))

    p_wait = jax.lax.fori_loop(0, 30, body, jnp.zeros_like(jnp.sum(fluid)))
    return _mean_cv(w, p_wait * fluid + (1.0 - p_wait) * packed_alone)


def _mean_cv(w, x):
    m = jnp.sum(w * x)
    var = jnp.maximum(jnp.sum(w * jnp.square(x)) - m * m, 0.0)
    return m, jnp.sqrt(var) / m


def _solve(fn, target, lo, hi):
    """``x`` in [lo, hi] with ``fn(x) = target`` for a decreasing ``fn``: bisection (no
    gradient), then one Newton step, whose derivative is the implicit-function one."""

    def body(_, bounds):
        a, b = bounds
        mid = 0.5 * (a + b)
        above = fn(mid) > target
        return jnp.where(above, mid, a), jnp.where(above, b, mid)

    a, b = jax.lax.fori_loop(0, _BISECTIONS, body, (lo, hi))
    x0 = jax.lax.stop_gradient(0.5 * (a + b))
    value, slope = jax.jvp(fn, (x0,), (jnp.ones_like(x0),))
    safe = jnp.where(slope < 0, slope, -1.0)
    step = jnp.where(slope < 0, (value - target) / safe, 0.0)
    return x0 - (step - jax.lax.stop_gradient(step))  # value x0, gradient of the Newton step


def _ttft(traffic, quantiles, service, extra, tail, residual, busy):
    """Percentiles of ``W' + S + extra`` (see the module docstring); ``service`` and ``extra``
    are per quadrature node, ``residual`` the decode step an arrival may wait for."""
    w = jnp.asarray(_W, dtype=service.dtype)
    own = service + extra
    r = jnp.maximum(residual, 1e-30)

    def survival(x):
        y = x - own
        ys = jnp.maximum(y, 0.0)
        g = (1.0 - tail.p_wait) * busy * jnp.clip(1.0 - ys / r, 0.0, 1.0)
        g = g + tail.p_wait * jnp.exp(-tail.rate * ys)
        return jnp.sum(w * jnp.where(y < 0, 1.0, g))

    stable = tail.rate > 0
    rate = jnp.where(stable, tail.rate, 1.0)
    mean = jnp.sum(w * own) + (1.0 - tail.p_wait) * busy * residual / 2 + tail.p_wait / rate
    out = []
    for q in quantiles:
        target = 1.0 - q
        wait_bound = jnp.log(jnp.maximum(tail.p_wait, target) / target) / rate + residual
        hi = jnp.max(own) + wait_bound + 1e-9
        x = _solve(survival, target, jnp.zeros_like(hi), hi)
        out.append(jnp.where(stable, x, jnp.inf))
    return jnp.stack(out), jnp.where(stable, mean, jnp.inf)


def _tpot(traffic, quantiles, mean_fn, var_fn):
    """Percentiles over requests (``T_out >= 2``) of a normal mixture over ``K = T_out - 1``."""
    x_out = _lengths(traffic, "output")
    k = jnp.maximum(x_out - 1.0, 0.5)
    w = jnp.asarray(_W, dtype=k.dtype) * (x_out >= 1.5)
    w = w / jnp.maximum(jnp.sum(w), 1e-30)
    m = mean_fn(k)
    s = jnp.sqrt(jnp.maximum(var_fn(k), jnp.square(1e-6 * m)))

    def survival(x):
        return jnp.sum(w * jst.norm.sf((x - m) / s))

    lo = jnp.min(m - 9.0 * s)
    hi = jnp.max(m + 9.0 * s)
    out = [_solve(survival, 1.0 - q, lo, hi) for q in quantiles]
    return jnp.stack(out), jnp.sum(w * m)


def _decode_fixed_point(tbar_fn, lam_r, mean_k):
    """Decode batch ``B = lambda_r E[K] t_bar(B)`` by iteration from ``B = 0``."""

    def body(_, b):
        return jnp.minimum(lam_r * mean_k * tbar_fn(b), 1e9)

    return jax.lax.fori_loop(0, _FIXED_POINT_ITERATIONS, body, jnp.zeros_like(lam_r))


def _slot_wait(rate, pool, residence):
    slots = pool.replicas * pool.batch_cap
    return erlang_c(slots, rate * residence)


def _mean_k(traffic):
    x_out = _lengths(traffic, "output")
    w = jnp.asarray(_W, dtype=x_out.dtype)
    return jnp.sum(w * jnp.maximum(x_out - 1.0, 0.0))


def aggregated_latency(traffic: Traffic, pool: Pool, quantiles=QUANTILES) -> Latency:
    """TTFT and TPOT percentiles of one pool serving prefill and decode together (continuous
    batching with chunked prefill). The formulas are in the module docstring.

    Args:
      traffic: the requests.
      pool: the replicas, their step time ``t(B, c)``, batch cap and chunk budget.
      quantiles: percentiles to report (static), in (0, 1).

    Returns:
      ``Latency``.

    >>> import dcost
    >>> from dcost.planning import Pool, roofline_step, aggregated_latency
    >>> pool = Pool(roofline_step(0.02, 1e-4, 2e-5), replicas=2, batch_cap=256, chunk=1024)
    >>> lat = aggregated_latency(dcost.Traffic(4.0, 1000, 200, prompt_cv=1.0), pool)
    >>> [round(float(x), 3) for x in lat.ttft]
    [0.036, 0.064, 0.122]
    """
    quantiles = tuple(float(q) for q in quantiles)
    step, chunk = pool.step, pool.chunk
    lam_r = traffic.rate / pool.replicas
    prompt_u = jnp.maximum(1.0, (1.0 - traffic.prefix_hit) * _lengths(traffic, "prompt"))
    w = jnp.asarray(_W, dtype=prompt_u.dtype)
    mean_k = _mean_k(traffic)

    def steps(b):
        """(t_0, t_c, E[n], E[S], cv_S, t_bar, f) at decode batch ``b`` (seen: ``b + 1``)."""
        seen = b + 1.0
        t0 = step(seen, 0.0)
        n, s, _, fluid = _prefill(step, seen, prompt_u, chunk)
        en, es = jnp.sum(w * n), jnp.sum(w * s)
        tc = es / en
        load = lam_r * en * jnp.maximum(tc - t0, 0.0)
        tbar = t0 / jnp.maximum(1.0 - load, 1e-6)
        f = jnp.clip(lam_r * en * tbar, 0.0, 1.0)
        return t0, tc, en, es, tbar, f

    batch = _decode_fixed_point(lambda b: steps(b)[4], lam_r, mean_k)
    t0, tc, en, es, tbar, f = steps(batch)
    _, alone, own, fluid = _prefill(step, batch + 1.0, prompt_u, chunk)
    eq, cv = _queue_service(traffic.rate, pool.replicas, w, fluid, alone)
    rho_p = lam_r * eq
    tail = mgc_wait(traffic.rate, pool.replicas, eq, cv)
    busy = 1.0 - jnp.exp(-batch)
    ttft, ttft_mean = _ttft(traffic, quantiles, own, 0.0, tail, t0, busy)

    # TPOT: chunk/decode steps as a two-state Markov chain; the batch's own variation
    f_in = jnp.clip(f, 1e-6, 1.0 - 1e-6)
    p = jnp.clip((1.0 - jnp.clip(rho_p, 0.0, 0.999)) / en, 1e-6, 1.0)
    q = jnp.clip(p * f_in / (1.0 - f_in), 1e-6, 1.0)
    kappa = (2.0 - p - q) / (p + q)
    delta = jnp.maximum(tc - t0, 0.0)
    slope = steps(batch + 0.5)[4] - steps(batch - 0.5)[4]

    def mean_fn(k):
        return tbar + 0.0 * k

    def var_fn(k):
        return (
            jnp.square(delta) * f_in * (1.0 - f_in) * kappa / k
            + jnp.square(slope) * (2.0 / 3.0) * batch
        )

    tpot, tpot_mean = _tpot(traffic, quantiles, mean_fn, var_fn)
    slot = _slot_wait(traffic.rate, pool, es + mean_k * tbar)
    return Latency(quantiles, ttft, tpot, ttft_mean, tpot_mean, rho_p, batch, tbar, slot)


def disaggregated_latency(
    traffic: Traffic,
    prefill: Pool,
    decode: Pool,
    transfer: Callable[..., object],
    quantiles=QUANTILES,
) -> Latency:
    """TTFT and TPOT percentiles of a prefill pool, a KV transfer and a decode pool.

    The prefill pool's steps carry prompt chunks only (``t_p(0, c)``); its replicas form an
    M/G/c queue. TTFT adds the transfer ``d(T_in)`` of the whole prompt's KV cache. The decode
    pool's steps carry no chunk (``t_d(B, 0)``), so TPOT varies only with the decode batch and
    the wait ``R ~ U(0, t_d)`` for a request's first decode step (see the module docstring).

    Args:
      traffic: the requests.
      prefill: the prefill pool (its ``batch_cap`` bounds prompts in flight per replica).
      decode: the decode pool (its ``chunk`` is unused).
      transfer: ``d(tokens) -> seconds``, the KV transfer of a prompt of ``tokens`` tokens
        (e.g. the serving model's ``kv_transfer_time``); array in, array out.
      quantiles: percentiles to report (static).

    Returns:
      ``Latency`` (``step_time`` and ``decode_batch`` are the decode pool's).

    >>> import dcost
    >>> from dcost.planning import Pool, roofline_step, disaggregated_latency
    >>> pre = Pool(roofline_step(0.02, 0.0, 2e-5), replicas=1, batch_cap=64, chunk=4096)
    >>> dec = Pool(roofline_step(0.02, 1e-4, 2e-5), replicas=1, batch_cap=256, chunk=1)
    >>> lat = disaggregated_latency(dcost.Traffic(4.0, 1000, 200), pre, dec, lambda n: 1e-5 * n)
    >>> round(float(lat.tpot[0]), 4), float(lat.decode_batch) > 10
    (0.0219, True)
    """
    quantiles = tuple(float(q) for q in quantiles)
    prompt = _lengths(traffic, "prompt")
    prompt_u = jnp.maximum(1.0, (1.0 - traffic.prefix_hit) * prompt)
    w = jnp.asarray(_W, dtype=prompt.dtype)
    mean_k = _mean_k(traffic)

    # prefill pool: batch 0, prompts packed in chunks
    _, alone, own, fluid = _prefill(prefill.step, 0.0, prompt_u, prefill.chunk)
    es, cv = _queue_service(traffic.rate, prefill.replicas, w, fluid, alone)
    rho_p = traffic.rate * es / prefill.replicas
    tail = mgc_wait(traffic.rate, prefill.replicas, es, cv)
    extra = jnp.asarray(transfer(prompt), dtype=prompt.dtype)
    ttft, ttft_mean = _ttft(traffic, quantiles, own, extra, tail, 0.0, 0.0)

    # decode pool
    lam_r = traffic.rate / decode.replicas

    def tbar_fn(b):
        return decode.step(b + 1.0, 0.0)

    batch = _decode_fixed_point(tbar_fn, lam_r, mean_k)
    t = tbar_fn(batch)
    slope = tbar_fn(batch + 0.5) - tbar_fn(batch - 0.5)
    busy = 1.0 - jnp.exp(-batch)
    r_mean = busy * t / 2.0
    r_var = busy * jnp.square(t) / 3.0 - jnp.square(r_mean)

    def mean_fn(k):
        return t + r_mean / k

    def var_fn(k):
        return jnp.square(slope) * (2.0 / 3.0) * batch + r_var / jnp.square(k)

    tpot, tpot_mean = _tpot(traffic, quantiles, mean_fn, var_fn)
    slot = jnp.maximum(
        _slot_wait(traffic.rate, decode, mean_k * t),
        _slot_wait(traffic.rate, prefill, es),
    )
    return Latency(quantiles, ttft, tpot, ttft_mean, tpot_mean, rho_p, batch, t, slot)
