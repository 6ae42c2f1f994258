"""Hardware and model presets, read from the TOML files beside this module.

Every number in ``hardware.toml`` and ``models.toml`` carries the public source it comes from.
Hardware figures are stored in SI units per chip. Models are stored as their published
architecture (layers, widths, heads, experts); parameter counts and KV bytes per token are derived
here, and ``tests/test_presets.py`` checks the derived counts against the published ones.
"""

from __future__ import annotations

import functools
import sys
from importlib import resources

from dcost.specs import Hardware, Model

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["hardware", "model", "hardware_names", "model_names", "hardware_card", "model_card",
           "derive_model", "PresetError"]

_HARDWARE_FIELDS = ("flops", "hbm_bandwidth", "hbm_capacity", "scaleup_bandwidth",
                    "scaleout_bandwidth", "scaleup_size", "price_per_hour")


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


def hardware(name: str, **overrides) -> Hardware:
    """The hardware preset ``name`` as a ``dcost.Hardware`` (per chip, SI units).

    Keyword overrides replace fields, e.g. ``hardware("h100-sxm", price_per_hour=3.0)``.

    >>> import dcost
    >>> float(dcost.hardware("h100-sxm").hbm_capacity) / 1e9
    80.0
    """
    card = hardware_card(name)
    fields = {f: float(_value(card[f])) for f in _HARDWARE_FIELDS}
    fields.update(overrides)
    return Hardware(**fields)


def _mlp_params(d_model: float, d_ff: float, gated: bool) -> float:
    return (3.0 if gated else 2.0) * d_model * d_ff


def derive_model(card: dict) -> dict:
    """Derived counts of a model card: parameters (dense, per expert, total, active), KV bytes per
    token, attention FLOPs per context token and MoE layer count.

    Attention: GQA/MHA ``d*(h*dh) + 2*d*(kv*dh) + (h*dh)*d`` per layer; MLA (DeepSeek-V2/V3) from
    its low-rank projections. MLP: ``3*d*d_ff`` when gated (SwiGLU), else ``2*d*d_ff``. Embeddings
    ``V*d``, doubled when the output layer is untied. Norm weights and biases are counted where the
    card lists them; they are below 0.1 % of any preset.
    """
    a = card["arch"]
    d, layers = float(a["d_model"]), float(a["n_layers"])
    heads = float(a["n_heads"])
    gated = a.get("mlp", "swiglu") == "swiglu"
    kv_elem_bytes = float(a.get("kv_bytes_per_element", 2.0))
    if a.get("attention", "gqa") == "mla":
        qr, kvr = float(a["q_lora_rank"]), float(a["kv_lora_rank"])
        nope, rope, vd = (float(a["qk_nope_head_dim"]), float(a["qk_rope_head_dim"]),
                          float(a["v_head_dim"]))
        q = d * qr + qr + qr * heads * (nope + rope) if qr > 0 else d * heads * (nope + rope)
        attn = q + d * (kvr + rope) + kvr + kvr * heads * (nope + vd) + heads * vd * d
        kv_bytes = layers * (kvr + rope) * kv_elem_bytes
        # Decode with the up-projections absorbed: scores over the (kvr + rope) latent, values
        # over kvr, 2 FLOPs per multiply-add, per head.
        attn_flops = 2.0 * layers * heads * ((kvr + rope) + kvr)
    else:
        dh = float(a.get("d_head", d / heads))
        kvh = float(a.get("n_kv_heads", heads))
        attn = d * heads * dh + 2.0 * d * kvh * dh + heads * dh * d
        attn += float(a.get("attn_bias_params", 0.0)) * (heads + 2 * kvh) * dh
        kv_bytes = 2.0 * layers * kvh * dh * kv_elem_bytes
        attn_flops = 4.0 * layers * heads * dh
    norms = (2.0 * layers + 1.0) * d
    embed = float(a["vocab"]) * d * (1.0 if a.get("tied_embeddings", False) else 2.0)
    embed += float(a.get("n_positions", 0)) * d  # learned position embeddings (GPT-3)
    n_experts = float(a.get("n_experts", 0))
    if n_experts > 0:
        moe_layers = layers - float(a.get("n_dense_layers", 0))
        expert = _mlp_params(d, float(a["d_ff_expert"]), gated)
        shared = float(a.get("n_shared_experts", 0)) * expert
        dense_mlp = float(a.get("n_dense_layers", 0)) * _mlp_params(d, float(a.get("d_ff", 0)),
                                                                   gated)
        router = d * n_experts
        dense = layers * attn + norms + embed + dense_mlp + moe_layers * (shared + router)
        per_expert = moe_layers * expert
        active = float(a["experts_active"])
    else:
        moe_layers = 0.0
        dense = layers * (attn + _mlp_params(d, float(a["d_ff"]), gated)) + norms + embed
        per_expert = 0.0
        active = 0.0
    return {
        "n_layers": layers, "d_model": d, "params_dense": dense, "params_per_expert": per_expert,
        "n_experts": n_experts, "experts_active": active, "kv_bytes_per_token": kv_bytes,
        "attn_flops_per_context_token": attn_flops, "n_moe_layers": moe_layers,
        "params_total": dense + n_experts * per_expert, "params_active": dense + active * per_expert,
    }


def model(name: str, **overrides) -> Model:
    """The model preset ``name`` as a ``dcost.Model``, counts derived from its architecture.

    Keyword overrides replace fields, e.g. ``model("llama-3-70b", bytes_per_param=1.0)`` for fp8.

    >>> import dcost
    >>> round(float(dcost.model("llama-3-70b").params_total) / 1e9, 1)
    70.6
    """
    card = model_card(name)
    derived = derive_model(card)
    fields = {k: derived[k] for k in ("n_layers", "d_model", "params_dense", "params_per_expert",
                                      "n_experts", "experts_active", "kv_bytes_per_token",
                                      "attn_flops_per_context_token", "n_moe_layers")}
    fields["bytes_per_param"] = float(card["serving"]["bytes_per_param"])
    fields["act_bytes"] = float(card["serving"].get("act_bytes", 2.0))
    fields.update(overrides)
    return Model(**fields)
