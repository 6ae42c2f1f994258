"""Figures. The only module that imports matplotlib; every function takes an optional ``ax``.

Axes are in the units people read: $ per million tokens, milliseconds.
"""

from __future__ import annotations

import numpy as np

from dcost import objectives

__all__ = ["plot_pareto"]


def _axes(ax):
    if ax is not None:
        return ax
    from matplotlib.figure import Figure

    return Figure(figsize=(6.0, 4.0), layout="constrained").add_subplot()


def plot_pareto(frontier, ax=None, label=None, color=None):
    """Cost per million tokens against the time-per-output-token target, from ``dcost.pareto``.

    The line is the cheapest cost meeting each target (a step down as the target loosens); dots
    are the designs' own time per output token; a star marks the optimum at the problem's own
    target.

    Args:
      frontier: a ``dcost.pareto.Frontier``.
      ax: a matplotlib Axes; a new figure's when None.
      label: legend label of the line.
      color: matplotlib color.

    Returns:
      The Axes.

    >>> import dcost
    >>> from dcost.plots import plot_pareto
    >>> p = dcost.Problem(dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"),
    ...                   dcost.Workload(2048), free={"batch": (1, 512), "chips": (1, 8)})
    >>> ax = plot_pareto(dcost.pareto(p, [0.01, 0.03]))
    >>> ax.get_xlabel()
    'time per output token target (ms)'
    """
    ax = _axes(ax)
    slo_ms = np.asarray(frontier.tpot_slo) * 1e3
    ok = np.asarray(frontier.feasible)
    per_m = np.where(ok, np.asarray(frontier.cost) * 1e6, np.nan)
    (line,) = ax.step(slo_ms, per_m, where="post", color=color, label=label or "cheapest design")
    ax.plot(np.asarray(frontier.tpot)[ok] * 1e3, per_m[ok], "o", ms=3, color=line.get_color(),
            alpha=0.6, label="its time per token")
    if frontier.optimum >= 0 and ok[frontier.optimum]:
        i = frontier.optimum
        ax.plot([slo_ms[i]], [per_m[i]], "*", ms=14, color=line.get_color(), markeredgecolor="k",
                label=f"optimum at {slo_ms[i]:.3g} ms: ${per_m[i]:.3g}/M")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("time per output token target (ms)")
    unit = objectives.get(frontier.solution.problem.objective).unit  # "$ per output token"
    ax.set_ylabel(f"cost ({unit.replace('$ per ', '$ per million ')}s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return ax
