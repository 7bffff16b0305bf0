"""Keys and values shared across layers: Gemma 3n, and Gemma 4's E2B and E4B (``num_kv_shared_layers``).

The last ``num_kv_shared_layers`` decoder layers of these models compute no keys or values: each
attends with those of the last earlier layer of its own type (sliding or full), the layer's
*source*. Its query is its own (its projection, its q norm, RoPE at its position); the keys are
the source's as they left step 4 of its call -- projected from the *source's* input, normed and
rotated at the source's positions, behind the source's cache::

    q_i = R(i) norm(x_i W_q)                        # this layer's input x, as any layer
    k_j, v_j = the source layer's keys and values   # from the source's input, rotated at j
    softmax(q_i . k_j * scale + mask(i, j)) v_j     # this layer's mask: causal, its own window

So the position machinery of a shared layer is split between two layers: its keys carry the
source's rotation, its queries its own. Both belong to one layer type, so the RoPE (base,
scaling) is the same and ``q_i . k_j`` depends on ``j - i`` as in any RoPE layer. The window is
the shared layer's (the same as its source's: one type).

How it runs here: ``SharedKVAttention`` is ``QKNormAttention`` without ``wk``, ``wv`` (their biases)
and ``k_norm``; its cache is its source's. Call the source first, with a cache, then the shared
layer on the same tokens with that cache::

    cache = layers[j].new_cache()
    y_j = layers[j](x_j, positions=p, causal=True, cache=cache)    # fills the cache
    y_i = layers[i](x_i, positions=p, causal=True, cache=cache)    # reads it; adds nothing

The shared layer never changes the cache. Its queries' positions default to the cache's last T
positions, and must be those (the tokens the source just stored), so that each query finds its
own key. In a decoding step the same holds: the source extends its cache, then every shared
layer reads it. A rolling cache must then keep the whole window, ``mem_len >= sliding_window + T - 1`` for
calls of T tokens (not the ``W - 1`` a windowed layer alone needs: the shared layer reads the cache after the source's call, while HF
hands it the keys before its sliding cache is cut); a cache that has forgotten keys the queries attend
raises. This mirrors transformers 5.24 (``Gemma3nTextAttention``, ``Gemma4TextAttention``:
the "store" layer puts its keys and values after its cache update into ``shared_kv_states``,
the "reuse" layers take them; ``kv_sharing_modes`` in the config classes says which is which).

``backward`` returns the gradients of ``x`` (through the query), ``wq``, ``bq``, ``q_norm``,
``wo``, ``bo``: the shared keys and values are constants here, as any cache's are. (Training a
model with shared layers adds their gradients with respect to the source's keys and values to the
source's; minipos's layers do not return those.)
"""

from __future__ import annotations

import numpy as np

from ._checks import check_int
from .cache import KVCache
from .masks import check_mask
from .mla import rms_norm_backward
from .qk_norm import QKNormAttention
from .streaming import StreamingCache

__all__ = ["SharedKVAttention"]

_OWN = ("wk", "wv", "bk", "bv", "k_norm")
"""The weights a shared layer does not have: its keys and values are its source's."""


class SharedKVAttention(QKNormAttention):
    """A layer that attends with the keys and values of an earlier layer (module docstring).

    Takes ``QKNormAttention``'s arguments and ``kv_source``, the index of the layer whose cache it reads
    (shown by ``repr`` and ``minipos.config``'s table; the cache passed is what counts). ``num_kv_heads``
    and ``head_dim`` must be the source's. Weights: ``wq``, ``bq``, ``q_norm``, ``wo``, ``bo`` (and a
    gate's, if any); ``wk``, ``wv``, ``bk``, ``bv`` and ``k_norm`` are ``None``. ``cache`` is required:
    the source's ``KVCache`` after its call on the same tokens.
    """

    def __init__(self, d_model: int, num_heads: int, *, kv_source: int, **kwargs):
        self.kv_source = check_int(kv_source, "kv_source", minimum=0)
        super().__init__(d_model, num_heads, **kwargs)

    def _init_weights(self, rng, bias):
        super()._init_weights(rng, bias)
        for name in _OWN:
            setattr(self, name, None)

    def _weight_shapes(self) -> dict:
        return {name: shape for name, shape in super()._weight_shapes().items() if name not in _OWN}

    def configuration(self) -> tuple:
        return (*super().configuration(), ("kv_source", self.kv_source))

    # -- the keys are the source's: step 2 makes queries only, step 4 reads the source's cache

    def _project(self, x_in):
        q = self._heads(x_in, self.wq, self.bq, self.num_heads)                 # (B, H, T, D)
        return self._norm(q, self.q_norm), None, None

    def _project_backward(self, x_in, dq, dk, dv, add):  # the query's path only: dk, dv are empty
        if self.q_norm is not None:
            q = self._heads(x_in, self.wq, self.bq, self.num_heads)
            dq, dw = rms_norm_backward(q, self.q_norm + self.norm_offset, dq, eps=self.norm_eps)
            add("q_norm", dw)
        B, T, _ = x_in.shape
        d2 = dq.transpose(0, 2, 1, 3).reshape(B, T, -1)                         # (B, T, H*D)
        add("wq", x_in.reshape(B * T, -1).T @ d2.reshape(B * T, -1))
        if self.bq is not None:
            add("bq", d2.sum(axis=(0, 1)))
        return d2 @ self.wq.T

    def _key_positions(self, positions, cache):  # every key is the source's; a copy: a later commit rewrites them
        k_pos = cache.positions.copy()
        return k_pos, k_pos

    def _cached(self, k, v, positions, cache, tag):
        if cache.tag != tag:                                                    # another RoPE, or none
            raise ValueError(f"the cache holds keys rotated by another map than this layer's scheme {self.scheme!r} "
                             f"(other RoPE frequencies, scaling or layout, or none): the source layer "
                             f"({self.kv_source}) must have this layer's scheme")
        return cache.k, cache.v                                                 # (B, KV, S, D)

    def _commit(self, cache, T, tag):
        pass                                                                    # the source's cache, unchanged

    def _check_cache(self, cache) -> None:
        if not isinstance(cache, KVCache):
            raise TypeError(f"cache must be the KVCache of layer {self.kv_source} (the source of this layer's keys "
                            f"and values), got {type(cache).__name__}")
        if cache._owner is not None and cache._owner() is self:
            raise ValueError("cache belongs to this layer; pass the cache of its source layer "
                             f"({self.kv_source}) after that layer's call")
        if cache.length == 0:
            raise ValueError(f"cache is empty: call the source layer ({self.kv_source}) with it on these tokens first")
        widths = (cache.k.shape[-1], cache.v.shape[-1])                         # keys, values
        if cache.k.shape[1] != self.num_kv_heads or widths != (self.head_dim, self.head_dim):
            raise ValueError(f"cache holds {cache.k.shape[1]} key heads of width {widths[0]} (values {widths[1]}); "
                             f"this layer takes num_kv_heads={self.num_kv_heads} of head_dim={self.head_dim} "
                             "(its source's)")

    def _check_memory(self, cache, T) -> None:
        """Refuse a cache that forgot keys this call's queries attend to: its source attended them before the cache
        dropped them (``mem_len``; a ``StreamingCache``'s eviction). HF hands the shared layers the keys before its
        sliding cache is cut, so only the keys before the window may be gone."""
        if isinstance(cache, StreamingCache) and cache.total > cache.length:
            raise ValueError("cache is a StreamingCache that has evicted keys (and moved the rest to new positions) "
                             f"after its source layer's ({self.kv_source}) call: a shared layer reads the keys as "
                             "the source attended them; give the source a KVCache")
        if not T or cache.seen == cache.length:
            return                                                              # nothing forgotten
        W, first = self.sliding_window, cache.positions[cache.length - T]     # the first query's position
        if W is not None and cache.positions[0] <= first - W + 1:
            return                                                              # only keys before the window are gone
        keep = "None" if W is None else f"None or at least sliding_window + T - 1 = {W + T - 1}"
        raise ValueError(f"cache has forgotten keys (mem_len={cache.mem_len}) that its source layer "
                         f"({self.kv_source}) attended to in its call and that this call's queries attend to: give "
                         f"the source a cache of mem_len={keep}")

    def _check_call(self, x, positions, mask, causal, cache, return_weights):
        if cache is None:
            raise ValueError(f"this layer attends with the keys and values of layer {self.kv_source}: pass cache=, "
                             "that layer's KVCache after its call on the same tokens")
        self._check_cache(cache)
        given = positions
        x, positions, _, causal = super()._check_call(x, positions, None, causal, None, return_weights)
        B, T, _ = x.shape
        if positions.ndim != 1:
            raise ValueError(f"positions must have shape (T,) = ({T},) for a layer with shared keys, got "
                             f"{positions.shape}")
        last = cache.positions[cache.length - T:] if cache.length >= T else None
        if given is None and last is not None:
            positions = last.copy()                                             # the tokens the source just stored
        if last is None or not np.array_equal(positions, last):
            kept = "" if cache.mem_len is None else f" of mem_len={cache.mem_len}"
            raise ValueError(f"positions must be the cache's last T = {T} positions (the tokens its source layer "
                             f"{self.kv_source} stored last; the cache{kept} holds {cache.length}), got "
                             f"{positions.tolist()}")
        if B != cache.k.shape[0]:
            raise ValueError(f"x has batch {B}, the cache {cache.k.shape[0]}")
        self._check_memory(cache, T)
        return x, positions, check_mask(mask, B, T, cache.length, self.num_heads), causal

    def __repr__(self) -> str:
        return f"SharedKVAttention(kv_source={self.kv_source}, " + super().__repr__().split("(", 1)[1]
