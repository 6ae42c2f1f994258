"""``experiments/overtraining.py``: its key numbers against closed forms written here.

The experiment's ``compute()`` runs with a small sweep (same code path as the script). The checks
use the fits' raw numbers from the presets card and plain float64 NumPy: the lecture's arithmetic,
the loss constraint, the first-order condition of ``min 6 N D + 2 N D_inf`` along it, the
pretraining share at the optimum, the compute-optimal limit, and an exhaustive search along the
constraint.
"""

import math
import pathlib
import sys

import matplotlib.pyplot as plt
import numpy as np
import pytest

import dcost
from dcost.training.scaling import scaling_fit_card

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "experiments"))

import overtraining  # noqa: E402

FITS = ("hoffmann2022", "besiroglu2024")


@pytest.fixture(scope="module")
def res():
    return overtraining.compute(n_inf=25, n_curve=161)


def card(name):
    c = scaling_fit_card(name)
    return tuple(float(c[k]) for k in ("E", "A", "B", "alpha", "beta"))


def loss(name, n, d):
    e, a, b, alpha, beta = card(name)
    return e + a * np.asarray(n) ** -alpha + b * np.asarray(d) ** -beta


def foc_ratio(name, n, d, d_inf):
    """d(6 N D + 2 N D_inf)/dN = 0 along L = L*, with dD/dN = -(alpha A N^-alpha D)/(beta B
    D^-beta N): (3 D + D_inf) beta B D^-beta = 3 D alpha A N^-alpha. Returns left / right."""
    _, a, b, alpha, beta = card(name)
    n, d = np.asarray(n), np.asarray(d)
    return (3 * d + d_inf) * beta * b * d**-beta / (3 * d * alpha * a * n**-alpha)


def test_lecture_estimate_arithmetic(res):
    lec, d_inf = res["lecture"], res["inputs"]["inference_tokens"]
    assert d_inf == pytest.approx(5e7 * 86_400 * 60, rel=1e-12)  # 2.592e14 tokens
    assert lec["n_tokens"] == pytest.approx(d_inf / 3, rel=1e-12)  # 6 N D = 2 N D_inf
    n = lec["n_params"]
    assert n == 1e11
    assert 6 * n * lec["n_tokens"] == pytest.approx(2 * n * d_inf, rel=1e-12)
    assert lec["flops"] == pytest.approx(12 * n * lec["n_tokens"], rel=1e-12)
    assert lec["overtrain"] == pytest.approx(lec["n_tokens"] / (20 * n), rel=1e-12)
    assert lec["overtrain"] == pytest.approx(43.2, rel=1e-12)


@pytest.mark.parametrize("name", FITS)
def test_flop_optimum_first_order_condition(res, name):
    f, lec, d_inf = res["fits"][name], res["lecture"], res["inputs"]["inference_tokens"]
    e = card(name)[0]
    target = loss(name, lec["n_params"], lec["n_tokens"])
    assert f["target_loss"] == pytest.approx(target, rel=1e-12)
    opt = f["flop_optimum"]
    n, d = opt["n_params"], opt["n_tokens"]
    assert loss(name, n, d) == pytest.approx(target, rel=1e-9)  # on the constraint
    assert foc_ratio(name, n, d, d_inf) == pytest.approx(1.0, rel=1e-6)
    assert opt["flops"] == pytest.approx(6 * n * d + 2 * n * d_inf, rel=1e-12)
    _, a, _, alpha, beta = card(name)
    u = a * n**-alpha / (target - e)  # the parameter term's share of the reducible loss
    assert opt["train_fraction"] == pytest.approx(beta * (1 - u) / (alpha * u), rel=1e-6)
    assert opt["flops"] <= lec["flops"]  # the optimizer's plan is no worse than the lecture's
    assert opt["flop_saving"] == pytest.approx(1 - opt["flops"] / lec["flops"], rel=1e-9)


@pytest.mark.parametrize("name", FITS)
def test_flop_optimum_beats_every_point_on_the_constraint(res, name):
    """Exhaustive search over the plotted curve: no N on it costs fewer lifetime FLOPs."""
    f, cv = res["fits"][name], res["curve"][name]
    n, d = res["curve"]["n_params"], cv["n_tokens"]
    ok = np.isfinite(d)
    np.testing.assert_allclose(loss(name, n[ok], d[ok]), f["target_loss"], rtol=1e-9)
    np.testing.assert_allclose(cv["pretrain_flops"][ok], 6 * n[ok] * d[ok], rtol=1e-12)
    total = cv["pretrain_flops"] + res["curve"]["inference_flops"]
    opt = f["flop_optimum"]
    assert np.nanmin(total[ok]) >= opt["flops"] * (1 - 1e-12)
    i = int(np.nanargmin(np.where(ok, total, np.inf)))
    assert n[i - 1] <= opt["n_params"] <= n[i + 1]
    # the lecture's point is on the curve and splits equally: D(100B) = D_inf / 3
    d_100b = np.interp(np.log(1e11), np.log(n[ok]), np.log(d[ok]))
    assert math.exp(d_100b) == pytest.approx(res["lecture"]["n_tokens"], rel=1e-3)


@pytest.mark.x64  # the separate call below reuses the float64 compilation of compute()
@pytest.mark.parametrize("name", FITS)
def test_sweep_holds_the_first_order_condition_everywhere(res, name):
    s, f = res["sweep"][name], res["fits"][name]
    x = res["sweep"]["inference_tokens"]
    np.testing.assert_allclose(
        loss(name, s["n_params"], s["n_tokens"]), f["target_loss"], rtol=1e-9
    )
    np.testing.assert_allclose(foc_ratio(name, s["n_params"], s["n_tokens"], x), 1.0, rtol=1e-6)
    np.testing.assert_allclose(s["overtrain"], s["n_tokens"] / (20 * s["n_params"]), rtol=1e-12)
    assert np.all(np.diff(s["n_params"]) < 0) and np.all(np.diff(s["n_tokens"]) > 0)
    # one point against a separate call (the vmap over stacked fits keeps them apart)
    one = dcost.lifetime_optimum(f["target_loss"], float(x[12]), name)
    assert s["n_params"][12] == pytest.approx(float(one.n_params), rel=1e-9)


@pytest.mark.x64
@pytest.mark.parametrize("name", FITS)
def test_small_inference_is_the_compute_optimum(res, name):
    """D_inf -> 0: u = beta/(alpha+beta), and the plan is compute_optimal for its own FLOPs."""
    e, a, b, alpha, beta = card(name)
    f = res["fits"][name]
    delta = f["target_loss"] - e
    u = beta / (alpha + beta)
    n0, d0 = (a / (u * delta)) ** (1 / alpha), (b / ((1 - u) * delta)) ** (1 / beta)
    ref = f["compute_optimal_same_loss"]
    assert ref["n_params"] == pytest.approx(n0, rel=1e-6)
    assert ref["n_tokens"] == pytest.approx(d0, rel=1e-6)
    n_c, d_c = dcost.compute_optimal(6 * n0 * d0, name)
    assert float(n_c) == pytest.approx(n0, rel=1e-3) and float(d_c) == pytest.approx(d0, rel=1e-3)
    s = res["sweep"][name]  # first sweep point: D_inf = 1e11 << 3 D0
    assert s["n_params"][0] == pytest.approx(n0, rel=1e-2)


@pytest.mark.parametrize("name", FITS)
def test_equal_split_where_the_sweep_crosses_one_half(res, name):
    """The optimum spends equal FLOPs on pretraining and inference at one D_inf only."""
    x, share = res["sweep"]["inference_tokens"], res["sweep"][name]["train_fraction"]
    assert np.all(np.diff(share) < 0)
    crossing = math.exp(np.interp(0.0, -np.log(share / (1 - share)), np.log(x)))
    assert res["fits"][name]["equal_split_inference_tokens"] == pytest.approx(crossing, rel=0.02)


@pytest.mark.parametrize("name", FITS)
def test_dollar_optimum_is_on_the_constraint_and_no_dearer(res, name):
    f = res["fits"][name]
    usd, lec = f["dollar_optimum"], f["lecture_plan_usd"]
    # llama-3-70b is dense (sparsity 1): the routed fit is the plain fit
    assert loss(name, usd["n_params"], usd["n_tokens"]) == pytest.approx(f["target_loss"], rel=1e-9)
    assert usd["cost_usd"] <= lec["cost_usd"]
    assert usd["pretrain_usd"] + usd["inference_usd"] == pytest.approx(usd["cost_usd"], rel=1e-9)
    d_inf = res["inputs"]["inference_tokens"]
    assert usd["inference_usd"] == pytest.approx(d_inf * usd["cost_per_token_usd"], rel=1e-9)


def test_plot_and_summary(res):
    fig = overtraining.plot(res)
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
        assert "(" in ax.get_xlabel()  # a unit
    s = overtraining.summary(res)
    assert {"inputs", "lecture", "fits"} <= set(s)
    keys = {
        "target_loss",
        "flop_optimum",
        "compute_optimal_same_loss",
        "dollar_optimum",
        "lecture_plan_usd",
    }
    assert all(keys <= set(s["fits"][n]) for n in FITS)
    assert overtraining.__doc__ and "Claim" in overtraining.__doc__
    plt.close(fig)
