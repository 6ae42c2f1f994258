"""The smooth maximum against the exact one, closed forms and finite differences.

``smax(x, s) = (sum_i x_i**(1/s))**s`` for ``s > 0`` and ``max(x)`` at ``s = 0``. What must hold:
``max <= smax <= n**s * max``; the error vanishes as ``s -> 0``; ``smax(c*x) = c*smax(x)`` (seconds
or milliseconds give the same answer); its gradient is ``(x_i/smax)**(1/s - 1)``, finite when some
terms are zero.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dcost import smax
from dcost.smooth import safe_div, safe_log

# Four terms spanning twelve decades, as step times in seconds do (a microsecond hop to a
# minute-long prefill), and smoothness from nearly exact to very soft. A fixed number of terms keeps
# it to one compilation of the jitted functions below per precision.
N_TERMS = 4
times = st.lists(st.floats(1e-7, 1e5), min_size=N_TERMS, max_size=N_TERMS)
smoothness = st.floats(1e-3, 1.0)

jit_smax = jax.jit(smax)
jit_grad = jax.jit(jax.grad(lambda x, s: smax(list(x), s)))


def _np_pnorm(xs, s):
    """The p-norm by hand in float64, factoring out the maximum so nothing overflows."""
    x = np.asarray(xs, dtype=np.float64)
    top = x.max()
    return top * np.sum((x / top) ** (1.0 / s)) ** s


@pytest.mark.parametrize(
    ("xs", "s", "expected"),
    [
        ([3.0, 4.0], 0.0, 4.0),  # exact maximum
        ([3.0, 4.0], 0.5, 5.0),  # the Euclidean norm
        ([1.0, 2.0, 3.0], 1.0, 6.0),  # the sum
        ([2.0, 2.0, 2.0, 2.0], 0.5, 4.0),  # n**s * max when all terms tie: 4**0.5 * 2
        ([0.0, 0.0], 0.3, 0.0),  # all zero
        ([0.0, 7.0], 0.3, 7.0),  # a zero term drops out
    ],
)
@pytest.mark.x64
def test_hand_values(xs, s, expected):
    assert float(jit_smax(xs, s)) == pytest.approx(expected, rel=1e-12, abs=0.0)


@pytest.mark.x64
@given(xs=times, s=smoothness)
def test_matches_pnorm_by_hand(xs, s):
    assert float(jit_smax(xs, s)) == pytest.approx(_np_pnorm(xs, s), rel=1e-10)


@given(xs=times)
def test_exact_at_zero_smoothness(xs):
    assert float(jit_smax(xs, 0.0)) == float(np.max(np.asarray(xs, dtype=np.float32)))


@pytest.mark.x64
@given(xs=times, s=smoothness)
def test_bounded_by_max_and_n_to_the_s_max(xs, s):
    top, n = max(xs), len(xs)
    value = float(jit_smax(xs, s))
    assert top * (1 - 1e-12) <= value <= n**s * top * (1 + 1e-12)


@pytest.mark.x64
@given(xs=times)
def test_converges_to_max_monotonically(xs):
    """The relative error never grows as s shrinks and is below 1e-3 at s = 1e-4."""
    top = max(xs)
    ss = [1.0, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 1e-3, 1e-4]
    errors = [float(jit_smax(xs, s)) / top - 1.0 for s in ss]
    assert all(e >= -1e-12 for e in errors)
    assert np.all(np.diff(errors) <= 1e-12)
    assert errors[-1] < 1e-3


@pytest.mark.x64
@pytest.mark.parametrize("n", [2, 3, 6])
def test_error_of_ties_is_the_upper_bound(n):
    """Equal terms are the worst case: the error is exactly n**s - 1, which shrinks with s."""
    for s in [0.5, 0.1, 0.01, 1e-4]:
        assert float(jit_smax([0.02] * n, s)) / 0.02 - 1 == pytest.approx(n**s - 1, rel=1e-9)


@pytest.mark.x64
@given(xs=times, s=smoothness, scale=st.sampled_from([1e3, 1e-3, 1e6, 3600.0]))
def test_unit_invariant(xs, s, scale):
    """Seconds or milliseconds (or hours) give the same smooth maximum, converted."""
    scaled = [scale * x for x in xs]
    assert float(jit_smax(scaled, s)) == pytest.approx(scale * float(jit_smax(xs, s)), rel=1e-10)


def test_small_times_small_smoothness_float32():
    """Microsecond terms at s = 0.01 would underflow as x**(1/s) in float32; the log-space form
    must not."""
    xs = [3e-6, 2e-6, 1e-9, 2.5e-6]
    value = float(jit_smax(xs, 0.01))
    assert 3e-6 <= value <= 3**0.01 * 3e-6 * (1 + 1e-6)


@pytest.mark.x64
@given(xs=times, s=st.floats(0.01, 1.0))
def test_gradient_closed_form(xs, s):
    """d smax / d x_i = (x_i / smax)**(1/s - 1)."""
    grad = jit_grad(jnp.asarray(xs), s)
    value = _np_pnorm(xs, s)
    expected = (np.asarray(xs) / value) ** (1.0 / s - 1.0)
    np.testing.assert_allclose(np.asarray(grad), expected, rtol=1e-8, atol=1e-300)


@pytest.mark.x64
@pytest.mark.parametrize("s", [0.05, 0.3, 1.0])
def test_gradient_matches_central_differences(s):
    x = np.asarray([2e-3, 1.5e-3, 4e-4, 1e-3])
    grad = np.asarray(jit_grad(jnp.asarray(x), s))
    for i in range(len(x)):
        h = 1e-6 * x[i]
        up, down = x.copy(), x.copy()
        up[i] += h
        down[i] -= h
        fd = (float(jit_smax(list(up), s)) - float(jit_smax(list(down), s))) / (2 * h)
        assert grad[i] == pytest.approx(fd, rel=1e-6, abs=1e-9)


@pytest.mark.x64
@pytest.mark.parametrize("s", [0.05, 0.3, 1.0])
def test_gradient_in_smoothness_matches_central_differences(s):
    """``dm/ds = (m/s)(log m - sum_i w_i log x_i)``, written out in ``smax``'s derivative, against
    differences of the value (a zero term included: it has no weight)."""
    x = [2e-3, 1.5e-3, 0.0, 4e-4]
    grad = float(jax.grad(lambda s_: smax(x, s_))(s))
    h = 1e-6 * s
    fd = (float(jit_smax(x, s + h)) - float(jit_smax(x, s - h))) / (2 * h)
    assert grad == pytest.approx(fd, rel=1e-6)
    assert float(jax.grad(lambda s_: smax(x, s_))(0.0)) == 0.0  # the hard maximum


@pytest.mark.x64
@pytest.mark.parametrize("s", [0.0, 0.05, 0.3])
def test_forward_reverse_and_second_derivatives(s):
    """Forward and reverse mode give the same gradient (the KKT code uses both), and the Hessian
    (Newton's steps on the KKT system differentiate the gradient again) matches differences of
    the gradient."""
    x = jnp.asarray([2e-3, 1.5e-3, 4e-4, 1e-3])
    fun = lambda v: smax(list(v), s)  # noqa: E731
    np.testing.assert_allclose(jax.jacfwd(fun)(x), jax.grad(fun)(x), rtol=1e-12, atol=1e-300)
    hess = np.asarray(jax.hessian(fun)(x))
    for i in range(4):
        h = 1e-6 * float(x[i])
        fd = (
            np.asarray(jax.grad(fun)(x.at[i].add(h))) - np.asarray(jax.grad(fun)(x.at[i].add(-h)))
        ) / (2 * h)
        np.testing.assert_allclose(hess[:, i], fd, rtol=1e-5, atol=1e-3)


@pytest.mark.x64
def test_tied_hard_maximum_shares_its_gradient():
    """At ``s = 0`` a tie shares the gradient equally, as ``jnp.max``'s own derivative does."""
    np.testing.assert_allclose(
        jax.grad(lambda v: smax(list(v), 0.0))(jnp.asarray([2.0, 5.0, 5.0, 1.0])),
        [0.0, 0.5, 0.5, 0.0],
    )
    np.testing.assert_allclose(jax.grad(lambda v: smax(list(v), 0.0))(jnp.zeros(3)), [1 / 3] * 3)


@pytest.mark.parametrize("s", [0.0, 0.01, 0.3, 1.0])
def test_gradient_finite_with_zero_terms(s):
    x = jnp.asarray([0.0, 2e-3, 0.0, 5e-4])
    grad = jit_grad(x, s)
    assert np.all(np.isfinite(grad))
    assert float(grad[0]) == 0.0 and float(grad[2]) == 0.0
    assert float(grad[1]) > 0.0


@pytest.mark.parametrize("s", [0.0, 0.01, 0.3])
def test_all_zero_terms(s):
    value, grad = jit_smax(list(jnp.zeros(2)), s), jit_grad(jnp.zeros(2), s)
    assert float(value) == 0.0
    assert np.all(np.isfinite(grad))


def test_hard_max_gradient_is_one_hot():
    grad = jit_grad(jnp.asarray([1.0, 3.0, 2.0]), 0.0)
    np.testing.assert_array_equal(np.asarray(grad), [0.0, 1.0, 0.0])


def test_broadcasts_and_jits():
    """Terms of different shapes broadcast (a scalar against a sweep), eager equals jit."""
    sweep = jnp.asarray([1.0, 2.0, 3.0])
    eager = smax([2.0, sweep], 0.2)
    jitted = jit_smax([2.0, sweep], 0.2)
    assert eager.shape == (3,)
    np.testing.assert_allclose(np.asarray(eager), np.asarray(jitted), rtol=1e-6)
    expected = [_np_pnorm([2.0, v], 0.2) for v in [1.0, 2.0, 3.0]]
    np.testing.assert_allclose(np.asarray(eager), expected, rtol=1e-5)


def test_safe_div_and_log_edges():
    assert float(safe_div(6.0, 3.0)) == 2.0
    assert float(safe_div(1.0, 0.0, default=-1.0)) == -1.0
    g_num, g_den = jax.grad(safe_div, argnums=(0, 1))(1.0, 0.0)
    assert float(g_num) == 0.0 and float(g_den) == 0.0
    assert float(safe_log(np.e)) == pytest.approx(1.0)
    assert float(safe_log(0.0)) == -np.inf
    assert float(jax.grad(safe_log)(0.0)) == 0.0
    assert float(jax.grad(safe_log)(2.0)) == pytest.approx(0.5)
