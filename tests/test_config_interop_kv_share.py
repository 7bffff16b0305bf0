"""Layers that read keys and values another pass stored, against transformers 5.24: Gemma 3n's text decoder and Gemma
4's with ``num_kv_shared_layers`` (``minipos.kv_share``), and DiffusionGemma's canvas over its encoder's cache. As
in test_config_interop.py: transformers builds the model (random weights drawn away from init, float64), a forward
hook captures each attention module's input and output inside the model (so its masks, position embeddings and
shared keys are the model's own), the weights are copied into the layers ``read`` builds, and each output must agree
within atol 1e-6. A shared layer runs on the cache its source layer filled on the same tokens. HF's RMSNorms
(float32 inside) are replaced by their float64 formula. Skipped when torch or transformers is missing."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_config_interop import ATOL, B, SMALL, T, _cfg, _copy, _float64_norm, _randomize, _w  # noqa: E402

from minipos import config as mconfig  # noqa: E402
from minipos.kv_share import SharedKVAttention  # noqa: E402


def _run(model_cls, cfg, *, input_ids=False):
    """The model on random inputs, every attention module's (input, output) captured; ``(model, seen)``."""
    torch.manual_seed(0)
    cfg._attn_implementation = "sdpa"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = model_cls(cfg).double().eval()
    seen, hooks = {}, []
    for i, layer in enumerate(model.layers):
        attn = layer.self_attn
        _randomize(attn)
        for name in ("q_norm", "k_norm", "v_norm"):
            if getattr(attn, name, None) is not None:
                _float64_norm(getattr(attn, name))

        def hook(module, args, kwargs, out, i=i):
            seen[i] = (kwargs["hidden_states"].numpy().copy(), out[0].numpy().copy())
        hooks.append(attn.register_forward_hook(hook, with_kwargs=True))
    rng = np.random.default_rng(1)
    with torch.no_grad():
        if input_ids:                                                    # Gemma 3n's per-layer inputs need the ids
            model(input_ids=torch.from_numpy(rng.integers(0, cfg.vocab_size, (B, T))), use_cache=False)
        else:
            # output_hidden_states: Gemma 4 then runs its shared layers on every token (else on the last ones only)
            model(inputs_embeds=torch.from_numpy(rng.standard_normal((B, T, cfg.hidden_size))), use_cache=False,
                  output_hidden_states=True)
    for h in hooks:
        h.remove()
    return model, seen


def _copy_shared(ref, layer):
    """A reuse layer of HF (q_proj, q_norm, o_proj only) -> ``SharedKVAttention``."""
    layer.wq, layer.wo = _w(ref.q_proj), _w(ref.o_proj)
    layer.q_norm = ref.q_norm.weight.detach().numpy().copy()
    assert not hasattr(ref, "k_proj") and layer.wk is None and layer.k_norm is None


def _compare(cfg, model, seen):
    """Every layer in order, each source with a cache that its shared layers then read; the shared layers' indices."""
    m = mconfig.read(cfg)
    caches, shared = {}, []
    p = np.arange(T)
    for i, spec in enumerate(m.specs):
        x, want = seen[i]
        layer = m.layers[i]
        if isinstance(layer, SharedKVAttention):
            _copy_shared(model.layers[i].self_attn, layer)
            got = layer(x, positions=p, causal=True, cache=caches[layer.kv_source])
            shared.append(i)
        else:
            _copy(model.layers[i].self_attn, layer)
            caches[i] = layer.new_cache()
            got = layer(x, positions=p, causal=True, cache=caches[i])
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"layer {i}")
        assert np.max(np.abs(want)) > 0.1
    return m, shared


def test_gemma3n_shared_layers_attend_with_their_sources_keys():
    # 10 layers, full every fifth (4, 9); the last 4 (6-9) share: 6, 7, 8 take layer 5's (the last sliding layer
    # before them), 9 layer 4's. Sliding window 4 at T = 12: the shared sliding layers keep the window.
    cfg = _cfg(transformers.Gemma3nTextConfig, **{**SMALL, "num_key_value_heads": 2}, num_hidden_layers=10,
               head_dim=8, sliding_window=4, num_kv_shared_layers=4, hidden_size_per_layer_input=4,
               laurel_rank=2, altup_num_inputs=2, vocab_size_per_layer_input=8,
               rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                "full_attention": {"rope_type": "default", "rope_theta": 10000.0}})
    model, seen = _run(transformers.Gemma3nTextModel, cfg, input_ids=True)
    m, shared = _compare(cfg, model, seen)
    assert shared == [6, 7, 8, 9]
    assert [m.layers[i].kv_source for i in shared] == [5, 5, 5, 4]
    assert "layer 5's" in m.specs[7].position and m.layers[7].sliding_window == 4
    # the keys of another source (layer 2, an earlier sliding layer) give another output: the sharing is compared
    x, want = seen[7]
    other = m.layers[2].new_cache()
    m.layers[2](seen[2][0], positions=np.arange(T), causal=True, cache=other)
    assert np.max(np.abs(m.layers[7](x, positions=np.arange(T), causal=True, cache=other) - want)) > 1e-3


def test_gemma4_num_kv_shared_layers():
    # Gemma 4 E2B / E4B: the same sharing over Gemma 4's layers (full layers with their own head dim).
    cfg = _cfg(transformers.Gemma4TextConfig, **SMALL, num_hidden_layers=8, head_dim=8, sliding_window=4,
               global_head_dim=16, hidden_size_per_layer_input=0, num_kv_shared_layers=3,
               layer_types=["sliding_attention", "full_attention", "sliding_attention", "sliding_attention",
                            "full_attention", "sliding_attention", "sliding_attention", "full_attention"],
               rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                                   "rope_theta": 10000.0}})

    def build(c):
        model = transformers.Gemma4TextModel(c)
        for layer in model.layers:
            if getattr(layer.self_attn, "v_norm", None) is not None:
                _float64_norm(layer.self_attn.v_norm)
        return model
    model, seen = _run(build, cfg)
    m, shared = _compare(cfg, model, seen)
    assert shared == [5, 6, 7] and [m.layers[i].kv_source for i in shared] == [3, 3, 4]
    assert m.layers[7].head_dim == 16


def test_diffusion_gemma_encoder_pass_and_canvas_pass():
    # DiffusionGemmaModel: the encoder runs the prompt (9 tokens) causally, window 4 on the sliding layers, into a
    # DynamicCache whose sliding layers keep the last 3 keys; the decoder (the same weights) runs a 5-token canvas at
    # positions 9-13 both ways over that cache and its own keys. Each read layer reproduces both passes: the encoder's
    # with a cache of mem_len 3 and the window mask, the canvas's on a copy of that cache.
    import copy

    from transformers.models.diffusion_gemma import modeling_diffusion_gemma as hf

    from minipos.masks import sliding_window_mask

    text = {**SMALL, "vocab_size": 16, "head_dim": 8, "num_hidden_layers": 4, "sliding_window": 4,
            "global_head_dim": 16, "num_global_key_value_heads": 1, "num_experts": 2, "top_k_experts": 1,
            "moe_intermediate_size": 8, "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
            "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                                "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.5,
                                                   "rope_theta": 10000.0}}}
    vision = {"hidden_size": 16, "num_attention_heads": 2, "num_key_value_heads": 2, "num_hidden_layers": 1,
              "intermediate_size": 8, "head_dim": 8}
    cfg = _cfg(transformers.DiffusionGemmaConfig, text_config=text, vision_config=vision, canvas_length=5)
    cfg._attn_implementation = cfg.text_config._attn_implementation = "sdpa"
    experts = hf.DiffusionGemmaTextExperts.forward
    hf.DiffusionGemmaTextExperts.forward = lambda self, h, *a, **k: torch.zeros_like(h)   # float64: not compared
    try:
        torch.manual_seed(0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = hf.DiffusionGemmaModel(cfg).double().eval()
        encoder, decoder = model.encoder.language_model.layers, model.decoder.layers
        seen, hooks = {}, []
        for i, (enc, dec) in enumerate(zip(encoder, decoder)):
            _randomize(dec.self_attn)
            assert enc.self_attn.q_proj.weight is dec.self_attn.q_proj.weight            # tied: one layer, two passes
            for name in ("q_norm", "k_norm", "v_norm"):
                _float64_norm(getattr(enc.self_attn, name))
                _float64_norm(getattr(dec.self_attn, name))
            for tag, attn in (("encoder", enc.self_attn), ("canvas", dec.self_attn)):
                def hook(module, args, kwargs, out, key=(tag, i)):
                    seen[key] = (kwargs["hidden_states"].numpy().copy(), out[0].numpy().copy())
                hooks.append(attn.register_forward_hook(hook, with_kwargs=True))
        rng = np.random.default_rng(2)
        with torch.no_grad():
            model(input_ids=torch.from_numpy(rng.integers(3, 16, (B, 9))),
                  decoder_input_ids=torch.from_numpy(rng.integers(3, 16, (B, 5))))
    finally:
        hf.DiffusionGemmaTextExperts.forward = experts
    for h in hooks:
        h.remove()
    m = mconfig.read(cfg)
    p = np.arange(9)
    for i, spec in enumerate(m.specs):
        layer, ref = m.layers[i], decoder[i].self_attn
        layer.wq, layer.wk, layer.wo = _w(ref.q_proj), _w(ref.k_proj), _w(ref.o_proj)
        layer.wv = layer.wk if ref.v_proj is None else _w(ref.v_proj)               # full layers: values = keys
        layer.q_norm, layer.k_norm = (getattr(ref, n).weight.detach().numpy().copy() for n in ("q_norm", "k_norm"))
        sliding = spec.layer_type == "sliding_attention"
        assert (ref.v_proj is None) == (not sliding) and not spec.causal
        cache = layer.new_cache(mem_len=3 if sliding else None)
        mask = np.broadcast_to(sliding_window_mask(p, p, 4), (B, 9, 9)) if sliding else None
        (x, want), (xc, want_c) = seen[("encoder", i)], seen[("canvas", i)]
        np.testing.assert_allclose(layer(x, positions=p, causal=True, mask=mask, cache=cache), want, rtol=0, atol=ATOL)
        got = layer(xc, causal=False, cache=copy.deepcopy(cache))                    # positions 9-13: cache.seen on
        np.testing.assert_allclose(got, want_c, rtol=0, atol=ATOL, err_msg=f"canvas, layer {i}")
        assert cache.length == (3 if sliding else 9) and np.max(np.abs(want_c)) > 0.1
        if sliding:                                       # the whole prompt instead of HF's rolling 3 keys: differs
            whole = layer.new_cache()
            layer(x, positions=p, causal=True, mask=mask, cache=whole)
            assert np.max(np.abs(layer(xc, causal=False, cache=whole) - want_c)) > 1e-3
