"""minipos, fast: the same public names and signatures as the reference, equal up to rounding.

The contract: every function here returns what the reference function of the same name returns,
up to floating-point rounding, and raises where it raises; ``minipos`` itself never imports this
package, so deleting it changes no result of the reference. What lives here exists only for speed:
worker threads and the BLAS pause (``_threads``), bias blocks kept between calls, bounds that skip
blocks which underflow, a fixed softmax reference with a running-max fallback, split-angle
trigonometry, Toeplitz copies, BLAS products per head where the reference writes ``np.einsum``.
The modules mirror the reference's, name for name::

    minipos.attention.attention             minipos.fast.attention.attention
    minipos.attention.blockwise_attention   minipos.fast.attention.blockwise_attention
    minipos.rope.apply_rope                 minipos.fast.rope.apply_rope (and its backward)
    minipos.xpos.apply_xpos                 minipos.fast.xpos.apply_xpos (and its backward)
    minipos.t5.t5_bias                      minipos.fast.t5.t5_bias
    minipos.alibi.alibi_bias                minipos.fast.alibi.alibi_bias (+ alibi_bias_bound)
    minipos.deberta.c2p_term                minipos.fast.deberta.c2p_term (and p2c, and their backward)
    minipos.transformer_xl.xl_position_logits
                                            minipos.fast.transformer_xl.xl_position_logits (and its backward)
    minipos.layer.MultiHeadAttention        minipos.fast.MultiHeadAttention
    minipos.mla.MultiHeadLatentAttention    minipos.fast.MultiHeadLatentAttention

and a user switches the layer with one import (the schemes and caches are the reference's)::

    from minipos.fast import MultiHeadAttention

Some functions take extra keyword arguments that only steer speed (``workers``, ``bias_max_fn``,
``dtype``); the reference's arguments all mean the same here.
"""

from . import alibi, attention, deberta, rope, t5, transformer_xl, xpos  # noqa: E402  (named as the reference's)
from .layer import MultiHeadAttention  # noqa: E402
from .mla import MultiHeadLatentAttention  # noqa: E402

__all__ = ["alibi", "attention", "deberta", "rope", "t5", "transformer_xl", "xpos", "MultiHeadAttention",
           "MultiHeadLatentAttention"]
