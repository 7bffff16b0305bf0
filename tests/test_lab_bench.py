"""The lab's timing against torch runs on tiny sizes and says so when torch is missing."""

import sys

import pytest

from lab import bench
from lab.memory import keep_freed_memory

TINY = dict(vocab=7, d_model=8, num_heads=2, num_layers=1, d_ff=16, batch=2, length=8, rounds=1, repeats=1, warmup=1)


def test_step_ratio_on_tiny_sizes():
    torch = pytest.importorskip("torch")
    threads = torch.get_num_threads()
    got = bench.step_ratio(details=True, **TINY)
    assert got["ratio"] > 0 and got["numpy_s"] > 0 and got["torch_s"] > 0 and got["threads"] == 1
    assert torch.get_num_threads() == threads                          # one_thread restores torch's count


def test_step_ratios_time_each_scheme_as_the_protocol_configures_it(monkeypatch):
    pytest.importorskip("torch")
    seen = []
    real = bench._numpy_stepper
    monkeypatch.setattr(bench, "_numpy_stepper", lambda config, *a: seen.append(config.scheme) or real(config, *a))
    theirs = []
    real_torch = bench._torch_stepper
    monkeypatch.setattr(bench, "_torch_stepper",
                        lambda config, *a: theirs.append(config.scheme) or real_torch(config, *a))
    got = bench.step_ratios(["deberta", "transformer-xl", "alibi"], **TINY)
    assert list(got) == ["deberta", "transformer-xl", "alibi"] and all(g["ratio"] > 0 for g in got.values())
    # DeBERTa-v3's 256 buckets and 512 positions at 512 tokens, scaled by L / 512 (L = 8)
    assert seen == theirs == [{"name": "deberta", "position_buckets": 4, "max_relative_positions": 8},
                              {"name": "transformer-xl", "base": 10000.0}, {"name": "alibi"}]
    # torch implements the first two; ALiBi's model is timed against the RoPE model, and says so
    assert [g["torch_scheme"] for g in got.values()] == ["deberta", "transformer-xl", "rope"]


def test_step_ratio_without_torch(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "torch", None)                    # import torch raises ImportError
    assert bench.step_ratio(**TINY) is None
    assert bench.step_ratios(["nope"], **TINY) is None
    assert "torch is not installed" in capsys.readouterr().err
    assert bench.torch_step_time(vocab=7, d_model=8, num_heads=2, num_layers=1, d_ff=16, batch=2, length=8) is None


def test_numpy_step_time():
    sizes = dict(vocab=7, d_model=8, num_heads=2, num_layers=1, d_ff=16, batch=4, length=8, repeats=1, warmup=1)
    assert bench.numpy_step_time(**sizes) > 0


def test_keep_freed_memory_is_idempotent():
    first = keep_freed_memory()
    assert keep_freed_memory() is first
