"""One deployment under a load: the engine's scheduler in a discrete-event simulation.

``Server`` is a fixed deployment (chip, model, engine, layout, replicas); ``Load`` what a
benchmark or a service sends (open-loop stages of a rate with Poisson, evenly spaced or bursty
arrivals, or a closed loop of clients at a fixed concurrency); ``simulate_server`` runs one
through the other with the engine's scheduler, step by step:

- a step carries one decode token of every running sequence that has its first token, and
  prompt tokens (chunked prefill) up to the engine's token budget
  (``Scheduler.max_num_batched_tokens``, decode tokens counted first, as vLLM's scheduler does);
- new requests join, first come first served, while fewer than ``max_num_seqs`` run and the KV
  cache has room for their chunk; the KV cache holds what HBM leaves after the weights
  (``dcost.validation.silicon.running_sequences``'s rule: ``gpu_memory_utilization``);
- a decode step that would overflow the KV cache preempts the newest running sequence (vLLM's
  recompute policy: its KV is dropped and its prompt and generated tokens are prefilled again);
- with prefix caching on, prompts hit the KV blocks a replica holds (least recently used out
  first, up to the KV cache's size): a shared prefix (``Load.shared_prefix``) after its first
  request, a trace's equal block hashes (Mooncake), a session's earlier turns (prompt and output)
  in its later turns; hits are whole KV blocks and leave at least one prompt token to compute;
  ``Load.prefix_share`` s of every prompt hits besides (its first s p tokens, whole blocks: the
  planner's ``Traffic.prefix_hit``, a share of each prompt already cached);
- with ``Scheduler.prefill_first`` (SGLang) a step with prompt tokens to compute runs them alone
  and the running decodes wait for the next;
- with ``Scheduler.batch_wait_iters`` W > 0 (TensorRT-LLM's batch waiting) new prompts wait
  while sequences decode, up to W steps, unless the step's decode tokens and the waiting prompts'
  tokens reach ``batch_wait_tokens`` of the budget;
- with ``Scheduler.recv_interval`` N > 1 (SGLang ``--scheduler-recv-interval``) a busy replica
  takes in the requests that reached it only before a step that follows N decode-only steps
  since it last did, or follows a step with prompt tokens; an idle one takes them at once;
- a step lasts ``t(B, x)`` of the serving model with the engine's profile (``dcost.mixed_step``'s
  step of ``B`` decode tokens and ``x`` prompt tokens), tabulated once per deployment.

With several replicas a router sends each request, as it arrives, to one replica
(``Server.router``): ``"least-requests"`` to the one with the fewest requests in flight (queued,
prefilling or decoding: a least-connections balancer), ``"least-prefill"`` to the one with the
fewest requests still to prefill (queued or partly prefilled; ties to the fewest in flight: the
planner's assumption), ``"least-tokens"`` to the one with the fewest prompt tokens still to
prefill (ties the same), ``"round-robin"`` to each in turn.

A request reaches the engine ``Scheduler.frontend_time`` after its client sends it (HTTP, API
server, tokenizer and the first token's way back, charged on the way in; each request's own
draw around that mean with ``Scheduler.frontend_cv``); requests that reach an idle replica at the
same instant start one step together. ``Sessions`` makes each request a conversation whose
later turns follow the earlier answers by a think time. TTFT is the client's
send to the end of the step that completes the prompt; TPOT ``(e2e - ttft)/(output - 1)``; ITL
the time between a request's consecutive tokens; e2e the client's send to the last token.

A benchmark client at a fixed concurrency (``vllm bench serve --max-concurrency``, AIPerf
``--concurrency``) sends its first ``clients`` requests at once and reports the mean over all
its requests, the first wave included: ``Load(clients=C, requests=N, stagger=False)`` simulated
with ``warmup=0`` is that protocol.

A request whose prompt and output need more KV tokens than a replica's cache holds is refused at
arrival, as an engine refuses it (``ServerRun.unserved``; a replayed trace with one is refused by
name instead). ``simulate_disaggregated`` runs a disaggregated deployment: a prefill pool and a
decode pool, each under its engine's scheduler, each prompt's KV cache moved between them.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
from collections import deque
from collections.abc import Sequence

import numpy as np

from dcost.planning.traces import Trace
from dcost.specs import SpecError, attention_splits, check_count, check_share

__all__ = [
    "Load",
    "Bursty",
    "Sessions",
    "Server",
    "ServerRun",
    "simulate_server",
    "simulate_disaggregated",
    "kv_transfer_seconds",
    "ROUTERS",
]

ARRIVALS = ("poisson", "constant")
DISTRIBUTIONS = ("gamma", "lognormal")


def _fail(owner, field, value, allowed):
    raise SpecError(f"{owner}.{field} = {value!r} is not allowed: {allowed}")


def _number(owner, field, value, low=0.0, low_open=False, high=math.inf):
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        _fail(owner, field, value, "it must be a number")
    v = float(value)
    if not math.isfinite(v) or (v <= low if low_open else v < low):
        _fail(
            owner, field, value, f"it must be a finite number {'>' if low_open else '>='} {low:g}"
        )
    if v > high:
        _fail(owner, field, value, f"it must be at most {high:,.0f}")
    return v


# requests of one simulated load: a discrete-event simulation in Python steps through each
# (a stage of 1e30 s looped forever drawing arrivals)
_MAX_REQUESTS = 10_000_000
# chips of one simulated deployment: above the largest clusters built by 2026 (a few hundred
# thousand GPUs); the simulation keeps every replica's state in memory
_MAX_GPUS = 1_000_000
# tokens of one prompt or answer: the longest context windows of 2026 models hold 10 million
# (Llama 4 Scout); above it a step's arithmetic leaves float32
_MAX_TOKENS = 10_000_000


def _count(owner, field, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < 1:
        _fail(owner, field, value, "it must be a whole number >= 1")
    return int(value)


@dataclasses.dataclass(frozen=True)
class Bursty:
    """Arrivals with a coefficient of variation ``cv`` of their gaps (gamma-distributed gaps:
    1 is Poisson, above 1 bursty, below 1 more even)."""

    cv: float

    def __post_init__(self):
        _number("Bursty", "cv", self.cv, low_open=True)


@dataclasses.dataclass(frozen=True)
class Sessions:
    """Multi-turn conversations: every request a load sends opens a session of ``turns`` turns.

    Turn k+1 is sent ``think_time`` seconds after turn k's last token; its prompt is turn k's
    prompt and output (the conversation so far, a prefix the replica may still hold) and
    ``Load.prompt`` new tokens; every turn answers ``Load.output`` tokens.

    Attributes:
      turns: turns per session (>= 1).
      think_time: seconds between an answer and the next turn (>= 0).

    >>> Sessions(turns=3, think_time=5.0).turns
    3
    """

    turns: int
    think_time: float = 0.0

    def __post_init__(self):
        _count("Sessions", "turns", self.turns)
        _number("Sessions", "think_time", self.think_time)


@dataclasses.dataclass(frozen=True)
class Load:
    """What a benchmark or a service sends.

    Attributes:
      prompt, output: mean prompt and output lengths (tokens).
      stages: open loop: ``((requests/s, seconds), ...)`` in turn.
      arrival: "poisson", "constant" (evenly spaced) or ``Bursty(cv)``.
      clients: closed loop: this many clients, each sending its next request when its last one
        ends (what ``vllm bench serve --max-concurrency`` and SGLang's ``bench_serving`` run).
      requests: closed loop: requests in all (default ``max(4 clients, 200)``).
      stagger: closed loop: clients start at independent, uniformly spread times over one
        request's duration, as in a benchmark's steady state (True), or all at once (False:
        with identical lengths their requests then stay in lockstep, waves of prefills that a
        measured run's jitter breaks up).
      shared_prefix: tokens of every prompt that are the same (a system prompt).
      prefix_share: share of every prompt that is already in the cache when it arrives (an
        earlier turn, a document asked about again): its first ``prefix_share * prompt``
        tokens hit, in whole blocks (with prefix caching on), as ``Traffic.prefix_hit`` says.
      prompt_cv, output_cv: coefficients of variation of the lengths (0: fixed).
      distribution: how the lengths are drawn around their means: "gamma" or "lognormal" (the
        planner's ``Traffic``: ``ln X ~ N(mu, sigma^2)``, ``sigma^2 = ln(1 + cv^2)``; its tail is
        lighter than the gamma's at a large cv, its median higher).
      trace: a replayed trace (``Load.from_trace``): its arrivals and lengths replace the
        stages and the means.
      sessions: ``Sessions(turns, think_time)``: each request the stages or the clients send
        opens a conversation whose later turns carry the earlier ones as their prompt's prefix;
        ``requests`` and the stages' counts are sessions then.

    >>> Load(prompt=1000, output=200, clients=32).closed
    True
    """

    prompt: float
    output: float
    stages: tuple = ()
    arrival: str | Bursty = "poisson"
    clients: int | None = None
    requests: int | None = None
    stagger: bool = True
    shared_prefix: float = 0.0
    prefix_share: float = 0.0
    prompt_cv: float = 0.0
    output_cv: float = 0.0
    distribution: str = "gamma"
    trace: Trace | None = None
    sessions: Sessions | None = None

    @classmethod
    def from_trace(cls, path, *, shared_prefix: float = 0.0) -> Load:
        """A trace file replayed: its arrival times and lengths (``dcost.planning.traces``: dcost's
        CSV or JSON Lines, the Azure LLM inference traces, BurstGPT, Mooncake).

        >>> import pathlib, tempfile
        >>> f = pathlib.Path(tempfile.mkdtemp()) / "t.csv"
        >>> _ = f.write_text("arrival,prompt,output\\n0,100,10\\n0.5,300,30\\n")
        >>> Load.from_trace(f).prompt
        200.0
        """
        from dcost.planning import traces

        t = traces.read(path)
        return cls(
            prompt=float(np.mean(t.prompt)),
            output=float(np.mean(t.output)),
            shared_prefix=shared_prefix,
            trace=t,
        )

    def __post_init__(self):
        _number("Load", "prompt", self.prompt, 1.0, high=_MAX_TOKENS)
        _number("Load", "output", self.output, 1.0, high=_MAX_TOKENS)
        _number("Load", "shared_prefix", self.shared_prefix)
        if _number("Load", "prefix_share", self.prefix_share) >= 1.0:
            _fail("Load", "prefix_share", self.prefix_share, "a share in [0, 1)")
        if self.shared_prefix >= self.prompt:
            _fail("Load", "shared_prefix", self.shared_prefix, "it must be below the prompt")
        if not isinstance(self.stagger, bool):
            _fail("Load", "stagger", self.stagger, "True or False")
        _number("Load", "prompt_cv", self.prompt_cv)
        _number("Load", "output_cv", self.output_cv)
        if self.distribution not in DISTRIBUTIONS:
            _fail("Load", "distribution", self.distribution, f"one of {DISTRIBUTIONS}")
        if not (isinstance(self.arrival, Bursty) or self.arrival in ARRIVALS):
            _fail("Load", "arrival", self.arrival, f"one of {ARRIVALS} or dcost.Bursty(cv)")
        if self.sessions is not None and not isinstance(self.sessions, Sessions):
            _fail("Load", "sessions", self.sessions, "None or dcost.planning.server.Sessions")
        if self.trace is not None:
            if self.sessions is not None:
                _fail("Load", "sessions", self.sessions, "a trace's session ids set its sessions")
            if not isinstance(self.trace, Trace):
                _fail("Load", "trace", self.trace, "a dcost.planning.traces.Trace")
            for f in ("stages", "clients", "requests"):
                if getattr(self, f):
                    _fail("Load", f, getattr(self, f), "a replayed trace sets its own requests")
            if self.shared_prefix >= float(np.min(self.trace.prompt)):
                _fail("Load", "shared_prefix", self.shared_prefix, "it must be below every prompt")
        elif self.clients is None:
            if not self.stages:
                _fail("Load", "stages", self.stages, "give stages (open loop) or clients")
            if self.requests is not None:
                _fail("Load", "requests", self.requests, "an open loop's stages set its requests")
            for i, stage in enumerate(self.stages):
                if not isinstance(stage, Sequence) or len(stage) != 2:
                    _fail("Load", f"stages[{i}]", stage, "a (requests/s, seconds) pair")
                _number("Load", f"stages[{i}] rate", stage[0], low_open=True)
                _number("Load", f"stages[{i}] seconds", stage[1], low_open=True)
        else:
            _count("Load", "clients", self.clients)
            if self.stages:
                _fail("Load", "stages", self.stages, "a closed loop (clients) has no stages")
            if self.requests is not None:
                _count("Load", "requests", self.requests)
        if self.trace is None and self.total() > _MAX_REQUESTS:
            field = "stages" if self.stages else ("requests" if self.requests else "clients")
            _fail("Load", field, getattr(self, field),
                  f"the load would send {self.total():.3g} requests; at most "
                  f"{_MAX_REQUESTS:,} (the simulation steps through every one)")  # fmt: skip

    @property
    def closed(self) -> bool:
        """Whether clients keep a fixed concurrency (closed loop)."""
        return self.clients is not None

    def total(self) -> int:
        """Requests the load sends (the closed loop's, or the stages' expected count)."""
        if self.trace is not None:
            return len(self.trace)
        if self.closed:
            return self.requests or max(4 * int(self.clients or 1), 200)
        return int(round(sum(r * s for r, s in self.stages)))

    def lengths(self, rng, n: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` prompt and output lengths (tokens, whole, at least 1)."""

        def draw(mean, cv):
            if cv == 0:
                return np.full(n, max(1, round(mean)))
            if self.distribution == "lognormal":
                sigma2 = math.log1p(cv**2)
                x = rng.lognormal(math.log(mean) - sigma2 / 2.0, math.sqrt(sigma2), n)
            else:
                shape = 1.0 / cv**2
                x = rng.gamma(shape, mean / shape, n)
            return np.maximum(1, np.rint(x)).astype(int)

        return draw(self.prompt, self.prompt_cv), draw(self.output, self.output_cv)

    def arrivals(self, rng) -> np.ndarray:
        """An open loop's arrival times (s), stage after stage."""
        times, start = [], 0.0
        for rate, seconds in self.stages:
            t = start
            while True:
                if self.arrival == "constant":
                    gap = 1.0 / rate
                elif isinstance(self.arrival, Bursty):
                    shape = 1.0 / self.arrival.cv**2
                    gap = rng.gamma(shape, 1.0 / (rate * shape))
                else:
                    gap = rng.exponential(1.0 / rate)
                t += gap
                if t > start + seconds:
                    break
                times.append(t)
            start += seconds
        return np.asarray(times)


@dataclasses.dataclass(frozen=True)
class Server:
    """One deployment: a chip, a model, an engine, its layout and its replicas.

    Attributes:
      hardware, model: preset names.
      engine: a ``dcost.Engine``, an engine name ("vllm"), or None (pure physics, default
        scheduler of vLLM).
      tensor_parallel, expert_parallel, attention_data_parallel, pipeline_parallel: degrees;
        ``expert_parallel=None`` is the engine's default for an MoE model (experts split by
        tensor parallelism: one expert-parallel group).
      replicas: independent copies, a router in front of them.
      weights, kv_cache: number formats (default: the model's serving precision, bf16 cache).
      router: how an arriving request picks its replica (one of ``ROUTERS``):
        ``"least-requests"`` (default) the fewest requests in flight, queued, prefilling or
        decoding (NGINX ``least_conn``, Envoy ``LEAST_REQUEST``); ``"least-prefill"`` the
        fewest requests still to prefill, queued or partly prefilled, ties to the fewest in
        flight (a queue-depth router: the Gateway API inference extension's and llm-d's queue
        scorer read the engine's waiting queue); ``"least-tokens"`` the fewest prompt tokens
        still to prefill, after the cache's hits once admitted, ties the same (Dynamo's KV
        router counts the prompt tokens a replica has to prefill); ``"round-robin"`` each
        replica in turn (Dynamo's and the vLLM
        production stack's default). With a decode batch of hundreds a least-requests router
        is nearly blind to the prompts a replica has queued: one long prompt then delays the
        arrivals sent behind it, which a least-prefill router sends elsewhere, unless every
        replica's count ties, and a least-tokens router sends elsewhere always. The planner's
        TTFT assumes one queue in front of the replicas, the wait behind a router that sends
        each request to the replica with the least prefill work left, which least-tokens comes
        closest to (behind least-prefill the p99 TTFT of planned disaggregated fleets ran up
        to 1.33x the plan's, the most with long prompts; ``dcost plan --check-launch``
        simulates least-tokens).
    """

    hardware: str
    model: str
    engine: object = None
    tensor_parallel: int = 1
    expert_parallel: int | None = None
    attention_data_parallel: int = 1
    pipeline_parallel: int = 1
    replicas: int = 1
    weights: str | None = None
    kv_cache: str = "bf16"
    router: str = "least-requests"

    def __post_init__(self):
        from dcost import presets

        for f in ("hardware", "model"):
            if not isinstance(getattr(self, f), str):
                raise SpecError(
                    f"Server.{f} = {getattr(self, f)!r:.60} is not allowed: it must be a preset "
                    f"name (dcost.{f}_names())"
                )
        presets.hardware_card(self.hardware)
        presets.model_card(self.model)
        for f, allowed in (
            ("weights", (None, *presets.PRECISIONS)),
            ("kv_cache", presets.PRECISIONS),
            ("router", ROUTERS),
        ):
            value = getattr(self, f)
            if isinstance(value, bool) or value not in allowed:
                raise SpecError(
                    f"Server.{f} = {value!r:.60} is not allowed: allowed: "
                    f"{', '.join(str(a) for a in allowed)}"
                )
        if self.engine is not None:  # a name that resolves, or an Engine
            from dcost import engines

            try:
                engines.resolve(self.engine, self.hardware)
            except engines.EngineError as err:
                raise SpecError(
                    f"Server.engine = {self.engine!r:.60} is not allowed: {err}"
                ) from None
        for f in ("tensor_parallel", "attention_data_parallel", "pipeline_parallel", "replicas"):
            _count("Server", f, getattr(self, f))
        if self.expert_parallel is not None:
            _count("Server", "expert_parallel", self.expert_parallel)
        # degrees the model can take: attention heads split over tensor parallelism (vLLM and
        # SGLang refuse more ranks than heads), layers over stages, experts over expert ranks
        arch = presets.model_card(self.model)["arch"]
        limits = [("tensor_parallel", "n_heads", "attention heads"),
                  ("pipeline_parallel", "n_layers", "layers")]  # fmt: skip
        if self.expert_parallel is not None and arch.get("n_experts"):
            limits.append(("expert_parallel", "n_experts", "routed experts"))
        elif self.expert_parallel not in (None, 1):
            _fail("Server", "expert_parallel", self.expert_parallel,
                  f"{self.model} is dense (no routed experts); None or 1")  # fmt: skip
        for f, key, what in limits:
            if getattr(self, f) > int(arch[key]):
                _fail("Server", f, getattr(self, f),
                      f"{self.model} has {int(arch[key])} {what}; at most that many")  # fmt: skip
        spec = presets.model(self.model)
        if not attention_splits(spec, self.tensor_parallel):  # what an engine launches
            _fail("Server", "tensor_parallel", self.tensor_parallel,
                  f"{self.model}'s {float(spec.attention_heads):g} query heads and "
                  f"{float(spec.kv_heads):g} KV heads do not split over it; a degree that "
                  "divides the query heads and divides or is a multiple of the KV heads "
                  "(vLLM, SGLang and TensorRT-LLM refuse others)")  # fmt: skip
        gpus = self.tensor_parallel * self.attention_data_parallel * self.pipeline_parallel
        if gpus * self.replicas > _MAX_GPUS:
            _fail("Server", "replicas" if gpus <= _MAX_GPUS else "attention_data_parallel",
                  self.replicas if gpus <= _MAX_GPUS else self.attention_data_parallel,
                  f"the deployment would hold {gpus * self.replicas:.3g} chips; at most "
                  f"{_MAX_GPUS:,} (the simulation keeps every replica's state)")  # fmt: skip

    def resolved_engine(self):
        from dcost import engines

        if self.engine is None:
            return None
        return engines.resolve(self.engine, self.hardware)

    def record(self, load: Load, concurrency: int) -> dict:
        """The deployment as a measurement record (``dcost.validation``'s mapping of layouts)."""
        from dcost import presets

        weights = self.weights or presets.serving_precision(self.model)
        gpus = self.tensor_parallel * self.attention_data_parallel * self.pipeline_parallel
        compute = weights if weights in presets.precisions(self.hardware) else "bf16"
        return {
            "id": "server",
            "source": "dcost.Server",
            "source_id": "server",
            "family": presets.card_family(self.hardware),
            "quote": "-",
            "hardware": self.hardware,
            "model": self.model,
            "weights": weights,
            "kv_cache": self.kv_cache,
            "compute": compute,
            "gpus": gpus,
            "tensor_parallel": self.tensor_parallel,
            "expert_parallel": self.expert_parallel or 1,
            "attention_data_parallel": self.attention_data_parallel,
            "pipeline_parallel": self.pipeline_parallel,
            "serving": "aggregated",
            "concurrency": max(concurrency, gpus // self.tensor_parallel // self.pipeline_parallel),
            "prompt_tokens": float(load.prompt),
            "output_tokens": float(load.output),
            "metric": "tpot",
            "value": 1.0,
        }


@dataclasses.dataclass(frozen=True)
class ServerRun:
    """Per-request outcome of ``simulate_server`` (NumPy arrays over requests, seconds)."""

    arrival: np.ndarray
    ttft: np.ndarray
    tpot: np.ndarray
    e2e: np.ndarray
    itl: np.ndarray  # every gap between consecutive tokens of every request
    output_tokens: float
    duration: float
    preemptions: int
    prefix_hit_rate: float
    kv_peak: float  # most KV tokens held at once over the KV capacity (one replica)
    measured: np.ndarray
    times: np.ndarray  # a time series: step end times (s) of replica 0
    running: np.ndarray  # and its running sequences after each step
    # an open loop's windows of arrival times, one per stage (a trace: one); a closed loop: none
    windows: tuple = ()
    # requests never served (NaN latencies): more KV tokens than a replica's cache holds
    unserved: int = 0

    def queue_grew(self) -> list[int]:
        """The stages (1-based; a trace is stage 1) whose queue grew while they lasted: the
        median TTFT of a stage's last quarter of arrivals over 1.5 times its second quarter's.
        A stable queue's quarters agree within a few percent over many requests; one growing
        at a steady pace from the stage's start gives 7/3 (TTFT in proportion to the time since
        the stage began, the quarters' medians at 3/8 and 7/8 of it). Stages of fewer than 40
        requests are not judged. A closed loop (clients) cannot outrun its server: none. The
        criterion is ``experiments/mlperf_server.py``'s.

        >>> run = ServerRun(*(np.zeros(0),) * 5, 0.0, 1.0, 0, 0.0, 0.0, np.zeros(0, bool),
        ...                 np.zeros(0), np.zeros(0), windows=((0.0, 10.0),))
        >>> run = dataclasses.replace(run, arrival=np.arange(100) / 10.0,
        ...                           ttft=0.05 + np.arange(100) / 10.0)  # TTFT grows with time
        >>> run.queue_grew()
        [1]
        """
        grew = []
        for i, (lo, hi) in enumerate(self.windows):
            inside = (self.arrival >= lo) & (self.arrival <= hi) & np.isfinite(self.ttft)
            ttft = self.ttft[inside][np.argsort(self.arrival[inside], kind="stable")]
            q = len(ttft) // 4
            if q < 10:
                continue
            second, last = np.median(ttft[q : 2 * q]), np.median(ttft[3 * q :])
            if last > 1.5 * second:
                grew.append(i + 1)
        return grew

    def plot(self, load: Load | None = None):
        """Latency against time: each request's TTFT and TPOT at its arrival, and the sequences
        replica 0 runs; an open loop's stages shaded (``load``'s). Times in seconds from the first
        arrival, latencies in milliseconds.

        Returns:
          a ``matplotlib.figure.Figure`` (no pyplot: the caller's backend is left alone).
        """
        from matplotlib.figure import Figure

        from dcost.plots import readable_log

        fig = Figure(figsize=(7.5, 6.0))
        axes = fig.subplots(3, 1, sharex=True)
        t0 = float(np.min(self.arrival))
        when = self.arrival - t0
        ok = np.isfinite(self.ttft)
        for ax, y, name in ((axes[0], self.ttft, "TTFT"), (axes[1], self.tpot, "TPOT")):
            good = ok & np.isfinite(y)
            ax.scatter(when[good], 1e3 * y[good], s=3, alpha=0.4, color="#1f77b4", label=name)
            if good.sum() > 20:  # a running median over 2 % of the requests
                order = np.argsort(when[good])
                k = max(5, good.sum() // 50)
                yy = 1e3 * y[good][order]
                med = np.array([np.median(yy[max(0, i - k) : i + k + 1]) for i in range(len(yy))])
                ax.plot(when[good][order], med, color="#d62728", lw=1.2, label="running median")
            ax.set_yscale("log")
            readable_log(ax.yaxis)
            ax.set_ylabel(f"{name} (ms)")
        axes[2].step(
            self.times - t0, self.running, where="post", color="#2ca02c", lw=0.8, label="replica 0"
        )
        axes[2].set_ylabel("running sequences")
        axes[2].set_xlabel("time since the first request (s)")
        if load is not None and load.stages and load.trace is None:
            start = 0.0
            top = max(rate for rate, _ in load.stages)
            for i, (rate, seconds) in enumerate(load.stages):
                grey = str(round(0.97 - 0.22 * rate / top, 3))  # the higher the rate, the darker
                for ax in axes:
                    ax.axvspan(
                        start,
                        start + seconds,
                        color=grey,
                        zorder=0,
                        label=f"stage {i + 1}: {rate:g} requests/s" if ax is axes[0] else None,
                    )
                start += seconds
        for ax in axes:
            ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0)
        fig.tight_layout()
        return fig

    def summary(self) -> dict:
        """``{"ttft' | "tpot" | "itl" | "e2e": {"mean", "p50", "p90", "p99"}, "throughput",
        "preemptions", "prefix_hit_rate", "kv_peak", "queue_grew", "unserved"}`` (seconds;
        output tokens/s; ``queue_grew``: the stages past what the deployment serves,
        ``queue_grew()``; ``unserved``: requests no replica's KV cache holds, left out of the
        latencies)."""

        def stats(x):
            x = x[np.isfinite(x)]
            if not x.size:
                return {k: None for k in ("mean", "p50", "p90", "p99")}
            return {
                "mean": float(np.mean(x)),
                "p50": float(np.quantile(x, 0.5)),
                "p90": float(np.quantile(x, 0.9)),
                "p99": float(np.quantile(x, 0.99)),
            }

        m = self.measured
        return {
            "ttft": stats(self.ttft[m]),
            "tpot": stats(self.tpot[m]),
            "itl": stats(self.itl),
            "e2e": stats(self.e2e[m]),
            "throughput": self.output_tokens / self.duration if self.duration > 0 else 0.0,
            "preemptions": self.preemptions,
            "prefix_hit_rate": self.prefix_hit_rate,
            "kv_peak": self.kv_peak,
            "queue_grew": self.queue_grew(),
            "unserved": self.unserved,
        }


_X_POINTS = 40


def decode_context(load: Load) -> float:
    """The mean KV context of a running sequence over time (tokens): ``E[T_in] +
    E[T_out^2] / (2 E[T_out])``. A sequence holds ``T_in + k`` tokens at its ``k``-th of
    ``T_out`` steps, and a long output runs for more steps: the running batch is weighted by
    output length (the planner's ``dcost.planning.designs.workload_stats``). With lengths of
    coefficient of variation ``cv`` it is ``E[T_in] + E[T_out] (1 + cv^2) / 2``; fixed lengths
    give ``T_in + T_out / 2``.

    >>> decode_context(Load(prompt=1000, output=400, clients=8))
    1200.0
    >>> decode_context(Load(prompt=1000, output=400, clients=8, output_cv=1.5))
    1650.0
    """
    if load.trace is not None:
        out = np.asarray(load.trace.output, float)
        return float(np.mean(load.trace.prompt) + np.mean(out * out) / (2.0 * np.mean(out)))
    return float(load.prompt + load.output * (1.0 + load.output_cv**2) / 2.0)


def _step_table(server: Server, load: Load, eng, cap: int, budget: int):
    """``t(B, x)`` for ``B = 0..cap`` decode tokens and ``x`` on a log grid to ``budget``
    prompt tokens, from one vmapped evaluation, the decoding sequences at the load's
    ``decode_context``; and the replica's KV capacity (tokens)."""
    import equinox as eqx
    import jax.numpy as jnp

    from dcost.validation.cases import case
    from dcost.validation.silicon import kv_room

    rec = server.record(load, cap)
    c = case(rec, engine=eng) if eng is not None else case(rec)
    b = np.arange(cap + 1, dtype=float)
    x = np.unique(np.r_[0.0, np.rint(np.geomspace(1.0, max(budget, 1), _X_POINTS))])
    bb, xx = np.meshgrid(b, x, indexing="ij")
    slots = float(c.design.batch) and round(float(rec["concurrency"]) / float(c.design.batch))

    dtype = jnp.result_type(float)
    work = eqx.tree_at(lambda w: w.context, c.workload, jnp.asarray(decode_context(load), dtype))
    t = _steps(
        jnp.asarray(np.maximum(bb.ravel() / max(slots, 1), 1e-3), dtype),
        jnp.asarray(xx.ravel() / max(slots, 1), dtype),
        c.design,
        c.hardware,
        c.model,
        work,
    )
    table = np.asarray(t, float).reshape(bb.shape)
    table[~np.isfinite(table)] = np.nan
    table[0, 0] = 0.0
    if np.isnan(table).any():
        raise SpecError("simulate: the serving model gave no step time for some batch/chunk")
    room, per_seq = kv_room(c, eng)
    # KV tokens one replica holds: sequences of the mean context that fit, times that context
    kv_tokens = room / per_seq * float(c.workload.context) if per_seq > 0 else math.inf
    if kv_tokens < float(load.prompt) + float(load.output):
        raise SpecError(_no_room(server, eng, c, room, kv_tokens, load.prompt + load.output))
    return x, table, kv_tokens


@functools.cache
def _steps_program():
    import equinox as eqx
    import jax

    from dcost.serving.mixed import _mixed_step

    def one(batch, chunk, design, hardware, model, work):
        d = eqx.tree_at(lambda d: d.batch, design, batch)
        return _mixed_step(d, hardware, model, work, 0.0, chunk_tokens=chunk).tpot

    return jax.jit(jax.vmap(one, in_axes=(0, 0, None, None, None, None)))


def _steps(batch, chunk, design, hardware, model, work):
    """The mixed step's time at each ``(batch[i], chunk[i])`` (decode sequences, prompt tokens)
    of one replica: one program per structure of the deployment, whatever its numbers (a
    simulation after the first, another chip or model of the same form, compiles nothing)."""
    return _steps_program()(batch, chunk, design, hardware, model, work)


def _no_room(server: Server, eng, c, room: float, kv_tokens: float, need: float) -> str:
    """Why a replica cannot hold one request: no HBM left for a KV cache after the weights, or
    a KV cache smaller than one request's context (``room``: KV bytes a chip under the engine's
    rule, ``dcost.validation.silicon.kv_room``; ``kv_tokens``: what a replica's cache holds)."""
    hbm = float(c.hardware.hbm_capacity)
    degrees = ("tensor_parallel", "expert_parallel", "attention_data_parallel", "pipeline_parallel")
    layout = ", ".join(
        f"{f} = {getattr(server, f)}" for f in degrees if getattr(server, f) not in (None, 1)
    )
    where = f"{server.model} on {server.hardware}" + (f" ({layout})" if layout else "")
    if eng is None:
        share, excess = f"all of its {hbm / 1e9:.1f} GB", -room
    elif eng.name == "trtllm":  # u (M - W): a share of what the weights leave
        u = eng.scheduler.gpu_memory_utilization
        share = f"{hbm / 1e9:.1f} GB, of which the KV cache gets {u:g} of what the weights leave"
        excess = -room / u
    else:  # u M - W
        u = eng.scheduler.gpu_memory_utilization
        share = f"gpu_memory_utilization = {u:g} of its {hbm / 1e9:.1f} GB"
        excess = -room
    if room <= 0.0:
        return (
            f"simulate: {where} leaves no room for a KV cache: the weights take {excess / 1e9:.1f}"
            f" GB a chip more than the engine may use ({share}); use more chips per replica "
            "(tensor_parallel, pipeline_parallel) or lighter weights"
        )
    return (
        f"simulate: {where} keeps {room / 1e9:.2f} GB a chip for its KV cache ({share}): "
        f"{kv_tokens:,.0f} tokens a replica, fewer than one request's {need:,.0f} (prompt and "
        "output); use more chips per replica or shorter requests"
    )


ROUTERS = ("least-requests", "least-prefill", "least-tokens", "round-robin")


class _Router:
    """``Server.router``'s choice of a replica for each arrival. ``prefilling[r]``: requests
    routed to replica ``r`` whose prompt is not yet all prefilled (the simulation keeps it: +1
    when routed or preempted, -1 when a step completes the prompt); ``tokens[r]``: their prompt
    tokens still to prefill (+ the prompt when routed, less the cache's hits when admitted, less
    each chunk as its step ends, + the recomputation when preempted)."""

    def __init__(self, kind: str, replicas: int):
        self.kind, self.replicas = kind, replicas
        self.prefilling = [0] * replicas
        self.tokens = [0] * replicas
        self.turn = 0

    def pick(self, running, waiting, inbox, tokens: int = 0) -> int:
        def in_flight(q):
            return len(running[q]) + len(waiting[q]) + len(inbox[q])

        reps = range(self.replicas)
        if self.kind == "round-robin":
            r = self.turn % self.replicas
            self.turn += 1
        elif self.kind in ("least-tokens", "least-prefill"):  # ties to the fewest in flight
            left = self.tokens if self.kind == "least-tokens" else self.prefilling
            r = min(reps, key=lambda q: (left[q], in_flight(q)))
        else:
            r = min(reps, key=in_flight)
        self.prefilling[r] += 1
        self.tokens[r] += tokens
        return r


def simulate_server(
    server: Server,
    load: Load,
    *,
    seed: int = 0,
    warmup: float = 0.1,
    max_steps: int = 2_000_000,
    _prefilled: bool = False,
    _unserved: bool = False,
) -> ServerRun:
    """Run ``load`` through ``server`` (see the module docstring).

    Args:
      server: the deployment.
      load: the requests.
      seed: NumPy seed of arrivals and lengths.
      warmup: share of requests (by arrival) left out of the statistics at each end.
      max_steps: a bound on the engine steps simulated (an error past it, never a hang).
      _prefilled: the decode pool of a disaggregated deployment (``simulate_disaggregated``):
        each request arrives with its prompt's KV cache and its first token, takes KV room for
        its prompt when it joins (no prompt step), and decodes; no frontend time, no prefix
        cache; a preempted one computes its prompt and tokens again on the replica.
      _unserved: a trace's requests that need more KV tokens than a replica holds are refused
        at arrival (their latencies NaN, counted), as drawn ones are, where the trace would be
        refused by name.

    Returns:
      ``ServerRun`` (``.summary()`` for the figures).
    """
    if not isinstance(server, Server):
        raise SpecError(f"simulate: server must be a dcost.Server, got {type(server).__name__}")
    if not isinstance(load, Load):
        raise SpecError(f"simulate: load must be a dcost.Load, got {type(load).__name__}")
    seed = check_count("simulate", "seed", seed, low=0)
    warmup = check_share("simulate", "warmup", warmup)
    from dcost import engines

    eng = server.resolved_engine()
    sched = eng.scheduler if eng is not None else engines.default_scheduler("vllm", server.hardware)
    cap, budget = sched.max_num_seqs, sched.max_num_batched_tokens
    rng = np.random.default_rng(seed)
    x_grid, table, kv_cap = _step_table(server, load, eng, cap, budget)
    front = float(sched.frontend_time) if eng is not None and not _prefilled else 0.0
    trace = load.trace
    if trace is not None:
        arrival = np.asarray(trace.arrival, float).copy()
        n = len(arrival)
        prompt, output = np.asarray(trace.prompt, int), np.asarray(trace.output, int)
        longest = int(np.argmax(prompt + output))
        if not _unserved and prompt[longest] + output[longest] > kv_cap:
            raise SpecError(
                f"simulate: request {longest} of the trace ({trace.source}) needs "
                f"{prompt[longest] + output[longest]} KV tokens; a replica holds {kv_cap:.0f}"
            )
    elif load.closed:
        n = load.total()
        arrival = np.full(n, np.inf)
        arrival[: min(int(load.clients or 1), n)] = 0.0
        if load.stagger:
            # one request's duration at the clients' concurrency: its prefill and its decode
            b = min(int(load.clients or 1), cap)
            chunks = math.ceil(load.prompt / budget)
            cycle = chunks * float(np.interp(min(load.prompt, budget), x_grid, table[b])) + (
                load.output * table[b, 0]
            )
            k = min(int(load.clients or 1), n)
            arrival[:k] = rng.uniform(0.0, cycle, k)
    else:
        arrival = load.arrivals(rng)
        n = len(arrival)
    if n == 0:
        raise SpecError("simulate: the load sends no request (raise its rate or its seconds)")
    turns = load.sessions.turns if load.sessions is not None else 1
    session_of: list = list(trace.session) if trace is not None and trace.session else [None] * n
    if trace is None:
        prompt, output = load.lengths(rng, n * turns)
        if turns > 1:  # turn k's prompt: the conversation so far and its own new tokens
            first_turns, arrival = arrival, np.full(n * turns, np.inf)
            arrival[::turns] = first_turns
            context = np.zeros(n, int)
            for k in range(turns):
                prompt[k::turns] += context
                context = prompt[k::turns] + output[k::turns]
            n *= turns
            session_of = [j // turns for j in range(n)]
            if int(np.max(context)) > kv_cap:
                raise SpecError(
                    f"simulate: a session's last turn needs {int(np.max(context))} KV tokens; a "
                    f"replica holds {kv_cap:.0f} (fewer Sessions.turns or shorter turns)"
                )

    def step_time(b, x):
        if x == 0:
            return table[b, 0]
        return float(np.interp(x, x_grid, table[b]))

    # prefix caching: the KV segments a request's prompt starts with, as (key, tokens) pairs; a
    # replica's cache holds segments (least recently used out first) up to its KV tokens
    caching = sched.prefix_caching and not _prefilled
    block = int(sched.block_size)
    share = float(load.prefix_share) if caching else 0.0
    segments: list[list] = [[] for _ in range(n)]
    turn_key: list = [None] * n  # the key a session's turn leaves in the cache when it ends
    if caching:
        prefix = int(round(load.shared_prefix))
        if prefix:
            for j in range(n):
                segments[j].append((("shared",), prefix))
        if trace is not None and trace.hash_ids is not None:
            for j in range(n):
                p = int(prompt[j])
                segments[j].extend(
                    (("hash", h), min(trace.hash_block, p - i * trace.hash_block))
                    for i, h in enumerate(trace.hash_ids[j])
                )
        if any(x is not None for x in session_of):
            seen: dict = {}
            for j in range(n):
                s = session_of[j]
                if s is None:
                    continue
                k = seen.get(s, 0)
                seen[s] = k + 1
                turn_key[j] = ("turn", s, k)
                if k:  # the session's context as the previous turn left it
                    segments[j] = [(("turn", s, k - 1), None)]
    cache: list = [dict() for _ in range(server.replicas)]  # insertion order is LRU order
    cache_tokens = [0.0] * server.replicas

    def remember(r, key, tokens):
        c = cache[r]
        if key in c:
            cache_tokens[r] -= c.pop(key)
        c[key] = tokens
        cache_tokens[r] += tokens
        while cache_tokens[r] > kv_cap and c:
            old = next(iter(c))
            cache_tokens[r] -= c.pop(old)

    reps = server.replicas
    route = _Router(server.router, reps)
    recv = int(sched.recv_interval)
    overlap = bool(sched.async_scheduling)
    inbox: list[deque] = [deque() for _ in range(reps)]  # reached a busy replica, not taken in
    reached = [math.nan] * n  # when each request reached its replica
    began = [0.0] * reps  # when the replica's last step began: its next batch was formed then
    since_recv = [0] * reps  # SGLang's counter: decode-only steps since the last intake
    decode_only = [False] * reps  # whether the replica's last step had no prompt tokens
    wait_iters = 0 if _prefilled else int(sched.batch_wait_iters)
    wait_tokens = float(sched.batch_wait_tokens) * budget
    waited = [0] * reps  # TensorRT-LLM's batch waiting: steps the prompts have waited
    waiting: list[deque] = [deque() for _ in range(reps)]
    running: list[list[int]] = [[] for _ in range(reps)]
    prompting = [0] * reps  # running sequences with prompt tokens still to compute
    busy = [False] * reps
    kv = [0.0] * reps
    kv_peak = 0.0
    # per-request state as Python lists: the loop touches single elements, which NumPy makes slow
    left = [0] * n  # prompt tokens still to prefill
    done_tokens = [0] * n  # tokens generated
    kv_of = [0.0] * n
    first = [math.nan] * n
    finish = [math.nan] * n
    last_token = [math.nan] * n
    prompt_l, output_l = prompt.tolist(), output.tolist()
    itl: list[float] = []
    hits = 0
    preemptions = 0
    events: list = []
    cv = float(sched.frontend_cv) if eng is not None else 0.0
    if front > 0 and cv > 0:  # each request's own frontend time, the scheduler's mean
        fronts = (rng.gamma(1.0 / cv**2, front * cv**2, n)).tolist()
    else:
        fronts = [front] * n
    for j in range(n):
        if math.isfinite(arrival[j]):
            heapq.heappush(events, (arrival[j] + fronts[j], 0, j, 0))
    next_client = min(int(load.clients or 0) * turns, n) if load.closed else n
    think = load.sessions.think_time if load.sessions is not None else 0.0
    steps = 0
    times, running_series = [], []
    counter = n

    def admit_tokens(j, r):
        """Prompt tokens left to compute after the cache's hits (whole blocks, >= 1)."""
        nonlocal hits
        need = int(prompt_l[j])
        hit = 0
        for key, tokens in segments[j]:
            if key not in cache[r]:
                break
            got = cache[r].pop(key)
            cache[r][key] = got  # most recently used
            hit += got if tokens is None else tokens
        hit = max(hit, int(share * need))  # the share already cached, as the traffic says
        hit = min(hit // block * block, need - 1)
        if hit > 0:
            hits += 1
        for key, tokens in segments[j]:
            if tokens is not None:
                remember(r, key, tokens)
        return need - hit

    def plan_prompts(r, room):
        """Prompt chunks in ``room`` tokens: running prompts first, then new requests (FCFS)."""
        run = running[r]
        plan = []
        for j in run if prompting[r] else ():
            if room <= 0:
                break
            if left[j] > 0:
                take = min(int(left[j]), room)
                if kv[r] + take > kv_cap:
                    break
                plan.append((j, take))
                room -= take
                kv[r] += take
        while waiting[r] and room > 0 and len(run) < cap:
            j = waiting[r][0]
            if _prefilled and left[j] == 0:  # joins with its KV cache (``join``), not here
                break
            if left[j] == 0:
                left[j] = admit_tokens(j, r)
                route.tokens[r] -= int(prompt_l[j]) - int(left[j])
            take = min(int(left[j]), room)
            if kv[r] + take > kv_cap:
                break
            waiting[r].popleft()
            run.append(j)
            prompting[r] += 1
            plan.append((j, take))
            room -= take
            kv[r] += take
        return plan

    def join(r):
        """A disaggregated decode pool: requests that arrived with their KV cache join the
        running batch, first come first served, while the cap and the KV cache have room."""
        run = running[r]
        while waiting[r] and len(run) < cap:
            j = waiting[r][0]
            if left[j] > 0 or kv[r] + prompt_l[j] + 1 > kv_cap:  # preempted: recomputes
                break
            waiting[r].popleft()
            run.append(j)
            kv[r] += prompt_l[j]
            kv_of[j] = float(prompt_l[j])
            route.prefilling[r] -= 1
            done_tokens[j] = 1  # the prefill pool's first token

    def held(r, room, decodes):
        """TensorRT-LLM's batch waiting: whether the prompts that would join this step wait
        (and count the wait), or go (and reset it)."""
        pending = sum(int(left[j]) for j in running[r] if left[j] > 0)
        for j in itertools.islice(waiting[r], max(cap - len(running[r]), 0)):
            pending += int(left[j]) if left[j] > 0 else int(prompt_l[j])
        if pending == 0:
            return False
        if waited[r] >= wait_iters or decodes + min(pending, room) >= wait_tokens:
            waited[r] = 0
            return False
        waited[r] += 1
        return True

    def launch(r, now, decoding, plan):
        nonlocal counter, kv_peak
        busy[r] = True
        began[r] = now
        kv_peak = max(kv_peak, kv[r])
        counter += 1
        x = sum(t for _, t in plan)
        decode_only[r] = x == 0
        heapq.heappush(events, (now + step_time(len(decoding), x), 1, counter, r, decoding, plan))

    def intake(r, cutoff):
        """The requests of the replica's inbox that reached it by ``cutoff`` join its queue."""
        box, later = inbox[r], deque[int]()
        while box:
            j = box.popleft()
            (waiting[r] if reached[j] <= cutoff else later).append(j)
        inbox[r] = later

    def start(r, now, idle=False):
        nonlocal preemptions
        run = running[r]
        # an overlapping scheduler formed this step's batch when the last step began; an idle
        # engine (or one with nothing running) takes what reached it at once
        cutoff = began[r] if overlap and run and not idle else now
        if recv > 1:  # SGLang's intake: after recv decode-only steps or a prompt step
            since_recv[r] += 1 if decode_only[r] else recv
            if since_recv[r] >= recv or not run:  # with nothing running, at once
                intake(r, cutoff)
                since_recv[r] = 0
        elif overlap and inbox[r]:
            intake(r, cutoff)
        if sched.prefill_first:
            plan = plan_prompts(r, budget)
            if plan:  # a prompt step alone: the running decodes wait
                launch(r, now, [], plan)
                return
        if _prefilled:
            join(r)
        decoding = [j for j in run if left[j] == 0] if prompting[r] else run[:]
        # a decode step that would overflow the cache preempts the newest sequences
        while decoding and kv[r] + len(decoding) > kv_cap:
            victim = run.pop()
            prompting[r] -= left[victim] > 0
            kv[r] -= kv_of[victim]
            kv_of[victim] = 0.0
            route.prefilling[r] += left[victim] == 0  # its prompt (again) still to prefill
            route.tokens[r] += int(prompt_l[victim]) + int(done_tokens[victim]) - int(left[victim])
            left[victim] = int(prompt_l[victim]) + int(done_tokens[victim])
            waiting[r].appendleft(victim)
            preemptions += 1
            decoding = [j for j in run if left[j] == 0] if prompting[r] else run[:]
        kv[r] += len(decoding)  # the decode tokens' KV first, then the prompts' chunks
        if wait_iters and decoding and held(r, budget - len(decoding), len(decoding)):
            plan = []
        else:
            plan = plan_prompts(r, budget - len(decoding))
        if not decoding and not plan:
            busy[r] = False
            return
        launch(r, now, decoding, plan)

    while events:
        ev = heapq.heappop(events)
        now, kind = ev[0], ev[1]
        if kind == 0:  # an arrival: to the replica with the least work
            j = ev[2]
            if prompt_l[j] + output_l[j] > kv_cap:  # no replica holds it: refused, never served
                if load.closed and next_client < n and turns == 1:  # the client sends its next
                    arrival[next_client] = now
                    heapq.heappush(events, (now + fronts[next_client], 0, next_client, 0))
                    next_client += 1
                continue
            if _prefilled:  # its first token came with it
                first[j] = last_token[j] = now
            r = route.pick(running, waiting, inbox, 0 if _prefilled else int(prompt_l[j]))
            if (recv > 1 or overlap) and busy[r]:
                inbox[r].append(j)
                reached[j] = now
                continue
            waiting[r].append(j)
            if not busy[r]:  # an idle replica starts once every arrival of this instant is in
                busy[r] = True
                heapq.heappush(events, (now, 2, r))
            continue
        if kind == 2:
            start(ev[2], now, idle=True)
            continue
        steps += 1
        if steps > max_steps:
            raise SpecError(
                f"simulate: more than max_steps = {max_steps} engine steps; shorten the load"
            )
        _, _, _, r, decoding, plan = ev
        for j in decoding:
            done_tokens[j] += 1
            kv_of[j] += 1.0
            itl.append(now - last_token[j])
            last_token[j] = now
        for j, take in plan:
            left[j] -= take
            route.tokens[r] -= take
            kv_of[j] += take
            if left[j] == 0:
                route.prefilling[r] -= 1
                prompting[r] -= 1
            if left[j] == 0 and done_tokens[j] == 0:
                done_tokens[j] = 1
                first[j] = now
                last_token[j] = now
        # only this step's sequences can have finished; in the running batch's order
        finished = [j for j in decoding if done_tokens[j] >= output_l[j]]
        done_now = [j for j, _ in plan if left[j] == 0 and done_tokens[j] >= output_l[j]]
        if done_now:
            ended = set(finished).union(done_now)
            finished = [j for j in running[r] if j in ended]
        for j in finished:
            running[r].remove(j)
            kv[r] -= kv_of[j]
            finish[j] = now
            if caching and turn_key[j] is not None:  # the session's context, for its next turn
                _, s, k = turn_key[j]
                if ("turn", s, k - 1) in cache[r]:  # held within the longer context now
                    cache_tokens[r] -= cache[r].pop(("turn", s, k - 1))
                remember(r, turn_key[j], int(prompt_l[j]) + int(output_l[j]))
            if turns > 1 and j % turns < turns - 1:  # the session's next turn
                arrival[j + 1] = now + think
                heapq.heappush(events, (now + think + fronts[j + 1], 0, j + 1, 0))
            elif load.closed and next_client < n:  # the client's next request (or session)
                arrival[next_client] = now
                heapq.heappush(events, (now + fronts[next_client], 0, next_client, 0))
                next_client += turns
        if r == 0:
            times.append(now)
            running_series.append(len(running[0]))
        start(r, now)
        for q in range(reps):
            if not busy[q] and (waiting[q] or running[q] or inbox[q]):
                start(q, now, idle=True)

    first_a, finish_a = np.asarray(first), np.asarray(finish)
    ttft = first_a - arrival
    e2e = finish_a - arrival
    later = output - 1.0
    with np.errstate(invalid="ignore", divide="ignore"):
        tpot = np.where(later > 0, (finish_a - first_a) / np.where(later > 0, later, 1.0), np.nan)
    order = np.argsort(arrival, kind="stable")
    cut = int(warmup * n)
    measured = np.zeros(n, bool)
    measured[order[cut : n - cut]] = True
    end = float(np.nanmax(finish_a)) if np.isfinite(finish_a).any() else 0.0
    return ServerRun(
        arrival=arrival,
        ttft=ttft,
        tpot=tpot,
        e2e=e2e,
        itl=np.asarray(itl),
        output_tokens=float(np.sum(output[np.isfinite(finish_a)])),
        duration=end - float(np.min(arrival)),
        preemptions=preemptions,
        prefix_hit_rate=hits / n if caching else 0.0,
        kv_peak=float(kv_peak / kv_cap) if math.isfinite(kv_cap) else 0.0,
        measured=measured,
        times=np.asarray(times),
        running=np.asarray(running_series),
        windows=_windows(load, arrival),
        unserved=int(np.sum(~np.isfinite(finish_a))),  # too long for the KV cache: never ends
    )


def kv_transfer_seconds(server: Server, load: Load, tokens) -> np.ndarray:
    """``dcost.kv_transfer_time`` of prompts of ``tokens`` from one replica of ``server``: the
    KV cache sharded over its chips, each sending its share over the scale-out links at once
    (the planner's ``transfer_time``), in the KV format of ``server`` (with its engine's
    hardware fields where it has an engine)."""
    import jax.numpy as jnp

    from dcost.serving.mixed import kv_transfer_time
    from dcost.validation.cases import case

    eng = server.resolved_engine()
    # a batch of a sequence per micro-batch and data-parallel rank: the record must be one the
    # serving model takes; the transfer does not depend on it
    rec = server.record(load, server.pipeline_parallel * server.attention_data_parallel)
    c = case(rec, engine=eng) if eng is not None else case(rec)
    chips = server.tensor_parallel * server.attention_data_parallel * server.pipeline_parallel
    t = kv_transfer_time(jnp.asarray(tokens, jnp.result_type(float)), c.hardware, c.model, chips)
    return np.asarray(t, float)


def simulate_disaggregated(
    prefill: Server,
    decode: Server,
    load: Load,
    *,
    transfer=None,
    seed: int = 0,
    warmup: float = 0.1,
    max_steps: int = 2_000_000,
) -> ServerRun:
    """Run ``load`` through a disaggregated deployment: prompts on ``prefill``'s replicas, each
    request's KV cache then moved to ``decode``'s replicas, which decode it.

    The prefill pool runs its engine's scheduler (``simulate_server``) on prompts alone: a
    request leaves it, with its first token, at the end of the step that completes its prompt
    (its KV freed: the transfer is not held against the pool's cache). It reaches the decode
    pool ``transfer(prompt tokens)`` seconds later (default ``kv_transfer_seconds`` of a prefill
    replica), where a router (``decode.router``) sends it to a replica that lets it join the
    running batch, first come first served, when the running-sequence cap and the KV cache have
    room for its prompt (no prompt step; a preempted sequence computes again there). The
    decode pool does not push back on the prefill pool (each prefill replica hands a finished
    prompt on at once), so the two pools are simulated one after the other, exactly.

    TTFT is the client's send to the first token's arrival at the decode pool (the prefill
    pool's TTFT, with its engine's frontend time, plus the transfer, as the planner counts it);
    TPOT ``(e2e - ttft)/(output - 1)``, which holds the wait to join the decode batch; ITL,
    preemptions (both pools), the KV peak and the time series are the decode pool's; the prefix
    hit rate the prefill pool's.

    Args:
      prefill, decode: the two pools (``Server``; their ``replicas`` the pools' sizes).
      load: an open loop (stages) or a trace; a closed loop or sessions, whose next request
        waits for the last one's end, are refused.
      transfer: ``f(prompt tokens) -> seconds`` (NumPy in, NumPy out), or None (the default).
      seed, warmup, max_steps: as ``simulate_server`` (``max_steps`` per pool).

    Returns:
      ``ServerRun``.
    """
    for name, srv in (("prefill", prefill), ("decode", decode)):
        if not isinstance(srv, Server):
            raise SpecError(
                f"simulate_disaggregated: {name} must be a dcost.Server, got {type(srv).__name__}"
            )
    if not isinstance(load, Load):
        raise SpecError(f"simulate: load must be a dcost.Load, got {type(load).__name__}")
    if load.closed or load.sessions is not None or (load.trace and load.trace.session):
        what = "clients" if load.closed else "sessions"
        raise SpecError(
            f"simulate_disaggregated: load.{what} is not allowed: a closed loop's or a session's "
            "next request waits for the last one's end, which the decode pool sets; an open "
            "loop (stages) or a trace without sessions"
        )
    seed = check_count("simulate", "seed", seed, low=0)
    rng = np.random.default_rng(seed)
    if load.trace is not None:
        arrival = np.asarray(load.trace.arrival, float)
        prompt = np.asarray(load.trace.prompt, int)
        output = np.asarray(load.trace.output, int)
    else:
        arrival = load.arrivals(rng)
        if len(arrival) == 0:
            raise SpecError("simulate: the load sends no request (raise its rate or its seconds)")
        prompt, output = load.lengths(rng, len(arrival))
    n = len(arrival)
    shared = min(float(load.shared_prefix), float(np.min(prompt)) - 1.0)
    hashes = load.trace.hash_ids if load.trace is not None else None
    first_leg = Load(
        prompt=float(np.mean(prompt)),
        output=1.0,
        shared_prefix=max(shared, 0.0),
        prefix_share=load.prefix_share,
        trace=Trace(arrival, prompt, np.ones(n, int), hash_ids=hashes, source="the load"),
    )
    # a request whose prompt a prefill replica's KV cache cannot hold, or whose whole context
    # a decode replica's cannot, is never served (NaN latencies, counted in ``unserved``); a
    # trace the user gave is refused by name instead, as ``simulate_server`` refuses it
    drop = load.trace is None
    run1 = simulate_server(
        prefill, first_leg, seed=seed, warmup=warmup, max_steps=max_steps, _unserved=drop
    )
    if transfer is None:
        moved = kv_transfer_seconds(prefill, first_leg, prompt)
    else:
        try:
            got = np.asarray(transfer(prompt))
            if got.dtype.kind not in "iuf":  # a bool, a complex number, text: not seconds
                raise TypeError(f"it gave {got.dtype} values")
            moved = np.broadcast_to(got.astype(float), (n,))
        except Exception as err:  # the user's function, or what it gave back
            raise SpecError(
                "simulate_disaggregated.transfer is not allowed: it must map the prompts' tokens "
                "(a NumPy array) to seconds, one for each prompt or one for all "
                f"({type(err).__name__}: {str(err)[:80]})"
            ) from None
        bad = ~np.isfinite(moved) | (moved < 0)
        if bad.any():
            raise SpecError(
                f"simulate_disaggregated.transfer = {float(moved[np.argmax(bad)])!r} s for a "
                f"prompt of {int(prompt[np.argmax(bad)])} tokens is not allowed: a finite time >= 0"
            )
    ready = np.where(np.isfinite(run1.ttft), arrival + run1.ttft + moved, np.inf)
    order = np.argsort(ready, kind="stable")
    second_leg = Load(
        prompt=float(np.mean(prompt)),
        output=float(np.mean(output)),
        trace=Trace(
            ready[order], prompt[order], output[order], source="the decode pool's arrivals"
        ),
    )
    run2 = simulate_server(
        decode,
        second_leg,
        seed=seed,
        warmup=warmup,
        max_steps=max_steps,
        _prefilled=True,
        _unserved=drop,
    )
    back = np.empty(n, int)
    back[order] = np.arange(n)  # request j is the decode leg's back[j]
    e2e = run2.e2e[back] + (ready - arrival)
    finished = np.isfinite(e2e)
    ttft = np.where(finished, ready - arrival, np.nan)
    return ServerRun(
        arrival=arrival,
        ttft=ttft,
        tpot=run2.tpot[back],
        e2e=e2e,
        itl=run2.itl,
        output_tokens=float(np.sum(output[finished])),
        duration=float(np.nanmax(arrival + e2e) - np.min(arrival)) if finished.any() else 0.0,
        preemptions=run1.preemptions + run2.preemptions,
        prefix_hit_rate=run1.prefix_hit_rate,
        kv_peak=run2.kv_peak,
        measured=run1.measured,
        times=run2.times,
        running=run2.running,
        windows=_windows(load, arrival),
        unserved=int(np.sum(~finished)),
    )


def _windows(load: Load, arrival: np.ndarray) -> tuple:
    """The arrival-time windows ``ServerRun.queue_grew`` judges: each stage of an open loop (as
    ``Load.arrivals`` lays them end to end from 0), a trace's whole span, none for clients."""
    if load.trace is not None:
        finite = arrival[np.isfinite(arrival)]
        return ((float(finite.min()), float(finite.max())),) if finite.size else ()
    if load.closed:
        return ()
    out, start = [], 0.0
    for _, seconds in load.stages:
        out.append((start, start + float(seconds)))
        start += float(seconds)
    return tuple(out)
