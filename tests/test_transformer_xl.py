"""Tests of minipos.transformer_xl.

Expected values come from hand-worked shifts (in the comments), from a naive double loop over
(i, j) that evaluates A^rel_{i,j} of Dai et al. 2019 (arXiv:1901.02860, Sec. 3.3) term by term
with R computed here by ``math.sin`` / ``math.cos``, and from values printed by faithful copies
of the reference code (kimiyoung/transformer-xl ``pytorch/mem_transformer.py``:
``RelMultiHeadAttn._rel_shift``, ``PositionalEmbedding`` and the score part of
``RelPartialLearnableMultiHeadAttn.forward``; transformers 5.24.0 no longer ships TransfoXL).
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minipos.attention import causal_mask
from minipos.transformer_xl import (
    XLTerms,
    position_scores,
    rel_shift,
    relative_embeddings,
    relative_heads,
    xl_position_logits,
    xl_scores,
    xl_scores_definitional,
    xl_terms,
)


# ----------------------------------------------------------------------------- helpers


def paper_R(n, d_model, base=10000.0):
    """R_n as the reference ``PositionalEmbedding``: inv_freq = 1 / base^(2c/d), [sin | cos]."""
    w = [base ** (-2.0 * c / d_model) for c in range(d_model // 2)]
    return np.array([math.sin(n * x) for x in w] + [math.cos(n * x) for x in w])


def paper_terms(q, k, w_r, u, v, q_pos, k_pos, base=10000.0):
    """The four terms of A^rel_{i,j} by a naive loop over (b, h, i, j); q (B, H, T, D)."""
    B, H, T, D = q.shape
    S = k.shape[2]
    out = np.zeros((4, B, H, T, S))
    for b in range(B):
        for h in range(H):
            for i in range(T):
                for j in range(S):
                    wr = (paper_R(q_pos[i] - k_pos[j], w_r.shape[0], base) @ w_r)[h * D:(h + 1) * D]
                    out[0, b, h, i, j] = q[b, h, i] @ k[b, h, j]  # (a) E W_q^T W_kE E
                    out[1, b, h, i, j] = q[b, h, i] @ wr  # (b) E W_q^T W_kR R_{i-j}
                    out[2, b, h, i, j] = u[h] @ k[b, h, j]  # (c) u^T W_kE E
                    out[3, b, h, i, j] = v[h] @ wr  # (d) v^T W_kR R_{i-j}
    return out


def random_case(rng, B, H, T, M, D, d_model, dtype=np.float64):
    S = T + M
    q = rng.standard_normal((B, H, T, D)).astype(dtype)
    k = rng.standard_normal((B, H, S, D)).astype(dtype)
    w_r = rng.standard_normal((d_model, H * D)).astype(dtype)
    u = rng.standard_normal((H, D)).astype(dtype)
    v = rng.standard_normal((H, D)).astype(dtype)
    return q, k, w_r, u, v


def tiny_case():
    """H=2, T=2, M=1 (S=3), D=2, d_model=4: the inputs of the printed reference values."""
    H, T, S, D, dm = 2, 2, 3, 2, 4
    q = (np.arange(H * T * D).reshape(H, T, D) - 3) / 4
    k = ((np.arange(H * S * D) * 7) % 11 - 5).reshape(H, S, D) / 4
    w_r = ((np.arange(dm * H * D) * 5) % 13 - 6).reshape(dm, H * D) / 8
    u = np.array([[0.5, -0.25], [0.125, 1.0]])
    v = np.array([[-0.5, 0.75], [0.25, -1.0]])
    return q, k, w_r, u, v


# ----------------------------------------------------------------------------- rel_shift


def test_rel_shift_hand_worked_T2_S3():
    # pad:   [[0 1 2 3], [0 4 5 6]]  ->  buffer 0 1 2 3 0 4 5 6
    # view (3+1, 2): [[0 1], [2 3], [0 4], [5 6]]; drop row 0: 2 3 0 4 5 6
    # view (2, 3):   [[2 3 0], [4 5 6]]
    # M = 1: out[0, j] = x[0, j+1] for j <= 1 (2, 3); out[0, 2] is the pad zero (garbage);
    #        out[1, j] = x[1, j] for j <= 2.
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    np.testing.assert_array_equal(rel_shift(x), [[2.0, 3.0, 0.0], [4.0, 5.0, 6.0]])


def test_rel_shift_hand_worked_square_no_memory():
    # x = [[1 2 3], [4 5 6], [7 8 9]]; buffer 0 1 2 3 0 4 5 6 0 7 8 9; drop the first 3:
    # 3 0 4 | 5 6 0 | 7 8 9. Valid (j <= i): out[0,0] = x[0,2] = 3; out[1,:2] = x[1,1:] = 5 6.
    x = np.arange(1.0, 10.0).reshape(3, 3)
    np.testing.assert_array_equal(rel_shift(x), [[3.0, 0.0, 4.0], [5.0, 6.0, 0.0], [7.0, 8.0, 9.0]])


def test_rel_shift_matches_printed_reference():
    # Printed by a faithful copy of kimiyoung/transformer-xl pytorch/mem_transformer.py
    # RelMultiHeadAttn._rel_shift on torch.arange(1, 16).view(3, 5)[:, :, None, None]
    # (torch 2.13.0; the reference shifts dims 0, 1 of (qlen, klen, bsz, n_head)).
    printed = [[3.0, 4.0, 5.0, 0.0, 6.0], [7.0, 8.0, 9.0, 10.0, 0.0], [11.0, 12.0, 13.0, 14.0, 15.0]]
    x = np.arange(1.0, 16.0).reshape(3, 5)
    np.testing.assert_array_equal(rel_shift(x), printed)
    np.testing.assert_array_equal(rel_shift(np.stack([x, 10 * x])), np.stack([printed, 10 * np.array(printed)]))


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 6), st.integers(0, 5), st.integers(0, 2), st.integers(0, 2**31 - 1))
def test_rel_shift_equals_index_formula_where_valid(T, M, lead, seed):
    S = T + M
    x = np.random.default_rng(seed).standard_normal((2,) * lead + (T, S))
    out = rel_shift(x)
    for i in range(T):
        for j in range(S):
            if j <= i + M:  # out[i, j] = x[i, j + T - 1 - i]
                np.testing.assert_array_equal(out[..., i, j], x[..., i, j + T - 1 - i])
            elif j == i + M + 1:  # the pad zero lands just right of the valid region
                np.testing.assert_array_equal(out[..., i, j], 0.0)
    assert np.array_equal(causal_mask(T, S), np.arange(S)[None, :] <= np.arange(T)[:, None] + M)


@pytest.mark.parametrize("T,S", [(1, 1), (2, 3), (3, 5), (4, 4), (3, 7)])
def test_rel_shift_matches_live_reference(T, S):
    torch = pytest.importorskip("torch")

    def _rel_shift(x):  # kimiyoung/transformer-xl pytorch/mem_transformer.py, zero_triu=False
        zero_pad = torch.zeros((x.size(0), 1, *x.size()[2:]), device=x.device, dtype=x.dtype)
        x_padded = torch.cat([zero_pad, x], dim=1)
        x_padded = x_padded.view(x.size(1) + 1, x.size(0), *x.size()[2:])
        return x_padded[1:].view_as(x)

    x = np.random.default_rng(T * 10 + S).standard_normal((2, 3, T, S))  # (B, H, T, S)
    ref = _rel_shift(torch.from_numpy(x).permute(2, 3, 0, 1).contiguous())  # (T, S, B, H)
    np.testing.assert_array_equal(rel_shift(x), ref.permute(2, 3, 0, 1).numpy())


# ----------------------------------------------------------------------------- R table


def test_relative_embeddings_descending_distances_hand_worked():
    # S = 3, d_model = 4, base = 10000: w = (1, 10000^(-2/4)) = (1, 0.01); rows are distances 2, 1, 0.
    expected = [[math.sin(2), math.sin(0.02), math.cos(2), math.cos(0.02)],
                [math.sin(1), math.sin(0.01), math.cos(1), math.cos(0.01)],
                [0.0, 0.0, 1.0, 1.0]]
    np.testing.assert_allclose(relative_embeddings(3, 4), expected, rtol=0, atol=1e-15)


def test_relative_embeddings_clamp_len_caps_distances():
    # reference: pos_seq.clamp_(max=clamp_len), so distances 4 3 2 1 0 become 2 2 2 1 0
    table = relative_embeddings(5, 6, clamp_len=2)
    for s, n in enumerate([2, 2, 2, 1, 0]):
        np.testing.assert_allclose(table[s], paper_R(n, 6), rtol=0, atol=1e-15)


def test_relative_heads_splits_columns_head_by_head():
    # table [[1, 2]], w_r [[1, 0, 0, 1], [0, 1, 1, 0]] -> table @ w_r = [1, 2, 2, 1];
    # view (S=1, H=2, D=2): head 0 = [1, 2], head 1 = [2, 1].
    r = relative_heads(np.array([[1.0, 2.0]]), np.array([[1.0, 0, 0, 1], [0, 1, 1, 0]]), 2)
    np.testing.assert_array_equal(r, [[[1.0, 2.0]], [[2.0, 1.0]]])


# ----------------------------------------------------------------------------- scores


def test_xl_scores_matches_printed_reference_with_memory():
    # Printed (float64) by faithful copies of the reference PositionalEmbedding, r_net and the score
    # part of RelPartialLearnableMultiHeadAttn.forward (AC + BD, before `mul_(self.scale)`), with
    # mems of length 1, on the inputs of tiny_case(); permuted from (qlen, klen, bsz, n_head) to
    # (n_head, qlen, klen). Entry [h, 0, 2] is outside the causal region (garbage), not compared.
    printed = np.array([[[0.6225317510250006, -0.53125, 0.5],
                         [-0.9468112907943682, -0.5350688484327163, -0.03125]],
                        [[0.7502773222908832, 0.9375, -1.96875],
                         [0.9395822730642214, 1.2559307251859106, -2.21875]]])
    q, k, w_r, u, v = tiny_case()
    r = relative_heads(relative_embeddings(3, 4), w_r, 2)
    mask = causal_mask(2, 3)
    np.testing.assert_allclose(xl_scores(q, k, r, u, v)[:, mask], printed[:, mask], rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(xl_scores_definitional(q, k, w_r, u, v)[:, mask], printed[:, mask], rtol=1e-13)


@pytest.mark.parametrize("M", [0, 1, 3])
def test_xl_scores_equals_the_paper_four_terms(M):
    rng = np.random.default_rng(M)
    B, H, T, D, dm = 2, 2, 3, 2, 6
    q, k, w_r, u, v = random_case(rng, B, H, T, M, D, dm)
    S = T + M
    expected = paper_terms(q, k, w_r, u, v, np.arange(M, S), np.arange(S))
    mask = causal_mask(T, S)
    r = relative_heads(relative_embeddings(S, dm), w_r, H)
    np.testing.assert_allclose(xl_scores(q, k, r, u, v)[..., mask], expected.sum(0)[..., mask], rtol=1e-12)
    np.testing.assert_allclose(position_scores(q, r, v)[..., mask], (expected[1] + expected[3])[..., mask],
                               rtol=1e-12, atol=1e-14)
    terms = xl_terms(q, k, w_r, u, v)
    assert isinstance(terms, XLTerms)
    for got, want in zip(terms, expected):  # every entry: the definitional form has no garbage
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)


def test_definitional_terms_any_sign_of_distance():
    # bidirectional use: unsorted positions, negative distances, S < T
    rng = np.random.default_rng(7)
    q, k, w_r, u, v = random_case(rng, 1, 2, 4, -2, 2, 4)
    qp, kp = np.array([5, 0, 3, -2]), np.array([1, 4])
    expected = paper_terms(q, k, w_r, u, v, qp, kp)
    got = xl_terms(q, k, w_r, u, v, q_positions=qp, k_positions=kp)
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(xl_position_logits(q, v, w_r, qp, kp), expected[1] + expected[3],
                               rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(xl_scores_definitional(q, k, w_r, u, v, q_positions=qp, k_positions=kp),
                               expected.sum(0), rtol=1e-12, atol=1e-14)


def test_xl_scores_matches_live_reference_with_memory():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    B, H, T, M, D, dm = 2, 3, 4, 5, 4, 8
    S = T + M
    q, k, w_r, u, v = random_case(rng, B, H, T, M, D, dm)

    def _rel_shift(x):  # kimiyoung/transformer-xl pytorch/mem_transformer.py RelMultiHeadAttn
        zero_pad = torch.zeros((x.size(0), 1, *x.size()[2:]), device=x.device, dtype=x.dtype)
        x_padded = torch.cat([zero_pad, x], dim=1)
        x_padded = x_padded.view(x.size(1) + 1, x.size(0), *x.size()[2:])
        return x_padded[1:].view_as(x)

    # PositionalEmbedding(pos_seq) with pos_seq = arange(klen-1, -1, -1.0), then r_net (no bias)
    inv_freq = 1 / (10000 ** (torch.arange(0.0, dm, 2.0, dtype=torch.float64) / dm))
    sinusoid_inp = torch.outer(torch.arange(S - 1, -1, -1.0, dtype=torch.float64), inv_freq)
    pos_emb = torch.cat([sinusoid_inp.sin(), sinusoid_inp.cos()], dim=-1)
    r_head_k = (pos_emb @ torch.from_numpy(w_r)).view(S, H, D)
    w_head_q = torch.from_numpy(q).permute(2, 0, 1, 3)  # qlen x bsz x n_head x d_head
    w_head_k = torch.from_numpy(k).permute(2, 0, 1, 3)
    AC = torch.einsum("ibnd,jbnd->ijbn", (w_head_q + torch.from_numpy(u), w_head_k))
    BD = _rel_shift(torch.einsum("ibnd,jnd->ijbn", (w_head_q + torch.from_numpy(v), r_head_k)))
    ref = (AC + BD).permute(2, 3, 0, 1).numpy()  # (B, H, T, S)
    mask = causal_mask(T, S)
    r = relative_heads(relative_embeddings(S, dm), w_r, H)
    np.testing.assert_allclose(xl_scores(q, k, r, u, v)[..., mask], ref[..., mask], rtol=1e-12, atol=1e-13)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(0, 6), st.integers(1, 3), st.sampled_from([1, 2, 4]),
       st.sampled_from([2, 4, 8]), st.integers(0, 2**31 - 1))
def test_efficient_equals_definitional_where_causal(T, M, H, D, dm, seed):
    q, k, w_r, u, v = random_case(np.random.default_rng(seed), 2, H, T, M, D, dm)
    S = T + M
    mask = causal_mask(T, S)
    r = relative_heads(relative_embeddings(S, dm), w_r, H)
    definitional = xl_scores_definitional(q, k, w_r, u, v)
    np.testing.assert_allclose(xl_scores(q, k, r, u, v)[..., mask], definitional[..., mask], rtol=1e-10, atol=1e-10)
    gathered = xl_position_logits(q, v, w_r, np.arange(M, S), np.arange(S))
    np.testing.assert_allclose(position_scores(q, r, v)[..., mask], gathered[..., mask], rtol=1e-10, atol=1e-10)
    # clamp_len: the reference clamps pos_seq, the definitional form clamps i - j
    r2 = relative_heads(relative_embeddings(S, dm, clamp_len=2), w_r, H)
    np.testing.assert_allclose(xl_scores(q, k, r2, u, v)[..., mask],
                               xl_scores_definitional(q, k, w_r, u, v, clamp_len=2)[..., mask],
                               rtol=1e-10, atol=1e-10)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 5), st.integers(0, 5), st.integers(0, 2**31 - 1))
def test_position_part_depends_only_on_distance(T, M, seed):
    # with q = 0 the position scores are v . W_R R_{(M+i)-j}: constant along each diagonal i - j
    S = T + M
    rng = np.random.default_rng(seed)
    r = relative_heads(relative_embeddings(S, 4), rng.standard_normal((4, 2)), 1)
    out = position_scores(np.zeros((1, T, 2)), r, rng.standard_normal((1, 2)))[0]
    for i in range(1, T):
        for j in range(1, i + M + 1):
            assert out[i, j] == pytest.approx(out[i - 1, j - 1], abs=1e-12)


def test_float32_in_float32_out():
    q, k, w_r, u, v = random_case(np.random.default_rng(0), 1, 2, 3, 2, 2, 4, dtype=np.float32)
    r = relative_heads(relative_embeddings(5, 4).astype(np.float32), w_r, 2)
    assert rel_shift(k[0, 0].T).dtype == np.float32  # (D, S) read as (T, S)
    assert xl_scores(q, k, r, u, v).dtype == np.float32
    assert xl_position_logits(q, v, w_r, np.arange(2, 5), np.arange(5)).dtype == np.float32
    assert xl_scores_definitional(q, k, w_r, u, v).dtype == np.float32


# ----------------------------------------------------------------------------- errors


def test_shift_rejects_fewer_keys_than_queries():
    with pytest.raises(ValueError, match=r"x must have S >= T"):
        rel_shift(np.zeros((3, 2)))
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., T, S\)"):
        rel_shift(np.zeros(3))
    q, k, w_r, u, v = random_case(np.random.default_rng(0), 1, 2, 3, 0, 2, 4)
    r = relative_heads(relative_embeddings(3, 4), w_r, 2)
    with pytest.raises(ValueError, match=r"k must have S >= T"):
        xl_scores(q, k[..., :2, :], r[:, :2], u, v)


@pytest.mark.parametrize("name,bad", [
    ("q", lambda q, k, r, u, v: (q[0, 0], k, r, u, v)),
    ("k", lambda q, k, r, u, v: (q, k[..., :1], r, u, v)),
    ("k", lambda q, k, r, u, v: (q, k[:, :1], r, u, v)),
    ("r", lambda q, k, r, u, v: (q, k, r[:, :-1], u, v)),
    ("r", lambda q, k, r, u, v: (q, k, r[:1], u, v)),
    ("u", lambda q, k, r, u, v: (q, k, r, u[:1], v)),
    ("v", lambda q, k, r, u, v: (q, k, r, u, v[:, :1])),
])
def test_xl_scores_shape_errors_name_the_argument(name, bad):
    q, k, w_r, u, v = random_case(np.random.default_rng(0), 1, 2, 3, 2, 2, 4)
    r = relative_heads(relative_embeddings(5, 4), w_r, 2)
    with pytest.raises(ValueError, match=rf"^{name} must have shape"):
        xl_scores(*bad(q, k, r, u, v))


def test_definitional_and_table_errors():
    q, k, w_r, u, v = random_case(np.random.default_rng(0), 1, 2, 3, 2, 2, 4)
    with pytest.raises(ValueError, match=r"^w_r must have shape"):
        xl_terms(q, k, w_r[:, :3], u, v)
    with pytest.raises(ValueError, match=r"^w_r must have shape"):
        xl_terms(q, k, np.zeros((3, 4)), u, v)  # odd d_model: no [sin | cos] table
    with pytest.raises(ValueError, match=r"q_positions must have (shape|length)"):
        xl_terms(q, k, w_r, u, v, q_positions=np.arange(4))
    with pytest.raises(ValueError, match=r"q_positions must hold integers"):
        xl_position_logits(q, v, w_r, np.array([0.5, 1, 2]), np.arange(5))
    with pytest.raises(ValueError, match=r"q must be finite"):
        xl_scores_definitional(np.full_like(q, np.nan), k, w_r, u, v)
    with pytest.raises(ValueError, match=r"d_model must be even"):
        relative_embeddings(4, 5)
    with pytest.raises(ValueError, match=r"clamp_len must be an integer >= 1"):
        relative_embeddings(4, 4, clamp_len=0)
    with pytest.raises(ValueError, match=r"w_r must have H\*D columns"):
        relative_heads(np.zeros((3, 4)), np.zeros((4, 5)), 2)
    with pytest.raises(ValueError, match=r"do not match"):
        relative_heads(np.zeros((3, 4)), np.zeros((6, 4)), 2)
