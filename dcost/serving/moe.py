"""Mixture-of-Experts pieces: experts touched, load imbalance, and the all-to-all they cost.

References: the expected number of distinct experts hit by ``B`` tokens routed uniformly to ``k``
of ``E`` experts is the classical occupancy result ``E*(1 - (1 - k/E)**B)``; expert-parallel
all-to-all as in GShard (Lepikhin et al., 2020, section 2) and DeepSeek-V3 (2024, section 3.4);
the expected maximum load of balls in bins from Raab & Steger, "Balls into Bins: A Simple and
Tight Analysis" (RANDOM 1998), theorem 1; de-duplicated, node-limited dispatch from the DeepSeek-V3
Technical Report (arXiv 2412.19437), sections 2.1.2 and 3.2.2, and DeepEP's normal kernels;
expert tensor parallelism (each expert's matrices split over chips, as a dense MLP is) as in
Megatron-LM's MoE layer (Shoeybi et al., 2019, section 3, applied per expert) and TensorRT-LLM's
and SGLang's MoE tensor parallelism.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from dcost.serving.collectives import all_to_all, all_to_all_rounds, group_all_reduce
from dcost.smooth import safe_div, safe_sqrt, smax, smin
from dcost.specs import MULTINOMIAL, SpecError, _concrete, _float, check

__all__ = [
    "expert_fraction",
    "tokens_per_expert",
    "expected_max_load",
    "expert_imbalance",
    "profiled_routing",
    "domains_reached",
    "all_to_all_time",
    "expert_tensor_parallel_time",
]


def expert_fraction(batch, n_experts, experts_active):
    """Expected fraction of routed experts a batch of ``B`` tokens touches.

    .. math:: \\phi(B) = 1 - (1 - k/E)^B

    computed as ``-expm1(B*log1p(-k/E))`` for precision at small ``k/E``; 0 for a dense model
    (``E = 0``) and 1 when ``k = E``.

    Args:
      batch: tokens in the step ``B`` (>= 0; may be fractional in the relaxation).
      n_experts: routed experts ``E`` (>= 0).
      experts_active: experts per token ``k`` (``0 <= k <= E``).

    Concrete arguments are checked (SpecError naming the argument); traced ones are not.

    >>> round(float(expert_fraction(1.0, 256.0, 8.0)), 6)  # one token touches k/E
    0.03125
    >>> float(expert_fraction(1.0, 0.0, 0.0))
    0.0
    """
    check("expert_fraction", "batch", batch)
    check("expert_fraction", "n_experts", n_experts)
    check("expert_fraction", "experts_active", experts_active)
    e, k = _concrete(n_experts), _concrete(experts_active)
    if e is not None and k is not None and np.any(np.broadcast_arrays(k, e)[0] > e):
        raise SpecError(
            f"expert_fraction.experts_active = {float(np.max(k))!r} is not allowed: it must be "
            f"<= n_experts ({float(np.min(e))!r})"
        )
    return _expert_fraction(*(_float(x) for x in (batch, n_experts, experts_active)))


def _expert_fraction(batch, n_experts, experts_active):
    """``expert_fraction`` without the checks (its callers' specs were checked)."""
    ratio = safe_div(experts_active, n_experts)  # k/E, 0 for dense
    below = ratio < 1
    logq = jnp.log1p(-jnp.where(below, ratio, 0.0))
    phi = jnp.where(below, -jnp.expm1(batch * logq), 1.0)
    return jnp.where(n_experts > 0, phi, 0.0)


def tokens_per_expert(tokens, n_experts, experts_active):
    """Mean tokens through one touched routed expert: the matmul size of an expert (tokens).

    .. math:: n_{exp} = \\frac{\\text{tokens}\\cdot k}{E\\,\\phi(\\text{tokens})}

    ``tokens*k`` expert inputs shared by the ``E*phi`` experts the batch touches; 1 token at
    batch 1 (one token per touched expert), ``tokens*k/E`` once every expert is touched. 0 for a
    dense model.

    >>> round(float(tokens_per_expert(1.0, 256.0, 8.0)), 5)
    1.0
    >>> round(float(tokens_per_expert(1e6, 256.0, 8.0)))  # 1e6 * 8 / 256
    31250
    """
    touched = n_experts * _expert_fraction(tokens, n_experts, experts_active)
    return safe_div(tokens * experts_active, touched)


def expected_max_load(tokens, chips, experts_active, smoothness=0.0):
    """Expected load of the busiest of ``G`` chips over the mean, under multinomial routing.

    ``m = tokens*k`` expert inputs land on ``G`` chips uniformly (each chip holds ``E/G``
    experts), so a chip's load is Binomial(``m``, ``1/G``): mean ``m/G``, variance
    ``m (1/G)(1 - 1/G)``. The expected maximum of ``G`` such loads is
    ``m/G + sqrt(2 ln G * m/G (1 - 1/G))`` to leading order for ``m >> G ln G`` (Raab & Steger
    1998, theorem 1), so

    .. math:: \\text{imb} = \\min\\Big(1 + \\sqrt{\\frac{2 G \\ln G\\,(1 - 1/G)}{m}},\\ G\\Big)

    capped at ``G`` (all the load on one chip; a smooth min when ``smoothness > 0``). 1 at
    ``G = 1``. An approximation at small ``m``; correlations between one token's ``k`` distinct
    experts are neglected.

    Args:
      tokens: tokens routed in one pass.
      chips: expert-parallel chips ``G``.
      experts_active: experts per token ``k``.
      smoothness: 0 exact, > 0 smooth cap.

    >>> round(float(expected_max_load(1024.0, 8.0, 8.0)), 4)  # 1 + sqrt(16*2.0794*0.875/8192)
    1.0596
    """
    m = tokens * experts_active
    g = jnp.asarray(chips, dtype=jnp.result_type(m, chips, float))
    log_g = jnp.log(jnp.maximum(g, 1.0))
    excess = safe_sqrt(safe_div(2.0 * g * log_g * (1.0 - 1.0 / g), m))
    return smin([1.0 + excess, jnp.maximum(g, 1.0)], smoothness)


def expert_imbalance(workload, tokens, chips, model, redundant_experts=0.0, smoothness=0.0):
    """Load of the busiest chip's routed experts over the mean, after redundant experts.

    ``workload.expert_imbalance`` when it is a number >= 1 (None or 1.0: balanced, v1), or
    ``expected_max_load`` when it is 0 (given as ``"multinomial"``). ``R`` redundant expert
    replicas per layer (EPLB) spread ``R/G`` extra slots on each chip, to which the balancer
    moves load off the hottest chips; we take the excess over 1 to shrink as

    .. math:: \\text{imb}_R = 1 + (\\text{imb} - 1)/(1 + R/G)

    an approximation (not derived from a placement algorithm): one redundant expert per chip
    (DeepSeek-V3's prefill, report section 3.4) halves the excess. Set ``expert_imbalance`` to a
    measured figure when you have one. 1 for a dense model.

    >>> import dcost
    >>> w = dcost.Workload(0, expert_imbalance=1.5)
    >>> m = dcost.Model(4, 8, 100.0, 10.0, 8, 2, 64.0, 2.0)
    >>> float(expert_imbalance(w, 64.0, 4.0, m, redundant_experts=4.0))  # 1 + 0.5/(1 + 1)
    1.25
    """
    given = workload.get("expert_imbalance")
    if workload.expert_imbalance is None:
        base = given
    else:
        multinomial = expected_max_load(tokens, chips, model.experts_active, smoothness)
        base = jnp.where(given > 0, given, multinomial)
    imb = 1.0 + (base - 1.0) / (1.0 + redundant_experts / chips)
    return jnp.where(model.n_experts > 0, imb, 1.0)


def profiled_routing(profiled: bool, model) -> float:
    """The ``Workload.expert_imbalance`` a step is timed at: ``MULTINOMIAL`` (the expected
    maximum load under multinomial routing, ``expected_max_load``) for a mixture of experts on
    a profiled chip, 1.0 (balanced) for pure physics or a dense model.

    A profile's fixed costs (a family's or an engine's) were fitted to measured runs timed at
    the expected-maximum load (``dcost.validation.cases``), so a step on that profile is timed
    the same way wherever it is asked (the validation's cases, ``dcost.simulate``, ``dcost.plan``);
    pure physics stays balanced, a bound (the least a step can take).

    >>> import dcost
    >>> m = dcost.model("mixtral-8x7b")
    >>> profiled_routing(True, m) == MULTINOMIAL, profiled_routing(False, m)
    (True, 1.0)
    >>> profiled_routing(True, dcost.model("llama-3-70b"))
    1.0
    """
    moe = bool(np.any(np.asarray(model.n_experts) > 0))
    return MULTINOMIAL if (profiled and moe) else 1.0


def domains_reached(experts_active, domains, max_domains=0.0, smoothness=0.0):
    """Expected distinct scale-up domains a token's ``k`` experts fall in (de-duplicated dispatch).

    With experts spread evenly over ``D`` domains and ``k`` of them chosen uniformly, a domain
    is missed by all ``k`` with probability ``(1 - 1/D)**k`` (choices with replacement: an upper
    bound on the distinct count within ``k/D``):

    .. math:: n_{dom} = \\min\\big(D\\,(1 - (1 - 1/D)^k),\\ M\\big)

    capped at ``M = max_domains`` (node-limited routing; 0 = no cap) by a smooth min when
    ``smoothness > 0``. DeepSeek-V3 (``k = 8``) at ``D = 8`` nodes: 5.25 domains uncapped, 4
    with ``M = 4`` (its report's node limit) against 8 copies sent without de-duplication.

    >>> round(float(domains_reached(8.0, 8.0)), 4)  # 8 * (1 - 0.343609)
    5.2511
    >>> float(domains_reached(8.0, 8.0, 4.0))
    4.0
    """
    several = domains > 1.0
    d = jnp.where(several, domains, 2.0)  # one domain: log1p(-1) is -inf (double `where`)
    reached = jnp.where(several, d * -jnp.expm1(experts_active * jnp.log1p(-1.0 / d)), 1.0)
    cap = max_domains > 0
    ok = cap & (reached > 0)  # k = 0 (dense) reaches none: keep 1/0 out of the smooth min
    capped = smin([jnp.where(ok, reached, 1.0), jnp.where(ok, max_domains, 1.0)], smoothness)
    return jnp.where(ok, capped, reached)


def all_to_all_time(
    tokens,
    moe_layers_per_stage,
    chips,
    hardware,
    model,
    smoothness=0.0,
    *,
    dedup=0.0,
    imbalance=1.0,
    passes=1.0,
):
    """Expert-parallel all-to-all time of one stage step (seconds), dispatch and combine.

    **v1 (``dedup = 0``)**: each token goes to ``k`` experts and back, ``2*k*d*b_a`` bytes per
    MoE layer; a destination is on another chip with probability ``(G-1)/G``, and the traffic
    spreads over the ``G`` chips; ``inside`` is the share of a chip's peers in its domain:

    .. math::
        \\text{bytes}_{chip} = \\text{tokens}\\cdot L_{moe}/P\\cdot 2kdb_a\\cdot (G-1)/G^2,
        \\quad \\text{inside} = \\frac{\\min(G,S) - 1}{G - 1}

        \\text{up} = \\text{bytes}\\cdot\\text{inside}, \\quad
        \\text{out} = \\text{bytes}(1 - \\text{inside})

    **De-duplicated (``dedup = 1``)**, DeepSeek-V3 section 3.2.2 / DeepEP: a token crosses
    scale-out once per remote destination domain (to the chip of the same index there), and is
    forwarded over scale-up to its experts' chips. With ``S' = min(G, S)`` chips per domain,
    ``D = G/S'`` domains and ``n_dom`` from ``domains_reached`` (capped at ``M``), a token's
    remote domains are ``n_dom (D-1)/D``, and every one of its ``k`` copies whose expert is not
    on the chip it enters its domain by takes one scale-up hop, ``k (S'-1)/S'``:

    .. math::
        \\text{out} = \\text{tokens}\\cdot L_{moe}/P\\cdot 2db_a\\cdot n_{dom}\\frac{D-1}{D}/G,
        \\quad
        \\text{up} = \\text{tokens}\\cdot L_{moe}/P\\cdot 2db_a\\cdot k\\frac{S'-1}{S'}/G

    Between 0 and 1, ``dedup`` mixes the two linearly. The busiest chip receives ``imbalance``
    times the mean, so both byte counts are multiplied by it. Alpha-beta (``collectives``): per
    all-to-all a chip messages ``S'-1`` scale-up peers and ``G - S'`` (v1) or ``D - 1``
    (de-duplicated) scale-out peers; two all-to-alls per MoE layer per pass:

    .. math::
        t = \\max\\big(2\\tfrac{L_{moe}}{P} n_p m_{up}\\alpha_{up} + \\text{up}/U',\\
                      2\\tfrac{L_{moe}}{P} n_p m_{out}\\alpha_{out} + \\text{out}/O'\\big)

    (both link kinds at once; smooth max when ``smoothness > 0``), ``U', O'`` the achieved
    bandwidths, ``n_p`` the passes (prefill chunks). 0 when ``G = 1``. The latency rounds ``m``
    of an all-to-all to ``p`` peers are ``p`` (one message after another, v2) or, with
    ``Hardware.tree_collectives = tau``, ``(1-tau) p + tau log2(p + 1)`` (``all_to_all_rounds``).
    With the defaults (``dedup = 0``, ``imbalance = 1``, latencies 0, efficiencies 1) this is
    v1's all-to-all.

    Args:
      tokens: tokens of the stage step, all passes together.
      moe_layers_per_stage: ``L_moe/P``.
      chips: expert-parallel chips ``G``.
      hardware, model: the specs.
      smoothness: 0 exact, > 0 smooth.
      dedup: ``Design.dispatch_dedup`` in [0, 1].
      imbalance: busiest chip's load over the mean (>= 1).
      passes: forward passes the tokens are split into (each pays the latencies).
    """
    g = chips
    s_eff = jnp.minimum(g, hardware.scaleup_size)
    act = 2.0 * model.d_model * model.act_bytes  # dispatch + combine of one token copy, one layer
    per_token = model.experts_active * act
    bytes_chip = tokens * moe_layers_per_stage * per_token * safe_div(g - 1.0, g * g)
    inside = safe_div(s_eff - 1.0, g - 1.0, default=1.0)
    up_v1 = bytes_chip * inside
    out_v1 = bytes_chip * (1.0 - inside)
    domains = g / s_eff
    reached = domains_reached(
        model.experts_active, domains, model.max_domains_per_token, smoothness
    )
    remote = reached * (domains - 1.0) / domains
    layer_tokens = tokens * moe_layers_per_stage * act / g
    up_dd = layer_tokens * model.experts_active * (s_eff - 1.0) / s_eff
    out_dd = layer_tokens * remote
    up = imbalance * ((1.0 - dedup) * up_v1 + dedup * up_dd)
    out = imbalance * ((1.0 - dedup) * out_v1 + dedup * out_dd)
    calls = 2.0 * moe_layers_per_stage * passes  # all-to-alls of the stage step
    peers_out = (1.0 - dedup) * (g - s_eff) + dedup * (domains - 1.0)
    return smax(
        [
            all_to_all(
                up,
                calls * all_to_all_rounds(s_eff - 1.0, hardware.get("tree_collectives")),
                hardware.scaleup_achieved,
                hardware.get("scaleup_latency"),
            ),
            all_to_all(
                out,
                calls * all_to_all_rounds(peers_out, hardware.get("tree_collectives")),
                hardware.scaleout_achieved,
                hardware.get("scaleout_latency"),
            ),
        ],
        smoothness,
    )


def expert_tensor_parallel_time(
    tokens,
    moe_layers_per_stage,
    chips,
    groups,
    hardware,
    model,
    *,
    imbalance=1.0,
    passes=1.0,
):
    """Collectives of expert tensor parallelism in one stage step (seconds).

    A stage's ``G`` chips form ``e`` expert-parallel groups (``Design.expert_parallel``); each
    group holds ``E/e`` experts with every expert's matrices split over its ``t_e = G/e`` chips
    (column-parallel up-projection, row-parallel down-projection). The tokens a group serves are
    gathered over its ``t_e`` chips before the expert matmuls and the partial outputs
    reduce-scattered after: one all-reduce's traffic (``collectives.all_reduce``, ``AR``) per MoE
    layer. A token's ``k`` experts fall in ``n_grp`` distinct groups (``domains_reached`` with
    ``D = e``, 1 at ``e = 1``), so a group serves ``tokens n_grp / e`` tokens, ``imbalance``
    times that on the busiest:

    .. math::
        t = \\frac{L_{moe}}{P}\\,AR_{t_e}\\Big(\\text{tokens}\\,d\\,b_a\\,
            \\frac{n_{grp}}{e}\\,\\text{imb}\\Big)

    over scale-up links when ``t_e <= S``, else over scale-out or, with
    ``Hardware.hierarchical_collectives``, inside each scale-up domain and across them over
    scale-out (``collectives.group_all_reduce``), latencies paid once per pass. At
    ``e = 1`` this is a dense tensor-parallel MLP's all-reduce of ``V = tokens d b_a`` over the
    stage; at ``e = G`` (every expert whole on one chip, v1) it is 0 and the all-to-all
    (``all_to_all_time`` over ``e`` groups) carries the traffic.

    Args:
      tokens: tokens of the stage step, all passes together.
      moe_layers_per_stage: ``L_moe/P``.
      chips: chips per stage ``G``.
      groups: expert-parallel groups ``e`` in ``[1, G]``.
      hardware, model: the specs.
      imbalance: busiest group's load over the mean (>= 1).
      passes: forward passes the tokens are split into (each pays the latencies).

    >>> import dcost
    >>> h = dcost.Hardware(1e15, 1e12, 1e11, 1e11, 1e10, 8, 3.6)
    >>> m = dcost.Model(10, 1000, 1e9, 1e8, 8, 2, 1e5, 2.0)
    >>> # e = 1 over G = 8: 10 layers * (2*7/8) * 1e3 tokens * 1000 * 2 B / 1e11 B/s = 0.35 ms
    >>> round(float(expert_tensor_parallel_time(1e3, 10.0, 8.0, 1.0, h, m)) * 1e3, 6)
    0.35
    >>> float(expert_tensor_parallel_time(1e3, 10.0, 8.0, 8.0, h, m))  # expert parallel: none
    0.0
    """
    t_e = chips / groups
    reached = domains_reached(model.experts_active, groups)
    volume = tokens * model.d_model * model.act_bytes * reached / groups * imbalance
    return moe_layers_per_stage * group_all_reduce(volume, t_e, hardware, passes)
