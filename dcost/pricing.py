"""Pricing as a side channel: what public API prices reveal about a provider's model and hardware.

Observation model
-----------------
A price sheet is read as ``price = margin x cost``, with the cost of each kind of token from dcost's
serving model (``dcost.prefill`` / ``dcost.decode``). The hidden quantities ``theta``, fitted in log
space, are

    b_kv  KV-cache bytes per token (all layers)         kv_bytes_per_token
    N     active parameters                             params_active
    R     hardware FLOP/s per byte/s of HBM, F / BW     flops_per_byte
    m     margin, price / cost                          margin

The known quantities are the provider's serving convention (``Serving``): a replica of ``G`` chips
of a reference chip (its HBM ``BW``, capacity ``M``, price ``p`` per chip-hour; its F is replaced by
``R*BW``), treated as one big chip, so no communication term; a decode batch ``B``; the
representative context ``T`` of the base price tier and ``T_L`` of the long-context tier; bytes per
weight ``b_w``; sparsity ``s = N_total/N_active`` (all experts touched at the serving batch, so an
MoE model reads ``b_w*s`` bytes per active parameter); attention FLOPs per context token
``a = g*b_kv`` (``g`` FLOPs per KV byte: the query heads per KV head for GQA in bf16); and
``tau``, the HBM-equivalent seconds a cached token is held. With ``c = G*p/3600`` ($/s of a
replica), ``F_r = G*R*BW``, ``BW_r = G*BW``, ``M_r = G*M`` and ``smax`` the smooth max of
``dcost.smax``:

    t_prefill(T) = smax( T*(2N + a*T/2)/F_r , (b_w*s*N + T*b_kv)/BW_r )     # dcost.prefill, batch 1
    t_decode(T)  = smax( B*(2N + a*T)/F_r   , (b_w*s*N + B*T*b_kv)/BW_r )   # dcost.decode, batch B
    input        = m*c*t_prefill(T)/T           input_long  = the same at T_L
    output       = m*c*t_decode(T)/B            output_long = the same at T_L
    storage      = m*c*b_kv/M_r                 # $ per token-second: cached KV rents HBM
    cache_write  = input + tau*storage          # prefill, then hold the KV for tau
    cache_hit    = tau*storage + m*c*b_kv/BW_r  # hold again for tau (TTL refresh), read it once

so the output/input ratio is the model's decode-to-prefill cost ratio, the long-context surcharge
is KV reads (and attention FLOPs) growing with context, and cache prices are KV storage instead of
recomputed prefill. The cost is the roofline's (``eta_F = eta_BW = 1``, no idle capacity), a lower
bound on a real cost, so the fitted margin is price over roofline cost: an upper bound on the
accounting margin.

Noise model and fit. Observed prices ``y_i`` (any subset of the kinds above) satisfy
``log y_i = log yhat_i(theta) + eps_i`` with ``eps_i ~ N(0, sigma_i^2)``: ``sigma = 0.1`` for input
and output prices, 0.3 for cache prices (visibly set as round fractions of the input price). Each
``log theta_j`` has a log-normal prior (a weak one, a factor of 10 at one sigma, by default; an
*anchor* is a tight one, e.g. the published active parameters of an open-weights model). The
posterior mode minimizes

    L(theta) = 1/2 sum_i ((log y_i - log yhat_i)/sigma_i)^2 + 1/2 sum_j ((log theta_j - mu_j)/w_j)^2

by Optax Adam (cosine-decayed step) in standardized log space, and its covariance is the Laplace
approximation
``Cov[log theta] = (grad^2 L)^-1`` at the mode.

Identifiability. Prices are homogeneous of degree one in ``(m) x (N, b_kv)``: multiplying N and
b_kv by ``c`` and dividing m by ``c`` changes no price, so prices alone never separate the margin
from the model's size (a big model at a thin margin from a small one at a fat margin). The price
information ``I = J^T diag(1/sigma^2) J`` (``J = d log yhat / d log theta``) is then singular, and
``identifiability`` reports its near-null directions, and for each parameter whether the prices
or the prior determine it. Anchoring N (open weights) or the margin makes the rest identifiable.
In the memory-bound decode regime the batch enters only through ``N/B``, so doubling the assumed
batch doubles the inferred N and R: the conclusions are conditional on the serving convention.

References: Pope et al., "Efficiently Scaling Transformer Inference" (2022) for the cost model;
MacKay, "Information Theory, Inference, and Learning Algorithms" (2003), ch. 27, for the Laplace
approximation.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from collections.abc import Mapping
from importlib import resources

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from dcost.roofline import SECONDS_PER_HOUR, decode, prefill
from dcost.specs import Design, Hardware, Model, SpecError, Workload, _float, check

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["KINDS", "PARAMS", "Serving", "PriceFit", "Identifiability", "PriceSheet",
           "predict_prices", "fit_prices", "fit_log_prices", "identifiability", "price_sheets",
           "serving_for", "fit_sheet", "DEFAULT_PRIOR", "DEFAULT_SIGMA", "PLANTED"]

# Hidden values planted in prices the model itself generates, to show that ``fit_prices`` recovers
# them: a Llama-3-70B-like dense model, a small GQA model and a DeepSeek-V3-like MLA model.
PLANTED = {
    "dense-70b": {"kv_bytes_per_token": 327680.0, "params_active": 70e9, "flops_per_byte": 295.0,
                  "margin": 5.0},
    "small-gqa": {"kv_bytes_per_token": 65536.0, "params_active": 8e9, "flops_per_byte": 160.0,
                  "margin": 2.5},
    "big-mla": {"kv_bytes_per_token": 70272.0, "params_active": 37e9, "flops_per_byte": 600.0,
                "margin": 9.0},
}

KINDS = ("input", "output", "input_long", "output_long", "cache_write", "cache_hit",
         "cache_storage")
"""Price kinds, in the order of every price vector. SI: $ per token; ``cache_storage`` is $ per
token-second."""

PARAMS = ("kv_bytes_per_token", "params_active", "flops_per_byte", "margin")
"""Hidden quantities, in the order of every parameter vector (bytes, parameters, FLOP/byte, 1)."""

DEFAULT_SIGMA = {"input": 0.1, "output": 0.1, "input_long": 0.1, "output_long": 0.1,
                 "cache_write": 0.3, "cache_hit": 0.3, "cache_storage": 0.3}
"""Standard deviation of the log-price residual of each kind."""

DEFAULT_PRIOR = {"kv_bytes_per_token": (1e5, 10.0), "params_active": (1e11, 10.0),
                 "flops_per_byte": (300.0, 10.0), "margin": (3.0, 10.0)}
"""Weak log-normal priors: (median, multiplicative one-sigma factor) of each hidden quantity."""

PER_MILLION = 1e-6


class Serving(eqx.Module):
    """The known side of the observation model: the provider's serving convention.

    Attributes:
      hardware: the reference chip (``hbm_bandwidth``, ``hbm_capacity`` and ``price_per_hour`` are
        used; ``flops`` is replaced by ``flops_per_byte * hbm_bandwidth``).
      chips: chips per replica ``G``.
      batch: decode batch ``B`` (sequences).
      context: representative context ``T`` of the base price tier (tokens).
      context_long: representative context ``T_L`` of the long-context tier (tokens).
      bytes_per_param: bytes per weight ``b_w``.
      sparsity: ``s = N_total / N_active`` (1 for a dense model).
      attn_flops_per_kv_byte: ``g``, attention FLOPs per context token per KV byte (``a = g*b_kv``).
      cache_hold_s: ``tau``, HBM-equivalent seconds a cached token is held (s).
      smoothness: smooth-max temperature of the cost model (0 is the exact max).

    >>> import dcost
    >>> s = dcost.pricing.Serving(dcost.hardware("h100-sxm"))
    >>> float(s.chips), float(s.batch)
    (8.0, 64.0)
    """

    hardware: Hardware
    chips: jax.Array = eqx.field(default=8.0, converter=_float)
    batch: jax.Array = eqx.field(default=64.0, converter=_float)
    context: jax.Array = eqx.field(default=16384.0, converter=_float)
    context_long: jax.Array = eqx.field(default=400_000.0, converter=_float)
    bytes_per_param: jax.Array = eqx.field(default=2.0, converter=_float)
    sparsity: jax.Array = eqx.field(default=1.0, converter=_float)
    attn_flops_per_kv_byte: jax.Array = eqx.field(default=8.0, converter=_float)
    cache_hold_s: jax.Array = eqx.field(default=300.0, converter=_float)
    smoothness: jax.Array = eqx.field(default=0.02, converter=_float)

    def __check_init__(self):
        check("Serving", "chips", self.chips, low=1.0)
        check("Serving", "batch", self.batch, low=1.0)
        check("Serving", "context", self.context, low=1.0)
        check("Serving", "context_long", self.context_long, low=1.0)
        check("Serving", "bytes_per_param", self.bytes_per_param, low_open=True)
        check("Serving", "sparsity", self.sparsity, low=1.0)
        check("Serving", "attn_flops_per_kv_byte", self.attn_flops_per_kv_byte)
        check("Serving", "cache_hold_s", self.cache_hold_s)
        check("Serving", "smoothness", self.smoothness, high=1.0)


def _specs(values, serving: Serving):
    """The replica as one dcost.Hardware and the hidden model as one dcost.Model."""
    b_kv, n, r = values[0], values[1], values[2]
    h, g = serving.hardware, serving.chips
    bw = g * h.hbm_bandwidth
    replica = Hardware(flops=r * bw, hbm_bandwidth=bw, hbm_capacity=g * h.hbm_capacity,
                       scaleup_bandwidth=h.scaleup_bandwidth,
                       scaleout_bandwidth=h.scaleout_bandwidth, scaleup_size=1.0,
                       price_per_hour=g * h.price_per_hour)
    model = Model(n_layers=1.0, d_model=1.0, params_dense=n, params_per_expert=0.0, n_experts=0.0,
                  experts_active=0.0, kv_bytes_per_token=b_kv,
                  bytes_per_param=serving.bytes_per_param * serving.sparsity,
                  attn_flops_per_context_token=serving.attn_flops_per_kv_byte * b_kv)
    return replica, model


def _prices(values, serving: Serving):
    """Predicted price of every kind in ``KINDS`` ($/token; storage $/token-s) at natural values."""
    replica, model = _specs(values, serving)
    m, s = values[3], serving.smoothness
    contexts = jnp.stack([serving.context, serving.context_long])  # both tiers in one call
    w = Workload(contexts, prompt=contexts)
    c_in, c_in_long = prefill(Design(batch=1.0), replica, model, w, s).cost_per_token
    c_out, c_out_long = decode(Design(batch=serving.batch), replica, model, w, s).cost_per_token
    per_s = replica.price_per_hour / SECONDS_PER_HOUR
    storage = per_s * model.kv_bytes_per_token / replica.hbm_capacity
    read = per_s * model.kv_bytes_per_token / replica.hbm_bandwidth
    tau = serving.cache_hold_s
    costs = jnp.stack([c_in, c_out, c_in_long, c_out_long, c_in + tau * storage,
                       tau * storage + read, storage])
    return m * costs


def _log_prices(theta, serving: Serving):
    return jnp.log(_prices(jnp.exp(theta), serving))


def predict_prices(values: Mapping[str, float], serving: Serving) -> dict:
    """Prices the observation model predicts for hidden quantities ``values``.

    .. math::
        \\text{input} = m\\,c\\,t_{prefill}(T)/T, \\quad
        \\text{output} = m\\,c\\,t_{decode}(T)/B, \\quad
        \\text{storage} = m\\,c\\,b_{kv}/M_r

    (the module docstring has every kind).

    Args:
      values: ``kv_bytes_per_token`` (bytes), ``params_active``, ``flops_per_byte`` (FLOP/byte)
        and ``margin`` (price over cost).
      serving: the known serving convention.

    Returns:
      A dict from each kind in ``KINDS`` to its price in $ per token (``cache_storage``: $ per
      token-second).

    >>> import dcost
    >>> s = dcost.pricing.Serving(dcost.hardware("h100-sxm"))
    >>> p = dcost.pricing.predict_prices({"kv_bytes_per_token": 327680.0, "params_active": 70e9,
    ...                                   "flops_per_byte": 295.0, "margin": 5.0}, s)
    >>> 5 < float(p["output"] / p["input"]) < 20   # decode is memory bound, prefill compute bound
    True
    """
    missing = [k for k in PARAMS if k not in values]
    unknown = [k for k in values if k not in PARAMS]
    if missing or unknown:
        raise ValueError(f"values needs exactly {PARAMS}; missing {missing}, unknown {unknown}")
    for k in PARAMS:
        check("values", k, values[k], low_open=True)
    v = jnp.stack([jnp.asarray(values[k], dtype=jnp.result_type(float)) for k in PARAMS])
    p = jax.jit(_prices)(v, serving)
    return {k: p[i] for i, k in enumerate(KINDS)}


class PriceFit(eqx.Module):
    """The posterior of a price fit (log space), a pytree: a batch of fits has a leading axis.

    Attributes:
      log_values: posterior mode of ``log theta`` in ``PARAMS`` order.
      log_cov: Laplace covariance of ``log theta``, the inverse Hessian of the loss at the mode.
      information: price information ``J^T diag(mask/sigma^2) J`` (no prior).
      prior_sd: prior standard deviation of each ``log theta_j``.
      residuals: ``log y - log yhat`` per kind (0 where a kind is not observed).
      mask: 1 where a kind is observed.
      loss: the loss ``L`` at the mode.
      grad_norm: norm of the loss gradient at the mode (in standardized units); small when
        converged.
    """

    log_values: jax.Array
    log_cov: jax.Array
    information: jax.Array
    prior_sd: jax.Array
    residuals: jax.Array
    mask: jax.Array
    loss: jax.Array
    grad_norm: jax.Array

    @property
    def values(self) -> dict:
        """Posterior mode of each hidden quantity (natural units)."""
        v = np.exp(np.asarray(self.log_values))
        return {k: v[..., i] for i, k in enumerate(PARAMS)}

    @property
    def log_sd(self) -> dict:
        """Laplace standard deviation of each ``log theta_j`` (a relative error)."""
        sd = np.sqrt(np.diagonal(np.asarray(self.log_cov), axis1=-2, axis2=-1))
        return {k: sd[..., i] for i, k in enumerate(PARAMS)}


def _loss(theta, log_y, mask, sigma, mu, w, serving):
    r = mask * (log_y - _log_prices(theta, serving)) / sigma
    z = (theta - mu) / w
    return 0.5 * jnp.sum(r ** 2) + 0.5 * jnp.sum(z ** 2)


def fit_log_prices(log_prices, mask, serving: Serving, sigma, prior_mean, prior_sd, steps=4000,
                   learning_rate=0.1):
    """Posterior mode and Laplace covariance of ``log theta`` from log prices (jitted).

    Minimizes ``L(theta)`` of the module docstring by ``optax.adam`` with a cosine-decayed step for
    a fixed number of steps in standardized coordinates ``z = (log theta - mu)/w`` (starting at the
    prior median, ``z = 0``), then takes ``Cov = (grad^2 L)^-1`` at the mode. One compilation
    serves every call with the same ``steps``; the function also works under ``jax.vmap`` (a
    separate, slower compilation).

    Args:
      log_prices: log of the observed prices in ``KINDS`` order (any finite value where unobserved).
      mask: 1.0 where a kind is observed, else 0.0.
      serving: the known serving convention.
      sigma: standard deviation of each log-price residual, ``KINDS`` order.
      prior_mean: prior mean ``mu`` of ``log theta``, ``PARAMS`` order.
      prior_sd: prior standard deviation ``w`` of ``log theta``, ``PARAMS`` order.
      steps: Adam iterations.
      learning_rate: initial Adam step (standardized units).

    Returns:
      A ``PriceFit``.
    """
    return _fit(log_prices, mask, serving, sigma, prior_mean, prior_sd, int(steps),
                float(learning_rate))


@functools.partial(jax.jit, static_argnums=(6, 7))
def _fit(log_prices, mask, serving, sigma, prior_mean, prior_sd, steps, learning_rate):
    dtype = jnp.result_type(float)
    log_y, mask, sigma, mu, w = (jnp.asarray(x, dtype) for x in
                                 (log_prices, mask, sigma, prior_mean, prior_sd))
    log_y = jnp.where(mask > 0, log_y, 0.0)

    def f(z):
        return _loss(mu + w * z, log_y, mask, sigma, mu, w, serving)

    opt = optax.adam(optax.cosine_decay_schedule(learning_rate, steps, alpha=1e-3))

    def step(carry, _):
        z, state = carry
        grad = jax.grad(f)(z)
        updates, state = opt.update(grad, state, z)
        return (optax.apply_updates(z, updates), state), None

    z0 = jnp.zeros_like(mu)
    (z, _), _ = jax.lax.scan(step, (z0, opt.init(z0)), None, length=steps)
    theta = mu + w * z
    loss_fn = functools.partial(_loss, log_y=log_y, mask=mask, sigma=sigma, mu=mu, w=w,
                                serving=serving)
    hess = jax.hessian(loss_fn)(theta)
    jac = jax.jacfwd(_log_prices)(theta, serving)
    info = jac.T @ ((mask / sigma ** 2)[:, None] * jac)
    resid = mask * (log_y - _log_prices(theta, serving))
    grad_norm = jnp.linalg.norm(jax.grad(f)(z))
    return PriceFit(theta, jnp.linalg.inv(hess), info, w, resid, mask, loss_fn(theta), grad_norm)


def _vector(mapping, order, default, what):
    unknown = [k for k in mapping if k not in order]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {list(order)}")
    return [mapping.get(k, default.get(k) if isinstance(default, Mapping) else default)
            for k in order]


def fit_prices(prices: Mapping[str, float], serving: Serving, *, prior=None, sigma=None,
               steps=4000) -> PriceFit:
    """Fit the hidden quantities to a price sheet; Laplace uncertainty in log space.

    .. math::
        \\hat\\theta = \\arg\\min_\\theta \\tfrac12 \\sum_i
        \\Big(\\frac{\\log y_i - \\log \\hat y_i(\\theta)}{\\sigma_i}\\Big)^2
        + \\tfrac12 \\sum_j \\Big(\\frac{\\log\\theta_j - \\mu_j}{w_j}\\Big)^2,
        \\qquad \\mathrm{Cov}[\\log\\theta] \\approx (\\nabla^2 L)^{-1}

    Args:
      prices: observed prices by kind (``KINDS``), $ per token (``cache_storage``: $ per
        token-second). Kinds left out are not observed.
      serving: the known serving convention.
      prior: overrides of ``DEFAULT_PRIOR``: name -> (median, one-sigma factor > 1), e.g.
        ``{"params_active": (37e9, 1.05)}`` anchors N within 5 %.
      sigma: overrides of ``DEFAULT_SIGMA`` (log-price residual sd per kind), or one float for all.
      steps: Adam iterations.

    Returns:
      A ``PriceFit``; ``identifiability(fit)`` says what the prices pin down.

    Raises:
      ValueError: an unknown kind or parameter name, a non-positive price, a factor <= 1.

    >>> import dcost
    >>> s = dcost.pricing.Serving(dcost.hardware("h100-sxm"))
    >>> truth = {"kv_bytes_per_token": 2e5, "params_active": 50e9, "flops_per_byte": 300.0,
    ...          "margin": 4.0}
    >>> y = {k: float(v) for k, v in dcost.pricing.predict_prices(truth, s).items()}
    >>> fit = dcost.pricing.fit_prices(y, s, prior={"margin": (4.0, 1.01)})
    >>> round(float(fit.values["params_active"]) / 1e9)
    50
    """
    unknown = [k for k in prices if k not in KINDS]
    if unknown:
        raise ValueError(f"unknown price kind {unknown}; known: {list(KINDS)}")
    if not prices:
        raise ValueError("prices is empty: give at least one price kind")
    for k, v in prices.items():
        check("prices", k, v, low_open=True)
    mask = [1.0 if k in prices else 0.0 for k in KINDS]
    log_y = [math.log(float(prices[k])) if k in prices else 0.0 for k in KINDS]
    if sigma is None or isinstance(sigma, Mapping):
        sig = _vector(sigma or {}, KINDS, DEFAULT_SIGMA, "sigma kind")
    else:
        sig = [float(sigma)] * len(KINDS)
    for k, v in zip(KINDS, sig, strict=True):
        check("sigma", k, v, low_open=True)
    merged = dict(DEFAULT_PRIOR)
    unknown = [k for k in (prior or {}) if k not in PARAMS]
    if unknown:
        raise ValueError(f"unknown prior parameter {unknown}; known: {list(PARAMS)}")
    merged.update(prior or {})
    for k, (median, factor) in merged.items():
        check("prior median", k, median, low_open=True)
        check("prior factor", k, factor, low=1.0, low_open=True)
    mu = [math.log(merged[k][0]) for k in PARAMS]
    w = [math.log(merged[k][1]) for k in PARAMS]
    return fit_log_prices(jnp.asarray(log_y), jnp.asarray(mask), serving, jnp.asarray(sig),
                          jnp.asarray(mu), jnp.asarray(w), steps=steps)


@dataclasses.dataclass(frozen=True)
class Identifiability:
    """What a price sheet pins down.

    Attributes:
      status: per parameter, ``"pinned"`` (the prices fix it: posterior sd < ln 1.5, i.e. within
        a factor of 1.5 at one sigma, and the prior carries < 10 % of its precision), ``"prior"``
        (the prior carries > 50 % of its precision: the prices barely inform it) or ``"weak"``
        (in between).
      data_share: per parameter, ``1 - Var_post/Var_prior``: 1 when the prices decide it alone.
      eigenvalues: eigenvalues of the price information ``I``, ascending (1/log-units^2).
      directions: the matching unit eigenvectors (rows, ``PARAMS`` order).
      unpinned: indices of directions the prices alone do not pin within a factor of 2 at one
        sigma (``1/sqrt(lambda) > ln 2``).
      singular: True when ``lambda_min < 1e-6 * lambda_max``: the information is singular.
      condition: ``lambda_max / lambda_min`` of the information (inf when singular to precision).
    """

    status: dict
    data_share: dict
    eigenvalues: np.ndarray
    directions: np.ndarray
    unpinned: tuple
    singular: bool
    condition: float

    def describe(self) -> str:
        """One paragraph a person can read."""
        lines = [f"{k}: {self.status[k]} (data share {self.data_share[k]:.2f})" for k in PARAMS]
        lines.append(f"price information condition number: {self.condition:.3g}"
                     + (" (singular)" if self.singular else ""))
        for i in self.unpinned:
            lines.append("prices miss " + _direction(self.directions[i]))
        return "\n".join(lines)


def _direction(v) -> str:
    """A unit direction as a product of powers, largest power 1, first power positive."""
    v = np.asarray(v) / np.max(np.abs(v))
    v = v * np.sign(v[np.argmax(np.abs(v) > 0.05)])
    terms = [f"{k}^{c:+.2f}" for k, c in zip(PARAMS, v, strict=True) if abs(c) > 0.05]
    return " * ".join(terms)


def identifiability(fit: PriceFit) -> Identifiability:
    """Which hidden quantities the prices pin down and which they leave to the prior.

    The price information ``I = J^T diag(1/sigma^2) J`` is the curvature the prices alone give the
    loss in ``log theta``. Its eigenvectors with tiny eigenvalues are combinations the prices cannot
    see; the exact null direction of this model is ``(b_kv, N, m) -> (c b_kv, c N, m/c)``. Per
    parameter, the data share ``1 - Var_post/Var_prior`` says how much of the posterior comes from
    the prices.

    Args:
      fit: one (unbatched) ``PriceFit``.

    Returns:
      An ``Identifiability``.

    >>> import dcost
    >>> s = dcost.pricing.Serving(dcost.hardware("h100-sxm"))
    >>> y = {"input": 3e-6, "output": 15e-6, "output_long": 22.5e-6}
    >>> rep = dcost.pricing.identifiability(dcost.pricing.fit_prices(y, s))
    >>> rep.singular, rep.status["flops_per_byte"], rep.status["margin"] == "pinned"
    (True, 'pinned', False)
    >>> print(rep.describe().splitlines()[-1])
    prices miss kv_bytes_per_token^+1.00 * params_active^+1.00 * margin^-1.00
    """
    info = np.asarray(fit.information, dtype=float)
    if info.ndim != 2:
        raise ValueError(f"identifiability takes one fit, got a batch of shape {info.shape[:-2]}")
    lam, vec = np.linalg.eigh(0.5 * (info + info.T))
    lam = np.clip(lam, 0.0, None)
    w = np.asarray(fit.prior_sd, dtype=float)
    share = 1.0 - np.diagonal(np.asarray(fit.log_cov, dtype=float)) / w ** 2
    sd = np.sqrt(np.diagonal(np.asarray(fit.log_cov, dtype=float)))
    status = {}
    for i, k in enumerate(PARAMS):
        if share[i] > 0.9 and sd[i] < math.log(1.5):
            status[k] = "pinned"
        elif share[i] < 0.5:
            status[k] = "prior"
        else:
            status[k] = "weak"
    top = lam[-1] if lam[-1] > 0 else 1.0
    singular = bool(lam[0] < 1e-6 * top)
    condition = float(top / lam[0]) if lam[0] > 0 else math.inf
    unpinned = tuple(i for i in range(len(lam)) if lam[i] * math.log(2.0) ** 2 < 1.0)
    return Identifiability(status, {k: float(share[i]) for i, k in enumerate(PARAMS)}, lam,
                           vec.T, unpinned, singular, condition)


@dataclasses.dataclass(frozen=True)
class PriceSheet:
    """One published price sheet (SI units) with its source.

    Attributes:
      name: the key in ``price_sheets.toml``.
      provider, model: who sells what.
      prices: kind -> $ per token (``cache_storage``: $ per token-second).
      page: the public page the prices come from.
      published: when the page says the prices took effect (or what dates it).
      retrieved: when they were looked up.
      serving: overrides of the default serving convention for this sheet.
      prior: anchors, name -> (median, factor).
      notes: free text (what each price means, caveats, the source of each anchor).
    """

    name: str
    provider: str
    model: str
    prices: dict
    page: str
    published: str
    retrieved: str
    serving: dict
    prior: dict
    notes: str


_SERVING_FIELDS = ("chips", "batch", "context", "context_long", "bytes_per_param", "sparsity",
                   "attn_flops_per_kv_byte", "cache_hold_s", "smoothness")


@functools.cache
def _sheets_toml() -> dict:
    text = resources.files("dcost.presets").joinpath("price_sheets.toml").read_text("utf-8")
    return tomllib.loads(text)


def _per_token(kind: str, value: float) -> float:
    """$/M tokens (storage: $/M tokens/hour) as people read them -> SI."""
    si = float(value) * PER_MILLION
    return si / SECONDS_PER_HOUR if kind == "cache_storage" else si


def price_sheets() -> dict:
    """The published price sheets of ``dcost/presets/price_sheets.toml``, in SI units.

    >>> import dcost
    >>> sheets = dcost.pricing.price_sheets()
    >>> all(s.prices["output"] > s.prices["input"] for s in sheets.values())
    True
    """
    table = _sheets_toml()
    out = {}
    for name, entry in table.items():
        if name == "assumptions":
            continue
        prices = {}
        for key, value in entry["prices"].items():
            kind = "cache_storage" if key == "cache_storage_per_hour" else key
            if kind not in KINDS:
                raise ValueError(f"price_sheets.toml [{name}]: unknown price kind {key!r}")
            prices[kind] = _per_token(kind, value)
        prior = {k: (float(v["value"]), float(v["factor"]))
                 for k, v in entry.get("anchors", {}).items()}
        out[name] = PriceSheet(name, entry["provider"], entry["model"], prices, entry["page"],
                               entry["published"], entry["retrieved"],
                               dict(entry.get("serving", {})), prior, entry.get("notes", ""))
    return out


def serving_for(sheet: PriceSheet | None = None) -> Serving:
    """The serving convention of ``price_sheets.toml`` (its ``[assumptions]``), with the sheet's
    overrides applied (a ``price_per_hour`` override replaces the chip's price)."""
    from dcost.presets import hardware

    base = dict(_sheets_toml()["assumptions"])
    base.update(sheet.serving if sheet is not None else {})
    overrides = {}
    if "price_per_hour" in base:
        overrides["price_per_hour"] = float(base.pop("price_per_hour"))
    chip = hardware(base.pop("hardware"), **overrides)
    unknown = [k for k in base if k not in _SERVING_FIELDS and k != "note"]
    if unknown:
        raise SpecError(f"unknown serving assumption {unknown}; known: {list(_SERVING_FIELDS)}")
    return Serving(chip, **{k: float(v) for k, v in base.items() if k in _SERVING_FIELDS})


def fit_sheet(sheet: PriceSheet, **kwargs) -> PriceFit:
    """``fit_prices`` of one published sheet under its serving convention and anchors."""
    prior = dict(sheet.prior)
    prior.update(kwargs.pop("prior", {}) or {})
    return fit_prices(sheet.prices, serving_for(sheet), prior=prior, **kwargs)
