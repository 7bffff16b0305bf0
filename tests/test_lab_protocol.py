"""The protocol's rules: the stopping rule, the configuration rule, T5's initialisation, what is
marked as never seen in training, the summary's standard errors, and runs side by side."""

import json
import math
import pathlib
import subprocess

import numpy as np
import pytest

from lab import pool, schemes, verify
from lab.model import Model, ModelConfig
from lab.run import QUICK, Settings, Stopping, _plateau_rate, record_path, run_one
from lab.summary import _spread, format_table, summarize
from lab.tasks import KeyValueRecall, MarkovSource

RULE = Stopping(every=100, window=0.25, min_window=400, relative=0.002, absolute=0.002)


def test_the_stopping_rule_on_hand_made_curves():
    # improving by 0.1 every 100 steps: never a plateau
    falling = [(s, 3.0 - 0.1 * s / 100) for s in range(0, 2001, 100)]
    assert not any(RULE.reached(falling[:i + 1], s) for i, (s, _) in enumerate(falling))
    # flat from step 1000 at 2.0: the window at step s is max(400, s/4) steps; at 1400 the last 400 steps
    # (1100..1400) are no better than the best before them (2.0 at step 1000): a plateau
    flat = [(s, max(2.0, 3.0 - s / 1000)) for s in range(0, 2001, 100)]
    first = next(s for i, (s, _) in enumerate(flat) if RULE.reached(flat[:i + 1], s))
    assert first == 1400
    # improving by 0.003 nats per window of 400 steps at a best near 1.0: above both thresholds (0.002)
    slow = [(s, 1.0 - 0.003 * s / 400) for s in range(0, 4001, 100)]
    assert not any(RULE.reached(slow[:i + 1], s) for i, (s, _) in enumerate(slow))
    # ... at 0.001 per 400 steps it is below them
    slower = [(s, 1.0 - 0.001 * s / 400) for s in range(0, 4001, 100)]
    assert RULE.reached(slower[:5], 400)
    assert RULE.window_at(4000) == 1000 and RULE.window_at(800) == 400


def test_the_plateau_schedule_warms_holds_and_cools_down_linearly():
    rate = lambda step, cool: _plateau_rate(step, lr=1.0, warmup=10, cool_from=cool, end=150, min_ratio=0.1)  # noqa
    assert rate(0, None) == pytest.approx(0.1) and rate(9, None) == 1.0 and rate(99, None) == 1.0
    # cool-down from step 100 to 150: 50 steps, the last at 0.1
    assert rate(100, 100) == pytest.approx(1 - 0.9 / 50) and rate(149, 100) == pytest.approx(0.1)


def test_a_run_stops_at_its_plateau_and_records_the_rule(tmp_path):
    # a tiny model whose held-out loss stops moving quickly: with a window of 20 steps checked every 10
    settings = Settings(**{**QUICK, "steps": 400, "plateau_min_window": 20, "extensions": False,
                           "eval_factors": (1, 2), "schedule": "plateau"}, scheme="alibi")
    rec = run_one(settings, tmp_path, verbose=False)
    train = rec["train"]
    stop = train["stopping"]
    assert train["converged"] and stop["plateau_step"] < 400
    assert train["steps"] == stop["plateau_step"] + math.ceil(0.2 * stop["plateau_step"]) == stop["plateau_step"] \
        + stop["cooldown_steps"]
    h = list(zip(train["heldout"]["step"], train["heldout"]["loss"]))
    # the rule, re-read from the recorded curve: reached at the plateau step and not at any check before
    assert Stopping(every=10, sequences=8, min_window=20).reached(h[:-1], stop["plateau_step"])
    assert not any(Stopping(every=10, sequences=8, min_window=20).reached(h[:i + 1], s)
                   for i, (s, _) in enumerate(h[:-2]))
    assert "plateau when" in stop["rule"]


def test_a_run_without_a_plateau_is_cooled_down_and_marked_not_converged(tmp_path):
    settings = Settings(**{**QUICK, "steps": 30, "plateau_min_window": 1000, "extensions": False,
                           "eval_factors": (1,), "schedule": "plateau"}, scheme="nope")
    train = run_one(settings, tmp_path, verbose=False)["train"]
    assert train["converged"] is False and train["stopping"]["plateau_step"] is None
    assert train["steps"] == 30 + math.ceil(0.2 * 30)


def test_a_fixed_budget_run_trains_the_whole_budget_where_the_plateau_rule_would_stop(tmp_path):
    # The settings of test_a_run_stops_at_its_plateau_and_records_the_rule, whose run stops at step 60:
    # with schedule "budget" the same model trains all 120 steps, then the cool-down of 24. Up to the
    # plateau both schedules hold the rate after the warm-up, so the held-out curve is that run's and the
    # rule fires within the budget (checked below). A budget of 120, twice the plateau step, leaves room
    # for the plateau to come later on another machine's last bits; one of 400 (480 steps in all) cost
    # three times as much and checked nothing more.
    settings = Settings(**{**QUICK, "steps": 120, "plateau_min_window": 20, "extensions": False,
                           "eval_factors": (1,), "schedule": "budget"}, scheme="alibi")
    rec = run_one(settings, tmp_path, verbose=False)
    train, stop = rec["train"], rec["train"]["stopping"]
    assert train["converged"] is False and stop["plateau_step"] is None
    assert train["steps"] == 120 + 24 and stop["cooldown_steps"] == 24 and stop["budget"] == 120
    assert "fixed budget" in stop["rule"] and "plateau when" not in stop["rule"]
    h = list(zip(train["heldout"]["step"], train["heldout"]["loss"]))
    assert [s for s, _ in h] == list(range(0, 121, 10)) + [144]          # measured all along, and at the end
    assert any(Stopping(every=10, sequences=8, min_window=20).reached(h[:i + 1], s)   # the plateau rule would
               for i, (s, _) in enumerate(h[:-1]))                                     # have fired
    summary = summarize([rec])
    row = summary["markov"]["rows"]["alibi"]
    assert row["converged"] == 0 and row["fixed"] == 1
    assert "(fixed budget 1/1," in format_table(summary)


def test_a_fixed_budget_record_cannot_claim_a_plateau(tmp_path):
    from lab import record as records
    settings = Settings(**{**QUICK, "steps": 20, "extensions": False, "eval_factors": (1,), "schedule": "budget"},
                        scheme="nope")
    rec = run_one(settings, tmp_path, verbose=False)
    records.validate(rec)
    rec["train"]["converged"], rec["train"]["stopping"]["plateau_step"] = True, 20
    with pytest.raises(ValueError, match="schedule 'budget'"):
        records.validate(rec)


def test_one_rule_scales_every_length_like_setting():
    L = 64
    assert schemes.default_spec("learned", L)["max_positions"] == 64                  # 1024 x 64/1024
    # T5: the source's 32 buckets; max_distance L/2 (128 x 64/512 = 16 would leave no log buckets: a
    # unidirectional table of 32 keeps 16 exact ones); one table for the layers, as T5 computes it
    assert schemes.default_spec("t5", L) == {"name": "t5", "num_buckets": 32, "max_distance": 32,
                                             "bidirectional": False, "shared": True}
    assert schemes.default_spec("t5", 16)["max_distance"] == 17                      # the least with log buckets
    assert schemes.default_spec("sinusoidal", L) == {"name": "sinusoidal", "placement": "input"}
    assert schemes.default_spec("deberta", L) == {"name": "deberta", "position_buckets": 32,
                                                  "max_relative_positions": 64}   # 256, 512 x 64/512
    assert schemes.default_spec("xpos", L)["scale_base"] == 32                     # 512 x 64/1024
    assert schemes.default_spec("t5@source", L)["max_distance"] == 128
    assert schemes.default_spec("xpos@source", L)["scale_base"] == 512
    assert schemes.default_spec("rope", L) == {"name": "rope", "base": 10000.0}    # not a length: kept
    table = schemes.config_table(L)
    assert {r["name"] for r in table} == set(schemes.NAMES)
    assert all(r["cite"] for r in table)


def test_t5_starts_with_hf_s_initialisation():
    d, H = 64, 4
    config = ModelConfig(vocab=8, scheme=schemes.default_spec("t5", 64), d_model=d, num_heads=H, num_layers=1,
                         d_ff=16)
    other = ModelConfig(vocab=8, scheme={"name": "alibi"}, d_model=d, num_heads=H, num_layers=1, d_ff=16)
    t5, alibi = Model(config, seed=0), Model(other, seed=0)
    table = t5.params["blocks.0.attn.scheme.table"]
    # HF T5: relative_attention_bias ~ N(0, d_model^-1/2); q's std 1/sqrt(D) of k's
    assert abs(table.std() - d ** -0.5) < 0.1 * d ** -0.5 * 2
    q, k = t5.params["blocks.0.attn.wq"], t5.params["blocks.0.attn.wk"]
    assert q.std() / k.std() == pytest.approx((d // H) ** -0.5, rel=0.1)
    assert alibi.params["blocks.0.attn.wq"].std() == pytest.approx(k.std(), rel=0.1)


def test_offsets_past_training_are_marked(tmp_path):
    kv = KeyValueRecall(keys=8, values=8, filler=8, pairs=2)
    assert kv.max_offset(16) == 16 + 1 - 4
    settings = Settings(**{**QUICK, "steps": 10, "extensions": False, "eval_factors": (1, 4)}, task="retrieval",
                        scheme="rope")
    rec = run_one(settings, tmp_path, verbose=False)
    at_4l = rec["results"]["base"]["lengths"][1]
    assert not at_4l["seen_in_training"] and rec["results"]["base"]["lengths"][0]["seen_in_training"]
    for cell in at_4l["offsets"]:
        assert cell["seen_in_training"] == (cell["offset"] <= 13)
        # the standard error is over sequences: the sd of the per-sequence accuracies (each the share
        # of the sequence's `pairs` probes answered) over sqrt(n)
        per = cell["sequence_accuracy"]
        assert cell["sequences"] == len(per) == 4 and cell["probes"] == 2 * len(per)
        assert set(per) <= {0.0, 0.5, 1.0} and cell["accuracy"] == pytest.approx(sum(per) / len(per))
        mean = sum(per) / len(per)
        sd = math.sqrt(sum((a - mean) ** 2 for a in per) / (len(per) - 1))
        assert cell["accuracy_stderr"] == pytest.approx(sd / 2)


def test_standard_error_is_the_larger_of_seed_spread_and_evaluation_noise():
    got = _spread([1.0, 2.0, 3.0], [0.1, 0.1, 0.1])
    assert got["sd"] == 1.0 and got["se"] == pytest.approx(1 / math.sqrt(3))
    got = _spread([1.0, 1.0, 1.0], [0.3, 0.4, 0.0])                   # no spread: the noise, sqrt(.09+.16)/3
    assert got["se"] == pytest.approx(0.5 / 3)


def test_the_evaluation_sizes_meet_the_standard_error_targets():
    # Per-sequence standard deviations at L measured on short runs (lab/README.md, Evaluation): Markov
    # 0.166 nats over 64 tokens (ALiBi, 600 steps), so 163840 / 64 = 2560 sequences give an SE of
    # 0.0034 <= 0.005; text 0.474 nats (NoPE, 1200 steps), so 6400 give 0.0059, and would still meet
    # 0.01 at a per-sequence sd of 0.75.
    from lab.run import TASK_DEFAULTS
    s = Settings()
    assert 0.17 / math.sqrt(s.eval_tokens // s.length) <= 0.005
    assert all(0.75 / math.sqrt(TASK_DEFAULTS[t]["eval_tokens"] // s.length) <= 0.01 for t in ("text", "prose"))
    assert s.probes >= 256                                              # retrieval: distinct sequences per offset


def test_runs_side_by_side_write_the_records_a_single_run_writes(tmp_path):
    base = Settings(**{**QUICK, "steps": 12, "extensions": False, "eval_factors": (1, 2)})
    runs = [Settings(**{**base.__dict__, "scheme": s}) for s in ("alibi", "rope")]
    done = pool.run_all(runs, tmp_path / "pool", jobs=2, report=lambda line: None)
    assert [status for _, status, _ in done] == [0, 0]
    side = json.loads(record_path(tmp_path / "pool", runs[1]).read_text())
    # The same run alone, in a process of its own started with the record's thread variables: BLAS reads
    # its thread count when it loads, so setting them in this process would not reach it.
    env, argv = verify.rerun_argv(side["command"], tmp_path / "alone")
    subprocess.run(argv + ["--no-progress", "--no-summary"], env=env, check=True, capture_output=True,
                   cwd=pathlib.Path(__file__).resolve().parents[1])
    alone = json.loads(record_path(tmp_path / "alone", runs[1]).read_text())
    assert _equal_but_seconds(side, alone)                              # the same numbers, bit for bit
    assert side["command"].startswith("MINIPOS_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python -m lab")
    assert pool.commands(runs, "OUT")[1] == side["command"].replace(str(tmp_path / "pool"), "OUT")


def test_the_protocols_commands_carry_an_openblas_kernel_choice_made_here(monkeypatch):
    # OPENBLAS_CORETYPE picks the BLAS's kernels, so a record written under it must say so; the thread
    # counts are still one each, whatever this environment has
    run = Settings(**{**QUICK, "scheme": "alibi"})
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    assert pool.commands([run], "OUT")[0].startswith(
        "MINIPOS_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 python -m lab --out OUT ")
    monkeypatch.setenv("OPENBLAS_CORETYPE", "Haswell")
    assert pool.commands([run], "OUT")[0].startswith(
        "MINIPOS_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 OPENBLAS_CORETYPE=Haswell python -m lab ")


def _equal_but_seconds(a, b):
    from lab.record import comparable
    return comparable(a)["results"] == comparable(json.loads(json.dumps(b)))["results"]


def test_summary_rows_are_scheme_names_with_convergence_counts(tmp_path):
    settings = Settings(**{**QUICK, "steps": 10, "extensions": False, "eval_factors": (1,)}, scheme="t5@source")
    rec = run_one(settings, tmp_path, verbose=False)
    row = summarize([rec])["markov"]["rows"]["t5@source"]
    assert row["label"] == "t5(32, 128)" and row["converged"] in (0, 1) and row["learned"] in (0, 1)
    assert set(row["lengths"]["16"]) == {"mean", "sd", "se", "min", "max", "n"}


def test_markov_order1_baseline_forgets_the_symbol_two_back():
    src = MarkovSource(vocab=4, order=2, seed=0)
    b = src.baselines()
    assert b["entropy_rate"] < b["order1"] < b["unigram"]
    assert np.isfinite(list(b.values())).all()


def test_checkpoints_do_not_touch_the_training(tmp_path):
    # The history's evaluations run on the model mid-training: they must change nothing of the run (the
    # training curve, the held-out losses and the final evaluation of a run with 5 checkpoints are those
    # of the same run with 1, bit for bit), and land at the steps checkpoint_steps names.
    from lab.run import checkpoint_steps
    one = Settings(**{**QUICK, "checkpoints": 1, "extensions": False, "eval_factors": (1, 2)}, scheme="t5")
    five = Settings(**{**one.__dict__, "checkpoints": 5})
    a, b = run_one(one, verbose=False), run_one(five, verbose=False)
    assert a["train"]["curve"] == b["train"]["curve"] and a["train"]["heldout"] == b["train"]["heldout"]
    assert a["results"]["base"]["lengths"][1]["sequence_losses"] == b["results"]["base"]["lengths"][1]["sequence_losses"]
    total = 40 + math.ceil(0.2 * 40)                                    # QUICK's budget and its cool-down
    assert checkpoint_steps(five) == [10, 19, 29, 38, 48] and total == 48  # round(k * 48 / 5)
    assert [h["step"] for h in b["history"]] == [10, 19, 29, 38, 48] and [h["step"] for h in a["history"]] == [48]
    assert b["history"][-1]["lengths"][0]["sequences"] == QUICK["history_tokens"] // QUICK["length"]
