"""Scenario buckets: a batch of scenarios padded to a few sizes, so few programs compile.

The number of scenarios of a batched problem (the length of its leaves' leading axis) is part of
the shape of every jitted search, so each new number would compile the search anew (seconds on a
CPU: ``optimize`` about 4 s, ``sensitivity`` about 9 s on 2 cores). The searches instead pad the
batch to a *bucket*, the least power of two at or above it and at least ``MIN_BUCKET`` (16, 32,
64, ...), by repeating the last scenario, run the program compiled for that bucket and slice the
answers back: 1 to 16 scenarios (7, 10, 12 ...) share the program of 16, 17 to 32 that of 32.
The scenarios of a vmapped search never interact, so a padded scenario changes no answer: in
the tests, ``optimize`` and ``grid_search`` give the unpadded batch's answers bit for bit, and
``sensitivity``'s elasticities agree to float32 rounding (the programs compiled for 5 and for 16
scenarios round the last bits of its linear solves differently, as batched and one-by-one solves
already did), with the same feasibility and active sets. A padded scenario costs only its
share of run time: at most as much again as the batch itself from 16 up, and up to 15 solves
below, against seconds for each compilation saved. Measured once compiled on 2 cores, 2
scenarios padded to 16 took 16 ms of CPU against 4 ms unpadded (``optimize``) and 0.41 s against
0.06 s (``sensitivity``, about 25 ms a scenario), each saving a compilation of about 5 s and 9 s.

``grid_search``'s run time grows with the grid, not by a fixed amount per scenario, so it pads to
16 and up only while the padded batch still fits in one chunk (one call: the padding is nearly
free); a larger grid pads to the next of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... (``fine_bucket``:
the powers of two and three times them), never more than 1.5 times the work (a power of two
alone was up to twice: 24 scenarios ran as 32, 33 as 64). A single, unbatched scenario stays
unbatched: it has its own program without a scenario axis.

Padding and slicing go through NumPy on concrete arrays: a JAX slice or concatenation run eagerly
compiles a small program for each new shape (about 20 ms each), which would undo the point.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
import numpy as np

from dcost.search.problem import batch_size

__all__ = ["MIN_BUCKET", "bucket", "fine_bucket", "pad", "spread", "unpad", "bucketed"]

MIN_BUCKET = 16
"""The smallest bucket (``optimize``, ``sensitivity``, ``pareto``, and small grids)."""

T = TypeVar("T")


def bucket(n: int, floor: int = MIN_BUCKET) -> int:
    """The padded size of a batch of ``n`` scenarios: the least power of two ``>= max(n, floor)``.

    >>> [bucket(n) for n in (1, 7, 10, 12, 16, 17, 33)]
    [16, 16, 16, 16, 16, 32, 64]
    >>> [bucket(n, floor=1) for n in (1, 2, 3, 5)]
    [1, 2, 4, 8]

    An empty batch (``n = 0``) stays empty: there is no scenario to repeat.
    """
    if n < 0 or floor < 1:
        raise ValueError(f"bucket: n = {n!r} must be >= 0 and floor = {floor!r} >= 1")
    if n == 0:
        return 0
    return 1 << (max(n, floor) - 1).bit_length()


def fine_bucket(n: int) -> int:
    """The padded size of a batch of ``n`` scenarios whose run time grows with the batch (a large
    ``grid_search``): the least of ``2**k`` and ``3 * 2**k`` at or above ``n``, so padding adds
    less than half the batch (``(2**k + 1) -> 3 * 2**(k - 1)``), where ``bucket(n, floor=1)``
    adds up to all of it.

    >>> [fine_bucket(n) for n in (1, 2, 3, 5, 7, 9, 17, 24, 25, 33)]
    [1, 2, 3, 6, 8, 12, 24, 24, 32, 48]
    """
    if n < 0:
        raise ValueError(f"fine_bucket: n = {n!r} must be >= 0")
    if n <= 2:
        return n
    power = bucket(n, floor=1)
    return power * 3 // 4 if power * 3 // 4 >= n else power


def _pad_leaf(a, n: int, size: int):
    """``a`` (leading axis ``n``) with its last row repeated up to ``size`` rows."""
    if isinstance(a, jax.core.Tracer):
        return jnp.concatenate([a, jnp.repeat(a[-1:], size - n, axis=0)])
    host = np.asarray(a)
    return jax.device_put(np.concatenate([host, np.repeat(host[-1:], size - n, axis=0)]))


def _unpad_leaf(a, n: int):
    if isinstance(a, jax.core.Tracer):
        return a[:n]
    if isinstance(a, jax.Array):
        return jax.device_put(np.asarray(a)[:n])
    return np.asarray(a)[:n]


def pad(tree: T, n: int, size: int) -> T:
    """``tree`` with every leaf that has a leading axis (of length ``n``) padded to ``size`` by
    repeating its last entry; scalar leaves (shared by every scenario) stay as they are.
    Returns ``tree`` itself, untouched, when ``size == n``."""
    if size == n:
        return tree
    if size < n:
        raise ValueError(f"pad: size = {size} is smaller than the batch of {n}")
    return jax.tree.map(lambda a: _pad_leaf(a, n, size) if np.ndim(a) else a, tree)


def spread(tree: T, size: int) -> T:
    """``tree`` with every scalar leaf (a value shared by all scenarios) repeated along a leading
    axis of ``size``, so that every leaf has one row per scenario.

    A jitted program's signature holds each leaf's shape, so a batch whose price is swept and a
    batch whose latency target is swept would otherwise compile two programs for one question;
    spread, every batch of a bucket with the same structure runs the same program. The programs
    broadcast shared values to the batch inside anyway (``dcost.search.problem.broadcast``), so
    only the arguments' shapes change, not what is computed. A concrete leaf is repeated in NumPy
    (no JAX program per shape), a traced one by ``jnp.broadcast_to``.

    >>> import numpy as np
    >>> [np.shape(a) for a in spread((np.float32(2.0), np.ones(4)), 4)]
    [(4,), (4,)]
    """

    def one(a):
        if np.ndim(a):
            return a
        if isinstance(a, jax.core.Tracer):
            return jnp.broadcast_to(a, (size,))
        return jax.device_put(np.full((size,), np.asarray(a)))

    return jax.tree.map(one, tree)


def unpad(tree: T, n: int, size: int) -> T:
    """The first ``n`` entries along the leading axis of every leaf of ``tree`` (the answers of
    a batch padded to ``size``); ``tree`` itself when ``size == n``."""
    if size == n:
        return tree
    return jax.tree.map(lambda a: _unpad_leaf(a, n) if np.ndim(a) else a, tree)


def bucketed(program: Callable[[Any, int | None], T], problem: Any, floor: int = MIN_BUCKET) -> T:
    """``program(problem, batch)`` run on the problem's batch padded to its bucket (every leaf
    with its row per scenario, ``spread``), the answers sliced back; ``program(problem, None)``
    for a single scenario. ``program`` must treat its scenarios independently (e.g. ``vmap``
    over them) and give every leaf of its result the leading scenario axis."""
    n = batch_size(problem)
    if n is None:
        return program(problem, None)
    size = bucket(n, floor)
    return unpad(program(spread(pad(problem, n, size), size), size), n, size)
