"""Time real MoE decode steps on this machine's default device and write them as validation records.

Run where a GPU is (nothing depends on it): the preset's architecture at its real size, random
weights, attention in plain JAX and the routed experts by a Pallas grouped matmul
(``dcost.calibrate.moe_timing``). First checks the kernel against the gather reference on the
device and times it alone (the experts' weight tiles read at 8 and at all 128 touched experts,
for each tile shape in ``TILES``), then times whole steps (tiles by ``default_tiles``): one line
per shape (ms per step, experts touched per layer against the occupancy formula, TB/s read,
dcost's pure-physics and calibrated predictions), the same steps without the experts' matmuls,
and the first shape once more, last (a first-shape warm-up shows as a difference). Writes the
records as TOML (``--out``) and the raw timings as JSON after every shape (``--json``).
``--quick`` runs a tiny architecture on any device (a smoke run through the interpreter on CPU;
its records are not for the validation set).
The whole run is bounded by ``--time-limit``: past it, every thread's traceback and exit status 1.

    python benchmarks/moe_decode_records.py --hardware h200 --commit <sha> --out moe.toml
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys
import time
import traceback

import jax
import jax.numpy as jnp

from dcost.calibrate import decode_timing as dt
from dcost.calibrate import moe_timing as mt
from dcost.validation import check_record, predict

SHAPES = [
    (1, 1024),
    (2, 1024),
    (4, 1024),
    (8, 1024),
    (16, 1024),
    (32, 1024),
    (64, 1024),
    (128, 1024),
    (8, 8192),
]
QUICK_SHAPES = [(1, 16), (4, 16)]
QUICK_ARCH = mt.MoEArchitecture(1, 64, 4, 2, 16, 8, 2, 32, 256)
TILES = [(128, 64), (32, 128)]


def _best(fn, *args, repeats=20):
    for _ in range(2):
        jax.block_until_ready(fn(*args))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    times.sort()
    return times[len(times) // 2]


def kernel_check(arch, interpret: bool) -> float:
    """Largest relative difference of the Pallas experts from the gather reference (B = 8)."""
    w = mt.init_weights(
        mt.MoEArchitecture(
            1,
            *[
                getattr(arch, f)
                for f in (
                    "d_model",
                    "n_heads",
                    "n_kv_heads",
                    "d_head",
                    "n_experts",
                    "experts_active",
                    "d_ff_expert",
                    "vocab",
                )
            ],
        ),
        seed=3,
    )["layers"][0]
    y = jax.random.normal(jax.random.PRNGKey(5), (8, arch.d_model), jnp.bfloat16)
    idx, gate = mt.route(y, w["wr"], arch.experts_active)
    args = (y, w["w1"], w["w3"], w["w2"], idx, gate)
    got = mt.expert_ffn(*args, impl="pallas", interpret=interpret).astype(jnp.float32)
    ref = mt.expert_ffn(*args, impl="gather").astype(jnp.float32)
    return float(jnp.max(jnp.abs(got - ref)) / jnp.max(jnp.abs(ref)))


def kernel_sweep(arch, repeats: int):
    """Seconds of one ``grouped_matmul`` over a layer's ``w1`` and ``w2`` at 8 and at all
    experts touched (one block of 16 rows each), per tile shape; and the fastest tiles."""
    e, d, f = arch.n_experts, arch.d_model, arch.d_ff_expert
    w1 = jax.random.normal(jax.random.PRNGKey(0), (e, d, f), jnp.bfloat16)
    w2 = jax.random.normal(jax.random.PRNGKey(1), (e, f, d), jnp.bfloat16)
    rows = []
    for tiles in TILES:
        total = 0.0
        for touched in (arch.experts_active, e):
            be = jnp.arange(touched, dtype=jnp.int32)
            for w in (w1, w2):
                x = jax.random.normal(
                    jax.random.PRNGKey(2), (16 * touched, w.shape[1]), jnp.bfloat16
                )
                if w.shape[2] % tiles[0] or w.shape[1] % tiles[1]:
                    continue
                fn = jax.jit(
                    lambda x, w, be, t=tiles: mt.grouped_matmul(
                        x, w, be, block=16, bn=t[0], bk=t[1]
                    )
                )
                s = _best(fn, x, w, be, repeats=repeats)
                gbytes = touched * w.shape[1] * w.shape[2] * 2
                rows.append(
                    {
                        "bn": tiles[0],
                        "bk": tiles[1],
                        "touched": touched,
                        "K": w.shape[1],
                        "N": w.shape[2],
                        "seconds": s,
                        "tb_per_s": gbytes / s / 1e12,
                    }
                )
                total += s
                print(
                    f"  tiles bn={tiles[0]:>3} bk={tiles[1]:>3} touched {touched:>3} "
                    f"K={w.shape[1]:>5} N={w.shape[2]:>5}: {s * 1e6:8.1f} us "
                    f"{gbytes / s / 1e12:5.2f} TB/s",
                    flush=True,
                )
    by_tiles = {}
    for r in rows:
        by_tiles.setdefault((r["bn"], r["bk"]), []).append(r["seconds"])
    full = {t: sum(v) for t, v in by_tiles.items() if len(v) == 4}
    return rows, min(full, key=full.get)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hardware", default="h200", help="hardware preset of this device")
    ap.add_argument("--model", default="qwen3-30b-a3b")
    ap.add_argument("--commit", default="unknown", help="the commit of the code that measures")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--out", help="write the records here (TOML)")
    ap.add_argument("--json", help="write the raw timings here (JSON), after every shape")
    ap.add_argument("--quick", action="store_true", help="tiny architecture, any device")
    ap.add_argument("--shapes", help="comma-separated BATCHxCONTEXT shapes (e.g. 1x1024,8x8192)")
    ap.add_argument(
        "--ragged",
        default="1x1024,16x1024",
        help="shapes to time with XLA's ragged_dot as well ('' for none)",
    )
    ap.add_argument(
        "--no-skip",
        action="store_true",
        help="do not time the steps without the experts' matmuls (impl skip)",
    )
    ap.add_argument(
        "--time-limit",
        type=float,
        default=900.0,
        help="seconds; past it, every thread's traceback and exit status 1",
    )
    args = ap.parse_args(argv)
    if not args.time_limit > 0:
        ap.error(f"--time-limit must be > 0, got {args.time_limit}")
    if not args.repeats >= 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")

    def parse(text, flag):
        if not text:
            return []
        try:
            shapes = [tuple(int(n) for n in s.split("x")) for s in text.split(",")]
        except ValueError:
            ap.error(f"{flag} must be BATCHxCONTEXT,... with whole numbers, got {text!r}")
        if not all(len(s) == 2 and min(s) >= 1 for s in shapes):
            ap.error(f"{flag}: BATCHxCONTEXT,... both >= 1, got {text!r}")
        return shapes

    shapes = parse(args.shapes, "--shapes") if args.shapes else None
    ragged = parse(args.ragged, "--ragged")
    faulthandler.dump_traceback_later(args.time_limit, exit=True, file=sys.stderr)
    try:  # the timer must not outlive this call (an error, or main() called in-process)
        device = jax.devices()[0]
        software = f"jax {jax.__version__}, {device.platform}"
        print(f"device: {device.device_kind} ({software})", flush=True)
        t0 = time.perf_counter()
        report = {"device": device.device_kind, "software": software}

        def dump():
            if args.json:
                with open(args.json, "w") as fh:
                    json.dump(report, fh, indent=1)

        interpret = device.platform == "cpu"
        if args.quick:
            arch, shapes, ragged = QUICK_ARCH, QUICK_SHAPES, []
            report["kernel_check"] = kernel_check(arch, interpret)
        else:
            arch = mt.moe_architecture(args.model)
            shapes = shapes or SHAPES
            weights = 2.0 * (mt.params_read(arch, arch.n_experts) + arch.vocab * arch.d_model)
            limit = (device.memory_stats() or {}).get("bytes_limit")
            if limit is not None and weights > 0.9 * limit:
                ap.error(
                    f"--model {args.model}: its bf16 weights ({weights / 2**30:.0f} GiB) do "
                    "not fit "
                    f"this device's {limit / 2**30:.0f} GiB with room for the KV cache; one device "
                    "times the whole model (e.g. qwen3-30b-a3b, mixtral-8x7b on an H200)"
                )
            f, bw = dt.device_ceilings()
            report["ceilings"] = {"flops": f, "read_bytes_per_s": bw}
            print(
                f"bf16 matmul 8192^3: {f / 1e12:.1f} TFLOP/s; streaming read: {bw / 1e12:.2f} TB/s",
                flush=True,
            )
            report["kernel_check"] = kernel_check(arch, interpret)
            print(
                f"pallas experts vs gather (bf16, B=8): max rel diff {report['kernel_check']:.2e}",
                flush=True,
            )
            report["kernel_sweep"], best = kernel_sweep(arch, args.repeats)
            print(
                f"fastest over both: bn={best[0]} bk={best[1]}; the steps use default_tiles",
                flush=True,
            )
            dump()
        if not report["kernel_check"] < 3e-2:
            print("the Pallas experts disagree with the reference: no records", flush=True)
            dump()
            return 1

        def show(t, impl):
            r = mt.to_records(
                [t],
                hardware=args.hardware,
                model=args.model,
                source="x",
                source_id="x",
                device="x",
                software="x",
                impl=impl,
            )[0]
            check_record(r)
            pure = cal = float("nan")
            if not args.quick:
                pure, cal = predict(r) * 1e3, predict(r, calibrated=True) * 1e3
            s = t["seconds"]
            print(
                f"{impl:>7} {t['batch']:>6} {t['context']:>8} {s * 1e3:>9.3f} "
                f"{t['touched']:>7.1f} {t['expected_touched']:>7.1f} {t['bytes'] / s / 1e12:>6.2f} "
                f"{pure:>8.3f} {cal:>8.3f}",
                flush=True,
            )

        print(
            f"{'impl':>7} {'batch':>6} {'context':>8} {'ms':>9} {'touched':>7} {'expect':>7} "
            f"{'TB/s':>6} {'pure ms':>8} {'cal ms':>8}",
            flush=True,
        )
        report["timings"] = []

        def keep(t):
            report["timings"].append(t)
            dump()
            show(t, "pallas")

        timings = mt.time_decode(arch, shapes, repeats=args.repeats, on_result=keep)
        records = mt.to_records(
            timings,
            hardware=args.hardware,
            model=args.model,
            source=f"dcost@{args.commit}:benchmarks/moe_decode_records.py",
            source_id="dcost-jax-moe-decode",
            device=device.device_kind,
            software=software,
        )
        for r in records:
            check_record(r)
        if args.out:
            with open(args.out, "w") as fh:
                fh.write(dt.records_toml(records))
        report["skip"] = []

        def keep_skip(t):
            report["skip"].append(t)
            dump()
            show(t, "skip")

        if not args.no_skip:
            mt.time_decode(arch, shapes, repeats=args.repeats, impl="skip", on_result=keep_skip)
        # The first shape timed again, last: on a lent H200 batch 1 (timed first) ran slower
        # than batch 2, with and without the experts; this separates a first-shape warm-up.
        again = mt.time_decode(arch, shapes[:1], repeats=args.repeats)[0]
        report["first_again"] = again
        dump()
        first = timings[0]["seconds"]
        print(
            f"first shape again, last: {again['seconds'] * 1e3:.3f} ms against "
            f"{first * 1e3:.3f} ms "
            f"when first ({again['seconds'] / first - 1:+.1%})",
            flush=True,
        )
        report["ragged"] = []
        try:
            for shape in ragged:
                t = mt.time_decode(arch, [shape], repeats=max(3, args.repeats // 4), impl="ragged")[
                    0
                ]
                report["ragged"].append(t)
                dump()
                show(t, "ragged")
        except Exception:  # a comparison only: the records above stand without it
            traceback.print_exc()
        dump()
        print(f"total {time.perf_counter() - t0:.1f} s")
    finally:
        faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    sys.exit(main())
