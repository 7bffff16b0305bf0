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

- :func:`derivation` runs one theorem and returns it as an admonition that leads with the
  argument: the statement, the theorem's ``latex=`` form and its general chains as display math
  (``$$\begin{aligned} … \end{aligned}$$``). The explicit expansions (blocks recorded in
  ``p.cases`` or ``p.folded``, and the ``p.require`` facts) follow folded in a
  ``<details class="minipos-checked"><summary>checked: …</summary>`` block, then the status and
  the minipos functions it checks. All of it is taken from the same derivation object that was
  checked (the blocks' own ``latex()``), never retyped. A theorem that does not pass raises
  :class:`ProofNotPassed`, so a broken proof fails the build.
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
WIDTH = 36
"""The width, in ems, that a rendered chain is broken to fit (:mod:`proofs.layout`): the site's text
column at a 1280-pixel window, inside an admonition, with room to spare."""
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


def _display(latex: str) -> str:
    return "$$\n" + latex + "\n$$"


def _case_note(case) -> str:
    name, value, values = case
    others = ", ".join(str(v) for v in values if v != value)
    return (f"{name} = {value} written out" + (f"; also checked for {name} = {others}" if others else ""))


def _where(name, values, checked) -> str:
    """Which case values a fact was checked for: all of them, or the ones listed."""
    if name is None:
        return ""
    if len(checked) == len(values):
        return f" (for each of the {len(values)} values of {name})"
    return f" ({name} = {', '.join(str(v) for v in checked)})"


def _folded(block) -> bool:
    return block.case is not None or block.fold is not None or isinstance(block, core._Requirement)


def _checked_block(blocks) -> list[str]:
    """The folded blocks as markdown paragraphs (display math, notes, a list of facts), and the
    summary that names what they check."""
    labels, body, seen_case = [], [], set()
    facts: dict = {}                              # reason -> (case name, all values, values checked)

    def label(text):
        if text not in labels:
            labels.append(text)

    for b in blocks:
        if isinstance(b, core._Requirement):
            name, value, values = b.case if b.case is not None else (None, None, ())
            fact = facts.setdefault(b.reason, (name, values, []))
            if b.case is not None:
                fact[2].append(value)
            label("facts checked on values")
            continue
        if b.case is not None:
            name, value, values = b.case
            if value != values[0]:
                continue
            key = (name, tuple(values))
            if key not in seen_case:
                seen_case.add(key)
                body.append(f"*{_inline(_case_note(b.case))}.*")
                label(_case_note(b.case))
        if b.fold is not None:
            label(b.fold)
        body.append(_display(b.latex(width=WIDTH)))
    if facts:
        body.append("\n".join(f"- {_inline(reason + _where(name, values, checked))}"
                               for reason, (name, values, checked) in facts.items()))
    return labels, body


def _render(result: core.Result, title: str | None) -> str:
    """The admonition for a run theorem: the argument first, the expansions folded, the status."""
    th = core.REGISTRY[result.id]
    body = [f"**{_inline(result.statement)}**"]
    if th.latex_statement:
        body.append(_display(th.latex_statement))
    body += [_display(b.latex(width=WIDTH)) for b in result.blocks if not _folded(b)]
    labels, checked = _checked_block([b for b in result.blocks if _folded(b)])
    if checked:
        summary = _inline("checked: " + "; ".join(labels))
        body += [f'<details class="minipos-checked"><summary>{summary}</summary>', *checked, "</details>"]
    checks = ", ".join(f"`{c}`" for c in result.checks) or "no minipos function (pure mathematics)"
    body.append(f"Status **{result.status}** ({result.steps} checked steps, "
                f"{result.seconds:.2f} s at build time). Checks {checks}. "
                f"Run it yourself: `python -m proofs {result.id}`.")
    head = f'!!! success "{(title or result.id).replace(chr(34), chr(39))}"'
    text = "\n\n".join(body)
    return "\n".join([head, ""] + [("    " + line) if line else "" for line in text.splitlines()]) + "\n"


def derivation(theorem_id: str, *, title: str | None = None) -> str:
    """Run ``theorem_id`` and return it as a markdown admonition with its derivation.

    theorem_id: a registered id such as ``"rope.relative.headline"``.
    title: the admonition title (default: the id).
    Raises KeyError for an unknown id and :class:`ProofNotPassed` if the theorem fails.
    """
    return _render(_run(theorem_id), title)


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
