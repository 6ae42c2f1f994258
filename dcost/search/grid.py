"""Exhaustive search: the exact model on every integer design within the bounds.

The ground truth ``dcost.optimize`` is tested against, and a tool in its own right for small
grids. The grid is walked in chunks of one jitted function, so memory grows with the chunk, not
with the grid (1e8 designs: about 0.5 GB of process memory in all, ``benchmarks/optimizer.py``);
each chunk is vmapped over its designs (and over the scenarios of a batched problem) and split
across all local JAX devices.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from dcost.search._jit import jit
from dcost.search.buckets import bucket, fine_bucket, pad, spread, unpad
from dcost.search.problem import (
    SEARCH_RTOL,
    Problem,
    admissible,
    batch_size,
    better,
    broadcast,
    evaluate,
)
from dcost.search.solution import Solution, Stats, finish
from dcost.specs import SpecError

__all__ = ["grid_search", "grid_points", "MIN_CHUNK_SIZE", "MAX_CHUNK_SIZE"]

_NO_INDEX = np.iinfo(np.int32).max
MIN_CHUNK_SIZE = 2**8
"""Fewest designs per jitted call. Each call costs about 0.2 ms of dispatch on a CPU, so smaller
chunks spend their time calling, not evaluating: 36,000 designs (llama-3-8b on h100-sxm) took
0.47 s in chunks of 16, 0.03 s in chunks of 256 and 0.02 s from 1,024 up; ``chunk_size=0``, taken
as one design per call, took half a minute on a larger grid."""
MAX_CHUNK_SIZE = 2**24
"""Most designs per jitted call (memory grows linearly with the chunk; 2**18 use about 0.1 GB)."""


def grid_points(problem: Problem) -> int:
    """Number of integer designs within the bounds, ``prod(hi - lo + 1)``."""
    return math.prod(hi - lo + 1 for _, lo, hi in problem.free)


def grid_search(
    problem: Problem, *, chunk_size: int = 2**18, progress: Callable[[int, int], None] | None = None
) -> Solution:
    """The cheapest feasible integer design, by evaluating every one with the exact model.

    .. math:: x^* = \\arg\\min_{x \\in \\mathbb{Z}^d,\\ lo \\le x \\le hi}
              \\{\\text{cost}(x) : \\text{value}_j(x) \\le \\text{limit}_j\\ \\forall j\\}

    Ties go to the first design in row-major order of the free variables. Designs whose
    attention groups do not divide their chips per stage (``dcost.search.problem.admissible``)
    are skipped. When no design is
    feasible, the one with the least total violation ``sum_j max(0, log(value_j/limit_j))`` is
    returned with ``feasible = False`` (see ``Solution.message``).

    A batch of scenarios is padded (``dcost.search.buckets``; the padding changes no answer): on
    a grid whose padded batch fits in one chunk to a power of two from 16 (7, 10 and 12
    scenarios run as 16 and share one compilation), on a larger one to the next of 1, 2, 3, 4,
    6, 8, 12, 16, 24, ... (``fine_bucket``: at most 1.5 times the work). Each chunk of
    ``chunk_size`` designs (summed over the padded scenarios) is one call of a jitted, vmapped
    function; with several local devices (GPUs, or CPU devices from
    ``XLA_FLAGS=--xla_force_host_platform_device_count=N``) each evaluates its share of the chunk
    under ``jax.shard_map``. For sweeps that outgrow one machine, start every process with
    ``jax.distributed.initialize()`` and give each its own slice of the scenarios (e.g. by
    ``jax.process_index()``), or of the grid through ``fixed``/bounds, then keep the cheapest
    feasible answer: the search is embarrassingly parallel and a plain min-reduce combines it.

    Args:
      problem: a ``dcost.Problem`` (its leaves may carry a batch axis).
      chunk_size: designs per jitted call, a whole number in ``[MIN_CHUNK_SIZE, MAX_CHUNK_SIZE]``
        (``[256, 16777216]``); memory grows linearly with it.
      progress: called as ``progress(done, total)`` after every chunk (designs per scenario).

    Returns:
      A ``dcost.Solution`` (``lambdas`` are NaN: a grid has no continuous relaxation).

    >>> import dcost
    >>> p = dcost.Problem(dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"),
    ...                   dcost.Workload(2048), free={"batch": (1, 512), "chips": (1, 8)},
    ...                   tpot_slo=0.02)
    >>> s = dcost.grid_search(p)
    >>> bool(s.feasible), bool(s.report.tpot <= 0.02)
    (True, True)
    """
    if not isinstance(problem, Problem):
        raise SpecError(
            f"grid_search.problem must be a dcost.Problem, got {type(problem).__name__}"
        )
    _check_chunk_size(chunk_size)
    if progress is not None and not callable(progress):
        raise SpecError(
            f"grid_search.progress = {progress!r} is not allowed: it must be None or a function "
            "progress(done, total)"
        )
    total = grid_points(problem)
    if total >= _NO_INDEX - chunk_size:
        raise ValueError(
            f"grid_search: {total:.3g} designs is more than one search handles "
            "(2**31); narrow Problem.free or split it into several problems"
        )
    n = batch_size(problem)
    if n == 0:
        raise SpecError(
            "grid_search.problem has a batch axis of 0 scenarios: give at least one (or none, "
            "for a single scenario)"
        )
    size = None
    if n is not None:
        # from MIN_BUCKET while the padded batch fits in one chunk, else at most 1.5 times the work
        size = bucket(n) if bucket(n) * total <= chunk_size else fine_bucket(n)
        problem = spread(pad(problem, n, size), size)
    scenarios = 1 if size is None else size
    devices = jax.devices()
    per_device = max(1, -(-chunk_size // (scenarios * len(devices))))
    per_device = min(per_device, -(-total // len(devices)))
    step = _chunk_step(len(devices), per_device, size)
    carry = (
        np.full(scenarios, np.inf, np.float32),
        np.full(scenarios, np.inf, np.float32),
        np.full(scenarios, _NO_INDEX, np.int32),
    )
    chunk = per_device * len(devices)
    for start in range(0, total, chunk):
        carry = step(problem, carry, np.int32(start))
        if progress is not None:
            jax.block_until_ready(carry)
            progress(min(start + chunk, total), total)
    solution = _finish(problem, carry[2], size)
    return solution if n is None or size is None else unpad(solution, n, size)


def _check_chunk_size(chunk_size) -> None:
    ok = isinstance(chunk_size, (int, np.integer)) and not isinstance(chunk_size, (bool, np.bool_))
    if not ok or not MIN_CHUNK_SIZE <= chunk_size <= MAX_CHUNK_SIZE:
        raise SpecError(
            f"grid_search.chunk_size = {chunk_size!r} is not allowed: it must be a whole number "
            f"(an int) from {MIN_CHUNK_SIZE} to {MAX_CHUNK_SIZE}"
        )


@functools.partial(jit, static_argnames=("batch",))
def _finish(problem, index, batch):
    """The Solution of the best flat ``index`` of every scenario."""
    d, n_c = len(problem.free), len(problem.constraints)
    nan = jnp.full((), jnp.nan)
    stats = Stats(
        evaluations=jnp.asarray(float(grid_points(problem))),
        steps=jnp.zeros(()),
        starts=jnp.zeros(()),
        continuous_x=jnp.full((d,), jnp.nan),
        continuous_cost=nan,
        smoothness=nan,
    )

    def one(p, i):
        return finish(p, _unravel(p, i), jnp.full((n_c,), jnp.nan), stats)

    if batch is None:
        return one(problem, index[0])
    return jax.vmap(one)(broadcast(problem, batch), index)


def _unravel(problem: Problem, index):
    """Flat row-major indices -> design vectors ``lo + multi_index`` (float)."""
    sizes = [hi - lo + 1 for _, lo, hi in problem.free]
    idx = jnp.asarray(index)
    digits = []
    for size in reversed(sizes):
        digits.append(idx % size)
        idx = idx // size
    multi = jnp.stack(digits[::-1], axis=-1).astype(jnp.result_type(float))
    return multi + jnp.asarray(problem.lower, multi.dtype)


def _merge(a, b):
    keep = better(a, b)
    return tuple(jnp.where(keep, x, y) for x, y in zip(a, b, strict=True))


def _best_of(problem1, index):
    """The best (violation, cost, index) among the designs ``index`` of one scenario."""
    total = grid_points(problem1)
    valid = index < total
    x = _unravel(problem1, jnp.minimum(index, total - 1))
    if problem1.divides is not None:  # attention groups that do not divide the chips: skipped
        valid = valid & jax.vmap(lambda v: admissible(problem1, v))(x)
    ev = jax.vmap(lambda v: evaluate(problem1, v, rtol=SEARCH_RTOL))(x)
    viol = jnp.where(valid & ~jnp.isnan(ev.violation), ev.violation, jnp.inf)
    cost = jnp.where(valid & ~jnp.isnan(ev.cost), ev.cost, jnp.inf)
    vmin = jnp.min(viol)
    cost = jnp.where(viol == vmin, cost, jnp.inf)
    cmin = jnp.min(cost)
    imin = jnp.min(jnp.where(valid & (viol == vmin) & (cost == cmin), index, _NO_INDEX))
    return vmin, cmin, imin.astype(jnp.int32)


@functools.lru_cache(maxsize=32)
def _chunk_step(n_devices: int, per_device: int, batch: int | None):
    """A jitted ``(problem, carry, start) -> carry`` over one chunk of the grid."""

    def local(pb, start, device):
        index = start + device * per_device + jnp.arange(per_device, dtype=jnp.int32)
        return jax.vmap(_best_of, in_axes=(0, None))(pb, index)

    if n_devices == 1:

        def chunk(pb, start):
            return local(pb, start, 0)
    else:
        mesh = Mesh(np.array(jax.devices()), ("grid",))

        def per_device_best(pb, start):
            out = local(pb, start, jax.lax.axis_index("grid"))
            return tuple(o[None] for o in out)

        sharded = jax.shard_map(
            per_device_best,
            mesh=mesh,
            in_specs=(PartitionSpec(), PartitionSpec()),
            out_specs=PartitionSpec("grid"),
        )

        def chunk(pb, start):
            parts = sharded(pb, start)  # each (n_devices, scenarios)
            best = tuple(p[0] for p in parts)
            for k in range(1, n_devices):
                best = _merge(best, tuple(p[k] for p in parts))
            return best

    # a vectorized sweep of up to millions of designs: XLA's own level whatever the process
    # prefers (under DCOST_FAST_COMPILE=1, level 0 took 20.4 s for a 24-scenario grid, 7.4 s so)
    @functools.partial(jit, sweep=True)
    def step(problem, carry, start):
        pb = broadcast(problem, 1 if batch is None else batch)
        return _merge(carry, chunk(pb, start))

    return step
