"""mkdocs's entry to the build steps of ``docs.build`` (listed under ``hooks:`` in mkdocs.yml).

Zensical ignores ``hooks:``; ``python -m docs.build zensical`` calls the same steps after its build.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from mkdocs.exceptions import PluginError

ROOT = str(Path(__file__).resolve().parents[2])     # the repository root, for ``docs.build``
if ROOT not in sys.path:                           # (``mkdocs`` as a script does not put it there)
    sys.path.insert(0, ROOT)

from docs.build import BuildError, finish  # noqa: E402


def on_config(config, **kwargs):
    # Figures are drawn at build time by markdown-exec blocks: no display needed.
    os.environ.setdefault("MPLBACKEND", "Agg")
    return config


def on_post_build(config, **kwargs) -> None:
    try:
        finish(config.site_dir)
    except BuildError as error:
        raise PluginError(str(error)) from None
