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
        assert r["lab_measured"]["markov_learned"] == (markov["converged"] == markov["learned"] == n_seeds)
        far = retrieval.get("offsets", {}).get("1024", {}).get("1017", "cannot run")
        got = r["lab_measured"]["retrieval_far"]
        assert got == far if far == "cannot run" else got["mean"] == far["mean"]
    rows = {r["scheme"]: r["lab_measured"] for r in data["schemes"]}
    assert rows["learned"]["markov_excess"]["1024"] == "cannot run"    # a 64-row table stops at 64


def test_tour_table_shows_recorded_numbers_and_their_source(capsys):
    summary = _summary()
    assert main(["tour", "--seq-len", "8"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("rope "))
    rope = summary["markov"]["rows"]["rope"]["lengths"]
    assert " / ".join(f"{rope[n]['mean']:.3f}±{rope[n]['se']:.3f}" for n in ("64", "256", "1024")) in line
    nope = next(x for x in out.splitlines() if x.startswith("nope "))
    markov_nope = summary["markov"]["rows"]["nope"]
    n_seeds = len(markov_nope["seeds"])
    assert ("(not learned)" in nope) == (not markov_nope["converged"] == markov_nope["learned"] == n_seeds)
    assert f"{summary['retrieval']['rows']['rope']['offsets']['1024']['1017']['mean']:.2f}" in line.split()[-1]
    assert "lab/results/full" in out and "not run now" in out


def test_tour_says_not_measured_for_a_scheme_without_a_record(capsys, monkeypatch):
    real = cli.lab_measured()
    del real["schemes"]["alibi"]
    monkeypatch.setattr(cli, "lab_measured", lambda: real)
    assert main(["tour", "--seq-len", "8"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("alibi "))
    assert line.count("not measured") == 2
    assert main(["tour", "--json", "--seq-len", "8"]) == 0
    rows = {r["scheme"]: r for r in json.loads(capsys.readouterr().out)["schemes"]}
    assert rows["alibi"]["lab_measured"] is None and rows["rope"]["lab_measured"] is not None


def test_tour_headers_say_what_the_columns_test(capsys):
    # "relative? yes" for NoPE misled: the shift keeps the sequence start under the causal mask, from
    # which NoPE reads absolute position (why-position.md shows 1/(t+1) recovered from the mask alone);
    # "runs at 4T" is whether the forward pass runs, not whether a trained model works there
    assert main(["tour", "--seq-len", "8"]) == 0
    out = capsys.readouterr().out
    header = next(x for x in out.splitlines() if x.startswith("scheme "))
    assert "shift-invariant given the mask" in header and "runs at 32 (not quality)" in header
    assert "relative" not in header
    assert "cannot see the" in out and "absolute position a causal model reads from the mask" in out
    assert "whether a trained model" in out
