"""``dcost warmup``: compile the common programs once, into the persistent cache.

    dcost warmup            # eval (decode, prefill), optimize with its elasticities (both
                            # kinds), grid, train, lifetime, plan: about a minute on 2 cores
    dcost warmup --quick    # eval only: seconds

Each step runs the very command-line handler a user runs (its output thrown away), so what it
compiles is what a later ``dcost optimize`` or ``dcost eval`` finds in the cache (and, for the
searches, in ``dcost._programs``: a later run does not even trace them). Every preset
pair has the same pytree structure, so one pair warms the programs of all of them; flags that
change a problem's structure (``--max-chips`` and the other bounds, ``--ttft-slo``,
``--chip-budget``, ``--objective``) compile programs of their own on first use, and so does
the first search on a profiled chip (``--calibrated`` or ``--engine``: one set of programs for
every profile, ``dcost.specs.shared_form``). The planner's programs depend on the model's
structure and the chip's layouts, not on its profile (``Hardware.filled``), so the plan step
warms the README's question (llama-3-70b on calibrated H100s, chat traffic) and questions like
it, on pure physics and every engine's profile too.
"""

from __future__ import annotations

import contextlib
import io
import sys
import time

from dcost import _cache, _programs

__all__ = ["add_parsers", "STEPS", "QUICK", "cmd_warmup", "cache_entries"]

_PAIR = ["--hardware", "gb200-nvl72", "--model", "deepseek-v3"]
_SEARCH = [*_PAIR, "--context", "8192", "--tpot-slo", "50ms"]

_EVAL = ["eval", *_PAIR, "--chips", "8"]
_PLAN = ["plan", "--hardware", "h100-sxm", "--model", "llama-3-70b"]
_TRAIN = ["--params", "70e9", "--tokens", "15e12", "--hardware", "h100-sxm", "--chips", "8"]

# (label, argv): the defaults of each subcommand, as a user types them
STEPS = (
    ("eval decode", [*_EVAL, "--batch", "64", "--context", "4096"]),
    ("eval prefill", [*_EVAL, "--batch", "1", "--prompt", "4096", "--phase", "prefill"]),
    ("optimize + elasticities", ["optimize", *_SEARCH]),
    ("optimize, kkt sensitivity", ["optimize", *_SEARCH, "--sensitivity", "kkt"]),
    ("grid", ["grid", *_SEARCH]),
    ("train", ["train", *_TRAIN]),
    ("lifetime", ["lifetime", "--loss", "1.95", "--inference-tokens", "2e12"]),
    ("plan", [*_PLAN, "--traffic", "chat", "--rate", "100", "--calibrated", "--engine", "none"]),
)
QUICK = STEPS[:1]


def add_parsers(subparsers) -> None:
    """Register ``dcost warmup``."""
    p = subparsers.add_parser(
        "warmup",
        help="compile the common programs into the persistent cache, so later runs start fast",
        description="Runs eval, optimize (with its elasticities), grid, train, lifetime and plan "
        "once on a default question so their compiled programs land in the cache "
        "(DCOST_CACHE_DIR, else $XDG_CACHE_HOME/dcost/jax or ~/.cache/dcost/jax; "
        "DCOST_CACHE=0 turns the cache off).",
    )
    p.add_argument("--quick", action="store_true", help="only the eval step (seconds)")
    p.set_defaults(func=cmd_warmup)


def cache_entries(path) -> tuple[int, int]:
    """(files, bytes) of the cache directory ``path`` (0, 0 when it is absent)."""
    if path is None or not path.is_dir():
        return 0, 0
    files = [f for f in path.iterdir() if f.is_file() and not f.name.startswith(".")]
    return len(files), sum(f.stat().st_size for f in files)


def cmd_warmup(args) -> int:
    from dcost.cli.app import main

    state = _cache.state()
    where = state.path if state.path is not None else "none"
    print(f"cache: {where} ({state.reason})")
    if state.path is None:
        print("nothing to warm: the persistent cache is off")
        return 0
    before = cache_entries(state.path)
    for label, argv in QUICK if args.quick else STEPS:
        t0 = time.perf_counter()
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = main(argv)
        dt = time.perf_counter() - t0
        if code not in (0, 1):  # 1: no feasible design, still compiled
            print(f"{label:24s} failed (exit {code}): dcost {' '.join(argv)}")
            print(err.getvalue().strip(), file=sys.stderr)
            return code
        print(f"{label:24s} {dt:6.1f} s")
    files, size = cache_entries(state.path)
    print(f"{files - before[0]} new entries; {files} in all, {size / 1e6:.1f} MB")
    kept = _programs.entries()
    if kept:
        mb = sum(p.stat().st_size for p in kept) / 1e6
        print(f"{len(kept)} compiled search programs in {kept[0].parent.name}/, {mb:.1f} MB")
    return 0
