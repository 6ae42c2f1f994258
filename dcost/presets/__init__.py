"""Hardware and model presets, read from the TOML files beside this module.

Every number in ``hardware.toml`` and ``models.toml`` carries the public source it comes from.
Hardware figures are stored in SI units per chip. Models are stored as their published
architecture (layers, widths, heads, experts); parameter counts and KV bytes per token are derived
here, and ``tests/test_presets.py`` checks the derived counts against the published ones.
"""

from __future__ import annotations

import functools
import tomllib
from importlib import resources

from dcost.specs import Hardware, Model, check_flag

__all__ = [
    "hardware",
    "with_calibration_profile",
    "architectures",
    "model",
    "pair",
    "serving_hardware",
    "precisions",
    "serving_precision",
    "hardware_names",
    "model_names",
    "hardware_card",
    "model_card",
    "derive_model",
    "derive_draft",
    "bytes_per_element",
    "PresetError",
    "PRECISIONS",
    "BYTES_PER_ELEMENT",
]

_HARDWARE_FIELDS = (
    "flops",
    "hbm_bandwidth",
    "hbm_capacity",
    "scaleup_bandwidth",
    "scaleout_bandwidth",
    "scaleup_size",
    "price_per_hour",
)
# The chip's power (W), where its card gives it (``dcost.serving.power``).
_POWER_FIELDS = ("idle_power", "max_power")


class PresetError(KeyError, ValueError):
    """An unknown preset name; the message lists the known ones."""

    def __str__(self):  # KeyError quotes its message; show it plainly
        return str(self.args[0])


@functools.cache
def _load(kind: str) -> dict:
    text = resources.files(__name__).joinpath(f"{kind}.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def _value(entry):
    """A preset number is either a bare number or a table ``{value = ..., source = "..."}``."""
    return entry["value"] if isinstance(entry, dict) else entry


def hardware_names() -> list[str]:
    """Names of the hardware presets."""
    return sorted(_load("hardware"))


def model_names() -> list[str]:
    """Names of the model presets."""
    return sorted(_load("models"))


def _lookup(kind: str, name: str) -> dict:
    table = _load(kind)
    if name not in table:
        known = ", ".join(sorted(table))
        raise PresetError(f"unknown {kind} preset {name!r}; known: {known}")
    return table[name]


def hardware_card(name: str) -> dict:
    """The raw preset entry (numbers with their sources) for hardware ``name``."""
    return _lookup("hardware", name)


def model_card(name: str) -> dict:
    """The raw preset entry (architecture, published counts, sources) for model ``name``."""
    return _lookup("models", name)


# Matmul precisions a preset may list: "bf16" is ``flops``; each other has its own field
# ``flops_<precision>`` (dense rate, no 2:4 sparsity).
PRECISIONS = ("bf16", "fp8", "int8", "fp4")


# Storage bytes per element of each number format, block scales included:
# - bf16/fp16 2, fp8 (E4M3/E5M2) and int8 1, int4 and plain fp4 (E2M1) 0.5;
# - MXFP4: blocks of 32 E2M1 values share one 8-bit E8M0 scale, 4 + 8/32 = 4.25 bits (OCP
#   Microscaling Formats (MX) Specification v1.0, 2023);
# - NVFP4: blocks of 16 E2M1 values share one FP8 E4M3 scale, 4 + 8/16 = 4.5 bits (NVIDIA,
#   "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference", technical blog,
#   June 2025; the per-tensor FP32 scale is negligible);
# - fp8 with DeepSeek-V3's 128x128 weight blocks adds one fp32 scale per 16,384 values
#   (2.4e-4 bytes), below the precision of any preset: counted as 1.
BYTES_PER_ELEMENT = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
    "fp4": 0.5,
    "mxfp4": 4.25 / 8.0,
    "nvfp4": 4.5 / 8.0,
}
# Number formats whose matmuls run at a listed rate: the 4-bit block formats at the fp4 rate.
_MATMUL_RATE = {"mxfp4": "fp4", "nvfp4": "fp4", "int4": "int8"}


def bytes_per_element(fmt: str) -> float:
    """Storage bytes per element of number format ``fmt`` (``BYTES_PER_ELEMENT``), block scales
    included: bf16 2, fp8 1, int8 1, fp4 0.5, MXFP4 4.25/8, NVFP4 4.5/8.

    >>> bytes_per_element("mxfp4"), bytes_per_element("nvfp4")
    (0.53125, 0.5625)
    """
    if fmt not in BYTES_PER_ELEMENT:
        raise PresetError(f"unknown number format {fmt!r}; allowed: {', '.join(BYTES_PER_ELEMENT)}")
    return BYTES_PER_ELEMENT[fmt]


def precisions(name: str) -> list[str]:
    """Precisions whose dense FLOP/s the hardware preset ``name`` lists ("bf16" always), in the
    order of ``PRECISIONS``; "fp4" is the NVFP4/MXFP4 rate (Blackwell, MI355X)."""
    card = hardware_card(name)
    return ["bf16"] + [p for p in PRECISIONS[1:] if f"flops_{p}" in card]


def serving_precision(name: str) -> str:
    """The precision model preset ``name`` serves its matmuls in ("bf16" unless its card says):
    the ``serving.precision`` field, one of ``PRECISIONS``. It names the matmul rate only; a card
    may record weight precisions per part (e.g. gpt-oss-120b: fp4 experts, bf16 attention) in
    other ``serving`` fields, with ``bytes_per_param`` their parameter-weighted mean."""
    precision = str(model_card(name)["serving"].get("precision", "bf16"))
    if precision not in PRECISIONS:
        raise PresetError(
            f"model preset {name!r}: serving.precision {precision!r} is not one of "
            f"{', '.join(PRECISIONS)}"
        )
    return precision


def hardware(name: str, precision: str = "bf16", calibrated: bool = False, **overrides) -> Hardware:
    """The hardware preset ``name`` as a ``dcost.Hardware`` (per chip, SI units).

    Args:
      name: a preset from ``hardware_names()``.
      precision: "bf16" (the default), "fp8", "int8" or "fp4": ``flops`` is the dense rate at
        that precision (the card's ``flops_<precision>``); "mxfp4" and "nvfp4" run at the fp4
        rate, "int4" at the int8 rate. Pair a model with the precision it
        serves in (``serving_precision``): an fp8 model on bf16 FLOP/s doubles its compute time.
        An unknown precision, or one the chip lists no rate for, raises ``PresetError``.
      calibrated: apply the calibrated profile of the chip's family (achieved FLOP/s and HBM
        fractions of weight and KV-cache reads, matmul-size efficiency, step and layer overheads,
        link efficiencies and latencies; kernels in series and log-depth all-reduces), fitted to
        published measurements by ``dcost validate --write``
        (``calibration.toml``); False: the pure roofline (peak rates, no overheads). The
        calibrated link fields are effective values of serving steps, not the links alone:
        DeepEP's all-to-all kernels timed alone run 1.5-3x faster than a calibrated Hopper
        predicts (``dcost.validation.collectives``), so a calibrated sensitivity to link
        bandwidth is an upper bound.
      **overrides: replace fields, e.g. ``hardware("h100-sxm", price_per_hour=3.0)``; they win
        over the calibrated profile.

    >>> import dcost
    >>> float(dcost.hardware("h100-sxm").hbm_capacity) / 2**20  # MiB, as nvidia-smi prints it
    81559.0
    >>> fp8 = dcost.hardware("h100-sxm", precision="fp8")
    >>> round(float(fp8.flops / dcost.hardware("h100-sxm").flops), 3)
    2.0
    """
    card = hardware_card(name)
    fields = {f: float(_value(card[f])) for f in _HARDWARE_FIELDS}
    fields.update({f: float(_value(card[f])) for f in _POWER_FIELDS if f in card})
    precision = _MATMUL_RATE.get(precision, precision)
    if precision not in PRECISIONS:
        raise PresetError(
            f"unknown precision {precision!r} for hardware preset {name!r}; "
            f"allowed: {', '.join(PRECISIONS)}"
        )
    if precision != "bf16":
        if f"flops_{precision}" not in card:
            raise PresetError(
                f"hardware preset {name!r} lists no {precision!r} FLOP/s (no field "
                f"'flops_{precision}'); its precisions: "
                f"{', '.join(precisions(name))}"
            )
        fields["flops"] = float(_value(card[f"flops_{precision}"]))
    check_flag("hardware", "calibrated", calibrated)
    if calibrated:
        fields.update(calibration_profile(card_family(name)))
    fields.update(overrides)
    return Hardware(**fields)


def card_family(name: str) -> str:
    """The calibration family of hardware preset ``name`` (e.g. "hopper")."""
    return str(hardware_card(name)["family"])


def calibration_profile(family: str) -> dict[str, float]:
    """The calibrated profile of a hardware family, ``{Hardware field: value}`` (SI units), as
    ``dcost validate --write`` fitted it; an unknown family raises ``PresetError``."""
    table = _load("calibration")["family"]
    if family not in table:
        raise PresetError(
            f"no calibrated profile for hardware family {family!r}; "
            f"known: {', '.join(sorted(table))}"
        )
    return {k: float(v) for k, v in table[family].items()}


def with_calibration_profile(hardware: Hardware, family: str) -> Hardware:
    """``hardware`` with the shipped calibrated profile of ``family`` applied: every field
    ``calibration_profile(family)`` names takes its value, the rest (datasheet rates, price,
    overrides) stay as they are. ``hardware(name, calibrated=True)`` is this applied to the pure
    preset of a chip of that family. An unknown family raises ``PresetError`` naming the known
    ones.

    >>> import dcost
    >>> h = with_calibration_profile(dcost.hardware("h100-sxm", price_per_hour=3.0), "hopper")
    >>> float(h.price_per_hour), float(h.flops_efficiency) < 1.0
    (3.0, True)
    """
    import equinox as eqx
    import jax.numpy as jnp

    profile = calibration_profile(family)
    names = tuple(profile)
    return eqx.tree_at(
        lambda h: tuple(getattr(h, n) for n in names),
        hardware,
        tuple(jnp.asarray(profile[n], dtype=jnp.result_type(float)) for n in names),
        is_leaf=lambda x: x is None,
    )


def calibration_error(family: str) -> dict[str, dict[str, float]]:
    """How far off the calibrated model is, held out, as ``dcost validate --write`` shipped it:
    ``{"family": ..., "overall": ..., "source_weighted": ...}``, each ``{records or sources,
    median, p90}`` of ``|predicted/measured - 1|`` under leave-one-source-out (the family's own
    records, every fitted record, and every record with each source weighted once). A family
    with no fitted records gets the overall figures under ``"family"`` too, with 0 records.

    >>> round(calibration_error("hopper")["family"]["median"], 3) > 0
    True
    """
    held = _load("calibration")["heldout"]
    calibration_profile(family)  # an unknown family: PresetError naming the known ones

    def numbers(table) -> dict:
        return {
            k: (int(v) if k in ("records", "sources") else float(v))
            for k, v in table.items()
            if not isinstance(v, dict)
        }

    overall = numbers(held["overall"])
    return {
        "family": numbers(held[family]) if family in held else {**overall, "records": 0},
        "overall": overall,
        "source_weighted": numbers(held["overall"]["source_weighted"]),
    }


def serving_hardware(
    hardware_name: str,
    model_name: str,
    precision: str = "auto",
    calibrated: bool = False,
    **overrides,
) -> Hardware:
    """The hardware preset with its FLOP/s at the precision model preset ``model_name`` serves
    in: the one rule that matches a chip to a model (``pair``, the CLI, the experiments and the
    notebooks call it).

    ``precision="auto"``: the model card's ``serving_precision`` (fp8 for deepseek-v3,
    deepseek-r1 and kimi-k2, bf16 for the rest) where the chip lists a rate for it; on a chip
    without one (fp8 on a100-80gb or tpu-v5p) the model runs weight-only, its weights at their own
    bytes per parameter and its matmuls at bf16. Any other ``precision`` is used as given, and a
    chip without that rate raises ``PresetError``.

    >>> import dcost
    >>> h = dcost.presets.serving_hardware("h100-sxm", "deepseek-v3")
    >>> round(float(h.flops / dcost.hardware("h100-sxm").flops), 3)  # fp8: twice bf16
    2.0
    >>> a100 = dcost.presets.serving_hardware("a100-80gb", "deepseek-v3")  # no fp8 tensor cores
    >>> float(a100.flops) == float(dcost.hardware("a100-80gb").flops)
    True
    """
    if precision == "auto":
        precision = serving_precision(model_name)
        if precision not in precisions(hardware_name):
            precision = "bf16"
    return hardware(hardware_name, precision=precision, calibrated=calibrated, **overrides)


def pair(hardware_name: str, model_name: str, **hardware_overrides) -> tuple[Hardware, Model]:
    """Hardware and model presets matched in precision (``serving_hardware``): the chip's FLOP/s
    at the model's serving precision, and the model.

    >>> import dcost
    >>> h, m = dcost.presets.pair("gb200-nvl72", "deepseek-v3")
    >>> round(float(h.flops) / 1e15, 3), float(m.bytes_per_param)
    (5.0, 1.0)
    """
    h = serving_hardware(hardware_name, model_name, **hardware_overrides)
    return h, model(model_name)


def architectures(names) -> dict:
    """Each model preset name mapped to the first (sorted) name of the presets with the same
    numbers: one network under several names (DeepSeek-V3 and R1, Llama 3 and 3.3 70B) is one
    architecture, and its runs share its error (a fold that leaves a model out leaves its twins
    out too).

    >>> architectures(["deepseek-v3", "deepseek-r1", "qwen3-32b"])["deepseek-v3"]
    'deepseek-r1'
    """
    import jax

    def numbers(n):
        return tuple(float(x) for x in jax.tree.leaves(model(n)))

    keys = {n: numbers(n) for n in sorted(set(names))}
    return {n: min(m for m in keys if keys[m] == k) for n, k in keys.items()}


def _mlp_params(d_model: float, d_ff: float, gated: bool, biases: bool) -> float:
    """One MLP: ``3*d*d_ff`` gated (SwiGLU: gate, up, down), ``2*d*d_ff`` plain (GELU: up, down);
    with biases add one per output unit, ``2*d_ff + d`` gated or ``d_ff + d`` plain."""
    n_in = 2.0 if gated else 1.0
    weights = (n_in + 1.0) * d_model * d_ff
    return weights + (n_in * d_ff + d_model if biases else 0.0)


def derive_model(card: dict) -> dict:
    """Derived counts of a model card: parameters (dense, per expert, total, active), KV bytes per
    token, attention FLOPs per context token and MoE layer count.

    With ``d`` width, ``L`` layers, ``h`` query heads of ``dh``, ``kv`` KV heads, ``V`` vocabulary:

    - Attention, GQA/MHA/MQA (MQA is ``kv = 1``), per layer: ``2*d*h*dh + 2*d*kv*dh`` (W_q, W_o,
      W_k, W_v); biases add ``(h + 2*kv)*dh + d``; QK-norm (Qwen3) adds ``2*dh``.
      KV bytes per token ``2*L*kv*dh*b`` (keys and values, ``b`` bytes per element).
      Attention FLOPs per context token ``4*L*h*dh`` (``q.k`` and ``p.v``, 2 FLOPs per
      multiply-add).
    - Attention, MLA (DeepSeek-V2/V3), with ranks ``r_q``, ``r_kv`` and head dims ``n`` (no RoPE),
      ``r`` (RoPE), ``v``: ``d*r_q + r_q + r_q*h*(n + r)`` (query down/up projections and their
      norm) ``+ d*(r_kv + r) + r_kv + r_kv*h*(n + v)`` (joint KV down projection with the shared
      RoPE key, its norm, up projection) ``+ h*v*d`` (output). The cache holds the latent and the
      RoPE key, ``L*(r_kv + r)*b`` bytes per token; decode with absorbed up-projections costs
      ``2*L*h*((r_kv + r) + r_kv)`` FLOPs per context token (scores over the latent with its RoPE
      part, values over the latent).
    - Linear attention (Gated DeltaNet, Qwen3.5): ``n_linear_layers`` of the layers hold no KV
      cache; their parameters, the state a sequence keeps (``state_bytes_per_sequence``) and
      the recurrence's FLOPs (``state_flops_per_token``) are ``_linear_attention``'s, and
      ``kv_bytes_per_token`` and the attention FLOPs count the full-attention layers only. With
      ``attn_output_gate`` the query projection is twice as wide (an output gate per head).
    - Sparse attention (DSA: DeepSeek-V3.2, GLM-5): MLA whose queries attend to the top
      ``index_topk`` tokens a lightning indexer picks (``attention_topk``); the indexer's
      parameters are attention's, its cache and FLOPs are ``index_bytes_per_token`` and
      ``index_flops_per_context_token`` (``_indexer``).
    - MLP: see ``_mlp_params`` (``3*d*d_ff`` for SwiGLU, ``2*d*d_ff`` for GELU, plus biases).
    - Norms: two per layer, one with parallel attention/MLP blocks (PaLM), plus the final one; each
      ``d`` weights, ``2*d`` with biases (LayerNorm).
    - Sliding-window attention (gpt-oss): ``n_sliding_layers`` of the ``L`` layers attend only to
      the last ``sliding_window`` tokens. Their parameters count as any layer's; their KV cache
      is bounded by the window, so ``kv_bytes_per_token`` and ``attn_flops_per_context_token``
      (the terms the v1 cost model multiplies by the context ``T``) count the
      ``L - n_sliding_layers`` full-attention layers only, and the bounded part is returned
      apart as ``kv_bytes_sliding`` (bytes per sequence once ``T >= sliding_window``:
      ``2*n_sliding*kv*dh*b*window``). The v1 cost model ignores that bounded part: with as
      many sliding as full layers (gpt-oss) it is ``window/T`` of the KV the full layers hold,
      1 % at ``T = 100*window``, but as large as theirs at ``T = window``.
    - Embeddings: ``V*d``, twice when the output layer is untied; learned positions add
      ``n_positions*d`` (GPT-3).
    - MoE: the first ``n_dense_layers`` layers have a dense MLP of ``d_ff``; each of the other
      ``L_moe`` layers has a router ``d*E``, ``n_shared_experts`` always-on experts (counted as
      dense) and ``E`` routed experts of ``d_ff_expert``. ``params_per_expert`` is one routed
      expert summed over the ``L_moe`` layers.

    Not counted (below 0.01 % of any preset): DeepSeek-V3's per-expert router bias; its
    multi-token-prediction module is no part of the card, as it is no part of the published 671B
    (cards record it in a separate ``mtp`` table); gpt-oss's per-head attention sinks and router
    bias. With ``biases`` every norm gets a bias too, which RMSNorm models (gpt-oss) lack: also
    below 0.01 %.

    Args:
      card: a model card as in ``models.toml``: ``card["arch"]`` holds the hyperparameters.

    Returns:
      dict of floats: ``n_layers``, ``d_model``, ``params_dense``, ``params_per_expert``,
      ``n_experts``, ``experts_active``, ``kv_bytes_per_token`` (bytes),
      ``attn_flops_per_context_token`` (FLOP), ``n_moe_layers``, ``params_total``,
      ``params_active``, ``kv_bytes_sliding`` (bytes per sequence, 0 without sliding layers);
      for serving model v2: ``params_attention`` (the attention parameters of every layer,
      linear-attention layers' included, biases and QK-norm too, layer norms not),
      ``kv_heads`` (``kv``; 1 for MLA, whose cache is one latent every query head reads),
      ``attention_heads`` (``n_heads``),
      ``prefill_attn_flops_per_context_token``
      (MLA's non-absorbed form ``2*L*h*(n + r + v)``: scores over ``n + r`` dimensions and
      values over ``v`` per head, 5.0 MFLOP for DeepSeek-V3 against 17.0 absorbed; the decode
      figure otherwise), ``max_domains_per_token`` (the arch key of that name: node-limited
      routing's ``M``, 0 = none), ``params_embedding`` (the lookup tables: ``V*d`` when the
      output layer is untied, plus learned positions ``n_positions*d``; a tied table is the
      output layer's matmul too, so not counted), ``state_bytes_per_sequence`` and
      ``state_flops_per_token`` (linear attention; 0 without it), ``attention_topk``,
      ``index_bytes_per_token`` and ``index_flops_per_context_token`` (sparse attention; 0
      without it), ``gemms_per_layer`` (``_gemm_kernels``).

    >>> card = {"arch": {"n_layers": 2, "d_model": 8, "n_heads": 2, "d_ff": 32, "vocab": 10}}
    >>> derive_model(card)["params_total"]   # 2*(4*8*8 + 3*8*32) + (2*2 + 1)*8 + 2*10*8
    2248.0
    >>> derive_model(card)["kv_bytes_per_token"]   # 2 * 2 layers * 2 heads * 4 dims * 2 bytes
    64.0
    """
    a = card["arch"]
    d, layers, heads = float(a["d_model"]), float(a["n_layers"]), float(a["n_heads"])
    index = _indexer(a, d)
    gated = a.get("mlp", "swiglu") == "swiglu"
    biases = bool(a.get("biases", False))
    kv_elem_bytes = float(a.get("kv_bytes_per_element", 2.0))

    if a.get("attention", "gqa") == "mla":
        qr, kvr = float(a["q_lora_rank"]), float(a["kv_lora_rank"])
        nope, rope, vd = (
            float(a["qk_nope_head_dim"]),
            float(a["qk_rope_head_dim"]),
            float(a["v_head_dim"]),
        )
        q = d * qr + qr + qr * heads * (nope + rope) if qr > 0 else d * heads * (nope + rope)
        attn = q + d * (kvr + rope) + kvr + kvr * heads * (nope + vd) + heads * vd * d
        kv_bytes = layers * (kvr + rope) * kv_elem_bytes
        attn_flops = 2.0 * layers * heads * ((kvr + rope) + kvr)
        prefill_flops = 2.0 * layers * heads * ((nope + rope) + vd)
        kv_sliding = 0.0
        kv_heads = 1.0
        attn += index["params"] + qr * index["query_params_per_rank"]
    else:
        dh = float(a.get("d_head", d / heads))
        kvh = float(a.get("n_kv_heads", heads))
        attn = 2.0 * d * heads * dh + 2.0 * d * kvh * dh
        attn += d * heads * dh if a.get("attn_output_gate", False) else 0.0
        attn += ((heads + 2.0 * kvh) * dh + d) if biases else 0.0
        attn += 2.0 * dh if a.get("qk_norm", False) else 0.0
        sliding = float(a.get("n_sliding_layers", 0))
        window = float(a.get("sliding_window", 0))
        if sliding and not (0 < sliding < layers and window > 0):
            raise ValueError(
                f"n_sliding_layers must be in (0, n_layers) with sliding_window > 0; "
                f"got n_sliding_layers={sliding}, sliding_window={window}, "
                f"n_layers={layers}"
            )
        full = layers - sliding - float(a.get("n_linear_layers", 0))
        kv_bytes = 2.0 * full * kvh * dh * kv_elem_bytes
        kv_sliding = 2.0 * sliding * kvh * dh * kv_elem_bytes * window
        attn_flops = 4.0 * full * heads * dh
        prefill_flops = attn_flops
        kv_heads = kvh

    linear = _linear_attention(a, d, kv_elem_bytes)
    norms_per_layer = 1.0 if a.get("parallel_layers", False) else 2.0
    norms = (norms_per_layer * layers + 1.0) * d * (2.0 if biases else 1.0)
    tied = a.get("tied_embeddings", False)
    lookup = (0.0 if tied else float(a["vocab"]) * d) + float(a.get("n_positions", 0)) * d
    embed = float(a["vocab"]) * d + lookup
    attn_all = (layers - linear["layers"]) * attn + linear["layers"] * linear["params"]
    shared_part = attn_all + norms + embed

    n_experts = float(a.get("n_experts", 0))
    if n_experts > 0:
        dense_layers = float(a.get("n_dense_layers", 0))
        moe_layers = layers - dense_layers
        expert = _mlp_params(d, float(a["d_ff_expert"]), gated, biases)
        dense_mlps = dense_layers * _mlp_params(d, float(a.get("d_ff", 0)), gated, biases)
        always_on = float(a.get("n_shared_experts", 0)) * expert + d * n_experts  # + router
        dense = shared_part + dense_mlps + moe_layers * always_on
        per_expert = moe_layers * expert
        active = float(a["experts_active"])
    else:
        moe_layers, per_expert, active = 0.0, 0.0, 0.0
        dense = shared_part + layers * _mlp_params(d, float(a["d_ff"]), gated, biases)
    return {
        "n_layers": layers,
        "d_model": d,
        "params_dense": dense,
        "params_per_expert": per_expert,
        "n_experts": n_experts,
        "experts_active": active,
        "kv_bytes_per_token": kv_bytes,
        "attn_flops_per_context_token": attn_flops,
        "n_moe_layers": moe_layers,
        "params_total": dense + n_experts * per_expert,
        "params_active": dense + active * per_expert,
        "kv_bytes_sliding": kv_sliding,
        "params_attention": attn_all,
        "kv_heads": kv_heads,
        "attention_heads": heads,
        "prefill_attn_flops_per_context_token": prefill_flops,
        "max_domains_per_token": float(a.get("max_domains_per_token", 0)),
        "params_embedding": lookup,
        "state_bytes_per_sequence": linear["layers"] * linear["state_bytes"],
        "state_flops_per_token": linear["layers"] * linear["flops"],
        "attention_topk": float(a.get("index_topk", 0)),
        "index_bytes_per_token": layers * index["bytes"],
        "index_flops_per_context_token": layers * index["flops"],
        "gemms_per_layer": _gemm_kernels(a, linear["layers"]),
    }


def _gemm_kernels(a: dict, linear_layers: float) -> float:
    """Dense GEMM kernels a layer runs per decode pass outside the grouped experts, averaged
    over the ``L`` layers (what pays ``Hardware.gemm_overhead``), as the engines fuse them:

    - attention, GQA: the fused QKV projection and the output (2); MLA: the query down and up
      projections (up only without ``q_lora_rank``), the joint KV down projection, the two
      absorbed up-projections (batched GEMMs over the heads) and the output (6); a sparse-
      attention indexer adds its query, key and head-weight projections (3); a Gated DeltaNet
      layer its two input projections and its output (3);
    - MLP: a dense layer's fused gate-up and down (2); an MoE layer's router (1) and, with
      shared experts, their fused gate-up and down (2).

    DeepSeek-V3: ``6 + (3*2 + 58*3)/61 = 8.95``; Llama 3 70B: 4.

    >>> _gemm_kernels({"n_layers": 2, "n_heads": 2, "d_model": 8}, 0.0)
    4.0
    """
    layers = float(a["n_layers"])
    if a.get("attention", "gqa") == "mla":
        attention = 6.0 if float(a.get("q_lora_rank", 0)) > 0 else 5.0
        attention += 3.0 if a.get("index_topk", 0) else 0.0
    else:
        attention = 2.0
    attention = ((layers - linear_layers) * attention + linear_layers * 3.0) / layers
    if float(a.get("n_experts", 0)) > 0:
        dense = float(a.get("n_dense_layers", 0))
        moe = 1.0 + (2.0 if float(a.get("n_shared_experts", 0)) > 0 else 0.0)
        mlp = (dense * 2.0 + (layers - dense) * moe) / layers
    else:
        mlp = 2.0
    return attention + mlp


def _indexer(a: dict, d: float) -> dict:
    """One layer's lightning indexer of DeepSeek sparse attention (DSA; DeepSeek-V3.2 report,
    arXiv 2512.02556, section 2.1; GLM-5), which scores every earlier token with ``h_I`` heads of
    ``d_I`` and keeps the top ``index_topk`` for the MLA attention.

    - parameters ``r_q h_I d_I`` (its queries, from MLA's query latent of rank ``r_q``: returned
      per unit of rank, ``query_params_per_rank``, for the caller to multiply) ``+ d d_I`` (its
      one key head) ``+ 2 d_I`` (the key's LayerNorm) ``+ d h_I`` (the heads' weights);
    - cache ``d_I + 4 d_I/128`` bytes a token: the key in fp8 with a float32 scale per 128
      (``index_bytes_per_key``, to override);
    - FLOPs ``2 h_I d_I`` per (token x context token): every head's score of every key.

    A card without ``index_topk`` has none (all zeros). The indexer reads MLA's query latent, so
    a card with ``index_topk`` must be MLA and give ``index_heads`` and ``index_head_dim``.
    """
    topk = a.get("index_topk", 0)
    if not topk:
        return {"params": 0.0, "query_params_per_rank": 0.0, "bytes": 0.0, "flops": 0.0}
    if a.get("attention", "gqa") != "mla":
        raise ValueError(
            f"arch.index_topk = {topk} (sparse attention's lightning indexer) needs "
            f"attention = 'mla'; got attention = {a.get('attention', 'gqa')!r}"
        )
    for key, what in (
        ("index_heads", "the indexer's heads"),
        ("index_head_dim", "the indexer's head size"),
    ):
        value = a.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
            raise ValueError(
                f"arch.index_topk = {topk} needs arch.{key} (a positive number), {what}; "
                f"got {value!r}"
            )
    heads, dim = float(a["index_heads"]), float(a["index_head_dim"])
    return {
        "params": d * dim + 2.0 * dim + d * heads,
        "query_params_per_rank": heads * dim,
        "bytes": float(a.get("index_bytes_per_key", dim + 4.0 * dim / 128.0)),
        "flops": 2.0 * heads * dim,
    }


def _linear_attention(a: dict, d: float, conv_bytes: float) -> dict:
    """One Gated DeltaNet layer (Yang, Kautz and Hatamizadeh, "Gated Delta Networks", ICLR 2025,
    arXiv 2412.06464; Qwen3-Next and Qwen3.5) of an arch table, and how many there are.

    With ``h_k`` key heads of ``d_k``, ``h_v`` value heads of ``d_v`` and a causal convolution of
    width ``K`` over the ``c = 2 h_k d_k + h_v d_v`` query, key and value channels:

    - parameters ``d (2 h_k d_k + 2 h_v d_v)`` (query, key, value and output-gate projections)
      ``+ 2 d h_v`` (the decay and update-rate projections) ``+ K c`` (the depthwise
      convolution) ``+ 2 h_v + d_v`` (decay bias, ``A``, the gated norm) ``+ h_v d_v d`` (output);
    - state per sequence ``h_v d_k d_v s + (K - 1) c b``: each value head's ``d_k x d_v`` matrix
      in ``s`` bytes (``state_bytes_per_element``, 4: the checkpoints' ``mamba_ssm_dtype``
      float32) and the convolution's last ``K - 1`` inputs in the KV cache's ``b``;
    - FLOPs per token beyond the projections ``7 h_v d_k d_v + 2 K c``: the decay of the state
      (``d_k d_v``), its read by the key and the rank-one update (``2 + 2``), the read-out by the
      query (``2``), and the convolution.

    A card without ``n_linear_layers`` has none (all zeros).
    """
    n = float(a.get("n_linear_layers", 0))
    if not n:
        return {"layers": 0.0, "params": 0.0, "state_bytes": 0.0, "flops": 0.0}
    layers = float(a["n_layers"])
    if not 0 < n < layers:
        raise ValueError(f"n_linear_layers must be in (0, n_layers = {layers:g}); got {n:g}")
    hk, dk = float(a["linear_key_heads"]), float(a["linear_key_head_dim"])
    hv, dv = float(a["linear_value_heads"]), float(a["linear_value_head_dim"])
    k = float(a.get("linear_conv_kernel", 4))
    channels = 2.0 * hk * dk + hv * dv
    params = d * (2.0 * hk * dk + 2.0 * hv * dv) + 2.0 * d * hv + k * channels
    params += 2.0 * hv + dv + hv * dv * d
    state = hv * dk * dv * float(a.get("state_bytes_per_element", 4.0))
    state += (k - 1.0) * channels * conv_bytes
    return {
        "layers": n,
        "params": params,
        "state_bytes": state,
        "flops": 7.0 * hv * dk * dv + 2.0 * k * channels,
    }


def derive_draft(card: dict) -> dict:
    """The speculative draft of a model card's ``mtp`` table (multi-token-prediction modules), as
    ``Model``'s draft fields; all 0 for a card without one.

    DeepSeek-V3's MTP module (Technical Report, section 2.2) is one transformer block like the
    MoE layers (MLA attention, shared and routed experts, router), a ``2d -> d`` projection and
    two more RMSNorms, sharing the embedding and output head with the main model. Per draft token
    it computes with the block's attention, shared expert, router and ``k`` routed experts, the
    projection, and the shared output head (``V*d``, the logits); it holds (and at large batch
    reads) all ``E`` routed experts:

    - ``draft_params = n*(block_active + 2d^2 + 2d) + V*d``;
    - ``draft_params_total = draft_params + n*(E - k)*expert`` (the head is counted again
      though shared: an over-count of ``V*d`` weights in memory);
    - ``draft_layers = n``, ``draft_kv_bytes_per_token = n*kv_bytes_per_token/L``.

    >>> d = derive_draft(model_card("deepseek-r1"))
    >>> round(d["draft_params"] / 1e9, 2), round(d["draft_params_total"] / 1e9, 2)
    (1.61, 12.54)
    """
    if "mtp" not in card:
        return {
            "draft_params": 0.0,
            "draft_params_total": 0.0,
            "draft_layers": 0.0,
            "draft_kv_bytes_per_token": 0.0,
        }
    a, n = card["arch"], float(card["mtp"]["n_modules"])
    d, vocab = float(a["d_model"]), float(a["vocab"])
    one = derive_model({"arch": dict(a, n_layers=1, n_dense_layers=0, vocab=0)})
    block_active = one["params_active"] - d  # the final norm is the model's, counted once
    active = n * (block_active + 2.0 * d * d + 2.0 * d) + vocab * d
    idle = n * (one["n_experts"] - one["experts_active"]) * one["params_per_expert"]
    full = derive_model(card)
    return {
        "draft_params": active,
        "draft_params_total": active + idle,
        "draft_layers": n,
        "draft_kv_bytes_per_token": n * full["kv_bytes_per_token"] / full["n_layers"],
    }


def _scaled_kv(fields: dict, card: dict, kv_cache: str | None) -> None:
    """Rescale the KV byte fields from the card's element bytes to ``kv_cache``'s (in place)."""
    if kv_cache is None:
        return
    old = float(card["arch"].get("kv_bytes_per_element", 2.0))
    ratio = bytes_per_element(kv_cache) / old
    for key in ("kv_bytes_per_token", "draft_kv_bytes_per_token"):
        if fields.get(key) is not None:
            fields[key] *= ratio


def model(
    name: str,
    weights: str | None = None,
    kv_cache: str | None = None,
    activations: str | None = None,
    **overrides,
) -> Model:
    """The model preset ``name`` as a ``dcost.Model``, counts derived from its architecture.

    Serving model v2's fields come from the card too: ``params_attention``, ``kv_heads``,
    ``attention_heads``, ``prefill_attn_flops_per_context_token`` and ``max_domains_per_token``
    (``derive_model``),
    the draft fields from its ``mtp`` table (``derive_draft``; 0 without one). Every preset sets
    every one of them (0 where the model has none), so presets stack into one batched ``Model``.

    Args:
      name: a preset from ``model_names()``.
      weights: number format of every weight (``BYTES_PER_ELEMENT``: "bf16", "fp8", "int8",
        "fp4", "mxfp4", "nvfp4", ...) for ``bytes_per_param``; None: as the card serves it.
      kv_cache: number format of the KV cache: ``kv_bytes_per_token`` (and the draft's) are
        rescaled from the card's ``kv_bytes_per_element``; None: as the card.
      activations: number format of activations (``act_bytes``: what all-to-alls and hops move).
      **overrides: replace fields, e.g. ``model("llama-3-70b", bytes_per_param=1.0)``.

    Pair the matmul rate with ``dcost.hardware(name, precision=...)``.

    >>> import dcost
    >>> round(float(dcost.model("llama-3-70b").params_total) / 1e9, 1)
    70.6
    >>> m = dcost.model("llama-3-70b", weights="fp8", kv_cache="fp8")
    >>> float(m.bytes_per_param), float(m.kv_bytes_per_token)  # 2*80*8*128 bytes at 1 byte
    (1.0, 163840.0)
    """
    card = model_card(name)
    derived = derive_model(card)
    fields = {
        k: derived[k]
        for k in (
            "n_layers",
            "d_model",
            "params_dense",
            "params_per_expert",
            "n_experts",
            "experts_active",
            "kv_bytes_per_token",
            "attn_flops_per_context_token",
            "n_moe_layers",
            "params_attention",
            "kv_heads",
            "attention_heads",
            "prefill_attn_flops_per_context_token",
            "params_embedding",
            "state_bytes_per_sequence",
            "state_flops_per_token",
            "attention_topk",
            "index_bytes_per_token",
            "index_flops_per_context_token",
            "gemms_per_layer",
        )
    }
    # every preset carries every v2 field (0 where it has none), so presets stack for vmap
    fields["max_domains_per_token"] = derived["max_domains_per_token"]
    fields.update(derive_draft(card))
    fields["bytes_per_param"] = float(card["serving"]["bytes_per_param"])
    fields["act_bytes"] = float(card["serving"].get("act_bytes", 2.0))
    if weights is not None:
        fields["bytes_per_param"] = bytes_per_element(weights)
    if activations is not None:
        fields["act_bytes"] = bytes_per_element(activations)
    _scaled_kv(fields, card, kv_cache)
    fields["kv_bytes_per_element"] = (
        bytes_per_element(kv_cache)
        if kv_cache is not None
        else float(card["arch"].get("kv_bytes_per_element", 2.0))
    )
    fields.update(overrides)
    return Model(**fields)
