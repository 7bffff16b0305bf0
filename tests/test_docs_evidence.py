"""The module the docs read lab numbers through: its cells agree with the per-seed records, and a
claim the records do not bear out fails loudly (the build's guard against drift)."""

import importlib.util
import json
import math
import statistics
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FULL = ROOT / "lab" / "results" / "full"
pytestmark = pytest.mark.skipif(not (FULL / "summary.json").exists(), reason="the lab's records are in a checkout only")

spec = importlib.util.spec_from_file_location("docs_evidence", ROOT / "docs" / "hooks" / "evidence.py")
evidence = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = evidence                      # a dataclass needs its module registered
spec.loader.exec_module(evidence)


def _runs(task, scheme):
    return [json.loads(p.read_text()) for p in sorted(FULL.glob(f"{task}-{scheme}-s*.json"))]


def _at(rec, length):
    return next(r for r in rec["results"]["base"]["lengths"] if r["length"] == length)


def test_a_markov_cell_is_the_mean_and_standard_error_of_the_seeds_records():
    # expected values from the per-seed records, not from summary.json: mean and stdev / sqrt(n)
    values = [_at(r, 1024)["excess"] for r in _runs("markov", "deberta")]
    assert len(values) >= 2
    got = evidence.cell("markov", "deberta", 1024)
    assert got.n == len(values)
    assert got.mean == pytest.approx(statistics.fmean(values), abs=1e-12)
    assert got.se == pytest.approx(statistics.stdev(values) / math.sqrt(len(values)), abs=1e-12)


def test_a_retrieval_offset_cell_matches_the_records():
    recs = _runs("retrieval", "alibi")
    far = max(o["offset"] for o in _at(recs[0], 1024)["offsets"])
    values = [next(o["accuracy"] for o in _at(r, 1024)["offsets"] if o["offset"] == far) for r in recs]
    got = evidence.offset_cell("alibi", 1024, far)
    assert far == evidence.far_offset() and got.mean == pytest.approx(statistics.fmean(values), abs=1e-12)


def test_a_summary_se_is_used_when_present():
    # the next record schema writes "se" beside "mean"; it wins over sd / sqrt(n)
    c = evidence._cell({"mean": 0.5, "sd": 0.3, "n": 3, "se": 0.01}, "x")
    assert (c.mean, c.se, c.n) == (0.5, 0.01, 3)
    assert format(c, ".2f") == "0.50 ± 0.01"


def test_a_scheme_that_cannot_run_gives_none():
    assert evidence.cell("markov", "learned", 128) is None


def test_attention_distance_is_the_seed_mean_per_head():
    recs = _runs("markov", "alibi")
    head0 = statistics.fmean(_at(r, 1024)["attention"]["distance"][0][0] for r in recs)
    assert evidence.attention_distance("markov", "alibi", 1024)[0][0] == pytest.approx(head0, abs=1e-12)


def test_a_claim_the_records_do_not_bear_fails_with_its_statement():
    with pytest.raises(evidence.EvidenceError, match="no longer support: RoPE holds at 16L"):
        evidence.claim(evidence.cell("markov", "rope", 1024).mean < 0.05, "RoPE holds at 16L")


def test_unknown_rows_and_lengths_fail_loudly():
    with pytest.raises(evidence.EvidenceError, match=r"no row .rope \+ntk-by-parts."):
        evidence.cell("markov", "rope +ntk-by-parts", 64)
    with pytest.raises(evidence.EvidenceError, match="no length 2048"):
        evidence.cell("markov", "rope", 2048)


def _c(mean, se, usable=True):
    return evidence.Cell(mean, se, 3, usable, "markov/x/64")


def test_ordered_needs_the_difference_beyond_twice_its_standard_error():
    # hand-worked: 2 * sqrt(0.01**2 + 0.01**2) = 0.0283; a difference of 0.05 is resolved, 0.02 is not
    evidence.ordered(_c(0.10, 0.01), _c(0.15, 0.01), "x below y")
    assert evidence.resolved(_c(0.10, 0.01), _c(0.15, 0.01))
    assert not evidence.resolved(_c(0.10, 0.01), _c(0.12, 0.01))
    with pytest.raises(evidence.EvidenceError, match="not resolved .*x below y"):
        evidence.ordered(_c(0.10, 0.01), _c(0.12, 0.01), "x below y")
    with pytest.raises(evidence.EvidenceError, match="not resolved"):
        evidence.ordered(_c(0.15, 0.01), _c(0.10, 0.01), "the wrong way round")


def test_ordered_refuses_rows_that_did_not_converge_or_learn():
    with pytest.raises(evidence.EvidenceError, match="did not all converge"):
        evidence.ordered(_c(0.10, 0.001, usable=False), _c(0.50, 0.001), "x below y")
    with pytest.raises(evidence.EvidenceError, match="cannot run"):
        evidence.ordered(None, _c(0.50, 0.001), "x below y")


def test_a_row_is_usable_only_when_every_seed_converged_and_learned(monkeypatch):
    rows = {"a": {"seeds": [0, 1, 2], "converged": 3, "learned": 3},
            "b": {"seeds": [0, 1, 2], "converged": 3, "learned": 2},
            "c": {"seeds": [0, 1, 2], "converged": 2, "learned": 3},
            "v1": {"seeds": [0, 1, 2]},
            # text trains a fixed budget by design: those seeds count as trained, the others must converge
            "t": {"seeds": [0, 1, 2], "converged": 0, "fixed": 3, "learned": 3},
            "u": {"seeds": [0, 1, 2], "converged": 1, "fixed": 1, "learned": 3}}
    monkeypatch.setattr(evidence, "summary", lambda: {"markov": {"rows": rows}})
    assert [evidence.usable("markov", r) for r in rows] == [True, False, False, False, True, False]


def test_next_records_are_the_task_files_of_results_next_in_name_order(tmp_path, monkeypatch):
    # Three hand-made files: two of the task asked for, one of another task.
    for name, scheme in (("text-rope-s0.json", "rope"), ("text-alibi-s1.json", "alibi"),
                         ("markov-rope-s0.json", "rope")):
        (tmp_path / name).write_text(json.dumps({"scheme": {"name": scheme}}))
    monkeypatch.setattr(evidence, "NEXT", tmp_path)
    assert [r["scheme"]["name"] for r in evidence.next_records("text")] == ["alibi", "rope"]
    assert evidence.next_records("retrieval") == []
