"""The ``dcost`` command line: presets, one evaluation, and the subcommands of other modules.

Numbers are typed and printed in units people read (ms, GB, $ per million tokens); ``--json``
prints the API's field names in SI units. A bad argument prints one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import sys

import numpy as np

from dcost import presets
from dcost.roofline import bottleneck, decode, prefill
from dcost.specs import Design, Workload

__all__ = ["main", "build_parser", "parse_duration", "parse_number", "format_table"]

_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


def parse_number(text: str) -> float:
    """A number as people type it: ``70e9``, ``4096``, ``1.5k``, ``2M``, ``3B``, ``15T``.

    >>> parse_number("70e9"), parse_number("1.5k"), parse_number("15T")
    (70000000000.0, 1500.0, 15000000000000.0)
    """
    t = text.strip()
    scale = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
    mult = 1.0
    if t and t[-1] in scale:
        mult, t = scale[t[-1]], t[:-1]
    try:
        value = float(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not np.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def parse_duration(text: str) -> float:
    """A duration in seconds from ``50ms``, ``0.05s``, ``200us`` or a bare number of seconds.

    >>> parse_duration("50ms"), parse_duration("0.05"), parse_duration("2s")
    (0.05, 0.05, 2.0)
    """
    t = text.strip().lower()
    for unit in sorted(_DURATION_UNITS, key=len, reverse=True):
        if t.endswith(unit):
            number, scale = t[: -len(unit)], _DURATION_UNITS[unit]
            break
    else:
        number, scale = t, 1.0
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (use e.g. 50ms, 0.05s or 0.05)") from None
    if not np.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"a duration must be > 0: {text!r}")
    return round(value, 12)


def format_table(rows: list[list[str]], header: list[str]) -> str:
    """Left-aligned text table with a rule under the header."""
    cols = list(zip(header, *rows, strict=False)) if rows else [(h,) for h in header]
    widths = [max(len(str(c)) for c in col) for col in cols]

    def line(r):
        return "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def _fmt_time(s: float) -> str:
    if s == 0:
        return "0"
    if s < 1e-3:
        return f"{s * 1e6:.3g} us"
    if s < 1:
        return f"{s * 1e3:.4g} ms"
    return f"{s:.4g} s"


def _cmd_presets(args) -> int:
    if args.json:
        out = {"hardware": {}, "models": {}}
        for name in presets.hardware_names():
            h = presets.hardware(name)
            out["hardware"][name] = {k: float(getattr(h, k)) for k in (
                "flops", "hbm_bandwidth", "hbm_capacity", "scaleup_bandwidth",
                "scaleout_bandwidth", "scaleup_size", "price_per_hour")}
        for name in presets.model_names():
            m = presets.model(name)
            out["models"][name] = {
                "params_total": float(m.params_total), "params_active": float(m.params_active),
                "n_experts": float(m.n_experts), "experts_active": float(m.experts_active),
                "kv_bytes_per_token": float(m.kv_bytes_per_token),
                "bytes_per_param": float(m.bytes_per_param)}
        print(json.dumps(out, indent=2))
        return 0
    rows = []
    for name in presets.hardware_names():
        h = presets.hardware(name)
        rows.append([name, f"{float(h.flops) / 1e12:.0f}", f"{float(h.hbm_bandwidth) / 1e12:.2f}",
                     f"{float(h.hbm_capacity) / 1e9:.0f}",
                     f"{float(h.scaleup_bandwidth) / 1e9:.0f}",
                     f"{float(h.scaleout_bandwidth) / 1e9:.1f}", f"{float(h.scaleup_size):.0f}",
                     f"{float(h.flops / h.hbm_bandwidth):.0f}", f"{float(h.price_per_hour):.2f}"])
    print("Hardware (per chip)")
    print(format_table(rows, ["name", "TFLOP/s", "HBM TB/s", "HBM GB", "scale-up GB/s",
                              "scale-out GB/s", "domain", "FLOP/byte", "$/chip-h"]))
    rows = []
    for name in presets.model_names():
        m = presets.model(name)
        moe = float(m.n_experts) > 0
        rows.append([name, f"{float(m.params_total) / 1e9:.1f}",
                     f"{float(m.params_active) / 1e9:.1f}",
                     (f"{float(m.experts_active):.0f} of {float(m.n_experts):.0f}" if moe
                      else "dense"),
                     f"{float(m.kv_bytes_per_token) / 1e3:.1f}", f"{float(m.bytes_per_param):g}"])
    print("\nModels")
    print(format_table(rows, ["name", "total B", "active B", "experts", "KV kB/token",
                              "bytes/param"]))
    return 0


def add_precision_argument(parser) -> None:
    """``--precision``: the chip's FLOP/s at this precision (auto: the model's own)."""
    parser.add_argument("--precision", choices=("auto", "bf16", "fp8", "int8"), default="auto",
                        help="matmul precision for the chip's FLOP/s (auto: the model's serving "
                             "precision, fp8 for deepseek-v3, else bf16)")


def hardware_and_model(args):
    """The ``--hardware`` and ``--model`` presets at ``--precision`` (auto: the model's own)."""
    m = presets.model(args.model)
    precision = getattr(args, "precision", "auto")
    if precision == "auto":
        precision = presets.serving_precision(args.model)
    return presets.hardware(args.hardware, precision=precision), m


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
        print(json.dumps({"phase": args.phase, "hardware": args.hardware, "model": args.model,
                          "design": {"batch": args.batch, "chips": args.chips,
                                     "stages": args.stages, "experts": args.experts},
                          "context": args.context, "bottleneck": binds,
                          "hbm_capacity": capacity, "fits": fields["memory_per_chip"] <= capacity,
                          **fields}, indent=2))
        return 0
    per = "output" if args.phase == "decode" else "input"
    print(f"{args.model} on {args.hardware}: {args.phase}, batch {args.batch:g}, "
          f"{args.chips:g} chips x {args.stages:g} stages, context {args.context:g} tokens")
    terms = [["compute", _fmt_time(fields["t_compute"])],
             ["weights", _fmt_time(fields["t_weights"])],
             ["KV cache", _fmt_time(fields["t_kv"])],
             ["memory (weights + KV)", _fmt_time(fields["t_weights"] + fields["t_kv"])],
             ["communication", _fmt_time(fields["t_comm"])],
             ["pipeline hop", _fmt_time(fields["t_hop"])],
             ["stage step", _fmt_time(fields["t_stage"])]]
    print(format_table(terms, ["term (one stage step)", "time"]))
    mem = fields["memory_per_chip"]
    fit = "fits" if mem <= capacity else "DOES NOT FIT"
    label = "time per output token" if args.phase == "decode" else "time of the prefill pass"
    print(f"\nbinding term:          {binds}")
    print(f"{label + ':':23s}{_fmt_time(fields['tpot'])}")
    print(f"tokens/s (replica):    {fields['tokens_per_s']:.4g} {per} tokens/s")
    print(f"cost:                  ${fields['cost_per_token'] * 1e6:.4g} per million {per} tokens")
    print(f"memory per chip:       {mem / 1e9:.2f} GB of {capacity / 1e9:.0f} GB ({fit})")
    print(f"MFU:                   {fields['mfu'] * 100:.1f} %")
    return 0


def _positive(text):
    v = parse_number(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return v


def _at_least_one(text):
    v = parse_number(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return v


def _non_negative(text):
    v = parse_number(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return v


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line error and exit code 2."""

    def error(self, message):
        self.exit(2, f"dcost: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="dcost", description="Cost models of LLM serving and training.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("presets", help="list hardware and model presets")
    p.add_argument("--json", action="store_true", help="machine-readable output (SI units)")
    p.set_defaults(func=_cmd_presets)

    p = sub.add_parser("eval", help="evaluate one design with the exact model")
    p.add_argument("--hardware", required=True, help="hardware preset (see `dcost presets`)")
    p.add_argument("--model", required=True, help="model preset (see `dcost presets`)")
    p.add_argument("--batch", type=_at_least_one, required=True, help="sequences per micro-batch")
    p.add_argument("--chips", type=_at_least_one, default=1.0, help="chips per pipeline stage")
    p.add_argument("--stages", type=_at_least_one, default=1.0, help="pipeline stages")
    p.add_argument("--experts", type=_at_least_one, default=None,
                   help="routed experts (default: the model's)")
    p.add_argument("--context", type=_non_negative, default=0.0,
                   help="mean context length during decode, tokens")
    p.add_argument("--prompt", type=_non_negative, default=None,
                   help="prompt length for prefill, tokens (default: --context)")
    p.add_argument("--phase", choices=("decode", "prefill"), default="decode")
    add_precision_argument(p)
    p.add_argument("--json", action="store_true", help="machine-readable output (SI units)")
    p.set_defaults(func=_cmd_eval)

    for module in _SUBCOMMAND_MODULES:
        if importlib.util.find_spec(module) is not None:
            importlib.import_module(module).add_parsers(sub)
    return parser


# Modules that add their own subcommands through ``add_parsers(subparsers)``.
_SUBCOMMAND_MODULES = ("dcost.cli_training", "dcost.cli_optimize", "dcost.calibrate")


def main(argv=None) -> int:
    """Run the CLI; returns the exit code (0 ok, 2 bad argument or value)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:  # output piped into `head` and the like
        sys.stderr.close()
        return 0
    except (ValueError, KeyError) as err:  # bad values found past parsing: one line, exit 2
        msg = err.args[0] if isinstance(err, KeyError) and err.args else err
        print(f"dcost: error: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
