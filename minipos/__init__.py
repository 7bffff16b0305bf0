"""minipos: a NumPy reference for the position schemes of transformer attention.

Shape legend (used in every docstring and einsum string):

    B  batch             H  heads             T  query positions
    S  key positions     D  head dim          K  buckets / relative range
    ...  any leading dims

Attention tensors are ``(..., H, T, D)``; additive biases are ``(H, T, S)`` or broadcastable to
``(..., H, T, S)``. Masks are boolean with ``True`` = may attend. Frequencies, angles, slopes and
logs are computed in float64; outputs keep the input's floating dtype. Weights are
``(d_in, d_out)`` and used as ``x @ W`` (a torch ``nn.Linear.weight`` is ``W.T``).

Every scheme enters attention through one of five seams:

    input             sinusoidal, learned absolute      (minipos.sinusoidal)
    rotate            RoPE and its scalings, xPos,      (minipos.rope, rope_scaling, xpos,
                      M-RoPE, Llama 4's temperature     minipos.mrope, minipos.irope)
    bias              ALiBi, T5 buckets                 (minipos.alibi, minipos.t5)
    content-position  Transformer-XL, DeBERTa, Shaw     (minipos.transformer_xl, minipos.deberta,
                                                         minipos.shaw)
    value             Shaw et al. 2018                  (minipos.shaw)

and the layer's own machinery of today's models: grouped-query heads, sliding windows, chunks,
sinks (minipos.local_global), StreamingLLM's cache (minipos.streaming) and DeepSeek's latent
attention (minipos.mla).
"""

__version__ = "0.1.0"

from . import (alibi, attention, deberta, irope, local_global, mrope, rope, rope_scaling, shaw,  # noqa: E402
               sinusoidal, t5, transformer_xl, xpos)
from . import mla, streaming  # noqa: E402  (built on the layer)
from .attention import causal_mask, softmax  # noqa: E402
from .layer import (ALiBi, DeBERTa, KVCache, LearnedAbsolute, MRotary, MultiHeadAttention, NoPE,  # noqa: E402
                    NoPETemperature, Rotary, Shaw, Sinusoidal, T5Bias, TransformerXL, XPos)

__all__ = [
    "__version__", "alibi", "attention", "deberta", "irope", "local_global", "mla", "mrope", "rope",
    "rope_scaling", "shaw", "sinusoidal", "streaming", "t5", "transformer_xl", "xpos",
    "causal_mask", "softmax", "MultiHeadAttention", "KVCache",
    "NoPE", "Sinusoidal", "LearnedAbsolute", "Rotary", "XPos", "ALiBi", "T5Bias", "TransformerXL", "DeBERTa",
    "MRotary", "NoPETemperature", "Shaw",
]
