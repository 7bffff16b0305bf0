"""The seam contract: what a position scheme may change in attention, and the baseline that changes nothing.

A scheme is an object the layer (``minipos.layer.MultiHeadAttention``) calls at fixed places, its
*seams*; it overrides only the ones it uses (a position-dependent temperature is another place):

=================  ==========================================  =================================
seam               what the scheme returns                     schemes
=================  ==========================================  =================================
input              ``embed(x, positions)``: x + p before the   ``Sinusoidal``, ``LearnedAbsolute``
                   projections
rotate             ``rotate_q / rotate_k(x, positions,         ``Rotary``, ``XPos``, ``MRotary``,
                   seq_len=)``: q, k after a position-         ``NoPETemperature``
                   dependent map
bias               ``bias(q_positions, k_positions)``: an       ``ALiBi``, ``T5Bias``
                   additive ``(H, T, S)`` term
content-position   ``content_position(q, k, q_pos, k_pos)``:   ``TransformerXL``, ``DeBERTa``,
                   the query used against content, plus a      ``Shaw``
                   function giving the extra logits that
                   couple content with position, per block
value              ``value_position(q_pos, k_pos)``: a         ``Shaw``
                   function of a block's weights p giving
                   the extra output ``sum_j p_ij a^V_ij``
=================  ==========================================  =================================

Each scheme class sits at the bottom of the module of its math (``minipos.alibi.ALiBi``,
``minipos.t5.T5Bias``, ...); ``minipos.schemes.SCHEMES`` lists them all, and ``minipos.layer``
re-exports them. Every seam has a backward beside it, for ``MultiHeadAttention.backward``.
"""

from __future__ import annotations

import math

import numpy as np

__all__ = ["Scheme", "NoPE", "TERMS", "SEAMS"]

SEAMS = ("input", "rotate", "bias", "content-position", "value")
"""The seams a scheme's ``seams`` may name (the table above)."""

TERMS = ("content-content", "content-position", "position-content", "position-position")
"""The four terms of ``(x_i + p_i) W_q W_k^T (x_j + p_j)^T``; a scheme's ``terms`` says which its logits keep."""


class Scheme:
    """Base class of the position schemes, and itself the no-position baseline's behaviour.

    A subclass overrides only the seams it uses. ``bind`` is called once by the layer, giving the
    scheme the sizes and a random generator for its learned parameters; a scheme belongs to one
    layer. A scheme keeps no per-call state, so one layer can serve several threads.
    """

    name = "none"
    seams: tuple = ()
    terms: tuple = ("content-content",)  # which of the four expansion terms the logits keep
    sign_convention: tuple = ()  # (the relative distance it reads, where that comes from): docs/conventions.md

    def bind(self, layer, rng: np.random.Generator) -> None:  # layer: the MultiHeadAttention it serves
        if getattr(self, "layer", None) is not None:
            raise ValueError(f"this {type(self).__name__} instance already belongs to another layer (its "
                             "parameters would be shared and overwritten); pass a new scheme instance")
        self.layer = layer
        self.d_model, self.num_heads, self.head_dim = layer.d_model, layer.num_heads, layer.head_dim

    def parameters(self) -> dict:
        """The scheme's learned position parameters, by their reference names."""
        return {}

    def settings(self) -> tuple:
        """The scheme's fixed settings that change its forward (a base, a layout, a bucket count): ``(name,
        value)`` pairs of plain values (numbers, strings, booleans, ``None``, tuples of them), none by
        default. The layer's ``configuration()`` records them as ``"scheme.<name>"``, so ``backward``
        refuses a context of a pass under other settings. Learned parameters are ``parameters()``."""
        return ()

    position_streams = 1  # 3: positions (3, T) feed the rotate seam only; mask and cache follow sequence order
    rotates_cached_keys = False  # cache hook: True = the cache keeps raw keys, every call rotates all of them

    def cache_tag(self, seq_len: int):
        """Cache hook: what the cached keys depend on besides their positions; a change raises, never mixes."""
        return None

    def embed(self, x, positions):  # input seam: (B, T, d_model) -> (B, T, d_model)
        return x

    def rotate_q(self, q, positions, *, seq_len: int):  # rotate seam: (B, H, T, D) -> (B, H, T, D)
        return q

    def rotate_k(self, k, positions, *, seq_len: int):  # seq_len: max key position of the call + 1
        return k

    def bias(self, q_positions, k_positions):  # bias seam: -> (H, T, S) or None
        return None

    def content_position(self, q, k, q_positions, k_positions):
        """Content-position seam: ``(query against content, extra)``.

        ``extra`` is ``None`` or a function ``extra(q_slice, k_slice)`` giving the scaled extra
        logits ``(B, H, tq, tk)`` of the queries and keys in those index slices, so the layer can
        evaluate it for the whole ``(T, S)`` or block by block.
        """
        return q, None

    def value_position(self, q_positions, k_positions):
        """Value seam: ``None`` or a function ``value(q_slice, k_slice, p)`` giving the extra output
        ``(B, H, tq, Dv)`` of a block's attention weights ``p`` ``(B, H, tq, tk)``, linear in ``p``."""
        return None

    def scale(self, head_dim: int) -> float:
        """The logits' scale, a Python float: a NumPy float64 scalar would make float32 logits float64."""
        return 1.0 / math.sqrt(head_dim)

    # The seams' gradients, for ``MultiHeadAttention.backward``. ``add(name, grad)`` sums a
    # parameter's gradient ("scheme.<name>", or a layer weight such as "wk").

    def embed_backward(self, dx, positions, add):  # input seam: returns the gradient of x
        return dx

    def rotate_q_backward(self, dq, positions, *, seq_len: int):  # rotate seam: the map's transpose
        return dq

    def rotate_k_backward(self, dk, positions, *, seq_len: int):
        return dk

    def rotate_parameters_backward(self, q, dq, k, dk, positions, add) -> None:
        """Rotate seam: the gradients of the rotation's learned parameters (MLCD's class angles), to ``add``, from
        q ``(B, H, T, D)`` and this call's keys k ``(B, KV, T, D)`` as rotated, and their gradients; k and dk are
        ``None`` for a scheme that ``rotates_cached_keys``. A rotation without parameters has none."""

    def bias_backward(self, q_positions, k_positions, dbias) -> dict:  # bias seam: {"scheme.<name>": grad}
        return {}

    def content_position_backward(self, dq_c, add):  # the query used against content -> the query
        return dq_c

    def extra_backward(self, q, k, q_positions, k_positions, qs, ks, dlogits, add):
        """The extra logits of the block ``(qs, ks)``: ``(dq[..., qs, :], dk[..., ks, :])``."""
        raise NotImplementedError(f"{type(self).__name__} has extra logits but no extra_backward")

    def value_position_backward(self, q_positions, k_positions, qs, ks, p, dout, add):
        """The value term of the block ``(qs, ks)`` for ``dout`` ``(B, H, tq, Dv)``: its share of ``dp``."""
        raise NotImplementedError(f"{type(self).__name__} has a value term but no value_position_backward")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NoPE(Scheme):
    """No position information: attention is permutation-equivariant (the baseline)."""

    name = "nope"
