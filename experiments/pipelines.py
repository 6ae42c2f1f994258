"""Pipeline stages: weights per chip fall as 1/P, KV per chip does not, and latency does not fall.

Claim (lecture): with ``P`` pipeline stages each chip holds ``1/P`` of the weights, but ``P``
micro-batches are in flight, so each chip still holds the KV cache of a whole micro-batch
(``B T b_kv / G``): pipelining buys room for weights and throughput, not room for KV and not
latency. A token still crosses every layer in turn: ``tpot = P t_stage + (P-1) t_hop`` with
``t_stage`` ~ ``1/P``, so tpot stays flat.

Tensor parallelism is no cure for KV either, beyond the KV heads: over ``G`` chips attention
holds ``h_kv/G`` KV heads per chip while ``G <= h_kv`` and replicates them beyond
(``rep = max(1, G/h_kv)``, ``dcost.serving.attention.kv_replication``), so the KV per chip is
``B T b_kv rep / G = B T b_kv / min(G, h_kv)`` and, memory bound, the tensor-parallel step is

    tpot(G) = (b_w N / G + B T b_kv / min(G, h_kv)) / BW

(weights keep falling as ``1/G``; KV stops falling at ``G = h_kv = 8`` for llama-3-70b).

Setting: llama-3-70b (bf16) on gb200-nvl72, context 8192, ``B = 32`` sequences per micro-batch,
1 to 64 chips per replica, all inside one NVLink domain. Three ways to spend ``N`` chips, one
vmapped call of the exact ``dcost.decode``: pipeline (``G = 1, P = N``, batch ``B``), tensor
parallel at the same batch (``G = N, P = 1``, batch ``B``), and tensor parallel with as many
sequences in flight as the pipeline (``G = N``, batch ``N B``).

Run: ``python experiments/pipelines.py``.
"""

from __future__ import annotations

import _common as C
import jax
import numpy as np

import dcost

HARDWARE, MODEL, CONTEXT, BATCH = "gb200-nvl72", "llama-3-70b", 8192.0, 32.0
CHIPS = 2.0 ** np.arange(0, 7)  # chips per replica
STRATEGIES = ("pipeline", "tensor", "tensor_same_inflight")


def compute():
    h, m = dcost.hardware(HARDWARE), dcost.model(MODEL)
    n = len(CHIPS)
    ones = np.ones(n)
    g = np.concatenate([ones, CHIPS, CHIPS])
    p = np.concatenate([CHIPS, ones, ones])
    b = np.concatenate([BATCH * ones, BATCH * ones, BATCH * CHIPS])
    r = C.decode_sweep(b, g, p, h, m, CONTEXT)
    out = {
        "hardware": HARDWARE,
        "model": MODEL,
        "context": CONTEXT,
        "batch": BATCH,
        "chips": CHIPS,
        "hbm_capacity": float(h.hbm_capacity),
        "hbm_bandwidth": float(h.hbm_bandwidth * h.bandwidth_efficiency),
        "kv_heads": float(m.kv_heads),
    }
    weights = float(m.bytes_per_param * m.params_total) / (g * p)
    h_kv = float(m.kv_heads)
    rep = np.maximum(1.0, g / h_kv) if h_kv > 0 else np.ones_like(g)  # tensor-parallel KV copies
    kv = b * CONTEXT * float(m.kv_bytes_per_token) * rep / g
    for i, name in enumerate(STRATEGIES):
        sl = slice(i * n, (i + 1) * n)
        out[name] = {
            "stages": p[sl],
            "chips_per_stage": g[sl],
            "batch": b[sl],
            "tpot_s": np.asarray(r.tpot)[sl],
            "cost_per_token": np.asarray(r.cost_per_token)[sl],
            "tokens_per_s": np.asarray(r.tokens_per_s)[sl],
            "memory_per_chip": np.asarray(r.memory_per_chip)[sl],
            "weights_per_chip": weights[sl],
            "kv_per_chip": kv[sl],
            "fits": np.asarray(r.memory_per_chip)[sl] <= float(h.hbm_capacity),
            "bottleneck": dcost.bottleneck(jax.tree.map(lambda x, sl=sl: x[sl], r)),
        }
    return out


def plot(res):
    fig, (ax_m, ax_t, ax_c) = C.figure(3, width=5.2, height=4.8)
    n = res["chips"]
    pl, tp = res["pipeline"], res["tensor"]
    ax_m.loglog(
        n,
        pl["weights_per_chip"] / 1e9,
        "o-",
        color=C.COLORS["dense"],
        label="pipeline: weights per chip (1/P)",
    )
    ax_m.loglog(
        n,
        pl["kv_per_chip"] / 1e9,
        "s-",
        color=C.COLORS["moe"],
        label="pipeline: KV per chip (flat)",
    )
    ax_m.loglog(
        n, pl["memory_per_chip"] / 1e9, "-", color="k", lw=2, label="pipeline: total per chip"
    )
    ax_m.loglog(
        n,
        tp["memory_per_chip"] / 1e9,
        "--",
        color=C.COLORS["alt"],
        label="tensor parallel, same batch: total",
    )
    ax_m.axhline(res["hbm_capacity"] / 1e9, color=C.COLORS["grey"], ls=":")
    ax_m.text(
        n[-1],
        res["hbm_capacity"] / 1e9 * 1.08,
        f"HBM {res['hbm_capacity'] / 1e9:.0f} GB",
        ha="right",
        fontsize=8.5,
        color=C.COLORS["grey"],
    )
    ax_m.set(
        xlabel="chips per replica (P for the pipeline, G for tensor parallel)",
        ylabel="HBM per chip (GB)",
        ylim=(1, 600),
        title="Memory: weights shrink with P, KV does not",
    )
    ax_m.legend(fontsize=8, loc="lower left")
    styles = (
        (
            "pipeline",
            "o-",
            C.COLORS["dense"],
            f"pipeline, batch {res['batch']:.0f} per micro-batch",
        ),
        ("tensor", "--", C.COLORS["alt"], f"tensor parallel, batch {res['batch']:.0f}"),
        (
            "tensor_same_inflight",
            "-.",
            C.COLORS["extra"],
            f"tensor parallel, batch {res['batch']:.0f} x chips (as many in flight)",
        ),
    )
    for key, ls, c, label in styles:
        r = res[key]
        ax_t.loglog(n, r["tpot_s"] * 1e3, ls, color=c, label=label, lw=1.8)
        ax_c.semilogx(n, r["cost_per_token"] * 1e6, ls, color=c, label=label, lw=1.8)
        ax_t.scatter(
            n[~r["fits"]], r["tpot_s"][~r["fits"]] * 1e3, marker="x", color="k", s=40, zorder=3
        )
    ax_t.scatter([], [], marker="x", color="k", label="does not fit in HBM")
    ax_t.set(
        xlabel="chips per replica",
        ylabel="time per output token (ms)",
        title="Latency: stages do not lower tpot",
    )
    ax_t.legend(fontsize=8, loc="lower left")
    ax_c.set(
        xlabel="chips per replica",
        ylabel="cost ($ per million output tokens)",
        ylim=(0, max(pl["cost_per_token"]) * 1e6 * 1.3),
        title="Cost: P micro-batches in flight, same $/token",
    )
    ax_c.legend(fontsize=8, loc="lower left")
    fig.suptitle(
        f"Pipelining {res['model']} on {res['hardware']} (context "
        f"{res['context']:,.0f}): room for weights and throughput, not for KV or latency",
        fontsize=12,
    )
    fig.tight_layout()
    return fig


def summary(res):
    out = {k: res[k] for k in ("hardware", "model", "context", "batch", "hbm_capacity")}
    out["lecture"] = "weights per chip ~ 1/stages, KV per chip flat, latency not improved"
    for key in STRATEGIES:
        r = res[key]
        out[key] = {
            f"{c:.0f}": {
                "tpot_ms": r["tpot_s"][i] * 1e3,
                "cost_per_mtok": r["cost_per_token"][i] * 1e6,
                "memory_per_chip_gb": r["memory_per_chip"][i] / 1e9,
                "weights_per_chip_gb": r["weights_per_chip"][i] / 1e9,
                "kv_per_chip_gb": r["kv_per_chip"][i] / 1e9,
                "fits": bool(r["fits"][i]),
            }
            for i, c in enumerate(res["chips"])
        }
    pl = res["pipeline"]
    out["pipeline_tpot_ratio_64_over_1"] = pl["tpot_s"][-1] / pl["tpot_s"][0]
    out["pipeline_kv_ratio_64_over_1"] = pl["kv_per_chip"][-1] / pl["kv_per_chip"][0]
    out["pipeline_weights_ratio_64_over_1"] = pl["weights_per_chip"][-1] / pl["weights_per_chip"][0]
    tp = res["tensor"]
    out["kv_heads"] = res["kv_heads"]
    out["tensor_tpot_ratio_64_over_1"] = tp["tpot_s"][-1] / tp["tpot_s"][0]
    out["tensor_kv_ratio_64_over_1"] = tp["kv_per_chip"][-1] / tp["kv_per_chip"][0]
    return out


def main():
    res = compute()
    C.save("pipelines", plot(res), summary(res))


if __name__ == "__main__":
    main()
