"""The interactivity frontier: output throughput per GPU against tokens per second per user.

Claim (the frontier that published serving benchmarks draw, e.g. SemiAnalysis InferenceMAX):
serving faster per user costs throughput per GPU; at loose targets big batches amortize the
weights, at tight ones the batch shrinks and the fleet grows. Disaggregation moves the curve
where prefill interference would otherwise eat the TPOT budget.

Setting: llama-3-70b on calibrated H100s, chat traffic (the Azure 2023 conversation trace's
lengths, ``dcost.traffic("chat")``) at 200 requests/s, TTFT <= 2 s at p99; the TPOT target at
p90 swept from 15 to 200 ms. Each point is a ``dcost.plan`` (both modes); x is the median
request's tokens per second (1 / TPOT p50), y the fleet's output tokens per second per GPU
(``rate * E[T_out] / chips``).

Run: ``python experiments/interactivity.py``.
"""

from __future__ import annotations

import _common as C
import numpy as np

import dcost

TARGETS = (0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.07, 0.1, 0.14, 0.2)  # s, TPOT at p90
RATE = 200.0


def compute(targets=TARGETS, rate=RATE) -> dict:
    h = dcost.hardware("h100-sxm", calibrated=True)
    m = dcost.model("llama-3-70b")
    traffic = dcost.traffic("chat", rate=rate)
    out_tokens = rate * float(traffic.output_tokens)
    rows = {"aggregated": [], "disaggregated": []}
    for slo in targets:
        p = dcost.plan(h, m, traffic, tpot_slo=(slo, 0.9))
        for q in (p, p.alternative):
            if q.feasible:
                tpot_binds = "tpot" in (q.binding or "")
                row = (slo, 1.0 / q.tpot[0.5], out_tokens / q.chips, q.chips, q.cost_per_hour)
            else:
                tpot_binds, row = False, (slo, np.nan, np.nan, np.nan, np.nan)
            rows[q.mode].append((row, tpot_binds, q.binding))
    res = {"targets": list(targets), "rate": rate}
    for mode, r in rows.items():
        a = np.array([x[0] for x in r], float)
        res[mode] = {
            "tokens_per_s_per_user": a[:, 1],
            "tokens_per_s_per_gpu": a[:, 2],
            "chips": a[:, 3],
            "cost_per_hour": a[:, 4],
            "tpot_binds": [x[1] for x in r],
            "binding": [x[2] for x in r],
        }
    return res


def plot(res: dict):
    fig, (ax,) = C.figure(ncols=1, width=7.0, height=4.8)
    style = {"aggregated": (C.COLORS["dense"], "o"), "disaggregated": (C.COLORS["moe"], "s")}
    for mode, (color, marker) in style.items():
        r = res[mode]
        x, y = np.asarray(r["tokens_per_s_per_user"]), np.asarray(r["tokens_per_s_per_gpu"])
        ax.plot(x, y, "-", color=color, lw=1.2, label=mode)
        binds = np.asarray(r["tpot_binds"], bool)
        ax.plot(x[binds], y[binds], marker, color=color, ms=7)
        ax.plot(x[~binds], y[~binds], marker, color=color, ms=7, mfc="white")
    # one label per distinct point (several loose targets give the same fleet)
    agg = res["aggregated"]
    labels: dict = {}
    for x, y, t in zip(
        agg["tokens_per_s_per_user"], agg["tokens_per_s_per_gpu"], res["targets"], strict=True
    ):
        if np.isfinite(x):
            labels.setdefault((round(float(x), 3), round(float(y), 3)), []).append(t * 1e3)
    for (x, y), ts in labels.items():
        text = f"{min(ts):g}" + (f"-{max(ts):g}" if len(ts) > 1 else "") + " ms"
        ax.annotate(
            text,
            (x, y),
            textcoords="offset points",
            xytext=(5, 4),
            fontsize=7.5,
            color=C.COLORS["grey"],
        )
    ax.plot([], [], "o", color="k", label="TPOT target binds")
    ax.plot([], [], "o", color="k", mfc="white", label="another limit binds")
    infeasible = [
        t
        for t, x in zip(res["targets"], agg["tokens_per_s_per_user"], strict=True)
        if not np.isfinite(x)
    ]
    ax.set_xlabel("tokens per second per user (1 / median TPOT)")
    ax.set_ylabel("output tokens per second per GPU")
    note = f"; infeasible below {max(infeasible) * 1e3:g} ms" if infeasible else ""
    ax.set_title(
        f"llama-3-70b on calibrated H100, chat at {res['rate']:g} requests/s: the cheapest\n"
        f"fleet per TPOT target at p90 (labels: the target{note})",
        fontsize=10,
    )
    ax.legend(fontsize=8)
    ax.margins(x=0.08, y=0.06)
    fig.tight_layout()
    return fig


def main() -> None:
    res = compute()
    C.save("interactivity", plot(res), res)


if __name__ == "__main__":
    main()
