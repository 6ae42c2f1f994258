"""Time real prefill passes on this machine's default device and write them as validation records.

Run where a GPU is (nothing depends on it): the preset's architecture at its real size, random
weights, matmuls compiled by XLA and cuDNN's fused causal attention where it runs (else attention
in query blocks of plain JAX; ``dcost.calibrate.prefill_timing``). Prints the device's ceilings
(bf16 matmul rate, streaming-read bandwidth), then one line per shape: ms per pass, achieved
TFLOP/s, and dcost's pure-physics and calibrated predictions of the pass's time; writes the
records as TOML (``--out``, rewritten after every shape, so a run cut short keeps what it
measured) for ``dcost/validation/records.toml``. ``--quick`` times a tiny architecture on any
device (a smoke run; its records are not for the validation set). The whole run is bounded by
``--time-limit`` (600 s): past it, every thread's traceback and exit status 1.

    python benchmarks/prefill_records.py --commit <sha> --out records.toml
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time

import jax

from dcost.calibrate import decode_timing as dt
from dcost.calibrate import prefill_timing as pt
from dcost.validation import check_record, predict

SHAPES = [
    (1, 128),
    (1, 512),
    (1, 2048),
    (1, 8192),
    (1, 32768),
    (16, 512),
    (4, 2048),
    (8, 4096),
]
"""(batch, prompt tokens): from a short prompt near the weight-read time to 32k-token prompts whose
attention is a third of the FLOPs."""
QUICK_SHAPES = [(1, 16), (2, 32)]
QUICK_ARCH = dt.Architecture(2, 64, 4, 2, 16, 128, 256)
CHIPS = {"H200": "h200", "H100": "h100-sxm", "B200": "b200", "A100": "a100-80gb"}
"""Hardware preset of a device whose ``device_kind`` contains the key."""


def _hardware(kind: str, given: str | None) -> str:
    if given:
        return given
    for key, name in CHIPS.items():
        if key in kind:
            return name
    raise SystemExit(f"device {kind!r} is not one dcost names: pass --hardware PRESET")


def _attention(arch, quick: bool) -> str:
    """``"cudnn"`` where the fused kernel compiles and runs a tiny pass here, else ``"xla"``."""
    if quick or jax.devices()[0].platform != "gpu":
        return "xla"
    try:
        pt.time_prefill(arch, [(1, 256)], attention="cudnn", repeats=1)
    except Exception as err:  # the fused kernel is optional: say why and go on without it
        print(f"cuDNN attention unavailable ({type(err).__name__}: {err}); using xla", flush=True)
        return "xla"
    return "cudnn"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", help="hardware preset of this device (default: from its name)")
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--commit", default="unknown", help="the commit of the code that measures")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", help="write the records here (TOML)")
    ap.add_argument("--json", help="write the raw timings here (JSON)")
    ap.add_argument("--quick", action="store_true", help="tiny architecture, any device")
    ap.add_argument(
        "--time-limit",
        type=float,
        default=600.0,
        help="seconds; past it, every thread's traceback and exit status 1 (a stuck device "
        "must not hang the run)",
    )
    args = ap.parse_args(argv)
    if not args.time_limit > 0:
        ap.error(f"--time-limit must be > 0, got {args.time_limit}")
    if not args.repeats >= 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
    faulthandler.dump_traceback_later(args.time_limit, exit=True, file=sys.stderr)

    device = jax.devices()[0]
    software = f"jax {jax.__version__}, {device.platform}"
    hardware = (
        "h200" if args.quick and not args.hardware else _hardware(device.device_kind, args.hardware)
    )
    print(f"device: {device.device_kind} ({software}) as dcost's {hardware!r}", flush=True)
    t0 = time.perf_counter()
    if args.quick:
        arch, shapes = QUICK_ARCH, QUICK_SHAPES
    else:
        arch, shapes = dt.architecture(args.model), SHAPES
        f, bw = dt.device_ceilings()
        print(
            f"bf16 matmul 8192^3: {f / 1e12:.1f} TFLOP/s; streaming read: {bw / 1e12:.2f} TB/s",
            flush=True,
        )
    attention = _attention(arch, args.quick)
    source = dict(
        hardware=hardware,
        model=args.model,
        source=f"dcost@{args.commit}:benchmarks/prefill_records.py",
        source_id="dcost-jax-prefill",
        device=device.device_kind,
        software=software,
    )
    print(f"{'batch':>6} {'prompt':>7} {'ms':>9} {'TFLOP/s':>8} {'pure ms':>8} {'cal ms':>8}")
    done: list[dict] = []

    def report(t: dict) -> None:
        done.append(t)
        (r,) = pt.to_records([t], **source)
        check_record(r)
        pure = cal = float("nan")
        tokens = t["batch"] * t["prompt"]
        if not args.quick:
            pure = tokens / predict(r) * 1e3
            cal = tokens / predict(r, calibrated=True) * 1e3
        s = t["seconds"]
        print(
            f"{t['batch']:>6} {t['prompt']:>7} {s * 1e3:>9.3f} {t['flops'] / s / 1e12:>8.1f} "
            f"{pure:>8.3f} {cal:>8.3f}",
            flush=True,
        )
        if args.out:
            with open(args.out, "w") as fh:
                fh.write(dt.records_toml(pt.to_records(done, **source)))
        if args.json:
            with open(args.json, "w") as fh:
                json.dump({"device": device.device_kind, "software": software, "timings": done}, fh)

    pt.time_prefill(arch, shapes, attention=attention, repeats=args.repeats, on_timing=report)
    print(f"total {time.perf_counter() - t0:.1f} s")
    faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    sys.exit(main())
