"""The MoE all-to-all term against DeepEP's published kernel timings.

Claim (dcost's all-to-all, ``dcost.serving.moe.all_to_all_time``): one direction of an
expert-parallel all-to-all takes the slower of its two links, each a latency per round plus the
bytes that cross it over the link's achieved bandwidth; a copy for a rank in the sender's
scale-up domain crosses the scale-up link, any other the scale-out link.

Setting: DeepEP's low-latency dispatch (FP8) and combine (BF16) on H800s with one 400 Gb/s NIC
each, 128 tokens per rank, 7,168 values per token, 8 copies per token, 8 to 256 ranks (12
timings, ``dcost/validation/collectives.toml``, with their source). Three predictions of each:
pure physics (peak links, no latency: a bound), the shipped Hopper profile (fitted to serving
steps, which never saw these kernels), and the term with four link fields of its own fitted to
the other ranks' timings (each rank count left out in turn: held out).

Run: ``python experiments/deepep_all_to_all.py``.
"""

from __future__ import annotations

import _common as C
import numpy as np

from dcost.validation import collectives


def compute():
    """Measured and predicted times per kernel (s), the link fields fitted to all twelve, and
    the held-out predictions of the same fit with each rank count left out."""
    ms = collectives.load()
    measured = np.array([m["value"] for m in ms])
    ranks = np.array([m["ranks"] for m in ms])
    held = np.zeros_like(measured)
    for g in np.unique(ranks):
        seen = [m for m in ms if m["ranks"] != g]
        out = [m for m in ms if m["ranks"] == g]
        links = collectives.fit_links(seen)
        held[ranks == g] = collectives.predict(out, links=links)
    fitted = collectives.fit_links(ms)
    profile = C.dcost.hardware(ms[0]["hardware"], calibrated=True)
    return {
        "ids": [m["id"] for m in ms],
        "op": [m["op"] for m in ms],
        "ranks": ranks,
        "measured": measured,
        "pure": collectives.predict(ms),
        "calibrated": collectives.predict(ms, calibrated=True),
        "held_out": held,
        "links": fitted,
        "profile_links": {f: float(getattr(profile, f)) for f in collectives.LINK_FIELDS},
    }


def log_rms(pred, measured):
    """Root mean square of ``log(pred/measured)``."""
    return float(np.sqrt(np.mean(np.log(pred / measured) ** 2)))


LINES = (
    ("held_out", "moe", "-", "o", "dcost, own link fields, this EP held out"),
    ("calibrated", "orange", "--", "s", "dcost, shipped Hopper profile"),
    ("pure", "grey", ":", "^", "dcost, pure physics (bound)"),
)
"""The predictions drawn: (result key, colour, line style, marker, legend label)."""


def plot(res):
    fig, axes = C.figure(2, width=6.3, height=4.6)
    ops = np.array(res["op"])
    for ax, op in zip(axes, ("dispatch", "combine"), strict=True):
        sel = ops == op
        g = res["ranks"][sel]
        us = {k: res[k][sel] * 1e6 for k in ("measured", "pure", "calibrated", "held_out")}
        ax.scatter(g, us["measured"], color="black", zorder=4, s=30, label="DeepEP, measured")
        for key, color, ls, marker, label in LINES:
            ax.plot(g, us[key], color=C.COLORS[color], ls=ls, marker=marker, ms=4, label=label)
        ax.annotate(
            "EP 8: one node,\nNVLink only",
            (8, us["pure"][0]),
            xytext=(6, -22),
            textcoords="offset points",
            fontsize=8,
            color=C.COLORS["grey"],
        )
        what = "FP8, 7,392 B a copy" if op == "dispatch" else "BF16, 14,336 B a copy"
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="expert-parallel ranks (H800, 8 a node, a 400 Gb/s NIC each)",
            ylabel=f"{op} time (us)",
            title=f"{op} ({what}; 128 tokens x 8 copies a rank)",
        )
        ax.set_xticks(g, [f"{int(x)}" for x in g])
        ax.set_ylim(10, 2000)
        ax.legend(fontsize=7.5, loc="lower right")
    return fig


def main():
    res = compute()
    print(f"{'kernel':<26}{'measured us':>12}{'pure':>8}{'profile':>9}{'held out':>10}")
    for i, rid in enumerate(res["ids"]):
        print(
            f"{rid:<26}{res['measured'][i] * 1e6:>12.0f}{res['pure'][i] / res['measured'][i]:>8.2f}"
            f"{res['calibrated'][i] / res['measured'][i]:>9.2f}"
            f"{res['held_out'][i] / res['measured'][i]:>10.2f}"
        )
    print("(pure, profile, held out: predicted over measured time)")
    y = res["measured"]
    for name in ("pure", "calibrated", "held_out"):
        r = res[name] / y
        print(
            f"{name:<11} predicted/measured {r.min():.2f}-{r.max():.2f}, "
            f"rms log error {log_rms(res[name], y):.3f}"
        )
    fields = (("fitted to the 12 timings", res["links"]), ("shipped", res["profile_links"]))
    for name, links in fields:
        print(f"link fields, {name}:", ", ".join(f"{k} {v:.3g}" for k, v in links.items()))
    C.save("deepep_all_to_all", plot(res), res)


if __name__ == "__main__":
    main()
