"""A child process of ``tests/test_sweep.py`` and ``benchmarks/plan_sweep.py``: plans the sweep
named on the command line and prints one JSON line (each plan's ``repr`` fields, and timings).

    python tests/sweep_child.py SWEEP [--block B] [--port P --processes N --process-id I]

``SWEEP`` is ``tiny`` (the tests' scenarios) or ``rates:N`` (N chat scenarios of one model on
one chip, rates spread over three decades). With ``--port``, the process first joins
``jax.distributed`` on localhost (process ``I`` of ``N``). ``XLA_FLAGS`` sets the host devices.
"""

from __future__ import annotations

import argparse
import json
import time

START = time.perf_counter()
import jax  # noqa: E402

IMPORT_JAX = time.perf_counter() - START


def tiny():
    """Two groups interleaved, 3 + 17 scenarios: with ``block=16`` three blocks, the second
    group's last block padded. The first group (a TPOT target of 30 ms) plans disaggregated
    fleets (a prefill and a decode pool), the second (50 ms) aggregated ones: every kind of pool
    (each plan's alternative is the other mode, so every block runs all three kinds' searches: on
    2 processes of 2 devices, 3 blocks compile 9 per-device programs, 6 in process 0)."""
    import numpy as np

    import dcost

    rows = []
    for i, rate in enumerate(np.geomspace(0.5, 800.0, 20)):
        tpot, mode = ((0.05, 0.9), "aggregated") if i % 7 else ((0.03, 0.9), "disaggregated")
        rows.append(
            dcost.Scenario(
                "llama-3.1-8b", "h100-sxm", "chat", float(rate), tpot_slo=tpot, mode=mode
            )
        )
    return rows


def rates(n: int):
    import numpy as np

    import dcost

    return [
        dcost.Scenario("llama-3.1-8b", "h100-sxm", "chat", float(r))
        for r in np.geomspace(0.5, 800.0, n)
    ]


def summary(p) -> list:
    """Every field of a plan a sweep must reproduce, as text (floats by their exact repr)."""

    def one(q):
        return repr(
            (q.mode, q.pools, q.chips, q.cost_per_hour, q.cost_per_million_input,
             q.cost_per_million_output, sorted(q.ttft.items()), sorted(q.tpot.items()),
             q.binding, q.shadow_price, q.feasible, q.message, q.evaluations)
        )  # fmt: skip

    return [one(p), None if p.alternative is None else one(p.alternative)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("sweep")
    ap.add_argument("--block", type=int, default=16)
    ap.add_argument("--port", type=int, default=None)
    ap.add_argument("--processes", type=int, default=1)
    ap.add_argument("--process-id", type=int, default=0)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    if args.port is not None:
        jax.distributed.initialize(
            coordinator_address=f"localhost:{args.port}",
            num_processes=args.processes,
            process_id=args.process_id,
            initialization_timeout=60,
        )
    import dcost

    rows = tiny() if args.sweep == "tiny" else rates(int(args.sweep.split(":")[1]))
    times = []
    for _ in range(args.repeat):
        t = time.perf_counter()
        out = dcost.plan_sweep(rows, block=args.block)
        times.append(time.perf_counter() - t)
    print(
        json.dumps(
            {
                "process": jax.process_index(),
                "processes": jax.process_count(),
                "devices": len(jax.local_devices()),
                "import_jax_s": IMPORT_JAX,
                "sweep_s": times,
                "scenarios": len(rows),
                "plans": [summary(p) for p in out],
            }
        ),
        flush=True,
    )


if __name__ == "__main__":
    main()
