"""experiments/expert_count.py: its optima against exhaustive search and hand formulas."""

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))

import expert_count as X  # noqa: E402

# every test shares the experiment's run (the ``res`` fixture)
pytestmark = pytest.mark.slow

D_INF = 1e16
WINDOW = (16, 64)


@pytest.fixture(scope="module")
def res():
    return X.compute(experts=WINDOW, traffic=(D_INF,))


@pytest.fixture(scope="module")
def serving_grid():
    """Exact cheapest batch for every whole E in the window: one batched grid search, in float64
    (in float32 the memory limit binds within an ulp of the feasibility margin, where the grid's
    chunk and its re-check can round differently)."""
    with jax.enable_x64(True):
        e = np.arange(WINDOW[0], WINDOW[1] + 1.0)
        g = dcost.grid_search(X.serving_problem(jnp.asarray(e)))
        assert np.all(np.asarray(g.feasible))
        return e, np.asarray(g.cost), np.asarray(g.design.batch)


def hand_min_overtrain(model, experts, target):
    """Smallest whole r with hoffmann2022 loss <= target (1e-6 margin), in NumPy float64."""
    dense, n_e, k = (
        float(v) for v in (model.params_dense, model.params_per_expert, model.experts_active)
    )
    n_act = dense + k * n_e
    n_eff = n_act * ((dense + experts * n_e) / n_act) ** (1.0 / 3.0)
    r = np.arange(1.0, X.OVERTRAIN[1] + 1.0)
    ok = 1.69 + 406.4 / n_eff**0.34 + 410.7 / (20.0 * r * n_act) ** 0.28 <= target * (1 - 1e-6)
    return r[np.argmax(ok)], n_act


def test_serving_optimum_matches_grid(res, serving_grid):
    e, cost, batch = serving_grid
    for i, ei in enumerate(res["experts"]):
        j = int(np.searchsorted(e, ei))
        assert res["serving"]["cost"][i] <= cost[j] * 1.005
        assert abs(res["serving"]["batch"][i] / batch[j] - 1.0) < 1e-3
    # more experts never serve cheaper: the joint optimum is the lower bound
    assert np.all(np.diff(cost) >= 0)
    assert res["serving"]["best"]["experts"] == WINDOW[0]


def test_lifetime_optimum_matches_exhaustive(res, serving_grid):
    """Lifetime $ of E = pretraining at the smallest r meeting the loss (hand formula) + D_inf x
    the exact cheapest serving cost at E (grid): the loss does not depend on the batch, nor the
    serving constraints on r. The experiment's optimum must match its minimum over whole E."""
    e, cost, _ = serving_grid
    h, m, _ = X._specs()
    c_flop = float(h.price_per_hour) / (3600.0 * float(h.flops) * 0.4)
    r_min = np.array([hand_min_overtrain(m, ei, res["target_loss"])[0] for ei in e])
    n_act = hand_min_overtrain(m, 8.0, res["target_loss"])[1]
    total = 6.0 * n_act * (20.0 * r_min * n_act) * c_flop + D_INF * cost
    best = res[f"lifetime_{D_INF:.0e}"]["best"]
    k = int(np.argmin(total))
    assert best["feasible"]
    np.testing.assert_allclose(best["total"], total[k], rtol=5e-3)
    assert abs(total[int(np.searchsorted(e, best["experts"]))] / total[k] - 1.0) < 5e-3
    assert best["loss"] <= res["target_loss"]


def test_target_is_deepseek_v3_as_trained(res):
    """The loss target: hoffmann2022 at deepseek-v3's own size and 14.8T tokens, by hand."""
    m = dcost.model("deepseek-v3")
    n_act, n_tot = float(m.params_active), float(m.params_total)
    n_eff = n_act * (n_tot / n_act) ** (1.0 / 3.0)
    hand = 1.69 + 406.4 / n_eff**0.34 + 410.7 / 14.8e12**0.28
    np.testing.assert_allclose(res["target_loss"], hand, rtol=1e-5)
