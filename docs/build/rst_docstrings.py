"""A griffe extension: show minipos's reStructuredText docstrings correctly in markdown.

The docstrings are plain text with a little reST (they read well in ``help()``); markdown would
run a simple table into one paragraph. Before mkdocstrings renders a docstring this turns

- a simple table (rows of ``=====  =====`` rules) into a markdown table, a cell's continuation
  lines joined to it and its ````code```` spans made markdown code spans;
- ``text::`` before an indented literal block into ``text:`` (the block stays a code block, and
  the reST literal marks in it, ````x````, lose their backticks: the block shows them verbatim);
- footnotes ``.. [1] note`` and references ``[1]_`` into plain ``[1]``;
- roles such as ``:func:`name``` into code spans.

Loaded by the mkdocstrings python handler (``extensions:`` in mkdocs.yml).
"""

from __future__ import annotations

import re

import griffe

_RULE = re.compile(r"^\s*=+(\s+=+)+\s*$")
_ROLE = re.compile(r":(?:func|class|meth|mod|attr|data|exc|obj|ref):`~?([^`]+)`")
_FOOTNOTE = re.compile(r"^(\s*)\.\. \[(\w+)\]")
_FOOTREF = re.compile(r"\[(\w+)\]_")


def _table_end(lines: list[str], i: int) -> int:
    """The index of the rule that closes the simple table whose top rule is ``lines[i]``: a rule
    followed by a blank line (or the end), after at least one more rule."""
    rules = 0
    for j in range(i, len(lines)):
        if _RULE.match(lines[j]):
            rules += 1
            if rules >= 2 and (j + 1 == len(lines) or not lines[j + 1].strip()):
                return j
    return len(lines) - 1


def _join_cell(old: str, new: str) -> str:
    """A cell's continuation line joined to it; a code span broken across lines is rejoined."""
    if not old:
        return new
    if not new:
        return old
    open_span = old.count("``") % 2 == 1
    hyphenated = old.endswith("-") and new[:1].isalpha()          # position- / dependent
    glue = "" if hyphenated or (open_span and re.search(r"[\w.(\[_-]$", old)) else " "
    return old + glue + new


def _table_to_markdown(lines: list[str]) -> list[str]:
    """One reST simple table (its rule lines included) as markdown table lines."""
    indent = lines[0][: len(lines[0]) - len(lines[0].lstrip())]
    spans = [m.span() for m in re.finditer(r"=+", lines[0])]
    rows, header = [], None
    for line in lines[1:]:
        if _RULE.match(line):
            if header is None:
                header, rows = rows, []
            continue
        if not line.strip():
            continue
        cells = [line[a: (b if k + 1 < len(spans) else None)].strip() if len(line) > a else ""
                 for k, (a, b) in enumerate(spans)]
        if cells[0] or not rows:
            rows.append(cells)
        else:                                 # a continuation line: the first column is blank
            rows[-1] = [_join_cell(o, n) for o, n in zip(rows[-1], cells)]
    if header is None:                        # a table with no header rule
        header, rows = rows[:1], rows[1:]

    def md(cells):
        cells = [re.sub(r"``(.+?)``", r"`\1`", c).replace("|", "\\|") for c in cells]
        return indent + "| " + " | ".join(cells) + " |"
    head = header[0] if header else [""] * len(spans)
    for extra in header[1:]:
        head = [_join_cell(o, n) for o, n in zip(head, extra)]
    return [md(head), indent + "|" + "---|" * len(spans)] + [md(r) for r in rows]


def _convert_tables(lines: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(lines):
        if not _RULE.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        end = _table_end(lines, i)
        out += ([""] if out and out[-1].strip() else []) + _table_to_markdown(lines[i: end + 1])
        i = end + 1
    return out


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def rst_to_markdown(text: str) -> str:
    """The markdown rendering of one reST-flavoured docstring (see the module docstring)."""
    lines = _convert_tables(text.splitlines())
    out, literal = [], None                   # literal: the indent of the text that opened a literal block
    for k, line in enumerate(lines):
        if literal is not None and line.strip() and _indent(line) <= literal:
            literal = None
        if (literal is None and line.strip() and _indent(line) >= 4 and k and not lines[k - 1].strip()
                and not line.lstrip().startswith(("|", "- ", "* ", "```"))):
            literal = _indent(line) - 4       # an indented block after a blank line: markdown's code block
        if literal is not None:               # inside a literal block: shown as code, so ``x`` shows as x
            out.append(line.replace("``", ""))
            continue
        line = _FOOTNOTE.sub(r"\1[\2]", line)
        line = _FOOTREF.sub(r"[\1]", line)
        line = _ROLE.sub(r"`\1`", line)
        if line.rstrip().endswith("::") and not line.lstrip().startswith("```"):
            stripped = line.rstrip()[:-2].rstrip()
            literal = _indent(line)
            line = stripped + ":" if stripped else ""
        out.append(line)
    return "\n".join(out)


class RstDocstrings(griffe.Extension):
    """Rewrite each docstring with :func:`rst_to_markdown` as griffe loads it."""

    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
