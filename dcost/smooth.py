"""Smooth maxima and gradient-safe numerics shared by every cost model.

Exact and smooth evaluation are one code path: ``smax(xs, s)`` is the hard maximum at ``s = 0`` and
the p-norm ``(sum x_i**(1/s))**s`` for ``s > 0``. The p-norm is the same in any unit (seconds or
milliseconds), bounded by ``max <= smax <= n**s * max``, and tends to the maximum as ``s -> 0``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from dcost.specs import check

__all__ = [
    "smax",
    "smin",
    "safe_div",
    "safe_log",
    "safe_sqrt",
    "MAX_SMOOTHNESS",
    "check_smoothness",
]

MAX_SMOOTHNESS = 1.0
"""The largest smoothness allowed. At ``s = 1`` the p-norm is the plain sum of the terms, already
``n`` times the maximum when ``n`` terms tie; past it ``(sum x_i**(1/s))**s`` exceeds the sum,
grows as ``n**s`` and stops approximating a maximum at all (``s = 1e30`` overflows to ``inf``)."""


def check_smoothness(owner: str, smoothness) -> None:
    """Raise SpecError unless a concrete ``smoothness`` is finite and in ``[0, MAX_SMOOTHNESS]``
    (a traced one is not checked)."""
    check(owner, "smoothness", smoothness, low=0.0, high=MAX_SMOOTHNESS)


def safe_log(x):
    """``log(x)`` for ``x > 0`` and ``-inf`` elsewhere, with a zero (not NaN) gradient there."""
    pos = x > 0
    return jnp.where(pos, jnp.log(jnp.where(pos, x, 1.0)), -jnp.inf)


def safe_sqrt(x):
    """``sqrt(x)`` for ``x > 0`` and 0 elsewhere, with a zero (not infinite) gradient at 0."""
    pos = x > 0
    return jnp.where(pos, jnp.sqrt(jnp.where(pos, x, 1.0)), 0.0)


def safe_div(num, den, default=0.0):
    """``num / den`` where ``den != 0``, else ``default``, with finite gradients everywhere."""
    nz = den != 0
    return jnp.where(nz, num / jnp.where(nz, den, 1.0), default)


def smax(xs, smoothness=0.0):
    """Maximum of non-negative terms, smooth when ``smoothness > 0``.

    .. math:: \\mathrm{smax}_s(x) = \\Big(\\sum_i x_i^{1/s}\\Big)^{s}
              = \\exp\\big(s \\cdot \\mathrm{logsumexp}(\\log x_i / s)\\big)

    Zero terms drop out (their gradient is zero, never NaN); all-zero gives 0.

    Args:
      xs: a sequence of arrays (broadcastable), each >= 0, e.g. times in seconds.
      smoothness: ``0 <= s <= MAX_SMOOTHNESS`` (1: the sum of the terms); 0 is the exact maximum.

    Returns:
      The (smooth) maximum, in the unit of ``xs``.

    >>> float(smax([3.0, 4.0], 0.5))  # the Euclidean norm
    5.0
    >>> float(smax([3.0, 4.0], 0.0))
    4.0
    """
    check_smoothness("smax", smoothness)
    xs = jnp.broadcast_arrays(*[jnp.asarray(v) for v in xs])
    dtype = jnp.result_type(*xs)
    return _smax(tuple(x.astype(dtype) for x in xs), jnp.asarray(smoothness, dtype=dtype))


@jax.custom_jvp
def _smax(xs: tuple, s):
    """``smax`` of same-shape, same-dtype terms at an array ``s``; its derivative is written out
    (``_smax_jvp``) rather than traced through the masks below, which made the gradient of the
    cost model 26 % larger in compiled code (``optimize``'s search: 5,432 against 4,007 XLA
    instructions for one value and gradient of the smooth model)."""
    # Elementwise over the terms (no logsumexp reduction over a stacked axis), so XLA fuses it
    # into one loop and a traced smoothness of 0 costs little more than the hard max. Zero terms
    # are masked with double `where`s, so that no value meets 0 * inf.
    hard = jnp.max(jnp.stack(xs), axis=0)
    positive_s = s > 0
    s_safe = jnp.where(positive_s, s, 1.0)
    any_pos = hard > 0
    pos = [x > 0 for x in xs]
    logs = [jnp.log(jnp.where(p, x, 1.0)) for p, x in zip(pos, xs, strict=True)]
    top = jnp.log(jnp.where(any_pos, hard, 1.0))  # max of the logs
    # a zero term gives exp(0) in the branch that `where` discards: finite, so no 0 * inf
    total = sum(
        jnp.where(p, jnp.exp((jnp.where(p, lg, top) - top) / s_safe), 0.0)
        for p, lg in zip(pos, logs, strict=True)
    )
    lse = top / s_safe + jnp.log(jnp.where(any_pos, total, 1.0))
    soft = jnp.where(any_pos, jnp.exp(s_safe * lse), 0.0)
    return jnp.where(positive_s, soft, hard)


@_smax.defjvp
def _smax_jvp(primals, tangents):
    """The derivative of ``smax``. For ``s > 0``, with ``w_i = (x_i/m)**(1/s)`` (``m = smax``;
    the weights sum to 1, zero terms have none)::

        dm/dx_i = (x_i/m)**(1/s - 1),    dm/ds = (m/s) * (log m - sum_i w_i log x_i)

    (``log m = s log sum_i x_i**(1/s)``, differentiated). At ``s = 0`` (the hard maximum) a tie
    shares the gradient equally (as ``jnp.max``'s does) and ``dm/ds = 0``."""
    xs, s = primals
    txs, ts = tangents
    m = _smax(xs, s)
    positive_s = s > 0
    s_safe = jnp.where(positive_s, s, 1.0)
    hard = jnp.max(jnp.stack(xs), axis=0)
    ties = sum(jnp.where(x == hard, 1.0, 0.0) for x in xs)
    log_m = jnp.log(jnp.where(m > 0, m, 1.0))
    dx, ds = jnp.zeros_like(m), jnp.zeros_like(m)
    for x, tx in zip(xs, txs, strict=True):
        pos = x > 0
        gap = jnp.where(pos, jnp.log(jnp.where(pos, x, 1.0)) - log_m, 0.0)  # log(x_i/m) <= 0
        soft = jnp.where(pos, jnp.exp(gap * (1.0 / s_safe - 1.0)), 0.0)
        hard_share = jnp.where(x == hard, 1.0 / ties, 0.0)
        dx = dx + jnp.where(positive_s, soft, hard_share) * tx
        weight = jnp.where(pos, jnp.exp(gap / s_safe), 0.0)
        ds = ds - weight * gap  # sum_i w_i (log m - log x_i)
    dm_ds = jnp.where(positive_s & (m > 0), m / s_safe * ds, 0.0)
    return m, dx + dm_ds * ts


def smin(xs, smoothness=0.0):
    """Minimum of positive terms, smooth when ``smoothness > 0``: ``1/smax(1/x_i)``.

    .. math:: \\mathrm{smin}_s(x) = \\Big(\\sum_i x_i^{-1/s}\\Big)^{-s}

    The same in any unit, ``n**-s * min <= smin <= min``, and the exact minimum at ``s = 0`` (and
    as ``s -> 0``). Every term must be > 0 (``inf`` is allowed and drops out).

    >>> round(float(smin([3.0, 4.0], 0.5)), 6)  # 1/sqrt(1/9 + 1/16) = 12/5
    2.4
    >>> float(smin([3.0, 4.0], 0.0))
    3.0
    """
    return 1.0 / smax([1.0 / jnp.asarray(x) for x in xs], smoothness)
