"""The committed conformance results are well formed, and the docs page shows every one of them.

Reads ``spec/conformance/results/`` and ``docs/conformance.md`` only: no library under test
(torch, keras, ...) is imported. What a result must say comes from the runner's contract
(``spec/conformance/run.py``) and the golden vectors it ran.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFORMANCE = os.path.join(ROOT, "spec", "conformance")
PAGE = os.path.join(ROOT, "docs", "conformance.md")
sys.path.insert(0, os.path.join(ROOT, "spec"))
sys.path.insert(0, CONFORMANCE)

import report  # noqa: E402
import run  # noqa: E402
from check_port import load_family  # noqa: E402

RESULTS = report.load_results()
PROBES = report.load_probes()
KEYS = {"format", "library", "label", "versions", "run_date", "component", "family", "precision", "spec_version",
        "vectors_minipos_version", "conventions", "summary", "cases"}


def page() -> str:
    with open(PAGE, encoding="utf-8") as f:
        return f.read()


def test_every_library_of_the_runner_has_results_and_probes():
    assert report.ORDER == list(run.LIBRARIES)
    assert {doc["library"] for _, doc in RESULTS} == set(run.LIBRARIES)
    assert set(PROBES) == set(run.LIBRARIES)


@pytest.mark.parametrize("path, doc", RESULTS, ids=[p for p, _ in RESULTS])
def test_result_is_well_formed(path, doc):
    assert set(doc) == KEYS
    assert doc["format"] == "minipos-conformance"
    assert path == f"{doc['library']}/{run.slug(doc['component'])}__{doc['family']}.json"
    assert doc["label"] == run.LIBRARIES[doc["library"]][2]
    assert {"python", "numpy"} <= set(doc["versions"]) and all(isinstance(v, str) for v in doc["versions"].values())
    datetime.date.fromisoformat(doc["run_date"])
    assert doc["precision"] in ("float64", "float32")
    assert all(isinstance(c, str) and c for c in doc["conventions"])
    family = load_family(doc["family"])
    # A run of these very vectors, every case in order: CI remakes the results (run.py --check) and fails on
    # any difference, so a new spec version or a new case must come with the results rerun.
    assert doc["spec_version"] == family["spec_version"], "vectors changed since this run: rerun run.py --out"
    assert [case["name"] for case in doc["cases"]] == [case["name"] for case in family["cases"]]
    counts = {s: sum(case["status"] == s for case in doc["cases"]) for s in report.STATUSES}
    assert doc["summary"] == counts


@pytest.mark.parametrize("path, doc", RESULTS, ids=[p for p, _ in RESULTS])
def test_each_case_says_why(path, doc):
    for case in doc["cases"]:
        assert case["status"] in report.STATUSES, case["name"]
        if case["status"] == "not_expressible":
            assert case["reason"].strip(), case["name"]
            assert "mismatches" not in case
        elif case["status"] == "failed":
            assert case.get("error") or case["mismatches"], case["name"]
        else:
            assert case["mismatches"] == [] and "error" not in case, case["name"]
        for m in case.get("mismatches", []):   # a recorded mismatch is one under the case's own rule
            if isinstance(m["got"], str) or isinstance(m["abs_error"], str):   # run.py's words for NaN, infinity
                assert m["abs_error"] in ("NaN", "Infinity"), (case["name"], m)
                continue
            assert m["abs_error"] == pytest.approx(abs(m["got"] - m["expected"]), rel=1e-9, abs=1e-300)
            assert not m["abs_error"] <= m["atol"] + m["rtol"] * abs(m["expected"]), (case["name"], m)


def test_probes_ran():
    for run_id, doc in PROBES.items():
        assert doc["library"] == run_id
        for p in doc["probes"]:
            assert "error" not in p, (run_id, p)
            assert p["name"] and p["input"] and "output" in p


def test_the_table_has_a_row_per_result_file():
    rows = report.table().splitlines()[2:]
    assert len(rows) == len(RESULTS)
    for row, (_, doc) in zip(rows, RESULTS):
        cells = [c.strip() for c in re.split(r"(?<!\\)\|", row)[1:-1]]
        s = doc["summary"]
        assert cells[:6] == [doc["label"], doc["component"], f"`{doc['family']}`", str(s["passed"]),
                             str(s["failed"]), str(s["not_expressible"])]


def test_the_page_builds_its_tables_from_the_results():
    text = page()
    for call in ("report.totals()", "report.table()", "report.conventions()", "report.not_expressible()"):
        assert re.search(r'```python exec="on"[^\n]*\n(?:(?!```).)*print\(' + re.escape(call) + r"\)", text, re.S), call
    # markdown-exec prefixes the anchors of what a block prints unless idprefix is empty: the
    # table's links to the headings below must stay as written
    assert re.search(r'```python exec="on" idprefix=""\n(?:(?!```).)*print\(report\.table\(\)\)', text, re.S)


def test_every_failure_is_explained_on_the_page():
    headings = {report.slug(h) for h in re.findall(r"^### (.+)$", page(), re.M)}
    failing = {(doc["library"], doc["component"], doc["family"]) for _, doc in RESULTS if doc["summary"]["failed"]}
    assert failing == set(report.EXPLAINED)
    for heading in report.EXPLAINED.values():
        assert report.slug(heading) in headings, heading


def test_every_probe_is_shown_and_every_shown_probe_exists():
    shown = set(re.findall(r'report\.probe\("([^"]+)", "([^"]+)"\)', page()))
    recorded = {(run_id, p["name"]) for run_id, doc in PROBES.items() for p in doc["probes"]}
    assert shown <= recorded, shown - recorded
    names = lambda pairs: {name for _, name in pairs}
    assert names(recorded) == names(shown), names(recorded) - names(shown)   # each probe, on one backend at least
    for run_id, family in re.findall(r'report\.failures\("([^"]+)", "([^"]+)"\)', page()):
        assert report.failures(run_id, family).startswith("```text")


def test_a_failure_without_explanation_fails_the_table():
    doc = {**RESULTS[0][1], "library": "somewhere", "label": "somewhere", "component": "X", "family": "rope",
           "summary": {"passed": 0, "failed": 1, "not_expressible": 0}}
    with pytest.raises(ValueError, match="no explanation"):
        report.table([("somewhere/X__rope.json", doc)])


def test_slug_matches_the_anchors_of_the_toc_extension():
    # the ids printed by Python-Markdown 3's markdown.extensions.toc.slugify(heading, "-")
    assert report.slug("keras-hub: dynamic (R = 128)") == "keras-hub-dynamic-r-128"
    assert report.slug("get_embedding at dims 2 and 3") == "get_embedding-at-dims-2-and-3"


def test_the_page_is_in_the_nav():
    with open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8") as f:
        assert "Public implementations against the spec: conformance.md" in f.read()


def test_results_are_json_as_the_runner_writes_it():
    for path, doc in RESULTS:
        with open(os.path.join(report.RESULTS, path), encoding="utf-8") as f:
            assert f.read() == json.dumps(doc, indent=1) + "\n", path


def test_check_takes_a_last_bit_for_the_same_and_a_real_change_for_a_difference():
    # 0.9897959110688194 and ...195 are the last score of the probe rotary_embedding_torch_xpos_cached_step:
    # the committed value and the one torch 2.13.0 remade on an Intel Xeon, one ulp apart.
    assert run.same({"x": [0.9897959110688194, "a", 3]}, {"x": [0.9897959110688195, "a", 3]})
    assert run.same(1e-17, -1e-17)
    assert not run.same(0.9897959110688194, 0.9897959110688194 * (1 + 1e-7))
    assert not run.same({"x": [1.0, 2.0]}, {"x": [1.0]})
    assert not run.same({"x": 1.0}, {"y": 1.0})
    assert not run.same(True, 1) and not run.same(1.0, True) and not run.same("1", 1)
    assert not run.same(2, 3)


def test_check_names_each_differing_or_missing_file_and_leaves_run_date_aside(tmp_path):
    made, committed = tmp_path / "made", tmp_path / "committed"
    for root, date, value in ((made, "2026-12-03", 0.9897959110688195), (committed, "2026-12-01", 0.9897959110688194)):
        (root / "lib").mkdir(parents=True)
        (root / "lib" / "a.json").write_text(json.dumps({"run_date": date, "v": value}))
        (root / "lib" / "b.json").write_text(json.dumps({"run_date": date, "v": value * (1 + (root == made) * 1e-6)}))
    (committed / "lib" / "c.json").write_text("{}")
    assert run.differences(str(made), str(committed), ["lib"]) == ["lib/b.json: differs",
                                                                   "lib/c.json: not made by this run"]
