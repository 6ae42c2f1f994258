"""A frozen copy of serving model v1 (DESIGN.md section 2), the reference v2 must reproduce.

Written from the v1 formulas and kept apart from ``dcost.serving`` on purpose: with every v2 field
at its default, ``dcost.decode`` and ``dcost.prefill`` must return these numbers to float
precision (``tests/test_serving_v2.py``). Do not edit it to follow the package: it is the
reference. It reads only the v1 fields of the specs.
"""

import jax.numpy as jnp

FIELDS = (
    "t_compute",
    "t_weights",
    "t_kv",
    "t_comm",
    "t_hop",
    "t_stage",
    "tpot",
    "tokens_per_s",
    "cost_per_token",
    "memory_per_chip",
    "mfu",
)


def _div(num, den, default=0.0):
    nz = den != 0
    return jnp.where(nz, num / jnp.where(nz, den, 1.0), default)


def _smax(xs, s):
    xs = jnp.broadcast_arrays(*[jnp.asarray(x) for x in xs])
    hard = jnp.max(jnp.stack(xs), axis=0)
    if s == 0:
        return hard
    return jnp.sum(jnp.stack(xs) ** (1.0 / s), axis=0) ** s


def expert_fraction(batch, e, k):
    ratio = _div(k, e)
    below = ratio < 1
    phi = jnp.where(below, -jnp.expm1(batch * jnp.log1p(-jnp.where(below, ratio, 0.0))), 1.0)
    return jnp.where(e > 0, phi, 0.0)


def _comm(tokens, p, g, hw, m, s):
    # MoE: expert-parallel all-to-all, both link kinds at once
    per_token = 2.0 * m.experts_active * m.d_model * m.act_bytes
    moe_layers = m.n_moe_layers if m.n_moe_layers is not None else m.n_layers
    bytes_chip = tokens * (moe_layers / p) * per_token * _div(g - 1.0, g * g)
    inside = _div(jnp.minimum(g, hw.scaleup_size) - 1.0, g - 1.0, default=1.0)
    a2a = _smax(
        [
            bytes_chip * inside / hw.scaleup_bandwidth,
            bytes_chip * (1.0 - inside) / hw.scaleout_bandwidth,
        ],
        s,
    )
    # dense: two ring all-reduces per layer
    link = jnp.where(g <= hw.scaleup_size, hw.scaleup_bandwidth, hw.scaleout_bandwidth)
    tp = (m.n_layers / p) * 2.0 * (2.0 * (g - 1.0) / g) * tokens * m.d_model * m.act_bytes / link
    return jnp.where(m.n_experts > 0, a2a, tp)


def _step(tokens, flops_per_token, weight_params, kv_bytes, design, hw, m, resident, s):
    p, g = design.stages, design.chips
    chips = p * g
    f = hw.flops * hw.flops_efficiency
    bw = hw.hbm_bandwidth * hw.bandwidth_efficiency
    t_compute = tokens * flops_per_token / (chips * f)
    t_weights = m.bytes_per_param * weight_params / (chips * bw)
    t_kv = kv_bytes / (chips * bw)
    t_comm = _comm(tokens, p, g, hw, m, s)
    t_stage = _smax([t_compute, t_weights + t_kv, t_comm], s)
    fits = g * p <= hw.scaleup_size
    hop_link = jnp.where(fits, hw.scaleup_bandwidth, hw.scaleout_bandwidth)
    t_hop = tokens * m.d_model * m.act_bytes / (g * hop_link)
    tpot = p * t_stage + (p - 1.0) * t_hop
    tokens_per_s = p * tokens / tpot
    cost = chips * hw.price_per_hour / 3600.0 / tokens_per_s
    n_total = m.params_dense + m.n_experts * m.params_per_expert
    n_active = m.params_dense + m.experts_active * m.params_per_expert
    memory = m.bytes_per_param * n_total / chips + resident * m.kv_bytes_per_token / g
    mfu = 2.0 * n_active * tokens_per_s / (chips * hw.flops)
    return dict(
        t_compute=t_compute, t_weights=t_weights, t_kv=t_kv, t_comm=t_comm, t_hop=t_hop,
        t_stage=t_stage, tpot=tpot, tokens_per_s=tokens_per_s, cost_per_token=cost,
        memory_per_chip=memory, mfu=mfu,
    )  # fmt: skip


def decode(design, hw, m, workload, s=0.0):
    """v1 decode: a dict of the 11 report fields."""
    b, t = design.batch, workload.context
    phi = expert_fraction(b, m.n_experts, m.experts_active)
    weights = m.params_dense + m.n_experts * m.params_per_expert * phi
    n_active = m.params_dense + m.experts_active * m.params_per_expert
    flops = 2.0 * n_active + m.attn_flops_per_context_token * t
    return _step(b, flops, weights, b * t * m.kv_bytes_per_token, design, hw, m, b * t, s)


def prefill(design, hw, m, workload, s=0.0):
    """v1 prefill: a dict of the 11 report fields (``tpot`` is the time of the pass)."""
    b, t_in = design.batch, workload.prompt
    tokens = b * t_in
    n_total = m.params_dense + m.n_experts * m.params_per_expert
    n_active = m.params_dense + m.experts_active * m.params_per_expert
    flops = 2.0 * n_active + m.attn_flops_per_context_token * t_in / 2.0
    kv = tokens * m.kv_bytes_per_token
    return _step(tokens, flops, n_total, kv, design, hw, m, tokens, s)
