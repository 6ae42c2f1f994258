"""MoE over racks: expert parallelism inside one scale-up domain, and pipelining across domains.

Claim (lecture): an MoE's all-to-all belongs on the scale-up network (NVLink, ICI). Spreading the
experts of one stage over more chips than a domain holds (``G > S``) sends the all-to-all over the
scale-out network, ~8x slower, and the cost jumps. Across domains, pipeline instead: a stage's
all-to-all moves ``2 k d`` bytes per token per MoE layer over scale-up links, a hop moves ``d``
bytes once over scale-out, so pipelining across domains pays while

    2 x k x (MoE layers per stage) > U / O            (lecture: "> 8")

Setting: deepseek-v3 (fp8 weights on fp8 FLOP/s, k = 8 of 256 experts, 58 MoE layers) on
h100-sxm (S = 8, U/O = 9) and gb200-nvl72 (S = 72, U/O = 18), mean context 4096. Each design's
batch is the cheapest whole batch (log grid) with ``tpot <= 50 ms`` and
``memory_per_chip <= 0.9 M``; every sweep is one vmapped call of the exact ``dcost.decode``.

Run: ``python experiments/moe_racks.py``.
"""

from __future__ import annotations

import _common as C
import jax
import numpy as np

import dcost

MODEL, CONTEXT = "deepseek-v3", 4096.0
HARDWARE = {"h100-sxm": 256, "gb200-nvl72": 576}  # name: most chips per replica swept
TPOT_SLO, MEMORY_RESERVE = 0.050, 0.10
TIE = 1e-5  # relative cost difference treated as a tie (float32 rounding on a flat plateau)
RULE_K = (1.0, 2.0, 8.0)  # experts per token for the rule panel (8: deepseek-v3 itself)


def best_over_batch(hardware, model, chips, stages, batches):
    """Cheapest feasible batch (the fastest among ties) for each (chips, stages) design.

    Returns the exact report at that batch (fields of the designs' shape) and a feasibility mask.
    """
    cap = (1 - MEMORY_RESERVE) * float(hardware.hbm_capacity)
    r = C.decode_sweep(
        np.asarray(batches)[None, :],
        np.asarray(chips, float)[:, None],
        np.asarray(stages, float)[:, None],
        hardware,
        model,
        CONTEXT,
    )
    tpot, cost = np.asarray(r.tpot), np.asarray(r.cost_per_token)
    ok = (tpot <= TPOT_SLO) & (np.asarray(r.memory_per_chip) <= cap)
    best = np.min(np.where(ok, cost, np.inf), axis=1, keepdims=True)
    # ties (cost flat in batch once the all-to-all or compute binds): the fastest of them
    tie = ok & (cost <= best * (1 + TIE))
    i = np.argmin(np.where(tie, tpot, np.inf), axis=1)
    rows = np.arange(len(i))
    return (
        jax.tree.map(lambda x: np.asarray(x)[rows, i], r),
        ok.any(axis=1),
        np.asarray(batches)[i],
    )


def rule_crossing(hardware, model, k):
    """MoE layers per stage where a stage's all-to-all time equals its hop time (dcost, G = S).

    Both scale with the batch, so batch 1 is used; ``P`` sweeps continuously and the crossing is
    interpolated in log space. Closed form: ``L_moe/P = (U/O) / (2k) * G/(G-1)``.
    """
    m = dcost.model(MODEL, experts_active=k)
    s = hardware.scaleup_size
    stages = np.exp(np.linspace(np.log(1.01), np.log(400.0), 400))
    r = C.decode_sweep(1.0, s, stages, hardware, m, CONTEXT)
    per_stage = np.asarray(m.moe_layers / stages)
    ratio = np.asarray(r.t_comm / r.t_hop)  # decreasing in P
    crossing = float(np.exp(np.interp(0.0, np.log(ratio[::-1]), np.log(per_stage[::-1]))))
    closed = float(hardware.scaleup_bandwidth / hardware.scaleout_bandwidth / (2 * k) * s / (s - 1))
    return crossing, closed


def compute(n_batches=240, max_chips=None):
    """Sweeps per hardware; ``max_chips`` (name -> chips) overrides ``HARDWARE``'s limits."""
    m = dcost.model(MODEL)
    batches = C.log_batches(2e5, n_batches)
    out = {
        "model": MODEL,
        "context": CONTEXT,
        "tpot_slo_s": TPOT_SLO,
        "experts_active": float(m.experts_active),
        "moe_layers": float(m.moe_layers),
    }
    for name, most in {**HARDWARE, **(max_chips or {})}.items():
        h = dcost.presets.serving_hardware(name, MODEL)
        s = float(h.scaleup_size)
        # expert parallel over G chips, one stage (G > S spills onto scale-out),
        g = np.arange(1.0, most + 1.0)
        # and pipeline across domains: G = S chips per stage, P = N / S stages; one call for both
        p = np.arange(1.0, most / s + 1.0)
        r, ok, b = best_over_batch(
            h,
            m,
            np.concatenate([g, np.full_like(p, s)]),
            np.concatenate([np.ones_like(g), p]),
            batches,
        )
        fields = {
            "feasible": np.asarray(ok),
            "batch": np.asarray(b),
            "cost": np.asarray(r.cost_per_token),
            "tpot_s": np.asarray(r.tpot),
            "bottleneck": dcost.bottleneck(r),
        }
        n = len(g)
        ep = {"chips": g, **{k: v[:n] for k, v in fields.items()}}
        pp = {"chips": p * s, "stages": p, **{k: v[n:] for k, v in fields.items()}}
        rules = {f"{k:g}": rule_crossing(h, m, k) for k in RULE_K}
        out[name] = {
            "scaleup_size": s,
            "u_over_o": float(h.scaleup_bandwidth / h.scaleout_bandwidth),
            "ep": ep,
            "pp": pp,
            "rule": rules,
        }
    return out


def _first_feasible(d):
    return int(np.argmax(d["feasible"]))


def plot(res):
    fig, axes = C.figure(2, width=6.2, height=4.6, nrows=2)
    ax_c, ax_t, ax_p, ax_r = axes
    colors = {"h100-sxm": C.COLORS["dense"], "gb200-nvl72": C.COLORS["moe"]}
    for name, c in colors.items():
        r = res[name]
        ep, pp, s = r["ep"], r["pp"], r["scaleup_size"]
        ok = ep["feasible"]
        ax_c.loglog(
            ep["chips"][ok],
            ep["cost"][ok] * 1e6,
            color=c,
            lw=1.8,
            label=f"{name} (S = {s:.0f}, U/O = {r['u_over_o']:.0f})",
        )
        ax_t.loglog(ep["chips"][ok], ep["tpot_s"][ok] * 1e3, color=c, lw=1.8, label=name)
        comm = ok & (ep["bottleneck"] == "comm")
        ax_t.scatter(ep["chips"][comm], ep["tpot_s"][comm] * 1e3, color=c, s=6, zorder=3)
        ax_c.scatter(ep["chips"][comm], ep["cost"][comm] * 1e6, color=c, s=6, zorder=3)
        for ax in (ax_c, ax_t, ax_p):
            ax.axvline(s, color=c, ls=":", lw=1)
            ax.text(
                s * 1.04,
                0.02,
                f"S = {s:.0f}",
                transform=ax.get_xaxis_transform(),
                color=c,
                fontsize=8.5,
            )
        first = ep["chips"][_first_feasible(ep)]
        if first > s:
            i = _first_feasible(ep)
            ax_c.annotate(
                f"{res['model']} fits from G = {first:.0f}",
                (first, ep["cost"][i] * 1e6),
                xytext=(25, -5),
                textcoords="offset points",
                color=c,
                fontsize=8.5,
                arrowprops={"arrowstyle": "->", "color": c},
            )
        okp = pp["feasible"]
        ax_p.loglog(
            ep["chips"][ok],
            ep["cost"][ok] * 1e6,
            color=c,
            lw=1.2,
            alpha=0.6,
            label=f"{name}: expert parallel, P = 1, G = chips",
        )
        ax_p.loglog(
            pp["chips"][okp],
            pp["cost"][okp] * 1e6,
            "o--",
            color=c,
            ms=4,
            lw=1.5,
            label=f"{name}: pipeline, G = {s:.0f}, P = chips / {s:.0f}",
        )
    for ax in (ax_c, ax_t):
        ax.scatter([], [], color="k", s=6, label="dots: the all-to-all binds")
    for name, c, dy in (("h100-sxm", C.COLORS["dense"], 30), ("gb200-nvl72", C.COLORS["moe"], 25)):
        ep, pp = res[name]["ep"], res[name]["pp"]
        n = _crossover(ep, pp, res[name]["scaleup_size"])
        j, k = int(np.searchsorted(ep["chips"], n)), int(np.searchsorted(pp["chips"], n))
        ax_p.annotate(
            f"pipeline cheaper from {n:.0f} chips\n({ep['cost'][j] / pp['cost'][k]:.2f}x"
            " cheaper there)",
            (n, pp["cost"][k] * 1e6),
            xytext=(10, dy),
            textcoords="offset points",
            color=c,
            fontsize=8.5,
            arrowprops={"arrowstyle": "->", "color": c},
        )
    ax_c.set(
        xlabel="chips per stage G (expert parallel, one stage)",
        ylabel="cost ($ per million output tokens)",
        ylim=(0.09, 10),
        title="Spilling the all-to-all past the scale-up domain",
    )
    ax_t.set(
        xlabel="chips per stage G (expert parallel, one stage)",
        ylabel="time per output token (ms)",
        title="tpot at the cheapest feasible batch",
    )
    ax_p.set(
        xlabel="chips per replica (P x G)",
        ylabel="cost ($ per million output tokens)",
        title="Across domains: pipeline stages against spilling the experts",
    )
    ax_c.legend(fontsize=8, loc="upper right")
    for ax in (ax_t, ax_p):
        ax.legend(fontsize=8, loc="upper left")
    # the rule
    lstage = np.logspace(-1, np.log10(60), 50)
    for k, ls in zip(RULE_K, (":", "--", "-"), strict=True):
        ax_r.loglog(
            lstage, 2 * k * lstage, ls, color="k", lw=1.2, label=f"2 x k x L_stage, k = {k:g}"
        )
    for name, c in colors.items():
        r = res[name]
        ax_r.axhline(r["u_over_o"], color=c, lw=1.2, label=f"U/O of {name} = {r['u_over_o']:.0f}")
        for k in RULE_K:
            x, _ = r["rule"][f"{k:g}"]
            ax_r.scatter([x], [r["u_over_o"]], color=c, s=40, zorder=3)
    ax_r.axvline(res["moe_layers"], color=C.COLORS["grey"], lw=0.8)
    ax_r.text(
        res["moe_layers"] / 1.1,
        0.15,
        f"all {res['moe_layers']:.0f} MoE layers\nof {res['model']} in one stage",
        ha="right",
        fontsize=8,
        color=C.COLORS["grey"],
    )
    ax_r.set(
        xlabel="MoE layers per stage L_stage",
        ylim=(0.1, 3000),
        ylabel="scale-up bytes per hop byte (2 k L_stage)",
        title="Rule: pipelining across domains pays above U/O\n(dots: dcost's "
        "t_comm = t_hop crossing)",
    )
    ax_r.legend(fontsize=7.5, loc="upper left")
    fig.suptitle(
        f"{res['model']} over racks: expert parallel inside the domain, pipeline "
        f"across (context {res['context']:,.0f}, tpot <= 50 ms)",
        fontsize=12,
    )
    fig.tight_layout()
    return fig


def _point(d, i):
    """Cost, tpot and binding term of design ``i``; nan where no batch is feasible."""
    if not d["feasible"][i]:
        return {"chips": d["chips"][i], "feasible": False}
    return {
        "chips": d["chips"][i],
        "cost_per_mtok": d["cost"][i] * 1e6,
        "tpot_ms": d["tpot_s"][i] * 1e3,
        "bottleneck": str(d["bottleneck"][i]),
    }


def _crossover(ep, pp, s):
    """Fewest chips (a multiple of S, > S) at which pipelining beats expert parallel."""
    for n, cost, ok in zip(pp["chips"], pp["cost"], pp["feasible"], strict=True):
        j = int(np.searchsorted(ep["chips"], n))
        if ok and n > s and (not ep["feasible"][j] or cost < ep["cost"][j]):
            return float(n)
    return float("nan")


def summary(res):
    out = {k: res[k] for k in ("model", "context", "tpot_slo_s", "experts_active", "moe_layers")}
    out["lecture"] = {"rule": "2 x k x layers_per_stage > U/O (~8)", "scaleout_slowdown": 8}
    for name in HARDWARE:
        r = res[name]
        ep, pp, s = r["ep"], r["pp"], r["scaleup_size"]
        at_s = int(np.searchsorted(ep["chips"], s))
        ok = ep["feasible"]
        best = int(np.argmin(np.where(ok, ep["cost"], np.inf)))
        over = {}
        for n, cost_pp, okp in zip(pp["chips"], pp["cost"], pp["feasible"], strict=True):
            j = int(np.searchsorted(ep["chips"], n))
            if okp and n > s and ep["feasible"][j] and (n / s) in (2, 4, 8, 16, 32):
                over[f"{n:.0f}"] = {
                    "ep_cost_per_mtok": ep["cost"][j] * 1e6,
                    "pp_cost_per_mtok": cost_pp * 1e6,
                    "ep_bottleneck": str(ep["bottleneck"][j]),
                    "ep_over_pp": ep["cost"][j] / cost_pp,
                }
        out[name] = {
            "scaleup_size": s,
            "u_over_o": r["u_over_o"],
            "min_feasible_chips": ep["chips"][_first_feasible(ep)],
            "ep_best": {
                "chips": ep["chips"][best],
                "cost_per_mtok": ep["cost"][best] * 1e6,
                "tpot_ms": ep["tpot_s"][best] * 1e3,
                "batch": ep["batch"][best],
            },
            "ep_at_s": _point(ep, at_s),
            "ep_at_2s": _point(ep, int(np.searchsorted(ep["chips"], 2 * s))),
            "pp_crossover_chips": _crossover(ep, pp, s),
            "first_comm_bound_chips": float(
                ep["chips"][np.argmax(ok & (ep["bottleneck"] == "comm"))]
            ),
            "ep_vs_pp_same_chips": over,
            "rule_crossing_layers_per_stage": {
                k: {"dcost": v[0], "closed_form": v[1]} for k, v in r["rule"].items()
            },
        }
    return out


def main():
    res = compute()
    C.save("moe_racks", plot(res), summary(res))


if __name__ == "__main__":
    main()
