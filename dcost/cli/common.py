"""What every subcommand shares: numbers as people type them, tables, the argument types.

Numbers are typed and printed in units people read (ms, GB, $ per million tokens); ``--json``
prints the API's field names in SI units. A bad argument prints one line and exits with code 2.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping

import numpy as np

from dcost import presets

__all__ = [
    "parse_number",
    "parse_duration",
    "format_table",
    "fmt_time",
    "positive",
    "at_least_one",
    "non_negative",
    "whole",
    "Parser",
    "add_precision_argument",
    "hardware_and_model",
    "add_engine_argument",
    "selected_engine",
    "json_text",
]

_DURATION_UNITS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "min": 60.0, "h": 3600.0}


def parse_number(text: str) -> float:
    """A number as people type it: ``70e9``, ``4096``, ``1.5k``, ``2M``, ``3B``, ``15T``.

    >>> parse_number("70e9"), parse_number("1.5k"), parse_number("15T")
    (70000000000.0, 1500.0, 15000000000000.0)
    """
    t = text.strip()
    scale = {"k": 1e3, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
    mult = 1.0
    if t and t[-1] in scale:
        mult, t = scale[t[-1]], t[:-1]
    try:
        value = float(t) * mult
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not np.isfinite(value):
        raise argparse.ArgumentTypeError(f"not a finite number: {text!r}")
    return value


def parse_duration(text: str) -> float:
    """A duration in seconds from ``50ms``, ``0.05s``, ``200us`` or a bare number of seconds.

    >>> parse_duration("50ms"), parse_duration("0.05"), parse_duration("2s")
    (0.05, 0.05, 2.0)
    """
    t = text.strip().lower()
    for unit in sorted(_DURATION_UNITS, key=len, reverse=True):
        if t.endswith(unit):
            number, scale = t[: -len(unit)], _DURATION_UNITS[unit]
            break
    else:
        number, scale = t, 1.0
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a duration: {text!r} (use e.g. 50ms, 0.05s or 0.05)"
        ) from None
    if not np.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"a duration must be > 0: {text!r}")
    return round(value, 12)


def _null_reason(value: float) -> str:
    if math.isnan(value):
        return "undefined for this answer (the computation gives no number here)"
    return f"unbounded ({'+' if value > 0 else '-'}infinity): no finite value exists here"


def _plain(value):
    """A JSON-ready Python value: numpy scalars and arrays become floats, ints, bools, lists."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, np.ndarray):
        return _plain(value.tolist()) if value.ndim else _plain(value[()])
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)):
        return float(value)
    if hasattr(value, "__array__"):  # a JAX array
        return _plain(np.asarray(value))
    return value


def _strict(value, reasons: Mapping[str, str], path: tuple[str, ...] = ()):
    """``value`` with every NaN or infinity made ``null``; beside each such entry of a mapping
    (or a list holding one), a ``<key>_reason`` string: the reason given for its dotted path,
    for the nearest enclosing key, or for its own key name; else a generic one."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            bad = [x for x in (v if isinstance(v, list) else [v]) if _non_finite(x)]
            here = (*path, str(k))
            out[k] = _strict(v, reasons, here)
            if bad and f"{k}_reason" not in value:
                keys = [".".join(here[:i]) for i in range(len(here), 0, -1)] + [str(k)]
                why = next((reasons[c] for c in keys if c in reasons), None)
                out[f"{k}_reason"] = why or _null_reason(bad[0])
        return out
    if isinstance(value, list):
        return [_strict(v, reasons, path) for v in value]
    return None if _non_finite(value) else value


def _non_finite(x) -> bool:
    return isinstance(x, float) and not math.isfinite(x)


def json_text(value, reasons: Mapping[str, str] | None = None) -> str:
    """The one way every subcommand writes ``--json``: text that a strict parser reads.

    A number that does not exist (NaN, infinity) is written ``null`` with a ``<key>_reason``
    string beside it: ``reasons[key]`` where the caller knows why, else a generic one. Numpy and
    JAX scalars and arrays become plain numbers and lists.

    Args:
      value: a tree of mappings, lists, tuples, numbers, strings, booleans and None.
      reasons: why a value can be missing, by dotted path (``"stats.smoothness"``), by an
        enclosing key (``"multipliers"`` covers each multiplier) or by key name.

    Returns:
      Indented JSON (``json.dumps(..., allow_nan=False)`` holds).

    >>> import json
    >>> d = json.loads(json_text({"tpot": float("nan"), "x": [1.0, float("inf")]}, {"tpot": "-"}))
    >>> d["tpot"], d["tpot_reason"], d["x"]
    (None, '-', [1.0, None])
    """
    return json.dumps(_strict(_plain(value), reasons or {}), indent=2, allow_nan=False)


def format_table(rows: list[list[str]], header: list[str]) -> str:
    """Left-aligned text table with a rule under the header."""
    cols = list(zip(header, *rows, strict=False)) if rows else [(h,) for h in header]
    widths = [max(len(str(c)) for c in col) for col in cols]

    def line(r):
        return "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=False)).rstrip()

    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def fmt_time(s: float) -> str:
    if s == 0:
        return "0"
    if s < 1e-3:
        return f"{s * 1e6:.3g} us"
    if s < 1:
        return f"{s * 1e3:.4g} ms"
    return f"{s:.4g} s"


def add_precision_argument(parser) -> None:
    """``--precision``: the chip's FLOP/s at this precision (auto: the model's own)."""
    parser.add_argument(
        "--precision",
        choices=("auto", *presets.PRECISIONS),
        default="auto",
        help="matmul precision for the chip's FLOP/s (auto: the model's serving "
        "precision from its preset, e.g. fp8 for deepseek-v3, bf16 for llama-3-70b; bf16 on a "
        "chip without that rate)",
    )
    parser.add_argument(
        "--calibrated",
        action="store_true",
        help="the chip's calibrated profile (achieved rates and overheads fitted to published "
        "measurements; see `dcost validate`) instead of the pure roofline",
    )


def add_engine_argument(parser) -> None:
    """``--engine NAME[-VERSION]``: the serving engine's measured profile on the chip."""
    parser.add_argument(
        "--engine",
        metavar="NAME[-VERSION]",
        help="a serving engine's profile on the chip (vllm, sglang, trtllm; e.g. vllm-0.24): "
        "achieved rates from its kernel tables and its fixed costs (see `dcost engines`)",
    )
    parser.add_argument(
        "--profile",
        metavar="FILE",
        help="with --engine: a profile file of your own (`dcost calibrate --from`)",
    )


def selected_engine(args):
    """The ``dcost.Engine`` that ``--engine`` names for ``--hardware`` (None: no single engine:
    absent, or ``dcost plan``'s "all" / "none")."""
    name = getattr(args, "engine", None)
    if name is None or name in ("all", "none"):
        return None
    from dcost import engines

    if getattr(args, "calibrated", False):
        raise engines.EngineError(
            "--calibrated and --engine choose two profiles for the chip: use one of them"
        )
    return engines.engine(name, hardware=args.hardware, profile=getattr(args, "profile", None))


def hardware_and_model(args):
    """The ``--hardware`` and ``--model`` presets at ``--precision`` (auto: the model's own, by
    ``dcost.presets.serving_hardware``), calibrated with ``--calibrated`` or running
    ``--engine``'s profile."""
    m = presets.model(args.model)
    precision = getattr(args, "precision", "auto")
    calibrated = bool(getattr(args, "calibrated", False))
    chip = presets.serving_hardware(
        args.hardware, args.model, precision=precision, calibrated=calibrated
    )
    eng = selected_engine(args)
    if eng is not None:
        chip = eng.apply(chip, model=m)
    return chip, m


def profile_error(args) -> tuple[str, dict] | None:
    """``(family, presets.calibration_error(family))`` of ``--hardware`` under ``--calibrated``;
    ``("<engine> <version>", {"engine": dcost.engines.engine_error(name)})`` under ``--engine``;
    None for pure physics (a bound, not an estimate with an error)."""
    eng = selected_engine(args)
    if eng is not None:
        from dcost import engines

        return f"{eng.name} {eng.version}", {"engine": engines.engine_error(eng.name)}
    if not getattr(args, "calibrated", False):
        return None
    family = presets.card_family(args.hardware)
    return family, presets.calibration_error(family)


def calibration_line(family: str, error: dict, width: int = 17) -> str:
    """One line on how far off a calibrated answer is, held out (the family's records, a new
    source; or an engine's runs in the silicon sample), with the command that lists them; its
    label padded to ``width``."""
    if "engine" in error:
        e = error["engine"]
        return (
            f"{'engine:':{width}s}{family} profile (kernel tables, fixed costs end to end); held "
            f"out, its {e['rows']} runs in AIConfigurator's silicon sample are off by "
            f"{100 * e['median']:.0f} % median ({100 * e['p90']:.0f} % p90): dcost engines"
        )
    fam, new = error["family"], error["source_weighted"]
    return (
        f"{'calibrated:':{width}s}{family} profile; held out, its {fam['records']} records are "
        f"off by {100 * fam['median']:.0f} % median ({100 * fam['p90']:.0f} % p90), a new "
        f"source by {100 * new['median']:.0f} % ({100 * new['p90']:.0f} %): dcost validate "
        f"--only family={family}"
    )


def positive(text):
    v = parse_number(text)
    if v <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text!r}")
    return v


def at_least_one(text):
    v = parse_number(text)
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {text!r}")
    return v


def whole(text):
    """A whole number >= 1 (a count: batch, chips, stages), in any form ``parse_number`` reads.

    >>> whole("1k"), whole("64")
    (1000, 64)
    """
    v = parse_number(text)
    if v < 1 or v != round(v):
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return int(v) if v < 2**53 else v  # past 2**53 a float is whole; the spec checks the range


def non_negative(text):
    v = parse_number(text)
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text!r}")
    return v


class Parser(argparse.ArgumentParser):
    """argparse with a one-line error and exit code 2."""

    def error(self, message):
        self.exit(2, f"dcost: error: {message}\n")
