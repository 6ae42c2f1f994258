"""Where a test run's time goes: JAX's tracing, lowering and XLA compiling, by program and test.

    python benchmarks/suite_compiles.py tests/test_optimize.py tests/test_buckets.py
    python benchmarks/suite_compiles.py --top 30 --timeout 1800 tests/test_plan.py

Runs ``python -m pytest`` on the given paths (one process: what it compiles, it compiles once)
with a small plugin that listens to JAX's own compile log (``jax_log_compiles``: "Finished
tracing ...", "Finished jaxpr to MLIR module conversion ...", "Finished XLA compilation of ...")
and its cache-miss explanations (``jax_explain_cache_misses``), and prints:

1. the seconds of each phase against the run's wall time;
2. the programs that took longest to compile, with how many times each was compiled;
3. the tests that compiled the most;
4. why a program was compiled again in the same process, from JAX's explanation of the miss
   against the closest earlier call: another structure of arguments (a pytree node's metadata,
   e.g. another objective or free set; ``bounds only`` when a ``Problem`` differs in its free
   variables' bounds and nothing else), another static argument, other shapes or dtypes, the
   x64 flag, or a function defined anew (a closure: normal inside a traced program).

The suite's settings apply (``tests/conftest.py``: XLA's level 0, no persistent cache), so the
figures are those of ``make test``'s processes; the run is under ``--timeout`` seconds (default
1,800) and killed past it. Reference: JAX's documentation of ``jax_log_compiles`` and
``jax_explain_cache_misses`` ("Persistent compilation cache", "Debugging" pages).
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]

PHASES = {
    "trace": re.compile(r"Finished tracing (?:\+ transforming )?(\S+) for \w+ in ([0-9.e+-]+) sec"),
    "lower": re.compile(r"Finished jaxpr to MLIR module conversion (\S+) in ([0-9.e+-]+) sec"),
    "compile": re.compile(r"Finished XLA compilation of (\S+) in ([0-9.e+-]+) sec"),
}
"""JAX's compile log lines, one pattern per phase: ``(program, seconds)``."""

_PLUGIN = """
import logging, os
import jax
OUT = os.environ["SUITE_COMPILES_OUT"]
CURRENT = ["(collection)"]
LINES = []

class _Handler(logging.Handler):
    def emit(self, record):
        msg = record.getMessage()
        if msg.startswith("Finished ") or "CACHE MISS" in msg:
            LINES.append((CURRENT[0], msg))

def pytest_configure(config):
    jax.config.update("jax_log_compiles", True)
    jax.config.update("jax_explain_cache_misses", True)
    handler = _Handler(level=logging.WARNING)
    log = logging.getLogger("jax")
    log.addHandler(handler)
    log.setLevel(logging.WARNING)
    log.propagate = False

def pytest_runtest_setup(item):
    CURRENT[0] = item.nodeid

def pytest_unconfigure(config):
    with open(OUT, "w", encoding="utf-8") as f:
        for test, msg in LINES:
            f.write("@@@ " + test + "\\n" + msg + "\\n")
"""


def parse(text: str) -> tuple[list[tuple[str, str, str, float]], list[tuple[str, str]]]:
    """The plugin's log: ``[(test, phase, program, seconds)]`` and ``[(test, miss message)]``.

    >>> log = ("@@@ t.py::a\\nFinished XLA compilation of jit(f) in 1.5 sec\\n"
    ...        "@@@ t.py::a\\nFinished tracing f for jit in 0.25 sec\\n"
    ...        "@@@ t.py::b\\nTRACING CACHE MISS at x.py:1 (g):\\n  never seen function:\\n")
    >>> events, misses = parse(log)
    >>> events
    [('t.py::a', 'compile', 'jit(f)', 1.5), ('t.py::a', 'trace', 'f', 0.25)]
    >>> misses[0][0], misses[0][1].splitlines()[0]
    ('t.py::b', 'TRACING CACHE MISS at x.py:1 (g):')
    """
    events, misses = [], []
    for block in text.split("@@@ ")[1:]:
        test, _, msg = block.partition("\n")
        if "CACHE MISS" in msg:
            misses.append((test, msg))
            continue
        for phase, pattern in PHASES.items():
            m = pattern.search(msg)
            if m:
                events.append((test, phase, m.group(1), float(m.group(2))))
                break
    return events, misses


def _strip_bounds(metadata: str) -> str:
    """A ``Problem``'s pytree metadata without its free variables' bounds."""
    return re.sub(r"\('(\w+)', [^,()]+, [^,()]+\)", r"\1", metadata)


def why(message: str) -> tuple[str, str]:
    """``(program, reason)`` of one cache-miss explanation (``program`` empty when JAX names
    none): the first difference JAX lists against the closest earlier call.

    >>> why("TRACING CACHE MISS at a.py:1 (call):\\n  for _relax defined at o.py:2\\n"
    ...     "  all previously seen cache keys differ.\\n"
    ...     "  * at input path [0][2], now <class 'Static'> with pytree metadata Static(val=None)"
    ...     " and before <class 'Static'> with pytree metadata Static(val=16), so the pytree")
    ('_relax', 'static argument [0][2]')
    >>> why("TRACING CACHE MISS at a.py:1 (call):\\n  for f defined at o.py:2\\n"
    ...     "  * at input path [0][0], now <class 'Problem'> with pytree metadata (X, (('batch',"
    ...     " 1, 64),)) and before <class 'Problem'> with pytree metadata (X, (('batch', 1, 32),"
    ...     ")), so the pytree node metadata does not match")
    ('f', 'bounds only')
    >>> why("TRACING CACHE MISS at a.py:1 (g):\\n  never seen function:\\n    h id=1")
    ('', 'a function defined anew')
    """
    name = re.search(r"for (\S+) defined at", message)
    program = name.group(1) if name else ""
    if "never seen function" in message:
        return program, "a function defined anew"
    if "jax_enable_x64 differs" in message:
        return program, "the x64 flag"
    first = next((ln.strip() for ln in message.splitlines() if ln.strip().startswith("* ")), "")
    meta = re.search(r"now .*?metadata (.*) and before .*?metadata (.*), so the", first)
    if meta and "Static(val=" in first:
        path = re.search(r"path (\S+),", first)
        return program, f"static argument {path.group(1) if path else ''}".strip()
    if meta:
        same = _strip_bounds(meta.group(1)) == _strip_bounds(meta.group(2))
        return program, "bounds only" if same else "another argument structure"
    if re.search(r"now [fiu]\d+\[", first) or "shape" in first or "dtype" in first:
        return program, "other shapes or dtypes"
    if "pytree" in first or "NoneType" in first or "child" in first:
        return program, "another argument structure"
    return program, first[:60] or "not explained"


def report(events, misses, wall: float, top: int = 20) -> str:
    """The four tables of the module docstring, as text."""
    lines = []
    phase = collections.Counter()
    for _, p, _, s in events:
        phase[p] += s
    lines.append(f"wall {wall:.1f} s; " + ", ".join(f"{p} {phase[p]:.1f} s" for p in PHASES))
    seconds, count = collections.Counter(), collections.Counter()
    for _, p, prog, s in events:
        if p == "compile":
            seconds[prog] += s
            count[prog] += 1
    lines.append(f"\nprograms by XLA compile time (top {top}): seconds, compilations")
    for prog, s in seconds.most_common(top):
        lines.append(f"  {s:8.1f} {count[prog]:5d}  {prog}")
    per_test = collections.Counter()
    for test, _, _, s in events:
        per_test[test] += s
    lines.append(f"\ntests by tracing + lowering + compiling (top {top}), s")
    for test, s in per_test.most_common(top):
        lines.append(f"  {s:8.1f}  {test}")
    reasons = collections.Counter(why(m) for _, m in misses)
    named = {k: v for k, v in reasons.items() if k[0]}
    lines.append("\nwhy a named program was compiled again (JAX's closest earlier call)")
    for (prog, reason), n in sorted(
        named.items(), key=lambda kv: (-seconds[f"jit({kv[0][0]})"], -kv[1])
    )[: 3 * top]:
        lines.append(f"  {n:5d}  {prog}: {reason}")
    anew = sum(v for k, v in reasons.items() if not k[0])
    lines.append(f"  {anew:5d}  inner functions traced anew (closures inside traced programs)")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("paths", nargs="+", help="test files or node ids, as pytest takes them")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument(
        "--timeout", type=float, default=1800.0, help="seconds before the run is killed"
    )
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        (pathlib.Path(tmp) / "suite_compiles_plugin.py").write_text(_PLUGIN, encoding="utf-8")
        out = pathlib.Path(tmp) / "log.txt"
        env = dict(os.environ, SUITE_COMPILES_OUT=str(out))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [tmp, env.get("PYTHONPATH", "")]))
        cmd = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-o",
            "addopts=--doctest-modules",
            "-p",
            "suite_compiles_plugin",
            *args.paths,
        ]
        t0 = time.perf_counter()
        try:
            done = subprocess.run(
                cmd, cwd=ROOT, env=env, timeout=args.timeout, capture_output=True, text=True
            )
        except subprocess.TimeoutExpired:
            print(f"pytest ran past --timeout {args.timeout:.0f} s and was killed")
            return 1
        wall = time.perf_counter() - t0
        tail = done.stdout.strip().splitlines()[-1:] if done.stdout.strip() else []
        print(f"pytest exited {done.returncode}: {' '.join(tail)}")
        if not out.exists():
            print("the plugin wrote no log (pytest stopped before its end):")
            print(done.stdout[-2000:] + done.stderr[-2000:])
            return 1
        events, misses = parse(out.read_text(encoding="utf-8"))
    print(report(events, misses, wall, args.top))
    return 0 if done.returncode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
