"""Command-line pieces for training economics: ``dcost train`` and ``dcost lifetime``.

``dcost.cli`` calls ``add_parsers(subparsers)``; each sub-command stores its handler as
``func`` (``args.func(args)`` returns the exit code). Handlers raise ``ValueError`` for bad values,
which the main CLI turns into a one-line error and exit status 2. Numbers are typed and printed in
readable units here (B params, T tokens, days, GB, $M); ``--json`` prints SI fields.
"""

from __future__ import annotations

import math

import jax

import dcost
from dcost.cli.common import json_text, non_negative, parse_number, positive, whole
from dcost.training.lifetime import lifetime_optimum
from dcost.training.runs import RECOMPUTE, TrainingSetup, training_run
from dcost.training.scaling import as_fit, scaling_fit_names

__all__ = ["add_parsers", "train_command", "lifetime_command"]


def add_parsers(subparsers) -> None:
    """Register ``train`` and ``lifetime`` on an ``argparse`` sub-parsers object."""
    p = subparsers.add_parser(
        "train",
        help="time, cost and memory per chip of a pretraining run",
        description="Time, dollars and per-chip memory of pretraining on 6 N D FLOP, e.g. "
        "dcost train --params 70B --tokens 15T --hardware h100-sxm --chips 4096 "
        "--mfu 0.45 --tensor 8 --stages 4 --microbatches 32. Exit status: 0 when the layout "
        "fits in HBM, 1 when it does NOT fit (the run is still printed), 2 a bad argument.",
    )
    size = p.add_mutually_exclusive_group(required=True)
    size.add_argument("--params", type=positive, help="dense parameter count, e.g. 70e9 or 70B")
    size.add_argument("--model", help="a model preset (its architecture and sparsity)")
    p.add_argument("--tokens", type=positive, required=True, help="training tokens, e.g. 15T")
    p.add_argument("--hardware", required=True, help="hardware preset, e.g. h100-sxm")
    p.add_argument("--chips", type=whole, required=True, help="all chips of the run")
    p.add_argument(
        "--mfu", type=parse_number, default=0.4, help="model FLOP utilization (default 0.4)"
    )
    p.add_argument("--tensor", type=whole, default=1, help="tensor-parallel degree (default 1)")
    p.add_argument("--stages", type=whole, default=1, help="pipeline stages (default 1)")
    p.add_argument(
        "--microbatches", type=whole, default=1, help="micro-batches per step (default 1)"
    )
    p.add_argument("--seq-len", type=whole, default=4096, help="tokens per sequence (default 4096)")
    p.add_argument(
        "--micro-batch", type=whole, default=1, help="sequences per micro-batch (default 1)"
    )
    p.add_argument(
        "--recompute",
        default="selective",
        help=f"activation recomputation: {', '.join(RECOMPUTE)} (default selective)",
    )
    p.add_argument(
        "--price",
        type=non_negative,
        default=None,
        help="$ per chip-hour (default: the hardware preset's)",
    )
    p.add_argument("--json", action="store_true", help="print SI fields as JSON")
    p.set_defaults(func=train_command)

    q = subparsers.add_parser(
        "lifetime",
        help="model size and tokens that reach a loss at the least lifetime FLOPs",
        description="Minimize pretraining + inference FLOPs 6 N D + 2 N D_inf subject to "
        "loss(N, D) = target (Sardana & Frankle 2023), e.g. "
        "dcost lifetime --loss 1.95 --inference-tokens 2T. Exit status: 0 a plan, 1 the target "
        "is out of reach of --max-tokens, 2 a bad argument (a target outside (E, E + A + B) of "
        "the fit included).",
    )
    q.add_argument(
        "--loss",
        type=parse_number,
        required=True,
        help="target loss (nats per token), above the fit's irreducible loss E",
    )
    q.add_argument(
        "--inference-tokens",
        type=non_negative,
        required=True,
        help="tokens served over the model's life, e.g. 2e12",
    )
    q.add_argument(
        "--fit",
        default="hoffmann2022",
        help=f"scaling fit: {', '.join(scaling_fit_names())} (default hoffmann2022)",
    )
    q.add_argument(
        "--max-tokens",
        type=positive,
        default=math.inf,
        help="pretraining data available (default unlimited)",
    )
    q.add_argument("--json", action="store_true", help="print SI fields as JSON")
    q.set_defaults(func=lifetime_command)


def _si(x) -> str:
    """A count with an SI suffix: 7.0e10 -> '70.0B'."""
    x = float(x)
    for scale, unit in ((1e15, "P"), (1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= 0.99995 * scale:
            return f"{x / scale:.1f}{unit}"
    return f"{x:.3g}"


def train_command(args) -> int:
    """``dcost train``: print a ``training_run`` readably, or as JSON with ``--json``."""
    with jax.enable_x64(True):
        return _train(args)


def _train(args) -> int:
    overrides = {} if args.price is None else {"price_per_hour": args.price}
    hw = dcost.hardware(args.hardware, **overrides)
    model = dcost.model(args.model) if args.model is not None else args.params
    setup = TrainingSetup(
        stages=args.stages,
        microbatches=args.microbatches,
        tensor=args.tensor,
        seq_len=args.seq_len,
        micro_batch=args.micro_batch,
        recompute=args.recompute,
    )
    run = training_run(model, args.tokens, hw, args.chips, args.mfu, setup)
    n_active = float(model.params_active) if args.model is not None else float(args.params)
    data = args.chips // (args.tensor * args.stages)
    out = {
        "n_params": n_active,
        "n_tokens": args.tokens,
        "n_chips": args.chips,
        "mfu": args.mfu,
        "data_parallel": data,
        "tensor": args.tensor,
        "stages": args.stages,
        "microbatches": args.microbatches,
        "flops": float(run.flops),
        "seconds": float(run.seconds),
        "cost_usd": float(run.cost),
        "bubble_fraction": float(run.bubble),
        "memory_weights_bytes": float(run.memory_weights),
        "memory_optimizer_bytes": float(run.memory_optimizer),
        "memory_activations_bytes": float(run.memory_activations),
        "memory_per_chip_bytes": float(run.memory_per_chip),
        "hbm_capacity_bytes": float(run.hbm_capacity),
        "fits": bool(run.fits),
    }
    if args.json:
        print(json_text(out))
        return 0 if out["fits"] else 1
    gb = 1e9
    verdict = "fits" if out["fits"] else "does NOT fit"
    print(
        f"train {_si(n_active)} params on {_si(args.tokens)} tokens: {args.chips} x "
        f"{args.hardware} at {100 * args.mfu:.0f}% MFU "
        f"({data} data x {args.tensor} tensor x {args.stages} stages)"
    )
    print(f"  compute      {out['flops']:.3g} FLOP")
    print(
        f"  time         {out['seconds'] / 86400:.1f} days "
        f"(pipeline bubble {100 * out['bubble_fraction']:.1f} %)"
    )
    print(
        f"  cost         ${out['cost_usd'] / 1e6:.2f}M at ${float(hw.price_per_hour):.2f} "
        "per chip-hour"
    )
    print(
        f"  memory/chip  {out['memory_per_chip_bytes'] / gb:.1f} GB of "
        f"{out['hbm_capacity_bytes'] / gb:.0f} GB: {verdict} (weights+grads "
        f"{out['memory_weights_bytes'] / gb:.1f}, optimizer "
        f"{out['memory_optimizer_bytes'] / gb:.1f}, activations "
        f"{out['memory_activations_bytes'] / gb:.1f} GB, recompute {args.recompute})"
    )
    return 0 if out["fits"] else 1


def lifetime_command(args) -> int:
    """``dcost lifetime``: the FLOP-optimal ``(N, D)`` for a target loss and inference demand.

    Exit status 1 when the target is out of reach of the data available (``--max-tokens``).
    """
    with jax.enable_x64(True):
        return _lifetime(args)


def _lifetime(args) -> int:
    fit = as_fit(args.fit)
    best = lifetime_optimum(args.loss, args.inference_tokens, fit, max_tokens=args.max_tokens)
    ref = lifetime_optimum(args.loss, 0.0, fit, max_tokens=args.max_tokens)
    out = {
        "fit": args.fit,
        "target_loss": args.loss,
        "inference_tokens": args.inference_tokens,
        "reachable": bool(best.reachable),
        "n_params": float(best.n_params),
        "n_tokens": float(best.n_tokens),
        "overtrain": float(best.overtrain),
        "flops": float(best.flops),
        "train_fraction": float(best.train_fraction),
        "compute_optimal": {
            "n_params": float(ref.n_params),
            "n_tokens": float(ref.n_tokens),
            "overtrain": float(ref.overtrain),
            "flops": float(ref.flops),
        },
    }
    if args.json:
        why = (
            f"unreachable: the loss {args.loss:g} needs more than --max-tokens "
            f"{args.max_tokens:g} training tokens, or lies below the fit's floor"
        )
        print(json_text(out, {"compute_optimal": why, **{k: why for k in out}}))
        return 0 if out["reachable"] else 1
    head = (
        f"lifetime optimum for loss {args.loss:g} serving {_si(args.inference_tokens)} "
        f"tokens (fit {args.fit})"
    )
    if not out["reachable"]:
        print(f"{head}: unreachable with at most {_si(args.max_tokens)} training tokens")
        return 1
    print(head)
    print(f"  parameters       {_si(out['n_params'])}")
    capped = " (all the data there is)" if out["n_tokens"] >= 0.999999 * args.max_tokens else ""
    print(
        f"  training tokens  {_si(out['n_tokens'])} ({out['n_tokens'] / out['n_params']:.0f} "
        f"per parameter, over-training r = D/(20 N) = {out['overtrain']:.2f}){capped}"
    )
    print(f"  lifetime FLOPs   {out['flops']:.3g} ({100 * out['train_fraction']:.0f}% pretraining)")
    c = out["compute_optimal"]
    print(
        f"  without inference (compute-optimal for this loss): {_si(c['n_params'])} "
        f"parameters on {_si(c['n_tokens'])} tokens (r = {c['overtrain']:.2f})"
    )
    return 0
