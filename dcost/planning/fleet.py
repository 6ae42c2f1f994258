"""A plan's fleet, simulated: ``dcost.simulate(plan, traffic)``.

The planner prices a fleet with closed forms (``dcost.planning.latency``) over step times
interpolated from the serving model (``dcost.planning.designs``). The simulation
(``dcost.planning.simulate``) runs the same fleet request by request, with step times from the
serving model itself (``dcost.mixed_step`` at every batch and chunk the simulation meets, not the
planner's table), so it checks both the latency closed forms and the interpolation.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from dcost.planning._jit import jit
from dcost.planning.designs import Layout, trip, workload_of
from dcost.planning.pools import Pool
from dcost.planning.simulate import Simulation, simulate_aggregated, simulate_disaggregated
from dcost.planning.traffic import Traffic
from dcost.serving.mixed import kv_transfer_time
from dcost.serving.speculative import _accepted_tokens
from dcost.specs import SpecError

__all__ = ["simulate", "exact_step"]

_CHUNK = 2**15


@functools.partial(jit, fast_compile=True)
def _trips(layout, hardware, model, workload, batch, tokens, admits):
    """The exact replica trip at each (batch, tokens) pair (s); ``admits`` 1.0 for a decode
    pool's trips, which pay for their admissions (traced: one program for every pool)."""

    def one(b, c):
        return trip(layout, hardware, model, workload, b, c, admits)

    return jax.lax.map(lambda bc: one(*bc), (batch, tokens), batch_size=1024)


def exact_step(hardware, model, layout: Layout, workload, kind: str = "aggregated"):
    """The token-step function ``t(B, c) = trip(B, c tau)/tau`` of a layout from the serving
    model itself, for NumPy arrays (the simulation's table); ``kind`` the pool's role
    (``dcost.planning.designs.step_table``'s: a ``"decode"`` pool pays for its admissions).

    >>> import dcost
    >>> from dcost.planning.designs import Layout, step_table
    >>> h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-70b")
    >>> w = dcost.Workload(1200, prompt=1000, output=200)
    >>> lay = Layout(8, 1, 1, 2048, 0)
    >>> t = exact_step(h, m, lay, w)(np.array([64.0]), np.array([512.0]))
    >>> bool(abs(t[0] / float(step_table(lay, h, m, w)(64.0, 512.0)) - 1) < 1e-3)
    True
    """
    tau = float(_accepted_tokens(workload.get("acceptance"), layout.draft_tokens))
    hardware = hardware.filled()  # one program for every profile, as the planner's

    def step(batch, tokens):
        b, c = np.broadcast_arrays(np.asarray(batch, float), np.asarray(tokens, float))
        flat_b, flat_c = b.ravel(), c.ravel() * tau
        out = np.empty(flat_b.size)
        for start in range(0, flat_b.size, _CHUNK):
            piece = slice(start, min(start + _CHUNK, flat_b.size))
            nb = np.zeros(_CHUNK)
            nc = np.zeros(_CHUNK)
            k = piece.stop - piece.start
            nb[:k], nc[:k] = flat_b[piece], flat_c[piece]
            dtype = jnp.result_type(float)
            trips = _trips(
                layout,
                hardware,
                model,
                workload,
                jnp.asarray(nb, dtype),
                jnp.asarray(nc, dtype),
                jnp.asarray(1.0 if kind == "decode" else 0.0, dtype),
            )
            out[piece] = np.asarray(trips)[:k]
        return (out / tau).reshape(b.shape)

    return step


def simulate(
    plan,
    traffic: Traffic | None = None,
    *,
    requests: int = 20_000,
    seed: int = 0,
    warmup: float = 0.1,
    max_events: int | None = None,
) -> Simulation:
    """Run a plan's fleet through the discrete-event simulation of continuous batching.

    The pools keep the plan's layouts, replica counts, batch caps and chunks (a speculative
    aggregated pool's chunk per token step, ``C/tau``, rounded to a whole token); step times
    come from the serving model (``exact_step``), the KV transfer of a disaggregated fleet from
    ``dcost.kv_transfer_time`` over the prefill replica's chips.

    ``dcost.simulate(server, load, seed=...)`` runs one deployment (a ``dcost.Server``) under a
    ``dcost.Load`` instead, with its engine's scheduler (``dcost.planning.server``), and returns
    a ``ServerRun``; ``dcost.simulate((prefill, decode), load)`` a disaggregated one, two
    ``Server`` pools with each prompt's KV cache moved between them
    (``dcost.planning.server.simulate_disaggregated``).

    Args:
      plan: a feasible ``dcost.Plan`` (or a ``dcost.Server``, or a ``(prefill, decode)`` pair of
        them).
      traffic: the requests (default: the plan's own); another rate or mix shows how the same
        fleet copes.
      requests, seed, warmup, max_events: as ``dcost.planning.simulate_aggregated``.

    Returns:
      A ``Simulation`` whose ``ttft_percentiles`` and ``tpot_percentiles`` are at
      ``plan.ttft`` 's and ``plan.tpot`` 's quantiles (p50, p90, p99 and the targets').

    >>> import dcost
    >>> h100 = dcost.hardware("h100-sxm", calibrated=True)
    >>> p = dcost.plan(h100, "llama-3-70b", dcost.traffic("chat", rate=100.0))
    >>> sim = dcost.simulate(p, requests=2000)
    >>> sim.truncated, len(sim.ttft_percentiles) == len(p.ttft)
    (False, True)
    """
    from dcost.planning import server as engine_server
    from dcost.planning.planner import Plan
    from dcost.planning.server import Load, Server, simulate_server

    if isinstance(plan, tuple) and len(plan) == 2 and all(isinstance(s, Server) for s in plan):
        # a disaggregated deployment: (prefill, decode) pools under their engine's scheduler
        if not isinstance(traffic, Load):
            raise SpecError(
                "simulate((prefill, decode), load): load must be a dcost.Load, got "
                f"{type(traffic).__name__}"
            )
        return engine_server.simulate_disaggregated(
            plan[0], plan[1], traffic, seed=seed, warmup=warmup
        )
    if isinstance(plan, Server):
        # one deployment under a load: the engine's scheduler (dcost.planning.server)
        if not isinstance(traffic, Load):
            raise SpecError(
                f"simulate(server, load): load must be a dcost.Load, got {type(traffic).__name__}"
            )
        return simulate_server(plan, traffic, seed=seed, warmup=warmup)
    if not isinstance(plan, Plan):
        raise SpecError(
            f"simulate.plan must be a dcost.Plan or a dcost.Server, got {type(plan).__name__}"
        )
    if not plan.feasible:
        raise SpecError(f"simulate: the plan is infeasible ({plan.message}); nothing to run")
    traffic = plan.traffic if traffic is None else traffic
    if not isinstance(traffic, Traffic):
        raise SpecError(f"simulate.traffic must be a dcost.Traffic, got {type(traffic).__name__}")
    if any(np.ndim(x) for x in jax.tree.leaves(traffic)):
        raise SpecError("simulate.traffic must be one scenario (scalar fields)")
    hardware, model = plan.hardware, plan.model
    pools = []
    for pool in plan.pools:
        layout = Layout(
            pool.chips_per_stage, pool.stages, pool.attention_dp, pool.chunk, pool.draft_tokens
        )
        work = workload_of(plan.traffic, pool.role, plan.acceptance, plan.expert_imbalance)
        step = exact_step(hardware, model, layout, work, pool.role)
        tau = float(_accepted_tokens(work.get("acceptance"), layout.draft_tokens))
        chunk = max(1, round(pool.chunk / tau)) if pool.role == "aggregated" else pool.chunk
        pools.append(
            (
                Pool(step, replicas=pool.replicas, batch_cap=pool.batch_cap, chunk=max(chunk, 1)),
                layout,
            )
        )
    quantiles = tuple(sorted(set(plan.ttft) | set(plan.tpot)))
    if plan.mode == "aggregated":
        sim = simulate_aggregated(
            traffic,
            pools[0][0],
            requests=requests,
            seed=seed,
            warmup=warmup,
            quantiles=quantiles,
            max_events=max_events,
        )
    else:
        prefill_layout = pools[0][1]

        def transfer(tokens):
            return np.asarray(
                kv_transfer_time(
                    np.asarray(tokens, float), hardware, model, prefill_layout.chips_per_replica
                )
            )

        sim = simulate_disaggregated(
            traffic,
            pools[0][0],
            pools[1][0],
            transfer,
            requests=requests,
            seed=seed,
            warmup=warmup,
            quantiles=quantiles,
            max_events=max_events,
        )
    return sim
