"""``minipos.config.read`` on the families of ``minipos._config_glm_more`` against transformers 5.24: each model,
tiny, is built by transformers with random weights in float64; forward hooks capture each attention module's input,
output and mask, and the positions the model builds itself (the decoder's three streams from the model's own
``get_rope_index``, the tower's patch rows and columns from its rotary's input). The weights are copied into the
layer ``read`` builds for the same config, which runs on the captured input with those positions and masks: it must
match within atol 1e-6. GLM-5.3-Flash's attention layers (MLA without RoPE) are compared over the picks its k-pool
indexer made. Skipped when torch or transformers is missing.

transformers rotates q and k in float32 (cos and sin from float32 angles; the towers' ``.float()``) inside the float64
model: agreement is to float32 accuracy, well inside 1e-6 at these sizes. The towers' q/k RMSNorm, which HF takes in
float32 too, runs its same formula in float64 here (``_float64_norm``), so that its rounding does not add to it."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_config_interop_qwen_vision import ATOL, MERGE, TOWER, H, W, _cfg, _randomize  # noqa: E402
from test_config_interop_towers import _float64_norm  # noqa: E402

from minipos import config as mconfig  # noqa: E402
from minipos.axial import merge_positions  # noqa: E402
from minipos.qk_norm import QKNormAttention  # noqa: E402

IMAGE, TEXT = 5, (1, 2, 3)               # token ids: the image placeholder, text


def _copy(ref, layer):
    """HF's ``q_proj``, ``k_proj``, ``v_proj``, ``o_proj`` into the minipos layer: ``W = weight.T``, biases or None."""
    for n in "qkvo":
        lin = getattr(ref, f"{n}_proj")
        setattr(layer, "w" + n, lin.weight.detach().numpy().T.copy())
        setattr(layer, "b" + n, None if lin.bias is None else lin.bias.detach().numpy().copy())


def _copy_tower(ref, layer):
    """HF's ``qkv`` ([q | k | v] rows) and ``proj``, and the q/k norms' weights where the module has them."""
    w, b, d = ref.qkv.weight.detach().numpy(), ref.qkv.bias, layer.d_model
    for part, n in enumerate("qkv"):
        setattr(layer, "w" + n, w[part * d:(part + 1) * d].T.copy())
        setattr(layer, "b" + n, None if b is None else b.detach().numpy()[part * d:(part + 1) * d].copy())
    layer.wo = ref.proj.weight.detach().numpy().T.copy()
    layer.bo = None if ref.proj.bias is None else ref.proj.bias.detach().numpy().copy()
    for name in ("q_norm", "k_norm"):
        if hasattr(ref, name):
            setattr(layer, name, getattr(ref, name).weight.detach().numpy().copy())


def _capture(module, seen, key):
    """A hook keeping the module's input ``hidden_states``, its ``attention_mask`` and output."""
    def hook(m, args, kwargs, out):
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        y = out[0] if isinstance(out, tuple) else out
        seen[key] = (x.detach().numpy().copy(), kwargs.get("attention_mask"), y.detach().numpy().copy())
    return module.register_forward_hook(hook, with_kwargs=True)


def _decoder_run(model, language_model, seen_positions, **call):
    """The multimodal ``model`` in float64 on ``call``: every decoder layer's attention captured, and the position
    ids the model hands its language model (from its own ``get_rope_index``)."""
    seen = {}
    for i, dec in enumerate(language_model.layers):
        _randomize(dec.self_attn)
        _capture(dec.self_attn, seen, i)
    language_model.register_forward_pre_hook(
        lambda m, a, k: seen_positions.append(k["position_ids"].numpy().copy()), with_kwargs=True)
    with torch.no_grad():
        model(**call, use_cache=False)
    return seen


def _compare_decoder(read, language_model, seen, positions):
    """Each layer of ``read`` against the captured module, with HF's mask (the eager additive one, 0 = may attend)
    and HF's positions ``(3, T)``; the streams must matter."""
    for i, dec in enumerate(language_model.layers):
        x, hf_mask, want = seen[i]
        mask = (hf_mask[:, 0] == 0).numpy()                                   # (B, T, S), True = may attend
        layer = read.layers[i]
        _copy(dec.self_attn, layer)
        got = layer(x, positions=positions, mask=mask, causal=False)
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"layer {i}")
        assert np.max(np.abs(want)) > 0.1                                     # a comparison that can fail
        flat = layer(x, positions=np.arange(x.shape[1]), mask=mask, causal=False)
        assert np.max(np.abs(flat - want)) > 1e-3                             # the three streams matter


# --------------------------------------------------------------------------- GLM-OCR

def _glm_ocr(head_dim, partial, **text):
    rope = {"rope_type": "default", "rope_theta": 1000.0, "mrope_section": [2, 1, 1]}
    rope.update({} if partial is None else {"partial_rotary_factor": partial})
    text = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 16,
            "vocab_size": 16, "num_hidden_layers": 2, "rope_parameters": rope, **text}
    text.update({} if head_dim is None else {"head_dim": head_dim})
    vision = {**TOWER, "depth": 2, "hidden_size": 32, "out_hidden_size": 32, "intermediate_size": 8}
    return _cfg(transformers.GlmOcrConfig, text_config=text, vision_config=vision, image_token_id=IMAGE,
                video_token_id=6, image_start_token_id=7, image_end_token_id=8, video_start_token_id=9,
                video_end_token_id=10)


@pytest.mark.parametrize("head_dim, partial", [(None, None), (16, 0.5)])
def test_glm_ocr_text_decoder_on_the_models_own_positions(head_dim, partial):
    # GlmOcrTextAttention: glm4v's split M-RoPE, pairs (2i, 2i+1), on int(head_dim * partial) features ([2, 1, 1]: 4
    # frequencies of 8), GQA 4/2, no bias anywhere; head_dim 16 (not 32 // 4) where the config gives it. One image of
    # 6 x 10 patches (15 tokens after the 2 x 2 merge) between text: get_rope_index's streams.
    cfg = _glm_ocr(head_dim, partial)
    cfg.text_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GlmOcrModel(cfg).double().eval()
    ids = torch.tensor([[*TEXT, *[IMAGE] * (H * W // MERGE ** 2), *TEXT]])
    positions = []
    seen = _decoder_run(model, model.language_model, positions, input_ids=ids, mm_token_type_ids=(ids == IMAGE).int(),
                        pixel_values=torch.from_numpy(np.random.default_rng(0).standard_normal((H * W, 4))),
                        image_grid_thw=torch.tensor([[1, H, W]]))
    streams = positions[0][:, 0]                                              # (3, T): t, h, w
    assert streams[:, 3].tolist() == [3, 3, 3] and streams[:, 17].tolist() == [3, 5, 7]    # the image at 3 + (r, c)
    assert streams[:, -3:].tolist() == [[8, 9, 10]] * 3                       # 3 + max(3, 5): the text after it
    read = mconfig.read(cfg)
    assert read.model_type == "glm_ocr_text" and read.layers[0].bq is None and read.layers[0].bo is None
    assert read.layers[0].head_dim == (head_dim or 8) and read.layers[0].scheme.layout == "interleaved"
    _compare_decoder(read, model.language_model, seen, streams)


def _tower_run(model_cls, cfg):
    """The tower in float64 on one H x W image: ``(tower, {layer: (input, None, output)}, HF's positions (2, T))``."""
    torch.manual_seed(0)
    tower = model_cls(cfg).double().eval()
    seen, ids = {}, []
    for i, block in enumerate(tower.blocks):
        _randomize(block.attn)
        for name in ("q_norm", "k_norm"):
            if hasattr(block.attn, name):                     # larger weights: logits far enough from 0 that the
                norm = getattr(block.attn, name)              # positions move the output; its formula in float64
                with torch.no_grad():
                    norm.weight.mul_(2.0)
                _float64_norm(norm)
        _capture(block.attn, seen, i)
    if hasattr(tower, "rotary_pos_emb"):                  # position_ids (N, 2): (row, column) per patch
        tower.rotary_pos_emb.register_forward_hook(lambda m, a, out: ids.append(a[1].numpy().T.copy()))
    else:                                                 # GLM-Image: the learned table's h_coords, w_coords
        tower.embeddings.register_forward_hook(lambda m, a, out: ids.append(np.stack([a[3], a[4]]).copy()))
    channels = getattr(cfg, "in_channels", 1)
    pixels = torch.from_numpy(np.random.default_rng(0).standard_normal((H * W, channels * cfg.patch_size ** 2)))
    with torch.no_grad():
        tower(pixels, grid_thw=torch.tensor([[1, H, W]]))
    return tower, seen, ids[0]


@pytest.mark.parametrize("name, bias", [("GlmOcr", True), ("GlmOcr", False), ("Glm5Next", True)])
def test_glm_ocr_and_glm5_next_vision_towers(name, bias):
    # GlmOcrVisionAttention / Glm5NextVisionAttention: q/k RMSNorm (weight w) before the Qwen towers' 2-D RoPE, qkv
    # and proj both with attention_bias; no learned table. Positions: the rotary's own input, in merge blocks.
    extra = {"projection_intermediate_size": 8} if name == "Glm5Next" else {}
    cfg = _cfg(getattr(transformers, f"{name}VisionConfig"), hidden_size=32, out_hidden_size=8, intermediate_size=8,
               attention_bias=bias, **TOWER, **extra)
    tower, seen, positions = _tower_run(getattr(transformers, f"{name}VisionModel"), cfg)
    assert np.array_equal(positions, merge_positions(H, W, MERGE))              # what the reader's table says
    model = mconfig.read(cfg)
    assert model.kind == "vision encoder" and len(model.layers) == len(tower.blocks) == 3
    for i, block in enumerate(tower.blocks):
        layer, (x, _, want) = model.layers[i], seen[i]
        assert isinstance(layer, QKNormAttention) and (layer.bo is None) == (not bias)
        _copy_tower(block.attn, layer)
        got = layer(x[None], positions=positions, causal=False)[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"layer {i}")
        assert np.max(np.abs(want)) > 0.1
        raster = layer(x[None], positions=merge_positions(H, W, 1), causal=False)[0]
        assert np.max(np.abs(raster - want)) > 1e-3                             # the merge-block order matters
        layer.q_norm = None
        assert np.max(np.abs(layer(x[None], positions=positions, causal=False)[0] - want)) > 1e-3   # the norm too


# --------------------------------------------------------------------------- GLM-Image

def _glm_image(head_dim, partial, bias):
    rope = {"rope_type": "default", "rope_theta": 1000.0, "mrope_section": [2, 1, 1]}
    rope.update({} if partial is None else {"partial_rotary_factor": partial})
    text = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 16,
            "vocab_size": 16, "vision_vocab_size": 16, "num_hidden_layers": 2, "rope_parameters": rope,
            "attention_bias": bias, "pad_token_id": 0, "eos_token_id": 8}
    text.update({} if head_dim is None else {"head_dim": head_dim})
    vision = {"depth": 2, "hidden_size": 32, "num_heads": 2, "intermediate_size": 8, "patch_size": 2,
              "in_channels": 1, "image_size": 8}
    vq = {"embed_dim": 8, "num_embeddings": 16, "latent_channels": 32, "in_channels": 1}
    return _cfg(transformers.GlmImageConfig, text_config=text, vision_config=vision, vq_config=vq,
                image_token_id=IMAGE, image_start_token_id=7, image_end_token_id=8)


@pytest.mark.parametrize("head_dim, partial, bias", [(None, None, True), (16, 0.5, False)])
def test_glm_image_text_decoder_on_the_models_own_positions(head_dim, partial, bias):
    # GlmImageTextAttention: split M-RoPE in the half layout (rotate_half, cat([freq, freq])) on int(head_dim *
    # partial) features, partial default 1; attention_bias on q, k, v, never o. Input: text, a 2 x 3 source image
    # between image_start and image_end, text, and image_start for a 4 x 4 target grid: get_rope_index's streams.
    cfg = _glm_image(head_dim, partial, bias)
    cfg.text_config._attn_implementation = "eager"
    torch.manual_seed(0)
    model = transformers.GlmImageModel(cfg).double().eval()
    ids = torch.tensor([[1, 2, 7, *[IMAGE] * 6, 8, 3, 1, 7]])
    positions = []
    seen = _decoder_run(model, model.language_model, positions, input_ids=ids,
                        image_grid_thw=torch.tensor([[1, 2, 3], [1, 4, 4]]))
    streams = positions[0][:, 0]                                              # (3, T)
    assert streams[:, 3:9].tolist() == [[3] * 6, [3, 3, 3, 4, 4, 4], [3, 4, 5, 3, 4, 5]]   # the image at 3 + (r, c)
    assert streams[0, 9:].tolist() == [6, 7, 8, 9]                            # 3 + max(2, 3): image_end onwards
    read = mconfig.read(cfg)
    assert read.model_type == "glm_image_text" and read.layers[0].scheme.layout == "half"
    assert (read.layers[0].bq is None) == (not bias) and read.layers[0].bo is None
    _compare_decoder(read, model.language_model, seen, streams)


def test_glm_image_default_rope_fails_in_transformers_and_is_refused():
    # GlmImageTextConfig() alone: head_dim 4096 // 32 = 128, partial 1: 64 frequencies that the default section
    # [8, 12, 12] (32) cannot split. transformers fails when it rotates; the reader refuses at once, naming the key.
    from transformers.models.glm_image import modeling_glm_image as hf
    rotary = hf.GlmImageTextRotaryEmbedding(hf.GlmImageTextConfig())
    with pytest.raises(RuntimeError, match="split"):
        rotary(torch.zeros(1), torch.arange(4)[None])
    with pytest.raises(ValueError, match="mrope_section") as err:
        mconfig.read({"model_type": "glm_image_text", "num_hidden_layers": 1})
    assert "'glm_image_text'" in str(err.value)


def test_glm_image_vision_tower_attends_without_positions():
    # GlmImageVisionAttention gets no position embeddings: the learned table (8 // 2 = 4 a side, resampled at the
    # patches' (row, column)) is in the captured input. HF's module is permutation-equivariant, and so is the layer.
    cfg = _cfg(transformers.GlmImageVisionConfig, hidden_size=32, num_heads=2, depth=2, intermediate_size=8,
               patch_size=2, in_channels=1, image_size=8)
    tower, seen, positions = _tower_run(transformers.GlmImageVisionModel, cfg)
    assert np.array_equal(positions, merge_positions(H, W, 1))                  # row-major: spatial_merge_size 1
    model = mconfig.read(cfg)
    assert model.model_type == "glm_image_vision" and "4 x 4" in model.specs[0].notes[0]
    perm = np.random.default_rng(1).permutation(H * W)
    for i, block in enumerate(tower.blocks):
        layer, (x, _, want) = model.layers[i], seen[i]
        _copy_tower(block.attn, layer)
        got = layer(x[None], positions=positions, causal=False)[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"layer {i}")
        assert np.max(np.abs(want)) > 0.1
        with torch.no_grad():
            moved = block.attn(torch.from_numpy(x[perm]), cu_seqlens=torch.tensor([0, H * W])).numpy()
        np.testing.assert_allclose(moved, want[perm], rtol=0, atol=ATOL)      # HF: no position in the attention


def test_glm_image_whole_config_reads_its_decoder_and_its_tower():
    model = mconfig.read(_glm_image(16, 0.5, True))
    assert (model.model_type, model.vision.model_type, len(model.vision.layers)) == ("glm_image_text",
                                                                                  "glm_image_vision", 2)
    assert "VQ-VAE" in model.vision.notes[0]


# --------------------------------------------------------------------------- GLM-5.3-Flash

def _glm5_next_run(cfg, seed=0):
    """Glm5NextTextModel in float64 (MoE replaced by zeros: its kernels refuse float64, and it is not compared), every
    attention weight drawn away from its init; ``(model, {i: (x, out)}, {i: picks})``: each attention layer's input and
    output, and the picks it attended to (its indexer's, or for a shared layer the ones it was handed)."""
    from test_config_interop import _float64_norm as norm64, _randomize as randomize
    torch.manual_seed(seed)
    cfg._attn_implementation = "eager"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.Glm5NextTextModel(cfg).double().eval()
    seen, picks, hooks = {}, {}, []
    for i, layer in enumerate(model.layers):
        layer.mlp.forward = lambda h, *a, **k: torch.zeros_like(h)
        if layer.block_type != "indexed_attention":
            continue
        randomize(layer.self_attn)
        for name in ("q_a_layernorm", "kv_a_layernorm"):
            norm64(getattr(layer.self_attn, name))

        def hook(module, args, kwargs, out, i=i):
            seen[i] = (kwargs["hidden_states"].detach().numpy().copy(), out[0].detach().numpy().copy())
            if module.indexer is None:                                   # a shared layer: the picks it was handed
                picks[i] = kwargs["prev_topk_indices"].numpy().copy()
        hooks.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
        if layer.self_attn.indexer is not None:
            hooks.append(layer.self_attn.indexer.register_forward_hook(
                lambda m, a, k, out, i=i: picks.__setitem__(i, out.numpy().copy()), with_kwargs=True))
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((2, 12, cfg.hidden_size)))
    with torch.no_grad():
        model(inputs_embeds=x, use_cache=False)
    for h in hooks:
        h.remove()
    return model, seen, picks


@pytest.mark.parametrize("pattern", [None, "FFFFFS"])
def test_glm5_next_attention_layers_without_rope_over_the_indexers_picks(pattern):
    # GLM-5.3-Flash: KDA layers (not read) and MLA layers without RoPE whose only mask is the k-pool indexer's picks
    # (index_topk 4 = 2 pools of 2 keys, plus the incomplete tail); "FFFFFS" makes layer 5 reuse layer 4's picks.
    layer_types = ["linear_attention", "indexed_attention", "linear_attention", "linear_attention",
                   "indexed_attention", "indexed_attention"]
    extra = {} if pattern is None else {"index_topk_pattern": pattern}
    cfg = _cfg(transformers.Glm5NextTextConfig, num_hidden_layers=6, hidden_size=32, num_attention_heads=2,
               num_key_value_heads=2, q_lora_rank=12, kv_lora_rank=8, qk_nope_head_dim=6, v_head_dim=5,
               index_n_heads=2, index_head_dim=8, index_topk=4, index_kpool=2, linear_num_heads=2, linear_head_dim=8,
               hc_mult=2, layer_types=layer_types, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=8,
               intermediate_size=16, vocab_size=8, pad_token_id=0, **extra)
    model, seen, picks = _glm5_next_run(cfg)
    read = mconfig.read(cfg)
    assert [s.index for s in read.specs] == [1, 4, 5]
    assert [s.indexer["shared_from"] for s in read.specs] == [None, None, 4 if pattern else None]
    for spec, layer in zip(read.specs, read.layers):
        ref = model.layers[spec.index].self_attn
        for name, lin in {"wq_a": ref.q_a_proj, "wq_b": ref.q_b_proj, "wkv_a": ref.kv_a_proj_with_mqa,
                          "wkv_b": ref.kv_b_proj, "wo": ref.o_proj}.items():
            setattr(layer, name, lin.weight.detach().numpy().T.copy())
            assert lin.bias is None
        layer.q_a_norm = ref.q_a_layernorm.weight.detach().numpy().copy()
        layer.kv_a_norm = ref.kv_a_layernorm.weight.detach().numpy().copy()
        x, want = seen[spec.index]
        p = picks[spec.index].astype(np.int64)                            # -1: no pick
        assert (ref.indexer is None) == (spec.indexer["shared_from"] is not None)
        mask = np.zeros((2, 12, 12), bool)
        for b, t, j in zip(*np.nonzero(p >= 0)):
            mask[b, t, p[b, t, j]] = True
        assert not mask[:, np.triu_indices(12, 1)[0], np.triu_indices(12, 1)[1]].any()   # the picks are causal
        got = layer(x, positions=np.arange(12), mask=mask, causal=True)
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"layer {spec.index}")
        assert np.max(np.abs(want)) > 0.1
        assert np.max(np.abs(layer(x, positions=np.arange(12), causal=True) - want)) > 1e-3   # the picks matter
        # no position enters: the keys' order does not matter to a query that sees them all (the last row)
        perm = np.r_[np.random.default_rng(1).permutation(11), 11]
        np.testing.assert_allclose(layer(x[:, perm], positions=np.arange(12))[:, -1], layer(x)[:, -1], atol=1e-12)


def test_glm5_next_reads_through_its_outer_config_and_refuses_what_transformers_refuses():
    from transformers.models.glm5_next import configuration_glm5_next as hf
    cfg = _cfg(hf.Glm5NextTextConfig, num_hidden_layers=4, hidden_size=32, num_attention_heads=2,
               num_key_value_heads=2)
    assert cfg.layer_types == ["linear_attention"] * 3 + ["indexed_attention"] and cfg.qk_rope_head_dim == 0
    with pytest.raises(Exception, match="NoPE"):
        _cfg(hf.Glm5NextTextConfig, num_hidden_layers=4, qk_rope_head_dim=64)
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        mconfig.read({**cfg.to_dict(), "qk_rope_head_dim": 64})
    for config in (cfg, _cfg(transformers.Glm5NextConfig, text_config=cfg.to_dict(),
                             vision_config={"depth": 2, "hidden_size": 32, "num_heads": 2})):
        read = mconfig.read(config)
        assert read.model_type == "glm5_next_text" and [s.index for s in read.specs] == [3]
        assert any("KDA" in n for n in read.notes) and any("index_kpool" in n for n in read.notes)
    tower = mconfig.read(_cfg(transformers.Glm5NextConfig, vision_config={"depth": 2, "hidden_size": 32,
                                                                          "num_heads": 2}).vision_config)
    assert (tower.model_type, len(tower.layers)) == ("glm5_next_vision", 2)


def test_glm_ocr_whole_config_tower_is_its_config_class_one():
    cfg = _glm_ocr(None, None)
    raw = cfg.to_dict()
    raw["vision_config"].pop("model_type")                                     # a hub file may leave it out
    model = mconfig.read(raw)
    assert (model.model_type, model.vision.model_type, model.notes) == ("glm_ocr_text", "glm_ocr_vision", [])
