"""``minipos.config.read`` on Dots 3 Note's decoder against transformers 5.24 (``Dots3NoteTextModel``): a tiny model
with indexed layers (GLM-5's indexer) and sliding layers of their own sizes (the released checkpoint's ``swa_*``
aliases, or the canonical ``per_layer_config``), random weights in float64. Forward hooks capture each attention
module's input and output and each indexer's input and picks; the weights are copied into the layer ``read`` builds
(``k_rope_only_layernorm`` into ``k_rope_norm``, ``g_proj`` into ``wg``), which runs on the captured input with the
picks as its mask (indexed layers) or its own window (sliding layers): it must match within atol 1e-6. Skipped when
torch or transformers is missing.

transformers computes the RMSNorms in float32 and the indexed layers' cos and sin from float32 angles; the norms are
replaced by their formula in float64, the rest agrees to float32 accuracy, well inside 1e-6 at these sizes."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from test_config_interop import _capture, _float64_norm, _indexer_capture, _randomize, _w  # noqa: E402

from minipos import config as mconfig  # noqa: E402
from minipos import dsa  # noqa: E402

B, T, ATOL = 2, 12, 1e-6
SIZES = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, num_hidden_layers=6, q_lora_rank=16,
             kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, head_dim=10, index_n_heads=3,
             index_head_dim=8, index_topk=5, sliding_window=3, n_routed_experts=4, num_experts_per_tok=2,
             intermediate_size=16, moe_intermediate_size=8, vocab_size=8, pad_token_id=0, bos_token_id=1,
             eos_token_id=2)
SWA = dict(swa_num_attention_heads=2, swa_num_key_value_heads=2, swa_q_lora_rank=12, swa_kv_lora_rank=6,
           swa_head_dim=8, swa_qk_nope_head_dim=4, swa_v_head_dim=3, swa_rope_theta=300.0)


def _config(**kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return transformers.Dots3NoteTextConfig(**{**SIZES, **SWA, **kw})


def _copy(ref, layer):
    """Dots3NoteTextAttention -> the minipos MLA layer: ``W = weight.T``, the norms' weights, the gate."""
    for name, lin in {"wq_a": ref.q_a_proj, "wq_b": ref.q_b_proj, "wkv_a": ref.kv_a_proj_with_mqa,
                      "wkv_b": ref.kv_b_proj, "wo": ref.o_proj, "wg": ref.g_proj}.items():
        setattr(layer, name, _w(lin))
    for name, lin in {"bq_a": ref.q_a_proj, "bkv_a": ref.kv_a_proj_with_mqa, "bo": ref.o_proj}.items():
        assert (lin.bias is None) == (getattr(layer, name) is None), name
        if lin.bias is not None:
            setattr(layer, name, lin.bias.detach().numpy().copy())
    assert ref.g_proj.bias is None and layer.bg is None
    for name, norm in {"q_a_norm": ref.q_a_layernorm, "kv_a_norm": ref.kv_a_layernorm,
                       "k_rope_norm": ref.k_rope_only_layernorm}.items():
        setattr(layer, name, norm.weight.detach().numpy().copy())


def _run(cfg, seed=0):
    """The model in float64 (the MoE replaced by zeros: its kernels refuse float64, and it is not compared), every
    attention weight drawn away from its init; ``(model, {i: (x, out)}, {i: (indexer args, picks)})``."""
    torch.manual_seed(seed)
    cfg._attn_implementation = "eager"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = transformers.Dots3NoteTextModel(cfg).double().eval()
    for layer in model.layers:
        layer.mlp.forward = lambda h, *a, **k: torch.zeros_like(h)
        _randomize(layer.self_attn)
        for name in ("q_a_layernorm", "kv_a_layernorm", "k_rope_only_layernorm"):
            _float64_norm(getattr(layer.self_attn, name))
    seen, hooks = _capture(model, model.layers)
    picks, more = _indexer_capture(model)
    x = torch.from_numpy(np.random.default_rng(seed).standard_normal((B, T, cfg.hidden_size)))
    with torch.no_grad():
        model(inputs_embeds=x, use_cache=False)
    for h in hooks + more:
        h.remove()
    return model, seen, picks


def _check(cfg, read=None):
    """Every layer of ``read(cfg)`` (or ``read``) against the captured modules; the layer types compared."""
    model, seen, picks = _run(cfg)
    read = mconfig.read(cfg) if read is None else read
    assert len(read.layers) == len(model.layers)
    kinds = set()
    for i, ref_layer in enumerate(model.layers):
        layer, spec = read.layers[i], read.specs[i]
        _copy(ref_layer.self_attn, layer)
        x, want = seen[i]
        mask = None
        if spec.layer_type == "indexed_attention":
            (hidden, q_resid, *_), hf_topk = picks[i]
            # the indexer's query input is the query latent after q_lora_scale: the layer's own
            a = x @ layer.wq_a if layer.bq_a is None else x @ layer.wq_a + layer.bq_a
            np.testing.assert_allclose(layer._q_latent(a), q_resid.numpy(), rtol=0, atol=ATOL)
            assert spec.indexer["q_lora_scale"] == pytest.approx(layer.q_lora_scale) != 1.0
            ref = ref_layer.self_attn.indexer
            ix = spec.indexer
            with torch.no_grad():
                q = ref.wq_b(q_resid).view(B, T, ix["num_heads"], ix["head_dim"]).numpy()
                k = ref.k_norm(ref.wk(hidden)).numpy()
                w = ref.weights_proj(hidden).numpy() * ix["num_heads"] ** -0.5
            rope = dict(rope_dim=ix["rope_dim"], inv_freq=ix["inv_freq"], attention_factor=ix["attention_factor"],
                        layout=ix["layout"])
            q_rot = dsa.indexer_rope(q.transpose(0, 2, 1, 3), np.arange(T), **rope).transpose(0, 2, 1, 3)
            scores = dsa.index_scores(q_rot, dsa.indexer_rope(k, np.arange(T), **rope), w,
                                      mask=np.tril(np.ones((T, T), bool)))
            hf_topk = hf_topk.astype(np.int64)                 # the picks are HF's; the scores they pick are ours
            np.testing.assert_allclose(np.sort(np.take_along_axis(scores, hf_topk, -1)[:, 4:], -1),
                                       np.sort(np.take_along_axis(scores, dsa.index_topk(scores, ix["topk"]), -1)[:, 4:],
                                               -1), rtol=0, atol=ATOL)
            mask = np.zeros((B, T, T), bool)
            np.put_along_axis(mask, hf_topk, True, -1)
        got = layer(x, positions=np.arange(T), mask=mask, causal=True)
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"layer {i} ({spec.layer_type})")
        assert np.max(np.abs(want)) > 0.1                                # a comparison that can fail
        if mask is not None:                                             # the picks matter
            assert np.max(np.abs(layer(x, positions=np.arange(T), causal=True) - want)) > 1e-3
        elif spec.layer_type == "sliding_attention":                    # the window matters
            assert layer.sliding_window == 3
            layer.sliding_window = None
            assert np.max(np.abs(layer(x, positions=np.arange(T), causal=True) - want)) > 1e-3
        kinds.add(spec.layer_type)
    return kinds, read


def test_dots3_note_indexed_and_sliding_layers_of_their_own_sizes():
    cfg = _config()
    assert cfg.layer_types == ["indexed_attention", "indexed_attention"] + ["sliding_attention"] * 3 + \
        ["indexed_attention"]
    kinds, read = _check(cfg)
    assert kinds == {"indexed_attention", "sliding_attention"}
    sliding = read.layers[2]
    assert (sliding.num_heads, sliding.q_lora_rank, sliding.kv_lora_rank, sliding.v_head_dim) == (2, 12, 6, 3)
    assert read.layers[2].scheme.base == 300.0 and read.layers[0].scheme.base == 8e7


def test_dots3_note_read_from_its_released_json_and_from_to_dict_alike():
    # The released checkpoint's keys (swa_* aliases, sliding_window_size, use_dsa) and the canonical dict HF writes
    # (per_layer_config, nested rope_parameters) give the same layers.
    legacy = {"model_type": "dots3_note", **{k: v for k, v in SIZES.items() if k != "sliding_window"},
              "sliding_window_size": 3, **SWA, "use_dsa": True}
    a, b = mconfig.read(legacy), mconfig.read(_config().to_dict())
    assert [s.layer_type for s in a.specs] == [s.layer_type for s in b.specs]
    for sa, sb in zip(a.specs, b.specs):
        assert sa.kwargs == sb.kwargs and sa.position == sb.position
    _check(_config(), read=a)


def test_dots3_note_full_layers_without_the_indexer_and_yarn_without_the_softmax_mscale():
    # use_dsa false: the first layers are plain full attention; YaRN's mscale_all_dim multiplies cos and sin (through
    # the attention factor) but not the softmax scale, which Dots keeps at qk_head_dim ** -0.5.
    yarn = {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0, "original_max_position_embeddings": 4,
            "mscale": 1.0, "mscale_all_dim": 0.5}
    cfg = _config(use_dsa=False, rope_parameters={"full_attention": yarn, "sliding_attention": dict(yarn)})
    kinds, read = _check(cfg)
    assert kinds == {"full_attention", "sliding_attention"}
    assert read.specs[0].indexer is None and read.layers[0].attention_scale() == pytest.approx(10 ** -0.5)
