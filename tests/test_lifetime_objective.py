"""The lifetime_cost objective: its dollars and loss against hand formulas, the optimizer against
exhaustive search, the loss constraint held exactly, and over-training rising with traffic."""

import jax.numpy as jnp
import numpy as np
import pytest

import dcost
from dcost.search.problem import evaluate

TARGET = 1.95


def problem(inference_tokens, free=None, target=TARGET, tpot_slo=0.05, **kw):
    h, m = dcost.presets.pair("h100-sxm", "mixtral-8x7b")
    free = free or {"batch": (1, 256), "experts": (2, 32), "overtrain": (1, 40)}
    return dcost.Problem(
        h,
        m,
        dcost.Workload(4096),
        objective="lifetime_cost",
        free=free,
        fixed=dcost.Design(batch=1, chips=8, overtrain=4),
        loss_target=target,
        tpot_slo=tpot_slo,
        extras=dcost.LifetimeInputs(inference_tokens=inference_tokens, **kw),
    )


def hand_loss(model, experts, overtrain):
    """Loss from the preset's fields and the hoffmann2022 numbers, in NumPy float64."""
    n_e, dense, k = (
        float(v) for v in (model.params_per_expert, model.params_dense, model.experts_active)
    )
    n_act, n_tot = dense + k * n_e, dense + experts * n_e
    n_eff = n_act * (n_tot / n_act) ** (1.0 / 3.0)
    d = 20.0 * overtrain * n_act
    return 1.69 + 406.4 / n_eff**0.34 + 410.7 / d**0.28


@pytest.mark.slow
@pytest.mark.x64
def test_cost_and_loss_match_hand_formulas():
    p = problem(1e13, rl_tokens=2e11, mfu=0.5)
    x = jnp.array([64.0, 16.0, 7.0])  # batch, experts, overtrain
    ev = evaluate(p, x)
    m, h = p.model, p.hardware
    n_act = float(m.params_dense + m.experts_active * m.params_per_expert)
    d = 20.0 * 7.0 * n_act
    c_flop = float(h.price_per_hour) / (3600.0 * float(h.flops) * 0.5)
    design = dcost.Design(batch=64, chips=8, experts=16)
    c_tok = float(dcost.decode(design, h, m, p.workload).cost_per_token)
    expected = 6 * n_act * d * c_flop + 2e11 * (c_tok + 6 * n_act * c_flop) + 1e13 * c_tok
    np.testing.assert_allclose(float(ev.cost), expected, rtol=1e-10)
    np.testing.assert_allclose(float(ev.report.loss), hand_loss(m, 16.0, 7.0), rtol=1e-12)
    # the constraint sees the reducible loss scaled to the target: the same inequality
    i = p.constraints.index("loss")
    scaled = TARGET * (hand_loss(m, 16.0, 7.0) - 1.69) / (TARGET - 1.69)
    np.testing.assert_allclose(float(ev.values[i]), scaled, rtol=1e-10)


CASES = {
    "pretraining-heavy": dict(inference_tokens=1e11),
    "balanced": dict(inference_tokens=1e13),
    "inference-heavy": dict(inference_tokens=1e15),
    "tight-slo-with-rl": dict(inference_tokens=1e14, rl_tokens=1e12, tpot_slo=0.012),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_optimize_agrees_with_grid_search(case):
    p = problem(**case)
    s, g = dcost.optimize(p), dcost.grid_search(p)
    assert bool(g.feasible) and bool(s.feasible)
    assert float(s.cost) <= float(g.cost) * 1.005
    # and the returned design meets the loss target, checked outside the model
    e, r = float(s.design.experts), float(s.design.overtrain)
    assert hand_loss(p.model, e, r) <= TARGET
    assert float(s.report.serving.tpot) <= float(p.tpot_slo)


@pytest.mark.slow
def test_more_inference_more_overtraining():
    """One batched call over three traffic levels: more tokens served -> fewer experts (cheaper
    serving) and more over-training to keep the loss."""
    p = problem(jnp.array([1e11, 1e13, 1e15]))
    s = dcost.optimize(p)
    r, e = np.asarray(s.design.overtrain), np.asarray(s.design.experts)
    assert np.all(np.asarray(s.feasible))
    assert np.all(np.diff(r) >= 0) and r[-1] > r[0]
    assert np.all(np.diff(e) <= 0) and e[-1] < e[0]


@pytest.mark.slow
def test_overtrain_only_matches_closed_form():
    """With E and the layout fixed, dollars rise with r and the loss falls: the cheapest r is
    the smallest whole r whose hand-computed loss meets the target (with the 1e-6 margin)."""
    p = problem(1e12, free={"overtrain": (1, 60)})
    s = dcost.optimize(p)
    m = p.model
    r = next(r for r in range(1, 61) if hand_loss(m, float(m.n_experts), r) <= TARGET * (1 - 1e-6))
    assert float(s.design.overtrain) == r


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(extras=None), "Problem.extras"),
        (dict(loss_target=1.6), "loss_target"),
        (dict(fixed=dcost.Design(batch=1, chips=8)), "overtrain"),
    ],
)
def test_bad_problem_raises(kwargs, match):
    h, m = dcost.presets.pair("h100-sxm", "mixtral-8x7b")
    args = dict(
        objective="lifetime_cost",
        free={"batch": (1, 64)},
        loss_target=TARGET,
        fixed=dcost.Design(batch=1, chips=8, overtrain=4),
        extras=dcost.LifetimeInputs(inference_tokens=1e12),
    )
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        dcost.Problem(h, m, dcost.Workload(4096), **args)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(inference_tokens=-1.0), "inference_tokens"),
        (dict(inference_tokens=1e12, mfu=0.0), "mfu"),
        (dict(inference_tokens=1e12, gamma=2.0), "gamma"),
        (dict(inference_tokens=1e12, rl_tokens=float("nan")), "rl_tokens"),
        (dict(inference_tokens=1e12, train_hardware="h100"), "train_hardware"),
    ],
)
def test_bad_inputs_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        dcost.LifetimeInputs(**kwargs)
