"""The machinery of minipos's bad-input campaigns: what a hostile call must do, how its outcome is
classified, how a command line is run, and the hostile files and disks it meets.

``tools/campaign.py`` (the generated campaign over the registry, the seams, the readers and the
commands) and the tests ``tests/test_campaign_*.py`` import it as ``tools.hostile``, with the
repository root on ``sys.path`` as every test and tool already needs it to import ``minipos``. It
lives in ``tools/`` and not in ``minipos/`` because it is not part of the reference: the package
ships NumPy code a learner reads, and this module monkeypatches ``os.write``, forks interpreters
under memory limits and makes FIFOs. It lives beside the campaign that runs it rather than in
``tests/`` because a tool should not import the test suite.

An expectation is one of: ``Named(words)``, a ``ValueError``/``TypeError`` (or the listed types)
whose one-line message holds every one of ``words``; ``Reported(words)``, a result that reports the
problem; ``Ok(check)``, a finite result that passes ``check``. For a command line: ``Usage(words)``,
a non-zero exit with one error line holding ``words`` and no traceback; ``Runs(check)``, exit 0 and
output that passes ``check``; ``Fails(check)``, a non-zero exit without a traceback whose output
passes ``check``; ``Quiet()``, a command whose stdout is a closed pipe ends without a word on stderr.

``classify`` sorts a call into *clear* (refused, naming the problem), *accepted* (correct result),
*silent* (a result where an error belongs, a wrong result, NaN or inf, or a refused call that
changed state), *crash* (a traceback, a hang, an internal error type such as ``KeyError``,
``AttributeError``, ``RecursionError``, ``MemoryError`` or a raw ``OSError``) and *vague* (refused
without naming the problem, or a valid input refused).
"""

from __future__ import annotations

import atexit
import contextlib
import copy
import errno
import io
import itertools
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

import numpy as np

from minipos import safe_io

ROOT = pathlib.Path(__file__).resolve().parents[1]
INTERNAL = (KeyError, AttributeError, IndexError, RecursionError, MemoryError, OSError, ZeroDivisionError,
            AssertionError, NotImplementedError, TimeoutError, UnicodeError, LookupError)


# --------------------------------------------------------------------------- what a call must do

@dataclass
class Named:
    """The call raises one of ``exc`` whose one-line message holds every one of ``words``."""
    words: tuple | str
    exc: tuple | type = (ValueError, TypeError)

    def fault(self, err: BaseException) -> str:
        """Why ``err`` (one of ``exc``) is not the refusal expected, or ``""``."""
        text = f"{type(err).__name__}: {err}"
        if "\n" in str(err).strip():
            return f"more than one line: {text[:300]}"
        missing = [w for w in _words(self.words) if w not in str(err)]
        return f"does not say {missing}: {text[:300]}" if missing else ""


@dataclass
class Reported:
    """The call returns a report of the problem: ``text(result)`` holds ``words``."""
    words: str
    text: Callable = lambda result: "\n".join(map(str, result))


@dataclass
class Ok:
    """The call returns; every float array in the result is finite and ``check(result)`` passes: it
    returns a true value, or ``None`` when it is written with asserts (an ``AssertionError`` fails it)."""
    check: Callable = lambda result: True

    def wrong(self, result) -> str:
        """Why ``result`` is wrong, or ``""``."""
        for a in arrays(result):
            if a.dtype.kind in "fc" and not np.isfinite(a).all():
                return "a result holds NaN or inf"
        try:
            verdict = self.check(result)
        except AssertionError as err:
            return f"wrong result: {err}"
        return "" if verdict is None or verdict else f"wrong result: {str(result)[:300]}"


def close_to(want, rtol=1e-12, atol=1e-12, dtype=None):
    """A check for ``Ok``: the result (the first of a tuple) is ``want`` (or ``want()``) within ``rtol`` and
    ``atol``, and of ``dtype`` if given."""
    def check(got):
        got = got[0] if isinstance(got, tuple) else got
        if dtype is not None:
            assert got.dtype == dtype, f"dtype {got.dtype}, expected {dtype}"
        w = want() if callable(want) else want
        np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(w, np.float64), rtol=rtol, atol=atol)
    return check


@dataclass
class Usage:
    """A command line that exits non-zero with one error line holding every one of ``words``, and no traceback."""
    words: tuple | str


@dataclass
class Runs:
    """A command line that exits 0 with output ``(out, err)`` that passes ``check``."""
    check: Callable = lambda out, err: True


@dataclass
class Fails:
    """A command line that exits non-zero, without a traceback, with output ``(out, err)`` that passes ``check``
    (a report of several problems, one line each)."""
    check: Callable = lambda out, err: True


@dataclass
class Quiet:
    """A command whose stdout is a closed pipe: it ends without a word on stderr and no traceback."""


@dataclass
class Cli:
    """What a command line did: its exit status and its output."""
    code: int
    out: str
    err: str


class StateChanged(Exception):
    """A refused call left something changed (a registry entry, a file)."""


class WouldTrain(Exception):
    """A lab command line of the campaign got as far as training: the campaign never trains."""


class _Hang(Exception):
    pass


def _words(w) -> tuple:
    return (w,) if isinstance(w, str) else tuple(w)


def arrays(result):
    """Every NumPy array inside ``result`` (dicts, tuples and lists walked)."""
    if isinstance(result, dict):
        return [a for v in result.values() for a in arrays(v)]
    if isinstance(result, (tuple, list)):
        return [a for v in result for a in arrays(v)]
    return [result] if isinstance(result, np.ndarray) else []


# --------------------------------------------------------------------------- classifying a call

@contextlib.contextmanager
def deadline(seconds: int = 90):
    """Raise ``_Hang`` if the block runs ``seconds`` (a blocked open or read is interrupted too). Generous:
    on a loaded machine a first import of torch or of every proof, or a subprocess, takes its time; a
    reader blocked on a FIFO waits forever, so a regression still fails."""
    def alarm(signum, frame):
        raise _Hang(f"no answer after {seconds} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def classify(call, expect, seconds: int = 90) -> tuple[str, str]:
    """``(class, detail)`` of one call: clear, accepted, silent, crash or vague."""
    try:
        with deadline(seconds):
            result = call()
    except _Hang as err:
        return "crash", f"hang: {err}"
    except StateChanged as err:
        return "silent", f"a refused call changed state: {err}"
    except WouldTrain as err:
        return ("silent" if isinstance(expect, (Named, Usage)) else "crash"), str(err)
    except BaseException as err:                                # noqa: BLE001 - every exception is judged
        if isinstance(err, KeyboardInterrupt):
            raise
        text = f"{type(err).__name__}: {err}"
        if isinstance(expect, Named) and isinstance(err, expect.exc):
            fault = expect.fault(err)
            return ("vague", fault) if fault else ("clear", text[:200])
        if isinstance(err, INTERNAL) or not isinstance(err, (ValueError, TypeError)):
            return "crash", text[:400]
        return "vague", (f"refused a valid input: {text[:300]}" if isinstance(expect, (Ok, Runs, Reported))
                         else text[:300])
    if isinstance(result, Cli):
        return _classify_cli(result, expect)
    if isinstance(expect, Named):
        return "silent", f"expected an error saying {expect.words!r}, got {str(result)[:200]}"
    if isinstance(expect, Reported):
        text = expect.text(result)
        if not text:
            return "silent", f"expected a report saying {expect.words!r}, got nothing"
        return ("clear", text[:300]) if expect.words in text else ("vague", f"does not say {expect.words!r}: {text[:300]}")
    if isinstance(expect, Ok):
        wrong = expect.wrong(result)
        return ("silent", wrong) if wrong else ("accepted", "")
    raise TypeError(f"a function call cannot expect {expect}")


def _classify_cli(got: Cli, expect) -> tuple[str, str]:
    text = got.out + got.err
    if "Traceback (most recent call last)" in text or "Exception ignored" in text:
        return "crash", f"exit {got.code}: {text[-600:]}"
    if isinstance(expect, Fails):
        if got.code == 0:
            return "silent", f"exit 0 where a failure belongs: {text[:300]}"
        return ("clear", text[-200:]) if expect.check(got.out, got.err) else ("vague", f"exit {got.code}: {text[-300:]}")
    if isinstance(expect, Quiet):
        return ("accepted", "") if not got.err.strip() else ("vague", f"exit {got.code}: {got.err[-300:]}")
    if isinstance(expect, Runs):
        if got.code != 0:
            return "vague", f"refused a valid command line: exit {got.code}: {text[-300:]}"
        return ("accepted", "") if expect.check(got.out, got.err) else ("silent", f"wrong output: {text[:600]}")
    if isinstance(expect, Usage):
        if got.code == 0:
            return "silent", f"exit 0 where an error belongs: {text[:300]}"
        missing = [w for w in _words(expect.words) if w not in text]
        if missing:
            return "vague", f"exit {got.code}, does not say {missing}: {text[-300:]}"
        lines = [line for line in got.err.splitlines() if line.strip()]
        errors = [line for line in lines if not line.startswith(("usage:", " "))]     # a usage line may wrap
        said = [line for line in lines if "error" in line.lower() or "no theorem" in line]
        if (len(errors) > 1 and not got.out.strip()) or len(said) > 1:
            return "vague", f"exit {got.code}, {len(errors)} lines on stderr: {got.err[-300:]}"
        if len(got.out.splitlines()) > 1 and not got.err.strip():
            return "vague", f"exit {got.code}, {len(got.out.splitlines())} lines on stdout: {got.out[-300:]}"
        return "clear", text[-200:]
    raise TypeError(f"a command line cannot expect {expect}")


# --------------------------------------------------------------------------- running things

class ClosedPipe(io.TextIOBase):
    """A stdout whose reader has gone: every write raises ``BrokenPipeError``."""

    def writable(self) -> bool:
        return True

    def write(self, text):
        raise BrokenPipeError(errno.EPIPE, "Broken pipe")


def run_main(main, argv, *, env=None, stdout=None, cwd=None) -> Cli:
    """``main(argv)`` in this process, its output captured (or sent to ``stdout``); ``env`` set and ``cwd``
    entered around it."""
    out, err = stdout or io.StringIO(), io.StringIO()
    saved = {k: os.environ.get(k) for k in (env or {})}
    here = os.getcwd()
    os.environ.update(env or {})
    try:
        if cwd is not None:
            os.chdir(cwd)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as stop:
                code = stop.code if isinstance(stop.code, int) else (0 if stop.code is None else 1)
    finally:
        os.chdir(here)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return Cli(code or 0, out.getvalue() if stdout is None else "", err.getvalue())


def run_process(args, *, close_stdout: bool = False, timeout: int = 60, cwd=None, memory: int | None = None,
                env=None) -> Cli:
    """``python args...`` in a subprocess (from the checkout); ``close_stdout``: the reader goes away at once;
    ``memory``: its address space in bytes."""
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}
    limit = None
    if memory:
        import resource

        def limit():
            resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    try:
        if close_stdout:
            proc = subprocess.Popen([sys.executable, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                    cwd=cwd or ROOT, env=full_env, preexec_fn=limit)
            proc.stdout.close()                 # like `| head -0`: every write meets a closed pipe
            _, err = proc.communicate(timeout=timeout)
            return Cli(proc.returncode, "", err.decode("utf-8", "replace"))
        done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout,
                              cwd=cwd or ROOT, env=full_env, preexec_fn=limit)
    except subprocess.TimeoutExpired:
        raise _Hang(f"{args} ran {timeout} s") from None
    return Cli(done.returncode, done.stdout, done.stderr)


def proofs_main():
    """``python -m proofs``'s ``main`` (imported when a call needs it: it imports SymPy)."""
    from proofs.__main__ import main
    return main


def benchmarks_main():
    """``python -m benchmarks``'s ``main``."""
    from benchmarks.__main__ import main
    return main


# --------------------------------------------------------------------------- a full disk

@contextlib.contextmanager
def full_disk():
    """Every ``os.write`` and ``os.fsync`` of a file other than stdin, stdout and stderr fails as on a full
    disk (``ENOSPC``); a buffered file's data fails at its ``fsync``, as a full disk's delayed allocation does."""
    real = os.write, os.fsync

    def write(fd, data):
        if fd > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real[0](fd, data)

    def fsync(fd):
        if (fd if isinstance(fd, int) else fd.fileno()) > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real[1](fd)
    os.write, os.fsync = write, fsync
    try:
        yield
    finally:
        os.write, os.fsync = real


def on_full_disk(call):
    """``call`` made to run on a full disk (``full_disk``)."""
    def go():
        with full_disk():
            return call()
    return go


# --------------------------------------------------------------------------- hostile files

def edited(doc, edit):
    """A deep copy of ``doc`` changed by ``edit(doc)``."""
    doc = copy.deepcopy(doc)
    edit(doc)
    return doc


def written(path: pathlib.Path, data) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def sparse(path: pathlib.Path, size: int) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def zero_link(path: pathlib.Path) -> pathlib.Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to("/dev/zero")
    return path


def fifo_in(directory: pathlib.Path, name: str) -> pathlib.Path:
    path = directory / name
    os.mkfifo(path)
    return path


KINDS = ("missing", "directory", "FIFO", "/dev/zero", "above the cap", "deep nesting", "not UTF-8", "empty",
         "truncated", "NaN", "a list", "NUL bytes")
CONTENT = {"deep nesting": b"[" * 100_000 + b"]" * 100_000, "not UTF-8": b'{"a": "\xff\xfe"}', "empty": b"",
           "truncated": b'{"schema": "minipos-lab/3", "comm', "NaN": b'{"a": NaN}', "a list": b"[1, 2, 3]",
           "NUL bytes": b"\x00" * 64}
WORDS = {"missing": "", "directory": "directory", "FIFO": "FIFO", "/dev/zero": "character device",
         "above the cap": "bytes", "deep nesting": "nest", "not UTF-8": "UTF-8", "empty": "empty",
         "truncated": "JSON", "NaN": "NaN", "a list": "", "NUL bytes": ""}
"""What a refusal of each kind of file must say (besides the file's name); "" for no particular word."""


class Files:
    """Hostile files in a temporary directory of their own, removed when the interpreter exits."""

    def __init__(self):
        self.root = pathlib.Path(tempfile.mkdtemp(prefix="minipos-campaign-"))
        atexit.register(shutil.rmtree, self.root, ignore_errors=True)
        self.count = itertools.count()

    def fresh(self, name: str = "d") -> pathlib.Path:
        """A new empty directory."""
        path = self.root / f"{name}{next(self.count)}"
        path.mkdir(parents=True)
        return path

    def make(self, kind: str, name: str = "file.json", directory: pathlib.Path | None = None) -> pathlib.Path:
        """A path of ``kind`` (``KINDS``) named ``name`` in ``directory`` (a new one by default)."""
        directory = directory or self.fresh()
        path = directory / name
        if kind == "missing":
            pass
        elif kind == "directory":
            path.mkdir()
        elif kind == "FIFO":
            fifo_in(directory, name)
        elif kind == "/dev/zero":
            zero_link(path)
        elif kind == "above the cap":
            sparse(path, safe_io.MAX_BYTES + 1)
        else:
            written(path, CONTENT[kind])
        return path
