"""The extrapolation page's corpus findings (docs/hooks/findings.py): every sentence reads true alone,
whatever verdict its neighbours' entries have."""

import itertools
import re

import pytest

from docs.hooks import findings
from docs.hooks import ledger as L

PAGE = "extrapolation.md"
# What sentence n must name by itself: its schemes (as written on the page) and the means it quotes,
# as (scheme, factor of L). A sentence that leaned on its neighbour ("So is RoPE's", "It is below
# sinusoidal's too") would lose one of them.
NAMES = {1: ["sinusoidal"], 2: ["RoPE"], 3: ["ALiBi", "RoPE"], 4: ["ALiBi", "sinusoidal"], 5: ["T5"],
         6: ["ALiBi", "T5"]}
MEANS = {1: [("sinusoidal", 1), ("sinusoidal", 2)], 2: [("rope", 1), ("rope", 2)],
         3: [("alibi", 16), ("rope", 16)], 4: [("sinusoidal", 16)], 5: [("t5", 2), ("t5", 16)], 6: []}
ANAPHORA = re.compile(r"^(So|It|This|These|That|Too|Also|Neither|Likewise)\b|\b(too|also|likewise)\b")
SCHEMES = ["sinusoidal", "rope", "alibi", "t5"]


def _mean(name, f):
    """A distinct number for every (scheme, factor), so that each quoted value names its cell."""
    return 1 + SCHEMES.index(name) * 0.1 + f * 0.001


def _stands_alone(sentence, n):
    """The problems of sentence ``n`` read alone: an anaphor, a scheme it does not name, a number it lacks."""
    text = sentence.split(" ([")[0]
    problems = [f"anaphor {m.group(0)!r}" for m in [ANAPHORA.search(text)] if m]
    problems += [f"does not name {s}" for s in NAMES[n] if s.lower() not in text.lower()]
    problems += [f"lacks {k} at {f}L" for k, f in MEANS[n] if format(_mean(k, f), ".3f") not in text]
    return problems


def _ledger(verdicts):
    """A ledger whose entries X1-X6 (T on code, P on prose) have the given verdicts."""
    out = {}
    for x in findings.PREFIX.values():
        for n, v in enumerate(verdicts, 1):
            out[f"{x}{n}"] = L.Entry(f"{x}{n}", PAGE, "", "lab", verdict=v, p=0.01, p_holm=0.02)
    for c in ("C5", "C6"):
        out[c] = L.Entry(c, PAGE, "", "cite", verdict="confirmed")
    return out


def _sentences(paragraph):
    return re.split(r"(?<=\)\)\.) ", paragraph)


@pytest.mark.parametrize("task", ["text", "prose"])
def test_every_sentence_stands_alone_under_every_combination_of_verdicts(task, monkeypatch):
    x = findings.PREFIX[task]
    for verdicts in itertools.product(["confirmed", "not resolved"], repeat=6):
        monkeypatch.setattr(L, "build", lambda v=verdicts: _ledger(v))
        said = _sentences(findings.corpus_findings(task, _mean, PAGE))
        assert len(said) == 7, said
        for n, (sentence, verdict) in enumerate(zip(said, verdicts), 1):
            assert f"[{x}{n}: {verdict}" in sentence, sentence
            assert ("not resolved" in sentence.split(" ([")[0]) == (verdict != "confirmed"), sentence
            assert _stands_alone(sentence, n) == [], (sentence, _stands_alone(sentence, n))
        close = said[-1]
        assert ("Each of these is Press et al.'s pattern" in close) == all(v == "confirmed" for v in verdicts)
        assert "[C5: confirmed" in close and "[C6: confirmed" in close


def test_the_check_catches_a_sentence_that_leans_on_its_neighbour():
    # The two sentences the page once printed, read alone.
    rope = f"{_mean('rope', 1):.3f} at L, {_mean('rope', 2):.3f} at 2L"
    assert _stands_alone(f"So is RoPE's ({rope}) ([P2: confirmed](x)).", 2) == ["anaphor 'So'"]
    assert "does not name sinusoidal" in _stands_alone(
        f"It is below that too ({_mean('sinusoidal', 16):.3f}) ([P4: confirmed](x)).", 4)


def test_an_unknown_task_is_refused():
    with pytest.raises(ValueError, match="task must be one of"):
        findings.corpus_findings("markov", _mean, PAGE)
