"""``dcost eval``: one design, decode or prefill, with the exact model, term by term.

Serving model v2's layout fields (``--attention-dp``, ``--expert-parallel``,
``--dispatch-dedup``, ``--redundant-experts``, ``--draft-tokens``, ``--prefill-chunk``) and
workload fields (``--acceptance``, ``--expert-imbalance``) are given as numbers; left out, a term
stays off, but for a mixture of experts on a profiled chip (``--calibrated``, ``--engine``),
whose steps are timed at multinomial routing's expected maximum expert load, the load its
profile was fitted at (``dcost.serving.moe.profiled_routing``).

``--json`` prints the report's own fields: a decode report's ``tpot`` (time per output token),
a prefill report's ``ttft`` (the time of the pass), and ``tokens_per_s`` and ``cost_per_token``
per output token (decode) or per input token (prefill).
"""

from __future__ import annotations

from dcost.cli.common import (
    add_engine_argument,
    add_precision_argument,
    calibration_line,
    fmt_time,
    format_table,
    hardware_and_model,
    json_text,
    non_negative,
    profile_error,
    whole,
)
from dcost.cli.energy import (
    add_power_cap_argument,
    apply_power_cap,
    energy_fields,
    energy_lines,
)
from dcost.cli.search import (
    add_layout_arguments,
    add_workload_arguments,
    layout_text,
    workload_from_args,
)
from dcost.search.problem import LAYOUT_VARIABLES
from dcost.serving.roofline import bottleneck, decode, prefill
from dcost.specs import Design, attention_splits

__all__ = ["add_parsers"]


def _cmd_eval(args) -> int:
    if args.phase == "prefill" and (args.prompt if args.prompt is not None else args.context) < 1:
        raise ValueError(
            "--prompt is needed for --phase prefill: the prompt length, tokens >= 1 "
            "(it defaults to --context, which is 0 unless given)"
        )
    h, m = hardware_and_model(args)
    w = workload_from_args(args, h, m)
    layout = {n: getattr(args, n) for n in LAYOUT_VARIABLES if getattr(args, n) is not None}
    # a group count that does not divide --chips, or draft tokens without a draft or an
    # acceptance, is refused by decode/prefill themselves (dcost.specs.check_groups and
    # check_speculation), with the same message the API gives
    if args.expert_parallel is not None:
        layout["expert_parallel"] = args.expert_parallel
    for name in (
        "attention_dp",
        "expert_parallel",
        "redundant_experts",
        "draft_tokens",
        "prefill_chunk",
    ):
        v = layout.get(name)  # the exact model evaluates whole layouts (a relaxed one: the API)
        if v is not None and v != round(v):
            flag = "--" + name.replace("_", "-")
            raise ValueError(f"{flag} {v:g} is not allowed: it must be a whole number")
    d = Design(
        batch=args.batch, chips=args.chips, stages=args.stages, experts=args.experts, **layout
    )
    h = apply_power_cap(args, h, d, m, w)
    fn = prefill if args.phase == "prefill" else decode
    r = fn(d, h, m, w)
    en = energy_fields(d, h, m, w, args.phase)
    fields = {k: float(getattr(r, k)) for k in r.__dataclass_fields__}
    binds = str(bottleneck(r))
    capacity = float(h.hbm_capacity)
    calibration = profile_error(args)
    # the physics of any design, but say when no engine could launch it (its tensor-parallel
    # attention over chips / attention_dp does not split the model's heads)
    degree = float(args.chips) / float(layout.get("attention_dp") or 1.0)
    launchable = attention_splits(m, degree)
    if args.json:
        print(
            json_text(
                {
                    "phase": args.phase,
                    "hardware": args.hardware,
                    "model": args.model,
                    "design": {
                        "batch": args.batch,
                        "chips": args.chips,
                        "stages": args.stages,
                        "experts": args.experts,
                        **layout,
                        "chips_per_replica": float(d.chips_per_replica),
                    },
                    "context": args.context,
                    "bottleneck": binds,
                    "hbm_capacity": capacity,
                    "fits": fields["memory_per_chip"] <= capacity,
                    "launchable": launchable,
                    **fields,
                    **({"energy": en} if en is not None else {}),
                    **(
                        {"calibration_error": {"family_name": calibration[0], **calibration[1]}}
                        if calibration
                        else {}
                    ),
                },
            )
        )
        return 0
    per = "output" if args.phase == "decode" else "input"
    print(
        f"{args.model} on {args.hardware}: {args.phase}, batch {args.batch:g}, "
        f"{args.chips:g} chips per stage x {args.stages:g} stages "
        f"({float(d.chips_per_replica):g} chips per replica), context {args.context:g} tokens"
        f"{layout_text(d)}"
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
    # v2's terms, where they are on: overheads are part of the stage step, the draft's passes
    # are added to the step's trip through the stages
    if fields.get("t_overhead", 0.0) > 0:
        terms.insert(
            -1, ["fixed costs (step, layers, GEMMs, sequences)", fmt_time(fields["t_overhead"])]
        )
    if fields.get("t_draft", 0.0) > 0:
        terms.append(["draft passes (per step)", fmt_time(fields["t_draft"])])
    print(format_table(terms, ["term (one stage step)", "time"]))
    mem = fields["memory_per_chip"]
    fit = "fits" if mem <= capacity else "DOES NOT FIT"
    if args.phase == "decode":
        label, latency = "time per output token", fields["tpot"]
    else:
        label, latency = "ttft (prefill pass)", fields["ttft"]
    print(f"\nbinding term:          {binds}")
    print(f"{label + ':':23s}{fmt_time(latency)}")
    if fields.get("tokens_per_step", 1.0) != 1.0:
        print(f"tokens per step:       {fields['tokens_per_step']:.3g} (accepted, per sequence)")
    print(f"tokens/s (replica):    {fields['tokens_per_s']:.4g} {per} tokens/s")
    print(f"cost:                  ${fields['cost_per_token'] * 1e6:.4g} per million {per} tokens")
    print(f"memory per chip:       {mem / 1e9:.2f} GB of {capacity / 1e9:.0f} GB ({fit})")
    print(f"MFU:                   {fields['mfu'] * 100:.1f} %")
    for line in energy_lines(en, per):
        print(line)
    if not launchable:
        print(
            f"launch:                none: {float(m.attention_heads):g} query heads and "
            f"{float(m.kv_heads):g} KV heads do not split over {degree:g} chips of "
            "tensor-parallel attention (an engine needs a degree that divides the query heads "
            "and divides or is a multiple of the KV heads)"
        )
    if calibration:
        print(calibration_line(*calibration, width=23))
    return 0


def add_parsers(subparsers) -> None:
    """Register ``dcost eval``."""
    p = subparsers.add_parser("eval", help="evaluate one design with the exact model")
    p.add_argument("--hardware", required=True, help="hardware preset (see `dcost presets`)")
    p.add_argument("--model", required=True, help="model preset (see `dcost presets`)")
    p.add_argument("--batch", type=whole, required=True, help="sequences per micro-batch")
    p.add_argument("--chips", type=whole, default=1, help="chips per pipeline stage")
    p.add_argument("--stages", type=whole, default=1, help="pipeline stages")
    p.add_argument(
        "--experts", type=whole, default=None, help="routed experts (default: the model's)"
    )
    p.add_argument(
        "--context",
        type=non_negative,
        default=0.0,
        help="mean context length during decode, tokens (default 0: a step that reads "
        "no KV cache, the weights-only bound)",
    )
    p.add_argument(
        "--prompt",
        type=non_negative,
        default=None,
        help="prompt length for prefill, tokens (default: --context)",
    )
    p.add_argument("--phase", choices=("decode", "prefill"), default="decode")
    add_workload_arguments(p)
    add_layout_arguments(p, free=False)
    add_precision_argument(p)
    add_engine_argument(p)
    add_power_cap_argument(p)
    p.add_argument("--json", action="store_true", help="machine-readable output (SI units)")
    p.set_defaults(func=_cmd_eval)
