"""The demo's figures, read as a person reads them, and checked against the printed optimum.

``make demo`` prints the optimum of ``dcost optimize`` and draws two figures of the same problem.
These tests build the figures (into a temporary folder) and check what can be checked without
looking: the star of each figure is the printed optimum; the batch sweep covers the optimizer's
answer and no swept batch within the limits is cheaper; every log axis has at least three labelled
ticks inside the data's range (and one near the optimum's cost on the frontier); no two pieces of
text overlap, none leaves the figure, and no legend or text sits on a data curve.
"""

from __future__ import annotations

import dataclasses
import itertools
import re

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.lines import Line2D
from matplotlib.text import Text

import dcost
from dcost import demo
from dcost.plots import batch_curve, log_ticks
from dcost.specs import attention_splits


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    out = tmp_path_factory.mktemp("figures")
    problem = demo.default_problem()
    sol = dcost.optimize(problem)
    fig_b, batches, ev, sol = demo.batch_figure(problem, sol, path=out / "batch.png")
    fig_p, frontier = demo.pareto_figure(problem, path=out / "pareto.png")
    for fig in (fig_b, fig_p):
        FigureCanvasAgg(fig)  # a renderer for text extents (dcost.plots draws without pyplot)
        fig.canvas.draw()
    return {
        "problem": problem,
        "solution": sol,
        "batches": batches,
        "evaluation": ev,
        "batch_fig": fig_b,
        "frontier": frontier,
        "pareto_fig": fig_p,
        "out": out,
    }


def _star(fig):
    stars = [ln for ln in fig.findobj(Line2D) if ln.get_gid() == "optimum"]
    assert len(stars) >= 1, "the figure marks no optimum"
    return stars


def _printed_optimum(capsys):
    """Batch and $ per million tokens that ``dcost optimize`` prints for the demo's scenario."""
    from dcost.cli.app import main as cli

    assert cli(["optimize", *demo.ARGS, "--no-sensitivity"]) == 0
    text = capsys.readouterr().out
    batch = float(re.search(r"design:\s+batch (\d+)", text).group(1))
    cost = float(re.search(r"cost:\s+\$([\d.eE+-]+) per million", text).group(1))
    binding = re.search(r"binding:\s+(.+)", text).group(1).strip()
    return batch, cost, binding


@pytest.mark.slow
def test_batch_figure_marks_the_printed_optimum(built, capsys):
    batch, cost, binding = _printed_optimum(capsys)
    (star,) = [s for s in _star(built["batch_fig"]) if s.axes.get_title() == "Cost per token"]
    assert star.get_xdata()[0] == batch
    assert float(f"{star.get_ydata()[0]:.4g}") == pytest.approx(cost, rel=1e-9)
    assert f"binding constraint: {binding}" in star.get_label()
    assert f"batch {batch:,.0f}" in star.get_label()


@pytest.mark.slow
def test_pareto_star_is_the_printed_optimum(built, capsys):
    batch, cost, binding = _printed_optimum(capsys)
    f = built["frontier"]
    top = _star(built["pareto_fig"])
    cost_star = [s for s in top if "$" in s.get_label()][0]
    assert cost_star.get_xdata()[0] == pytest.approx(float(built["problem"].tpot_slo) * 1e3)
    assert float(f"{cost_star.get_ydata()[0]:.4g}") == pytest.approx(cost, rel=1e-9)
    assert f"binding: {binding}" in cost_star.get_label()
    assert float(f.solution.design.batch[f.optimum]) == batch
    batch_star = [s for s in top if s.get_label().startswith("optimum: batch")][0]
    assert batch_star.get_ydata()[0] == batch


@pytest.mark.slow
def test_sweep_covers_the_optimum_and_none_within_limits_is_cheaper(built):
    b, ev, sol, problem = built["batches"], built["evaluation"], built["solution"], built["problem"]
    opt = float(sol.design.batch)
    (lo, hi) = next((lo, hi) for n, lo, hi in problem.free if n == "batch")
    assert b[0] == lo and b[-1] == hi and opt in b
    i = int(np.flatnonzero(b == opt)[0])
    assert float(ev.cost[i]) == pytest.approx(float(sol.cost), rel=1e-6)
    ok = np.asarray(ev.feasible)
    assert ok[i]
    assert np.min(np.asarray(ev.cost)[ok]) >= float(sol.cost) * (1 - 1e-6)
    # a binding memory limit cuts the curve right after the optimum, or stops the next
    # launchable layout with fewer chips (the design's neighbours, dcost.search.solution.finish)
    if (
        "memory" in sol.binding
        and np.asarray(ev.feasible_each)[i + 1, problem.constraints.index("memory")]
    ):
        chips = float(sol.design.chips)
        fewer = max(g for g in range(1, int(chips)) if attention_splits(problem.model, g))
        smaller = dataclasses.replace(sol.design, chips=float(fewer))
        step = dcost.decode(smaller, problem.hardware, problem.model, problem.workload)
        assert float(step.memory_per_chip) > float(problem.limit_values()["memory"])


def _labelled_ticks(axis, lo, hi):
    axis.axes.figure.canvas.draw()
    ticks = axis.get_majorticklabels()
    pos = 0 if axis.axis_name == "x" else 1
    return [t.get_text() for t in ticks if t.get_text() and lo <= t.get_position()[pos] <= hi]


@pytest.mark.slow
def test_log_axes_have_three_labels_inside_the_data(built):
    f = built["frontier"]
    cost = np.asarray(f.cost)[np.asarray(f.feasible)] * 1e6
    top = built["pareto_fig"].axes[0]
    assert len(_labelled_ticks(top.yaxis, cost.min(), cost.max())) >= 3
    # the optimum (the star) can be read off the axis: a labelled tick within a factor 1.6 of it
    # (1-2-5 labels are at most 2.5x apart, so one always lies within sqrt(2.5) of any value)
    best = float(built["solution"].cost) * 1e6
    assert len(_labelled_ticks(top.yaxis, best / 1.6, best * 1.6)) >= 1
    slo = np.asarray(f.tpot_slo) * 1e3
    bottom = built["pareto_fig"].axes[1]  # the panels share x; the lower one labels it
    assert len(_labelled_ticks(bottom.xaxis, slo.min(), slo.max())) >= 3
    batch = np.asarray(f.solution.design.batch)[np.asarray(f.feasible)]
    assert len(_labelled_ticks(bottom.yaxis, batch.min(), batch.max())) >= 3
    ev = built["evaluation"]
    for ax in built["batch_fig"].axes:
        assert len(_labelled_ticks(ax.xaxis, 1, built["batches"][-1])) >= 3
    c = np.asarray(ev.cost) * 1e6
    cost_ax = [a for a in built["batch_fig"].axes if a.get_title() == "Cost per token"][0]
    assert len(_labelled_ticks(cost_ax.yaxis, c.min(), c.max())) >= 3


def _hidden_ticks(fig):
    """Tick labels matplotlib keeps but does not draw: those of ticks outside the view."""
    hidden = set()
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            slack = 1e-9 * max(abs(lo), abs(hi))
            for tick in axis.get_major_ticks() + axis.get_minor_ticks():
                if not lo - slack <= tick.get_loc() <= hi + slack:
                    hidden |= {id(tick.label1), id(tick.label2)}
    return hidden


def _texts(fig):
    """``(text, bounding box)`` of every piece of text the figure draws."""
    r = fig.canvas.get_renderer()
    hidden = _hidden_ticks(fig)
    return [
        (t.get_text(), t.get_window_extent(r))
        for t in fig.findobj(Text)
        if t.get_visible() and t.get_text().strip() and id(t) not in hidden
    ]


def _data_points(ax):
    """Display coordinates along every data curve of ``ax`` (segments sampled)."""
    pts = []
    for ln in ax.get_lines():
        if ln.get_transform() != ax.transData or not ln.get_visible():
            continue  # axhline/axvline span the axes: reference lines, not data
        xy = ax.transData.transform(np.column_stack([ln.get_xdata(), ln.get_ydata()]))
        xy = xy[np.all(np.isfinite(xy), axis=1)]
        for p0, p1 in itertools.pairwise(xy):
            pts.append(p0 + np.linspace(0, 1, 25)[:, None] * (p1 - p0))
        pts.append(xy)
    return np.concatenate(pts) if pts else np.zeros((0, 2))


@pytest.mark.slow
@pytest.mark.parametrize("name", ["batch_fig", "pareto_fig"])
def test_no_text_overlaps_and_none_leaves_the_frame(built, name):
    fig = built[name]
    fig.canvas.draw()
    texts = _texts(fig)
    assert len(texts) > 20
    frame = fig.bbox
    for text, box in texts:
        assert (
            box.x0 >= frame.x0 - 1
            and box.x1 <= frame.x1 + 1
            and box.y0 >= frame.y0 - 1
            and box.y1 <= frame.y1 + 1
        ), f"{text!r} leaves the figure"
    for (a, ba), (b, bb) in itertools.combinations(texts, 2):
        shrunk = ba.padded(-1), bb.padded(-1)  # touching edges are fine
        assert not shrunk[0].overlaps(shrunk[1]), f"{a!r} overlaps {b!r}"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["batch_fig", "pareto_fig"])
def test_legends_and_labels_stay_off_the_data(built, name):
    fig = built[name]
    r = fig.canvas.get_renderer()
    boxes = [lg.get_window_extent(r) for lg in fig.legends]
    for ax in fig.axes:
        if ax.get_legend() is not None:
            boxes.append(ax.get_legend().get_window_extent(r))
        boxes += [t.get_window_extent(r) for t in ax.texts if t.get_text().strip()]
    for ax in fig.axes:
        pts = _data_points(ax)
        for box in boxes:
            inside = (
                (pts[:, 0] > box.x0)
                & (pts[:, 0] < box.x1)
                & (pts[:, 1] > box.y0)
                & (pts[:, 1] < box.y1)
            )
            assert not inside.any(), (
                f"a legend or label of {name} covers data of {ax.get_title()!r}"
            )


@pytest.mark.slow
def test_figures_are_saved(built):
    for png in ("batch.png", "pareto.png"):
        data = (built["out"] / png).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000


@given(
    vmin=st.floats(1e-6, 1e6),
    ratio=st.floats(2.0, 1e12),
)
def test_log_ticks_label_any_range_of_a_factor_two(vmin, ratio):
    vmax = vmin * ratio
    ticks = log_ticks(vmin, vmax)
    assert 3 <= len(ticks) <= 11
    assert ticks == sorted(set(ticks))
    assert all(vmin <= t <= vmax for t in ticks)


@pytest.mark.slow
def test_batch_curve_refuses_an_optimum_outside_the_sweep(built):
    ev = built["evaluation"]
    with pytest.raises(ValueError, match="not one of the swept batches"):
        batch_curve(built["batches"], ev.report, optimum=built["batches"][3] + 0.5)


@pytest.mark.slow
def test_batch_curve_without_an_optimum_marks_the_cheapest_within_the_limits(built):
    b, ev = built["batches"], built["evaluation"]
    limit = float(built["problem"].limit_values()["memory"])
    fig = batch_curve(b, ev.report, capacity=limit)
    FigureCanvasAgg(fig)
    star = [s for s in _star(fig) if s.axes.get_title() == "Cost per token"][0]
    fits = np.asarray(ev.report.memory_per_chip) <= limit
    cost = np.asarray(ev.report.cost_per_token) * 1e6
    assert star.get_ydata()[0] == pytest.approx(cost[fits].min())
    assert star.get_xdata()[0] == b[fits][np.argmin(cost[fits])]
