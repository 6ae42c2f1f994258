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

from dcost.pricing.fit import (
    Identifiability,
    PriceFit,
    fit_log_prices,
    fit_prices,
    identifiability,
)
from dcost.pricing.model import (
    DEFAULT_PRIOR,
    DEFAULT_SIGMA,
    KINDS,
    PARAMS,
    PLANTED,
    Serving,
    predict_prices,
)
from dcost.pricing.sheets import PriceSheet, fit_sheet, price_sheets, serving_for

__all__ = [
    "KINDS",
    "PARAMS",
    "Serving",
    "PriceFit",
    "Identifiability",
    "PriceSheet",
    "predict_prices",
    "fit_prices",
    "fit_log_prices",
    "identifiability",
    "price_sheets",
    "serving_for",
    "fit_sheet",
    "DEFAULT_PRIOR",
    "DEFAULT_SIGMA",
    "PLANTED",
]
