"""How many routed experts? The optimizer picks the expert count with the batch (and, over the
model's life, with the over-training), for a deepseek-v3-shaped model on one GB200 NVL72 rack.

Setting: deepseek-v3's shape (k = 8 routed experts per token, 2.55B parameters per expert summed
over its 58 MoE layers, 37.6B active) in fp8 on gb200-nvl72 (fp8 FLOP/s, ``dcost.presets.pair``),
72 chips per replica (expert parallel over the rack, one stage), mean context 4096,
``tpot <= 50 ms``, 10 % of HBM reserved. ``E`` runs from 8 (= k: a dense-like model) to 1024.

1. Serving only (``cost_per_token``): for each ``E`` the optimizer picks the batch (one batched
   ``dcost.optimize`` call over the ``E`` values). More experts hold more weights and a batch
   touches more of them (``phi(B)``), so the cost per token only rises with ``E``: asked to pick
   ``E`` too, the optimizer takes the lower bound.
2. Lifetime (``lifetime_cost``): the same model must reach the loss of deepseek-v3 itself (256
   experts, 14.8T tokens, ``r = 14.8T / (20 x 37.6B) = 19.7``) under hoffmann2022 with
   ``N_eff = N_active (N_total/N_active)**(1/3)``. More experts now buy quality, so fewer
   pretraining tokens are needed; the optimizer picks ``E``, the over-training ``r`` and the batch
   for two traffic levels ``D_inf``. Pretraining on gb200 at 40 % MFU.

Run: ``python experiments/expert_count.py``.
"""

from __future__ import annotations

import _common as C
import jax.numpy as jnp
import numpy as np

import dcost

HARDWARE, MODEL, CONTEXT = "gb200-nvl72", "deepseek-v3", 4096.0
CHIPS, TPOT_SLO = 72, 0.050
EXPERTS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024)
BATCH = (1, 131072)
OVERTRAIN = (1, 400)
TRAINED_TOKENS = 14.8e12  # deepseek-v3 technical report, arXiv:2412.19437, section 4
TRAFFIC = (1e14, 1e16)  # output tokens served over the model's life


def _specs():
    h, m = dcost.presets.pair(HARDWARE, MODEL)
    return h, m, dcost.Workload(CONTEXT)


def target_loss(model) -> float:
    """hoffmann2022 loss of deepseek-v3 as trained: its own E, 14.8T tokens, gamma = 1/3."""
    n_eff = dcost.effective_params(model.params_active, model.params_total)
    return float(dcost.loss(n_eff, TRAINED_TOKENS))


def serving_problem(experts, free=None):
    h, m, w = _specs()
    return dcost.Problem(
        h,
        m,
        w,
        free=free or {"batch": BATCH},
        fixed=dcost.Design(batch=1, chips=CHIPS, experts=experts),
        tpot_slo=TPOT_SLO,
    )


def lifetime_problem(experts, inference_tokens, free=None):
    h, m, w = _specs()
    return dcost.Problem(
        h,
        m,
        w,
        objective="lifetime_cost",
        free=free or {"batch": BATCH, "overtrain": OVERTRAIN},
        fixed=dcost.Design(batch=1, chips=CHIPS, experts=experts, overtrain=1),
        tpot_slo=TPOT_SLO,
        loss_target=target_loss(m),
        extras=dcost.LifetimeInputs(inference_tokens=inference_tokens),
    )


def compute(experts=EXPERTS, traffic=TRAFFIC):
    h, m, _ = _specs()
    e = np.asarray(experts, float)
    out = {
        "hardware": HARDWARE,
        "model": MODEL,
        "chips": CHIPS,
        "context": CONTEXT,
        "tpot_slo_s": TPOT_SLO,
        "experts": e,
        "experts_active": float(m.experts_active),
        "target_loss": target_loss(m),
        "deepseek_overtrain": TRAINED_TOKENS / (20.0 * float(m.params_active)),
    }
    s = dcost.optimize(serving_problem(jnp.asarray(e)))  # one call, one scenario per E
    joint = dcost.optimize(
        serving_problem(None, {"experts": (int(e[0]), int(e[-1])), "batch": BATCH})
    )
    out["serving"] = {
        "cost": np.asarray(s.cost),
        "batch": np.asarray(s.design.batch),
        "feasible": np.asarray(s.feasible),
        "tpot_s": np.asarray(s.report.tpot),
        "best": {
            "experts": float(joint.design.experts),
            "batch": float(joint.design.batch),
            "cost": float(joint.cost),
        },
    }
    for d_inf in traffic:
        t = dcost.optimize(lifetime_problem(jnp.asarray(e), d_inf))
        j = dcost.optimize(
            lifetime_problem(
                None,
                d_inf,
                {"batch": BATCH, "experts": (int(e[0]), int(e[-1])), "overtrain": OVERTRAIN},
            )
        )
        c = t.report.cost
        out[f"lifetime_{d_inf:.0e}"] = {
            "inference_tokens": d_inf,
            "total": np.asarray(c.total),
            "pretrain": np.asarray(c.pretrain),
            "inference": np.asarray(c.inference),
            "overtrain": np.asarray(t.design.overtrain),
            "batch": np.asarray(t.design.batch),
            "feasible": np.asarray(t.feasible),
            "loss": np.asarray(t.report.loss),
            "best": {
                "experts": float(j.design.experts),
                "overtrain": float(j.design.overtrain),
                "batch": float(j.design.batch),
                "total": float(j.cost),
                "pretrain": float(j.report.cost.pretrain),
                "inference": float(j.report.cost.inference),
                "loss": float(j.report.loss),
                "feasible": bool(j.feasible),
            },
        }
    return out


def plot(res):
    fig, (ax_s, ax_l) = C.figure(2, width=6.3, height=4.8)
    e, s = res["experts"], res["serving"]
    ok = s["feasible"]
    ax_s.semilogx(
        e[ok],
        s["cost"][ok] * 1e6,
        "o-",
        color=C.COLORS["moe"],
        ms=4,
        label="cost per token, batch optimized per E",
    )
    b = s["best"]
    ax_s.scatter(
        [b["experts"]],
        [b["cost"] * 1e6],
        marker="*",
        s=220,
        color="k",
        zorder=4,
        label=f"optimizer, E and batch free: E = {b['experts']:.0f}, B = {b['batch']:.0f}",
    )
    ax_b = ax_s.twinx()
    ax_b.semilogx(
        e[ok],
        s["batch"][ok],
        "s--",
        color=C.COLORS["grey"],
        ms=3,
        lw=1,
        label="optimal batch (right axis)",
    )
    ax_b.set_ylabel("optimal batch B (sequences)", color=C.COLORS["grey"])
    ax_b.grid(False)
    ax_s.axvline(256, color=C.COLORS["grey"], ls=":", lw=1)
    ax_s.text(
        256 * 1.05,
        0.04,
        "deepseek-v3\n(E = 256)",
        transform=ax_s.get_xaxis_transform(),
        fontsize=8,
        color=C.COLORS["grey"],
    )
    ax_s.set(
        xlabel="routed experts E (k = 8 active)",
        ylabel="cost ($ per million output tokens)",
        title=f"Serving only: $ per token, tpot <= {res['tpot_slo_s'] * 1e3:.0f} ms, "
        f"{res['chips']} chips,\nbatch optimized per E (memory binds)",
    )
    lines = ax_s.get_legend_handles_labels()
    more = ax_b.get_legend_handles_labels()
    ax_s.legend(lines[0] + more[0], lines[1] + more[1], loc="center left", fontsize=8)

    colors = (C.COLORS["dense"], C.COLORS["alt"], C.COLORS["extra"])
    keys = [k for k in res if k.startswith("lifetime_")]
    for key, c, xy_text in zip(keys, colors, ((120, 1.5), (10, 1.12), (10, 1.6)), strict=False):
        r = res[key]
        ok, bb = r["feasible"], r["best"]
        share = bb["pretrain"] / bb["total"]
        ax_l.semilogx(
            e[ok],
            r["total"][ok] / bb["total"],
            "o-",
            color=c,
            ms=4,
            label=f"D_inf = {r['inference_tokens']:.0e} output tokens "
            f"(optimum ${bb['total'] / 1e6:,.1f}M, pretraining {share:.0%})",
        )
        ax_l.scatter([bb["experts"]], [1.0], marker="*", s=220, color="k", zorder=4)
        ax_l.annotate(
            f"optimum E = {bb['experts']:.0f}, r = {bb['overtrain']:.0f}, B = {bb['batch']:,.0f}",
            (bb["experts"], 1.0),
            xytext=xy_text,
            fontsize=8.5,
            color=c,
            arrowprops={"arrowstyle": "->", "color": c},
        )
    ax_l.axvline(256, color=C.COLORS["grey"], ls=":", lw=1)
    ax_l.scatter([], [], marker="*", s=120, color="k", label="optimizer: E, r and batch free")
    ax_l.set(
        xlabel="routed experts E (k = 8 active)",
        ylabel="lifetime cost / optimal lifetime cost",
        title=f"Lifetime $ (pretraining + inference) to reach loss "
        f"{res['target_loss']:.3f},\nr and batch optimized per E",
    )
    ax_l.legend(fontsize=8, loc="upper center")
    ax_l.set_ylim(0.95, None)
    fig.suptitle(
        f"How many experts? {res['model']} shape on {res['hardware']} "
        f"(context {res['context']:,.0f})",
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
            "chips",
            "context",
            "tpot_slo_s",
            "experts_active",
            "target_loss",
            "deepseek_overtrain",
        )
    }
    out["experts"] = res["experts"]
    s = res["serving"]
    out["serving"] = {
        "cost_per_mtok": s["cost"] * 1e6,
        "batch": s["batch"],
        "feasible": s["feasible"],
        "best": s["best"],
    }
    for key in (k for k in res if k.startswith("lifetime_")):
        r = res[key]
        out[key] = {
            k: r[k]
            for k in (
                "inference_tokens",
                "total",
                "pretrain",
                "inference",
                "overtrain",
                "batch",
                "feasible",
                "best",
            )
        }
    return out


def main():
    res = compute()
    C.save("expert_count", plot(res), summary(res))


if __name__ == "__main__":
    main()
