"""Tests of dcost.pricing: the observation model against hand formulas, recovery of planted values,
the identifiability report against the model's exact null direction, Laplace standard errors
against the spread of fits under noise, and the published price sheets."""

import math
import re
import tomllib
from importlib import resources

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.test_util import check_grads

import dcost
from dcost import pricing

H100 = dcost.hardware("h100-sxm")


def _hand_prices(v, *, G, B, T, T_L, b_w, s, g, tau):
    """The module docstring's formulas, written out with NumPy and the exact max."""
    b_kv, N, R, m = (v[k] for k in pricing.PARAMS)
    bw, M, p = float(H100.hbm_bandwidth), float(H100.hbm_capacity), float(H100.price_per_hour)
    c = G * p / 3600.0
    F_r, BW_r, M_r = G * R * bw, G * bw, G * M
    a = g * b_kv

    def prefill(t):
        return max(t * (2 * N + a * t / 2) / F_r, (b_w * s * N + t * b_kv) / BW_r) / t

    def decode(t):
        return max(B * (2 * N + a * t) / F_r, (b_w * s * N + B * t * b_kv) / BW_r) / B

    storage = m * c * b_kv / M_r
    return {
        "input": m * c * prefill(T),
        "output": m * c * decode(T),
        "input_long": m * c * prefill(T_L),
        "output_long": m * c * decode(T_L),
        "cache_write": m * c * prefill(T) + tau * storage,
        "cache_hit": tau * storage + m * c * b_kv / BW_r,
        "cache_storage": storage,
    }


CASES = {
    # name: (hidden values, serving fields)
    "dense-memory-bound": (
        {
            "kv_bytes_per_token": 327680.0,
            "params_active": 70e9,
            "flops_per_byte": 295.0,
            "margin": 5.0,
        },
        dict(
            chips=8,
            batch=64,
            context=8192,
            context_long=400_000,
            bytes_per_param=2.0,
            sparsity=1.0,
            attn_flops_per_kv_byte=8.0,
            cache_hold_s=300.0,
        ),
    ),
    "compute-bound-decode": (
        {
            "kv_bytes_per_token": 4096.0,
            "params_active": 8e9,
            "flops_per_byte": 150.0,
            "margin": 2.0,
        },
        dict(
            chips=1,
            batch=4096,
            context=512,
            context_long=2048,
            bytes_per_param=2.0,
            sparsity=1.0,
            attn_flops_per_kv_byte=4.0,
            cache_hold_s=30.0,
        ),
    ),
    "moe-fp8": (
        {
            "kv_bytes_per_token": 70272.0,
            "params_active": 37e9,
            "flops_per_byte": 590.0,
            "margin": 6.0,
        },
        dict(
            chips=16,
            batch=256,
            context=4989,
            context_long=100_000,
            bytes_per_param=1.0,
            sparsity=18.14,
            attn_flops_per_kv_byte=241.8,
            cache_hold_s=10.0,
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_prices_match_hand_formulas(name):
    values, fields = CASES[name]
    serving = pricing.Serving(H100, smoothness=0.0, **fields)
    got = pricing.predict_prices(values, serving)
    want = _hand_prices(
        values,
        G=fields["chips"],
        B=fields["batch"],
        T=fields["context"],
        T_L=fields["context_long"],
        b_w=fields["bytes_per_param"],
        s=fields["sparsity"],
        g=fields["attn_flops_per_kv_byte"],
        tau=fields["cache_hold_s"],
    )
    for kind in pricing.KINDS:
        assert float(got[kind]) == pytest.approx(want[kind], rel=2e-5), kind


def test_compute_bound_decode_costs_the_same_as_prefill_per_token():
    # Hand reasoning: with a short context and a huge batch, decode and prefill are both compute
    # bound at 2N FLOPs per token (+ attention), so the output/input price ratio tends to
    # (2N + aT)/(2N + aT/2).
    values, fields = CASES["compute-bound-decode"]
    p = pricing.predict_prices(values, pricing.Serving(H100, smoothness=0.0, **fields))
    n, a, t = 8e9, 4.0 * 4096.0, 512.0
    assert float(p["output"] / p["input"]) == pytest.approx(
        (2 * n + a * t) / (2 * n + a * t / 2), rel=1e-5
    )


def test_log_price_gradients_match_finite_differences_in_float64():
    with jax.enable_x64(True):
        serving = pricing.Serving(H100, smoothness=0.05, **CASES["dense-memory-bound"][1])
        theta = jnp.log(jnp.array([327680.0, 70e9, 295.0, 5.0], dtype=jnp.float64))
        check_grads(
            jax.jit(lambda th: pricing.model._log_prices(th, serving)),
            (theta,),
            order=1,
            modes=("fwd", "rev"),
            eps=1e-4,
            atol=1e-6,
            rtol=1e-6,
        )


PLANTED = pricing.PLANTED
SUBSETS = {
    "no-long-tier": ("input", "output", "cache_write", "cache_hit"),
    "no-cache": ("input", "output", "input_long", "output_long"),
}


@pytest.mark.parametrize("anchor", ["params_active", "margin"])
@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_recovers_planted_values_within_5_percent(planted, anchor):
    # Every price kind, noise free; the fit starts from the weak priors' medians (1e5 bytes, 1e11
    # parameters, 300 FLOP/byte, margin 3), far from the planted values.
    truth = PLANTED[planted]
    serving = pricing.Serving(H100)
    y = pricing.predict_prices(truth, serving)
    fit = pricing.fit_prices(
        {k: float(v) for k, v in y.items()}, serving, prior={anchor: (truth[anchor], 1.01)}
    )
    rep = pricing.identifiability(fit)
    for k in pricing.PARAMS:
        assert float(fit.values[k]) == pytest.approx(truth[k], rel=0.05), k
        if k != anchor:
            assert rep.status[k] == "pinned", (k, rep.describe())
    assert float(np.max(np.abs(fit.residuals))) < 0.05


@pytest.mark.parametrize("anchor", ["params_active", "margin"])
@pytest.mark.parametrize("subset", sorted(SUBSETS))
@pytest.mark.parametrize("planted", sorted(PLANTED))
def test_partial_sheets_recover_what_they_pin(planted, subset, anchor):
    # With fewer price kinds every parameter lies within 2.5 Laplace standard deviations of the
    # truth (the prior pulls what the prices leave loose), and a sheet with the long-context tier
    # still pins and recovers everything within 5 %.
    truth = PLANTED[planted]
    serving = pricing.Serving(H100)
    y = pricing.predict_prices(truth, serving)
    fit = pricing.fit_prices(
        {k: float(y[k]) for k in SUBSETS[subset]}, serving, prior={anchor: (truth[anchor], 1.01)}
    )
    rep = pricing.identifiability(fit)
    for k in pricing.PARAMS:
        err = math.log(float(fit.values[k]) / truth[k])
        assert abs(err) < 2.5 * float(fit.log_sd[k]) + 1e-3, (k, err, rep.describe())
    if "input_long" in SUBSETS[subset]:  # the long tier pins everything the anchor leaves free
        for k in pricing.PARAMS:
            assert rep.status[k] == ("prior" if k == anchor else "pinned"), rep.describe()
            assert float(fit.values[k]) == pytest.approx(truth[k], rel=0.05), k


def test_null_direction_is_scale_of_model_against_margin():
    # Closed form: every price is m times a function homogeneous of degree 1 in (N, b_kv), so
    # (b_kv, N, R, m) -> (c b_kv, c N, R, m/c) leaves all prices unchanged: the log-space null
    # direction is (1, 1, 0, -1)/sqrt(3).
    serving = pricing.Serving(H100)
    y = pricing.predict_prices(PLANTED["dense-70b"], serving)
    fit = pricing.fit_prices({k: float(v) for k, v in y.items()}, serving)
    rep = pricing.identifiability(fit)
    assert rep.singular
    null = np.array([1.0, 1.0, 0.0, -1.0]) / math.sqrt(3.0)
    assert abs(float(rep.directions[0] @ null)) > 0.999
    assert 0 in rep.unpinned and len(rep.unpinned) == 1
    assert rep.status["flops_per_byte"] == "pinned"
    for k in ("kv_bytes_per_token", "params_active", "margin"):
        assert rep.status[k] != "pinned", k
    # The flat direction really is flat: moving along it changes no predicted price.
    moved = dict(PLANTED["dense-70b"])
    moved.update(
        kv_bytes_per_token=moved["kv_bytes_per_token"] * 3,
        params_active=moved["params_active"] * 3,
        margin=moved["margin"] / 3,
    )
    z = pricing.predict_prices(moved, serving)
    for k in pricing.KINDS:
        assert float(z[k]) == pytest.approx(float(y[k]), rel=1e-4), k
    assert "params_active^+1.00" in rep.describe()


def test_laplace_standard_errors_match_spread_of_fits_under_noise():
    # Prices with log-normal noise of sd 0.05 and an anchor on N drawn like a measurement (sd
    # ln 1.05): the posterior mode then scatters with the Laplace covariance (linear regime).
    truth = PLANTED["dense-70b"]
    serving = pricing.Serving(H100)
    y = pricing.predict_prices(truth, serving)
    log_y = np.log(np.array([float(y[k]) for k in pricing.KINDS]))
    mask, sigma = np.ones(7), np.full(7, 0.05)
    mu = np.log([1e5, truth["params_active"], 300.0, 3.0])
    w = np.log([10.0, 1.05, 10.0, 10.0])
    rng = np.random.default_rng(0)
    n = 150
    fits = []
    before = None
    for i in range(n):
        mu_i = mu.copy()
        mu_i[1] += w[1] * rng.standard_normal()
        f = pricing.fit_log_prices(
            jnp.asarray(log_y + sigma * rng.standard_normal(7)),
            jnp.asarray(mask),
            serving,
            jnp.asarray(sigma),
            jnp.asarray(mu_i),
            jnp.asarray(w),
        )
        fits.append(np.asarray(f.log_values))
        if i == 0:
            before = pricing.fit._fit._cache_size()
            laplace = np.sqrt(np.diag(np.asarray(f.log_cov)))
    assert pricing.fit._fit._cache_size() == before  # one compilation serves every draw
    spread = np.std(np.stack(fits), axis=0, ddof=1)
    # The sd of an sd estimated from 150 draws is ~6 %; allow 25 %.
    np.testing.assert_allclose(spread / laplace, 1.0, atol=0.25)


@pytest.mark.parametrize(
    "call, match",
    [
        (lambda s: pricing.fit_prices({"inptu": 1e-6}, s), r"unknown price kind \['inptu'\]"),
        (lambda s: pricing.fit_prices({"input": -1e-6}, s), r"prices.input = -1e-06"),
        (lambda s: pricing.fit_prices({}, s), "prices is empty"),
        (
            lambda s: pricing.fit_prices({"input": 1e-6}, s, prior={"marg": (1.0, 2.0)}),
            r"unknown prior parameter \['marg'\]",
        ),
        (
            lambda s: pricing.fit_prices({"input": 1e-6}, s, prior={"margin": (3.0, 1.0)}),
            r"prior factor.margin = 1.0",
        ),
        (lambda s: pricing.fit_prices({"input": 1e-6}, s, sigma={"output": 0.0}), r"sigma.output"),
        (lambda s: pricing.predict_prices({"margin": 1.0}, s), "missing"),
        (lambda s: pricing.Serving(H100, batch=0.5), r"Serving.batch = 0.5"),
    ],
)
def test_bad_input_names_field_and_value(call, match):
    with pytest.raises(ValueError, match=match):
        call(pricing.Serving(H100))


def test_identifiability_takes_one_fit():
    serving = pricing.Serving(H100)
    fit = pricing.fit_prices({"input": 3e-6, "output": 15e-6}, serving)
    batched = jax.tree_util.tree_map(lambda x: jnp.stack([x, x]), fit)
    with pytest.raises(ValueError, match="one fit"):
        pricing.identifiability(batched)


def _raw_sheets():
    text = resources.files("dcost.presets").joinpath("price_sheets.toml").read_text("utf-8")
    return tomllib.loads(text)


def test_price_sheets_carry_sources_and_convert_units():
    raw = _raw_sheets()
    sheets = pricing.price_sheets()
    assert set(sheets) == set(raw) - {"assumptions"}
    assert {s.provider for s in sheets.values()} >= {"Anthropic", "Google", "OpenAI", "DeepSeek"}
    for name, sheet in sheets.items():
        assert sheet.page.startswith("https://"), name
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", sheet.retrieved), name
        assert sheet.published, name
        assert {"input", "output"} <= set(sheet.prices), name
        for key, value in raw[name]["prices"].items():
            kind = "cache_storage" if key == "cache_storage_per_hour" else key
            scale = 1e-6 / 3600.0 if kind == "cache_storage" else 1e-6
            assert sheet.prices[kind] == pytest.approx(value * scale, rel=1e-12), (name, key)
        # The physics the observation model encodes holds for every published sheet: output costs
        # more than input, a cache hit less, and the long tier more than the base tier.
        p = sheet.prices
        assert p["output"] > p["input"], name
        if "cache_hit" in p:
            assert p["cache_hit"] < p["input"], name
        for base in ("input", "output"):
            if base + "_long" in p:
                assert p[base + "_long"] > p[base], name
    assert "cache_storage" in sheets["google-gemini-2-5-pro"].prices


def test_deepseek_fit_agrees_with_published_architecture_and_margin():
    # The prices of DeepSeek-R1 under DeepSeek's published serving statistics (price_sheets.toml)
    # imply b_kv and the margin. Published: MLA KV 61*(512+64)*2 = 70,272 bytes per token
    # (DeepSeek-V3 report) and price/cost = $562,027/$87,072 = 6.45 at R1 prices over a day that
    # includes idle capacity, so the margin at full use is at least that. Within a factor of 2.
    # The serving convention is DeepSeek's published one except the cache hold time (30 s, chosen
    # a priori); the fitted b_kv scales roughly as 1/hold and the margin as the assumed batch.
    sheet = pricing.price_sheets()["deepseek-r1"]
    fit = pricing.fit_sheet(sheet)
    v = fit.values
    assert abs(math.log(float(v["kv_bytes_per_token"]) / 70272.0)) < math.log(2.0)
    assert 562027 / 87072 / 1.2 < float(v["margin"]) < 2 * 562027 / 87072
    assert float(v["params_active"]) == pytest.approx(37e9, rel=0.03)


def test_every_sheet_fits_and_converges():
    for name, sheet in pricing.price_sheets().items():
        fit = pricing.fit_sheet(sheet)
        assert np.all(np.isfinite(np.asarray(fit.log_cov))), name
        assert float(fit.grad_norm) < 0.01, name
        rep = pricing.identifiability(fit)
        assert rep.status["flops_per_byte"] in ("pinned", "weak"), name
