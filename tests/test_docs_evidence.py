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


def test_a_history_curve_is_every_seeds_checkpoints_mean_and_range():
    # expected values from the records' own history lists, over every seed the task runs (TASK_SEEDS)
    from lab.run import TASK_SEEDS
    recs = _runs("markov", "rope")
    assert [r["seed"] for r in recs] == list(TASK_SEEDS["markov"])
    per_seed = [[_at({"results": {"base": {"lengths": h["lengths"]}}}, 256)["excess"] for h in r["history"]]
                for r in recs]
    got = evidence.history("markov", "rope", 256)
    assert got["step"] == [h["step"] for h in recs[0]["history"]]
    for i, column in enumerate(zip(*per_seed)):
        assert got["mean"][i] == pytest.approx(statistics.fmean(column), abs=1e-12)
        assert (got["low"][i], got["high"][i]) == (min(column), max(column))
    assert evidence.history("markov", "learned", 128) is None          # a 64-row table cannot run at 2L


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
    monkeypatch.setattr(evidence, "summary", lambda where=None: {"markov": {"rows": rows}})
    assert [evidence.usable("markov", r) for r in rows] == [True, False, False, False, True, False]


def test_a_text_cell_is_the_mean_of_the_seeds_held_out_losses():
    # expected from the per-seed records: their held-out loss at 16L, and the evaluation's standard
    # error when it is larger than the seeds' spread (the summary's rule, lab.summary._spread)
    recs = _runs("text", "alibi")
    assert len(recs) == 3
    values = [_at(r, 1024)["loss"] for r in recs]
    noise = math.sqrt(sum(_at(r, 1024)["loss_stderr"] ** 2 for r in recs)) / 3
    got = evidence.cell("text", "alibi", 1024)
    assert got.mean == pytest.approx(statistics.fmean(values), abs=1e-12)
    assert got.se == pytest.approx(max(statistics.stdev(values) / math.sqrt(3), noise), abs=1e-12)
    assert got.usable                                  # a fixed budget counts as trained
    assert evidence.cell("text", "learned", 128) is None


def _positions(monkeypatch, task, per_seed, floor=None):
    """Records of one scheme whose base model has the per-bin losses ``per_seed`` at length 32."""
    recs = {s: {"results": {"base": {"lengths": [{"length": 32, "positions": {
        "edges": [0, 8, 16, 24, 32], "loss": loss, "floor": floor}}]}}} for s, loss in enumerate(per_seed)}
    rows = {"x": {"seeds": sorted(recs), "converged": 0, "fixed": len(recs), "learned": len(recs)}}
    monkeypatch.setattr(evidence, "summary", lambda where=None: {task: {"rows": rows}})
    monkeypatch.setattr(evidence, "record", lambda t, scheme, seed=0, where=None: recs[seed])


def test_position_change_is_paired_within_each_seed(monkeypatch):
    # hand-worked: positions 16-32 less 0-16 are (1 - 2) = -1 for seed 0 and (1.5 - 3) = -1.5 for seed 1;
    # mean -1.25, sd 0.5 / sqrt(2), se = sd / sqrt(2) = 0.25
    _positions(monkeypatch, "text", [[2.0, 2.0, 1.0, 1.0], [3.0, 3.0, 1.5, 1.5]])
    c = evidence.position_change("text", "x", 32, (0, 16), (16, 32))
    assert (c.mean, c.se, c.n, c.usable) == (pytest.approx(-1.25), pytest.approx(0.25), 2, True)
    assert evidence.position_loss("text", "x", 32) == [(0, 8, 2.5), (8, 16, 2.5), (16, 24, 1.25), (24, 32, 1.25)]
    with pytest.raises(evidence.EvidenceError, match="not whole bins"):
        evidence.position_change("text", "x", 32, (0, 12), (16, 32))


def test_position_loss_takes_the_floor_off_where_the_task_has_one(monkeypatch):
    _positions(monkeypatch, "markov", [[2.0, 2.0, 1.0, 1.0]] * 2, floor=[1.0, 0.5, 0.5, 0.5])
    assert evidence.position_excess("x", 32) == [(0, 8, 1.0), (8, 16, 1.5), (16, 24, 0.5), (24, 32, 0.5)]
    assert evidence.position_change("markov", "x", 32, (0, 8), (8, 16)).mean == pytest.approx(0.5)


def test_a_change_over_one_seed_is_refused_not_given_a_nan_standard_error(monkeypatch):
    _positions(monkeypatch, "markov", [[2.0, 2.0, 1.0, 1.0]], floor=[1.0, 0.5, 0.5, 0.5])
    with pytest.raises(evidence.EvidenceError, match="over 1 seed has no spread"):
        evidence.position_change("markov", "x", 32, (0, 8), (8, 16))


def _two_budgets(monkeypatch, before, after, after_seeds=None):
    """Text records of one scheme ``x`` in two directories, each seed's held-out loss at length 64
    (``None``: cannot run there)."""
    dirs = {"short": Path("short"), "long": Path("long")}

    def rec(loss):
        entry = {"length": 64, "status": "cannot run"} if loss is None else {"length": 64, "status": "ok", "loss": loss}
        return {"results": {"base": {"lengths": [entry]}}}
    recs = {"short": {s: rec(v) for s, v in enumerate(before)}, "long": {s: rec(v) for s, v in enumerate(after)}}
    rows = {name: {"text": {"rows": {"x": {"seeds": sorted(recs[name]) if name == "short" or after_seeds is None
                                           else after_seeds, "converged": 0, "fixed": 3, "learned": 3}}}}
            for name in recs}
    monkeypatch.setattr(evidence, "summary", lambda where=evidence.FULL: rows[where.name])
    monkeypatch.setattr(evidence, "record", lambda t, scheme, seed=0, where=evidence.FULL: recs[where.name][seed])
    return dirs["short"], dirs["long"]


def test_paired_change_is_the_mean_and_spread_of_each_seeds_difference(monkeypatch):
    # hand-worked: the differences are -0.03, -0.05, -0.04: mean -0.04, sd 0.01, se 0.01 / sqrt(3)
    short, long = _two_budgets(monkeypatch, [1.40, 1.45, 1.50], [1.37, 1.40, 1.46])
    c = evidence.paired_change("text", "x", 64, short, long)
    assert (c.mean, c.se, c.n, c.usable) == (pytest.approx(-0.04), pytest.approx(0.01 / math.sqrt(3)), 3, True)
    # unpaired, the same numbers would have a standard error five times as large (the seeds' spread,
    # sd 0.05 against the differences' 0.01)
    assert statistics.stdev([1.40, 1.45, 1.50]) / math.sqrt(3) == pytest.approx(5 * c.se)


def test_paired_change_needs_the_same_seeds_and_a_runnable_length(monkeypatch):
    short, long = _two_budgets(monkeypatch, [1.4, 1.4, 1.4], [1.3, 1.3, 1.3], after_seeds=[0, 1])
    with pytest.raises(evidence.EvidenceError, match="needs the same"):
        evidence.paired_change("text", "x", 64, short, long)
    short, long = _two_budgets(monkeypatch, [None, None, None], [None, None, None])
    assert evidence.paired_change("text", "x", 64, short, long) is None
