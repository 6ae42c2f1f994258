"""A griffe extension that lets dcost's docstrings, written for reading in a terminal and for
doctest (Google sections, reStructuredText ``.. math::`` directives, bare ``>>>`` examples), render
in the documentation site without editing them.

Before a docstring is parsed it is rewritten, line by line:

- ``.. math::`` and its indented body become one ``$$ ... $$`` block per paragraph of the body
  (MathJax through ``pymdownx.arithmatex``); ``.. math:: x`` on one line becomes ``$$ x $$``;
- a run of doctest lines (``>>>`` up to the next blank line: the prompts, their ``...``
  continuations and the expected output) becomes a fenced ``pycon`` block;
- a paragraph that ends in ``::`` ends in ``:`` (the indented literal block after it is already a
  Markdown code block);
- a cross-reference role (``:func:``, ``:class:``, ...) becomes a plain code span;
- an ``Args:`` entry that documents several parameters at once (``design, hardware, model: as
  for decode``) becomes one entry per parameter, each with the whole description.

The docstrings themselves are untouched (``python -m pytest`` runs their doctests as they are).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_MATH = re.compile(r"^(?P<indent>\s*)\.\. math::\s*(?P<rest>.*)$")
_DOCTEST = re.compile(r"^(?P<indent>\s*)>>>( |$)")
_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|obj|exc):`~?([^`]+)`")
_SECTION = re.compile(r"^(?P<indent>\s*)(Args|Attributes):\s*$")
_GROUPED = re.compile(r"^(?P<indent>\s+)(?P<names>\w+(?:, \w+)+): (?P<text>.*)$")


def _indent_of(line: str) -> int:
    return len(line) - len(line.lstrip())


def _math_block(indent: str, lines: list[str]) -> list[str]:
    return [f"{indent}$$", *(f"{indent}{x.strip()}" for x in lines), f"{indent}$$"]


def _ungroup(lines: list[str]) -> list[str]:
    """Each grouped entry of an ``Args:``/``Attributes:`` section as one entry per name.

    >>> _ungroup(["Args:", "  a, b: the same", "    thing.", "  c: other"])
    ['Args:', '  a: the same', '    thing.', '  b: the same', '    thing.', '  c: other']
    """
    out: list[str] = []
    section: int | None = None  # the indent of the section header we are in
    i = 0
    while i < len(lines):
        line = lines[i]
        header = _SECTION.match(line)
        if header:
            section = len(header.group("indent"))
        elif line.strip() and section is not None and _indent_of(line) <= section:
            section = None
        grouped = _GROUPED.match(line) if section is not None else None
        if grouped:
            depth = _indent_of(line)
            more = []
            while i + 1 < len(lines) and lines[i + 1].strip() and _indent_of(lines[i + 1]) > depth:
                i += 1
                more.append(lines[i])
            for name in grouped.group("names").split(", "):
                out += [f"{grouped.group('indent')}{name}: {grouped.group('text')}", *more]
        else:
            out.append(line)
        i += 1
    return out


def rewrite(text: str) -> str:
    """The docstring ``text`` with its reStructuredText maths and doctests as Markdown.

    >>> print(rewrite(".. math:: a = b"))
    $$
    a = b
    $$
    >>> print(rewrite("x::\\n\\n    y"))
    x:
    <BLANKLINE>
        y
    """
    lines = _ungroup(text.splitlines())
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        math = _MATH.match(line)
        if math:
            indent, depth = math.group("indent"), _indent_of(line)
            body = [math.group("rest")] if math.group("rest").strip() else []
            i += 1
            # the body: every following line indented deeper than the directive, or blank
            while i < len(lines) and (not lines[i].strip() or _indent_of(lines[i]) > depth):
                body.append(lines[i])
                i += 1
            while body and not body[-1].strip():  # trailing blanks belong to the text after
                body.pop()
                i -= 1
            paragraph: list[str] = []
            for b in [*body, ""]:
                if b.strip():
                    paragraph.append(b)
                elif paragraph:
                    out += [*_math_block(indent, paragraph), ""]
                    paragraph = []
            if out and not out[-1].strip():
                out.pop()
            continue
        doctest = _DOCTEST.match(line)
        if doctest:
            indent = doctest.group("indent")
            block = []
            while i < len(lines) and lines[i].strip():
                block.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i])
                i += 1
            out += [f"{indent}```pycon", *(f"{indent}{b}" for b in block), f"{indent}```"]
            continue
        if line.rstrip().endswith("::") and not line.strip().startswith(".."):
            line = line.rstrip()[:-1]
        out.append(_ROLE.sub(r"`\1`", line))
        i += 1
    return "\n".join(out)


class RstToMarkdown(griffe.Extension):
    """Rewrites every docstring griffe loads (:func:`rewrite`) before it is parsed."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:  # noqa: D102
        if obj.docstring is not None:
            obj.docstring.value = rewrite(obj.docstring.value)
