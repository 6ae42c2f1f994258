"""mkdocs hooks: the executed notebooks (``notebooks/*.ipynb``) and the experiments' figures
(``experiments/results/*.png``) live outside ``docs/``; they join the site's files here, under
the same paths as in the repository, so that nothing is copied or linked into ``docs/``."""

from __future__ import annotations

import pathlib

import mkdocs.plugins
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

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
