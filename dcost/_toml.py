"""Reading the TOML data files shipped in the package (presets, fits, price sheets, records)."""

from __future__ import annotations

import sys
from importlib import resources

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 has no tomllib; pyproject installs tomli there
    import tomli as tomllib

__all__ = ["read_toml", "tomllib"]


def read_toml(package: str, name: str) -> dict:
    """The TOML file ``name`` shipped in ``package`` (e.g. ``"dcost.presets"``), parsed."""
    return tomllib.loads(resources.files(package).joinpath(name).read_text(encoding="utf-8"))
