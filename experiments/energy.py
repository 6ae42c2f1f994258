"""Joules per token against batch, and tokens per megawatt across GPU generations.

Questions (issue 32): how does the energy of a token fall with batch, beside its rental cost (the
lecture's cost curve)? And how many tokens per second does a megawatt of chips buy on each GPU
generation?

Setting: ``dcost.energy`` on each chip's calibrated family profile (``dcost.hardware(name,
calibrated=True)``; the step takes the time it takes in practice), its datasheet board power,
the idle floor fitted on AIConfigurator's B200 kernel power and the activity coefficients fitted
on the ML.ENERGY v3 whole runs (``dcost.serving.power``). Left: decode
of llama-3.1-8b (bf16, one chip, context 1,024 tokens) on an H100 and a B200, batch 1 to the
memory limit: J per output token (solid) and $ per million output tokens at the rental price
(dashed, right axis). Right: the most output tokens/s per MW of chip power each chip reaches with
time per output token within 50 ms and the weights and KV cache in HBM, for a dense model
(llama-3.1-8b) and an MoE (qwen3-30b-a3b), one chip each, bf16. Chip power only: multiply by a
PUE (and add hosts and network) for the facility.

Bottom left, the power cap that minimizes the owned cost of a token (``dcost.power_cap`` on the
H100, ``dcost.ownership("h100-sxm")``, hosting provisioned at the cap): decode (batch 256) and
prefill (4 prompts of 2,048 tokens) of llama-3.1-8b. Bottom right, where owning beats renting and
an API: deepseek-v3 (fp8) on replicas of 8 calibrated H200s (batch 256 per replica), prompts of
2,000 tokens with half of them cached, 1,000 output tokens, against DeepSeek's own API prices
(``dcost.price_sheets()["deepseek-v3"]``): $ per hour of whole replicas, owned or rented, against
the API's bill at the same traffic (``dcost.breakeven``).

Run: ``python experiments/energy.py``.
"""

from __future__ import annotations

import _common as C
import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

import dcost
from dcost.serving.moe import profiled_routing

CURVE_CHIPS = ("h100-sxm", "b200")
GENERATIONS = ("a100-80gb", "h100-sxm", "h200", "b200", "b300")
MODELS = {"dense": "llama-3.1-8b", "moe": "qwen3-30b-a3b"}
CONTEXT = 1024.0
TPOT_SLO = 0.05
RESERVE = 0.1  # HBM held back for activations and fragmentation, as Problem's default
CAP_CHIP, CAP_MODEL = "h100-sxm", "llama-3.1-8b"
CAP_STEPS = {
    "decode": (dcost.Design(batch=256), dcost.Workload(CONTEXT)),
    "prefill": (dcost.Design(batch=4), dcost.Workload(2048.0, prompt=2048.0)),
}
API = {"sheet": "deepseek-v3", "model": "deepseek-v3", "hardware": "h200", "chips": 8}
API_BATCH, API_PROMPT, API_OUTPUT, API_CACHED = 256, 2000.0, 1000.0, 0.5


def cap_sweep(n: int = 24):
    """The owned $ per token of each step against the power cap, relative to no cap."""
    h0 = dcost.hardware(CAP_CHIP, calibrated=True)
    m = dcost.model(CAP_MODEL)
    own = dcost.ownership(CAP_CHIP)
    idle, top = float(h0.idle_power), float(h0.max_power)
    caps = np.linspace(idle + 0.1 * (top - idle), top, n)
    out: dict = {"caps": caps, "idle_power": idle, "max_power": top}
    for step, (d, w) in CAP_STEPS.items():
        rows = []
        for cap in caps:
            hc = dcost.power_cap(h0, float(cap), d, m, w, step=step)
            e = dcost.energy(d, hc, m, w, step=step)
            # the facility provisions the cap per chip: hosting is paid on it
            provisioned = eqx.tree_at(lambda x: x.max_power, hc, jnp.asarray(float(cap)))
            per_hour = float(ownership_cost(own, provisioned, e.power_per_chip))
            tokens = float(e.power_per_replica / e.energy_per_token)
            rows.append((per_hour / 3600.0 / tokens, float(e.energy_per_token), tokens))
        cost, joules, tokens = (np.asarray(c) for c in zip(*rows, strict=True))
        out[step] = {
            "cost_per_token": cost,
            "relative_cost": cost / cost[-1],
            "relative_energy": joules / joules[-1],
            "relative_speed": tokens / tokens[-1],
            "best_cap": float(caps[int(np.argmin(cost))]),
        }
    return out


def ownership_cost(own, hardware, power):
    """$ per chip-hour of owning ``hardware`` drawing ``power`` W (``dcost.pricing.ownership``)."""
    from dcost.pricing.ownership import chip_hour_cost

    return chip_hour_cost(own, hardware, power).total


def api_breakeven(n: int = 200):
    """Owned, rented and API $ per hour against traffic (output tokens/s)."""
    h = dcost.hardware(API["hardware"], precision="fp8", calibrated=True)
    m = dcost.model(API["model"])
    d = dcost.Design(batch=API_BATCH, chips=API["chips"])
    # the experts at the load the calibrated profile was fitted at (multinomial routing)
    w = dcost.Workload(
        API_PROMPT + API_OUTPUT / 2,
        prompt=API_PROMPT,
        output=API_OUTPUT,
        expert_imbalance=profiled_routing(not h.pure, m),
    )
    prices = dcost.price_sheets()[API["sheet"]].prices
    b = dcost.breakeven(d, h, m, w, dcost.ownership(API["hardware"]), prices, API_CACHED)
    cap = float(b.replica_capacity)
    rent = API["chips"] * float(h.price_per_hour)
    traffic = np.logspace(np.log10(cap / 30), np.log10(cap * 30), n)
    replicas = np.ceil(traffic / cap)
    return {
        "traffic": traffic,
        "api": traffic * 3600.0 * float(b.api_cost_per_output_token),
        "owned": replicas * float(b.replica_cost_per_hour),
        "rented": replicas * rent,
        "breakeven_traffic": float(b.traffic),
        "always_traffic": float(b.traffic_always),
        "replica_capacity": cap,
        "replica_cost_per_hour": float(b.replica_cost_per_hour),
        "rent_per_hour": rent,
        "api_cost_per_million_output": 1e6 * float(b.api_cost_per_output_token),
        "owned_cost_per_million_output": 1e6 * float(b.owned_cost_per_output_token),
    }


@jax.jit
def sweep(batch, hardware, model):
    """Energy and decode reports over a vector of batches (one vmapped call)."""

    def one(b):
        d, w = dcost.Design(batch=b), dcost.Workload(CONTEXT)
        return dcost.energy(d, hardware, model, w), dcost.decode(d, hardware, model, w)

    return jax.vmap(one)(batch)


def compute(max_batch: float = 1024.0, n: int = 60, n_caps: int = 24):
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
    out["cap"] = cap_sweep(n_caps)
    out["api"] = api_breakeven()
    return out


def plot(res):
    fig, (ax, ax_g, ax_p, ax_a) = C.figure(2, width=6.2, height=4.6, nrows=2)
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
    cap = res["cap"]
    for step, color in (("decode", C.COLORS["dense"]), ("prefill", C.COLORS["moe"])):
        c = cap[step]
        pct = 100 * (c["relative_cost"] - 1)
        ax_p.plot(cap["caps"], pct, "-", color=color, lw=2, label=f"{step}: owned $ per token")
        ax_p.plot(
            cap["caps"],
            100 * (c["relative_energy"] - 1),
            ":",
            color=color,
            lw=1.5,
            label=f"{step}: J per token",
        )
        ax_p.axvline(c["best_cap"], color=color, lw=0.8, ls="--")
    ax_p.axhline(0, color=C.COLORS["grey"], lw=0.8)
    ax_p.set(
        xlabel=f"power cap per chip (W; board limit {cap['max_power']:.0f} W)",
        ylabel="change against no cap (%)",
        title=f"{CAP_MODEL} on an owned {CAP_CHIP}: the cap that minimizes $ per token",
    )
    ax_p.legend(loc="upper center", fontsize=8)
    a = res["api"]
    x = a["traffic"]
    ax_a.plot(x, a["api"], "-", color=C.COLORS["grey"], lw=2, label="API bill (DeepSeek's prices)")
    ax_a.step(x, a["owned"], where="post", color=C.COLORS["alt"], lw=2, label="owned replicas")
    ax_a.step(
        x, a["rented"], where="post", color=C.COLORS["orange"], lw=1.5, label="rented replicas"
    )
    if np.isfinite(a["breakeven_traffic"]):
        ax_a.axvline(a["breakeven_traffic"], color=C.COLORS["alt"], lw=0.8, ls="--")
        ax_a.annotate(
            f"owning wins from {a['breakeven_traffic']:,.0f} tokens/s,\n"
            f"always from {a['always_traffic']:,.0f}",
            (a["breakeven_traffic"], a["owned"][0]),
            xytext=(8, -40),
            ha="left",
            textcoords="offset points",
            fontsize=8,
            color=C.COLORS["alt"],
        )
    ax_a.set(
        xscale="log",
        yscale="log",
        xlabel="traffic (output tokens/s)",
        ylabel="$ per hour",
        title=f"{API['model']} (fp8) on {API['chips']} x {API['hardware']} replicas vs its API",
    )
    ax_a.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return fig


def main():
    res = compute()
    fig = plot(res)
    fig.savefig(C.ROOT / "docs" / "figures" / "energy.png", dpi=150, bbox_inches="tight")
    C.save("energy", fig, res)


if __name__ == "__main__":
    main()
