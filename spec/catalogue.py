"""Write ``spec/catalogue.md``: every scheme a vectors case can name, and the layer's settings.

``python tools/regenerate.py`` writes it, with everything else derived from the registry; this
script alone also runs from the repository root (``python spec/catalogue.py``; ``--check`` exits 1
when the committed file differs from what the code gives). It reads the scheme registry
(``minipos.schemes.ENTRIES``: each scheme's class, its keyword arguments with their defaults
through ``config_keys``, and where a checkpoint's config keeps them, ``config_names``) and the
signatures of ``MultiHeadAttention``, ``MultiHeadLatentAttention``, ``KVCache`` and
``StreamingCache``, so the catalogue cannot drift from the code: a test regenerates it.
"""

from __future__ import annotations

import inspect
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from minipos.cache import KVCache                          # noqa: E402
from minipos.layer import MultiHeadAttention                # noqa: E402
from minipos.inkling import InklingAttention                         # noqa: E402
from minipos.mla import DecoupledRotary, MultiHeadLatentAttention   # noqa: E402
from minipos.schemes import ENTRIES, config_keys            # noqa: E402
from minipos.streaming import StreamingCache                # noqa: E402

OUT = os.path.join(ROOT, "spec", "catalogue.md")

# What each keyword of MultiHeadAttention is, and where a checkpoint keeps it (minipos.layer's
# docstring). A keyword missing here stops the script, so a new one must be described.
LAYER_KEYWORDS = {
    "d_model": "model width (HF `hidden_size`); a vectors param",
    "num_heads": "query heads H (HF `num_attention_heads`); a vectors param",
    "scheme": "the position scheme, an instance; vectors: `scheme` (its name above) and `scheme_config`",
    "head_dim": "D, default `d_model // num_heads` (HF `head_dim`)",
    "bias": "biases `bq`, `bk`, `bv`, `bo` (HF `attention_bias` where a config has it); a vectors param",
    "seed": "seed of the random initial weights (not part of a spec case: the case gives the weights)",
    "dtype": "float dtype of weights and computation",
    "block_size": "blockwise (online-softmax) attention over N x N blocks; same outputs, `None` is dense",
    "num_kv_heads": "key/value heads (HF `num_key_value_heads`): grouped-query attention; `layer`, `layer_grad`, `local_global`",
    "attention_chunk": "query i sees key j only if `i // C == j // C` (Llama 4 `attention_chunk_size`); `irope_layer`",
    "sliding_window": "query i sees keys `i - W < j <= i` (HF `sliding_window`); `local_global`",
    "scale": "replaces the scheme's `q . k` scale (Gemma 3: `query_pre_attn_scalar ** -0.5`); `local_global`",
    "sinks": "a learned per-head sink logit `sinks` `(H,)` (gpt-oss `GptOssAttention.sinks`); `local_global`",
}

# MultiHeadLatentAttention's own keywords (minipos.mla's docstrings).
MLA_KEYWORDS = {
    "kv_lora_rank": "r_kv, the key/value latent's width (HF `kv_lora_rank`)",
    "qk_nope_head_dim": "D_N, the unrotated part of each query/key head (HF `qk_nope_head_dim`)",
    "qk_rope_head_dim": "D_R (even), the rotated part (HF `qk_rope_head_dim`); 0: no rotated part and `scheme` `NoPE` (GLM-5.3-Flash)",
    "v_head_dim": "D_V (HF `v_head_dim`)",
    "q_lora_rank": "r_q, the query latent's width (HF `q_lora_rank`); `None`: a full-rank `wq` (DeepSeek-V2-Lite)",
    "eps": "the latents' RMSNorm epsilon (DeepSeek builds those norms with the default 1e-6, not `rms_norm_eps`; "
           "Dots 3 Note with `rms_norm_eps`); a vectors param of the Dots cases only (spec 1.3.0)",
    "k_rope_norm": "`True`: the shared rope key is RMS-normed (weight `k_rope_norm` `(D_R,)`) before its rotation "
                   "(Dots 3 Note's `k_rope_only_layernorm`)",
    "q_lora_scale": "multiplies the normed query latent (Dots 3 Note: `sqrt(hidden_size / q_lora_rank)`)",
    "kv_lora_scale": "multiplies the normed key/value latent (Dots 3 Note: `sqrt(hidden_size / kv_lora_rank)`)",
    "gate": "`\"head\"`: each head's output times `sigmoid(x wg)_h` before `wo` (`wg` `(d_model, H)`, Dots 3 Note's "
            "`g_proj`); `\"feature\"`: one gate per output feature; `None`: no gate",
}

# InklingAttention's own keywords (minipos.inkling's docstrings).
INKLING_KEYWORDS = {
    "d_rel": "the relative states' width per head (HF `d_rel`)",
    "rel_extent": "E, the bias's reach back of a full layer (HF `rel_extent`; `None`: 1024); a sliding layer's is its "
                  "window",
    "conv_kernel": "K, the taps of the keys' and values' causal convolutions (HF `conv_kernel_size`)",
    "dynamic_conv": "`True`: each token adds its own tap per key/value head (`k_conv_w`, `v_conv_w`), a full layer's",
    "log_scaling": "`(alpha, n_floor)`: queries and relative states times `1 + alpha ln max((p + 1) / n_floor, 1)`, a "
                   "full layer's (HF `log_scaling_alpha`, `log_scaling_n_floor`); `None`: no scale",
    "qk_clip": "the L2 clip of each query and key head (HF `qk_l2_clip_threshold`)",
    "rel_clip": "the L2 clip of each relative state (HF `rel_l2_clip_threshold`)",
    "norm_eps": "the values' RMSNorm epsilon (HF `rms_norm_eps`)",
    "scheme": "`NoPE` only: the layer's position machinery is its own",
}

# Settings of a layer case that are not constructor keywords.
CALL_SETTINGS = [
    ("causal", "`False`", "`MultiHeadAttention.__call__(x, causal=...)`: queries see keys at positions <= their own"),
    ("chunks", "`[T]`", "vectors only: the lengths fed one after another through one `KVCache`, outputs "
                        "concatenated (`[T]`: one pass)"),
    ("mem_len", f"`{inspect.signature(KVCache.__init__).parameters['mem_len'].default!r}`",
     "`layer.new_cache(mem_len)` (`KVCache`): keep at most that many earlier keys (Transformer-XL's "
     "memory; `W - 1` is a sliding window's rolling cache); `local_global`"),
    ("streaming", "absent", "`{\"num_sinks\", \"window\"}`: the chunks go through "
     "`StreamingCache(layer, num_sinks=..., window=...)` (StreamingLLM; defaults " +
     ", ".join(f"`{n}={p.default!r}`" for n, p in inspect.signature(StreamingCache.__init__).parameters.items()
               if p.default is not inspect.Parameter.empty) + "); `local_global`"),
]


def _default(value) -> str:
    if value is inspect.Parameter.empty:
        return "(required)"
    return f"`{value.__module__}.{value.__name__}`" if isinstance(value, type) else f"`{value!r}`"


def _keywords(cls) -> str:
    return "<br>".join(f"`{k}`: {_default(v)}" for k, v in config_keys(cls).items()) or "–"


def _signature_rows(cls, skip=("self",)) -> list:
    return [(n, _default(p.default)) for n, p in inspect.signature(cls.__init__).parameters.items()
            if n not in skip and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def schemes() -> list:
    lines = ["## Schemes", "",
             "A layer case's `scheme` is the name; `scheme_config` holds keyword arguments of the class "
             "(a key left out takes its default). \"In a checkpoint's config\" is where HF transformers "
             "(unless said otherwise) keeps each setting.", "",
             "| `scheme` | class | `scheme_config` keys (defaults) | in a checkpoint's config |",
             "|---|---|---|---|"]
    for name, entry in ENTRIES.items():
        hf = "<br>".join(f"`{k}`: {v}" for k, v in entry.config_names.items()) or "–"
        lines.append(f"| `{name}` | `{entry.cls.__module__}.{entry.cls.__name__}` | {_keywords(entry.cls)} | {hf} |")
    lines += ["", f"The `mla` families take no `scheme`: their `scheme_config` holds the keyword arguments of "
              f"`{DecoupledRotary.__module__}.DecoupledRotary` ({_keywords(DecoupledRotary).replace('<br>', ', ')}), "
              "DeepSeek's rotary part (HF `rope_theta`; `rope_interleave`: `True` is `'interleaved'`; "
              "`rope_scaling` / `rope_parameters`).", ""]
    return lines


def _own_keywords(cls, table: dict, table_name: str, also: tuple, intro: str) -> list:
    """The rows of ``cls``'s keywords beyond the layer's (and ``also``), each described in ``table``."""
    own = [(n, d) for n, d in _signature_rows(cls) if n not in LAYER_KEYWORDS or n in also]
    unknown = [n for n, _ in own if n not in table]
    if unknown:
        raise SystemExit(f"spec/catalogue.py: describe {cls.__name__}'s keyword(s) {unknown} in {table_name}")
    return ["", intro, "", "| keyword | default | what it does |", "|---|---|---|",
            *(f"| `{n}` | {d} | {table[n]} |" for n, d in own)]


def layer() -> list:
    unknown = [n for n, _ in _signature_rows(MultiHeadAttention) if n not in LAYER_KEYWORDS]
    if unknown:
        raise SystemExit(f"spec/catalogue.py: describe MultiHeadAttention's keyword(s) {unknown} in LAYER_KEYWORDS")
    lines = ["## The layer", "",
             "`minipos.layer.MultiHeadAttention` keywords (the `layer`, `local_global`, `irope_layer`, "
             "`shaw_layer` and `mrope_layer` families; a family's params are in `README.md`):", "",
             "| keyword | default | what it does |", "|---|---|---|"]
    lines += [f"| `{n}` | {d} | {LAYER_KEYWORDS[n]} |" for n, d in _signature_rows(MultiHeadAttention)]
    lines += ["", "Settings of a case that are not constructor keywords:", "",
              "| param | default | what it does |", "|---|---|---|"]
    lines += [f"| `{n}` | {d} | {what} |" for n, d, what in CALL_SETTINGS]
    lines += _own_keywords(MultiHeadLatentAttention, MLA_KEYWORDS, "MLA_KEYWORDS", (),
                           "`minipos.mla.MultiHeadLatentAttention` (the `mla` families) takes `d_model`, `num_heads`, "
                           "`scheme` (a `DecoupledRotary`), `bias`, `seed`, `dtype`, `block_size`, `sliding_window`, "
                           "`scale` as above, and its own:")
    lines += _own_keywords(InklingAttention, INKLING_KEYWORDS, "INKLING_KEYWORDS", ("scheme",),
                           "`minipos.inkling.InklingAttention` (the `inkling` families) takes `d_model`, `num_heads`, "
                           "`num_kv_heads`, `head_dim`, `bias`, `seed`, `dtype`, `block_size`, `sliding_window`, "
                           "`scale` as above (through `**kwargs`), and its own:")
    return lines + [""]


def render() -> str:
    head = ["# Scheme catalogue", "",
            "Generated by `python tools/regenerate.py` (`spec/catalogue.py`) from `minipos/schemes.py` (the "
            "scheme registry) and the layer's signatures; do not edit by hand. `README.md` describes the vectors that use these.", ""]
    return "\n".join(head + schemes() + layer())


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if argv == ["--check"]:
        with open(OUT, encoding="utf-8") as f:
            stale = f.read() != text
        if stale:
            print("spec/catalogue.md is stale: run python tools/regenerate.py", file=sys.stderr)
        return int(stale)
    if argv:
        raise SystemExit("usage: python spec/catalogue.py [--check]")
    with open(OUT, "w", encoding="utf-8") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
