"""Serving model v2 (docs/serving_v2.md): every new term against hand calculations, finite
differences and published numbers; and, with every new term off, v1's numbers on every preset pair.

Hand calculations use the round-number specs of ``tests/test_roofline.py``: a chip of 1 PFLOP/s and
1 TB/s, scale-up 100 GB/s, scale-out 10 GB/s, 8 chips per domain, $3.6 per chip-hour; a dense model
of 1e9 parameters in bf16 (L = 10, d = 1000) and an MoE model of N_dense = 1e9, n_e = 1e8, E = 64,
k = 4 in fp8. Expected numbers are worked out in the comments, never taken from the code.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import v1_reference as v1

import dcost
from dcost import Design, Workload

# --------------------------------------------------------------------------------------- specs


def chip(**kw):
    base = dict(
        flops=1e15,
        hbm_bandwidth=1e12,
        hbm_capacity=1e11,
        scaleup_bandwidth=1e11,
        scaleout_bandwidth=1e10,
        scaleup_size=8,
        price_per_hour=3.6,
    )
    return dcost.Hardware(**{**base, **kw})


def dense(**kw):
    base = dict(
        n_layers=10,
        d_model=1000,
        params_dense=1e9,
        params_per_expert=0.0,
        n_experts=0,
        experts_active=0,
        kv_bytes_per_token=1e5,
        bytes_per_param=2.0,
    )
    return dcost.Model(**{**base, **kw})


def moe_model(**kw):
    base = dict(
        n_layers=10,
        d_model=1000,
        params_dense=1e9,
        params_per_expert=1e8,
        n_experts=64,
        experts_active=4,
        kv_bytes_per_token=1e5,
        bytes_per_param=1.0,
    )
    return dcost.Model(**{**base, **kw})


V1_MODEL = (
    "n_layers",
    "d_model",
    "params_dense",
    "params_per_expert",
    "n_experts",
    "experts_active",
    "kv_bytes_per_token",
    "bytes_per_param",
    "attn_flops_per_context_token",
    "act_bytes",
    "n_moe_layers",
)
V1_HARDWARE = (
    "flops",
    "hbm_bandwidth",
    "hbm_capacity",
    "scaleup_bandwidth",
    "scaleout_bandwidth",
    "scaleup_size",
    "price_per_hour",
    "flops_efficiency",
    "bandwidth_efficiency",
)


def v1_only(spec, names):
    """The spec rebuilt from its v1 fields only: every v2 field back at its default (None)."""
    return type(spec)(**{n: getattr(spec, n) for n in names})


def stack(specs):
    return jax.tree.map(lambda *xs: jnp.stack(xs), *specs)


# ------------------------------------------------------------- v2 with its terms off is v1

DESIGNS = [  # (batch, chips, stages): one chip; one domain; spilling; pipelined; a rack
    (1.0, 1.0, 1.0),
    (64.0, 8.0, 1.0),
    (256.0, 16.0, 2.0),
    (8.0, 4.0, 4.0),
    (512.0, 72.0, 1.0),
]


@pytest.mark.x64
@pytest.mark.parametrize("smoothness", [0.0, 0.05])
def test_v2_with_new_terms_off_is_v1_on_every_preset_pair(smoothness):
    """All 11 report fields of decode and prefill, every hardware x model preset, five designs,
    with the presets' v2 model fields (kv_heads, params_attention, ...) set back to None."""
    hws = [v1_only(dcost.hardware(n), V1_HARDWARE) for n in dcost.hardware_names()]
    models = [v1_only(dcost.model(n), V1_MODEL) for n in dcost.model_names()]
    assert len(hws) >= 15 and len(models) >= 14
    pairs = list(itertools.product(range(len(hws)), range(len(models)), range(len(DESIGNS))))
    hw = stack([hws[i] for i, _, _ in pairs])
    m = stack([models[j] for _, j, _ in pairs])
    b, g, p = (jnp.asarray([DESIGNS[k][c] for _, _, k in pairs]) for c in range(3))
    design = Design(batch=b, chips=g, stages=p)
    n = len(pairs)
    workload = Workload(jnp.full(n, 2048.0), prompt=jnp.full(n, 1000.0), output=jnp.zeros(n))

    def both(fn_new, fn_old):
        new = jax.jit(jax.vmap(lambda d, h, mm, w: fn_new(d, h, mm, w, smoothness)))(
            design, hw, m, workload
        )
        old = jax.jit(jax.vmap(lambda d, h, mm, w: fn_old(d, h, mm, w, smoothness)))(
            design, hw, m, workload
        )
        return new, old

    for kind, fn_new, fn_old in (
        ("decode", dcost.decode, v1.decode),
        ("prefill", dcost.prefill, v1.prefill),
    ):
        new, old = both(fn_new, fn_old)
        for field in v1.FIELDS:
            got, want = np.asarray(getattr(new, field)), np.asarray(old[field])
            np.testing.assert_allclose(got, want, rtol=1e-12, atol=0, err_msg=f"{kind} {field}")
        assert np.all(np.asarray(new.t_overhead) == 0.0)
        assert np.all(np.asarray(new.t_draft) == 0.0)
        assert np.all(np.asarray(new.tokens_per_step) == 1.0)


def test_reference_is_not_trivially_equal():
    """The comparison can fail: a v2 term switched on moves the numbers away from v1."""
    h, m, w = chip(step_overhead=1e-3), dense(), Workload(100)
    d = Design(batch=8)
    assert float(dcost.decode(d, h, m, w).tpot) != pytest.approx(
        float(v1.decode(d, h, m, w)["tpot"])
    )
