"""Power and energy of a planned fleet (``dcost.plan_energy``): watts of its chips, joules a token.

Every chip of the fleet draws its idle floor all the time; on top of it, each token costs the
activity energy of the steps that make it (``dcost.energy`` at the pool's mean operating point):

.. math::

    W = N P_{idle} + \\lambda\\,(T_{out}\\,e_{dec} + T'_{in}\\,e_{pre}), \\qquad
    e_x = \\frac{G_x (P_x - P_{idle})\\, t_x}{\\text{tokens}_x}

with ``lambda`` the arrivals (requests/s), ``T_out`` the output tokens of a request and ``T'_in``
the prompt tokens it computes (those the prefix cache does not hold); ``e_dec`` from the decode
pool at its mean running batch, ``e_pre`` from the prefill pool, one prompt at a time; ``P_x`` a
chip's power during that step and ``G_x`` the chips of a replica. An aggregated pool runs both in
the same steps (``dcost.mixed_step`` at its mean batch and chunk): one term ``T_out e_mix``, the
prompts' share in it, priced at the step's joint utilisations. Adding a decode step's and a
prefill pass's activity instead counted twice what a step does once (a memory-bound decode hides
part of a chunk's FLOPs, and activity is concave): a busy aggregated fleet of Llama 3 70B on H100
came to 722-839 W a chip, over the board's 700 W. Each pool then stays between its chips' idle
floor and their limit (Little's law: ``lambda T_out t / B`` replicas busy at power ``P``; the
planner's mean step and ``dcost.mixed_step``'s differ, so a busy pool comes out busy 94-100 % of
the time on Llama 3.1 8B's chat, reasoning and long-context fleets under vLLM, and up to 1 %
over, which is held at all of the time).
J per output token is ``W / (lambda T_out)``. The idle floor is paid for every chip the plan
buys, busy or not; a replica's steps at its mean batch stand for all of its steps (the activity
of a step is nearly linear in its batch where decode is memory bound).
Energy counts the chips only: hosts, network and cooling come on top (a PUE).
"""

from __future__ import annotations

import dataclasses
import functools

from dcost.planning._jit import jit as _small_jit
from dcost.planning.designs import workload_stats
from dcost.search._jit import jit
from dcost.serving.power import WATTS_PER_MEGAWATT, energy, require_power
from dcost.specs import Design, SpecError, Workload

__all__ = ["FleetEnergy", "plan_energy"]

# one small program: op by op, its two dozen operations took 0.7 s of a warm ``dcost plan``
_workload_stats = _small_jit(workload_stats)


@dataclasses.dataclass(frozen=True)
class FleetEnergy:
    """What a planned fleet draws (SI units).

    Attributes:
      power: W of all the fleet's chips.
      power_per_chip: ``power`` over the chips (W).
      idle_power: the part of ``power`` that is the chips' idle floor (W).
      energy_per_output_token: J per output token (the whole fleet's, prompts included).
      tokens_per_mw: output tokens/s per MW of chip power.
      pools: ``(role, chips, W)`` of each pool.
    """

    power: float
    power_per_chip: float
    idle_power: float
    energy_per_output_token: float
    tokens_per_mw: float
    pools: tuple[tuple[str, int, float], ...]


# one stored program per step kind (``dcost.search._jit``): a later ``dcost plan`` loads it
# instead of tracing the steps' cost functions again
@functools.partial(jit, static_argnames=("step",))
def _activity(design, hardware, model, workload, step):
    """J of activity per token of ``step`` (``energy_per_token (P - P_idle) / P``) and W of
    activity per chip while it runs (``P - P_idle``)."""
    e = energy(design, hardware, model, workload, step=step)
    above = e.power_per_chip - hardware.idle_power
    return e.energy_per_token * above / e.power_per_chip, above


def _activity_energy(pool, plan, step: str, workload: Workload) -> tuple[float, float]:
    """J of activity (above the idle floor) per token of ``step`` in ``pool`` (per output token
    for a decode or mixed step, per computed prompt token for prefill), and W of activity per
    chip while the step runs."""
    kw: dict = {}
    if pool.draft_tokens and step != "prefill":
        kw["draft_tokens"] = pool.draft_tokens
    if step == "mixed" and pool.chunk:
        kw["prefill_chunk"] = pool.chunk
    batch = 1.0 if step == "prefill" else max(float(pool.decode_batch), 1.0)
    design = Design(
        batch=batch,
        chips=pool.chips_per_stage,
        stages=pool.stages,
        attention_dp=pool.attention_dp,
        **kw,
    )
    # the chip filled, as the planner's programs take it: one program for every profile
    joules, watts = _activity(design, plan.hardware.filled(), plan.model, workload, step=step)
    return float(joules), float(watts)


def plan_energy(plan) -> FleetEnergy:
    """The power and energy of a feasible plan's fleet (module docstring).

    Args:
      plan: a feasible ``dcost.Plan`` (``dcost.plan``); its chip must carry ``idle_power`` and
        ``max_power`` (every preset does).

    Returns:
      A ``FleetEnergy``.

    >>> import dcost
    >>> h100 = dcost.hardware("h100-sxm", calibrated=True)
    >>> p = dcost.plan(h100, "llama-3.1-8b", dcost.traffic("chat", rate=20.0), mode="aggregated")
    >>> e = dcost.plan_energy(p)
    >>> p.chips * 287.0 <= e.power <= p.chips * 700.0   # between the idle floor and the limit
    True
    """
    from dcost.planning.planner import Plan, PlanBatch

    if isinstance(plan, PlanBatch):
        raise SpecError(
            "plan_energy.plan is a PlanBatch: pass one of its plans (plan_energy(batch[i]))"
        )
    if not isinstance(plan, Plan):
        raise SpecError(
            f"plan_energy.plan must be a dcost.Plan (what dcost.plan returns), got "
            f"{type(plan).__name__}"
        )
    if not plan.feasible:
        raise SpecError(f"plan_energy: the plan is infeasible ({plan.message}): no fleet to power")
    require_power(plan.hardware, "plan_energy")
    t = plan.traffic
    rate, t_in, t_out = (float(getattr(t, f)) for f in ("rate", "prompt_tokens", "output_tokens"))
    computed = max(t_in * (1.0 - float(t.prefix_hit)), 1.0)
    imbalance = {"expert_imbalance": plan.expert_imbalance}  # as the planner timed its steps
    spec = imbalance if plan.acceptance is None else {"acceptance": plan.acceptance, **imbalance}
    # the decoding sequences at the planner's context, the running batch's time average (a long
    # output runs for more steps: at prompt + output/2 a reasoning fleet's steps came out a third
    # shorter than the planner's and its activity a third low)
    context = float(_workload_stats(t)[0])
    decode_work = Workload(context, prompt=t_in, output=t_out, **spec)
    # the mixed step's prompt tokens are those it computes (the prefix cache holds the rest)
    mixed_work = Workload(context, prompt=computed, output=t_out, **spec)
    prefill_work = Workload(computed, prompt=computed, output=t_out, **imbalance)
    floor = plan.hardware.idle_power
    assert floor is not None  # require_power above
    idle = float(floor)
    pools = []
    for pool in plan.pools:
        if pool.role == "aggregated":
            joules, above = _activity_energy(pool, plan, "mixed", mixed_work)
            tokens_per_s = rate * t_out
        elif pool.role == "decode":
            joules, above = _activity_energy(pool, plan, "decode", decode_work)
            tokens_per_s = rate * t_out
        else:
            joules, above = _activity_energy(pool, plan, "prefill", prefill_work)
            tokens_per_s = rate * computed
        # a pool's chips step at most all of the time: the planner's mean step and
        # dcost.mixed_step's differ (a busy pool came out 94-100 % busy, or up to 1 % over)
        busy = min(tokens_per_s * joules, pool.chips * above)
        pools.append((pool.role, int(pool.chips), pool.chips * idle + busy))
    power = sum(w for _, _, w in pools)
    tokens = rate * t_out
    return FleetEnergy(
        power=power,
        power_per_chip=power / plan.chips,
        idle_power=plan.chips * idle,
        energy_per_output_token=power / tokens,
        tokens_per_mw=WATTS_PER_MEGAWATT * tokens / power,
        pools=tuple(pools),
    )
