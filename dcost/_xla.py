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
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

__all__ = ["requested", "options", "prefer_fast", "even_optimized", "chosen"]

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
