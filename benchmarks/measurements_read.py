"""How long does reading a 10,000-request benchmark result file take? ``dcost.measurements.read``.

    python benchmarks/measurements_read.py [--requests 10000] [--output-len 128] [--repeat 5]

Writes a synthetic ``vllm bench serve --save-result --save-detailed`` file to a temporary
directory: ``--requests`` requests of 1,024 prompt tokens and ``--output-len`` output tokens, with
the per-request lists vLLM saves (``input_lens``, ``output_lens``, ``ttfts``, ``itls`` with one
gap per output token after the first, ``generated_texts`` of four characters a token, ``errors``)
and the summary keys computed from them. Then times ``read()`` on it (best and median of
``--repeat``, after one warm-up read that imports what ``read`` imports on first use), and prints
that beside ``import jax`` timed in this same process (before dcost is imported), the floor every
dcost command pays. The issue's budget: reading a 10,000-request file well under 1 s on 2 cores.

``--calibrate`` also times whole ``dcost calibrate --from FILE --hardware h100-sxm --model
llama-3.1-8b --engine vllm`` processes on the file: on an empty cache (a new ``DCOST_CACHE_DIR``
each, ``--repeat`` of them) and after it, beside a process that only imports JAX; each process
under a 300 s timeout. The issue's budget: reading the file and fitting a profile in 10 s.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import time

t0 = time.perf_counter()
import jax  # noqa: E402,F401  (timed: the import every dcost command pays)

IMPORT_JAX = time.perf_counter() - t0

from dcost import measurements  # noqa: E402


def synthetic_vllm_result(requests: int, output_len: int, seed: int = 0) -> dict:
    """A ``vllm bench serve --save-detailed`` result dict of ``requests`` closed-loop requests."""
    import numpy as np

    rng = np.random.default_rng(seed)
    ttfts = rng.uniform(0.05, 0.4, requests)
    itls = rng.uniform(0.008, 0.014, (requests, output_len - 1))
    e2e = ttfts + itls.sum(axis=1)
    tpot = (e2e - ttfts) / (output_len - 1)
    duration = float(e2e.sum() / 64)  # 64 requests in flight
    total_out = requests * output_len

    def stats(name, values):
        v = np.asarray(values) * 1e3
        return {
            f"mean_{name}_ms": float(v.mean()),
            f"median_{name}_ms": float(np.median(v)),
            f"std_{name}_ms": float(v.std()),
            f"p99_{name}_ms": float(np.percentile(v, 99)),
        }

    out = {
        "date": "20260301-120000",
        "endpoint_type": "openai",
        "backend": "openai",
        "label": None,
        "model_id": "meta-llama/Llama-3.1-8B-Instruct",
        "tokenizer_id": "meta-llama/Llama-3.1-8B-Instruct",
        "num_prompts": requests,
        "request_rate": "inf",
        "burstiness": 1.0,
        "max_concurrency": 64,
        "duration": duration,
        "completed": requests,
        "failed": 0,
        "total_input_tokens": 1024 * requests,
        "total_output_tokens": total_out,
        "request_throughput": requests / duration,
        "request_goodput": None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (1024 * requests + total_out) / duration,
        "input_lens": [1024] * requests,
        "output_lens": [output_len] * requests,
        "ttfts": ttfts.tolist(),
        "itls": itls.tolist(),
        "generated_texts": ["abcd" * output_len] * requests,
        "errors": [""] * requests,
        "max_output_tokens_per_s": total_out / duration * 1.1,
        "max_concurrent_requests": 64,
    }
    for name, values in (("ttft", ttfts), ("tpot", tpot), ("itl", itls.ravel()), ("e2el", e2e)):
        out.update(stats(name, values))
    return out


def _process_seconds(argv, env) -> float:
    """Wall seconds of one process (300 s at most: a hung one is an error, not a figure)."""
    import subprocess
    import sys

    t = time.perf_counter()
    subprocess.run([sys.executable, *argv], env=env, check=True, capture_output=True, timeout=300)
    return time.perf_counter() - t


def time_calibrate(path: pathlib.Path, repeat: int, tmp: str) -> None:
    """Print ``dcost calibrate --from path`` wall times, cold and warm, beside ``import jax``."""
    import os

    argv = ["-m", "dcost", "calibrate", "--from", str(path), "--hardware", "h100-sxm"]
    argv += ["--model", "llama-3.1-8b", "--engine", "vllm", "--out", f"{tmp}/mine.toml"]
    base = dict(os.environ)
    jax_only = [_process_seconds(["-c", "import jax"], base) for _ in range(repeat)]
    cold, warm = [], []
    for i in range(repeat):
        env = dict(base, DCOST_CACHE_DIR=f"{tmp}/cache{i}")
        cold.append(_process_seconds(argv, env))
        warm.append(_process_seconds(argv, env))
    for name, xs in (("import jax", jax_only), ("calibrate, empty cache", cold),
                     ("calibrate, cache filled", warm)):  # fmt: skip
        print(f"{name}: median {statistics.median(xs):.2f} s, range {min(xs):.2f}-{max(xs):.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--calibrate", action="store_true", help="also time dcost calibrate")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "vllm-result.json"
        path.write_text(json.dumps(synthetic_vllm_result(args.requests, args.output_len)))
        size = path.stat().st_size
        flags = dict(hardware="h100-sxm", model="llama-3.1-8b", engine="vllm")
        records = measurements.read(path, **flags)  # warm-up: first-use imports
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            records = measurements.read(path, **flags)
            times.append(time.perf_counter() - t)
        if args.calibrate:
            time_calibrate(path, args.repeat, tmp)
    print(
        f"file: {args.requests} requests x {args.output_len} output tokens, "
        f"{size / 1e6:.1f} MB, {len(records)} records"
    )
    print(
        f"read(): best {min(times):.3f} s, median {statistics.median(times):.3f} s "
        f"({args.repeat} reads)"
    )
    print(f"import jax (same process): {IMPORT_JAX:.3f} s")


if __name__ == "__main__":
    main()
