"""``jit`` for the searches: XLA's classic CPU emitters, and programs kept on disk.

The searches are long programs of small scalar kernels (a scan of gradient steps, a bisection,
the exact model at many designs). XLA:CPU's default MLIR fusion emitters compile them several
times more slowly than the classic ones (``optimize``: about 10 s against 4 s on 2 cores) for no
measurable gain at run time, so on the CPU backend the searches ask for the classic ones
(``dcost._xla``: probed once; where XLA no longer knows them, plain ``jax.jit``).

A module-level function jitted here also runs through ``dcost._programs`` when dcost's persistent
cache is on: its traced program is kept on disk, so that a later process skips tracing and
lowering it (and XLA's cache, compiling it). ``fun.prepare(*args)`` loads or compiles that
program without running it, for a second thread (``dcost._programs.during_compile``: a
program the process will need next compiles while another does).

Inside ``with prefer_fast_compile():`` every search program compiles with ``fast_compile`` (XLA's
backend optimization level 0): it compiles about 2.5x faster and runs about 2x slower
(``optimize``: 1.7 s against 4.2 s of CPU to compile, 15-23 ms against 9-13 ms a solve on 2
cores), the right trade for a process that asks one question, such as the command line.
``DCOST_FAST_COMPILE=1`` does the same for a whole process (``dcost._xla.prefer_fast``).
"""

from __future__ import annotations

import contextlib
import functools
from typing import Any

import jax

from dcost import _programs, _xla

__all__ = ["jit", "prefer_fast_compile"]

_PREFER_FAST_COMPILE = False
_EVEN_OPTIMIZED = False


@contextlib.contextmanager
def prefer_fast_compile(even_optimized: bool = False):
    """Inside the block, every search program compiles with ``fast_compile`` (a program
    compiled before keeps its options; after the block each asks for its own again). For a
    process that asks one question: the command line. ``even_optimized``: the programs that ask
    for XLA's own level (``optimized=True``: the planner's) too, for a process that runs each of
    them once or twice (``dcost plan``: about 7 s less to compile on an empty cache, 0.2-0.3 s
    more to run a plan); never the vectorized sweeps (``sweep=True``)."""
    global _PREFER_FAST_COMPILE, _EVEN_OPTIMIZED
    before = _PREFER_FAST_COMPILE, _EVEN_OPTIMIZED
    _PREFER_FAST_COMPILE, _EVEN_OPTIMIZED = True, even_optimized or _EVEN_OPTIMIZED
    try:
        yield
    finally:
        _PREFER_FAST_COMPILE, _EVEN_OPTIMIZED = before


_requested, _options = _xla.requested, _xla.options


def jit(
    fun=None, *, fast_compile: bool = False, optimized: bool = False, sweep: bool = False, **kwargs
):
    """``jax.jit(fun, **kwargs)`` with the CPU compiler options above; usable as a decorator.

    Static arguments are given by ``static_argnames`` (``dcost._programs`` relies on it).
    ``optimized=True`` compiles at XLA's own optimization level unless the process asks even
    those programs to compile fast (``prefer_fast_compile(even_optimized=True)``,
    ``DCOST_FAST_COMPILE=all``): for a program that runs a search of many candidates (the
    planner's: at level 0 a plan runs 0.2-0.3 s longer, and compiles about 7 s sooner).
    ``sweep=True`` compiles at XLA's own level whatever is asked: for a vectorized sweep of up to
    millions of designs, which level 0 runs several times more slowly than it compiles faster
    (``dcost.grid_search``'s chunks: 20.4 s against 7.4 s for a 24-scenario grid)."""
    if fun is None:
        return functools.partial(
            jit, fast_compile=fast_compile, optimized=optimized, sweep=sweep, **kwargs
        )
    static_argnames = tuple(kwargs.get("static_argnames", ()))
    exportable = "<locals>" not in fun.__qualname__ and "static_argnums" not in kwargs

    @functools.cache
    def compiled_with(fast: bool):
        return jax.jit(fun, compiler_options=_options(fast), **kwargs)

    def fast_now() -> bool:
        if sweep:
            return False
        if optimized:
            return _EVEN_OPTIMIZED or _xla.even_optimized()
        return _xla.prefer_fast(fast_compile or _PREFER_FAST_COMPILE)

    def compiled():
        return compiled_with(fast_now())

    @functools.wraps(fun)
    def call(*args, **kw):
        if exportable:
            fast = fast_now()
            # the options asked for key the program; they are probed only to compile one
            out = _programs.run(
                fun, args, kw, static_argnames, _requested(fast), lambda: _options(fast)
            )
            if out is not _programs.SKIP:
                return out
        return compiled()(*args, **kw)

    def prepare(*args, **kw) -> bool:
        """Load or compile the stored program for arguments of this form without running it
        (``dcost._programs.prepare``). False where it would run as the plain jit (nothing is
        prepared)."""
        return prepare_as(fast_now(), *args, **kw)

    def prepare_as(fast: bool, *args, **kw) -> bool:
        """``prepare`` compiled fast (XLA's level 0) or not, as another process asked
        (``dcost._programs.prepare_elsewhere``)."""
        if not exportable:
            return False
        return _programs.prepare(
            fun, args, kw, static_argnames, _requested(fast), lambda: _options(fast)
        )

    def elsewhere(*args, **kw) -> tuple | None:
        """What a helper process needs to ``prepare`` this program (``prepare_elsewhere``'s
        task), or None when it is already in the store or would not be kept there."""
        if not exportable:
            return None
        fast = fast_now()
        if _programs.stored(fun, args, kw, static_argnames, _requested(fast)) is not False:
            return None
        return (fun.__module__, fun.__name__, fast, args, kw)

    jitted: Any = call  # a function that also carries the attributes below
    jitted.lower = lambda *args, **kw: compiled().lower(*args, **kw)
    jitted.compiled = compiled
    jitted.prepare = prepare
    jitted.prepare_as = prepare_as
    jitted.elsewhere = elsewhere
    return jitted
