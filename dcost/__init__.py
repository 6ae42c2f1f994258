"""dcost: smooth, differentiable cost models of LLM serving and training in JAX.

The public face; everything else is a private detail of the modules named for their concern.
"""

from dcost import pricing
from dcost.presets import PresetError, hardware, hardware_names, model, model_names
from dcost.pricing import fit_prices, identifiability, predict_prices, price_sheets
from dcost.search.grid import grid_search
from dcost.search.lifetime_objective import LifetimeInputs, LifetimeReport
from dcost.search.optimize import optimize
from dcost.search.pareto import Frontier, pareto
from dcost.search.problem import Problem
from dcost.search.sensitivity import Sensitivity, sensitivity
from dcost.search.solution import Solution
from dcost.serving.mixed import kv_transfer_time, mixed_step
from dcost.serving.moe import expert_fraction
from dcost.serving.roofline import (
    Report,
    balance_batch,
    bottleneck,
    critical_context,
    decode,
    prefill,
)
from dcost.serving.speculative import accepted_tokens
from dcost.smooth import smax
from dcost.specs import Design, Hardware, Model, SpecError, Workload
from dcost.training.lifetime import (
    lecture_estimate,
    lifetime_cost,
    lifetime_optimum,
    lifetime_optimum_dollars,
    scale_model,
)
from dcost.training.runs import bubble_fraction, training_run
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
    "SpecError",
    "PresetError",
    "decode",
    "prefill",
    "mixed_step",
    "kv_transfer_time",
    "accepted_tokens",
    "balance_batch",
    "critical_context",
    "bottleneck",
    "expert_fraction",
    "smax",
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
    "bubble_fraction",
    "lifetime_optimum",
    "lifetime_cost",
    "lifetime_optimum_dollars",
    "scale_model",
    "lecture_estimate",
    "LifetimeInputs",
    "LifetimeReport",
]
__all__ += [
    "Problem",
    "Solution",
    "Frontier",
    "Sensitivity",
    "optimize",
    "grid_search",
    "pareto",
    "sensitivity",
]
__version__ = "0.1.0"
