"""Pricing as a side channel: planted values recovered from the model's own prices, and what the
published price sheets of Anthropic, Google, OpenAI and DeepSeek imply about KV bytes per token,
active parameters, hardware FLOP/byte and margin, with Laplace uncertainty.

Writes ``experiments/results/pricing_side_channel.json`` and ``.png``. Run:
``python experiments/pricing_side_channel.py``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np

import dcost
from dcost import pricing

RESULTS = Path(__file__).resolve().parent / "results"

NOISE = 0.05  # sd of the log-normal noise put on planted prices
# Published checks of the DeepSeek fits (sources in price_sheets.toml): MLA KV bytes per token, and
# DeepSeek's theoretical revenue / cost at R1 prices for 2025-02-27/28.
DEEPSEEK_KV = 61 * (512 + 64) * 2.0
DEEPSEEK_R1_PRICE_OVER_COST = 562027.0 / 87072.0


def _combo_sd(fit, coeffs):
    """sd of sum_j coeffs_j log theta_j under the Laplace covariance."""
    a = np.array([coeffs.get(k, 0.0) for k in pricing.PARAMS])
    return float(math.sqrt(a @ np.asarray(fit.log_cov, dtype=float) @ a))


def _planted(rng):
    serving = pricing.Serving(dcost.hardware("h100-sxm"))
    rows = []
    for case, truth in pricing.PLANTED.items():
        y = pricing.predict_prices(truth, serving)
        for anchor in ("params_active", "margin"):
            prior = {anchor: (truth[anchor], 1.01)}
            clean = pricing.fit_prices({k: float(v) for k, v in y.items()}, serving, prior=prior)
            noisy_prices = {
                k: float(v) * math.exp(NOISE * rng.standard_normal()) for k, v in y.items()
            }
            noisy = pricing.fit_prices(noisy_prices, serving, prior=prior, sigma=NOISE)
            status = pricing.identifiability(noisy).status
            for k in pricing.PARAMS:
                rows.append(
                    {
                        "case": case,
                        "anchor": anchor,
                        "param": k,
                        "truth": truth[k],
                        "noise_free": float(clean.values[k]),
                        "noise_free_error": float(clean.values[k]) / truth[k] - 1.0,
                        "noisy": float(noisy.values[k]),
                        "noisy_log_sd": float(noisy.log_sd[k]),
                        "z": math.log(float(noisy.values[k]) / truth[k]) / float(noisy.log_sd[k]),
                        "status": status[k],
                    }
                )
    return rows


def _sheets():
    out = {}
    for name, sheet in pricing.price_sheets().items():
        fit = pricing.fit_sheet(sheet)
        rep = pricing.identifiability(fit)
        v, sd = fit.values, fit.log_sd
        entry = {
            "provider": sheet.provider,
            "model": sheet.model,
            "page": sheet.page,
            "published": sheet.published,
            "retrieved": sheet.retrieved,
            "prices_per_million": {
                k: p * (1e6 * 3600.0 if k == "cache_storage" else 1e6)
                for k, p in sheet.prices.items()
            },
            "anchors": {k: list(x) for k, x in sheet.prior.items()},
            "serving_overrides": sheet.serving,
            "values": {k: float(v[k]) for k in pricing.PARAMS},
            "log_sd": {k: float(sd[k]) for k in pricing.PARAMS},
            "status": rep.status,
            "residuals": {
                k: float(r)
                for k, r, m in zip(pricing.KINDS, fit.residuals, fit.mask, strict=True)
                if m
            },
            "condition": rep.condition,
            "singular": rep.singular,
            "kv_per_param": float(v["kv_bytes_per_token"] / v["params_active"]),
            "kv_per_param_log_sd": _combo_sd(
                fit, {"kv_bytes_per_token": 1.0, "params_active": -1.0}
            ),
            "margin_x_params": float(v["margin"] * v["params_active"]),
            "margin_x_params_log_sd": _combo_sd(fit, {"margin": 1.0, "params_active": 1.0}),
            "converged_grad_norm": float(fit.grad_norm),
        }
        out[name] = entry
    r1 = out.get("deepseek-r1")
    checks = {}
    if r1 is not None:
        checks = {
            "deepseek_r1_kv_bytes": {
                "fitted": r1["values"]["kv_bytes_per_token"],
                "log_sd": r1["log_sd"]["kv_bytes_per_token"],
                "published_architecture": DEEPSEEK_KV,
            },
            "deepseek_r1_margin": {
                "fitted": r1["values"]["margin"],
                "log_sd": r1["log_sd"]["margin"],
                "published_day_average": DEEPSEEK_R1_PRICE_OVER_COST,
            },
        }
    return out, checks


def _sensitivity(names=("deepseek-r1", "anthropic-claude-sonnet-4")):
    """How the fits move with the serving convention (the Laplace error bars do not include it)."""
    out = {}
    sheets = pricing.price_sheets()
    base = pricing.serving_for()
    for name in names:
        sheet = sheets[name]
        batch = float(sheet.serving.get("batch", base.batch))
        hold = float(sheet.serving.get("cache_hold_s", base.cache_hold_s))
        rows = {}
        for label, change in (
            ("batch/2", {"batch": batch / 2}),
            ("batch*2", {"batch": batch * 2}),
            ("hold/10", {"cache_hold_s": hold / 10}),
            ("hold*10", {"cache_hold_s": hold * 10}),
        ):
            moved = dataclasses.replace(sheet, serving={**sheet.serving, **change})
            fit = pricing.fit_sheet(moved)
            rows[label] = {k: float(fit.values[k]) for k in pricing.PARAMS}
        out[name] = rows
    return out


def compute() -> dict:
    rng = np.random.default_rng(0)
    planted = _planted(rng)
    sheets, checks = _sheets()
    serving = pricing.serving_for()
    return {
        "assumptions": {
            k: float(getattr(serving, k))
            for k in (
                "chips",
                "batch",
                "context",
                "context_long",
                "bytes_per_param",
                "sparsity",
                "attn_flops_per_kv_byte",
                "cache_hold_s",
                "smoothness",
            )
        },
        "reference_chip": "h100-sxm",
        "noise": NOISE,
        "planted": planted,
        "max_noise_free_error": max(abs(r["noise_free_error"]) for r in planted),
        "sheets": sheets,
        "published_checks": checks,
        "sensitivity_to_assumptions": _sensitivity(),
    }


def plot(results: dict, path: Path | None = None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 4, figsize=(19, 4.8))
    ax = axes[0]
    markers = {
        "kv_bytes_per_token": "o",
        "params_active": "s",
        "flops_per_byte": "^",
        "margin": "D",
    }
    for k, mk in markers.items():
        rows = [r for r in results["planted"] if r["param"] == k and r["anchor"] != k]
        t = np.array([r["truth"] for r in rows])
        y = np.array([r["noisy"] for r in rows])
        s = np.array([r["noisy_log_sd"] for r in rows])
        ax.errorbar(
            y / t,
            np.arange(len(rows)) + 0.15 * list(markers).index(k),
            xerr=[y / t - y / t * np.exp(-s), y / t * np.exp(s) - y / t],
            fmt=mk,
            label=k,
            capsize=2,
            ms=4,
        )
    ax.axvline(1.0, color="k", lw=0.8)
    ax.axvspan(0.95, 1.05, color="0.9")
    ax.set_xscale("log")
    ax.set_xlabel(f"recovered / planted ({results['noise']:.0%} price noise, 1-sigma Laplace)")
    ax.set_yticks([])
    ax.set_title("planted values (6 cases, anchor excluded)")
    ax.legend(fontsize=7)

    names = list(results["sheets"])
    labels = [results["sheets"][n]["model"].split(" (")[0] for n in names]
    yy = np.arange(len(names))

    def panel(ax, key, sd_key, scale, title, xlabel):
        vals = np.array([results["sheets"][n][key] for n in names]) * scale
        sds = np.array([results["sheets"][n][sd_key] for n in names])
        ax.errorbar(
            vals,
            yy,
            xerr=[vals - vals * np.exp(-sds), vals * np.exp(sds) - vals],
            fmt="o",
            capsize=3,
        )
        ax.set_xscale("log")
        ax.set_yticks(yy)
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)

    def param_panel(ax, k, scale, title, xlabel):
        vals = np.array([results["sheets"][n]["values"][k] for n in names]) * scale
        sds = np.array([results["sheets"][n]["log_sd"][k] for n in names])
        for i, n in enumerate(names):
            st = results["sheets"][n]["status"][k]
            ax.errorbar(
                [vals[i]],
                [i],
                xerr=[[vals[i] - vals[i] * np.exp(-sds[i])], [vals[i] * np.exp(sds[i]) - vals[i]]],
                fmt="o",
                mfc="C0" if st == "pinned" else "white",
                color="C0",
                capsize=3,
            )
        ax.set_xscale("log")
        ax.set_yticks(yy)
        ax.set_yticklabels(labels, fontsize=8)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel(xlabel)

    param_panel(axes[1], "flops_per_byte", 1.0, "hardware F/BW (filled: pinned)", "FLOP / byte")
    panel(
        axes[2],
        "kv_per_param",
        "kv_per_param_log_sd",
        1e9,
        "KV bytes per token per active parameter",
        "bytes per token per 1e9 parameters",
    )
    param_panel(axes[3], "margin", 1.0, "margin (hollow: set by the prior)", "price / cost")
    chk = results["published_checks"].get("deepseek_r1_margin")
    if chk:
        axes[3].axvline(
            chk["published_day_average"],
            color="C3",
            lw=0.8,
            ls="--",
            label="DeepSeek's own day average (R1 prices)",
        )
        axes[3].legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def main():
    RESULTS.mkdir(parents=True, exist_ok=True)
    results = compute()
    (RESULTS / "pricing_side_channel.json").write_text(json.dumps(results, indent=2))
    plot(results, RESULTS / "pricing_side_channel.png")
    print(
        f"planted, noise free: max |recovered/planted - 1| = "
        f"{results['max_noise_free_error']:.3%} over {len(results['planted'])} values"
    )
    zs = [abs(r["z"]) for r in results["planted"] if r["param"] != r["anchor"]]
    print(
        f"planted, {results['noise']:.0%} noise: |error|/Laplace sd: median "
        f"{np.median(zs):.2f}, max {max(zs):.2f}"
    )
    print(f"{'sheet':28s} {'b_kv kB':>16s} {'N active B':>16s} {'F/BW':>14s} {'margin':>14s}")
    for name, s in results["sheets"].items():
        cells = []
        for k, scale in (
            ("kv_bytes_per_token", 1e-3),
            ("params_active", 1e-9),
            ("flops_per_byte", 1.0),
            ("margin", 1.0),
        ):
            cells.append(
                f"{s['values'][k] * scale:7.3g} x{math.exp(s['log_sd'][k]):4.2f}"
                f"{'' if s['status'][k] == 'pinned' else '*'}"
            )
        print(f"{name:28s} " + " ".join(f"{c:>16s}" for c in cells))
    print("(x f: one-sigma multiplicative Laplace error; *: not pinned by the prices)")
    for name, c in results["published_checks"].items():
        print(name, json.dumps(c))
    for name, rows in results["sensitivity_to_assumptions"].items():
        for label, v in rows.items():
            print(f"{name} with {label}: " + ", ".join(f"{k} {x:.3g}" for k, x in v.items()))


if __name__ == "__main__":
    main()
