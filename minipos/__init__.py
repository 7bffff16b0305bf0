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

from . import (alibi, attention, cache, deberta, irope, local_global, masks, mrope, rope, rope_scaling,  # noqa: E402
               schemes, seams, shaw, sinusoidal, t5, transformer_xl, xpos)
from . import layer, mla, streaming  # noqa: E402  (built on the layer)
from .attention import causal_mask, softmax  # noqa: E402
from .cache import KVCache  # noqa: E402
from .layer import MultiHeadAttention  # noqa: E402
from .schemes import ENTRIES, SCHEMES, class_named  # noqa: E402

__all__ = [
    "__version__", "alibi", "attention", "cache", "deberta", "irope", "layer", "local_global", "masks", "mla",
    "mrope", "rope", "rope_scaling", "schemes", "seams", "shaw", "sinusoidal", "streaming", "t5",
    "transformer_xl", "xpos", "causal_mask", "softmax", "MultiHeadAttention", "KVCache", "SCHEMES",
    *(entry.cls.__name__ for entry in ENTRIES.values()),
]


def __getattr__(name):
    """The registered scheme classes by class name (``minipos.ALiBi``, ...), as in ``minipos.layer``."""
    cls = class_named(name)
    if cls is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return cls
