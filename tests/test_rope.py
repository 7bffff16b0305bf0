"""Tests for minipos.rope: hand-worked rotations, invariants, and reference implementations."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from minipos.rope import (
    apply_rope,
    half_to_interleaved_weights,
    interleaved_to_half_weights,
    inverse_layout_permutation,
    layout_permutation,
    rope_angles,
    rope_inv_freq,
    rotate_every_two,
    rotate_half,
    rotation_matrix,
)

# cos/sin of 1 and 0.01 rad (Python's math.cos / math.sin, i.e. correctly rounded libm values)
C1, S1 = 0.5403023058681398, 0.8414709848078965
C01, S01 = 0.9999500004166653, 0.009999833334166664

LAYOUTS = ["interleaved", "half"]


# --- frequencies and angles (hand-worked) ----------------------------------------------------

def test_inv_freq_is_base_to_the_minus_2i_over_dim():
    # θ_i = 10000^(-2i/D): D=4 -> 10000^0, 10000^(-1/2); D=8 -> 10000^(0, -1/4, -1/2, -3/4)
    np.testing.assert_allclose(rope_inv_freq(4), [1.0, 0.01], rtol=1e-15)
    np.testing.assert_allclose(rope_inv_freq(8), [1.0, 0.1, 0.01, 0.001], rtol=1e-15)
    np.testing.assert_allclose(rope_inv_freq(4, base=100.0), [1.0, 0.1], rtol=1e-15)
    assert rope_inv_freq(8).dtype == np.float64


def test_angles_are_the_outer_product_and_allow_negative_positions():
    np.testing.assert_allclose(
        rope_angles([0, 1, 3, -2], [1.0, 0.01]),
        [[0.0, 0.0], [1.0, 0.01], [3.0, 0.03], [-2.0, -0.02]], rtol=1e-15,
    )
    np.testing.assert_array_equal(rope_angles(3, [2.0]), [[0.0], [2.0], [4.0]])  # int n = arange(n)


def test_angles_are_float64_even_for_float32_frequencies():
    # 2^24 + 1 = 16777217 is not a float32 (it rounds to 16777216), nor 4097 a bfloat16 (see below)
    angles = rope_angles(np.array([16777217], dtype=np.int64), np.array([1.0], dtype=np.float32))
    assert angles.dtype == np.float64
    assert angles[0, 0] == 16777217.0


def test_neighbouring_long_positions_get_distinct_angles():
    # bfloat16 has 8 significant bits, so 4097 rounds to 4096 there (torch 2.13.0 prints
    # torch.tensor(4097.0, dtype=torch.bfloat16).item() -> 4096.0); float64 angles keep them apart
    angles = rope_angles([4096, 4097], rope_inv_freq(4))
    np.testing.assert_allclose(angles[1] - angles[0], [1.0, 0.01], rtol=1e-12)


# --- the definitional R(m) (hand-worked) ------------------------------------------------------

def test_rotation_matrix_d2_position_1():
    np.testing.assert_allclose(rotation_matrix(1, 2), [[C1, -S1], [S1, C1]], rtol=1e-15)
    np.testing.assert_allclose(rotation_matrix(1, 2, layout="half"), [[C1, -S1], [S1, C1]], rtol=1e-15)


def test_rotation_matrix_d4_position_1_both_layouts():
    interleaved = [[C1, -S1, 0, 0],
                   [S1, C1, 0, 0],
                   [0, 0, C01, -S01],
                   [0, 0, S01, C01]]
    half = [[C1, 0, -S1, 0],       # pairs (0, 2) at θ_0 = 1 and (1, 3) at θ_1 = 0.01
            [0, C01, 0, -S01],
            [S1, 0, C1, 0],
            [0, S01, 0, C01]]
    np.testing.assert_allclose(rotation_matrix(1, 4), interleaved, rtol=1e-15, atol=0)
    np.testing.assert_allclose(rotation_matrix(1, 4, layout="half"), half, rtol=1e-15, atol=0)


def test_rotation_matrix_negative_position_is_the_transpose():
    # cos is even and sin odd, so B(-a) = B(a)^T blockwise
    np.testing.assert_allclose(rotation_matrix(-1, 4), np.array(
        [[C1, S1, 0, 0], [-S1, C1, 0, 0], [0, 0, C01, S01], [0, 0, -S01, C01]]), rtol=1e-15)


def test_apply_rope_rotates_counter_clockwise():
    # e_0 at position 1 goes to (cos 1, sin 1); e_1 to (-sin 1, cos 1); second pair by 0.01 rad
    x = np.array([[1.0, 0.0, 0.0, 1.0]])
    np.testing.assert_allclose(apply_rope(x, [1]), [[C1, S1, -S01, C01]], rtol=1e-15)
    np.testing.assert_allclose(apply_rope(x, [1], layout="half"), [[C1, -S01, S1, C01]], rtol=1e-15)
    np.testing.assert_array_equal(apply_rope(x, [0]), x)  # R(0) = I


def test_rotate_helpers_hand_worked():
    x = np.array([1.0, 2.0, 3.0, 4.0])
    np.testing.assert_array_equal(rotate_half(x), [-3.0, -4.0, 1.0, 2.0])
    np.testing.assert_array_equal(rotate_every_two(x), [-2.0, 1.0, -4.0, 3.0])


# --- invariants (hypothesis) ------------------------------------------------------------------

finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False)
positions = st.integers(-5000, 5000)


@st.composite
def vectors(draw, max_pairs=8):
    D = 2 * draw(st.integers(1, max_pairs))
    return draw(arrays(np.float64, (3, D), elements=finite))


@settings(max_examples=60, deadline=None)
@given(x=vectors(), ps=st.lists(positions, min_size=3, max_size=3),
       layout=st.sampled_from(LAYOUTS), base=st.sampled_from([10000.0, 500000.0, 10.0]))
def test_rotation_preserves_norms(x, ps, layout, base):
    y = apply_rope(x, ps, layout=layout, base=base)
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), np.linalg.norm(x, axis=-1),
                               rtol=1e-12, atol=1e-12)


@settings(max_examples=60, deadline=None)
@given(x=vectors(), m=positions, n=positions, shift=positions, layout=st.sampled_from(LAYOUTS))
def test_scores_depend_only_on_the_offset(x, m, n, shift, layout):
    q, k = x[:1], x[1:2]
    score = np.sum(apply_rope(q, [m], layout=layout) * apply_rope(k, [n], layout=layout))
    shifted = np.sum(apply_rope(q, [m + shift], layout=layout) * apply_rope(k, [n + shift], layout=layout))
    relative = q[0] @ rotation_matrix(n - m, x.shape[-1], layout=layout) @ k[0]  # q^T R(n - m) k
    scale = 1.0 + np.linalg.norm(q) * np.linalg.norm(k)
    assert abs(score - shifted) <= 1e-9 * scale
    assert abs(score - relative) <= 1e-9 * scale


@settings(max_examples=60, deadline=None)
@given(m=positions, n=positions, half_dim=st.integers(1, 6), layout=st.sampled_from(LAYOUTS))
def test_transpose_identity(m, n, half_dim, layout):
    D = 2 * half_dim
    Rm, Rn = rotation_matrix(m, D, layout=layout), rotation_matrix(n, D, layout=layout)
    np.testing.assert_allclose(Rm.T @ Rn, rotation_matrix(n - m, D, layout=layout), atol=1e-9)
    np.testing.assert_allclose(Rm @ Rn.T, rotation_matrix(m - n, D, layout=layout), atol=1e-9)


# --- efficient form == definitional form; layouts agree after the permutation -----------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_rope_equals_rotation_matrix(layout):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 3, 5, 8))  # (B, H, T, D)
    pos = np.array([0, 1, 7, 100, -3])
    expected = np.stack([x[..., t, :] @ rotation_matrix(p, 8, layout=layout).T
                         for t, p in enumerate(pos)], axis=-2)
    np.testing.assert_allclose(apply_rope(x, pos, layout=layout), expected, atol=1e-12)
    inv = np.array([0.5, 0.25, 0.125, 0.0625])
    expected = np.stack([x[..., t, :] @ rotation_matrix(p, 8, layout=layout, inv_freq=inv).T
                         for t, p in enumerate(pos)], axis=-2)
    np.testing.assert_allclose(apply_rope(x, pos, layout=layout, inv_freq=inv), expected, atol=1e-12)


def test_layout_permutation_values():
    np.testing.assert_array_equal(layout_permutation(8), [0, 2, 4, 6, 1, 3, 5, 7])
    np.testing.assert_array_equal(inverse_layout_permutation(8), [0, 4, 1, 5, 2, 6, 3, 7])
    np.testing.assert_array_equal(layout_permutation(6, rotary_dim=4), [0, 2, 1, 3, 4, 5])
    np.testing.assert_array_equal(inverse_layout_permutation(6, rotary_dim=4), [0, 2, 1, 3, 4, 5])
    x = np.arange(8.0)
    np.testing.assert_array_equal(x[layout_permutation(8)][inverse_layout_permutation(8)], x)


@settings(max_examples=60, deadline=None)
@given(x=vectors(), ps=st.lists(positions, min_size=3, max_size=3), data=st.data())
def test_layouts_agree_after_permutation(x, ps, data):
    D = x.shape[-1]
    R = 2 * data.draw(st.integers(1, D // 2))
    perm = layout_permutation(D, rotary_dim=R)
    half = apply_rope(x[..., perm], ps, layout="half", rotary_dim=R)
    interleaved = apply_rope(x, ps, layout="interleaved", rotary_dim=R)
    np.testing.assert_allclose(half, interleaved[..., perm], atol=1e-12)


# --- partial rotary and attention factor (hand-worked) ----------------------------------------

@pytest.mark.parametrize("layout", LAYOUTS)
def test_partial_rotary_passes_the_tail_through(layout):
    x = np.array([[1.0, 0.0, 5.0, -6.0, 7.0]])  # D = 5 (odd is fine), R = 2
    np.testing.assert_allclose(apply_rope(x, [1], rotary_dim=2, layout=layout), [[C1, S1, 5.0, -6.0, 7.0]],
                               rtol=1e-15)


def test_partial_rotary_uses_the_frequencies_of_rotary_dim():
    # R = 4 of D = 8: θ = 10000^(-2i/4) = (1, 0.01), not 10000^(-2i/8) = (1, 0.1)
    x = np.array([[0.0, 0.0, 1.0, 0.0, 9.0, 9.0, 9.0, 9.0]])
    np.testing.assert_allclose(apply_rope(x, [1], rotary_dim=4), [[0, 0, C01, S01, 9, 9, 9, 9]], rtol=1e-15)


def test_attention_factor_scales_cos_and_sin_but_not_the_tail():
    x = np.array([[1.0, 0.0, 3.0]])
    np.testing.assert_allclose(apply_rope(x, [1], rotary_dim=2, attention_factor=2.0),
                               [[2 * C1, 2 * S1, 3.0]], rtol=1e-15)
    q = np.array([[1.0, 2.0, 3.0, 4.0]])
    k = np.array([[-1.0, 0.5, 2.0, 1.0]])
    plain = np.sum(apply_rope(q, [3]) * apply_rope(k, [8]))
    scaled = np.sum(apply_rope(q, [3], attention_factor=1.5) * apply_rope(k, [8], attention_factor=1.5))
    np.testing.assert_allclose(scaled, 2.25 * plain, rtol=1e-12)  # logits scale by the square


# --- reference implementations (values printed by transformers 5.24.0, torch 2.13.0) ----------

X_REF = (np.arange(32.0).reshape(4, 8) - 15.5) / 8  # (T, D), float64
POS_REF = [0, 1, 7, 100]

# printed by transformers 5.24.0 `LlamaRotaryEmbedding(LlamaConfig(hidden_size=16,
# num_attention_heads=2, head_dim=8, rope_theta=10000.0))(x, position_ids=[[0, 1, 7, 100]])` then
# `apply_rotary_pos_emb(x, x, cos, sin)` on x = X_REF as a (1, 1, 4, 8) float64 tensor
LLAMA_REF = [
    [-1.93750000, -1.81250000, -1.68750000, -1.56250000, -1.43750000, -1.31250000, -1.18750000, -1.06250000],
    [-0.13838990, -0.77724295, -0.68559065, -0.56243723, -1.02526129, -0.39205346, -0.19436551, -0.06306247],
    [-0.32243607, -0.29949173, 0.25490613, 0.43092684, 0.46513168, 0.64661983, 0.83236735, 0.94053951],
    [1.70741014, -0.07836176, -0.81601929, 1.23689125, 0.80935973, -2.06195827, 2.08372862, 2.07133114],
]
# printed by transformers 5.24.0 `GPTNeoXRotaryEmbedding(GPTNeoXConfig(hidden_size=16,
# num_attention_heads=2, rotary_pct=0.5))` + `modeling_gpt_neox.apply_rotary_pos_emb` (rotary 4 of 8)
NEOX_REF = [
    [-1.93750000, -1.81250000, -1.68750000, -1.56250000, -1.43750000, -1.31250000, -1.18750000, -1.06250000],
    [0.07197784, -0.80683446, -1.16033688, -0.57059673, -0.43750000, -0.31250000, -0.18750000, -0.06250000],
    [-0.15818942, 0.15644082, 0.27665612, 0.44954286, 0.56250000, 0.68750000, 0.81250000, 0.93750000],
    [1.58081873, -0.56800548, 0.59378001, 1.77593137, 1.56250000, 1.68750000, 1.81250000, 1.93750000],
]
# printed by transformers 5.24.0 `modeling_gptj.create_sinusoidal_positions(128, rotary_dim)` +
# `modeling_gptj.apply_rotary_pos_emb` on the first rotary_dim features, as `GPTJAttention` does
GPTJ_REF = {
    8: [
        [-1.93750000, -1.81250000, -1.68750000, -1.56250000, -1.43750000, -1.31250000, -1.18750000, -1.06250000],
        [0.17716171, -1.22787467, -0.62790907, -0.62832533, -0.43435317, -0.31685930, -0.18743741, -0.06268747],
        [-0.07606610, 0.18241834, -0.04283204, 0.53593649, 0.51303674, 0.72515918, 0.80591765, 0.94316449],
        [1.51752302, 0.48599015, -0.31925099, -1.92019303, -0.57575984, 2.22655856, 1.61001782, 2.10876867],
    ],
    4: [
        [-1.93750000, -1.81250000, -1.68750000, -1.56250000, -1.43750000, -1.31250000, -1.18750000, -1.06250000],
        [0.17716171, -1.22787467, -0.68184071, -0.56934676, -0.43750000, -0.31250000, -0.18750000, -0.06250000],
        [-0.07606610, 0.18241834, 0.28113470, 0.45828571, 0.56250000, 0.68750000, 0.81250000, 0.93750000],
        [1.51752302, 0.48599015, -0.50046768, 1.88111524, 1.56250000, 1.68750000, 1.81250000, 1.93750000],
    ],
}
# HF computes angles and cos/sin in float32, so agreement is to ~1e-7, not 1e-15
REF_ATOL = 5e-7


def test_matches_hf_llama_half_layout():
    np.testing.assert_allclose(apply_rope(X_REF, POS_REF, layout="half"), LLAMA_REF, atol=REF_ATOL)


def test_matches_hf_gpt_neox_partial_rotary():
    np.testing.assert_allclose(apply_rope(X_REF, POS_REF, layout="half", rotary_dim=4), NEOX_REF, atol=REF_ATOL)


@pytest.mark.parametrize("rotary_dim", [8, 4])
def test_matches_hf_gptj_interleaved(rotary_dim):
    out = apply_rope(X_REF, POS_REF, layout="interleaved", rotary_dim=rotary_dim)
    np.testing.assert_allclose(out, GPTJ_REF[rotary_dim], atol=REF_ATOL)


# printed by transformers 5.24.0 `LlamaRotaryEmbedding(LlamaConfig(hidden_size=8,
# num_attention_heads=2, head_dim=4, rope_theta=500000.0))` + `apply_rotary_pos_emb` on the float64
# rows [1, 2, 3, 4] at positions [4096, 4097]. HF's float32 angles drift by ~1e-6 at this range.
LLAMA3_BASE_REF = [[2.58791655, 3.64863622, 1.81732982, 2.58601105],
                   [-0.13097304, 3.64497507, 3.15956420, 2.59116876]]


def test_matches_hf_llama_large_base_long_positions():
    x = np.array([[1.0, 2.0, 3.0, 4.0]] * 2)
    out = apply_rope(x, [4096, 4097], layout="half", base=500000.0)
    np.testing.assert_allclose(out, LLAMA3_BASE_REF, atol=5e-6)


# --- dtype -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_output_keeps_the_float_dtype(dtype):
    x = X_REF.astype(dtype)
    out = apply_rope(x, POS_REF, layout="half")
    assert out.dtype == dtype
    tol = 1e-6 if dtype == np.float32 else 5e-3
    np.testing.assert_allclose(out.astype(np.float64), LLAMA_REF, atol=tol)
    assert apply_rope(np.ones((2, 4), dtype=np.int64), 2).dtype == np.float64


# --- checkpoint conversion between layouts ----------------------------------------------------

def test_interleaved_to_half_matches_hf_permute():
    # printed by HF convert_llama_weights_to_hf.py `permute(w, n_heads=2, dim1=12, dim2=1)` on the
    # torch (out, in) weight torch.arange(12).reshape(12, 1): Meta (interleaved) -> HF (half)
    w = np.arange(12.0).reshape(1, 12)  # (d_model, H*D) = its transpose
    np.testing.assert_array_equal(interleaved_to_half_weights(w, 2)[0],
                                  [0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11])
    # permute(w, n_heads=1, dim1=8, dim2=2) on torch.arange(16).reshape(8, 2)
    hf = [[0, 1], [4, 5], [8, 9], [12, 13], [2, 3], [6, 7], [10, 11], [14, 15]]
    w = np.arange(16.0).reshape(8, 2).T
    np.testing.assert_array_equal(interleaved_to_half_weights(w, 1).T, hf)
    np.testing.assert_array_equal(half_to_interleaved_weights(np.array(hf, dtype=float).T, 1), w)


def _scores(x, wq, wk, H, Hkv, D, layout):
    """RoPE'd q·k logits (H, T, T) of a GQA projection pair."""
    T = x.shape[0]
    q = (x @ wq).reshape(T, H, D).transpose(1, 0, 2)      # (H, T, D)
    k = (x @ wk).reshape(T, Hkv, D).transpose(1, 0, 2)    # (Hkv, T, D)
    q, k = apply_rope(q, T, layout=layout), apply_rope(k, T, layout=layout)
    k = np.repeat(k, H // Hkv, axis=0)                    # (H, T, D): head h reads kv head h // (H/Hkv)
    return q @ k.transpose(0, 2, 1)                       # (H, T, T)


def test_converted_weights_give_the_same_scores_gqa():
    rng = np.random.default_rng(2)
    d_model, H, Hkv, D, T = 12, 4, 2, 6, 5
    x = rng.standard_normal((T, d_model))
    wq, wk = rng.standard_normal((d_model, H * D)), rng.standard_normal((d_model, Hkv * D))
    ref = _scores(x, wq, wk, H, Hkv, D, "interleaved")
    wq_h, wk_h = interleaved_to_half_weights(wq, H), interleaved_to_half_weights(wk, Hkv, D)
    np.testing.assert_allclose(_scores(x, wq_h, wk_h, H, Hkv, D, "half"), ref, atol=1e-10)
    assert not np.allclose(_scores(x, wq, wk, H, Hkv, D, "half"), ref)  # unconverted: wrong
    np.testing.assert_array_equal(half_to_interleaved_weights(wq_h, H), wq)
    bias = np.arange(12.0)  # a q_proj bias (H*D,) permutes like a column of the weight
    np.testing.assert_array_equal(interleaved_to_half_weights(bias, 2), [0, 2, 4, 1, 3, 5, 6, 8, 10, 7, 9, 11])


# --- errors ----------------------------------------------------------------------------------

def test_errors_name_the_argument():
    x = np.zeros((3, 8))
    with pytest.raises(ValueError, match="dim must be even"):
        rope_inv_freq(5)
    with pytest.raises(ValueError, match="dim must be even"):
        rotation_matrix(1, 5)
    with pytest.raises(ValueError, match="layout"):
        apply_rope(x, 3, layout="neox")
    with pytest.raises(ValueError, match="even head dim D"):
        apply_rope(np.zeros((3, 5)), 3)
    with pytest.raises(ValueError, match="rotary_dim must be <= the head dim"):
        apply_rope(x, 3, rotary_dim=10)
    with pytest.raises(ValueError, match="rotary_dim must be even"):
        apply_rope(x, 3, rotary_dim=3)
    with pytest.raises(ValueError, match="positions must hold integers"):
        apply_rope(x, [0.0, 1.5, 2.0])
    with pytest.raises(ValueError, match="positions must have length 3"):
        apply_rope(x, [0, 1])
    with pytest.raises(ValueError, match="inv_freq must have length rotary_dim/2 = 4"):
        apply_rope(x, 3, inv_freq=[1.0, 0.1])
    with pytest.raises(ValueError, match="inv_freq must have length rotary_dim/2 = 2"):
        apply_rope(x, 3, rotary_dim=4, inv_freq=rope_inv_freq(8))
    with pytest.raises(ValueError, match="either base or inv_freq"):
        apply_rope(x, 3, base=500000.0, inv_freq=rope_inv_freq(8))
    with pytest.raises(ValueError, match="x must have shape"):
        apply_rope(np.zeros(8), 1)
    with pytest.raises(ValueError, match="x must be finite"):
        apply_rope(np.full((1, 2), np.nan), 1)
    with pytest.raises(ValueError, match="attention_factor must be > 0"):
        apply_rope(x, 3, attention_factor=0.0)
    with pytest.raises(TypeError, match="position must be an integer"):
        rotation_matrix(1.5, 4)
    with pytest.raises(ValueError, match="w must have last axis"):
        interleaved_to_half_weights(np.zeros((2, 12)), 2, head_dim=4)
    with pytest.raises(ValueError, match="w must have shape"):
        interleaved_to_half_weights(np.zeros((2, 10)), 3)
    with pytest.raises(ValueError, match="dim must be even"):
        interleaved_to_half_weights(np.zeros((2, 10)), 2)  # head dim 5 cannot be paired
