"""Figures for people: every axis labelled with its unit, the optimum and the binding limit marked.

A leaf of the package: nothing in dcost's cost models imports this module. matplotlib is imported
lazily so that ``import dcost`` stays light. Figures are bare ``matplotlib.figure.Figure`` objects,
made without pyplot: plotting never changes the caller's backend (a notebook keeps its inline
figures) and nothing accumulates in pyplot's figure list. Save one with ``fig.savefig``; in a
notebook, a figure that ends a cell is displayed.

Layout rules the helpers keep: labels go in legends placed outside the plotted area (never as
free text next to a point, where they would collide with the data and with each other); log axes
get tick labels at round numbers dense enough that any stretch of the data has one nearby
(``readable_log``); the optimum is a star whose legend entry names the binding constraint.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["batch_curve", "plot_pareto", "plot_pareto_designs", "log_ticks", "readable_log"]

# Round mantissas for log-axis ticks, coarsest first: each set is tried in turn until the view
# holds enough ticks (``log_ticks``).
_MANTISSAS = (
    (1.0,),
    (1.0, 3.0),
    (1.0, 2.0, 5.0),
    (1.0, 2.0, 3.0, 5.0),
    (1.0, 1.5, 2.0, 3.0, 5.0, 7.0),
    (1.0, 1.2, 1.5, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0),
    (1.0, 1.1, 1.2, 1.3, 1.5, 1.7, 2.0, 2.2, 2.5, 2.8, 3.0, 3.5, 4.0, 4.5, 5.0, 6.0, 7.0, 8.0, 9.0),
)
_MARKERS = ("o", "s", "^", "D", "v", "P", "X")
_OPTIMUM_GID = "optimum"


def log_ticks(vmin: float, vmax: float, least: int = 5, most: int = 10) -> list[float]:
    """Round tick values for a log axis showing ``[vmin, vmax]``.

    The coarsest of the mantissa sets (1; 1, 3; 1, 2, 5; ... down to steps of 0.1-0.5) that puts
    at least ``least`` ticks inside the view, without exceeding ``most``; over many decades, every
    k-th power of ten. A view spanning a factor of two still gets five labelled ticks, so the
    values that matter have a readable label next to them.

    >>> log_ticks(0.21, 0.53)
    [0.22, 0.25, 0.28, 0.3, 0.35, 0.4, 0.45, 0.5]
    >>> log_ticks(0.8, 2e4)
    [1.0, 10.0, 100.0, 1000.0, 10000.0]
    """
    if not (vmin > 0 and vmax > vmin and math.isfinite(vmax)):
        return []
    lo, hi = math.floor(math.log10(vmin)), math.ceil(math.log10(vmax))
    if hi - lo > most:
        stride = math.ceil((hi - lo) / most)
        return [10.0**k for k in range(lo, hi + 1, stride) if vmin <= 10.0**k <= vmax]
    best: list[float] = []
    for mantissas in _MANTISSAS:
        ticks = [
            float(f"{m * 10.0**k:.3g}")  # 0.22, not 0.22000000000000003
            for k in range(lo, hi + 1)
            for m in mantissas
        ]
        inside = sorted({t for t in ticks if vmin <= t <= vmax})
        if len(inside) > most:
            break
        best = inside
        if len(inside) >= least:
            break
    return best


def _tick_text(value: float) -> str:
    """A tick label: plain digits from 0.0001 to 999,999, powers of ten beyond."""
    if value <= 0 or not math.isfinite(value):
        return ""
    if 1e-4 <= value < 1e6:
        return f"{value:,.6g}"
    k = math.floor(math.log10(value) + 1e-9)
    m = value / 10.0**k
    return f"$10^{{{k}}}$" if abs(m - 1.0) < 1e-6 else f"${m:g}\\times10^{{{k}}}$"


def readable_log(axis) -> None:
    """Give a matplotlib log ``axis`` (``ax.xaxis``/``ax.yaxis``) round, labelled ticks.

    Major ticks come from ``log_ticks`` over the current view (recomputed when the view changes)
    and read as plain numbers (``0.25``, ``1,000``); minor ticks keep their marks but lose their
    labels, so labels never crowd each other.
    """
    from matplotlib import ticker

    class _Round(ticker.Locator):
        def __call__(self):
            assert self.axis is not None, "the locator is used before set_major_locator"
            vmin, vmax = sorted(self.axis.get_view_interval())
            return self.tick_values(vmin, vmax)

        def tick_values(self, vmin, vmax):
            return log_ticks(vmin, vmax)

    axis.set_major_locator(_Round())
    axis.set_major_formatter(ticker.FuncFormatter(lambda v, _pos: _tick_text(v)))
    axis.set_minor_formatter(ticker.NullFormatter())


def _crossing(b, value, limit):
    """The batch where an increasing ``value`` first exceeds ``limit`` (log-linear interpolation
    between the sweep points around it), or None when it never does."""
    over = value > limit
    if not over.any():
        return None
    j = int(np.argmax(over))
    if j == 0:
        return float(b[0])
    x0, x1 = np.log(b[j - 1]), np.log(b[j])
    y0, y1 = np.log(value[j - 1]), np.log(value[j])
    t = 0.0 if y1 == y0 else (np.log(limit) - y0) / (y1 - y0)
    return float(np.exp(x0 + np.clip(t, 0.0, 1.0) * (x1 - x0)))


def batch_curve(
    batch,
    report,
    *,
    balance=None,
    knee=None,
    capacity=None,
    tpot_limit=None,
    optimum=None,
    binding=(),
    title="",
    path=None,
):
    """Time per output token, memory per chip and cost per token against batch, limits marked.

    Three panels over the same batch axis (log): each term of one decode step with the time per
    output token; the memory per chip; the cost per token. Batches over a limit are shaded, one
    colour per limit, from where the curve crosses it; the optimum is a star on every panel.

    Args:
      batch: 1-D array of batch sizes (sequences), ascending.
      report: a ``dcost.Report`` with fields batched along ``batch``.
      balance: the closed-form balance batch ``B*`` to mark (sequences), or None (or inf: not
        drawn).
      knee: the batch where the exact model turns compute bound, or None.
      capacity: the memory limit per chip (bytes): HBM capacity less any reserve, as in
        ``Problem.limit_values()["memory"]``; None: no memory limit.
      tpot_limit: the time per output token limit (s), or None.
      optimum: the batch of the optimum design, which must be one of ``batch`` (e.g. the batch
        ``dcost.optimize`` chose, swept at its chips and stages); None: the cheapest batch of the
        sweep within the limits is marked instead.
      binding: names of the constraints binding at ``optimum``, for its label.
      title: figure title.
      path: where to save the PNG (None: do not save).

    Returns:
      The matplotlib figure. The star of the cost panel has gid ``"optimum"``.
    """
    from matplotlib.figure import Figure

    b = np.asarray(batch, dtype=float)
    if b.ndim != 1 or b.size < 2 or np.any(np.diff(b) <= 0):
        raise ValueError("batch_curve: batch must be a 1-D ascending array of at least 2 batches")
    tpot = np.asarray(report.tpot, dtype=float)
    memory = np.asarray(report.memory_per_chip, dtype=float)
    cost = np.asarray(report.cost_per_token, dtype=float) * 1e6

    fig = Figure(figsize=(15, 6.0), layout="constrained")
    ax_t, ax_m, ax_c = fig.subplots(1, 3, sharex=True)
    fits = np.ones_like(b, dtype=bool)
    limits = []  # (what, values, limit, text, colour, hatch)
    if capacity is not None:
        fits &= memory <= capacity
        limits.append(("memory", memory, capacity, f"{capacity / 1e9:.3g} GB per chip", "tab:red"))
    if tpot_limit is not None:
        fits &= tpot <= tpot_limit
        limits.append(
            ("time per output token", tpot, tpot_limit, f"{tpot_limit * 1e3:.3g} ms", "tab:blue")
        )

    def ms(x):
        return np.asarray(x, dtype=float) * 1e3

    def main_curve(ax, y, label):
        """Black within every limit, dashed grey where over one."""
        (over,) = ax.plot(b, y, color="0.55", lw=1.6, ls="--")
        ax.plot(b, np.where(fits, y, np.nan), color="black", lw=2.4, label=label)
        return over

    ax_t.plot(b, ms(report.t_compute), label="compute", color="tab:red", lw=1.2)
    ax_t.plot(b, ms(report.t_weights), label="weight reads", color="tab:blue", lw=1.2)
    ax_t.plot(b, ms(report.t_kv), label="KV-cache reads", color="tab:green", lw=1.2)
    comm = np.asarray(report.t_comm)
    if np.any(comm > 0):
        ax_t.plot(b, ms(comm), label="all-to-all / all-reduce", color="tab:purple", lw=1.2)
    main_curve(ax_t, ms(tpot), "time per output token")
    ax_t.set_yscale("log")
    if tpot_limit is not None:  # keep the limit in view when no batch reaches it
        lo, hi = ax_t.get_ylim()
        ax_t.set_ylim(lo, max(hi, tpot_limit * 1e3 * 1.5))
    ax_t.set_ylabel("time per decode step (ms)")
    ax_t.set_title("Latency: each term of one decode step")
    main_curve(ax_m, memory / 1e9, "weights + KV cache per chip")
    ax_m.set_ylabel("memory per chip (GB)")
    ax_m.set_ylim(0, max(memory.max(), capacity or 0.0) / 1e9 * 1.05)
    ax_m.set_title("Memory per chip")
    over = main_curve(ax_c, cost, "cost per output token")
    ax_c.set_yscale("log")
    ax_c.set_ylabel("cost ($ per million output tokens)")
    ax_c.set_title("Cost per token")

    common = []  # (handle, label) for the figure legend, one column per limit
    for k, (what, value, limit, text, color) in enumerate(limits):
        ax = ax_m if what == "memory" else ax_t
        scale = 1e-9 if what == "memory" else 1e3
        line = ax.axhline(limit * scale, color=color, ls="-.", lw=1.2)
        common.append((line, f"{what} limit: {text}"))
        cut = _crossing(b, value, limit)
        if cut is None:
            continue
        style = {"facecolor": color, "alpha": 0.1, "lw": 0}
        if k:  # a second limit hatched, so that overlapping regions stay apart
            style = {"facecolor": "none", "edgecolor": color, "alpha": 0.5, "hatch": "//", "lw": 0}
        for ax in (ax_t, ax_m, ax_c):
            span = ax.axvspan(cut, b[-1], **style)
        common.append((span, f"batches over the {what} limit"))
    if not fits.all():
        common.append((over, "curve where a limit is exceeded"))
    if balance is not None and np.isfinite(balance):
        for ax in (ax_t, ax_m, ax_c):
            line = ax.axvline(balance, color="gray", ls="--", lw=1)
        common.append((line, f"balance batch B* = {balance:,.0f} (closed form)"))
    if knee is not None and np.isfinite(knee):
        for ax in (ax_t, ax_m, ax_c):
            line = ax.axvline(knee, color="tab:orange", ls=":", lw=1.5)
        common.append((line, f"knee of the exact model: batch {knee:,.0f}"))

    if optimum is not None:
        hits = np.flatnonzero(b == float(optimum))
        if hits.size == 0:
            raise ValueError(f"batch_curve: optimum = {optimum!r} is not one of the swept batches")
        i = int(hits[0])
        star_label = (
            f"optimum: batch {b[i]:,.0f}, ${cost[i]:.4g} per million tokens\n"
            f"binding constraint: {', '.join(binding) or 'none'}"
        )
    else:
        pool = np.flatnonzero(fits) if fits.any() else np.arange(b.size)
        i = int(pool[np.argmin(cost[pool])])
        star_label = f"cheapest swept batch within the limits:\nbatch {b[i]:,.0f}, ${cost[i]:.4g}/M"
    for ax, y in ((ax_t, ms(tpot[i])), (ax_m, memory[i] / 1e9), (ax_c, cost[i])):
        (star,) = ax.plot([b[i]], [y], "*", ms=15, color="gold", markeredgecolor="black", zorder=5)
    star.set_gid(_OPTIMUM_GID)
    star.set_label(star_label)

    for ax in (ax_t, ax_m, ax_c):
        ax.set_xscale("log")
        readable_log(ax.xaxis)
        if ax.get_yscale() == "log":
            readable_log(ax.yaxis)
        ax.set_xlabel("batch (sequences per step)")
        ax.grid(True, which="major", alpha=0.35)
        ax.grid(True, which="minor", alpha=0.12)
        ax.legend(
            fontsize=8,
            loc="upper center",
            bbox_to_anchor=(0.5, -0.16),
            ncols=2 if ax is ax_t else 1,
        )
    if common:
        handles, labels = zip(*common, strict=True)
        fig.legend(
            handles, labels, loc="outside lower center", ncols=min(4, len(common)), fontsize=8
        )
    if title:
        fig.suptitle(title)
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def _axes(ax):
    if ax is not None:
        return ax
    from matplotlib.figure import Figure

    return Figure(figsize=(6.0, 4.0), layout="constrained").add_subplot()


def _binding(sol, i) -> str:
    """The binding constraints and bounds of design ``i`` of a batched solution, for a label."""
    names = tuple(sol.binding[i]) + tuple(sol.at_bound[i])
    return ", ".join(names) or "none"


def plot_pareto(frontier, ax=None, label=None, color=None):
    """Cost per million tokens against the time-per-output-token target, from ``dcost.pareto``.

    The line is the cheapest cost meeting each target (a step down as the target loosens); dots
    are the designs' own time per output token; a star marks the optimum at the problem's own
    target, its legend entry giving its cost and binding constraint. Both axes are log scaled
    with round, labelled ticks (``readable_log``). ``plot_pareto_designs`` draws what the
    designs along the frontier are.

    Args:
      frontier: a ``dcost.Frontier``.
      ax: a matplotlib Axes; a new figure's when None.
      label: legend label of the line.
      color: matplotlib color.

    Returns:
      The Axes. The star has gid ``"optimum"``.

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
        (star,) = ax.plot(
            [slo_ms[i]],
            [per_m[i]],
            "*",
            ms=14,
            color=line.get_color(),
            markeredgecolor="k",
            label=f"optimum at {slo_ms[i]:.3g} ms: ${per_m[i]:.4g}/M, "
            f"binding: {_binding(frontier.solution, i)}",
            zorder=5,
        )
        star.set_gid(_OPTIMUM_GID)
    ax.set_xscale("log")
    ax.set_yscale("log")
    readable_log(ax.xaxis)
    readable_log(ax.yaxis)
    ax.set_xlabel("time per output token target (ms)")
    unit = frontier.solution.problem.objective.unit  # "$ per output token"
    ax.set_ylabel(f"cost ({unit.replace('$ per ', '$ per million ')}s)")
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)
    ax.legend(fontsize="small")
    return ax


def plot_pareto_designs(frontier, ax=None):
    """The batch of the cheapest design at each target of a ``dcost.Frontier``, by binding limit.

    One marker shape per binding constraint (``tpot``, ``memory``, ...), so the plot says why the
    design changes along the frontier. When the chips per stage and stages are the same at every
    target the legend says so; otherwise the markers are coloured by chips per replica, with a
    colour bar.

    Args:
      frontier: a ``dcost.Frontier``.
      ax: a matplotlib Axes; a new figure's when None.

    Returns:
      The Axes (log-log, time per output token target in ms against batch). The star has gid
      ``"optimum"``.
    """
    ax = _axes(ax)
    sol = frontier.solution
    slo_ms = np.asarray(frontier.tpot_slo) * 1e3
    ok = np.asarray(frontier.feasible)
    batch = np.asarray(sol.design.batch, dtype=float) * np.ones_like(slo_ms)
    chips = np.asarray(sol.design.chips, dtype=float) * np.ones_like(slo_ms)
    stages = np.asarray(sol.design.stages, dtype=float) * np.ones_like(slo_ms)
    replica = chips * stages
    same = ok.any() and np.unique(chips[ok]).size == 1 and np.unique(stages[ok]).size == 1
    ax.step(slo_ms[ok], batch[ok], where="post", color="gray", lw=1.2, label="batch")
    reasons = [_binding(sol, i) if ok[i] else "" for i in range(slo_ms.size)]
    scatter = None
    for k, why in enumerate(dict.fromkeys(r for r in reasons if r)):
        at = np.array([r == why for r in reasons])
        marker = _MARKERS[k % len(_MARKERS)]
        if same:
            ax.plot(slo_ms[at], batch[at], marker, ms=7, color=f"C{k + 1}", label=f"binding: {why}")
            continue
        scatter = ax.scatter(
            slo_ms[at],
            batch[at],
            c=replica[at],
            marker=marker,
            s=50,
            cmap="viridis",
            vmin=replica[ok].min(),
            vmax=replica[ok].max(),
            edgecolors="black",
            linewidths=0.5,
            zorder=3,
        )
        ax.plot([], [], marker, ms=7, color="0.6", markeredgecolor="black", label=f"binding: {why}")
    if frontier.optimum >= 0 and ok[frontier.optimum]:
        i = frontier.optimum
        (star,) = ax.plot(
            [slo_ms[i]], [batch[i]], "*", ms=14, color="gold", markeredgecolor="k", zorder=5
        )
        star.set_label(f"optimum: batch {batch[i]:,.0f}")
        star.set_gid(_OPTIMUM_GID)
    ax.set_xscale("log")
    ax.set_yscale("log")
    readable_log(ax.xaxis)
    readable_log(ax.yaxis)
    ax.margins(y=0.12)  # markers at the largest batch clear the frame
    ax.set_xlabel("time per output token target (ms)")
    ax.set_ylabel("batch of the cheapest design\n(sequences per step)")
    ax.grid(True, which="major", alpha=0.35)
    ax.grid(True, which="minor", alpha=0.12)
    title = None
    if same:
        g, p = chips[ok][0], stages[ok][0]
        title = f"every design: {g:.0f} chips per stage x {p:.0f} stage{'s' if p != 1 else ''}"
    elif scatter is not None:
        bar = ax.figure.colorbar(scatter, ax=ax)
        bar.set_label("chips per replica (chips per stage x stages)")
    # the batch grows with a looser target: the lower right is where the frontier is not
    ax.legend(fontsize="small", title=title, title_fontsize="small", loc="lower right")
    return ax


def validation_figure(cv, unfitted, summary):
    """Held-out predictions against measurements, log axes, one panel for times and one for
    throughputs, the +/-25 % band, coloured by hardware family; records the fit does not see
    (time to first token under load: queueing; decode steps on bare kernels) are hollow.

    Args:
      cv: a ``dcost.calibrate.families.CrossValidation``.
      unfitted: one bool per record: True where the fit does not see it.
      summary: ``dcost.calibrate.families.summary(cv)``.
    """
    from matplotlib.figure import Figure  # not pyplot: no backend is chosen for the caller

    measured = np.array([float(r["value"]) for r in cv.records])
    held = np.asarray(cv.held_out)
    fams = [r["family"] for r in cv.records]
    time = np.array([r["metric"] in ("tpot", "ttft", "step_time") for r in cv.records])
    queue = np.asarray(unfitted, dtype=bool)
    colours = dict(
        zip(sorted(set(fams)), ["C0", "C1", "C2", "C3", "C4", "C5", "C6", "C7"], strict=False)
    )
    fig = Figure(figsize=(12, 5.6), layout="constrained")
    axes = fig.subplots(1, 2)
    panels = (
        (axes[0], time, 1e3, "time (ms): tpot, ttft, step"),
        (axes[1], ~time, 1.0, "throughput (tokens/s per GPU)"),
    )
    for ax, sel, scale, what in panels:
        if not np.any(sel):
            continue
        x, y = measured[sel] * scale, held[sel] * scale
        lo, hi = min(x.min(), y.min()) / 1.5, max(x.max(), y.max()) * 1.5
        grid = np.geomspace(lo, hi, 50)
        ax.fill_between(grid, grid / 1.25, grid * 1.25, color="0.85", label="+/-25 %")
        ax.plot(grid, grid, color="0.4", lw=0.8)
        for f in colours:
            pick = sel & (np.array(fams) == f)
            for hollow in (False, True):
                m = pick & (queue == hollow)
                if np.any(m):
                    ax.scatter(
                        measured[m] * scale,
                        held[m] * scale,
                        s=26,
                        facecolors="none" if hollow else colours[f],
                        edgecolors=colours[f],
                        label=None if hollow else f"{f} ({summary[f]['records']})",
                    )
        ax.set(
            xscale="log",
            yscale="log",
            xlim=(lo, hi),
            ylim=(lo, hi),
            xlabel=f"measured {what}",
            ylabel=f"dcost, held out: {what}",
        )
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(loc="upper left", fontsize=8, title="family (records fitted)")
    if np.any(queue):
        axes[0].scatter(
            [],
            [],
            facecolors="none",
            edgecolors="0.3",
            label="not fitted: ttft under load (queueing), dcost's bare kernels",
        )
        axes[0].legend(loc="upper left", fontsize=8)
    o = summary["overall"]
    fig.suptitle(
        f"{len(measured)} measurements against dcost, calibrated per family and "
        f"held out by source (leave-one-source-out)\nmedian error {100 * o['median']:.0f} %, "
        f"90th percentile {100 * o['p90']:.0f} % ({o['records']} fitted records)"
    )
    return fig
