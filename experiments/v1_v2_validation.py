"""Serving model v1 against v2 on the published measurements: what the new terms changed.

Question (issue 9): held against real deployments, how far off was the v1 roofline, and how far off
is v2, in pure physics and calibrated (held out)?

For every shipped record (``dcost.validation.load()``) the same replica (``dcost.validation.case``:
chip, model, layout, batch, lengths) is predicted three ways:

- **v1**: the model of DESIGN.md section 2, i.e. ``dcost.decode``/``prefill`` with every v2 field
  off (the v1 fields of the specs only: no overheads, no attention layout, a token's expert copies
  all sent, MLA prefill charged its absorbed decode form, no speculative decoding, no mixed steps:
  an aggregated record is priced as decode alone, a first token as one prompt's prefill);
- **v2, pure physics**: ``predict(record, calibrated=False)``, a bound on every record;
- **v2, calibrated, held out**: the family profile fitted without the record's source
  (``dcost.calibrate.families.cross_validate``).

Errors are the project's ``|predicted/measured - 1|`` (as ``dcost validate`` reports them); the
figure and the ranges show the ratio of times (a throughput ratio inverted, so that below 1 always
means "the model is optimistic"), and a time ratio above 1 is a bound broken (predicted slower than
measured).

Run: ``python experiments/v1_v2_validation.py``.
"""

from __future__ import annotations

import _common as C
import numpy as np

from dcost.calibrate import families
from dcost.serving.roofline import decode, prefill
from dcost.specs import Design, Hardware, Model, Workload
from dcost.validation import load
from dcost.validation.cases import TIME_METRICS, case

V1_HARDWARE = (
    "flops",
    "hbm_bandwidth",
    "hbm_capacity",
    "scaleup_bandwidth",
    "scaleout_bandwidth",
    "scaleup_size",
    "price_per_hour",
)
V1_MODEL = (
    "n_layers",
    "d_model",
    "params_dense",
    "params_per_expert",
    "n_experts",
    "experts_active",
    "kv_bytes_per_token",
    "bytes_per_param",
    "attn_flops_per_context_token",
    "act_bytes",
    "n_moe_layers",
)


def v1_predict(record: dict) -> float:
    """The record's metric under serving model v1 (SI units)."""
    c = case(record)
    h = Hardware(**{n: getattr(c.hardware, n) for n in V1_HARDWARE})
    m = Model(**{n: getattr(c.model, n) for n in V1_MODEL})
    w = Workload(c.workload.context, prompt=c.workload.prompt, output=c.workload.output)
    d = Design(c.design.batch, chips=c.design.chips, stages=c.design.stages)
    if c.step == "first_token":
        return float(prefill(Design(1.0, chips=d.chips, stages=d.stages), h, m, w).ttft)
    if c.step == "prefill":
        p = prefill(d, h, m, w)
        return float(p.ttft if c.metric == "ttft" else p.tokens_per_s / c.chips)
    r = decode(d, h, m, w)  # v1 has no mixed step: an aggregated pool decodes alone
    if c.metric in ("tpot", "step_time"):
        return float(r.tpot)
    per_gpu = float(r.tokens_per_s) / c.chips
    if c.metric == "input_throughput_per_gpu":
        return per_gpu * c.input_per_output
    if c.metric == "total_throughput_per_gpu":
        return per_gpu * (1.0 + c.input_per_output)
    return per_gpu


def _time_ratio(predicted, measured, metric):
    """``predicted/measured`` as a time ratio (< 1: optimistic), whatever the metric."""
    r = np.asarray(predicted) / np.asarray(measured)
    return np.where(np.isin(metric, TIME_METRICS), r, 1.0 / r)


def compute() -> dict:
    records = load()
    cv = families.cross_validate(records)
    measured = np.array([float(r["value"]) for r in records])
    metric = np.array([r["metric"] for r in records])
    v1 = np.array([v1_predict(r) for r in records])
    fitted = np.array([families.fitted(r) for r in records])
    ratios = {
        "v1": _time_ratio(v1, measured, metric),
        "v2_pure": _time_ratio(cv.pure, measured, metric),
        "v2_held_out": _time_ratio(cv.held_out, measured, metric),
    }
    errors = {
        name: np.abs(np.asarray(p) / measured - 1.0)
        for name, p in (("v1", v1), ("v2_pure", cv.pure), ("v2_held_out", cv.held_out))
    }
    summary = {
        name: {
            "median_error": float(np.median(errors[name][fitted])),
            "p90_error": float(np.quantile(errors[name][fitted], 0.9)),
            "median_time_ratio": float(np.median(r[fitted])),
            "time_ratio_range": [float(np.min(r[fitted])), float(np.max(r[fitted]))],
            "bound_broken": int(np.sum(r > 1.0 + 1e-5)) if name != "v2_held_out" else None,
        }
        for name, r in ratios.items()
    }
    rows = [
        {
            "id": r["id"],
            "family": r["family"],
            "source_id": r["source_id"],
            "metric": r["metric"],
            "measured": measured[i],
            "v1": v1[i],
            "v2_pure": float(cv.pure[i]),
            "v2_held_out": float(cv.held_out[i]),
            "queueing": families.queueing(r),
            "fitted": bool(fitted[i]),
            **{f"ratio_{k}": float(v[i]) for k, v in ratios.items()},
        }
        for i, r in enumerate(records)
    ]
    return {"records": rows, "summary": summary, "n_fitted": int(fitted.sum())}


def plot(results: dict):
    rows = [r for r in results["records"] if r["fitted"]]
    fams = sorted({r["family"] for r in rows})
    fig, ax = C.plt.subplots(figsize=(9.5, 5.2))
    width = 0.27
    for k, (name, label, color) in enumerate(
        (
            ("v1", "v1 roofline", C.COLORS["grey"]),
            ("v2_pure", "v2, pure physics", C.COLORS["dense"]),
            ("v2_held_out", "v2, calibrated (held out)", C.COLORS["moe"]),
        )
    ):
        for j, fam in enumerate(fams):
            r = np.array([x[f"ratio_{name}"] for x in rows if x["family"] == fam])
            x = j + (k - 1) * width
            parts = ax.boxplot(
                r,
                positions=[x],
                widths=width * 0.85,
                patch_artist=True,
                showfliers=True,
                flierprops={"markersize": 3},
            )
            for box in parts["boxes"]:
                box.set_facecolor(color)
                box.set_alpha(0.75)
        ax.plot([], [], "s", color=color, label=label)
    ax.axhline(1.0, color="black", lw=1)
    ax.set_yscale("log")
    ax.set_xticks(range(len(fams)), fams)
    ax.set_xlabel("hardware family")
    ax.set_ylabel("predicted / measured time (< 1: optimistic)")
    s = results["summary"]
    ax.set_title(
        f"{results['n_fitted']} published measurements; median predicted/measured time: v1 "
        f"{s['v1']['median_time_ratio']:.2f}, v2 pure {s['v2_pure']['median_time_ratio']:.2f}, "
        f"v2 calibrated held out {s['v2_held_out']['median_time_ratio']:.2f}",
        fontsize=10,
    )
    ax.legend(loc="lower right", fontsize=9)
    ax.grid(axis="y", alpha=0.3, which="both")
    fig.tight_layout()
    return fig


def main() -> None:
    results = compute()
    C.save("v1_v2_validation", plot(results), results)
    s = results["summary"]
    for name in ("v1", "v2_pure", "v2_held_out"):
        x = s[name]
        print(
            f"{name:<12} median |error| {100 * x['median_error']:5.1f} %, p90 "
            f"{100 * x['p90_error']:5.1f} %, predicted/measured time median "
            f"{x['median_time_ratio']:.2f} in {x['time_ratio_range'][0]:.2f}.."
            f"{x['time_ratio_range'][1]:.2f}, "
            f"bound broken on {x['bound_broken']} records"
        )


if __name__ == "__main__":
    main()
