"""``dcost daemon``: one process that keeps dcost imported and its programs compiled.

    dcost daemon start            # in the background; ends after 30 idle minutes
    dcost daemon start --idle 240
    dcost daemon status           # exit 0 if this environment's daemon runs, else 1
    dcost daemon stop             # this environment's; --all: every daemon of yours

While it runs, the ``dcost`` command (``dcost_launch``) hands it ``plan``, ``eval``,
``optimize``, ``simulate`` and the other subcommands of ``dcost_launch.FORWARDED`` instead of
starting JAX again: the answer is the same, printed as the command prints it, with its exit
code; a second ``dcost plan`` takes about 0.4 s instead of 2-4 s (``benchmarks/daemon.py``).
With ``DCOST_DAEMON=auto`` (in a shell's profile, say) the first such command starts one.
It answers one command at a time, in the caller's working directory, and only for processes of
the same interpreter, dcost files and compiling environment (``dcost_launch.key``); others run
their commands themselves. The socket and a log of the daemon's own output are in
``dcost_launch.directory()``, private to the user. ``DCOST_DAEMON=0`` runs a command without it.

What carries over between the commands it answers is what a long Python session keeps: the
compiled programs, and Python's warning filters (a warning shown once is not shown again).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import sys
import time
import traceback

__all__ = ["add_parsers", "cmd_daemon", "serve"]

DEFAULT_IDLE_MINUTES = 30.0


def add_parsers(subparsers) -> None:
    """Register ``dcost daemon``."""
    p = subparsers.add_parser(
        "daemon", help="keep dcost loaded in a background process that answers later commands"
    )
    p.add_argument(
        "action",
        choices=("start", "stop", "status"),
        help="start one in the background (DCOST_DAEMON=auto: the first command does), stop it, "
        "or say whether one runs for this environment (exit 0) or not (exit 1)",
    )
    p.add_argument(
        "--idle",
        type=float,
        default=DEFAULT_IDLE_MINUTES,
        metavar="MINUTES",
        help="start: end after this many minutes without a command "
        f"(default {DEFAULT_IDLE_MINUTES:g})",
    )
    p.add_argument("--all", action="store_true", help="stop: every daemon of this user")
    p.set_defaults(func=cmd_daemon)


def cmd_daemon(args) -> int:
    import dcost_launch

    if not hasattr(socket, "AF_UNIX"):
        raise ValueError("dcost daemon needs Unix domain sockets, which this platform lacks")
    try:
        here = dcost_launch.socket_path(dcost_launch.key(), create=args.action == "start")
    except dcost_launch.DaemonDirError as err:
        raise ValueError(str(err)) from None
    except FileNotFoundError:  # no directory yet: no daemon either
        print("dcost daemon: none running")
        return 1 if args.action == "status" else 0
    if args.action == "start":
        if args.idle <= 0 or args.idle != args.idle or args.idle == float("inf"):
            raise ValueError(f"--idle = {args.idle} is not allowed: it must be a finite number > 0")
        return _start(here, args.idle * 60.0)
    paths = sorted(here.parent.glob("*.sock"))
    if args.action == "status":
        found = False
        for path in paths:
            st = dcost_launch.status(path)
            if st is None:
                continue
            mine = path == here
            found |= mine
            print(
                f"{'this environment' if mine else 'another environment'}: pid {st['pid']}, up "
                f"{st['uptime_s'] / 60:.1f} min, {st['served']} command(s) answered, ends after "
                f"{st['idle_s'] / 60:g} idle min; socket {path}"
            )
        if not found:
            print(f"dcost daemon: none running for this environment (socket {here})")
        return 0 if found else 1
    stopped = 0
    for path in paths if args.all else [here]:
        try:
            for _ in dcost_launch.request(path, {"op": "stop"}, timeout=5.0):
                pass
            stopped += 1
        except OSError:
            continue
    print(f"dcost daemon: stopped {stopped}")
    return 0


def _start(path, idle_s: float) -> int:
    import dcost_launch

    try:
        pid, mine = dcost_launch.spawn(path, idle_s)
    except RuntimeError as err:
        raise ValueError(str(err)) from None
    if not mine:
        print(f"dcost daemon: already running (pid {pid}; socket {path})")
        return 0
    print(
        f"dcost daemon: started (pid {pid}); `dcost` commands of this environment now run in "
        f"it; it ends after {idle_s / 60:g} idle minutes or `dcost daemon stop` (socket {path}, "
        f"log {path.with_suffix('.log')})"
    )
    return 0


class _Stream:
    """A text stream whose writes go to the client as ``{name: text}`` lines; after the client
    has gone, they are dropped."""

    encoding = "utf-8"
    errors = "strict"

    def __init__(self, conn: socket.socket, name: str):
        self.conn, self.name, self.gone = conn, name, False

    def write(self, text: str) -> int:
        if text and not self.gone:
            try:
                self.conn.sendall(json.dumps({self.name: text}).encode() + b"\n")
            except OSError:
                self.gone = True
        return len(text)

    def flush(self) -> None:
        pass

    def close(self) -> None:  # ``main`` closes stderr after a broken pipe: nothing to close here
        pass

    def isatty(self) -> bool:
        return False

    def writable(self) -> bool:
        return True


def _send(conn: socket.socket, msg: dict) -> None:
    with contextlib.suppress(OSError):
        conn.sendall(json.dumps(msg).encode() + b"\n")


def _answer(conn: socket.socket, msg: dict) -> int:
    """Run one command line for a client; its exit code."""
    from dcost.cli.app import main

    out, err = _Stream(conn, "stdout"), _Stream(conn, "stderr")
    before = os.getcwd()
    try:
        os.chdir(msg["cwd"])
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(msg["argv"])
            except SystemExit as stop:  # argparse's usage errors (2), --version and the like
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
                if not isinstance(stop.code, int | None):
                    print(stop.code, file=sys.stderr)
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        os.chdir(before)
    return int(code)


def serve(path: str, idle_s: float, key: str) -> None:
    """Listen on the Unix socket ``path`` and answer commands one at a time until a ``stop``,
    ``idle_s`` seconds after the last command (a status asked does not count), or the socket
    file no longer being this daemon's."""
    import gc

    from dcost.cli import app

    app.build_parser()  # imports every subcommand's module once, before the first command
    gc.freeze()  # the imports live as long as the process (``dcost.cli.app.run``)
    started, served = time.time(), 0
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # a socket left by a daemon that was killed
        sock.bind(path)
        os.chmod(path, 0o600)
        inode = os.stat(path).st_ino
        sock.listen(16)
        last = time.monotonic()  # of the last command: a status asked is not one
        try:
            while True:
                left = last + idle_s - time.monotonic()
                if left <= 0:
                    return
                sock.settimeout(left)
                try:
                    conn, _ = sock.accept()
                except TimeoutError:
                    return
                with conn:
                    conn.settimeout(10.0)  # for the request: a client that says nothing is dropped
                    try:
                        with conn.makefile("rb") as f:
                            msg = json.loads(f.readline())
                    except (OSError, ValueError):
                        continue
                    if not isinstance(msg, dict):
                        continue
                    conn.settimeout(None)
                    op = msg.get("op")
                    if op == "stop":
                        _send(conn, {"rc": 0})
                        return
                    if op == "status":
                        status: dict[str, object] = {
                            "pid": os.getpid(),
                            "uptime_s": time.time() - started,
                        }
                        status |= {"served": served, "idle_s": idle_s, "key": key}
                        _send(conn, {"status": status})
                        continue
                    if msg.get("key") != key:  # say nothing: the client runs the command itself
                        continue
                    served += 1
                    try:
                        code = _answer(conn, msg)
                    except Exception as err:  # a working directory gone, a malformed request
                        _send(
                            conn, {"stderr": f"dcost: error: the daemon could not run it: {err}\n"}
                        )
                        code = 1
                    _send(conn, {"rc": code})
                    last = time.monotonic()
                try:
                    if os.stat(path).st_ino != inode:
                        return
                except FileNotFoundError:
                    return
        finally:
            with contextlib.suppress(FileNotFoundError):
                if os.stat(path).st_ino == inode:
                    os.unlink(path)


def _main(argv) -> None:
    import dcost_launch

    parser = argparse.ArgumentParser(prog="python -m dcost.cli.daemon")
    parser.add_argument("socket")
    parser.add_argument("idle_s", type=float)
    args = parser.parse_args(argv)
    key = dcost_launch.key()
    if os.path.basename(args.socket) != f"{key}.sock":
        sys.exit(f"dcost daemon: this process's key {key} is not the socket's ({args.socket})")
    serve(args.socket, args.idle_s, key)


if __name__ == "__main__":
    _main(sys.argv[1:])
