"""The serving cost model: the roofline of one decode (or prefill) step, and its closed forms.

A step takes the larger of its compute time and its memory time (weights + KV cache), and of its
communication time; batch size decides how far weight reads are amortized. ``smoothness = 0`` is
the exact hard max; ``smoothness > 0`` the p-norm smooth max of ``dcost.smooth.smax`` from the same
code. References: Williams, Waterman & Patterson, "Roofline" (CACM 2009); Pope et al., "Efficiently
Scaling Transformer Inference" (2022); the JAX scaling book, "All about Transformer inference".

Serving model v2 (``docs/serving_v2.md``) adds, each behind a field whose default switches it
off: fixed per-step and per-layer overheads, alpha-beta collectives, the attention layout
(``attention``), de-duplicated and node-limited dispatch, expert imbalance and redundant experts
(``moe``), matmul efficiency by matmul size, speculative decoding (``speculative``), the MLA
prefill form and chunked prefill. With every default, ``decode`` and ``prefill`` return v1's
numbers (``tests/test_serving_v2.py`` checks it on every preset pair).
"""

from __future__ import annotations

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost.engines import on_engine
from dcost.serving._jitted import check_types, checked, jitted, smoothness_argument
from dcost.serving.attention import (
    attention_comm_time,
    attention_groups,
    attention_weight_params,
    kv_replication,
)
from dcost.serving.kernels import kernel_time
from dcost.serving.moe import (
    _expert_fraction,
    all_to_all_time,
    expert_imbalance,
    expert_tensor_parallel_time,
    tokens_per_expert,
)
from dcost.serving.pipeline import hop_time, pipeline_latency
from dcost.serving.speculative import _accepted_tokens, draft_time
from dcost.smooth import safe_div, smax, smin
from dcost.specs import (
    Design,
    Hardware,
    Model,
    SpecError,
    Workload,
    check,
    readable,
    with_experts,
)

__all__ = [
    "Report",
    "PrefillReport",
    "decode",
    "prefill",
    "balance_batch",
    "critical_context",
    "bottleneck",
    "matmul_efficiency",
    "moe_layer_fixed",
    "expert_rate_slowdown",
    "stage_time",
    "kernel_time",
    "chunks",
    "SECONDS_PER_HOUR",
    "TERMS",
]

SECONDS_PER_HOUR = 3600.0
TERMS = ("compute", "memory", "comm")
_FLOAT32_MAX = 3.4028234663852886e38  # every Python number up to it is a valid float32


class Report(eqx.Module):
    """What one decode (or mixed) step costs (SI units). A pytree: batched designs give array
    fields.

    Attributes:
      t_compute: compute time of one stage step (s).
      t_weights: weight-read time of one stage step (s).
      t_kv: KV-cache read time of one stage step (mixed steps: and the prompt chunk's KV) (s).
      t_comm: all-to-all, tensor-parallel and attention-layout collectives of one stage step (s).
      t_hop: activation hop to the next stage (s).
      t_stage: ``max(t_compute, t_weights + t_kv, t_comm) + t_overhead`` (smooth when
        smoothness > 0) (s).
      tpot: time per output token, ``(P t_stage + (P-1) t_hop + t_draft)/tokens_per_step`` (s).
      tokens_per_s: output tokens per second of one replica.
      cost_per_token: $ per output token.
      memory_per_chip: HBM bytes per chip (weights + KV + the draft's).
      mfu: model FLOP utilization ``2*(N_active - N_emb)*tokens_per_s / (P*G*F)``: the FLOPs
        of the parameters a token multiplies by (the input embedding is a lookup; counting it, a
        pure-physics prefill of gpt-oss-120b came to 110 % of the chip's peak).
      t_overhead: host and launch time of one stage step,
        ``n_p (step_overhead + (layer_overhead + gemm_overhead g) L/P + sequence_overhead B/A
        + expert_overhead (E' phi) (L_moe/P) / e + c_m(e) L_moe/P)`` over its
        ``n_p`` passes (and ``prefill_step_overhead`` on each pass that carries prompt
        tokens), with ``E' phi``
        the routed experts a pass touches (``E'`` with the redundant ones) and ``e`` the
        expert-parallel groups (s; 0 in v1).
      t_draft: the draft's passes of one step (speculative decoding; s; 0 in v1).
      tokens_per_step: tokens a sequence advances per decode step (accepted length; 1 in v1).
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
    t_overhead: jax.Array
    t_draft: jax.Array
    tokens_per_step: jax.Array

    __repr__ = readable


class PrefillReport(eqx.Module):
    """What one prefill step costs (SI units): the fields of ``Report``, per *input* token, with
    the time of the pass as ``ttft``. A pytree: batched designs give array fields.

    ``Report``'s speculative-decoding fields are left out: a prefill has no draft (``t_draft``
    would always be 0) and advances no sequence by accepted tokens (``tokens_per_step`` would
    always be 1).

    Attributes:
      t_compute, t_weights, t_comm, t_hop, t_stage: as in ``Report``, summed over the pass's
        chunks (s).
      t_kv: KV-cache write time of one stage step, plus the reads of earlier chunks' KV under
        chunked prefill (s).
      ttft: time of the whole prefill pass, i.e. time to first token (s).
      tokens_per_s: input (prompt) tokens per second of one replica.
      cost_per_token: $ per input token.
      memory_per_chip: HBM bytes per chip (weights + the prompts' KV).
      mfu: model FLOP utilization ``2*(N_active - N_emb)*tokens_per_s / (P*G*F)``: the FLOPs
        of the parameters a token multiplies by (the input embedding is a lookup; counting it, a
        pure-physics prefill of gpt-oss-120b came to 110 % of the chip's peak).
      t_overhead: fixed time of one stage step over its ``n_c`` chunks,
        ``n_c (step_overhead + (layer_overhead + gemm_overhead g) L/P + sequence_overhead B/A
        + prefill_step_overhead)`` (``g = Model.gemms_per_layer``) (s; 0 in v1).
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
    t_overhead: jax.Array

    __repr__ = readable


def matmul_efficiency(tokens, hardware):
    """Achieved fraction of peak FLOP/s of a matmul that ``tokens`` tokens run through.

    .. math:: \\eta(n) = \\eta_F \\frac{n}{n + n_{1/2}}

    A saturating curve with half-rate point ``n_half = Hardware.matmul_half_tokens`` (weights
    stream from HBM while too few rows share them; compare the roofline's balance point); 0 turns
    it off (``eta = eta_F``). A fitted form, not derived: ``dcost.calibrate`` fits ``n_half``.

    >>> import dcost
    >>> h = dcost.Hardware(1e15, 1e12, 1e11, 1e11, 1e10, 8, 3.6, matmul_half_tokens=64.0)
    >>> float(matmul_efficiency(64.0, h))
    0.5
    """
    return hardware.flops_efficiency / (1.0 + safe_div(hardware.get("matmul_half_tokens"), tokens))


def stage_time(
    matmul_dense, matmul_expert, context, t_comm, smoothness=0.0, overlap=0.0, hardware=None
):
    """A stage step whose operations run one after another, each at its own roofline (s).

    .. math::
        K = \\max(t^F_{dense}, t^W_{dense}) + \\max(t^F_{exp}, t^W_{exp}) + \\max(t^F_{ctx}, t_{kv})

        t_{serial} = (1 - o)(K + t_{comm}) + o \\max(K, t_{comm})

    The dense (and attention-projection) matmuls, the routed-expert matmuls and attention over
    the context each take the larger of their compute and memory times, and the collectives come
    on top. A serving engine launches these as separate kernels in sequence (a GEMM cannot start
    before the attention that feeds it ends), so a memory-bound attention does not hide behind a
    compute-bound matmul as the whole-step roofline ``max(t_compute, t_weights + t_kv, t_comm)``
    assumes: the roofline applies per kernel (Williams et al., CACM 2009), and per-operation
    roofline times add up over a layer (Yuan et al., "LLM Inference Unveiled: Survey and
    Roofline Model Insights", arXiv 2402.16363, 2024, section 3).

    An engine that hides a fraction ``o = Design.comm_overlap`` of its collectives behind the
    kernels (two micro-batches in flight: DeepSeek-V3 Technical Report, section 3.4, SGLang's
    two-batch overlap) takes the longer of the two streams for that fraction. (Two micro-batches
    also read the weights twice; that term is left out.) At ``o = 0`` the result is at least the
    whole-step roofline (a sum of maxima is at least the maximum of sums).
    ``Hardware.kernel_serialization = s`` weighs it in ``_assemble``:
    ``t_stage = t_overlapped + s (t_serial - t_overlapped) + t_overhead``.

    Args:
      matmul_dense, matmul_expert, context: ``(compute seconds, memory seconds)`` pairs of one
        stage step on one chip.
      t_comm: collectives of the step (s).
      smoothness: 0 for the hard maxima, in ``(0, 1]`` for the p-norm ones.
      overlap: ``o`` in [0, 1].
      hardware: the chip, for each kernel's ``kernel_time`` (its
        ``kernel_roofline_smoothness``); None: the maxima above.

    >>> float(stage_time((2.0, 1.0), (0.5, 3.0), (1.0, 4.0), 0.5))  # 2 + 3 + 4 + 0.5
    9.5
    >>> float(stage_time((2.0, 1.0), (0.5, 3.0), (1.0, 4.0), 10.0, overlap=1.0))  # max(9, 10)
    10.0
    """
    pairs = (matmul_dense, matmul_expert, context)
    if hardware is None:
        kernels = sum(smax([f, w], smoothness) for f, w in pairs)
    else:
        kernels = sum(kernel_time(f, w, hardware, smoothness) for f, w in pairs)
    return (1.0 - overlap) * (kernels + t_comm) + overlap * smax([kernels, t_comm], smoothness)


def moe_layer_fixed(c_1, c_ep, expert_groups):
    """The fixed time of one MoE layer on a chip of ``e = expert_groups`` expert-parallel
    groups: ``c_1 / e + c_ep (1 - 1/e)`` (s), from ``c_1`` (``Hardware.moe_layer_overhead``)
    with every expert on the chip's group (tensor-parallel experts) to ``c_ep``
    (``moe_ep_overhead``) when each group holds few of them. Smooth in ``e``; ``c_1`` whatever
    ``e`` when ``c_ep = c_1`` (a chip whose ``moe_ep_overhead`` is None). The serving model
    (``decode``'s ``t_overhead``) and the kernel fit (``dcost.calibrate.kernels.moe_layer_time``)
    both take it from here.

    The engines' MoE tables say the two differ: AIConfigurator's balanced rows on H200 under
    vLLM 0.24 take 40 us for gpt-oss's layer at one token over 4-8 tensor-parallel GPUs and
    68 us over 4-128 expert-parallel ones, about as many bytes read (the expert-parallel path
    maps its tokens to local experts and masks the rest); TensorRT-LLM's take about the same.

    >>> [round(float(moe_layer_fixed(2e-5, 5e-5, e)) * 1e6, 3) for e in (1.0, 2.0, 8.0)]
    [20.0, 35.0, 46.25]
    """
    share = 1.0 - 1.0 / expert_groups
    return (1.0 - share) * c_1 + share * c_ep


def expert_rate_slowdown(half_width, kappa, inter, expert_tp, expert_groups):
    """How many times longer the routed experts' FLOPs take than at their fitted rate, for their
    layout: ``(1 + w_e t / i) (1/e + kappa (1 - 1/e))``.

    An expert of intermediate size ``i`` split over ``t`` tensor-parallel chips multiplies
    matrices ``i/t`` wide (``h x 2i/t`` gate and up, ``i/t x h`` down): narrow output tiles and
    short reductions reach a smaller share of the chip's rate, half of it at width ``w_e``
    (``Hardware.expert_half_width``). Over ``e`` expert-parallel groups an engine runs another
    path (tokens permuted to the chip's experts, each expert's count padded), ``kappa``
    (``Hardware.expert_ep_slowdown``) times as slow once the groups are many; smooth in ``e``,
    1 at ``e = 1``, as ``moe_layer_fixed``. The serving model (``decode``'s ``t_compute``) and
    the kernel fit (``dcost.calibrate.kernels.moe_layer_time``) both take it from here.

    AIConfigurator's MoE tables say why (H200, TensorRT-LLM 1.3.0rc20, DeepSeek-V3's block-fp8
    layer of 7,168 x 2,048 x 256 experts, top 8, 16,384 tokens, balanced routing): 9.7 ms over 8
    tensor-parallel chips (``i/t`` = 256) against 2.5 ms over 8 expert-parallel ones, the same
    FLOPs a chip; one rate fitted to every layout read the first about 2x too fast.

    >>> round(float(expert_rate_slowdown(512.0, 1.0, 2048.0, 8.0, 1.0)), 3)
    3.0
    >>> round(float(expert_rate_slowdown(0.0, 3.0, 2048.0, 1.0, 8.0)), 3)
    2.75
    """
    narrow = 1.0 + safe_div(half_width * expert_tp, inter)
    share = 1.0 - 1.0 / expert_groups
    return narrow * ((1.0 - share) + share * kappa)


def _flop_seconds(flops, tokens, hardware):
    """``flops / (F eta(n))`` at matmul size ``tokens``: seconds for one chip (s)."""
    slowdown = 1.0 + safe_div(hardware.get("matmul_half_tokens"), tokens)
    return flops * slowdown / hardware.flops_achieved


def chunks(prompt, chunk, smoothness=0.0):
    """Forward passes a chunked prefill takes: ``max(T_in/C, 1)``, 1 when ``C = 0`` (v1).

    The relaxed count: a last, partial chunk counts for its fraction (its weight read is
    pro-rated), so the count is continuous in ``C`` and the optimizer sees its gradient; it is
    below ``ceil(T_in/C)`` by less than one pass. A smooth max when ``smoothness > 0``.

    >>> float(chunks(8192.0, 2048.0)), float(chunks(1000.0, 2048.0)), float(chunks(1000.0, 0.0))
    (4.0, 1.0, 1.0)
    """
    n = safe_div(prompt, chunk, default=1.0)
    return jnp.where(chunk > 0, smax([n, jnp.ones_like(n)], smoothness), 1.0)


def attended(context, topk, smoothness=0.0):
    """Context tokens a decode query attends to: ``min(T, k)`` under sparse attention of top-k
    ``k`` (``Model.attention_topk``; DeepSeek-V3.2 report, arXiv 2512.02556, section 2.1), ``T``
    where ``k = 0`` (dense), 0 where ``T = 0``; smooth with ``smoothness``.

    >>> float(attended(8192.0, 2048.0)), float(attended(1000.0, 2048.0)), float(attended(9.0, 0.0))
    (2048.0, 1000.0, 9.0)
    """
    t = jnp.asarray(context, dtype=jnp.result_type(float))
    sparse = topk > 0
    t1, k1 = jnp.where(t > 0, t, 1.0), jnp.where(sparse, topk, 1.0)
    m = jnp.where(smoothness > 0, smin([t1, k1], smoothness), jnp.minimum(t1, k1))
    return jnp.where(sparse, jnp.where(t > 0, m, 0.0), t)


def prefill_attended(prompt, topk, smoothness=0.0):
    """Mean context a prompt's tokens attend to, causal: ``T/2`` dense; under top-k ``k``, the
    ``i``-th token attends to ``min(i, k)``, a mean of ``m - m^2/(2T)`` with ``m = min(T, k)``
    (``T/2`` when ``T <= k``, ``k - k^2/(2T)`` after).

    >>> float(prefill_attended(1000.0, 2048.0)), float(prefill_attended(8192.0, 2048.0))
    (500.0, 1792.0)
    """
    m = attended(prompt, topk, smoothness)
    return m - safe_div(m * m, 2.0 * prompt)


def _assemble(
    design,
    hardware,
    model,
    workload,
    smoothness,
    *,
    tokens,
    passes,
    attn_ctx_flops,
    expert_params_touched,
    kv_bytes,
    kv_resident_tokens,
    sequences,
    tokens_per_step,
    t_draft,
    draft_memory,
    phi_tokens,
    scheduled,
    prompt_passes=0.0,
    state_bytes=0.0,
    state_sequences=0.0,
):
    """Shared body of decode, prefill and mixed steps for one stage step (see each docstring).

    Args (all passes of the stage step together):
      tokens: tokens through the weights; passes: forward passes they take; attn_ctx_flops:
      attention FLOPs over the context; expert_params_touched: routed-expert parameters read per
      pass; kv_bytes: KV bytes read and written (before replication); kv_resident_tokens: tokens
      of KV held; sequences: tokens per micro-batch counted by ``tokens_per_s`` per step;
      tokens_per_step: accepted length; t_draft: draft time; draft_memory: draft bytes per chip;
      phi_tokens: tokens per pass (for matmul sizes and imbalance); scheduled: sequences the
      step schedules per pass (``sequence_overhead``); prompt_passes: the passes that carry
      prompt tokens (``prefill_step_overhead``; a decode step's admitting share);
      state_bytes: linear-attention state read and written (``Model.state_bytes_per_sequence``;
      split over the chips, never replicated); state_sequences: sequences whose state is held.
      The recurrence's FLOPs (``Model.state_flops_per_token``) go with the attention's.
    """
    p, g = design.stages, design.chips
    chips = p * g
    groups, held = attention_groups(design, model)
    tp = g / groups
    rep = kv_replication(tp, model.kv_heads)
    # over the expert-parallel groups e (None: v1's e = G, every expert whole on one chip)
    imb = expert_imbalance(
        workload,
        phi_tokens,
        design.get("expert_parallel"),
        model,
        design.get("redundant_experts"),
        smoothness,
    )

    # compute: each part at its matmul size (tokens through one weight matrix on a chip)
    n_attn = model.params_attention
    expert_active = model.experts_active * model.params_per_expert
    f_attn_proj = _flop_seconds(2.0 * n_attn * tokens, phi_tokens / groups, hardware)
    f_dense = _flop_seconds(2.0 * (model.params_multiplied - n_attn) * tokens, phi_tokens, hardware)
    # the grouped matmuls at their own size curve (``expert_half_tokens``, else the GEMMs')
    expert_slowdown = 1.0 + safe_div(
        hardware.get("expert_half_tokens"),
        tokens_per_expert(phi_tokens, model.n_experts, model.experts_active),
    )
    # ... and at the width of each chip's slice of an expert, on the engine's layout's path
    expert_groups = design.expert_parallel if design.expert_parallel is not None else g
    layout_slowdown = expert_rate_slowdown(
        hardware.get("expert_half_width"),
        hardware.get("expert_ep_slowdown"),
        # an expert's intermediate size: its gated matrices hold 3 d i parameters a layer
        safe_div(model.params_per_expert, 3.0 * model.d_model * model.moe_layers),
        g / expert_groups,
        expert_groups,
    )
    f_expert = (
        (2.0 * expert_active * tokens * imb / hardware.get("expert_flops_efficiency"))
        * expert_slowdown
        * layout_slowdown
        / hardware.flops_achieved
    )
    f_context = (
        attn_ctx_flops + tokens * model.state_flops_per_token
    ) / hardware.attention_flops_achieved
    flop_time = f_attn_proj + f_dense + f_expert + f_context
    t_compute = flop_time / chips

    # memory: weights once per pass, KV (replicated by tensor-parallel attention)
    bw = hardware.bandwidth_achieved
    extra_attn = attention_weight_params(model, groups, held)
    t_kv = (kv_bytes * rep + state_bytes) / (chips * hardware.kv_bandwidth_achieved)
    w_dense = model.bytes_per_param * passes * (model.params_multiplied + extra_attn) / (chips * bw)
    # the routed experts' reads at their own rate (``expert_bandwidth_efficiency``)
    w_expert = (
        model.bytes_per_param
        * passes
        * expert_params_touched
        / (chips * hardware.expert_bandwidth_achieved)
    )
    t_weights = w_dense + w_expert

    # communication: the all-to-all (MoE) and the layout's collectives, on shared links
    moe_layers = model.moe_layers / p
    a2a = _expert_comm(tokens, moe_layers, design, hardware, model, imb, smoothness, passes)
    layout = attention_comm_time(tokens, model.n_layers / p, g, groups, hardware, model, passes)
    t_comm = jnp.where(model.n_experts > 0, a2a + layout, layout)

    # the routed experts a pass touches, per MoE layer, on one chip's expert-parallel group
    touched_experts = safe_div(expert_params_touched, model.params_per_expert)
    t_overhead = passes * (
        hardware.get("step_overhead")
        + (hardware.get("layer_overhead") + hardware.get("gemm_overhead") * model.gemms_per_layer)
        * model.n_layers
        / p
        + hardware.get("sequence_overhead") * scheduled / groups
        + hardware.get("expert_overhead") * touched_experts * moe_layers / expert_groups
        + moe_layer_fixed(
            hardware.get("moe_layer_overhead"), hardware.get("moe_ep_overhead"), expert_groups
        )
        * moe_layers
        # a sparse-attention indexer's kernels, every layer of a model with top-k attention
        + hardware.get("index_layer_overhead")
        * jnp.where(model.attention_topk > 0, model.n_layers / p, 0.0)
    ) + prompt_passes * hardware.get("prefill_step_overhead")
    overlapped = smax([t_compute, t_weights + t_kv, t_comm], smoothness)
    serial = stage_time(
        ((f_attn_proj + f_dense) / chips, w_dense),
        (f_expert / chips, w_expert),
        (f_context / chips, t_kv),
        t_comm,
        smoothness,
        design.get("comm_overlap"),
        hardware,
    )
    t_stage = overlapped + hardware.get("kernel_serialization") * (serial - overlapped) + t_overhead
    # a pass with prompt tokens runs outside the CUDA graphs: at least the host's dispatch of its
    # MoE layers (``eager_moe_layer_overhead``); no floor leaves the step as it is, to the bit
    floor = prompt_passes * hardware.get("eager_moe_layer_overhead") * moe_layers
    t_stage = jnp.where(floor > 0, smax([t_stage, floor], smoothness), t_stage)
    t_hop = hop_time(tokens, g, p, hardware, model, passes)
    trip = pipeline_latency(t_stage, t_hop, p) + t_draft
    tpot = trip / tokens_per_step
    tokens_per_s = p * sequences / tpot
    cost = chips * hardware.price_per_hour / SECONDS_PER_HOUR / tokens_per_s
    held_params = (
        model.params_total + extra_attn + design.get("redundant_experts") * model.params_per_expert
    )
    memory = (
        model.bytes_per_param * held_params / chips
        + kv_resident_tokens * (model.kv_bytes_per_token + model.index_bytes_per_token) * rep / g
        + state_sequences * model.state_bytes_per_sequence / g
        + draft_memory
    )
    mfu = 2.0 * model.params_active_multiplied * tokens_per_s / (chips * hardware.flops)
    return Report(
        t_compute=t_compute,
        t_weights=t_weights,
        t_kv=t_kv,
        t_comm=t_comm,
        t_hop=t_hop,
        t_stage=t_stage,
        tpot=tpot,
        tokens_per_s=tokens_per_s,
        cost_per_token=cost,
        memory_per_chip=memory,
        mfu=mfu,
        t_overhead=t_overhead,
        t_draft=t_draft,
        tokens_per_step=tokens_per_step,
    )


def _expert_comm(tokens, moe_layers, design, hardware, model, imb, smoothness, passes=1.0):
    """The routed experts' collectives of ``moe_layers`` MoE layers (s): the all-to-all between
    the ``e`` expert-parallel groups, each group's share spread over its ``G/e`` chips' links,
    and, when the experts are split (``Design.expert_parallel`` set), the groups' gathers."""
    g = design.chips
    split = design.expert_parallel is not None
    groups_e = design.expert_parallel if split else g
    t = all_to_all_time(
        tokens * groups_e / g if split else tokens,
        moe_layers,
        groups_e,
        hardware,
        model,
        smoothness,
        dedup=design.get("dispatch_dedup"),
        imbalance=imb,
        passes=passes,
    )
    if split:
        t = t + expert_tensor_parallel_time(
            tokens, moe_layers, g, groups_e, hardware, model, imbalance=imb, passes=passes
        )
    return t


def _draft_comm(design, hardware, model, workload, smoothness):
    """Collectives of one draft pass (s): each of the draft's ``L_d`` layers (an MTP module is a
    layer of the target's kind, sharded like the stage it runs on) pays one target layer's
    attention-layout collectives and, for an MoE model, its experts' all-to-all and gathers, at
    ``B`` tokens (one per sequence)."""
    b, g = design.batch, design.chips
    groups, _ = attention_groups(design, model)
    layer = attention_comm_time(b, 1.0, g, groups, hardware, model)
    imb = expert_imbalance(
        workload,
        b,
        design.get("expert_parallel"),
        model,
        design.get("redundant_experts"),
        smoothness,
    )
    experts = _expert_comm(b, 1.0, design, hardware, model, imb, smoothness)
    layer = jnp.where(model.n_experts > 0, layer + experts, layer)
    return model.draft_layers * layer


def _speculation(design, hardware, model, workload, smoothness):
    """``(tau, t_draft, draft bytes per chip)`` of a decode step with ``k`` draft tokens: the
    draft's passes (``speculative.draft_time``) and their collectives (``_draft_comm``)."""
    b, t, k = design.batch, workload.context, design.get("draft_tokens")
    tau = _accepted_tokens(workload.get("acceptance"), k)
    # no draft (None, v1): no collectives traced either, so such programs stay as small as before
    comm = None
    if design.draft_tokens is not None:
        comm = _draft_comm(design, hardware, model, workload, smoothness)
    t_draft = draft_time(b, t, k, design.chips, hardware, model, smoothness, comm)
    resident = model.bytes_per_param * model.draft_total + b * t * model.draft_kv_bytes_per_token
    draft_memory = jnp.where(k > 0, resident / design.chips, 0.0)
    return tau, t_draft, draft_memory


def decode(
    design: Design,
    hardware: Hardware,
    model: Model,
    workload: Workload,
    smoothness=0.0,
    *,
    engine=None,
) -> Report:
    """One decode step: ``B`` sequences each advance by one token (``tau`` with speculation).

    .. math::
        \\phi(B) = 1 - (1 - k/E)^B

        t_{compute} = B(2N_{active} + aT) / (PGF\\eta_F)

        t_{weights} = b_w(N_{dense} + E n_e \\phi(B)) / (PG\\,BW\\eta_{BW})

        t_{kv} = B T b_{kv} / (PG\\,BW\\eta_{BW})

        t_{stage} = \\max(t_{compute}, t_{weights} + t_{kv}, t_{comm})

        tpot = P t_{stage} + (P-1) t_{hop}, \\quad
        \\text{cost} = PGp/3600 / (PB/tpot)

    Memory per chip is ``b_w N_total/(PG) + B T b_kv / G`` (KV per chip does not shrink with P).

    **v2 terms** (``docs/serving_v2.md``; each off at its default): with ``k_d`` draft tokens the
    verify pass runs ``B' = B(k_d + 1)`` tokens (``B`` in every term above but the KV read, which
    happens once), ``phi(B')``; the routed-expert compute is multiplied by the imbalance ``imb``
    and divided by the grouped matmuls' ``expert_flops_efficiency``, at their own size curve
    ``expert_half_tokens`` where set; the input embedding's
    lookup table (``Model.params_embedding``) is in neither the FLOPs nor the weight read;
    each compute part runs at ``eta(n)`` for its matmul size ``n`` (``matmul_efficiency``);
    weight reads add ``(A-1) N_attn`` for ``A`` data-parallel attention groups holding attention
    whole and ``R n_e phi`` for ``R`` redundant experts; KV is multiplied by ``rep``
    (``kv_replication``); ``t_comm`` adds the attention layout's collectives, and the all-to-all
    de-duplicates and pays latencies; with ``e = Design.expert_parallel`` expert-parallel groups
    (expert tensor parallelism of degree ``G/e`` inside each), the imbalance and the all-to-all
    run over the ``e`` groups and ``t_comm`` adds the groups' gathers
    (``moe.expert_tensor_parallel_time``); ``t_stage`` adds
    ``t_overhead = step_overhead + (layer_overhead + gemm_overhead g) L/P + sequence_overhead
    B/A`` (``g = Model.gemms_per_layer`` dense GEMM kernels a layer; ``A`` attention groups,
    each scheduling its share of the ``B`` sequences) ``+ expert_overhead E phi(B')
    L_moe/(P e)`` (each routed expert the step touches costs its group a small GEMM's launch
    and tile, whatever its tokens) ``+ c_m(e) L_moe/P`` (each MoE layer's routing, sorting and
    combining kernels, ``moe_layer_fixed`` over the ``e`` groups), and ``prefill_step_overhead``
    on the share of steps that admit a new sequence, ``min(1, B tau / T_out)`` with
    ``T_out = Workload.output`` (``admitted_share``: a disaggregated decode pool's steps; none
    when ``T_out`` is 0, the default); and

    .. math:: tpot = (P t_{stage} + (P-1) t_{hop} + t_{draft}) / \\tau(a, k_d)

    Args:
      design: batch ``B``, chips per stage ``G``, stages ``P``, experts ``E`` (None: the model's),
        and the v2 layout fields.
      hardware: the chip.
      model: the network.
      workload: ``context`` is the mean context ``T`` during decode (tokens); ``output``
        ``T_out`` (tokens; 0, the default, for a step that admits no sequence) sets the share
        of steps that admit one (``admitted_share``).
      smoothness: 0 for the exact hard max, in ``(0, 1]`` for the smooth p-norm max
        (``dcost.smooth.MAX_SMOOTHNESS``).
      engine: a ``dcost.Engine`` (``dcost.engine("vllm", hardware=...)``): its measured profile
        replaces the chip's efficiency, overhead and link fields (``Engine.apply``); None: the
        chip as given (pure physics for a plain preset: a bound).

    Returns:
      A ``Report``; ``cost_per_token`` is $ per output token.

    Raises:
      SpecError: a concrete smoothness outside ``[0, 1]``, or inputs whose results overflow the
        float dtype (a report is never ``inf``); traced inputs (under ``jit``) are not checked.

    Jitted (``dcost.serving._jitted``): the first call with a new structure (which optional
    fields are set) traces and compiles; later calls, whatever their numbers, reuse the program.

    >>> import dcost
    >>> h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    >>> r = dcost.decode(dcost.Design(batch=1, chips=8), h, m, dcost.Workload(0))
    >>> bool(r.t_weights > r.t_compute)  # batch 1 is weight-read bound
    True
    """
    check_types("decode", design, hardware, model, workload)
    hardware = on_engine(engine, hardware, model)
    smoothness = smoothness_argument("decode", smoothness)
    report, status = _decode_jit(design, hardware, model, workload, smoothness)
    return checked("decode", report, status, design, workload)


def _decode(design, hardware, model, workload, smoothness) -> Report:
    """``decode`` without its checks (the traced body)."""
    model = with_experts(model, design)
    b, t = design.batch, workload.context
    tokens = b * (1.0 + design.get("draft_tokens"))
    phi = _expert_fraction(tokens, model.n_experts, model.experts_active)
    touched = (model.n_experts + design.get("redundant_experts")) * model.params_per_expert * phi
    tau, t_draft, draft_memory = _speculation(design, hardware, model, workload, smoothness)
    t_att = attended(t, model.attention_topk, smoothness)  # sparse attention reads its top-k
    return _assemble(
        design,
        hardware,
        model,
        workload,
        smoothness,
        tokens=tokens,
        passes=1.0,
        prompt_passes=admitted_share(b, tau, workload.output, smoothness),
        attn_ctx_flops=tokens
        * (model.attn_flops_per_context_token * t_att + model.index_flops_per_context_token * t),
        expert_params_touched=touched,
        kv_bytes=b * (t_att * model.kv_bytes_per_token + t * model.index_bytes_per_token),
        kv_resident_tokens=b * t,
        state_bytes=2.0 * b * model.state_bytes_per_sequence,
        state_sequences=b,
        sequences=b,
        tokens_per_step=tau,
        t_draft=t_draft,
        draft_memory=draft_memory,
        phi_tokens=tokens,
        scheduled=b,
    )


_decode_jit = jitted("decode", _decode)


def admitted_share(batch, tau, output, smoothness=0.0):
    """The share of a decode pool's steps that admit a new sequence:
    ``s = min(1, B tau / T_out)`` (0 when ``T_out = 0``).

    In steady state ``B`` running sequences of ``T_out`` output tokens, ``tau`` a step, finish
    (and are replaced) at ``B tau / T_out`` sequences a step; at most every step admits. A
    disaggregated decode engine runs a step that admits a sequence whose KV its prefill pool
    sent as a step with prompt tokens (vLLM's connector computes the prompt's last token there,
    out of the full CUDA graph; SGLang runs the admitted sequences as a prebuilt extend
    batch), so such a step pays ``prefill_step_overhead``: ``decode`` charges it ``s`` times a
    step. Little's law (Little, Operations Research 9(3), 1961) gives the rate.

    >>> round(float(admitted_share(64.0, 1.0, 1024.0)), 4), float(admitted_share(8.0, 1.0, 0.0))
    (0.0625, 0.0)
    """
    rate = safe_div(batch * tau, output)  # 0 where T_out is 0
    # rate / max(rate, 1) = min(rate, 1), smooth and finite at rate 0 (smax drops a zero term)
    return rate / smax([rate, jnp.ones_like(rate)], smoothness)


def prefill(
    design: Design,
    hardware: Hardware,
    model: Model,
    workload: Workload,
    smoothness=0.0,
    *,
    engine=None,
) -> PrefillReport:
    """One prefill step: ``B`` sequences of ``T_in`` prompt tokens each.

    .. math::
        t_{compute} = B T_{in}(2N_{active} + a T_{in}/2) / (PGF\\eta_F)

        t_{weights} = b_w N_{total} / (PG\\,BW\\eta_{BW}) \\quad (\\phi = 1)

        t_{kv} = B T_{in} b_{kv} / (PG\\,BW\\eta_{BW}) \\quad \\text{(written)}

    with the same all-to-all per token as decode. Returns a ``PrefillReport``: ``ttft`` is the
    time of the whole pass (the time to first token), ``tokens_per_s`` counts input tokens and
    ``cost_per_token`` is $ per input token.

    **v2 terms** (``docs/serving_v2.md``): attention FLOPs use ``a_pf``
    (``Model.prefill_attn_flops``: MLA's non-absorbed form); with ``prefill_chunk = C`` the
    prompt runs in ``n_c = max(T_in/C, 1)`` passes (``chunks``), each reading the weights once
    and the KV its earlier chunks wrote, ``B b_kv T_in (n_c - 1)/2`` bytes in all, and each
    paying the overheads and message latencies; the rest as in ``decode``. The terms are summed
    over the passes before the roofline (the chunks are alike but for their KV reads).

    >>> import dcost
    >>> h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    >>> r = dcost.prefill(dcost.Design(batch=1, chips=8), h, m, dcost.Workload(4096))
    >>> bool(r.t_compute > r.t_weights)  # a long prompt is compute bound
    True
    """
    check_types("prefill", design, hardware, model, workload)
    hardware = on_engine(engine, hardware, model)
    smoothness = smoothness_argument("prefill", smoothness)
    report, status = _prefill_jit(design, hardware, model, workload, smoothness)
    return checked("prefill", report, status, design, workload, _PREFILL_NEEDS)


def _prefill(design, hardware, model, workload, smoothness) -> PrefillReport:
    """``prefill`` without its checks (the traced body)."""
    model = with_experts(model, design)
    b, t_in = design.batch, workload.prompt
    tokens = b * t_in
    n_c = chunks(t_in, design.get("prefill_chunk"), smoothness)
    b_kv = model.kv_bytes_per_token + model.index_bytes_per_token  # written, and read by chunks
    kv_bytes = tokens * b_kv + (b * b_kv * t_in * (n_c - 1.0) / 2.0)
    one = jnp.ones_like(tokens)
    r = _assemble(
        design,
        hardware,
        model,
        workload,
        smoothness,
        tokens=tokens,
        passes=n_c,
        attn_ctx_flops=tokens
        * (
            model.prefill_attn_flops * prefill_attended(t_in, model.attention_topk, smoothness)
            + model.index_flops_per_context_token * t_in / 2.0
        ),
        expert_params_touched=(model.n_experts + design.get("redundant_experts"))
        * model.params_per_expert,
        kv_bytes=kv_bytes,
        kv_resident_tokens=tokens,
        # each chunk reads the state the last one left (the first starts from zero) and writes it
        state_bytes=b * model.state_bytes_per_sequence * (2.0 * n_c - 1.0),
        state_sequences=b,
        sequences=tokens,
        tokens_per_step=one,
        t_draft=0.0 * one,
        draft_memory=0.0 * one,
        phi_tokens=tokens / n_c,
        scheduled=b,
        prompt_passes=n_c,
    )
    fields = {k: getattr(r, k) for k in PrefillReport.__dataclass_fields__ if k != "ttft"}
    return PrefillReport(ttft=r.tpot, **fields)


_PREFILL_NEEDS = ("prompt",)  # a prefill needs a prompt (checked with the result: one read)
_prefill_jit = jitted("prefill", _prefill, _PREFILL_NEEDS)


def bottleneck(report: Report | PrefillReport):
    """Name of the binding term of each step: "compute", "memory" or "comm" (a NumPy string array).

    >>> import dcost
    >>> h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-8b")
    >>> str(dcost.bottleneck(dcost.decode(dcost.Design(batch=1), h, m, dcost.Workload(0))))
    'memory'
    """
    import numpy as np

    if not isinstance(report, (Report, PrefillReport)):
        raise SpecError(
            f"bottleneck.report must be a dcost Report or PrefillReport (what decode, prefill "
            f"and mixed_step return), got {type(report).__name__} {report!r}"
        )
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

    .. math:: B^* = \\frac{b_w (N_{total} - N_{emb}) F}{(2(N_{active} - N_{emb}) + aT)\\,BW
              - T b_{kv} F}

    (``N_emb`` the input-embedding lookup tables, ``Model.params_embedding``: read by row and
    multiplied by no token, so in neither the FLOPs nor the weight read.) With linear attention
    a sequence also reads and writes its state and computes its recurrence (``2 sigma`` bytes,
    ``phi_s`` FLOPs: ``Model.state_bytes_per_sequence``, ``state_flops_per_token``), and with
    sparse attention it attends to ``T_att = min(T, k)`` tokens and its indexer reads every
    token's key (``b_I``, ``a_I``): the denominator is ``(2(N_active - N_emb) + a T_att + a_I T +
    phi_s) BW - (T_att b_kv + T b_I + 2 sigma) F``, as ``decode`` charges them.

    ``inf`` when the denominator is <= 0 (KV reads outgrow compute: no batch is compute bound).
    At ``T = 0``: ``B* = (F/BW) (b_w/2) (N_total - N_emb)/(N_active - N_emb)``, about 300 x
    sparsity in bf16.

    Args:
      hardware: the chip (achievable F and BW are used).
      model: the network.
      context: mean context ``T`` (tokens, >= 0).

    Returns:
      ``B*`` (sequences).

    >>> import dcost
    >>> round(float(dcost.balance_batch(dcost.hardware("h100-sxm"), dcost.model("llama-3-70b"))))
    295
    """
    if not (type(context) in (float, int) and 0.0 <= context <= _FLOAT32_MAX):  # NaN fails
        check("balance_batch", "context", context)
    if (
        isinstance(context, (int, float, np.generic))
        or np.shape(context) == ()
        and isinstance(context, np.ndarray)
    ):
        context = float(context)  # one program for 0, 0.0 and NumPy scalars
    return _balance_batch(hardware, model, context)


@jax.jit
def _balance_batch(hardware: Hardware, model: Model, context):
    f, bw = _rates(hardware)
    t = jnp.asarray(context, dtype=jnp.result_type(float))
    t_att = attended(t, model.attention_topk)
    compute = (
        2.0 * model.params_active_multiplied
        + model.attn_flops_per_context_token * t_att
        + model.index_flops_per_context_token * t
        + model.state_flops_per_token
    )
    reads = (
        t_att * model.kv_bytes_per_token
        + t * model.index_bytes_per_token
        + 2.0 * model.state_bytes_per_sequence
    )
    den = compute * bw - reads * f
    num = model.bytes_per_param * (model.params_total - model.params_embedding) * f
    pos = den > 0
    return jnp.where(pos, num / jnp.where(pos, den, 1.0), jnp.inf)


def critical_context(hardware: Hardware, model: Model):
    """Context at which the KV-read slope equals the compute slope of decode (tokens).

    .. math:: T_c = \\frac{2 (N_{active} - N_{emb}) BW}{b_{kv} F - a\\,BW}

    Beyond ``T_c`` a longer context costs more memory time than compute time per token, so no batch
    size makes decode compute bound. ``inf`` when ``b_kv F <= a BW``.

    With a linear-attention state (``2 sigma`` bytes and ``phi_s`` FLOPs a sequence, as
    ``balance_batch``) the numerator is ``(2(N_active - N_emb) + phi_s) BW - 2 sigma F``, and 0
    when that is <= 0 (the state alone keeps decode memory bound); with sparse attention of
    top-k ``k`` the indexer's ``b_I``, ``a_I`` join ``b_kv``, ``a`` below ``k``, and past ``k`` only
    they grow: ``T_c = ((2(N_active - N_emb) + phi_s + a k) BW - (2 sigma + k b_kv) F) /
    (b_I F - a_I BW)``.

    >>> import dcost
    >>> tc = dcost.critical_context(dcost.hardware("h100-sxm"), dcost.model("llama-3-70b"))
    >>> 500 < float(tc) < 2000
    True
    """
    return _critical_context(hardware, model)


@jax.jit
def _critical_context(hardware: Hardware, model: Model):
    f, bw = _rates(hardware)
    a, b_kv = model.attn_flops_per_context_token, model.kv_bytes_per_token
    a_i, b_i, k = (
        model.index_flops_per_context_token,
        model.index_bytes_per_token,
        model.attention_topk,
    )
    fixed = (2.0 * model.params_active_multiplied + model.state_flops_per_token) * bw - (
        2.0 * model.state_bytes_per_sequence * f
    )

    def crossing(num, den):  # where num - T den = 0: inf if the reads never outgrow the compute
        pos = den > 0
        return jnp.where(pos, jnp.maximum(num, 0.0) / jnp.where(pos, den, 1.0), jnp.inf)

    below = crossing(fixed, (b_kv + b_i) * f - (a + a_i) * bw)  # every token attended
    past = crossing(fixed + k * (a * bw - b_kv * f), b_i * f - a_i * bw)  # the top k attended
    return jnp.where((k > 0) & (below > k), past, below)


def _rates(hardware: Hardware):
    """Achievable ``(F, BW)`` of the closed forms (a function of its own: the trace-count tests
    count its calls)."""
    return hardware.flops_achieved, hardware.bandwidth_achieved
