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

Compilation cache. The suite runs with dcost's persistent compilation cache off (``DCOST_CACHE=0``,
set before ``dcost`` is imported): JAX writes cache entries non-atomically, so two test runs sharing
``~/.cache/dcost`` could read a half-written entry and warn, which fails a test here.
``tests/test_cache.py`` exercises the cache in fresh processes with their own directories.

Slow tests. A test that takes more than a few seconds on 2 cores (or is first to use a fixture
that does) is marked ``@pytest.mark.slow``; ``make test-quick`` deselects them and the notebooks.
The doctests in ``dcost/`` cannot carry a marker, so the slow ones are named in ``SLOW_DOCTESTS``.
"""

import os

os.environ.setdefault("DCOST_CACHE", "0")  # before anything imports dcost

import jax
import pytest
from hypothesis import HealthCheck, settings

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
