"""``python -m lab``: train small models at L and test them at L..16L, every scheme, several seeds.

    python -m lab                      the full protocol (markov and retrieval, 9 schemes, seeds 0,1,2)
    python -m lab --quick              the whole pipeline on tiny settings, then sanity checks
    python -m lab --tasks markov --schemes rope,alibi --seeds 0      a slice
    python -m lab --tasks text --text FILE                           your own text, character level
    python -m lab --summarize --out DIR                              the summary of DIR's records
    python -m lab --verify lab/results/full/markov-rope-s0.json      rerun a record's command, compare

Each run writes ``<out>/<task>-<scheme>-s<seed>.json`` (see ``lab.record``), whose ``command`` field
reproduces it; ``<out>/summary.json`` (mean and spread over seeds) is recomputed from every record in
``<out>`` after the runs. Set ``MINIPOS_NUM_THREADS=1`` for bit-identical reruns (see lab/README.md).
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import fields, replace
from pathlib import Path

from . import record as records
from . import schemes as scheme_specs
from .run import QUICK, Settings, record_path, run_one
from .summary import check_sane, format_table, summarize

LISTS = {"task": "tasks", "scheme": "schemes", "seed": "seeds"}
PROTOCOL = {"tasks": ("markov", "retrieval"), "schemes": scheme_specs.ORDER, "seeds": (0, 1, 2)}
QUICK_PROTOCOL = {"tasks": ("markov", "retrieval"), "schemes": scheme_specs.ORDER, "seeds": (0,)}


def _csv(kind):
    def parse(text):
        return tuple(kind(v) for v in text.split(",") if v.strip())
    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lab", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny settings, one seed, then check the numbers are sane")
    p.add_argument("--out", default=None, help="directory of the records (default lab/results/full, or "
                                               "lab/results/quick with --quick)")
    p.add_argument("--tasks", type=_csv(str), default=None, help="comma list: markov, retrieval, text")
    p.add_argument("--schemes", type=_csv(str), default=None, help=f"comma list of {', '.join(scheme_specs.ORDER)}")
    p.add_argument("--seeds", type=_csv(int), default=None, help="comma list of seeds")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.add_argument("--verify", nargs="+", metavar="RECORD", default=None,
                   help="run nothing else: rerun each record's command into a temporary directory and compare "
                        "every number with the record (exit status 0 only if all are identical)")
    p.add_argument("--summarize", action="store_true", help="run nothing: recompute summary.json from the "
                                                            "records in --out and print it")
    for f in fields(Settings):
        if f.name in LISTS:
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            p.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None)
        elif f.name == "eval_factors":
            p.add_argument(flag, dest=f.name, type=_csv(int), default=None)
        else:
            kind = {"int": int, "float": float}.get(f.type if isinstance(f.type, str) else f.type.__name__, str)
            p.add_argument(flag, dest=f.name, type=kind, default=None)
    return p


def settings_from(args) -> tuple[Settings, dict]:
    """The base ``Settings`` (quick or default, overridden by the flags given) and the lists to run."""
    base = Settings(**QUICK) if args.quick else Settings()
    given = {f.name: getattr(args, f.name) for f in fields(Settings)
             if f.name not in LISTS and getattr(args, f.name) is not None}
    base = replace(base, **given)
    lists = dict(QUICK_PROTOCOL if args.quick else PROTOCOL)
    for key in ("tasks", "schemes", "seeds"):
        if getattr(args, key) is not None:
            lists[key] = getattr(args, key)
    if args.text and args.tasks is None:
        lists["tasks"] = ("text",)
    for name in lists["schemes"]:
        scheme_specs.default_spec(name, base.length)                     # raises on an unknown name
    return base, lists


def verify_records(paths, progress: bool = True) -> int:
    """``--verify``: rerun each record's command and print how its numbers compare with the record.

    A file that cannot be verified (unreadable, damaged, not a record, a command that fails) is a
    failed check: one line naming it and what is wrong, the unreadable ones before any rerun, and the
    other records are still verified. The status is 0 only if every record came back identical."""
    from .verify import problem, verify
    checked = [(path, problem(path)) for path in paths]
    for path, what in checked:
        if what:
            print(f"{path}: failed: {what}", flush=True)
    status = 1 if any(what for _, what in checked) else 0
    for path in [path for path, what in checked if not what]:
        start = time.perf_counter()
        try:
            result = verify(path, progress=progress)
        except (OSError, RuntimeError, ValueError) as error:
            print(f"{path}: failed: {error}", flush=True)
            status = 1
            continue
        print(f"{path} ({time.perf_counter() - start:.0f} s): {result.report()}", flush=True)
        status = status or (0 if result.identical else 1)
    return status


def main(argv=None) -> int:
    args = parser().parse_args(argv)
    if args.verify:
        return verify_records(args.verify, progress=not args.no_progress)
    base, lists = settings_from(args)
    out = Path(args.out or ("lab/results/quick" if args.quick else "lab/results/full"))
    start, problems, ran = time.perf_counter(), [], []
    for task in ([] if args.summarize else lists["tasks"]):
        for scheme in lists["schemes"]:
            for seed in lists["seeds"]:
                settings = replace(base, task=task, scheme=scheme, seed=seed)
                rec = run_one(settings, out, verbose=not args.no_progress)
                ran.append(record_path(out, settings))
                if args.quick:
                    problems += [f"{record_path(out, settings).name}: {p}" for p in check_sane(rec)]
    found = []
    for path in sorted(out.glob("*-s*.json")):
        try:
            found.append(records.read(path))
        except ValueError as error:                                      # not a record of this version
            print(f"skipping {path}: {error}", file=sys.stderr)
    summary = summarize(found)
    records.write_json(out / "summary.json", summary)
    print(format_table(summary))
    print(f"{len(ran)} runs in {time.perf_counter() - start:.0f} s; records in {out}/")
    if problems:
        print("insane numbers:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    if args.quick:
        print("quick check: every record valid, every number finite, no loss below its floor, "
              "accuracies in [0, 1], every training loss went down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
