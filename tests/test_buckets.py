"""Scenario buckets: batches padded to a few sizes compile once, and padding changes no answer.

Each search here runs under a structure of its own (settings or bounds no other test uses), so
its first batched call must trace exactly once whatever ran before in the process; the counters
are Python side effects in functions that run only while JAX traces.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost
from dcost.search import buckets, grid
from dcost.search import optimize as optimize_mod
from dcost.search.buckets import MIN_BUCKET, bucket, pad, unpad
from dcost.search.optimize import Settings

# small searches, each with a structure (static settings / bounds) of its own
SETTINGS = Settings(starts=2, rounds=3, steps=4, local_rounds=1)
GRID_FREE = {"batch": (1, 47), "chips": (1, 3)}  # 141 designs
OPT_FREE = {"batch": (1, 300), "chips": (1, 8)}


def problem(n, free=OPT_FREE):
    """``n`` scenarios of llama-3-8b on H100, tpot targets from tight (infeasible) to loose, the
    price varying too, so the scenarios have different answers."""
    return dcost.Problem(
        dcost.hardware("h100-sxm", price_per_hour=jnp.linspace(2.0, 4.0, n)),
        dcost.model("llama-3-8b"),
        dcost.Workload(2048),
        free=free,
        tpot_slo=jnp.geomspace(0.0003, 0.05, n),
    )


def _take(tree, i):
    """Scenario ``i`` of a batched problem or solution, unbatched."""
    return jax.tree.map(lambda a: a[i] if jnp.ndim(a) else a, tree)


class Counter:
    """Wraps a function and counts its calls (here: its traces)."""

    def __init__(self, fun):
        self.fun, self.calls = fun, 0

    def __call__(self, *args, **kw):
        self.calls += 1
        return self.fun(*args, **kw)


def assert_same(a, b, exact=True):
    """Two solutions agree: design, feasibility, binding constraints, bounds, cost, multipliers."""
    np.testing.assert_array_equal(np.asarray(a.x), np.asarray(b.x))
    np.testing.assert_array_equal(np.asarray(a.feasible), np.asarray(b.feasible))
    np.testing.assert_array_equal(np.asarray(a.active), np.asarray(b.active))
    np.testing.assert_array_equal(np.asarray(a.bounds), np.asarray(b.bounds))
    assert a.binding == b.binding
    rtol = 0 if exact else 1e-5
    np.testing.assert_allclose(np.asarray(a.cost), np.asarray(b.cost), rtol=rtol)
    for name in a.constraints:
        np.testing.assert_allclose(
            np.asarray(a.multipliers[name]), np.asarray(b.multipliers[name]), rtol=rtol
        )


def test_bucket_sizes():
    assert MIN_BUCKET == 16
    assert [bucket(n) for n in (1, 7, 10, 12, 16)] == [16] * 5
    assert [bucket(n) for n in (17, 32, 33, 1000)] == [32, 32, 64, 1024]
    assert [bucket(n, floor=1) for n in (1, 2, 3, 4, 5, 9)] == [1, 2, 4, 4, 8, 16]


def test_fine_bucket_is_the_least_power_of_two_or_three_times_one():
    """Against a brute force over the sizes ``2**k`` and ``3 * 2**k``: the least one at or above
    ``n``, so a large grid's padding is less than half its batch."""
    sizes = sorted({2**k for k in range(12)} | {3 * 2**k for k in range(11)})
    for n in range(1, 1025):
        want = min(s for s in sizes if s >= n)
        assert buckets.fine_bucket(n) == want, n
        assert n <= want < 1.5 * n
    assert buckets.fine_bucket(0) == 0
    with pytest.raises(ValueError, match="fine_bucket"):
        buckets.fine_bucket(-1)


def test_empty_bucket_and_bad_input():
    assert bucket(0) == 0  # an empty batch stays empty
    with pytest.raises(ValueError, match="n = -1"):
        bucket(-1)


def test_grid_search_refuses_an_empty_batch():
    with pytest.raises(dcost.SpecError, match="batch axis of 0 scenarios"):
        dcost.grid_search(problem(0, GRID_FREE))


def test_pad_repeats_the_last_scenario_and_unpad_slices_it_off():
    p = problem(3)
    q = pad(p, 3, 16)
    np.testing.assert_array_equal(q.limits.tpot_slo[:3], p.limits.tpot_slo)
    np.testing.assert_array_equal(q.limits.tpot_slo[3:], np.full(13, p.limits.tpot_slo[-1]))
    assert q.hardware.price_per_hour.shape == (16,)
    assert q.model.n_layers is p.model.n_layers  # a scalar leaf, shared, stays as it is
    assert q.limits.tpot_slo.dtype == p.limits.tpot_slo.dtype
    back = unpad(q, 3, 16)
    np.testing.assert_array_equal(back.limits.tpot_slo, p.limits.tpot_slo)
    assert isinstance(back.limits.tpot_slo, type(p.limits.tpot_slo))  # a JAX array again


def test_exact_bucket_does_no_padding_work(monkeypatch):
    def fail(*args, **kw):
        raise AssertionError("padded or sliced a batch already at its bucket")

    monkeypatch.setattr(buckets, "_pad_leaf", fail)
    monkeypatch.setattr(buckets, "_unpad_leaf", fail)
    p = problem(16)
    assert pad(p, 16, 16) is p
    assert unpad(p, 16, 16) is p
    s = dcost.grid_search(problem(16, GRID_FREE))  # runs without touching a leaf
    assert s.cost.shape == (16,)
    with pytest.raises(AssertionError, match="already at its bucket"):
        pad(problem(15), 15, 16)  # the guard itself can fail


def test_grid_search_compiles_once_for_7_10_12_scenarios(monkeypatch):
    traces = Counter(grid._best_of)  # traced once per compilation of a chunk step
    finishes = Counter(grid.finish)  # traced once per compilation of the final check
    monkeypatch.setattr(grid, "_best_of", traces)
    monkeypatch.setattr(grid, "finish", finishes)
    free = {"batch": (1, 45), "chips": (1, 3)}  # a structure of this test's own
    counts = []
    for n in (7, 10, 12, 16):
        s = dcost.grid_search(problem(n, free))
        assert s.cost.shape == (n,) and s.x.shape == (n, 2)
        counts.append((traces.calls, finishes.calls))
    assert counts == [(1, 1)] * 4
    dcost.grid_search(problem(17, free))  # the next bucket (32) does compile: the counter works
    assert (traces.calls, finishes.calls) == (2, 2)


def test_grid_search_padded_equals_unpadded_and_one_by_one(monkeypatch):
    p = problem(10, GRID_FREE)
    padded = dcost.grid_search(p)
    assert padded.cost.shape == (10,) and padded.problem.limits.tpot_slo.shape == (10,)
    assert not np.all(padded.feasible) and np.any(padded.feasible)  # both kinds of answer
    with monkeypatch.context() as m:
        m.setattr(grid, "bucket", lambda n, floor=MIN_BUCKET: n)  # no padding: a batch of 10
        unpadded = dcost.grid_search(p)
    assert_same(padded, unpadded)
    for i in (0, 4, 9):
        alone = dcost.grid_search(_take(p, i))
        assert_same(_take(padded, i), alone, exact=False)
        assert padded.message[i] == alone.message


def test_grid_search_large_grid_pads_less(monkeypatch):
    """Past one chunk a grid pads to ``fine_bucket``, not to 16: 3 scenarios on a grid of 300
    designs in chunks of 256 run as 3 and 5 as 6; within one chunk, as 16."""
    steps = []

    def chunk_step(n_devices, per_device, batch, _real=grid._chunk_step):
        steps.append(batch)
        return _real(n_devices, per_device, batch)

    monkeypatch.setattr(grid, "_chunk_step", chunk_step)
    free = {"batch": (1, 100), "chips": (1, 3)}
    big = dcost.grid_search(problem(3, free), chunk_size=256)
    small = dcost.grid_search(problem(3, free))
    five = dcost.grid_search(problem(5, free), chunk_size=256)
    assert steps == [3, 16, 6]
    assert_same(big, small)
    assert_same(five, dcost.grid_search(problem(5, free)))


def test_optimize_compiles_once_for_7_10_12_scenarios_whatever_they_sweep(monkeypatch):
    traces = Counter(optimize_mod._relax_one)
    monkeypatch.setattr(optimize_mod, "_relax_one", traces)
    before = optimize_mod._relax.compiled()._cache_size()
    rounds = optimize_mod._round.compiled()._cache_size()
    for n in (7, 10, 12):
        s = dcost.optimize(problem(n), SETTINGS)
        assert s.cost.shape == (n,) and s.problem.limits.tpot_slo.shape == (n,)
        assert len(s.binding) == n
    # a batch that sweeps other fields (the context, one price and one target for all) has the
    # same structure: every leaf gets its row per scenario (buckets.spread), one program
    other = dcost.Problem(
        dcost.hardware("h100-sxm"),
        dcost.model("llama-3-8b"),
        dcost.Workload(jnp.linspace(512.0, 8192.0, 5)),
        free=OPT_FREE,
        tpot_slo=0.02,
    )
    s = dcost.optimize(other, SETTINGS)
    assert s.cost.shape == (5,) and bool(np.all(s.feasible))
    one = dcost.optimize(_take(other, 3), SETTINGS)  # unbatched: a program of its own
    np.testing.assert_array_equal(np.asarray(s.x[3]), np.asarray(one.x))
    assert traces.calls == 2
    assert optimize_mod._relax.compiled()._cache_size() == before + 2
    assert optimize_mod._round.compiled()._cache_size() == rounds + 2


@pytest.mark.slow
def test_optimize_padded_equals_unpadded_and_one_by_one(monkeypatch):
    p = problem(10)
    padded = dcost.optimize(p, SETTINGS)
    assert not np.all(padded.feasible) and np.any(padded.feasible)
    with monkeypatch.context() as m:
        m.setattr(buckets, "bucket", lambda n, floor=MIN_BUCKET: n)  # a batch of 10, unpadded
        unpadded = dcost.optimize(p, SETTINGS)
    assert_same(padded, unpadded)
    for i in (0, 5, 9):
        alone = dcost.optimize(_take(p, i), SETTINGS)
        assert_same(_take(padded, i), alone, exact=False)
        assert padded.message[i] == alone.message


@pytest.mark.slow
def test_pareto_padded_equals_unpadded(monkeypatch):
    """The frontier (pareto) padded to its bucket against unpadded. (That padding changes no
    sensitivity is checked in test_sensitivity_jumps.py, beside the program it shares.)"""
    single = dcost.Problem(
        dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"), dcost.Workload(2048), free=OPT_FREE
    )
    slos = [0.0003, 0.004, 0.01, 0.05]
    f = dcost.pareto(single, slos, SETTINGS)
    with monkeypatch.context() as m:
        m.setattr(buckets, "bucket", lambda n, floor=MIN_BUCKET: n)
        g = dcost.pareto(single, slos, SETTINGS)
    assert f.cost.shape == (4,) and not bool(f.feasible[0]) and bool(f.feasible[-1])
    np.testing.assert_array_equal(f.cost, g.cost)
    assert_same(f.solution, g.solution)
