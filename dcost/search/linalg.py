"""Least squares for the search's tiny systems, in plain XLA operations (no LAPACK call).

The KKT code solves systems of a handful of rows and columns (the free variables and the
constraints), once per start, guess and scenario, under ``jax.vmap``. ``jnp.linalg.lstsq`` does
that with a batched LAPACK SVD (``gesdd``) run as a custom call on the CPU, and under a
thousand-scenario vmap that call was seen never to return (one worker waiting forever at 0 % CPU
on a 2-core machine). ``lstsq`` here is a Cholesky solve of regularized normal equations, one
loop step per column or row (``fori_loop``: the compiled program holds one step's code, where
unrolled it held ``n``; 700 fewer XLA instructions in ``optimize``'s search): elementwise and
matrix-product operations that XLA fuses and batches like the rest of the model, with no custom
call, no LAPACK, no thread pool of its own.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

__all__ = ["lstsq", "REFINE", "RIDGE"]

RIDGE = 10.0
"""``eps = RIDGE * macheps * |A|_F**2`` (``macheps`` of the dtype): a ridge that keeps the
Cholesky factorizations of ``A^T A + eps I`` and ``A A^T + eps I`` clear of breaking down in
rounding (their condition numbers stay below ``1 + 1/(RIDGE macheps)``)."""
REFINE = 2
"""Refinement steps: each multiplies the ridge's relative bias on a singular value ``sigma``,
``1 - (sigma**2/(sigma**2 + eps))**2``, by itself once more."""


def _cholesky(g):
    """Lower ``L`` with ``L L^T = g`` for a symmetric positive definite ``(n, n)`` ``g``
    (right-looking, one ``fori_loop`` step per column, so the compiled program holds one column's
    code however large ``n``; pivots floored at the smallest normal number so that rounding can
    never give a NaN)."""
    n = g.shape[-1]
    rows = jnp.arange(n)
    tiny = jnp.finfo(g.dtype).tiny

    def column(k, carry):
        g, chol = carry
        pivot = jnp.sqrt(jnp.maximum(g[k, k], tiny))
        col = jnp.where(rows >= k, g[:, k] / pivot, 0.0)
        return g - col[:, None] * col[None, :], chol.at[:, k].set(col)

    _, chol = jax.lax.fori_loop(0, n, column, (g, jnp.zeros_like(g)))
    return chol


def _cho_solve(chol, r):
    """``x`` with ``L L^T x = r`` (``r`` of shape ``(n, k)``): forward, then back substitution,
    one ``fori_loop`` step per row."""
    n = chol.shape[-1]

    def forward(i, z):
        return z.at[i].set((r[i] - chol[i] @ z) / chol[i, i])

    def backward(j, x):
        i = n - 1 - j
        return x.at[i].set((z[i] - chol[:, i] @ x) / chol[i, i])

    z = jax.lax.fori_loop(0, n, forward, jnp.zeros_like(r))
    return jax.lax.fori_loop(0, n, backward, jnp.zeros_like(r))


def lstsq(a, b):
    """``x`` minimizing ``|a x - b|`` for a small ``(m, n)`` ``a`` and ``b`` of shape ``(m,)`` or
    ``(m, k)``: the minimum-norm least-squares solution (as ``numpy.linalg.lstsq`` returns it),
    up to a ridge far below the matrix's scale.

    With ``s = max |a_ij|``, ``A = a/s`` (so that any scale works) and ``eps = RIDGE * macheps *
    |A|_F**2`` (``macheps`` 2.2e-16 in float64, 1.2e-7 in float32; ``eps = RIDGE * macheps`` for
    ``a = 0``), the ridge-regularized pseudo-inverse, applied through both Gram matrices, and
    ``REFINE`` steps of refinement on the residual::

        M r     = A^T (A A^T + eps I)^{-1} A (A^T A + eps I)^{-1} A^T r
        x_0     = M b,    x_{i+1} = x_i + M (b - A x_i),    x = x_last / s

    each ``(. + eps I)^{-1}`` by a Cholesky factorization and triangular solves. ``M`` is formed
    once, as an ``(n, m)`` matrix, so the refinement steps are matrix products and the compiled
    code stays small. Along a singular value ``sigma`` of ``A``, ``M`` is ``1/sigma`` times
    ``(sigma**2/(sigma**2 + eps))**2``: exact for ``sigma**2 >> eps`` (after refinement, to
    rounding), zero on the null space, and a smooth cut-off, in place of the SVD's hard
    ``rcond``, for singular values near ``sqrt(eps)`` (about ``5e-8 |A|_F`` in float64, ``1e-3
    |A|_F`` in float32). On a rank-deficient ``a`` the answer is therefore the minimum-norm
    solution, and ``a = 0`` gives ``x = 0``. Both Gram matrices, not one: the normal equations
    ``(A^T A + eps I) x = A^T b`` alone leave rounding noise of up to ``macheps |A|**2 / eps =
    1/RIDGE`` of the answer in the null space of ``A`` (about 1 % was seen in float32), which the
    product with ``A`` removes; the second solve's noise, in the null space of ``A^T``, is
    removed by the final ``A^T``.

    Why not ``jnp.linalg.lstsq``: it runs a batched LAPACK SVD as a CPU custom call, which hung
    under a large vmap (see the module docstring); this uses only XLA operations. Works under
    ``jit``, ``vmap`` and differentiation; meant for ``m, n`` up to a few tens.
    Reference: Golub & Van Loan, "Matrix Computations" (4th ed., 2013), 4.2 (Cholesky), 5.3
    (normal equations, minimum-norm solutions), 6.1 (ridge regression).

    Args:
      a: ``(m, n)`` matrix.
      b: ``(m,)`` or ``(m, k)`` right-hand side(s).

    Returns:
      ``x`` of shape ``(n,)`` or ``(n, k)``.
    """
    a, b = jnp.asarray(a), jnp.asarray(b)
    dtype = jnp.result_type(a, b, float)
    a, b = a.astype(dtype), b.astype(dtype)
    if a.ndim != 2 or b.ndim not in (1, 2) or b.shape[0] != a.shape[0]:
        raise ValueError(f"lstsq: a must be (m, n) and b (m,) or (m, k); got {a.shape}, {b.shape}")
    vector = b.ndim == 1
    rhs = b[:, None] if vector else b
    m, n = a.shape
    if m == 0 or n == 0:  # no equations (a problem without constraints) or no unknowns: x = 0
        x = jnp.zeros((n, rhs.shape[1]), dtype)
        return x[:, 0] if vector else x
    scale = jnp.max(jnp.abs(a))
    scale = jnp.where(scale > 0, scale, 1.0)
    an = a / scale
    eps = RIDGE * jnp.finfo(dtype).eps * jnp.maximum(jnp.sum(an * an), 1.0)
    chol_n = _cholesky(an.T @ an + eps * jnp.eye(n, dtype=dtype))
    chol_m = _cholesky(an @ an.T + eps * jnp.eye(m, dtype=dtype))
    pseudo_inverse = an.T @ _cho_solve(chol_m, an @ _cho_solve(chol_n, an.T))  # M, (n, m)
    x = pseudo_inverse @ rhs
    for _ in range(REFINE):
        x = x + pseudo_inverse @ (rhs - an @ x)
    x = x / scale
    return x[:, 0] if vector else x
