"""The checks a built page must pass, whichever generator built it.

- **A code block that raised** (``traceback``). markdown-exec renders a block that raises as its
  traceback and only logs a warning: mkdocs's ``--strict`` turns that warning into a failed build
  unless ``-q`` drops it first, and Zensical's ``--strict`` does not see it at all. A page whose text
  holds a traceback fails the build here instead, so that a page's claim about the lab records
  (``docs/hooks/evidence.py``) or a proof that stops holding stops the site.
- **A link to a markdown source** (``source_links``). The generator rewrites ``[text](page.md)`` links
  of a page's own markdown, but markdown printed by an executed block is converted on its own and
  its links reach the HTML unrewritten, so ``href="page.md"`` would 404 on the site without a
  warning. Such links belong in the page's markdown, beside the block.
- **A link to no file of the site** (``dead_links``): a relative ``href`` or ``src`` that resolves to
  nothing the build wrote (mkdocs checks the links of a page's markdown; Zensical does not, and
  neither checks what a code block printed).
"""

from __future__ import annotations

import html
import re
from pathlib import Path
from urllib.parse import unquote, urlsplit

TAG = re.compile(r"<[^>]+>")
TRACEBACK = "Traceback (most recent call last)"
EXCEPTION_LINE = re.compile(r"\s*\w[\w.]*(Error|Exception|Failure)\b")
SOURCE_LINK = re.compile(r'href="(?![a-z]+:)([^"#?]*\.md)([#?][^"]*)?"')
LOCAL_REF = re.compile(r'\s(?:href|src)="(?![a-z][a-z0-9+.-]*:|//|#)([^"]*)"')


def text_of(page_html: str) -> str:
    """The visible text of a page: tags removed, entities decoded."""
    return html.unescape(TAG.sub("", page_html))


def traceback(page_html: str) -> str | None:
    """The exception line of the first traceback in the page's text (its first line if none is
    recognisable), or None when the page shows no traceback."""
    text = text_of(page_html)
    if TRACEBACK not in text:
        return None
    tail = text[text.index(TRACEBACK):].strip().splitlines()
    last = next((line.strip() for line in reversed(tail[:60]) if EXCEPTION_LINE.match(line)), "")
    return last or tail[0]


def source_links(page_html: str) -> list[str]:
    """The ``.md`` files the page's links point at (sorted, each once): links left unrewritten."""
    return sorted({m.group(1) for m in SOURCE_LINK.finditer(page_html)})


def dead_links(page_html: str, page: Path, site: Path) -> dict[str, str]:
    """The relative links and sources of ``page`` (a file of ``site``) that resolve to no file of the
    site, either as a file or as a folder with an ``index.html``: each as written, with where it points
    (a path in the site, or ``outside the site``)."""
    site = site.resolve()
    dead = {}
    for m in LOCAL_REF.finditer(page_html):
        ref = html.unescape(m.group(1))
        path = unquote(urlsplit(ref).path)
        if not path:
            continue
        target = ((site / path.lstrip("/")) if path.startswith("/") else (page.parent / path)).resolve()
        if target != site and site not in target.parents:
            dead[ref] = "outside the site"
        elif not (target.is_file() or (target / "index.html").is_file()):
            dead[ref] = target.relative_to(site).as_posix()
    return dead


def pages(site: Path) -> list[Path]:
    """The HTML pages of a built site (not the files under ``assets/``)."""
    site = Path(site)
    return sorted(p for p in site.rglob("*.html") if p.relative_to(site).parts[0] != "assets")


def problems(site: Path) -> list[str]:
    """One line per problem of every page of ``site``: a code block that raised, a link left pointing
    at a markdown source, a link to nothing the site holds."""
    site = Path(site)
    found, missing = [], {}
    for page in pages(site):
        name = page.relative_to(site).as_posix()
        page_html = page.read_text(encoding="utf-8")
        raised = traceback(page_html)
        if raised:
            found.append(f"{name}: a code block raised when the page was built: {raised}")
        bad = source_links(page_html)
        if bad:
            found.append(f"{name}: links to markdown sources left unrewritten (printed by a code block?): "
                         f"{', '.join(bad)}; write them in the page's markdown instead")
        for ref, target in dead_links(page_html, page, site).items():
            if ref not in bad:
                missing.setdefault(target, []).append(f"{name} ({ref})" if target != ref else name)
    for target, where in sorted(missing.items()):
        found.append(f"{target}: linked from {len(where)} page(s) but not in the site: {', '.join(where[:3])}"
                     f"{' ...' if len(where) > 3 else ''}")
    return found
