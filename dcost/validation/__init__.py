"""Published measurements of LLM serving, as data, and the checks every record must pass.

The shipped set ``records.toml`` holds one ``[[record]]`` table per measured figure (DESIGN.md,
section 5): where it comes from (``source``, ``quote``, ``source_id``), what ran (``hardware``,
``model``, precisions, parallel degrees, ``serving`` pool, ``concurrency``, mean lengths, optional
``speculative``, optional ``requests`` for a finite offline run) and what was measured
(``metric`` and ``value``, in SI units: seconds or tokens/s).
Inputs a source does not state are named in ``assumed`` and explained in ``note``.

>>> records = load()
>>> len(records) >= 60
True
>>> for r in records:
...     check_record(r)
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from importlib import resources

__all__ = [
    "predict",
    "case",
    "Case",
    "evaluate_case",
    "TIME_METRICS",
    "METRICS",
    "PRECISIONS",
    "REQUIRED",
    "SERVING",
    "ENGINES",
    "check_record",
    "check_records",
    "load",
    "unknown_presets",
]

REQUIRED = (
    "id",
    "source",
    "source_id",
    "family",
    "quote",
    "hardware",
    "model",
    "weights",
    "kv_cache",
    "compute",
    "gpus",
    "serving",
    "concurrency",
    "prompt_tokens",
    "output_tokens",
    "metric",
    "value",
)
METRICS = (
    "tpot",
    "ttft",
    "step_time",
    "output_throughput_per_gpu",
    "input_throughput_per_gpu",
    "total_throughput_per_gpu",
    "itl",  # mean time between streamed chunks (s); read from benchmark files
    "e2e",  # mean arrival-to-last-token time (s); dcost.measurements
)
SERVING = ("aggregated", "prefill", "decode")
PRECISIONS = ("bf16", "fp8", "fp4", "int8")
# What served a record, where it is not a serving engine (the optional field ``engine``; a record
# without it was measured on a serving engine: vLLM, SGLang, TensorRT-LLM, ...). "bare-xla": one
# XLA-compiled decode step or prefill pass timed by dcost itself (``dcost.calibrate.decode_timing``,
# ``dcost.calibrate.prefill_timing``), with no scheduler, sampler or paged cache around it.
# "vllm", "sglang", "trtllm": serving engines, as dcost.measurements reads them from result files.
ENGINES = ("bare-xla", "vllm", "sglang", "trtllm")
_DEGREES = ("tensor_parallel", "expert_parallel", "pipeline_parallel", "attention_data_parallel")
_COUNTS = ("gpus", "concurrency")
_LENGTHS = ("prompt_tokens", "output_tokens")  # means: need not be whole
# metrics in seconds (dcost.validation.cases.TIME_METRICS, which predicts the first three)
_TIME = ("tpot", "ttft", "step_time", "itl", "e2e")
_TEXT = ("id", "source", "source_id", "family", "quote", "hardware", "model")


def load() -> list[dict]:
    """The shipped measurement records, in file order, each a plain ``dict``.

    Reads ``records.toml`` beside this module through ``importlib.resources`` (so it works from an
    installed wheel). Parallel degrees left out of a record default to 1. Nothing is checked here:
    call :func:`check_record` / :func:`check_records`, and :func:`unknown_presets` for preset names.
    """
    text = resources.files(__name__).joinpath("records.toml").read_text(encoding="utf-8")
    records = tomllib.loads(text).get("record", [])
    for record in records:
        for degree in _DEGREES:
            record.setdefault(degree, 1)
    return records


def _fail(record: Mapping, field: str, value, allowed: str):
    rid = record.get("id", "<no id>") if isinstance(record, Mapping) else "<not a mapping>"
    raise ValueError(f"record {rid!r}: field {field!r} = {value!r}; {allowed}")


def _positive_number(record, field, integer=False):
    value = record[field]
    kind = int if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
        _fail(record, field, value, "must be a positive " + ("integer" if integer else "number"))


def check_record(record: Mapping) -> None:
    """Raise ``ValueError`` if ``record`` breaks the schema; return ``None`` if it is well formed.

    The message names the record id, the field, its value and what is allowed. Checked: every
    required field is present; ``metric``, ``serving`` and the three precisions are known values;
    ``value`` is a positive number; ``gpus``, ``concurrency`` and parallel degrees are positive
    integers; mean lengths are positive numbers; ``speculative`` has ``draft_tokens >= 1``
    and ``0 <= acceptance < 1``;
    ``requests`` (optional: the run's request count, for the throughput of a finite offline
    run) is a positive integer ``>= concurrency`` on an aggregated throughput record;
    ``comm_overlap`` (the share of collectives the engine hides behind computation, optional) is
    in [0, 1]; ``wave_prompt_steps`` (optional: a closed-loop run of fixed lengths whose requests
    decode in lockstep waves, each wave's prompts in that many steps run alone,
    ``dcost.validation.cases``) is a positive integer on an aggregated TPOT record;
    ``engine`` (optional) is one of ``ENGINES`` and ``engine_version`` (optional) a
    non-empty string; ``assumed`` is a list of strings;
    ``hardware_overrides`` maps names to positive numbers.
    Preset names are not checked here (see :func:`unknown_presets`), nor are duplicate ids (see
    :func:`check_records`).
    """
    if not isinstance(record, Mapping):
        raise ValueError(f"a record must be a mapping, got {type(record).__name__}")
    for field in REQUIRED:
        if field not in record:
            _fail(record, field, None, "is required")
    for field in _TEXT:
        if not isinstance(record[field], str) or not record[field].strip():
            _fail(record, field, record[field], "must be a non-empty string")
    if record["metric"] not in METRICS:
        _fail(record, "metric", record["metric"], f"allowed: {', '.join(METRICS)}")
    if record["serving"] not in SERVING:
        _fail(record, "serving", record["serving"], f"allowed: {', '.join(SERVING)}")
    for field in ("weights", "kv_cache", "compute"):
        if record[field] not in PRECISIONS:
            _fail(record, field, record[field], f"allowed: {', '.join(PRECISIONS)}")
    _positive_number(record, "value")
    for field in _COUNTS:
        _positive_number(record, field, integer=True)
    for field in _LENGTHS:
        _positive_number(record, field)
    for field in _DEGREES:
        if field in record:
            _positive_number(record, field, integer=True)
    spec = record.get("speculative")
    if spec is not None:
        if not isinstance(spec, Mapping) or set(spec) != {"draft_tokens", "acceptance"}:
            _fail(record, "speculative", spec, "must be {draft_tokens = k, acceptance = a}")
        k, a = spec["draft_tokens"], spec["acceptance"]
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            _fail(record, "speculative.draft_tokens", k, "must be an integer >= 1")
        if isinstance(a, bool) or not isinstance(a, (int, float)) or not 0 <= a < 1:
            _fail(record, "speculative.acceptance", a, "must be a number in [0, 1)")
    overlap = record.get("comm_overlap", 0.0)
    if isinstance(overlap, bool) or not isinstance(overlap, (int, float)) or not 0 <= overlap <= 1:
        _fail(record, "comm_overlap", overlap, "must be a number in [0, 1]")
    if "wave_prompt_steps" in record:
        _positive_number(record, "wave_prompt_steps", integer=True)
        if record["serving"] != "aggregated" or record["metric"] != "tpot":
            _fail(
                record,
                "wave_prompt_steps",
                record["wave_prompt_steps"],
                "applies to the TPOT of an aggregated run (its requests decoding in waves);"
                " leave it out otherwise",
            )
    if "engine" in record and record["engine"] not in ENGINES:
        _fail(
            record, "engine", record["engine"], f"allowed: {', '.join(ENGINES)} (or leave it out)"
        )
    version = record.get("engine_version", "0")
    if not isinstance(version, str) or not version.strip():
        _fail(record, "engine_version", version, "must be a non-empty string (or leave it out)")
    if "requests" in record:
        _positive_number(record, "requests", integer=True)
        if record["requests"] < record["concurrency"]:
            _fail(
                record,
                "requests",
                record["requests"],
                f"must be >= concurrency ({record['concurrency']}): a run cannot hold more"
                " requests in flight than it sends",
            )
        if record["serving"] != "aggregated" or record["metric"] in _TIME:
            _fail(
                record,
                "requests",
                record["requests"],
                "applies to the throughput of an aggregated run (a finite offline run of that"
                " many requests); leave it out otherwise",
            )
    assumed = record.get("assumed", [])
    if not isinstance(assumed, list) or not all(isinstance(x, str) for x in assumed):
        _fail(record, "assumed", assumed, "must be a list of field names")
    overrides = record.get("hardware_overrides", {})
    if not isinstance(overrides, Mapping):
        _fail(record, "hardware_overrides", overrides, "must be a table of field = number")
    for name, value in overrides.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            _fail(
                record, f"hardware_overrides.{name}", value, "must be a positive number (SI units)"
            )


def check_records(records: Iterable[Mapping]) -> None:
    """Check each record with :func:`check_record`; raise ``ValueError`` on a duplicate ``id``."""
    seen = set()
    for record in records:
        check_record(record)
        if record["id"] in seen:
            _fail(record, "id", record["id"], "must be unique; this id appears twice")
        seen.add(record["id"])


def unknown_presets(records: Iterable[Mapping]) -> list[tuple[str, str, str | None]]:
    """``(record id, field, name)`` for every ``hardware`` or ``model`` that is not a preset.

    Kept apart from :func:`check_record` so that a record may name a preset that is still being
    added without making :func:`load` fail; callers that predict from the records require it empty.
    """
    from dcost.presets import hardware_names, model_names

    known = {"hardware": set(hardware_names()), "model": set(model_names())}
    missing = []
    for record in records:
        for field, names in known.items():
            name = record.get(field)
            if name not in names:
                missing.append((record.get("id", "<no id>"), field, name))
    return missing


# What the serving model predicts for a record (``dcost.validation.cases``), imported on first use:
# loading and checking records needs no JAX.
_CASES = ("predict", "case", "Case", "evaluate_case", "evaluate_metrics", "attention_rate")


def __getattr__(name):
    if name in _CASES or name == "TIME_METRICS":
        from dcost.validation import cases

        return getattr(cases, name)
    raise AttributeError(f"module 'dcost.validation' has no attribute {name!r}")
