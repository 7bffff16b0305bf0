"""The families: ``FAMILIES`` names each one's minipos function, how its cases are built and how a case is run.

A family is one function of minipos (``rope`` = ``minipos.rope.apply_rope``), written to one file
``<family>.json``. A *gradient family* (``rope_grad`` = ``minipos.rope.apply_rope_backward``,
``layer_grad`` = ``MultiHeadAttention.backward``, ...) records a backward the same way: its inputs
are the forward's inputs plus the gradient of the forward's output (``dout``, ``dy``, ``dbias``), its
outputs the gradients of the inputs. Each family's builder (``_..._cases``) and runner
(``_..._run``) are in ``absolute_relative``, ``rotary``, ``gradients`` or ``layers``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import rope, sinusoidal
from .absolute_relative import (_alibi_bias_cases, _alibi_bias_run, _alibi_key_only_cases, _alibi_key_only_run,
                                _alibi_slopes_cases, _alibi_slopes_run,
                                _deberta_bucket_cases, _deberta_bucket_run, _deberta_relative_cases,
                                _deberta_relative_run, _deberta_scores_cases, _deberta_scores_run, _rel_shift_cases,
                                _rel_shift_run, _shaw_cases, _shaw_logits_run, _shaw_values_run, _sinusoidal_cases,
                                _sinusoidal_run, _t5_bias_cases, _t5_bias_run, _t5_bucket_cases, _t5_bucket_run,
                                _xl_scores_cases, _xl_scores_run)
from .gradients import (_alibi_grad_cases, _alibi_grad_run, _attention_grad_cases, _attention_grad_run,
                        _deberta_grad_cases, _deberta_grad_run, _learned_grad_cases, _learned_grad_run,
                        _rel_shift_grad_cases, _rel_shift_grad_run, _rope_grad_cases, _rope_grad_run, _t5_grad_cases,
                        _t5_grad_run, _xl_grad_cases, _xl_grad_run, _xpos_grad_cases, _xpos_grad_run)
from .layers import (_irope_grad_cases, _irope_grad_run, _irope_layer_cases, _irope_layer_run, _layer_cases,
                     _layer_grad_cases, _layer_grad_run, _layer_run, _local_global_cases, _local_global_grad_run,
                     _local_global_run, _mla_cases, _mla_grad_cases, _mla_grad_run, _mla_run, _shaw_layer_cases)
from . import inkling as _inkling
from . import model as _model
from .rotary import (_axial_cases, _axial_grad_run, _axial_run, _mrope_cases, _mrope_grad_run, _mrope_layer_cases,
                     _mrope_layer_grad_run, _mrope_layer_run,
                     _mrope_positions_cases, _mrope_positions_run, _mrope_run, _rope_cases, _rope_run,
                     _rope_scaling_cases, _rope_scaling_run, _rope_scores_cases, _rope_scores_run, _xpos_cases,
                     _xpos_run, _xpos_scores_cases, _xpos_scores_run)

SPEC_VERSION = "1.4.0"

# The float32 tolerance of each family, and of the cases whose error is of another size (large
# positions): about ten times the largest error |got - expected| / (1 + |expected|) of a float32
# port, rounded up to 1, 2 or 5 times a power of ten, and at least 1e-6. The errors are measured,
# and these numbers checked against them, by tests/test_vectors_float32.py (its __main__ prints
# them): minipos run on float32 inputs, and ports that compute frequencies, angles, cos and sin in
# float32 as HF's LLaMA rotary embedding, torchscale's xPos and BLOOM's ALiBi do.
FLOAT32_TOLERANCE = {
    "sinusoidal_table": 5e-6, "alibi_slopes": 1e-6, "alibi_bias": 1e-6, "xl_scores": 2e-6,
    "deberta_scores": 1e-6, "rope": 2e-5, "rope_scaling": 1e-6, "xpos": 5e-6, "layer": 5e-6,
    "alibi_bias_key_only": 1e-6, "rope_scores": 5e-6, "xpos_scores": 5e-6,
    "attention_grad": 5e-6, "rope_grad": 2e-5, "t5_grad": 1e-6, "alibi_grad": 1e-6, "xl_grad": 1e-6,
    "deberta_grad": 1e-6, "xpos_grad": 5e-6, "learned_grad": 1e-6, "layer_grad": 2e-5,
    "mla": 5e-6, "mla_grad": 2e-5, "inkling": 1e-6, "inkling_grad": 1e-5,
    "mrope": 1e-5, "mrope_grad": 1e-5, "mrope_layer": 2e-6, "mrope_layer_grad": 2e-5,
    "shaw_logits": 1e-6, "shaw_values": 1e-6, "shaw_layer": 5e-6, "shaw_layer_grad": 2e-5,
    # positions up to 4096 / 4097 at the high frequencies: the float32 angle m * theta_i errs by
    # up to half an ulp of m * theta_i (1.5e-5 rad at 409.7)
    **{f"sinusoidal_table/{layout}_dim8": 2e-4 for layout in sinusoidal.LAYOUTS},
    **{f"{family}/{layout}_d8": 2e-4 for family in ("rope", "rope_grad") for layout in rope.LAYOUTS},
    "rope/half_heads_base_500000": 2e-4, "rope/half_inv_freq_llama3_factor_1": 1e-4,
    "irope_layer": 2e-6, "irope_layer_grad": 1e-5,
    "local_global": 2e-6, "local_global_grad": 1e-5,
    "axial_rope": 1e-6, "axial_rope_grad": 1e-6,
}


@dataclass(frozen=True)
class Family:
    """A function of minipos, how its cases are built, and how a case is run."""

    function: str
    description: str
    build: Callable[[], list]          # -> [case without "expected"]
    run: Callable[[dict, dict], dict]  # (inputs, params) -> {output name: array}


FAMILIES = {
    "sinusoidal_table": Family("minipos.sinusoidal.sinusoidal_table", "absolute sinusoidal tables (T, D) "
                               "in the three layouts", _sinusoidal_cases, _sinusoidal_run),
    "alibi_slopes": Family("minipos.alibi.alibi_slopes", "ALiBi slopes (H,) for powers of two and other "
                           "head counts", _alibi_slopes_cases, _alibi_slopes_run),
    "alibi_bias": Family("minipos.alibi.alibi_bias", "ALiBi biases (H, T, S): -m (i - j), or -m |i - j| "
                         "when symmetric", _alibi_bias_cases, _alibi_bias_run),
    "alibi_bias_key_only": Family("minipos.alibi.alibi_bias_key_only", "ALiBi's key-only form (BLOOM, Falcon): "
                                  "bias (H, 1, S) = +m_h j, -m_h (i - j) up to a per-row constant",
                                  _alibi_key_only_cases, _alibi_key_only_run),
    "t5_bucket": Family("minipos.t5.relative_position_bucket", "T5 buckets of n = key - query",
                        _t5_bucket_cases, _t5_bucket_run),
    "t5_bias": Family("minipos.t5.t5_bias", "T5 bias (H, T, S) = table[bucket(k - q), h]",
                      _t5_bias_cases, _t5_bias_run),
    "rel_shift": Family("minipos.transformer_xl.rel_shift", "Transformer-XL relative shift on (..., T, S)",
                        _rel_shift_cases, _rel_shift_run),
    "xl_scores": Family("minipos.transformer_xl.xl_scores", "Transformer-XL unscaled logits with memory, "
                        "and the table R", _xl_scores_cases, _xl_scores_run),
    "deberta_relative_position": Family("minipos.deberta.relative_positions", "DeBERTa relative positions "
                                        "q - k (T, S), log-bucketed", _deberta_relative_cases,
                                        _deberta_relative_run),
    "deberta_log_bucket": Family("minipos.deberta.make_log_bucket_position", "DeBERTa v2/v3 log buckets",
                                 _deberta_bucket_cases, _deberta_bucket_run),
    "deberta_scores": Family("minipos.deberta.disentangled_scores", "DeBERTa disentangled logits (H, T, S)",
                             _deberta_scores_cases, _deberta_scores_run),
    "rope": Family("minipos.rope.apply_rope", "RoPE on (..., T, D): both layouts, partial rotary, "
                   "given frequencies", _rope_cases, _rope_run),
    "rope_scaling": Family("minipos.rope_scaling.REGISTRY", "every RoPE scaling kind: (inv_freq, "
                           "attention_factor)", _rope_scaling_cases, _rope_scaling_run),
    "xpos": Family("minipos.xpos.apply_xpos", "xPos on (T, D): queries up, keys down",
                   _xpos_cases, _xpos_run),
    "rope_scores": Family("minipos.rope.apply_rope", "a cached decoding step at the score level: R(i) q . R(j) k "
                          "(H, T, S), queries at S - T ... S - 1", _rope_scores_cases, _rope_scores_run),
    "xpos_scores": Family("minipos.xpos.apply_xpos", "a cached decoding step at the score level: xPos queries . "
                          "xPos keys (H, T, S), queries at S - T ... S - 1", _xpos_scores_cases, _xpos_scores_run),
    "layer": Family("minipos.layer.MultiHeadAttention", "a full attention forward pass with each scheme, "
                    "weights included, and cached decoding", _layer_cases, _layer_run),
    "attention_grad": Family("minipos.attention.attention_backward", "attention's backward with a bias and a "
                             "mask: dq, dk, dv, dbias for dout; with the forward's out and the row log-sum-exp "
                             "lse of blockwise_attention(return_lse=True)", _attention_grad_cases,
                             _attention_grad_run),
    "rope_grad": Family("minipos.rope.apply_rope_backward", "RoPE's backward R(m)^T dy: both layouts, partial "
                        "rotary, an attention factor", _rope_grad_cases, _rope_grad_run),
    "t5_grad": Family("minipos.t5.t5_bias_backward", "the T5 table's gradient (K, H): dbias summed per bucket",
                      _t5_grad_cases, _t5_grad_run),
    "alibi_grad": Family("minipos.alibi.alibi_bias_backward", "the ALiBi slopes' gradient (H,) for learned slopes",
                         _alibi_grad_cases, _alibi_grad_run),
    "rel_shift_grad": Family("minipos.transformer_xl.rel_shift_backward", "the adjoint of the Transformer-XL "
                             "relative shift", _rel_shift_grad_cases, _rel_shift_grad_run),
    "xl_grad": Family("minipos.transformer_xl.xl_scores_backward", "Transformer-XL logits' backward: dq, dk, dr, "
                      "du, dv", _xl_grad_cases, _xl_grad_run),
    "deberta_grad": Family("minipos.deberta.disentangled_scores_backward", "DeBERTa disentangled logits' "
                           "backward: dq, dk and the relative tables' gradients", _deberta_grad_cases,
                           _deberta_grad_run),
    "xpos_grad": Family("minipos.xpos.apply_xpos_backward", "xPos's backward R(n)^T (s dy)", _xpos_grad_cases,
                        _xpos_grad_run),
    "learned_grad": Family("minipos.sinusoidal.absolute_embedding_backward", "a learned absolute table's "
                           "gradient: dout scatter-added by position", _learned_grad_cases, _learned_grad_run),
    "layer_grad": Family("minipos.layer.MultiHeadAttention.backward", "the layer's backward with each scheme, "
                         "causal and not, with padding: the gradient of x and of every weight",
                         _layer_grad_cases, _layer_grad_run),
    "mrope": Family("minipos.mrope.apply_mrope", "multimodal RoPE on (..., T, D): positions (3, T), Qwen2-VL's "
                    "split and Qwen3-VL's interleaved frequencies", _mrope_cases, _mrope_run),
    "mrope_grad": Family("minipos.mrope.apply_mrope_backward", "M-RoPE's backward R^T dy",
                         lambda: _mrope_cases(grad=True), _mrope_grad_run),
    "mrope_positions": Family("minipos.mrope.mrope_positions", "M-RoPE positions (3, T) and rope delta of text, "
                              "image and video tokens (HF get_rope_index)", _mrope_positions_cases,
                              _mrope_positions_run),
    "mrope_layer": Family("minipos.layer.MultiHeadAttention", "the layer with MRotary: positions (3, T), prefill "
                          "and cached decoding", _mrope_layer_cases, _mrope_layer_run),
    "mrope_layer_grad": Family("minipos.layer.MultiHeadAttention.backward", "the layer's backward with MRotary",
                               lambda: _mrope_layer_cases(grad=True), _mrope_layer_grad_run),
    "axial_rope": Family("minipos.axial.apply_axial_rope", "2-D RoPE of vision towers on (..., T, D): positions "
                         "(2, T) of rows and columns, Pixtral's, Gemma 4's and Llama 4's layouts", _axial_cases,
                         _axial_run),
    "axial_rope_grad": Family("minipos.axial.apply_axial_rope_backward", "2-D RoPE's backward R^T dy",
                              lambda: _axial_cases(grad=True), _axial_grad_run),
    "shaw_logits": Family("minipos.shaw.relative_logits", "Shaw et al.'s key term q_i . a^K_ij (H, T, S), "
                          "unscaled, a^K_ij = w_k[clip(j - i, k) + k]",
                          lambda: _shaw_cases("q", lambda T, S: (2, T, 4)), _shaw_logits_run),
    "shaw_values": Family("minipos.shaw.relative_values", "Shaw et al.'s value term sum_j weights_ij a^V_ij "
                          "(H, T, D)", lambda: _shaw_cases("weights", lambda T, S: (2, T, S)), _shaw_values_run),
    "shaw_layer": Family("minipos.layer.MultiHeadAttention", "a full forward pass with Shaw et al.'s relative "
                         "keys and values, causal and not, padded, cached", lambda: _shaw_layer_cases(False),
                         _layer_run),
    "shaw_layer_grad": Family("minipos.layer.MultiHeadAttention.backward", "the layer's backward with Shaw et "
                              "al.'s relative keys and values: x, the weights, scheme.w_k and scheme.w_v",
                              lambda: _shaw_layer_cases(True), _layer_grad_run),
    "irope_layer": Family("minipos.layer.MultiHeadAttention", "NoPE layers with Llama 4's attention temperature "
                          "(NoPETemperature) and chunked attention (attention_chunk), one pass and cached",
                          _irope_layer_cases, _irope_layer_run),
    "irope_layer_grad": Family("minipos.layer.MultiHeadAttention.backward", "the layer's backward with Llama 4's "
                               "attention temperature and chunked attention", _irope_grad_cases, _irope_grad_run),
    "local_global": Family("minipos.layer.MultiHeadAttention", "sliding windows (with a rolling cache), a scale "
                           "override, Gemma 3 local and global layers, gpt-oss sinks", _local_global_cases,
                           _local_global_run),
    "local_global_grad": Family("minipos.layer.MultiHeadAttention.backward", "the backward of the local_global "
                                "layers (one pass): x, every weight and the sinks", lambda: _local_global_cases(True),
                                _local_global_grad_run),
    "mla": Family("minipos.mla.MultiHeadLatentAttention", "DeepSeek-V2/V3 multi-head latent attention with "
                  "decoupled RoPE: a full forward pass, weights included, and cached decoding", _mla_cases, _mla_run),
    "mla_grad": Family("minipos.mla.MultiHeadLatentAttention.backward", "the MLA layer's backward: the gradient "
                       "of x and of every weight, the RMSNorms' included", _mla_grad_cases, _mla_grad_run),
    "inkling": Family("minipos.inkling.InklingAttention", "Inkling 2's decoder attention: a relative bias mixed by "
                      "each query from its hidden state, short convolutions of keys and values, the log scale, "
                      "per-query sinks; sliding and full layers, cached decoding, left padding", _inkling.inkling_cases,
                      _inkling.inkling_run),
    "inkling_grad": Family("minipos.inkling.InklingAttention.backward", "the Inkling layer's backward: the gradient "
                           "of x and of every weight", _inkling.inkling_grad_cases, _inkling.inkling_grad_run),
}


def _built_from_a_config() -> list:
    raise ValueError("family 'model_layers' is built from a model's config: minipos vectors export --config "
                     "CONFIG.json DIR (minipos.vectors.export_model)")


OPTIONAL_FAMILIES = {
    _model.FAMILY: Family(_model.FUNCTION, _model.DESCRIPTION, _built_from_a_config, _model.run),
}
"""Families that are no part of the shipped spec: written for one model (``export_model``), checked
when a directory holds them, never required there."""


def family_of(name: str) -> Family:
    """The ``Family`` called ``name``, of the spec or optional (the caller has checked the name)."""
    return FAMILIES[name] if name in FAMILIES else OPTIONAL_FAMILIES[name]
