"""``dcost optimize`` and ``dcost grid``: the cheapest design for a preset, from the command line.

    dcost optimize --hardware gb200-nvl72 --model deepseek-v3 --context 8192 --tpot-slo 50ms
    dcost grid --hardware h100-sxm --model llama-3-70b --context 4096 --tpot-slo 30ms --json
    dcost optimize --hardware h200 --model deepseek-v3 --context 4096 --calibrated \\
        --acceptance 0.85 --attention-dp 1:72 --draft-tokens 0:4

Serving model v2's layout fields (``--attention-dp``, ``--dispatch-dedup``,
``--redundant-experts``, ``--draft-tokens``, ``--prefill-chunk``) take a number, which fixes the
field, or ``lo:hi``, which lets the search choose it within those bounds (``docs/serving_v2.md``,
"What the optimizer may free"); left out, a term stays off (v1's convention).

``optimize`` prints the design, its cost in $ per million tokens, its latency, the binding
constraint with its shadow price, and the largest elasticities of the optimal cost ("what would
make tokens cheaper"; by the envelope theorem at the search's continuous optimum, or with
``--sensitivity kkt`` from ``dcost.sensitivity``, which polishes it to a KKT point first).
``grid`` searches exhaustively (a progress bar on stderr when it takes more than a second).
``--json`` prints SI units under the API's field names. Exit codes: 0 a feasible design, 1 no
feasible design (the reason is printed), 2 a bad argument.

``optimize`` compiles its programs for speed of compiling rather than of running
(``dcost.search._jit.prefer_fast_compile``: one question per process; ``grid``, which evaluates
millions of designs, compiles for speed of running), and a later process finds them compiled in
``dcost._programs``.
"""

from __future__ import annotations

import argparse
import functools
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from dcost import _programs
from dcost.cli.common import (
    add_engine_argument,
    add_precision_argument,
    calibration_line,
    format_table,
    hardware_and_model,
    json_text,
    parse_duration,
    parse_number,
    profile_error,
    whole,
)
from dcost.cli.energy import (
    add_ownership_arguments,
    energy_lines,
    ownership_from_args,
    solution_energy,
)
from dcost.search._jit import prefer_fast_compile
from dcost.search.envelope import envelope
from dcost.search.grid import grid_search
from dcost.search.optimize import optimize
from dcost.search.problem import LAYOUT_VARIABLES, Problem
from dcost.serving.moe import profiled_routing
from dcost.specs import MULTINOMIAL, Design, Workload

__all__ = [
    "add_parsers",
    "cmd_optimize",
    "cmd_grid",
    "ProgressBar",
    "CLI_OBJECTIVES",
    "add_layout_arguments",
    "add_workload_arguments",
    "parse_layout",
    "layout_text",
]

CLI_OBJECTIVES = ("cost_per_token", "cost_per_input_token", "tco")
"""The objectives these commands can run: their inputs are all arguments. ``lifetime_cost``
(``dcost.search.objectives.LIFETIME_COST``) also needs a ``dcost.LifetimeInputs`` (tokens served,
RL tokens, training MFU, scaling fit) and a loss target, which the command line does not take.
``tco`` takes the chip's assumed ownership inputs (``dcost.ownership``) with the overrides of
``dcost.cli.energy.add_ownership_arguments``."""


def add_parsers(subparsers) -> None:
    """Register ``optimize`` and ``grid`` on the ``dcost`` command's subparsers."""
    p = subparsers.add_parser(
        "optimize",
        help="the cheapest design by gradient search, checked "
        "exactly, with its binding constraint and sensitivities",
    )
    _common(p)
    p.add_argument("--top", type=whole, default=8, help="sensitivities to list (default 8)")
    p.add_argument(
        "--sensitivity",
        choices=("envelope", "kkt", "none"),
        default="envelope",
        help="how to compute the elasticities of the optimal cost: envelope (default; the "
        "envelope theorem at the search's continuous optimum, one gradient), kkt (dcost."
        "sensitivity: polished to a KKT point first; its program takes about 10 s to compile "
        "once), none",
    )
    p.add_argument(
        "--no-sensitivity",
        dest="sensitivity",
        action="store_const",
        const="none",
        help="skip the elasticities (--sensitivity none)",
    )
    p.set_defaults(func=cmd_optimize)
    p = subparsers.add_parser("grid", help="the cheapest design by exhaustive search (exact)")
    _common(p)
    p.set_defaults(func=cmd_grid)


def _objective(text: str) -> str:
    if text in CLI_OBJECTIVES:
        return text
    if text == "lifetime_cost":
        raise argparse.ArgumentTypeError(
            "lifetime_cost cannot run from the command line: it needs the tokens served, RL "
            "tokens, training MFU and scaling fit (dcost.LifetimeInputs) and a loss target; use "
            "dcost.Problem(objective='lifetime_cost', extras=dcost.LifetimeInputs(...), "
            "loss_target=...) in Python"
        )
    raise argparse.ArgumentTypeError(
        f"unknown objective {text!r}; choose from {', '.join(CLI_OBJECTIVES)}"
    )


def _whole(text: str) -> int:
    value = parse_number(text)
    if value < 1 or value != round(value):
        raise ValueError(f"must be a whole number >= 1, got {text!r}")
    return int(value)


def _common(p) -> None:
    p.add_argument("--hardware", required=True, help="hardware preset (see `dcost presets`)")
    p.add_argument("--model", required=True, help="model preset (see `dcost presets`)")
    add_precision_argument(p)
    add_engine_argument(p)
    p.add_argument(
        "--context",
        type=parse_number,
        required=True,
        help="mean context length during decode, tokens",
    )
    p.add_argument(
        "--prompt",
        type=parse_number,
        default=None,
        help="prompt length for prefill and ttft, tokens (default: --context)",
    )
    p.add_argument(
        "--objective",
        type=_objective,
        metavar="{" + ",".join(CLI_OBJECTIVES) + "}",
        default="cost_per_token",
        help="what to minimize: $ per output token (decode, the default) or per input token "
        "(prefill), or tco: $ per output token of owned chips (capital, hosting, electricity at "
        "the step's own power; --electricity-price, --pue, --purchase-price, --years). "
        "lifetime_cost needs training inputs this command does not take: use "
        "dcost.Problem(objective='lifetime_cost', extras=dcost.LifetimeInputs(...)) in Python",
    )
    add_ownership_arguments(p)
    p.add_argument(
        "--tpot-slo",
        type=parse_duration,
        default=None,
        help="time per output token target, e.g. 50ms (default 50ms for decode)",
    )
    p.add_argument(
        "--ttft-slo",
        type=parse_duration,
        default=None,
        help="time of the prefill pass target, e.g. 2s (default: none)",
    )
    p.add_argument(
        "--chip-budget",
        type=parse_number,
        default=None,
        help="most chips per replica (default: none)",
    )
    p.add_argument(
        "--memory-reserve",
        type=parse_number,
        default=0.1,
        help="fraction of HBM kept free (default 0.1)",
    )
    for name, what, default in (
        ("batch", "batch", 65536),
        ("chips", "chips per pipeline stage", 72),
        ("stages", "pipeline stages", 8),
    ):
        p.add_argument(
            f"--max-{name}",
            type=str,
            default=str(default),
            help=f"largest {what} to consider (default {default}; 1 fixes it at 1)",
        )
    add_workload_arguments(p)
    add_layout_arguments(p, free=True)
    p.add_argument("--json", action="store_true", help="machine-readable output (SI units)")


_LAYOUT_HELP = {
    "attention_dp": "data-parallel attention groups per stage (1: tensor-parallel attention; "
    "the chips per stage: data-parallel attention); a search keeps it a divisor of the chips",
    "dispatch_dedup": "MoE dispatch de-duplicated per destination domain and node-limited "
    "(1) or one copy per expert (0)",
    "redundant_experts": "extra expert replicas per MoE layer (EPLB)",
    "draft_tokens": "speculative draft tokens per step, with the model's draft (e.g. "
    "deepseek-v3's MTP module; needs --acceptance)",
    "prefill_chunk": "chunked prefill: prompt tokens per pass (0: the whole prompt at once)",
}


def parse_layout(text: str):
    """A layout field as typed: a number fixes it (``8``), ``lo:hi`` frees it (``1:72``).

    >>> parse_layout("8"), parse_layout("1:72"), parse_layout("0:4")
    (8.0, (1, 72), (0, 4))
    """
    if ":" not in text:
        return parse_number(text)
    lo_text, _, hi_text = text.partition(":")
    lo, hi = parse_number(lo_text), parse_number(hi_text)
    if lo != round(lo) or hi != round(hi) or not 0 <= lo <= hi:
        raise argparse.ArgumentTypeError(
            f"bounds must be whole numbers lo:hi with 0 <= lo <= hi, got {text!r}"
        )
    return (int(lo), int(hi))


def add_layout_arguments(p, free: bool) -> None:
    """``--attention-dp`` ... ``--prefill-chunk``: serving model v2's layout fields of
    ``dcost.Design``; with ``free`` a ``lo:hi`` value lets the search choose the field."""
    for name in LAYOUT_VARIABLES:
        how = "a number fixes it, lo:hi lets the search choose it" if free else "a number"
        p.add_argument(
            "--" + name.replace("_", "-"),
            type=parse_layout if free else parse_number,
            default=None,
            metavar="N|LO:HI" if free else "N",
            help=f"{_LAYOUT_HELP[name]} ({how}; default: off)",
        )
    p.add_argument(
        "--expert-parallel",
        type=parse_number,
        default=None,
        metavar="N",
        help="MoE: expert-parallel groups per stage; each expert's matrices are split over the "
        "chips of its group (1: MoE tensor parallelism over the stage; a number; default: every "
        "expert whole on one chip, expert parallel over the stage)",
    )


def add_workload_arguments(p) -> None:
    """``--acceptance`` and ``--expert-imbalance``: the workload's v2 fields."""
    p.add_argument(
        "--acceptance",
        type=parse_number,
        default=None,
        help="probability a draft token is accepted, for --draft-tokens (DeepSeek-V3's MTP: "
        "0.85-0.90, Technical Report section 5.4.3; default: none)",
    )
    p.add_argument(
        "--expert-imbalance",
        default=None,
        help="busiest chip's routed-expert load over the mean: a number >= 1, or 'multinomial' "
        "(the expected maximum under random routing); default: multinomial for a mixture of "
        "experts on a profiled chip (--calibrated, --engine: the load the profiles were fitted "
        "at), balanced on pure physics (a bound)",
    )


def workload_from_args(args, hardware=None, model=None) -> Workload:
    """The ``dcost.Workload`` of the arguments (context, prompt, acceptance, imbalance); with
    no ``--expert-imbalance``, the load ``hardware`` and ``model`` are validated at
    (``dcost.serving.moe.profiled_routing``: multinomial for a mixture of experts on a profiled
    chip, else balanced)."""
    imbalance = getattr(args, "expert_imbalance", None)
    if imbalance is not None and imbalance != "multinomial":
        try:
            imbalance = parse_number(imbalance)
        except argparse.ArgumentTypeError as err:
            raise ValueError(
                f"--expert-imbalance: {err}; give a number >= 1 or 'multinomial'"
            ) from None
    elif imbalance is None and hardware is not None and model is not None:
        if profiled_routing(not hardware.pure, model) == MULTINOMIAL:
            imbalance = "multinomial"  # balanced stays None: the programs of before
    return Workload(
        args.context,
        prompt=args.prompt,
        acceptance=getattr(args, "acceptance", None),
        expert_imbalance=imbalance,
    )


def problem_from_args(args) -> Problem:
    """The ``dcost.Problem`` the arguments describe (ValueError for bad values)."""
    h, m = hardware_and_model(args)
    work = workload_from_args(args, h, m)
    free: dict = {n: (1, _bound(args, n)) for n in ("batch", "chips", "stages")}
    fixed = {}
    for name in LAYOUT_VARIABLES:
        value = getattr(args, name, None)
        if isinstance(value, tuple):
            free[name] = value
        elif value is not None:
            fixed[name] = value
    chips = 1
    if "attention_dp" in fixed:  # a stage needs a multiple of the groups as its chips
        chips, most = fixed["attention_dp"], free["chips"][1]
        if chips > most:
            raise ValueError(
                f"--attention-dp {chips:g}: more attention groups than --max-chips {most} allows"
            )
        free["chips"] = (max(1, int(chips)), most)
    groups = getattr(args, "expert_parallel", None)
    if groups is not None:  # a stage needs at least as many chips as expert-parallel groups
        most = free["chips"][1]
        if groups != round(groups) or not 1 <= groups <= most:
            raise ValueError(
                f"--expert-parallel {groups:g} is not allowed: it must be a whole number from 1 "
                f"to --max-chips {most}"
            )
        chips = max(chips, groups)
        free["chips"] = (max(free["chips"][0], int(groups)), most)
        fixed["expert_parallel"] = groups
    kw = {} if args.tpot_slo is None else {"tpot_slo": args.tpot_slo}
    return Problem(
        h,
        m,
        work,
        objective=args.objective,
        free=free,
        fixed=Design(batch=1.0, chips=chips, **fixed),
        ttft_slo=args.ttft_slo,
        chip_budget=args.chip_budget,
        memory_reserve=args.memory_reserve,
        extras=ownership_from_args(args) if args.objective == "tco" else None,
        **kw,
    )


def _bound(args, name) -> int:
    text = getattr(args, f"max_{name}")
    try:
        return _whole(text)
    except ValueError as err:
        raise ValueError(f"--max-{name}: {err}") from None


class ProgressBar:
    """``progress(done, total)`` callback drawing a bar on stderr once a second has passed."""

    def __init__(self, label="designs", stream=None, delay=1.0, width=30):
        self.label, self.stream, self.delay, self.width = label, stream or sys.stderr, delay, width
        self.start = time.perf_counter()
        self.drawn = False

    def __call__(self, done: int, total: int) -> None:
        if not self.drawn and time.perf_counter() - self.start < self.delay and done < total:
            return
        if not self.drawn and done >= total:
            return  # finished within the delay: no bar at all
        self.drawn = True
        filled = int(self.width * done / total)
        bar = "#" * filled + "." * (self.width - filled)
        self.stream.write(f"\r[{bar}] {100 * done / total:5.1f}% of {total:,} {self.label}")
        if done >= total:
            self.stream.write("\n")
        self.stream.flush()


def cmd_optimize(args) -> int:
    with prefer_fast_compile():  # one question per process: compiling it is what takes time
        return _optimize(args)


def _optimize(args) -> int:
    problem = problem_from_args(args)
    if args.sensitivity == "envelope":
        # the elasticities' program depends only on the problem's form: on an empty cache it
        # compiles on a second core while the search compiles (0.6 s of 4.4 s on 2 cores)
        with _programs.during_compile(functools.partial(_prepare_envelope, problem)):
            sol = optimize(problem)
    else:
        sol = optimize(problem)
    sens = None
    if args.sensitivity == "envelope" and bool(sol.feasible):
        sens = jax.tree.map(np.asarray, envelope(problem, sol))
    elif args.sensitivity == "kkt" and bool(sol.feasible):
        from dcost.search.sensitivity import sensitivity

        with jax.enable_x64(True):  # Newton on the KKT system wants float64
            sens = jax.tree.map(np.asarray, sensitivity(problem_from_args(args)))
    # printed from NumPy copies: the arithmetic of the report runs no XLA program
    problem, sol = jax.tree.map(np.asarray, (problem, sol))
    return _emit(args, problem, sol, sens, method="optimize")


def _prepare_envelope(problem: Problem) -> bool:
    """Load or compile the program ``envelope(problem, optimize(problem))`` runs."""
    from dcost.search.envelope import _envelope

    dtype = jnp.result_type(float)
    # placeholders of the program's form, transferred (jnp.zeros would run an XLA program)
    v, lambdas, smoothness = (
        jax.device_put(np.zeros(shape, dtype))
        for shape in ((len(problem.free),), (len(problem.constraints),), ())
    )
    return _envelope.prepare(problem, v, lambdas, smoothness, None)


def cmd_grid(args) -> int:
    problem = problem_from_args(args)
    bar = None if args.json else ProgressBar(stream=sys.stderr)
    sol = grid_search(problem, progress=bar)  # runs millions of designs: compiled to run fast
    return _emit(args, problem, sol, None, method="grid")


def _si(value) -> float:
    """A number for JSON: float32 values print at their own precision (0.02, not 0.0199999...)."""
    return float(str(np.asarray(value)[()]))


def _floats(tree) -> dict:
    return {k: _si(v) for k, v in vars(tree).items() if v is not None}


def _emit(args, problem, sol, sens, method) -> int:
    unit = problem.objective.unit
    feasible = bool(sol.feasible)
    if args.json:
        out = {
            "method": method,
            "hardware": args.hardware,
            "model": args.model,
            "objective": problem.objective.name,
            "unit": unit,
            "limits": {k: _si(v) for k, v in problem.limit_values().items()},
            "design": _floats(sol.design),
            "cost": _si(sol.cost),
            "feasible": feasible,
            "binding": list(sol.binding),
            "at_bound": list(sol.at_bound),
            "message": sol.message,
            "multipliers": {k: _si(v) for k, v in sol.multipliers.items()},
            "report": _floats(sol.report),
            **({"energy": en} if (en := solution_energy(problem, sol)) else {}),
            **(
                {"calibration_error": {"family_name": c[0], **c[1]}}
                if (c := profile_error(args))
                else {}
            ),
            "stats": {
                k: [_si(x) for x in np.ravel(v)] if np.ndim(v) else _si(v)
                for k, v in vars(sol.stats).items()
            },
        }
        if sens is not None:
            out["sensitivity"] = {
                part: _floats(getattr(sens, part)) for part in ("hardware", "model", "workload")
            }
            out["sensitivity"]["limits"] = {k: _si(v) for k, v in sens.limits.items()}
            out["sensitivity"]["method"] = args.sensitivity
            if args.sensitivity == "kkt":
                out["sensitivity"]["kkt"] = bool(sens.relaxed.kkt)
        relaxation = (
            "the exact grid solves no continuous relaxation, so it has none"
            if method == "grid"
            else "the continuous relaxation gives none here"
        )
        reasons = {"multipliers": relaxation, "stats": relaxation}
        print(json_text(out, reasons))
        return 0 if feasible else 1
    _print_text(args, problem, sol, sens, unit)
    return 0 if feasible else 1


def layout_text(design) -> str:
    """The design's serving model v2 layout fields for the design line, e.g. ``"; attention 8
    data-parallel groups of 2 chips, 2 draft tokens"``; empty when every one is off (v1).

    >>> import dcost
    >>> layout_text(dcost.Design(64, chips=16, attention_dp=8, draft_tokens=2))
    '; attention 8 data-parallel groups of 2 chips, 2 draft tokens'
    >>> layout_text(dcost.Design(64, chips=16))
    ''
    """
    parts = []
    if design.attention_dp is not None:
        a, g = float(design.attention_dp), float(design.chips)
        t = g / a
        parts.append(
            f"attention {a:.0f} data-parallel group{'s' * (a != 1)} of {t:g} chip{'s' * (t != 1)}"
        )
    if design.expert_parallel is not None:
        e, g = float(design.expert_parallel), float(design.chips)
        t = g / e
        parts.append(
            f"experts in {e:.0f} expert-parallel group{'s' * (e != 1)}, each expert split over "
            f"{t:g} chip{'s' * (t != 1)}"
        )
    if design.dispatch_dedup is not None:
        x = float(design.dispatch_dedup)
        parts.append(
            {0.0: "dispatch per expert copy", 1.0: "dispatch de-duplicated"}.get(
                x, f"dispatch {x:g} de-duplicated"
            )
        )
    for name, what in (
        ("redundant_experts", "redundant experts"),
        ("draft_tokens", "draft tokens"),
    ):
        value = getattr(design, name)
        if value is not None:
            parts.append(f"{float(value):g} {what}")
    if design.prefill_chunk is not None:
        c = float(design.prefill_chunk)
        parts.append(f"prefill chunk {c:g} tokens" if c > 0 else "prefill in one pass")
    return "; " + ", ".join(parts) if parts else ""


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.4g} ms"


def _print_text(args, problem, sol, sens, unit) -> None:
    per = unit.replace("$ per ", "")
    limits = {k: float(v) for k, v in problem.limit_values().items()}
    target = ", ".join(
        f"{k} <= {_ms(v) if k in ('tpot', 'ttft') else _fmt_limit(k, v)}" for k, v in limits.items()
    )
    print(
        f"{args.model} on {args.hardware}, context {args.context:g} tokens: "
        f"minimize {problem.objective.name} subject to {target}"
    )
    d = sol.design
    b, g, st = float(d.batch), float(d.chips), float(d.stages)
    print(
        f"design:          batch {b:.0f} x {g:.0f} chips per stage x {st:.0f} stages "
        f"({g * st:.0f} chips per replica){layout_text(d)}"
    )
    if not bool(sol.feasible):
        print(sol.message)
        return
    r = sol.report
    print(f"cost:            ${float(sol.cost) * 1e6:.4g} per million {per}s")
    if hasattr(r, "tpot"):
        print(f"{'tpot:':17s}{_ms(float(r.tpot))}")
        if d.draft_tokens is not None and float(d.draft_tokens) > 0:
            print(
                f"{'tokens per step:':17s}{float(r.tokens_per_step):.3g} (accepted, per sequence)"
            )
    else:
        print(f"{'ttft:':17s}{_ms(float(r.ttft))} (the prefill pass)")
    print(
        f"memory per chip: {float(r.memory_per_chip) / 1e9:.3g} GB of "
        f"{float(problem.hardware.hbm_capacity) / 1e9:.3g} GB"
    )
    for line in energy_lines(solution_energy(problem, sol), per.replace(" token", ""), 17):
        print(line)
    binding = ", ".join(sol.binding + sol.at_bound) or "none (a flat optimum)"
    print(f"binding:         {binding}")
    for name in sol.binding:
        price = float(sol.multipliers[name])
        if np.isfinite(price):
            print(
                f"  shadow price of {name}: ${price * 1e6 * 0.01:.3g} per million {per}s "
                f"cheaper per 1 % more {name} allowance"
            )
    calibration = profile_error(args)
    if calibration:
        print(calibration_line(*calibration))
    if sens is None:
        return
    rows = sens.ranked(args.top)
    if args.sensitivity == "envelope":
        note = " (envelope theorem at the search's multipliers; --sensitivity kkt polishes first)"
    else:
        note = "" if bool(sens.relaxed.kkt) else " (no KKT point confirmed: treat as rough)"
    print(f"\nwhat would make tokens cheaper: d log cost / d log x at the continuous optimum{note}")
    table = [[name, f"{v:+.3f}", f"{(1.1**v - 1) * 100:+.2f} %"] for name, v in rows]
    print(format_table(table, ["input", "elasticity", "cost if x rises 10 %"]))


def _fmt_limit(name, value) -> str:
    if name == "memory":
        return f"{value / 1e9:.3g} GB"
    return f"{value:g}"
