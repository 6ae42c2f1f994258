"""One deployment under a load (dcost.planning.server): the scheduler's bookkeeping against
closed forms, the loads' arrivals, and bad input named by field."""

import numpy as np
import pytest

import dcost
from dcost.planning.server import Bursty, Load, Server, simulate_server


@pytest.fixture(scope="module")
def vllm_8b():
    return Server("h100-sxm", "llama-3.1-8b", engine=dcost.engine("vllm", hardware="h100-sxm"))


def test_one_client_runs_a_prefill_then_decode_steps(vllm_8b):
    """One client, fixed lengths: TTFT is one prefill step, every later token a decode step of
    batch 1, e2e their sum; the decode step is dcost.decode's at batch 1 with the engine."""
    load = Load(prompt=512, output=64, clients=1, requests=5, stagger=False)
    run = simulate_server(vllm_8b, load)
    eng = vllm_8b.resolved_engine()
    h, m = dcost.presets.pair("h100-sxm", "llama-3.1-8b")
    w = dcost.Workload(512 + 32, prompt=512, output=64)
    step = float(dcost.decode(dcost.Design(batch=1, chips=1), h, m, w, engine=eng).tpot)
    assert run.tpot == pytest.approx(step, rel=2e-3)
    assert run.e2e == pytest.approx(run.ttft + 63 * run.tpot, rel=1e-9)
    assert np.all(run.ttft > step)  # a 512-token prefill takes longer than one decode token
    s = run.summary()
    assert s["preemptions"] == 0 and s["throughput"] == pytest.approx(
        5 * 64 / (run.e2e.sum()), rel=1e-6
    )


def test_closed_loop_keeps_its_concurrency(vllm_8b):
    """Little's law: clients = throughput (requests/s) x mean e2e, in steady state."""
    run = simulate_server(vllm_8b, Load(prompt=256, output=128, clients=16, requests=400))
    req_per_s = run.summary()["throughput"] / 128
    assert req_per_s * np.nanmean(run.e2e) == pytest.approx(16, rel=0.1)


def test_a_small_kv_cache_preempts_and_still_finishes():
    eng = dcost.engine("vllm", hardware="h100-sxm", gpu_memory_utilization=0.215)
    srv = Server("h100-sxm", "llama-3.1-8b", engine=eng)
    run = simulate_server(srv, Load(prompt=2000, output=400, clients=64, requests=128))
    s = run.summary()
    assert s["preemptions"] > 0 and np.all(np.isfinite(run.e2e))
    assert s["kv_peak"] <= 1.0


def test_open_loop_stages_and_arrivals():
    rng = np.random.default_rng(0)
    even = Load(prompt=100, output=10, stages=[(10.0, 5.0), (20.0, 5.0)], arrival="constant")
    t = even.arrivals(rng)
    assert len(t) == pytest.approx(150, abs=2) and np.allclose(np.diff(t[:40]), 0.1)
    bursty = Load(prompt=100, output=10, stages=[(50.0, 200.0)], arrival=Bursty(cv=3.0))
    gaps = np.diff(bursty.arrivals(rng))
    assert gaps.std() / gaps.mean() == pytest.approx(3.0, rel=0.15)
    assert gaps.mean() == pytest.approx(1 / 50, rel=0.1)


def test_a_shared_prefix_is_hit_after_the_first(vllm_8b):
    load = Load(prompt=1000, output=20, clients=4, requests=40, shared_prefix=800)
    s = simulate_server(vllm_8b, load).summary()
    assert s["prefix_hit_rate"] == pytest.approx(39 / 40)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"prompt": 0, "output": 10, "clients": 1}, "Load.prompt = 0"),
        ({"prompt": 10, "output": 10}, "give stages"),
        ({"prompt": 10, "output": 10, "clients": 0}, "Load.clients = 0"),
        ({"prompt": 10, "output": 10, "stages": [(0.0, 1.0)]}, "stages\\[0\\] rate"),
        ({"prompt": 10, "output": 10, "stages": [(1.0, 1.0)], "arrival": "x"}, "Load.arrival"),
        ({"prompt": 10, "output": 10, "clients": 2, "shared_prefix": 10}, "shared_prefix"),
        ({"prompt": 10, "output": 10, "clients": 2, "stagger": "yes"}, "Load.stagger"),
    ],
)
def test_bad_loads_are_named(kwargs, message):
    with pytest.raises(dcost.SpecError, match=message):
        Load(**kwargs)


def test_bad_servers_and_calls_are_named():
    with pytest.raises(dcost.SpecError, match="Server.tensor_parallel = 0"):
        Server("h100-sxm", "llama-3.1-8b", tensor_parallel=0)
    with pytest.raises(dcost.PresetError):
        Server("h100-sxm", "llama-9")
    with pytest.raises(dcost.SpecError, match="load must be a dcost.Load"):
        dcost.simulate(Server("h100-sxm", "llama-3.1-8b"), dcost.traffic("chat", rate=1.0))


def test_cli_simulate_is_the_api_s(capsys):
    import json

    from dcost.cli import main

    args = ["simulate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--engine", "vllm"]
    load = ["--clients", "8", "--requests", "24", "--prompt", "512", "--output", "32", "--json"]
    assert main([*args, *load]) == 0
    got = json.loads(capsys.readouterr().out)
    srv = Server("h100-sxm", "llama-3.1-8b", engine="vllm")
    want = simulate_server(srv, Load(prompt=512, output=32, clients=8, requests=24)).summary()
    assert got["ttft"]["mean"] == pytest.approx(want["ttft"]["mean"])
    assert got["throughput"] == pytest.approx(want["throughput"])
    assert main([*args, "--prompt", "5", "--output", "5"]) == 2
    assert "--clients N" in capsys.readouterr().err
