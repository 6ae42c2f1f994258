"""What padding costs a large batched ``dcost.grid_search``: ``fine_bucket`` against powers of two.

    python benchmarks/grid_batch.py [--scenarios 24] [--repeats 2] [--limit 300]

The sensitivity notebook's grid: the first ``--scenarios`` of eight chips of five generations
(each at its model's serving precision) times llama-3-70b, mixtral-8x7b and deepseek-v3, batch
1-4096 x chips 1-72 x stages 1-8 (2.4 million designs a scenario), tpot <= 50 ms. Timed twice in
one process: padded as ``grid_search`` pads a grid larger than one chunk (``fine_bucket``: 24
scenarios run as 24), then as it padded before (the next power of two: 24 run as 32), each once
to compile and then ``--repeats`` times; both must give the same answers (checked). Printed: the
seconds of each run, with ``import jax`` timed in the same process. The whole run is bounded by
``--limit`` seconds (past it, faulthandler prints every thread's traceback and exits, status 1).
"""

from __future__ import annotations

import argparse
import faulthandler
import sys
import time

t0 = time.perf_counter()
import jax  # noqa: E402

IMPORT_JAX = time.perf_counter() - t0

import numpy as np  # noqa: E402

import dcost  # noqa: E402
from dcost.search import buckets, grid  # noqa: E402

HARDWARE = ["a100-80gb", "h100-sxm", "h200", "b200", "gb200-nvl72", "mi300x", "mi355x", "tpu-v5p"]
MODELS = ["llama-3-70b", "mixtral-8x7b", "deepseek-v3"]


def problem(n: int) -> dcost.Problem:
    pairs = [(h, m) for m in MODELS for h in HARDWARE][:n]
    return dcost.Problem(
        dcost.stack([dcost.presets.serving_hardware(h, m) for h, m in pairs]),
        dcost.stack([dcost.model(m) for _, m in pairs]),
        dcost.Workload(4096),
        free={"batch": (1, 4096), "chips": (1, 72), "stages": (1, 8)},
        tpot_slo=0.05,
        memory_reserve=0.1,
    )


def timed(p: dcost.Problem, repeats: int) -> tuple[list[float], dcost.Solution]:
    seconds = []
    for _ in range(1 + repeats):
        t = time.perf_counter()
        s = dcost.grid_search(p)
        jax.block_until_ready(s.cost)
        seconds.append(time.perf_counter() - t)
    return seconds, s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenarios", type=int, default=24, help="1 to 24 (default 24)")
    ap.add_argument("--repeats", type=int, default=2, help="timed runs after the first")
    ap.add_argument("--limit", type=float, default=300.0, help="seconds before giving up")
    args = ap.parse_args(argv)
    if not 1 <= args.scenarios <= len(HARDWARE) * len(MODELS):
        ap.error(f"--scenarios {args.scenarios}: must be 1 to {len(HARDWARE) * len(MODELS)}")
    if args.repeats < 1:
        ap.error(f"--repeats {args.repeats}: must be at least 1")
    faulthandler.dump_traceback_later(args.limit, exit=True)
    p = problem(args.scenarios)
    n = args.scenarios
    print(f"import jax: {IMPORT_JAX:.2f} s; {n} scenarios x {grid.grid_points(p):,} designs")
    fine_s, fine = timed(p, args.repeats)
    real = grid.fine_bucket
    grid.fine_bucket = lambda k: buckets.bucket(k, floor=1)  # as before: the next power of two
    try:
        power_s, power = timed(p, args.repeats)
    finally:
        grid.fine_bucket = real
    same = bool(
        np.array_equal(np.asarray(fine.x), np.asarray(power.x))
        and np.array_equal(np.asarray(fine.cost), np.asarray(power.cost))
    )
    for label, size, s in (
        ("fine_bucket", buckets.fine_bucket(n), fine_s),
        ("power of two", buckets.bucket(n, floor=1), power_s),
    ):
        runs = ", ".join(f"{x:.2f}" for x in s[1:])
        print(f"  padded to {size:3d} ({label}): first {s[0]:.2f} s, then {runs} s")
    print(f"  same answers: {same}")
    faulthandler.cancel_dump_traceback_later()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
