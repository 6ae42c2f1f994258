"""``dcost simulate``: one deployment under a load, with its engine's scheduler.

    dcost simulate --hardware h100-sxm --model llama-3.1-8b --engine vllm --clients 64 \\
        --prompt 1024 --output 256
    dcost simulate --hardware h100-sxm --model llama-3.1-8b --engine vllm --rate 8 --seconds 600 \\
        --rate 20 --seconds 600 --arrival constant --json
    dcost simulate --hardware h100-sxm --model llama-3.1-8b --engine vllm --trace trace.csv

``--decode-replicas N`` (and ``--decode-tensor-parallel G``) makes it disaggregated: the
``--replicas`` prefill, N more decode (``dcost.planning.server.simulate_disaggregated``).
``--trace FILE`` replays a trace (dcost's CSV or JSON Lines, the Azure LLM inference traces,
BurstGPT, Mooncake: ``dcost.planning.traces``). Prints TTFT, TPOT, ITL and end-to-end latency
(mean and percentiles), throughput, preemptions, the prefix-cache hit rate and the KV cache's
peak (``dcost.planning.server``); ``--plot FILE`` saves each request's TTFT and TPOT against
time with the stages shaded.

The engine runs with its own defaults (``dcost/engines/schedulers.toml``, each with its source)
unless the launch flags say otherwise, under vLLM's names (SGLang's and TensorRT-LLM's in
brackets): ``--max-num-seqs`` (``--max-running-requests``, ``max_batch_size``),
``--max-num-batched-tokens`` (``--chunked-prefill-size``, ``max_num_tokens``),
``--gpu-memory-utilization`` (``--mem-fraction-static``), ``--block-size`` (``--page-size``),
``--no-prefix-caching``, and ``--mixed-chunk`` (SGLang's ``--enable-mixed-chunk``: prompt chunks
run beside the decodes; SGLang's default runs a step of prompt tokens alone, ``--prefill-first``),
``--scheduler-recv-interval`` (SGLang's: a busy engine takes in new requests every N decode steps),
``--batch-wait-iters`` and ``--batch-wait-tokens`` (TensorRT-LLM's batch waiting), and
``--prompt-graphs`` (steps with prompt tokens replayed as CUDA graphs too:
``Scheduler.prompt_graphs``), and ``--no-async-scheduling`` (SGLang's
``--disable-overlap-schedule``, TensorRT-LLM's ``disable_overlap_scheduler``: each step's batch
formed at its boundary, not while the step before it runs; ``--async-scheduling`` the other way).
``--profile FILE`` runs a profile of your own (``dcost calibrate --from``).
"""

from __future__ import annotations

import argparse
import dataclasses

from dcost.cli.common import format_table, json_text, positive, whole

__all__ = ["add_parsers"]


# the launch flags, by the Scheduler field each sets
_FLAGS = {
    "max_num_seqs": "--max-num-seqs",
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "block_size": "--block-size",
    "prefix_caching": "--no-prefix-caching",
    "prefill_first": "--mixed-chunk / --prefill-first",
    "frontend_time": "--frontend-time",
    "recv_interval": "--scheduler-recv-interval",
    "batch_wait_iters": "--batch-wait-iters",
    "batch_wait_tokens": "--batch-wait-tokens",
    "prompt_graphs": "--prompt-graphs",
    "async_scheduling": "--async-scheduling / --no-async-scheduling",
}


def _engine(args):
    """``--engine`` on ``--hardware`` with ``--profile`` and the launch flags (None: pure
    physics, which takes none of them)."""
    values = {
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
        "gpu_memory_utilization": args.gpu_memory_utilization,
        "block_size": args.block_size,
        "prefix_caching": False if args.no_prefix_caching else None,
        "prefill_first": args.prefill_first,
        "frontend_time": args.frontend_time,
        "recv_interval": args.recv_interval,
        "batch_wait_iters": args.batch_wait_iters,
        "batch_wait_tokens": args.batch_wait_tokens,
        "prompt_graphs": True if args.prompt_graphs else None,
        "async_scheduling": args.async_scheduling,
    }
    settings = {field: v for field, v in values.items() if v is not None}
    if args.engine in (None, "none"):
        given = [_FLAGS[field] for field in settings]
        if args.profile is not None:
            given.append("--profile")
        if given:
            raise ValueError(
                f"{', '.join(given)} set an engine's launch; give --engine (vllm, sglang, "
                "trtllm): pure physics has no scheduler of its own"
            )
        return None
    from dcost import engines

    return engines.engine(args.engine, hardware=args.hardware, profile=args.profile, **settings)


def _launch(eng) -> str:
    """The engine and the launch it runs under, in a few words."""
    if eng is None:
        return "pure physics (vLLM's scheduler)"
    sc = eng.scheduler
    order = "prompt steps alone" if sc.prefill_first else "prompt chunks beside the decodes"
    cache = "" if sc.prefix_caching else ", no prefix caching"
    if sc.recv_interval > 1:
        cache += f", new requests taken in every {sc.recv_interval} decode steps"
    if sc.batch_wait_iters:
        cache += f", prompts wait up to {sc.batch_wait_iters} steps for a batch"
    if sc.prompt_graphs:
        cache += ", steps with prompt tokens in CUDA graphs"
    if not sc.async_scheduling:
        cache += ", each step's batch formed at its boundary (no async scheduling)"
    return (
        f"{eng.name} {eng.version} (at most {sc.max_num_seqs} sequences, "
        f"{sc.max_num_batched_tokens}-token steps, {order}, {sc.gpu_memory_utilization:g} of "
        f"HBM{cache})"
    )


def _ttft_check(eng, model: str, load, ttft_mean, disaggregated: bool) -> dict | None:
    """The band of measured over simulated mean TTFT of benchmark runs like this one
    (``dcost.engines.ttft_band``: the engine, a mixture of experts or not, its clients) with
    what it makes of this run's mean TTFT (``low``, ``high``, ``median``: s); None for pure
    physics, an open loop, a trace, a disaggregated run or no mean."""
    import dcost
    from dcost import engines

    if eng is None or ttft_mean is None or disaggregated or load.trace is not None:
        return None
    moe = float(dcost.model(model).moe_layers) > 0
    band = engines.ttft_band(eng.name, moe=moe, clients=load.clients)
    if band is None:
        return None
    return {
        "engine": eng.name,
        **band,
        "low": band["q10"] * ttft_mean,
        "median": band["q50"] * ttft_mean,
        "high": band["q90"] * ttft_mean,
    }


def _cmd_simulate(args) -> int:
    from dcost.planning.server import (
        Bursty,
        Load,
        Server,
        Sessions,
        simulate_disaggregated,
        simulate_server,
    )

    kinds = [k for k, v in (("--clients", args.clients), ("--rate", args.rate)) if v]
    if args.trace:
        if kinds or args.prompt or args.output:
            raise ValueError(
                f"--trace sets the requests; drop {', '.join(kinds) or '--prompt/--output'}"
            )
        load = Load.from_trace(args.trace, shared_prefix=args.shared_prefix)
        if args.prefix_share:
            load = dataclasses.replace(load, prefix_share=args.prefix_share)
    else:
        if not kinds:
            raise ValueError(
                "give --clients N (closed loop), --rate R --seconds S (open loop) or --trace FILE"
            )
        if len(kinds) > 1:
            raise ValueError("--clients (closed loop) and --rate (open loop) exclude each other")
        if args.rate and len(args.rate) != len(args.seconds or []):
            raise ValueError("give one --seconds for each --rate (a stage each)")
        if not (args.prompt and args.output):
            raise ValueError("give --prompt and --output (mean tokens)")
        arrival = Bursty(args.burstiness) if args.burstiness else args.arrival
        load = Load(
            prompt=args.prompt,
            output=args.output,
            stages=tuple(zip(args.rate or (), args.seconds or (), strict=True)),
            arrival=arrival,
            clients=args.clients,
            requests=args.requests,
            shared_prefix=args.shared_prefix,
            prefix_share=args.prefix_share,
            prompt_cv=args.prompt_cv,
            output_cv=args.output_cv,
            distribution=args.distribution,
            sessions=Sessions(args.turns, args.think_time) if args.turns > 1 else None,
        )
    srv = Server(
        args.hardware,
        args.model,
        engine=_engine(args),
        tensor_parallel=args.tensor_parallel,
        expert_parallel=args.expert_parallel,
        attention_data_parallel=args.attention_data_parallel,
        pipeline_parallel=args.pipeline_parallel,
        replicas=args.replicas,
        weights=args.weights,
        kv_cache=args.kv_cache,
        router=args.router,
    )
    decode = None
    for flag, v in (("--decode-replicas", args.decode_replicas),
                    ("--decode-tensor-parallel", args.decode_tensor_parallel)):  # fmt: skip
        if v is not None and v < 1:
            raise ValueError(f"{flag} must be a whole number >= 1, got {v}")
    if args.decode_replicas is not None or args.decode_tensor_parallel is not None:
        if args.decode_replicas is None:
            raise ValueError("--decode-tensor-parallel sets a decode pool: give --decode-replicas")
        decode = dataclasses.replace(
            srv,
            replicas=args.decode_replicas,
            tensor_parallel=args.decode_tensor_parallel or args.tensor_parallel,
            router="least-requests",
        )
        run = simulate_disaggregated(srv, decode, load, seed=args.seed)
    else:
        run = simulate_server(srv, load, seed=args.seed)
    s = run.summary()
    eng = srv.resolved_engine()
    if eng is not None:  # the engine and its launch as simulated
        s["engine"] = {
            "name": eng.name,
            "version": eng.version,
            "scheduler": dataclasses.asdict(eng.scheduler),
        }
    s["router"] = srv.router
    band = _ttft_check(eng, srv.model, load, s["ttft"]["mean"], disaggregated=decode is not None)
    if band is not None:
        s["ttft_check"] = band
    if decode is not None:
        s["disaggregated"] = {
            "prefill_replicas": srv.replicas,
            "prefill_tensor_parallel": srv.tensor_parallel,
            "decode_replicas": decode.replicas,
            "decode_tensor_parallel": decode.tensor_parallel,
            "decode_router": decode.router,
        }
    if args.plot:
        run.plot(load).savefig(args.plot, dpi=110)
    if args.json:
        print(json_text(s))
        return 0
    rows = []
    for metric in ("ttft", "tpot", "itl", "e2e"):
        st = s[metric]
        rows.append(
            [metric.upper()]
            + [
                ("-" if st[k] is None else f"{1e3 * st[k]:.1f}")
                for k in ("mean", "p50", "p90", "p99")
            ]
        )
    if load.trace is not None:
        loop = f"trace {load.trace.source}, {load.total()} requests"
    else:
        loop = f"{args.clients} clients" if args.clients else f"{len(args.rate)} stage(s)"
    routed = f", {args.router} router" if args.replicas > 1 else ""
    where = f"{args.replicas} x {args.hardware} (TP{args.tensor_parallel}{routed})"
    if decode is not None:
        where = (
            f"{where} prefilling and {decode.replicas} x {args.hardware} "
            f"(TP{decode.tensor_parallel}) decoding, each KV cache moved between them"
        )
    print(
        f"{args.model} on {where}, {_launch(eng)}: {loop}, prompts {load.prompt:g}, "
        f"outputs {load.output:g}"
    )
    print(format_table(rows, ["ms", "mean", "p50", "p90", "p99"]))
    print(
        f"throughput {s['throughput']:.0f} output tokens/s; {s['preemptions']} preemptions; "
        f"prefix hits {100 * s['prefix_hit_rate']:.0f} %; KV peak {100 * s['kv_peak']:.0f} %"
    )
    if band is not None:
        b = band
        print(
            f"TTFT, how far to trust it: benchmark runs like this ({b['engine']}, "
            f"{'MoE' if b['kind'] == 'moe' else 'dense'}, "
            f"{'<= 16' if b['load'] == 'light' else '> 16'} clients; {b['runs']} runs"
            f"{', every engine' if b['pooled'] else ''}) measured {b['q10']:.2f}-{b['q90']:.2f}x"
            f"\n  the simulated mean (median {b['q50']:.2f}x): {1e3 * b['low']:.0f}-"
            f"{1e3 * b['high']:.0f} ms here (80 % of such runs; docs/engines.md, under load)"
        )
    if s["unserved"]:
        print(
            f"unserved: {s['unserved']} requests need more KV tokens (prompt and output) than a "
            "replica's cache holds; an engine refuses them (left out of the latencies above)"
        )
    if s["queue_grew"]:
        which = ", ".join(map(str, s["queue_grew"]))
        print(
            f"past capacity: the queue grew through stage {which} (its last quarter of arrivals "
            "waited over 1.5x as long as its second): the deployment serves less than that rate, "
            "and these latencies grow with the stage's length"
        )
    return 0


def add_parsers(sub) -> None:
    p = sub.add_parser(
        "simulate",
        help="one deployment under a load, with its engine's scheduler",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--hardware", required=True, help="hardware preset")
    p.add_argument("--model", required=True, help="model preset")
    p.add_argument("--engine", help="vllm, sglang, trtllm (-VERSION); none: pure physics")
    p.add_argument("--tensor-parallel", type=int, default=1)
    p.add_argument("--expert-parallel", type=int, default=None)
    p.add_argument("--attention-data-parallel", type=int, default=1)
    p.add_argument("--pipeline-parallel", type=int, default=1)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument(
        "--decode-replicas",
        type=int,
        default=None,
        help="disaggregated: this many decode replicas beside the --replicas that prefill "
        "(each prompt's KV cache moved over the prefill replica's scale-out links)",
    )
    p.add_argument(
        "--decode-tensor-parallel",
        type=int,
        default=None,
        help="disaggregated: the decode replicas' tensor parallelism (default --tensor-parallel)",
    )
    p.add_argument(
        "--router",
        default="least-requests",
        help="how a request picks its replica: least-requests (fewest in flight), "
        "least-prefill (fewest prompts still to prefill: what a plan assumes), least-tokens "
        "(fewest prompt tokens still to prefill), round-robin",
    )
    p.add_argument("--weights", default=None, help="weight format (default: the model's own)")
    p.add_argument("--kv-cache", default="bf16", help="KV-cache format")
    p.add_argument("--profile", metavar="FILE", help="the engine's profile from this file")
    launch = p.add_argument_group("the engine's launch (default: its own defaults)")
    launch.add_argument("--max-num-seqs", type=whole, help="most running sequences")
    launch.add_argument(
        "--max-num-batched-tokens", type=whole, help="token budget of a step (prefill chunk)"
    )
    launch.add_argument(
        "--gpu-memory-utilization", type=positive, help="share of HBM the engine uses, (0, 1]"
    )
    launch.add_argument("--block-size", type=whole, help="tokens per KV-cache block (page)")
    launch.add_argument(
        "--no-prefix-caching", action="store_true", help="no reuse of cached prefixes"
    )
    order = launch.add_mutually_exclusive_group()
    order.add_argument(
        "--mixed-chunk",
        dest="prefill_first",
        action="store_false",
        default=None,
        help="prompt chunks beside the decodes (SGLang --enable-mixed-chunk; vLLM, TensorRT-LLM)",
    )
    order.add_argument(
        "--prefill-first",
        dest="prefill_first",
        action="store_true",
        default=None,
        help="a step of prompt tokens alone, the decodes waiting (SGLang's default)",
    )
    launch.add_argument(
        "--frontend-time", type=float, default=None, help="s a client's TTFT adds (API, tokenizer)"
    )
    launch.add_argument(
        "--scheduler-recv-interval",
        dest="recv_interval",
        type=whole,
        help="SGLang: take in new requests every N decode steps (default 1: every step)",
    )
    launch.add_argument(
        "--batch-wait-iters",
        type=int,
        help="TensorRT-LLM batch_wait_timeout_iters: steps new prompts wait while others decode",
    )
    launch.add_argument(
        "--batch-wait-tokens",
        type=float,
        help="TensorRT-LLM batch_wait_max_tokens_ratio: share of the budget that ends the wait",
    )
    launch.add_argument(
        "--prompt-graphs",
        action="store_true",
        help="steps with prompt tokens replayed as CUDA graphs too (piecewise graphs up to the "
        "token budget): the profile's cost of such a step is not charged",
    )
    overlap = launch.add_mutually_exclusive_group()
    overlap.add_argument(
        "--async-scheduling",
        dest="async_scheduling",
        action="store_true",
        default=None,
        help="form a step's batch while the step before it runs (every engine's default: "
        "vLLM from 0.14, SGLang's and TensorRT-LLM's overlap scheduler)",
    )
    overlap.add_argument(
        "--no-async-scheduling",
        dest="async_scheduling",
        action="store_false",
        default=None,
        help="form each step's batch at its boundary (SGLang --disable-overlap-schedule, "
        "TensorRT-LLM disable_overlap_scheduler: true, vLLM before 0.14)",
    )
    p.add_argument("--prompt", type=positive, help="prompt tokens (mean)")
    p.add_argument("--output", type=positive, help="output tokens (mean)")
    p.add_argument("--trace", help="replay a trace file (CSV or JSON Lines)")
    p.add_argument("--clients", type=int, default=None, help="closed loop: concurrent clients")
    p.add_argument("--requests", type=int, default=None, help="closed loop: requests in all")
    p.add_argument("--rate", type=positive, action="append", help="open loop: requests/s")
    p.add_argument("--seconds", type=positive, action="append", help="open loop: stage length")
    p.add_argument("--arrival", choices=("poisson", "constant"), default="poisson")
    p.add_argument("--burstiness", type=positive, default=None, help="gap CV (bursty arrivals)")
    p.add_argument("--prompt-cv", type=float, default=0.0, help="prompt length sd/mean")
    p.add_argument("--output-cv", type=float, default=0.0, help="output length sd/mean")
    p.add_argument(
        "--distribution",
        choices=("gamma", "lognormal"),
        default="gamma",
        help="lengths around their means (lognormal: as dcost plan's traffic)",
    )
    p.add_argument("--shared-prefix", type=float, default=0.0, help="shared prompt tokens")
    p.add_argument(
        "--prefix-share", type=float, default=0.0, help="share of every prompt already cached"
    )
    p.add_argument("--turns", type=int, default=1, help="turns per conversation (sessions)")
    p.add_argument("--think-time", type=float, default=0.0, help="s between an answer and a turn")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="machine-readable output (SI units)")
    p.add_argument("--plot", help="save latency against time (stages shaded) to this PNG/SVG")
    p.set_defaults(func=_cmd_simulate)
