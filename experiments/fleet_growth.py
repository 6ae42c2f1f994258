"""The fleet and the bill as traffic grows from 1 to 10,000 requests/s.

Claim: the bill grows in whole replicas; per token it falls while a replica is underused (one
replica must exist whatever the load) and then flattens where every replica is full, the
binding limit switching from "one replica" to the prefill queue's headroom or the TPOT target.

Setting: llama-3-70b on calibrated H100s, chat traffic (``dcost.traffic("chat")``), TTFT <= 2 s
at p99, TPOT <= 50 ms at p90, both modes compared; 36 rates log-spaced from 1 to 10,000
requests/s, planned in one batched ``dcost.plan`` call.

Run: ``python experiments/fleet_growth.py``.
"""

from __future__ import annotations

import _common as C
import numpy as np

import dcost

RATES = np.geomspace(1.0, 1e4, 36)


def compute(rates=RATES) -> dict:
    h = dcost.hardware("h100-sxm", calibrated=True)
    m = dcost.model("llama-3-70b")
    chat = dcost.traffic("chat")
    n = len(rates)
    fields = ("prompt_tokens", "output_tokens", "prompt_cv", "output_cv", "prefix_hit")
    traffic = dcost.Traffic(
        np.asarray(rates, float), **{f: np.full(n, float(getattr(chat, f))) for f in fields}
    )
    plans = dcost.plan(h, m, traffic)
    return {
        "rates": np.asarray(rates, float),
        "chips": plans.chips,
        "cost_per_hour": plans.cost_per_hour,
        "cost_per_million_input": plans.cost_per_million_input,
        "cost_per_million_output": plans.cost_per_million_output,
        "mode": [str(x) for x in plans.mode],
        "binding": [p.binding for p in plans],
        "pools": [[x.describe() for x in p.pools] for p in plans],
    }


def plot(res: dict):
    fig, (a, b) = C.figure(ncols=2, width=6.0, height=4.6)
    rates = np.asarray(res["rates"])
    modes = np.asarray(res["mode"])
    chips = np.asarray(res["chips"])
    binding = np.asarray([str(x).split(" (")[0] for x in res["binding"]])
    a.loglog(rates, chips, "-", color=C.COLORS["grey"], lw=0.8)
    colors = [C.COLORS[c] for c in ("grey", "dense", "moe", "alt", "orange", "extra")]
    for i, name in enumerate(dict.fromkeys(binding)):
        for mode, marker in (("aggregated", "o"), ("disaggregated", "s")):
            sel = (binding == name) & (modes == mode)
            if sel.any():
                a.loglog(
                    rates[sel],
                    chips[sel],
                    marker,
                    color=colors[i % len(colors)],
                    label=f"{mode}, binding: {name}",
                )
    a.set_xlabel("arrivals (requests/s)")
    a.set_ylabel("H100 GPUs in the fleet")
    a.set_title("fleet size (marker: the cheaper mode; colour: the binding limit)")
    a.legend()
    b.loglog(
        rates,
        res["cost_per_million_output"],
        "-o",
        ms=3,
        color=C.COLORS["moe"],
        label="$ per million output tokens",
    )
    b.loglog(
        rates,
        res["cost_per_million_input"],
        "-s",
        ms=3,
        color=C.COLORS["dense"],
        label="$ per million input tokens",
    )
    b.set_xlabel("arrivals (requests/s)")
    b.set_ylabel("$ per million tokens")
    b.set_title("the bill per token")
    b.legend()
    fig.suptitle(
        "llama-3-70b on calibrated H100, chat traffic, TTFT 2 s @ p99, TPOT 50 ms @ p90",
        fontsize=11,
    )
    fig.tight_layout()
    return fig


def main() -> None:
    res = compute()
    C.save("fleet_growth", plot(res), res)
    last = -1
    print(
        f"at {res['rates'][last]:,.0f} requests/s: {res['chips'][last]:,.0f} GPUs, "
        f"${res['cost_per_hour'][last]:,.0f}/h, {res['pools'][last]}"
    )


if __name__ == "__main__":
    main()
