"""A plan as an engine launches it, and whether it holds under that engine's own scheduler.

The planner sizes replicas with closed forms (``latency``) checked against a simulation of its
own pools (``fleet.simulate``). An engine schedules differently: a running-sequence cap and a
token budget per step, decode tokens counted first (vLLM, TensorRT-LLM) or a step of prompt
tokens alone (SGLang without mixed chunks), its KV cache and preemption
(``dcost.planning.server``). ``scheduler_settings`` is what a plan's launch sets;
``check_launch`` runs the planned replicas through that engine's scheduler at the plan's traffic
and, where a target misses, adds replicas until the simulation holds them.

The planner queues prompts as one line in front of its replicas (``latency``'s M/G/c), whose
wait is that of a router sending each request to the replica with the least prefill work left.
A router that counts the prompt tokens each replica has still to prefill (``ROUTER =
"least-tokens"``; Dynamo's KV router counts them) comes closest to it. One that counts the
prompts (``"least-prefill"``, a queue-depth router) sends a prompt behind a long one when the
counts tie; one that counts every request in flight (``"least-requests"``, a least-connections
balancer) barely sees the prompts a replica has queued behind hundreds of decoding sequences,
and round-robin not at all. ``experiments/launches_hold.py`` and
``experiments/disaggregated_launches.py`` plan 30 fleets each and launch them behind the router
the plan names (``check_launch`` simulates it too) and again behind least-prefill: there, 2 of
the 18 disaggregated plans with several prefill replicas missed their TTFT target (simulated/
planned p99 TTFT up to 1.33x, above 1.1x on 11) and aggregated plans read up to 1.30x; behind
least-tokens no plan misses its TTFT target and none reads above 1.10x (the planning how-to
quotes the figures).
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = [
    "ENGINES",
    "ROUTER",
    "LaunchCheck",
    "check_launch",
    "launch_load",
    "pool_server",
    "scheduler_settings",
    "token_budget",
]

ENGINES = ("vllm", "sglang", "trtllm")
ROUTER = "least-tokens"
"""The router a plan's TTFT assumes in front of its replicas (``dcost.planning.server``'s
``Server.router``)."""


def token_budget(pool) -> int:
    """The engine's token budget a step of ``pool`` (a ``PoolPlan``) needs: its chunk of prompt
    tokens beside the decodes, ``C + cap (1 + k)``, for an aggregated pool (the engines count
    decode and verified draft tokens in the budget); the chunk for a prefill pool; 0 for a
    decode pool (no chunked prefill)."""
    c, cap, k = int(pool.chunk), int(pool.batch_cap), int(pool.draft_tokens)
    return c + cap * (1 + k) if pool.role == "aggregated" and c else c


PREFILL_OVERLAP = False
"""Whether a disaggregated plan's prefill pool is launched with the engine's overlapping
scheduler (``Scheduler.async_scheduling``). It is not: a prompt that reaches a prefill replica
during a step would wait for the whole next step, a prefill pool's steps are long, and the host
work the overlap hides is short beside them. AIConfigurator's generator launches TensorRT-LLM's
prefill workers so (``disable_overlap_scheduler = true`` for prefill, false for decode and
aggregated workers: ai-dynamo/aiconfigurator ``src/aiconfigurator/generator/rule_plugin/
trtllm.rule``); the launch says so for every engine (vLLM ``--no-async-scheduling``, SGLang
``--disable-overlap-schedule``, TensorRT-LLM ``disable_overlap_scheduler: true``)."""


def scheduler_settings(
    pool, engine: str, memory_reserve: float = 0.1, hardware: str = "h100-sxm"
) -> dict:
    """``dcost.engine`` settings of one replica of ``pool`` as its launch
    (``dcost.cli.plan.launch_settings``) sets them: the running-sequence cap, the token budget
    (``token_budget``; a decode pool's launch sets none, and its budget is the engine's default
    on ``hardware`` or the cap's decode tokens, whichever is more: the engines refuse a budget
    below the cap),
    the order of a step (SGLang's mixed chunks; off with speculative decoding), a prefill pool's
    scheduler without overlap (``PREFILL_OVERLAP``) and the share of HBM the plan left the engine
    (``1 - memory_reserve``, the plan's ``Plan.memory_reserve``).
    ``dcost.planning.server.Server`` with ``dcost.engine(engine, hardware=...,
    **scheduler_settings(pool, engine, plan.memory_reserve))`` simulates the planned replicas
    under the engine's scheduler (a disaggregated plan's two pools with
    ``simulate_disaggregated``)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; choose from {', '.join(ENGINES)}")
    prefill_first = engine == "sglang" and bool(pool.draft_tokens) and pool.role == "aggregated"
    settings = {
        "max_num_seqs": int(pool.batch_cap),
        "prefill_first": prefill_first,
        "gpu_memory_utilization": 1.0 - float(memory_reserve),
    }
    if pool.role == "prefill":
        settings["async_scheduling"] = PREFILL_OVERLAP
    if pool.role == "decode":
        from dcost.engines import default_scheduler

        default = int(default_scheduler(engine, hardware).max_num_batched_tokens)
        settings["max_num_batched_tokens"] = max(
            int(pool.batch_cap) * (1 + int(pool.draft_tokens)), default
        )
    else:
        settings["max_num_batched_tokens"] = max(token_budget(pool), 1)
    return settings


def pool_server(pool, hardware: str, model: str, engine, router: str = ROUTER):
    """``dcost.planning.server.Server`` of a planned ``pool`` (a ``PoolPlan``): its layout
    (tensor parallel ``G / A`` over ``A`` attention data-parallel ranks, ``P`` stages), its
    replicas, ``engine`` (as launched: ``scheduler_settings``) and ``router`` in front (a
    decode pool's: least-requests, its replicas' prompts all prefilled elsewhere)."""
    from dcost.planning.server import Server

    return Server(
        hardware,
        model,
        engine=engine,
        tensor_parallel=pool.chips_per_stage // pool.attention_dp,
        attention_data_parallel=pool.attention_dp,
        pipeline_parallel=pool.stages,
        replicas=int(pool.replicas),
        router=router if pool.role != "decode" else "least-requests",
    )


@dataclasses.dataclass(frozen=True)
class LaunchCheck:
    """A plan's launch under its engine's scheduler (``check_launch``).

    Attributes:
      engine: the engine's name.
      planned: the plan's replicas (a disaggregated plan: ``(prefill, decode)`` replicas).
      ttft, tpot: ``{replicas: simulated latency at the target's quantile}`` (s), one entry per
        replica count (or pair) tried, in the order tried.
      targets: ``(TTFT target, TPOT target)`` (s); quantiles: theirs.
      holds: whether the planned replicas meet both targets in the simulation.
      replicas: the fewest replicas tried that meet both (the planned ones when they hold), or
        None when none of those tried did; a disaggregated plan's pair: the fewest prefill
        replicas that meet the TTFT target, then the fewest decode replicas beside them that
        meet the TPOT target.
      requests: requests simulated per replica count; frontend_time: the client-side time each
        TTFT carries (the engine's, s); router: the router in front of the replicas
        (``Server.router``).
    """

    engine: str
    planned: int | tuple[int, int]
    ttft: dict
    tpot: dict
    targets: tuple[float, float]
    quantiles: tuple[float, float]
    holds: bool
    replicas: int | tuple[int, int] | None
    requests: int
    frontend_time: float
    router: str = ROUTER


def launch_load(plan, requests: int):
    """The plan's traffic as ``dcost.planning.server.Load``: Poisson arrivals at its rate for
    ``requests`` requests, its lognormal lengths (means and spreads), and its prefix hits as the
    share of every prompt already cached (``Load.prefix_share``, as the planner takes them)."""
    from dcost.planning.server import Load

    t = plan.traffic
    prompt = float(t.prompt_tokens)
    rate = float(t.rate)
    return Load(
        prompt=prompt,
        output=float(t.output_tokens),
        prompt_cv=float(t.prompt_cv),
        output_cv=float(t.output_cv),
        stages=((rate, requests / rate),),
        prefix_share=float(t.prefix_hit),
        distribution="lognormal",
    )


def check_launch(
    plan,
    hardware: str,
    model: str,
    engine: str,
    *,
    requests: int = 4000,
    seed: int = 0,
    profile=None,
    max_extra: float = 1.0,
    router: str = ROUTER,
) -> LaunchCheck:
    """Simulate a ``plan``'s replicas as ``engine`` launches them (``scheduler_settings``; a
    disaggregated plan's prefill and decode pools with ``simulate_disaggregated``, the decode
    pool behind a least-requests router) at the plan's traffic (Poisson arrivals at its rate,
    its length means and spreads, its prefix hits as the share of each prompt already cached),
    with the engine's frontend time, and compare the TTFT and TPOT at the targets' quantiles
    with the targets. Where one misses, add replicas (one, two, four, ... up to ``max_extra``
    times the planned count more) until both hold: the answer is the fewest tried that hold (a
    disaggregated plan: prefill replicas for the TTFT, then decode replicas for the TPOT).

    Args:
      plan: a feasible ``dcost.plan`` answer.
      hardware, model: the preset names the plan was made for.
      engine: "vllm", "sglang" or "trtllm".
      requests: requests per simulation (the first and last 10 % left out).
      seed: NumPy seed of the arrivals and lengths.
      profile: a profile file of the engine (``dcost calibrate``), or None for the shipped one.
      max_extra: most replicas to add, as a share of the planned count (at least one).
      router: the router in front of the replicas that prefill (``Server.router``; default
        ``ROUTER``, the one the plan assumes).

    Returns:
      ``LaunchCheck``.
    """
    from dcost import engines
    from dcost.planning.server import simulate_disaggregated, simulate_server
    from dcost.specs import SpecError, check_count

    requests = check_count("check_launch", "requests", requests, low=100)
    seed = check_count("check_launch", "seed", seed, low=0)
    if (
        isinstance(max_extra, bool)
        or not isinstance(max_extra, (int, float))
        or not (0.0 <= max_extra < float("inf"))
    ):
        raise SpecError(
            f"check_launch.max_extra = {max_extra!r} is not allowed: it must be a finite share "
            ">= 0 of the planned replicas"
        )
    if not plan.feasible:
        raise SpecError("check_launch: the plan is infeasible; nothing to launch")
    load = launch_load(plan, requests)
    (t_target, t_q), (p_target, p_q) = plan.ttft_slo, plan.tpot_slo
    ttft: dict = {}
    tpot: dict = {}
    pools = {pool.role: pool for pool in plan.pools}
    servers = {}
    for role, pool in pools.items():
        settings = scheduler_settings(pool, engine, plan.memory_reserve, hardware)
        eng = engines.engine(engine, hardware=hardware, profile=profile, **settings)
        servers[role] = pool_server(pool, hardware, model, eng, router)

    def simulated(key) -> tuple[bool, bool]:
        """Whether the replicas ``key`` (a count, or a (prefill, decode) pair) meet the TTFT
        and the TPOT target."""
        if key not in ttft:
            if isinstance(key, tuple):
                pre = dataclasses.replace(servers["prefill"], replicas=key[0])
                dec = dataclasses.replace(servers["decode"], replicas=key[1])
                run = simulate_disaggregated(pre, dec, load, seed=seed)
            else:
                srv = dataclasses.replace(servers["aggregated"], replicas=key)
                run = simulate_server(srv, load, seed=seed)
            t, p = run.ttft[run.measured], run.tpot[run.measured]
            ttft[key] = float(np.quantile(t[np.isfinite(t)], t_q))
            tpot[key] = float(np.quantile(p[np.isfinite(p)], p_q))
        return ttft[key] <= t_target, tpot[key] <= p_target

    found: int | tuple[int, int] | None
    n0: int | tuple[int, int]
    if plan.mode == "aggregated":
        n = int(pools["aggregated"].replicas)
        n0 = n
        holds = all(simulated(n))
        found = n if holds else _fewest(n, lambda n: all(simulated(n)), max_extra)
    else:  # the prompts' pool for TTFT (the decode pool does not move it), then the decode pool
        p0, d0 = int(pools["prefill"].replicas), int(pools["decode"].replicas)
        n0 = (p0, d0)
        holds = all(simulated(n0))
        found = n0 if holds else None
        if not holds:
            p1 = p0 if simulated(n0)[0] else _fewest(p0, lambda n: simulated((n, d0))[0], max_extra)
            if p1 is not None:
                d1 = (
                    d0
                    if simulated((p1, d0))[1]
                    else _fewest(d0, lambda n: simulated((p1, n))[1], max_extra)
                )
                if d1 is not None and all(simulated((p1, d1))):
                    found = (p1, d1)
    return LaunchCheck(
        engine=engine,
        planned=n0,
        ttft=ttft,
        tpot=tpot,
        targets=(float(t_target), float(p_target)),
        quantiles=(float(t_q), float(p_q)),
        holds=holds,
        replicas=found,
        requests=requests,
        frontend_time=float(eng.scheduler.frontend_time),  # the same for every pool
        router=router,
    )


def _fewest(n0: int, meets, max_extra: float) -> int | None:
    """The fewest replicas above ``n0`` (which misses) that ``meets``: one, two, four, ... more,
    up to ``max_extra`` times ``n0`` more (at least one), then the fewest between the last miss
    and the first hold; None when none of those tried does."""
    limit = n0 + max(1, int(max_extra * n0))
    step, lo = 1, n0
    found = None
    while found is None and lo < limit:
        n = min(lo + step, limit)
        if meets(n):
            found = n
        else:
            lo, step = n, 2 * step
    if found is not None:
        miss = lo
        while found - miss > 1:
            mid = (found + miss) // 2
            if meets(mid):
                found = mid
            else:
                miss = mid
    return found
