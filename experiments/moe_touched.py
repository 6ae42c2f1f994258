"""The experts a decode step reads, on a real chip: the occupancy term against an H200.

Claim (dcost's MoE term, ``dcost.serving.moe.expert_fraction``): a decode step of ``B`` tokens,
each routed to ``k`` of ``E`` experts, reads the weights of the experts they touch, ``E (1 - (1 -
k/E)^B)`` per layer under uniform routing: ``k`` at batch 1, all ``E`` once ``B`` is a few times
``E/k``. Not every expert (a dense product over all of them), not one read per (token, expert)
pair (a gather per pair).

Setting: ``benchmarks/moe_decode_records.py`` on a lent H200 (``benchmarks/results/
moe_decode_h200.json``): qwen3-30b-a3b's architecture at its real size (48 layers, 128 experts,
8 active, random bf16 weights), batch 1-128 at 1,024 cached tokens and batch 8 at 8,192, each step
timed with and without the routed experts' matmuls (dcost's Pallas grouped matmul, which skips
the experts no token chose), and the experts each step's routing touched counted. The experts'
time is the difference. Each law is fitted as ``t0 + c x`` (x: experts touched as counted,
every expert, or ``B k`` pairs) by least squares; the touched law's slope is a bandwidth
(``c`` over one expert's weights in every layer), held against the chip's streaming read in the
same run.

Run: ``python experiments/moe_touched.py``.
"""

from __future__ import annotations

import json

import _common as C
import numpy as np

from dcost.calibrate import moe_timing as mt

RUN = C.ROOT / "benchmarks" / "results" / "moe_decode_h200.json"
MODEL = "qwen3-30b-a3b"


def _fit(x, y):
    a = np.stack([np.ones_like(x), x], 1)
    coef, *_ = np.linalg.lstsq(a, y, rcond=None)
    return coef, float(np.sqrt(np.mean((a @ coef - y) ** 2)))


def compute(path=RUN):
    """The experts' time per step, the experts touched against the occupancy formula, and the
    three laws' fits (intercept s, slope s per unit, rms residual s)."""
    run = json.loads(path.read_text())
    arch = mt.moe_architecture(MODEL)
    skip = {(t["batch"], t["context"]): t["seconds"] for t in run["skip"]}
    timings = run["timings"]
    batch = np.array([t["batch"] for t in timings], float)
    context = np.array([t["context"] for t in timings], float)
    touched = np.array([t["touched"] for t in timings])
    experts_time = np.array([t["seconds"] - skip[(t["batch"], t["context"])] for t in timings])
    laws = {
        "touched": touched,
        "every expert": np.full_like(touched, float(arch.n_experts)),
        "one read per pair": batch * arch.experts_active,
    }
    fits = {}
    for name, x in laws.items():
        (t0, slope), rms = _fit(x, experts_time)
        fits[name] = {"intercept": t0, "slope": slope, "rms": rms}
    expert_bytes = arch.n_layers * 3 * arch.d_model * arch.d_ff_expert * 2
    return {
        "device": run["device"],
        "software": run["software"],
        "streaming_read": run["ceilings"]["read_bytes_per_s"],
        "batch": batch,
        "context": context,
        "step": np.array([t["seconds"] for t in timings]),
        "without_experts": np.array([skip[(t["batch"], t["context"])] for t in timings]),
        "experts_time": experts_time,
        "touched": touched,
        "uniform_touched": np.array([mt.expected_touched(arch, b) for b in batch]),
        "n_experts": arch.n_experts,
        "experts_active": arch.experts_active,
        "fits": fits,
        "marginal_bandwidth": expert_bytes / fits["touched"]["slope"],
        "ragged": [{"batch": t["batch"], "seconds": t["seconds"]} for t in run.get("ragged", [])],
    }


def plot(res):
    fig, (ax_t, ax_n) = C.figure(2, width=6.3, height=5.0)
    touched, y = res["touched"], res["experts_time"] * 1e3
    long = res["context"] > 1024
    ax_t.scatter(
        touched[~long],
        y[~long],
        color=C.COLORS["moe"],
        zorder=3,
        s=36,
        label="measured, 1,024 cached tokens",
    )
    ax_t.scatter(
        touched[long],
        y[long],
        color=C.COLORS["moe"],
        marker="s",
        zorder=3,
        s=36,
        facecolor="none",
        label="measured, 8,192 cached tokens",
    )
    for b, x, v, lg in zip(res["batch"], touched, y, long, strict=True):
        ax_t.annotate(
            f"B={b:.0f}",
            (x, v),
            xytext=(6, -12 if lg or b == 1 else 4),
            textcoords="offset points",
            fontsize=8,
            color=C.COLORS["moe"],
        )
    x = np.linspace(0, res["n_experts"], 50)
    f = res["fits"]["touched"]
    ax_t.plot(
        x,
        (f["intercept"] + f["slope"] * x) * 1e3,
        color=C.COLORS["dense"],
        label=f"experts touched: {res['marginal_bandwidth'] / 1e12:.1f} TB/s marginal, "
        f"rms {f['rms'] * 1e3:.2f} ms",
    )
    every = res["fits"]["every expert"]
    ax_t.axhline(
        every["intercept"] * 1e3 + every["slope"] * 1e3 * res["n_experts"],
        color=C.COLORS["grey"],
        ls="--",
        label=f"every expert (best constant): rms {every['rms'] * 1e3:.1f} ms",
    )
    ax_t.set(
        xlabel="experts touched per layer (of 128, counted from the step's routing)",
        ylabel="experts' time per step (ms)",
        xlim=(0, res["n_experts"] * 1.05),
        ylim=(0, max(y) * 1.25),
        title=f"{MODEL}, one {res['device']}: step less the step without experts",
    )
    pairs = res["fits"]["one read per pair"]
    ax_t.plot(
        [], [], " ", label=f"one read per (token, expert) pair: rms {pairs['rms'] * 1e3:.1f} ms"
    )
    ax_t.legend(fontsize=8, loc="upper left")

    b = np.unique(np.round(np.logspace(0, np.log10(256), 80)))
    e, k = res["n_experts"], res["experts_active"]
    ax_n.plot(
        b,
        e * (1 - (1 - k / e) ** b),
        color=C.COLORS["dense"],
        label="dcost: E (1 - (1 - k/E)^B), uniform routing",
    )
    ax_n.plot(
        b,
        np.minimum(b * k, 1e9),
        color=C.COLORS["grey"],
        ls=":",
        label="one read per (token, expert) pair: B k",
    )
    ax_n.axhline(e, color=C.COLORS["grey"], ls="--", label=f"every expert: {e}")
    ax_n.scatter(
        res["batch"][~long],
        touched[~long],
        color=C.COLORS["moe"],
        zorder=3,
        s=36,
        label="counted in the timed steps (random router)",
    )
    ax_n.set(
        xscale="log",
        yscale="log",
        xlabel="batch B (sequences per step)",
        ylabel="experts touched per layer",
        ylim=(5, 600),
        xlim=(0.8, 300),
        title="experts touched against batch (E = 128, k = 8)",
    )
    ax_n.legend(fontsize=8, loc="upper left")
    return fig


def main():
    res = compute()
    f = res["fits"]
    print(
        f"{res['device']} ({res['software']}), streaming read "
        f"{res['streaming_read'] / 1e12:.2f} TB/s"
    )
    print(
        f"{'batch':>6} {'context':>8} {'step ms':>8} {'w/o ms':>7} {'experts ms':>10} "
        f"{'touched':>8} {'uniform':>8}"
    )
    for i in range(len(res["batch"])):
        print(
            f"{res['batch'][i]:>6.0f} {res['context'][i]:>8.0f} {res['step'][i] * 1e3:>8.2f} "
            f"{res['without_experts'][i] * 1e3:>7.2f} {res['experts_time'][i] * 1e3:>10.2f} "
            f"{res['touched'][i]:>8.1f} {res['uniform_touched'][i]:>8.1f}"
        )
    for name, v in f.items():
        print(
            f"law {name:<18} t0 {v['intercept'] * 1e3:6.2f} ms, rms residual "
            f"{v['rms'] * 1e3:5.2f} ms"
        )
    print(
        f"marginal bandwidth of the touched experts' read: "
        f"{res['marginal_bandwidth'] / 1e12:.2f} TB/s "
        f"({res['marginal_bandwidth'] / res['streaming_read']:.2f} of the streaming read)"
    )
    C.save("moe_touched", plot(res), res)


if __name__ == "__main__":
    main()
