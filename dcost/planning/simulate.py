"""Discrete-event simulation of continuous batching: the check on ``dcost.planning.latency``.

Requests arrive as a Poisson process with lengths drawn from the ``Traffic``. A pool's replicas
share one FCFS queue. A replica runs one step after another while it has work; at the start of a
step it admits queued requests while it has a free slot (fewer than ``batch_cap`` running) and,
in a pool that prefills, while its admitted prompts fill less than one chunk budget. It then
gives the step up to ``chunk`` prompt tokens, FCFS over its admitted prompts, and one decode
token to each decoding sequence; the step lasts ``step(B, c)`` (the pool's step-time function at
the decode batch ``B`` and prompt tokens ``c``).

- **Aggregated** (one pool): a request whose prompt completes in a step has its first token at
  the step's end (TTFT) and decodes its other ``T_out - 1`` tokens in the following steps.
- **Disaggregated**: the prefill pool's steps carry chunks only; a finished prompt's KV cache
  takes ``transfer(T_in)`` seconds to reach the decode pool (no contention between transfers),
  which is when its first token counts (TTFT); the decode pool's steps carry no chunk.

A request's TPOT is ``(finish - first token) / (T_out - 1)``. The event loop is plain Python over
heaps (a step costs a few microseconds); each step makes progress on at least one token, so the
number of events is bounded by the tokens of the run, and ``max_events`` can cut it shorter
(``Simulation.truncated``). Step times come from a table of the step function over
``B = 0..batch_cap`` and ``c = 0..chunk`` (linearly interpolated in ``c`` past 4 million entries).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
from collections import deque
from collections.abc import Callable

import numpy as np

from dcost.planning.pools import Pool
from dcost.planning.traffic import Traffic
from dcost.specs import SpecError, check_count, check_share

__all__ = ["Simulation", "simulate_aggregated", "simulate_disaggregated"]

_TABLE_LIMIT = 4_000_000


@dataclasses.dataclass(frozen=True)
class Simulation:
    """Per-request outcome of a simulation (NumPy arrays over requests, seconds).

    Attributes:
      arrival: arrival times (s).
      prompt, output: lengths (tokens).
      ttft: time to first token (s); NaN if the run was cut before it.
      tpot: mean time per output token after the first (s); NaN for one-token outputs or
        unfinished requests.
      measured: requests counted in the percentiles (the ``warmup`` share at each end of the
        arrival order is left out).
      quantiles: the percentiles reported.
      ttft_percentiles, tpot_percentiles: over measured requests (s).
      events: events processed; truncated: True when ``max_events`` stopped the run.
    """

    arrival: np.ndarray
    prompt: np.ndarray
    output: np.ndarray
    ttft: np.ndarray
    tpot: np.ndarray
    measured: np.ndarray
    quantiles: tuple[float, ...]
    ttft_percentiles: np.ndarray
    tpot_percentiles: np.ndarray
    events: int
    truncated: bool


class _StepTable:
    def __init__(self, step: Callable, cap: int, chunk: int):
        b = np.arange(cap + 1, dtype=float)
        if (cap + 1) * (chunk + 1) <= _TABLE_LIMIT:
            self.cgrid = None
            c = np.arange(chunk + 1, dtype=float)
        else:
            self.cgrid = np.linspace(0.0, chunk, max(2, _TABLE_LIMIT // (cap + 1)))
            c = self.cgrid
        table = np.asarray(step(b[:, None] + 0.0 * c[None, :], c[None, :] + 0.0 * b[:, None]))
        table = np.broadcast_to(table, (b.size, c.size)).astype(float)
        if not np.all(np.isfinite(table)) or np.any(table <= 0):
            raise SpecError(
                "Pool.step must give finite, positive step times for every batch 0..batch_cap "
                "and chunk 0..chunk (except a step with nothing to do)"
            )
        self.table = table.tolist() if self.cgrid is None else table

    def __call__(self, batch: int, tokens: int) -> float:
        if self.cgrid is None:
            return self.table[batch][tokens]
        return float(np.interp(tokens, self.cgrid, self.table[batch]))


class _Replica:
    __slots__ = ("busy", "steps", "decoding", "prefilling", "backlog", "running", "allocs")

    def __init__(self):
        self.busy = False
        self.steps = 0
        self.decoding: list = []  # heap of (step count at which it finishes, request)
        self.prefilling: deque = deque()  # [request, prompt tokens left], FCFS
        self.backlog = 0  # prompt tokens left over ``prefilling``
        self.running = 0
        self.allocs: list = []


def _pool_ints(pool: Pool, name: str) -> tuple[int, int, int]:
    vals = []
    for field in ("replicas", "batch_cap", "chunk"):
        v = np.asarray(getattr(pool, field), dtype=float)
        if v.ndim != 0 or v != math.floor(v):
            raise SpecError(
                f"simulate: {name}.{field} = {v} is not allowed: the simulation needs one whole "
                "number"
            )
        vals.append(int(v))
    return vals[0], vals[1], vals[2]


def _run(traffic, pools, transfer, requests, seed, warmup, quantiles, max_events):
    requests = check_count("simulate", "requests", requests)
    if max_events is not None:
        max_events = check_count("simulate", "max_events", max_events)
    seed = check_count("simulate", "seed", seed, low=0)
    warmup = check_share("simulate", "warmup", warmup)
    rate = float(np.asarray(traffic.rate))
    hit = float(np.asarray(traffic.prefix_hit))
    rng = np.random.default_rng(seed)
    arrival = np.cumsum(rng.exponential(1.0 / rate, requests))
    prompt, output = traffic.sample(rng, requests)
    todo = np.maximum(1, np.rint((1.0 - hit) * prompt)).astype(int).tolist()
    k_left = (output.astype(int) - 1).tolist()
    delay = (
        np.zeros(requests)
        if transfer is None
        else np.broadcast_to(np.asarray(transfer(prompt), dtype=float), (requests,))
    ).tolist()

    disaggregated = len(pools) == 2
    specs: list[tuple] = []
    for i, (pool, name) in enumerate(pools):
        n, cap, chunk = _pool_ints(pool, name)
        prefills = i == 0
        decodes = not disaggregated or i == 1
        table = _StepTable(pool.step, cap, chunk if prefills else 0)
        specs.append(
            (n, cap, chunk, prefills, decodes, table, deque(), [_Replica() for _ in range(n)])
        )

    first = [math.nan] * requests
    finish = [math.nan] * requests
    events: list = [(t, 0, j, 0, -1) for j, t in enumerate(arrival.tolist())]  # (time, kind, ...)
    heapq.heapify(events)
    counter = requests  # tie-break: events at one time run in the order they were made
    limit = int(np.sum(output) + np.sum(todo) + 4 * requests + 16)
    limit = limit if max_events is None else min(limit, int(max_events))
    processed = 0

    def start(pool_i, r_i, now):
        nonlocal counter
        _, cap, chunk, prefills, decodes, table, queue, reps = specs[pool_i]
        rep = reps[r_i]
        while queue and rep.running < cap and (not prefills or rep.backlog < chunk):
            j = queue.popleft()
            rep.running += 1
            if prefills:
                rep.prefilling.append([j, todo[j]])
                rep.backlog += todo[j]
            else:
                heapq.heappush(rep.decoding, (rep.steps + k_left[j], j))
        budget, allocs = chunk if prefills else 0, []
        for entry in rep.prefilling:
            if budget <= 0:
                break
            take = min(entry[1], budget)
            allocs.append((entry, take))
            budget -= take
        batch = len(rep.decoding)
        tokens = (chunk - budget) if prefills else 0
        if batch == 0 and tokens == 0:
            rep.busy = False
            return
        rep.busy, rep.allocs = True, allocs
        counter += 1
        heapq.heappush(events, (now + table(batch, tokens), 1, counter, pool_i, r_i))

    truncated = False
    while events:
        if processed >= limit:
            truncated = True
            break
        processed += 1
        now, kind, j, pool_i, r_i = heapq.heappop(events)
        if kind == 0 or kind == 2:  # an arrival at pool 0 (kind 0) or pool 1 (kind 2)
            pool_i = 0 if kind == 0 else 1
            specs[pool_i][6].append(j)
            for r, rep in enumerate(specs[pool_i][7]):
                if not rep.busy:
                    start(pool_i, r, now)
                    break
            continue
        _, _, _, prefills, decodes, _, _, reps = specs[pool_i]
        rep = reps[r_i]
        rep.steps += 1
        while rep.decoding and rep.decoding[0][0] <= rep.steps:
            _, done = heapq.heappop(rep.decoding)
            finish[done] = now
            rep.running -= 1
        for entry, take in rep.allocs:
            entry[1] -= take
            rep.backlog -= take
            if entry[1] == 0:
                rep.prefilling.popleft()  # FCFS: a finished prompt is at the head
                done = entry[0]
                if disaggregated:
                    rep.running -= 1
                    first[done] = now + delay[done]
                    if k_left[done] > 0:
                        counter += 1
                        heapq.heappush(events, (first[done], 2, done, 1, -1))
                    else:
                        finish[done] = first[done]
                else:
                    first[done] = now
                    if k_left[done] > 0:
                        heapq.heappush(rep.decoding, (rep.steps + k_left[done], done))
                    else:
                        finish[done] = now
                        rep.running -= 1
        rep.allocs = []
        start(pool_i, r_i, now)

    first_a, finish_a = np.asarray(first), np.asarray(finish)
    ttft = first_a - arrival
    k = output - 1.0
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(k > 0, (finish_a - first_a) / np.where(k > 0, k, 1.0), np.nan)
    cut = int(warmup * requests)
    measured = np.zeros(requests, dtype=bool)
    measured[cut : requests - cut] = True
    q = np.asarray(quantiles, dtype=float)

    def pct(x):
        x = x[measured & np.isfinite(x)]
        return np.quantile(x, q) if x.size else np.full(q.shape, np.nan)

    return Simulation(
        arrival,
        prompt,
        output,
        ttft,
        tpot,
        measured,
        tuple(float(v) for v in q),
        pct(ttft),
        pct(tpot),
        processed,
        truncated,
    )


def simulate_aggregated(
    traffic: Traffic,
    pool: Pool,
    *,
    requests: int = 20_000,
    seed: int = 0,
    warmup: float = 0.1,
    quantiles=(0.5, 0.9, 0.99),
    max_events: int | None = None,
) -> Simulation:
    """Simulate one pool serving prefill and decode together (continuous batching with chunked
    prefill).

    Args:
      traffic: the requests (rate, lengths, prefix hits).
      pool: replicas (whole numbers), step-time function, batch cap and chunk budget.
      requests: requests to simulate.
      seed: NumPy seed of the arrivals and lengths.
      warmup: share of requests left out of the percentiles at each end of the run.
      quantiles: percentiles to report.
      max_events: stop after this many events (default: the run's own bound).

    Returns:
      ``Simulation``.

    >>> import dcost
    >>> from dcost.planning import Pool, roofline_step, simulate_aggregated
    >>> pool = Pool(roofline_step(0.02, 1e-4, 2e-5), replicas=2, batch_cap=256, chunk=1024)
    >>> sim = simulate_aggregated(dcost.Traffic(4.0, 1000, 200, prompt_cv=1.0), pool,
    ...                           requests=2000)
    >>> sim.truncated, [round(float(x), 2) for x in sim.tpot_percentiles]
    (False, [0.02, 0.02, 0.02])
    """
    return _run(traffic, [(pool, "pool")], None, requests, seed, warmup, quantiles, max_events)


def simulate_disaggregated(
    traffic: Traffic,
    prefill: Pool,
    decode: Pool,
    transfer: Callable[..., object],
    *,
    requests: int = 20_000,
    seed: int = 0,
    warmup: float = 0.1,
    quantiles=(0.5, 0.9, 0.99),
    max_events: int | None = None,
) -> Simulation:
    """Simulate a prefill pool, the KV transfer ``transfer(T_in)`` (s) and a decode pool.

    Arguments as ``simulate_aggregated``; ``decode.chunk`` is unused.
    """
    pools = [(prefill, "prefill"), (decode, "decode")]
    return _run(traffic, pools, transfer, requests, seed, warmup, quantiles, max_events)
