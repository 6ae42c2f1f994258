"""Batch departures: the scan against an independent event loop, and the closed forms."""

import math

import jax
import numpy as np
import pytest

import dcost
from dcost.serving.queueing import poisson_gaps, simulate_departures, train_latency

TAU = 0.02  # s
SMALL, LARGE = 400, 100_000  # requests; few distinct shapes keep the compilations few


def reference(gaps, step_time, policy, interval, capacity, per_seq):
    """Batch-by-batch event loop in float64 absolute time, written independently of the scan."""
    a = np.cumsum(np.asarray(gaps, dtype=np.float64))
    n = len(a)
    wait, lat, size = np.empty(n), np.empty(n), np.empty(n)
    i, prev_finish = 0, -math.inf
    while i < n:
        if policy == "when_full":
            j = int(min(i + capacity, n))
            depart = max(prev_finish, a[j - 1])
        else:
            earliest = max(prev_finish, a[i])
            if policy == "fixed":
                depart = interval * math.ceil(earliest / interval - 1e-9)
            else:
                depart = earliest
            waiting = int(np.searchsorted(a, depart, side="right")) - i
            j = int(i + min(capacity, waiting))
        members = j - i
        finish = depart + max(step_time, members * per_seq)
        wait[i:j], lat[i:j], size[i:j] = depart - a[i:j], finish - a[i:j], members
        prev_finish, i = finish, j
    return wait, lat, size


CASES = {
    "fixed": ("fixed", None, math.inf, 0.0, 80.0),
    "fixed-capacity": ("fixed", None, 3.0, 0.0, 200.0),
    "fixed-long-step": ("fixed", 0.015, math.inf, 0.0, 50.0),
    "when_free": ("when_free", None, math.inf, 0.0, 60.0),
    "when_free-roofline": ("when_free", None, math.inf, 0.004, 300.0),
    "when_free-capacity": ("when_free", None, 4.0, 0.0, 400.0),
    "when_full": ("when_full", None, 5.0, 0.0, 100.0),
    "when_full-roofline": ("when_full", None, 8.0, 0.003, 600.0),
}


@pytest.mark.parametrize("case", list(CASES))
def test_scan_matches_event_loop(case):
    policy, interval, capacity, per_seq, rate = CASES[case]
    gaps = np.asarray(poisson_gaps(jax.random.PRNGKey(1), rate, SMALL))
    d = simulate_departures(
        gaps,
        TAU,
        policy=policy,
        interval=interval,
        capacity=capacity,
        step_time_per_sequence=per_seq,
    )
    wait, lat, size = reference(gaps, TAU, policy, interval or TAU, capacity, per_seq)
    # float32 scan against float64 loop: a wait is a difference of absolute times up to the
    # horizon (8 s at 50 requests/s), each rounded to float32, so a few of the horizon's ulps
    atol = 4 * np.finfo(np.float32).eps * float(np.sum(gaps))
    np.testing.assert_allclose(np.asarray(d.wait), wait, rtol=1e-5, atol=atol)
    np.testing.assert_allclose(np.asarray(d.latency), lat, rtol=1e-5, atol=atol)
    np.testing.assert_array_equal(np.asarray(d.batch_size), size)


def test_fixed_interval_matches_closed_form():
    """Mean 1.5 tau, worst 2 tau, and the wait uniform on [0, tau]."""
    gaps = poisson_gaps(jax.random.PRNGKey(0), 150.0, LARGE)
    d = simulate_departures(gaps, TAU)
    mean, worst = train_latency(TAU)
    lat, wait = np.asarray(d.latency), np.asarray(d.wait)
    assert abs(lat.mean() - mean) < 0.005 * mean
    assert worst * 0.999 < lat.max() <= worst * (1 + 1e-5)
    assert lat.min() >= TAU * (1 - 1e-5)
    qs = np.linspace(0.05, 0.95, 19)
    np.testing.assert_allclose(np.quantile(wait, qs), qs * TAU, atol=0.01 * TAU)


@pytest.mark.parametrize("load, expected", [(1e-3, 1.0), (200.0, 1.5)])
def test_when_free_limits(load, expected):
    """Idle server: a request leaves on arrival (latency tau); saturated: back-to-back batches."""
    gaps = poisson_gaps(jax.random.PRNGKey(2), load / TAU, LARGE)
    d = simulate_departures(gaps, TAU, policy="when_free")
    assert abs(float(d.latency.mean()) / TAU - expected) < 0.01


def test_when_full_waits_for_the_batch_to_fill():
    """Light load: the j-th of C members waits C - j gaps, mean (C - 1) / (2 rate)."""
    rate, cap, n = 5.0, 10, LARGE  # rate * TAU = 0.1: the server is never the bottleneck
    gaps = poisson_gaps(jax.random.PRNGKey(3), rate, n)
    d = simulate_departures(gaps, TAU, policy="when_full", capacity=float(cap))
    full = slice(0, n - n % cap)  # the tail batch is partial
    assert np.all(np.asarray(d.batch_size)[full] == cap)
    expected = (cap - 1) / (2 * rate) + TAU
    assert abs(float(d.latency[full].mean()) - expected) < 0.02 * expected


@pytest.mark.parametrize("policy", ["fixed", "when_free", "when_full"])
def test_batches_partition_the_requests(policy):
    gaps = poisson_gaps(jax.random.PRNGKey(4), 500.0, SMALL)
    d = simulate_departures(gaps, TAU, policy=policy, capacity=7.0)
    idx, size = np.asarray(d.batch_index), np.asarray(d.batch_size)
    counts = np.bincount(idx)
    assert np.all(np.diff(idx) >= 0) and np.all(counts > 0)
    np.testing.assert_array_equal(counts[idx], size)
    assert size.max() <= 7
    assert np.all(np.asarray(d.wait) >= -1e-6 * TAU)


def test_vmap_over_loads_equals_single_runs():
    rates = np.array([10.0, 100.0, 1000.0])
    unit = poisson_gaps(jax.random.PRNGKey(5), 1.0, SMALL)
    batched = jax.vmap(lambda r: simulate_departures(unit / r, TAU, policy="when_free").latency)(
        rates
    )
    for i, r in enumerate(rates):
        single = simulate_departures(unit / r, TAU, policy="when_free").latency
        np.testing.assert_allclose(np.asarray(batched[i]), np.asarray(single), rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"policy": "sometimes"}, "policy"),
        ({"capacity": 0.0}, "capacity"),
        ({"interval": -1.0}, "interval"),
        ({"step_time_per_sequence": -1e-3}, "step_time_per_sequence"),
    ],
)
def test_bad_input_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        simulate_departures(np.ones(4), TAU, **kwargs)


def test_bad_step_time_names_the_field():
    with pytest.raises(dcost.SpecError, match="step_time = 0.0"):
        simulate_departures(np.ones(4), 0.0)
