"""Tests of the ``minipos`` command. The expected facts are the schemes' textbook properties:
relative schemes ignore a common shift of positions, absolute ones do not, and only a learned
table stops at its training length."""

import json
from pathlib import Path

import pytest

from minipos import __version__, cli, schemes
from minipos.cli import main
from _schemes import SHIFT_INVARIANT

# Textbook facts, (shift-invariant, runs at 4x the training length): the schemes named in
# _schemes.SHIFT_INVARIANT (only a learned table stops at its length), then the tour's layer rows. A
# scheme registered later has its tour row checked by the contract suite (test_contract.py) and its
# facts in its own tests; nothing here needs an edit for it.
LAYER_ROWS = {
    "rope+window": (True, True),         # a window of seq_len / 4 positions: relative, and no table to outgrow
    "rope+chunks": (False, True),        # chunks of 3 T / 8 start at absolute positions: a shift of T / 2 moves them
    "rope+sinks": (True, True),          # a constant extra logit per head: relative stays relative
    "mla-rope": (True, True),
}
EXPECTED = {**{name: (invariant, name != "learned") for name, invariant in SHIFT_INVARIANT.items()}, **LAYER_ROWS}
# Learned position parameters at d_model 32, 2 heads, seq_len 16: learned table 16 x 32; T5 table 32
# buckets x 2 heads; XL u, v (2 x 16) and w_r (32 x 32); DeBERTa rel_embeddings (2 * 256) x 32; Shaw
# w_k, w_v (2 * 16 + 1) x 16, shared by the heads; none for the others named in EXPECTED.
PARAMS = {
    "learned": 16 * 32,
    "t5": 32 * 2,
    "transformer-xl": 2 * 2 * 16 + 32 * 32,
    "deberta": 512 * 32,
    "shaw": 2 * 33 * 16,
}


def _rows():
    """Every row the tour must show: one per registered scheme, then its layer rows."""
    return [*schemes.ENTRIES, *(label for label, _, _ in cli.tour_layers(16))]


def test_tour_json_reports_measured_properties(capsys):
    assert main(["tour", "--json", "--d-model", "32", "--heads", "2", "--seq-len", "16"]) == 0
    data = json.loads(capsys.readouterr().out)
    got = {r["scheme"]: (r["shift_invariant"], r["runs_at_4x"]) for r in data["schemes"]}
    assert list(got) == _rows()
    assert {name: got[name] for name in EXPECTED} == EXPECTED
    params = {r["scheme"]: r["position_params"] for r in data["schemes"]}
    assert {name: params[name] for name in EXPECTED} == {name: PARAMS.get(name, 0) for name in EXPECTED}


def test_tour_table_lists_every_scheme(capsys):
    assert main(["tour", "--seq-len", "8"]) == 0
    out = capsys.readouterr().out
    for name in _rows():
        assert name in out


def test_version_and_bad_options(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and __version__ in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["tour", "--heads", "0"])
    assert "--heads" in capsys.readouterr().err


# The lab's committed summary (mean over seeds of each record) is the source of the tour's recorded
# columns; it is read here directly, not through the code that ships the numbers.
SUMMARY = Path(__file__).resolve().parent.parent / "lab" / "results" / "full" / "summary.json"


def _summary():
    if not SUMMARY.exists():
        pytest.skip("the lab's records are in a checkout only")
    return json.loads(SUMMARY.read_text(encoding="utf-8"))


def test_tour_json_carries_the_lab_numbers_of_the_committed_summary(capsys):
    summary = _summary()
    assert main(["tour", "--json", "--seq-len", "8"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["lab_measured"]["lengths"] == [64, 256, 1024]          # L = 64, 4L, 16L of the protocol
    assert data["lab_measured"]["far"] == {"length": 1024, "offset": 1017}
    recorded = {name for name in summary["markov"]["rows"] if "+" not in name and "@" not in name}
    for r in data["schemes"]:
        key = r["scheme"]
        if key not in recorded:                                         # a scheme the lab did not train
            assert r["lab_measured"] is None
            continue
        markov = summary["markov"]["rows"][key]
        retrieval = summary["retrieval"]["rows"][key]
        for n in ("64", "256", "1024"):
            want = markov["lengths"][n]
            got = r["lab_measured"]["markov_excess"][n]
            assert got == want if want == "cannot run" else (got["mean"], got["se"]) == (want["mean"], want["se"])
        n_seeds = len(markov["seeds"])
        # every seed ended as its schedule prescribes (a plateau reached, or a fixed budget run out) and learned
        ended = markov.get("converged", 0) + markov.get("fixed", 0)
        assert r["lab_measured"]["markov_learned"] == (ended == markov["learned"] == n_seeds)
        far = retrieval.get("offsets", {}).get("1024", {}).get("1017", "cannot run")
        got = r["lab_measured"]["retrieval_far"]
        assert got == far if far == "cannot run" else got["mean"] == far["mean"]
    rows = {r["scheme"]: r["lab_measured"] for r in data["schemes"]}
    assert rows["learned"]["markov_excess"]["1024"] == "cannot run"    # a 64-row table stops at 64


def _lab_line(out: str, scheme: str) -> str:
    """The row of ``scheme`` in the table the lab recorded (the second table: cells with ``±``)."""
    return next(x for x in out.splitlines() if x.startswith(f"{scheme} ") and "±" in x)


def test_tour_table_shows_recorded_numbers_and_their_source(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "80")
    summary = _summary()
    assert main(["tour", "--seq-len", "8"]) == 0
    out = capsys.readouterr().out
    line = _lab_line(out, "rope")
    rope = summary["markov"]["rows"]["rope"]["lengths"]
    assert line.split()[1:4] == [f"{rope[n]['mean']:.3f}±{rope[n]['se']:.3f}" for n in ("64", "256", "1024")]
    markov_nope = summary["markov"]["rows"]["nope"]
    n_seeds = len(markov_nope["seeds"])
    ended = markov_nope.get("converged", 0) + markov_nope.get("fixed", 0)     # plateau reached or budget run out
    learned = ended == markov_nope["learned"] == n_seeds
    assert (_lab_line(out, "nope").split()[2] == "*") == (not learned)       # the first cell's mark
    assert f"{summary['retrieval']['rows']['rope']['offsets']['1024']['1017']['mean']:.2f}" in line.split()[-1]
    text = " ".join(out.split())
    assert "lab/results/full" in text and "not run now" in text and "*: not learned" in text


def test_tour_lists_a_scheme_without_a_record_as_not_measured(capsys, monkeypatch):
    real = cli.lab_measured()
    del real["schemes"]["alibi"]
    monkeypatch.setattr(cli, "lab_measured", lambda: real)
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["tour", "--seq-len", "8"]) == 0
    out = capsys.readouterr().out
    assert not any(x.startswith("alibi ") and "±" in x for x in out.splitlines())
    assert "alibi" in next(x for x in out.splitlines() if x.startswith("Not measured by the lab:"))
    assert main(["tour", "--json", "--seq-len", "8"]) == 0
    rows = {r["scheme"]: r for r in json.loads(capsys.readouterr().out)["schemes"]}
    assert rows["alibi"]["lab_measured"] is None and rows["rope"]["lab_measured"] is not None


def test_tour_headers_and_keys_say_what_the_columns_test(capsys, monkeypatch):
    # "relative? yes" for NoPE misled: the shift keeps the sequence start under the causal mask, from
    # which NoPE reads absolute position (why-position.md shows 1/(t+1) recovered from the mask alone);
    # "runs at 4T" is whether the forward pass runs, not whether a trained model works there
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["tour", "--seq-len", "8"]) == 0
    out = capsys.readouterr().out
    header = next(x for x in out.splitlines() if x.startswith("scheme ") and "seams" in x)
    assert "shift-inv." in header and "runs at 4T" in header and "relative" not in header
    text = " ".join(out.split())
    assert "shift-inv. (shift-invariant given the mask): yes:" in text and "runs at 4T: yes:" in text
    assert "cannot see the absolute position a causal model reads from the mask" in text
    assert "runs at 4T = 32 positions" in text and "It says nothing about quality there" in text


def test_tour_has_one_training_length_per_table(capsys, monkeypatch):
    # the tour's T (--seq-len) for what it measures now, the lab's L for what it recorded: never mixed
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["tour", "--seq-len", "16"]) == 0
    out = capsys.readouterr().out
    now, recorded = out.split("Recorded by the lab")
    assert "training length T = 16" in " ".join(now.split()) and "L = " not in now
    assert "training length L = 64" in " ".join(recorded.split()) and "T = " not in recorded


@pytest.mark.parametrize("columns", [80, 100, 132])
def test_tour_fits_the_terminal_and_explains_every_column_and_every_no(capsys, monkeypatch, columns):
    monkeypatch.setenv("COLUMNS", str(columns))
    assert main(["tour"]) == 0
    out = capsys.readouterr().out
    assert max(map(len, out.splitlines())) <= columns
    text = " ".join(out.split())
    for column in ("seams:", "params:", "terms:", "shift-inv.", "runs at 4T:", "excess at N:", "recall 1017 back:"):
        assert column in text, column
    for no in ("shift-inv. (shift-invariant given the mask): yes:", "; no: they change", "; no: it raises",
               "n/a: the scheme cannot run", "*: not learned"):
        assert no in text, no
    assert "learned: positions must be <" in text          # the reason of the one scheme that does not run at 4T


def test_help_shows_no_rest_markup(capsys):
    for argv in ([], ["--help"], ["tour", "--help"], ["vectors", "--help"], ["vectors", "check", "--help"],
                 ["vectors", "export", "--help"]):
        try:
            main(argv)
        except SystemExit:
            pass
        out = capsys.readouterr().out
        assert "usage: minipos" in out and "``" not in out and ":func:" not in out, argv
