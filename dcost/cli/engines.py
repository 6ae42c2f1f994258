"""``dcost engines``: the shipped engine profiles, where they come from and how far off they are.

One row per (engine, version, chip): the held-out error of each kernel fit on its own table
(GEMM, attention, grouped experts, all-reduce), the achieved fractions of peak, and the fixed
costs fitted end to end; then the profiles' held-out error on AIConfigurator's silicon sample by
engine, chip, mode and concurrency (``dcost/engines/heldout.toml``).
"""

from __future__ import annotations

from dcost.cli.common import format_table, json_text

__all__ = ["add_parsers"]


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"


def _cmd_engines(args) -> int:
    from dcost import engines, presets

    rows, data = [], []
    for name, version, hw in engines.engines():
        if args.engine and name != args.engine:
            continue
        if args.hardware and hw != args.hardware:
            continue
        e = engines.engine(name, hardware=hw, version=version)
        chip = e.apply(presets.hardware(hw))
        res = e.provenance.get("residuals", {})
        med = {k: res.get(k, {}).get("heldout_median_abs") for k in ("gemm", "attention", "moe")}
        med["allreduce"] = res.get("allreduce", {}).get("heldout_median_abs")
        prec = e.precision_profile
        data.append(
            {
                "engine": name,
                "version": version,
                "hardware": hw,
                "profile": e.profile,
                "precision_profile": prec,
                "kernel_heldout_median": med,
            }
        )
        rows.append(
            [
                name,
                version,
                hw,
                " ".join(
                    f"{p} {v['flops_efficiency']:.2f}"
                    for p, v in prec.items()
                    if "flops_efficiency" in v  # not the weight-only expert classes
                ),
                # the rates the model reads: an unset field takes its Hardware.OFF stand-in
                " / ".join(
                    f"{float(chip.get(k)):.2f}"
                    for k in (
                        "bandwidth_efficiency",
                        "expert_bandwidth_efficiency",
                        "kv_bandwidth_efficiency",
                    )
                ),
                f"{1e3 * e.profile.get('step_overhead', 0.0):.2f}",
                f"{1e6 * e.profile.get('layer_overhead', 0.0):.1f}",
                f"{1e3 * e.profile.get('prefill_step_overhead', 0.0):.2f}",
                " / ".join(_pct(med[k]) for k in ("gemm", "attention", "moe", "allreduce")),
            ]
        )
    held = engines.heldout()
    if args.json:
        print(json_text({"profiles": data, "silicon_heldout": held}))
        return 0
    print(
        format_table(
            rows,
            [
                "engine",
                "version",
                "hardware",
                "GEMM fraction of peak",
                "HBM weights/experts/KV",
                "step ms",
                "layer us",
                "prompt step ms",
                "kernel fits off (GEMM/attn/MoE/AR)",
            ],
        )
    )
    tpot = held["tpot"]
    o = tpot["overall"]
    print(
        f"\nHeld out on AIConfigurator's silicon sample ({o['rows']} TPOT runs; {held['split']}):"
    )
    print(
        f"  all: median {_pct(o['median'])}, p90 {_pct(o['p90'])}, predicted/measured "
        f"{o['bias']:.2f} at the median; pure physics bounds {tpot['pure']['bound_holds']} of "
        f"{tpot['pure']['rows']}"
    )
    for group in ("engine", "hardware", "mode", "concurrency"):
        table = tpot[f"by_{group}"]
        cells = ", ".join(
            f"{k} {_pct(v['median'])} ({_pct(v['p90'])}, n={v['rows']})" for k, v in table.items()
        )
        print(f"  by {group}: {cells}")
    skipped = held.get("skipped", {})
    if skipped:
        print(f"  not expressed ({sum(skipped.values())} rows or metrics):")
        for reason, n in sorted(skipped.items(), key=lambda kv: -kv[1]):
            print(f"    {n:5d}  {reason}")
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "engines",
        help="the shipped engine profiles and their held-out error",
        description=__doc__,
    )
    p.add_argument("--engine", choices=("vllm", "sglang", "trtllm"), help="only this engine")
    p.add_argument("--hardware", help="only this hardware preset")
    p.add_argument("--json", action="store_true", help="machine-readable output (SI units)")
    p.set_defaults(func=_cmd_engines)
