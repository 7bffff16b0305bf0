"""Tests of minipos.deberta.

Expected values come from values printed by transformers 5.24.0
(``models/deberta_v2/modeling_deberta_v2.py``: ``make_log_bucket_position``,
``build_relative_position``) and pasted as literals, from hand-worked small cases (in the
comments), from a naive loop over (h, i, j) that evaluates Eq. 3-4 of He et al. 2021
(arXiv:2006.03654) term by term, and, when torch is installed, from transformers'
``DisentangledSelfAttention`` itself on a tiny random config with its weights copied.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minipos.attention import softmax
from minipos.deberta import (
    build_relative_position,
    c2p_term,
    disentangled_scores,
    disentangled_scores_definitional,
    make_log_bucket_position,
    p2c_term,
    relative_index,
    relative_positions,
    spans_from_config,
)


# ----------------------------------------------------------------------------- helpers


def delta(i, j, k):
    """Eq. 3 of the paper, written out: 0 if i - j <= -k, 2k - 1 if i - j >= k, else i - j + k."""
    if i - j <= -k:
        return 0
    if i - j >= k:
        return 2 * k - 1
    return i - j + k


def paper_terms(q, k, pos_key, pos_query, rel, att_span, p2c="code"):
    """(c2c, c2p, p2c) by a naive loop; ``rel[i][j]`` is the (bucketed) i - j of the pair.

    c2p = Q^c_i . K^r_delta(i,j); p2c = K^c_j . Q^r_delta(i,j) as the reference code does, or
    K^c_j . Q^r_delta(j,i) as Eq. 4 writes it (``p2c="paper"``; delta(j, i) uses rel(j, i) = -rel(i, j)).
    """
    H, T, D = q.shape
    S = k.shape[1]
    out = np.zeros((3, H, T, S))
    for h in range(H):
        for i in range(T):
            for j in range(S):
                r = int(rel[i][j])
                d_ij = delta(r, 0, att_span)
                d_ji = delta(-r, 0, att_span)
                out[0, h, i, j] = sum(q[h, i, c] * k[h, j, c] for c in range(D))
                out[1, h, i, j] = sum(q[h, i, c] * pos_key[h, d_ij, c] for c in range(D))
                d = d_ij if p2c == "code" else d_ji
                out[2, h, i, j] = sum(k[h, j, c] * pos_query[h, d, c] for c in range(D))
    return out


def random_case(rng, H=2, T=5, S=5, D=3, att_span=3, lead=()):
    q = rng.standard_normal((*lead, H, T, D))
    k = rng.standard_normal((*lead, H, S, D))
    pk = rng.standard_normal((H, 2 * att_span, D))
    pq = rng.standard_normal((H, 2 * att_span, D))
    return q, k, pk, pq


# ----------------------------------------------------------------------------- log buckets


# Printed by transformers 5.24.0 make_log_bucket_position(torch.tensor(r), 256, 512).long()
# (DeBERTa v3: position_buckets=256, max_relative_positions=512).
V3_R = [0, 1, -1, 127, 128, 129, 130, -129, -130, 200, 255, 256, 257, 300, 511, 512, 513,
        1000, 4096, -4096, 100000]
V3_BUCKET = [0, 1, -1, 127, 128, 129, 130, -129, -130, 169, 192, 192, 192, 207, 255, 256, 256,
             317, 446, -446, 740]


def test_log_buckets_match_transformers_v3():
    np.testing.assert_array_equal(make_log_bucket_position(np.array(V3_R), 256, 512), V3_BUCKET)


def test_log_buckets_scalar_and_shape_kept():
    assert make_log_bucket_position(200, 256, 512) == 169  # printed value above
    out = make_log_bucket_position(np.array(V3_R).reshape(3, 7), 256, 512)
    assert out.shape == (3, 7) and out.dtype == np.int64
    np.testing.assert_array_equal(out.ravel(), V3_BUCKET)


def test_log_bucket_first_merge_by_hand():
    # mid = 128, scale = ln(511/128) = 1.384338. |r| = 131: ln(131/128) = 0.023167,
    # 0.023167 / 1.384338 * 127 = 2.1253, ceil 3 -> 131. |r| = 132: ln(1.03125) = 0.030772,
    # * 127 / 1.384338 = 2.8230, ceil 3 -> 131 too: the first merged pair. |r| = 129: 0.7138 -> 129.
    got = make_log_bucket_position(np.array([128, 129, 131, 132, -132]), 256, 512)
    np.testing.assert_array_equal(got, [128, 129, 131, 131, -131])
    r = np.arange(-131, 132)
    np.testing.assert_array_equal(make_log_bucket_position(r, 256, 512), r)


def test_log_bucket_float32_and_float64_differ_far_out():
    # float32: printed by transformers 5.24.0 make_log_bucket_position (torch float32).
    # float64: microsoft/DeBERTa da_utils.make_log_bucket_position (NumPy float64), run as
    # published with np.int replaced by np.int64.
    r = np.array([65317, -83928, 92579])
    np.testing.assert_array_equal(make_log_bucket_position(r, 256, 512), [700, -723, 732])
    np.testing.assert_array_equal(make_log_bucket_position(r, 256, 512, precision="float64"),
                                  [701, -724, 733])


def test_build_relative_position_by_hand():
    # query - key: entry (i, j) = i - j.
    np.testing.assert_array_equal(
        build_relative_position(3, 5),
        [[0, -1, -2, -3, -4], [1, 0, -1, -2, -3], [2, 1, 0, -1, -2]],
    )
    assert build_relative_position(0, 4).shape == (0, 4)


def test_build_relative_position_bucketed_matches_transformers():
    # Printed by transformers 5.24.0 build_relative_position(q (.., 3, .), k (.., 600, .), 256, 512)
    # [0, 2, cols] for cols = 0, 1, 2, 3, 100, 131, 134, 135, 300, 400, 599.
    rel = build_relative_position(3, 600, bucket_size=256, max_position=512)
    cols = [0, 1, 2, 3, 100, 131, 134, 135, 300, 400, 599]
    np.testing.assert_array_equal(rel[2, cols], [2, 1, 0, -1, -98, -129, -131, -132, -206, -233, -270])


def test_bucketing_needs_both_sizes_positive():
    # As in the reference: bucket only when bucket_size > 0 and max_position > 0.
    np.testing.assert_array_equal(build_relative_position(1, 300, bucket_size=256)[0, 299], -299)
    np.testing.assert_array_equal(build_relative_position(1, 300, max_position=512)[0, 299], -299)


def test_relative_positions_of_a_cached_step():
    # Two new queries at positions 5, 6 against keys 0..6 (cache of 5): entry q - k.
    np.testing.assert_array_equal(
        relative_positions([5, 6], 7),
        [[5, 4, 3, 2, 1, 0, -1], [6, 5, 4, 3, 2, 1, 0]],
    )
    # The last query row of a full build equals the cached step's single row.
    full = build_relative_position(300, 300, bucket_size=256, max_position=512)
    step = relative_positions([299], 300, bucket_size=256, max_position=512)
    np.testing.assert_array_equal(step[0], full[299])


def test_spans_from_config():
    # DeBERTa-v3 config.json: position_buckets 256, max_relative_positions -1,
    # max_position_embeddings 512 -> HF pos_ebd_size 256, max_relative_positions 512.
    assert spans_from_config(position_buckets=256, max_relative_positions=-1) == (256, 512, 256)
    # DeBERTa v1 base: no buckets, max_relative_positions -1 -> a 2 * 512 table.
    assert spans_from_config() == (-1, 512, 512)
    assert spans_from_config(max_relative_positions=128, max_position_embeddings=1024) == (-1, 128, 128)


# ----------------------------------------------------------------------------- the three terms


def test_relative_index_is_eq3():
    k = 3
    r = np.arange(-6, 7)
    np.testing.assert_array_equal(relative_index(r, k), [delta(int(x), 0, k) for x in r])
    # hand-worked: -3 -> 0, -2 -> 1, 0 -> 3, 2 -> 5, 3 -> 5
    np.testing.assert_array_equal(relative_index([-3, -2, 0, 2, 3], k), [0, 1, 3, 5, 5])


@pytest.mark.parametrize("T,S,span,buckets", [(5, 5, 3, None), (4, 7, 2, None), (9, 9, 4, (4, 8))])
def test_terms_match_paper_loop(T, S, span, buckets):
    rng = np.random.default_rng(T * 100 + S)
    q, k, pk, pq = random_case(rng, H=2, T=T, S=S, D=3, att_span=span)
    if buckets:
        rel = build_relative_position(T, S, bucket_size=buckets[0], max_position=buckets[1])
    else:
        rel = relative_positions(np.arange(S - T, S), S)  # queries are the last T positions
    ref = paper_terms(q, k, pk, pq, rel, span)
    np.testing.assert_allclose(c2p_term(q, pk, rel, span), ref[1], rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(p2c_term(k, pq, rel, span), ref[2], rtol=1e-12, atol=1e-12)
    want = ref.sum(axis=0) / math.sqrt(3 * 3)  # sqrt(D (1 + 2)), D = 3
    got = disentangled_scores(q, k, pk, pq, rel, att_span=span)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(
        disentangled_scores_definitional(q, k, pk, pq, rel, att_span=span), want, rtol=1e-12, atol=1e-12)


def test_single_position_term_scale():
    # With only c2p the code's scale_factor is 2: (c2c + c2p) / sqrt(2 D).
    rng = np.random.default_rng(1)
    q, k, pk, pq = random_case(rng, T=4, S=4, D=5, att_span=2)
    rel = build_relative_position(4, 4)
    ref = paper_terms(q, k, pk, pq, rel, 2)
    got = disentangled_scores(q, k, pk, None, rel, att_span=2, pos_att_type="c2p")
    np.testing.assert_allclose(got, (ref[0] + ref[1]) / math.sqrt(10), rtol=1e-12)
    got = disentangled_scores(q, k, None, pq, rel, att_span=2, pos_att_type=["p2c"])
    np.testing.assert_allclose(got, (ref[0] + ref[2]) / math.sqrt(10), rtol=1e-12)
    got = disentangled_scores(q, k, None, None, rel, att_span=2, pos_att_type=())
    np.testing.assert_allclose(got, ref[0] / math.sqrt(5), rtol=1e-12)


def test_p2c_index_counterexample_code_vs_paper():
    # One head, D = 1, k_j = 1 and pos_query row r holds r, so p2c(i, j) is the row index used.
    # att_span 2, T = S = 3. Code: clip(i - j + 2, 0, 3); paper Eq. 4: clip(j - i + 2, 0, 3).
    k = np.ones((1, 3, 1))
    pos_query = np.arange(4.0).reshape(1, 4, 1)
    rel = build_relative_position(3, 3)
    code = [[2, 1, 0], [3, 2, 1], [3, 3, 2]]
    paper = [[2, 3, 3], [1, 2, 3], [0, 1, 2]]
    np.testing.assert_array_equal(p2c_term(k, pos_query, rel, 2)[0], code)
    q = np.zeros((1, 3, 1))
    kw = dict(att_span=2, pos_att_type=("p2c",))
    sq2 = math.sqrt(2)  # sqrt(D (1 + 1)); c2c = 0 since q = 0
    np.testing.assert_allclose(disentangled_scores_definitional(q, k, None, pos_query, rel, **kw)[0],
                               np.array(code) / sq2)
    np.testing.assert_allclose(
        disentangled_scores_definitional(q, k, None, pos_query, rel, p2c_convention="paper", **kw)[0],
        np.array(paper) / sq2)


def test_paper_convention_matches_paper_loop():
    rng = np.random.default_rng(7)
    q, k, pk, pq = random_case(rng, T=6, S=6, att_span=2)
    rel = build_relative_position(6, 6)
    ref = paper_terms(q, k, pk, pq, rel, 2, p2c="paper")
    got = disentangled_scores_definitional(q, k, pk, pq, rel, att_span=2, p2c_convention="paper")
    np.testing.assert_allclose(got, ref.sum(axis=0) / 3.0, rtol=1e-12)


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 6), extra=st.integers(0, 4), span=st.integers(1, 5), D=st.integers(1, 4),
       batch=st.integers(1, 2), seed=st.integers(0, 2**16))
def test_efficient_equals_definitional(T, extra, span, D, batch, seed):
    rng = np.random.default_rng(seed)
    S = T + extra
    q, k, pk, pq = random_case(rng, H=2, T=T, S=S, D=D, att_span=span, lead=(batch,))
    rel = relative_positions(np.arange(extra, S), S)
    np.testing.assert_allclose(
        disentangled_scores(q, k, pk, pq, rel, att_span=span),
        disentangled_scores_definitional(q, k, pk, pq, rel, att_span=span), rtol=1e-12, atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(shift=st.integers(0, 50), seed=st.integers(0, 2**16))
def test_position_terms_depend_on_i_minus_j_only(shift, seed):
    # The same content at positions shifted by a constant gives the same logits.
    rng = np.random.default_rng(seed)
    q, k, pk, pq = random_case(rng, T=4, S=4, att_span=3)
    base = np.arange(4)
    a = disentangled_scores(q, k, pk, pq, relative_positions(base, base), att_span=3)
    b = disentangled_scores(q, k, pk, pq, relative_positions(base + shift, base + shift), att_span=3)
    np.testing.assert_array_equal(a, b)


def test_float32_in_float32_out():
    rng = np.random.default_rng(2)
    q, k, pk, pq = (a.astype(np.float32) for a in random_case(rng, T=3, S=3))
    rel = build_relative_position(3, 3)
    out = disentangled_scores(q, k, pk, pq, rel, att_span=3)
    assert out.dtype == np.float32
    ref = paper_terms(q.astype(np.float64), k.astype(np.float64), pk.astype(np.float64),
                      pq.astype(np.float64), rel, 3).sum(axis=0) / 3.0
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------------------- errors


def test_errors_name_the_argument():
    rng = np.random.default_rng(3)
    q, k, pk, pq = random_case(rng, T=3, S=3, att_span=2)
    rel = build_relative_position(3, 3)
    with pytest.raises(ValueError, match="att_span"):
        disentangled_scores(q, k, pk, pq, rel, att_span=0)
    with pytest.raises(TypeError, match="att_span"):
        c2p_term(q, pk, rel, 2.5)
    with pytest.raises(ValueError, match="pos_key"):
        disentangled_scores(q, k, pk, pq, rel, att_span=3)  # table has 4 rows, not 6
    with pytest.raises(ValueError, match="pos_query"):
        p2c_term(k, pq[:, :, :2], rel, 2)
    with pytest.raises(ValueError, match="pos_key"):
        c2p_term(q, pk[:1], rel, 2)  # one head, q has two
    with pytest.raises(ValueError, match="relative_pos"):
        disentangled_scores(q, k, pk, pq, build_relative_position(3, 4), att_span=2)
    with pytest.raises(ValueError, match="relative_pos"):
        c2p_term(q, pk, rel[0], 2)
    with pytest.raises(ValueError, match="pos_att_type"):
        disentangled_scores(q, k, pk, pq, rel, att_span=2, pos_att_type=("c2p", "p2p"))
    with pytest.raises(ValueError, match="pos_att_type"):
        disentangled_scores(q, k, pk, pq, rel, att_span=2, pos_att_type=("c2p", "c2p"))
    with pytest.raises(ValueError, match="q .* k"):
        disentangled_scores(q, k[..., :2], pk, pq, rel, att_span=2)
    with pytest.raises(ValueError, match="p2c_convention"):
        disentangled_scores_definitional(q, k, pk, pq, rel, att_span=2, p2c_convention="x")
    with pytest.raises(ValueError, match="relative_pos"):
        relative_index([0.5], 2)
    with pytest.raises(ValueError, match="q"):
        c2p_term(np.full((2, 3, 2), np.nan), pk, rel, 2)


def test_bucket_config_errors():
    with pytest.raises(ValueError, match="max_position"):
        make_log_bucket_position([1, 300], 256, 129)  # log((129 - 1) / 128) = 0
    with pytest.raises(ValueError, match="bucket_size"):
        make_log_bucket_position([1], 1, 512)
    with pytest.raises(ValueError, match="precision"):
        make_log_bucket_position([1], 256, 512, precision="float16")
    with pytest.raises(ValueError, match="q_positions"):
        relative_positions([-1, 0], 3)
    with pytest.raises(ValueError, match="q_len"):
        build_relative_position(-1, 3)


# ----------------------------------------------------------------------------- transformers


def _hf_case(pos_att_type, position_buckets, max_rel, T=12, seed=0):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import DebertaV2Config
    from transformers.models.deberta_v2.modeling_deberta_v2 import (
        DisentangledSelfAttention,
        build_relative_position as hf_build,
    )

    torch.manual_seed(seed)
    cfg = DebertaV2Config(
        hidden_size=8, num_attention_heads=2, intermediate_size=16, position_buckets=position_buckets,
        max_relative_positions=max_rel, max_position_embeddings=16, relative_attention=True,
        pos_att_type=list(pos_att_type), share_att_key=True, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    att = DisentangledSelfAttention(cfg).double().eval()
    span = att.pos_ebd_size
    x = torch.randn(2, T, 8, dtype=torch.float64)
    rel_emb = torch.randn(2 * span, 8, dtype=torch.float64)
    rp = hf_build(x, x, bucket_size=att.position_buckets, max_position=att.max_relative_positions)
    with torch.no_grad():
        _, probs = att(x, torch.ones(2, 1, T, T, dtype=torch.bool), output_attentions=True,
                       relative_pos=rp, rel_embeddings=rel_emb)
    w = {n: p.detach().numpy() for n, p in att.named_parameters()}

    def heads(a, name):  # nn.Linear: x @ W.T + b, then split into (H, ., D)
        y = a @ w[name + ".weight"].T + w[name + ".bias"]
        return y.reshape(*y.shape[:-1], 2, 4).swapaxes(-2, -3)

    xn, re = x.numpy(), rel_emb.numpy()
    parts = dict(q=heads(xn, "query_proj"), k=heads(xn, "key_proj"),
                 pos_key=heads(re, "key_proj"), pos_query=heads(re, "query_proj"))
    return att, span, rp[0].numpy(), probs.numpy(), parts


@pytest.mark.parametrize("pos_att_type", [("p2c", "c2p"), ("c2p",), ("p2c",)])
@pytest.mark.parametrize("buckets,max_rel", [(4, 8), (-1, 5)])
def test_matches_transformers_disentangled_self_attention(pos_att_type, buckets, max_rel):
    att, span, hf_rel, probs, p = _hf_case(pos_att_type, buckets, max_rel)
    assert (buckets, max_rel, span) == spans_from_config(
        position_buckets=buckets, max_relative_positions=max_rel, max_position_embeddings=16)
    T = hf_rel.shape[0]
    rel = build_relative_position(T, T, bucket_size=buckets, max_position=max_rel)
    np.testing.assert_array_equal(rel, hf_rel)
    scores = disentangled_scores(p["q"], p["k"], p["pos_key"], p["pos_query"], rel,
                                 att_span=span, pos_att_type=pos_att_type)
    # HF rounds its scale sqrt(D * factor) to float32, hence ~1e-8 rather than 1e-15.
    np.testing.assert_allclose(softmax(scores), probs, rtol=0, atol=1e-7)
    if "p2c" in pos_att_type:  # the paper's p2c index does not reproduce the model
        paper = disentangled_scores_definitional(p["q"], p["k"], p["pos_key"], p["pos_query"], rel,
                                                 att_span=span, pos_att_type=pos_att_type,
                                                 p2c_convention="paper")
        assert np.abs(softmax(paper) - probs).max() > 1e-3
