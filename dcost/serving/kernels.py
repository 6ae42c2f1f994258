"""One kernel's time from its compute and memory times: the roofline, exact or smooth.

Shared by every step's kernels (``dcost.serving.roofline.stage_time``) and the speculative
draft's passes (``dcost.serving.speculative.draft_time``).
"""

from __future__ import annotations

import jax.numpy as jnp

from dcost.smooth import smax

__all__ = ["kernel_time"]


def kernel_time(t_flops, t_memory, hardware, smoothness=0.0):
    """One kernel's time from its compute and memory times (s).

    .. math:: t = \\mathrm{smax}_r(t_F, t_W) = \\big(t_F^{1/r} + t_W^{1/r}\\big)^{r}

    with ``r = Hardware.kernel_roofline_smoothness``: the roofline's maximum at ``r = 0`` (the
    pure model: streaming hides all the arithmetic, or the arithmetic all the streaming), the
    sum at ``r = 1`` (no overlap), and between them a kernel near its ridge point that is
    neither purely compute- nor memory-bound, as measured GEMMs and attention kernels are (a
    smooth roofline; the p-norm form of ``dcost.smooth.smax``). The optimizer's own
    ``smoothness`` applies where it is the larger. Off (None), the exact maximum at
    ``smoothness = 0``.

    >>> import dcost
    >>> h = dcost.Hardware(1e15, 1e12, 1e11, 1e11, 1e10, 8, 3.6, kernel_roofline_smoothness=0.5)
    >>> float(kernel_time(3.0, 4.0, h))  # the Euclidean norm
    5.0
    >>> float(kernel_time(3.0, 4.0, dcost.Hardware(1e15, 1e12, 1e11, 1e11, 1e10, 8, 3.6)))
    4.0
    """
    if hardware.kernel_roofline_smoothness is None:
        return smax([t_flops, t_memory], smoothness)
    r = jnp.maximum(hardware.kernel_roofline_smoothness, smoothness)
    return smax([t_flops, t_memory], r)
