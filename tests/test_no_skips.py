"""``tests/no_skips.py``: with ``DCOST_NO_SKIPS=1`` a skip fails and says why; without it, a skip
is a skip. Checked in a pytest of its own on a small suite that skips every way the real one can
(``pytest.skip`` in a test, a ``skipif`` mark, a module's ``importorskip``), beside a test that
passes and one expected to fail."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

TESTS = pathlib.Path(__file__).resolve().parent

SUITE = {
    "conftest.py": "from no_skips import pytest_make_collect_report, pytest_runtest_makereport\n",
    "test_some.py": (
        "import pytest\n"
        "def test_runs():\n    pass\n"
        "def test_skips():\n    pytest.skip('no widget')\n"
        "@pytest.mark.skipif(True, reason='never here')\n"
        "def test_marked():\n    pass\n"
        "@pytest.mark.xfail(reason='known')\n"
        "def test_known():\n    assert False\n"
    ),
    "test_module.py": (
        "import pytest\npytest.importorskip('no_such_module_here')\ndef test_a():\n    pass\n"
    ),
}


def _pytest(tmp_path, strict: bool):
    for name, text in SUITE.items():
        (tmp_path / name).write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "DCOST_NO_SKIPS"}
    env["PYTHONPATH"] = os.pathsep.join([str(TESTS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    if strict:
        env["DCOST_NO_SKIPS"] = "1"
    # a module's skip is a collection error, which stops a run: the rest run anyway here
    args = ["-q", "-rs", "-p", "no:cacheprovider", "-o", "addopts=", "--rootdir", str(tmp_path)]
    args.append("--continue-on-collection-errors")
    return subprocess.run(
        [sys.executable, "-m", "pytest", *args, str(tmp_path)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_skip_is_a_skip_by_default(tmp_path):
    run = _pytest(tmp_path, strict=False)
    assert run.returncode == 0, run.stdout[-2000:]
    assert "1 passed, 3 skipped, 1 xfailed" in run.stdout, run.stdout[-2000:]


def test_a_skip_fails_where_every_check_must_run(tmp_path):
    run = _pytest(tmp_path, strict=True)
    assert run.returncode != 0, run.stdout[-2000:]
    out = run.stdout
    for reason in ("no widget", "never here", "could not import 'no_such_module_here'"):
        assert f"every check must run (DCOST_NO_SKIPS=1): Skipped: {reason}" in out, out
    assert "skipped" not in out.splitlines()[-1], out.splitlines()[-1]  # none left a skip
