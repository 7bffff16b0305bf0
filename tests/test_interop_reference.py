"""minipos against the reference implementations: the one index of every interop check.

Each scheme's module tests already compare with the reference where it exists; they are listed
here, not repeated. This file adds what they do not cover: the committed golden vectors
(``spec/vectors``) against the references case by case, so the spec a port tests itself
against is the behaviour of the models, and HF's rotary embedding *module* (its cos/sin,
attention factor and length-dependent updates) with every scaling kind.

Checks that live elsewhere (reference: transformers 5.24.0 / torch 2.13.0 unless stated):

=========================  ===============================================================================
scheme                     test
=========================  ===============================================================================
sinusoidal tables          test_sinusoidal.py::test_live_transformers_tables (XLM, Marian, Speech2Text)
ALiBi slopes (BLOOM)       test_alibi.py::test_slopes_live_bloom (1 ... 40 heads)
ALiBi key-only (BLOOM)     test_alibi.py::test_key_only_matches_bloom_with_left_padding
T5 buckets                 test_t5.py::test_every_distance_within_a_million_matches_transformers
T5 bias                    test_t5.py::test_t5_bias_matches_transformers_compute_bias
T5 attention layer         test_layer_interop.py::test_t5_attention_matches_transformers
Transformer-XL shift       test_transformer_xl.py::test_rel_shift_matches_live_reference (the reference
                           code re-typed: transformers 5 no longer ships TransfoXL)
Transformer-XL scores      test_transformer_xl.py::test_xl_scores_matches_live_reference_with_memory
DeBERTa-v2 relative pos.   test_deberta.py::test_matches_transformers_disentangled_self_attention
  and disentangled scores    (``build_relative_position`` at small bucket configs, then the weights)
DeBERTa-v2 layer           test_layer_interop.py::test_deberta_v2_attention_matches_transformers
RoPE, printed values       test_rope.py::test_matches_hf_llama_half_layout, ..._gpt_neox_partial_rotary,
                           ..._gptj_interleaved, ..._llama_large_base_long_positions
RoPE weight permutation    test_rope.py::test_interleaved_to_half_matches_hf_permute
RoPE precision             test_rope_precision.py::test_angle_error_matches_torch
RoPE scaling functions     test_rope_scaling.py::test_{linear, dynamic_and_ntk, yarn, llama3,
                           longrope}_matches_transformers (``ROPE_INIT_FUNCTIONS``)
LLaMA attention layer      test_layer_interop.py::test_llama_attention_matches_transformers
                           (default, linear, yarn, llama3)
xPos                       test_xpos.py::test_matches_torchscale_* (torchscale's XPOS re-typed)
=========================  ===============================================================================
"""

import json
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import LlamaConfig  # noqa: E402  (imported once: transformers is slow to import)
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402
from transformers.models.bloom.modeling_bloom import build_alibi_tensor  # noqa: E402
from transformers.models.deberta_v2 import modeling_deberta_v2 as hf_deberta  # noqa: E402
from transformers.models.gptj import modeling_gptj as hf_gptj  # noqa: E402
from transformers.models.llama import modeling_llama as hf_llama  # noqa: E402
from transformers.models.t5.modeling_t5 import T5Attention  # noqa: E402

from minipos import rope, rope_scaling, vectors  # noqa: E402

VECTORS = pathlib.Path(__file__).resolve().parents[1] / "spec" / "vectors"


def _cases(family):
    doc = json.loads((VECTORS / f"{family}.json").read_text())
    for case in doc["cases"]:
        inputs = {k: vectors.decode(v) for k, v in case["inputs"].items()}
        expected = {k: vectors.decode(v) for k, v in case["expected"].items()}
        yield case["name"], inputs, case["params"], expected, case["tolerance"]["float32"]


def _ids(family):
    return [name for name, *_ in _cases(family)]


# --- the golden vectors against the references --------------------------------------------------

@pytest.mark.parametrize("case", list(_cases("t5_bucket")), ids=_ids("t5_bucket"))
def test_t5_bucket_vectors_are_t5s_buckets(case):
    name, inputs, params, expected, _ = case
    ref = T5Attention._relative_position_bucket(torch.from_numpy(inputs["relative_position"]),
                                                bidirectional=params["bidirectional"],
                                                num_buckets=params["num_buckets"],
                                                max_distance=params["max_distance"]).numpy()
    if params["exact"]:  # real-number buckets: they leave the float32 reference exactly at n = -206
        n = inputs["relative_position"]
        assert n[ref != expected["bucket"]].tolist() == [-206]
    else:
        np.testing.assert_array_equal(expected["bucket"], ref)


@pytest.mark.parametrize("case", list(_cases("alibi_slopes")), ids=_ids("alibi_slopes"))
def test_alibi_slope_vectors_are_blooms(case):
    _, _, params, expected, _ = case
    alibi = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), params["num_heads"], torch.float32)
    np.testing.assert_allclose(expected["slopes"], alibi[:, 0, 1].double().numpy(), rtol=1e-6)  # BLOOM: float32


@pytest.mark.parametrize("case", list(_cases("deberta_log_bucket")), ids=_ids("deberta_log_bucket"))
def test_deberta_log_bucket_vectors_are_transformers(case):
    _, inputs, params, expected, _ = case
    ref = hf_deberta.make_log_bucket_position(torch.from_numpy(inputs["relative_pos"]), params["bucket_size"],
                                              params["max_position"])
    np.testing.assert_array_equal(expected["bucket"], ref.long().numpy())


@pytest.mark.parametrize("case", list(_cases("deberta_relative_position")), ids=_ids("deberta_relative_position"))
def test_deberta_relative_position_vectors_are_transformers(case):
    _, inputs, params, expected, _ = case
    q, k = inputs["q_positions"], inputs["k_positions"]
    if np.array_equal(q, np.arange(len(q))) and np.array_equal(k, np.arange(len(k))) and len(q) == len(k):
        layer = torch.zeros(1, len(q), 1)  # build_relative_position reads the sizes only (T == S)
        ref = hf_deberta.build_relative_position(layer, layer, bucket_size=params["bucket_size"],
                                                 max_position=params["max_position"])[0]
    else:  # other positions: the same two steps the reference takes, on these positions
        ref = torch.from_numpy(q[:, None] - k[None, :])
        if params["bucket_size"] > 0 and params["max_position"] > 0:
            ref = hf_deberta.make_log_bucket_position(ref, params["bucket_size"], params["max_position"])
    np.testing.assert_array_equal(expected["relative_pos"], ref.long().numpy())


def _llama_rotary(dim, base, inv_freq=None, attention_factor=1.0):
    config = LlamaConfig(hidden_size=2 * dim, num_attention_heads=2, head_dim=dim,
                         rope_parameters={"rope_type": "default", "rope_theta": base})
    module = hf_llama.LlamaRotaryEmbedding(config)
    if inv_freq is not None:
        module.inv_freq = torch.from_numpy(inv_freq).float()
        module.attention_scaling = attention_factor
    return module


def _hf_rope_half(x, positions, R, base, inv_freq, factor):
    """LLaMA's rotary embedding and ``apply_rotary_pos_emb`` on the first R features of x (..., T, D)."""
    module = _llama_rotary(R, base, inv_freq, factor)
    t = torch.from_numpy(x).reshape(-1, 1, *x.shape[-2:])                      # (N, 1, T, D)
    cos, sin = module(t, torch.from_numpy(positions)[None])                     # (1, T, R), float32 math
    rot, _ = hf_llama.apply_rotary_pos_emb(t[..., :R], t[..., :R], cos, sin)
    return torch.cat([rot, t[..., R:]], -1).reshape(x.shape).numpy()


def _hf_rope_interleaved(x, positions, R):
    """GPT-J's sin/cos table and ``apply_rotary_pos_emb`` on the first R features (base 10000)."""
    sincos = hf_gptj.create_sinusoidal_positions(int(positions.max()) + 1, R)[torch.from_numpy(positions)]
    sin, cos = torch.split(sincos[None], R // 2, dim=-1)                         # (1, T, R/2)
    t = torch.from_numpy(x).reshape(1, *x.shape[-2:])[:, :, None]                # (1, T, 1, D)
    rot = hf_gptj.apply_rotary_pos_emb(t[..., :R], sin.double(), cos.double())
    return torch.cat([rot, t[..., R:]], -1)[:, :, 0].reshape(x.shape).numpy()


@pytest.mark.parametrize("case", list(_cases("rope")), ids=_ids("rope"))
def test_rope_vectors_are_llamas_and_gptjs(case):
    name, inputs, params, expected, tol = case
    x, pos, out = inputs["x"], inputs["positions"], expected["out"]
    R = params["rotary_dim"] or x.shape[-1]
    if params["layout"] == "half":
        ref = _hf_rope_half(x, pos, R, params["base"], inputs.get("inv_freq"), params["attention_factor"])
    elif "inv_freq" in inputs or params["base"] != 10000.0:
        pytest.skip("GPT-J fixes base 10000 and its own frequencies")
    else:  # GPT-J has no row for a negative position: compare the others
        keep = pos >= 0
        ref = _hf_rope_interleaved(x[keep], pos[keep], R)
        out = out[keep]
    np.testing.assert_allclose(out, ref, rtol=tol["rtol"], atol=tol["atol"])  # the reference is float32


def _hf_config(dim, params):
    """A LLaMA config with ``rope_parameters`` from a rope_scaling vector case."""
    p = {k: v for k, v in params.items() if k not in ("kind", "dim", "base", "seq_len", "max_position_embeddings")}
    max_pos = params.get("max_position_embeddings", params.get("original_max_position_embeddings", 2048))
    if params["kind"] == "dynamic":
        max_pos = p.pop("original_max_position_embeddings")  # dynamic reads the top-level length
    config = LlamaConfig(hidden_size=2 * dim, num_attention_heads=2, head_dim=dim, max_position_embeddings=max_pos,
                         rope_parameters={"rope_type": params["kind"], "rope_theta": params["base"], **p})
    if params["kind"] == "longrope":
        config.original_max_position_embeddings = params["original_max_position_embeddings"]
    return config


@pytest.mark.parametrize("case", list(_cases("rope_scaling")), ids=_ids("rope_scaling"))
def test_rope_scaling_vectors_are_transformers(case):
    name, _, params, expected, _ = case
    if params["kind"] == "ntk":  # not an HF rope_type: HF dynamic at factor 1 and seq_len = factor * L
        config = _hf_config(params["dim"], {**params, "kind": "dynamic", "factor": 1.0,
                                            "original_max_position_embeddings": 2048})
        inv, factor = ROPE_INIT_FUNCTIONS["dynamic"](config, "cpu", seq_len=int(params["factor"] * 2048))
    else:
        kw = {"seq_len": params["seq_len"]} if "seq_len" in params else {}
        inv, factor = ROPE_INIT_FUNCTIONS[params["kind"]](_hf_config(params["dim"], params), "cpu", **kw)
    np.testing.assert_allclose(expected["inv_freq"], inv.double().numpy(), rtol=1e-6)  # HF: float32
    assert float(expected["attention_factor"]) == pytest.approx(float(factor), rel=1e-6)


# --- HF's rotary embedding module, every scaling kind, at several lengths -----------------------

SCALINGS = [
    {"rope_type": "linear", "factor": 4.0},
    {"rope_type": "dynamic", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "mscale": 1.0,
     "mscale_all_dim": 0.5},
    {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0},
    {"rope_type": "longrope", "short_factor": [1.0, 1.25, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0],
     "long_factor": [1.0, 2.0, 4.0, 8.0, 12.0, 16.0, 24.0, 32.0], "original_max_position_embeddings": 64},
]


@pytest.mark.parametrize("scaling", SCALINGS, ids=lambda s: s["rope_type"] + str(s.get("mscale", "")))
@pytest.mark.parametrize("length", [40, 64, 65, 300])
def test_llama_rotary_module_rotates_like_minipos(scaling, length):
    D, base, L = 16, 10000.0, 64
    top_level = {"max_position_embeddings": 4 * L if scaling["rope_type"] == "longrope" else L}
    config = LlamaConfig(hidden_size=2 * D, num_attention_heads=2, head_dim=D,
                         rope_parameters={**scaling, "rope_theta": base}, **top_level)
    if scaling["rope_type"] == "longrope":
        config.original_max_position_embeddings = L
    module = hf_llama.LlamaRotaryEmbedding(config)                     # fresh: no length seen before
    x = np.random.default_rng(length).standard_normal((1, 2, length, D))
    positions = np.arange(length)
    cos, sin = module(torch.from_numpy(x), torch.from_numpy(positions)[None])
    ref, _ = hf_llama.apply_rotary_pos_emb(torch.from_numpy(x), torch.from_numpy(x), cos, sin)

    kind = scaling["rope_type"]
    kw = {k: v for k, v in scaling.items() if k != "rope_type"}
    if kind == "dynamic":
        kw.update(original_max_position_embeddings=L, seq_len=length)
    if kind == "longrope":
        kw.update(max_position_embeddings=4 * L, seq_len=length)
    inv_freq, factor = rope_scaling.REGISTRY[kind](D, base=base, **kw)
    got = rope.apply_rope(x, positions, layout="half", inv_freq=inv_freq, attention_factor=factor)
    # HF multiplies angles and takes cos/sin in float32: ~1e-7 per radian of angle.
    np.testing.assert_allclose(got, ref.numpy(), rtol=0, atol=2e-7 * length + 1e-6)
