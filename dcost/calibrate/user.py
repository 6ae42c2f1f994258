"""Calibrate an engine profile to your own measurements, and say how sure the answer is.

``fit(records, engine)`` starts from a shipped engine profile (the prior) and moves the fields
your measurements can identify, by derivatives through the same serving model that predicts them
(one code path): the maximum a posteriori of

.. math:: \\mathcal{L}(z) = \\sum_i H_c\\big((\\log \\hat y_i(z) - \\log y_i)/\\sigma\\big)
          + \\tfrac12 \\sum_j z_j^2/s_j^2

over offsets ``z`` of the fields in ``FIELDS`` (a logit offset for a fraction, a log offset for a
time), ``sigma = SIGMA`` the run-to-run spread of one measurement and ``s_j`` each field's prior
spread (``PRIOR_SD``), found by Levenberg-Marquardt (``_map``). ``H_c`` is Huber's loss (Huber,
"Robust estimation of a location parameter", Ann. Math. Statist. 35(1), 1964): ``r^2/2`` up to
``|r| = c = HUBER`` spreads, ``c |r| - c^2/2`` beyond, so that one run the model cannot express
(a benchmark's error, an input assumed wrong) pulls the fit with a bounded force rather than a
growing one. Levenberg-Marquardt takes it as the square root of twice the loss, a residual of
the same sign (``_robust``; Triggs et al., "Bundle adjustment: a modern synthesis", 2000,
section 3.3). The Laplace approximation (the
inverse Hessian of the loss at its minimum, here its Gauss-Newton form; MacKay, "A practical
Bayesian framework for backpropagation networks", Neural Computation 4(3), 1992) gives each
field's posterior spread: a field whose spread stays near its prior's was not
identified by the data (``Calibration.identified``).

Each record runs as the silicon sample's do (``dcost.validation.silicon``): the sequences the
engine's KV cache holds, prefill chunked at its token budget.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost.search._jit import jit as _stored_jit
from dcost.specs import check_flag, stack

__all__ = [
    "fit",
    "calibrate",
    "with_offsets",
    "Calibration",
    "FIELDS",
    "PRIOR_SD",
    "SIGMA",
    "prepare",
    "Prepared",
]

FIELDS = (
    "flops_efficiency",
    "bandwidth_efficiency",
    "kv_bandwidth_efficiency",
    "step_overhead",
    "layer_overhead",
    "sequence_overhead",
    "moe_layer_overhead",
    "expert_overhead",
)
"""The profile fields a calibration moves; the rest stay at the prior engine's. The MoE layer's
fixed costs are the kernel tables' (each kernel timed alone, its launch included); an engine that
captures its steps in a graph pays less of them, as it does of ``layer_overhead``. A step's cost
for carrying prompt tokens (``prefill_step_overhead``) stays the prior's: moved too, it took the
silicon sample's deployments calibrated on 3 runs from 7.06 % to 6.98 % off but the ML.ENERGY
runs calibrated on the other architectures from 17.1 % to 21.5 %, and the published groups of
several models at k = 3 from 9.4 % to 10.7 %: what it learns from a few runs does not carry to
another model."""

_FRACTION = frozenset(
    {
        "flops_efficiency",
        "bandwidth_efficiency",
        "kv_bandwidth_efficiency",
        "expert_bandwidth_efficiency",
    }
)

TIED = {
    "moe_ep_overhead": "moe_layer_overhead",
    "expert_bandwidth_efficiency": "bandwidth_efficiency",
}
"""Profile fields a calibration moves with another's offset: the MoE layer's fixed cost over
many expert-parallel groups scales with its cost over one (a deployment's runs are of one
layout, and say nothing of the other apart); the routed experts' HBM rate moves with the dense
matmuls' (the same memory, read by another kernel)."""


def _moved() -> list[tuple[str, int]]:
    """``(field, index of its offset in FIELDS)``: every field in ``FIELDS``, then ``TIED``'s."""
    return [(n, j) for j, n in enumerate(FIELDS)] + [(t, FIELDS.index(m)) for t, m in TIED.items()]


PRIOR_SD = {
    "flops_efficiency": 0.5,
    "bandwidth_efficiency": 0.5,
    "kv_bandwidth_efficiency": 0.5,
    "step_overhead": 1.0,
    "layer_overhead": 1.0,
    "sequence_overhead": 1.0,
    "moe_layer_overhead": 1.0,
    "expert_overhead": 1.0,
}
"""Prior spread of each field's offset (logit units for fractions, log units for times): an
engine build may reach a GEMM rate a few tens of percent off the shipped one, and fixed costs
that differ by a factor of a few (host CPU, flags, driver)."""

SIGMA = 0.1
"""Spread of one measurement's log around the model's (10 %: repeated benchmark runs)."""

HUBER = 1.345
"""Where a run's loss turns from square to linear, in ``SIGMA`` units (13.45 % here): Huber's
constant, 95 % as efficient as least squares when the runs' errors are normal (Huber, Ann. Math.
Statist. 35(1), 1964), not fitted. Against least squares, on the runs no calibration saw
(``experiments/own_measurements.py``): the silicon sample's deployments calibrated on 3 runs
5.70 % -> 5.58 % (p90 18.8 % either way), on 10 runs 5.14 % -> 4.73 % (p90 16.4 % -> 17.0 %),
and the published groups at k = 3 11.1 % -> 9.7 % (p90 43.1 % either way): MLPerf v5.1's H200
group, whose prior is 1.8 % off on five runs and 1.5x on the sixth, went from 12.0 % to 4.3 %."""

ITERATIONS = 41
DAMPING = 1e-2  # Levenberg-Marquardt's first lambda
_TIME_FLOOR = 1e-7
"""The least scale a time field's offset moves it by (s). A multiplicative offset cannot move a
zero, and a field fitted to next to nothing (vLLM's ``sequence_overhead``, 3e-9 s a sequence in
the shipped profiles) would need an offset of many prior spreads to reach what an older build
pays (15-46 us a sequence under vLLM 0.11.1): such a field moves as if it were this large
(``_moved_time``). No offset is the prior's own value, whatever its size."""


def _moved_time(v0, z):
    """A time field ``v0`` (s) moved by the offset ``z``: ``v0 + m (e^z - 1)`` with ``m =
    max(v0, _TIME_FLOOR)``, at least 0. ``v0 e^z`` for a field of at least the floor; ``v0``
    itself at ``z = 0``; a smaller field rises as the floor would, ``m e^z`` for large ``z``."""
    m = jnp.maximum(v0, _TIME_FLOOR)
    return jnp.maximum(v0 + m * jnp.expm1(z), 0.0)


def _moved_time_float(v0: float, z: float) -> float:
    """``_moved_time`` in double precision, for the values an engine saves."""
    return max(v0 + max(v0, _TIME_FLOOR) * math.expm1(z), 0.0)


_EPS = 1e-6


@dataclasses.dataclass(frozen=True)
class Calibration:
    """What a fit moved and how sure it is.

    Attributes:
      engine: the calibrated ``dcost.Engine``.
      before, after: each field's value (SI units; fractions of the chip's precision for
        ``flops_efficiency``: the first record's) before and after.
      prior_sd, posterior_sd: each field's spread in the fit's units (Laplace approximation).
      identified: fields whose posterior spread fell below half the prior's.
      residual_before, residual_after: root-mean-square of ``log(pred/measured)`` over the
        records.
      records: how many records the fit saw.
    """

    engine: Any
    before: dict
    after: dict
    prior_sd: dict
    posterior_sd: dict
    identified: tuple
    residual_before: float
    residual_after: float
    records: int


@dataclasses.dataclass(frozen=True)
class _Kind:
    step: str
    metric: str
    index: np.ndarray  # positions in the records
    cases: object  # a Case with stacked specs (padded to a bucket)
    weight: np.ndarray  # 1 for a real row, 0 for padding


@dataclasses.dataclass(frozen=True)
class Prepared:
    """Records turned into stacked cases on an engine, ready to fit or predict many times."""

    kinds: tuple
    measured: np.ndarray
    n: int
    own_attention: bool = True  # the engine sets attention's own rate (``attention_efficiency``)


def _bucket(n: int) -> int:
    """The padded size of ``n`` rows: the next power of 2 (one compiled program a size)."""
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def prepare(records: Sequence[Mapping], engine) -> Prepared:
    """The records as the engine runs them, stacked per kind of step (``dcost.validation``)."""
    from dcost.validation.cases import Case, case
    from dcost.validation.silicon import _with_chunk, running_sequences

    cases = []
    for r in records:
        plain = {k: v for k, v in r.items() if k != "mode"}
        first = case(plain, calibrated=False)
        running = dict(plain, concurrency=running_sequences(first, plain, engine))
        c = case(running, engine=engine)
        if c.step in ("decode", "mixed"):
            c = _with_chunk(c, float(engine.scheduler.max_num_batched_tokens))
        cases.append(c)
    groups: dict[tuple, list[int]] = {}
    for i, c in enumerate(cases):
        key = (
            c.step,
            c.metric,
            jax.tree.structure((c.hardware, c.model, c.workload, c.design)),
            c.wave_share is None,
        )
        groups.setdefault(key, []).append(i)
    kinds = []
    for (step, metric, _, steady), idx in groups.items():
        size = _bucket(len(idx))
        members = [cases[i] for i in idx] + [cases[idx[0]]] * (size - len(idx))
        stacked = Case(
            hardware=stack([c.hardware for c in members]),
            model=stack([c.model for c in members]),
            workload=stack([c.workload for c in members]),
            design=stack([c.design for c in members]),
            step=step,
            metric=metric,
            chips=np.array([c.chips for c in members]),  # type: ignore[arg-type]
            input_per_output=np.array([c.input_per_output for c in members]),  # type: ignore[arg-type]
            wave_share=None if steady else np.array([c.wave_share for c in members]),
        )
        weight = np.r_[np.ones(len(idx)), np.zeros(size - len(idx))]
        kinds.append(_Kind(step, metric, np.array(idx), stacked, weight))
    measured = np.array([float(r["value"]) for r in records])
    return Prepared(tuple(kinds), measured, len(records), "attention_efficiency" in engine.profile)


def _apply(hardware, z, own_attention: bool = True):
    """The stacked chips with the offsets ``z`` (``FIELDS`` order) applied, as
    ``with_offsets``' engine sets them. ``own_attention``: attention's rate is the profile's own
    (``attention_efficiency``; ``Engine.fields`` divides it by ``flops_efficiency``), so a moved
    ``flops_efficiency`` leaves ``attention_flops * flops_efficiency`` where it was; without it
    the chip's ``attention_flops`` stays and its rate moves with ``flops_efficiency``."""
    values, names = [], []
    for name, j in _moved():
        if getattr(hardware, name) is None:  # a cost the engine's profile has not (a100: MoE)
            continue
        names.append(name)
        v0 = hardware.get(name)
        if name in _FRACTION:
            p = jnp.clip(v0, _EPS, 1.0 - _EPS)
            values.append(jax.nn.sigmoid(jnp.log(p) - jnp.log1p(-p) + z[j]))
        else:
            values.append(_moved_time(v0, z[j]))
    attention = hardware.get("attention_flops")
    if own_attention and attention is not None:
        j = names.index("flops_efficiency")
        names.append("attention_flops")
        values.append(attention * hardware.get("flops_efficiency") / values[j])
    return eqx.tree_at(
        lambda h: tuple(getattr(h, n) for n in names),
        hardware,
        tuple(values),
        is_leaf=lambda x: x is None,
    )


def _log_predictions_of(meta, specs, z):
    """``log`` of each kind's predictions under offsets ``z`` (a tuple, one array a kind);
    ``meta``: whether the engine sets attention's own rate (``_apply``), then each kind's
    ``(step, metric)``; ``specs``: its stacked
    ``(hardware, model, workload, design, chips, input_per_output, wave_share)``."""
    from dcost.validation.cases import Case, evaluate_metrics

    out = []
    own_attention, *kinds = meta
    for (step, metric), (h, m, w, d, n, r, s) in zip(kinds, specs, strict=True):

        def one(h, m, w, d, n, r, s, step=step, metric=metric):
            return evaluate_metrics(Case(h, m, w, d, step, metric, n, r, s), (metric,))[0]

        out.append(jnp.log(jax.vmap(one)(_apply(h, z, own_attention), m, w, d, n, r, s)))
    return tuple(out)


# the fit's and the predictions' programs: XLA:CPU's classic emitters, kept on disk by
# dcost._programs (dcost.search._jit): the fit's compiled in 31 s with XLA's defaults and 19.5 s
# so on 2 cores, and a later process loads both without tracing them again
_log_predictions = _stored_jit(_log_predictions_of, static_argnames=("meta",))


def _prior_sd() -> np.ndarray:
    return np.array([PRIOR_SD[n] for n in FIELDS])


def _robust(r, c=HUBER):
    """``sign(r) sqrt(2 H_c(r))``: ``r`` where ``|r| <= c``, ``sign(r) sqrt(2 c |r| - c^2)``
    beyond; half its square is Huber's loss ``H_c(r)``, and it is continuous with a continuous
    slope at ``|r| = c``. ``c = 0``: ``r`` itself, least squares (``c`` may be traced).

    >>> float(_robust(1.0)), round(float(_robust(-3.0)), 4), float(_robust(-3.0, 0.0))
    (1.0, -2.5022, -3.0)
    """
    a = jnp.abs(r)
    beyond = (c > 0.0) & (a > c)
    inner = jnp.where(beyond, 2.0 * c * a - c * c, 1.0)  # > c^2 where used: a finite slope
    return jnp.where(beyond, jnp.sign(r) * jnp.sqrt(inner), r)


def _unrobust(rho, c=HUBER):
    """``r`` of ``rho = _robust(r, c)`` (NumPy): ``sign(rho) (rho^2 + c^2)/(2 c)`` beyond ``c``."""
    rho = np.asarray(rho, float)
    if c <= 0.0:
        return rho
    return np.where(np.abs(rho) > c, np.sign(rho) * (rho * rho + c * c) / (2.0 * c), rho)


def _residuals(meta, specs, logs_y, weights, z, prior_sd, huber):
    """The loss's residuals: ``sqrt(w_i) _robust((log yhat_i(z) - log y_i)/sigma, huber)`` for
    every record (0 for padding), then ``z_j/s_j`` for the prior (``prior_sd``: the ``s_j``, and
    ``huber``, traced, so that one program serves every prior and loss); the loss is half their
    sum of squares."""
    logs = _log_predictions_of(meta, specs, z)
    data = [
        jnp.sqrt(w) * _robust((lp - ly) / SIGMA, huber)
        for lp, ly, w in zip(logs, logs_y, weights, strict=True)
    ]
    return jnp.concatenate([*data, z / jnp.asarray(prior_sd, z.dtype)])


def _loss(meta, specs, logs_y, weights, z, prior_sd, huber):
    return 0.5 * jnp.sum(_residuals(meta, specs, logs_y, weights, z, prior_sd, huber) ** 2)


@functools.partial(_stored_jit, static_argnames=("meta",))
def _map(meta, specs, logs_y, weights, prior_sd, huber):
    """The MAP offsets, the Gauss-Newton Hessian ``J^T J`` of the loss there, and the residuals
    (``_residuals``) at the prior and at the MAP.

    Levenberg-Marquardt on the residuals (Levenberg, Q. Appl. Math. 2(2), 1944; Marquardt, J.
    SIAM 11(2), 1963): from ``z = 0`` (the prior), a step solves ``(J^T J + lambda diag(J^T J))
    d = -J^T r``; a step that lowers the loss is taken and ``lambda`` divided by 3, one that does
    not is refused and ``lambda`` multiplied by 4 (``ITERATIONS`` evaluations, the prior's the
    first: a fixed count, and the model traced once, in the loop). ``J`` (records + fields by
    fields) is the residuals' forward-mode Jacobian, one tangent a field. ``J^T J`` is positive
    semi-definite, and with the prior's rows definite, where the exact Hessian of a fit that has
    not settled need not be: it is the Laplace approximation's precision (the generalized
    Gauss-Newton; Martens, JMLR 21, 2020, sec. 8)."""
    n = len(FIELDS)
    rows = sum(int(ly.shape[0]) for ly in logs_y) + n

    def value_and_jacobian(z):
        r, tangent = jax.linearize(
            lambda x: _residuals(meta, specs, logs_y, weights, x, prior_sd, huber), z
        )
        return r, jax.vmap(tangent, in_axes=1, out_axes=1)(jnp.eye(n, dtype=z.dtype))

    def step(carry, _):
        z, r, jac, loss, lam, trial, r_prior = carry
        r_t, jac_t = value_and_jacobian(trial)
        loss_t = 0.5 * jnp.sum(r_t**2)
        r_prior = jnp.where(jnp.isinf(loss), r_t, r_prior)  # the first evaluation: z = 0
        better = jnp.isfinite(loss_t) & (loss_t < loss)
        z, r, jac, loss = (
            jnp.where(better, new, old)
            for new, old in ((trial, z), (r_t, r), (jac_t, jac), (loss_t, loss))
        )
        lam = jnp.where(better, lam / 3.0, lam * 4.0)
        a = jac.T @ jac
        trial = z - jnp.linalg.solve(a + lam * jnp.diag(jnp.diag(a)), jac.T @ r)
        return (z, r, jac, loss, lam, trial, r_prior), None

    z0 = jnp.zeros(n)
    r0, jac0 = jnp.zeros(rows), jnp.zeros((rows, n))
    inf = jnp.asarray(jnp.inf, z0.dtype)
    start = (z0, r0, jac0, inf, jnp.asarray(3.0 * DAMPING, z0.dtype), z0, r0)
    (z, r, jac, _, _, _, r_prior), _ = jax.lax.scan(step, start, None, length=ITERATIONS)
    return z, jac.T @ jac, r_prior, r


def _specs(prep: Prepared):
    meta = (prep.own_attention, *((k.step, k.metric) for k in prep.kinds))
    specs = tuple(
        (
            k.cases.hardware,
            k.cases.model,
            k.cases.workload,
            k.cases.design,
            jnp.asarray(k.cases.chips),
            jnp.asarray(k.cases.input_per_output),
            None if k.cases.wave_share is None else jnp.asarray(k.cases.wave_share),
        )
        for k in prep.kinds
    )
    return meta, specs


def _arrays(prep: Prepared, rows=None):
    """The fit's inputs; ``rows``: a mask over the records to fit on (all when None)."""
    meta, specs = _specs(prep)
    use = np.ones(prep.n) if rows is None else np.asarray(rows, float)
    logs_y, weights = [], []
    for k in prep.kinds:
        pad = len(k.weight) - len(k.index)
        y = prep.measured[k.index]
        logs_y.append(jnp.asarray(np.log(np.r_[y, np.full(pad, y[0])])))
        weights.append(jnp.asarray(k.weight * np.r_[use[k.index], np.zeros(pad)]))
    return meta, specs, tuple(logs_y), tuple(weights)


def fit_offsets(
    prep: Prepared, rows=None, prior_sd=None, robust: bool = True
) -> tuple[np.ndarray, np.ndarray]:
    """``(z, posterior covariance)`` fitted to the prepared records (``rows``: a mask of those to
    fit on; all when None), under the prior spreads ``prior_sd`` (one a field of ``FIELDS``, in
    the fit's units; ``PRIOR_SD``'s when None) and Huber's loss (``robust``; ``calibrate``)."""
    sd = _prior_sd() if prior_sd is None else np.asarray(prior_sd, float)
    if sd.shape != (len(FIELDS),) or not np.all(np.isfinite(sd)) or np.any(sd <= 0):
        raise ValueError(
            f"prior_sd: {len(FIELDS)} positive spreads, one a field of FIELDS, expected; "
            f"got {prior_sd!r}"
        )
    # as a JAX array of the default float: the program store keys a call by its arguments' dtypes
    z, hess, _, _ = _map(*_arrays(prep, rows), jnp.asarray(sd), _huber(robust))
    return np.asarray(z), np.linalg.inv(np.asarray(hess))


def predict_offsets(prep: Prepared, z) -> np.ndarray:
    """Each record's prediction (SI units) under offsets ``z``."""
    meta, specs = _specs(prep)
    logs = _log_predictions(meta, specs, jnp.asarray(z))
    out = np.zeros(prep.n)
    for k, lp in zip(prep.kinds, logs, strict=True):
        out[k.index] = np.exp(np.asarray(lp))[: len(k.index)]
    return out


_KV_RATES = (
    ("kv_bandwidth_efficiency", "fp8_kv_bandwidth_ratio"),
    ("mla_kv_bandwidth_efficiency", "mla_fp8_kv_bandwidth_ratio"),
)
"""A KV read's rate and an 8-bit cache's share of it, of the GQA and the latent kernels
(``dcost.engines.Engine.fields``: a model reads at ``rate``, or ``rate * ratio`` with an 8-bit
cache)."""


def _move_kv(shared: dict, move) -> None:
    """Move the KV reads' rates as ``_apply`` moves the chip's: the offset is one on the rate a
    model reads at, so that an 8-bit cache's ``b r`` goes to ``move(b r)`` as a 16-bit cache's
    ``b`` goes to ``move(b)``: the ratio becomes ``move(b r) / move(b)`` (at most 1, as
    ``move`` is increasing). A latent rate without its own ratio reads at the GQA ratio; it
    takes it as its own first, so that the two move apart."""
    gqa_ratio = shared.get("fp8_kv_bandwidth_ratio")
    if "mla_kv_bandwidth_efficiency" in shared and gqa_ratio is not None:
        shared.setdefault("mla_fp8_kv_bandwidth_ratio", gqa_ratio)
    for rate, ratio in _KV_RATES:
        if rate not in shared:
            if rate == "kv_bandwidth_efficiency":
                shared[rate] = move(1.0)  # unset: the chip's 1.0, as ``_apply`` reads it
            continue
        b = shared[rate]
        shared[rate] = move(b)
        if ratio in shared:
            shared[ratio] = min(1.0, move(b * shared[ratio]) / shared[rate])


def _field_values(engine, z) -> dict:
    """The engine profile's fields with offsets ``z``, as the profile stores them."""
    shared, precision = (
        dict(engine.profile),
        {p: dict(v) for p, v in engine.precision_profile.items()},
    )
    for name, j in _moved():
        if name in _FRACTION:

            def move(v, j=j):
                p = min(max(v, _EPS), 1.0 - _EPS)
                return float(1.0 / (1.0 + math.exp(-(math.log(p / (1.0 - p)) + z[j]))))

            if name == "flops_efficiency":
                for p in precision:
                    if name in precision[p]:  # not the weight-only expert classes
                        precision[p][name] = move(precision[p][name])
            elif name == "kv_bandwidth_efficiency":
                _move_kv(shared, move)
            elif name in shared or name not in TIED:  # a tied field the profile has not: unset
                shared[name] = move(shared.get(name, 1.0))
        else:
            if name not in shared and not any(name in v for v in precision.values()):
                continue  # a cost the profile has not stays unset (``_apply`` leaves it None)
            if name in shared:
                shared[name] = _moved_time_float(shared[name], float(z[j]))
            for p in precision:  # a class's own value (the weight-only experts' MoE layer)
                if name in precision[p]:
                    precision[p][name] = _moved_time_float(precision[p][name], float(z[j]))
    return {"profile": shared, "precision_profile": precision}


def with_offsets(engine, z, provenance=None):
    """``engine`` with its profile's ``FIELDS`` moved by offsets ``z`` (``fit_offsets``' order
    and units: a logit offset for a fraction, a log offset for a time); ``provenance`` replaces
    its provenance when given. ``predict_offsets(prepare(records, engine), z)`` predicts what
    ``prepare(records, with_offsets(engine, z))`` does at ``z = 0``."""
    from dcost import engines

    if not isinstance(engine, engines.Engine):
        raise engines.EngineError(
            f"with_offsets: engine must be a dcost.Engine, got {type(engine).__name__}"
        )
    try:
        offsets = np.asarray(z, float)
    except (TypeError, ValueError):
        offsets = np.full(0, np.nan)
    if offsets.shape != (len(FIELDS),) or not np.all(np.isfinite(offsets)):
        raise ValueError(
            f"with_offsets: z = {z!r:.80} is not allowed: it must be {len(FIELDS)} finite "
            f"numbers, one for each of {', '.join(FIELDS)}"
        )
    moved = _field_values(engine, offsets)
    return engine.with_profile(
        profile=moved["profile"],
        precision_profile=moved["precision_profile"],
        provenance=provenance,
    )


def _huber(robust: bool):
    """The traced loss setting of ``_map``: ``HUBER`` for Huber's loss, 0 for least squares."""
    check_flag("calibrate", "robust", robust)
    return jnp.asarray(HUBER if robust else 0.0, dtype=jnp.result_type(float))


def fit(records: Sequence[Mapping], engine, files: Sequence[str] = (), robust: bool = True):
    """``engine``'s profile fitted to ``records``: the calibrated ``dcost.Engine`` of
    ``calibrate`` (what moved, and how sure, in its ``provenance``).

    >>> import dcost
    >>> dcost.calibrate.fit is fit
    True
    """
    return calibrate(records, engine, files, robust).engine


def calibrate(
    records: Sequence[Mapping], engine, files: Sequence[str] = (), robust: bool = True
) -> Calibration:
    """Fit ``engine``'s profile to ``records`` (your measurements; ``dcost.measurements.read``).

    Args:
      records: measurement records (their ``engine`` need not match: they run on ``engine``).
      engine: the prior, a shipped ``dcost.Engine`` (``dcost.engine("vllm", hardware=...)``).
      files: the files the records came from, for the provenance.
      robust: Huber's loss (``HUBER``), for one deployment's own runs, where a run the model
        cannot express is an outlier to pull the fit a bounded way; False: least squares, for
        runs pooled over several models, whose misfits are the models' and should average (the
        ML.ENERGY runs pooled over the other architectures predicted a new model's time between
        tokens within 17.9 % by least squares, 20.5 % by Huber's loss; ``docs/engines.md``).

    Returns:
      A ``Calibration``; ``.engine`` is the calibrated engine (``.save(path)`` writes it,
      ``dcost.engine(name, hardware=..., profile=path)`` reads it back); its provenance names
      the models the records ran.

    Calibrate on runs of the model you will predict: on published runs no fit saw, three runs
    of one model predicted its other runs within 6.5-15 %, where three runs of several models
    on one chip predicted the rest no better than the shipped profile
    (``experiments/own_measurements.py``, ``docs/engines.md``).
    """
    from dcost import engines
    from dcost.validation import check_record

    if not isinstance(engine, engines.Engine):
        raise engines.EngineError(
            f"calibrate.fit: engine must be a dcost.Engine, got {type(engine).__name__}"
        )
    if isinstance(records, (str, bytes, Mapping)) or not isinstance(records, Iterable):
        raise TypeError(
            f"calibrate.fit: records = {records!r:.60} is not allowed: it must be a list of "
            "measurement records (dicts, e.g. from dcost.measurements.read)"
        )
    records = list(records)
    if not records:
        raise ValueError("calibrate.fit: records is empty: no records to fit")
    for i, r in enumerate(records):
        if not isinstance(r, Mapping):
            raise TypeError(
                f"calibrate.fit: records[{i}] = {r!r:.60} is not allowed: each record must be "
                "a dict (dcost.measurements.read)"
            )
        try:
            check_record({k: v for k, v in r.items() if k != "mode"})
        except ValueError as err:
            raise ValueError(f"calibrate.fit: records[{i}]: {err}") from None
    prep = prepare(records, engine)
    z, hess, r_prior, r_fit = (
        np.asarray(x) for x in _map(*_arrays(prep), jnp.asarray(_prior_sd()), _huber(robust))
    )
    cov = np.linalg.inv(hess)
    # log(pred/measured) of each record is SIGMA times its residual, once Huber's square root is
    # undone (weight 1; padding is 0 and the prior's rows come last): no second program to
    # predict with
    c = HUBER if robust else 0.0
    rms = [
        float(SIGMA * np.sqrt(np.sum(_unrobust(r[: -len(FIELDS)], c) ** 2) / prep.n))
        for r in (r_prior, r_fit)
    ]
    sd = np.sqrt(np.maximum(np.diag(cov), 0.0))
    identified = tuple(n for n, s, p in zip(FIELDS, sd, _prior_sd(), strict=True) if s < 0.5 * p)
    prov = {
        "source": "dcost.calibrate.fit: your measurements, from the shipped profile as the prior",
        "prior": f"{engine.label} on {engine.hardware_name}",
        "files": [str(f) for f in files],
        "records": len(records),
        "loss": f"Huber's, {HUBER} spreads" if robust else "least squares",
        "models": sorted({str(r["model"]) for r in records}),
        "residual_rms_log_before": rms[0],
        "residual_rms_log_after": rms[1],
        "identified": list(identified),
        "not_identified": [n for n in FIELDS if n not in identified],
        "posterior_sd": dict(zip(FIELDS, sd.tolist(), strict=True)),
        "prior_sd": dict(zip(FIELDS, _prior_sd().tolist(), strict=True)),
    }
    calibrated = with_offsets(engine, z, prov)
    first = next(iter(engine.precision_profile))

    def read(e) -> dict:
        return {
            n: (e.precision_profile[first][n] if n == "flops_efficiency" else e.profile.get(n, 0.0))
            for n in FIELDS
        }

    return Calibration(
        engine=calibrated,
        before=read(engine),
        after=read(calibrated),
        prior_sd=dict(zip(FIELDS, _prior_sd().tolist(), strict=True)),
        posterior_sd=dict(zip(FIELDS, sd.tolist(), strict=True)),
        identified=identified,
        residual_before=rms[0],
        residual_after=rms[1],
        records=len(records),
    )
