"""Where pure physics is not a bound on the silicon sample's TPOT, and why (issue 28).

Claim: pure physics (every chip at its datasheet peaks, no fixed costs, the run's stated layout,
batch and lengths) takes no longer than what an engine measured. On the TPOT rows of
AIConfigurator's silicon sample that dcost expresses (``dcost.validation.silicon.records``) it
fails on a few (``heldout.toml``'s ``bound_holds``); each is named here with the first of these
that explains it:

1. **prompt work in TTFT**: the pure decode step alone (``dcost.decode`` at the running
   sequences the validation gives the run, ``silicon.running_sequences`` with no engine) is
   within the measured TPOT; what pure physics adds to a token's time, the prompt tokens of the
   steady state (``input_per_output`` prompt tokens a token), the run did not pay there: its
   clients moved in lockstep waves or queued, and the prompts' steps fell in their TTFT.
2. **queued**: the run's own TTFT says fewer sequences decoded at once than the validation
   runs. In a closed loop of ``C`` clients a request spends its TTFT ``T_1`` waiting and
   prefilling and ``(O - 1)`` TPOTs ``t`` decoding, so by Little's law on the decode phase

   .. math:: R = C \\frac{(O - 1)\\, t}{T_1 + (O - 1)\\, t}

   decode at once; the pure decode step of ``R`` sequences is within the measured TPOT. (``R``
   uses the run's measurements, so it explains the row; no prediction uses it.)
3. **KV cache assumed bf16**: the sample does not state the KV cache's precision, and the
   validation assumes bf16 (``assumed`` in the record); with an fp8 cache the pure decode step
   of ``R`` sequences is within the measured TPOT.
4. **not as stated**: the pure decode step of ``R`` sequences (in fp8 where the cache's
   precision is assumed) still takes longer: the run computed less than its row says
   (speculative decoding that the sample does not state, most likely:
   ``silicon.SPECULATIVE_SUSPECTED`` counts out the runs it names, not these).

Nothing is fitted.

    python experiments/bound_failures.py
"""

from __future__ import annotations

import collections
import time

import _common as C  # puts the checkout's dcost first on the path
import numpy as np

import dcost
from dcost.validation import silicon
from dcost.validation.cases import case

REASONS = ("prompt work in TTFT", "queued", "KV cache assumed bf16", "not as stated")


def little_running(clients: float, output: float, ttft: float, tpot: float) -> float:
    """Sequences decoding at once in a closed loop of ``clients`` (Little's law on the decode
    phase): ``C (O - 1) t / (T_1 + (O - 1) t)``.

    >>> little_running(10, 101, 1.0, 0.01)  # decoding 1 s of every 2 s: half the clients
    5.0
    """
    decoding = (output - 1.0) * tpot
    return clients * decoding / (ttft + decoding)


def _decode_tpot(record: dict, running: float) -> float:
    """Pure physics' decode step (s) of ``record``'s deployment at ``running`` sequences."""
    c = case(dict(record, concurrency=max(1, int(round(running)))), calibrated=False)
    return float(dcost.decode(c.design, c.hardware, c.model, c.workload).tpot)


def compute() -> dict:
    t0 = time.perf_counter()
    recs, _ = silicon.records()
    tpot = [r for r in recs if r["metric"] == "tpot"]
    pred = silicon.predict_all(tpot, family=False)
    ttft = {
        "silicon-" + row["id"]: float(row["silicon_ttft_ms"]) / 1e3
        for row in silicon.load_rows()
        if row.get("silicon_ttft_ms")
    }
    rows = []
    for i, r in enumerate(tpot):
        if pred.pure[i] <= pred.measured[i] * (1.0 + 1e-6):
            continue
        plain = {k: v for k, v in r.items() if k != "mode"}
        first = case(plain, calibrated=False)
        stated = silicon.running_sequences(first, plain, None)
        measured = float(pred.measured[i])
        t1 = ttft.get(r["id"].removesuffix("-tpot"))
        decode_stated = _decode_tpot(plain, stated)
        running = None if t1 is None else little_running(
            r["concurrency"], r["output_tokens"], t1, measured
        )  # fmt: skip
        decode_little = None if running is None else _decode_tpot(plain, running)
        kv_assumed = "kv_cache" in r.get("assumed", ()) and r["kv_cache"] != "fp8"
        decode_fp8 = (
            _decode_tpot(dict(plain, kv_cache="fp8"), stated if running is None else running)
            if kv_assumed
            else None
        )
        if decode_stated <= measured:
            reason = REASONS[0]
        elif decode_little is not None and decode_little <= measured:
            reason = REASONS[1]
        elif decode_fp8 is not None and decode_fp8 <= measured:
            reason = REASONS[2]
        else:
            reason = REASONS[3]
        rows.append(
            {
                "id": r["id"],
                "engine": r["engine"],
                "engine_version": r.get("engine_version"),
                "hardware": r["hardware"],
                "model": r["model"],
                "clients": r["concurrency"],
                "prompt_tokens": r["prompt_tokens"],
                "output_tokens": r["output_tokens"],
                "measured_tpot": measured,
                "measured_ttft": t1,
                "pure_over_measured": float(pred.pure[i] / measured),
                "running_stated": stated,
                "decode_stated_over_measured": decode_stated / measured,
                "running_little": running,
                "decode_little_over_measured": (
                    None if decode_little is None else decode_little / measured
                ),
                "decode_fp8_kv_over_measured": (
                    None if decode_fp8 is None else decode_fp8 / measured
                ),
                "assumed": list(r.get("assumed", ())),
                "reason": reason,
            }
        )
    count = collections.Counter(x["reason"] for x in rows)
    return {
        "source": tpot[0]["source"],
        "rows": len(tpot),
        "bound_holds": len(tpot) - len(rows),
        "by_reason": {k: count.get(k, 0) for k in REASONS},
        "failures": rows,
        "seconds": time.perf_counter() - t0,
    }


def plot(results: dict):
    from matplotlib.patches import Patch

    rows = sorted(results["failures"], key=lambda x: x["pure_over_measured"])
    fig, ax = C.plt.subplots(figsize=(8.5, 0.28 * len(rows) + 2.4))
    y = np.arange(len(rows))
    colors = dict(zip(REASONS, ("#1f77b4", "#ff7f0e", "#9467bd", "#d62728"), strict=True))
    ax.barh(y, [x["pure_over_measured"] for x in rows], color=[colors[x["reason"]] for x in rows])
    stated = ax.scatter(
        [x["decode_stated_over_measured"] for x in rows], y, marker="|", color="k", s=60,
        zorder=3,
    )  # fmt: skip
    little = [(x["decode_little_over_measured"], j) for j, x in enumerate(rows)]
    by_little = ax.scatter(
        [v for v, _ in little if v is not None], [j for v, j in little if v is not None],
        marker="o", facecolor="none", color="k", s=22, zorder=3,
    )  # fmt: skip
    ax.axvline(1.0, color="grey", lw=1)
    labels = [
        f"{x['model']} {x['hardware']} {x['engine']} {x['engine_version'] or ''} "
        f"{x['prompt_tokens']:.0f}/{x['output_tokens']:.0f} c{x['clients']}"
        for x in rows
    ]
    ax.set_yticks(y, labels, fontsize=7)
    ax.set_xscale("log")
    ticks = [0.25, 0.5, 1.0, 2.0, 4.0]
    ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("pure physics / measured TPOT (log scale; above 1: not a bound)")
    handles = [Patch(color=c, label=f"{r} ({results['by_reason'][r]})") for r, c in colors.items()]
    handles += [stated, by_little]
    names = [h.get_label() for h in handles[:-2]] + [
        "decode step alone, the batch the validation runs",
        "decode step alone, the batch from Little's law",
    ]
    ax.legend(handles, names, fontsize=7, loc="upper center", bbox_to_anchor=(0.4, -0.09), ncol=2)
    ax.set_title(
        f"Pure physics is a bound on {results['bound_holds']:,} of {results['rows']:,} silicon\n"
        "TPOT runs: the others, and why",
        fontsize=10,
    )
    fig.tight_layout()
    return fig


def main() -> None:
    results = compute()
    for x in results["failures"]:
        print(f"{x['pure_over_measured']:5.2f} {x['reason']:20s} {x['id']}")
    print(results["by_reason"], f"{results['seconds']:.0f} s")
    C.save("bound_failures", plot(results), results)


if __name__ == "__main__":
    main()
