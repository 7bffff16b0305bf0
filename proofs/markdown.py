r"""Markdown for the documentation site, rendered from the proofs themselves.

The docs pages call these functions in markdown-exec blocks at build time::

    ```python exec="on"
    from proofs.markdown import derivation
    print(derivation("rope.relative.headline"))
    ```

    ```python exec="on" html="1"
    import matplotlib.pyplot as plt
    from proofs.markdown import svg
    fig, ax = plt.subplots()
    ...
    print(svg(fig))
    ```

- :func:`derivation` runs one theorem and returns its statement, status, the minipos functions it
  checks and its derivation as display math (``$$\begin{aligned} … \end{aligned}$$``), taken
  from the same derivation object that was checked (:func:`proofs.core.latex_of`), never retyped.
  A theorem that does not pass raises :class:`ProofNotPassed`, so a broken proof fails the build.
- :func:`report` runs every theorem and returns the ``python -m proofs`` table as markdown; it
  raises too if any theorem fails.
- :func:`quote_test` quotes one test function of ``tests/`` (found by name, raises if it is gone),
  for claims that a test settles rather than a proof.
- :func:`svg` turns a matplotlib figure into an inline SVG string: text drawn as paths (no
  fonts needed), no metadata, ids unique on the page and stable from build to build.

This module registers no theorem; ``proofs`` imports it as it imports every module of the
package, and it pulls in nothing beyond :mod:`proofs.core` until :func:`svg` is called.
"""

from __future__ import annotations

import ast
import html
import io
import itertools
import re
from pathlib import Path

from . import core

__all__ = ["derivation", "report", "quote_test", "svg", "ProofNotPassed"]

_MD_SPECIAL = re.compile(r"([\\`*_\[\]|$])")
_svg_ids = itertools.count()
_TESTS = Path(__file__).resolve().parent.parent / "tests"


class ProofNotPassed(AssertionError):
    """A theorem rendered for the docs did not pass; the message is the proof's own."""


def _inline(text: str) -> str:
    """Plain text as inline markdown: HTML and markdown/math specials escaped."""
    return _MD_SPECIAL.sub(r"\\\1", html.escape(text, quote=False))


def _run(theorem_id: str) -> core.Result:
    if theorem_id not in core.REGISTRY:
        raise KeyError(f"theorem_id must be a registered theorem id, got {theorem_id!r}; "
                       f"known: {', '.join(sorted(core.REGISTRY))}")
    result = core.REGISTRY[theorem_id].run()
    if not result.ok:
        raise ProofNotPassed(f"theorem {theorem_id} did not pass [{result.status}]\n{result.message}")
    return result


def _math_blocks(latex: str) -> list[str]:
    """Split :func:`proofs.core.latex_of` output into markdown: each ``aligned`` block as
    display math, each ``% note`` line as an italic sentence."""
    out, block = [], []
    for line in latex.splitlines():
        if not block and line.startswith("%"):
            out.append(f"*{_inline(line.lstrip('% ').strip())}.*")
            continue
        block.append(line)
        if line.strip() == r"\end{aligned}":
            out.append("$$\n" + "\n".join(block) + "\n$$")
            block = []
    if block:
        raise ValueError(f"latex must end each block with \\end{{aligned}}, got {block[-1]!r}")
    return out


def derivation(theorem_id: str, *, title: str | None = None) -> str:
    """Run ``theorem_id`` and return it as a markdown admonition with its derivation.

    theorem_id: a registered id such as ``"rope.relative.headline"``.
    title: the admonition title (default: the id).
    Raises KeyError for an unknown id and :class:`ProofNotPassed` if the theorem fails.
    """
    result = _run(theorem_id)
    checks = ", ".join(f"`{c}`" for c in result.checks) or "no minipos function (pure mathematics)"
    body = [f"**{_inline(result.statement)}**", "",
            f"Status **{result.status}** ({result.steps} checked steps, "
            f"{result.seconds:.2f} s at build time). Checks {checks}.", "",
            f"Run it yourself: `python -m proofs {theorem_id}`."]
    latex_statement = core.REGISTRY[theorem_id].latex_statement
    if latex_statement:
        body[1:1] = ["", f"$$\n{latex_statement}\n$$"]
    for block in _math_blocks(core.latex_of(result)):
        body += ["", block]
    head = f'!!! success "{(title or theorem_id).replace(chr(34), chr(39))}"'
    return "\n".join([head, ""] + [("    " + line) if line else "" for line in
                                   "\n".join(body).splitlines()]) + "\n"


def report(patterns=()) -> str:
    """Run the selected theorems (all by default) and return the ``python -m proofs`` table as a
    markdown table. Raises :class:`ProofNotPassed` listing every failure, if any."""
    results = core.run(tuple(patterns))
    failed = [r for r in results if not r.ok]
    if failed:
        raise ProofNotPassed(f"{len(failed)} theorem(s) failed:\n\n" + "\n\n".join(r.message for r in failed))
    rows = ["| id | statement | steps | status | seconds | checks |", "|---|---|---:|---|---:|---|"]
    for r in results:
        checks = ", ".join(f"`{c}`" for c in r.checks) or "–"
        rows.append(f"| `{r.id}` | {_inline(r.statement)} | {r.steps} | {r.status} | "
                    f"{r.seconds:.2f} | {checks} |")
    total = sum(r.seconds for r in results)
    return "\n".join(rows) + f"\n\n{len(results)}/{len(results)} passed in {total:.2f} s.\n"


def quote_test(test_id: str) -> str:
    """The source of one test as a markdown python block, headed by its pytest id.

    test_id: ``"tests/test_alibi.py::test_key_only_equals_alibi_after_softmax"`` (path relative to
    the repository). Reads the file without importing it; raises KeyError if the test is gone.
    """
    path, _, name = test_id.partition("::")
    file = _TESTS.parent / path
    if not file.is_file() or not name:
        raise KeyError(f"test_id must be 'tests/<file>.py::<test>' for an existing file, got {test_id!r}")
    text = file.read_text(encoding="utf-8")
    for node in ast.parse(text).body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno]) - 1
            code = "\n".join(text.splitlines()[start: node.end_lineno])
            return f"`{test_id}`\n\n```python\n{code}\n```\n"
    raise KeyError(f"no test {name!r} in {path}")


def svg(fig, *, close: bool = True) -> str:
    """A matplotlib figure as an inline ``<svg>`` element (a string with no XML prologue).

    Text is drawn as paths (``svg.fonttype = "path"``), so the page needs no font; the figure
    scales down to the page width. The figure is closed unless ``close=False``.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    buf = io.StringIO()
    rc = {"svg.fonttype": "path", "svg.hashsalt": f"minipos-figure-{next(_svg_ids)}"}
    with matplotlib.rc_context(rc):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    if close:
        plt.close(fig)
    text = buf.getvalue()
    text = text[text.index("<svg"):]
    return text.replace("<svg ", '<svg class="minipos-figure" style="max-width: 100%; height: auto" ', 1)
