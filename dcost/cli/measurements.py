"""``dcost measurements FILE...``: benchmark result files read into measurement records.

Each file's format is told from its content (``dcost.measurements.FORMATS``: vLLM, SGLang,
AIPerf, GenAI-Perf, GuideLLM, inference-perf, the silicon-sample CSV). What a file does not state
(the chip, the model preset, the engine, the layout) comes from the flags; the table says which
fields each record took from the flags and which were assumed. ``--json`` prints the records
themselves (SI units: seconds, tokens/s per GPU), as strict JSON.
"""

from __future__ import annotations

import json

from dcost.cli.common import format_table, whole

__all__ = ["add_parsers"]

_TIME = ("ttft", "tpot", "itl", "e2e", "step_time")


def _value(record: dict) -> str:
    if record["metric"] in _TIME:
        return f"{record['value'] * 1e3:.4g} ms"
    return f"{record['value']:.4g} tok/s/GPU"


def _cmd_measurements(args) -> int:
    from dcost import measurements

    flags = {
        k: getattr(args, k)
        for k in (
            "hardware",
            "model",
            "engine",
            "engine_version",
            "tensor_parallel",
            "expert_parallel",
            "pipeline_parallel",
            "attention_data_parallel",
            "gpus",
            "concurrency",
            "serving",
            "weights",
            "kv_cache",
            "compute",
        )
    }
    records = []
    for path in args.files:
        records.extend(measurements.read(path, **flags, on_unsupported=args.on_unsupported))
    if args.json:
        print(json.dumps(records, indent=2, allow_nan=False))
        return 0
    rows = [
        [
            r["id"],
            r["metric"],
            _value(r),
            str(r["concurrency"]),
            f"{r['prompt_tokens']:.6g}",
            f"{r['output_tokens']:.6g}",
            r["hardware"],
            r["model"],
            r["engine"] + (f" {r['engine_version']}" if "engine_version" in r else ""),
            f"{r['tensor_parallel']}/{r['expert_parallel']}/{r['pipeline_parallel']}/"
            f"{r['attention_data_parallel']}",
        ]
        for r in records
    ]
    header = ["id", "metric", "value", "conc", "prompt", "output", "hardware", "model", "engine"]
    print(format_table(rows, header + ["tp/ep/pp/adp"]))
    print(f"\n{len(records)} records from {len(args.files)} file(s)")
    seen = set()
    for r in records:  # where each file's fields came from (its first record speaks for it)
        if r["source"] in seen:
            continue
        seen.add(r["source"])
        print(f"{r['source']} ({r['format']}):")
        for key in ("from_file", "from_flags", "assumed"):
            fields = [f for f in r[key] if f not in ("metric", "value", "family")]
            print(f"  {key.replace('_', ' ')}: {', '.join(fields) or '-'}")
    return 0


def add_parsers(subparsers) -> None:
    """Register ``dcost measurements``."""
    p = subparsers.add_parser(
        "measurements",
        help="read benchmark result files (vllm, sglang, aiperf, genai-perf, guidellm, "
        "inference-perf, silicon-sample CSV) into measurement records",
    )
    p.add_argument("files", nargs="+", metavar="FILE", help="result files (format detected)")
    p.add_argument("--hardware", help="hardware preset the runs used (e.g. h100-sxm)")
    p.add_argument("--model", help="model preset the runs served (e.g. llama-3.1-8b)")
    p.add_argument("--engine", help="serving engine (vllm, sglang, trtllm)")
    p.add_argument("--engine-version", help="its version (e.g. 0.11.0)")
    for name in ("tensor-parallel", "expert-parallel", "pipeline-parallel"):
        p.add_argument(f"--{name}", type=whole, help=f"{name.replace('-', ' ')} degree (1)")
    p.add_argument(
        "--attention-data-parallel", type=whole, help="data-parallel attention degree (1)"
    )
    p.add_argument("--gpus", type=whole, help="chips serving the runs (tp * pp * adp)")
    p.add_argument(
        "--concurrency",
        type=whole,
        help="requests in flight, for runs that do not state it (open loop at a request rate)",
    )
    p.add_argument("--serving", choices=("aggregated", "prefill", "decode"))
    for name in ("weights", "kv-cache", "compute"):
        p.add_argument(f"--{name}", choices=("bf16", "fp8", "fp4", "int8"))
    p.add_argument(
        "--on-unsupported",
        choices=("raise", "skip"),
        default="raise",
        help="silicon-sample rows dcost cannot represent (int4 weights, no batch size)",
    )
    p.add_argument("--json", action="store_true", help="the records as JSON (SI units)")
    p.set_defaults(func=_cmd_measurements)
