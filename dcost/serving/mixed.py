"""Mixed steps (continuous batching with chunked prefill) and the KV transfer of disaggregation.

Continuous batching (Yu et al., "Orca", OSDI 2022) keeps ``B`` sequences decoding and admits new
ones as others finish; with chunked prefill (Agrawal et al., "Sarathi-Serve", OSDI 2024) each step
carries a chunk of prompt tokens beside the decode tokens, so a step's time, and the time per
output token, carries the prefill's interference. Disaggregated serving (Zhong et al.,
"DistServe", OSDI 2024; Patel et al., "Splitwise", ISCA 2024) runs prefill and decode on separate
pools instead, and pays for moving each prompt's KV cache between them.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from dcost.engines import on_engine
from dcost.serving._jitted import check_types, checked, jitted, smoothness_argument
from dcost.serving.moe import _expert_fraction
from dcost.serving.roofline import (
    SECONDS_PER_HOUR,
    Report,
    _assemble,
    _speculation,
    attended,
    prefill_attended,
)
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

__all__ = ["mixed_step", "prefill_tokens_per_step", "chunk_step_tokens", "kv_transfer_time"]


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


def chunk_step_tokens(design, workload, mean_tokens, smoothness=0.0):
    """Prompt tokens of a step that carries prompt tokens at all (tokens).

    An engine admits a new sequence's prompt whole, or in chunks of ``C = prefill_chunk`` when set
    and shorter, so prompt tokens come ``min(T_in, C)`` at a time, or more when several prompts
    start in the same step (``c``, the steady-state mean ``prefill_tokens_per_step``, is then above
    it; smooth max and min when ``smoothness > 0``):

    .. math:: c^* = \\max\\big(c,\\ \\min(T_{in}, C)\\big)

    so a share ``f = c / c^*`` of the steps carries ``c^*`` prompt tokens and the rest carry none.

    >>> import dcost
    >>> w = dcost.Workload(1500, prompt=1000, output=500)
    >>> float(chunk_step_tokens(dcost.Design(batch=64), w, 128.0))  # a whole prompt
    1000.0
    >>> float(chunk_step_tokens(dcost.Design(batch=64, prefill_chunk=256), w, 128.0))
    256.0
    >>> float(chunk_step_tokens(dcost.Design(batch=4096), w, 8192.0))  # 8 prompts a step
    8192.0
    """
    cap = design.get("prefill_chunk")
    piece = jnp.where(
        cap > 0, smin([workload.prompt, jnp.where(cap > 0, cap, 1.0)], smoothness), workload.prompt
    )
    return smax([mean_tokens, piece], smoothness)


def mixed_step(
    design: Design,
    hardware: Hardware,
    model: Model,
    workload: Workload,
    smoothness=0.0,
    *,
    engine=None,
) -> Report:
    """A step of continuous batching with chunked prefill, on average: ``B`` decode sequences,
    and in a share of the steps a chunk of prompt tokens beside them.

    In steady state a step admits ``c`` prompt tokens on average (``prefill_tokens_per_step``),
    but they come whole prompts (or chunks of ``prefill_chunk``) at a time: a share
    ``f = c / c^*`` of the steps carries ``c^*`` prompt tokens (``chunk_step_tokens``) and the
    others none. The step's time is the mean of the two kinds,

    .. math:: t = (1 - f)\\,t(B', 0) + f\\,t(B', c^*)

    where ``t(B', x)`` is one step of ``B' = B(k_d + 1)`` verify tokens (``k_d`` draft tokens)
    and ``x`` prompt tokens, ``n_x = max(T_in/x, 1)`` steps per prompt:

    .. math::
        \\text{FLOPs} = B'(2N_{active} + aT) + x\\,(2N_{active} + a_{pf} T_{in}/2)

        \\text{weights} = b_w(N_{dense} + E n_e \\phi(B' + x))

        \\text{KV} = B T b_{kv} + x\\,b_{kv} + x\\,b_{kv}(n_x - 1)/2

    (decode reads, the chunk's writes, and the chunk's reads of its prompt's earlier chunks: a
    prompt spread over ``n_x`` steps reads ``T_in (n_x - 1)/2`` tokens of KV in all). The
    all-to-all, hops and collectives carry ``B' + x`` tokens; everything else is ``decode``'s
    (``docs/serving_v2.md``, section 8). The two kinds matter where the step's terms are not
    linear in its tokens: a small batch that reads few experts reads many in the steps that
    carry a prompt (``phi`` is concave), and a memory-bound decode step does not hide a prompt's
    FLOPs, which a compute-bound chunk step pays in full (a step's time is a maximum, convex).
    Spreading the prompts evenly, ``c`` tokens in every step, got both wrong (Jensen's
    inequality); at ``c >= min(T_in, C)`` every step carries prompt tokens and the two forms
    agree.

    ``tpot`` is the mean step over ``tau``; ``tokens_per_s`` and ``cost_per_token`` count output
    tokens, so the cost per output token includes the prefill; ``mfu`` counts the prompt tokens a
    step computes too; the report's times are the means
    over the two kinds of step. Memory holds the ``B`` sequences' KV.

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
    hardware = on_engine(engine, hardware, model)
    smoothness = smoothness_argument("mixed_step", smoothness)
    report, status = _mixed_step_jit(design, hardware, model, workload, smoothness)
    return checked("mixed_step", report, status, design, workload, _NEEDS)


def _carrying(design, hardware, model, workload, smoothness, x, speculation) -> Report:
    """One step of ``B'`` decode tokens and ``x`` prompt tokens (``t(B', x)`` of
    ``mixed_step``; ``x = 0`` is a decode step)."""
    b, t, t_in = design.batch, workload.context, workload.prompt
    decode_tokens = b * (1.0 + design.get("draft_tokens"))
    n_x = smax([safe_div(t_in, x, default=1.0), jnp.ones_like(x)], smoothness)
    tokens = decode_tokens + x
    phi = _expert_fraction(tokens, model.n_experts, model.experts_active)
    touched = (model.n_experts + design.get("redundant_experts")) * model.params_per_expert * phi
    b_kv = model.kv_bytes_per_token
    b_idx = model.index_bytes_per_token  # a sparse-attention indexer's keys (0: dense)
    t_att = attended(t, model.attention_topk, smoothness)
    tau, t_draft, draft_memory = speculation
    r = _assemble(
        design,
        hardware,
        model,
        workload,
        smoothness,
        tokens=tokens,
        passes=1.0,
        attn_ctx_flops=decode_tokens
        * (model.attn_flops_per_context_token * t_att + model.index_flops_per_context_token * t)
        + x
        * (
            model.prefill_attn_flops * prefill_attended(t_in, model.attention_topk, smoothness)
            + model.index_flops_per_context_token * t_in / 2.0
        ),
        expert_params_touched=touched,
        kv_bytes=b * (t_att * b_kv + t * b_idx) + x * (b_kv + b_idx) * (1.0 + (n_x - 1.0) / 2.0),
        kv_resident_tokens=b * t,
        # the decodes' states, and the state of each prompt the chunk carries (x n_x / T_in of
        # them: one for a chunk shorter than its prompt), read and written
        state_bytes=2.0 * (b + safe_div(x * n_x, t_in)) * model.state_bytes_per_sequence,
        state_sequences=b,
        sequences=b,
        tokens_per_step=tau,
        t_draft=t_draft,
        draft_memory=draft_memory,
        phi_tokens=tokens,
        scheduled=b,
        prompt_passes=jnp.where(x > 0, 1.0, 0.0),
    )
    # the step's MFU counts its x prompt tokens beside its B tau output tokens
    return eqx.tree_at(lambda q: q.mfu, r, r.mfu * (1.0 + safe_div(x, b * r.tokens_per_step)))


_MEAN_FIELDS = (
    "t_compute",
    "t_weights",
    "t_kv",
    "t_comm",
    "t_hop",
    "t_stage",
    "tpot",
    "t_overhead",
)
"""The report's times, averaged over the kinds of step; its rates follow from ``tpot``."""


def _mean_step(r0: Report, r1: Report, f, design, hardware, model, prompt_tokens) -> Report:
    """The report of a mix: a share ``1 - f`` of steps like ``r0``, ``f`` like ``r1``; its MFU
    counts the ``prompt_tokens`` a step computes on average beside its output tokens."""
    fields = {k: (1.0 - f) * getattr(r0, k) + f * getattr(r1, k) for k in _MEAN_FIELDS}
    chips = design.stages * design.chips
    tokens_per_s = design.stages * design.batch / fields["tpot"]
    outputs = design.batch * r1.tokens_per_step  # output tokens a step, per micro-batch
    computed = tokens_per_s * (1.0 + safe_div(prompt_tokens, outputs))
    return Report(
        **fields,
        tokens_per_s=tokens_per_s,
        cost_per_token=chips * hardware.price_per_hour / SECONDS_PER_HOUR / tokens_per_s,
        memory_per_chip=r1.memory_per_chip,
        mfu=2.0 * model.params_active_multiplied * computed / (chips * hardware.flops),
        t_draft=r1.t_draft,
        tokens_per_step=r1.tokens_per_step,
    )


def _mixed_step(design, hardware, model, workload, smoothness, chunk_tokens=None) -> Report:
    """``mixed_step`` without its checks (the traced body). ``chunk_tokens``: the prompt tokens
    ``x`` of one step (per micro-batch), given instead of the steady state's mix: that one
    step, ``t(B', x)``; the capacity planner prices steps of any mix this way, inside its own
    jitted programs (``dcost.planning.designs``)."""
    model = with_experts(model, design)
    speculation = _speculation(design, hardware, model, workload, smoothness)
    if chunk_tokens is not None:
        x = _float(chunk_tokens)
        return _carrying(design, hardware, model, workload, smoothness, x, speculation)
    c = prefill_tokens_per_step(design, workload, smoothness)
    x = chunk_step_tokens(design, workload, c, smoothness)
    f = safe_div(c, x, default=1.0)
    decode_only = _carrying(design, hardware, model, workload, smoothness, 0.0 * x, speculation)
    carrying = _carrying(design, hardware, model, workload, smoothness, x, speculation)
    return _mean_step(decode_only, carrying, f, design, hardware, model, c)


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
