"""How the optimal cost and design respond to every input: elasticities at the continuous optimum.

Let ``y = log v`` be the free variables, ``f(y; theta) = log cost`` and ``c_j(y; theta) =
log(value_j/limit_j)`` on the smooth model, and ``(y*, lam*)`` the optimum of the relaxation with
its multipliers. By the envelope theorem the optimal cost moves with any input ``theta`` as the
Lagrangian does at fixed ``(y*, lam*)``:

    d log cost* / d log theta = theta * d/dtheta [f(y*; theta) + sum_j lam*_j c_j(y*; theta)]

so ``d log cost* / d log limit_j = -lam*_j``. The optimal design moves by implicit
differentiation of the KKT conditions on the active set (stationarity in the interior variables,
``c_j = 0`` for the active constraints; variables at a bound, or held at a jump of the model
such as a scale-up domain's edge, stay put, so that there the multipliers and elasticities are
those of the layout held, e.g. ``G = S`` chips per stage):

    F(y, lam; theta) = 0  =>  d(y*, lam*)/d theta = -(dF/d(y, lam))^{-1} dF/d theta

The continuous optimum from ``dcost.optimize``'s multi-start search is first polished by damped
Newton steps on ``F`` (``dcost.search.kkt``: every start under a few guesses of the active set, each
result checked; the cheapest KKT point wins, ``relaxed.kkt`` says whether one passed) so that
derivatives are taken at a KKT point. These are the sensitivities
of the smooth relaxation at its final smoothness: the integer optimum itself moves in steps.
Reference: Nocedal & Wright, "Numerical Optimization" (2006), 12.8 (sensitivity and multipliers);
Fiacco, "Introduction to Sensitivity and Stability Analysis in Nonlinear Programming" (1983).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np

from dcost.search._jit import jit
from dcost.search.buckets import bucketed
from dcost.search.kkt import NEAR, PIN_TOL, SNAP, ActiveSet, Relaxed, kkt_residual, polish
from dcost.search.linalg import lstsq
from dcost.search.optimize import (
    DEFAULT,
    Settings,
    _check_problem,
    _halton,
    best_continuous,
    check_settings,
)
from dcost.search.problem import _LIMIT_OF, Problem, broadcast, evaluate, on_shared_form, to_search
from dcost.specs import Hardware, Model, SpecError, Workload

INFEASIBLE_LOG_RATIO = 0.01
"""The relaxed optimum counts as infeasible when a constraint's ``log(value/limit)`` exceeds this
(1 %): far above the smooth model's own excess over the exact one at the search's last smoothness
(``3**0.003 - 1``, 0.3 %), far below the factors an unreachable limit leaves (a tpot target 10x
too tight gave 2.3)."""

RETRY_STARTS = 2
"""A single scenario whose relaxed optimum comes out infeasible is searched again from the next
``settings.starts`` points of the Halton sequence, up to this many sets of starts in all, before
it is called infeasible. Each set runs the same compiled programs (the set's first point is an
argument, not a static setting), so a retry costs a run, not a compilation."""

__all__ = ["sensitivity", "relax", "Sensitivity", "Relaxed", "Elasticities"]


class Elasticities(eqx.Module):
    """``d log(something) / d log(field)`` for every field of the scenario's inputs."""

    hardware: Hardware
    model: Model
    workload: Workload


class Sensitivity(eqx.Module):
    """Result of ``dcost.sensitivity``.

    Attributes:
      hardware, model, workload: pytrees shaped like the inputs holding
        ``d log(optimal cost) / d log(field)`` (e.g. ``.hardware.hbm_bandwidth``).
      limits: ``{constraint: d log(optimal cost) / d log(limit)}`` (``= -lambda``).
      design: ``{free variable: Elasticities}``: ``d log(optimal value) / d log(field)``; for
        the variables whose 0 means off (``ZERO_OFF``: draft tokens, redundant experts,
        de-duplicated dispatch) ``d log(1 + optimal value) / d log(field)``.
      relaxed: the ``Relaxed`` optimum they are taken at.
      log_ratios: ``log(value/limit)`` of every constraint at the relaxed optimum (smooth model),
        ``(..., n_constraints)``; above ``INFEASIBLE_LOG_RATIO`` the scenario is infeasible.
      problem: the problem.
    """

    hardware: Hardware
    model: Model
    workload: Workload
    limits: dict
    design: dict
    relaxed: Relaxed
    log_ratios: jax.Array
    problem: Problem

    @property
    def feasible(self):
        """Whether the relaxed optimum meets every limit (within ``INFEASIBLE_LOG_RATIO``); a
        boolean array for a batched problem. Elasticities of an infeasible scenario mean nothing."""
        return np.all(np.asarray(self.log_ratios) <= INFEASIBLE_LOG_RATIO, axis=-1)

    @property
    def message(self):
        """ "feasible", or "infeasible: tpot binds: ..." naming the constraints the relaxed
        optimum breaks, with value and limit (a list for a batched problem)."""
        n = int(np.size(self.feasible))
        msgs = [_message(self, i) for i in range(n)]
        return msgs[0] if np.ndim(self.log_ratios) == 1 else msgs

    def ranked(self, top: int | None = None) -> list[tuple[str, float]]:
        """``[(name, elasticity), ...]`` of the cost, largest magnitude first, zeros dropped
        (a single scenario): "what would make tokens cheaper". Magnitudes equal to 6 decimals
        (the many elasticities of exactly +-1) are in the order of their names, so the order
        does not hang on the last bits a compiler option moves."""
        rows = []
        for part in ("hardware", "model", "workload"):
            tree = getattr(self, part)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
                name = jax.tree_util.keystr(path, simple=True, separator=".")
                rows.append((f"{part}.{name}", float(leaf)))
        rows += [(f"{name}_limit", float(v)) for name, v in self.limits.items()]
        rows = [r for r in rows if r[1] != 0.0 and np.isfinite(r[1])]
        rows.sort(key=lambda r: (-round(abs(r[1]), 6), r[0]))
        return rows[:top]


def _starts(problem: Problem, settings: Settings, first) -> jax.Array:
    """``settings.starts`` points of the Halton sequence from its ``first`` (traced: every set
    of ``RETRY_STARTS`` is one program), ``(starts, d)`` in the unit box."""
    halton = _halton(RETRY_STARTS * settings.starts, len(problem.free))
    table = jnp.asarray(halton, jnp.result_type(float))
    return jax.lax.dynamic_slice_in_dim(table, first, settings.starts)


def _search_from_one(problem: Problem, settings: Settings, first):
    """The continuous search from the Halton points ``first`` on: the best run and every
    start's end point (``dcost.optimize``'s first stage, ``_relax_one``, from these starts)."""
    best, runs = best_continuous(problem, settings, _starts(problem, settings, first))
    return best, runs.v


@functools.partial(jit, static_argnames=("settings", "batch"), fast_compile=True)
def _search_from(problem, settings, batch, first):
    if batch is None:
        return _search_from_one(problem, settings, first)
    return jax.vmap(lambda p: _search_from_one(p, settings, first))(broadcast(problem, batch))


def _polish_one(problem: Problem, best, v_starts) -> tuple[Relaxed, jax.Array]:
    """Polish every start's end point and the best run under every guess; the cheapest KKT
    point (or, when none passes the checks, the best run's first guess, flagged ``kkt =
    False``), and the KKT Jacobian there."""
    s = best.smoothness
    starts = jnp.concatenate(
        [jnp.log(to_search(problem, best.v))[None], jnp.log(to_search(problem, v_starts))]
    )
    guesses = list(itertools.product(NEAR, SNAP, (PIN_TOL, jnp.inf)))
    y0 = jnp.tile(starts, (len(guesses), 1))
    near, snap, pin = (
        jnp.repeat(jnp.asarray(g, starts.dtype), starts.shape[0])
        for g in zip(*guesses, strict=True)
    )
    # one polish after another (lax.map), not vmapped: the program holds the polish unbatched,
    # and the sensitivity compiles in 12.6 s of CPU instead of 14.7 s (deepseek-v3 on H100,
    # three free variables, 2 cores; two runs each) for 0.08 s instead of 0.05 s of run (llama-3-
    # 70b); a first call is mostly compilation
    every, jacs = jax.lax.map(
        lambda a: polish(problem, a[0], a[1], a[2], a[3], s), (y0, near, snap, pin)
    )
    score = jnp.where(every.kkt & jnp.isfinite(every.log_cost), every.log_cost, jnp.inf)
    k = jnp.where(jnp.any(every.kkt), jnp.argmin(score), 0)
    return jax.tree.map(lambda a: a[k], every), jacs[k]


@functools.partial(jit, static_argnames=("batch",), fast_compile=True)
def _polish(problem, best, v_starts, batch):
    if batch is None:
        return _polish_one(problem, best, v_starts)
    return jax.vmap(_polish_one)(broadcast(problem, batch), best, v_starts)


def _derive_one(problem: Problem, r: Relaxed, jac_w) -> Sensitivity:
    """The elasticities at the polished point ``r`` (KKT Jacobian ``jac_w`` there): the envelope
    theorem for the cost, the implicit function theorem for the design."""
    s = r.smoothness
    w = jnp.concatenate([r.y, r.lambdas])
    aset = ActiveSet(jax.lax.stop_gradient(r.y), r.interior, r.active)
    inputs = (problem.hardware, problem.model, problem.workload)

    def at(parts):
        """KKT residual (implicit function) and Lagrangian (envelope) as the inputs change."""
        p = eqx.tree_at(lambda q: (q.hardware, q.model, q.workload), problem, parts)
        residual, (_, f, c) = kkt_residual(p, w, aset, s)
        return jnp.concatenate([residual, (f + jnp.dot(r.lambdas, c))[None]])

    leaves, treedef = jax.tree.flatten(jax.jacfwd(at)(inputs))  # every leaf: (d + n_c + 1,)
    values = jax.tree.leaves(inputs)
    d_log = jnp.stack(leaves, axis=-1) * jnp.stack(values)  # derivatives in log(field)
    cost = jax.tree.unflatten(treedef, list(d_log[-1]))  # envelope theorem
    moved = -lstsq(jac_w, d_log[:-1])  # implicit function theorem
    design = {
        name: Elasticities(*jax.tree.unflatten(treedef, list(moved[i])))
        for i, name in enumerate(problem.names)
    }
    limits = {n: -r.lambdas[j] for j, n in enumerate(problem.constraints)}
    here = evaluate(problem, r.x, s)
    return Sensitivity(
        hardware=cost[0],
        model=cost[1],
        workload=cost[2],
        limits=limits,
        design=design,
        relaxed=r,
        log_ratios=here.log_ratios,
        problem=problem,
    )


@functools.partial(jit, static_argnames=("batch",), fast_compile=True)
def _derive(problem, r, jac_w, batch):
    if batch is None:
        return _derive_one(problem, r, jac_w)
    return jax.vmap(_derive_one)(broadcast(problem, batch), r, jac_w)


def _sensitivity(problem, settings, batch, first: int) -> Sensitivity:
    """The search from the Halton points ``first`` on, the polish and the derivatives: three
    compiled programs, not one. Every set of starts runs the same search (``first`` is an
    argument), and the polish and the derivatives depend on no setting. The one program they
    made never reached dcost's program store (its first start was a NumPy scalar, which the
    store does not take), so a process traced it again each time: ``dcost optimize
    --sensitivity kkt`` (llama-3-70b on H100, context 4096) took 5.1-5.6 s warm, and takes
    1.7-2.5 s now; on an empty cache about as long as before (2026-12-02, 2 cores)."""
    # an array, not a NumPy scalar: a program with a scalar argument is never stored
    best, v_starts = _search_from(problem, settings, batch, np.asarray(first, np.int32))
    r, jac_w = _polish(problem, best, v_starts, batch)
    return _derive(problem, r, jac_w, batch)


def relax(problem: Problem, settings: Settings = DEFAULT) -> Relaxed:
    """The polished optimum of the smooth relaxation (batched problems: one vmapped call).

    ``sensitivity``'s ``.relaxed``, from the same compiled programs (the derivatives' is small
    beside the search's and the polish's, and a process that asks for both compiles each once).

    >>> import dcost
    >>> from dcost.search.sensitivity import relax
    >>> p = dcost.Problem(dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"),
    ...                   dcost.Workload(2048), free={"batch": (1, 4096)}, tpot_slo=0.02)
    >>> r = relax(p)
    >>> bool(r.active[0]), bool(abs(float(dcost.decode(dcost.Design(r.x[0]), p.hardware,
    ...     p.model, p.workload, r.smoothness).tpot) / 0.02 - 1) < 1e-3)  # tpot binds
    (True, True)
    """
    return sensitivity(problem, settings).relaxed


def sensitivity(problem: Problem, settings: Settings = DEFAULT) -> Sensitivity:
    """Elasticities of the optimal cost (and design) with respect to every input field.

    See the module docstring for the method (envelope theorem at the polished continuous optimum;
    implicit differentiation of the active-set KKT conditions for the design).

    Args:
      problem: a ``dcost.Problem``; a batched one gives fields with the batch axis (its batch
        padded to a bucket, as in ``dcost.optimize``: one compilation for up to 16 scenarios).
      settings: the continuous search's settings (as ``dcost.optimize``).

    Returns:
      A ``Sensitivity``: ``.hardware``, ``.model``, ``.workload`` hold ``d log cost* / d log
      field``; ``.limits`` the constraints'; ``.design[var]`` how the optimal design moves.

    Raises:
      SpecError: a single-scenario problem is infeasible: even the smooth relaxation's best design
        exceeds a limit by more than ``INFEASIBLE_LOG_RATIO``, also when searched again from
        the next starts (``RETRY_STARTS`` sets in all). The message names the constraint,
        its value and its limit; elasticities exist only at a feasible optimum. A batched problem
        (a sweep, where some scenarios may be out of reach) does not raise: its infeasible
        scenarios are flagged in ``.feasible`` and explained in ``.message``, and their
        elasticities are not to be read.

    >>> import dcost
    >>> p = dcost.Problem(dcost.hardware("h100-sxm"), dcost.model("llama-3-8b"),
    ...                   dcost.Workload(2048), free={"batch": (1, 4096)}, tpot_slo=0.02)
    >>> s = dcost.sensitivity(p)
    >>> round(float(s.hardware.price_per_hour), 4)  # cost is proportional to the price
    1.0
    """
    _check_problem("sensitivity", problem)
    check_settings("sensitivity", settings)

    def solve(first):  # on its chip's shared form (``optimize``), answered for p
        return bucketed(
            lambda p, batch: _unfill(_sensitivity(on_shared_form(p), settings, batch, first), p),
            problem,
        )

    out = solve(0)
    if np.ndim(out.log_ratios) == 1 and not bool(out.feasible):
        # the multi-start search may miss a feasible region that other starts find (DeepSeek-V3
        # on H100s with chips and stages free: the first 8 starts end 2 % over memory, the next
        # 8 find the optimum)
        for k in range(1, RETRY_STARTS):
            again = solve(k * settings.starts)
            if bool(again.feasible):
                return again
        raise SpecError(
            f"sensitivity: the problem is {out.message} (also from "
            f"{RETRY_STARTS * settings.starts} starts); elasticities exist only at a feasible "
            "optimum (relax the limit, or see dcost.optimize(problem).message)"
        )
    return out


def _fold(elastic: Hardware, hardware: Hardware) -> Hardware:
    """Elasticities taken on ``shared_form(hardware)`` given as ``hardware``'s: a field that is
    None in ``hardware`` has no elasticity of its own; where its off value is another field's
    value (``attention_flops`` runs at ``flops``), its elasticity is that field's too (the chain
    rule: ``d log c / d log F = e'_F + e'_{F_attn}`` when ``F_attn = F``)."""
    values = {f.name: getattr(elastic, f.name) for f in dataclasses.fields(Hardware)}
    for name, off in Hardware.OFF.items():
        if getattr(hardware, name) is not None or values[name] is None:
            continue
        while isinstance(off, str) and getattr(hardware, off) is None:
            off = Hardware.OFF[off]  # an alias of an alias that is off: a constant
        if isinstance(off, str):
            values[off] = values[off] + values[name]
    kept = [
        values[f.name]
        for f in dataclasses.fields(Hardware)
        if getattr(hardware, f.name) is not None
    ]
    return jax.tree.unflatten(jax.tree.structure(hardware), kept)


def _unfill(sens: Sensitivity, problem: Problem) -> Sensitivity:
    """A ``Sensitivity`` of ``on_shared_form(problem)`` as ``problem``'s own (``_fold``)."""
    hw = problem.hardware
    design = {
        name: Elasticities(_fold(e.hardware, hw), e.model, e.workload)
        for name, e in sens.design.items()
    }
    return dataclasses.replace(
        sens, hardware=_fold(sens.hardware, hw), design=design, problem=problem
    )


def _message(sens: Sensitivity, i: int) -> str:
    """Scenario ``i`` in a sentence: "feasible", or the constraints the relaxed optimum breaks."""
    p = sens.problem
    ratios = np.asarray(sens.log_ratios).reshape(-1, len(p.constraints))[i]
    if not np.any(ratios > INFEASIBLE_LOG_RATIO):
        return "feasible"
    parts = []
    for j, name in enumerate(p.constraints):
        if ratios[j] > INFEASIBLE_LOG_RATIO:
            if name == "memory":  # numpy, not Problem.limits(): the problem may be float64
                limit = np.asarray(p.hardware.hbm_capacity) * (1 - np.asarray(p.memory_reserve))
            else:
                limit = np.asarray(getattr(p, _LIMIT_OF[name]))
            limit = float(np.ravel(limit)[i if limit.size > 1 else 0])
            parts.append(_violation(name, limit * float(np.exp(ratios[j])), limit))
    return "infeasible: " + "; ".join(parts)


def _violation(name: str, value: float, limit: float) -> str:
    field = f"Problem.{_LIMIT_OF.get(name, name)}"
    if name in ("tpot", "ttft"):
        return (
            f"{name} binds: the best design of the smooth relaxation takes {value * 1e3:.4g} ms, "
            f"above the {limit * 1e3:.4g} ms target ({field})"
        )
    if name == "memory":
        return (
            f"memory binds: the best design of the smooth relaxation needs {value / 1e9:.4g} GB "
            f"per chip, above the {limit / 1e9:.4g} GB available ({field})"
        )
    return (
        f"{name} binds: {value:.4g} at the best design of the smooth relaxation, above the "
        f"limit {limit:.4g} ({field})"
    )
