"""Fail the build on a code block that raised.

markdown-exec renders a block that raises as its traceback and logs a warning; ``--strict`` turns
that warning into a failed build only when warnings are logged. ``mkdocs build -q`` raises the log
level to errors, the warning is dropped before it is counted, and the build passes with the
traceback printed on the page. This hook fails it whatever the log level, so that a page's claim
about the lab records (``docs/hooks/evidence.py``) or a proof that stops holding stops the site.
"""

from __future__ import annotations

import html
import re

from mkdocs.exceptions import PluginError

TAG = re.compile(r"<[^>]+>")
TRACEBACK = "Traceback (most recent call last)"


def on_page_content(content: str, page, config, files, **kwargs) -> str:
    text = html.unescape(TAG.sub("", content))
    if TRACEBACK in text:
        tail = text[text.index(TRACEBACK):].strip().splitlines()
        last = next((line.strip() for line in reversed(tail[:60]) if re.match(r"\s*\w[\w.]*(Error|Exception|Failure)\b", line)), "")
        raise PluginError(f"{page.file.src_path}: a code block raised when the page was built: {last or tail[0]}")
    return content
