"""The documentation site's API reference covers the public face: every name in ``dcost.__all__``
is rendered by a ``::: path`` directive of ``docs/api/*.md`` that resolves to that very object
(``make docs`` fails on a directive that resolves to nothing; this fails on a name left out).
And the docstring rewriting the site's build applies (``docs/_hooks/griffe_rst.py``), where the
docs tools are installed (``make docs``)."""

import doctest
import importlib
import importlib.util
import pathlib
import re

import pytest

import dcost

ROOT = pathlib.Path(__file__).resolve().parents[1]
API = ROOT / "docs" / "api"


def _directives() -> list[str]:
    return [
        m.group(1)
        for page in sorted(API.glob("*.md"))
        for m in re.finditer(r"^::: ([\w.]+)\s*$", page.read_text(encoding="utf-8"), re.M)
    ]


def _resolve(path: str):
    """The object a dotted path names: the longest importable module, then attributes."""
    parts = path.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for name in parts[i:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(path)


def test_every_public_name_is_in_the_api_reference():
    rendered = {path: _resolve(path) for path in _directives()}
    missing = [
        name
        for name in dcost.__all__
        if not any(obj is getattr(dcost, name) for obj in rendered.values())
    ]
    assert not missing, (
        f"public names with no '::: ' directive in docs/api/*.md: {missing} (a name imported on "
        "first use, dcost._LAZY, is written with its module's path: ::: dcost.engines.engine)"
    )


def test_every_directive_names_a_public_or_documented_object():
    """A directive of a ``dcost`` name resolves (a renamed function fails here before the
    site's build does), and no public name is rendered twice."""
    paths = _directives()
    objects = [_resolve(p) for p in paths]
    public = [getattr(dcost, n) for n in dcost.__all__]
    twice = [p for p, o in zip(paths, objects, strict=True) if sum(o is x for x in objects) > 1]
    assert not twice, twice
    assert sum(any(o is x for x in public) for o in objects) >= len(set(map(id, public)))


def test_docstring_rewriting_for_the_site():
    pytest.importorskip("griffe")
    spec = importlib.util.spec_from_file_location(
        "griffe_rst", ROOT / "docs" / "_hooks" / "griffe_rst.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert doctest.testmod(module).failed == 0
    text = module.rewrite(dcost.decode.__doc__)
    assert ".. math::" not in text and "$$" in text
    assert "```pycon" in text and text.count("```") % 2 == 0
