"""Reading the TOML data files shipped in the package (presets, fits, price sheets, records), and
writing the tables dcost writes back (engine profiles, held-out summaries)."""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from importlib import resources

__all__ = ["read_toml", "tomllib", "toml_value", "toml_key", "toml_table"]


def read_toml(package: str, name: str) -> dict:
    """The TOML file ``name`` shipped in ``package`` (e.g. ``"dcost.presets"``), parsed."""
    return tomllib.loads(resources.files(package).joinpath(name).read_text(encoding="utf-8"))


def toml_value(x) -> str:
    """A TOML value: a bool, an int, a float (6 significant digits), a string or a list of them.

    >>> toml_value([1, 0.1234567, "ab", True])
    '[1, 0.123457, "ab", true]'
    """
    if isinstance(x, bool):
        return "true" if x else "false"
    if isinstance(x, (int, float)):
        return repr(float(f"{float(x):.6g}")) if isinstance(x, float) else str(x)
    if isinstance(x, str):
        return '"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(x, (list, tuple)):
        return "[" + ", ".join(toml_value(v) for v in x) + "]"
    raise TypeError(f"no TOML value for {type(x).__name__} {x!r}")


def toml_key(k: str) -> str:
    """A TOML key: bare when it can be, else quoted."""
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else toml_value(k)


def toml_table(name: str, table: Mapping, lines: list[str]) -> None:
    """Append ``[name]`` with ``table``'s scalars to ``lines``, then each nested mapping as
    ``[name.key]`` after it (``tomllib`` reads back the same nesting)."""
    scalars = {k: v for k, v in table.items() if not isinstance(v, Mapping)}
    nested = {k: v for k, v in table.items() if isinstance(v, Mapping)}
    lines.append(f"[{name}]")
    for k, v in scalars.items():
        lines.append(f"{toml_key(str(k))} = {toml_value(v)}")
    lines.append("")
    for k, v in nested.items():
        toml_table(f"{name}.{toml_key(str(k))}", v, lines)
