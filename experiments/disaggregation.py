"""When does disaggregated serving pay? The cheapest fleet both ways, across prompt/output mixes
and loads.

Claim (DistServe, OSDI 2024; Splitwise, ISCA 2024): separating prefill from decode pays when
prompts are long against outputs and a tight TPOT target makes prefill interference costly;
short prompts with long outputs gain nothing from a second pool.

Setting: llama-3-70b on calibrated H100s (``dcost.hardware("h100-sxm", calibrated=True)``),
TTFT <= 2 s at p99 and a tight TPOT target, 25 ms at p90 (where prefill chunks cost decode
steps most); lognormal lengths with cv 1; prompt/output ratios from 1/16 to 64 (output 256
tokens for ratios >= 1, prompt 256 for ratios < 1) at 2 to 512 requests/s. Both modes keep the
same headroom on their prefill queues (utilisation <= 0.7, ``max_utilisation``; the planner's
defaults differ, 0.85 aggregated and 0.6 for a prefill pool, where each closed form matches the
simulation). Every cell is one scenario of one batched ``dcost.plan(mode="best")`` call, which
plans both modes.

Run: ``python experiments/disaggregation.py``.
"""

from __future__ import annotations

import _common as C
import numpy as np

import dcost

RATIOS = (1 / 16, 1 / 4, 1.0, 4.0, 16.0, 64.0)
TPOT = 0.025  # s, at p90
UTILISATION = 0.7
RATES = (2.0, 8.0, 32.0, 128.0, 512.0)
BASE = 256.0  # tokens: the shorter side of every mix


def lengths(ratio: float) -> tuple[float, float]:
    """``(prompt, output)`` mean tokens of a prompt/output ratio."""
    return (BASE * ratio, BASE) if ratio >= 1 else (BASE, BASE / ratio)


def compute(ratios=RATIOS, rates=RATES) -> dict:
    """$/hour of the cheapest aggregated and disaggregated fleets for every (ratio, rate)."""
    h = dcost.hardware("h100-sxm", calibrated=True)
    m = dcost.model("llama-3-70b")
    grid = [(r, q) for r in ratios for q in rates]
    prompt = np.array([lengths(r)[0] for r, _ in grid])
    output = np.array([lengths(r)[1] for r, _ in grid])
    n = len(grid)
    traffic = dcost.Traffic(
        np.array([q for _, q in grid]),
        prompt,
        output,
        prompt_cv=np.ones(n),
        output_cv=np.ones(n),
    )
    plans = dcost.plan(h, m, traffic, tpot_slo=(TPOT, 0.9), max_utilisation=UTILISATION)
    agg, dis, modes, chips, binding = [], [], [], [], []
    for p in plans:
        by_mode = {p.mode: p, p.alternative.mode: p.alternative}
        agg.append(by_mode["aggregated"].cost_per_hour)
        dis.append(by_mode["disaggregated"].cost_per_hour)
        modes.append(p.mode)
        chips.append(p.chips)
        binding.append(by_mode["aggregated"].binding)
    shape = (len(ratios), len(rates))
    agg_a, dis_a = np.reshape(agg, shape), np.reshape(dis, shape)
    return {
        "ratios": list(ratios),
        "rates": list(rates),
        "aggregated_per_hour": agg_a,
        "disaggregated_per_hour": dis_a,
        "disaggregated_over_aggregated": dis_a / agg_a,
        "mode": np.reshape(modes, shape).tolist(),
        "chips": np.reshape(chips, shape),
        "aggregated_binding": np.reshape(binding, shape).tolist(),
        "tpot_slo": TPOT,
        "max_utilisation": UTILISATION,
        "pays": int(np.sum(dis_a < agg_a)),
    }


def plot(res: dict):
    fig, (ax,) = C.figure(ncols=1, width=7.5, height=5.0)
    ax.grid(False)
    ratio = np.log2(np.asarray(res["disaggregated_over_aggregated"], float))
    lim = float(np.nanmax(np.abs(ratio[np.isfinite(ratio)]))) if np.isfinite(ratio).any() else 1.0
    im = ax.imshow(ratio, cmap="RdBu_r", vmin=-lim, vmax=lim, origin="lower", aspect="auto")
    ax.set_xticks(range(len(res["rates"])), [f"{r:g}" for r in res["rates"]])
    labels = [f"1/{1 / r:g}" if r < 1 else f"{r:g}" for r in res["ratios"]]
    ax.set_yticks(range(len(res["ratios"])), labels)
    ax.set_xlabel("arrivals (requests/s)")
    ax.set_ylabel("mean prompt / mean output (tokens/tokens)")
    for i in range(ratio.shape[0]):
        for j in range(ratio.shape[1]):
            v = res["disaggregated_over_aggregated"][i][j]
            txt = "n/a" if not np.isfinite(v) else f"{v:.2f}" + (" *" if v < 1 else "")
            ax.text(j, i, txt, ha="center", va="center", fontsize=8)
    cb = fig.colorbar(im, ax=ax)
    cb.set_label(r"log2(disaggregated \$/h / aggregated \$/h)")
    ax.set_title(
        f"llama-3-70b on calibrated H100, TTFT 2 s @ p99, TPOT {res['tpot_slo'] * 1e3:g} ms "
        f"@ p90, prefill\nutilisation <= {res['max_utilisation']:g}: disaggregated over "
        "aggregated bill (* = disaggregation pays)",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def main() -> None:
    res = compute()
    C.save("disaggregation", plot(res), res)
    print(f"disaggregation pays in {res['pays']} of {len(RATIOS) * len(RATES)} cells")


if __name__ == "__main__":
    main()
