"""Tests of the ``minipos`` command. The expected facts are the schemes' textbook properties:
relative schemes ignore a common shift of positions, absolute ones do not, and only a learned
table stops at its training length."""

import json

import pytest

from minipos import __version__
from minipos.cli import main

EXPECTED = {  # scheme: (shift-invariant, runs at 4x the training length)
    "nope": (True, True), "sinusoidal": (False, True), "learned": (False, False),
    "alibi": (True, True), "t5": (True, True), "transformer-xl": (True, True),
    "deberta": (True, True), "rope": (True, True), "xpos": (True, True), "mla-rope": (True, True),
}


def test_tour_json_reports_measured_properties(capsys):
    assert main(["tour", "--json", "--d-model", "32", "--heads", "2", "--seq-len", "16"]) == 0
    data = json.loads(capsys.readouterr().out)
    got = {r["scheme"]: (r["shift_invariant"], r["runs_at_4x"]) for r in data["schemes"]}
    assert got == EXPECTED
    params = {r["scheme"]: r["position_params"] for r in data["schemes"]}
    # learned table 16 x 32; T5 table 32 buckets x 2 heads; XL u, v (2 x 16) and w_r (32 x 32);
    # DeBERTa rel_embeddings (2 * 256) x 32
    assert params == {"nope": 0, "sinusoidal": 0, "learned": 512, "alibi": 0, "t5": 64,
                      "transformer-xl": 2 * 2 * 16 + 32 * 32, "deberta": 512 * 32, "rope": 0, "xpos": 0,
                      "mla-rope": 0}


def test_tour_table_lists_every_scheme(capsys):
    assert main(["tour", "--seq-len", "8"]) == 0
    out = capsys.readouterr().out
    for name in EXPECTED:
        assert name in out


def test_version_and_bad_options(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0 and __version__ in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["tour", "--heads", "0"])
    assert "--heads" in capsys.readouterr().err
