"""``dcost validate``: every shipped measurement against dcost's prediction, held out.

For every record: the measured figure, the pure-physics bound, the calibrated prediction by the
fit that did not see the record's source (leave-one-source-out), their ratio, family and source;
then the summary (median and 90th percentile of ``|predicted/measured - 1|`` per family and
overall) and a figure. ``--write`` refits on every record and writes the shipped profiles
(``dcost/presets/calibration.toml``) with the held-out summary beside them. ``--only
FIELD=VALUE[,VALUE...]`` (repeatable, all must hold) shows the records that match and their own
held-out summary; the fits and the overall summary still use every record.
"""

from __future__ import annotations

import pathlib
import time

from dcost.cli.common import format_table, json_text, whole

__all__ = ["add_parsers", "select"]

FIGURE = pathlib.Path("docs/figures/validation.png")


def _fmt(value: float, metric: str) -> str:
    if metric in ("tpot", "ttft", "step_time"):
        return f"{value * 1e3:.4g} ms"
    return f"{value:.4g} tok/s"


def select(records, only) -> list[bool]:
    """Which of ``records`` match every ``FIELD=VALUE[,VALUE...]`` of ``only`` (a record matches
    one when its ``FIELD`` is one of the values, compared as text).

    Raises ValueError naming the entry: not ``FIELD=VALUE``, a field no record has, or values no
    record holds (with the values there are).

    >>> rs = [{"family": "hopper", "model": "a"}, {"family": "tpu", "model": "b"}]
    >>> select(rs, ["family=hopper,tpu", "model=b"])
    [False, True]
    """
    keep = [True] * len(records)
    for entry in only:
        field, sep, values = entry.partition("=")
        field, wanted = field.strip(), {v.strip() for v in values.split(",") if v.strip()}
        if not sep or not field or not wanted:
            raise ValueError(f"--only {entry!r} is not allowed: it must be FIELD=VALUE[,VALUE...]")
        present = sorted({str(r[field]) for r in records if field in r})
        if not present:
            fields = sorted({k for r in records for k in r if isinstance(r[k], (str, int))})
            raise ValueError(
                f"--only {entry!r}: no record has the field {field!r}; fields: " + ", ".join(fields)
            )
        missing = sorted(wanted - set(present))
        if missing:
            shown = ", ".join(present[:30]) + (" ..." if len(present) > 30 else "")
            raise ValueError(
                f"--only {entry!r}: no record has {field} = {', '.join(map(repr, missing))}; "
                f"values: {shown}"
            )
        keep = [k and str(r.get(field)) in wanted for k, r in zip(keep, records, strict=True)]
    if not any(keep):
        raise ValueError(f"--only {' '.join(only)}: no record matches every condition")
    return keep


def _selection_summary(cv, keep) -> dict:
    """The held-out summary of the selected records: their count, the fitted ones' and the
    bare-kernel ones' counts, and the median and 90th percentile of each group's error."""
    import numpy as np

    from dcost.calibrate import families

    rows = [i for i, k in enumerate(keep) if k]
    fitted = [i for i in rows if families.fitted(cv.records[i])]
    bare = [i for i in rows if families.bare_kernels(cv.records[i])]
    err = np.asarray(cv.error)
    out: dict = {"records": len(rows), "fitted": len(fitted), "bare_kernels": len(bare)}
    for name, idx in (("fitted_error", fitted), ("bare_error", bare)):
        if idx:
            out[name] = {
                "median": float(np.median(err[idx])),
                "p90": float(np.quantile(err[idx], 0.9)),
            }
    return out


def _own_measurements() -> dict:
    """How the engine profiles' error falls with k of a deployment's own runs (shipped)."""
    from dcost import engines

    return engines.own_measurements()


def _engines_heldout() -> dict:
    """The engine profiles' held-out error on the silicon sample, as shipped."""
    from dcost import engines

    return engines.heldout()


def _cmd_validate(args) -> int:
    from dcost import validation
    from dcost.calibrate import families
    from dcost.validation import collectives

    figure = pathlib.Path(args.figure) if args.figure else None
    if figure is not None and figure != FIGURE and not figure.parent.is_dir():
        raise ValueError(
            f"--figure {args.figure}: the directory {str(figure.parent)!r} does not exist "
            "(make it first; only the default's is made)"
        )
    records = validation.load()
    keep = select(records, args.only) if args.only else [True] * len(records)
    start = time.perf_counter()
    steps = args.steps or families.STEPS
    cv = families.cross_validate(records, steps=steps)
    seconds = time.perf_counter() - start
    summary = families.summary(cv)
    regimes = families.breakdown(cv)
    spread = families.source_spread(cv)
    kernels = collectives.summary()
    if args.json:
        json_rows = [
            {
                "id": r["id"],
                "family": r["family"],
                "source_id": r["source_id"],
                "metric": r["metric"],
                "measured": float(r["value"]),
                "pure": float(p),
                "held_out": float(h),
                "queueing": families.queueing(r),
                "fitted": families.fitted(r),
            }
            for r, p, h, k in zip(records, cv.pure, cv.held_out, keep, strict=True)
            if k
        ]
        out = {
            "records": json_rows,
            "summary": summary,
            "by_regime": regimes,
            "source_spread": spread,
            "collective_kernels": kernels,
            "engine_profiles": _engines_heldout(),
            "own_measurements": _own_measurements(),
            "seconds": seconds,
        }
        if args.only:
            out["selection"] = {"only": list(args.only), **_selection_summary(cv, keep)}
        print(json_text(out))
    else:
        table = []
        for r, p, h, q, k in zip(records, cv.pure, cv.held_out, cv.ratio, keep, strict=True):
            if not k:
                continue
            mark = " (queueing: not fitted)" if families.queueing(r) else ""
            mark = " (bare kernels: not fitted)" if families.bare_kernels(r) else mark
            table.append(
                [
                    r["id"][:58],
                    r["family"],
                    r["source_id"],
                    r["metric"],
                    _fmt(float(r["value"]), r["metric"]),
                    _fmt(float(p), r["metric"]),
                    _fmt(float(h), r["metric"]),
                    f"{q:.2f}{mark}",
                ]
            )
        print(
            format_table(
                table,
                [
                    "record",
                    "family",
                    "source",
                    "metric",
                    "measured",
                    "pure bound",
                    "held out",
                    "held out / measured",
                ],
            )
        )
        if args.only:
            sel = _selection_summary(cv, keep)
            parts = [f"{sel['records']} records match {' '.join(args.only)}"]
            if "fitted_error" in sel:
                e = sel["fitted_error"]
                parts.append(
                    f"held-out error of the {sel['fitted']} fitted: median "
                    f"{100 * e['median']:.1f} %, 90th percentile {100 * e['p90']:.1f} %"
                )
            if "bare_error" in sel:
                e = sel["bare_error"]
                parts.append(
                    f"of the {sel['bare_kernels']} bare-kernel timings: median "
                    f"{100 * e['median']:.1f} %, 90th percentile {100 * e['p90']:.1f} %"
                )
            print("\n" + "; ".join(parts) + " (the summaries below are of every record)")
        rows: list[list[str]] = []
        for name, s in summary.items():
            if isinstance(s, dict) and "p90" in s and name != "bare_kernels":
                rows.append(
                    [
                        name,
                        str(s["records"]),
                        f"{100 * s['median']:.1f} %",
                        f"{100 * s['p90']:.1f} %",
                    ]
                )
        print("\nHeld-out error |predicted/measured - 1| (leave-one-source-out, calibrated):")
        print(format_table(rows, ["family", "records", "median", "90th percentile"]))
        print("\nThe same, by regime (speed ratio: the median of predicted over measured speed):")
        regime_rows = [
            [
                name,
                group,
                str(s["records"]),
                f"{100 * s['median']:.1f} %",
                f"{100 * s['p90']:.1f} %",
                f"{s['speed_ratio']:.2f}",
            ]
            for name, groups in regimes.items()
            for group, s in groups.items()
        ]
        print(
            format_table(
                regime_rows,
                ["regime", "group", "records", "median", "90th percentile", "speed ratio"],
            )
        )
        lo, hi = (
            min(spread["offsets"].items(), key=lambda kv: kv[1]),
            max(spread["offsets"].items(), key=lambda kv: kv[1]),
        )
        sw = summary["overall"]["source_weighted"]
        print(
            f"\neach of the {sw['sources']} sources weighted once (a record by one over its "
            f"source's fitted records): held-out median {100 * sw['median']:.1f} %, 90th "
            f"percentile {100 * sw['p90']:.1f} %, the error a new source should expect"
        )
        print(
            f"each source's own speed: divided by its source's median speed ratio (an oracle; "
            f"from {lo[1]:.2f}, {lo[0]}, to {hi[1]:.2f}, {hi[0]}), the held-out error would be "
            f"{100 * spread['median']:.1f} % median, {100 * spread['p90']:.1f} % 90th percentile"
        )
        q = summary["queueing"]
        print(
            f"\npure-physics bound holds on {100 * summary['bound_holds']:.0f} % of "
            f"{len(records)} records; {q['records']} time-to-first-token records under load "
            f"need the queueing model (held-out median error {100 * q['median']:.0f} %), and "
            "are not fitted"
        )
        b = summary["bare_kernels"]
        if b["records"]:
            kinds = {
                "dcost-jax-decode": "dense decode steps",
                "dcost-jax-moe-decode": "MoE decode steps",
                "dcost-jax-prefill": "prefill passes",
            }
            parts = [
                f"{s['records']} {kinds.get(source, source)}: held-out median error "
                f"{100 * s['median']:.0f} %, 90th percentile {100 * s['p90']:.0f} %, median "
                f"predicted/measured time {s['median_ratio']:.2f}"
                for source, s in b["by_source"].items()
            ]
            print(
                f"{b['records']} timings by dcost on bare kernels (no serving engine) are not "
                "fitted either; " + "; ".join(parts)
            )
        for chip, k in kernels.items():
            print(
                f"{k['kernels']} collective kernels timed alone on {chip} (MoE dispatch and "
                f"combine, dcost.validation.collectives; not fitted): pure physics "
                f"{k['pure']['min']:.2f}-{k['pure']['max']:.2f}x the measured time (bound holds "
                f"on {100 * k['bound_holds']:.0f} %), the calibrated profile "
                f"{k['calibrated']['min']:.2f}-{k['calibrated']['max']:.2f}x (its link fields, "
                "fitted to serving steps, take up time the steps spend that the kernels alone "
                "do not)"
            )
        held = _engines_heldout()
        o = held["tpot"]["overall"]
        by = held["tpot"]["by_engine"]
        engines_text = ", ".join(
            f"{k} {100 * v['median']:.0f} % ({100 * v['p90']:.0f} %)" for k, v in by.items()
        )
        print(
            f"Engine profiles (kernel tables, fixed costs leave-one-model-out) on "
            f"AIConfigurator's silicon sample, {o['rows']} TPOT runs: held-out median "
            f"{100 * o['median']:.0f} %, p90 {100 * o['p90']:.0f} %; by engine {engines_text} "
            "(dcost engines)"
        )
        own = _own_measurements()
        curve = ", ".join(
            f"k = {k} {100 * v['median']:.1f} % ({100 * v['p90']:.1f} %)"
            for k, v in own["k"].items()
        )
        print(
            f"Calibrated on k of a deployment's own runs ({own['deployments']} deployments of the "
            f"silicon sample, its other runs held out; experiments/own_measurements.py): {curve}"
        )
        pub = own["published"]
        curve = ", ".join(
            f"k = {k} {100 * v['median']:.1f} % ({100 * v['p90']:.1f} %)"
            for k, v in pub["k"].items()
            if v["rows"] >= 20  # k = 10: one group has more than 10 runs
        )
        print(f"The same on {pub['groups']} groups of published runs: {curve}")
        print(f"{len(cv.sources)} sources, one fit each, {seconds:.1f} s")
    if args.figure:
        from dcost.plots import validation_figure

        fig = validation_figure(cv, [not families.fitted(r) for r in records], summary)
        path = pathlib.Path(args.figure)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        if not args.json:
            print(f"figure: {path}")
    if args.write:
        fit = families.fit(records, steps=steps)
        path = families.write_profiles(fit, summary)
        if not args.json:
            print(f"calibrated profiles: {path}")
    return 0


def add_parsers(subparsers) -> None:
    """Register ``dcost validate``."""
    p = subparsers.add_parser(
        "validate",
        help="every shipped measurement against dcost's held-out prediction (leave-one-source-out)",
    )
    p.add_argument("--steps", type=whole, default=None, help="Adam steps of each fit")
    p.add_argument("--figure", default=str(FIGURE), help=f"where to save the figure ({FIGURE})")
    p.add_argument(
        "--write",
        action="store_true",
        help="refit on every record and write dcost/presets/calibration.toml",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (SI units)")
    p.add_argument(
        "--only",
        action="append",
        metavar="FIELD=VALUE[,VALUE]",
        help="show only the records whose FIELD is one of the values (repeatable, all must hold; "
        "e.g. family=hopper, model=deepseek-r1, source_id=inferencemax-2025); the fits still "
        "use every record",
    )
    p.set_defaults(func=_cmd_validate)
