"""How a deployment's error falls with k of its own measurements (issue 30, item 3).

Claim: a few of a deployment's own runs calibrate an engine profile to it; the issue's target is
a median 8 % (p90 20 %) on its other runs with k = 3.

A deployment is one layout of one model on one chip under one engine version in the silicon
sample (``dcost.validation.silicon``: engine, version, chip, model, precision, mode and parallel
degrees); its runs differ in concurrency and lengths. For every deployment with more than k TPOT
runs, k of them (drawn at random, seeded) calibrate the engine's shipped profile
(``dcost.calibrate.user``: the profile as the prior, the same serving model), and the others are
predicted: held out, the deployment's own other runs. k = 0 is the shipped profile (its fixed
costs fitted on the engine's other models, and every k starts from those: no fit ever saw the
deployment's model). Per engine and k, the held-out log errors also make the band that
``dcost.engines.interval_factors`` puts around a calibrated engine's predictions
(``dcost.calibrate.engines.band``, the deployment as the group left out, its coverage checked
nested). Writes ``dcost/engines/own_measurements.toml`` and
``docs/figures/own_measurements.png``.

    python experiments/own_measurements.py [--max-groups N]
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
KS = (0, 1, 3, 10)
MIN_ROWS = 4


def groups(recs):
    out = collections.defaultdict(list)
    for r in recs:
        if r["metric"] != "tpot":
            continue
        key = (
            r["engine"],
            r.get("engine_version", "?"),
            r["hardware"],
            r["model"],
            r["weights"],
            r["mode"],
            r["tensor_parallel"],
            r["attention_data_parallel"],
            r["expert_parallel"],
            r["pipeline_parallel"],
        )
        out[key].append(r)
    return {k: v for k, v in out.items() if len(v) >= MIN_ROWS}


def prior(key, rows, held_costs):
    """A deployment's prior: its engine's shipped profile with the fixed costs fitted without its
    model's runs (``heldout()["fixed_costs_held_out"]``); None when no profile ships for it."""
    from dcost.validation.cases import record_engine

    eng = record_engine({k: v for k, v in rows[0].items() if k != "mode"})[0]
    return None if eng is None else eng.with_profile(profile=held_costs[key[0]][key[3]])


def _by_group(pairs):
    """``(log errors, group ids)`` of ``[(group, log error), ...]``."""
    g, r = zip(*pairs, strict=True)
    return np.asarray(r), np.asarray(g)


def compute(max_groups=None, seed=0, log=print) -> dict:
    import dcost
    from dcost.calibrate import user
    from dcost.calibrate.engines import band
    from dcost.validation import silicon

    recs, _ = silicon.records()
    held_costs = dcost.engines.heldout()["fixed_costs_held_out"]
    by_group = groups(recs)
    keys = sorted(by_group, key=str)
    if max_groups:
        keys = keys[:max_groups]
    errors: dict[int, list] = {k: [] for k in KS}
    per_engine: dict[tuple, list] = collections.defaultdict(list)
    logs: dict[tuple, list] = collections.defaultdict(list)  # (engine, k): (deployment, log error)
    rng = np.random.default_rng(seed)
    t0 = time.perf_counter()
    for n_done, key in enumerate(keys):
        rows = by_group[key]
        eng = prior(key, rows, held_costs)
        if eng is None:
            continue
        prep = user.prepare(rows, eng)
        for k in KS:
            if len(rows) <= k:
                continue
            pick = np.zeros(len(rows), bool)
            pick[rng.choice(len(rows), k, replace=False)] = True
            z = user.fit_offsets(prep, pick)[0] if k else np.zeros(len(user.FIELDS))
            pred = user.predict_offsets(prep, z)
            ratio = pred[~pick] / prep.measured[~pick]
            err = np.abs(ratio - 1.0)
            errors[k] += err.tolist()
            per_engine[(key[0], k)] += err.tolist()
            logs[(key[0], k)] += [(n_done, x) for x in np.log(ratio).tolist()]
        if n_done % 20 == 0:
            log(f"{n_done + 1}/{len(keys)} deployments, {time.perf_counter() - t0:.0f} s")
    table = {
        "source": silicon.SOURCE,
        "split": "each deployment's other runs, held out from the k that calibrate it",
        "deployments": len(keys),
        "min_rows": MIN_ROWS,
        "k": {
            str(k): {
                "rows": len(e),
                "median": float(np.median(e)),
                "p90": float(np.quantile(e, 0.9)),
            }
            for k, e in errors.items()
            if e
        },
        "by_engine": {
            name: {
                str(k): {
                    "rows": len(e),
                    "median": float(np.median(e)),
                    "p90": float(np.quantile(e, 0.9)),
                }
                for (n2, k), e in per_engine.items()
                if n2 == name and e
            }
            for name in sorted({n for n, _ in per_engine})
        },
        # bands around a calibrated engine's predictions (dcost.engines.interval_factors): a
        # user's deployment is a new one, so each deployment is the group held out
        "intervals": {
            name: {
                str(k): band(*_by_group(logs[(name, k)]))
                for k in KS
                if k and len({g for g, _ in logs[(name, k)]}) >= 3
            }
            for name in sorted({n for n, _ in logs})
        },
        "seconds": time.perf_counter() - t0,
    }
    del dcost
    return table


def plot(table: dict):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [int(k) for k in table["k"]]
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for stat, style in (("median", "o-"), ("p90", "s--")):
        ax.plot(
            ks, [100 * table["k"][str(k)][stat] for k in ks], style, label=f"all engines, {stat}"
        )
    for name, rows in table["by_engine"].items():
        kk = sorted(int(k) for k in rows)
        ax.plot(
            kk, [100 * rows[str(k)]["median"] for k in kk], ":", alpha=0.8, label=f"{name}, median"
        )
    ax.axhline(8, color="grey", lw=0.8)
    ax.axhline(20, color="grey", lw=0.8, ls="--")
    ax.text(5.5, 8.3, "target median 8 %", ha="center", va="bottom", fontsize=8, color="grey")
    ax.text(5.5, 19.5, "target p90 20 %", ha="center", va="top", fontsize=8, color="grey")
    ax.set_xticks(ks)
    ax.set_xlabel("k: a deployment's own runs that calibrate it")
    ax.set_ylabel("error on its other runs (%)")
    ax.set_title(f"Own measurements: {table['deployments']} deployments of the silicon sample")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--max-groups", type=int, default=None)
    args = p.parse_args()
    table = compute(args.max_groups)
    from dcost.calibrate import kernels

    lines = [
        "# A deployment's error against k of its own runs (experiments/own_measurements.py).",
        "",
    ]
    kernels._toml_table("own", table, lines)
    out = ROOT / "dcost" / "engines" / "own_measurements.toml"
    out.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    # shipped data and a docs figure, not experiments/results: the README quotes them
    plot(table).savefig(ROOT / "docs" / "figures" / "own_measurements.png", dpi=120)
    for k, s in table["k"].items():
        med, p90 = 100 * s["median"], 100 * s["p90"]
        print(f"k = {k:>2s}: median {med:.1f} %, p90 {p90:.1f} % ({s['rows']} runs)")
    where = out.relative_to(ROOT)
    print(f"{table['deployments']} deployments in {table['seconds']:.0f} s; wrote {where}")


if __name__ == "__main__":
    main()
