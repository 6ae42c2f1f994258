"""The attention layout of a stage: tensor-parallel or data-parallel attention, and what each costs.

A stage's ``G`` chips form ``A`` data-parallel attention groups (``Design.attention_dp``); inside
each group attention is tensor parallel of degree ``t = G/A``. ``A = 1`` is Megatron-style tensor
parallelism over the whole stage (Shoeybi et al., 2019); ``A = G`` is data-parallel attention,
each chip running attention for its own ``B/G`` sequences with the attention weights whole, as
large expert-parallel MoE deployments do (DeepSeek-V3 Technical Report, section 3.4: attention
TP4 with sequence parallelism and DP8 for prefill, TP4 DP80 for decode; SGLang's DP attention).

What the layout changes (``docs/serving_v2.md``, "Attention layout"):

- attention weights per chip: ``N_attn/t`` (each of the ``A`` groups holds a whole copy);
- KV cache per chip: ``B T b_kv / G * rep`` with ``rep = t/min(t, h_kv)``: tensor parallelism
  beyond the KV heads replicates them (MLA has one latent "head": ``rep = t``);
- collectives per layer (``attention_comm_time``).

``Design.attention_dp = None`` keeps v1's convention: MoE models data parallel (``A = G``) without
the cost of whole attention weights, dense models tensor parallel (``A = 1``).
"""

from __future__ import annotations

import jax.numpy as jnp

from dcost.serving.collectives import group_all_reduce
from dcost.smooth import safe_div

__all__ = ["attention_groups", "kv_replication", "attention_comm_time", "attention_weight_params"]


def attention_groups(design, model):
    """``(A, held)``: data-parallel attention groups of a stage, and whether ``A`` copies of the
    attention weights are held (1.0) or v1's convention of none (0.0, ``attention_dp = None``).

    >>> import dcost
    >>> m = dcost.Model(2, 8, 100.0, 10.0, 8, 2, 64.0, 2.0)  # an MoE model
    >>> [float(x) for x in attention_groups(dcost.Design(batch=1, chips=4), m)]
    [4.0, 0.0]
    >>> [float(x) for x in attention_groups(dcost.Design(1, 4, attention_dp=2), m)]
    [2.0, 1.0]
    """
    if design.attention_dp is None:
        a = jnp.where(model.n_experts > 0, design.chips, jnp.ones_like(design.chips))
        return a, jnp.zeros_like(a)
    return design.attention_dp, jnp.ones_like(design.attention_dp)


def attention_weight_params(model, groups, held):
    """Parameters stored (and read) over a stage's ``G`` chips: ``N_attn`` held ``A`` times.

    .. math:: N_{stage} = N - N_{attn} + A\\,N_{attn} \\quad (\\text{held} = 1)

    returned as the extra ``(A - 1) N_attn`` (parameters) to add to any count containing
    ``N_attn`` once. 0 under v1's convention or with ``params_attention = 0``.

    >>> import dcost
    >>> m = dcost.Model(2, 8, 100.0, 0.0, 0, 0, 64.0, 2.0, params_attention=40.0)
    >>> float(attention_weight_params(m, 4.0, 1.0))  # 3 extra copies of 40
    120.0
    """
    return held * (groups - 1.0) * model.params_attention


def kv_replication(tp_degree, kv_heads):
    """Copies of the KV cache tensor-parallel attention of degree ``t`` holds.

    .. math:: \\text{rep} = t / \\min(t, h_{kv}) = \\max(1, t/h_{kv})

    Each of the ``t`` ranks holds ``h_kv/t`` KV heads while ``t <= h_kv``; beyond, heads are
    replicated (a rank needs the whole head of its query heads). ``h_kv = 0`` (unknown) gives
    1 (v1).

    A hard maximum in the smooth model too, on purpose (the one new min/max without a p-norm
    form): its kink sits at ``t = h_kv``, where common layouts sit (tensor parallelism of degree 8
    over 8 KV heads), and a p-norm would charge ``2**s`` copies of the KV cache there and perturb
    every relaxed optimum at that bound. A kink, like v1's ``min(G, S)``: the gradient is 0 below
    and ``1/h_kv`` above.

    >>> float(kv_replication(16.0, 8.0))  # Llama-3-70B (8 KV heads) over 16 chips
    2.0
    >>> float(kv_replication(8.0, 1.0))  # MLA: one latent, whole on every rank
    8.0
    >>> float(kv_replication(4.0, 8.0))
    1.0
    """
    rep = jnp.maximum(1.0, safe_div(tp_degree, kv_heads, default=1.0))
    return jnp.where(kv_heads > 0, rep, 1.0)


def attention_comm_time(tokens, layers_per_stage, chips, groups, hardware, model, passes=1.0):
    """Tensor-parallel and layout collectives of one stage step (seconds).

    With ``V = tokens d b_a`` (all passes together), ``t = G/A`` and ``AR_n(x)`` the ring
    all-reduce of ``x`` bytes over ``n`` chips (``collectives.all_reduce``; a reduce-scatter
    followed by an all-gather costs the same), per layer:

    - **dense model**: attention output reduced inside the group and the group's tokens gathered
      over the stage for the tensor-parallel MLP, then scattered back: reduce-scatter and
      all-gather over ``t`` of ``V/A`` plus all-gather and reduce-scatter over ``G`` of ``V``:

      .. math:: t_{layer} = AR_t(V/A) + AR_G(V)

      At ``A = 1`` that is v1's two all-reduces of ``V`` over ``G``; at ``A = G``, one.
    - **MoE model**: the group's attention output is reduce-scattered over its ``t`` ranks
      (each then dispatches its share to the experts) and all-gathered after the combine:
      ``t_layer = AR_t(V/A)``; 0 for data-parallel attention (``t = 1``, v1's convention).

    Each group of ``n`` chips uses scale-up links when ``n <= S``; a group spanning several
    scale-up domains runs over scale-out (v1) or, with ``Hardware.hierarchical_collectives``,
    inside each domain over scale-up and across domains over scale-out
    (``collectives.group_all_reduce``). Latencies are paid once per pass:
    ``t = L/P * t_layer`` with ``alpha -> passes*alpha``.

    >>> import dcost
    >>> h = dcost.Hardware(1e15, 1e12, 1e11, 1e11, 1e10, 8, 3.6)
    >>> m = dcost.Model(10, 1000, 1e9, 0.0, 0, 0, 1e5, 2.0)
    >>> # dense, A = 1, G = 8: 10 layers * 2 all-reduces * (2*7/8) * 2e6 B / 1e11 B/s = 0.7 ms
    >>> round(float(attention_comm_time(1e3, 10.0, 8.0, 1.0, h, m)) * 1e3, 6)
    0.7
    """
    g, a = chips, groups
    t = g / a
    volume = tokens * model.d_model * model.act_bytes
    group = group_all_reduce(volume / a, t, hardware, passes)
    stage = group_all_reduce(volume, g, hardware, passes)
    per_layer = jnp.where(model.n_experts > 0, group, group + stage)
    return layers_per_stage * per_layer
