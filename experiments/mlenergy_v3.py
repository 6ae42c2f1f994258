"""The ML.ENERGY Benchmark v3's whole runs against dcost: power, energy and time between tokens.

Claim (issues 32 and 28): on measured runs no step-time fit saw, dcost's power per GPU (its
activity coefficients fitted on the other models' runs) is within 10 % at the median, and its
energy per output token within 15 % (p90 35 %); the vLLM engine profile's decode step is at least
as close to the measured time between tokens as the per-family profile.

Setting: the leaderboard's published task files (``dcost/validation/mlenergy_v3.csv``, vLLM 0.11.1
on H100 and B200), the 346 runs whose model is a preset (``dcost.validation.energy.
mlenergy_records``; the prompt length is assumed per task). Power and energy: the family profile's
step times and the activity coefficients of ``dcost.calibrate.power.fit_runs`` on every other
model's runs (leave one model out). Time between tokens: each run's measured median against
``dcost.decode`` at its measured mean running batch and a context of its prompt and half its
output, with the family profile (``calibrated=True``) and with the shipped vLLM profile of its chip
(``dcost.engine("vllm", hardware=...)``, built from vLLM 0.24 kernel tables: a newer vLLM than the
runs'). Nothing is fitted to the time between tokens.

    python experiments/mlenergy_v3.py
"""

from __future__ import annotations

import _common as C
import numpy as np

import dcost
from dcost.calibrate import power as calib
from dcost.validation import energy as ev
from dcost.validation.cases import case

CHIPS = {"h100-sxm": "H100", "b200": "B200"}


def _stats(ratio) -> dict:
    r = np.asarray(ratio, float)
    e = np.abs(r - 1.0)
    return {
        "n": int(r.size),
        "median": float(np.median(e)),
        "p90": float(np.percentile(e, 90)),
        "bias": float(np.median(r)),
    }


def _itl(records) -> dict[str, np.ndarray]:
    """Measured median time between tokens and the decode step of each profile (s)."""
    engines = {h: dcost.engine("vllm", hardware=h) for h in CHIPS}
    out: dict[str, list] = {"measured": [], "family": [], "engine": []}
    for r in records:
        quoted = dict(part.split("=", 1) for part in r["quote"].split(", "))
        out["measured"].append(float(quoted["median_itl_ms"]) / 1e3)
        run = dict(r, metric="output_throughput_per_gpu", value=1.0)
        fam = case(run, calibrated=True)
        out["family"].append(
            float(dcost.decode(fam.design, fam.hardware, fam.model, fam.workload).tpot)
        )
        pure = case(run)
        step = dcost.decode(
            pure.design, pure.hardware, pure.model, pure.workload, engine=engines[r["hardware"]]
        )
        out["engine"].append(float(step.tpot))
    return {k: np.asarray(v) for k, v in out.items()}


def compute() -> dict:
    records = [r for r in ev.mlenergy_records()[0] if r["metric"] == "power_per_gpu"]
    f = calib.run_features(records=ev.mlenergy_records()[0])
    held = calib.held_out_runs(f)
    itl = _itl(records)
    moe = np.array([float(dcost.model(m).n_experts) > 0 for m in f["model"]])
    groups = {"all": np.ones(len(moe), bool), "dense": ~moe, "moe": moe}
    groups.update({h: f["hardware"] == h for h in CHIPS})
    ratios = {
        "power_per_gpu": held["power"] / f["power"],
        "energy_per_output_token": held["energy"] / f["energy"],
        "itl_family": itl["family"] / itl["measured"],
        "itl_engine": itl["engine"] / itl["measured"],
    }
    summary = {k: {g: _stats(v[sel]) for g, sel in groups.items()} for k, v in ratios.items()}
    return {
        "runs": len(records),
        "summary": summary,
        "fit": calib.fit_runs(f),
        "hardware": f["hardware"].tolist(),
        "moe": moe.tolist(),
        "measured": {"power": f["power"], "energy": f["energy"], "itl": itl["measured"]},
        "predicted": {
            "power": held["power"],
            "energy": held["energy"],
            "itl_family": itl["family"],
            "itl_engine": itl["engine"],
        },
    }


def plot(res):
    fig, axes = C.figure(3, width=5.0, height=4.6)
    hw = np.asarray(res["hardware"])
    moe = np.asarray(res["moe"], bool)
    panels = [
        ("power", "power", "power_per_gpu", "W per GPU", "mean power per GPU (W)"),
        ("energy", "energy", "energy_per_output_token", "J per output token",
         "energy per output token (J)"),
        ("itl", "itl_engine", "itl_engine", "time between tokens",
         "median time between tokens (s)"),
    ]  # fmt: skip
    for ax, (m_key, p_key, s_key, what, label) in zip(axes, panels, strict=True):
        meas = np.asarray(res["measured"][m_key], float)
        pred = np.asarray(res["predicted"][p_key], float)
        for chip, colour in (("h100-sxm", C.COLORS["dense"]), ("b200", C.COLORS["moe"])):
            for is_moe, marker in ((False, "o"), (True, "^")):
                sel = (hw == chip) & (moe == is_moe)
                kind = "MoE" if is_moe else "dense"
                ax.scatter(meas[sel], pred[sel], s=14, marker=marker, color=colour, alpha=0.6,
                           label=f"{CHIPS[chip]}, {kind}")  # fmt: skip
        if p_key == "itl_engine":
            ax.scatter(meas, np.asarray(res["predicted"]["itl_family"]), s=6, marker="x",
                       color=C.COLORS["grey"], alpha=0.5, label="family profile")  # fmt: skip
        lo, hi = float(np.min([meas.min(), pred.min()])), float(np.max([meas.max(), pred.max()]))
        line = np.array([lo / 1.2, hi * 1.2])
        ax.plot(line, line, color="k", lw=1)
        for k in (0.8, 1.25):
            ax.plot(line, k * line, color="k", lw=0.6, ls=":")
        ax.set_xscale("log")
        ax.set_yscale("log")
        s = res["summary"][s_key]["all"]
        source = "vLLM profile" if p_key == "itl_engine" else "held out by model"
        ax.set_title(f"{what} ({source}): median {100 * s['median']:.1f} %, p90 "
                     f"{100 * s['p90']:.0f} %", fontsize=10)  # fmt: skip
        ax.set_xlabel(f"measured {label}")
        ax.set_ylabel(f"dcost {label}")
    axes[0].legend(loc="upper left")
    axes[2].legend(loc="upper left")
    fig.suptitle(
        f"ML.ENERGY Benchmark v3: {res['runs']} vLLM 0.11.1 runs (dotted: 0.8x and 1.25x)", y=1.02
    )
    fig.tight_layout()
    return fig


def main():
    res = compute()
    C.save("mlenergy_v3", plot(res), res)
    for key, s in res["summary"].items():
        a = s["all"]
        print(f"{key:26s} n={a['n']} median {100 * a['median']:.1f} % p90 "
              f"{100 * a['p90']:.1f} % bias {a['bias']:.2f}")  # fmt: skip


if __name__ == "__main__":
    main()
