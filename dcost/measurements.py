"""Measurement records from the result files that serving benchmarks write.

``read(path, hardware=..., model=..., engine=...)`` turns one result file into measurement records
(DESIGN.md sections 5 and 6): one record per metric the file states, in SI units, that
:func:`dcost.validation.check_record` accepts like a shipped record. What the file states is taken
from it; what it does not (the chip, the model preset, the engine and its version, the parallel
layout, the number formats) comes from the keywords, and each record lists which fields came from
where: ``from_file``, ``from_flags`` and ``assumed`` (a default nobody stated).

The format is told from the content (``FORMATS``):

- ``vllm``: ``vllm bench serve --save-result`` (one JSON object; ``--append-result`` adds one per
  line). Keys: ``mean_ttft_ms``, ``mean_tpot_ms``, ``mean_itl_ms``, ``mean_e2el_ms``,
  ``output_throughput`` (tokens/s), ``completed``, ``total_input_tokens``,
  ``total_output_tokens``, ``max_concurrency``.
- ``sglang``: ``python -m sglang.bench_serving --output-file`` (JSON Lines, one run a line): the
  same ``mean_*_ms`` keys with ``mean_e2e_latency_ms`` for the end-to-end latency.
- ``aiperf`` and ``genai-perf``: ``profile_export_aiperf.json`` and
  ``profile_export_genai_perf.json``, one ``{"unit", "avg", "p50", ...}`` table per metric
  (``time_to_first_token``,
  ``inter_token_latency``, ``inter_chunk_latency``, ``request_latency``,
  ``output_token_throughput``, ``input_sequence_length``, ``output_sequence_length``) and the
  ``input_config`` the run used (its concurrency).
- ``guidellm``: the JSON report (``benchmarks[i].metrics.<metric>.successful.mean``; latencies in
  ms except ``request_latency`` in s; ``config.strategy`` gives the concurrency).
- ``inference-perf``: a lifecycle report (``successes.latency.*.mean`` in s,
  ``successes.throughput.output_tokens_per_sec``, ``load_summary.concurrency``).
- ``silicon-sample``: the CSV layout of AIConfigurator's silicon sample (one measured deployment a
  row: system, backend and version, model, precision, layout, batch size, ISL/OSL,
  ``silicon_ttft_ms``, ``silicon_tpot_ms``); it states the chip, model, engine and layout itself.

Metric names follow DESIGN.md: ``ttft`` (first token), ``tpot`` (a request's
``(e2e - ttft)/(output - 1)``, averaged over requests), ``itl`` (the time between consecutive
streamed chunks, averaged over all gaps), ``e2e`` (arrival to last token) in seconds, and
``output_throughput_per_gpu`` (the run's output tokens/s over ``gpus``). AIPerf's and GuideLLM's
``inter_token_latency`` are per-request ``(e2e - ttft)/(output - 1)``: they are ``tpot`` here.
A metric a tool writes as ``null`` or ``0`` (not measured: no streaming, an embedding run) gives no
record. A malformed file raises :class:`MeasurementFileError` naming the file, the record (line,
index or row) and the field.

>>> import json, os, tempfile
>>> run = {"backend": "vllm", "model_id": "meta-llama/Llama-3.1-8B", "max_concurrency": 8,
...        "completed": 100, "total_input_tokens": 51200, "total_output_tokens": 12800,
...        "output_throughput": 1600.0, "mean_ttft_ms": 40.0, "mean_tpot_ms": 12.5,
...        "mean_itl_ms": 12.4, "mean_e2el_ms": 1627.5}
>>> path = os.path.join(tempfile.mkdtemp(), "result.json")
>>> with open(path, "w") as f:
...     json.dump(run, f)
>>> recs = read(path, hardware="h100-sxm", model="llama-3.1-8b", engine="vllm")
>>> [(r["metric"], r["value"]) for r in recs]  # doctest: +NORMALIZE_WHITESPACE
[('ttft', 0.04), ('tpot', 0.0125), ('itl', 0.0124), ('e2e', 1.6275),
 ('output_throughput_per_gpu', 1600.0)]
>>> recs[0]["concurrency"], recs[0]["prompt_tokens"], recs[0]["output_tokens"]
(8, 512.0, 128.0)
"""

from __future__ import annotations

import csv
import io
import json
import math
import pathlib
import re
from collections.abc import Iterator, Mapping
from typing import Any, NoReturn

__all__ = ["read", "detect", "FORMATS", "MeasurementFileError", "AIC_SYSTEMS"]

# format -> (the tool, where its output schema is defined)
FORMATS: dict[str, str] = {
    "vllm": "vllm bench serve --save-result (vllm/benchmarks/serve.py)",
    "sglang": "sglang.bench_serving --output-file (python/sglang/bench_serving.py)",
    "aiperf": "NVIDIA AIPerf profile_export_aiperf.json (aiperf/common/models/export_models.py)",
    "genai-perf": "NVIDIA GenAI-Perf profile_export_genai_perf.json "
    "(genai-perf/genai_perf/export_data/json_exporter.py)",
    "guidellm": "GuideLLM JSON report (src/guidellm/benchmark/schemas/report.py)",
    "inference-perf": "inference-perf lifecycle report (inference_perf/reportgen/base.py)",
    "silicon-sample": "AIConfigurator silicon-sample CSV "
    "(aiconfigurator_core/systems/silicon_sample.csv)",
}

# AIConfigurator's system names -> dcost hardware presets (the same chips; the GB200/GB300
# systems are the NVL72 racks).
AIC_SYSTEMS: dict[str, str] = {
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200",
    "b200_sxm": "b200",
    "b300_sxm": "b300",
    "gb200": "gb200-nvl72",
    "gb300": "gb300-nvl72",
}

# AIConfigurator's quantization modes -> dcost's number formats; "int4_wo" (4-bit weight-only)
# has no dcost format and is refused.
_AIC_QUANT = {"bf16": "bf16", "fp16": "bf16", "fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4"}
_AIC_QUANT.update({"fp4": "fp4", "int8": "int8"})

_DEGREES = ("tensor_parallel", "expert_parallel", "pipeline_parallel", "attention_data_parallel")
_PRECISIONS = ("weights", "kv_cache", "compute")
_TIME_UNITS = {"ns": 1e9, "us": 1e6, "ms": 1e3, "s": 1.0, "sec": 1.0}  # per second
_MISSING = object()


class MeasurementFileError(ValueError):
    """A result file that cannot be read into records: ``file``, ``record`` (its line, index or
    row) and ``field`` say where, the message says what is allowed."""

    def __init__(self, file: str, record: str, field: str, message: str):
        self.file, self.record, self.field = file, record, field
        super().__init__(f"{file}: {record}: field {field!r} {message}")


class _Ctx:
    """Where a value is read from, for error messages: the file and the record in it."""

    def __init__(self, file: str, record: str):
        self.file, self.record = file, record

    def fail(self, field: str, message: str) -> NoReturn:
        raise MeasurementFileError(self.file, self.record, field, message)


def _get(obj: Any, dotted: str, ctx: _Ctx) -> Any:
    """``obj["a"]["b"]`` for ``"a.b"``; ``_MISSING`` when a key is absent or null; an error when
    a step that must be a table is not one."""
    cur = obj
    done: list[str] = []
    for key in dotted.split("."):
        if cur is None:
            return _MISSING
        if not isinstance(cur, Mapping):
            ctx.fail(".".join(done) or dotted, f"= {_short(cur)}; must be a JSON object")
        if key not in cur:
            return _MISSING
        cur = cur[key]
        done.append(key)
    return _MISSING if cur is None else cur


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _number(value: Any, field: str, ctx: _Ctx, *, positive: bool = False) -> float:
    """``value`` as a finite float (>= 0, or > 0 when ``positive``); an error naming the field."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            ctx.fail(field, f"= {_short(value)}; must be a number")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        ctx.fail(field, f"= {_short(value)}; must be a number")
    x = float(value)
    if not math.isfinite(x) or x < 0 or (positive and x == 0):
        ctx.fail(field, f"= {_short(value)}; must be a finite number {'>' if positive else '>='} 0")
    return x


def _whole(value: Any, field: str, ctx: _Ctx) -> int:
    """``value`` as a positive integer (an integral float such as ``8.0`` is accepted)."""
    x = _number(value, field, ctx, positive=True)
    if x != int(x):
        ctx.fail(field, f"= {_short(value)}; must be a positive integer")
    return int(x)


class _Run:
    """What one run in a file states: metrics (SI), lengths, concurrency, other fields."""

    def __init__(self, ctx: _Ctx, label: str):
        self.ctx, self.label = ctx, label
        self.metrics: dict[str, float] = {}
        self.stated: dict[str, Any] = {}  # record field -> value, as the file states it
        self.quote: list[str] = []  # "key=value" of every number taken from the file
        self.notes: list[str] = []
        self.level_key = "concurrency"  # where the format states its concurrency, for errors

    def take(self, obj: Any, key: str, *, per: float = 1.0, positive=False) -> float | None:
        """The number at dotted ``key`` over ``per`` (1000 for ms); None when absent or null."""
        raw = _get(obj, key, self.ctx)
        if raw is _MISSING:
            return None
        value = _number(raw, key, self.ctx, positive=positive) / per
        self.quote.append(f"{key}={raw}")
        return value

    def metric(self, name: str, obj: Any, key: str, per: float) -> None:
        value = self.take(obj, key, per=per)
        if value:  # null or 0: the tool did not measure it
            self.metrics[name] = value

    def need(self, field: str, value: Any, key: str) -> None:
        if value is None:
            self.ctx.fail(key, f"is missing; the {field} of a run is read from it")
        self.stated[field] = value


# ---------------------------------------------------------------------------------------------
# the formats


def _vllm_like(obj: Mapping, run: _Run, fmt: str) -> None:
    ms = 1e3
    run.metric("ttft", obj, "mean_ttft_ms", ms)
    run.metric("tpot", obj, "mean_tpot_ms", ms)
    run.metric("itl", obj, "mean_itl_ms", ms)
    run.metric("e2e", obj, "mean_e2el_ms" if fmt == "vllm" else "mean_e2e_latency_ms", ms)
    throughput = run.take(obj, "output_throughput")
    if throughput:
        run.metrics["output_throughput"] = throughput
    completed = run.take(obj, "completed", positive=True)
    if completed is None:
        run.ctx.fail("completed", "is missing; mean lengths are totals over completed requests")
    for field, key in (
        ("prompt_tokens", "total_input_tokens"),
        ("output_tokens", "total_output_tokens"),
    ):
        total = run.take(obj, key, positive=True)
        run.need(field, None if total is None else total / completed, key)
    run.level_key = "max_concurrency"
    level = _get(obj, "max_concurrency", run.ctx)
    if level is not _MISSING:
        run.stated["concurrency"] = _whole(level, "max_concurrency", run.ctx)
        run.quote.append(f"max_concurrency={level}")
    model = obj.get("model_id")
    if isinstance(model, str):
        run.notes.append(f"the file's model: {model}")
    run.notes.append(
        "prompt_tokens = total_input_tokens / completed; output_tokens = total_output_tokens "
        "/ completed; concurrency = max_concurrency (the client's cap on requests in flight)"
    )


def _per_second(table: Any, key: str, kind: str, run: _Run) -> float:
    unit = _get(table, "unit", run.ctx)
    if kind == "time":
        if unit not in _TIME_UNITS:
            run.ctx.fail(f"{key}.unit", f"= {_short(unit)}; allowed: {', '.join(_TIME_UNITS)}")
        return _TIME_UNITS[unit]
    allowed = ("tokens/sec", "tokens/s") if kind == "rate" else ("tokens",)
    if unit not in allowed:
        run.ctx.fail(f"{key}.unit", f"= {_short(unit)}; allowed: {', '.join(allowed)}")
    return 1.0


def _perf_export(obj: Mapping, run: _Run, fmt: str) -> None:
    for name, key in (
        ("ttft", "time_to_first_token"),
        ("tpot", "inter_token_latency"),
        ("itl", "inter_chunk_latency"),
        ("e2e", "request_latency"),
    ):
        table = _get(obj, key, run.ctx)
        if table is not _MISSING:
            run.metric(name, obj, f"{key}.avg", _per_second(table, key, "time", run))
    table = _get(obj, "output_token_throughput", run.ctx)
    if table is not _MISSING:
        _per_second(table, "output_token_throughput", "rate", run)
        value = run.take(obj, "output_token_throughput.avg")
        if value:
            run.metrics["output_throughput"] = value
    for field, key in (
        ("prompt_tokens", "input_sequence_length"),
        ("output_tokens", "output_sequence_length"),
    ):
        table = _get(obj, key, run.ctx)
        if table is not _MISSING:
            _per_second(table, key, "tokens", run)
        run.need(field, run.take(obj, f"{key}.avg", positive=True), f"{key}.avg")
    run.level_key = "input_config." + ("loadgen" if fmt == "aiperf" else "perf_analyzer.stimulus")
    run.level_key += ".concurrency"
    for key in (
        "input_config.loadgen.concurrency",  # AIPerf
        "input_config.perf_analyzer.stimulus.concurrency",  # GenAI-Perf, config-file era
        "input_config.concurrency",  # GenAI-Perf, command-line era
    ):
        level = _get(obj, key, run.ctx)
        if level is not _MISSING:
            run.stated["concurrency"] = _whole(level, key, run.ctx)
            run.quote.append(f"{key}={level}")
            break
    run.notes.append(
        "tpot = inter_token_latency.avg (the tool's per-request (e2e - ttft)/(output - 1)); "
        "itl = inter_chunk_latency.avg; prompt/output tokens = input/output_sequence_length.avg"
    )


def _guidellm_run(bench: Mapping, run: _Run) -> None:
    ms = 1e3
    m = "metrics"
    run.metric("ttft", bench, f"{m}.time_to_first_token_ms.successful.mean", ms)
    run.metric("tpot", bench, f"{m}.inter_token_latency_ms.successful.mean", ms)
    run.metric("e2e", bench, f"{m}.request_latency.successful.mean", 1.0)
    value = run.take(bench, f"{m}.output_tokens_per_second.successful.mean")
    if value:
        run.metrics["output_throughput"] = value
    for field, key in (
        ("prompt_tokens", "prompt_token_count"),
        ("output_tokens", "output_token_count"),
    ):
        dotted = f"{m}.{key}.successful.mean"
        run.need(field, run.take(bench, dotted, positive=True), dotted)
    run.level_key = "config.strategy"
    strategy = _get(bench, "config.strategy", run.ctx)
    if strategy is not _MISSING:
        kind = _get(strategy, "type_", run.ctx)
        if kind == "concurrent":
            streams = _get(strategy, "streams", run.ctx)
            run.stated["concurrency"] = _whole(streams, "config.strategy.streams", run.ctx)
            run.quote.append(f"config.strategy.streams={streams}")
        elif kind == "synchronous":
            run.stated["concurrency"] = 1
            run.quote.append("config.strategy.type_=synchronous")
    run.notes.append(
        "tpot = inter_token_latency_ms (GuideLLM's per-request (last - first token)/(output - 1));"
        " means over successful requests"
    )


def _inference_perf(obj: Mapping, run: _Run) -> None:
    lat = "successes.latency"
    run.metric("ttft", obj, f"{lat}.time_to_first_token.mean", 1.0)
    run.metric("tpot", obj, f"{lat}.time_per_output_token.mean", 1.0)
    run.metric("itl", obj, f"{lat}.inter_token_latency.mean", 1.0)
    run.metric("e2e", obj, f"{lat}.request_latency.mean", 1.0)
    value = run.take(obj, "successes.throughput.output_tokens_per_sec")
    if value:
        run.metrics["output_throughput"] = value
    for field, keys in (
        ("prompt_tokens", ("successes.prompt_tokens.mean", "successes.prompt_len.mean")),
        ("output_tokens", ("successes.output_tokens.mean", "successes.output_len.mean")),
    ):
        key = next((k for k in keys if _get(obj, k, run.ctx) is not _MISSING), keys[0])
        run.need(field, run.take(obj, key, positive=True), key)
    run.level_key = "load_summary.concurrency"
    level = _get(obj, "load_summary.concurrency", run.ctx)
    if level is not _MISSING:
        run.stated["concurrency"] = _whole(level, "load_summary.concurrency", run.ctx)
        run.quote.append(f"load_summary.concurrency={level}")


_SILICON_COLUMNS = (
    "id,silicon_data_source,backend,backend_version,model_path,system,precision,mode,isl,osl,"
    "gemm_quant_mode,moe_quant_mode,batch_size,tp_size,pp_size,attention_dp_size,moe_tp_size,"
    "moe_ep_size"
).split(",")


def _silicon_row(row: Mapping[str, str], ctx: _Ctx, on_unsupported: str) -> list[_Run]:
    """One CSV row: an aggregated row gives one run (ttft and tpot at the row's layout); a
    disaggregated row gives a prefill run (its ttft) and a decode run (its tpot), each at its
    pool's layout and per-worker batch."""

    def cell(col: str) -> str:
        value = row.get(col)
        if value is None:
            ctx.fail(col, "is missing: the row is shorter than the header")
        return value.strip()

    def unsupported(col: str, why: str) -> list[_Run]:
        if on_unsupported == "skip":
            return []
        ctx.fail(col, f"{why} (read(..., on_unsupported='skip') leaves such rows out)")
        raise AssertionError  # unreachable

    def degree(col: str) -> int:
        text = cell(col)
        if text in ("", "0"):  # not applicable (a dense model's MoE columns, no attention DP)
            return 1
        return _whole(text, col, ctx)

    system = cell("system")
    quant = {}
    for col in ("gemm_quant_mode", "moe_quant_mode"):
        mode = cell(col) or cell("precision")
        if mode == "":
            continue
        if mode not in _AIC_QUANT:
            return unsupported(
                col, f"= {mode!r}: dcost has no such number format (it has bf16, fp8, fp4, int8)"
            )
        quant[col] = _AIC_QUANT[mode]
    common: dict[str, Any] = {"hardware_name": system, "model_name": cell("model_path")}
    common["engine"] = cell("backend")
    if cell("backend_version"):
        common["engine_version"] = cell("backend_version")
    if quant:
        # the expert weights are most of an MoE model's bytes: their format stands for weights
        common["weights"] = quant.get("moe_quant_mode", quant.get("gemm_quant_mode"))
        common["compute"] = quant.get("gemm_quant_mode", common["weights"])
    isl = _number(cell("isl"), "isl", ctx, positive=True)
    osl = _number(cell("osl"), "osl", ctx, positive=True)
    mode = cell("mode")
    quote = ", ".join(f"{k}={v}" for k, v in row.items() if v not in ("", None))
    pools: list[tuple[str, str, tuple[str, ...]]]
    if mode == "agg":
        pools = [("aggregated", "", ("ttft", "tpot"))]
    elif mode == "disagg":
        pools = [("prefill", "prefill_", ("ttft",)), ("decode", "decode_", ("tpot",))]
    else:
        ctx.fail("mode", f"= {mode!r}; allowed: agg, disagg")
    runs = []
    for serving, prefix, metrics in pools:
        batch = cell(prefix + "batch_size")
        if batch == "":
            return unsupported(
                prefix + "batch_size",
                "is empty: the per-worker concurrency of this row is not stated",
            )
        label = (row.get("id") or ctx.record) + (f"/{serving}" if prefix else "")
        run = _Run(ctx, label)
        run.stated.update(common)
        run.stated["serving"] = serving
        run.stated["concurrency"] = _whole(batch, prefix + "batch_size", ctx)
        tp, pp = degree(prefix + "tp_size"), degree(prefix + "pp_size")
        adp = degree(prefix + "attention_dp_size")
        run.stated.update(
            tensor_parallel=tp,
            pipeline_parallel=pp,
            attention_data_parallel=adp,
            expert_parallel=degree(prefix + "moe_ep_size"),
            gpus=tp * pp * adp,
        )
        if not prefix:
            _inferencex_launch(row, run)
        run.stated["prompt_tokens"], run.stated["output_tokens"] = isl, osl
        _inferencex_client(row, run)
        for name in metrics:
            col = f"silicon_{name}_ms"
            run.metrics[name] = _number(cell(col), col, ctx, positive=True) / 1e3
        run.quote.append(quote)
        run.notes.append(
            "one row of an AIConfigurator silicon-sample table; gpus = tp * pp * attention_dp; "
            "concurrency = the pool's batch_size (per worker)"
            + ("; a disaggregated system's ttft includes the KV transfer" if prefix else "")
        )
        runs.append(run)
    return runs


def _inferencex_launch(row: Mapping[str, str], run: _Run) -> None:
    """An aggregated row of InferenceX's April exports whose layout counts the GPUs of its expert
    parallelism twice runs the launch (``dcost.validation.silicon.inferencex_launch``), at the
    clients its source states (the row's ``batch_size`` is a share of them, not the batch)."""
    from dcost.validation import silicon

    keys = ("tensor_parallel", "pipeline_parallel", "attention_data_parallel", "expert_parallel")
    layout = {k: run.stated[k] for k in (*keys, "gpus")}
    launch = silicon.inferencex_launch(row, layout)
    if launch is None:
        return
    run.stated.update(launch)
    clients = silicon.source_field(str(row.get("silicon_data_source", "")), "silicon_concurrency")
    if clients:
        run.stated["concurrency"] = _whole(clients, "silicon_data_source", run.ctx)
    run.notes.append(
        f"InferenceX's export states {layout['gpus']} GPUs for a launch of {launch['gpus']} "
        "with expert parallelism over them: the launch's layout, at the clients its "
        "silicon_data_source states (dcost.validation.silicon.inferencex_launch)"
    )


def _inferencex_client(row: Mapping[str, str], run: _Run) -> None:
    """An InferenceX row: its client's mean lengths (``silicon.inferencex_mean_length``) and,
    for a single-node aggregated run, the KV-cache format its launch script set
    (``silicon.inferencex_kv_cache``)."""
    from dcost.validation import silicon

    if not silicon.inferencex(row):
        return
    for k in ("prompt_tokens", "output_tokens"):
        run.stated[k] = silicon.inferencex_mean_length(float(run.stated[k]))
    run.notes.append(
        "InferenceX's client draws lengths uniformly over [0.8 L, L]: the mean lengths "
        "(dcost.validation.silicon.inferencex_mean_length)"
    )
    script = silicon.inferencex_kv_cache(row)
    if script is not None:
        run.stated["kv_cache"] = script["kv_cache"]
        run.notes.append(f"kv_cache {script['kv_cache']}: {script['setting']} ({script['source']})")


def detect(text: str) -> str:
    """The format of a result file's ``text`` (one of ``FORMATS``), from its content.

    >>> detect('{"mean_ttft_ms": 12.0, "mean_e2el_ms": 900.0, "completed": 10}')
    'vllm'
    >>> detect('{"mean_ttft_ms": 12.0, "mean_e2e_latency_ms": 900.0}\\n')
    'sglang'
    """
    head = text.lstrip()[:4096]
    if head.startswith("id,silicon_data_source"):
        return "silicon-sample"
    objs = list(_json_objects(text, "<text>", limit=1))
    if objs:
        return _detect_obj(objs[0][1])
    raise ValueError("not a result file this reader knows: " + ", ".join(FORMATS))


def _detect_obj(obj: Any) -> str:
    if not isinstance(obj, Mapping):
        raise ValueError("a result file must hold a JSON object (or one per line)")
    if isinstance(obj.get("benchmarks"), list):
        return "guidellm"
    if "successes" in obj and ("load_summary" in obj or "failures" in obj):
        return "inference-perf"
    if any(
        isinstance(obj.get(k), Mapping) and "unit" in obj[k]
        for k in (
            "time_to_first_token",
            "request_latency",
            "request_throughput",
            "output_token_throughput",
        )
    ):
        config = obj.get("input_config")
        if isinstance(config, Mapping) and "loadgen" in config:
            return "aiperf"
        return "genai-perf"
    if any(k in obj for k in ("mean_e2e_latency_ms", "total_output_tokens_retokenized")):
        return "sglang"
    if any(k in obj for k in ("mean_ttft_ms", "mean_tpot_ms", "mean_e2el_ms", "output_throughput")):
        return "vllm"
    raise ValueError(
        "not a result file this reader knows (keys: "
        + ", ".join(list(obj)[:12])
        + "); formats: "
        + ", ".join(FORMATS)
    )


class _Fallback(Exception):
    """The fast reader met something it does not handle: read the text with ``json.loads``."""


# A per-request list of numbers (vLLM's and SGLang's ``ttfts``, ``itls``, ``input_lens`` ...) is
# most of a detailed result file and none of what the records need: the fast reader checks that
# it holds only number characters and brackets, and does not build it.
_BULK = object()
_WS = re.compile(r"[ \t\n\r]*")
_NUMERIC = b"0123456789eE.+-,[] \t\n\r"  # what a list of numbers is written with
_FAST_FROM = 1 << 18  # characters: smaller files go through json.loads as they are
_DECODER = json.JSONDecoder()


def _ws(text: str, i: int) -> int:
    """The first position at or after ``i`` that is not JSON whitespace."""
    m = _WS.match(text, i)
    return m.end() if m else i


def _skip_numbers(text: str, i: int) -> int | None:
    """The end of the list of numbers (nested lists allowed) that opens at ``text[i]``, or None
    when it holds strings or objects (then it is decoded as usual)."""
    first = _ws(text, i + 1)
    if first < len(text) and text[first] in '"{':
        return None
    depth, pos = 0, i
    while depth or pos == i:
        k = text.find("]", pos)
        if k < 0:
            raise _Fallback
        depth += text.count("[", pos, k) - 1
        pos = k + 1
    try:
        rest = text[i:pos].encode("ascii").translate(None, _NUMERIC)
    except UnicodeEncodeError:
        raise _Fallback from None
    if b'"' in rest or b"{" in rest:
        return None
    if rest:  # NaN, null, a typo: json.loads says where
        raise _Fallback
    return pos


def _fast_objects(text: str) -> list[tuple[str, Any]]:
    """``(where, object)`` for each top-level JSON object of ``text``, the lists of numbers among
    their values replaced by a marker (``_BULK``); ``_Fallback`` on anything unexpected."""
    out = []
    i = _ws(text, 0)
    while i < len(text):
        where = f"line {text.count(chr(10), 0, i) + 1}"
        if text[i] != "{":
            raise _Fallback
        obj: dict[str, Any] = {}
        i = _ws(text, i + 1)
        while text[i : i + 1] != "}":
            if text[i : i + 1] != '"':
                raise _Fallback
            key, i = json.decoder.scanstring(text, i + 1)  # type: ignore[attr-defined]
            i = _ws(text, i)
            if text[i : i + 1] != ":":
                raise _Fallback
            i = _ws(text, i + 1)
            end = _skip_numbers(text, i) if text[i : i + 1] == "[" else None
            if end is None:
                try:
                    obj[key], i = _DECODER.raw_decode(text, i)
                except json.JSONDecodeError:
                    raise _Fallback from None
            else:
                obj[key], i = _BULK, end
            i = _ws(text, i)
            if text[i : i + 1] == ",":
                i = _ws(text, i + 1)
            elif text[i : i + 1] != "}":
                raise _Fallback
        out.append((where, obj))
        i = _ws(text, i + 1)
    if len(out) == 1:
        out = [("file", out[0][1])]
    return out


def _json_objects(text: str, file: str, limit: int | None = None) -> Iterator[tuple[str, Any]]:
    """``(where, object)`` for a JSON document, or for each line of JSON Lines (a document
    followed by "extra data" is read line by line)."""
    if len(text) >= _FAST_FROM:
        try:
            yield from _fast_objects(text)[:limit]
            return
        except _Fallback:
            pass
    try:
        yield "file", json.loads(text)
        return
    except json.JSONDecodeError as err:
        if err.msg != "Extra data":
            raise MeasurementFileError(
                file, f"line {err.lineno}", "(JSON)", f"is unreadable: {err}"
            ) from None
    count = 0
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            raise MeasurementFileError(
                file, f"line {n}", "(JSON)", f"is unreadable: {err}"
            ) from None
        yield f"line {n}", obj
        count += 1
        if limit is not None and count >= limit:
            return


def _runs(text: str, file: str, on_unsupported: str) -> tuple[str, list[_Run]]:
    if text.lstrip().startswith("id,silicon_data_source"):
        reader = csv.DictReader(io.StringIO(text))
        missing = [
            c
            for c in _SILICON_COLUMNS + ["silicon_ttft_ms", "silicon_tpot_ms"]
            if c not in (reader.fieldnames or [])
        ]
        if missing:
            raise MeasurementFileError(file, "header", missing[0], "is missing from the header")
        runs: list[_Run] = []
        for n, row in enumerate(reader, 2):
            if None in row:
                raise MeasurementFileError(
                    file, f"line {n}", "(CSV)", "has more cells than the header"
                )
            ctx = _Ctx(file, f"line {n} (id {row.get('id') or '?'})")
            runs.extend(_silicon_row(row, ctx, on_unsupported))
        return "silicon-sample", runs
    fmt = None
    runs = []
    for where, obj in _json_objects(text, file):
        try:
            this = _detect_obj(obj)
        except ValueError as err:
            raise MeasurementFileError(file, where, "(format)", str(err)) from None
        if fmt is not None and this != fmt:
            raise MeasurementFileError(file, where, "(format)", f"is {this}, earlier lines {fmt}")
        fmt = this
        if fmt == "guidellm":
            for i, bench in enumerate(obj["benchmarks"]):
                run = _Run(_Ctx(file, f"benchmarks[{i}]"), f"b{i}")
                if not isinstance(bench, Mapping):
                    run.ctx.fail("benchmarks", f"[{i}] = {_short(bench)}; must be a JSON object")
                _guidellm_run(bench, run)
                runs.append(run)
            continue
        label = "1" if where == "file" else where.split()[-1]
        run = _Run(_Ctx(file, where), label)
        if fmt in ("vllm", "sglang"):
            _vllm_like(obj, run, fmt)
        elif fmt in ("aiperf", "genai-perf"):
            _perf_export(obj, run, fmt)
        else:
            _inference_perf(obj, run)
        runs.append(run)
    if fmt is None:
        raise MeasurementFileError(file, "file", "(content)", "is empty")
    return fmt, runs


# ---------------------------------------------------------------------------------------------
# records


def _translate(
    kind: str, name: str, flag: Any, table: Mapping[str, str], ctx: _Ctx
) -> tuple[str, str]:
    """A file's hardware or model name as a preset: through the flag's mapping, the flag's one
    name, the built-in table, else the file's own name. Returns (name, origin)."""
    if isinstance(flag, Mapping):
        if name in flag:
            return str(flag[name]), "from_flags"
    elif isinstance(flag, str):
        return flag, "from_flags"
    if name in table:
        return table[name], "from_file"
    if not name:
        ctx.fail(kind, f"is empty; pass {kind}=")
    return name, "from_file"


def _build(
    path: str, fmt: str, run: _Run, flags: dict[str, Any], given: set[str], family: str | None
) -> list[dict]:
    from dcost import presets

    ctx = run.ctx
    origin: dict[str, str] = {}
    rec: dict[str, Any] = {}
    stated = dict(run.stated)

    # names: the CSV states them (translated to presets), the JSON formats do not
    for field, table in (("hardware", AIC_SYSTEMS), ("model", {})):
        if f"{field}_name" in stated:
            rec[field], origin[field] = _translate(
                field, stated.pop(f"{field}_name"), flags[field], table, ctx
            )
        elif isinstance(flags[field], str):
            rec[field], origin[field] = flags[field], "from_flags"
        else:
            ctx.fail(field, f"is not in a {fmt} file; pass {field}= (a preset name)")
    for field in ("engine", "engine_version"):
        if field in stated:
            value = stated.pop(field)
            if field in given and flags[field] != value:
                ctx.fail(field, f"= {value!r} in the file, {flags[field]!r} in the flags")
            rec[field], origin[field] = value, "from_file"
        elif flags[field] is not None:
            rec[field], origin[field] = flags[field], "from_flags"
        elif field == "engine":
            ctx.fail("engine", f"is not in a {fmt} file; pass engine= (e.g. 'vllm', 'sglang')")
    if origin["model"] == "from_flags" and rec["model"] not in presets.model_names():
        # a file's own model name is kept (unknown_presets lists it); a flag names a preset
        ctx.fail(
            "model",
            f"= {rec['model']!r} is not a model preset ({', '.join(presets.model_names()[:6])}, "
            "...; `dcost presets` lists them)",
        )
    if family is not None:
        rec["family"], origin["family"] = family, "from_flags"
    else:
        try:
            rec["family"] = presets.card_family(rec["hardware"])
        except Exception:
            ctx.fail(
                "hardware",
                f"= {rec['hardware']!r} is not a hardware preset "
                f"({', '.join(presets.hardware_names())}); pass a preset name, or family= "
                "for a chip dcost has no preset for",
            )
        origin["family"] = origin["hardware"]
    defaults: dict[str, Any] = {d: 1 for d in _DEGREES}
    defaults.update(serving="aggregated", weights="bf16", kv_cache="bf16")
    for field in (*_DEGREES, "serving", "weights", "kv_cache", "concurrency"):
        if field in stated:
            value = stated[field]
            # concurrency= fills in the runs that do not state theirs (a sweep mixes both)
            if field in given and flags[field] != value and field != "concurrency":
                ctx.fail(
                    field,
                    f"= {value!r} in the file, {flags[field]!r} in the flags; leave the flag out",
                )
            rec[field], origin[field] = value, "from_file"
        elif field in given:
            rec[field], origin[field] = flags[field], "from_flags"
        elif field in defaults:
            rec[field], origin[field] = defaults[field], "assumed"
        else:
            ctx.fail(
                run.level_key,
                "is not stated for this run (an open-loop run at a request rate); pass "
                "concurrency= (--concurrency: the mean number of requests in flight)",
            )
    if "compute" in stated:
        rec["compute"], origin["compute"] = stated["compute"], "from_file"
    elif "compute" in given:
        rec["compute"], origin["compute"] = flags["compute"], "from_flags"
    else:
        rec["compute"], origin["compute"] = rec["weights"], origin["weights"]
    if "gpus" in stated:
        rec["gpus"], origin["gpus"] = stated["gpus"], "from_file"
    elif "gpus" in given:
        rec["gpus"], origin["gpus"] = flags["gpus"], "from_flags"
    else:
        rec["gpus"] = (
            rec["tensor_parallel"] * rec["pipeline_parallel"] * rec["attention_data_parallel"]
        )
        origin["gpus"] = origin["tensor_parallel"]
    for field in ("prompt_tokens", "output_tokens"):
        rec[field], origin[field] = stated[field], "from_file"

    name = pathlib.Path(path).name
    out = []
    for metric, value in run.metrics.items():
        if metric == "output_throughput":
            metric, value = "output_throughput_per_gpu", value / rec["gpus"]
        r: dict[str, Any] = {"id": f"{name}:{run.label}:{metric}"}
        r.update(source=str(path), source_id=str(path), quote="; ".join(run.quote))
        r.update(rec)
        r.update(metric=metric, value=value, format=fmt)
        fields = dict(origin, metric="from_file", value="from_file")
        for key in ("from_file", "from_flags", "assumed"):
            r[key] = [f for f, o in fields.items() if o == key]
        notes = list(run.notes)
        if metric == "output_throughput_per_gpu":
            notes.append(
                f"output_throughput_per_gpu = the run's output tokens/s / gpus ({rec['gpus']})"
            )
        r["note"] = "; ".join(notes)
        out.append(r)
    return out


def read(
    path: str | pathlib.Path,
    *,
    hardware: str | Mapping[str, str] | None = None,
    model: str | Mapping[str, str] | None = None,
    engine: str | None = None,
    engine_version: str | None = None,
    tensor_parallel: int | None = None,
    expert_parallel: int | None = None,
    pipeline_parallel: int | None = None,
    attention_data_parallel: int | None = None,
    gpus: int | None = None,
    concurrency: int | None = None,
    serving: str | None = None,
    weights: str | None = None,
    kv_cache: str | None = None,
    compute: str | None = None,
    family: str | None = None,
    on_unsupported: str = "raise",
) -> list[dict]:
    """Measurement records from one benchmark result file, one per metric of each run it holds.

    ``value`` is the run's mean in SI units: ``ttft``, ``tpot``, ``itl``, ``e2e`` in seconds
    (the file's ms / 1000), ``output_throughput_per_gpu = output tokens/s / gpus``. Mean lengths
    are the file's totals over completed requests (or its means). Every record passes
    :func:`dcost.validation.check_record`.

    Args:
      path: the result file; its format is detected from the content (``FORMATS``).
      hardware: the hardware preset the run used (e.g. ``"h100-sxm"``). For a silicon-sample CSV,
        which names its systems, a mapping from the file's names to presets (``AIC_SYSTEMS`` is
        used otherwise), or one preset when every row names the same system.
      model: the model preset (e.g. ``"llama-3.1-8b"``); for the CSV, a mapping as above, else
        the file's model name is kept (``dcost.validation.unknown_presets`` lists it).
      engine, engine_version: what served the run (``"vllm"``, ``"0.11.0"``); the CSV states them.
      tensor_parallel, expert_parallel, pipeline_parallel, attention_data_parallel: the layout
        (default 1 each, marked ``assumed``); the CSV states them.
      gpus: chips serving the run (default ``tensor_parallel * pipeline_parallel *
        attention_data_parallel``); more for dense replicas behind one endpoint.
      concurrency: requests in flight, for the runs that do not state their level (an
        open-loop run at a request rate); a run that states one keeps its own.
      serving: ``"aggregated"`` (default, assumed), ``"prefill"`` or ``"decode"``.
      weights, kv_cache, compute: number formats (default ``"bf16"``, ``compute`` = ``weights``).
      family: the calibration family, for a chip that is not a hardware preset.
      on_unsupported: ``"raise"`` (default) or ``"skip"``: what to do with a silicon-sample row
        dcost cannot represent (4-bit weight-only formats; a disaggregated row with no batch size).

    Returns:
      A list of records (dicts): the DESIGN.md fields plus ``engine``, ``engine_version`` (when
      known), ``format``, ``from_file``, ``from_flags``, ``assumed`` (field names) and ``note``.

    Raises:
      MeasurementFileError: (a ``ValueError``) naming the file, the record and the field.

    Reference: each format's schema, ``FORMATS``; the record schema, DESIGN.md section 5.
    """
    from dcost.validation import check_record

    if on_unsupported not in ("raise", "skip"):
        raise ValueError(f"on_unsupported = {on_unsupported!r}; allowed: 'raise', 'skip'")
    flags: dict[str, Any] = dict(
        hardware=hardware,
        model=model,
        engine=engine,
        engine_version=engine_version,
        tensor_parallel=tensor_parallel,
        expert_parallel=expert_parallel,
        pipeline_parallel=pipeline_parallel,
        attention_data_parallel=attention_data_parallel,
        gpus=gpus,
        concurrency=concurrency,
        serving=serving,
        weights=weights,
        kv_cache=kv_cache,
        compute=compute,
    )
    given = {k for k, v in flags.items() if v is not None}
    for k in (*_DEGREES, "gpus", "concurrency"):
        v = flags[k]
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{k} = {v!r}; must be a positive integer")
    file = str(path)
    try:
        text = pathlib.Path(path).read_text(encoding="utf-8")
    except OSError as err:
        raise MeasurementFileError(
            file, "file", "(path)", f"cannot be read: {err.strerror}"
        ) from None
    if not text.strip():
        raise MeasurementFileError(
            file, "file", "(path)", "is empty: a result file holds JSON, JSON Lines or CSV"
        )
    fmt, runs = _runs(text, file, on_unsupported)
    for field, flag in (("hardware", hardware), ("model", model)):
        names = {run.stated[f"{field}_name"] for run in runs if f"{field}_name" in run.stated}
        if isinstance(flag, str) and len(names) > 1:
            raise MeasurementFileError(
                file,
                "file",
                field,
                f"= {flag!r} for rows naming {len(names)} different ones "
                f"({', '.join(sorted(names)[:4])}{', ...' if len(names) > 4 else ''}); pass "
                f"{field}= as a mapping from the file's names to presets",
            )
    records = []
    for run in runs:
        if not run.metrics:
            run.ctx.fail(
                "(metrics)",
                f"none found: a {fmt} run states ttft, tpot, itl, e2e or output throughput",
            )
        for r in _build(file, fmt, run, flags, given, family):
            try:
                check_record(r)
            except ValueError as err:
                raise MeasurementFileError(
                    file, run.ctx.record, "(record)", f"gives a record the checker refuses: {err}"
                ) from None
            records.append(r)
    return records
