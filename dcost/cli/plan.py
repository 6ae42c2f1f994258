"""``dcost plan``: the cheapest fleet for a traffic mix at latency percentiles.

    dcost plan --hardware h100-sxm --model llama-3-70b --traffic chat --rate 100
    dcost plan --hardware h100-sxm --model llama-3-70b --rate 50 --prompt 4k --output 1k \\
        --ttft 2s@p99 --tpot 50ms@p90 --mode best --calibrated --json

Prints a table of the chosen fleet (and the other mode's, with ``--mode best``): pools, chips,
$/hour, $ per million input and output tokens, predicted TTFT and TPOT percentiles, and the
binding limit; then the launch settings the plan implies for vLLM, SGLang and TensorRT-LLM
(parallel degrees, running sequences, chunk size). ``--simulate N`` runs the planned fleet
through the discrete-event simulation and prints its percentiles beside the prediction;
``--check-launch N`` simulates each engine's launch of the plan (a disaggregated plan's two
pools, each prompt's KV cache moved between them) under that engine's own scheduler
(``dcost.planning.launch.check_launch``), behind the router ``--router`` names (the plan's own by
default), and says whether the targets hold, and where they miss, how many replicas hold them.
``--json`` prints SI units under the API's names. Exit codes: 0 a plan, 1 infeasible (the
binding limit is printed), 2 a bad argument.
"""

from __future__ import annotations

import argparse
import math

from dcost.cli.common import (
    add_precision_argument,
    calibration_line,
    fmt_time,
    format_table,
    hardware_and_model,
    json_text,
    non_negative,
    parse_duration,
    positive,
    profile_error,
    selected_engine,
)
from dcost.cli.sweep import add_arguments as add_sweep_arguments
from dcost.planning.launch import (
    ENGINES,
    PREFILL_OVERLAP,
    ROUTER,
    scheduler_settings,
    token_budget,
)
from dcost.planning.server import ROUTERS

__all__ = [
    "add_parsers",
    "cmd_plan",
    "parse_slo",
    "launch_settings",
    "scheduler_settings",
    "token_budget",
    "ENGINES",
]


def parse_slo(text: str) -> tuple[float, float]:
    """``2s@p99`` -> ``(2.0, 0.99)``; ``50ms@p90``, ``0.05@0.9`` likewise.

    >>> parse_slo("2s@p99"), parse_slo("50ms@p90"), parse_slo("1.5s@p99.9")
    ((2.0, 0.99), (0.05, 0.9), (1.5, 0.999))
    """
    if "@" not in text:
        raise argparse.ArgumentTypeError(
            f"not a latency target: {text!r} (use e.g. 2s@p99 or 50ms@p90)"
        )
    limit, pct = text.rsplit("@", 1)
    seconds = parse_duration(limit)
    pct = pct.strip().lower()
    try:
        q = float(pct[1:]) / 100.0 if pct.startswith("p") else float(pct)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a percentile: {pct!r} in {text!r} (use e.g. p99 or 0.99)"
        ) from None
    q = round(q, 6)
    if not 0.5 <= q <= 0.999:
        raise argparse.ArgumentTypeError(
            f"percentile {pct!r} in {text!r} must be between p50 and p99.9"
        )
    return seconds, q


def _fraction(text: str) -> float:
    v = non_negative(text)
    if v >= 1:
        raise argparse.ArgumentTypeError(f"must be < 1, got {text!r}")
    return v


def add_parsers(subparsers) -> None:
    """Register ``plan`` on the ``dcost`` command's subparsers."""
    p = subparsers.add_parser(
        "plan",
        help="the cheapest fleet (aggregated or disaggregated) that serves a traffic mix "
        "within TTFT and TPOT percentiles",
    )
    p.add_argument("--hardware", help="hardware preset (see `dcost presets`); required")
    p.add_argument("--model", help="model preset (see `dcost presets`); required")
    add_precision_argument(p)
    p.add_argument(
        "--traffic",
        default=None,
        help="traffic preset for the lengths (chat, code-completion, summarization, "
        "long-context, reasoning); --prompt/--output override its means",
    )
    p.add_argument(
        "--rate", type=positive, help="arrivals, requests/s; required (with --scenarios: a default)"
    )
    p.add_argument("--prompt", type=positive, default=None, help="mean prompt length, tokens")
    p.add_argument("--output", type=positive, default=None, help="mean output length, tokens")
    p.add_argument("--prompt-cv", type=non_negative, default=None, help="prompt length sd/mean")
    p.add_argument("--output-cv", type=non_negative, default=None, help="output length sd/mean")
    p.add_argument(
        "--prefix-hit", type=_fraction, default=None, help="share of prompt tokens cached"
    )
    p.add_argument(
        "--ttft",
        type=parse_slo,
        default=(2.0, 0.99),
        help="time-to-first-token target at a percentile (default 2s@p99)",
    )
    p.add_argument(
        "--tpot",
        type=parse_slo,
        default=(0.05, 0.9),
        help="time-per-output-token target at a percentile (default 50ms@p90)",
    )
    p.add_argument(
        "--mode",
        choices=("aggregated", "disaggregated", "best"),
        default="best",
        help="one pool, a prefill and a decode pool, or the cheaper (default best)",
    )
    p.add_argument(
        "--acceptance",
        type=_fraction,
        default=None,
        help="draft acceptance rate: lets the plan use speculative decoding where the model "
        "has a draft (e.g. deepseek-v3's MTP module)",
    )
    p.add_argument(
        "--max-chips", type=int, default=72, help="most chips per pipeline stage (default 72)"
    )
    p.add_argument(
        "--max-utilisation",
        type=_fraction,
        default=None,
        help="most busy share of a prefill queue (default 0.85 aggregated, 0.6 for a "
        "disaggregated prefill pool)",
    )
    p.add_argument(
        "--simulate",
        type=int,
        default=0,
        metavar="REQUESTS",
        help="also run the planned fleet through the discrete-event simulation",
    )
    p.add_argument(
        "--check-launch",
        type=int,
        default=0,
        metavar="REQUESTS",
        help="simulate each engine's launch of the plan (both pools of a disaggregated one) "
        "under that engine's own scheduler (REQUESTS requests at the plan's rate); where a "
        "target misses, say how many replicas hold it",
    )
    p.add_argument(
        "--router",
        choices=ROUTERS,
        default=ROUTER,
        help=f"the router --check-launch puts in front of the replicas that prefill (default "
        f"{ROUTER}, what the plan's TTFT assumes; least-requests for a least-connections "
        "balancer)",
    )
    p.add_argument(
        "--engine",
        choices=(*ENGINES, "all", "none"),
        default="all",
        help="one engine: plan with its profile on the chip (step times from its kernel "
        "tables and fixed costs, `dcost engines`) and print its launch settings; all or none: "
        "print every engine's launch settings or none, step times pure or --calibrated "
        "(default all)",
    )
    p.add_argument(
        "--confidence",
        type=float,
        choices=(0.5, 0.75, 0.9, 0.95),
        default=None,
        help="with one --engine: size the fleet so that its targets hold with this probability "
        "under the engine profile's held-out error (the chips at the median prediction are "
        "printed beside it)",
    )
    p.add_argument(
        "--profile",
        metavar="FILE",
        help="with one --engine: a profile file of your own (`dcost calibrate --from`); "
        "--confidence then uses the error of deployments calibrated on as many of their runs",
    )
    p.add_argument("--json", action="store_true", help="machine-readable output (SI units)")
    add_sweep_arguments(p)
    p.set_defaults(func=cmd_plan)


def _traffic(args):
    from dcost.planning.traffic import Traffic, traffic

    fields = {
        k: getattr(args, a)
        for k, a in (
            ("prompt_tokens", "prompt"),
            ("output_tokens", "output"),
            ("prompt_cv", "prompt_cv"),
            ("output_cv", "output_cv"),
            ("prefix_hit", "prefix_hit"),
        )
        if getattr(args, a) is not None
    }
    if args.traffic is not None:
        return traffic(args.traffic, rate=args.rate, **fields)
    missing = [f"--{a}" for a in ("prompt", "output") if getattr(args, a) is None]
    if missing:
        raise ValueError(f"give --traffic <preset>, or {' and '.join(missing)} (mean tokens)")
    return Traffic(args.rate, **fields)


def cmd_plan(args) -> int:
    from dcost.search._jit import prefer_fast_compile

    if args.scenarios is not None:
        from dcost.cli.sweep import cmd_sweep

        return cmd_sweep(args)
    from dcost import _xla

    # one question per process: on an empty cache compiling the planner's programs is what
    # takes time (fast, they compile in about 12 s instead of 19 s and run 0.2-0.3 s longer);
    # a process that set DCOST_FAST_COMPILE keeps its own choice
    if _xla.chosen():
        return _one_plan(args)
    with prefer_fast_compile(even_optimized=True):
        return _one_plan(args)


def _one_plan(args) -> int:
    from dcost.planning.fleet import simulate
    from dcost.planning.planner import Options, plan

    missing = [f"--{a}" for a in ("hardware", "model", "rate") if getattr(args, a) is None]
    if missing:
        raise ValueError(f"{', '.join(missing)} required (or --scenarios FILE.csv)")
    if args.profile is not None and args.engine in ("all", "none"):
        raise ValueError(
            f"--profile {args.profile} needs one --engine (the engine the profile is of), "
            f"got --engine {args.engine}"
        )
    hardware, model = hardware_and_model(args)
    traffic = _traffic(args)
    if args.max_chips < 1:
        raise ValueError(f"--max-chips must be >= 1, got {args.max_chips}")
    if args.simulate < 0:
        raise ValueError(f"--simulate must be >= 0 requests, got {args.simulate}")
    if args.check_launch and args.check_launch < 100:
        raise ValueError(
            f"--check-launch must be at least 100 requests (0: off), got {args.check_launch}"
        )

    def planned(chip):
        return plan(
            chip,
            model,
            traffic,
            ttft_slo=args.ttft,
            tpot_slo=args.tpot,
            mode=args.mode,
            acceptance=args.acceptance,
            max_utilisation=args.max_utilisation,
            options=Options(max_chips=args.max_chips),
        )

    median = None
    if args.confidence is not None:
        from dcost.engines import EngineError, confidence_factor, slower

        eng = selected_engine(args)
        if eng is None:
            raise EngineError(
                "--confidence needs one --engine (its held-out error says how far off a step "
                "time can be)"
            )
        median = planned(hardware)
        hardware = slower(hardware, confidence_factor(eng, args.confidence))
    p = planned(hardware)
    sim = simulate(p, requests=args.simulate) if p.feasible and args.simulate else None
    engines = () if args.engine == "none" else ENGINES if args.engine == "all" else (args.engine,)
    checks = {}
    if args.check_launch and p.feasible:
        from dcost.planning.launch import check_launch

        for e in engines:
            mine = args.profile if args.engine == e else None
            checks[e] = check_launch(
                p,
                args.hardware,
                args.model,
                e,
                requests=args.check_launch,
                profile=mine,
                router=args.router,
            )
    if median is not None:
        plural = "" if median.chips == 1 else "s"
        cost = (
            f"{median.chips} chip{plural} at the median prediction"
            if median.feasible
            else "infeasible at the median prediction"
        )
        if not args.json:
            print(
                f"confidence {args.confidence:g}: step times {args.engine} profile x "
                f"{confidence_factor(eng, args.confidence):.2f} ({cost})"
            )
    if args.json:
        out = _plan_json(p)
        if median is not None:
            out["confidence"] = {
                "level": args.confidence,
                "median_chips": median.chips if median.feasible else None,
            }
        if p.alternative is not None:
            out["alternative"] = _plan_json(p.alternative)
        out["launch"] = (
            {e: launch_settings(p, args.model, e) for e in engines} if p.feasible else {}
        )
        if p.feasible:
            out["router"] = ROUTER
        calibration = profile_error(args)
        if calibration:
            out["calibration_error"] = {"family_name": calibration[0], **calibration[1]}
        if args.check_launch:
            out["launch_check"] = {e: _check_json(c) for e, c in checks.items()}
        if sim is not None:
            out["simulation"] = {
                "requests": args.simulate,
                "quantiles": list(sim.quantiles),
                "ttft": [float(x) for x in sim.ttft_percentiles],
                "tpot": [float(x) for x in sim.tpot_percentiles],
            }
        print(json_text(out, _JSON_REASONS))
        return 0 if p.feasible else 1
    _print(args, p, sim, engines, checks)
    return 0 if p.feasible else 1


def _replicas_json(n):
    """A replica count, or a disaggregated plan's ``{"prefill": P, "decode": D}``."""
    return {"prefill": n[0], "decode": n[1]} if isinstance(n, tuple) else n


def _replicas_key(n) -> str:
    """A replica count as a JSON key: ``"4"``, or ``"2+3"`` (prefill + decode replicas)."""
    return f"{n[0]}+{n[1]}" if isinstance(n, tuple) else str(n)


def _replicas_text(n) -> str:
    return (
        f"{n[0]} prefill + {n[1]} decode replicas"
        if isinstance(n, tuple)
        else f"{n} replica{'' if n == 1 else 's'}"
    )


def _check_json(c) -> dict:
    """A ``LaunchCheck`` in SI units, its replica counts as keys (a disaggregated plan's
    ``"P+D"``, prefill + decode replicas)."""
    return {
        "requests": c.requests,
        "planned_replicas": _replicas_json(c.planned),
        "holds": c.holds,
        "replicas_that_hold": None if c.replicas is None else _replicas_json(c.replicas),
        "targets": {"ttft": c.targets[0], "tpot": c.targets[1]},
        "quantiles": {"ttft": c.quantiles[0], "tpot": c.quantiles[1]},
        "frontend_time": c.frontend_time,
        "router": c.router,
        "ttft": {_replicas_key(n): v for n, v in c.ttft.items()},
        "tpot": {_replicas_key(n): v for n, v in c.tpot.items()},
    }


def _check_line(c) -> str:
    """One line: the planned replicas' simulated percentiles under the engine's scheduler and
    what holds."""
    n = c.planned
    qt, qp = (f"p{100 * q:g}" for q in c.quantiles)
    line = (
        f"under {c.engine}'s scheduler, {c.router} router ({c.requests:,} requests simulated): "
        f"TTFT {qt} "
        f"{fmt_time(c.ttft[n])} (target {fmt_time(c.targets[0])}), TPOT {qp} "
        f"{fmt_time(c.tpot[n])} (target {fmt_time(c.targets[1])})"
    )
    if c.holds:
        return line + ": holds"
    if c.replicas is None:
        most = list(c.ttft)[-1]  # the last tried: the most
        return (
            f"{line}: misses, and still at {_replicas_text(most)} (TTFT "
            f"{fmt_time(c.ttft[most])}, TPOT {fmt_time(c.tpot[most])}), the most it tries; where "
            "more replicas barely move a TTFT, its long prompts' own steps bind, not the queue"
        )
    return (
        f"{line}: misses; {_replicas_text(c.replicas)} hold it (TTFT "
        f"{fmt_time(c.ttft[c.replicas])}, TPOT {fmt_time(c.tpot[c.replicas])})"
    )


_JSON_REASONS = {
    "decode_batch": "a prefill pool runs no decode batch",
    "step_time": "a prefill pool runs no decode step",
    "cost_per_hour": "no plan meets the targets (see message)",
    "cost_per_million_input": "no plan meets the targets, or no input tokens arrive",
    "cost_per_million_output": "no plan meets the targets, or no output tokens leave",
    "shadow_price": "no binding latency target with a finite price",
    "ttft": "no plan meets the targets (see message)",
    "tpot": "no plan meets the targets (see message)",
}


def _energy(p):
    """``dcost.plan_energy`` of a feasible plan, or the reason there is none (a chip without
    ``idle_power`` and ``max_power``)."""
    from dcost.planning.energy import plan_energy
    from dcost.specs import SpecError

    if not p.feasible:
        return None, "no plan meets the targets (see message)"
    try:
        return plan_energy(p), None
    except SpecError as err:
        return None, str(err)


def _energy_line(p) -> str:
    e, why = _energy(p)
    if e is None:
        return f"energy: not known ({why})"
    return (
        f"energy: {e.power / 1e3:,.3g} kW of chips ({e.power_per_chip:,.0f} W a chip, "
        f"{e.idle_power / 1e3:,.3g} kW of it their idle floor), "
        f"{e.energy_per_output_token:.3g} J per output token, "
        f"{e.tokens_per_mw / 1e6:.3g} M output tokens/s per MW"
    )


def _plan_json(p) -> dict:
    e, why = _energy(p)
    energy = (
        {"reason": why}
        if e is None
        else {
            "power": e.power,
            "power_per_chip": e.power_per_chip,
            "idle_power": e.idle_power,
            "energy_per_output_token": e.energy_per_output_token,
            "tokens_per_mw": e.tokens_per_mw,
            "pools": [{"role": r, "chips": n, "power": w} for r, n, w in e.pools],
        }
    )
    return {
        "mode": p.mode,
        "feasible": p.feasible,
        "message": p.message,
        "pools": [dict(vars(x)) for x in p.pools],
        "chips": p.chips,
        "cost_per_hour": p.cost_per_hour,
        "cost_per_million_input": p.cost_per_million_input,
        "cost_per_million_output": p.cost_per_million_output,
        "ttft": {str(q): v for q, v in p.ttft.items()},
        "tpot": {str(q): v for q, v in p.tpot.items()},
        "binding": p.binding,
        "shadow_price": p.shadow_price,
        "ttft_slo": list(p.ttft_slo),
        "tpot_slo": list(p.tpot_slo),
        "energy": energy,
    }


def _pcts(d: dict) -> str:
    keys = [q for q in (0.5, 0.9, 0.99) if q in d]
    return " / ".join(fmt_time(d[q]) for q in keys)


def _row(p, chosen: bool) -> list[str]:
    if not p.feasible:
        return [p.mode, "infeasible (below)", "", "", "", "", "", "", p.binding or ""]
    pools = "; ".join(
        (f"{x.role}: " if p.mode == "disaggregated" else "") + x.describe() for x in p.pools
    )
    return [
        p.mode + (" *" if chosen else ""),
        pools,
        f"{p.chips}",
        f"{p.cost_per_hour:,.2f}",
        f"{p.cost_per_million_input:.3g}",
        f"{p.cost_per_million_output:.3g}",
        _pcts(p.ttft),
        _pcts(p.tpot),
        p.binding or "",
    ]


def _print(args, p, sim, engines, checks=None) -> None:
    t = p.traffic
    print(
        f"{args.model} on {args.hardware}{' (calibrated)' if args.calibrated else ''}: "
        f"{float(t.rate):g} requests/s, prompts {float(t.prompt_tokens):,.0f} tokens, outputs "
        f"{float(t.output_tokens):,.0f} tokens; TTFT <= {fmt_time(p.ttft_slo[0])} at "
        f"p{p.ttft_slo[1] * 100:g}, TPOT <= {fmt_time(p.tpot_slo[0])} at p{p.tpot_slo[1] * 100:g}"
    )
    header = [
        "mode",
        "pools",
        "chips",
        "$/hour",
        "$/M in",
        "$/M out",
        "TTFT p50/p90/p99",
        "TPOT p50/p90/p99",
        "binding",
    ]
    rows = [_row(p, p.feasible)]
    if p.alternative is not None:
        rows.append(_row(p.alternative, False))
    print(format_table(rows, header))
    for q in (p, p.alternative):
        if q is not None and not q.feasible:
            print(f"{q.mode} infeasible: {q.message}")
    if not p.feasible:
        return
    calibration = profile_error(args)
    if calibration:
        print(calibration_line(*calibration, width=12) + " (per step; queueing is the plan's)")
    print(_energy_line(p))
    if sim is not None:
        qs = list(sim.quantiles)
        pick = [qs.index(q) for q in (0.5, 0.9, 0.99) if q in qs]
        sim_ttft = " / ".join(fmt_time(float(sim.ttft_percentiles[i])) for i in pick)
        sim_tpot = " / ".join(fmt_time(float(sim.tpot_percentiles[i])) for i in pick)
        print(
            f"simulated ({args.simulate:,} requests): TTFT p50/p90/p99 {sim_ttft}; "
            f"TPOT p50/p90/p99 {sim_tpot}"
        )
    for pool in p.pools:
        if pool.shadow_price:
            print(
                f"shadow price ({pool.role}): ${-pool.shadow_price * 1e-3:,.3g}/hour saved per ms "
                f"looser {pool.binding}"
            )
    for pool in p.pools:
        if pool.binding.startswith("tpot") and pool.decode_batch < 1.0:
            print(
                f"note ({pool.role}): a replica runs {pool.decode_batch:.2g} sequences on average "
                f"and idles most of the time: the TPOT target is near the fastest step this layout "
                f"allows ({fmt_time(pool.step_time)}); the fleet buys latency with idle chips, and "
                "a looser target or faster chips shrink it"
            )
    for engine in engines:
        print(f"\n{engine} launch settings (MODEL = the checkpoint of {args.model}):")
        for line in launch_settings(p, args.model, engine):
            print("  " + line)
        if checks and engine in checks:
            print("  # " + _check_line(checks[engine]))
    note = router_note(p) if p.feasible else None
    if note:
        print("\n" + note)


_SGLANG_PREFILL = 16384
"""SGLang's default ``--max-prefill-tokens`` (sgl-project/sglang ``server_args.py``)."""


def _per_rank(cap: int, ranks: int) -> int:
    return max(1, math.ceil(cap / max(ranks, 1)))


def launch_settings(p, model_name: str, engine: str) -> list[str]:
    """The command line (and config) per pool of a plan for ``engine`` in ``ENGINES``.

    Parallelism: a dense model is tensor parallel over a stage's ``G`` chips; an MoE model is
    expert parallel over them, its attention tensor parallel (``A = 1``) or data parallel
    (``A = G``, one rank per chip); stages are pipeline parallel. The batch cap is the
    replica's running sequences (vLLM schedules each data-parallel rank apart: cap/A each).
    The plan's chunk ``C`` is the most prompt tokens a step carries *beside* its decodes; the
    engines count the decode tokens in the same budget (vLLM ``max_num_batched_tokens``, SGLang
    ``chunked_prefill_size`` less the running requests when mixed, TensorRT-LLM
    ``max_num_tokens``), so an aggregated pool's budget is ``C + cap (1 + k)`` (``k`` draft
    tokens each sequence verifies), a prefill pool's ``C``. SGLang runs a step of prompt tokens
    alone unless launched with ``--enable-mixed-chunk``, which the plan's mixed steps need (and
    its prompt tokens per batch stop at ``--max-prefill-tokens``, 16,384 by default); with
    speculative decoding SGLang turns mixed chunks off, and the launch says so.

    Flags as the engines document them: vLLM ``vllm serve`` engine arguments
    (docs.vllm.ai, "Engine Arguments", "Expert Parallel Deployment", "MTP"); SGLang
    ``sglang.launch_server`` server arguments (docs.sglang.io, "Server Arguments", "Speculative
    Decoding", PD disaggregation); TensorRT-LLM ``trtllm-serve`` options and its LLM API YAML
    (nvidia.github.io/TensorRT-LLM, "trtllm-serve", DeepSeek-R1 recipes).
    """
    out: list[str] = []
    moe = float(p.model.n_experts) > 0
    share = f"{1.0 - float(getattr(p, 'memory_reserve', 0.1)):.3g}"  # of HBM, as the plan left
    for pool in p.pools:
        g, s, a, c, k, cap = (
            pool.chips_per_stage,
            pool.stages,
            pool.attention_dp,
            pool.chunk,
            pool.draft_tokens,
            pool.batch_cap,
        )
        tp = g // a
        budget = token_budget(pool)
        out.append(f"# {pool.role}: {pool.replicas} replica(s) of {pool.chips_per_replica} chips")
        if engine == "vllm":
            cmd = ["vllm serve $MODEL"]
            cmd.append(f"--data-parallel-size {a} --tensor-parallel-size {tp}" if a > 1 else "")
            cmd.append(f"--tensor-parallel-size {g}" if a == 1 else "")
            cmd.append(f"--pipeline-parallel-size {s}" if s > 1 else "")
            cmd.append("--enable-expert-parallel" if moe else "")
            cmd.append(f"--max-num-seqs {_per_rank(cap, a)} --gpu-memory-utilization {share}")
            if c:
                cmd.append(
                    f"--enable-chunked-prefill --max-num-batched-tokens {_per_rank(budget, a)}"
                )
            if k:
                cmd.append(
                    f'--speculative-config \'{{"method": "mtp", "num_speculative_tokens": {k}}}\''
                )
            if pool.role != "aggregated":
                cmd.append(
                    '--kv-transfer-config \'{"kv_connector": "NixlConnector", '
                    '"kv_role": "kv_both"}\''
                )
            if pool.role == "prefill" and not PREFILL_OVERLAP:
                cmd.append("--no-async-scheduling")
            out.append(" ".join(x for x in cmd if x))
        elif engine == "sglang":
            cmd = ["python -m sglang.launch_server --model-path $MODEL", f"--tp {g}"]
            cmd.append(f"--dp {a} --enable-dp-attention" if a > 1 else "")
            cmd.append(f"--ep-size {g}" if moe else "")
            cmd.append(f"--pp-size {s}" if s > 1 else "")
            cmd.append(f"--max-running-requests {cap} --mem-fraction-static {share}")
            if c:
                cmd.append(f"--chunked-prefill-size {budget}")
                cmd.append(f"--max-prefill-tokens {budget}" if budget > _SGLANG_PREFILL else "")
                cmd.append("--enable-mixed-chunk" if pool.role == "aggregated" and not k else "")
            if k:
                cmd.append(
                    f"--speculative-algorithm EAGLE --speculative-num-steps {k} "
                    f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}"
                )
            if pool.role != "aggregated":
                cmd.append(f"--disaggregation-mode {pool.role}")
            if pool.role == "prefill" and not PREFILL_OVERLAP:
                cmd.append("--disable-overlap-schedule")
            out.append(" ".join(x for x in cmd if x))
            if pool.role == "aggregated" and c and k:
                out.append(
                    "# note: SGLang turns mixed chunks off with speculative decoding (server_args: "
                    '"Mixed chunked prefill is disabled because of using eagle speculative '
                    'decoding"): this pool runs its prompt steps alone, its decodes waiting, which '
                    "the plan's mixed steps do not; check it with dcost simulate --engine sglang "
                    "--prefill-first, or plan it for vLLM or TensorRT-LLM"
                )
        elif engine == "trtllm":
            cmd = ["trtllm-serve $MODEL", f"--tp_size {g} --pp_size {s}"]
            cmd.append(f"--ep_size {g}" if moe else "")
            cmd.append(f"--max_batch_size {cap}")
            if c:
                cmd.append(f"--max_num_tokens {budget}")
            yaml = []
            if a > 1:
                yaml.append("enable_attention_dp: true")
            if c:
                yaml.append("enable_chunked_prefill: true")
            if k:
                yaml.append(
                    f"speculative_config: {{decoding_type: MTP, num_nextn_predict_layers: {k}}}"
                )
            if pool.role != "aggregated":
                yaml.append("cache_transceiver_config: {backend: DEFAULT}")
            if pool.role == "prefill" and not PREFILL_OVERLAP:
                yaml.append("disable_overlap_scheduler: true")
            if yaml:
                cmd.append("--extra_llm_api_options config.yml")
            out.append(" ".join(x for x in cmd if x))
            out.extend(f"#   config.yml: {line}" for line in yaml)
        else:
            raise ValueError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    if engine == "vllm" and any(x.role != "aggregated" for x in p.pools):
        out.append("# prefill and decode instances joined by vLLM's disaggregated-serving proxy")
    return out


def router_note(p) -> str | None:
    """The router a plan's TTFT assumes, where a pool that prefills has several replicas."""
    if not any(x.replicas > 1 and x.role != "decode" for x in p.pools):
        return None
    return (
        "router: send each request to the replica with the fewest prompt tokens still to "
        "prefill (a token-counting router, e.g. Dynamo's KV router); the TTFT assumes it. A "
        "queue-depth router counts prompts and sends one behind a long prompt where the counts "
        "tie (p99 TTFT up to 1.08x the planned on 22 aggregated fleets, 1.35x on 18 disaggregated "
        "prefill pools); behind a least-connections balancer the 22 fleets ran 1.4x the "
        "token-counting router's p99 TTFT at the median, up to 2.1x (check yours: "
        "--check-launch N --router least-prefill, or least-requests)"
    )
