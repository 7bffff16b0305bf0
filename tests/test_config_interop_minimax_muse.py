"""``minipos.config.read`` on the families of ``minipos._config_minimax_muse`` against transformers 5.24, as in
``test_config_interop_more.py``: each model, tiny, is built by transformers with random weights in float64; a forward
hook captures each attention module's input and output, so the masks (windows, the towers' window blocks) and the
positions (the towers' patch order) are the ones the model itself builds. The weights are copied into the layer
``read`` builds for the same config: it must match within atol 1e-6. What the reader refuses is checked on HF's own
code (the rotary's angles) where the refusal names a layout. Skipped when torch or transformers is missing.

transformers rotates q and k in float32 inside the float64 model (and the towers cast q and k to float32 before
rotating them); its RMSNorms are replaced by their float64 formula: agreement is to float32 accuracy, well inside 1e-6
at these sizes."""

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_config_interop import SMALL, T, _float64_norm, _run_model  # noqa: E402
from test_config_interop import _compare as compare_layers  # noqa: E402
from test_config_interop import _copy as copy_decoder  # noqa: E402
from test_config_interop_qwen_vision import _cfg, _randomize  # noqa: E402
from test_config_interop_qwen_vision import _copy as copy_qkv  # noqa: E402

from minipos import config as mconfig  # noqa: E402
from minipos.axial import axial_positions, axial_window_mask, merge_positions  # noqa: E402

ATOL = 1e-6
H, W = 6, 10                             # the image: 6 x 10 patches


def _compare_decoder(cfg, model, seen, *, gate=None, masks=None):
    """Each layer ``read(cfg)`` builds (``spec.index`` its place in the model) against the captured module, at
    positions 0 .. T-1 with the layer's own causal mask and window; returns the layer types compared. ``gate``: the
    name of a per-feature gate Linear to copy into ``wg``. Where the layer rotates, other positions change the output;
    where it slides, the window changes it. ``masks``: ``{layer index: mask}`` for the layers that take one."""
    read, kinds = mconfig.read(cfg), set()
    for k, spec in enumerate(read.specs):
        ref, (x, want) = model.layers[spec.index].self_attn, seen[spec.index]
        layer = read.layers[k]
        copy_decoder(ref, layer)
        if gate is not None:
            layer.wg = getattr(ref, gate).weight.detach().numpy().T.copy()
            assert getattr(ref, gate).bias is None and layer.bg is None
        mask = (masks or {}).get(spec.index)
        got = layer(x, positions=np.arange(T), causal=True, mask=mask)
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"layer {spec.index}")
        assert np.max(np.abs(want)) > 0.1                                  # a comparison that can fail
        if not spec.position.startswith("NoPE"):
            assert np.max(np.abs(layer(x, positions=2 * np.arange(T), causal=True, mask=mask) - want)) > 1e-3
        if spec.kwargs.get("sliding_window"):
            wide = replace(spec, kwargs={**spec.kwargs, "sliding_window": None}).build()
            copy_decoder(ref, wide)
            wide.wg = layer.wg
            assert np.max(np.abs(wide(x, positions=np.arange(T), causal=True) - want)) > 1e-3
        kinds.add(spec.layer_type)
    return read, kinds


def _hook_towers(attns):
    seen, hooks = {}, []
    for i, attn in enumerate(attns):
        _randomize(attn)

        def hook(module, args, kwargs, out, i=i):
            x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            y = out[0] if isinstance(out, tuple) else out
            seen[i] = tuple(a.detach().numpy().reshape(-1, x.shape[-1]).copy() for a in (x, y))   # (N, d) each
        hooks.append(attn.register_forward_hook(hook, with_kwargs=True))
    return seen, hooks


# --------------------------------------------------------------------------- MiniMax M3

def _minimax_text(**kw):
    from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as hf
    cfg = _cfg(hf.MiniMaxM3VLTextConfig, **{**SMALL, "head_dim": 16, "num_hidden_layers": 3,
                                           "mlp_layer_types": ["dense"] * 3, "dense_intermediate_size": 16,
                                           "index_n_heads": 2, "index_head_dim": 16, "index_block_size": 4,
                                           "index_topk_blocks": 2, "rotary_dim": 8,
                                           "layer_types": ["full_attention", "minimax_m3_sparse", "full_attention"],
                                           **kw})
    return hf, cfg


def _run_minimax(hf, cfg):
    """The model on random inputs, each attention module's (input, output) captured, and each sparse layer's picks
    (its indexer's output, ``(B, G, T, k)`` key blocks) as the layer's mask ``minipos.dsa.block_mask``."""
    from minipos.dsa import block_mask
    picks, hooks, model_cls = {}, [], hf.MiniMaxM3VLTextModel

    def build(c):
        model = model_cls(c)
        for i, layer in enumerate(model.layers):
            if layer.self_attn.indexer is not None:
                def hook(module, args, kwargs, out, i=i):
                    picks[i] = out.detach().numpy().copy()
                hooks.append(layer.self_attn.indexer.register_forward_hook(hook, with_kwargs=True))
        return model
    model, seen = _run_model(build, cfg, norm_offset=1.0)
    for h in hooks:
        h.remove()
    masks = {i: block_mask(p, block_size=cfg.index_block_size, num_heads=cfg.num_attention_heads, keys=T)
             for i, p in picks.items()}
    return model, seen, masks


@pytest.mark.parametrize("partial", [None, 0.5])
def test_minimax_m3_full_layers_rotate_what_transformers_rotates_whatever_rotary_dim_says(partial):
    # MiniMaxM3VLAttention: Gemma q/k norm (1 + w), RoPE half on int(head_dim * partial_rotary_factor) features; the
    # config's rotary_dim (8 here, head_dim 16) is never read (MiniMaxM3VLRotaryEmbedding: inv_freq of 8 = 16 / 2
    # frequencies without a partial factor). Layer 1, a minimax_m3_sparse layer, runs with the key blocks its indexer
    # picked (HF's MiniMaxM3VLIndexer output) as its per-head mask.
    rope = {"rope_type": "default", "rope_theta": 100.0, **({"partial_rotary_factor": partial} if partial else {})}
    hf, cfg = _minimax_text(rope_parameters=rope)
    assert hf.MiniMaxM3VLRotaryEmbedding(cfg).inv_freq.shape[0] == int(16 * (partial or 1.0)) // 2
    model, seen, masks = _run_minimax(hf, cfg)
    read, kinds = _compare_decoder(cfg, model, seen, masks=masks)
    assert [s.index for s in read.specs] == [0, 1, 2] and kinds == {"full_attention", "minimax_m3_sparse"}
    x, want = seen[1]
    assert not masks[1][..., np.tril(np.ones((T, T), bool))].all()          # some causal keys were not picked
    assert np.max(np.abs(read.layers[1](x, causal=True) - want)) > 1e-3     # and without the picks it differs
    assert any("rotary_dim 8 is not read" in n for n in read.notes) == (partial is None)   # 0.5 * 16 = 8: they agree


def test_minimax_m3_vision_rotary_is_3d():
    # MiniMaxM3VLVisionRotaryEmbedding (head_dim 64 // 2 = 32, theta 100): F = (32 // 3) // 2 = 5 frequencies
    # f_j = 100^(-2j/10) per axis; a patch at (t, h, w) = (1, 2, 3) turns pairs (i, i + 15) by t f_i, h f_(i-5),
    # w f_(i-10) for i < 15, and leaves features 30, 31 alone. Read back from HF's cos and sin; minipos's "minimax_m3"
    # layout gives the same pairs, axes and angles.
    from minipos.axial import axial_angles, axial_pairs
    from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as hf
    vision = _cfg(hf.MiniMaxM3VLVisionConfig, hidden_size=64, num_attention_heads=2, num_hidden_layers=1,
                  rope_parameters={"rope_type": "axial", "rope_theta": 100.0})
    cos, sin = hf.MiniMaxM3VLVisionRotaryEmbedding(vision)(torch.zeros(1), torch.tensor([[1, 2, 3]]))
    angles = np.arctan2(sin.numpy()[0], cos.numpy()[0])                        # (30,)
    f = 100.0 ** (-2 * np.arange(5) / 10)
    want = np.concatenate([1 * f, 2 * f, 3 * f])
    np.testing.assert_allclose(angles, np.concatenate([want, want]), rtol=0, atol=1e-6)
    a, b, _, _ = axial_pairs(32, base=100.0, layout="minimax_m3")
    assert list(a) == list(range(15)) and list(b) == list(range(15, 30))
    np.testing.assert_allclose(axial_angles(np.array([[1], [2], [3]]), 32, base=100.0, layout="minimax_m3")[0], want,
                               rtol=1e-12, atol=0)


def _minimax_tower(**kw):
    from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as hf
    cfg = _cfg(hf.MiniMaxM3VLVisionConfig, **{"hidden_size": 64, "intermediate_size": 8, "num_attention_heads": 2,
                                             "num_hidden_layers": 2, "num_channels": 1, "patch_size": 2,
                                             "temporal_patch_size": 2, "spatial_merge_size": 2,
                                             "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0}, **kw})
    return hf, cfg


@pytest.mark.parametrize("heads", [2, 4])
def test_minimax_m3_vision_tower_3d_positions_per_clip(heads):
    # MiniMaxM3VLVisionModel on a clip of 2 frames of 4 x 6 patches and an image of 2 x 4: positions from HF's own
    # get_vision_position_ids(grid_thw, 2, include_temporal=True) (frame, then rows and columns in 2 x 2 merge
    # blocks, restarting for each entry); each clip attends as a whole (merge_temporal=True), bidirectionally;
    # q, k, v, out_proj with biases. Head dim 32 (F = 5, features 30, 31 unrotated) or 16 (F = 2, 12 of 16).
    from transformers.vision_utils import get_vision_position_ids
    hf, cfg = _minimax_tower(num_attention_heads=heads)
    torch.manual_seed(0)
    tower = hf.MiniMaxM3VLVisionModel(cfg).double().eval()
    seen, hooks = _hook_towers([layer.self_attn for layer in tower.layers])
    grid = torch.tensor([[2, 4, 6], [1, 2, 4]])
    with torch.no_grad():
        tower(torch.from_numpy(np.random.default_rng(0).standard_normal((56, 8))), grid_thw=grid)
    hf_pos = get_vision_position_ids(grid, 2, include_temporal=True).numpy().T                # (3, 56)
    mine = [np.vstack([np.repeat(np.arange(t), h * w), np.tile(merge_positions(h, w, 2), t)]) for t, h, w in
            grid.tolist()]
    np.testing.assert_array_equal(np.concatenate(mine, axis=1), hf_pos)            # the reader's stated order
    read = mconfig.read(cfg)
    D = 64 // heads
    assert read.model_type == "minimax_m3_vl_vision" and read.layers[0].scheme.layout == "minimax_m3"
    assert f"the first {6 * ((D // 3) // 2)} of {D} features" in read.specs[0].position
    bounds = [0, 48, 56]
    for i, block in enumerate(tower.layers):
        layer = read.layers[i]
        _copy_four(block.self_attn, layer, "out_proj")
        x, want = seen[i]
        assert np.max(np.abs(want)) > 0.1
        for lo, hi in zip(bounds, bounds[1:]):                                    # one image or clip at a time
            pos = hf_pos[:, lo:hi]
            got = layer(x[None, lo:hi], positions=pos, causal=False)[0]
            np.testing.assert_allclose(got, want[lo:hi], rtol=0, atol=ATOL, err_msg=f"layer {i}, tokens {lo}:{hi}")
        clip, pos = slice(0, 48), hf_pos[:, :48]
        no_frames = layer(x[None, clip], positions=pos * np.array([[0], [1], [1]]), causal=False)[0]
        assert np.max(np.abs(no_frames - want[clip])) > 1e-3                      # the frame is an axis
        swapped = layer(x[None, clip], positions=pos[[0, 2, 1]], causal=False)[0]
        assert np.max(np.abs(swapped - want[clip])) > 1e-3                        # rows before columns
        joint = layer(x[None], positions=hf_pos, causal=False)[0]
        assert np.max(np.abs(joint[clip] - want[clip])) > 1e-3                    # the image is not in the clip's
    for h in hooks:
        h.remove()


def test_minimax_m3_whole_config_reads_its_decoder_and_its_tower():
    from transformers.models.minimax_m3_vl import modeling_minimax_m3_vl as hf
    _, text = _minimax_text()
    _, vision = _minimax_tower()
    whole = mconfig.read(_cfg(hf.MiniMaxM3VLConfig, vision_config=vision.to_dict(), text_config=text.to_dict()))
    assert (whole.model_type, whole.vision.model_type, len(whole.layers), len(whole.vision.layers)) == \
        ("minimax_m3_vl_text", "minimax_m3_vl_vision", 3, 2)                     # the sparse layer too
    assert not any("not support yet" in n for n in whole.notes)
    # MiniMaxM3VLVisionConfig turns rope_type "default" into its default_rope_type "axial" (so "default" reads as
    # axial, here too); a scaling type reaches the rotary, which raises, and the reader refuses it by name.
    default = _minimax_tower(rope_parameters={"rope_type": "default", "rope_theta": 100.0})[1]
    assert default.rope_parameters["rope_type"] == "axial"
    assert mconfig.read({**default.to_dict(), "rope_parameters": {"rope_type": "default", "rope_theta": 100.0}}) \
        .layers[0].scheme.base == 100.0
    linear = _minimax_tower(rope_parameters={"rope_type": "linear", "rope_theta": 100.0, "factor": 2.0})[1]
    with pytest.raises(ValueError, match="supports only axial rope"):
        hf.MiniMaxM3VLVisionRotaryEmbedding(linear)
    with pytest.raises(ValueError, match="rope_type"):
        mconfig.read(linear)


# --------------------------------------------------------------------------- Step 3.7

def _step_text(**kw):
    from transformers.models.step3p7 import modeling_step3p7 as hf
    cfg = _cfg(hf.Step3p7TextConfig, **{**SMALL, "head_dim": 8, "num_hidden_layers": 3, "sliding_window": 4,
                                       "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
                                       "num_sliding_attention_heads": 2, "rope_theta": [100.0, 1000.0, 100.0],
                                       "partial_rotary_factors": [0.5, 1.0, 0.5], "query_pre_attn_scalar": 10,
                                       "moe_intermediate_size": 8, "n_routed_experts": 4, "num_experts_per_tok": 2,
                                       "share_expert_dim": 8, "mlp_layer_types": ["dense"] * 3, **kw})
    return hf, cfg


@pytest.mark.parametrize("bias", [False, True])
def test_step3p5_sliding_and_full_layers(bias):
    # Step3p7Attention: sliding layers with 2 query heads (per_layer_config), theta 100 on half of head dim 8, window
    # 4; the full layer 4 heads, theta 1000, every feature; Gemma q/k norm; scale 10 ** -0.5; a gate per head.
    hf, cfg = _step_text(attention_bias=bias)
    model, seen = _run_model(hf.Step3p7TextModel, cfg, norm_offset=1.0)
    read, kinds = _compare_decoder(cfg, model, seen)
    assert kinds == {"sliding_attention", "full_attention"}
    assert [layer.num_heads for layer in read.layers] == [2, 4, 2] and read.specs[0].kwargs["scale"] == 10 ** -0.5


def test_step3p5_hub_config_reads_as_transformers_builds_it():
    # The hub's form: per-layer rope_theta and partial_rotary_factors padded with num_nextn_predict_layers MTP entries,
    # attention_other_setting for the sliding heads, rope_scaling on the full layers. Expected: Step3p7TextConfig's.
    from transformers.models.step3p7 import configuration_step3p7 as hf
    hub = {"model_type": "step3p5", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "num_hidden_layers": 3, "num_nextn_predict_layers": 1, "sliding_window": 4,
           "layer_types": ["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
           "rope_theta": [100.0, 1000.0, 100.0, 1000.0], "partial_rotary_factors": [0.5, 1.0, 0.5, 1.0],
           "attention_other_setting": {"num_attention_heads": 2},
           "rope_scaling": {"rope_type": "linear", "factor": 2.0}}
    cfg = _cfg(hf.Step3p7TextConfig, **{k: v for k, v in hub.items() if k != "model_type"})
    read = mconfig.read(hub)
    assert [s.layer_type for s in read.specs] == cfg.layer_types
    heads = [cfg.per_layer_config[i].num_attention_heads for i in range(3)]
    assert [s.kwargs["num_heads"] for s in read.specs] == heads
    for s in read.specs:
        params = cfg.rope_parameters[s.layer_type]
        scheme = read.layers[s.index].scheme
        assert scheme.scaling_args.get("factor", 1.0) == params.get("factor", 1.0)
        assert f"theta {params['rope_theta']:g}" in s.position
    flat = mconfig.read({**hub, "rope_theta": 55.0, "partial_rotary_factors": None, "rope_scaling": None,
                         "rope_parameters": {"rope_type": "default", "rope_theta": 123.0}})
    rebuilt = _cfg(hf.Step3p7TextConfig, **{**{k: v for k, v in hub.items() if k not in ("model_type", "rope_scaling",
                                                                                           "partial_rotary_factors")},
                                          "rope_theta": 55.0, "rope_parameters": {"rope_type": "default",
                                                                                  "rope_theta": 123.0}})
    assert rebuilt.rope_parameters["full_attention"]["rope_theta"] == 55.0          # transformers ignores 123
    assert "theta 55" in flat.specs[1].position and "ignores it" in flat.notes[0]


def test_step3p5_vision_tower_turns_columns_first():
    # Step3p7VisionModel: get_vision_position_ids(grid, 1) row-major, flipped by recomposition_frequencies: the first
    # D/4 pairs turn by the column. q, k, v, out_proj with biases; the learned table is in the captured input.
    from transformers.models.step3p7 import modeling_step3p7 as hf
    cfg = _cfg(hf.Step3p7VisionConfig, hidden_size=32, num_attention_heads=2, num_hidden_layers=2, num_channels=1,
               image_size=8, patch_size=2, rope_parameters={"rope_type": "axial", "rope_theta": 100.0})
    torch.manual_seed(0)
    tower = hf.Step3p7VisionModel(cfg).double().eval()
    seen, hooks = _hook_towers([layer.self_attn for layer in tower.layers])
    with torch.no_grad():
        tower(torch.from_numpy(np.random.default_rng(0).standard_normal((1, 1, 2 * H, 2 * W))))
    read, positions = mconfig.read(cfg), axial_positions(H, W)[::-1]
    assert read.model_type == "step3p5_vision" and "axial_positions(h, w)[::-1]" in read.specs[0].position
    for i, block in enumerate(tower.layers):
        layer = read.layers[i]
        _copy_four(block.self_attn, layer, "out_proj")
        x, want = seen[i]
        np.testing.assert_allclose(layer(x[None], positions=positions, causal=False)[0], want, rtol=0, atol=ATOL)
        assert np.max(np.abs(want)) > 0.1
        rows_first = layer(x[None], positions=axial_positions(H, W), causal=False)[0]
        assert np.max(np.abs(rows_first - want)) > 1e-3


def _copy_four(ref, layer, out="o_proj"):
    for n, name in zip("qkvo", ("q_proj", "k_proj", "v_proj", out)):
        lin = getattr(ref, name)
        setattr(layer, "w" + n, lin.weight.detach().numpy().T.copy())
        setattr(layer, "b" + n, None if lin.bias is None else lin.bias.detach().numpy().copy())


def test_step3p7_whole_config_reads_its_decoder_and_its_tower():
    _, text = _step_text()
    cfg = _cfg(transformers.Step3p7Config, text_config=text.to_dict(),
               vision_config={"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 2})
    read = mconfig.read(cfg)
    assert (read.model_type, read.vision.model_type, len(read.layers), len(read.vision.layers)) == \
        ("step3p5", "step3p5_vision", 3, 2)


# --------------------------------------------------------------------------- Muse Glimmer, Muse Spark

@pytest.mark.parametrize("bias", [False, True])
def test_muse_glimmer_sliding_rope_and_full_nope_layers(bias):
    # MuseGlimmerTextAttention: layers 0-2 slide (window 4) with RoPE, layer 3 (every 4th from the last) full NoPE;
    # weightless q/k norm, q x qk_scale_factor, the output gate per feature (gate_proj). layer_rope_theta's 77 is read
    # as "RoPE" only: the layer rotates by rope_theta 100, as transformers does.
    from transformers.models.muse_glimmer import modeling_muse_glimmer as hf
    cfg = _cfg(hf.MuseGlimmerTextConfig, **{**SMALL, "head_dim": 8, "num_hidden_layers": 4, "sliding_window": 4,
                                           "attention_bias": bias, "layer_rope_theta": [100.0, 77.0, 100.0, 0],
                                           "rope_parameters": {"rope_type": "default", "rope_theta": 100.0}})
    model, seen = _run_model(hf.MuseGlimmerTextModel, cfg)
    read, kinds = _compare_decoder(cfg, model, seen, gate="gate_proj")
    assert kinds == {"sliding_attention", "full_attention"} and read.specs[3].position.startswith("NoPE")
    assert "[77.0]" in read.notes[0]


def test_muse_glimmer_rotates_the_whole_head_whatever_partial_rotary_factor_says():
    # MuseGlimmerTextRotaryEmbedding.compute_default_rope_parameters reads no partial_rotary_factor: head dim 8 gives
    # 4 frequencies with a factor 0.5; with another rope_type the factor shrinks cos and transformers raises.
    from transformers.models.muse_glimmer import modeling_muse_glimmer as hf
    kw = {**SMALL, "head_dim": 8, "num_hidden_layers": 4, "sliding_window": 4}
    cfg = _cfg(hf.MuseGlimmerTextConfig, **kw, rope_parameters={"rope_type": "default", "rope_theta": 100.0,
                                                               "partial_rotary_factor": 0.5})
    assert hf.MuseGlimmerTextRotaryEmbedding(cfg).inv_freq.shape[0] == 4
    model, seen = _run_model(hf.MuseGlimmerTextModel, cfg)
    read, _ = _compare_decoder(cfg, model, seen, gate="gate_proj")
    assert "partial_rotary_factor 0.5 is not read" in read.notes[0]
    linear = _cfg(hf.MuseGlimmerTextConfig, **kw, rope_parameters={"rope_type": "linear", "factor": 2.0,
                                                                  "rope_theta": 100.0, "partial_rotary_factor": 0.5})
    with pytest.raises(RuntimeError):
        hf.MuseGlimmerTextModel(linear)(inputs_embeds=torch.zeros(1, 3, 32))
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        mconfig.read(linear)


def _muse_tower(module, **kw):
    cfg = _cfg(getattr(module, [n for n in dir(module) if n.endswith("VisionConfig")][0]), hidden_size=32,
               intermediate_size=8, num_attention_heads=2, num_hidden_layers=3, patch_size=2, pos_emb_height=4,
               pos_emb_width=4, rope_parameters={"rope_type": "axial", "rope_theta": 100.0}, **kw)
    return cfg, getattr(module, [n for n in dir(module) if n.endswith("VisionModel")][0])


@pytest.mark.parametrize("name", ["muse_glimmer", "muse_spark"])
def test_muse_vision_tower_flipped_offset_positions_in_window_order(name):
    # MuseGlimmerVisionModel (Muse Spark's is the same code): position_ids.flip(-1) + 1 in get_vision_window_index's
    # order (merge 1, windows of pos_emb_height 4 patches a side); layers 0, 1 attend within their window, layer 2 (the
    # last) over the image.
    import importlib
    module = importlib.import_module(f"transformers.models.{name}.modeling_{name}")
    cfg, model_cls = _muse_tower(module)
    torch.manual_seed(0)
    tower = model_cls(cfg).double().eval()
    seen, hooks = _hook_towers([block.attn for block in tower.layers])
    pixels = torch.from_numpy(np.random.default_rng(0).standard_normal((H * W, cfg.patch_temporal * 3 * 4)))
    with torch.no_grad():
        tower(pixels, grid_thw=torch.tensor([[1, H, W]]))
    read = mconfig.read(cfg)
    order = merge_positions(H, W, 1, window=4)
    positions, mask = order[::-1] + 1, axial_window_mask(order, 4)[None]
    assert [s.layer_type for s in read.specs] == ["window_attention", "window_attention", "full_attention"]
    for i, block in enumerate(tower.layers):
        layer = read.layers[i]
        _copy_four(block.attn, layer, "proj")
        x, want = seen[i]
        m = mask if read.specs[i].patch_window else None
        got = layer(x[None], positions=positions, mask=m, causal=False)[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
        assert np.max(np.abs(want)) > 0.1
        rows_first = layer(x[None], positions=positions[::-1], mask=m, causal=False)[0]
        assert np.max(np.abs(rows_first - want)) > 1e-3
        unshifted = layer(x[None], positions=order[::-1], mask=m, causal=False)[0]     # the + 1: relative, no change
        np.testing.assert_allclose(unshifted, want, rtol=0, atol=ATOL)
        if m is not None:
            assert np.max(np.abs(layer(x[None], positions=positions, causal=False)[0] - want)) > 1e-3


def test_muse_spark_decoder_is_glimmers_with_each_heads_output_normed():
    # MuseSparkTextAttention: Muse Glimmer's layer, and o_norm (each head's attention output RMS-normed without weight)
    # before the per-feature gate. Switching o_norm off in the read layer changes its output: it is compared.
    from transformers.models.muse_spark import modeling_muse_spark as hf

    def build(c):
        model = hf.MuseSparkTextModel(c)
        for layer in model.layers:
            _float64_norm(layer.self_attn.o_norm)
        return model
    cfg = _cfg(hf.MuseSparkTextConfig, **{**SMALL, "head_dim": 8, "num_hidden_layers": 4, "sliding_window": 4,
                                         "mlp_layer_types": ["dense"] * 4,
                                         "rope_parameters": {"rope_type": "default", "rope_theta": 100.0}})
    model, seen = _run_model(build, cfg)
    read, kinds = _compare_decoder(cfg, model, seen, gate="gate_proj")
    assert kinds == {"sliding_attention", "full_attention"} and read.specs[3].position.startswith("NoPE")
    layer, (x, want) = read.layers[0], seen[0]
    assert layer.o_norm
    layer.o_norm = False
    assert np.max(np.abs(layer(x, positions=np.arange(T), causal=True) - want)) > 1e-3


def test_muse_spark_whole_config_reads_its_decoder_and_its_tower():
    cfg = _cfg(transformers.MuseSparkConfig, text_config={**SMALL, "head_dim": 8, "num_hidden_layers": 2},
               vision_config={"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 2},
               audio_config={"out_hidden_size": 32})
    read = mconfig.read(cfg)
    assert (read.model_type, read.vision.model_type, len(read.layers)) == ("muse_spark_text", "muse_spark_vision", 2)
    assert read.layers[0].o_norm and any("audio" in n for n in read.notes)


# --------------------------------------------------------------------------- Dots 3 Note

@pytest.mark.parametrize("bias", [False, True])
def test_dots3_note_vision_tower(bias):
    # Dots3NoteVisionAttention: qkv and proj (attention_bias), q/k RMSNorm (weight w), the Qwen towers' 2-D RoPE in
    # get_vision_position_ids(grid, spatial_merge_size 2)'s order.
    from transformers.models.dots3_note import modeling_dots3_note as hf
    cfg = _cfg(hf.Dots3NoteVisionConfig, hidden_size=32, intermediate_size=16, num_attention_heads=2,
               num_hidden_layers=2, num_channels=1, patch_size=2, mlp_layer_types=["dense", "dense"],
               adapter_in_dim=32, adapter_out_dim=16, attention_bias=bias,
               rope_parameters={"rope_type": "axial", "rope_theta": 100.0})
    torch.manual_seed(0)
    tower = hf.Dots3NoteVisionModel(cfg).double().eval()
    for block in tower.blocks:
        _float64_norm(block.attn.q_norm)
        _float64_norm(block.attn.k_norm)
    seen, hooks = _hook_towers([block.attn for block in tower.blocks])
    with torch.no_grad():
        pixels = torch.from_numpy(np.random.default_rng(0).standard_normal((H * W, 4)))
        tower(pixels, grid_thw=torch.tensor([[1, H, W]]))
    read, positions = mconfig.read(cfg), merge_positions(H, W, 2)
    for i, block in enumerate(tower.blocks):
        layer = read.layers[i]
        copy_qkv(block.attn, layer)
        layer.q_norm, layer.k_norm = (getattr(block.attn, n).weight.detach().numpy().copy()
                                      for n in ("q_norm", "k_norm"))
        x, want = seen[i]
        np.testing.assert_allclose(layer(x[None], positions=positions, causal=False)[0], want, rtol=0, atol=ATOL)
        assert np.max(np.abs(want)) > 0.1
        assert np.max(np.abs(layer(x[None], positions=merge_positions(H, W, 1), causal=False)[0] - want)) > 1e-3


def test_dots3_note_decoder_read_from_the_hub_layout_too():
    # The hub's dots3_note config holds the text config at the top level; it reads as dots3_note_text (the layers
    # against transformers' modules: tests/test_config_interop_dots.py).
    from transformers.models.dots3_note import configuration_dots3_note as hf
    text = _cfg(hf.Dots3NoteTextConfig, num_hidden_layers=2)
    for raw in (text.to_dict(), {**text.to_dict(), "model_type": "dots3_note"}):
        read = mconfig.read(raw)
        assert read.model_type == "dots3_note_text" and read.specs[0].kwargs["k_rope_norm"]


# --------------------------------------------------------------------------- MusicFlamingo

def test_musicflamingo_reads_its_qwen2_decoder_and_names_the_audio_encoder():
    # MusicFlamingoModel builds AutoModel.from_config(text_config): a Qwen2Model (RoPE half, q/k/v biases).
    cfg = _cfg(transformers.MusicFlamingoConfig, text_config={**SMALL, "model_type": "qwen2", "num_hidden_layers": 2,
                                                              "rope_parameters": {"rope_type": "default",
                                                                                  "rope_theta": 100.0}})
    model, seen = _run_model(transformers.Qwen2Model, cfg.text_config)
    compare_layers(cfg, model, seen)
    read = mconfig.read(cfg)
    assert read.model_type == "musicflamingo_text" and read.vision is None
    assert "audio encoder" in read.notes[0] and "rotary time embedding" in read.notes[0]
