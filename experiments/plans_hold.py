"""Do the planner's feasible plans hold in their own simulation?

Claim (issue 34): a plan that ``dcost.plan`` calls feasible meets its TTFT and TPOT targets when
its fleet is run request by request through ``dcost.simulate(plan)``, within the simulation's
own sampling error.

Setting: ``N`` random scenarios (seeded): a model (dense and MoE presets), calibrated H100s, a
traffic preset (lengths from public traces) at a log-uniform rate of 0.5-40 requests/s, a TTFT
target of 0.5-5 s and a TPOT target of 20-100 ms, both at the 99th percentile (the tail, where
closed forms err), in the aggregated or the disaggregated mode. Each feasible plan is simulated
with ``SEEDS`` seeds of ``REQUESTS`` requests.

Sampling error: requests that share a batch or a prefill queue are not independent draws, so
an order-statistic interval is too narrow; the error is estimated by batch means (Law and
Kelton, "Simulation Modeling and Analysis", sec. 9.5.3): each seed's measured requests, in
arrival order, are cut into ``BLOCKS`` consecutive blocks and the standard error of the pooled
percentile is the spread of the blocks' percentiles over ``sqrt(blocks)``. A plan **misses** a
target when its pooled simulated percentile less twice that error is above the target, and
**touches** it when the pooled percentile is above the target but within that error.

Run: ``python experiments/plans_hold.py [N]`` (default 100; about half an hour on 2 cores).
"""

from __future__ import annotations

import json
import sys
import time

import _common as C
import numpy as np

import dcost

MODELS = {
    "llama-3.1-8b": "dense",
    "qwen3-14b": "dense",
    "qwen3-30b-a3b": "moe",
    "mixtral-8x7b": "moe",
}
MODES = ("aggregated", "disaggregated")
QUANTILE = 0.99
REQUESTS = 4_000
SEEDS = 2
BLOCKS = 5
RATES = (0.5, 40.0)
TTFT_SLOS = (0.5, 1.0, 2.0, 5.0)
TPOT_SLOS = (0.02, 0.03, 0.05, 0.1)


def scenarios(n: int, seed: int = 0) -> list[dict]:
    """``n`` random scenarios (model, traffic preset, rate, targets, mode)."""
    rng = np.random.default_rng(seed)
    names = dcost.planning.traffic_names()
    out = []
    for _ in range(n):
        out.append(
            dict(
                model=str(rng.choice(list(MODELS))),
                traffic=str(rng.choice(names)),
                rate=float(np.exp(rng.uniform(*np.log(RATES)))),
                ttft_slo=float(rng.choice(TTFT_SLOS)),
                tpot_slo=float(rng.choice(TPOT_SLOS)),
                mode=str(rng.choice(MODES)),
            )
        )
    return out


def verdict(samples: list[np.ndarray], target: float, q: float = QUANTILE) -> dict:
    """Whether simulated samples (one array per seed, in arrival order) meet ``target`` at
    ``q``: the pooled percentile, its batch-means standard error and the verdict."""
    finite = [s[np.isfinite(s)] for s in samples]
    pooled = float(np.quantile(np.concatenate(finite), q))
    blocks = [float(np.quantile(b, q)) for s in finite for b in np.array_split(s, BLOCKS)]
    error = float(np.std(blocks, ddof=1) / np.sqrt(len(blocks)))
    miss = pooled - 2.0 * error > target
    return dict(
        pooled=pooled, error=error, miss=bool(miss), touch=bool(not miss and pooled > target)
    )


def run_one(case: dict, hardware, requests: int, seeds: int) -> dict:
    traffic = dcost.traffic(case["traffic"], rate=case["rate"])
    t0 = time.perf_counter()
    plan = dcost.plan(
        hardware,
        case["model"],
        traffic,
        ttft_slo=(case["ttft_slo"], QUANTILE),
        tpot_slo=(case["tpot_slo"], QUANTILE),
        mode=case["mode"],
    )
    row = dict(case, feasible=bool(plan.feasible), plan_seconds=time.perf_counter() - t0)
    if not plan.feasible:
        return row
    sims = [dcost.simulate(plan, requests=requests, seed=s) for s in range(seeds)]
    ttft = [s.ttft[s.measured] for s in sims]
    tpot = [s.tpot[s.measured] for s in sims]
    row.update(
        chips=int(plan.chips),
        predicted_ttft=float(plan.ttft[QUANTILE]),
        predicted_tpot=float(plan.tpot[QUANTILE]),
        ttft=verdict(ttft, case["ttft_slo"]),
        tpot=verdict(tpot, case["tpot_slo"]),
        truncated=any(s.truncated for s in sims),
    )
    return row


def compute(
    n: int = 100, requests: int = REQUESTS, seeds: int = SEEDS, log=print, partial=None
) -> dict:
    hardware = dcost.hardware("h100-sxm", calibrated=True)
    rows = []
    for i, case in enumerate(scenarios(n)):
        row = run_one(case, hardware, requests, seeds)
        rows.append(row)
        if partial is not None:  # what is done so far, should the run be cut short
            partial(summarize(rows, n, requests, seeds))
        if row["feasible"]:
            log(
                f"{i:3d} {case['model']:14s} {case['traffic']:15s} {case['rate']:6.2f}/s "
                f"{case['mode']:13s} {row['chips']:3d} chips  TTFT p99 {row['predicted_ttft']:.3f}"
                f" s sim {row['ttft']['pooled']:.3f} (<= {case['ttft_slo']})  TPOT p99 "
                f"{row['predicted_tpot'] * 1e3:.2f} ms sim {row['tpot']['pooled'] * 1e3:.2f} "
                f"(<= {case['tpot_slo'] * 1e3:.0f})"
                f"{'  TTFT MISS' if row['ttft']['miss'] else ''}"
                f"{'  TPOT MISS' if row['tpot']['miss'] else ''}"
                f"{'  (touch)' if row['ttft']['touch'] or row['tpot']['touch'] else ''}"
            )
        else:
            log(f"{i:3d} {case['model']:14s} {case['traffic']:15s} infeasible")
    return summarize(rows, n, requests, seeds)


def summarize(rows: list[dict], n: int, requests: int, seeds: int) -> dict:
    """The counts over the scenarios run so far (``done`` of ``n``)."""
    feasible = [r for r in rows if r["feasible"]]
    miss = [r for r in feasible if r["ttft"]["miss"] or r["tpot"]["miss"]]
    touch = [r for r in feasible if r not in miss and (r["ttft"]["touch"] or r["tpot"]["touch"])]
    return dict(
        scenarios=n,
        done=len(rows),
        requests=requests,
        seeds=seeds,
        quantile=QUANTILE,
        feasible=len(feasible),
        missed=len(miss),
        missed_ttft=sum(r["ttft"]["miss"] for r in feasible),
        missed_tpot=sum(r["tpot"]["miss"] for r in feasible),
        touched=len(touch),
        rows=rows,
    )


def plot(results: dict):
    fig, axes = C.figure(ncols=2)
    for ax, key, unit in ((axes[0], "ttft", "s"), (axes[1], "tpot", "ms")):
        for r in results["rows"]:
            if not r["feasible"]:
                continue
            target = r[f"{key}_slo"]
            color = C.COLORS[MODELS[r["model"]]]
            marker = "x" if r[key]["miss"] else "o"
            ax.scatter(
                r[f"predicted_{key}"] / target,
                r[key]["pooled"] / target,
                c=color,
                s=14,
                marker=marker,
            )
        ax.axhline(1.0, color=C.COLORS["grey"], lw=0.8)
        ax.axvline(1.0, color=C.COLORS["grey"], lw=0.8)
        ax.plot([0, 1.5], [0, 1.5], color=C.COLORS["grey"], lw=0.6, ls="--")
        ax.set_xlabel(f"{key.upper()} p99 predicted / target")
        ax.set_ylabel(f"{key.upper()} p99 simulated / target")
        ax.set_title(f"{key.upper()} ({unit}); red MoE, blue dense; x: miss")
    return fig


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100

    def partial(summary):
        path = C.RESULTS / "plans_hold.json"
        path.write_text(json.dumps(C.jsonable(summary), indent=2) + "\n", encoding="utf-8")

    results = compute(n, partial=partial)
    print(
        f"{results['feasible']} of {results['done']} plans feasible; "
        f"{results['missed']} miss a target beyond sampling error "
        f"(TTFT {results['missed_ttft']}, TPOT {results['missed_tpot']}); "
        f"{results['touched']} more within it"
    )
    C.save("plans_hold", plot(results), results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
