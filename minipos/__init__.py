"""minipos: a NumPy reference for the position schemes of transformer attention.

Shape legend (used in every docstring and einsum string):

    B  batch             H  heads             T  query positions
    S  key positions     D  head dim          K  buckets / relative range
    ...  any leading dims

Attention tensors are ``(..., H, T, D)``; additive biases are ``(H, T, S)`` or broadcastable to
``(..., H, T, S)``. Masks are boolean with ``True`` = may attend. Frequencies, angles, slopes and
logs are computed in float64; outputs keep the input's floating dtype. Weights are
``(d_in, d_out)`` and used as ``x @ W`` (a torch ``nn.Linear.weight`` is ``W.T``).

Every scheme enters attention through one of five seams (``minipos.seams``: input, rotate, bias,
content-position, value); ``minipos.schemes`` lists the schemes once, each class at the bottom of the
module of its math, and this package exports every registered class by name (``minipos.ALiBi``).
Beside them, the layer's own machinery of today's models: grouped-query heads, sliding windows,
chunks, sinks (minipos.local_global), StreamingLLM's cache (minipos.streaming), DeepSeek's latent
attention (minipos.mla) and per-head q/k norms (minipos.qk_norm); minipos.config reads a model's
config.json into its layers.
"""

__version__ = "0.1.0"

from . import (alibi, attention, cache, deberta, irope, local_global, masks, mrope, rope, rope_scaling,  # noqa: E402
               schemes, seams, shaw, sinusoidal, t5, transformer_xl, xpos)
from . import layer, mla, qk_norm, streaming  # noqa: E402  (built on the layer)
from . import config  # noqa: E402  (builds the layers of a model's config)
from .attention import causal_mask, softmax  # noqa: E402
from .cache import KVCache  # noqa: E402
from .layer import MultiHeadAttention  # noqa: E402
from .schemes import ENTRIES, SCHEMES, class_named  # noqa: E402

_MODULES = ("alibi", "attention", "cache", "config", "deberta", "irope", "layer", "local_global", "masks", "mla", "mrope",
            "qk_norm", "rope", "rope_scaling", "schemes", "seams", "shaw", "sinusoidal", "streaming", "t5",
            "transformer_xl", "xpos")
__all__ = [
    "__version__", *_MODULES,
    *dict.fromkeys(m for m in (e.cls.__module__.rpartition(".")[2] for e in ENTRIES.values()) if m not in _MODULES),
    "causal_mask", "softmax", "MultiHeadAttention", "KVCache", "SCHEMES",
    *(entry.cls.__name__ for entry in ENTRIES.values()),
]
"""The modules (a registered scheme's own too, ``fire``), the core functions and every registered class."""


def __getattr__(name):
    """The registered scheme classes by class name (``minipos.ALiBi``, ...), as in ``minipos.layer``."""
    cls = class_named(name)
    if cls is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return cls
