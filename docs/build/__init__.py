"""The docs' build steps, for any site generator that reads ``mkdocs.yml`` (mkdocs 1.x, Zensical).

The generator turns ``docs/`` into HTML (markdown-exec runs the pages' code, mkdocstrings renders the
API pages with ``rst_docstrings``); then ``finish(site)`` acts on the built site folder, so nothing
here depends on which generator made it:

1. ``mathjax.install``: MathJax 3 into ``assets/mathjax/`` (the site loads nothing from another host);
2. ``checks.problems``: a page where an executed block raised (the strict failure), a link left
   pointing at a ``.md`` source or at nothing the site holds (the link guard);
3. ``fonts.problems``: a character a page shows that the offline font subsets lack;
4. ``claims.write``: the ledger of claims as ``claims.json`` at the site's root, and a problem for every
   sentence the site asserts whose ledger entry is not confirmed.

Every problem of 2 and 3 is collected, then ``BuildError`` lists them all.

Who calls ``finish``: mkdocs, from its ``on_post_build`` event through ``docs/build/mkdocs_hooks.py``
(``hooks:`` in mkdocs.yml), so ``python -m mkdocs build --strict`` and ``python -m mkdocs serve``
give the whole site; Zensical ignores ``hooks:``, and ``python -m docs.build zensical`` runs it and
then ``finish``. ``python -m docs.build --help`` says more.
"""

from __future__ import annotations

from pathlib import Path

from . import checks, claims, fonts, mathjax

__all__ = ["BuildError", "finish"]


class BuildError(RuntimeError):
    """The built site fails a check; the message has one line per problem."""


def finish(site) -> None:
    """Install MathJax into the built ``site`` folder, then check every page; ``BuildError`` lists every
    problem found."""
    site = Path(site)
    mathjax.install(site)
    asserted = claims.write(site)                  # first: pages link claims.json
    found = checks.problems(site) + fonts.problems(site) + asserted
    if found:
        raise BuildError(f"{len(found)} problem(s) in the built site {site}:\n" + "\n".join(found))
