"""``dcost serve``: a local page to explore the model.

    dcost serve                      # http://127.0.0.1:8000/
    dcost serve --port 0             # any free port; the address printed is the one bound
    dcost serve --host 0.0.0.0 --port 8080 --warm

Prints the page's address, then serves until interrupted (Ctrl-C). The page (``dcost.web``) works
offline: its plotting library is shipped inside the package. ``--warm`` answers the page's
default question once before serving, so that the first view does not wait for compilation
(the first answer of each new kind of question compiles its programs: seconds; later ones take
milliseconds). Needs the ``serve`` extra: ``pip install "dcost[serve]"``.
"""

from __future__ import annotations

import socket
import sys
import time

__all__ = ["add_parsers", "cmd_serve", "bind"]


def add_parsers(subparsers) -> None:
    """Register ``dcost serve``."""
    p = subparsers.add_parser("serve", help="a local web page to explore the model")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    p.add_argument(
        "--warm",
        action="store_true",
        help="answer the page's default question once before serving (compiles its programs)",
    )
    p.set_defaults(func=cmd_serve)


def bind(host: str, port: int) -> socket.socket:
    """A listening TCP socket on ``(host, port)``; port 0 picks a free one."""
    if not 0 <= port <= 65535:
        raise ValueError(f"--port = {port} is not allowed: it must be in [0, 65535]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise ValueError(f"cannot listen on {host}:{port}: {err.strerror or err}") from None
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _warm() -> float:
    from dcost.web import queries

    start = time.perf_counter()
    q = queries.parse({})
    for name in queries.ANSWERS:
        queries.answer(name, q)
    return time.perf_counter() - start


def cmd_serve(args) -> int:
    try:
        import uvicorn

        from dcost.web.app import create_app
    except ImportError as err:
        print(
            f"dcost: error: dcost serve needs the serve extra ({err.name} is missing): "
            'pip install "dcost[serve]"',
            file=sys.stderr,
        )
        return 2
    sock = bind(args.host, args.port)
    host, port = sock.getsockname()[:2]
    if args.warm:
        print("dcost serve: warming up (compiling the default question)...", flush=True)
        print(f"dcost serve: warm in {_warm():.1f} s", flush=True)
    shown = f"[{host}]" if ":" in host else host
    print(f"dcost serve: http://{shown}:{port}/  (Ctrl-C to stop)", flush=True)
    config = uvicorn.Config(create_app(), log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0
