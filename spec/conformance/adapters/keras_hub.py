"""keras-hub against the golden vectors, on the backend that ``KERAS_BACKEND`` names (torch or jax).

Components and the conventions each one needs. Layers run with ``dtype="float64"`` (on jax with
``jax_enable_x64``), but ``RotaryEmbedding`` and its subclasses build the frequencies and the
angles in float32 (``ops.arange(..., dtype="float32")``, positions cast to float32) whatever
the layer's dtype: their components use the float32 tolerance.

- ``RotaryEmbedding``: the half layout (``ops.split`` into two halves); the interleaved layout by
  permuting each pair's features. ``call(positions=...)`` takes any positions, negative ones
  included. It rotates every feature it is given: partial rotary is stated as keras-hub's
  GPT-NeoX attention states it, the first ``R`` features through the layer and the rest
  concatenated back. It takes no frequencies and has no attention factor outside
  ``rope_type="yarn"``: a case with given ``inv_freq`` is rebuilt from its ``params.scaling``
  by the same layer the ``rope_scaling`` component uses for that kind (below), the layer's
  own scaling code; a scaling it has no form of is not expressible.
- Cached steps (``rope_scores``): the keys through the layer at ``start_index = 0``, the queries
  at ``start_index = S - T`` (its cached path); the scores are ``q k^T``.
- The same layer's ``rope_type`` for ``rope_scaling``: ``linear`` (``scaling_factor``), ``yarn``
  (``beta_fast``, ``beta_slow``, ``original_max_position_embeddings``, ``truncate``; the
  attention factor ``0.1 ln s + 1`` is fixed, so cases with ``mscale``, ``mscale_all_dim`` or an
  ``attention_factor`` are not expressible). The spec's static ``ntk`` is run against
  ``rope_type="dynamic"``, the only NTK-named option and one that reads no sequence length; the
  spec's ``dynamic`` (which does) is not expressible. ``llama3`` is ``LlamaRotaryEmbedding``
  (``frequency_adjustment_factor``, ``low_freq_factor``, ``high_freq_factor``,
  ``pretraining_sequence_length``); ``longrope`` is ``Phi3SuScaledRotaryEmbedding``, which picks
  the long factors when ``start_index + T > pretraining_sequence_length``: the case's
  ``seq_len`` is stated as an input of ``T = seq_len`` rows. ``(inv_freq, attention_factor)`` are
  read off the rotation at positions 0 and 1 (``_common.angles_and_factor``).
- ``SinePositionEncoding``: the interleaved layout (sine at even, cosine at odd features,
  ``w_i = base^(-2i/D)``), in the layer's dtype (float64); split by permuting columns. The
  tensor2tensor layout is not offered.
- ``AlibiBias`` (BLOOM) and ``FalconTransformerDecoder._build_alibi_tensor`` (Falcon): slopes of
  ``_get_slopes`` (Python floats). Both biases are key-only: BLOOM's ``m_h (j - S + 1)`` for keys
  ``0 ... S-1``, Falcon's ``m_h j``. The spec's causal ``-m_h (i - j)`` is that plus the row
  constant ``-m_h (i - S + 1)`` (BLOOM) or ``-m_h i`` (Falcon), which softmax ignores: the
  adapter adds that constant, and states the case only where the case's slopes are the layer's,
  its keys are ``0 ... S-1`` and the form is causal (the symmetric ``-m |i - j|`` is no key-only
  bias). Their slopes are not weights, so ``alibi_grad`` has nothing to differentiate.
  For ``alibi_bias_key_only`` (``+m_h j``): Falcon's ``_build_alibi_tensor`` of the attention mask
  whose ``(cumsum(mask) - 1) * mask`` are the key positions, as it is; ``AlibiBias``'s
  ``m_h (j - (S - 1))`` plus the per-head constant ``m_h (S - 1)``, stated as a convention
  (softmax ignores it), for keys ``0 ... S-1``.

- ``T5MultiHeadAttention`` (``keras_hub.src.models.t5``): ``_relative_position_bucket`` takes
  ``key - query`` and ``bidirectional``, as the spec; buckets from a float32 log, so
  ``exact = true`` is not expressible. ``compute_bias(L, L)`` with the table as its
  ``relative_attention_bias`` weight is the bias of positions ``0 ... L-1``, read at the case's
  rows and columns; the layer fixes 32 buckets and a maximal distance of 128, so other bias cases
  are not expressible.
- DeBERTa-v3's ``DisentangledSelfAttention`` (``keras_hub.src.models.deberta_v3``):
  ``_make_log_bucket_position`` with ``bucket_size`` and ``max_position_embeddings`` as the
  spec's ``bucket_size`` and ``max_position`` (its log in float32); ``_get_rel_pos(n)`` numbers
  ``n`` queries and ``n`` keys from 0 and always buckets, so only square, contiguous, bucketed
  cases are expressible.

Gradients are the backend's autodiff (torch autograd, ``jax.vjp``) through the same calls.
"""

from __future__ import annotations

import os
import re

import numpy as np

from ._common import (Component, angles_and_factor, cached_step, in_layout, layout_permutation, mask_of_positions,
                      require, table_layout)

BACKEND = os.environ.get("KERAS_BACKEND", "tensorflow")
LIBRARY = f"keras-hub ({BACKEND} backend)"
DISTRIBUTIONS = ["keras-hub", "keras"] + (["jax", "jaxlib"] if BACKEND == "jax" else ["torch"])

if BACKEND == "jax":   # float64 arrays need x64, set before keras touches jax
    import jax
    jax.config.update("jax_enable_x64", True)


def _np(t) -> np.ndarray:
    from keras import ops
    return np.asarray(ops.convert_to_numpy(t), dtype=np.float64)


def _tensor(a):
    from keras import ops
    return ops.convert_to_tensor(np.ascontiguousarray(a, dtype=np.float64), dtype="float64")


def _vjp(fn, x: np.ndarray, dy: np.ndarray) -> np.ndarray:
    """The gradient of ``sum(fn(x) * dy)`` by the backend's own autodiff."""
    if BACKEND == "jax":
        import jax.numpy as jnp
        _, pull = jax.vjp(fn, jnp.asarray(x, dtype=jnp.float64))
        return np.asarray(pull(jnp.asarray(dy, dtype=jnp.float64))[0])
    import torch
    t = torch.tensor(x, dtype=torch.float64, requires_grad=True)
    fn(t).backward(torch.as_tensor(dy, dtype=torch.float64))
    return t.grad.numpy()


# --- RoPE -----------------------------------------------------------------------------------------

def _rotate(x, positions, params, inv_freq):
    """The case's RoPE of a backend tensor ``(..., T, D)``, in keras-hub's half layout."""
    from keras import ops
    from keras_hub.layers import RotaryEmbedding
    *lead, T, D = x.shape
    R = params["rotary_dim"] or D
    if inv_freq is not None:   # the layer takes no frequencies: rebuilt from their source by its own rope_type
        require("scaling" in params, "RotaryEmbedding takes no frequencies, and the case names no scaling to "
                                     "rebuild them from")
        require(params["scaling"]["kind"] != "longrope", "Phi3SuScaledRotaryEmbedding takes no positions")
        layer = _scaling_layer(params["scaling"])
    else:
        require(params["attention_factor"] == 1.0, "RotaryEmbedding has no attention factor outside rope_type='yarn'")
        layer = RotaryEmbedding(max_wavelength=params["base"], dtype="float64")
    t = ops.reshape(x, (-1, T, D))                                            # (N, T, D): sequence axis 1
    out = layer(t[..., :R], positions=ops.convert_to_tensor(np.asarray(positions)))
    if R < D:   # partial rotary as keras-hub's GPT-NeoX attention does it: rotate, then concatenate
        out = ops.concatenate([out, t[..., R:]], axis=-1)
    return ops.reshape(out, x.shape)


def _rope(grad=False):
    def run(inputs, params):
        x = inputs["dy" if grad else "x"]
        R = params["rotary_dim"] or x.shape[-1]
        fn = lambda t: in_layout(lambda u: _rotate(u, inputs["positions"], params, inputs.get("inv_freq")), t,
                                 params["layout"], "half", R)
        if grad:   # a rotation is linear: its backward is the vjp at any point
            return {"dx": _vjp(fn, np.zeros_like(x), x)}
        return {"out": _np(fn(_tensor(x)))}
    return run


def rope_scores(inputs, params):
    """A cached step: keys from ``start_index = 0``, the queries from ``start_index = S - T``, then ``q k^T``."""
    from keras import ops
    from keras_hub.layers import RotaryEmbedding
    T, S = cached_step(inputs)
    q, k = inputs["q"], inputs["k"]
    D = q.shape[-1]
    R = params["rotary_dim"] or D
    p = layout_permutation(params["layout"], "half", R, D)   # the same permutation of q and k: dots unchanged
    layer = RotaryEmbedding(max_wavelength=params["base"], dtype="float64")

    def rotate(x, start):
        t = _tensor(x[..., p])
        out = layer(t[..., :R], start_index=start)
        return ops.concatenate([out, t[..., R:]], axis=-1) if R < D else out

    qr, kr = rotate(q, S - T), rotate(k, 0)
    return {"scores": _np(ops.matmul(qr, ops.transpose(kr, (0, 2, 1))))}


# --- RoPE scaling ---------------------------------------------------------------------------------

YARN_KEYS = {"kind", "base", "dim", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "truncate"}


def _scaling_layer(params):
    from keras_hub.layers import RotaryEmbedding
    from keras_hub.src.models.llama.llama_rotary_embedding import LlamaRotaryEmbedding
    from keras_hub.src.models.phi3.phi3_rotary_embedding import Phi3SuScaledRotaryEmbedding
    kind, base = params["kind"], params["base"]
    if kind == "linear":
        return RotaryEmbedding(max_wavelength=base, scaling_factor=params["factor"], rope_type="linear", dtype="float64")
    if kind == "ntk":       # the only NTK-named option; it reads no sequence length
        return RotaryEmbedding(max_wavelength=base, scaling_factor=params["factor"], rope_type="dynamic",
                               dtype="float64")
    if kind == "yarn":
        extra = sorted(set(params) - YARN_KEYS)
        require(not extra, f"rope_type='yarn' has a fixed attention factor 0.1 ln s + 1 and no {extra}")
        return RotaryEmbedding(max_wavelength=base, scaling_factor=params["factor"], rope_type="yarn",
                               beta_fast=params.get("beta_fast", 32.0), beta_slow=params.get("beta_slow", 1.0),
                               original_max_position_embeddings=params["original_max_position_embeddings"],
                               truncate=params.get("truncate", True), dtype="float64")
    if kind == "llama3":
        return LlamaRotaryEmbedding(max_wavelength=base, frequency_adjustment_factor=params["factor"],
                                    low_freq_factor=params["low_freq_factor"],
                                    high_freq_factor=params["high_freq_factor"],
                                    pretraining_sequence_length=params["original_max_position_embeddings"],
                                    dtype="float64")
    if kind == "longrope":
        require("factor" not in params and "attention_factor" not in params,
                "Phi3SuScaledRotaryEmbedding takes no explicit factor or attention_factor: it derives the "
                "attention factor from max_sequence_length / pretraining_sequence_length")
        return Phi3SuScaledRotaryEmbedding(list(params["short_factor"]), list(params["long_factor"]),
                                           max_sequence_length=params["max_position_embeddings"],
                                           pretraining_sequence_length=params["original_max_position_embeddings"],
                                           max_wavelength=base, dtype="float64")
    require(kind != "dynamic", "rope_type='dynamic' reads no sequence length (it is static): the spec's dynamic "
                               "kind, which changes with seq_len, has no form here; it is run as the static ntk")
    raise AssertionError(f"unknown scaling kind {kind!r} in the vectors")


def rope_scaling(inputs, params):
    layer, D = _scaling_layer(params), params["dim"]
    rows = int(params.get("seq_len", 2)) if params["kind"] == "longrope" else 2

    def rotate(x, positions):   # rows 0 and 1 at positions 0 and 1; longrope: T = seq_len rows picks the factors
        assert list(positions) == [0, 1]
        t = np.zeros((1, max(rows, 2), D))
        t[0, :2] = x
        return _np(layer(_tensor(t)))[0, :2]

    inv_freq, factor = angles_and_factor(rotate, D, "half")
    return {"inv_freq": inv_freq, "attention_factor": factor}


# --- sinusoidal table -----------------------------------------------------------------------------

def sinusoidal_table(inputs, params):
    from keras_hub.layers import SinePositionEncoding
    require(params["layout"] in ("interleaved", "split"), "SinePositionEncoding has no tensor2tensor layout")
    pos, D = inputs["positions"], params["dim"]
    layer = SinePositionEncoding(max_wavelength=params["base"], dtype="float64")
    table = _np(layer(_tensor(np.zeros((1, len(pos), D))), positions=_tensor(pos)))[0]
    return {"table": table_layout(table, "interleaved", params["layout"])}


# --- ALiBi ----------------------------------------------------------------------------------------

def _bloom_slopes(H):
    from keras_hub.src.layers.modeling.alibi_bias import AlibiBias
    return np.array(AlibiBias(dtype="float64")._get_slopes(H))


def _falcon_decoder(H):
    from keras_hub.src.models.falcon.falcon_transformer_decoder import FalconTransformerDecoder
    return FalconTransformerDecoder(num_attention_heads=H, intermediate_dim=4, dtype="float64")


def bloom_slopes(inputs, params):
    return {"slopes": _bloom_slopes(params["num_heads"])}


def falcon_slopes(inputs, params):
    return {"slopes": np.array(_falcon_decoder(params["num_heads"])._get_slopes(params["num_heads"]))}


def _key_only_case(inputs, params, slopes):
    q, k = inputs["q_positions"], inputs["k_positions"]
    require(not params["symmetric"], "the bias is key-only: the symmetric -m |i - j| is no key-only bias")
    require(np.array_equal(k, np.arange(len(k))), "the layer numbers the keys 0 ... S-1 from the key length")
    require(np.allclose(inputs["slopes"], slopes, rtol=1e-12, atol=0),
            "the layer computes its slopes from the head count; the case's slopes are others")
    return q, k


def bloom_bias(inputs, params):
    from keras_hub.src.layers.modeling.alibi_bias import AlibiBias
    H = len(inputs["slopes"])
    q, k = _key_only_case(inputs, params, _bloom_slopes(H))
    S = len(k)
    key_only = _np(AlibiBias(dtype="float64")(_tensor(np.zeros((1, H, len(q), S)))))[0]   # m (j - S + 1)
    return {"bias": key_only - inputs["slopes"][:, None, None] * (q - (S - 1))[None, :, None]}


def falcon_bias(inputs, params):
    H = len(inputs["slopes"])
    decoder = _falcon_decoder(H)
    q, k = _key_only_case(inputs, params, np.array(decoder._get_slopes(H)))
    key_only = _np(decoder._build_alibi_tensor(H, _tensor(np.ones((1, len(k))))))[0]      # (H, 1, S): m j
    return {"bias": key_only - inputs["slopes"][:, None, None] * q[None, :, None]}


def bloom_key_only(inputs, params):
    """AlibiBias's ``m_h (j - (S - 1))`` plus the per-head constant ``m_h (S - 1)``: ``m_h j``."""
    from keras_hub.src.layers.modeling.alibi_bias import AlibiBias
    slopes, k = inputs["slopes"], inputs["k_positions"]
    H, S = len(slopes), len(k)
    require(np.array_equal(k, np.arange(S)), "the layer numbers the keys 0 ... S-1 from the key length")
    require(np.allclose(slopes, _bloom_slopes(H), rtol=1e-12, atol=0),
            "the layer computes its slopes from the head count; the case's slopes are others")
    bias = _np(AlibiBias(dtype="float64")(_tensor(np.zeros((1, H, 1, S)))))[0]           # (H, 1, S): m (j - S + 1)
    return {"bias": bias + slopes[:, None, None] * (S - 1)}


def falcon_key_only(inputs, params):
    H = len(inputs["slopes"])
    decoder = _falcon_decoder(H)
    require(np.allclose(inputs["slopes"], decoder._get_slopes(H), rtol=1e-12, atol=0),
            "the layer computes its slopes from the head count; the case's slopes are others")
    mask = mask_of_positions(inputs["k_positions"])
    return {"bias": _np(decoder._build_alibi_tensor(H, _tensor(mask[None])))[0]}            # (H, 1, S): m j


# --- T5 -------------------------------------------------------------------------------------------

def _t5_layer(H, bidirectional):
    from keras_hub.src.models.t5.t5_multi_head_attention import T5MultiHeadAttention
    return T5MultiHeadAttention(is_decoder=not bidirectional, hidden_dim=4, key_value_dim=2, num_heads=H, dropout=0.0,
                                use_relative_attention_bias=True, dtype="float64")


def t5_bucket(inputs, params):
    from keras import ops
    from keras_hub.src.models.t5.t5_multi_head_attention import T5MultiHeadAttention
    require(not params["exact"], "buckets come from a float32 log (exact = true asks for real numbers)")
    rel = ops.convert_to_tensor(np.asarray(inputs["relative_position"], dtype=np.int64))
    bucket = T5MultiHeadAttention._relative_position_bucket(rel, bidirectional=params["bidirectional"],
                                                            num_buckets=params["num_buckets"],
                                                            max_distance=params["max_distance"])
    return {"bucket": np.asarray(ops.convert_to_numpy(bucket))}


def t5_bias(inputs, params):
    table, q, k = inputs["table"], inputs["q_positions"], inputs["k_positions"]
    layer = _t5_layer(table.shape[1], params["bidirectional"])
    require((params["num_buckets"], params["max_distance"]) == (layer.relative_attention_buckets,
                                                                layer.relative_attention_max_distance),
            f"the layer fixes {layer.relative_attention_buckets} buckets and max distance "
            f"{layer.relative_attention_max_distance}")
    layer.relative_attention_bias.assign(table)
    L = int(max(q.max(), k.max())) + 1
    full = _np(layer.compute_bias(L, L))[0]                                   # (H, L, L), positions 0 ... L-1
    return {"bias": full[:, q][:, :, k]}


# --- DeBERTa-v3 -----------------------------------------------------------------------------------

def _deberta_layer(params):
    from keras_hub.src.models.deberta_v3.disentangled_self_attention import DisentangledSelfAttention
    return DisentangledSelfAttention(num_heads=1, hidden_dim=2, max_position_embeddings=params["max_position"],
                                     bucket_size=params["bucket_size"], dropout=0.0, dtype="float64")


def deberta_log_bucket(inputs, params):
    from keras import ops
    rel = ops.convert_to_tensor(np.asarray(inputs["relative_pos"], dtype=np.int64))
    return {"bucket": np.asarray(ops.convert_to_numpy(_deberta_layer(params)._make_log_bucket_position(rel)))}


def deberta_relative_position(inputs, params):
    from keras import ops
    q, k = inputs["q_positions"], inputs["k_positions"]
    require(len(q) == len(k) and np.array_equal(q, np.arange(len(q))) and np.array_equal(k, q),
            "_get_rel_pos(n) numbers n queries and n keys 0, 1, ... (it reads one length)")
    require(params["bucket_size"] > 0, "_get_rel_pos always log-buckets (no bucket_size = -1)")
    rel = _deberta_layer(params)._get_rel_pos(len(q))
    return {"relative_pos": np.asarray(ops.convert_to_numpy(rel))[0, 0]}


# --- the components -------------------------------------------------------------------------------

def components():
    import keras_hub  # noqa: F401  (an environment that cannot import it fails here, not per case)
    f32 = "frequencies and angles built in float32: float32 tolerance"
    rope = [f32, "half layout native; interleaved by permuting each pair's features",
            "partial rotary: the first R features through the layer, the rest concatenated back (as its GPT-NeoX)",
            "given inv_freq rebuilt from the case's scaling by rope_type (yarn) or LlamaRotaryEmbedding (llama3)",
            "no attention factor outside yarn"]
    grad = f"{BACKEND} autodiff through the same calls"
    key_only = "key-only bias; the adapter adds the row constant softmax ignores"
    C = Component
    return [
        C("RotaryEmbedding", "rope", _rope(), "float32", rope),
        C("RotaryEmbedding", "rope_grad", _rope(True), "float32", rope + [grad]),
        C("RotaryEmbedding", "rope_scores", rope_scores, "float32",
          [f32, "keys at start_index 0, queries at start_index S - T, then q k^T",
           "half layout native; interleaved by the same permutation of q's and k's features",
           "partial rotary: the first R features through the layer"]),
        C("RotaryEmbedding and subclasses", "rope_scaling",
          rope_scaling, "float32",
          [f32, "ntk run as rope_type='dynamic' (static, no seq_len); dynamic not expressible",
           "llama3 = LlamaRotaryEmbedding, longrope = Phi3SuScaledRotaryEmbedding with T = seq_len rows",
           "inv_freq and attention factor read off the rotation at positions 0 and 1"]),
        C("SinePositionEncoding", "sinusoidal_table", sinusoidal_table, "float64",
          ["interleaved layout native; split by permuting columns", "layer dtype float64"]),
        C("AlibiBias (BLOOM)", "alibi_slopes", bloom_slopes, "float64", ["_get_slopes(num_heads)"]),
        C("AlibiBias (BLOOM)", "alibi_bias", bloom_bias, "float64", [key_only + ": -m (i - S + 1)"]),
        C("AlibiBias (BLOOM)", "alibi_bias_key_only", bloom_key_only, "float64",
          ["the layer adds m (j - (S - 1)); the adapter adds the per-head constant m (S - 1), which softmax ignores",
           "keys 0 ... S-1 (the layer reads the key length only)"]),
        C("Falcon _build_alibi_tensor", "alibi_bias_key_only", falcon_key_only, "float64",
          ["key positions from an attention mask, (cumsum(mask) - 1) * mask"]),
        C("Falcon _build_alibi_tensor", "alibi_slopes", falcon_slopes, "float64", ["_get_slopes(num_heads)"]),
        C("Falcon _build_alibi_tensor", "alibi_bias", falcon_bias, "float64", [key_only + ": -m i"]),
        C("T5MultiHeadAttention", "t5_bucket", t5_bucket, "float64", ["relative position key - query, as the spec"]),
        C("T5MultiHeadAttention", "t5_bias", t5_bias, "float64",
          ["relative position key - query, as the spec", "table = relative_attention_bias weight",
           "bias of positions 0 ... L-1, read at the case's rows and columns"]),
        C("DeBERTa-v3 DisentangledSelfAttention", "deberta_log_bucket", deberta_log_bucket, "float64",
          ["bucket_size, max_position_embeddings = the spec's bucket_size, max_position"]),
        C("DeBERTa-v3 DisentangledSelfAttention", "deberta_relative_position", deberta_relative_position, "float64",
          ["_get_rel_pos(n): query - key of positions 0 ... n-1, log-bucketed"]),
    ]


# --- probes: the minimal inputs behind the discrepancies on the page --------------------------------

def _inv_freq(layer, R):
    return _np(layer._get_inverse_freq(R))


def probe_dynamic_is_linear():
    """rope_type='dynamic' at R = 128, s = 4: every frequency divided by the same number."""
    from keras_hub.layers import RotaryEmbedding
    R, s = 128, 4.0
    ratio = _inv_freq(RotaryEmbedding(), R) / _inv_freq(RotaryEmbedding(rope_type="dynamic", scaling_factor=s), R)
    i = np.array([0, 1, 32, 63])
    return {"name": "keras_hub_dynamic_is_linear",
            "input": "RotaryEmbedding()._get_inverse_freq(128) / "
                     "RotaryEmbedding(rope_type='dynamic', scaling_factor=4)._get_inverse_freq(128), at pairs i",
            "output": {"i": i.tolist(), "ratio": ratio[i].tolist(),
                       "ratio over all 64 pairs (min, max)": [float(ratio.min()), float(ratio.max())],
                       "s^(R/(R-2))": s ** (R / (R - 2)),
                       "NTK (base times s^(R/(R-2))) divides pair i by s^(2i/(R-2))": (s ** (2 * i / (R - 2))).tolist()}}


def probe_unknown_rope_type():
    """A rope_type the layer does not know: no error, no scaling."""
    from keras_hub.layers import RotaryEmbedding
    plain = _inv_freq(RotaryEmbedding(), 8)
    out = {}
    for name in ("ntk", "longrope", "Linear"):
        try:
            got = _inv_freq(RotaryEmbedding(rope_type=name, scaling_factor=4.0), 8)
            out[name] = {"max |inv_freq - unscaled|": float(np.abs(got - plain).max())}
        except Exception as err:
            out[name] = f"{type(err).__name__}: {err}"
    return {"name": "keras_hub_unknown_rope_type",
            "input": "RotaryEmbedding(rope_type=name, scaling_factor=4)._get_inverse_freq(8) against "
                     "RotaryEmbedding()._get_inverse_freq(8)", "output": out}


def probe_phi3_positions():
    """Phi3SuScaledRotaryEmbedding with positions: the documented argument of RotaryEmbedding.call."""
    from keras_hub.src.models.phi3.phi3_rotary_embedding import Phi3SuScaledRotaryEmbedding
    layer = Phi3SuScaledRotaryEmbedding([1.0, 1.0], [2.0, 2.0], dtype="float64")
    x = _tensor(np.ones((1, 3, 4)))
    out = {"call(x)": "returns shape " + str(list(_np(layer(x)).shape))}
    try:
        out["call(x, positions=[0, 1, 2])"] = "returns shape " + str(list(_np(layer(x, positions=_tensor(np.arange(3.0)))).shape))
    except Exception as err:
        message = " ".join(re.sub(r"\x1b\[[0-9;]*m", "", str(err)).split())   # keras colours its messages
        out["call(x, positions=[0, 1, 2])"] = f"{type(err).__name__}: {message[:300]}"
    return {"name": "keras_hub_phi3_positions",
            "input": "Phi3SuScaledRotaryEmbedding([1, 1], [2, 2])(ones(1, 3, 4)) with and without positions",
            "output": out}


def probe_float64_sin():
    """keras.ops.sin of a float64 tensor, the op SinePositionEncoding(dtype="float64") ends in."""
    from keras import ops
    y = ops.sin(_tensor(np.array([1.0])))
    return {"name": "keras_float64_sin", "input": f"keras.ops.sin(float64 tensor [1.0]) on the {BACKEND} backend",
            "output": {"dtype": str(y.dtype), "value": float(_np(y)[0]), "numpy sin(1.0)": float(np.sin(1.0))}}


PROBES = [probe_dynamic_is_linear, probe_unknown_rope_type, probe_phi3_positions, probe_float64_sin]
