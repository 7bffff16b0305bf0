"""The tools around the reference hold under hostile files and hostile terminals.

``minipos.safe_io`` (the one reader and writer of the tools), ``spec/check_port.py`` (standalone,
its own reader) and the conformance report refuse a FIFO or a device at once, a file above the size
cap before reading it, and deep nesting without recursion; a full disk is one line naming the file
and leaves the old file whole; the commands end quietly on a closed pipe. ``minipos.terminal``'s
tables and help text are checked against layouts worked by hand. Each reader that could hang runs
under a deadline, so that a regression fails instead of hanging the suite.
"""

from __future__ import annotations

import errno
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

from minipos import safe_io, terminal
from minipos.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
for _path in (str(ROOT / "spec"), str(ROOT / "spec" / "conformance")):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import check_port  # noqa: E402
import report  # noqa: E402
import run  # noqa: E402

needs_fifo = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")


@pytest.fixture
def deadline():
    """Fail (not hang) if the test blocks 10 s: a FIFO opened for reading waits for a writer forever."""
    def alarm(signum, frame):
        raise TimeoutError("blocked 10 s: a reader waited on a FIFO or a device")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.alarm(10)
    yield
    signal.alarm(0)
    signal.signal(signal.SIGALRM, old)


# --------------------------------------------------------------------------- special files

@needs_fifo
def test_every_reader_refuses_a_fifo_at_once(tmp_path, deadline):
    fifo = tmp_path / "lib" / "alibi_bias.json"
    fifo.parent.mkdir()
    os.mkfifo(fifo)
    with pytest.raises(safe_io.FileError, match=f"^{fifo}: is not a regular file \\(a FIFO\\)$"):
        safe_io.read_json(fifo)
    with pytest.raises(ValueError, match=f"^{fifo} is not a regular file \\(a FIFO\\)$"):
        check_port.load_family("alibi_bias", str(fifo.parent))
    with pytest.raises(safe_io.FileError, match="is not a regular file \\(a FIFO\\)"):
        report.load_results(str(tmp_path))


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_device_is_refused_unread(tmp_path):
    with pytest.raises(safe_io.FileError, match="^/dev/zero: is not a regular file \\(a character device\\)$"):
        safe_io.read_bytes("/dev/zero")
    # check_port and the report, in a process of their own held to 1 GiB: a reader that read
    # /dev/zero would fill it and fail with MemoryError instead of the one line
    (tmp_path / "rope.json").symlink_to("/dev/zero")
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "x.json").symlink_to("/dev/zero")
    code = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30)); "
            "sys.path[:0] = ['spec', 'spec/conformance']; import check_port, report\n"
            "for call in (lambda: check_port.load_family('rope', sys.argv[1]), lambda: report.load_results(sys.argv[1])):\n"
            "    try:\n        call()\n    except ValueError as err:\n        print(err)\n")
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, timeout=60,
                          cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{tmp_path / 'rope.json'} is not a regular file (a character device)",
                                        f"{tmp_path / 'lib' / 'x.json'}: is not a regular file (a character device)"]


def test_a_file_above_the_cap_is_refused_from_its_size(tmp_path):
    big = tmp_path / "alibi_bias.json"
    with open(big, "wb") as f:          # sparse: costs no disk
        f.truncate(safe_io.MAX_BYTES + 1)
    with pytest.raises(safe_io.FileError, match=f"is {safe_io.MAX_BYTES + 1} bytes, more than the {safe_io.MAX_BYTES}"):
        safe_io.read_bytes(big)
    with pytest.raises(ValueError, match=f"more than the {check_port.MAX_FILE_BYTES} bytes"):
        check_port.load_family("alibi_bias", str(tmp_path))
    small = tmp_path / "small.json"
    small.write_bytes(b"[1, 2, 3]")
    with pytest.raises(safe_io.FileError, match="is 9 bytes, more than the 8 bytes allowed"):
        safe_io.read_json(small, limit=8)
    assert safe_io.read_json(small, limit=9) == [1, 2, 3]


@pytest.mark.parametrize("data", [b"[" * 1_000_000 + b"]" * 1_000_000, b"[" * 65 + b"]" * 65,
                                  b'{"a":' * 70 + b"1" + b"}" * 70])
def test_deep_nesting_is_an_error_not_a_recursion(tmp_path, data):
    path = tmp_path / "deep.json"
    path.write_bytes(data)
    with pytest.raises(safe_io.FileError, match="nests lists and objects deeper than 64 levels"):
        safe_io.read_json(path)
    (tmp_path / "rope.json").write_bytes(data)
    with pytest.raises(ValueError, match="nests lists and objects deeper than 64 levels"):
        check_port.load_family("rope", str(tmp_path))
    assert safe_io.loads_json(b"[" * 64 + b"]" * 64) is not None          # 64 levels are allowed


# --------------------------------------------------------------------------- a full disk

def _full(*args):
    raise OSError(errno.ENOSPC, "No space left on device")


@pytest.mark.parametrize("literal", [b"1e999", b"-1E+0400", b"1" + b"0" * 400 + b".0", b"1" + b"9" * 250 + b"e99",
                                     b"17976931348623159e292"])
def test_a_float_beyond_float64_is_refused_wherever_it_sits(literal):
    # hand-worked: float64 ends at 1.7976931348623157e308, so each literal above parses to inf (the last
    # is just past that end); the reader's quick scan must send each to its per-number check, also in a
    # document whose strings hold digits and an "e"
    for doc in (b"[" + literal + b"]", b'{"commit": "0bf76ee", "x": [0.5, ' + literal + b"]}"):
        with pytest.raises(safe_io.FileError, match="which is out of range for float64"):
            safe_io.loads_json(doc)


def test_floats_within_float64_parse_as_python_does():
    doc = b'{"commit": "3e123abc", "v": [1.5e308, 1e-400, 0.1, -2.5E+10, ' + b"9" * 300 + b'.5]}'
    assert safe_io.loads_json(doc) == json.loads(doc)


def test_a_full_disk_leaves_the_old_file_whole_and_no_temp_file(tmp_path, monkeypatch):
    path = tmp_path / "results.json"
    path.write_bytes(b"old")
    monkeypatch.setattr(os, "write", _full)
    with pytest.raises(OSError, match=f"^\\[Errno 28\\] cannot write {path}: No space left on device$") as info:
        safe_io.write_atomic(path, "new")
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["results.json"]
    safe_io.write_atomic(path, "new ∂")
    assert path.read_text(encoding="utf-8") == "new ∂"


def test_vectors_export_onto_a_full_disk_is_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(os, "fsync", _full)
    assert main(["vectors", "export", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"minipos vectors export: error: [Errno 28] cannot write {tmp_path / 'out'}/")
    assert err.rstrip().endswith(".json: No space left on device")
    assert [p for p in (tmp_path / "out").iterdir()] == []              # no family file, no temp file


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
def test_output_onto_a_full_disk_is_one_line():
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, "-m", "minipos", "tour", "--d-model", "8", "--heads", "2",
                               "--seq-len", "4"], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
                              cwd=ROOT)
    assert (done.returncode, done.stderr) == (1, "minipos: error: No space left on device\n")


def test_conformance_results_are_strict_json(tmp_path):
    with pytest.raises(ValueError, match="holds a NaN or an infinity"):
        run.write_json(str(tmp_path / "x.json"), {"abs_error": float("nan")})
    assert run.scalar(float("nan")) == "NaN" and run.scalar(float("-inf")) == "-Infinity"
    assert run.scalar(2.5) == 2.5 and run.scalar(3) == 3
    assert [p.name for p in tmp_path.iterdir()] == []


# --------------------------------------------------------------------------- closed pipes and missing pieces

def test_a_reader_that_stops_after_one_line_ends_the_tour_quietly():
    """``minipos tour | head -1``: the first line arrives, then the pipe closes (the campaign closes it before
    the first write, so that every write meets it)."""
    proc = subprocess.Popen([sys.executable, "-m", "minipos", "tour"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, cwd=ROOT)
    first = proc.stdout.readline()
    proc.stdout.close()
    _, err = proc.communicate(timeout=60)
    assert first.startswith(b"minipos ") and b" tour" in first
    # 0 when the whole tour fitted in the pipe's buffer before it closed, 1 when a write met the closed pipe
    assert proc.returncode in (0, 1) and err == b""


def test_the_conformance_runner_names_a_missing_library_before_any_work(tmp_path, capsys):
    if not run.missing(["torchtune"]):
        pytest.skip("torchtune is installed here")
    assert run.main(["--libraries", "torchtune", "--out", str(tmp_path / "out")]) == 2
    out, err = capsys.readouterr()
    absent = ", ".join(run.missing(["torchtune"])["torchtune"])          # torchtune, and torch where it is absent too
    assert out == "" and err == (f"conformance: error: not installed: {absent} (for torchtune); install the pinned "
                                 f"set into an environment of its own: {run.INSTALL.split(': ', 1)[1]}\n")
    assert not (tmp_path / "out").exists()


def test_the_report_refuses_a_missing_or_empty_results_directory(tmp_path):
    with pytest.raises(ValueError, match="^results directory '/nonexistent' does not exist or is not a directory$"):
        report.load_results("/nonexistent")
    with pytest.raises(ValueError, match="holds no result"):
        report.load_results(str(tmp_path))


def test_python_m_minipos_is_the_minipos_command(capsys):
    done = subprocess.run([sys.executable, "-m", "minipos", "--version"], capture_output=True, text=True,
                          timeout=60, cwd=ROOT)
    with pytest.raises(SystemExit):
        main(["--version"])
    assert done.returncode == 0 and done.stdout == capsys.readouterr().out


# --------------------------------------------------------------------------- minipos.terminal, worked by hand

def test_plain_text_of_rest():
    assert terminal.plain("The ``minipos`` command: :func:`~minipos.cli.tour` and :class:`the layer "
                          "<minipos.layer.MultiHeadAttention>`, `x`, **strong** *emphasis*::") == \
        "The minipos command: tour and the layer, x, strong emphasis:"
    assert terminal.plain(":meth:`Proof.require` and :mod:`proofs.markdown`") == "require and markdown"


def test_a_table_that_fits_is_one_line_per_row_and_one_that_does_not_wraps_its_widest_cells():
    head, rows = ("name", "text", "n"), [("a", "one two three", "1"), ("bb", "four", "22")]
    assert terminal.table(head, rows, 40) == ["name  text           n",
                                              "----  -------------  --",
                                              "a     one two three  1",
                                              "bb    four           22"]
    assert terminal.table(head, rows, 18) == ["name  text      n",     # "text" narrowed from 13 to 8 = 18 - 10
                                              "----  --------  --",
                                              "a     one two   1",
                                              "      three",
                                              "bb    four      22"]
    assert terminal.table(head, rows, 18, details=(1,)) == ["name  n",
                                                            "----  --",
                                                            "a     1",
                                                            "    text: one two",
                                                            "      three",
                                                            "bb    22",
                                                            "    text: four"]
