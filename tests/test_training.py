"""Training economics: scaling fits, compute optimum, lifetime optimum, training runs.

Every formula is checked against something that can disagree with it: published numbers, hand
calculations, numeric or exhaustive minimization, finite differences in float64, and a
discrete-event simulation of the 1F1B schedule.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from jax.test_util import check_grads

import dcost
from dcost.training.runs import activation_bytes
from dcost.training.scaling import scaling_fit_card


@pytest.fixture(autouse=True)
def x64():
    with jax.enable_x64(True):
        yield


FITS = ["hoffmann2022", "besiroglu2024"]
# The papers' numbers, typed from the publications (not from the TOML file).
PUBLISHED = {
    # Hoffmann et al. 2022, arXiv:2203.15556, section 3.3 (approach 3) and appendix D.2.
    "hoffmann2022": (1.69, 406.4, 410.7, 0.34, 0.28),
    # Besiroglu et al. 2024, arXiv:2404.10102, their estimates of approach 3's parameters.
    "besiroglu2024": (1.8172, 482.01, 2085.43, 0.3478, 0.3658),
}


# --------------------------------------------------------------------------- scaling fits


@pytest.mark.parametrize("name", FITS)
def test_named_fits_are_the_published_values(name):
    fit = dcost.scaling_fit(name)
    got = [float(getattr(fit, k)) for k in ("E", "A", "B", "alpha", "beta")]
    np.testing.assert_allclose(got, PUBLISHED[name], rtol=1e-12)
    assert "arXiv" in scaling_fit_card(name)["source"]


@pytest.mark.parametrize("name", FITS)
@pytest.mark.parametrize("n, d", [(70e9, 1.4e12), (1e9, 2e10), (4e11, 1.5e13)])
def test_loss_against_hand_calculation(name, n, d):
    e, a, b, alpha, beta = PUBLISHED[name]
    expected = e + a / n**alpha + b / d**beta
    assert float(dcost.loss(n, d, name)) == pytest.approx(expected, rel=1e-12)
    assert float(dcost.loss(n, d, dcost.ScalingFit(e, a, b, alpha, beta))) == pytest.approx(
        expected, rel=1e-12
    )


def _numeric_compute_optimum(budgets, fit):
    """Adam on log N along C = 6 N D, from a start 100x off in N."""

    def one(c):
        def f(x):
            n = jnp.exp(x)
            return dcost.loss(n, c / (6.0 * n), fit)

        opt = optax.adam(0.05)
        x0 = 0.5 * jnp.log(c / 6.0) - jnp.log(100.0)

        def step(carry, _):
            x, state = carry
            g = jax.grad(f)(x)
            upd, state = opt.update(g, state)
            return (x + upd, state), None

        (x, _), _ = jax.lax.scan(step, (x0, opt.init(x0)), None, length=4000)
        return jnp.exp(x)

    return jax.jit(jax.vmap(one))(budgets)


@pytest.mark.parametrize("name", FITS)
def test_compute_optimal_matches_gradient_search_and_exhaustive_grid(name):
    budgets = jnp.array([1e19, 1e21, 1e23, 1e25, 1e27])
    fit = dcost.scaling_fit(name)
    plan = dcost.compute_optimal(budgets, fit)
    n_closed, d_closed = plan  # the public API's (n_params, n_tokens)
    r_closed = plan.overtrain
    assert len(plan) == 2 and plan[0] is plan.n_params
    np.testing.assert_allclose(6.0 * n_closed * d_closed, budgets, rtol=1e-12)
    np.testing.assert_allclose(r_closed, d_closed / (20.0 * n_closed), rtol=1e-12)
    # Gradient search (Optax, log space).
    np.testing.assert_allclose(_numeric_compute_optimum(budgets, fit), n_closed, rtol=1e-4)
    # Exhaustive: a log grid of N, the best point within one grid step of the closed form.
    for c, n in zip(np.asarray(budgets), np.asarray(n_closed), strict=True):
        grid = np.geomspace(n / 1e3, n * 1e3, 600_001)
        losses = np.asarray(dcost.loss(grid, c / (6.0 * grid), fit))
        best = grid[np.argmin(losses)]
        assert abs(math.log(best / n)) <= math.log(grid[1] / grid[0]) * 1.01


def test_compute_optimal_tokens_per_parameter_of_each_fit():
    budgets = jnp.geomspace(1e21, 1e26, 11)
    n, d = dcost.compute_optimal(budgets, "besiroglu2024")
    ratio = np.asarray(d / n)
    # The replication fit: about 20 tokens per parameter (16 to 22 over five decades), falling.
    assert np.all((ratio > 15.0) & (ratio < 23.0)), ratio
    assert np.all(np.diff(ratio) < 0)
    # Chinchilla's budget (5.76e23 FLOP): close to Chinchilla itself (70B on 1.4T, 20 per param).
    n_c, d_c = dcost.compute_optimal(5.76e23, "besiroglu2024")
    assert 17.0 < float(d_c / n_c) < 21.0
    # The rounded published approach-3 fit does not give 20: 50 to 150 tokens per parameter.
    n, d = dcost.compute_optimal(budgets, "hoffmann2022")
    ratio = np.asarray(d / n)
    assert np.all(ratio > 45.0) and np.all(np.diff(ratio) > 0)


def test_effective_params_and_routed_fit():
    assert float(dcost.effective_params(1e9, 64e9)) == pytest.approx(4e9, rel=1e-12)
    assert float(dcost.effective_params(1e9, 64e9, gamma=0.0)) == pytest.approx(1e9)
    assert float(dcost.effective_params(1e9, 64e9, gamma=1.0)) == pytest.approx(64e9)
    # A routed model's loss = the dense loss at N_eff; routed_fit says the same in N_active.
    m = dcost.Model(
        n_layers=32,
        d_model=4096,
        params_dense=2e9,
        params_per_expert=1e9,
        n_experts=64,
        experts_active=2,
        kv_bytes_per_token=1e5,
        bytes_per_param=2.0,
    )
    n_eff = 4e9 * (66e9 / 4e9) ** (1.0 / 3.0)
    assert float(dcost.loss(m, 1e12)) == pytest.approx(float(dcost.loss(n_eff, 1e12)), rel=1e-12)
    routed = dcost.routed_fit("hoffmann2022", 66e9 / 4e9)
    assert float(dcost.loss(4e9, 1e12, routed)) == pytest.approx(
        float(dcost.loss(n_eff, 1e12)), rel=1e-12
    )


# --------------------------------------------------------------------------- lifetime optimum


def _constraint_tokens(n, target, fit):
    e, a, b, alpha, beta = fit
    return (b / (target - e - a / n**alpha)) ** (1.0 / beta)


@pytest.mark.parametrize("name", FITS)
@pytest.mark.parametrize("budget", [1e20, 1e23, 1e26])
def test_lifetime_with_zero_inference_is_the_compute_optimum(name, budget):
    n, d = dcost.compute_optimal(budget, name)
    target = dcost.loss(n, d, name)
    best = dcost.lifetime_optimum(target, 0.0, name)
    assert float(best.n_params) == pytest.approx(float(n), rel=1e-9)
    assert float(best.n_tokens) == pytest.approx(float(d), rel=1e-9)
    assert float(best.flops) == pytest.approx(budget, rel=1e-9)
    assert float(best.train_fraction) == 1.0


@pytest.mark.parametrize("name", FITS)
@pytest.mark.parametrize(
    "target_above_e, d_inf", [(0.3, 1e12), (0.15, 2.6e14), (0.5, 1e16), (0.08, 1e13)]
)
def test_lifetime_optimum_against_exhaustive_search(name, target_above_e, d_inf):
    fit = PUBLISHED[name]
    e, a, _, alpha, _ = fit
    target = e + target_above_e
    n_min = (a / target_above_e) ** (1.0 / alpha)
    grid = n_min * np.geomspace(1.0 + 1e-9, 1e8, 400_001)
    d = _constraint_tokens(grid, target, fit)
    flops = 6.0 * grid * d + 2.0 * grid * d_inf
    i = np.argmin(flops)
    best = dcost.lifetime_optimum(target, d_inf, name)
    assert 0 < i < grid.size - 1
    assert abs(math.log(float(best.n_params) / grid[i])) <= 2 * math.log(grid[1] / grid[0])
    assert float(best.flops) <= flops[i] * (1 + 1e-12)
    n, d = float(best.n_params), float(best.n_tokens)
    assert float(best.train_fraction) == pytest.approx(6 * n * d / (6 * n * d + 2 * n * d_inf))
    # First-order condition: the pretraining share is beta (1 - u) / (alpha u), u = A N^-a / Delta.
    u = a / n**alpha / target_above_e
    assert float(best.train_fraction) == pytest.approx(fit[4] * (1 - u) / (alpha * u), rel=1e-6)


@settings(max_examples=25, deadline=None)
@given(
    name=st.sampled_from(FITS),
    above=st.floats(0.05, 1.0),
    log_inf=st.floats(9.0, 17.0),
    factor=st.floats(1.5, 100.0),
)
def test_more_inference_means_a_smaller_model_trained_longer(name, above, log_inf, factor):
    target = PUBLISHED[name][0] + above
    small = dcost.lifetime_optimum(target, 10.0**log_inf, name)
    large = dcost.lifetime_optimum(target, factor * 10.0**log_inf, name)
    assert float(large.n_params) < float(small.n_params)
    assert float(large.n_tokens) > float(small.n_tokens)
    assert float(large.overtrain) > float(small.overtrain)


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(FITS), above=st.floats(0.02, 2.0), log_inf=st.floats(0.0, 20.0))
def test_lifetime_optimum_is_on_the_loss_constraint(name, above, log_inf):
    target = PUBLISHED[name][0] + above
    best = dcost.lifetime_optimum(target, 10.0**log_inf, name)
    assert bool(best.reachable)
    assert abs(float(dcost.loss(best.n_params, best.n_tokens, name)) - target) < 1e-6


@pytest.mark.slow
def test_lifetime_gradients_against_finite_differences():
    fit = dcost.scaling_fit("besiroglu2024")

    def log_flops(x):  # x = (log(target - E), log D_inf)
        return jnp.log(dcost.lifetime_optimum(fit.E + jnp.exp(x[0]), jnp.exp(x[1]), fit).flops)

    def log_n(x):  # the optimal size: implicit-function gradient
        return jnp.log(dcost.lifetime_optimum(fit.E + jnp.exp(x[0]), jnp.exp(x[1]), fit).n_params)

    for x in (jnp.array([math.log(0.2), math.log(1e13)]), jnp.array([math.log(0.1), 33.0])):
        check_grads(jax.jit(log_flops), (x,), order=1, modes=["rev"], eps=1e-4, rtol=1e-5)
        check_grads(jax.jit(log_n), (x,), order=1, modes=["rev"], eps=1e-4, rtol=1e-5)

    # Sensitivity to the fit itself (log of each of A, B, alpha, beta).
    def log_flops_fit(logs):
        f = dcost.ScalingFit(fit.E, *jnp.exp(logs))
        return jnp.log(dcost.lifetime_optimum(2.0, 1e13, f).flops)

    logs = jnp.log(jnp.array([fit.A, fit.B, fit.alpha, fit.beta]))
    check_grads(jax.jit(log_flops_fit), (logs,), order=1, modes=["rev"], eps=1e-5, rtol=1e-5)
    # Envelope theorem: d(min FLOPs)/d D_inf = 2 N*.
    g = jax.grad(lambda d_inf: dcost.lifetime_optimum(2.0, d_inf, fit).flops)(1e14)
    assert float(g) == pytest.approx(
        2.0 * float(dcost.lifetime_optimum(2.0, 1e14, fit).n_params), rel=1e-8
    )


def test_lifetime_optimum_vmaps_and_jit_traces_once():
    targets = jnp.array([1.9, 2.0, 2.2])
    infs = jnp.array([0.0, 1e13, 1e15])
    batched = jax.vmap(lambda t, d: dcost.lifetime_optimum(t, d, "hoffmann2022"))(targets, infs)
    for i in range(3):
        one = dcost.lifetime_optimum(float(targets[i]), float(infs[i]), "hoffmann2022")
        assert float(batched.n_params[i]) == pytest.approx(float(one.n_params), rel=1e-12)
    traces = []

    @jax.jit
    def solve(t, d):
        traces.append(1)
        return dcost.lifetime_optimum(t, d, "besiroglu2024").n_params

    for t in (1.95, 2.0, 2.5):
        solve(t, 1e12)
    assert len(traces) == 1


def test_unreachable_target_is_reported_not_nan():
    # Not enough data: loss(inf params, 1e11 tokens) = 1.69 + 410.7/1e11**0.28 > 1.75.
    best = dcost.lifetime_optimum(1.75, 1e12, "hoffmann2022", max_tokens=1e11)
    assert not bool(best.reachable)
    for v in (best.n_params, best.n_tokens, best.overtrain, best.flops):
        assert float(v) == math.inf
    # Under jit a target at the irreducible loss cannot raise: it is reported the same way.
    got = jax.jit(lambda t: dcost.lifetime_optimum(t, 1e12, "hoffmann2022"))(1.5)
    assert not bool(got.reachable)
    assert not any(np.any(np.isnan(v)) for v in jax.tree_util.tree_leaves(got))
    # Enough data but a binding cap: the plan uses all of it and sits on the constraint.
    capped = dcost.lifetime_optimum(1.95, 1e14, "hoffmann2022", max_tokens=2e12)
    free = dcost.lifetime_optimum(1.95, 1e14, "hoffmann2022")
    assert float(free.n_tokens) > 2e12
    assert float(capped.n_tokens) == pytest.approx(2e12, rel=1e-9)
    assert float(dcost.loss(capped.n_params, capped.n_tokens)) == pytest.approx(1.95, abs=1e-9)


# --------------------------------------------------------------------------- dollars


H100 = dict(
    flops=989.4e12,
    hbm_bandwidth=3.35e12,
    hbm_capacity=80e9,
    scaleup_bandwidth=450e9,
    scaleout_bandwidth=50e9,
    scaleup_size=8,
    price_per_hour=3.0,
)


def _serving(batch=256.0, context=4096.0, chips=8.0, model=None):
    return dcost.Deployment(
        hardware=dcost.Hardware(**H100),
        model=dcost.model("llama-3-70b") if model is None else model,
        design=dcost.Design(batch=batch, chips=chips),
        workload=dcost.Workload(context),
    )


def test_dollar_optimum_reduces_to_flops_when_serving_is_compute_bound():
    # Batch 1e5 at zero context: decode is compute bound, c_tok = 2 N p / (3600 F) = the training
    # price of 2 N FLOP at mfu 1, so the dollar problem is the FLOP problem times a price. (With
    # every parameter multiplied: an input-embedding table would take no FLOPs, so none here.)
    every = dcost.model("llama-3-70b", params_embedding=0.0)
    dep = _serving(batch=1e5, context=0.0, chips=1.0, model=every)
    fit = dcost.scaling_fit("besiroglu2024")
    for d_inf in (0.0, 1e12, 1e15):
        inputs = dcost.LifetimeInputs(d_inf, fit=fit, mfu=1.0)
        usd = dcost.lifetime_optimum_dollars(2.05, inputs, dep)
        flop = dcost.lifetime_optimum(2.05, d_inf, fit)
        assert float(usd.n_params) == pytest.approx(float(flop.n_params), rel=1e-5)
        assert float(usd.n_tokens) == pytest.approx(float(flop.n_tokens), rel=1e-5)
        price = 3.0 / 3600.0 / 989.4e12
        assert float(usd.cost.total) == pytest.approx(float(flop.flops) * price, rel=1e-10)


def test_dollar_optimum_against_exhaustive_search_and_its_gradient():
    dep = _serving()
    fit = "hoffmann2022"
    target, d_inf, rl = 1.95, 3e13, 1e12
    inputs = dcost.LifetimeInputs(d_inf, rl_tokens=rl, fit=fit)
    best = dcost.lifetime_optimum_dollars(target, inputs, dep)
    e, a, _, alpha, _ = PUBLISHED[fit]
    n_min = (a / (target - e)) ** (1.0 / alpha)
    grid = n_min * np.geomspace(1.0 + 1e-6, 1e5, 4001)
    d = _constraint_tokens(grid, target, PUBLISHED[fit])
    cost = jax.jit(jax.vmap(lambda n, dd: dcost.lifetime_cost(n, dd, inputs, dep).total))(
        jnp.asarray(grid), jnp.asarray(d)
    )
    i = int(jnp.argmin(cost))
    assert 0 < i < grid.size - 1
    assert abs(math.log(float(best.n_params) / grid[i])) <= 2 * math.log(grid[1] / grid[0])
    assert float(best.cost.total) <= float(cost[i]) * (1 + 1e-12)
    assert float(dcost.loss(best.n_params, best.n_tokens, fit)) == pytest.approx(target, abs=1e-9)

    # Envelope theorem: the gradient of the optimal cost against re-solving.
    def total(log_d_inf):
        moved = dcost.LifetimeInputs(jnp.exp(log_d_inf), rl_tokens=rl, fit=fit)
        return dcost.lifetime_optimum_dollars(target, moved, dep).cost.total

    total = jax.jit(total)
    x, h = math.log(d_inf), 1e-3
    fd = (float(total(x + h)) - float(total(x - h))) / (2 * h)
    assert float(jax.jit(jax.grad(total))(x)) == pytest.approx(fd, rel=1e-5)


def test_dollar_optimum_of_a_routed_model_reaches_the_target_through_effective_params():
    moe = dcost.Model(
        n_layers=32,
        d_model=4096,
        params_dense=2e9,
        params_per_expert=1e9,
        n_experts=64,
        experts_active=2,
        kv_bytes_per_token=1.3e5,
        bytes_per_param=2.0,
    )
    inputs = dcost.LifetimeInputs(1e14)
    dense = dcost.lifetime_optimum_dollars(2.0, inputs, _serving())
    best = dcost.lifetime_optimum_dollars(2.0, inputs, _serving(model=moe))
    shaped = dcost.scale_model(moe, best.n_params)
    assert float(shaped.sparsity) == pytest.approx(66e9 / 4e9, rel=1e-12)
    # dcost.loss of a Model counts effective_params(N_active, N_total) with gamma = 1/3.
    assert float(dcost.loss(shaped, best.n_tokens)) == pytest.approx(2.0, abs=1e-9)
    assert float(best.n_params) < float(dense.n_params)  # fewer active parameters for the loss


def test_lifetime_cost_terms_and_gradients():
    dep = _serving()
    n, d, d_inf, rl = 7e10, 1.5e13, 1e14, 1e12
    c = dcost.lifetime_cost(n, d, dcost.LifetimeInputs(d_inf, rl_tokens=rl, mfu=0.5), dep)
    per_flop = 3.0 / 3600.0 / (989.4e12 * 0.5)
    assert float(c.pretrain) == pytest.approx(6 * n * d * per_flop, rel=1e-12)
    scaled = jax.jit(dcost.scale_model)(dep.model, n)
    c_tok = jax.jit(dcost.decode)(dep.design, dep.hardware, scaled, dep.workload).cost_per_token
    assert float(c.cost_per_token) == pytest.approx(float(c_tok), rel=1e-12)
    assert float(c.inference) == pytest.approx(d_inf * float(c_tok), rel=1e-12)
    assert float(c.rl) == pytest.approx(rl * (float(c_tok) + 6 * n * per_flop), rel=1e-12)
    assert float(c.total) == pytest.approx(float(c.pretrain + c.rl + c.inference), rel=1e-12)
    # The resized model keeps the sparsity and scales as documented.
    m = dep.model
    f = n / float(m.params_active)
    assert float(scaled.params_active) == pytest.approx(n, rel=1e-12)
    assert float(scaled.kv_bytes_per_token) == pytest.approx(
        float(m.kv_bytes_per_token) * f ** (2 / 3), rel=1e-12
    )

    def log_total(x):  # x = log(N, D, D_inf); smooth roofline for a gradient everywhere
        n_, d_, d_inf_ = jnp.exp(x)
        inputs = dcost.LifetimeInputs(d_inf_, rl_tokens=rl)
        return jnp.log(dcost.lifetime_cost(n_, d_, inputs, dep, smoothness=0.05).total)

    check_grads(
        jax.jit(log_total),
        (jnp.log(jnp.array([n, d, d_inf])),),
        order=1,
        modes=["rev"],
        eps=1e-4,
        rtol=1e-5,
    )


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: dcost.loss(7e10, 0.0), "n_tokens"),
        (lambda: dcost.loss(-1.0, 1e12), "n_params"),
        (lambda: dcost.compute_optimal(-1e23), "flops"),
        (lambda: dcost.lifetime_optimum(1.69, 1e12), "target_loss"),
        (lambda: dcost.lifetime_optimum(1.5, 1e12), "target_loss"),
        (lambda: dcost.lifetime_optimum(1.8, 1e12, "besiroglu2024"), "target_loss"),
        (lambda: dcost.lifetime_optimum(2.0, -1.0), "inference_tokens"),
        (lambda: dcost.lifetime_optimum(2.0, 1e12, max_tokens=0.0), "max_tokens"),
        (lambda: dcost.lifetime_optimum(2.0, 1e12, "chinchilla"), "unknown scaling fit"),
        (lambda: dcost.loss(1e9, 1e10, fit=3), "fit"),
        (lambda: dcost.ScalingFit(1.69, 406.4, 410.7, -0.34, 0.28), "ScalingFit.alpha"),
        (lambda: dcost.effective_params(1e9, 1e8), "n_total"),
        (lambda: dcost.training_run(7e10, -1.0, dcost.Hardware(**H100), 8, 0.4), "n_tokens"),
        (lambda: dcost.training_run(7e10, 1e12, dcost.Hardware(**H100), 8, 1.5), "mfu"),
        (
            lambda: dcost.training_run(
                7e10, 1e12, dcost.Hardware(**H100), 12, 0.4, dcost.TrainingSetup(tensor=8)
            ),
            "n_chips",
        ),
        (
            lambda: dcost.TrainingSetup(recompute="some"),
            "recompute",
        ),
    ],
)
def test_bad_input_raises_value_error_naming_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


def test_unknown_fit_lists_the_known_ones():
    with pytest.raises(ValueError) as err:
        dcost.loss(1e9, 1e10, "chinchilla")
    assert all(name in str(err.value) for name in FITS)


# --------------------------------------------------------------------------- lecture estimate


def test_lecture_estimate_arithmetic():
    e = dcost.lecture_estimate(5e7, 60.0, 1e11)
    assert e.inference_tokens == pytest.approx(5e7 * 60 * 86400)  # 2.592e14, not 1.5e16
    assert e.n_tokens == pytest.approx(2.592e14 / 3)  # 6 N D = 2 N D_inf
    assert e.chinchilla_tokens == pytest.approx(2e12)
    assert e.overtrain == pytest.approx(43.2)
    # What the quoted 150T would take: inference FLOPs 1.74x the price of training FLOPs.
    assert dcost.lecture_estimate(inference_cost_ratio=150e12 / 8.64e13).n_tokens == pytest.approx(
        150e12
    )


# --------------------------------------------------------------------------- training runs


def _simulate_1f1b(p, m, tf, tb):
    """Discrete-event 1F1B: makespan and the most micro-batches stage 0 holds at once."""
    ops = []
    for s in range(p):
        warm = min(p - s - 1, m)
        seq = [("F", j) for j in range(warm)]
        f_next, b_next = warm, 0
        while b_next < m:
            if f_next < m:
                seq.append(("F", f_next))
                f_next += 1
            seq.append(("B", b_next))
            b_next += 1
        ops.append(seq)
    done, free, idx = {}, [0.0] * p, [0] * p
    held, most = 0, 0
    progress = True
    while progress:
        progress = False
        for s in range(p):
            while idx[s] < len(ops[s]):
                kind, j = ops[s][idx[s]]
                if kind == "F":
                    deps = [("F", s - 1, j)] if s > 0 else []
                else:
                    deps = [("F", s, j)] + ([("B", s + 1, j)] if s < p - 1 else [])
                if not all(dep in done for dep in deps):
                    break
                start = max([free[s]] + [done[dep] for dep in deps])
                done[(kind, s, j)] = free[s] = start + (tf if kind == "F" else tb)
                idx[s] += 1
                progress = True
                if s == 0:
                    held += 1 if kind == "F" else -1
                    most = max(most, held)
    assert all(i == len(o) for i, o in zip(idx, ops, strict=True))
    return max(free), most


@pytest.mark.parametrize("p", [1, 2, 4, 8])
@pytest.mark.parametrize("m", [1, 3, 8, 32])
@pytest.mark.parametrize("tf, tb", [(1.0, 1.0), (1.0, 2.0)])
def test_bubble_fraction_against_a_simulated_1f1b_schedule(p, m, tf, tb):
    makespan, in_flight = _simulate_1f1b(p, m, tf, tb)
    idle = 1.0 - m * (tf + tb) / makespan
    assert float(dcost.bubble_fraction(p, m)) == pytest.approx(idle, abs=1e-12)
    assert in_flight == min(p, m)  # what the activation estimate multiplies by


# GPT-3 175B as configured in Korthikanti et al. 2022 (arXiv:2205.05198): 96 layers, hidden
# 12288, 96 heads, sequence 2048, micro-batch 1, tensor parallel 8, pipeline parallel 8.
GPT3 = dict(L=96, h=12288, a=96, s=2048, b=1, t=8, p=8)


def test_activation_memory_against_korthikanti_for_gpt3_175b():
    L, h, a, s, b, t, p = (GPT3[k] for k in ("L", "h", "a", "s", "b", "t", "p"))
    sbh = s * b * h
    # Their table 2, per layer: sequence parallel + selective recomputation 34 sbh / t; sequence
    # parallel alone sbh/t (34 + 5 a s / h); full recomputation 2 sbh.
    assert float(activation_bytes(s, b, h, a, t, "selective")) == 34 * sbh / t
    assert float(activation_bytes(s, b, h, a, t, "none")) == sbh / t * (34 + 5 * a * s / h)
    assert float(activation_bytes(s, b, h, a, t, "full")) == 2 * sbh
    # The attention scores are 70 % of what sequence parallelism alone stores for this model
    # (5as/h = 80 against 34): why selective recomputation pays.
    assert 5 * a * s / h == 80
    # Whole run: 8 stages, 8 micro-batches in flight on the first stage, i.e. all 96 layers.
    model = dcost.Model(
        n_layers=L,
        d_model=h,
        params_dense=175e9,
        params_per_expert=0,
        n_experts=0,
        experts_active=0,
        kv_bytes_per_token=0,
        bytes_per_param=2,
    )
    setup = dcost.TrainingSetup(stages=p, microbatches=64, tensor=t, seq_len=s, micro_batch=b)
    run = dcost.training_run(model, 300e9, dcost.Hardware(**H100), 1024, 0.4, setup)
    assert float(run.memory_activations) == pytest.approx(34 * s * b * h * L / t, rel=1e-12)
    assert float(run.memory_activations) / 1e9 == pytest.approx(10.27, abs=0.01)
    # 16 bytes per parameter: 4 (bf16 weights + grads) over t*p, 12 (fp32 master, m, v) also over
    # the 1024 / 64 = 16 data-parallel replicas.
    assert float(run.memory_weights) == pytest.approx(4 * 175e9 / 64, rel=1e-12)
    assert float(run.memory_optimizer) == pytest.approx(12 * 175e9 / 64 / 16, rel=1e-12)


def test_training_run_against_hand_calculation():
    hw = dcost.Hardware(**H100)
    setup = dcost.TrainingSetup(tensor=8, stages=4, microbatches=32)
    run = dcost.training_run(70e9, 15e12, hw, 4096, 0.45, setup)
    flops = 6 * 70e9 * 15e12
    seconds = flops / (4096 * 989.4e12 * 0.45) / (1 - 3 / 35)
    assert float(run.flops) == pytest.approx(flops, rel=1e-12)
    assert float(run.seconds) == pytest.approx(seconds, rel=1e-12)
    assert float(run.cost) == pytest.approx(4096 * 3.0 * seconds / 3600, rel=1e-12)
    assert float(run.bubble) == pytest.approx(3 / 35)
    # The same run without a layout: 4 bytes x 70e9 on every chip does not fit in 80 GB.
    flat = dcost.training_run(70e9, 15e12, hw, 4096, 0.45)
    assert float(flat.memory_weights) == pytest.approx(280e9, rel=1e-12)
    assert not bool(flat.fits) and bool(run.fits)
    assert float(run.memory_per_chip) == pytest.approx(
        float(run.memory_weights + run.memory_optimizer + run.memory_activations), rel=1e-12
    )


@pytest.mark.parametrize(
    "n, d, published",
    [
        # Chinchilla, 70B on 1.4T tokens: Gopher's budget of 5.76e23 FLOP (Hoffmann et al. 2022).
        (70e9, 1.4e12, 5.76e23),
        # Llama 3 405B on 15.6T tokens: 3.8e25 FLOP (Llama Team 2024, arXiv:2407.21783).
        (405e9, 15.6e12, 3.8e25),
    ],
)
def test_training_flops_against_published_budgets(n, d, published):
    run = dcost.training_run(n, d, dcost.Hardware(**H100), 8, 0.4)
    assert float(run.flops) == pytest.approx(published, rel=0.03)


def test_training_run_vmaps_over_layouts():
    hw = dcost.Hardware(**H100)
    stages = jnp.array([1.0, 2.0, 4.0, 8.0])
    runs = jax.vmap(
        lambda p: dcost.training_run(
            70e9,
            15e12,
            hw,
            4096.0,
            0.45,
            dcost.TrainingSetup(stages=p, tensor=8.0, microbatches=16.0),
        )
    )(stages)
    assert np.all(np.diff(np.asarray(runs.seconds)) > 0)  # deeper pipeline, bigger bubble
    assert np.all(np.diff(np.asarray(runs.memory_weights)) < 0)


def test_lifetime_optimum_takes_arrays_like_one_by_one():
    traffic = np.array([[0.0, 1e12], [1e13, 1e14]])
    batched = dcost.lifetime_optimum(2.0, traffic)
    assert batched.n_params.shape == traffic.shape
    for idx in np.ndindex(traffic.shape):
        one = dcost.lifetime_optimum(2.0, float(traffic[idx]))
        np.testing.assert_allclose(float(batched.n_params[idx]), float(one.n_params), rtol=1e-5)
        np.testing.assert_allclose(float(batched.n_tokens[idx]), float(one.n_tokens), rtol=1e-5)
