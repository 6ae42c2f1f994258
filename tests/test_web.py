"""The explorer's JSON endpoints (``dcost.web``), through Starlette's TestClient.

Every answer is checked against dcost's public API called here directly (the page must show the
API's own numbers), and against a closed form where one exists: cost per token is the replica's
$/s times TPOT over the batch, the optimal cost is proportional to the chip's price (elasticity 1),
a fleet's $/hour is its chips times the price. Bad values must come back as HTTP 400 naming the
field, with the API's message.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import urllib.error
import urllib.request

import numpy as np
import pytest

import dcost

pytest.importorskip("starlette", reason="the serve extra (pip install 'dcost[serve]') is absent")
pytest.importorskip("httpx", reason="Starlette's TestClient needs httpx (the dev extra)")

from starlette.testclient import TestClient  # noqa: E402

from dcost.web import app as web_app  # noqa: E402
from dcost.web import queries  # noqa: E402

# a dense model on one HGX box: every answer exists (feasible optimum, a fleet)
PARAMS = {
    "hardware": "h100-sxm",
    "model": "llama-3-8b",
    "engine": "physics",
    "context": "2048",
    "output": "256",
    "batch": "32",
    "chips": "2",
    "tpot_slo": "0.03",
    "rate": "5",
}


@pytest.fixture(scope="module")
def client():
    with TestClient(web_app.create_app()) as c:
        yield c


@pytest.fixture(scope="module")
def query():
    return queries.parse(PARAMS)


def _get(client, name, **changes):
    r = client.get(f"/api/{name}", params={**PARAMS, **changes})
    assert r.status_code == 200, r.text
    return r.json()


def test_choices_are_the_api_lists(client):
    body = client.get("/api/choices").json()
    assert body["hardware"] == list(dcost.hardware_names())
    assert body["models"] == list(dcost.model_names())
    ids = [e["id"] for e in body["engines"]]
    assert ids[:2] == [queries.ENGINE_PHYSICS, queries.ENGINE_CALIBRATED]
    if hasattr(dcost, "engines"):  # every shipped engine profile is offered, nothing else
        shipped = {f"{r[0]}@{r[1]}" for r in queries._engine_rows()}
        assert set(ids[2:]) == shipped
    else:
        assert len(ids) == 2
    assert set(body["defaults"]) == set(queries.DEFAULTS)


def test_curve_point_is_the_api_decode(client, query):
    body = _get(client, "curve")
    direct = dcost.decode(
        dcost.Design(batch=32, chips=2), query.hardware, query.model, query.workload
    )
    p = body["point"]
    assert p["batch"] == 32.0
    for name in ("tpot", "cost_per_token", "memory_per_chip", *queries.TERMS):
        assert p[name] == pytest.approx(float(getattr(direct, name)), rel=1e-6, abs=1e-12)
    assert p["bottleneck"] == str(dcost.bottleneck(direct))
    # cost per output token = G p / 3600 s * tpot / B (one stage, no speculation)
    price = float(query.hardware.price_per_hour)
    assert p["cost_per_token"] == pytest.approx(2 * price / 3600 * p["tpot"] / 32, rel=1e-5)
    # the curve's rows are the API's decode at those batches
    i = 40
    b = body["batch"][i]
    row = dcost.decode(dcost.Design(batch=b, chips=2), query.hardware, query.model, query.workload)
    assert body["tpot"][i] == pytest.approx(float(row.tpot), rel=1e-6)
    assert body["cost_per_token"][i] == pytest.approx(float(row.cost_per_token), rel=1e-6)
    assert len(body["batch"]) == queries.GRID_POINTS
    assert body["batch"][0] == 1.0 and body["batch"][-1] == pytest.approx(queries.BATCH_MAX)
    # the largest batch that fits is the last grid point under the limit
    mem = np.array(body["memory_per_chip"])
    fits = np.array(body["batch"])[mem <= body["memory_limit"]]
    assert body["largest_batch_in_memory"] == pytest.approx(fits.max())
    limit = 0.9 * float(query.hardware.hbm_capacity)
    assert body["memory_limit"] == pytest.approx(limit)


def test_a_profiled_moe_query_times_its_experts_as_the_validated_model():
    """A query's workload carries the expert load its chip is validated at
    (``dcost.serving.moe.profiled_routing``): multinomial (0) for a mixture of experts on the
    family profile or an engine's, balanced (1) on pure physics or for a dense model; always a
    number, so that every choice shares the page's programs."""
    from dcost.specs import MULTINOMIAL

    def imbalance(**params):
        return float(queries.parse({"hardware": "h100-sxm", **params}).workload.expert_imbalance)

    assert imbalance(model="mixtral-8x7b", engine=queries.ENGINE_CALIBRATED) == MULTINOMIAL
    assert imbalance(model="mixtral-8x7b", engine=queries.ENGINE_PHYSICS) == 1.0
    assert imbalance(model="llama-3-70b", engine=queries.ENGINE_CALIBRATED) == 1.0
    if hasattr(dcost, "engines"):
        rows = queries._engine_rows()
        vllm = next(f"{e}@{v}" for e, v, h in rows if e == "vllm" and h == "h100-sxm")
        assert imbalance(model="mixtral-8x7b", engine=vllm) == MULTINOMIAL


def test_curve_does_not_retrace_for_new_numbers(client):
    _get(client, "curve")
    before = queries.TRACES[0]
    _get(client, "curve", context="8192", batch="100", chips="4", rate="7", tpot_slo="0.1")
    _get(client, "curve", hardware="b200", model="llama-3-70b", output="1000")
    assert queries.TRACES[0] == before


def test_optimum_is_the_api_optimize(client, query):
    body = _get(client, "optimum")
    sol = dcost.optimize(queries.problem(query))
    assert body["feasible"] and bool(sol.feasible)
    assert body["batch"] == float(sol.design.batch) and body["chips"] == 2.0
    assert body["cost_per_token"] == pytest.approx(float(sol.cost), rel=1e-6)
    assert body["binding"] == list(sol.binding) + list(sol.at_bound)
    assert body["binding"], "an optimum inside its box is bound by some limit"
    assert body["tpot"] <= 0.03
    # no design on the curve that meets both limits is cheaper (the grid's batches are not whole:
    # within the one-batch rounding of the integer optimum)
    curve = _get(client, "curve")
    ok = (np.array(curve["tpot"]) <= 0.03) & (
        np.array(curve["memory_per_chip"]) <= curve["memory_limit"]
    )
    assert ok.any()
    cheapest = np.array(curve["cost_per_token"])[ok].min()
    assert body["cost_per_token"] <= cheapest * (1 + 1 / body["batch"])


def test_elasticities_are_the_api_sensitivity(client, query):
    body = _get(client, "elasticities")
    sens = dcost.sensitivity(queries.problem(query))
    assert body["feasible"]
    expected = [(n, v) for n, v in sens.ranked(12) if abs(v) >= queries.ELASTICITY_FLOOR]
    assert [b["name"] for b in body["bars"]] == [n for n, _ in expected]
    assert [b["elasticity"] for b in body["bars"]] == pytest.approx([v for _, v in expected])
    bars = {b["name"]: b["elasticity"] for b in body["bars"]}
    assert bars["hardware.price_per_hour"] == pytest.approx(1.0, abs=1e-4)  # cost is p-linear


def test_elasticities_of_an_unreachable_target_say_so(client):
    body = _get(client, "elasticities", model="llama-3-405b", chips="1", tpot_slo="0.001")
    assert body["feasible"] is False and body["bars"] == []
    assert "infeasible" in body["message"] or "binds" in body["message"]


def test_fleet_is_the_api_plan(client, query):
    body = _get(client, "fleet")
    p = dcost.plan(
        query.hardware,
        query.model,
        dcost.Traffic(5.0, prompt_tokens=2048.0, output_tokens=256.0),
        ttft_slo=queries.TTFT_SLO,
        tpot_slo=(0.03, queries.TPOT_PERCENTILE),
    )
    assert body["feasible"] and p.feasible
    assert (body["mode"], body["chips"]) == (p.mode, p.chips)
    assert body["cost_per_hour"] == pytest.approx(p.cost_per_hour)
    assert body["cost_per_hour"] == pytest.approx(
        body["chips"] * float(query.hardware.price_per_hour), rel=1e-6
    )
    assert [x["describe"] for x in body["pools"]] == [x.describe() for x in p.pools]
    assert body["tpot"]["0.9"] <= 0.03 and body["ttft"]["0.99"] <= queries.TTFT_SLO[0]
    assert body["alternative"]["mode"] != body["mode"]


# a value of every numeric field other than PARAMS'
MOVED = {
    "context": "4096",
    "output": "512",
    "batch": "100",
    "chips": "4",
    "tpot_slo": "0.05",
    "rate": "50",
}


@pytest.mark.parametrize("name", list(queries.ANSWERS))
def test_an_answer_reads_only_the_fields_it_is_remembered_by(client, name):
    """``queries.answer`` remembers an answer by ``DEPENDS[name]``: the answer computed afresh
    with every other field moved must be the same, and so must the served one."""
    others = {f: v for f, v in MOVED.items() if f not in queries.DEPENDS[name]}
    assert others, "every answer leaves some slider alone"
    base = queries.ANSWERS[name](queries.parse(PARAMS))
    moved = queries.ANSWERS[name](queries.parse({**PARAMS, **others}))
    assert moved == base
    assert _get(client, name, **others) == _get(client, name)
    # and a field it reads does change it
    read = queries.DEPENDS[name][0]
    assert queries.answer(name, queries.parse({**PARAMS, read: MOVED[read]})) != base


def test_calibrated_engine_uses_the_calibrated_profile(client):
    body = _get(client, "curve", engine="calibrated")
    h = dcost.hardware("h100-sxm", calibrated=True)
    q = queries.parse({**PARAMS, "engine": "calibrated"})
    direct = dcost.decode(dcost.Design(batch=32, chips=2), h, q.model, q.workload)
    assert body["point"]["tpot"] == pytest.approx(float(direct.tpot), rel=1e-6)
    physics = _get(client, "curve")["point"]["tpot"]
    assert body["point"]["tpot"] > physics  # achieved rates are below the datasheet's


def test_an_engine_profile_is_the_api_engine(client):
    if not hasattr(dcost, "engines"):
        pytest.skip("this dcost has no engine profiles (dcost.engines)")
    choices = client.get("/api/choices").json()["engines"]
    on_h100 = [e for e in choices if e["hardware"] and "h100-sxm" in e["hardware"]]
    assert on_h100, "no engine profile for h100-sxm"
    name, version = on_h100[0]["id"].split("@")
    body = _get(client, "curve", engine=on_h100[0]["id"])
    q = queries.parse(PARAMS)
    eng = dcost.engine(name, hardware="h100-sxm", version=version)
    direct = dcost.decode(
        dcost.Design(batch=32, chips=2), q.hardware, q.model, q.workload, engine=eng
    )
    assert body["point"]["tpot"] == pytest.approx(float(direct.tpot), rel=1e-6)
    assert body["point"]["t_overhead"] > 0  # an engine's step costs are in its profile
    # an engine the chip has no profile for is a bad value naming the field
    assert "tpu-v5e" not in on_h100[0]["hardware"]
    bad = {**PARAMS, "hardware": "tpu-v5e", "engine": on_h100[0]["id"]}
    r = client.get("/api/curve", params=bad)
    assert r.status_code == 400 and r.json()["field"] == "engine"
    assert "choose from physics, calibrated" in r.json()["error"]


BAD = {
    "not a number": ("batch", "abc", "batch = 'abc' is not a number"),
    "not finite": ("rate", "inf", "must be finite"),
    "negative context": ("context", "-1", "Traffic.prompt_tokens = -1.0"),
    "zero output": ("output", "0", "Traffic.output_tokens = 0.0"),
    "zero batch": ("batch", "0", "Design.batch = 0.0"),
    "zero chips": ("chips", "0", "Design.chips = 0.0"),
    "zero tpot target": ("tpot_slo", "0", "Problem.tpot_slo = 0.0"),
    "negative rate": ("rate", "-2", "Traffic.rate = -2.0"),
    "unknown hardware": ("hardware", "h999", "'h999'"),
    "unknown model": ("model", "gpt-9", "'gpt-9'"),
    "unknown engine": ("engine", "warp-drive", "engine = 'warp-drive' is not allowed"),
    "unknown field": ("colour", "blue", "colour is not a field of a query"),
}


@pytest.mark.parametrize("case", BAD.values(), ids=list(BAD))
@pytest.mark.parametrize("endpoint", ["curve", "fleet"])
def test_bad_values_are_400_naming_the_field(client, case, endpoint):
    field, value, message = case
    r = client.get(f"/api/{endpoint}", params={**PARAMS, field: value})
    assert r.status_code == 400
    body = r.json()
    assert body["field"] == field
    assert message in body["error"]


def test_page_and_static_files_are_served_and_offline(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    scripts = re.findall(r'(?:src|href)="([^"]+)"', page.text)
    assert "/static/uPlot.iife.min.js" in scripts and "/static/app.js" in scripts
    for path in scripts:
        if path.startswith("data:"):
            continue
        assert path.startswith("/static/"), f"{path}: the page must load nothing from elsewhere"
        assert client.get(path).status_code == 200
    static = pathlib.Path(web_app.STATIC)
    for f in ("index.html", "app.js", "style.css"):
        text = (static / f).read_text()
        assert not re.search(r"https?://", text), f"{f} refers to the network"
    assert "MIT License" in (static / "uPlot.LICENSE").read_text()


def test_dcost_serve_prints_its_address_and_answers():
    import serve_process

    with serve_process.running() as base:
        with urllib.request.urlopen(f"{base}/api/choices", timeout=30) as r:
            assert json.load(r)["models"] == list(dcost.model_names())
        with urllib.request.urlopen(f"{base}/", timeout=30) as r:
            assert "<title>dcost explorer</title>" in r.read().decode()
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{base}/api/curve?chips=0", timeout=30)
        assert err.value.code == 400
        body = json.loads(err.value.read())
        assert body["field"] == "chips" and "Design.chips = 0.0" in body["error"]


def test_serve_rejects_a_bad_port(capsys):
    from dcost.cli.app import main

    assert main(["serve", "--port", "70000"]) == 2
    err = capsys.readouterr().err
    assert "--port = 70000" in err and "[0, 65535]" in err


def test_json_never_carries_nan():
    assert queries._finite(math.nan) is None and queries._finite(math.inf) is None
    assert queries._list([1.0, math.nan]) == [1.0, None]


def test_explore_in_a_notebook_follows_its_sliders(client, query):
    """``dcost.explore()``: the same answers, driven by ipywidgets (after the endpoints' tests, in
    this process, so the programs are compiled)."""
    pytest.importorskip("ipywidgets", reason="the explore extra (pip install 'dcost[explore]')")
    from dcost.web import notebook

    names = ("hardware", "model", "engine")
    start = {k: v if k in names else float(v) for k, v in PARAMS.items()}
    box = dcost.explore(**start)
    assert box.answers["optimum"] == _get(client, "optimum")
    assert box.answers["fleet"]["chips"] == _get(client, "fleet")["chips"]
    box.controls["batch"].value = 64.0  # a slider moved
    point = box.answers["curve"]["point"]
    direct = dcost.decode(
        dcost.Design(batch=64, chips=2), query.hardware, query.model, query.workload
    )
    assert point["batch"] == 64.0
    assert point["cost_per_token"] == pytest.approx(float(direct.cost_per_token), rel=1e-6)
    shown = f"{float(direct.cost_per_token) * 1e6:.4g} $ / M output tokens"
    assert shown in box.children[2].value  # the summary the notebook shows
    fig = notebook.figure(box.answers["curve"], box.answers["optimum"], box.answers["elasticities"])
    assert [ax.get_xlabel() for ax in fig.axes[:2]] == ["batch B (sequences)"] * 2
    assert "dimensionless" in fig.axes[2].get_xlabel()
    with pytest.raises(queries.QueryError) as err:
        dcost.explore(context=-1)
    assert err.value.field == "context"
