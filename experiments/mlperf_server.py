"""MLPerf Server runs simulated at their measured arrival rate (issue 29's "validation under load").

Claim: a deployment simulated with its engine's profile, the scheduler settings its submission's
config sets, and Poisson arrivals at the rate the run completed (MLPerf LoadGen's Server scenario
sends Poisson queries) should give the run's mean time to first token within 25 %, and should be
stable (a bounded queue) where the measured run was.

The records are ``dcost/validation/records.toml``'s MLPerf Server TTFT records on NVIDIA chips
(7; the 5 on AMD chips have no engine profile and are counted out): each gives the completed
samples per second, the mean latency, the mean output length, the instances the system ran and
the submission's config (``gpu_batch_size`` and ``max_num_tokens`` where the note quotes them;
else, assumed, those quoted for the same model on another chip, or the engine's defaults: each
row's ``scheduler`` field says which). The rate per instance is the completed samples per second
over the instances (Little's law holds in a stable run). The harness calls the engine
in-process, so no API server time is added (``frontend_time = 0``). The lengths are the records'
means, held fixed (an assumption of this experiment: the datasets' spreads are not published),
and the prompt means of the Llama 3.1 8B and DeepSeek-R1 sets are assumed (1,000 and 800 tokens;
the records say so, in each row's ``assumed``).

The engine profiles' host costs (``prefill_step_overhead``, a step with prompt tokens run
outside the CUDA graph, and ``sequence_overhead``, work per running sequence a step) were fitted
to the silicon sample's servers: TensorRT-LLM's PyTorch backend and vLLM's Python executor. A
submission whose runtime does not pay them runs without them (``CONFIGS``' last field, and each
row's ``runtime``): TensorRT engines under TensorRT-LLM's C++ runtime (the v5.1 Llama
submissions; assumed for v6.0's Llama 3.1 8B) pay neither, and the PyTorch backend with
piecewise CUDA graphs over steps of up to 4,608 tokens (v6.0's Llama 2 70B config) not the
first. The first is left out by ``Scheduler.prompt_graphs`` (a launch setting of the engine),
the second by ``Engine.with_profile``. Each such row also gives the share of the rate served
with the costs as profiled (``stable_share_as_profiled``).

Nothing is fitted to these runs. A run whose simulated queue grows (the median TTFT of the last
quarter of arrivals over 1.5 times that of the second quarter) is *unstable*: the simulated
replica serves less than the measured rate. For those, the rate is lowered by 10 % steps until
the simulation is stable and the last step is then halved to 1.25 points (``RESOLUTION``):
that share is how far the simulated capacity falls short.

    python experiments/mlperf_server.py
"""

from __future__ import annotations

import re
import time
import tomllib

import _common as C  # puts the checkout's dcost first on the path
import numpy as np

import dcost
from dcost.planning.server import Load, Server, simulate_server

# The host costs the engine profiles fit to the silicon sample's servers (TensorRT-LLM's and
# vLLM's Python executors: a step with prompt tokens run outside the CUDA graph, kernel by kernel,
# and work per running sequence each step) that a submission's runtime does not pay, with why
TENSORRT_ENGINES = (
    C.CPP_RUNTIME,
    "TensorRT engines run by TensorRT-LLM's C++ runtime (trtllm-build flags in the config, "
    "TensorRT 10.8 or 10.11 in the records' system descriptions): no Python executor, so "
    "neither the cost of a step with prompt tokens nor the cost per running sequence that the "
    "PyTorch backend's profile carries (assumed 0)",
)
PIECEWISE_GRAPHS = (
    ("prefill_step_overhead",),
    "TensorRT-LLM's PyTorch backend with piecewise CUDA graphs captured up to 4,608 tokens "
    "(torch_compile_config in the config): a step with prompt tokens runs in a graph too",
)
AS_PROFILED = ((), "as profiled")

# engine, the scheduler settings of each submission's config (Scheduler field names), their
# source, and the runtime (the profile's host costs it does not pay). TensorRT engines under the
# C++ runtime form each step's batch at its boundary (async_scheduling off: the overlap
# scheduler is the PyTorch backend's PyExecutor's; assumed), as vLLM did before 0.14

CONFIGS = {
    "mlperf51-llama2-70b-h200x8-nebius-server-ttft": (
        "trtllm",
        dict(max_num_seqs=2048, max_num_batched_tokens=1536, async_scheduling=False),
        "gpu_batch_size 2048, max_num_tokens 1536 (Nebius's config, quoted in the record)",
        TENSORRT_ENGINES,
    ),
    "mlperf51-llama3.1-8b-h200x8-quanta-server-ttft": (
        "trtllm",
        dict(max_num_seqs=2048, max_num_batched_tokens=1536, async_scheduling=False),
        "gpu_batch_size 2048, max_num_tokens 1536 (Quanta's config, quoted in the record)",
        TENSORRT_ENGINES,
    ),
    "mlperf51-llama3.1-8b-h100x1-vllm-server-ttft": (
        "vllm",
        dict(async_scheduling=False),
        "vLLM 0.10.0's defaults (assumed: RedHat's settings are not quoted in the record; no "
        "async scheduling before 0.14)",
        AS_PROFILED,
    ),
    "mlperf51-deepseek-r1-b200x8-server-ttft": (
        "trtllm",
        dict(max_num_seqs=8 * 512, max_num_batched_tokens=3456),
        "gpu_batch_size 512 per attention-data-parallel rank (8), max_num_tokens 3456 (NVIDIA's "
        "config, quoted in the record)",
        AS_PROFILED,  # the PyTorch backend (DeepSeek-R1 runs on no other); chunked context off
    ),
    "mlperf60-deepseek-r1-b300x8-server-ttft": (
        "trtllm",
        dict(max_num_seqs=8 * 640, max_num_batched_tokens=4608),
        "gpu_batch_size 640 per attention-data-parallel rank (8), max_num_tokens 4608 (NVIDIA's "
        "v6.0 config, closed/NVIDIA/configs/B300-SXM-270GBx8/Server/deepseek-r1.py, read from "
        "the mirror gbeezybez/inference_results_v6.0@ab33b2144a9f822f69d24f78569f993d195ee7e5)",
        AS_PROFILED,  # the PyTorch backend: CUDA graphs for decode batch sizes only
    ),
    "mlperf60-llama3.1-8b-b300x8-server-ttft": (
        "trtllm",
        dict(max_num_seqs=2048, max_num_batched_tokens=1536, async_scheduling=False),
        "gpu_batch_size 2048, max_num_tokens 1536 (assumed: NVIDIA's v6.0 GB200 config, "
        "closed/NVIDIA/configs/GB200-NVL72_GB200-186GB_aarch64x1/Server/llama3_1-8b.py in the "
        "same mirror; no B300 file is in it)",
        TENSORRT_ENGINES,  # assumed as that config's build flags and v5.1's runs
    ),
    "mlperf60-llama2-70b-b300x8-server-ttft": (
        "trtllm",
        dict(max_num_seqs=3072, max_num_batched_tokens=4608),
        "gpu_batch_size 3072, max_num_tokens 4608 (assumed: NVIDIA's v6.0 GB300 config, "
        "closed/NVIDIA/configs/GB300-NVL72_GB300-288GB_aarch64x1/Server/llama2-70b.py in the "
        "same mirror; no B300 file is in it)",
        PIECEWISE_GRAPHS,
    ),
}
_RUN = re.compile(r"= ([\d.]+) x \(([\d.]+) - ([\d.]+)\) s over (\d+) instance")


def records() -> list[dict]:
    """The MLPerf Server TTFT records, each with its completed samples/s and instances."""
    text = (C.ROOT / "dcost" / "validation" / "records.toml").read_text(encoding="utf-8")
    out = []
    for r in tomllib.loads(text)["record"]:
        if r.get("metric") != "ttft" or not r["id"].startswith("mlperf"):
            continue
        if not r["id"].endswith("-server-ttft"):
            continue
        m = _RUN.search(r["note"])
        if m is None:
            raise ValueError(f"records.toml: {r['id']}: no Little's-law figures in its note")
        out.append(
            dict(r, samples_per_s=float(m.group(1)), latency=float(m.group(2)),
                 instances=int(m.group(4)))
        )  # fmt: skip
    return out


def _growing(run) -> bool:
    """Whether the queue grew: the last quarter of arrivals' median TTFT over 1.5 times the
    second quarter's (a steady queue's quarters agree within a few percent over thousands of
    requests; a queue growing from empty at a steady pace gives 7/3)."""
    order = np.argsort(run.arrival)
    ttft = run.ttft[order]
    q = len(ttft) // 4
    second, last = np.nanmedian(ttft[q : 2 * q]), np.nanmedian(ttft[3 * q :])
    return bool(last > 1.5 * second)


def engine_for(r: dict, profiled: bool = False) -> dcost.Engine:
    """Record ``r``'s engine with its submission's scheduler settings, no API server time, and
    without the host costs its runtime does not pay (``profiled``: with them)."""
    name, sched, _, (unpaid, _) = CONFIGS[r["id"]]
    eng = dcost.engine(name, hardware=r["hardware"], frontend_time=0.0, **sched)
    return eng if profiled else C.without_host_costs(eng, unpaid)


def simulate(r: dict, share: float = 1.0, profiled: bool = False):
    """``dcost.simulate``'s run of record ``r``'s deployment (``engine_for``) under Poisson
    arrivals at ``share`` of its measured rate per instance, for 20 mean latencies (at least
    600 s)."""
    eng = engine_for(r, profiled)
    server = Server(
        r["hardware"],
        r["model"],
        engine=eng,
        tensor_parallel=r["tensor_parallel"],
        expert_parallel=r["expert_parallel"] if r["expert_parallel"] > 1 else None,
        attention_data_parallel=r["attention_data_parallel"],
        weights=r["weights"],
        kv_cache=r["kv_cache"],
    )
    rate = share * r["samples_per_s"] / r["instances"]
    seconds = max(20.0 * r["latency"], 600.0)  # many request lifetimes: a steady state
    load = Load(prompt=r["prompt_tokens"], output=r["output_tokens"], stages=((rate, seconds),))
    return simulate_server(server, load)


RESOLUTION = 0.0125
"""How finely ``_stable_share`` finds the share of the measured rate a replica serves (1.25
points: three halvings of a 10-point step). A run that MLPerf tuned to its latency limits runs
near its capacity, so its share is the figure to read, not whether it is above or below 1."""


def _stable_share(r: dict, profiled: bool = False, first: float = 0.9) -> float | None:
    """The largest share of the measured rate at which the simulated queue stays steady, to
    ``RESOLUTION`` (None: none down to 20 %): steps of 10 points from ``first`` down, then the
    step above the first steady share halved until it is ``RESOLUTION`` wide (the queue of a
    replica past its capacity grows at every higher rate, so the steady shares are an interval
    from 0)."""
    shares = [s for s in (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2) if s <= first]
    lo = next((f for f in shares if not _growing(simulate(r, f, profiled))), None)
    if lo is None or lo >= 1.0:
        return lo
    hi = min(lo + 0.1, 1.0)  # the step above lo: 1.0 when lo is first = 0.9 (1.0 grew)
    while hi - lo > RESOLUTION + 1e-9:
        mid = 0.5 * (lo + hi)
        if _growing(simulate(r, mid, profiled)):
            hi = mid
        else:
            lo = mid
    return round(lo, 6)


def compute() -> dict:
    rows, out_of_scope = [], []
    for r in records():
        if r["id"] not in CONFIGS:
            out_of_scope.append({"id": r["id"], "reason": f"no engine profile for {r['hardware']}"})
            continue
        t = time.perf_counter()
        run = simulate(r)
        s = run.summary()
        unstable = _growing(run)
        share = _stable_share(r) if unstable else 1.0
        unpaid, why = CONFIGS[r["id"]][3]
        # the same run with the profile's host costs, where the runtime leaves some out
        profiled = _stable_share(r, profiled=True, first=1.0) if unpaid else share
        rows.append(
            {
                "id": r["id"],
                "hardware": r["hardware"],
                "model": r["model"],
                "engine": CONFIGS[r["id"]][0],
                "scheduler": CONFIGS[r["id"]][2],
                "runtime": why,
                "host_costs_left_out": list(unpaid),
                "rate_per_instance": r["samples_per_s"] / r["instances"],
                "measured_ttft": r["value"],
                "simulated_ttft": s["ttft"]["mean"],
                "measured_e2e": r["latency"],
                "simulated_e2e": s["e2e"]["mean"],
                "unstable": unstable,
                "stable_share": share,
                "stable_share_as_profiled": profiled,
                "assumed": r["assumed"],
                "seconds": time.perf_counter() - t,
            }
        )
        print(f"{r['id']}: {rows[-1]['simulated_ttft']:.3g} s vs {r['value']:.3g} s", flush=True)
    stable = [x for x in rows if not x["unstable"]]
    err = [abs(x["simulated_ttft"] / x["measured_ttft"] - 1.0) for x in stable]
    return {
        "rows": rows,
        "out_of_scope": out_of_scope,
        "summary": {
            "records": len(rows),
            "unstable": len(rows) - len(stable),
            "stable_ttft_median_error": float(np.median(err)) if err else None,
        },
    }


def plot(results: dict):
    rows = results["rows"]
    fig, ax = C.plt.subplots(figsize=(8.5, 4.2))
    labels = [f"{x['model']}\n{x['hardware']} ({x['engine']})" for x in rows]
    y = np.arange(len(rows))
    ratio = [x["simulated_ttft"] / x["measured_ttft"] for x in rows]
    colors = ["#d62728" if x["unstable"] else "#1f77b4" for x in rows]
    ax.barh(y, ratio, color=colors)
    ax.axvline(1.0, color="grey", lw=1)
    ax.set_xscale("log")
    ax.set_yticks(y, labels, fontsize=8)
    ax.set_xlabel("simulated / measured mean TTFT (log scale)")
    for i, x in enumerate(rows):
        if not x["unstable"]:
            note = "stable"
        elif x["stable_share"] is None:
            note = "queue grows at every rate down to 20 %"
        else:
            note = f"queue grows; stable at {100 * x['stable_share']:.1f} %"
        if x["host_costs_left_out"]:
            was = x["stable_share_as_profiled"]
            was_note = "at no rate" if was is None else f"at {100 * was:.1f} %"
            note += f" (with the profile's host costs {was_note})"
        ax.annotate(note, (ratio[i], i), xytext=(4, 0), textcoords="offset points",
                    va="center", fontsize=7)  # fmt: skip
    ax.set_title(
        "MLPerf Server runs at their measured rate (red: the simulated queue grows;\n"
        "stable at x %: the share of that rate the simulated replica serves)",
        fontsize=10,
    )
    ax.set_xlim(min(ratio) / 2, max(ratio) * 3000)
    fig.tight_layout()
    return fig


def main() -> None:
    results = compute()
    C.save("mlperf_server", plot(results), results)


if __name__ == "__main__":
    main()
