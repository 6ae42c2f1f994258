"""Annotations for type checkers: a spec field built from any number, read back as a jax.Array.

A spec's numeric field is declared ``eqx.field(converter=_float)``: the constructor takes any
array-like (``64``, ``2.5e12``, a NumPy array, a JAX array or tracer) and the instance holds a float
``jax.Array``. Type checkers do not read equinox's converters, so the field is annotated with a
descriptor type whose ``__set__`` says what the constructor accepts and whose ``__get__`` says what
reading the field gives (PEP 681's descriptor-typed fields). At run time both names are plain
``jax.Array`` aliases and nothing here executes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, overload

import jax

__all__ = ["FloatLeaf", "OptionalFloatLeaf"]

if TYPE_CHECKING:
    from jax.typing import ArrayLike

    class FloatLeaf:
        """A field converted to a float ``jax.Array``; set from any array-like."""

        @overload
        def __get__(self, obj: None, owner: Any) -> FloatLeaf: ...
        @overload
        def __get__(self, obj: object, owner: Any) -> jax.Array: ...
        def __get__(self, obj: object, owner: Any) -> FloatLeaf | jax.Array: ...
        def __set__(self, obj: object, value: ArrayLike) -> None: ...

    class OptionalFloatLeaf:
        """Like ``FloatLeaf``, and ``None`` (the default) stays ``None``."""

        @overload
        def __get__(self, obj: None, owner: Any) -> OptionalFloatLeaf: ...
        @overload
        def __get__(self, obj: object, owner: Any) -> jax.Array | None: ...
        def __get__(self, obj: object, owner: Any) -> OptionalFloatLeaf | jax.Array | None: ...
        def __set__(self, obj: object, value: ArrayLike | None) -> None: ...

else:
    FloatLeaf = jax.Array
    OptionalFloatLeaf = jax.Array
