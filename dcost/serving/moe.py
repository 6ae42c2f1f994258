"""Mixture-of-Experts pieces: how many experts a batch touches, and the all-to-all it costs.

References: the expected number of distinct experts hit by ``B`` tokens routed uniformly to ``k``
of ``E`` experts is the classical occupancy result ``E*(1 - (1 - k/E)**B)``; expert-parallel
all-to-all as in GShard (Lepikhin et al., 2020, section 2) and DeepSeek-V3 (2024, section 3.4).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from dcost.smooth import safe_div, smax
from dcost.specs import SpecError, _concrete, _float, check

__all__ = ["expert_fraction", "all_to_all_time", "tensor_parallel_time", "comm_time"]


def expert_fraction(batch, n_experts, experts_active):
    """Expected fraction of routed experts a batch of ``B`` tokens touches.

    .. math:: \\phi(B) = 1 - (1 - k/E)^B

    computed as ``-expm1(B*log1p(-k/E))`` for precision at small ``k/E``; 0 for a dense model
    (``E = 0``) and 1 when ``k = E``.

    Args:
      batch: tokens in the step ``B`` (>= 0; may be fractional in the relaxation).
      n_experts: routed experts ``E`` (>= 0).
      experts_active: experts per token ``k`` (``0 <= k <= E``).

    Concrete arguments are checked (SpecError naming the argument); traced ones are not.

    >>> round(float(expert_fraction(1.0, 256.0, 8.0)), 6)  # one token touches k/E
    0.03125
    >>> float(expert_fraction(1.0, 0.0, 0.0))
    0.0
    """
    check("expert_fraction", "batch", batch)
    check("expert_fraction", "n_experts", n_experts)
    check("expert_fraction", "experts_active", experts_active)
    e, k = _concrete(n_experts), _concrete(experts_active)
    if e is not None and k is not None and np.any(np.broadcast_arrays(k, e)[0] > e):
        raise SpecError(
            f"expert_fraction.experts_active = {float(np.max(k))!r} is not allowed: it must be "
            f"<= n_experts ({float(np.min(e))!r})"
        )
    return _expert_fraction(*(_float(x) for x in (batch, n_experts, experts_active)))


def _expert_fraction(batch, n_experts, experts_active):
    """``expert_fraction`` without the checks (its callers' specs were checked)."""
    ratio = safe_div(experts_active, n_experts)  # k/E, 0 for dense
    below = ratio < 1
    logq = jnp.log1p(-jnp.where(below, ratio, 0.0))
    phi = jnp.where(below, -jnp.expm1(batch * logq), 1.0)
    return jnp.where(n_experts > 0, phi, 0.0)


def all_to_all_time(tokens, moe_layers_per_stage, chips, hardware, model, smoothness=0.0):
    """Expert-parallel all-to-all time of one stage step (seconds).

    Each token goes to ``k`` experts and back: ``2*k*d*b_a`` bytes per MoE layer. A destination is
    on another chip with probability ``(G-1)/G``, and the traffic spreads over the ``G`` chips:

    .. math::
        \\text{bytes}_{chip} = \\text{tokens} \\cdot L_{moe}/P \\cdot 2kdb_a
                               \\cdot \\frac{G-1}{G}/G

        \\text{inside} = \\frac{\\min(G,S) - 1}{G - 1}

        t = \\max(\\text{bytes}\\cdot\\text{inside}/U,\\ \\text{bytes}(1-\\text{inside})/O)

    Both link kinds run at once; 0 when ``G = 1``.
    """
    g = chips
    per_token = 2.0 * model.experts_active * model.d_model * model.act_bytes
    bytes_chip = tokens * moe_layers_per_stage * per_token * safe_div(g - 1.0, g * g)
    inside = safe_div(jnp.minimum(g, hardware.scaleup_size) - 1.0, g - 1.0, default=1.0)
    return smax(
        [
            bytes_chip * inside / hardware.scaleup_bandwidth,
            bytes_chip * (1.0 - inside) / hardware.scaleout_bandwidth,
        ],
        smoothness,
    )


def tensor_parallel_time(tokens, layers_per_stage, chips, hardware, model):
    """Tensor-parallel time of one stage step for a dense model (seconds).

    Two ring all-reduces of ``tokens*d*b_a`` bytes per layer, each moving ``2(G-1)/G`` of it per
    chip, over scale-up links when the ``G`` chips fit in one domain, else scale-out:

    .. math:: t = \\frac{L}{P}\\cdot 2 \\cdot \\frac{2(G-1)}{G}\\cdot
                  \\frac{\\text{tokens}\\cdot d\\, b_a}{U \\text{ or } O}

    Reference: ring all-reduce cost, Patarasuk & Yuan (2009); Megatron-LM (Shoeybi et al., 2019)
    for two all-reduces per layer.
    """
    g = chips
    link = jnp.where(
        g <= hardware.scaleup_size, hardware.scaleup_bandwidth, hardware.scaleout_bandwidth
    )
    volume = tokens * model.d_model * model.act_bytes
    return layers_per_stage * 2.0 * (2.0 * (g - 1.0) / g) * volume / link


def comm_time(tokens, stages, chips, hardware, model, smoothness=0.0):
    """Communication time of one stage step: all-to-all for MoE, tensor parallel for dense."""
    moe = all_to_all_time(tokens, model.moe_layers / stages, chips, hardware, model, smoothness)
    dense = tensor_parallel_time(tokens, model.n_layers / stages, chips, hardware, model)
    return jnp.where(model.n_experts > 0, moe, dense)
