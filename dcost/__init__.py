"""dcost: smooth, differentiable cost models of LLM serving and training in JAX.

The public face; everything else is a private detail of the modules named for their concern.
"""

from dcost import pricing
from dcost.presets import PresetError, hardware, hardware_names, model, model_names
from dcost.pricing import fit_prices, identifiability, predict_prices, price_sheets
from dcost.search.grid import grid_search
from dcost.search.lifetime_objective import LifetimeReport
from dcost.search.objectives import (
    COST_PER_INPUT_TOKEN,
    COST_PER_TOKEN,
    LIFETIME_COST,
    Objective,
)
from dcost.search.optimize import optimize
from dcost.search.pareto import Frontier, pareto
from dcost.search.problem import Limits, Problem
from dcost.search.sensitivity import Sensitivity, sensitivity
from dcost.search.solution import Solution
from dcost.serving.moe import expert_fraction
from dcost.serving.roofline import (
    PrefillReport,
    Report,
    balance_batch,
    bottleneck,
    critical_context,
    decode,
    prefill,
)
from dcost.smooth import smax
from dcost.specs import Design, Hardware, Model, SpecError, Workload, stack
from dcost.training.lifetime import (
    Deployment,
    LifetimeInputs,
    lecture_estimate,
    lifetime_cost,
    lifetime_optimum,
    lifetime_optimum_dollars,
    scale_model,
)
from dcost.training.runs import TrainingSetup, bubble_fraction, training_run
from dcost.training.scaling import (
    ScalingFit,
    compute_optimal,
    effective_params,
    loss,
    routed_fit,
    scaling_fit,
    scaling_fit_names,
)

__all__ = [
    "Design",
    "Hardware",
    "Model",
    "Workload",
    "Report",
    "PrefillReport",
    "SpecError",
    "PresetError",
    "decode",
    "prefill",
    "balance_batch",
    "critical_context",
    "bottleneck",
    "expert_fraction",
    "smax",
    "stack",
    "hardware",
    "model",
    "hardware_names",
    "model_names",
    "pricing",
    "fit_prices",
    "predict_prices",
    "identifiability",
    "price_sheets",
]
__all__ += [
    "ScalingFit",
    "loss",
    "compute_optimal",
    "effective_params",
    "routed_fit",
    "scaling_fit",
    "scaling_fit_names",
    "training_run",
    "TrainingSetup",
    "bubble_fraction",
    "lifetime_optimum",
    "lifetime_cost",
    "lifetime_optimum_dollars",
    "scale_model",
    "lecture_estimate",
    "LifetimeInputs",
    "Deployment",
    "LifetimeReport",
]
__all__ += [
    "Problem",
    "Limits",
    "Objective",
    "COST_PER_TOKEN",
    "COST_PER_INPUT_TOKEN",
    "LIFETIME_COST",
    "Solution",
    "Frontier",
    "Sensitivity",
    "optimize",
    "grid_search",
    "pareto",
    "sensitivity",
]
__version__ = "0.1.0"
