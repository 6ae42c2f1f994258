"""dcost.plan: the search against its exhaustive grid, the plan against the simulation, the
envelope sensitivities against re-solving, bad input, and ``dcost plan`` on the command line.

Every test plans llama-3-70b on calibrated H100s with the default layouts, so the planner's
program compiles once for the module (about 15 s of CPU on 2 cores; the grid's about 9 s)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import io
import json
import math
import re

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost
from dcost.cli.app import main
from dcost.cli.plan import launch_settings, parse_slo, scheduler_settings, token_budget
from dcost.planning import (
    Layout,
    plan,
    plan_grid,
    plan_sensitivity,
    relaxed_replicas,
    simulate,
    step_table,
)
from dcost.planning.designs import trip, workload_of
from dcost.planning.search import CONSTRAINTS
from dcost.serving.moe import profiled_routing
from dcost.specs import SpecError

MODEL = "llama-3-70b"


@pytest.fixture(scope="module")
def h100():
    return dcost.hardware("h100-sxm", calibrated=True)


@pytest.fixture(scope="module")
def llama():
    return dcost.model(MODEL)


@pytest.fixture(scope="module")
def chat100(h100, llama):
    return plan(h100, llama, dcost.traffic("chat", rate=100.0))


# --------------------------------------------------------------------------- the step table


@pytest.mark.parametrize(
    "model,layout,calibrated,tol",
    [
        ("llama-3-70b", (8, 1, 1, 2048, 0), False, 2e-3),
        ("llama-3-70b", (8, 1, 1, 2048, 0), True, 0.02),
        ("llama-3-405b", (8, 2, 1, 4096, 0), True, 0.02),
        ("deepseek-v3", (16, 1, 16, 4096, 0), False, 0.03),  # expert parallel, DP attention
        ("deepseek-v3", (32, 1, 1, 1024, 2), True, 0.03),  # TP attention, two draft tokens
    ],
)
def test_step_table_against_the_serving_model(model, layout, calibrated, tol):
    """The interpolated step against ``dcost.mixed_step`` at random batches and chunks: within
    0.2 % for a dense model on the roofline (its parts are affine between the nodes but for the
    earlier chunks' KV reads, which stop at ``c = T_in``); 2 % with the calibrated profile
    (kernels in series: a sum of per-kernel maxima bends between nodes); 3 % for MoE (the
    expert fraction bends; the worst point is a step of 1.4 ms at a batch of 2)."""
    h = dcost.presets.serving_hardware("h100-sxm", model, calibrated=calibrated)
    m = dcost.model(model)
    w = dcost.Workload(1300.0, prompt=1155.0, output=211.0, acceptance=0.8)
    lay = Layout(*layout)
    table = jax.jit(step_table)(lay, h, m, w)
    rng = np.random.default_rng(0)
    b = np.exp(rng.uniform(0.0, np.log(5000.0), 200))
    c = np.where(rng.uniform(size=200) < 0.3, 0.0, np.exp(rng.uniform(0.0, np.log(16000.0), 200)))
    got = np.asarray(jax.vmap(table.trip)(b, c))
    exact = np.asarray(jax.jit(jax.vmap(lambda x, y: trip(lay, h, m, w, x, y)))(b, c))
    np.testing.assert_allclose(got, exact, rtol=tol)
    # against the public function: 64 sequences and a chunk of 512 per replica (its steady
    # state's chunk is capped at the design's prefill_chunk when prompts outpace outputs)
    g, p, a, _, k = layout
    d = dcost.Design(64.0 / p, g, p, attention_dp=a, draft_tokens=k, prefill_chunk=512.0 / p)
    r = dcost.mixed_step(d, h, m, dcost.Workload(1300.0, prompt=1155.0, output=1.0, acceptance=0.8))
    assert float(table.trip(64.0, 512.0)) == pytest.approx(
        float(r.tpot * r.tokens_per_step), rel=tol
    )


def test_decode_pool_table_pays_its_admissions():
    """A disaggregated decode pool's step table against ``dcost.decode`` (which charges the
    engine's ``prefill_step_overhead`` on the share ``min(1, B/T_out)`` of steps that admit a
    sequence) at the nodes, one stage and two: within 0.5 %, and the aggregated table's decode
    steps (c = 0) pay none of it (their prompt steps do, in ``dcost.mixed_step``)."""
    eng = dcost.engine("trtllm", hardware="h100-sxm")
    h, m = eng.apply(dcost.hardware("h100-sxm"), model=dcost.model(MODEL)), dcost.model(MODEL)
    fee = float(h.prefill_step_overhead)
    assert fee > 1e-4
    w = dcost.Workload(1300.0, prompt=1155.0, output=211.0)
    for stages in (1, 2):
        lay = Layout(8, stages, 1, 2048, 0)
        dec = jax.jit(step_table, static_argnames="kind")(lay, h, m, w, kind="decode")
        agg = jax.jit(step_table)(lay, h, m, w)
        for b in (15.0, 255.0, 1023.0):  # nodes: 2**(k/2) - 1
            r = dcost.decode(dcost.Design(b / stages, 8, stages, attention_dp=1), h, m, w)
            assert float(dec.trip(b, 0.0)) == pytest.approx(float(r.tpot), rel=5e-3)
            share = min(1.0, b / stages / 211.0)
            gap = float(dec.trip(b, 0.0) - agg.trip(b, 0.0))
            assert gap == pytest.approx(stages * share * fee, rel=1e-3)


@pytest.mark.parametrize(
    "name, x64", [("llama-3-70b", False), ("mixtral-8x7b", False), ("llama-3-70b", True)]
)
def test_tables_skip_padding_chunks_and_match_one_vmap(name, x64):
    """The planner's tables, ``_CHUNK`` layouts a loop step with chunks of padding rows skipped,
    are one ``vmap`` of ``step_table`` over every row, for every kind and in float32 and float64
    (the skipped chunks' dtype is the model's): the same NaN rows (the padding, whole chunks of
    it skipped) and the same times within float32 rounding (XLA vectorizes a chunk of 16 rows
    and a stack of 128 apart: a few ulps)."""
    from dcost.planning import planner as PL
    from dcost.planning.designs import workload_stats

    with jax.enable_x64(x64):
        h, m = dcost.hardware("h100-sxm", calibrated=True).filled(), dcost.model(name)
        stats = workload_stats(dcost.traffic("chat", rate=10.0))[None]  # one workload
        for kind in ("aggregated", "prefill", "decode"):
            rows = PL.layouts(kind, h, m)
            size = PL._layout_size(len(rows))
            assert size - len(rows) >= PL._CHUNK  # at least one chunk is padding alone
            lays = PL._stack(rows, size)
            imb = jnp.asarray(profiled_routing(True, m), stats.dtype)  # a profiled chip
            chunked = jax.jit(PL._tables_one, static_argnums=0)(kind, h, m, lays, stats, None, imb)

            def whole(lays, kind=kind, imb=imb):
                work = PL.workload_from_stats(stats[0], kind, None, imb)
                one = jax.vmap(lambda lay: step_table(lay, h, m, work, kind))(lays)
                return jax.tree.map(lambda x: x[None], one)

            for a, b in zip(
                jax.tree.leaves(chunked), jax.tree.leaves(jax.jit(whole)(lays)), strict=True
            ):
                assert a.shape == b.shape and a.dtype == b.dtype
                a, b = np.asarray(a), np.asarray(b)
                assert np.array_equal(np.isnan(a), np.isnan(b)), kind
                np.testing.assert_allclose(a, b, rtol=2e-5, atol=0, err_msg=kind)
            assert np.all(np.isnan(np.asarray(chunked.parts[0, len(rows) :])))
            assert np.all(np.isfinite(np.asarray(chunked.parts[0, : len(rows)])))
            assert chunked.parts.dtype == (np.float64 if x64 else np.float32)


# --------------------------------------------------------------------------- the plan itself


def test_default_plan_is_a_fleet_a_person_recognises(chat100, h100):
    """Chat at 100 requests/s on calibrated H100s: decode replicas of 4 or 8 GPUs of one box, a
    batch cap in the hundreds, within the targets, priced by hand."""
    p = chat100
    assert p.feasible and p.mode in ("aggregated", "disaggregated")
    price = float(h100.price_per_hour)
    assert p.cost_per_hour == pytest.approx(p.chips * price, rel=1e-6)
    assert p.chips == sum(x.replicas * x.chips_per_replica for x in p.pools)
    decode = p.pools[-1]
    assert decode.chips_per_replica in (4, 8) and 100 <= decode.batch_cap <= 5000
    assert decode.memory_per_chip <= 0.9 * float(h100.hbm_capacity) * (1 + 1e-6)
    assert p.ttft[0.99] <= 2.0 and p.tpot[0.9] <= 0.05
    assert sorted(p.ttft) == [0.5, 0.9, 0.99] and p.ttft[0.5] <= p.ttft[0.9] <= p.ttft[0.99]
    # the bill splits between input and output tokens and adds up to the hour's bill
    rate = 100.0
    t = dcost.traffic("chat")
    per_hour = (
        p.cost_per_million_input * rate * float(t.prompt_tokens) * 3600 / 1e6
        + p.cost_per_million_output * rate * float(t.output_tokens) * 3600 / 1e6
    )
    assert per_hour == pytest.approx(p.cost_per_hour, rel=1e-5)
    assert p.binding and p.alternative is not None and p.alternative.mode != p.mode
    assert p.alternative.cost_per_hour >= p.cost_per_hour


def test_binding_is_named_with_its_shadow_price(chat100):
    """Whole replicas; every pool names the constraint one replica fewer breaks, and a latency
    target that binds carries a negative shadow price (a looser target saves dollars)."""
    priced = 0
    for q in (chat100, chat100.alternative):
        for pool in q.pools:
            assert isinstance(pool.replicas, int) and pool.replicas >= 1
            assert pool.binding.split("_")[0] in (*CONSTRAINTS, "one replica")
            if pool.binding.startswith(("ttft", "tpot")) and pool.replicas > 1:
                assert pool.shadow_price < 0 and pool.elasticity < 0
                priced += 1
            else:
                assert pool.shadow_price == 0.0
    assert priced >= 1


SCENARIOS = [
    ("chat", 20.0),
    ("summarization", 10.0),
    ("code-completion", 40.0),
    ("reasoning", 5.0),
]


@pytest.mark.parametrize("preset,rate", SCENARIOS)
def test_search_matches_the_exhaustive_grid(preset, rate, h100, llama):
    """Branch and bound against every layout at every replica count 1..64, both modes."""
    t = dcost.traffic(preset, rate=rate)
    p = plan(h100, llama, t)
    g = plan_grid(h100, llama, t, n_max=64)
    for q in (p, p.alternative):
        chips, pools = g[q.mode]
        assert q.feasible == np.isfinite(chips)
        if not q.feasible:
            continue
        assert q.chips == chips
        got = [(x.role, (x.chips_per_stage, x.stages, x.attention_dp), x.replicas) for x in q.pools]
        want = [(role, tuple(int(v) for v in lay[:3]), n) for role, lay, n in pools]
        assert got == want


# --------------------------------------------------------------------------- the simulation

# (mode, requests/s, TTFT tolerance): where 10 % does not hold it is measured (seed 3 and 4,
# 20,000 requests): a disaggregated fleet of 3 prefill replicas (chat at 20/s) comes out
# 22-28 % short at TTFT p90/p99. Its replicas take a prompt while their backlog is under one
# chunk, so a prompt queues behind up to a chunk of others where an M/G/c queue would have it
# wait for a free replica; with 8 or more prefill replicas the difference is within 10 %.
LOADS = [
    pytest.param("aggregated", 20.0, 0.10),
    pytest.param("aggregated", 60.0, 0.10),
    pytest.param("aggregated", 150.0, 0.10, marks=pytest.mark.slow),
    pytest.param("disaggregated", 20.0, 0.30),
    pytest.param("disaggregated", 60.0, 0.10),
    pytest.param("disaggregated", 150.0, 0.10, marks=pytest.mark.slow),
]


@pytest.mark.parametrize("mode,rate,ttft_rtol", LOADS)
def test_plan_within_ten_percent_of_its_simulation(mode, rate, ttft_rtol, h100, llama):
    """The planned fleet, run request by request with exact step times: TPOT at every
    percentile and TTFT p99 (the target's) within 10 % (but the case above); TTFT p50 and p90
    within 25 % (the loosest: p50 -16 % at chat 100/s aggregated, a prompt's own step)."""
    best = plan(h100, llama, dcost.traffic("chat", rate=rate))  # both modes, one program
    p = best if best.mode == mode else best.alternative
    assert p.mode == mode and p.feasible
    sim = simulate(p, requests=20_000, seed=3)
    assert not sim.truncated
    q = list(sim.quantiles)
    ttft = np.array([p.ttft[x] for x in q])
    tpot = np.array([p.tpot[x] for x in q])
    i99 = q.index(0.99)
    assert ttft[i99] == pytest.approx(sim.ttft_percentiles[i99], rel=ttft_rtol)
    np.testing.assert_allclose(ttft, sim.ttft_percentiles, rtol=max(ttft_rtol, 0.25))
    # TPOT p99 of an aggregated fleet: measured (seed 3, 20,000 requests) 16-21 % above the
    # simulation for llama-3-70b chat at 20-150/s since the tail counts the batch's feedback,
    # heavy-tailed windows and short outputs' chunk counts (issue 34; it was 10-45 % below
    # for small MoE models and long prompts): on the safe side, kept at 25 % until narrowed
    rtol = np.where(np.asarray(q) == 0.99, 0.25 if mode == "aggregated" else 0.10, 0.10)
    assert np.all(np.abs(tpot / sim.tpot_percentiles - 1.0) <= rtol), (tpot, sim.tpot_percentiles)


# --------------------------------------------------------------------------- sensitivities


@pytest.mark.slow  # the gradient through the closed forms compiles for about 15 s
@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_envelope_sensitivities_match_re_solving(mode, h100, llama, monkeypatch):
    """d log($) / d log(x) by the envelope theorem against re-solving the relaxed replica
    counts with x moved (and 10 % for traffic, where the relaxation is smooth). Each pool's
    program goes through dcost's program store with array arguments alone (a Python scalar
    sends a program to the plain jit, never stored: a later process traced it again)."""
    from dcost import _programs

    stored, run = [], _programs.run

    def spy(fun, args, kwargs, static_argnames, *rest, **kw):
        bound = inspect.signature(fun).bind(*args, **kwargs).arguments
        leaves = jax.tree.leaves([v for k, v in bound.items() if k not in static_argnames])
        stored.append((fun.__name__, all(isinstance(x, jax.Array) for x in leaves)))
        return run(fun, args, kwargs, static_argnames, *rest, **kw)

    t = dcost.traffic("chat", rate=60.0)
    p = plan(h100, llama, t, mode=mode)
    monkeypatch.setattr(_programs, "run", spy)
    s = plan_sensitivity(p)
    monkeypatch.undo()
    assert [x for x in stored if x[0] == "_pool"] == [("_pool", True)] * len(p.pools)
    assert s.elasticity("price_per_hour") == 1.0
    chips = np.array([x.chips_per_replica for x in p.pools], dtype=float)
    base = float(relaxed_replicas(p) @ chips)

    def resolved(**kw):
        return float(relaxed_replicas(p, **kw) @ chips) / base - 1.0

    # Locally the envelope elasticity is the re-solved slope. A calibrated step runs its kernels
    # in series (a sum of per-kernel maxima) and a prefill pool's count has kinks in the prompt
    # length, so near a kink it is one of the one-sided slopes of the finest moves (disaggregated
    # chat at 60/s, HBM bandwidth: -0.879 predicted; re-solved -0.879 and -0.880 over +-0.01 %,
    # -0.083 and -0.523 over +-0.1 %, -0.033 and -0.195 over +-1 %). It must match a side of a
    # move of 1 %, 0.1 % or 0.01 % (float32's noise there is below 0.5 %) within 0.5 %. The
    # moves are tried from the widest and stop at the first side that matches (a re-solve is
    # two pools' bisections, seconds each).
    def matches(e, move):
        got = []
        for f in (1.01, 1 / 1.01, 1.001, 1 / 1.001, 1.0001, 1 / 1.0001):
            got.append(math.log1p(move(f)) / math.log(f))
            if abs(e - got[-1]) <= 5e-3 * max(1.0, abs(e)):
                return True, got
        return False, got

    def moved_traffic(name, f):
        return resolved(traffic=eqx.tree_at(lambda x: getattr(x, name), t, getattr(t, name) * f))

    def moved_chip(name, f):
        return resolved(
            hardware=eqx.tree_at(lambda x: getattr(x, name), h100, getattr(h100, name) * f)
        )

    checks = {
        n: functools.partial(moved_traffic, n) for n in ("rate", "prompt_tokens", "output_tokens")
    }
    checks |= {name: functools.partial(moved_chip, name) for name in ("hbm_bandwidth", "flops")}
    checks["tpot_slo"] = lambda f: resolved(tpot_slo=0.05 * f)
    for name, move in checks.items():
        e = math.log1p(s.what_if(name, 1.001)) / math.log(1.001)
        ok, got = matches(e, move)
        assert ok, (name, e, got)
    # 10 % more traffic or longer outputs: the relaxed bill is smooth there (not in the prompt
    # length, whose kinks move the disaggregated slope from 0.99 to 0.73 over 10 %)
    for name in ("rate", "output_tokens"):
        assert s.what_if(name, 1.1) == pytest.approx(moved_traffic(name, 1.1), abs=0.01)
    # 10 % more traffic: the whole-replica bill moves in steps, the relaxed one smoothly
    q = plan(h100, llama, dcost.traffic("chat", rate=66.0), mode=mode)
    assert q.cost_per_hour >= p.cost_per_hour


# --------------------------------------------------------------------------- many scenarios


# --------------------------------------------------------------------------- infeasible, bad


def test_infeasible_names_the_binding_limit(h100, llama):
    fast = plan(h100, llama, dcost.traffic("chat", rate=10.0), tpot_slo=(0.001, 0.9))
    assert not fast.feasible and fast.binding == "tpot_p90" and "tpot_p90" in fast.message
    other = fast.alternative  # the prefill pool has a fleet: the decode pool is named
    assert not other.feasible and other.message.startswith("tpot_p90 (decode pool)")
    assert "ms" in fast.message
    short = plan(h100, llama, dcost.traffic("long-context", rate=1.0), ttft_slo=(0.05, 0.99))
    assert not short.feasible and short.binding == "ttft_p99" and "idle" in short.message
    with pytest.raises(SpecError, match="infeasible"):
        simulate(fast)
    # past the most replicas the search tries: said so, with the least count a layout needs
    huge = plan(h100, llama, dcost.traffic("chat", rate=1e9))
    assert not huge.feasible and "8,388,608" in huge.message
    need = float(huge.message.split("at least ")[1].split(")")[0].replace(",", ""))
    assert need > 8_388_608 and "share of the traffic" in huge.message


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"ttft_slo": 2.0}, r"plan\.ttft_slo"),
        ({"ttft_slo": (0.0, 0.99)}, r"ttft_slo\[0\]"),
        ({"tpot_slo": (0.05, 0.2)}, r"tpot_slo\[1\]"),
        ({"tpot_slo": (0.05, 1.0)}, r"tpot_slo\[1\]"),
        ({"mode": "both"}, r"plan\.mode"),
        ({"memory_reserve": 1.5}, "memory_reserve"),
        ({"acceptance": -0.1}, "acceptance"),
        ({"max_utilisation": 1.2}, "max_utilisation"),
    ],
)
def test_bad_input_names_the_argument(kwargs, match, h100, llama):
    with pytest.raises(SpecError, match=match):
        plan(h100, llama, dcost.traffic("chat", rate=10.0), **kwargs)


def test_bad_specs_are_refused(h100, llama):
    t = dcost.traffic("chat", rate=10.0)
    with pytest.raises(SpecError, match="plan.traffic"):
        plan(h100, llama, {"rate": 10.0})
    with pytest.raises(SpecError, match="plan.hardware"):
        plan("h100-sxm", llama, t)
    with pytest.raises(SpecError, match="plan.model"):
        plan(h100, 3, t)
    with pytest.raises(SpecError, match="from_sample"):
        plan(h100, llama, dcost.Traffic.from_sample(1.0, [100, 200], [10, 20]))
    with pytest.raises(dcost.PresetError, match="llama-3-70b"):
        plan("h100-sxm", "llama-3-7b", t)


# --------------------------------------------------------------------------- the command line

CLI = ["plan", "--hardware", "h100-sxm", "--model", MODEL, "--calibrated"]


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(argv))
        except SystemExit as exit_:  # argparse's own errors
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def test_cli_table_and_launch_settings(chat100):
    code, out, _ = run(*CLI, "--traffic", "chat", "--rate", "100")
    assert code == 0
    assert "$/hour" in out and "TTFT p50/p90/p99" in out and "binding" in out
    assert f"{chat100.cost_per_hour:,.2f}" in out  # the table prints the API's plan
    for flag in ("--tensor-parallel-size", "--max-num-seqs", "--max-running-requests"):
        assert flag in out
    assert "--tp_size" in out and "--max_batch_size" in out
    assert "idles most of the time" not in out  # a fleet of busy replicas
    hopper = dcost.presets.calibration_error("hopper")["family"]
    assert f"its {hopper['records']} records are off by {100 * hopper['median']:.0f} %" in out


def test_cli_says_when_a_target_leaves_the_replicas_idle():
    # Below the fastest layout's step at batch 1 (llama-3-70b on calibrated H100s) the plan is
    # infeasible and says how fast that step is; a TPOT target just above it is met only with
    # replicas that run less than one sequence on average, which the CLI says under its table.
    code, out, _ = run(*CLI, "--traffic", "chat", "--rate", "200", "--tpot", "1ms@p90")
    assert code == 1 and "aggregated infeasible: tpot_p90" in out
    assert "disaggregated infeasible: tpot_p90 (decode pool)" in out
    floor = re.search(r"the fastest layout's step at batch 1 takes ([\d.]+) ms", out)
    assert floor, out
    target = float(floor.group(1)) * 1.006  # the floor is printed to 3 digits
    code, out, _ = run(*CLI, "--traffic", "chat", "--rate", "200", "--tpot", f"{target:.4g}ms@p90")
    assert code == 0
    notes = [ln for ln in out.splitlines() if "idles most of the time" in ln]
    assert notes and all("TPOT target is near the fastest step" in ln for ln in notes)


def test_cli_json_is_the_api_in_si(chat100):
    code, out, _ = run(*CLI, "--traffic", "chat", "--rate", "100", "--json", "--simulate", "2000")
    assert code == 0
    d = json.loads(out)
    assert d["mode"] == chat100.mode and d["chips"] == chat100.chips
    assert d["cost_per_hour"] == pytest.approx(chat100.cost_per_hour)
    assert d["ttft"]["0.99"] == pytest.approx(chat100.ttft[0.99])
    assert d["ttft_slo"] == [2.0, 0.99] and d["tpot_slo"] == [0.05, 0.9]
    assert set(d["launch"]) == {"vllm", "sglang", "trtllm"}
    assert d["simulation"]["requests"] == 2000 and len(d["simulation"]["ttft"]) == 3
    assert d["calibration_error"]["family_name"] == "hopper"  # the profile's held-out error


@pytest.mark.parametrize(
    "argv,match",
    [
        (["--traffic", "chat", "--rate", "10", "--ttft", "2s"], "latency target"),
        (["--traffic", "chat", "--rate", "10", "--tpot", "50ms@p20"], "between p50"),
        (["--traffic", "chat", "--rate", "-3"], "must be > 0"),
        (["--rate", "10", "--prompt", "1000"], "--output"),
        (["--traffic", "chatt", "--rate", "10"], "unknown traffic preset"),
        (["--traffic", "chat", "--rate", "10", "--mode", "both"], "invalid choice"),
        (["--traffic", "chat", "--rate", "10", "--prefix-hit", "1.5"], "must be < 1"),
    ],
)
def test_cli_bad_arguments_one_line_exit_2(argv, match):
    code, out, err = run(*CLI, *argv)
    assert code == 2 and out == "" and match in err and err.count("\n") == 1


def test_slo_parsing_and_launch_settings_for_moe():
    assert parse_slo("250ms@p99.9") == (0.25, 0.999)
    h, m = dcost.presets.pair("h100-sxm", "deepseek-v3")
    from dcost.planning.planner import PoolPlan

    pool = PoolPlan("decode", 16, 1, 16, 0, 1, 2, 256, 32, 100.0, "tpot_p90", 0, 0, 10, 0.02, 7e10)
    fake = type("P", (), {"pools": (pool,), "model": m})()
    vllm = " ".join(launch_settings(fake, "deepseek-v3", "vllm"))
    assert "--data-parallel-size 16" in vllm and "--enable-expert-parallel" in vllm
    assert "--max-num-seqs 16" in vllm  # 256 over 16 data-parallel ranks
    assert "num_speculative_tokens" in vllm and "NixlConnector" in vllm
    sglang = " ".join(launch_settings(fake, "deepseek-v3", "sglang"))
    assert "--enable-dp-attention" in sglang and "--ep-size 16" in sglang
    assert "--disaggregation-mode decode" in sglang and "--speculative-num-steps 1" in sglang
    trt = "\n".join(launch_settings(fake, "deepseek-v3", "trtllm"))
    assert "--ep_size 16" in trt and "enable_attention_dp: true" in trt and "MTP" in trt
    # a decode pool keeps the engines' overlapping schedulers; a prefill pool is launched
    # without them (dcost.planning.launch.PREFILL_OVERLAP), as its simulated settings say
    assert "overlap" not in sglang + trt and "async" not in vllm
    from dcost.planning.launch import scheduler_settings

    assert "async_scheduling" not in scheduler_settings(pool, "vllm")
    pre = PoolPlan("prefill", 8, 1, 8, 0, 1, 1, 16, 32, 100.0, "ttft_p99", 0, 0, 10, 0.02, 7e10)
    fake = type("P", (), {"pools": (pre,), "model": m})()
    flags = {
        "vllm": "--no-async-scheduling",
        "sglang": "--disable-overlap-schedule",
        "trtllm": "config.yml: disable_overlap_scheduler: true",
    }
    for engine, flag in flags.items():
        assert flag in "\n".join(launch_settings(fake, "deepseek-v3", engine)), engine
        assert scheduler_settings(pre, engine)["async_scheduling"] is False


@pytest.mark.slow
def test_the_engines_launches_hold_the_plan_in_their_schedulers():
    """The launch settings of a plan for SGLang, simulated request by request under SGLang's
    scheduler (``dcost.planning.server``, 6,000 Poisson arrivals), meet the plan's targets;
    launched as before (the chunk alone as SGLang's budget, whose running requests take their
    share of it, and SGLang's default order, a step of prompt tokens alone) the same replicas
    miss the TPOT target (their first tokens come about as soon: a p99 TTFT of 0.175 s against
    0.178 s since the 2026-12-01 refit, 2 % sooner, where it had been later, so only the TPOT
    is asserted). The budget is the chunk beside the cap's
    decodes (and verified drafts). vLLM's and TensorRT-LLM's plans hold as launched too, behind
    the router the plan assumes."""
    from dcost.planning.launch import ROUTER
    from dcost.planning.server import Load, Server, simulate_server

    traffic = dcost.traffic("chat", rate=60.0)
    p = plan("h100-sxm", "llama-3-70b", traffic, engine="sglang", mode="aggregated")
    (pool,) = p.pools
    settings = scheduler_settings(pool, "sglang", p.memory_reserve)
    assert settings == {"max_num_seqs": pool.batch_cap, "prefill_first": False,
                        "max_num_batched_tokens": pool.chunk + pool.batch_cap,
                        "gpu_memory_utilization": 0.9}  # fmt: skip
    assert p.memory_reserve == pytest.approx(0.1)
    line = launch_settings(p, "llama-3-70b", "sglang")[1]
    assert f"--chunked-prefill-size {pool.chunk + pool.batch_cap}" in line
    assert "--enable-mixed-chunk" in line and "--max-prefill-tokens" not in line
    assert "--mem-fraction-static 0.9" in line
    load = Load(prompt=float(traffic.prompt_tokens), output=float(traffic.output_tokens),
                stages=((60.0, 100.0),))  # fmt: skip

    def simulated(name="sglang", **launch):
        eng = dcost.engine(name, hardware="h100-sxm", frontend_time=0.0, **launch)
        srv = Server("h100-sxm", "llama-3-70b", engine=eng, tensor_parallel=pool.chips_per_stage,
                     replicas=pool.replicas, router=ROUTER)  # fmt: skip
        s = simulate_server(srv, load, seed=0).summary()
        return s["ttft"]["p99"], s["tpot"]["p90"]

    ttft, tpot = simulated(**settings)
    assert ttft <= p.ttft_slo[0] and tpot <= p.tpot_slo[0], (ttft, tpot)
    old = dict(settings, max_num_batched_tokens=pool.chunk, prefill_first=True)
    ttft_old, tpot_old = simulated(**old)
    assert tpot_old > 1.5 * p.tpot_slo[0], (ttft_old, tpot_old)
    for name in ("vllm", "trtllm"):  # the other engines' plans, as launched, hold too
        p = plan("h100-sxm", "llama-3-70b", traffic, engine=name, mode="aggregated")
        (pool,) = p.pools
        ttft, tpot = simulated(name, **scheduler_settings(pool, name, p.memory_reserve))
        assert ttft <= p.ttft_slo[0] and tpot <= p.tpot_slo[0], (name, ttft, tpot)


def test_token_budgets_and_orders_of_each_kind_of_pool():
    """``C + cap (1 + k)`` for an aggregated pool, ``C`` for a prefill pool; SGLang's mixed
    chunks off with speculative decoding (its server turns them off), said in the launch."""
    from dcost.planning.planner import PoolPlan

    h, m = dcost.presets.pair("h100-sxm", "deepseek-v3")
    agg = PoolPlan(
        "aggregated", 8, 1, 1, 2048, 2, 2, 100, 16, 1.0, "tpot_p90", 0, 0, 10, 0.02, 7e10
    )
    pre = PoolPlan("prefill", 8, 1, 1, 16384, 0, 2, 4, 16, 1.0, "ttft_p99", 0, 0, 1, 0.2, 7e10)
    assert token_budget(agg) == 2048 + 100 * 3 and token_budget(pre) == 16384
    assert scheduler_settings(agg, "vllm")["prefill_first"] is False
    assert scheduler_settings(agg, "sglang")["prefill_first"] is True  # drafts: mixed off
    # a prefill pool's budget is its chunk; a decode pool's launch sets none: the engine's
    # default, or the cap's decode (and draft) tokens where those are more
    assert scheduler_settings(pre, "sglang")["max_num_batched_tokens"] == 16384
    dec = dataclasses.replace(pre, role="decode", chunk=0, batch_cap=5000, draft_tokens=2)
    assert scheduler_settings(dec, "vllm")["max_num_batched_tokens"] == 5000 * 3
    dec = dataclasses.replace(dec, batch_cap=100)
    assert scheduler_settings(dec, "vllm")["max_num_batched_tokens"] == 8192  # vLLM's default
    assert scheduler_settings(dec, "vllm", hardware="a100-80gb")["max_num_batched_tokens"] == 2048
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        scheduler_settings(dec, "tgi")
    fake = type("P", (), {"pools": (agg, pre), "model": m})()
    sglang = launch_settings(fake, "deepseek-v3", "sglang")
    assert "--chunked-prefill-size 2348" in sglang[1] and "--enable-mixed-chunk" not in sglang[1]
    assert sglang[2].startswith("# note: SGLang turns mixed chunks off with speculative")
    assert "--chunked-prefill-size 16384" in sglang[4] and "--max-prefill-tokens" not in sglang[4]
    assert "--max-num-batched-tokens 2348" in " ".join(launch_settings(fake, "deepseek-v3", "vllm"))
    assert "--max_num_tokens 2348" in " ".join(launch_settings(fake, "deepseek-v3", "trtllm"))
    big = PoolPlan(
        "aggregated", 8, 1, 1, 16384, 0, 2, 512, 16, 1.0, "tpot_p90", 0, 0, 10, 0.02, 7e10
    )
    fake = type("P", (), {"pools": (big,), "model": m})()
    line = launch_settings(fake, "deepseek-v3", "sglang")[1]
    assert "--chunked-prefill-size 16896 --max-prefill-tokens 16896 --enable-mixed-chunk" in line


def test_public_names():
    assert dcost.plan is plan and dcost.simulate is simulate
    assert dcost.Plan.__name__ == "Plan" and dcost.PlanBatch.__name__ == "PlanBatch"
    assert {"plan", "simulate", "Plan", "PlanBatch"} <= set(dcost.__all__)


def test_a_profiled_moe_plan_times_its_experts_as_the_validated_model(h100, monkeypatch):
    """On a profiled chip a mixture of experts' plan times its steps at multinomial routing's
    expected maximum expert load, the load the profiles were fitted at and ``dcost.simulate``
    times (``profiled_routing``): on one layout (TP4, chunk 2048) its TPOT is longer than the
    same plan's with balanced routing, by as much as its step is at the planned batch. Pure
    physics (a bound) and a dense model stay balanced."""
    from dcost.planning import planner as PL
    from dcost.planning.designs import Layout
    from dcost.planning.fleet import exact_step
    from dcost.specs import MULTINOMIAL

    traffic = dcost.traffic("chat", rate=20.0)
    one = dcost.planning.Options(chips=(4,), stages=(1,), chunks=(2048,), attention=("tp",))
    moe = plan(h100, "mixtral-8x7b", traffic, mode="aggregated", options=one)
    assert moe.feasible and moe.expert_imbalance == MULTINOMIAL
    assert plan(dcost.hardware("h100-sxm"), "mixtral-8x7b", traffic).expert_imbalance == 1.0
    assert plan(h100, "llama-3-8b", traffic).expert_imbalance == 1.0
    pool = moe.pools[0]
    lay = Layout(pool.chips_per_stage, pool.stages, pool.attention_dp, pool.chunk, 0.0)
    steps = [
        exact_step(h100, moe.model, lay, workload_of(traffic, "aggregated", None, imb))
        for imb in (MULTINOMIAL, 1.0)
    ]
    batch = np.array([16.0, 64.0])
    slower = steps[0](batch, 0.0 * batch) / steps[1](batch, 0.0 * batch)
    assert np.all(slower > 1.005)  # the choice matters at these batches
    monkeypatch.setattr(PL, "profiled_routing", lambda profiled, model: 1.0)
    balanced = plan(h100, "mixtral-8x7b", traffic, mode="aggregated", options=one)
    assert balanced.expert_imbalance == 1.0 and balanced.pools[0].chips == pool.chips
    assert moe.tpot[0.5] / balanced.tpot[0.5] == pytest.approx(np.mean(slower), rel=0.05)
    assert moe.tpot[0.5] > balanced.tpot[0.5]


def test_workload_context_is_the_time_average_of_the_kv():
    """E[T_in] + E[K^2]/(2 E[K]): fixed lengths give T_in + K/2."""
    w = workload_of(dcost.Traffic(1.0, 1000.0, 201.0), "aggregated")
    assert float(w.context) == pytest.approx(1000.0 + 100.0, rel=1e-3)
    assert float(workload_of(dcost.Traffic(1.0, 1000.0, 201.0), "prefill").context) == 1000.0


def test_the_how_to_quotes_the_launch_experiment():
    """The planning how-to's figures are experiments/results/launches_hold.json (python
    experiments/launches_hold.py writes it), and every plan it counts as missing sat within
    about 20 % of a target (as the page says: 19 % and 18 %), and the page quotes its
    --check-launch figures."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    r = json.loads((root / "experiments/results/launches_hold.json").read_text())
    page = " ".join((root / "docs/how-to/plan-a-fleet.md").read_text().split())
    b = r["by_engine"]
    verb = "misses" if r["missed"] == 1 else "miss"
    assert f"{r['missed']} of the {r['feasible']} feasible plans {verb} a target" in page
    assert f"({r['missed_ttft']} the TTFT, {r['missed_tpot']} the TPOT;" in page
    for name, label in (("vllm", "vLLM"), ("sglang", "SGLang"), ("trtllm", "TensorRT-LLM")):
        assert f"{label} {b[name]['missed']} of {b[name]['feasible']}" in page
    rows = [x for x in r["rows"] if x["feasible"]]
    assert len(rows) == r["feasible"] and r["scenarios"] == 30
    for x in rows:
        if x["ttft"]["miss"] or x["tpot"]["miss"]:
            near = max(x["predicted_ttft"] / x["ttft_slo"], x["predicted_tpot"] / x["tpot_slo"])
            assert near >= 0.8, x
    # --check-launch: the misses it finds, the replicas it names and how those held again
    found, extra = r["check_missed"], r["check_extra_replicas"]
    if found == 0:
        assert "on the 30 plans it finds none that misses as launched" in page
    else:
        assert (
            f"it found {found} that {'misses' if found == 1 else 'miss'} as launched and "
            f"replicas for {r['check_repaired']} of them ({extra} more "
            f"replica{'' if extra == 1 else 's'} on the {r['check_planned_replicas']} those "
            "plans had)"
        ) in page
        again = "none" if r["check_repaired_miss"] == 0 else str(r["check_repaired_miss"])
        assert f"{again} of the {r['check_repaired']} missed" in page
    assert r["check_missed"] >= r["missed"]  # one seed, no allowance: the stricter count
    # the router: the same plans behind a least-requests balancer
    rows = [x for x in rows if "ttft_least_requests" in x]
    assert len(rows) == r["routed"] >= 10
    ratio = [x["ttft_least_requests"]["pooled"] / x["ttft"]["pooled"] for x in rows]
    assert f"the p99 TTFT of the {r['routed']} plans of" in page
    assert f"ran {np.median(ratio):.1f}x longer at the median ({min(ratio):.1f}-" in page
    assert f"and {r['missed_least_requests']} of them missed their TTFT" in page
    # and behind a router that counts prompts, not their tokens
    ratio = [x["ttft_least_prefill"]["pooled"] / x["ttft"]["pooled"] for x in rows]
    assert (
        f"its p99 TTFT ran {np.median(ratio):.1f}x least-tokens' at the median "
        f"({min(ratio):.1f}-{max(ratio):.1f}x)"
    ) in page
    said = (
        "and none missed"
        if r["missed_least_prefill"] == 0
        else (
            f"and {r['missed_least_prefill']} missed its TTFT target"
            if r["missed_least_prefill"] == 1
            else f"and {r['missed_least_prefill']} missed their TTFT target"
        )
    )
    assert said in page


def test_the_router_note_quotes_the_launch_experiments():
    """``dcost plan``'s router note quotes experiments/results/launches_hold.json's and
    disaggregated_launches.json's figures: a queue-depth router's worst p99 TTFT over the
    planned, and a least-connections balancer's over the token-counting router's."""
    import pathlib

    from dcost.cli.plan import router_note

    root = pathlib.Path(__file__).resolve().parents[1] / "experiments/results"
    agg = json.loads((root / "launches_hold.json").read_text())
    dis = json.loads((root / "disaggregated_launches.json").read_text())
    rows = [x for x in agg["rows"] if "ttft_least_requests" in x]
    lp = max(x["ttft_least_prefill"]["pooled"] / x["predicted_ttft"] for x in rows)
    lr = [x["ttft_least_requests"]["pooled"] / x["ttft"]["pooled"] for x in rows]
    split = [x for x in dis["rows"] if x["feasible"] and "ttft_least_prefill" in x]
    dp = max(x["ttft_least_prefill"]["pooled"] / x["predicted_ttft"] for x in split)

    class Pool:
        replicas, role = 2, "aggregated"

    class Plan:
        pools = (Pool(),)

    note = " ".join(router_note(Plan()).split())
    assert (
        f"up to {lp:.2f}x the planned on {agg['routed']} aggregated fleets, {dp:.2f}x on "
        f"{dis['routed']} disaggregated prefill pools"
    ) in note
    assert f"the {agg['routed']} fleets ran {np.median(lr):.1f}x the" in note
    assert f"up to {max(lr):.1f}x" in note


def test_the_how_to_quotes_the_disaggregated_launches():
    """The planning how-to's disaggregated figures are experiments/results/
    disaggregated_launches.json (python experiments/disaggregated_launches.py writes it)."""
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    r = json.loads((root / "experiments/results/disaggregated_launches.json").read_text())
    page = " ".join((root / "docs/how-to/plan-a-fleet.md").read_text().split())
    rows = [x for x in r["rows"] if x["feasible"]]
    assert len(rows) == r["feasible"] and r["scenarios"] == 30
    assert (
        f"**{r['missed']} of the {r['feasible']} feasible plans miss a target** "
        f"({r['missed_ttft']} the TTFT, {r['missed_tpot']} the TPOT), {r['touched']} more touch"
    ) in page
    ttft = np.array([x["ttft"]["pooled"] / x["predicted_ttft"] for x in rows])
    tpot = np.array([x["tpot"]["pooled"] / x["predicted_tpot"] for x in rows])
    assert f"TTFT is {np.median(ttft):.2f}x the planned at the median" in page
    assert f"more than 10 % on {(ttft > 1.1).sum()} plans and by up to {ttft.max():.2f}x" in page
    assert f"TPOT is {np.median(tpot):.2f}x the planned at the median" in page
    above = int((tpot > 1.1).sum())
    assert ("(none above 1.1x)" if above == 0 else f"({above} above 1.1x") in page
    counted = [x for x in rows if "ttft_least_prefill" in x]
    lp = np.array([x["ttft_least_prefill"]["pooled"] / x["predicted_ttft"] for x in counted])
    assert (
        len(counted) == r["routed"]
        and (
            f"the {r['routed']} plans with several prefill replicas read {np.median(lp):.2f}x the "
            f"planned p99 TTFT at the median (up to {lp.max():.2f}x, above 1.1x on "
            f"{(lp > 1.1).sum()}"
        )
        in page
    )
    assert f"and {r['missed_least_prefill']} missed their TTFT target" in page
    unserved = sorted(x["unserved"] for x in rows if x["unserved"])
    assert len(set(unserved)) == 1 and f"runs left {unserved[0]} requests each unserved" in page
