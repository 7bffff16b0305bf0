"""What the command lines share: tables that fit the terminal, help text without reST markup, a
quiet exit when the reader of the output goes away, and one-line messages for a missing library.

Used by ``minipos`` (``minipos.cli``), ``python -m proofs`` and ``python -m benchmarks``. Standard
library only.

- ``columns()``: the terminal's width (``COLUMNS``, else the terminal, else 80), at least ``MIN_COLUMNS``.
- ``table(head, rows, width)``: the lines of a table no wider than ``width`` where it can be:
  columns too wide for it wrap inside their cells (at spaces), and ``details`` columns move out
  of the row onto indented lines under it.
- ``wrap(text, width)``: a key line wrapped to the width (at most ``PROSE_COLUMNS``), its
  continuation lines indented.
- ``plain(doc)``: a docstring's reST roles and literals as plain text (``--help`` shows no ``````).
- ``run(main)``: ``main()`` whose closed pipe (``minipos tour | head``) ends quietly, and whose output
  on a full disk is one line; exit status 1 either way.
- ``ArgumentParser``: argparse's, except that help which cannot be written is an error, not exit 0.
- ``missing_library(err, needs, install)``: the line that says which package to install.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import textwrap

__all__ = ["MIN_COLUMNS", "PROSE_COLUMNS", "columns", "table", "wrap", "plain", "run", "ArgumentParser",
           "missing_library"]

MIN_COLUMNS = 40   # narrower terminals are drawn at this width
PROSE_COLUMNS = 100  # prose (keys, notes) wraps at this width on wider terminals: long lines read badly
GAP = "  "         # between two columns


def columns() -> int:
    """The width to draw at: ``COLUMNS`` if set, else the terminal's, else 80; at least ``MIN_COLUMNS``."""
    return max(MIN_COLUMNS, shutil.get_terminal_size((80, 24)).columns)


def _longest_word(text: str) -> int:
    return max((len(w) for w in text.split()), default=0)


def _fit(natural: list, floors: list, width: int) -> list:
    """Column widths summing (with gaps) to at most ``width``: the widest column narrows first,
    none below its floor."""
    widths = list(natural)
    budget = width - len(GAP) * (len(widths) - 1)
    while sum(widths) > budget:
        shrinkable = [i for i, w in enumerate(widths) if w > floors[i]]
        if not shrinkable:
            break
        i = max(shrinkable, key=lambda j: widths[j])
        widths[i] -= 1
    return widths


def _cell_lines(text: str, width: int) -> list:
    if len(text) <= width:
        return [text]
    return textwrap.wrap(text, width, break_on_hyphens=False) or [""]


def _blocks(head: list, rows: list, width: int) -> list:
    """One list of lines per row, the head first and its rule after it, cells wrapped to fit ``width``."""
    n = len(head)
    natural = [max(len(r[i]) for r in [head, *rows]) for i in range(n)]
    floors = [max(_longest_word(r[i]) for r in [head, *rows]) for i in range(n)]
    widths = _fit(natural, floors, width)
    if sum(widths) + len(GAP) * (n - 1) > width:          # words longer than the room: break them
        widths = _fit(widths, [min(f, 4) for f in floors], width)
    blocks = []
    for row in [head, *rows]:
        cells = [_cell_lines(c, w) for c, w in zip(row, widths)]
        blocks.append([GAP.join((c[j] if j < len(c) else "").ljust(w) for c, w in zip(cells, widths)).rstrip()
                       for j in range(max(map(len, cells)))])
    blocks[0].append(GAP.join("-" * w for w in widths))
    return blocks


def table(head, rows, width: int | None = None, *, details=()) -> list:
    """The lines of a table of ``head`` (column names) and ``rows`` (sequences of str), at most
    ``width`` columns wide (default ``columns()``) where the words allow it.

    A table that fits is one line per row. One that does not first moves the ``details`` columns
    (indices) out of the table, each onto an indented line ``name: value`` under its row, then
    wraps the cells of the widest remaining columns at spaces.
    """
    width = columns() if width is None else width
    head, rows = [str(h) for h in head], [[str(c) for c in r] for r in rows]
    natural = sum(max(len(r[i]) for r in [head, *rows]) for i in range(len(head))) + len(GAP) * (len(head) - 1)
    if natural <= width or not details:
        return [line for block in _blocks(head, rows, width) for line in block]
    keep = [i for i in range(len(head)) if i not in set(details)]
    blocks = _blocks([head[i] for i in keep], [[r[i] for i in keep] for r in rows], width)
    out = blocks[0]
    for row, block in zip(rows, blocks[1:]):
        out += block
        for i in details:
            if row[i]:
                out += wrap(f"{head[i]}: {row[i]}", width, indent="    ", hang="      ")
    return out


def wrap(text: str, width: int | None = None, *, indent: str = "", hang: str = "  ") -> list:
    """``text`` as lines of at most ``width`` (default ``columns()``) and ``PROSE_COLUMNS``: the first
    indented by ``indent``, the others by ``hang`` (more than ``indent``, so that a wrapped key line
    reads as one)."""
    width = min(columns() if width is None else width, PROSE_COLUMNS)
    return textwrap.wrap(text, width, initial_indent=indent, subsequent_indent=hang, break_on_hyphens=False) or [""]


_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`(?:([^`<]*?)\s*<[^`>]*>|~?(?:[\w.]*\.)?([^`]*?))`")


def plain(doc: str) -> str:
    """A docstring (or its first paragraph) as plain text: reST roles (``:func:`x```, ``:class:`~a.B```)
    become their names, double-backtick literals and default-role text lose their backticks, and
    ``**strong**`` and ``*emphasis*`` their stars. The text is dedented and stripped."""
    text = textwrap.dedent(doc or "").strip()
    text = _ROLE.sub(lambda m: m.group(1) if m.group(1) is not None else m.group(2), text)
    text = re.sub(r"``(.+?)``", r"\1", text, flags=re.S)
    text = re.sub(r"(?<![\w`])`([^`]+)`(?![\w`])", r"\1", text)
    text = re.sub(r"\*\*(.+?)\*\*", r"\1", text)
    text = re.sub(r"(?<![\w*])\*(\S[^*]*?)\*(?![\w*])", r"\1", text)
    return re.sub(r"::$", ":", text, flags=re.M)


def run(main, argv=None, *, prog: str | None = None) -> int:
    """``main(argv)``, ending quietly when its output goes to a pipe that closed (``| head``).

    The closed pipe ends the command with exit status 1 and no traceback (what is left of the
    output is sent to the null device, so that Python's own flush at exit does not complain). Any
    other ``OSError`` that reaches here (the output on a full disk, ``> /dev/full``) is one line,
    ``<prog>: error: <reason>``, and exit status 1; Ctrl-C ends it with 130 and one line.
    """
    try:
        try:
            status = main(argv)
        except SystemExit:        # argparse's --help and usage errors: their output must reach its reader too
            sys.stdout.flush()
            raise
        sys.stdout.flush()
        return status
    except BrokenPipeError:
        _discard_stdout()
        return 1
    except OSError as err:
        _discard_stdout()
        where = f" ({err.filename})" if getattr(err, "filename", None) else ""
        print(f"{prog or os.path.basename(sys.argv[0] or 'python')}: error: {err.strerror or err}{where}",
              file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


class ArgumentParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose help and usage text raise when they cannot be written (a
    full disk, a closed pipe) instead of being dropped with exit status 0, so that ``run`` reports it."""

    def _print_message(self, message, file=None):
        if message:
            (file or sys.stderr).write(message)


def _discard_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError, AttributeError):   # a stdout without a file descriptor (captured)
        pass


def missing_library(err: ImportError, needs: str, install: str) -> str:
    """One line: ``needs`` (e.g. "python -m proofs") needs the package ``err`` names, and how to install it."""
    name = getattr(err, "name", None) or str(err)
    return f"{needs} needs the Python package {name!r}, which is not installed: {install}"
