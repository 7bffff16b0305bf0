"""``python -m proofs [FAMILY_OR_ID_PREFIX ...] [--json | --latex]``.

Runs the selected theorems (all by default), prints a table (id, statement, steps, status,
seconds, the minipos functions checked) that fits the terminal, a key to its columns, and the
message of every failure. On a terminal narrower than the table, the statement and the checked
functions move onto indented lines under each theorem's row. Exit status 0 when every theorem
passes, 1 when any fails, 2 (a one-line usage error) when a selector matches no theorem. A
closed pipe (``python -m proofs | head``) ends it quietly.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from minipos import terminal

from . import core

_COLS = ("id", "statement", "steps", "status", "seconds", "checks")
_DETAILS = (1, 5)   # statement and checks: under the row when the table is too wide for the terminal


def _table(results, width: int | None = None) -> str:
    """The results as a table no wider than ``width`` (default: the terminal's), then its key."""
    rows = [(r.id, r.statement, str(r.steps), r.status, f"{r.seconds:.2f}", ", ".join(r.checks) or "-")
            for r in results]
    width = terminal.columns() if width is None else width
    key = ["id: the theorem, family.name (select it, or its family, by that name). statement: what it proves.",
           "steps: the checked steps of the theorem's derivations, refutations and ties.",
           "status: PASS, or FALSE (a step does not follow), UNPROVEN (SymPy could not decide and no "
           "counterexample was found), MISMATCH (a minipos function disagrees with the mathematics), MISSING "
           "(it cannot be imported), ERROR (the proof itself raised); the message of each failure follows.",
           "seconds: the time the theorem took. checks: the minipos functions the theorem evaluates and compares "
           "(- none)."]
    lines = terminal.table(_COLS, rows, width, details=_DETAILS)
    lines += ["", "Key:"] + [w for k in key for w in terminal.wrap(k, width, indent="  ", hang="    ")]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    ap = terminal.ArgumentParser(prog="python -m proofs", description=terminal.plain(
        "Check the identities minipos rests on, symbolically (SymPy) and against minipos's own functions."))
    ap.add_argument("select", nargs="*", help="families or id prefixes, such as rope or rope.block (default: all)")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print a JSON list of results")
    out.add_argument("--latex", action="store_true", help="print each derivation as LaTeX")
    return ap


def main(argv=None) -> int:
    """Run ``python -m proofs``; return its exit status (a closed pipe ends it quietly)."""
    return terminal.run(_main, argv, prog="python -m proofs")


def _main(argv) -> int:
    ap = _parser()
    args = ap.parse_args(argv)
    unmatched = [q for q in args.select if not core.select([q])]
    if unmatched:
        families = sorted({t.family for t in core.REGISTRY.values()})
        ap.error(f"no theorem matches {', '.join(map(repr, unmatched))}; the families are {', '.join(families)}")
    t0 = time.perf_counter()
    results = core.run(args.select)
    total = time.perf_counter() - t0
    failed = [r for r in results if not r.ok]
    if args.json:
        print(json.dumps([r.as_json() for r in results], indent=2))
    elif args.latex:
        for r in results:
            print(f"% {r.id}: {r.statement}  [{r.status}]\n{core.latex_of(r)}\n")
    else:
        print(_table(results))
        print(f"\n{len(results) - len(failed)}/{len(results)} passed in {total:.2f} s")
    for r in failed:
        print(f"\n{r.message}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
