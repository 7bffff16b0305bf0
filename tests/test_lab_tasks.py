"""The lab's tasks: the Markov source's exact floor (hand-worked chain, Monte Carlo), its samples'
law, the key-value recall targets, the text source."""

import math

import numpy as np
import pytest

from lab.tasks import KeyValueRecall, MarkovSource, TextSource, entropy, stationary_distribution


def test_stationary_distribution_by_hand():
    # two states: 0 -> 0 w.p. 0.9, 0 -> 1 w.p. 0.1; 1 -> 0 or 1 w.p. 0.5. Balance: 0.1 pi0 = 0.5 pi1, pi = (5/6, 1/6)
    probs = np.array([[0.9, 0.1], [0.5, 0.5]])
    nxt = np.array([[0, 1], [0, 1]])
    assert np.allclose(stationary_distribution(nxt, probs), [5 / 6, 1 / 6], rtol=1e-12)
    h = 5 / 6 * -(0.9 * math.log(0.9) + 0.1 * math.log(0.1)) + 1 / 6 * math.log(2)
    assert float(stationary_distribution(nxt, probs) @ entropy(probs)) == pytest.approx(h, rel=1e-12)


def test_markov_floor_is_the_true_predictor_loss():
    # Monte Carlo: the loss of the source's own conditional probabilities at each position has mean floor[t]
    src = MarkovSource(vocab=5, order=2, temperature=0.7, seed=3)
    x, y, _ = src.sample(np.random.default_rng(0), 40000, 3)
    V = src.vocab
    joint2 = src.stationary.reshape(V, V)                               # P(x0, x1)
    p1 = joint2[x[:, 0], y[:, 0]] / joint2.sum(1)[x[:, 0]]              # P(x1 | x0)
    p2 = src.probs[x[:, 0] * V + x[:, 1], y[:, 1]]                      # P(x2 | x0, x1)
    floor = src.position_floor(3)
    for losses, f in ((-np.log(p1), floor[0]), (-np.log(p2), floor[1])):
        assert abs(losses.mean() - f) < 4 * losses.std() / math.sqrt(len(losses))
    assert floor[1] == floor[2] == pytest.approx(src.entropy_rate())
    base = src.baselines()
    assert floor[0] == pytest.approx(base["order1"])                    # position 0 sees one symbol
    assert base["unigram"] > base["order1"] > base["entropy_rate"] > 0


def test_markov_samples_follow_the_source():
    src = MarkovSource(vocab=3, order=1, temperature=1.0, seed=1)
    x, y, w = src.sample(np.random.default_rng(1), 20000, 6)
    assert w is None and x.shape == y.shape == (20000, 6)
    assert np.array_equal(x[:, 1:], y[:, :-1])
    counts = np.zeros((3, 3))
    np.add.at(counts, (x[:, 3], y[:, 3]), 1)
    assert np.allclose(counts / counts.sum(1, keepdims=True), src.probs, atol=0.02)
    assert np.allclose(np.bincount(x[:, 0], minlength=3) / 20000, src.stationary, atol=0.015)


def test_markov_source_is_seeded():
    a, b = MarkovSource(seed=4), MarkovSource(seed=4)
    assert np.array_equal(a.probs, b.probs)
    assert not np.array_equal(a.probs, MarkovSource(seed=5).probs)
    assert np.array_equal(a.sample(np.random.default_rng(0), 3, 9)[0], b.sample(np.random.default_rng(0), 3, 9)[0])


def _answer_by_scan(full, t, kv):
    """(value, distance) of the key read at position t, by scanning back for where it was written (a slow oracle)."""
    K, V, F = kv.keys, kv.values, kv.filler
    key = full[t]
    for s in range(t - 1, -1, -1):
        if kv.binding == "adjacent" and full[s] == key:
            return full[s + 1], t - s
        if kv.binding == "fused" and full[s] >= K + V + F and (full[s] - K - V - F) // V == key:
            return K + (full[s] - K - V - F) % V, t - s
    return None, None


@pytest.mark.parametrize("binding", ["fused", "adjacent"])
@pytest.mark.parametrize("pairs", [1, 3])
def test_recall_targets_are_the_written_values(pairs, binding):
    kv = KeyValueRecall(keys=6, values=5, filler=4, pairs=pairs, binding=binding)
    rng = np.random.default_rng(pairs)
    x, y, w = kv.sample(rng, 50, 20)
    assert w.sum() == 50 * pairs
    assert x.max() < kv.vocab_size and y.max() < kv.vocab_size
    for b in range(50):
        full = np.concatenate([x[b], y[b, -1:]])
        for t in np.flatnonzero(w[b]):
            assert full[t] < kv.keys                                     # a key is read here
            answer, _ = _answer_by_scan(full, t, kv)
            assert y[b, t] == answer and kv.keys <= answer < kv.keys + kv.values


@pytest.mark.parametrize("binding", ["fused", "adjacent"])
def test_recall_at_an_offset_ends_with_the_read_block(binding):
    kv = KeyValueRecall(keys=8, values=8, filler=8, pairs=3, binding=binding)
    x, y, w, dist = kv.sample_at(np.random.default_rng(0), 20, 40, 17)
    assert np.all(w[:, -1] == 1) and np.all(w[:, -2] == 0)                # the last target is the last value
    spread = 2 if binding == "fused" else 4                               # read slots step 2, written 1 or 2
    assert np.all((dist >= 17 - spread) & (dist <= 17 + 2 * 2))
    for b in range(20):
        full = np.concatenate([x[b], y[b, -1:]])
        got = sorted(_answer_by_scan(full, t, kv)[1] for t in np.flatnonzero(w[b]))
        assert got == sorted(dist[b])
    assert kv.offsets(64, 64) == [16, 32, 59] and kv.offsets(1024, 64)[-2:] == [512, 1019]
    with pytest.raises(ValueError, match="offset"):
        kv.sample_at(np.random.default_rng(0), 2, 40, 2)


def test_text_source(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abracadabra " * 20, encoding="utf-8")
    src = TextSource(path)
    assert src.alphabet == " abcdr" and src.vocab_size == 6
    x, y, _ = src.sample(np.random.default_rng(0), 4, 10)
    text = "".join(src.alphabet[i] for i in np.concatenate([x[0], y[0, -1:]]))
    assert text in "abracadabra " * 20
    assert not src.fits(100) and src.fits(20)


def test_text_corpus_is_sympy_source_held_out_by_file():
    """The corpus rebuilt here: the bytes of SymPy 1.14.0's own files (read directly, not by lab.corpus),
    every tenth file held out, each followed by a newline."""
    import sympy
    from pathlib import Path
    from lab import corpus
    src = TextSource()
    paths = corpus.files()
    root = Path(sympy.__file__).parent
    assert paths[0] == root / "__init__.py" and all("tests" not in p.relative_to(root).parts for p in paths)
    assert len(paths) == src.config()["origin"]["files"]["train"] + src.config()["origin"]["files"]["heldout"]
    tenth = paths[9].read_bytes() + b"\n"                           # the first held-out file opens the split
    held = bytes(src.alphabet[i] for i in src.heldout[:len(tenth)])
    assert held == tenth
    assert bytes(src.alphabet[i] for i in src.train[:20]) == paths[0].read_bytes()[:20]
    assert src.config()["origin"]["sha256"] == corpus.SHA256 and src.vocab_size == len(src.alphabet)
