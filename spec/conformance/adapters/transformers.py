"""transformers (Hugging Face) against the golden vectors.

Components and the conventions each one needs:

- ``T5Attention``: ``_relative_position_bucket`` takes ``key - query``, as the spec does;
  ``compute_bias`` builds the bias of positions ``0 ... L-1`` (``L`` = largest position + 1) and
  the case's rows and columns are read from it. Buckets are float32 only, so ``exact = true`` is
  not expressible. The table is the ``relative_attention_bias`` weight, ``(K, H)``.
- ``build_alibi_tensor`` (BLOOM) and ``build_mpt_alibi_tensor`` (MPT) give the key-only bias
  ``m_h j`` or ``m_h (j - S + 1)``; the slope is read at the key next to the last or the first.
- ``get_embedding`` of M2M100 and Speech2Text (tensor2tensor layout, base 10000, float32): rows
  ``0 ... L-1``, no padding row (their modules number tokens from ``padding_idx + 1``).
- DeBERTa-v2: ``build_relative_position`` numbers queries and keys from 0;
  ``make_log_bucket_position`` as is. Scores are ``q k^T / sqrt(D (1 + #terms))`` (the line of
  ``DisentangledSelfAttention.forward``) plus ``disentangled_attention_bias``, whose projections
  pass ``pos_key`` and ``pos_query`` through: hidden size ``2 H D``,
  ``rel_embeddings = [pos_key | pos_query]``, weights ``[I | 0]`` and ``[0 | I]`` (a torch
  ``Linear`` weight is ``W.T``). Its scale is a float32 tensor: float32 tolerance.
- ``LlamaRotaryEmbedding`` (half layout, no partial rotary) and ``GPTNeoXRotaryEmbedding`` (half,
  partial rotary from ``partial_rotary_factor = R / D``), each with its ``apply_rotary_pos_emb``;
  the interleaved layout by permuting each pair's features. Given frequencies and factor are
  are rebuilt from the case's ``scaling`` by the module itself (``rope_parameters`` with that
  ``rope_type``, read as ``ROPE_INIT_FUNCTIONS`` reads it; ``ntk`` and ``dynamic``, whose module
  follows the positions of the call, are not expressible). cos and sin are float32.
- Cached steps (``rope_scores``): the same modules at ``position_ids`` ``q_positions`` for q and
  ``k_positions`` for k, each with its ``apply_rotary_pos_emb``; the scores are ``q k^T``.
- ``build_alibi_tensor`` of BLOOM and of Falcon for ``alibi_bias_key_only``: ``m_h j`` with ``j``
  = ``(cumsum(mask) - 1) * mask`` of an attention mask, so key positions no mask gives (a jump)
  are not expressible; slopes from the head count (float32). Falcon's multiplies in bfloat16.
- ``ROPE_INIT_FUNCTIONS``, each ``rope_type`` with a ``LlamaConfig``. The spec's static ``ntk`` is
  no ``rope_type``: it is ``dynamic`` at ``factor = 1`` and ``seq_len = factor * L``.
- Qwen2-VL (sections) and Qwen3-VL (interleaved) rotary embeddings with ``apply_rotary_pos_emb``; ERNIE-4.5-VL's
  (height and width alternating, then time, in pairs (2i, 2i + 1)) with its own.

Not run: XLM's and Marian's tables and GPT-J's rotary build rows ``0 ... L-1`` only, and every
case of their layouts has a negative position or another base. Gradients are torch autograd.
"""

from __future__ import annotations

import numpy as np

from ._common import (Component, contiguous_from_zero, lead_summed, mask_of_positions, nonnegative, require,
                      rope_family, scores_family, tensor as _t, torch_vjp)

LIBRARY = "transformers"
DISTRIBUTIONS = ["transformers", "torch"]


# --- T5 -------------------------------------------------------------------------------------------

def _t5_module(table_or_shape, params):
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention
    K, H = table_or_shape
    config = T5Config(d_model=8, d_kv=4, num_heads=H, relative_attention_num_buckets=params["num_buckets"],
                      relative_attention_max_distance=params["max_distance"], is_decoder=not params["bidirectional"])
    module = T5Attention(config, has_relative_attention_bias=True).double()
    module.is_decoder = not params["bidirectional"]
    return module


def t5_bucket(inputs, params):
    from transformers.models.t5.modeling_t5 import T5Attention
    require(not params["exact"], "transformers computes T5 buckets in float32 only (exact = true asks for real numbers)")
    bucket = T5Attention._relative_position_bucket(_t(inputs["relative_position"]), bidirectional=params["bidirectional"],
                                                   num_buckets=params["num_buckets"], max_distance=params["max_distance"])
    return {"bucket": bucket.numpy()}


def _t5_bias(module, q, k):
    L = int(max(q.max(), k.max())) + 1
    full = module.compute_bias(L, L)[0]                                    # (H, L, L), positions 0 ... L-1
    return full[:, _t(q)][:, :, _t(k)]


def t5_bias(inputs, params):
    import torch
    module = _t5_module(inputs["table"].shape, params)
    with torch.no_grad():
        module.relative_attention_bias.weight.copy_(_t(inputs["table"]))
        return {"bias": _t5_bias(module, inputs["q_positions"], inputs["k_positions"]).numpy()}


def t5_grad(inputs, params):
    dbias = inputs["dbias"]
    H = dbias.shape[-3]
    module = _t5_module((params["num_buckets"], H), params)
    bias = _t5_bias(module, inputs["q_positions"], inputs["k_positions"])
    bias.backward(lead_summed(dbias))
    return {"dtable": module.relative_attention_bias.weight.grad.numpy()}


# --- ALiBi slopes ---------------------------------------------------------------------------------

def bloom_slopes(inputs, params):
    import torch
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor
    alibi = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), params["num_heads"], torch.float32)
    return {"slopes": alibi[:, 0, 1].double().numpy()}                      # m_h * j at key j = 1


def mpt_slopes(inputs, params):
    from transformers.models.mpt.modeling_mpt import build_mpt_alibi_tensor
    alibi = build_mpt_alibi_tensor(params["num_heads"], 2)                  # (H, 1, 2): m_h (j - 1)
    return {"slopes": -alibi[:, 0, 0].double().numpy()}


def _key_only(module_name):
    """``build_alibi_tensor`` of BLOOM or Falcon: ``m_h j`` at the key positions of an attention mask."""
    def run(inputs, params):
        import importlib
        import torch
        build = importlib.import_module(f"transformers.models.{module_name}.modeling_{module_name}").build_alibi_tensor
        H = len(inputs["slopes"])
        own = build(torch.ones(1, 2, dtype=torch.long), H, torch.float32)[:, 0, 1].double().numpy()   # m_h at key 1
        rtol = 2.0 ** -8 if module_name == "falcon" else 1e-6    # Falcon multiplies in bfloat16 (8-bit mantissa)
        require(np.allclose(own, inputs["slopes"], rtol=rtol, atol=0),
                "the builder computes its slopes from the head count; the case's slopes are others")
        mask = mask_of_positions(inputs["k_positions"])
        alibi = build(_t(mask)[None], H, torch.float32)                       # (batch * H, 1, S)
        return {"bias": alibi.reshape(H, 1, -1).double().numpy()}
    return run


# --- sinusoidal tables ----------------------------------------------------------------------------

def _t2t_table(cls):
    def run(inputs, params):
        pos = inputs["positions"]
        require(params["layout"] == "tensor2tensor", "this table has tensor2tensor's frequencies only")
        require(params["base"] == 10000.0, "base 10000 is fixed")
        nonnegative(pos, "get_embedding builds rows 0 ... L-1")
        table = cls.get_embedding(int(pos.max()) + 1, params["dim"]).double().numpy()
        return {"table": table[pos]}
    return run


# --- DeBERTa-v2 -----------------------------------------------------------------------------------

def deberta_relative_position(inputs, params):
    import torch
    from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position
    q, k = inputs["q_positions"], inputs["k_positions"]
    require(contiguous_from_zero(q) and contiguous_from_zero(k),
            "build_relative_position numbers queries and keys 0, 1, ... (it reads the lengths only)")
    rel = build_relative_position(torch.zeros(1, len(q), 1), torch.zeros(1, len(k), 1),
                                  bucket_size=params["bucket_size"], max_position=params["max_position"])
    return {"relative_pos": rel[0].numpy()}


def deberta_log_bucket(inputs, params):
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position
    bucket = make_log_bucket_position(_t(inputs["relative_pos"]), params["bucket_size"], params["max_position"])
    return {"bucket": bucket.long().numpy()}


def _deberta_module(H, D, span, terms):
    """A DisentangledSelfAttention whose position projections pass pos_key, pos_query through."""
    import torch
    from transformers import DebertaV2Config
    from transformers.models.deberta_v2.modeling_deberta_v2 import DisentangledSelfAttention
    config = DebertaV2Config(hidden_size=2 * H * D, num_attention_heads=H, attention_head_size=D,
                             relative_attention=True, pos_att_type=list(terms), position_buckets=-1,
                             max_relative_positions=span, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    module = DisentangledSelfAttention(config).double().eval()
    eye, zero = torch.eye(H * D, dtype=torch.float64), torch.zeros(H * D, H * D, dtype=torch.float64)
    with torch.no_grad():
        for name, weight in (("pos_key_proj", torch.cat([eye, zero], 1)), ("pos_query_proj", torch.cat([zero, eye], 1))):
            if hasattr(module, name):
                getattr(module, name).weight.copy_(weight)                   # Linear weight = W.T
                getattr(module, name).bias.zero_()
    return module


def _deberta_scores(q, k, pos_key, pos_query, relative_pos, params):
    """Scores from tensors: the module's c2c line plus its ``disentangled_attention_bias``."""
    import torch
    H, _, D = q.shape
    span, terms = params["att_span"], params["pos_att_type"]
    module = _deberta_module(H, D, span, terms)
    flat = lambda p: p.permute(1, 0, 2).reshape(2 * span, H * D)            # (2 span, H*D), head-major
    rel_embeddings = torch.cat([flat(pos_key), flat(pos_query)], 1)          # (2 span, 2 H D)
    scale_factor = 1 + len(terms)
    c2c = q @ k.transpose(-1, -2) / (D * scale_factor) ** 0.5                # the forward's c2c line
    return c2c + module.disentangled_attention_bias(q, k, _t(relative_pos), rel_embeddings, scale_factor)


def _deberta_inputs(inputs, params, grad=False):
    import torch
    H, _, D = inputs["q"].shape
    zeros = np.zeros((H, 2 * params["att_span"], D))
    names = ("q", "k", "pos_key", "pos_query")
    return [torch.tensor(inputs.get(n, zeros), dtype=torch.float64, requires_grad=grad) for n in names]


def deberta_scores(inputs, params):
    q, k, pk, pq = _deberta_inputs(inputs, params)
    return {"scores": _deberta_scores(q, k, pk, pq, inputs["relative_pos"], params).detach().numpy()}


def deberta_grad(inputs, params):
    tensors = _deberta_inputs(inputs, params, grad=True)
    scores = _deberta_scores(*tensors, inputs["relative_pos"], params)
    scores.backward(_t(inputs["dout"]))
    out = {"dq": tensors[0].grad.numpy(), "dk": tensors[1].grad.numpy()}
    if "c2p" in params["pos_att_type"]:
        out["dpos_key"] = tensors[2].grad.numpy()
    if "p2c" in params["pos_att_type"]:
        out["dpos_query"] = tensors[3].grad.numpy()
    return out


# --- RoPE -----------------------------------------------------------------------------------------

def _hf_rotary(cls_name, R, D, base, inv_freq, attention_factor, scaling=None):
    """The rotary module: of the case's ``scaling`` (built by its own ``rope_type``) or with ``inv_freq`` written."""
    from transformers import GPTNeoXConfig, LlamaConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXRotaryEmbedding
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
    rope, max_pos = {"rope_type": "default", "rope_theta": base}, 2048
    if scaling is not None:
        require(scaling["kind"] not in ("ntk", "dynamic"), "the rotary module's dynamic frequencies follow the "
                                                          "positions of the call, not the case's sequence length")
        rope, max_pos, seq_len = _rope_parameters(scaling)
        require(seq_len is None, "the rotary module reads the sequence length from the positions of the call")
    if cls_name == "neox":
        config = GPTNeoXConfig(hidden_size=2 * D, num_attention_heads=2, max_position_embeddings=max_pos,
                               rope_parameters={**rope, "partial_rotary_factor": R / D})
        module = GPTNeoXRotaryEmbedding(config)
    else:
        module = LlamaRotaryEmbedding(LlamaConfig(hidden_size=2 * D, num_attention_heads=2, head_dim=D,
                                                  max_position_embeddings=max_pos, rope_parameters=rope))
    if scaling is None:
        if inv_freq is not None:
            module.inv_freq = _t(inv_freq).float()
        module.attention_scaling = attention_factor
    return module


def _half_rope(cls_name):
    """RoPE by a transformers rotary module and its ``apply_rotary_pos_emb`` (half layout)."""
    def rotate(x, positions, params, inv_freq):
        from transformers.models.gpt_neox import modeling_gpt_neox as neox
        from transformers.models.llama import modeling_llama as llama
        D = x.shape[-1]
        R = params["rotary_dim"] or D
        require(cls_name == "neox" or R == D, "LlamaRotaryEmbedding rotates every feature (no partial rotary)")
        module = _hf_rotary(cls_name, R, D, params["base"], inv_freq, params["attention_factor"],
                            params.get("scaling") if inv_freq is not None else None)
        t = x.reshape(-1, 1, *x.shape[-2:])                                   # (N, 1, T, D)
        cos, sin = module(t, _t(positions)[None])                             # (1, T, R), float32 angles
        apply = neox.apply_rotary_pos_emb if cls_name == "neox" else llama.apply_rotary_pos_emb
        out, _ = apply(t, t, cos, sin)
        return out.reshape(x.shape)
    return rotate


def _scores_qk(cls_name):
    """q and k of a cached step rotated by a transformers rotary module at their ``position_ids``."""
    def rotate_qk(q, k, inputs, params):
        from transformers.models.gpt_neox import modeling_gpt_neox as neox
        from transformers.models.llama import modeling_llama as llama
        D = q.shape[-1]
        R = params.get("rotary_dim") or D
        require(cls_name == "neox" or R == D, "LlamaRotaryEmbedding rotates every feature (no partial rotary)")
        module = _hf_rotary(cls_name, R, D, params["base"], None, 1.0)
        apply = neox.apply_rotary_pos_emb if cls_name == "neox" else llama.apply_rotary_pos_emb
        cos_q, sin_q = module(q[None], _t(inputs["q_positions"])[None])       # (1, T, R), float32 angles
        cos_k, sin_k = module(k[None], _t(inputs["k_positions"])[None])       # (1, S, R)
        qr, _ = apply(q[None], q[None], cos_q, sin_q)
        kr, _ = apply(k[None], k[None], cos_k, sin_k)
        return qr[0], kr[0]
    return rotate_qk


# --- RoPE scaling ---------------------------------------------------------------------------------

def _rope_parameters(params):
    """``(rope_parameters, max_position_embeddings, seq_len)`` of a ``rope_scaling`` case's params."""
    kind = params["kind"]
    p = {k: v for k, v in params.items() if k not in ("kind", "dim", "base", "seq_len", "max_position_embeddings")}
    max_pos = params.get("max_position_embeddings", params.get("original_max_position_embeddings", 2048))
    seq_len = params.get("seq_len")
    if kind == "ntk":   # HF's dynamic at factor 1 and seq_len = factor * L is the static NTK base
        kind, p, max_pos, seq_len = "dynamic", {"factor": 1.0}, 2048, int(params["factor"] * 2048)
    elif kind == "dynamic":
        max_pos = p.pop("original_max_position_embeddings")                   # dynamic reads the top-level length
    return {"rope_type": kind, "rope_theta": params["base"], **p}, max_pos, seq_len


def rope_scaling(inputs, params):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    dim = params["dim"]
    rope, max_pos, seq_len = _rope_parameters(params)
    config = LlamaConfig(hidden_size=2 * dim, num_attention_heads=2, head_dim=dim, max_position_embeddings=max_pos,
                         rope_parameters=rope)
    if rope["rope_type"] == "longrope":
        config.original_max_position_embeddings = params["original_max_position_embeddings"]
    inv, factor = ROPE_INIT_FUNCTIONS[rope["rope_type"]](config, "cpu", **({"seq_len": seq_len} if seq_len else {}))
    return {"inv_freq": inv.double().numpy(), "attention_factor": np.float64(factor)}


# --- M-RoPE ---------------------------------------------------------------------------------------

def _mrope(x, positions, params):
    from transformers import Qwen2VLTextConfig, Qwen3VLTextConfig
    from transformers.models.qwen2_vl import modeling_qwen2_vl as q2
    from transformers.models.qwen3_vl import modeling_qwen3_vl as q3
    require(params["interleaved"] in (False, True) and params.get("layout", "half") == "half",
            "Qwen2-VL's and Qwen3-VL's rotaries: the split or T H W assignment in the half layout only")
    D = x.shape[-1]
    rope = {"rope_type": "default", "rope_theta": params["base"], "mrope_section": list(params["mrope_section"])}
    kw = dict(hidden_size=2 * D, num_attention_heads=2, num_key_value_heads=2, head_dim=D, rope_parameters=rope)
    if params["interleaved"]:
        module, apply = q3.Qwen3VLTextRotaryEmbedding(Qwen3VLTextConfig(**kw)), q3.apply_rotary_pos_emb
    else:
        module, apply = q2.Qwen2VLRotaryEmbedding(Qwen2VLTextConfig(**kw)), q2.apply_rotary_pos_emb
    t = x.reshape(-1, 1, *x.shape[-2:])                                        # (N, 1, T, D)
    cos, sin = module(t, _t(positions)[:, None])                               # positions (3, 1, T)
    out, _ = apply(t, t, cos, sin)
    return out.reshape(x.shape)


def mrope(inputs, params):
    import torch
    return {"out": _mrope(_t(inputs["x"], torch.float64), inputs["positions"], params).double().numpy()}


def mrope_grad(inputs, params):
    dy = inputs["dy"]
    return {"dx": torch_vjp(lambda t: _mrope(t, inputs["positions"], params), np.zeros_like(dy), dy)}


def _ernie_mrope(x, positions, params):
    from transformers import Ernie4_5_VLMoeTextConfig
    from transformers.models.ernie4_5_vl_moe import modeling_ernie4_5_vl_moe as e
    require(params["interleaved"] == "hw" and params.get("layout", "half") == "interleaved",
            "ERNIE-4.5-VL's rotary: the H W ... T assignment in pairs (2i, 2i + 1) only")
    D = x.shape[-1]
    n_t, n_h, n_w = params["mrope_section"]
    rope = {"rope_type": "default", "rope_theta": params["base"], "mrope_section": [n_h, n_w, n_t]}   # (h, w, t)
    cfg = Ernie4_5_VLMoeTextConfig(hidden_size=2 * D, num_attention_heads=2, num_key_value_heads=2, head_dim=D,
                                   rope_parameters=rope)
    t = x.reshape(-1, 1, *x.shape[-2:])                                        # (N, 1, T, D)
    cos, sin = e.Ernie4_5_VLMoeTextRotaryEmbedding(cfg)(t, _t(positions)[:, None])
    out, _ = e.apply_rotary_pos_emb(t, t, cos, sin)
    return out.reshape(x.shape)


def ernie_mrope(inputs, params):
    import torch
    return {"out": _ernie_mrope(_t(inputs["x"], torch.float64), inputs["positions"], params).double().numpy()}


def ernie_mrope_grad(inputs, params):
    dy = inputs["dy"]
    return {"dx": torch_vjp(lambda t: _ernie_mrope(t, inputs["positions"], params), np.zeros_like(dy), dy)}


# --- the components -------------------------------------------------------------------------------

LAYOUT = "the other RoPE layout by permuting each pair's two features"
F32 = "float32 in the library: float32 tolerance"
GRAD = "torch autograd through the same calls"


def components():
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding as M2M
    from transformers.models.speech_to_text.modeling_speech_to_text import Speech2TextSinusoidalPositionalEmbedding as S2T
    t5 = ["relative position key - query, as the spec", "bias of positions 0 ... L-1, read at the case's rows and columns"]
    table = ["rows 0 ... L-1, read at the case's positions", F32]
    given = ("given inv_freq: the module built from the case's scaling by its own rope_type "
             "(ntk, dynamic not expressible)")
    deb = ["pos_key, pos_query through identity projections (Linear weight = W.T)",
           "c2c term q k^T / sqrt(D (1 + #terms)) added as the forward does", "float32 scale: float32 tolerance"]
    C = Component
    out = [C("T5Attention", "t5_bucket", t5_bucket, "float32", t5[:1]),
           C("T5Attention", "t5_bias", t5_bias, "float64", t5),
           C("T5Attention", "t5_grad", t5_grad, "float64", t5 + [GRAD]),
           C("BLOOM build_alibi_tensor", "alibi_slopes", bloom_slopes, "float32", ["key-only m_h j, read at key 1", F32]),
           C("BLOOM build_alibi_tensor", "alibi_bias_key_only", _key_only("bloom"), "float32",
             ["key positions from an attention mask, (cumsum(mask) - 1) * mask", "slopes from the head count", F32]),
           C("Falcon build_alibi_tensor", "alibi_bias_key_only", _key_only("falcon"), "float32",
             ["key positions from an attention mask, (cumsum(mask) - 1) * mask", "slopes from the head count", F32]),
           C("MPT build_mpt_alibi_tensor", "alibi_slopes", mpt_slopes, "float32",
             ["key-only m_h (j - S + 1), minus its value at key S - 2", F32]),
           C("M2M100 get_embedding", "sinusoidal_table", _t2t_table(M2M), "float32", table + ["no padding_idx row"]),
           C("Speech2Text get_embedding", "sinusoidal_table", _t2t_table(S2T), "float32", table + ["no padding_idx row"]),
           C("DeBERTa-v2 build_relative_position", "deberta_relative_position", deberta_relative_position, "float64",
             ["relative position query - key, as the spec"]),
           C("DeBERTa-v2 make_log_bucket_position", "deberta_log_bucket", deberta_log_bucket, "float64", []),
           C("DeBERTa-v2 DisentangledSelfAttention", "deberta_scores", deberta_scores, "float32", deb),
           C("DeBERTa-v2 DisentangledSelfAttention", "deberta_grad", deberta_grad, "float32", deb + [GRAD]),
           C("ROPE_INIT_FUNCTIONS", "rope_scaling", rope_scaling, "float32",
             ["ntk = dynamic at factor 1 and seq_len = factor * L", F32]),
           C("Qwen2-VL / Qwen3-VL rotary", "mrope", mrope, "float32", ["sections: Qwen2-VL; interleaved: Qwen3-VL", F32]),
           C("Qwen2-VL / Qwen3-VL rotary", "mrope_grad", mrope_grad, "float32", [GRAD, F32]),
           C("ERNIE-4.5-VL rotary", "mrope", ernie_mrope, "float32",
             ["mrope_section given as (h, w, t), as its config writes it", F32]),
           C("ERNIE-4.5-VL rotary", "mrope_grad", ernie_mrope_grad, "float32", [GRAD, F32])]
    for name, rotate, native, notes in (
            ("LlamaRotaryEmbedding", _half_rope("llama"), "half", [LAYOUT, given, F32]),
            ("GPTNeoXRotaryEmbedding", _half_rope("neox"), "half", [LAYOUT, given, "partial_rotary_factor = R / D", F32])):
        out += [C(name, "rope", rope_family(rotate, native), "float32", notes),
                C(name, "rope_scores", scores_family(_scores_qk("neox" if "NeoX" in name else "llama"), native),
                  "float32", ["q at q_positions, k at k_positions (position_ids), then q k^T",
                              "the other layout by the same permutation of q's and k's features", F32]),
                C(name, "rope_grad", rope_family(rotate, native, True), "float32", notes + [GRAD])]
    return out


# --- probes: the minimal inputs behind the discrepancies on the page --------------------------------

def probe_deberta_p2c_cached_step():
    """p2c with fewer queries than keys (T = 1, S = 2): the branch build_rpos has for it."""
    import torch
    module = _deberta_module(1, 1, 2, ["p2c"])
    q, k = torch.ones(1, 1, 1, dtype=torch.float64), torch.ones(1, 2, 1, dtype=torch.float64)
    rel_embeddings = torch.cat([torch.zeros(4, 1), torch.arange(4.0)[:, None]], 1).double()   # pos_query rows 0 1 2 3
    try:
        bias = module.disentangled_attention_bias(q, k, torch.tensor([[1, 0]]), rel_embeddings, 2)
        scores = q @ k.transpose(-1, -2)                                       # (1, T=1, S=2)
        out = {"bias shape": list(bias.shape), "bias": bias.tolist(), "scores shape (q k^T)": list(scores.shape),
               "scores + bias (the forward's next line)": "shape " + str(list((scores + bias).shape))}
    except Exception as err:
        out = f"{type(err).__name__}: {err}"
    return {"name": "deberta_p2c_cached_step",
            "input": "disentangled_attention_bias(q (1, T=1, 1), k (1, S=2, 1), relative_pos [[1, 0]] (query 1, "
                     "keys 0 1), pos_query rows 0 1 2 3, att_span 2, pos_att_type ['p2c'])", "output": out}


def probe_deberta_p2c_three_queries():
    """p2c with T = 3 queries and S = 7 keys, as in the cases cached_step_T3_S7 and p2c_only_T3_S7."""
    import torch
    module = _deberta_module(1, 1, 4, ["p2c"])
    q, k = torch.ones(1, 3, 1, dtype=torch.float64), torch.ones(1, 7, 1, dtype=torch.float64)
    rel = torch.arange(4, 7)[:, None] - torch.arange(7)[None]                  # queries 4 5 6, keys 0 ... 6
    bias = module.disentangled_attention_bias(q, k, rel, torch.zeros(8, 2, dtype=torch.float64), 2)
    out = {"bias shape": list(bias.shape), "scores shape (q k^T)": list((q @ k.transpose(-1, -2)).shape)}
    try:   # the forward's next line: attention_scores + rel_att
        out["scores + bias"] = "shape " + str(list((q @ k.transpose(-1, -2) + bias).shape))
    except Exception as err:
        out["scores + bias"] = f"{type(err).__name__}: {err}"
    return {"name": "deberta_p2c_three_queries",
            "input": "disentangled_attention_bias(q (1, T=3, 1), k (1, S=7, 1), relative_pos of queries 4 5 6 "
                     "and keys 0 ... 6, att_span 4, pos_att_type ['p2c']), then added to the scores", "output": out}


def probe_t2t_small_dims():
    """get_embedding at dims 2 and 3 (tensor2tensor guards the division by half_dim - 1)."""
    from transformers.models.m2m_100.modeling_m2m_100 import M2M100SinusoidalPositionalEmbedding as M2M
    out = {}
    for dim in (2, 3, 4):
        try:
            out[f"dim {dim}"] = M2M.get_embedding(2, dim).tolist()
        except Exception as err:
            out[f"dim {dim}"] = f"{type(err).__name__}: {err}"
    return {"name": "m2m100_get_embedding_small_dims",
            "input": "M2M100SinusoidalPositionalEmbedding.get_embedding(num_embeddings=2, embedding_dim=dim)",
            "output": out}


def probe_falcon_alibi_bfloat16():
    """Falcon's build_alibi_tensor at 12 heads (a slope 2^-0.5) and key 2047, against BLOOM's."""
    import torch
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor as bloom
    from transformers.models.falcon.modeling_falcon import build_alibi_tensor as falcon
    mask = torch.ones(1, 2048, dtype=torch.long)
    out = {name: [float(v) for v in fn(mask, 12, torch.float32)[8, 0, [1, 2047]]] for name, fn in
           (("falcon", falcon), ("bloom", bloom))}
    out["2^-0.5 * [1, 2047]"] = [2 ** -0.5, 2047 * 2 ** -0.5]
    return {"name": "falcon_alibi_bfloat16",
            "input": "build_alibi_tensor(ones(1, 2048), num_heads=12, dtype=float32)[head 8, 0, keys 1 and 2047]",
            "output": out}


PROBES = [probe_falcon_alibi_bfloat16, probe_deberta_p2c_cached_step, probe_deberta_p2c_three_queries, probe_t2t_small_dims]
