"""The engine's host costs, fitted on end-to-end runs with the predicted row's model held out.

Kernel tables (``dcost.calibrate.kernels``) cannot show what an engine's CPU does between
kernels: scheduling, sampling, detokenizing, launching the step's graph. The model charges it as
``step_overhead`` per step and ``sequence_overhead`` per sequence in the step (``Report.
t_overhead``). A prediction is linear in both (``dcost.validation.silicon.Predictions``):

.. math:: \\hat y_i(s, q) = y^0_i + s\\,a_i + q\\,b_i

and the two are fitted per engine by least squares of ``log(y_hat/y)`` over the engine's runs of
*other* models (leave one model out): a row is never predicted with costs fitted on its own
model's rows. Optax Adam on ``(log s, log q)``, all folds in one ``vmap``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = ["HostFit", "fit_host", "held_out_host"]

STEPS = 400
LEARNING_RATE = 0.1
_START = (math.log(2e-4), math.log(2e-6))  # 0.2 ms a step, 2 us a sequence
_FLOOR = 1e-12


@dataclasses.dataclass(frozen=True)
class HostFit:
    """Host costs of one fit: ``step_overhead`` and ``sequence_overhead`` (s)."""

    step_overhead: float
    sequence_overhead: float


def _fit(base, per_step, per_seq, measured, weights) -> jax.Array:
    """``(log s, log q)`` minimizing the weighted mean squared log error (weights 0 leave a row
    out); ``weights`` may carry a leading fold axis."""
    opt = optax.adam(LEARNING_RATE)
    log_y = jnp.log(measured)

    def loss(z, w):
        pred = base + jnp.exp(z[0]) * per_step + jnp.exp(z[1]) * per_seq
        err = (jnp.log(jnp.maximum(pred, _FLOOR)) - log_y) ** 2
        return jnp.sum(w * err) / jnp.maximum(jnp.sum(w), 1.0)

    def solve(w):
        def step(carry, _):
            z, state = carry
            g = jax.grad(loss)(z, w)
            updates, state = opt.update(g, state, z)
            return (optax.apply_updates(z, updates), state), None

        z0 = jnp.asarray(_START)
        (z, _), _ = jax.lax.scan(step, (z0, opt.init(z0)), None, length=STEPS)
        return z

    if weights.ndim == 1:
        return jax.jit(solve)(weights)
    return jax.jit(jax.vmap(solve))(weights)


def _arrays(base, per_step, per_seq, measured) -> tuple[jax.Array, jax.Array, jax.Array, jax.Array]:
    return (
        jnp.asarray(np.asarray(base, float)),
        jnp.asarray(np.asarray(per_step, float)),
        jnp.asarray(np.asarray(per_seq, float)),
        jnp.asarray(np.asarray(measured, float)),
    )


def fit_host(base, per_step, per_seq, measured, mask=None) -> HostFit:
    """Host costs fitted to every row in ``mask`` (all rows when None).

    Args:
      base: predictions with no host cost (s).
      per_step, per_seq: how the prediction grows per second of each cost.
      measured: the measured values (s).
      mask: rows to fit.

    >>> import numpy as np
    >>> a = np.array([1.0, 1.0, 2.0]); b = np.array([8.0, 64.0, 256.0])
    >>> y = 0.01 + 3e-3 * a + 2e-5 * b
    >>> f = fit_host(np.full(3, 0.01), a, b, y)
    >>> round(f.step_overhead * 1e3, 2), round(f.sequence_overhead * 1e6, 1)
    (3.0, 20.0)
    """
    w = np.ones(len(measured)) if mask is None else np.asarray(mask, float)
    z = np.asarray(_fit(*_arrays(base, per_step, per_seq, measured), w))
    return HostFit(float(np.exp(z[0])), float(np.exp(z[1])))


def held_out_host(
    base, per_step, per_seq, measured, group: Sequence, fold: Sequence, mask=None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-row host costs fitted with the row's ``fold`` held out, within its ``group``.

    Args:
      group: the fit's unit per row (an engine): rows of other groups never enter its fit.
      fold: what is held out per row (a model): row ``i`` is predicted with costs fitted on the
        rows of ``group[i]`` whose fold differs from ``fold[i]``.
      mask: rows that may be fitted on (all when None); every row gets a prediction.

    Returns:
      ``(step_overhead, sequence_overhead)`` per row (s).
    """
    g_arr, f_arr = np.asarray(group), np.asarray(fold)
    ok = np.ones(len(g_arr), bool) if mask is None else np.asarray(mask, bool)
    pairs = list(zip(g_arr.tolist(), f_arr.tolist(), strict=True))
    keys = sorted(set(pairs))
    weights = np.stack([((g_arr == g) & (f_arr != f) & ok).astype(float) for g, f in keys])
    z = np.asarray(_fit(*_arrays(base, per_step, per_seq, measured), weights))
    index = {k: i for i, k in enumerate(keys)}
    rows = np.asarray([index[p] for p in pairs])
    return np.exp(z[rows, 0]), np.exp(z[rows, 1])
