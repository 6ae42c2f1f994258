"""The public cost functions as jitted programs: arguments checked outside, numbers traced inside.

A public cost function (``decode``, ``prefill``, ``mixed_step``) checks its arguments eagerly (their
types, a concrete smoothness, the workload fields it needs), then runs one ``jax.jit`` of its body,
which returns the report and whether every field of it is finite. A concrete report that
overflowed raises ``SpecError`` after the call, with the message eager evaluation gave; a report
with traced fields (the call made inside a user's ``jit``, ``vmap`` or ``grad``: a nested jit) is
returned unchecked, as before.

What selects a compiled program is the static structure alone: the pytrees' structure (which
optional fields are set), the dtypes and shapes of their leaves, JAX's x64 flag. Every number,
the smoothness included, is traced: a loop over designs, contexts, presets or smoothness values
runs one program (``tests/test_jitted_api.py`` counts its traces). A Python ``int`` smoothness is
passed on as a ``float``, so that ``0`` and ``0.0`` share the program too. Small calls compile
for speed of compiling, large batches for speed of running (``SMALL``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dcost import _xla
from dcost.smooth import MAX_SMOOTHNESS, check_smoothness
from dcost.specs import (
    Design,
    Hardware,
    Model,
    SpecError,
    Workload,
    check,
    check_groups,
    check_speculation,
    float_max,
    with_experts,
)

__all__ = ["check_types", "smoothness_argument", "jitted", "all_finite", "checked"]


def check_types(owner: str, design, hardware, model, workload) -> None:
    """Raise SpecError unless the four arguments are a Design, Hardware, Model and Workload, and
    unless a concrete ``design.experts`` suits the model (``dcost.specs.with_experts``), its
    groups divide its chips (``check_groups``) and its draft tokens have a draft and, but in a
    prefill, an acceptance rate (``check_speculation``)."""
    for name, value, cls in (
        ("design", design, Design),
        ("hardware", hardware, Hardware),
        ("model", model, Model),
        ("workload", workload, Workload),
    ):
        if not isinstance(value, cls):
            raise SpecError(
                f"{owner}.{name} must be a dcost.{cls.__name__}, got {type(value).__name__}"
            )
    if design.experts is not None:
        with_experts(model, design)  # its checks; the body sets the experts again, traced
    check_groups(owner, design)
    # a prefill verifies no draft tokens: it needs no acceptance, but a draft all the same
    check_speculation(owner, design, model, None if owner == "prefill" else workload)


def smoothness_argument(owner: str, smoothness):
    """``smoothness`` checked (``dcost.smooth.check_smoothness``) and ready to trace: a Python
    number in ``[0, MAX_SMOOTHNESS]`` becomes a ``float`` without the general check's cost, and
    so does a NumPy scalar (one program for all of them); arrays pass as they are."""
    if type(smoothness) in (float, int) and 0.0 <= smoothness <= MAX_SMOOTHNESS:  # NaN fails
        return float(smoothness)
    check_smoothness(owner, smoothness)
    if isinstance(smoothness, np.generic) or (
        isinstance(smoothness, np.ndarray) and smoothness.ndim == 0
    ):
        return float(smoothness)  # a NumPy scalar shares the program of a Python float
    return smoothness


def _top_level() -> bool:
    """Whether no transformation (jit, vmap, grad, ...) is tracing now."""
    from jax._src import core

    return core.trace_state_clean()


@functools.cache
def _zero(x64: bool):
    """0.0 as a weakly typed array (the abstract value of a Python ``0.0``, for one program)."""
    del x64  # the cache key: the array's dtype follows the flag
    return jnp.asarray(0.0)


def all_finite(tree):
    """Whether every element of every leaf of ``tree`` is finite (a boolean scalar).

    The largest magnitude over the leaves, elementwise (NaN propagates), then over the elements:
    one reduction, which XLA fuses with the computation of every leaf (one pass, not one a leaf).
    """
    largest = functools.reduce(jnp.maximum, [jnp.abs(x) for x in jax.tree.leaves(tree)])
    return jnp.isfinite(jnp.max(largest))


_CONFIG: Any = jax.config  # its flags are attributes made at run time, unknown to type checkers

TRACED = object()
"""The status of a call made inside a user's transformation: nothing to check after it."""

SMALL = 64
"""A call whose ``design.batch`` and ``workload.context`` hold at most this many numbers runs a
program compiled for speed of compiling (``dcost._xla.options(fast_compile=True)``: about 0.13 s
for a new structure against 0.6 s on 2 cores, the same 40 us a call); a larger batch, or a call
inside a transformation (traced fields), one compiled for speed of running (JAX's defaults: more
than 10x faster over 10**6 designs)."""


def jitted(name: str, body: Callable, at_least_one: tuple[str, ...] = ()) -> Callable:
    """``jax.jit`` of ``body(design, hardware, model, workload, smoothness)`` that also returns a
    status, named ``name`` (its XLA program is ``jit_<name>``), compiled as ``SMALL`` says.

    The status is one integer, so that the caller reads one number back: bit 0 set when a field
    of the report is not finite, bit ``i`` when the workload field ``at_least_one[i-1]`` is
    below 1 somewhere (``checked`` turns them into the usual errors).
    """

    def run(design, hardware, model, workload, smoothness):
        report = body(design, hardware, model, workload, smoothness)
        flags = [~all_finite(report)]
        flags += [jnp.any(getattr(workload, f) < 1.0) for f in at_least_one]
        status = sum(flag.astype(jnp.int32) << i for i, flag in enumerate(flags))
        return report, status

    run.__name__ = run.__qualname__ = name
    run.__doc__ = body.__doc__

    @functools.cache
    def program(small: bool):
        return jax.jit(run, compiler_options=_xla.options(True) if small else None)

    def call(design, hardware, model, workload, smoothness):
        b, t = design.batch, workload.context
        if not _top_level():
            # inside a user's jit, vmap or grad: the body joins their program as it is
            return body(design, hardware, model, workload, smoothness), TRACED
        small = b.size <= SMALL and t.size <= SMALL
        if type(smoothness) is float and smoothness == 0.0:  # the usual value: an array made
            smoothness = _zero(bool(_CONFIG.jax_enable_x64))  # once saves converting it
        return program(small)(design, hardware, model, workload, smoothness)

    call.__name__ = call.__qualname__ = name
    return call


def checked(owner: str, report, status, design, workload, at_least_one: tuple[str, ...] = ()):
    """``report``, or SpecError when the status of ``jitted`` says that a workload field is below
    1 (the error ``check`` gives, naming the field) or that a concrete field of the report is inf
    or NaN (the inputs overflowed the float dtype).

    A traced status (the call made inside a user's ``jit``, ``vmap`` or ``grad``) leaves the
    workload fields to ``check``, which refuses concrete ones as it did before the call was
    jitted, and returns the report unchecked.
    """
    if status is TRACED or isinstance(status, jax.core.Tracer):
        for name in at_least_one:
            check("Workload", name, getattr(workload, name), low=1.0)
        return report
    code = int(np.asarray(status))  # one number read back: much cheaper than bool(jax.Array)
    if code == 0:
        return report
    for name in at_least_one:
        check("Workload", name, getattr(workload, name), low=1.0)  # raises for the bad one
    if not code & 1:
        return report
    bad = [
        f"{f} = {float(jnp.ravel(v)[~jnp.isfinite(jnp.ravel(v))][0])}"
        for f in type(report).__dataclass_fields__
        if not bool(jnp.all(jnp.isfinite(v := getattr(report, f))))
    ]
    dtype = str(jnp.dtype(jnp.result_type(float)))
    raise SpecError(
        f"{owner}: {design!r} with {workload!r} is not allowed: its results overflow {dtype} "
        f"({', '.join(bad[:3])}); every result must be finite (at most {float_max():g}): "
        "use a smaller batch, context or model, or enable jax_enable_x64"
    )
