"""``python -m lab``'s command line: every mistake is a one-line usage error before any work, a
damaged record is a failed check of ``--verify``, and records are written atomically with the
umask's mode. Nothing here trains: the training entry point is replaced where a command would run."""

import errno
import json
import re
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from lab import record as records

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_a_record_gets_the_mode_the_umask_gives_a_new_file(tmp_path, umask, mode):
    old = os.umask(umask)
    try:
        path = records.write_json(tmp_path / "r.json", {"a": 1})
        again = records.write_json(path, {"a": 2})                       # a replaced record too
    finally:
        os.umask(old)
    assert again == path and json.loads(path.read_text()) == {"a": 2}
    assert path.stat().st_mode & 0o777 == mode
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]            # no temp file left


WRITER = """
import sys
from lab import record
big = {"numbers": list(range(200000))}
record.write_json(sys.argv[1], {"old": True})
print("ready", flush=True)
while True:
    record.write_json(sys.argv[1], big)
"""


def test_a_record_survives_a_kill_mid_write(tmp_path):
    path = tmp_path / "r.json"
    for delay in (0.05, 0.2):
        child = subprocess.Popen([sys.executable, "-c", WRITER, str(path)], cwd=ROOT, stdout=subprocess.PIPE,
                                 text=True)
        assert child.stdout.readline() == "ready\n"
        try:
            child.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
        assert json.loads(path.read_text()) in ({"old": True}, {"numbers": list(range(200000))})


# ----------------------------------------------------------------------------- --verify

QUICK = ROOT / "lab" / "results" / "quick"
GOOD = QUICK / "markov-nope-s0.json"


@pytest.fixture
def rerun(monkeypatch):
    """``--verify``'s rerun replaced: it writes the stored record of ``GOOD`` into the rerun's ``--out``
    (exit status ``rerun.status``), and ``rerun.calls`` lists each rerun's argv."""
    import lab.verify

    class Fake:
        calls, status = [], 0

        def __call__(self, argv, **kwargs):
            self.calls.append(argv)
            out = Path(argv[argv.index("--out") + 1])
            if self.status == 0:
                (out / GOOD.name).write_text(GOOD.read_text())
            return subprocess.CompletedProcess(argv, self.status)

    fake = Fake()
    monkeypatch.setattr(lab.verify.subprocess, "run", fake)
    return fake


def _damaged(tmp_path):
    """``{file: words its failed check must say}``: one of each way a file is not a record it can rerun."""
    text = GOOD.read_text()
    good = json.loads(text)
    files = {"missing.json": (None, "No such file or directory"),
             "a-directory.json": (None, "is not a regular file (a directory)"),
             "a-fifo.json": (None, "is not a regular file (a FIFO)"),                 # read, it would hang
             "dev-zero.json": (None, "is not a regular file (a character device)"),  # read, it would fill memory
             "deep.json": (b"[" * 100_000 + b"]" * 100_000, "nests lists and objects deeper than 64 levels"),
             "nan.json": ('{"schema": NaN}', "holds NaN"),
             "open-quote.json": (json.dumps({**good, "command": good["command"] + " '"}),
                                 "command is not a shell command line (No closing quotation)"),
             "unknown-task.json": (json.dumps({**good, "task": {**good["task"], "name": "zzz"}}),
                                   "task.name: must be one of markov, retrieval, text, prose, got 'zzz'"),
             "empty.json": ("", "an empty file"),
             "truncated.json": (text[:len(text) // 2], "not valid JSON, so cut short or damaged"),
             "binary.json": (b"\x89PNG\r\n\x1a\n\xff", "not UTF-8"),
             "a-list.json": ("[1, 2]", "record field (top): must be an object, got list"),
             "summary.json": ((QUICK / "summary.json").read_text(), "record field (top): lacks schema"),
             "old-schema.json": (json.dumps({**good, "schema": "minipos-lab/0"}), "schema: must be 'minipos-lab/3'"),
             "no-command.json": (json.dumps({**good, "command": "rm -rf /"}), "record field command"),
             "other-env.json": (json.dumps({**good, "command": "LD_PRELOAD=x.so " + good["command"]}),
                                "LD_PRELOAD, which is not one of the variables"),
             "no-settings.json": (json.dumps({**good, "settings": {}}), "settings: lacks task, scheme, seed")}
    for name, (content, _) in files.items():
        if name == "a-directory.json":
            (tmp_path / name).mkdir()
        elif name == "a-fifo.json":
            os.mkfifo(tmp_path / name)
        elif name == "dev-zero.json":
            (tmp_path / name).symlink_to("/dev/zero")
        elif isinstance(content, bytes):
            (tmp_path / name).write_bytes(content)
        elif content is not None:
            (tmp_path / name).write_text(content)
    return {tmp_path / name: words for name, (_, words) in files.items()}


def test_a_damaged_record_is_a_failed_check_and_the_others_are_still_verified(tmp_path, rerun, capsys):
    from lab import __main__ as cli
    damaged = _damaged(tmp_path)
    good = tmp_path / "good.json"
    good.write_text(GOOD.read_text())
    paths = [*damaged, good]
    assert cli.main(["--verify", *map(str, paths), "--no-progress"]) == 1
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert "Traceback" not in err and len(lines) == len(paths)
    for line, (path, words) in zip(lines, damaged.items()):             # each in one line, before any rerun
        assert line.startswith(f"{path}: failed: ") and words in line, line
    assert lines[-1].startswith(f"{good} (") and "identical: all" in lines[-1]
    assert len(rerun.calls) == 1 and str(tmp_path) not in rerun.calls[0][rerun.calls[0].index("--out") + 1]


def test_a_record_alone_that_is_damaged_fails_in_one_line(tmp_path, rerun, capsys):
    from lab import __main__ as cli
    path = tmp_path / "markov-rope-s0.json"
    path.write_text((QUICK / path.name).read_text()[:1000])
    assert cli.main(["--verify", str(path)]) == 1
    out, err = capsys.readouterr()
    assert out == f"{path}: failed: " + out.split(": failed: ", 1)[1] and out.count("\n") == 1
    assert "not valid JSON" in out and err == "" and rerun.calls == []


def test_a_rerun_that_fails_is_a_failed_check(tmp_path, rerun, capsys):
    from lab import __main__ as cli
    rerun.status = 2
    assert cli.main(["--verify", str(GOOD), str(GOOD.with_name("markov-alibi-s0.json"))]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and len(rerun.calls) == 2
    assert all(": failed: the record's command failed (exit status 2)" in line for line in lines)


def test_record_validation_refuses_every_wrong_type_with_a_value_error():
    """A record is JSON from anywhere: every field replaced by a value of another kind is a
    ``ValueError`` naming a field (or still a record), never a ``TypeError`` or ``KeyError``."""
    def places(node, where=()):
        yield where
        children = node.items() if isinstance(node, dict) else enumerate(node[:1]) if isinstance(node, list) else ()
        for key, child in children:
            yield from places(child, where + (key,))

    for name in ("retrieval-nope-s0.json", "markov-learned-s0.json"):
        rec = json.loads((QUICK / name).read_text())
        for where in list(places(rec))[1:]:
            target = rec
            for key in where[:-1]:
                target = target[key]
            kept = target[where[-1]]
            for value in (5, "x", None, [], {}, True, [1], {"a": 1}):
                target[where[-1]] = value                                   # changed in place, then put back
                try:
                    records.validate(rec)
                except ValueError as error:
                    assert str(error).startswith("record field "), (where, value, error)
            target[where[-1]] = kept


@pytest.mark.parametrize("bad, message", [(float("nan"), "must be a finite number, got nan"),
                                          (float("inf"), "must be a finite number, got inf"),
                                          (True, "must be a finite number, got True"),
                                          ("0.5", "must be a finite number, got '0.5'"),
                                          (None, "must be a finite number, got None")])
def test_a_bad_number_deep_in_a_long_list_is_named_by_its_index(bad, message):
    # the third of a list of per-sequence losses: the message names that element, whatever the list's length
    rec = json.loads((QUICK / "markov-learned-s0.json").read_text())
    losses = rec["results"]["base"]["lengths"][0]["sequence_losses"]
    assert len(losses) > 3
    losses[2] = bad
    with pytest.raises(ValueError, match=r"sequence_losses\[2\]: " + re.escape(message) + "$"):
        records.validate(rec)


def test_a_number_below_its_floor_in_a_list_is_named_by_its_index():
    rec = json.loads((QUICK / "markov-learned-s0.json").read_text())
    entropy = rec["results"]["base"]["lengths"][0]["attention"]["entropy"][0]
    entropy[-1] = -0.25                                                  # an entropy is >= 0
    with pytest.raises(ValueError, match=rf"entropy\[0\]\[{len(entropy) - 1}\]: must be in \[0, inf\], got -0.25$"):
        records.validate(rec)


# ----------------------------------------------------------------------------- usage errors before any work

@pytest.fixture
def cli(monkeypatch):
    """``lab.__main__`` with the training entry point replaced by one that fails the test if called."""
    from lab import __main__ as cli

    def run_one(*args, **kwargs):
        raise AssertionError("a run started")

    monkeypatch.setattr(cli, "run_one", run_one)
    return cli


@pytest.fixture
def files(tmp_path):
    """Files for the cases: texts too short, not UTF-8, or too short for the evaluation lengths."""
    (tmp_path / "empty.txt").write_text("")
    (tmp_path / "short.txt").write_text("too short")
    (tmp_path / "binary.txt").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "small.txt").write_text("the cat sat on the mat. " * 40)               # 960 characters
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "records").mkdir()
    (tmp_path / "records" / "notes.txt").write_text("no records here")
    os.mkfifo(tmp_path / "fifo")
    return tmp_path


def _usage_error(cli, argv, capsys) -> str:
    """The one line of the usage error ``argv`` gets (exit status 2, nothing on stdout, no traceback)."""
    with pytest.raises(SystemExit) as stop:
        cli.main(argv)
    out, err = capsys.readouterr()
    assert stop.value.code == 2 and out == "" and "Traceback" not in err, err
    lines = err.splitlines()                  # the short usage line, then the error: not the 30-line usage
    assert len(lines) == 2 and lines[0].startswith("usage: python -m lab [options]"), err
    assert lines[1].startswith("python -m lab: error: "), err
    return lines[1]


BAD = [
    # wrong types
    ("--length 1.5", "argument --length: must be an integer >= 1, got '1.5'"),
    ("--length ten", "argument --length: must be an integer >= 1, got 'ten'"),
    ("--lr fast", "argument --lr: must be a finite number > 0, got 'fast'"),
    ("--seeds 0,one", "argument --seeds: must be an integer >= 0, got 'one'"),
    ("--eval-factors 1,2.5", "argument --eval-factors: must be an integer >= 1, got '2.5'"),
    ("--tied yes", "unrecognized arguments: yes"),
    ("--norm batchnorm", "argument --norm: invalid choice: 'batchnorm'"),
    # negative, zero, not finite
    ("--seeds -1", "argument --seeds: must be an integer >= 0, got '-1'"),
    ("--source-seed -3", "argument --source-seed: must be an integer >= 0"),
    ("--length 0", "argument --length: must be an integer >= 1, got '0'"),
    ("--steps 0", "argument --steps: must be an integer >= 1"),
    ("--warmup -1", "argument --warmup: must be an integer >= 0"),
    ("--eval-factors 0,1", "argument --eval-factors: must be an integer >= 1, got '0'"),
    ("--lr 0", "argument --lr: must be a finite number > 0, got '0'"),
    ("--lr nan", "argument --lr: must be a finite number > 0, got 'nan'"),
    ("--clip=-inf", "argument --clip: must be a finite number >= 0"),
    ("--temperature 1e400", "argument --temperature: must be a finite number > 0, got '1e400'"),
    ("--min-lr-ratio 1.5", "argument --min-lr-ratio: must be a finite number in [0, 1], got '1.5'"),
    # huge
    ("--length 1000000", "GiB of memory, more than this machine's"),
    ("--d-model 9223372036854775807", "the parameters, their gradients and AdamW's moments"),
    ("--eval-factors 1,1000000", "attention weights at length 64000000"),
    ("--tasks retrieval --probes 1000000000000000", "(the retrieval probes:"),
    ("--eval-tokens 1000000000000000", "(the evaluation's token losses:"),
    ("--tasks markov --vocab 1048576 --order 1", "(the Markov source's tables:"),
    ("--order 1000000000000", "--vocab 32 --order 1000000000000: a Markov source has vocab**order contexts, at most"),
    ("--vocab 2000 --order 2", "--vocab 2000 --order 2: a Markov source has vocab**order contexts, at most 2**20"),
    ("--schemes rope --finetune-factor 1000000000000", "attention weights at length 64000000000000"),
    # sizes that do not fit together
    ("--plateau-window 0", "argument --plateau-window: must be a finite number in (0, 1], got '0'"),
    ("--plateau-window 1.5", "argument --plateau-window: must be a finite number in (0, 1], got '1.5'"),
    ("--plateau-every 0", "argument --plateau-every: must be an integer >= 1, got '0'"),
    ("--cooldown=-1", "argument --cooldown: must be a finite number >= 0"),
    ("--jobs 0", "argument --jobs: must be an integer >= 1, got '0'"),
    ("--shards 2", "unrecognized arguments: --shards 2"),
    ("--d-model 30", "--schemes nope: d_model (30) must be divisible by num_heads (4)"),
    ("--d-model 12 --num-heads 4 --schemes rope", "--schemes rope: RoPE needs an even head dim"),
    ("--d-model 12 --num-heads 4 --schemes xpos", "--schemes xpos: x must have an even head dim"),
    ("--tasks retrieval --length 4", ("--length 4 cannot hold the retrieval task's write block (4 tokens) and read "
                                      "block (8): --length must be at least 11")),
    ("--tasks retrieval --pairs 9", "--tasks retrieval: need 1 <= pairs <= keys"),
    ("--tasks markov --length 1 --schemes deberta", "--schemes deberta: max_relative_positions must be"),
    ("--quick --tasks markov --temperature 1e-300", "--tasks markov: the chain's distribution did not converge"),
    # unknown names
    ("--schemes nosuch", "argument --schemes: 'nosuch' is not one of nope, sinusoidal"),
    ("--tasks markov,nosuch", "argument --tasks: 'nosuch' is not one of markov, retrieval, text"),
    ("--schedule linear", "argument --schedule: invalid choice: 'linear'"),
    ("--binding loose", "argument --binding: invalid choice: 'loose'"),
    ("--nosuch 1", "unrecognized arguments: --nosuch 1"),
    # empty lists and duplicates
    ("--seeds ,", "argument --seeds: needs at least one entry, got ','"),
    ("--schemes ''", "argument --schemes: needs at least one entry"),
    ("--seeds 0,1,0", "argument --seeds: lists 0 more than once"),
    ("--seeds 1,01", "argument --seeds: lists 1 more than once"),
    ("--schemes rope,alibi,rope", "argument --schemes: lists rope more than once"),
    ("--eval-factors 1,4,2", "argument --eval-factors: must increase, got '1,4,2'"),
    ("--seeds 0 --seeds 1", "argument --seeds: given more than once"),
    ("--lr 0.1 --lr 0.2", "argument --lr: given more than once"),
    ("--tied --no-tied", "argument --tied/--no-tied: given more than once"),
    ("--verify {files}/a --verify {files}/b", "argument --verify: given more than once"),
    ("--verify {files}/a-file {files}/../{files.name}/a-file", "--verify lists"),
    # conflicting options
    ("--verify {files}/a-file --tasks markov", ("--verify reruns each record's own command: it takes no other option "
                                                "but --no-progress; got --tasks")),
    ("--verify {files}/a-file --quick", "got --quick"),
    ("--verify {files}/a-file --summarize", "got --summarize"),
    ("--verify {files}/a-file --no-tied", "got --no-tied"),
    ("--summarize --out {files}/records --seeds 0", ("--summarize runs nothing: it takes only --out (or --quick, for "
                                                     "lab/results/quick) and --no-progress; got --seeds")),
    ("--summarize --quick --lr 0.1", "got --lr"),
    ("--verify {files}/a-file --jobs 2", "got --jobs"),
    ("--summarize --out {files}/records --print-commands", "got --print-commands"),
    # missing files, directories in place of files, empty or unsuitable files
    ("--text {files}/missing.txt", "--text: No such file or directory: {files}/missing.txt"),
    ("--text {files}", "--text: {files}: is not a regular file (a directory)"),
    ("--text /dev/zero", "--text: /dev/zero: is not a regular file (a character device)"),
    ("--text {files}/fifo", "--text: {files}/fifo: is not a regular file (a FIFO)"),
    ("--seeds 0,,1", "argument --seeds: has an empty entry (two commas, or one at an end), got '0,,1'"),
    ("--seeds 1180591620717411303424", "argument --seeds: must be an integer <= 9223372036854775807"),
    ("--steps 1000000000000000000000000000000", "argument --steps: must be an integer <= 9223372036854775807"),
    ("--text ''", "argument --text: must name a path, got ''"),
    ("--text {files}/empty.txt", "need at least 64 characters of text, got 0"),
    ("--text {files}/short.txt", "need at least 64 characters of text, got 9"),
    ("--text {files}/binary.txt", "--text: {files}/binary.txt: is not UTF-8 text (byte 128: b'\\x80')"),
    ("--text {files}/small.txt", ("--text {files}/small.txt: its heldout part has 96 characters, fewer than the 1025 "
                                  "a sequence of 1024 needs")),
    ("--text {files}/small.txt --length 8 --eval-factors 1,2 --finetune-factor 200 --batch 400 --schemes rope",
     "its train part has 864 characters, fewer than the 1601"),
    ("--out ''", "argument --out: must name a path, got ''"),
    ("--out {files}/a-file", "--out {files}/a-file: not a directory"),
    ("--out {files}/a-file/under", "--out {files}/a-file/under: cannot make the directory (Not a directory)"),
    ("--out /proc/lab-out", "--out /proc/lab-out: cannot make the directory"),
    ("--out /proc/self", "--out /proc/self: cannot write there"),
    ("--summarize --out {files}/missing", "--out {files}/missing: no such directory to summarize"),
    ("--summarize --out {files}/a-file", "--out {files}/a-file: not a directory to summarize"),
    ("--summarize --out {files}/records", "--out {files}/records: holds no records"),
    ("--verify", "argument --verify: expected at least one argument"),
]


@pytest.mark.parametrize("argv, words", BAD, ids=[a for a, _ in BAD])
def test_a_mistake_is_a_one_line_usage_error_before_any_work(cli, files, capsys, argv, words):
    import shlex
    argv = shlex.split(argv.format(files=files))
    if not {"--out", "--verify", "--summarize"} & set(argv):
        argv += ["--out", str(files / "out")]
    line = _usage_error(cli, argv, capsys)
    assert words.format(files=files) in line, line
    assert not (files / "out").exists() and not Path("/proc/lab-out").exists()   # nothing made before refusing


def test_without_the_prose_corpus_flags_are_checked_first_and_nothing_is_made(cli, files, capsys, monkeypatch):
    # A machine where `python -m lab.corpus fetch` has not run: a mistake in a flag is still the error; a sound
    # command line names the fetch command and leaves no --out folder; --print-commands needs no corpus.
    monkeypatch.setenv("MINIPOS_LAB_DATA", str(files / "no-corpus"))
    line = _usage_error(cli, ["--d-model", "30", "--out", str(files / "out")], capsys)
    assert "d_model (30) must be divisible by num_heads (4)" in line
    line = _usage_error(cli, ["--schemes", "alibi", "--out", str(files / "out" / "deeper")], capsys)
    assert "--tasks prose: the prose corpus is not prepared" in line and "python -m lab.corpus fetch" in line
    assert not (files / "out").exists()
    assert cli.main(["--print-commands", "--schemes", "alibi", "--tasks", "prose", "--seeds", "0",
                     "--out", str(files / "records")]) == 0
    assert "--tasks prose" in capsys.readouterr().out


def _numeric_settings():
    from dataclasses import fields

    from lab.run import Settings
    return [f.name for f in fields(Settings) if f.type in ("int", "float") and f.name not in ("seed",)]


@pytest.mark.parametrize("name", _numeric_settings())
def test_every_number_below_its_range_or_not_finite_is_refused(cli, tmp_path, capsys, name):
    flag = "--" + name.replace("_", "-")
    if name in cli.AT_LEAST:
        bad = [str(cli.AT_LEAST[name] - 1), "1.0", "1e3", "", "2**4"]
    else:
        low, high, excluded = cli.FLOATS[name]
        bad = [str(low) if excluded else str(low - 1), "nan", "inf", "-inf", "0x10", ""]
        bad += [str(high + 0.5)] if high is not None else []
    for value in bad:
        line = _usage_error(cli, [f"{flag}={value}", "--out", str(tmp_path / "out")], capsys)
        assert line.startswith(f"python -m lab: error: argument {flag}: must be "), line
    assert not (tmp_path / "out").exists()


def test_every_setting_has_a_rule_on_the_command_line(cli):
    from dataclasses import fields

    from lab.run import Settings
    numeric = set(_numeric_settings())
    assert numeric == set(cli.AT_LEAST) - {"seeds", "eval_factors"} | set(cli.FLOATS)
    actions = {a.dest: a for a in cli.parser()._actions}
    assert all(f.name in actions or f.name in cli.LISTS for f in fields(Settings))


def test_memory_is_counted_against_the_machine(cli, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "_memory", lambda: 2 ** 20)                 # 1 MiB: the quick model's state is more
    line = _usage_error(cli, ["--quick", "--out", str(tmp_path / "out")], capsys)
    assert "--tasks markov --schemes nope: these settings need at least " in line
    assert "more than this machine's 0.000977 GiB" in line
    monkeypatch.setattr(cli, "_memory", lambda: None)                     # a system that does not say: no check
    base, _, out = cli.plan(cli.parser().parse_args(["--length", "1000000", "--schemes", "nope", "--tasks", "markov",
                                                     "--out", str(tmp_path / "o")]))
    assert base.length == 1000000 and out.is_dir()


def test_every_command_the_lab_recorded_passes_the_checks(cli, tmp_path):
    import shlex
    from lab.record import SCHEMA
    found = [json.loads(p.read_text()) for p in sorted((ROOT / "lab" / "results").glob("*/*-s*.json"))]
    commands = [r["command"] for r in found if r["schema"] == SCHEMA]     # records of an earlier schema: not rerun
    assert len(commands) >= 18
    for command in commands:
        argv = shlex.split(command)
        argv = argv[argv.index("python") + 3:]
        argv[argv.index("--out") + 1] = str(tmp_path / "out")
        cli.plan(cli.parser().parse_args(argv))


def test_out_is_made_and_checked_before_the_runs_and_holds_no_probe(cli, monkeypatch, tmp_path, capsys):
    out, seen = tmp_path / "new" / "out", []

    def run_one(settings, where, verbose=True):
        assert where == out and out.is_dir() and list(out.iterdir()) == []      # made, probe removed, before a run
        seen.append((settings.task, settings.scheme, settings.seed))
        return {}

    monkeypatch.setattr(cli, "run_one", run_one)
    # the stand-in runs write no record: there is nothing to summarize, and no empty summary is written
    assert cli.main(["--tasks", "markov,retrieval", "--schemes", "rope, alibi", "--seeds", "2,0", "--out", str(out),
                     "--no-progress", "--jobs", "1"]) == 1
    assert seen == [(t, s, n) for t in ("markov", "retrieval") for s in ("rope", "alibi") for n in (2, 0)]
    assert list(out.iterdir()) == []
    assert capsys.readouterr().err == f"python -m lab: --out {out}: holds no record that can be read, so no summary\n"


def test_a_run_that_fails_or_is_interrupted_ends_in_one_line(cli, monkeypatch, tmp_path, capsys):
    def diverge(settings, out, verbose=True):
        raise FloatingPointError("the training loss became nan at step 3")

    monkeypatch.setattr(cli, "run_one", diverge)
    assert cli.main(["--schemes", "alibi", "--tasks", "markov", "--seeds", "0", "--out", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err == "python -m lab: markov-alibi-s0.json stopped: the training loss became nan at step 3\n"

    def interrupt(settings, out, verbose=True):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "run_one", interrupt)
    assert cli.main(["--schemes", "alibi", "--tasks", "markov,retrieval", "--out", str(tmp_path), "--jobs", "1"]) == 130
    assert capsys.readouterr().err == f"python -m lab: interrupted; the 0 records written stand in {tmp_path}/\n"


def test_summarize_takes_a_directory_of_records(cli, tmp_path, capsys):
    (tmp_path / GOOD.name).write_text(GOOD.read_text())
    assert cli.main(["--summarize", "--out", str(tmp_path)]) == 0
    out, err = capsys.readouterr()
    assert "0 runs in" in out and "quick check" not in out and err == ""
    assert json.loads((tmp_path / "summary.json").read_text())["markov"]["rows"]["nope"]["seeds"] == [0]


def _copy_named(directory, name, edit=None):
    doc = json.loads(GOOD.read_text())
    if edit:
        edit(doc)
    (directory / name).write_text(json.dumps(doc))


@pytest.mark.parametrize("make, words", [
    (lambda d: (d / "retrieval-x-s0.json").mkdir(), "retrieval-x-s0.json: is not a regular file (a directory)"),
    (lambda d: os.mkfifo(d / "markov-x-s0.json"), "markov-x-s0.json: is not a regular file (a FIFO)"),
    (lambda d: (d / "markov-x-s0.json").symlink_to("/dev/zero"), "is not a regular file (a character device)"),
    (lambda d: (d / "markov-x-s0.json").write_bytes(b"[" * 100_000 + b"]" * 100_000), "deeper than 64 levels"),
    (lambda d: _copy_named(d, "markov-nope-s1.json"), "markov-nope-s1.json: holds the run markov-nope-s0, not the one"),
    (lambda d: _copy_named(d, "zzz-nope-s0.json", lambda r: (r["task"].update(name="zzz"), r["settings"].update(
        task="zzz"))), "task.name: must be one of markov, retrieval, text, prose, got 'zzz'"),
    (lambda d: _copy_named(d, "markov-nope-s1.json", lambda r: r.update(seed=1)),
     "settings.seed: must agree with the record's seed (1), got 0"),
])
def test_summarize_refuses_in_one_line_a_file_that_is_not_a_record_of_its_name(cli, tmp_path, capsys, make, words):
    # a summary that skipped it, or counted one seed twice, would stand as evidence it is not
    (tmp_path / GOOD.name).write_text(GOOD.read_text())
    make(tmp_path)
    assert _usage_error(cli, ["--summarize", "--out", str(tmp_path)], capsys).startswith(
        f"python -m lab: error: --out {tmp_path}: ")
    assert not (tmp_path / "summary.json").exists()
    with pytest.raises(SystemExit):
        cli.main(["--summarize", "--out", str(tmp_path)])
    assert words in capsys.readouterr().err


def test_a_summary_refuses_one_run_twice_and_an_unknown_task():
    from lab import summary
    record = records.read(GOOD)
    with pytest.raises(ValueError, match="the same run more than once .*: markov-nope-s0"):
        summary.summarize([record, record])
    odd = json.loads(json.dumps(record))
    odd["task"]["name"] = "zzz"
    with pytest.raises(ValueError, match="unknown task 'zzz'"):
        summary.summarize([odd])


def test_a_full_disk_is_one_line_naming_the_file(cli, tmp_path, monkeypatch, capsys):
    (tmp_path / GOOD.name).write_text(GOOD.read_text())
    real = os.write

    def full(fd, data):
        if fd > 2:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(fd, data)
    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match=f"cannot write {tmp_path / 'x.json'}: No space left on device"):
        records.write_json(tmp_path / "x.json", {"a": 1})
    capsys.readouterr()
    assert _usage_error(cli, ["--summarize", "--out", str(tmp_path)], capsys) == (
        f"python -m lab: error: --out {tmp_path}: cannot write there (No space left on device)")
    assert sorted(p.name for p in tmp_path.iterdir()) == [GOOD.name]     # no summary, no temp file left


def test_help_states_the_ranges(cli, capsys):
    with pytest.raises(SystemExit) as stop:
        cli.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert stop.value.code == 0
    assert "--length LENGTH an integer >= 1" in text and "--lr LR a number > 0" in text
    assert "--min-lr-ratio MIN_LR_RATIO a number in [0, 1]" in text and "{layernorm,rmsnorm}" in text


def _option(argv, capsys, option="--steps"):
    from lab import __main__ as cli
    assert cli.main(["--print-commands", "--schemes", "alibi", "--seeds", "0", *argv]) == 0
    return [line.split(f"{option} ")[1].split()[0] for line in capsys.readouterr().out.splitlines()]


def test_each_task_takes_its_own_budget_unless_a_flag_or_quick_sets_one(capsys):
    # The stated budgets (lab/README.md, Budgets): Markov 4800, retrieval 3600, text and prose 6000 steps,
    # every one a fixed budget; text and prose evaluate 409600 symbols at a length (6400 sequences at L).
    tasks = ["--tasks", "markov,retrieval,text,prose"]
    assert _option(tasks, capsys) == ["4800", "3600", "6000", "6000"]
    assert _option(tasks, capsys, "--schedule") == ["budget"] * 4
    assert _option(tasks, capsys, "--eval-tokens") == ["163840", "163840", "409600", "409600"]
    assert _option(tasks + ["--steps", "100"], capsys) == ["100"] * 4
    assert _option(["--tasks", "text", "--schedule", "plateau"], capsys, "--schedule") == ["plateau"]
    assert _option(["--tasks", "text", "--schedule", "plateau"], capsys) == ["6000"]
    assert _option(["--tasks", "markov", "--steps", "9600"], capsys, "--schedule") == ["budget"]
    assert _option(["--tasks", "text", "--quick"], capsys) == ["40"]
    assert _option(["--tasks", "text", "--quick"], capsys, "--eval-tokens") == ["512"]


def test_each_task_runs_its_own_seeds_unless_seeds_is_given(capsys):
    # The stated seeds (lab/README.md, Seeds): 0-4 on Markov and retrieval, 0-2 on text and prose.
    from lab import __main__ as cli
    assert cli.main(["--print-commands", "--schemes", "alibi", "--tasks", "markov,retrieval,text,prose"]) == 0
    seeds = [(line.split("--tasks ")[1].split()[0], line.split("--seeds ")[1].split()[0])
             for line in capsys.readouterr().out.splitlines()]
    assert seeds == [("markov", s) for s in "01234"] + [("retrieval", s) for s in "01234"] + \
        [("text", s) for s in "012"] + [("prose", s) for s in "012"]
    assert cli.main(["--print-commands", "--schemes", "alibi", "--tasks", "markov", "--seeds", "7"]) == 0
    assert [line.split("--seeds ")[1].split()[0] for line in capsys.readouterr().out.splitlines()] == ["7"]
