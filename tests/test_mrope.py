"""Multimodal RoPE (minipos.mrope, MRotary): the frequency assignment, the rotation and its
backward, the positions of a text/image/text sequence, and the layer (dense, blockwise, cached,
fast). The transformers cross-checks are in tests/test_mrope_interop.py."""

import numpy as np
import pytest

import minipos.fast as fast
from minipos import mrope, rope
from minipos.layer import MRotary, MultiHeadAttention

from _gradcheck import check_layer_gradients


def test_streams_split_and_interleaved_by_hand():
    # Qwen2-VL: split in order [n_t, n_h, n_w] (HF recomposition_frequencies: split, then m[i % 3]).
    assert mrope.mrope_streams([2, 3, 3]).tolist() == [0, 0, 1, 1, 1, 2, 2, 2]
    # Qwen3-VL [24, 20, 20]: height at slice(1, 60, 3), width at slice(2, 60, 3), temporal elsewhere
    # (read off HF Qwen3VLTextRotaryEmbedding.recomposition_frequencies): T H W x 20, then T T T T.
    assert mrope.mrope_streams([24, 20, 20], interleaved=True).tolist() == [0, 1, 2] * 20 + [0] * 4
    assert mrope.mrope_streams([4, 2, 2], interleaved=True).tolist() == [0, 1, 2, 0, 1, 2, 0, 0]
    # ERNIE-4.5-VL, config section [22, 22, 20] (h, w, t) = minipos [20, 22, 22]: H W x 22, then T x 20 (HF
    # inv_freq_3d takes the even, then the odd frequencies of the first 44; recomposition_frequencies stacks them).
    assert mrope.mrope_streams([20, 22, 22], interleaved="hw").tolist() == [1, 2] * 22 + [0] * 20
    assert mrope.mrope_streams([2, 3, 3], interleaved="hw").tolist() == [1, 2, 1, 2, 1, 2, 0, 0]


def test_angles_by_hand():
    # D/2 = 3, one frequency per stream; token at (t, h, w) = (5, 7, 11): angles 5 θ_0, 7 θ_1, 11 θ_2.
    theta = np.array([1.0, 0.5, 0.25])
    got = mrope.mrope_angles(np.array([[5], [7], [11]]), theta, [1, 1, 1])
    np.testing.assert_array_equal(got, [[5.0, 3.5, 2.75]])


@pytest.mark.parametrize("interleaved", [False, True, "hw"])
def test_equal_streams_are_plain_rope(interleaved):
    # Text tokens (t = h = w = m): every pair is rotated by m θ_i, i.e. half-layout RoPE.
    x = np.random.default_rng(0).standard_normal((2, 3, 6, 16))
    pos = np.array([0, 1, 2, 7, 100, 4096])
    got = mrope.apply_mrope(x, np.stack([pos] * 3), [4, 2, 2], interleaved=interleaved, base=500.0)
    np.testing.assert_allclose(got, rope.apply_rope(x, pos, layout="half", base=500.0), rtol=0, atol=1e-12)


@pytest.mark.parametrize("interleaved", [False, True, "hw"])
def test_score_depends_on_the_three_differences_only(interleaved):
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal((2, 16))
    pq, pk = np.array([[3], [5], [8]]), np.array([[1], [9], [2]])

    def score(a, b):
        return float(mrope.apply_mrope(q[None], a, [4, 2, 2], interleaved=interleaved)[0]
                     @ mrope.apply_mrope(k[None], b, [4, 2, 2], interleaved=interleaved)[0])

    shift = np.array([[13], [-4], [250]])                 # a different offset per stream
    assert abs(score(pq, pk) - score(pq + shift, pk + shift)) < 1e-12
    assert abs(score(pq, pk) - score(pq + shift * [[1], [0], [0]], pk)) > 1e-3   # one stream moved: changes


@pytest.mark.parametrize("interleaved", [False, True, "hw"])
def test_backward_is_the_adjoint(interleaved):
    rng = np.random.default_rng(2)
    x, dy = rng.standard_normal((2, 3, 5, 8))
    pos = rng.integers(0, 50, (3, 5))
    y = mrope.apply_mrope(x, pos, [2, 1, 1], interleaved=interleaved, attention_factor=1.5)
    dx = mrope.apply_mrope_backward(dy, pos, [2, 1, 1], interleaved=interleaved, attention_factor=1.5)
    assert abs(np.sum(y * dy) - np.sum(x * dx)) < 1e-10
    np.testing.assert_allclose(np.linalg.norm(y, axis=-1), 1.5 * np.linalg.norm(x, axis=-1))


def test_positions_text_image_text_by_hand():
    # 2 text, a 1 x 4 x 4 image merged 2 x 2 (4 tokens), 2 text. Image: t = 2, h = 2 + row, w = 2 + col;
    # the text after it continues at 2 + max(4, 4) // 2 = 4; delta = max + 1 - T = 6 - 8.
    pos, delta = mrope.mrope_positions([0, 0, 1, 1, 1, 1, 0, 0], image_grid_thw=[[1, 4, 4]])
    assert pos.tolist() == [[0, 1, 2, 2, 2, 2, 4, 5], [0, 1, 2, 2, 3, 3, 4, 5], [0, 1, 2, 3, 2, 3, 4, 5]]
    assert delta == -2
    assert mrope.mrope_decode_positions(8, 2, delta).tolist() == [[6, 7]] * 3
    # a video of 2 frames, 2 x 4 patches, time step 3 (Qwen2.5-VL): t = 1 + 3 tau; text after at 1 + 4 // 2.
    pos, delta = mrope.mrope_positions([0, 2, 2, 2, 2, 0], video_grid_thw=[[2, 2, 4]], video_time_intervals=[3.0])
    assert pos.tolist() == [[0, 1, 1, 4, 4, 3], [0, 1, 1, 1, 1, 3], [0, 1, 2, 1, 2, 3]]
    assert delta == 5 - 6


@pytest.mark.parametrize("call, match", [
    (lambda: mrope.mrope_streams([2, 3]), "mrope_section"),
    (lambda: mrope.mrope_streams([1, 3, 3], interleaved=True), "interleaved mrope_section"),
    (lambda: mrope.mrope_streams([2, 3, 3], interleaved=1), "interleaved"),
    (lambda: mrope.mrope_streams([2, 3, 3], interleaved="thw"), "interleaved.*'hw'"),
    (lambda: mrope.mrope_streams([2, 4, 2], interleaved="hw"), "counts must be equal"),
    (lambda: MRotary(interleaved="ernie"), "interleaved"),
    (lambda: mrope.apply_mrope(np.ones((4, 8)), np.zeros((2, 4), int), [2, 1, 1]), "positions"),
    (lambda: mrope.apply_mrope(np.ones((4, 8)), np.zeros((3, 4), int), [2, 2, 1]), "inv_freq|mrope_section"),
    (lambda: mrope.apply_mrope(np.ones((4, 7)), np.zeros((3, 4), int), [2, 1, 1]), "even head dim"),
    (lambda: mrope.apply_mrope(np.ones((4, 8)), np.full((3, 4), 0.5), [2, 1, 1]), "positions"),
    (lambda: mrope.mrope_positions([0, 1, 1, 0], image_grid_thw=[[1, 4, 4]]), "needs 4 tokens"),
    (lambda: mrope.mrope_positions([0, 1, 1, 1, 1], image_grid_thw=None), "image_grid_thw"),
    (lambda: mrope.mrope_positions([0, 3], image_grid_thw=None), "token_types"),
    (lambda: mrope.mrope_positions([0, 2, 0], video_grid_thw=[[1, 2, 2]], video_time_intervals=[1, 2]),
     "video_time_intervals"),
    (lambda: MultiHeadAttention(16, 2, scheme=MRotary(mrope_section=[2, 2, 2])), "head_dim/2"),
])
def test_bad_input_is_refused_by_name(call, match):
    with pytest.raises((ValueError, TypeError), match=match):
        call()


def _layer(cls=MultiHeadAttention, interleaved=False, **kw):
    return cls(32, 4, scheme=MRotary(mrope_section=[2, 1, 1], interleaved=interleaved, base=100.0), num_kv_heads=2,
               bias=True, **kw)


def _sequence():
    pos, delta = mrope.mrope_positions([0, 0, 1, 1, 1, 1, 1, 1, 0, 0, 0], image_grid_thw=[[1, 4, 6]])
    return np.random.default_rng(3).standard_normal((2, 11, 32)), pos, delta


@pytest.mark.parametrize("interleaved", [False, True, "hw"])
def test_layer_dense_blockwise_fast_and_cache_agree(interleaved):
    x, pos, delta = _sequence()
    dense = _layer(interleaved=interleaved)(x, positions=pos, causal=True)
    for other in (_layer(interleaved=interleaved, block_size=3), _layer(fast.MultiHeadAttention, interleaved)):
        np.testing.assert_allclose(other(x, positions=pos, causal=True), dense, rtol=1e-12, atol=1e-12)
    # the mask follows sequence order: the image's positions (2, 3, 4 …) do not reorder attention
    layer = _layer(interleaved=interleaved)
    assert not np.allclose(layer(x, positions=pos, causal=True)[:, :3],
                           layer(x[:, :3], positions=pos[:, :3], causal=False))
    # prefill 9 tokens, then decode 2 one at a time with positions cache_length + delta (HF rope_deltas)
    extra = np.random.default_rng(4).standard_normal((2, 2, 32))
    full_pos = np.concatenate([pos[:, :9], mrope.mrope_decode_positions(9, 2, delta)], axis=1)
    full = layer(np.concatenate([x[:, :9], extra], 1), positions=full_pos, causal=True)
    cache = layer.new_cache()
    outs = [layer(x[:, :9], positions=pos[:, :9], causal=True, cache=cache)]
    for n in range(2):
        outs.append(layer(extra[:, n:n + 1], positions=mrope.mrope_decode_positions(cache.seen, 1, delta),
                          causal=True, cache=cache))
    np.testing.assert_allclose(np.concatenate(outs, 1), full, rtol=1e-12, atol=1e-12)
    assert cache.positions.tolist() == list(range(11))   # the cache holds sequence order


def test_layer_text_positions_equal_rotary():
    # (T,) positions with M-RoPE are three equal streams: the half-layout Rotary layer's output.
    from minipos.layer import Rotary
    x = np.random.default_rng(5).standard_normal((1, 6, 32))
    a, b = _layer(), MultiHeadAttention(32, 4, scheme=Rotary(layout="half", base=100.0), num_kv_heads=2, bias=True)
    for n in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"):
        setattr(b, n, getattr(a, n))
    np.testing.assert_allclose(a(x, causal=True), b(x, causal=True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("interleaved, block, cls", [(False, None, MultiHeadAttention), (True, 3, MultiHeadAttention),
                                                     (True, None, fast.MultiHeadAttention),
                                                     ("hw", 3, fast.MultiHeadAttention)])
def test_layer_gradients_match_finite_differences(interleaved, block, cls):
    x, pos, _ = _sequence()
    layer = _layer(cls, interleaved, block_size=block)
    dy = np.random.default_rng(6).standard_normal(x.shape)
    check_layer_gradients(layer, x, dy, lambda x_, **kw: layer(x_, positions=pos, causal=True, **kw),
                     np.random.default_rng(7))


def test_layer_gradients_after_a_cache():
    x, pos, delta = _sequence()
    layer = _layer(interleaved=True)
    cache = layer.new_cache()
    layer(x[:, :7], positions=pos[:, :7], causal=True, cache=cache)
    k, v, seq, tag = cache.k.copy(), cache.v.copy(), cache.positions.copy(), cache.tag
    step = mrope.mrope_decode_positions(7, 4, delta)

    def call(x_, **kw):                                   # the cached keys and values are constants
        c = layer.new_cache()
        c.append(k, v, seq, tag=tag)
        return layer(x_, positions=step, causal=True, cache=c, **kw)
    check_layer_gradients(layer, x[:, 7:], np.random.default_rng(8).standard_normal((2, 4, 32)), call,
                     np.random.default_rng(9))


def test_layer_refuses_positions_of_the_wrong_shape():
    x, pos, _ = _sequence()
    with pytest.raises(ValueError, match="positions"):
        _layer()(x, positions=pos[:2])
    with pytest.raises(ValueError, match="positions"):
        _layer()(x, positions=-pos)
    cache = (layer := _layer()).new_cache()
    with pytest.raises(ValueError, match="positions"):
        layer(x, positions=pos[:, :5], cache=cache)
    assert cache.length == 0                              # a failed call leaves the cache as it was


def test_recorded_vectors_hold_the_adjoint_identity_and_hand_positions():
    import json
    import pathlib
    from minipos import vectors
    root = pathlib.Path(__file__).resolve().parents[1] / "spec" / "vectors"
    doc = json.loads((root / "mrope_grad.json").read_text())
    rng = np.random.default_rng(10)
    for case in doc["cases"]:
        dy, pos = (vectors.decode(case["inputs"][n]) for n in ("dy", "positions"))
        dx = vectors.decode(case["expected"]["dx"])
        x = rng.standard_normal(dy.shape)                 # <f(x), dy> = <x, f^T dy> with the forward f
        assert abs(np.sum(mrope.apply_mrope(x, pos, **case["params"]) * dy) - np.sum(x * dx)) < 1e-9
    doc = json.loads((root / "mrope_positions.json").read_text())
    case = next(c for c in doc["cases"] if c["name"] == "text_only")
    assert vectors.decode(case["expected"]["positions"]).tolist() == [list(range(5))] * 3   # t = h = w = n
