"""The persistent compilation cache: XLA programs compiled once are kept on disk between processes.

``import dcost`` points JAX's persistent compilation cache at ``$XDG_CACHE_HOME/dcost/jax``
(``~/.cache/dcost/jax`` when ``XDG_CACHE_HOME`` is unset) and lowers JAX's thresholds so that small
programs are kept too (JAX's defaults keep only programs that took a second or more to compile).
A second process asking the same question then loads the compiled programs instead of compiling
them again; what it still pays is the import of JAX and the tracing of the programs, which no
cache of compiled code skips (see `docs/speed.md`, "Speed from the first call").

Environment, read once at import:

- ``DCOST_CACHE=0`` (or ``off``, ``false``, ``no``): dcost leaves JAX's cache settings alone.
- ``DCOST_CACHE_DIR=path``: keep the cache there instead. JAX treats its cache as trusted code:
  a directory others can write to lets them run code in your processes.
- A cache the user set up for JAX (``JAX_COMPILATION_CACHE_DIR``, or
  ``jax.config.update("jax_compilation_cache_dir", ...)`` before ``import dcost``) is used as it
  is: dcost changes none of its settings.

A directory that cannot be created or written turns the cache off, silently: a read-only home
must not stop the library from working. ``state()`` says what was decided.
"""

from __future__ import annotations

import os
import pathlib
import tempfile
from typing import Any, NamedTuple

import jax

__all__ = ["CacheState", "default_dir", "setup", "state", "describe", "OFF_VALUES"]

OFF_VALUES = frozenset({"0", "off", "false", "no"})

# JAX settings dcost lowers when it owns the cache, unless the user set them through the
# environment: cache every program, however quickly it compiled and however small it is.
_THRESHOLDS = {
    "jax_persistent_cache_min_compile_time_secs": ("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", 0),
    "jax_persistent_cache_min_entry_size_bytes": ("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", -1),
}


class CacheState(NamedTuple):
    """What ``setup`` decided.

    Attributes:
      path: the cache directory in use (``None``: no persistent cache).
      owner: ``"dcost"`` (dcost set it up), ``"user"`` (the user's own JAX cache, untouched),
        ``"off"`` (``DCOST_CACHE`` said so) or ``"unwritable"`` (the directory could not be
        created or written; ``reason`` says why).
      reason: one line for ``dcost warmup`` and the like.
    """

    path: pathlib.Path | None
    owner: str
    reason: str


_STATE: CacheState | None = None


def default_dir(environ=None) -> pathlib.Path:
    """``$DCOST_CACHE_DIR``, else ``$XDG_CACHE_HOME/dcost/jax``, else ``~/.cache/dcost/jax``.

    >>> str(default_dir({"XDG_CACHE_HOME": "/x"}))
    '/x/dcost/jax'
    >>> str(default_dir({"DCOST_CACHE_DIR": "/y", "XDG_CACHE_HOME": "/x"}))
    '/y'
    """
    env = os.environ if environ is None else environ
    if env.get("DCOST_CACHE_DIR"):
        return pathlib.Path(env["DCOST_CACHE_DIR"]).expanduser()
    base = env.get("XDG_CACHE_HOME") or ""
    # the XDG spec: a relative XDG_CACHE_HOME is invalid and is to be ignored
    root = pathlib.Path(base) if os.path.isabs(base) else pathlib.Path.home() / ".cache"
    return root / "dcost" / "jax"


def _writable(path: pathlib.Path) -> str | None:
    """``None`` when ``path`` exists (created if need be) and a file can be written in it."""
    try:
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError as err:
        return f"{err.strerror or err} ({path})"
    return None


def setup(environ=None) -> CacheState:
    """Point JAX's persistent compilation cache at dcost's directory (see the module docstring).

    Called once by ``import dcost``; later calls return that first decision. Never raises for a
    bad directory: the cache is then off and ``state().reason`` says why.
    """
    global _STATE
    if _STATE is None:
        _STATE = _decide(os.environ if environ is None else environ)
    return _STATE


def _decide(env) -> CacheState:
    config: Any = jax.config  # its flags are attributes made at run time, unknown to type checkers
    user_dir = config.jax_compilation_cache_dir
    if user_dir:  # set by JAX_COMPILATION_CACHE_DIR or by the user's own config.update
        return CacheState(pathlib.Path(user_dir), "user", "the user's own JAX cache, as set")
    switch = env.get("DCOST_CACHE", "").strip().lower()
    if switch in OFF_VALUES:
        return CacheState(None, "off", f"turned off by DCOST_CACHE={env['DCOST_CACHE']}")
    path = default_dir(env)
    problem = _writable(path)
    if problem is not None:
        return CacheState(None, "unwritable", f"off: cannot write the directory: {problem}")
    jax.config.update("jax_compilation_cache_dir", str(path))
    for option, (variable, value) in _THRESHOLDS.items():
        if variable not in env:
            jax.config.update(option, value)
    return CacheState(path, "dcost", "on")


def state() -> CacheState:
    """The decision ``setup`` took (it runs now if it has not run yet)."""
    return setup()


def describe() -> str:
    """One line for the demo and ``dcost warmup``: where compiled programs are kept, if anywhere."""
    s = state()
    if s.path is None:
        return f"compilation cache: none ({s.reason})"
    return f"compilation cache: {s.path} ({s.reason}); `dcost warmup` compiles the common programs"
