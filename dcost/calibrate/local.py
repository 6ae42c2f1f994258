"""Calibration against real hardware: measure this machine's F and BW, time a real decode step.

JAX micro-benchmarks on the default device (CPU here; the GPU where there is one) measure the
matmul rate ``F`` (a jitted ``jnp.dot`` of square matrices, ``2 n^3`` FLOPs, median of repeats) and
the memory bandwidth ``BW`` (a jitted streaming sum over an array far larger than the caches, its
bytes read once). A small transformer written in plain ``jax.numpy`` (random weights, a KV cache
of ``T`` tokens) is timed for one decode step at batches ``1, 2, 4, ..., 256`` and compared with
``dcost.decode`` for a ``dcost.Hardware`` built from the measured F and BW and a ``dcost.Model``
built from the toy's own counts:

    N     = L*(4*d^2 + 2*d*d_ff) + d*V         # matmul weights: q, k, v, o, MLP in/out, unembedding
    b_kv  = 2*L*d*bytes                         # K and V of every layer
    a     = 4*L*d                               # q.K and p.V over each context token
    t(B)  = max(B*(2N + a*T)/F, (bytes*N + B*T*b_kv)/BW)      # dcost.decode, one chip
    B*    = dcost.balance_batch(hardware, model, T)            # the knee

The measured knee comes from fitting ``max(alpha + k*B, gamma*B)`` to the measured times, with
``k = T*b_kv/BW`` the measured KV read time per sequence (least squares in log time over every
split of the batches): ``B* = alpha/(gamma - k)``. ``fit_efficiency`` finds the achievable fractions
``eta_F``, ``eta_BW`` (``dcost.Hardware.flops_efficiency``, ``bandwidth_efficiency``) that make
``dcost.decode`` fit the measured times: the calibration of the roofline.

The embedding lookup (``B`` rows, not the table), norms and softmax are left out of ``N`` and the
FLOP count (they are ``O(L*(d + d_ff + T))`` per token against ``O(L*d^2)``), and so is the new
token's attention to itself (``4*L*d`` FLOPs).

Reference: Williams, Waterman & Patterson, "Roofline" (CACM 2009); the JAX scaling book, "All
about Transformer inference" (arithmetic intensity of decode).
"""

from __future__ import annotations

import dataclasses
import math
import time

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost import _xla
from dcost.serving.kernels import kernel_time
from dcost.serving.roofline import balance_batch, decode, matmul_efficiency
from dcost.specs import Design, Hardware, Model, Workload

__all__ = [
    "ToyConfig",
    "measure_flops",
    "measure_bandwidth",
    "init_params",
    "init_cache",
    "decode_step",
    "toy_model",
    "toy_flops_per_token",
    "measure_decode",
    "fit_knee",
    "fit_efficiency",
    "fit_matmul_curve",
    "fit_kernel_roofline",
    "calibrate",
    "Calibration",
    "QUICK",
    "FULL",
]


def _median_time(fn, *args, repeats: int) -> float:
    """Median wall time of ``fn(*args)`` (s) after one warm-up call that compiles it; ``repeats``
    (timed calls) must be an int >= 1."""
    if isinstance(repeats, bool) or not isinstance(repeats, (int, np.integer)) or repeats < 1:
        raise ValueError(f"repeats = {repeats!r} is not allowed: it must be an int >= 1")
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(int(repeats)):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


_ROW = 4096
"""Numbers per row of ``measure_bandwidth``'s array."""


def _measuring(fun, **kwargs):
    """``jax.jit(fun)`` compiled to run fast whatever the process prefers (``dcost._xla``: a
    process that compiles everything at XLA's level 0, such as the test suite, would otherwise
    time unoptimized loops, not the machine)."""
    return jax.jit(fun, compiler_options=_xla.options(False), **kwargs)


def measure_flops(n: int = 2048, dtype=jnp.float32, repeats: int = 5) -> float:
    """Matmul rate of the default device: ``2 n^3 / t`` for a jitted ``jnp.dot`` of two n x n.

    Args:
      n: matrix side.
      dtype: element type (``jnp.float32``, ``jnp.bfloat16``).
      repeats: timed calls; the median is used.

    Returns:
      FLOP/s.

    >>> f = measure_flops(64, repeats=2)
    >>> bool(f > 0 and math.isfinite(f))
    True
    """
    if n < 1:
        raise ValueError(f"n = {n} is not allowed: it must be >= 1")
    rng = np.random.default_rng(0)
    a, b = _normal(rng, (n, n), dtype), _normal(rng, (n, n), dtype)
    t = _median_time(_measuring(jnp.dot), a, b, repeats=repeats)
    return 2.0 * n**3 / t


def measure_bandwidth(n_bytes: float = 512e6, repeats: int = 5) -> float:
    """Memory bandwidth of the default device: bytes of a float32 array over the time of a jitted
    sum of it (a streaming read, like the weight and KV reads of decode).

    The array is read as rows of ``_ROW`` numbers summed column by column, a loop XLA's own CPU
    code streams (about 22 GB/s on the development machine's 2 cores, against 10 GB/s for one
    sum over a flat array, which XLA:CPU reduces serially; 25 GB/s for that flat sum in the
    YNNPACK fusion ``dcost._xla.guard_ynn`` turns off).

    Args:
      n_bytes: array size in bytes; make it far larger than the last-level cache.
      repeats: timed calls; the median is used.

    Returns:
      bytes/s.

    >>> bw = measure_bandwidth(4e6, repeats=2)
    >>> bool(bw > 0 and math.isfinite(bw))
    True
    """
    n = int(n_bytes // 4)
    if n < 1:
        raise ValueError(f"n_bytes = {n_bytes} is not allowed: it must be >= 4")
    shape = (n // _ROW, _ROW) if n >= _ROW else (1, n)
    x = _normal(np.random.default_rng(1), shape, jnp.float32)
    t = _median_time(_measuring(lambda v: jnp.sum(v, axis=0)), x, repeats=repeats)
    return 4.0 * x.size / t


@dataclasses.dataclass(frozen=True)
class ToyConfig:
    """A small pre-norm transformer (MHA, GELU MLP, untied unembedding).

    Attributes:
      n_layers: ``L``. d_model: ``d``. n_heads: heads (``d`` divisible by it). d_ff: MLP width.
      vocab: ``V``. context: KV-cache tokens ``T`` per sequence. dtype: weights, activations
      and KV cache ("float32" or "bfloat16").
    """

    n_layers: int = 4
    d_model: int = 512
    n_heads: int = 8
    d_ff: int = 2048
    vocab: int = 8192
    context: int = 128
    dtype: str = "float32"

    def __post_init__(self):
        for name in ("n_layers", "d_model", "n_heads", "d_ff", "vocab", "context"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"ToyConfig.{name} = {v!r} is not allowed: it must be an int >= 1")
        if self.d_model % self.n_heads:
            raise ValueError(
                f"ToyConfig.d_model = {self.d_model} is not allowed: it must be "
                f"divisible by n_heads = {self.n_heads}"
            )
        if self.dtype not in ("float32", "bfloat16"):
            raise ValueError(
                f"ToyConfig.dtype = {self.dtype!r} is not allowed: it must be "
                "'float32' or 'bfloat16'"
            )

    @property
    def bytes_per_element(self) -> int:
        return jnp.dtype(self.dtype).itemsize


QUICK = ToyConfig(n_layers=2, d_model=128, n_heads=4, d_ff=512, vocab=1024, context=16)
"""Tiny toy for ``--quick`` and tests."""
FULL = ToyConfig()
"""The default toy: 4 layers, d 512, 16.8M matmul parameters, 16 KiB of KV per token, T = 128."""


def _normal(rng, shape, dtype, scale=1.0):
    """Gaussian array made on the host (NumPy), so no kernel is compiled per shape."""
    x = rng.standard_normal(shape, dtype=np.float32)
    if scale != 1.0:
        x *= np.float32(scale)
    return jnp.asarray(x.astype(jnp.dtype(dtype)))


def init_params(cfg: ToyConfig, seed: int = 0) -> dict:
    """Random weights: ``embed [V, d]``, per layer ``wq wk wv wo [d, d]``, ``w1 [d, d_ff]``,
    ``w2 [d_ff, d]``, norms ``[d]``; ``final_norm [d]``, ``unembed [d, V]``."""
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab
    dt = jnp.dtype(cfg.dtype)
    rng = np.random.default_rng(seed)

    def w(shape, fan_in):
        return _normal(rng, shape, dt, 1.0 / math.sqrt(fan_in))

    layers = []
    for _ in range(cfg.n_layers):
        layers.append(
            {
                "wq": w((d, d), d),
                "wk": w((d, d), d),
                "wv": w((d, d), d),
                "wo": w((d, d), d),
                "w1": w((d, f), d),
                "w2": w((f, d), f),
                "norm1": jnp.ones((d,), dt),
                "norm2": jnp.ones((d,), dt),
            }
        )
    return {
        "embed": w((v, d), 1.0),
        "layers": layers,
        "final_norm": jnp.ones((d,), dt),
        "unembed": w((d, v), d),
    }


def init_cache(cfg: ToyConfig, batch: int, seed: int = 1) -> dict:
    """Random KV cache: ``k`` and ``v`` of shape ``[L, B, heads, T, d_head]`` (heads before
    positions, so each (sequence, head) reads one contiguous block)."""
    h = cfg.n_heads
    shape = (cfg.n_layers, batch, h, cfg.context, cfg.d_model // h)
    rng = np.random.default_rng(seed)
    return {"k": _normal(rng, shape, cfg.dtype), "v": _normal(rng, shape, cfg.dtype)}


def _rms_norm(x, g):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + 1e-6)).astype(x.dtype) * g


def decode_step(params: dict, cache: dict, tokens, cfg: ToyConfig):
    """One decode step: each of ``B`` sequences reads its ``T``-token KV cache and emits logits.

    The new token attends to the ``T`` cached positions and to itself. The cache is read, not
    written (a serving engine writes one row per layer, ``O(d)`` bytes).

    Args:
      params: ``init_params`` output. cache: ``init_cache`` output. tokens: int ``[B]``.
      cfg: the config.

    Returns:
      Logits ``[B, V]``.
    """
    h = cfg.n_heads
    dh = cfg.d_model // h
    x = params["embed"][tokens]  # [B, d]
    b = x.shape[0]
    scale = 1.0 / math.sqrt(dh)
    for i, lp in enumerate(params["layers"]):
        y = _rms_norm(x, lp["norm1"])
        q = (y @ lp["wq"]).reshape(b, h, dh)
        k_new = (y @ lp["wk"]).reshape(b, h, dh)
        v_new = (y @ lp["wv"]).reshape(b, h, dh)
        k_c, v_c = cache["k"][i], cache["v"][i]  # [B, h, T, dh]
        s_c = jnp.einsum("bhd,bhtd->bht", q, k_c) * scale
        s_n = jnp.sum(q * k_new, -1, keepdims=True) * scale
        p = jax.nn.softmax(jnp.concatenate([s_c, s_n], -1).astype(jnp.float32), -1)
        p = p.astype(x.dtype)
        att = jnp.einsum("bht,bhtd->bhd", p[..., :-1], v_c) + p[..., -1:] * v_new
        x = x + att.reshape(b, cfg.d_model) @ lp["wo"]
        y = _rms_norm(x, lp["norm2"])
        x = x + jax.nn.gelu(y @ lp["w1"]) @ lp["w2"]
    return _rms_norm(x, params["final_norm"]) @ params["unembed"]


def toy_model(cfg: ToyConfig) -> Model:
    """The toy as ``dcost`` sees it: ``N = L(4d^2 + 2 d d_ff) + dV``, ``b_kv = 2 L d bytes``,
    ``a = 4 L d``, dense, weights and KV in ``cfg.dtype``."""
    L, d = cfg.n_layers, cfg.d_model
    n = L * (4 * d * d + 2 * d * cfg.d_ff) + d * cfg.vocab
    by = cfg.bytes_per_element
    return Model(
        n_layers=L,
        d_model=d,
        params_dense=float(n),
        params_per_expert=0.0,
        n_experts=0.0,
        experts_active=0.0,
        kv_bytes_per_token=2.0 * L * d * by,
        bytes_per_param=float(by),
        attn_flops_per_context_token=4.0 * L * d,
        act_bytes=float(by),
    )


def toy_flops_per_token(cfg: ToyConfig) -> float:
    """``2N + aT``: the decode FLOPs per token dcost predicts for the toy at its context.

    >>> toy_flops_per_token(ToyConfig(n_layers=1, d_model=8, n_heads=2, d_ff=16, vocab=10,
    ...                               context=4))
    1312.0
    """
    m = toy_model(cfg)
    return float(2.0 * m.params_active + m.attn_flops_per_context_token * cfg.context)


def measure_decode(cfg: ToyConfig, batches, repeats: int = 5) -> np.ndarray:
    """Median seconds of one jitted ``decode_step`` at each batch size (default device)."""
    params = init_params(cfg)
    step = _measuring(decode_step, static_argnums=3)
    out = []
    for b in batches:
        cache = init_cache(cfg, int(b), seed=int(b))
        tokens = jnp.arange(int(b), dtype=jnp.int32) % cfg.vocab
        out.append(_median_time(step, params, cache, tokens, cfg, repeats=repeats))
        del cache
    return np.asarray(out)


def fit_knee(batches, times, kv_slope: float = 0.0):
    """Knee of measured step times: fit ``t = max(alpha + k*B, gamma*B)``, a memory floor whose
    slope ``k`` is the KV read time per sequence (known: ``T*b_kv/BW``), then a compute line, by
    least squares in ``log t`` over every split of the sorted batches (one point at least on the
    left, two on the right), and return ``B* = alpha/(gamma - k)``; ``inf`` when the memory line
    alone fits as well (1 %) or no split has ``gamma > k``.

    Args:
      batches: batch sizes. times: measured step times (s). kv_slope: ``k`` (s per sequence).

    Returns:
      ``(knee, (alpha, gamma))``.

    >>> b = np.array([1, 2, 4, 8, 16, 32, 64.0])
    >>> knee, _ = fit_knee(b, np.maximum(1.0 + 0.01 * b, 0.1 * b), kv_slope=0.01)
    >>> round(knee, 2)
    11.11
    """
    b = np.asarray(batches, dtype=float)
    t = np.asarray(times, dtype=float)
    order = np.argsort(b)
    b, t = b[order], t[order]
    k = float(kv_slope)

    def floor(bs, ts):  # alpha minimizing sum log((alpha + k b)/t)^2, by a few Newton steps
        alpha = max(float(np.min(ts - k * bs)), 1e-30)
        for _ in range(50):
            r = np.log((alpha + k * bs) / ts)
            d = 1.0 / (alpha + k * bs)
            alpha = max(alpha - np.sum(r * d) / np.sum(d * d * (1.0 - r)), 1e-30)
        return alpha

    alpha = floor(b, t)
    best = (np.sum(np.log((alpha + k * b) / t) ** 2), (alpha, 0.0))
    for s in range(1, len(b) - 1):
        al = floor(b[:s], t[:s])
        ga = math.exp(np.mean(np.log(t[s:] / b[s:])))
        err = np.sum(np.log(np.maximum(al + k * b, ga * b) / t) ** 2)
        if ga > k and err < 0.99 * best[0] - 1e-12:  # a knee must clearly fit better
            best = (err, (al, ga))
    al, ga = best[1]
    knee = al / (ga - k) if ga > k else math.inf
    return float(knee), (float(al), float(ga))


@dataclasses.dataclass
class Calibration:
    """What ``calibrate`` measured and predicted (SI units)."""

    device: str
    flops: dict  # dtype name -> FLOP/s (matmul)
    bandwidth: float  # bytes/s (streaming read)
    config: ToyConfig
    params: float  # N of the toy
    kv_bytes_per_token: float
    batches: list
    measured_s: list
    predicted_s: list
    knee_measured: float
    knee_predicted: float
    flops_efficiency: float = 1.0  # eta_F fitted to the measured times (fit_efficiency)
    bandwidth_efficiency: float = 1.0  # eta_BW fitted likewise
    calibrated_s: list = dataclasses.field(default_factory=list)  # dcost.decode with the etas
    knee_calibrated: float = math.inf

    @property
    def ratios(self) -> list:
        return [m / p for m, p in zip(self.measured_s, self.predicted_s, strict=True)]

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["ratios"] = self.ratios
        return d


def _hardware(flops: float, bandwidth: float, eta_f: float = 1.0, eta_bw: float = 1.0) -> Hardware:
    # Only F and BW (and their efficiencies) enter a one-chip decode; the rest are placeholders.
    return Hardware(
        flops=flops,
        hbm_bandwidth=bandwidth,
        hbm_capacity=1e12,
        scaleup_bandwidth=1e9,
        scaleout_bandwidth=1e9,
        scaleup_size=1,
        price_per_hour=1.0,
        flops_efficiency=eta_f,
        bandwidth_efficiency=eta_bw,
    )


def calibrate(
    quick: bool = False, config: ToyConfig | None = None, batches=None, repeats: int | None = None
) -> Calibration:
    """Measure F and BW, time the toy's decode step over batches, and predict it with dcost.

    Args:
      quick: tiny sizes (``QUICK``, batches 1..16, 3 repeats) for tests and smoke runs.
      config: the toy (default ``QUICK`` or ``FULL``).
      batches: batch sizes (default powers of 2 up to 16 quick, 256 full).
      repeats: timed calls per measurement (median).

    Returns:
      A ``Calibration``.
    """
    cfg = config or (QUICK if quick else FULL)
    batches = list(batches or [2**i for i in range(5 if quick else 9)])
    repeats = repeats or (3 if quick else 5)
    dt = jnp.dtype(cfg.dtype)
    n = 256 if quick else 2048
    flops = {"float32": measure_flops(n, jnp.float32, repeats)}
    try:
        flops["bfloat16"] = measure_flops(n, jnp.bfloat16, repeats)
    except Exception:  # pragma: no cover - a device without bf16 matmul: reported as nan
        flops["bfloat16"] = float("nan")
    bw = measure_bandwidth(32e6 if quick else 1e9, repeats)
    hw = _hardware(flops[dt.name], bw)
    model = toy_model(cfg)
    design = Design(batch=jnp.asarray(batches, dtype=jnp.result_type(float)))
    predicted = np.asarray(decode(design, hw, model, Workload(float(cfg.context))).tpot)
    measured = measure_decode(cfg, batches, repeats)
    kv_slope = cfg.context * float(model.kv_bytes_per_token) / bw  # s per sequence
    knee, _ = fit_knee(batches, measured, kv_slope=kv_slope)
    eta_f, eta_bw = fit_efficiency(batches, measured, hw, model, cfg.context)
    hw_cal = _hardware(flops[dt.name], bw, eta_f, eta_bw)
    calibrated = np.asarray(decode(design, hw_cal, model, Workload(float(cfg.context))).tpot)
    return Calibration(
        device=str(jax.devices()[0].device_kind),
        flops=flops,
        bandwidth=bw,
        config=cfg,
        params=float(model.params_active),
        kv_bytes_per_token=float(model.kv_bytes_per_token),
        batches=[int(b) for b in batches],
        measured_s=[float(x) for x in measured],
        predicted_s=[float(x) for x in predicted],
        knee_measured=knee,
        knee_predicted=float(balance_batch(hw, model, float(cfg.context))),
        flops_efficiency=eta_f,
        bandwidth_efficiency=eta_bw,
        calibrated_s=[float(x) for x in calibrated],
        knee_calibrated=float(balance_batch(hw_cal, model, float(cfg.context))),
    )


def fit_efficiency(
    batches, measured_s, hardware: Hardware, model: Model, context, n_grid: int = 161
):
    """Achievable fractions ``(eta_F, eta_BW)`` that make ``dcost.decode`` fit measured step times.

        (eta_F, eta_BW) = argmin  sum_B ( log t_meas(B) - log t_decode(B; F*eta_F, BW*eta_BW) )^2
                          over eta_F, eta_BW in [1e-3, 1]

    on a log-spaced grid of both (the exact model, every grid point in one vectorized call). A
    measured time shorter than the roofline's is matched by the cap ``eta = 1``.

    Args:
      batches: batch sizes. measured_s: step times (s). hardware: F and BW (efficiencies 1).
      model: the network. context: KV tokens ``T``. n_grid: points per axis.

    Returns:
      ``(eta_F, eta_BW)``.

    >>> m = toy_model(QUICK)
    >>> hw = _hardware(1e11, 1e10)
    >>> b = np.array([1, 2, 4, 8, 16, 32, 64, 128, 256.0])
    >>> t = decode(Design(batch=b), _hardware(1e11, 1e10, 0.3, 0.6), m, Workload(16.0)).tpot
    >>> [round(x, 2) for x in fit_efficiency(b, np.asarray(t), hw, m, 16)]
    [0.3, 0.6]
    """
    g = jnp.logspace(-3.0, 0.0, int(n_grid))
    b = jnp.asarray(batches, dtype=jnp.result_type(float))
    err = _grid_error(
        g,
        b,
        jnp.log(jnp.asarray(measured_s, dtype=b.dtype)),
        hardware,
        model,
        jnp.asarray(context, dtype=b.dtype),
    )
    i, j = np.unravel_index(int(jnp.argmin(err)), err.shape)
    return float(g[i]), float(g[j])


@jax.jit
def _grid_error(g, b, log_t, hardware, model, context):
    """Squared log error of dcost.decode on the (eta_F, eta_BW) grid ``g x g``."""
    hw = eqx.tree_at(
        lambda h: (h.flops_efficiency, h.bandwidth_efficiency),
        hardware,
        (g[:, None, None], g[None, :, None]),
    )
    t = decode(Design(batch=b), hw, model, Workload(context)).tpot  # [n, n, len(b)]
    return jnp.sum((jnp.log(t) - log_t) ** 2, axis=-1)


def fit_matmul_curve(
    tokens, seconds, flops_per_token, weight_bytes, flops, bandwidth, n_grid: int = 61
) -> dict:
    """The roofline of one weight matmul fitted to its times against the tokens through it.

    .. math::
        t(M) = \\max\\Big(\\frac{W}{BW\\,\\eta_{BW}},\\;
               \\frac{f M}{F\\,\\eta(M)}\\Big), \\qquad
        \\eta(M) = \\eta_F \\frac{M}{M + n_{1/2}}

    (``dcost.serving.roofline.matmul_efficiency``), fitted on log time over a grid of
    ``eta_BW`` in [0.05, 1.5], ``eta_F`` in [0.05, 1] and ``n_half`` in {0} and [0.1, 3000]
    (log-spaced, ``n_grid`` points each; every point in one array expression), then once more
    on as fine a grid between the best point's neighbours. ``eta_BW`` may pass 1 because
    ``bandwidth`` is usually a copy's (reads and writes) and a matmul only reads its weights.
    Used by ``benchmarks/matmul_sweep.py``.

    Args:
      tokens: ``M`` per point. seconds: measured times (s). flops_per_token: ``f`` (FLOP).
      weight_bytes: ``W`` (bytes). flops: ``F`` (FLOP/s). bandwidth: ``BW`` (bytes/s).

    Returns:
      ``{"bandwidth_efficiency", "flops_efficiency", "matmul_half_tokens", "rms_log_error"}``.

    >>> m = np.array([1, 4, 16, 64, 256, 1024, 4096.0])
    >>> hw = _hardware(1e15, 1e12, 0.7)
    >>> hw = eqx.tree_at(lambda h: h.matmul_half_tokens, hw, 40.0, is_leaf=lambda x: x is None)
    >>> t = np.maximum(1e9 / (1e12 * 0.8), 2e9 * m / (1e15 * np.asarray(matmul_efficiency(m, hw))))
    >>> fit = fit_matmul_curve(m, t, 2e9, 1e9, 1e15, 1e12)
    >>> [round(fit[k], 2) for k in ("bandwidth_efficiency", "flops_efficiency")]
    [0.8, 0.7]
    >>> round(fit["matmul_half_tokens"])
    40
    """
    m, t = _curve_points("fit_matmul_curve", tokens, seconds)
    _check_scales("fit_matmul_curve", flops_per_token, weight_bytes, flops, bandwidth, n_grid)
    log_t = np.log(t)
    n = int(n_grid)
    axes = [
        np.geomspace(0.05, 1.5, n),
        np.geomspace(0.05, 1.0, n),
        np.concatenate([[0.0], np.geomspace(0.1, 3000.0, n - 1)]),
    ]
    for _ in range(2):  # the grid, then a grid as fine again between the best point's neighbours
        err = _matmul_curve_error(axes, m, log_t, flops_per_token, weight_bytes, flops, bandwidth)
        best = [int(i) for i in np.unravel_index(int(np.argmin(err)), err.shape)]
        picked = [float(ax[i]) for ax, i in zip(axes, best, strict=True)]
        axes = [
            np.linspace(ax[max(i - 1, 0)], ax[min(i + 1, len(ax) - 1)], n)
            for ax, i in zip(axes, best, strict=True)
        ]
    eta_bw, eta_f, half = picked
    return {
        "bandwidth_efficiency": eta_bw,
        "flops_efficiency": eta_f,
        "matmul_half_tokens": half,
        "rms_log_error": float(np.sqrt(np.min(err))),
    }


def fit_kernel_roofline(
    tokens, seconds, flops_per_token, weight_bytes, flops, bandwidth, n_grid: int = 41
) -> dict:
    """The smooth roofline of one weight matmul fitted to its times against its tokens.

    .. math::
        t(M) = \\big(t_F^{1/r} + t_W^{1/r}\\big)^{r}, \\qquad
        t_F = \\frac{f M}{F\\,\\eta_F}, \\quad t_W = \\frac{W}{BW\\,\\eta_{BW}}

    (``dcost.serving.kernels.kernel_time`` with ``Hardware.kernel_roofline_smoothness = r``;
    no ``matmul_half_tokens``), fitted on log time over a grid of ``eta_BW`` in [0.05, 1.5],
    ``eta_F`` in [0.05, 1] (log-spaced) and ``r`` in [0, 1], then once more between the best
    point's neighbours, as ``fit_matmul_curve``. ``r`` says how far the kernel's arithmetic and
    its weight streaming overlap near the ridge point: 0 the roofline's sharp maximum, 1 none.

    Args:
      tokens, seconds, flops_per_token, weight_bytes, flops, bandwidth: as ``fit_matmul_curve``.

    Returns:
      ``{"bandwidth_efficiency", "flops_efficiency", "kernel_roofline_smoothness",
      "rms_log_error"}``.

    >>> m = np.array([1, 16, 64, 128, 256, 512, 1024, 4096.0])
    >>> t_f, t_w = 2e9 * m / (1e15 * 0.7), 1e9 / (1e12 * 0.8)
    >>> fit = fit_kernel_roofline(m, (t_f**2.5 + t_w**2.5) ** 0.4, 2e9, 1e9, 1e15, 1e12)
    >>> [round(fit[k], 2) for k in ("bandwidth_efficiency", "flops_efficiency")]
    [0.8, 0.7]
    >>> round(fit["kernel_roofline_smoothness"], 2)
    0.4
    """
    m, t = _curve_points("fit_kernel_roofline", tokens, seconds)
    _check_scales("fit_kernel_roofline", flops_per_token, weight_bytes, flops, bandwidth, n_grid)
    log_t = np.log(t)
    n = int(n_grid)
    axes = [np.geomspace(0.05, 1.5, n), np.geomspace(0.05, 1.0, n), np.linspace(0.0, 1.0, n)]
    for _ in range(2):  # the grid, then a grid as fine again between the best point's neighbours
        eta_bw, eta_f, r = axes
        t_f = (flops_per_token * m[None, :] / (float(flops) * eta_f[:, None]))[None, :, None, :]
        t_w = (float(weight_bytes) / (float(bandwidth) * eta_bw))[:, None, None, None]
        hw = eqx.tree_at(
            lambda h: h.kernel_roofline_smoothness,
            _hardware(float(flops), float(bandwidth)),
            jnp.asarray(r)[None, None, :, None],
            is_leaf=lambda x: x is None,
        )
        fitted = np.asarray(kernel_time(jnp.asarray(t_f), jnp.asarray(t_w), hw))
        err = np.mean((np.log(fitted) - log_t) ** 2, axis=-1)  # (bw, f, r)
        best = [int(i) for i in np.unravel_index(int(np.argmin(err)), err.shape)]
        picked = [float(ax[i]) for ax, i in zip(axes, best, strict=True)]
        axes = [
            np.linspace(ax[max(i - 1, 0)], ax[min(i + 1, len(ax) - 1)], n)
            for ax, i in zip(axes, best, strict=True)
        ]
    return {
        "bandwidth_efficiency": picked[0],
        "flops_efficiency": picked[1],
        "kernel_roofline_smoothness": picked[2],
        "rms_log_error": float(np.sqrt(np.min(err))),
    }


def _curve_points(owner, tokens, seconds):
    m = np.asarray(tokens, dtype=float)
    t = np.asarray(seconds, dtype=float)
    if m.shape != t.shape or m.ndim != 1 or m.size < 3:
        raise ValueError(
            f"{owner}: tokens and seconds must be 1-D of the same length (at least 3); "
            f"got shapes {m.shape} and {t.shape}"
        )
    for name, x in (("tokens", m), ("seconds", t)):
        if not np.all(np.isfinite(x) & (x > 0)):
            raise ValueError(f"{owner}: {name} = {x.tolist()} must be finite and > 0")
    return m, t


def _check_scales(owner, flops_per_token, weight_bytes, flops, bandwidth, n_grid):
    scales = dict(
        flops_per_token=flops_per_token, weight_bytes=weight_bytes, flops=flops, bandwidth=bandwidth
    )
    for name, v in scales.items():
        if not (np.isfinite(v) and v > 0):
            raise ValueError(f"{owner}: {name} = {v!r} must be finite and > 0")
    if isinstance(n_grid, bool) or not isinstance(n_grid, (int, np.integer)) or n_grid < 3:
        raise ValueError(f"{owner}: n_grid = {n_grid!r} must be an int >= 3")


def _matmul_curve_error(axes, m, log_t, flops_per_token, weight_bytes, flops, bandwidth):
    """Mean squared log error of ``fit_matmul_curve``'s roofline on the grid ``axes``."""
    eta_bw, eta_f, half = axes
    hw = _hardware(float(flops), float(bandwidth), eta_f[:, None, None])
    hw = eqx.tree_at(
        lambda h: h.matmul_half_tokens, hw, half[None, :, None], is_leaf=lambda x: x is None
    )
    t_flops = flops_per_token * m / (float(flops) * np.asarray(matmul_efficiency(m, hw)))
    t_bytes = float(weight_bytes) / (float(bandwidth) * eta_bw)
    t = np.maximum(t_bytes[:, None, None, None], t_flops[None])  # (bw, f, half, points)
    return np.mean((np.log(t) - log_t) ** 2, axis=-1)
