"""How fast does the explorer page (``dcost serve``) update as a slider moves?

    python benchmarks/serve_latency.py [--updates 30] [--timeout 600] [--warm-cache]

Starts the app in this process (uvicorn on a free port of 127.0.0.1, in a thread) and does what
the page does when a control moves: the four requests (``/api/curve``, ``/api/optimum``,
``/api/elasticities``, ``/api/fleet``) at once, over HTTP, an update being done when the last
answer is in. The first update compiles the programs; then ``--updates`` updates move one slider
at a time (context, output, batch, chips, TPOT target, traffic rate), each to a value it has not
had, from the page's default question (llama-3-70b on H100s). The server recomputes only the
answers that read the field moved (``dcost.web.queries.DEPENDS``: the batch slider, the curve
alone); the others come back remembered. Target: every update after the first within 200 ms.

``import jax`` is timed in a fresh interpreter in the same run, as a yardstick of the machine's
speed at that moment. dcost's persistent compilation cache is off (``DCOST_CACHE=0``) so that the
first update is a cold start, unless ``--warm-cache`` (then it loads what an earlier run stored).
Wall times on a shared machine include other processes' load. The whole run is bounded by
``--timeout`` seconds: past it, the traceback of every thread and exit status 1; a request
past its own bound (the same) fails the run rather than hang it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import faulthandler
import json
import os
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

ANSWERS = ("curve", "optimum", "elasticities", "fleet")
TARGET_S = 0.2
# one slider moved per update, the fields in turn; the k-th move of a field gives it a value it
# has not had before (so no update finds its answers remembered from an earlier one)
MOVES = (
    ("context", lambda k: 2048 + 64 * (k + 1)),
    ("output", lambda k: 256 + 8 * (k + 1)),
    ("batch", lambda k: 64 + 3 * (k + 1)),
    ("chips", lambda k: (4, 16, 2, 6, 12, 1, 3, 24, 32, 5)[k % 10]),
    ("tpot_slo", lambda k: round(0.05 + 0.002 * (k + 1), 4)),
    ("rate", lambda k: round(10.0 * 1.1 ** (k + 1), 3)),
)


def time_import_jax(timeout: float) -> float:
    """Seconds to ``import jax`` in a fresh interpreter."""
    code = "import time; t = time.perf_counter(); import jax; print(time.perf_counter() - t)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def start_server():
    """The app on a free port of 127.0.0.1, served by uvicorn in a daemon thread."""
    import uvicorn

    from dcost.cli.serve import bind
    from dcost.web.app import create_app

    sock = bind("127.0.0.1", 0)
    server = uvicorn.Server(uvicorn.Config(create_app(), log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the server did not start within 30 s")
        time.sleep(0.01)
    host, port = sock.getsockname()[:2]
    return server, f"http://{host}:{port}"


def fetch(url: str, timeout: float) -> tuple[float, dict]:
    start = time.perf_counter()
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body = json.load(r)
    return time.perf_counter() - start, body


def update(pool, base: str, params: dict, timeout: float) -> tuple[float, dict]:
    """The page's four requests at once; (wall seconds until the last answer, per-answer s)."""
    query = urllib.parse.urlencode(params)
    start = time.perf_counter()
    futures = {name: pool.submit(fetch, f"{base}/api/{name}?{query}", timeout) for name in ANSWERS}
    each = {name: f.result(timeout=timeout)[0] for name, f in futures.items()}
    return time.perf_counter() - start, each


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--updates", type=int, default=30, help="updates after the first (30)")
    ap.add_argument("--timeout", type=float, default=600.0, help="bound on the whole run, s")
    ap.add_argument(
        "--warm-cache", action="store_true", help="use dcost's persistent compilation cache"
    )
    args = ap.parse_args(argv)
    if args.updates < 1:
        ap.error("--updates must be >= 1")
    faulthandler.dump_traceback_later(args.timeout, exit=True)  # never hang: exit status 1
    if not args.warm_cache:
        os.environ["DCOST_CACHE"] = "0"

    t_jax = time_import_jax(timeout=min(120.0, args.timeout))
    start = time.perf_counter()
    from dcost.web import queries  # imports dcost

    t_dcost = time.perf_counter() - start
    server, base = start_server()
    params = dict(queries.DEFAULTS)
    try:
        with concurrent.futures.ThreadPoolExecutor(len(ANSWERS)) as pool:
            first, first_each = update(pool, base, params, args.timeout)
            walls, each, slow = [], {name: [] for name in ANSWERS}, []
            by_field: dict[str, list[float]] = {field: [] for field, _ in MOVES}
            for i in range(args.updates):
                field, value = MOVES[i % len(MOVES)]
                params[field] = value(i // len(MOVES))
                wall, per = update(pool, base, params, args.timeout)
                walls.append(wall)
                by_field[field].append(wall)
                if wall > TARGET_S:
                    slow.append((i + 1, field, params[field], wall, per))
                for name in ANSWERS:
                    each[name].append(per[name])
    finally:
        server.should_exit = True
    faulthandler.cancel_dump_traceback_later()

    ms = 1e3
    walls.sort()
    p90 = walls[min(len(walls) - 1, int(0.9 * len(walls)))]
    print(f"import jax (fresh interpreter):  {t_jax * ms:8.0f} ms")
    print(f"import dcost (this process):     {t_dcost * ms:8.0f} ms")
    print(
        f"first update (compiles):         {first * ms:8.0f} ms   "
        + ", ".join(f"{n} {first_each[n] * ms:.0f}" for n in ANSWERS)
    )
    print(
        f"later updates ({len(walls)}): median {statistics.median(walls) * ms:.1f} ms, "
        f"p90 {p90 * ms:.1f} ms, max {walls[-1] * ms:.1f} ms "
        f"(target <= {TARGET_S * ms:.0f} ms: {'met' if walls[-1] <= TARGET_S else 'NOT met'})"
    )
    print(
        "  per answer, median: "
        + ", ".join(f"{n} {statistics.median(each[n]) * ms:.1f} ms" for n in ANSWERS)
    )
    print(
        "  by the slider moved, median: "
        + ", ".join(f"{f} {statistics.median(v) * ms:.0f} ms" for f, v in by_field.items() if v)
    )
    print(f"  (later updates / import jax: {statistics.median(walls) / t_jax:.2f})")
    for i, field, value, wall, per in slow:
        print(
            f"  over the target: update {i} ({field} = {value}): {wall * ms:.0f} ms ("
            + ", ".join(f"{n} {per[n] * ms:.0f}" for n in ANSWERS)
            + ")"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
