"""Data flows one way (DESIGN.md section 6): presets and engine profiles load below the cost
functions, validation and the searches; ``dcost.calibrate`` holds the fitters, which read records
and write profiles, and nothing below it imports it."""

from __future__ import annotations

import ast
import pathlib

import jax
import numpy as np
import pytest

import dcost
from dcost.calibrate import engines as calibrate_engines
from dcost.calibrate import families, kernels

ROOT = pathlib.Path(dcost.__file__).resolve().parent
BELOW_CALIBRATE = (
    "presets",
    "serving",
    "engines",
    "validation",
    "planning",
    "search",
    "training",
    "pricing",
    "specs.py",
    "measurements.py",
    "smooth.py",
    "bisection.py",
)


def _imports(path: pathlib.Path) -> set[str]:
    """Every module a file imports, at its top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _files(entry: str) -> list[pathlib.Path]:
    p = ROOT / entry
    return sorted(p.rglob("*.py")) if p.is_dir() else [p]


@pytest.mark.parametrize("entry", BELOW_CALIBRATE)
def test_nothing_below_the_fitters_imports_them(entry):
    files = _files(entry)
    assert files, entry  # a renamed module would make this test pass on nothing
    for path in files:
        bad = sorted(
            m for m in _imports(path) if m == "dcost.calibrate" or m.startswith("dcost.calibrate.")
        )
        assert not bad, f"{path.relative_to(ROOT)} imports {bad}"


def test_the_import_scan_sees_an_import_inside_a_function(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def g():\n    from dcost.calibrate.families import fit\n    return fit\n")
    assert "dcost.calibrate.families" in _imports(f)


@pytest.mark.parametrize(
    "name", ["h100-sxm", "b200", "gb200-nvl72", "a100-80gb", "mi300x", "tpu-v5p"]
)
def test_a_family_profile_applied_to_a_chip_is_the_calibrated_preset(name):
    if name not in dcost.presets.hardware_names():
        pytest.fail(f"{name} is not a preset: pick chips that are")
    family = dcost.presets.card_family(name)
    got = dcost.presets.with_calibration_profile(dcost.hardware(name), family)
    want = dcost.hardware(name, calibrated=True)
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-6)
    # the name the fitters used is the same function's answer
    old = families.calibrated_hardware(dcost.hardware(name), family)
    assert all(
        np.array_equal(np.asarray(a), np.asarray(b))
        for a, b in zip(jax.tree.leaves(old), jax.tree.leaves(got), strict=True)
    )


def test_a_family_profile_keeps_the_fields_it_does_not_name():
    h = dcost.presets.with_calibration_profile(
        dcost.hardware("h100-sxm", price_per_hour=7.5), "hopper"
    )
    assert float(h.price_per_hour) == 7.5
    assert float(h.flops) == float(dcost.hardware("h100-sxm").flops)
    with pytest.raises(dcost.presets.PresetError, match="known"):
        dcost.presets.with_calibration_profile(h, "vacuum-tubes")


def test_the_moved_helpers_keep_their_old_names():
    assert calibrate_engines.architectures is dcost.presets.architectures
    assert kernels.write_profile is dcost.engines.write_profile
    twins = dcost.presets.architectures(["deepseek-v3", "deepseek-r1", "qwen3-32b"])
    assert twins["deepseek-v3"] == twins["deepseek-r1"] != twins["qwen3-32b"]
