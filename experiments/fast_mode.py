"""Fast mode: what 2.5x the tokens/s per user costs, against the lecture's "6x the price".

Claim (lecture): a fast mode that serves each user 2.5x faster is sold at about 6x the price.
The physics: a smaller batch gives a shorter step (less KV and compute per step) but amortizes
the weight reads over fewer tokens.

Setting: deepseek-v3 (fp8 weights on fp8 FLOP/s) on gb200-nvl72, mean context 8192, one stage.
Cost-optimal design: the cheapest token with ``tpot <= 50 ms`` and ``memory_per_chip <= 0.9 M``.
Fast design: the cheapest token with ``tpot <= tpot_opt / 2.5``. Two searches, each one vmapped
call of the exact ``dcost.decode`` over a grid: (1) batch only, on a full rack (G = 72, every
whole batch); (2) batch and chips per replica G = 1..72 together. Context 2048 is shown for
contrast.

Run: ``python experiments/fast_mode.py``.
"""

from __future__ import annotations

import _common as C
import jax
import numpy as np

import dcost

HARDWARE, MODEL = "gb200-nvl72", "deepseek-v3"
CONTEXT, CONTRAST_CONTEXT = 8192.0, 2048.0
RACK = 72.0
TPOT_SLO, MEMORY_RESERVE = 0.050, 0.10  # s, fraction of HBM kept free
SPEEDUP, LECTURE_PRICE = 2.5, 6.0
TIE = 1e-5  # relative cost difference treated as a tie (float32 rounding on a flat plateau)


def evaluate(hardware, model, context, batch, chips):
    """Exact decode over broadcast arrays of batch and chips: (tpot, cost, feasible)."""
    b, g = np.broadcast_arrays(np.asarray(batch, float), np.asarray(chips, float))
    r = C.decode_sweep(b.ravel(), g.ravel(), 1.0, hardware, model, context)
    tpot, cost = np.asarray(r.tpot), np.asarray(r.cost_per_token)
    ok = (tpot <= TPOT_SLO) & (
        np.asarray(r.memory_per_chip) <= (1 - MEMORY_RESERVE) * float(hardware.hbm_capacity)
    )
    return tpot, cost, ok, r


def price_of_speed(tpot, cost, ok, speedups):
    """Cost-optimal point, then the cheapest cost multiple for each speed multiple (vectorized)."""
    best = np.min(np.where(ok, cost, np.inf))
    # Ties (a flat, compute-bound plateau): the fastest design within TIE of the best cost.
    i = int(np.argmin(np.where(ok & (cost <= best * (1 + TIE)), tpot, np.inf)))
    limit = tpot[i] / np.asarray(speedups)[:, None]
    fast = np.where(ok[None, :] & (tpot[None, :] <= limit), cost[None, :], np.inf)
    j = np.argmin(fast, axis=1)
    return i, j, fast[np.arange(len(j)), j] / cost[i]


def binding(report, hardware):
    """Which constraint holds the cost-optimal design where it is (a short phrase)."""
    if float(report.memory_per_chip) >= 0.999 * (1 - MEMORY_RESERVE) * float(hardware.hbm_capacity):
        return "HBM capacity"
    if float(report.tpot) >= 0.999 * TPOT_SLO:
        return "tpot SLO"
    return "none: compute-bound plateau"


def compute(max_batch=40_000, n_log_batches=400):
    m = dcost.model(MODEL)
    h = dcost.presets.serving_hardware(HARDWARE, MODEL)
    speedups = np.exp(np.linspace(0.0, np.log(20.0), 80))
    speedups = np.unique(np.append(speedups, SPEEDUP))
    out = {
        "hardware": HARDWARE,
        "model": MODEL,
        "context": CONTEXT,
        "tpot_slo_s": TPOT_SLO,
        "memory_reserve": MEMORY_RESERVE,
        "speedups": speedups,
        "critical_context": float(dcost.critical_context(h, m)),
    }
    k = int(np.searchsorted(speedups, SPEEDUP))
    # (1) a full rack, every whole batch
    for key, context in (("rack", CONTEXT), ("rack_short", CONTRAST_CONTEXT)):
        batch = np.arange(1.0, max_batch + 1.0)
        tpot, cost, ok, r = evaluate(h, m, context, batch, RACK)
        i, j, mult = price_of_speed(tpot, cost, ok, speedups)
        opt = jax.tree.map(lambda x, i=i: x[i], r)
        out[key] = {
            "context": context,
            "chips": RACK,
            "batch": batch,
            "tpot_s": tpot,
            "cost": cost,
            "feasible": ok,
            "cost_multiple": mult,
            "opt": {
                "batch": batch[i],
                "tpot_s": tpot[i],
                "cost_per_mtok": cost[i] * 1e6,
                "tokens_per_s_per_user": 1 / tpot[i],
                "bottleneck": str(dcost.bottleneck(opt)),
                "memory_per_chip_gb": float(opt.memory_per_chip) / 1e9,
                "binding": binding(opt, h),
            },
            "fast": {
                "batch": batch[j[k]],
                "tpot_s": tpot[j[k]],
                "cost_per_mtok": cost[j[k]] * 1e6,
                "cost_multiple": mult[k],
            },
        }
    for key in ("rack", "rack_short"):
        mult = out[key]["cost_multiple"]
        out[key]["speedup_at_lecture_price"] = float(
            np.interp(np.log(LECTURE_PRICE), np.log(np.maximum.accumulate(mult)), speedups)
        )
    # (2) batch and chips per replica together
    chips = np.arange(1.0, RACK + 1.0)
    batch = np.unique(np.round(np.logspace(0, np.log10(max_batch), n_log_batches)))
    bb, gg = np.meshgrid(batch, chips)
    tpot, cost, ok, _ = evaluate(h, m, CONTEXT, bb, gg)
    i, j, mult = price_of_speed(tpot, cost, ok, speedups)
    bb, gg = bb.ravel(), gg.ravel()
    out["free"] = {
        "tpot_s": tpot,
        "cost": cost,
        "feasible": ok,
        "cost_multiple": mult,
        "opt": {"batch": bb[i], "chips": gg[i], "tpot_s": tpot[i], "cost_per_mtok": cost[i] * 1e6},
        "fast": {
            "batch": bb[j[k]],
            "chips": gg[j[k]],
            "tpot_s": tpot[j[k]],
            "cost_per_mtok": cost[j[k]] * 1e6,
            "cost_multiple": mult[k],
        },
    }
    return out


def plot(res):
    fig, (ax_f, ax_m) = C.figure(2, width=6.3, height=5.0)
    r = res["rack"]
    ok = r["feasible"]
    ax_f.plot(
        1 / r["tpot_s"][ok],
        r["cost"][ok] * 1e6,
        color=C.COLORS["dense"],
        lw=1.8,
        label=f"{res['model']}, {r['chips']:.0f} chips, context {r['context']:,.0f}: batch sweep",
    )
    f = res["free"]
    okf = f["feasible"]
    ax_f.scatter(
        1 / f["tpot_s"][okf],
        f["cost"][okf] * 1e6,
        s=2,
        color=C.COLORS["grey"],
        alpha=0.25,
        label="any batch and chips per replica G = 1..72",
        zorder=1,
    )
    o, q = r["opt"], r["fast"]
    ax_f.scatter(
        [o["tokens_per_s_per_user"]],
        [o["cost_per_mtok"]],
        s=70,
        color="k",
        zorder=4,
        label=f"cost-optimal: B = {o['batch']:,.0f}, tpot "
        f"{o['tpot_s'] * 1e3:.1f} ms ({o['binding']} binds)",
    )
    ax_f.scatter(
        [1 / q["tpot_s"]],
        [q["cost_per_mtok"]],
        s=90,
        marker="*",
        color=C.COLORS["moe"],
        zorder=4,
        label=f"2.5x faster: B = {q['batch']:,.0f}, {q['cost_multiple']:.2f}x the cost",
    )
    ax_f.scatter(
        [o["tokens_per_s_per_user"] * SPEEDUP],
        [o["cost_per_mtok"] * LECTURE_PRICE],
        s=70,
        marker="X",
        color=C.COLORS["orange"],
        zorder=4,
        label="lecture: 2.5x faster at 6x the price",
    )
    ax_f.axvline(1 / res["tpot_slo_s"], color=C.COLORS["grey"], ls=":", lw=1)
    ax_f.text(
        1 / res["tpot_slo_s"] * 1.05,
        0.93,
        "SLO: tpot <= 50 ms",
        transform=ax_f.get_xaxis_transform(),
        fontsize=8.5,
        color=C.COLORS["grey"],
    )
    ax_f.set(
        xscale="log",
        yscale="log",
        xlabel="speed per user (tokens/s = 1 / tpot)",
        ylabel="cost ($ per million output tokens)",
        ylim=(0.1, 20),
        title="Cost against speed per user (feasible designs only)",
    )
    ax_f.legend(loc="lower right", fontsize=7.8)
    s = res["speedups"]
    for key, color, label in (
        ("rack", C.COLORS["dense"], f"G = 72, context {res['context']:,.0f}"),
        ("free", C.COLORS["grey"], f"G = 1..72 free, context {res['context']:,.0f}"),
        ("rack_short", C.COLORS["alt"], f"G = 72, context {res['rack_short']['context']:,.0f}"),
    ):
        mult = res[key]["cost_multiple"]
        ax_m.loglog(s, mult, color=color, lw=1.8, label=label)
        k = int(np.searchsorted(s, SPEEDUP))
        ax_m.scatter([SPEEDUP], [mult[k]], color=color, zorder=3)
        ax_m.annotate(
            f"{mult[k]:.2f}x",
            (SPEEDUP, mult[k]),
            xytext=(8, -4),
            textcoords="offset points",
            color=color,
            fontsize=9,
            fontweight="bold",
        )
    ax_m.scatter(
        [SPEEDUP],
        [LECTURE_PRICE],
        marker="X",
        s=80,
        color=C.COLORS["orange"],
        zorder=3,
        label="lecture: 6x the price",
    )
    ax_m.axvline(SPEEDUP, color=C.COLORS["grey"], ls=":", lw=1)
    ax_m.set(
        xlabel="speed multiple (tokens/s per user over the cost-optimal design's)",
        ylabel="cost multiple (over the cost-optimal design's)",
        ylim=(0.9, 100),
        title="The price of speed: cheapest design at each speed",
    )
    ax_m.legend(loc="upper left", fontsize=8.5)
    fig.suptitle(
        f"Fast mode, {res['model']} on {res['hardware']}: 2.5x the speed per user costs "
        f"{res['rack']['fast']['cost_multiple']:.2f}x at context "
        f"{res['context']:,.0f} and {res['rack_short']['fast']['cost_multiple']:.2f}x at "
        f"{res['rack_short']['context']:,.0f} (lecture: 6x)",
        fontsize=12,
    )
    fig.tight_layout()
    return fig


def summary(res):
    out = {
        k: res[k]
        for k in (
            "hardware",
            "model",
            "context",
            "tpot_slo_s",
            "memory_reserve",
            "critical_context",
        )
    }
    out["lecture"] = {"speedup": SPEEDUP, "price_multiple": LECTURE_PRICE}
    for key in ("rack", "rack_short", "free"):
        out[key] = {"opt": res[key]["opt"], "fast": res[key]["fast"]}
        if "speedup_at_lecture_price" in res[key]:
            out[key]["speedup_at_lecture_price"] = res[key]["speedup_at_lecture_price"]
        if "context" in res[key]:
            out[key]["context"] = res[key]["context"]
    return out


def main():
    res = compute()
    C.save("fast_mode", plot(res), summary(res))


if __name__ == "__main__":
    main()
