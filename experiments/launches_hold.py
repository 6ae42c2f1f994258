"""Do the planner's plans hold under the engine's own scheduler, launched as the plan says?

Claim (issue 29, "plans that hold in it"): a feasible aggregated plan for vLLM, SGLang or
TensorRT-LLM meets its TTFT and TPOT targets when its replicas run under that engine's scheduler
(``dcost.planning.server``: the running-sequence cap, the token budget with decode tokens counted
first, SGLang's order of a step, the KV cache, preemption) with the settings its launch sets
(``dcost.planning.launch.scheduler_settings``: the cap, a budget of the chunk beside the cap's
decodes, SGLang's mixed chunks, the share of HBM the plan left), within the simulation's sampling
error.
``experiments/plans_hold.py`` asks the same of the planner's own fleet simulation; this one asks
it of the engine's.

Setting: ``N`` random scenarios (seeded, as ``plans_hold``'s: a model, a traffic preset at a
log-uniform rate of 0.5-40 requests/s, TTFT targets of 0.5-5 s and TPOT targets of 20-100 ms at
the 99th percentile) and an engine, each planned aggregated on that engine's H100 profile. A
feasible plan's replicas get Poisson arrivals at the plan's rate with the preset's length means
and spreads (its prefix-hit share of every prompt already cached, ``launch_load``) for
``REQUESTS`` requests, ``SEEDS`` seeds, the engine's frontend time off (the plan's latencies are
the engine's), behind the router the plan assumes (``launch.ROUTER``, least-tokens: each request
to the replica with the fewest prompt tokens still to prefill), and again behind a least-requests
router (the fewest requests in flight, a least-connections balancer) and a least-prefill one (the
fewest prompts still to prefill, a queue-depth router) to show what the router costs. Misses
and touches as ``plans_hold.verdict`` (batch means). Then ``dcost plan
--check-launch`` (``check_launch``: the engine's frontend time in, seed 0) on each plan, and the
replicas it names where the launch misses, simulated again on seeds 1 and 2.

Run: ``python experiments/launches_hold.py [N]`` (default 30; about 3 minutes on 2 cores;
``--plot-only`` redraws the figure from the saved results).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import _common as C
import numpy as np
import plans_hold as H

import dcost
from dcost.planning.launch import (
    ROUTER,
    check_launch,
    launch_load,
    pool_server,
    scheduler_settings,
)
from dcost.planning.server import simulate_server
from dcost.plots import readable_log

ENGINES = ("vllm", "sglang", "trtllm")
HARDWARE = "h100-sxm"
REQUESTS = 4_000
SEEDS = 2


def planned(case: dict, engine: str, mode: str):
    """``(plan, row)``: the scenario planned in ``mode`` on the engine's H100 profile, and its
    result row so far (the case, the engine, feasible, the planning time)."""
    traffic = dcost.traffic(case["traffic"], rate=case["rate"])
    t0 = time.perf_counter()
    plan = dcost.plan(
        HARDWARE,
        case["model"],
        traffic,
        ttft_slo=(case["ttft_slo"], H.QUANTILE),
        tpot_slo=(case["tpot_slo"], H.QUANTILE),
        mode=mode,
        engine=engine,
    )
    row = dict(case, engine=engine, feasible=bool(plan.feasible))
    row["plan_seconds"] = time.perf_counter() - t0
    return plan, row


def run_one(case: dict, engine: str, requests: int, seeds: int) -> dict:
    plan, row = planned(case, engine, "aggregated")
    if not plan.feasible:
        return row
    (pool,) = plan.pools
    launch = scheduler_settings(pool, engine, plan.memory_reserve)
    eng = dcost.engine(engine, hardware=HARDWARE, frontend_time=0.0, **launch)
    srv = pool_server(pool, HARDWARE, case["model"], eng, ROUTER)
    load = launch_load(plan, requests)
    t0 = time.perf_counter()
    runs = [simulate_server(srv, load, seed=s) for s in range(seeds)]
    row.update(
        sim_seconds=time.perf_counter() - t0,
        chips=int(plan.chips),
        launch=launch,
        predicted_ttft=float(plan.ttft[H.QUANTILE]),
        predicted_tpot=float(plan.tpot[H.QUANTILE]),
        ttft=H.verdict([r.ttft[r.measured] for r in runs], case["ttft_slo"]),
        tpot=H.verdict([r.tpot[r.measured] for r in runs], case["tpot_slo"]),
        preemptions=int(sum(r.preemptions for r in runs)),
        unserved=int(sum(r.unserved for r in runs)),  # beyond a replica's KV cache: refused
    )
    if pool.replicas > 1:  # the same replicas behind a least-connections balancer, and
        # behind a router that counts prompts, not their tokens
        for other_router in ("least-requests", "least-prefill"):
            count = dataclasses.replace(srv, router=other_router)
            other = [simulate_server(count, load, seed=s) for s in range(seeds)]
            row[f"ttft_{other_router.replace('-', '_')}"] = H.verdict(
                [r.ttft[r.measured] for r in other], case["ttft_slo"]
            )
    # dcost plan --check-launch: the plan under the engine's scheduler as a client measures it
    # (the engine's frontend time in), seed 0; the replicas it names, on seeds it did not see
    chk = check_launch(plan, HARDWARE, case["model"], engine, requests=requests, seed=0)
    row["check"] = {"holds": chk.holds, "replicas": chk.replicas, "planned": chk.planned}
    if chk.replicas is not None and not chk.holds:
        client = dcost.engine(engine, hardware=HARDWARE, **launch)
        srv = dataclasses.replace(srv, engine=client, replicas=chk.replicas)
        again = [simulate_server(srv, load, seed=s) for s in range(1, seeds + 1)]
        row["check"]["ttft"] = H.verdict([r.ttft[r.measured] for r in again], case["ttft_slo"])
        row["check"]["tpot"] = H.verdict([r.tpot[r.measured] for r in again], case["tpot_slo"])
    return row


def run_all(run, n: int, requests: int, seeds: int, log=print) -> list[dict]:
    """``run(case, engine, requests, seeds)`` on the ``n`` seeded scenarios, each on an engine
    drawn for it (seed 1), a line logged per scenario."""
    rows = []
    rng = np.random.default_rng(1)
    for i, case in enumerate(H.scenarios(n)):
        engine = str(rng.choice(ENGINES))
        row = run(case, engine, requests, seeds)
        rows.append(row)
        if row["feasible"]:
            pools = f" {row['replicas']}" if "replicas" in row else ""
            log(
                f"{i:3d} {engine:6s} {case['model']:14s} {case['traffic']:15s} "
                f"{case['rate']:6.2f}/s {row['chips']:3d} chips{pools}  TTFT p99 "
                f"{row['predicted_ttft']:.3f} s sim {row['ttft']['pooled']:.3f} "
                f"(<= {case['ttft_slo']})  TPOT p99 {row['predicted_tpot'] * 1e3:.1f} ms sim "
                f"{row['tpot']['pooled'] * 1e3:.1f} (<= {case['tpot_slo'] * 1e3:.0f})"
                f"{'  TTFT MISS' if row['ttft']['miss'] else ''}"
                f"{'  TPOT MISS' if row['tpot']['miss'] else ''}"
                f"{'  (touch)' if row['ttft']['touch'] or row['tpot']['touch'] else ''}"
            )
        else:
            log(f"{i:3d} {engine:6s} {case['model']:14s} {case['traffic']:15s} infeasible")
    return rows


def counts(rows: list[dict], n: int, requests: int, seeds: int) -> dict:
    """The feasible plans that miss or touch a target, the requests refused as too long for a
    replica's KV cache, and the misses by engine."""
    feasible = [r for r in rows if r["feasible"]]
    return {
        "scenarios": n,
        "requests": requests,
        "seeds": seeds,
        "quantile": H.QUANTILE,
        "feasible": len(feasible),
        "missed": sum(r["ttft"]["miss"] or r["tpot"]["miss"] for r in feasible),
        "missed_ttft": sum(r["ttft"]["miss"] for r in feasible),
        "missed_tpot": sum(r["tpot"]["miss"] for r in feasible),
        "touched": sum(
            (r["ttft"]["touch"] or r["tpot"]["touch"])
            and not (r["ttft"]["miss"] or r["tpot"]["miss"])
            for r in feasible
        ),
        "unserved": sum(r["unserved"] for r in feasible),
        "by_engine": {
            e: {
                "feasible": sum(r["engine"] == e for r in feasible),
                "missed": sum(
                    r["engine"] == e and (r["ttft"]["miss"] or r["tpot"]["miss"]) for r in feasible
                ),
            }
            for e in ENGINES
        },
    }


def compute(n: int = 30, requests: int = REQUESTS, seeds: int = SEEDS, log=print) -> dict:
    rows = run_all(run_one, n, requests, seeds, log)
    feasible = [r for r in rows if r["feasible"]]
    out: dict = counts(rows, n, requests, seeds)
    out.update(
        routed=sum("ttft_least_requests" in r for r in feasible),
        missed_least_requests=sum(
            r["ttft_least_requests"]["miss"] for r in feasible if "ttft_least_requests" in r
        ),
        missed_least_prefill=sum(
            r["ttft_least_prefill"]["miss"] for r in feasible if "ttft_least_prefill" in r
        ),
        check_missed=sum(not r["check"]["holds"] for r in feasible),
        check_repaired=sum(
            r["check"]["replicas"] is not None and not r["check"]["holds"] for r in feasible
        ),
        check_repaired_miss=sum(
            "ttft" in r["check"] and (r["check"]["ttft"]["miss"] or r["check"]["tpot"]["miss"])
            for r in feasible
        ),
        check_extra_replicas=sum(
            r["check"]["replicas"] - r["check"]["planned"]
            for r in feasible
            if r["check"]["replicas"] is not None
        ),
        check_planned_replicas=sum(  # the planned replicas of the plans it repaired
            r["check"]["planned"]
            for r in feasible
            if r["check"]["replicas"] is not None and not r["check"]["holds"]
        ),
        rows=rows,
    )
    return out


def plot(res: dict):
    fig, axes = C.figure(2, width=4.6, height=4.0)
    rows = [r for r in res["rows"] if r["feasible"]]
    marks = {"vllm": "o", "sglang": "s", "trtllm": "^"}
    for ax, key, slo, label in (
        (axes[0], "ttft", "ttft_slo", "TTFT p99"),
        (axes[1], "tpot", "tpot_slo", "TPOT p99"),
    ):
        for e, m in marks.items():
            mine = [r for r in rows if r["engine"] == e]
            if not mine:
                continue
            x = [r[f"predicted_{key}"] / r[slo] for r in mine]
            y = [r[key]["pooled"] / r[slo] for r in mine]
            ax.scatter(x, y, marker=m, s=22, alpha=0.75, label=e)
        ax.axhline(1.0, color="k", lw=0.8)
        lo = min(min(r[f"predicted_{key}"] / r[slo], r[key]["pooled"] / r[slo]) for r in rows)
        line = np.array([lo / 1.3, 2.5])
        ax.plot(line, line, color="grey", lw=0.8, ls=":", label="as planned")
        ax.set_xscale("log")
        ax.set_yscale("log")
        readable_log(ax.xaxis)
        readable_log(ax.yaxis)
        ax.set_xlabel(f"planned {label} / target")
        ax.set_ylabel(f"engine-simulated {label} / target")
        ax.legend(fontsize=8)
    fig.suptitle(
        f"{res['feasible']} feasible aggregated plans under their engine's scheduler, launched "
        f"as planned ({ROUTER} router): {res['missed']} miss, {res['touched']} touch\n(above the "
        "line: over the target; a touch is within the simulation's sampling error of it)"
    )
    fig.tight_layout()
    return fig


def save(res: dict) -> None:
    """The results and figure under ``experiments/results``, the figure in ``docs/figures`` too
    (the planning how-to shows it)."""
    C.save("launches_hold", plot(res), res)
    plot(res).savefig(
        C.ROOT / "docs" / "figures" / "launches_hold.png", dpi=110, bbox_inches="tight"
    )


def main() -> None:
    if "--plot-only" in sys.argv:  # redraw the figures from the saved results
        save(json.loads((C.RESULTS / "launches_hold.json").read_text()))
        return
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    res = compute(n)
    save(res)
    print(
        f"{res['feasible']} feasible of {n}; missed {res['missed']} (TTFT {res['missed_ttft']}, "
        f"TPOT {res['missed_tpot']}); touched {res['touched']}; by engine {res['by_engine']}"
    )
    print(
        f"behind a least-requests router, {res['missed_least_requests']} of the {res['routed']} "
        f"plans of several replicas miss their TTFT target; behind least-prefill, "
        f"{res['missed_least_prefill']}"
    )
    print(
        f"check-launch: {res['check_missed']} miss as launched; replicas found for "
        f"{res['check_repaired']}, of which {res['check_repaired_miss']} miss on fresh seeds; "
        f"{res['check_extra_replicas']} replicas added to {res['check_planned_replicas']}"
    )
    print(json.dumps({k: v for k, v in res.items() if k != "rows"}))


if __name__ == "__main__":
    main()
