"""``jit`` for the planner's smaller programs (``envelope``, ``fleet``): XLA's classic CPU
emitters (``dcost._xla``), compiled per process (and by JAX's persistent cache), never through
``dcost._programs``.

The planner's own programs (its step tables, its search and its grid check, ``planner.py``) use
``dcost.search._jit.jit`` instead, which keeps their executables on disk (``dcost._programs``),
so that a second ``dcost plan`` loads them instead of tracing them again. An earlier form of the
search (a ``lax.map`` of vmapped ``while_loop`` s over gathered step tables) failed to run once
deserialized on XLA:CPU (JAX 0.10.2: "Function multiply_divide_fusion not found" when
dispatching); the present one runs (``tests/test_programs.py`` plans from the store), and an
executable that fails to run falls back to the plain ``jax.jit`` in any case.
"""

from __future__ import annotations

import functools
from typing import Any

import jax

from dcost import _xla

__all__ = ["jit"]


def jit(fun=None, *, fast_compile: bool = False, optimized: bool = False, **kwargs):
    """``jax.jit(fun, compiler_options=dcost._xla.options(fast_compile), **kwargs)``, compiled on
    first use (fast also when ``DCOST_FAST_COMPILE`` is on: ``dcost._xla.prefer_fast``); usable as
    a decorator. ``optimized=True``: at XLA's own level unless ``DCOST_FAST_COMPILE`` is
    ``all``, for a program that runs long loops and is run often enough to pay for its longer
    compile."""
    if fun is None:
        return functools.partial(jit, fast_compile=fast_compile, optimized=optimized, **kwargs)

    @functools.cache
    def compiled_with(fast: bool):
        return jax.jit(fun, compiler_options=_xla.options(fast), **kwargs)

    def compiled():
        return compiled_with(
            (not optimized or _xla.even_optimized()) and _xla.prefer_fast(fast_compile)
        )

    @functools.wraps(fun)
    def call(*args, **kw):
        return compiled()(*args, **kw)

    jitted: Any = call
    jitted.lower = lambda *args, **kw: compiled().lower(*args, **kw)
    return jitted
