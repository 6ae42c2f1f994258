"""A pytest plugin: with ``DCOST_NO_SKIPS=1`` in the environment, a test or a test module that
skips itself fails instead, saying why it skipped.

CI runs the suite this way (``.ci/run``): there every check must run, and a skip that prints
one letter among two thousand dots went unseen twice (a cost-analysis check that skipped
whenever another process had compiled its program first, and the site's docstring check, whose
library CI installed only after the tests). On a developer's machine a skip stays a skip (the
browser test without Chromium, say). ``-m`` deselection is not a skip. ``tests/conftest.py``
loads the plugin; ``tests/test_no_skips.py`` checks it in a pytest of its own.
"""

from __future__ import annotations

import os

import pytest

ENV = "DCOST_NO_SKIPS"


def _strict() -> bool:
    return os.environ.get(ENV, "").strip() == "1"


def _fail(report) -> None:
    reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
    report.outcome = "failed"
    report.longrepr = f"skipped, where every check must run ({ENV}=1): {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if _strict() and report.skipped and not hasattr(report, "wasxfail"):
        _fail(report)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    report = outcome.get_result()
    if _strict() and report.skipped:
        _fail(report)
