"""A mask per query head, ``(B, H, T, S)`` (MiniMax M3's block-sparse layers pick key blocks per key/value head).
Expected values come from the layer's own ``(B, T, S)`` path, one head at a time: with ``d_model = H * D`` and
``wo = I`` the output's columns ``h D ... (h + 1) D`` are head ``h``'s, so a per-head mask must give head ``h`` what
the shared mask ``m_h`` gives it. Then the blockwise and fast paths, the backward, and bad shapes; and
``minipos.dsa``'s ``block_picks`` and ``block_mask`` (MiniMax M3's indexer), by hand and against transformers'."""

import numpy as np
import pytest

import minipos.fast
from minipos.layer import MultiHeadAttention, Rotary

from _gradcheck import check_layer_gradients

B, H, T, D = 2, 3, 7, 4


def _layer(**kw):
    layer = MultiHeadAttention(H * D, H, num_kv_heads=1, head_dim=D, scheme=Rotary(layout="half"), seed=3, **kw)
    layer.wo = np.eye(H * D)
    return layer


def _masks():
    rng = np.random.default_rng(4)
    m = rng.random((B, H, T, T)) < 0.6
    m[..., np.arange(T), np.arange(T)] = True                          # every query sees itself
    return m


def test_each_head_gets_its_own_mask():
    layer, m = _layer(), _masks()
    x = np.random.default_rng(5).standard_normal((B, T, H * D))
    got = layer(x, mask=m, causal=True)
    for h in range(H):
        alone = layer(x, mask=m[:, h], causal=True)                     # the (B, T, S) path, every head
        np.testing.assert_allclose(got[..., h * D:(h + 1) * D], alone[..., h * D:(h + 1) * D], rtol=1e-13, atol=1e-14)
    assert np.max(np.abs(got - layer(x, mask=m[:, 0], causal=True))) > 1e-3   # the masks differ: so do the heads


@pytest.mark.parametrize("block", [2, 3])
def test_blockwise_and_fast_layers_equal_the_dense_one(block):
    m, x = _masks(), np.random.default_rng(6).standard_normal((B, T, H * D))
    want = _layer()(x, mask=m, causal=True)
    np.testing.assert_allclose(_layer(block_size=block)(x, mask=m, causal=True), want, rtol=1e-12, atol=1e-13)
    fast = minipos.fast.MultiHeadAttention(H * D, H, num_kv_heads=1, head_dim=D, scheme=Rotary(layout="half"), seed=3,
                                           block_size=block)
    fast.wo = np.eye(H * D)
    np.testing.assert_allclose(fast(x, mask=m, causal=True), want, rtol=1e-12, atol=1e-13)


def test_backward_with_a_mask_per_head_matches_finite_differences():
    rng = np.random.default_rng(7)
    layer, m = _layer(), _masks()
    x, dy = rng.standard_normal((B, T, H * D)), rng.standard_normal((B, T, H * D))
    check_layer_gradients(layer, x, dy, lambda x, **kw: layer(x, mask=m, causal=True, **kw), rng)


@pytest.mark.parametrize("shape", [(B, H + 1, T, T), (B, 1, T, T), (H, T, T), (B, H, T, T + 1)])
def test_other_shapes_are_named(shape):
    with pytest.raises(ValueError, match=r"\(B, H, T, S\) = \(2, 3, 7, 7\)"):
        _layer()(np.zeros((B, T, H * D)), mask=np.ones(shape, bool), causal=True)


# --- minipos.dsa.block_mask: MiniMax M3's picked key blocks as that mask ----------------------------------------

def test_block_mask_by_hand():
    # Blocks of 2 keys over S = 3 (blocks {0, 1} and {2}); query 0 picks block 0 (and an unused -1), query 1 blocks
    # 1 and 0: rows (1, 1, 0) and (1, 1, 1); one group, so both query heads get them.
    from minipos.dsa import block_mask
    got = block_mask(np.array([[[[0, -1], [1, 0]]]]), block_size=2, num_heads=2, keys=3)
    assert got.shape == (1, 2, 2, 3)
    np.testing.assert_array_equal(got[0, 0], [[True, True, False], [True, True, True]])
    np.testing.assert_array_equal(got[0, 1], got[0, 0])
    # two groups over four heads: heads 0, 1 follow group 0, heads 2, 3 group 1
    two = block_mask(np.array([[[[0]], [[1]]]]), block_size=2, num_heads=4, keys=4)
    assert [two[0, h, 0].tolist() for h in range(4)] == \
        [[True, True, False, False]] * 2 + [[False, False, True, True]] * 2


@pytest.mark.parametrize("picks, words", [
    (np.zeros((1, 1, 2, 1)), "integer"), (np.zeros((1, 2, 1), int), "integer"),
    (np.full((1, 1, 2, 1), 2), "block indices in"), (np.full((1, 1, 2, 1), -2), "block indices in"),
    (np.zeros((1, 3, 2, 1), int), "dividing num_heads"),
])
def test_block_mask_bad_picks_are_named(picks, words):
    from minipos.dsa import block_mask
    with pytest.raises(ValueError, match=words):
        block_mask(picks, block_size=2, num_heads=4, keys=4)


def test_block_mask_is_transformers_build_block_mask():
    # MiniMaxM3VLIndexer.build_block_mask (no attention mask given) keeps the picked blocks of each group's heads and
    # the causal keys; block_mask and the layer's causal=True are the same two rules.
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.minimax_m3_vl import configuration_minimax_m3_vl as cm, modeling_minimax_m3_vl as mm

    from minipos.dsa import block_mask
    cfg = cm.MiniMaxM3VLTextConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=4,
                                   index_n_heads=2, index_head_dim=4, index_block_size=3, index_topk_blocks=2)
    indexer = mm.MiniMaxM3VLIndexer(cfg, 0)
    rng, S = np.random.default_rng(9), 10
    picks = rng.integers(-1, 4, (2, 2, S, 2))
    hf = indexer.build_block_mask(torch.from_numpy(picks), None, S, torch.float64, "cpu",
                                  torch.arange(S)[None].expand(2, -1)).numpy() == 0
    ours = block_mask(picks, block_size=3, num_heads=4, keys=S) & np.tril(np.ones((S, S), bool))
    np.testing.assert_array_equal(ours, hf)


def test_block_picks_by_hand():
    # One query head, blocks of 2 over S = 5 keys: (0, 1), (2, 3), (4). Keys k_s = s e_0, query q = e_0 at every
    # position, so a key's score is its slot s: block 0 scores 1 (or 0 for query 0, which sees key 0 only), block 1
    # scores 3, block 2 scores 4 once seen. local_blocks 1: the query's own block always wins (+inf), then the best
    # other; a block of future keys only is -1. Query 3 (block 1): its own block 1, then block 0 -> (1, 0).
    from minipos.dsa import block_picks
    k = np.zeros((1, 5, 2))
    k[0, :, 0] = np.arange(5)
    q = np.zeros((1, 1, 5, 2))
    q[..., 0] = 1.0
    got = block_picks(q, k, np.arange(5), block_size=2, topk_blocks=2, local_blocks=1)
    assert got[0, 0].tolist() == [[0, -1], [0, -1], [1, 0], [1, 0], [2, 1]]
    no_local = block_picks(q, k, np.arange(5), block_size=2, topk_blocks=1, local_blocks=0)
    assert no_local[0, 0, :, 0].tolist() == [0, 0, 1, 1, 2]                  # the best seen block: the latest here


def test_block_picks_are_transformers_indexers():
    # MiniMaxM3VLIndexer.forward: its normed, rotated q and k (computed here as its forward computes them) scored,
    # pooled per block, the local blocks boosted, the top blocks kept; the picks compared as sets (torch's topk
    # orders ties as it likes).
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.minimax_m3_vl import configuration_minimax_m3_vl as cm, modeling_minimax_m3_vl as mm

    from minipos.dsa import block_picks
    cfg = cm.MiniMaxM3VLTextConfig(hidden_size=16, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   index_n_heads=2, index_head_dim=8, index_block_size=3, index_topk_blocks=2,
                                   index_local_blocks=1, rope_parameters={"rope_type": "default", "rope_theta": 100.0})
    torch.manual_seed(0)
    indexer = mm.MiniMaxM3VLIndexer(cfg, 0).double()
    S = 11
    h = torch.from_numpy(np.random.default_rng(10).standard_normal((2, S, 16)))
    pos = torch.arange(S)[None].expand(2, -1)
    cos, sin = mm.MiniMaxM3VLRotaryEmbedding(cfg)(h, pos)
    want = indexer(h, (cos, sin), None, pos).numpy()
    with torch.no_grad():
        q = indexer.q_norm(indexer.q_proj(h).view(2, S, -1, 8)).transpose(1, 2)
        k = indexer.k_norm(indexer.k_proj(h).view(2, S, 1, 8)).transpose(1, 2)
        q, k = mm.apply_rotary_pos_emb(q, k, cos[..., :8], sin[..., :8])
    got = block_picks(q.numpy(), k[:, 0].numpy(), np.arange(S), block_size=3, topk_blocks=2, local_blocks=1)
    assert got.shape == want.shape
    for index in np.ndindex(got.shape[:3]):
        assert set(got[index].tolist()) == set(want[index].tolist()), index


@pytest.mark.parametrize("q, k, positions, words", [
    (np.zeros((1, 5, 2)), np.zeros((1, 5, 2)), np.arange(5), "q must be"),
    (np.zeros((1, 1, 5, 2)), np.zeros((1, 5, 3)), np.arange(5), "same B and D"),
    (np.zeros((1, 1, 5, 2)), np.zeros((1, 5, 2)), np.arange(4), "q_positions"),
    (np.zeros((1, 1, 5, 2)), np.zeros((1, 5, 2)), np.arange(5) - 1, "q_positions"),
    (np.zeros((1, 1, 5, 2)), np.zeros((1, 5, 2)), np.arange(5.0), "q_positions"),
])
def test_block_picks_bad_input_is_named(q, k, positions, words):
    from minipos.dsa import block_picks
    with pytest.raises(ValueError, match=words):
        block_picks(q, k, positions, block_size=2, topk_blocks=2)
