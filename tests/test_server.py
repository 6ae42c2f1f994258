"""One deployment under a load (dcost.planning.server): the scheduler's bookkeeping against
closed forms, the loads' arrivals, and bad input named by field."""

import dataclasses

import numpy as np
import pytest

import dcost
from dcost.planning.server import Bursty, Load, Server, simulate_server


@pytest.fixture(scope="module")
def vllm_8b():
    return Server("h100-sxm", "llama-3.1-8b", engine=dcost.engine("vllm", hardware="h100-sxm"))


def test_one_client_runs_a_prefill_then_decode_steps(vllm_8b):
    """One client, fixed lengths: TTFT is one prefill step, every later token a decode step of
    batch 1, e2e their sum; the decode step is dcost.decode's at batch 1 with the engine, for a
    step that admits no sequence (no output length: in an aggregated engine the prompt's own
    step pays for the admission)."""
    load = Load(prompt=512, output=64, clients=1, requests=5, stagger=False)
    run = simulate_server(vllm_8b, load)
    eng = vllm_8b.resolved_engine()
    h, m = dcost.presets.pair("h100-sxm", "llama-3.1-8b")
    w = dcost.Workload(512 + 32, prompt=512)
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


def test_a_stage_past_capacity_is_named(vllm_8b, capsys):
    """8,000-token prompts at 20 requests/s ask one H100 for 160k prompt tokens/s, about twice
    what it computes: the queue grows through that stage and its latencies are not a steady
    state, which the summary and the command line say. A light stage after it drains the queue
    (not named); a light load alone and a closed loop never are."""
    load = Load(prompt=8000, output=64, stages=[(20.0, 20.0), (0.5, 40.0)], arrival="constant")
    run = simulate_server(vllm_8b, load)
    assert run.summary()["queue_grew"] == [1]
    first = run.arrival <= 20.0
    assert np.nanmean(run.ttft[first][-20:]) > 3 * np.nanmean(run.ttft[first][20:40])
    light = Load(prompt=1024, output=64, stages=[(2.0, 30.0)], arrival="constant")
    assert simulate_server(vllm_8b, light).summary()["queue_grew"] == []
    clients = simulate_server(vllm_8b, Load(prompt=8000, output=64, clients=64, requests=256))
    assert clients.summary()["queue_grew"] == [] and clients.windows == ()
    from dcost.cli import main

    args = ["simulate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--engine", "vllm"]
    args += ["--prompt", "8000", "--output", "64", "--arrival", "constant"]
    assert main([*args, "--rate", "20", "--seconds", "20", "--rate", "0.5", "--seconds", "40"]) == 0
    assert "past capacity: the queue grew through stage 1 " in capsys.readouterr().out
    assert main([*args, "--rate", "2", "--seconds", "30"]) == 0
    assert "past capacity" not in capsys.readouterr().out


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


def test_degrees_the_model_cannot_take_are_refused():
    """Llama 3.1 8B has 32 attention heads and 32 layers, Mixtral 8 experts (their config.json):
    one more rank than that is refused naming the field, as is a deployment of over a million
    chips (it was accepted, and the simulation would have held 1e12 replicas' state), and a
    tensor-parallel degree the heads do not split over (3 of Llama's 32 query heads; 5 divides
    Qwen3-14B's 40 but neither divides nor is a multiple of its 8 KV heads), which an engine
    refuses at launch."""
    Server("h100-sxm", "llama-3.1-8b", tensor_parallel=32, pipeline_parallel=32)
    Server("h100-sxm", "mixtral-8x7b", expert_parallel=8)
    Server("h100-sxm", "llama-3.1-8b", expert_parallel=1)
    for model, kw, needle in (
        ("llama-3.1-8b", dict(tensor_parallel=33), "Server.tensor_parallel = 33 .*32 attention"),
        ("llama-3.1-8b", dict(tensor_parallel=3), "Server.tensor_parallel = 3 .*32 query heads"),
        ("qwen3-14b", dict(tensor_parallel=5), "tensor_parallel = 5 .*40 query heads and 8 KV"),
        ("llama-3.1-8b", dict(pipeline_parallel=33), "Server.pipeline_parallel = 33 .*32 layers"),
        ("mixtral-8x7b", dict(expert_parallel=9), "Server.expert_parallel = 9 .*8 routed"),
        ("llama-3.1-8b", dict(expert_parallel=2), "Server.expert_parallel = 2 .*dense"),
        ("llama-3.1-8b", dict(replicas=10**12), "Server.replicas = 1000000000000"),
        ("llama-3.1-8b", dict(tensor_parallel=8, replicas=125_001), "Server.replicas = 125001"),
        ("llama-3.1-8b", dict(attention_data_parallel=10**7), "Server.attention_data_parallel"),
    ):
        with pytest.raises(dcost.SpecError, match=needle):
            Server("h100-sxm", model, **kw)
    Server("h100-sxm", "llama-3.1-8b", tensor_parallel=8, replicas=125_000)


def test_prompts_and_answers_beyond_ten_million_tokens_are_refused():
    """A prompt of 1e30 tokens reached the step table, whose float32 arithmetic overflowed, and
    was blamed on "the serving model"; lengths above the longest 2026 context window (10 million
    tokens, Llama 4 Scout) are refused where they enter, naming the field."""
    assert dcost.Load(prompt=10_000_000, output=10_000_000, clients=1, requests=1).prompt == 1e7
    for field in ("prompt", "output"):
        kw = dict(prompt=256, output=8, clients=1, requests=1)
        kw[field] = 10_000_001
        with pytest.raises(dcost.SpecError, match=f"Load.{field} = 10000001 .*at most 10,000,000"):
            dcost.Load(**kw)


def test_loads_beyond_ten_million_requests_are_refused():
    """A stage of 1e30 s was accepted and the simulation drew arrivals for ever; a load is
    refused above 10 million requests (stages' expected count, or a closed loop's), naming
    the field."""
    assert dcost.Load(prompt=256, output=8, stages=((1000.0, 10_000.0),)).total() == 10**7
    for kw, needle in (
        (dict(stages=((1.0, 1e30),)), "Load.stages = .*1e\\+30 requests"),
        (dict(stages=((1000.0, 10_001.0),)), "Load.stages"),
        (dict(clients=8, requests=10**12), "Load.requests = 1000000000000"),
        (dict(clients=10**12), "Load.clients = 1000000000000"),
    ):
        with pytest.raises(dcost.SpecError, match=needle):
            dcost.Load(prompt=256, output=8, **kw)


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


def test_cli_simulate_says_how_far_to_trust_its_ttft(capsys):
    """Beside a closed loop on an engine, ``dcost simulate`` gives the band of measured over
    simulated TTFT of benchmark runs of the same engine, kind of model and load
    (``dcost.engines.ttft_band``) and what it makes of this run's mean; pure physics and an
    open loop get none (the runs behind the bands were closed loops on engines)."""
    import json

    from dcost import engines
    from dcost.cli import main

    args = ["simulate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b"]
    load = ["--prompt", "512", "--output", "32"]
    closed = ["--clients", "8", "--requests", "24"]
    assert main([*args, "--engine", "vllm", *closed, *load, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    band = engines.ttft_band("vllm", moe=False, clients=8)
    check = got["ttft_check"]
    assert (check["kind"], check["load"], check["runs"]) == ("dense", "light", band["runs"])
    mean = got["ttft"]["mean"]
    assert check["low"] == pytest.approx(band["q10"] * mean)
    assert check["high"] == pytest.approx(band["q90"] * mean)
    assert main([*args, "--engine", "vllm", *closed, *load]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert (
        "TTFT, how far to trust it: benchmark runs like this (vllm, dense, <= 16 clients;" in text
    )
    assert f"{1e3 * check['low']:.0f}-{1e3 * check['high']:.0f} ms here" in text
    # a mixture of experts at many clients takes its own band
    moe = engines.ttft_band("vllm", moe=True, clients=64)
    assert moe["kind"] == "moe" and moe["load"] == "heavy" and moe["q90"] != band["q90"]
    for bad in (0, -3, "8", True, float("nan")):
        with pytest.raises(dcost.engines.EngineError, match="clients"):
            engines.ttft_band("vllm", moe=False, clients=bad)
    with pytest.raises(dcost.engines.EngineError, match="unknown engine"):
        engines.ttft_band("tgi", moe=False, clients=8)
    for other in (closed, ["--engine", "vllm", "--rate", "2", "--seconds", "5"]):
        assert main([*args, *other, *load, "--json"]) == 0
        assert "ttft_check" not in json.loads(capsys.readouterr().out)


def test_cli_simulate_takes_the_engines_launch(capsys, tmp_path):
    """The launch flags set the engine's scheduler (the JSON says which ran) and give the API's
    answer on that engine; the order of a step changes the answer as the scheduler says: prompt
    steps alone keep a benchmark's clients in waves (every request of a closed loop of equal
    lengths finishes with its wave, so all end-to-end latencies are equal), prompt chunks
    beside the decodes spread them; launch flags without an engine are refused."""
    import json

    from dcost.cli import main

    args = ["simulate", "--hardware", "h100-sxm", "--model", "qwen3-32b", "--engine", "sglang"]
    args += ["--tensor-parallel", "2", "--clients", "16", "--requests", "64"]
    args += ["--prompt", "2048", "--output", "32", "--json"]
    launch = dict(max_num_seqs=24, max_num_batched_tokens=3000, gpu_memory_utilization=0.8,
                  block_size=32, prefix_caching=False, frontend_time=0.02,
                  recv_interval=4, batch_wait_iters=3, batch_wait_tokens=0.5,
                  prompt_graphs=True, async_scheduling=False)  # fmt: skip
    flags = ["--max-num-seqs", "24", "--max-num-batched-tokens", "3000", "--no-async-scheduling"]
    flags += ["--gpu-memory-utilization", "0.8", "--block-size", "32", "--no-prefix-caching"]
    flags += ["--frontend-time", "0.02", "--scheduler-recv-interval", "4"]
    flags += ["--batch-wait-iters", "3", "--batch-wait-tokens", "0.5", "--prompt-graphs"]
    runs = {}
    for order in ("--prefill-first", "--mixed-chunk"):
        assert main([*args, *flags, order]) == 0
        runs[order] = got = json.loads(capsys.readouterr().out)
        first = order == "--prefill-first"
        assert got["engine"]["name"] == "sglang"
        assert got["engine"]["scheduler"] == {**launch, "prefill_first": first, "frontend_cv": 0.0}
        eng = dcost.engine("sglang", hardware="h100-sxm", prefill_first=first, **launch)
        srv = Server("h100-sxm", "qwen3-32b", engine=eng, tensor_parallel=2)
        want = simulate_server(srv, Load(prompt=2048, output=32, clients=16, requests=64))
        assert got["ttft"]["mean"] == pytest.approx(want.summary()["ttft"]["mean"])
    waves, spread = runs["--prefill-first"]["e2e"], runs["--mixed-chunk"]["e2e"]
    assert waves["p99"] == pytest.approx(waves["p50"], rel=1e-9)
    assert spread["p99"] > 1.05 * spread["p50"]
    assert runs["--prefill-first"]["ttft"]["mean"] > runs["--mixed-chunk"]["ttft"]["mean"]
    # a profile of one's own: the steps pay its fixed cost (10 ms a step), as the API's do
    mine = dcost.engine("sglang", hardware="h100-sxm")
    mine = mine.with_profile(profile={**mine.profile, "step_overhead": 0.01})
    path = mine.save(tmp_path / "mine.toml")
    assert main([*args, "--profile", str(path)]) == 0
    got = json.loads(capsys.readouterr().out)
    srv = Server("h100-sxm", "qwen3-32b", engine=dcost.engine("sglang", hardware="h100-sxm",
                 profile=path), tensor_parallel=2)  # fmt: skip
    want = simulate_server(srv, Load(prompt=2048, output=32, clients=16, requests=64)).summary()
    assert got["tpot"]["mean"] == pytest.approx(want["tpot"]["mean"])
    assert main(args) == 0  # the shipped profile's steps
    assert got["tpot"]["mean"] > json.loads(capsys.readouterr().out)["tpot"]["mean"] + 0.009
    bare = ["simulate", "--hardware", "h100-sxm", "--model", "qwen3-32b", "--clients", "4"]
    bare += ["--prompt", "64", "--output", "8"]
    assert main([*bare, "--mixed-chunk", "--max-num-seqs", "8"]) == 2
    err = capsys.readouterr().err
    assert "--max-num-seqs, --mixed-chunk / --prefill-first set an engine's launch" in err
    assert main([*bare, "--engine", "vllm", "--gpu-memory-utilization", "1.5"]) == 2
    assert "Scheduler.gpu_memory_utilization = 1.5" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*bare, "--engine", "sglang", "--mixed-chunk", "--prefill-first"])
    assert "not allowed with argument" in capsys.readouterr().err


# --- the client's side, the scheduling order, traces and the prefix cache (issue 29) ---

TRACES = __import__("pathlib").Path(__file__).parent / "data" / "traces"


def _steps(server, load):
    """The simulation's own step time t(B, x) of ``server`` (B decode tokens, x prompt tokens)."""
    from dcost.planning.server import _step_table

    eng = server.resolved_engine()
    s = eng.scheduler
    x, table, _ = _step_table(server, load, eng, s.max_num_seqs, s.max_num_batched_tokens)
    return lambda b, n: table[b, 0] if n == 0 else float(np.interp(n, x, table[b]))


def _trace(tmp_path, rows):
    f = tmp_path / "t.csv"
    f.write_text("arrival,prompt,output\n" + "".join(f"{a},{p},{o}\n" for a, p, o in rows))
    return Load.from_trace(f)


def test_lone_requests_of_a_trace_pay_the_frontend_and_one_prefill(vllm_8b, tmp_path):
    """Requests far apart: TTFT = frontend_time + t(0, prompt); e2e adds a batch-1 decode step
    per later token. The frontend time is the engine's (vLLM's measured 11 ms)."""
    load = _trace(tmp_path, [(0, 700, 5), (20, 3000, 5), (40, 150, 5)])
    run = simulate_server(vllm_8b, load)
    t = _steps(vllm_8b, load)
    front = vllm_8b.resolved_engine().scheduler.frontend_time
    assert front == pytest.approx(0.011)
    assert run.arrival.tolist() == [0.0, 20.0, 40.0]
    assert run.ttft == pytest.approx([front + t(0, p) for p in (700, 3000, 150)], rel=1e-9)
    assert run.e2e == pytest.approx(run.ttft + 4 * t(1, 0), rel=1e-9)
    bare = Server(
        "h100-sxm",
        "llama-3.1-8b",
        engine=dcost.engine("vllm", hardware="h100-sxm", frontend_time=0.0),
    )
    assert simulate_server(bare, load).ttft == pytest.approx(run.ttft - front, rel=1e-9)


def test_a_benchmark_s_clients_start_at_once(vllm_8b):
    """C clients in lockstep whose prompts fit one step: every request's TTFT is the frontend
    time and one prefill step of all C prompts, wave after wave."""
    load = Load(prompt=512, output=8, clients=4, requests=12, stagger=False)
    run = simulate_server(vllm_8b, load, warmup=0.0)
    t = _steps(vllm_8b, load)
    front = vllm_8b.resolved_engine().scheduler.frontend_time
    assert run.ttft == pytest.approx(np.full(12, front + t(0, 4 * 512)), rel=1e-9)


@pytest.mark.parametrize("prefill_first", [False, True])
def test_the_engine_s_order_of_prefill_and_decode(tmp_path, prefill_first):
    """A prompt arriving while one request decodes: decode first (vLLM) computes it beside the
    decode token, t(1, x); prefill first (SGLang) alone, t(0, x), the decode waiting for the
    next step t(2, 0). The longest gap between the first request's tokens is that step."""
    eng = dcost.engine(
        "vllm", hardware="h100-sxm", prefill_first=prefill_first, async_scheduling=False
    )
    srv = Server("h100-sxm", "llama-3.1-8b", engine=eng)
    load = _trace(tmp_path, [(0, 512, 400), (0.5, 2048, 5)])
    run = simulate_server(srv, load)
    t = _steps(srv, load)
    gap = t(0, 2048) + t(2, 0) if prefill_first else t(1, 2048)
    assert run.itl.max() == pytest.approx(gap, rel=1e-9)
    own = t(0, 2048) if prefill_first else t(1, 2048)
    front = eng.scheduler.frontend_time
    assert front + own <= run.ttft[1] <= front + own + t(1, 0) + 1e-12


def test_an_overlapping_scheduler_takes_a_request_one_step_later(tmp_path):
    """Async (overlap) scheduling forms step k+1's batch when step k begins: a prompt reaching
    a replica during step k joins step k+2, not k+1. A prompt at ``a`` while one request
    decodes: synchronous, its first token ends the step that begins at the first boundary
    ``s0`` after ``a`` (``T0 + ceil((a - T0) / d) d``), ``s0 + t(1, x) - a``; overlapping, one
    decode step ``d`` later. A prompt reaching an idle replica starts at once either way, and
    the decoding request's last token comes at the same time (the same steps, one of them
    mixed)."""
    runs = {}
    for overlap in (False, True):
        eng = dcost.engine("vllm", hardware="h100-sxm", frontend_time=0.0, async_scheduling=overlap)
        srv = Server("h100-sxm", "llama-3.1-8b", engine=eng)
        load = _trace(tmp_path, [(0, 512, 400), (0.5, 2048, 5), (30, 700, 5)])
        runs[overlap] = simulate_server(srv, load, warmup=0.0)
    t = _steps(srv, load)
    d, t0 = t(1, 0), t(0, 512)
    s0 = t0 + np.ceil((0.5 - t0) / d - 1e-9) * d
    assert runs[False].ttft[1] == pytest.approx(s0 + t(1, 2048) - 0.5, rel=1e-9)
    assert runs[True].ttft[1] == pytest.approx(s0 + d + t(1, 2048) - 0.5, rel=1e-9)
    for run in runs.values():
        assert run.ttft[0] == pytest.approx(t0, rel=1e-9)
        assert run.ttft[2] == pytest.approx(t(0, 700), rel=1e-9)  # idle: at once
    assert runs[True].e2e[0] == pytest.approx(runs[False].e2e[0], rel=1e-9)
    defaults = {
        e: dcost.engine(e, hardware="h100-sxm").scheduler for e in dcost.engines.ENGINE_NAMES
    }
    assert all(s.async_scheduling for s in defaults.values())  # each engine's default
    with pytest.raises(dcost.engines.EngineError, match="Scheduler.async_scheduling = 1"):
        dcost.engine("vllm", hardware="h100-sxm", async_scheduling=1)


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("interval", [1, 7, 30])
def test_sglang_s_recv_interval_takes_requests_in_every_n_decode_steps(tmp_path, interval, overlap):
    """SGLang's ``--scheduler-recv-interval`` N: a busy engine takes in new requests before the
    step after a prompt step, then every N decode-only steps. A prompt reaching it at ``a``
    while one request decodes waits for the first intake at or after ``a``: ``T0 + ceil((a -
    T0) / (N d)) N d`` (T0 the end of the first prompt's step, d a decode step), then computes
    beside the decode token, t(1, x). Under the overlap scheduler (``async_scheduling``, SGLang's
    default) an intake forms the batch of the step after next, when the step before it began:
    it takes what arrived a decode step before it (``a + d`` for ``a``). An idle engine takes a
    request at once, whatever N."""
    eng = dcost.engine(
        "sglang",
        hardware="h100-sxm",
        prefill_first=False,
        recv_interval=interval,
        async_scheduling=overlap,
    )
    srv = Server("h100-sxm", "llama-3.1-8b", engine=eng)
    load = _trace(tmp_path, [(0, 512, 400), (0.5, 2048, 5), (30, 700, 5)])
    run = simulate_server(srv, load)
    t = _steps(srv, load)
    front, d = eng.scheduler.frontend_time, t(1, 0)
    t0 = front + t(0, 512)
    a = 0.5 + front + (d if overlap else 0.0)
    intake = t0 + np.ceil((a - t0) / (interval * d) - 1e-9) * interval * d
    assert run.ttft[1] == pytest.approx(intake + t(1, 2048) - 0.5, rel=1e-9)
    assert run.ttft[2] == pytest.approx(front + t(0, 700), rel=1e-9)  # idle: at once
    with pytest.raises(dcost.engines.EngineError, match="Scheduler.recv_interval = 0"):
        dcost.engine("sglang", hardware="h100-sxm", recv_interval=0)


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("tokens", [0.9, 0.1])
def test_tensorrt_llm_s_batch_waiting_holds_prompts_while_sequences_decode(
    tmp_path, tokens, overlap
):
    """TensorRT-LLM's ``batch_wait_timeout_iters`` W and ``batch_wait_max_tokens_ratio`` r: a
    prompt reaching a replica while one request decodes waits W decode steps from the first step
    that sees it (``s0``; under the overlap scheduler, its default, one step later: that step's
    batch was formed when the step before it began), unless the step's decode token and the
    prompt reach r of the budget; a prompt reaching an idle replica never waits."""
    eng = dcost.engine(
        "trtllm",
        hardware="h100-sxm",
        batch_wait_iters=20,
        batch_wait_tokens=tokens,
        async_scheduling=overlap,
    )
    srv = Server("h100-sxm", "llama-3.1-8b", engine=eng)
    load = _trace(tmp_path, [(0, 512, 400), (0.5, 2048, 5), (30, 700, 5)])
    run = simulate_server(srv, load)
    t = _steps(srv, load)
    front, d = eng.scheduler.frontend_time, t(1, 0)
    t0 = front + t(0, 512)
    s0 = t0 + np.ceil((0.5 + front - t0) / d - 1e-9) * d + (d if overlap else 0.0)
    budget = eng.scheduler.max_num_batched_tokens
    waits = 20 if 1 + 2048 < tokens * budget else 0
    assert run.ttft[1] == pytest.approx(s0 + waits * d + t(1, 2048) - 0.5, rel=1e-9)
    assert run.ttft[0] == pytest.approx(front + t(0, 512), rel=1e-9)  # nothing decoded yet
    assert run.ttft[2] == pytest.approx(front + t(0, 700), rel=1e-9)  # idle: at once
    with pytest.raises(dcost.engines.EngineError, match="Scheduler.batch_wait_tokens = 1.5"):
        dcost.engine("trtllm", hardware="h100-sxm", batch_wait_tokens=1.5)


def test_mooncake_block_hashes_hit_the_prefix_cache(vllm_8b):
    """Mooncake's hash ids are 512-token blocks: a prompt computes only the blocks its replica
    does not hold (and at least one token)."""
    load = Load.from_trace(TRACES / "mooncake.jsonl")
    run = simulate_server(vllm_8b, load)
    t = _steps(vllm_8b, load)
    front = vllm_8b.resolved_engine().scheduler.frontend_time
    computed = [1500, 1400 - 2 * 512, 700, 1]  # the last holds all of its 3 blocks
    assert run.ttft == pytest.approx([front + t(0, x) for x in computed], rel=1e-9)
    assert run.summary()["prefix_hit_rate"] == pytest.approx(2 / 4)


def test_a_prefix_share_hits_that_share_of_every_prompt_in_whole_blocks(tmp_path):
    """``Load.prefix_share`` s: a lone prompt of p tokens computes ``p - floor(s p / 16) 16``
    under vLLM's 16-token blocks (at least one token), from its first request on; without
    prefix caching it computes them all."""
    rows = [(0, 700, 3), (20, 3000, 3), (40, 150, 3)]
    for caching in (True, False):
        eng = dcost.engine("vllm", hardware="h100-sxm", prefix_caching=caching)
        srv = Server("h100-sxm", "llama-3.1-8b", engine=eng)
        trace = _trace(tmp_path, rows)
        load = dataclasses.replace(trace, prefix_share=0.4)
        run = simulate_server(srv, load)
        t = _steps(srv, load)
        front = eng.scheduler.frontend_time
        left = [p - int(0.4 * p) // 16 * 16 if caching else p for _, p, _ in rows]
        assert run.ttft == pytest.approx([front + t(0, x) for x in left], rel=1e-9)
        assert run.summary()["prefix_hit_rate"] == (1.0 if caching else 0.0)
    with pytest.raises(dcost.SpecError, match="Load.prefix_share = 1.5"):
        Load(prompt=100, output=10, clients=1, prefix_share=1.5)


@pytest.mark.parametrize("distribution", ["gamma", "lognormal"])
def test_lengths_are_drawn_with_their_mean_cv_and_the_distribution_s_median(distribution):
    """200,000 draws of cv 1.5 around 2,000 tokens: the mean and cv as given (within 2 % and
    4 %), and the median of the distribution named: ``mean / sqrt(1 + cv^2)`` for the
    lognormal (the planner's ``Traffic``), the gamma's (shape 1/cv^2) below it."""
    import scipy.stats as st

    load = Load(prompt=2000, output=10, prompt_cv=1.5, clients=1, distribution=distribution)
    x, _ = load.lengths(np.random.default_rng(0), 200_000)
    assert x.mean() == pytest.approx(2000, rel=0.02)
    assert x.std() / x.mean() == pytest.approx(1.5, rel=0.04)
    if distribution == "lognormal":
        median = 2000 / np.sqrt(1 + 1.5**2)
    else:
        median = st.gamma(1 / 1.5**2, scale=2000 * 1.5**2).median()
    assert np.median(x) == pytest.approx(median, rel=0.03)
    with pytest.raises(dcost.SpecError, match="Load.distribution = 'pareto'"):
        Load(prompt=2000, output=10, clients=1, distribution="pareto")


def test_a_session_s_later_turns_hit_its_earlier_context(vllm_8b):
    """Turn k of a session holds turn k-1's prompt and output as its prefix: it computes the rest,
    the hit in whole KV blocks (16 tokens under vLLM)."""
    load = Load.from_trace(TRACES / "sessions.csv")
    run = simulate_server(vllm_8b, load)
    t = _steps(vllm_8b, load)
    front = vllm_8b.resolved_engine().scheduler.frontend_time
    later = {2: 900 - (600 + 100) // 16 * 16, 3: 500 - 350 // 16 * 16, 4: 1200 - 980 // 16 * 16}
    for j, x in later.items():
        assert run.ttft[j] == pytest.approx(front + t(0, x), rel=1e-9), j
    assert run.summary()["prefix_hit_rate"] == pytest.approx(3 / 5)


def test_cli_replays_a_trace(capsys):
    import json

    from dcost.cli import main

    args = ["simulate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--engine", "vllm"]
    assert main([*args, "--trace", str(TRACES / "burstgpt.csv"), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    srv = Server("h100-sxm", "llama-3.1-8b", engine="vllm")
    want = simulate_server(srv, Load.from_trace(TRACES / "burstgpt.csv")).summary()
    assert got["ttft"]["mean"] == pytest.approx(want["ttft"]["mean"])
    assert main([*args, "--trace", str(TRACES / "burstgpt.csv"), "--clients", "3"]) == 2
    assert "--trace sets the requests" in capsys.readouterr().err


def test_scheduler_order_and_frontend_are_data_with_sources():
    import tomllib
    from importlib import resources

    text = resources.files("dcost.engines").joinpath("schedulers.toml").read_text()
    table = tomllib.loads(text)
    for name in ("vllm", "sglang", "trtllm"):
        for field in ("prefill_first", "frontend_time"):
            assert table[name][field]["source"], (name, field)
    assert dcost.engine("sglang", hardware="h100-sxm").scheduler.prefill_first
    assert not dcost.engine("vllm", hardware="h100-sxm").scheduler.prefill_first
    with pytest.raises(dcost.engines.EngineError, match="Scheduler.frontend_time = -0.1"):
        dcost.engine("vllm", hardware="h100-sxm", frontend_time=-0.1)
    with pytest.raises(dcost.engines.EngineError, match="Scheduler.prefill_first = 1"):
        dcost.engine("vllm", hardware="h100-sxm", prefill_first=1)


def test_latency_against_time_marks_the_stages(vllm_8b, tmp_path):
    """The figure of a staged load: TTFT and TPOT in ms at each request's arrival, the running
    sequences, a shaded span per stage named by its rate; dcost simulate --plot writes it."""
    load = Load(prompt=256, output=16, stages=[(5.0, 4.0), (10.0, 4.0)], arrival="constant")
    fig = simulate_server(vllm_8b, load).plot(load)
    top, mid, low = fig.axes[:3]
    assert (top.get_ylabel(), mid.get_ylabel()) == ("TTFT (ms)", "TPOT (ms)")
    assert low.get_xlabel() == "time since the first request (s)"
    labels = top.get_legend_handles_labels()[1]
    assert "stage 1: 5 requests/s" in labels and "stage 2: 10 requests/s" in labels
    from dcost.cli import main

    out = tmp_path / "t.png"
    args = ["simulate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--engine", "vllm"]
    load_args = ["--prompt", "256", "--output", "16", "--rate", "5", "--seconds", "4"]
    assert main([*args, *load_args, "--plot", str(out), "--json"]) == 0
    assert out.stat().st_size > 10_000


def test_sessions_grow_their_prompt_and_hit_their_own_context(vllm_8b):
    """Three turns, five seconds of thinking: turn k's prompt is the conversation so far plus
    200 new tokens; it computes what the cache does not hold (whole 16-token blocks)."""
    from dcost.planning.server import Sessions

    load = Load(
        prompt=200,
        output=50,
        stages=[(0.1, 10.0)],
        arrival="constant",
        sessions=Sessions(turns=3, think_time=5.0),
    )
    run = simulate_server(vllm_8b, load)
    t = _steps(vllm_8b, load)
    front = vllm_8b.resolved_engine().scheduler.frontend_time
    assert run.arrival[1] == pytest.approx(run.arrival[0] + run.e2e[0] + 5.0)
    assert run.arrival[2] == pytest.approx(run.arrival[1] + run.e2e[1] + 5.0)
    computed = [200, 450 - 250 // 16 * 16, 700 - 500 // 16 * 16]
    assert run.ttft == pytest.approx([front + t(0, x) for x in computed], rel=1e-9)
    closed = Load(prompt=100, output=20, clients=4, requests=8, sessions=Sessions(turns=2))
    assert len(simulate_server(vllm_8b, closed).ttft) == 16
    with pytest.raises(dcost.SpecError, match="Sessions.turns = 0"):
        Sessions(turns=0)


def test_the_docs_quote_the_under_load_experiment():
    """README's row and the engines page's table are experiments/results/serving_under_load.json
    (python experiments/serving_under_load.py writes it)."""
    import json
    import pathlib

    root = pathlib.Path(__file__).resolve().parents[1]
    res = json.loads((root / "experiments/results/serving_under_load.json").read_text())
    splits = res["splits"]

    def pct(x):
        return f"{100 * x:.1f} %"

    fresh = splits["fresh"]
    readme = (root / "README.md").read_text()
    row = (
        f"| never fitted | {fresh['runs']} | **{pct(fresh['ttft']['median'])}** | "
        f"**{pct(fresh['ttft']['p90'])}** |"
    )
    assert "silicon sample under load: mean TTFT" in readme and row in readme
    front = " ".join(readme.split())
    t = fresh["ttft"]
    assert f"TTFT is {100 * t['median']:.0f} % off at the median, {t['bias']:.2f}x" in front
    sg, bw = res["sglang_inferencex"], res["trtllm_batch_wait_all"]
    assert (
        f"SGLang runs went from {sg['simulated_recv_every_step']['bias']:.2f}x to "
        f"{sg['simulated']['bias']:.2f}x, its TensorRT-LLM runs with batch waiting from "
        f"{bw['simulated_no_batch_wait']['bias']:.2f}x to {bw['simulated']['bias']:.2f}x"
    ) in front
    page = (root / "docs/engines.md").read_text()
    names = {"fresh": "seed 2 (", "held_out": "seed 1 (", "seen": "seed 0 ("}
    for split, name in names.items():
        s = splits[split]
        line = next(x for x in page.splitlines() if x.startswith("|") and name in x)
        cells = [c.strip().strip("*") for c in line.strip("|").split("|")]
        assert f"({s['runs']}" in cells[0], split
        t, p = s["ttft"], s["tpot"]
        want = [
            pct(t["median"]),
            pct(t["p90"]),
            f"{t['bias']:.2f}",
            pct(p["median"]),
            pct(p["p90"]),
        ]
        assert cells[1:] == want, split
    ab = res["sglang_inferencex"]

    def run(key, off=""):
        return f"{ab[key]['bias']:.2f}x ({100 * ab[key]['median']:.0f} %{off})"

    text = " ".join(page.split())
    assert f"on the {ab['simulated']['runs']} such runs of the three samples" in text
    assert f"every step put them at {run('simulated_recv_every_step', ' off')}" in text
    assert f"with the scripts' interval {run('simulated')}" in text
    assert f"instead of alone {run('simulated_mixed')}" in text
    bw = res["trtllm_batch_wait_all"]
    on, off = bw["simulated"], bw["simulated_no_batch_wait"]
    assert f"on all {on['runs']} silicon runs it launched that way" in text
    assert (
        f"{on['bias']:.2f}x the measured ({100 * on['median']:.1f} % off, p90 "
        f"{100 * on['p90']:.1f} %) with it and {off['bias']:.2f}x ({100 * off['median']:.1f} %)"
    ) in text


def test_the_docs_quote_the_waves_of_the_under_load_experiment():
    """The engines page's table of later waves is ``waves`` of the experiment's own results
    (every split's runs), as its JSON stores it; and ``waves`` itself takes the later requests'
    mean from the benchmark's: a run whose later requests measured what the simulation's later
    waves did reads 1.0, one whose mean is the first wave's share of it alone reads 0."""
    import json
    import pathlib
    import sys

    root = pathlib.Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root / "experiments"))
    import serving_under_load as sul

    res = json.loads((root / "experiments/results/serving_under_load.json").read_text())
    rows = [x for s in res["splits"].values() for x in s["results"]]
    assert sul.waves(rows) == res["waves"]
    page = (root / "docs/engines.md").read_text()
    by = {(w["engine"], w["clients"]): w for w in res["waves"]}
    for lo, hi in sul.BANDS:
        band = f"{lo}-{hi}" if hi is not None else f">= {lo}"
        a = by[("all", band)]
        cells = [band, str(a["runs"]), f"{a['first_over_later']:.1f}"]
        cells += [f"{by[(e, band)]['measured_later_over_simulated']:.2f}"
                  for e in ("all", "sglang", "trtllm", "vllm")]  # fmt: skip
        cells += [
            f"{a['tpot_simulated_over_measured']:.2f}",
            f"{a['kv_at_most_half']} of {a['runs']}",
        ]
        assert "| " + " | ".join(cells) + " |" in page, band

    def run(measured, first, later, clients=16):
        sim = {"ttft_first_wave": first, "ttft_later": later, "tpot": 0.02, "kv_peak": 0.1}
        return {"engine": "vllm", "concurrency": clients, "ttft": measured, "tpot": 0.02,
                "simulated": sim}  # fmt: skip

    mean = (1.0 + (sul.ROUNDS - 1) * 0.1) / sul.ROUNDS  # first wave 1 s, later 0.1 s
    w = {x["engine"]: x for x in sul.waves([run(mean, 1.0, 0.1)])}
    assert w["all"]["measured_later_over_simulated"] == pytest.approx(1.0)
    w = {x["engine"]: x for x in sul.waves([run(1.0 / sul.ROUNDS, 1.0, 0.1)])}
    assert w["vllm"]["measured_later_over_simulated"] == pytest.approx(0.0, abs=1e-12)
    assert w["vllm"]["kv_at_most_half"] == 1 and w["vllm"]["clients"] == "9-32"


def test_frontend_time_varies_by_its_cv(tmp_path):
    """Lone requests: TTFT less the prefill step is each request's frontend time, of the
    scheduler's mean and coefficient of variation (gamma draws)."""
    eng = dcost.engine("vllm", hardware="h100-sxm", frontend_cv=0.5)
    srv = Server("h100-sxm", "llama-3.1-8b", engine=eng)
    load = _trace(tmp_path, [(2.0 * i, 300, 3) for i in range(400)])
    run = simulate_server(srv, load)
    front = run.ttft - _steps(srv, load)(0, 300)
    assert front.mean() == pytest.approx(0.011, rel=0.08)
    assert front.std() / front.mean() == pytest.approx(0.5, rel=0.12)
    with pytest.raises(dcost.engines.EngineError, match="Scheduler.frontend_cv = -1"):
        dcost.engine("vllm", hardware="h100-sxm", frontend_cv=-1)


def test_cli_sessions(capsys):
    import json

    from dcost.cli import main

    args = ["simulate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--engine", "vllm"]
    load = ["--prompt", "200", "--output", "20", "--clients", "2", "--requests", "4"]
    assert main([*args, *load, "--turns", "3", "--think-time", "1", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["prefix_hit_rate"] == pytest.approx(2 / 3)


def test_a_replica_without_room_for_one_request_says_how_much_memory_is_missing():
    """Refusals in memory terms, checked against the presets' own numbers: DeepSeek-R1 (fp8,
    671 B parameters) on one H100 under vLLM needs its weights less 0.9 of its HBM more than the
    engine may use; Llama 3 70B (bf16) on two H100s keeps 0.9 of its HBM less half its weights a
    chip, which holds that room over half of a token's KV bytes, far fewer than 200,100 tokens.
    The HBM is the 81,559 MiB nvidia-smi reports for an H100 80GB HBM3 (NVIDIA/nccl issue 1264)."""
    import re

    hbm = 81_559 * 2**20

    load = Load(prompt=200_000, output=100, clients=1, requests=2)
    vllm = dcost.engine("vllm", hardware="h100-sxm")
    r1 = dcost.model("deepseek-r1")
    params = float(r1.params_dense) + float(r1.n_experts) * float(r1.params_per_expert)
    weights = params * float(r1.bytes_per_param)
    with pytest.raises(dcost.SpecError, match="leaves no room for a KV cache") as err:
        simulate_server(Server("h100-sxm", "deepseek-r1", engine=vllm), load)
    excess = float(re.search(r"take ([\d.]+) GB a chip more", str(err.value)).group(1))
    assert excess == pytest.approx((weights - 0.9 * hbm) / 1e9, rel=0.02)
    assert "gpu_memory_utilization = 0.9 of its 85.5 GB" in str(err.value)

    llama = dcost.model("llama-3-70b")
    room = 0.9 * hbm - float(llama.params_dense) * float(llama.bytes_per_param) / 2
    server = Server("h100-sxm", "llama-3-70b", engine=vllm, tensor_parallel=2)
    with pytest.raises(dcost.SpecError, match="tensor_parallel = 2") as err:
        simulate_server(server, load)
    text = str(err.value)
    tokens = float(re.search(r"([\d,]+) tokens a replica", text).group(1).replace(",", ""))
    assert tokens == pytest.approx(room / (float(llama.kv_bytes_per_token) / 2), rel=0.05)
    assert "fewer than one request's 200,100" in text


@pytest.mark.parametrize(
    "router, behind_the_long_prompt",
    [("least-requests", True), ("round-robin", True), ("least-prefill", False)],
)
def test_the_router_decides_who_waits_behind_a_long_prompt(
    tmp_path, router, behind_the_long_prompt
):
    """Two replicas: A's 16,000-token prompt prefills on replica 0 in 512-token steps, B decodes
    on replica 1, and C (64 tokens) arrives while both hold one request. A least-requests router
    sees a tie and picks replica 0, round-robin's turn is replica 0 too: C's first token comes
    after A's. A least-prefill router sends C to replica 1, whose prompts are all prefilled: C's
    TTFT is the rest of B's decode step (and one more: vLLM's scheduler overlaps its steps)
    and one step of its own."""
    eng = dcost.engine("vllm", hardware="h100-sxm", frontend_time=0.0, max_num_batched_tokens=512)
    srv = Server("h100-sxm", "llama-3.1-8b", engine=eng, replicas=2, router=router)
    load = _trace(tmp_path, [(0.0, 16_000, 2), (0.01, 64, 4000), (0.3, 64, 2)])
    run = simulate_server(srv, load, warmup=0.0)
    first = run.arrival + run.ttft
    t = _steps(srv, load)
    assert first[0] - 0.3 > 5 * (t(1, 0) + t(1, 64))  # A's prefill runs long past C's arrival
    if behind_the_long_prompt:
        assert first[2] >= first[0]
    else:
        assert eng.scheduler.async_scheduling
        assert t(1, 64) <= run.ttft[2] <= 2 * t(1, 0) + t(1, 64) + 1e-9


@pytest.mark.parametrize(
    "router, behind_the_long_prompt", [("least-prefill", True), ("least-tokens", False)]
)
def test_a_token_counting_router_sends_a_prompt_past_a_long_one(
    tmp_path, router, behind_the_long_prompt
):
    """Two replicas prefilling one prompt each, A's 16,000 tokens on replica 0 and B's 2,000 on
    replica 1, in 512-token steps, when C (64 tokens) arrives. Counting prompts, least-prefill
    sees a tie (and a tie in flight) and picks replica 0: C's first token comes after A's.
    Counting their tokens, least-tokens picks replica 1: C's comes after B's, long before A's."""
    eng = dcost.engine("vllm", hardware="h100-sxm", frontend_time=0.0, max_num_batched_tokens=512)
    srv = Server("h100-sxm", "llama-3.1-8b", engine=eng, replicas=2, router=router)
    load = _trace(tmp_path, [(0.0, 16_000, 2), (0.001, 2_000, 2), (0.002, 64, 2)])
    run = simulate_server(srv, load, warmup=0.0)
    first = run.arrival + run.ttft
    assert first[1] < first[0]  # B is done before A: C found both prefilling
    if behind_the_long_prompt:
        assert first[2] >= first[0]
    else:
        assert first[1] <= first[2] < first[0] and run.ttft[2] < 0.5 * run.ttft[0]


@pytest.mark.parametrize("router", ["least-prefill", "least-tokens"])
def test_least_prefill_counts_every_prompt_back_out(monkeypatch, router):
    """The routers' counts of prompts (and of their tokens) still to prefill return to zero when
    every request is done, preemptions (whose prompts are prefilled again) included."""
    import dcost.planning.server as server

    made = []

    class Kept(server._Router):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    monkeypatch.setattr(server, "_Router", Kept)
    eng = dcost.engine("vllm", hardware="h100-sxm", gpu_memory_utilization=0.215)
    srv = Server("h100-sxm", "llama-3.1-8b", engine=eng, replicas=2, router=router)
    run = simulate_server(srv, Load(prompt=2000, output=400, clients=128, requests=256))
    assert run.preemptions > 0 and np.all(np.isfinite(run.e2e))
    assert made[0].prefilling == [0, 0] and made[0].tokens == [0, 0]
    with pytest.raises(dcost.SpecError, match="Server.router = 'random' is not allowed"):
        Server("h100-sxm", "llama-3.1-8b", router="random")


# ----------------------------------------------------------------- disaggregated: two pools


def _legs(load):
    """The loads simulate_disaggregated hands each pool: the prompts alone (one output token),
    then the whole requests (their step tables: the decode context of the lengths)."""
    from dcost.planning.traces import Trace

    t = load.trace
    ones = np.ones(len(t), int)
    first = Load(prompt=load.prompt, output=1.0, trace=Trace(t.arrival, t.prompt, ones))
    return first, Load(prompt=load.prompt, output=load.output, trace=t)


def test_lone_requests_of_a_disaggregated_pair_pay_prefill_transfer_then_decode(tmp_path):
    """Requests far apart on a prefill pool and a decode pool (TP2): TTFT = frontend + the
    prefill replica's t(0, prompt) + the KV transfer over its chips (dcost.kv_transfer_time
    on the engine's hardware, as the planner's ``transfer_time``),
    and every later token one batch-1 decode step of the decode pool; no decode step rides in
    the prefill pool, no prompt step in the decode pool."""
    from dcost.planning.server import kv_transfer_seconds, simulate_disaggregated

    eng = dcost.engine("vllm", hardware="h100-sxm")
    pre = Server("h100-sxm", "llama-3.1-8b", engine=eng)
    dec = Server("h100-sxm", "llama-3.1-8b", engine=eng, tensor_parallel=2)
    load = _trace(tmp_path, [(0, 700, 5), (20, 3000, 9), (40, 150, 2)])
    run = simulate_disaggregated(pre, dec, load)
    first, whole = _legs(load)
    t_pre, t_dec = _steps(pre, first), _steps(dec, whole)
    moved = kv_transfer_seconds(pre, first, [700, 3000, 150])
    h, m = dcost.presets.pair("h100-sxm", "llama-3.1-8b")
    h = dcost.engines.on_engine(eng, h, m)  # the planner's hardware on an engine's profile
    assert moved == pytest.approx(
        [float(dcost.kv_transfer_time(p, h, m)) for p in (700, 3000, 150)], rel=1e-5
    )
    # over a stage pair's two chips: twice the prompt in the time of one chip's (a record that
    # the serving model takes at any depth of stages)
    staged = Server("h100-sxm", "llama-3.1-8b", engine=eng, pipeline_parallel=2)
    assert kv_transfer_seconds(staged, first, [1400, 6000, 300]) == pytest.approx(moved, rel=1e-5)
    front = eng.scheduler.frontend_time
    expect = [front + t_pre(0, p) + d for p, d in zip((700, 3000, 150), moved, strict=True)]
    assert run.ttft == pytest.approx(expect, rel=1e-9)
    assert run.e2e == pytest.approx(run.ttft + np.array([4, 8, 1]) * t_dec(1, 0), rel=1e-9)
    assert run.tpot == pytest.approx([t_dec(1, 0)] * 3, rel=1e-9)
    assert t_dec(1, 0) < t_pre(1, 0)  # two chips decode faster than the prefill replica's one
    # a transfer of the user's: a fixed 0.2 s
    slow = simulate_disaggregated(pre, dec, load, transfer=lambda p: 0.2 + 0.0 * p)
    assert slow.ttft == pytest.approx(run.ttft - moved + 0.2, rel=1e-9)


def test_a_full_decode_pool_makes_arrivals_wait_to_join_and_preempts():
    """A decode pool whose KV cache holds few sequences: requests wait to join (their TPOT
    holds the wait) and the pool preempts, every request still finishes, and the least-prefill
    router's count of prompts to compute returns to zero (a preempted sequence computes its
    prompt again on the decode replica)."""
    import dcost.planning.server as server

    made = []

    class Kept(server._Router):
        def __init__(self, *args):
            super().__init__(*args)
            made.append(self)

    eng = dcost.engine("vllm", hardware="h100-sxm")
    small = dcost.engine("vllm", hardware="h100-sxm", gpu_memory_utilization=0.215)
    pre = Server("h100-sxm", "llama-3.1-8b", engine=eng, replicas=2)
    dec = Server("h100-sxm", "llama-3.1-8b", engine=small, replicas=2, router="least-prefill")
    load = Load(prompt=2000, output=400, stages=((20.0, 12.0),))
    roomy = server.simulate_disaggregated(pre, dataclasses.replace(dec, engine=eng), load)
    original = server._Router
    server._Router = Kept
    try:
        run = server.simulate_disaggregated(pre, dec, load)
    finally:
        server._Router = original
    assert np.all(np.isfinite(run.e2e)) and run.preemptions > 0
    # the decode pool's router (the prefill pool's first); its token count holds recomputations
    assert made[1].prefilling == [0, 0] and made[1].tokens == [0, 0]
    assert np.nanmean(run.tpot) > 1.2 * np.nanmean(roomy.tpot)
    assert run.ttft == pytest.approx(roomy.ttft, rel=1e-12)  # the prefill pool is the same


def test_a_disaggregated_simulation_refuses_what_it_cannot_run():
    from dcost.planning.server import Sessions, simulate_disaggregated

    srv = Server("h100-sxm", "llama-3.1-8b")
    with pytest.raises(dcost.SpecError, match="load.clients is not allowed"):
        simulate_disaggregated(srv, srv, Load(prompt=100, output=10, clients=4))
    sessions = Load(prompt=100, output=10, stages=((1.0, 5.0),), sessions=Sessions(2, 1.0))
    with pytest.raises(dcost.SpecError, match="load.sessions is not allowed"):
        simulate_disaggregated(srv, srv, sessions)
    with pytest.raises(dcost.SpecError, match="prefill must be a dcost.Server"):
        simulate_disaggregated("h100-sxm", srv, Load(prompt=100, output=10, stages=((1, 5),)))
    load = Load(prompt=100, output=10, stages=((2.0, 5.0),))
    with pytest.raises(dcost.SpecError, match=r"transfer = -1.0 s .* a finite time >= 0"):
        simulate_disaggregated(srv, srv, load, transfer=lambda p: -1.0 + 0.0 * p)
    for value in (True, 1 + 2j, "x", None, [1.0, 2.0, 3.0]):  # not seconds, or not one each
        with pytest.raises(dcost.SpecError, match="transfer is not allowed: it must map"):
            simulate_disaggregated(srv, srv, load, transfer=lambda p, v=value: v)


def test_dcost_simulate_takes_a_prefill_and_a_decode_pool():
    """``dcost.simulate((prefill, decode), load)`` is ``simulate_disaggregated``'s run."""
    from dcost.planning.server import simulate_disaggregated

    srv = Server("h100-sxm", "llama-3.1-8b")
    load = Load(prompt=500, output=20, stages=((4.0, 10.0),))
    run = dcost.simulate((srv, srv), load, seed=3)
    same = simulate_disaggregated(srv, srv, load, seed=3)
    assert np.array_equal(run.ttft, same.ttft) and np.array_equal(run.e2e, same.e2e)
    with pytest.raises(dcost.SpecError, match=r"simulate\(\(prefill, decode\), load\): load"):
        dcost.simulate((srv, srv), dcost.traffic("chat"))


def test_cli_simulates_a_disaggregated_deployment(capsys):
    """``--decode-replicas`` (and ``--decode-tensor-parallel``) make ``dcost simulate`` run
    ``simulate_disaggregated``: the JSON is its summary, the text names both pools."""
    import json

    from dcost.cli import main
    from dcost.planning.server import simulate_disaggregated

    args = ["simulate", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--engine", "vllm",
            "--rate", "6", "--seconds", "20", "--prompt", "800", "--output", "40"]  # fmt: skip
    pools = ["--decode-replicas", "2", "--decode-tensor-parallel", "2"]
    assert main([*args, *pools, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    eng = dcost.engine("vllm", hardware="h100-sxm")
    pre = Server("h100-sxm", "llama-3.1-8b", engine=eng)
    dec = Server("h100-sxm", "llama-3.1-8b", engine=eng, tensor_parallel=2, replicas=2)
    want = simulate_disaggregated(pre, dec, Load(prompt=800, output=40, stages=((6.0, 20.0),)))
    assert got["ttft"]["p99"] == pytest.approx(want.summary()["ttft"]["p99"])
    assert got["tpot"]["mean"] == pytest.approx(want.summary()["tpot"]["mean"])
    assert got["disaggregated"]["decode_replicas"] == 2
    assert main([*args, *pools]) == 0
    assert "(TP2) decoding, each KV cache moved between them" in capsys.readouterr().out
    assert main([*args, "--decode-tensor-parallel", "2"]) == 2
    assert "give --decode-replicas" in capsys.readouterr().err
    assert main([*args, "--decode-replicas", "0"]) == 2
    assert "--decode-replicas must be a whole number >= 1, got 0" in capsys.readouterr().err


def test_requests_no_disaggregated_pool_can_hold_are_counted_unserved():
    """Drawn prompts beyond what a prefill replica's KV cache holds are never served (NaN
    latencies, ``ServerRun.unserved``), the others are; a trace with such a request is refused
    by name, as simulate_server refuses it."""
    from dcost.planning.server import simulate_disaggregated
    from dcost.planning.traces import Trace

    small = dcost.engine("vllm", hardware="h100-sxm", gpu_memory_utilization=0.215)
    pre = Server("h100-sxm", "llama-3.1-8b", engine=small)
    dec = Server("h100-sxm", "llama-3.1-8b", engine="vllm")
    load = Load(prompt=2000, output=50, prompt_cv=1.5, stages=((2.0, 60.0),))
    run = simulate_disaggregated(pre, dec, load)
    lost = ~np.isfinite(run.e2e)
    assert 0 < run.unserved == lost.sum() < 0.1 * len(run.e2e)
    assert np.all(np.isnan(run.ttft[lost])) and np.all(np.isfinite(run.ttft[~lost]))
    prompts = np.array([500] * 9 + [60_000])
    trace = Trace(np.arange(10.0), prompts, np.full(10, 5))
    with pytest.raises(dcost.SpecError, match="request 9 of the trace"):
        simulate_disaggregated(pre, dec, Load(prompt=6450.0, output=5.0, trace=trace))


@pytest.mark.parametrize("closed", [False, True])
def test_a_request_too_long_for_the_kv_cache_is_refused_not_a_wall(closed, capsys):
    """A drawn request whose prompt and output exceed a replica's KV cache is refused at
    arrival (NaN latencies, counted in ``unserved``) and the others are served. It used to sit
    half prefilled holding the cache, and every later request waited behind it for ever: 27 of
    these 101 requests never ended, and the percentiles, which skip unfinished requests, said
    nothing. A closed loop's client sends its next request at once."""
    small = dcost.engine("vllm", hardware="h100-sxm", gpu_memory_utilization=0.215)
    srv = Server("h100-sxm", "llama-3.1-8b", engine=small)
    if closed:
        load = Load(prompt=2000, output=50, prompt_cv=1.5, clients=8, requests=200)
    else:
        load = Load(prompt=2000, output=50, prompt_cv=1.5, stages=((2.0, 60.0),))
    run = simulate_server(srv, load)
    rng = np.random.default_rng(0)  # the run's draws: arrivals (or the clients' starts), lengths
    _ = rng.uniform(0.0, 1.0, 8) if closed else load.arrivals(rng)
    prompt, output = load.lengths(rng, len(run.e2e))
    too_long = prompt + output > 17_749  # the replica's KV tokens (its refusal message's)
    assert too_long.any() and run.unserved == too_long.sum() == np.sum(~np.isfinite(run.e2e))
    assert np.all(np.isfinite(run.e2e[~too_long]))
    assert run.summary()["unserved"] == run.unserved


def test_simulate_how_to_shows_what_the_command_prints(capsys):
    """``docs/how-to/simulate.md``'s console block is what ``dcost simulate`` prints for its
    command (numbers within 0.5 %: another CPU may round a last digit the other way), and the
    measured run it quotes is the silicon sample's."""
    import json
    import pathlib
    import re

    from dcost.cli import main

    root = pathlib.Path(__file__).resolve().parents[1]
    page = (root / "docs" / "how-to" / "simulate.md").read_text()
    block = page.split("```console\n", 1)[1].split("```", 1)[0]
    command, shown = block.split("\n", 2)[:2], block.split("\n", 2)[2]
    args = " ".join(command).replace("$ dcost ", "").replace("\\", "").split()
    assert main(args) == 0
    printed = capsys.readouterr().out

    def numbers(text):
        return [float(x) for x in re.findall(r"\d+\.?\d*", text)]

    assert [line.split()[0] for line in printed.splitlines() if line] == [
        line.split()[0] for line in shown.splitlines() if line
    ]
    assert numbers(printed) == pytest.approx(numbers(shown), rel=5e-3)
    runs = json.loads((root / "experiments/results/serving_under_load.json").read_text())
    measured = [
        r["ttft"]
        for s in runs["splits"].values()
        for r in s["results"]
        if "minimax" in r["id"] and "h200" in r["id"] and "1024x1024" in r["id"]
        and r["concurrency"] == 8
    ]  # fmt: skip
    assert len(measured) == 1  # InferenceX's MiniMax-M2.5 on 4 H200 (its record's layout)
    assert f"mean TTFT of {1e3 * measured[0]:.0f} ms" in " ".join(page.split())
