"""minipos: a NumPy reference for the position schemes of transformer attention.

Shape legend (used in every docstring and einsum string):

    B  batch             H  heads             T  query positions
    S  key positions     D  head dim          K  buckets / relative range
    ...  any leading dims

Attention tensors are ``(..., H, T, D)``; additive biases are ``(H, T, S)`` or broadcastable to
``(..., H, T, S)``. Masks are boolean with ``True`` = may attend. Frequencies, angles, slopes and
logs are computed in float64; outputs keep the input's floating dtype. Weights are
``(d_in, d_out)`` and used as ``x @ W`` (a torch ``nn.Linear.weight`` is ``W.T``).

Every scheme enters attention through one of four seams:

    input             sinusoidal, learned absolute      (minipos.sinusoidal)
    rotate            RoPE and its scalings, xPos,      (minipos.rope, rope_scaling, xpos,
                      M-RoPE                            minipos.mrope)
    bias              ALiBi, T5 buckets                 (minipos.alibi, minipos.t5)
    content-position  Transformer-XL, DeBERTa           (minipos.transformer_xl, minipos.deberta)
"""

__version__ = "0.1.0"

from . import (alibi, attention, deberta, mrope, rope, rope_scaling, sinusoidal, t5,  # noqa: E402
               transformer_xl, xpos)
from . import mla  # noqa: E402  (DeepSeek's multi-head latent attention, built on the layer)
from .attention import causal_mask, softmax  # noqa: E402
from .layer import (ALiBi, DeBERTa, KVCache, LearnedAbsolute, MRotary, MultiHeadAttention, NoPE,  # noqa: E402
                    Rotary, Sinusoidal, T5Bias, TransformerXL, XPos)

__all__ = [
    "__version__", "alibi", "attention", "deberta", "rope", "rope_scaling", "sinusoidal", "t5",
    "transformer_xl", "xpos", "mrope", "mla", "causal_mask", "softmax", "MultiHeadAttention", "KVCache", "NoPE",
    "Sinusoidal", "LearnedAbsolute", "Rotary", "XPos", "ALiBi", "T5Bias", "TransformerXL", "DeBERTa",
    "MRotary",
]

from . import irope  # noqa: E402  Llama 4 / SmolLM3: NoPE temperature, chunked attention, per-layer choice
from .layer import NoPETemperature  # noqa: E402

__all__ += ["irope", "NoPETemperature"]
