"""Does a record's ``command`` give the record again? ``python -m lab --verify RECORD.json ...``

``problem(path)`` says what keeps a file from being verified (it cannot be read, is damaged, is not
a record, or its command is not one the lab reruns) before anything runs. ``verify(path)`` reruns
the command stored in a record, into a temporary directory instead of the record's ``--out``, with
the variables of ``lab.run.ENVIRONMENT`` the command names (thread counts, OpenBLAS's kernels) and no
other thread count (an unset variable is part of the run too), then compares the new record with the
stored one, number by number, over ``record.comparable`` (everything but wall times and versions) and without the
command's output directory. ``compare`` is that comparison on two records in memory.

A rerun on the same machine and versions should give every number back bit for bit
(``lab/README.md``, Determinism). Where it does not, the report gives the number of metrics that
moved and the largest absolute and relative differences, with the field each one is in, and
whether every number still agrees to the 3 significant digits the docs print, and, when the record
names another CPU than this machine's (or none), both: the likely cause.
"""

from __future__ import annotations

import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import record as records
from .run import ENVIRONMENT, THREAD_VARIABLES

__all__ = ["Comparison", "compare", "rerun_argv", "problem", "verify", "PRINTED_DIGITS"]

PRINTED_DIGITS = 3
"""Significant digits of the numbers the docs print."""

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")


@dataclass
class Comparison:
    """The differences between a stored record and its rerun.

    numbers: how many numbers were compared; differing: how many are not equal.
    max_abs, max_rel: ``(difference, field)`` of the largest absolute and relative difference
      (``(0.0, None)`` when every number is equal); a relative difference is
      ``|a - b| / max(|a|, |b|)``.
    mismatches: fields whose structure or non-numeric value differs (a missing key, a list of another
      length, a changed status string), each as ``"field: what"``.
    cpus: ``(the machine the record names, this machine)``, each ``"CPU model, OpenBLAS core"`` from
      ``versions``' ``cpu`` and ``blas_core`` (``record.cpu``, ``record.blas_core``); None where unknown.
    blas_cores: ``(the record's OpenBLAS core, the rerun's)``; None where unknown.
    """

    numbers: int = 0
    differing: int = 0
    max_abs: tuple = (0.0, None)
    max_rel: tuple = (0.0, None)
    mismatches: list = field(default_factory=list)
    cpus: tuple = (None, None)
    blas_cores: tuple = (None, None)

    @property
    def identical(self) -> bool:
        return self.differing == 0 and not self.mismatches

    def within(self, digits: int = PRINTED_DIGITS) -> bool:
        """Whether every number agrees to ``digits`` significant digits (relative difference below
        ``0.5 * 10^(1 - digits)``) and nothing else differs."""
        return not self.mismatches and self.max_rel[0] < 0.5 * 10.0 ** (1 - digits)

    def report(self) -> str:
        if self.identical:
            return f"identical: all {self.numbers} numbers equal, bit for bit"
        lines = [f"{self.differing} of {self.numbers} numbers differ"]
        if self.differing:
            lines.append(f"  largest absolute difference {self.max_abs[0]:.3g} at {self.max_abs[1]}")
            lines.append(f"  largest relative difference {self.max_rel[0]:.3g} at {self.max_rel[1]}")
            lines.append(f"  every number agrees to {PRINTED_DIGITS} significant digits: "
                         f"{'yes' if self.within() else 'no'}")
        lines += [f"  {m}" for m in self.mismatches[:20]]
        if len(self.mismatches) > 20:
            lines.append(f"  ... and {len(self.mismatches) - 20} more structural differences")
        written, here = self.cpus
        if written is None or written != here:
            lines.append(f"  the record was written on {written or 'a CPU it does not name'}, rerun on "
                         f"{here or 'a CPU this machine does not name'}: the BLAS picks its kernels by CPU, "
                         "and other kernels can move the last bits (lab/README.md, Determinism)")
            if self.blas_cores[0] and self.blas_cores[0] != self.blas_cores[1]:
                lines.append(f"  to rerun with the record's kernels: OPENBLAS_CORETYPE={self.blas_cores[0]} "
                             "python -m lab --verify ...")
        return "\n".join(lines)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _walk(expected, got, where: str, out: Comparison) -> None:
    if isinstance(expected, dict) and isinstance(got, dict):
        for key in sorted(set(expected) | set(got)):
            if key not in got:
                out.mismatches.append(f"{where}.{key}: missing from the rerun")
            elif key not in expected:
                out.mismatches.append(f"{where}.{key}: only in the rerun")
            else:
                _walk(expected[key], got[key], f"{where}.{key}", out)
    elif isinstance(expected, list) and isinstance(got, list):
        if len(expected) != len(got):
            out.mismatches.append(f"{where}: {len(expected)} entries in the record, {len(got)} in the rerun")
        for i, (a, b) in enumerate(zip(expected, got)):
            _walk(a, b, f"{where}[{i}]", out)
    elif _is_number(expected) and _is_number(got):
        out.numbers += 1
        if expected == got:
            return
        out.differing += 1
        diff = abs(expected - got)
        rel = diff / max(abs(expected), abs(got))
        if diff > out.max_abs[0] or out.max_abs[1] is None:
            out.max_abs = (diff, where)
        if rel > out.max_rel[0] or out.max_rel[1] is None:
            out.max_rel = (rel, where)
    elif expected != got or type(expected) is not type(got):
        out.mismatches.append(f"{where}: {expected!r} in the record, {got!r} in the rerun")


def compare(expected: dict, got: dict) -> Comparison:
    """Every number of ``records.comparable(expected)`` against ``got``'s, the ``command`` left out
    (it names the output directory). ``expected`` and ``got`` are records as JSON gives them."""
    if not isinstance(expected, dict) or not isinstance(got, dict):
        raise TypeError(f"expected and got must be records (dicts), got {type(expected).__name__} and "
                        f"{type(got).__name__}")
    a, b = records.comparable(expected), records.comparable(got)
    a.pop("command", None)
    b.pop("command", None)
    out = Comparison()
    _walk(a, b, "record", out)
    for diff, where in (out.max_abs, out.max_rel):
        if where is not None and not math.isfinite(diff):
            out.mismatches.append(f"{where}: not a finite difference")
    return out


def rerun_argv(command: str, out_dir) -> tuple[dict, list]:
    """``(environment, argv)`` that run a record's ``command`` into ``out_dir``: the ``ENVIRONMENT``
    variables it sets (every other thread count removed from this process's environment; an
    ``OPENBLAS_CORETYPE`` set here is kept unless the command names the kernels, since a record that
    names none was made with its machine's choice, which ``versions.blas_core`` says) and the
    ``python -m lab`` arguments with ``--out out_dir``, run by this interpreter."""
    if not isinstance(command, str):
        raise TypeError(f"command must be a string, got {type(command).__name__}")
    try:
        words = shlex.split(command)
    except ValueError as error:                                           # an unclosed quote, say
        raise ValueError(f"command is not a shell command line ({error}): {command!r}") from None
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    while words and _ASSIGNMENT.match(words[0]):
        name, value = words.pop(0).split("=", 1)
        if name not in ENVIRONMENT:
            raise ValueError(f"command sets {name}, which is not one of the variables a record's command "
                             f"may set ({', '.join(ENVIRONMENT)}): {command!r}")
        env[name] = value
    if words[:3] != ["python", "-m", "lab"] or "--out" not in words[3:-1]:
        raise ValueError(f"command must be 'python -m lab --out DIR ...' after its variables, got {command!r}")
    args = words[3:]
    args[args.index("--out") + 1] = str(out_dir)
    return env, [sys.executable, "-m", "lab", *args]


def problem(path) -> str | None:
    """What keeps the record at ``path`` from being verified, in a few words, or None: it cannot be
    read, it is not a record (``record.read``), or its command is not one ``rerun_argv`` runs."""
    try:
        rerun_argv(records.read(path)["command"], "OUT")
    except OSError as error:
        return f"cannot be read ({error.strerror or error})"
    except ValueError as error:
        return str(error)
    return None


def verify(path, *, progress: bool = True) -> Comparison:
    """Rerun the command of the record at ``path`` in a temporary directory and ``compare`` the new
    record with it. The rerun's progress goes to stderr (``progress=False``: ``--no-progress``)."""
    stored = records.read(path)
    root = Path(__file__).resolve().parent.parent                     # python -m lab runs from the checkout
    with tempfile.TemporaryDirectory(prefix="lab-verify-") as tmp:
        env, argv = rerun_argv(stored["command"], tmp)
        if not progress:
            argv.append("--no-progress")
        done = subprocess.run(argv, env=env, cwd=root, stdout=subprocess.DEVNULL)
        if done.returncode != 0:
            raise RuntimeError(f"the record's command failed (exit status {done.returncode}): {shlex.join(argv)}")
        s = stored["settings"]
        again = Path(tmp) / f"{s['task']}-{s['scheme']}-s{s['seed']}.json"
        if not again.is_file():
            raise RuntimeError(f"the record's command wrote no {again.name}: {shlex.join(argv)}")
        rerun = records.read(again)
    out = compare(stored, rerun)
    out.cpus = (_machine(stored["versions"]), _machine(rerun["versions"]))
    out.blas_cores = (stored["versions"].get("blas_core"), rerun["versions"].get("blas_core"))
    return out


def _machine(versions: dict) -> str | None:
    """``"AMD EPYC, OpenBLAS core Haswell"`` from a record's ``versions``, or None if it names neither."""
    parts = [versions.get("cpu"), versions.get("blas_core") and f"OpenBLAS core {versions['blas_core']}"]
    return ", ".join(p for p in parts if p) or None
