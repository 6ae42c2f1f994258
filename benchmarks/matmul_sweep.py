"""Time a weight matmul against the number of tokens through it, on this machine's default device.

What ``Hardware.flops_efficiency``, ``matmul_half_tokens`` and ``bandwidth_efficiency`` describe,
measured bare: for an MLP's pair of weight matrices ``W1 (K x N)`` and ``W2 (N x K)`` (bf16), the
time of ``x @ W1 @ W2`` for ``M`` tokens, ``M = 1 .. 8192``. Each timed call runs the pair
``--inner`` times in one compiled loop (each output feeding the next input, so nothing is
hoisted), so dispatch is not in the figure. Prints, per shape and ``M``: microseconds per pair,
achieved TB/s of the weight reads and achieved TFLOP/s, against the device's own copy bandwidth
and large-matmul rate measured in the same run; then the curve of ``dcost.serving.roofline``
fitted to them per shape (``dcost.calibrate.local.fit_matmul_curve``):

    t(M) = max(weight bytes / (BW eta_BW), 4 M K N (1 + n_half / M) / (F eta_F))

and the smooth roofline (``dcost.calibrate.local.fit_kernel_roofline``, no ``n_half``):

    t(M) = ((4 M K N / (F eta_F))^(1/r) + (weight bytes / (BW eta_BW))^(1/r))^r

``--json`` writes every figure. ``--quick`` runs small shapes (a smoke run on any device).
``--refit FILE`` fits both curves again to a saved ``--json`` file's points, with no device
(``benchmarks/results/``). The run is bounded by ``--time-limit`` seconds: past it, every
thread's traceback and exit status 1.

    python benchmarks/matmul_sweep.py --json sweep.json
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np

from dcost.calibrate.local import _median_time, fit_kernel_roofline, fit_matmul_curve

SHAPES = [(8192, 28672), (8192, 7168), (4096, 14336)]
"""(K, N): Llama 3 70B's MLP on one chip and its 4-way tensor-parallel slice; Llama 3 8B's MLP."""
TOKENS = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192]
QUICK_SHAPES = [(256, 512)]
QUICK_TOKENS = [1, 8, 64]


def pair_time(m: int, k: int, n: int, inner: int, repeats: int, dtype=jnp.bfloat16) -> float:
    """Seconds per ``x @ W1 @ W2`` for ``m`` tokens (median over ``repeats`` calls of ``inner``
    pairs in one compiled loop)."""
    keys = jax.random.split(jax.random.PRNGKey(m), 3)
    x = jax.random.normal(keys[0], (m, k), jnp.float32).astype(dtype)
    w1 = (jax.random.normal(keys[1], (k, n), jnp.float32) / np.sqrt(k)).astype(dtype)
    w2 = (jax.random.normal(keys[2], (n, k), jnp.float32) / np.sqrt(n)).astype(dtype)

    @jax.jit
    def run(x, w1, w2):
        def body(_, x):
            return (x @ w1) @ w2

        return jax.lax.fori_loop(0, inner, body, x)

    return _median_time(run, x, w1, w2, repeats=repeats) / inner


def ceilings(quick: bool) -> tuple[float, float]:
    """(bf16 FLOP/s of one large square matmul, copy bytes/s read + written) on the device."""
    side = 256 if quick else 8192
    a = jax.random.normal(jax.random.PRNGKey(0), (side, side), jnp.float32).astype(jnp.bfloat16)
    flops = 2 * side**3 / _median_time(jax.jit(lambda m: m @ m), a, repeats=10)
    size = 2**20 if quick else 2**30
    x = jnp.ones((size,), jnp.bfloat16)
    copy = 2 * 2 * size / _median_time(jax.jit(lambda v: v * 2), x, repeats=10)
    return flops, copy


def _report(k: int, n: int, ms, ts, flops: float, copy: float) -> dict:
    """Fit both curves to one shape's points and print them; returns the max-form fit."""
    weight_bytes = 2 * 2 * k * n
    curve = fit_matmul_curve(ms, ts, 4.0 * k * n, weight_bytes, flops, copy)
    smooth = fit_kernel_roofline(ms, ts, 4.0 * k * n, weight_bytes, flops, copy)
    print(
        f"{k} x {n}: roofline with a matmul-size curve: eta_BW {curve['bandwidth_efficiency']:.2f} "
        f"of the copy bandwidth, eta_F {curve['flops_efficiency']:.2f} of the large-matmul rate, "
        f"n_half {curve['matmul_half_tokens']:.0f} tokens; rms log error "
        f"{curve['rms_log_error']:.3f}"
    )
    print(
        f"{k} x {n}: smooth roofline: eta_BW {smooth['bandwidth_efficiency']:.2f}, eta_F "
        f"{smooth['flops_efficiency']:.2f}, kernel_roofline_smoothness "
        f"{smooth['kernel_roofline_smoothness']:.2f}; rms log error {smooth['rms_log_error']:.3f}"
    )
    return {**curve, "smooth": smooth}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small shapes: a smoke run")
    ap.add_argument("--inner", type=int, default=20, help="pairs per timed call")
    ap.add_argument("--repeats", type=int, default=7, help="timed calls per point (median)")
    ap.add_argument("--time-limit", type=float, default=600.0, help="seconds for the whole run")
    ap.add_argument("--json", help="write every figure here")
    ap.add_argument("--refit", help="fit the curves to this saved --json file's points instead")
    args = ap.parse_args(argv)
    if args.inner < 1 or args.repeats < 1 or not args.time_limit > 0:
        ap.error("--inner and --repeats must be >= 1 and --time-limit > 0")
    faulthandler.dump_traceback_later(args.time_limit, exit=True, file=sys.stderr)
    if args.refit:
        with open(args.refit, encoding="utf-8") as f:
            saved = json.load(f)
        print(f"{saved['device']}: {saved.get('source', args.refit)}")
        for shape in saved["shapes"]:
            k, n = shape["k"], shape["n"]
            ms = np.array([r["tokens"] for r in shape["points"]], float)
            ts = np.array([r["seconds"] for r in shape["points"]])
            _report(k, n, ms, ts, saved["flops"], saved["copy_bandwidth"])
        faulthandler.cancel_dump_traceback_later()
        return 0
    device = jax.devices()[0]
    print(f"device: {device.device_kind} ({device.platform})")
    flops, copy = ceilings(args.quick)
    print(f"ceilings: bf16 matmul {flops / 1e12:.0f} TFLOP/s, copy {copy / 1e12:.2f} TB/s")
    shapes, tokens = (QUICK_SHAPES, QUICK_TOKENS) if args.quick else (SHAPES, TOKENS)
    out: dict = {"device": device.device_kind, "flops": flops, "copy_bandwidth": copy, "shapes": []}
    for k, n in shapes:
        weight_bytes = 2 * 2 * k * n
        rows = []
        print(f"\nW1 {k} x {n}, W2 {n} x {k} (bf16, {weight_bytes / 1e6:.0f} MB of weights)")
        print(f"{'tokens':>7} {'us per pair':>12} {'TB/s':>7} {'TFLOP/s':>8}")
        for m in tokens:
            t = pair_time(m, k, n, args.inner, args.repeats)
            rows.append({"tokens": m, "seconds": t})
            print(
                f"{m:>7} {t * 1e6:>12.1f} {weight_bytes / t / 1e12:>7.2f} "
                f"{4 * m * k * n / t / 1e12:>8.0f}",
                flush=True,
            )
        ms = np.array([r["tokens"] for r in rows], float)
        ts = np.array([r["seconds"] for r in rows])
        curve = _report(k, n, ms, ts, flops, copy)
        out["shapes"].append({"k": k, "n": n, "points": rows, "fit": curve})
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(out, f, indent=1)
    faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    sys.exit(main())
