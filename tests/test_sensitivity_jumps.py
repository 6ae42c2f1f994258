"""Shadow prices where the relaxed optimum sits at a jump of the model (a scale-up domain's edge).

llama-3-70b on h100-sxm with chips and stages free: the relaxed optimum puts a stage's chips on
the edge of the 8-chip NVLink domain (one more chip and the tensor-parallel link drops to
scale-out). The polish holds the chips there; the multiplier of the tpot limit is then the shadow
price at that layout, checked by re-solving the relaxation with the chips fixed at their held
value and the limit moved (central differences in float64).
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
TARGETS = (0.0127, 0.0159, 0.020, 0.025)
FREE = {"batch": (1, 1024), "chips": (1, 16), "stages": (1, 8)}


def problem(tpot, free=FREE, fixed=None):
    return dcost.Problem(
        dcost.hardware("h100-sxm"),
        dcost.model("llama-3-70b"),
        dcost.Workload(4096),
        free=free,
        fixed=fixed,
        tpot_slo=tpot,
        objective="cost_per_token",
    )


@pytest.fixture(scope="module")
def solved():
    with jax.enable_x64(True):
        s = dcost.sensitivity(problem(jnp.asarray(TARGETS)))
        chips = s.relaxed.x[:, 1]
        slo = jnp.asarray([t * f for t in TARGETS for f in (1 + H, 1 - H)])
        held = {k: v for k, v in FREE.items() if k != "chips"}
        fixed = dcost.Design(batch=1.0, chips=jnp.repeat(chips, 2))
        again = dcost.sensitivity(problem(slo, held, fixed))
        jax.block_until_ready((s, again))
    return s, again


def test_kkt_point_at_the_domain_edge(solved):
    s, _ = solved
    assert np.all(np.asarray(s.relaxed.kkt))
    assert np.all(~np.asarray(s.relaxed.interior[:, 1]))  # the chips are held...
    assert np.allclose(np.asarray(s.relaxed.x[:, 1]), 8.0)  # ...on the domain's edge, G = S
    assert np.all(np.asarray(s.relaxed.active[:, 0]))


def test_tpot_price_matches_resolving_at_the_held_layout(solved):
    s, again = solved
    lam = np.asarray(s.relaxed.lambdas[:, 0])
    assert np.all(lam > 0.05)
    assert np.all(np.asarray(again.relaxed.kkt))
    log_cost = np.asarray(again.relaxed.log_cost).reshape(-1, 2)
    slope = (log_cost[:, 0] - log_cost[:, 1]) / (np.log1p(H) - np.log1p(-H))
    np.testing.assert_allclose(-lam, slope, atol=1e-6)


def test_held_layout_costs_the_same(solved):
    """Fixing the chips where the polish held them changes nothing at the base limit."""
    s, again = solved
    mid = np.asarray(again.relaxed.log_cost).reshape(-1, 2).mean(axis=1)
    np.testing.assert_allclose(mid, np.asarray(s.relaxed.log_cost), atol=1e-6)
