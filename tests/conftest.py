"""Shared test configuration: numeric precision and hypothesis profiles.

Precision. JAX computes in float32 unless told otherwise, and that is what users get, so tests run
in float32 by default (the finiteness and no-NaN checks are meant to hold there). A test that
compares against finite differences or a tight closed form is marked ``@pytest.mark.x64``; the
autouse fixture below runs it, its other fixtures and every hypothesis example in it under
``jax.enable_x64(True)`` and restores float32 afterwards. Specs are converted to arrays when they
are built, so build them inside the test (or in a fixture it requests), never at import time.

Hypothesis. The ``ci`` profile (the default) keeps example counts small for a 2-core machine, is
derandomized so a failure reproduces, and has no deadline because a first call compiles. The
``dev`` profile explores more: ``HYPOTHESIS_PROFILE=dev python -m pytest tests``.

Warnings are errors (``filterwarnings = error`` in pyproject.toml).

Compilation cache. The suite never touches the user's ``~/.cache/dcost`` (``DCOST_CACHE=0``, set
before ``dcost`` is imported), and its processes (the two pytest-xdist workers, the notebooks'
kernels, the tests' subprocesses) keep no persistent compilation cache: each compiles what it runs.
They once shared one JAX cache in a temporary directory, file-locked; it saved about 2 % of the
suite's time (12:23 against 12:38 without, 2026-12-01, 2 cores), an executable loaded from it
reports no XLA cost analysis (``tests/test_calibrate.py`` skipped its check), and XLA:CPU crashed
deserializing an entry (a segmentation fault in ``get_executable_and_time``, jax 0.10.2) in 2 of
about 20 full runs, after which pytest-xdist 3.8's ``--dist loadfile`` waits for ever for the
crashed worker's replacement (pytest-xdist issue 1327). A worker that dies is now replaced and
the test it died in runs once more (``tests/crash_retry.py``, loaded below).
``tests/test_cache.py`` exercises dcost's own cache in fresh processes with their own
directories and environments.

Optimization level. The suite compiles its programs at XLA's backend optimization level 0
(``DCOST_FAST_COMPILE=all``), as ``dcost plan`` does: most of its time is compiling programs it
then runs a few times, and level 0 compiles them about twice as fast. ``all`` reaches the
planner's programs too, which ask for XLA's own level to run their searches fast (under ``1``
they kept it: the plan-heavy test files took 261 s against 176 s, 2026-12-01, 2 cores);
``dcost.grid_search``'s vectorized sweeps keep their level whatever is set. ``XLA_FLAGS``
(level 0 and XLA:CPU's classic emitters, added when ``DCOST_FAST_COMPILE`` is ``1`` or ``all``)
extend that to the programs dcost does not compile itself: JAX's eager operations (several
thousand a run) and the tests' own ``jax.jit``. Level 0 changes how fast the code runs, not what
it computes (``tests/test_xla_options.py`` solves one problem at both levels). The notebooks'
kernels and the tests' subprocesses inherit it. ``DCOST_FAST_COMPILE=0 make test`` runs the
suite at each program's own level.

Skips. ``DCOST_NO_SKIPS=1`` (set by ``.ci/run``) turns a skip into a failure that says why it
skipped (``tests/no_skips.py``): in CI every check must run.

Slow tests. A test that takes more than a few seconds on 2 cores (or is first to use a fixture
that does) is marked ``@pytest.mark.slow``; ``make test-quick`` deselects them and the notebooks.
The doctests in ``dcost/`` cannot carry a marker, so the slow ones are named in ``SLOW_DOCTESTS``.
"""

import os

os.environ.setdefault("DCOST_CACHE", "0")  # before anything imports dcost
os.environ.setdefault("DCOST_FAST_COMPILE", "all")
if os.environ["DCOST_FAST_COMPILE"] in ("1", "all") and "--xla_backend_optimization_level" not in (
    os.environ.get("XLA_FLAGS", "")
):  # before JAX starts its backend; inherited by the subprocesses and the notebooks' kernels
    os.environ["XLA_FLAGS"] = (
        os.environ.get("XLA_FLAGS", "")
        + " --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false"
    ).strip()

# a test process that dies of a native fault: one rerun (tests/crash_retry.py)
import crash_retry
import jax
import pytest
from hypothesis import HealthCheck, settings

# DCOST_NO_SKIPS=1 (CI): a skip fails (tests/no_skips.py)
from no_skips import pytest_make_collect_report, pytest_runtest_makereport  # noqa: F401

settings.register_profile(
    "ci",
    max_examples=20,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


# doctests that run a search (pytest item names); a renamed one simply runs in the quick subset
SLOW_DOCTESTS = {
    "dcost.search.sensitivity.relax",
    "dcost.search.optimize.optimize",
    "dcost.search.lifetime_objective",
    "dcost.search.envelope.envelope",
    "dcost.calibrate.families.cross_validate",  # compiles the leave-one-source-out fit
}


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.name in SLOW_DOCTESTS:
            item.add_marker(pytest.mark.slow)


def pytest_configure(config):
    if not config.pluginmanager.is_registered(crash_retry):
        config.pluginmanager.register(crash_retry, "dcost-crash-retry")
    config.addinivalue_line(
        "markers", "x64: run the test (fixtures and hypothesis examples included) in float64"
    )


@pytest.fixture(autouse=True)
def _precision(request):
    """float64 for tests marked ``x64``, JAX's float32 default otherwise."""
    if request.node.get_closest_marker("x64") is None:
        assert not jax.config.jax_enable_x64, "float64 leaked out of an x64 test"
        yield
        return
    with jax.enable_x64(True):
        yield
