"""The experiments' key numbers, each checked against something computed another way.

Each script in ``experiments/`` exposes ``compute() -> dict``; these tests call it with smaller
sweeps than the scripts use (same code path), and compare with closed forms written here from the
presets' own fields, with the DES closed form, or with an exhaustive search.
"""

import dataclasses
import json
import math
import pathlib
import sys

import numpy as np
import pytest

import dcost

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import _common  # noqa: E402
import balance_batch  # noqa: E402
import batch_curve  # noqa: E402
import bound_failures  # noqa: E402
import context_length  # noqa: E402
import deepep_all_to_all  # noqa: E402
import eager_floor  # noqa: E402
import fast_mode  # noqa: E402
import index_context  # noqa: E402
import latency_floor  # noqa: E402
import mlperf_server  # noqa: E402
import moe_racks  # noqa: E402
import moe_touched  # noqa: E402
import pipelines  # noqa: E402
import prompt_step_cost  # noqa: E402
import train_departures  # noqa: E402
import ttft_bands  # noqa: E402
import ttft_shortfall  # noqa: E402

MODULES = [
    batch_curve,
    balance_batch,
    latency_floor,
    train_departures,
    fast_mode,
    context_length,
    deepep_all_to_all,
    moe_racks,
    moe_touched,
    pipelines,
]


def f_over_bw(name):
    """F/BW of a hardware preset, from its fields (FLOP per byte)."""
    h = dcost.hardware(name)
    return float(h.flops) / float(h.hbm_bandwidth)


@pytest.fixture(scope="module")
def curve():
    return batch_curve.compute(max_batch=1e5, exact_up_to=8192)


@pytest.fixture(scope="module")
def balance():
    return balance_batch.compute()


@pytest.fixture(scope="module")
def floor():
    return latency_floor.compute(n_batches=8)


@pytest.fixture(scope="module")
def trains():
    return train_departures.compute(n_requests=30_000, loads=[0.01, 1.0, 30.0, 200.0])


@pytest.fixture(scope="module")
def fast():
    return fast_mode.compute(max_batch=25_000, n_log_batches=120)


@pytest.fixture(scope="module")
def context():
    return context_length.compute(n_contexts=41, n_batches=120)


@pytest.fixture(scope="module")
def racks():
    return moe_racks.compute(n_batches=100, max_chips={"h100-sxm": 64, "gb200-nvl72": 216})


@pytest.fixture(scope="module")
def stages():
    return pipelines.compute()


# batch_curve ---------------------------------------------------------------------------------


def test_batch1_cost_ratio_is_the_balance_batch_for_a_dense_model(curve):
    """Cost at B = 1 over the compute-bound floor = B* = (F/BW)(b_w/2), about 300 on B200."""
    d = curve["dense"]
    expected = f_over_bw(batch_curve.HARDWARE) * 2.0 / 2.0  # bf16 weights
    assert d["cost_ratio_batch1"] == pytest.approx(expected, rel=2e-3)
    assert d["balance_batch"] == pytest.approx(expected, rel=1e-4)
    assert d["knee"] == math.ceil(expected)  # first whole batch the exact model calls compute bound
    assert 150 < d["cost_ratio_batch1"] < 450


def test_moe_at_batch1_reads_only_k_experts(curve):
    """phi(1) = k/E: the batch-1 penalty stays F/BW; had all experts been read, F/BW x sparsity."""
    e = curve["moe"]
    m = dcost.model("deepseek-v3")
    assert e["phi_batch1"] == pytest.approx(float(m.experts_active / m.n_experts), rel=1e-5)
    # fp8 weights (1 byte) on fp8 FLOP/s (2 x bf16): (2 F / BW) (1/2) = F/BW of the preset
    base = f_over_bw(batch_curve.HARDWARE)
    assert e["cost_ratio_batch1"] == pytest.approx(base, rel=2e-3)
    # every expert read: the weights a step reads over those a token multiplies by, both
    # without the input embedding's 129,280 x 7,168 lookup table
    emb = 129_280 * 7168
    sparsity = (float(m.params_total) - emb) / (float(m.params_active) - emb)
    assert e["cost_ratio_batch1_all_experts"] == pytest.approx(base * sparsity, rel=2e-3)
    assert abs(e["knee"] - e["balance_batch"]) <= 1.0


# balance_batch -------------------------------------------------------------------------------


def test_balance_batch_is_300_x_sparsity_on_every_chip(balance):
    for i, name in enumerate(balance["hardware"]):
        ridge = f_over_bw(name)
        dense, moe = balance["dense"]["balance_batch"][i], balance["moe"]["balance_batch"][i]
        assert dense == pytest.approx(ridge, rel=1e-4)  # bf16: (F/BW)(2/2)
        # B* = (F/BW)(b_w/2)(N_total - N_emb)/(N_active - N_emb): the lookup table takes no
        # FLOPs and no read, so the ratio is the sparsity of the multiplied parameters (18.3 for
        # deepseek-v3, whose N_total/N_active is 17.9)
        assert moe / dense == pytest.approx(balance["moe"]["sparsity_multiplied"], rel=1e-4)
        assert balance["moe"]["sparsity_multiplied"] > balance["moe"]["sparsity"]
        assert 0.5 * 300 <= moe / balance["moe"]["sparsity"] <= 1.5 * 300, name
        # the exact roofline agrees: at B*, compute time equals weight + KV time
        assert balance["moe"]["compute_over_memory_at_bstar"][i] == pytest.approx(1.0, rel=1e-3)


# latency_floor -------------------------------------------------------------------------------


def test_latency_floor_is_capacity_over_bandwidth(floor):
    m = dcost.model(floor["model"])
    h_kv, t, b_kv = float(m.kv_heads), floor["context"], float(m.kv_bytes_per_token)
    weights = float(m.bytes_per_param * m.params_total)
    assert h_kv == 8.0  # llama-3-70b: GQA with 8 KV heads
    for i, name in enumerate(floor["hardware"]):
        h = dcost.hardware(name)
        expected = float(h.hbm_capacity) / float(h.hbm_bandwidth)
        assert floor["latency_floor_s"][i] == pytest.approx(expected, rel=1e-5)
        # tensor parallelism over G > h_kv chips holds the KV cache max(1, G/h_kv) times, so HBM
        # is full at B = floor((M G - b_w N) / (T b_kv rep)) and holds what decode says it holds
        g = floor["chips"][i]
        rep = max(1.0, g / h_kv)
        full = math.floor((float(h.hbm_capacity) * g - weights) / (t * b_kv * rep))
        assert floor["batch_full"][i] == pytest.approx(full, abs=1.0)
        held = weights / g + floor["batch_full"][i] * t * b_kv * rep / g
        assert floor["memory_full"][i] == pytest.approx(held, rel=1e-5)
        assert floor["memory_full"][i] <= float(h.hbm_capacity) * (1 + 1e-6)
        # the exact decode step with HBM full is memory bound and takes M/BW (less the last
        # partial sequence that did not fit)
        assert str(floor["bottleneck_full"][i]) == "memory"
        assert 0.98 * expected <= floor["tpot_full_s"][i] <= expected * (1 + 1e-5)
        assert 0.010 < expected < 0.045  # 10-45 ms on every chip (lecture: 15-20 ms)
    assert max(floor["chips"]) > h_kv  # the replication is exercised (tpu-v4, tpu-v5e)


# train_departures ----------------------------------------------------------------------------


@pytest.mark.slow
def test_train_departures_against_the_closed_form(trains):
    mean, worst = trains["closed_form_over_tau"]
    assert (mean, worst) == (1.5, 2.0)
    assert trains["fixed_mean_over_tau"] == pytest.approx(mean, rel=0.01)
    assert 0.99 * worst <= trains["fixed_worst_over_tau"] <= worst * (1 + 1e-5)
    tau, loads = trains["tau_s"], np.asarray(trains["load"])
    fixed = trains["fixed"]["mean_s"] / tau
    np.testing.assert_allclose(fixed, 1.5, rtol=0.02)  # at every load
    free = trains["when_free"]["mean_s"] / tau
    assert free[0] == pytest.approx(1.0, abs=0.02)  # idle server: leave on arrival
    assert free[-1] == pytest.approx(1.5, rel=0.02)  # saturated: back-to-back departures
    full = trains["when_full"]["mean_s"][0] / tau
    expected = (trains["capacity"] - 1) / (2 * loads[0]) + 1.0  # wait to fill, then one step
    assert full == pytest.approx(expected, rel=0.05)


# fast_mode -----------------------------------------------------------------------------------


def test_fast_mode_matches_the_memory_bound_closed_form(fast):
    """Past the critical context decode is memory bound at every batch, so
    ``tpot(B) = (b_w (N_dense + E n_e phi(B)) + B T b_kv) / (G BW)``; the cost-optimal batch fills
    the HBM, and the fast batch is the largest with ``tpot <= tpot_opt / 2.5``."""
    m, h = dcost.model("deepseek-v3"), dcost.hardware("gb200-nvl72")
    g, t = fast_mode.RACK, fast_mode.CONTEXT
    assert t > fast["critical_context"]
    bw, b_w, b_kv = float(h.hbm_bandwidth), float(m.bytes_per_param), float(m.kv_bytes_per_token)
    k, e = float(m.experts_active), float(m.n_experts)
    n_dense, n_moe = float(m.params_dense), e * float(m.params_per_expert)

    def tpot(b):
        phi = 1.0 - (1.0 - k / e) ** b
        return (b_w * (n_dense + n_moe * phi) + b * t * b_kv) / (g * bw)

    cap = (1 - fast_mode.MEMORY_RESERVE) * float(h.hbm_capacity)
    b_cap = math.floor((cap * g - b_w * float(m.params_total)) / (t * b_kv))
    opt, quick = fast["rack"]["opt"], fast["rack"]["fast"]
    assert opt["binding"] == "HBM capacity"
    assert abs(opt["batch"] - b_cap) <= 1e-3 * b_cap  # ties within float32 rounding
    assert opt["tpot_s"] == pytest.approx(tpot(opt["batch"]), rel=1e-4)
    b = np.arange(1.0, b_cap + 1.0)
    b_fast = b[tpot(b) <= tpot(opt["batch"]) / fast_mode.SPEEDUP].max()
    assert abs(quick["batch"] - b_fast) <= 2
    multiple = (tpot(b_fast) / b_fast) / (tpot(opt["batch"]) / opt["batch"])
    assert quick["cost_multiple"] == pytest.approx(multiple, rel=1e-3)
    assert 1.0 < quick["cost_multiple"] < fast_mode.LECTURE_PRICE  # far below the lecture's 6x


def test_fast_mode_free_chips_is_no_worse_than_one_rack(fast):
    assert fast["free"]["fast"]["cost_multiple"] < 2.0
    assert fast["free"]["opt"]["tpot_s"] <= fast_mode.TPOT_SLO


# context_length ------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dense", "moe"])
def test_critical_context_where_kv_bytes_meet_the_ridge(context, kind):
    r = context[kind]
    m = dcost.model(r["model"])
    h = dcost.presets.serving_hardware(r["hardware"], r["model"])
    # closed form from the fields: 2 N BW / (b_kv F - a BW), N = N_active - N_emb (the input
    # embedding's lookup table: vocabulary x width, 128,256 x 8,192 and 129,280 x 7,168)
    f, bw = float(h.flops), float(h.hbm_bandwidth)
    emb = {"llama-3-70b": 128256 * 8192, "deepseek-v3": 129_280 * 7168}[r["model"]]
    tc = (
        2
        * (float(m.params_active) - emb)
        * bw
        / (float(m.kv_bytes_per_token) * f - float(m.attn_flops_per_context_token) * bw)
    )
    assert r["critical_context"] == pytest.approx(tc, rel=1e-4)
    assert r["crossing"] == pytest.approx(tc, rel=0.01)  # numeric crossing of the curve
    assert tc > context["t0"]
    assert r["crossing_sparse"] == pytest.approx(tc**2 / context["t0"], rel=0.01)
    t = np.asarray(context["context"])
    long = t > 4 * r["critical_context_sparse"]
    assert np.all(r["mfu_sparse"][long] > r["mfu_full"][long])
    assert r["mfu_full"][-1] < 0.05 and r["mfu_full"][0] > 0.8


# moe_racks -----------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", ["h100-sxm", "gb200-nvl72"])
def test_pipeline_rule_crossing(racks, name):
    """dcost's t_comm = t_hop crossing is the lecture's 2 k L_stage = U/O (times G/(G-1))."""
    r = racks[name]
    h = dcost.hardware(name)
    u_over_o = float(h.scaleup_bandwidth / h.scaleout_bandwidth)
    s = float(h.scaleup_size)
    for k, (numeric, _) in r["rule"].items():
        assert numeric == pytest.approx(u_over_o / (2 * float(k)) * s / (s - 1), rel=1e-3)
    # deepseek-v3 (k = 8): a stage of one or two MoE layers already hides its hop
    assert r["rule"]["8"][0] < 2.0


@pytest.mark.slow
def test_expert_parallel_past_the_domain(racks):
    h100, gb = racks["h100-sxm"], racks["gb200-nvl72"]
    m = dcost.model("deepseek-v3")
    cap = (1 - moe_racks.MEMORY_RESERVE) * float(dcost.hardware("h100-sxm").hbm_capacity)
    need = (
        float(m.bytes_per_param * m.params_total + moe_racks.CONTEXT * m.kv_bytes_per_token) / cap
    )  # one sequence
    first = h100["ep"]["chips"][np.argmax(h100["ep"]["feasible"])]
    assert first == math.ceil(need) and first > h100["scaleup_size"]  # must spill past S = 8
    ep, pp = gb["ep"], gb["pp"]
    at = {c: i for i, c in enumerate(ep["chips"])}
    s = gb["scaleup_size"]
    assert ep["bottleneck"][at[2 * s]] == "comm"
    assert ep["cost"][at[2 * s]] > 2 * ep["cost"][at[s]]  # spilling the all-to-all is costly
    assert pp["cost"][1] < ep["cost"][at[2 * s]] / 2  # two pipeline stages of one rack are not
    assert pp["cost"][1] == pytest.approx(ep["cost"][at[s]], rel=0.05)


# pipelines -----------------------------------------------------------------------------------


def test_pipeline_weights_fall_kv_and_latency_do_not(stages):
    pl, tp = stages["pipeline"], stages["tensor"]
    n = stages["chips"]
    np.testing.assert_allclose(pl["weights_per_chip"] * n, pl["weights_per_chip"][0], rtol=1e-6)
    np.testing.assert_allclose(pl["kv_per_chip"], pl["kv_per_chip"][0], rtol=1e-6)
    np.testing.assert_allclose(pl["tpot_s"], pl["tpot_s"][0], rtol=0.01)
    # what decode holds per chip is the closed form's weights + KV (KV replicated past h_kv)
    for key in pipelines.STRATEGIES:
        r = stages[key]
        np.testing.assert_allclose(
            r["memory_per_chip"], r["weights_per_chip"] + r["kv_per_chip"], rtol=1e-5
        )
    # tensor parallel, memory bound: tpot(G) = (b_w N/G + B T b_kv/min(G, h_kv)) / BW, so
    # tpot(G)/tpot(1) = (W/G + K/min(G, h_kv)) / (W + K): KV stops falling at G = h_kv
    assert list(tp["bottleneck"]) == ["memory"] * len(n)
    m = dcost.model(stages["model"])
    h_kv = float(m.kv_heads)
    w = float(m.bytes_per_param * m.params_total)
    k = stages["batch"] * stages["context"] * float(m.kv_bytes_per_token)
    ratio = (w / n + k / np.minimum(n, h_kv)) / (w + k)
    np.testing.assert_allclose(tp["tpot_s"] / tp["tpot_s"][0], ratio, rtol=0.03)
    assert tp["tpot_s"][-1] > 2 * tp["tpot_s"][0] / n[-1]  # far from 1/G once G > h_kv
    assert not pl["fits"][0] and pl["fits"][1]  # one stage does not fit; two do


def test_moe_touched_fits_are_least_squares_and_the_slope_is_a_bandwidth():
    res = moe_touched.compute()
    for name, x in (
        ("touched", res["touched"]),
        ("one read per pair", res["batch"] * res["experts_active"]),
    ):
        slope, t0 = np.polyfit(x, res["experts_time"], 1)
        fit = res["fits"][name]
        assert fit["slope"] == pytest.approx(slope, rel=1e-9)
        assert fit["intercept"] == pytest.approx(t0, rel=1e-9, abs=1e-12)
    m = dcost.model(moe_touched.MODEL)
    per_expert = 2.0 * float(m.params_per_expert)  # bf16 bytes of one expert in every layer
    assert res["marginal_bandwidth"] == pytest.approx(
        per_expert / res["fits"]["touched"]["slope"], rel=1e-3
    )
    assert np.all(res["touched"] <= res["uniform_touched"] + 1e-9)  # a random router is less even
    assert res["fits"]["touched"]["rms"] < res["fits"]["every expert"]["rms"] / 4


def test_deepep_held_out_links_beat_the_profile_and_pure_is_a_bound():
    """Each rank count predicted by link fields fitted to the other five (held out) lands
    within 20 % of DeepEP's timing; pure physics stays below every timing; the profile's
    ratios are ``predict(calibrated=True)`` over the measurements."""
    from dcost.validation import collectives

    res = deepep_all_to_all.compute()
    y = res["measured"]
    assert np.all(res["pure"] <= y)
    assert np.all(np.abs(res["held_out"] / y - 1) < 0.2)
    ms = collectives.load()
    np.testing.assert_allclose(res["calibrated"], collectives.predict(ms, calibrated=True))
    assert deepep_all_to_all.log_rms(res["held_out"], y) < deepep_all_to_all.log_rms(
        res["calibrated"], y
    )


# plumbing ------------------------------------------------------------------------------------


@pytest.mark.parametrize("module", MODULES, ids=lambda m: m.__name__)
def test_scripts_have_the_standard_shape(module):
    assert callable(module.compute) and callable(module.plot) and callable(module.main)
    assert module.__doc__ and "Claim" in module.__doc__


@pytest.mark.slow
def test_plot_labels_every_axis_and_save_writes_png_and_json(trains, tmp_path):
    fig = train_departures.plot(trains)
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()
    png, js = _common.save(
        "demo", fig, {"x": np.float32(1.5), "inf": math.inf, "a": np.arange(3)}, directory=tmp_path
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert json.loads(js.read_text()) == {"x": 1.5, "inf": "inf", "a": [0, 1, 2]}


def test_mlperf_server_results_are_the_records_at_their_rates():
    """The committed MLPerf Server simulation covers every Server TTFT record: the NVIDIA ones
    simulated at the rate their Little's-law figures give (completed samples/s over instances),
    the AMD ones counted out with the reason; the docs' count of unstable runs is the file's,
    and a run marked stable at a lower share is one whose queue grew at the measured rate."""
    results = json.loads((EXPERIMENTS / "results" / "mlperf_server.json").read_text())
    recs = {r["id"]: r for r in mlperf_server.records()}
    simulated = {r["id"]: r for r in results["rows"]}
    counted_out = {r["id"] for r in results["out_of_scope"]}
    assert set(simulated) | counted_out == set(recs) and not set(simulated) & counted_out
    assert set(simulated) == set(mlperf_server.CONFIGS)
    for rid, row in simulated.items():
        r = recs[rid]
        rate = r["samples_per_s"] / r["instances"]
        assert row["rate_per_instance"] == pytest.approx(rate, rel=1e-5)
        assert row["measured_ttft"] == pytest.approx(r["value"], rel=1e-5)
        assert row["unstable"] == (row["stable_share"] is None or row["stable_share"] < 1.0)
        # a runtime that leaves host costs out names them (profile fields) and serves at least
        # the share the profile's costs serve: a cost taken away cannot slow a replica
        left_out = mlperf_server.CONFIGS[rid][3][0]
        assert row["host_costs_left_out"] == list(left_out)
        assert set(left_out) <= set(dcost.engines.PROFILE_FIELDS)
        as_profiled = row["stable_share_as_profiled"]
        if not left_out:
            assert as_profiled == row["stable_share"]
        elif row["stable_share"] is not None and as_profiled is not None:
            assert row["stable_share"] >= as_profiled
    for rid in counted_out:
        assert recs[rid]["hardware"].startswith("mi")
    unstable = sum(r["unstable"] for r in results["rows"])
    assert results["summary"]["unstable"] == unstable
    docs = (EXPERIMENTS.parent / "docs" / "engines.md").read_text()
    assert f"In **{unstable} of {len(simulated)} the\nsimulated queue grows" in docs
    # the shares the docs quote are the file's, to the experiment's resolution
    for row in results["rows"]:
        if row["unstable"] and row["stable_share"] is not None:
            assert f"{100 * row['stable_share']:.1f} %" in " ".join(docs.split())


def test_mlperf_stable_share_finds_the_capacity_to_its_resolution(monkeypatch):
    """``_stable_share`` against a replica whose queue grows above a known share of the rate:
    the share it gives is steady and within ``RESOLUTION`` below that capacity, for capacities
    between the coarse steps and on one; a replica steady at every rate from ``first`` gives
    ``first`` (1.0 when asked from 1.0), and one steady at none gives None."""
    for capacity in (0.943, 0.71, 0.5, 0.999, 1.2, 0.1):
        calls: list[float] = []

        def sim(r, share, profiled=False, calls=calls):
            calls.append(share)
            return share

        monkeypatch.setattr(mlperf_server, "simulate", sim)
        monkeypatch.setattr(mlperf_server, "_growing", lambda share, c=capacity: share > c)
        got = mlperf_server._stable_share({}, first=1.0)
        if capacity < 0.2:
            assert got is None
        elif capacity >= 1.0:
            assert got == 1.0 and calls == [1.0]
        else:
            assert got <= capacity < got + mlperf_server.RESOLUTION + 1e-9, (capacity, got)
            assert len(calls) <= 10


def test_mlperf_runtimes_leave_out_the_host_costs_they_name():
    """``engine_for`` gives the chip 0 for the fields a submission's runtime does not pay (the
    cost of a step with prompt tokens through ``Scheduler.prompt_graphs``) and keeps the rest;
    with ``profiled=True`` the engine is the shipped one (whose host costs are not 0, or
    leaving them out would test nothing)."""
    for r in mlperf_server.records():
        if r["id"] not in mlperf_server.CONFIGS:
            continue
        left_out = mlperf_server.CONFIGS[r["id"]][3][0]
        lean, shipped = mlperf_server.engine_for(r), mlperf_server.engine_for(r, profiled=True)
        chip = dcost.hardware(r["hardware"])
        mine, theirs = lean.fields(chip), shipped.fields(chip)
        assert set(mine) == set(theirs)
        for field, value in theirs.items():
            if field in left_out:
                assert value > 0 and mine[field] == 0.0, (r["id"], field)
            else:
                assert mine[field] == value, (r["id"], field)
        assert lean.scheduler.prompt_graphs == ("prefill_step_overhead" in left_out)
        assert dataclasses.replace(lean.scheduler, prompt_graphs=False) == shipped.scheduler


def test_bound_failures_are_the_shipped_count_each_with_its_reason():
    """The committed list of runs where pure physics is not a bound has as many rows as the
    shipped held-out summary counts (``heldout.toml``: rows less ``bound_holds``), each with
    pure physics above the measured TPOT and the first reason its own ratios give; the docs
    quote the counts."""
    results = json.loads((EXPERIMENTS / "results" / "bound_failures.json").read_text())
    pure = dcost.engines.heldout()["tpot"]["pure"]
    assert results["rows"] == pure["rows"]
    assert results["bound_holds"] == pure["bound_holds"]
    assert len(results["failures"]) == pure["rows"] - pure["bound_holds"]
    assert sum(results["by_reason"].values()) == len(results["failures"])
    for x in results["failures"]:
        assert x["pure_over_measured"] > 1.0
        stated, little = x["decode_stated_over_measured"], x["decode_little_over_measured"]
        fp8 = x["decode_fp8_kv_over_measured"]
        if stated <= 1.0:
            first = "prompt work in TTFT"
        elif little is not None and little <= 1.0:
            first = "queued"
        elif fp8 is not None and fp8 <= 1.0:
            first = "KV cache assumed bf16"
        else:
            first = "not as stated"
        assert x["reason"] == first, x["id"]
        if x["running_little"] is not None:  # Little's law from the run's own figures
            assert x["running_little"] == pytest.approx(
                bound_failures.little_running(
                    x["clients"], x["output_tokens"], x["measured_ttft"], x["measured_tpot"]
                ),
                rel=1e-4,  # the JSON keeps 6 significant digits
            )
    docs = (EXPERIMENTS.parent / "docs" / "engines.md").read_text()
    n = len(results["failures"])
    assert f"on {n} of the {results['rows']:,} TPOT runs pure" in docs
    assert (
        f"pure physics is a bound on {results['bound_holds']:,} of the {results['rows']:,}" in docs
    )
    counts = results["by_reason"]
    assert f"**{counts['prompt work in TTFT']} put their prompt work in TTFT**" in docs
    assert f"**{counts['queued']} queued**" in docs
    assert f"**{counts['KV cache assumed bf16']} hold with an fp8 KV cache**" in docs
    assert f"**{counts['not as stated']} are not as stated**" in docs


def test_a_growing_queue_is_told_from_a_steady_one():
    """``_growing`` on synthetic runs: TTFT rising with arrival time (a queue filling at a steady
    pace) is unstable, a flat noisy one is not."""
    rng = np.random.default_rng(0)
    arrival = np.sort(rng.uniform(0.0, 100.0, 4000))

    class Run:
        def __init__(self, ttft):
            self.arrival, self.ttft = arrival, ttft

    assert mlperf_server._growing(Run(0.05 + 0.3 * arrival))
    assert not mlperf_server._growing(Run(rng.gamma(4.0, 0.05, arrival.size)))


def _shortfall_row(
    engine, model, layers, split, measured, simulated, concurrency=8.0, moe_layers=0.0
):
    return {
        "engine": engine,
        "model": model,
        "layers": layers,
        "moe_layers": moe_layers,
        "concurrency": concurrency,
        "measured": measured,
        "simulated": simulated,
        "split": split,
    }


def test_ttft_shortfall_is_fitted_on_other_models_and_recovers_a_cost_a_layer():
    """Runs whose simulated TTFT lacks exactly 1 ms a layer: the per-layer estimate recovers
    it on the test split (no error left) where a constant a request cannot. A model's own
    training runs and heavy loads never set a value: c's value is a's 1 ms, where c's own run
    (5 ms a layer) would make the median 3 ms, and a run at concurrency 64 is left out."""
    e = 1e-3
    own = _shortfall_row("vllm", "c", 61.0, "seen", 0.3 + 61 * 5 * e, 0.3)
    heavy = _shortfall_row("vllm", "d", 40.0, "seen", 9.0, 0.1, concurrency=64.0)
    a_train = _shortfall_row("vllm", "a", 32.0, "seen", 0.1 + 32 * e, 0.1)
    c_test = _shortfall_row("vllm", "c", 61.0, "fresh", 0.3 + 61 * e, 0.3)
    assert ttft_shortfall.value([own, heavy, a_train, c_test], c_test, "per_layer") == (
        pytest.approx(e)
    )
    rows = [
        a_train,
        _shortfall_row("vllm", "b", 80.0, "held_out", 0.2 + 80 * e, 0.2),
        c_test,
        _shortfall_row("vllm", "a", 32.0, "fresh", 0.05 + 32 * e, 0.05),
    ]
    out = ttft_shortfall.evaluate(rows)
    assert out["per_layer"]["all"]["median"] == pytest.approx(0.0, abs=1e-12)
    assert out["per_layer"]["vllm"]["value"] == pytest.approx(e)
    assert out["simulated"]["all"]["median"] > 0.2
    assert out["per_request"]["all"]["median"] > 0.05  # one constant cannot fit 32 and 61 layers
    # dense runs have no MoE layer: they set no per-MoE-layer value and gain nothing from it
    assert out["per_moe_layer"]["vllm"]["value"] == 0.0
    assert out["per_moe_layer"]["all"]["median"] == pytest.approx(out["simulated"]["all"]["median"])


def test_ttft_shortfall_per_moe_layer_leaves_dense_runs_and_splits_by_kind():
    """A cost of 2 ms a MoE layer, fitted on another mixture of experts' runs, is recovered for
    a held-out one, a dense model's run gains nothing, and ``by_kind`` reports the dense and
    MoE shortfalls apart."""
    e = 2e-3
    rows = [
        _shortfall_row("trtllm", "m1", 61.0, "seen", 0.1 + 58 * e, 0.1, moe_layers=58.0),
        _shortfall_row("trtllm", "d1", 80.0, "seen", 0.2, 0.2),
        _shortfall_row("trtllm", "m2", 36.0, "fresh", 0.05 + 36 * e, 0.05, moe_layers=36.0),
        _shortfall_row("trtllm", "d2", 32.0, "fresh", 0.1, 0.1),
    ]
    out = ttft_shortfall.evaluate(rows)
    assert out["per_moe_layer"]["trtllm"]["value"] == pytest.approx(e)
    assert out["per_moe_layer"]["all"]["median"] == pytest.approx(0.0, abs=1e-12)
    assert out["per_layer"]["all"]["median"] > 0.1  # a cost every layer pays misses both
    kinds = ttft_shortfall.by_kind(rows)["trtllm"]
    assert kinds["moe"]["median"] == pytest.approx(0.5 * (58 + 36) * e)
    assert kinds["dense"]["median"] == pytest.approx(0.0) and kinds["dense"]["runs"] == 2


def test_ttft_shortfall_committed_result_is_what_the_committed_runs_give():
    """``results/ttft_shortfall.json`` is ``compute()`` of the committed under-load runs, and its
    simulated errors are ``serving_under_load.json``'s own never-seen figures."""
    got = ttft_shortfall.compute()
    saved = json.loads(ttft_shortfall.OUT.read_text())
    assert json.loads(json.dumps(got)) == saved
    fresh = json.loads(ttft_shortfall.SOURCE.read_text())["splits"]["fresh"]["ttft"]
    assert got["results"]["simulated"]["all"]["median"] == pytest.approx(fresh["median"])
    assert got["results"]["simulated"]["all"]["p90"] == pytest.approx(fresh["p90"])


def test_engines_page_quotes_the_ttft_shortfall_as_committed():
    """``docs/engines.md`` quotes ``results/ttft_shortfall.json``'s never-seen figures."""
    saved = json.loads(ttft_shortfall.OUT.read_text())["results"]
    page = " ".join((EXPERIMENTS.parent / "docs" / "engines.md").read_text().split())

    def pct(block, engine="all", stat="median"):
        return f"{100 * block[engine][stat]:.1f} %"

    sim, layer, request = saved["simulated"], saved["per_layer"], saved["per_request"]
    for phrase in (
        f"goes from {pct(sim)} to {pct(layer)} off (p90 {pct(sim, stat='p90')} to "
        f"{pct(layer, stat='p90')})",
        f"vLLM's from {pct(sim, 'vllm')} to {pct(layer, 'vllm')} with "
        f"{1e3 * layer['vllm']['value']:.2f} ms a layer",
        f"SGLang's from {pct(sim, 'sglang')} to {pct(layer, 'sglang')} with "
        f"{1e3 * layer['sglang']['value']:.1f} ms",
        f"{pct(sim, 'trtllm')} to {pct(layer, 'trtllm')}",
        f"gives {pct(request)} ({pct(request, stat='p90')})",
    ):
        assert phrase in page, phrase
    # the light-load excess by network, at 1-8 clients (``by_model``)
    few = json.loads(ttft_shortfall.OUT.read_text())["light_load_by_model"]

    def ms(engine, network):
        return f"{1e3 * few[engine][network]['median']:.0f} ms"

    for phrase in (
        f"{ms('sglang', 'deepseek-r1')} for DeepSeek-R1 and V3 under SGLang "
        f"({few['sglang']['deepseek-r1']['runs']} runs)",
        f"{ms('trtllm', 'deepseek-r1')} under TensorRT-LLM "
        f"({few['trtllm']['deepseek-r1']['runs']})",
        f"{ms('sglang', 'qwen3-235b-a22b')} for Qwen3-235B under SGLang",
        f"{ms('vllm', 'kimi-k2')} for Kimi K2.5 under vLLM",
        f"{ms('vllm', 'minimax-m2.5')} for MiniMax-M2.5 under vLLM "
        f"({few['vllm']['minimax-m2.5']['runs']})",
        f"{ms('vllm', 'gpt-oss-120b')} for gpt-oss-120b under vLLM (6) and "
        f"{ms('trtllm', 'gpt-oss-120b')} under TensorRT-LLM",
        f"{ms('vllm', 'llama-3.3-70b')} and {ms('trtllm', 'llama-3.3-70b')} for Llama 3.3 70B",
        f"{ms('trtllm', 'llama-3.1-8b')} for Llama 3.1 8B under TensorRT-LLM",
    ):
        assert phrase in page, phrase


def _silicon_like(charge_a_layer: float):
    """Synthetic ``silicon.Predictions`` of 3 models' TPOT rows whose measured values hold a
    step cost, a layer cost and ``charge_a_layer`` (s) a layer on each step with prompt tokens;
    the last row is disaggregated."""
    from dcost.validation.silicon import Predictions

    rng = np.random.default_rng(1)
    names = {"llama-3.1-8b": 32.0, "qwen3-32b": 64.0, "llama-3.3-70b": 80.0}
    recs, layers = [], []
    for name, n_layers in names.items():
        for c in (1, 4, 16, 64, 128, 256):
            recs.append(
                {
                    "metric": "tpot",
                    "engine": "vllm",
                    "hardware": "h100-sxm",
                    "mode": "agg",
                    "model": name,
                    "concurrency": c,
                    "source": "synthetic",
                }
            )
            layers.append(n_layers)
    recs[-1]["mode"] = "disagg"
    n = len(recs)
    layers = np.asarray(layers)
    steps = rng.uniform(1.0, 1.5, n)
    prompt_steps = steps * rng.uniform(0.01, 0.2, n)
    base = rng.uniform(0.005, 0.02, n)
    charged = np.array([r["mode"] == "agg" for r in recs])  # a disaggregated row's admissions
    measured = base + 1e-3 * steps + 2e-5 * layers * steps
    measured = measured + charge_a_layer * layers * prompt_steps * charged
    pred = Predictions(
        records=recs,
        measured=measured,
        pure=0.5 * base,
        family=np.full(n, np.nan),
        engine_base=base,
        per_step=steps,
        per_layer=layers * steps,
        per_sequence=np.zeros(n),
        per_prefill_step=prompt_steps,
        engine_label=["vllm-x"] * n,
    )
    return pred, layers


def test_prompt_step_cost_charges_aggregated_prompt_steps_and_refits_held_out():
    """Rows that do hold 1 ms a layer on each prompt step: charged with it, the refitted TPOT
    is exact (each model predicted from the other two); uncharged, a cost a prompt step cannot
    stand for it across 32 to 80 layers. ``charged`` leaves the disaggregated row alone."""
    pred, layers = _silicon_like(1e-3)
    agg = np.array([r["mode"] == "agg" for r in pred.records])
    with_it = prompt_step_cost.charged(pred, layers, 1e-3, agg)
    assert with_it.engine_base[-1] == pred.engine_base[-1]
    assert with_it.engine_base[0] == pytest.approx(
        pred.engine_base[0] + 1e-3 * layers[0] * pred.per_prefill_step[0]
    )
    right = prompt_step_cost.held_out_tpot(with_it)["tpot"]
    wrong = prompt_step_cost.held_out_tpot(pred)["tpot"]
    assert right["all"]["median"] < 0.02
    assert wrong["all"]["median"] > 0.05


def test_prompt_step_cost_committed_result_charges_the_shortfalls_fitted_values():
    """``results/prompt_step_cost.json`` charged the values ``results/ttft_shortfall.json``
    fitted, and the engines page quotes its TPOT figures."""
    saved = json.loads(prompt_step_cost.OUT.read_text())
    short = json.loads(ttft_shortfall.OUT.read_text())["results"]
    for form in prompt_step_cost.FORMS:
        for engine, v in saved[form]["values"].items():
            assert v == short[form][engine]["value"]
    page = " ".join((EXPERIMENTS.parent / "docs" / "engines.md").read_text().split())

    def pct(block, stat="median"):
        return f"{100 * block['tpot']['all'][stat]:.1f} %"

    shipped, layer, moe = saved["shipped"], saved["per_layer"], saved["per_moe_layer"]
    phrase = (
        f"from {pct(shipped)} ({pct(shipped, 'p90')}) to {pct(layer)} ({pct(layer, 'p90')}) a "
        f"layer and {pct(moe)} ({pct(moe, 'p90')}) a MoE layer"
    )
    assert phrase in page, phrase
    lone = [f"{100 * b['ttft']['all']['median']:.1f} %" for b in (shipped, layer, moe)]
    phrase = f"lone-prefill TTFT rows go from {lone[0]} to {lone[1]} and {lone[2]} off"
    assert phrase in page, phrase
    held = dcost.engines.heldout()["ttft"]["overall"]  # the shipped figure, the same rows
    assert shipped["ttft"]["all"]["median"] == pytest.approx(held["median"], rel=1e-5)


def _floor_row(model, split, moe, measured, per_value, concurrency=8, tpot=0.01):
    """A run whose simulated TTFT at grid value ``h`` is ``0.1 + per_value * h`` (a MoE model)
    or 0.1 at every value (dense)."""
    grid = np.asarray(eager_floor.GRID)
    sims = 0.1 + (per_value * grid if moe else 0.0 * grid)
    return {
        "engine": "vllm",
        "model": model,
        "moe": moe,
        "concurrency": concurrency,
        "split": split,
        "measured": measured,
        "tpot": tpot,
        "simulated": sims.tolist(),
        "simulated_tpot": [tpot] * len(grid),
    }


def test_eager_floor_chooses_on_other_models_at_light_load_and_scores_seed_2():
    """The value a never-seen MoE run gets is the grid value that fits the other MoE models'
    light-load runs (1 ms here: 0.1 s + 60 x 1 ms measured), never its own model's (which wants
    4 ms) nor a heavy run's; with it the run is exact, and a dense run is simulated as it was."""
    h = 1e-3
    rows = [
        _floor_row("a", "seen", True, 0.1 + 60 * h, 60.0),
        _floor_row("c", "seen", True, 0.1 + 60 * 4e-3, 60.0),
        _floor_row("b", "held_out", True, 5.0, 60.0, concurrency=64),
        _floor_row("c", "fresh", True, 0.1 + 60 * h, 60.0),
        _floor_row("d", "fresh", False, 0.2, 0.0),
    ]
    assert eager_floor.choose([rows[0]]) == h
    assert eager_floor.choose([]) == 0.0
    out = eager_floor.evaluate(rows)
    assert out["values"]["vllm"] == h
    floor, plain = out["floor"]["ttft"]["all"], out["simulated"]["ttft"]["all"]
    assert floor["runs"] == 2 and plain["runs"] == 2
    assert sorted([floor["median"], plain["median"]])[0] == floor["median"]
    assert out["floor"]["ttft"]["vllm"]["p90"] == pytest.approx(0.45, abs=0.01)  # the dense run
    assert out["simulated"]["ttft"]["vllm"]["bias"] == pytest.approx(
        np.median([0.1 / (0.1 + 60 * h), 0.1 / 0.2])
    )


def test_eager_floor_committed_result_without_a_floor_is_the_committed_simulation():
    """``results/eager_floor.json`` at h = 0 is ``serving_under_load.json``'s never-seen TTFT
    and TPOT, and the engines page quotes its held-out figures."""
    table = json.loads(eager_floor.OUT.read_text())
    saved = table["results"]
    assert eager_floor.evaluate(table["runs"]) == saved  # its figures are its runs'
    fresh = json.loads(ttft_shortfall.SOURCE.read_text())["splits"]["fresh"]
    for metric in ("ttft", "tpot"):
        assert saved["simulated"][metric]["all"]["median"] == pytest.approx(fresh[metric]["median"])
    page = " ".join((EXPERIMENTS.parent / "docs" / "engines.md").read_text().split())

    def pct(label, metric, stat="median", engine="all"):
        return f"{100 * saved[label][metric][engine][stat]:.1f} %"

    phrase = (
        f"TTFT from {pct('simulated', 'ttft')} to {pct('floor', 'ttft')} "
        f"(p90 {pct('simulated', 'ttft', 'p90')} to {pct('floor', 'ttft', 'p90')}), its TPOT "
        f"from {pct('simulated', 'tpot')} to {pct('floor', 'tpot')} "
        f"(p90 {pct('simulated', 'tpot', 'p90')} to {pct('floor', 'tpot', 'p90')})"
    )
    assert phrase in page, phrase


def _band_row(engine, moe, clients, ratio, split="seen"):
    return {"engine": engine, "moe": moe, "concurrency": clients, "ratio": ratio, "split": split}


def test_ttft_bands_by_engine_kind_and_load_pool_thin_groups_and_check_coverage():
    """Nine dense light-load runs of ratios 1..9 give the band 1-9x (n = 9: the extremes), the
    median 5x; an engine with too few runs of a kind and load takes every engine's runs of that
    kind and load (pooled: vLLM's one MoE run with SGLang's eight), never the other kind's; a
    kind and load with too few runs on every engine has none. Coverage counts a held-out run in
    its band."""
    rows = [_band_row("vllm", False, 4, float(r)) for r in range(1, 10)]
    rows += [_band_row("vllm", True, 8, 20.0)]
    rows += [_band_row("sglang", True, 8, float(r)) for r in range(30, 38)]
    rows += [_band_row("vllm", False, 64, 1.0)]
    table = ttft_bands.bands(rows)
    dense = table["vllm"]["dense"]["light"]
    assert (dense["q10"], dense["q50"], dense["q90"], dense["pooled"]) == (1.0, 5.0, 9.0, False)
    moe = table["vllm"]["moe"]["light"]
    assert moe["pooled"] and moe["runs"] == 9 and (moe["q10"], moe["q90"]) == (20.0, 37.0)
    assert not table["sglang"]["moe"]["light"]["pooled"]
    # SGLang's dense band is vLLM's dense runs', not its own MoE runs'
    sg = table["sglang"]["dense"]["light"]
    assert sg["pooled"] and (sg["q10"], sg["q90"], sg["runs"]) == (1.0, 9.0, 9)
    assert "heavy" not in table["vllm"]["dense"]
    cov = ttft_bands.coverage(
        table,
        [
            _band_row("vllm", False, 2, 3.0),
            _band_row("vllm", False, 2, 30.0),
            _band_row("vllm", False, 100, 1.0),
        ],  # fmt: skip
    )
    assert cov["all"] == {"runs": 2, "share": 0.5} and cov["no_band"] == 1


def test_ttft_bands_shipped_table_is_what_the_committed_runs_give():
    """``dcost/engines/ttft_bands.toml`` (what ``dcost simulate`` quotes) and
    ``results/ttft_bands.json`` are ``compute()`` of the committed under-load runs, and the
    engines page quotes the never-seen coverage."""
    got = ttft_bands.compute()
    saved = json.loads(ttft_bands.OUT.read_text())
    assert json.loads(json.dumps(got)) == saved
    shipped = dcost.engines._ttft_bands()
    for eng, kinds in got["bands"].items():
        for kind, loads in kinds.items():
            for load, band in loads.items():
                for key, value in band.items():
                    assert shipped[eng][kind][load][key] == pytest.approx(value, rel=1e-5)
    page = " ".join((EXPERIMENTS.parent / "docs" / "engines.md").read_text().split())
    cov = saved["coverage"]
    phrase = (
        f"held {100 * cov['all']['share']:.0f} % of the never-seen runs (vLLM "
        f"{100 * cov['vllm']['share']:.0f} %, SGLang {100 * cov['sglang']['share']:.0f} %, "
        f"TensorRT-LLM {100 * cov['trtllm']['share']:.0f} %)"
    )
    assert phrase in page, phrase


def test_index_context_pairs_rows_with_and_without_the_indexer_and_fits_the_growth():
    """A table whose indexer costs 30 us and 1 ns a context token (with a faster and a slower
    row without it for each shape: the fastest is the pair's): the pairs are exact, the fit
    recovers both at up to 16 sequences and 16,384 tokens, and the big rows (64 sequences, or
    a million tokens) never enter it."""
    batch = np.array([1.0, 4.0, 16.0, 64.0, 1.0])
    ctx = np.array([1024.0, 8192.0, 16384.0, 8192.0, 1e6])
    gap = 3e-5 + 1e-9 * ctx + np.array([0, 0, 0, 5e-4, 5e-4])  # the big rows off the line
    skip = 1e-4 * np.ones(5)
    n = len(batch)
    table = {
        "kernel_source": np.array(["dsa_indexer"] * n + ["dsa_skip_indexer"] * 2 * n),
        "num_heads": np.full(3 * n, 8.0),
        "batch_size": np.tile(batch, 3),
        "step": np.tile(ctx, 3),
        "kv_cache_dtype": np.array(["fp8"] * 3 * n),
        "gemm_type": np.array(["bfloat16"] * 3 * n),
        "tp_size": np.full(3 * n, 8.0),
        "latency": 1e3 * np.concatenate([skip + gap, skip, 2 * skip]),  # ms
    }
    b, t, d = index_context.pairs(table)
    assert np.allclose(d, gap, rtol=1e-9)
    f = index_context.fit_growth(b, t, d)
    assert f["rows"] == 3
    assert f["alpha"] == pytest.approx(1e-9, rel=1e-6) and f["c"] == pytest.approx(3e-5, rel=1e-6)


def test_engines_page_quotes_the_index_growth_as_committed():
    """``docs/engines.md`` quotes ``results/index_context.json``'s GLM-5 figures (the experiment
    needs AIConfigurator's tables, which the test machine may not have)."""
    saved = json.loads(index_context.OUT.read_text())["glm5"]
    page = " ".join((EXPERIMENTS.parent / "docs" / "engines.md").read_text().split())
    a, b = saved["shipped"], saved["with_growth"]
    a8, b8 = saved["prompts_8k"]["shipped"], saved["prompts_8k"]["with_growth"]
    phrase = (
        f"from {100 * a['median']:.1f} % to {100 * b['median']:.1f} % off ({a['bias']:.2f}x to "
        f"{b['bias']:.2f}x; the 8,192-token prompts from {100 * a8['median']:.1f} % to "
        f"{100 * b8['median']:.1f} %)"
    )
    assert phrase in page, phrase
    held = dcost.engines.heldout()["tpot"]["by_model"]["glm-5"]
    assert a["median"] == pytest.approx(held["median"], rel=1e-4)  # the shipped figure


def test_engines_page_quotes_the_prior_spread_scan():
    """``docs/engines.md`` quotes ``results/prior_spread.json`` (``experiments/prior_spread.py``):
    the deployments' k = 3 error under each scaled prior and the empirical-Bayes halves, and the
    published groups' under a tenth of the spread; and the scan's unscaled prior is the one
    ``dcost.calibrate.user`` ships."""
    saved = json.loads((EXPERIMENTS / "results" / "prior_spread.json").read_text())
    page = " ".join((EXPERIMENTS.parent / "docs" / "engines.md").read_text().split())

    def pct(x):
        return f"{100 * x:.1f} %"

    k3 = {s: v["silicon_k3"]["median"] for s, v in saved["scales"].items()}
    assert (
        f"every spread scaled by 0.1 or 0.3 gave {pct(k3['0.1'])} and {pct(k3['0.3'])} at k = 3, "
        f"by 3 or 10 {pct(k3['3'])} and {pct(k3['10'])}, against {pct(k3['1'])} as shipped"
    ) in page
    eb = [c["empirical_bayes"]["silicon_k3"]["median"] for c in saved["empirical_bayes_cross"]]
    ship = [c["shipped"]["silicon_k3"]["median"] for c in saved["empirical_bayes_cross"]]
    assert (f"gave {pct(eb[0])} and {pct(eb[1])} against {pct(ship[0])} and {pct(ship[1])}") in page
    tenth = saved["scales"]["0.1"]["published_k3"]
    assert f"({pct(tenth['several_models'])} at k = 3)" in page
    assert f"more ({pct(tenth['one_model'])} and {pct(k3['0.1'])};" in page
    # the scan's shipped prior is the shipped one
    from dcost.calibrate import user

    assert saved["shipped_prior_sd"] == dict(
        zip(user.FIELDS, user._prior_sd().tolist(), strict=True)
    )


def test_engines_page_quotes_the_own_runs_under_load_table():
    """``docs/engines.md``'s table of a deployment's own runs calibrating its TTFT under load is
    ``results/own_runs_under_load.json``'s summary (python experiments/own_runs_under_load.py
    writes it), row by row: median (p90) of TTFT and TPOT for each variant."""
    saved = json.loads((EXPERIMENTS / "results" / "own_runs_under_load.json").read_text())
    s = saved["summary"]["all"]
    page = (EXPERIMENTS.parent / "docs" / "engines.md").read_text().replace("**", "")
    i = page.index("| from 3 own runs | TTFT | TPOT |")
    rows = [line for line in page[i:].splitlines()[2:] if line.startswith("|")][:5]

    def cell(block):
        return f"{100 * block['median']:.1f} % ({100 * block['p90']:.0f} %)"

    for line, variant in zip(
        rows, ("shipped", "tpot", "compute", "frontend", "order"), strict=True
    ):
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[1:] == [cell(s[f"ttft_{variant}"]), cell(s[f"tpot_{variant}"])], variant
    assert f"3 runs calibrate, {s['runs']} others held out" in " ".join(page.split())
