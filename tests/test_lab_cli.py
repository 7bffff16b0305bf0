"""``python -m lab``'s command line: every mistake is a one-line usage error before any work, a
damaged record is a failed check of ``--verify``, and records are written atomically with the
umask's mode. Nothing here trains: the training entry point is replaced where a command would run."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lab import record as records

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_record_gets_the_mode_the_umask_gives_a_new_file(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = records.write_json(tmp_path / "r.json", {"a": 1})
        again = records.write_json(path, {"a": 2})                       # a replaced record too
    finally:
        os.umask(old)
    assert again == path and json.loads(path.read_text()) == {"a": 2}
    assert path.stat().st_mode & 0o777 == mode
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]            # no temp file left


WRITER = """
import sys
from lab import record
big = {"numbers": list(range(200000))}
record.write_json(sys.argv[1], {"old": True})
print("ready", flush=True)
while True:
    record.write_json(sys.argv[1], big)
"""


def test_a_record_survives_a_kill_mid_write(tmp_path):
    path = tmp_path / "r.json"
    for delay in (0.05, 0.2):
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE,
                                 text=True)
        assert child.stdout.readline() == "ready\n"
        try:
            child.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        assert json.loads(path.read_text()) in ({"old": True}, {"numbers": list(range(200000))})


# ----------------------------------------------------------------------------- --verify

QUICK = ROOT / "lab" / "results" / "quick"
GOOD = QUICK / "markov-nope-s0.json"


@pytest.fixture
def rerun(monkeypatch):
    """``--verify``'s rerun replaced: it writes the stored record of ``GOOD`` into the rerun's ``--out``
    (exit status ``rerun.status``), and ``rerun.calls`` lists each rerun's argv."""
    import lab.verify

    class Fake:
        calls, status = [], 0

        def __call__(self, argv, **kwargs):
            self.calls.append(argv)
            out = Path(argv[argv.index("--out") + 1])
            if self.status == 0:
                (out / GOOD.name).write_text(GOOD.read_text())
            return subprocess.CompletedProcess(argv, self.status)

    fake = Fake()
    monkeypatch.setattr(lab.verify.subprocess, "run", fake)
    return fake


def _damaged(tmp_path):
    """``{file: words its failed check must say}``: one of each way a file is not a record it can rerun."""
    text = GOOD.read_text()
    good = json.loads(text)
    files = {"missing.json": (None, "No such file or directory"),
             "a-directory.json": (None, "Is a directory"),
             "empty.json": ("", "an empty file"),
             "truncated.json": (text[:len(text) // 2], "not valid JSON, so cut short or damaged"),
             "binary.json": (b"\x89PNG\r\n\x1a\n\xff", "not UTF-8"),
             "a-list.json": ("[1, 2]", "record field (top): must be an object, got list"),
             "summary.json": ((QUICK / "summary.json").read_text(), "record field (top): lacks schema"),
             "old-schema.json": (json.dumps({**good, "schema": "minipos-lab/0"}), "schema: must be 'minipos-lab/1'"),
             "no-command.json": (json.dumps({**good, "command": "rm -rf /"}), "record field command"),
             "other-env.json": (json.dumps({**good, "command": "LD_PRELOAD=x.so " + good["command"]}),
                                "LD_PRELOAD, which is not a thread variable"),
             "no-settings.json": (json.dumps({**good, "settings": {}}), "settings: lacks task, scheme, seed")}
    for name, (content, _) in files.items():
        if name == "a-directory.json":
            (tmp_path / name).mkdir()
        elif isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        elif content is not None:
            (tmp_path / name).write_text(content)
    return {tmp_path / name: words for name, (_, words) in files.items()}


def test_a_damaged_record_is_a_failed_check_and_the_others_are_still_verified(tmp_path, rerun, capsys):
    from lab import __main__ as cli
    damaged = _damaged(tmp_path)
    good = tmp_path / "good.json"
    good.write_text(GOOD.read_text())
    paths = [*damaged, good]
    assert cli.main(["--verify", *map(str, paths), "--no-progress"]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert "Traceback" not in err and len(lines) == len(paths)
    for line, (path, words) in zip(lines, damaged.items()):             # each in one line, before any rerun
        assert line.startswith(f"{path}: failed: ") and words in line, line
    assert lines[-1].startswith(f"{good} (") and "identical: all" in lines[-1]
    assert len(rerun.calls) == 1 and str(tmp_path) not in rerun.calls[0][rerun.calls[0].index("--out") + 1]


def test_a_record_alone_that_is_damaged_fails_in_one_line(tmp_path, rerun, capsys):
    from lab import __main__ as cli
    path = tmp_path / "markov-rope-s0.json"
    path.write_text((QUICK / path.name).read_text()[:1000])
    assert cli.main(["--verify", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == f"{path}: failed: " + out.split(": failed: ", 1)[1] and out.count("\n") == 1
    assert "not valid JSON" in out and err == "" and rerun.calls == []


def test_a_rerun_that_fails_is_a_failed_check(tmp_path, rerun, capsys):
    from lab import __main__ as cli
    rerun.status = 2
    assert cli.main(["--verify", str(GOOD), str(GOOD.with_name("markov-alibi-s0.json"))]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and len(rerun.calls) == 2
    assert all(": failed: the record's command failed (exit status 2)" in line for line in lines)


def test_record_validation_refuses_every_wrong_type_with_a_value_error():
    """A record is JSON from anywhere: every field replaced by a value of another kind is a
    ``ValueError`` naming a field (or still a record), never a ``TypeError`` or ``KeyError``."""
    def places(node, where=()):
        yield where
        children = node.items() if isinstance(node, dict) else enumerate(node[:1]) if isinstance(node, list) else ()
        for key, child in children:
            yield from places(child, where + (key,))

    for name in ("retrieval-nope-s0.json", "markov-learned-s0.json"):
        rec = json.loads((QUICK / name).read_text())
        for where in list(places(rec))[1:]:
            target = rec
            for key in where[:-1]:
                target = target[key]
            kept = target[where[-1]]
            for value in (5, "x", None, [], {}, True, [1], {"a": 1}):
                target[where[-1]] = value                                   # changed in place, then put back
                try:
                    records.validate(rec)
                except ValueError as error:
                    assert str(error).startswith("record field "), (where, value, error)
            target[where[-1]] = kept
