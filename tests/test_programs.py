"""Compiled search programs kept on disk (``dcost._programs``): found without tracing, never stale.

The suite runs with dcost's cache off, so each test points the store at its own directory and
clears the in-process table between calls: a call after ``_MEMO.clear()`` is what a new process
does. Traces are counted with a Python side effect in the traced function.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost
from dcost import _programs
from dcost.search import _jit
from dcost.search import optimize as optimize_mod
from dcost.search.optimize import Settings

TRACES = []


def polynomial(x, scale, power):
    """A small program with a static argument and a structured result."""
    TRACES.append(power)
    return {"y": scale * x**power, "total": jnp.sum(x)}


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(_programs, "directory", lambda: tmp_path)
    monkeypatch.setattr(_programs, "_MEMO", {})
    monkeypatch.setattr(_programs, "_LAST", [])
    monkeypatch.setattr(_programs, "_PREFETCHED", {})
    monkeypatch.setattr(_programs, "_DURING_COMPILE", [])
    TRACES.clear()
    return tmp_path


def run(x, scale=2.0, power=3):
    out = _programs.run(polynomial, (x, jnp.asarray(scale)), {"power": power}, ("power",), None)
    assert out is not _programs.SKIP
    return out


def new_process():
    _programs._MEMO.clear()
    _programs._LAST.clear()
    _programs._PREFETCHED.clear()


def test_a_second_process_loads_the_program_without_tracing(store):
    x = jnp.arange(1.0, 4.0)
    first = run(x)
    assert TRACES == [3] and len(_programs.entries(store)) == 1
    new_process()
    second = run(x * 2.0, scale=1.0)  # other numbers, same structure: the same program
    assert TRACES == [3]  # not traced again
    np.testing.assert_allclose(second["y"], (x * 2.0) ** 3)
    assert float(second["total"]) == 12.0 and float(first["total"]) == 6.0
    run(x, power=2)  # another static argument: another program
    run(jnp.arange(5.0))  # another shape: another program
    assert TRACES == [3, 2, 3] and len(_programs.entries(store)) == 3


def test_the_entry_used_next_is_read_on_a_second_thread(store, monkeypatch):
    import threading

    x = jnp.arange(1.0, 4.0)
    run(x)
    (first,) = _programs.entries(store)
    run(x, power=2)
    (second,) = set(_programs.entries(store)) - {first}
    assert _programs.successor(first) == second and _programs.successor(second) is None
    new_process()
    loaded = []
    load = _programs._load

    def spy(path):
        loaded.append((path, threading.current_thread().name))
        return load(path)

    monkeypatch.setattr(_programs, "_load", spy)
    np.testing.assert_allclose(run(x)["y"], 2.0 * x**3)
    np.testing.assert_allclose(run(x, power=2)["y"], 2.0 * x**2)
    assert TRACES == [3, 2]  # both loaded, neither traced again
    assert sorted(loaded) == sorted([(first, "MainThread"), (second, "dcost-prefetch")])
    assert not _programs._PREFETCHED  # taken by the call that asked for it
    # a successor record that names anything but an entry beside it is ignored
    side = first.with_suffix(_programs.NEXT)
    for text in ("../elsewhere.xla", "/var/elsewhere.xla", "notes.txt", "", ".hidden.xla"):
        side.write_text(text)
        assert _programs.successor(first) is None
    # a successor that is never asked for is read and dropped; a corrupt one is compiled again
    side.write_text(second.name)
    second.write_bytes(b"not a program")
    new_process()
    run(x)
    run(x, power=2)
    assert TRACES == [3, 2, 2]


def test_a_task_runs_beside_the_first_compile_and_only_then(store):
    import threading

    x = jnp.arange(1.0, 4.0)
    ran = []

    def task():
        ran.append(threading.current_thread().name)
        # what the command line does: prepare another program, which a later call then finds
        assert _programs.prepare(polynomial, (x, jnp.asarray(1.0)), {"power": 2}, ("power",), None)
        raise RuntimeError("a task's own error stays in its thread")

    with _programs.during_compile(task):
        run(x)  # compiles: the task starts on a second thread; the block waits for it
    assert ran == ["dcost-during-compile"] and sorted(TRACES) == [2, 3]
    np.testing.assert_allclose(run(x, power=2)["y"], 2.0 * x**2)
    assert sorted(TRACES) == [2, 3]  # prepared: found in memory, not traced again
    new_process()
    with _programs.during_compile(task):
        run(x)  # loaded from the store: nothing compiles, so the task never runs
    assert ran == ["dcost-during-compile"] and not _programs._DURING_COMPILE


def test_a_corrupt_entry_is_traced_again_and_rewritten(store):
    x = jnp.arange(1.0, 4.0)
    run(x)
    (entry,) = _programs.entries(store)
    for garbage in (b"", b"not a program", entry.read_bytes()[:-100]):
        entry.write_bytes(garbage)
        new_process()
        np.testing.assert_allclose(run(x)["y"], 2.0 * x**3)
    assert len(TRACES) == 4  # each bad file: traced again
    new_process()
    run(x)
    assert len(TRACES) == 4  # and rewritten whole: found again


class _Unfinished:
    """A result whose computation fails only when awaited, as an asynchronously dispatched
    executable's does (XLA:CPU: ``NOT_FOUND: Function ... not found`` at the first read)."""

    def block_until_ready(self):
        raise RuntimeError("NOT_FOUND: Function iota.57_kernel not found")


@pytest.mark.parametrize("when", ["at the call", "when awaited"])
def test_an_executable_that_fails_to_run_falls_back_to_the_plain_jit(store, when):
    """A loaded program whose call raises, or whose results fail when awaited, is not retried:
    ``run`` says SKIP (the caller's plain jit gives the answer), and its entry is removed so that
    no later process loads it."""
    x = jnp.arange(1.0, 4.0)
    run(x)
    ((memo_key, (_, out_tree, path)),) = _programs._MEMO.items()
    assert path.exists()

    def broken(*leaves):
        if when == "at the call":
            raise RuntimeError("executable does not dispatch")
        return [_Unfinished()]

    _programs._MEMO[memo_key] = (broken, out_tree, path)
    args = (polynomial, (x, jnp.asarray(2.0)), {"power": 3}, ("power",), None)
    assert _programs.run(*args) is _programs.SKIP
    assert _programs._MEMO[memo_key] is _programs._BROKEN and not path.exists()
    assert _programs.run(*args) is _programs.SKIP  # and from then on, without trying again


def test_a_foreign_or_stale_entry_is_never_used(store, monkeypatch):
    x = jnp.arange(1.0, 4.0)
    run(jnp.arange(5.0))  # another program's entry...
    (other,) = _programs.entries(store)
    run(x)
    mine = next(p for p in _programs.entries(store) if p != other)
    mine.write_bytes(other.read_bytes())  # ... copied over this one's (takes another shape)
    new_process()
    np.testing.assert_allclose(run(x)["y"], 2.0 * x**3)
    assert len(TRACES) == 3
    # an edit to dcost (its source fingerprint) or another JAX: a new key, never the old entry
    monkeypatch.setattr(_programs, "fingerprint", lambda: "an edited dcost")
    new_process()
    run(x)
    assert len(TRACES) == 4 and len(_programs.entries(store)) == 3


def test_what_is_not_kept(store):
    assert _programs.run(lambda x: x, (jnp.ones(2),), {}, (), None) is _programs.SKIP  # a lambda
    inside = []

    @jax.jit
    def traced(x):
        inside.append(
            _programs.run(polynomial, (x, jnp.asarray(1.0)), {"power": 2}, ("power",), None)
        )
        return x

    traced(jnp.ones(2))
    assert inside == [_programs.SKIP]  # inside another trace
    assert _programs.entries(store) == [] and TRACES == []


def test_the_key_is_the_same_in_every_process():
    """Sets print in an order that follows string hashing, which differs between processes."""
    assert _programs.canonical(frozenset({"tpot", "memory", "batch"})) == (
        "{'batch', 'memory', 'tpot'}"
    )
    p = dcost.Problem(dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"), dcost.Workload(512))
    text = _programs.canonical(jax.tree.structure(p))
    assert "Objective(" in text and "function dcost.search.objectives" in text and "0x" not in text
    with pytest.raises(_programs.Unsupported):
        _programs.canonical(lambda: 0)


@pytest.mark.slow
def test_optimize_runs_from_the_store_and_gives_the_same_answer(store, monkeypatch):
    traces = []
    relax_one, round_one = optimize_mod._relax_one, optimize_mod._round_one

    def counting_relax(problem, settings):
        traces.append("relax")
        return relax_one(problem, settings)

    def counting_round(problem, best, v, settings):
        traces.append("round")
        return round_one(problem, best, v, settings)

    monkeypatch.setattr(optimize_mod, "_relax_one", counting_relax)
    monkeypatch.setattr(optimize_mod, "_round_one", counting_round)
    settings = Settings(starts=2, rounds=3, steps=4, local_rounds=1)
    calibrated = dcost.hardware("h100-sxm", calibrated=True)
    on_vllm = dcost.engine("vllm", "h100-sxm").apply(calibrated, model=dcost.model("llama-3-8b"))

    def problem(hardware):
        return dcost.Problem(
            hardware,
            dcost.model("llama-3-8b"),
            dcost.Workload(2048),
            free={"batch": (1, 97), "chips": (1, 3)},  # a structure of this test's own
            tpot_slo=0.01,
        )

    p = problem(calibrated)
    with _jit.prefer_fast_compile():
        first = dcost.optimize(p, settings)
        new_process()
        second = dcost.optimize(p, settings)  # the same question in a "new process"
        new_process()  # on an engine's profile: the same programs (``dcost.specs.shared_form``)
        third = dcost.optimize(problem(on_vllm), settings)
    assert traces == ["relax", "round"]  # traced once each, in the first "process" only
    np.testing.assert_array_equal(np.asarray(first.x), np.asarray(second.x))
    assert first.binding == second.binding and float(first.cost) == float(second.cost)
    assert float(third.cost) != float(first.cost)  # the engine's own step times
    relax, round_ = (e for e in _programs.entries(store))
    assert (relax.name.split("-")[0], round_.name.split("-")[0]) == ("relax", "round")
    assert _programs.successor(relax) == round_  # the second is read beside the first


@pytest.mark.slow
def test_a_plan_runs_from_the_store_and_gives_the_same_answer(store, monkeypatch):
    """The planner's step tables and search are kept and loaded like the searches' programs
    (a deserialized form of an earlier planner program failed to run on XLA:CPU): the second
    plan, in a "new process", and a third at another rate load the search instead of tracing
    it, the first two give the same fleet, and the store holds the search and the tables.

    On two cores, the first plan traces its first kind of pool's search (the alternative's,
    aggregated) and leaves the other two to a helper process (Python's lock would let a thread
    trace only while this one does not); it loads them from the store, and what it loads
    answers exactly as the same program compiled here."""
    from dcost.planning import planner

    monkeypatch.setattr(_programs, "cores", lambda: 2)
    traces, calls, helpers = [], {}, []
    search, program, start = planner.S.search, planner._search_kind, _programs.prepare_elsewhere

    def counting(*args, **kw):
        traces.append(args[0])
        return search(*args, **kw)

    def recording(*args):
        calls[args[0]] = (args, program(*args))
        return calls[args[0]][1]

    def started(tasks):
        helper = start(tasks)
        helpers.append(helper)
        if helper is not None:
            wait = helper.wait
            helper.wait = lambda timeout=_programs.HELPER_TIMEOUT: helpers.append(wait(timeout))
        return helper

    recording.elsewhere = program.elsewhere  # type: ignore[attr-defined]
    recording.prepare = program.prepare  # type: ignore[attr-defined]
    monkeypatch.setattr(planner.S, "search", counting)
    monkeypatch.setattr(planner, "_search_kind", recording)
    monkeypatch.setattr(_programs, "prepare_elsewhere", started)
    h = dcost.hardware("h100-sxm", calibrated=True)

    def plan(rate, engine=None):  # compiled as `dcost plan` compiles them, the planner's too
        with _jit.prefer_fast_compile(even_optimized=True):
            return dcost.plan(
                h,
                "llama-3-8b",
                dcost.traffic("chat", rate=rate),
                mode="disaggregated",
                engine=engine,
            )

    first = plan(5.0)
    assert traces == ["aggregated"]  # the other pools' searches were traced in the helper alone
    assert helpers[0] is not None and helpers[1] is True  # and it prepared them
    args, loaded = calls["decode"]
    with _jit.prefer_fast_compile(even_optimized=True):
        here = program.compiled()(*args)  # the same program, compiled in this process
    assert jax.tree.structure(here) == jax.tree.structure(loaded)
    for a, b in zip(jax.tree.leaves(here), jax.tree.leaves(loaded), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    traced = len(traces)
    new_process()
    second = plan(5.0)
    new_process()
    third = plan(50.0)
    # pure physics, a family profile and an engine's are one structure to the planner's
    # programs (``Hardware.filled``): the plans on vLLM's profile and on pure physics load them
    new_process()
    fourth = plan(5.0, dcost.engine("vllm", "h100-sxm"))
    new_process()
    h = dcost.hardware("h100-sxm")
    fifth = plan(5.0)
    assert len(traces) == traced  # loaded, not traced: the same structure, other numbers too
    assert helpers[2:] == [None] * 4  # nothing left to compile elsewhere
    assert str(first) == str(second) and first.chips == second.chips and first.feasible
    assert third.chips > first.chips
    for other in (fourth, fifth):  # their own step times
        assert other.feasible and other.tpot != first.tpot
    assert fifth.tpot[0.9] < first.tpot[0.9]  # pure physics is a bound
    names = sorted({e.name.split("-")[0] for e in _programs.entries(store)})
    assert names == ["search_kind", "tables"]  # one search program per kind of pool


@pytest.mark.slow
def test_a_calibration_runs_from_the_store_and_gives_the_same_answer(store, monkeypatch):
    """``dcost.calibrate.fit``'s programs (the fit and the predictions) are kept and loaded like
    the searches': in a "new process" the same calibration traces nothing and moves every
    field to the same value."""
    from dcost.calibrate import user
    from dcost.validation import cases, silicon

    traces = []
    evaluate = cases.evaluate_metrics

    def counting(*args, **kw):
        traces.append(1)
        return evaluate(*args, **kw)

    monkeypatch.setattr(cases, "evaluate_metrics", counting)
    recs = [
        r
        for r in silicon.records()[0]
        if r["engine"] == "trtllm" and r["serving"] == "decode" and r["hardware"] == "h200"
    ][:3]
    eng = dcost.engine("trtllm", hardware="h200")
    first = user.calibrate(recs, eng)
    traced = len(traces)
    assert traced > 0
    new_process()
    second = user.calibrate(recs, eng)
    assert len(traces) == traced  # loaded, not traced
    assert first.after == second.after and first.residual_after == second.residual_after
    names = sorted({e.name.split("-")[0] for e in _programs.entries(store)})
    assert names == ["map"]  # the residuals it returns give the fit's RMS: no second program


_CALIBRATE = """
import json, sys
import dcost
from dcost.calibrate import user
from dcost.validation import silicon
recs = [r for r in silicon.records()[0]
        if r["engine"] == "trtllm" and r["serving"] == "decode" and r["hardware"] == "h200"][:3]
cal = user.calibrate(recs, dcost.engine("trtllm", hardware="h200"))
print(json.dumps(cal.after))
"""


@pytest.mark.slow
def test_a_fresh_process_runs_the_stored_fit(tmp_path):
    """The fit's program solves with LAPACK; a process that loads it from the store traces
    nothing, so JAX never filled in LAPACK's kernels there and the run crashed (a segmentation
    fault) until the store loads them for such entries. Two interpreters, one store: the second
    loads the program, exits cleanly and gives the same fit."""
    import json
    import os
    import subprocess
    import sys

    keep = {k: v for k, v in os.environ.items() if not k.startswith(("JAX_", "DCOST_", "XLA_"))}
    env = dict(keep, DCOST_CACHE_DIR=str(tmp_path), DCOST_FAST_COMPILE="1", JAX_PLATFORMS="cpu")
    outs = []
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, "-c", _CALIBRATE], env=env, capture_output=True, text=True, timeout=300
        )
        assert run.returncode == 0, run.stderr[-2000:]
        outs.append(json.loads(run.stdout.strip().splitlines()[-1]))
    assert [p.name.split("-")[0] for p in _programs.entries(tmp_path / "programs")] == ["map"]
    assert outs[0] == outs[1]


def test_a_program_jax_has_cached_is_compiled_afresh_for_the_store(store, tmp_path_factory):
    """An executable that JAX loaded from its persistent cache fails to run once serialized
    again and loaded (XLA:CPU: ``NOT_FOUND: Function ... not found``), so the store compiles
    its programs with JAX's cache off. Here JAX's cache holds the very program (compiled as an
    earlier dcost did, with the cache on); the entry written afterwards must load and run."""
    import contextlib

    from jax.experimental.compilation_cache import compilation_cache

    settings = {
        "jax_compilation_cache_dir": str(tmp_path_factory.mktemp("jax-cache")),
        "jax_persistent_cache_min_compile_time_secs": 0.0,
        "jax_persistent_cache_min_entry_size_bytes": -1,
        "jax_enable_compilation_cache": True,
    }
    before = {k: getattr(jax.config, k) for k in settings}
    x = jnp.arange(1.0, 40.0)
    try:
        for k, v in settings.items():
            jax.config.update(k, v)
        compilation_cache.reset_cache()
        cache_off = _programs._jax_cache_off
        _programs._jax_cache_off = contextlib.nullcontext  # an earlier dcost: JAX keeps a copy
        try:
            run(x)
        finally:
            _programs._jax_cache_off = cache_off
        assert any(pathlib.Path(settings["jax_compilation_cache_dir"]).iterdir())
        for entry in _programs.entries(store):
            entry.unlink()  # the store lost its entry; JAX's cache still has the program
        new_process()
        jax.clear_caches()
        run(x)  # compiled afresh and written
        new_process()
        np.testing.assert_allclose(run(x)["y"], 2.0 * x**3)  # the entry loads and runs
        assert len(_programs.entries(store)) == 1
    finally:
        for k, v in before.items():
            jax.config.update(k, v)
        compilation_cache.reset_cache()


def test_a_helper_process_is_started_only_where_it_can_help(store, monkeypatch):
    """``prepare_elsewhere`` starts nothing without a task, without a store, on one core or in
    a helper itself; a helper that cannot do its task says so (the programs are then compiled
    by whoever runs them) and leaves no file of tasks behind."""
    task = ("dcost.planning.planner", "no_such_program", False, (), {})
    monkeypatch.setattr(_programs, "cores", lambda: 2)
    assert _programs.prepare_elsewhere([None, None]) is None
    monkeypatch.setattr(_programs, "cores", lambda: 1)
    assert _programs.prepare_elsewhere([task]) is None
    monkeypatch.setattr(_programs, "cores", lambda: 2)
    monkeypatch.setenv(_programs.HELPER_ENV, "1")
    assert _programs.prepare_elsewhere([task]) is None
    monkeypatch.delenv(_programs.HELPER_ENV)
    helper = _programs.prepare_elsewhere([task])
    assert helper is not None and helper.payload.is_file()
    assert helper.wait(timeout=120) is False
    assert not helper.payload.exists() and list(store.iterdir()) == []
    monkeypatch.setattr(_programs, "directory", lambda: None)
    assert _programs.prepare_elsewhere([task]) is None
