"""``dcost presets``: the hardware and model presets, in a table or as JSON (SI units)."""

from __future__ import annotations

from dcost import presets
from dcost.cli.common import format_table, json_text

__all__ = ["add_parsers"]


def _cmd_presets(args) -> int:
    if args.json:
        out: dict[str, dict[str, dict[str, float]]] = {"hardware": {}, "models": {}}
        for name in presets.hardware_names():
            h = presets.hardware(name)
            out["hardware"][name] = {
                k: float(getattr(h, k))
                for k in (
                    "flops",
                    "hbm_bandwidth",
                    "hbm_capacity",
                    "scaleup_bandwidth",
                    "scaleout_bandwidth",
                    "scaleup_size",
                    "price_per_hour",
                )
            }
        for name in presets.model_names():
            m = presets.model(name)
            out["models"][name] = {
                "params_total": float(m.params_total),
                "params_active": float(m.params_active),
                "n_experts": float(m.n_experts),
                "experts_active": float(m.experts_active),
                "kv_bytes_per_token": float(m.kv_bytes_per_token),
                "index_bytes_per_token": float(m.index_bytes_per_token),
                "attention_topk": float(m.attention_topk),
                "state_bytes_per_sequence": float(m.state_bytes_per_sequence),
                "bytes_per_param": float(m.bytes_per_param),
            }
        print(json_text(out))
        return 0
    rows = []
    for name in presets.hardware_names():
        h = presets.hardware(name)
        rows.append(
            [
                name,
                f"{float(h.flops) / 1e12:.0f}",
                f"{float(h.hbm_bandwidth) / 1e12:.2f}",
                f"{float(h.hbm_capacity) / 1e9:.0f}",
                f"{float(h.scaleup_bandwidth) / 1e9:.0f}",
                f"{float(h.scaleout_bandwidth) / 1e9:.1f}",
                f"{float(h.scaleup_size):.0f}",
                f"{float(h.flops / h.hbm_bandwidth):.0f}",
                f"{float(h.price_per_hour):.2f}",
            ]
        )
    print("Hardware (per chip)")
    print(
        format_table(
            rows,
            [
                "name",
                "TFLOP/s",
                "HBM TB/s",
                "HBM GB",
                "scale-up GB/s",
                "scale-out GB/s",
                "domain",
                "FLOP/byte",
                "$/chip-h",
            ],
        )
    )
    rows = []
    for name in presets.model_names():
        m = presets.model(name)
        moe = float(m.n_experts) > 0
        rows.append(
            [
                name,
                f"{float(m.params_total) / 1e9:.1f}",
                f"{float(m.params_active) / 1e9:.1f}",
                (f"{float(m.experts_active):.0f} of {float(m.n_experts):.0f}" if moe else "dense"),
                # a sparse-attention indexer's keys are cached a token too
                f"{float(m.kv_bytes_per_token + m.index_bytes_per_token) / 1e3:.1f}",
                _attention(m),
                f"{float(m.bytes_per_param):g}",
            ]
        )
    print("\nModels")
    print(
        format_table(
            rows,
            ["name", "total B", "active B", "experts", "KV kB/token", "attention", "bytes/param"],
        )
    )
    return 0


def _attention(m) -> str:
    """What is not a dense KV cache: a top-k of the context, a recurrent state a sequence."""
    parts = []
    if float(m.attention_topk) > 0:
        parts.append(f"top-{float(m.attention_topk):.0f}")
    if float(m.state_bytes_per_sequence) > 0:
        parts.append(f"+{float(m.state_bytes_per_sequence) / 1e6:.0f} MB/seq state")
    return ", ".join(parts) or "dense"


def add_parsers(subparsers) -> None:
    """Register ``dcost presets [--json]``."""
    p = subparsers.add_parser("presets", help="list hardware and model presets")
    p.add_argument("--json", action="store_true", help="machine-readable output (SI units)")
    p.set_defaults(func=_cmd_presets)
