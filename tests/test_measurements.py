"""dcost.measurements: benchmark result files read into measurement records.

Every expected value is derived here from the fixture's own numbers (tests/data/measurements,
which follow each tool's documented schema; see the README there), with the unit conversion
written out, and where a fixture carries per-request lists the summary is held against them too.
"""

from __future__ import annotations

import csv
import json
import math
import pathlib
import statistics

import pytest

import dcost
from dcost import measurements
from dcost.cli.app import main
from dcost.validation import check_records, unknown_presets

DATA = pathlib.Path(__file__).parent / "data" / "measurements"
FLAGS = dict(hardware="h100-sxm", model="llama-3.1-8b", engine="vllm")


def _fixture(name):
    return json.loads((DATA / name).read_text())


def _by_metric(records):
    out = {}
    for r in records:
        out.setdefault(r["metric"], []).append(r)
    return out


def test_vllm_save_result():
    raw = _fixture("vllm_bench_serve.json")
    recs = measurements.read(DATA / "vllm_bench_serve.json", **FLAGS, tensor_parallel=2)
    check_records(recs)
    assert unknown_presets(recs) == []
    got = {r["metric"]: r["value"] for r in recs}
    assert set(got) == {"ttft", "tpot", "itl", "e2e", "output_throughput_per_gpu"}
    # the summary keys, ms -> s
    assert got["ttft"] == pytest.approx(raw["mean_ttft_ms"] / 1000, rel=1e-12)
    assert got["tpot"] == pytest.approx(raw["mean_tpot_ms"] / 1000, rel=1e-12)
    assert got["itl"] == pytest.approx(raw["mean_itl_ms"] / 1000, rel=1e-12)
    assert got["e2e"] == pytest.approx(raw["mean_e2el_ms"] / 1000, rel=1e-12)
    # ... and the same figures from the per-request lists (--save-detailed), in seconds
    ttfts, itls, outs = raw["ttfts"], raw["itls"], raw["output_lens"]
    assert got["ttft"] == pytest.approx(statistics.mean(ttfts), rel=1e-5)
    assert got["itl"] == pytest.approx(statistics.mean(x for i in itls for x in i), rel=1e-5)
    e2e = [t + sum(i) for t, i in zip(ttfts, itls, strict=True)]
    assert got["e2e"] == pytest.approx(statistics.mean(e2e), rel=1e-5)
    tpot = [(e - t) / (n - 1) for e, t, n in zip(e2e, ttfts, outs, strict=True)]
    assert got["tpot"] == pytest.approx(statistics.mean(tpot), rel=1e-5)
    # throughput per GPU: the run's output tokens/s over tp = 2 chips
    assert got["output_throughput_per_gpu"] == pytest.approx(raw["output_throughput"] / 2)
    assert got["output_throughput_per_gpu"] == pytest.approx(
        raw["total_output_tokens"] / raw["duration"] / 2
    )
    r = recs[0]
    assert r["concurrency"] == raw["max_concurrency"]
    assert r["prompt_tokens"] == statistics.mean(raw["input_lens"])
    assert r["output_tokens"] == statistics.mean(outs)
    assert r["gpus"] == 2 and r["engine"] == "vllm" and r["format"] == "vllm"
    assert "engine_version" not in r
    assert set(r["from_file"]) >= {"concurrency", "prompt_tokens", "output_tokens", "value"}
    assert set(r["from_flags"]) >= {"hardware", "model", "engine", "tensor_parallel", "gpus"}
    assert set(r["assumed"]) == {
        "expert_parallel",
        "pipeline_parallel",
        "attention_data_parallel",
        "serving",
        "weights",
        "kv_cache",
        "compute",
    }
    assert f"mean_ttft_ms={raw['mean_ttft_ms']}" in r["quote"]


def test_sglang_jsonl_one_run_a_line():
    lines = [json.loads(x) for x in (DATA / "sglang_bench_serving.jsonl").read_text().splitlines()]
    recs = measurements.read(DATA / "sglang_bench_serving.jsonl", **FLAGS, engine_version="0.5.9")
    check_records(recs)
    assert len(recs) == 5 * len(lines)
    for n, raw in enumerate(lines, 1):
        mine = {r["metric"]: r for r in recs if r["id"].split(":")[1] == str(n)}
        assert mine["e2e"]["value"] == pytest.approx(raw["mean_e2e_latency_ms"] / 1000)
        assert mine["itl"]["value"] == pytest.approx(raw["mean_itl_ms"] / 1000)
        assert mine["ttft"]["value"] == pytest.approx(raw["mean_ttft_ms"] / 1000)
        assert mine["output_throughput_per_gpu"]["value"] == pytest.approx(raw["output_throughput"])
        assert mine["tpot"]["concurrency"] == raw["max_concurrency"]
        assert mine["tpot"]["prompt_tokens"] == raw["total_input_tokens"] / raw["completed"]
        assert mine["tpot"]["engine_version"] == "0.5.9"
        assert mine["tpot"]["format"] == "sglang"


@pytest.mark.parametrize(
    "name, fmt, level_key",
    [
        ("aiperf_profile_export_aiperf.json", "aiperf", ("loadgen", "concurrency")),
        (
            "genai_perf_profile_export_genai_perf.json",
            "genai-perf",
            ("perf_analyzer", "stimulus", "concurrency"),
        ),
    ],
)
def test_aiperf_and_genai_perf_exports(name, fmt, level_key):
    raw = _fixture(name)
    recs = measurements.read(DATA / name, **FLAGS)
    check_records(recs)
    got = _by_metric(recs)
    assert set(got) == {"ttft", "tpot", "e2e", "output_throughput_per_gpu"}  # no chunk ITL
    for metric, key in (
        ("ttft", "time_to_first_token"),
        ("tpot", "inter_token_latency"),  # the tools' per-request (e2e - ttft)/(osl - 1)
        ("e2e", "request_latency"),
    ):
        assert raw[key]["unit"] == "ms"
        assert got[metric][0]["value"] == pytest.approx(raw[key]["avg"] / 1000)
    assert raw["output_token_throughput"]["unit"] == "tokens/sec"
    assert got["output_throughput_per_gpu"][0]["value"] == raw["output_token_throughput"]["avg"]
    level = raw["input_config"]
    for k in level_key:
        level = level[k]
    r = recs[0]
    assert r["concurrency"] == level and r["format"] == fmt
    assert r["prompt_tokens"] == raw["input_sequence_length"]["avg"]
    assert r["output_tokens"] == raw["output_sequence_length"]["avg"]


@pytest.mark.parametrize("unit, per_second", [("sec", 1.0), ("us", 1e6), ("ns", 1e9)])
def test_perf_export_time_units(tmp_path, unit, per_second):
    raw = _fixture("aiperf_profile_export_aiperf.json")
    seconds = raw["time_to_first_token"]["avg"] / 1000
    raw["time_to_first_token"] = {"unit": unit, "avg": seconds * per_second}
    path = tmp_path / "export.json"
    path.write_text(json.dumps(raw))
    (ttft,) = [r for r in measurements.read(path, **FLAGS) if r["metric"] == "ttft"]
    assert ttft["value"] == pytest.approx(seconds, rel=1e-12)


def test_guidellm_report_benchmarks():
    raw = _fixture("guidellm_report.json")
    benches = raw["benchmarks"]
    with pytest.raises(measurements.MeasurementFileError) as err:
        measurements.read(DATA / "guidellm_report.json", **FLAGS)
    assert (err.value.record, err.value.field) == ("benchmarks[2]", "config.strategy")
    assert benches[2]["config"]["strategy"]["type_"] == "constant"  # open loop: no level
    recs = measurements.read(DATA / "guidellm_report.json", **FLAGS, concurrency=12)
    check_records(recs)
    assert len(recs) == 4 * len(benches)
    levels = [1, benches[1]["config"]["strategy"]["streams"], 12]
    for i, bench in enumerate(benches):
        m = bench["metrics"]
        mine = {r["metric"]: r for r in recs if r["id"].split(":")[1] == f"b{i}"}
        ok = m["time_to_first_token_ms"]["successful"]["mean"] / 1000
        assert mine["ttft"]["value"] == pytest.approx(ok)
        # GuideLLM's inter_token_latency excludes the first token: dcost's tpot
        assert mine["tpot"]["value"] == pytest.approx(
            m["inter_token_latency_ms"]["successful"]["mean"] / 1000
        )
        assert mine["e2e"]["value"] == m["request_latency"]["successful"]["mean"]  # already s
        assert (
            mine["output_throughput_per_gpu"]["value"]
            == m["output_tokens_per_second"]["successful"]["mean"]
        )
        assert mine["ttft"]["concurrency"] == levels[i]
        origin = "from_flags" if i == 2 else "from_file"
        assert "concurrency" in mine["ttft"][origin]
        assert mine["ttft"]["prompt_tokens"] == m["prompt_token_count"]["successful"]["mean"]


def test_inference_perf_report():
    raw = _fixture("inference_perf_summary_lifecycle_metrics.json")
    recs = measurements.read(DATA / "inference_perf_summary_lifecycle_metrics.json", **FLAGS)
    check_records(recs)
    got = {r["metric"]: r["value"] for r in recs}
    lat = raw["successes"]["latency"]
    assert got == {  # seconds already
        "ttft": lat["time_to_first_token"]["mean"],
        "tpot": lat["time_per_output_token"]["mean"],
        "itl": lat["inter_token_latency"]["mean"],
        "e2e": lat["request_latency"]["mean"],
        "output_throughput_per_gpu": raw["successes"]["throughput"]["output_tokens_per_sec"],
    }
    assert recs[0]["concurrency"] == raw["load_summary"]["concurrency"]
    assert recs[0]["prompt_tokens"] == raw["successes"]["prompt_tokens"]["mean"]
    assert recs[0]["output_tokens"] == raw["successes"]["output_tokens"]["mean"]


def test_silicon_sample_csv_runs_inferencex_launches(tmp_path):
    """A silicon-sample row of InferenceX's April export that counts its expert-parallel GPUs twice
    is read as the launch (``silicon.inferencex_launch``) at the clients its source states; its
    March twin, the same run to the last digit, as stated: the two records agree."""
    from dcost.validation import silicon

    rows = {r["id"]: r for r in silicon.load_rows()}
    april = next(
        r
        for r in rows.values()
        if r["silicon_data_source"].startswith("db-dump/") and r["backend"] == "sglang"
        and r["mode"] == "agg" and r["tp_size"] == "16" and "Qwen3.5" in r["model_path"]
        and r["isl"] == "1024" and r["osl"] == "1024"
    )  # fmt: skip
    twin = next(
        r
        for r in rows.values()
        if "2026-03-25" in r["silicon_data_source"] and r["backend"] == "sglang"
        and r["silicon_tpot_ms"] == april["silicon_tpot_ms"]
    )  # fmt: skip
    path = tmp_path / "two.csv"
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(april))
        w.writeheader()
        w.writerows([april, twin])
    recs = measurements.read(path, model="qwen3.5-397b-a17b")
    check_records(recs)
    tpot = {r["id"].split(":")[1]: r for r in recs if r["metric"] == "tpot"}
    a, m = tpot[april["id"]], tpot[twin["id"]]
    assert (int(april["tp_size"]), a["gpus"], a["tensor_parallel"], a["expert_parallel"]) == (
        16,
        4,
        4,
        4,
    )
    fields = ("gpus", "tensor_parallel", "attention_data_parallel", "expert_parallel")
    assert [a[k] for k in (*fields, "concurrency")] == [m[k] for k in (*fields, "concurrency")]
    assert a["concurrency"] == int(
        silicon.source_field(april["silicon_data_source"], "silicon_concurrency")
    )
    assert "inferencex_launch" in a["note"] and "inferencex_launch" not in m["note"]
    # both InferenceX's: its client's mean lengths, the KV cache their launch scripts set
    for rec, raw in ((a, april), (m, twin)):
        assert rec["prompt_tokens"] == silicon.inferencex_mean_length(float(raw["isl"])) < 1024
        assert rec["output_tokens"] == silicon.inferencex_mean_length(float(raw["osl"]))
        script = silicon.inferencex_kv_cache(raw)
        assert script is not None and rec["kv_cache"] == script["kv_cache"]
        assert script["source"] in rec["note"] and "kv_cache" not in rec["assumed"]


def test_silicon_sample_csv():
    path = DATA / "silicon_sample.csv"
    rows = {r["id"]: r for r in csv.DictReader(path.read_text().splitlines())}
    with pytest.raises(measurements.MeasurementFileError) as err:
        measurements.read(path)  # the int4 weight-only row has no dcost format
    assert err.value.field == "gemm_quant_mode" and "qwen3_32b_h100" in err.value.record
    models = {"meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b"}
    models["deepseek-ai/DeepSeek-R1"] = "deepseek-r1"
    recs = measurements.read(path, model=models, on_unsupported="skip")
    check_records(recs)
    assert unknown_presets(recs) == []
    by_id = {r["id"].split(":")[1] + ":" + r["metric"]: r for r in recs}
    assert len(recs) == 6  # two agg rows x (ttft, tpot) + one disagg row x (prefill, decode)
    for key, r in by_id.items():
        row = rows[key.split(":")[0].split("/")[0]]
        assert r["value"] == pytest.approx(float(row[f"silicon_{r['metric']}_ms"]) / 1000)
        assert r["hardware"] == measurements.AIC_SYSTEMS[row["system"]]
        assert r["model"] == models[row["model_path"]]
        assert (r["engine"], r["engine_version"]) == (row["backend"], row["backend_version"])
        assert (r["prompt_tokens"], r["output_tokens"]) == (float(row["isl"]), float(row["osl"]))
        assert "engine" in r["from_file"] and "model" in r["from_flags"]
        assert r["assumed"] == ["kv_cache"]
    dense = by_id["llama31_8b_h200_vllm_bf16_agg_1024x256_c32:tpot"]
    assert (dense["serving"], dense["concurrency"], dense["gpus"]) == ("aggregated", 32, 1)
    assert dense["weights"] == dense["compute"] == "bf16"
    dep = by_id["dsr1_b200_sglang_fp8_agg_4096x1024_c256:ttft"]  # attention DP 8 x EP 8
    assert (dep["gpus"], dep["attention_data_parallel"], dep["expert_parallel"]) == (8, 8, 8)
    assert dep["weights"] == "fp8"  # fp8_block
    pre = by_id["dsr1_gb200_trtllm_fp4_disagg_8192x1024_c64/prefill:ttft"]
    dec = by_id["dsr1_gb200_trtllm_fp4_disagg_8192x1024_c64/decode:tpot"]
    row = rows["dsr1_gb200_trtllm_fp4_disagg_8192x1024_c64"]
    assert (pre["serving"], pre["concurrency"]) == ("prefill", int(row["prefill_batch_size"]))
    assert (dec["serving"], dec["concurrency"]) == ("decode", int(row["decode_batch_size"]))
    assert pre["tensor_parallel"] == int(row["prefill_tp_size"]) and pre["weights"] == "fp4"
    assert dec["gpus"] == int(row["decode_tp_size"]) * int(row["decode_attention_dp_size"])


def test_detect_each_fixture():
    expected = {
        "vllm_bench_serve.json": "vllm",
        "sglang_bench_serving.jsonl": "sglang",
        "aiperf_profile_export_aiperf.json": "aiperf",
        "genai_perf_profile_export_genai_perf.json": "genai-perf",
        "guidellm_report.json": "guidellm",
        "inference_perf_summary_lifecycle_metrics.json": "inference-perf",
        "silicon_sample.csv": "silicon-sample",
    }
    assert sorted(expected) == sorted(p.name for p in DATA.iterdir() if p.suffix != ".md")
    for name, fmt in expected.items():
        assert measurements.detect((DATA / name).read_text()) == fmt
    with pytest.raises(ValueError, match="not a result file"):
        measurements.detect('{"hello": 1}')


def _write(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text)
    return path


def _vllm(**changes):
    raw = _fixture("vllm_bench_serve.json")
    raw.update(changes)
    return raw


@pytest.mark.parametrize(
    "name, text, record, field",
    [
        ("bad.json", json.dumps(_vllm(mean_ttft_ms="fast")), "file", "mean_ttft_ms"),
        ("neg.json", json.dumps(_vllm(mean_tpot_ms=-1.0)), "file", "mean_tpot_ms"),
        ("nan.json", json.dumps(_vllm(mean_itl_ms=float("nan"))), "file", "mean_itl_ms"),
        ("none.json", json.dumps(_vllm(completed=0)), "file", "completed"),
        ("conc.json", json.dumps(_vllm(max_concurrency=2.5)), "file", "max_concurrency"),
        ("open.json", json.dumps(_vllm(max_concurrency=None)), "file", "max_concurrency"),
        ("trunc.json", '{"mean_ttft_ms": 1.0,\n "completed": ', "line 2", "(JSON)"),
        ("empty.json", "", "file", "(path)"),
        ("blank.json", "\n  \n", "file", "(path)"),
    ],
)
def test_malformed_files_name_file_record_field(tmp_path, name, text, record, field):
    path = _write(tmp_path, name, text)
    with pytest.raises(measurements.MeasurementFileError) as err:
        measurements.read(path, **FLAGS)
    assert (err.value.file, err.value.record, err.value.field) == (str(path), record, field)
    assert str(path) in str(err.value) and field in str(err.value)


def test_malformed_jsonl_line_and_nested_fields(tmp_path):
    lines = (DATA / "sglang_bench_serving.jsonl").read_text().splitlines()
    second = json.loads(lines[1])
    del second["total_output_tokens"]
    path = _write(tmp_path, "s.jsonl", lines[0] + "\n" + json.dumps(second) + "\n")
    with pytest.raises(measurements.MeasurementFileError) as err:
        measurements.read(path, **FLAGS)
    assert (err.value.record, err.value.field) == ("line 2", "total_output_tokens")
    path = _write(tmp_path, "t.jsonl", lines[0] + "\n" + lines[1][:-5] + "\n")
    with pytest.raises(measurements.MeasurementFileError) as err:
        measurements.read(path, **FLAGS)
    assert (err.value.record, err.value.field) == ("line 2", "(JSON)")

    report = _fixture("guidellm_report.json")
    report["benchmarks"][1]["metrics"]["time_to_first_token_ms"]["successful"]["mean"] = "x"
    path = _write(tmp_path, "g.json", json.dumps(report))
    with pytest.raises(measurements.MeasurementFileError) as err:
        measurements.read(path, **FLAGS, concurrency=4)
    assert err.value.record == "benchmarks[1]"
    assert err.value.field == "metrics.time_to_first_token_ms.successful.mean"

    export = _fixture("aiperf_profile_export_aiperf.json")
    export["request_latency"]["unit"] = "fortnights"
    path = _write(tmp_path, "a.json", json.dumps(export))
    with pytest.raises(measurements.MeasurementFileError, match="allowed: ns, us, ms") as err:
        measurements.read(path, **FLAGS)
    assert err.value.field == "request_latency.unit"


def test_malformed_csv_rows(tmp_path):
    text = (DATA / "silicon_sample.csv").read_text().splitlines()
    row = text[2].split(",")
    row[-1] = "n/a"  # silicon_tpot_ms
    path = _write(tmp_path, "s.csv", "\n".join([text[0], text[1], ",".join(row)]) + "\n")
    with pytest.raises(measurements.MeasurementFileError) as err:
        measurements.read(path)
    assert err.value.record.startswith("line 3") and err.value.field == "silicon_tpot_ms"
    header = text[0].replace(",isl,", ",input_len,")
    path = _write(tmp_path, "h.csv", "\n".join([header, text[1]]) + "\n")
    with pytest.raises(measurements.MeasurementFileError) as err:
        measurements.read(path)
    assert (err.value.record, err.value.field) == ("header", "isl")


def test_flags_needed_and_conflicts(tmp_path):
    path = DATA / "vllm_bench_serve.json"
    with pytest.raises(measurements.MeasurementFileError, match="pass engine="):
        measurements.read(path, hardware="h100-sxm", model="llama-3.1-8b")
    with pytest.raises(measurements.MeasurementFileError, match="not a hardware preset"):
        measurements.read(path, hardware="h1OO", model="llama-3.1-8b", engine="vllm")
    # a model flag names a preset (a file's own model name is kept: unknown_presets lists it)
    with pytest.raises(measurements.MeasurementFileError, match="'llama-9' is not a model preset"):
        measurements.read(path, hardware="h100-sxm", model="llama-9", engine="vllm")
    with pytest.raises(ValueError, match="tensor_parallel = 0"):
        measurements.read(path, **FLAGS, tensor_parallel=0)
    with pytest.raises(measurements.MeasurementFileError, match="in the flags") as err:
        measurements.read(DATA / "silicon_sample.csv", engine="vllm", on_unsupported="skip")
    assert err.value.field == "engine"
    # one preset for a file whose rows name several: refused, not applied to all
    with pytest.raises(measurements.MeasurementFileError, match="as a mapping") as err:
        measurements.read(DATA / "silicon_sample.csv", model="deepseek-r1", on_unsupported="skip")
    assert (err.value.record, err.value.field) == ("file", "model")


def test_unmeasured_metric_gives_no_record(tmp_path):
    # a non-streamed run: the tools write 0 for ITL (no gaps measured)
    path = _write(tmp_path, "ns.json", json.dumps(_vllm(mean_itl_ms=0.0, mean_tpot_ms=None)))
    metrics = {r["metric"] for r in measurements.read(path, **FLAGS)}
    assert metrics == {"ttft", "e2e", "output_throughput_per_gpu"}


def test_cli_table_and_strict_json(capsys):
    files = [str(DATA / "vllm_bench_serve.json"), str(DATA / "sglang_bench_serving.jsonl")]
    flags = ["--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--engine", "vllm"]
    assert main(["measurements", *files, *flags, "--tensor-parallel", "1"]) == 0
    out = capsys.readouterr().out
    assert "vllm_bench_serve.json:1:ttft" in out and "sglang_bench_serving.jsonl:2:e2e" in out
    assert "57.5 ms" in out  # the vllm fixture's mean_ttft_ms, printed in ms
    assert "assumed: expert_parallel" in out

    assert main(["measurements", *files, *flags, "--json"]) == 0

    def refuse(token):
        raise AssertionError(f"not strict JSON: {token}")

    printed = json.loads(capsys.readouterr().out, parse_constant=refuse)
    expected = [r for f in files for r in measurements.read(f, **FLAGS)]
    assert printed == expected
    assert all(math.isfinite(r["value"]) for r in printed)


def test_cli_error_names_the_file(capsys, tmp_path):
    path = _write(tmp_path, "bad.json", json.dumps(_vllm(mean_ttft_ms="fast")))
    assert main(["measurements", str(path), "--hardware", "h100-sxm", "--model", "x"]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and "mean_ttft_ms" in err


JSON_FIXTURES = sorted(p.name for p in DATA.iterdir() if p.suffix in (".json", ".jsonl"))


@pytest.mark.parametrize("name", JSON_FIXTURES)
def test_fast_reader_gives_the_same_records(monkeypatch, name):
    """Large files skip building their per-request number lists; the records are the same."""
    flags = dict(FLAGS, concurrency=12)
    slow = measurements.read(DATA / name, **flags)
    monkeypatch.setattr(measurements, "_FAST_FROM", 0)  # every file through the fast reader
    assert measurements.read(DATA / name, **flags) == slow


def test_fast_reader_lists_of_strings_and_bad_numbers(monkeypatch, tmp_path):
    monkeypatch.setattr(measurements, "_FAST_FROM", 0)
    raw = _vllm(generated_texts=["a]b", "[c", '"]', "{"], itls=[[], [0.01], [[0.02]], []])
    path = _write(tmp_path, "strings.json", json.dumps(raw, indent=1))
    assert measurements.read(path, **FLAGS)[0]["value"] == raw["mean_ttft_ms"] / 1000
    text = json.dumps(_vllm(), indent=1).replace('"ttfts": [', '"ttfts": [0.1x, ')
    path = _write(tmp_path, "typo.json", text)
    with pytest.raises(measurements.MeasurementFileError) as err:
        measurements.read(path, **FLAGS)
    line = 1 + text[: text.index("0.1x")].count("\n")
    assert (err.value.record, err.value.field) == (f"line {line}", "(JSON)")


def test_cli_calibrates_a_profile_from_result_files(capsys, tmp_path):
    """``dcost calibrate --from``: a vLLM result file calibrates the shipped profile; the profile
    it writes loads as an engine that says how many records made it, and the printed 80 % band
    is that of deployments calibrated on as many runs (the shipped k = 3 table)."""
    out = tmp_path / "mine.toml"
    flags = ["--hardware", "h100-sxm", "--model", "llama-3.1-8b", "--engine", "vllm"]
    argv = ["calibrate", "--from", str(DATA / "vllm_bench_serve.json"), *flags]
    assert main([*argv, "--out", str(out), "--json"]) == 0

    def refuse(token):
        raise AssertionError(f"not strict JSON: {token}")

    printed = json.loads(capsys.readouterr().out, parse_constant=refuse)
    fitted = [
        r
        for r in measurements.read(DATA / "vllm_bench_serve.json", **FLAGS)
        if r["metric"] in ("tpot", "ttft", "output_throughput_per_gpu")
    ]
    assert printed["records"] == len(fitted) == 3
    mine = dcost.engine("vllm", hardware="h100-sxm", profile=out)
    assert mine.provenance["records"] == 3
    assert mine.provenance["models"] == ["llama-3.1-8b"]
    band = dcost.engines.own_measurements()["intervals"]["vllm"]["3"]
    want = [math.exp(-band["q90"]), math.exp(-band["q10"])]
    assert printed["band_80"] == pytest.approx(want, rel=1e-9)
    assert printed["band_80"] != pytest.approx(dcost.engines.interval_factors("vllm", 0.8))
    assert main([*argv, "--out", str(tmp_path / "again.toml")]) == 0
    text = capsys.readouterr().out
    assert f"x{want[0]:.2f} to x{want[1]:.2f} (deployments calibrated on 3 of" in text
    assert "again.toml" in text
    assert printed["loss"].startswith("Huber's") and "Huber's, 1.345 spreads loss" in text
    # --least-squares: the same runs by least squares, said in the profile and the output
    plain = tmp_path / "plain.toml"
    assert main([*argv, "--out", str(plain), "--least-squares", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["loss"] == "least squares"
    assert dcost.engine("vllm", hardware="h100-sxm", profile=plain).provenance["loss"] == (
        "least squares"
    )
