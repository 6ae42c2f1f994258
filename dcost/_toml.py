"""Reading the TOML data files shipped in the package (presets, fits, price sheets, records)."""

from __future__ import annotations

import tomllib
from importlib import resources

__all__ = ["read_toml", "tomllib"]


def read_toml(package: str, name: str) -> dict:
    """The TOML file ``name`` shipped in ``package`` (e.g. ``"dcost.presets"``), parsed."""
    return tomllib.loads(resources.files(package).joinpath(name).read_text(encoding="utf-8"))
