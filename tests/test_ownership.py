"""The whole bill: owning chips (dcost.pricing.ownership) and the tco objective."""

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost
from dcost.pricing import ownership as own_mod
from dcost.specs import SpecError

OWN = dcost.Ownership(30000.0, 12000.0, 4.0, 0.08, 0.10, 1.25, 150.0)


def test_annuity_against_a_hand_calculation():
    """$42,000 over 4 years at 8 %: payment 42000 * 0.08 / (1 - 1.08**-4) = 12,680.70 a year."""
    crf = 0.08 / (1.0 - 1.08**-4)
    assert float(own_mod.capital_recovery_factor(0.08, 4.0)) == pytest.approx(crf, rel=1e-6)
    h = dcost.hardware("h100-sxm")
    c = own_mod.chip_hour_cost(OWN, h, power=500.0)
    assert float(c.capital) == pytest.approx(42000.0 * crf / 8766.0, rel=1e-6)
    assert float(c.hosting) == pytest.approx(0.7 * 150.0 * 12 / 8766.0, rel=1e-6)
    assert float(c.electricity) == pytest.approx(0.5 * 1.25 * 0.10, rel=1e-6)
    assert float(c.total) == pytest.approx(float(c.capital + c.hosting + c.electricity), rel=1e-6)


@pytest.mark.x64
def test_annuity_at_zero_rate_and_its_gradient_there():
    assert float(own_mod.capital_recovery_factor(0.0, 5.0)) == pytest.approx(0.2)
    g = jax.grad(own_mod.capital_recovery_factor)(0.0, 5.0)
    fd = (
        own_mod.capital_recovery_factor(1e-4, 5.0) - own_mod.capital_recovery_factor(0.0, 5.0)
    ) / 1e-4
    assert float(g) == pytest.approx(float(fd), rel=1e-3)
    # just above the series' switch the exact form agrees with it
    assert float(own_mod.capital_recovery_factor(2e-6, 5.0)) == pytest.approx(
        0.2 + 2e-6 * 6 / 10, rel=1e-9
    )


@pytest.mark.x64
def test_tco_elasticities_match_finite_differences():
    d, w = dcost.Design(batch=64.0), dcost.Workload(1024.0)
    h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3.1-8b")
    own = dcost.Ownership(30000.0, 12000.0, 4.0, 0.08, 0.10, 1.25, 150.0)
    el = jax.jit(own_mod.elasticities)(d, h, m, w, own)
    tco = jax.jit(dcost.tco_per_token)
    f0 = float(tco(d, h, m, w, own))
    for name in ("purchase_price", "electricity_price_per_kwh", "pue", "years", "cost_of_capital"):
        x0 = float(getattr(own, name))
        s = 1e-6 * x0

        def at(x, name=name):
            o = eqx.tree_at(lambda t: getattr(t, name), own, jnp.asarray(x, jnp.float64))
            return float(tco(d, h, m, w, o))

        fd = (at(x0 + s) - at(x0 - s)) / (2 * s) * x0 / f0
        assert float(getattr(el, name)) == pytest.approx(fd, rel=1e-5), name
    # electricity price and PUE enter as one product: the same elasticity
    assert float(el.pue) == pytest.approx(float(el.electricity_price_per_kwh), rel=1e-9)
    # the shares add up: capital (both prices) + hosting + electricity = 1
    shares = float(el.purchase_price + el.server_price + el.hosting_per_kw_month + el.pue)
    assert shares == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize(
    "field, value, what",
    [
        ("purchase_price", -1.0, "purchase_price"),
        ("years", 0.0, "years"),
        ("cost_of_capital", 1.5, "cost_of_capital"),
        ("pue", 0.9, "pue"),
        ("electricity_price_per_kwh", float("nan"), "electricity_price_per_kwh"),
        ("hosting_per_kw_month", "150", "hosting_per_kw_month"),
    ],
)
def test_bad_ownership_inputs_are_named(field, value, what):
    fields = dict(
        purchase_price=1.0,
        server_price=1.0,
        years=4.0,
        cost_of_capital=0.05,
        electricity_price_per_kwh=0.1,
        pue=1.2,
        hosting_per_kw_month=100.0,
    )
    fields[field] = value
    with pytest.raises(SpecError, match=what):
        dcost.Ownership(**fields)


def test_ownership_presets_are_assumed_and_overridable():
    import tomllib
    from importlib import resources

    table = tomllib.loads(resources.files("dcost.presets").joinpath("ownership.toml").read_text())
    for section in [table["defaults"], *table["chip"].values()]:
        for entry in section.values():
            assert entry["source"].startswith("assumed")
    o = dcost.ownership("h100-sxm", pue=1.1)
    assert float(o.pue) == pytest.approx(1.1)
    with pytest.raises(dcost.PresetError, match="tpu-v4"):
        dcost.ownership("tpu-v4")
    with pytest.raises(SpecError, match="unknown"):
        dcost.ownership("h100-sxm", colour=1.0)


def test_owned_hardware_prices_tokens_by_ownership():
    h = dcost.hardware("h100-sxm")
    mine = dcost.owned(h, OWN, power=600.0)
    want = float(own_mod.chip_hour_cost(OWN, h, 600.0).total)
    assert float(mine.price_per_hour) == pytest.approx(want, rel=1e-6)
    d, m, w = dcost.Design(batch=32), dcost.model("llama-3.1-8b"), dcost.Workload(1000)
    ratio = float(
        dcost.decode(d, mine, m, w).cost_per_token / dcost.decode(d, h, m, w).cost_per_token
    )
    assert ratio == pytest.approx(want / float(h.price_per_hour), rel=1e-5)


@pytest.mark.parametrize("scale", [1.0, 0.15])  # 0.15: one replica barely pays, gaps follow
def test_breakeven_closed_form_and_never(scale):
    d, w = dcost.Design(batch=64), dcost.Workload(1024, prompt=1000, output=250)
    h, m = dcost.hardware("h100-sxm", calibrated=True), dcost.model("llama-3.1-8b")
    prices = {"input": 0.2e-6 * scale, "output": 0.8e-6 * scale, "cache_hit": 0.05e-6 * scale}
    b = dcost.breakeven(d, h, m, w, OWN, prices, cached_share=0.5)
    api = scale * (0.8e-6 + 4.0 * (0.5 * 0.2e-6 + 0.5 * 0.05e-6))
    assert float(b.api_cost_per_output_token) == pytest.approx(api, rel=1e-6)
    assert float(b.traffic) == pytest.approx(float(b.replica_cost_per_hour) / 3600 / api, rel=1e-6)
    x_dec = float(dcost.decode(d, h, m, w).tokens_per_s)
    x_pre = float(dcost.prefill(d, h, m, w).tokens_per_s)
    cap = 1.0 / (1.0 / x_dec + 0.5 * 4.0 / x_pre)
    assert float(b.replica_capacity) == pytest.approx(cap, rel=1e-6)
    # past the first replica, whole replicas against the API's linear bill, by brute force
    lam, x, c = float(b.traffic), cap, float(b.replica_cost_per_hour)
    grid = np.linspace(lam, 20 * x, 200001)
    owned_wins = np.ceil(grid / x) * c <= grid * 3600 * api * (1 + 1e-9)
    last_loss = grid[~owned_wins].max() if (~owned_wins).any() else lam
    assert float(b.traffic_always) == pytest.approx(max(last_loss, lam), rel=1e-3)
    assert (float(b.traffic_always) > 2 * lam) == (scale < 1)
    cheap = dcost.breakeven(d, h, m, w, OWN, {"input": 1e-12, "output": 1e-12})
    assert np.isinf(float(cheap.traffic)) and np.isinf(float(cheap.traffic_always))
    with pytest.raises(SpecError, match="cache_hit"):
        dcost.breakeven(d, h, m, w, OWN, {"input": 1e-7, "output": 1e-7}, cached_share=0.3)
    with pytest.raises(SpecError, match="cached_share"):
        dcost.breakeven(d, h, m, w, OWN, prices, cached_share=1.5)


def _tco_problem():
    h, m = dcost.hardware("h100-sxm", calibrated=True), dcost.model("llama-3.1-8b")
    return dcost.Problem(
        hardware=h,
        model=m,
        workload=dcost.Workload(1024),
        objective="tco",
        free={"batch": (1, 512)},
        tpot_slo=0.03,
        extras=OWN,
    )


def test_tco_objective_grid_optimum_is_tco_per_token():
    p = _tco_problem()
    grid = dcost.grid_search(p)
    assert bool(grid.feasible)
    want = dcost.tco_per_token(grid.design, p.hardware, p.model, p.workload, OWN)
    assert float(grid.cost) == pytest.approx(float(want), rel=1e-5)
    # the cheapest owned design: no feasible batch in the bounds is cheaper
    for b in (float(grid.design.batch) - 1, float(grid.design.batch) // 2):
        other = dcost.tco_per_token(dcost.Design(batch=b), p.hardware, p.model, p.workload, OWN)
        assert float(other) >= float(grid.cost)
    with pytest.raises(SpecError, match="Ownership"):
        dcost.Problem(hardware=p.hardware, model=p.model, workload=p.workload, objective="tco")


@pytest.mark.slow
def test_tco_objective_optimize_finds_the_grid_optimum():
    p = _tco_problem()
    grid, opt = dcost.grid_search(p), dcost.optimize(p)
    assert bool(opt.feasible)
    assert float(opt.cost) == pytest.approx(float(grid.cost), rel=1e-6)


@pytest.mark.parametrize("field", ["purchase_price", "electricity_price_per_kwh"])
def test_tco_optimum_sensitivity_matches_re_solving(field):
    """The elasticity at the grid optimum against re-solving with the input 1 % higher."""
    h, m, w = dcost.hardware("h100-sxm", calibrated=True), dcost.model("llama-3.1-8b"), None
    w = dcost.Workload(1024)

    def solve(own):
        p = dcost.Problem(
            hardware=h,
            model=m,
            workload=w,
            objective="tco",
            free={"batch": (1, 512)},
            tpot_slo=0.03,
            extras=own,
        )
        return dcost.grid_search(p)

    base = solve(OWN)
    el = float(getattr(own_mod.elasticities(base.design, h, m, w, OWN), field))
    moved = eqx.tree_at(lambda o: getattr(o, field), OWN, getattr(OWN, field) * 1.01)
    again = solve(moved)
    measured = np.log(float(again.cost) / float(base.cost)) / np.log(1.01)
    assert el == pytest.approx(measured, rel=0.01, abs=1e-4)
