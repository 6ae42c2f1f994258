"""``tests/crash_retry.py`` in pytests of its own: a worker that dies once in a test costs a rerun
of that test; one that dies there every time fails it; the run never hangs (pytest-xdist issues
1327 and 1378 hung these very layouts) and its summary prints the fault dump."""

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.slow

TESTS = pathlib.Path(__file__).resolve().parent

CRASH = """
import ctypes, pathlib

def crash_once(name):
    mark = pathlib.Path(__file__).with_name(name)
    if not mark.exists():
        mark.write_text("died here once")
        ctypes.string_at(0)  # a segmentation fault, as XLA:CPU's
"""


def _run(tmp_path: pathlib.Path, files: dict[str, str], jobs: int = 2):
    (tmp_path / "conftest.py").write_text(
        f"import sys\nsys.path.insert(0, {str(TESTS)!r})\nimport crash_retry\n\n"
        "def pytest_configure(config):\n"
        "    config.pluginmanager.register(crash_retry, 'dcost-crash-retry')\n"
    )
    (tmp_path / "crash.py").write_text(CRASH)
    for name, text in files.items():
        (tmp_path / name).write_text(textwrap.dedent(text))
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTEST_XDIST_WORKER", "DCOST_TEST_FAULT_DUMPS")
    }
    env["PYTHONPATH"] = str(tmp_path)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-q",
            "-n",
            str(jobs),
            "--dist",
            "loadfile",
            "--max-worker-restart=2",
            "-o",
            "addopts=",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    return out.returncode, out.stdout + out.stderr


def test_a_test_whose_process_dies_once_runs_again_and_the_run_passes(tmp_path):
    rc, log = _run(
        tmp_path,
        {
            "test_a.py": """
            import time
            from crash import crash_once
            def test_a1(): time.sleep(1)
            def test_a2(): crash_once("a2")
            def test_a3(): pass
            """,
            "test_b.py": "def test_b1(): pass\ndef test_b2(): pass\n",
            "test_c.py": "def test_c1(): pass\n",
        },
    )
    assert rc == 0, log
    assert "6 passed, 1 rerun" in log, log
    assert "worker gw0 died in test_a.py::test_a2 (run again in a fresh worker)" in log or (
        "worker gw1 died in test_a.py::test_a2 (run again in a fresh worker)" in log
    ), log
    assert "Segmentation fault" in log and "crash.py" in log, log  # the dump, its frame


def test_a_test_whose_process_dies_every_time_fails_and_the_rest_still_runs(tmp_path):
    rc, log = _run(
        tmp_path,
        {
            "test_a.py": """
            import ctypes
            def test_a1(): pass
            def test_a2(): ctypes.string_at(0)
            def test_a3(): pass
            """,
            "test_b.py": "def test_b1(): pass\n",
        },
    )
    assert rc == 1, log
    assert "1 failed, 3 passed, 1 rerun" in log, log
    assert "died here before: failed" in log, log


def test_a_lone_test_left_to_a_replacement_worker_runs(tmp_path):
    # issue 1327's layout: after the crash the replacement is handed a single test
    rc, log = _run(
        tmp_path,
        {
            "test_a.py": """
            from crash import crash_once
            def test_a1(): crash_once("a1")
            """,
            "test_b.py": "import time\ndef test_b1(): time.sleep(2)\n",
        },
        jobs=1,
    )
    assert rc == 0, log
    assert "2 passed, 1 rerun" in log, log


def test_a_failing_test_is_never_run_again(tmp_path):
    rc, log = _run(
        tmp_path,
        {
            "test_a.py": """
            import pathlib
            def test_a1():
                mark = pathlib.Path(__file__).with_name("ran")
                first = not mark.exists()
                mark.write_text("x")
                assert not first
            """,
        },
    )
    assert rc == 1, log
    assert "1 failed" in log and "rerun" not in log, log
