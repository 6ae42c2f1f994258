"""``make demo``: the default scenario, evaluated over batch 1..16384 in one vmapped call.

deepseek-v3 on gb200-nvl72, 72 chips in one NVLink domain, mean context 8192 tokens. Prints a table
of the terms at a few batches and saves ``docs/figures/demo_batch_curve.png``.
"""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np

import dcost
from dcost.cli import format_table

SCENARIO = {"hardware": "gb200-nvl72", "model": "deepseek-v3", "chips": 72, "context": 8192}
FIGURE = pathlib.Path("docs/figures/demo_batch_curve.png")


def batch_sweep(hardware, model, workload, chips, batches):
    """Exact decode reports for every batch in ``batches`` (one jitted, vmapped call)."""
    f = jax.jit(jax.vmap(lambda b: dcost.decode(dcost.Design(batch=b, chips=chips), hardware,
                                                model, workload)))
    return f(batches)


def knee(batches, report):
    """Smallest batch whose exact step is compute bound (None when none is)."""
    bound = np.asarray(report.t_compute) >= np.asarray(report.t_weights + report.t_kv)
    return float(np.asarray(batches)[np.argmax(bound)]) if bound.any() else None


def main(path=FIGURE):
    h, m = dcost.presets.pair(SCENARIO["hardware"], SCENARIO["model"])
    w = dcost.Workload(SCENARIO["context"])
    batches = jnp.unique(jnp.round(jnp.logspace(0, np.log10(16384), 200)))
    r = batch_sweep(h, m, w, float(SCENARIO["chips"]), batches)
    bstar = float(dcost.balance_batch(h, m, w.context))
    k = knee(batches, r)
    print(f"{SCENARIO['model']} on {SCENARIO['hardware']}, {SCENARIO['chips']} chips, "
          f"context {SCENARIO['context']} tokens (exact model)")
    rows = []
    for b in (1, 16, 64, 256, 1024, 4096, 16384):
        i = int(np.argmin(np.abs(np.asarray(batches) - b)))
        rows.append([f"{b}", f"{float(r.t_compute[i]) * 1e3:.3f}",
                     f"{float(r.t_weights[i]) * 1e3:.3f}", f"{float(r.t_kv[i]) * 1e3:.3f}",
                     f"{float(r.t_comm[i]) * 1e3:.3f}", f"{float(r.tpot[i]) * 1e3:.3f}",
                     f"{float(r.cost_per_token[i]) * 1e6:.4g}",
                     f"{float(r.memory_per_chip[i]) / 1e9:.1f}"])
    print(format_table(rows, ["batch", "compute ms", "weights ms", "KV ms", "comm ms",
                              "tpot ms", "$/M tokens", "GB/chip"]))
    print(f"balance batch (closed form, all experts touched): {bstar:,.0f}")
    print(f"knee of the exact model: {k:,.0f}" if k
          else "the exact model never turns compute bound")
    from dcost.plots import batch_curve

    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    batch_curve(np.asarray(batches), r, balance=bstar, knee=k, path=path,
                capacity=float(h.hbm_capacity),
                title=f"{SCENARIO['model']} on {SCENARIO['chips']} x {SCENARIO['hardware']}, "
                      f"context {SCENARIO['context']:,} tokens")
    print(f"figure: {path}")


if __name__ == "__main__":
    main()
