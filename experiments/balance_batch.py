"""The balance batch ~ 300 x sparsity, across accelerator generations.

Claim (lecture): decode turns compute bound at ``B* = (F/BW) (b_w/2) N_total/N_active``, about
300 x sparsity, on every recent accelerator, because FLOP/s and HBM bandwidth have grown together
so that F/BW stays near 300 FLOP per byte.

dcost's ``B*`` counts the parameters a token multiplies by: without the input embedding's lookup
table (``Model.params_embedding``), ``(F/BW)(b_w/2)(N_total - N_emb)/(N_active - N_emb)``; for
deepseek-v3 that ratio is 18.3 where ``N_total/N_active`` is 17.9.

Setting: every hardware preset (bf16 FLOP/s), context 0, a dense model (llama-3-70b) and
deepseek-v3 (sparsity 17.9), both with bf16 weights so that FLOP/s and bytes are at the same
precision (fp8 weights on fp8 FLOP/s give the same B*: b_w halves and F doubles). ``B*`` comes
from ``dcost.balance_batch``, and is checked against the exact roofline of ``dcost.decode``: at
``B*`` the compute time equals the weight-read time.

Run: ``python experiments/balance_batch.py``.
"""

from __future__ import annotations

import _common as C
import jax
import numpy as np

import dcost

HARDWARE = ("a100-80gb", "tpu-v4", "h100-sxm", "tpu-v5e", "tpu-v5p", "h200", "b200", "gb200-nvl72")
# Year of general availability, used only to order and label the chips.
YEAR = {
    "a100-80gb": 2020,
    "tpu-v4": 2021,
    "h100-sxm": 2022,
    "tpu-v5e": 2023,
    "tpu-v5p": 2023,
    "h200": 2024,
    "b200": 2024,
    "gb200-nvl72": 2025,
}
MODELS = {"dense": ("llama-3-70b", {}), "moe": ("deepseek-v3", {"bytes_per_param": 2.0})}
LECTURE = 300.0
LABEL_OFFSET = {
    "h100-sxm": (-6, 9, "right"),
    "h200": (6, -8, "left"),
    "b200": (-6, 8, "right"),
    "gb200-nvl72": (6, -9, "left"),
    "tpu-v5p": (-6, 8, "right"),
    "a100-80gb": (6, -8, "left"),
}


@jax.jit
def balance_and_crossing(hardware, model):
    """``B*`` on each chip of a stacked ``Hardware``, and the exact roofline's compute / memory
    time at that batch (1 where the closed form and ``dcost.decode`` agree). One vmapped call."""

    def one(h):
        b = dcost.balance_batch(h, model)
        r = dcost.decode(dcost.Design(batch=b), h, model, dcost.Workload(0.0))
        return b, r.t_compute / (r.t_weights + r.t_kv)

    return jax.vmap(one)(hardware)


def compute():
    """B* of each model on each chip (one vmapped call per model), and the roofline crossing."""
    hw = dcost.stack([dcost.hardware(n) for n in HARDWARE])
    f, bw = np.asarray(hw.flops), np.asarray(hw.hbm_bandwidth)
    out = {
        "hardware": list(HARDWARE),
        "year": [YEAR[n] for n in HARDWARE],
        "flops": f,
        "hbm_bandwidth": bw,
        "f_over_bw": f / bw,
    }
    for kind, (name, overrides) in MODELS.items():
        m = dcost.model(name, **overrides)
        bstar, ratio = balance_and_crossing(hw, m)
        out[kind] = {
            "model": name,
            "bytes_per_param": float(m.bytes_per_param),
            "sparsity": float(m.sparsity),
            # N_total/N_active of the parameters a step multiplies by (no input-embedding table)
            "sparsity_multiplied": float(
                (m.params_total - m.params_embedding) / m.params_active_multiplied
            ),
            "balance_batch": np.asarray(bstar),
            "compute_over_memory_at_bstar": np.asarray(ratio),
            "balance_batch_over_sparsity": np.asarray(bstar) / float(m.sparsity),
        }
    return out


def plot(res):
    fig, (ax_s, ax_b) = C.figure(2, width=6.3, height=5.0)
    names, f, bw = res["hardware"], res["flops"], res["hbm_bandwidth"]
    x = np.logspace(np.log10(0.6), np.log10(11), 20)
    for ratio, ls, at in ((100, ":", 3.0), (LECTURE, "-", 0.66), (1000, ":", 0.75)):
        ax_s.plot(x, ratio * x, ls, color=C.COLORS["grey"], lw=1.3 if ratio == LECTURE else 0.9)
        ax_s.text(
            at,
            ratio * at * 1.12,
            f"F/BW = {ratio:.0f} FLOP/byte",
            rotation=27,
            rotation_mode="anchor",
            color=C.COLORS["grey"],
            fontsize=8.5,
        )
    for i, n in enumerate(names):
        color = C.COLORS["alt"] if n.startswith("tpu") else C.COLORS["dense"]
        dx, dy, ha = LABEL_OFFSET.get(n, (6, -4, "left"))
        ax_s.scatter(bw[i] / 1e12, f[i] / 1e12, color=color, s=40, zorder=3)
        ax_s.annotate(
            f"{n} ({res['year'][i]})",
            (bw[i] / 1e12, f[i] / 1e12),
            xytext=(dx, dy),
            textcoords="offset points",
            fontsize=8,
            va="center",
            ha=ha,
            color=color,
        )
    ax_s.set(
        xscale="log",
        yscale="log",
        xlabel="HBM bandwidth BW (TB/s per chip)",
        ylabel="dense bf16 FLOP/s F (TFLOP/s per chip)",
        xlim=(0.6, 11),
        ylim=(100, 5000),
        title="FLOP/s and bandwidth grew together (F/BW between "
        f"{min(res['f_over_bw']):.0f} and {max(res['f_over_bw']):.0f})",
    )
    pos = np.arange(len(names))
    width = 0.38
    for j, (kind, color) in enumerate((("dense", C.COLORS["dense"]), ("moe", C.COLORS["moe"]))):
        r = res[kind]
        label = (
            f"{r['model']} (dense)"
            if kind == "dense"
            else f"{r['model']} (sparsity {r['sparsity']:.1f})"
        )
        bars = ax_b.bar(
            pos + (j - 0.5) * width, r["balance_batch"], width, color=color, label=label
        )
        for bar, v in zip(bars, r["balance_batch"], strict=True):
            ax_b.text(
                bar.get_x() + bar.get_width() / 2,
                60,
                f"{v:,.0f}",
                ha="center",
                fontsize=8,
                rotation=90,
                va="bottom",
                color="white",
                fontweight="bold",
            )
        target = LECTURE * r["sparsity"]
        ax_b.axhline(target, color=color, ls="--", lw=1)
        ax_b.axhspan(target / 2, target * 1.5, color=color, alpha=0.07)
        ax_b.text(
            1.01,
            target,
            f"lecture:\n300 x {r['sparsity']:.1f}" if kind == "moe" else "lecture:\n300",
            transform=ax_b.get_yaxis_transform(),
            color=color,
            fontsize=8.5,
            va="center",
        )
    ax_b.set_xticks(pos, names, rotation=35, ha="right")
    ax_b.set(
        yscale="log",
        ylim=(50, 60000),
        ylabel="balance batch B* (sequences per step)",
        title="B* = (F/BW)(b_w/2)(N_total/N_active), bf16 weights, context 0",
    )
    ax_b.legend(loc="upper left")
    fig.suptitle(
        "The balance batch ~ 300 x sparsity: shaded band 0.5x to 1.5x the lecture's value",
        fontsize=12,
    )
    fig.tight_layout()
    return fig


def summary(res):
    out = {
        "lecture": "balance batch ~ 300 x sparsity; F/BW ~ 300 across generations",
        "per_hardware": {},
    }
    for i, n in enumerate(res["hardware"]):
        out["per_hardware"][n] = {
            "year": res["year"][i],
            "f_over_bw": res["f_over_bw"][i],
            "balance_batch_dense": res["dense"]["balance_batch"][i],
            "balance_batch_deepseek_v3_bf16": res["moe"]["balance_batch"][i],
            "compute_over_memory_at_bstar": res["moe"]["compute_over_memory_at_bstar"][i],
        }
    out["deepseek_v3_sparsity"] = res["moe"]["sparsity"]
    out["f_over_bw_range"] = [min(res["f_over_bw"]), max(res["f_over_bw"])]
    return out


def main():
    res = compute()
    C.save("balance_batch", plot(res), summary(res))


if __name__ == "__main__":
    main()
