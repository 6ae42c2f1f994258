"""Capacity planning: traffic, latency percentiles of a fleet, and the simulation that checks them.

- ``traffic``: ``Traffic`` (arrival rate, length distributions, prefix-cache hits) and presets.
- ``pools``: ``Pool`` (a group of replicas: step-time function, batch cap, prefill chunk).
- ``latency``: smooth closed forms of TTFT and TPOT percentiles, aggregated and disaggregated.
- ``simulate``: a discrete-event simulation of continuous batching that measures the same.
- ``designs``: a pool's step time from a serving layout (the serving model, tabulated).
- ``search``: branch and bound over layouts and replica counts; the exhaustive grid.
- ``planner``: ``plan`` (the cheapest fleet), ``Plan``, ``plan_grid`` (its ground truth).
- ``sweep``: ``plan_sweep`` (many questions, sharded over devices and processes), ``Scenario``.
- ``envelope``: ``plan_sensitivity`` (elasticities of the bill, by the envelope theorem).
- ``fleet``: ``simulate`` (a plan's fleet through the simulation, step times exact).
- ``launch``: ``scheduler_settings`` (a plan as an engine launches it) and ``check_launch``
  (the launch under that engine's scheduler, ``server``, and the replicas that hold it).
"""

from dcost.planning.designs import Layout, StepTable, step_table
from dcost.planning.energy import FleetEnergy, plan_energy
from dcost.planning.envelope import PlanSensitivity, plan_sensitivity, relaxed_replicas
from dcost.planning.fleet import simulate
from dcost.planning.latency import Latency, aggregated_latency, disaggregated_latency
from dcost.planning.planner import Options, Plan, PlanBatch, PoolPlan, layouts, plan, plan_grid
from dcost.planning.pools import Pool, roofline_step
from dcost.planning.simulate import Simulation, simulate_aggregated, simulate_disaggregated
from dcost.planning.sweep import Scenario, plan_sweep
from dcost.planning.traffic import Traffic, traffic, traffic_card, traffic_names

__all__ = [
    "Traffic",
    "traffic",
    "traffic_names",
    "traffic_card",
    "Pool",
    "roofline_step",
    "Latency",
    "aggregated_latency",
    "disaggregated_latency",
    "Simulation",
    "simulate_aggregated",
    "simulate_disaggregated",
    "Layout",
    "StepTable",
    "step_table",
    "plan",
    "plan_grid",
    "Plan",
    "PlanBatch",
    "PoolPlan",
    "Options",
    "layouts",
    "Scenario",
    "plan_sweep",
    "simulate",
    "plan_sensitivity",
    "PlanSensitivity",
    "relaxed_replicas",
    "plan_energy",
    "FleetEnergy",
]
