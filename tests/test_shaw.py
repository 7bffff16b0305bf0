"""Shaw et al. 2018 relative position representations: buckets, the two forms, their backward, the
value seam through the layer (dense, blockwise, cached, fast), and three outside references: a loop
transcription of the paper's equations in torch, tensor2tensor's batched formulation transcribed in
torch, and HF SpeechT5's keys-only attention."""

import numpy as np
import pytest

import minipos.fast as fast
from minipos import shaw
from minipos.attention import attention, attention_backward, blockwise_attention
from minipos.layer import MultiHeadAttention, Shaw

from _gradcheck import after_a_cache, check_layer_gradients


def test_buckets_hand_worked():
    # clip(j - i, 2) + 2 for queries 0..2 and keys 0..4, written out by hand from §3.2 of the paper.
    expected = [[2, 3, 4, 4, 4],
                [1, 2, 3, 4, 4],
                [0, 1, 2, 3, 4]]
    assert shaw.relative_buckets([0, 1, 2], np.arange(5), 2).tolist() == expected
    # Only j - i matters: the same pairs moved by 100 positions (a cached step) give the same rows.
    assert shaw.relative_buckets([100, 101, 102], 100 + np.arange(5), 2).tolist() == expected
    assert shaw.relative_buckets([3], np.arange(5), 0).tolist() == [[0] * 5]   # k = 0: one row, no position


def test_relative_logits_hand_worked():
    # One query q = (1, 2) at position 1, keys at 0, 1, 2, k = 1: rows (left, same, right) of w_k.
    w_k = np.array([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    q = np.array([[1.0, 2.0]])                                           # (T=1, D=2)
    # q . w_k[0] = 1, q . w_k[1] = 2, q . w_k[2] = 3, by hand.
    got = shaw.relative_logits(q, w_k, [1], [0, 1, 2], max_relative_position=1)
    np.testing.assert_array_equal(got, [[1.0, 2.0, 3.0]])
    # weights (0.5, 0.25, 0.25) on those keys: 0.5 (1, 0) + 0.25 (0, 1) + 0.25 (1, 1) = (0.75, 0.5).
    got = shaw.relative_values(np.array([[0.5, 0.25, 0.25]]), w_k, [1], [0, 1, 2], max_relative_position=1)
    np.testing.assert_array_equal(got, [[0.75, 0.5]])


@pytest.mark.parametrize("k", [0, 1, 3, 10])
def test_efficient_form_equals_the_pairwise_form(k):
    rng = np.random.default_rng(k)
    q_pos, k_pos = np.array([4, 5, 6, 9]), np.arange(10)
    q, p = rng.standard_normal((2, 3, 4, 5)), rng.random((2, 3, 4, 10))
    w = rng.standard_normal((2 * k + 1, 5))
    kw = dict(max_relative_position=k)
    np.testing.assert_allclose(shaw.relative_logits(q, w, q_pos, k_pos, **kw),
                               shaw.relative_logits_pairwise(q, w, q_pos, k_pos, **kw), rtol=0, atol=1e-13)
    np.testing.assert_allclose(shaw.relative_values(p, w, q_pos, k_pos, **kw),
                               shaw.relative_values_pairwise(p, w, q_pos, k_pos, **kw), rtol=0, atol=1e-13)


def _fd(f, x, e, h=1e-6):
    return (f(x + h * e) - f(x - h * e)) / (2 * h)


def test_function_backward_matches_finite_differences():
    rng = np.random.default_rng(3)
    q_pos, k_pos, kw = np.arange(3, 7), np.arange(8), dict(max_relative_position=2)
    q, p, w = rng.standard_normal((2, 4, 3)), rng.random((2, 4, 8)), rng.standard_normal((5, 3))
    dl, do = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 4, 3))
    dq, dw = shaw.relative_logits_backward(q, w, q_pos, k_pos, dl, **kw)
    for grad, arg in ((dq, "q"), (dw, "w")):
        e = rng.standard_normal(grad.shape)
        f = (lambda a: np.sum(shaw.relative_logits(a, w, q_pos, k_pos, **kw) * dl)) if arg == "q" else \
            (lambda a: np.sum(shaw.relative_logits(q, a, q_pos, k_pos, **kw) * dl))
        assert np.isclose(np.sum(grad * e), _fd(f, q if arg == "q" else w, e), rtol=1e-7, atol=1e-9)
    dp, dw = shaw.relative_values_backward(p, w, q_pos, k_pos, do, **kw)
    for grad, arg in ((dp, "p"), (dw, "w")):
        e = rng.standard_normal(grad.shape)
        f = (lambda a: np.sum(shaw.relative_values(a, w, q_pos, k_pos, **kw) * do)) if arg == "p" else \
            (lambda a: np.sum(shaw.relative_values(p, a, q_pos, k_pos, **kw) * do))
        assert np.isclose(np.sum(grad * e), _fd(f, p if arg == "p" else w, e), rtol=1e-7, atol=1e-9)


def test_attention_value_fn_blockwise_equals_dense_and_backward():
    # The value seam in attention itself: blockwise (running-max rescaled) equals dense, and the
    # dense backward's dq, dk, dv and the table's gradient match central differences.
    rng = np.random.default_rng(4)
    q, k_, v = (rng.standard_normal((2, 2, 7, 4)) for _ in range(3))
    w_v, pos = rng.standard_normal((5, 4)), np.arange(7)
    mask = np.tril(np.ones((7, 7), bool))

    def value(qs, ks, p, w=None):
        return shaw.relative_values(p, w_v if w is None else w, pos[qs], pos[ks], max_relative_position=2)
    dense = attention(q, k_, v, mask=mask, value_fn=value)
    block = blockwise_attention(q, k_, v, causal=True, block_size=3, value_fn=value)
    np.testing.assert_allclose(block, dense, rtol=0, atol=1e-13)
    dw = []

    def value_grad(qs, ks, p, dout):
        dp, g = shaw.relative_values_backward(p, w_v, pos[qs], pos[ks], dout, max_relative_position=2)
        dw.append(g)
        return dp
    dout = rng.standard_normal(dense.shape)
    dq, dk, dv, _ = attention_backward(q, k_, v, dout, mask=mask, value_fn=value, value_grad_fn=value_grad)
    e = rng.standard_normal(w_v.shape)
    fd = _fd(lambda w: np.sum(attention(q, k_, v, mask=mask, value_fn=lambda *a: value(*a, w=w)) * dout), w_v, e)
    assert np.isclose(np.sum(dw[0] * e), fd, rtol=1e-7)
    e = rng.standard_normal(q.shape)
    fd = _fd(lambda a: np.sum(attention(a, k_, v, mask=mask, value_fn=value) * dout), q, e)
    assert np.isclose(np.sum(dq * e), fd, rtol=1e-7)


# --------------------------------------------------------------------------- the layer against the paper

def _paper_layer(layer, x, causal, positions):
    """The paper's Eqs. (3)-(4), its softmax and §3.2 transcribed literally in torch, one (b, h, i, j) at a time."""
    torch = pytest.importorskip("torch")
    t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float64)  # noqa: E731
    X, WQ, WK, WV, WO = t(x), t(layer.wq), t(layer.wk), t(layer.wv), t(layer.wo)
    wK, wV, k = t(layer.scheme.w_k), t(layer.scheme.w_v), layer.scheme.max_relative_position
    B, T, _ = x.shape
    H, dz = layer.num_heads, layer.head_dim
    clip = lambda d: max(-k, min(k, d))                                  # clip(x, k) = max(-k, min(k, x))  # noqa: E731
    Z = torch.zeros(B, T, H * dz, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            cols = slice(h * dz, (h + 1) * dz)
            for i in range(T):
                keys = [j for j in range(T) if not causal or positions[j] <= positions[i]]
                e = torch.stack([
                    # Eq. (4): e_ij = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(d_z), a^K_ij = w^K_clip(j - i, k)
                    (X[b, i] @ WQ[:, cols]) @ (X[b, j] @ WK[:, cols] + wK[clip(positions[j] - positions[i]) + k])
                    / dz ** 0.5 for j in keys])
                alpha = torch.softmax(e, dim=0)                         # alpha_ij = softmax over j of e_ij
                # Eq. (3): z_i = sum_j alpha_ij (x_j W^V + a^V_ij), a^V_ij = w^V_clip(j - i, k)
                Z[b, i, cols] = sum(alpha[n] * (X[b, j] @ WV[:, cols] + wV[clip(positions[j] - positions[i]) + k])
                                    for n, j in enumerate(keys))
    return (Z @ WO).numpy()                                              # the heads concatenated, W^O


@pytest.mark.parametrize("causal", [False, True])
def test_layer_equals_the_paper_transcribed_in_torch(causal):
    layer = MultiHeadAttention(8, 2, scheme=Shaw(max_relative_position=2), seed=1)
    x = np.random.default_rng(5).standard_normal((2, 6, 8))
    positions = np.arange(6)
    expected = _paper_layer(layer, x, causal, positions)
    np.testing.assert_allclose(layer(x, causal=causal), expected, rtol=0, atol=1e-13)
    blockwise = MultiHeadAttention(8, 2, scheme=Shaw(max_relative_position=2), seed=1, block_size=4)
    fast_layer = fast.MultiHeadAttention(8, 2, scheme=Shaw(max_relative_position=2), seed=1, block_size=4)
    for other in (blockwise, fast_layer):
        np.testing.assert_allclose(other(x, causal=causal), expected, rtol=0, atol=1e-13)
    if causal:  # decoding through the cache in chunks gives the same rows
        cache = layer.new_cache()
        y = np.concatenate([layer(x[:, a:b], causal=True, cache=cache) for a, b in ((0, 3), (3, 4), (4, 6))], 1)
        np.testing.assert_allclose(y, expected, rtol=0, atol=1e-13)


def _t2t_relative_attention_inner(x, y, z, transpose):
    """tensor2tensor's ``common_attention._relative_attention_inner`` transcribed to torch, line by line:

        xy_matmul = tf.matmul(x, y, transpose_b=transpose)
        x_t = tf.transpose(x, [2, 0, 1, 3])
        x_t_r = tf.reshape(x_t, [length, heads * batch_size, -1])
        x_tz_matmul = tf.matmul(x_t_r, z, transpose_b=transpose)
        x_tz_matmul_r = tf.reshape(x_tz_matmul, [length, batch_size, heads, -1])
        x_tz_matmul_r_t = tf.transpose(x_tz_matmul_r, [1, 2, 0, 3])
        return xy_matmul + x_tz_matmul_r_t
    """
    batch_size, heads, length = x.shape[0], x.shape[1], x.shape[2]
    xy_matmul = x @ (y.transpose(-1, -2) if transpose else y)
    x_t_r = x.permute(2, 0, 1, 3).reshape(length, heads * batch_size, -1)
    x_tz_matmul = x_t_r @ (z.transpose(-1, -2) if transpose else z)
    return xy_matmul + x_tz_matmul.reshape(length, batch_size, heads, -1).permute(1, 2, 0, 3)


def _t2t_relative_positions(length_q, length_k, max_relative_position):
    """tensor2tensor's ``_generate_relative_positions_matrix`` (no cache):

        range_vec_k = tf.range(length_k); range_vec_q = range_vec_k[-length_q:]
        distance_mat = range_vec_k[None, :] - range_vec_q[:, None]
        distance_mat_clipped = tf.clip_by_value(distance_mat, -max_relative_position, max_relative_position)
        final_mat = distance_mat_clipped + max_relative_position
    """
    import torch
    range_vec_k = torch.arange(length_k)
    range_vec_q = range_vec_k[-length_q:]
    distance_mat = range_vec_k[None, :] - range_vec_q[:, None]
    return distance_mat.clamp(-max_relative_position, max_relative_position) + max_relative_position


@pytest.mark.parametrize("causal", [False, True])
def test_layer_equals_tensor2tensors_dot_product_attention_relative(causal):
    # tensor2tensor's dot_product_attention_relative (q already scaled by depth ** -0.5 in
    # multihead_attention; causal by attention_bias_lower_triangle's -1e9):
    #   relations_keys = tf.gather(relative_positions_keys/embeddings, matrix)     # (T, S, D)
    #   logits = _relative_attention_inner(q, k, relations_keys, True) + bias
    #   weights = tf.nn.softmax(logits)
    #   return _relative_attention_inner(weights, v, relations_values, False)
    torch = pytest.importorskip("torch")
    layer = MultiHeadAttention(8, 2, scheme=Shaw(max_relative_position=2), seed=4)
    x = np.random.default_rng(8).standard_normal((2, 7, 8))
    B, T, _ = x.shape
    H, D = layer.num_heads, layer.head_dim
    t = lambda a: torch.tensor(np.asarray(a), dtype=torch.float64)  # noqa: E731
    X = t(x)
    q, k, v = ((X @ t(w)).view(B, T, H, D).permute(0, 2, 1, 3) for w in (layer.wq, layer.wk, layer.wv))
    q = q * D ** -0.5
    matrix = _t2t_relative_positions(T, T, 2)
    relations_keys, relations_values = t(layer.scheme.w_k)[matrix], t(layer.scheme.w_v)[matrix]
    logits = _t2t_relative_attention_inner(q, k, relations_keys, True)
    if causal:
        logits = logits + torch.triu(torch.full((T, T), -1e9, dtype=torch.float64), diagonal=1)
    weights = torch.softmax(logits, dim=-1)
    out = _t2t_relative_attention_inner(weights, v, relations_values, False)       # (B, H, T, D)
    expected = (out.permute(0, 2, 1, 3).reshape(B, T, H * D) @ t(layer.wo)).numpy()
    np.testing.assert_allclose(layer(x, causal=causal), expected, rtol=0, atol=1e-13)


def test_layer_against_speecht5_keys_only():
    # HF SpeechT5's encoder attention is Shaw et al.'s key half (it cites N18-2074): no value term,
    # distance i - j (query - key) clipped to [-L, L - 1] and shifted by L into pe_k (2L rows).
    # So a key L positions *after* the query has a row of its own and the earliest row is shared:
    # with k = L, w_k[1:] = pe_k reversed and w_k[0] = pe_k[2L - 1]; w_v = 0.
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.speecht5.modeling_speecht5 import (SpeechT5Attention,
                                                                SpeechT5RelativePositionalEncoding)
    torch.manual_seed(0)
    d_model, H, L, T = 32, 4, 3, 9
    ref = SpeechT5Attention(d_model, H, bias=True).double().eval()
    pe = SpeechT5RelativePositionalEncoding(d_model // H, max_length=L).double()
    with torch.no_grad():
        for lin in (ref.q_proj, ref.k_proj, ref.v_proj, ref.out_proj):
            lin.bias.normal_()
    x = torch.randn(2, T, d_model, dtype=torch.float64)
    with torch.no_grad():
        expected = ref(x, position_bias=pe(x))[0].numpy()
    layer = MultiHeadAttention(d_model, H, scheme=Shaw(max_relative_position=L), bias=True)
    for name, lin in (("q", ref.q_proj), ("k", ref.k_proj), ("v", ref.v_proj), ("o", ref.out_proj)):
        setattr(layer, "w" + name, lin.weight.detach().numpy().T.copy())
        setattr(layer, "b" + name, lin.bias.detach().numpy().copy())
    table = pe.pe_k.weight.detach().numpy()                              # (2L, D)
    layer.scheme.w_k = np.concatenate([table[-1:], table[::-1]])          # (2L + 1, D)
    layer.scheme.w_v = np.zeros_like(layer.scheme.w_k)
    np.testing.assert_allclose(layer(x.numpy()), expected, rtol=0, atol=1e-12)


# --------------------------------------------------------------------------- the backward through the layer

@pytest.mark.parametrize("block", [None, 3])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("make", [MultiHeadAttention, fast.MultiHeadAttention])
def test_layer_backward_matches_finite_differences(block, causal, make):
    rng = np.random.default_rng(6)
    layer = make(8, 2, scheme=Shaw(max_relative_position=2), bias=True, seed=2, block_size=block)
    x, dy = rng.standard_normal((2, 7, 8)), rng.standard_normal((2, 7, 8))
    mask = np.ones((2, 7), bool)
    mask[1, 4:] = False                                                  # key padding
    positions = 3 + np.arange(7)
    check_layer_gradients(layer, x, dy, lambda a, **kw: layer(a, positions=positions, mask=mask, causal=causal,
                                                               **kw), rng)


@pytest.mark.parametrize("block", [None, 2])
def test_layer_backward_grouped_query_and_cache(block):
    # The cached keys and values of earlier calls are constants: the gradient covers this call only.
    rng = np.random.default_rng(7)
    layer = MultiHeadAttention(8, 4, scheme=Shaw(max_relative_position=1), num_kv_heads=2, head_dim=2, seed=3,
                               block_size=block)
    past, x, dy = rng.standard_normal((1, 3, 8)), rng.standard_normal((1, 4, 8)), rng.standard_normal((1, 4, 8))
    check_layer_gradients(layer, x, dy, after_a_cache(layer, past), rng)


# --------------------------------------------------------------------------- bad input

def test_bad_input_is_refused_by_name():
    with pytest.raises(ValueError, match="max_relative_position"):
        Shaw(max_relative_position=-1)
    with pytest.raises(TypeError, match="max_relative_position"):
        Shaw(max_relative_position=1.5)
    q, w = np.zeros((2, 3, 4)), np.zeros((5, 4))
    with pytest.raises(ValueError, match="w_k must have shape"):
        shaw.relative_logits(q, np.zeros((4, 4)), np.arange(3), np.arange(3), max_relative_position=2)
    with pytest.raises(ValueError, match="w_k must have shape"):
        shaw.relative_logits(q, np.zeros((5, 3)), np.arange(3), np.arange(3), max_relative_position=2)
    with pytest.raises(ValueError, match="q must have shape"):
        shaw.relative_logits(q, w, np.arange(2), np.arange(3), max_relative_position=2)
    with pytest.raises(ValueError, match="weights must have shape"):
        shaw.relative_values(np.zeros((3, 4)), w, np.arange(3), np.arange(3), max_relative_position=2)
    with pytest.raises(ValueError, match="dout must have shape"):
        shaw.relative_values_backward(np.zeros((3, 3)), w, np.arange(3), np.arange(3), np.zeros((3, 5)),
                                      max_relative_position=2)
    with pytest.raises(ValueError, match="finite"):
        shaw.relative_values(np.full((3, 3), np.nan), w, np.arange(3), np.arange(3), max_relative_position=2)
    v = np.zeros((1, 3, 4))
    with pytest.raises(ValueError, match="value_fn must return"):
        attention(v, v, v, value_fn=lambda qs, ks, p: np.zeros((1, 3, 5)))
    with pytest.raises(TypeError, match="value_fn"):
        attention(v, v, v, value_fn="shaw")
    with pytest.raises(ValueError, match="value_fn and value_grad_fn"):
        attention_backward(v, v, v, v, value_fn=lambda qs, ks, p: 0 * v)


def test_a_failed_call_leaves_the_cache_unchanged():
    layer = MultiHeadAttention(8, 2, scheme=Shaw(max_relative_position=2))
    cache = layer.new_cache()
    layer(np.ones((1, 2, 8)), cache=cache)
    layer.scheme.w_v = np.zeros((4, 4))                                  # wrong number of rows
    with pytest.raises(ValueError, match="w_v must have shape"):
        layer(np.ones((1, 1, 8)), cache=cache)
    assert cache.length == 2 and cache.seen == 2
