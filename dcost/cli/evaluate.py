"""``dcost eval``: one design, decode or prefill, with the exact model, term by term.

``--json`` prints the report's own fields: a decode report's ``tpot`` (time per output token),
a prefill report's ``ttft`` (the time of the pass), and ``tokens_per_s`` and ``cost_per_token``
per output token (decode) or per input token (prefill).
"""

from __future__ import annotations

import json

from dcost.cli.common import (
    add_precision_argument,
    at_least_one,
    fmt_time,
    format_table,
    hardware_and_model,
    non_negative,
)
from dcost.serving.roofline import bottleneck, decode, prefill
from dcost.specs import Design, Workload

__all__ = ["add_parsers"]


def _cmd_eval(args) -> int:
    h, m = hardware_and_model(args)
    w = Workload(args.context, prompt=args.prompt)
    d = Design(batch=args.batch, chips=args.chips, stages=args.stages, experts=args.experts)
    fn = prefill if args.phase == "prefill" else decode
    r = fn(d, h, m, w)
    fields = {k: float(getattr(r, k)) for k in r.__dataclass_fields__}
    binds = str(bottleneck(r))
    capacity = float(h.hbm_capacity)
    if args.json:
        print(
            json.dumps(
                {
                    "phase": args.phase,
                    "hardware": args.hardware,
                    "model": args.model,
                    "design": {
                        "batch": args.batch,
                        "chips": args.chips,
                        "stages": args.stages,
                        "experts": args.experts,
                        "chips_per_replica": float(d.chips_per_replica),
                    },
                    "context": args.context,
                    "bottleneck": binds,
                    "hbm_capacity": capacity,
                    "fits": fields["memory_per_chip"] <= capacity,
                    **fields,
                },
                indent=2,
            )
        )
        return 0
    per = "output" if args.phase == "decode" else "input"
    print(
        f"{args.model} on {args.hardware}: {args.phase}, batch {args.batch:g}, "
        f"{args.chips:g} chips per stage x {args.stages:g} stages "
        f"({float(d.chips_per_replica):g} chips per replica), context {args.context:g} tokens"
    )
    terms = [
        ["compute", fmt_time(fields["t_compute"])],
        ["weights", fmt_time(fields["t_weights"])],
        ["KV cache", fmt_time(fields["t_kv"])],
        ["memory (weights + KV)", fmt_time(fields["t_weights"] + fields["t_kv"])],
        ["communication", fmt_time(fields["t_comm"])],
        ["pipeline hop", fmt_time(fields["t_hop"])],
        ["stage step", fmt_time(fields["t_stage"])],
    ]
    print(format_table(terms, ["term (one stage step)", "time"]))
    mem = fields["memory_per_chip"]
    fit = "fits" if mem <= capacity else "DOES NOT FIT"
    if args.phase == "decode":
        label, latency = "time per output token", fields["tpot"]
    else:
        label, latency = "ttft (prefill pass)", fields["ttft"]
    print(f"\nbinding term:          {binds}")
    print(f"{label + ':':23s}{fmt_time(latency)}")
    print(f"tokens/s (replica):    {fields['tokens_per_s']:.4g} {per} tokens/s")
    print(f"cost:                  ${fields['cost_per_token'] * 1e6:.4g} per million {per} tokens")
    print(f"memory per chip:       {mem / 1e9:.2f} GB of {capacity / 1e9:.0f} GB ({fit})")
    print(f"MFU:                   {fields['mfu'] * 100:.1f} %")
    return 0


def add_parsers(subparsers) -> None:
    """Register ``dcost eval``."""
    p = subparsers.add_parser("eval", help="evaluate one design with the exact model")
    p.add_argument("--hardware", required=True, help="hardware preset (see `dcost presets`)")
    p.add_argument("--model", required=True, help="model preset (see `dcost presets`)")
    p.add_argument("--batch", type=at_least_one, required=True, help="sequences per micro-batch")
    p.add_argument("--chips", type=at_least_one, default=1.0, help="chips per pipeline stage")
    p.add_argument("--stages", type=at_least_one, default=1.0, help="pipeline stages")
    p.add_argument(
        "--experts", type=at_least_one, default=None, help="routed experts (default: the model's)"
    )
    p.add_argument(
        "--context",
        type=non_negative,
        default=0.0,
        help="mean context length during decode, tokens",
    )
    p.add_argument(
        "--prompt",
        type=non_negative,
        default=None,
        help="prompt length for prefill, tokens (default: --context)",
    )
    p.add_argument("--phase", choices=("decode", "prefill"), default="decode")
    add_precision_argument(p)
    p.add_argument("--json", action="store_true", help="machine-readable output (SI units)")
    p.set_defaults(func=_cmd_eval)
