"""How far past Chinchilla should a frontier model be trained, given the traffic it will serve?

Claim (lecture): a model serving 50M output tokens/s for two months (``D_inf = 2.59e14`` tokens)
with 100B active parameters should be pretrained until pretraining FLOPs equal inference FLOPs,
``6 N D = 2 N D_inf``, i.e. ``D = D_inf / 3 = 86T`` tokens, 43x the Chinchilla ``20 N``
(``dcost.lecture_estimate``).

Setting: the loss that 100B parameters reach on those 86T tokens is the target, under each
published fit ("hoffmann2022", "besiroglu2024"). ``dcost.lifetime_optimum`` (Sardana & Frankle
2023) then chooses ``N`` and ``D`` for the least lifetime FLOPs ``6 N D + 2 N D_inf``; it is swept
over ``D_inf`` in one jitted call vmapped over inference tokens and over the two fits. Along the
loss constraint ``D(N) = (B / (L* - E - A N**-alpha))**(1/beta)`` the lifetime FLOPs are drawn
against ``N``. The same question in dollars uses the serving cost of each model size from the
roofline model (a Llama-3-70B-shaped model resized, 8 x H100 per replica, batch 256, 4k context,
training at 40 % MFU on the same chip). Everything runs in float64.

Run: ``python experiments/overtraining.py``.
"""

from __future__ import annotations

import _common as C
import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.lines import Line2D

import dcost

N_ACTIVE = 1e11
TOKENS_PER_S = 5e7
DAYS = 60.0
FITS = ("hoffmann2022", "besiroglu2024")
FIT_COLORS = {"hoffmann2022": C.COLORS["dense"], "besiroglu2024": C.COLORS["moe"]}


def _row(n, d, flops=None, **extra):
    out = {
        "n_params": float(n),
        "n_tokens": float(d),
        "tokens_per_param": float(d / n),
        "overtrain": float(d / (20.0 * n)),
    }
    if flops is not None:
        out["flops"] = float(flops)
    out.update({k: float(v) for k, v in extra.items()})
    return out


@jax.jit
def optimum_sweep(targets, inference_tokens, fits):
    """``dcost.lifetime_optimum`` for every (fit, D_inf) pair: one jitted call, vmapped over the
    stacked fits (with their targets, axis 0) and over ``inference_tokens`` (axis 1)."""
    over_d_inf = jax.vmap(dcost.lifetime_optimum, in_axes=(None, 0, None))
    return jax.vmap(over_d_inf, in_axes=(0, None, 0))(targets, inference_tokens, fits)


def tokens_on_constraint(n_params, target, fit):
    """``D(N)`` with ``L(N, D) = target``: ``(B / (target - E - A N**-alpha))**(1/beta)``;
    ``inf`` where ``N`` alone cannot get below the target (tokens)."""
    room = target - fit.E - fit.A * n_params ** (-fit.alpha)
    return jnp.where(
        room > 0, (fit.B / jnp.where(room > 0, room, 1.0)) ** (1.0 / fit.beta), jnp.inf
    )


def equal_split_inference(target, fit):
    """The ``D_inf`` at which the FLOP optimum spends as much on pretraining as on inference.

    At the optimum ``u / (1 - u) = (beta / alpha)(1 + D_inf / (3 D))`` with
    ``u = A N**-alpha / (L* - E)``; equal FLOPs mean ``D_inf = 3 D``, so ``u = 2 beta / (alpha +
    2 beta)`` and ``D = (B / ((1 - u)(L* - E)))**(1/beta)`` (tokens).
    """
    u = 2.0 * fit.beta / (fit.alpha + 2.0 * fit.beta)
    return 3.0 * (fit.B / ((1.0 - u) * (target - fit.E))) ** (1.0 / fit.beta)


def _serving():
    return dcost.Deployment(
        hardware=dcost.hardware("h100-sxm"),
        model=dcost.model("llama-3-70b"),
        design=dcost.Design(batch=256, chips=8),
        workload=dcost.Workload(4096),
    )


def compute(n_inf=61, n_curve=241, d_inf_range=(1e11, 1e17), n_range=(4e10, 1e12)):
    """The lecture's plan, the FLOP and dollar optima per fit, the ``D_inf`` sweep of the FLOP
    optimum (``n_inf`` log-spaced points in ``d_inf_range``) and the lifetime FLOPs along the loss
    constraint (``n_curve`` log-spaced ``N`` in ``n_range``). Runs in float64."""
    with jax.enable_x64(True):
        return _compute(n_inf, n_curve, d_inf_range, n_range)


def _compute(n_inf, n_curve, d_inf_range, n_range):
    est = dcost.lecture_estimate(TOKENS_PER_S, DAYS, N_ACTIVE)
    d_inf = est.inference_tokens
    lecture_flops = 6.0 * N_ACTIVE * est.n_tokens + 2.0 * N_ACTIVE * d_inf
    res = {
        "inputs": {
            "tokens_per_s": TOKENS_PER_S,
            "days": DAYS,
            "n_active": N_ACTIVE,
            "inference_tokens": d_inf,
        },
        "lecture": _row(N_ACTIVE, est.n_tokens, lecture_flops, train_fraction=0.5),
        "lecture_chinchilla_tokens": est.chinchilla_tokens,
        "fits": {},
    }
    serving = _serving()
    for name in FITS:
        target = dcost.loss(N_ACTIVE, est.n_tokens, name)
        best = dcost.lifetime_optimum(target, d_inf, name)
        ref = dcost.lifetime_optimum(target, 0.0, name)
        inputs = dcost.LifetimeInputs(d_inf, mfu=0.4, fit=name)
        lecture_usd = dcost.lifetime_cost(N_ACTIVE, est.n_tokens, inputs, serving)
        usd = dcost.lifetime_optimum_dollars(target, inputs, serving)
        res["fits"][name] = {
            "target_loss": float(target),
            "flop_optimum": _row(
                best.n_params,
                best.n_tokens,
                best.flops,
                train_fraction=best.train_fraction,
                flop_saving=1.0 - float(best.flops) / lecture_flops,
            ),
            "compute_optimal_same_loss": _row(ref.n_params, ref.n_tokens, ref.flops),
            "dollar_optimum": _row(
                usd.n_params,
                usd.n_tokens,
                cost_usd=usd.cost.total,
                pretrain_usd=usd.cost.pretrain,
                inference_usd=usd.cost.inference,
                cost_per_token_usd=usd.cost.cost_per_token,
            ),
            "lecture_plan_usd": {
                "cost_usd": float(lecture_usd.total),
                "pretrain_usd": float(lecture_usd.pretrain),
                "inference_usd": float(lecture_usd.inference),
            },
            "equal_split_inference_tokens": float(
                equal_split_inference(target, dcost.scaling_fit(name))
            ),
        }

    fits = dcost.stack([dcost.scaling_fit(name) for name in FITS])
    targets = jnp.asarray([res["fits"][name]["target_loss"] for name in FITS])
    d_infs = jnp.logspace(*np.log10(d_inf_range), n_inf)
    sweep = optimum_sweep(targets, d_infs, fits)
    n_grid = jnp.logspace(*np.log10(n_range), n_curve)
    d_grid = jax.vmap(tokens_on_constraint, in_axes=(None, 0, 0))(n_grid, targets, fits)
    res["sweep"] = {"inference_tokens": np.asarray(d_infs)}
    res["curve"] = {
        "n_params": np.asarray(n_grid),
        "inference_flops": np.asarray(2.0 * n_grid * d_inf),
    }
    for i, name in enumerate(FITS):
        res["sweep"][name] = {
            k: np.asarray(getattr(sweep, k)[i])
            for k in ("n_params", "n_tokens", "overtrain", "flops", "train_fraction")
        }
        d = np.asarray(d_grid[i])
        res["curve"][name] = {"n_tokens": d, "pretrain_flops": 6.0 * np.asarray(n_grid) * d}
    return res


def _mark(ax, x, y, marker, color, size=70, face=None, label=None):
    ax.scatter(
        [x],
        [y],
        marker=marker,
        s=size,
        zorder=5,
        edgecolors=color,
        facecolors=color if face is None else face,
        linewidths=1.4,
        label=label,
    )


def plot(res):
    fig, axes = C.figure(2, nrows=2, width=6.6, height=3.7)
    grid = axes[1].get_gridspec()
    axes[1].remove()
    axes[3].remove()
    ax_nd, ax_r = axes[0], axes[2]
    ax_f = fig.add_subplot(grid[:, 1])
    x = res["sweep"]["inference_tokens"]
    lec, d_inf = res["lecture"], res["inputs"]["inference_tokens"]
    for ax in (ax_nd, ax_r):
        ax.axvline(d_inf, color=C.COLORS["grey"], lw=0.9, ls=":")
    ax_r.text(
        d_inf * 1.2,
        0.1,
        "lecture's D_inf:\n50M tok/s x 60 days",
        color=C.COLORS["grey"],
        fontsize=8,
        transform=ax_r.get_xaxis_transform(),
    )
    for name in FITS:
        s, f, c = res["sweep"][name], res["fits"][name], FIT_COLORS[name]
        opt = f["flop_optimum"]
        ax_nd.loglog(x, s["n_params"], "-", color=c, lw=1.8)
        ax_nd.loglog(x, s["n_tokens"], "--", color=c, lw=1.8)
        ax_r.loglog(x, s["overtrain"], "-", color=c, lw=1.8, label=name)
        for ax, key in ((ax_nd, "n_params"), (ax_nd, "n_tokens"), (ax_r, "overtrain")):
            _mark(ax, d_inf, opt[key], "*", c, size=130)
    for ax, key, marker in (
        (ax_nd, "n_params", "o"),
        (ax_nd, "n_tokens", "s"),
        (ax_r, "overtrain", "o"),
    ):
        _mark(ax, d_inf, lec[key], marker, "k", face="none", size=60)
    ax_r.axhline(1.0, color=C.COLORS["grey"], lw=0.9)
    ax_r.text(
        x[0] * 1.3, 1.15, "Chinchilla, 20 tokens per parameter", color=C.COLORS["grey"], fontsize=8
    )
    styles = [Line2D([], [], color=FIT_COLORS[n], lw=1.8, label=n) for n in FITS] + [
        Line2D([], [], color="k", ls="-", label="N*, parameters"),
        Line2D([], [], color="k", ls="--", label="D*, pretraining tokens"),
        Line2D(
            [],
            [],
            color="k",
            marker="*",
            ls="",
            ms=10,
            label="dcost optimum at the lecture's D_inf",
        ),
        Line2D([], [], color="k", marker="o", ls="", mfc="none", label="lecture N = 100B"),
        Line2D([], [], color="k", marker="s", ls="", mfc="none", label="lecture D = D_inf / 3"),
    ]
    ax_nd.legend(handles=styles, loc="upper left", fontsize=7.5, ncol=2)
    ax_nd.set(
        xlabel="inference tokens served D_inf (tokens)",
        ylabel="N* (parameters), D* (tokens)",
        ylim=(2e10, 3e16),
        title="Lifetime-optimal size and data at the lecture's target loss",
    )
    ax_r.set(
        xlabel="inference tokens served D_inf (tokens)",
        ylabel="over-training r = D*/(20 N*) (x Chinchilla)",
        title=f"Over-training ratio (circle: lecture, r = {lec['overtrain']:.1f})",
    )
    ax_r.legend(loc="upper left", fontsize=8)

    n = res["curve"]["n_params"]
    inf_flops = res["curve"]["inference_flops"]
    ax_f.loglog(
        n, inf_flops, ":", color=C.COLORS["grey"], lw=2.0, label="inference 2 N D_inf (both fits)"
    )
    for name in FITS:
        cv, f, c = res["curve"][name], res["fits"][name], FIT_COLORS[name]
        ok = np.isfinite(cv["pretrain_flops"])
        ax_f.loglog(
            n[ok],
            cv["pretrain_flops"][ok],
            "--",
            color=c,
            lw=1.6,
            label=f"{name}: pretraining 6 N D(N)",
        )
        ax_f.loglog(
            n[ok],
            cv["pretrain_flops"][ok] + inf_flops[ok],
            "-",
            color=c,
            lw=2.0,
            label=f"{name}: lifetime total",
        )
        opt = f["flop_optimum"]
        _mark(
            ax_f,
            opt["n_params"],
            opt["flops"],
            "*",
            c,
            size=170,
            label=f"{name} optimum: N* = {opt['n_params'] / 1e9:.0f}B, "
            f"D* = {opt['n_tokens'] / 1e12:.0f}T,\n  {100 * opt['flop_saving']:.1f}% "
            f"fewer FLOPs than the lecture, pretraining {100 * opt['train_fraction']:.0f}%",
        )
    _mark(
        ax_f,
        N_ACTIVE,
        lec["flops"],
        "o",
        "k",
        face="none",
        size=80,
        label=f"lecture plan: N = 100B, D = 86T, total {lec['flops']:.3g} FLOP",
    )
    _mark(
        ax_f,
        N_ACTIVE,
        lec["flops"] / 2,
        "o",
        "k",
        size=45,
        label="lecture's equal split: 6 N D = 2 N D_inf",
    )
    ax_f.set(
        xlabel="active parameters N on the loss constraint L(N, D) = L* (parameters)",
        ylabel="lifetime FLOPs (FLOP)",
        ylim=(4e23, 1e27),
        title="Lifetime FLOPs along the constraint at the lecture's D_inf = "
        f"{d_inf:.3g} tokens\n(star: dcost.lifetime_optimum)",
    )
    ax_f.legend(loc="lower right", fontsize=8)
    targets = ", ".join(f"{n} {res['fits'][n]['target_loss']:.3f}" for n in FITS)
    fig.suptitle(
        "Over-training for inference: target loss = loss of 100B parameters on 86T tokens "
        f"({targets} nats/token)",
        fontsize=12,
    )
    fig.tight_layout()
    return fig


def summary(res):
    keys = ("inputs", "lecture", "fits")
    out = {k: res[k] for k in keys}
    s = res["sweep"]["inference_tokens"]
    out["sweep"] = {"inference_tokens_range": [s[0], s[-1]], "points": len(s)}
    return out


def report(res):
    """The numbers in words (stdout)."""
    lec, d_inf = res["lecture"], res["inputs"]["inference_tokens"]
    print("Lecture estimate: serve 50M tokens/s for 60 days, equalize 6 N D = 2 N D_inf")
    print(f"  D_inf = 5e7 * 86400 * 60 = {d_inf:.3e} tokens")
    print(
        f"  D = D_inf / 3 = {lec['n_tokens']:.3e} tokens = {lec['overtrain']:.1f}x Chinchilla "
        f"(20 N = {res['lecture_chinchilla_tokens']:.1e}) for N = {N_ACTIVE:.0e}"
    )
    print("  (the quoted ~150T tokens / ~100x needs ~1.7x costlier inference FLOPs or ~104 days)")
    for name in FITS:
        f = res["fits"][name]
        best, ref, usd = f["flop_optimum"], f["compute_optimal_same_loss"], f["dollar_optimum"]
        print(
            f"\n{name}: target loss {f['target_loss']:.4f} (100B on {lec['n_tokens']:.3g} tokens)"
        )
        print(
            f"  FLOP optimum     N = {best['n_params']:.3g}, D = {best['n_tokens']:.3g} "
            f"({best['overtrain']:.1f}x Chinchilla), pretraining "
            f"{100 * best['train_fraction']:.0f}% of FLOPs, {100 * best['flop_saving']:.1f}% "
            "fewer FLOPs than the lecture's plan"
        )
        print(
            f"  no inference     N = {ref['n_params']:.3g}, D = {ref['n_tokens']:.3g} "
            f"({ref['overtrain']:.2f}x)"
        )
        print(
            f"  dollar optimum   N = {usd['n_params']:.3g}, D = {usd['n_tokens']:.3g} "
            f"({usd['overtrain']:.1f}x), ${usd['cost_usd'] / 1e6:.0f}M vs "
            f"${f['lecture_plan_usd']['cost_usd'] / 1e6:.0f}M for the lecture's plan; serving "
            f"${usd['cost_per_token_usd'] * 1e6:.3f} per M tokens"
        )
        print(
            f"  equal pretraining and inference FLOPs are optimal at D_inf = "
            f"{f['equal_split_inference_tokens']:.3g} tokens"
        )


def main():
    res = compute()
    report(res)
    C.save("overtraining", plot(res), summary(res))


if __name__ == "__main__":
    main()
