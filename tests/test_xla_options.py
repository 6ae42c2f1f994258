"""``DCOST_FAST_COMPILE``: what it switches, what it refuses, and that it changes speed only."""

import numpy as np
import pytest

import dcost
from dcost import _xla
from dcost.search import _jit
from dcost.search.optimize import Settings


@pytest.mark.parametrize("value", ["1", "on", "TRUE", " yes ", "all", " ALL "])
def test_on_values_make_every_program_fast(value):
    assert _xla.prefer_fast(False, {"DCOST_FAST_COMPILE": value})
    assert _xla.prefer_fast(True, {"DCOST_FAST_COMPILE": value})
    assert _xla.even_optimized({"DCOST_FAST_COMPILE": value}) == (value.strip().lower() == "all")


@pytest.mark.parametrize("value", ["", "0", "off", "False", "no"])
def test_off_values_leave_each_program_its_own_choice(value):
    assert not _xla.prefer_fast(False, {"DCOST_FAST_COMPILE": value})
    assert _xla.prefer_fast(True, {"DCOST_FAST_COMPILE": value})
    assert not _xla.prefer_fast(False, {})
    assert not _xla.even_optimized({"DCOST_FAST_COMPILE": value})


@pytest.mark.parametrize("value", ["2", "fast", "yes please", "all of them"])
def test_other_values_are_refused_by_name(value):
    for check in (_xla.prefer_fast, lambda _, env: _xla.even_optimized(env)):
        with pytest.raises(ValueError, match="DCOST_FAST_COMPILE") as err:
            check(False, {"DCOST_FAST_COMPILE": value})
        assert repr(value) in str(err.value) and "'all'" in str(err.value)


@pytest.mark.slow
def test_level_0_gives_the_answer_of_the_default_level(monkeypatch):
    """The suite runs at level 0 (tests/conftest.py): the answer must not depend on it."""
    p = dcost.Problem(
        dcost.hardware("h100-sxm"),
        dcost.model("llama-3-8b"),
        dcost.Workload(2048),
        free={"batch": (1, 113), "chips": (1, 5)},  # a structure of this test's own
        tpot_slo=0.01,
    )
    settings = Settings(starts=2, rounds=3, steps=4, local_rounds=1)
    solved = {}
    for value in ("0", "1"):
        monkeypatch.setenv("DCOST_FAST_COMPILE", value)
        options = _jit._options(_xla.prefer_fast(False))
        # level 0 when fast, else XLA's own default named (3), whatever XLA_FLAGS say
        assert options is None or options["xla_backend_optimization_level"] == (
            0 if value == "1" else 3
        )
        solved[value] = dcost.optimize(p, settings)
    slow, fast = solved["0"], solved["1"]
    np.testing.assert_array_equal(np.asarray(slow.x), np.asarray(fast.x))
    np.testing.assert_allclose(float(slow.cost), float(fast.cost), rtol=1e-6)
    assert slow.binding == fast.binding


def test_even_optimized_programs_compile_fast_only_when_asked(monkeypatch):
    """``prefer_fast_compile(even_optimized=True)`` (``dcost plan``'s) reaches the programs that
    ask for XLA's own level; the plain block does not; ``DCOST_FAST_COMPILE`` set either way is
    the process's choice, which ``dcost plan`` then keeps (``_xla.chosen``)."""

    def double(x):
        return 2.0 * x

    monkeypatch.setenv("DCOST_FAST_COMPILE", "1")  # the suite's own "all" reaches them (below)
    f = _jit.jit(double, optimized=True)
    optimized = f.compiled()
    with _jit.prefer_fast_compile():
        assert f.compiled() is optimized
    with _jit.prefer_fast_compile(even_optimized=True):
        fast = f.compiled()
    assert fast is not optimized and f.compiled() is optimized  # restored after the block
    assert float(fast(np.float32(3.0))) == float(optimized(np.float32(3.0))) == 6.0
    monkeypatch.delenv("DCOST_FAST_COMPILE", raising=False)
    assert not _xla.chosen()
    for value in ("0", "1", "all"):
        monkeypatch.setenv("DCOST_FAST_COMPILE", value)
        assert _xla.chosen()
    # DCOST_FAST_COMPILE=all is even_optimized for the whole process
    assert f.compiled() is fast
    monkeypatch.setenv("DCOST_FAST_COMPILE", "1")
    assert f.compiled() is optimized


def test_the_planners_programs_follow_the_process_choice(monkeypatch):
    """The planner's search asks for XLA's own level (``optimized=True``); under
    ``DCOST_FAST_COMPILE=all`` (the suite's) and in ``dcost plan`` (``even_optimized``) it
    compiles at level 0, under ``1`` it keeps its level."""
    from dcost.planning import planner

    monkeypatch.setenv("DCOST_FAST_COMPILE", "1")
    own = planner._search_kind.compiled()
    with _jit.prefer_fast_compile(even_optimized=True):
        fast = planner._search_kind.compiled()
    assert fast is not own
    monkeypatch.setenv("DCOST_FAST_COMPILE", "all")
    assert planner._search_kind.compiled() is fast


def test_the_level_named_for_running_fast_is_xlas_own_default():
    """``_xla.requested(False)`` names level 3 so that the suite's ``XLA_FLAGS`` (level 0) do not
    reach a program that asks to run fast: 3 must be what XLA picks when nothing is said."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    code = (
        "from jax._src.lib import xla_client\n"
        "print(xla_client.CompileOptions().executable_build_options"
        ".debug_options.xla_backend_optimization_level)"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) == _xla.requested(False)["xla_backend_optimization_level"]
    assert _xla.requested(True)["xla_backend_optimization_level"] == 0


def test_grid_search_keeps_xlas_level_under_the_fast_compile_switch(monkeypatch):
    """``dcost.grid_search``'s chunk step runs a vectorized sweep of up to millions of designs, so
    it keeps XLA's own level (``sweep=True``) whatever the process asks: ``DCOST_FAST_COMPILE``
    (``all`` in the suite), the plain ``prefer_fast_compile`` and ``even_optimized`` leave it
    there. A program without ``sweep`` would give another compiled function in some block."""
    from dcost.search.grid import _chunk_step

    step = _chunk_step(1, 64, None)
    own = step.compiled()
    for value in ("1", "all"):
        monkeypatch.setenv("DCOST_FAST_COMPILE", value)
        assert step.compiled() is own
        with _jit.prefer_fast_compile():
            assert step.compiled() is own
        with _jit.prefer_fast_compile(even_optimized=True):
            assert step.compiled() is own
    optimized = _jit.jit(lambda x: 2.0 * x, optimized=True)  # what the switch does move
    monkeypatch.setenv("DCOST_FAST_COMPILE", "1")
    kept = optimized.compiled()
    monkeypatch.setenv("DCOST_FAST_COMPILE", "all")
    assert optimized.compiled() is not kept
    plain = _jit.jit(lambda x: 2.0 * x)  # a program that does not ask: fast either way
    fast = plain.compiled()
    with _jit.prefer_fast_compile(even_optimized=True):
        assert plain.compiled() is fast


_YNN_CRASH = """
import dcost, jax, jax.numpy as jnp
# JAX issue 40412's program: a rank-7 float32 product summed over one axis, which jaxlib 0.10.2
# fuses into YNNPACK and which then crashes on one of XLA's threads (a segmentation fault)
shape = (3, 1, 2, 2, 8, 8, 8)
u = jax.random.normal(jax.random.PRNGKey(0), shape, dtype=jnp.float32)
f = jax.jit(lambda a, b: jnp.sum(a * b, axis=3)).lower(u, u).compile()
print("ynn" if "__ynn" in f.as_text() else "no ynn", float(f(u, u).sum()))
"""


def test_importing_dcost_keeps_ynn_fusions_from_crashing_the_process():
    """Imported before JAX starts, dcost turns XLA:CPU's YNNPACK fusions off for the process on a
    jaxlib that has them (``dcost._xla.guard_ynn``): a plain ``jax.jit`` program that crashes
    jaxlib 0.10.2 runs and exits cleanly; a process whose flags name the fusions keeps them."""
    import os
    import subprocess
    import sys

    from jax._src import lib

    env = dict(os.environ, XLA_FLAGS="", JAX_PLATFORMS="cpu")
    proc = subprocess.run(
        [sys.executable, "-c", _YNN_CRASH], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("no ynn"), proc.stdout
    low, high = _xla.YNN_JAXLIBS
    env = {"XLA_FLAGS": ""}
    assert _xla.guard_ynn(env, tuple(lib.version), initialized=False) == (
        low <= tuple(lib.version)[:3] < high
    )
    if low <= tuple(lib.version)[:3] < high:  # the user's choice is left as it is
        env = dict(os.environ, XLA_FLAGS="--xla_cpu_experimental_ynn_fusion_type=reduce")
        proc = subprocess.run(
            [sys.executable, "-c", _YNN_CRASH.replace("(3, 1, 2, 2,", "(3, 2, 2, 2,")],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.stdout.startswith("ynn"), (proc.stdout, proc.stderr[-2000:])
