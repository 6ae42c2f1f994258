"""Fitting hidden quantities to prices: MAP in log space, and what the prices pin down."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from dcost.pricing.model import (
    DEFAULT_PRIOR,
    DEFAULT_SIGMA,
    KINDS,
    PARAMS,
    Serving,
    _log_prices,
)
from dcost.specs import check

__all__ = ["PriceFit", "Identifiability", "fit_log_prices", "fit_prices", "identifiability"]


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
    return 0.5 * jnp.sum(r**2) + 0.5 * jnp.sum(z**2)


def fit_log_prices(
    log_prices, mask, serving: Serving, sigma, prior_mean, prior_sd, steps=4000, learning_rate=0.1
):
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
    return _fit(
        log_prices, mask, serving, sigma, prior_mean, prior_sd, int(steps), float(learning_rate)
    )


@functools.partial(jax.jit, static_argnums=(6, 7))
def _fit(log_prices, mask, serving, sigma, prior_mean, prior_sd, steps, learning_rate):
    dtype = jnp.result_type(float)
    log_y, mask, sigma, mu, w = (
        jnp.asarray(x, dtype) for x in (log_prices, mask, sigma, prior_mean, prior_sd)
    )
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
    loss_fn = functools.partial(
        _loss, log_y=log_y, mask=mask, sigma=sigma, mu=mu, w=w, serving=serving
    )
    hess = jax.hessian(loss_fn)(theta)
    jac = jax.jacfwd(_log_prices)(theta, serving)
    info = jac.T @ ((mask / sigma**2)[:, None] * jac)
    resid = mask * (log_y - _log_prices(theta, serving))
    grad_norm = jnp.linalg.norm(jax.grad(f)(z))
    return PriceFit(theta, jnp.linalg.inv(hess), info, w, resid, mask, loss_fn(theta), grad_norm)


def _vector(mapping, order, default, what):
    unknown = [k for k in mapping if k not in order]
    if unknown:
        raise ValueError(f"unknown {what} {unknown}; known: {list(order)}")
    return [
        mapping.get(k, default.get(k) if isinstance(default, Mapping) else default) for k in order
    ]


def fit_prices(
    prices: Mapping[str, float], serving: Serving, *, prior=None, sigma=None, steps=4000
) -> PriceFit:
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
    return fit_log_prices(
        jnp.asarray(log_y),
        jnp.asarray(mask),
        serving,
        jnp.asarray(sig),
        jnp.asarray(mu),
        jnp.asarray(w),
        steps=steps,
    )


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
        lines.append(
            f"price information condition number: {self.condition:.3g}"
            + (" (singular)" if self.singular else "")
        )
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
    share = 1.0 - np.diagonal(np.asarray(fit.log_cov, dtype=float)) / w**2
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
    return Identifiability(
        status,
        {k: float(share[i]) for i, k in enumerate(PARAMS)},
        lam,
        vec.T,
        unpinned,
        singular,
        condition,
    )
