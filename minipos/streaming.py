"""StreamingLLM's cache: attention sinks plus a rolling window, positions counted within the cache.

Xiao et al. 2023, "Efficient Streaming Language Models with Attention Sinks" (arXiv:2309.17453,
§3.2). A decoding step attends to the first ``num_sinks`` tokens of the stream (the "attention
sinks": the model parks attention there, and evicting them breaks it) and to the most recent
``window`` tokens, its own included. Positions are assigned *within the cache*, not in the text:
with sinks ``[0, 1, 2, 3]`` and recent tokens ``[6, 7, 8]`` cached, they sit at positions
``0 … 6`` and the query decoding token 9 at position 7. With RoPE this means a cached key is
rotated by its index in the cache, which changes whenever older tokens are evicted.

``StreamingCache`` keeps rotated keys and re-rotates the recent ones when they move down
(``k' = R(new) R(old)^T k``, exact for RoPE with an attention factor of 1). A bias scheme (ALiBi,
T5) or NoPE needs no re-rotation: their logits are computed from the key positions, which are
the cache indices. Default query positions continue from the cache length. Every step equals a
fresh forward pass over the kept tokens followed by the new ones, at positions ``0, 1, …``
(``tests/test_streaming.py``).

These are the learned-free sinks of StreamingLLM (kept tokens); gpt-oss's learned per-head sink
logit is ``MultiHeadAttention(..., sinks=True)``. Docs: ``docs/local-global.md``.
"""

from __future__ import annotations

import weakref

import numpy as np

from ._checks import as_positions, check_int, check_positive_int
from .cache import KVCache
from .layer import MultiHeadAttention
from .rope_scaling import Rotary

__all__ = ["StreamingCache"]


class StreamingCache(KVCache):
    """The KV cache of StreamingLLM for ``layer``: the first ``num_sinks`` tokens and the last
    ``window`` tokens of the stream, positions ``0 … num_sinks + window - 1`` within the cache.

    A one-token step attends to at most ``num_sinks + window`` keys (its own is the last of the
    window), so ``num_sinks + window - 1`` are kept between calls: the first ``num_sinks`` tokens
    of the stream and its last ``window - 1`` (none with ``window=1``: a step then sees the sinks
    and itself). A chunk of ``T`` tokens, longer than the window or not, attends to the kept keys
    and all of its own (under ``causal``), as a fresh pass over the kept tokens then the chunk
    would; then the same eviction keeps the sinks and the stream's last ``window - 1`` tokens,
    which may all come from the chunk. The cache changes only once a call has succeeded. Calls
    must leave ``positions`` to the default (the cache length onwards).
    ``total`` counts the tokens appended in all; ``seen`` equals ``length``, so default
    positions continue from the cache length. ``layer``'s scheme must be NoPE, a bias or
    content-position scheme, or ``Rotary`` with fixed frequencies and attention factor 1.
    """

    def __init__(self, layer: MultiHeadAttention, *, num_sinks: int = 4, window: int = 1020):
        if not isinstance(layer, MultiHeadAttention):
            raise TypeError(f"layer must be a MultiHeadAttention, got {type(layer).__name__}")
        super().__init__(mem_len=None)
        self.num_sinks = check_int(num_sinks, "num_sinks", minimum=0)
        self.window = check_positive_int(window, "window")
        sc = layer.scheme
        if "rotate" in sc.seams and not (type(sc) is Rotary and not sc.rotates_cached_keys
                                         and sc.attention_factor == 1.0):
            raise ValueError(f"StreamingCache re-rotates kept keys as RoPE with fixed frequencies and attention "
                             f"factor 1; {sc!r} is not such a scheme")
        if "input" in sc.seams:
            raise ValueError(f"StreamingCache moves keys to new positions, but {sc!r} added the old positions to "
                             "the values and keys before the projections")
        self._owner = weakref.ref(layer)
        self.total = 0

    def extend(self, k, v, positions, *, tag=None):
        positions = as_positions(positions, "positions", allow_negative=True)
        expected = np.arange(self.length, self.length + len(positions))
        if not np.array_equal(positions, expected):
            raise ValueError(f"a StreamingCache assigns positions within the cache: call the layer without "
                             f"positions (they are {expected.tolist()} here)")
        return super().extend(k, v, positions, tag=tag)

    def commit(self, count: int, tag=None) -> None:
        """Take the last call's keys in, then keep the sinks and the last ``window - 1`` keys,
        moved down to follow the sinks (re-rotated to their new positions). Everything is computed
        before the cache changes, so a commit that fails leaves it as it was."""
        length, keep = self.length + count, self.num_sinks + self.window - 1
        if length > keep:
            drop, s = length - keep, self.num_sinks
            old = np.arange(s + drop, length)                               # the recent keys' positions
            new = old - drop                                                 # ... after the eviction
            new_k, new_v = self._k.copy(), self._v.copy()                  # the call's context views the old
            new_k[:, :, s:keep] = self._moved(self._k[:, :, s + drop:length], old, new)
            new_v[:, :, s:keep] = self._v[:, :, s + drop:length]
            self._k, self._v = new_k, new_v                                 # nothing fails from here on
            self._pos[:keep] = np.arange(keep)
            length = keep
        self.length = self.seen = length
        self.total += count
        self.tag = tag

    def _moved(self, k, old, new):
        """Keys rotated at positions ``old`` re-rotated to ``new``: ``R(new) R(old)^T k`` (B, KV, n, D);
        none to move with ``window=1``."""
        sc = self._owner().scheme
        if "rotate" not in sc.seams or not len(old):
            return k.copy()
        raw = sc.rotate_k_backward(k, old, seq_len=int(old[-1]) + 1)         # R(old)^T k: the unrotated key
        return sc.rotate_k(raw, new, seq_len=int(old[-1]) + 1)

    def __repr__(self) -> str:
        return f"StreamingCache(num_sinks={self.num_sinks}, window={self.window}, length={self.length})"
