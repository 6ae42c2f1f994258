"""``dcost.plan_energy``: the watts and joules of a planned fleet, checked against the idle floor
and the board limit, against its formula rebuilt here from ``dcost.energy``, and against what
more traffic on the same chips must do (the idle floor shared by more tokens)."""

from __future__ import annotations

import json

import pytest

import dcost
from dcost.cli.app import main


@pytest.fixture(scope="module")
def h100():
    return dcost.hardware("h100-sxm", calibrated=True)


def _by_hand(p) -> float:
    """``N P_idle + lambda (T_out e + T'_in e_pre)`` from dcost.energy, pool by pool: the
    aggregated pool's mixed step (decodes and prompt chunks at its mean batch and chunk), the
    decode pool's decode step, both at the planner's decode context, the prefill pool's pass of
    one prompt; each pool busy at most all of the time."""
    from dcost.planning.designs import workload_stats

    t, h = p.traffic, p.hardware
    rate, t_in, t_out = float(t.rate), float(t.prompt_tokens), float(t.output_tokens)
    computed = max(t_in * (1.0 - float(t.prefix_hit)), 1.0)
    context = float(workload_stats(t)[0])  # the running batch's time-averaged context
    idle = float(h.idle_power)
    total = p.chips * idle
    for pool in p.pools:
        kw = dict(chips=pool.chips_per_stage, stages=pool.stages, attention_dp=pool.attention_dp)
        if pool.role == "prefill":
            d = dcost.Design(batch=1.0, **kw)
            w = dcost.Workload(computed, prompt=computed, output=t_out)
            e, tokens = dcost.energy(d, h, p.model, w, step="prefill"), rate * computed
        else:
            mixed = pool.role == "aggregated"
            chunk = {"prefill_chunk": pool.chunk} if mixed and pool.chunk else {}
            d = dcost.Design(batch=max(pool.decode_batch, 1.0), **kw, **chunk)
            w = dcost.Workload(context, prompt=computed if mixed else t_in, output=t_out)
            e = dcost.energy(d, h, p.model, w, step="mixed" if mixed else "decode")
            tokens = rate * t_out
        above = float(e.power_per_chip) - idle
        total += min(tokens * float(e.energy_per_token) * above / float(e.power_per_chip),
                     pool.chips * above)  # fmt: skip
    return total


@pytest.mark.slow  # two plans of each mode
@pytest.mark.parametrize("mode", ["aggregated", "disaggregated"])
def test_fleet_power_by_hand_and_within_the_chips_limits(h100, mode):
    p = dcost.plan(h100, "llama-3.1-8b", dcost.traffic("chat", rate=20.0), mode=mode)
    e = dcost.plan_energy(p)
    assert e.power == pytest.approx(_by_hand(p), rel=1e-5)
    idle, top = float(h100.idle_power), float(h100.max_power)
    assert p.chips * idle < e.power < p.chips * top
    for role, chips, watts in e.pools:
        assert chips * idle <= watts <= chips * top, role
    assert sum(w for _, _, w in e.pools) == pytest.approx(e.power)
    tokens = 20.0 * float(p.traffic.output_tokens)
    assert e.energy_per_output_token == pytest.approx(e.power / tokens)
    assert e.tokens_per_mw == pytest.approx(1e6 / e.energy_per_output_token)
    # ten times the traffic on a larger fleet: the idle floor is shared by more tokens
    busy = dcost.plan(h100, "llama-3.1-8b", dcost.traffic("chat", rate=200.0), mode=mode)
    more = dcost.plan_energy(busy)
    assert more.energy_per_output_token < e.energy_per_output_token
    assert more.idle_power / more.power < e.idle_power / e.power


@pytest.mark.slow  # two busy plans
def test_a_busy_aggregated_fleet_stays_under_the_board_limit():
    """Llama 3 70B chat on H100 at 100 and 400 requests/s, pure physics: its aggregated replicas
    step all the time at nearly the chip's whole activity. Adding a decode step's activity and a
    prefill pass's (the form before 2026-12-01) gave 839 W and 793 W a chip against the board's
    700 W; the mixed step's joint utilisations keep every pool between floor and limit, and
    near the limit (a busy chip)."""
    h = dcost.hardware("h100-sxm")
    idle, top = float(h.idle_power), float(h.max_power)
    for rate in (100.0, 400.0):
        p = dcost.plan(h, "llama-3-70b", dcost.traffic("chat", rate=rate), mode="aggregated")
        e = dcost.plan_energy(p)
        assert e.power == pytest.approx(_by_hand(p), rel=1e-5)
        for role, chips, watts in e.pools:
            assert chips * idle < watts <= chips * top * (1 + 1e-6), (rate, role, watts / chips)
        assert e.power_per_chip > 0.95 * top  # replicas that step all the time at full activity


@pytest.mark.slow  # a plan of its own traffic
def test_a_busy_replica_steps_all_the_time_whatever_the_spread_of_its_outputs(h100):
    """By Little's law a replica whose mean batch is well above one steps all the time, so its
    activity power is that of its step, ``lambda T_out e = G (P - P_idle)`` a replica. Reasoning
    traffic's outputs spread (cv 1.5): the running batch holds the long ones longer, and priced
    at ``prompt + output/2`` (before 2026-12-01) its steps were a third shorter than the
    planner's, the replicas busy 64 % of the time; at the planner's context, 99 %."""
    from dcost.planning import energy as fleet

    p = dcost.plan(h100, "llama-3.1-8b", dcost.traffic("reasoning", rate=40.0), mode="aggregated")
    (pool,) = p.pools
    assert pool.decode_batch > 50
    t = p.traffic
    computed = float(t.prompt_tokens) * (1.0 - float(t.prefix_hit))
    w = dcost.Workload(
        float(fleet.workload_stats(t)[0]), prompt=computed, output=float(t.output_tokens)
    )
    _, above = fleet._activity_energy(pool, p, "mixed", w)  # W a chip above idle, stepping
    (role, chips, watts), idle = dcost.plan_energy(p).pools[0], float(h100.idle_power)
    busy = (watts - chips * idle) / (chips * above)
    assert role == "aggregated" and 0.95 < busy <= 1.0 + 1e-9


def test_an_infeasible_plan_has_no_fleet_to_power(h100):
    p = dcost.plan(h100, "llama-3.1-8b", dcost.traffic("chat", rate=1.0), tpot_slo=(1e-4, 0.9))
    assert not p.feasible
    with pytest.raises(dcost.SpecError, match="plan_energy: the plan is infeasible"):
        dcost.plan_energy(p)
    for bad, needle in (("x", "got str"), (None, "got NoneType"), (p.pools, "got tuple")):
        with pytest.raises(
            dcost.SpecError, match=f"plan_energy.plan must be a dcost.Plan.*{needle}"
        ):
            dcost.plan_energy(bad)


@pytest.mark.slow  # a plan from the command line
def test_cli_plan_prints_and_writes_the_energy(capsys):
    argv = ["plan", "--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--traffic", "chat",
            "--rate", "20", "--mode", "aggregated", "--calibrated", "--engine", "none"]  # fmt: skip
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "energy: " in text and "J per output token" in text
    assert main([*argv, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    h = dcost.hardware("h100-sxm", calibrated=True)
    p = dcost.plan(h, "llama-3.1-8b", dcost.traffic("chat", rate=20.0), mode="aggregated")
    assert out["energy"]["power"] == pytest.approx(dcost.plan_energy(p).power, rel=1e-6)
