"""The planner's search: the fewest chips that serve a traffic within its latency targets.

A fleet is one pool (**aggregated**) or a prefill pool and a decode pool (**disaggregated**).
Each pool is ``n`` replicas of one ``Layout`` and costs ``n P G`` chips. For a layout, every
constraint eases as replicas are added (less load per replica: a smaller decode batch, a shorter
prefill queue, more batch slots), so the layout's cheapest fleet is its **least feasible replica
count** ``n_min``; the search finds it for the layouts that can win, by **branch and bound**:

1. *Bounds.* For every layout a lower bound ``n_lo <= n_min`` from necessary conditions of the
   closed forms (``dcost.planning.latency``): the prefill queue's utilisation must stay within
   its limit, ``n >= lambda E[S](B = 1) / rho_max``; TPOT at a percentile ``q >= 1/2`` is at
   least the step time (every component of its normal mixture has its mean there), so the
   decode batch ``B`` must keep ``t(B + 1, 0) <= tpot_slo``, and Little's law
   ``B = (lambda/n) E[K] t`` then bounds ``n``; the ``n * cap`` batch slots must outnumber the
   requests in flight. A layout whose weights do not fit, whose step at batch 1 already
   exceeds the TPOT target, or whose own prefill (and KV transfer) exceeds the TTFT target at
   its percentile even without queueing, is infeasible.
2. *Order.* Layouts are visited in order of their bound ``n_lo P G`` by ``group`` slots; a
   slot that finishes takes the next layout at once.
3. *Integer search.* For each layout, 4 replica counts are evaluated per round with the closed
   forms: first a ladder up from ``n_lo`` (1, 1.1, 1.25, 1.5 times, then wider), then, once a
   feasible count brackets ``n_min``, the secant root of the worst constraint
   ``h(n) = max_j h_j(n)`` in ``log n`` with its neighbours and the midpoint, until
   ``n_min - 1`` is infeasible and ``n_min`` feasible: exact whole numbers, no rounding. A
   verdict is by the tail: ``h_j = log(P(X > slo)/(1 - q))`` for TTFT and TPOT (``evaluate``'s
   ``by_tail``: ``X_q <= slo`` exactly when the share over ``slo`` is at most ``1 - q``, with
   no percentile solved), ``log(value/limit)`` for the others.
4. *Caps.* A tie goes to the first layout in the enumeration, as in the exhaustive grid. With
   a fleet of ``c*`` chips held, a layout can only win at ``n <= cap``: ``floor(c* / (P G))``
   for a layout before the held one in the enumeration, ``ceil(c* / (P G)) - 1`` (strictly
   fewer chips) for one after it. Its ladder ends at the cap, infeasible there it is out, and
   a *screen* round tries the next unopened layouts at their caps together (``4 group`` of
   them), so that a layout that cannot win costs one evaluation.
5. *Stop.* When the next layout's bound says it cannot win against the fleet held (more
   chips, or as many and after it in the enumeration), no unvisited layout can: the search
   ends.

``grid`` evaluates every layout at every count ``1..n_max``: the ground truth the search is
tested against. Everything is one jitted program. Many traffic scenarios share it: each round
advances the ``width`` scenarios still searching, gathered from the whole batch and scattered
back, so no scenario waits for a slower one. A disaggregated fleet separates: TTFT depends on
the prefill pool alone, TPOT on the decode pool alone, so each pool is searched apart and the
fleet is their sum.

References: Land and Doig, "An automatic method of solving discrete programming problems",
Econometrica 28(3), 1960 (branch and bound); the closed forms' own references are in
``dcost.planning.latency``.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost.planning import latency as lat
from dcost.planning.designs import Layout, StepTable, transfer_time
from dcost.planning.latency import _take
from dcost.planning.pools import Pool
from dcost.planning.traffic import Traffic
from dcost.specs import Hardware, Model

__all__ = [
    "KINDS",
    "CONSTRAINTS",
    "Targets",
    "Settings",
    "Tables",
    "evaluate",
    "bounds",
    "search",
    "grid",
    "N_MAX",
    "MAX_UTILISATION",
]

KINDS = ("aggregated", "prefill", "decode")
"""Pool kinds: one aggregated pool, or the two pools of a disaggregated fleet."""
CONSTRAINTS = ("ttft", "tpot", "memory", "utilisation")
"""Constraints of a pool: TTFT and TPOT at their percentiles; the batch slots its HBM holds
(``memory``: Erlang-C's chance that an arrival finds every slot of the ``n * cap`` taken, with
``cap`` the sequences whose KV cache fits, at most ``Targets.slot_wait``); and the busy share of
its prefill queue (``utilisation``, at most ``Targets.max_utilisation``: the closed forms are
held to the simulation up to there, and a queue run closer to 1 has no headroom)."""
MAX_UTILISATION = {"aggregated": 0.85, "prefill": 0.6}
"""Default most busy share of a prefill queue, per pool kind: where ``tests/test_plan.py`` finds
the closed forms within 10 % of the simulation. A prefill pool's replicas take a prompt while
their backlog is under one chunk, so its queue builds earlier than an M/G/c queue's (at 0.85,
TTFT p90 came out 20-45 % short of the simulation; at 0.6, within 10 %)."""
APPLIES = {
    "aggregated": (True, True, True, True),
    "prefill": (True, False, True, True),
    "decode": (False, True, True, False),
}
N_MAX = 2.0**23
"""Most replicas of a pool the search tries (whole numbers stay exact in float32 below 2**24)."""
_BIG = 30.0  # log-ratio standing for "unbounded" (an unstable queue) or "not applicable" (-)
_LADDER = np.array(
    [
        [1.0, 1.0, 1.1, 1.25],
        [1.5, 2.0, 3.0, 5.0],
        [8.0, 32.0, 128.0, 512.0],
        [2.0**11, 2.0**14, 2.0**17, 2.0**21],
    ]
)
"""Replica counts tried per round before any is feasible, as multiples of the last infeasible
count. The first round tries the bound ``n_lo`` less one (never feasible if the bound holds:
its log-ratios name what one replica fewer breaks), ``n_lo`` itself, and 1.1 and 1.25 times."""


class Targets(eqx.Module):
    """The latency targets and limits of a plan (a pytree; leaves may carry a scenario axis).

    Attributes:
      ttft_slo: time to first token limit (s) at percentile ``ttft_quantile``.
      tpot_slo: time per output token limit (s) at percentile ``tpot_quantile``.
      memory_reserve: share of HBM kept free (activations, fragmentation).
      slot_wait: most probability that an arrival finds every batch slot taken.
      max_utilisation: most busy share of an aggregated pool's prefill queue.
      max_prefill_utilisation: most busy share of a disaggregated prefill pool's queue.
      ttft_quantile, tpot_quantile: the percentiles (static).
    """

    ttft_slo: jax.Array
    tpot_slo: jax.Array
    memory_reserve: jax.Array
    slot_wait: jax.Array
    max_utilisation: jax.Array
    max_prefill_utilisation: jax.Array
    ttft_quantile: float = eqx.field(static=True)
    tpot_quantile: float = eqx.field(static=True)


class Settings(NamedTuple):
    """Knobs of the search (static).

    Attributes:
      group: layouts searched at once per scenario, each by ``4`` candidates a round; 0:
        ``dcost.plan`` picks 1 (the fewest evaluations; a batch of scenarios is advanced
        ``width`` scenarios at a time, so it needs no wider rounds).
      max_rounds: most rounds of the search per scenario; a scenario cut short reports
        ``exhausted``.
    """

    group: int = 0
    max_rounds: int = 128


DEFAULT = Settings()


class Tables(eqx.Module):
    """The step tables of one pool kind's ``L`` layouts for ``U`` workloads.

    Attributes:
      layouts: a ``Layout`` with array fields ``(L,)``.
      table: a stack of ``StepTable`` s, leading axis ``(U * L,)``: workload ``u``'s table of
        layout ``l`` is row ``u * L + l``.
    """

    layouts: Layout
    table: StepTable

    @property
    def size(self) -> int:
        """``L``, the number of layouts."""
        return int(self.layouts.chips.shape[0])

    def row(self, workload, layout):
        """Layout ``layout`` and its table for workload ``workload`` (indices may be traced;
        the table is a lazy view of the stack)."""
        lay = jax.tree.map(lambda x: _take(x, layout), self.layouts)
        return lay, self.table.select(workload * self.size + layout)


def _closure(table: StepTable):
    """The token-step function of a table, as a plain function for ``Pool.step`` (a closure
    holds no arrays as leaves, so a pool built inside jit stays a valid static field)."""

    def step(batch, tokens):
        return table(batch, tokens)

    return step


def capacity(table: StepTable, hardware: Hardware, targets: Targets, relaxed: bool = False):
    """Running sequences a replica's HBM holds: ``floor((M(1 - r) - m_0) / m_seq)`` (may be
    < 1: the weights do not fit); without the floor when ``relaxed`` (for derivatives)."""
    room = hardware.hbm_capacity * (1.0 - targets.memory_reserve) - table.memory(0.0)
    per = table.memory(1.0) - table.memory(0.0)
    cap = room / jnp.maximum(per, 1e-30)
    return cap if relaxed else jnp.floor(cap)


def _log_ratio(value, limit):
    r = jnp.log(jnp.maximum(value, 1e-30)) - jnp.log(limit)
    return jnp.where(jnp.isnan(r) | (r > _BIG), _BIG, jnp.maximum(r, -_BIG))


def evaluate(
    kind: str,
    layout: Layout,
    table: StepTable,
    n,
    traffic: Traffic,
    targets: Targets,
    hardware: Hardware,
    model: Model,
    quantiles=None,
    relaxed: bool = False,
    by_tail: bool = False,
):
    """A pool of ``n`` replicas of one layout: its constraints as log-ratios (``<= 0`` holds).

    ``relaxed`` counts batch slots without rounding down (``capacity``), for derivatives.
    ``by_tail`` judges TTFT and TPOT by the share of requests over the target,
    ``log(P(X > slo) / (1 - q))``, in place of ``log(X_q / slo)``: the same verdict (``X_q <=
    slo`` exactly when ``P(X > slo) <= 1 - q``) without solving a percentile, about half the
    time of an evaluation (what the search does; ``info`` then has no latencies, and
    ``quantiles`` must be None).

    Returns ``(log_ratios, info)``: ``log_ratios`` over ``CONSTRAINTS`` (``-_BIG`` where one
    does not apply to ``kind``, ``_BIG`` where a queue is unstable); ``info`` a dict: ``ttft``
    and ``tpot`` at the target's percentile followed by ``quantiles`` (NaN where not
    applicable), ``load`` on the batch slots (Erlangs), mean decode ``batch`` per replica and
    ``step_time`` (s; NaN for a prefill pool), and ``capacity`` (sequences HBM holds).
    """
    if by_tail and quantiles is not None:
        raise ValueError("evaluate: by_tail computes no percentiles; pass quantiles=None")
    cap = capacity(table, hardware, targets, relaxed)
    fits = cap >= 1.0
    cap = jnp.maximum(cap, 1.0)
    extra = () if quantiles is None else tuple(quantiles)
    q_ttft = () if by_tail else (targets.ttft_quantile, *extra)
    q_tpot = () if by_tail else (targets.tpot_quantile, *extra)
    slo = (targets.ttft_slo, targets.tpot_slo) if by_tail else (None, None)
    step = _closure(table)
    nan = jnp.full((len(q_ttft),), jnp.nan)
    none = jnp.full((), jnp.nan)
    ttft_over: Any = none
    tpot_over: Any = none
    input_share: Any = none  # an aggregated pool's (the planner's price split)
    if kind == "aggregated":
        pool = Pool(step, replicas=n, batch_cap=cap, chunk=layout.chunk / table.tokens_per_step)
        out = lat.aggregated_latency(traffic, pool, q_ttft, q_tpot, slo if by_tail else None)
        ttft, tpot, slot, load = out.ttft, out.tpot, out.slot_wait, out.slot_load
        batch, t_bar, rho = out.decode_batch, out.step_time, out.prefill_utilisation
        ttft_mean, ttft_over, tpot_over = out.ttft_mean, out.ttft_over, out.tpot_over
        input_share = out.input_share
    elif kind == "prefill":
        pool = Pool(step, replicas=n, batch_cap=cap, chunk=layout.chunk)
        d = transfer_time(hardware, model, layout)
        ttft, ttft_mean, rho, slot, load, ttft_over = lat.prefill_pool_latency(
            traffic, pool, d, q_ttft, slo[0]
        )
        tpot, batch, t_bar = nan, none, none
    else:
        pool = Pool(step, replicas=n, batch_cap=cap, chunk=1.0)
        tpot, _, batch, t_bar, slot, load, tpot_over = lat.decode_pool_latency(
            traffic, pool, q_tpot, slo[1]
        )
        ttft, ttft_mean, rho = nan, none, none
    applies = APPLIES[kind]
    if by_tail:
        over_ttft = jnp.where(
            jnp.isfinite(ttft_mean),
            _log_ratio(ttft_over, 1.0 - targets.ttft_quantile),
            _BIG,
        )
        over_tpot = _log_ratio(tpot_over, 1.0 - targets.tpot_quantile)
    else:
        over_ttft = _log_ratio(ttft[0], targets.ttft_slo)
        over_tpot = _log_ratio(tpot[0], targets.tpot_slo)
    ratios = [
        over_ttft if applies[0] else -_BIG,
        over_tpot if applies[1] else -_BIG,
        jnp.where(fits, _log_ratio(slot, targets.slot_wait), _BIG),
        _log_ratio(rho, _rho_max(kind, targets)) if applies[3] else -_BIG,
    ]
    dtype = jnp.result_type(float)
    info = dict(
        ttft=ttft,
        tpot=tpot,
        load=load,
        batch=batch,
        step_time=t_bar,
        input_share=input_share,
        capacity=cap,
        memory=table.memory(cap),
    )
    return jnp.stack([jnp.asarray(r, dtype) for r in ratios]), info


def _rho_max(kind, targets):
    return targets.max_prefill_utilisation if kind == "prefill" else targets.max_utilisation


def _feasible(ratios):
    return jnp.all(ratios <= 0.0, axis=-1)


class Bounds(NamedTuple):
    """What a layout needs before any queueing (per layout).

    Attributes:
      replicas: the lower bound ``n_lo`` on its least feasible replica count (a whole number).
      fits: its weights leave room for at least one sequence.
      ttft_floor: its TTFT survival at the target without waiting, ``P(S + d > ttft_slo)``.
      tpot_floor: its step at batch 1 (s).
      ok: none of the above rules it out.
      reason: which condition set ``replicas``, an index into ``CONSTRAINTS`` (``utilisation``:
        the prefill queue, ``tpot``: the decode batch, ``memory``: the batch slots), or -1
        when the bound is one replica.
    """

    replicas: jax.Array
    fits: jax.Array
    ttft_floor: jax.Array
    tpot_floor: jax.Array
    ok: jax.Array
    reason: jax.Array


def bounds(
    kind: str,
    layout: Layout,
    table: StepTable,
    traffic: Traffic,
    targets: Targets,
    hardware: Hardware,
    model: Model,
) -> Bounds:
    """The necessary conditions of the module docstring for one layout (vmap for many)."""
    step = _closure(table)
    w = jnp.asarray(lat._W, dtype=jnp.result_type(float))
    prompt = lat._lengths(traffic, "prompt")
    prompt_u = jnp.maximum(1.0, (1.0 - traffic.prefix_hit) * prompt)
    mean_k = lat._mean_k(traffic)
    rate = traffic.rate
    cap = jnp.maximum(capacity(table, hardware, targets), 1.0)
    fits = capacity(table, hardware, targets) >= 1.0
    prefills = kind != "decode"
    decodes = kind != "prefill"
    batch = 0.0 if kind == "prefill" else 1.0  # the batch a prefill sees at least
    chunk = layout.chunk / table.tokens_per_step if kind == "aggregated" else layout.chunk
    t1 = step(1.0, 0.0)
    n_bound = jnp.ones_like(rate)
    reason = jnp.asarray(-1)
    ttft_floor = jnp.zeros_like(rate)
    work = jnp.zeros_like(rate)

    def raise_to(bound, why, n, r):
        return jnp.where(bound > n, bound, n), jnp.where(bound > n, why, r)

    if prefills:
        _, alone, own, fluid = lat._prefill(step, batch, prompt_u, chunk)
        extra = transfer_time(hardware, model, layout)(prompt) if kind == "prefill" else 0.0
        served = jnp.sum(w * jnp.minimum(fluid, alone))  # the least mean prefill service
        n_bound, reason = raise_to(
            rate * served / _rho_max(kind, targets),
            CONSTRAINTS.index("utilisation"),
            n_bound,
            reason,
        )
        # P(own > slo) as evaluate's TTFT survival counts it (``_share_above``) and node by
        # node: that survival is at least the smaller of the two at any replica count
        own = own + extra
        over = lat._share_above(lat._cells(w, own), jnp.reshape(targets.ttft_slo, (1,)))[0]
        ttft_floor = jnp.minimum(jnp.sum(w * (own > targets.ttft_slo)), over)
        work = work + served
    if decodes:
        # the largest batch whose step meets the TPOT target, by bisection on t(B + 1, 0)
        def body(_, ab):
            a, b = ab
            mid = 0.5 * (a + b)
            ok = step(mid + 1.0, 0.0) <= targets.tpot_slo
            return jnp.where(ok, mid, a), jnp.where(ok, b, mid)

        top = jnp.asarray(4.0 * 65536.0, dtype=t1.dtype)
        b_max, _ = jax.lax.fori_loop(0, 40, body, (jnp.zeros_like(t1), top))
        per_replica = b_max / (mean_k * step(b_max + 1.0, 0.0))  # requests/s at that batch
        n_bound, reason = raise_to(
            rate / jnp.maximum(per_replica, 1e-30), CONSTRAINTS.index("tpot"), n_bound, reason
        )
        work = work + mean_k * t1
    n_bound, reason = raise_to(rate * work / cap, CONSTRAINTS.index("memory"), n_bound, reason)
    replicas = jnp.maximum(1.0, jnp.ceil(n_bound * (1.0 - 1e-3)))
    ok = fits & (ttft_floor <= 1.0 - targets.ttft_quantile)
    if decodes:
        ok = ok & (t1 <= targets.tpot_slo)
    return Bounds(replicas, fits, ttft_floor, t1, ok, reason)


class Found(NamedTuple):
    """The search's answer for one pool kind (per scenario).

    Attributes:
      row: the winning layout's index (into the kind's layouts); -1 when none is feasible.
      replicas: its least feasible replica count (NaN when none).
      chips: ``replicas * P * G`` (inf when none).
      evaluations: candidate evaluations made.
      exhausted: True when ``max_rounds`` stopped the search before it could prove the answer.
      ratios: the constraints' log-ratios at ``replicas`` (``(len(CONSTRAINTS),)``).
      ratios_below: at ``replicas - 1`` (NaN when the search never evaluated it: the bound was
        tight, and ``bounds.reason`` names the condition).
      info: ``evaluate`` 's info at ``replicas`` (latency at the target's and the report
        percentiles, mean batch, step time, capacity, memory).
      bounds: every layout's ``Bounds`` (what rules layouts out, for an infeasible answer).
    """

    row: jax.Array
    replicas: jax.Array
    chips: jax.Array
    evaluations: jax.Array
    exhausted: jax.Array
    ratios: jax.Array
    ratios_below: jax.Array
    info: dict
    bounds: Bounds


def _steps(kind: str, tables: Tables, hardware: Hardware, model: Model, settings: Settings):
    """The search of one scenario in three steps: ``start(workload, traffic, targets) ->
    (const, state)`` (every layout's bounds, their order and the first slots), ``advance(const,
    state, ...)`` (one round) and ``finish(const, state, ..., quantiles) -> Found``."""
    layouts = tables.layouts
    n_layouts = tables.size
    k, r = settings.group or 1, _LADDER.shape[1]
    dtype = jnp.result_type(float)
    chips = layouts.chips_per_replica
    n_c = len(CONSTRAINTS)
    slot = jnp.arange(k)
    ladder = jnp.asarray(_LADDER, dtype)
    inf = jnp.asarray(jnp.inf, dtype)

    def can_win(rows, chips_needed, best):
        """Whether a layout of fleets of at least ``chips_needed`` chips can still be the
        answer: fewer chips than the best fleet held, or as many and first in the enumeration
        (ties go to the first layout, as in the exhaustive grid)."""
        return (chips_needed < best["chips"]) | (
            (chips_needed == best["chips"]) & (rows < best["row"])
        )

    def open_at(const, state, pos, best):
        """Slots for the layouts at positions ``pos`` of the order; closed (done) past the
        end, or where the bound says the layout cannot win against the best fleet held. A
        layout the screen found feasible at its cap starts with that bracket."""
        at = jnp.minimum(pos, n_layouts - 1)
        row = _take(const["order"], at)
        lb = _take(const["lb_chips"], row)
        valid = (pos < n_layouts) & jnp.isfinite(lb) & can_win(row, lb, best)
        return dict(
            row=row,
            lo=_take(const["bounds"].replicas, row) - 1.0,
            hi=_take(state["hint"], at),
            hlo=jnp.full(pos.shape, _BIG, dtype),
            hhi=_take(state["hint_h"], at),
            rung=jnp.zeros(pos.shape, jnp.int32),
            done=~valid,
            seen=jnp.zeros(pos.shape, bool),
        )

    def start(workload, traffic, targets):
        def bound(i):
            lay, tab = tables.row(workload, i)
            return bounds(kind, lay, tab, traffic, targets, hardware, model)

        b = jax.vmap(bound)(jnp.arange(n_layouts))
        lb_chips = jnp.where(b.ok, b.replicas * chips, jnp.inf)
        const = dict(bounds=b, lb_chips=lb_chips, order=jnp.argsort(lb_chips, stable=True))
        state: dict[str, Any] = dict(
            hint=jnp.full((n_layouts,), inf),
            hint_h=jnp.full((n_layouts,), -_BIG, dtype),
            out=jnp.zeros((n_layouts,), bool),
            screened=jnp.asarray(k),
        )
        slots = open_at(const, state, slot, dict(chips=inf, row=n_layouts))
        state = dict(
            state,
            slots=slots,
            next=jnp.asarray(k),
            best=dict(
                chips=inf,
                row=jnp.asarray(n_layouts, const["order"].dtype),
                n=jnp.asarray(jnp.nan, dtype),
                seen=jnp.asarray(False),
            ),
            finished=jnp.all(slots["done"]),
            rounds=jnp.asarray(0),
            evaluations=jnp.asarray(0),
        )
        return const, state

    def caps(rows, best):
        """The most replicas of each layout that can still win against the best fleet held
        (inf: none held): as many chips for a layout before it in the enumeration (a tie goes
        to the first), strictly fewer for one after it."""
        ratio = best["chips"] / _take(chips, rows)
        return jnp.where(rows < best["row"], jnp.floor(ratio), jnp.ceil(ratio) - 1.0)

    def candidates(s, cap):
        lo, hi = s["lo"], s["hi"]
        rung = jnp.minimum(s["rung"], ladder.shape[0] - 1)
        first = s["rung"] == 0
        base = jnp.where(first, lo + 1.0, jnp.maximum(lo, 1.0))
        climb = jnp.maximum(
            lo[:, None] + 1.0 + jnp.arange(r), jnp.ceil(base[:, None] * _take(ladder, rung))
        )
        below = jnp.maximum(lo, 1.0)  # the first round's first candidate: the bound less one
        climb = climb.at[:, 0].set(jnp.where(first, below, climb[:, 0]))
        # with a fleet held, the last candidate is the cap: infeasible there, the layout is out
        held = jnp.where(jnp.isfinite(cap), cap, 0.0)
        climb = climb.at[:, -1].set(jnp.maximum(climb[:, -1], held))
        climb = jnp.minimum(jnp.minimum(climb, cap[:, None]), N_MAX)
        # inside a bracket: the secant root of h in log n, its neighbours, and the midpoint
        la, lb = jnp.log(jnp.maximum(lo, 0.5)), jnp.log(jnp.where(jnp.isfinite(hi), hi, 1.0))
        frac = s["hlo"] / jnp.maximum(s["hlo"] - s["hhi"], 1e-12)
        root = jnp.ceil(jnp.exp(la + (lb - la) * jnp.clip(frac, 0.0, 1.0)))
        mid = jnp.floor(0.5 * (lo + hi))
        inside = jnp.stack([root - 1.0, root, root + 1.0, mid], axis=-1)
        top = jnp.minimum(jnp.where(jnp.isfinite(hi), hi, 2.0) - 1.0, cap)[:, None]
        inside = jnp.clip(inside, lo[:, None] + 1.0, top)
        return jnp.where(jnp.isfinite(hi)[:, None], inside, climb)

    def advance(const, state, workload, traffic, targets):
        def verdict(row, n):
            lay, tab = tables.row(workload, row)
            out = evaluate(kind, lay, tab, n, traffic, targets, hardware, model, by_tail=True)
            return out[0]

        s, best = state["slots"], state["best"]
        order, lb_chips = const["order"], const["lb_chips"]

        # a screen round: with a fleet held, the next k r unopened layouts at their caps
        first = jnp.maximum(state["screened"], state["next"])
        q = first + jnp.arange(k * r)
        q_at = jnp.minimum(q, n_layouts - 1)
        q_row = _take(order, q_at)
        q_lb = _take(lb_chips, q_row)
        q_ok = (q < n_layouts) & jnp.isfinite(q_lb) & can_win(q_row, q_lb, best)
        screening = jnp.isfinite(best["chips"]) & q_ok[0]
        q_cap = jnp.clip(caps(q_row, best), 1.0, N_MAX)

        # a search round: each open slot's candidates
        cap = caps(s["row"], best)
        cand = candidates(s, cap)
        rows = jnp.where(screening, q_row, jnp.repeat(s["row"], r))
        ns = jnp.where(screening, q_cap, cand.reshape(-1))
        h = jnp.max(jax.vmap(verdict)(rows, ns), axis=-1)

        q_feasible = (h <= 0.0) & q_ok
        screened = dict(
            hint=state["hint"].at[q_at].set(jnp.where(q_feasible, q_cap, state["hint"][q_at])),
            hint_h=state["hint_h"].at[q_at].set(jnp.where(q_feasible, h, state["hint_h"][q_at])),
            out=state["out"].at[q_at].set(state["out"][q_at] | (q_ok & (h > 0.0))),
            screened=first + k * r,
        )

        h = h.reshape(k, r)
        active = ~s["done"] & ~screening
        feas = (h <= 0.0) & active[:, None]
        infeas = (h > 0.0) & active[:, None]
        c_hi = jnp.where(feas, cand, inf)
        i_hi = jnp.argmin(c_hi, axis=1)
        new_hi = jnp.minimum(s["hi"], jnp.min(c_hi, axis=1))
        took_hi = new_hi < s["hi"]
        hhi = jnp.where(took_hi, h[slot, i_hi], s["hhi"])
        c_lo = jnp.where(infeas & (cand < new_hi[:, None]), cand, -inf)
        i_lo = jnp.argmax(c_lo, axis=1)
        new_lo = jnp.maximum(s["lo"], jnp.max(c_lo, axis=1))
        took_lo = (jnp.max(c_lo, axis=1) >= s["lo"]) & active  # the bound less one counts too
        hlo = jnp.where(took_lo, h[slot, i_lo], s["hlo"])
        climbing = ~jnp.isfinite(new_hi)
        rung = jnp.where(active & climbing, s["rung"] + 1, s["rung"])
        gave_up = active & climbing & ((rung >= ladder.shape[0]) | (new_lo >= N_MAX))
        done = s["done"] | (active & ((new_hi - new_lo <= 1.0) | (new_lo >= cap))) | gave_up
        s = dict(
            s,
            lo=new_lo,
            hi=new_hi,
            hlo=hlo,
            hhi=hhi,
            rung=rung,
            done=done,
            seen=s["seen"] | took_lo,
        )

        # slots that just finished: the cheapest (ties to the first layout) may be the best
        ended = done & active & jnp.isfinite(new_hi)
        cost = jnp.where(ended, new_hi * chips[s["row"]], inf)
        i = jnp.lexsort((s["row"], cost))[0]
        better = (cost[i] < best["chips"]) | (
            (cost[i] == best["chips"]) & (s["row"][i] < best["row"])
        )
        take = better & jnp.isfinite(cost[i])
        best = jax.tree.map(
            lambda new, old: jnp.where(take, new, old),
            dict(chips=cost[i], row=s["row"][i], n=new_hi[i], seen=s["seen"][i]),
            best,
        )
        # a slot whose layout can no longer tie the best is closed; free slots take the next
        # layouts the screen has not ruled out
        done = s["done"] | (s["lo"] >= caps(s["row"], best))
        place = jnp.arange(n_layouts)
        avail = (place >= state["next"]) & ~state["out"]
        rank = jnp.cumsum(avail)
        want = jnp.cumsum(done)  # the j-th free slot takes the j-th available position
        pos = jnp.searchsorted(rank, want, side="left")
        pos = jnp.where(want <= rank[-1], pos, n_layouts)
        fresh = open_at(const, state, pos, best)
        s = jax.tree.map(
            lambda a, f: jnp.where(done.reshape((k,) + (1,) * (a.ndim - 1)), f, a),
            dict(s, done=done),
            fresh,
        )
        taken = jnp.max(jnp.where(done & (pos < n_layouts), pos + 1, state["next"]))
        searched = dict(
            slots=s,
            next=jnp.maximum(taken, state["next"]),
            best=best,
            finished=jnp.all(s["done"]),
        )
        kept = dict(
            slots=state["slots"],
            next=state["next"],
            best=state["best"],
            finished=state["finished"],
        )
        moved = jax.tree.map(lambda a, b: jnp.where(screening, a, b), kept, searched)
        marks = jax.tree.map(
            lambda a, b: jnp.where(screening, a, b),
            screened,
            {name: state[name] for name in screened},
        )
        return dict(
            moved,
            **marks,
            rounds=state["rounds"] + 1,
            evaluations=state["evaluations"]
            + jnp.where(screening, jnp.sum(q_ok), jnp.sum(active) * r),
        )

    def finish(const, state, workload, traffic, targets, quantiles):
        best = state["best"]
        found = jnp.isfinite(best["chips"])
        # the answer's report: the full evaluation at n, and at n - 1 where the search tried it
        row = jnp.where(found, best["row"], 0)
        n = jnp.where(found, best["n"], 1.0)
        lay, tab = tables.row(workload, row)
        args = (traffic, targets, hardware, model)
        counts = jnp.stack([n, jnp.maximum(n - 1.0, 1.0)])  # one copy of evaluate for both
        ratios, infos = jax.vmap(lambda c: evaluate(kind, lay, tab, c, *args, quantiles))(counts)
        at, below = ratios[0], ratios[1]
        info = jax.tree.map(lambda x: x[0], infos)
        nan = jnp.full((n_c,), jnp.nan, dtype)
        return Found(
            row=jnp.where(found, best["row"], -1),
            replicas=best["n"],
            chips=best["chips"],
            evaluations=state["evaluations"].astype(dtype),
            exhausted=~state["finished"],
            ratios=jnp.where(found, at, nan),
            ratios_below=jnp.where(found & best["seen"], below, nan),
            info=jax.tree.map(lambda x: jnp.where(found, x, jnp.nan), info),
            bounds=const["bounds"],
        )

    return start, advance, finish


def search(
    kind: str,
    tables: Tables,
    workload,
    traffic: Traffic,
    targets: Targets,
    hardware: Hardware,
    model: Model,
    settings: Settings = DEFAULT,
    quantiles=(0.5, 0.9, 0.99),
    width: int = 1,
) -> Found:
    """Branch and bound over one kind's layouts (see the module docstring) for a batch of
    scenarios: ``workload``, ``traffic`` and ``targets`` carry a leading axis (one scenario is a
    batch of one).

    ``group`` slots each search one layout; a slot that finishes takes the next layout in the
    order of bounds at once, while that layout's bound does not exceed the best fleet held.
    With a fleet held, a slot tries no more replicas than would tie it,
    ``cap = floor(chips_best / (P G))``: a layout infeasible at its cap cannot win and is
    dropped after that one evaluation. Candidates are judged by their tails
    (``evaluate(..., by_tail=True)``: no percentile is solved during the search); the answer's
    report (latency at the target's and ``quantiles``' percentiles, the log-ratios at ``n``
    and ``n - 1``) comes from two full evaluations once it ends.

    Many scenarios: each round advances ``width`` scenarios still searching (gathered from the
    whole batch, scattered back), so a batch costs the rounds its scenarios need in all, not
    ``width`` times the rounds of its slowest one.
    """
    start, advance, finish = _steps(kind, tables, hardware, model, settings)
    scenario = (workload, traffic, targets)
    const, state = jax.vmap(start)(*scenario)
    size = int(jnp.shape(workload)[0])
    width = max(1, min(int(width), size))

    def live(st):
        return ~st["finished"] & (st["rounds"] < settings.max_rounds)

    def body(st):
        idx = jnp.argsort(~live(st), stable=True)[:width]  # scenarios still searching first

        def take(tree):
            return jax.tree.map(lambda x: _take(x, idx), tree)

        sub = take(st)
        new = jax.vmap(advance)(take(const), sub, *take(scenario))
        keep = live(sub)
        new = jax.tree.map(
            lambda a, b: jnp.where(keep.reshape((width,) + (1,) * (a.ndim - 1)), a, b), new, sub
        )
        return jax.tree.map(lambda x, y: x.at[idx].set(y, wrap_negative_indices=False), st, new)

    state = jax.lax.while_loop(lambda st: jnp.any(live(st)), body, state)
    return jax.vmap(lambda c, st, *sc: finish(c, st, *sc, quantiles))(const, state, *scenario)


def grid(
    kind: str,
    tables: Tables,
    workload,
    traffic: Traffic,
    targets: Targets,
    hardware: Hardware,
    model: Model,
    n_max: int,
):
    """Every layout at every replica count ``1..n_max``: ``(feasible (L, n_max), chips)``.

    The exhaustive ground truth: the cheapest feasible cell (ties to the first layout) is the
    answer ``search`` must give when it lies within ``n_max``.
    """
    ns = jnp.arange(1.0, n_max + 1.0, dtype=jnp.result_type(float))

    def one(i):
        lay, tab = tables.row(workload, i)

        def at(n):
            ratios, _ = evaluate(kind, lay, tab, n, traffic, targets, hardware, model, by_tail=True)
            return _feasible(ratios)

        return jax.vmap(at)(ns)

    feasible = jax.vmap(one)(jnp.arange(tables.size))
    chips = ns[None, :] * tables.layouts.chips_per_replica[:, None]
    return feasible, chips
