"""Plumbing shared by the experiments: where results go, how they are saved, a few spec helpers.

Every experiment is ``experiments/<name>.py`` with ``compute() -> dict`` (numbers only, no
plotting), ``plot(results) -> Figure`` and ``main()``, which saves
``experiments/results/<name>.png`` and ``experiments/results/<name>.json``.
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
# `python experiments/x.py` from a checkout uses that checkout's dcost
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import dcost  # noqa: E402

RESULTS = ROOT / "experiments" / "results"

COLORS = {
    "dense": "#1f77b4",
    "moe": "#d62728",
    "alt": "#2ca02c",
    "grey": "#7f7f7f",
    "extra": "#9467bd",
    "orange": "#ff7f0e",
}


def log_batches(high: float, n: int = 240) -> jnp.ndarray:
    """Whole batch sizes from 1 to ``high``, roughly log-spaced (duplicates removed)."""
    return jnp.asarray(np.unique(np.round(np.logspace(0.0, np.log10(high), n))))


def ratio_stats(ratios) -> dict:
    """``{"runs", "median", "p90", "bias"}`` of predicted-over-measured ``ratios``: the median
    and 90th percentile of ``|ratio - 1|`` and the median ratio."""
    r = np.asarray(ratios, float)
    err = np.abs(r - 1.0)
    return {
        "runs": int(r.size),
        "median": float(np.median(err)),
        "p90": float(np.percentile(err, 90)),
        "bias": float(np.median(r)),
    }


def jsonable(x):
    """Arrays to lists, scalars to floats, non-finite numbers to the strings "inf"/"nan"."""
    if isinstance(x, dict):
        return {str(k): jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [jsonable(v) for v in x]
    if isinstance(x, (str, bool)) or x is None:
        return x
    if isinstance(x, (int, np.integer)):
        return int(x)
    arr = np.asarray(x)
    if arr.ndim > 0:
        return [jsonable(v) for v in arr.tolist()]
    v = float(arr)
    if math.isfinite(v):
        return float(f"{v:.6g}")
    return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")


def save(name: str, fig, summary: dict, directory: pathlib.Path = RESULTS):
    """Write ``<name>.png`` (150 dpi) and ``<name>.json`` (``summary``) under ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    png, js = directory / f"{name}.png", directory / f"{name}.json"
    fig.savefig(png, dpi=150, bbox_inches="tight")
    plt.close(fig)
    js.write_text(json.dumps(jsonable(summary), indent=2) + "\n", encoding="utf-8")
    print(f"wrote {_show(png)} and {_show(js)}")
    return png, js


def _show(path: pathlib.Path) -> str:
    """``path`` relative to the checkout when it is inside it."""
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)


@jax.jit
def decode_sweep(batch, chips, stages, hardware, model, context):
    """Exact ``dcost.decode`` over broadcast arrays of batch, chips, stages and context.

    One jitted, vmapped call; the specs are arguments (not closed over), so later calls with the
    same shapes reuse the compiled code. Returns a ``Report`` of the broadcast shape.
    """
    b, g, p, t = jnp.broadcast_arrays(
        *(jnp.asarray(x, dtype=jnp.result_type(float)) for x in (batch, chips, stages, context))
    )

    def one(b, g, p, t):
        return dcost.decode(
            dcost.Design(batch=b, chips=g, stages=p), hardware, model, dcost.Workload(t)
        )

    r = jax.vmap(one)(b.ravel(), g.ravel(), p.ravel(), t.ravel())
    return jax.tree.map(lambda x: x.reshape(b.shape), r)


def figure(ncols: int = 2, width: float = 6.0, height: float = 4.6, nrows: int = 1):
    """``nrows`` x ``ncols`` axes (a flat list, row by row) with the house style."""
    plt.rcParams.update(
        {
            "font.size": 10.5,
            "axes.titlesize": 11.5,
            "legend.fontsize": 9,
            "axes.grid": True,
            "grid.alpha": 0.3,
        }
    )
    fig, axes = plt.subplots(nrows, ncols, figsize=(width * ncols, height * nrows), squeeze=False)
    return fig, list(axes.ravel())


# A record that names the TensorRT version its TensorRT-LLM engines were built with ran them
# under TensorRT-LLM's C++ runtime (MLPerf's v5.1 Llama submissions), not the PyTorch backend
# whose Python executor the engine profiles' host costs were fitted on.
_TENSORRT_ENGINES = re.compile(r"TensorRT-LLM \(TensorRT \d")
CPP_RUNTIME = ("prefill_step_overhead", "sequence_overhead")
"""The profile's host costs TensorRT-LLM's C++ runtime does not pay (assumed 0): a step with
prompt tokens runs inside the built engine, and no Python work is done per sequence."""


def runs_tensorrt_engines(record) -> bool:
    """Whether ``record``'s note says it ran TensorRT engines ("TensorRT-LLM (TensorRT 10.8)").

    >>> runs_tensorrt_engines({"note": "... TensorRT-LLM (TensorRT 10.11). Nebius's config"})
    True
    >>> runs_tensorrt_engines({"note": "TensorRT-LLM 1.2 (PyTorch backend)"})
    False
    """
    return bool(_TENSORRT_ENGINES.search(record.get("note", "")))


def without_host_costs(engine, fields):
    """``engine`` without the profile's host costs ``fields``: ``prefill_step_overhead`` through
    the engine's launch (``Scheduler.prompt_graphs``), any other set to 0
    (``Engine.with_profile``)."""
    import dataclasses

    if "prefill_step_overhead" in fields:
        engine = dataclasses.replace(
            engine, scheduler=dataclasses.replace(engine.scheduler, prompt_graphs=True)
        )
    rest = {field: 0.0 for field in fields if field != "prefill_step_overhead"}
    return engine.with_profile(rest) if rest else engine
