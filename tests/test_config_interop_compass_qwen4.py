"""``minipos.config.read`` on the families of ``minipos._config_compass_qwen4`` against transformers 5.24, as in
``test_config_interop_towers.py``: each model, tiny, is built by transformers with random weights in float64; a
forward hook captures each attention module's input and output inside the model, so that the masks, the M-RoPE
streams (from the model's own ``get_rope_index`` on a prompt holding an image) and the tower's patch order are the
model's own. The weights are copied into the layer ``read`` builds for the same config: it must match within atol
1e-6. HF's RMSNorms (float32 inside) are replaced by their float64 formula. Skipped when torch or transformers is
missing.

transformers rotates q and k in float32 (cos and sin from float32 angles) inside the float64 model: agreement is to
float32 accuracy, well inside 1e-6 at these sizes."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_config_interop_more import _copy, _hook  # noqa: E402
from test_config_interop_qwen_vision import (  # noqa: E402
    ATOL,
    MERGE,
    TOWER,
    H,
    W,
    _cfg,
    _randomize,
    _run_tower,
)
from test_config_interop_qwen_vision import _compare as compare_tower  # noqa: E402
from test_config_interop_towers import _copy_gated  # noqa: E402

from minipos import config as mconfig  # noqa: E402
from minipos.axial import axial_positions, merge_positions  # noqa: E402
from minipos.seams import NoPE  # noqa: E402

B = 2
VISION = dict(depth=2, hidden_size=32, num_heads=2, out_hidden_size=32, intermediate_size=8, patch_size=2,
              temporal_patch_size=1, in_channels=1, spatial_merge_size=2, num_position_embeddings=16,
              rope_parameters={"rope_type": "axial", "rope_theta": 100.0})


def _prompt(config, grid=(1, 4, 6)):
    """A prompt of 3 text tokens, the image's ``vision_start``, its ``(h/2) (w/2)`` tokens, ``vision_end`` and 3 text
    tokens: ``(input_ids, mm_token_type_ids, image_grid_thw)`` as the processor gives them, batch ``B``."""
    n = grid[1] * grid[2] // 4
    ids = [1, 2, 3, config.vision_start_token_id] + [config.image_token_id] * n + [config.vision_end_token_id, 4, 5, 6]
    types = [0] * 4 + [1] * n + [0] * 4
    return torch.tensor([ids] * B), torch.tensor([types] * B), torch.tensor([list(grid)] * B)


def _streams(outer_cls, cfg):
    """The M-RoPE positions ``(3, T)`` of ``_prompt`` by the model's own ``get_rope_index`` (a tiny outer model)."""
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        outer = outer_cls(cfg).eval()
    ids, types, grid = _prompt(cfg)
    pos, _ = outer.get_rope_index(ids, mm_token_type_ids=types, image_grid_thw=grid)
    assert torch.equal(pos[:, 0], pos[:, 1])
    return pos[:, 0].numpy()                                                   # (3, T)


def _float64_norm(norm, offset=0.0):
    """An HF RMSNorm's formula, ``x / rms(x) * (offset + w)``, in float64 (HF casts to float32 first)."""
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    norm.forward = lambda h: h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * (offset + norm.weight)


# --------------------------------------------------------------------------- Cohere Compass

def _compass_text(**kw):
    return {**dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=16, vocab_size=8,
                   num_hidden_layers=3), **kw}


def _compass(text):
    return _cfg(transformers.CohereCompassConfig, text_config=text, vision_config=VISION,
                image_token_id=7, video_token_id=6, vision_start_token_id=5, vision_end_token_id=4)


def _run_compass(cfg, positions):
    from transformers.models.cohere_compass import modeling_cohere_compass as hf
    text = cfg.text_config
    text._attn_implementation = "eager"
    torch.manual_seed(0)
    model = hf.CohereCompassTextModel(text).double().eval()
    seen = {}
    for i, dec in enumerate(model.layers):
        dec.mlp.forward = lambda h: torch.zeros_like(h)
        _randomize(dec.self_attn)
        _hook(dec.self_attn, seen, i)
    T = positions.shape[-1]
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((B, T, text.hidden_size)))
    ids = np.broadcast_to(positions[:, None], (3, B, T)) if positions.ndim == 2 else np.broadcast_to(positions, (B, T))
    with torch.no_grad():
        model(inputs_embeds=x, position_ids=torch.from_numpy(ids.copy()), use_cache=False)
    return model, seen


@pytest.mark.parametrize("bias", [False, True])
def test_cohere_compass_sliding_mrope_and_full_nope_layers(bias):
    # CohereCompassRotaryEmbedding per layer type: sliding layers interleaved M-RoPE ([2, 1, 1] of head dim 32 // 4
    # = 8), rotate_half (not Cohere 2's interleaved pairs); the full layer's entry null: NoPE. Window 4, attention_bias.
    rope = {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0, "mrope_section": [2, 1, 1]},
            "full_attention": None}
    cfg = _compass(_compass_text(layer_types=["sliding_attention", "full_attention", "sliding_attention"],
                                 sliding_window=4, rope_parameters=rope, attention_bias=bias))
    positions = _streams(transformers.CohereCompassModel, cfg)               # the image's rows and columns differ
    assert not np.array_equal(positions[1], positions[2])
    model, seen = _run_compass(cfg, positions)
    read = mconfig.read(cfg)
    assert read.model_type == "cohere_compass_text" and read.vision.model_type == "cohere_compass_vision"
    assert isinstance(read.layers[1].scheme, NoPE) and read.specs[0].kwargs["sliding_window"] == 4
    for i, dec in enumerate(model.layers):
        layer = read.layers[i]
        _copy(dec.self_attn, layer)
        x, want = seen[i]
        p = positions if i != 1 else np.arange(positions.shape[1])             # NoPE: the sequence order
        np.testing.assert_allclose(layer(x, positions=p, causal=True), want, rtol=0, atol=ATOL, err_msg=f"layer {i}")
        assert np.max(np.abs(want)) > 0.1
        if i != 1:                                                            # the streams matter
            assert np.max(np.abs(layer(x, positions=positions[[0, 2, 1]], causal=True) - want)) > 1e-3
    wide = read.specs[0].build()                                               # no window: another output
    wide.sliding_window = None
    _copy(model.layers[0].self_attn, wide)
    assert np.max(np.abs(wide(seen[0][0], positions=positions, causal=True) - seen[0][1])) > 1e-3


def test_cohere_compass_default_section_on_a_small_head_as_hf_assigns_it():
    # No mrope_section: HF's [24, 20, 20] on head dim 64 // 4 = 16 (8 frequencies): height at 1, 4, 7, width at 2, 5,
    # time at 0, 3, 6: read as [3, 3, 2], a note says so; 1-D positions (text alone) too. mrope_interleaved false
    # changes nothing in HF (a note says so).
    rope = {"full_attention": {"rope_type": "default", "rope_theta": 100.0, "mrope_interleaved": False}}
    cfg = _compass(_compass_text(hidden_size=64, num_hidden_layers=1, rope_parameters=rope))
    read = mconfig.read(cfg)
    assert read.layers[0].scheme.mrope_section == [3, 3, 2] and "[3, 3, 2]" in read.specs[0].notes[0]
    assert read.layers[0].scheme.interleaved and "mrope_interleaved false is not read" in read.specs[0].notes[1]
    positions = _streams(transformers.CohereCompassModel, cfg)
    for p in (positions, np.arange(positions.shape[1])):
        model, seen = _run_compass(cfg, p)
        layer = read.layers[0]
        _copy(model.layers[0].self_attn, layer)
        np.testing.assert_allclose(layer(seen[0][0], positions=p, causal=True), seen[0][1], rtol=0, atol=ATOL)


def test_cohere_compass_turns_the_whole_head_whatever_partial_rotary_factor_says():
    # CohereCompassRotaryEmbedding.compute_default_rope_parameters takes dim = head_dim: [2, 1, 1] with
    # partial_rotary_factor 0.5 turns all 8 features, its 4 frequencies assigned [2, 1, 1].
    rope = {"full_attention": {"rope_type": "default", "rope_theta": 100.0, "mrope_section": [2, 1, 1],
                               "partial_rotary_factor": 0.5}}
    cfg = _compass(_compass_text(num_hidden_layers=1, rope_parameters=rope))
    read = mconfig.read(cfg)
    assert read.layers[0].scheme.rotary_dim == 8 and "partial_rotary_factor is not read" in read.specs[0].notes[-1]
    positions = _streams(transformers.CohereCompassModel, cfg)
    model, seen = _run_compass(cfg, positions)
    layer = read.layers[0]
    _copy(model.layers[0].self_attn, layer)
    np.testing.assert_allclose(layer(seen[0][0], positions=positions, causal=True), seen[0][1], rtol=0, atol=ATOL)


def test_cohere_compass_vision_tower_is_qwen3_vls():
    from transformers.models.cohere_compass import modeling_cohere_compass as hf
    cfg = _cfg(hf.CohereCompassVisionConfig, hidden_size=32, out_hidden_size=8, intermediate_size=8,
               num_position_embeddings=16, deepstack_visual_indexes=[], **TOWER)
    tower, seen = _run_tower(hf.CohereCompassVisionModel, cfg)
    model = mconfig.read(cfg)
    assert model.model_type == "cohere_compass_vision"
    assert compare_tower(model, tower, seen, merge_positions(H, W, MERGE)) == ["full_attention"] * 3


# --------------------------------------------------------------------------- Qwen4-Exp

def _qwen4_text(**kw):
    base = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=8,
                num_hidden_layers=4, linear_num_key_heads=2, linear_num_value_heads=2, linear_key_head_dim=8,
                linear_value_head_dim=8, num_experts=2, num_experts_per_tok=1, moe_intermediate_size=8,
                shared_expert_intermediate_size=8, hc_count=2, hc_lowrank=4, indexer_n_heads=2, indexer_kv_heads=1,
                indexer_head_dim=16, indexer_budget=16, indexer_compress_ratio=2,
                rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5,
                                 "mrope_section": [2, 1, 1]})
    return {**base, **kw}


def _run_qwen4(cfg, positions, bias=False):
    """Qwen4ExpTextModel in float64 (the delta nets and MoE zeroed): ``(model, {layer: (x, out)}, {layer: picks})``."""
    from transformers.models.qwen4_exp import modeling_qwen4_exp as hf
    text = cfg.text_config
    text._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = hf.Qwen4ExpTextModel(text).double().eval()
    seen, picks = {}, {}
    for i, dec in enumerate(model.layers):
        dec.mlp.forward = lambda h: torch.zeros_like(h)
        if text.layer_types[i] == "linear_attention":
            dec.linear_attn.forward = lambda hidden_states, *a, **k: torch.zeros_like(hidden_states)
            continue
        _randomize(dec.self_attn)
        for n in ("q_norm", "k_norm"):
            _float64_norm(getattr(dec.self_attn, n), offset=1.0)
        _hook(dec.self_attn, seen, i)
        dec.self_attn.indexer.register_forward_hook(lambda m, a, out, i=i: picks.__setitem__(i, out[:, 0].numpy()))
    T = positions.shape[-1]
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((B, T, text.hidden_size)))
    with torch.no_grad():
        model(inputs_embeds=x, position_ids=torch.from_numpy(np.broadcast_to(positions[:, None], (3, B, T)).copy()),
              use_cache=False)
    return model, seen, picks


def _qwen4(text):
    return _cfg(transformers.Qwen4ExpConfig, text_config=text, vision_config=VISION, image_token_id=7,
                video_token_id=6, vision_start_token_id=5, vision_end_token_id=4)


@pytest.mark.parametrize("bias", [False, True])
def test_qwen4_exp_attention_layer_gated_partial_mrope(bias):
    # Qwen4ExpTextAttention: Qwen3.5's layer (q/k norm 1 + w, gate per feature), interleaved M-RoPE [2, 1, 1] on the
    # first int(16 * 0.5) = 8 features; layer_types default: layer 3 attends, 0-2 are delta nets. indexer_budget 16
    # with blocks of 2: every query of the 14-token prompt keeps all its keys.
    cfg = _qwen4(_qwen4_text(attention_bias=bias))
    positions = _streams(transformers.Qwen4ExpModel, cfg)
    model, seen, picks = _run_qwen4(cfg, positions)
    read = mconfig.read(cfg)
    assert [s.index for s in read.specs] == [3] and read.vision.model_type == "qwen4_exp_vision"
    layer = read.layers[0]
    assert (layer.gate, layer.norm_offset, layer.scheme.rotary_dim, layer.scheme.mrope_section) == \
        ("feature", 1.0, 8, [2, 1, 1])
    assert picks[3].sum(-1).tolist() == [list(range(1, 15))] * B               # the indexer kept every visible key
    _copy_gated(model.layers[3].self_attn, layer)
    x, want = seen[3]
    np.testing.assert_allclose(layer(x, positions=positions, causal=True), want, rtol=0, atol=ATOL)
    assert np.max(np.abs(want)) > 0.1
    assert np.max(np.abs(layer(x, positions=positions[[0, 2, 1]], causal=True) - want)) > 1e-3


def test_qwen4_exp_qsa_picks_are_the_mask():
    # indexer_budget 4, blocks of 2: a query seeing 6 or more keys keeps 2 blocks and the last incomplete one. With
    # HF's picks as mask= the layer is HF's; without them it is not. The note says where the picks begin.
    cfg = _qwen4(_qwen4_text(indexer_budget=4))
    positions = _streams(transformers.Qwen4ExpModel, cfg)
    model, seen, picks = _run_qwen4(cfg, positions)
    read = mconfig.read(cfg)
    assert any("fewer than 6 keys keeps them all" in n for n in read.notes)
    kept = picks[3].sum(-1)
    assert kept[0, :5].tolist() == [1, 2, 3, 4, 5] and kept.max() < np.arange(1, 15).max()
    layer = read.layers[0]
    _copy_gated(model.layers[3].self_attn, layer)
    x, want = seen[3]
    np.testing.assert_allclose(layer(x, positions=positions, mask=picks[3], causal=True), want, rtol=0, atol=ATOL)
    assert np.max(np.abs(layer(x, positions=positions, causal=True) - want)) > 1e-3


def test_qwen4_exp_default_section_on_the_full_head_as_hf_assigns_it():
    # Qwen4ExpTextConfig sets no partial_rotary_factor: its default [11, 11, 10] on a full head of 64 (32 frequencies)
    # is height at 1, 4, ..., 31, width at 2, 5, ..., 29, time the rest: [11, 11, 10] counts 32: the same; on a head of
    # 16 (8 frequencies): [3, 3, 2]. HF's layer against the reading.
    text = _qwen4_text(head_dim=16, indexer_head_dim=16, rope_parameters={"rope_type": "default", "rope_theta": 100.0})
    cfg = _qwen4(text)
    read = mconfig.read(cfg)
    assert read.layers[0].scheme.mrope_section == [3, 3, 2] and read.layers[0].scheme.rotary_dim == 16
    positions = _streams(transformers.Qwen4ExpModel, cfg)
    model, seen, _ = _run_qwen4(cfg, positions)
    layer = read.layers[0]
    _copy_gated(model.layers[3].self_attn, layer)
    np.testing.assert_allclose(layer(seen[3][0], positions=positions, causal=True), seen[3][1], rtol=0, atol=ATOL)


def test_qwen4_exp_vision_tower_is_qwen3_vls():
    from transformers.models.qwen4_exp import modeling_qwen4_exp as hf
    cfg = _cfg(hf.Qwen4ExpVisionConfig, hidden_size=32, out_hidden_size=8, intermediate_size=8,
               num_position_embeddings=16, **TOWER)
    tower, seen = _run_tower(hf.Qwen4ExpVisionModel, cfg)
    model = mconfig.read(cfg)
    assert model.model_type == "qwen4_exp_vision"
    assert compare_tower(model, tower, seen, merge_positions(H, W, MERGE)) == ["full_attention"] * 3


# --------------------------------------------------------------------------- MLCD

def _mlcd(layers, seed):
    """A tiny ``MLCDVisionModel`` (2 heads of 16, patches of 2 x 2 pixels, one channel) in float64: (config, model)."""
    from transformers.models.mlcd import modeling_mlcd as hf
    cfg = _cfg(hf.MLCDVisionConfig, hidden_size=32, num_attention_heads=2, num_hidden_layers=layers, intermediate_size=8,
               image_size=8, patch_size=2, num_channels=1, rope_parameters={"rope_type": "axial", "rope_theta": 100.0})
    torch.manual_seed(seed)
    return cfg, hf.MLCDVisionModel(cfg).double().eval()


def test_mlcd_layers_with_the_class_tokens_learned_angles():
    # MLCDVisionModel: hpos/wpos row-major, MLCDRotaryEmbedding's cat([freq_h, freq_w]) twice with rotate_half (the
    # "qwen" layout, frequencies over head_dim / 2); the class token first, turned by cos and sin of
    # cat([class_pos_emb, class_pos_emb]). Each layer's whole output, the class token's row included, on the input
    # the model itself gave it, with class_pos_emb[0] copied into the scheme.
    h, w = 3, 4
    cfg, tower = _mlcd(2, 0)
    seen = {}
    for i, layer in enumerate(tower.encoder.layers):
        _randomize(layer.self_attn)

        def hook(m, args, kwargs, out, i=i):
            seen[i] = (kwargs["hidden_states"].numpy().copy(), out[0].detach().numpy().copy(),
                       [t.detach() for t in kwargs["position_embeddings"]])
        layer.self_attn.register_forward_hook(hook, with_kwargs=True)
    with torch.no_grad():
        tower(torch.from_numpy(np.random.default_rng(0).standard_normal((B, 1, 2 * h, 2 * w))))
    model = mconfig.read(cfg)
    assert model.model_type == "mlcd_vision_model" and "class_pos_emb" in model.notes[0]
    theta = tower.class_pos_emb[0].detach().numpy()                              # (head_dim // 2,) = (8,)
    positions = axial_positions(h, w, class_token="first")                        # (2, 1 + h w)
    for i, ref in enumerate(tower.encoder.layers):
        x, want, (cos, sin) = seen[i]
        np.testing.assert_allclose(cos[0].double().numpy(), np.cos(np.concatenate([theta, theta])), atol=1e-6)
        layer = model.layers[i]
        _copy(ref.self_attn, layer, ("q_proj", "k_proj", "v_proj", "out_proj"))
        layer.scheme.class_pos_emb = theta.copy()
        got = layer(x, positions=positions, causal=False)
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"layer {i}")
        assert np.max(np.abs(want)) > 0.1
        layer.scheme.class_pos_emb = theta + 0.5                                  # the angles matter, every row
        assert np.min(np.max(np.abs(layer(x, positions=positions, causal=False) - want), axis=-1)) > 1e-4
        layer.scheme.class_pos_emb = theta.copy()
        columns_first = layer(x, positions=np.concatenate([positions[:, :1], positions[::-1, 1:]], axis=1),
                              causal=False)
        assert np.max(np.abs(columns_first - want)) > 1e-3


def test_mlcd_class_angles_gradient_matches_torch_autograd():
    # MLCDAttention's output differentiated by torch through cos and sin of cat([class_pos_emb, class_pos_emb])
    # (one angle per pair, shared by q and k): its gradient against the layer's backward, "scheme.class_pos_emb",
    # and the input's. HF rotates in float32: agreement to float32 accuracy.
    h, w = 2, 3
    cfg, tower = _mlcd(1, 1)
    ref = tower.encoder.layers[0].self_attn
    _randomize(ref)
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((2, 2, 1 + h * w, 32))
    theta = torch.tensor(rng.standard_normal(8), dtype=torch.float64, requires_grad=True)
    xt = torch.tensor(x, requires_grad=True)
    pos = torch.from_numpy(axial_positions(h, w)).T                               # (h w, 2), HF's pos_ids
    cos, sin = tower.vision_rotary_embedding(xt, pos)
    both = torch.cat([theta, theta])[None]
    out = ref(hidden_states=xt, position_embeddings=(torch.cat([both.cos(), cos]), torch.cat([both.sin(), sin])))[0]
    (out * torch.from_numpy(dy)).sum().backward()
    layer = mconfig.read(cfg).layers[0]
    _copy(ref, layer, ("q_proj", "k_proj", "v_proj", "out_proj"))
    layer.scheme.class_pos_emb = theta.detach().numpy().copy()
    y, ctx = layer(x, positions=axial_positions(h, w, class_token="first"), causal=False, return_context=True)
    np.testing.assert_allclose(y, out.detach().numpy(), rtol=0, atol=ATOL)
    grads = layer.backward(ctx, dy)
    assert np.max(np.abs(theta.grad.numpy())) > 0.1
    np.testing.assert_allclose(grads["scheme.class_pos_emb"], theta.grad.numpy(), rtol=0, atol=1e-5)
    np.testing.assert_allclose(grads["x"], xt.grad.numpy(), rtol=0, atol=1e-5)


def test_mlcd_key_value_groups_other_than_one_are_refused():
    # MLCDAttention: eager attention repeats its num_attention_heads key heads num_key_value_groups times and fails.
    from transformers.models.mlcd import modeling_mlcd as hf
    cfg = _cfg(hf.MLCDVisionConfig, hidden_size=32, num_attention_heads=2, num_hidden_layers=1, intermediate_size=8,
               image_size=4, patch_size=2, num_channels=1, num_key_value_groups=2)
    with pytest.raises(RuntimeError):
        with torch.no_grad():
            hf.MLCDVisionModel(cfg).eval()(torch.zeros(1, 1, 4, 4))
    with pytest.raises(ValueError, match="num_key_value_groups"):
        mconfig.read(cfg)


# --------------------------------------------------------------------------- LFM3-VL's tower

def test_lfm3_vl_vision_attention_layers():
    # Lfm3VlVisionModel: layer_types at 5 layers conv, conv, full, conv, full; GQA 4/2 (head dim 8), q/k RMSNorm
    # (weight w), no biases, 2-D RoPE "qwen", merge_positions(h, w, 2).
    from transformers.models.lfm3_vl import modeling_lfm3_vl as hf
    cfg = _cfg(hf.Lfm3VlVisionConfig, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
               num_hidden_layers=5, intermediate_size=8, patch_size=2, temporal_patch_size=1, in_channels=1,
               rope_parameters={"rope_type": "axial", "rope_theta": 100.0})
    torch.manual_seed(0)
    tower = hf.Lfm3VlVisionModel(cfg).double().eval()
    seen = {}
    for i, block in enumerate(tower.layers):
        if block.is_attention_layer:
            _randomize(block.self_attn)
            for n in ("q_norm", "k_norm"):
                _float64_norm(getattr(block.self_attn, n))
            _hook(block.self_attn, seen, i)
    with torch.no_grad():
        tower(torch.from_numpy(np.random.default_rng(0).standard_normal((H * W, 4))),
              grid_thw=torch.tensor([[1, H, W]]))
    model = mconfig.read(_cfg(transformers.Lfm3VlConfig, vision_config=cfg.to_dict())).vision
    assert model.model_type == "lfm3_vl_vision" and [s.index for s in model.specs] == [2, 4]
    positions = merge_positions(H, W, 2)
    for spec, layer in zip(model.specs, model.layers):
        ref = tower.layers[spec.index].self_attn
        _copy(ref, layer, ("q_proj", "k_proj", "v_proj", "out_proj"))
        layer.q_norm, layer.k_norm = (getattr(ref, n).weight.detach().numpy().copy() for n in ("q_norm", "k_norm"))
        x, want = seen[spec.index]
        np.testing.assert_allclose(layer(x[None], positions=positions, causal=False)[0], want, rtol=0, atol=ATOL)
        assert np.max(np.abs(want)) > 0.1
        raster = layer(x[None], positions=axial_positions(H, W), causal=False)[0]
        assert np.max(np.abs(raster - want)) > 1e-3                            # the merge order matters


# --------------------------------------------------------------------------- Qwen3-Omni's head dim, Inkling 2

def test_qwen3_omni_moe_head_dim_is_hfs_floored_quotient():
    # Qwen3OmniMoeThinkerTextAttention: head_dim = getattr(config, "head_dim", hidden_size // num_attention_heads).
    # 36 // 4 = 9 is odd: transformers fails, the reader refuses; 40 // 3 = 13 odd too; 32 // 3 = 10: q_proj 30 wide.
    from test_config_interop_towers import _compare_decoder
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf
    rope = {"rope_type": "default", "rope_theta": 1000.0, "mrope_section": [3, 1, 1]}
    cfg = _cfg(hf.Qwen3OmniMoeTextConfig, hidden_size=32, num_attention_heads=3, num_key_value_heads=1,
               intermediate_size=16, moe_intermediate_size=8, num_experts=2, num_experts_per_tok=1, vocab_size=8,
               num_hidden_layers=1, rope_parameters=rope)
    read = mconfig.read(cfg)
    assert read.layers[0].head_dim == 10 and "q_proj is 30 wide" in read.specs[0].notes[-1]
    _compare_decoder(hf.Qwen3OmniMoeThinkerTextModel, cfg, read)
    odd = _cfg(hf.Qwen3OmniMoeTextConfig, hidden_size=36, num_attention_heads=4, num_key_value_heads=1,
               intermediate_size=16, moe_intermediate_size=8, num_experts=2, num_experts_per_tok=1, vocab_size=8,
               num_hidden_layers=1, rope_parameters=rope)
    with pytest.raises(RuntimeError):
        with torch.no_grad():
            hf.Qwen3OmniMoeThinkerTextModel(odd)(inputs_embeds=torch.zeros(1, 2, 36))
    with pytest.raises(ValueError, match="36 // 4 = 9, odd"):
        mconfig.read(odd)


def test_inkling2_reads_its_decoder_and_its_tower():
    """The decoder is compared with transformers in tests/test_config_interop_inkling.py; here the whole config gives
    both, and the tower read alone is the same tower."""
    cfg = _cfg(transformers.Inkling2Config, text_config={"hidden_size": 32, "num_hidden_layers": 2,
                                                         "num_attention_heads": 4, "num_key_value_heads": 2,
                                                         "swa_num_attention_heads": 4, "swa_num_key_value_heads": 2},
               vision_config={"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1,
                              "text_hidden_size": 32})
    m = mconfig.read(cfg)
    assert m.model_type == "inkling2_text" and len(m.layers) == 2 and m.vision is not None
    assert mconfig.read(cfg.vision_config).model_type == "inkling2_vision"
