"""The planning experiments' numbers, checked another way: throughput per GPU by hand from the
traffic and the fleet, a looser target never dearer, more traffic never cheaper, and the bill
of a mode equal to a plan of that mode alone. Beside them, the batched planner these
experiments run (one program for 2 to 16 scenarios, compiled once for this file) against
one-by-one plans and an independent certificate of each pool's optimality."""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost
from dcost import _xla
from dcost.planning import planner as P
from dcost.planning import search as S

EXPERIMENTS = pathlib.Path(__file__).resolve().parents[1] / "experiments"
sys.path.insert(0, str(EXPERIMENTS))

import disaggregation  # noqa: E402
import fleet_growth  # noqa: E402
import interactivity  # noqa: E402


@pytest.mark.parametrize("module", [disaggregation, fleet_growth, interactivity])
def test_scripts_have_the_standard_shape(module):
    assert callable(module.compute) and callable(module.plot) and callable(module.main)
    assert module.__doc__ and "Claim" in module.__doc__


def test_interactivity_frontier():
    res = interactivity.compute(targets=(0.03, 0.1), rate=100.0)
    chat = dcost.traffic("chat")
    for mode in ("aggregated", "disaggregated"):
        r = res[mode]
        per_gpu = np.asarray(r["tokens_per_s_per_gpu"])
        chips = np.asarray(r["chips"])
        np.testing.assert_allclose(per_gpu, 100.0 * float(chat.output_tokens) / chips, rtol=1e-6)
    agg = res["aggregated"]
    assert agg["tokens_per_s_per_gpu"][1] >= agg["tokens_per_s_per_gpu"][0]  # looser: more
    assert agg["tokens_per_s_per_user"][1] <= agg["tokens_per_s_per_user"][0]  # and slower
    fig = interactivity.plot(res)
    for ax in fig.axes:
        assert ax.get_xlabel() and ax.get_ylabel() and ax.get_title()


@pytest.mark.slow  # batched plans compile anew for their batch size
def test_disaggregation_and_fleet_growth():
    res = disaggregation.compute(ratios=(1 / 4, 16.0), rates=(8.0, 128.0))
    h = dcost.hardware("h100-sxm", calibrated=True)
    prompt, output = disaggregation.lengths(16.0)
    t = dcost.Traffic(128.0, prompt, output, prompt_cv=1.0, output_cv=1.0)
    kw = dict(tpot_slo=(disaggregation.TPOT, 0.9), max_utilisation=disaggregation.UTILISATION)
    for mode in ("aggregated", "disaggregated"):
        p = dcost.plan(h, "llama-3-70b", t, mode=mode, **kw)
        assert res[f"{mode}_per_hour"][1][1] == pytest.approx(p.cost_per_hour, rel=1e-6)
    growth = fleet_growth.compute(rates=np.array([1.0, 10.0, 100.0, 1000.0]))
    assert np.all(np.diff(growth["cost_per_hour"]) >= 0)  # more traffic never costs less
    assert np.all(np.diff(growth["chips"]) >= 0)


def feasible_at(h100, llama, traffic, counts):
    """Whether each layout of each pool kind meets the targets at given replica counts, by the
    percentile verdict (``evaluate`` without ``by_tail``: an independent path from the
    search's). ``counts[kind]``: ``(scenarios, layouts, k)`` whole counts (0: not asked,
    answered False). Returns the same shapes of booleans, and each kind's chips per replica."""
    options = P.DEFAULT_OPTIONS
    stats = jax.vmap(P.workload_stats)(traffic)
    targets = S.Targets(*(jnp.asarray(x) for x in (2.0, 0.05, 0.1, 1e-3, 0.85, 0.6)), 0.99, 0.9)
    out = {}
    for kind, n in counts.items():
        layouts = {kind: P._stack(P.layouts(kind, h100, llama, options, None, 0.1))}
        balanced = jnp.asarray(1.0, stats.dtype)  # a dense model: balanced, whatever the chip
        table = P._tables((kind,), h100, llama, layouts, stats, None, balanced)[kind]

        def ok(u, row, tr, count, kind=kind, table=table):
            lay, tab = table.row(u, row)
            ratios, _ = S.evaluate(kind, lay, tab, count, tr, targets, h100, llama)
            return (count >= 1) & jnp.all(ratios <= 0.0)

        def each(u, tr, c, ok=ok, size=table.size):  # layouts x counts
            rows = jnp.arange(size)
            return jax.vmap(lambda r, cr: jax.vmap(lambda x: ok(u, r, tr, x))(cr))(rows, c)

        size = int(np.shape(traffic.rate)[0])
        # at XLA's own optimization level (not the suite's level 0): it runs every layout at
        # every count, which level 0 runs several times more slowly than it compiles faster
        got = jax.jit(jax.vmap(each), compiler_options=_xla.options(False))(
            jnp.arange(size), traffic, jnp.asarray(n[:, : table.size], float)
        )
        out[kind] = (np.asarray(got), np.asarray(table.layouts.chips_per_replica, float))
    return out


def check_least_replicas(h100, llama, traffic, claims):
    """Certify each claimed pool ``claims[u][kind] = (chips C, replicas n)`` as the cheapest
    layout at its least feasible count (ties to the first layout), with feasibility monotone in
    the count: no layout ``i`` of ``c_i`` chips a replica is feasible at ``ceil(C/c_i) - 1``
    replicas (the most that cost less than C, capped at ``N_MAX``), and the first layout
    feasible at exactly ``C/c_i`` replicas has ``n = C/c_i``. Two evaluations per layout where
    a bisection of each layout's count took 26 (the same verdict, 13x less work)."""
    size = int(np.shape(traffic.rate)[0])
    kinds = sorted({k for c in claims for k in c})
    counts = {}
    for kind in kinds:
        lay = P._stack(P.layouts(kind, h100, llama, P.DEFAULT_OPTIONS, None, 0.1))
        c = np.rint(np.asarray(lay.chips_per_replica, float)).astype(np.int64)
        n = np.zeros((size, len(c), 2))
        for u in range(size):
            if kind not in claims[u]:
                continue
            chips = int(round(claims[u][kind][0]))
            n[u, :, 0] = np.minimum(-(-chips // c) - 1, S.N_MAX)  # the most that cost less
            whole = (chips % c == 0) & (chips // c <= S.N_MAX)
            n[u, :, 1] = np.where(whole, chips // c, 0)  # exactly C chips
        counts[kind] = n
    verdicts = feasible_at(h100, llama, traffic, counts)
    for u in range(size):
        for kind, (chips, replicas) in claims[u].items():
            ok, c = verdicts[kind]
            cheaper = np.flatnonzero(ok[u, :, 0])
            assert cheaper.size == 0, (u, kind, chips, c[cheaper], counts[kind][u, cheaper, 0])
            exact = np.flatnonzero(ok[u, :, 1])
            assert exact.size, (u, kind, chips, "no layout is feasible at this many chips")
            assert replicas == counts[kind][u, exact[0], 1], (u, kind, chips, replicas)


@pytest.mark.slow  # the batched program (shared with the experiments) and the certificate
def test_many_scenarios_in_one_call_match_one_by_one_and_are_cheapest():
    """Every traffic preset at 1, 300 and 8,700 requests/s in one call (answers up to tens of
    thousands of replicas, far past any grid, where the caps and the screen prune most
    layouts): each scenario's plan equals its own one-scenario plan, and every pool equals the
    cheapest layout at its least feasible count, certified by the percentile verdict on every
    layout (`check_least_replicas`)."""
    h100, llama = dcost.hardware("h100-sxm", calibrated=True), dcost.model("llama-3-70b")
    names = dcost.planning.traffic_names()
    rates = (1.0, 300.0, 8700.0)
    shapes = [dcost.traffic(n, rate=r) for n in names for r in rates]
    fields = ("rate", "prompt_tokens", "output_tokens", "prompt_cv", "output_cv", "prefix_hit")
    traffic = dcost.Traffic(**{f: np.array([float(getattr(s, f)) for s in shapes]) for f in fields})
    batch = dcost.plan(h100, llama, traffic)
    assert len(batch) == len(shapes) and batch.chips.shape == (len(shapes),)
    assert np.all(np.diff(batch.cost_per_hour.reshape(len(names), -1), axis=1) >= 0)
    claims: list[dict] = []
    for one_traffic, p in zip(shapes, batch, strict=True):
        one = dcost.plan(h100, llama, one_traffic)
        assert (p.mode, p.chips, [x.describe() for x in p.pools]) == (
            one.mode,
            one.chips,
            [x.describe() for x in one.pools],
        )
        claims.append({})
        for q in (p, p.alternative):
            assert q.feasible
            for pool in q.pools:
                claims[-1][pool.role] = (pool.chips, pool.replicas)
    check_least_replicas(h100, llama, traffic, claims)
