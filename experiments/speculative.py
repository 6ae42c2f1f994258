"""Speculative decoding and multi-token prediction: what they cut, and when they pay.

Question (lecture, issue 9 item 6): does speculative decoding cut KV reads per emitted token, or
raise compute efficiency, and when does it pay?

Physics (serving model v2, ``dcost.serving.speculative``): a step drafts ``k`` tokens with a cheap
draft, then verifies ``k + 1`` tokens per sequence in one pass of the target. The pass reads the
weights and the KV cache once, so bytes read per emitted token fall by the accepted length
``tau = (1 - a**(k+1))/(1 - a)``; its compute grows ``(k+1)``-fold. Speculation pays when
``tau > t_1/t_0``, the step time with drafts over the plain step:

- memory bound (small batch): ``t_1/t_0 ~ 1 + draft reads / model reads``: almost any acceptance
  pays, but for a fine-grained MoE the verify pass's ``B(k+1)`` tokens also touch more experts
  (``phi(2B)`` against ``phi(B)``), so at batch 1 the breakeven acceptance is far from 0;
- compute bound (large batch): ``t_1/t_0 -> (k+1)(2N + aT) + draft / (2N + aT) > k + 1 >= tau``:
  it never pays.

Breakeven: for ``k = 1``, ``a* = t_1/t_0 - 1`` (``tau = 1 + a``); for larger ``k`` the root of
``tau(a, k) = t_1/t_0``. Both step times come from ``dcost.decode`` (``tpot`` at ``a = 0`` is the
step time, ``tau = 1``); the acceptance enters only through ``tau``.

Setting: deepseek-r1 (fp8 weights on fp8 FLOP/s) with its MTP module as the draft (``k = 1``, one
module; ``k = 3`` chains it), pure physics (no overheads), one stage, every batch that fits in
HBM: 8 x H200 (one HGX box) and 72 x GB200 (one NVL72 rack), mean context 4096 and 1024.
DeepSeek reports an acceptance of 85-90 % for the MTP token (DeepSeek-V3 Technical Report,
section 5.4.3).

Run: ``python experiments/speculative.py``.
"""

from __future__ import annotations

import _common as C
import jax
import jax.numpy as jnp
import numpy as np

import dcost
from dcost.presets import pair

MODEL = "deepseek-r1"
SETUPS = (  # (hardware, chips, context, draft tokens)
    ("h200", 8.0, 4096.0, 1.0),
    ("h200", 8.0, 1024.0, 1.0),
    ("gb200-nvl72", 72.0, 4096.0, 1.0),
    ("h200", 8.0, 4096.0, 3.0),
)
ACCEPTANCES = (0.5, 0.7, 0.85, 0.9)
DEEPSEEK_ACCEPTANCE = (0.85, 0.90)  # DeepSeek-V3 Technical Report, section 5.4.3
MEMORY_RESERVE = 0.10


@jax.jit
def step_times(batch, chips, context, k, hardware, model):
    """Plain and speculative step times (s), KV bytes read per step and mfu, over ``batch``."""

    def one(b):
        w = dcost.Workload(context)  # acceptance 0: tpot is the step time
        plain = dcost.decode(dcost.Design(batch=b, chips=chips), hardware, model, w)
        spec = dcost.decode(dcost.Design(batch=b, chips=chips, draft_tokens=k), hardware, model, w)
        return plain, spec

    return jax.vmap(one)(batch)


def breakeven(ratio, k):
    """Acceptance ``a*`` with ``tau(a*, k) = ratio`` (NaN where even ``a = 1`` does not pay)."""
    ratio = np.asarray(ratio, dtype=float)
    if k == 1.0:
        a = ratio - 1.0
    else:
        grid = np.linspace(0.0, 1.0, 20001)
        tau = np.asarray(dcost.accepted_tokens(jnp.asarray(grid), k))
        a = np.interp(ratio, tau, grid, left=0.0, right=np.nan)
    return np.where(ratio > k + 1.0, np.nan, np.clip(a, 0.0, None))


def compute(n_batches=160):
    out = {"model": MODEL, "acceptances": ACCEPTANCES, "setups": []}
    for name, chips, context, k in SETUPS:
        h, m = pair(name, MODEL)
        # the largest batch whose weights, draft and KV fit in (1 - reserve) of HBM
        budget = (1 - MEMORY_RESERVE) * float(h.hbm_capacity) * chips
        weights = float(m.bytes_per_param) * (float(m.params_total) + float(m.draft_total))
        per_seq = context * (float(m.kv_bytes_per_token) + float(m.draft_kv_bytes_per_token))
        b_max = np.floor((budget - weights) / per_seq)
        batch = C.log_batches(b_max, n_batches)
        plain, spec = step_times(batch, chips, context, k, h, m)
        t0, t1 = np.asarray(plain.tpot), np.asarray(spec.tpot)
        ratio = t1 / t0
        fits = np.asarray(spec.memory_per_chip) <= (1 - MEMORY_RESERVE) * float(h.hbm_capacity)
        speedup = {
            a: float(dcost.accepted_tokens(a, k)) / ratio for a in ACCEPTANCES
        }  # tokens/s with drafts over without, at the same batch and chips
        tau_ds = float(dcost.accepted_tokens(DEEPSEEK_ACCEPTANCE[0], k))
        pays = ratio < tau_ds
        b = np.asarray(batch)
        bw = float(h.bandwidth_achieved) * chips  # bytes/s of the replica

        def read(r, bw=bw):
            """HBM bytes the target reads in one step: weights and KV."""
            return (np.asarray(r.t_weights) + np.asarray(r.t_kv)) * bw

        bound = np.asarray(
            dcost.bottleneck(jax.tree.map(lambda x: x, spec))
        )  # the verify step's binding term
        out["setups"].append(
            {
                "hardware": name,
                "chips": chips,
                "context": context,
                "draft_tokens": k,
                "batch": b,
                "fits": fits,
                "step_plain_s": t0,
                "step_spec_s": t1,
                "ratio": ratio,
                "breakeven": breakeven(ratio, k),
                "speedup": speedup,
                "bytes_per_token_plain": read(plain) / b,
                "bytes_per_token_spec": read(spec) / (b * tau_ds),
                "kv_bytes_per_token_plain": np.asarray(plain.t_kv) * bw / b,
                "kv_bytes_per_token_spec": np.asarray(spec.t_kv) * bw / (b * tau_ds),
                "mfu_plain": np.asarray(plain.mfu),
                "mfu_spec": np.asarray(plain.mfu) * speedup[DEEPSEEK_ACCEPTANCE[0]],
                "bound_spec": bound,
                "max_batch_paying_at_085": float(b[pays].max()) if pays.any() else 0.0,
                "min_breakeven": float(np.nanmin(breakeven(ratio, k))),
                "batch_of_min_breakeven": float(b[np.nanargmin(breakeven(ratio, k))]),
                "breakeven_batch1": float(breakeven(ratio, k)[0]),
                "breakeven_at_max_batch": float(breakeven(ratio, k)[-1]),
                "speedup_at_085": {
                    "batch1": float(speedup[0.85][0]),
                    "best": float(np.max(speedup[0.85])),
                    "max_batch": float(speedup[0.85][-1]),
                },
            }
        )
    return out


def plot(res):
    fig, (ax_s, ax_b, ax_k) = C.figure(3, width=5.4, height=4.8)
    colors = (C.COLORS["dense"], C.COLORS["alt"], C.COLORS["moe"], C.COLORS["extra"])
    main = res["setups"][0]
    b = main["batch"]
    for a, color in zip(res["acceptances"], colors, strict=True):
        ax_s.plot(b, main["speedup"][a], color=color, lw=1.8, label=f"acceptance a = {a:g}")
    ax_s.axhline(1.0, color="k", lw=1, ls="--")
    ax_s.text(1.2, 1.02, "breakeven: no faster than without drafts", fontsize=8.5)
    ax_s.set(
        xscale="log",
        xlabel="batch B (sequences per step)",
        ylabel="tokens/s with MTP over without (same chips)",
        title=f"{res['model']} + MTP (k = 1) on 8 x H200, context 4096",
        ylim=(0.5, 2.0),
    )
    ax_s.legend(loc="lower left")

    for s, color, ls in zip(res["setups"], colors, ("-", "-", ":", "--"), strict=True):
        label = f"{s['chips']:.0f} x {s['hardware']}, T = {s['context']:.0f}"
        label += f", k = {s['draft_tokens']:.0f}"
        ax_b.plot(s["batch"], s["breakeven"], color=color, lw=1.8, ls=ls, label=label)
        ax_b.scatter([s["batch"][-1]], [min(s["breakeven"][-1], 0.99)], color=color, s=25,
                     zorder=3)  # fmt: skip
    ax_b.annotate(
        "2B verify tokens touch\nmore experts than B",
        (4.5, 0.75),
        xytext=(12, 0.55),
        fontsize=8,
        arrowprops={"arrowstyle": "->", "lw": 0.8},
    )
    ax_b.annotate(
        "verify pass compute bound:\nbreakeven -> 1 (never pays)",
        (3000, 0.6),
        xytext=(150, 0.45),
        fontsize=8,
        arrowprops={"arrowstyle": "->", "lw": 0.8},
    )
    ax_b.text(180, 0.2, "all experts touched anyway:\nonly the draft's reads", fontsize=8)
    lo, hi = DEEPSEEK_ACCEPTANCE
    ax_b.axhspan(lo, hi, color=C.COLORS["orange"], alpha=0.2, lw=0)
    ax_b.text(1.2, (lo + hi) / 2, "DeepSeek's MTP acceptance 85-90 %", va="center", fontsize=8.5)
    ax_b.set(
        xscale="log",
        xlabel="batch B (sequences per step)",
        ylabel="breakeven acceptance a* (pays above it)",
        ylim=(0.0, 1.0),
        title="Breakeven acceptance (dots: largest batch that fits)",
    )
    ax_b.legend(loc="lower left", fontsize=8)

    for key, color, label in (
        ("plain", C.COLORS["grey"], "plain decoding"),
        ("spec", C.COLORS["dense"], "MTP, a = 0.85 (tau = 1.85)"),
    ):
        ax_k.plot(b, main[f"bytes_per_token_{key}"] / 1e9, color=color, lw=1.8,
                  label=f"weights + KV, {label}")  # fmt: skip
        ax_k.plot(b, main[f"kv_bytes_per_token_{key}"] / 1e9, color=color, lw=1.2, ls="--",
                  label=f"KV only, {label}")  # fmt: skip
    ax_k.set(
        xscale="log",
        yscale="log",
        xlabel="batch B (sequences per step)",
        ylabel="GB the target reads from HBM per emitted token",
        title="What speculation cuts, and its MFU (8 x H200, T = 4096)",
    )
    ax_m = ax_k.twinx()
    ax_m.plot(b, 100 * main["mfu_plain"], color=C.COLORS["grey"], lw=1.4, ls=":",
              label="MFU, plain")  # fmt: skip
    ax_m.plot(b, 100 * main["mfu_spec"], color=C.COLORS["moe"], lw=1.4, ls=":",
              label="MFU (useful FLOPs), MTP at a = 0.85")  # fmt: skip
    ax_m.set_ylabel("model FLOP utilization (%)")
    ax_m.grid(False)
    lines = ax_k.get_lines() + ax_m.get_lines()
    ax_k.legend(lines, [ln.get_label() for ln in lines], loc="upper center", fontsize=7.5)
    fig.suptitle(
        "Speculative decoding: it cuts bytes read per emitted token (KV and weights) by the "
        "accepted length; it pays while the verify pass stays memory bound",
        fontsize=11.5,
    )
    fig.tight_layout()
    return fig


def summary(res):
    keys = (
        "max_batch_paying_at_085",
        "min_breakeven",
        "batch_of_min_breakeven",
        "breakeven_batch1",
        "breakeven_at_max_batch",
        "speedup_at_085",
    )
    return {
        "model": res["model"],
        "deepseek_acceptance": DEEPSEEK_ACCEPTANCE,
        "setups": [
            {
                "hardware": s["hardware"],
                "chips": s["chips"],
                "context": s["context"],
                "draft_tokens": s["draft_tokens"],
                "max_batch": float(s["batch"][-1]),
                **{k: s[k] for k in keys},
            }
            for s in res["setups"]
        ],
    }


def main():
    res = compute()
    C.save("speculative", plot(res), summary(res))


if __name__ == "__main__":
    main()
