"""``dcost serve`` in a subprocess, for the tests: started on a free port, always stopped.

``running()`` starts ``python -m dcost serve --port 0`` (the command binds a free port and prints
the address it bound), reads the address within ``START_S`` seconds, yields it, and stops the
process (Ctrl-C, then kill), whatever happened in between. The child inherits the tests'
environment (``tests/conftest.py``: ``DCOST_CACHE=0``, no persistent compilation cache).
"""

from __future__ import annotations

import contextlib
import selectors
import signal
import subprocess
import sys
import time

START_S = 60.0
"""Most seconds for ``dcost serve`` to print its address."""


def _address(proc: subprocess.Popen, deadline: float) -> str:
    """The address ``dcost serve`` prints (``host:port``), read from its stdout by ``deadline``."""
    assert proc.stdout is not None
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    seen = []
    try:
        while time.monotonic() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.monotonic())):
                break
            line = proc.stdout.readline()
            if not line:  # the process ended
                break
            seen.append(line)
            if "http://" in line:
                return line.split("http://", 1)[1].split()[0].rstrip("/")
    finally:
        sel.close()
    raise AssertionError(f"dcost serve printed no address in {START_S} s: {''.join(seen)!r}")


@contextlib.contextmanager
def running(*args: str):
    """``http://host:port`` of a running ``dcost serve`` (extra arguments: ``args``); on exit
    the process is stopped, and ``stopped[0]`` holds its exit code."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dcost", "serve", "--host", "127.0.0.1", "--port", "0", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        text=True,
        bufsize=1,
    )
    try:
        yield f"http://{_address(proc, time.monotonic() + START_S)}"
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=15)
        if proc.stdout is not None:
            proc.stdout.close()
