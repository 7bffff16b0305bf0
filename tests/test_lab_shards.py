"""The training step in shards (lab.shards): one shard is the plain step bit for bit; several shards
give the full batch's loss and gradients (float64, to rounding), whatever the weights; where the
shards run (here or in forked workers) changes no bit; errors are named and leave it usable."""

import numpy as np
import pytest

from lab import shards as S
from lab.model import AdamW, Model, ModelConfig, clip_by_global_norm, learning_rate
from lab.run import train
from lab.shards import Shards, shard_bounds
from lab.tasks import KeyValueRecall

VOCAB, T = 8, 8


def tiny(scheme="rope", dtype=np.float32, seed=0, vocab=VOCAB):
    cfg = ModelConfig(vocab=vocab, d_model=16, num_heads=2, num_layers=1, d_ff=32, scheme={"name": scheme})
    return Model(cfg, seed=seed, dtype=dtype)


def batch(rng, b=5, zero_rows=(), scale=1.0):
    # weights in [0, 1) on about half the tokens: a row's total is often below 1, where the model's
    # mean divides by 1 instead (lab.model.weight_total)
    x = rng.integers(0, VOCAB, (b, T + 1))
    w = (rng.random((b, T)) < 0.5) * rng.random((b, T)) * scale
    for r in zero_rows:
        w[r] = 0.0
    return x[:, :-1], x[:, 1:], w


def plain(model, x, y, w):
    out = model.forward(x, y, weights=w)
    return out["loss"], model.backward(out["context"])


# the split: numpy.array_split's rule, worked by hand
@pytest.mark.parametrize("b, n, want", [(5, 2, [(0, 3), (3, 5)]), (4, 4, [(0, 1), (1, 2), (2, 3), (3, 4)]),
                                        (7, 3, [(0, 3), (3, 5), (5, 7)]), (6, 1, [(0, 6)])])
def test_shard_bounds(b, n, want):
    assert shard_bounds(b, n) == want
    assert [(len(p)) for p in np.array_split(np.arange(b), n)] == [stop - start for start, stop in want]


@pytest.mark.parametrize("b, n, word", [(4, 0, "shards"), (4, -1, "shards"), (4, True, "shards"), (4, 2.0, "shards"),
                                        (1, 2, "batch")])
def test_shard_bounds_rejects(b, n, word):
    with pytest.raises(ValueError, match=word):
        shard_bounds(b, n)


def test_one_shard_is_the_plain_step_bit_for_bit():
    x, y, w = batch(np.random.default_rng(1))
    want_loss, want = plain(tiny(), x, y, w)
    loss, got = Shards(tiny(), 1).gradients(x, y, w)
    assert loss == want_loss
    assert set(got) == set(want) and all(np.array_equal(got[k], want[k]) for k in want)


@pytest.mark.parametrize("shards", [2, 3, 5])
@pytest.mark.parametrize("zero_rows, scale", [((), 1.0), ((0, 1, 2), 1.0), ((), 0.05), ((0, 1, 2, 3, 4), 1.0)])
@pytest.mark.parametrize("weighted", [True, False])
def test_shards_add_up_to_the_full_batch(shards, zero_rows, scale, weighted):
    # float64: the shards' weighted sum is the full batch's loss and gradient to rounding: with rows
    # 0-2 weightless (the first shards carry nothing), with every shard's weight below 1 (scale
    # 0.05), and with no weight at all (loss 0, zero gradients, as the plain step gives)
    x, y, w = batch(np.random.default_rng(2), zero_rows=zero_rows, scale=scale)
    w = w if weighted else None
    want_loss, want = plain(tiny(dtype=np.float64), x, y, w)
    with Shards(tiny(dtype=np.float64), shards, workers=1) as split:
        loss, got = split.gradients(x, y, w)
    assert loss == pytest.approx(want_loss, rel=1e-13)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-10, atol=1e-13, err_msg=k)


def test_a_plain_mean_of_the_shards_would_fail():
    # the test above can fail: with unequal shard weights, the unweighted mean of the shard gradients is wrong
    x, y, w = batch(np.random.default_rng(3), zero_rows=(0, 1))
    _, want = plain(tiny(dtype=np.float64), x, y, w)
    m = tiny(dtype=np.float64)
    halves = [plain(m, x[a:b], y[a:b], w[a:b])[1]["embed"] for a, b in shard_bounds(5, 2)]
    wrong = np.mean(halves, axis=0)
    assert np.linalg.norm(wrong - want["embed"]) > 0.1 * np.linalg.norm(want["embed"])


def steps(model, shards, workers, n=3):
    rng = np.random.default_rng(4)
    opt = AdamW(model.params)
    with Shards(model, shards, workers=workers) as split:
        for _ in range(n):
            x, y, w = batch(rng, b=6)
            loss, grads = split.gradients(x, y, w)
            clip_by_global_norm(grads, 1.0)
            opt.step(grads, 1e-2)
    return loss, grads, model.params


@pytest.mark.parametrize("scheme", ["rope", "t5", "learned"])
@pytest.mark.parametrize("shards, workers", [(2, 2), (3, 2), (3, 3)])
def test_workers_change_no_bit(scheme, shards, workers):
    a = steps(tiny(scheme), shards, 1)
    b = steps(tiny(scheme), shards, workers)
    assert a[0] == b[0]
    for k in a[1]:
        assert np.array_equal(a[1][k], b[1][k]), k
        assert np.array_equal(a[2][k], b[2][k]), k


def test_workers_really_run(monkeypatch):
    # the shard sent to the worker is computed there: break this process's copy of the step after the fork
    model = tiny()
    x, y, w = batch(np.random.default_rng(5), b=4)
    want_loss, want = Shards(tiny(), 2, workers=1).gradients(x, y, w)
    with Shards(model, 2, workers=2) as split:
        calls = []
        real = S._shard_step
        monkeypatch.setattr(S, "_shard_step", lambda *a: calls.append(1) or real(*a))
        loss, got = split.gradients(x, y, w)
    assert calls == [1]                                                # shard 0 only: shard 1 ran in the worker
    assert loss == want_loss and all(np.array_equal(got[k], want[k]) for k in want)


def test_a_worker_error_is_reported_and_the_shards_go_on():
    model = tiny()
    x, y, w = batch(np.random.default_rng(6), b=4)
    bad = x.copy()
    bad[3, 0] = VOCAB + 5                                               # only shard 1 (rows 2-3) fails
    with Shards(model, 2, workers=2) as split:
        with pytest.raises(RuntimeError, match="shard 1 failed in its worker"):
            split.gradients(bad, y, w)
        loss, got = split.gradients(x, y, w)                           # the worker answered: still in step
        assert split.workers == 2
    want_loss, want = Shards(tiny(), 2, workers=1).gradients(x, y, w)
    assert loss == want_loss and all(np.array_equal(got[k], want[k]) for k in want)


def test_an_error_here_leaves_the_workers_in_step():
    # a bad token in shard 0 fails in this process after shard 1 went to its worker: its reply is
    # read and dropped, so the next step gets its own
    x, y, w = batch(np.random.default_rng(14), b=4)
    bad = x.copy()
    bad[0, 0] = VOCAB + 5
    want = Shards(tiny(), 2, workers=1).gradients(x, y, w)
    with Shards(tiny(), 2, workers=2) as split:
        with pytest.raises(IndexError):
            split.gradients(bad, y, w)
        assert split.workers == 2
        got = split.gradients(x, y, w)
    assert got[0] == want[0] and all(np.array_equal(got[1][k], want[1][k]) for k in want[1])


def test_an_interrupted_send_or_a_dead_worker_never_hands_back_an_old_reply(monkeypatch):
    rng = np.random.default_rng(15)
    batches = [batch(rng, b=6) for _ in range(3)]
    wants = [Shards(tiny(), 3, workers=1).gradients(*b) for b in batches]
    split = Shards(tiny(), 3, workers=3)
    real, calls = Shards._send, []

    def send(conn, s, part):                                          # shard 2's send is interrupted once
        calls.append(s)
        if calls == [1, 2]:
            raise KeyboardInterrupt
        real(conn, s, part)
    monkeypatch.setattr(Shards, "_send", staticmethod(send))
    with pytest.raises(KeyboardInterrupt):
        split.gradients(*batches[0])
    for b, want in zip(batches[1:], wants[1:]):                        # each step its own numbers
        got = split.gradients(*b)
        assert got[0] == want[0] and all(np.array_equal(got[1][k], want[1][k]) for k in want[1])
    monkeypatch.setattr(Shards, "_send", staticmethod(real))
    if split.workers > 1:                                              # a worker killed: named, then carried on here
        split._procs[0].kill()
        split._procs[0].join()
        with pytest.raises(RuntimeError, match="shard 1"):
            split.gradients(*batches[1])
    got = split.gradients(*batches[2])
    assert split.workers == 1
    assert got[0] == wants[2][0] and all(np.array_equal(got[1][k], wants[2][1][k]) for k in wants[2][1])
    split.close()


def test_after_close_the_shards_run_here():
    x, y, w = batch(np.random.default_rng(7), b=4)
    split = Shards(tiny(), 2, workers=2)
    first = split.gradients(x, y, w)
    split.close()
    split.close()
    assert split.workers == 1
    second = split.gradients(x, y, w)
    assert first[0] == second[0] and all(np.array_equal(first[1][k], second[1][k]) for k in first[1])


def test_bad_input():
    x, y, w = batch(np.random.default_rng(8), b=4)
    with pytest.raises(TypeError, match="model"):
        Shards("model", 2)
    with pytest.raises(ValueError, match="workers"):
        Shards(tiny(), 2, workers=0)
    with Shards(tiny(), 2, workers=1) as split:
        with pytest.raises(ValueError, match="x and y"):
            split.gradients(x, y[:, :-1], w)
        with pytest.raises(ValueError, match="w must be"):
            split.gradients(x, y, w[:, :-1])
        with pytest.raises(ValueError, match="batch of 1"):
            split.gradients(x[:1], y[:1], w[:1])


def test_train_uses_the_shards():
    # train(shards=2) on the retrieval task (weights on the read block only) takes the same steps as
    # Shards(workers=1) by hand, and not the plain step's
    task = KeyValueRecall(keys=4, values=4, filler=2, pairs=2)

    def by_hand(shards):
        model, rng = tiny(vocab=task.vocab_size), np.random.default_rng(9)
        opt = AdamW(model.params, weight_decay=0.1)
        with Shards(model, shards, workers=1) as split:
            for step in range(4):
                x, y, w = task.sample(rng, 4, 12)
                _, grads = split.gradients(x, y, w)
                clip_by_global_norm(grads, 1.0)
                opt.step(grads, learning_rate(step, lr=1e-2, steps=4, warmup=1))
        return model.params
    model = tiny(vocab=task.vocab_size)
    train(model, task, np.random.default_rng(9), length=12, batch=4, steps=4, lr=1e-2, warmup=1, shards=2)
    want, other = by_hand(2), by_hand(1)
    assert all(np.array_equal(model.params[k], want[k]) for k in want)
    assert not all(np.array_equal(model.params[k], other[k]) for k in other)
    with pytest.raises(ValueError, match="batch of 4"):
        train(tiny(vocab=task.vocab_size), task, np.random.default_rng(9), length=12, batch=4, steps=1, lr=1e-2,
              warmup=1, shards=5)
