"""XLA compiler options dcost asks for on a CPU backend (shared by the searches and the cost
functions).

XLA:CPU's default MLIR fusion emitters compile dcost's programs of small scalar kernels several
times more slowly than the classic emitters (``optimize``: about 10 s against 4 s on 2 cores), and
backend optimization level 0 compiles faster still (``optimize``: 1.7 s) at the price of slower
code (about 2x for a search, more than 10x for a large vectorized sweep). ``options(fast)`` gives
the options for a program that should compile fast (``fast=True``) or run fast; they are probed
once, and where XLA no longer knows them (or the backend is not a CPU) it gives None: JAX's
defaults.

``DCOST_FAST_COMPILE=1`` in the environment makes every program compile fast, as if each asked for
it (``prefer_fast(False)`` is then True): the trade for a process that runs many different programs
once each, such as a notebook or the test suite (``tests/conftest.py`` sets it). Unset or ``0``
(``off``, ``false``, ``no``): each program asks for its own options. Set either way, it is the
process's choice (``chosen``): ``dcost plan`` then does not make its planner's programs compile
fast on its own (``dcost.search._jit.prefer_fast_compile(even_optimized=True)``).
``DCOST_FAST_COMPILE=all`` goes one step further: the programs that ask for XLA's own level
because they run a search of many candidates (the planner's, ``optimized=True``) compile fast
too, as ``dcost plan`` compiles them on its own (``even_optimized``): the trade for a process
that asks each planning question once or twice, such as the test suite. The vectorized sweeps of
millions of designs (``dcost.grid_search``'s chunks) keep their level whatever is set.

YNNPACK fusions. jaxlib 0.10.2 sends some reductions, dots and elementwise loops to XLA:CPU's
YNNPACK fusions by default, and some of those fusions crash the process when they run (a
segmentation fault on one of XLA's worker threads, reported while the main thread is elsewhere,
typically compiling the next program: JAX issues 39257 and 40412, fixed in XNNPACK after 0.10.2).
dcost's own search programs never ask for them (``options``), but plain ``jax.jit`` programs and
eager operations do: the planner's latency closed forms, the queueing simulation's reductions, the
local calibration's kernels (the suite lost a test process about one run in three, most likely
that way: no native backtrace was caught). ``guard_ynn``, called when dcost is imported, turns
them off for the whole process through ``XLA_FLAGS`` before JAX starts its backend, where the
jaxlib is one known to have both the fusions and the flag (``YNN_JAXLIBS``); a process whose
``XLA_FLAGS`` already name the flag keeps its own choice.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

__all__ = ["requested", "options", "prefer_fast", "even_optimized", "chosen", "guard_ynn"]

_CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
# XLA:CPU's YNNPACK fusions of reductions and elementwise loops ran the planner's closed forms
# 1.2-1.7x more slowly than XLA's own loops (256 candidates: 74 ms against 44 ms); an XLA that
# does not know the option compiles without it
_CPU_EXPERIMENTAL = {"xla_cpu_experimental_ynn_fusion_type": ""}
_FAST_COMPILE = {"xla_backend_optimization_level": 0}
# a program that should run fast names XLA's own default level (3) rather than leave it to the
# process: a process whose XLA_FLAGS compile everything at level 0 (the test suite's, whose eager
# operations and plain ``jax.jit`` programs then compile about twice as fast) still runs the
# searches' long loops at full speed
_RUN_FAST = {"xla_backend_optimization_level": 3}


YNN_FLAG = "--xla_cpu_experimental_ynn_fusion_type="
"""XLA's flag that turns YNNPACK fusions off (an empty list of fusion types)."""
YNN_JAXLIBS = ((0, 10, 2), (0, 12, 0))
"""The jaxlib versions (from, up to but not including) whose XLA is known to fuse into YNNPACK by
default and to know ``YNN_FLAG`` (0.10.2 here; 0.11.0 by JAX issue 39257's reporters). An XLA that
does not know a flag in ``XLA_FLAGS`` stops the process, so other versions are left alone."""

_ALL = "all"
_ON = frozenset({"1", "on", "true", "yes", _ALL})
_OFF = frozenset({"", "0", "off", "false", "no"})


def prefer_fast(fast_compile: bool, environ=None) -> bool:
    """Whether a program that asks for ``fast_compile`` compiles fast: it asked, or
    ``DCOST_FAST_COMPILE`` is on. A value that is neither on nor off raises ``ValueError``.

    >>> prefer_fast(False, {}), prefer_fast(False, {"DCOST_FAST_COMPILE": "1"})
    (False, True)
    """
    env = os.environ if environ is None else environ
    value = env.get("DCOST_FAST_COMPILE", "").strip().lower()
    if value not in _ON | _OFF:
        raise ValueError(
            f"DCOST_FAST_COMPILE = {env['DCOST_FAST_COMPILE']!r} is not allowed: it must be one of"
            f" {sorted(_ON - {_ALL})} (every program compiles fast but those that ask for XLA's"
            f" own level), {_ALL!r} (the planner's programs too) or {sorted(_OFF - {''})} (unset:"
            " each program asks for its own options)"
        )
    return fast_compile or value in _ON


def even_optimized(environ=None) -> bool:
    """Whether ``DCOST_FAST_COMPILE`` is ``all``: the programs that ask for XLA's own level to
    run a search fast (``optimized=True``, the planner's) compile fast too.

    >>> even_optimized({"DCOST_FAST_COMPILE": "1"}), even_optimized({"DCOST_FAST_COMPILE": "all"})
    (False, True)
    """
    env = os.environ if environ is None else environ
    prefer_fast(False, env)  # a bad value raises, naming what is allowed
    return env.get("DCOST_FAST_COMPILE", "").strip().lower() == _ALL


def chosen(environ=None) -> bool:
    """Whether ``DCOST_FAST_COMPILE`` is set (to a value ``prefer_fast`` accepts).

    >>> chosen({}), chosen({"DCOST_FAST_COMPILE": "0"}), chosen({"DCOST_FAST_COMPILE": "1"})
    (False, True, True)
    """
    env = os.environ if environ is None else environ
    prefer_fast(False, env)  # a bad value raises, naming what is allowed
    return env.get("DCOST_FAST_COMPILE", "").strip() != ""


def requested(fast_compile: bool) -> dict:
    """The options asked for (whether or not this XLA knows them)."""
    return dict(_CPU_OPTIONS, **(_FAST_COMPILE if fast_compile else _RUN_FAST))


@functools.cache
def options(fast_compile: bool) -> dict | None:
    """``requested(fast_compile)`` when the backend is a CPU and its XLA knows them (with the
    experimental options where it knows those too); else None."""
    if jax.default_backend() != "cpu":
        return None
    asked = requested(fast_compile)
    for extra in (_CPU_EXPERIMENTAL, {}):
        try:
            jax.jit(lambda x: x + 1.0, compiler_options=asked | extra)(jnp.zeros(()))
        except Exception:  # noqa: BLE001 - an XLA without the options: try with fewer
            continue
        return asked | extra
    return None


def guard_ynn(environ=None, jaxlib_version=None, initialized=None) -> bool:
    """Turn XLA:CPU's YNNPACK fusions off for this process: append ``YNN_FLAG`` to
    ``XLA_FLAGS`` in ``environ`` (``os.environ``) and say True; or leave it and say False where the
    flags already name ``xla_cpu_experimental_ynn_fusion_type`` (the user's choice), the jaxlib is
    outside ``YNN_JAXLIBS`` or JAX's backend has started (XLA has read its flags).

    >>> env = {"XLA_FLAGS": "--xla_backend_optimization_level=0"}
    >>> guard_ynn(env, (0, 10, 2), False), env["XLA_FLAGS"]
    (True, '--xla_backend_optimization_level=0 --xla_cpu_experimental_ynn_fusion_type=')
    >>> guard_ynn(env, (0, 10, 2), False)  # named already: left as it is
    False
    >>> guard_ynn({}, (0, 9, 2), False), guard_ynn({}, (0, 10, 2), True)
    (False, False)
    """
    env = os.environ if environ is None else environ
    if jaxlib_version is None:
        from jax._src import lib

        jaxlib_version = tuple(lib.version)
    if initialized is None:
        from jax._src import xla_bridge

        started = getattr(xla_bridge, "backends_are_initialized", None)
        initialized = True if started is None else started()
    flags = env.get("XLA_FLAGS", "")
    low, high = YNN_JAXLIBS
    if initialized or not low <= tuple(jaxlib_version)[:3] < high:
        return False
    if YNN_FLAG.rstrip("=").lstrip("-") in flags:
        return False
    env["XLA_FLAGS"] = f"{flags} {YNN_FLAG}".strip()
    return True
