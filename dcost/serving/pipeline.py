"""Pipeline parallelism: the hop between stages and how stage times add up to a token's latency.

With ``P`` stages each holding ``L/P`` layers, a token crosses all of them in turn, so the time per
output token is ``P*t_stage + (P-1)*t_hop``; ``P`` micro-batches are in flight, so throughput is
``P*B`` tokens per ``tpot``. Reference: GPipe (Huang et al., 2019); for training bubbles see
``dcost.training``.
"""

from __future__ import annotations

import jax.numpy as jnp

__all__ = ["hop_time", "pipeline_latency"]


def hop_time(tokens, chips, stages, hardware, model, passes=1.0):
    """Time to send one micro-batch's activations to the next stage (seconds).

    .. math:: t_{hop} = n_p \\alpha + \\frac{\\text{tokens}\\cdot d b_a}{G\\,\\text{link}'}

    ``link'`` is the achieved scale-up bandwidth when all ``P*G`` chips fit in one domain, else
    the achieved scale-out bandwidth, and ``alpha`` that link's latency, paid once per pass
    ``n_p`` (each chip sends its share in one message). v1 at ``alpha = 0`` and efficiency 1.
    """
    fits = chips * stages <= hardware.scaleup_size
    link = jnp.where(fits, hardware.scaleup_achieved, hardware.scaleout_achieved)
    alpha = jnp.where(fits, hardware.get("scaleup_latency"), hardware.get("scaleout_latency"))
    return passes * alpha + tokens * model.d_model * model.act_bytes / (chips * link)


def pipeline_latency(t_stage, t_hop, stages):
    """``P*t_stage + (P-1)*t_hop``: one token's trip through every stage (seconds)."""
    return stages * t_stage + (stages - 1.0) * t_hop
