"""The inputs of every cost model: hardware, model, workload and design, as frozen pytrees.

Every numeric field is a float leaf (SI units: s, bytes, FLOP, FLOP/s, bytes/s, $), so a spec can be
differentiated with ``jax.grad`` and a batch of specs is the same class with array fields under
``jax.vmap``. Values are checked when a spec is built from concrete numbers: a bad field raises
``ValueError`` naming the field, the value and what is allowed. Inside ``jit`` (traced fields) the
checks are skipped; specs built outside and passed in were already checked.
"""

from __future__ import annotations

import math
from typing import ClassVar

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

__all__ = ["Hardware", "Model", "Workload", "Design", "SpecError"]


class SpecError(ValueError):
    """A spec field holds a value the model cannot use."""


def _float(x):
    """Converter: Python/NumPy numbers become JAX float arrays; tracers pass through.

    The result is always strongly typed (never a weak-typed Python-float array), so ``64`` and
    ``64.0`` give leaves of the same abstract value and a jitted cost function is not recompiled.
    """
    if x is None:
        return None
    if isinstance(x, jax.core.Tracer):
        return x
    if not isinstance(x, jax.Array):
        x = np.asarray(x)  # a Python int above 2**31 (70_000_000_000) must not pass through int32
        if not np.issubdtype(x.dtype, np.floating):
            x = x.astype(float)
    arr = jnp.asarray(x)
    dtype = arr.dtype if jnp.issubdtype(arr.dtype, jnp.floating) else jnp.result_type(float)
    return jnp.asarray(arr, dtype=dtype)


def _concrete(x):
    """The value as a NumPy array, or None when it is traced (inside jit/grad/vmap)."""
    if x is None or isinstance(x, jax.core.Tracer):
        return None
    try:
        return np.asarray(x, dtype=float)
    except (TypeError, jax.errors.ConcretizationTypeError):  # pragma: no cover - defensive
        return None


def _show(v: np.ndarray) -> str:
    if v.ndim == 0:
        return repr(float(v))
    return f"array of shape {v.shape} with {v.ravel()[:3].tolist()}..."


def check(owner: str, name: str, x, *, low=0.0, low_open=False, high=None, integer=False):
    """Raise SpecError unless every element of ``x`` is finite and within the allowed range.

    Args:
      owner: class name used in the message, e.g. "Hardware".
      name: the field name.
      x: the value (skipped when traced).
      low: smallest allowed value.
      low_open: True when ``low`` itself is not allowed (strictly positive fields).
      high: largest allowed value, or None.
      integer: True when the value must be a whole number (reported, never rounded).
    """
    v = _concrete(x)
    if v is None:
        return
    allowed = f"{'>' if low_open else '>='} {low:g}"
    if high is not None:
        allowed += f" and <= {high:g}"
    if integer:
        allowed = "a whole number " + allowed
    bad = ~np.isfinite(v)
    bad |= (v <= low) if low_open else (v < low)
    if high is not None:
        bad |= v > high
    if integer:
        bad |= np.isfinite(v) & (v != np.round(v))
    if np.any(bad):
        first = v[bad].ravel()[0] if v.ndim else v
        raise SpecError(
            f"{owner}.{name} = {_show(np.asarray(first))} is not allowed: "
            f"it must be finite and {allowed}"
        )


def _get(self, name):
    """The field ``name``, or its "off" value from ``OFF`` when it is None (v2 fields)."""
    value = getattr(self, name)
    return self.OFF[name] if value is None else value


class Hardware(eqx.Module):
    """One accelerator chip and the networks around it (per-chip figures, SI units).

    Attributes:
      flops: peak dense FLOP/s at the serving precision ``F`` (never the 2:4-sparse headline).
      hbm_bandwidth: HBM bytes/s ``BW``.
      hbm_capacity: HBM bytes ``M``.
      scaleup_bandwidth: scale-up (NVLink / ICI) bytes/s per chip, one direction ``U``.
      scaleout_bandwidth: scale-out (NIC) bytes/s per chip, one direction ``O``.
      scaleup_size: chips in one scale-up domain ``S`` (8 for an HGX box, 72 for GB200 NVL72).
      price_per_hour: $ per chip-hour ``p``.
      flops_efficiency: achievable fraction of ``flops`` ``eta_F`` (1 = pure roofline).
      bandwidth_efficiency: achievable fraction of ``hbm_bandwidth`` ``eta_BW``.

    Serving model v2 (``docs/serving_v2.md``). Each defaults to None, which switches its term
    off (the value in ``OFF``, returned by ``.get(name)``), giving v1; a None is no leaf, so a
    vmap over specs built with array fields is unchanged:

    Attributes:
      step_overhead: fixed time of every stage step (scheduler, sampling, launches) (s, 0).
      layer_overhead: kernel-launch and synchronisation time per layer per step; a stage step pays
        ``layer_overhead * L/P`` (s, 0).
      scaleup_latency: per-message latency ``alpha`` of a scale-up link (s, 0).
      scaleout_latency: per-message latency ``alpha`` of a scale-out link (s, 0).
      scaleup_efficiency: achieved fraction of ``scaleup_bandwidth`` (1).
      scaleout_efficiency: achieved fraction of ``scaleout_bandwidth`` (1).
      matmul_half_tokens: tokens through one weight matrix at which a matmul reaches half of
        ``flops_achieved``: ``eta(n) = eta_F * n/(n + n_half)`` (tokens, 0 = always ``eta_F``).

    >>> import dcost
    >>> h = dcost.Hardware(989e12, 3.35e12, 80e9, 450e9, 50e9, 8, 2.5)
    >>> round(float(h.flops / h.hbm_bandwidth))
    295
    """

    flops: jax.Array = eqx.field(converter=_float)
    hbm_bandwidth: jax.Array = eqx.field(converter=_float)
    hbm_capacity: jax.Array = eqx.field(converter=_float)
    scaleup_bandwidth: jax.Array = eqx.field(converter=_float)
    scaleout_bandwidth: jax.Array = eqx.field(converter=_float)
    scaleup_size: jax.Array = eqx.field(converter=_float)
    price_per_hour: jax.Array = eqx.field(converter=_float)
    flops_efficiency: jax.Array = eqx.field(default=1.0, converter=_float)
    bandwidth_efficiency: jax.Array = eqx.field(default=1.0, converter=_float)
    step_overhead: jax.Array | None = eqx.field(default=None, converter=_float)
    layer_overhead: jax.Array | None = eqx.field(default=None, converter=_float)
    scaleup_latency: jax.Array | None = eqx.field(default=None, converter=_float)
    scaleout_latency: jax.Array | None = eqx.field(default=None, converter=_float)
    scaleup_efficiency: jax.Array | None = eqx.field(default=None, converter=_float)
    scaleout_efficiency: jax.Array | None = eqx.field(default=None, converter=_float)
    matmul_half_tokens: jax.Array | None = eqx.field(default=None, converter=_float)

    OFF: ClassVar[dict] = {
        "step_overhead": 0.0,
        "layer_overhead": 0.0,
        "scaleup_latency": 0.0,
        "scaleout_latency": 0.0,
        "scaleup_efficiency": 1.0,
        "scaleout_efficiency": 1.0,
        "matmul_half_tokens": 0.0,
    }
    get = _get

    def __check_init__(self):
        for name in (
            "step_overhead",
            "layer_overhead",
            "scaleup_latency",
            "scaleout_latency",
            "matmul_half_tokens",
        ):
            check("Hardware", name, getattr(self, name))
        for name in ("scaleup_efficiency", "scaleout_efficiency"):
            check("Hardware", name, getattr(self, name), low_open=True, high=1.0)
        for name in (
            "flops",
            "hbm_bandwidth",
            "hbm_capacity",
            "scaleup_bandwidth",
            "scaleout_bandwidth",
        ):
            check("Hardware", name, getattr(self, name), low_open=True)
        check("Hardware", "scaleup_size", self.scaleup_size, low=1.0)
        check("Hardware", "price_per_hour", self.price_per_hour)
        for name in ("flops_efficiency", "bandwidth_efficiency"):
            check("Hardware", name, getattr(self, name), low_open=True, high=1.0)

    @property
    def flops_achieved(self):
        """Achievable FLOP/s, ``F * eta_F``."""
        return self.flops * self.flops_efficiency

    @property
    def bandwidth_achieved(self):
        """Achievable HBM bytes/s, ``BW * eta_BW``."""
        return self.hbm_bandwidth * self.bandwidth_efficiency

    @property
    def scaleup_achieved(self):
        """Achieved scale-up bytes/s per chip, ``U * scaleup_efficiency``."""
        return self.scaleup_bandwidth * self.get("scaleup_efficiency")

    @property
    def scaleout_achieved(self):
        """Achieved scale-out bytes/s per chip, ``O * scaleout_efficiency``."""
        return self.scaleout_bandwidth * self.get("scaleout_efficiency")


class Model(eqx.Module):
    """A transformer, dense or Mixture-of-Experts, as the cost model sees it.

    ``N_total = N_dense + E*n_e`` and ``N_active = N_dense + k*n_e``. A dense model has
    ``n_experts = experts_active = params_per_expert = 0``.

    Attributes:
      n_layers: transformer blocks ``L``.
      d_model: residual width ``d``.
      params_dense: parameters every token uses ``N_dense`` (attention, embeddings, dense MLPs,
        shared experts).
      params_per_expert: parameters of one routed expert summed over all MoE layers ``n_e``.
      n_experts: routed experts per MoE layer ``E`` (0 for a dense model).
      experts_active: routed experts each token uses ``k``.
      kv_bytes_per_token: KV-cache bytes per token over all layers ``b_kv``.
      bytes_per_param: bytes per weight ``b_w`` (2 for bf16, 1 for fp8).
      attn_flops_per_context_token: attention FLOPs per (token x context token) ``a``; for plain
        attention ``4*L*n_heads*d_head``.
      act_bytes: bytes per activation element ``b_a`` (what all-to-all and pipeline hops move).
      n_moe_layers: MoE layers ``L_moe``; None: every layer for an MoE model, 0 for a dense one.

    Serving model v2 (``docs/serving_v2.md``). Each is a float leaf whose default 0 switches
    its term off, giving v1 (presets set them all, so presets and hand-built models stack into
    one batched ``Model``):

    Attributes:
      params_attention: attention parameters over all layers ``N_attn`` (part of
        ``params_dense``); data-parallel attention holds them whole on every chip (0).
      kv_heads: KV heads per layer ``h_kv``; tensor-parallel attention of degree ``t`` holds the
        KV cache ``t/min(t, h_kv)`` times (MLA: 1 latent head). 0: splits over any number of
        chips (v1).
      prefill_attn_flops_per_context_token: attention FLOPs per (token x context token) of a
        prefill ``a_pf`` (MLA runs its non-absorbed form there); 0: ``a``.
      max_domains_per_token: most scale-up domains a token's experts may span ``M``
        (node-limited routing, DeepSeek-V3 report section 2.1.2); 0: unlimited.
      draft_params: parameters one draft pass computes with per token (speculative decoding:
        a draft model's active parameters, or an MTP module's) ``N_draft`` (0).
      draft_params_total: the draft's parameters held in memory ``N_draft,total``; those beyond
        ``draft_params`` are routed experts with the model's ``E, k`` routing (an MTP module);
        0: ``draft_params``.
      draft_layers: transformer layers of one draft pass (each pays ``layer_overhead`` and
        attention of ``a/L`` FLOPs per context token) (0).
      draft_kv_bytes_per_token: the draft's KV-cache bytes per token (0).

    >>> import dcost
    >>> m = dcost.Model(2, 8, 100.0, 10.0, 8, 2, 64.0, 2.0)
    >>> float(m.params_total), float(m.params_active), float(m.sparsity)
    (180.0, 120.0, 1.5)
    """

    n_layers: jax.Array = eqx.field(converter=_float)
    d_model: jax.Array = eqx.field(converter=_float)
    params_dense: jax.Array = eqx.field(converter=_float)
    params_per_expert: jax.Array = eqx.field(converter=_float)
    n_experts: jax.Array = eqx.field(converter=_float)
    experts_active: jax.Array = eqx.field(converter=_float)
    kv_bytes_per_token: jax.Array = eqx.field(converter=_float)
    bytes_per_param: jax.Array = eqx.field(converter=_float)
    attn_flops_per_context_token: jax.Array = eqx.field(default=0.0, converter=_float)
    act_bytes: jax.Array = eqx.field(default=2.0, converter=_float)
    n_moe_layers: jax.Array | None = eqx.field(default=None, converter=_float)
    params_attention: jax.Array = eqx.field(default=0.0, converter=_float)
    kv_heads: jax.Array = eqx.field(default=0.0, converter=_float)
    prefill_attn_flops_per_context_token: jax.Array = eqx.field(default=0.0, converter=_float)
    max_domains_per_token: jax.Array = eqx.field(default=0.0, converter=_float)
    draft_params: jax.Array = eqx.field(default=0.0, converter=_float)
    draft_params_total: jax.Array = eqx.field(default=0.0, converter=_float)
    draft_layers: jax.Array = eqx.field(default=0.0, converter=_float)
    draft_kv_bytes_per_token: jax.Array = eqx.field(default=0.0, converter=_float)

    get = _get  # every v2 field of a Model is a float leaf: ``get`` is plain attribute access

    def __check_init__(self):
        check("Model", "n_layers", self.n_layers, low_open=True)
        check("Model", "d_model", self.d_model, low_open=True)
        check("Model", "params_dense", self.params_dense, low_open=True)
        for name in (
            "params_per_expert",
            "n_experts",
            "experts_active",
            "kv_bytes_per_token",
            "attn_flops_per_context_token",
        ):
            check("Model", name, getattr(self, name))
        check("Model", "bytes_per_param", self.bytes_per_param, low_open=True)
        check("Model", "act_bytes", self.act_bytes, low_open=True)
        if self.n_moe_layers is not None:
            check("Model", "n_moe_layers", self.n_moe_layers, high=_max_or_none(self.n_layers))
        e, k, ne = (
            _concrete(v) for v in (self.n_experts, self.experts_active, self.params_per_expert)
        )
        if e is not None and k is not None and np.any(k > e):
            raise SpecError(
                f"Model.experts_active = {_show(k)} is not allowed: it must be <= n_experts "
                f"({_show(e)})"
            )
        if e is not None and k is not None and ne is not None:
            moe = e > 0
            if np.any(moe & (k <= 0)):
                raise SpecError(
                    "Model.experts_active = 0 is not allowed for an MoE model "
                    "(n_experts > 0): it must be >= 1"
                )
            if np.any(moe & (ne <= 0)):
                raise SpecError(
                    "Model.params_per_expert = 0 is not allowed for an MoE model "
                    "(n_experts > 0): it must be > 0"
                )
            if np.any(~moe & ((k > 0) | (ne > 0))):
                raise SpecError(
                    "a dense model (Model.n_experts = 0) must have experts_active = 0 "
                    "and params_per_expert = 0"
                )
        self._check_v2()

    def _check_v2(self):
        for name in (
            "kv_heads",
            "max_domains_per_token",
            "draft_params",
            "draft_layers",
            "draft_kv_bytes_per_token",
        ):
            check("Model", name, getattr(self, name))
        check(
            "Model", "params_attention", self.params_attention, high=_max_or_none(self.params_dense)
        )
        check(
            "Model",
            "prefill_attn_flops_per_context_token",
            self.prefill_attn_flops_per_context_token,
        )
        check("Model", "draft_params_total", self.draft_params_total)
        total, active = _concrete(self.draft_params_total), _concrete(self.draft_params)
        if total is not None and active is not None:
            total, active = np.broadcast_arrays(total, active)
            bad = (total > 0) & (total < active)
            if np.any(bad):
                raise SpecError(
                    f"Model.draft_params_total = {_show(total[bad].ravel()[0])} is not allowed: "
                    f"it must be 0 (= draft_params) or >= draft_params "
                    f"({_show(active[bad].ravel()[0])})"
                )

    @property
    def moe_layers(self):
        """``L_moe``: ``n_moe_layers`` if given, else ``L`` for an MoE model, 0 for a dense one."""
        if self.n_moe_layers is not None:
            return self.n_moe_layers
        return jnp.where(self.n_experts > 0, self.n_layers, 0.0)

    @property
    def params_total(self):
        """``N_total = N_dense + E*n_e`` (parameters)."""
        return self.params_dense + self.n_experts * self.params_per_expert

    @property
    def params_active(self):
        """``N_active = N_dense + k*n_e`` (parameters a token uses)."""
        return self.params_dense + self.experts_active * self.params_per_expert

    @property
    def sparsity(self):
        """``N_total / N_active`` (1 for a dense model)."""
        return self.params_total / self.params_active

    @property
    def prefill_attn_flops(self):
        """``a_pf``: ``prefill_attn_flops_per_context_token`` when > 0, else ``a`` (FLOP)."""
        a_pf = self.prefill_attn_flops_per_context_token
        return jnp.where(a_pf > 0, a_pf, self.attn_flops_per_context_token)

    @property
    def draft_total(self):
        """``N_draft,total``: ``draft_params_total`` when > 0, else ``draft_params`` (params)."""
        return jnp.where(self.draft_params_total > 0, self.draft_params_total, self.draft_params)


def _max_or_none(x, largest=False):
    """The smallest (``largest``: the largest) element of a concrete ``x``, None when traced."""
    v = _concrete(x)
    if v is None:
        return None
    return float(np.max(v)) if largest else float(np.min(v))


class Workload(eqx.Module):
    """What the model is asked to do, in tokens.

    Attributes:
      context: mean context length during decode ``T`` (prompt plus half the output, typically).
      prompt: prompt length ``T_in`` (default: ``context``).
      output: output length ``T_out`` (default: 0 tokens).
      acceptance: probability ``a`` that a draft token is accepted (speculative decoding; 0).
      expert_imbalance: tokens on the busiest chip's experts over the mean, applied to the
        routed-expert compute and all-to-all bytes: None or 1.0 balanced (v1), a number >= 1
        that factor, ``"multinomial"`` the expected maximum under multinomial routing
        (``dcost.serving.moe.expected_max_load``), stored as 0 (``MULTINOMIAL``) so that it
        stays a float leaf.

    The v2 fields default to None, which means "off" (``Workload.OFF`` holds the value used;
    ``w.get(name)`` returns it): a None is no leaf, so a vmap over specs built with array fields
    is unchanged.

    >>> import dcost
    >>> float(dcost.Workload(4096).prompt)
    4096.0
    """

    context: jax.Array = eqx.field(converter=_float)
    prompt: jax.Array = eqx.field(default=None, converter=_float)
    output: jax.Array = eqx.field(default=None, converter=_float)
    acceptance: jax.Array | None = eqx.field(default=None, converter=_float)
    expert_imbalance: jax.Array | None = eqx.field(default=None, converter=_float)

    OFF: ClassVar[dict] = {"acceptance": 0.0, "expert_imbalance": 1.0}

    def __init__(self, context, prompt=None, output=None, acceptance=None, expert_imbalance=None):
        self.context = context
        self.prompt = context if prompt is None else prompt
        self.output = 0.0 if output is None else output
        self.acceptance = acceptance
        if isinstance(expert_imbalance, str):
            if expert_imbalance != "multinomial":
                raise SpecError(
                    f"Workload.expert_imbalance = {expert_imbalance!r} is not allowed: it must "
                    "be a number >= 1, 0 or 'multinomial' (expected maximum), or None (balanced)"
                )
            expert_imbalance = MULTINOMIAL
        self.expert_imbalance = expert_imbalance

    get = _get

    def __check_init__(self):
        for name in ("context", "prompt", "output"):
            check("Workload", name, getattr(self, name))
        check("Workload", "acceptance", self.acceptance, high=1.0)
        v = _concrete(self.expert_imbalance)
        if v is not None:
            check("Workload", "expert_imbalance", self.expert_imbalance)
            bad = (v > 0) & (v < 1)
            if np.any(bad):
                raise SpecError(
                    f"Workload.expert_imbalance = {_show(v[bad].ravel()[0] if v.ndim else v)} "
                    "is not allowed: it must be >= 1, or 0 ('multinomial')"
                )


class Design(eqx.Module):
    """What the optimizer chooses: a serving (or training) layout.

    Attributes:
      batch: sequences per micro-batch ``B`` (>= 1).
      chips: chips per pipeline stage ``G`` (>= 1).
      stages: pipeline stages ``P`` (>= 1); chips per replica ``P*G``.
      experts: routed experts ``E``; None keeps the model's own.
      overtrain: over-training ratio ``r = D / (20 N_active)``; None where it does not apply.
      attention_dp: data-parallel attention groups per stage ``A`` in ``[1, G]``; attention is
        tensor parallel of degree ``G/A`` inside each group. None: v1's convention (MoE: data
        parallel, ``A = G``, without the cost of holding attention weights whole; dense: tensor
        parallel, ``A = 1``).
      dispatch_dedup: 1 sends a token once per destination scale-up domain (and to at most
        ``max_domains_per_token``), 0 each of its ``k`` copies (v1); between: that mix (0).
      redundant_experts: extra expert replicas per MoE layer ``R`` (EPLB; 0).
      draft_tokens: speculative length ``k_d``: draft tokens verified per step (0).
      prefill_chunk: chunked prefill: prompt tokens of one sequence per pass ``C``; 0: the whole
        prompt in one pass (v1).

    Fields are floats so that a relaxed design can be differentiated; the exact model is meant for
    whole numbers, which ``dcost.optimize`` and ``dcost.grid_search`` return.

    >>> import dcost
    >>> d = dcost.Design(batch=64, chips=8)
    >>> float(d.batch * d.chips * d.stages)
    512.0
    """

    batch: jax.Array = eqx.field(converter=_float)
    chips: jax.Array = eqx.field(default=1.0, converter=_float)
    stages: jax.Array = eqx.field(default=1.0, converter=_float)
    experts: jax.Array | None = eqx.field(default=None, converter=_float)
    overtrain: jax.Array | None = eqx.field(default=None, converter=_float)
    attention_dp: jax.Array | None = eqx.field(default=None, converter=_float)
    dispatch_dedup: jax.Array | None = eqx.field(default=None, converter=_float)
    redundant_experts: jax.Array | None = eqx.field(default=None, converter=_float)
    draft_tokens: jax.Array | None = eqx.field(default=None, converter=_float)
    prefill_chunk: jax.Array | None = eqx.field(default=None, converter=_float)

    OFF: ClassVar[dict] = {
        "dispatch_dedup": 0.0,
        "redundant_experts": 0.0,
        "draft_tokens": 0.0,
        "prefill_chunk": 0.0,
    }
    get = _get

    def __check_init__(self):
        if self.attention_dp is not None:
            check("Design", "attention_dp", self.attention_dp, low=1.0)
            a, g = _concrete(self.attention_dp), _concrete(self.chips)
            if a is not None and g is not None:
                a, g = np.broadcast_arrays(a, g)
                bad = a > g
                if np.any(bad):
                    raise SpecError(
                        f"Design.attention_dp = {_show(a[bad].ravel()[0])} is not allowed: it "
                        f"must be <= chips ({_show(g[bad].ravel()[0])})"
                    )
        check("Design", "dispatch_dedup", self.dispatch_dedup, high=1.0)
        check("Design", "redundant_experts", self.redundant_experts)
        check("Design", "draft_tokens", self.draft_tokens)
        check("Design", "prefill_chunk", self.prefill_chunk)
        check("Design", "batch", self.batch, low=1.0)
        check("Design", "chips", self.chips, low=1.0)
        check("Design", "stages", self.stages, low=1.0)
        if self.experts is not None:
            check("Design", "experts", self.experts, low=1.0)
        if self.overtrain is not None:
            check("Design", "overtrain", self.overtrain, low_open=True)


def with_experts(model: Model, design: Design) -> Model:
    """The model with ``design.experts`` routed experts (unchanged when the design leaves it None).

    Raises SpecError when a concrete expert count is below ``experts_active``, or when the model
    is dense (``experts_active = 0``): it has no routed experts to count.
    """
    if design.experts is None:
        return model
    e, k = _concrete(design.experts), _concrete(model.experts_active)
    if e is not None and k is not None and np.any(k <= 0):
        raise SpecError(
            f"Design.experts = {_show(e)} is not allowed for a dense model "
            "(Model.experts_active = 0): leave it None"
        )
    if e is not None and k is not None and np.any(e < k):
        raise SpecError(
            f"Design.experts = {_show(e)} is not allowed: it must be >= the model's "
            f"experts_active ({_show(k)})"
        )
    return eqx.tree_at(lambda m: m.n_experts, model, design.experts)


INF = math.inf
MULTINOMIAL = 0.0
"""``Workload.expert_imbalance`` value meaning "expected maximum under multinomial routing"."""
