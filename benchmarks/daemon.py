"""How long a ``dcost`` command takes with ``dcost daemon`` running, against its own process.

    python benchmarks/daemon.py              # 3 runs of each warm figure
    python benchmarks/daemon.py --runs 5

Every figure is a subprocess's wall time (the ``dcost`` console script's launcher,
``dcost_launch``, run by this interpreter), under a timeout (``--timeout``, default 600 s),
against a fresh program store and a fresh daemon directory (temporary directories, removed at
the end, the daemon stopped):

- ``import jax`` in a process of its own, the floor of any process that computes;
- ``dcost plan`` (the README's question) in its own process (``DCOST_DAEMON=0``): on the empty
  store, then warm (the median of ``--runs``);
- ``dcost daemon start`` (the daemon imports dcost and every subcommand before it answers);
- through the daemon: the README's plan first (the daemon loads the programs the process runs
  stored), then again (the median of ``--runs``), then another model, chip and rate (a plan of the
  same structure: the daemon's programs in memory), ``dcost eval``, and ``dcost simulate`` (64
  closed-loop clients; warm in its own process beside it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PLAN = ["plan", "--hardware", "h100-sxm", "--model", "llama-3-70b", "--traffic", "chat"]
PLAN += ["--rate", "100"]
NEXT = ["plan", "--hardware", "h200", "--model", "qwen3-32b", "--traffic", "chat", "--rate", "50"]
EVAL = ["eval", "--hardware", "h100-sxm", "--model", "llama-3-70b", "--batch", "64"]
EVAL += ["--chips", "8", "--context", "4096"]
SIMULATE = ["simulate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--engine", "vllm"]
SIMULATE += ["--clients", "64", "--prompt", "1024", "--output", "256"]
_LAUNCH = "import dcost_launch; dcost_launch.run()"  # the console script, as a user runs it


def timed(args, env, timeout) -> float:
    """Wall seconds of one ``dcost`` command (or of ``python -c`` when ``args`` starts with
    ``-c``); raises when it fails."""
    cmd = [sys.executable, *args] if args[0] == "-c" else [sys.executable, "-c", _LAUNCH, *args]
    t = time.perf_counter()
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
    wall = time.perf_counter() - t
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} exited {out.returncode}: {out.stderr[-2000:]}")
    return wall


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="runs of each warm figure")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds a command may take")
    a = parser.parse_args(argv)
    if a.runs < 1 or not a.timeout > 0:
        parser.error(f"--runs = {a.runs} must be >= 1 and --timeout = {a.timeout} > 0")
    cache, run_dir = tempfile.mkdtemp(), tempfile.mkdtemp()
    os.chmod(run_dir, 0o700)
    env = dict(os.environ, DCOST_CACHE_DIR=cache, DCOST_DAEMON_DIR=run_dir)
    env.pop("DCOST_CACHE", None)
    alone = dict(env, DCOST_DAEMON="0")
    rows = []

    def row(what, values):
        rows.append((what, values))
        shown = ", ".join(f"{v:.2f}" for v in values)
        print(f"{what:<58} {statistics.median(values):7.2f} s   ({shown})", flush=True)

    try:
        row("import jax (a process)", [timed(["-c", "import jax"], env, a.timeout)])
        row("dcost plan, own process, empty store", [timed(PLAN, alone, a.timeout)])
        row("dcost plan, own process, warm", [timed(PLAN, alone, a.timeout) for _ in range(a.runs)])
        row("dcost daemon start", [timed(["daemon", "start"], env, a.timeout)])
        row("dcost plan, daemon, first (programs from the store)", [timed(PLAN, env, a.timeout)])
        row("dcost plan, daemon, again", [timed(PLAN, env, a.timeout) for _ in range(a.runs)])
        row("dcost plan, daemon, another model, chip and rate", [timed(NEXT, env, a.timeout)])
        row("dcost eval, daemon, first", [timed(EVAL, env, a.timeout)])
        row("dcost eval, daemon, again", [timed(EVAL, env, a.timeout) for _ in range(a.runs)])
        row(
            "dcost simulate, own process, warm",
            [timed(SIMULATE, alone, a.timeout) for _ in range(a.runs)],
        )
        row("dcost simulate, daemon, first", [timed(SIMULATE, env, a.timeout)])
        row(
            "dcost simulate, daemon, again",
            [timed(SIMULATE, env, a.timeout) for _ in range(a.runs)],
        )
    finally:
        subprocess.run(
            [sys.executable, "-c", _LAUNCH, "daemon", "stop", "--all"],
            env=env,
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
