"""Engine profiles fitted bottom-up to measured kernel tables.

A serving engine's step is a sequence of kernels: GEMMs, attention over the context, grouped
experts, all-reduces. AIConfigurator (ai-dynamo/aiconfigurator; the PyPI package
``aiconfigurator-core``, Apache-2.0) publishes, per GPU, engine and engine version, measured
latency tables of each kind. This module fits the ``dcost.engines`` profile fields to them with the
same functions the serving model evaluates (one code path):

- **GEMM** ``(m, n, k, dtype)``: ``t = c_p + kernel_time(2mnk (1 + n_half/m)/(F_p eta_p),
  (nk b_w + mk b_x + 2mn)/(BW eta_BW))`` (``dcost.serving.roofline._flop_seconds``,
  ``dcost.serving.kernels.kernel_time``): per precision ``p`` the achieved fraction ``eta_p``
  (``flops_efficiency``), the matmul-size half point ``n_half`` (``matmul_half_tokens``) and the
  intercept ``c_p`` (launch and tail of one kernel alone: a block-scaled fp8 GEMM's is 2-5x a
  bf16 one's, 16 us against 3 us in TensorRT-LLM's B200 table); shared, ``eta_BW``
  (``bandwidth_efficiency``) and the kernels' roofline smoothness ``r``. With one intercept for
  every precision the fit put fp8's fixed cost into its half point (224 tokens on B200), which
  made a small batch's fp8 matmuls cost in proportion to their weights, and a 70B model's decode
  step 1.3x too slow.
- **attention** (generation: ``b`` sequences of ``s`` cached tokens, ``h`` query and ``h_kv`` KV
  heads of size ``d``; context: ``b`` prompts of ``s`` tokens, causal):
  ``t = c + kernel_time(F_attn / (eta_attn F_peak), bytes_kv / (BW eta_kv))`` with
  ``F_attn = 4 b s h d`` (generation) or ``2 b s^2 h d`` (context, half of the square),
  ``bytes_kv = 2 b s h_kv d b_kv`` (generation) or ``b s (h + 2 h_kv) d b`` (context):
  ``attention_efficiency`` and ``kv_bandwidth_efficiency``, an 8-bit cache's reads at their own
  rate (``fp8_kv_bandwidth_ratio`` of the 16-bit cache's: the kernels dequantize as they read);
  of a shape several kernels timed, the fastest.
- **grouped experts** (``moe_layer_time``): the touched experts' weights read at their own
  ``expert_bandwidth_efficiency`` (one grouped kernel streams many experts' matrices; the dense
  GEMMs' ``eta_BW`` took the MoE tables 1-3 points further off, held out), their FLOPs at
  ``expert_flops_efficiency`` and ``expert_half_tokens`` per precision, ``expert_overhead`` per
  touched expert and ``moe_layer_overhead`` per layer (routing, sorting, combining), on the
  fastest kernel the table timed for each shape (``fastest_kernels``).
- **all-reduce** (``n`` GPUs, ``V`` bytes): ``dcost.serving.collectives.all_reduce(V, n, U eta_U,
  alpha, tree=1)``: ``scaleup_efficiency`` and ``scaleup_latency``.

Every fit is a smooth least-squares fit of log times (Optax Adam in an unconstrained space: a
logistic for fractions, a log for positive numbers), on 80 % of the table's rows drawn at random;
the residual reported per kernel type is on the other 20 % (held out). What kernels cannot show
(the engine's host work per step and per sequence, the elementwise kernels between GEMMs) is fitted
on end-to-end rows elsewhere (``dcost.calibrate.host``), never here; so is ``layer_overhead``:
the tables time each kernel alone, launch included (their intercepts, kept in the provenance),
which a CUDA graph of a whole step does not pay kernel by kernel. Two intercepts are exceptions.
The MoE table's times the layer's routing, sorting and combining kernels with the experts, work
a dense layer does not do, and is kept as ``moe_layer_overhead``. The GEMM table's, per
precision, is kept as ``gemm_intercept``: how much of it a step pays per GEMM kernel
(``gemm_intercept_share``: kernels run back to back in a graph hide part of one another's fixed
time) is fitted end to end with the other fixed costs.

Reference: AIConfigurator, "systems/data/<gpu>/<op>/<backend>/<version>/*.parquet" (the collected
tables and their ``collection_meta.yaml``).
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
from collections.abc import Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dcost import presets
from dcost.engines import write_profile
from dcost.serving.collectives import all_reduce
from dcost.serving.kernels import kernel_time
from dcost.serving.roofline import _flop_seconds, expert_rate_slowdown, moe_layer_fixed
from dcost.specs import Hardware

__all__ = [
    "GPU_PRESETS",
    "TABLE_DTYPES",
    "KernelFit",
    "fit_gemm",
    "fit_attention",
    "fit_allreduce",
    "fit_moe",
    "moe_layer_time",
    "balanced_share",
    "power_law_imbalance",
    "fastest_kernels",
    "fit_tables",
    "read_table",
    "find_tables",
    "profile_from_fits",
    "write_profile",
    "rebuild",
]

GPU_PRESETS = {
    "h100_sxm": "h100-sxm",
    "h200_sxm": "h200",
    "b200_sxm": "b200",
    "b300_sxm": "b300",
    "gb200": "gb200-nvl72",
    "gb300": "gb300-nvl72",
    "a100_sxm": "a100-80gb",
}
"""AIConfigurator system names -> dcost hardware presets."""

TABLE_DTYPES = {"bf16": ("bfloat16", "float16"), "fp8": ("fp8",), "fp4": ("nvfp4",)}
"""dcost matmul precision -> the GEMM table's ``gemm_dtype`` values fitted for it."""

_BYTES = {
    "bfloat16": 2.0,
    "float16": 2.0,
    "fp8": 1.0,
    "fp8_block": 1.0,
    "nvfp4": 4.5 / 8.0,
    "w4a16_mxfp4": 4.25 / 8.0,  # 4-bit values, one 8-bit scale per 32
}
_KV_BYTES = {"bfloat16": 2.0, "float16": 2.0, "fp8": 1.0, "int8": 1.0}
_ATTN_PRECISION = {"bfloat16": "bf16", "float16": "bf16", "fp8": "fp8"}

SAMPLE = 2400
"""Rows drawn per kernel type (per precision for GEMMs): a fit is seconds on 2 cores."""

MIN_ROWS = 20
"""Fewest rows of a kind (a precision's MoE rows) a fit takes."""

MIN_WEIGHT_DIM = 1024
"""Smallest weight dimension (``n`` and ``k``) of the GEMM rows fitted: a layer's projections."""

MIN_IDEAL_TIME = 5e-6
"""Attention rows fitted take at least this long at the chip's peak (s): see ``fit_attention``."""

STEPS = 500
LEARNING_RATE = 0.05
HELD_OUT = 0.2


@dataclasses.dataclass(frozen=True)
class KernelFit:
    """One kernel type's fit.

    Attributes:
      kind: "gemm", "attention" or "allreduce".
      values: fitted fields (SI units), e.g. ``{"precision.fp8.flops_efficiency": 0.71, ...}``.
      rows: rows of the table(s) used (fit and held out together).
      rms_log: root-mean-square of ``log(pred/measured)`` on the held-out rows.
      median_abs: median of ``|pred/measured - 1|`` on the held-out rows.
      p90_abs: its 90th percentile.
    """

    kind: str
    values: dict
    rows: int
    rms_log: float
    median_abs: float
    p90_abs: float


# ---- reading tables ------------------------------------------------------------------------


def read_table(path) -> dict[str, np.ndarray]:
    """A kernel table as ``{column: array}``: Parquet (needs ``pyarrow``: the ``aiconfigurator``
    extra) or CSV with a header row (the test fixtures)."""
    path = pathlib.Path(path)
    if path.suffix == ".csv":
        import csv

        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.DictReader(line for line in f if not line.startswith("#")))
        if not rows:
            raise ValueError(f"{path}: no rows")
        out = {}
        for k in rows[0]:
            col = [r[k] for r in rows]
            try:
                out[k] = np.asarray([float(x) for x in col])
            except ValueError:
                out[k] = np.asarray(col)
        return out
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise ImportError(
            "reading AIConfigurator's Parquet tables needs pyarrow: "
            "pip install 'dcost[aiconfigurator]'"
        ) from None
    table = pq.read_table(path)
    out = {}
    for k in table.column_names:
        arr = table.column(k).to_numpy()  # one copy per column, no Python objects per value
        if arr.dtype.kind in "iufb":
            arr = arr.astype(float) if arr.dtype.kind != "b" else arr
        else:
            arr = arr.astype(str)
        out[k] = arr
    return out


def _versions(root: pathlib.Path, gpu: str, op: str, engine: str) -> list[str]:
    d = root / gpu / op / engine
    if not d.is_dir():
        return []
    from dcost.engines import _version_key

    return sorted((p.name for p in d.iterdir() if p.is_dir()), key=_version_key)


def find_tables(root, gpu: str, engine: str) -> dict[str, pathlib.Path] | None:
    """The tables that make an engine profile on one GPU, under an AIConfigurator data root
    (``aiconfigurator_core/systems/data``): the latest version's GEMM and attention tables and
    the latest custom all-reduce table of the engine (NCCL's all-reduce where it has none). None
    when the engine has no GEMM table there."""
    root = pathlib.Path(root)
    gemm = [
        v
        for v in _versions(root, gpu, "gemm", engine)
        if (root / gpu / "gemm" / engine / v / "gemm_perf.parquet").is_file()
    ]  # a version folder may hold only a note that it reuses another's tables
    if not gemm:
        return None
    version = gemm[-1]
    found = {
        "version": version,
        "gemm": root / gpu / "gemm" / engine / version / "gemm_perf.parquet",
    }
    attn = root / gpu / "attention" / engine / version
    if not (attn / "generation_attention_perf.parquet").is_file():
        av = [
            v
            for v in _versions(root, gpu, "attention", engine)
            if (
                root / gpu / "attention" / engine / v / "generation_attention_perf.parquet"
            ).is_file()
        ]
        attn = root / gpu / "attention" / engine / av[-1] if av else attn
    for name in ("generation_attention", "context_attention"):
        if (attn / f"{name}_perf.parquet").is_file():
            found[name] = attn / f"{name}_perf.parquet"
    for v in reversed(_versions(root, gpu, "mla", engine)):
        mla = root / gpu / "mla" / engine / v
        if (mla / "generation_mla_perf.parquet").is_file():  # the latest kernel tables of MLA
            for name in ("generation_mla", "context_mla"):
                if (mla / f"{name}_perf.parquet").is_file():
                    found[name] = mla / f"{name}_perf.parquet"
            break
    for v in [version] + list(reversed(_versions(root, gpu, "moe", engine))):
        f = root / gpu / "moe" / engine / v / "moe_perf.parquet"
        if f.is_file():
            found["moe"] = f
            break
    for v in reversed(_versions(root, gpu, "sparse_attention", engine)):
        f = root / gpu / "sparse_attention" / engine / v / "dsa_generation_module_perf.parquet"
        if f.is_file():
            found["dsa_generation"] = f
            # the same module without the indexer, of a dense-attention MLA (DeepSeek-V3): the
            # same version's table, else the latest
            for w in [v] + list(reversed(_versions(root, gpu, "mla", engine))):
                m = root / gpu / "mla" / engine / w / "mla_generation_module_perf.parquet"
                if m.is_file():
                    found["mla_generation_module"] = m
                    break
            break
    for v in reversed(_versions(root, gpu, "comm", engine)):
        f = root / gpu / "comm" / engine / v / "custom_allreduce_perf.parquet"
        if f.is_file():
            found["allreduce"] = f
            break
    else:
        for v in reversed(_versions(root, gpu, "comm", "nccl")):
            f = root / gpu / "comm" / "nccl" / v / "nccl_perf.parquet"
            if f.is_file():
                found["allreduce"] = f
                break
    return found


# ---- the fitting machinery -----------------------------------------------------------------


def _logistic(z):
    return 1.0 / (1.0 + jnp.exp(-z))


def _split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    cut = max(1, int(round(n * HELD_OUT)))
    return order[cut:], order[:cut]


def _sample(mask: np.ndarray, size: int, seed: int) -> np.ndarray:
    idx = np.flatnonzero(mask)
    if len(idx) > size:
        idx = np.sort(np.random.default_rng(seed).choice(idx, size, replace=False))
    return idx


def _bucket(n: int) -> int:
    """Rows a fit's arrays are padded to: the next power of two, at least 64. Fits of the same
    kind and bucket (every chip's and engine's) share one compiled program."""
    return max(64, 1 << max(0, n - 1).bit_length())


def _padded(rows: Mapping[str, np.ndarray], idx: np.ndarray) -> tuple[dict, int]:
    """``rows`` at ``idx``, each padded to ``_bucket(len(idx))`` with copies of its first row
    (finite values, weighted 0 by ``_adam``)."""
    size = _bucket(len(idx))
    out = {}
    for key, value in rows.items():
        v = np.asarray(value)[idx]
        out[key] = np.concatenate([v, np.repeat(v[:1], size - len(idx), axis=0)])
    return out, size


@jax.jit(static_argnames=("model", "statics", "steps"))
def _adam(z0, rows, consts, log_y, weight, model, statics, steps):
    """Adam on the weighted mean squared log error of ``model(z, rows, consts, statics)`` from
    ``z0``, in one ``lax.scan`` of ``steps`` steps. ``model`` is a module-level function, so
    that every fit of a kind whose arrays have the same shapes runs one compiled program (a
    closure over a table's rows compiled one for every fit: a profile's fits took 5-7 s on an
    empty compilation cache, 2 cores, against 0.5-2 s)."""
    opt = optax.adam(LEARNING_RATE)

    def loss(z):
        r = jnp.log(model(z, rows, consts, statics)) - log_y
        return jnp.sum(weight * r * r) / jnp.sum(weight)

    def step(carry, _):
        z, state = carry
        updates, state = opt.update(jax.grad(loss)(z), state, z)
        return (optax.apply_updates(z, updates), state), None

    (z, _), _ = jax.lax.scan(step, (z0, opt.init(z0)), None, length=steps)
    return z


@jax.jit(static_argnames=("model", "statics"))
def _predict(z, rows, consts, model, statics):
    return model(z, rows, consts, statics)


def _fit(model, statics, z0, rows: Mapping[str, np.ndarray], consts, y: np.ndarray, seed: int):
    """Fit ``model``'s parameters (from ``z0``) to the log times ``y`` (s) of 80 % of ``rows``
    (each an array of ``len(y)`` rows) by ``STEPS`` Adam steps; ``(z, (rms, median, p90))``
    with the residuals on the other 20 % (``_split``). ``consts`` are arrays that are not rows
    (a chip's bandwidth); ``statics`` hashable settings of the model (its parameter counts)."""
    fit_i, held_i = _split(len(y), seed)
    fit_rows, size = _padded(rows, fit_i)
    (log_y,) = _padded({"y": np.log(y)}, fit_i)[0].values()
    weight = (np.arange(size) < len(fit_i)).astype(float)
    z = _adam(
        jnp.asarray(z0, float),
        fit_rows,
        consts,
        log_y,
        weight,
        model=model,
        statics=statics,
        steps=STEPS,
    )
    held_rows, _ = _padded(rows, held_i)
    pred = np.asarray(_predict(z, held_rows, consts, model=model, statics=statics))
    return np.asarray(z), _residuals(pred[: len(held_i)], y[held_i])


def _residuals(pred: np.ndarray, measured: np.ndarray) -> tuple[float, float, float]:
    ratio = np.asarray(pred) / np.asarray(measured)
    err = np.abs(ratio - 1.0)
    return (
        float(np.sqrt(np.mean(np.log(ratio) ** 2))),
        float(np.median(err)),
        float(np.quantile(err, 0.9)),
    )


def _chip(card_name: str) -> dict:
    card = presets.hardware_card(card_name)
    return {
        k: float(presets._value(v))
        for k, v in card.items()
        if isinstance(v, (int, float, dict)) and k.startswith(("flops", "hbm", "scaleup"))
    }


def _peak(chip: dict, precision: str) -> float:
    return chip["flops"] if precision == "bf16" else chip[f"flops_{precision}"]


def _bare(flops, bw, eta_f=1.0, eta_bw=1.0, half=0.0, r=0.0) -> Hardware:
    """A chip with only what one kernel's time reads (traced fields are fine)."""
    return Hardware(
        flops=flops,
        hbm_bandwidth=bw,
        hbm_capacity=1.0,
        scaleup_bandwidth=1.0,
        scaleout_bandwidth=1.0,
        scaleup_size=8.0,
        price_per_hour=0.0,
        flops_efficiency=eta_f,
        bandwidth_efficiency=eta_bw,
        matmul_half_tokens=half,
        kernel_roofline_smoothness=r,
    )


# ---- GEMM --------------------------------------------------------------------------------


def _gemm_time(z, prec_index, m, n, k, peak, b_w, bw, n_prec):
    """Predicted GEMM latency (s) for parameters ``z`` (see ``fit_gemm``)."""
    eta = 0.02 + 0.98 * _logistic(z[:n_prec])[prec_index]
    half = jnp.exp(z[n_prec : 2 * n_prec])[prec_index]
    eta_bw = 0.02 + 0.98 * _logistic(z[2 * n_prec])
    r = _logistic(z[2 * n_prec + 1])
    c = jnp.exp(z[2 * n_prec + 2 : 3 * n_prec + 2])[prec_index]
    hw = _bare(peak, bw, eta, eta_bw, half, r)
    t_f = _flop_seconds(2.0 * m * n * k, m, hw)
    t_w = (n * k * b_w + m * k * b_w + 2.0 * m * n) / hw.bandwidth_achieved
    return c + kernel_time(t_f, t_w, hw)


def _gemm_model(z, d, c, statics):
    (n_prec,) = statics
    return _gemm_time(z, d["prec"], d["m"], d["n"], d["k"], d["peak"], d["b_w"], c, n_prec)


def fit_gemm(table: Mapping[str, np.ndarray], hardware: str, seed: int = 0) -> KernelFit:
    """Fit the GEMM fields of one engine on one chip to its GEMM table (see the module docstring).

    Args:
      table: columns ``gemm_dtype``, ``m``, ``n``, ``k``, ``latency`` (ms).
      hardware: the dcost hardware preset the table was measured on (its peak FLOP/s per
        precision and HBM bandwidth).
      seed: the random draw of rows and of the held-out fifth.

    Returns:
      A ``KernelFit`` with ``precision.<p>.flops_efficiency``, ``precision.<p>.matmul_half_tokens``
      and ``precision.<p>.gemm_intercept`` (s) for each precision the table has rows of
      (``TABLE_DTYPES``), ``bandwidth_efficiency`` and ``kernel_roofline_smoothness``.
    """
    chip = _chip(hardware)
    dtype = np.asarray(table["gemm_dtype"]).astype(str)
    precisions = [
        p
        for p, names in TABLE_DTYPES.items()
        if np.isin(dtype, names).any() and (p == "bf16" or f"flops_{p}" in chip)
    ]
    if not precisions:
        raise ValueError(f"GEMM table for {hardware}: no rows of {sorted(TABLE_DTYPES)}")
    # the shapes of LLM layers: both weight dimensions at least MIN_WEIGHT_DIM (the tables also
    # hold tiny ones, k = 32, whose time is all launch and no arithmetic)
    big = (np.asarray(table["n"], float) >= MIN_WEIGHT_DIM) & (
        np.asarray(table["k"], float) >= MIN_WEIGHT_DIM
    )
    parts = [
        _sample(big & np.isin(dtype, TABLE_DTYPES[p]), SAMPLE, seed + i)
        for i, p in enumerate(precisions)
    ]
    idx = np.concatenate(parts)
    prec = np.concatenate([np.full(len(part), i) for i, part in enumerate(parts)])
    m, n, k = (np.asarray(table[c], float)[idx] for c in ("m", "n", "k"))
    y = np.asarray(table["latency"], float)[idx] * 1e-3
    peak = np.asarray([_peak(chip, precisions[i]) for i in prec])
    b_w = np.asarray([_BYTES[d] for d in dtype[idx]])
    n_prec = len(precisions)
    z0 = [1.0] * n_prec + [math.log(64.0)] * n_prec + [1.5, 0.0] + [math.log(5e-6)] * n_prec
    rows = {"prec": prec, "m": m, "n": n, "k": k, "peak": peak, "b_w": b_w}
    z, (rms, med, p90) = _fit(
        _gemm_model, (n_prec,), z0, rows, np.float64(chip["hbm_bandwidth"]), y, seed
    )
    values = {}
    for i, p in enumerate(precisions):
        values[f"precision.{p}.flops_efficiency"] = float(0.02 + 0.98 / (1.0 + np.exp(-z[i])))
        values[f"precision.{p}.matmul_half_tokens"] = float(np.exp(z[n_prec + i]))
        values[f"precision.{p}.gemm_intercept"] = float(np.exp(z[2 * n_prec + 2 + i]))
    values["bandwidth_efficiency"] = float(0.02 + 0.98 / (1.0 + np.exp(-z[2 * n_prec])))
    values["kernel_roofline_smoothness"] = float(1.0 / (1.0 + np.exp(-z[2 * n_prec + 1])))
    return KernelFit("gemm", values, len(y), rms, med, p90)


# ---- attention -----------------------------------------------------------------------------


def _attention_arrays(table, chip, context: bool, size: int, seed: int):
    window = np.asarray(table.get("window_size", np.zeros(len(table["latency"]))), float)
    beam = np.asarray(table.get("beam_width", np.ones(len(table["latency"]))), float)
    attn_dtype = np.asarray(table["attn_dtype"]).astype(str)
    kv_dtype = np.asarray(table["kv_cache_dtype"]).astype(str)
    ok = (window == 0) & (beam == 1) & np.isin(attn_dtype, list(_ATTN_PRECISION))
    ok &= np.isin(kv_dtype, list(_KV_BYTES))
    # rows whose work takes at least MIN_IDEAL_TIME at the chip's peak rates: the attention of
    # a serving step (the tables also hold a few tokens of context, all launch and no work)
    b_all = np.asarray(table["batch_size"], float)
    s_all = np.asarray(table["isl"], float) + (0.0 if context else np.asarray(table["step"], float))
    h_all = np.asarray(table["num_heads"], float) * np.asarray(table["head_dim"], float)
    ideal = (2.0 if context else 4.0) * b_all * s_all * (s_all if context else 1.0) * h_all
    ok &= ideal / chip["flops"] >= MIN_IDEAL_TIME * (0.1 if not context else 1.0)
    idx = _sample(ok, size, seed)
    b = np.asarray(table["batch_size"], float)[idx]
    isl = np.asarray(table["isl"], float)[idx]
    step = np.asarray(table["step"], float)[idx]
    s = isl if context else isl + step
    h = np.asarray(table["num_heads"], float)[idx]
    hkv = np.asarray(table["num_key_value_heads"], float)[idx]
    d = np.asarray(table["head_dim"], float)[idx]
    b_kv = np.asarray([_KV_BYTES[x] for x in kv_dtype[idx]])
    peak = np.asarray([_peak(chip, _ATTN_PRECISION[x]) for x in attn_dtype[idx]])
    if context:
        flops = 2.0 * b * s * s * h * d
        byts = b * s * (h + 2.0 * hkv) * d * 2.0
    else:
        flops = 4.0 * b * s * h * d
        byts = 2.0 * b * s * hkv * d * b_kv
    y = np.asarray(table["latency"], float)[idx] * 1e-3
    return flops, byts, peak, y, b, b_kv


def fit_attention(
    generation: Mapping[str, np.ndarray] | None,
    context: Mapping[str, np.ndarray] | None,
    hardware: str,
    smoothness: float,
    seed: int = 0,
) -> KernelFit:
    """Fit attention's fields to the generation and context attention tables together.

    Args:
      generation, context: columns ``batch_size``, ``isl``, ``step``, ``num_heads``,
        ``num_key_value_heads``, ``head_dim``, ``attn_dtype``, ``kv_cache_dtype``,
        ``window_size``, ``beam_width``, ``latency`` (ms); either may be None.
      hardware: the dcost hardware preset.
      smoothness: the kernels' roofline smoothness (from ``fit_gemm``), held fixed.

    Returns:
      A ``KernelFit`` with ``attention_efficiency``, ``kv_bandwidth_efficiency`` (a 16-bit
      cache's), ``fp8_kv_bandwidth_ratio`` (an 8-bit cache's reads over a 16-bit one's, where
      the generation table has at least ``MIN_ROWS`` of each: FlashAttention and FlashInfer
      dequantize an fp8 cache in the kernel and reach 0.6-0.9 of the 16-bit cache's bandwidth in
      vLLM's and SGLang's 2026 tables; TensorRT-LLM's kernels reach the same; at most 1),
      ``generation_intercept`` and ``context_intercept`` (s). Rows with a sliding window or a
      beam are left out, and of a shape timed with several kernels (SGLang's B200 tables time
      TensorRT-LLM's, FlashInfer's and Triton's) only the fastest is kept (``fastest_kernels``):
      the engine picks its kernel per shape, as for grouped experts.
    """
    chip = _chip(hardware)
    parts = []
    for i, (table, ctx) in enumerate(((generation, False), (context, True))):
        if table is not None:
            table = fastest_kernels(table, _ATTENTION_SHAPE)
            f, b, p, y, seqs, b_kv = _attention_arrays(table, chip, ctx, SAMPLE, seed + i)
            parts.append((f, b, p, y, ctx, seqs, b_kv))
    if not parts:
        raise ValueError(f"attention for {hardware}: no table")
    return _fit_rates("attention", parts, chip, smoothness, seed)


def _rates_model(z, d, c, statics):
    """Attention's roofline (``_fit_rates``) at parameters ``z`` for rows ``d``; ``c`` holds
    the chip's HBM bandwidth and the kernels' roofline smoothness."""
    (split_kv,) = statics
    bw, smoothness = c[0], c[1]
    eta = 0.02 + 0.98 * _logistic(z[0])
    eta_kv = 0.02 + 0.98 * _logistic(z[1])
    if split_kv:  # an 8-bit cache's reads at a share of the 16-bit cache's rate
        eta_kv = eta_kv * jnp.where(d["eight"] > 0, 0.02 + 0.98 * _logistic(z[5]), 1.0)
    fixed = jnp.where(d["context"] > 0, jnp.exp(z[3]), jnp.exp(z[2]))
    fixed = fixed + jnp.exp(z[4]) * d["seqs"]
    hw = _bare(d["peak"], bw, 1.0, 1.0, 0.0, smoothness)
    t_f = d["flops"] / (d["peak"] * eta)
    t_w = d["bytes"] / (bw * eta_kv)
    return fixed + kernel_time(t_f, t_w, hw)


def _fit_rates(kind: str, parts, chip: dict, smoothness: float, seed: int) -> KernelFit:
    """Attention's rates fitted to ``parts``, one ``(flops, bytes, peak, latency (s), context,
    sequences, KV bytes per element)`` per table (``context`` a bool): the roofline
    ``c + kernel_time(F/(P eta), B/(BW eta_kv))`` with ``c`` an intercept per table kind plus
    one per sequence, and an 8-bit cache's reads at ``fp8_kv_bandwidth_ratio`` of the 16-bit
    rate where the generation rows hold at least ``MIN_ROWS`` of each (``fit_attention``)."""
    rows = []
    for f, b, p, y, ctx, seqs, b_kv in parts:
        # an 8-bit cache's reads, generation rows only (a prompt's reads are its activations)
        eight = (b_kv <= 1.0) & (not ctx)
        rows.append((f, b, p, y, np.full(len(y), float(ctx)), seqs, eight.astype(float)))
    flops, byts, peak, y, is_ctx, seqs, eight = (np.concatenate(c) for c in zip(*rows, strict=True))
    gen = is_ctx == 0
    split_kv = min(int(np.sum(gen & (eight > 0))), int(np.sum(gen & (eight == 0)))) >= MIN_ROWS
    z0 = [0.5, 1.5, math.log(5e-6), math.log(1e-5), math.log(1e-8), 2.0]
    arrays = {
        "flops": flops,
        "bytes": byts,
        "peak": peak,
        "context": is_ctx,
        "seqs": seqs,
        "eight": eight,
    }
    consts = np.asarray([chip["hbm_bandwidth"], smoothness])
    z, (rms, med, p90) = _fit(_rates_model, (split_kv,), z0, arrays, consts, y, seed)
    eta_kv = float(0.02 + 0.98 / (1.0 + np.exp(-z[1])))
    values = {
        "attention_efficiency": float(0.02 + 0.98 / (1.0 + np.exp(-z[0]))),
        "kv_bandwidth_efficiency": eta_kv,
        "generation_intercept": float(np.exp(z[2])),
        "context_intercept": float(np.exp(z[3])),
        "attention_sequence_intercept": float(np.exp(z[4])),
    }
    if split_kv:
        values["fp8_kv_bandwidth_ratio"] = float(0.02 + 0.98 / (1.0 + np.exp(-z[5])))
    return KernelFit(kind, values, len(y), rms, med, p90)


MLA_SHAPE = {
    "kv_lora_rank": 512.0,
    "qk_rope_head_dim": 64.0,
    "qk_nope_head_dim": 128.0,
    "v_head_dim": 128.0,
}
"""The MLA shape AIConfigurator's MLA tables time (DeepSeek-V3's config.json: ``kv_lora_rank``
512, ``qk_rope_head_dim`` 64, ``qk_nope_head_dim`` 128, ``v_head_dim`` 128); ``num_heads`` is a
GPU's heads (128 over ``tp_size``)."""


def _mla_arrays(table, chip, context: bool, size: int, seed: int):
    """MLA's work in a table's rows, in the serving model's forms (``dcost.presets``'
    ``derive_model``): a generation step attends in the absorbed form, every head reading the
    one latent of ``r + r_rope`` elements a token, ``2 h ((r + r_rope) + r)`` FLOPs a context
    token; a prompt in the non-absorbed form, ``2 h ((d_nope + d_rope) + d_v)`` FLOPs a pair
    of tokens, half the pairs (causal), reading its queries, keys and values."""
    kv_dtype = np.asarray(table["kv_cache_dtype"]).astype(str)
    mla_dtype = np.asarray(table["mla_dtype"]).astype(str)
    r, rope = MLA_SHAPE["kv_lora_rank"], MLA_SHAPE["qk_rope_head_dim"]
    qk, v = MLA_SHAPE["qk_nope_head_dim"] + rope, MLA_SHAPE["v_head_dim"]
    b = np.asarray(table["batch_size"], float)
    s = np.asarray(table["isl"], float) + (0.0 if context else np.asarray(table["step"], float))
    h = np.asarray(table["num_heads"], float)
    if context:
        flops = b * s * s * h * (qk + v)
        byts = b * s * h * (2.0 * qk + 2.0 * v) * 2.0
    else:
        flops = 2.0 * b * s * h * ((r + rope) + r)
        byts = b * s * (r + rope) * np.asarray([_KV_BYTES.get(x, 0.0) for x in kv_dtype])
    ok = np.isin(mla_dtype, list(_ATTN_PRECISION)) & np.isin(kv_dtype, list(_KV_BYTES))
    ok &= flops / chip["flops"] >= MIN_IDEAL_TIME * (1.0 if context else 0.1)
    idx = _sample(ok, size, seed)
    b_kv = np.asarray([_KV_BYTES[x] for x in kv_dtype[idx]])
    peak = np.asarray([_peak(chip, _ATTN_PRECISION[x]) for x in mla_dtype[idx]])
    y = np.asarray(table["latency"], float)[idx] * 1e-3
    return flops[idx], byts[idx], peak, y, b[idx], b_kv


def fit_mla(
    generation: Mapping[str, np.ndarray] | None,
    context: Mapping[str, np.ndarray] | None,
    hardware: str,
    smoothness: float,
    seed: int = 0,
) -> KernelFit:
    """Fit multi-head latent attention's own rates to the engine's MLA tables
    (``generation_mla_perf``, ``context_mla_perf``: columns ``batch_size``, ``isl``, ``step``,
    ``num_heads``, ``mla_dtype``, ``kv_cache_dtype``, ``latency`` in ms; either may be None).

    MLA runs kernels of its own (FlashMLA, TensorRT-LLM's and FlashInfer's MLA kernels), whose
    decode is a many-query-heads-on-one-latent shape the GQA kernels' rates do not predict: the
    dense attention fit of each shipped profile, applied to these tables, was 21-54 % off
    (median, rows of at least 5 us of work; 1.8-2.2x too slow at 128 heads a GPU on Blackwell,
    0.6-0.7x on Hopper under SGLang). The same roofline as ``fit_attention`` (``_fit_rates``), its
    fields named ``mla_*``: ``mla_attention_efficiency``, ``mla_kv_bandwidth_efficiency`` and
    ``mla_fp8_kv_bandwidth_ratio``, which ``dcost.engines.Engine.fields`` gives a model with
    latent attention (``Model.latent_attention``) in place of the GQA kernels'.
    """
    chip = _chip(hardware)
    parts = []
    for i, (table, ctx) in enumerate(((generation, False), (context, True))):
        if table is not None:
            f, b, p, y, seqs, b_kv = _mla_arrays(table, chip, ctx, SAMPLE, seed + i)
            if len(y):
                parts.append((f, b, p, y, ctx, seqs, b_kv))
    if not parts:
        raise ValueError(f"MLA attention for {hardware}: no table")
    fit = _fit_rates("mla_attention", parts, chip, smoothness, seed)
    return dataclasses.replace(fit, values={"mla_" + k: v for k, v in fit.values.items()})


# ---- all-reduce ----------------------------------------------------------------------------


def _allreduce_model(z, d, c, statics):
    eff = 0.02 + 0.98 * _logistic(z[0])
    return all_reduce(d["volume"], d["n"], c * eff, jnp.exp(z[1]), 1.0)


def fit_allreduce(table: Mapping[str, np.ndarray], hardware: str, seed: int = 0) -> KernelFit:
    """Fit ``scaleup_efficiency`` and ``scaleup_latency`` to an all-reduce table.

    Args:
      table: columns ``num_gpus``, ``message_size`` (elements), ``latency`` (ms), and either
        ``allreduce_dtype`` / ``nccl_dtype`` (bfloat16 rows are used) and, for custom all-reduce
        tables, ``backend`` (rows run in CUDA graphs are used where the table has them) or, for
        NCCL tables, ``op_name`` ("all_reduce" rows).
      hardware: the dcost hardware preset (its scale-up bandwidth per GPU, one direction).

    Returns:
      A ``KernelFit`` whose values are the fields of the log-depth all-reduce
      ``dcost.serving.collectives.all_reduce(V, n, U eta_U, alpha, tree=1)``.
    """
    chip = _chip(hardware)
    n_rows = len(table["latency"])
    ok = np.ones(n_rows, bool)
    for col in ("allreduce_dtype", "nccl_dtype"):
        if col in table:
            ok &= np.asarray(table[col]).astype(str) == "bfloat16"
    if "backend" in table:
        backend = np.asarray(table["backend"]).astype(str)
        graph = np.char.find(backend, "graph") >= 0
        if (ok & graph).any():
            ok &= graph
    if "op_name" in table and "nccl_dtype" in table:
        ok &= np.asarray(table["op_name"]).astype(str) == "all_reduce"
    n = np.asarray(table["num_gpus"], float)
    ok &= (n > 1) & (n <= chip["scaleup_size"])
    idx = np.flatnonzero(ok)
    if len(idx) < 4:
        raise ValueError(f"all-reduce table for {hardware}: {len(idx)} usable rows")
    n = n[idx]
    volume = np.asarray(table["message_size"], float)[idx] * 2.0  # bf16 elements -> bytes
    y = np.asarray(table["latency"], float)[idx] * 1e-3
    z, (rms, med, p90) = _fit(
        _allreduce_model,
        (),
        [0.5, math.log(3e-6)],
        {"volume": volume, "n": n},
        np.float64(chip["scaleup_bandwidth"]),
        y,
        seed,
    )
    values = {
        "scaleup_efficiency": float(0.02 + 0.98 / (1.0 + np.exp(-z[0]))),
        "scaleup_latency": float(np.exp(z[1])),
    }
    return KernelFit("allreduce", values, len(y), rms, med, p90)


# ---- grouped experts -----------------------------------------------------------------------

_MOE_PRECISION = {
    "bfloat16": "bf16",
    "fp8": "fp8",
    "fp8_block": "fp8",
    "nvfp4": "fp4",
    "w4a16_mxfp4": "w4a16",
}
"""The MoE table's ``moe_dtype`` -> the profile's expert class: a matmul precision, or a class
of ``dcost.engines.WEIGHT_ONLY_EXPERTS`` (MXFP4 weights dequantized into bf16 matmuls, gpt-oss
on Hopper: kernels of their own, with their own measured rate)."""


def _served(table: Mapping[str, np.ndarray]) -> np.ndarray:
    """The MoE table's rows of the formats MoE checkpoints are served in: where a table times
    block-scaled fp8 (``fp8_block``), its per-tensor ``fp8`` rows are left out. The fp8 mixtures
    of experts of the silicon sample ship block-scaled weights (128 x 128 blocks: DeepSeek-V3
    and R1, Kimi K2, MiniMax-M2.5, Qwen3-235B-A22B-FP8; their config.json ``weight_block_size``
    or model cards), which the engine runs on its block-scaled kernels; the per-tensor rows time
    other kernels (vLLM 0.24 on H200: FlashInfer's CUTLASS kernel, 2-4x slower at a few tokens
    than the block-scaled Triton one), and one expert class fitted to both was charged between.

    >>> _served({"moe_dtype": np.array(["fp8", "fp8_block", "bfloat16"])}).tolist()
    [False, True, True]
    >>> _served({"moe_dtype": np.array(["fp8", "bfloat16"])}).tolist()
    [True, True]
    """
    dtype = np.asarray(table["moe_dtype"]).astype(str)
    return ~((dtype == "fp8") & (dtype == "fp8_block").any())


def fastest_kernels(
    table: Mapping[str, np.ndarray], shape: Sequence[str] | None = None
) -> dict[str, np.ndarray]:
    """The MoE table's rows of gated experts (three matrices, ``3 h i`` weights: the
    ``*nongated*`` kernel sources, two matrices, are left out), one row per shape: the fastest
    of the kernel sources measured for it (an engine picks among its MoE kernels per shape; the
    tables time several, e.g. TensorRT-LLM's min-latency and CUTLASS kernels, vLLM's Triton
    and FlashInfer ones). A table without ``kernel_source`` is returned as it is. ``shape``: the
    columns that make a shape (default the MoE table's, ``_MOE_SHAPE``; ``_ATTENTION_SHAPE``
    for the attention tables).

    >>> t = {"kernel_source": np.array(["a", "b", "a_nongated"]), "num_tokens": np.ones(3),
    ...      "latency": np.array([2.0, 1.0, 0.5])}
    >>> fastest_kernels(t)["latency"].tolist()
    [1.0]
    """
    if "kernel_source" not in table:
        return dict(table)
    src = np.asarray(table["kernel_source"]).astype(str)
    lat = np.asarray(table["latency"], float)
    gated = np.flatnonzero(np.char.find(src, "nongated") < 0)
    columns = [np.asarray(table[c]) for c in (_MOE_SHAPE if shape is None else shape) if c in table]
    # each column's values as codes (numbers as they are: their text takes seconds a table)
    codes = [np.unique(col[gated], return_inverse=True)[1].ravel() for col in columns]
    sizes = [int(c.max()) + 1 if len(c) else 1 for c in codes]
    if float(np.prod(np.asarray(sizes, float))) < 2.0**62:  # one integer per shape
        key = np.ravel_multi_index(codes, sizes) if codes else np.zeros(len(gated), int)
    else:
        key = np.unique(np.stack(codes, axis=1), axis=0, return_inverse=True)[1].ravel()
    order = np.lexsort((lat[gated], key))  # by shape, the fastest first
    first = np.ones(len(order), bool)
    first[1:] = key[order][1:] != key[order][:-1]
    rows = np.sort(gated[order[first]])
    return {c: np.asarray(v)[rows] for c, v in table.items()}


_MOE_SHAPE = (
    "moe_dtype",
    "num_tokens",
    "hidden_size",
    "inter_size",
    "topk",
    "num_experts",
    "moe_tp_size",
    "moe_ep_size",
    "distribution",
)


_ATTENTION_SHAPE = (
    "batch_size",
    "isl",
    "step",
    "num_heads",
    "num_key_value_heads",
    "head_dim",
    "attn_dtype",
    "kv_cache_dtype",
    "window_size",
    "beam_width",
)


def moe_layer_time(
    tokens, hidden, inter, topk, experts, tp, ep, b_w, peak, values, gemm, share=None, imbalance=1.0
):
    """One MoE layer's grouped-expert time on one GPU (s), the serving model's form
    (``dcost.serving.roofline``: ``f_expert``, ``w_expert`` and ``expert_overhead``).

    ``e = ep`` expert-parallel groups, each expert's matrices split ``t = tp`` ways, ``n``
    tokens routed to ``k`` of ``E`` experts: the GPU touches ``E phi / e`` experts
    (``phi = 1 - (1 - k/E)^n`` under random routing, ``dcost.serving.moe``; ``share`` when
    given, e.g. ``balanced_share`` for a table's balanced rows), reads their ``3 h i / t``
    weights each, and computes ``2 (3 h i / t) n k / e`` FLOP at ``n k / (E phi)`` tokens an
    expert, the busiest of the ``e`` groups ``imb`` times the mean's (``imbalance``):

    .. math:: t = c_m(e) + c_e \\frac{E\\phi}{e} + \\mathrm{smax}_r\\Big(
              \\frac{F\\,\\mathrm{imb}\\,(1 + n_e/n_{exp}) s(t, e)}{F_p \\eta_p \\eta_{exp}},\\
              \\frac{W}{BW \\eta_{BW,e}}\\Big)

    with ``s(t, e) = (1 + w_e t / i)(1/e + kappa (1 - 1/e))`` the layout's slowdown
    (``dcost.serving.roofline.expert_rate_slowdown``). The serving model multiplies the routed
    experts' FLOPs by its own imbalance the same way (``dcost.serving.moe.expert_imbalance``).

    Args:
      tokens, hidden, inter, topk, experts, tp, ep: the layer's shape (arrays or numbers).
      b_w: bytes per weight; peak: the precision's peak FLOP/s.
      values: ``expert_flops_efficiency`` ``eta_exp``, ``expert_half_tokens`` ``n_e``,
        ``expert_overhead`` ``c_e`` (s) and ``moe_layer_overhead`` ``c_1`` (s: the layer's
        routing, sorting and combining kernels, timed with it, with the experts tensor
        parallel), optionally ``moe_ep_overhead`` ``c_ep`` (s, over many expert-parallel
        groups): ``c_m(e) = c_1/e + c_ep (1 - 1/e)`` (``dcost.serving.roofline.moe_layer_fixed``;
        without ``c_ep``, ``c_1`` whatever ``e``), optionally ``expert_bandwidth_efficiency``
        ``eta_BW,e`` (without it, ``gemm``'s ``bandwidth_efficiency``), ``expert_half_width``
        ``w_e`` (without it 0) and ``expert_ep_slowdown`` ``kappa`` (without it 1).
      gemm: ``fit_gemm``'s ``flops_efficiency`` ``eta_p``, ``bandwidth_efficiency``,
        ``kernel_roofline_smoothness`` ``r`` and ``hbm_bandwidth`` (bytes/s).
      share: the share ``phi`` of the experts the tokens touch (None: random routing's).
      imbalance: the busiest expert-parallel group's routed tokens over the mean (1: balanced;
        a table's power-law rows: ``power_law_imbalance``).

    >>> v = {"expert_flops_efficiency": 1.0, "expert_half_tokens": 0.0, "expert_overhead": 1e-6,
    ...      "moe_layer_overhead": 0.0}
    >>> g = {"flops_efficiency": 1.0, "bandwidth_efficiency": 1.0,
    ...      "kernel_roofline_smoothness": 0.0, "hbm_bandwidth": 1e12}
    >>> # one token, top-1 of 1 expert of 1000 x 1000: 3e6 B read (3 us), 1 us per expert
    >>> round(float(moe_layer_time(1.0, 1e3, 1e3, 1.0, 1.0, 1.0, 1.0, 1.0, 1e15, v, g)) * 1e6, 6)
    4.0
    """
    per_expert = 3.0 * hidden * inter / tp
    if share is None:
        phi = -jnp.expm1(tokens * jnp.log1p(-jnp.minimum(topk / experts, 1.0 - 1e-7)))
    else:
        phi = share
    touched = experts * phi / ep
    flops = 2.0 * per_expert * tokens * topk / ep * imbalance
    size = tokens * topk / (experts * phi)
    bw = gemm["hbm_bandwidth"] * values.get(
        "expert_bandwidth_efficiency", gemm["bandwidth_efficiency"]
    )
    rate = peak * gemm["flops_efficiency"] * values["expert_flops_efficiency"]
    layout = expert_rate_slowdown(
        values.get("expert_half_width", 0.0), values.get("expert_ep_slowdown", 1.0), inter, tp, ep
    )
    t_f = flops * (1.0 + values["expert_half_tokens"] / size) * layout / rate
    t_w = touched * per_expert * b_w / bw
    hw = _bare(peak, bw, 1.0, 1.0, 0.0, gemm["kernel_roofline_smoothness"])
    c_1 = values["moe_layer_overhead"]
    c_ep = values.get("moe_ep_overhead", c_1)
    fixed = moe_layer_fixed(c_1, c_ep, ep) + values["expert_overhead"] * touched
    return fixed + kernel_time(t_f, t_w, hw)


def _balanced_experts(n: int, k: int, e: int) -> int:
    """How many distinct experts ``balanced_share``'s routing rule picks for ``n`` tokens."""
    s = -(-e // k)
    i = np.arange(n)[:, None]
    j = np.arange(k)[None, :]
    pick = (i + j * s) % e if n >= s else np.floor(i * s / n + j * s).astype(int) % e
    return int(np.unique(pick).size)


def balanced_share(tokens, topk, experts) -> np.ndarray:
    """The share of the ``E`` experts that ``n`` tokens routed to ``k`` each touch in a MoE
    table's ``balanced`` rows: ``min(1, n k / E)`` where ``k`` divides ``E``, a few experts
    fewer where the last run wraps onto the first.

    AIConfigurator's collectors route token ``i``'s ``j``-th choice to expert
    ``(i + j s) mod E`` with stride ``s = ceil(E/k)`` when ``n >= s``, and to
    ``floor(i s / n + j s) mod E`` when ``n < s``: ``k`` runs of ``n`` consecutive experts (or
    ``n`` spread over each run of ``s``), counted here row by row. Random routing
    (``moe_layer_time``'s default, ``1 - (1 - k/E)^n``) touches fewer: 82 of 128 experts for
    32 tokens at top-4, where the balanced rows touch all 128, so a fit that read balanced rows
    as random ones charged the per-expert costs of 128 experts to 82.

    Reference: ai-dynamo/aiconfigurator, ``collector/helper.py`` (``balanced_logits``).

    >>> [float(x) for x in balanced_share(np.array([1.0, 8.0, 32.0, 64.0]), 4.0, 128.0)]
    [0.03125, 0.25, 1.0, 1.0]
    >>> float(balanced_share(8.0, 6.0, 64.0)) * 64  # 6 runs of stride 11 wrap: one repeat
    47.0
    """
    n, k, e = np.broadcast_arrays(
        np.asarray(tokens, float), np.asarray(topk, float), np.asarray(experts, float)
    )
    shapes, which = np.unique(
        np.stack([n.ravel(), k.ravel(), e.ravel()], axis=1), axis=0, return_inverse=True
    )
    share = np.array([_balanced_experts(*(int(x) for x in row)) / row[2] for row in shapes])
    return share[which.ravel()].reshape(n.shape)


POWER_LAW_ALPHA = 1.2
"""The exponent of the MoE tables' power-law routing (``ROUTING``)."""

ROUTING = f"power_law_{POWER_LAW_ALPHA}"
"""The MoE tables' routing distribution the grouped experts are fitted on: AIConfigurator's
``power_law_1.2`` rows, the distribution its own estimates query (its ``MoeKey`` default,
aiconfigurator-core 0.12.0), each expert's load drawn from a power law of exponent 1.2. Real
routing is not balanced: on the tables' rows of 1,024 tokens or more the power-law rows take
1.2-1.8x the balanced rows' time (H200 and B200, every engine), and a fit to the balanced rows
predicted them 0.55-0.90x (``fit_moe``). The rows time the busiest expert-parallel rank, whose
share of the skew is known (``power_law_imbalance``), and the fit takes it as the row's
imbalance: what it fits is the kernels' rate, not this skew. A table without such rows is fitted
on its balanced rows (imbalance 1)."""


def _power_law_rank_loads(n: int, k: int, e: int, ep: int, alpha: float, samples: int, seed: int):
    """``samples`` draws of the tokens each of ``ep`` ranks receives under the power-law rule
    (``power_law_imbalance``): an array ``(samples, ep)``."""
    rng = np.random.default_rng(seed)
    lo, hi = (1.0, 0.8 * n) if n * k > e else (0.01, 2.0)
    a = 1.0 - alpha
    u = rng.random((samples, e))
    x = ((hi**a - lo**a) * u + lo**a) ** (1.0 / a)  # inverse CDF of p(x) ~ x^-alpha on [lo, hi]
    counts = np.round(x / x.sum(axis=1, keepdims=True) * (n * k))
    over = np.maximum(counts - n, 0.0).sum(axis=1)
    counts = np.minimum(counts, n)
    ranks = counts.reshape(samples, ep, e // ep).sum(axis=2)
    # what the bound took off, then what rounding left over (or over-gave), goes to the ranks one
    # token at a time in turn from rank 0
    turn = np.arange(ep)[None, :]

    def in_turn(d):
        m = np.abs(d)[:, None]
        return np.sign(d)[:, None] * (np.floor(m / ep) + (turn < np.mod(m, ep)))

    ranks = ranks + in_turn(over)
    return np.maximum(ranks + in_turn(n * k - ranks.sum(axis=1)), 0.0)


def power_law_imbalance(
    tokens, topk, experts, ep, alpha: float = POWER_LAW_ALPHA, samples: int = 64, seed: int = 0
) -> np.ndarray:
    """The busiest expert-parallel rank's routed tokens over the mean, ``imb = E[max_r L_r] /
    (n k / e)``, in a MoE table's power-law rows (``ROUTING``); 1 at ``e = 1``.

    AIConfigurator's collectors draw each of the ``E`` experts' loads from a power law of
    exponent ``alpha`` by its inverse CDF, on ``[1, 0.8 n]`` when ``n k > E`` (else on
    ``[0.01, 2]``), scale them to ``n k`` routed tokens, round them, cap each at ``n`` (a token
    picks an expert once) and hand what rounding and the cap leave over to the ranks in turn;
    then they swap the busiest rank's experts onto rank 0, the rank they time. A rank holds
    ``E/e`` consecutive experts, so its load is their sum, ``L_r``; the expectation is over
    ``samples`` draws (seeded: the same numbers every call). Where one rank holds every expert
    (``e = 1``) the skew stays inside the rank's grouped GEMM and ``imb = 1``. At 8,192 tokens
    routed to 8 of 256 experts it is 1.1 over 2 ranks, 2.5 over 16 and 18 over 256: the
    wide-expert-parallel rows time one hot expert, which a fit without it read as a slow kernel
    (on the H200 tables, rows of more than 1,024 tokens over 128-256 ranks came out 0.2-0.4x,
    over 2 ranks 1.4-1.8x).

    Reference: ai-dynamo/aiconfigurator, ``collector/helper.py`` (``sample_power_law``,
    ``_generate_power_law_distribution``).

    >>> [round(float(x), 1) for x in power_law_imbalance(8192.0, 8.0, 256.0, [1, 2, 16, 256])]
    [1.0, 1.1, 2.5, 18.1]
    """
    n, k, e, g = np.broadcast_arrays(*(np.asarray(x, float) for x in (tokens, topk, experts, ep)))
    shapes, which = np.unique(
        np.stack([n.ravel(), k.ravel(), e.ravel(), g.ravel()], axis=1), axis=0, return_inverse=True
    )
    for nn, kk, ee, gg in shapes:
        _check_routing(nn, kk, ee, gg)
    out = np.ones(len(shapes))
    for i, (nn, kk, ee, gg) in enumerate(shapes.astype(int)):
        if gg > 1 and nn > 0:
            loads = _power_law_rank_loads(nn, kk, ee, gg, alpha, samples, seed)
            out[i] = float(np.mean(loads.max(axis=1))) / (nn * kk / gg)
    return out[which.ravel()].reshape(n.shape)


def _check_routing(n: float, k: float, e: float, g: float) -> None:
    """Refuse a routing the collectors cannot draw, naming the argument and the value."""
    whole = {"tokens": n, "topk": k, "experts": e, "ep": g}
    for name, x in whole.items():
        if not (np.isfinite(x) and x == round(x)):
            raise ValueError(f"power_law_imbalance: {name} = {x!r} must be a whole number")
    if n < 0:
        raise ValueError(f"power_law_imbalance: tokens = {n:g} must be 0 or more")
    if not 1 <= k <= e:
        raise ValueError(f"power_law_imbalance: topk = {k:g} must be 1 to experts ({e:g})")
    if g < 1 or e % g:
        raise ValueError(
            f"power_law_imbalance: ep = {g:g} must be 1 or more and divide experts ({e:g}): "
            "each rank holds experts / ep of them"
        )


_PER_CLASS = (
    "expert_flops_efficiency",
    "expert_half_tokens",
    "expert_half_width",
    "expert_ep_slowdown",
)
"""``fit_moe``'s fields fitted per expert class (precision or weight-only class)."""


def _moe_unpack(z, n_prec: int, n_own: int) -> dict:
    """``fit_moe``'s fields from its parameters: ``n_prec`` expert classes, ``n_own`` of them
    weight-only classes with fixed costs of their own."""
    return {
        "expert_flops_efficiency": 0.02 + 0.98 * _logistic(z[:n_prec]),
        "expert_half_tokens": jnp.exp(z[n_prec : 2 * n_prec]),
        "expert_overhead": jnp.exp(z[2 * n_prec]),
        # each shared, then each class's own: with tensor-parallel experts, then over many
        # expert-parallel groups
        "moe_layer_overhead": jnp.exp(z[2 * n_prec + 1 : 2 * n_prec + 2 + n_own]),
        "moe_ep_overhead": jnp.exp(z[2 * n_prec + 2 + n_own : -1 - 2 * n_prec]),
        "expert_bandwidth_efficiency": 0.02 + 0.98 * _logistic(z[-1]),
        "expert_half_width": jnp.exp(z[-1 - 2 * n_prec : -1 - n_prec]),
        "expert_ep_slowdown": jnp.exp(z[-1 - n_prec : -1]),
    }


def _moe_model(z, d, c, statics):
    """``moe_layer_time`` of rows ``d`` at ``fit_moe``'s parameters ``z``."""
    n_prec, n_own, balanced = statics
    v = _moe_unpack(z, n_prec, n_own)
    v = {k: (x[d["prec"]] if k in _PER_CLASS else x) for k, x in v.items()}
    slot = c["slot"][d["prec"]]
    v["moe_layer_overhead"] = v["moe_layer_overhead"][slot]
    v["moe_ep_overhead"] = v["moe_ep_overhead"][slot]
    g = {
        "flops_efficiency": d["flops_efficiency"],
        "bandwidth_efficiency": c["bandwidth_efficiency"],
        "kernel_roofline_smoothness": c["kernel_roofline_smoothness"],
        "hbm_bandwidth": c["hbm_bandwidth"],
    }
    share = d["share"] if balanced else None
    return moe_layer_time(
        d["tokens"],
        d["hidden"],
        d["inter"],
        d["topk"],
        d["experts"],
        d["tp"],
        d["ep"],
        d["b_w"],
        d["peak"],
        v,
        g,
        share,
        d["imbalance"],
    )


def fit_moe(
    table: Mapping[str, np.ndarray],
    hardware: str,
    gemm: Mapping[str, float],
    seed: int = 0,
) -> KernelFit:
    """Fit the grouped experts' fields to a MoE layer table (``moe_layer_time``).

    The table's rows of gated experts routed as ``ROUTING`` (else its balanced rows) in the
    formats served (``_served``: block-scaled fp8 where the table has it), the fastest kernel per
    shape (``fastest_kernels``), are fitted with the GEMM fit's ``eta_p`` and ``r`` held
    (``gemm``: its values), each row's touched experts those of random routing (the serving
    model's; a balanced row's, ``balanced_share``): per
    precision ``eta_exp`` (``expert_flops_efficiency``), ``n_e`` (``expert_half_tokens``),
    the width ``w_e`` at which a tensor-parallel slice of an expert runs at half rate
    (``expert_half_width``) and the expert-parallel path's slowdown ``kappa``
    (``expert_ep_slowdown``);
    shared, the experts' own HBM rate ``eta_BW,e`` (``expert_bandwidth_efficiency``),
    ``c_e`` (``expert_overhead``, s per touched expert) and the layer's fixed cost
    with tensor-parallel experts ``c_1`` (``moe_layer_overhead``) and over many expert-parallel
    groups ``c_ep`` (``moe_ep_overhead``; ``moe_layer_time``), a weight-only class's its own
    (``precision.<class>.moe_layer_overhead``, ``.moe_ep_overhead``), fitted on its main kernel
    (``main_kernel``). The two differ by engine: one cost for both took vLLM's tables on H100
    and H200 to 16.6 % and 16.8 % (held out) where two give 15.4 % and 16.3 %, SGLang's to
    25.6 % and 26.6 % where two give 23.3 % and 24.3 % (its expert-parallel path 3-4x the
    tensor-parallel one's), TensorRT-LLM's alike. Without ``w_e`` and ``kappa`` one rate served
    every layout, and where the layouts' rates differ the fit split the difference: on H200 the
    rows of 1,024 tokens or more with tensor-parallel block-fp8 experts came out a median 32 %
    (TensorRT-LLM 1.3.0rc20, predicted too fast) and 81 % (SGLang 0.5.14, too slow) off; with
    them, 5 % and 10 %, and every table's held-out median fell (H200: TensorRT-LLM 19.7 % to
    13.7 %, SGLang 24.2 % to 22.7 %, vLLM 16.0 % to 12.6 %; these on the balanced rows, which
    the fit took before ``ROUTING``).

    Args:
      table: columns ``moe_dtype``, ``num_tokens``, ``hidden_size``, ``inter_size``, ``topk``,
        ``num_experts``, ``moe_tp_size``, ``moe_ep_size``, ``distribution``, ``latency`` (ms);
        ``kernel_source`` where several kernels were timed.
      hardware: the dcost hardware preset.
      gemm: ``fit_gemm``'s values.
    """
    chip = _chip(hardware)
    routed = np.asarray(table["distribution"]).astype(str)
    want = ROUTING if (routed == ROUTING).any() else "balanced"
    table = fastest_kernels(
        {c: np.asarray(v)[(routed == want) & _served(table)] for c, v in table.items()}
    )
    dtype = np.asarray(table["moe_dtype"]).astype(str)
    dist = np.asarray(table["distribution"]).astype(str)

    from dcost.engines import WEIGHT_ONLY_EXPERTS

    source = np.asarray(table.get("kernel_source", np.full(len(dtype), ""))).astype(str)

    def rows_of(p):
        rows = (dist == want) & np.isin(dtype, [d for d, q in _MOE_PRECISION.items() if q == p])
        if p in WEIGHT_ONLY_EXPERTS:
            rows &= source == main_kernel(source[rows])
        return rows

    def computes(p):  # the GEMM precision an expert class runs its matmuls at
        return WEIGHT_ONLY_EXPERTS[p][0] if p in WEIGHT_ONLY_EXPERTS else p

    precisions = [
        p
        for p in ("bf16", "fp8", "fp4", *WEIGHT_ONLY_EXPERTS)
        if f"precision.{computes(p)}.flops_efficiency" in gemm and rows_of(p).sum() >= MIN_ROWS
    ]
    if not precisions:
        raise ValueError(f"MoE table for {hardware}: no {want} rows of a fitted GEMM precision")
    parts = [_sample(rows_of(p), SAMPLE, seed + i) for i, p in enumerate(precisions)]
    idx = np.concatenate(parts)
    prec = np.concatenate([np.full(len(part), i) for i, part in enumerate(parts)])
    shape = [
        np.asarray(table[c], float)[idx]
        for c in (
            "num_tokens",
            "hidden_size",
            "inter_size",
            "topk",
            "num_experts",
            "moe_tp_size",
            "moe_ep_size",
        )
    ]
    y = np.asarray(table["latency"], float)[idx] * 1e-3
    b_w = np.asarray([_BYTES[d] for d in dtype[idx]])
    peak = np.asarray([_peak(chip, computes(precisions[i])) for i in prec])
    n_prec = len(precisions)
    # a weight-only class's fused kernel has its own fixed cost (its last parameters)
    own = [i for i, p in enumerate(precisions) if p in WEIGHT_ONLY_EXPERTS]
    slot = np.zeros(n_prec, int)
    slot[own] = 1 + np.arange(len(own))
    names = ("tokens", "hidden", "inter", "topk", "experts", "tp", "ep")
    rows = dict(zip(names, shape, strict=True))
    rows |= {"b_w": b_w, "peak": peak, "prec": prec}
    rows["flops_efficiency"] = np.asarray(
        [gemm[f"precision.{computes(precisions[i])}.flops_efficiency"] for i in prec]
    )
    # a balanced row's touched experts are its own (``balanced_share``), a routed one's random
    # routing's, as the serving model takes them; a routed row times its busiest rank
    if want == "balanced":
        rows["share"] = balanced_share(shape[0], shape[3], shape[4])
        rows["imbalance"] = np.ones(len(y))
    else:
        rows["imbalance"] = power_law_imbalance(shape[0], shape[3], shape[4], shape[6])
    consts = {
        "slot": slot,
        "bandwidth_efficiency": np.float64(gemm["bandwidth_efficiency"]),
        "kernel_roofline_smoothness": np.float64(gemm["kernel_roofline_smoothness"]),
        "hbm_bandwidth": np.float64(chip["hbm_bandwidth"]),
    }
    z0 = (
        [1.0] * n_prec
        + [math.log(32.0)] * n_prec
        + [math.log(1e-6)]
        + [math.log(2e-5)] * (2 + 2 * len(own))
        + [math.log(64.0)] * n_prec
        + [0.0] * n_prec
        + [1.5]
    )
    statics = (n_prec, len(own), want == "balanced")
    z, (rms, med, p90) = _fit(_moe_model, statics, z0, rows, consts, y, seed)
    v = {k: np.asarray(x) for k, x in _moe_unpack(z, n_prec, len(own)).items()}
    values = {}
    for i, p in enumerate(precisions):
        for name in _PER_CLASS:
            values[f"precision.{p}.{name}"] = float(v[name][i])
    values["expert_overhead"] = float(v["expert_overhead"])
    values["expert_bandwidth_efficiency"] = float(v["expert_bandwidth_efficiency"])
    for name in ("moe_layer_overhead", "moe_ep_overhead"):
        values[name] = float(v[name][0])
        for i in own:
            values[f"precision.{precisions[i]}.{name}"] = float(v[name][slot[i]])
    return KernelFit("moe", values, len(y), rms, med, p90)


INDEX_SMALL = (16, 2048)
"""Largest batch and context of the sparse-attention rows whose indexer cost is taken: where the
module is at its latency floor, and its work (which the serving model prices) is small."""


def fit_sparse_index(table: Mapping[str, np.ndarray], seed: int = 0, without=None) -> KernelFit:
    """A sparse-attention indexer's fixed cost a layer, ``index_layer_overhead``, from a DSA
    generation-module table that times the module with its indexer and without it (AIConfigurator
    times GLM-5.2's layers that reuse an earlier layer's top-k as ``*skip_indexer*`` kernels;
    SGLang's tables), or else against ``without``, a table of the MLA generation module of a
    dense-attention model (DeepSeek-V3: vLLM's and TensorRT-LLM's tables).

    Pairs of rows alike but for the indexer (heads, batch, context, KV and GEMM formats, tensor
    parallelism) at small batch and context (``INDEX_SMALL``) give ``c = t_indexer - t_skip``;
    ``c`` is the median over 80 % of the pairs, and the residual is that of
    ``t_indexer = t_skip + c`` on the other 20 % (all sizes' pairs among them: how far a constant
    carries). Raises ``ValueError`` when the table has no such pairs (an engine whose table times
    one kind only: no fit, the field stays 0).

    >>> n = 100  # 50 pairs: batch 1-10 at 5 contexts, 65 us with the indexer, 35 without
    >>> batch = np.repeat(np.tile(np.arange(1.0, 11.0), 5), 2)
    >>> t = {"kernel_source": np.array(["dsa_indexer", "dsa_skip_indexer"] * 50),
    ...      "num_heads": np.full(n, 8.0), "batch_size": batch,
    ...      "step": np.repeat([64.0, 256.0, 512.0, 1024.0, 2048.0], 20),
    ...      "kv_cache_dtype": np.array(["fp8"] * n), "gemm_type": np.array(["fp8_block"] * n),
    ...      "tp_size": np.full(n, 8.0), "latency": np.tile([0.065, 0.035], 50)}
    >>> round(fit_sparse_index(t).values["index_layer_overhead"] * 1e6, 3)  # 30 us, in s
    30.0
    """
    source = np.asarray(table["kernel_source"]).astype(str)
    skip = np.char.find(source, "skip") >= 0
    keys = ("num_heads", "batch_size", "step", "kv_cache_dtype", "gemm_type", "tp_size")
    latency = np.asarray(table["latency"], dtype=float) * 1e-3  # ms in the tables
    base: dict[tuple, list[float]] = {}
    for i in np.flatnonzero(skip):
        base.setdefault(tuple(str(table[k][i]) for k in keys), []).append(latency[i])
    if not base and without is not None:
        lat = np.asarray(without["latency"], dtype=float) * 1e-3
        for j in range(len(lat)):
            base.setdefault(tuple(str(without[k][j]) for k in keys), []).append(lat[j])
    pairs = [
        (latency[i], min(base[key]), float(table["batch_size"][i]), float(table["step"][i]))
        for i in np.flatnonzero(~skip)
        if (key := tuple(str(table[k][i]) for k in keys)) in base
    ]
    if len(pairs) < MIN_ROWS:
        raise ValueError("no rows time the module with and without its indexer")
    t_ix, t_skip, batch, ctx = (np.asarray(x) for x in zip(*pairs, strict=True))
    fit_i, held_i = _split(len(pairs), seed)
    small = (batch <= INDEX_SMALL[0]) & (ctx <= INDEX_SMALL[1])
    use = fit_i[small[fit_i]]
    if len(use) < MIN_ROWS:
        raise ValueError("too few small rows time the module with and without its indexer")
    c = float(np.median(t_ix[use] - t_skip[use]))
    rms, med, p90 = _residuals(t_skip[held_i] + c, t_ix[held_i])
    return KernelFit("sparse_attention", {"index_layer_overhead": c}, len(pairs), rms, med, p90)


def main_kernel(sources: np.ndarray) -> str:
    """The kernel source with the most rows among ``sources`` (a class's rows of a MoE table):
    a weight-only expert class is fitted on the one kernel that serves it. AIConfigurator's
    ``w4a16_mxfp4`` rows time gpt-oss's own MXFP4 kernel on its shapes (hidden 2880, 32 or 128
    experts) and, beside it on vLLM and SGLang, a Marlin kernel of another model (hidden 3584,
    896 experts, half as many rows); one curve and one fixed cost fitted to both predicted
    gpt-oss's kernel 1.2-1.9x too slow on H200 (vLLM 0.24, 1-8,192 tokens, TP 1 and 4). ""
    for no rows.

    >>> main_kernel(np.array(["triton", "marlin", "triton"]))
    'triton'
    """
    names, counts = np.unique(np.asarray(sources).astype(str), return_counts=True)
    return str(names[np.argmax(counts)]) if len(names) else ""


# ---- a whole profile -----------------------------------------------------------------------


def fit_tables(tables: Mapping[str, Mapping[str, np.ndarray]], hardware: str, seed: int = 0):
    """Every kernel fit of one engine on one chip: ``{kind: KernelFit}`` from the tables named
    "gemm", "generation_attention", "context_attention", "generation_mla", "context_mla",
    "allreduce", "dsa_generation" and "moe" (all but the first optional)."""
    fits = {"gemm": fit_gemm(tables["gemm"], hardware, seed)}
    r = fits["gemm"].values["kernel_roofline_smoothness"]
    if "generation_attention" in tables or "context_attention" in tables:
        fits["attention"] = fit_attention(
            tables.get("generation_attention"), tables.get("context_attention"), hardware, r, seed
        )
    if "generation_mla" in tables:
        fits["mla_attention"] = fit_mla(
            tables["generation_mla"], tables.get("context_mla"), hardware, r, seed
        )
    if "allreduce" in tables:
        fits["allreduce"] = fit_allreduce(tables["allreduce"], hardware, seed)
    if "dsa_generation" in tables:
        try:
            fits["sparse_attention"] = fit_sparse_index(
                tables["dsa_generation"], seed, tables.get("mla_generation_module")
            )
        except ValueError:
            pass  # the table times the module one way only: no indexer cost (0)
    if "moe" in tables:
        try:
            fits["moe"] = fit_moe(tables["moe"], hardware, fits["gemm"].values, seed)
        except ValueError:
            pass  # no usable rows: grouped experts at the GEMM's rate (profile_from_fits)
    return fits


def profile_from_fits(fits: Mapping[str, KernelFit], family_profile: Mapping[str, float]):
    """``(shared profile, per-precision profile)`` from kernel fits. Fields the kernel tables
    cannot show come from ``family_profile`` (the chip family's fitted profile) and are named in
    the provenance by ``rebuild``: scale-out links, and the fixed costs until
    ``dcost.calibrate.engines.rebuild`` fits them end to end (``layer_overhead`` starts at 0)."""
    shared: dict[str, float] = {}
    precision: dict[str, dict[str, float]] = {}
    for fit in fits.values():
        for key, value in fit.values.items():
            if key.endswith("_intercept") and not key.endswith(".gemm_intercept"):
                continue  # a kernel timed alone: launch and tail (the provenance keeps them)
            if key.startswith("precision."):
                _, p, field = key.split(".")
                precision.setdefault(p, {})[field] = value
            else:
                shared[key] = value
    shared["layer_overhead"] = 0.0
    shared["gemm_intercept_share"] = 0.0  # fitted end to end, as ``layer_overhead``
    shared["kernel_serialization"] = 1.0
    shared["tree_collectives"] = 1.0
    shared["hierarchical_collectives"] = 1.0
    for key in ("scaleout_efficiency", "scaleout_latency", "step_overhead", "sequence_overhead"):
        if key in family_profile:
            shared[key] = float(family_profile[key])
    if "scaleup_efficiency" not in shared:
        for key in ("scaleup_efficiency", "scaleup_latency"):
            shared[key] = float(family_profile[key])
    for p in precision:  # a precision without MoE rows: grouped experts at the GEMM's rate
        precision[p].setdefault("expert_flops_efficiency", 1.0)
    return shared, precision


def rebuild(
    root,
    out_dir,
    gpus: Sequence[str] = tuple(GPU_PRESETS),
    engines: Sequence[str] = ("vllm", "sglang", "trtllm"),
    package: str = "aiconfigurator-core",
    seed: int = 0,
    log=print,
) -> list[pathlib.Path]:
    """Fit and write a profile for every (GPU, engine) with tables under ``root``.

    Args:
      root: AIConfigurator's data root (``aiconfigurator_core/systems/data`` of the installed
        package).
      out_dir: where to write ``<engine>-<version>-<hardware>.toml``.
      gpus, engines: which to build.
      package: the source package and version, for the provenance.
      seed: the random draw of rows.
      log: where to print one line per profile.

    Returns:
      The files written.
    """
    from dcost.engines import Engine, default_scheduler

    root, out_dir = pathlib.Path(root), pathlib.Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for gpu in gpus:
        hardware = GPU_PRESETS[gpu]
        family = presets.card_family(hardware)
        family_profile = presets.calibration_profile(family)
        for name in engines:
            found = find_tables(root, gpu, name)
            if found is None:
                continue
            version = str(found.pop("version"))
            tables = {k: read_table(v) for k, v in found.items()}
            fits = fit_tables(tables, hardware, seed)
            if "sparse_attention" not in fits:  # tables no fit used are not the profile's source
                for k in ("dsa_generation", "mla_generation_module"):
                    found.pop(k, None)
                    tables.pop(k, None)
            shared, precision = profile_from_fits(fits, family_profile)
            rel = {k: str(pathlib.Path(v).relative_to(root)) for k, v in found.items()}
            provenance = {
                "source": f"{package} (ai-dynamo/aiconfigurator), systems/data, Apache-2.0",
                "tables": rel,
                "rows": {k: int(len(t["latency"])) for k, t in tables.items()},
                "fitted_from_kernels": sorted(
                    {
                        k.split(".")[-1]
                        for f in fits.values()
                        for k in f.values
                        if not k.endswith("_intercept") or k.endswith(".gemm_intercept")
                    }
                    | {"layer_overhead"}
                ),
                "from_family_profile": sorted(
                    k
                    for k in (
                        "scaleout_efficiency",
                        "scaleout_latency",
                        "step_overhead",
                        "sequence_overhead",
                    )
                    if k in shared
                ),
                "family": family,
                "residuals": {
                    kind: {
                        "rows": fit.rows,
                        "heldout_rms_log": fit.rms_log,
                        "heldout_median_abs": fit.median_abs,
                        "heldout_p90_abs": fit.p90_abs,
                    }
                    for kind, fit in fits.items()
                },
                "intercepts": {
                    k: v
                    for fit in fits.values()
                    for k, v in fit.values.items()
                    if k.endswith("_intercept") and not k.endswith(".gemm_intercept")
                },
            }
            eng = Engine(
                name=name,
                version=version,
                hardware_name=hardware,
                profile=shared,
                precision_profile=precision,
                provenance=provenance,
                scheduler=default_scheduler(name, hardware),
            )
            path = write_profile(eng, out_dir / f"{name}-{version}-{hardware}.toml")
            written.append(path)
            res = ", ".join(f"{k} {f.median_abs:.1%}" for k, f in fits.items())
            log(f"{name} {version} on {hardware}: held-out median error {res}")
    return written
