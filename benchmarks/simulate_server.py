"""How fast ``dcost.simulate(server, load)`` runs: 20,000 requests of one deployment.

Prints ``import jax`` timed in the same run, the step table's build (one vmapped evaluation of the
serving model, compiled on first use), and the event loop's time for 20,000 requests, open loop
(Poisson at 60 requests/s) and closed loop (256 clients), Llama 3.1 8B on an H100 under vLLM's
profile; then 20,000 requests of eight replicas at eight times the rate behind each router
(``Server.router``), and the same through a disaggregated deployment of two prefill and six
decode replicas (``simulate_disaggregated``: both pools' event loops). The issue's target is
20,000 requests in under 2 s on 2 cores; published discrete-event peers take 0.8 s, 9 s and
353 s a run.

    python benchmarks/simulate_server.py
"""

from __future__ import annotations

import subprocess
import sys
import time


def main() -> None:
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import jax"], check=True, timeout=120)
    print(f"import jax (fresh interpreter): {time.perf_counter() - t:.2f} s")

    import dcost
    from dcost.planning import server

    srv = dcost.Server("h100-sxm", "llama-3.1-8b", engine="vllm")
    loads = {
        "open loop, Poisson 60/s": dcost.Load(
            prompt=1024, output=256, stages=[(60.0, 20_000 / 60.0)], prompt_cv=0.5, output_cv=0.5
        ),
        "closed loop, 256 clients": dcost.Load(
            prompt=1024, output=256, clients=256, requests=20_000
        ),
    }
    for name, load in loads.items():
        for attempt in ("first (builds the step table)", "again"):
            t = time.perf_counter()
            run = server.simulate_server(srv, load, max_steps=2_000_000)
            dt = time.perf_counter() - t
            print(f"{name}, {attempt}: {len(run.ttft)} requests in {dt:.2f} s")
    # eight replicas at eight times the rate, behind each router (the step table is built once)
    wide = dcost.Load(
        prompt=1024, output=256, stages=[(480.0, 20_000 / 480.0)], prompt_cv=0.5, output_cv=0.5
    )
    for router in server.ROUTERS:
        fleet = dcost.Server("h100-sxm", "llama-3.1-8b", engine="vllm", replicas=8, router=router)
        server.simulate_server(fleet, wide, max_steps=2_000_000)  # the table
        t = time.perf_counter()
        run = server.simulate_server(fleet, wide, max_steps=2_000_000)
        dt = time.perf_counter() - t
        print(f"8 replicas, Poisson 480/s, {router} router: {len(run.ttft)} requests in {dt:.2f} s")
    # disaggregated: 2 prefill and 6 decode replicas at the same rate, both pools' event loops
    pre = dcost.Server(
        "h100-sxm", "llama-3.1-8b", engine="vllm", replicas=2, router="least-prefill"
    )
    dec = dcost.Server("h100-sxm", "llama-3.1-8b", engine="vllm", replicas=6)
    for attempt in ("first (builds both step tables)", "again"):
        t = time.perf_counter()
        run = server.simulate_disaggregated(pre, dec, wide, max_steps=2_000_000)
        dt = time.perf_counter() - t
        print(f"disaggregated 2 + 6 replicas, {attempt}: {len(run.ttft)} requests in {dt:.2f} s")


if __name__ == "__main__":
    main()
