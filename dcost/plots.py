"""Figures for people: every axis labelled with its unit, the optimum and the binding limit marked.

A leaf of the package: nothing in dcost's cost models imports this module. matplotlib is imported
lazily so that ``import dcost`` stays light. Figures are bare ``matplotlib.figure.Figure`` objects,
made without pyplot: plotting never changes the caller's backend (a notebook keeps its inline
figures) and nothing accumulates in pyplot's figure list. Save one with ``fig.savefig``; in a
notebook, a figure that ends a cell is displayed.
"""

from __future__ import annotations

import numpy as np

__all__ = ["batch_curve", "plot_pareto"]


def batch_curve(batch, report, *, balance=None, knee=None, capacity=None, title="", path=None):
    """Time per output token and cost per token against batch, each term drawn (log-log).

    Args:
      batch: 1-D array of batch sizes (sequences).
      report: a ``dcost.Report`` with fields batched along ``batch``.
      balance: the closed-form balance batch ``B*`` to mark (sequences), or None.
      knee: the batch where the exact model turns compute bound, or None.
      capacity: usable HBM bytes per chip; batches whose memory per chip exceeds it are shaded
        and excluded from the cheapest point (None: no limit drawn).
      title: figure title.
      path: where to save the PNG (None: do not save).

    Returns:
      The matplotlib figure.
    """
    from matplotlib.figure import Figure

    b = np.asarray(batch)

    def ms(x):
        return np.asarray(x) * 1e3

    fig = Figure(figsize=(12, 4.8))
    ax1, ax2 = fig.subplots(1, 2)
    ax1.loglog(b, ms(report.t_compute), label="compute", color="tab:red", lw=1.2)
    ax1.loglog(b, ms(report.t_weights), label="weight reads", color="tab:blue", lw=1.2)
    ax1.loglog(b, ms(report.t_kv), label="KV-cache reads", color="tab:green", lw=1.2)
    comm = np.asarray(report.t_comm)
    if np.any(comm > 0):
        ax1.loglog(b, ms(comm), label="all-to-all / all-reduce", color="tab:purple", lw=1.2)
    ax1.loglog(b, ms(report.tpot), label="time per output token", color="black", lw=2.4)
    ax1.set_xlabel("batch (sequences per step)")
    ax1.set_ylabel("time per step (ms)")
    ax1.set_title("Latency: each term of one decode step")
    cost = np.asarray(report.cost_per_token) * 1e6
    ax2.loglog(b, cost, color="black", lw=2.4)
    ax2.set_xlabel("batch (sequences per step)")
    ax2.set_ylabel("cost ($ per million output tokens)")
    ax2.set_title("Cost per token")
    for ax in (ax1, ax2):
        if balance is not None and np.isfinite(balance):
            ax.axvline(balance, color="gray", ls="--", lw=1)
            ax.annotate(
                f"balance batch B* = {balance:,.0f}",
                (balance, 0.97),
                xycoords=("data", "axes fraction"),
                ha="right",
                va="top",
                rotation=90,
                fontsize=8,
                color="gray",
            )
        if knee is not None:
            ax.axvline(knee, color="tab:orange", ls=":", lw=1.5)
            ax.annotate(
                f"knee (exact) = {knee:,.0f}",
                (knee, 0.03),
                xycoords=("data", "axes fraction"),
                ha="left",
                va="bottom",
                rotation=90,
                fontsize=8,
                color="tab:orange",
            )
        ax.grid(True, which="both", alpha=0.25)
    ax1.legend(fontsize=8, loc="upper left")
    fits = np.ones_like(b, dtype=bool)
    if capacity is not None:
        fits = np.asarray(report.memory_per_chip) <= capacity
        if not fits.all():
            first = b[np.argmin(fits)] if fits.any() else b[0]
            for ax in (ax1, ax2):
                ax.axvspan(first, b[-1], color="tab:red", alpha=0.08, lw=0)
                ax.annotate(
                    "KV + weights exceed HBM",
                    (first, 0.5),
                    xycoords=("data", "axes fraction"),
                    fontsize=8,
                    color="tab:red",
                    xytext=(4, 0),
                    textcoords="offset points",
                )
    if not fits.any():
        fits = np.ones_like(fits)
    # Cost is flat once compute bound: mark the smallest batch within 1 % of the cheapest.
    cheapest = cost[fits].min()
    i = int(np.flatnonzero(fits & (cost <= 1.01 * cheapest))[0])
    ax2.plot(b[i], cost[i], "o", color="tab:orange")
    ax2.annotate(
        f"within 1 % of the cheapest that fits\nfrom batch {b[i]:,.0f}: ${cost[i]:.3g}/M tokens",
        (b[i], cost[i]),
        textcoords="offset points",
        xytext=(-20, 40),
        ha="right",
        va="bottom",
        fontsize=8,
        arrowprops={"arrowstyle": "-", "color": "gray"},
    )
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=130)
    return fig


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
      frontier: a ``dcost.Frontier``.
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
    ax.plot(
        np.asarray(frontier.tpot)[ok] * 1e3,
        per_m[ok],
        "o",
        ms=3,
        color=line.get_color(),
        alpha=0.6,
        label="its time per token",
    )
    if frontier.optimum >= 0 and ok[frontier.optimum]:
        i = frontier.optimum
        ax.plot(
            [slo_ms[i]],
            [per_m[i]],
            "*",
            ms=14,
            color=line.get_color(),
            markeredgecolor="k",
            label=f"optimum at {slo_ms[i]:.3g} ms: ${per_m[i]:.3g}/M",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("time per output token target (ms)")
    unit = frontier.solution.problem.objective.unit  # "$ per output token"
    ax.set_ylabel(f"cost ({unit.replace('$ per ', '$ per million ')}s)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize="small")
    return ax
