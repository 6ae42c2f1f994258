"""The planning experiments' numbers, checked another way: throughput per GPU by hand from the
traffic and the fleet, a looser target never dearer, more traffic never cheaper, and the bill
of a mode equal to a plan of that mode alone."""

from __future__ import annotations

import pathlib
import sys

import numpy as np
import pytest

import dcost

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import disaggregation  # noqa: E402
import fleet_growth  # noqa: E402
import interactivity  # noqa: E402


@pytest.mark.parametrize("module", [disaggregation, fleet_growth, interactivity])
def test_scripts_have_the_standard_shape(module):
    assert callable(module.compute) and callable(module.plot) and callable(module.main)
    assert module.__doc__ and "Claim" in module.__doc__


def test_interactivity_frontier():
    res = interactivity.compute(targets=(0.03, 0.1), rate=100.0)
    chat = dcost.traffic("chat")
    for mode in ("aggregated", "disaggregated"):
        r = res[mode]
        per_gpu = np.asarray(r["tokens_per_s_per_gpu"])
        chips = np.asarray(r["chips"])
        np.testing.assert_allclose(per_gpu, 100.0 * float(chat.output_tokens) / chips, rtol=1e-6)
    agg = res["aggregated"]
    assert agg["tokens_per_s_per_gpu"][1] >= agg["tokens_per_s_per_gpu"][0]  # looser: more
    assert agg["tokens_per_s_per_user"][1] <= agg["tokens_per_s_per_user"][0]  # and slower
    fig = interactivity.plot(res)
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()


@pytest.mark.slow  # batched plans compile anew for their batch size
def test_disaggregation_and_fleet_growth():
    res = disaggregation.compute(ratios=(1 / 4, 16.0), rates=(8.0, 128.0))
    h = dcost.hardware("h100-sxm", calibrated=True)
    prompt, output = disaggregation.lengths(16.0)
    t = dcost.Traffic(128.0, prompt, output, prompt_cv=1.0, output_cv=1.0)
    kw = dict(tpot_slo=(disaggregation.TPOT, 0.9), max_utilisation=disaggregation.UTILISATION)
    for mode in ("aggregated", "disaggregated"):
        p = dcost.plan(h, "llama-3-70b", t, mode=mode, **kw)
        assert res[f"{mode}_per_hour"][1][1] == pytest.approx(p.cost_per_hour, rel=1e-6)
    growth = fleet_growth.compute(rates=np.array([1.0, 10.0, 100.0, 1000.0]))
    assert np.all(np.diff(growth["cost_per_hour"]) >= 0)  # more traffic never costs less
    assert np.all(np.diff(growth["chips"]) >= 0)
