"""Whole-run energy measurements (``energy.toml``) and how far dcost's power model is from them.

Each record is a serving run as in ``records.toml`` whose metric is ``energy_per_output_token``
(J) or ``power_per_gpu`` (W, mean over the run). ``predict`` builds the run's replica with the
calibrated family profile (``dcost.validation.case``) and evaluates ``dcost.energy`` on it:

    aggregated:  J/output token = E_decode + (T_in / T_out) * E_prefill   # prompts shared out
                 W per GPU      = mean of decode and prefill power, weighted by their time
    decode pool: E_decode;  prefill pool: E_prefill (J per input token)

The records are held out of every fit: the activity coefficients come from kernel power alone
(``dcost.calibrate.power``). ``summary`` gives the median and p90 of ``|predicted/measured - 1|``.

>>> recs = load()
>>> len(recs) >= 4
True
"""

from __future__ import annotations

import csv
import io
import json
import pathlib
import tomllib
from collections.abc import Mapping
from importlib import resources

import numpy as np

from dcost.serving.power import energy
from dcost.validation.cases import case

__all__ = [
    "METRICS",
    "load",
    "predict",
    "errors",
    "summary",
    "mlenergy_records",
    "write_mlenergy_csv",
]

METRICS = ("energy_per_output_token", "power_per_gpu")


def load() -> list[dict]:
    """The shipped whole-run energy records (``energy.toml``), each checked like a serving
    record (its metric one of ``METRICS``)."""
    text = resources.files(__package__).joinpath("energy.toml").read_text(encoding="utf-8")
    records = tomllib.loads(text)["record"]
    for r in records:
        if r.get("metric") not in METRICS:
            raise ValueError(
                f"energy record {r.get('id')!r}: metric = {r.get('metric')!r} is not allowed: "
                f"it must be one of {', '.join(METRICS)}"
            )
        if not isinstance(r.get("value"), (int, float)) or not r["value"] > 0:
            raise ValueError(
                f"energy record {r.get('id')!r}: value = {r.get('value')!r} must be a positive "
                "number (J or W)"
            )
    return records


def predict(record: Mapping) -> float:
    """The record's metric (J per output token, or W per GPU) as dcost predicts it with the
    calibrated family profile and the shipped ``POWER_FIT``."""
    run = dict(record, metric="output_throughput_per_gpu", value=1.0)
    c = case(run, calibrated=True)
    args = (c.design, c.hardware, c.model, c.workload)
    serving = record["serving"]
    if serving == "prefill":
        e = energy(*args, step="prefill")
        if record["metric"] == "power_per_gpu":
            return float(e.power_per_chip)
        raise ValueError(
            f"energy record {record.get('id')!r}: a prefill pool has no energy_per_output_token"
        )
    dec = energy(*args, step="decode")
    if serving == "decode":
        if record["metric"] == "power_per_gpu":
            return float(dec.power_per_chip)
        return float(dec.energy_per_token)
    pre = energy(*args, step="prefill")
    ratio = float(record["prompt_tokens"]) / float(record["output_tokens"])
    if record["metric"] == "energy_per_output_token":
        return float(dec.energy_per_token + ratio * pre.energy_per_token)
    # time-weighted mean power: seconds per output token in each phase
    t_dec = 1.0 / float(dec.power_per_replica / dec.energy_per_token)
    t_pre = ratio / float(pre.power_per_replica / pre.energy_per_token)
    return float((dec.power_per_chip * t_dec + pre.power_per_chip * t_pre) / (t_dec + t_pre))


def errors(records: list[Mapping] | None = None) -> list[dict]:
    """Per record: ``id``, ``hardware``, ``model``, ``metric``, measured, predicted and
    ``ratio = predicted / measured``."""
    chosen: list = load() if records is None else list(records)
    out = []
    for r in chosen:
        p = predict(r)
        out.append(
            {
                "id": r["id"],
                "hardware": r["hardware"],
                "model": r["model"],
                "metric": r["metric"],
                "measured": float(r["value"]),
                "predicted": p,
                "ratio": p / float(r["value"]),
            }
        )
    return out


def summary(records: list[Mapping] | None = None) -> dict:
    """Median and p90 of ``|predicted/measured - 1|`` per metric over the held-out records, with
    the rows (``errors``)."""
    rows = errors(records)
    out: dict = {"rows": rows}
    for metric in METRICS:
        e = np.asarray([abs(r["ratio"] - 1.0) for r in rows if r["metric"] == metric])
        if e.size:
            out[metric] = {
                "n": int(e.size),
                "median": float(np.median(e)),
                "p90": float(np.percentile(e, 90)),
            }
    return out


# ------------------------------------------------------------------ The ML.ENERGY Benchmark v3
# Every LLM configuration of the ML.ENERGY leaderboard's v3 runs (vLLM 0.11.1 on H100 and B200,
# one to eight GPUs), as its build publishes them: ml-energy/leaderboard, public/data/tasks/
# {task}.json, one row per configuration with its measured mean power of all its GPUs, energy
# per output token, throughput and running batch. ``mlenergy_v3.csv`` keeps those fields
# verbatim; ``mlenergy_records`` turns the rows whose model is a preset into records.

MLENERGY_SOURCE = (
    "https://github.com/ml-energy/leaderboard/tree/0cd52dab897c5d91a45f4d413038f3b8b4251b0f/"
    "public/data/tasks"
)
MLENERGY_FIELDS = (
    "task", "model_id", "gpu_model", "num_gpus", "tensor_parallel", "expert_parallel",
    "data_parallel", "max_num_seqs", "weight_precision", "avg_batch_size", "avg_output_len",
    "avg_power_watts", "energy_per_token_joules", "output_throughput_tokens_per_sec",
    "median_itl_ms",
)  # fmt: skip
MLENERGY_TASKS = ("lm-arena-chat", "gpqa", "sourcegraph-fim")
# the leaderboard's model ids -> presets (same architecture; the -2507 and -0528 releases and
# Llama 3.1 70B share their preset's layers, widths and experts)
MLENERGY_MODELS = {
    "meta-llama/Llama-3.1-8B-Instruct": "llama-3.1-8b",
    "meta-llama/Llama-3.1-70B-Instruct": "llama-3-70b",
    "meta-llama/Llama-3.3-70B-Instruct": "llama-3.3-70b",
    "meta-llama/Llama-3.1-405B-Instruct": "llama-3-405b",
    "meta-llama/Llama-3.1-405B-Instruct-FP8": "llama-3-405b",
    "Qwen/Qwen3-14B": "qwen3-14b",
    "Qwen/Qwen3-32B": "qwen3-32b",
    "Qwen/Qwen3-30B-A3B-Instruct-2507": "qwen3-30b-a3b",
    "Qwen/Qwen3-30B-A3B-Thinking-2507": "qwen3-30b-a3b",
    "Qwen/Qwen3-235B-A22B-Instruct-2507": "qwen3-235b-a22b",
    "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8": "qwen3-235b-a22b",
    "Qwen/Qwen3-235B-A22B-Thinking-2507": "qwen3-235b-a22b",
    "Qwen/Qwen3-235B-A22B-Thinking-2507-FP8": "qwen3-235b-a22b",
    "deepseek-ai/DeepSeek-V3.1": "deepseek-v3",
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-r1",
    "openai/gpt-oss-120b": "gpt-oss-120b",
}
# mean prompt tokens of each task: not published with the runs (assumed; see mlenergy_records)
MLENERGY_PROMPTS = {"lm-arena-chat": 200.0, "gpqa": 300.0}
_GPUS = {"H100": "h100-sxm", "B200": "b200"}
_WEIGHTS = {"bfloat16": "bf16", "fp8": "fp8", "mxfp4": "fp4"}


def write_mlenergy_csv(tasks_dir, out) -> int:
    """Write ``MLENERGY_FIELDS`` of every configuration in ``tasks_dir/{task}.json`` (a checkout
    of ml-energy/leaderboard's ``public/data/tasks``) to ``out``; returns the row count."""
    rows = []
    for task in MLENERGY_TASKS:
        path = pathlib.Path(tasks_dir) / f"{task}.json"
        for c in json.loads(path.read_text(encoding="utf-8"))["configurations"]:
            rows.append([task, *(c[f] for f in MLENERGY_FIELDS[1:])])
    buf = io.StringIO()
    buf.write(f"# The ML.ENERGY Benchmark v3 (vLLM 0.11.1): {MLENERGY_SOURCE}/{{task}}.json\n")
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(MLENERGY_FIELDS)
    w.writerows(rows)
    pathlib.Path(out).write_text(buf.getvalue(), encoding="utf-8")
    return len(rows)


def _mlenergy_rows() -> list[dict]:
    text = resources.files(__package__).joinpath("mlenergy_v3.csv").read_text(encoding="utf-8")
    lines = [ln for ln in text.splitlines() if not ln.startswith("#")]
    return list(csv.DictReader(lines))


def mlenergy_records() -> tuple[list[dict], dict[str, int]]:
    """The ML.ENERGY v3 runs dcost can express, as records (each configuration twice: its
    energy per output token, J, and its mean power per GPU, W), and the others counted by why.

    Layout: vLLM's expert parallelism spans its tensor-parallel ranks, so a row of ``n`` GPUs
    with ``expert_parallel = n`` is ``tensor_parallel = n`` with experts split ``n`` ways. The
    running batch is the run's measured mean (``avg_batch_size``, rounded), the output length
    its measured mean; the prompt length is not published and is assumed per task
    (``MLENERGY_PROMPTS``: LMArena's human prompts and GPQA's questions are a few hundred
    tokens). The code task (fill-in-the-middle: long prompts, short answers, whose lengths
    decide the prefill share) is counted out for that reason.
    """
    records: list[dict] = []
    skipped: dict[str, int] = {}

    def skip(why):
        skipped[why] = skipped.get(why, 0) + 1

    for i, row in enumerate(_mlenergy_rows()):
        task, mid = row["task"], row["model_id"]
        if task not in MLENERGY_PROMPTS:
            skip(f"{task}: prompt lengths not published")
            continue
        if mid not in MLENERGY_MODELS:
            skip("model is not a preset")
            continue
        n = int(row["num_gpus"])
        tp, ep, dp = (int(row[k]) for k in ("tensor_parallel", "expert_parallel", "data_parallel"))
        tp = max(tp, ep // dp) if ep > 1 else tp
        base = {
            "source": f"{MLENERGY_SOURCE}/{task}.json",
            "source_id": "mlenergy-v3",
            "family": "hopper" if row["gpu_model"] == "H100" else "blackwell",
            "quote": ", ".join(f"{k}={row[k]}" for k in MLENERGY_FIELDS[1:]),
            "hardware": _GPUS[row["gpu_model"]],
            "model": MLENERGY_MODELS[mid],
            "weights": _WEIGHTS[row["weight_precision"]],
            "kv_cache": "bf16",
            "compute": "bf16" if row["weight_precision"] != "fp8" else "fp8",
            "gpus": n,
            "tensor_parallel": tp,
            "expert_parallel": ep,
            "attention_data_parallel": dp,
            "serving": "aggregated",
            "concurrency": max(1, round(float(row["avg_batch_size"]))),
            "prompt_tokens": MLENERGY_PROMPTS[task],
            "output_tokens": float(row["avg_output_len"]),
            "engine": "vllm",
            "engine_version": "0.11.1",
            "assumed": ["prompt_tokens"],
        }
        rid = f"mlenergy-v3-{i}-{task}-{mid.split('/')[1].lower()}-{row['gpu_model'].lower()}"
        rid += f"-g{n}-c{row['max_num_seqs']}"
        records.append(
            dict(base, id=rid + "-energy", metric="energy_per_output_token",
                 value=float(row["energy_per_token_joules"]))
        )  # fmt: skip
        records.append(
            dict(base, id=rid + "-power", metric="power_per_gpu",
                 value=float(row["avg_power_watts"]) / n)
        )  # fmt: skip
    return records, skipped
