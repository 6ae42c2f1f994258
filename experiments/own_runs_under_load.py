"""Can a deployment's own runs under load calibrate its TTFT? (issues 29 and 30; not shipped)

Claim tested: the silicon sample's TTFT under load (``experiments/serving_under_load.py``: the
benchmark's closed loop simulated with the engine's scheduler) is off by a factor that belongs to
the deployment, so k = 3 of its own runs should calibrate it, as they do its TPOT
(``experiments/own_measurements.py``).

For deployments drawn at random (seeded, an equal number per engine) from the aggregated runs of
AIConfigurator's silicon sample (``own_measurements.groups``: 4 or more runs), 3 runs calibrate
and up to 6 others are predicted, held out. Every variant starts from the shipped profile with
fixed costs fitted without the deployment's model (``fixed_costs_held_out``) and simulates each
run as ``serving_under_load`` does (the generator's settings, AIPerf's 20 x C requests):

- ``shipped``: nothing fitted (k = 0);
- ``tpot``: the profile fitted to the 3 runs' TPOT (``dcost.calibrate.fit``, shipped);
- ``compute``: then one factor on every compute rate of the profile (GEMM, grouped-expert and
  attention efficiencies), fitted to the 3 runs' simulated TTFT and TPOT (MAP in its log, prior
  spread 1, measurement spread 10 %, golden-section search);
- ``frontend``: instead, the time a request spends before the engine (``frontend_time``): the
  additive offset that best fits the 3 runs' log TTFT;
- ``order``: SGLang only, the scheduler order (``prefill_first`` or mixed chunks) that fits the
  3 runs' TTFT best, on the profile fitted to their TPOT.

    python experiments/own_runs_under_load.py [--per-engine N] [--seed S]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import json
import math
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments"))

K = 3
HELD = 6
SIGMA = 0.1  # spread of one measurement's log
PRIOR = 1.0  # prior spread of log(compute factor)
VARIANTS = ("shipped", "tpot", "compute", "frontend", "order")


def compute_scaled(eng, s: float):
    """``eng`` with every compute rate of its profile times ``s`` (an efficiency stays <= 1)."""
    prof = dict(eng.profile)
    if "attention_efficiency" in prof:
        prof["attention_efficiency"] = min(1.0, prof["attention_efficiency"] * s)
    rates = ("flops_efficiency", "expert_flops_efficiency")
    pp = {
        p: {f: (min(1.0, v * s) if f in rates else v) for f, v in d.items()}
        for p, d in eng.precision_profile.items()
    }
    return eng.with_profile(profile=prof, precision_profile=pp)


def _golden(f, a: float, b: float, steps: int = 9) -> float:
    g = (math.sqrt(5.0) - 1.0) / 2.0
    c, d = b - g * (b - a), a + g * (b - a)
    fc, fd = f(c), f(d)
    for _ in range(steps):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - g * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + g * (b - a)
            fd = f(d)
    return c if fc < fd else d


def compute(per_engine: int = 10, seed: int = 7, log=print) -> dict:
    import own_measurements
    import serving_under_load as sul

    import dcost
    from dcost.calibrate import user
    from dcost.validation import silicon

    recs, _ = silicon.records()
    rows = {r["id"]: r for r in silicon.load_rows()}
    agg = [  # the draw of the runs before 2026-12-03 (silicon.DRAWN_BEFORE)
        r
        for r in recs
        if r["metric"] == "tpot" and r["mode"] == "agg" and r["model"] not in silicon.DRAWN_BEFORE
    ]
    by = own_measurements.groups(agg)
    held_costs = dcost.engines.heldout()["fixed_costs_held_out"]
    rng = np.random.default_rng(seed)
    per: dict = collections.defaultdict(list)
    for key in sorted(by, key=str):
        per[key[0]].append(key)
    chosen = []
    for _, keys in sorted(per.items()):
        chosen += [keys[i] for i in rng.choice(len(keys), min(per_engine, len(keys)), False)]

    def measured(r):
        row = rows[r["id"][len("silicon-") : -len("-tpot")]]
        return float(row["silicon_ttft_ms"]) * 1e-3, int(row["batch_size"])

    def sim(r, eng, order=None, front=None):
        e = sul.deployed(eng, r, measured(r)[1])
        sched = e.scheduler
        if order is not None:
            sched = dataclasses.replace(sched, prefill_first=order)
        if front is not None:
            sched = dataclasses.replace(sched, frontend_time=front)
        srv = sul.server_for(r, dataclasses.replace(e, scheduler=sched))
        m = sul.benchmark_means(srv, r["prompt_tokens"], r["output_tokens"], int(r["concurrency"]))
        return m["ttft"], m["tpot"]

    out, fits = [], []
    t0 = time.perf_counter()
    for n_done, key in enumerate(chosen):
        runs = by[key]
        eng = own_measurements.prior(key, runs, held_costs)
        if eng is None:
            continue
        pick = rng.permutation(len(runs))
        own, held = [runs[i] for i in pick[:K]], [runs[i] for i in pick[K : K + HELD]]
        cal = user.fit(own, eng)

        def loss(x, own=own, cal=cal):
            e = compute_scaled(cal, math.exp(x))
            total = 0.5 * x**2 / PRIOR**2
            for r in own:
                ttft, tpot = sim(r, e)
                total += (
                    0.5
                    * (math.log(ttft / measured(r)[0]) ** 2 + math.log(tpot / r["value"]) ** 2)
                    / SIGMA**2
                )
            return total

        scale = math.exp(_golden(loss, math.log(0.05), math.log(2.0)))
        front = float(cal.scheduler.frontend_time)
        pairs = [(measured(r)[0], sim(r, cal)[0]) for r in own]
        grid = np.r_[-front, -front + np.geomspace(1e-4, 30.0, 400)]
        sims, meas = np.array([s for _, s in pairs]), np.array([m for m, _ in pairs])
        err = np.log(np.maximum(sims[None, :] + grid[:, None], 1e-5) / meas[None, :])
        offset = float(grid[int(np.argmin((err**2).sum(1)))])
        order = None
        if key[0] == "sglang":
            order = min(
                (False, True),
                key=lambda o, own=own, cal=cal: sum(
                    math.log(sim(r, cal, o)[0] / measured(r)[0]) ** 2 for r in own
                ),
            )
        fits.append(
            {"deployment": list(map(str, key)), "compute": scale, "frontend": front + offset}
            | ({"prefill_first": order} if order is not None else {})
        )
        for r in held:
            ttft = measured(r)[0]
            pred = {
                "shipped": sim(r, eng),
                "tpot": sim(r, cal),
                "compute": sim(r, compute_scaled(cal, scale)),
                "frontend": sim(r, cal, front=front + offset),
            }
            pred["order"] = sim(r, cal, order) if order is not None else pred["tpot"]
            out.append(
                {
                    "id": r["id"],
                    "engine": key[0],
                    "concurrency": int(r["concurrency"]),
                    "ttft": ttft,
                    "tpot": r["value"],
                    "predicted": pred,
                }
            )
        log(f"{n_done + 1}/{len(chosen)} deployments, {time.perf_counter() - t0:.0f} s")
    return {
        "source": silicon.SOURCE,
        "split": f"{K} runs of a deployment calibrate, up to {HELD} others held out",
        "deployments": len(fits),
        "summary": summarize(out),
        "fits": fits,
        "runs": out,
        "seconds": time.perf_counter() - t0,
    }


def summarize(out: list[dict]) -> dict:
    table: dict = {}
    for scope in ["all", *sorted({x["engine"] for x in out})]:
        sel = [x for x in out if scope in ("all", x["engine"])]
        table[scope] = {"runs": len(sel)}
        for j, metric in enumerate(("ttft", "tpot")):
            for v in VARIANTS:
                e = np.array([abs(x["predicted"][v][j] / x[metric] - 1.0) for x in sel])
                table[scope][f"{metric}_{v}"] = {
                    "median": float(np.median(e)),
                    "p90": float(np.quantile(e, 0.9)),
                }
    return table


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-engine", type=int, default=10)
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args(argv)
    table = compute(args.per_engine, args.seed)
    path = ROOT / "experiments" / "results" / "own_runs_under_load.json"
    path.write_text(json.dumps(table, indent=1) + "\n")
    for scope, row in table["summary"].items():
        print(f"{scope} ({row['runs']} held-out runs)")
        for metric in ("ttft", "tpot"):
            cells = ", ".join(
                f"{v} {100 * row[f'{metric}_{v}']['median']:.1f} % "
                f"({100 * row[f'{metric}_{v}']['p90']:.0f} %)"
                for v in VARIANTS
            )
            print(f"  {metric}: {cells}")
    print(f"{table['seconds']:.0f} s; {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
