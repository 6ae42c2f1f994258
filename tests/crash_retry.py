"""A pytest plugin for pytest-xdist's ``--dist loadfile``: a test process that dies of a native
fault costs one run of the test it died in, not the suite, and says where it died.

Why. XLA:CPU (jaxlib 0.10.2) now and then kills a test process with a segmentation fault on one
of its own threads, in a different test each time (CI at stop 67 in ``dcost.plots``'s
``plot_pareto`` doctest, at stop 68 in ``dcost.search.envelope``'s; two fresh clones before):
about one full run in five on 2 cores, after every guard dcost sets (``dcost._xla.guard_ynn``,
no shared compilation cache). A test that fails is never retried; a test whose *process* died
runs once more, in a fresh process; if it kills that one too it fails (a crash dcost causes
every time is a defect, not noise). ``tests/test_crash_retry.py`` checks both in pytests of
their own.

How.

- ``RetryingLoadFile``, pytest-xdist 3.8's ``LoadFileScheduling`` with what its crash recovery
  lacks: a crashed worker's finished files are not queued again (pytest-xdist issue 1378: they
  went back as empty work that deadlocked the run), its unfinished tests go to the front of the
  queue, and a worker is given work until it holds three tests or the queue is empty, then told
  to stop once the queue is empty (issue 1327: a replacement worker handed a single test waited
  for ever for a second one). The test a worker died in is queued again once.
- ``pytest_handlecrashitem`` reports that first death as ``rerun`` (``R``), not ``failed``; a
  second death in the same test stays ``failed``. ``make test`` allows two replacement workers
  (``--max-worker-restart=2``).
- Each worker writes Python's fault dump (``faulthandler``, every thread) to a file of its own;
  the run's summary prints the dump of every worker that died, frames of pytest's own machinery
  left out, so that the end of a log names the test and the call that crashed.
"""

from __future__ import annotations

import faulthandler
import os
import pathlib
import shutil
import tempfile
from collections import Counter, OrderedDict

import pytest

DUMP_DIR = "DCOST_TEST_FAULT_DUMPS"
"""Environment variable: the directory where each worker writes its fault dump
(``<worker id>.txt``); set by the controlling process for its workers."""

_MACHINERY = ("/execnet/", "/pluggy/", "/_pytest/", "/xdist/")
_DUMP = []  # the open dump file of this worker, kept for the life of the process
_CRASHES: list[tuple[str, str, bool]] = []  # (worker id, test, run again) in the controller


try:
    from xdist.scheduler import LoadFileScheduling
except ImportError:  # pytest-xdist is not installed: the plugin has nothing to do
    LoadFileScheduling = None


if LoadFileScheduling is not None:

    class RetryingLoadFile(LoadFileScheduling):
        """``LoadFileScheduling`` that recovers from a crashed worker (module docstring)."""

        def __init__(self, config, log=None):
            super().__init__(config, log)
            self.crashes: Counter[str] = Counter()

        def remove_node(self, node):
            """Forget ``node``; queue its unfinished tests first, the one it died in once.
            Returns that test's id, or None when the node had nothing left to run."""
            workload = self.assigned_work.pop(node)
            left = OrderedDict()
            for scope, unit in workload.items():
                todo = {nodeid: False for nodeid, done in unit.items() if not done}
                if todo:
                    left[scope] = todo
            if not left:
                return None
            scope = next(iter(left))
            crashitem = next(iter(left[scope]))  # a worker runs its tests in the order given
            self.crashes[crashitem] += 1
            if self.crashes[crashitem] > 1:  # it died here before: no third run
                del left[scope][crashitem]
                if not left[scope]:
                    del left[scope]
            for scope in reversed(left):
                self.workqueue[scope] = left[scope]
                self.workqueue.move_to_end(scope, last=False)
            for other in self.assigned_work:
                self._reschedule(other)
            return crashitem

        def _reschedule(self, node):
            """Give ``node`` work until it holds three tests or nothing is left; tell it to stop
            once nothing is left (a worker waits for a test's successor before running it)."""
            if node.shutting_down or node not in self.registered_collections:
                return  # stopping, or a replacement that has not collected yet
            while self.workqueue and self._pending_of(self.assigned_work[node]) <= 2:
                self._assign_work_unit(node)
            if not self.workqueue:
                node.shutdown()

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(config, log):
        if config.getvalue("dist") == "loadfile":
            return RetryingLoadFile(config, log)
        return None

    @pytest.hookimpl(tryfirst=True)
    def pytest_handlecrashitem(crashitem, report, sched):
        again = getattr(sched, "crashes", {}).get(crashitem, 0) == 1
        worker = getattr(getattr(report, "node", None), "gateway", None)
        _CRASHES.append((getattr(worker, "id", "?"), crashitem, again))
        if again:
            report.outcome = "rerun"
            report.longrepr = f"{report.longrepr}; run again in a fresh worker"


_MADE: list[str] = []  # the dump directory this controller made, removed at the end


def pytest_configure(config):
    if os.environ.get("PYTEST_XDIST_WORKER") or getattr(config.option, "dist", "no") == "no":
        return
    # the controller: a directory of its own (a pytest run inside a test makes another), which
    # its workers inherit
    os.environ[DUMP_DIR] = tempfile.mkdtemp(prefix="dcost-test-faults-")
    _MADE.append(os.environ[DUMP_DIR])


def pytest_unconfigure(config):
    for where in _MADE:
        shutil.rmtree(where, ignore_errors=True)
        if os.environ.get(DUMP_DIR) == where:
            del os.environ[DUMP_DIR]
    _MADE.clear()


def pytest_sessionstart(session):
    """In a worker, after pytest's own ``faulthandler`` set itself up: dump to a file."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    where = os.environ.get(DUMP_DIR)
    if not worker or not where:
        return
    dump = open(pathlib.Path(where) / f"{worker}.txt", "w")  # noqa: SIM115 - kept open
    _DUMP.append(dump)
    faulthandler.enable(file=dump, all_threads=True)


def pytest_report_teststatus(report, config):
    if report.outcome == "rerun":
        return "rerun", "R", ("RERUN", {"yellow": True})
    return None


def dump_lines(text: str, limit: int = 60) -> list[str]:
    """The lines of a fault dump worth reading: pytest's, pluggy's and execnet's frames and the
    list of extension modules left out, at most ``limit`` lines.

    >>> dump_lines("Fatal Python error: Segmentation fault\\n\\nCurrent thread 0x1:\\n"
    ...            '  File "/x/_pytest/runner.py", line 1 in f\\n  File "/a/b.py", line 2 in g\\n'
    ...            "\\nExtension modules: numpy (total: 1)\\n")[1:]
    ['Current thread 0x1:', '  File "/a/b.py", line 2 in g']
    """
    kept = [
        line
        for line in text.splitlines()
        if line.strip()
        and not line.startswith("Extension modules:")
        and not any(part in line for part in _MACHINERY)
    ]
    return kept[:limit]


@pytest.hookimpl(trylast=True)  # after the durations: the end of a log shows it
def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _CRASHES:
        return
    where = os.environ.get(DUMP_DIR)
    terminalreporter.section("test processes that died")
    for worker, test, again in _CRASHES:
        then = "run again in a fresh worker" if again else "died here before: failed"
        terminalreporter.write_line(f"worker {worker} died in {test} ({then})")
        dump = pathlib.Path(where or ".") / f"{worker}.txt"
        text = dump.read_text(errors="replace") if where and dump.is_file() else ""
        for line in dump_lines(text) or ["(no fault dump was written)"]:
            terminalreporter.write_line(f"    {line}")
