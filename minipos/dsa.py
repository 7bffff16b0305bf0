r"""DeepSeek Sparse Attention's indexer (DeepSeek-V3.2): its RoPE layout, its scores and its top-k keys.

Source: DeepSeek-AI 2025, the DeepSeek-V3.2-Exp technical report, §1 (DeepSeek Sparse Attention: the
lightning indexer, Eq. 1, and the top-k token selection); the code minipos matches is transformers 5.24's
``DeepseekV32Indexer`` (``modeling_deepseek_v32.py``). Beside MLA (``minipos.mla``), each layer has an
indexer that scores every (query, key) pair cheaply and keeps the ``index_topk`` best keys per query;
the main attention then attends to those only:

    q   = heads(c_q W_q^I)             (B, S, H_I, D_I)   c_q = RMSNorm(x W_q_a), MLA's query latent
    k   = LayerNorm(x W_k^I)           (B, T, D_I)        one key per token, shared by the heads
    q, k = RoPE on the FIRST D_R features, half layout (rotate_half); the last D_I - D_R pass through
    I[s, t] = Σ_h w[s, h] · ReLU(q[s, h] · k[t] / sqrt(D_I)),    w = x W_w / sqrt(H_I)
    keep    = the top-k t of I[s, :] among the keys the mask allows

Two layouts in one layer. MLA rotates the LAST D_R features of each head, in DeepSeek's interleaved
pairs (2i, 2i + 1) (HF ``rope_interleave=True``, ``apply_rotary_pos_emb_interleave``); the indexer
rotates the FIRST D_R features in the half layout, pairs (i, i + D_R/2) (HF ``apply_rotary_pos_emb``,
the comment "The indexer uses NON-interleaved (half-split) RoPE — unlike the main MLA attention").
Both read the same cos and sin (θ_i = base^(-2i/D_R), the rotary embedding's ``head_dim`` pointed at
``qk_rope_head_dim``). GLM-MoE-DSA (GLM-5, HF ``GlmMoeDsaIndexer``: "the indexer applies **interleaved**
RoPE rather than the non-interleaved half-split RoPE used by DeepSeek-V3.2") keeps the indexer on the
first D_R features but in the interleaved layout: ``layout="interleaved"`` below. The two agree up to a fixed permutation of features (``proofs.dsa``), so a
port that uses one for both gets each score right only if it also permutes the weights; the
indexer's scores and its top-k depend on the layout otherwise.

Not modelled: the reference's Hadamard transform of q and k (orthogonal: it changes no dot
product) and its FP8 scoring; the key's LayerNorm is a norm, not position machinery (``index_scores``
takes the rotated q and k; the tests copy HF's weights and replace the norm by the identity).

MiniMax M3's block-sparse layers pick key *blocks* instead (HF ``MiniMaxM3VLIndexer``): per key/value-head group,
the ``index_topk_blocks`` blocks of ``index_block_size`` keys with the highest max-pooled score, the blocks up to
the query's own always among them. ``block_picks`` computes them from the indexer's normed and rotated q and k,
``block_mask`` turns them into the layer's per-head mask ``(B, H, T, S)`` (the layer is the same as the model's
full-attention layers); the indexer's projections and norms are the caller's, as for DeepSeek's.

Conventions: q ``(B, S, H, D)`` and k ``(B, T, D)`` as HF holds them (heads after the sequence);
positions ``(S,)``/``(T,)`` integers; a mask is boolean ``(S, T)`` or ``(B, S, T)``, True = may attend.
Angles and scores in float64 for float64 inputs.
"""

from __future__ import annotations

import numpy as np

from ._checks import as_float_array, check_int, check_ndim, check_positive_int
from .rope import apply_rope, apply_rope_backward

__all__ = ["indexer_rope", "indexer_rope_backward", "mla_rope", "index_scores", "index_topk", "block_picks",
           "block_mask"]


def _rope_dim(rope_dim, D: int, name: str) -> int:
    R = check_positive_int(rope_dim, "rope_dim")
    if R % 2 or R > D:
        raise ValueError(f"rope_dim must be even and <= the head dim D = {D} of {name}, got {R}")
    return R


def _layout(layout) -> str:
    if not isinstance(layout, str) or layout not in ("half", "interleaved"):
        raise ValueError(f"layout must be 'half' (DeepSeek-V3.2's indexer) or 'interleaved' (GLM-MoE-DSA's), "
                         f"got {layout!r}")
    return layout


def indexer_rope(x, positions, *, rope_dim: int, base: float = 10000.0, inv_freq=None,
                 attention_factor: float = 1.0, layout: str = "half") -> np.ndarray:
    """The indexer's RoPE: the first ``rope_dim`` features of ``x`` ``(..., T, D)`` rotated, in the half
    layout (DeepSeek-V3.2) or the interleaved one (``layout="interleaved"``, GLM-MoE-DSA).

    = ``apply_rope(x, positions, layout=layout, rotary_dim=rope_dim)``; the last D - D_R features pass
    through. inv_freq ``(D_R/2,)`` replaces ``base^(-2i/D_R)`` (a scaled ``rope_parameters``), and
    ``attention_factor`` multiplies cos and sin (YaRN's, as HF's rotary embedding gives both attentions).
    HF's interleaved indexer returns the rotated slice de-interleaved (``mla_rope`` says how); q and k
    alike, so no score changes; this keeps the input's order.
    """
    layout = _layout(layout)
    x = as_float_array(x, "x")
    check_ndim(x, "x", 2, "(..., T, D)")
    R = _rope_dim(rope_dim, x.shape[-1], "x")
    return apply_rope(x, positions, base=base, inv_freq=inv_freq, layout=layout, rotary_dim=R,
                      attention_factor=attention_factor)


def indexer_rope_backward(dy, positions, *, rope_dim: int, base: float = 10000.0, inv_freq=None,
                          attention_factor: float = 1.0, layout: str = "half") -> np.ndarray:
    """The gradient of ``indexer_rope`` for ``dy`` ``(..., T, D)``: ``R^T`` on the first ``rope_dim`` features."""
    layout = _layout(layout)
    dy = as_float_array(dy, "dy")
    check_ndim(dy, "dy", 2, "(..., T, D)")
    R = _rope_dim(rope_dim, dy.shape[-1], "dy")
    return apply_rope_backward(dy, positions, base=base, inv_freq=inv_freq, layout=layout, rotary_dim=R,
                               attention_factor=attention_factor)


def mla_rope(x, positions, *, rope_dim: int, base: float = 10000.0, inv_freq=None) -> np.ndarray:
    """MLA's RoPE, for contrast: the LAST ``rope_dim`` features of ``x`` ``(..., T, D)`` rotated in the
    interleaved layout (pairs (2i, 2i + 1)); the first D - D_R pass through (``minipos.mla.DecoupledRotary``).

    HF's ``apply_rotary_pos_emb_interleave`` returns the rotated slice de-interleaved (its pairs'
    first features, then their second ones): the same vector up to ``layout_permutation(D_R)``, which
    changes no score; this returns it in the input's own order.
    """
    x = as_float_array(x, "x")
    check_ndim(x, "x", 2, "(..., T, D)")
    D = x.shape[-1]
    R = _rope_dim(rope_dim, D, "x")
    rotated = apply_rope(x[..., D - R:], positions, base=base, inv_freq=inv_freq, layout="interleaved")
    return np.concatenate([x[..., :D - R], rotated], axis=-1)                   # (..., T, D)


def index_scores(q, k, weights, *, mask=None) -> np.ndarray:
    """``I[b, s, t] = Σ_h w[b, s, h] ReLU(q[b, s, h] · k[b, t] / sqrt(D))``, float ``(B, S, T)``.

    q: ``(B, S, H, D)`` and k: ``(B, T, D)``, both already rotated (``indexer_rope``); weights:
    ``(B, S, H)``, HF's ``weights_proj(x) * H ** -0.5``. mask: boolean ``(S, T)`` or ``(B, S, T)``,
    True = may attend; the others get ``-inf``.
    """
    q, k, w = as_float_array(q, "q"), as_float_array(k, "k"), as_float_array(weights, "weights")
    if q.ndim != 4 or k.ndim != 3 or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q must be (B, S, H, D) and k (B, T, D) with the same B and D, got {q.shape} and {k.shape}")
    B, S, H, D = q.shape
    if w.shape != (B, S, H):
        raise ValueError(f"weights must have shape (B, S, H) = {(B, S, H)}, got {w.shape}")
    per_head = np.maximum(np.einsum("bshd,btd->bsht", q, k) * D ** -0.5, 0.0)    # (B, S, H, T): ReLU
    scores = np.einsum("bsh,bsht->bst", w, per_head)                            # (B, S, T)
    if mask is None:
        return scores
    mask = np.asarray(mask)
    if mask.dtype != bool or mask.shape[-2:] != scores.shape[-2:] or mask.ndim not in (2, 3):
        raise ValueError(f"mask must be boolean (S, T) or (B, S, T) = {scores.shape}, got {mask.dtype} {mask.shape}")
    return np.where(mask, scores, -np.inf)


def index_topk(scores, topk: int) -> np.ndarray:
    """The ``min(topk, T)`` keys of highest score per query, best first: int64 ``(..., S, k)``.

    scores: ``(..., S, T)`` from ``index_scores``. Ties (and the ``-inf`` of masked keys, picked only when
    fewer keys are allowed than k) go to the lower key index; torch's ``topk`` leaves their order open.
    """
    scores = as_float_array(scores, "scores", finite=False)
    check_ndim(scores, "scores", 2, "(..., S, T)")
    k = min(check_int(topk, "topk", minimum=1), scores.shape[-1])
    return np.argsort(-scores, axis=-1, kind="stable")[..., :k].astype(np.int64)


def block_picks(q, k, q_positions, *, block_size: int, topk_blocks: int, local_blocks: int = 1) -> np.ndarray:
    """MiniMax M3's lightning indexer's picks: int ``(B, G, T, k)`` key blocks per query and head group, ``-1`` padded.

    q: ``(B, G, T, D)``, one index head per key/value-head group, and k: ``(B, S, D)``, one key per token, both
    already normed and rotated as the model does (HF ``MiniMaxM3VLIndexer.forward``); q_positions: ``(T,)``, each
    query's position, keys at slots ``0 ... S - 1``. A key's score is ``q · k`` (unscaled) where its slot is at most the
    query's position; a block's score is its keys' maximum; the ``local_blocks`` blocks up to the query's own always
    win (``+inf``); the ``min(topk_blocks, blocks)`` best are kept, best first, a pick whose score is ``-inf`` (a
    block of future keys only) is ``-1``. Ties (the local blocks among them) go to the lower block index; torch's
    ``topk`` leaves their order open, so compare picks as sets.
    """
    q, k = as_float_array(q, "q"), as_float_array(k, "k")
    if q.ndim != 4 or k.ndim != 3 or q.shape[0] != k.shape[0] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q must be (B, G, T, D) and k (B, S, D) with the same B and D, got {q.shape} and {k.shape}")
    block, top = check_positive_int(block_size, "block_size"), check_positive_int(topk_blocks, "topk_blocks")
    local = check_int(local_blocks, "local_blocks", minimum=0)
    pos = np.asarray(q_positions)
    if pos.dtype.kind not in "iu" or pos.shape != (q.shape[2],) or (pos < 0).any():
        raise ValueError(f"q_positions must be (T,) = ({q.shape[2]},) integers >= 0, got {pos.dtype} {pos.shape}")
    B, G, T, _ = q.shape
    S = k.shape[1]
    blocks = -(-S // block)                                                     # ceil(S / block_size)
    scores = np.einsum("bgtd,bsd->bgts", q, k)                                  # (B, G, T, S)
    scores = np.where(np.arange(S)[None, :] > pos[:, None], -np.inf, scores)    # future keys
    padded = np.full((B, G, T, blocks * block), -np.inf)
    padded[..., :S] = scores
    pooled = padded.reshape(B, G, T, blocks, block).max(axis=-1)                # (B, G, T, blocks)
    own = pos // block                                                          # each query's block
    for j in range(local):                                                      # local_blocks: a few, not positions
        np.put_along_axis(pooled, np.clip(own - j, 0, None)[None, None, :, None].repeat(B, 0).repeat(G, 1),
                          np.inf, axis=-1)
    order = np.argsort(-pooled, axis=-1, kind="stable")[..., :min(top, blocks)]
    best = np.take_along_axis(pooled, order, axis=-1)
    return np.where(best == -np.inf, -1, order).astype(np.int64)


def block_mask(picks, *, block_size: int, num_heads: int, keys: int) -> np.ndarray:
    """MiniMax M3's block-sparse picks as the layer's per-head mask: bool ``(B, H, T, S)``.

    picks: int ``(B, G, T, k)``, the key *blocks* each query keeps for each of the G key/value-head groups
    (HF ``MiniMaxM3VLIndexer``'s output: block j holds the keys in slots ``j * block_size ... (j + 1) *
    block_size - 1``, in cache order from 0; ``-1`` marks an unused pick). Query head h belongs to group
    ``h // (num_heads // G)``, as transformers' ``repeat_interleave`` expands it. keys: S, the number of
    key slots. The layer adds causality (``causal=True``): HF's ``build_block_mask`` ANDs the same.
    """
    picks = np.asarray(picks)
    if picks.dtype.kind not in "iu" or picks.ndim != 4:
        raise ValueError(f"picks must be integer (B, G, T, k), got {picks.dtype} {picks.shape}")
    block, H, S = (check_positive_int(v, n) for v, n in ((block_size, "block_size"), (num_heads, "num_heads"),
                                                         (keys, "keys")))
    B, G, T, _ = picks.shape
    blocks = -(-S // block)                                                     # ceil(S / block_size)
    if G == 0 or H % G or picks.min(initial=0) < -1 or picks.max(initial=0) >= blocks:
        raise ValueError(f"picks must hold block indices in [-1, {blocks - 1}] for G groups dividing num_heads = {H}, "
                         f"got G = {G}, values {picks.min(initial=0)} ... {picks.max(initial=0)}")
    kept = np.zeros((B, G, T, blocks + 1), bool)                                # the last column takes the -1s
    np.put_along_axis(kept, np.where(picks < 0, blocks, picks), True, axis=-1)
    per_key = np.repeat(kept[..., :blocks], block, axis=-1)[..., :S]            # (B, G, T, S): each key's block
    return np.repeat(per_key, H // G, axis=1)                                   # (B, H, T, S)
