"""Long context: where KV reads outgrow compute, what that does to MFU, what sparse attention buys.

Claim (lecture): each decoded token reads its whole KV cache, ``T b_kv`` bytes, against
``2 N_active + a T`` FLOPs. Past the critical context

    T_c = 2 N_active BW / (b_kv F - a BW)          (dcost.critical_context)

no batch size makes decode compute bound and MFU falls like ``T_c / T``. Sparse attention whose
KV reads grow as ``sqrt(T)`` moves that wall.

Sparse-attention assumption (ours, not dcost's): a token attends to an effective context
``T_eff = min(T, sqrt(T T0))`` (dense up to ``T0``, then reads and attention FLOPs grow as
``sqrt(T)``, as in strided/block-sparse attention), while the cache still holds all ``T`` tokens
(HBM capacity is charged for ``T``). The critical context then becomes ``T_c**2 / T0`` (when
``T_c > T0``). ``T0 = 1024`` here.

Setting: llama-3-70b on 8 x h100-sxm (bf16) and deepseek-v3 on 72 x gb200-nvl72 (fp8 weights on
fp8 FLOP/s). MFU at each context is the best over whole batches (log grid) with
``tpot <= 50 ms`` and ``memory_per_chip <= 0.9 M``, one vmapped call over (context, batch).

Run: ``python experiments/context_length.py``.
"""

from __future__ import annotations

import _common as C
import jax.numpy as jnp
import numpy as np

import dcost

CASES = {"dense": ("llama-3-70b", "h100-sxm", 8.0), "moe": ("deepseek-v3", "gb200-nvl72", 72.0)}
T0 = 1024.0  # tokens: sparse attention is dense below T0, sqrt(T T0) above
TPOT_SLO, MEMORY_RESERVE = 0.050, 0.10


def effective_context(context, t0=T0):
    """``min(T, sqrt(T T0))``: tokens a sparse-attention query reads (our assumption)."""
    return jnp.minimum(context, jnp.sqrt(context * t0))


def intensity(model, context):
    """FLOP per KV byte of one decoded token at large batch: ``(2 N + a T) / (T b_kv)``, with
    ``N = N_active - N_emb`` the parameters a token multiplies by."""
    n = model.params_active_multiplied
    return (2.0 * n + model.attn_flops_per_context_token * context) / (
        context * model.kv_bytes_per_token
    )


def best_mfu(hardware, model, chips, contexts, batches, sparse):
    """Best MFU per context over ``batches`` under the SLO and HBM limit (one vmapped call)."""
    cap = (1 - MEMORY_RESERVE) * float(hardware.hbm_capacity)
    t = np.asarray(contexts)[:, None]
    b = np.asarray(batches)[None, :]
    t_read = np.asarray(effective_context(t)) if sparse else t
    r = C.decode_sweep(b, chips, 1.0, hardware, model, t_read)
    # the cache holds all T tokens even when a query reads only T_eff of them
    memory = (
        np.asarray(r.memory_per_chip) + b * (t - t_read) * float(model.kv_bytes_per_token) / chips
    )
    ok = (np.asarray(r.tpot) <= TPOT_SLO) & (memory <= cap)
    mfu = np.where(ok, np.asarray(r.mfu), -1.0)
    i = np.argmax(mfu, axis=1)
    pick = np.arange(len(t))
    return mfu[pick, i], np.asarray(batches)[i], np.asarray(r.cost_per_token)[pick, i]


def compute(n_contexts=61, n_batches=300):
    contexts = jnp.asarray(np.logspace(np.log10(128), np.log10(1_048_576), n_contexts))
    batches = C.log_batches(1e6, n_batches)
    out = {"context": np.asarray(contexts), "t0": T0, "tpot_slo_s": TPOT_SLO}
    for kind, (name, hw_name, chips) in CASES.items():
        m = dcost.model(name)
        h = dcost.presets.serving_hardware(hw_name, name)
        tc = float(dcost.critical_context(h, m))
        res = {
            "model": name,
            "hardware": hw_name,
            "chips": chips,
            "f_over_bw": float(h.flops / h.hbm_bandwidth),
            "critical_context": tc,
            "critical_context_sparse": tc**2 / T0 if tc > T0 else tc,
            "intensity": np.asarray(intensity(m, contexts)),
            "intensity_sparse": np.asarray(intensity(m, effective_context(contexts))),
        }
        for mode, sparse in (("full", False), ("sparse", True)):
            mfu, b, cost = best_mfu(h, m, chips, contexts, batches, sparse)
            res[f"mfu_{mode}"], res[f"batch_{mode}"], res[f"cost_{mode}"] = mfu, b, cost
        # the numeric crossing of the (decreasing) intensity curves with the ridge F/BW
        for mode in ("", "_sparse"):
            log_i = np.log(res[f"intensity{mode}"])[::-1]
            res[f"crossing{mode}"] = float(
                np.exp(
                    np.interp(np.log(res["f_over_bw"]), log_i, np.log(np.asarray(contexts))[::-1])
                )
            )
        out[kind] = res
    return out


def plot(res):
    fig, (ax_i, ax_m) = C.figure(2, width=6.3, height=5.0)
    t = res["context"]
    colors = {"dense": C.COLORS["dense"], "moe": C.COLORS["moe"]}
    for kind in ("dense", "moe"):
        r, c = res[kind], colors[kind]
        tag = f"{r['model']} on {r['hardware']}"
        ax_i.loglog(t, r["intensity"], "-", color=c, lw=1.8, label=f"{tag}: full attention")
        ax_i.loglog(
            t,
            r["intensity_sparse"],
            "--",
            color=c,
            lw=1.6,
            label=f"{tag}: sparse, T_eff = sqrt(T x {res['t0']:.0f})",
        )
        ax_i.axhline(r["f_over_bw"], color=c, lw=0.9, ls=":")
        up = kind == "moe"  # labels above the upper ridge, below the lower one
        ax_i.text(
            t[0] * 1.1,
            r["f_over_bw"] * (1.1 if up else 1 / 2.2),  # below the lower ridge's T_c labels
            f"ridge F/BW = {r['f_over_bw']:.0f}",
            color=c,
            fontsize=8.5,
        )
        for key, marker, dx, ha in (
            ("critical_context", "o", -5, "right"),
            ("critical_context_sparse", "s", 5, "left"),
        ):
            ax_i.scatter([r[key]], [r["f_over_bw"]], color=c, marker=marker, s=45, zorder=3)
            ax_i.annotate(
                f"{r[key]:,.0f}",
                (r[key], r["f_over_bw"]),
                xytext=(dx, 6 if up else -14),
                textcoords="offset points",
                color=c,
                fontsize=8.5,
                ha=ha,
            )
        ax_m.semilogx(t, r["mfu_full"] * 100, "-", color=c, lw=1.8, label=f"{tag}: full")
        ax_m.semilogx(t, r["mfu_sparse"] * 100, "--", color=c, lw=1.6, label=f"{tag}: sparse")
        for key, ls in (("critical_context", "-"), ("critical_context_sparse", "--")):
            ax_m.axvline(r[key], color=c, lw=0.8, ls=ls, alpha=0.6)
    ax_i.set(
        xlabel="context T (tokens)",
        ylabel="FLOP per KV byte of a decoded token",
        ylim=(5, 3e4),
        title="KV reads against compute: decode is compute bound above "
        "the ridge\n(circle: T_c, dcost.critical_context; "
        "square: T_c^2 / T0 with sparse attention)",
    )
    ax_i.legend(loc="upper right", fontsize=8)
    ax_m.set(
        xlabel="context T (tokens)",
        ylabel="best MFU (%) under tpot <= 50 ms and HBM",
        ylim=(0, 105),
        title="MFU falls past T_c (vertical lines: T_c full / sparse)",
    )
    ax_m.legend(loc="upper right", fontsize=8)
    fig.suptitle(
        "Long context: the KV cache, not the weights, sets the decode roofline", fontsize=12
    )
    fig.tight_layout()
    return fig


def summary(res):
    out = {
        "t0": res["t0"],
        "tpot_slo_s": res["tpot_slo_s"],
        "assumption": "sparse attention reads T_eff = min(T, sqrt(T*T0)) tokens; HBM holds T",
    }
    t = res["context"]
    for kind in ("dense", "moe"):
        r = res[kind]
        at = {
            f"{v:.0f}": {
                "mfu_full": float(np.interp(np.log(v), np.log(t), r["mfu_full"])),
                "mfu_sparse": float(np.interp(np.log(v), np.log(t), r["mfu_sparse"])),
            }
            for v in (1024, 8192, 131072)
        }
        out[kind] = {
            k: r[k]
            for k in (
                "model",
                "hardware",
                "chips",
                "f_over_bw",
                "critical_context",
                "critical_context_sparse",
                "crossing",
                "crossing_sparse",
            )
        }
        out[kind]["mfu_at_context"] = at
    return out


def main():
    res = compute()
    C.save("context_length", plot(res), summary(res))


if __name__ == "__main__":
    main()
