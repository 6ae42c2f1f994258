"""dcost: smooth, differentiable cost models of LLM serving and training in JAX.

The public face; everything else is a private detail of the modules named for their concern.

The searches (``optimize``, ``grid_search``, ``pareto``, ``sensitivity``, ``Problem``...) and
``pricing`` are imported on first use (PEP 562), so that ``import dcost`` does not pay for Optax
and the search programs when only the model is wanted; ``dcost.optimize`` and ``from dcost import
optimize`` work as before. Importing dcost also turns on JAX's persistent compilation cache under
the user's cache directory (``dcost._cache``; ``DCOST_CACHE=0`` turns it off).
"""

import gc as _gc
import importlib as _importlib

# Importing JAX, equinox and the presets allocates hundreds of thousands of objects that live as
# long as the process; the cyclic collector scanning them while they are made costs about a sixth
# of the import (0.1 s of 0.65 s on 2 cores), so it pauses until the imports are done.
_gc_was_enabled = _gc.isenabled()
_gc.disable()
try:
    from dcost import _xla

    _xla.guard_ynn()  # before JAX starts its backend: XLA reads XLA_FLAGS once
    from dcost import _cache
    from dcost.presets import PresetError, hardware, hardware_names, model, model_names
    from dcost.serving.mixed import kv_transfer_time, mixed_step
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
    from dcost.serving.speculative import accepted_tokens
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

    _cache.setup()
finally:
    if _gc_was_enabled:
        _gc.enable()

# public name -> the module that defines it, imported when the name is first asked for
_LAZY = {
    "fit_prices": "dcost.pricing",
    "identifiability": "dcost.pricing",
    "predict_prices": "dcost.pricing",
    "price_sheets": "dcost.pricing",
    "grid_search": "dcost.search.grid",
    "LifetimeReport": "dcost.search.lifetime_objective",
    "optimize": "dcost.search.optimize",
    "Frontier": "dcost.search.pareto",
    "pareto": "dcost.search.pareto",
    "Problem": "dcost.search.problem",
    "Limits": "dcost.search.problem",
    "Objective": "dcost.search.objectives",
    "COST_PER_TOKEN": "dcost.search.objectives",
    "COST_PER_INPUT_TOKEN": "dcost.search.objectives",
    "LIFETIME_COST": "dcost.search.objectives",
    "Sensitivity": "dcost.search.sensitivity",
    "sensitivity": "dcost.search.sensitivity",
    "Solution": "dcost.search.solution",
    "TCO": "dcost.search.objectives",
    "energy": "dcost.serving.power",
    "Energy": "dcost.serving.power",
    "PowerFit": "dcost.serving.power",
    "power_cap": "dcost.serving.power",
    "Ownership": "dcost.pricing.ownership",
    "ownership": "dcost.pricing.ownership",
    "owned": "dcost.pricing.ownership",
    "tco_per_token": "dcost.pricing.ownership",
    "breakeven": "dcost.pricing.ownership",
    "Traffic": "dcost.planning.traffic",
    "traffic": "dcost.planning.traffic",
    "plan": "dcost.planning.planner",
    "Plan": "dcost.planning.planner",
    "PlanBatch": "dcost.planning.planner",
    "Scenario": "dcost.planning.sweep",
    "plan_sweep": "dcost.planning.sweep",
    "simulate": "dcost.planning.fleet",
    "plan_energy": "dcost.planning.energy",
    "FleetEnergy": "dcost.planning.energy",
    "explore": "dcost.web.notebook",
    "Server": "dcost.planning.server",
    "Load": "dcost.planning.server",
    "Bursty": "dcost.planning.server",
    "check_launch": "dcost.planning.launch",
    "Engine": "dcost.engines",
    "Scheduler": "dcost.engines",
    "engine": "dcost.engines",
}
_LAZY_MODULES = {
    "pricing": "dcost.pricing",
    "search": "dcost.search",
    "planning": "dcost.planning",
    "measurements": "dcost.measurements",
}


def __getattr__(name):
    if name == "engines":
        # the subpackage, callable: dcost.engines() lists what ships (dcost.engines.engines)
        return _importlib.import_module("dcost.engines")
    if name in _LAZY:
        value = getattr(_importlib.import_module(_LAZY[name]), name)
    elif name in _LAZY_MODULES:
        value = _importlib.import_module(_LAZY_MODULES[name])
    else:
        raise AttributeError(f"module 'dcost' has no attribute {name!r}")
    globals()[name] = value  # once imported, a plain attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(_LAZY) | set(_LAZY_MODULES))


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
    "mixed_step",
    "kv_transfer_time",
    "accepted_tokens",
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
__all__ += ["Traffic", "traffic", "planning", "plan", "Plan", "PlanBatch", "simulate"]
__all__ += ["Scenario", "plan_sweep", "plan_energy", "FleetEnergy"]
__all__ += ["TCO", "energy", "Energy", "PowerFit", "power_cap"]
__all__ += ["Ownership", "ownership", "owned", "tco_per_token", "breakeven"]
__all__ += ["Engine", "Scheduler", "engine", "engines", "Server", "Load", "Bursty", "check_launch"]
__all__ += ["explore"]
__version__ = "0.1.0"
