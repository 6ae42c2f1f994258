"""``dcost.search.linalg.lstsq`` against ``numpy.linalg.lstsq`` (SVD, minimum norm, float64).

Full rank: the unique least-squares solution. Rank deficient (repeated or zero columns, a
product of thin factors): the minimum-norm solution, which numpy's SVD returns. Zero matrix:
``x = 0`` (the minimum-norm solution). Each case in float32 and float64, one system at a time and
a batch under ``jax.vmap``; and the compiled batch contains no custom call (no LAPACK), which is
why it replaced ``jnp.linalg.lstsq`` on the search paths.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dcost import _xla
from dcost.search.linalg import lstsq

FAST = _xla.options(fast_compile=True)  # as the search programs are compiled in the suite

TOL = {np.float32: 2e-4, np.float64: 1e-9}


def systems(seed, batch=16):
    """``(kind, a, b)``: batches of ``(m, n)`` matrices with ``b`` of shape ``(m,)``."""
    rng = np.random.default_rng(seed)
    out = []
    for m, n in [(3, 3), (6, 6), (7, 4), (3, 5)]:  # square, tall, wide (wide: rank <= m)
        a = rng.normal(size=(batch, m, n)) * 10.0 ** rng.uniform(-3, 3, size=(batch, 1, 1))
        out.append((f"full {m}x{n}", a, rng.normal(size=(batch, m))))
    a = rng.normal(size=(batch, 6, 4))
    a[:, :, 3] = a[:, :, 1]  # a repeated column
    a[:, :, 2] = 0.0  # a zero column (a masked-out constraint)
    out.append(("repeated and zero columns", a, rng.normal(size=(batch, 6))))
    a = rng.normal(size=(batch, 6, 2)) @ rng.normal(size=(batch, 2, 5))  # rank 2
    out.append(("rank 2 of 6x5", a, rng.normal(size=(batch, 6))))
    a = rng.normal(size=(batch, 5, 5))
    a[:, 3:, :] = 0.0  # zero rows (held variables' stationarity masked out)
    out.append(("zero rows", a, rng.normal(size=(batch, 5))))
    out.append(("zero matrix", np.zeros((batch, 4, 3)), rng.normal(size=(batch, 4))))
    return out


def reference(a, b):
    return np.stack([np.linalg.lstsq(ai, bi, rcond=None)[0] for ai, bi in zip(a, b, strict=True)])


def relative_error(x, ref):
    scale = np.maximum(np.linalg.norm(ref, axis=-1), 1e-300)
    return np.linalg.norm(np.asarray(x, np.float64) - ref, axis=-1) / np.where(
        np.linalg.norm(ref, axis=-1) > 0, scale, 1.0
    )


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_matches_numpy_minimum_norm_under_vmap(dtype):
    with jax.enable_x64(dtype == np.float64):
        for kind, a, b in systems(0):
            a, b = a.astype(dtype), b.astype(dtype)
            ref = reference(a.astype(np.float64), b.astype(np.float64))
            x = jax.jit(jax.vmap(lstsq), compiler_options=FAST)(a, b)
            assert x.dtype == dtype, kind
            assert np.all(np.isfinite(x)), kind
            err = relative_error(x, ref)
            # float32 loses cond(a) * 1e-7 on any method; the random full-rank ones reach 1e3
            cond = np.linalg.cond(a.astype(np.float64))
            tol = TOL[dtype] * (
                np.where(np.isfinite(cond), cond, 1.0) if dtype == np.float32 else 1
            )
            bad = err > np.maximum(tol, TOL[dtype])
            assert not bad.any(), (kind, err[bad], cond[bad])
            if kind == "zero matrix":
                assert np.all(np.asarray(x) == 0.0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_single_system_and_several_right_hand_sides(dtype):
    rng = np.random.default_rng(1)
    with jax.enable_x64(dtype == np.float64):
        a = rng.normal(size=(6, 4)).astype(dtype)
        a[:, 0] = 0.0
        b = rng.normal(size=(6, 3)).astype(dtype)
        x = np.asarray(lstsq(a, b), np.float64)
        ref = np.linalg.lstsq(a.astype(np.float64), b.astype(np.float64), rcond=None)[0]
        assert x.shape == (4, 3)
        np.testing.assert_allclose(x, ref, rtol=0, atol=50 * TOL[dtype])
        np.testing.assert_allclose(
            np.asarray(lstsq(a, b[:, 1]), np.float64), ref[:, 1], rtol=0, atol=50 * TOL[dtype]
        )


def test_any_scale():
    """``a`` scaled by 1e-30 or 1e30 (float32 range ends): ``x`` scales inversely, no overflow."""
    rng = np.random.default_rng(2)
    a, b = rng.normal(size=(5, 3)).astype(np.float32), rng.normal(size=5).astype(np.float32)
    ref = np.linalg.lstsq(a.astype(np.float64), b.astype(np.float64), rcond=None)[0]
    for s in (1e-30, 1e30):
        x = np.asarray(lstsq(a * np.float32(s), b), np.float64) * s
        np.testing.assert_allclose(x, ref, rtol=1e-3, atol=1e-5)


def test_no_custom_call_in_the_batched_solve():
    """The compiled vmapped solve is plain XLA: no LAPACK custom call (``jnp.linalg.lstsq``'s
    has one, the batched SVD that hung), so nothing can wait on a LAPACK worker."""
    a, b = jnp.ones((1000, 6, 6)), jnp.ones((1000, 6))
    ours = jax.jit(jax.vmap(lstsq)).lower(a, b)
    theirs = jax.jit(jax.vmap(lambda a, b: jnp.linalg.lstsq(a, b)[0])).lower(a, b)
    assert "stablehlo.custom_call" in theirs.as_text()  # the check can see one
    assert "custom-call(" in theirs.compile().as_text()
    assert "stablehlo.custom_call" not in ours.as_text()
    assert "custom-call(" not in ours.compile().as_text()


def test_bad_shapes_raise():
    with pytest.raises(ValueError, match="lstsq"):
        lstsq(jnp.ones(3), jnp.ones(3))
    with pytest.raises(ValueError, match="lstsq"):
        lstsq(jnp.ones((3, 2)), jnp.ones(4))


@pytest.mark.parametrize("shape", [(0, 3), (3, 0), (0, 0)])
def test_empty_systems_give_zero(shape):
    # A problem without constraints has no multiplier equations: the answer is the empty/zero x.
    a = jnp.zeros(shape)
    x = lstsq(a, jnp.ones((shape[0],)))
    assert x.shape == (shape[1],) and not np.any(np.asarray(x))
    assert lstsq(a, jnp.ones((shape[0], 2))).shape == (shape[1], 2)
