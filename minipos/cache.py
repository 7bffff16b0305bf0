"""The KV cache: the keys and values of the tokens a layer has seen, for incremental decoding.

The cache stores keys *after* the rotate seam, values, and the key positions; it changes only
once a layer call has succeeded (``extend`` lays the new keys beside the cached ones, ``commit``
makes them part of the cache). ``minipos.streaming.StreamingCache`` evicts to sinks and a window.
"""

from __future__ import annotations

import numpy as np

from ._checks import as_float_array, as_positions, check_alloc, check_int

__all__ = ["KVCache"]


class KVCache:
    """Keys (after the rotate seam), values and key positions of the tokens seen so far.

    ``k``, ``v`` are ``(B, H, S, D)`` views of preallocated buffers that double when full, so a
    decoding step appends in O(1) amortised and costs O(S) only in attention itself.
    ``mem_len`` (Transformer-XL's memory length) keeps at most that many keys from earlier calls:
    a call attends to the last ``mem_len`` cached keys plus its own, then becomes the memory of
    the next (``new_mems = cat(mems, hids)[-mem_len:]`` in the reference). ``None`` keeps all.

    A cache belongs to the layer that made it (``layer.new_cache()``; a bare ``KVCache()`` is
    claimed by the first layer that fills it), and a layer call changes it only once it has
    succeeded: ``extend`` lays the new keys beside the cached ones without changing the cache,
    ``commit`` then makes them part of it.
    """

    def __init__(self, mem_len: int | None = None):
        self.mem_len = None if mem_len is None else check_int(mem_len, "mem_len", minimum=0)
        self._k = self._v = None
        self._pos = np.zeros(0, dtype=np.int64)
        self.length = 0  # keys held now
        self.seen = 0    # tokens appended in all (default positions continue from here)
        self.tag = None
        self._owner = None

    @property
    def k(self):
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def v(self):
        return None if self._v is None else self._v[:, :, : self.length]

    @property
    def positions(self):
        return self._pos[: self.length]

    def extend(self, k, v, positions, *, tag=None):
        """All ``(k, v, positions)`` with ``k``, ``v`` ``(B, H, T, D)`` at ``positions`` ``(T,)``
        appended, as ``(B, H, S, D)`` views; the cache itself is unchanged until ``commit(T, tag)``.

        ``tag`` is what the keys were computed with besides their positions (e.g. RoPE
        frequencies); keys with a tag different from the cached keys' raise ``ValueError``.
        """
        k, v = as_float_array(k, "k"), as_float_array(v, "v")
        if k.ndim != 4 or v.ndim != 4 or k.shape[:3] != v.shape[:3]:
            raise ValueError(f"k and v must have shapes (B, H, T, D) and (B, H, T, Dv) with the same B, H, T; "
                             f"got k {k.shape}, v {v.shape}")
        B, H, T, D = k.shape
        positions = as_positions(positions, "positions", length=T)
        if self.length and tag != self.tag:
            raise ValueError("cache holds keys computed with other scheme parameters (e.g. RoPE "
                             "frequencies) than this step's; start a new cache instead of mixing them")
        if self._k is not None and (self._k.shape[:2] != (B, H) or self._k.shape[3] != D
                                    or self._v.shape[3] != v.shape[3]):
            raise ValueError(f"cache holds keys (B, H, S, D) = {self._k.shape[:2]} + (S, {self._k.shape[3]}) and "
                             f"values with Dv = {self._v.shape[3]}; cannot append k {k.shape}, v {v.shape}")
        need = self.length + T
        if self._k is None or need > self._k.shape[2]:
            self._grow(max(need, 2 * (0 if self._k is None else self._k.shape[2]), 16), k, v)
        self._k[:, :, self.length:need] = k            # beyond the held length: not yet in the cache
        self._v[:, :, self.length:need] = v
        self._pos[self.length:need] = positions
        return self._k[:, :, :need], self._v[:, :, :need], self._pos[:need]

    def commit(self, count: int, tag=None) -> None:
        """Make the ``count`` entries laid by the last ``extend`` part of the cache, then keep only
        the last ``mem_len`` (the memory carried into the next call). The new buffers are made
        before the cache changes, so a commit that fails leaves it as it was."""
        length = self.length + count
        if self.mem_len is not None and length > self.mem_len:
            drop, keep = length - self.mem_len, self.mem_len
            new_k, new_v = np.zeros_like(self._k), np.zeros_like(self._v)   # new buffers: the call's context
            new_k[:, :, :keep] = self._k[:, :, drop:length]                 # still views the old ones
            new_v[:, :, :keep] = self._v[:, :, drop:length]
            self._k, self._v = new_k, new_v                                 # nothing fails from here on
            self._pos[:keep] = self._pos[drop:length].copy()
            length = keep
        self.length = length
        self.seen += count
        self.tag = tag

    def append(self, k, v, positions, *, tag=None):
        """``extend`` then ``commit``: add the keys and values; return all ``(k, v, positions)``."""
        k_all, v_all, pos_all = self.extend(k, v, positions, tag=tag)
        held = len(pos_all)
        self.commit(len(pos_all) - self.length, tag)
        return (k_all, v_all, pos_all) if self.length == held else (self.k, self.v, self.positions)

    def _grow(self, capacity, k, v):
        B, H, _, D = k.shape
        check_alloc((B, H, capacity, max(D, v.shape[-1])), np.result_type(k.dtype, v.dtype), "the KV cache")
        dtype = np.result_type(k.dtype, v.dtype)
        new_k = np.zeros((B, H, capacity, D), dtype)
        new_v = np.zeros((B, H, capacity, v.shape[-1]), dtype)
        new_pos = np.zeros(capacity, np.int64)
        if self._k is not None:
            new_k[:, :, : self.length], new_v[:, :, : self.length] = self.k, self.v
            new_pos[: self.length] = self.positions
        self._k, self._v, self._pos = new_k, new_v, new_pos
