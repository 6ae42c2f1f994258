"""A sparse-attention indexer's time that grows with the context, and what it would give GLM-5.

Claim examined: GLM-5's decode is predicted 0.77x the measured (22.6 % off, held out), most at few
clients and long prompts (``docs/engines.md``). Its indexer scores every earlier token, and the
model charges that as a fixed cost a layer (``index_layer_overhead``, fitted on the kernel
table's small rows) plus the scoring's FLOPs and key reads at the chip's rates. The table says
more: the module with its indexer less the module without it grows with the context far past
what those reads cost. If that growth is a cost a layer proportional to the context ``T`` (a
scan latency-bound at small batch: each sequence's scores and top-k selected by its own thread
blocks), ``alpha T`` a layer, fitted on the table, should close part of GLM-5's gap.

Method: (1) per GPU, AIConfigurator's SGLang 0.5.14 DSA generation-module table
(``dsa_generation_module_perf.parquet``; the rows with and without the indexer alike but for it,
at 16 sequences or fewer), ``t_ix - t_skip = c + alpha T`` by least squares in the context ``T``
(to 16,384 tokens, past the sample's longest mean decode context, about 9,000: the growth
slows past it, 0.5 ns a token fitted to 131,072), its residual; (2) the silicon sample's GLM-5
rows as ``dcost calibrate`` predicts them, each with SGLang's fixed costs fitted without GLM-5
(``heldout.toml``'s ``fixed_costs_held_out``), and with ``alpha T`` added to each layer of each
step (``Predictions.per_layer``: seconds the metric gains per second of a layer's cost), ``T``
the row's mean decode context ``prompt + output/2``, ``alpha`` its chip's (B200's for a chip
without a table). Nothing is fitted to the runs. An additive estimate: not in the model.
Writes ``results/index_context.json``.

    python experiments/index_context.py
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
from _common import ratio_stats

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "index_context.json"
SMALL_BATCH = 16
MAX_CONTEXT = 16384
GPUS = {"b200": "b200_sxm", "b300": "b300_sxm", "h200": "h200_sxm"}
"""The silicon sample's GLM-5 chips, and the AIConfigurator data folder of each."""


def pairs(table) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(batch, context, t_ix - t_skip)`` (s) of a DSA generation-module table: each row timed
    with its indexer against the fastest row without it, alike in heads, batch, context, KV and
    GEMM formats and tensor parallelism."""
    source = np.asarray(table["kernel_source"]).astype(str)
    skip = np.char.find(source, "skip") >= 0
    keys = ("num_heads", "batch_size", "step", "kv_cache_dtype", "gemm_type", "tp_size")
    latency = np.asarray(table["latency"], float) * 1e-3
    base: dict[tuple, float] = {}
    for i in np.flatnonzero(skip):
        key = tuple(str(table[k][i]) for k in keys)
        base[key] = min(base.get(key, np.inf), latency[i])
    rows = [
        (float(table["batch_size"][i]), float(table["step"][i]), latency[i] - base[key])
        for i in np.flatnonzero(~skip)
        if (key := tuple(str(table[k][i]) for k in keys)) in base
    ]
    b, t, d = (np.asarray(x) for x in zip(*rows, strict=True))
    return b, t, d


def fit_growth(batch, context, gap) -> dict:
    """``gap = c + alpha T`` by least squares over the rows of ``SMALL_BATCH`` sequences or fewer
    and ``MAX_CONTEXT`` tokens or fewer: ``{"c", "alpha", "rows", "median_residual"}`` (s,
    s a token; the residual ``|fit/gap - 1|`` at the median).

    >>> t = np.array([1.0, 1024.0, 8192.0, 65536.0])
    >>> f = fit_growth(np.ones(4), t, 3e-5 + 1e-9 * t)
    >>> round(f["alpha"] * 1e9, 6), round(f["c"] * 1e6, 6)
    (1.0, 30.0)
    """
    use = (batch <= SMALL_BATCH) & (context <= MAX_CONTEXT)
    a = np.stack([np.ones(use.sum()), context[use]], axis=1)
    (c, alpha), *_ = np.linalg.lstsq(a, gap[use], rcond=None)
    fit = c + alpha * context[use]
    return {
        "c": float(c),
        "alpha": float(alpha),
        "rows": int(use.sum()),
        "median_residual": float(np.median(np.abs(fit / gap[use] - 1.0))),
    }


def glm5(alpha_by_chip: dict) -> dict:
    """GLM-5's silicon TPOT rows, held out as shipped and with ``alpha T`` a layer."""
    from dcost import engines
    from dcost.validation import silicon

    recs, _ = silicon.records()
    rows = [r for r in recs if r["model"] == "glm-5" and r["metric"] == "tpot"]
    shipped = {}
    for path in sorted((pathlib.Path(engines.__file__).parent / "profiles").glob("*.toml")):
        e = engines.from_file(path)
        shipped[(e.name, e.hardware_name)] = e
    pred = silicon.predict_all(
        rows, engine_for=lambda r: shipped.get((r["engine"], r["hardware"])), family=False
    )
    costs = engines.heldout()["fixed_costs_held_out"]["sglang"]["glm-5"]
    held = pred.engine(
        costs["step_overhead"],
        costs["layer_overhead"],
        costs["sequence_overhead"],
        costs["prefill_step_overhead"],
        costs.get("gemm_intercept_share", 0.0),
    )
    context = np.array([r["prompt_tokens"] + r["output_tokens"] / 2.0 for r in rows])
    alpha = np.array([alpha_by_chip.get(r["hardware"], alpha_by_chip["b200"]) for r in rows])
    grown = held + alpha * context * pred.per_layer
    out = {
        "rows": len(rows),
        "shipped": ratio_stats(held / pred.measured),
        "with_growth": ratio_stats(grown / pred.measured),
    }
    for name, mask in (
        ("prompts_8k", np.array([r["prompt_tokens"] >= 4000 for r in rows])),  # 8,192 nominal
        ("prompts_1k", np.array([r["prompt_tokens"] < 2000 for r in rows])),
    ):
        if mask.any():
            out[name] = {
                "shipped": ratio_stats(held[mask] / pred.measured[mask]),
                "with_growth": ratio_stats(grown[mask] / pred.measured[mask]),
            }
    return out


def compute() -> dict:
    """The fits and GLM-5's figures; ``{}`` without AIConfigurator's tables in this
    environment."""
    from dcost.calibrate import kernels
    from dcost.cli.calibrate import aiconfigurator_data

    try:
        root = aiconfigurator_data(None)  # the installed aiconfigurator extra's tables
    except ValueError:
        return {}
    found = {}
    for chip, folder in GPUS.items():
        path = root / folder / "sparse_attention/sglang/0.5.14/dsa_generation_module_perf.parquet"
        if path.is_file():
            found[chip] = fit_growth(*pairs(kernels.read_table(path)))
    if "b200" not in found:
        return {}
    return {
        "source": "aiconfigurator-core 0.12.0, sparse_attention/sglang/0.5.14",
        "fits": found,
        "glm5": glm5({k: v["alpha"] for k, v in found.items()}),
    }


def main() -> None:
    table = compute()
    if not table:  # the committed results stand
        print("index_context: skipped, it reads aiconfigurator-core 0.12.0's tables (pip install")
        print("  -e '.[aiconfigurator]'); results/index_context.json left as it is")
        return
    OUT.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    for chip, f in table["fits"].items():
        print(
            f"{chip}: c {f['c'] * 1e6:.1f} us, alpha {f['alpha'] * 1e9:.3f} ns a token "
            f"({f['rows']} rows, residual {100 * f['median_residual']:.1f} %)"
        )
    g = table["glm5"]
    for label in ("shipped", "with_growth"):
        s = g[label]
        print(
            f"GLM-5 {label}: {100 * s['median']:.1f} % ({100 * s['p90']:.1f} %), {s['bias']:.2f}x"
        )
    for part in ("prompts_1k", "prompts_8k"):
        if part in g:
            a, b = g[part]["shipped"], g[part]["with_growth"]
            print(
                f"  {part}: {100 * a['median']:.1f} % ({a['bias']:.2f}x) -> "
                f"{100 * b['median']:.1f} % ({b['bias']:.2f}x), {a['runs']} runs"
            )


if __name__ == "__main__":
    main()
