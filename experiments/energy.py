"""Joules per token against batch, and tokens per megawatt across GPU generations.

Questions (issue 32): how does the energy of a token fall with batch, beside its rental cost (the
lecture's cost curve)? And how many tokens per second does a megawatt of chips buy on each GPU
generation?

Setting: ``dcost.energy`` on each chip's calibrated family profile (``dcost.hardware(name,
calibrated=True)``; the step takes the time it takes in practice), its datasheet board power and
the idle floor fitted on AIConfigurator's B200 kernel power (``dcost.serving.power``). Left: decode
of llama-3.1-8b (bf16, one chip, context 1,024 tokens) on an H100 and a B200, batch 1 to the
memory limit: J per output token (solid) and $ per million output tokens at the rental price
(dashed, right axis). Right: the most output tokens/s per MW of chip power each chip reaches with
time per output token within 50 ms and the weights and KV cache in HBM, for a dense model
(llama-3.1-8b) and an MoE (qwen3-30b-a3b), one chip each, bf16. Chip power only: multiply by a
PUE (and add hosts and network) for the facility.

Run: ``python experiments/energy.py``.
"""

from __future__ import annotations

import _common as C
import jax
import jax.numpy as jnp
import numpy as np

import dcost

CURVE_CHIPS = ("h100-sxm", "b200")
GENERATIONS = ("a100-80gb", "h100-sxm", "h200", "b200", "b300")
MODELS = {"dense": "llama-3.1-8b", "moe": "qwen3-30b-a3b"}
CONTEXT = 1024.0
TPOT_SLO = 0.05
RESERVE = 0.1  # HBM held back for activations and fragmentation, as Problem's default


@jax.jit
def sweep(batch, hardware, model):
    """Energy and decode reports over a vector of batches (one vmapped call)."""

    def one(b):
        d, w = dcost.Design(batch=b), dcost.Workload(CONTEXT)
        return dcost.energy(d, hardware, model, w), dcost.decode(d, hardware, model, w)

    return jax.vmap(one)(batch)


def compute(max_batch: float = 1024.0, n: int = 60):
    """The curves (left panel) and the best tokens per MW per chip and model (right panel)."""
    batches = jnp.asarray(np.unique(np.round(np.logspace(0, np.log10(max_batch), n))))
    out: dict = {"batch": np.asarray(batches), "curves": {}, "generations": {}}
    m8 = dcost.model(MODELS["dense"])
    for name in CURVE_CHIPS:
        h = dcost.hardware(name, calibrated=True)
        e, r = sweep(batches, h, m8)
        fits = np.asarray(r.memory_per_chip) <= (1 - RESERVE) * float(h.hbm_capacity)
        out["curves"][name] = {
            "fits": fits,
            "energy_per_token": np.asarray(e.energy_per_token),
            "power_per_chip": np.asarray(e.power_per_chip),
            "cost_per_million": np.asarray(r.cost_per_token) * 1e6,
            "tpot": np.asarray(r.tpot),
            "idle_power": float(h.idle_power),
            "max_power": float(h.max_power),
        }
    for kind, model_name in MODELS.items():
        m = dcost.model(model_name)
        rows = []
        for name in GENERATIONS:
            h = dcost.hardware(name, calibrated=True)
            e, r = sweep(batches, h, m)
            ok = (np.asarray(r.memory_per_chip) <= (1 - RESERVE) * float(h.hbm_capacity)) & (
                np.asarray(r.tpot) <= TPOT_SLO
            )
            per_mw = np.where(ok, np.asarray(e.tokens_per_mw), 0.0)
            i = int(np.argmax(per_mw))
            rows.append(
                {
                    "hardware": name,
                    "feasible": bool(ok.any()),
                    "batch": float(batches[i]),
                    "tokens_per_mw": float(per_mw[i]),
                    "power_per_chip": float(e.power_per_chip[i]),
                    "energy_per_token": float(e.energy_per_token[i]),
                    "tpot": float(r.tpot[i]),
                }
            )
        out["generations"][kind] = {"model": model_name, "rows": rows}
    return out


def plot(res):
    fig, (ax, ax_g) = C.figure(2, width=6.2, height=4.6)
    ax_c = ax.twinx()
    colors = {"h100-sxm": C.COLORS["dense"], "b200": C.COLORS["moe"]}
    b = res["batch"]
    for name, c in res["curves"].items():
        ok = c["fits"]
        ax.plot(b[ok], c["energy_per_token"][ok], "-", color=colors[name], lw=2, label=name)
        ax_c.plot(b[ok], c["cost_per_million"][ok], "--", color=colors[name], lw=1.3)
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="batch (sequences per step)",
        ylabel="energy (J per output token), solid",
        title=f"llama-3.1-8b decode, one chip, context {CONTEXT:.0f}",
    )
    ax_c.set(yscale="log", ylabel="rental cost ($ per million output tokens), dashed")
    ax_c.grid(False)
    ax.legend(loc="upper right", title="calibrated chip")
    names = [r["hardware"] for r in res["generations"]["dense"]["rows"]]
    pos = np.arange(len(names))
    width = 0.38
    for j, (kind, color) in enumerate((("dense", C.COLORS["dense"]), ("moe", C.COLORS["moe"]))):
        g = res["generations"][kind]
        vals = [r["tokens_per_mw"] / 1e6 for r in g["rows"]]
        bars = ax_g.bar(pos + (j - 0.5) * width, vals, width, color=color, label=g["model"])
        for bar, v, r in zip(bars, vals, g["rows"], strict=True):
            text = f"{v:.1f}" if r["feasible"] else "n/a"
            ax_g.text(
                bar.get_x() + bar.get_width() / 2,
                bar.get_height() * 1.01 + 0.05,
                text,
                ha="center",
                va="bottom",
                fontsize=7.5,
            )
    ax_g.set_xticks(pos, names, rotation=20)
    ax_g.set(
        ylabel="million output tokens/s per MW of chips",
        title=f"best tokens per MW, one chip, tpot <= {TPOT_SLO * 1e3:.0f} ms",
    )
    ax_g.legend(loc="upper left")
    fig.tight_layout()
    return fig


def main():
    res = compute()
    fig = plot(res)
    fig.savefig(C.ROOT / "docs" / "figures" / "energy.png", dpi=150, bbox_inches="tight")
    C.save("energy", fig, res)


if __name__ == "__main__":
    main()
