"""``minipos.config.read`` on the families of ``minipos._config_towers`` against transformers 5.24: each tower,
tiny, is built by transformers with random weights in float64 and run on one image; a forward hook captures each
encoder layer's attention input and output, so that the patch order and the position embeddings are the ones the
tower itself builds. The weights are copied into the layer ``read`` builds for the same config, which runs on the
captured input with ``merge_positions``: it must match within atol 1e-6. The decoders (Qwen3.5's attention layers
with their output gate, the Omni thinkers') are run the same way on three position streams. Skipped when torch or
transformers is missing.

transformers rotates q and k in float32 (cos and sin from float32 angles) inside the float64 tower: agreement is
to float32 accuracy, well inside 1e-6 at these sizes."""


import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

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
from test_config_interop_qwen_vision import (
    _compare as compare_tower,
)
from test_config_interop_qwen_vision import (
    _copy as _copy_qkv,
)

from minipos import config as mconfig  # noqa: E402
from minipos.axial import merge_positions  # noqa: E402


def _compare(model, tower, seen, positions):
    return compare_tower(model, tower, seen, positions, copy=_copy_qkv)


# --------------------------------------------------------------------------- Qwen3.5

@pytest.mark.parametrize("module, name", [("qwen3_5", "Qwen3_5"), ("qwen3_5_moe", "Qwen3_5Moe")])
def test_qwen3_5_vision_tower(module, name):
    hf = getattr(transformers.models, module)
    cfg = _cfg(getattr(hf, f"{name}VisionConfig"), hidden_size=32, out_hidden_size=8, intermediate_size=8,
               num_position_embeddings=16, **TOWER)
    tower, seen = _run_tower(getattr(hf, f"{name}VisionModel"), cfg)
    model = mconfig.read(cfg)
    assert model.model_type == f"{module}_vision"
    assert _compare(model, tower, seen, merge_positions(H, W, MERGE)) == ["full_attention"] * 3
    assert "learned position table" in model.specs[0].notes[0]


def _qwen3_5_text(module, name, **kw):
    hf = getattr(transformers.models, module)
    extra = {"num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 8,
             "shared_expert_intermediate_size": 8} if "Moe" in name else {}
    return _cfg(getattr(hf, f"{name}TextConfig"), hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
                head_dim=16, intermediate_size=16, vocab_size=8, num_hidden_layers=4, linear_num_key_heads=2,
                linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8, **extra,
                rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "partial_rotary_factor": 0.5,
                                 "mrope_section": [2, 1, 1], "mrope_interleaved": True}, **kw)


def _copy_gated(ref, layer):
    """Qwen3.5's attention into the minipos layer, q_proj split as ``minipos.qk_norm`` says: each head's 2 D rows of
    ``q_proj`` are its D query rows, then its D gate rows, so ``W = q_proj.weight.T.reshape(d, H, 2, D)`` gives
    ``wq = W[:, :, 0]`` and ``wg = W[:, :, 1]`` (and the bias likewise)."""
    d, H, D = layer.d_model, layer.num_heads, layer.head_dim
    w = ref.q_proj.weight.detach().numpy().T.reshape(d, H, 2, D)
    layer.wq, layer.wg = w[:, :, 0].reshape(d, H * D).copy(), w[:, :, 1].reshape(d, H * D).copy()
    if ref.q_proj.bias is not None:
        b = ref.q_proj.bias.detach().numpy().reshape(H, 2, D)
        layer.bq, layer.bg = b[:, 0].reshape(H * D).copy(), b[:, 1].reshape(H * D).copy()
    for n in "kvo":
        lin = getattr(ref, f"{n}_proj")
        setattr(layer, "w" + n, lin.weight.detach().numpy().T.copy())
        setattr(layer, "b" + n, None if lin.bias is None else lin.bias.detach().numpy().copy())
    layer.q_norm, layer.k_norm = (getattr(ref, n).weight.detach().numpy().copy() for n in ("q_norm", "k_norm"))


def _float64_offset_norm(norm):
    """Qwen3_5RMSNorm's formula, ``x / rms(x) * (1 + w)``, in float64 (HF casts to float32 first)."""
    def forward(h):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.eps) * (1.0 + norm.weight)
    norm.forward = forward


@pytest.mark.parametrize("module, name, bias", [("qwen3_5", "Qwen3_5", False), ("qwen3_5_moe", "Qwen3_5Moe", False),
                                                ("qwen3_5", "Qwen3_5", True)])
def test_qwen3_5_decoder_attention_layers_with_the_gate(module, name, bias):
    """Qwen3.5's text model in float64 with random weights (the gated delta nets and the MLPs zeroed: they do not
    touch positions, and the MoE kernels refuse float64), run on three different position streams: each attention
    layer's captured input and output against the layer ``read`` builds, q_proj split into wq and wg."""
    hf = getattr(transformers.models, module)
    cfg = _qwen3_5_text(module, name, attention_bias=bias)
    read = mconfig.read(cfg)
    assert [s.index for s in read.specs] == [3] and "layers 0, 1, 2 are gated delta nets" in read.notes[0]
    layer = read.layers[0]
    assert (layer.gate, layer.norm_offset, layer.scheme.rotary_dim, layer.scheme.mrope_section) == \
        ("feature", 1.0, 8, [2, 1, 1])                                     # int(16 * 0.5), HF's rotary dim
    B, T = 2, 9
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = getattr(hf, f"{name}TextModel")(cfg).double().eval()
    seen = {}
    for i, dec in enumerate(model.layers):
        dec.mlp.forward = lambda h, *a, **k: torch.zeros_like(h)
        if cfg.layer_types[i] == "linear_attention":
            dec.linear_attn.forward = lambda hidden_states, *a, **k: torch.zeros_like(hidden_states)
            continue
        _randomize(dec.self_attn)
        for n in ("q_norm", "k_norm"):
            _float64_offset_norm(getattr(dec.self_attn, n))
        dec.self_attn.register_forward_hook(
            lambda m, a, k, out, i=i: seen.__setitem__(i, (k["hidden_states"].numpy().copy(), out[0].numpy().copy())),
            with_kwargs=True)
    positions = np.cumsum(np.random.default_rng(3).integers(0, 3, (3, T)), axis=1)    # three different streams
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((B, T, cfg.hidden_size)))
    with torch.no_grad():
        model(inputs_embeds=x, position_ids=torch.from_numpy(np.broadcast_to(positions[:, None], (3, B, T)).copy()),
              use_cache=False)
    ref = model.layers[3].self_attn
    assert ref.q_proj.out_features == 2 * 4 * 16                             # query and gate, per head
    _copy_gated(ref, layer)
    got, want = layer(seen[3][0], positions=positions, causal=True), seen[3][1]
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)
    assert np.max(np.abs(want)) > 0.1
    layer.wg = layer.bg = None                                               # the gate matters
    assert np.max(np.abs(layer(seen[3][0], positions=positions, causal=True) - want)) > 1e-3


def test_qwen3_5_whole_config_reads_its_decoder_and_its_tower():
    cfg = _cfg(transformers.Qwen3_5Config, vision_config={"depth": 2, "num_heads": 2, "hidden_size": 32})
    model = mconfig.read(cfg)
    assert model.model_type == "qwen3_5_text" and [s.index for s in model.specs] == list(range(3, 32, 4))
    assert model.layers[0].gate == "feature" and model.layers[0].scheme.rotary_dim == 64   # int(256 * 0.25)
    tower = mconfig.read(cfg.to_dict()["vision_config"])
    assert tower.model_type == "qwen3_5_vision" and len(tower.layers) == 2
    assert model.vision.model_type == "qwen3_5_vision" and len(model.vision.layers) == 2
    assert tower.layers[0].scheme.layout == "qwen"


# --------------------------------------------------------------------------- the Omni thinkers

def _copy_q_k_v(ref, layer):
    """HF's three Linears ``q``, ``k``, ``v`` and ``proj`` (Qwen2_5OmniVisionAttention) into the minipos layer."""
    for n in "qkv":
        lin = getattr(ref, n)
        setattr(layer, "w" + n, lin.weight.detach().numpy().T.copy())
        setattr(layer, "b" + n, lin.bias.detach().numpy().copy())
    layer.wo, layer.bo = ref.proj.weight.detach().numpy().T.copy(), ref.proj.bias.detach().numpy().copy()


def test_qwen2_5_omni_vision_encoder_window_and_full_layers():
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as hf

    from minipos.axial import axial_window_mask
    # window_size 8 // merge 2 // patch 2 = 2 merged patches a side: windows of 4 x 4 patches, in the window order.
    cfg = _cfg(hf.Qwen2_5OmniVisionEncoderConfig, hidden_size=32, out_hidden_size=8, intermediate_size=8,
               window_size=8, fullatt_block_indexes=[1], **TOWER)
    tower, seen = _run_tower(hf.Qwen2_5OmniVisionEncoder, cfg)
    model, positions = mconfig.read(cfg), merge_positions(H, W, MERGE, window=4)
    assert [s.layer_type for s in model.specs] == ["window_attention", "full_attention", "window_attention"]
    for i, block in enumerate(tower.blocks):
        layer, spec = model.layers[i], model.specs[i]
        _copy_q_k_v(block.attn, layer)
        mask = None if spec.patch_window is None else axial_window_mask(positions, spec.patch_window)[None]
        x, want = seen[i]
        got = layer(x[None], positions=positions, mask=mask, causal=False)[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"layer {i}")
        if mask is not None:                                                 # the windows matter
            assert np.max(np.abs(layer(x[None], positions=positions, causal=False)[0] - want)) > 1e-3


def test_qwen3_omni_moe_vision_encoder():
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf
    cfg = _cfg(hf.Qwen3OmniMoeVisionEncoderConfig, hidden_size=32, out_hidden_size=8, intermediate_size=8,
               num_position_embeddings=16, deepstack_visual_indexes=[], **TOWER)
    tower, seen = _run_tower(hf.Qwen3OmniMoeVisionEncoder, cfg)
    model = mconfig.read(cfg)
    assert _compare(model, tower, seen, merge_positions(H, W, MERGE)) == ["full_attention"] * 3
    assert "learned position table" in model.specs[0].notes[0]


def _float64_norm(norm):
    """An HF RMSNorm's formula in float64 (HF casts to float32 first), weight w."""
    def forward(h):
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon) * norm.weight
    norm.forward = forward


def _compare_decoder(model_cls, cfg, read):
    """Each decoder layer's attention of ``model_cls(cfg)`` (float64, random weights, hooks) against ``read``'s
    layer, on three different position streams; the MLPs (MoE kernels refuse float64) are zeroed."""
    B, T = 2, 12
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = model_cls(cfg).double().eval()
    positions = np.cumsum(np.random.default_rng(3).integers(0, 3, (3, T)), axis=1)
    seen = {}
    for i, dec in enumerate(model.layers):
        dec.mlp.forward = lambda h, *a, **k: torch.zeros_like(h)
        _randomize(dec.self_attn)
        for name in ("q_norm", "k_norm"):
            if hasattr(dec.self_attn, name):
                _float64_norm(getattr(dec.self_attn, name))
        dec.self_attn.register_forward_hook(
            lambda m, a, k, out, i=i: seen.__setitem__(i, (k["hidden_states"].numpy().copy(), out[0].numpy().copy())),
            with_kwargs=True)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((B, T, cfg.hidden_size)))
    with torch.no_grad():
        model(inputs_embeds=x, position_ids=torch.from_numpy(np.broadcast_to(positions[:, None], (3, B, T)).copy()),
              use_cache=False)
    for i, dec in enumerate(model.layers):
        layer, ref = read.layers[i], dec.self_attn
        for n in "qkvo":
            lin = getattr(ref, f"{n}_proj")
            setattr(layer, "w" + n, lin.weight.detach().numpy().T.copy())
            setattr(layer, "b" + n, None if lin.bias is None else lin.bias.detach().numpy().copy())
        for name in ("q_norm", "k_norm"):
            if hasattr(ref, name):
                setattr(layer, name, getattr(ref, name).weight.detach().numpy().copy())
        np.testing.assert_allclose(layer(seen[i][0], positions=positions, causal=True), seen[i][1], rtol=0, atol=ATOL)
        assert np.max(np.abs(seen[i][1])) > 0.1
        assert np.max(np.abs(layer(seen[i][0], positions=positions[[0, 2, 1]], causal=True) - seen[i][1])) > 1e-3


def test_qwen2_5_omni_thinker_text_decoder():
    # Qwen2_5OmniAttention: Qwen2-VL's split M-RoPE (here [2, 1, 1]: 4 frequencies of head dim 8), biases on q, k, v.
    from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as hf
    cfg = _cfg(hf.Qwen2_5OmniTextConfig, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=16, vocab_size=8, num_hidden_layers=2,
               rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "mrope_section": [2, 1, 1]})
    read = mconfig.read(cfg)
    assert read.model_type == "qwen2_5_omni_text" and read.specs[0].no_bias == ("bo",)
    _compare_decoder(hf.Qwen2_5OmniThinkerTextModel, cfg, read)


def test_qwen3_omni_moe_thinker_text_decoder():
    # Qwen3OmniMoeThinkerTextAttention: Qwen3-VL's interleaved M-RoPE ([2, 1, 1]), q/k RMSNorm (weight w).
    from transformers.models.qwen3_omni_moe import modeling_qwen3_omni_moe as hf
    cfg = _cfg(hf.Qwen3OmniMoeTextConfig, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
               intermediate_size=16, moe_intermediate_size=8, num_experts=2, num_experts_per_tok=1, vocab_size=8,
               num_hidden_layers=2, rope_parameters={"rope_type": "default", "rope_theta": 1000.0,
                                                     "mrope_section": [2, 1, 1], "mrope_interleaved": True})
    read = mconfig.read(cfg)
    assert read.model_type == "qwen3_omni_moe_text" and read.layers[0].scheme.interleaved
    _compare_decoder(hf.Qwen3OmniMoeThinkerTextModel, cfg, read)


@pytest.mark.parametrize("name, text, vision", [
    ("Qwen2_5OmniConfig", "qwen2_5_omni_text", "qwen2_5_omni_vision_encoder"),
    ("Qwen3OmniMoeConfig", "qwen3_omni_moe_text", "qwen3_omni_moe_vision_encoder")])
def test_a_whole_omni_config_is_read_through_its_thinker(name, text, vision):
    cfg = _cfg(getattr(transformers, name), thinker_config={
        "text_config": {"hidden_size": 32, "num_attention_heads": 4, "head_dim": 8, "num_hidden_layers": 2,
                        "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1]}},
        "vision_config": {"depth": 2, "num_heads": 2, "hidden_size": 32}})
    model = mconfig.read(cfg)
    assert (model.model_type, model.vision.model_type, len(model.layers), len(model.vision.layers)) == (text, vision,
                                                                                                       2, 2)
    assert "audio_config" in model.notes[0] and "talker_config" in model.notes[0]


# --------------------------------------------------------------------------- GLM-4V

@pytest.mark.parametrize("module, name, bias", [("glm4v", "Glm4v", False), ("glm4v", "Glm4v", True),
                                                ("glm4v_moe", "Glm4vMoe", True)])
def test_glm4v_vision_tower(module, name, bias):
    # Glm4vVisionAttention: qkv with attention_bias, proj without; the learned table (image_size 8 // patch 2 = 4 a
    # side, resampled to 6 x 10) is in the captured input. Its patch embedder is a Conv3d over (C, T, P, P).
    hf = getattr(transformers.models, module)
    cfg = _cfg(getattr(hf, f"{name}VisionConfig"), hidden_size=32, out_hidden_size=8, intermediate_size=8,
               image_size=8, attention_bias=bias, **TOWER)
    tower, seen = _run_tower(getattr(hf, f"{name}VisionModel"), cfg)
    model = mconfig.read(cfg)
    assert model.specs[0].no_bias == (("bo",) if bias else ()) and "4 x 4" in model.specs[0].notes[0]
    assert _compare(model, tower, seen, merge_positions(H, W, MERGE)) == ["full_attention"] * 3
