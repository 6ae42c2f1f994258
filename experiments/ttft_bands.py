"""How far a simulated TTFT under load is from a measured one: bands by engine, model and load.

The simulation's mean TTFT at a benchmark's concurrency is a median 38 % off the measured
(``experiments/serving_under_load.py``), too fast, and by how much depends on the engine, on
whether the model is a mixture of experts and on the load (``experiments/ttft_shortfall.py``:
at 16 clients or fewer vLLM's dense runs lack 5 ms, its MoE runs 46 ms). ``dcost simulate``
says so beside its answer: the ratio ``measured / simulated`` of the runs of the same engine,
kind of model and load, as a band that should hold 80 % of runs and a median.

Method: the bands are the quantiles of that ratio over seeds 0 and 1's runs (the seen and the
held-out sample of ``serving_under_load.py``), by engine, kind (``dense``, ``moe``) and load
(``light``: 16 clients or fewer; ``heavy``: more); a group of fewer than ``MIN_RUNS`` runs takes
every engine's runs of that kind and load. Seed 2 (never seen) checks them: the share of its
runs whose ratio falls in its group's band (80 % is what the band claims). Writes
``dcost/engines/ttft_bands.toml`` (what ``dcost.engines.ttft_band`` reads) and
``results/ttft_bands.json`` (the coverage).

    python experiments/ttft_bands.py
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = ROOT / "experiments" / "results" / "serving_under_load.json"
OUT = ROOT / "experiments" / "results" / "ttft_bands.json"
TABLE = ROOT / "dcost" / "engines" / "ttft_bands.toml"
LIGHT = 16
MIN_RUNS = 8
COVER = 0.8
TRAIN = ("seen", "held_out")


def load_of(clients: float) -> str:
    """``"light"`` at ``LIGHT`` clients or fewer, else ``"heavy"``."""
    return "light" if clients <= LIGHT else "heavy"


def prediction_band(values) -> tuple[float, float]:
    """The ``k``-th smallest and ``k``-th largest of ``n`` values, ``k = max(1, floor((1 -
    COVER)/2 (n + 1)))``: a new value exchangeable with them falls between with probability
    ``(n + 1 - 2k)/(n + 1)``, at least ``COVER`` (the distribution-free prediction interval;
    plain 10th and 90th percentiles of a few runs cover less, 70 % of the never-seen runs here).

    >>> prediction_band(range(1, 10))  # n = 9: k = 1, 8 of 10 new values fall in
    (1.0, 9.0)
    >>> prediction_band(range(1, 40))  # n = 39: k = 4, 32 of 40
    (4.0, 36.0)
    """
    x = np.sort(np.asarray(list(values), float))
    n = x.size
    k = max(1, int(np.floor((1.0 - COVER) / 2.0 * (n + 1) + 1e-9)))
    return float(x[k - 1]), float(x[n - k])


def bands(rows: list[dict]) -> dict:
    """``{engine: {kind: {load: {"q10", "q50", "q90", "runs", "pooled"}}}}`` over ``rows``
    (each with ``engine``, ``moe``, ``concurrency`` and ``ratio``: measured over simulated); a
    group with fewer than ``MIN_RUNS`` runs takes every engine's runs of that kind and load
    (``pooled``: true; the light-load shortfall follows the kind of model more than the engine,
    ``experiments/ttft_shortfall.py``); none where those are fewer too."""
    out: dict = {}
    for eng in sorted({r["engine"] for r in rows}):
        for kind in ("dense", "moe"):
            for load in ("light", "heavy"):
                alike = [
                    r
                    for r in rows
                    if load_of(r["concurrency"]) == load and r["moe"] == (kind == "moe")
                ]
                mine = [r for r in alike if r["engine"] == eng]
                pooled = len(mine) < MIN_RUNS
                use = alike if pooled else mine
                if len(use) < MIN_RUNS:
                    continue
                low, high = prediction_band([r["ratio"] for r in use])
                out.setdefault(eng, {}).setdefault(kind, {})[load] = {
                    "q10": low,
                    "q50": float(np.median([r["ratio"] for r in use])),
                    "q90": high,
                    "runs": len(use),
                    "pooled": pooled,
                }
    return out


def coverage(table: dict, rows: list[dict]) -> dict:
    """The share of ``rows`` whose ratio lies in its group's band of ``table``, overall and by
    engine (runs without a band left out, counted as ``no_band``)."""
    hit: dict = {}
    missing = 0
    for r in rows:
        kind = "moe" if r["moe"] else "dense"
        band = table.get(r["engine"], {}).get(kind, {}).get(load_of(r["concurrency"]))
        if band is None:
            missing += 1
            continue
        inside = band["q10"] <= r["ratio"] <= band["q90"]
        for key in ("all", r["engine"]):
            hit.setdefault(key, []).append(inside)
    out = {k: {"runs": len(v), "share": float(np.mean(v))} for k, v in hit.items()}
    out["no_band"] = missing
    return out


def runs(results: dict, moe_of: dict) -> list[dict]:
    """One row per simulated run of every split: engine, whether its model is a mixture of
    experts, concurrency, measured over simulated mean TTFT, split. ``moe_of``: run id ->
    bool."""
    out = []
    for split, block in results["splits"].items():
        for r in block["results"]:
            sim = r.get("simulated")
            if not isinstance(sim, dict) or "ttft" not in sim:
                continue
            out.append(
                {
                    "engine": r["engine"],
                    "moe": moe_of[r["id"]],
                    "concurrency": float(r["concurrency"]),
                    "ratio": float(r["ttft"]) / float(sim["ttft"]),
                    "split": split,
                }
            )
    return out


def compute(source: pathlib.Path = SOURCE) -> dict:
    import dcost
    from dcost.validation import silicon

    results = json.loads(source.read_text())
    recs, _ = silicon.records(count_out=False)
    model_of = {r["id"]: r["model"] for r in recs}
    ids = {r["id"] for b in results["splits"].values() for r in b["results"]}
    kinds = {n: float(dcost.model(n).moe_layers) > 0 for n in {model_of[i] for i in ids}}
    rows = runs(results, {i: kinds[model_of[i]] for i in ids})
    table = bands([r for r in rows if r["split"] in TRAIN])
    return {
        "source": str(source.relative_to(ROOT)),
        "split": "bands from seeds 0 and 1; coverage on seed 2 (never seen)",
        "bands": table,
        "coverage": coverage(table, [r for r in rows if r["split"] == "fresh"]),
        "runs": rows,
    }


def write_table(table: dict, path: pathlib.Path = TABLE) -> pathlib.Path:
    from dcost._toml import toml_table

    lines = [
        "# Measured over simulated mean TTFT of benchmark runs under load, by engine, kind of",
        "# model (dense, moe) and load (light: <= 16 clients; heavy: more): q10 and q90 the 80 %",
        "# prediction band of the ratio (order statistics), q50 its median, and the runs.",
        "# Written by experiments/ttft_bands.py from experiments/results/serving_under_load.json",
        "# (seeds 0 and 1; AIConfigurator's silicon sample, aiconfigurator-core 0.12.0); do not",
        "# edit by hand. pooled: too few runs of the engine, every engine's runs of that kind and",
        "# load.",
        "",
    ]
    toml_table("ttft", {"source": table["source"], "bands": table["bands"]}, lines)
    path.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    return path


NAMES = {"vllm": "vLLM", "sglang": "SGLang", "trtllm": "TensorRT-LLM"}
GROUPS = (("dense", "light"), ("dense", "heavy"), ("moe", "light"), ("moe", "heavy"))


def plot(table: dict, path: pathlib.Path = ROOT / "docs" / "figures" / "ttft_bands.png"):
    """Each engine's runs, measured over simulated TTFT by kind and load: seeds 0 and 1 (grey),
    the bands they give (bars, the median a tick) and seed 2 (in its band: dots; out: crosses)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rng = np.random.default_rng(0)
    engines = [e for e in NAMES if e in table["bands"]]
    fig, axes = plt.subplots(1, len(engines), figsize=(4.6 * len(engines), 4.4), sharey=True)
    for ax, eng in zip(np.atleast_1d(axes), engines, strict=True):
        for x, (kind, load) in enumerate(GROUPS):
            mine = [
                r
                for r in table["runs"]
                if r["engine"] == eng
                and (r["moe"] == (kind == "moe"))
                and load_of(r["concurrency"]) == load
            ]
            seen = [r["ratio"] for r in mine if r["split"] in TRAIN]
            ax.scatter(
                x - 0.18 + 0.12 * rng.uniform(-1, 1, len(seen)),
                seen,
                s=9,
                color="0.6",
                label="seeds 0-1 (the bands' runs)" if x == 0 else None,
            )
            band = table["bands"].get(eng, {}).get(kind, {}).get(load)
            if band is None:
                continue
            ax.plot(
                [x, x],
                [band["q10"], band["q90"]],
                color="tab:blue",
                lw=7,
                alpha=0.3,
                solid_capstyle="butt",
                label="80 % band" if x == 0 else None,
            )
            ax.plot([x - 0.1, x + 0.1], [band["q50"]] * 2, color="tab:blue", lw=2)
            fresh = [r["ratio"] for r in mine if r["split"] == "fresh"]
            inside = [v for v in fresh if band["q10"] <= v <= band["q90"]]
            out = [v for v in fresh if not band["q10"] <= v <= band["q90"]]
            jit = 0.12 * rng.uniform(-1, 1, len(fresh))
            ax.scatter(
                x + 0.22 + jit[: len(inside)],
                inside,
                s=16,
                color="tab:blue",
                label="seed 2, in its band" if x == 0 else None,
            )
            ax.scatter(
                x + 0.22 + jit[len(inside) :],
                out,
                s=22,
                marker="x",
                color="tab:red",
                label="seed 2, outside" if x == 0 else None,
            )
        ax.axhline(1.0, color="k", lw=0.8, ls="--")
        ax.set_yscale("log")
        ax.set_xticks(range(len(GROUPS)))
        ax.set_xticklabels(["dense\n<= 16", "dense\n> 16", "MoE\n<= 16", "MoE\n> 16"])
        cov = table["coverage"].get(eng, {})
        ax.set_title(f"{NAMES[eng]}: seed 2 in band {100 * cov.get('share', 0):.0f} %")
        ax.set_xlabel("model, clients")
    first = np.atleast_1d(axes)[0]
    first.set_ylabel("measured / simulated mean TTFT")
    first.legend(fontsize=8, loc="upper left")
    fig.suptitle("How far the simulated TTFT under load is from the measured (silicon sample)")
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def main() -> None:
    table = compute()
    write_table(table)
    plot(table)
    OUT.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    for eng, kinds in table["bands"].items():
        for kind, loads in kinds.items():
            for load, b in loads.items():
                pooled = " (pooled)" if b["pooled"] else ""
                print(
                    f"{eng:7s} {kind:6s} {load:6s} {b['q10']:.2f}-{b['q90']:.2f}x, median "
                    f"{b['q50']:.2f}x, {b['runs']} runs{pooled}"
                )
    cov = table["coverage"]
    print(
        "seed 2 inside its 80 % band: "
        + "; ".join(
            f"{k} {100 * v['share']:.0f} % of {v['runs']}" for k, v in cov.items() if k != "no_band"
        )
        + f"; no band {cov['no_band']}"
    )


if __name__ == "__main__":
    main()
