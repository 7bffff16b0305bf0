"""The lab's tasks: two with a known optimum, generated from a seed, and real text.

``MarkovSource``  local language modelling: sequences from a random order-k Markov source. Its
                  conditional entropy is computed exactly from the source, so every loss has a
                  floor: the stationary distribution over contexts times each context's entropy.
``KeyValueRecall`` long-range retrieval: keys written with their values, read back later at a
                  controlled distance; scored by accuracy as a function of distance and length.
``TextSource``    real text, a symbol a token (no known floor): SymPy 1.14.0's source (code) or Jane
                  Austen's novels (prose) as bytes (``lab.corpus``, rebuilt bit for bit from the
                  pinned packages), or a user's file.

Every task draws batches ``(inputs (B, T), targets (B, T), weights (B, T) or None)`` from a
``numpy.random.Generator`` the caller seeds, so a run is reproducible.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from minipos import safe_io

from . import corpus

__all__ = ["MarkovSource", "KeyValueRecall", "TextSource", "stationary_distribution", "entropy"]


def entropy(p, axis=-1):
    """Shannon entropy in nats along ``axis`` (0 log 0 = 0), float64."""
    p = np.asarray(p, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return -np.where(p > 0, p * np.log(p), 0.0).sum(axis=axis)


def stationary_distribution(next_state, probs, *, tol: float = 1e-15, max_iter: int = 100_000):
    """The stationary distribution ``pi`` of a chain where state ``c`` goes to ``next_state[c, s]`` with
    probability ``probs[c, s]``: power iteration from uniform until the L1 change is below ``tol``.

    Raises ``RuntimeError`` if it has not converged after ``max_iter`` steps (a periodic or reducible
    chain); a source with every probability positive is aperiodic and irreducible, and converges.
    """
    n = probs.shape[0]
    pi = np.full(n, 1.0 / n)
    flat_next, flat_p = next_state.ravel(), probs.ravel()
    for _ in range(max_iter):
        new = np.bincount(flat_next, weights=np.repeat(pi, probs.shape[1]) * flat_p, minlength=n)
        new /= new.sum()
        if np.abs(new - pi).sum() < tol:
            return new
        pi = new
    raise RuntimeError(f"the chain's distribution did not converge in {max_iter} steps")


class MarkovSource:
    """An order-``order`` Markov source over ``vocab`` symbols with a fixed random transition table.

    For each context ``c = (x_{t-k+1}, ..., x_t)`` the next symbol has probabilities
    ``softmax(g_c / temperature)``, with logits ``g_c`` drawn once from ``seed``:

    - ``structure="additive"`` (default): ``g_c = A_1[x_t] + A_2[x_{t-1}] + ... + A_k[x_{t-k+1}]``,
      each table ``(V, V)`` of N(0, 1/k) entries. Every symbol of the context shifts the logits of the
      next one by its own amount: a model must see all k symbols to reach the floor (``order1`` falls
      short by the share of the others), and a small transformer can represent the rule;
    - ``structure="full"``: ``g_c ~ N(0, I)`` independently for each of the ``V^k`` contexts (a lookup
      table of ``V^(k+1)`` random numbers, beyond what the lab's small models can memorise).

    Either way the logits have unit variance: a low temperature makes each context nearly
    deterministic, a high one nearly uniform. Sequences start in the stationary distribution over
    contexts, so every position has the same law.

    The loss floor of a model predicting ``x_{t+1}`` from ``x_0..x_t`` is ``position_floor(T)``:
    the entropy rate ``h = sum_c pi(c) H(P(. | c))`` once ``t >= k - 1``, and at the first ``k - 1``
    positions the conditional entropy of the stationary marginals, ``H(X_0..X_{t+1}) - H(X_0..X_t)``.
    """

    kind = "markov"

    def __init__(self, *, vocab: int = 32, order: int = 2, temperature: float = 0.5, seed: int = 0,
                 structure: str = "additive"):
        if vocab < 2 or order < 1 or not temperature > 0 or vocab ** order > 1 << 20:
            raise ValueError(f"need vocab >= 2, order >= 1, temperature > 0 and vocab**order <= 2**20; got "
                             f"vocab={vocab}, order={order}, temperature={temperature}")
        if structure not in ("additive", "full"):
            raise ValueError(f"structure must be 'additive' or 'full', got {structure!r}")
        self.vocab, self.order, self.temperature, self.seed = vocab, order, float(temperature), seed
        self.structure = structure
        V, n = vocab, vocab ** order
        rng = np.random.default_rng(seed)
        if structure == "full":
            g = rng.standard_normal((n, V))
        else:                                                               # context index = sum x_{t-k+1+i} V^(k-1-i)
            digits = (np.arange(n)[:, None] // V ** np.arange(order - 1, -1, -1)[None]) % V   # (V^k, k), oldest first
            tables = rng.standard_normal((order, V, V)) / np.sqrt(order)
            g = sum(tables[order - 1 - i][digits[:, i]] for i in range(order))           # A_1 on x_t (newest)
        g = g / temperature
        p = np.exp(g - g.max(axis=1, keepdims=True))
        self.probs = p / p.sum(axis=1, keepdims=True)                          # (V^k, V): P(next | context)
        self.next_state = (np.arange(n)[:, None] * V + np.arange(V)[None]) % n   # (V^k, V)
        self.stationary = stationary_distribution(self.next_state, self.probs)  # (V^k,)
        self.cdf = np.cumsum(self.probs, axis=1)
        self.start_cdf = np.cumsum(self.stationary)

    def config(self) -> dict:
        return {"name": self.kind, "vocab": self.vocab, "order": self.order, "temperature": self.temperature,
                "structure": self.structure, "source_seed": self.seed}

    @property
    def vocab_size(self) -> int:
        return self.vocab

    def entropy_rate(self) -> float:
        """``h = sum_c pi(c) H(P(. | c))``, nats per symbol: the floor of the loss once the context is full."""
        return float(self.stationary @ entropy(self.probs))

    def _marginal_entropy(self, m: int) -> float:
        """``H(X_0..X_{m-1})`` for ``m <= order`` under the stationary start (a marginal of pi)."""
        if m == 0:
            return 0.0
        joint = self.stationary.reshape((self.vocab,) * self.order)           # axes x_0 .. x_{k-1}
        return float(entropy(joint.sum(axis=tuple(range(m, self.order))).ravel()))

    def baselines(self) -> dict:
        """Entropies of predictors that see less: none of the past (``unigram``) and the last symbol only
        (``order1``), beside the floor (``entropy_rate``); nats."""
        V, k = self.vocab, self.order
        joint = self.stationary.reshape((V,) * k)[..., None] * self.probs.reshape((V,) * k + (V,))   # x_{0..k}
        pair = joint.sum(axis=tuple(range(k - 1)))                              # (x_{k-1}, x_k)
        return {"unigram": self._marginal_entropy(1), "order1": float(entropy(pair.ravel()) - entropy(pair.sum(1))),
                "entropy_rate": self.entropy_rate()}

    def position_floor(self, length: int) -> np.ndarray:
        """The least expected loss at each position ``t < length`` (predicting ``x_{t+1}``), float64 ``(T,)``."""
        floor = np.full(length, self.entropy_rate())
        for t in range(min(self.order - 1, length)):
            floor[t] = self._marginal_entropy(t + 2) - self._marginal_entropy(t + 1)
        return floor

    def sample(self, rng: np.random.Generator, batch: int, length: int):
        """``(inputs, targets, None)``, each ``(batch, length)`` int64: ``length + 1`` symbols of the source."""
        V, k = self.vocab, self.order
        x = np.empty((batch, length + 1), np.int64)
        ctx = np.minimum(np.searchsorted(self.start_cdf, rng.random(batch), side="right"), V ** k - 1)
        first = min(k, length + 1)
        for i in range(first):                                              # the start context's symbols
            x[:, i] = (ctx // V ** (k - 1 - i)) % V
        for t in range(k, length + 1):
            u = rng.random(batch)[:, None]
            s = np.minimum((self.cdf[ctx] < u).sum(axis=1), V - 1)          # inverse cdf, row by row
            x[:, t] = s
            ctx = self.next_state[ctx, s]
        return x[:, :-1], x[:, 1:], None


class KeyValueRecall:
    """Associative recall at a distance: ``pairs`` keys are written with their values, then read back.

    A sequence is uniform filler with two blocks planted: a write block holding ``pairs`` (key,
    value) pairs (distinct keys, random values) and, later, the read block ``k v k v ...`` with the
    same pairs in a shuffled order. At each read key the model must predict its value, which only the
    write block tells: the targets weighted 1 are the read values, every other weight is 0. Chance is
    ``1 / values``; a model that only knows the answer is one of the written values gets ``1 / pairs``.

    ``binding`` is how the write block holds a pair:

    - ``"fused"`` (default): one token per pair, ``w_(k, v)``. One attention step from the read key
      to the write token that carries it answers: the task measures how far attention reaches;
    - ``"adjacent"``: ``k v`` written as two tokens, so the answer needs an induction circuit (a head
      that copies the previous token into the value's position, then one that matches the key):
      two layers, and more training than the lab's short runs give.

    Vocabulary ids: ``keys`` keys, ``values`` values, ``filler`` filler symbols, then (fused) the
    ``keys * values`` pair tokens. The distance of a probe is (read key position) - (position of the
    written key). ``sample`` places the blocks at random (training); ``sample_at`` puts the read
    block at the end of the sequence, its start ``offset`` after the write block's (evaluation).
    """

    kind = "retrieval"

    def __init__(self, *, keys: int = 8, values: int = 8, filler: int = 16, pairs: int = 4, binding: str = "fused"):
        if pairs < 1 or pairs > keys or values < 2 or filler < 1:
            raise ValueError(f"need 1 <= pairs <= keys, values >= 2, filler >= 1; got keys={keys}, "
                             f"values={values}, filler={filler}, pairs={pairs}")
        if binding not in ("fused", "adjacent"):
            raise ValueError(f"binding must be 'fused' or 'adjacent', got {binding!r}")
        self.keys, self.values, self.filler, self.pairs, self.binding = keys, values, filler, pairs, binding

    def config(self) -> dict:
        return {"name": self.kind, "keys": self.keys, "values": self.values, "filler": self.filler,
                "pairs": self.pairs, "binding": self.binding}

    @property
    def vocab_size(self) -> int:
        return self.keys + self.values + self.filler + (self.keys * self.values if self.binding == "fused" else 0)

    @property
    def write_block(self) -> int:
        return self.pairs if self.binding == "fused" else 2 * self.pairs

    @property
    def read_block(self) -> int:
        return 2 * self.pairs

    def chance(self) -> float:
        return 1.0 / self.values

    def _fill(self, rng, batch, length, write_at, read_at):
        """Tokens ``(batch, length + 1)``, weights ``(batch, length)`` and probe distances ``(batch, pairs)``."""
        m, K, V, F = self.pairs, self.keys, self.values, self.filler
        x = rng.integers(K + V, K + V + F, (batch, length + 1))                   # filler
        keys = np.argsort(rng.random((batch, K)), axis=1)[:, :m]                 # distinct keys per row
        vals = rng.integers(0, V, (batch, m))
        order = np.argsort(rng.random((batch, m)), axis=1)                      # read slot i holds pair order[i]
        rows, i = np.arange(batch)[:, None], np.arange(m)[None]
        if self.binding == "fused":
            x[rows, write_at[:, None] + i] = K + V + F + keys * V + vals          # w_(k, v)
            written = write_at[:, None] + order                                  # where read slot i's key was
        else:
            x[rows, write_at[:, None] + 2 * i] = keys
            x[rows, write_at[:, None] + 2 * i + 1] = K + vals
            written = write_at[:, None] + 2 * order
        x[rows, read_at[:, None] + 2 * i] = np.take_along_axis(keys, order, 1)
        x[rows, read_at[:, None] + 2 * i + 1] = K + np.take_along_axis(vals, order, 1)
        weights = np.zeros((batch, length), np.float32)
        weights[rows, read_at[:, None] + 2 * i] = 1.0                           # the read key predicts its value
        return x, weights, (read_at[:, None] + 2 * i) - written

    def sample(self, rng: np.random.Generator, batch: int, length: int):
        """``(inputs, targets, weights)`` with both blocks at random places (write before read)."""
        w, r = self.write_block, self.read_block
        room = length + 1 - w - r                                               # filler tokens
        if room < 0:
            raise ValueError(f"length {length} cannot hold a write block of {w} and a read block of {r}")
        gap = rng.integers(0, room + 1, batch)                                  # filler between the blocks
        write_at = (rng.random(batch) * (room - gap + 1)).astype(np.int64)
        x, weights, _ = self._fill(rng, batch, length, write_at, write_at + w + gap)
        return x[:, :-1], x[:, 1:], weights

    def sample_at(self, rng: np.random.Generator, batch: int, length: int, offset: int):
        """``(inputs, targets, weights, distances)``: the read block ends the sequence (its last value is
        the final target) and starts ``offset`` after the write block's start; ``distances`` ``(batch, pairs)``."""
        w, r = self.write_block, self.read_block
        if offset < w or offset + r > length + 1:
            raise ValueError(f"offset must be in [{w}, {length + 1 - r}] for length {length}, got {offset}")
        read_at = np.full(batch, length + 1 - r)                                 # last value = last symbol
        x, weights, dist = self._fill(rng, batch, length, read_at - offset, read_at)
        return x[:, :-1], x[:, 1:], weights, dist

    def max_offset(self, train_length: int) -> int:
        """The largest offset ``sample`` gives at ``train_length``: farther ones are never seen in training."""
        return train_length + 1 - self.read_block

    def offsets(self, length: int, train_length: int) -> list[int]:
        """The evaluation offsets at ``length``: ``train_length / 4`` doubling up, then the farthest."""
        w, far = self.write_block, length + 1 - self.read_block
        out, d = [], max(w, train_length // 4)
        while d <= far:
            out.append(d)
            d *= 2
        if far >= w and far not in out:
            out.append(far)
        return out


class TextSource:
    """Real text, one symbol a token: a corpus of ``lab.corpus`` (``path=None``; ``kind`` ``"text"``:
    SymPy 1.14.0's source as bytes, every tenth file held out; ``"prose"``: Jane Austen's novels as
    bytes, the last tenth of each held out) or a UTF-8 file's characters (the first 90% train).
    ``alphabet[i]`` is the symbol of token ``i`` (a byte of the corpus, a character of a file)."""

    def __init__(self, path=None, *, holdout: float = 0.1, kind: str = "text"):
        if kind not in corpus.CORPORA:
            raise ValueError(f"kind must be one of {', '.join(corpus.CORPORA)}, got {kind!r}")
        if path is not None and kind != "text":
            raise ValueError(f"a text file is the task 'text' (character level); the task {kind!r} reads its own corpus")
        self.kind = kind
        self.path = None if path is None else str(path)
        if path is None:
            source = corpus.CORPORA[kind]
            data = source["load"]()
            counts = np.bincount(data["train"], minlength=256) + np.bincount(data["heldout"], minlength=256)
            symbols = np.flatnonzero(counts)                            # the bytes that occur, ascending
            lookup = np.zeros(256, np.int32)
            lookup[symbols] = np.arange(len(symbols), dtype=np.int32)
            self.train, self.heldout = lookup[data["train"]], lookup[data["heldout"]]
            self.origin = {"corpus": source["origin"], "kind": source["kind"], "package": source["package"],
                           "version": source["version"], "sha256": data["sha256"], "files": data["files"]}
            self.vocab, self.alphabet = len(symbols), bytes(symbols.tolist())
        else:
            data = safe_io.read_bytes(path)                             # a regular file, within the size cap
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as err:
                raise ValueError(f"{path}: is not UTF-8 text (byte {err.start}: {data[err.start:err.start + 1]!r})") from None
            if len(text) < 64:
                raise ValueError(f"{path}: need at least 64 characters of text, got {len(text)}")
            chars = sorted(set(text))
            lookup = {c: i for i, c in enumerate(chars)}
            ids = np.fromiter((lookup[c] for c in text), np.int32, len(text))
            cut = int(len(ids) * (1 - holdout))
            self.train, self.heldout = ids[:cut], ids[cut:]
            self.origin, self.vocab, self.alphabet = None, len(chars), "".join(chars)
        self.symbols = len(self.train) + len(self.heldout)

    def config(self) -> dict:
        return {"name": self.kind, "path": self.path, "origin": self.origin, "symbols": self.symbols,
                "vocab": self.vocab}

    @property
    def vocab_size(self) -> int:
        return self.vocab

    def fits(self, length: int, split: str = "heldout") -> bool:
        return len(getattr(self, split)) >= length + 1

    def sample(self, rng: np.random.Generator, batch: int, length: int, split: str = "train"):
        """``(inputs, targets, None)``: ``batch`` windows of ``length + 1`` symbols at random starts."""
        data = getattr(self, split)
        if len(data) < length + 1:
            raise ValueError(f"the {split} text ({len(data)} symbols) is shorter than {length + 1}")
        starts = rng.integers(0, len(data) - length, batch)
        x = data[starts[:, None] + np.arange(length + 1)[None]].astype(np.int64)
        return x[:, :-1], x[:, 1:], None


def make_task(config: dict):
    """A task from its ``config()`` dict (what a record stores)."""
    config = dict(config)
    name = config.pop("name")
    if name == "markov":
        config["seed"] = config.pop("source_seed")
        return MarkovSource(**config)
    if name == "retrieval":
        return KeyValueRecall(**config)
    if name in ("text", "prose"):
        return TextSource(config.get("path"), kind=name)
    raise ValueError(f"unknown task {name!r}")

