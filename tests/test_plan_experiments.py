"""The planning experiments' numbers, checked another way: throughput per GPU by hand from the
traffic and the fleet, a looser target never dearer, more traffic never cheaper, and the bill
of a mode equal to a plan of that mode alone. Beside them, the batched planner these
experiments run (one program for 2 to 16 scenarios, compiled once for this file) against
one-by-one plans and an independent bisection per layout."""

from __future__ import annotations

import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost
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


def least_replicas_by_bisection(h100, llama, traffic):
    """For a batch of scenarios (``traffic`` with a leading axis), per pool kind: every
    layout's least feasible replica count up to ``N_MAX``, by a bisection on the percentile
    verdict (``evaluate`` without ``by_tail``: an independent path from the search's), and the
    cheapest layout (ties to the first): ``[{kind: (chips, replicas)}]`` per scenario."""
    kinds = S.KINDS
    options = P.DEFAULT_OPTIONS
    layouts = {k: P._stack(P.layouts(k, h100, llama, options, None, 0.1)) for k in kinds}
    stats = jax.vmap(P.workload_stats)(traffic)
    tables = P._tables(kinds, h100, llama, layouts, stats, None)
    targets = S.Targets(*(jnp.asarray(x) for x in (2.0, 0.05, 0.1, 1e-3, 0.85, 0.6)), 0.99, 0.9)
    size = int(np.shape(traffic.rate)[0])
    out: list[dict] = [{} for _ in range(size)]
    for kind in kinds:

        def least(u, row, tr, kind=kind):
            lay, tab = tables[kind].row(u, row)

            def ok(count):
                ratios, _ = S.evaluate(kind, lay, tab, count, tr, targets, h100, llama)
                return jnp.all(ratios <= 0.0)

            def body(_, ab):
                a, b = ab  # a infeasible (or 0), b feasible
                mid = jnp.floor(0.5 * (a + b))
                good = ok(mid)
                return jnp.where(good, a, mid), jnp.where(good, mid, b)

            top = jnp.asarray(S.N_MAX)
            _, b = jax.lax.fori_loop(0, 25, body, (jnp.asarray(0.0), top))
            return jnp.where(ok(top), b, jnp.inf)

        rows = jnp.arange(tables[kind].size)
        each = jax.vmap(lambda u, tr: jax.vmap(lambda r: least(u, r, tr))(rows))  # noqa: B023
        n = np.asarray(jax.jit(each)(jnp.arange(size), traffic))
        chips = n * np.asarray(tables[kind].layouts.chips_per_replica)[None, :]
        for u in range(size):
            i = int(np.argmin(chips[u]))
            out[u][kind] = (float(chips[u, i]), float(n[u, i]))
    return out


@pytest.mark.slow  # the batched program (shared with the experiments) and the bisection
def test_many_scenarios_in_one_call_match_one_by_one_and_bisection():
    """Every traffic preset at 1, 300 and 8,700 requests/s in one call (answers up to tens of
    thousands of replicas, far past any grid, where the caps and the screen prune most
    layouts): each scenario's plan equals its own one-scenario plan, and every pool equals the
    cheapest layout at its least feasible count found by bisection for each layout."""
    h100, llama = dcost.hardware("h100-sxm", calibrated=True), dcost.model("llama-3-70b")
    names = dcost.planning.traffic_names()
    rates = (1.0, 300.0, 8700.0)
    shapes = [dcost.traffic(n, rate=r) for n in names for r in rates]
    fields = ("rate", "prompt_tokens", "output_tokens", "prompt_cv", "output_cv", "prefix_hit")
    traffic = dcost.Traffic(**{f: np.array([float(getattr(s, f)) for s in shapes]) for f in fields})
    batch = dcost.plan(h100, llama, traffic)
    assert len(batch) == len(shapes) and batch.chips.shape == (len(shapes),)
    assert np.all(np.diff(batch.cost_per_hour.reshape(len(names), -1), axis=1) >= 0)
    truths = least_replicas_by_bisection(h100, llama, traffic)
    for one_traffic, p, truth in zip(shapes, batch, truths, strict=True):
        one = dcost.plan(h100, llama, one_traffic)
        assert (p.mode, p.chips, [x.describe() for x in p.pools]) == (
            one.mode,
            one.chips,
            [x.describe() for x in one.pools],
        )
        for q in (p, p.alternative):
            assert q.feasible
            for pool in q.pools:
                assert (pool.chips, pool.replicas) == truth[pool.role], (one_traffic, pool)
