"""Smooth maxima and gradient-safe numerics shared by every cost model.

Exact and smooth evaluation are one code path: ``smax(xs, s)`` is the hard maximum at ``s = 0`` and
the p-norm ``(sum x_i**(1/s))**s`` for ``s > 0``. The p-norm is the same in any unit (seconds or
milliseconds), bounded by ``max <= smax <= n**s * max``, and tends to the maximum as ``s -> 0``.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax.scipy.special import logsumexp

__all__ = ["smax", "safe_div", "safe_log"]


def safe_log(x):
    """``log(x)`` for ``x > 0`` and ``-inf`` elsewhere, with a zero (not NaN) gradient there."""
    pos = x > 0
    return jnp.where(pos, jnp.log(jnp.where(pos, x, 1.0)), -jnp.inf)


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
      smoothness: ``s >= 0``; 0 is the exact maximum.

    Returns:
      The (smooth) maximum, in the unit of ``xs``.

    >>> float(smax([3.0, 4.0], 0.5))  # the Euclidean norm
    5.0
    >>> float(smax([3.0, 4.0], 0.0))
    4.0
    """
    x = jnp.stack(jnp.broadcast_arrays(*[jnp.asarray(v) for v in xs]))
    s = jnp.asarray(smoothness, dtype=x.dtype)
    hard = jnp.max(x, axis=0)
    positive_s = s > 0
    s_safe = jnp.where(positive_s, s, 1.0)
    logs = safe_log(x)
    any_pos = jnp.any(x > 0, axis=0)
    lse = logsumexp(jnp.where(any_pos, logs, 0.0) / s_safe, axis=0)
    soft = jnp.where(any_pos, jnp.exp(s_safe * lse), 0.0)
    return jnp.where(positive_s, soft, hard)
