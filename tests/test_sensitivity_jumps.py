"""Shadow prices where the relaxed optimum sits at a jump of the model (a scale-up domain's edge).

llama-3-70b on h100-sxm with chips and stages free: the relaxed optimum puts a stage's chips on
the edge of the 8-chip NVLink domain (one more chip and the tensor-parallel link drops to
scale-out). The polish holds the chips there; the multiplier of the tpot limit is then the shadow
price at that layout, checked by re-solving the relaxation with the limit moved by a relative
``1e-4`` either way (central differences in float64): the re-solved optima hold the chips on the
edge too, so the slope of their cost is that price. Every target and its two neighbours are one
batch of one compiled program, which the check that padding changes no sensitivity (batches of 5
and 16 in the bucket of 16) runs again rather than compiling one of its own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost

# every test shares the solved frontier at the link jumps (the ``solved`` fixture)
pytestmark = pytest.mark.slow

H = 1e-4
TARGETS = (0.0127, 0.0159, 0.020, 0.026)
FREE = {"batch": (1, 1024), "chips": (1, 16), "stages": (1, 8)}


def problem(tpot, price=None):
    prices = {} if price is None else {"price_per_hour": price}
    return dcost.Problem(
        dcost.hardware("h100-sxm", **prices),
        dcost.model("llama-3-70b"),
        dcost.Workload(4096),
        free=FREE,
        tpot_slo=tpot,
        objective="cost_per_token",
    )


@pytest.fixture(scope="module")
def solved():
    """Rows ``3 i``, ``3 i + 1``, ``3 i + 2``: target ``i`` itself, ``1 + H`` and ``1 - H``
    times it."""
    with jax.enable_x64(True):
        slo = jnp.asarray([t * f for t in TARGETS for f in (1.0, 1 + H, 1 - H)])
        s = dcost.sensitivity(problem(slo))
        jax.block_until_ready(s)
    return s


def test_kkt_point_at_the_domain_edge(solved):
    s = solved
    assert np.all(np.asarray(s.relaxed.kkt))
    assert np.all(~np.asarray(s.relaxed.interior[:, 1]))  # the chips are held...
    assert np.allclose(np.asarray(s.relaxed.x[:, 1]), 8.0)  # ...on the domain's edge, G = S
    assert np.all(np.asarray(s.relaxed.active[:, 0]))


def test_tpot_price_matches_resolving_at_the_held_layout(solved):
    s = solved
    lam = np.asarray(s.relaxed.lambdas[:, 0])[0::3]
    assert np.all(lam > 0.05)
    log_cost = np.asarray(s.relaxed.log_cost).reshape(-1, 3)
    slope = (log_cost[:, 1] - log_cost[:, 2]) / (np.log1p(H) - np.log1p(-H))
    np.testing.assert_allclose(-lam, slope, atol=1e-6)


def test_moving_the_limit_keeps_the_held_chips(solved):
    """The neighbours' optima hold a stage's chips where their target's does (the other
    variables move with the limit), so the slope above is the price at one layout; their costs
    straddle the target's."""
    s = solved
    chips = np.asarray(s.relaxed.x)[:, 1].reshape(-1, 3)
    np.testing.assert_array_equal(chips, np.repeat(chips[:, :1], 3, axis=1))
    log_cost = np.asarray(s.relaxed.log_cost).reshape(-1, 3)
    assert np.all(log_cost[:, 1] < log_cost[:, 0]) and np.all(log_cost[:, 0] < log_cost[:, 2])
    np.testing.assert_allclose(log_cost[:, 1:].mean(axis=1), log_cost[:, 0], atol=1e-6)


def test_rows_ignore_their_padding(solved):
    """Padding changes no sensitivity: a batch of 5 runs the program compiled for 16 (the
    fixture's) with rows 5-15 repeating scenario 4; a batch of 16 whose first 5 rows are the same
    scenarios and whose other 11 differ (other prices and targets) runs it too, and each of the
    5 scenarios comes out the same (its elasticities, multipliers, active sets and polished
    point do not depend on the rows beside it)."""
    tight, others = [0.002, *TARGETS], 11  # 2 ms: infeasible (the weights take 5 ms to read)
    with jax.enable_x64(True):
        padded = dcost.sensitivity(problem(jnp.asarray(tight), price=jnp.linspace(2.0, 4.0, 5)))
        wide = problem(
            jnp.concatenate([jnp.asarray(tight), jnp.geomspace(0.01, 0.2, others)]),
            price=jnp.concatenate([jnp.linspace(2.0, 4.0, 5), jnp.linspace(5.0, 6.0, others)]),
        )
        full = dcost.sensitivity(wide)
    assert padded.log_ratios.shape == (5, 2) and full.log_ratios.shape == (16, 2)
    assert list(padded.feasible) == [False, True, True, True, True]
    np.testing.assert_array_equal(padded.feasible, full.feasible[:5])
    assert padded.message == full.message[:5]
    for field in ("active", "interior", "kkt"):
        np.testing.assert_array_equal(
            getattr(padded.relaxed, field), getattr(full.relaxed, field)[:5]
        )
    checked = 0
    for a, b in zip(jax.tree.leaves(padded), jax.tree.leaves(full), strict=True):
        a, b = np.asarray(a), np.asarray(b)
        if a.ndim and a.shape[0] == 5 and np.issubdtype(a.dtype, np.floating):
            np.testing.assert_allclose(a, b[:5], rtol=1e-9, atol=1e-12)
            checked += 1
    assert checked > 5
    # the scenarios at a target of the fixture: the same answers as there (row 3 i)
    np.testing.assert_allclose(
        np.asarray(padded.relaxed.log_cost[1:]) - np.log(np.linspace(2.0, 4.0, 5)[1:]),
        np.asarray(solved.relaxed.log_cost[0::3])
        - np.log(float(dcost.hardware("h100-sxm").price_per_hour)),
        atol=1e-9,
    )
