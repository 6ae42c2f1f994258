"""Scaling laws: the loss of a model of ``N`` parameters trained on ``D`` tokens, and the
compute-optimal split of a FLOP budget between them.

.. math:: L(N, D) = E + \\frac{A}{N^\\alpha} + \\frac{B}{D^\\beta}

with the fits of ``presets/scaling_fits.toml`` (Hoffmann et al. 2022, approach 3; Besiroglu et al.
2024, its replication). Training costs ``C = 6 N D`` FLOP (Kaplan et al. 2020, section 2.1). A
routed (Mixture-of-Experts) model enters through an effective parameter count
(``effective_params``).
"""

from __future__ import annotations

import functools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost._toml import read_toml
from dcost._types import FloatLeaf
from dcost.presets import PresetError
from dcost.specs import Model, _concrete, _float, check

__all__ = [
    "ScalingFit",
    "Plan",
    "Allocation",
    "scaling_fit",
    "scaling_fit_names",
    "scaling_fit_card",
    "as_fit",
    "loss",
    "effective_params",
    "routed_fit",
    "compute_optimal",
    "overtrain",
    "TOKENS_PER_PARAM",
    "GAMMA",
]

TOKENS_PER_PARAM = 20.0
"""The Chinchilla reference of tokens per parameter; over-training ``r = D / (20 N)``."""

GAMMA = 1.0 / 3.0
"""Default exponent of ``effective_params``: 64x the active parameters in total buy about 4x."""

_FIELDS = ("E", "A", "B", "alpha", "beta")


class ScalingFit(eqx.Module):
    """A parametric loss fit ``L(N, D) = E + A/N**alpha + B/D**beta`` (a pytree of float leaves).

    Attributes:
      E: irreducible loss (nats per token), >= 0.
      A: parameter-term coefficient, > 0.
      B: data-term coefficient, > 0.
      alpha: parameter exponent, > 0.
      beta: data exponent, > 0.

    >>> import dcost
    >>> f = dcost.ScalingFit(1.69, 406.4, 410.7, 0.34, 0.28)
    >>> round(float(dcost.loss(70e9, 1.4e12, f)), 3)  # Chinchilla itself
    1.937
    """

    E: FloatLeaf = eqx.field(converter=_float)
    A: FloatLeaf = eqx.field(converter=_float)
    B: FloatLeaf = eqx.field(converter=_float)
    alpha: FloatLeaf = eqx.field(converter=_float)
    beta: FloatLeaf = eqx.field(converter=_float)

    def __check_init__(self):
        check("ScalingFit", "E", self.E)
        for name in ("A", "B", "alpha", "beta"):
            check("ScalingFit", name, getattr(self, name), low_open=True)


@functools.cache
def _fits() -> dict:
    return read_toml("dcost.presets", "scaling_fits.toml")


def scaling_fit_names() -> list[str]:
    """Names of the published fits in ``presets/scaling_fits.toml``."""
    return sorted(_fits())


def scaling_fit_card(name: str) -> dict:
    """The raw entry (numbers, source, note) of fit ``name``; unknown names list the known ones."""
    table = _fits()
    if name not in table:
        raise PresetError(f"unknown scaling fit {name!r}; known: {', '.join(sorted(table))}")
    return table[name]


def scaling_fit(name: str) -> ScalingFit:
    """The published fit ``name`` ("hoffmann2022" or "besiroglu2024") as a ``ScalingFit``.

    >>> import dcost
    >>> round(float(dcost.scaling_fit("besiroglu2024").beta), 4)
    0.3658
    """
    card = scaling_fit_card(name)
    return ScalingFit(*(float(card[k]) for k in _FIELDS))


def as_fit(fit) -> ScalingFit:
    """A ``ScalingFit`` from a fit or its name; anything else raises ``ValueError``."""
    if isinstance(fit, ScalingFit):
        return fit
    if isinstance(fit, str):
        return scaling_fit(fit)
    raise ValueError(
        f"fit = {fit!r} is not allowed: it must be a ScalingFit or one of "
        f"{', '.join(scaling_fit_names())}"
    )


def effective_params(n_active, n_total, gamma=GAMMA):
    """Dense-equivalent parameter count of a routed model (an assumption, replaceable).

    .. math:: N_{eff} = N_{active} \\left(\\frac{N_{total}}{N_{active}}\\right)^{\\gamma}

    The loss of a Mixture-of-Experts model is taken to be that of a dense model of ``N_eff``
    parameters trained on the same tokens. ``gamma = 1/3`` means 64x more total than active
    parameters buy about 4x effective ones; ``gamma = 0`` prices only the active parameters,
    ``gamma = 1`` all of them. This is a modelling assumption in the spirit of the routed-model
    laws of Clark et al. 2022 ("Unified Scaling Laws for Routed Language Models", whose
    improvement from routing shrinks with size) and Krajewski et al. 2024 ("Scaling Laws for
    Fine-Grained Mixture of Experts"); neither paper states this exact form. Pass your own
    ``n_params`` to ``loss`` to use another.

    Args:
      n_active: parameters a token uses ``N_active``.
      n_total: all parameters ``N_total >= N_active``.
      gamma: exponent in [0, 1].

    Returns:
      ``N_eff`` (parameters).

    >>> import dcost
    >>> float(dcost.effective_params(1e9, 64e9))
    4000000000.0
    """
    check("effective_params", "n_active", n_active, low_open=True)
    check("effective_params", "gamma", gamma, high=1.0)
    a = _concrete(n_active)
    t = _concrete(n_total)
    if a is not None and t is not None and np.any(t < a):
        raise ValueError(
            f"effective_params.n_total = {float(np.min(t))!r} is not allowed: "
            "it must be >= n_active"
        )
    n_active = jnp.asarray(n_active, dtype=jnp.result_type(float))
    return n_active * jnp.exp(gamma * jnp.log(n_total / n_active))


def routed_fit(fit, sparsity, gamma=GAMMA) -> ScalingFit:
    """The fit in terms of ``N_active`` for a routed model of sparsity ``S = N_total/N_active``.

    Since ``N_eff = N_active S**gamma``,
    ``A/N_eff**alpha = (A S**(-alpha gamma)) / N_active**alpha``: the routed fit has
    ``A' = A S**(-alpha*gamma)`` and everything else unchanged, so every function taking a fit
    (``compute_optimal``, ``lifetime_optimum``) then speaks of active parameters.

    >>> import dcost
    >>> f = dcost.routed_fit("hoffmann2022", 8.0)
    >>> round(float(f.A / dcost.scaling_fit("hoffmann2022").A), 3)  # 8**(-0.34/3)
    0.79
    """
    fit = as_fit(fit)
    check("routed_fit", "sparsity", sparsity, low=1.0)
    return eqx.tree_at(lambda f: f.A, fit, fit.A * jnp.asarray(sparsity) ** (-fit.alpha * gamma))


def _params(n_params):
    """Parameter count for the loss: a number, or a ``Model`` through ``effective_params``."""
    if isinstance(n_params, Model):
        return effective_params(n_params.params_active, n_params.params_total)
    return n_params


def loss(n_params, n_tokens, fit="hoffmann2022"):
    """Pretraining loss of a model of ``N`` parameters trained on ``D`` tokens.

    .. math:: L(N, D) = E + A N^{-\\alpha} + B D^{-\\beta}

    Args:
      n_params: parameters ``N``, or a ``dcost.Model`` (a routed one counts as
        ``effective_params(N_active, N_total)``).
      n_tokens: training tokens ``D``.
      fit: a ``ScalingFit`` or the name of a published one.

    Returns:
      Loss (nats per token, on the fit's corpus).

    >>> import dcost
    >>> round(float(dcost.loss(70e9, 1.4e12, "besiroglu2024")), 3)
    1.974

    Reference: Hoffmann et al. 2022, arXiv:2203.15556, section 3.3.
    """
    fit = as_fit(fit)
    n = _params(n_params)
    check("loss", "n_params", n, low_open=True)
    check("loss", "n_tokens", n_tokens, low_open=True)
    n = jnp.asarray(n, dtype=jnp.result_type(float))
    d = jnp.asarray(n_tokens, dtype=jnp.result_type(float))
    return fit.E + fit.A * n ** (-fit.alpha) + fit.B * d ** (-fit.beta)


def overtrain(n_params, n_tokens):
    """Over-training ratio ``r = D / (20 N)``: 1 at the Chinchilla rule of thumb."""
    return n_tokens / (TOKENS_PER_PARAM * n_params)


class Plan(eqx.Module):
    """Base of results that are a training plan: unpacks as the pair ``(n_params, n_tokens)``.

    ``n, d = dcost.compute_optimal(c)`` reads as the public API's tuple; the other fields are
    attributes. A pytree like every dcost result (batched inputs give array fields).
    """

    n_params: jax.Array
    n_tokens: jax.Array

    def __iter__(self):
        return iter((self.n_params, self.n_tokens))

    def __len__(self):
        return 2

    def __getitem__(self, i):
        return (self.n_params, self.n_tokens)[i]


class Allocation(Plan):
    """Parameters and tokens of a training plan; unpacks as ``(n_params, n_tokens)``.

    Attributes:
      n_params: parameters ``N`` (active parameters for a routed fit).
      n_tokens: training tokens ``D``.
      overtrain: ``r = D / (20 N)``.
    """

    overtrain: jax.Array


def compute_optimal(flops, fit="hoffmann2022") -> Allocation:
    """The loss-minimizing ``(N, D)`` for a training budget ``C = 6 N D`` FLOP.

    .. math::
        N_{opt} = G \\left(\\frac{C}{6}\\right)^{\\beta/(\\alpha+\\beta)}, \\quad
        G = \\left(\\frac{\\alpha A}{\\beta B}\\right)^{1/(\\alpha+\\beta)}, \\quad
        D_{opt} = \\frac{C}{6 N_{opt}}

    (set ``d L / d N = 0`` along ``D = C/(6N)``: ``alpha A / N**alpha = beta B / D**beta``).

    Args:
      flops: training budget ``C`` (FLOP).
      fit: a ``ScalingFit`` or the name of a published one.

    Returns:
      ``Allocation(n_params, n_tokens, overtrain)``, which unpacks as ``(n_params, n_tokens)``.

    >>> import dcost
    >>> n, d = dcost.compute_optimal(5.76e23, "besiroglu2024")  # Chinchilla's budget
    >>> round(float(n) / 1e9), round(float(d / n), 1)  # Chinchilla was 70B on 1.4T tokens
    (72, 18.4)

    Reference: Hoffmann et al. 2022, arXiv:2203.15556, section 3.3 (approach 3).
    """
    fit = as_fit(fit)
    check("compute_optimal", "flops", flops, low_open=True)
    c6 = jnp.asarray(flops, dtype=jnp.result_type(float)) / 6.0
    s = fit.alpha + fit.beta
    log_g = (jnp.log(fit.alpha * fit.A) - jnp.log(fit.beta * fit.B)) / s
    n = jnp.exp(log_g + fit.beta / s * jnp.log(c6))
    d = c6 / n
    return Allocation(n, d, overtrain(n, d))
