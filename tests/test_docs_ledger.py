"""The ledger's tests and verdicts (docs/hooks/ledger.py): statistics checked against tables and
hand-worked values, and the verdict rules on records made up for the test."""

import json
import math

import pytest

from docs.hooks import ledger as L

pytest.importorskip("mpmath")


@pytest.mark.parametrize("t,df,p", [
    # one-sided upper tail of Student's t, from the standard table (e.g. NIST/SEMATECH e-Handbook 1.3.6.7.2):
    # t_{0.95, 2} = 2.920, t_{0.95, 3} = 2.353, t_{0.975, 4} = 2.776, t_{0.99, 10} = 2.764
    (2.920, 2, 0.05), (2.353, 3, 0.05), (2.776, 4, 0.025), (2.764, 10, 0.01),
])
def test_student_tail_matches_the_table(t, df, p):
    assert L.student_sf(t, df) == pytest.approx(p, abs=2e-4)
    assert L.student_sf(-t, df) == pytest.approx(1 - p, abs=2e-4)
    assert L.student_sf(0.0, df) == pytest.approx(0.5)


def test_student_tail_with_one_degree_is_the_cauchy_tail():
    # df = 1 is the Cauchy distribution: P(T > t) = 1/2 - atan(t)/pi
    for t in (0.3, 1.0, 4.0):
        assert L.student_sf(t, 1) == pytest.approx(0.5 - math.atan(t) / math.pi, rel=1e-12)


def test_welch_by_hand():
    # a = (1, 2, 3): mean 2, var 1; b = (4, 6, 8): mean 6, var 4. se^2 = 1/3 + 4/3 = 5/3, t = 4 / sqrt(5/3)
    # = 3.0984; df = (5/3)^2 / ((1/3)^2/2 + (4/3)^2/2) = (25/9) / (17/18) = 50/17 = 2.941
    got = L.welch([1, 2, 3], [4, 6, 8])
    assert got["t"] == pytest.approx(4 / math.sqrt(5 / 3)) and got["df"] == pytest.approx(50 / 17)
    assert 0.025 < got["p"] < 0.05                                     # between t_{.975, 3} and t_{.95, 2.9}
    assert L.welch([4, 6, 8], [1, 2, 3])["p"] > 0.95                     # the other direction
    assert L.welch([1, 1, 1], [2, 2, 2])["p"] == 0.0                     # no spread: certain
    assert L.welch([2, 2, 2], [2, 2, 2])["p"] == 1.0


def test_paired_and_one_sample_by_hand():
    # differences (1, 2, 3): mean 2, sd 1, t = 2 / (1 / sqrt 3) = 3.464, df 2: p = 0.0371 (t_{.95,2} = 2.92)
    got = L.paired([0, 0, 0], [1, 2, 3])
    assert got["t"] == pytest.approx(2 * math.sqrt(3)) and got["df"] == 2
    assert got["p"] == pytest.approx(L.student_sf(2 * math.sqrt(3), 2))
    # (0.01, 0.02, 0.03) below 0.1: t = 0.08 / (0.01 / sqrt 3) = 13.86
    assert L.one_sample([0.01, 0.02, 0.03], 0.1)["t"] == pytest.approx(8 * math.sqrt(3))
    assert L.one_sample([0.01, 0.02, 0.03], 0.1, below=False)["p"] > 0.99


def test_holm_by_hand():
    # m = 4: sorted 0.01, 0.02, 0.03, 0.04 -> 0.04, 0.06, 0.06, 0.06 (Holm 1979: (m - j + 1) p, running max)
    assert L.holm([0.03, 0.01, 0.04, 0.02]) == pytest.approx([0.06, 0.04, 0.06, 0.06])
    assert L.holm([0.5, 0.9]) == pytest.approx([1.0, 1.0])
    assert L.holm([]) == []


def _record(task, scheme, seed, values, steps=4800):
    """A record with the metric ``values`` ``{length: value}`` at the fixed budget."""
    metric = {"markov": "excess", "retrieval": "accuracy"}[task]
    return {"schema": "minipos-lab/3", "settings": {"schedule": "budget", "steps": steps, "cooldown": 0.2,
                                                    "length": 64},
            "train": {"steps": steps + math.ceil(0.2 * steps)},
            "results": {"base": {"lengths": [{"length": n, "status": "ok", metric: v} for n, v in values.items()]}}}


@pytest.fixture
def records(tmp_path, monkeypatch):
    full, twice = tmp_path / "full", tmp_path / "twice"
    full.mkdir(), twice.mkdir()
    monkeypatch.setattr(L, "FULL", full)
    monkeypatch.setattr(L, "TWICE", twice)
    L._read.cache_clear()

    def write(where, task, scheme, seed, values, **kw):
        (where / f"{task}-{scheme}-s{seed}.json").write_text(json.dumps(_record(task, scheme, seed, values, **kw)))
    yield full, twice, write
    L._read.cache_clear()


def _verdict(claim):
    e = L._lab_entry(claim)
    L._verdicts([e])
    return e


def test_a_resolved_ordering_is_confirmed_and_one_that_moves_with_training_is_not(records):
    full, twice, write = records
    for s in L.TASK_SEEDS["markov"]:
        write(full, "markov", "alibi", s, {64: 0.01, 256: 0.02 + 0.001 * s})
        write(full, "markov", "rope", s, {64: 0.01, 256: 0.50 + 0.01 * s})
    claim = L.Less("X1", "p.md", "alibi below rope at 4L", L.Value("markov", "alibi", 256), L.Value("markov", "rope", 256))
    assert _verdict(claim).verdict == "not resolved"                     # no twice-budget run yet
    write(twice, "markov", "alibi", 0, {64: 0.01, 256: 0.02}, steps=9600)
    write(twice, "markov", "rope", 0, {64: 0.01, 256: 0.30}, steps=9600)
    e = _verdict(claim)
    assert e.verdict == "confirmed" and e.p < 0.001 and e.test.startswith("Welch")
    write(twice, "markov", "rope", 0, {64: 0.01, 256: 0.01}, steps=9600)    # rope catches up with more training
    L._read.cache_clear()
    assert _verdict(claim).verdict == "moves with training"


def test_an_unresolved_or_incomplete_claim_is_not_confirmed(records):
    full, twice, write = records
    for s in L.TASK_SEEDS["markov"]:
        write(full, "markov", "alibi", s, {64: 0.01 + 0.02 * s})
        write(full, "markov", "rope", s, {64: 0.02 + 0.02 * s})
    claim = L.Less("X2", "p.md", "alibi below rope at L", L.Value("markov", "alibi", 64), L.Value("markov", "rope", 64))
    e = _verdict(claim)
    assert e.verdict == "not resolved" and e.p > 0.05 and e.numbers["twice"] is None     # at L: no doubling check
    write(full, "markov", "rope", 2, {64: 0.9}, steps=1200)                   # one seed off the budget
    write(full, "markov", "alibi", 2, {64: 0.01}, steps=4800)
    L._read.cache_clear()
    assert "not all at the fixed budget" in _verdict(claim).evidence


def test_one_scheme_at_two_lengths_is_paired_over_seeds(records):
    full, twice, write = records
    for s in L.TASK_SEEDS["markov"]:
        write(full, "markov", "rope", s, {64: 0.01 * s, 128: 0.01 * s + 0.1 + 0.001 * s})
    e = L._lab_entry(L.Less("X3", "p.md", "rope rises", L.Value("markov", "rope", 64), L.Value("markov", "rope", 128)))
    assert e.test.startswith("paired") and e.p < 0.001                 # Welch would not resolve it at this spread


def test_the_site_ledger_builds_and_every_seed_entry_names_what_it_rests_on():
    led = L.build()
    seeds = [e for e in led.values() if e.kind == "seed"]
    assert len(seeds) >= 30
    assert {e.verdict for e in seeds} <= {"confirmed", "refuted", "partly", "untestable", "not resolved"}
    for e in seeds:
        assert all(r in led for r in e.numbers["rests_on"]), e.id
    lab = [e for e in led.values() if e.kind == "lab"]
    tested = [e for e in lab if e.p is not None]
    assert all(e.p_holm >= e.p for e in tested)
    json.dumps([e.to_json() for e in led.values()])


def test_a_fact_is_read_not_tested(records):
    full, twice, write = records
    for s in L.TASK_SEEDS["markov"]:
        write(full, "markov", "learned", s, {64: 0.01})
    rec = json.loads((full / "markov-learned-s0.json").read_text())
    rec["results"]["base"]["lengths"].append({"length": 128, "status": "cannot run", "reason": "64 rows"})
    for s in L.TASK_SEEDS["markov"]:
        (full / f"markov-learned-s{s}.json").write_text(json.dumps(rec))
    L._read.cache_clear()
    cannot = L.Fact("F1", "p.md", "learned cannot run at 2L", (L.Value("markov", "learned", 128),),
                    lambda got: all(v is None for v in got["markov/learned/128"]))
    e = _verdict(cannot)
    assert e.verdict == "confirmed" and e.p is None and "cannot run" in e.evidence
    wrong = L.Fact("F2", "p.md", "learned runs at 2L", cannot.values_,
                   lambda got: all(v is not None for v in got["markov/learned/128"]))
    assert _verdict(wrong).verdict == "refuted"


def test_a_sentence_follows_its_entry_and_links_it(records, monkeypatch):
    """``either`` states the ordering only while the entry is confirmed; ``mark`` links it with its verdict."""
    full, twice, write = records
    claim = L.Less("X9", "schemes/p.md", "alibi below rope at L", L.Value("markov", "alibi", 64),
                   L.Value("markov", "rope", 64))
    for s in L.TASK_SEEDS["markov"]:
        write(full, "markov", "alibi", s, {64: 0.01 + 0.001 * s})
        write(full, "markov", "rope", s, {64: 0.50 + 0.01 * s})
    monkeypatch.setattr(L, "build", lambda: {"X9": _verdict(claim)})
    said = L.either("X9", "schemes/p.md", "ALiBi is lower", "both near 0.01 and 0.5")
    assert said.startswith("ALiBi is lower ([X9: confirmed, Holm p = ") and "(../../claims/#x9))" in said
    for s in L.TASK_SEEDS["markov"]:
        write(full, "markov", "rope", s, {64: 0.01 + 0.002 * s})                 # no longer resolved
    L._read.cache_clear()
    said = L.either("X9", "schemes/p.md", "ALiBi is lower", "0.011 against 0.012")
    assert said.startswith("0.011 against 0.012 ([X9: not resolved")


def test_links_from_code_output_follow_the_generator(monkeypatch):
    """mkdocs leaves code-block output alone (built URLs); Zensical rewrites it from the source folder.
    Expected values worked by hand from the built layout: schemes/alibi.md is built at schemes/alibi/."""
    from docs.hooks.links import site_url
    monkeypatch.delenv("MINIPOS_DOCS_GENERATOR", raising=False)
    assert site_url("schemes/alibi.md", "claims", "m5") == "../../claims/#m5"
    assert site_url("index.md", "claims", "m5") == "claims/#m5"
    assert site_url("claims.md", "claims.json", file=True) == "../claims.json"
    monkeypatch.setenv("MINIPOS_DOCS_GENERATOR", "zensical")
    assert site_url("schemes/alibi.md", "claims", "m5") == "../claims/#m5"
    assert site_url("article-table.md", "source/alibi") == "source/alibi/"


def test_the_stated_holm_bounds_follow_the_claims_the_ledger_tests():
    # lab/README.md states "0.05 / m" and the t a test over three (and five) seeds needs. Student's upper
    # tail has closed forms at 2 degrees of freedom, (1 - t / sqrt(t^2 + 2)) / 2, and at 4,
    # (1 - t (t^2 + 6) / (t^2 + 4)^(3/2)) / 2: the stated t, rounded to a tenth, must just pass the bound.
    import re
    from pathlib import Path

    from docs.hooks import claims

    m = sum(not isinstance(c, L.Fact) for c in claims.LAB)
    tail = {2: lambda t: (1 - t / math.sqrt(t * t + 2)) / 2,
            4: lambda t: (1 - t * (t * t + 6) / (t * t + 4) ** 1.5) / 2}
    readme = (Path(__file__).resolve().parents[1] / "lab" / "README.md").read_text(encoding="utf-8")
    text = " ".join(readme.split())
    three = re.search(r"0\.05 / (\d+) .*? needs t > ([\d.]+)", text)
    assert three and int(three[1]) == m, (three and three[1], m)
    five = re.search(r"Five seeds give 4 degrees of freedom \(t > ([\d.]+)\)", text)
    assert five, "lab/README.md no longer states the five-seed bound"
    for df, t in ((2, float(three[2])), (4, float(five[1]))):
        assert tail[df](t) < 0.05 / m < tail[df](t - 0.1), (df, t)
