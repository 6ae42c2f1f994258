"""AIConfigurator's measured silicon sample: end-to-end serving runs of three engines, as records.

``silicon.csv.gz`` beside this module is ``systems/silicon_sample.csv`` of ``aiconfigurator-core``
0.12.0 (ai-dynamo/aiconfigurator, Apache-2.0), unchanged: 5,221 runs of vLLM, SGLang and
TensorRT-LLM (2025-2026 versions) on H100, H200, B200, B300, GB200 and GB300, each a benchmark
client at a fixed concurrency with its layout, precisions, lengths, TTFT and TPOT.

``records()`` turns every row dcost can express into measurement records (``dcost.validation``'s
schema) and counts the rest with the reason. The mapping, with what the sample does not state
marked assumed in each record:

- chip: ``h100_sxm`` -> h100-sxm, ``h200_sxm`` -> h200, ``b200_sxm`` -> b200, ``b300_sxm`` -> b300,
  ``gb200`` -> gb200-nvl72, ``gb300`` -> gb300-nvl72;
- weights and matmuls: the MoE quantization for MoE models, the GEMM one for dense models
  (fp8 and fp8_block -> fp8, nvfp4 -> fp4, none -> bf16); the KV cache is not stated: InferenceX's
  single-node runs take the format their launch script set (``inferencex_kv_cache``), the rest
  are assumed fp8 under TensorRT-LLM (its default for fp8 and fp4 checkpoints) and bf16 under
  vLLM and SGLang (``kv_cache_dtype="auto"``);
- layout: ``tensor_parallel = tp``, ``attention_data_parallel = dp``, ``expert_parallel =
  moe_ep``, ``pipeline_parallel = pp``, ``gpus = tp * dp * pp`` (the pool's for disaggregated rows),
  but for InferenceX's April exports of launches with expert parallelism, which count its GPUs
  twice: those run the launch (``inferencex_launch``, ``gpus`` assumed);
- concurrency: the client's (``silicon_concurrency`` in ``silicon_data_source``) for aggregated
  rows; disaggregated decode rows divide it over the decode workers; disaggregated prefill rows
  (TTFT) run the prefill pool's ``prefill_batch_size``;
- metrics: aggregated rows give TPOT (a mixed step, ``dcost.mixed_step``) and, at concurrency 1,
  the TTFT of a lone prefill; disaggregated rows give the decode pool's TPOT and the prefill
  pool's TTFT. TTFT under load (concurrency > 1, aggregated) is queueing: not a record here.

A run the sample lists twice (``REPEATED``) is one record, and runs that most likely decoded
speculatively without saying so (``SPECULATIVE_SUSPECTED``) are counted out.

Waves. AIConfigurator's own benchmark (the rows not from InferenceX, ``INFERENCEX``) is a
closed-loop client of fixed prompt and output lengths. Against an engine that runs its prompt
steps alone (SGLang without ``--enable-mixed-chunk``: the versions in ``PROMPT_STEPS_ALONE``)
every request of a wave decodes in lockstep once the wave's prompts are in, so the waves never
break up, and a request waits through only the prompt steps of its wave that come after its own
(``wave_prompt_steps``): its TPOT carries part of the steady state's prompt interference, not
all of it (``dcost.validation.cases``). Engines that put prompt chunks beside the decodes start
each request's decoding at a different step, and their waves spread into the steady state.
"""

from __future__ import annotations

import csv
import dataclasses
import functools
import gzip
import io
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from typing import Any

import numpy as np

__all__ = [
    "load_rows",
    "records",
    "MODELS",
    "UNMODELLED",
    "DRAWN_BEFORE",
    "SYSTEMS",
    "Skipped",
    "SPECULATIVE_SUSPECTED",
    "SPECULATIVE",
    "REPEATED",
    "speculative",
    "concurrency_band",
    "PROMPT_STEPS_ALONE",
    "INFERENCEX",
    "inferencex",
    "EXPERT_GPUS_COUNTED_TWICE",
    "inferencex_launch",
    "inferencex_kv_cache",
    "inferencex_mean_length",
    "INFERENCEX_RANGE_RATIO",
    "source_field",
    "wave_prompt_steps",
    "MIXED_CHUNK_EXTRA",
]

SOURCE = (
    "ai-dynamo/aiconfigurator: aiconfigurator-core 0.12.0 (PyPI, Apache-2.0), "
    "systems/silicon_sample.csv"
)

SYSTEMS = {
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200",
    "b200_sxm": "b200",
    "b300_sxm": "b300",
    "gb200": "gb200-nvl72",
    "gb300": "gb300-nvl72",
}

MODELS = {
    "meta-llama/Llama-3.1-70B": "llama-3.3-70b",
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "nvidia/Llama-3.1-8B-Instruct-FP8": "llama-3.1-8b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "nvidia/Qwen3-32B-NVFP4": "qwen3-32b",
    "deepseek-ai/DeepSeek-R1": "deepseek-r1",
    "nvidia/DeepSeek-R1-NVFP4": "deepseek-r1",
    "deepseek-ai/DeepSeek-V3": "deepseek-v3",
    "nvidia/DeepSeek-V3.1-NVFP4": "deepseek-v3",
    "Qwen/Qwen3-235B-A22B-FP8": "qwen3-235b-a22b",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "moonshotai/Kimi-K2.5": "kimi-k2",
    "MiniMaxAI/MiniMax-M2.5": "minimax-m2.5",
    "Qwen/Qwen3.5-397B-A17B": "qwen3.5-397b-a17b",
    "zhipuai/GLM-5": "glm-5",
}
"""The sample's checkpoints -> dcost model presets (Llama 3.1 70B is the Llama 3.3 70B
architecture; Kimi K2.5's language model is Kimi K2's; DeepSeek-V3.1 is DeepSeek-V3's)."""

DRAWN_BEFORE = frozenset({"qwen3.5-397b-a17b", "glm-5"})
"""Models whose runs became records after the experiments' seeded draws of runs
(``experiments/serving_under_load.py``, ``own_runs_under_load.py``): Qwen3.5-397B-A17B's and
GLM-5's on 2026-12-03, when Gated DeltaNet and DeepSeek sparse attention were modelled. The
draws leave them out, so that each seed keeps drawing the runs it drew and a sample the
diagnosis saw stays the one it saw."""

UNMODELLED: dict[str, str] = {}
"""The sample's checkpoints whose architecture dcost does not model, with the reason: none since
Qwen3.5's Gated DeltaNet and GLM-5's sparse attention were modelled (2026-12-03)."""

BATCH_BELOW_CLIENTS = (
    "batch_size is below the clients of one replica without attention data parallelism: "
    "layout not as stated"
)
"""Why an aggregated run whose running-sequence cap is below its clients is counted out."""

SPECULATIVE_SUSPECTED = {("trtllm", "1.2.0rc6.post3", "deepseek-r1")}
"""``(engine, version, model)`` whose runs most likely decoded speculatively (DeepSeek's MTP),
which the sample does not state: TensorRT-LLM 1.2.0rc6.post3's DeepSeek-R1 runs are 1.20-2.32x
(median 1.58x) faster than 1.2.0rc6.post2's at the same 22 configurations (chip, precisions,
layout, lengths, clients), most at few clients and least at many (1.9x at 4 clients, 1.25x at
256 on B200, fp8, tp8), as accepted draft tokens speed a step up; post2's runs agree with the
DeepSeek-V3 runs of the same layouts (the same network). Counted out with ``SPECULATIVE``."""

SPECULATIVE = "most likely speculative decoding (MTP), not stated: see SPECULATIVE_SUSPECTED"


def speculative(record: Mapping) -> bool:
    """Whether a record's ``(engine, engine_version, model)`` is in ``SPECULATIVE_SUSPECTED``.

    >>> speculative({"engine": "trtllm", "engine_version": "1.2.0rc6.post3",
    ...              "model": "deepseek-r1"})
    True
    """
    key = (record["engine"], record.get("engine_version"), record["model"])
    return key in SPECULATIVE_SUSPECTED


REPEATED = "a run the sample lists twice (configuration, version and times alike): counted once"
"""Why a record the same as an earlier one is counted out: 240 rows repeat another row's
configuration, engine version and measured TPOT and TTFT to the last digit (105 of the
2026-04-06 file repeat runs of the 2026-03-25 one, whose ``measured`` date they give; 77 repeat
rows of the same file; the rest rows of the 2026-04-27 database dump); and 49 of Qwen3.5-397B's
rows and 32 of GLM-5's, counted since their runs became records (2026-12-03)."""

_QUANT = {"fp8": "fp8", "fp8_block": "fp8", "nvfp4": "fp4", "": "bf16"}

# what makes two records the same run: the same configuration, engine version and value
_SAME_RUN = (
    "engine",
    "engine_version",
    "hardware",
    "model",
    "weights",
    "kv_cache",
    "compute",
    "tensor_parallel",
    "pipeline_parallel",
    "attention_data_parallel",
    "expert_parallel",
    "gpus",
    "serving",
    "prompt_tokens",
    "output_tokens",
    "concurrency",
    "metric",
    "value",
)


@dataclasses.dataclass(frozen=True)
class Skipped:
    """A row (or one of its metrics) dcost does not express, and why."""

    id: str
    metric: str
    reason: str


@functools.cache
def _text() -> str:
    data = resources.files("dcost.validation").joinpath("silicon.csv.gz").read_bytes()
    return gzip.decompress(data).decode("utf-8")


def load_rows() -> list[dict]:
    """The sample's rows as dicts of strings, in file order."""
    return list(csv.DictReader(io.StringIO(_text())))


def source_field(source: str, key: str) -> str | None:
    """The value of ``key`` in a row's ``silicon_data_source`` (``"k=v; k=v"``), or None.

    >>> source_field("db-dump/2026-04-27; silicon_concurrency=4", "silicon_concurrency")
    '4'
    """
    for part in source.split(";"):
        k, _, v = part.strip().partition("=")
        if k == key:
            return v
    return None


def _int(row: Mapping, key: str, default: int | None = None) -> int | None:
    v = row.get(key, "")
    if v in ("", None):
        return default
    return int(float(v))


@functools.cache
def _precisions(hardware: str) -> tuple[str, ...]:
    from dcost import presets

    return tuple(presets.precisions(hardware))


@functools.cache
def _is_moe(model: str) -> bool:
    from dcost import presets

    return float(presets.model(model).n_experts) > 0


def _id_degree(rid: str, name: str) -> int | None:
    """A parallel degree the run's id states (``..._tp8_ep8_...``), or None."""
    import re

    m = re.search(rf"_{name}(\d+)(?:_\d+)?_", rid + "_")
    return int(m.group(1)) if m else None


@functools.cache
def _heads(model: str) -> int:
    from dcost import presets

    return int(presets.model_card(model)["arch"]["n_heads"])


def _layout_problem(
    layout: Mapping, model: str, stated_tp: int | None, moe_width: int | None = None
) -> str | None:
    """Why a stated layout cannot be the one that ran, or None: tensor parallelism that does not
    divide the attention heads, a degree that disagrees with the one the run's id states, or
    (``moe_width``: ``moe_tp_size * moe_ep_size`` where the row states them) experts split over
    other GPUs than attention (``tp_size * attention_dp_size``; AIConfigurator refuses the same
    rows: "Parallelism width mismatch")."""
    tp = layout["tensor_parallel"]
    if _heads(model) % tp:
        return "tensor_parallel does not divide the attention heads: layout not as stated"
    if stated_tp is not None and stated_tp != tp:
        return "tp_size disagrees with the tp the run's id states"
    if moe_width is not None and moe_width != tp * layout["attention_data_parallel"]:
        return "moe_tp_size x moe_ep_size disagrees with tp_size x attention_dp_size"
    return None


def _moe_width(row: Mapping, prefix: str, moe: bool) -> int | None:
    """``moe_tp_size * moe_ep_size`` of a MoE model's row where it states both, else None."""
    mtp, mep = _int(row, f"{prefix}moe_tp_size"), _int(row, f"{prefix}moe_ep_size")
    return mtp * mep if moe and mtp and mep else None


PROMPT_STEPS_ALONE = frozenset({"0.5.1.post1", "0.5.3.post2", "0.5.4.post3"})
"""SGLang versions whose runs AIConfigurator's generator deployed without
``--enable-mixed-chunk``: it deployed them from 2025-12-04 (ai-dynamo/aiconfigurator #144) and
emitted the flag only from 2026-01-19 (#257, #258; ``agg enable_mixed_chunk = true`` in
``rule_plugin/sglang.rule``); the versions it added later (0.5.6.post2 on 2026-01-23, 0.5.8,
0.5.9, ...) had it from the first. The rows state no date for these versions' collection, so
which deployment ran them is not recorded: their measured TTFT and TPOT are taken as those of
prompt steps run alone (SGLang's default, ``prefill_first``)."""

INFERENCEX = ("db-dump/", "source_file=2026-03-25.csv", "source_file=2026-04-06.csv")
"""How the silicon rows that SemiAnalysis's InferenceX ran begin their ``silicon_data_source``:
its database's rows (a config id, a workflow run, the engine's container image) and two CSVs of
its runs measured from March and April 2026 (the same images, models, chips and InferenceX's
1k/1k, 1k/8k and 8k/1k lengths). AIConfigurator reads InferenceX's database
(``src/aiconfigurator/sdk/config_adapter/inferencex.py``); these runs were launched by
InferenceX's own scripts, not AIConfigurator's generator, and measured by its own client, whose
lengths vary (uniform over [0.8 L, L]): their records take the mean lengths
(``inferencex_mean_length``)."""

MIXED_CHUNK_EXTRA = 1500
"""Tokens beside the prompt in the prefill budget AIConfigurator's generator gives an aggregated
SGLang run (``max_prefill_tokens`` = the prompt + 1,500; ``generator/rule_plugin/sglang.rule``)."""


def inferencex(row: Mapping) -> bool:
    """Whether a silicon row is one of InferenceX's runs (``INFERENCEX``)."""
    return str(row.get("silicon_data_source", "")).startswith(INFERENCEX)


EXPERT_GPUS_COUNTED_TWICE = "db-dump/", "source_file=2026-04-06.csv"
"""The InferenceX exports (``INFERENCEX``) that state an aggregated launch with expert
parallelism ``E`` over ``T`` GPUs as ``T E`` GPUs: InferenceX's single-node launches
(``multinode: false``; ``--tp T --ep E`` under SGLang and TensorRT-LLM, ``--tensor-parallel-size T
--enable-expert-parallel`` under vLLM, in its ``configs/nvidia-master.yaml`` and
``benchmarks/single_node`` scripts) run ``T`` GPUs, where these rows state 16 and 64 for ``T = E =
4`` and 8 on a node of 8, and the March 2026 export (``source_file=2026-03-25.csv``) states the
same launches with ``T`` GPUs. ``inferencex_launch`` restores the launch."""


INFERENCEX_RANGE_RATIO = 0.8
"""InferenceX's client draws each request's prompt and output lengths uniformly over the integers
``[floor(0.8 L), L]`` of the run's nominal ``L`` (``RANDOM_RANGE_RATIO: 0.8`` in its
``.github/workflows/benchmark-tmpl.yml`` for every run of 2025-10 to 2026-04;
``sample_uniform`` in ``utils/bench_serving/benchmark_serving.py``, and in the
kimbochen/bench_serving client its scripts cloned before that)."""


def inferencex_mean_length(nominal: float) -> float:
    """The mean length of an InferenceX run's requests of nominal length ``L``:
    ``(floor(0.8 L) + L) / 2`` (``INFERENCEX_RANGE_RATIO``), 0.9 L to within half a token.

    >>> inferencex_mean_length(1024.0)
    921.5
    """
    return (math.floor(INFERENCEX_RANGE_RATIO * nominal) + nominal) / 2.0


_QUANT_NAME = {**_QUANT, "int4_wo": "int4"}  # the scripts' precision names


@functools.cache
def _kv_scripts() -> dict[tuple[str, str, str, str], list[dict]]:
    import tomllib

    text = resources.files("dcost.validation").joinpath("inferencex_kv.toml").read_text()
    out: dict[tuple[str, str, str, str], list[dict]] = {}
    for e in tomllib.loads(text)["script"]:
        out.setdefault((e["engine"], e["model"], e["system"], e["precision"]), []).append(e)
    return {k: sorted(v, key=lambda e: e["since"]) for k, v in out.items()}


def inferencex_kv_cache(row: Mapping) -> dict | None:
    """The entry of ``inferencex_kv.toml`` (the KV-cache format InferenceX's launch script set)
    that an aggregated single-node InferenceX row ran with, or None.

    The row's engine, model, chip and precision (its MoE quantization, else its GEMM one) pick
    the script; its ``measured`` date picks the newest entry from on or before that date, or
    the oldest where the run predates every entry (a pull request's run of the script it added).

    >>> row = {"silicon_data_source": "source_file=2026-04-06.csv; measured=2025-10-29",
    ...        "mode": "agg", "backend": "vllm", "model_path": "meta-llama/Llama-3.1-70B",
    ...        "system": "h200_sxm", "gemm_quant_mode": "fp8", "moe_quant_mode": ""}
    >>> inferencex_kv_cache(row)["kv_cache"]
    'fp8'
    """
    if not inferencex(row) or row.get("mode") != "agg":
        return None
    quant = row.get("moe_quant_mode") or row.get("gemm_quant_mode") or ""
    key = (
        str(row.get("backend")),
        str(row.get("model_path")),
        str(row.get("system")),
        _QUANT_NAME.get(quant, quant),
    )
    entries = _kv_scripts().get(key)
    measured = source_field(str(row.get("silicon_data_source", "")), "measured")
    if not entries or not measured:
        return None
    before = [e for e in entries if e["since"] <= measured[:10]]
    return before[-1] if before else entries[0]


def inferencex_launch(row: Mapping, layout: Mapping) -> dict | None:
    """The layout an InferenceX aggregated MoE run launched with, where its row counts the GPUs
    of its expert parallelism twice (``EXPERT_GPUS_COUNTED_TWICE``), else None.

    Such a row states ``G = T E`` GPUs for a launch of ``T`` GPUs with expert parallelism ``E =
    T`` (InferenceX sets ``ep`` to 1 or to ``tp``), read back by AIConfigurator's adapter
    (``sdk/config_adapter/inferencex.py``) as: under SGLang and TensorRT-LLM, attention tensor
    parallel over ``G`` (or data parallel over ``G`` with data-parallel attention) and experts
    ``moe_tp = G / E = T`` by ``moe_ep = E``; under vLLM, attention ``tp = T`` by ``dp = G / T =
    E`` and experts ``1`` by ``G``. The launch: ``T`` GPUs, attention as stated over them
    (vLLM: tensor parallel, as InferenceX's March export states it), experts ``E`` groups.

    >>> row = {"silicon_data_source": "db-dump/x", "backend": "sglang", "mode": "agg",
    ...        "tp_size": "64", "attention_dp_size": "1", "moe_tp_size": "8", "moe_ep_size": "8"}
    >>> lay = {"tensor_parallel": 64, "pipeline_parallel": 1, "attention_data_parallel": 1,
    ...        "expert_parallel": 8, "gpus": 64}
    >>> inferencex_launch(row, lay)["gpus"], inferencex_launch(row, lay)["tensor_parallel"]
    (8, 8)
    >>> inferencex_launch(dict(row, silicon_data_source="source_file=2026-03-25.csv"), lay) is None
    True
    """
    source = str(row.get("silicon_data_source", ""))
    if row.get("mode") != "agg" or not source.startswith(EXPERT_GPUS_COUNTED_TWICE):
        return None
    mtp, mep = _int(row, "moe_tp_size"), _int(row, "moe_ep_size")
    tp, dp = int(layout["tensor_parallel"]), int(layout["attention_data_parallel"])
    if mtp is None or mep is None or int(layout["pipeline_parallel"]) != 1:
        return None
    if row.get("backend") == "vllm":
        # tp = T, dp = E = T, experts 1 x T E
        if mtp != 1 or dp < 2 or dp != tp or mep != tp * dp:
            return None
        gpus = tp
        return dict(layout, attention_data_parallel=1, expert_parallel=gpus, gpus=gpus)
    # SGLang, TensorRT-LLM: attention over T E GPUs, experts T x E with E = T
    if mep < 2 or mtp != mep or tp * dp != mtp * mep or min(tp, dp) != 1:
        return None
    gpus = mtp
    if dp > 1:
        return dict(layout, attention_data_parallel=gpus, expert_parallel=mep, gpus=gpus)
    return dict(layout, tensor_parallel=gpus, expert_parallel=mep, gpus=gpus)


def wave_prompt_steps(row: Mapping, record: Mapping) -> int | None:
    """The prompt steps of one wave, ``k``, of an aggregated run that decodes in lockstep waves
    (module docstring), or None for a run in steady state.

    SGLang's prefill batch takes whole prompts up to its budget, the prompt and 1,500 tokens
    (``MIXED_CHUNK_EXTRA``) capped by its chunk (``chunked_prefill_size``, the engine's default
    for the chip): ``per = max(1, floor(budget / T_in))`` prompts a step, and a wave of the ``C``
    clients of one attention group takes ``k = ceil(C / per)`` steps (a prompt longer than the
    chunk, ``ceil(T_in / chunk)`` steps each).

    >>> r = {"engine": "sglang", "engine_version": "0.5.1.post1", "hardware": "h100-sxm",
    ...      "serving": "aggregated", "metric": "tpot", "prompt_tokens": 1024.0,
    ...      "concurrency": 16, "attention_data_parallel": 1, "pipeline_parallel": 1}
    >>> wave_prompt_steps({"silicon_data_source": "gap_analysis"}, r)  # 2 prompts a step
    8
    >>> wave_prompt_steps({"silicon_data_source": "db-dump/x"}, r) is None  # InferenceX's
    True
    """
    from dcost.engines import default_scheduler

    if (
        record.get("engine") != "sglang"
        or record.get("engine_version") not in PROMPT_STEPS_ALONE
        or record.get("serving") != "aggregated"
        or record.get("metric") != "tpot"
        or inferencex(row)
    ):
        return None
    chunk = int(default_scheduler("sglang", record["hardware"]).max_num_batched_tokens)
    t_in = int(record["prompt_tokens"])
    groups = int(record.get("attention_data_parallel", 1)) * int(record.get("pipeline_parallel", 1))
    clients = max(1, math.ceil(int(record["concurrency"]) / groups))
    if t_in > chunk:
        return clients * math.ceil(t_in / chunk)
    per = max(1, min(t_in + MIXED_CHUNK_EXTRA, chunk) // t_in)
    return math.ceil(clients / per)


def concurrency_band(c: float) -> str:
    """The band of a concurrency the reports group by: "1", "2-8", "9-63", "64+"."""
    return "1" if c <= 1 else "2-8" if c <= 8 else "9-63" if c < 64 else "64+"


def _base(row: Mapping, metric: str, model: str, moe: bool) -> dict:
    engine = row["backend"]
    quant = row["moe_quant_mode"] if moe else row["gemm_quant_mode"]
    weights = _QUANT[quant]
    assumed = ["kv_cache"]
    kv = "fp8" if (engine == "trtllm" and weights != "bf16") else "bf16"
    script = inferencex_kv_cache(row)
    lengths = float(row["isl"]), float(row["osl"])
    quote = (
        f"{row['id']}: ttft {float(row['silicon_ttft_ms']):.4g} ms, tpot "
        f"{float(row['silicon_tpot_ms']):.4g} ms ({row['silicon_data_source'].split(';')[0]})"
    )
    if script is not None:  # the format InferenceX's launch script set (``inferencex_kv_cache``)
        kv, assumed = script["kv_cache"], []
        quote += f"; KV cache {kv}: {script['setting']} ({script['source']})"
    if inferencex(row):  # its client's mean lengths (``inferencex_mean_length``)
        lengths = inferencex_mean_length(lengths[0]), inferencex_mean_length(lengths[1])
    out = {
        "id": f"silicon-{row['id']}-{metric}",
        "source": SOURCE,
        "source_id": "aiconfigurator-silicon",
        "family": "",
        "quote": quote,
        "hardware": SYSTEMS[row["system"]],
        "model": model,
        "weights": weights,
        "kv_cache": kv,
        # a chip with no rate for the weights' format runs them weight-only, its matmuls in bf16
        "compute": weights if weights in _precisions(SYSTEMS[row["system"]]) else "bf16",
        "engine": engine,
        "prompt_tokens": lengths[0],
        "output_tokens": lengths[1],
        "metric": metric,
        "assumed": assumed,
        "mode": row["mode"],
    }
    if row["backend_version"]:
        out["engine_version"] = row["backend_version"]
    else:
        assumed.append("engine_version")
    measured = source_field(str(row.get("silicon_data_source", "")), "measured")
    if measured:  # the run's date (an unstated version's scheduler defaults follow it)
        out["measured"] = measured[:10]
    return out


def _layout(row: Mapping, prefix: str) -> dict:
    tp = _int(row, f"{prefix}tp_size", 1) or 1
    pp = _int(row, f"{prefix}pp_size", 1) or 1
    dp = _int(row, f"{prefix}attention_dp_size", 1) or 1
    ep = _int(row, f"{prefix}moe_ep_size", 1) or 1
    return {
        "tensor_parallel": tp,
        "pipeline_parallel": pp,
        "attention_data_parallel": dp,
        "expert_parallel": ep,
        "gpus": tp * dp * pp,
    }


def records(
    rows: Sequence[Mapping] | None = None, *, count_out: bool = True
) -> tuple[list[dict], list[Skipped]]:
    """The rows dcost can express as records (see the module docstring), and the rest with their
    reason. Each record also carries ``mode`` ("agg" | "disagg") and ``engine`` (and
    ``engine_version`` where the sample states it).

    ``count_out=False`` keeps the repeated runs (``REPEATED``) and the suspected speculative ones
    (``SPECULATIVE_SUSPECTED``): the records as they were before 2026-12-01, from which the
    seeded samples of ``experiments/serving_under_load.py`` are drawn, so that each seed draws
    the runs it drew then.

    >>> recs, skipped = records()
    >>> len(recs) > 1000 and {r["engine"] for r in recs} == {"vllm", "sglang", "trtllm"}
    True
    """
    from dcost import presets

    rows = load_rows() if rows is None else rows
    out: list[dict] = []
    skipped: list[Skipped] = []
    for row in rows:
        rid = row["id"]
        path = row["model_path"]
        if path in UNMODELLED:
            skipped.append(Skipped(rid, "*", UNMODELLED[path]))
            continue
        if path not in MODELS:
            skipped.append(Skipped(rid, "*", f"no preset for {path}"))
            continue
        if row["system"] not in SYSTEMS:
            skipped.append(Skipped(rid, "*", f"no preset for system {row['system']}"))
            continue
        quant = {row["gemm_quant_mode"], row["moe_quant_mode"]}
        if not quant <= set(_QUANT):
            skipped.append(Skipped(rid, "*", f"quantization {sorted(quant)} is not modelled"))
            continue
        model = MODELS[path]
        moe = _is_moe(model)
        concurrency = source_field(row["silicon_data_source"], "silicon_concurrency")
        clients = int(concurrency) if concurrency else _int(row, "batch_size")
        stated = _id_degree(rid, "tp")
        if row["mode"] == "agg":
            layout = _layout(row, "")
            why = _layout_problem(layout, model, stated, _moe_width(row, "", moe))
            if why:
                skipped.append(Skipped(rid, "*", why))
                continue
            if not moe and layout["attention_data_parallel"] > 1:
                skipped.append(Skipped(rid, "*", "data-parallel attention of a dense model"))
                continue
            launch = inferencex_launch(row, layout) if moe else None
            # the adapter's batch_size is its share of the clients, not a running-sequence cap
            cap = None if launch else _int(row, "batch_size")
            layout = launch or layout
            if (
                layout["attention_data_parallel"] == 1
                and cap is not None
                and clients is not None
                and cap < clients
            ):
                # one replica whose running-sequence cap is below its clients (29 TensorRT-LLM
                # runs): its measured TPOT is neither a step of the cap's batch nor of the
                # clients' (the engine profile predicts 0.07-1.04x and 0.10-7.7x of it), and
                # the clients are the cap times the tensor parallelism in 21 of them, as if the
                # batch were an attention rank's
                skipped.append(Skipped(rid, "*", BATCH_BELOW_CLIENTS))
                continue
            r = {**_base(row, "tpot", model, moe), **layout, "serving": "aggregated"}
            r.update(concurrency=clients, value=float(row["silicon_tpot_ms"]) * 1e-3)
            if launch:  # the launch's GPUs, not the row's (``inferencex_launch``)
                r["assumed"].append("gpus")
            k = wave_prompt_steps(row, r)
            if k is not None:
                r["wave_prompt_steps"] = k
            out.append(r)
            if clients == 1:
                t = {**_base(row, "ttft", model, moe), **layout, "serving": "aggregated"}
                t.update(concurrency=1, value=float(row["silicon_ttft_ms"]) * 1e-3)
                out.append(t)
            else:
                skipped.append(Skipped(rid, "ttft", "TTFT under load is queueing (issue 29)"))
        else:
            workers = _int(row, "decode_num_workers")
            if not clients or workers is None:
                # the decode pool's share of the clients is unknown: its batch is not stated
                skipped.append(Skipped(rid, "*", "disaggregated: decode workers not stated"))
                continue
            decode = _layout(row, "decode_")
            why = _layout_problem(decode, model, None, _moe_width(row, "decode_", moe))
            if why:
                skipped.append(Skipped(rid, "*", why))
                continue
            per_worker = max(1, round(clients / workers))
            r = {**_base(row, "tpot", model, moe), **decode, "serving": "decode"}
            r.update(concurrency=per_worker, value=float(row["silicon_tpot_ms"]) * 1e-3)
            if not moe and decode["attention_data_parallel"] > 1:
                skipped.append(Skipped(rid, "tpot", "data-parallel attention of a dense model"))
            else:
                out.append(r)
            prefill = _layout(row, "prefill_")
            batch = _int(row, "prefill_batch_size", 1) or 1
            prefill_slots = batch * (_int(row, "prefill_num_workers", 1) or 1)
            if clients > prefill_slots:
                # more clients than prefill slots: their prompts queue, and the TTFT is a queue's
                skipped.append(Skipped(rid, "ttft", "TTFT under load is queueing (issue 29)"))
                continue
            t = {**_base(row, "ttft", model, moe), **prefill, "serving": "prefill"}
            t.update(concurrency=batch, value=float(row["silicon_ttft_ms"]) * 1e-3)
            if not moe and prefill["attention_data_parallel"] > 1:
                skipped.append(Skipped(rid, "ttft", "data-parallel attention of a dense model"))
            else:
                out.append(t)
    kept = []
    first: set[tuple] = set()
    for r in out:
        same = tuple(r.get(k) for k in _SAME_RUN)
        # fewer sequences than attention groups: dcost's batch would fall below one
        if r["concurrency"] < r["gpus"] / r["tensor_parallel"] / r["pipeline_parallel"]:
            skipped.append(
                Skipped(r["id"], r["metric"], "fewer sequences than attention-parallel groups")
            )
        elif not count_out:
            kept.append(r)
        elif speculative(r):
            skipped.append(Skipped(r["id"], r["metric"], SPECULATIVE))
        elif same in first:
            skipped.append(Skipped(r["id"], r["metric"], REPEATED))
        else:
            first.add(same)
            kept.append(r)
    for r in kept:
        r["family"] = presets.card_family(r["hardware"])
    return kept, skipped


# ---- predictions ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Predictions:
    """The sample's records predicted three ways, and the parts of the engine prediction that
    host costs scale (so that they can be fitted, held out, without re-evaluating the model).

    Attributes:
      records: the records, in order.
      measured: their values (s).
      pure: pure physics (a bound: measured >= pure).
      family: the family profile (``dcost.hardware(..., calibrated=True)``'s).
      engine_base: the engine profile with no host cost per step or sequence (s); a TTFT with
        the engine's ``Scheduler.frontend_time`` (what its benchmark client measures beyond the
        engine: HTTP, tokenizer, streaming; 11 ms, vLLM's measured figure).
      per_step: seconds the metric gains per second of ``step_overhead``.
      per_layer: seconds it gains per second of ``layer_overhead``.
      per_sequence: seconds it gains per second of ``sequence_overhead``.
      per_prefill_step: seconds it gains per second of ``prefill_step_overhead``.
      engine_label: the profile each record ran ("vllm-0.24.0"; "" where no engine profile
        ships for its chip: then ``engine_base`` is the family's).
      per_gemm_share: seconds it gains per unit of ``gemm_intercept_share`` (the engine's GEMM
        intercept at the record's precision times the GEMM kernels its steps run; None: 0).
    """

    records: list
    measured: np.ndarray
    pure: np.ndarray
    family: np.ndarray
    engine_base: np.ndarray
    per_step: np.ndarray
    per_layer: np.ndarray
    per_sequence: np.ndarray
    per_prefill_step: np.ndarray
    engine_label: list
    per_gemm_share: np.ndarray | None = None

    def engine(
        self,
        step_overhead,
        layer_overhead,
        sequence_overhead,
        prefill_step_overhead,
        gemm_intercept_share=0.0,
    ) -> np.ndarray:
        """The engine prediction with fixed costs ``step_overhead``, ``layer_overhead``,
        ``sequence_overhead``, ``prefill_step_overhead`` and ``gemm_intercept_share`` (scalars
        or one value per record) (s)."""
        gemm = 0.0 if self.per_gemm_share is None else self.per_gemm_share
        return (
            self.engine_base
            + np.asarray(step_overhead) * self.per_step
            + np.asarray(layer_overhead) * self.per_layer
            + np.asarray(sequence_overhead) * self.per_sequence
            + np.asarray(prefill_step_overhead) * self.per_prefill_step
            + np.asarray(gemm_intercept_share) * gemm
        )

    @property
    def slopes(self) -> tuple[np.ndarray, ...]:
        """How the prediction grows per unit of each of ``dcost.calibrate.host.FIELDS``."""
        gemm = np.zeros_like(self.per_step) if self.per_gemm_share is None else self.per_gemm_share
        return (self.per_step, self.per_layer, self.per_sequence, self.per_prefill_step, gemm)


_PROBE_STEP = 1e-3
_PROBE_SEQUENCE = 1e-5
_PROBE_LAYER = 1e-5
_PROBE_PREFILL_STEP = 1e-3
_PROBE_GEMM_SHARE = 0.5


def _evaluate(cases: list, overheads: tuple | None) -> np.ndarray:
    """Each case's metric, evaluated in one vmapped call per kind of step; ``overheads`` sets
    ``(step_overhead, layer_overhead, sequence_overhead, prefill_step_overhead,
    gemm_overhead)`` on every chip, each a number or one per case (None: as the cases have
    them)."""
    import equinox as eqx
    import jax
    import jax.numpy as jnp

    from dcost.specs import stack

    out = np.zeros(len(cases))
    kinds: dict[tuple, list[int]] = {}
    for i, c in enumerate(cases):
        kind = (c.step, c.metric, jax.tree.structure((c.hardware, c.model)), c.wave_share is None)
        kinds.setdefault(kind, []).append(i)
    for (step, metric, _, steady), idx in kinds.items():
        members = [cases[i] for i in idx]
        hw = stack([c.hardware for c in members])
        if overheads is not None:
            hw = eqx.tree_at(
                lambda h: (
                    h.step_overhead,
                    h.layer_overhead,
                    h.sequence_overhead,
                    h.prefill_step_overhead,
                    h.gemm_overhead,
                ),
                hw,
                tuple(
                    jnp.asarray(np.broadcast_to(np.asarray(v, float), (len(cases),))[idx])
                    for v in overheads
                ),
                is_leaf=lambda x: x is None,
            )
        model = stack([c.model for c in members])
        work = stack([c.workload for c in members])
        design = stack([c.design for c in members])
        chips = jnp.asarray([c.chips for c in members])
        ipo = jnp.asarray([c.input_per_output for c in members])
        share = None if steady else jnp.asarray([c.wave_share for c in members])
        out[idx] = np.asarray(_evaluator(step, metric)(hw, model, work, design, chips, ipo, share))
    return out


@functools.cache
def _evaluator(step: str, metric: str):
    """The vmapped, jitted evaluation of one kind of step and metric: one program per
    structure of its arguments, whatever their values (``predict_all`` evaluates the same
    cases five times with other fixed costs)."""
    import jax

    from dcost.validation.cases import Case, evaluate_metrics

    def one(h, m, w, d, n, r, s):
        return evaluate_metrics(Case(h, m, w, d, step, metric, n, r, s), (metric,))[0]

    return jax.jit(jax.vmap(one))


def _with_chunk(c, chunk: float):
    """The case with chunked prefill of ``chunk`` prompt tokens a step (the engine's token
    budget, ``Scheduler.max_num_batched_tokens``)."""
    import equinox as eqx
    import jax.numpy as jnp

    design = eqx.tree_at(
        lambda d: d.prefill_chunk, c.design, jnp.asarray(chunk, dtype=c.design.batch.dtype)
    )
    return dataclasses.replace(c, design=design)


def kv_room(c, engine) -> tuple[float, float]:
    """``(bytes, bytes a sequence)`` of one chip's KV cache: what HBM leaves after the weights
    (``u M - W`` under vLLM and SGLang, ``u (M - W)`` under TensorRT-LLM; all of it with no
    engine), and what one sequence of the case's mean context holds there (``dcost.decode``'s
    ``memory_per_chip`` is linear in the batch)."""
    import equinox as eqx
    import jax.numpy as jnp

    from dcost.serving.roofline import decode

    def memory(b):
        d = eqx.tree_at(lambda x: x.batch, c.design, jnp.asarray(b, dtype=c.design.batch.dtype))
        return float(decode(d, c.hardware, c.model, c.workload).memory_per_chip)

    m1, m2 = memory(1.0), memory(2.0)
    per_seq, weights = m2 - m1, 2.0 * m1 - m2
    hbm = float(c.hardware.hbm_capacity)
    if engine is None:
        return hbm - weights, per_seq
    u = engine.scheduler.gpu_memory_utilization
    return (u * (hbm - weights) if engine.name == "trtllm" else u * hbm - weights), per_seq


def running_sequences(c, record: Mapping, engine) -> int:
    """Sequences an instance runs at once: the clients, at most the engine's ``max_num_seqs``
    per replica, and at most what its KV cache holds.

    The KV cache gets what HBM leaves after the weights: ``u M - W`` per chip under vLLM and
    SGLang (``gpu_memory_utilization`` / ``mem_fraction_static`` of the whole), ``u (M - W)``
    under TensorRT-LLM (``free_gpu_memory_fraction`` of what the weights leave); activations
    and CUDA graphs are not counted (assumed small). A sequence holds its mean context's KV
    (``Workload.context``: the prompt and half the output), from ``dcost.decode``'s
    ``memory_per_chip``, which is linear in the batch. ``engine=None``: all of HBM and no
    sequence cap (the most any engine could run).
    """
    room, per_seq = kv_room(c, engine)
    slots = int(round(float(record["concurrency"]) / float(c.design.batch)))  # replicas * P
    cap = math.inf if engine is None else engine.scheduler.max_num_seqs
    fits = math.floor(room / per_seq) if per_seq > 0 else math.inf
    per_slot = min(float(c.design.batch), fits, cap)
    return int(max(1, per_slot) * slots) if per_slot >= 1 else int(record["concurrency"])


def gemm_intercept(engine, hardware) -> float:
    """The engine's GEMM intercept (s) at the matmul precision ``hardware`` runs at
    (``Engine.precision_of``; 0 with no engine, or a profile without one)."""
    if engine is None:
        return 0.0
    return float(
        engine.precision_profile.get(engine.precision_of(hardware), {}).get("gemm_intercept", 0.0)
    )


def predict_all(
    recs: Sequence[Mapping] | None = None, engine_for=None, family: bool = True
) -> Predictions:
    """Predict every record (``records()``) pure, with its family profile (``family``) and with
    its engine's profile.

    Args:
      recs: the records (default: every one ``records()`` gives).
      engine_for: ``record -> dcost.Engine or None``; None: the shipped profile of the record's
        engine, nearest version (``dcost.validation.cases.record_engine``).
      family: also predict with the family profile (else ``Predictions.family`` is NaN).

    Each case runs the sequences the engine can hold (``running_sequences``) and chunked
    prefill at the engine's token budget; the engine prediction is returned without fixed costs,
    with how it grows with each (``Predictions``).
    """
    from dcost.validation.cases import case, record_engine

    recs = records()[0] if recs is None else list(recs)
    plain = [{k: v for k, v in r.items() if k != "mode"} for r in recs]
    if engine_for is None:
        cache: dict[tuple, Any] = {}

        def engine_for(r):
            key = (r["engine"], r.get("engine_version"), r["hardware"])
            if key not in cache:
                cache[key] = record_engine(r)[0]
            return cache[key]

    pure_cases, family_cases, engine_cases, labels, front = [], [], [], [], []
    intercepts: list[float] = []
    for r in plain:
        eng = engine_for(r)
        # a client's TTFT holds the engine's frontend (HTTP, tokenizer, streaming), as the
        # simulation's does (``Scheduler.frontend_time``)
        ttft = r["metric"] == "ttft" and eng is not None
        front.append(float(eng.scheduler.frontend_time) if ttft else 0.0)
        first = case(r, calibrated=False)
        running = dict(r, concurrency=running_sequences(first, r, eng))
        pure_cases.append(case(dict(r, concurrency=running_sequences(first, r, None))))
        fam = case(running, calibrated=True) if (family or eng is None) else None
        if family:
            family_cases.append(fam)
        if eng is not None:
            c = case(running, engine=eng)
            engine_cases.append(_with_chunk(c, float(eng.scheduler.max_num_batched_tokens)))
        else:
            engine_cases.append(fam)
        labels.append(eng.label if eng is not None else "")
        intercepts.append(gemm_intercept(eng, engine_cases[-1].hardware))
    icpt = np.asarray(intercepts)
    base = _evaluate(engine_cases, (0.0, 0.0, 0.0, 0.0, 0.0))
    step = _evaluate(engine_cases, (_PROBE_STEP, 0.0, 0.0, 0.0, 0.0))
    layer = _evaluate(engine_cases, (0.0, _PROBE_LAYER, 0.0, 0.0, 0.0))
    seq = _evaluate(engine_cases, (0.0, 0.0, _PROBE_SEQUENCE, 0.0, 0.0))
    prompt = _evaluate(engine_cases, (0.0, 0.0, 0.0, _PROBE_PREFILL_STEP, 0.0))
    gemm = _evaluate(engine_cases, (0.0, 0.0, 0.0, 0.0, _PROBE_GEMM_SHARE * icpt))
    return Predictions(
        records=list(recs),
        measured=np.asarray([r["value"] for r in recs]),
        pure=_evaluate(pure_cases, None),
        family=_evaluate(family_cases, None) if family else np.full(len(recs), np.nan),
        engine_base=base + np.asarray(front),
        per_step=(step - base) / _PROBE_STEP,
        per_layer=(layer - base) / _PROBE_LAYER,
        per_sequence=(seq - base) / _PROBE_SEQUENCE,
        per_prefill_step=(prompt - base) / _PROBE_PREFILL_STEP,
        engine_label=labels,
        per_gemm_share=(gemm - base) / _PROBE_GEMM_SHARE,
    )
