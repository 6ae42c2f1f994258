"""``dcost optimize`` and ``dcost grid`` through ``dcost.cli.main``, in process."""

from __future__ import annotations

import io
import json
import pathlib

import pytest

import dcost
from dcost.cli.app import main
from dcost.cli.search import ProgressBar

BASE = [
    "--hardware",
    "h100-sxm",
    "--model",
    "llama-3-8b",
    "--context",
    "2048",
    "--max-batch",
    "1024",
    "--max-chips",
    "8",
    "--max-stages",
    "2",
]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture(scope="module")
def optimized():
    import contextlib

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = main(["optimize", *BASE, "--tpot-slo", "10ms", "--json", "--sensitivity", "kkt"])
    return code, json.loads(buf.getvalue())


@pytest.mark.slow
def test_optimize_json_is_si_and_checked(optimized):
    code, out = optimized
    assert code == 0 and out["feasible"] and out["method"] == "optimize"
    d = out["design"]
    assert all(float(v).is_integer() for v in d.values())
    assert out["limits"]["tpot"] == 0.01 and out["report"]["tpot"] <= 0.01
    r = dcost.decode(
        dcost.Design(d["batch"], d["chips"], d["stages"]),
        dcost.hardware("h100-sxm"),
        dcost.model("llama-3-8b"),
        dcost.Workload(2048),
    )
    assert float(r.cost_per_token) == pytest.approx(out["cost"], rel=1e-5)
    assert out["binding"] == ["tpot"] and out["at_bound"] == []  # 9 chips: TP over the NIC
    assert out["multipliers"]["tpot"] > 0
    sens = out["sensitivity"]
    assert sens["hardware"]["price_per_hour"] == pytest.approx(1.0, abs=1e-9)
    assert sens["limits"]["tpot"] < 0 and sens["kkt"] and sens["method"] == "kkt"
    # the shadow price is the multiplier times the cost: -d cost / d log(tpot_slo)
    assert out["multipliers"]["tpot"] == pytest.approx(
        -sens["limits"]["tpot"] * out["cost"], rel=0.05
    )


def test_at_bound_when_the_batch_limit_binds(capsys):
    code, out, _ = run(capsys, "optimize", *BASE, "--tpot-slo", "20ms", "--no-sensitivity")
    assert code == 0 and "binding:         batch <= 1024" in out


@pytest.mark.slow
def test_grid_agrees_with_optimize(capsys, optimized):
    _, opt = optimized
    code, out, err = run(capsys, "grid", *BASE, "--tpot-slo", "0.01", "--json")
    grid = json.loads(out)
    assert code == 0 and grid["feasible"] and err == ""
    assert grid["cost"] <= opt["cost"] <= grid["cost"] * 1.005


def test_optimize_text(capsys):
    code, out, _ = run(capsys, "optimize", *BASE, "--tpot-slo", "10ms")
    assert code == 0
    assert "per million output tokens" in out and "binding:         tpot\n" in out
    assert "what would make tokens cheaper" in out and "envelope theorem" in out
    rows = out.split("cost if x rises 10 %")[1].strip().splitlines()[1:]
    mags = [abs(float(line.split()[1])) for line in rows]
    assert mags == sorted(mags, reverse=True) and len(rows) == 8
    by_name = {line.split()[0]: float(line.split()[1]) for line in rows}
    assert by_name["hardware.price_per_hour"] == pytest.approx(1.0, abs=1e-4)


@pytest.mark.slow
def test_envelope_json_agrees_with_the_kkt_sensitivities(capsys, optimized):
    """The default (envelope theorem at the search's point) against dcost.sensitivity (polished
    to a KKT point), on the problem of the fixture: every elasticity within 0.02."""
    code, out, _ = run(capsys, "optimize", *BASE, "--tpot-slo", "10ms", "--json")
    envelope, kkt = json.loads(out)["sensitivity"], optimized[1]["sensitivity"]
    assert code == 0 and envelope["method"] == "envelope" and "kkt" not in envelope
    for part in ("hardware", "model", "workload", "limits"):
        for name, value in kkt[part].items():
            assert envelope[part][name] == pytest.approx(value, abs=0.02), (part, name)


def test_durations_parse_alike():
    from dcost.cli.app import build_parser
    from dcost.cli.search import problem_from_args

    parser = build_parser()
    slos = [
        float(problem_from_args(parser.parse_args(["optimize", *BASE, "--tpot-slo", t])).tpot_slo)
        for t in ("50ms", "0.05s", "0.05")
    ]
    assert slos[0] == slos[1] == slos[2] == pytest.approx(0.05)


def test_infeasible_exits_1_with_the_reason(capsys):
    code, out, _ = run(capsys, "optimize", *BASE, "--tpot-slo", "0.1ms", "--no-sensitivity")
    assert code == 1 and "infeasible: tpot:" in out


@pytest.mark.parametrize(
    "argv, needle",
    [
        (["--max-batch", "0"], "--max-batch: must be a whole number >= 1"),
        (["--max-chips", "2.5"], "--max-chips: must be a whole number >= 1"),
        (["--memory-reserve", "1.5"], "memory_reserve"),
    ],
)
def test_bad_values_one_line_exit_2(capsys, argv, needle):
    code, _, err = run(capsys, "optimize", *BASE, *argv)
    assert code == 2 and needle in err and err.count("\n") == 1


def test_bad_duration_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["optimize", *BASE, "--tpot-slo", "5xs"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "not a duration" in err and err.count("\n") == 1


@pytest.mark.parametrize(
    "objective, needle",
    [
        ("lifetime_cost", "lifetime_cost cannot run from the command line"),
        ("cheapest", "unknown objective 'cheapest'; choose from cost_per_token"),
    ],
)
def test_objectives_the_cli_cannot_run_are_refused_clearly(capsys, objective, needle):
    with pytest.raises(SystemExit) as exit_:
        main(["optimize", *BASE, "--objective", objective])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and needle in err and err.count("\n") == 1


def test_help_offers_only_what_runs(capsys):
    with pytest.raises(SystemExit):
        main(["optimize", "--help"])
    out = capsys.readouterr().out
    assert "{cost_per_token,cost_per_input_token,tco}" in out


def test_prefill_objective_prints_ttft(capsys):
    code, out, _ = run(
        capsys, "grid", *BASE, "--objective", "cost_per_input_token", "--ttft-slo", "2s"
    )
    assert code == 0 and "ttft:" in out and "per million input tokens" in out
    assert "minimize cost_per_input_token subject to ttft <= 2000 ms" in out


def test_unknown_preset(capsys):
    code, _, err = run(
        capsys, "grid", "--hardware", "h100", "--model", "llama-3-8b", "--context", "10"
    )
    assert code == 2 and "unknown hardware preset 'h100'" in err


@pytest.mark.slow
def test_progress_bar_draws_after_the_delay():
    stream = io.StringIO()
    p = dcost.Problem(
        dcost.hardware("h100-sxm"),
        dcost.model("llama-3-8b"),
        dcost.Workload(2048),
        free={"batch": (1, 999), "chips": (1, 8)},
    )
    dcost.grid_search(p, chunk_size=1000, progress=ProgressBar(stream=stream, delay=0.0))
    text = stream.getvalue()
    assert text.endswith("100.0% of 7,992 designs\n") and text.count("\r") == 8
    quiet = io.StringIO()
    dcost.grid_search(p, progress=ProgressBar(stream=quiet, delay=60.0))
    assert quiet.getvalue() == ""


# ---------------------------------------------------------------- serving model v2's layout

DSV3 = ["--hardware", "h200", "--model", "deepseek-v3", "--context", "4096"]


@pytest.mark.slow
def test_grid_chooses_the_layout_and_eval_agrees(capsys):
    """``lo:hi`` frees a layout field; the design line names it; ``dcost eval`` of the printed
    design gives the search's cost."""
    layout = ["--attention-dp", "1:8", "--draft-tokens", "0:3", "--acceptance", "0.85"]
    bounds = ["--max-batch", "512", "--max-chips", "8", "--max-stages", "1", "--calibrated"]
    code, out, _ = run(capsys, "grid", *DSV3, *bounds, *layout, "--json")
    assert code == 0
    grid = json.loads(out)
    d = grid["design"]
    assert d["chips"] % d["attention_dp"] == 0 and 0 <= d["draft_tokens"] <= 3
    code, text, _ = run(capsys, "grid", *DSV3, *bounds, *layout)
    assert code == 0
    assert f"{d['attention_dp']:.0f} data-parallel group" in text
    assert f"{d['draft_tokens']:g} draft tokens" in text
    fixed = [f"--{k.replace('_', '-')}={v:g}" for k, v in d.items() if k not in ("stages",)]
    code, out, _ = run(
        capsys, "eval", *DSV3, "--calibrated", "--acceptance", "0.85", *fixed, "--json"
    )
    assert code == 0
    assert json.loads(out)["cost_per_token"] == pytest.approx(grid["cost"], rel=1e-5)


def test_eval_takes_layout_fields(capsys):
    argv = ["--batch", "64", "--chips", "8", "--attention-dp", "4", "--draft-tokens", "2"]
    code, out, _ = run(capsys, "eval", *DSV3, *argv, "--acceptance", "0.8", "--json")
    assert code == 0
    got = json.loads(out)
    r = dcost.decode(
        dcost.Design(64, chips=8, attention_dp=4, draft_tokens=2),
        dcost.presets.serving_hardware("h200", "deepseek-v3"),
        dcost.model("deepseek-v3"),
        dcost.Workload(4096, acceptance=0.8),
    )
    assert got["cost_per_token"] == pytest.approx(float(r.cost_per_token), rel=1e-6)
    assert got["design"]["attention_dp"] == 4 and got["tokens_per_step"] == pytest.approx(2.44)


def test_eval_says_when_no_engine_launches_the_design(capsys):
    """3 chips of tensor-parallel attention do not split Llama 3 70B's 64 heads: the physics is
    printed, and a line (``launchable`` in --json) says no engine runs it; 4 chips do."""
    base = ["--hardware", "h100-sxm", "--model", "llama-3-70b", "--batch", "8"]
    base += ["--context", "2048"]
    code, out, _ = run(capsys, "eval", *base, "--chips", "3")
    assert code == 0 and "launch:" in out and "64 query heads and 8 KV heads" in out
    code, out, _ = run(capsys, "eval", *base, "--chips", "4")
    assert code == 0 and "launch:" not in out
    code, out, _ = run(capsys, "eval", *base, "--chips", "3", "--json")
    assert code == 0 and json.loads(out)["launchable"] is False
    # DeepSeek-V3 on 6 chips in 3 attention groups: 2-way tensor-parallel attention splits
    dp = ["--batch", "8", "--chips", "6", "--attention-dp", "3", "--json"]
    code, out, _ = run(capsys, "eval", *DSV3, *dp)
    assert code == 0 and json.loads(out)["launchable"] is True


def test_eval_and_the_search_take_the_expert_parallel_groups(capsys):
    """``--expert-parallel`` fixes ``Design.expert_parallel``: ``dcost eval`` evaluates it (the
    design line names it), and a search keeps it and at least that many chips per stage."""
    argv = ["--batch", "64", "--chips", "8", "--attention-dp", "1", "--expert-parallel", "1"]
    code, out, _ = run(capsys, "eval", *DSV3, *argv, "--calibrated", "--json")
    assert code == 0
    h = dcost.hardware("h200", precision="fp8", calibrated=True)
    d = dcost.Design(64, chips=8, attention_dp=1, expert_parallel=1)
    r = dcost.decode(d, h, dcost.model("deepseek-v3"), dcost.Workload(4096))
    assert json.loads(out)["cost_per_token"] == pytest.approx(float(r.cost_per_token), rel=1e-6)
    assert json.loads(out)["design"]["expert_parallel"] == 1
    code, text, _ = run(capsys, "eval", *DSV3, *argv)
    assert code == 0 and "1 expert-parallel group, each expert split over 8 chips" in text
    from dcost.cli.app import build_parser
    from dcost.cli.search import problem_from_args

    args = build_parser().parse_args(["grid", *DSV3, "--max-chips", "16", "--expert-parallel", "4"])
    problem = problem_from_args(args)
    assert float(problem.fixed.expert_parallel) == 4.0
    assert dict((n, (lo, hi)) for n, lo, hi in problem.free)["chips"] == (4, 16)


@pytest.mark.parametrize(
    "command, argv, needle",
    [
        ("optimize", ["--model", "llama-3-70b", "--draft-tokens", "0:4"], "no draft"),
        ("optimize", ["--draft-tokens", "0:4"], "Workload.acceptance is 0"),
        ("grid", ["--attention-dp", "1:99", "--max-chips", "8"], "at most the chips per stage"),
        ("grid", ["--attention-dp", "16", "--max-chips", "8"], "more attention groups"),
        ("grid", ["--expert-imbalance", "lots"], "--expert-imbalance: not a number"),
        ("eval", ["--batch", "8", "--chips", "8", "--attention-dp", "3"], "dividing Design"),
        ("eval", ["--batch", "8", "--chips", "8", "--expert-parallel", "3"], "dividing Design"),
        ("grid", ["--expert-parallel", "16", "--max-chips", "8"], "from 1 to --max-chips 8"),
    ],
)
def test_bad_layout_one_line_exit_2(capsys, command, argv, needle):
    base = ["--hardware", "h200", "--context", "4096"]
    base += [] if "--model" in argv else ["--model", "deepseek-v3"]
    code, _, err = run(capsys, command, *base, *argv)
    assert code == 2 and needle in err and err.count("\n") == 1


def test_layout_bounds_are_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["grid", *DSV3, "--draft-tokens", "3:1"])
    err = capsys.readouterr().err
    assert exit_.value.code == 2 and "0 <= lo <= hi" in err


_NO_XLA = """
import types
import jax, numpy as np
traced = []
jax.monitoring.register_event_duration_secs_listener(
    lambda name, *a, **k: traced.append(name) if name.endswith("jaxpr_trace_duration") else None
)
import dcost
from dcost.search.problem import Problem
from dcost.search.solution import Solution

h, m = dcost.presets.pair("gb200-nvl72", "deepseek-v3")
problem = Problem(h, m, dcost.Workload(8192), tpot_slo=0.05)
limits = jax.tree.map(np.asarray, problem).limit_values()
fake = types.SimpleNamespace(
    lambdas=np.array([0.5, 0.25], np.float32),
    stats=types.SimpleNamespace(continuous_cost=np.array(2e-7, np.float32)),
    constraints=("tpot", "memory"),
)
prices = Solution.multipliers.fget(fake)
assert abs(float(prices["tpot"]) - 1e-7) < 1e-12, prices
assert abs(float(limits["tpot"]) - 0.05) < 1e-9, limits
print(len(traced), sorted(set(traced)))
"""


def test_presets_and_the_printed_report_run_no_xla_program():
    """What ``dcost optimize`` does around its two stored programs (building the presets and the
    problem, the report's arithmetic) transfers arrays but traces nothing: in a fresh process
    each eager operation would compile, or load from the cache, a program of its own (7 of them
    cost 0.17 s of a 1.6 s warm run)."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _NO_XLA], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[0] == "0", out.stdout


@pytest.mark.parametrize(
    "argv, code",
    [
        (["presets"], 0),
        (["grid", "--hardware", "h100", "--model", "llama-3-8b", "--context", "10"], 2),
    ],
)
def test_the_console_script_ends_with_mains_code_and_all_its_output(capsys, argv, code):
    """``python -m dcost`` ends the process with ``os._exit`` after ``main``: the exit code and
    every line printed are those of ``main`` in process (stdout and stderr flushed first)."""
    import os
    import subprocess
    import sys

    want_code, want_out, want_err = run(capsys, *argv)
    env = dict(os.environ, DCOST_CACHE="0")
    env.pop("PYTHONUNBUFFERED", None)  # stdout to a pipe is then block-buffered: it must be flushed
    out = subprocess.run(
        [sys.executable, "-m", "dcost", *argv], capture_output=True, text=True, timeout=300, env=env
    )
    assert want_code == code
    assert (out.returncode, out.stdout, out.stderr) == (want_code, want_out, want_err)
    assert (want_out if code == 0 else want_err).strip()  # something was said


def test_calibrated_eval_says_how_far_off_its_profile_is(capsys):
    """The held-out error of the chip family's records and of a new source, as ``dcost
    validate --write`` shipped them (read here from the TOML file itself)."""
    import tomllib

    from dcost import presets

    shipped = tomllib.loads(
        (pathlib.Path(presets.__file__).with_name("calibration.toml")).read_text()
    )["heldout"]
    argv = ["eval", "--hardware", "h100-sxm", "--model", "llama-3-8b", "--batch", "8"]
    code, text, _ = run(capsys, *argv, "--calibrated")
    hopper, new = shipped["hopper"], shipped["overall"]["source_weighted"]
    assert code == 0 and "hopper profile" in text
    assert (
        f"its {hopper['records']} records are off by {100 * hopper['median']:.0f} % median" in text
    )
    assert f"a new source by {100 * new['median']:.0f} %" in text
    code, out, _ = run(capsys, *argv, "--calibrated", "--json")
    err = json.loads(out)["calibration_error"]
    assert err["family_name"] == "hopper" and err["family"]["p90"] == hopper["p90"]
    code, out, _ = run(capsys, *argv, "--json")  # pure physics: a bound, no error band
    assert "calibration_error" not in json.loads(out)
    with pytest.raises(presets.PresetError, match="known: ampere"):
        presets.calibration_error("vacuum-tubes")


def test_the_expert_load_defaults_to_the_chips_validated_one(capsys):
    """Without ``--expert-imbalance`` a mixture of experts is timed at multinomial routing's
    expected maximum on a profiled chip (``--calibrated``, ``--engine``: the load those
    profiles were fitted at) and balanced on pure physics or for a dense model; the flag wins.
    The same design on the family profile is slower with the default than with balanced
    experts."""
    from dcost.cli.app import build_parser
    from dcost.cli.common import hardware_and_model
    from dcost.cli.search import workload_from_args
    from dcost.specs import MULTINOMIAL

    def imbalance(*argv):
        args = build_parser().parse_args(["eval", "--batch", "64", "--chips", "8", *argv])
        h, m = hardware_and_model(args)
        return workload_from_args(args, h, m).expert_imbalance

    moe = ("--hardware", "h200", "--model", "deepseek-v3", "--context", "4096")
    assert float(imbalance(*moe, "--calibrated")) == MULTINOMIAL
    assert float(imbalance(*moe, "--engine", "sglang")) == MULTINOMIAL
    assert imbalance(*moe) is None  # pure physics: balanced, a bound
    assert float(imbalance(*moe, "--calibrated", "--expert-imbalance", "1")) == 1.0
    dense = ("--hardware", "h200", "--model", "llama-3-70b", "--context", "4096", "--calibrated")
    assert imbalance(*dense) is None

    def tpot(*extra):
        argv = ("eval", *moe, "--batch", "64", "--chips", "8", "--calibrated", "--json", *extra)
        code, out, _ = run(capsys, *argv)
        assert code == 0
        return json.loads(out)["tpot"]

    assert tpot() > 1.01 * tpot("--expert-imbalance", "1")
