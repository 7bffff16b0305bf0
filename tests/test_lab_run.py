"""The lab's protocol on a very small slice: a record's schema, determinism (same seed, same record),
the reproduce command, "cannot run", the summary over seeds and the atomic writes."""

import copy
import json
import shlex
from dataclasses import asdict, replace

import numpy as np
import pytest

from lab import __main__ as cli
from lab import record as records
from lab.run import Settings, command_for, record_path, run_one
from lab.summary import check_sane, summarize

# --dist loadgroup keeps this module on one worker, so the record is trained once
pytestmark = pytest.mark.xdist_group("test_lab_run")

# The checkpoints' evaluations (history_tokens, history_probes) as small as the final one's: at the
# defaults (40960 tokens per length) the 8 checkpoints of a run took seconds of 8-token forward passes,
# nearly all of a run's time here, and a test here reads the history only as part of the whole record.
TINY = Settings(length=8, eval_factors=(1, 2), d_model=8, num_heads=2, num_layers=1, d_ff=16, steps=6, batch=4,
                lr=1e-2, warmup=2, vocab=6, eval_tokens=64, eval_batch_tokens=64, probes=2, attention_sequences=1,
                position_bins=2, history_tokens=64, history_probes=2, finetune_steps=2, keys=4, values=4, filler=4,
                pairs=2)


@pytest.fixture(scope="module")
def rope_record(tmp_path_factory):
    out = tmp_path_factory.mktemp("lab")
    return run_one(replace(TINY, scheme="rope"), out, verbose=False), out


def test_record_follows_the_schema(rope_record):
    rec, out = rope_record
    on_disk = records.read(record_path(out, replace(TINY, scheme="rope")))
    assert on_disk["results"].keys() == {"base", "linear", "ntk", "dynamic", "yarn", "pi-finetune"}
    base = on_disk["results"]["base"]["lengths"]
    assert [e["length"] for e in base] == [8, 16] and all(e["status"] == "ok" for e in base)
    assert base[0]["excess"] == pytest.approx(base[0]["loss"] - base[0]["floor"])
    assert on_disk["floor"]["entropy_rate"] == pytest.approx(base[0]["positions"]["floor"][-1])
    assert on_disk["versions"]["numpy"] == np.__version__
    assert len(base[1]["attention"]["entropy"]) == 1 and len(base[1]["attention"]["entropy"][0]) == 2
    assert on_disk["results"]["yarn"]["lengths"][1]["status"] == "ok"
    assert check_sane(on_disk) == []


@pytest.mark.parametrize("path,value,field", [
    (("schema",), "other/1", "schema"),
    (("results", "base", "lengths", 0, "loss"), float("nan"), "loss"),
    (("results", "base", "lengths", 0, "status"), "broken", "status"),
    (("train", "final_loss"), -1.0, "final_loss"),
    (("command",), "lab --seeds 0", "command"),
])
def test_validation_names_the_field(rope_record, path, value, field):
    bad = copy.deepcopy(rope_record[0])
    target = bad
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ValueError, match=field):
        records.validate(bad)


def same_numbers(a, b, out_a, out_b):
    """Records equal but for wall times, versions and the output directory their command names."""
    a, b = records.comparable(json.loads(json.dumps(a))), records.comparable(json.loads(json.dumps(b)))
    assert a.pop("command").replace(str(out_a), "OUT") == b.pop("command").replace(str(out_b), "OUT")
    return a == b


def test_same_seed_same_record(rope_record, tmp_path):
    again = run_one(replace(TINY, scheme="rope"), tmp_path, verbose=False)
    assert same_numbers(again, rope_record[0], tmp_path, rope_record[1])
    other = run_one(replace(TINY, scheme="rope", seed=1, extensions=False), None, verbose=False)
    assert other["train"]["final_loss"] != again["train"]["final_loss"]


def test_the_command_reproduces_the_record(rope_record, tmp_path):
    rec, _ = rope_record
    argv = shlex.split(rec["command"])
    argv = argv[argv.index("python"):]                                 # after any thread variables
    assert argv[:3] == ["python", "-m", "lab"]
    args = cli.parser().parse_args(argv[3:])
    base, lists = cli.settings_from(args)
    assert lists == {"tasks": ("markov",), "schemes": ("rope",), "seeds": (0,)}
    assert {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(replace(base, task="markov",
                                                                                    scheme="rope", seed=0)).items()} \
        == rec["settings"]
    argv[argv.index("--out") + 1] = str(tmp_path)                      # run it, into a fresh directory
    assert cli.main(argv[3:] + ["--no-progress"]) == 0
    again = records.read(record_path(tmp_path, replace(TINY, scheme="rope")))
    assert same_numbers(again, rec, tmp_path, rope_record[1])
    assert json.loads((tmp_path / "summary.json").read_text())["markov"]["rows"]["rope"]["seeds"] == [0]


def test_command_spells_every_setting():
    cmd = command_for(replace(TINY, tied=False, text=None), "out dir", environ={})
    assert cmd.startswith("python -m lab --out 'out dir' ")
    assert "--no-tied" in cmd and "--eval-factors 1,2" in cmd and "--text" not in cmd
    args = cli.parser().parse_args(shlex.split(cmd)[3:])
    assert cli.settings_from(args)[0] == replace(TINY, tied=False)
    env = command_for(TINY, "o", environ={"MINIPOS_NUM_THREADS": "1", "HOME": "/x", "OPENBLAS_NUM_THREADS": "2"})
    assert env.startswith("MINIPOS_NUM_THREADS=1 OPENBLAS_NUM_THREADS=2 python -m lab --out o ")
    # the OpenBLAS kernels decide the last bits as the thread counts do: a command names them when set
    env = command_for(TINY, "o", environ={"OPENBLAS_CORETYPE": "Haswell", "OMP_NUM_THREADS": "1"})
    assert env.startswith("OMP_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell python -m lab --out o ")


def test_learned_table_cannot_run_past_its_rows():
    rec = run_one(replace(TINY, scheme="learned", task="retrieval"), None, verbose=False)
    first, second = rec["results"]["base"]["lengths"]
    assert first["status"] == "ok" and 0.0 <= first["accuracy"] <= 1.0
    assert second == {"length": 16, "status": "cannot run", "reason": second["reason"]}
    assert "8 rows" in second["reason"]
    records.validate(json.loads(json.dumps(rec)))


def test_summary_mean_and_spread(rope_record):
    recs = []
    for seed, excess in ((0, 0.1), (1, 0.3)):
        r = copy.deepcopy(rope_record[0])
        r["seed"] = seed
        r["results"] = {"base": r["results"]["base"]}
        r["results"]["base"]["lengths"][0]["excess"] = excess
        recs.append(r)
    row = summarize(recs)["markov"]["rows"]["rope"]
    assert row["seeds"] == [0, 1]
    cell = row["lengths"]["8"]
    assert cell["mean"] == pytest.approx(0.2) and cell["sd"] == pytest.approx(0.1414213562, rel=1e-8)
    assert (cell["min"], cell["max"], cell["n"]) == (0.1, 0.3, 2)


def test_sanity_check_catches_a_loss_below_the_floor(rope_record):
    bad = copy.deepcopy(rope_record[0])
    entry = bad["results"]["base"]["lengths"][0]
    entry["loss"] = entry["floor"] - 1.0
    assert any("below the floor" in p for p in check_sane(bad))


def test_writes_are_atomic(tmp_path):
    path = tmp_path / "x.json"
    records.write_json(path, {"a": 1})
    with pytest.raises(ValueError, match="non-finite"):
        records.write_json(path, {"a": float("inf")})
    assert json.loads(path.read_text()) == {"a": 1}                      # the old file stands
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]            # no temp file left


def test_text_task(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("the cat sat on the mat. " * 40, encoding="utf-8")
    rec = run_one(replace(TINY, task="text", text=str(path), scheme="alibi"), None, verbose=False)
    assert rec["floor"] is None and rec["task"]["vocab"] == 11
    assert all(e["floor"] is None and e["loss"] > 0 for e in rec["results"]["base"]["lengths"])
