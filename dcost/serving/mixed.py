"""Mixed steps (continuous batching with chunked prefill) and the KV transfer of disaggregation.

Continuous batching (Yu et al., "Orca", OSDI 2022) keeps ``B`` sequences decoding and admits new
ones as others finish; with chunked prefill (Agrawal et al., "Sarathi-Serve", OSDI 2024) each step
carries a chunk of prompt tokens beside the decode tokens, so a step's time, and the time per
output token, carries the prefill's interference. Disaggregated serving (Zhong et al.,
"DistServe", OSDI 2024; Patel et al., "Splitwise", ISCA 2024) runs prefill and decode on separate
pools instead, and pays for moving each prompt's KV cache between them.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from dcost.serving._jitted import check_types, checked, jitted, smoothness_argument
from dcost.serving.moe import _expert_fraction
from dcost.serving.roofline import Report, _assemble, _speculation
from dcost.smooth import safe_div, smax, smin
from dcost.specs import (
    Design,
    Hardware,
    Model,
    SpecError,
    Workload,
    _concrete,
    _float,
    _short,
    check,
    float_max,
    with_experts,
)

__all__ = ["mixed_step", "prefill_tokens_per_step", "kv_transfer_time"]


def prefill_tokens_per_step(design, workload, smoothness=0.0):
    """Prompt tokens a mixed step carries in steady state (tokens).

    ``B`` sequences in flight each finish after ``T_out`` tokens, so ``B tau / T_out`` new ones
    start per step (``tau`` accepted tokens per step; 1 without speculation), each with a prompt
    of ``T_in``; capped by ``prefill_chunk = C`` when set (smooth min when ``smoothness > 0``):

    .. math:: c = \\min\\big(B\\,\\tau\\,T_{in}/T_{out},\\ C\\big)

    (A cap below the steady-state need means prompts queue: the step is then what it costs, but
    the batch cannot be kept full; ``mixed_step`` does not model the queue.)

    >>> import dcost
    >>> w = dcost.Workload(1500, prompt=1000, output=500)
    >>> float(prefill_tokens_per_step(dcost.Design(batch=64), w))  # 64 * 1000 / 500
    128.0
    >>> float(prefill_tokens_per_step(dcost.Design(batch=64, prefill_chunk=100), w))
    100.0
    """
    from dcost.serving.speculative import _accepted_tokens

    tau = _accepted_tokens(workload.get("acceptance"), design.get("draft_tokens"))
    need = design.batch * tau * workload.prompt / workload.output
    cap = design.get("prefill_chunk")
    capped = smin([need, jnp.where(cap > 0, cap, 1.0)], smoothness)
    return jnp.where(cap > 0, capped, need)


def mixed_step(
    design: Design, hardware: Hardware, model: Model, workload: Workload, smoothness=0.0
) -> Report:
    """One step of continuous batching with chunked prefill: ``B`` decode sequences and a chunk
    of ``c`` prompt tokens (``prefill_tokens_per_step``) share the weights and the step.

    With ``B' = B(k_d + 1)`` verify tokens (``k_d`` draft tokens) and ``n_c = max(T_in/c, 1)``
    steps per prompt:

    .. math::
        \\text{FLOPs} = B'(2N_{active} + aT) + c\\,(2N_{active} + a_{pf} T_{in}/2)

        \\text{weights} = b_w(N_{dense} + E n_e \\phi(B' + c))

        \\text{KV} = B T b_{kv} + c\\,b_{kv} + c\\,b_{kv}(n_c - 1)/2

    (decode reads, the chunk's writes, and the chunk's reads of its prompt's earlier chunks: a
    prompt spread over ``n_c`` steps reads ``T_in (n_c - 1)/2`` tokens of KV in all). The
    all-to-all, hops and collectives carry ``B' + c`` tokens; everything else is ``decode``'s
    (``docs/serving_v2.md``). ``tpot`` is the step over ``tau``; ``tokens_per_s`` and
    ``cost_per_token`` count output tokens, so the cost per output token includes the prefill.
    Memory holds the ``B`` sequences' KV.

    Args:
      design, hardware, model: as for ``decode``.
      workload: ``context`` ``T`` of the decoding sequences; ``prompt`` ``T_in`` and ``output``
        ``T_out`` (>= 1) set the prefill rate.
      smoothness: 0 exact, in ``(0, 1]`` smooth (``dcost.smooth.MAX_SMOOTHNESS``).

    Returns:
      A ``Report`` per output token.

    Raises:
      SpecError: as ``decode``, and when a concrete ``output`` or ``prompt`` is below 1.

    >>> import dcost
    >>> h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    >>> w = dcost.Workload(1500, prompt=1000, output=500)
    >>> d = dcost.Design(batch=64, chips=8)
    >>> bool(dcost.mixed_step(d, h, m, w).tpot > dcost.decode(d, h, m, w).tpot)
    True
    """
    check_types("mixed_step", design, hardware, model, workload)
    smoothness = smoothness_argument("mixed_step", smoothness)
    report, status = _mixed_step_jit(design, hardware, model, workload, smoothness)
    return checked("mixed_step", report, status, design, workload, _NEEDS)


def _mixed_step(design, hardware, model, workload, smoothness, chunk_tokens=None) -> Report:
    """``mixed_step`` without its checks (the traced body). ``chunk_tokens``: the prompt tokens
    ``c`` the step carries (per micro-batch), given instead of the steady state's
    ``prefill_tokens_per_step`` (None); the capacity planner prices steps of any mix this way,
    inside its own jitted programs (``dcost.planning.designs``)."""
    model = with_experts(model, design)
    b, t, t_in = design.batch, workload.context, workload.prompt
    decode_tokens = b * (1.0 + design.get("draft_tokens"))
    if chunk_tokens is None:
        c = prefill_tokens_per_step(design, workload, smoothness)
    else:
        c = _float(chunk_tokens)
    n_c = smax([safe_div(t_in, c, default=1.0), jnp.ones_like(c)], smoothness)
    tokens = decode_tokens + c
    phi = _expert_fraction(tokens, model.n_experts, model.experts_active)
    touched = (model.n_experts + design.get("redundant_experts")) * model.params_per_expert * phi
    b_kv = model.kv_bytes_per_token
    tau, t_draft, draft_memory = _speculation(design, hardware, model, workload, smoothness)
    return _assemble(
        design,
        hardware,
        model,
        workload,
        smoothness,
        tokens=tokens,
        passes=1.0,
        attn_ctx_flops=decode_tokens * model.attn_flops_per_context_token * t
        + c * model.prefill_attn_flops * t_in / 2.0,
        expert_params_touched=touched,
        kv_bytes=b * t * b_kv + c * b_kv + c * b_kv * (n_c - 1.0) / 2.0,
        kv_resident_tokens=b * t,
        sequences=b,
        tokens_per_step=tau,
        t_draft=t_draft,
        draft_memory=draft_memory,
        phi_tokens=tokens,
        scheduled=b,
    )


_NEEDS = ("output", "prompt")  # a steady state needs an output, and prompts to prefill
_mixed_step_jit = jitted("mixed_step", _mixed_step, _NEEDS)


def kv_transfer_time(tokens, hardware: Hardware, model: Model, chips=1.0):
    """Time to move a prompt's KV cache from the prefill pool to the decode pool (s).

    .. math:: t = \\alpha_{out} + \\frac{T_{in}\\,b_{kv}}{G\\,O'}

    over scale-out links (``O'`` the achieved bandwidth, ``alpha`` their latency), the cache
    sharded over the ``G`` chips that computed it, each sending its share at once.

    >>> import dcost
    >>> h = dcost.Hardware(1e15, 1e12, 1e11, 1e11, 1e10, 8, 3.6, scaleout_latency=1e-5)
    >>> m = dcost.Model(10, 1000, 1e9, 0.0, 0, 0, 1e5, 2.0)
    >>> round(float(kv_transfer_time(1000.0, h, m)), 7)  # 10 us + 1e8 B / 1e10 B/s
    0.01001

    Concrete ``tokens`` (>= 0) and ``chips`` (>= 1) are checked (SpecError naming them), and so
    is a concrete result that overflows the float dtype.
    """
    check("kv_transfer_time", "tokens", tokens)
    check("kv_transfer_time", "chips", chips, low=1.0)
    t = hardware.get("scaleout_latency") + _float(tokens) * model.kv_bytes_per_token / (
        _float(chips) * hardware.scaleout_achieved
    )
    v = _concrete(t)
    if v is not None and not np.all(np.isfinite(v)):
        raise SpecError(
            f"kv_transfer_time.tokens = {_short(tokens)} is not allowed: the transfer time "
            f"overflows {jnp.dtype(jnp.result_type(float))} (at most {float_max():g} s); "
            "use fewer tokens or enable jax_enable_x64"
        )
    return t
