"""How far past Chinchilla should a frontier model be trained, given the traffic it will serve?

The lecture's whiteboard estimate (``dcost.lecture_estimate``): a model serving 50M output tokens/s
for two months, with pretraining and inference FLOPs equalized, for 100B active parameters. Then
what dcost's lifetime optimizer (``dcost.lifetime_optimum``, Sardana & Frankle 2023) says for the
same inputs: the loss 100B parameters reach on the estimate's tokens is the target, the optimizer
picks N and D. Then the same question in dollars, with the serving cost of each model size from
the roofline model (a Llama-3-70B-shaped model resized, 8 x H100 per replica, batch 256, 4k
context). Prints both and writes ``experiments/results/overtraining.json``.

Run: ``python experiments/overtraining.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax

import dcost

N_ACTIVE = 1e11
TOKENS_PER_S = 5e7
DAYS = 60.0


def _row(n, d, flops=None, **extra):
    out = {"n_params": float(n), "n_tokens": float(d), "tokens_per_param": float(d / n),
           "overtrain": float(d / (20.0 * n))}
    if flops is not None:
        out["flops"] = float(flops)
    out.update({k: float(v) for k, v in extra.items()})
    return out


def main() -> dict:
    est = dcost.lecture_estimate(TOKENS_PER_S, DAYS, N_ACTIVE)
    d_inf = est.inference_tokens
    print("Lecture estimate: serve 50M tokens/s for 60 days, equalize 6 N D = 2 N D_inf")
    print(f"  D_inf = 5e7 * 86400 * 60 = {d_inf:.3e} tokens")
    print(f"  D = D_inf / 3 = {est.n_tokens:.3e} tokens = {est.overtrain:.1f}x Chinchilla "
          f"(20 N = {est.chinchilla_tokens:.1e}) for N = {N_ACTIVE:.0e}")
    print("  (the quoted ~150T tokens / ~100x needs ~1.7x costlier inference FLOPs or ~104 days)")
    lecture_flops = 6.0 * N_ACTIVE * est.n_tokens + 2.0 * N_ACTIVE * d_inf
    results = {
        "inputs": {"tokens_per_s": TOKENS_PER_S, "days": DAYS, "n_active": N_ACTIVE,
                   "inference_tokens": d_inf},
        "lecture": _row(N_ACTIVE, est.n_tokens, lecture_flops, train_fraction=0.5),
        "fits": {},
    }

    hw, template = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    serving = dict(hardware=hw, model=template, design=dcost.Design(batch=256, chips=8),
                   workload=dcost.Workload(4096), mfu=0.4)
    for name in dcost.scaling_fit_names():
        target = dcost.loss(N_ACTIVE, est.n_tokens, name)
        best = dcost.lifetime_optimum(target, d_inf, name)
        ref = dcost.lifetime_optimum(target, 0.0, name)
        lecture_usd = dcost.lifetime_cost(N_ACTIVE, est.n_tokens, d_inf, **serving)
        usd = dcost.lifetime_optimum_dollars(target, d_inf, fit=name, **serving)
        saving = 1.0 - float(best.flops) / lecture_flops
        print(f"\n{name}: target loss {float(target):.4f} (100B on {est.n_tokens:.3g} tokens)")
        print(f"  FLOP optimum     N = {float(best.n_params):.3g}, D = {float(best.n_tokens):.3g} "
              f"({float(best.overtrain):.1f}x Chinchilla), pretraining "
              f"{100 * float(best.train_fraction):.0f}% of FLOPs, {100 * saving:.1f}% fewer FLOPs "
              "than the lecture's plan")
        print(f"  no inference     N = {float(ref.n_params):.3g}, D = {float(ref.n_tokens):.3g} "
              f"({float(ref.overtrain):.2f}x)")
        print(f"  dollar optimum   N = {float(usd.n_params):.3g}, D = {float(usd.n_tokens):.3g} "
              f"({float(usd.overtrain):.1f}x), ${float(usd.cost.total) / 1e6:.0f}M vs "
              f"${float(lecture_usd.total) / 1e6:.0f}M for the lecture's plan; serving "
              f"${float(usd.cost.cost_per_token) * 1e6:.3f} per M tokens")
        results["fits"][name] = {
            "target_loss": float(target),
            "flop_optimum": _row(best.n_params, best.n_tokens, best.flops,
                                 train_fraction=best.train_fraction, flop_saving=saving),
            "compute_optimal_same_loss": _row(ref.n_params, ref.n_tokens, ref.flops),
            "dollar_optimum": _row(usd.n_params, usd.n_tokens, cost_usd=usd.cost.total,
                                   pretrain_usd=usd.cost.pretrain,
                                   inference_usd=usd.cost.inference,
                                   cost_per_token_usd=usd.cost.cost_per_token),
            "lecture_plan_usd": {"cost_usd": float(lecture_usd.total),
                                 "pretrain_usd": float(lecture_usd.pretrain),
                                 "inference_usd": float(lecture_usd.inference)},
        }

    out = Path(__file__).resolve().parent / "results" / "overtraining.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"\nwrote {out.relative_to(Path(__file__).resolve().parent.parent)}")
    return results


if __name__ == "__main__":
    with jax.enable_x64(True):
        main()
