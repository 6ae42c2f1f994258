"""A plan's launch under its engine's scheduler (dcost.planning.launch.check_launch): its figures
are the engine simulation's own, a plan that misses gets the fewest replicas that hold, and what
it cannot check is refused by name."""

import dataclasses
import json

import numpy as np
import pytest

import dcost
from dcost.planning.launch import ROUTER, check_launch, launch_load, scheduler_settings
from dcost.planning.server import Server, simulate_server

REQUESTS = 1500


@pytest.fixture(scope="module")
def chat_plan():
    traffic = dcost.traffic("chat", rate=27.3)
    return dcost.plan("h100-sxm", "llama-3.1-8b", traffic, engine="vllm", mode="aggregated")


def _simulated(p, replicas, engine="vllm", router=ROUTER):
    """The pool's replicas under the engine's scheduler, as the launch sets it, behind the
    router the plan assumes: the TTFT and TPOT at the targets' quantiles (what check_launch
    must report)."""
    (pool,) = p.pools
    eng = dcost.engine(engine, hardware="h100-sxm", **scheduler_settings(pool, engine))
    srv = Server("h100-sxm", "llama-3.1-8b", engine=eng, replicas=replicas,
                 tensor_parallel=pool.chips_per_stage, router=router)  # fmt: skip
    run = simulate_server(srv, launch_load(p, REQUESTS), seed=0)
    t, s = run.ttft[run.measured], run.tpot[run.measured]
    return (float(np.quantile(t, p.ttft_slo[1])),
            float(np.quantile(s[np.isfinite(s)], p.tpot_slo[1])))  # fmt: skip


def test_the_launch_load_is_the_plan_s_traffic(chat_plan):
    """Poisson at the plan's rate for the requests asked, the traffic's lognormal lengths (mean
    and cv) and its prefix hits as the share of every prompt already cached."""
    t = chat_plan.traffic
    load = launch_load(chat_plan, 3000)
    ((rate, seconds),) = load.stages
    assert rate == pytest.approx(float(t.rate)) and rate * seconds == pytest.approx(3000)
    assert load.arrival == "poisson" and load.distribution == "lognormal"
    assert (load.prompt, load.output) == pytest.approx((float(t.prompt_tokens),
                                                        float(t.output_tokens)))  # fmt: skip
    assert (load.prompt_cv, load.output_cv) == pytest.approx((float(t.prompt_cv),
                                                              float(t.output_cv)))  # fmt: skip
    assert load.prefix_share == pytest.approx(float(t.prefix_hit)) and load.shared_prefix == 0


def test_a_plan_that_holds_is_said_to_hold_with_the_simulations_figures(chat_plan):
    p = chat_plan
    (pool,) = p.pools
    c = check_launch(p, "h100-sxm", "llama-3.1-8b", "vllm", requests=REQUESTS)
    ttft, tpot = _simulated(p, pool.replicas)
    assert c.ttft == {pool.replicas: pytest.approx(ttft)}
    assert c.tpot == {pool.replicas: pytest.approx(tpot)}
    assert c.holds and c.replicas == pool.replicas and c.router == "least-tokens"
    assert ttft <= p.ttft_slo[0] and tpot <= p.tpot_slo[0]
    other = check_launch(p, "h100-sxm", "llama-3.1-8b", "vllm", requests=REQUESTS,
                         router="round-robin")  # fmt: skip
    assert other.router == "round-robin"
    rr = _simulated(p, pool.replicas, router="round-robin")
    assert other.ttft[pool.replicas] == pytest.approx(rr[0])
    assert c.frontend_time == pytest.approx(0.011)  # the client's TTFT, vLLM's frontend in it


def test_too_few_replicas_get_the_fewest_that_hold(chat_plan):
    """The plan's pool cut to one replica overloads it (the queue grows): the check says it
    misses and names the fewest replicas it tried that hold; one fewer than that misses."""
    (pool,) = chat_plan.pools
    assert pool.replicas >= 2
    cut = dataclasses.replace(chat_plan, pools=(dataclasses.replace(pool, replicas=1),))
    c = check_launch(cut, "h100-sxm", "llama-3.1-8b", "vllm", requests=REQUESTS)
    assert not c.holds and c.replicas is not None and c.replicas >= 2
    assert c.ttft[1] > cut.ttft_slo[0] or c.tpot[1] > cut.tpot_slo[0]
    ttft, tpot = _simulated(cut, c.replicas)
    assert ttft <= cut.ttft_slo[0] and tpot <= cut.tpot_slo[0]
    ttft, tpot = _simulated(cut, c.replicas - 1)
    assert ttft > cut.ttft_slo[0] or tpot > cut.tpot_slo[0]


def test_what_cannot_be_checked_is_refused_by_name(chat_plan):
    bad = dataclasses.replace(chat_plan, feasible=False)
    with pytest.raises(dcost.SpecError, match="the plan is infeasible"):
        check_launch(bad, "h100-sxm", "llama-3.1-8b", "vllm")
    with pytest.raises(ValueError, match="unknown engine 'tgi'"):
        check_launch(chat_plan, "h100-sxm", "llama-3.1-8b", "tgi")
    with pytest.raises(dcost.SpecError, match="check_launch.requests = 50 is not allowed"):
        check_launch(chat_plan, "h100-sxm", "llama-3.1-8b", "vllm", requests=50)
    with pytest.raises(dcost.SpecError, match="check_launch.max_extra = -1"):
        check_launch(chat_plan, "h100-sxm", "llama-3.1-8b", "vllm", max_extra=-1)


@pytest.fixture(scope="module")
def disaggregated_plan():
    traffic = dcost.traffic("chat", rate=27.3)
    return dcost.plan("h100-sxm", "llama-3.1-8b", traffic, engine="vllm", mode="disaggregated")


def _pools(p, engine="vllm"):
    """A disaggregated plan's prefill and decode pools under the engine's scheduler, as the
    launch sets each (the decode pool behind a least-requests router)."""
    out = []
    for pool, router in zip(p.pools, (ROUTER, "least-requests"), strict=True):
        settings = scheduler_settings(pool, engine, p.memory_reserve)
        eng = dcost.engine(engine, hardware="h100-sxm", **settings)
        out.append(Server("h100-sxm", "llama-3.1-8b", engine=eng, replicas=pool.replicas,
                          tensor_parallel=pool.chips_per_stage, router=router))  # fmt: skip
    return out


def test_a_disaggregated_plan_is_checked_pool_by_pool(disaggregated_plan, capsys):
    """Both pools under the engine's scheduler (simulate_disaggregated): the check's figures are
    that simulation's; with the prefill pool cut to one replica and a TTFT target it misses,
    the check names the prefill replicas that hold it beside the planned decode pool; the
    command line prints and writes the pair."""
    from dcost.cli import main
    from dcost.planning.server import simulate_disaggregated

    p = disaggregated_plan
    assert [x.role for x in p.pools] == ["prefill", "decode"]
    pre, dec = _pools(p)
    key = (pre.replicas, dec.replicas)
    c = check_launch(p, "h100-sxm", "llama-3.1-8b", "vllm", requests=REQUESTS)
    run = simulate_disaggregated(pre, dec, launch_load(p, REQUESTS), seed=0)
    ttft = float(np.quantile(run.ttft[run.measured], p.ttft_slo[1]))
    assert c.planned == key and c.ttft == {key: pytest.approx(ttft)} and c.holds
    assert c.replicas == key
    assert pre.replicas >= 2
    one = tuple(dataclasses.replace(x, replicas=1) if x.role == "prefill" else x for x in p.pools)
    tight = (0.5 * (c.ttft[key] + ttft_at_one(p, one, dec)), p.ttft_slo[1])
    cut = dataclasses.replace(p, pools=one, ttft_slo=tight)
    miss = check_launch(cut, "h100-sxm", "llama-3.1-8b", "vllm", requests=REQUESTS)
    assert not miss.holds and miss.planned == (1, dec.replicas)
    assert miss.replicas is not None and miss.replicas[0] >= 2 and miss.replicas[1] == dec.replicas
    assert miss.ttft[miss.replicas] <= tight[0] < miss.ttft[(1, dec.replicas)]
    args = ["plan", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--traffic", "chat",
            "--rate", "27.3", "--engine", "vllm", "--mode", "disaggregated"]  # fmt: skip
    assert main([*args, "--check-launch", str(REQUESTS), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["launch_check"]["vllm"]
    label = f"{key[0]}+{key[1]}"
    assert got["planned_replicas"] == {"prefill": key[0], "decode": key[1]}
    assert got["ttft"] == {label: pytest.approx(ttft)} and got["holds"]
    assert main([*args, "--check-launch", str(REQUESTS)]) == 0
    assert "under vllm's scheduler, least-tokens router" in capsys.readouterr().out


def ttft_at_one(p, pools, dec):
    """The simulated TTFT percentile with one prefill replica (the decode pool as planned)."""
    from dcost.planning.server import simulate_disaggregated

    pre = _pools(dataclasses.replace(p, pools=pools))[0]
    run = simulate_disaggregated(pre, dec, launch_load(p, REQUESTS), seed=0)
    return float(np.quantile(run.ttft[run.measured], p.ttft_slo[1]))


def test_cli_checks_the_launch(capsys):
    from dcost.cli import main

    args = ["plan", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--traffic", "chat",
            "--rate", "27.3", "--engine", "vllm", "--mode", "aggregated"]  # fmt: skip
    assert main([*args, "--check-launch", str(REQUESTS), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["launch_check"]["vllm"]
    want_plan = dcost.plan("h100-sxm", "llama-3.1-8b", dcost.traffic("chat", rate=27.3),
                           engine="vllm", mode="aggregated")  # fmt: skip
    want = check_launch(want_plan, "h100-sxm", "llama-3.1-8b", "vllm", requests=REQUESTS)
    assert got["holds"] == want.holds and got["replicas_that_hold"] == want.replicas
    assert got["ttft"] == {str(n): pytest.approx(v) for n, v in want.ttft.items()}
    assert main([*args, "--check-launch", str(REQUESTS)]) == 0
    out = capsys.readouterr().out
    assert "under vllm's scheduler, least-tokens router (1,500 requests simulated)" in out
    assert "router: send each request to the replica with the fewest prompt tokens" in out
    # the balancer a user runs: the same replicas behind it, as check_launch simulates them
    lb = ["--check-launch", str(REQUESTS), "--router", "least-requests", "--json"]
    assert main([*args, *lb]) == 0
    got = json.loads(capsys.readouterr().out)["launch_check"]["vllm"]
    (pool,) = want_plan.pools
    assert got["router"] == "least-requests"
    ttft = _simulated(want_plan, pool.replicas, router="least-requests")[0]
    assert got["ttft"][str(pool.replicas)] == pytest.approx(ttft)
    with pytest.raises(SystemExit) as bad:
        main([*args, "--router", "random"])
    assert bad.value.code == 2 and "--router: invalid choice: 'random'" in capsys.readouterr().err
    assert main([*args, "--check-launch", "50"]) == 2
    assert "--check-launch must be at least 100 requests" in capsys.readouterr().err


def test_a_disaggregated_check_is_printed_and_written_as_pairs():
    """The CLI's line and JSON for a disaggregated check that misses: the pair that holds, or
    the most it tried, in words; keys "P+D"."""
    from dcost.cli.plan import _check_json, _check_line
    from dcost.planning.launch import LaunchCheck

    tried = {(1, 1): 0.3, (2, 1): 0.15}
    c = LaunchCheck("vllm", (1, 1), tried, {k: 0.011 for k in tried}, (0.2, 0.05),
                    (0.99, 0.9), False, (2, 1), 1500, 0.011)  # fmt: skip
    assert "misses; 2 prefill + 1 decode replicas hold it (TTFT 150 ms" in _check_line(c)
    j = _check_json(c)
    assert j["replicas_that_hold"] == {"prefill": 2, "decode": 1}
    assert j["ttft"] == {"1+1": 0.3, "2+1": 0.15}
    none = dataclasses.replace(c, replicas=None)
    assert "still at 2 prefill + 1 decode replicas (TTFT 150 ms" in _check_line(none)
    assert _check_json(none)["replicas_that_hold"] is None
