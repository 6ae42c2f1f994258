"""How long building a spec takes: presets and constructors, per call, beside their floor.

    python benchmarks/specs.py            # 300 calls of each
    python benchmarks/specs.py --calls 50

A spec converts and checks every numeric field where it is built (``dcost.specs``), so code that
builds one per record (validation: a case per measurement, thousands of them) pays it per record.
Each row prints the median over ``--repeats`` runs (default 5) of ``--calls`` calls, in
microseconds per call, with the spec's numeric fields and its floor: one ``jax.device_put`` of a
NumPy scalar per field (the transfer every field ends with), timed in the same run. The first
line is ``import jax`` in a fresh interpreter, the reference every dcost benchmark prints.
Bounded: fixed counts of calls, and the import timed under a 120 s timeout.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
import timeit


def import_jax_seconds() -> float:
    """Wall time of ``python -c "import jax"`` (its interpreter start included)."""
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import jax"], check=True, timeout=120)
    return time.perf_counter() - t


def per_call_us(fun, calls: int, repeats: int) -> float:
    fun()  # the first call may load a preset file
    return statistics.median(timeit.repeat(fun, number=calls, repeat=repeats)) / calls * 1e6


def fields(spec) -> int:
    """How many numeric fields the spec holds (its array leaves)."""
    import jax

    return len(jax.tree.leaves(spec))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    if args.calls < 1 or args.repeats < 1:
        ap.error("--calls and --repeats must be at least 1")
    print(f"import jax (fresh interpreter): {import_jax_seconds():.2f} s")

    import jax
    import numpy as np

    import dcost

    floor = per_call_us(lambda: jax.device_put(np.float32(1.0)), args.calls, args.repeats)
    cases = {
        "dcost.model('llama-3-70b')": lambda: dcost.model("llama-3-70b"),
        "dcost.hardware('h100-sxm')": lambda: dcost.hardware("h100-sxm"),
        "dcost.Workload(4096, prompt=, output=)": lambda: dcost.Workload(
            4096, prompt=100.0, output=200.0
        ),
        "dcost.Design(batch=, chips=)": lambda: dcost.Design(batch=8.0, chips=2.0),
    }
    print(f"one jax.device_put of a scalar: {floor:.1f} us")
    print(f"{'spec':<40}{'us / call':>10}{'fields':>8}{'floor (us)':>12}")
    for name, build in cases.items():
        n = fields(build())
        us = per_call_us(build, args.calls, args.repeats)
        print(f"{name:<40}{us:>10.1f}{n:>8}{n * floor:>12.1f}")


if __name__ == "__main__":
    main()
