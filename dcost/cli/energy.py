"""Energy and ownership on the command line: ``dcost eval``'s energy lines and ``--power-cap``,
and the ``--objective tco`` inputs of ``dcost optimize`` / ``dcost grid``.

People type watts, $ per kWh and $ per chip; everything else is SI (``dcost.serving.power``,
``dcost.pricing.ownership``).
"""

from __future__ import annotations

from dcost.cli.common import parse_number
from dcost.specs import SpecError

__all__ = [
    "add_power_cap_argument",
    "apply_power_cap",
    "energy_fields",
    "energy_lines",
    "add_ownership_arguments",
    "ownership_from_args",
    "solution_energy",
]


def add_power_cap_argument(p) -> None:
    """``--power-cap W``: run the chip under a power cap (``dcost.power_cap``)."""
    p.add_argument(
        "--power-cap",
        type=parse_number,
        default=None,
        metavar="W",
        help="power cap per chip in W, between the chip's idle and board power: a step that would "
        "draw more runs at a lower clock, so fewer FLOP/s (f ~ cube root of the dynamic power "
        "left); default: none",
    )


def apply_power_cap(args, hardware, design, model, workload, engine=None):
    """``hardware`` under ``--power-cap`` for the step ``args.phase`` of ``design`` (unchanged
    without it, or where the step draws less than the cap): ``dcost.power_cap``."""
    cap = getattr(args, "power_cap", None)
    if cap is None:
        return hardware
    from dcost.serving.power import power_cap

    return power_cap(hardware, cap, design, model, workload, step=args.phase, engine=engine)


def energy_fields(design, hardware, model, workload, phase: str, engine=None) -> dict | None:
    """``dcost.energy``'s fields as floats (SI: W, J, tokens/s per MW), or None for a chip with no
    power fields (a preset always has them); ``engine`` times the step (``dcost.energy``)."""
    if hardware.idle_power is None or hardware.max_power is None:
        return None
    from dcost.serving.power import energy

    e = energy(design, hardware, model, workload, step=phase, engine=engine)
    return {k: float(getattr(e, k)) for k in e.__dataclass_fields__}


def energy_lines(fields: dict | None, per: str, width: int = 23) -> list[str]:
    """The text lines of ``dcost eval`` for ``energy_fields`` (none when it is None)."""
    if fields is None:
        return []
    return [
        f"{'power per chip:':{width}s}{fields['power_per_chip']:.0f} W "
        f"(activity {fields['activity']:.2f}; replica {fields['power_per_replica'] / 1e3:.3g} kW)",
        f"{'energy:':{width}s}{fields['energy_per_token']:.4g} J per {per} token "
        f"({fields['tokens_per_mw'] / 1e6:.3g} M {per} tokens/s per MW of chips)",
    ]


def add_ownership_arguments(p) -> None:
    """The inputs of ``--objective tco`` beyond the preset's assumed ones
    (``dcost.ownership(hardware)``)."""
    p.add_argument(
        "--electricity-price",
        type=parse_number,
        default=None,
        metavar="USD_PER_KWH",
        help="tco: electricity price, $ per kWh (default: the assumed 0.08)",
    )
    p.add_argument(
        "--pue", type=parse_number, default=None, help="tco: facility PUE (default: assumed 1.3)"
    )
    p.add_argument(
        "--purchase-price",
        type=parse_number,
        default=None,
        metavar="USD",
        help="tco: $ per chip (default: the chip's assumed price, dcost/presets/ownership.toml)",
    )
    p.add_argument(
        "--years", type=parse_number, default=None, help="tco: amortization years (default 4)"
    )


def ownership_from_args(args):
    """``dcost.ownership(args.hardware, ...)`` with the given overrides (for ``tco``)."""
    from dcost.pricing.ownership import ownership

    names = {
        "electricity_price": "electricity_price_per_kwh",
        "pue": "pue",
        "purchase_price": "purchase_price",
        "years": "years",
    }
    overrides = {
        field: getattr(args, arg)
        for arg, field in names.items()
        if getattr(args, arg, None) is not None
    }
    try:
        return ownership(args.hardware, **overrides)
    except KeyError as err:
        raise SpecError(str(err).strip("'\"")) from None


def solution_energy(problem, sol) -> dict | None:
    """``energy_fields`` of a search's chosen design (decode, or prefill for a prefill objective);
    None when it is not feasible or the chip has no power fields."""
    if not bool(sol.feasible):
        return None
    phase = "prefill" if problem.objective.prefill else "decode"
    return energy_fields(sol.design, problem.hardware, problem.model, problem.workload, phase)
