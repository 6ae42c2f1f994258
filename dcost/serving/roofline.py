"""The serving cost model: the roofline of one decode (or prefill) step, and its closed forms.

A step takes the larger of its compute time and its memory time (weights + KV cache), and of its
communication time; batch size decides how far weight reads are amortized. ``smoothness = 0`` is
the exact hard max; ``smoothness > 0`` the p-norm smooth max of ``dcost.smooth.smax`` from the same
code. References: Williams, Waterman & Patterson, "Roofline" (CACM 2009); Pope et al., "Efficiently
Scaling Transformer Inference" (2022); the JAX scaling book, "All about Transformer inference".
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp

from dcost.serving.moe import comm_time, expert_fraction
from dcost.serving.pipeline import hop_time, pipeline_latency
from dcost.smooth import smax
from dcost.specs import Design, Hardware, Model, Workload, check, with_experts

__all__ = [
    "Report",
    "PrefillReport",
    "decode",
    "prefill",
    "balance_batch",
    "critical_context",
    "bottleneck",
    "SECONDS_PER_HOUR",
    "TERMS",
]

SECONDS_PER_HOUR = 3600.0
TERMS = ("compute", "memory", "comm")


class Report(eqx.Module):
    """What one decode step costs (SI units). A pytree: batched designs give array fields.

    Attributes:
      t_compute: compute time of one stage step ``t_compute`` (s).
      t_weights: weight-read time of one stage step (s).
      t_kv: KV-cache read time of one stage step (s).
      t_comm: all-to-all or tensor-parallel time of one stage step (s).
      t_hop: activation hop to the next stage (s).
      t_stage: ``max(t_compute, t_weights + t_kv, t_comm)`` (smooth when smoothness > 0) (s).
      tpot: time per output token (s).
      tokens_per_s: output tokens per second of one replica.
      cost_per_token: $ per output token.
      memory_per_chip: HBM bytes per chip (weights + KV).
      mfu: model FLOP utilization ``2*N_active*tokens_per_s / (P*G*F)``.
    """

    t_compute: jax.Array
    t_weights: jax.Array
    t_kv: jax.Array
    t_comm: jax.Array
    t_hop: jax.Array
    t_stage: jax.Array
    tpot: jax.Array
    tokens_per_s: jax.Array
    cost_per_token: jax.Array
    memory_per_chip: jax.Array
    mfu: jax.Array


class PrefillReport(eqx.Module):
    """What one prefill step costs (SI units): the fields of ``Report``, per *input* token, with
    the time of the pass as ``ttft``. A pytree: batched designs give array fields.

    Attributes:
      t_compute, t_weights, t_comm, t_hop, t_stage: as in ``Report`` (s).
      t_kv: KV-cache write time of one stage step (s).
      ttft: time of the whole prefill pass, i.e. time to first token (s).
      tokens_per_s: input (prompt) tokens per second of one replica.
      cost_per_token: $ per input token.
      memory_per_chip: HBM bytes per chip (weights + the prompts' KV).
      mfu: model FLOP utilization ``2*N_active*tokens_per_s / (P*G*F)``.
    """

    t_compute: jax.Array
    t_weights: jax.Array
    t_kv: jax.Array
    t_comm: jax.Array
    t_hop: jax.Array
    t_stage: jax.Array
    ttft: jax.Array
    tokens_per_s: jax.Array
    cost_per_token: jax.Array
    memory_per_chip: jax.Array
    mfu: jax.Array


def _step(
    batch_tokens,
    flops_per_token,
    weight_params,
    kv_bytes,
    design,
    hardware,
    model,
    kv_resident_tokens,
    smoothness,
):
    """Shared body of decode and prefill for one stage step."""
    p, g = design.stages, design.chips
    chips = p * g
    f = hardware.flops_achieved
    bw = hardware.bandwidth_achieved
    t_compute = batch_tokens * flops_per_token / (chips * f)
    t_weights = model.bytes_per_param * weight_params / (chips * bw)
    t_kv = kv_bytes / (chips * bw)
    t_comm = comm_time(batch_tokens, p, g, hardware, model, smoothness)
    t_stage = smax([t_compute, t_weights + t_kv, t_comm], smoothness)
    t_hop = hop_time(batch_tokens, g, p, hardware, model)
    tpot = pipeline_latency(t_stage, t_hop, p)
    tokens_per_s = p * batch_tokens / tpot
    cost = chips * hardware.price_per_hour / SECONDS_PER_HOUR / tokens_per_s
    memory = (
        model.bytes_per_param * model.params_total / chips
        + kv_resident_tokens * model.kv_bytes_per_token / g
    )
    mfu = 2.0 * model.params_active * tokens_per_s / (chips * hardware.flops)
    return Report(
        t_compute, t_weights, t_kv, t_comm, t_hop, t_stage, tpot, tokens_per_s, cost, memory, mfu
    )


def decode(
    design: Design, hardware: Hardware, model: Model, workload: Workload, smoothness=0.0
) -> Report:
    """One decode step: ``B`` sequences each produce one token.

    .. math::
        \\phi(B) = 1 - (1 - k/E)^B

        t_{compute} = B(2N_{active} + aT) / (PGF\\eta_F)

        t_{weights} = b_w(N_{dense} + E n_e \\phi(B)) / (PG\\,BW\\eta_{BW})

        t_{kv} = B T b_{kv} / (PG\\,BW\\eta_{BW})

        t_{stage} = \\max(t_{compute}, t_{weights} + t_{kv}, t_{comm})

        tpot = P t_{stage} + (P-1) t_{hop}, \\quad
        \\text{cost} = PGp/3600 / (PB/tpot)

    Memory per chip is ``b_w N_total/(PG) + B T b_kv / G`` (KV per chip does not shrink with P).

    Args:
      design: batch ``B``, chips per stage ``G``, stages ``P``, experts ``E`` (None: the model's).
      hardware: the chip.
      model: the network.
      workload: ``context`` is the mean context ``T`` during decode (tokens).
      smoothness: 0 for the exact hard max, > 0 for the smooth p-norm max.

    Returns:
      A ``Report``; ``cost_per_token`` is $ per output token.

    >>> import dcost
    >>> h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    >>> r = dcost.decode(dcost.Design(batch=1, chips=8), h, m, dcost.Workload(0))
    >>> bool(r.t_weights > r.t_compute)  # batch 1 is weight-read bound
    True
    """
    model = with_experts(model, design)
    b, t = design.batch, workload.context
    phi = expert_fraction(b, model.n_experts, model.experts_active)
    weight_params = model.params_dense + model.n_experts * model.params_per_expert * phi
    flops_per_token = 2.0 * model.params_active + model.attn_flops_per_context_token * t
    kv_bytes = b * t * model.kv_bytes_per_token
    return _step(
        b,
        flops_per_token,
        weight_params,
        kv_bytes,
        design,
        hardware,
        model,
        kv_resident_tokens=b * t,
        smoothness=smoothness,
    )


def prefill(
    design: Design, hardware: Hardware, model: Model, workload: Workload, smoothness=0.0
) -> PrefillReport:
    """One prefill step: ``B`` sequences of ``T_in`` prompt tokens each.

    .. math::
        t_{compute} = B T_{in}(2N_{active} + a T_{in}/2) / (PGF\\eta_F)

        t_{weights} = b_w N_{total} / (PG\\,BW\\eta_{BW}) \\quad (\\phi = 1)

        t_{kv} = B T_{in} b_{kv} / (PG\\,BW\\eta_{BW}) \\quad \\text{(written)}

    with the same all-to-all per token as decode. Returns a ``PrefillReport``: ``ttft`` is the
    time of the whole pass (the time to first token), ``tokens_per_s`` counts input tokens and
    ``cost_per_token`` is $ per input token.

    >>> import dcost
    >>> h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    >>> r = dcost.prefill(dcost.Design(batch=1, chips=8), h, m, dcost.Workload(4096))
    >>> bool(r.t_compute > r.t_weights)  # a long prompt is compute bound
    True
    """
    check("Workload", "prompt", workload.prompt, low=1.0)  # a prefill needs a prompt
    model = with_experts(model, design)
    b, t_in = design.batch, workload.prompt
    tokens = b * t_in
    flops_per_token = 2.0 * model.params_active + model.attn_flops_per_context_token * t_in / 2.0
    kv_bytes = tokens * model.kv_bytes_per_token
    r = _step(
        tokens,
        flops_per_token,
        model.params_total,
        kv_bytes,
        design,
        hardware,
        model,
        kv_resident_tokens=tokens,
        smoothness=smoothness,
    )
    fields = {k: getattr(r, k) for k in Report.__dataclass_fields__ if k != "tpot"}
    return PrefillReport(ttft=r.tpot, **fields)


def bottleneck(report: Report | PrefillReport):
    """Name of the binding term of each step: "compute", "memory" or "comm" (a NumPy string array).

    >>> import dcost
    >>> h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-8b")
    >>> str(dcost.bottleneck(dcost.decode(dcost.Design(batch=1), h, m, dcost.Workload(0))))
    'memory'
    """
    import numpy as np

    terms = np.stack(
        [
            np.asarray(report.t_compute),
            np.asarray(report.t_weights) + np.asarray(report.t_kv),
            np.asarray(report.t_comm),
        ]
    )
    return np.asarray(TERMS)[np.argmax(terms, axis=0)]


def balance_batch(hardware: Hardware, model: Model, context=0.0):
    """Batch at which decode compute time equals weight + KV time (every expert read, ``phi = 1``).

    .. math:: B^* = \\frac{b_w N_{total} F}{(2N_{active} + aT)\\,BW - T b_{kv} F}

    ``inf`` when the denominator is <= 0 (KV reads outgrow compute: no batch is compute bound).
    At ``T = 0``: ``B* = (F/BW) (b_w/2) N_total/N_active``, about 300 x sparsity in bf16.

    Args:
      hardware: the chip (achievable F and BW are used).
      model: the network.
      context: mean context ``T`` (tokens).

    Returns:
      ``B*`` (sequences).

    >>> import dcost
    >>> round(float(dcost.balance_batch(dcost.hardware("h100-sxm"), dcost.model("llama-3-70b"))))
    295
    """
    f, bw = hardware.flops_achieved, hardware.bandwidth_achieved
    t = jnp.asarray(context, dtype=jnp.result_type(float))
    den = (
        2.0 * model.params_active + model.attn_flops_per_context_token * t
    ) * bw - t * model.kv_bytes_per_token * f
    num = model.bytes_per_param * model.params_total * f
    pos = den > 0
    return jnp.where(pos, num / jnp.where(pos, den, 1.0), jnp.inf)


def critical_context(hardware: Hardware, model: Model):
    """Context at which the KV-read slope equals the compute slope of decode (tokens).

    .. math:: T_c = \\frac{2 N_{active} BW}{b_{kv} F - a\\,BW}

    Beyond ``T_c`` a longer context costs more memory time than compute time per token, so no batch
    size makes decode compute bound. ``inf`` when ``b_kv F <= a BW``.

    >>> import dcost
    >>> tc = dcost.critical_context(dcost.hardware("h100-sxm"), dcost.model("llama-3-70b"))
    >>> 500 < float(tc) < 2000
    True
    """
    f, bw = hardware.flops_achieved, hardware.bandwidth_achieved
    den = model.kv_bytes_per_token * f - model.attn_flops_per_context_token * bw
    pos = den > 0
    return jnp.where(pos, 2.0 * model.params_active * bw / jnp.where(pos, den, 1.0), jnp.inf)
