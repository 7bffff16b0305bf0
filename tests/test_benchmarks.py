"""Smoke test of ``python -m benchmarks --quick``: it runs and prints every row. No timing is
asserted (times belong to the machine, not to the code)."""

from __future__ import annotations

import numpy as np

from benchmarks import __main__ as bench
from benchmarks._timing import Row, interleaved, table


def test_table_layout_by_hand():
    rows = [Row("a", 0.002, 0.004, 0.5, "< 1", True), Row("bb", None, None, None, "<= 1", None, note="skipped")]
    assert table(rows).splitlines() == [
        "| benchmark | minipos | reference | ratio | target | result     |",
        "|-----------|---------|-----------|-------|--------|------------|",
        "| a         | 2.00 ms | 4.00 ms   | 0.500 | < 1    | target met |",
        "| bb        | -       | -         | -     | <= 1   | skipped    |",
    ]


def test_interleaved_runs_both_sides_alternately_each_timed_call_after_its_own():
    order = []
    interleaved(lambda: order.append("f"), lambda: order.append("g"), repeats=2)
    assert order == ["f", "g"] + ["f", "f", "g", "g"] * 2           # a warm-up, then 2 pairs, each after its own


def test_quick_marks_every_target_indicative_by_hand():
    rows = [Row("a", 0.002, 0.004, 0.5, "< 1", True), Row("b", 0.004, 0.002, 2.0, "< 1", False)]
    assert [line.split("|")[-2].strip() for line in table(rows, indicative=True).splitlines()[2:]] == [
        "indicative: met", "indicative: not met"]


def test_progress_is_printed_as_each_group_starts(monkeypatch):
    events = []
    row = Row("a", 1.0, 1.0, 1.0, "< 2", True)
    monkeypatch.setattr(bench, "groups", lambda quick: [("first", lambda: events.append("measure first") or [row]),
                                                        ("second", lambda: events.append("measure second") or [row])])
    text = bench.run(True, progress=events.append)
    assert [e.split(" (")[0] for e in events] == ["benchmarks: 1/2 first", "measure first", "benchmarks: 2/2 second",
                                                  "measure second"]
    assert text.count("indicative: met") == 2


def test_quick_run_prints_every_row_and_progress_as_it_goes(capsys):
    assert bench.main(["--quick"]) == 0
    out, err = capsys.readouterr()
    progress = [line for line in err.splitlines() if line.startswith("benchmarks: ")]
    assert len(progress) == len(bench.groups(True)) and progress[0].startswith("benchmarks: 1/")
    assert "TARGET MISSED" not in out and "indicative" in out
    rows = [line for line in out.splitlines() if line.startswith("| ") and "benchmark" not in line]
    names = " ".join(rows)
    for part in ("reference attention(bias, mask)", "fast attention(bias, mask)", "reference blockwise_attention",
                 "fast blockwise_attention", "reference layer", "fast layer", "reference apply_rope half",
                 "fast apply_rope interleaved", "t5_bias", "XL rel_shift", "DeBERTa", "ALiBi bias per causal block",
                 "peak RSS", "decode 1 token", "blockwise_attention_backward", "torch autograd backward",
                 "lab: one training step"):
        assert part in names, part
    for line in rows:
        result = line.rstrip(" |").rsplit("|", 1)[1].strip()
        assert result.startswith(("indicative: met", "indicative: not met", "skipped", "info")), line
        ratio = line.split("|")[4].strip()
        assert ratio == "-" or np.isfinite(float(ratio)), line
