"""``dcost eval``'s energy lines and --power-cap, and ``dcost grid --objective tco``."""

from __future__ import annotations

import json

import pytest

import dcost
from dcost.cli.app import main

EVAL = ["eval", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--batch", "64"]


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_eval_json_carries_the_energy_of_the_step(capsys):
    code, out, _ = run(capsys, *EVAL, "--context", "1024", "--json")
    assert code == 0
    e = json.loads(out)["energy"]
    want = dcost.energy(
        dcost.Design(batch=64),
        dcost.hardware("h100-sxm"),
        dcost.model("llama-3.1-8b"),
        dcost.Workload(1024),
    )
    assert e["power_per_chip"] == pytest.approx(float(want.power_per_chip), rel=1e-6)
    assert e["energy_per_token"] == pytest.approx(float(want.energy_per_token), rel=1e-6)


def test_eval_text_prints_watts_and_joules(capsys):
    code, out, _ = run(capsys, *EVAL, "--context", "1024")
    assert code == 0
    assert "power per chip:" in out and " W " in out
    assert "J per output token" in out and "per MW" in out


def test_eval_power_cap_slows_a_prefill_and_bad_caps_are_named(capsys):
    base = ["eval", "--hardware", "b200", "--model", "llama-3.1-8b", "--batch", "8"]
    args = [*base, "--context", "2048", "--phase", "prefill", "--json"]
    _, free, _ = run(capsys, *args)
    _, capped, _ = run(capsys, *args, "--power-cap", "600")
    ratio = json.loads(capped)["ttft"] / json.loads(free)["ttft"]
    h, m = dcost.hardware("b200"), dcost.model("llama-3.1-8b")
    d, w = dcost.Design(batch=8), dcost.Workload(2048, prompt=2048)
    drawn = dcost.energy(d, h, m, w, step="prefill").power_per_chip
    clock = float(dcost.serving.power.clock_fraction(h, 600.0, drawn))
    assert clock < 1 and ratio == pytest.approx(1.0 / clock, rel=0.02)
    code, _, err = run(capsys, *args, "--power-cap", "1500")
    assert code != 0 and "max_power" in err


def test_grid_objective_tco_is_tco_per_token(capsys):
    argv = ["grid", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--context", "1024"]
    argv += ["--max-batch", "256", "--max-chips", "1", "--max-stages", "1"]
    code, out, _ = run(capsys, *argv, "--objective", "tco", "--pue", "1.2", "--json")
    assert code == 0
    got = json.loads(out)
    d = got["design"]
    own = dcost.ownership("h100-sxm", pue=1.2)
    want = dcost.tco_per_token(
        dcost.Design(batch=d["batch"]),
        dcost.hardware("h100-sxm"),
        dcost.model("llama-3.1-8b"),
        dcost.Workload(1024),
        own,
    )
    assert got["cost"] == pytest.approx(float(want), rel=1e-5)
    e = dcost.energy(
        dcost.Design(batch=d["batch"]),
        dcost.hardware("h100-sxm"),
        dcost.model("llama-3.1-8b"),
        dcost.Workload(1024),
    )
    assert got["energy"]["energy_per_token"] == pytest.approx(float(e.energy_per_token), rel=1e-6)
    code, _, err = run(
        capsys,
        "grid",
        "--hardware",
        "tpu-v4",
        "--model",
        "llama-3.1-8b",
        "--context",
        "1024",
        "--max-batch",
        "8",
        "--objective",
        "tco",
    )
    assert code != 0 and "ownership" in err
