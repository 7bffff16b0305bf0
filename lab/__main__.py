"""``python -m lab``: train small models at L and test them at L..16L, every scheme, several seeds.

    python -m lab                      the full protocol (markov, retrieval, text, prose; every scheme; each
                                       task's seeds: 0-4 for markov and retrieval, 0-2 for text and prose)
    python -m lab --quick              the whole pipeline on tiny settings, then sanity checks
    python -m lab --tasks markov --schemes rope,alibi --seeds 0      a slice
    python -m lab --tasks text --text FILE                           your own text, character level
    python -m lab --print-commands                                   one command per record, for a scheduler
    python -m lab --summarize --out DIR                              the summary of DIR's records
    python -m lab --verify lab/results/full/markov-rope-s0.json      rerun a record's command, compare

Each run writes ``<out>/<task>-<scheme>-s<seed>.json`` (see ``lab.record``), whose ``command`` field
reproduces it; ``<out>/summary.json`` (mean and spread over seeds) is recomputed from every record in
``<out>`` after the runs. One run goes in this process; several go side by side, one process each
with one thread, ``--jobs`` at a time (``lab.pool``; default: the cores).

A command line the lab cannot carry out is a one-line usage error (exit status 2) before any run:
the parser holds each option's range or choices, and ``plan`` checks what the values mean together
(the tasks and models are built, the texts and ``--out`` tried, the memory counted).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from minipos import terminal
from minipos.terminal import plain

from . import corpus
from . import record as records
from . import schemes as scheme_specs
from .model import ACTIVATIONS, Model
from .pool import commands, default_jobs, run_all
from .run import QUICK, TASK_DEFAULTS, TASK_SEEDS, Settings, record_path, run_one
from .summary import check_sane, format_table, summarize

LISTS = {"task": "tasks", "scheme": "schemes", "seed": "seeds"}
TASKS = ("markov", "retrieval", "text", "prose")
PROTOCOL = {"tasks": TASKS, "schemes": scheme_specs.NAMES, "seeds": None}     # seeds: each task's TASK_SEEDS
QUICK_PROTOCOL = {"tasks": ("markov", "retrieval"), "schemes": scheme_specs.ORDER, "seeds": (0,)}

AT_LEAST = {"seeds": 0, "length": 1, "eval_factors": 1, "d_model": 1, "num_heads": 1, "num_layers": 1, "d_ff": 1,
            "steps": 1, "batch": 1, "warmup": 0, "plateau_every": 1, "plateau_sequences": 1,
            "plateau_min_window": 1, "vocab": 2, "order": 1, "source_seed": 0, "keys": 1,
            "values": 2, "filler": 1, "pairs": 1, "eval_tokens": 1, "eval_sequences": 2, "eval_batch_tokens": 1,
            "probes": 2, "checkpoints": 1, "history_tokens": 1, "history_probes": 2,
            "attention_sequences": 1, "position_bins": 1, "finetune_steps": 1, "finetune_factor": 1}
"""The least value of each integer setting (and of each entry of ``--seeds`` and ``--eval-factors``)."""

FLOATS = {"lr": (0, None, True), "finetune_lr": (0, None, True), "temperature": (0, None, True),
          "min_lr_ratio": (0, 1, False), "weight_decay": (0, None, False), "clip": (0, None, False),
          "plateau_window": (0, 1, True), "plateau_relative": (0, None, False), "plateau_absolute": (0, None, False),
          "cooldown": (0, None, False)}
"""``(low, high or None, low excluded)`` of each float setting; every float must be finite."""

CHOICES = {"norm": ("layernorm", "rmsnorm"), "activation": tuple(ACTIVATIONS), "schedule": ("plateau", "budget", "cosine", "constant"),
           "structure": ("additive", "full"), "binding": ("fused", "adjacent")}


class UsageError(ValueError):
    """A command line the lab refuses; ``main`` reports it as argparse does (one line, exit status 2)."""


AT_MOST = 2**63 - 1
"""The largest value of any integer setting: NumPy's int64 holds no larger one (a size that fits it but
not the machine is refused by the memory check)."""


def _integer(least: int):
    def parse(text):
        try:
            value = int(text)
        except ValueError:
            value = None
        if value is None or value < least:
            raise argparse.ArgumentTypeError(f"must be an integer >= {least}, got {text!r}")
        if value > AT_MOST:
            raise argparse.ArgumentTypeError(f"must be an integer <= {AT_MOST} (2**63 - 1), got {text!r}")
        return value
    return parse


def _rule(low, high, low_excluded) -> str:
    if high is not None:
        return f"in ({low}, {high}]" if low_excluded else f"in [{low}, {high}]"
    return f"> {low}" if low_excluded else f">= {low}"


def _number(low, high, low_excluded):
    rule = _rule(low, high, low_excluded)

    def parse(text):
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and (value > low if low_excluded else value >= low)
                and (high is None or value <= high)):
            raise argparse.ArgumentTypeError(f"must be a finite number {rule}, got {text!r}")
        return value
    return parse


def _name(allowed):
    def parse(text):
        if text not in allowed:
            raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(allowed)}")
        return text
    return parse


def _csv(item, *, increasing: bool = False):
    """A comma list of ``item``s: at least one, none twice (and, if ``increasing``, each larger than the last)."""
    def parse(text):
        words = [v.strip() for v in text.split(",")]
        if not any(words):
            raise argparse.ArgumentTypeError(f"needs at least one entry, got {text!r}")
        if not all(words):
            raise argparse.ArgumentTypeError(f"has an empty entry (two commas, or one at an end), got {text!r}")
        values = tuple(item(v) for v in words)
        twice = sorted({v for v in values if values.count(v) > 1}, key=str)
        if twice:
            raise argparse.ArgumentTypeError(f"lists {', '.join(map(str, twice))} more than once")
        if increasing and list(values) != sorted(values):
            raise argparse.ArgumentTypeError(f"must increase, got {text!r}")
        return values
    return parse


def _path(text):
    if not text:
        raise argparse.ArgumentTypeError("must name a path, got ''")
    return text


class _Once(argparse.Action):
    """Store an option's value, refusing it a second time (``--seeds 0 --seeds 1`` is not seed 1)."""

    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest) is not None:
            raise argparse.ArgumentError(self, "given more than once")
        setattr(namespace, self.dest, values)


class _OnceBool(argparse.BooleanOptionalAction):
    def __call__(self, parser, namespace, values, option_string=None):
        if getattr(namespace, self.dest) is not None:
            raise argparse.ArgumentError(self, "given more than once")
        super().__call__(parser, namespace, values, option_string)


def parser() -> argparse.ArgumentParser:
    p = terminal.ArgumentParser(prog="python -m lab", usage="%(prog)s [options]  (--help lists them)",
                                description=plain(__doc__.split("\n\n")[0]),   # --help without reST
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny settings, one seed, then check the numbers are sane")
    p.add_argument("--out", action=_Once, type=_path, default=None,
                   help="directory of the records (default lab/results/full, or a new temporary folder with --quick); "
                        "made and checked writable before any run")
    p.add_argument("--tasks", action=_Once, type=_csv(_name(TASKS)), default=None,
                   help=f"comma list of {', '.join(TASKS)}")
    p.add_argument("--schemes", action=_Once, type=_csv(_name(scheme_specs.NAMES)), default=None,
                   help=f"comma list of {', '.join(scheme_specs.NAMES)}")
    p.add_argument("--seeds", action=_Once, type=_csv(_integer(AT_LEAST["seeds"])), default=None,
                   help="comma list of seeds (integers >= 0)")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.add_argument("--no-summary", action="store_true", help="write the records only, not summary.json")
    p.add_argument("--jobs", action=_Once, type=_integer(1), default=None,
                   help="runs side by side, one process each (default: the cores)")
    p.add_argument("--print-commands", action="store_true",
                   help="run nothing: print the command of each record the other options select")
    p.add_argument("--verify", action=_Once, type=_path, nargs="+", metavar="RECORD", default=None,
                   help="run nothing else: rerun each record's command into a temporary directory and compare "
                        "every number with the record (exit status 0 only if all are identical)")
    p.add_argument("--summarize", action="store_true", help="run nothing: recompute summary.json from the "
                                                            "records in --out and print it")
    for f in fields(Settings):
        if f.name in LISTS:
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            p.add_argument(flag, dest=f.name, action=_OnceBool, default=None)
        elif f.name == "eval_factors":
            p.add_argument(flag, dest=f.name, action=_Once, type=_csv(_integer(AT_LEAST[f.name]), increasing=True),
                           default=None, help=f"comma list of increasing integers >= {AT_LEAST[f.name]}")
        elif f.name in CHOICES:
            p.add_argument(flag, dest=f.name, action=_Once, choices=CHOICES[f.name], default=None)
        elif f.name in AT_LEAST:
            p.add_argument(flag, dest=f.name, action=_Once, type=_integer(AT_LEAST[f.name]), default=None,
                           help=f"an integer >= {AT_LEAST[f.name]}")
        elif f.name in FLOATS:
            low, high, excluded = FLOATS[f.name]
            p.add_argument(flag, dest=f.name, action=_Once, type=_number(low, high, excluded), default=None,
                           help="a number " + _rule(low, high, excluded))
        elif f.name == "text":
            p.add_argument(flag, dest=f.name, action=_Once, type=_path, default=None, metavar="FILE",
                           help="a UTF-8 text file (task text)")
        else:
            raise TypeError(f"setting {f.name} has no rule on the command line: add it to AT_LEAST, FLOATS or CHOICES")
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
    if args.text and tuple(lists["tasks"]) != ("text",):
        raise UsageError(f"--text FILE is read by the task text alone; got --tasks {','.join(lists['tasks'])}")
    for name in lists["schemes"]:
        scheme_specs.default_spec(name, base.length)                     # raises on an unknown name
    return base, lists


def for_task(base: Settings, task: str, args) -> Settings:
    """``base`` for ``task``: with the task's own defaults (``TASK_DEFAULTS``) where no flag set the
    value and the run is not ``--quick``."""
    own = {} if args.quick else {name: value for name, value in TASK_DEFAULTS.get(task, {}).items()
                                 if getattr(args, name) is None}
    return replace(base, task=task, **own)


# ----------------------------------------------------------------------------- checks before any work

def _given(args) -> list[str]:
    """The options given on the command line (``--no-progress`` aside), as their flags."""
    flags = [f"--{name.replace('_', '-')}" for name in ("quick", "summarize", "print_commands", "no_summary")
             if getattr(args, name)]
    for name in ["out", "tasks", "schemes", "seeds", "verify", "jobs"] + [f.name for f in fields(Settings)]:
        value = getattr(args, name, None)
        if value is not None:
            flags.append(("--no-" if value is False else "--") + name.replace("_", "-"))
    return flags


def _alone(args, option: str, allowed: tuple, what: str) -> None:
    extra = [f for f in _given(args) if f != option and f not in allowed]
    if extra:
        raise UsageError(f"{option} {what}; got {', '.join(extra)}")


def _build(what: str, make, *args, **kwargs):
    """``make(*args, **kwargs)``, its refusal of the settings a usage error naming ``what``."""
    try:
        return make(*args, **kwargs)
    except OSError as error:
        raise UsageError(f"{what}: {error.strerror or error}" + (f": {error.filename}" if error.filename else "")) from None
    except (ValueError, TypeError, RuntimeError) as error:
        raise UsageError(f"{what}: {error}") from None


def _memory() -> int | None:
    """This machine's physical memory in bytes, or None where the system does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


def _fits_memory(s: Settings, vocab: int) -> None:
    """Refuse a run that needs more memory than the machine has, counting only arrays it certainly holds
    (float32, 4 bytes a number): a run that fits may still need several times this."""
    have = _memory()
    if have is None:
        return
    d, f, H, N = s.d_model, s.d_ff, s.num_heads, s.num_layers
    longest = max(s.lengths()) if s.scheme != "learned" else s.length           # learned cannot run past L
    if s.scheme == "rope" and s.extensions:
        longest = max(longest, s.finetune_factor * s.length)
    parts = {"--d-model, --d-ff, --num-layers: the parameters, their gradients and AdamW's moments":
             16 * (vocab * d * (1 if s.tied else 2) + N * (4 * d * d + 2 * d * f)),
             "--batch, --length: a training batch's logits": 4 * s.batch * s.length * vocab,
             f"--length, --eval-factors: each head's {longest} x {longest} attention weights at length {longest}":
             4 * N * H * longest ** 2}
    if s.task == "markov":
        parts["the Markov source's tables"] = 16 * s.vocab ** (s.order + 1)
    if s.task == "retrieval":
        parts["the retrieval probes"] = 8 * s.probes * longest
    else:
        parts["the evaluation's token losses"] = 8 * max(s.eval_tokens, s.eval_sequences * longest)
    need = sum(parts.values())
    if need > have:
        most = max(parts, key=parts.get)
        raise UsageError(f"--tasks {s.task} --schemes {s.scheme}: these settings need at least {need / 2**30:.3g} GiB "
                         f"of memory, more than this machine's {have / 2**30:.3g} GiB ({most}: "
                         f"{parts[most] / 2**30:.3g} GiB)")


def _fits_lengths(s: Settings, task, schemes) -> None:
    """Refuse a task that cannot give sequences of every length the run trains or evaluates at."""
    if s.task == "retrieval" and task.write_block + task.read_block > s.length + 1:
        raise UsageError(f"--length {s.length} cannot hold the retrieval task's write block ({task.write_block} "
                         f"tokens) and read block ({task.read_block}): --length must be at least "
                         f"{task.write_block + task.read_block - 1}")
    if s.task in ("text", "prose"):
        train = s.length * (s.finetune_factor if "rope" in schemes and s.extensions else 1)
        for split, length in (("train", train), ("heldout", max(s.lengths()))):
            if not task.fits(length, split):
                raise UsageError(f"--text {s.text}: its {split} part has {len(getattr(task, split))} characters, "
                                 f"fewer than the {length + 1} a sequence of {length} needs: give a longer text "
                                 f"or a smaller --length or --eval-factors")


def check_runs(base: Settings, lists: dict) -> None:
    """Refuse (``UsageError``) settings that no run of ``lists`` could finish, before any starts: a task
    or model its own constructor refuses, sequences the task cannot give, or more memory than the
    machine has. The only computing is one pass of each model over two tokens (some schemes check the
    head size only there)."""
    for name in lists["tasks"]:
        s = replace(base, task=name)
        if name == "prose" and corpus.prose_missing() is not None:
            continue                                # check_prepared names it, after every flag is checked
        if name == "markov" and (s.order > 20 or s.vocab ** s.order > 1 << 20):           # before building it
            raise UsageError(f"--vocab {s.vocab} --order {s.order}: a Markov source has vocab**order contexts, "
                             f"at most 2**20")
        what = "--text" if name == "text" and s.text else f"--tasks {name}"       # the error names the file
        task = None if name == "markov" else _build(what, s.make_task)
        for scheme in lists["schemes"]:
            _fits_memory(replace(s, scheme=scheme), s.vocab if task is None else task.vocab_size)
        task = task or _build(what, s.make_task)
        _fits_lengths(s, task, lists["schemes"])
    tokens = np.zeros((1, min(base.length, 2)), np.int64)
    for scheme in lists["schemes"]:
        spec = scheme_specs.default_spec(scheme, base.length)
        model = _build(f"--schemes {scheme}", Model, base.model_config(2, spec))   # the vocabulary changes nothing
        _build(f"--schemes {scheme}", model.forward, tokens, tokens, keep=False)   # what only a pass checks
        if scheme == "rope" and base.extensions:
            for kind in scheme_specs.EXTENSIONS:
                for n in base.lengths():
                    _build(f"RoPE's {kind} extension at length {n}", scheme_specs.build,
                           scheme_specs.extension_spec(kind, base.length, n / base.length))


def check_prepared(lists: dict) -> None:
    """Refuse a run of the prose task before its corpus is prepared, naming the command that prepares it (made
    after the flags' checks, so that a mistake in a flag is reported first; ``--print-commands`` runs nothing and
    needs no corpus)."""
    missing = corpus.prose_missing() if "prose" in lists["tasks"] else None
    if missing is not None:
        raise UsageError(f"--tasks prose: the prose corpus is not prepared ({missing} is missing): python -m "
                         "lab.corpus fetch")


def check_out(out: Path) -> None:
    """Refuse an ``--out`` the records cannot be written into: make the directory, then write and
    remove a probe file in it."""
    try:
        if out.exists() and not out.is_dir():
            raise UsageError(f"--out {out}: not a directory")
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot make the directory ({error.strerror or error})") from None
    try:
        fd, probe = tempfile.mkstemp(prefix=".lab-probe-", suffix=".tmp", dir=out)
        try:
            os.write(fd, b"probe\n")
        finally:
            os.close(fd)
            os.unlink(probe)
    except OSError as error:
        raise UsageError(f"--out {out}: cannot write there ({error.strerror or error})") from None


def plan(args) -> tuple[Settings, dict, Path]:
    """``(base settings, lists, out)`` of a command line that trains or summarizes, every check made
    before any work; ``UsageError`` says what is wrong."""
    if args.summarize:
        _alone(args, "--summarize", ("--out", "--quick"),
               "runs nothing: it takes only --out (or --quick, for lab/results/quick) and --no-progress")
    base, lists = settings_from(args)
    if args.out or not args.quick:
        out = Path(args.out or "lab/results/full")
    else:   # --quick: a new temporary folder, never the tracked records (--out lab/results/quick remakes those)
        out = Path("lab/results/quick" if args.summarize else tempfile.mkdtemp(prefix="minipos-lab-quick-"))
    if args.summarize:
        if not out.is_dir():
            raise UsageError(f"--out {out}: {'not a' if out.exists() else 'no such'} directory to summarize")
        if not any(out.glob("*-s*.json")):
            raise UsageError(f"--out {out}: holds no records (<task>-<scheme>-s<seed>.json) to summarize")
    else:
        check_runs(base, lists)
    made = [d for d in (out, *out.parents) if not d.exists()]          # the folders check_out makes, deepest first
    check_out(out)
    if not args.summarize and not args.print_commands:
        try:
            check_prepared(lists)
        except UsageError:
            for folder in made:                                          # refused: leave no folder behind
                folder.rmdir()
            raise
    return base, lists, out


def read_records(out: Path, *, strict: bool) -> list:
    """Every record in ``out`` (``<task>-<scheme>-s<seed>.json``), each read and validated (``record.read``)
    and named for its own run. ``strict`` (``--summarize``): the first file that is not such a record is a
    ``UsageError`` naming it; otherwise (the summary after a run, beside records of other versions) it is
    skipped with one line on stderr."""
    found = []
    for path in sorted(out.glob("*-s*.json")):
        try:
            rec = records.read(path)
            s = rec["settings"]
            if path.name != f"{s['task']}-{s['scheme']}-s{s['seed']}.json":
                raise ValueError(f"holds the run {s['task']}-{s['scheme']}-s{s['seed']}, not the one its name says")
        except (OSError, ValueError) as error:                           # not a record of this version
            reason = error.strerror if isinstance(error, OSError) and error.strerror else error
            if strict:
                raise UsageError(f"--out {out}: {path.name}: {reason}") from None
            print(f"skipping {path}: {reason}", file=sys.stderr)
            continue
        found.append(rec)
    return found


def summary_of(found: list, out: Path) -> dict:
    """``summarize(found)``; records it cannot summarize together (a run twice) are a ``UsageError``."""
    if not found:
        raise UsageError(f"--out {out}: holds no record that can be read, so no summary")
    try:
        return summarize(found)
    except ValueError as error:
        raise UsageError(f"--out {out}: {error}") from None


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
    """Run ``python -m lab``; return its exit status (a closed pipe ends it quietly, a full disk in one line)."""
    return terminal.run(_main, argv, prog="python -m lab")


def _main(argv) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:
        if args.verify:
            _alone(args, "--verify", (), "reruns each record's own command: it takes no other option but --no-progress")
            resolved = [Path(v).resolve() for v in args.verify]
            twice = sorted({v for v, r in zip(args.verify, resolved) if resolved.count(r) > 1})
            if twice:
                raise UsageError(f"--verify lists {', '.join(twice)} more than once")
        else:
            base, lists, out = plan(args)
            if args.summarize:
                summary = summary_of(read_records(out, strict=True), out)
    except UsageError as error:
        p.error(str(error))
    if args.verify:
        return verify_records(args.verify, progress=not args.no_progress)
    runs = [] if args.summarize else [replace(for_task(base, task, args), scheme=scheme, seed=seed)
                                       for task in lists["tasks"] for scheme in lists["schemes"]
                                       for seed in (lists["seeds"] or TASK_SEEDS[task])]
    if args.print_commands:
        print("\n".join(commands(runs, out)))
        return 0
    start, problems, ran = time.perf_counter(), [], []
    try:
        if len(runs) == 1 or args.jobs == 1:
            for settings in runs:
                run_one(settings, out, verbose=not args.no_progress)
                ran.append(record_path(out, settings))
        elif runs:
            jobs = min(args.jobs or default_jobs(), len(runs))
            print(f"python -m lab: {len(runs)} runs, {jobs} side by side, records in {out}/", file=sys.stderr)
            for settings, status, _ in run_all(runs, out, jobs=jobs, report=lambda line: print(line, file=sys.stderr)):
                if status == 0:
                    ran.append(record_path(out, settings))
                else:
                    problems.append(f"{record_path(out, settings).name}: its run failed (exit status {status})")
    except KeyboardInterrupt:
        print(f"python -m lab: interrupted; the {len(ran)} records written stand in {out}/", file=sys.stderr)
        return 130
    except (ArithmeticError, ValueError) as error:                       # a training that diverged, say
        print(f"python -m lab: {record_path(out, settings).name} stopped: {error}", file=sys.stderr)
        return 1
    if args.quick:
        for path in ran:
            problems += [f"{path.name}: {p}" for p in check_sane(records.read(path))]
    if args.no_summary:
        if problems:
            print("\n".join(problems), file=sys.stderr)
        return 1 if problems else 0
    if not args.summarize:
        try:
            summary = summary_of(read_records(out, strict=False), out)
        except UsageError as error:
            print(f"python -m lab: {error}", file=sys.stderr)
            return 1
    records.write_json(out / "summary.json", summary)                  # OSError (a full disk): one line, by run
    print(format_table(summary))
    print(f"{len(ran)} runs in {time.perf_counter() - start:.0f} s; records in {out}/")
    if problems:
        print("insane numbers:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    if args.quick and ran:
        print("quick check: every record valid, every number finite, no loss below its floor, "
              "accuracies in [0, 1], every training loss went down")
    return 0


if __name__ == "__main__":
    sys.exit(main())
