"""A griffe extension: show minipos's reStructuredText docstrings correctly in markdown.

The docstrings are plain text with a little reST (they read well in ``help()``); markdown would
run a simple table into one paragraph. Before mkdocstrings renders a docstring this turns

- a simple table (rows of ``=====  =====`` rules) into a fenced text block, columns intact;
- ``text::`` before an indented literal block into ``text:`` (the block stays a code block);
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


def _fence_tables(lines: list[str]) -> list[str]:
    out, i = [], 0
    while i < len(lines):
        if not _RULE.match(lines[i]):
            out.append(lines[i])
            i += 1
            continue
        end, rules = i, 0                     # a table ends at a rule followed by a blank line
        for j in range(i, len(lines)):
            if _RULE.match(lines[j]):
                rules += 1
                if rules >= 2 and (j + 1 == len(lines) or not lines[j + 1].strip()):
                    end = j
                    break
        else:
            end = len(lines) - 1
        indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
        out += ([""] if out and out[-1].strip() else []) + [indent + "```text"]
        out += lines[i: end + 1] + [indent + "```"]
        i = end + 1
    return out


def rst_to_markdown(text: str) -> str:
    """The markdown rendering of one reST-flavoured docstring (see the module docstring)."""
    lines = _fence_tables(text.splitlines())
    out = []
    for line in lines:
        line = _FOOTNOTE.sub(r"\1[\2]", line)
        line = _FOOTREF.sub(r"[\1]", line)
        line = _ROLE.sub(r"`\1`", line)
        if line.rstrip().endswith("::") and not line.lstrip().startswith("```"):
            stripped = line.rstrip()[:-2].rstrip()
            line = stripped + ":" if stripped else ""
        out.append(line)
    return "\n".join(out)


class RstDocstrings(griffe.Extension):
    """Rewrite each docstring with :func:`rst_to_markdown` as griffe loads it."""

    def on_instance(self, *, obj, **kwargs) -> None:
        if obj.docstring is not None:
            obj.docstring.value = rst_to_markdown(obj.docstring.value)
