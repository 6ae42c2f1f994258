"""The shipped validation set: its size and coverage, and the schema checks on bad records."""

import copy

import pytest

from dcost.validation import check_record, check_records, load, unknown_presets

MOE = {
    "mixtral-8x7b",
    "deepseek-v3",
    "deepseek-r1",
    "qwen3-235b-a22b",
    "qwen3-30b-a3b",
    "gpt-oss-120b",
    "kimi-k2",
}


@pytest.fixture(scope="module")
def records():
    return load()


def test_size_and_coverage(records):
    assert len(records) >= 60
    assert len({r["source_id"] for r in records}) >= 8
    assert len({r["family"] for r in records}) >= 6
    models = {r["model"] for r in records}
    assert models & MOE and models - MOE  # MoE and dense
    serving = {r["serving"] for r in records}
    assert {"decode", "prefill", "aggregated"} <= serving
    assert any("speculative" in r for r in records)
    assert {"ttft", "output_throughput_per_gpu", "input_throughput_per_gpu"} <= {
        r["metric"] for r in records
    }


def test_every_record_passes(records):
    check_records(records)
    for r in records:
        check_record(r)
        assert r["quote"] and r["note"]
        assert all(name for name in r.get("assumed", []))


def test_preset_names_are_reported_not_raised(records):
    missing = unknown_presets(records)
    assert all(field in ("hardware", "model") for _, field, _ in missing)
    bad = dict(records[0], id="x", hardware="no-such-chip")
    assert ("x", "hardware", "no-such-chip") in unknown_presets([bad])


@pytest.mark.parametrize(
    "field, value",
    [
        ("metric", "tokens_per_dollar"),
        ("serving", "mixed"),
        ("weights", "fp16"),
        ("kv_cache", "fp2"),
        ("compute", "tf32"),
        ("value", 0.0),
        ("value", -3.0),
        ("gpus", 0),
        ("concurrency", 1.5),
        ("prompt_tokens", -1),
        ("output_tokens", 0),
        ("tensor_parallel", 0),
        ("hardware", ""),
        ("speculative", {"draft_tokens": 0, "acceptance": 0.5}),
        ("speculative", {"draft_tokens": 2, "acceptance": 1.2}),
        ("assumed", "concurrency"),
        ("comm_overlap", 1.5),
        ("comm_overlap", True),
        ("requests", 0),
        ("requests", 2.5),
        ("requests", 10**6),  # records[0] is a decode pool: no finite offline run
    ],
)
def test_bad_field_is_named(records, field, value):
    bad = copy.deepcopy(records[0])
    bad[field] = value
    with pytest.raises(ValueError, match=field) as info:
        check_record(bad)
    assert bad["id"] in str(info.value)


@pytest.mark.parametrize("field", ["id", "source", "hardware", "model", "metric", "value", "gpus"])
def test_missing_field_is_named(records, field):
    bad = copy.deepcopy(records[1])
    del bad[field]
    with pytest.raises(ValueError, match=f"'{field}'.*required"):
        check_record(bad)


def test_duplicate_id(records):
    with pytest.raises(ValueError, match="unique"):
        check_records([records[0], copy.deepcopy(records[0])])


def test_a_run_of_fewer_requests_than_its_concurrency_is_refused(records):
    run = next(r for r in records if "requests" in r)
    bad = dict(run, requests=run["concurrency"] - 1)
    with pytest.raises(ValueError, match=r"'requests'.*>= concurrency") as info:
        check_record(bad)
    assert run["id"] in str(info.value)
    check_record(dict(run, requests=run["concurrency"]))  # one full wave is allowed
    time = dict(run, metric="tpot", value=0.05)
    with pytest.raises(ValueError, match=r"'requests'.*throughput of an aggregated run"):
        check_record(time)
