"""Fail the build on a link left pointing at a ``.md`` source file.

mkdocs rewrites ``[text](page.md)`` links of a page's own markdown, and ``--strict`` fails on the
broken ones; but markdown printed by an executed code block (markdown-exec) is converted on its
own and its links reach the HTML unrewritten, so ``href="page.md"`` would 404 on the site without
a warning. Such links belong in the page's markdown, beside the block.
"""

from __future__ import annotations

import re

from mkdocs.exceptions import PluginError

SOURCE_LINK = re.compile(r'href="(?![a-z]+://)([^"#]*\.md)(#[^"]*)?"')


def on_post_page(output: str, page, config, **kwargs) -> str:
    bad = sorted({m.group(1) for m in SOURCE_LINK.finditer(output)})
    if bad:
        raise PluginError(f"{page.file.src_path}: links to markdown sources left unrewritten (printed by a "
                          f"code block?): {', '.join(bad)}; write them in the page's markdown instead")
    return output
