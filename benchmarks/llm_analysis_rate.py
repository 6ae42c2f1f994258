"""Time llm-analysis on a grid of (batch, context) decode points; run by ``eval_throughput.py``.

This file runs inside the separate benchmark virtual environment (``.bench-venv``) that holds
llm-analysis (https://github.com/cli99/llm-analysis, Apache-2.0); it imports neither dcost nor JAX.
It reads one JSON object on stdin and writes one JSON object on stdout:

    in:  {"arch": {n_layers, d_model, n_heads, n_kv_heads, d_ff, vocab, mlp},
          "gpu": "h100-sxm-80gb", "tp": 8, "seconds": 15.0,
          "points": [[batch, context], ...], "checks": [[batch, context], ...]}
    out: {"version", "evaluated", "failed", "seconds", "params_total", "gpu", "checks": [...]}

One evaluation is one call of ``LLMAnalysis.inference(batch_size_per_gpu=B, seq_len=T-1,
num_tokens_to_generate=1)``: the KV cache then holds ``T`` tokens during the decode step, the
context dcost calls ``T``. The analysis object is built once, outside the timed loop, which is the
cheapest way to use its public API; logging is silenced (its messages are still formatted).
"""

from __future__ import annotations

import json
import logging
import sys
import time
from importlib import metadata


def llama_like(arch: dict):
    """An llm-analysis ``ModelConfig`` for a llama-style architecture card.

    llm-analysis counts two MLP matrices of ``d x ffn``; a SwiGLU MLP has three of ``d x d_ff``, so
    ``ffn = 1.5 * d_ff`` gives the same weight bytes (the quantity that decides decode time).
    """
    from llm_analysis.config import ModelConfig

    d = int(arch["d_model"])
    gated = arch.get("mlp", "swiglu") == "swiglu"
    ffn = int(arch["d_ff"] * 3 // 2) if gated else int(arch["d_ff"])
    return ModelConfig(
        name="llama-like",
        num_layers=int(arch["n_layers"]),
        n_head=int(arch["n_heads"]),
        hidden_dim=d,
        vocab_size=int(arch["vocab"]),
        num_key_value_heads=int(arch.get("n_kv_heads", arch["n_heads"])),
        ffn_embed_dim=ffn,
        expansion_ratio=ffn / d,
        model_type="llama",
    )


def main() -> None:
    request = json.load(sys.stdin)
    from llm_analysis.analysis import LLMAnalysis
    from llm_analysis.config import (
        ParallelismConfig,
        get_dtype_config_by_name,
        get_gpu_config_by_name,
    )
    from llm_analysis.logger import logger

    logger.setLevel(logging.ERROR)
    gpu = get_gpu_config_by_name(request["gpu"])
    analysis = LLMAnalysis(
        llama_like(request["arch"]),
        gpu,
        get_dtype_config_by_name("w16a16e16"),
        ParallelismConfig(tp_size=int(request["tp"])),
        flops_efficiency=1.0,
        hbm_memory_efficiency=1.0,
    )

    def evaluate(batch: int, context: int) -> dict:
        return analysis.inference(
            batch_size_per_gpu=batch, seq_len=context - 1, num_tokens_to_generate=1
        )

    budget = float(request["seconds"])
    evaluated = failed = 0
    start = time.perf_counter()
    elapsed = 0.0
    for batch, context in request["points"]:
        try:
            evaluate(int(batch), int(context))
            evaluated += 1
        except AssertionError:  # llm-analysis asserts when a design does not fit in memory
            failed += 1
        elapsed = time.perf_counter() - start
        if elapsed >= budget:
            break

    checks = []
    for batch, context in request["checks"]:
        r = evaluate(int(batch), int(context))
        checks.append(
            {k: r[k] for k in r if k.startswith("decode_") or k == "kv_cache_latency"}
            | {"batch": batch, "context": context}
        )

    json.dump(
        {
            "version": metadata.version("llm-analysis"),
            "evaluated": evaluated,
            "failed": failed,
            "seconds": elapsed,
            "params_total": analysis.total_num_params,
            "gpu": {
                "name": gpu.name,
                "peak_fp16_TFLOPS": gpu.peak_fp16_TFLOPS,
                "hbm_bandwidth_in_GB_per_sec": gpu.hbm_bandwidth_in_GB_per_sec,
                "intra_node_bandwidth_in_GB_per_sec": gpu.intra_node_bandwidth_in_GB_per_sec,
                "intra_node_min_message_latency": gpu.intra_node_min_message_latency,
            },
            "checks": checks,
        },
        sys.stdout,
    )


if __name__ == "__main__":
    main()
