"""``make demo``: the main job on the default scenario.

deepseek-v3 (fp8) on gb200-nvl72, mean context 8192 tokens, time per output token <= 50 ms:

1. ``dcost optimize``: the cheapest design (batch, chips per stage, stages), its binding constraint
   and the sensitivities of its cost;
2. the cost-latency frontier (``dcost.pareto``), saved as ``docs/figures/demo_pareto.png``;
3. the exact model over batch 1..16384 at 72 chips (one vmapped call): a table of the terms and
   ``docs/figures/demo_batch_curve.png``.
"""

from __future__ import annotations

import pathlib
from typing import TypedDict

import jax
import jax.numpy as jnp
import numpy as np

import dcost
from dcost.cli.common import format_table


class Scenario(TypedDict):
    hardware: str
    model: str
    chips: int
    context: int
    tpot_slo: float


SCENARIO: Scenario = {
    "hardware": "gb200-nvl72",
    "model": "deepseek-v3",
    "chips": 72,
    "context": 8192,
    "tpot_slo": 0.05,
}
FIGURE = pathlib.Path("docs/figures/demo_batch_curve.png")
PARETO = pathlib.Path("docs/figures/demo_pareto.png")
PARETO_SLOS = (0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1)


def batch_sweep(hardware, model, workload, chips, batches):
    """Exact decode reports for every batch in ``batches`` (one jitted, vmapped call)."""
    f = jax.jit(
        jax.vmap(
            lambda b: dcost.decode(dcost.Design(batch=b, chips=chips), hardware, model, workload)
        )
    )
    return f(batches)


def knee(batches, report):
    """Smallest batch whose exact step is compute bound (None when none is)."""
    bound = np.asarray(report.t_compute) >= np.asarray(report.t_weights + report.t_kv)
    return float(np.asarray(batches)[np.argmax(bound)]) if bound.any() else None


def optimize_default() -> int:
    """``dcost optimize`` on the default scenario (prints the design and its sensitivities)."""
    from dcost.cli.app import main as cli

    return cli(
        [
            "optimize",
            "--hardware",
            SCENARIO["hardware"],
            "--model",
            SCENARIO["model"],
            "--context",
            str(SCENARIO["context"]),
            "--tpot-slo",
            f"{SCENARIO['tpot_slo']}s",
        ]
    )


def pareto_figure(path=PARETO):
    """The cost-latency frontier of the default scenario (chips 1..72, stages 1..8)."""
    from dcost.plots import plot_pareto

    h, m = dcost.presets.pair(SCENARIO["hardware"], SCENARIO["model"])
    problem = dcost.Problem(
        h,
        m,
        dcost.Workload(SCENARIO["context"]),
        free={"batch": (1, 65536), "chips": (1, 72), "stages": (1, 8)},
        tpot_slo=SCENARIO["tpot_slo"],
        memory_reserve=0.1,
    )
    frontier = dcost.pareto(problem, PARETO_SLOS)
    import matplotlib.figure

    fig = matplotlib.figure.Figure(figsize=(9, 5.5))
    ax = plot_pareto(frontier, ax=fig.add_subplot(), label="cheapest design meeting the target")
    sol = frontier.solution
    for i in range(frontier.tpot_slo.size):
        if bool(frontier.feasible[i]):
            d = (
                f"B={float(sol.design.batch[i]):,.0f} G={float(sol.design.chips[i]):.0f} "
                f"P={float(sol.design.stages[i]):.0f}"
            )
            ax.annotate(
                d,
                (float(frontier.tpot_slo[i]) * 1e3, float(frontier.cost[i]) * 1e6),
                fontsize=6,
                rotation=30,
                xytext=(2, 4),
                textcoords="offset points",
            )
    i = frontier.optimum
    if i >= 0 and bool(frontier.feasible[i]):
        binding = ", ".join(sol.binding[i]) if hasattr(sol.binding, "__getitem__") else ""
        ax.annotate(
            f"binding at the optimum: {binding or 'none'}",
            (float(frontier.tpot_slo[i]) * 1e3, float(frontier.cost[i]) * 1e6),
            xytext=(-40, 110),
            textcoords="offset points",
            ha="right",
            fontsize=9,
            arrowprops={"arrowstyle": "->", "color": "gray"},
        )
    ax.set_title(
        f"{SCENARIO['model']} on {SCENARIO['hardware']} (chips 1..72, stages 1..8), "
        f"context {SCENARIO['context']:,} tokens\ncheapest token against the time per "
        "output token target",
        fontsize=10,
    )
    fig.tight_layout()
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=130)
    print(f"figure: {path}")
    rows = [
        [
            f"{float(s_) * 1e3:g}",
            f"{float(c) * 1e6:.4g}" if ok else "infeasible",
            f"{float(t) * 1e3:.3g}" if ok else "-",
        ]
        for s_, c, t, ok in zip(
            frontier.tpot_slo, frontier.cost, frontier.tpot, frontier.feasible, strict=True
        )
    ]
    print(format_table(rows, ["tpot target ms", "$/M tokens", "tpot ms"]))


def main(path=FIGURE):
    print("== dcost optimize (the default scenario)")
    optimize_default()
    print("\n== cost-latency frontier")
    pareto_figure()
    print("\n== the exact model over batch, 72 chips")
    h, m = dcost.presets.pair(SCENARIO["hardware"], SCENARIO["model"])
    w = dcost.Workload(SCENARIO["context"])
    batches = jnp.unique(jnp.round(jnp.logspace(0, np.log10(16384), 200)))
    r = batch_sweep(h, m, w, float(SCENARIO["chips"]), batches)
    bstar = float(dcost.balance_batch(h, m, w.context))
    k = knee(batches, r)
    print(
        f"{SCENARIO['model']} on {SCENARIO['hardware']}, {SCENARIO['chips']} chips, "
        f"context {SCENARIO['context']} tokens (exact model)"
    )
    rows = []
    for b in (1, 16, 64, 256, 1024, 4096, 16384):
        i = int(np.argmin(np.abs(np.asarray(batches) - b)))
        rows.append(
            [
                f"{b}",
                f"{float(r.t_compute[i]) * 1e3:.3f}",
                f"{float(r.t_weights[i]) * 1e3:.3f}",
                f"{float(r.t_kv[i]) * 1e3:.3f}",
                f"{float(r.t_comm[i]) * 1e3:.3f}",
                f"{float(r.tpot[i]) * 1e3:.3f}",
                f"{float(r.cost_per_token[i]) * 1e6:.4g}",
                f"{float(r.memory_per_chip[i]) / 1e9:.1f}",
            ]
        )
    print(
        format_table(
            rows,
            [
                "batch",
                "compute ms",
                "weights ms",
                "KV ms",
                "comm ms",
                "tpot ms",
                "$/M tokens",
                "GB/chip",
            ],
        )
    )
    print(f"balance batch (closed form, all experts touched): {bstar:,.0f}")
    print(
        f"knee of the exact model: {k:,.0f}" if k else "the exact model never turns compute bound"
    )
    from dcost.plots import batch_curve

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    batch_curve(
        np.asarray(batches),
        r,
        balance=bstar,
        knee=k,
        path=path,
        capacity=float(h.hbm_capacity),
        title=f"{SCENARIO['model']} on {SCENARIO['chips']} x {SCENARIO['hardware']}, "
        f"context {SCENARIO['context']:,} tokens",
    )
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
