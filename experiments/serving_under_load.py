"""The silicon sample's runs under load, simulated with the engine's scheduler (issue 29).

Claim: with the engine's scheduler and step times, the simulation's TTFT and TPOT at a run's
concurrency should be within a median 20 % (p90 50 %) of the measured ones.

Each aggregated run of AIConfigurator's silicon sample is a benchmark client at a fixed
concurrency; ``dcost.planning.server.simulate_server`` runs the same closed loop through the
engine's scheduler and its profile's step times. Measured TTFT and TPOT against simulated, for a
stratified sample of runs (fixed seed), with clients staggered (independent clients in steady
state) and in lockstep (all start at once with identical lengths): the two ends of how
synchronized a benchmark's clients are. Nothing here is fitted to the runs.

    python experiments/serving_under_load.py [--runs N]
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]


def sample(n: int, seed: int = 0):
    from dcost.validation import silicon

    recs, _ = silicon.records()
    rows = {r["id"]: r for r in silicon.load_rows()}
    agg = [r for r in recs if r["metric"] == "tpot" and r["mode"] == "agg"]
    by_engine = collections.defaultdict(list)
    for r in agg:
        by_engine[r["engine"]].append(r)
    rng = np.random.default_rng(seed)
    out = []
    for name in sorted(by_engine):
        pool = by_engine[name]
        for i in rng.choice(len(pool), min(n // len(by_engine), len(pool)), replace=False):
            r = pool[int(i)]
            row = rows[r["id"][len("silicon-") : -len("-tpot")]]
            out.append((r, float(row["silicon_ttft_ms"]) * 1e-3))
    return out


def compute(n: int = 90, log=print) -> dict:
    from dcost.planning.server import Load, Server, simulate_server
    from dcost.validation.cases import record_engine

    results = []
    t0 = time.perf_counter()
    for i, (r, ttft) in enumerate(sample(n)):
        eng = record_engine(r)[0]
        srv = Server(
            r["hardware"],
            r["model"],
            engine=eng,
            tensor_parallel=r["tensor_parallel"],
            expert_parallel=r["expert_parallel"],
            attention_data_parallel=r["attention_data_parallel"],
            pipeline_parallel=r["pipeline_parallel"],
            weights=r["weights"],
            kv_cache=r["kv_cache"],
        )
        c = int(r["concurrency"])
        row = {
            "id": r["id"],
            "engine": r["engine"],
            "concurrency": c,
            "ttft": ttft,
            "tpot": r["value"],
        }
        for stagger in (True, False):
            load = Load(
                prompt=r["prompt_tokens"],
                output=r["output_tokens"],
                clients=c,
                requests=max(3 * c, 60),
                stagger=stagger,
            )
            try:
                s = simulate_server(srv, load).summary()
            except Exception as err:  # noqa: BLE001 - a run the simulation refuses is counted
                row["error"] = str(err)
                break
            key = "staggered" if stagger else "lockstep"
            row[key] = {"ttft": s["ttft"]["mean"], "tpot": s["tpot"]["mean"]}
        results.append(row)
        if i % 20 == 0:
            log(f"{i + 1} runs, {time.perf_counter() - t0:.0f} s")
    table: dict = {"runs": len(results), "seconds": time.perf_counter() - t0}
    ok = [x for x in results if "error" not in x]
    table["refused"] = len(results) - len(ok)
    for key in ("staggered", "lockstep"):
        for metric in ("ttft", "tpot"):
            ratio = np.array([x[key][metric] / x[metric] for x in ok])
            err = np.abs(ratio - 1.0)
            table[f"{key}_{metric}"] = {
                "median": float(np.median(err)),
                "p90": float(np.quantile(err, 0.9)),
                "bias": float(np.median(ratio)),
            }
    table["results"] = results
    return table


def plot(table: dict):
    """Simulated over measured TTFT and TPOT per run, both ends of client synchrony."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ok = [x for x in table["results"] if "error" not in x]
    fig, axes = plt.subplots(1, 2, figsize=(8.0, 3.4))
    for ax, metric in zip(axes, ("ttft", "tpot"), strict=True):
        for key, marker in (("staggered", "o"), ("lockstep", "s")):
            c = [x["concurrency"] for x in ok]
            ratio = [x[key][metric] / x[metric] for x in ok]
            ax.scatter(c, ratio, s=10, marker=marker, label=f"clients {key}", alpha=0.7)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("concurrency (clients)")
        ax.set_ylabel(f"simulated / measured {metric.upper()}")
        ax.legend(fontsize=7)
    fig.suptitle(f"{len(ok)} silicon-sample runs under load")
    fig.tight_layout()
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--runs", type=int, default=90)
    args = p.parse_args()
    table = compute(args.runs)
    out = ROOT / "experiments" / "results" / "serving_under_load.json"
    out.write_text(json.dumps(table, indent=1))
    plot(table).savefig(ROOT / "experiments" / "results" / "serving_under_load.png", dpi=110)
    for key in ("staggered", "lockstep"):
        for metric in ("ttft", "tpot"):
            s = table[f"{key}_{metric}"]
            print(
                f"{key:9s} {metric}: median {100 * s['median']:.0f} %, p90 {100 * s['p90']:.0f} %,"
                f" predicted/measured {s['bias']:.2f}"
            )
    print(f"{table['runs']} runs ({table['refused']} refused) in {table['seconds']:.0f} s")


if __name__ == "__main__":
    main()
