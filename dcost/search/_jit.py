"""``jit`` for the searches: on CPU, compile with XLA's classic element-wise emitters.

The searches are long programs of small scalar kernels (a scan of gradient steps, a bisection,
the exact model at many designs). XLA:CPU's default MLIR fusion emitters compile them several
times more slowly than the classic ones (``optimize``: about 10 s against 4 s on 2 cores) for no
measurable gain at run time, so on the CPU backend the searches ask for the classic ones. The
option is probed once; where XLA no longer knows it, plain ``jax.jit`` is used.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp

__all__ = ["jit"]

_CPU_OPTIONS = {"xla_cpu_use_fusion_emitters": False}
_FAST_COMPILE = {"xla_backend_optimization_level": 0}


@functools.cache
def _options(fast_compile: bool) -> dict | None:
    if jax.default_backend() != "cpu":
        return None
    options = dict(_CPU_OPTIONS, **(_FAST_COMPILE if fast_compile else {}))
    try:
        jax.jit(lambda x: x + 1.0, compiler_options=options)(jnp.zeros(()))
    except Exception:  # noqa: BLE001 - an XLA without the options: fall back to the defaults
        return None
    return options


def jit(fun=None, *, fast_compile: bool = False, **kwargs):
    """``jax.jit(fun, **kwargs)`` with the CPU compiler options above; usable as a decorator."""
    if fun is None:
        return functools.partial(jit, fast_compile=fast_compile, **kwargs)

    @functools.cache
    def compiled():
        return jax.jit(fun, compiler_options=_options(fast_compile), **kwargs)

    @functools.wraps(fun)
    def call(*args, **kw):
        return compiled()(*args, **kw)

    jitted: Any = call  # a function that also carries the two attributes below
    jitted.lower = lambda *args, **kw: compiled().lower(*args, **kw)
    jitted.compiled = compiled
    return jitted
