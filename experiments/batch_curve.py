"""Latency and cost per token against batch: the weight-bound plateau, the knee, the compute slope.

Claim (lecture): at batch 1 a token costs about a balance batch (~300) times what it costs at a
large batch, because every step reads all the weights for one token; past the balance batch the
step is compute bound and the cost per token is flat. For a sparse MoE the balance batch is
~300 x sparsity, but a batch of 1 reads only its ``k`` routed experts, ``phi(1) = k/E``.

Setting: llama-3-70b (dense, bf16) and deepseek-v3 (8 of 256 routed experts, fp8 weights on fp8
FLOP/s) on 8 x B200 (one HGX box, F/BW = 292 at matching precision), context 0 (weights only; the
KV cache is the subject of ``context_length.py``), plus llama-3-70b at context 4096 for contrast.

Run: ``python experiments/batch_curve.py``.
"""

from __future__ import annotations

import _common as C
import jax.numpy as jnp
import numpy as np

import dcost

HARDWARE, CHIPS, KV_CONTEXT = "b200", 8.0, 4096.0
MODELS = {"dense": "llama-3-70b", "moe": "deepseek-v3"}


def sweep(hardware, model, context, batches):
    """Exact decode reports over ``batches`` (one jitted, vmapped call)."""
    return C.decode_sweep(batches, CHIPS, 1.0, hardware, model, context)


def all_experts_read(report, hardware, model):
    """Counterfactual MoE step in which every expert is read at any batch (``phi = 1``).

    The compute, KV and all-to-all terms are the model's; only the weight read changes to
    ``b_w (N_total - N_emb) / (G BW)`` (seconds; the input embedding's lookup table is read by
    row), so the cost per token follows from the step time.
    """
    read = model.params_total - model.params_embedding
    t_w = model.bytes_per_param * read / (CHIPS * hardware.bandwidth_achieved)
    t_stage = jnp.maximum(jnp.maximum(report.t_compute, t_w + report.t_kv), report.t_comm)
    return t_stage, report.cost_per_token * t_stage / report.t_stage


def knee(batches, report):
    """Smallest batch in ``batches`` whose exact step is compute bound (nan when none is)."""
    bound = np.asarray(report.t_compute) >= np.asarray(report.t_weights + report.t_kv)
    return float(np.asarray(batches)[np.argmax(bound)]) if bound.any() else float("nan")


def compute(max_batch=1e6, exact_up_to=32768):
    """Sweep batch 1..max_batch (every whole batch to ``exact_up_to``, log-spaced beyond)."""
    batches = jnp.asarray(
        np.unique(
            np.concatenate(
                [
                    np.arange(1.0, exact_up_to + 1.0),
                    np.round(np.logspace(np.log10(exact_up_to), np.log10(max_batch), 60)),
                ]
            )
        )
    )
    out = {"hardware": HARDWARE, "chips": CHIPS, "batch": np.asarray(batches)}
    for kind, name in MODELS.items():
        m = dcost.model(name)
        h = dcost.presets.serving_hardware(HARDWARE, name)
        r = sweep(h, m, 0.0, batches)
        cost, tpot = np.asarray(r.cost_per_token), np.asarray(r.tpot)
        res = {
            "model": name,
            "tpot_s": tpot,
            "cost_per_token": cost,
            "bottleneck": dcost.bottleneck(r),
            "balance_batch": float(dcost.balance_batch(h, m)),
            "knee": knee(batches, r),
            "f_over_bw": float(h.flops / h.hbm_bandwidth),
            "sparsity": float(m.sparsity),
            "cost_ratio_batch1": float(cost[0] / cost[-1]),
            "cost_floor_per_mtok": float(cost[-1] * 1e6),
        }
        if kind == "moe":
            t_all, cost_all = all_experts_read(r, h, m)
            res.update(
                tpot_all_experts_s=np.asarray(t_all),
                cost_all_experts=np.asarray(cost_all),
                cost_ratio_batch1_all_experts=float(cost_all[0] / cost_all[-1]),
                phi_batch1=float(dcost.expert_fraction(1.0, m.n_experts, m.experts_active)),
                # MoE plateau: until a batch covers the experts, each token brings its own
                cost_ratio_1_to_32=float(cost[0] / cost[31]),
            )
        out[kind] = res
    m = dcost.model(MODELS["dense"])
    h = dcost.presets.serving_hardware(HARDWARE, MODELS["dense"])
    r = sweep(h, m, KV_CONTEXT, batches)
    out["dense_kv"] = {
        "context": KV_CONTEXT,
        "tpot_s": np.asarray(r.tpot),
        "cost_per_token": np.asarray(r.cost_per_token),
        "balance_batch": float(dcost.balance_batch(h, m, KV_CONTEXT)),
        "critical_context": float(dcost.critical_context(h, m)),
    }
    return out


def plot(res):
    b = res["batch"]
    fig, (ax_t, ax_c) = C.figure(2, width=6.4, height=4.9)
    d, e, kv = res["dense"], res["moe"], res["dense_kv"]
    lines = [
        (d, "tpot_s", "cost_per_token", f"{d['model']} (dense, bf16)", C.COLORS["dense"], "-"),
        (e, "tpot_s", "cost_per_token", f"{e['model']} (MoE 8/256, fp8)", C.COLORS["moe"], "-"),
        (
            e,
            "tpot_all_experts_s",
            "cost_all_experts",
            f"{e['model']} if every expert were read",
            C.COLORS["moe"],
            ":",
        ),
        (
            kv,
            "tpot_s",
            "cost_per_token",
            f"{d['model']}, context {kv['context']:,.0f} (KV reads)",
            C.COLORS["grey"],
            "--",
        ),
    ]
    for r, tk, ck, label, color, ls in lines:
        ax_t.loglog(b, r[tk] * 1e3, ls, color=color, label=label, lw=1.8)
        ax_c.loglog(b, r[ck] * 1e6, ls, color=color, label=label, lw=1.8)
    for r, color in ((d, C.COLORS["dense"]), (e, C.COLORS["moe"])):
        for ax in (ax_t, ax_c):
            ax.axvline(r["balance_batch"], color=color, lw=0.9, alpha=0.6)
            ax.text(
                r["balance_batch"] * 1.12,
                0.97,
                f"B* = {r['balance_batch']:,.0f}",
                transform=ax.get_xaxis_transform(),
                color=color,
                va="top",
                fontsize=9,
            )
    # the claim: brackets from the batch-1 cost down to the compute-bound floor
    for r, ck, color, x in (
        (d, "cost_per_token", C.COLORS["dense"], 1.0),
        (e, "cost_all_experts", C.COLORS["moe"], 1.35),
    ):
        ax_c.annotate(
            "",
            (x, r[ck][-1] * 1e6),
            (x, r[ck][0] * 1e6),
            arrowprops={"arrowstyle": "<->", "color": color, "lw": 1.2, "shrinkA": 0, "shrinkB": 0},
        )
    ax_c.text(
        2.0,
        d["cost_per_token"][-1] * 1e6 * 0.2,
        "cost at B = 1 / compute-bound floor:\n"
        f"  dense: {d['cost_ratio_batch1']:,.0f}x  (= B*)\n"
        f"  MoE as served: {e['cost_ratio_batch1']:,.0f}x  (phi(1) = k/E = "
        f"{e['phi_batch1']:.3f})\n"
        f"  MoE if all experts read: {e['cost_ratio_batch1_all_experts']:,.0f}x  (= B*)",
        fontsize=8.5,
        va="top",
        bbox={"boxstyle": "round", "fc": "white", "ec": "0.7"},
    )
    ax_t.text(
        12, d["tpot_s"][0] * 1e3 * 0.7, "weight-bound plateau", color=C.COLORS["dense"], fontsize=9
    )
    i = np.searchsorted(b, 2e4)
    ax_t.annotate(
        "compute bound: slope 1",
        (b[i], d["tpot_s"][i] * 1e3),
        xytext=(-150, 20),
        textcoords="offset points",
        fontsize=9,
        color=C.COLORS["dense"],
        arrowprops={"arrowstyle": "->", "color": C.COLORS["dense"]},
    )
    ax_c.text(
        4e4,
        d["cost_per_token"][-1] * 1e6 * 1.25,
        "compute-bound floor",
        color=C.COLORS["dense"],
        fontsize=9,
        ha="center",
    )
    ax_t.set(
        xlabel="batch B (sequences per step)",
        ylabel="time per output token (ms)",
        title=f"Latency: {res['chips']:.0f} x {res['hardware']}, context 0",
    )
    ax_c.set(
        xlabel="batch B (sequences per step)",
        ylabel="cost ($ per million output tokens)",
        title="Cost per token: batch 1 costs ~B* times the floor",
    )
    ax_t.legend(loc="upper left", fontsize=8.5, bbox_to_anchor=(0.0, 0.9))
    ax_c.legend(loc="upper right", fontsize=8.5, bbox_to_anchor=(1.0, 0.9))
    ax_c.set_ylim(bottom=d["cost_per_token"][-1] * 1e6 * 0.012, top=ax_c.get_ylim()[1] * 3)
    fig.suptitle(
        "Batch amortizes weight reads (exact dcost.decode; vertical lines: balance batch B*)",
        fontsize=12,
    )
    fig.tight_layout()
    return fig


def summary(res):
    keys = (
        "model",
        "balance_batch",
        "knee",
        "f_over_bw",
        "sparsity",
        "cost_ratio_batch1",
        "cost_floor_per_mtok",
        "cost_ratio_batch1_all_experts",
        "phi_batch1",
        "cost_ratio_1_to_32",
    )
    out = {"hardware": res["hardware"], "chips": res["chips"], "context": 0}
    for kind in ("dense", "moe"):
        out[kind] = {k: res[kind][k] for k in keys if k in res[kind]}
    out["dense_kv"] = {k: v for k, v in res["dense_kv"].items() if np.ndim(v) == 0}
    out["lecture"] = {
        "cost_ratio_batch1": "~1000x ('a thousand times worse'), ~ balance batch "
        "~300 for a dense model"
    }
    return out


def main():
    res = compute()
    C.save("batch_curve", plot(res), summary(res))


if __name__ == "__main__":
    main()
