"""Do disaggregated plans hold under their engines' schedulers, launched as planned?

Claim (issue 29, "plans that hold in it"): a feasible disaggregated plan for vLLM, SGLang or
TensorRT-LLM meets its TTFT and TPOT targets when its prefill replicas and its decode replicas
each run under that engine's scheduler (``dcost.planning.server.simulate_disaggregated``: the
prefill pool's running-sequence cap and chunk budget, each prompt's KV cache moved over the
prefill replica's scale-out links as the planner prices it, the decode pool's cap, KV cache,
preemption and the wait to join its batch) with the settings its launch sets
(``dcost.planning.launch.scheduler_settings`` per pool), within the simulation's sampling error.
``experiments/launches_hold.py`` asks it of aggregated plans.

Setting: the ``N`` seeded scenarios of ``plans_hold`` and ``launches_hold`` (a model, a traffic
preset at a log-uniform rate of 0.5-40 requests/s, TTFT targets of 0.5-5 s and TPOT targets of
20-100 ms at the 99th percentile) on the engine ``launches_hold`` draws for each, planned
disaggregated on that engine's H100 profile. A feasible plan's pools get Poisson arrivals at the
plan's rate with the preset's lengths (``launch_load``) for ``REQUESTS`` requests, ``SEEDS``
seeds, the engine's frontend time off (the plan's latencies are the engine's), the prefill pool
behind the router the plan assumes (``launch.ROUTER``; where it has several replicas, again
behind a least-prefill one, which counts prompts, not their tokens), the decode pool behind a
least-requests one. Misses and touches as ``plans_hold.verdict`` (batch means).

Run: ``python experiments/disaggregated_launches.py [N]`` (default 30; a few minutes on 2
cores; ``--plot-only`` redraws the figure from the saved results).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import _common as C
import launches_hold as L
import plans_hold as H

import dcost
from dcost.planning.launch import ROUTER, launch_load, pool_server, scheduler_settings
from dcost.planning.server import simulate_disaggregated

ENGINES, HARDWARE, REQUESTS, SEEDS = L.ENGINES, L.HARDWARE, L.REQUESTS, L.SEEDS


def run_one(case: dict, engine: str, requests: int, seeds: int) -> dict:
    plan, row = L.planned(case, engine, "disaggregated")
    if not plan.feasible:
        return row
    pools = {p.role: p for p in plan.pools}
    srv = {}
    for role in ("prefill", "decode"):  # the decode pool behind least-requests (pool_server)
        launch = scheduler_settings(pools[role], engine, plan.memory_reserve, HARDWARE)
        eng = dcost.engine(engine, hardware=HARDWARE, frontend_time=0.0, **launch)
        srv[role] = pool_server(pools[role], HARDWARE, case["model"], eng, ROUTER)
        row[f"launch_{role}"] = launch
    load = launch_load(plan, requests)
    t0 = time.perf_counter()
    runs = [
        simulate_disaggregated(srv["prefill"], srv["decode"], load, seed=s) for s in range(seeds)
    ]
    row.update(
        sim_seconds=time.perf_counter() - t0,
        chips=int(plan.chips),
        replicas={role: int(pools[role].replicas) for role in pools},
        predicted_ttft=float(plan.ttft[H.QUANTILE]),
        predicted_tpot=float(plan.tpot[H.QUANTILE]),
        ttft=H.verdict([r.ttft[r.measured] for r in runs], case["ttft_slo"]),
        tpot=H.verdict([r.tpot[r.measured] for r in runs], case["tpot_slo"]),
        preemptions=int(sum(r.preemptions for r in runs)),
        unserved=int(sum(r.unserved for r in runs)),  # beyond a replica's KV cache: not sent
    )
    if pools["prefill"].replicas > 1:  # the prefill pool behind a router counting prompts
        counted = dataclasses.replace(srv["prefill"], router="least-prefill")
        other = [simulate_disaggregated(counted, srv["decode"], load, seed=s) for s in range(seeds)]
        row["ttft_least_prefill"] = H.verdict([r.ttft[r.measured] for r in other],
                                              case["ttft_slo"])  # fmt: skip
    return row


def compute(n: int = 30, requests: int = REQUESTS, seeds: int = SEEDS, log=print) -> dict:
    rows = L.run_all(run_one, n, requests, seeds, log)  # launches_hold's scenarios and engines
    counted = [r for r in rows if "ttft_least_prefill" in r]
    return {
        **L.counts(rows, n, requests, seeds),
        "routed": len(counted),
        "missed_least_prefill": sum(r["ttft_least_prefill"]["miss"] for r in counted),
        "rows": rows,
    }


def plot(res: dict):
    fig = L.plot(res)
    fig.suptitle(
        f"{res['feasible']} feasible disaggregated plans under their engine's scheduler, "
        f"launched as planned: {res['missed']} miss, {res['touched']} touch\n(above the line: "
        "over the target; a touch is within the simulation's sampling error of it)"
    )
    return fig


def main() -> None:
    if "--plot-only" in sys.argv:
        res = json.loads((C.RESULTS / "disaggregated_launches.json").read_text())
    else:
        n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
        res = compute(n)
    C.save("disaggregated_launches", plot(res), res)
    print(
        f"{res['feasible']} feasible of {res['scenarios']}; missed {res['missed']} (TTFT "
        f"{res['missed_ttft']}, TPOT {res['missed_tpot']}); touched {res['touched']}; by "
        f"engine {res['by_engine']}"
    )
    print(
        f"behind a least-prefill router, {res['missed_least_prefill']} of the {res['routed']} "
        "plans of several prefill replicas miss their TTFT target"
    )
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}))


if __name__ == "__main__":
    main()
