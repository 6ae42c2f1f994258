"""A pool: replicas of one serving design, seen through the time of one step.

The planner never looks inside the serving model: a pool carries a **step-time function**
``step(batch, tokens) -> seconds``, the duration of one engine step that decodes one token for
each of ``batch`` running sequences and prefills ``tokens`` prompt tokens (a chunk; 0 in a pure
decode step). The serving model's ``decode``/``mixed_step`` reports give it for a design; a test
can give a roofline. It must accept arrays (NumPy or JAX, broadcasting) and be non-decreasing in
both arguments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import equinox as eqx
import jax.numpy as jnp
import numpy as np

from dcost._types import FloatLeaf
from dcost.specs import _float, check, readable

__all__ = ["Pool", "roofline_step", "StepTime"]

StepTime = Callable[..., Any]


class Pool(eqx.Module):
    """Replicas of one design under continuous batching.

    Attributes:
      step: step-time function ``step(batch, tokens)`` (s); static (part of the tree structure).
      replicas: replicas in the pool ``n`` (>= 1).
      batch_cap: most running sequences per replica (prefilling or decoding; vLLM's
        ``max_num_seqs``) (>= 1).
      chunk: most prompt tokens per step per replica, the prefill chunk budget ``C`` (>= 1).

    >>> p = Pool(roofline_step(0.02, 1e-4, 2e-5), replicas=4, batch_cap=128, chunk=2048)
    >>> round(float(p.step(10, 0)), 6), round(float(p.step(10, 2048)), 6)
    (0.021, 0.04096)
    """

    step: StepTime = eqx.field(static=True)
    replicas: FloatLeaf = eqx.field(converter=_float)
    batch_cap: FloatLeaf = eqx.field(converter=_float)
    chunk: FloatLeaf = eqx.field(converter=_float)

    __repr__ = readable

    def __check_init__(self):
        if not callable(self.step):
            raise TypeError(
                f"Pool.step = {self.step!r} is not allowed: it must be a function "
                "step(batch, tokens) -> seconds"
            )
        check("Pool", "replicas", self.replicas, low=1.0)
        check("Pool", "batch_cap", self.batch_cap, low=1.0)
        check("Pool", "chunk", self.chunk, low=1.0)


class _Roofline(eqx.Module):
    base: float = eqx.field(static=True)
    per_sequence: float = eqx.field(static=True)
    per_prompt_token: float = eqx.field(static=True)

    def __call__(self, batch, tokens):
        # NumPy arrays in, NumPy out (the simulation's table); anything else through JAX
        xp = np if isinstance(batch, np.ndarray) and isinstance(tokens, np.ndarray) else jnp
        return xp.maximum(self.base + self.per_sequence * batch, self.per_prompt_token * tokens)


def roofline_step(base: float, per_sequence: float, per_prompt_token: float) -> StepTime:
    """The roofline step ``t(B, c) = max(a + b B, e c)`` (s): weight and KV reads (``a``, plus
    ``b`` per running sequence) against the compute of ``c`` prompt tokens (``e`` each).

    A prompt chunk is free while the step is bound by memory reads and sets the step once its
    compute is longer (Williams, Waterman and Patterson, "Roofline", CACM 52(4), 2009; chunked
    prefill rides on decode steps this way: Agrawal et al., "Sarathi-Serve", OSDI 2024, sec. 4).

    Args:
      base: ``a`` (s).
      per_sequence: ``b`` (s per decoding sequence).
      per_prompt_token: ``e`` (s per prompt token).

    >>> t = roofline_step(0.02, 1e-4, 2e-5)
    >>> [round(float(t(100, c)), 6) for c in (0, 500, 2000)]
    [0.03, 0.03, 0.04]
    """
    for name, v in (("base", base), ("per_sequence", per_sequence)):
        check("roofline_step", name, v)
    check("roofline_step", "per_prompt_token", per_prompt_token)
    return _Roofline(float(base), float(per_sequence), float(per_prompt_token))
