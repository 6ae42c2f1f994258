"""Runs whose requests decode in lockstep waves (``wave_prompt_steps``): the silicon sample's
SGLang runs that ran prompt steps alone under AIConfigurator's fixed-length closed loop.

Checked against what can disagree: a one-step wave is a decode step as ``dcost.decode`` prices
it (another code path); the share is ``(k - 1)/(2k)`` of the steady interference, counted by
hand over a wave; the records that carry it are those the deployment history names, with ``k``
counted by hand; bad values are refused naming the field; a calibration to such runs predicts
them as the silicon predictions do."""

import math

import numpy as np
import pytest

import dcost
from dcost.validation import check_record, silicon
from dcost.validation.cases import case, evaluate_case

BASE = {
    "id": "wave-test",
    "source": "test",
    "source_id": "test",
    "family": "hopper",
    "quote": "test",
    "hardware": "h100-sxm",
    "model": "qwen3-32b",
    "weights": "bf16",
    "kv_cache": "bf16",
    "compute": "bf16",
    "gpus": 2,
    "tensor_parallel": 2,
    "concurrency": 16,
    "prompt_tokens": 2048.0,
    "output_tokens": 128.0,
    "metric": "tpot",
    "serving": "aggregated",
    "value": 0.02,
    "assumed": [],
}


def _tpot(record, engine=None):
    return float(evaluate_case(case(record, engine=engine)))


def test_a_one_step_wave_is_a_decode_step():
    """k = 1: every prompt in one step, then decodes only: dcost.decode's TPOT."""
    r = dict(BASE, wave_prompt_steps=1)
    c = case(r)
    d = dcost.decode(c.design, c.hardware, c.model, c.workload).tpot
    assert _tpot(r) == pytest.approx(float(d), rel=1e-6)
    assert _tpot(r) < _tpot(BASE)  # the steady mixed step carries the prompts


def test_the_share_is_the_prompt_work_a_request_waits_through():
    """Step j's request waits through the k - j steps after its own; the steady state's request
    through all k: the mean share, counted over the wave, is (k - 1)/(2k)."""
    zero = _tpot(dict(BASE, wave_prompt_steps=1))
    steady = _tpot(BASE)
    for k in (2, 3, 16, 64):
        waited = sum(k - j for j in range(1, k + 1)) / k  # steps a request waits through
        share = waited / k
        assert share == pytest.approx((k - 1) / (2 * k))
        want = zero + share * (steady - zero)
        assert _tpot(dict(BASE, wave_prompt_steps=k)) == pytest.approx(want, rel=1e-5)


def test_bad_wave_prompt_steps_are_refused_naming_the_field():
    for bad in (0, -3, 2.5, True, "8"):
        with pytest.raises(ValueError, match="wave_prompt_steps"):
            check_record(dict(BASE, wave_prompt_steps=bad))
    for where in ({"metric": "ttft"}, {"serving": "decode"}):
        with pytest.raises(ValueError, match="wave_prompt_steps.*aggregated run"):
            check_record(dict(BASE, wave_prompt_steps=4, **where))


def test_silicon_records_in_waves_are_the_prompt_steps_alone_runs_of_aiconfigurator():
    recs, _ = silicon.records()
    rows = {f"silicon-{r['id']}-tpot": r for r in silicon.load_rows()}
    waved = [r for r in recs if "wave_prompt_steps" in r]
    assert waved
    for r in waved:
        assert r["engine"] == "sglang" and r["engine_version"] in silicon.PROMPT_STEPS_ALONE
        assert r["serving"] == "aggregated" and r["metric"] == "tpot"
        assert not silicon.inferencex(rows[r["id"]])
        # by hand: SGLang on H100 takes whole prompts up to the prompt and 1,500 tokens
        per = 2 if r["prompt_tokens"] <= 1500 else 1
        assert r["wave_prompt_steps"] == math.ceil(r["concurrency"] / per)
    others = [r for r in recs if r["engine"] != "sglang" or r.get("mode") != "agg"]
    assert not any("wave_prompt_steps" in r for r in others)


def test_a_calibration_predicts_runs_in_waves_as_the_silicon_predictions():
    from dcost.calibrate import host, user

    recs, _ = silicon.records()
    rows = [r for r in recs if "wave_prompt_steps" in r][:2]
    rows += [r for r in recs if r["engine"] == "sglang" and "wave_prompt_steps" not in r][:1]
    eng = dcost.engine("sglang", hardware="h100-sxm")
    got = user.predict_offsets(user.prepare(rows, eng), np.zeros(len(user.FIELDS)))
    want = silicon.predict_all(rows, engine_for=lambda r: eng, family=False)
    full = want.engine(*(eng.profile.get(f, 0.0) for f in host.FIELDS))
    np.testing.assert_allclose(got, full, rtol=1e-4)


def test_the_family_fit_refuses_runs_in_waves_naming_the_field():
    """The per-family fit takes runs in steady state: a record in waves is refused where it
    enters, not fitted as if steady."""
    from dcost.calibrate import families

    with pytest.raises(dcost.SpecError, match="wave_prompt_steps = 8"):
        families._groups([dict(BASE, wave_prompt_steps=8)])
    assert families._groups([dict(BASE)])  # the same record in steady state is taken
