"""``minipos.config.read`` against transformers 5.24: for each family the reader supports, a tiny
model of that family is built by transformers (its config class, its decoder with random
weights, float64), run on random inputs, and the input and output of each layer's attention
module are captured with a forward hook, so the masks and the position embeddings are those the
model itself builds. The weights are copied into the layer ``read`` builds for the same config, and
its output on the captured input must match the module's within atol 1e-6 for every layer (and so
for every layer type). Skipped when torch or transformers is missing.

Where transformers computes in float32 inside a float64 model (cos and sin from float32 angles,
the q/k RMSNorms, Llama 4's L2 norm), agreement is to float32 accuracy, well inside 1e-6 at these
sizes; the q/k norms are replaced by their float64 formula so that they are compared exactly."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from dataclasses import replace  # noqa: E402

from minipos import config as mconfig  # noqa: E402
from minipos.rope_scaling import Rotary  # noqa: E402
from minipos.mla import MultiHeadLatentAttention  # noqa: E402
from minipos.qk_norm import QKNormAttention  # noqa: E402

B, T = 2, 12
ATOL = 1e-6


def _float64_norm(norm, offset=0.0):
    """An HF RMSNorm module's formula in float64 (HF casts to float32 first)."""
    eps = getattr(norm, "variance_epsilon", None) or getattr(norm, "eps", 1e-6)

    def forward(h):
        n = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
        w = getattr(norm, "weight", None)
        return n if w is None else n * (offset + w)
    norm.forward = forward


def _randomize(attn):
    """Every parameter of the attention module drawn away from its init (biases, sinks and norm weights
    included, so that each is compared)."""
    with torch.no_grad():
        for name, p in attn.named_parameters():
            if p.ndim == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
            elif "norm" in name:
                p.uniform_(0.5, 1.5)
            else:
                p.normal_(0.0, 0.5)


def _capture(model, layers):
    """Forward hooks on each decoder layer's ``self_attn``: ``{i: (hidden_states in, output)}``."""
    seen, hooks = {}, []
    for i, layer in enumerate(layers):
        def hook(module, args, kwargs, out, i=i):
            x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            seen[i] = (x.detach().numpy().copy(), out[0].detach().numpy().copy())
        hooks.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
    return seen, hooks


def _run_model(model_cls, cfg, *, attn="sdpa", position_ids=None, seed=0, norm_offset=0.0):
    torch.manual_seed(seed)
    cfg._attn_implementation = attn
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_cls(cfg).double().eval()
    layers = model.layers
    for layer in layers:
        for name in ("mlp",):                                             # MoE kernels refuse float64; not compared
            if hasattr(layer, name):
                getattr(layer, name).forward = lambda h, *a, **k: torch.zeros_like(h)
        _randomize(layer.self_attn)
        for name in ("q_norm", "k_norm", "q_a_layernorm", "kv_a_layernorm"):
            if getattr(layer.self_attn, name, None) is not None:
                _float64_norm(getattr(layer.self_attn, name), norm_offset if name in ("q_norm", "k_norm") else 0.0)
        if getattr(layer.self_attn, "qk_norm", None) is not None:
            _float64_norm(layer.self_attn.qk_norm)
    seen, hooks = _capture(model, layers)
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((B, T, cfg.hidden_size)))
    kwargs = {} if position_ids is None else {"position_ids": position_ids}
    with torch.no_grad():
        model(inputs_embeds=x, use_cache=False, **kwargs)
    for h in hooks:
        h.remove()
    return model, seen


def _w(lin):
    return lin.weight.detach().numpy().T.copy()


def _copy(ref, layer):
    """HF attention module -> the minipos layer: ``W = weight.T``, each bias, norm and sink it has."""
    if isinstance(layer, MultiHeadLatentAttention):
        pairs = {"wkv_a": ref.kv_a_proj_with_mqa, "wkv_b": ref.kv_b_proj, "wo": ref.o_proj}
        pairs.update({"wq": ref.q_proj} if getattr(ref, "q_proj", None) is not None
                     else {"wq_a": ref.q_a_proj, "wq_b": ref.q_b_proj})
        for name, lin in pairs.items():
            setattr(layer, name, _w(lin))
        layer.kv_a_norm = ref.kv_a_layernorm.weight.detach().numpy().copy()
        if getattr(ref, "q_a_layernorm", None) is not None:
            layer.q_a_norm = ref.q_a_layernorm.weight.detach().numpy().copy()
        return
    if hasattr(ref, "qkv_proj"):                                       # Phi-3: one fused projection
        w = ref.qkv_proj.weight.detach().numpy()
        q, kv = layer.wq.shape[1], layer.wk.shape[1]
        layer.wq, layer.wk, layer.wv = w[:q].T.copy(), w[q:q + kv].T.copy(), w[q + kv:].T.copy()
        layer.wo = _w(ref.o_proj)
    else:
        for n in "qkvo":
            lin = getattr(ref, f"{n}_proj")
            setattr(layer, "w" + n, _w(lin))
            if lin.bias is not None:
                setattr(layer, "b" + n, lin.bias.detach().numpy().copy())
            else:
                assert getattr(layer, "b" + n) is None, f"the layer has b{n}; the model has none"
    if isinstance(layer, QKNormAttention):
        for n in ("q_norm", "k_norm"):
            norm = getattr(ref, n, None)
            if norm is not None:
                setattr(layer, n, norm.weight.detach().numpy().copy())
    if getattr(ref, "sinks", None) is not None:
        layer.sinks = ref.sinks.detach().numpy().copy()
    if getattr(ref, "g_proj", None) is not None:                       # LFM3's output gate, one per head
        layer.wg = _w(ref.g_proj)
        assert ref.g_proj.bias is None and layer.bg is None


def _compare(cfg, model, seen, positions=None):
    """Every layer of ``read(cfg)`` against the captured module; returns the layer types compared."""
    model_positions = mconfig.read(cfg)
    assert len(model_positions.layers) == len(model.layers)
    kinds = set()
    for i, ref_layer in enumerate(model.layers):
        x, want = seen[i]
        layer = model_positions.layers[i]
        _copy(ref_layer.self_attn, layer)
        p = np.arange(T) if positions is None else positions
        got = layer(x, positions=p, causal=True)
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"layer {i}")
        assert np.max(np.abs(want)) > 0.1                                # a comparison that can fail
        kinds.add(model_positions.specs[i].layer_type)
    return kinds


def _cfg(cls, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls(**kw)


SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, intermediate_size=16, vocab_size=8)


def test_llama3_scaling():
    cfg = _cfg(transformers.LlamaConfig, **SMALL, num_hidden_layers=2, head_dim=8, max_position_embeddings=64,
               rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8})
    model, seen = _run_model(transformers.LlamaModel, cfg)
    assert _compare(cfg, model, seen) == {"full_attention"}


def test_llama_attention_bias_and_dynamic_ntk():
    cfg = _cfg(transformers.LlamaConfig, **SMALL, num_hidden_layers=1, head_dim=8, max_position_embeddings=6,
               attention_bias=True, rope_parameters={"rope_type": "dynamic", "rope_theta": 100.0, "factor": 2.0})
    model, seen = _run_model(transformers.LlamaModel, cfg)
    _compare(cfg, model, seen)                                           # T = 12 > 6: the NTK base grows


def test_mistral_sliding_window():
    cfg = _cfg(transformers.MistralConfig, **SMALL, num_hidden_layers=2, head_dim=8, sliding_window=4,
               rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    model, seen = _run_model(transformers.MistralModel, cfg)
    assert _compare(cfg, model, seen) == {"sliding_attention"}
    assert mconfig.read(cfg).layers[0].sliding_window == 4               # HF's convention: W keys


def test_qwen2_biases_and_window_layers():
    cfg = _cfg(transformers.Qwen2Config, **SMALL, num_hidden_layers=3, use_sliding_window=True, sliding_window=3,
               max_window_layers=1, rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                                                     "original_max_position_embeddings": 4})
    model, seen = _run_model(transformers.Qwen2Model, cfg)
    assert _compare(cfg, model, seen) == {"full_attention", "sliding_attention"}


def test_qwen3_qk_norm():
    cfg = _cfg(transformers.Qwen3Config, **SMALL, num_hidden_layers=2, head_dim=8,
               rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    model, seen = _run_model(transformers.Qwen3Model, cfg)
    _compare(cfg, model, seen)
    layer = mconfig.read(cfg).layers[0]
    _copy(model.layers[0].self_attn, layer)
    x, want = seen[0]
    layer.q_norm = layer.k_norm = None                                   # the norms switched off: it differs
    assert np.max(np.abs(layer(x, causal=True) - want)) > 1e-3


def test_phi3_longrope_partial_rotary():
    half = int(8 * 0.5) // 2
    params = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
              "short_factor": [1.0 + 0.1 * i for i in range(half)], "long_factor": [2.0 + i for i in range(half)],
              "original_max_position_embeddings": 8}
    cfg = _cfg(transformers.Phi3Config, **SMALL, pad_token_id=0, num_hidden_layers=2, max_position_embeddings=64,
               original_max_position_embeddings=8, rope_parameters=params, partial_rotary_factor=0.5)
    model, seen = _run_model(transformers.Phi3Model, cfg)
    _compare(cfg, model, seen)                                           # T = 12 > 8: the long factors
    assert mconfig.read(cfg).layers[0].scheme.rotary_dim == 4


def test_phi3_sliding_window():
    cfg = _cfg(transformers.Phi3Config, **SMALL, pad_token_id=0, num_hidden_layers=1, sliding_window=5)
    model, seen = _run_model(transformers.Phi3Model, cfg)
    assert _compare(cfg, model, seen) == {"sliding_attention"}


def test_gemma3_local_and_global_layers():
    cfg = _cfg(transformers.Gemma3TextConfig, **SMALL, num_hidden_layers=6, head_dim=8, sliding_window=3,
               query_pre_attn_scalar=12, rope_parameters={
                   "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                   "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0}})
    model, seen = _run_model(transformers.Gemma3TextModel, cfg, norm_offset=1.0)
    assert _compare(cfg, model, seen) == {"full_attention", "sliding_attention"}


def test_cohere2_sliding_rope_and_global_nope():
    cfg = _cfg(transformers.Cohere2Config, **SMALL, num_hidden_layers=4, head_dim=8, sliding_window=4,
               rope_parameters={"rope_type": "default", "rope_theta": 1000.0}, attention_bias=True)
    model, seen = _run_model(transformers.Cohere2Model, cfg)
    assert _compare(cfg, model, seen) == {"full_attention", "sliding_attention"}
    assert mconfig.read(cfg).specs[3].position.startswith("NoPE")


def test_smollm3_nope_layers():
    cfg = _cfg(transformers.SmolLM3Config, **SMALL, pad_token_id=0, num_hidden_layers=4,
               rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    model, seen = _run_model(transformers.SmolLM3Model, cfg)
    _compare(cfg, model, seen)
    assert [s.position.startswith("NoPE") for s in mconfig.read(cfg).specs] == [False, False, False, True]


def test_llama4_irope_chunks_nope_and_temperature():
    cfg = _cfg(transformers.Llama4TextConfig, **SMALL, num_hidden_layers=4, head_dim=8, attention_chunk_size=5,
               floor_scale=4, attn_scale=0.3, intermediate_size_mlp=16, num_local_experts=2,
               rope_parameters={"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8})
    model, seen = _run_model(transformers.Llama4TextModel, cfg)
    assert _compare(cfg, model, seen) == {"chunked_attention", "full_attention"}


def test_gpt_oss_sinks_window_and_yarn():
    cfg = _cfg(transformers.GptOssConfig, **SMALL, num_hidden_layers=2, head_dim=8, sliding_window=3,
               num_local_experts=2, num_experts_per_tok=1,
               rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "beta_fast": 8.0,
                                "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4})
    model, seen = _run_model(transformers.GptOssModel, cfg, attn="eager")   # the sinks' reference path
    assert _compare(cfg, model, seen) == {"full_attention", "sliding_attention"}


@pytest.mark.parametrize("q_lora_rank, interleave", [(16, True), (None, False)])
def test_deepseek_v3_mla(q_lora_rank, interleave):
    cfg = _cfg(transformers.DeepseekV3Config, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
               intermediate_size=16, moe_intermediate_size=8, vocab_size=8, num_hidden_layers=2,
               first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
               q_lora_rank=q_lora_rank, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6,
               rope_interleave=interleave, rope_parameters={
                   "rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "original_max_position_embeddings": 4,
                   "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 8.0, "beta_slow": 1.0})
    model, seen = _run_model(transformers.DeepseekV3Model, cfg)
    _compare(cfg, model, seen)


def test_qwen2_vl_mrope_sections():
    from transformers.models.qwen2_vl.modeling_qwen2_vl import Qwen2VLTextModel
    cfg = _cfg(transformers.Qwen2VLTextConfig, **SMALL, num_hidden_layers=2,
               rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "mrope_section": [2, 1, 1]})
    rng = np.random.default_rng(3)
    positions = np.cumsum(rng.integers(0, 3, (3, T)), axis=1)            # three different streams
    pos = torch.from_numpy(np.broadcast_to(positions[:, None], (3, B, T)).copy())
    model, seen = _run_model(Qwen2VLTextModel, cfg, position_ids=pos)
    _compare(cfg, model, seen, positions=positions)


SHIPPED = ["cohere2", "deepseek-v2-lite", "deepseek-v3", "deepseek-v3.2-exp", "gemma-3-4b", "gemma-4-26b-a4b",
           "glm-4.1v-9b", "gpt-oss-20b", "llama-3.1-8b", "llama-4-scout", "ministral-3-8b", "mistral-7b-v0.1",
           "qwen2-vl-2b", "qwen2.5-vl-3b", "qwen3-8b", "qwen3-vl-4b", "smollm3-3b"]


@pytest.mark.parametrize("name", SHIPPED)
def test_a_shipped_config_reads_the_same_through_transformers_config_class(name):
    # The raw config.json and transformers' config object built from it (which fills its class's defaults,
    # moves rope_theta/rope_scaling into rope_parameters and writes layer_types) give the same table.
    # Phi-3-vision's legacy "su" file is left out: transformers 5.24's AutoConfig.for_model refuses it
    # (original_max_position_embeddings missing inside rope_parameters); minipos reads it (test_config.py).
    import json
    import os
    path = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "configs", f"{name}.json")
    with open(path) as f:
        data = json.load(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.AutoConfig.for_model(**data)
    table = lambda m: [line for line in m.describe(width=300).splitlines() if not line.startswith("note:")]  # noqa: E731
    assert table(mconfig.read(hf)) == table(mconfig.read(path))


def _three_streams(seed):
    """Three different position streams ``(3, T)`` and the ``(3, B, T)`` tensor HF takes."""
    positions = np.cumsum(np.random.default_rng(seed).integers(0, 3, (3, T)), axis=1)
    return positions, torch.from_numpy(np.broadcast_to(positions[:, None], (3, B, T)).copy())


@pytest.mark.parametrize("moe, section", [(False, [4, 2, 2]), (True, [4, 2, 2]), (False, [2, 3, 3])])
def test_qwen3_vl_interleaved_mrope_and_qk_norm(moe, section):
    # Qwen3-VL's text rotary interleaves the streams whatever mrope_interleaved says; [4, 2, 2] at D = 16
    # puts height on frequencies 1, 4 and width on 2, 5 (HF recomposition_frequencies' slices).
    if moe:
        from transformers.models.qwen3_vl_moe.modeling_qwen3_vl_moe import Qwen3VLMoeTextModel as model_cls
        cls, extra = transformers.Qwen3VLMoeTextConfig, dict(num_experts=2, num_experts_per_tok=1,
                                                               moe_intermediate_size=8)
    else:
        from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextModel as model_cls
        cls, extra = transformers.Qwen3VLTextConfig, {}
    cfg = _cfg(cls, **SMALL, **extra, num_hidden_layers=2, head_dim=16, attention_bias=True,
               rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "mrope_section": section,
                                "mrope_interleaved": True})     # [2, 3, 3]: HF reads it as [3, 3, 2]
    positions, pos = _three_streams(4)
    model, seen = _run_model(model_cls, cfg, position_ids=pos)
    _compare(cfg, model, seen, positions=positions)
    layer = mconfig.read(cfg).layers[0]
    assert layer.scheme.interleaved and isinstance(layer, QKNormAttention) and layer.bo is not None
    _copy(model.layers[0].self_attn, layer)
    layer.scheme.interleaved = False                                     # Qwen2-VL's split streams: it differs
    x, want = seen[0]
    assert np.max(np.abs(layer(x, positions=positions, causal=True) - want)) > 1e-3


def _gemma4_model(cfg):
    """Gemma4TextModel with its weightless value norms in float64 as well (``_run_model`` does q and k)."""
    model = transformers.Gemma4TextModel(cfg)
    for layer in model.layers:
        _float64_norm(layer.self_attn.v_norm)
    return model


@pytest.mark.parametrize("k_eq_v", [False, True])
def test_gemma4_sliding_rope_and_global_prope_layers(k_eq_v):
    # Gemma4TextConfig's defaults for the RoPE: default on sliding layers, proportional (p = 0.25) on full ones;
    # the full layers have their own head dim (global_head_dim) and, under attention_k_eq_v, their own key/value
    # heads whose values are the keys' projection. Values get a weightless RMSNorm, the scale is 1.
    cfg = _cfg(transformers.Gemma4TextConfig, **SMALL, num_hidden_layers=6, head_dim=8, sliding_window=4,
               global_head_dim=16, num_global_key_value_heads=1, attention_k_eq_v=k_eq_v,
               hidden_size_per_layer_input=0, rope_parameters={
                   "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                   "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                      "rope_theta": 10000.0}})
    model, seen = _run_model(_gemma4_model, cfg)
    if k_eq_v:
        model.layers[5].self_attn.v_proj = model.layers[5].self_attn.k_proj   # wv = wk, as the reader's note says
    assert _compare(cfg, model, seen) == {"full_attention", "sliding_attention"}
    m = mconfig.read(cfg)
    assert (m.layers[5].num_kv_heads, m.layers[5].head_dim) == ((1 if k_eq_v else 2), 16)
    assert ("attention_k_eq_v" in m.describe()) is k_eq_v
    x, want = seen[5]
    partial = replace(m.specs[5], scheme=lambda: Rotary(layout="half", rotary_dim=8, base=10000.0)).build()
    _copy(model.layers[5].self_attn, partial)                            # p = 0.5 read as partial rotary: differs
    assert np.max(np.abs(partial(x, causal=True) - want)) > 1e-3
    layer = m.layers[5]
    _copy(model.layers[5].self_attn, layer)
    np.testing.assert_allclose(layer(x, causal=True), want, rtol=0, atol=ATOL)
    layer.v_norm = False                                                 # no value norm: differs
    assert np.max(np.abs(layer(x, causal=True) - want)) > 1e-3


@pytest.mark.parametrize("family", ["llama", "cohere2"])
def test_proportional_rope_type_in_other_families(family):
    # rope_type "proportional" goes through ROPE_INIT_FUNCTIONS in any family whose rotary takes it: Llama's
    # half layout, Cohere2's interleaved one (its sliding layers); factor divides the frequencies.
    params = {"rope_type": "proportional", "rope_theta": 1000.0, "partial_rotary_factor": 0.5, "factor": 2.0}
    if family == "llama":
        cfg = _cfg(transformers.LlamaConfig, **SMALL, num_hidden_layers=1, head_dim=8, rope_parameters=params)
        model, seen = _run_model(transformers.LlamaModel, cfg)
    else:
        cfg = _cfg(transformers.Cohere2Config, **SMALL, num_hidden_layers=2, head_dim=8, sliding_window=4,
                   rope_parameters=params)
        model, seen = _run_model(transformers.Cohere2Model, cfg)
    _compare(cfg, model, seen)
    assert mconfig.read(cfg).specs[0].position.startswith("p-RoPE")


@pytest.mark.parametrize("moe", [False, True])
def test_glm4v_split_mrope_on_partial_rotary(moe):
    # GLM-4V's text rotary: split sections over the first R = int(16 * 0.5) = 8 features of each head, [2, 1, 1]
    # counting its R/2 = 4 frequencies; the dense model pairs (2i, 2i + 1), the MoE model (i, i + 4).
    params = {"rope_type": "default", "rope_theta": 1000.0, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5}
    if moe:
        from transformers.models.glm4v_moe.modeling_glm4v_moe import Glm4vMoeTextModel as model_cls
        cfg = _cfg(transformers.Glm4vMoeTextConfig, **{**SMALL, "num_attention_heads": 2}, num_hidden_layers=2,
                   head_dim=16, first_k_dense_replace=1, n_routed_experts=2, num_experts_per_tok=1,
                   moe_intermediate_size=8, rope_parameters=params)
    else:
        from transformers.models.glm4v.modeling_glm4v import Glm4vTextModel as model_cls
        cfg = _cfg(transformers.Glm4vTextConfig, **{**SMALL, "num_attention_heads": 2}, num_hidden_layers=2,
                   rope_parameters=params)
    positions, pos = _three_streams(5)
    model, seen = _run_model(model_cls, cfg, position_ids=pos)
    _compare(cfg, model, seen, positions=positions)
    layer = mconfig.read(cfg).layers[0]
    assert (layer.scheme.rotary_dim, layer.scheme.layout) == (8, "half" if moe else "interleaved")
    _copy(model.layers[0].self_attn, layer)
    layer.scheme.layout = "interleaved" if moe else "half"               # the other pairing: it differs
    x, want = seen[0]
    assert np.max(np.abs(layer(x, positions=positions, causal=True) - want)) > 1e-3


@pytest.mark.parametrize("window", [4, None])
def test_exaone4_sliding_rope_and_global_nope(window):
    # Exaone4Attention rotates when sliding_window is None or the layer slides: pattern 2 makes layers 1, 3 full
    # (NoPE) when there is a window; without one every layer rotates over the whole context.
    kw = {"layer_types": ["full_attention"] * 4} if window is None else {"sliding_window_pattern": 2}
    cfg = _cfg(transformers.Exaone4Config, **SMALL, num_hidden_layers=4, head_dim=8, sliding_window=window, **kw,
               rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    model, seen = _run_model(transformers.Exaone4Model, cfg)
    _compare(cfg, model, seen)
    positions = [s.position.split()[0] for s in mconfig.read(cfg).specs]
    assert positions == (["RoPE", "NoPE"] * 2 if window else ["RoPE"] * 4)
def _query_scale_matters(cfg, model, seen):
    """Layer 0 with its query scale switched off (beta 0) differs from the model's: the scale is compared."""
    layer = mconfig.read(cfg).layers[0]
    _copy(model.layers[0].self_attn, layer)
    x, want = seen[0]
    layer.scheme.beta = 0.0
    assert np.max(np.abs(layer(x, positions=np.arange(T), causal=True) - want)) > 1e-3


def test_ministral3_query_scale_of_llama_4_scaling_beta():
    # original_max_position_embeddings 4 and T = 12: floor(p / 4) takes 0, 1, 2, so three query scales bite.
    cfg = _cfg(transformers.Ministral3Config, **SMALL, pad_token_id=0, num_hidden_layers=2, head_dim=8,
               max_position_embeddings=64,
               rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                                "original_max_position_embeddings": 4, "max_position_embeddings": 64,
                                "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                                "llama_4_scaling_beta": 0.5})
    model, seen = _run_model(transformers.Ministral3Model, cfg)
    _compare(cfg, model, seen)
    _query_scale_matters(cfg, model, seen)


def test_ministral3_default_rope_parameters():
    # Ministral3Config's own defaults: yarn, factor 16 from 16384, beta 0.1 (positions 0 ... 11: the scale is 1).
    cfg = _cfg(transformers.Ministral3Config, **SMALL, pad_token_id=0, num_hidden_layers=1, head_dim=8)
    model, seen = _run_model(transformers.Ministral3Model, cfg)
    _compare(cfg, model, seen)
    # At positions 16378 ... 16389 floor(p / 16384) steps from 0 to 1. (Consecutive: HF reads position_ids that
    # step by other than 1 as packed sequences and masks across them.) HF's float32 angles of positions near
    # 16384 err by about 1e-5 in the output, so the tolerance is 1e-4 here; the scale itself moves the output
    # by more than 1e-2 (checked by switching it off).
    positions = 16378 + np.arange(T)
    pos = torch.from_numpy(np.broadcast_to(positions, (B, T)).copy())
    model, seen = _run_model(transformers.Ministral3Model, cfg, position_ids=pos)
    layer = mconfig.read(cfg).layers[0]
    _copy(model.layers[0].self_attn, layer)
    x, want = seen[0]
    np.testing.assert_allclose(layer(x, positions=positions, causal=True), want, rtol=0, atol=1e-4)
    layer.scheme.beta = 0.0
    assert np.max(np.abs(layer(x, positions=positions, causal=True) - want)) > 1e-2


MLA_SMALL = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, intermediate_size=16,
                 moe_intermediate_size=8, vocab_size=8, num_hidden_layers=2, first_k_dense_replace=1, n_routed_experts=4,
                 num_experts_per_tok=2, n_group=1, topk_group=1, kv_lora_rank=8, qk_nope_head_dim=4,
                 qk_rope_head_dim=4, v_head_dim=6)
MLA_YARN = {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "original_max_position_embeddings": 4,
            "mscale": 1.0, "mscale_all_dim": 0.5, "beta_fast": 8.0, "beta_slow": 1.0}


@pytest.mark.parametrize("q_lora_rank", [16, None])
def test_deepseek_v2_mla(q_lora_rank):
    # DeepSeek-V2 rotates complex pairs (apply_rotary_emb), has no rope_interleave, and takes YaRN's mscale_all_dim
    # into the softmax scale as V3 does; q_lora_rank None is DeepSeek-V2-Lite's full-rank q_proj.
    cfg = _cfg(transformers.DeepseekV2Config, **MLA_SMALL, q_lora_rank=q_lora_rank, rope_parameters=dict(MLA_YARN))
    model, seen = _run_model(transformers.DeepseekV2Model, cfg)
    _compare(cfg, model, seen)
    assert (mconfig.read(cfg).layers[0].q_lora_rank is None) == (q_lora_rank is None)


def _indexer_capture(model):
    """Forward hooks on each layer's ``self_attn.indexer``: ``{i: (kwargs and args it was called with, top-k)}``."""
    seen, hooks = {}, []
    for i, layer in enumerate(model.layers):
        def hook(module, args, kwargs, out, i=i):
            seen[i] = (args, out.detach().numpy().copy())
        if layer.self_attn.indexer is not None:                          # GLM-MoE-DSA's "shared" layers have none
            hooks.append(layer.self_attn.indexer.register_forward_hook(hook, with_kwargs=True))
    return seen, hooks


def _hf_index_scores(indexer, hidden_states, q_resid, cos, sin, mask, interleaved=False):
    """DeepseekV32Indexer.forward's scores in float64 (its own lines, without the float32 casts), from its own
    weights and its own apply_rotary_pos_emb (GlmMoeDsaIndexer's: apply_rotary_pos_emb_interleave): the reference
    the minipos indexer is compared with."""
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as hf
    B, S, _ = hidden_states.shape
    R, D, H = indexer.qk_rope_head_dim, indexer.head_dim, indexer.n_heads
    q = indexer.wq_b(q_resid).view(B, S, H, D)
    k = indexer.k_norm(indexer.wk(hidden_states)).unsqueeze(2)
    rotate = hf.apply_rotary_pos_emb_interleave if interleaved else hf.apply_rotary_pos_emb
    q_rot, k_rot = rotate(q[..., :R], k[..., :R], cos, sin, unsqueeze_dim=2)
    q, k = torch.cat([q_rot, q[..., R:]], -1), torch.cat([k_rot, k[..., R:]], -1).squeeze(2)
    scores = torch.relu(torch.matmul(q.transpose(1, 2), k.transpose(-1, -2).unsqueeze(1)) * D ** -0.5)  # (B, H, S, T)
    weights = indexer.weights_proj(hidden_states) * H ** -0.5                                        # (B, S, H)
    scores = torch.einsum("bsh,bhst->bst", weights, scores)
    return (scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask).numpy()


def test_deepseek_v32_mla_and_its_indexer():
    # index_topk 5 < T = 12: the indexer's scores are compared with HF's, its picks too (up to ties), and the
    # main attention, given the picks as its mask ((B, T, S), True = may attend), with HF's attention module.
    cfg = _cfg(transformers.DeepseekV32Config, **MLA_SMALL, q_lora_rank=16, index_n_heads=3, index_head_dim=8,
               index_topk=5, rope_parameters=dict(MLA_YARN))
    _check_indexed_model(transformers.DeepseekV32Model, cfg, "half")


def test_glm_moe_dsa_interleaved_indexer_and_shared_picks():
    # GLM-5: the indexer rotates interleaved; index_topk_freq 2 makes layer 2 "shared": it runs no indexer and
    # attends to layer 1's picks.
    cfg = _cfg(transformers.GlmMoeDsaConfig, **{**MLA_SMALL, "num_hidden_layers": 3}, q_lora_rank=16,
               index_n_heads=3, index_head_dim=8, index_topk=5, index_topk_freq=2, rope_parameters=dict(MLA_YARN))
    assert cfg.indexer_types == ["full", "full", "shared"]
    specs = _check_indexed_model(transformers.GlmMoeDsaModel, cfg, "interleaved")
    assert [s.indexer["shared_from"] for s in specs] == [None, None, 1]
    assert {s.layer_type for s in specs} == {"indexed_attention"}


def _check_indexed_model(model_class, cfg, layout):
    """Each layer's indexer scores and picks, and its MLA over the picks, against HF's ``model_class``."""
    from minipos import dsa
    model, _ = _run_model(model_class, cfg, attn="eager")
    read = mconfig.read(cfg)
    ix = read.specs[0].indexer
    assert ix["topk"] == 5 and ix["attention_factor"] != 1.0 and ix["layout"] == layout   # mscale != mscale_all_dim
    seen, hooks = _capture(model, model.layers)                                  # again, the indexer watched too
    isee, more = _indexer_capture(model)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((B, T, cfg.hidden_size)))
    with torch.no_grad():
        model(inputs_embeds=x, use_cache=False)
    for h in hooks + more:
        h.remove()
    causal = np.tril(np.ones((T, T), bool))
    rope = dict(rope_dim=ix["rope_dim"], inv_freq=ix["inv_freq"], attention_factor=ix["attention_factor"],
                layout=layout)
    for i, ref_layer in enumerate(model.layers):
        source = read.specs[i].indexer["shared_from"]
        if source is None:
            (hidden, q_resid, (cos, sin), mask, *_), hf_topk = isee[i]
            ref = ref_layer.self_attn.indexer
            with torch.no_grad():
                want = _hf_index_scores(ref, hidden, q_resid, cos, sin, mask, interleaved=layout == "interleaved")
                q = ref.wq_b(q_resid).view(B, T, 3, 8).numpy()                          # (B, S, H, D), not rotated
                k = ref.k_norm(ref.wk(hidden)).numpy()                                  # (B, T, D): the norm is HF's
                w = ref.weights_proj(hidden).numpy() * 3 ** -0.5
            q_rot = dsa.indexer_rope(q.transpose(0, 2, 1, 3), np.arange(T), **rope).transpose(0, 2, 1, 3)
            k_rot = dsa.indexer_rope(k, np.arange(T), **rope)
            got = dsa.index_scores(q_rot, k_rot, w, mask=causal)
            allowed = want > -1e300                               # HF's additive mask: the dtype's min, not -inf
            assert np.array_equal(allowed, np.isfinite(got))
            np.testing.assert_allclose(got[allowed], want[allowed], rtol=0, atol=ATOL, err_msg=f"layer {i}")
            # HF's top-k picks keys of the same scores as minipos' (ties aside); rows 4 on have 5 keys to pick from.
            hf_topk = hf_topk.astype(np.int64)
            mine = dsa.index_topk(got, ix["topk"])
            np.testing.assert_allclose(np.sort(np.take_along_axis(got, hf_topk, -1)[:, 4:], -1),
                                       np.sort(np.take_along_axis(got, mine, -1)[:, 4:], -1), rtol=0, atol=ATOL)
        else:
            assert ref_layer.self_attn.indexer is None and i not in isee
            hf_topk = isee[source][1].astype(np.int64)                   # the source layer's picks
        # The main attention: MLA over the keys the indexer picked (and the causal mask allows).
        picked = np.zeros((B, T, T), bool)
        np.put_along_axis(picked, hf_topk, True, -1)
        layer = read.layers[i]
        _copy(ref_layer.self_attn, layer)
        x_in, want_out = seen[i]
        got_out = layer(x_in, positions=np.arange(T), mask=picked, causal=True)
        np.testing.assert_allclose(got_out, want_out, rtol=0, atol=ATOL, err_msg=f"layer {i}")
        assert np.max(np.abs(layer(x_in, positions=np.arange(T), causal=True) - want_out)) > 1e-3   # the picks matter
    return read.specs


def _vision_run(attn, x, **kwargs):
    """An HF vision attention module in float64, its weights drawn away from init, on ``x``: its output."""
    attn.double().eval()
    _randomize(attn)
    with torch.no_grad():
        return attn(torch.from_numpy(x), **kwargs)[0].numpy()


def test_pixtral_vision_attention_2d_rope():
    # A 3 x 4 patch grid (T = 12) of one image; PixtralVisionRotaryEmbedding takes the (row, column) of each patch, as
    # PixtralVisionModel.forward builds them (meshgrid "ij").
    from transformers.models.pixtral import modeling_pixtral as hf
    from minipos.axial import axial_positions
    cfg = _cfg(transformers.PixtralVisionConfig, hidden_size=32, num_attention_heads=4, num_hidden_layers=2,
               intermediate_size=16, image_size=64, patch_size=16, rope_parameters={"rope_type": "axial",
                                                                                    "rope_theta": 100.0})
    cfg._attn_implementation = "eager"
    positions = axial_positions(3, 4)                                               # (2, T): rows, then columns
    torch.manual_seed(0)
    attn, rotary = hf.PixtralAttention(cfg), hf.PixtralVisionRotaryEmbedding(cfg)
    x = np.random.default_rng(1).standard_normal((B, T, 32))
    cos, sin = rotary(torch.from_numpy(x), torch.from_numpy(positions.T.copy()))
    want = _vision_run(attn, x, position_embeddings=(cos.double(), sin.double()))
    model = mconfig.read(cfg)                                                       # a vision config read alone
    assert model.kind == "vision encoder" and len(model.layers) == 2
    layer = model.layers[0]
    _copy(attn, layer)
    np.testing.assert_allclose(layer(x, positions=positions, causal=False), want, rtol=0, atol=ATOL)
    assert np.max(np.abs(layer(x, positions=positions[::-1], causal=False) - want)) > 1e-3   # rows and columns differ


def test_pixtral_vision_of_a_mistral3_config():
    text = _cfg(transformers.MistralConfig, **SMALL, num_hidden_layers=1, head_dim=8)
    vision = _cfg(transformers.PixtralVisionConfig, hidden_size=32, num_attention_heads=4, num_hidden_layers=3,
                  intermediate_size=16, image_size=64, patch_size=16)
    cfg = _cfg(transformers.Mistral3Config, text_config=text, vision_config=vision)
    model = mconfig.read(cfg)
    assert model.model_type == "mistral" and len(model.vision.layers) == 3
    assert model.vision.layers[0].scheme.base == 10000.0 and not model.vision.specs[0].causal


def test_llama4_vision_attention_2d_rope_with_its_class_token():
    # Llama4VisionRotaryEmbedding's grid is the whole image (image_size / patch_size = 3: 9 patches) and the class
    # token, last; positions count from 1 and the class token is not rotated.
    from transformers.models.llama4 import modeling_llama4 as hf
    from minipos.axial import axial_positions
    cfg = _cfg(transformers.Llama4VisionConfig, hidden_size=32, num_attention_heads=4, num_hidden_layers=1,
               intermediate_size=16, image_size=42, patch_size=14, rope_parameters={"rope_type": "default",
                                                                                    "rope_theta": 100.0})
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    attn, rotary = hf.Llama4VisionAttention(cfg), hf.Llama4VisionRotaryEmbedding(cfg)
    x = np.random.default_rng(2).standard_normal((B, 10, 32))
    want = _vision_run(attn, x, freqs_ci=rotary(torch.from_numpy(x)))
    layer = mconfig.read(cfg).layers[0]
    _copy(attn, layer)
    positions = axial_positions(3, 3, start=1, class_token=True)                    # (2, 10)
    # HF rotates q and k in float32 (vision_apply_rotary_emb's .float()): agreement to float32 rounding.
    np.testing.assert_allclose(layer(x, positions=positions, causal=False), want, rtol=0, atol=ATOL)
    moved = positions.copy()
    moved[:, -1] = 1                                                                # the class token rotated as (1, 1)
    assert np.max(np.abs(layer(x, positions=moved, causal=False) - want)) > 1e-3


@pytest.mark.parametrize("interleave, q_lora_rank", [(True, 16), (False, None), (True, None), (False, 16)])
def test_mistral4_mla_with_its_query_scale(interleave, q_lora_rank):
    # Mistral4Attention: DeepSeek-V3's MLA, then the whole query times 1 + beta ln(1 + floor(p / L)); with L = 4 and
    # T = 12, floor(p / 4) takes 0, 1, 2, so three scales bite. Its config class writes partial_rotary_factor
    # = 4 / (4 + 4) into rope_parameters (HF's RoPE then rotates int(8 * 0.5) = 4 features: qk_rope_head_dim).
    cfg = _cfg(transformers.Mistral4Config, **{**MLA_SMALL, "q_lora_rank": q_lora_rank}, pad_token_id=0,
               rope_interleave=interleave, max_position_embeddings=64, rope_parameters={**MLA_YARN, "llama_4_scaling_beta": 0.5,
                                                            "max_position_embeddings": 64})
    model, seen = _run_model(transformers.Mistral4Model, cfg)
    _compare(cfg, model, seen)
    _query_scale_matters(cfg, model, seen)


def test_mistral4_default_rope_parameters():
    # Mistral4Config's own: yarn, factor 128 from 8192, beta 0.1; positions 8186 ... 8197 step floor(p / 8192) from
    # 0 to 1 (HF's float32 angles near 8192 err by about 1e-5 in the output: tolerance 1e-4, and the scale itself
    # moves the output by more than 1e-2).
    cfg = _cfg(transformers.Mistral4Config, **MLA_SMALL, pad_token_id=0)
    positions = 8186 + np.arange(T)
    pos = torch.from_numpy(np.broadcast_to(positions, (B, T)).copy())
    model, seen = _run_model(transformers.Mistral4Model, cfg, position_ids=pos)
    assert mconfig.read(cfg).layers[0].scheme.original_max_position_embeddings == 8192
    for i in range(2):
        layer = mconfig.read(cfg).layers[i]
        _copy(model.layers[i].self_attn, layer)
        x, want = seen[i]
        np.testing.assert_allclose(layer(x, positions=positions, causal=True), want, rtol=0, atol=1e-4)
        layer.scheme.beta = 0.0
        assert np.max(np.abs(layer(x, positions=positions, causal=True) - want)) > 1e-2
