"""Fit the power model's activity coefficients on measured kernel power, and check them held out.

The data: AIConfigurator's B200 kernel tables (ai-dynamo/aiconfigurator, the ``aiconfigurator-core``
0.12.0 wheel on PyPI, Apache-2.0, ``systems/data/b200_sxm/{attention,moe}/vllm/0.22.0/``) measure
each kernel's ``latency`` (ms) with the GPU's mean ``power`` (W) under its ``power_limit``
(1,000 W). ``dcost/validation/power_kernels.csv`` is a small cut of three of those tables
(``cut_fixture`` makes it from an unpacked wheel): context attention (prefill, compute-bound),
generation attention (decode, HBM-bound) and the fused MoE layer (both).

Per row, from its shape (``features``):

    u_F = FLOPs / (F_peak * latency)      u_M = bytes / (BW_peak * latency)
    P / P_limit = r + (1 - r) * (1 - exp(-(c_F u_F + c_M u_M)))

with the B200's datasheet rates (``dcost.hardware("b200")``: 2.25 PFLOP/s bf16, 4.5 fp8, 7.7 TB/s).
``fit`` finds ``(r, c_F, c_M)`` by Gauss-Newton on relative errors; ``held_out`` refits without
one kernel type and predicts it (leave one kernel type out). Each row's power is one reading of
the board's sensor over a short loop of one kernel: consecutive rows of the table are correlated
(lag-1 correlation 0.8 in context attention: the sensor lags and the board heats), so a single
row is noisy and the per-row errors are large; ``summary`` reports them as they are.
"""

from __future__ import annotations

import csv
import importlib
import math
from collections.abc import Mapping, Sequence
from importlib import resources
from pathlib import Path

import numpy as np

__all__ = [
    "FIXTURE",
    "KERNELS",
    "load_fixture",
    "features",
    "fit",
    "predict",
    "held_out",
    "summary",
    "cut_fixture",
    "run_features",
    "predict_runs",
    "fit_runs",
    "held_out_runs",
]

FIXTURE = "power_kernels.csv"
KERNELS = ("context_attention", "generation_attention", "moe")
_TABLES = {
    "context_attention": "attention/vllm/0.22.0/context_attention_perf.parquet",
    "generation_attention": "attention/vllm/0.22.0/generation_attention_perf.parquet",
    "moe": "moe/vllm/0.22.0/moe_perf.parquet",
}
_COLUMNS = (
    "kernel",
    "batch_size",
    "isl",
    "step",
    "num_heads",
    "num_key_value_heads",
    "head_dim",
    "kv_cache_dtype",
    "num_tokens",
    "hidden_size",
    "inter_size",
    "topk",
    "num_experts",
    "moe_tp_size",
    "moe_ep_size",
    "moe_dtype",
    "latency_ms",
    "power_w",
    "power_limit_w",
)
# B200 datasheet rates (dcost/presets/hardware.toml, [b200]): dense bf16 and fp8 FLOP/s, HBM bytes/s
_B200 = {"bf16": 2.25e15, "fp8": 4.5e15, "hbm": 7.7e12}


def load_fixture(path: str | Path | None = None) -> list[dict]:
    """The fixture's rows (dicts of strings; ``#`` lines are its provenance header)."""
    if path is None:
        text = resources.files("dcost.validation").joinpath(FIXTURE).read_text(encoding="utf-8")
    else:
        text = Path(path).read_text(encoding="utf-8")
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    return list(csv.DictReader(lines))


def _f(row: Mapping, name: str) -> float:
    return float(row[name])


def features(rows: Sequence[Mapping]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(u_F, u_M, p)`` per row: compute and HBM utilisation of the B200 and measured power over
    the power limit.

    FLOPs and bytes (bf16 activations, 2 bytes; the KV cache and weights in their own format):
      context attention, causal: ``2 b h d s^2`` FLOPs; ``b s d (2*2 h + 2 h_kv b_kv)`` bytes.
      generation attention over ``c = isl + step`` tokens: ``4 b h d c`` FLOPs;
        ``2 b c h_kv d b_kv`` bytes.
      MoE layer of ``T`` tokens, ``k`` of ``E`` experts, hidden ``H``, intermediate ``I``, split
        ``tp x ep``: ``6 T k H I / (tp ep)`` FLOPs; ``(E/ep) (1 - (1 - k/E)^T) 3 H I / tp b_w``
        bytes of the experts the tokens touch.
    """
    uf, um, p = [], [], []
    for r in rows:
        t = _f(r, "latency_ms") * 1e-3
        kind = r["kernel"]
        if kind in ("context_attention", "generation_attention"):
            b, h, hk = (_f(r, k) for k in ("batch_size", "num_heads", "num_key_value_heads"))
            d = _f(r, "head_dim")
            b_kv = 1.0 if r["kv_cache_dtype"] == "fp8" else 2.0
            rate = _B200["bf16"]
            if kind == "context_attention":
                s = _f(r, "isl")
                flops = 2.0 * b * h * d * s * s
                nbytes = b * s * d * (4.0 * h + 2.0 * hk * b_kv)
            else:
                c = _f(r, "isl") + _f(r, "step")
                flops = 4.0 * b * h * d * c
                nbytes = 2.0 * b * c * hk * d * b_kv
        elif kind == "moe":
            n, hid, inter, k, e, tp, ep = (
                _f(r, x)
                for x in (
                    "num_tokens",
                    "hidden_size",
                    "inter_size",
                    "topk",
                    "num_experts",
                    "moe_tp_size",
                    "moe_ep_size",
                )
            )
            bf16 = r["moe_dtype"] == "bfloat16"
            rate = _B200["bf16"] if bf16 else _B200["fp8"]
            b_w = 2.0 if bf16 else 1.0
            flops = 6.0 * n * k * hid * inter / (tp * ep)
            touched = 1.0 - (1.0 - k / e) ** n
            nbytes = (e / ep) * touched * 3.0 * hid * inter / tp * b_w
        else:
            raise ValueError(f"power fixture: kernel = {kind!r} is not one of {KERNELS}")
        uf.append(flops / (rate * t))
        um.append(nbytes / (_B200["hbm"] * t))
        p.append(_f(r, "power_w") / _f(r, "power_limit_w"))
    return np.asarray(uf), np.asarray(um), np.asarray(p)


def predict(params: Sequence[float], u_f, u_m) -> np.ndarray:
    """``r + (1 - r) (1 - exp(-(c_F u_F + c_M u_M)))``: power over the limit, ``params = (r, c_F,
    c_M)``."""
    r, cf, cm = params
    return r + (1.0 - r) * -np.expm1(-(cf * np.asarray(u_f) + cm * np.asarray(u_m)))


def _gauss_newton(resid, z: np.ndarray, iterations: int) -> np.ndarray:
    """``z`` minimizing ``sum(resid(z)**2)``: Gauss-Newton steps with a Levenberg damping
    (Marquardt's diagonal scaling), the Jacobian by forward differences of 1e-6; a step is kept
    only when it lowers the loss (the damping then falls 3x, else it rises 10x)."""
    damping, loss = 1e-3, float(np.sum(resid(z) ** 2))
    for _ in range(iterations):
        r0 = resid(z)
        jac = np.empty((len(r0), len(z)))
        for i in range(len(z)):
            dz = np.zeros(len(z))
            dz[i] = 1e-6
            jac[:, i] = (resid(z + dz) - r0) / 1e-6
        a = jac.T @ jac
        step = np.linalg.solve(a + damping * np.diag(np.diag(a) + 1e-12), -(jac.T @ r0))
        new = float(np.sum(resid(z + step) ** 2))
        if new < loss:
            z, loss, damping = z + step, new, damping / 3.0
            if np.max(np.abs(step)) < 1e-9:
                break
        else:
            damping *= 10.0
    return z


def fit(rows: Sequence[Mapping], iterations: int = 100) -> tuple[float, float, float]:
    """``(r, c_F, c_M)`` minimizing the squared relative error of ``predict`` on ``rows``
    (Gauss-Newton with a Levenberg damping; ``c`` kept positive through their logs, ``r`` in
    (0, 1) through its logit)."""
    u_f, u_m, p = features(rows)
    z = np.array([math.log(0.4 / 0.6), math.log(3.0), math.log(0.3)])

    def params(z):
        return 1.0 / (1.0 + math.exp(-z[0])), math.exp(z[1]), math.exp(z[2])

    def resid(z):
        return predict(params(z), u_f, u_m) / p - 1.0

    return params(_gauss_newton(resid, z, iterations))


def errors(params: Sequence[float], rows: Sequence[Mapping]) -> np.ndarray:
    """``|predicted / measured - 1|`` of each row's power."""
    u_f, u_m, p = features(rows)
    return np.abs(predict(params, u_f, u_m) / p - 1.0)


def held_out(rows: Sequence[Mapping] | None = None) -> dict[str, dict[str, float]]:
    """Leave one kernel type out: fit on the other two, the errors on the one left out.

    Returns:
      ``{kernel: {"n", "median", "p90", "r", "c_F", "c_M"}}`` (errors as fractions).
    """
    rows = load_fixture() if rows is None else rows
    out = {}
    for kind in KERNELS:
        train = [r for r in rows if r["kernel"] != kind]
        test = [r for r in rows if r["kernel"] == kind]
        params = fit(train)
        e = errors(params, test)
        out[kind] = {
            "n": float(len(test)),
            "median": float(np.median(e)),
            "p90": float(np.percentile(e, 90)),
            "r": params[0],
            "c_F": params[1],
            "c_M": params[2],
        }
    return out


def summary(rows: Sequence[Mapping] | None = None) -> dict:
    """The fit on every row (its idle floor is what ``dcost.serving.power.IDLE_FRACTION`` ships;
    its coefficients, beside ``fit_runs``'s that ship, are for reference), its in-sample errors,
    and the leave-one-kernel-type-out errors (``held_out``)."""
    rows = load_fixture() if rows is None else rows
    params = fit(rows)
    e = errors(params, rows)
    return {
        "fit": {"r": params[0], "c_F": params[1], "c_M": params[2]},
        "in_sample": {
            "n": float(len(rows)),
            "median": float(np.median(e)),
            "p90": float(np.percentile(e, 90)),
        },
        "held_out": held_out(rows),
    }


def cut_fixture(root: str | Path, out: str | Path, per_kernel: int = 120, seed: int = 0) -> int:
    """Write the fixture from an unpacked ``aiconfigurator-core`` wheel's
    ``aiconfigurator_core/systems/data/b200_sxm`` folder (needs pyarrow): ``per_kernel`` rows of
    each table drawn at random (``seed``), full-attention rows only (``window_size = 0``), the MoE
    table's ``balanced`` routing in bf16, fp8 and fp8_block. Returns the rows written."""
    pq = importlib.import_module("pyarrow.parquet")  # not a dependency of dcost

    rng = np.random.default_rng(seed)
    lines = []
    for kind, rel in _TABLES.items():
        table = pq.read_table(Path(root) / rel).to_pydict()
        n = len(table["latency"])
        if kind == "moe":
            keep = [
                i
                for i in range(n)
                if table["distribution"][i] == "balanced"
                and table["moe_dtype"][i] in ("bfloat16", "fp8", "fp8_block")
            ]
        else:
            keep = [i for i in range(n) if table["window_size"][i] == 0]
        pick = sorted(rng.choice(keep, size=min(per_kernel, len(keep)), replace=False))
        for i in pick:
            row = {c: "" for c in _COLUMNS}
            row["kernel"] = kind
            for c in _COLUMNS[1:16]:
                if c in table:
                    row[c] = str(table[c][i])
            row["latency_ms"] = repr(float(table["latency"][i]))
            row["power_w"] = repr(float(table["power"][i]))
            row["power_limit_w"] = repr(float(table["power_limit"][i]))
            lines.append(row)
    header = (
        "# Measured GPU power of single kernels on an NVIDIA B200 (vLLM 0.22.0 kernels), a\n"
        "# random cut of three tables of AIConfigurator (github.com/ai-dynamo/aiconfigurator;\n"
        "# the aiconfigurator-core 0.12.0 wheel on PyPI, Apache-2.0):\n"
        "# aiconfigurator_core/systems/data/b200_sxm/\n"
        "#   attention/vllm/0.22.0/context_attention_perf.parquet (window_size 0),\n"
        "#   attention/vllm/0.22.0/generation_attention_perf.parquet (window_size 0),\n"
        "#   moe/vllm/0.22.0/moe_perf.parquet (distribution balanced; bf16, fp8, fp8_block).\n"
        f"# {per_kernel} rows per table, numpy default_rng({seed}) without replacement, in\n"
        "# table order; made by dcost.calibrate.power.cut_fixture. Columns as in the tables;\n"
        "# latency in ms, power and power_limit in W; empty: not a column of that table.\n"
    )
    with open(out, "w", encoding="utf-8", newline="") as fh:
        fh.write(header)
        w = csv.DictWriter(fh, fieldnames=_COLUMNS, lineterminator="\n")
        w.writeheader()
        w.writerows(lines)
    return len(lines)


# ---------------------------------------------------------------- whole runs (ML.ENERGY v3)
#
# The kernel rows above time one kernel in a loop; a serving run mixes them, with the step's
# host gaps and its HBM traffic. The ML.ENERGY Benchmark v3 measured the mean power of whole vLLM
# runs (``dcost.validation.energy.mlenergy_records``: 346 runs of 11 models on H100 and B200,
# one to eight GPUs). Per run, from the step times of the calibrated family profile (or of an
# engine, ``run_features(engine_for=...)``):
#
#     P_x = P_idle + (P_max - P_idle) (1 - exp(-(c_F u_F,x + c_M (u_E,x + u_C,x))))
#     W per GPU   = (P_dec t_dec + P_pre t_pre) / (t_dec + t_pre)
#     J per token = G (P_dec t_dec + P_pre t_pre)
#
# for its decode steps and its prompts' prefill (``t_x``: seconds of each per output token of
# the replica; ``G`` its chips; ``u_E`` the HBM traffic in 16-bit elements,
# ``dcost.serving.power.element_time``). ``fit_runs`` finds ``(c_F, c_M)`` on the runs' power
# (the idle floor is the chip's preset); ``held_out_runs`` predicts each model's runs with a fit
# that never saw that model's architecture (leave one architecture out: Llama 3 and 3.3 70B are
# one).

_RUN_COLUMNS = ("uf_dec", "um_dec", "t_dec", "uf_pre", "um_pre", "t_pre", "idle", "max", "chips")


def run_features(
    records: Sequence[Mapping] | None = None, engine_for=None
) -> dict[str, np.ndarray]:
    """Per ``power_per_gpu`` record (default: ``mlenergy_records``'s): the utilisations and
    times above, the measured W per GPU (``power``) and J per output token (``energy``, of the
    record with the same id stem), and each run's ``model`` and ``hardware``.

    ``engine_for``: ``record -> dcost.Engine`` whose profile times the run's steps (``case(...,
    engine=...)``); None: the family profile of the record's chip."""
    from dcost.serving.power import energy
    from dcost.validation import energy as ev
    from dcost.validation.cases import case

    recs = ev.mlenergy_records()[0] if records is None else list(records)
    joules = {
        r["id"].rsplit("-", 1)[0]: float(r["value"])
        for r in recs
        if r["metric"] == "energy_per_output_token"
    }
    cols: dict[str, list] = {k: [] for k in (*_RUN_COLUMNS, "power", "energy", "model", "hardware")}
    for r in recs:
        if r["metric"] != "power_per_gpu":
            continue
        run = dict(r, metric="output_throughput_per_gpu", value=1.0)
        eng = None if engine_for is None else engine_for(r)
        c = case(run, calibrated=True) if eng is None else case(run, engine=eng)
        args = (c.design, c.hardware, c.model, c.workload)
        dec, pre = energy(*args, step="decode"), energy(*args, step="prefill")
        ratio = float(r["prompt_tokens"]) / float(r["output_tokens"])
        row = (
            float(dec.compute_utilisation),
            float(dec.memory_element_utilisation + dec.comm_utilisation),
            float(dec.energy_per_token / dec.power_per_replica),
            float(pre.compute_utilisation),
            float(pre.memory_element_utilisation + pre.comm_utilisation),
            ratio * float(pre.energy_per_token / pre.power_per_replica),
            float(c.hardware.idle_power),  # type: ignore[arg-type]  # every preset has both
            float(c.hardware.max_power),  # type: ignore[arg-type]
            float(dec.power_per_replica / dec.power_per_chip),
        )
        for k, v in zip(_RUN_COLUMNS, row, strict=True):
            cols[k].append(v)
        cols["power"].append(float(r["value"]))
        cols["energy"].append(joules.get(r["id"].rsplit("-", 1)[0], math.nan))
        cols["model"].append(r["model"])
        cols["hardware"].append(r["hardware"])
    return {k: np.asarray(v) for k, v in cols.items()}


def predict_runs(params: Sequence[float], f: Mapping[str, np.ndarray]):
    """``(W per GPU, J per output token)`` of each run of ``run_features`` under ``params =
    (c_F, c_M)``."""
    cf, cm = params

    def watts(uf, um):
        return f["idle"] + (f["max"] - f["idle"]) * -np.expm1(-(cf * uf + cm * um))

    p_dec, p_pre = watts(f["uf_dec"], f["um_dec"]), watts(f["uf_pre"], f["um_pre"])
    spent = p_dec * f["t_dec"] + p_pre * f["t_pre"]
    return spent / (f["t_dec"] + f["t_pre"]), f["chips"] * spent


def fit_runs(f: Mapping[str, np.ndarray], mask=None, iterations: int = 100) -> tuple[float, float]:
    """``(c_F, c_M)`` minimizing the squared log error of the runs' W per GPU (those in ``mask``;
    all when None), by Gauss-Newton with a Levenberg damping on their logarithms."""
    use = np.ones(len(f["power"]), bool) if mask is None else np.asarray(mask, bool)
    g = {k: v[use] for k, v in f.items()}
    z = np.log(np.array([3.0, 0.3]))

    def resid(z):
        return np.log(predict_runs(np.exp(z), g)[0] / g["power"])

    cf, cm = np.exp(_gauss_newton(resid, z, iterations))
    return float(cf), float(cm)


def held_out_runs(f: Mapping[str, np.ndarray] | None = None) -> dict:
    """Each model's runs predicted by a fit on the other architectures' runs (leave one
    architecture out: presets with the same numbers, DeepSeek-V3 and R1 or Llama 3 and 3.3 70B,
    are one network, ``dcost.calibrate.engines.architectures``, and leaving out one name alone
    would fit on its twin's runs).

    Returns:
      ``{"power": (W per GPU), "energy": (J per output token)}`` arrays in ``f``'s order, the
      fits under ``"fits"`` (by architecture, its first preset name), and ``"summary"``:
      ``{metric: {"n", "median", "p90", "bias"}}`` over all runs and per chip and per dense /
      MoE (``|predicted/measured - 1|``; bias the median of predicted/measured).
    """
    from dcost import presets
    from dcost.calibrate.engines import architectures

    f = run_features() if f is None else f
    power = np.empty(len(f["power"]))
    joules = np.empty(len(f["power"]))
    fits = {}
    arch = architectures(f["model"].tolist())
    family = np.array([arch[m] for m in f["model"].tolist()])
    for a in sorted(set(family.tolist())):
        out = family == a
        fits[a] = fit_runs(f, ~out)
        p, e = predict_runs(fits[a], f)
        power[out], joules[out] = p[out], e[out]
    moe = np.array([bool(presets.model_card(m)["arch"].get("n_experts")) for m in f["model"]])
    groups = {"all": np.ones(len(power), bool), "dense": ~moe, "moe": moe}
    for h in sorted(set(f["hardware"].tolist())):
        groups[h] = f["hardware"] == h
    summary: dict = {}
    for metric, pred, meas in (("power_per_gpu", power, f["power"]),
                               ("energy_per_output_token", joules, f["energy"])):  # fmt: skip
        ratio = pred / meas
        summary[metric] = {
            name: {
                "n": int(sel.sum()),
                "median": float(np.median(np.abs(ratio[sel] - 1.0))),
                "p90": float(np.percentile(np.abs(ratio[sel] - 1.0), 90)),
                "bias": float(np.median(ratio[sel])),
            }
            for name, sel in groups.items()
        }
    return {"power": power, "energy": joules, "fits": fits, "summary": summary}
