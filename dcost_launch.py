"""The ``dcost`` console script: hand the command to a running ``dcost daemon``, else run it here.

A process that imports dcost pays for importing JAX (about 0.6 s on 2 cores) and then for
tracing or loading its programs, every time; a warm ``dcost plan`` took about 2 s, of which the
planning itself is 0.2-0.3 s. ``dcost daemon start`` keeps one process with dcost imported and its
programs compiled in memory; while it runs, this launcher, which imports neither JAX nor dcost,
sends it the command line and prints what it answers: a later ``dcost plan`` takes about 0.3 s.

This module lives outside the ``dcost`` package because importing anything inside it runs
``dcost/__init__.py``, which imports JAX.

What is handed over: the subcommands in ``FORWARDED`` (not ``serve``, ``warmup`` nor ``daemon``,
nor ``--help``, which argparse formats to the terminal's width), with the working directory, to
the daemon whose key equals this process's (``key``): the same interpreter and the same dcost
files (path, size and modification time of every file of the package), and the same
``DCOST_*``, ``JAX_*`` and ``XLA_*`` variables and ``XDG_CACHE_HOME``, which decide how dcost
compiles and where it keeps its programs. A process whose key differs finds no daemon and runs
the command itself, as it does when no daemon runs, when ``DCOST_DAEMON=0`` (``off``, ``false``,
``no``), or when the daemon's directory is not private to the user (``directory``). With
``DCOST_DAEMON=auto`` a command that finds no daemon starts one (``spawn``; it ends after 30 idle
minutes) and hands itself over: the first command pays for the daemon's imports, the later ones
find it warm. Where the daemon cannot start, the command runs in its own process.
The daemon answers one command at a time; output streams back as it is written; the exit code is
the command's.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import pathlib
import socket
import sys
import tempfile

__all__ = [
    "FORWARDED",
    "OFF_VALUES",
    "DaemonDirError",
    "directory",
    "key",
    "socket_path",
    "forwardable",
    "request",
    "status",
    "spawn",
    "forward",
    "run",
    "AUTO_IDLE_S",
]

OFF_VALUES = frozenset({"0", "off", "false", "no"})

AUTO_IDLE_S = 30 * 60.0
"""How long a daemon started by ``DCOST_DAEMON=auto`` waits for a command before it ends (s)."""

FORWARDED = frozenset(
    {
        "presets",
        "eval",
        "train",
        "lifetime",
        "optimize",
        "grid",
        "plan",
        "calibrate",
        "validate",
        "measurements",
        "engines",
        "simulate",
    }
)
"""The subcommands a running daemon answers; the others always run in the calling process."""

_ENV_PREFIXES = ("DCOST_", "JAX_", "XLA_")
_ENV_NAMES = ("XDG_CACHE_HOME",)
# variables that say where to find the daemon or whether to use it, not what it computes
_ENV_IGNORED = ("DCOST_DAEMON", "DCOST_DAEMON_DIR")
# the flag ``import dcost`` adds to ``XLA_FLAGS`` (``dcost._xla.YNN_FLAG``): a daemon, which has
# imported dcost, and a launcher, which has not, see the same environment
_YNN_GUARD = "--xla_cpu_experimental_ynn_fusion_type="


class DaemonDirError(RuntimeError):
    """The daemon's directory cannot be used safely (another user could reach the socket)."""


def directory(create: bool = False) -> pathlib.Path:
    """The directory of the daemons' sockets and logs: ``DCOST_DAEMON_DIR`` if set, else
    ``$XDG_RUNTIME_DIR/dcost``, else ``dcost-<uid>`` in the temporary directory.

    Whoever can connect to a daemon's socket runs dcost commands as its user, so the directory
    must belong to the user and be closed to others (mode ``0700``); created so when ``create``.
    Raises ``DaemonDirError`` naming the directory, its owner and mode otherwise.
    """
    env = os.environ.get("DCOST_DAEMON_DIR")
    if env:
        path = pathlib.Path(env)
    elif os.environ.get("XDG_RUNTIME_DIR"):
        path = pathlib.Path(os.environ["XDG_RUNTIME_DIR"]) / "dcost"
    else:
        path = pathlib.Path(tempfile.gettempdir()) / f"dcost-{os.getuid()}"
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise DaemonDirError(
            f"dcost daemon: {path} (owner uid {st.st_uid}, mode {st.st_mode & 0o777:o}) must "
            f"belong to uid {os.getuid()} with mode 700: whoever can reach a daemon's socket runs "
            "commands as you (chmod 700 it, or set DCOST_DAEMON_DIR to another directory)"
        )
    return path


def _package_dir() -> pathlib.Path:
    spec = importlib.util.find_spec("dcost")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("dcost is not installed")
    return pathlib.Path(list(spec.submodule_search_locations)[0]).resolve()


def key(environ=None) -> str:
    """What a daemon must share with a process to answer for it, as 24 hex digits: the
    interpreter, dcost's files (path, size and modification time of each file of the package,
    caches left out, and of this module) and the environment variables that change what dcost
    computes or where it keeps its programs. A SHA-256, truncated."""
    environ = os.environ if environ is None else environ
    digest = hashlib.sha256()
    digest.update(f"{sys.executable}\0{sys.version}\0".encode())
    root = _package_dir()
    digest.update(f"{root}\0".encode())
    for path in [pathlib.Path(__file__).resolve(), *sorted(root.rglob("*"))]:  # this module too
        if "__pycache__" in path.parts or not path.is_file():
            continue
        st = path.stat()
        digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    for name in sorted(environ):
        if (name.startswith(_ENV_PREFIXES) or name in _ENV_NAMES) and name not in _ENV_IGNORED:
            value = environ[name]
            if name == "XLA_FLAGS":  # as before ``import dcost`` added its guard (dcost._xla)
                value = " ".join(f for f in value.split() if f != _YNN_GUARD)
                if not value:
                    continue
            digest.update(f"{name}={value}\0".encode())
    return digest.hexdigest()[:24]


def socket_path(k: str, create: bool = False) -> pathlib.Path:
    """The socket of the daemon whose key is ``k``."""
    return directory(create) / f"{k}.sock"


def forwardable(argv) -> bool:
    """Whether ``argv`` may go to a daemon: a subcommand of ``FORWARDED``, no help asked,
    ``DCOST_DAEMON`` not off, and Unix sockets on this platform."""
    if os.environ.get("DCOST_DAEMON", "").strip().lower() in OFF_VALUES:
        return False
    if not hasattr(socket, "AF_UNIX") or {"-h", "--help"} & set(argv):
        return False
    first = next((a for a in argv if not a.startswith("-")), None)
    return first in FORWARDED


def request(path, message: dict, timeout: float | None = None):
    """Send ``message`` to the daemon at ``path``; yields each message of its answer (a dict per
    line). Raises ``OSError`` when nothing listens there."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1.0)
        s.connect(str(path))
        s.settimeout(timeout)
        s.sendall(json.dumps(message).encode() + b"\n")
        with s.makefile("rb") as f:
            for line in f:
                yield json.loads(line)


def status(path, timeout: float = 2.0) -> dict | None:
    """The status of the daemon listening at ``path`` (its pid, uptime, commands answered, idle
    limit and key), or None where none answers."""
    try:
        for msg in request(path, {"op": "status"}, timeout=timeout):
            if "status" in msg:
                return msg["status"]
    except (OSError, ValueError):
        return None
    return None


def spawn(path, idle_s: float, wait_s: float = 120.0) -> tuple[int, bool]:
    """Start a daemon on ``path`` that ends after ``idle_s`` seconds without a command, in a
    session of its own (a shell's Ctrl-C does not reach it), its output in ``path`` with the
    suffix ``.log``; returns once it answers: its pid, and whether this call started it (False:
    one was running, or another process started it meanwhile: a lock file beside the socket lets
    one process start it at a time). Raises ``RuntimeError`` with the log's end where it does not
    answer within ``wait_s`` seconds."""
    import fcntl
    import subprocess
    import time

    path = pathlib.Path(path)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
        st = status(path)
        if st is not None:
            return int(st["pid"]), False
        log = path.with_suffix(".log")
        with open(log, "ab") as f:
            proc = subprocess.Popen(
                [sys.executable, "-m", "dcost.cli.daemon", str(path), repr(float(idle_s))],
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=f,
                start_new_session=True,
            )
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            if status(path, timeout=1.0) is not None:
                return proc.pid, True
            if proc.poll() is not None:
                break
            time.sleep(0.05)
        if proc.poll() is None:
            proc.kill()
    tail = log.read_text(errors="replace")[-2000:]
    raise RuntimeError(f"the dcost daemon did not start (log {log}):\n{tail}")


def forward(argv) -> int | None:
    """Run ``argv`` on the daemon of this process's key: its exit code, or None where there is
    none to ask (no socket, nothing listening, a directory not private to the user, or a daemon
    that ended before it wrote anything: the caller then runs the command itself)."""
    auto = os.environ.get("DCOST_DAEMON", "").strip().lower() == "auto"
    try:
        k = key()
        path = socket_path(k, create=auto)
        if auto and not path.exists():
            spawn(path, AUTO_IDLE_S)
        if not path.exists():
            return None
    except (OSError, ImportError, DaemonDirError, RuntimeError):
        return None
    streams = {"stdout": sys.stdout, "stderr": sys.stderr}
    said = False
    try:
        for msg in request(path, {"argv": list(argv), "cwd": os.getcwd(), "key": k}):
            if "rc" in msg:
                return int(msg["rc"])
            for name, text in msg.items():
                if name in streams:
                    said = True
                    try:
                        streams[name].write(text)
                        streams[name].flush()
                    except BrokenPipeError:  # output piped into `head` and the like, as
                        return 0  # ``dcost.cli.app.main`` does; the daemon drops the rest
                    except ValueError:  # a closed stream
                        return 0
    except ConnectionRefusedError:  # a socket left by a daemon that was killed
        try:
            path.unlink()
        except OSError:
            pass
        return None
    except OSError:
        if not said:
            return None
    if not said:
        return None
    print(
        f"dcost: error: the daemon ({path}) ended before it finished this command; its log is "
        f"{path.with_suffix('.log')} (DCOST_DAEMON=0 runs commands without it)",
        file=sys.stderr,
    )
    return 1


def run(argv=None):
    """The console script: ``forward``, else ``dcost.cli.app.run`` in this process."""
    argv = sys.argv[1:] if argv is None else list(argv)
    if forwardable(argv):
        code = forward(argv)
        if code is not None:
            for stream in (sys.stdout, sys.stderr):
                try:
                    stream.flush()
                except (OSError, ValueError):
                    pass
            os._exit(code)
    from dcost.cli.app import run as run_here

    run_here(argv)


if __name__ == "__main__":  # pragma: no cover
    run()
