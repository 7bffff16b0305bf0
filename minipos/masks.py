"""The masks of a layer call, by position: causal, a sliding window, chunks, and key padding.

Each rule reads positions, not cache slots (``True`` = may attend):

    causal          j <= i                     (under ``causal=True``)
    sliding window  i - W < j <= i             (Mistral, Gemma, gpt-oss: ``minipos.local_global``)
    chunks          i // C == j // C           (Llama 4's chunked layers: ``minipos.irope``)

for the query at position ``i`` and the key at position ``j``. ``block_mask_fn`` combines them with
a padding mask for one block of queries and keys at a time: the layer's mask, which the reference
``MultiHeadAttention`` and ``minipos.fast``'s both run; ``check_mask`` checks the mask a call passes.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ._checks import as_positions, check_span

__all__ = ["sliding_window_mask", "chunk_mask", "check_mask", "block_mask_fn"]


def sliding_window_mask(q_positions: ArrayLike, k_positions: ArrayLike, window: int) -> np.ndarray:
    """Boolean ``(T, S)``: query ``t`` may attend key ``s`` iff ``q_t - window < k_s <= q_t``.

    q_positions: ``(T,)``, k_positions: ``(S,)`` integer positions; window: ``W >= 1``, the number
    of positions a query sees, its own included (HF ``config.sliding_window``), at most ``2**62``
    (positions are below it; ``ValueError`` beyond, as the layer's ``sliding_window``).
    """
    q = as_positions(q_positions, "q_positions")
    k = as_positions(k_positions, "k_positions")
    window = check_span(window, "window")
    return _window(q, k, window)


def chunk_mask(q_positions: ArrayLike, k_positions: ArrayLike, chunk: int) -> np.ndarray:
    """Chunked attention's rule ``(T, S)`` bool: query at ``i`` may see key at ``j`` iff ``i // C == j // C``.

    Not causal by itself: the layer ANDs it with the causal and padding masks, as HF's
    ``chunked_overlay`` is ANDed with ``causal_mask_function``. chunk: ``C`` in ``[1, 2**62]``, as
    the layer's ``attention_chunk`` (``ValueError`` beyond).
    """
    chunk = check_span(chunk, "chunk")
    return _chunks(as_positions(q_positions, "q_positions"), as_positions(k_positions, "k_positions"), chunk)


def check_mask(mask, B: int, T: int, S: int, H: int | None = None):
    """A layer call's ``mask`` ``(B, S)``, ``(B, T, S)`` or, with ``H`` query heads, ``(B, H, T, S)`` (one per
    head: MiniMax M3's block-sparse layers) (``True`` = may attend) as ``(B, 1, 1, S)``, ``(B, 1, T, S)`` or
    ``(B, H, T, S)``, or ``None``; ``TypeError`` / ``ValueError`` naming the expected shapes."""
    if mask is None:
        return None
    mask = np.asarray(mask)
    if mask.dtype != bool:
        raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
    if mask.shape == (B, S):
        return mask[:, None, None, :]
    if mask.shape == (B, T, S):
        return mask[:, None]
    if H is not None and mask.shape == (B, H, T, S):
        return mask
    heads = "" if H is None else f" or (B, H, T, S) = {(B, H, T, S)}"
    raise ValueError(f"mask must have shape (B, S) = {(B, S)} or (B, T, S) = {(B, T, S)}{heads}, got {mask.shape}")


def block_mask_fn(mask: ArrayLike | None, causal: bool, q_positions: ArrayLike, k_positions: ArrayLike, *,
                  window: int | None = None, chunk: int | None = None):
    """``allowed(q_slice, k_slice)``: the boolean mask of one block, ``(1, 1, tq, tk)``,
    ``(B, 1, tq, tk)`` or ``(B, H, tq, tk)``, or ``None`` where every key is allowed.

    The layer's checked arguments: mask ``(B, 1, 1, S)``, ``(B, 1, T, S)`` or ``(B, H, T, S)`` (or
    ``None``, ``check_mask``), positions ``(T,)`` and ``(S,)``; ``window`` (which implies causal) and ``chunk`` as
    the layer's ``sliding_window`` and ``attention_chunk``.
    """
    def allowed(qs, ks):
        i, j = q_positions[qs], k_positions[ks]
        rule = (j[None, :] <= i[:, None])[None, None] if causal else None      # (1, 1, tq, tk)
        if window is not None:                                                 # i - W < j <= i
            rule = _window(i, j, window)[None, None]
        if chunk is not None:                                                  # i // C == j // C
            same = _chunks(i, j, chunk)[None, None]
            rule = same if rule is None else rule & same
        pad = None if mask is None else mask[..., qs if mask.shape[2] > 1 else slice(None), ks]
        return pad if rule is None else rule if pad is None else rule & pad
    return allowed


def _window(q, k, window):  # checked positions (T,), (S,) -> (T, S)
    gap = q[:, None] - k[None, :]                                        # i - j
    return (gap >= 0) & (gap < window)                                  # 0 <= i - j < W


def _chunks(q, k, chunk):  # checked positions (T,), (S,) -> (T, S)
    return q[:, None] // chunk == k[None, :] // chunk                  # i // C == j // C
