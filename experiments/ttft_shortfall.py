"""What the simulation's TTFT lacks at light load, per engine: a cost a layer, a cost a MoE layer
or a cost a request.

Claim examined: the simulated mean TTFT of the silicon sample's runs under load
(``experiments/serving_under_load.py``) is short at low concurrency on every engine because a
step that carries a prompt pays host time that the decode-fitted fixed costs do not hold. If
that time is a cost a layer (a step run outside CUDA graphs, dispatched layer by layer; what
AIConfigurator 0.12 adds to a vLLM prefill, 0.8 ms a layer), a per-engine value fitted on some
runs should shorten the error of others in proportion to their layers; if it is a cost a
request (API server, tokenizer), a constant should; if it is what a mixture of experts' layer
adds (its routing, sorting and grouped kernels launched one by one), a cost a MoE layer should,
and a dense model's runs should lack nothing.

Method, held out twice: for each run of seed 2 (the never-seen sample), the engine's value is
the median shortfall ``(measured - simulated)/u`` over seeds 0 and 1's runs of the same engine
at concurrency <= 16 of *other* models (leave one model out), floored at 0, with ``u`` the
run's layers ``L``, its MoE layers ``L_moe`` (runs of dense models, ``L_moe = 0``, left out of
that median) or 1; the run's TTFT is then the simulated one plus ``u x e``. An additive
estimate, not a simulation: the longer steps' effect on the requests queued behind them is not
counted. Reads ``experiments/results/serving_under_load.json`` (its per-run ``ttft`` and
``simulated.ttft``) and the presets' layer counts; writes ``results/ttft_shortfall.json``.

    python experiments/ttft_shortfall.py
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
from _common import ratio_stats

ROOT = pathlib.Path(__file__).resolve().parents[1]
SOURCE = ROOT / "experiments" / "results" / "serving_under_load.json"
OUT = ROOT / "experiments" / "results" / "ttft_shortfall.json"
LIGHT = 16  # the fit's runs: concurrency up to this
TRAIN = ("seen", "held_out")  # seeds 0 and 1
TEST = "fresh"  # seed 2
ENGINES = ("vllm", "sglang", "trtllm")
UNITS = {"per_layer": "layers", "per_moe_layer": "moe_layers", "per_request": None}
"""Each form's unit of cost: a row's key (its layers, its MoE layers), or None: one a request."""


def runs(results: dict, model_of: dict, layers: dict, moe_layers: dict) -> list[dict]:
    """One row per simulated run of every split: engine, model, layers, MoE layers,
    concurrency, measured and simulated mean TTFT (s), split. ``model_of``: run id -> preset
    name; ``layers``, ``moe_layers``: preset name -> its layers, its MoE layers."""
    out = []
    for split, block in results["splits"].items():
        for r in block["results"]:
            sim = r.get("simulated")
            if not isinstance(sim, dict) or "ttft" not in sim:
                continue  # a run the simulation refused
            model = model_of[r["id"]]
            out.append(
                {
                    "engine": r["engine"],
                    "model": model,
                    "layers": float(layers[model]),
                    "moe_layers": float(moe_layers[model]),
                    "concurrency": float(r["concurrency"]),
                    "measured": float(r["ttft"]),
                    "simulated": float(sim["ttft"]),
                    "split": split,
                }
            )
    return out


def units(row: dict, form: str) -> float:
    """``row``'s units of ``form``'s cost (``UNITS``): its layers, its MoE layers, or 1."""
    key = UNITS[form]
    return 1.0 if key is None else float(row[key])


def value(rows: list[dict], row: dict, form: str) -> float:
    """The engine's shortfall for ``row`` in ``form`` (``UNITS``): the median over the training
    splits' light-load runs of the same engine and another model with units of that cost, of
    their shortfall per unit; 0 when there are none or the median is negative."""
    train = [
        x
        for x in rows
        if x["split"] in TRAIN
        and x["engine"] == row["engine"]
        and x["model"] != row["model"]
        and x["concurrency"] <= LIGHT
        and units(x, form) > 0
    ]
    if not train:
        return 0.0
    gaps = [(x["measured"] - x["simulated"]) / units(x, form) for x in train]
    return max(0.0, float(np.median(gaps)))


def evaluate(rows: list[dict]) -> dict:
    """Seed 2's errors as simulated and with each form's cost (``UNITS``); overall and by
    engine, with each engine's median fitted value (s a unit)."""
    test = [r for r in rows if r["split"] == TEST]
    out: dict = {}
    for label in ("simulated", *UNITS):

        def ratio(r, label=label):
            add = 0.0 if label == "simulated" else value(rows, r, label) * units(r, label)
            return (r["simulated"] + add) / r["measured"]

        block = {"all": ratio_stats([ratio(r) for r in test])}
        for eng in ENGINES:
            mine = [r for r in test if r["engine"] == eng]
            if not mine:
                continue
            block[eng] = ratio_stats([ratio(r) for r in mine])
            if label != "simulated":
                block[eng]["value"] = float(np.median([value(rows, r, label) for r in mine]))
        out[label] = block
    return out


def by_kind(rows: list[dict]) -> dict:
    """The light-load shortfall ``measured - simulated`` (s) of every split's runs, by engine,
    for dense models and mixtures of experts apart: its median, the median a layer, and runs."""
    out: dict = {}
    for eng in ENGINES:
        for kind, moe in (("dense", False), ("moe", True)):
            mine = [
                r
                for r in rows
                if r["engine"] == eng and r["concurrency"] <= LIGHT and (r["moe_layers"] > 0) == moe
            ]
            if mine:
                gap = np.asarray([r["measured"] - r["simulated"] for r in mine])
                per = gap / np.asarray([r["layers"] for r in mine])
                out.setdefault(eng, {})[kind] = {
                    "runs": len(mine),
                    "models": len({r["model"] for r in mine}),
                    "median": float(np.median(gap)),
                    "median_per_layer": float(np.median(per)),
                }
    return out


FEW = 8  # the per-model list: runs of this many clients or fewer


def by_model(rows: list[dict], arch: dict) -> dict:
    """The shortfall ``measured - simulated`` (s) of every split's runs of ``FEW`` clients or
    fewer, by engine and network (``arch``: preset name -> its network's first name, DeepSeek-V3
    and R1 one): ``{engine: {network: {"runs", "median"}}}``."""
    out: dict = {}
    for eng in ENGINES:
        groups: dict = {}
        for r in rows:
            if r["engine"] == eng and r["concurrency"] <= FEW:
                groups.setdefault(arch[r["model"]], []).append(r["measured"] - r["simulated"])
        for name, gap in sorted(groups.items()):
            out.setdefault(eng, {})[name] = {"runs": len(gap), "median": float(np.median(gap))}
    return out


def compute(source: pathlib.Path = SOURCE) -> dict:
    """The estimate on the committed results of ``serving_under_load.py``."""
    import dcost
    from dcost.calibrate.engines import architectures
    from dcost.validation import silicon

    results = json.loads(source.read_text())
    recs, _ = silicon.records(count_out=False)
    model_of = {r["id"]: r["model"] for r in recs}
    names = {model_of[r["id"]] for b in results["splits"].values() for r in b["results"]}
    layers = {n: float(dcost.model(n).n_layers) for n in names}
    moe_layers = {n: float(dcost.model(n).moe_layers) for n in names}
    rows = runs(results, model_of, layers, moe_layers)
    return {
        "source": str(source.relative_to(ROOT)),
        "split": (
            "fitted on seeds 0 and 1 (concurrency <= 16, the predicted run's model left out), "
            "evaluated on seed 2; additive, queueing behind longer steps not counted"
        ),
        "light_load": LIGHT,
        "results": evaluate(rows),
        "light_load_by_kind": by_kind(rows),
        "light_load_by_model": by_model(rows, architectures(sorted(names))),
    }


def main() -> None:
    table = compute()
    OUT.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    for eng, kinds in table["light_load_by_kind"].items():
        print(
            f"{eng:7s} light-load shortfall, all seeds: "
            + "; ".join(
                f"{k} {1e3 * v['median']:.0f} ms ({1e3 * v['median_per_layer']:.2f} ms a layer, "
                f"{v['runs']} runs of {v['models']} models)"
                for k, v in kinds.items()
            )
        )
    for label, block in table["results"].items():
        parts = []
        for k, s in block.items():
            extra = ""
            if "value" in s:
                extra = f", {s['value'] * 1e3:.2f} ms"
            parts.append(f"{k} {100 * s['median']:.1f} % ({100 * s['p90']:.1f} %){extra}")
        print(f"{label:12s} " + "; ".join(parts))


if __name__ == "__main__":
    main()
