"""Collectives in the alpha-beta form: ``t = n_msgs * alpha + bytes / bandwidth``.

Each function returns the time of one collective on one chip (seconds) over ``n`` chips joined by
links of ``bandwidth`` bytes/s per chip one way and ``latency`` seconds per message. The message
counts are those of the classical algorithms (Thakur, Rabenseifner & Gropp, "Optimization of
Collective Communication Operations in MPICH", IJHPCA 19(1), 2005, section 4; Patarasuk & Yuan,
"Bandwidth optimal all-reduce algorithms for clusters of workstations", JPDC 69(2), 2009):

- ring all-reduce of ``V`` bytes: ``2(n-1)`` steps, each moving ``V/n``:
  ``2(n-1) alpha + 2(n-1)/n * V/bw``;
- ring all-gather or reduce-scatter (``V`` the full, gathered size): ``(n-1) alpha + (n-1)/n V/bw``;
- pairwise all-to-all where a chip sends ``V_sent`` bytes in total to ``m`` peers:
  ``m alpha + V_sent/bw``.

``n`` may be fractional in the relaxation; at ``n = 1`` every collective is free. ``bandwidth`` is
the achieved one (``Hardware.scaleup_achieved`` / ``scaleout_achieved``).
"""

from __future__ import annotations

import math

__all__ = [
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "all_to_all_rounds",
    "group_link",
    "group_all_reduce",
]


def all_reduce(volume, n, bandwidth, latency=0.0, tree=0.0):
    """Ring all-reduce of ``volume`` bytes over ``n`` chips (s).

    .. math:: t = 2(n-1)\\,\\alpha + \\frac{2(n-1)}{n}\\,\\frac{V}{bw}

    With ``tree = 1`` the message count is that of the log-depth algorithms, ``2 log2(n)``
    (recursive halving and doubling, which MPICH uses for all-reduce, Thakur et al. section 4.4,
    with the ring's bandwidth term; NCCL's tree and NVLS algorithms for small messages); between
    0 and 1 a mix (``Hardware.tree_collectives``; ``n`` need not be a power of 2 in the
    relaxation):

    .. math:: t = 2[(1-\\tau)(n-1) + \\tau\\log_2 n]\\,\\alpha + \\frac{2(n-1)}{n}\\,\\frac{V}{bw}

    >>> round(all_reduce(8e6, 8.0, 1e11, 1e-6), 9)  # 2*7 us + 2*(7/8)*8e6/1e11 s = 14 + 140 us
    0.000154
    >>> round(all_reduce(8e6, 8.0, 1e11, 1e-6, tree=1.0), 9)  # 2*3 us + 140 us
    0.000146
    """
    steps = (1.0 - tree) * (n - 1.0) + tree * _log2(n)
    return 2.0 * steps * latency + 2.0 * (n - 1.0) / n * volume / bandwidth


def _log2(n):
    """``log2(n)`` for ``n >= 1`` (0 at ``n = 1``, clipped below), a Python float for a Python
    number and a JAX array otherwise."""
    if isinstance(n, (int, float)):
        return math.log2(max(float(n), 1.0))
    import jax.numpy as jnp

    return jnp.log2(jnp.maximum(n, 1.0))


def all_to_all_rounds(peers, tree=0.0):
    """Latency rounds of an all-to-all in which a chip exchanges a message with each of
    ``peers`` others.

    .. math:: m = (1-\\tau)\\,p + \\tau \\log_2(p + 1)

    ``tree = 0``: one message after another, ``p`` rounds (v2). ``tree = 1``: the log-depth
    algorithm's ``ceil(log2 n)`` rounds for ``n = p + 1`` chips (Bruck et al., "Efficient
    algorithms for all-to-all communications in multiport message-passing systems", IEEE TPDS
    8(11), 1997), relaxed to ``log2 n``: a chip has all its messages in flight at once and waits
    for a round trip per doubling, as switch-based all-to-alls do (NCCL's all-to-all and
    DeepEP post every peer's send before waiting). ``Hardware.tree_collectives`` sets ``tau`` for
    all-reduces (``all_reduce``) and all-to-alls alike.

    >>> all_to_all_rounds(7.0), all_to_all_rounds(7.0, tree=1.0), all_to_all_rounds(0.0, 1.0)
    (7.0, 3.0, 0.0)
    """
    return (1.0 - tree) * peers + tree * _log2(peers + 1.0)


def all_gather(volume, n, bandwidth, latency=0.0):
    """Ring all-gather of ``volume`` bytes in total (each chip ends with all of it) (s).

    .. math:: t = (n-1)\\,\\alpha + \\frac{n-1}{n}\\,\\frac{V}{bw}

    >>> round(all_gather(8e6, 8.0, 1e11, 1e-6), 9)  # 7 us + (7/8)*80 us
    7.7e-05
    """
    return (n - 1.0) * latency + (n - 1.0) / n * volume / bandwidth


def reduce_scatter(volume, n, bandwidth, latency=0.0):
    """Ring reduce-scatter of ``volume`` bytes (each chip ends with ``V/n`` reduced) (s).

    The same cost as ``all_gather``: ``(n-1) alpha + (n-1)/n V/bw``.

    >>> reduce_scatter(8e6, 8.0, 1e11)
    7e-05
    """
    return all_gather(volume, n, bandwidth, latency)


def all_to_all(sent, peers, bandwidth, latency=0.0):
    """Pairwise all-to-all: a chip sends ``sent`` bytes in total to ``peers`` other chips (s).

    .. math:: t = m\\,\\alpha + V_{sent}/bw

    >>> all_to_all(1e6, 7.0, 1e11, 1e-6)  # 7 us + 10 us
    1.7e-05
    """
    return peers * latency + sent / bandwidth


def group_link(n, hardware):
    """``(bandwidth, latency)`` of a group of ``n`` chips: the achieved scale-up link and its
    latency when the group fits one scale-up domain (``n <= S``), else scale-out (v1's rule).

    >>> import dcost
    >>> h = dcost.Hardware(1e15, 1e12, 1e11, 4e11, 5e10, 8, 3.6)
    >>> [round(float(group_link(n, h)[0]) / 1e9, 3) for n in (8.0, 16.0)]  # GB/s
    [400.0, 50.0]
    """
    import jax.numpy as jnp

    fits = n <= hardware.scaleup_size
    bw = jnp.where(fits, hardware.scaleup_achieved, hardware.scaleout_achieved)
    alpha = jnp.where(fits, hardware.get("scaleup_latency"), hardware.get("scaleout_latency"))
    return bw, alpha


def group_all_reduce(volume, n, hardware, passes=1.0):
    """All-reduce of ``volume`` bytes over a group of ``n`` chips on the chip's own links (s).

    Inside one scale-up domain (``n <= S``) the all-reduce of ``all_reduce`` on the scale-up
    link. A group spanning ``D = n/S`` domains runs, with ``h = Hardware.hierarchical_collectives``,
    a mix of v1's form, every step over scale-out (``group_link``; ``h = 0``), and the
    hierarchical one (``h = 1``), as NCCL runs across nodes: a reduce-scatter and an all-gather
    inside each domain over its ``S`` chips (one scale-up all-reduce's traffic), and between them
    an all-reduce of each chip's ``V/S`` shard with its peers in the other ``D - 1`` domains over
    scale-out (the message counts of ``all_reduce`` for each part; Thakur et al. 2005, section 4;
    Jeaugey, "Massively Scale Your Deep Learning Training with NCCL 2.4", NVIDIA blog 2019, for
    the two-level trees):

    .. math:: t = (1 - h)\\,AR_n(V; O', \\alpha_{out})
              + h\\,[AR_S(V; U', \\alpha_{up}) + AR_D(V/S; O', \\alpha_{out})]

    The hierarchical form agrees with the scale-up one at ``n = S`` (its second part is 0 for one
    domain) and is never slower than v1's. ``passes`` multiplies the latencies (one collective
    per pass).

    >>> import dcost
    >>> h = dcost.Hardware(1e15, 1e12, 8e10, 4e11, 5e10, 8, 3.6, scaleup_latency=1e-6,
    ...                    scaleout_latency=1e-5, tree_collectives=1.0,
    ...                    hierarchical_collectives=1.0)
    >>> round(float(group_all_reduce(8e6, 8.0, h)) * 1e6, 3)  # 2*3*1 us + 2*(7/8)*8e6/4e11
    41.0
    >>> # 16 chips, 2 domains: 41 us inside + 2*1*10 us + 2*(1/2)*1e6/5e10 s across
    >>> round(float(group_all_reduce(8e6, 16.0, h)) * 1e6, 3)
    81.0
    """
    import jax.numpy as jnp

    s = hardware.scaleup_size
    tree = hardware.get("tree_collectives")
    up, alpha_up = hardware.scaleup_achieved, passes * hardware.get("scaleup_latency")
    inside = all_reduce(volume, jnp.minimum(n, s), up, alpha_up, tree)
    domains = jnp.maximum(n / s, 1.0)
    across = all_reduce(
        volume / s,
        domains,
        hardware.scaleout_achieved,
        passes * hardware.get("scaleout_latency"),
        tree,
    )
    bw, alpha = group_link(n, hardware)
    flat = all_reduce(volume, n, bw, passes * alpha, tree)
    h = hardware.get("hierarchical_collectives")
    return jnp.where(n <= s, inside, (1.0 - h) * flat + h * (inside + across))
