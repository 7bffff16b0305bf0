"""``python -m lab --verify``: the comparison of a record with its rerun (hand-made records whose
differences are known), the rerun's command line, and one real rerun of a tiny record."""

import json
import sys

import pytest

from lab import __main__ as cli
from lab.run import Settings, record_path, run_one
from lab.verify import compare, rerun_argv


def _record(**changes):
    rec = {"command": "MINIPOS_NUM_THREADS=1 python -m lab --out lab/results/full --seeds 0",
           "settings": {"task": "markov", "steps": 600, "lr": 0.003},
           "versions": {"numpy": "2.4.6", "commit": "abc"},
           "train": {"curve": {"step": [0, 10], "loss": [3.4, 2.5]}, "final_loss": 2.5, "seconds": 31.0},
           "results": {"base": {"seconds": 12.0, "lengths": [
               {"length": 64, "status": "ok", "loss": 1.25, "accuracy": 0.5},
               {"length": 128, "status": "cannot run", "reason": "no rows"}]}},
           "seconds": 50.0}
    for path, value in changes.items():
        *keys, last = path.split(".")
        target = rec
        for key in keys:
            target = target[int(key)] if key.isdigit() else target[key]
        target[int(last) if last.isdigit() else last] = value
    return rec


def test_a_rerun_that_differs_only_in_timings_versions_and_out_dir_is_identical():
    rerun = _record(**{"command": "MINIPOS_NUM_THREADS=1 python -m lab --out /tmp/x --seeds 0", "seconds": 99.0,
                       "train.seconds": 1.0, "results.base.seconds": 2.0, "versions.commit": "def"})
    got = compare(_record(), rerun)
    # the numbers by hand: settings 2 (steps, lr; "markov" is a string), curve 4, final_loss 1,
    # the ok entry 3 (length, loss, accuracy), the other entry 1 (length)
    assert got.identical and got.numbers == 2 + 4 + 1 + 3 + 1 and got.differing == 0
    assert "identical" in got.report()


def test_the_largest_differences_are_found_and_named():
    rerun = _record(**{"results.base.lengths.0.loss": 1.2501, "train.curve.loss.0": 3.3})
    got = compare(_record(), rerun)
    assert not got.identical and got.differing == 2
    diff, where = got.max_abs
    assert where == "record.train.curve.loss[0]" and diff == pytest.approx(0.1)          # |3.4 - 3.3|
    rel, where = got.max_rel
    assert where == "record.train.curve.loss[0]" and rel == pytest.approx(0.1 / 3.4)
    assert not got.within(3)                                                              # 3.4 vs 3.3
    only_small = compare(_record(), _record(**{"results.base.lengths.0.loss": 1.2501}))
    assert only_small.max_rel[0] == pytest.approx(0.0001 / 1.2501) and only_small.within(3)
    assert not only_small.within(5)
    assert "1 of 11 numbers differ" in only_small.report()


def test_structure_and_strings_that_differ_are_mismatches():
    rerun = _record(**{"results.base.lengths.1.status": "ok"})
    rerun["results"]["base"]["lengths"].append({"length": 256})
    del rerun["train"]["final_loss"]
    got = compare(_record(), rerun)
    assert not got.identical and got.differing == 0 and not got.within(3)
    text = "\n".join(got.mismatches)
    assert "record.results.base.lengths: 2 entries in the record, 3 in the rerun" in text
    assert "record.results.base.lengths[1].status: 'cannot run' in the record, 'ok' in the rerun" in text
    assert "record.train.final_loss: missing from the rerun" in text
    assert compare(_record(), _record(**{"settings.steps": True})).mismatches                 # a bool is no number


def test_a_report_that_differs_names_both_cpus_unless_they_are_the_same():
    got = compare(_record(), _record(**{"train.final_loss": 2.6}))
    got.cpus = ("Intel Xeon", "AMD EPYC")
    assert "written on Intel Xeon, rerun on AMD EPYC" in got.report()
    from lab.verify import _machine
    assert _machine({"cpu": "AMD EPYC", "blas_core": "Haswell"}) == "AMD EPYC, OpenBLAS core Haswell"
    assert _machine({"cpu": "AMD EPYC", "blas_core": None}) == "AMD EPYC"
    assert _machine({"numpy": "2.4.6"}) is None
    got.cpus = (None, "AMD EPYC")                                       # a record from before ``cpu``
    assert "written on a CPU it does not name, rerun on AMD EPYC" in got.report()
    got.cpus = ("AMD EPYC", "AMD EPYC")
    assert "CPU" not in got.report()
    same = compare(_record(), _record())
    same.cpus = ("Intel Xeon", "AMD EPYC")                              # identical: nothing to explain
    assert "CPU" not in same.report()


def test_a_report_on_other_kernels_says_how_to_rerun_with_the_records():
    got = compare(_record(), _record(**{"train.final_loss": 2.6}))
    got.cpus = ("AMD EPYC, OpenBLAS core Haswell", "AMD EPYC, OpenBLAS core SkylakeX")
    got.blas_cores = ("Haswell", "SkylakeX")
    assert "to rerun with the record's kernels: OPENBLAS_CORETYPE=Haswell python -m lab --verify" in got.report()
    got.blas_cores = (None, "SkylakeX")                                 # the record does not say which
    assert "OPENBLAS_CORETYPE" not in got.report()


def test_cpu_reads_the_model_name_of_proc_cpuinfo(monkeypatch, tmp_path):
    import builtins
    from lab import record
    fake = tmp_path / "cpuinfo"
    fake.write_text("processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n"
                    "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) CPU @ 2.20GHz\n")
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: real_open(fake if f == "/proc/cpuinfo" else f, *a, **k))
    assert record.cpu() == "Intel(R) Xeon(R) CPU @ 2.20GHz"
    assert record.versions()["cpu"] == "Intel(R) Xeon(R) CPU @ 2.20GHz"
    fake.write_text("processor\t: 0\n")                                # no model name: the platform's word
    monkeypatch.setattr(record.platform, "processor", lambda: "x86_64")
    assert record.cpu() == "x86_64"
    monkeypatch.setattr(record.platform, "processor", lambda: "")
    assert record.cpu() is None


def test_blas_core_names_the_kernels_numpys_openblas_chose():
    import numpy as np
    from lab import record
    if np.__config__.CONFIG["Build Dependencies"]["blas"]["name"] != "scipy-openblas":
        pytest.skip("NumPy is not built with OpenBLAS here")
    core = record.blas_core()
    # OpenBLAS's own configuration string names its build's default core; at run time DYNAMIC_ARCH
    # picks one of its cores by CPU: a name of letters and digits, as openblas_get_corename gives it
    assert isinstance(core, str) and core.isalnum(), core


def test_blas_core_is_none_where_no_openblas_is_loaded(monkeypatch, tmp_path):
    import builtins
    from lab import record
    fake = tmp_path / "maps"
    fake.write_text("7f00-7f01 r-xp 00000000 00:00 0 /usr/lib/libc.so.6\n")
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda f, *a, **k: real_open(fake if f == "/proc/self/maps" else f, *a, **k))
    assert record.blas_core() is None


def test_compare_wants_records():
    with pytest.raises(TypeError, match="expected and got must be records"):
        compare(_record(), [1.0])


def test_the_rerun_takes_the_commands_thread_variables_and_a_new_out(monkeypatch):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")                       # not in the command: removed
    monkeypatch.setenv("HOME", "/home/x")
    env, argv = rerun_argv("MINIPOS_NUM_THREADS=1 python -m lab --out 'lab/results/full' --seeds 0", "/tmp/new dir")
    assert env["MINIPOS_NUM_THREADS"] == "1" and "OPENBLAS_NUM_THREADS" not in env and env["HOME"] == "/home/x"
    assert argv == [sys.executable, "-m", "lab", "--out", "/tmp/new dir", "--seeds", "0"]
    # the kernels the command names win over a choice made here; a command that names none (a record made
    # with its machine's choice) leaves the choice made here, the only way to ask for the record's kernels
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Zen")
    env, _ = rerun_argv("OPENBLAS_CORETYPE=Haswell MINIPOS_NUM_THREADS=1 python -m lab --out o", "/tmp")
    assert env["OPENBLAS_CORETYPE"] == "Haswell" and env["MINIPOS_NUM_THREADS"] == "1"
    env, _ = rerun_argv("MINIPOS_NUM_THREADS=1 python -m lab --out o", "/tmp")
    assert env["OPENBLAS_CORETYPE"] == "Zen"
    with pytest.raises(ValueError, match="LD_PRELOAD"):
        rerun_argv("LD_PRELOAD=x.so python -m lab --out o", "/tmp")
    with pytest.raises(ValueError, match="python -m lab --out DIR"):
        rerun_argv("python -m other --out o", "/tmp")
    with pytest.raises(ValueError, match="python -m lab --out DIR"):
        rerun_argv("python -m lab --seeds 0", "/tmp")


TINY = Settings(task="retrieval", scheme="alibi", length=8, eval_factors=(1, 2), d_model=8, num_heads=2, num_layers=1,
                d_ff=16, steps=4, batch=4, lr=1e-2, warmup=2, eval_tokens=64, eval_batch_tokens=64, probes=2,
                attention_sequences=1, position_bins=2, keys=4, values=4, filler=4, pairs=2)


def test_verify_reruns_a_tiny_record_and_finds_it_identical(tmp_path, capsys):
    run_one(TINY, tmp_path, verbose=False)
    path = record_path(tmp_path, TINY)
    assert cli.main(["--verify", str(path), "--no-progress"]) == 0
    assert "identical: all" in capsys.readouterr().out
    rec = json.loads(path.read_text())                                   # a record its command does not give
    rec["train"]["final_loss"] += 0.5
    tampered = tmp_path / "tampered" / path.name
    tampered.parent.mkdir()
    tampered.write_text(json.dumps(rec))
    assert cli.main(["--verify", str(tampered), "--no-progress"]) == 1
    assert "largest absolute difference 0.5 at record.train.final_loss" in capsys.readouterr().out


def test_commit_is_modified_by_code_and_not_by_records(tmp_path):
    import shutil
    import subprocess
    from lab import record
    if shutil.which("git") is None:
        pytest.skip("no git here")
    git = lambda *a: subprocess.run(["git", "-C", str(tmp_path), *a], check=True, capture_output=True)  # noqa: E731
    for name in ("minipos/a.py", "lab/run.py", "lab/results/full/r.json", "docs/page.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("0\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "c")
    head = git("rev-parse", "HEAD").stdout.decode().strip()                # git's own word, not the code's
    assert record.source_commit(tmp_path) == head
    (tmp_path / "lab/results/full/r.json").write_text("1\n")        # a record written by another run
    (tmp_path / "docs/page.md").write_text("1\n")
    assert record.source_commit(tmp_path) == head
    (tmp_path / "lab/run.py").write_text("1\n")                      # the code itself
    assert record.source_commit(tmp_path) == head + "+modified"
    git("checkout", "-q", "--", "lab/run.py")
    (tmp_path / "minipos/a.py").write_text("1\n")
    assert record.source_commit(tmp_path) == head + "+modified"
    assert record.source_commit(tmp_path / "nowhere") is None
