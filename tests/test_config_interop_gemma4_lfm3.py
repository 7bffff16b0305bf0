"""``minipos.config.read`` against transformers 5.24 for Gemma 4's vision tower, Gemma 4 Unified's decoder and
LFM3's attention layers, as test_config_interop.py does for the other families: transformers builds the module
(random weights drawn away from init, float64), a forward hook captures each attention module's input and
output inside the model (so the masks and position embeddings are the model's own), the weights are copied
into the layer ``read`` builds, and the outputs must agree within atol 1e-6. HF's RMSNorms (float32 inside)
are replaced by their float64 formula. Skipped when torch or transformers is missing."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_config_interop import (ATOL, SMALL, _cfg, _compare, _copy, _float64_norm,  # noqa: E402
                                 _randomize, _run_model)

from minipos import config as mconfig  # noqa: E402
from minipos.axial import axial_positions  # noqa: E402
from minipos.prope import ProportionalRotary  # noqa: E402


def _gemma4_vision_config(**kw):
    return _cfg(transformers.Gemma4VisionConfig, **{
        "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16, "num_hidden_layers": 2,
        "intermediate_size": 16, "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0}, **kw})


def _gemma4_vision_run(cfg, h, w, pad):
    """Gemma4VisionEncoder on random patch embeddings of an ``h`` x ``w`` grid plus ``pad`` padding patches, the
    positions built as Gemma4ImageProcessor builds them; ``(encoder, {layer: (x, out)}, pixel_position_ids)``."""
    from transformers.models.gemma4 import modeling_gemma4 as hf
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        encoder = hf.Gemma4VisionEncoder(cfg).double().eval()
    for layer in encoder.layers:
        layer.mlp.forward = lambda x: torch.zeros_like(x)                          # not compared
        _randomize(layer.self_attn)
        for name in ("q_norm", "k_norm", "v_norm"):
            _float64_norm(getattr(layer.self_attn, name))
    # Gemma4ImageProcessor: meshgrid(arange(width), arange(height), indexing="xy"), stacked (x, y), row-major;
    # padding patches at (-1, -1) (pad_along_first_dim).
    grid = torch.meshgrid(torch.arange(w), torch.arange(h), indexing="xy")
    pix = torch.stack(grid, dim=-1).reshape(h * w, 2)
    pix = torch.cat([pix, torch.full((pad, 2), -1)])[None].repeat(2, 1, 1)          # (B, T, 2)
    seen, hooks = {}, []
    for i, layer in enumerate(encoder.layers):
        def hook(module, args, kwargs, out, i=i):
            seen[i] = (kwargs["hidden_states"].numpy().copy(), out[0].numpy().copy())
        hooks.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
    x = torch.from_numpy(np.random.default_rng(3).standard_normal((2, h * w + pad, cfg.hidden_size)))
    valid = (pix != -1).any(-1)
    with torch.no_grad():
        encoder(inputs_embeds=x, attention_mask=valid, pixel_position_ids=pix)
    for hk in hooks:
        hk.remove()
    return encoder, seen, pix.numpy()


def test_gemma4_vision_tower_2d_rope_gqa_and_norms():
    # Gemma4VisionRotaryEmbedding + apply_multidimensional_rope: the first half of each head turned by x (the
    # column), the second by y (the row), each half a half-layout RoPE of D/2 = 8 features; GQA 4/2, q/k norms
    # with their weight, a weightless value norm, scale 1. Positions (rows, columns) = axial_positions(3, 4).
    h, w, pad = 3, 4, 2
    cfg = _gemma4_vision_config()
    encoder, seen, pix = _gemma4_vision_run(cfg, h, w, pad)
    model = mconfig.read(cfg)
    assert model.kind == "vision encoder" and len(model.layers) == 2 and not model.specs[0].causal
    np.testing.assert_array_equal(axial_positions(h, w), pix[0, :h * w, ::-1].T)   # the processor's (x, y), reversed
    positions = np.concatenate([axial_positions(h, w), np.zeros((2, pad), np.int64)], axis=1)   # (2, T); the
    # padding patches' own positions (HF: -1) change nothing that is compared: they are no keys, their rows dropped
    keys = np.ones((2, h * w + pad), bool)                               # (B, S)
    keys[:, h * w:] = False                                              # padding patches are no keys
    for i, ref in enumerate(encoder.layers):
        x, want = seen[i]
        layer = model.layers[i]
        for n in "qkvo":
            setattr(layer, "w" + n, getattr(ref.self_attn, f"{n}_proj").linear.weight.detach().numpy().T.copy())
        layer.q_norm = ref.self_attn.q_norm.weight.detach().numpy().copy()
        layer.k_norm = ref.self_attn.k_norm.weight.detach().numpy().copy()
        got = layer(x, positions=positions, mask=keys, causal=False)
        np.testing.assert_allclose(got[:, :h * w], want[:, :h * w], rtol=0, atol=ATOL, err_msg=f"layer {i}")
        assert np.max(np.abs(want)) > 0.1
    swapped = layer(x, positions=positions[::-1], mask=keys, causal=False)        # HF's (x, y) taken as (row, col)
    assert np.max(np.abs(swapped[:, :h * w] - want[:, :h * w])) > 1e-3
    layer.v_norm = False                                                          # no value norm: differs
    assert np.max(np.abs(layer(x, positions=positions, mask=keys, causal=False)[:, :h * w] - want[:, :h * w])) > 1e-3


def test_gemma4_vision_tower_in_a_gemma4_config():
    text = _cfg(transformers.Gemma4TextConfig, **SMALL, num_hidden_layers=2, head_dim=8, global_head_dim=16,
                hidden_size_per_layer_input=0)
    cfg = _cfg(transformers.Gemma4Config, text_config=text, vision_config=_gemma4_vision_config(num_hidden_layers=3))
    model = mconfig.read(cfg)
    assert model.model_type == "gemma4_text" and model.vision.model_type == "gemma4_vision"
    assert len(model.vision.layers) == 3 and model.vision.layers[0].scheme.layout == "gemma4"
    assert model.vision.layers[0].scheme.base == 100.0 and model.vision.layers[0].num_kv_heads == 2
    assert any("position_embedding_table" in n for n in model.vision.notes)


def _gemma4_unified_model(cfg):
    from transformers.models.gemma4_unified.modeling_gemma4_unified import Gemma4UnifiedTextModel
    model = Gemma4UnifiedTextModel(cfg)
    for layer in model.layers:
        _float64_norm(layer.self_attn.v_norm)
    return model


def test_gemma4_unified_decoder_is_gemma4s():
    # Gemma4UnifiedTextAttention: Gemma 4's layer (sliding RoPE, full p-RoPE with the global head dim and k = v);
    # its config defaults use_bidirectional_attention to "vision", which leaves text causal (the mask HF builds
    # for inputs_embeds without images is create_masks_for_generate's causal one).
    cfg = _cfg(transformers.Gemma4UnifiedTextConfig, **SMALL, num_hidden_layers=6, head_dim=8, sliding_window=4,
               global_head_dim=16, num_global_key_value_heads=1, attention_k_eq_v=True, rope_parameters={
                   "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                   "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                      "rope_theta": 10000.0}})
    model, seen = _run_model(_gemma4_unified_model, cfg)
    model.layers[5].self_attn.v_proj = model.layers[5].self_attn.k_proj         # wv = wk, as the note says
    assert _compare(cfg, model, seen) == {"full_attention", "sliding_attention"}
    m = mconfig.read(cfg)
    assert isinstance(m.layers[5].scheme, ProportionalRotary) and m.layers[5].num_kv_heads == 1
    assert any("use_bidirectional_attention 'vision'" in n for n in m.notes)


def _lfm3_run(cfg, seed=0):
    """Lfm3Model on random embeddings: ``(model, {layer: (x, out)})`` for its attention layers."""
    torch.manual_seed(seed)
    cfg._attn_implementation = "sdpa"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.Lfm3Model(cfg).double().eval()
    seen, hooks = {}, []
    for i, layer in enumerate(model.layers):
        if not layer.is_attention_layer:
            continue
        _randomize(layer.self_attn)
        for name in ("q_norm", "k_norm"):
            _float64_norm(getattr(layer.self_attn, name))

        def hook(module, args, kwargs, out, i=i):
            seen[i] = (kwargs["hidden_states"].numpy().copy(), out[0].numpy().copy())
        hooks.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((2, 12, cfg.hidden_size)))
    with torch.no_grad():
        model(inputs_embeds=x, use_cache=False)
    for hk in hooks:
        hk.remove()
    return model, seen


@pytest.mark.parametrize("gate", [False, True])
def test_lfm3_attention_layers_sliding_rope_and_full_prope(gate):
    # Lfm3Config's layer rule at 7 layers: conv, conv, full, conv, sliding, conv, full; its default RoPE:
    # sliding layers theta 1e4, full layers p-RoPE theta 1e6, p = 0.5. use_attention_gate: Lfm3Attention's g_proj
    # (one sigmoid gate per head, no bias even under attention_bias) or none.
    cfg = _cfg(transformers.Lfm3Config, **SMALL, num_hidden_layers=7, head_dim=8, sliding_window=4,
               use_attention_gate=gate, attention_bias=True, pad_token_id=None, bos_token_id=None,
               eos_token_id=None)
    model, seen = _lfm3_run(cfg)
    m = mconfig.read(cfg)
    assert [s.index for s in m.specs] == [2, 4, 6] and [s.layer_type for s in m.specs] == \
        ["full_attention", "sliding_attention", "full_attention"]
    assert [layer.gate for layer in m.layers] == ["head" if gate else None] * 3
    for spec, layer in zip(m.specs, m.layers):
        ref = model.layers[spec.index].self_attn
        _copy(ref, layer)
        x, want = seen[spec.index]
        np.testing.assert_allclose(layer(x, positions=np.arange(12), causal=True), want, rtol=0, atol=ATOL,
                                   err_msg=f"layer {spec.index}")
        assert np.max(np.abs(want)) > 0.1
    full = m.layers[0]
    assert isinstance(full.scheme, ProportionalRotary) and np.count_nonzero(full.scheme.inv_freq) == 2   # int(.5*8//2)
    assert any("0, 1, 3, 5 are short convolutions" in n for n in m.notes)
    x, want = seen[4]
    if gate:                                                                       # the gate matters
        ungated = m.layers[1]
        ungated.wg = None
        assert np.max(np.abs(ungated(x, positions=np.arange(12), causal=True) - want)) > 1e-3
    wide = m.specs[1].build()                                                      # no window: differs
    wide.sliding_window = None
    _copy(model.layers[4].self_attn, wide)
    assert np.max(np.abs(wide(x, positions=np.arange(12), causal=True) - want)) > 1e-3
