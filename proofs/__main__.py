"""``python -m proofs [FAMILY_OR_ID_PREFIX ...] [--json | --latex]``.

Runs the selected theorems (all by default), prints a table (id, statement, steps, status,
seconds, the minipos functions checked) and the message of every failure. Exit status 0 when
every theorem passes, 1 when any fails, 2 when the selection matches nothing.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

from . import core

_COLS = ("id", "statement", "steps", "status", "seconds", "checks")


def _table(results) -> str:
    rows = [(r.id, r.statement, str(r.steps), r.status, f"{r.seconds:.2f}", ", ".join(r.checks) or "-")
            for r in results]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_COLS)]
    widths[1] = min(widths[1], 60)
    fmt = lambda row: "  ".join(  # noqa: E731
        (v if len(v) <= w else v[: w - 1] + "…").ljust(w) for v, w in zip(row, widths)).rstrip()
    return "\n".join([fmt(_COLS), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m proofs", description=__doc__.splitlines()[0])
    ap.add_argument("select", nargs="*", help="families or id prefixes (default: all)")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true", help="print a JSON list of results")
    out.add_argument("--latex", action="store_true", help="print each derivation as LaTeX")
    args = ap.parse_args(argv)

    if not core.select(args.select):
        print(f"no theorem matches {args.select}; families: "
              f"{sorted({t.family for t in core.REGISTRY.values()})}", file=sys.stderr)
        return 2
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
