"""``make demo``: the main job on the default scenario.

deepseek-v3 (fp8) on gb200-nvl72 with its family's calibrated profile (``--calibrated``), mean
context 8192 tokens, time per output token <= 50 ms:

1. ``dcost optimize``: the cheapest design (batch, chips per stage, stages), its binding constraint
   and the sensitivities of its cost;
2. the cost-latency frontier of the same problem (``dcost.pareto``) with the design at each target
   and what binds it, saved as ``docs/figures/demo_pareto.png``;
3. the exact model over the whole batch range of the problem at the optimum's chips and stages
   (one vmapped call of the problem's own objective and constraints): a table of the terms and
   ``docs/figures/demo_batch_curve.png``, where the optimum ``dcost optimize`` printed is the star
   and the memory and latency limits shade the batches they rule out.

Every number in the figures comes from the model: the problem is built from the same command-line
arguments as step 1, so the figures and the printed optimum cannot disagree.
"""

from __future__ import annotations

import pathlib
from typing import TypedDict

import jax
import jax.numpy as jnp
import numpy as np

import dcost
from dcost.cli.common import format_table
from dcost.search.problem import evaluate


class Scenario(TypedDict):
    hardware: str
    model: str
    context: int
    tpot_slo: float


SCENARIO: Scenario = {
    "hardware": "gb200-nvl72",
    "model": "deepseek-v3",
    "context": 8192,
    "tpot_slo": 0.05,
}
ARGS = (
    "--hardware",
    SCENARIO["hardware"],
    "--model",
    SCENARIO["model"],
    "--context",
    str(SCENARIO["context"]),
    "--tpot-slo",
    f"{SCENARIO['tpot_slo']}s",
    "--calibrated",
)
"""The arguments of ``dcost optimize`` on the default scenario; the figures solve the same
problem (``default_problem``)."""
FIGURE = pathlib.Path("docs/figures/demo_batch_curve.png")
PARETO = pathlib.Path("docs/figures/demo_pareto.png")
PARETO_SLOS = (0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1)
TABLE_BATCHES = (1, 16, 64, 256, 1024, 4096, 16384, 65536)
SWEEP_POINTS = 240


def default_problem() -> dcost.Problem:
    """The ``dcost.Problem`` that ``dcost optimize`` builds from ``ARGS`` (its bounds, limits and
    memory reserve)."""
    from dcost.cli.app import build_parser
    from dcost.cli.search import problem_from_args

    return problem_from_args(build_parser().parse_args(["optimize", *ARGS]))


def optimize_default() -> int:
    """``dcost optimize`` on the default scenario (prints the design and its sensitivities)."""
    from dcost.cli.app import main as cli

    return cli(["optimize", *ARGS])


def sweep_batches(problem: dcost.Problem, solution, points: int = SWEEP_POINTS) -> np.ndarray:
    """Batches from the problem's lower to its upper batch bound (log spaced, whole numbers), with
    the optimum's batch and those of the printed table among them."""
    (lo, hi) = next((lo, hi) for n, lo, hi in problem.free if n == "batch")
    grid = np.round(np.geomspace(lo, hi, points))
    table = [b for b in TABLE_BATCHES if lo <= b <= hi]
    return np.unique(np.concatenate([grid, table, [float(solution.design.batch)]]))


def batch_sweep(problem: dcost.Problem, solution, batches):
    """The problem's exact evaluation (objective, constrained values, limits, report) at every
    batch in ``batches``, the other free variables held at ``solution``'s (one jitted, vmapped
    call)."""
    names = problem.names
    x0 = jnp.asarray(solution.x, dtype=float)
    j = names.index("batch")
    xs = jnp.tile(x0, (len(batches), 1)).at[:, j].set(jnp.asarray(batches, x0.dtype))
    return jax.jit(jax.vmap(lambda x: evaluate(problem, x)))(xs)


def knee(batches, report):
    """Smallest batch whose exact step is compute bound (None when none is)."""
    bound = np.asarray(report.t_compute) >= np.asarray(report.t_weights + report.t_kv)
    return float(np.asarray(batches)[np.argmax(bound)]) if bound.any() else None


def _title(problem, extra="") -> str:
    return (
        f"{SCENARIO['model']} on {SCENARIO['hardware']}, context {SCENARIO['context']:,} tokens, "
        f"time per output token <= {float(problem.tpot_slo) * 1e3:g} ms{extra}"
    )


def pareto_figure(problem=None, path=PARETO):
    """The cost-latency frontier of the problem, with the design at each target; returns
    ``(figure, frontier)``."""
    from matplotlib.figure import Figure

    from dcost.plots import plot_pareto, plot_pareto_designs

    problem = default_problem() if problem is None else problem
    frontier = dcost.pareto(problem, PARETO_SLOS)
    fig = Figure(figsize=(9, 8), layout="constrained")
    top, bottom = fig.subplots(2, 1, sharex=True, height_ratios=(3, 2))
    plot_pareto(frontier, ax=top, label="cheapest design meeting the target")
    top.set_xlabel("")
    top.set_title("Cheapest token against the time per output token target")
    plot_pareto_designs(frontier, ax=bottom)
    bottom.set_title("The design at each target, and the constraint that binds it")
    bounds = ", ".join(f"{n} {lo}..{hi}" for n, lo, hi in problem.free)
    fig.suptitle(_title(problem, f"\nsearched over {bounds}"), fontsize=10)
    if path is not None:
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        print(f"figure: {path}")
    sol = frontier.solution
    rows = [
        [
            f"{float(s_) * 1e3:g}",
            f"{float(c) * 1e6:.4g}" if ok else "infeasible",
            f"{float(t) * 1e3:.3g}" if ok else "-",
            f"{float(sol.design.batch[i]):,.0f}" if ok else "-",
            ", ".join(sol.binding[i] + sol.at_bound[i]) or "none" if ok else "-",
        ]
        for i, (s_, c, t, ok) in enumerate(
            zip(frontier.tpot_slo, frontier.cost, frontier.tpot, frontier.feasible, strict=True)
        )
    ]
    print(format_table(rows, ["tpot target ms", "$/M tokens", "tpot ms", "batch", "binding"]))
    return fig, frontier


def batch_figure(problem=None, solution=None, path=FIGURE):
    """The exact model over the problem's batch range at the optimum's chips and stages: prints a
    table and draws ``batch_curve``; returns ``(figure, batches, evaluation, solution)``."""
    from dcost.plots import batch_curve

    problem = default_problem() if problem is None else problem
    sol = dcost.optimize(problem) if solution is None else solution
    batches = sweep_batches(problem, sol)
    ev = batch_sweep(problem, sol, batches)
    r = ev.report
    limits = {k: float(v) for k, v in problem.limit_values().items()}
    h, m, w = problem.hardware, problem.model, problem.workload
    bstar = float(dcost.balance_batch(h, m, w.context))
    k = knee(batches, r)
    d = sol.design
    g, p = float(d.chips), float(d.stages)
    print(
        f"{SCENARIO['model']} on {SCENARIO['hardware']}, {g:.0f} chips per stage x {p:.0f} "
        f"stages (the optimum's), context {SCENARIO['context']} tokens (exact model)"
    )
    feasible = np.asarray(ev.feasible)
    over = np.asarray(~ev.feasible_each)
    rows = []
    for b in sorted({*TABLE_BATCHES, float(d.batch)} & set(batches.tolist())):
        i = int(np.flatnonzero(batches == b)[0])
        why = ", ".join(n for n, o in zip(problem.constraints, over[i], strict=True) if o)
        rows.append(
            [
                f"{b:,.0f}" + (" (optimum)" if b == float(d.batch) else ""),
                f"{float(r.t_compute[i]) * 1e3:.3f}",
                f"{float(r.t_weights[i]) * 1e3:.3f}",
                f"{float(r.t_kv[i]) * 1e3:.3f}",
                f"{float(r.t_comm[i]) * 1e3:.3f}",
                f"{float(r.tpot[i]) * 1e3:.3f}",
                f"{float(ev.cost[i]) * 1e6:.4g}",
                f"{float(r.memory_per_chip[i]) / 1e9:.1f}",
                "yes" if feasible[i] else f"over {why}",
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
                "within limits",
            ],
        )
    )
    print(
        f"balance batch (closed form, all experts touched): {bstar:,.0f}"
        if np.isfinite(bstar)
        else "balance batch (closed form, all experts touched): none, the KV reads of a sequence"
        " outweigh its compute, so no batch turns the step compute bound"
    )
    print(
        f"knee of the exact model: {k:,.0f}" if k else "the exact model never turns compute bound"
    )
    fig = batch_curve(
        batches,
        r,
        balance=bstar,
        knee=k,
        capacity=limits.get("memory"),
        tpot_limit=limits.get("tpot"),
        optimum=float(d.batch),
        binding=tuple(sol.binding) + tuple(sol.at_bound),
        title=_title(
            problem,
            f"\nthe exact model at the optimum's {g:.0f} chips per stage x {p:.0f} "
            f"stage{'s' if p != 1 else ''}",
        ),
    )
    if path is not None:
        path = pathlib.Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        print(f"figure: {path}")
    return fig, batches, ev, sol


def main(path=FIGURE):
    print("== dcost optimize (the default scenario)")
    optimize_default()
    problem = default_problem()
    print("\n== cost-latency frontier")
    pareto_figure(problem)
    print("\n== the exact model over batch, at the optimum's chips and stages")
    batch_figure(problem, path=path)
    print(dcost._cache.describe())  # the next `dcost optimize` reuses what the demo compiled


if __name__ == "__main__":
    main()
