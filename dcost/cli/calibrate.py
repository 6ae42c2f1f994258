"""``dcost calibrate``: fit an engine profile to your benchmark result files (``--from``), rebuild
the shipped profiles from AIConfigurator's kernel tables (``--from-aiconfigurator``), or measure
this machine's F and BW and compare a real decode step with ``dcost.decode`` (neither)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import pathlib

import jax

from dcost.calibrate import local
from dcost.cli.common import json_text

__all__ = ["add_parsers"]


def _fmt_knee(x: float) -> str:
    return "none (never compute bound)" if not math.isfinite(x) else f"{x:.1f}"


def aiconfigurator_data(path: str | None) -> pathlib.Path:
    """AIConfigurator's data root: ``path`` (a ``systems/data`` folder, or the unpacked package or
    wheel holding one), else the installed ``aiconfigurator_core`` package's (the
    ``aiconfigurator`` extra). A folder without kernel tables is refused by name."""
    if path:
        root = pathlib.Path(path)
    else:
        import importlib.util

        spec = importlib.util.find_spec("aiconfigurator_core")
        if spec is None or not spec.submodule_search_locations:
            raise ValueError(
                "--from-aiconfigurator: aiconfigurator-core is not installed (pip install "
                "'dcost[aiconfigurator]'), and no folder was given"
            )
        root = pathlib.Path(list(spec.submodule_search_locations)[0])
    for candidate in (
        root,
        root / "systems" / "data",
        root / "aiconfigurator_core" / "systems" / "data",
    ):
        if (candidate / "h100_sxm").is_dir() or any(candidate.glob("*/gemm")):
            return candidate
    raise ValueError(
        f"--from-aiconfigurator {str(root)!r}: no kernel tables there (expected "
        "<gpu>/gemm/<engine>/<version>/gemm_perf.parquet under systems/data)"
    )


def _package_version() -> str:
    import importlib.metadata

    try:
        return f"aiconfigurator-core {importlib.metadata.version('aiconfigurator-core')}"
    except importlib.metadata.PackageNotFoundError:
        return "aiconfigurator-core (version not installed; tables from a folder)"


def _cmd_own(args) -> int:
    """``dcost calibrate --from FILE... --hardware H --model M --engine E --out mine.toml``."""
    from dcost import engines, measurements
    from dcost.calibrate import user

    for flag in ("hardware", "model", "engine"):
        if not getattr(args, flag):
            raise ValueError(f"--from needs --{flag} (what the result files do not say)")
    name, _, version = args.engine.partition("-")
    recs = []
    for path in args.from_files:
        recs += measurements.read(
            path,
            hardware=args.hardware,
            model=args.model,
            engine=name,
            engine_version=version or None,
            tensor_parallel=args.tensor_parallel,
            on_unsupported="skip",
        )
    fitted = [r for r in recs if r["metric"] in ("tpot", "ttft", "output_throughput_per_gpu")]
    if not fitted:
        raise ValueError("--from: the files hold no TPOT, TTFT or throughput to fit")
    prior = engines.engine(name, hardware=args.hardware, version=version or None)
    cal = user.calibrate(fitted, prior, files=args.from_files, robust=not args.least_squares)
    out = pathlib.Path(args.out or "mine.toml")
    cal.engine.save(out)
    # the band its predictions carry: deployments calibrated on as many of their runs, the rest
    # of their runs held out (engines.own_measurements()["intervals"])
    band = engines.interval_factors(cal.engine, 0.8)
    k = engines.band_runs(cal.engine)
    if args.json:
        print(
            json_text(
                {
                    "profile": str(out),
                    "records": cal.records,
                    "before": cal.before,
                    "after": cal.after,
                    "posterior_sd": cal.posterior_sd,
                    "prior_sd": cal.prior_sd,
                    "identified": list(cal.identified),
                    "residual_rms_log_before": cal.residual_before,
                    "residual_rms_log_after": cal.residual_after,
                    "loss": cal.engine.provenance["loss"],
                    "band_80": list(band),
                }
            )
        )
        return 0
    print(
        f"{cal.records} records from {len(args.from_files)} file(s); prior {prior.label} on "
        f"{args.hardware}; rms log error {cal.residual_before:.3f} -> {cal.residual_after:.3f} "
        f"({cal.engine.provenance['loss']} loss)"
    )
    for f in user.FIELDS:
        moved = "identified" if f in cal.identified else "not identified (kept near the prior)"
        print(
            f"  {f:24s} {cal.before[f]:11.4g} -> {cal.after[f]:11.4g}   posterior sd "
            f"{cal.posterior_sd[f]:.2f} of prior {cal.prior_sd[f]:.2f}: {moved}"
        )
    print(
        f"80 % band on its predictions for this deployment: x{band[0]:.2f} to x{band[1]:.2f} "
        + (
            f"(deployments calibrated on {k} of their runs, their other runs held out)"
            if k
            else "(the shipped profile's, for a new model)"
        )
    )
    print(f"profile: {out} (use it: --engine {args.engine} --profile {out})")
    return 0


def _cmd_calibrate(args) -> int:
    if args.from_files:
        return _cmd_own(args)
    if args.from_aiconfigurator is not None:
        from dcost.calibrate import engines

        root = aiconfigurator_data(args.from_aiconfigurator)
        engines.rebuild(root, args.out, package=_package_version())
        return 0
    changes = {
        k: v
        for k, v in (
            ("n_layers", args.layers),
            ("d_model", args.d_model),
            ("context", args.context),
            ("dtype", args.dtype),
        )
        if v is not None
    }
    cfg = dataclasses.replace(local.QUICK if args.quick else local.FULL, **changes)
    batches = None
    if args.max_batch:
        batches = [2**i for i in range(int(math.log2(args.max_batch)) + 1)]
    cal = local.calibrate(quick=args.quick, config=cfg, batches=batches)
    if args.json:
        knee = "no knee within the batches timed: the step time never turns compute-bound"
        print(json_text(cal.to_dict(), {k: knee for k in ("knee_measured", "knee_calibrated")}))
        return 0
    cfg = cal.config
    print(f"device: {cal.device} ({jax.default_backend()})")
    for name, f in cal.flops.items():
        print(f"matmul {name:9s} F  = {f / 1e9:10.1f} GFLOP/s")
    print(
        f"streaming read  BW = {cal.bandwidth / 1e9:10.2f} GB/s   "
        f"(F/BW = {cal.flops[cfg.dtype] / cal.bandwidth:.1f} FLOP/byte, {cfg.dtype})"
    )
    print(
        f"toy transformer: {cfg.n_layers} layers, d {cfg.d_model}, d_ff {cfg.d_ff}, "
        f"vocab {cfg.vocab}, {cfg.dtype}; N = {cal.params / 1e6:.2f}M, "
        f"KV {cal.kv_bytes_per_token / 1024:.1f} KiB/token, context {cfg.context}"
    )
    print(
        f"{'batch':>6s} {'measured ms':>12s} {'predicted ms':>13s} {'ratio':>7s} "
        f"{'calibrated ms':>14s}"
    )
    for b, m, p, r, c in zip(
        cal.batches, cal.measured_s, cal.predicted_s, cal.ratios, cal.calibrated_s, strict=True
    ):
        print(f"{b:6d} {m * 1e3:12.3f} {p * 1e3:13.3f} {r:7.2f} {c * 1e3:14.3f}")
    print(
        f"knee (balance batch): measured {_fmt_knee(cal.knee_measured)}, "
        f"predicted {_fmt_knee(cal.knee_predicted)}"
    )
    print(
        f"fitted efficiencies: eta_F = {cal.flops_efficiency:.3f}, "
        f"eta_BW = {cal.bandwidth_efficiency:.3f} (calibrated knee "
        f"{_fmt_knee(cal.knee_calibrated)})"
    )
    return 0


def add_parsers(subparsers) -> None:
    """Register ``dcost calibrate [--quick] [--json] [--from-aiconfigurator [DATA]]``."""
    p = subparsers.add_parser(
        "calibrate",
        help="fit an engine profile to your benchmark files (--from), rebuild the shipped "
        "profiles (--from-aiconfigurator), or time this machine's decode step",
    )
    p.add_argument(
        "--from-aiconfigurator",
        nargs="?",
        const="",
        default=None,
        metavar="DATA",
        help="rebuild the shipped engine profiles from AIConfigurator's kernel tables (the "
        "installed aiconfigurator-core, or a systems/data folder) and fit their fixed costs on "
        "its silicon sample (about 2 minutes)",
    )
    p.add_argument(
        "--from",
        dest="from_files",
        nargs="+",
        default=None,
        metavar="FILE",
        help="fit an engine profile to your own benchmark result files (vllm bench serve, "
        "SGLang bench_serving, AIPerf, GenAI-Perf, guidellm, inference-perf; see `dcost "
        "measurements`), starting from the shipped profile of --engine on --hardware",
    )
    p.add_argument("--hardware", help="with --from: the chip the runs used (a preset)")
    p.add_argument("--model", help="with --from: the model the runs served (a preset)")
    p.add_argument("--engine", help="with --from: the engine (vllm, sglang, trtllm[-VERSION])")
    p.add_argument(
        "--tensor-parallel", type=_positive_int, default=None, help="with --from: TP degree"
    )
    p.add_argument(
        "--out",
        default=None,
        metavar="PATH",
        help="with --from: the profile file to write (default mine.toml); with "
        "--from-aiconfigurator: a folder for the profiles instead of dcost/engines",
    )
    p.add_argument(
        "--least-squares",
        action="store_true",
        help="with --from: fit by least squares, for runs of several models whose misfits "
        "should average (default: Huber's loss, so one odd run pulls the fit a bounded way)",
    )
    p.add_argument("--quick", action="store_true", help="tiny sizes (a few seconds)")
    p.add_argument("--json", action="store_true", help="machine-readable output (SI units)")
    p.add_argument("--layers", type=_positive_int, default=None, help="toy layers (default 4)")
    p.add_argument("--d-model", type=_positive_int, default=None, help="toy width (default 512)")
    p.add_argument(
        "--context",
        type=_positive_int,
        default=None,
        help="KV-cache tokens per sequence (default 128)",
    )
    p.add_argument(
        "--dtype",
        choices=("float32", "bfloat16"),
        default=None,
        help="weights, activations and KV cache (default float32)",
    )
    p.add_argument(
        "--max-batch",
        type=_positive_int,
        default=None,
        help="largest batch, rounded down to a power of 2 (default 256; 16 quick)",
    )
    p.set_defaults(func=_cmd_calibrate)


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return v
