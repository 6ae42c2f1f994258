"""The one bisection: shrink a bracket around where a monotone test flips, in ``lax`` loops.

Used for continuous roots (``dcost.training.lifetime``: where a split of the loss budget makes
pretraining alone cost as much as a whole plan) and for whole numbers (``dcost.search.optimize``:
the largest feasible batch, the smallest feasible over-training). A fixed number of steps, so it
is jit-able and vmappable; no step ever evaluates outside the bracket.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

__all__ = ["bisect", "midpoint", "floor_midpoint", "ceil_midpoint", "steps_for"]


def midpoint(a, b):
    """``(a + b) / 2``: the split of a continuous bracket."""
    return 0.5 * (a + b)


def floor_midpoint(a, b):
    """``floor((a + b) / 2)``: a whole-number split that never reaches ``b`` while ``b > a``."""
    return jnp.floor(0.5 * (a + b))


def ceil_midpoint(a, b):
    """``ceil((a + b) / 2)``: a whole-number split that never reaches ``a`` while ``b > a``."""
    return jnp.ceil(0.5 * (a + b))


def steps_for(width: float) -> int:
    """Halvings that take a whole-number bracket of ``width`` (``b - a``) down to 1.

    >>> steps_for(1), steps_for(2), steps_for(4096)
    (0, 1, 12)
    """
    n, w = 0, 1
    while w < width:
        n, w = n + 1, 2 * w
    return n


def bisect(
    right: Callable, a, b, steps: int, split: Callable = midpoint
) -> tuple[jax.Array, jax.Array]:
    """The bracket ``(a, b)`` after ``steps`` halvings around where ``right`` turns True.

    .. math:: m = \\text{split}(a, b); \\quad (a, b) \\leftarrow (a, m)
              \\text{ if right}(m) \\text{ else } (m, b)

    ``right`` must be monotone on ``[a, b]``: False left of some point, True right of it (e.g.
    ``fn(x) >= 0`` for an increasing ``fn``, or "infeasible" for a batch that only gets worse as
    it grows). Whatever holds at ``a`` (resp. ``b``) on entry holds at the returned ``a`` (``b``):
    ``right`` is never evaluated at the ends, which need not be valid inputs.

    Args:
      right: ``x -> bool`` (traceable).
      a, b: the bracket (scalars or arrays of one shape).
      steps: halvings (static).
      split: ``(a, b) -> m`` strictly inside the bracket while it is wider than one step:
        ``midpoint`` (continuous), ``floor_midpoint`` or ``ceil_midpoint`` (whole numbers).

    Returns:
      ``(a, b)``.

    >>> import jax.numpy as jnp
    >>> a, b = bisect(lambda x: x * x >= 2.0, jnp.asarray(1.0), jnp.asarray(2.0), 30)
    >>> round(float(midpoint(a, b)), 6)
    1.414214
    >>> a, b = bisect(lambda n: n * n > 50.0, jnp.asarray(1.0), jnp.asarray(100.0), 7,
    ...               floor_midpoint)
    >>> float(a), float(b)  # the largest whole number whose square is <= 50, and the next
    (7.0, 8.0)
    """

    def body(_, ab):
        a, b = ab
        m = split(a, b)
        go_left = right(m)
        return jnp.where(go_left, a, m), jnp.where(go_left, m, b)

    return jax.lax.fori_loop(0, steps, body, (a, b))
