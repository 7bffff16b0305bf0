"""MultiHeadAttention with TransformerXL and XPos against transcriptions of their reference attention.

Each test copies the weights of a transcribed reference attention into ``MultiHeadAttention``
(mapping as in the ``minipos.layer`` docstrings) and compares the layer outputs in float64:

- Transformer-XL: ``RelPartialLearnableMultiHeadAttn.forward`` of kimiyoung/transformer-xl
  ``pytorch/mem_transformer.py`` (commit 81b1b1955b5729b311e1548998eb2a89cb528178), with the
  ``pos_seq`` / ``pos_emb`` / ``dec_attn_mask`` built as in ``MemTransformerLM._forward`` and the
  memory as in ``_update_mems``; the attention part only (no dropout, residual or LayerNorm).
  Needs torch.
- xPos: ``MultiheadAttention.forward`` of microsoft/torchscale
  ``torchscale/component/multihead_attention.py`` in NumPy, with ``XPOS`` from ``test_xpos``
  (a line-by-line transcription of ``xpos_relative_position.py``). Runs without torch.
"""

import numpy as np
import pytest

from minipos.layer import MultiHeadAttention, TransformerXL, XPos
from test_xpos import ts_xpos  # NumPy transcription of torchscale's XPOS.forward

# ----------------------------------------------------------------------------- Transformer-XL


def xl_reference(torch, w, r, r_w_bias, r_r_bias, qkv_net, r_net, o_net, n_head, d_head, attn_mask, mems=None):
    """kimiyoung/transformer-xl ``RelPartialLearnableMultiHeadAttn.forward``, pre_lnorm=False, up to
    ``attn_out = self.o_net(attn_vec)`` (dropout, residual and LayerNorm left out). w: (qlen, bsz, d_model)."""
    qlen, rlen, bsz = w.size(0), r.size(0), w.size(1)
    cat = w if mems is None else torch.cat([mems, w], 0)
    w_heads = qkv_net(cat)
    r_head_k = r_net(r)
    w_head_q, w_head_k, w_head_v = torch.chunk(w_heads, 3, dim=-1)
    w_head_q = w_head_q[-qlen:]
    klen = w_head_k.size(0)
    w_head_q = w_head_q.view(qlen, bsz, n_head, d_head)
    w_head_k = w_head_k.view(klen, bsz, n_head, d_head)
    w_head_v = w_head_v.view(klen, bsz, n_head, d_head)
    r_head_k = r_head_k.view(rlen, n_head, d_head)
    rw_head_q = w_head_q + r_w_bias
    AC = torch.einsum("ibnd,jbnd->ijbn", (rw_head_q, w_head_k))
    rr_head_q = w_head_q + r_r_bias
    BD = torch.einsum("ibnd,jnd->ijbn", (rr_head_q, r_head_k))
    # RelMultiHeadAttn._rel_shift (zero_triu=False)
    zero_pad = torch.zeros((BD.size(0), 1, *BD.size()[2:]), dtype=BD.dtype)
    BD_padded = torch.cat([zero_pad, BD], dim=1).view(BD.size(1) + 1, BD.size(0), *BD.size()[2:])
    BD = BD_padded[1:].view_as(BD)
    attn_score = (AC + BD) * (1 / (d_head ** 0.5))
    attn_score = attn_score.masked_fill(attn_mask[:, :, :, None], -float("inf"))  # 3-D mask branch
    attn_prob = torch.softmax(attn_score, dim=1)
    attn_vec = torch.einsum("ijbn,jbnd->ibnd", (attn_prob, w_head_v))
    attn_vec = attn_vec.contiguous().view(attn_vec.size(0), attn_vec.size(1), n_head * d_head)
    return o_net(attn_vec)


def xl_segment_inputs(torch, d_model, qlen, mlen):
    """``MemTransformerLM._forward``: R at pos_seq = klen-1 ... 0 ([sin | cos]) and the causal mask."""
    klen = mlen + qlen
    pos_seq = torch.arange(klen - 1, -1, -1.0, dtype=torch.float64)
    inv_freq = 1 / (10000 ** (torch.arange(0.0, d_model, 2.0, dtype=torch.float64) / d_model))  # PositionalEmbedding
    sinusoid_inp = torch.outer(pos_seq, inv_freq)
    pos_emb = torch.cat([sinusoid_inp.sin(), sinusoid_inp.cos()], dim=-1)[:, None, :]  # (klen, 1, d_model)
    dec_attn_mask = torch.triu(torch.ones(qlen, klen), diagonal=1 + mlen).bool()[:, :, None]  # True = masked
    return pos_emb, dec_attn_mask


@pytest.mark.parametrize("block_size", [None, 2])
def test_transformer_xl_layer_matches_reference_attention_with_memory(block_size):
    torch = pytest.importorskip("torch")
    d_model, H, D, B, T1, T2, M = 16, 2, 8, 2, 5, 4, 3
    torch.manual_seed(0)
    qkv_net = torch.nn.Linear(d_model, 3 * H * D, bias=False).double()
    r_net = torch.nn.Linear(d_model, H * D, bias=False).double()
    o_net = torch.nn.Linear(H * D, d_model, bias=False).double()
    r_w_bias, r_r_bias = torch.randn(H, D, dtype=torch.float64), torch.randn(H, D, dtype=torch.float64)

    layer = MultiHeadAttention(d_model, H, scheme=TransformerXL(), block_size=block_size)
    w_qkv = qkv_net.weight.detach().numpy().T  # (d_model, 3*H*D): chunk(3, dim=-1) gives q | k | v
    layer.wq, layer.wk, layer.wv = (w_qkv[:, i * H * D:(i + 1) * H * D].copy() for i in range(3))
    layer.wo = o_net.weight.detach().numpy().T.copy()
    sc = layer.scheme
    sc.u, sc.v = r_w_bias.numpy().copy(), r_r_bias.numpy().copy()
    sc.w_r = r_net.weight.detach().numpy().T.copy()

    rng = np.random.default_rng(1)
    x1, x2 = rng.standard_normal((B, T1, d_model)), rng.standard_normal((B, T2, d_model))

    def reference(x, mems):  # batch-first in and out; the reference is (len, bsz, d_model)
        mlen = 0 if mems is None else mems.size(0)
        pos_emb, mask = xl_segment_inputs(torch, d_model, x.shape[1], mlen)
        w = torch.from_numpy(x).transpose(0, 1)
        with torch.no_grad():
            out = xl_reference(torch, w, pos_emb, r_w_bias, r_r_bias, qkv_net, r_net, o_net, H, D, mask, mems)
        return out.transpose(0, 1).numpy()

    cache = layer.new_cache(mem_len=M)
    y1 = layer(x1, causal=True, cache=cache)  # a single causal segment
    np.testing.assert_allclose(y1, reference(x1, None), rtol=1e-10, atol=1e-10)
    # The next segment attends to the memory: _update_mems keeps cat(mems, hids)[-mem_len:], and
    # this layer's hids are its inputs, so mems = x1[-M:] (positions T1-M ... T1-1).
    mems = torch.from_numpy(x1).transpose(0, 1)[-M:]
    y2 = layer(x2, causal=True, cache=cache)
    np.testing.assert_allclose(y2, reference(x2, mems), rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------- xPos


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def xpos_reference(p, query, incremental_state=None, attn_mask=None):
    """microsoft/torchscale ``MultiheadAttention.forward`` (self-attention, xpos_rel_pos=True,
    no subln, no dropout) in NumPy. query: (bsz, tgt_len, embed_dim); p: weights as ``x @ W + b``."""
    bsz, tgt_len, embed_dim = query.shape
    H = p["num_heads"]
    head_dim = embed_dim // H
    src_len = tgt_len
    q = query @ p["wq"] + p["bq"]
    k = query @ p["wk"] + p["bk"]
    v = query @ p["wv"] + p["bv"]
    q = q * head_dim ** -0.5  # q *= self.scaling
    q = q.reshape(bsz, tgt_len, H, head_dim).transpose(0, 2, 1, 3).reshape(bsz * H, tgt_len, head_dim)
    k = k.reshape(bsz, src_len, H, head_dim).transpose(0, 2, 1, 3).reshape(bsz * H, src_len, head_dim)
    v = v.reshape(bsz, src_len, H, head_dim).transpose(0, 2, 1, 3).reshape(bsz * H, src_len, head_dim)
    if incremental_state is not None:
        if "prev_key" in incremental_state:  # keys are cached before xPos
            k = np.concatenate([incremental_state["prev_key"].reshape(bsz * H, -1, head_dim), k], axis=1)
            v = np.concatenate([incremental_state["prev_value"].reshape(bsz * H, -1, head_dim), v], axis=1)
        incremental_state["prev_key"] = k.reshape(bsz, H, -1, head_dim)
        incremental_state["prev_value"] = v.reshape(bsz, H, -1, head_dim)
        src_len = k.shape[1]
    offset = src_len - 1 if incremental_state is not None else 0
    k = ts_xpos(k, head_dim, p["scale_base"], offset=0, downscale=True)
    q = ts_xpos(q, head_dim, p["scale_base"], offset=offset, downscale=False)
    attn_weights = q @ k.transpose(0, 2, 1)
    if attn_mask is not None:
        attn_weights = attn_weights + attn_mask[None]
    attn = softmax(attn_weights) @ v  # (bsz*H, tgt_len, head_dim)
    attn = attn.transpose(1, 0, 2).reshape(tgt_len, bsz, embed_dim).transpose(1, 0, 2)
    return attn @ p["wo"] + p["bo"]


def xpos_pair(scale_base, d_model=16, H=2, seed=0):
    """A layer with bias=True and random weights, and the same weights for the reference."""
    layer = MultiHeadAttention(d_model, H, scheme=XPos(scale_base=scale_base), bias=True, seed=seed)
    rng = np.random.default_rng(seed + 100)
    for name in ("q", "k", "v", "o"):
        setattr(layer, "b" + name, rng.standard_normal(d_model) * 0.5)
    p = {name: getattr(layer, name) for name in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo")}
    return layer, dict(p, num_heads=H, scale_base=scale_base)


@pytest.mark.parametrize("scale_base", [512, 8])
def test_xpos_layer_matches_torchscale_attention_causal(scale_base):
    layer, p = xpos_pair(scale_base)
    T = 7
    x = np.random.default_rng(3).standard_normal((2, T, 16)) * 2
    future = np.triu(np.full((T, T), -np.inf), 1)  # the decoder's additive self_attn_mask
    np.testing.assert_allclose(layer(x, causal=True), xpos_reference(p, x, attn_mask=future),
                               rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("scale_base", [512, 8])
def test_xpos_layer_matches_torchscale_attention_token_by_token(scale_base):
    # torchscale rotates q with offset = src_len - 1 and all keys with offset 0, each centred on
    # src_len; the centring cancels in q . k, so the layer's uncentred exponents agree.
    layer, p = xpos_pair(scale_base, seed=1)
    x = np.random.default_rng(4).standard_normal((2, 6, 16)) * 2
    cache, state = layer.new_cache(), {}
    for t in range(x.shape[1]):
        step = x[:, t:t + 1]
        np.testing.assert_allclose(layer(step, cache=cache), xpos_reference(p, step, incremental_state=state),
                                   rtol=1e-10, atol=1e-10)
