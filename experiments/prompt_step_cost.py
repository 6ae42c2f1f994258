"""Does the TTFT's missing time hold the GPU? The silicon TPOT with it charged to prompt steps.

Claim examined: the time the simulated TTFT lacks at light load
(``experiments/ttft_shortfall.py``: a cost a layer or a MoE layer, fitted per engine) is spent
in the step that carries the prompt (a step run layer by layer from the host). If so, every
sequence decoding beside that step waits for it, and the decodes' TPOT of the same runs should
want it too: charged to each step with prompt tokens, the held-out TPOT should come no further
from the measured ones.

Method: AIConfigurator's silicon sample as ``dcost calibrate`` predicts it
(``dcost.validation.silicon.predict_all``, each row with the shipped profile of its engine
and chip, as ``dcost.calibrate.engines.fixed_costs`` fits them; 3,096 rows, about 95 s on 2
cores). An aggregated row's prediction gains ``v u / P`` times its steps with prompt tokens
(``Predictions.per_prefill_step``: seconds it gains per second of a prompt step's cost), ``u``
its model's layers or MoE layers, ``P`` its pipeline stages, ``v`` the engine's value from
``ttft_shortfall.compute()`` (what ``results/ttft_shortfall.json`` holds, computed here so that
the order the experiments run in does not matter); the fixed costs are then fitted again as
shipped (each row with its model left out, ``dcost.calibrate.host.held_out_host``), so that a
step's or a layer's cost may give back what the new term takes. Disaggregated decode rows are
left as they are (their prompt steps admit prefilled sequences, a few tokens each). Writes
``results/prompt_step_cost.json``.

    python experiments/prompt_step_cost.py
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "prompt_step_cost.json"
FORMS = {"per_layer": "n_layers", "per_moe_layer": "moe_layers"}
"""The shortfall's forms tried, and the ``dcost.Model`` field that counts its units."""


def charged(pred, units: np.ndarray, value: np.ndarray, aggregated: np.ndarray):
    """``pred`` (``silicon.Predictions``) with ``value * units`` (s) charged to each step with
    prompt tokens of the ``aggregated`` rows: their fixed-cost-free prediction gains
    ``per_prefill_step * value * units``."""
    extra = np.where(aggregated, pred.per_prefill_step * value * units, 0.0)
    return dataclasses.replace(pred, engine_base=pred.engine_base + extra)


def held_out_tpot(pred, skipped=()) -> dict:
    """The TPOT and lone-prefill TTFT errors of ``pred`` with its fixed costs fitted as
    ``dcost.calibrate.engines.fixed_costs`` fits them (each engine's TPOT rows that pure physics
    bounds, the row's model left out, each model weighing one): overall and by engine, and the
    median fitted cost of a step with prompt tokens (s) by engine."""
    from dcost.calibrate import engines as calib
    from dcost.calibrate import host

    recs = pred.records
    engine = np.array([r["engine"] for r in recs])
    model = np.array([r["model"] for r in recs])
    is_tpot = np.array([r["metric"] == "tpot" for r in recs])
    bounded = pred.pure <= pred.measured * (1.0 + 1e-6)
    slopes = pred.slopes
    costs = host.held_out_host(
        pred.engine_base,
        slopes,
        pred.measured,
        engine,
        model,
        mask=is_tpot & bounded,
        balance=model,
    )
    table = calib.summary(pred, costs, list(skipped))
    out: dict = {"tpot": {"all": table["tpot"]["overall"], **table["tpot"]["by_engine"]}}
    if "ttft" in table:
        out["ttft"] = {"all": table["ttft"]["overall"]}
    out["prefill_step_overhead"] = {
        e: float(np.median(costs[engine == e, 3])) for e in sorted(set(engine.tolist()))
    }
    return out


def compute() -> dict:
    """The held-out silicon TPOT as shipped and with each form's per-engine values charged."""
    import dcost
    from dcost import engines
    from dcost.validation import silicon

    t0 = time.perf_counter()
    shipped = {}
    for path in sorted((pathlib.Path(engines.__file__).parent / "profiles").glob("*.toml")):
        e = engines.from_file(path)
        shipped[(e.name, e.hardware_name)] = e
    import ttft_shortfall

    fitted = ttft_shortfall.compute()["results"]
    recs, skipped = silicon.records()
    rows = [r for r in recs if r["metric"] in ("tpot", "ttft")]
    pred = silicon.predict_all(
        rows, engine_for=lambda r: shipped.get((r["engine"], r["hardware"])), family=False
    )
    names = {r["model"] for r in rows}
    per_model = {n: dcost.model(n) for n in names}
    stages = np.array([float(r.get("pipeline_parallel") or 1) for r in rows])
    aggregated = np.array([r["mode"] == "agg" for r in rows])
    engine = [r["engine"] for r in rows]
    out: dict = {"rows": len(rows), "shipped": held_out_tpot(pred, skipped)}
    for form, key in FORMS.items():
        units = np.array([float(getattr(per_model[r["model"]], key)) for r in rows]) / stages
        values = {e: fitted[form][e]["value"] for e in ("vllm", "sglang", "trtllm")}
        value = np.array([values.get(e, 0.0) for e in engine])
        block = held_out_tpot(charged(pred, units, value, aggregated), skipped)
        block["values"] = values
        out[form] = block
    out["seconds"] = time.perf_counter() - t0
    return out


def main() -> None:
    table = compute()
    OUT.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")

    def line(block):
        return "; ".join(
            f"{k} {100 * s['median']:.1f} % ({100 * s['p90']:.1f} %)"
            for k, s in block["tpot"].items()
        )

    print(f"{table['rows']} rows, {table['seconds']:.0f} s")
    for label in ("shipped", *FORMS):
        block = table[label]
        ttft = block.get("ttft", {}).get("all")
        extra = f"; lone-prefill TTFT {100 * ttft['median']:.1f} %" if ttft else ""
        print(f"{label:14s} TPOT {line(block)}{extra}")


if __name__ == "__main__":
    main()
