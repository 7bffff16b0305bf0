"""SAM's decomposed relative position bias: hand-worked cases, HF's ``get_rel_pos`` (with its interpolation and
unequal sizes), ``get_decomposed_rel_pos`` and ``SamVisionAttention`` with copied weights (float64), the two forms,
the backward against central differences and torch's autograd, relative per axis, bad input, and the proof fed a
wrong formula."""

import numpy as np
import pytest

from minipos import decomposed as dc
from minipos.decomposed import DecomposedRelPos
from minipos.layer import MultiHeadAttention


def test_resize_table_hand_worked():
    # Rows 0, 1, 2 to 5 rows, align_corners=False: the sources max((i + 1/2) 3/5 - 1/2, 0) = 0, 0.4, 1.0, 1.6, 2.2,
    # the last clamped to row 2: values 0, 0.4, 1, 1.6, 2 (by hand).
    got = dc.resize_table(np.array([[0.0], [1.0], [2.0]]), 5)
    np.testing.assert_allclose(got[:, 0], [0.0, 0.4, 1.0, 1.6, 2.0], rtol=0, atol=1e-15)
    t = np.arange(6.0).reshape(3, 2)
    assert dc.resize_table(t, 3) is t                                    # the same length: unchanged


def test_rel_pos_table_hand_worked():
    # q_size = k_size = 3: row i - j + 2 of a 5-row table (query minus key), by hand.
    t = np.arange(5.0)[:, None]
    assert dc.rel_pos_table(3, 3, t)[..., 0].tolist() == [[2, 1, 0], [3, 2, 1], [4, 3, 2]]
    # q_size 2, k_size 4: the query coordinates are stretched by 4/2 = 2: rows 2i - j + 3 (HF's formula).
    t = np.arange(7.0)[:, None]
    assert dc.rel_pos_table(2, 4, t)[..., 0].tolist() == [[3, 2, 1, 0], [5, 4, 3, 2]]


def test_decomposed_logits_hand_worked():
    # A 1 x 2 grid, D = 2: R_h = [[10, 0]] (h = 1), R_w rows (c - c' = -1, 0, 1) = (1, 0), (0, 1), (2, 2).
    # q(0,0) = (1, 3): key (0,0) 10 + 3 = 13, key (0,1) 10 + 1 = 11; q(0,1) = (2, 1): key (0,0) 20 + 6 = 26,
    # key (0,1) 20 + 1 = 21 (by hand).
    q = np.array([[1.0, 3.0], [2.0, 1.0]])
    th, tw = np.array([[10.0, 0.0]]), np.array([[1.0, 0.0], [0.0, 1.0], [2.0, 2.0]])
    pos = np.array([[0, 0], [0, 1]])
    want = [[13.0, 11.0], [26.0, 21.0]]
    np.testing.assert_array_equal(dc.decomposed_logits(q, th, tw, pos, pos), want)
    np.testing.assert_array_equal(dc.decomposed_logits_pairwise(q, th, tw, pos, pos), want)
    np.testing.assert_array_equal(dc.decomposed_bias(q, th, tw, (1, 2), (1, 2)), want)


def test_forms_agree_and_are_relative_per_axis():
    rng = np.random.default_rng(0)
    h, w, D = 3, 4, 6
    q = rng.standard_normal((2, 3, h * w, D))
    th, tw = rng.standard_normal((2 * h - 1, D)), rng.standard_normal((2 * w - 1, D))
    grid = dc.grid_of(np.arange(h * w), w)
    assert grid[:, :6].tolist() == [[0, 0, 0, 0, 1, 1], [0, 1, 2, 3, 0, 1]]      # row-major, HF's reshape
    want = dc.decomposed_bias(q, th, tw, (h, w), (h, w))
    np.testing.assert_allclose(dc.decomposed_logits(q, th, tw, grid, grid), want, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(dc.decomposed_logits_pairwise(q, th, tw, grid, grid), want, rtol=1e-13, atol=1e-13)
    for shift in ([[5], [0]], [[0], [-7]], [[3], [11]]):
        moved = grid + np.array(shift)
        np.testing.assert_allclose(dc.decomposed_logits(q, th, tw, moved, moved), want, rtol=1e-13, atol=1e-13)
    # A shift of the flat sequence by one is not a shift of the grid: the logits change.
    flat = dc.grid_of(np.arange(h * w) + 1, w)
    assert not np.allclose(dc.decomposed_logits(q, th, tw, flat, flat), want)
    # Beyond the table the offset is clipped: rows 10 apart read the last row, as rows 2 apart do.
    far = dc.decomposed_logits(q[0, 0, :1], th, tw, [[10], [0]], [[0, 2], [0, 0]])
    assert far[0, 0] == far[0, 1]


def test_backward_against_central_differences():
    rng = np.random.default_rng(1)
    q = rng.standard_normal((2, 5, 4))
    th, tw = rng.standard_normal((5, 4)), rng.standard_normal((3, 4))
    qp, kp = np.array([[0, 1, 2, 0, 4], [1, 0, 1, 1, 0]]), np.array([[0, 2, 1], [0, 1, 1]])
    g = rng.standard_normal((2, 5, 3))
    dq, dh, dw = dc.decomposed_logits_backward(q, th, tw, qp, kp, g)
    f = lambda q_, th_, tw_: np.sum(g * dc.decomposed_logits(q_, th_, tw_, qp, kp))   # noqa: E731
    for arr, grad, which in ((q, dq, 0), (th, dh, 1), (tw, dw, 2)):
        num = np.zeros_like(arr)
        for idx in np.ndindex(arr.shape):
            args = [q.copy(), th.copy(), tw.copy()]
            args[which][idx] += 1e-6
            up = f(*args)
            args[which][idx] -= 2e-6
            num[idx] = (up - f(*args)) / 2e-6
        np.testing.assert_allclose(grad, num, rtol=1e-7, atol=1e-8)


def test_layer_logits_are_the_scaled_content_plus_the_unscaled_bias():
    layer = MultiHeadAttention(8, 2, scheme=DecomposedRelPos(2, 3), seed=4)
    x = np.random.default_rng(2).standard_normal((1, 6, 8))
    _, weights = layer(x, return_weights=True)
    heads = lambda w: (x @ w).reshape(1, 6, 2, 4).transpose(0, 2, 1, 3)  # noqa: E731
    q, k = heads(layer.wq), heads(layer.wk)
    grid = dc.grid_of(np.arange(6), 3)
    # written out: (q k^T) / sqrt(D) + q . R_h[r - r' + 1] + q . R_w[c - c' + 2], the bias not scaled (HF)
    rh, rw = layer.scheme.rel_pos_h, layer.scheme.rel_pos_w
    bias = np.einsum("bhtd,tsd->bhts", q, rh[grid[0][:, None] - grid[0][None, :] + 1]
                     + rw[grid[1][:, None] - grid[1][None, :] + 2])
    logits = q @ k.transpose(0, 1, 3, 2) / 2.0 + bias
    want = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(weights, want / want.sum(-1, keepdims=True), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("bad, match", [
    (dict(table_h=np.zeros((4, 2))), "table_h must have shape"),                # even length: not 2 size - 1
    (dict(table_w=np.zeros((3, 5))), "table_w must have shape"),                # the wrong head dim
    (dict(q_positions=np.arange(2)), r"q_positions must have shape \(2, T\)"),  # one stream
    (dict(q_positions=np.zeros((2, 3), int)), "q_positions must have shape"),   # T does not match q
])
def test_bad_input_is_refused_by_name(bad, match):
    args = dict(q=np.ones((2, 2)), table_h=np.ones((3, 2)), table_w=np.ones((3, 2)),
                q_positions=np.zeros((2, 2), int), k_positions=np.zeros((2, 2), int))
    args.update(bad)
    with pytest.raises(ValueError, match=match):
        dc.decomposed_logits(**args)


def test_bad_configuration_is_refused():
    with pytest.raises(ValueError, match="height"):
        DecomposedRelPos(height=0)
    with pytest.raises((TypeError, ValueError), match="width"):
        DecomposedRelPos(width=2.5)
    with pytest.raises(ValueError, match="q must have shape"):
        dc.decomposed_bias(np.ones((5, 2)), np.ones((3, 2)), np.ones((3, 2)), (2, 2), (2, 2))


# --------------------------------------------------------------------------- HF (transformers 5.24)

def _hf_attention(window, hidden=16, heads=2, seed=0, sdpa=False):
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers import SamVisionConfig
    from transformers.models.sam.modeling_sam import SamVisionAttention, SamVisionSdpaAttention
    cfg = SamVisionConfig(hidden_size=hidden, num_attention_heads=heads, image_size=64, patch_size=16,
                          use_rel_pos=True, qkv_bias=True)
    torch.manual_seed(seed)
    att = (SamVisionSdpaAttention if sdpa else SamVisionAttention)(cfg, window_size=window).double().eval()
    with torch.no_grad():
        for p in att.parameters():
            p.copy_(torch.randn_like(p) * 0.5)                          # rel-pos tables too (HF inits zeros)
    return torch, att


@pytest.mark.parametrize("L", [3, 5, 7, 9, 13])
@pytest.mark.parametrize("q_size, k_size", [(4, 4), (3, 5), (5, 3), (7, 2), (2, 7), (6, 4)])
def test_rel_pos_table_equals_hf_get_rel_pos(L, q_size, k_size):
    torch, att = _hf_attention(0)
    t = np.random.default_rng(L).standard_normal((L, 8))
    want = att.get_rel_pos(q_size, k_size, torch.tensor(t)).numpy()     # interpolated when L != 2 max - 1
    np.testing.assert_allclose(dc.rel_pos_table(q_size, k_size, t), want, rtol=0, atol=1e-13)


@pytest.mark.parametrize("q_size, k_size", [((2, 3), (2, 3)), ((3, 2), (4, 5)), ((4, 4), (2, 3))])
def test_decomposed_bias_equals_hf_get_decomposed_rel_pos(q_size, k_size):
    torch, att = _hf_attention(0)
    rng = np.random.default_rng(3)
    q = rng.standard_normal((2, q_size[0] * q_size[1], 8))
    th, tw = rng.standard_normal((7, 8)), rng.standard_normal((5, 8))
    want = att.get_decomposed_rel_pos(torch.tensor(q), torch.tensor(th), torch.tensor(tw), q_size, k_size)
    np.testing.assert_allclose(dc.decomposed_bias(q, th, tw, q_size, k_size),
                               want.reshape(2, q.shape[1], -1).numpy(), rtol=0, atol=1e-12)


def test_backward_equals_torch_autograd_of_hf():
    torch, att = _hf_attention(0)
    rng = np.random.default_rng(4)
    q, th, tw, g = (rng.standard_normal(s) for s in ((2, 6, 8), (3, 8), (5, 8), (2, 6, 6)))
    tq, tth, ttw = (torch.tensor(a, requires_grad=True) for a in (q, th, tw))
    out = att.get_decomposed_rel_pos(tq, tth, ttw, (2, 3), (2, 3)).reshape(2, 6, 6)
    (out * torch.tensor(g)).sum().backward()
    grid = dc.grid_of(np.arange(6), 3)
    got = dc.decomposed_logits_backward(q, th, tw, grid, grid, g)
    for mine, theirs in zip(got, (tq, tth, ttw)):
        np.testing.assert_allclose(mine, theirs.grad.numpy(), rtol=0, atol=1e-12)


@pytest.mark.parametrize("sdpa, atol", [(True, 1e-10), (False, 1e-5)])
@pytest.mark.parametrize("window, grid", [(3, (3, 3)), (0, (4, 4))])
def test_layer_equals_hf_sam_vision_attention(window, grid, sdpa, atol):
    """SamVisionSdpaAttention and SamVisionAttention (a window layer, window_size 3, and a global one, 64 / 16 = 4)
    with copied weights, float64. The eager class takes its softmax in float32 (``softmax(attn_weights,
    dtype=torch.float32)``), so it agrees to float32's precision only; the SDPA class stays in float64."""
    torch, att = _hf_attention(window, sdpa=sdpa)
    h, w = grid
    C, H = 16, 2
    layer = MultiHeadAttention(C, H, scheme=DecomposedRelPos(h, w), bias=True, dtype=np.float64)
    W, b = att.qkv.weight.detach().numpy(), att.qkv.bias.detach().numpy()
    layer.wq, layer.wk, layer.wv = (W[i * C:(i + 1) * C].T.copy() for i in range(3))   # (3C, C): q, k, v rows
    layer.bq, layer.bk, layer.bv = (b[i * C:(i + 1) * C].copy() for i in range(3))
    layer.wo, layer.bo = att.proj.weight.detach().numpy().T.copy(), att.proj.bias.detach().numpy().copy()
    layer.scheme.rel_pos_h = att.rel_pos_h.detach().numpy().copy()
    layer.scheme.rel_pos_w = att.rel_pos_w.detach().numpy().copy()
    x = np.random.default_rng(5).standard_normal((2, h, w, C))
    with torch.no_grad():
        want = att(torch.tensor(x))[0].numpy()                          # (B, h, w, C)
    got = layer(x.reshape(2, h * w, C), causal=False)                   # positions arange: the grid row by row
    np.testing.assert_allclose(got, want.reshape(2, h * w, C), rtol=0, atol=atol)


# --------------------------------------------------------------------------- the proof

def test_the_proof_fails_on_a_wrong_formula(monkeypatch):
    pytest.importorskip("sympy")
    from _proof_support import proof_failure
    from proofs.core import TieMismatch

    real = dc.decomposed_logits

    def key_minus_query(q, table_h, table_w, q_positions, k_positions):    # the sign flipped: row r' - r + h - 1
        return real(q, table_h, table_w, -np.asarray(q_positions), -np.asarray(k_positions))
    err = proof_failure("decomposed.relative.per_axis", monkeypatch, dc, "decomposed_logits", key_minus_query)
    assert isinstance(err, TieMismatch)
    monkeypatch.undo()

    def absolute_rows(q, table_h, table_w, q_positions, k_positions):      # the key's row ignored: not relative
        kp = np.array(k_positions)
        kp[0] = 0
        return real(q, table_h, table_w, q_positions, kp)
    err = proof_failure("decomposed.relative.per_axis", monkeypatch, dc, "decomposed_logits", absolute_rows)
    assert isinstance(err, TieMismatch)
