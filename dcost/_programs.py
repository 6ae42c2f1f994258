"""Compiled search programs kept on disk: a later process runs a search without tracing it again.

JAX's persistent compilation cache (``dcost._cache``) keeps compiled XLA programs, but a process
must trace and lower a program, then hash it, before it can look the compiled one up; for the
searches that costs more than loading the program (``optimize``: about 1 s of CPU on 2 cores
against 0.3 s). This module keeps each search program's executable under a key computed without
tracing, from what the program is called with, so that a later process with the same structure
of question loads it at once: no tracing, no lowering, no compiling. The executables are
serialized by ``jax.experimental.serialize_executable``; arguments and results cross as flat
lists of arrays, the result's structure kept beside them.

What runs through it: the search programs jitted with ``dcost.search._jit.jit`` that are module
level functions (a closure's behaviour may depend on what it closed over, which no key sees).
When dcost's cache is off (``DCOST_CACHE=0``, an unwritable directory, or a cache set up by the
user for JAX alone), when called inside another trace, or when a program cannot be serialized,
the plain ``jax.jit`` runs as before.

The key is a SHA-256 over everything that decides the program: the function (module and name),
its static arguments, the structure of its arguments (in a form that is the same in every
process) and their leaves' shapes and dtypes, JAX's x64 flag, the XLA compiler options and
``XLA_FLAGS``, the backend and its version, the host's CPU, the versions of jax and jaxlib, and
a fingerprint of dcost's own source (every ``.py`` file of the package): an edit to dcost or an
upgrade of JAX never finds an old program, so a stale entry is simply not found. An entry that is
found but cannot be read or loaded, or takes other arguments (a corrupt or foreign file), is
ignored: the program is traced and compiled again and the entry rewritten, atomically (a
temporary file renamed over it). An executable that loads but fails to run (its results are
awaited inside ``run``) is removed, and the call runs as the plain jit. A program is compiled
for the store with JAX's persistent cache off: an executable that JAX loaded from its own cache
and that is serialized again fails to run when the next process loads it (XLA:CPU, jax 0.10),
and JAX's copy would only duplicate the store's. Entries are executable
code, trusted like JAX's own cache: the directory must stay private to its user
(``dcost._cache``).

Loading an entry is mostly XLA rebuilding the program's HLO module (0.3 s for ``optimize``'s
search on 2 cores), so an entry remembers the one the same process used next (``<entry>.next``,
its file name): ``dcost optimize`` runs the two halves of its search, then the envelope-theorem
elasticities. When an entry is read, the next ``PREFETCH_DEPTH`` entries along that record are
read at the same time, each on a thread of its own; the process takes one from there if it asks
for it (and checks it as any entry), else it is dropped.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import inspect
import os
import pathlib
import pickle
import platform
import struct
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from typing import Any, NamedTuple

import jax
import numpy as np
from jax.tree_util import PyTreeDef

from dcost import _cache

__all__ = [
    "SKIP",
    "run",
    "prepare",
    "during_compile",
    "directory",
    "fingerprint",
    "entries",
    "key",
    "canonical",
    "Unsupported",
]

SKIP = object()
"""What ``run`` returns when the program is to run as a plain ``jax.jit``."""

MAGIC = b"dcost-compiled-program-1\n"
SUFFIX = ".xla"

# (function, structure, shapes, static arguments, x64, options) -> (callable, result structure)
_MEMO: dict[tuple, Any] = {}
_PREFETCHED: dict[pathlib.Path, Future] = {}
"""Entries being read (or read) on a second thread: the successors of those read so far."""
_DURING_COMPILE: list = []
"""``during_compile``'s tasks (``_Task``), outermost block first."""
_LAST: list[pathlib.Path] = []
"""The entry this process used last (at most one), whose successor the next one is."""
NEXT = ".next"
_BROKEN = object()
"""A memo entry for a program whose loaded executable failed to run: the plain jit from then on."""


class Unsupported(Exception):
    """A value whose form would differ between processes (an object printed with its address)."""


_HELPER_DIRECTORY: list[pathlib.Path] = []
"""In a helper process (``dcost._helper``): the store of the process that started it."""


def directory() -> pathlib.Path | None:
    """Where compiled programs live: ``programs/`` inside dcost's compilation cache directory, or
    None when dcost does not own a persistent cache (``dcost._cache.state()``)."""
    if _HELPER_DIRECTORY:
        return _HELPER_DIRECTORY[0]
    state = _cache.state()
    if state.owner != "dcost" or state.path is None:
        return None
    return state.path / "programs"


@functools.cache
def fingerprint() -> str:
    """SHA-256 of dcost's source: every ``.py`` file of the package, by relative path."""
    root = pathlib.Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


@functools.cache
def _host() -> str:
    """The host's CPU: its architecture and (on Linux) the model and feature flags that XLA may
    compile for, so that a cache shared between machines never runs code built for another."""
    text = platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            lines = [ln for ln in f if ln.startswith(("model name", "flags", "Features"))]
        text += "".join(sorted(set(lines)))
    except OSError:
        text += platform.processor()
    return hashlib.sha256(text.encode()).hexdigest()


def entries(where: pathlib.Path | None = None) -> list[pathlib.Path]:
    """The compiled programs in ``where`` (default: ``directory()``)."""
    where = directory() if where is None else where
    if where is None or not where.is_dir():
        return []
    return sorted(where.glob(f"*{SUFFIX}"))


def run(
    fun: Callable,
    args: Sequence,
    kwargs: dict,
    static_argnames: Sequence[str],
    options: dict | None,
    compile_options: Callable[[], dict | None] = lambda: None,
):
    """``fun(*args, **kwargs)`` through its compiled program (loaded from disk, or traced,
    compiled with XLA options ``compile_options()`` and written there first); ``SKIP`` when it
    is to run as a plain ``jax.jit`` instead (see the module docstring). ``options``, the
    options asked for, are part of the key; ``compile_options`` (those the XLA at hand accepts,
    which may take a probe to find) is called only to compile."""
    found = _entry(fun, args, kwargs, static_argnames, options, compile_options, record=True)
    if found is SKIP:
        return SKIP
    memo_key, (call, out_tree, path), leaves = found
    try:
        out = call(*leaves)
        # dispatch is asynchronous: an executable that cannot run fails when its results are
        # awaited, so await them here, where the plain jit can still take over
        jax.block_until_ready(out)
    except Exception:  # noqa: BLE001 - an executable that will not run here: the plain jit
        # (which raises the same error again if the error is the program's own)
        _MEMO[memo_key] = _BROKEN
        _discard(path)
        return SKIP
    return jax.tree.unflatten(out_tree, out)


def prepare(
    fun: Callable,
    args: Sequence,
    kwargs: dict,
    static_argnames: Sequence[str],
    options: dict | None,
    compile_options: Callable[[], dict | None] = lambda: None,
) -> bool:
    """Load or compile the program ``run`` would run for these arguments (only their shapes and
    structure matter), without running it: a later ``run`` with arguments of the same form
    finds it in memory. For a second thread (``during_compile``); it records no successor
    (``<entry>.next``). True when the program is ready."""
    try:
        found = _entry(fun, args, kwargs, static_argnames, options, compile_options, record=False)
    except Exception:  # noqa: BLE001 - whoever runs it later compiles it and reports the error
        return False
    return found is not SKIP


class _Task:
    """A ``during_compile`` task: the function, and the thread running it once started."""

    def __init__(self, fun: Callable[[], object]):
        self.fun: Callable[[], object] = fun
        self.thread: threading.Thread | None = None


@contextlib.contextmanager
def during_compile(task: Callable[[], object]):
    """Inside the block, the first program this thread compiles starts ``task`` on a second
    thread as its compiling begins; leaving the block waits for the task if it started, and
    drops it if nothing compiled (everything was loaded).

    XLA compiles without Python's lock, so a task that traces and compiles another program (the
    command line's elasticities while its search compiles) runs beside it for free on a second
    core, where started with the search it would have slowed the search's tracing. A task's
    errors are its own: it is meant to ``prepare`` a program that is run, and reported on, later.
    """
    entry = _Task(task)
    _DURING_COMPILE.append(entry)
    try:
        yield
    finally:
        _DURING_COMPILE.remove(entry)
        if entry.thread is not None:
            entry.thread.join()


def _start_tasks() -> None:
    """Start the tasks ``during_compile`` registered that have not started, each on a thread."""
    for entry in _DURING_COMPILE:
        if entry.thread is None:

            def work(fun=entry.fun):
                try:
                    fun()
                except Exception:  # noqa: BLE001 - see during_compile
                    pass

            entry.thread = threading.Thread(target=work, name="dcost-during-compile")
            entry.thread.start()


class _Call(NamedTuple):
    """A call of a program in the form its key needs."""

    where: pathlib.Path
    names: tuple
    treedef: PyTreeDef
    leaves: list
    avals: tuple
    static: tuple
    x64: bool
    memo_key: tuple


def _call(fun, args, kwargs, static_argnames, options) -> _Call | None:
    """The call in the form its key needs; None when it runs as the plain jit (the store is
    off, ``fun`` is a lambda or closure, the call is bad, inside another trace or with Python
    scalars, or a static argument is unhashable)."""
    where = directory()
    if where is None or "<" in fun.__qualname__:  # off, or a lambda or closure: no key sees it
        return None
    try:
        bound = _signature(fun).bind(*args, **kwargs)
    except TypeError:
        return None  # let jax.jit report the bad call
    arguments = dict(bound.arguments)
    static = tuple((name, arguments.pop(name)) for name in static_argnames if name in arguments)
    names = tuple(arguments)
    leaves, treedef = jax.tree.flatten(tuple(arguments.values()))
    if not all(isinstance(x, (jax.Array, np.ndarray)) for x in leaves) or any(
        isinstance(x, jax.core.Tracer) for x in leaves
    ):
        return None  # inside another trace, or Python scalars: the plain jit
    avals = tuple(
        (tuple(x.shape), np.dtype(x.dtype).name, bool(getattr(x, "weak_type", False)))
        for x in leaves
    )
    x64 = bool(jax.config.read("jax_enable_x64"))
    frozen = tuple(sorted((options or {}).items()))
    memo_key = (fun, treedef, names, avals, static, x64, frozen)
    try:
        hash(memo_key)
    except TypeError:  # an unhashable static argument
        return None
    return _Call(where, names, treedef, leaves, avals, static, x64, memo_key)


def _entry(fun, args, kwargs, static_argnames, options, compile_options, record: bool):
    """``(memo key, (callable, result structure, path), flat arguments)`` of the program for
    these arguments, loaded or compiled (and remembered in ``_MEMO``); ``SKIP`` for the plain
    jit."""
    c = _call(fun, args, kwargs, static_argnames, options)
    if c is None:
        return SKIP
    entry = _MEMO.get(c.memo_key)
    if entry is _BROKEN:
        return SKIP
    if entry is None:
        entry = _load_or_compile(
            c.where,
            fun,
            c.names,
            c.treedef,
            c.leaves,
            c.avals,
            c.static,
            c.x64,
            options,
            compile_options,
            record,
        )
        if entry is None:
            return SKIP
        _MEMO[c.memo_key] = entry
    return c.memo_key, entry, c.leaves


def _path(where: pathlib.Path, fun, digest: str) -> pathlib.Path:
    """The entry of a program of key ``digest`` in ``where``."""
    return where / f"{fun.__name__.strip('_')}-{digest[:40]}{SUFFIX}"


def stored(fun, args, kwargs, static_argnames, options) -> bool | None:
    """Whether the program ``run`` would run for these arguments is in this process or in the
    store already (a file of its key; whether it loads is found out when it is read); None
    when it would not be kept there (it runs as the plain jit)."""
    c = _call(fun, args, kwargs, static_argnames, options)
    if c is None or _MEMO.get(c.memo_key) is _BROKEN:
        return None
    if c.memo_key in _MEMO:
        return True
    try:
        digest = key(fun, c.names, c.treedef, c.avals, c.static, c.x64, options)
        return _path(c.where, fun, digest).is_file()
    except Unsupported:
        return None


def _discard(path: pathlib.Path) -> None:
    """Remove the entry of an executable that failed to run, so that no later process loads it
    (the next one compiles and writes it again)."""
    try:
        path.unlink(missing_ok=True)
    except OSError:
        pass


@functools.cache
def _signature(fun: Callable) -> inspect.Signature:
    return inspect.signature(fun)


def key(fun: Callable, names, treedef, avals, static, x64: bool, options) -> str:
    """The SHA-256 key of a program (hex); raises ``Unsupported`` when a static part of it has
    no form that is the same in every process."""
    import jaxlib

    backend = jax.devices()[0].client
    parts = (
        fun.__module__,
        fun.__qualname__,
        names,
        canonical(treedef),
        avals,
        canonical(static),
        x64,
        canonical(options or {}),
        os.environ.get("XLA_FLAGS", ""),
        backend.platform,
        backend.platform_version,
        _host(),
        jax.__version__,
        jaxlib.__version__,
        fingerprint(),
    )
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def canonical(value) -> str:
    """A text form of ``value`` that is the same in every process: sets sorted (their order
    follows string hashing, which differs between processes), pytree definitions walked node by
    node, dataclasses and equinox modules field by field, module-level functions by name (their
    code is in the source fingerprint). Raises ``Unsupported`` for anything printed with a
    memory address (a lambda, a closure, an object without a ``repr``)."""
    if isinstance(value, jax.tree_util.PyTreeDef):
        if value.num_nodes == 1 and value.num_leaves == 1:
            return "*"
        data = value.node_data()
        if data is None:
            return "None"
        kind, aux = data
        children = ", ".join(canonical(c) for c in value.children())
        return f"{kind.__module__}.{kind.__qualname__}[{canonical(aux)}]({children})"
    if isinstance(value, (set, frozenset)):
        return "{" + ", ".join(sorted(canonical(v) for v in value)) + "}"
    if isinstance(value, dict):
        items = sorted((canonical(k), canonical(v)) for k, v in value.items())
        return "{" + ", ".join(f"{k}: {v}" for k, v in items) + "}"
    if isinstance(value, (tuple, list)):
        return f"{type(value).__qualname__}({', '.join(canonical(v) for v in value)})"
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ", ".join(
            f"{f.name}={canonical(getattr(value, f.name, None))}" for f in dataclasses.fields(value)
        )
        return f"{type(value).__module__}.{type(value).__qualname__}({fields})"
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    if inspect.isfunction(value) and "<" not in value.__qualname__:
        return f"function {value.__module__}.{value.__qualname__}"
    text = repr(value)
    if " at 0x" in text:
        raise Unsupported(text)
    return text


def _load_or_compile(
    where, fun, names, treedef, leaves, avals, static, x64, options, compile_options, record=True
):
    """``(callable on the flat leaves, result structure, entry path)``, or None when the program
    cannot be keyed (it then runs as a plain jit)."""
    try:
        digest = key(fun, names, treedef, avals, static, x64, options)
    except Unsupported:
        return None
    path = _path(where, fun, digest)
    future = _PREFETCHED.pop(path, None)
    _prefetch_successor(path)
    if future is not None:
        try:
            loaded = _checked(future.result(), avals)
        except Exception:  # noqa: BLE001 - the second thread failed: read it here
            loaded = read(path, avals)
    else:
        loaded = read(path, avals)
    if record:
        _follows(path)
    if loaded is not None:
        return (*loaded, path)
    out_tree = None

    def flat(*flat_leaves):
        nonlocal out_tree
        values = jax.tree.unflatten(treedef, flat_leaves)
        out = fun(**dict(zip(names, values, strict=True)), **dict(static))
        out_leaves, out_tree = jax.tree.flatten(out)
        return out_leaves

    lowered = jax.jit(flat, compiler_options=compile_options()).lower(*leaves)
    if record:  # the process's own program (not a task's): start the tasks waiting for it
        _start_tasks()
    with _jax_cache_off():
        compiled = lowered.compile()
    write(path, compiled, out_tree)
    return compiled, out_tree, path


@contextlib.contextmanager
def _jax_cache_off():
    """Compile without JAX's persistent cache. An executable JAX loaded from its cache, once
    serialized again for ``programs/``, fails to run in the next process (XLA:CPU, jax 0.10:
    ``NOT_FOUND: Function mul.565_kernel not found``); compiled afresh it does not. The store
    keeps the program, so JAX's copy would only be written twice."""
    from jax.experimental.compilation_cache import compilation_cache

    before = bool(jax.config.values["jax_enable_compilation_cache"])
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # JAX decides once per process whether to use its cache
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", before)
        compilation_cache.reset_cache()


def write(path: pathlib.Path, compiled, out_tree) -> None:
    """Write an entry atomically (a temporary file renamed over ``path``). A program that cannot
    be serialized, or a directory that cannot be written, is skipped silently: the program has
    run, it is only not kept."""
    from jax.experimental import serialize_executable

    try:
        payload, in_tree, flat_out = serialize_executable.serialize(compiled)
        body = pickle.dumps((payload, in_tree, flat_out), protocol=pickle.HIGHEST_PROTOCOL)
        # the result's structure, as an object with placeholder leaves: equinox's pytree
        # definitions do not survive pickling, the objects do
        skeleton = jax.tree.unflatten(out_tree, [np.zeros(())] * out_tree.num_leaves)
        head = pickle.dumps(skeleton, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - not serializable (constants, callbacks, ...): not kept
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile(dir=path.parent, delete=False, suffix=".tmp") as f:
            f.write(MAGIC + struct.pack("<Q", len(head)) + head + body)
            tmp = f.name
        os.replace(tmp, path)
    except OSError:
        pass


def _initialize_lapack() -> None:
    """Load LAPACK's kernels for the programs that call them (a linear solve, a Cholesky). JAX
    registers its LAPACK custom calls at import but fills in their kernels only when it first
    lowers one (``jax._src.lax.linalg.initialize_lapack``); an executable loaded from the store
    traces nothing, and calling a kernel never filled in crashed the process (a segmentation
    fault, XLA:CPU, jax 0.10). Done only for entries that name a LAPACK target (it imports SciPy's
    LAPACK: about 0.09 s)."""
    try:
        from jax._src.lax import linalg
    except ImportError:  # pragma: no cover - a JAX that moved it; the program is traced afresh
        return
    initialize = getattr(linalg, "initialize_lapack", None)
    if initialize is not None:
        initialize()


def read(path: pathlib.Path, avals):
    """``(loaded executable, result structure)`` of an entry that takes arguments of these
    ``avals``; None when it is absent, unreadable, corrupt or takes other arguments."""
    return _checked(_load(path), avals)


def _load(path: pathlib.Path):
    """``(loaded executable, result structure)`` of an entry; None when it is absent,
    unreadable or corrupt. Safe on any thread."""
    from jax.experimental import serialize_executable

    try:
        data = path.read_bytes()
    except OSError:
        return None
    try:
        if not data.startswith(MAGIC):
            return None
        start = len(MAGIC) + 8
        (size,) = struct.unpack("<Q", data[len(MAGIC) : start])
        # annotated: jax's own annotation of jax.tree.structure does not resolve for mypy
        out_tree: PyTreeDef = jax.tree.structure(pickle.loads(data[start : start + size]))
        payload, in_tree, flat_out = pickle.loads(data[start + size :])
        if flat_out.num_leaves != out_tree.num_leaves:
            return None
        if b"lapack_" in payload:
            _initialize_lapack()
        compiled = serialize_executable.deserialize_and_load(payload, in_tree, flat_out)
    except Exception:  # noqa: BLE001 - whatever is wrong with the file: compile again
        return None
    return compiled, out_tree


def _checked(loaded, avals):
    """``loaded`` when its executable takes arguments of these ``avals``, else None."""
    if loaded is None:
        return None
    try:
        theirs = tuple(
            (tuple(a.shape), np.dtype(a.dtype).name) for a in jax.tree.leaves(loaded[0].in_avals)
        )
    except Exception:  # noqa: BLE001 - not an executable this JAX can describe: compile again
        return None
    return loaded if theirs == tuple(a[:2] for a in avals) else None


def successor(path: pathlib.Path) -> pathlib.Path | None:
    """The entry that followed ``path`` the last time a process used it (``<entry>.next``), or
    None when none is recorded (or the record is not a plain entry name)."""
    try:
        name = path.with_suffix(NEXT).read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None
    if not name.endswith(SUFFIX) or "/" in name or "\\" in name or name.startswith("."):
        return None
    return path.parent / name


PREFETCH_DEPTH = 2
"""How far along the recorded chain of successors an entry's reading reaches (``optimize``'s
two programs, then the command line's elasticities)."""


def _prefetch_successor(path: pathlib.Path) -> None:
    """Start reading ``path``'s successors, up to ``PREFETCH_DEPTH`` along the chain, each on a
    thread of its own (each entry once per process)."""
    seen = {path}
    nxt = successor(path)
    for _ in range(PREFETCH_DEPTH):
        if nxt is None or nxt in seen or not nxt.is_file():
            return
        seen.add(nxt)
        if nxt not in _PREFETCHED and not _loaded(nxt):
            _start_prefetch(nxt)
        nxt = successor(nxt)


def _loaded(path: pathlib.Path) -> bool:
    """Whether this process holds the entry at ``path`` already."""
    return any(entry is not _BROKEN and entry[2] == path for entry in _MEMO.values())


def _start_prefetch(path: pathlib.Path) -> None:
    future: Future = Future()

    def work():
        try:
            future.set_result(_load(path))
        except BaseException as err:  # noqa: BLE001 - handed to whoever asks for the entry
            future.set_exception(err)

    _PREFETCHED[path] = future
    threading.Thread(target=work, name="dcost-prefetch", daemon=False).start()


def _follows(path: pathlib.Path) -> None:
    """Record that ``path`` followed the entry used before it (rewritten only when it
    changes); a directory that cannot be written is left as it is."""
    if _LAST and _LAST[0] != path:
        side = _LAST[0].with_suffix(NEXT)
        try:
            if successor(_LAST[0]) != path:
                with tempfile.NamedTemporaryFile(
                    "w", dir=side.parent, delete=False, suffix=".tmp"
                ) as f:
                    f.write(path.name)
                    tmp = f.name
                os.replace(tmp, side)
        except OSError:
            pass
    _LAST[:] = [path]


# ------------------------------------------------------------------ a helper process

HELPER_ENV = "DCOST_PROGRAMS_HELPER"
"""Set in a helper process (``prepare_elsewhere``): it starts none of its own."""

HELPER_TIMEOUT = 300.0
"""Seconds a process waits for its helper at most before it compiles the programs itself."""


def cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


class Helper:
    """A process that compiles programs into the store while this one compiles its own
    (``prepare_elsewhere``)."""

    def __init__(self, process, payload: pathlib.Path):
        self.process = process
        self.payload = payload

    def wait(self, timeout: float = HELPER_TIMEOUT) -> bool:
        """Wait for the helper (at most ``timeout`` seconds, then stop it); True when it
        prepared every program. The programs are then found in the store; when it did not,
        whoever runs them compiles them."""
        import subprocess

        try:
            code = self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            self.stop()
        return code == 0

    def stop(self) -> None:
        """Stop the helper if it still runs (this process was interrupted, or gave up on it)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.payload.unlink(missing_ok=True)


def prepare_elsewhere(tasks: Sequence[tuple | None]) -> Helper | None:
    """Start a process that loads or compiles programs into the store (``prepare`` in it), for
    a process that compiles another program meanwhile: Python's lock lets one thread trace at a
    time, and tracing and lowering are most of a cold ``dcost plan`` (the planner's three
    searches), so on two cores a second process halves them where threads could not.

    ``tasks``: each ``jitted.elsewhere(*args)`` of a program jitted by ``dcost.search._jit``
    (None: in the store already, or never kept there; skipped). Returns the ``Helper`` (wait
    for it before running the programs), or None when nothing was started: no task left, the
    store off, one core, or this process a helper itself. The helper is this interpreter with
    this environment, this store and the x64 flag of this process; it reads its tasks from a
    file in the store's directory (private to its user)."""
    import subprocess
    import sys

    todo = [t for t in tasks if t is not None]
    where = directory()
    if not todo or where is None or os.environ.get(HELPER_ENV) or cores() < 2:
        return None
    x64 = bool(jax.config.read("jax_enable_x64"))
    try:
        where.mkdir(parents=True, exist_ok=True, mode=0o700)
        with tempfile.NamedTemporaryFile(dir=where, delete=False, suffix=".tasks") as f:
            pickle.dump(
                {"x64": x64, "where": str(where), "tasks": todo},
                f,
                protocol=pickle.HIGHEST_PROTOCOL,
            )
            payload = pathlib.Path(f.name)
    except (OSError, pickle.PicklingError, TypeError, AttributeError):
        return None
    env = dict(os.environ)
    env[HELPER_ENV] = "1"
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "dcost._helper", str(payload)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
    except (OSError, ValueError):  # no interpreter to start
        payload.unlink(missing_ok=True)
        return None
    return Helper(process, payload)
