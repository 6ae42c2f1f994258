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
nested). The same curve on published sources (``compute_published``): the validation set's
runs of one source on one chip under the engine its text names, 4 or more, never seen by any
fit; a group whose records ran TensorRT engines under TensorRT-LLM's C++ runtime (their notes
name the TensorRT version, ``_common.runs_tensorrt_engines``) starts from the profile without
the PyTorch backend's host costs (``_common.CPP_RUNTIME``), as ``mlperf_server.py`` does. Writes
``dcost/engines/own_measurements.toml`` and ``docs/figures/own_measurements.png``.

    python experiments/own_measurements.py [--max-groups N]
"""

from __future__ import annotations

import argparse
import collections
import pathlib
import re
import time

import _common as C  # puts the checkout's dcost first on the path
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


# which engine a published record's source names: exactly one of these in its note, quote or
# address (the records say what served them in prose; a user passes it as --engine)
_ENGINE_NAMED = {
    "vllm": re.compile(r"\bvLLM\b", re.I),
    "sglang": re.compile(r"\bSGLang\b", re.I),
    "trtllm": re.compile(r"TensorRT-LLM|TRT-LLM", re.I),
}


def served_by(record) -> str | None:
    """The engine a published record's text names, when it names exactly one."""
    text = " ".join(str(record.get(f, "")) for f in ("note", "quote", "source"))
    named = [name for name, pat in _ENGINE_NAMED.items() if pat.search(text)]
    return named[0] if len(named) == 1 else None


def published_groups(records):
    """The validation set's published runs as deployments: one source's runs on one chip under
    one engine, 4 or more, whose engine ships a profile for that chip. Left out: dcost's own
    runs (they name their engine, bare XLA), records that name no engine or several, and TTFTs
    (those sources measure them under a Server load, queueing included, which a fit to static
    steps does not model; ``experiments/mlperf_server.py`` simulates them)."""
    from dcost.validation.cases import record_engine

    out = collections.defaultdict(list)
    for r in records:
        name = served_by(r)
        if "engine" in r or name is None or r["metric"] == "ttft":
            continue
        out[(r["source_id"], r["hardware"], name)].append(dict(r, engine=name))
    return {
        k: v for k, v in out.items() if len(v) >= MIN_ROWS and record_engine(v[0])[0] is not None
    }


def compute_published(bands=None, draws=5, seed=0, log=print) -> dict:
    """The k curve on published sources: every group's shipped engine profile (k = 0, the
    latest version when the source states none) calibrated on k of its runs drawn at random
    (``draws`` draws a k, seeded), its other runs predicted. ``bands``: the calibrated
    deployments' bands (``compute()["intervals"]``; default: the shipped ones), whose 80 %
    coverage is checked on these runs, as the shipped profile's (``heldout()["intervals"]``) is
    at k = 0."""
    import dcost
    from dcost.calibrate import user
    from dcost.validation import load
    from dcost.validation.cases import TIME_METRICS, record_engine

    if bands is None:
        bands = dcost.engines.own_measurements()["intervals"]
    shipped = dcost.engines.heldout()["intervals"]
    by_group = published_groups(load())
    rng = np.random.default_rng(seed)
    errors: dict[int, list] = {k: [] for k in KS}
    inside: dict[int, list] = {k: [] for k in KS}
    one_model: dict[int, list] = {k: [] for k in KS}  # inside[k]'s runs: their group one model
    # several models' groups, calibrated, in the shipped profile's band (what interval_factors
    # gives a profile calibrated on several architectures)
    wide: dict[int, list] = {k: [] for k in KS}
    rows_out = {}
    t0 = time.perf_counter()
    for key in sorted(by_group):
        rows = by_group[key]
        eng = record_engine(rows[0])[0]
        runtime = "as profiled"
        if all(C.runs_tensorrt_engines(r) for r in rows):  # no Python executor's host costs
            eng, runtime = C.without_host_costs(eng, C.CPP_RUNTIME), "TensorRT engines"
        prep = user.prepare(rows, eng)
        # log(predicted/measured) as a time: a throughput's ratio inverted
        sign = np.array([1.0 if r["metric"] in TIME_METRICS else -1.0 for r in rows])
        single = len({r["model"] for r in rows}) == 1
        mine = {}
        for k in KS:
            if len(rows) <= k:
                continue
            band = shipped[eng.name] if k == 0 else bands.get(eng.name, {}).get(str(k))
            err: list = []
            for _ in range(draws if k else 1):
                pick = np.zeros(len(rows), bool)
                pick[rng.choice(len(rows), k, replace=False)] = True
                z = user.fit_offsets(prep, pick)[0] if k else np.zeros(len(user.FIELDS))
                ratio = user.predict_offsets(prep, z)[~pick] / prep.measured[~pick]
                err += np.abs(ratio - 1.0).tolist()
                if band is not None:
                    r = sign[~pick] * np.log(ratio)
                    inside[k] += ((r >= band["q10"]) & (r <= band["q90"])).tolist()
                    one_model[k] += [single] * len(r)
                    if k and not single:
                        b0 = shipped[eng.name]
                        wide[k] += ((r >= b0["q10"]) & (r <= b0["q90"])).tolist()
            errors[k] += err
            mine[str(k)] = float(np.median(err))
        rows_out["/".join(key)] = {
            "runs": len(rows),
            "models": ", ".join(sorted({r["model"] for r in rows})),
            "metrics": ", ".join(sorted({r["metric"] for r in rows})),
            "prior": f"{eng.label} on {eng.hardware_name}",
            "runtime": runtime,
            "median_by_k": mine,
        }
        log(
            f"{'/'.join(key)}: {len(rows)} runs, "
            + ", ".join(f"k={k} {v:.2f}" for k, v in mine.items())
        )
    return {
        "source": "dcost/validation/records.toml (published sources)",
        "split": (
            "each group's other runs, held out from the k that calibrate it; "
            f"{draws} random draws of the k runs a group"
        ),
        "groups": len(by_group),
        "k": {str(k): _stats(e) for k, e in errors.items() if e},
        # the share of these runs inside the 80 % band (k = 0: the shipped profile's for a new
        # model; k >= 1: a calibrated deployment's), as a user of either band would get
        "coverage_80": {str(k): float(np.mean(v)) for k, v in inside.items() if v},
        "coverage_80_one_model": {
            str(k): float(np.mean(np.asarray(v)[np.asarray(one_model[k])]))
            for k, v in inside.items()
            if any(one_model[k])
        },
        "coverage_80_several_models": {
            str(k): float(np.mean(np.asarray(v)[~np.asarray(one_model[k])]))
            for k, v in inside.items()
            if v and not all(one_model[k])
        },
        "coverage_80_several_models_shipped_band": {
            str(k): float(np.mean(v)) for k, v in wide.items() if v
        },
        "by_group": rows_out,
        "seconds": time.perf_counter() - t0,
    }


def _stats(errors) -> dict:
    """``{"rows", "median", "p90"}`` of ``|predicted/measured - 1|`` values."""
    return {
        "rows": len(errors),
        "median": float(np.median(errors)),
        "p90": float(np.quantile(errors, 0.9)),
    }


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
    spread: list = []  # k = 3 chosen, not drawn: the lowest, a middle and the highest concurrency
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
        if len(rows) > 3:
            order = sorted(
                range(len(rows)),
                key=lambda i: tuple(
                    float(rows[i][f]) for f in ("concurrency", "prompt_tokens", "output_tokens")
                ),
            )
            pick = np.zeros(len(rows), bool)
            pick[[order[0], order[len(order) // 2], order[-1]]] = True
            z = user.fit_offsets(prep, pick)[0]
            ratio = user.predict_offsets(prep, z)[~pick] / prep.measured[~pick]
            spread += np.abs(ratio - 1.0).tolist()
        if n_done % 20 == 0:
            log(f"{n_done + 1}/{len(keys)} deployments, {time.perf_counter() - t0:.0f} s")
    table = {
        "source": silicon.SOURCE,
        "split": "each deployment's other runs, held out from the k that calibrate it",
        "deployments": len(keys),
        "min_rows": MIN_ROWS,
        "k": {str(k): _stats(e) for k, e in errors.items() if e},
        "spread_3": {
            "rule": "the runs of lowest, middle and highest concurrency (ties: prompt, output)",
            **_stats(spread),
        },
        "by_engine": {
            name: {str(k): _stats(e) for (n2, k), e in per_engine.items() if n2 == name and e}
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
            ks, [100 * table["k"][str(k)][stat] for k in ks], style, label=f"silicon sample, {stat}"
        )
    for name, rows in table["by_engine"].items():
        kk = sorted(int(k) for k in rows)
        ax.plot(
            kk, [100 * rows[str(k)]["median"] for k in kk], ":", alpha=0.8, label=f"{name}, median"
        )
    spread = table.get("spread_3")
    if spread:
        for stat, marker in (("median", "*"), ("p90", "P")):
            ax.plot(
                [3],
                [100 * spread[stat]],
                marker,
                color="black",
                ms=9,
                ls="none",
                label=f"3 runs at low, middle, high concurrency, {stat}",
            )
    pub = table.get("published")
    if pub:
        kk = [int(k) for k in pub["k"] if pub["k"][k]["rows"] >= 20]
        for stat, style in (("median", "D-"), ("p90", "D--")):
            ax.plot(
                kk,
                [100 * pub["k"][str(k)][stat] for k in kk],
                style,
                color="tab:brown",
                ms=4,
                label=f"published sources ({pub['groups']} groups), {stat}",
            )
    ax.axhline(8, color="grey", lw=0.8)
    ax.axhline(20, color="grey", lw=0.8, ls="--")
    edge = ax.get_yaxis_transform()  # x in axes units: the labels sit right of the plot
    for y, text in ((8, "target\nmedian 8 %"), (20, "target\np90 20 %")):
        ax.text(1.01, y, text, transform=edge, va="center", fontsize=7, color="grey")
    ax.set_xticks(ks)
    ax.set_xlabel("k: a deployment's own runs that calibrate it")
    ax.set_ylabel("error on its other runs (%)")
    title = f"Own measurements: {table['deployments']} deployments of the silicon sample"
    if pub:
        title += f",\n{pub['groups']} groups of published runs (never fitted)"
    ax.set_title(title, fontsize=10)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    return fig


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--max-groups", type=int, default=None)
    args = p.parse_args()
    table = compute(args.max_groups)
    table["published"] = compute_published(table["intervals"])
    from dcost._toml import toml_table

    lines = [
        "# A deployment's error against k of its own runs (experiments/own_measurements.py).",
        "",
    ]
    toml_table("own", table, lines)
    out = ROOT / "dcost" / "engines" / "own_measurements.toml"
    out.write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")
    # shipped data and a docs figure, not experiments/results: the README quotes them
    plot(table).savefig(ROOT / "docs" / "figures" / "own_measurements.png", dpi=120)
    for k, s in table["k"].items():
        med, p90 = 100 * s["median"], 100 * s["p90"]
        print(f"k = {k:>2s}: median {med:.1f} %, p90 {p90:.1f} % ({s['rows']} runs)")
    where = out.relative_to(ROOT)
    s = table["spread_3"]
    med, p90 = 100 * s["median"], 100 * s["p90"]
    print(f"k =  3 spread over concurrency: median {med:.1f} %, p90 {p90:.1f} %")
    pub = table["published"]
    for k, s in pub["k"].items():
        med, p90 = 100 * s["median"], 100 * s["p90"]
        cover = 100 * pub["coverage_80"].get(k, float("nan"))
        print(
            f"published, k = {k:>2s}: median {med:.1f} %, p90 {p90:.1f} % ({s['rows']} runs), "
            f"80 % band holds {cover:.0f} %"
        )
    print(
        f"{table['deployments']} deployments and {pub['groups']} published groups in "
        f"{table['seconds'] + pub['seconds']:.0f} s; wrote {where}"
    )


if __name__ == "__main__":
    main()
