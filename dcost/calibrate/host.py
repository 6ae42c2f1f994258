"""The engine's host costs, fitted on end-to-end runs with the predicted row's model held out.

Kernel tables (``dcost.calibrate.kernels``) cannot show what an engine's CPU does between
kernels (scheduling, sampling, detokenizing, launching the step's graph) nor what a layer costs
beyond its GEMMs and attention when they run back to back in a CUDA graph (norms, rotary
embeddings, activations, kernel tails; the tables time each kernel alone, launch included). The
model charges them as ``step_overhead`` per step, ``layer_overhead`` per layer,
``sequence_overhead`` per sequence in the step and ``prefill_step_overhead`` per step that
carries prompt tokens (``Report.t_overhead``): engines capture their decode steps in a CUDA
graph and launch a step with a prompt's tokens outside it, kernel by kernel, after preparing the
prompt on the host. The fifth, ``gemm_intercept_share``, is the share of the GEMM table's
intercept (``dcost.engines`` ``gemm_intercept``, per precision) a step pays per dense GEMM kernel
of a layer (``Model.gemms_per_layer``): the part of a kernel's fixed time (its launch, its
pipeline's fill and drain, what a block-scaled fp8 GEMM does around its product) that running
back to back in a graph does not hide.
A prediction is linear in the five (``dcost.validation.silicon.Predictions``):

.. math:: \\hat y_i(s, l, q, e, g) = y^0_i + s\\,a_i + l\\,c_i + q\\,b_i + e\\,p_i + g\\,k_i

and they are fitted per engine by least squares of ``log(y_hat/y)`` over the engine's runs of
*other* models (leave one model out): a row is never predicted with costs fitted on its own
model's rows. Each model's runs weigh one in all (``balance``): the costs are the engine's, and
a model with 400 runs (MiniMax-M2.5 under vLLM) would otherwise outweigh one with 21 (Llama 3.1
8B) nineteen times, where a new model is what a profile is asked about. Optax Adam on their
logarithms, all folds in one ``vmap``.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax

__all__ = ["HostFit", "fit_host", "held_out_host"]

STEPS = 1500  # Adam on 4 log-costs: 400 steps left a weakly identified one 17 % short
LEARNING_RATE = 0.1
FIELDS = (
    "step_overhead",
    "layer_overhead",
    "sequence_overhead",
    "prefill_step_overhead",
    "gemm_intercept_share",
)
_START = (math.log(2e-4), math.log(2e-6), math.log(2e-6), math.log(2e-4), math.log(0.3))
_FLOOR = 1e-12


@dataclasses.dataclass(frozen=True)
class HostFit:
    """Fixed costs of one fit (s): per step, per layer of a step, per sequence of a step, per
    step that carries prompt tokens; and the share of a GEMM's intercept paid per GEMM kernel of
    a layer (a number)."""

    step_overhead: float
    layer_overhead: float
    sequence_overhead: float
    prefill_step_overhead: float
    gemm_intercept_share: float = 0.0


def _fit(base, slopes, measured, weights) -> jax.Array:
    """The logarithms of the costs minimizing the weighted mean squared log error (weights 0
    leave a row out); ``weights`` may carry a leading fold axis. ``slopes``: ``(n, rows)``, the
    first ``n`` of ``FIELDS``."""
    opt = optax.adam(LEARNING_RATE)
    log_y = jnp.log(measured)

    def loss(z, w):
        pred = base + jnp.exp(z) @ slopes
        err = (jnp.log(jnp.maximum(pred, _FLOOR)) - log_y) ** 2
        return jnp.sum(w * err) / jnp.maximum(jnp.sum(w), 1.0)

    def solve(w):
        def step(carry, _):
            z, state = carry
            g = jax.grad(loss)(z, w)
            updates, state = opt.update(g, state, z)
            return (optax.apply_updates(z, updates), state), None

        z0 = jnp.asarray(_START[: slopes.shape[0]])
        (z, _), _ = jax.lax.scan(step, (z0, opt.init(z0)), None, length=STEPS)
        return z

    if weights.ndim == 1:
        return jax.jit(solve)(weights)
    return jax.jit(jax.vmap(solve))(weights)


def _arrays(base, slopes, measured) -> tuple[jax.Array, jax.Array, jax.Array]:
    return (
        jnp.asarray(np.asarray(base, float)),
        jnp.asarray(np.stack([np.asarray(x, float) for x in slopes])),
        jnp.asarray(np.asarray(measured, float)),
    )


def _balanced(weights: np.ndarray, balance) -> np.ndarray:
    """``weights`` (one row or a fold axis first) with each ``balance`` label's rows sharing one
    unit of weight within its fit (a label with no rows in a fit weighs nothing there)."""
    if balance is None:
        return weights
    labels = np.asarray(balance)
    out = np.array(weights, float, copy=True)
    flat = out.reshape(-1, labels.size)
    for lab in np.unique(labels):
        mine = labels == lab
        total = flat[:, mine].sum(axis=1, keepdims=True)
        flat[:, mine] = np.where(total > 0, flat[:, mine] / np.maximum(total, 1e-300), 0.0)
    return flat.reshape(out.shape)


def fit_host(base, slopes, measured, mask=None, balance=None) -> HostFit:
    """Fixed costs fitted to every row in ``mask`` (all rows when None).

    Args:
      base: predictions with no fixed cost (s).
      slopes: ``(per_step, per_layer, per_sequence, per_prefill_step[, per_gemm_share])``:
        how each prediction grows per unit of each of ``FIELDS`` (the first four or all five;
        ``Predictions.slopes``).
      measured: the measured values (s).
      mask: rows to fit.
      balance: a label per row (a model); each label's rows weigh one in all, so that a model
        with many runs counts as much as one with few (None: every row weighs one).

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> a, c, b = rng.uniform(1, 2, 40), rng.choice([32.0, 61.0, 80.0], 40), rng.uniform(1, 256, 40)
    >>> p = a * rng.uniform(0.0, 0.5, 40)  # the steps that carry prompt tokens: a share of them
    >>> k = c * rng.choice([4.0, 9.0], 40) * rng.choice([4e-6, 1.4e-5], 40)  # GEMMs x intercepts
    >>> y = 0.01 + 3e-3 * a + 1e-5 * c + 2e-5 * b + 5e-3 * p + 0.4 * k
    >>> f = fit_host(np.full(40, 0.01), (a, c, b, p, k), y)
    >>> [bool(abs(v / t - 1) < 0.1) for v, t in zip((f.step_overhead, f.layer_overhead,
    ...     f.sequence_overhead, f.prefill_step_overhead, f.gemm_intercept_share),
    ...     (3e-3, 1e-5, 2e-5, 5e-3, 0.4))]
    [True, True, True, True, True]
    """
    w = np.ones(len(measured)) if mask is None else np.asarray(mask, float)
    z = np.asarray(_fit(*_arrays(base, slopes, measured), jnp.asarray(_balanced(w, balance))))
    return HostFit(*(float(v) for v in np.exp(z)))


def held_out_host(base, slopes, measured, group, fold, mask=None, balance=None) -> np.ndarray:
    """Per-row fixed costs fitted with the row's ``fold`` held out, within its ``group``.

    Args:
      base, slopes, measured: as ``fit_host``.
      group: the fit's unit per row (an engine): rows of other groups never enter its fit.
      fold: what is held out per row (a model): row ``i`` is predicted with costs fitted on the
        rows of ``group[i]`` whose fold differs from ``fold[i]``.
      mask: rows that may be fitted on (all when None); every row gets a prediction.
      balance: as ``fit_host``, within each fit.

    Returns:
      ``(rows, n)``: each row's first ``n`` of ``FIELDS``, one per slope.
    """
    g_arr, f_arr = np.asarray(group), np.asarray(fold)
    ok = np.ones(len(g_arr), bool) if mask is None else np.asarray(mask, bool)
    pairs = list(zip(g_arr.tolist(), f_arr.tolist(), strict=True))
    keys = sorted(set(pairs))
    weights = np.stack([((g_arr == g) & (f_arr != f) & ok).astype(float) for g, f in keys])
    z = np.asarray(_fit(*_arrays(base, slopes, measured), jnp.asarray(_balanced(weights, balance))))
    index = {k: i for i, k in enumerate(keys)}
    return np.exp(z[np.asarray([index[p] for p in pairs])])
