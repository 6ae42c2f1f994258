"""mkdocs hooks: the executed notebooks (``notebooks/*.ipynb``) and the experiments' figures
(``experiments/results/*.png``) live outside ``docs/``; they join the site's files here, under
the same paths as in the repository, so that nothing is copied or linked into ``docs/``.

A page links them by their path in the repository (``../notebooks/tour.ipynb`` from
``docs/index.md``), so the links work where the Markdown is read as it is; in the site they sit
one folder higher than that, and ``on_page_markdown`` drops the one ``../`` that leaves ``docs/``.
"""

from __future__ import annotations

import pathlib
import re

import mkdocs.plugins
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUTSIDE = ("notebooks/*.ipynb", "experiments/results/*.png")


@mkdocs.plugins.event_priority(100)  # before mkdocs-jupyter turns .ipynb files into pages
def on_files(files: Files, config: MkDocsConfig) -> Files:
    for pattern in OUTSIDE:
        for path in sorted(ROOT.glob(pattern)):
            files.append(
                File(
                    path.relative_to(ROOT).as_posix(),
                    src_dir=str(ROOT),
                    dest_dir=config.site_dir,
                    use_directory_urls=config.use_directory_urls,
                )
            )
    return files


def on_page_markdown(markdown: str, page: Page, **kwargs) -> str:
    up = "../" * page.file.src_uri.count("/")  # from the page to docs/
    outside = re.compile(r"\]\(" + re.escape(up) + r"\.\./(notebooks|experiments)/")
    return outside.sub(lambda m: "](" + up + m.group(1) + "/", markdown)
