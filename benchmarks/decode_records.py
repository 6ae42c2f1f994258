"""Time real decode steps on this machine's default device and write them as validation records.

Run where a GPU is (nothing depends on it): the preset's architecture at its real size, random
weights, plain JAX (``dcost.calibrate.decode_timing``); prints one line per shape (ms per step,
achieved TFLOP/s and TB/s, dcost's pure-physics and calibrated predictions) and writes the records
as TOML (``--out``) for ``dcost/validation/records.toml``. ``--quick`` times a tiny architecture on
any device (a smoke run; its records are not for the validation set). The whole run is bounded by
``--time-limit`` (900 s): past it, every thread's traceback and exit status 1.

    python benchmarks/decode_records.py --hardware h200 --commit <sha> --out records.toml
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time

import jax

from dcost.calibrate import decode_timing as dt
from dcost.validation import check_record, predict

SHAPES = [
    (1, 1024),
    (8, 1024),
    (32, 1024),
    (64, 1024),
    (128, 1024),
    (256, 1024),
    (512, 512),
    (1, 8192),
    (16, 8192),
    (32, 8192),
    (1, 32768),
    (8, 32768),
]
QUICK_SHAPES = [(1, 16), (4, 16), (8, 32)]
QUICK_ARCH = dt.Architecture(2, 64, 4, 2, 16, 128, 256)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="h200", help="hardware preset of this device")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--commit", default="unknown", help="the commit of the code that measures")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", help="write the records here (TOML)")
    ap.add_argument("--json", help="write the raw timings here (JSON)")
    ap.add_argument("--quick", action="store_true", help="tiny architecture, any device")
    ap.add_argument(
        "--shapes",
        help="comma-separated BATCHxCONTEXT shapes to time instead of the default twelve "
        "(e.g. 1x1024,8x32768)",
    )
    ap.add_argument(
        "--time-limit",
        type=float,
        default=900.0,
        help="seconds; past it, every thread's traceback and exit status 1 (a stuck device "
        "must not hang the run)",
    )
    args = ap.parse_args(argv)
    if not args.time_limit > 0:
        ap.error(f"--time-limit must be > 0, got {args.time_limit}")
    if not args.repeats >= 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    faulthandler.dump_traceback_later(args.time_limit, exit=True, file=sys.stderr)
    try:  # the timer must not outlive this call (an error, or main() called in-process)
        device = jax.devices()[0]
        software = f"jax {jax.__version__}, {device.platform}"
        print(f"device: {device.device_kind} ({software})", flush=True)
        t0 = time.perf_counter()
        if args.quick:
            arch, shapes = QUICK_ARCH, QUICK_SHAPES
        else:
            arch, shapes = dt.architecture(args.model), SHAPES
            if args.shapes:
                try:
                    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
                except ValueError:
                    ap.error(
                        "--shapes must be BATCHxCONTEXT,... with whole numbers, "
                        f"got {args.shapes!r}"
                    )
                if not all(len(s) == 2 and min(s) >= 1 for s in shapes):
                    ap.error(f"--shapes: BATCHxCONTEXT,... both >= 1, got {args.shapes!r}")
            f, bw = dt.device_ceilings()
            print(
                f"bf16 matmul 8192^3: {f / 1e12:.1f} TFLOP/s; streaming read: {bw / 1e12:.2f} TB/s"
            )
        timings = dt.time_decode(arch, shapes, repeats=args.repeats)
        records = dt.to_records(
            timings,
            hardware=args.hardware,
            model=args.model,
            source=f"dcost@{args.commit}:benchmarks/decode_records.py",
            source_id="dcost-jax-decode",  # the shipped records' group
            device=device.device_kind,
            software=software,
        )
        print(
            f"{'batch':>6} {'context':>8} {'ms':>9} {'TFLOP/s':>8} {'TB/s':>6} {'pure ms':>8} "
            f"{'cal ms':>8}"
        )
        for t, r in zip(timings, records, strict=True):
            check_record(r)
            pure = cal = float("nan")
            if not args.quick:
                pure, cal = predict(r) * 1e3, predict(r, calibrated=True) * 1e3
            s = t["seconds"]
            print(
                f"{t['batch']:>6} {t['context']:>8} {s * 1e3:>9.3f} {t['flops'] / s / 1e12:>8.1f} "
                f"{t['bytes'] / s / 1e12:>6.2f} {pure:>8.3f} {cal:>8.3f}",
                flush=True,
            )
        if args.out:
            with open(args.out, "w") as fh:
                fh.write(dt.records_toml(records))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(
                    {"device": device.device_kind, "software": software, "timings": timings}, fh
                )
        print(f"total {time.perf_counter() - t0:.1f} s")
    finally:
        faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    sys.exit(main())
