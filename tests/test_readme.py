"""The README's held-out figures are the shipped ones: its table of held-out error per family, its
headline and its record count, read from the text and held against
``dcost/presets/calibration.toml`` (written by ``dcost validate --write``) and the record file.
A refit that moves a number without the README moving with it fails here."""

import pathlib
import re
import tomllib

import pytest

import dcost.validation as v

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
HELD = tomllib.loads((ROOT / "dcost/presets/calibration.toml").read_text())["heldout"]


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def test_family_table_is_the_shipped_summary():
    rows = re.findall(r"^\| (\w+)[^|]*\| (\d+) \| ([\d.]+ %) \| ([\d.]+ %) \|$", README, re.M)
    table = {name: (int(n), med, p90) for name, n, med, p90 in rows}
    assert "all" in table and len(table) >= 7, rows
    for name, (n, med, p90) in table.items():
        s = HELD["overall" if name == "all" else name]
        assert (n, med, p90) == (s["records"], _pct(s["median"]), _pct(s["p90"])), name


def test_headline_is_the_shipped_summary():
    overall, once = HELD["overall"], HELD["overall"]["source_weighted"]
    head = re.search(
        r"off by a median \*\*([\d.]+ %)\*\* \(90th percentile (\d+) %\).*?\*\*([\d.]+ %) "
        r"\(([\d.]+ %)\) with each of the (\d+) sources weighted once\*\*",
        README,
        re.S,
    )
    assert head, "the README's headline sentence changed shape"
    assert head.group(1) == _pct(overall["median"])
    assert int(head.group(2)) == round(100 * overall["p90"])
    assert head.group(3) == _pct(once["median"]) and head.group(4) == _pct(once["p90"])
    assert int(head.group(5)) == once["sources"]


@pytest.mark.parametrize("phrase", ["holds on **all {n} records**", "against {n} measurements"])
def test_record_counts_are_the_record_files(phrase):
    assert phrase.format(n=len(v.load())) in README


def test_collective_kernel_ratios_are_the_shipped_profiles():
    """The README's ranges for DeepEP's kernels are ``collectives.summary()`` of the shipped
    profile and the pure bound."""
    from dcost.validation import collectives

    s = collectives.summary()["h800"]
    pure = f"({s['pure']['min']:.2f}-{s['pure']['max']:.2f}x the measured time)"
    cal = s["calibrated"]
    profile = f"**{cal['min']:.2f}-{cal['max']:.2f}x** too slow (median {cal['median']:.2f}x)"
    text = " ".join(README.split())
    assert pure in text, pure
    assert profile in text, profile
