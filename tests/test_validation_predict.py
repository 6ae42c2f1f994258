"""``dcost.validation.predict`` (``dcost/validation/cases.py``) and the calibration by family
(``dcost.calibrate.families``).

The pure-physics predictions are bounds, checked on every shipped record; the mapping of a record
to specs is checked by hand on two records; the held-out (leave-one-source-out) summary may not
regress by more than 2 points against the figures shipped in ``calibration.toml``.
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost
import dcost.validation as v
from dcost._toml import read_toml
from dcost.calibrate import families
from dcost.specs import SpecError
from dcost.validation.cases import TIME_METRICS, attention_rate, case, predict, waves


@pytest.fixture(scope="module")
def records():
    return v.load()


def _by_id(records, rid):
    return next(r for r in records if r["id"] == rid)


def test_pure_physics_is_a_bound_on_every_record(records):
    # Peak rates, no overheads, balanced experts: every term left out only adds time, so a
    # measured time is never shorter than predicted and a measured throughput never higher.
    pure = families.pure_predictions(records)
    measured = np.array([r["value"] for r in records])
    time = np.array([r["metric"] in TIME_METRICS for r in records])
    broken = [
        (r["id"], p / r["value"])
        for r, p, t in zip(records, pure, time, strict=True)
        if (p > r["value"] * (1 + 1e-5) if t else p < r["value"] * (1 - 1e-5))
    ]
    assert not broken, broken
    assert np.all(np.isfinite(pure)) and np.all(pure > 0) and pure.shape == measured.shape


@pytest.mark.parametrize("index", [0, 20, 60, 100, 140])
def test_one_record_eagerly_equals_the_batched_path(records, index):
    r = records[index]
    batched = families.pure_predictions([r])[0]
    assert predict(r) == pytest.approx(batched, rel=1e-4)


def test_a_finite_run_is_its_tokens_over_its_waves_time(records):
    # N requests of fixed lengths through c slots: k = N // c full waves at batch c and one of
    # r = N - k c at batch r; each wave runs OSL steps at its own batch, so the run's throughput
    # is N / (k c / X(c) + r / X(r)), X(b) the steady-state throughput at concurrency b.
    base = next(r for r in records if r["id"] == "trtllm-gpt-oss-120b-h200-tp1-1024-1024")
    steady = {k: v for k, v in base.items() if k != "requests"}
    c = steady["concurrency"]
    x_c = predict(steady)
    runs = (c, 2 * c, 3 * c + 211, c + 1)
    batched = families.pure_predictions([dict(steady, requests=n) for n in runs])
    for n, fit_path in zip(runs, batched, strict=True):
        k, r = divmod(n, c)
        x_r = predict(dict(steady, concurrency=r)) if r else x_c
        expected = n / (k * c / x_c + r / x_r)
        got = predict(dict(steady, requests=n))
        assert got == pytest.approx(expected, rel=1e-6)
        assert got <= x_c * (1 + 1e-9)  # a partial wave only costs: its batch is smaller
        assert fit_path == pytest.approx(got, rel=1e-4)  # the fit's batched path agrees
    # the calibrated mode combines its waves the same way
    n = c + 100
    want = n / (c / predict(steady, True) + 100 / predict(dict(steady, concurrency=100), True))
    assert predict(dict(steady, requests=n), calibrated=True) == pytest.approx(want, rel=1e-6)


def test_a_last_wave_smaller_than_the_slots_takes_one_sequence_per_slot(records):
    # llama-3.3-70b on 2 x H200 at tensor parallel 2 is one replica; on the same chips at
    # tensor parallel 1 it is two replicas side by side: a last wave of 1 request leaves a slot
    # idle and takes as long as a wave of 2.
    base = next(r for r in records if r["id"] == "trtllm-llama-3.3-70b-h200-tp2-1000-1000")
    two = dict(base, tensor_parallel=1, concurrency=64)
    assert [w["concurrency"] for _, w in waves(dict(two, requests=65))] == [64, 2]
    assert [w["concurrency"] for _, w in waves(dict(base, concurrency=64, requests=65))] == [64, 1]


def test_case_of_deepseeks_decode_pool_by_hand(records):
    # DeepSeek's day-6 decode pool: EP144 with data-parallel attention on 144 H800s, 128 sequences
    # per GPU, mean KV length 4,989 = prompt 4,383 + output 1,211 / 2.
    r = _by_id(records, "deepseek-v3r1-h800-decode-production")
    c = case(r)
    assert c.step == "decode" and c.chips == 144
    d = c.design
    assert float(d.batch) == 18432 and float(d.chips) == 144 and float(d.stages) == 1
    assert float(d.attention_dp) == 144  # every chip runs attention for its own sequences
    assert float(d.dispatch_dedup) == 1  # 144 chips span 18 NVLink domains of 8
    assert float(c.workload.context) == pytest.approx(4383 + 1211 / 2)
    assert float(c.hardware.flops) == pytest.approx(1978.9e12)  # compute fp8 on the H800
    assert float(c.model.bytes_per_param) == 1.0  # fp8 weights


def test_attention_runs_at_the_kv_caches_rate(records):
    # DeepSeek's decode pool: fp8 matmuls, bf16 cache -> attention at the H800's bf16 rate
    r = _by_id(records, "deepseek-v3r1-h800-decode-production")
    assert attention_rate(r) == pytest.approx(989.4e12)
    assert float(case(r).hardware.attention_flops) == pytest.approx(989.4e12)
    assert float(case(r).hardware.flops) == pytest.approx(1978.9e12)
    # fp4 matmuls with an fp8 cache on a B200: fp8; an fp8 cache on an A100 (no fp8 rate): bf16
    b200 = dict(r, hardware="b200", compute="fp4", kv_cache="fp8")
    assert attention_rate(b200) == float(dcost.hardware("b200", precision="fp8").flops)
    a100 = dict(r, hardware="a100-80gb", compute="bf16", kv_cache="fp8")
    assert attention_rate(a100) == float(dcost.hardware("a100-80gb").flops)


def test_comm_overlap_reaches_the_design(records):
    r = _by_id(records, "deepseek-v3r1-h800-decode-production")
    assert r["comm_overlap"] == 1.0  # DeepSeek's dual micro-batch overlap, quoted in the note
    assert float(case(r).design.comm_overlap) == 1.0
    other = _by_id(records, "lmdeploy-llama2-70b-a100-tp4-b1-128-128-thr")
    assert float(case(other).design.comm_overlap) == 0.0


def test_calibrated_profiles_run_kernels_in_series():
    h = dcost.hardware("h100-sxm", calibrated=True)
    for name, value in families.FIXED.items():
        assert float(getattr(h, name)) == value
    assert set(families.FIELDS) | set(families.FIXED) == set(
        dcost.presets.calibration_profile("hopper")
    )


@pytest.mark.slow
@pytest.mark.x64
def test_forward_mode_jacobians_equal_reverse_mode(records):
    """The fit differentiates the predictions through a custom VJP built from forward-mode
    Jacobians; it must equal plain reverse-mode differentiation."""
    import jax
    import jax.numpy as jnp

    # three decode records, the third predicted from two runs as a finite run's waves are (the
    # combination does not depend on the step, so decode steps keep this to one compilation)
    subset = [r for r in records if r["serving"] == "decode"][:3]
    fams, fam, _, _ = families._prepared(subset)
    runs = [*subset, dict(subset[2], concurrency=subset[2]["concurrency"] // 2)]
    plan = families._Plan(
        families._groups(runs), np.array([0, 1, 2, 2]), np.array([1, 1, 0.6, 0.4]), 3
    )
    zg = jnp.asarray(families._Z_PRIOR) + 0.1
    delta = 0.05 * jnp.ones((len(fams), len(families.FIELDS)))

    def via_custom(a, b):
        return jnp.sum(jnp.sin(families._log_predictions(plan, a, b, fam, True)))

    def via_reverse(a, b):
        values = families._values(a, b, fam)[plan.owner]
        out = jnp.zeros(len(plan.owner))
        for g in plan.groups:
            out = out.at[g.index].set(jnp.log(families._predict_group(g, values[g.index], True)))
        # the finite run: its tokens over the waves' time, 1 / sum(share / X)
        pred = jnp.zeros(plan.n).at[plan.owner].add(jnp.asarray(plan.share) * jnp.exp(-out))
        return jnp.sum(jnp.sin(-jnp.log(pred)))

    for x, y in zip(
        jax.grad(via_custom, argnums=(0, 1))(zg, delta),
        jax.grad(via_reverse, argnums=(0, 1))(zg, delta),
        strict=True,
    ):
        np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-9, atol=1e-12)


def test_case_of_a_dense_tensor_parallel_record_by_hand(records):
    r = _by_id(records, "lmdeploy-llama2-70b-a100-tp4-b1-128-128-thr")
    c = case(r)
    assert c.step == "mixed" and c.chips == 4
    assert float(c.design.chips) == 4 and float(c.design.batch) == 1
    assert float(c.design.attention_dp) == 1  # tensor-parallel attention
    assert float(c.workload.context) == 128 + 128 / 2


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"attention_data_parallel": 2}, "attention_data_parallel"),
        ({"tensor_parallel": 3}, "tensor_parallel"),
        ({"pipeline_parallel": 3}, "pipeline_parallel"),
        ({"compute": "fp4"}, "compute"),  # an A100 has no fp4 rate
        ({"serving": "prefill", "metric": "tpot"}, "metric"),
    ],
)
def test_a_record_that_cannot_be_modelled_names_the_field(records, change, field):
    r = dict(_by_id(records, "lmdeploy-llama2-70b-a100-tp4-b1-128-128-thr"), **change)
    with pytest.raises(SpecError, match=field):
        predict(r)


@pytest.mark.parametrize("groups", [3, 16])
def test_an_expert_parallel_degree_that_does_not_split_the_chips_is_refused(records, groups):
    r = dict(_by_id(records, "inferencemax-sglang-r1-fp8-h200-tp8ep1-c4-1024-1024"))
    with pytest.raises(SpecError, match="expert_parallel"):
        predict(dict(r, expert_parallel=groups))


def test_case_of_an_expert_tensor_parallel_record(records):
    r = _by_id(records, "inferencemax-sglang-r1-fp8-h200-tp8ep1-c4-1024-1024")
    d = case(r).design
    assert (float(d.chips), float(d.expert_parallel), float(d.attention_dp)) == (8, 1, 1)
    # the same deployment with its experts whole on one chip each is the v1 mapping
    whole = case(dict(r, expert_parallel=8)).design
    assert float(whole.expert_parallel) == float(whole.chips) == 8


def test_calibrated_hardware_applies_its_familys_profile():
    profile = dcost.presets.calibration_profile("hopper")
    h = dcost.hardware("h100-sxm", calibrated=True)
    for name, value in profile.items():
        assert float(getattr(h, name)) == pytest.approx(value, rel=1e-6)
    pure = dcost.hardware("h100-sxm")
    m, w, d = dcost.model("llama-3-70b"), dcost.Workload(2048), dcost.Design(batch=64, chips=8)
    assert float(dcost.decode(d, h, m, w).tpot) > float(dcost.decode(d, pure, m, w).tpot)
    with pytest.raises(ValueError, match="family"):
        dcost.presets.calibration_profile("vacuum-tubes")


@pytest.mark.slow
def test_held_out_summary_does_not_regress(tmp_path, capsys):
    # The whole procedure through the CLI: leave-one-source-out fits, the table, the figure.
    from dcost.cli.app import main

    figure = tmp_path / "validation.png"
    only = ["--only", "family=hopper,blackwell", "--only", "serving=decode"]
    assert main(["validate", "--json", "--figure", str(figure), *only]) == 0
    out = json.loads(capsys.readouterr().out)
    shipped = read_toml("dcost.presets", "calibration.toml")["heldout"]
    got = out["summary"]
    for key in ("median", "p90"):
        assert got["overall"][key] <= shipped["overall"][key] + 0.02, (key, got["overall"])
    assert got["bound_holds"] == 1.0
    sw = got["overall"]["source_weighted"]  # each source once: weighted_quantile's own test
    assert sw["sources"] == len({r["source_id"] for r in v.load() if families.fitted(r)})
    assert 0 < sw["median"] <= sw["p90"] < 1
    pools = out["by_regime"]["pool"]  # the fitted records by regime (families.breakdown)
    assert sum(g["records"] for g in pools.values()) == got["overall"]["records"]
    # --only shows the matching records and their own summary; the fits and the summary above
    # are the whole set's
    chosen = [
        r for r in v.load() if r["family"] in ("hopper", "blackwell") and r["serving"] == "decode"
    ]
    assert [r["id"] for r in out["records"]] == [r["id"] for r in chosen]
    sel = out["selection"]
    assert sel["records"] == len(chosen) and sel["fitted"] == sum(
        r["fitted"] for r in out["records"]
    )
    errors = [abs(r["held_out"] / r["measured"] - 1) for r in out["records"] if r["fitted"]]
    assert sel["fitted_error"]["median"] == pytest.approx(float(np.median(errors)), rel=1e-6)
    assert figure.stat().st_size > 10_000
    assert out["seconds"] < 120  # the budget is 30 s on an idle 2-core machine
    own = out["own_measurements"]  # the curve against k own runs, as shipped
    assert own == dcost.engines.own_measurements()
    assert [own["k"][k]["median"] for k in ("0", "1", "3", "10")] == sorted(
        (own["k"][k]["median"] for k in ("0", "1", "3", "10")), reverse=True
    )


@pytest.mark.parametrize(
    "only, needle",
    [
        (["nonsense"], "must be FIELD=VALUE"),
        (["colour=red"], "no record has the field 'colour'"),
        (["family=vacuum"], "no record has family = 'vacuum'; values: ampere"),
        (["family=hopper", "family=tpu"], "no record matches every condition"),
    ],
)
def test_bad_selection_is_refused_before_any_fit(capsys, only, needle):
    from dcost.cli.app import main

    argv = ["validate"]
    for o in only:
        argv += ["--only", o]
    assert main(argv) == 2  # at once: the records are checked before the fits compile
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1


def test_selection_keeps_the_records_matching_every_condition():
    from dcost.cli.validate import select

    records = v.load()
    keep = select(records, ["family=tpu", "model=llama-2-7b,llama-2-70b"])
    want = [r["family"] == "tpu" and r["model"] in ("llama-2-7b", "llama-2-70b") for r in records]
    assert keep == want and any(keep)


def test_the_public_name_is_the_function():
    """``dcost.validation.predict`` is the function of DESIGN.md's contract (no module of that
    name hides it); the record mapping lives in ``dcost.validation.cases``."""
    import dcost.validation as v

    r = v.load()[0]
    assert callable(v.predict) and v.predict is predict
    assert v.predict(r) == predict(r, calibrated=False)
    with pytest.raises(AttributeError, match="no attribute 'predictions'"):
        v.predictions  # noqa: B018


@pytest.mark.slow
def test_held_out_predictions_are_each_folds_fit_evaluated_apart():
    """``cross_validate`` takes its held-out predictions from the fit's own loop (one evaluation
    after the last update); evaluated apart at each fold's parameters, the model gives the same
    numbers, so they are the final parameters' and not the step before's. The records and steps
    of ``cross_validate``'s doctest, so the fit's program is the one that compiled."""
    records = v.load()[:12]
    cv = families.cross_validate(records, steps=20)
    _, fam, _, plan = families._prepared(records)
    src = [cv.sources.index(r["source_id"]) for r in records]
    apart = jax.jit(
        jax.vmap(lambda zg, d: jnp.exp(families._log_predictions(plan, zg, d, fam, True)))
    )(cv.fits.z_global, cv.fits.delta)
    np.testing.assert_allclose(cv.held_out, np.asarray(apart)[src, np.arange(12)], rtol=1e-5)


@pytest.mark.parametrize("steps", [0, -3, 2.5, True])
def test_a_fit_without_a_whole_number_of_steps_is_refused(steps):
    """The learning rate decays over the steps, so a fit needs at least one; the error names the
    argument and its value before anything compiles."""
    records = v.load()[:3]
    for fit in (families.fit, families.cross_validate):
        with pytest.raises(ValueError, match=r"steps = .* must be a whole number >= 1"):
            fit(records, steps=steps)


def test_breakdown_by_regime_groups_every_fitted_record_once():
    """``breakdown`` on held-out predictions made up here: each regime's groups partition the
    fitted records, a group's figures are those of the records a predicate written here picks,
    and the speed ratio reads a time's ratio the other way round."""
    records = tuple(v.load())
    rng = np.random.default_rng(0)
    factor = np.exp(rng.normal(0.0, 0.3, len(records)))
    measured = np.array([float(r["value"]) for r in records])
    cv = families.CrossValidation(records, measured * factor, measured, ("s",), None)
    out = families.breakdown(cv)
    fitted = [families.fitted(r) for r in records]
    for groups in out.values():
        assert sum(g["records"] for g in groups.values()) == sum(fitted)
    spec = [i for i, r in enumerate(records) if fitted[i] and "speculative" in r]
    assert out["speculative decoding"]["yes"]["records"] == len(spec)
    err = np.abs(factor[spec] - 1.0)
    assert out["speculative decoding"]["yes"]["median"] == pytest.approx(np.median(err))
    assert out["speculative decoding"]["yes"]["p90"] == pytest.approx(np.quantile(err, 0.9))
    time = [i for i, r in enumerate(records) if fitted[i] and r["serving"] == "prefill"]
    speed = [1.0 / factor[i] if records[i]["metric"] in TIME_METRICS else factor[i] for i in time]
    assert out["pool"]["prefill"]["speed_ratio"] == pytest.approx(np.median(speed))
    # the batch bands: a batch-1 step and one of 3,000 sequences over 8 attention groups
    bands = families.REGIMES["sequences per attention group"]
    by_id = {r["id"]: r for r in records}
    one = by_id["trtllm-blog-r1-b200-minlat-mtp0"]
    wide = by_id["trtllm-deepseek-r1-h200-dep8-1024-1024"]
    assert bands(one, case(one)) == "1-3"
    assert bands(wide, case(wide)) == "64-511"  # 3,000 over 8 attention groups: 375 each
    assert list(out["sequences per attention group"]) == ["1-3", "4-63", "64-511", ">= 512"]
    # the expert layout: experts split over the chips of a group where a record's expert-parallel
    # degree is below its chips per stage
    split = [
        r
        for i, r in enumerate(records)
        if fitted[i]
        and float(dcost.model(r["model"]).n_experts) > 0
        and "expert_parallel" in r
        and r["expert_parallel"] < r["gpus"] / r.get("pipeline_parallel", 1)
    ]
    assert out["experts"]["MoE, expert tensor parallel"]["records"] == len(split) > 0


def test_source_spread_divides_out_each_sources_median():
    """``source_spread`` on made-up held-out predictions: a constant factor per source leaves no
    error at all; with one record of a source off by 2x, that record's error is its ratio to the
    source's median, by hand."""
    records = tuple(r for r in v.load() if families.fitted(r))
    measured = np.array([float(r["value"]) for r in records])
    time = np.array([r["metric"] in TIME_METRICS for r in records])
    sources = sorted({r["source_id"] for r in records})
    factor = {s: 0.5 + i / len(sources) for i, s in enumerate(sources)}  # speed ratio per source
    speed = np.array([factor[r["source_id"]] for r in records])
    held_out = measured * np.where(time, 1.0 / speed, speed)
    cv = families.CrossValidation(records, held_out, measured, tuple(sources), None)
    out = families.source_spread(cv)
    assert out["median"] == pytest.approx(0.0, abs=1e-6) and out["p90"] == pytest.approx(
        0.0, abs=1e-6
    )
    assert out["offsets"] == pytest.approx(factor)
    # one record of the largest source twice as fast as its source's others: its error is 1.0
    big = max(sources, key=lambda s: sum(r["source_id"] == s for r in records))
    i = next(i for i, r in enumerate(records) if r["source_id"] == big)
    speed2 = speed.copy()
    speed2[i] *= 2.0
    cv2 = families.CrossValidation(
        records, measured * np.where(time, 1.0 / speed2, speed2), measured, tuple(sources), None
    )
    err = np.zeros(len(records))
    err[i] = 1.0  # the source's median is unmoved (one record of many)
    out2 = families.source_spread(cv2)
    assert out2["median"] == pytest.approx(np.median(err), abs=1e-6)
    assert out2["p90"] == pytest.approx(np.quantile(err, 0.9), abs=1e-6)
    assert out2["offsets"][big] == pytest.approx(factor[big])


def test_weighted_quantile_against_repeated_values():
    """Integer weights are repeats: the weighted quantile equals the same order statistic of the
    list with each value repeated its weight's times; each source weighted once counts a source
    of many records like a source of one."""
    from dcost.calibrate.families import weighted_quantile

    rng = np.random.default_rng(7)
    for _ in range(50):
        x = rng.random(rng.integers(1, 12))
        w = rng.integers(1, 5, x.size)
        rep = np.sort(np.repeat(x, w))
        for q in (0.1, 0.5, 0.9, 1.0):
            want = rep[max(int(np.ceil(q * rep.size)) - 1, 0)]
            assert weighted_quantile(x, w, q) == pytest.approx(want)
    # one source of 9 records at 0.1, two of one record each at 0.5 and 0.6: once each, the
    # median is 0.5 (the record-weighted median is 0.1)
    errors = [0.1] * 9 + [0.5, 0.6]
    once = [1 / 9] * 9 + [1.0, 1.0]
    assert weighted_quantile(errors, once, 0.5) == 0.5 and float(np.median(errors)) == 0.1
    with pytest.raises(ValueError, match="q = 0"):
        weighted_quantile([1.0], [1.0], 0.0)
    with pytest.raises(ValueError, match="weights"):
        weighted_quantile([1.0, 2.0], [1.0], 0.5)
