"""M-RoPE against transformers 5.24: the positions of ``get_rope_index`` (Qwen2-VL, Qwen2.5-VL,
Qwen3-VL) and the decoding positions from ``rope_deltas``, and the text attention of Qwen2-VL and
Qwen3-VL with the weights copied into ``MultiHeadAttention(scheme=MRotary(...))``, prefill and
cached decoding, in float64. Skipped when torch/transformers are missing."""

from types import SimpleNamespace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _torch import _np, _t, copy_projections  # noqa: E402

from minipos import mrope  # noqa: E402
from minipos.layer import MRotary, MultiHeadAttention  # noqa: E402

D_MODEL, HEADS, KV_HEADS, HEAD_DIM = 64, 4, 2, 16




def _model_stub(model_cls, merge=2, tokens_per_second=4):
    """What ``get_rope_index`` and ``compute_3d_position_ids`` read of the model: the vision config's
    merge size (and Qwen2.5-VL's tokens_per_second), its own methods and ``rope_deltas``. The HF
    methods run unchanged on it, without building the vision tower."""
    stub = SimpleNamespace(config=SimpleNamespace(vision_config=SimpleNamespace(
        spatial_merge_size=merge, tokens_per_second=tokens_per_second)), rope_deltas=None)
    for name in ("get_vision_position_ids", "get_rope_index", "compute_3d_position_ids"):
        setattr(stub, name, getattr(model_cls, name).__get__(stub))
    return stub


# text 3, image 1 x 4 x 6 (6 tokens), text 2, image 1 x 6 x 2 (3 tokens), text 2
TYPES = [0] * 3 + [1] * 6 + [0] * 2 + [1] * 3 + [0] * 2
IMAGES = [[1, 4, 6], [1, 6, 2]]


def _hf_positions(stub, types, **grids):
    ids = torch.zeros((1, len(types)), dtype=torch.long)
    pos, delta = stub.get_rope_index(ids, mm_token_type_ids=torch.tensor([types]),
                                     **{k: torch.tensor(v) for k, v in grids.items()})
    return _np(pos[:, 0]), int(delta[0, 0])


def test_positions_match_qwen2_vl_get_rope_index():
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
    want, want_delta = _hf_positions(_model_stub(Qwen2VLModel), TYPES, image_grid_thw=IMAGES)
    got, delta = mrope.mrope_positions(TYPES, image_grid_thw=IMAGES)
    np.testing.assert_array_equal(got, want)
    assert delta == want_delta


def test_video_positions_match_qwen2_5_vl_with_second_per_grid_ts():
    from transformers.models.qwen2_5_vl.modeling_qwen2_5_vl import Qwen2_5_VLModel
    types = [0] * 2 + [2] * 12 + [0] * 3 + [1] * 4 + [0]
    stub = _model_stub(Qwen2_5_VLModel, tokens_per_second=4)
    want, want_delta = _hf_positions(stub, types, video_grid_thw=[[3, 4, 4]], image_grid_thw=[[1, 4, 4]],
                                     second_per_grid_ts=[1.5])
    # Qwen2.5-VL: the temporal step is tokens_per_second * second_per_grid_ts = 4 * 1.5
    got, delta = mrope.mrope_positions(types, video_grid_thw=[[3, 4, 4]], image_grid_thw=[[1, 4, 4]],
                                       video_time_intervals=[4 * 1.5])
    np.testing.assert_array_equal(got, want)
    assert delta == want_delta


def test_video_positions_match_qwen3_vl_frame_by_frame():
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLModel
    # Qwen3-VL: a timestamp (text) before each frame; HF splits the (2, 4, 4) grid into two (1, 4, 4)
    types = [0] * 2 + [2] * 4 + [0] * 2 + [2] * 4 + [0] * 3
    want, want_delta = _hf_positions(_model_stub(Qwen3VLModel), types, video_grid_thw=[[2, 4, 4]])
    got, delta = mrope.mrope_positions(types, video_grid_thw=[[1, 4, 4], [1, 4, 4]])
    np.testing.assert_array_equal(got, want)
    assert delta == want_delta


def test_decode_positions_match_rope_deltas():
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLModel
    stub = _model_stub(Qwen2VLModel)
    T = len(TYPES)
    embeds = torch.zeros((1, T, 8))
    prefill = stub.compute_3d_position_ids(torch.zeros((1, T), dtype=torch.long), embeds,
                                           image_grid_thw=torch.tensor(IMAGES),
                                           mm_token_type_ids=torch.tensor([TYPES]))
    got, delta = mrope.mrope_positions(TYPES, image_grid_thw=IMAGES)
    np.testing.assert_array_equal(_np(prefill[:, 0]), got)
    cache = SimpleNamespace(get_seq_length=lambda: T)             # what the method reads of the cache
    step = stub.compute_3d_position_ids(None, torch.zeros((1, 3, 8)), cache=cache)
    np.testing.assert_array_equal(_np(step[:, 0]), mrope.mrope_decode_positions(T, 3, delta))


def _cos_sin(rotary, positions, theta):
    """HF's cos/sin for ``positions`` (3, T), with the angles in float64 instead of the module's float32:
    ``recomposition_frequencies`` (the stream assignment under test) is HF's own."""
    inv = 1.0 / theta ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    freqs = _t(positions)[:, None, :, None].double() * inv                  # (3, 1, T, D/2)
    return rotary.recomposition_frequencies(freqs.cos()), rotary.recomposition_frequencies(freqs.sin())


def _attend_hf(ref, rotary, x, positions, theta, cache=None, past=0):
    T = x.shape[1]
    allowed = np.arange(past + T)[None, :] <= past + np.arange(T)[:, None]     # sequence order
    mask = _t(np.where(allowed, 0.0, -np.inf)[None, None])
    with torch.no_grad():
        return _np(ref(_t(x), position_embeddings=_cos_sin(rotary, positions, theta), attention_mask=mask,
                       cache=cache)[0])


def _copy(layer, ref):
    copy_projections(layer, ref)
    if layer.bo is not None and ref.o_proj.bias is None:
        layer.bo = np.zeros(D_MODEL)


def _qwen2_vl(section):
    from transformers.models.qwen2_vl.configuration_qwen2_vl import Qwen2VLTextConfig
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLAttention, Qwen2VLRotaryEmbedding
    cfg = Qwen2VLTextConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                            rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "mrope_section": section})
    cfg._attn_implementation = "sdpa"  # eager takes the softmax in float32; sdpa stays in float64
    return Qwen2VLAttention(cfg, layer_idx=0).double().eval(), Qwen2VLRotaryEmbedding(cfg), cfg


def _qwen3_vl(section):
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLTextConfig
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextAttention, Qwen3VLTextRotaryEmbedding
    cfg = Qwen3VLTextConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                            head_dim=HEAD_DIM, attention_bias=True,
                            rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "mrope_section": section})
    cfg._attn_implementation = "sdpa"  # eager takes the softmax in float32; sdpa stays in float64
    ref = Qwen3VLTextAttention(cfg, layer_idx=0).double().eval()
    # Qwen3-VL normalises q and k per head (RMSNorm) before the rotation; minipos does not model it.
    ref.q_norm, ref.k_norm = torch.nn.Identity(), torch.nn.Identity()
    return ref, Qwen3VLTextRotaryEmbedding(cfg), cfg


@pytest.mark.parametrize("model, section, interleaved", [("qwen2_vl", [2, 3, 3], False),
                                                         ("qwen3_vl", [4, 2, 2], True)])
def test_attention_matches_transformers_prefill_and_cached_decoding(model, section, interleaved):
    from transformers import DynamicCache
    torch.manual_seed(0)
    ref, rotary, cfg = (_qwen2_vl if model == "qwen2_vl" else _qwen3_vl)(section)
    positions, delta = mrope.mrope_positions(TYPES, image_grid_thw=IMAGES)
    T = len(TYPES)
    x = np.random.default_rng(1).standard_normal((2, T + 2, D_MODEL))
    step_pos = [mrope.mrope_decode_positions(T + n, 1, delta) for n in range(2)]

    hf_cache = DynamicCache(config=cfg)
    want = [_attend_hf(ref, rotary, x[:, :T], positions, 1000.0, hf_cache)]
    want += [_attend_hf(ref, rotary, x[:, T + n:T + n + 1], step_pos[n], 1000.0, hf_cache, past=T + n)
             for n in range(2)]

    layer = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=KV_HEADS, bias=True,
                               scheme=MRotary(mrope_section=section, base=1000.0, interleaved=interleaved))
    _copy(layer, ref)
    cache = layer.new_cache()
    got = [layer(x[:, :T], positions=positions, causal=True, cache=cache)]
    got += [layer(x[:, T + n:T + n + 1], positions=step_pos[n], causal=True, cache=cache) for n in range(2)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)

    # HF's own cos/sin (angles in float32, as the checkpoint runs): agreement to float32 accuracy.
    with torch.no_grad():
        cos, sin = rotary(_t(x[:, :T]), _t(positions)[:, None].expand(3, 2, T))
        mask = _t(np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf)[None, None])
        own = _np(ref(_t(x[:, :T]), position_embeddings=(cos.double(), sin.double()), attention_mask=mask)[0])
    np.testing.assert_allclose(got[0], own, rtol=1e-5, atol=1e-6)
