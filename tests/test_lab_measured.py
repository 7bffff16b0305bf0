"""The lab numbers shipped in the wheel for ``minipos tour`` are the committed lab summary's.

``minipos/data/lab_measured.json`` is written by ``lab.summary.write_measured`` from
``lab/results/full``; recomputing it from the committed records and summary must give the shipped
file exactly, so the tour cannot drift from the records. The records themselves (their commits, the
trained length) are read here directly as the outside reference.
"""

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FULL = ROOT / "lab" / "results" / "full"

def _schema():
    first = next(iter(sorted(FULL.glob("*-s*.json"))), None)
    return None if first is None else json.loads(first.read_text(encoding="utf-8")).get("schema")


def _current():
    from lab.record import SCHEMA
    return _schema() == SCHEMA


pytestmark = [
    pytest.mark.skipif(not (FULL / "summary.json").exists(), reason="the lab's records are in a checkout only"),
    pytest.mark.skipif(not _current(), reason="lab/results/full holds the records of an earlier schema until the "
                                              "protocol of this schema has run in full (lab/README.md)"),
]


def _records():
    return [json.loads(p.read_text(encoding="utf-8")) for p in sorted(FULL.glob("*-s*.json"))]


def test_shipped_numbers_are_the_committed_summarys():
    from lab import summary as lab_summary
    from minipos.cli import lab_measured
    summary = json.loads((FULL / "summary.json").read_text(encoding="utf-8"))
    assert lab_measured() == lab_summary.measured(summary, _records())


def test_shipped_source_names_the_records_it_came_from():
    from minipos.cli import lab_measured
    records = [r for r in _records() if r["task"]["name"] in ("markov", "retrieval")]   # the tour's columns
    src = lab_measured()["source"]
    assert src["records"] == "lab/results/full"
    assert src["commits"] == sorted({r["versions"]["commit"] for r in records})
    from lab.run import TASK_SEEDS                                       # the protocol of lab/README.md
    assert src["seeds"] == sorted(set(TASK_SEEDS["markov"]) | set(TASK_SEEDS["retrieval"]))
    assert src["train_length"] == 64
    assert set(lab_measured()["schemes"]) == {r["scheme"]["name"] for r in records}


def test_write_measured_rewrites_the_same_file(tmp_path):
    from lab import summary as lab_summary
    out = tmp_path / "lab_measured.json"
    lab_summary.write_measured(FULL, out)
    shipped = json.loads((ROOT / "minipos" / "data" / "lab_measured.json").read_text(encoding="utf-8"))
    written = json.loads(out.read_text(encoding="utf-8"))
    written["source"]["records"] = shipped["source"]["records"]   # the path as given; the numbers must match
    assert written == shipped
