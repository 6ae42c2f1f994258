"""The observation model of pricing: the hidden quantities, the serving convention, and the
prices the serving model predicts from them (``price = margin x cost``)."""

from __future__ import annotations

from collections.abc import Mapping

import equinox as eqx
import jax
import jax.numpy as jnp

from dcost._types import FloatLeaf
from dcost.serving.roofline import SECONDS_PER_HOUR, decode, prefill
from dcost.specs import Design, Hardware, Model, Workload, _float, check

__all__ = [
    "KINDS",
    "PARAMS",
    "PLANTED",
    "DEFAULT_PRIOR",
    "DEFAULT_SIGMA",
    "PER_MILLION",
    "Serving",
    "predict_prices",
]

# Hidden values planted in prices the model itself generates, to show that ``fit_prices`` recovers
# them: a Llama-3-70B-like dense model, a small GQA model and a DeepSeek-V3-like MLA model.
PLANTED = {
    "dense-70b": {
        "kv_bytes_per_token": 327680.0,
        "params_active": 70e9,
        "flops_per_byte": 295.0,
        "margin": 5.0,
    },
    "small-gqa": {
        "kv_bytes_per_token": 65536.0,
        "params_active": 8e9,
        "flops_per_byte": 160.0,
        "margin": 2.5,
    },
    "big-mla": {
        "kv_bytes_per_token": 70272.0,
        "params_active": 37e9,
        "flops_per_byte": 600.0,
        "margin": 9.0,
    },
}

KINDS = (
    "input",
    "output",
    "input_long",
    "output_long",
    "cache_write",
    "cache_hit",
    "cache_storage",
)
"""Price kinds, in the order of every price vector. SI: $ per token; ``cache_storage`` is $ per
token-second."""

PARAMS = ("kv_bytes_per_token", "params_active", "flops_per_byte", "margin")
"""Hidden quantities, in the order of every parameter vector (bytes, parameters, FLOP/byte, 1)."""

DEFAULT_SIGMA = {
    "input": 0.1,
    "output": 0.1,
    "input_long": 0.1,
    "output_long": 0.1,
    "cache_write": 0.3,
    "cache_hit": 0.3,
    "cache_storage": 0.3,
}
"""Standard deviation of the log-price residual of each kind."""

DEFAULT_PRIOR = {
    "kv_bytes_per_token": (1e5, 10.0),
    "params_active": (1e11, 10.0),
    "flops_per_byte": (300.0, 10.0),
    "margin": (3.0, 10.0),
}
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
    chips: FloatLeaf = eqx.field(default=8.0, converter=_float)
    batch: FloatLeaf = eqx.field(default=64.0, converter=_float)
    context: FloatLeaf = eqx.field(default=16384.0, converter=_float)
    context_long: FloatLeaf = eqx.field(default=400_000.0, converter=_float)
    bytes_per_param: FloatLeaf = eqx.field(default=2.0, converter=_float)
    sparsity: FloatLeaf = eqx.field(default=1.0, converter=_float)
    attn_flops_per_kv_byte: FloatLeaf = eqx.field(default=8.0, converter=_float)
    cache_hold_s: FloatLeaf = eqx.field(default=300.0, converter=_float)
    smoothness: FloatLeaf = eqx.field(default=0.02, converter=_float)

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
    replica = Hardware(
        flops=r * bw,
        hbm_bandwidth=bw,
        hbm_capacity=g * h.hbm_capacity,
        scaleup_bandwidth=h.scaleup_bandwidth,
        scaleout_bandwidth=h.scaleout_bandwidth,
        scaleup_size=1.0,
        price_per_hour=g * h.price_per_hour,
    )
    model = Model(
        n_layers=1.0,
        d_model=1.0,
        params_dense=n,
        params_per_expert=0.0,
        n_experts=0.0,
        experts_active=0.0,
        kv_bytes_per_token=b_kv,
        bytes_per_param=serving.bytes_per_param * serving.sparsity,
        attn_flops_per_context_token=serving.attn_flops_per_kv_byte * b_kv,
    )
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
    costs = jnp.stack(
        [c_in, c_out, c_in_long, c_out_long, c_in + tau * storage, tau * storage + read, storage]
    )
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
