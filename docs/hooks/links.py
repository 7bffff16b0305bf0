"""Links printed by a page's code blocks, for the generator that builds the site.

Markdown that a code block prints is not rewritten by mkdocs, so a link in it must already be the built
site's URL, relative to the built page (``schemes/alibi.md`` is built at ``schemes/alibi/``). Zensical
rewrites the links of that output as it rewrites the page's own: relative to the page's source folder.
``python -m docs.build zensical`` says which generator runs (``MINIPOS_DOCS_GENERATOR``); mkdocs is the
default.
"""

from __future__ import annotations

import os
import posixpath

__all__ = ["site_url"]


def site_url(page: str, target: str, anchor: str = "", file: bool = False) -> str:
    """The URL of the page ``target`` (``"claims"``, ``"source/alibi"``: a docs path without ``.md``)
    from the page ``page`` (``"schemes/alibi.md"``), with ``#anchor`` if given; ``file=True``: ``target``
    is a file at that path of the site (``"claims.json"``), not a page."""
    if os.environ.get("MINIPOS_DOCS_GENERATOR") == "zensical" or page == "index.md" or page.endswith("/index.md"):
        here = posixpath.dirname(page)
    else:
        here = page[: -len(".md")]
    url = posixpath.relpath(target, here or ".") + ("" if file else "/")
    return url + (f"#{anchor}" if anchor else "")
