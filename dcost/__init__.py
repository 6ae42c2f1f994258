"""dcost: smooth, differentiable cost models of LLM serving and training in JAX.

The public face; everything else is a private detail of the modules named for their concern.
"""

from dcost.grid import grid_search
from dcost.moe import expert_fraction
from dcost.optimize import optimize
from dcost.pareto import Frontier, pareto
from dcost.presets import PresetError, hardware, hardware_names, model, model_names
from dcost.problem import Problem
from dcost.roofline import (
    Report,
    balance_batch,
    bottleneck,
    critical_context,
    decode,
    prefill,
)
from dcost.sensitivity import Sensitivity, sensitivity
from dcost.smooth import smax
from dcost.solution import Solution
from dcost.specs import Design, Hardware, Model, SpecError, Workload

__all__ = [
    "Design", "Hardware", "Model", "Workload", "Report", "SpecError", "PresetError",
    "decode", "prefill", "balance_batch", "critical_context", "bottleneck", "expert_fraction",
    "smax", "hardware", "model", "hardware_names", "model_names",
    "Problem", "Solution", "Frontier", "Sensitivity", "optimize", "grid_search", "pareto",
    "sensitivity",
]
__version__ = "0.1.0"
