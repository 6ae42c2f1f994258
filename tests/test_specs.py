"""Specs: bad input is refused naming the field and value; good input becomes float leaves.

Presets' published numbers are checked in tests/test_presets.py; here only the lookup's errors and
that overrides go through the same validation.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import dcost

HW = dict(
    flops=1e15,
    hbm_bandwidth=1e12,
    hbm_capacity=1e11,
    scaleup_bandwidth=1e11,
    scaleout_bandwidth=1e10,
    scaleup_size=8,
    price_per_hour=2.0,
)
DENSE = dict(
    n_layers=10,
    d_model=1000,
    params_dense=1e9,
    params_per_expert=0.0,
    n_experts=0,
    experts_active=0,
    kv_bytes_per_token=1e5,
    bytes_per_param=2.0,
)
MOE = dict(DENSE, params_per_expert=1e8, n_experts=8, experts_active=2)


def hw(**kw):
    return dcost.Hardware(**{**HW, **kw})


def dense(**kw):
    return dcost.Model(**{**DENSE, **kw})


def moe(**kw):
    return dcost.Model(**{**MOE, **kw})


NAN, INF = math.nan, math.inf

# (builder, keyword, bad value, field named in the message, value shown in the message)
BAD = [
    (hw, "flops", -1.0, "Hardware.flops", "-1.0"),
    (hw, "flops", 0.0, "Hardware.flops", "0.0"),
    (hw, "flops", NAN, "Hardware.flops", "nan"),
    (hw, "flops", INF, "Hardware.flops", "inf"),
    (hw, "hbm_bandwidth", 0.0, "Hardware.hbm_bandwidth", "0.0"),
    (hw, "hbm_bandwidth", NAN, "Hardware.hbm_bandwidth", "nan"),
    (hw, "hbm_capacity", -8e10, "Hardware.hbm_capacity", "-80000000000.0"),
    (hw, "scaleup_bandwidth", 0.0, "Hardware.scaleup_bandwidth", "0.0"),
    (hw, "scaleout_bandwidth", -5.0, "Hardware.scaleout_bandwidth", "-5.0"),
    (hw, "scaleup_size", 0.5, "Hardware.scaleup_size", "0.5"),
    (hw, "price_per_hour", -2.0, "Hardware.price_per_hour", "-2.0"),
    (hw, "flops_efficiency", 1.5, "Hardware.flops_efficiency", "1.5"),
    (hw, "bandwidth_efficiency", 0.0, "Hardware.bandwidth_efficiency", "0.0"),
    (dense, "n_layers", 0, "Model.n_layers", "0.0"),
    (dense, "d_model", NAN, "Model.d_model", "nan"),
    (dense, "params_dense", -1e9, "Model.params_dense", "-1000000000.0"),
    (dense, "kv_bytes_per_token", -1.0, "Model.kv_bytes_per_token", "-1.0"),
    (dense, "bytes_per_param", 0.0, "Model.bytes_per_param", "0.0"),
    (dense, "attn_flops_per_context_token", NAN, "Model.attn_flops_per_context_token", "nan"),
    (dense, "act_bytes", -2.0, "Model.act_bytes", "-2.0"),
    (dense, "n_moe_layers", 11, "Model.n_moe_layers", "11.0"),  # more than n_layers = 10
    (moe, "experts_active", 9, "Model.experts_active", "9.0"),  # more than n_experts = 8
    (moe, "experts_active", 0, "Model.experts_active", "0"),
    (moe, "params_per_expert", 0.0, "Model.params_per_expert", "0"),
    (moe, "n_experts", -8, "Model.n_experts", "-8.0"),
    (dense, "experts_active", 1, "experts_active", "0"),  # a dense model has no active experts
    (dcost.Workload, "context", -1.0, "Workload.context", "-1.0"),
    (dcost.Workload, "prompt", NAN, "Workload.prompt", "nan"),
    (dcost.Workload, "output", -3.0, "Workload.output", "-3.0"),
    (dcost.Design, "batch", 0.5, "Design.batch", "0.5"),
    (dcost.Design, "batch", 0, "Design.batch", "0.0"),
    (dcost.Design, "batch", NAN, "Design.batch", "nan"),
    (dcost.Design, "chips", 0, "Design.chips", "0.0"),
    (dcost.Design, "stages", -1, "Design.stages", "-1.0"),
    (dcost.Design, "experts", 0.0, "Design.experts", "0.0"),
    (dcost.Design, "overtrain", 0.0, "Design.overtrain", "0.0"),
]


def _build(builder, key, value):
    if builder is dcost.Workload:
        return dcost.Workload(**{"context": 100.0, key: value})
    if builder is dcost.Design:
        return dcost.Design(**{"batch": 4.0, key: value})
    return builder(**{key: value})


@pytest.mark.parametrize(
    ("builder", "key", "value", "field", "shown"), BAD, ids=[f"{b[3]}={b[2]}" for b in BAD]
)
def test_bad_field_raises_value_error_naming_field_and_value(builder, key, value, field, shown):
    with pytest.raises(ValueError) as info:
        _build(builder, key, value)
    assert isinstance(info.value, dcost.SpecError)
    message = str(info.value)
    assert field in message
    assert shown in message


def test_bad_element_of_an_array_field_is_named():
    with pytest.raises(ValueError, match=r"Hardware\.flops = -3\.0"):
        hw(flops=np.array([1e15, -3.0, 2e15]))


def test_design_experts_below_experts_active_raises_at_use():
    model = moe(experts_active=4)
    with pytest.raises(ValueError, match=r"Design\.experts = 2\.0.*experts_active \(4\.0\)"):
        dcost.decode(dcost.Design(batch=8, experts=2), hw(), model, dcost.Workload(100))


def test_design_experts_on_a_dense_model_raises():
    """Otherwise the model becomes E > 0 with k = 0, and its tensor-parallel traffic vanishes."""
    with pytest.raises(ValueError, match=r"Design\.experts = 8\.0 is not allowed for a dense"):
        dcost.decode(dcost.Design(batch=8, chips=8, experts=8), hw(), dense(), dcost.Workload(100))


@pytest.mark.parametrize("lookup", [dcost.hardware, dcost.model])
def test_unknown_preset_lists_the_known_ones(lookup):
    known = {dcost.hardware: dcost.hardware_names(), dcost.model: dcost.model_names()}[lookup]
    with pytest.raises(ValueError) as info:
        lookup("no-such-chip-9000")
    message = str(info.value)
    assert "'no-such-chip-9000'" in message
    assert known and all(name in message for name in known)


def test_preset_overrides_are_validated():
    with pytest.raises(ValueError, match=r"Hardware\.flops = 0\.0"):
        dcost.hardware("h100-sxm", flops=0.0)
    with pytest.raises(ValueError, match=r"Model\.bytes_per_param = -1\.0"):
        dcost.model("llama-3-8b", bytes_per_param=-1.0)


def test_traced_fields_are_not_checked_inside_jit():
    """Under jit the values are unknown; construction must trace instead of raising."""
    batch = jax.jit(lambda b: dcost.Design(batch=b).batch)(0.5)
    assert float(batch) == 0.5


def test_good_values_at_the_edges_are_accepted():
    dcost.Hardware(1.0, 1.0, 1.0, 1.0, 1.0, 1, 0.0, flops_efficiency=1.0, bandwidth_efficiency=1e-9)
    dcost.Model(1, 1, 1.0, 0.0, 0, 0, 0.0, 1.0)  # dense, no KV cache
    dcost.Model(1, 1, 1.0, 1.0, 4, 4, 0.0, 1.0)  # MoE with k = E
    dcost.Workload(0.0)
    dcost.Design(batch=1, chips=1, stages=1, experts=1, overtrain=1e-3)


def test_hand_counts_of_parameters():
    """N_total = N_dense + E*n_e, N_active = N_dense + k*n_e, by hand for round numbers."""
    m = moe(params_dense=1e9, params_per_expert=1e8, n_experts=64, experts_active=4)
    assert float(m.params_total) == pytest.approx(7.4e9)
    assert float(m.params_active) == pytest.approx(1.4e9)
    assert float(m.sparsity) == pytest.approx(7.4 / 1.4)
    d = dense()
    assert float(d.params_total) == float(d.params_active) == pytest.approx(1e9)
    assert float(d.sparsity) == 1.0


def test_moe_layers_default():
    assert float(dense().moe_layers) == 0.0
    assert float(moe().moe_layers) == 10.0
    assert float(moe(n_moe_layers=7).moe_layers) == 7.0


def test_workload_defaults():
    w = dcost.Workload(4096)
    assert float(w.prompt) == 4096.0 and float(w.output) == 0.0
    w = dcost.Workload(1000, prompt=800, output=400)
    assert (float(w.context), float(w.prompt), float(w.output)) == (1000.0, 800.0, 400.0)


@pytest.mark.parametrize(
    "spec",
    [
        hw(),
        dense(),
        moe(n_moe_layers=5),
        dcost.Workload(10),
        dcost.Design(batch=64, chips=8),
        dcost.Design(batch=64.0, chips=8.0, stages=2, experts=16, overtrain=3),
    ],
    ids=["hardware", "dense", "moe", "workload", "design-int", "design-float"],
)
def test_every_leaf_is_a_strong_float(spec):
    """Floats whether given ints or floats, never weak-typed, so jit sees one signature."""
    leaves = jax.tree_util.tree_leaves(spec)
    set_fields = [f.name for f in dataclasses.fields(spec) if getattr(spec, f.name) is not None]
    assert len(leaves) == len(set_fields)
    for leaf in leaves:
        assert jnp.issubdtype(leaf.dtype, jnp.floating)
        assert not leaf.aval.weak_type


def test_numbers_of_every_form_become_strong_floats_or_named_errors():
    """The converter's paths: a Python int or float, a weak-typed JAX array (made strong), a
    strong one (kept), a NumPy scalar; an int past float32 but within float64 (refused as out of
    range), one past any float (refused, named), never an OverflowError."""
    for value in (3, 3.0, jnp.asarray(3.0), jnp.float32(3.0), np.float64(3.0), np.int64(3)):
        leaf = dcost.Design(batch=value, chips=1.0).batch
        assert float(leaf) == 3.0 and leaf.dtype == jnp.float32 and not leaf.aval.weak_type
    strong = jnp.asarray(5.0, dtype=jnp.float32)
    assert dcost.Design(batch=strong, chips=1.0).batch is strong
    assert float(hw(flops=10**30).flops) == pytest.approx(1e30, rel=1e-7)
    with pytest.raises(dcost.SpecError, match=r"Hardware.flops = 1e\+39 .*largest float32"):
        hw(flops=10**39)
    with pytest.raises(dcost.SpecError, match="Hardware.flops = 1000.* beyond any float"):
        hw(flops=10**400)


@pytest.mark.x64
def test_float64_when_enabled():
    assert dcost.Design(batch=3).batch.dtype == jnp.float64
    assert hw().flops.dtype == jnp.float64


def test_specs_are_frozen():
    d = dcost.Design(batch=4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        d.batch = 8.0


def test_prefill_refuses_an_empty_prompt():
    h, m = dcost.hardware("h100-sxm"), dcost.model("llama-3-8b")
    with pytest.raises(ValueError, match=r"Workload\.prompt = 0\.0"):
        dcost.prefill(dcost.Design(batch=1), h, m, dcost.Workload(0))
