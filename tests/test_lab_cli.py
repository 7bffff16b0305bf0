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
    for delay in (0.05, 0.13, 0.31):
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
