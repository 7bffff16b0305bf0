"""``python -m lab --quick`` leaves the checkout as it was: its records go to a new temporary folder
unless ``--out`` names one, and the committed quick records (which the lab's tests read) are rewritten
only when ``--out lab/results/quick`` asks for it."""

import tempfile
from pathlib import Path

import pytest

pytest.importorskip("lab")
from lab.__main__ import parser, plan  # noqa: E402


def _out(argv):
    return plan(parser().parse_args(argv))[2]


def test_quick_writes_to_a_new_empty_temporary_folder(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    first, second = _out(["--quick"]), _out(["--quick", "--print-commands"])
    assert first.parent == tmp_path and second.parent == tmp_path and first != second
    assert first.name.startswith("minipos-lab-quick-") and list(first.iterdir()) == []


def test_quick_writes_where_out_says(tmp_path):
    assert _out(["--quick", "--out", str(tmp_path / "mine")]) == tmp_path / "mine"
    assert _out(["--quick", "--out", "lab/results/quick"]) == Path("lab/results/quick")


def test_the_full_protocol_and_the_quick_summary_keep_their_folders():
    assert _out(["--tasks", "markov", "--schemes", "rope", "--seeds", "0"]) == Path("lab/results/full")
    assert _out(["--summarize", "--quick"]) == Path("lab/results/quick")
