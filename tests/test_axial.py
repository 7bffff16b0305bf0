"""2-D (axial) RoPE (minipos.axial): hand-worked values, the vision towers' layouts against transformers 5.24
(Pixtral's, Gemma 4's, Llama 4's, Qwen's and MiniMax M3's 3-D rotary embeddings and their apply functions; Pixtral's attention with
copied weights), Qwen's patch order and window mask, relative in each axis, the layer with positions (2, T), bad input, and proofs fed a wrong formula. The
contract suite (test_contract.py) gives it the rest: finite differences, fast, cache, blockwise, golden case."""

import math

import numpy as np
import pytest

from minipos import axial
from minipos.layer import AxialRotary, MultiHeadAttention

from _torch import _np, _t, copy_projections, needs_torch, torch


def test_hand_worked_pixtral_and_llama4():
    # D = 4, base 100: one pair per axis. Pixtral: θ_j = 100^(-2j/4) = (1, 0.1); pair 0 = (0, 2) by the row with
    # θ_0 = 1, pair 1 = (1, 3) by the column with θ_1 = 0.1. Row 2, column 30: angles 2 and 3.
    x = np.array([[1.0, 1.0, 0.0, 0.0]])
    y = axial.apply_axial_rope(x, np.array([[2], [30]]), base=100.0, layout="pixtral")
    np.testing.assert_allclose(y[0], [math.cos(2), math.cos(3), math.sin(2), math.sin(3)], rtol=1e-15)
    # Llama 4 (and Gemma 4): f = (1,) per axis (a 2-dim RoPE's), columns first. Llama 4 pairs (0, 1) by the
    # column (angle 30), (2, 3) by the row (angle 2); Gemma 4 pairs (0, 1) by the column, (2, 3) by the row too.
    x = np.array([[1.0, 0.0, 1.0, 0.0]])
    for layout in ("llama4", "gemma4"):
        y = axial.apply_axial_rope(x, np.array([[2], [30]]), base=100.0, layout=layout)
        np.testing.assert_allclose(y[0], [math.cos(30), math.sin(30), math.cos(2), math.sin(2)], rtol=1e-15,
                                   err_msg=layout)


def test_positions_of_a_grid():
    np.testing.assert_array_equal(axial.axial_positions(2, 3), [[0, 0, 0, 1, 1, 1], [0, 1, 2, 0, 1, 2]])
    # Llama 4: counted from 1, the class token last at (0, 0), i.e. unrotated
    np.testing.assert_array_equal(axial.axial_positions(2, 2, start=1, class_token=True),
                                  [[1, 1, 2, 2, 0], [1, 2, 1, 2, 0]])


def _framed(layout, pos, frame=2):
    """minimax_m3's positions (3, T): a frame row ahead of the rows and columns."""
    pos = np.asarray(pos)
    return np.concatenate([np.full((1,) + pos.shape[1:], frame), pos]) if layout == "minimax_m3" else pos


@pytest.mark.parametrize("layout", axial.AXIAL_LAYOUTS)
def test_scores_depend_on_the_row_and_column_offsets_separately(layout):
    rng = np.random.default_rng(0)
    q, k = rng.standard_normal((2, 16))

    def score(pq, pk):
        return float(axial.apply_axial_rope(q[None], _framed(layout, np.array(pq)[:, None]), layout=layout)[0]
                     @ axial.apply_axial_rope(k[None], _framed(layout, np.array(pk)[:, None]), layout=layout)[0])
    base = score([3, 5], [7, 1])
    assert math.isclose(score([3 + 11, 5 - 4], [7 + 11, 1 - 4]), base, rel_tol=1e-12)    # any shift per axis
    # not a function of the flattened distance: on a 4-wide grid, (0, 3) -> (1, 0) and (0, 0) -> (0, 1) are
    # both one step apart in the sequence
    assert not math.isclose(score([0, 3], [1, 0]), score([0, 0], [0, 1]), rel_tol=1e-6)
    dy = rng.standard_normal((5, 16))
    x, pos = rng.standard_normal((5, 16)), _framed(layout, axial.axial_positions(1, 5))
    lhs = np.sum(axial.apply_axial_rope(x, pos, layout=layout) * dy)
    rhs = np.sum(x * axial.apply_axial_rope_backward(dy, pos, layout=layout))
    assert math.isclose(lhs, rhs, rel_tol=1e-12)                                        # the backward is R^T


def test_the_layer_takes_rows_and_columns():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 32))
    pos = axial.axial_positions(2, 3)
    layer = MultiHeadAttention(32, 2, scheme=AxialRotary(layout="gemma4"), seed=0)
    moved = layer(x, positions=pos + np.array([[4], [9]]))
    np.testing.assert_allclose(moved, layer(x, positions=pos), rtol=1e-12, atol=1e-12)
    # a transposed grid is another input: rows and columns are not interchangeable
    assert not np.allclose(layer(x, positions=pos[::-1]), layer(x, positions=pos))


def _pixtral_config(D, theta):
    from transformers.models.pixtral.configuration_pixtral import PixtralVisionConfig
    return PixtralVisionConfig(hidden_size=2 * D, num_attention_heads=2, head_dim=D, intermediate_size=8,
                               rope_parameters={"rope_type": "axial", "rope_theta": theta})


@needs_torch
@pytest.mark.parametrize("D", [32, 6])
def test_pixtral_matches_transformers(D):
    # D = 6: HF's chunk(2) of the 3 frequencies gives the rows 2 pairs (θ_0, θ_2), the columns 1 (θ_1)
    from transformers.models.pixtral import modeling_pixtral as mp
    theta = 10000.0
    rotary = mp.PixtralVisionRotaryEmbedding(_pixtral_config(D, theta))
    omega = axial.axial_pairs(D, base=theta, layout="pixtral")[3]
    np.testing.assert_allclose(omega, _np(rotary.inv_freq), rtol=3e-7)      # HF: float32, cat(θ[0::2], θ[1::2])
    pos = axial.axial_positions(3, 5)                                       # HF meshgrid(..., indexing="ij")
    q, k = np.random.default_rng(2).standard_normal((2, 1, 2, pos.shape[1], D))
    # HF's recomposition and apply_rotary_pos_emb, with float64 angles of the frequencies checked above
    freqs = _t(pos.T.copy())[..., None].double() * _t(omega)               # position_ids (T, 2): (T, 2, D/2)
    cos, sin = rotary.recomposition_frequencies(freqs.cos()), rotary.recomposition_frequencies(freqs.sin())
    want_q, want_k = (_np(t) for t in mp.apply_rotary_pos_emb(_t(q), _t(k), cos, sin, unsqueeze_dim=0))
    np.testing.assert_allclose(axial.apply_axial_rope(q, pos, base=theta), want_q, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(axial.apply_axial_rope(k, pos, base=theta), want_k, rtol=1e-13, atol=1e-13)
    with torch.no_grad():                                                   # the module as it runs: float32 angles
        cos32, sin32 = rotary(_t(q), _t(pos.T.copy()))
    want_q = _np(mp.apply_rotary_pos_emb(_t(q), _t(k), cos32, sin32, unsqueeze_dim=0)[0])
    np.testing.assert_allclose(axial.apply_axial_rope(q, pos, base=theta), want_q, rtol=1e-5, atol=1e-5)


@needs_torch
def test_pixtral_attention_with_copied_weights_matches_transformers():
    from transformers.models.pixtral import modeling_pixtral as mp
    D, theta = 16, 10000.0
    cfg = _pixtral_config(D, theta)
    cfg._attn_implementation = "sdpa"                                       # sdpa stays in float64
    torch.manual_seed(0)
    ref = mp.PixtralAttention(cfg).double().eval()
    rotary = mp.PixtralVisionRotaryEmbedding(cfg)
    pos = axial.axial_positions(3, 4)
    x = np.random.default_rng(3).standard_normal((1, pos.shape[1], 2 * D))
    _, _, _, omega = axial.axial_pairs(D, base=theta, layout="pixtral")
    freqs = _t(pos.T.copy())[..., None].double() * _t(omega)
    cs = (rotary.recomposition_frequencies(freqs.cos()), rotary.recomposition_frequencies(freqs.sin()))
    with torch.no_grad():
        want = _np(ref(_t(x), position_embeddings=cs, attention_mask=None)[0])   # one image: no mask
    layer = MultiHeadAttention(2 * D, 2, scheme=AxialRotary(base=theta, layout="pixtral"), bias=False)
    copy_projections(layer, ref)
    np.testing.assert_allclose(layer(x, positions=pos, causal=False), want, rtol=1e-12, atol=1e-12)


@needs_torch
def test_gemma4_vision_matches_transformers():
    from transformers.models.gemma4 import configuration_gemma4 as cg, modeling_gemma4 as mg
    D, theta = 32, 100.0
    cfg = cg.Gemma4VisionConfig(hidden_size=2 * D, num_attention_heads=2, head_dim=D, intermediate_size=8,
                                rope_parameters={"rope_type": "axial", "rope_theta": theta})
    rotary = mg.Gemma4VisionRotaryEmbedding(cfg)
    _, _, _, omega = axial.axial_pairs(D, base=theta, layout="gemma4")
    np.testing.assert_allclose(omega[:D // 4], _np(rotary.inv_freq), rtol=1e-7)   # f_j = base^(-2j/(D/2))
    pos = axial.axial_positions(3, 5)
    hf_ids = _t(pos[::-1].T.copy())[None]                                   # (1, T, 2): x = column, then y = row
    x = np.random.default_rng(4).standard_normal((1, pos.shape[1], 2, D))   # HF: (B, T, H, D)
    freqs = hf_ids[..., None].double() * _t(omega[:D // 4])                # (1, T, 2, D/4), float64 angles
    cos, sin = rotary.recomposition_frequencies(freqs.cos()), rotary.recomposition_frequencies(freqs.sin())
    want = _np(mg.apply_multidimensional_rope(_t(x), cos, sin, hf_ids, unsqueeze_dim=2))
    got = axial.apply_axial_rope(x.transpose(0, 2, 1, 3), pos, base=theta, layout="gemma4").transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)


@needs_torch
def test_llama4_vision_matches_transformers():
    from transformers.models.llama4 import configuration_llama4 as cl, modeling_llama4 as ml
    D, side, theta = 16, 3, 10000.0
    cfg = cl.Llama4VisionConfig(hidden_size=2 * D, num_attention_heads=2, image_size=side * 4, patch_size=4,
                                rope_parameters={"rope_type": "default", "rope_theta": theta})
    freqs_ci = ml.Llama4VisionRotaryEmbedding(cfg).freqs_ci                 # complex64: float32 angles
    pos = axial.axial_positions(side, side, start=1, class_token=True)      # from 1; the class token at (0, 0)
    T = pos.shape[1]
    q = np.random.default_rng(5).standard_normal((1, T, 2, D))               # HF: (B, T, H, D)
    want, _ = ml.vision_apply_rotary_emb(_t(q), _t(q), freqs_ci)
    got = axial.apply_axial_rope(q.transpose(0, 2, 1, 3), pos, base=theta, layout="llama4").transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, _np(want), rtol=1e-5, atol=1e-5)       # HF rotates in float32
    np.testing.assert_array_equal(got[:, -1], q[:, -1])                     # the class token is not rotated


def test_hand_worked_position_scale():
    # D = 4, llama4 layout: pair (0, 1) by the column, pair (2, 3) by the row, both f_0 = 1. position_scale 0.5
    # at row 2, column 1 (SAM 3's global layers hold the coordinates times a fraction): angles 0.5 and 1.
    y = axial.apply_axial_rope(np.array([[1.0, 0.0, 1.0, 0.0]]), np.array([[2], [1]]), layout="llama4",
                               position_scale=0.5)
    np.testing.assert_allclose(y[0], [math.cos(0.5), math.sin(0.5), math.cos(1.0), math.sin(1.0)], atol=1e-15)
    # the same angles as position_scale 1 at doubled coordinates, and the backward turns them back
    x = np.random.default_rng(2).standard_normal((3, 5, 8))
    pos = axial.axial_positions(1, 5)
    np.testing.assert_allclose(axial.apply_axial_rope(x, 2 * pos, layout="llama4"),
                               axial.apply_axial_rope(x, pos, layout="llama4", position_scale=2.0), atol=1e-13)
    back = axial.apply_axial_rope_backward(axial.apply_axial_rope(x, pos, position_scale=0.25), pos,
                                           position_scale=0.25)
    np.testing.assert_allclose(back, x, atol=1e-13)


def test_positions_are_integers_scaled_coordinates_take_position_scale():
    # minipos' axial positions are integers: SAM 3's float coordinates (c * 24 / 72) are refused as positions; the
    # layer takes the integer grid and position_scale = 1/3 (the same angles; test_config_interop_sam against HF).
    x = np.ones((1, 3, 8))
    with pytest.raises(ValueError, match="positions must hold integers"):
        axial.apply_axial_rope(x, np.array([[0.0, 1 / 3, 2 / 3], [0.0, 0.0, 0.0]]), layout="llama4")
    layer = MultiHeadAttention(8, 1, scheme=AxialRotary(layout="llama4", position_scale=1 / 3))
    with pytest.raises(ValueError, match="positions must hold integers"):
        layer(x, positions=np.array([[0.0, 1 / 3, 2 / 3], [0.0, 0.0, 0.0]]), causal=False)
    assert "position_scale=0.333333" in repr(layer.scheme)


def test_hand_worked_qwen():
    # D = 8, base 100: f_j = 100^(-2j/4) = (1, 0.1) for both axes; pairs (i, i + 4): pairs 0, 1 by the row with
    # f_0, f_1, pairs 2, 3 by the column with f_0, f_1. Row 2, column 30: angles 2, 0.2, 30, 3.
    x = np.array([[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    y = axial.apply_axial_rope(x, np.array([[2], [30]]), base=100.0, layout="qwen")
    angles = [2.0, 0.2, 30.0, 3.0]
    np.testing.assert_allclose(y[0], [math.cos(a) for a in angles] + [math.sin(a) for a in angles], rtol=1e-15)


def test_hand_worked_kimi():
    # Kimi K2.5's tower (HF Kimi_K25VisionRotaryEmbedding), D = 8, base 100: f_j = 100^(-2j/4) = (1, 0.1); pairs
    # (i, i + 4) by turns: pair 0 the column at f_0, pair 1 the row at f_0, pair 2 the column at f_1, pair 3 the row
    # at f_1. Row 2, column 30: angles 30, 2, 3, 0.2.
    x = np.array([[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0]])
    y = axial.apply_axial_rope(x, np.array([[2], [30]]), base=100.0, layout="kimi")
    angles = [30.0, 2.0, 3.0, 0.2]
    np.testing.assert_allclose(y[0], [math.cos(a) for a in angles] + [math.sin(a) for a in angles], rtol=1e-15)


def test_hand_worked_minimax_m3():
    # MiniMax M3's tower (HF MiniMaxM3VLVisionRotaryEmbedding), D = 14, base 100: F = (14 // 3) // 2 = 2 frequencies
    # per axis, φ_j = 100^(-j/2) = (1, 0.1); pairs (i, i + 6) for i < 6: pairs 0, 1 by the frame at φ_0, φ_1, pairs
    # 2, 3 by the row, pairs 4, 5 by the column; features 12, 13 pass through. Frame 3, row 2, column 30: angles
    # 3, 0.3, 2, 0.2, 30, 3.
    x = np.array([[1.0] * 6 + [0.0] * 6 + [7.0, -5.0]])
    y = axial.apply_axial_rope(x, np.array([[3], [2], [30]]), base=100.0, layout="minimax_m3")
    angles = [3.0, 0.3, 2.0, 0.2, 30.0, 3.0]
    np.testing.assert_allclose(y[0], [math.cos(a) for a in angles] + [math.sin(a) for a in angles] + [7.0, -5.0],
                               rtol=1e-15)
    # (a_i, b_i) = (0, 1) at frame 3: x_b -> (-sin 3, cos 3), the transpose turns it back
    e = np.zeros((1, 14))
    e[0, 6] = 1.0
    y = axial.apply_axial_rope(e, np.array([[3], [0], [0]]), base=100.0, layout="minimax_m3")
    np.testing.assert_allclose(y[0, [0, 6]], [-math.sin(3), math.cos(3)], rtol=1e-15)
    np.testing.assert_allclose(axial.apply_axial_rope_backward(y, np.array([[3], [0], [0]]), base=100.0,
                                                               layout="minimax_m3"), e, atol=1e-15)
    # D = 6 (F = 1) rotates every feature; D = 80 (the tower's default 1280 / 16) leaves features 78, 79
    assert axial.axial_pairs(6, layout="minimax_m3")[1].tolist() == [3, 4, 5]
    a, b, axis, omega = axial.axial_pairs(80, base=10000.0, layout="minimax_m3")
    assert (len(a), b[-1], axis.tolist().count(2)) == (39, 77, 13)
    np.testing.assert_allclose(omega[13:26], 10000.0 ** (-np.arange(13) / 13), rtol=1e-15)


def test_the_layer_takes_frames_rows_and_columns_for_minimax_m3():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 6, 32))
    pos = np.array([[0, 0, 0, 1, 1, 1], [0, 0, 1, 0, 0, 1], [0, 1, 0, 0, 1, 0]])
    layer = MultiHeadAttention(32, 2, scheme=AxialRotary(layout="minimax_m3"), seed=0)
    assert layer.scheme.position_streams == 3 and AxialRotary().position_streams == 2
    np.testing.assert_allclose(layer(x, positions=pos + np.array([[5], [4], [9]])), layer(x, positions=pos),
                               rtol=1e-12, atol=1e-12)
    assert not np.allclose(layer(x, positions=pos[[1, 0, 2]]), layer(x, positions=pos))     # frames are not rows
    with pytest.raises(ValueError, match=r"\(3, 6\)"):
        layer(x, positions=pos[1:])


def _minimax_vision(D, theta):
    from transformers.models.minimax_m3_vl.configuration_minimax_m3_vl import MiniMaxM3VLVisionConfig
    return MiniMaxM3VLVisionConfig(hidden_size=2 * D, num_attention_heads=2, intermediate_size=8,
                                   rope_parameters={"rope_type": "axial", "rope_theta": theta})


@needs_torch
@pytest.mark.parametrize("D", [32, 80, 14])
def test_minimax_m3_vision_rotary_matches_transformers(D):
    # HF: inv_freq = 1 / base^(arange(0, 2F, 2) / 2F); cos, sin of position_ids (N, 3) in THW order flattened to
    # (N, 3F) and doubled; apply_rotary_pos_emb_vision rotates the first 6F features by rotate_half, the rest pass.
    from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as mm
    from transformers.vision_utils import get_vision_position_ids
    theta = 10000.0
    rotary = mm.MiniMaxM3VLVisionRotaryEmbedding(_minimax_vision(D, theta))
    F = (D // 3) // 2
    omega = axial.axial_pairs(D, base=theta, layout="minimax_m3")[3]
    np.testing.assert_allclose(omega[:F], _np(rotary.inv_freq), rtol=3e-7)             # HF: float32
    ids = get_vision_position_ids(torch.tensor([[2, 4, 6]]), 2, include_temporal=True)    # (T, 3): frame, row, col
    pos = _np(ids).T.copy()
    np.testing.assert_array_equal(pos, np.vstack([np.repeat([0, 1], 24), np.tile(axial.merge_positions(4, 6, 2), 2)]))
    q, k = np.random.default_rng(8).standard_normal((2, pos.shape[1], 2, D))             # HF: (T, H, D)
    freqs = ids[..., None].double() * _t(omega[:F])                                      # float64 angles, (T, 3, F)
    cos, sin = rotary.recomposition_frequencies(freqs.cos()), rotary.recomposition_frequencies(freqs.sin())
    want_q, want_k = (_np(t) for t in mm.apply_rotary_pos_emb_vision(_t(q), _t(k), cos, sin))
    got = axial.apply_axial_rope(q.transpose(1, 0, 2), pos, base=theta, layout="minimax_m3").transpose(1, 0, 2)
    np.testing.assert_allclose(got, want_q, rtol=1e-13, atol=1e-13)
    got_k = axial.apply_axial_rope(k.transpose(1, 0, 2), pos, base=theta, layout="minimax_m3").transpose(1, 0, 2)
    np.testing.assert_allclose(got_k, want_k, rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(got[..., 6 * F:], q[..., 6 * F:])                      # the tail passes through
    with torch.no_grad():                                                                # the module: float32 angles
        cos32, sin32 = rotary(_t(q), ids)
    want = _np(mm.apply_rotary_pos_emb_vision(_t(q), _t(k), cos32, sin32)[0])
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_qwen_patch_order_hand_worked():
    # A 2 x 4 grid in 2 x 2 blocks: block (0, 0) holds (0,0) (0,1) (1,0) (1,1), block (0, 1) the columns 2, 3.
    np.testing.assert_array_equal(axial.merge_positions(2, 4, 2), [[0, 0, 1, 1, 0, 0, 1, 1], [0, 1, 0, 1, 2, 3, 2, 3]])
    np.testing.assert_array_equal(axial.merge_positions(2, 3, 1), axial.axial_positions(2, 3))    # merge 1: raster
    # A 2 x 6 grid, blocks of 2, windows of 4 patches: window 0 has columns 0-3 (blocks 0, 1), window 1 columns 4-5.
    np.testing.assert_array_equal(axial.merge_positions(2, 6, 2, window=4),
                                  [[0, 0, 1, 1, 0, 0, 1, 1, 0, 0, 1, 1], [0, 1, 0, 1, 2, 3, 2, 3, 4, 5, 4, 5]])
    # A 4 x 4 grid, windows of 2 = one block each: the window order is the block order.
    np.testing.assert_array_equal(axial.merge_positions(4, 4, 2, window=2), axial.merge_positions(4, 4, 2))
    # 4 x 2 grid, blocks of 2, windows of 2: the windows go down the rows, (0-1, 0-1) then (2-3, 0-1).
    np.testing.assert_array_equal(axial.merge_positions(4, 2, 2, window=2), [[0, 0, 1, 1, 2, 2, 3, 3],
                                                                             [0, 1, 0, 1, 0, 1, 0, 1]])


def test_window_mask_hand_worked():
    # Patches (0, 0), (0, 3), (1, 1), (2, 0) with windows of 2: (0, 0) and (1, 1) share the window (0, 0); (0, 3)
    # is in (0, 1), (2, 0) in (1, 0).
    pos = np.array([[0, 0, 1, 2], [0, 3, 1, 0]])
    want = np.array([[1, 0, 1, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 1]], bool)
    np.testing.assert_array_equal(axial.axial_window_mask(pos, 2), want)
    assert axial.axial_window_mask(pos, 4).all()                                    # one window holds them all


@needs_torch
def test_qwen_positions_and_windows_match_transformers():
    from transformers.vision_utils import get_vision_position_ids, get_vision_window_index
    for h, w, m, window_size, patch in [(4, 6, 2, 112, 14), (10, 14, 2, 112, 14), (6, 9, 3, 84, 14)]:
        grid = torch.tensor([[1, h, w]])
        hf = _np(get_vision_position_ids(grid, m)).T                               # (T, 2) -> (2, T)
        np.testing.assert_array_equal(axial.merge_positions(h, w, m), hf)
        index, cu = get_vision_window_index(grid, m, window_size, patch)          # blocks' order, window bounds
        order = _np(index[:, None] * m * m + torch.arange(m * m)).reshape(-1)
        W = window_size // m // patch * m
        got = axial.merge_positions(h, w, m, window=W)
        np.testing.assert_array_equal(got, hf[:, order])
        bounds = _np(cu)
        seg = np.repeat(np.arange(len(bounds) - 1), np.diff(bounds))              # HF's window of each token
        np.testing.assert_array_equal(axial.axial_window_mask(got, W), seg[:, None] == seg[None, :])


@needs_torch
def test_qwen_vision_rotary_matches_transformers():
    from transformers.models.qwen2_vl import modeling_qwen2_vl as mq
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLVisionConfig
    D, theta = 16, 10000.0
    cfg = Qwen2VLVisionConfig(embed_dim=2 * D, num_heads=2, rope_parameters={"rope_type": "axial",
                                                                             "rope_theta": theta})
    rotary = mq.Qwen2VLVisionRotaryEmbedding(cfg)
    omega = axial.axial_pairs(D, base=theta, layout="qwen")[3]
    np.testing.assert_allclose(omega[:D // 4], _np(rotary.inv_freq), rtol=1e-7)   # f_j = base^(-2j/(D/2))
    pos = axial.merge_positions(4, 6, 2)
    q, k = np.random.default_rng(6).standard_normal((2, pos.shape[1], 2, D))     # HF: (T, H, D)
    freqs = _t(pos.T.copy())[..., None].double() * _t(omega[:D // 4])            # float64 angles, (T, 2, D/4)
    cos, sin = rotary.recomposition_frequencies(freqs.cos()), rotary.recomposition_frequencies(freqs.sin())
    rot = lambda t, c, s: t * c[:, None] + mq.rotate_half(t) * s[:, None]         # noqa: E731  HF's formula, float64
    got = axial.apply_axial_rope(q.transpose(1, 0, 2), pos, base=theta, layout="qwen").transpose(1, 0, 2)
    np.testing.assert_allclose(got, _np(rot(_t(q), cos, sin)), rtol=1e-13, atol=1e-13)
    with torch.no_grad():                                                        # the module as it runs: float32
        cos32, sin32 = rotary(_t(q), _t(pos.T.copy()))
        want, _ = mq.apply_rotary_pos_emb_vision(_t(q), _t(k), cos32, sin32)
    np.testing.assert_allclose(got, _np(want), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("call, exc, words", [
    (lambda: axial.axial_pairs(6, layout="gemma4"), ValueError, "multiple of 4"),
    (lambda: axial.axial_pairs(7), ValueError, "multiple of 4"),
    (lambda: axial.axial_pairs(8, layout="qwen3"), ValueError, "layout"),
    (lambda: axial.axial_pairs(6, layout="qwen"), ValueError, "multiple of 4"),
    (lambda: axial.axial_pairs(8, base=0.0), ValueError, "base"),
    (lambda: axial.apply_axial_rope(np.ones((2, 6)), [0, 1], layout="llama4"), ValueError, "x"),
    (lambda: axial.apply_axial_rope(np.ones((2, 5)), [0, 1]), ValueError, "x"),
    (lambda: axial.apply_axial_rope(np.ones((2, 8)), np.zeros((3, 2), int)), ValueError, "positions"),
    (lambda: axial.apply_axial_rope(np.ones((2, 8)), np.zeros((2, 3), int)), ValueError, "positions"),
    (lambda: axial.apply_axial_rope_backward(np.ones(8), [0]), ValueError, "dy"),
    (lambda: axial.axial_positions(0, 3), ValueError, "height"),
    (lambda: axial.axial_positions(2, 3, class_token=1), TypeError, "class_token"),
    (lambda: AxialRotary(layout="pixtral2"), ValueError, "layout"),
    (lambda: AxialRotary(position_scale=0.0), ValueError, "position_scale"),
    (lambda: AxialRotary(position_scale="1/3"), TypeError, "position_scale"),
    (lambda: axial.apply_axial_rope(np.ones((2, 8)), [0, 1], position_scale=float("nan")), ValueError,
     "position_scale"),
    (lambda: axial.axial_angles([0, 1], 8, position_scale=-1.0), ValueError, "position_scale"),
    (lambda: axial.merge_positions(3, 4, 2), ValueError, "multiples of merge_size"),
    (lambda: axial.merge_positions(4, 4, 0), ValueError, "merge_size"),
    (lambda: axial.merge_positions(4, 4, 2, window=3), ValueError, "window must be a multiple of merge_size"),
    (lambda: axial.merge_positions(4, 4, 2, window=0), ValueError, "window"),
    (lambda: axial.merge_positions(4.0, 4, 2), TypeError, "height"),
    (lambda: axial.axial_window_mask(np.zeros((3, 4), int), 2), ValueError, "positions"),
    (lambda: axial.axial_window_mask(np.zeros((2, 4)) + 0.5, 2), (ValueError, TypeError), "positions"),
    (lambda: axial.axial_window_mask(np.zeros((2, 4), int), -1), ValueError, "window"),
    (lambda: axial.axial_pairs(5, layout="minimax_m3"), ValueError, "at least 6"),
    (lambda: axial.apply_axial_rope(np.ones((2, 5)), np.zeros((3, 2), int), layout="minimax_m3"), ValueError, "x"),
    (lambda: axial.apply_axial_rope(np.ones((2, 8)), np.zeros((2, 2), int), layout="minimax_m3"), ValueError,
     "frames, rows, then columns"),
    (lambda: MultiHeadAttention(10, 2, scheme=AxialRotary(layout="minimax_m3")), ValueError, "head_dim"),
    (lambda: MultiHeadAttention(12, 2, scheme=AxialRotary(layout="gemma4")), ValueError, "head_dim"),
    (lambda: MultiHeadAttention(16, 2, scheme=AxialRotary())(np.ones((1, 3, 16)), positions=np.zeros((3, 3), int)),
     ValueError, "rows, then columns"),
])
def test_bad_input_is_refused_naming_the_argument(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_the_proofs_fail_on_a_wrong_formula(monkeypatch):
    pytest.importorskip("sympy")
    from _proof_support import proof_failure
    from proofs.core import ProofFailure, TieMismatch

    # Pixtral's axes swapped (columns on the even frequencies): the table's tie fails.
    real = axial.axial_pairs

    def swapped(head_dim, *, base=10000.0, layout="pixtral"):
        a, b, axis, omega = real(head_dim, base=base, layout=layout)
        return a, b, 1 - axis if layout == "pixtral" else axis, omega
    err = proof_failure("axial.frequencies", monkeypatch, axial, "axial_pairs", swapped)
    assert isinstance(err, TieMismatch) and "pixtral" in str(err)
    monkeypatch.undo()
    # Qwen given Pixtral's frequencies (the columns half a step lower): the table's tie fails for qwen.
    def pixtral_freqs(head_dim, *, base=10000.0, layout="pixtral"):
        a, b, axis, omega = real(head_dim, base=base, layout=layout)
        return a, b, axis, real(head_dim, base=base, layout="pixtral")[3] if layout == "qwen" else omega
    err = proof_failure("axial.frequencies", monkeypatch, axial, "axial_pairs", pixtral_freqs)
    assert isinstance(err, TieMismatch) and "qwen" in str(err)
    monkeypatch.undo()
    # Kimi's axes in Qwen's order (rows on the first half): the table's tie fails for kimi.
    def qwen_axes(head_dim, *, base=10000.0, layout="pixtral"):
        a, b, axis, omega = real(head_dim, base=base, layout=layout)
        return a, b, real(head_dim, base=base, layout="qwen")[2] if layout == "kimi" else axis, omega
    err = proof_failure("axial.frequencies", monkeypatch, axial, "axial_pairs", qwen_axes)
    assert isinstance(err, TieMismatch) and "kimi" in str(err)
    monkeypatch.undo()
    # One position for both axes (the row's, as a 1-D RoPE over the flattened index would): not relative per axis.
    good = axial.apply_axial_rope
    err = proof_failure("axial.relative.per_axis", monkeypatch, axial, "apply_axial_rope",
                        lambda x, pos, **kw: good(x, np.broadcast_to(np.asarray(pos)[:1], np.shape(pos)), **kw))
    assert isinstance(err, ProofFailure) and "axial.relative.per_axis" in str(err)
    monkeypatch.undo()
    # MiniMax M3 with the frame ignored (its pairs turned by the row, a 2-D RoPE with frames for rows): the 3-D tie
    # fails.
    def no_frame(x, pos, **kw):
        pos = np.asarray(pos)
        if kw.get("layout") == "minimax_m3":
            pos = pos.copy()
            pos[0] = pos[1]
        return good(x, pos, **kw)
    err = proof_failure("axial.relative.per_axis", monkeypatch, axial, "apply_axial_rope", no_frame)
    assert isinstance(err, ProofFailure) and "minimax_m3" in str(err)
    monkeypatch.undo()
    # MiniMax M3's frequencies as a 2-D tower's base^(-2j/F) (twice too fast): the table's tie fails for minimax_m3.
    def fast_freqs(head_dim, *, base=10000.0, layout="pixtral"):
        a, b, axis, omega = real(head_dim, base=base, layout=layout)
        return a, b, axis, omega ** 2 if layout == "minimax_m3" else omega
    err = proof_failure("axial.frequencies", monkeypatch, axial, "axial_pairs", fast_freqs)
    assert isinstance(err, TieMismatch) and "minimax_m3" in str(err)
    monkeypatch.undo()
    # position_scale ignored (SAM 3's global layers rotated at the unscaled grid): the scaled tie fails.
    err = proof_failure("axial.relative.per_axis", monkeypatch, axial, "apply_axial_rope",
                        lambda x, pos, position_scale=1.0, **kw: good(x, pos, **kw))
    assert isinstance(err, ProofFailure) and "position_scale" in str(err)
