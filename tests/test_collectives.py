"""The collective-kernel measurements and dcost's all-to-all term against them."""

import numpy as np
import pytest

import dcost
from dcost.validation import collectives as K


@pytest.fixture(scope="module")
def ms():
    return K.load()


def test_every_measurement_is_well_formed_with_a_source(ms):
    assert len(ms) == 12
    ids = [m["id"] for m in ms]
    assert len(set(ids)) == len(ids)
    for m in ms:
        K.check(m)
        assert "@" in m["source"] and m["quote"].startswith("|")
        # the quoted row holds the timed figure, in microseconds
        assert f"{m['value'] * 1e6:.0f} us" in m["quote"]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("op", "gather"),
        ("ranks", 1),
        ("ranks", 8.0),
        ("tokens_per_rank", 0),
        ("bytes_per_value", -1.0),
        ("value", 0.0),
        ("dedup", 2.0),
        ("source", ""),
    ],
)
def test_bad_fields_are_refused_by_name(ms, field, value):
    bad = dict(ms[0], **{field: value})
    with pytest.raises(ValueError, match=f"'{field}' = {value!r}"):
        K.check(bad)


def test_pure_prediction_is_the_closed_form_and_a_bound(ms):
    """One direction of the all-to-all at peak links, written here from the preset's fields:
    a rank's ``n k`` copies of ``d b`` bytes, ``(G-1)/G`` of them leave the chip, a share
    ``s = (min(G, S) - 1)/(G - 1)`` over the scale-up link, the rest over scale-out."""
    h = dcost.hardware("h800")
    d = float(dcost.model("deepseek-v3").d_model)
    k = float(dcost.model("deepseek-v3").experts_active)
    up_bw, out_bw, size = (float(h.scaleup_bandwidth), float(h.scaleout_bandwidth), 8.0)
    expected = []
    for m in ms:
        g = float(m["ranks"])
        sent = m["tokens_per_rank"] * k * d * m["bytes_per_value"] * (g - 1) / g
        s = (min(g, size) - 1) / (g - 1)
        expected.append(max(sent * s / up_bw, sent * (1 - s) / out_bw))
    pure = K.predict(ms)
    np.testing.assert_allclose(pure, expected, rtol=1e-5)
    assert np.all(pure <= np.array([m["value"] for m in ms]))


def test_links_add_log_depth_latency_rounds_and_achieved_bandwidth(ms):
    """With links, one direction is ``max(log2(p_up + 1) a_up + V s/(U e_up), log2(p_out + 1)
    a_out + V (1 - s)/(O e_out))``, ``p_up = min(G, S) - 1`` and ``p_out = G - min(G, S)``
    peers, written here from the preset's fields."""
    links = {
        "scaleup_efficiency": 0.7,
        "scaleout_efficiency": 0.6,
        "scaleup_latency": 8e-6,
        "scaleout_latency": 2e-5,
    }
    h = dcost.hardware("h800")
    d, k = float(dcost.model("deepseek-v3").d_model), 8.0
    expected = []
    for m in ms:
        g = float(m["ranks"])
        sent = m["tokens_per_rank"] * k * d * m["bytes_per_value"] * (g - 1) / g
        up_peers, s = min(g, 8.0) - 1, (min(g, 8.0) - 1) / (g - 1)
        up = np.log2(up_peers + 1) * 8e-6 + sent * s / (0.7 * float(h.scaleup_bandwidth))
        out = np.log2(g - up_peers) * 2e-5 + sent * (1 - s) / (0.6 * float(h.scaleout_bandwidth))
        expected.append(max(up, out))
    np.testing.assert_allclose(K.predict(ms, links=links), expected, rtol=1e-5)


def test_fit_links_recovers_the_fields_that_made_the_timings(ms):
    """Timings made by the term itself with known link fields are fitted back to them."""
    truth = {
        "scaleup_efficiency": 0.7,
        "scaleout_efficiency": 0.6,
        "scaleup_latency": 8e-6,
        "scaleout_latency": 2e-5,
    }
    made = K.predict(ms, links=truth)
    synthetic = [dict(m, value=float(t)) for m, t in zip(ms, made, strict=True)]
    got = K.fit_links(synthetic, steps=3000)
    assert got["rms"] < 0.01
    for name, value in truth.items():
        assert got[name] == pytest.approx(value, rel=0.1), name


def test_fit_links_on_deepep_is_physical(ms):
    got = K.fit_links(ms)
    assert got["rms"] < 0.1  # the term's shape: 12 timings, 4 fields
    assert 0.6 < got["scaleup_efficiency"] <= 1.0 and 0.6 < got["scaleout_efficiency"] <= 1.0
    assert got["scaleup_latency"] < 3e-5 and got["scaleout_latency"] < 3e-5
    with pytest.raises(ValueError, match="steps"):
        K.fit_links(ms, steps=0)
    with pytest.raises(ValueError, match="learning_rate"):
        K.fit_links(ms, learning_rate=0.0)


def test_summary_is_the_predictions_over_the_measurements(ms):
    s = K.summary(ms)["h800"]
    y = np.array([m["value"] for m in ms])
    cal = K.predict(ms, calibrated=True) / y
    assert s["kernels"] == 12 and s["bound_holds"] == 1.0
    assert s["calibrated"]["median"] == pytest.approx(float(np.median(cal)))
    assert s["pure"]["max"] == pytest.approx(float(np.max(K.predict(ms) / y)))


def test_one_chip_and_one_model_at_a_time(ms):
    with pytest.raises(ValueError, match="one chip"):
        K.predict([ms[0], dict(ms[1], hardware="h100-sxm")])
    with pytest.raises(ValueError, match="one model"):
        K.predict([ms[0], dict(ms[1], model="qwen3-235b-a22b")])
