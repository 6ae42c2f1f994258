"""Calibration by gradient: a few physically named efficiencies and overheads per hardware family,
fitted to the published measurements, judged only on sources the fit did not see.

Each hardware family ``f`` (``"hopper"``, ``"blackwell"``, ...) gets a profile of thirteen fields of
``dcost.Hardware``, every one of which the pure roofline leaves at its ideal value:

==============================  =======================================================  =======
field                           meaning                                                  prior
==============================  =======================================================  =======
``flops_efficiency``            achieved fraction of peak matmul FLOP/s, large matmuls   0.6
``matmul_half_tokens``          tokens per matmul at which half of that is reached       32
``bandwidth_efficiency``        achieved fraction of HBM bandwidth, weight reads         0.8 (*)
``kv_bandwidth_efficiency``     achieved fraction of HBM bandwidth, KV-cache reads       0.6
``step_overhead``               fixed time of a step (scheduler, sampling, launches), s  1 ms
``layer_overhead``              kernel launches and tails per layer per step, s          50 us
``scaleup_efficiency``          achieved fraction of scale-up link bandwidth             0.7
``scaleout_efficiency``         achieved fraction of scale-out link bandwidth            0.6
``scaleup_latency``             per-message latency of scale-up collectives, s           5 us
``scaleout_latency``            per-message latency of scale-out collectives, s          15 us
``sequence_overhead``           host time per scheduled sequence per step, s             5 us
``kernel_roofline_smoothness``  a kernel's compute and memory times: 0 max, 1 sum        0.3
``expert_flops_efficiency``     routed experts' grouped matmuls over a dense matmul's    0.8
==============================  =======================================================  =======

(*) with a narrow prior (``FIELD_SD``): streaming reads of large weight matrices reach 75-85 % of
HBM bandwidth on every family, a range the data cannot move far. Two fields are set, not fitted
(``FIXED``): a calibrated step runs its kernels in series, each at its own roofline
(``kernel_serialization = 1``, ``dcost.serving.roofline.stage_time``), and its all-reduces take
log-depth message counts (``tree_collectives = 1``). The pure roofline keeps both off, so it stays
a bound.

Each field lives in an unconstrained coordinate ``z`` (logit for fractions, log for the rest), and
the family's value is ``z_f = z_global + delta_f``: a shared profile plus a family offset. The fit
minimizes, with Adam (Optax), the mean squared log error of the records it sees plus Gaussian
priors in ``z``: ``(z_global - z_prior)**2 / (2 PRIOR_SD**2)`` keeps each field in its physical
range and ``delta_f**2 / (2 FAMILY_SD**2)`` shrinks a family with few records towards the shared
profile::

    L(z) = mean_i w_i (log pred_i(z_{f(i)}) - log measured_i)**2 + priors

A record of a finite offline run (``requests``) is predicted from its waves
(``dcost.validation.cases.waves``): each wave's throughput is evaluated like any record, and the
record's is their combination, ``1 / sum_j share_j / X_j``, differentiated through the waves'
forward-mode Jacobians.

**Leave-one-source-out**: for every independent source ``s`` (a record's ``source_id``) the fit is
repeated with that source's records weighted 0, and those records are predicted with that fit
only; all folds run in one jitted program, one after another (``lax.map``). The held-out error of
a record is ``|pred/measured - 1|``.

The shipped profiles (``dcost/presets/calibration.toml``) are the fit on every record, written by
``dcost validate --write`` together with the held-out summary; ``dcost.hardware(name,
calibrated=True)`` applies the profile of the chip's family.

References: the roofline with achieved rather than peak rates (Williams et al., CACM 2009); the
alpha-beta model of collectives (Thakur et al., IJHPCA 2005); leave-one-group-out cross-validation
(Hastie, Tibshirani & Friedman, "The Elements of Statistical Learning", 7.10).
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import math
import pathlib
from collections.abc import Mapping, Sequence

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
import optax

from dcost.specs import Hardware, SpecError, stack
from dcost.validation.cases import TIME_METRICS, Case, case, evaluate_metrics, waves

__all__ = [
    "FIELDS",
    "PRIOR",
    "Fit",
    "CrossValidation",
    "calibrated_hardware",
    "queueing",
    "write_profiles",
    "fit",
    "cross_validate",
    "summary",
    "breakdown",
    "source_spread",
    "REGIMES",
    "pure_predictions",
    "weighted_quantile",
]

FIELDS = (
    "flops_efficiency",
    "matmul_half_tokens",
    "bandwidth_efficiency",
    "kv_bandwidth_efficiency",
    "step_overhead",
    "layer_overhead",
    "scaleup_efficiency",
    "scaleout_efficiency",
    "scaleup_latency",
    "scaleout_latency",
    "sequence_overhead",
    "kernel_roofline_smoothness",
    "expert_flops_efficiency",
)
FRACTIONS = frozenset(
    {
        "expert_flops_efficiency",
        "kernel_roofline_smoothness",
        "flops_efficiency",
        "bandwidth_efficiency",
        "kv_bandwidth_efficiency",
        "scaleup_efficiency",
        "scaleout_efficiency",
    }
)
PRIOR = {
    "flops_efficiency": 0.6,
    "matmul_half_tokens": 32.0,
    "bandwidth_efficiency": 0.8,
    "kv_bandwidth_efficiency": 0.6,
    "step_overhead": 1e-3,
    "layer_overhead": 5e-5,
    "scaleup_efficiency": 0.7,
    "scaleout_efficiency": 0.6,
    "scaleup_latency": 5e-6,
    "scaleout_latency": 15e-6,
    "sequence_overhead": 5e-6,
    "kernel_roofline_smoothness": 0.3,
    "expert_flops_efficiency": 0.8,
}
"""Prior medians (SI units). Sources of their order of magnitude: H100 dense GEMM reaches 60-75 %
of peak in vendor benchmarks; STREAM-like HBM reads 80-90 %; a serving engine's step costs ~1 ms of
CPU scheduling and sampling (vLLM's V1 engine notes); a transformer layer runs 10-20 kernels and
each costs a few microseconds of launch and tail even inside a CUDA graph, ~50 us a layer; NCCL's
achieved bus bandwidth 70-80 % of NVLink, 60-80 % of InfiniBand; NVLink and InfiniBand message
latencies a few and ~10-20 us; an engine's host work per scheduled sequence (batch metadata,
sampling, output processing) a few microseconds, the CPU time that SGLang's overlap scheduler and
vLLM's V1 engine were built to hide at large batches; a kernel near its ridge point overlaps its
arithmetic and its streaming only in part, a smooth roofline between the maximum and the sum
(the bare GEMM sweeps below fit it at 0.16-0.45, ``local.fit_kernel_roofline``); a routed
expert's grouped matmul (tokens permuted to their experts and back, many small groups in one
launch, each padded to the kernel's tile) runs below a dense matmul of the same size: a prior of
0.8 of the dense rate, left to the data (fitted 0.70-0.74 in every family).

Measured bare (``benchmarks/matmul_sweep.py``, ``benchmarks/results/``: an MLP's bf16 weight pair
on a lent H100 and H200, cuBLAS through XLA): the time stays at the weight-read time (2.0-3.0 TB/s
on the H100, 2.3-4.1 on the H200) up to 128-256 tokens, then grows with the FLOPs at 650-750
TFLOP/s (66-76 % of the 989 TFLOP/s peak); the roofline fits it with ``matmul_half_tokens``
between 0 and 47 tokens. The fitted serving profiles' 86-135 tokens (125-192 before
``kernel_roofline_smoothness``, which took over the part that acted as a second weight read) are
not the GEMM's curve:
they carry per-step time of the engines that grows with the step's size, which no other field
takes (before ``sequence_overhead`` took the part that grows with the batch they were 130-303,
and the achieved FLOP/s fraction 0.46-0.64 instead of 0.51-0.65); holding
``matmul_half_tokens`` near 32 moved that time into ``layer_overhead`` (50 to 150 us) and
worsened the held-out 90th percentile (46 % to 53 %, measured before ``sequence_overhead``)."""
FIXED = {"kernel_serialization": 1.0, "tree_collectives": 1.0}
"""Fields every calibrated profile sets to a value that is not fitted."""
PRIOR_SD = 1.5
"""Sd of the shared profile around the prior, in ``z`` (a factor ~4.5 in a log field)."""
FIELD_SD: dict[str, float] = {"bandwidth_efficiency": 0.3}
"""Per-field prior sds in ``z`` where a field's physical range is narrower than ``PRIOR_SD``'s."""
FAMILY_SD = 0.75
"""Sd of a family's offset from the shared profile, in ``z``."""
STEPS = 300
"""Adam steps of a fit. With the cosine decay of the learning rate, 300 steps give every held-out
prediction within 0.07 % of 3,000 steps' (measured on the shipped records); at a constant rate
the predictions hovered 0.5 % around the minimum however long it ran (1,500 steps, the earlier
default, against 3,000)."""
LEARNING_RATE = 0.05
"""Adam's initial learning rate (in ``z``); it decays to 1 % of this over the steps."""
_LO = 0.02  # fractions live in (_LO, 1)


def _to_z(name: str, value):
    if name in FRACTIONS:
        u = (value - _LO) / (1.0 - _LO)
        return jnp.log(u) - jnp.log1p(-u)
    return jnp.log(value)


def _from_z(name: str, z):
    if name in FRACTIONS:
        return _LO + (1.0 - _LO) * jax.nn.sigmoid(z)
    return jnp.exp(z)


_IDEAL = {
    **{name: off for name, off in Hardware.OFF.items() if not isinstance(off, str)},
    "flops_efficiency": 1.0,
    "bandwidth_efficiency": 1.0,
    "kv_bandwidth_efficiency": 1.0,
}
"""Every calibrated field at the value of the pure roofline (v1)."""
_Z_PRIOR = np.array([float(_to_z(n, PRIOR[n])) for n in FIELDS])


def _prior_sd() -> np.ndarray:
    """Prior sd of each field's shared value in ``z`` (``FIELDS`` order): ``PRIOR_SD`` unless
    ``FIELD_SD`` names the field."""
    return np.array([FIELD_SD.get(n, PRIOR_SD) for n in FIELDS])


def _family_sd() -> np.ndarray:
    """Sd of each field's family offset in ``z`` (``FIELDS`` order): ``FAMILY_SD``, or the
    field's ``FIELD_SD`` where that is tighter."""
    return np.array([min(FIELD_SD.get(n, FAMILY_SD), FAMILY_SD) for n in FIELDS])


def _with_profile(hardware: Hardware, values: jax.Array, fixed: bool = True) -> Hardware:
    """``hardware`` with the ``FIELDS`` set from ``values`` (last axis in ``FIELDS`` order) and
    the ``FIXED`` fields set to their values (``fixed``) or to their ideal, v1 values."""
    names = FIELDS + tuple(FIXED)
    table = FIXED if fixed else {n: _IDEAL[n] for n in FIXED}
    fixed_values = tuple(jnp.full(values.shape[:-1], v) for v in table.values())
    return eqx.tree_at(
        lambda h: tuple(getattr(h, n) for n in names),
        hardware,
        tuple(values[..., j] for j in range(len(FIELDS))) + fixed_values,
        is_leaf=lambda x: x is None,
    )


def calibrated_hardware(hardware: Hardware, family: str) -> Hardware:
    """``hardware`` with the shipped profile of ``family`` applied: the same as
    ``dcost.presets.with_calibration_profile``, kept under this name."""
    from dcost.presets import with_calibration_profile

    return with_calibration_profile(hardware, family)


# ---- the data, stacked per kind of evaluation ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Group:
    """Records that share a step: their specs stacked along a leading axis, and which of the
    step's ``metrics`` each record is (``codes``): the step is traced once for all of them."""

    step: str
    metrics: tuple
    codes: np.ndarray  # index into ``metrics``, per record
    index: np.ndarray  # positions in the record list
    cases: Case  # a Case whose specs and numbers carry a leading axis


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What the fit evaluates: the records' runs (``dcost.validation.cases.waves``: one per
    record, or a finite run's full and partial waves) in ``groups``, and how they combine into
    the records' predictions, ``log pred_i = -log sum_{j: owner_j = i} share_j / X_j``."""

    groups: list[_Group]  # over the runs
    owner: np.ndarray  # (runs,) the record of each run
    share: np.ndarray  # (runs,) its time weight
    n: int  # records


def _plan(records: Sequence[Mapping]) -> _Plan:
    owner, share, runs = [], [], []
    for i, r in enumerate(records):
        for s, run in waves(r):
            owner.append(i)
            share.append(s)
            runs.append(run)
    return _Plan(_groups(runs), np.array(owner), np.array(share), len(records))


def _combine(plan: _Plan, log_x: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Each record's log prediction from its runs' ``log_x``, and each run's weight in it
    (``d log pred / d log X_j``, summing to 1 per record)."""
    a = jnp.log(jnp.asarray(plan.share)) - log_x
    owner = jnp.asarray(plan.owner)
    top = jax.ops.segment_max(a, owner, plan.n)
    e = jnp.exp(a - top[owner])
    total = jax.ops.segment_sum(e, owner, plan.n)
    return -(top + jnp.log(total)), e / total[owner]


def _groups(records: Sequence[Mapping]) -> list[_Group]:
    cases = [case(r, calibrated=False) for r in records]
    for r, c in zip(records, cases, strict=True):
        if c.wave_share is not None:
            raise SpecError(
                f"record {r.get('id')!r}: wave_prompt_steps = {r['wave_prompt_steps']!r}: the "
                "family fit takes runs in steady state; leave the field out"
            )
    keys: dict[str, list[int]] = {}
    for i, c in enumerate(cases):
        keys.setdefault(c.step, []).append(i)
    out = []
    for step, idx in sorted(keys.items()):
        members = [cases[i] for i in idx]
        metrics = tuple(sorted({c.metric for c in members}))
        zero = jnp.zeros(len(FIELDS))
        stacked = Case(
            hardware=stack([_with_profile(c.hardware, zero) for c in members]),
            model=stack([c.model for c in members]),
            workload=stack([c.workload for c in members]),
            design=stack([c.design for c in members]),
            step=step,
            metric=metrics[0],
            chips=np.array([c.chips for c in members]),  # type: ignore[arg-type]
            input_per_output=np.array([c.input_per_output for c in members]),  # type: ignore[arg-type]
        )
        codes = np.array([metrics.index(c.metric) for c in members])
        out.append(_Group(step, metrics, codes, np.array(idx), stacked))
    return out


def _predict_group(group: _Group, values: jax.Array, multinomial, fixed=True) -> jax.Array:
    """Predictions of one group, each record with its own profile ``values[i]`` (``fixed``: the
    ``FIXED`` fields at their calibrated values, else at their ideal ones)."""
    c = group.cases

    def one(h, m, w, d, chips, ipo, v, code):
        w = eqx.tree_at(
            lambda x: x.expert_imbalance,
            w,
            jnp.where(multinomial, 0.0, 1.0),
            is_leaf=lambda x: x is None,
        )
        single = Case(_with_profile(h, v, fixed), m, w, d, group.step, c.metric, chips, ipo)
        every = evaluate_metrics(single, group.metrics)
        return jnp.sum(jnp.where(jnp.arange(len(group.metrics)) == code, every, 0.0))

    return jax.vmap(one)(
        c.hardware,
        c.model,
        c.workload,
        c.design,
        jnp.asarray(c.chips),
        jnp.asarray(c.input_per_output),
        values,
        jnp.asarray(group.codes),
    )


def _predict_one(group: _Group, value: jax.Array, multinomial, i, fixed=True) -> jax.Array:
    """Prediction of record ``i`` of a group with profile ``value`` (``_predict_group``'s body)."""
    pick = functools.partial(jax.tree.map, lambda x: jnp.asarray(x)[i])
    c = group.cases
    h, m, w, d = pick((c.hardware, c.model, c.workload, c.design))
    w = eqx.tree_at(
        lambda x: x.expert_imbalance,
        w,
        jnp.where(multinomial, 0.0, 1.0),
        is_leaf=lambda x: x is None,
    )
    chips, ipo = jnp.asarray(c.chips)[i], jnp.asarray(c.input_per_output)[i]
    single = Case(
        _with_profile(h, value, fixed),
        m,
        w,
        d,
        group.step,
        c.metric,
        chips,  # type: ignore[arg-type]
        ipo,  # type: ignore[arg-type]
    )
    every = evaluate_metrics(single, group.metrics)
    code = jnp.asarray(group.codes)[i]
    return jnp.sum(jnp.where(jnp.arange(len(group.metrics)) == code, every, 0.0))


# ---- the fit ---------------------------------------------------------------------------------


class Fit(eqx.Module):
    """A calibration: the shared profile and each family's offset, in ``z`` coordinates.

    Attributes:
      z_global: ``(n_fields,)``.
      delta: ``(n_families, n_fields)``.
      families: the family names, in ``delta``'s row order (static).
    """

    z_global: jax.Array
    delta: jax.Array
    families: tuple = eqx.field(static=True)

    def values(self, family_index) -> jax.Array:
        """The profile (SI units, ``FIELDS`` order) of the families ``family_index``."""
        z = self.z_global + self.delta[family_index]
        return jnp.stack([_from_z(n, z[..., j]) for j, n in enumerate(FIELDS)], axis=-1)

    def profile(self, family: str) -> dict[str, float]:
        """``{field: value}`` of one family (SI units): the fitted ``FIELDS`` and the ``FIXED``."""
        v = np.asarray(self.values(self.families.index(family)))
        return {**{n: float(v[j]) for j, n in enumerate(FIELDS)}, **FIXED}


def queueing(record: Mapping) -> bool:
    """Whether a record's figure is dominated by queueing, which the serving model does not have
    yet: a time to first token measured with more than one request in flight (the request waits
    for a slot and for the steps ahead of it). Such records are predicted and reported, but the
    fit does not see them."""
    return record["metric"] == "ttft" and float(record["concurrency"]) > 1


def bare_kernels(record: Mapping) -> bool:
    """Whether a record timed bare compiled kernels (``engine = "bare-xla"``: dcost's own decode
    steps, ``dcost.calibrate.decode_timing``) rather than a serving engine. The family profiles
    are profiles of serving engines on a family's chips, so such records are predicted and
    reported as their own population (held out by construction), and the fit does not see them."""
    return record.get("engine") == "bare-xla"


def fitted(record: Mapping) -> bool:
    """Whether the fit sees a record: neither ``queueing`` nor ``bare_kernels``."""
    return not (queueing(record) or bare_kernels(record))


def _prepared(records):
    families = tuple(sorted({r["family"] for r in records}))
    fam = np.array([families.index(r["family"]) for r in records])
    log_y = np.log(np.array([float(r["value"]) for r in records]))
    return families, fam, log_y, _plan(records)


def _values(z_global, delta, fam):
    """Each record's profile (SI units, ``(n, len(FIELDS))``) from the ``z`` coordinates."""
    z = z_global + delta[fam]
    return jnp.stack([_from_z(nm, z[:, j]) for j, nm in enumerate(FIELDS)], axis=-1)


def _log_predictions(plan, z_global, delta, fam, multinomial):
    return _log_predict_values(plan, multinomial)(_values(z_global, delta, fam))


def _log_predict_values(plan, multinomial):
    """``values (n, k) -> log predictions (n,)``, differentiated in forward mode.

    Each prediction depends only on its own record's ``k`` profile values, so its gradient is
    one ``k``-column forward-mode Jacobian per record (``jax.jacfwd``), returned by a custom VJP:
    the same derivative as reverse mode, but XLA compiles forward-mode code of the cost model
    several times faster than its reverse-mode code, and the compile dominates the fit.
    """

    runs, owner = len(plan.owner), jnp.asarray(plan.owner)

    def evaluate(values, with_jacobian):
        values = values[owner]  # each run at its record's profile
        out = jnp.zeros(runs)
        jac = jnp.zeros((runs, len(FIELDS)))
        for g in plan.groups:
            v = values[g.index]
            if not with_jacobian:
                out = out.at[g.index].set(jnp.log(_predict_group(g, v, multinomial)))
                continue

            def one(v1, i, g=g):
                return jnp.log(_predict_one(g, v1, multinomial, i))

            idx = jnp.arange(len(g.index))
            jg, lg = jax.vmap(jax.jacfwd(lambda v1, i: (one(v1, i),) * 2, has_aux=True))(v, idx)
            out = out.at[g.index].set(lg)
            jac = jac.at[g.index].set(jg)
        log_pred, weight = _combine(plan, out)
        return log_pred, jax.ops.segment_sum(weight[:, None] * jac, owner, plan.n)

    @jax.custom_vjp
    def log_predict(values):
        return evaluate(values, False)[0]

    def fwd(values):
        out, jac = evaluate(values, True)
        return out, jac

    def bwd(jac, ct):
        return (ct[:, None] * jac,)

    log_predict.defvjp(fwd, bwd)
    return log_predict


def _fit_weights(plan, fam, log_y, weights, n_families, steps, multinomial):
    """Adam on the penalized mean squared log error, for one weight vector (one fold).

    The learning rate decays from ``LEARNING_RATE`` to 1 % of it (a cosine schedule), so the
    last steps settle instead of hovering around the minimum. Returns the parameters after
    ``steps`` updates, every record's log prediction there, and the loss before each update and
    at the end (``steps + 1`` values).
    The loop runs one evaluation more than it updates: the last one, at the final parameters,
    gives the predictions, so the program holds one copy of the model, not a second one to
    predict with.
    """

    def loss(params):
        zg, delta = params
        log_pred = _log_predictions(plan, zg, delta, fam, multinomial)
        err = log_pred - log_y
        seen = jnp.maximum(jnp.sum(weights), 1.0)  # the records this fit sees
        data = jnp.sum(weights * err**2) / seen
        prior = jnp.sum((zg - _Z_PRIOR) ** 2 / (2 * _prior_sd() ** 2))
        shrink = jnp.sum(delta**2 / (2 * _family_sd() ** 2))
        return data + (prior + shrink) / seen, log_pred

    opt = optax.adam(optax.cosine_decay_schedule(LEARNING_RATE, steps, alpha=0.01))
    params = (jnp.asarray(_Z_PRIOR), jnp.zeros((n_families, len(FIELDS))))
    state = opt.init(params)

    def step(carry, i):
        params, state, _ = carry
        (value, log_pred), grad = jax.value_and_grad(loss, has_aux=True)(params)
        updates, new_state = opt.update(grad, state, params)
        last = i == steps  # the extra evaluation: keep the parameters it was made at
        new = jax.tree.map(
            lambda a, b: jnp.where(last, a, b), params, optax.apply_updates(params, updates)
        )
        return (new, new_state, log_pred), value

    start = (params, state, jnp.zeros(plan.n))
    (params, _, log_pred), trace = jax.lax.scan(step, start, jnp.arange(steps + 1))
    return params, log_pred, trace


def _check_steps(where: str, steps) -> None:
    """Refuse a step count that is not a whole number >= 1, naming it (the schedule needs one)."""
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise ValueError(f"{where}: steps = {steps!r} must be a whole number >= 1 (Adam steps)")


def fit(records: Sequence[Mapping], *, steps: int = STEPS, multinomial: bool = True) -> Fit:
    """The calibration on every record (what ships): ``Fit`` of the shared profile and offsets.

    Args:
      records: measurement records (``dcost.validation.load()``).
      steps: Adam steps.
      multinomial: charge MoE records the expected maximum expert load (the calibrated mode).
    """
    _check_steps("fit", steps)
    families, fam, log_y, plan = _prepared(records)
    run = jax.jit(
        functools.partial(
            _fit_weights,
            plan,
            fam,
            log_y,
            n_families=len(families),
            steps=steps,
            multinomial=multinomial,
        )
    )
    (zg, delta), _, _ = run(jnp.asarray([1.0 if fitted(r) else 0.0 for r in records]))
    return Fit(zg, delta, families)


@dataclasses.dataclass(frozen=True)
class CrossValidation:
    """Leave-one-source-out predictions.

    Attributes:
      records: the records, in order.
      held_out: each record's prediction by the fit that did not see its source (SI units).
      pure: each record's pure-physics prediction (the bound).
      sources: the source ids, one fold each.
      fits: one ``Fit`` per fold (leading axis over ``sources``).
    """

    records: tuple
    held_out: np.ndarray
    pure: np.ndarray
    sources: tuple
    fits: Fit

    @property
    def ratio(self) -> np.ndarray:
        """``held_out / measured`` per record."""
        return self.held_out / np.array([float(r["value"]) for r in self.records])

    @property
    def error(self) -> np.ndarray:
        """``|held_out / measured - 1|`` per record."""
        return np.abs(self.ratio - 1.0)


def cross_validate(records: Sequence[Mapping], *, steps: int = STEPS) -> CrossValidation:
    """Leave-one-source-out: one fit per source (all in one jitted call), each record
    predicted by the fit that did not see its source.

    >>> import dcost.validation as v
    >>> cv = cross_validate(v.load()[:12], steps=20)
    >>> cv.held_out.shape == (12,) and bool(np.all(cv.held_out > 0))
    True
    """
    _check_steps("cross_validate", steps)
    families, fam, log_y, plan = _prepared(records)
    n = len(records)
    sources = tuple(sorted({r["source_id"] for r in records}))
    src = np.array([sources.index(r["source_id"]) for r in records])
    weights = (src[None, :] != np.arange(len(sources))[:, None]).astype(float)
    weights *= np.array([1.0 if fitted(r) else 0.0 for r in records])[None, :]

    def one_fold(w):
        params, log_pred, _ = _fit_weights(plan, fam, log_y, w, len(families), steps, True)
        return params, log_pred

    # the folds one after another (lax.map), not vmapped: the program holds one unbatched fit,
    # and the 17 folds the shipped records had then took 19-21 s instead of 23-26 s on 2 cores
    # (benchmarks/calibration.py; compiling is most of it; the same predictions)
    (zg, delta), log_pred = jax.jit(lambda w: jax.lax.map(one_fold, w))(jnp.asarray(weights))
    per_fold = np.exp(np.asarray(log_pred))  # (n_sources, n): every record, by every fold's fit
    held = per_fold[src, np.arange(n)]
    pure = np.exp(np.asarray(jax.jit(functools.partial(_pure, plan))()))  # the bounds
    return CrossValidation(tuple(records), held, pure, sources, Fit(zg, delta, families))


def pure_predictions(records: Sequence[Mapping]) -> np.ndarray:
    """Every record's pure-physics prediction (peak rates, no overheads, balanced experts) in one
    jitted call per kind of step: the batched twin of ``predict(record, calibrated=False)``."""
    plan = _plan(records)
    return np.exp(np.asarray(jax.jit(functools.partial(_pure, plan))()))


def _pure(plan):
    ideal = jnp.array([_IDEAL[name] for name in FIELDS])
    out = jnp.zeros(len(plan.owner))
    for g in plan.groups:
        v = jnp.broadcast_to(ideal, (len(g.index), len(FIELDS)))
        out = out.at[g.index].set(jnp.log(_predict_group(g, v, False, fixed=False)))
    return _combine(plan, out)[0]


def weighted_quantile(x, weights, q: float) -> float:
    """The ``q`` quantile of ``x`` under ``weights``: the smallest ``x_i`` whose share of the
    total weight, over the values ``<= x_i``, reaches ``q`` (the lower weighted quantile; equal
    weights give the order statistic ``x_(ceil(q n))``).

    >>> weighted_quantile([0.1, 0.2, 0.3, 0.4], [1, 1, 1, 1], 0.5)
    0.2
    >>> weighted_quantile([0.1, 0.2, 0.3, 0.4], [3, 1, 1, 1], 0.5)
    0.1
    """
    x, w = np.asarray(x, float), np.asarray(weights, float)
    if x.shape != w.shape or x.size == 0 or np.any(w < 0) or not w.sum() > 0:
        raise ValueError(
            "weighted_quantile: x and weights must be non-empty, of one shape, "
            "weights >= 0 with a positive sum"
        )
    if not 0.0 < q <= 1.0:
        raise ValueError(f"weighted_quantile: q = {q!r} is not allowed: it must be in (0, 1]")
    order = np.argsort(x, kind="stable")
    share = np.cumsum(w[order]) / w.sum()
    return float(x[order][min(int(np.searchsorted(share, q - 1e-12)), x.size - 1)])


def summary(cv: CrossValidation) -> dict:
    """Median and 90th percentile of the held-out ``|pred/measured - 1|``, overall and per family
    (families with their record counts) over the fitted records (overall also with each source
    weighted once, ``source_weighted``: a record by one over its source's fitted records, the
    error a new source should expect rather than the shipped sources' mix), and the share of
    pure-physics bounds that hold over all records; the records the fit does not see apart:
    ``queueing`` (count, median) and ``bare_kernels`` (count, median, 90th percentile, median of
    predicted/measured time, and the same per serving pool under ``by_serving``: decode steps,
    prefill passes, and per source under ``by_source``: dense and MoE decode steps apart)."""
    fit = np.array([fitted(r) for r in cv.records])
    queue = np.array([queueing(r) for r in cv.records])
    bare = np.array([bare_kernels(r) for r in cv.records])
    err = cv.error[fit]
    fams = np.array([r["family"] for r in cv.records])[fit]
    sources = [r["source_id"] for r, f in zip(cv.records, fit, strict=True) if f]
    count = collections.Counter(sources)
    once = np.array([1.0 / count[s] for s in sources])  # each source weighted once
    out: dict = {
        "overall": {
            "records": int(err.size),
            "median": float(np.median(err)),
            "p90": float(np.quantile(err, 0.9)),
            "source_weighted": {
                "sources": len(count),
                "median": weighted_quantile(err, once, 0.5),
                "p90": weighted_quantile(err, once, 0.9),
            },
        }
    }
    for f in sorted(set(fams)):
        e = err[fams == f]
        out[str(f)] = {
            "records": int(e.size),
            "median": float(np.median(e)),
            "p90": float(np.quantile(e, 0.9)),
        }
    measured = np.array([float(r["value"]) for r in cv.records])
    time = np.array([r["metric"] in TIME_METRICS for r in cv.records])
    holds = np.where(time, cv.pure <= measured * (1 + 1e-5), cv.pure >= measured * (1 - 1e-5))
    out["bound_holds"] = float(np.mean(holds))
    out["queueing"] = {
        "records": int(np.sum(queue)),
        "median": float(np.median(cv.error[queue])) if np.any(queue) else 0.0,
    }
    # predicted over measured time (a throughput's ratio inverted), so > 1 is too slow throughout
    time_ratio = np.where(time, cv.ratio, 1.0 / cv.ratio)

    def bare_summary(mask):
        return {
            "records": int(np.sum(mask)),
            "median": float(np.median(cv.error[mask])) if np.any(mask) else 0.0,
            "p90": float(np.quantile(cv.error[mask], 0.9)) if np.any(mask) else 0.0,
            "median_ratio": float(np.median(time_ratio[mask])) if np.any(mask) else 1.0,
        }

    serving = np.array([r["serving"] for r in cv.records])
    source = np.array([r["source_id"] for r in cv.records])
    out["bare_kernels"] = {
        **bare_summary(bare),
        "by_serving": {
            str(p): bare_summary(bare & (serving == p)) for p in sorted(set(serving[bare]))
        },
        "by_source": {
            str(p): bare_summary(bare & (source == p)) for p in sorted(set(source[bare]))
        },
    }
    return out


def source_spread(cv: CrossValidation) -> dict:
    """How much of the held-out error is each source's own speed: the error left when every
    fitted record's speed ratio ``q_i`` (predicted over measured speed) is divided by its
    source's median ``m_s``, ``|q_i / m_s - 1|``; ``{"median", "p90", "offsets"}``, with
    ``offsets`` each source's ``m_s`` (sorted by name).

    An oracle no held-out prediction has (it needs the source's own measurements): a diagnostic
    of where the error lives. A median far below ``summary``'s says the sources disagree with
    each other (an engine against another, one year's software against the next); a 90th
    percentile near it says the tail is spread inside sources.
    """
    time = np.array([r["metric"] in TIME_METRICS for r in cv.records])
    log_speed = np.log(np.where(time, 1.0 / cv.ratio, cv.ratio))
    fit = np.array([fitted(r) for r in cv.records])
    src = np.array([r["source_id"] for r in cv.records])
    offsets = {str(s): float(np.median(log_speed[fit & (src == s)])) for s in sorted(set(src[fit]))}
    left = np.array([log_speed[i] - offsets[src[i]] for i in np.flatnonzero(fit)])
    err = np.abs(np.exp(left) - 1.0)
    return {
        "median": float(np.median(err)),
        "p90": float(np.quantile(err, 0.9)),
        "offsets": {k: float(np.exp(v)) for k, v in offsets.items()},
    }


BATCH_BANDS = ((1.0, "1-3"), (4.0, "4-63"), (64.0, "64-511"), (512.0, ">= 512"))
"""Bands of sequences per attention group per micro-batch, ``B/A`` (lower edge, label): below 4
a step is latency-bound (weights, launches and collectives' latencies); from 512 on it is the
large-batch throughput regime."""


def _batch_band(record: Mapping, c: Case) -> str:
    per_group = float(c.design.batch) / float(c.design.get("attention_dp"))
    return [label for edge, label in BATCH_BANDS if per_group >= edge][-1]


def _expert_layout(c: Case) -> str:
    if float(c.model.n_experts) <= 0:
        return "dense"
    split = float(c.design.get("expert_parallel")) < float(c.design.chips)
    return "MoE, expert tensor parallel" if split else "MoE, expert parallel"


REGIMES = {
    "sequences per attention group": _batch_band,
    "pool": lambda r, c: r["serving"],
    "experts": lambda r, c: _expert_layout(c),
    "speculative decoding": lambda r, c: "yes" if "speculative" in r else "no",
    "weights / compute": lambda r, c: f"{r['weights']} / {r['compute']}",
}
"""Ways to group the fitted records in ``breakdown``: name -> ``(record, its Case) -> group``."""


def breakdown(cv: CrossValidation) -> dict[str, dict[str, dict]]:
    """The held-out error of the fitted records by regime: for each of ``REGIMES`` and each of
    its groups, ``{records, median, p90, speed_ratio}``: the median and 90th percentile of
    ``|held_out/measured - 1|``, and the median of the predicted speed over the measured one
    (``held_out/measured`` for a throughput, ``measured/held_out`` for a time): above 1 the model
    is too fast there, below 1 too slow. Groups of ``sequences per attention group`` come in
    ``BATCH_BANDS`` order, the others sorted by name. Where ``summary`` says how far off the
    model is, this says where.
    """
    time = np.array([r["metric"] in TIME_METRICS for r in cv.records])
    speed = np.where(time, 1.0 / cv.ratio, cv.ratio)
    rows = [
        (r, case(r), e, q) for r, e, q in zip(cv.records, cv.error, speed, strict=True) if fitted(r)
    ]
    order = [label for _, label in BATCH_BANDS]
    out: dict[str, dict[str, dict]] = {}
    for name, key in REGIMES.items():
        groups: dict[str, list[tuple[float, float]]] = {}
        for r, c, e, q in rows:
            groups.setdefault(key(r, c), []).append((float(e), float(q)))
        names = sorted(groups, key=lambda g: (order.index(g) if g in order else len(order), g))
        out[name] = {}
        for g in names:
            e, q = np.array(groups[g]).T
            out[name][g] = {
                "records": int(e.size),
                "median": float(np.median(e)),
                "p90": float(np.quantile(e, 0.9)),
                "speed_ratio": float(np.median(q)),
            }
    return out


def _fmt(x: float) -> str:
    return f"{x:.6g}" if math.isfinite(x) else "inf"


def write_profiles(fit_all: Fit, held_out: Mapping, path=None) -> pathlib.Path:
    """Write the profiles of ``fit_all`` (the fit on every record) and the held-out summary of
    the cross-validation as ``dcost/presets/calibration.toml`` (or ``path``); returns the path."""
    import dcost.presets

    path = pathlib.Path(path or pathlib.Path(dcost.presets.__file__).with_name("calibration.toml"))
    lines = [
        "# Calibrated hardware-family profiles: written by `dcost validate --write` (the fit on",
        "# every shipped measurement record, dcost.calibrate.families). Do not edit by hand.",
        "# [heldout]: the leave-one-source-out error of the same procedure, |pred/measured - 1|.",
        "",
    ]
    for family in fit_all.families:
        lines.append(f"[family.{family}]")
        for name, value in fit_all.profile(family).items():
            lines.append(f"{name} = {_fmt(value)}")
        lines.append("")
    lines += ["[heldout]", f"bound_holds = {_fmt(float(held_out['bound_holds']))}", ""]

    def table(name: str, s: Mapping) -> None:
        lines.append(f"[{name}]")
        lines.extend(f"{k} = {_fmt(float(v))}" for k, v in s.items() if not isinstance(v, Mapping))
        lines.append("")
        for k, v in s.items():
            if isinstance(v, Mapping):
                table(f"{name}.{k}", v)

    for name, s in held_out.items():
        if isinstance(s, Mapping):
            table(f"heldout.{name}", s)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path
