"""The code beside the math: a page's equation next to the source of the minipos function that
implements it, read from the code when the site is built (never a pasted copy).

Used from markdown-exec blocks (the build runs from the repository root, so ``docs`` imports)::

    ```python exec="on" html="1"
    from docs._code import beside
    print(beside(r"b_h(i, j) = -m_h\\,(i - j)", "minipos.alibi.alibi_bias", page="schemes/alibi.md",
                 symbols=[("m_h", "slopes[h]"), ("i", "q_positions"), ("j", "k_positions")]))
    ```

``beside`` returns one ``div.minipos-pair``: the equation (display math, typeset by MathJax) and
the function's source (its docstring left out: the API page has it), side by side on a wide
screen and stacked on a narrow one (``docs/assets/extra.css``), a link to the whole module
(``docs/source/<module>.md``, the file as it is, line by line), and under the pair one line that
maps the equation's symbols to the code's names. Each name on that line must occur in the shown
source, so a renamed argument fails the build instead of leaving the line wrong.

``module_source`` renders a whole module for its source page.
"""

from __future__ import annotations

import ast
import html
import importlib
import inspect
import posixpath
import re
import textwrap
from pathlib import Path

from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import PythonLexer

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["beside", "module_source", "source_of", "source_url"]


def _resolve(name: str):
    """The object named by a dotted path: a module, then attributes (``minipos.layer.MultiHeadAttention.__call__``)."""
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:k]))
        except ImportError:
            continue
        for attr in parts[k:]:
            obj = getattr(obj, attr)
        return obj, ".".join(parts[:k])
    raise ValueError(f"name must be an importable minipos object, got {name!r}")


def _strip_docstring(src: str) -> str:
    """``src`` (one def or class, dedented) without its docstring."""
    tree = ast.parse(src)
    node = tree.body[0]
    body = getattr(node, "body", [])
    if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        return src
    lines = src.splitlines()
    doc = body[0]
    kept = lines[: doc.lineno - 1] + lines[doc.end_lineno:]
    if len(body) == 1:                              # a body that is only a docstring keeps a stub
        kept.insert(doc.lineno - 1, " " * doc.col_offset + "...")
    return "\n".join(kept) + "\n"


def source_of(name: str, *, docstring: bool = False) -> tuple[str, str, int]:
    """``(source, module name, first line)`` of the object ``name``, dedented; without its
    docstring unless ``docstring``."""
    obj, module = _resolve(name)
    obj = inspect.unwrap(obj)
    lines, first = inspect.getsourcelines(obj)
    src = textwrap.dedent("".join(lines))
    if not docstring:
        src = _strip_docstring(src)
    return src, inspect.getmodule(obj).__name__ or module, first


def source_url(module: str, page: str) -> str:
    """The URL of ``module``'s source page relative to the built page of ``page`` (``schemes/alibi.md``)."""
    from docs.hooks.links import site_url
    target = f"source/{module.split('.', 1)[1]}"
    if not (ROOT / "docs" / f"{target}.md").is_file():
        raise ValueError(f"module {module} has no source page: add docs/{target}.md (as the others) and its nav line")
    return site_url(page, target)


def _code_html(src: str) -> str:
    return highlight(src, PythonLexer(), HtmlFormatter(wrapcode=True))


def _inline(text: str) -> str:
    """Plain text with ``$math$`` as MathJax inline math and backticks as code."""
    out = []
    for part in re.split(r"(\$[^$]+\$|`[^`]+`)", text):
        if part.startswith("$") and part.endswith("$") and len(part) > 1:
            out.append(f'<span class="arithmatex">\\({html.escape(part[1:-1], quote=False)}\\)</span>')
        elif part.startswith("`") and part.endswith("`") and len(part) > 1:
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
        else:
            out.append(html.escape(part, quote=False))
    return "".join(out)


def beside(tex: str, name: str, *, page: str, symbols, docstring: bool = False, note: str = "") -> str:
    """One equation and the source of ``name`` side by side, with the line of symbols under them.

    tex: the equation, LaTeX for display math (``aligned`` for several lines).
    name: the dotted name of the minipos function (or class or method) that implements it.
    page: the docs page this is printed on (``"schemes/alibi.md"``), for the link to the module.
    symbols: ``[(symbol, code name), ...]``: each symbol as LaTeX, each code name as it is written in
        the source (``"slopes[h]"``); the first identifier of every code name must occur in it.
    note: an optional sentence after the symbol line (markdown-like: ``$math$``, ``code``).
    Raises ValueError for an unknown ``name``, an empty ``symbols`` or a code name not in the source.
    """
    src, module, first = source_of(name, docstring=docstring)
    symbols = list(symbols)
    if not symbols:
        raise ValueError(f"symbols must map at least one symbol of the equation to {name}'s code")
    for sym, code in symbols:
        ident = re.match(r"[A-Za-z_]\w*", code)
        if ident is None or not re.search(rf"\b{re.escape(ident.group())}\b", src):
            raise ValueError(f"symbols: {code!r} (for ${sym}$) does not occur in the source of {name}")
    rel = module.replace(".", "/") + ".py"
    url = source_url(module, page) + f"#L-{first}"
    mapping = "; ".join(
        f'<span class="arithmatex">\\({html.escape(sym, quote=False)}\\)</span> → <code>{html.escape(code)}</code>'
        for sym, code in symbols)
    shown = "" if docstring else " (docstring on the API page)"
    return (
        '<div class="minipos-pair">\n'
        f'<div class="minipos-pair__math"><div class="arithmatex">\\[\n{html.escape(tex, quote=False)}\n\\]</div></div>\n'
        '<div class="minipos-pair__code">\n'
        f'<p class="minipos-pair__head"><code>{html.escape(name)}</code>{shown}, '
        f'<a href="{url}">{html.escape(rel)}, line {first}</a></p>\n'
        f"{_code_html(src)}"
        "</div>\n"
        f'<p class="minipos-pair__map"><strong>Symbols → code:</strong> {mapping}.'
        + (f" {_inline(note)}" if note else "") + "</p>\n"
        "</div>\n")


def module_source(module: str) -> str:
    """The whole source file of ``module`` as highlighted HTML, each line anchored ``#L-<n>``."""
    mod = importlib.import_module(module)
    path = Path(inspect.getsourcefile(mod))
    src = path.read_text(encoding="utf-8")
    rel = path.resolve().relative_to(ROOT).as_posix()
    formatter = HtmlFormatter(wrapcode=True, linenos="inline", lineanchors="L", anchorlinenos=True)
    return (f"<p><code>{html.escape(rel)}</code>, {len(src.splitlines())} lines, read when the site was "
            f"built.</p>\n" + highlight(src, PythonLexer(), formatter))
