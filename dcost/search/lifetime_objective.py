"""The ``lifetime_cost`` objective (``dcost.search.objectives.LIFETIME_COST``): dollars of
pretraining + RL + inference, searched jointly with the routed expert count, the over-training
ratio and the serving layout.

A design fixes ``E`` routed experts (``experts``), the over-training ratio ``r`` (``overtrain``)
and the serving layout ``B, G, P`` (``batch``, ``chips``, ``stages``). The model keeps its active
parameters ``N_active`` (``k`` of ``E`` experts per token); ``E`` sets
``N_total = N_dense + E n_e``. Then

.. math::
    D = 20\\, r\\, N_{active}, \\quad
    \\text{loss} = L\\big(N_{active} (N_{total}/N_{active})^{\\gamma},\\ D\\big), \\quad
    \\$ = \\text{lifetime\\_cost}(N_{active}, D, D_{inf})

with ``L`` the scaling fit and ``lifetime_cost`` from ``dcost.training.lifetime``
(pretraining ``6 N D`` FLOP at the training price, RL tokens generated and trained on,
inference tokens at the serving cost per token of ``dcost.decode`` at the design). More experts
buy quality (``N_eff`` grows as
``E**gamma`` roughly) but cost HBM and weight reads; more over-training buys quality for
pretraining dollars. The constraints are ``loss <= loss_target`` and the serving ones (``tpot``,
``ttft``, ``memory``, ``replica_chips``), as for ``cost_per_token``. The loss enters the search
scaled to its reducible part (``Solution.values`` holds ``L* (L - E)/(L* - E)``, which is
``<= L*`` exactly when ``L <= L*``; the loss itself is ``report.loss``), so its multiplier is
``-d log($*) / d log(L* - E)``.

Over-training is searched on whole numbers, like every free variable (``grid_search`` and
``optimize`` round to integers): ``r`` in steps of one Chinchilla (20 tokens per active parameter),
``r >= 1``. At small ``r`` that is coarse (1 -> 2 doubles ``D``); a finer or sub-Chinchilla ``r``
is available as a fixed value (``Design(overtrain=0.5)``), not as a searched one.

>>> import dcost
>>> h, m = dcost.presets.pair("h100-sxm", "mixtral-8x7b")
>>> p = dcost.Problem(h, m, dcost.Workload(4096), objective="lifetime_cost",
...                   free={"batch": (1, 256), "overtrain": (1, 64)},
...                   fixed=dcost.Design(batch=1, chips=8), loss_target=1.95,
...                   extras=dcost.LifetimeInputs(inference_tokens=1e13))
>>> s = dcost.optimize(p)
>>> bool(s.feasible), bool(s.report.loss <= 1.95)
(True, True)
"""

from __future__ import annotations

import equinox as eqx
import jax
import numpy as np

from dcost.serving.roofline import Report, decode, prefill
from dcost.specs import SpecError, _concrete, with_experts
from dcost.training.lifetime import Deployment, LifetimeCost, LifetimeInputs, lifetime_cost
from dcost.training.scaling import TOKENS_PER_PARAM, effective_params, loss

__all__ = ["LifetimeInputs", "LifetimeReport", "evaluate", "validate"]
# LifetimeInputs is defined beside the lifetime economics (dcost.training.lifetime) and is
# re-exported here, where the objective that reads it as ``Problem.extras`` lives.


class LifetimeReport(eqx.Module):
    """One design of a ``lifetime_cost`` problem, evaluated (SI units, dollars).

    Attributes:
      serving: the ``dcost.Report`` of decode at the design (tpot, memory, cost per token...).
      cost: the ``dcost.training.lifetime.LifetimeCost`` (pretrain, rl, inference, total,
        cost_per_token).
      loss: the pretraining loss (nats per token).
      n_active, n_total: active and total parameters at the design's expert count.
      n_effective: ``effective_params(n_active, n_total, gamma)``.
      n_tokens: pretraining tokens ``D = 20 r N_active``.
    """

    serving: Report
    cost: LifetimeCost
    loss: jax.Array
    n_active: jax.Array
    n_total: jax.Array
    n_effective: jax.Array
    n_tokens: jax.Array


def evaluate(design, problem, smoothness):
    """``(total $, quantities, LifetimeReport)`` of one design (module docstring)."""
    x: LifetimeInputs = problem.extras
    h, w = problem.hardware, problem.workload
    model = with_experts(problem.model, design)
    n_act, n_tot = model.params_active, model.params_total
    n_tokens = TOKENS_PER_PARAM * design.overtrain * n_act
    cost = lifetime_cost(n_act, n_tokens, x, Deployment(h, model, design, w), smoothness)
    serving = decode(design, h, model, w, smoothness)
    n_eff = effective_params(n_act, n_tot, x.gamma)
    nats = loss(n_eff, n_tokens, x.fit)
    q = {
        "tpot": serving.tpot,
        "memory": serving.memory_per_chip,
        "replica_chips": design.chips_per_replica,
        "loss": _scaled_loss(nats, problem, x.fit),
    }
    if problem.ttft_slo is not None:
        q["ttft"] = prefill(design, h, model, w, smoothness).ttft
    return cost.total, q, LifetimeReport(serving, cost, nats, n_act, n_tot, n_eff, n_tokens)


def _scaled_loss(nats, problem, fit):
    """The loss as the constraint sees it: ``L* (L - E) / (L* - E)``, equal to ``L*`` exactly
    when ``L = L*`` and below it exactly when ``L < L*``, so ``loss <= target`` is unchanged; but
    the search's ``log(value/limit)`` becomes ``log((L - E)/(L* - E))``, the log of the reducible
    loss, whose slope in ``log D`` is ``-beta`` instead of ``-beta (L - E)/L`` (~50x flatter
    near the targets of interest, which stalls the augmented Lagrangian)."""
    target = problem.loss_target
    if target is None:
        return nats
    return target * (nats - fit.E) / (target - fit.E)


def validate(problem) -> None:
    """Inputs a lifetime problem needs: ``LifetimeInputs`` extras, an over-training ratio, and a
    loss target above the fit's irreducible loss."""
    x = problem.extras
    if not isinstance(x, LifetimeInputs):
        raise SpecError(
            "Problem.extras must be a dcost.LifetimeInputs for objective "
            f"'lifetime_cost', got {type(x).__name__}"
        )
    if "overtrain" not in problem.names and problem.fixed.overtrain is None:
        raise SpecError(
            "Problem.fixed.overtrain = None is not allowed for objective "
            "'lifetime_cost': make 'overtrain' free or fix it (r = D / (20 N_active))"
        )
    target, e = _concrete(problem.loss_target), _concrete(x.fit.E)
    if target is not None and e is not None and np.any(target <= np.max(e)):
        raise SpecError(
            f"Problem.loss_target = {float(np.min(target))!r} is not allowed: it "
            f"must be > the fit's irreducible loss E = {float(np.max(e))!r}"
        )
