"""``dcost.plan_sweep`` and ``dcost plan --scenarios``: a sweep's answers are ``dcost.plan``'s,
bit for bit, on one device and on 2 processes of 2 host devices each; bad scenario files are refused
naming the file, the line and the column.

The reference is ``dcost.plan`` on each block of a group (``tests/sweep_child.py``'s ``tiny``
sweep with ``block=16``: a group of 17 scenarios is planned as two calls of 16 and 1, a group of
3 as one call). Every field of every plan is compared by its exact ``repr``.
"""

from __future__ import annotations

import csv
import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np
import pytest

import dcost
from dcost.cli.app import main
from dcost.planning.sweep import ScenarioError, assign

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))
import sweep_child  # noqa: E402

CHILD = ROOT / "tests" / "sweep_child.py"


@pytest.fixture(scope="module")
def reference_plans():
    """``dcost.plan`` of the tiny sweep, block by block (blocks of 16), in the scenarios'
    order."""
    rows = sweep_child.tiny()
    groups: dict = {}
    for i, s in enumerate(rows):
        groups.setdefault((s.tpot_slo, s.mode), []).append(i)
    out: list = [None] * len(rows)
    for (tpot, mode), members in groups.items():
        for start in range(0, len(members), 16):
            part = members[start : start + 16]
            traffic = dcost.traffic("chat", rate=np.asarray([rows[i].rate for i in part]))
            batch = dcost.plan("h100-sxm", "llama-3.1-8b", traffic, tpot_slo=tpot, mode=mode)
            for i, p in zip(part, batch, strict=True):
                out[i] = p
    return out


@pytest.fixture(scope="module")
def reference(reference_plans):
    return [sweep_child.summary(p) for p in reference_plans]


def test_sweep_is_plan_block_by_block(reference):
    rows = sweep_child.tiny()
    rows[5] = rows[5]._asdict()  # a dict of the fields is a scenario too
    sweep = dcost.plan_sweep(rows, block=16)
    assert [sweep_child.summary(p) for p in sweep] == reference
    assert len(sweep) == 20 and sweep.chips.shape == (20,)


def test_assign_round_robin():
    places = assign(7, 2, 3)
    assert places == [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2), (0, 0)]
    # every block placed once; each process's blocks spread over its devices
    assert sorted(places.count(p) for p in set(places)) == [1, 1, 1, 1, 1, 2]


@pytest.mark.parametrize(
    "scenario, needle",
    [
        (dict(model="llama-3.1-8b", hardware="h100-sxm", traffic="chatty"), "traffic = 'chatty'"),
        (dict(model="llama-3.1-8b", hardware="h100-sxm", rate=-1.0), "rate"),
        (dict(model="llama-3.1-8b", hardware="h100-sxm", mode="both"), "mode = 'both'"),
        (dict(model="llama-3.1-8b", hardware="h100-sxm", tpot_slo=(0.05,)), "tpot_slo"),
        (dict(model="llama-3.1-8b", hardware="h100-sxm", colour="red"), "colour"),
        (dict(model="llama-9", hardware="h100-sxm"), "llama-9"),
    ],
)
def test_bad_scenarios_name_their_row(scenario, needle):
    good = dcost.Scenario("llama-3.1-8b", "h100-sxm", "chat", 1.0)
    with pytest.raises(ScenarioError, match="scenario 1") as err:
        dcost.plan_sweep([good, scenario])
    assert needle in str(err.value) and err.value.index == 1


@pytest.mark.parametrize("block", [0, 24, 8, 16.0, True])
def test_bad_block(block):
    with pytest.raises(dcost.SpecError, match="block"):
        dcost.plan_sweep([], block=block)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _child_env(devices: int) -> dict:
    env = dict(os.environ)
    devices_flag = f"--xla_force_host_platform_device_count={devices}"
    env["XLA_FLAGS"] = f"{env.get('XLA_FLAGS', '')} {devices_flag}".strip()
    env["PYTHONPATH"] = str(ROOT)
    return env


def _result(text: str) -> dict:
    return json.loads([line for line in text.splitlines() if line.startswith("{")][-1])


@pytest.mark.slow
def test_sweep_on_two_processes_of_two_host_devices(reference):
    """2 processes joined by ``jax.distributed``, each with 2 host devices: the 3 blocks go to
    process 0's devices 0 and 1 and to process 1's device 0 (``assign``), so one run covers
    several devices of a process and several processes; every process holds the whole sweep,
    in order, bit for bit ``dcost.plan``'s."""
    assert assign(3, 2, 2) == [(0, 0), (1, 0), (0, 1)]
    port = _port()
    procs = [
        subprocess.Popen(
            [sys.executable, str(CHILD), "tiny", "--block", "16", "--port", str(port)]
            + ["--processes", "2", "--process-id", str(i)],
            env=_child_env(2),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = []
    try:
        for p in procs:
            stdout, stderr = p.communicate(timeout=300)
            assert p.returncode == 0, stderr[-3000:]
            outs.append(_result(stdout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    assert [o["process"] for o in outs] == [0, 1]
    assert all(o["processes"] == 2 and o["devices"] == 2 for o in outs)
    for o in outs:  # every process holds the whole sweep, in order
        assert o["plans"] == [list(r) for r in reference]


def test_cli_scenarios_write_the_plans(tmp_path, capsys, reference_plans):
    rows = sweep_child.tiny()
    picked = (0, 7, 19)  # the last has the other TPOT target and mode: two groups
    lines = ["model,chip,traffic,rate,tpot,mode"]
    for i in picked:
        tpot = f"{rows[i].tpot_slo[0] * 1e3:g}ms@p90"
        lines.append(f"llama-3.1-8b,h100-sxm,chat,{rows[i].rate!r},{tpot},{rows[i].mode}")
    lines[-1] = lines[-1][: -len(rows[19].mode)]  # an empty cell takes --mode
    src, out = tmp_path / "roadmap.csv", tmp_path / "plans.csv"
    src.write_text("\n".join(lines) + "\n")
    argv = ["plan", "--scenarios", str(src), "--out", str(out), "--mode", rows[19].mode]
    assert main(argv) == 0
    assert "3 plans (3 feasible)" in capsys.readouterr().out
    table = list(csv.DictReader(out.read_text().splitlines()))
    assert [r["line"] for r in table] == ["2", "3", "4"]
    for r, i in zip(table, picked, strict=True):
        p = reference_plans[i]
        replicas = {x.role: str(x.replicas) for x in p.pools}
        assert (r["plan_mode"], r["feasible"], int(r["chips"])) == (p.mode, "true", p.chips)
        for role in ("aggregated", "prefill", "decode"):
            assert r[f"{role}_replicas"] == replicas.get(role, "")
        assert float(r["cost_per_hour"]) == p.cost_per_hour
        assert float(r["cost_per_million_input"]) == p.cost_per_million_input
        assert float(r["cost_per_million_output"]) == p.cost_per_million_output
        assert r["binding"] == p.binding


@pytest.mark.parametrize(
    "text, needle",
    [
        ("model,chip,traffic,colour\nllama-3.1-8b,h100-sxm,chat,red\n",
         "line 1, column 4 (colour)"),
        ("model,chip,traffic,rate\nllama-3.1-8b,h100-sxm,chat,1\nllama-3.1-8b,h100-sxm,chat,-3\n",
         "line 3, column 4 (rate)"),
        ("model,chip,traffic,rate\nllama-9,h100-sxm,chat,1\n", "line 2, column 1 (model)"),
        ("chip,model,traffic,rate\nh100,llama-3.1-8b,chat,1\n", "line 2, column 1 (chip)"),
        ("model,chip,traffic,rate\n\nllama-3.1-8b,h100-sxm,chat\n", "line 3: 3 cells"),
        ("model,chip,traffic,rate,ttft\nllama-3.1-8b,h100-sxm,chat,1,2s@p100\n",
         "line 2, column 5 (ttft)"),
        ("model,chip,traffic,rate,mode\nllama-3.1-8b,h100-sxm,chat,1,both\n",
         "line 2, column 5 (mode)"),
        ("model,chip,traffic,rate\nllama-3.1-8b,h100-sxm,chat,\n", "line 2, column 4 (rate)"),
        ("model,chip,traffic,rate,prefix_hit\nllama-3.1-8b,h100-sxm,chat,1,1.5\n",
         "line 2, column 5 (prefix_hit)"),
        ("model,chip,rate,prompt\nllama-3.1-8b,h100-sxm,1,100\n", "line 1: no 'traffic' column"),
        ("chip,traffic,rate\nh100-sxm,chat,1\n", "line 1: no 'model' column"),
        ("model,chip,chip,traffic\nllama-3.1-8b,h100-sxm,h100-sxm,chat\n",
         "line 1, column 3 (chip): column 'chip' given twice"),
        ("model,chip,traffic,rate\n", "no scenario below the header"),
        ("\n\n", "empty scenario file"),
        (b"model,chip\n\xff\xfe\n", "cannot read"),
    ],
)  # fmt: skip
def test_cli_refuses_a_bad_scenario_file(tmp_path, capsys, text, needle):
    src = tmp_path / "bad.csv"
    if isinstance(text, bytes):
        src.write_bytes(text)
    else:
        src.write_text(text)
    assert main(["plan", "--scenarios", str(src)]) == 2
    err = capsys.readouterr().err
    assert str(src) in err and needle in err, err


def test_cli_scenarios_missing_file_and_unused_flags(tmp_path, capsys):
    missing = tmp_path / "none.csv"
    assert main(["plan", "--scenarios", str(missing)]) == 2
    assert f"{missing}: cannot read" in capsys.readouterr().err
    src = tmp_path / "ok.csv"
    src.write_text("model,chip,traffic,rate\nllama-3.1-8b,h100-sxm,chat,1\n")
    assert main(["plan", "--scenarios", str(src), "--hardware", "b200"]) == 2
    assert "--hardware: not used with --scenarios" in capsys.readouterr().err
    assert main(["plan", "--model", "llama-3.1-8b", "--rate", "1"]) == 2
    assert "--hardware required" in capsys.readouterr().err
    assert main(["plan", "--scenarios", str(src), "--profile", "mine.toml"]) == 2
    assert "--profile: not used with --scenarios" in capsys.readouterr().err
    one = ["plan", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--rate", "1"]
    assert main([*one, "--traffic", "chat", "--profile", "mine.toml"]) == 2
    assert "--profile mine.toml needs one --engine" in capsys.readouterr().err
