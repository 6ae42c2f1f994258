"""The latency floor: HBM capacity over bandwidth, the natural cadence of a decode batch.

Claim (lecture): a memory-bound decode step reads what the chip holds, so a chip whose HBM is full
(weights + KV cache) takes ``M/BW`` per step, about 15-20 ms; a faster cadence leaves HBM unused,
a slower one needs more memory than there is. That is the natural time between batch departures.

Setting: every hardware preset; llama-3-70b in bf16 at context 4096 on ``G`` chips per replica,
the smallest power of two whose share of the weights takes at most half the HBM. A batch sweep
from 1 to the batch that fills the HBM (one call, vmapped over chips and batches) shows the
step time climbing along ``memory_per_chip / BW`` to ``M/BW``, with the exact ``dcost.decode``.

The batch that fills the HBM counts the KV cache as the serving model holds it: tensor-parallel
attention over ``G`` chips beyond the model's ``h_kv`` KV heads (8 for llama-3-70b) replicates the
heads, ``rep = max(1, G/h_kv)`` copies (``dcost.serving.attention.kv_replication``), so

    B_full = floor((M G - b_w N) / (T b_kv rep))

(tpu-v4 at ``G = 16`` holds the cache twice, tpu-v5e at ``G = 32`` four times). The step at full
HBM still reads what the chip holds, so it stays at ``M/BW``; only the batch that gets there
shrinks.

Run: ``python experiments/latency_floor.py``.
"""

from __future__ import annotations

import _common as C
import jax
import jax.numpy as jnp
import numpy as np

import dcost

HARDWARE = ("a100-80gb", "tpu-v4", "h100-sxm", "tpu-v5e", "tpu-v5p", "h200", "b200", "gb200-nvl72")
MODEL, CONTEXT = "llama-3-70b", 4096.0
LECTURE_MS = (15.0, 20.0)


def kv_replication(chips, kv_heads):
    """KV-cache copies of tensor-parallel attention over ``chips``: ``max(1, G/h_kv)``; 1 when
    ``h_kv = 0`` (unknown)."""
    return jnp.where(kv_heads > 0, jnp.maximum(1.0, chips / jnp.maximum(kv_heads, 1.0)), 1.0)


def chips_for(hardware, model):
    """Smallest power of two ``G`` with ``b_w N_total / G <= M / 2`` (NumPy, per chip)."""
    need = (
        2.0
        * float(model.bytes_per_param)
        * float(model.params_total)
        / np.asarray(hardware.hbm_capacity)
    )
    return 2.0 ** np.ceil(np.log2(np.maximum(need, 1.0)))


@jax.jit
def sweep_to_full(hardware, chips, fractions, model):
    """Decode on each chip (stacked ``Hardware``, ``G`` per chip) at batches from 1 to the one
    that fills the HBM, ``1 + x (B_full - 1)`` for ``x`` in ``fractions``: a (chips, x) grid."""

    def one(h, g, x):
        rep = kv_replication(g, model.kv_heads)
        full = jnp.floor(
            (h.hbm_capacity * g - model.bytes_per_param * model.params_total)
            / (CONTEXT * model.kv_bytes_per_token * rep)
        )
        b = jnp.round(1.0 + x * (full - 1.0))
        return b, dcost.decode(dcost.Design(batch=b, chips=g), h, model, dcost.Workload(CONTEXT))

    return jax.vmap(jax.vmap(one, in_axes=(None, None, 0)), in_axes=(0, 0, None))(
        hardware, chips, fractions
    )


def compute(n_batches=64):
    """``M/BW`` per chip and the decode step along a batch sweep up to full HBM."""
    m = dcost.model(MODEL)
    hw = dcost.stack([dcost.hardware(n) for n in HARDWARE])
    chips = jnp.asarray(chips_for(hw, m))
    batch, r = sweep_to_full(hw, chips, jnp.linspace(0.0, 1.0, n_batches), m)
    floor = np.asarray(hw.hbm_capacity / hw.hbm_bandwidth)
    last = {
        k: np.asarray(getattr(r, k))[:, -1]
        for k in ("t_stage", "tpot", "memory_per_chip", "t_compute", "t_comm")
    }
    return {
        "hardware": list(HARDWARE),
        "model": MODEL,
        "context": CONTEXT,
        "chips": np.asarray(chips),
        "kv_heads": float(m.kv_heads),
        "kv_replication": np.asarray(kv_replication(chips, m.kv_heads)),
        "latency_floor_s": floor,
        "batch": np.asarray(batch),
        "tpot_s": np.asarray(r.tpot),
        "memory_per_chip": np.asarray(r.memory_per_chip),
        "hbm_capacity": np.asarray(hw.hbm_capacity),
        "batch_full": np.asarray(batch)[:, -1],
        "tpot_full_s": last["tpot"],
        "memory_full": last["memory_per_chip"],
        "bottleneck_full": dcost.bottleneck(jax.tree.map(lambda x: x[:, -1], r)),
    }


def plot(res):
    fig, (ax_b, ax_l) = C.figure(2, width=6.3, height=5.0)
    names = res["hardware"]
    pos = np.arange(len(names))
    floor_ms = res["latency_floor_s"] * 1e3
    bars = ax_b.bar(
        pos, floor_ms, 0.6, color=C.COLORS["dense"], label="M / BW (HBM capacity over bandwidth)"
    )
    for bar, v in zip(bars, floor_ms, strict=True):
        ax_b.text(bar.get_x() + bar.get_width() / 2, v + 1.6, f"{v:.1f}", ha="center", fontsize=9)
    ax_b.scatter(
        pos,
        res["tpot_full_s"] * 1e3,
        marker="D",
        color=C.COLORS["orange"],
        zorder=3,
        label=f"dcost.decode step at full HBM\n({res['model']}, context {res['context']:,.0f})",
    )
    ax_b.axhspan(*LECTURE_MS, color=C.COLORS["moe"], alpha=0.12, label="lecture: 15-20 ms")
    ax_b.set_xticks(pos, names, rotation=35, ha="right")
    ax_b.set(
        ylabel="decode step time with HBM full (ms)",
        ylim=(0, max(floor_ms) * 1.45),
        title="Latency floor M/BW per chip",
    )
    ax_b.legend(loc="upper right", fontsize=8.5)
    cmap = matplotlib_colors(len(names))
    for i, n in enumerate(names):
        ax_l.plot(
            res["memory_per_chip"][i] / 1e9,
            res["tpot_s"][i] * 1e3,
            color=cmap[i],
            label=f"{n}, G = {res['chips'][i]:.0f}"
            + (f", KV x{res['kv_replication'][i]:.0f}" if res["kv_replication"][i] > 1 else ""),
            lw=1.6,
        )
        ax_l.scatter(
            res["memory_full"][i] / 1e9,
            res["tpot_full_s"][i] * 1e3,
            color=cmap[i],
            marker="D",
            s=28,
            zorder=3,
        )
        ax_l.plot(
            [0.0, res["memory_per_chip"][i][0] / 1e9],
            [0.0, res["tpot_s"][i][0] * 1e3],
            ":",
            color=cmap[i],
            lw=1,
        )
    ax_l.axhspan(*LECTURE_MS, color=C.COLORS["moe"], alpha=0.12)
    ax_l.set(
        xlim=(0, None),
        ylim=(0, None),
        xlabel="HBM used per chip: weights + KV (GB)",
        ylabel="time per output token (ms)",
        title=f"Batch sweep to full HBM: step = bytes held / BW\n({res['model']}, "
        f"context {res['context']:,.0f}; dotted: extended to 0; diamond: HBM full)",
    )
    ax_l.legend(fontsize=8, loc="lower right")
    fig.suptitle(
        "A memory-bound step reads all the HBM it uses: full HBM sets a cadence of M/BW",
        fontsize=12,
    )
    fig.tight_layout()
    return fig


def matplotlib_colors(n):
    import matplotlib.pyplot as plt

    return [plt.get_cmap("tab10")(i) for i in range(n)]


def summary(res):
    out = {
        "lecture_ms": list(LECTURE_MS),
        "model": res["model"],
        "context": res["context"],
        "per_hardware": {},
    }
    for i, n in enumerate(res["hardware"]):
        out["per_hardware"][n] = {
            "latency_floor_ms": res["latency_floor_s"][i] * 1e3,
            "chips": res["chips"][i],
            "kv_replication": res["kv_replication"][i],
            "batch_full": res["batch_full"][i],
            "tpot_full_ms": res["tpot_full_s"][i] * 1e3,
            "bottleneck_full": str(res["bottleneck_full"][i]),
        }
    floor = res["latency_floor_s"] * 1e3
    out["latency_floor_ms_range"] = [float(floor.min()), float(floor.max())]
    out["latency_floor_ms_median"] = float(np.median(floor))
    return out


def main():
    res = compute()
    C.save("latency_floor", plot(res), summary(res))


if __name__ == "__main__":
    main()
