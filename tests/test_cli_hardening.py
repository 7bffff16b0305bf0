"""``minipos tour`` turns every bad or oversized option into a one-line usage error, and ``tour()``
refuses the same arguments with ``ValueError``/``TypeError``. The limits are the ones ``--help``
states; they keep a tour to seconds (``--seq-len 2000`` used to run for minutes at gigabytes)."""

import pytest

from minipos import cli
from minipos.cli import main, tour


@pytest.mark.parametrize("argv, option", [
    (["--d-model", "7", "--heads", "7"], "--heads"),     # head dim 1: RoPE rotates pairs
    (["--d-model", "6", "--heads", "2"], "--heads"),     # head dim 3
    (["--d-model", "7", "--heads", "1"], "--d-model"),   # head dim 7
    (["--d-model", "64", "--heads", "3"], "--heads"),    # does not divide
    (["--seed", "-1"], "--seed"),
    (["--seed", str(2**32)], "--seed"),
    (["--seq-len", "2000"], "--seq-len"),
    (["--seq-len", "0"], "--seq-len"),
    (["--d-model", "100000", "--heads", "4"], "--d-model"),
    (["--d-model", "0"], "--d-model"),
    (["--heads", "1000"], "--heads"),
    (["--heads", "x"], "--heads"),
])
def test_a_bad_option_is_a_one_line_usage_error(capsys, argv, option):
    with pytest.raises(SystemExit) as exit_info:
        main(["tour", *argv])
    assert exit_info.value.code == 2
    out, err = capsys.readouterr()
    errors = [line for line in err.splitlines() if "error:" in line]
    assert out == "" and "Traceback" not in err
    assert len(errors) == 1 and errors[0].startswith("minipos tour: error: ") and option in errors[0], err


def test_help_states_the_limits(capsys):
    with pytest.raises(SystemExit):
        main(["tour", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    limits = cli.TOUR_LIMITS
    assert f"at most {limits['seq_len']}" in text and f"at most {limits['d_model']}" in text
    assert f"at most {limits['heads']}" in text and "even" in text and f"{cli.MAX_SEED}" in text


@pytest.mark.parametrize("kwargs, error, words", [
    (dict(d_model=7, heads=7), ValueError, "head dim d_model / heads = 1 must be even"),
    (dict(d_model=12, heads=4), ValueError, "^heads: the head dim"),
    (dict(d_model=64, heads=3), ValueError, "heads .3. must divide d_model .64."),
    (dict(seed=-1), ValueError, "seed"),
    (dict(seq_len=2000), ValueError, "seq_len"),
    (dict(seq_len=0), ValueError, "seq_len"),
    (dict(d_model=10**6), ValueError, "d_model"),
    (dict(heads=1000), ValueError, "heads must be at most"),
    (dict(d_model=64.0), TypeError, "d_model"),
    (dict(heads=True), TypeError, "heads"),
    (dict(seed="0"), TypeError, "seed"),
])
def test_tour_refuses_bad_arguments(kwargs, error, words):
    with pytest.raises(error, match=words):
        tour(**kwargs)


def test_the_smallest_and_largest_allowed_tours_run():
    every = len(cli.tour_schemes(1)) + len(cli.tour_layers(1))        # one row per scheme or layer setting
    assert len(tour(d_model=2, heads=1, seq_len=1, seed=0)) == every
    limits = cli.TOUR_LIMITS
    rows = tour(d_model=limits["d_model"], heads=limits["heads"], seq_len=limits["seq_len"], seed=cli.MAX_SEED)
    assert len(rows) == every and all(r["output_norm"] > 0 for r in rows)


# python -m lab and python -m lab.corpus: a closed pipe and a full stdout, as the other commands
import io                                                                # noqa: E402
import os                                                                # noqa: E402
from contextlib import redirect_stdout                                   # noqa: E402


class _ClosedPipe(io.TextIOBase):
    def writable(self):
        return True

    def write(self, text):
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("module, argv", [
    ("lab.__main__", ["--print-commands", "--tasks", "markov", "--schemes", "rope", "--seeds", "0"]),
    ("lab.corpus", ["--help"]),
])
def test_the_lab_commands_end_quietly_on_a_closed_pipe_and_in_one_line_on_a_full_disk(capsys, module, argv):
    import importlib
    main = importlib.import_module(module).main
    with redirect_stdout(_ClosedPipe()):
        assert main(argv) == 1                                           # ends, without a word
    assert capsys.readouterr().err == ""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    with open("/dev/full", "w") as full, redirect_stdout(full):
        assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err and "Traceback" not in err
