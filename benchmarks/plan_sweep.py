"""How many scenarios per second ``dcost.plan_sweep`` plans on 1 and 2 processes and devices.

Each configuration runs in fresh interpreters (``tests/sweep_child.py``): N chat scenarios of
Llama 3.1 8B on an H100 (rates over three decades), planned twice in the same process: the first
sweep compiles the planner's programs (on every device that takes a block), the second is warm.
Prints, per configuration, ``import jax`` timed in the same child, both sweeps' seconds and the
warm sweep's scenarios per second, and checks that every configuration gives the same plans.
Every child runs under a timeout (``--timeout`` seconds), so the benchmark cannot hang.

    python benchmarks/plan_sweep.py                 # 256 scenarios, blocks of 64
    python benchmarks/plan_sweep.py --scenarios 64 --block 16

Compile time is per device: on a CPU, forced host devices share the machine's cores, so
2 devices on 2 cores can at best halve the warm sweep (and each compiles its own program).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
CHILD = ROOT / "tests" / "sweep_child.py"


def _env(devices: int) -> dict:
    env = dict(os.environ)
    env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={devices}"
    env["PYTHONPATH"] = str(ROOT)
    return env


def _port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _parse(text: str) -> dict:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


def run(processes: int, devices: int, n: int, block: int, timeout: float) -> list[dict]:
    """Every process's result (``sweep_child``'s JSON) of one configuration."""
    base = [sys.executable, str(CHILD), f"rates:{n}", "--block", str(block), "--repeat", "2"]
    if processes == 1:
        done = subprocess.run(
            base, env=_env(devices), capture_output=True, text=True, timeout=timeout
        )
        if done.returncode:
            raise RuntimeError(done.stderr[-2000:])
        return [_parse(done.stdout)]
    port = _port()
    procs = [
        subprocess.Popen(
            [*base, "--port", str(port), "--processes", str(processes), "--process-id", str(i)],
            env=_env(devices),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(processes)
    ]
    out = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=timeout)
            if p.returncode:
                raise RuntimeError(stderr[-2000:])
            out.append(_parse(stdout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenarios", type=int, default=256)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--timeout", type=float, default=900.0, help="seconds per child process")
    args = ap.parse_args()
    configs = [(1, 1), (1, 2), (2, 1)]
    print(f"{args.scenarios} scenarios, blocks of {args.block}, {os.cpu_count()} CPUs")
    print("processes  devices  import jax (s)  first sweep (s)  warm sweep (s)  scenarios/s")
    plans = {}
    for processes, devices in configs:
        results = run(processes, devices, args.scenarios, args.block, args.timeout)
        first = max(r["sweep_s"][0] for r in results)
        warm = max(r["sweep_s"][1] for r in results)
        imp = max(r["import_jax_s"] for r in results)
        plans[(processes, devices)] = [r["plans"] for r in results]
        print(
            f"{processes:9d}  {devices:7d}  {imp:13.2f}  {first:15.2f}  {warm:14.3f}  "
            f"{args.scenarios / warm:11.0f}"
        )
    reference = plans[(1, 1)][0]
    same = all(p == reference for ps in plans.values() for p in ps)
    print(f"every configuration's plans equal the one-process plans exactly: {same}")


if __name__ == "__main__":
    main()
