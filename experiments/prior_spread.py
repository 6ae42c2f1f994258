"""How wide a prior should a calibration to your own runs take? A scan, held out.

Claim examined: ``dcost.calibrate.user``'s prior spreads (``PRIOR_SD``: 0.5 in logit units for
the rates, 1.0 in log units for the fixed costs, with ``SIGMA`` = 10 % a run) are assumed, not
fitted; a narrower prior would shrink a fit on three runs toward the shipped profile, a wider one
let the runs speak. Which predicts a deployment's *other* runs best?

Method (the split of ``experiments/own_measurements.py``): every silicon-sample deployment with 4
runs or more, its prior the shipped profile with the fixed costs fitted without its model; k = 1
and 3 of its runs drawn (seeded, the same draws for every prior) calibrate it, its other runs are
predicted. The same on the nine published groups (5 draws each), split into groups of one model
and of several. Priors: every spread scaled by ``SCALES``; and an empirical-Bayes prior, each
field's spread the root mean square of the offsets the deployments' own runs fit (all of them,
under the shipped prior), set on the even-numbered deployments and checked on the odd ones, and
the other way round (a deployment never checks the spread it helped set). Writes
``results/prior_spread.json``.

    python experiments/prior_spread.py
"""

from __future__ import annotations

import json
import pathlib
import time

import _common as C  # puts the checkout's dcost first on the path
import numpy as np
import own_measurements as own

ROOT = pathlib.Path(__file__).resolve().parents[1]
OUT = ROOT / "experiments" / "results" / "prior_spread.json"
SCALES = (0.1, 0.3, 1.0, 3.0, 10.0)
KS = (1, 3)
FLOOR = 0.02
"""The least spread the empirical-Bayes prior gives a field (one no deployment moved)."""


def prepared(log=print):
    """``(silicon deployments, published groups)``: ``(key, Prepared)`` and ``(key, Prepared, one
    model?)``, as ``own_measurements`` makes them."""
    import dcost
    from dcost.calibrate import user
    from dcost.validation import load, silicon
    from dcost.validation.cases import record_engine

    recs, _ = silicon.records()
    held = dcost.engines.heldout()["fixed_costs_held_out"]
    by_group = own.groups(recs)
    sil = []
    for key in sorted(by_group, key=str):
        eng = own.prior(key, by_group[key], held)
        if eng is not None:
            sil.append((key, user.prepare(by_group[key], eng)))
    pub = []
    for key, rows in sorted(own.published_groups(load()).items()):
        eng = record_engine(rows[0])[0]
        if all(C.runs_tensorrt_engines(r) for r in rows):
            eng = C.without_host_costs(eng, C.CPP_RUNTIME)
        pub.append((key, user.prepare(rows, eng), len({r["model"] for r in rows}) == 1))
    log(f"{len(sil)} deployments, {len(pub)} published groups")
    return sil, pub


def _median(errors) -> float:
    return float(np.median(errors)) if errors else float("nan")


def scores(sil, pub, sd, draws: int = 5) -> dict:
    """Held-out ``|predicted/measured - 1|`` under prior spreads ``sd``: median and p90 of the
    deployments' other runs per k, and the published groups' (all, one model, several)."""
    from dcost.calibrate import user

    out: dict = {}
    rng = np.random.default_rng(0)
    for k in KS:
        err: list = []
        for _, prep in sil:
            if prep.n <= k:
                continue
            pick = np.zeros(prep.n, bool)
            pick[rng.choice(prep.n, k, replace=False)] = True
            z = user.fit_offsets(prep, pick, prior_sd=sd)[0]
            err += np.abs(user.predict_offsets(prep, z)[~pick] / prep.measured[~pick] - 1).tolist()
        out[f"silicon_k{k}"] = {
            "rows": len(err),
            "median": _median(err),
            "p90": float(np.quantile(err, 0.9)) if err else float("nan"),
        }
    rng = np.random.default_rng(0)
    for k in KS:
        err, one, several = [], [], []
        for _, prep, single in pub:
            if prep.n <= k:
                continue
            for _ in range(draws):
                pick = np.zeros(prep.n, bool)
                pick[rng.choice(prep.n, k, replace=False)] = True
                z = user.fit_offsets(prep, pick, prior_sd=sd)[0]
                e = np.abs(user.predict_offsets(prep, z)[~pick] / prep.measured[~pick] - 1)
                err += e.tolist()
                (one if single else several).extend(e.tolist())
        out[f"published_k{k}"] = {
            "rows": len(err),
            "median": _median(err),
            "p90": float(np.quantile(err, 0.9)) if err else float("nan"),
            "one_model": _median(one),
            "several_models": _median(several),
        }
    return out


def empirical_bayes(sil) -> np.ndarray:
    """Each field's spread: the root mean square over ``sil``'s deployments of the offsets all
    their runs fit under the shipped prior (at least ``FLOOR``)."""
    from dcost.calibrate import user

    z = np.array([user.fit_offsets(prep)[0] for _, prep in sil])
    return np.maximum(np.sqrt(np.mean(z**2, axis=0)), FLOOR)


def compute(log=print) -> dict:
    from dcost.calibrate import user

    t0 = time.perf_counter()
    sil, pub = prepared(log)
    base = user._prior_sd()
    by_scale = {}
    for s in SCALES:
        by_scale[f"{s:g}"] = scores(sil, pub, base * s)
        log(f"scale {s:g}: {by_scale[f'{s:g}']['silicon_k3']}")
    halves = (sil[0::2], sil[1::2])
    cross = []
    for fit_on, check in (halves, halves[::-1]):
        sd = empirical_bayes(fit_on)
        cross.append(
            {
                "prior_sd": dict(zip(user.FIELDS, sd.tolist(), strict=True)),
                "empirical_bayes": scores(check, pub, sd),
                "shipped": scores(check, pub, base),
            }
        )
    return {
        "split": (
            "a deployment's other runs, k of them calibrating (one seeded draw, the same for "
            "every prior); published groups' other runs, 5 draws; the empirical-Bayes spreads "
            "set on one half of the deployments and checked on the other"
        ),
        "fields": list(user.FIELDS),
        "shipped_prior_sd": dict(zip(user.FIELDS, base.tolist(), strict=True)),
        "scales": by_scale,
        "empirical_bayes_cross": cross,
        "seconds": time.perf_counter() - t0,
    }


def main() -> None:
    table = compute()
    OUT.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {OUT.relative_to(ROOT)} in {table['seconds']:.0f} s")


if __name__ == "__main__":
    main()
