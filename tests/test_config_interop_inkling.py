"""``minipos.config.read`` on Inkling 2's decoder against transformers 5.24 (``Inkling2TextModel``): a tiny model with
sliding and full layers of their own sizes, random weights in float64, run by the model itself (its masks, its
relative distances, its ``position_ids``, its padding's ``conv_mask``). Forward hooks capture each attention module's
inputs and output; the weights are copied into the layer ``read`` builds (the mapping in ``InklingAttention``'s
docstring), which runs on the captured input: it must match within atol 1e-6. Skipped when torch or transformers is
missing.

A full layer after the first gets three inputs, the query's, the keys' and the values' own mixes of the residual
stream; the test draws the mixes' queries and norms away from their init, so that the three differ, and passes them
as ``x``, ``x_k`` and ``x_v``.

transformers computes the clips with their scales, the log scale, the convolutions, the values' norm, the softmax with
its sinks and the gate in float32 (``.float()`` casts the float64 model's tensors down); the two agree to float32
accuracy (about 4e-7 here), inside 1e-6 at these sizes."""

import json
import subprocess
import sys
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_config_interop import _w  # noqa: E402

from minipos import config as mconfig  # noqa: E402
from minipos.inkling import InklingAttention  # noqa: E402

B, T, ATOL = 2, 13, 1e-6
SIZES = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, swa_num_attention_heads=6,
             swa_num_key_value_heads=3, swa_head_dim=6, sliding_window_size=5, d_rel=3, rel_extent=7,
             log_scaling_n_floor=6, log_scaling_alpha=0.3, qk_l2_clip_threshold=1.5, rel_l2_clip_threshold=0.7,
             conv_kernel_size=3, num_hidden_layers=4, layer_types=["hybrid_sliding", "hybrid", "hybrid_sliding", "hybrid"],
             n_layers_per_attn_res_block=2, vocab_size=8, n_routed_experts=4, num_experts_per_tok=2,
             moe_intermediate_size=8, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _config(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.Inkling2TextConfig(**{**SIZES, **kw})


def _np(t):
    return t.detach().numpy().copy()


def _copy(ref, layer: InklingAttention):
    """Inkling2SlidingAttention / Inkling2FullAttention -> InklingAttention (its docstring's table)."""
    layer.wq, layer.q_scale = _w(ref.q_proj.linear), _np(ref.q_proj.norm.scale)
    for name, proj in (("k", ref.k_proj), ("v", ref.v_proj)):
        setattr(layer, "w" + name, _w(proj.linear))
        if layer.dynamic_conv:
            setattr(layer, name + "_conv", _np(proj.sconv.static_weight))
            setattr(layer, name + "_conv_w", _w(proj.sconv.weight_proj))
        else:
            setattr(layer, name + "_conv", _np(proj.sconv.conv1d.weight)[:, 0, ::-1].T.copy())
    rp = ref.relative_position_bias
    layer.rel_w, layer.rel_scale, layer.rel_proj = _w(rp.linear), _np(rp.norm.scale), _np(rp.proj)
    layer.w_sink, layer.wg, layer.wo = _w(ref.sink_proj), _w(ref.o_proj.gate_proj), _w(ref.o_proj.linear)


def _run(cfg, attention_mask=None, seed=0):
    """The model in float64 (the MoE replaced by zeros: not compared), every attention weight drawn away from its
    init; ``(model, {i: (inputs, output)})``."""
    torch.manual_seed(seed)
    cfg._attn_implementation = "eager"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.Inkling2TextModel(cfg).double().eval()
    seen, hooks = {}, []
    for i, layer in enumerate(model.layers):
        layer.mlp.forward = lambda h, *a, **k: torch.zeros_like(h)
        with torch.no_grad():
            for p in layer.self_attn.parameters():
                p.normal_(0.0, 0.5)
            if getattr(layer, "q_input_layernorm", None) is not None and layer.attention_input is not None:
                # a full layer after the first: three different mixes, three norms
                layer.attention_input.query.normal_(0.0, 1.0)
                for norm in (layer.q_input_layernorm, layer.k_input_layernorm, layer.v_input_layernorm):
                    norm.weight.uniform_(0.5, 1.5)

        def hook(module, args, kwargs, out, i=i):
            seen[i] = ({k: _np(v) for k, v in kwargs.items() if k.endswith("hidden_states") and v is not None},
                       _np(out[0]))
        hooks.append(layer.self_attn.register_forward_hook(hook, with_kwargs=True))
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((B, T, cfg.hidden_size)))
    with torch.no_grad():
        model(inputs_embeds=x, attention_mask=attention_mask, use_cache=False)
    for h in hooks:
        h.remove()
    return model, seen


def _check(cfg, mask=None):
    model, seen = _run(cfg, None if mask is None else torch.from_numpy(mask.astype(np.int64)))
    read = mconfig.read(cfg)
    kinds = set()
    for i, (inputs, out) in seen.items():
        x, x_k, x_v = (inputs.get(k) for k in ("hidden_states", "key_hidden_states", "value_hidden_states"))
        if x_k is not None:                                                  # a full layer after the first
            assert np.abs(x_k - x).max() > 0.1 and np.abs(x_v - x).max() > 0.1, "the test wants three inputs"
        layer = read.layers[i]
        _copy(model.layers[i].self_attn, layer)
        got = layer(x, x_k=x_k, x_v=x_v, positions=np.arange(T), causal=True, mask=mask)
        np.testing.assert_allclose(got, out, atol=ATOL, rtol=0, err_msg=f"layer {i}")
        kinds.add(read.specs[i].layer_type)
    assert kinds == {"hybrid", "hybrid_sliding"}
    return read


def test_every_layer_type_matches_the_model():
    read = _check(_config())                  # positions past n_floor 6: the log scale bites on the full layers
    assert read.layers[1].log_scaling == (0.3, 6) and read.layers[0].sliding_window == 5


def test_left_padding_matches_the_model():
    """A (B, S) padding mask: the model's masks and its conv_mask (the padded tokens' inputs to the convolutions
    zeroed)."""
    mask = np.ones((B, T), bool)
    mask[1, :4] = False
    _check(_config(), mask)


def test_the_config_class_defaults_and_the_vision_tower():
    """The released layout (every sixth layer full) from the config class's defaults; the whole model's config gives
    the decoder and the tower."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = transformers.Inkling2Config().to_dict()
    read = mconfig.read(whole)
    assert [s.layer_type for s in read.specs[:6]] == ["hybrid_sliding"] * 5 + ["hybrid"]
    assert read.vision is not None and len(read.layers) == 48
    full, sliding = read.layers[5], read.layers[0]
    assert (full.num_heads, full.num_kv_heads, full.head_dim, full.rel_extent, full.dynamic_conv) == (48, 8, 128, 1024,
                                                                                                      True)
    assert (sliding.sliding_window, sliding.rel_extent, sliding.log_scaling) == (1024, 1024, None)


def test_cli_and_golden_vectors(tmp_path):
    cfg = tmp_path / "config.json"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg.write_text(json.dumps(_config().to_dict()))
    shown = subprocess.run([sys.executable, "-m", "minipos", "config", str(cfg)], capture_output=True, text=True)
    assert shown.returncode == 0 and "hybrid_sliding" in shown.stdout and "relative" in shown.stdout
    out = tmp_path / "vectors"
    for args in (["export", "--config", str(cfg), str(out)], ["check", str(out)]):
        done = subprocess.run([sys.executable, "-m", "minipos", "vectors", *args], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
