"""``dcost.explore()``: the explorer page's controls and answers in a notebook (ipywidgets).

The same questions as ``dcost serve`` (``dcost.web.queries``): pick hardware, model and engine,
move context, output, batch, chips, the TPOT target and the traffic rate, and see time and cost
per output token against the batch with the roofline's terms, the optimum with its binding
limit, the elasticities of the optimal cost as bars, and the cheapest fleet for the traffic.
Sliders answer when released (``continuous_update=False``). Needs the ``explore`` extra
(``pip install "dcost[explore]"``: ipywidgets).
"""

from __future__ import annotations

import html
import math
from typing import Any

from dcost.web import queries

__all__ = ["explore", "figure", "summary_html", "fleet_html"]

_MS = 1e3
_PER_M = 1e6
_TERM_LABELS = {
    "t_compute": "compute",
    "t_weights": "weights",
    "t_kv": "KV",
    "t_comm": "comm",
    "t_overhead": "overhead",
}


def _fmt(x, digits: int = 4) -> str:
    if x is None or not math.isfinite(x):
        return "–"
    return f"{x:.{digits}g}"


def _positive(values, scale: float = 1.0) -> list[float]:
    """Values times ``scale``, non-positive ones as NaN (a log axis has no place for them)."""
    return [v * scale if v is not None and v > 0 else math.nan for v in values]


def figure(curve: dict, optimum: dict, elasticities: dict):
    """Three panels: time per output token with the roofline's terms (ms), cost per output token
    ($ per million), both against the batch (log-log), with the optimum, the largest batch HBM
    holds, the TPOT target and the design on show marked; and the elasticities as bars.

    Args:
      curve, optimum, elasticities: the answers of ``dcost.web.queries`` (SI units).

    Returns:
      A matplotlib ``Figure``.

    >>> from dcost.web import queries
    >>> q = queries.parse({"model": "llama-3-8b", "chips": "1"})
    >>> c = queries.curve(q)
    >>> fig = figure(c, {"feasible": False}, {"feasible": False, "bars": [], "message": "-"})
    >>> [ax.get_ylabel() for ax in fig.axes]
    ['time per output token (ms)', '$ per million output tokens', '']
    """
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 3.8), layout="constrained")
    t_ax, c_ax, e_ax = fig.subplots(1, 3, width_ratios=[1, 1, 1.1])
    b = curve["batch"]
    t_ax.plot(b, _positive(curve["tpot"], _MS), color="k", lw=2.2, label="TPOT")
    for name, label in _TERM_LABELS.items():
        t_ax.plot(b, _positive(curve[name], _MS), lw=1.2, label=label)
    t_ax.axhline(curve["tpot_slo"] * _MS, color="0.4", ls=":", lw=1.2, label="TPOT target")
    c_ax.plot(b, _positive(curve["cost_per_token"], _PER_M), color="tab:green", lw=2.2)
    point = curve["point"]
    t_ax.plot([point["batch"]], _positive([point["tpot"]], _MS), "ko", ms=6)
    c_ax.plot([point["batch"]], _positive([point["cost_per_token"]], _PER_M), "ko", ms=6)
    for ax in (t_ax, c_ax):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("batch B (sequences)")
        ax.grid(True, which="major", alpha=0.3)
        if curve["largest_batch_in_memory"] is not None:
            ax.axvline(curve["largest_batch_in_memory"], color="tab:orange", ls="--", lw=1.2)
        if optimum.get("feasible"):
            ax.axvline(optimum["batch"], color="tab:green", lw=1.2)
    t_ax.set_ylabel("time per output token (ms)")
    c_ax.set_ylabel("$ per million output tokens")
    t_ax.legend(fontsize=7, ncol=2, loc="upper left")
    handles = [
        c_ax.lines[-1] if optimum.get("feasible") else None,
        c_ax.lines[-2] if curve["largest_batch_in_memory"] is not None else None,
    ]
    labels = [
        f"optimum B*={optimum['batch']:.0f}" if optimum.get("feasible") else None,
        "HBM full",
    ]
    shown = [(h, lab) for h, lab in zip(handles, labels, strict=True) if h is not None]
    if shown:
        c_ax.legend(*zip(*shown, strict=True), fontsize=8, loc="upper right")
    t_ax.set_title("time per output token and the roofline's terms", fontsize=10)
    c_ax.set_title("cost per output token", fontsize=10)
    bars = elasticities.get("bars", [])
    if elasticities.get("feasible") and bars:
        names = [x["name"] for x in bars][::-1]
        values = [x["elasticity"] for x in bars][::-1]
        e_ax.barh(names, values, color=["tab:red" if v > 0 else "tab:blue" for v in values])
        e_ax.axvline(0, color="0.3", lw=0.8)
        e_ax.tick_params(axis="y", labelsize=7)
        e_ax.set_xlabel("d log(cost*) / d log(input) (dimensionless)")
    else:
        e_ax.text(0.5, 0.5, elasticities.get("message", ""), ha="center", wrap=True, fontsize=8)
        e_ax.set_axis_off()
    e_ax.set_title("elasticities of the optimal cost", fontsize=10)
    return fig


def summary_html(curve: dict, optimum: dict) -> str:
    """The design on show and the optimum, as HTML ($ per million output tokens, ms)."""
    p = curve["point"]
    left = (
        f"<b>design on show</b>: B = {p['batch']:.0f}: TPOT {_fmt(p['tpot'] * _MS)} ms, "
        f"{_fmt(p['cost_per_token'] * _PER_M)} $ / M output tokens, bound by {p['bottleneck']}"
    )
    if optimum.get("feasible"):
        binding = ", ".join(optimum["binding"]) or "none"
        right = (
            f"<b>optimum</b>: B* = {optimum['batch']:.0f}: TPOT {_fmt(optimum['tpot'] * _MS)} ms,"
            f" {_fmt(optimum['cost_per_token'] * _PER_M)} $ / M output tokens, "
            f"binding: {html.escape(binding)}"
        )
    else:
        right = f"<b>optimum</b>: none ({html.escape(optimum.get('message', ''))})"
    return f"<div>{left}</div><div>{right}</div>"


def fleet_html(fleet: dict) -> str:
    """The cheapest fleet and the other mode's, as an HTML table."""
    head = (
        "<tr><th>mode</th><th>pools</th><th>chips</th><th>$ / hour</th><th>$ / M in</th>"
        "<th>$ / M out</th><th>TTFT p99 (ms)</th><th>TPOT p90 (ms)</th><th>binding</th></tr>"
    )

    def row(p: dict) -> str:
        if not p["feasible"]:
            cells = [p["mode"], "infeasible", "", "", "", "", "", "", p["binding"] or ""]
        else:
            cells = [
                p["mode"],
                "; ".join(x["describe"] for x in p["pools"]),
                f"{p['chips']:.0f}",
                _fmt(p["cost_per_hour"]),
                _fmt(p["cost_per_million_input"], 3),
                _fmt(p["cost_per_million_output"], 3),
                _fmt((p["ttft"].get("0.99") or math.nan) * _MS, 3),
                _fmt((p["tpot"].get("0.9") or math.nan) * _MS, 3),
                p["binding"] or "",
            ]
        return "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in cells) + "</tr>"

    rows = row(fleet) + (row(fleet["alternative"]) if fleet.get("alternative") else "")
    note = "" if fleet["feasible"] else f"<div>{html.escape(fleet['message'])}</div>"
    return f"<b>cheapest fleet for the traffic</b><table>{head}{rows}</table>{note}"


def explore(**values: Any):
    """The explorer's controls and answers as an ipywidgets box, for a notebook.

    Args:
      **values: starting values of the controls, by the query's field names
        (``dcost.web.queries.DEFAULTS``): ``hardware``, ``model``, ``engine`` (names),
        ``context`` and ``output`` (tokens), ``batch`` (sequences), ``chips`` (per stage),
        ``tpot_slo`` (s), ``rate`` (requests/s).

    Returns:
      An ``ipywidgets.VBox``; display it (the last line of a cell). Its ``answers`` attribute
      holds the last answers (``curve``, ``optimum``, ``elasticities``, ``fleet``; SI units) and
      ``controls`` the widgets by field name. A bad value shows the API's message in the box.

    Raises:
      dcost.web.queries.QueryError: a bad starting value (naming the field).

    Example (in a notebook)::

        import dcost
        dcost.explore(model="llama-3.1-8b", chips=1)
    """
    import ipywidgets as w
    from IPython.display import display

    start = {**queries.DEFAULTS, **values}
    queries.parse(start)  # a bad starting value raises, naming its field
    choices = queries.choices()
    layout = {"description_width": "150px"}
    wide = w.Layout(width="420px")

    def log_slider(field, base, lo, hi, step, label, fmt):
        return w.FloatLogSlider(
            value=float(start[field]),
            base=base,
            min=lo,
            max=hi,
            step=step,
            description=label,
            readout_format=fmt,
            continuous_update=False,
            style=layout,
            layout=wide,
        )

    engines = [
        (e["label"], e["id"])
        for e in choices["engines"]
        if e["hardware"] is None or start["hardware"] in e["hardware"]
    ]
    controls = {
        "hardware": w.Dropdown(
            options=choices["hardware"], value=start["hardware"], description="hardware"
        ),
        "model": w.Dropdown(
            options=choices["models"], value=str(start["model"]), description="model"
        ),
        "engine": w.Dropdown(options=engines, value=str(start["engine"]), description="engine"),
        "context": log_slider("context", 2, 6, 17, 0.25, "context (tokens)", ".0f"),
        "output": log_slider("output", 2, 0, 14, 0.25, "output (tokens)", ".0f"),
        "batch": log_slider("batch", 2, 0, 12, 0.125, "batch B (sequences)", ".0f"),
        "chips": w.IntSlider(
            value=int(start["chips"]),
            min=1,
            max=72,
            description="chips per stage G",
            continuous_update=False,
            style=layout,
            layout=wide,
        ),
        "tpot_slo": log_slider("tpot_slo", 10, -2.3, -0.3, 0.01, "TPOT target (s)", ".3f"),
        "rate": log_slider("rate", 10, -1, 3, 0.01, "rate (requests/s)", ".3g"),
    }
    summary, fleet_box, error = w.HTML(), w.HTML(), w.HTML()
    plot = w.Output()
    box = w.VBox(
        [
            w.HBox(
                [
                    w.VBox([controls[k] for k in ("hardware", "model", "engine")]),
                    w.VBox([controls[k] for k in ("context", "output", "batch")]),
                    w.VBox([controls[k] for k in ("chips", "tpot_slo", "rate")]),
                ]
            ),
            error,
            summary,
            plot,
            fleet_box,
        ]
    )
    box.controls = controls
    box.answers = {}

    def params() -> dict:
        out = {k: controls[k].value for k in ("hardware", "model", "engine")}
        for k in ("context", "output", "batch"):
            out[k] = round(controls[k].value)
        out["chips"] = controls["chips"].value
        out["tpot_slo"] = float(f"{controls['tpot_slo'].value:.3g}")
        out["rate"] = float(f"{controls['rate'].value:.3g}")
        return out

    def update(_change=None) -> None:
        try:
            q = queries.parse_cached(params())
        except queries.QueryError as err:
            error.value = f"<b style='color:#b00020'>{err.field}: {html.escape(str(err))}</b>"
            return
        error.value = ""
        answers = {name: queries.answer(name, q) for name in queries.ANSWERS}
        box.answers = answers
        summary.value = summary_html(answers["curve"], answers["optimum"])
        fleet_box.value = fleet_html(answers["fleet"])
        fig = figure(answers["curve"], answers["optimum"], answers["elasticities"])
        with plot:
            plot.clear_output(wait=True)
            display(fig)

    def new_hardware(change) -> None:
        ok = [
            (e["label"], e["id"])
            for e in choices["engines"]
            if e["hardware"] is None or change["new"] in e["hardware"]
        ]
        current = controls["engine"].value
        controls["engine"].options = ok
        ids = [i for _, i in ok]
        controls["engine"].value = current if current in ids else ids[0]

    controls["hardware"].observe(new_hardware, names="value")
    for c in controls.values():
        c.observe(update, names="value")
    box.update = update
    update()
    return box
