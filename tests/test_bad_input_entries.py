"""Property sweeps of bad input into the round-3 entry points (issue 34, item 4): a deployment
(``dcost.Server``), a load (``dcost.Load``, ``dcost.Bursty``), an engine's scheduler settings,
the simulation of a server under a load, ``dcost.calibrate.fit`` and
``dcost.measurements.read``. Any value either gives a usable object or finite answer, or a
``ValueError``/``TypeError`` naming the field; never a traceback of another kind, NaN or inf.
experiments/bad_input_campaign.py counts the same surfaces case by case."""

import math
import pathlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import dcost
import dcost.calibrate
import dcost.measurements

DATA = pathlib.Path(__file__).parent / "data" / "measurements"

ANY = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.none(),
    st.booleans(),
    st.text(max_size=4),
    st.sampled_from([np.int64(4), np.float32(0.5), np.bool_(True), (), (1, 2), [1.0], 1 + 2j]),
)


def whole_at_least(v, low):
    return (
        isinstance(v, (int, float, np.integer, np.floating))
        and not isinstance(v, (bool, np.bool_))
        and math.isfinite(float(v))
        and float(v) == round(float(v))
        and float(v) >= low
    )


def refused_by_name(call, field):
    """Run ``call``; None when it answers, else check the error names ``field``."""
    try:
        return call(), None
    except (ValueError, TypeError) as err:
        assert field in str(err), (field, str(err))
        return None, err


SERVER_COUNTS = (
    "tensor_parallel",
    "attention_data_parallel",
    "pipeline_parallel",
    "replicas",
    "expert_parallel",
)


@settings(max_examples=30, deadline=None)
@given(
    field=st.sampled_from(SERVER_COUNTS + ("hardware", "model", "weights", "kv_cache")), value=ANY
)
def test_server_fields_are_usable_or_named(field, value):
    args = {"hardware": "h100-sxm", "model": "llama-3.1-8b", field: value}
    server, err = refused_by_name(lambda: dcost.Server(**args), f"Server.{field}")
    if err is not None:
        return
    if field in SERVER_COUNTS:
        assert (value is None and field == "expert_parallel") or whole_at_least(value, 1)
    elif field in ("hardware", "model"):
        assert isinstance(value, str)
    else:
        assert value is None or value in dcost.presets.PRECISIONS
    assert server is not None


LOAD_NUMBERS = {"prompt": 1.0, "output": 1.0, "shared_prefix": 0.0, "prompt_cv": 0.0,
                "output_cv": 0.0}  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(field=st.sampled_from([*LOAD_NUMBERS, "clients", "requests", "arrival"]), value=ANY)
def test_load_fields_are_usable_or_named(field, value):
    args = {"prompt": 256, "output": 8, "clients": 2, "requests": 4, field: value}
    if field == "arrival":
        args.update(clients=None, requests=None, stages=[(1.0, 5.0)])
    load, err = refused_by_name(lambda: dcost.Load(**args), field)
    if err is not None:
        return
    if field in LOAD_NUMBERS:
        assert not isinstance(value, (bool, np.bool_)) and math.isfinite(float(value))
        assert float(value) >= LOAD_NUMBERS[field]
    elif field in ("clients", "requests"):
        assert value is None or whole_at_least(value, 1)
    else:
        assert value in ("poisson", "constant")


@settings(max_examples=20, deadline=None)
@given(value=ANY)
def test_bursty_cv_is_usable_or_named(value):
    got, err = refused_by_name(lambda: dcost.Bursty(cv=value), "cv")
    if err is None:
        assert math.isfinite(float(got.cv)) and float(got.cv) > 0


ENGINE_SETTINGS = ("max_num_seqs", "max_num_batched_tokens", "gpu_memory_utilization",
                   "prefix_caching")  # fmt: skip


@settings(max_examples=30, deadline=None)
@given(field=st.sampled_from(ENGINE_SETTINGS + ("name", "version")), value=ANY)
def test_engine_settings_are_usable_or_named(field, value):
    if field in ("name", "version"):
        args = {"name": "vllm", "hardware": "h100-sxm", field: value}
        eng, err = refused_by_name(lambda: dcost.engine(**args), field)
        if err is None:
            assert field == "version" and value is None
        return
    eng, err = refused_by_name(
        lambda: dcost.engine("vllm", hardware="h100-sxm", **{field: value}), field
    )
    if err is not None:
        return
    held = getattr(eng.scheduler, field)
    if field == "prefix_caching":
        assert isinstance(value, (bool, np.bool_)) and held == bool(value)
    elif field == "gpu_memory_utilization":
        assert 0 < float(held) <= 1
    else:
        assert whole_at_least(value, 1) and int(held) == int(value)


SERVER = dcost.Server(hardware="h100-sxm", model="llama-3.1-8b", engine="vllm")
TINY = dcost.Load(prompt=64, output=4, clients=2, requests=4)


@settings(max_examples=15, deadline=None)
@given(field=st.sampled_from(["seed", "warmup"]), value=ANY)
def test_simulating_a_server_takes_a_seed_and_a_warmup_or_names_them(field, value):
    run, err = refused_by_name(lambda: dcost.simulate(SERVER, TINY, **{field: value}), field)
    if err is not None:
        return
    if field == "seed":
        assert whole_at_least(value, 0)
    else:
        assert 0 <= float(value) < 0.5 and not isinstance(value, (bool, np.bool_))
    summary = run.summary()
    for key in ("ttft", "tpot"):
        assert all(math.isfinite(v) for v in summary[key].values())


@pytest.mark.parametrize(
    "value", [None, 3, "records", {"id": 1}, [None], [3], [], [{}], [{"metric": "tpot"}]]
)
def test_calibrate_fit_names_its_records(value):
    eng = dcost.engine("vllm", hardware="h100-sxm")
    with pytest.raises((TypeError, ValueError), match="records"):
        dcost.calibrate.fit(value, eng)


READ_COUNTS = ("tensor_parallel", "pipeline_parallel", "attention_data_parallel", "gpus",
               "concurrency")  # fmt: skip


@settings(max_examples=25, deadline=None)
@given(field=st.sampled_from(READ_COUNTS), value=ANY)
def test_measurement_layout_flags_are_counts_or_named(field, value):
    def read():
        return dcost.measurements.read(
            DATA / "vllm_bench_serve.json",
            hardware="h100-sxm",
            model="llama-3.1-8b",
            engine="vllm",
            **{field: value},
        )

    records, err = refused_by_name(read, field)
    if err is None:
        assert value is None or whole_at_least(value, 1)
        assert records
