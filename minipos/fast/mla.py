"""Multi-head latent attention, fast: the reference's projections (step 2) with the fast layer's
attend step (6-7). ``MultiHeadLatentAttention`` here is ``minipos.mla.MultiHeadLatentAttention`` on
top of ``minipos.fast.MultiHeadAttention``: the same arguments, weights and caches, outputs and
gradients equal up to rounding."""

from __future__ import annotations

from .. import mla as reference
from .layer import MultiHeadAttention

__all__ = ["MultiHeadLatentAttention"]


class MultiHeadLatentAttention(reference.MultiHeadLatentAttention, MultiHeadAttention):
    """``minipos.mla.MultiHeadLatentAttention`` with ``minipos.fast.MultiHeadAttention``'s attend step."""
