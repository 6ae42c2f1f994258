"""Speculative decoding and multi-token prediction: accepted tokens per step and the draft's cost.

A step drafts ``k`` tokens per sequence (``Design.draft_tokens``) with a cheap draft (a small
model, or DeepSeek-V3's multi-token-prediction module), then the target verifies them in one pass
of ``k + 1`` tokens per sequence. Each draft token is accepted with probability ``a``
(``Workload.acceptance``) independently, and the first rejection ends the run, so the accepted
length per step (the target's own token included) is

.. math:: \\tau(a, k) = \\sum_{i=0}^{k} a^i = \\frac{1 - a^{k+1}}{1 - a}

(Leviathan, Kalman & Matias, "Fast Inference from Transformers via Speculative Decoding", ICML
2023, equation 1; Chen et al., "Accelerating Large Language Model Decoding with Speculative
Sampling", 2023). The verify pass reads the weights and the KV cache once for ``k + 1`` tokens
per sequence: KV and weight reads per emitted token fall by ``tau``, compute per emitted token
rises by ``(k+1)/tau``.
"""

from __future__ import annotations

import jax.numpy as jnp

from dcost.serving.kernels import kernel_time
from dcost.serving.moe import _expert_fraction
from dcost.smooth import smax
from dcost.specs import _float, check

__all__ = ["accepted_tokens", "draft_time"]


def accepted_tokens(acceptance, draft_tokens):
    """Expected tokens a sequence advances per verify step, ``(1 - a**(k+1)) / (1 - a)``.

    ``k + 1`` at ``a = 1``; 1 at ``a = 0`` or ``k = 0`` (plain decoding). Gradient-safe in both
    arguments at ``a = 0`` and ``a = 1`` (``k`` may be fractional in the relaxation).

    >>> float(accepted_tokens(0.0, 3.0)), float(accepted_tokens(1.0, 3.0))
    (1.0, 4.0)
    >>> round(float(accepted_tokens(0.8, 1.0)), 6)  # 1 + 0.8
    1.8
    >>> round(float(accepted_tokens(0.5, 3.0)), 6)  # 1 + 1/2 + 1/4 + 1/8
    1.875

    Concrete arguments are checked (SpecError naming the argument: ``0 <= a <= 1``, ``k >= 0``);
    traced ones are not.
    """
    check("accepted_tokens", "acceptance", acceptance, high=1.0)
    check("accepted_tokens", "draft_tokens", draft_tokens)
    return _accepted_tokens(_float(acceptance), _float(draft_tokens))


def _accepted_tokens(acceptance, draft_tokens):
    """``accepted_tokens`` without the checks (its callers' specs were checked)."""
    a = jnp.asarray(acceptance, dtype=jnp.result_type(acceptance, draft_tokens, float))
    inside = (a > 0) & (a < 1)
    a_safe = jnp.where(inside, a, 0.5)
    power = jnp.exp((draft_tokens + 1.0) * jnp.log(a_safe))  # a**(k+1) away from the edges
    tau = (1.0 - power) / (1.0 - a_safe)
    return jnp.where(inside, tau, jnp.where(a >= 1, draft_tokens + 1.0, 1.0))


def draft_time(sequences, context, draft_tokens, chips, hardware, model, smoothness=0.0, comm=None):
    """Time of the ``k`` sequential draft passes of one step on a stage's ``G`` chips (s).

    One pass advances every sequence by one draft token. With ``N_d`` the draft's parameters
    per token, ``N_d,tot`` those it holds (the part beyond ``N_d`` being routed experts touched
    with the model's ``E, k``: an MTP module is one MoE layer), ``L_d`` its layers, ``a L_d/L``
    its attention FLOPs per context token (the target's attention per layer) and ``b_kv,d`` its
    KV bytes per token:

    .. math::
        t_c = B(2N_d + aTL_d/L) / (G F \\eta_F), \\quad
        t_m = \\frac{b_w(N_d + (N_{d,tot} - N_d)\\phi(B)) + B T b_{kv,d}}{G\\,BW\\eta_{BW}}

        t_{pass} = \\max(t_c, t_m, t_x)
            + s\\,\\big(\\max(t_c, t_m) + t_x - \\max(t_c, t_m, t_x)\\big)

        t_{draft} = k\\,\\big(t_{pass} + L_d\\,(\\text{layer\\_overhead}
            + g\\,\\text{gemm\\_overhead})\\big)

    (smooth max when ``smoothness > 0``; ``g = Model.gemms_per_layer``, a target layer's GEMM
    kernels), with ``t_x = comm`` the collectives of one pass
    (``roofline._draft_comm``: one target layer's per draft layer; None: none) and ``s =
    Hardware.kernel_serialization`` weighing them as the target's step does: hidden behind the
    pass's reads in pure physics (``s = 0``), after them when its kernels run in series. 0 when
    ``k = 0``.

    >>> import dcost
    >>> h = dcost.Hardware(1e15, 1e12, 1e11, 1e11, 1e10, 8, 3.6)
    >>> m = dcost.Model(10, 1000, 1e9, 0.0, 0, 0, 1e5, 2.0, draft_params=1e8)
    >>> # 2 passes of a 1e8-parameter bf16 draft at batch 1: 2 * 2e8 B / 1e12 B/s = 0.4 ms
    >>> round(float(draft_time(1.0, 0.0, 2.0, 1.0, h, m)) * 1e3, 6)
    0.4
    """
    b, t = sequences, context
    phi = _expert_fraction(b, model.n_experts, model.experts_active)
    a_draft = model.attn_flops_per_context_token * model.draft_layers / model.n_layers
    t_c = b * (2.0 * model.draft_params + a_draft * t) / (chips * hardware.flops_achieved)
    held = model.draft_total - model.draft_params
    read = model.bytes_per_param * (model.draft_params + held * phi)
    t_m = (read + b * t * model.draft_kv_bytes_per_token) / (chips * hardware.bandwidth_achieved)
    per_pass = kernel_time(t_c, t_m, hardware, smoothness)
    if comm is not None:  # None: no collectives (one chip's draft, or a caller without them)
        overlapped = smax([t_c, t_m, comm], smoothness)
        serial = per_pass + comm
        per_pass = overlapped + hardware.get("kernel_serialization") * (serial - overlapped)
    # each draft layer's fixed cost: a target layer's (its kernels, ``gemms_per_layer`` GEMMs)
    per_layer = (
        hardware.get("layer_overhead") + hardware.get("gemm_overhead") * model.gemms_per_layer
    )
    return draft_tokens * (per_pass + model.draft_layers * per_layer)
