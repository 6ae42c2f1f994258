"""Batches leave like trains: worst-case latency 2 tau, mean 1.5 tau, against a simulation.

Claim (lecture): if a batch leaves every ``tau`` (the latency floor, ~20 ms) and its step takes
``tau``, a request waits for the next departure, uniformly ``0..tau``, then rides one step: the
worst latency is ``2 tau`` and the mean ``1.5 tau``.

Setting: ``dcost.serving.queueing.simulate_departures``
with Poisson arrivals (the same unit-rate draws
scaled to every load, one vmapped call per policy), a constant step ``tau`` (memory-bound decode,
batches below the balance batch), at most ``CAPACITY`` requests per batch. Policies: ``fixed``
(the train timetable), ``when_free`` (leave as soon as the previous batch is done and someone
waits) and ``when_full`` (leave when the batch is full). Load is ``lambda tau``, the requests
arriving per step time.

Run: ``python experiments/train_departures.py``.
"""

from __future__ import annotations

import functools

import _common as C
import jax
import jax.numpy as jnp
import numpy as np

from dcost.serving.queueing import POLICIES, poisson_gaps, simulate_departures, train_latency

TAU = 0.020  # s, the latency floor of latency_floor.py, about M/BW
CAPACITY = 256.0  # requests per batch
HIST_LOAD = 30.0  # requests per tau for the histogram


@functools.partial(jax.jit, static_argnames=("policy", "n_keep"))
def latency_by_load(unit_gaps, loads, *, policy, n_keep):
    """Mean and worst latency and mean batch size of the first ``n_keep`` requests, for each load
    (requests per tau), from the same unit-rate gaps: one vmapped simulation."""

    def run(load):
        d = simulate_departures(unit_gaps * TAU / load, TAU, policy=policy, capacity=CAPACITY)
        lat = d.latency[:n_keep]
        return lat.mean(), lat.max(), d.batch_size[:n_keep].mean()

    return jax.vmap(run)(loads)


def compute(n_requests=100_000, loads=None, seed=0):
    """Mean and worst latency per policy over ``loads`` (requests per tau), and a sample."""
    loads = np.logspace(-2, np.log10(200.0), 19) if loads is None else np.asarray(loads, float)
    unit = poisson_gaps(jax.random.PRNGKey(seed), 1.0, n_requests)
    keep = slice(0, n_requests - int(CAPACITY))  # drop the tail: the last batch may be partial
    out = {"tau_s": TAU, "capacity": CAPACITY, "load": loads, "n_requests": n_requests}
    for policy in POLICIES:
        mean, worst, size = latency_by_load(
            unit, jnp.asarray(loads), policy=policy, n_keep=keep.stop
        )
        out[policy] = {
            "mean_s": np.asarray(mean),
            "worst_s": np.asarray(worst),
            "mean_batch": np.asarray(size),
        }
    d = simulate_departures(unit * TAU / HIST_LOAD, TAU, policy="fixed", capacity=CAPACITY)
    out["hist"] = {
        "load": HIST_LOAD,
        "latency_s": np.asarray(d.latency[keep]),
        "wait_s": np.asarray(d.wait[keep]),
    }
    lat = out["hist"]["latency_s"]
    out["fixed_mean_over_tau"] = float(lat.mean() / TAU)
    out["fixed_worst_over_tau"] = float(lat.max() / TAU)
    out["closed_form_over_tau"] = [x / TAU for x in train_latency(TAU)]
    return out


def plot(res):
    fig, (ax_h, ax_l) = C.figure(2, width=6.2, height=4.8)
    tau = res["tau_s"]
    lat = res["hist"]["latency_s"] / tau
    ax_h.hist(
        lat,
        bins=60,
        range=(0.9, 2.1),
        density=True,
        color=C.COLORS["dense"],
        alpha=0.75,
        label=f"simulated, {lat.size:,} requests",
    )
    ax_h.plot(
        [0.9, 1, 1, 2, 2, 2.1],
        [0, 0, 1, 1, 0, 0],
        color="k",
        lw=1.5,
        label="closed form: tau + U[0, tau]",
    )
    mean, worst = res["fixed_mean_over_tau"], res["fixed_worst_over_tau"]
    ax_h.axvline(
        mean,
        color=C.COLORS["moe"],
        ls="--",
        lw=1.5,
        label=f"simulated mean {mean:.3f} tau (closed form 1.5)",
    )
    ax_h.axvline(
        worst,
        color=C.COLORS["orange"],
        ls="--",
        lw=1.5,
        label=f"simulated worst {worst:.3f} tau (closed form 2)",
    )
    ax_h.set(
        xlabel=f"latency / tau (tau = {tau * 1e3:.0f} ms step and interval)",
        ylabel="probability density (1 / tau)",
        ylim=(0, 1.45),
        title=f"Fixed timetable, load {res['hist']['load']:.0f} requests per tau",
    )
    ax_h.legend(loc="upper left", fontsize=8.5)
    colors = {
        "fixed": C.COLORS["dense"],
        "when_free": C.COLORS["alt"],
        "when_full": C.COLORS["moe"],
    }
    labels = {
        "fixed": "fixed: leave every tau",
        "when_free": "when free: leave when the last batch is done",
        "when_full": f"when full: leave at {res['capacity']:.0f} requests",
    }
    for p in ("fixed", "when_free", "when_full"):
        ax_l.semilogx(
            res["load"],
            res[p]["mean_s"] / tau,
            "-o",
            ms=3.5,
            color=colors[p],
            label=labels[p] + " (mean)",
        )
        ax_l.semilogx(
            res["load"],
            res[p]["worst_s"] / tau,
            "--",
            color=colors[p],
            lw=1.3,
            label="    worst (max over requests)",
        )
    for y, text in ((1.5, "mean 1.5 tau"), (2.0, "worst 2 tau")):
        ax_l.axhline(y, color="k", lw=0.8, ls=":")
        ax_l.text(res["load"][-1], y + 0.04, text, fontsize=8.5, ha="right")
    full = res["when_full"]["mean_s"] / tau
    ax_l.text(
        res["load"][0],
        3.6,
        f"when full, mean: {full[0]:,.0f} tau at load "
        f"{res['load'][0]:g}, {full[-1]:.2f} tau at {res['load'][-1]:.0f}\n"
        "(it waits for (capacity - 1) / (2 x load) tau to fill)",
        fontsize=8.5,
        color=colors["when_full"],
        va="top",
    )
    ax_l.set(
        xlabel="load (requests arriving per tau)",
        ylabel="latency / tau",
        title="Dispatch policies (Poisson arrivals, constant step tau)",
        ylim=(0.8, 3.7),
    )
    ax_l.legend(loc="upper left", fontsize=8, bbox_to_anchor=(0.0, 0.8))
    fig.suptitle("Trains of batches: wait for the next departure, then ride one step", fontsize=12)
    fig.tight_layout()
    return fig


def summary(res):
    out = {
        "lecture": {"mean_over_tau": 1.5, "worst_over_tau": 2.0},
        "tau_s": res["tau_s"],
        "capacity": res["capacity"],
        "n_requests": res["n_requests"],
        "fixed_at_load": res["hist"]["load"],
        "fixed_mean_over_tau": res["fixed_mean_over_tau"],
        "fixed_worst_over_tau": res["fixed_worst_over_tau"],
        "by_load": {},
    }
    for i, load in enumerate(res["load"]):
        out["by_load"][f"{load:.3g}"] = {
            p: {
                "mean_over_tau": res[p]["mean_s"][i] / res["tau_s"],
                "worst_over_tau": res[p]["worst_s"][i] / res["tau_s"],
                "mean_batch": res[p]["mean_batch"][i],
            }
            for p in POLICIES
        }
    return out


def main():
    res = compute()
    C.save("train_departures", plot(res), summary(res))


if __name__ == "__main__":
    main()
