"""What a model does with positions, read from its own config.json.

``read(config)`` takes a checkpoint's config (a path to its ``config.json``, the dict, or a
transformers config object, read through its ``to_dict()``: minipos never imports transformers)
and returns a ``Model``: ``.layers``, one attention layer per decoder layer, built as the model
builds it (heads, key/value heads, head dim, the scheme and its parameters, the window, the chunks,
the sinks, the scale, the per-head q/k norms), ``.vision`` (the vision tower's attention layers,
a ``Model`` of its own, for the towers named below: 2-D RoPE, or MiniMax M3's 3-D RoPE, DeepSeek-OCR-2's
decomposed relative position bias, GLM-Image's none; else ``None``) and ``.describe()``, the per-layer table
(the tower's after the decoder's). Layers are built when first indexed, so reading the config of a 70B model
allocates nothing; each is then an ordinary minipos layer, with random
weights to be replaced by the checkpoint's (``wq``, ``wk``, ``wv``, ``wo`` and biases; the MLA
layer's as ``minipos.mla`` names them; ``q_norm``, ``k_norm`` and the output gate's ``wg``, ``bg`` of
``minipos.qk_norm``), called as
``layer(x, positions=p, causal=True)`` with ``p`` ``(T,)``, or ``(3, T)`` for M-RoPE.

The families read (``model_type``; transformers 5.24 defines what each key means):

- llama: RoPE (half layout), any ``rope_type`` below, GQA, ``attention_bias``
- mistral, phi3: the same; ``sliding_window`` on every layer when set; Phi-3's ``partial_rotary_factor`` and
  LongRoPE
- qwen2, qwen3: the same, q/k/v biases (Qwen2), per-head q/k RMSNorm (Qwen3), sliding layers from
  ``layer_types`` / ``max_window_layers``
- gemma3_text (gemma3): local layers: window and ``rope_parameters["sliding_attention"]``; global:
  ``rope_parameters["full_attention"]``; scale ``query_pre_attn_scalar ** -0.5``; q/k norm with Gemma's
  ``1 + w``
- gemma4_text (gemma4): sliding layers: window, ``rope_parameters["sliding_attention"]``; full layers: p-RoPE
  (``"proportional"``), ``global_head_dim``, and under ``attention_k_eq_v`` ``num_global_key_value_heads`` and
  values = keys' projection; q/k norm (weight w), weightless value norm, scale 1; the last
  ``num_kv_shared_layers`` (Gemma 4 E2B, E4B) attend with the keys and values of the last earlier layer of their
  type (``minipos.kv_share.SharedKVAttention``: call it with its source layer's cache)
- diffusion_gemma_text (diffusion_gemma): Gemma 4's layers as the canvas decoder runs them: bidirectional, no window
  (the encoder pass's rolling cache of ``sliding_window - 1`` keys is the window), full layers' values = keys; the
  encoder pass is the same layer (tied weights), causal with the window: a note says how to run both
- gemma3n_text (gemma3n): sliding and full layers (RoPE half, bases ``rope_local_base_freq`` / ``rope_theta``), q/k
  norm (weight w), weightless value norm, scale 1; the last ``num_kv_shared_layers`` shared as Gemma 4's
- gemma4_unified_text (gemma4_unified): Gemma 4's layers (above); ``use_bidirectional_attention`` "vision"
  (its default, and Gemma 4's where set) keeps text causal, a note says so; "all" is refused
- lfm3 (lfm3_vl): the attention layers only (``spec.index`` their place; the ``conv`` layers in a note):
  sliding RoPE and a window, full p-RoPE (p = 0.5), per-head q/k RMSNorm; ``use_attention_gate`` (its
  default): each head's sigmoid output gate, one per head (``gate="head"``, ``wg`` = ``g_proj``'s, no bias)
- cohere2: sliding layers: interleaved RoPE and a window; full layers: NoPE
- exaone4: sliding layers: RoPE and a window; full layers: NoPE (every layer RoPE without ``sliding_window``);
  per-head q/k RMSNorm
- exaone4_5: its ``text_config``, EXAONE 4's (the first release's ``exaone4_5_text`` too, as HF renames it);
  vision_config: ``.vision``: Qwen2.5-VL's tower (window order, window and full layers) with
  ``num_key_value_heads`` key/value heads
- smollm3: NoPE every ``no_rope_layers[i] == 0`` layer, RoPE elsewhere
- llama4_text (llama4): iRoPE: chunked RoPE layers (interleaved, with the L2 q/k norm) and NoPE layers with
  the attention temperature
- gpt_oss: sinks, biases, alternating sliding/full layers, YaRN
- deepseek_v3: multi-head latent attention with decoupled RoPE (``rope_interleave``)
- deepseek_v2: the same, always interleaved (complex pairs); ``q_lora_rank`` null: a full ``wq``
  (DeepSeek-V2-Lite)
- deepseek_v32: the same, plus each layer's indexer (``spec.indexer``: heads, head dim, top-k, the frequencies
  of its half-layout RoPE on the first ``qk_rope_head_dim`` features, as ``minipos.dsa`` takes them); its
  picks are the layer's ``mask``
- glm_moe_dsa (GLM-5): DeepSeek-V3.2's layers with the indexer's RoPE interleaved (``spec.indexer["layout"]``), and
  ``indexer_types``: a "shared" layer runs no indexer and reuses the picks of the last layer before it that does
  (``spec.indexer["shared_from"]``)
- ministral3 (mistral3): Mistral's RoPE layers, each query then scaled by ``llama_4_scaling_beta``: 1 + beta
  ln(1 + floor(p / original_max_position_embeddings))
- mistral4 (mistral3): DeepSeek-V3's MLA (``rope_interleave``), the whole query then scaled by the same
  ``llama_4_scaling_beta`` rule (``minipos.mla.ScaledDecoupledRotary``)
- qwen2_vl (qwen2_vl_text): M-RoPE with ``mrope_section``: positions ``(3, T)``
- glm4v_text (glm4v): split M-RoPE (default [8, 12, 12]) on the first ``head_dim * partial_rotary_factor``
  features, pairs (2i, 2i + 1); q/k/v biases
- glm4v_moe_text (glm4v_moe): the same in the half layout, ``partial_rotary_factor`` default 0.5
- qwen3_vl_text (qwen3_vl): interleaved M-RoPE (T H W T H W ..., ``mrope_section``, default [24, 20, 20]; HF
  interleaves whatever ``mrope_interleaved`` says), Qwen3's q/k norm
- qwen3_vl_moe_text: the same (Qwen3-VL MoE, read through ``qwen3_vl_moe``)
- vision_config: pixtral (mistral3, llava; or alone): ``.vision``: 2-D RoPE (``minipos.axial``, ``"pixtral"``
  layout), bidirectional, positions ``(2, T)`` (rows, then columns), no biases
- vision_config: llama4_vision_model (llama4): ``.vision``: 2-D RoPE in the ``"llama4"`` layout, positions
  from 1 and the class token last at (0, 0); biases on q, k, v, o
- vision_config: gemma4_vision (gemma4): ``.vision``: 2-D RoPE in the ``"gemma4"`` layout (HF's
  ``pixel_position_ids`` (x, y) reversed), GQA, q/k norm (weight w), weightless value norm, scale 1
- qwen2_5_vl_text (qwen2_5_vl): Qwen2-VL's decoder (the same attention and M-RoPE)
- vision_config of qwen2_vl, qwen2_5_vl, qwen3_vl(_moe) (the tower its class builds): ``.vision``: 2-D RoPE in
  the ``"qwen"`` layout, positions ``(2, T)`` in the tower's order (``minipos.axial.merge_positions``); biases
  on q, k, v, o; Qwen2.5-VL's window layers take ``axial_window_mask``; Qwen3-VL's learned position table is
  named
- sam3_vit_model, sam3_vision_model (sam3, sam3_tracker): ``.vision`` (or the layers, alone): SAM 3's ViT, 2-D
  RoPE ``"llama4"``; window layers take ``axial_window_mask`` (a grid not a multiple of the window: refused),
  global layers ``position_scale`` = window_size / grid (scaled coordinates); biases
- sam2_video, edgetam_video, sam3_tracker_video: the memory attention's self-attention (kind "memory
  attention"), 2-D RoPE ``"llama4"`` on the ``memory_attention_rope_feat_sizes`` grid; its cross-attention is
  a note
- inkling2_vision: 2-D RoPE ``"llama4"``, the class token first at (0, 0), patches from 1 in merge blocks
- qwen3_5_text, qwen3_5_moe_text (qwen3_5, qwen3_5_moe): the attention layers only (``spec.index`` their
  place; the gated delta nets in a note): interleaved M-RoPE on ``int(head_dim * partial_rotary_factor)``
  features, q/k norm 1 + w, ``attention_bias`` on all four, and each head's output gated feature by feature,
  ``o * sigmoid(g)``, g from each head's second half of ``q_proj`` (``gate="feature"``: ``minipos.qk_norm``
  says how to split it into wq, wg)
- vision_config: qwen3_5_vision, qwen3_5_moe_vision: ``.vision``, or read alone
  (``read(config["vision_config"])``): Qwen3-VL's (the ``"qwen"`` layout, ``merge_positions``, biases on q, k,
  v, o, the learned table named)
- qwen2_5_omni, qwen3_omni_moe (their thinker_config): the thinker (``thinker_config``): its text decoder as
  Qwen2-VL's (``qwen2_5_omni_text``) or Qwen3-VL's (``qwen3_omni_moe_text``), its tower as Qwen2.5-VL's
  (windows; q, k, v Linears) or Qwen3-VL's; the audio encoder and the talker named in a note
- vision_config of glm4v, glm4v_moe: ``.vision``: the Qwen towers' 2-D RoPE and order, every layer full, the
  ``qkv`` bias ``attention_bias`` (none on ``proj``); the learned table before layer 0 named
- paddleocr_vl_text (paddleocr_vl): Qwen2-VL's split M-RoPE (default [16, 24, 24]), ``use_bias`` on q, k, v and
  o; vision_config: ``.vision``: the Qwen towers' 2-D RoPE, positions row-major (``merge_positions(h, w, 1)``: the
  projector merges after the encoder), biases on all four, the learned table before layer 0 named
- kimi_k25: its ``text_config``, DeepSeek-V3's (``deepseek_v3``, which ``kimi_k2`` there means); vision_config:
  ``.vision``: 2-D RoPE in the ``"kimi"`` layout (column and row alternating pair by pair), row-major positions,
  biases on all four, the learned table before layer 0 named
- video_llama_3: its ``text_config`` (Qwen2's by default); vision_config: ``.vision``: the Qwen towers' 2-D RoPE,
  positions ``merge_positions(h, w, m)`` with m each image's ``merge_sizes`` entry (a call input), biases on all four
- ernie4_5_vl_moe_text (ernie4_5_vl_moe): M-RoPE "hw" (``MRotary(interleaved="hw", layout="interleaved")``: H W H W
  ... T, the config's ``mrope_section`` [h, w, t]), GQA, ``use_bias`` on all four; vision_config: ``.vision``: the
  Qwen towers' layer, positions ``merge_positions(h, w, spatial_merge_size)``
- deepseek_ocr2_text (deepseek_ocr2): Llama's layer (not latent attention): RoPE half, any ``rope_type``, GQA,
  ``attention_bias`` on all four, head dim ``hidden_size // num_attention_heads``; vision_config: ``.vision``: its
  SAM ViT-B (``sam_config``): ``DecomposedRelPos`` layers (``minipos.decomposed``), 14 x 14 windows called one
  padded window at a time and the global layers over the whole grid, bidirectional, ``qkv_bias``; the Qwen2 encoder
  after it (``encoder_config``) and the learned table before layer 0 named in notes
- glm_ocr_text (glm_ocr): GLM-4.1V's split M-RoPE (pairs (2i, 2i + 1)), no biases, ``head_dim`` or the quotient;
  vision_config (glm_ocr, glm5_next): ``.vision``: the Qwen towers' 2-D RoPE and order, q/k RMSNorm before RoPE,
  ``attention_bias`` on ``qkv`` and ``proj``, no learned table
- glm_image_text (glm_image): the same M-RoPE, half layout, ``attention_bias`` on q, k, v; vision_config: ``.vision``:
  NoPE layers (bidirectional, biases on all four; the learned table before layer 0 and the VQ-VAE named in notes)
- glm5_next_text (glm5_next, GLM-5.3-Flash): its attention layers (``spec.index`` their place): latent attention without
  RoPE (``qk_rope_head_dim`` 0, ``scheme`` NoPE), the k-pool indexer's picks the only mask (``spec.indexer``: sizes,
  ``kpool``, ``shared_from``), the KDA layers and the hyper-connections in notes; vision_config: ``.vision`` as above
- minimax_m3_vl_text (minimax_m3_vl): every layer; the block-sparse "minimax_m3_sparse" ones carry their indexer's
  sizes (``spec.indexer``) and take its picks as a per-head mask (``minipos.dsa.block_mask``, ``(B, H, T, S)``):
  RoPE half on ``int(head_dim * partial_rotary_factor)`` features (HF reads no
  ``rotary_dim``: a note says so), GQA, q/k norm 1 + w; vision_config: ``.vision``: the 3-D RoPE of the
  ``"minimax_m3"`` layout on (frame, row, column) positions, biases on all four
- step3p5 (step3p7): RoPE half per layer type (its theta and partial factor), windows, the sliding layers' own heads,
  scale ``query_pre_attn_scalar ** -0.5``, q/k norm 1 + w, each head's output gate (``gate="head"``); vision_config:
  ``.vision``: the ``"qwen"`` layout on ``axial_positions(h, w)[::-1]`` (HF flips the ids), biases on all four
- muse_glimmer_text (muse_glimmer): RoPE half, NoPE where ``layer_rope_theta`` is 0, windows, weightless q/k norm, scale
  ``qk_scale_factor / sqrt(head_dim)``, the output gate per feature; vision_config (muse_glimmer, muse_spark, or alone):
  ``.vision``: the ``"qwen"`` layout on ``merge_positions(h, w, 1, window=pos_emb_height)[::-1] + 1``, window layers
  ``axial_window_mask``, biases on all four
- muse_spark_text (muse_spark): Muse Glimmer's layers, each head's output RMS-normed without weight before the gate
  (``QKNormAttention(o_norm=True)``)
- dots3_note_text (dots3_note; the hub keeps it at the top level): DeepSeek-V3's MLA, interleaved, per layer type
  with its own sizes (``per_layer_config``, or the released ``swa_*`` aliases for the sliding layers), the rope key
  RMS-normed before its rotation (``k_rope_norm``), the latents times sqrt(hidden_size / rank), the softmax scale
  ``qk_head_dim ** -0.5`` under any ``rope_type``, a sigmoid gate per head (``gate="head"``); sliding layers: their
  own RoPE (``swa_rope_theta``) and a window; indexed layers: GLM-5's indexer on the scaled query latent
  (``spec.indexer``), its picks the layer's mask; ``use_dsa`` false: full layers
- vision_config: dots3_note_vision_encoder (dots3_note, or alone): the Qwen towers' 2-D RoPE
  and order, q/k norm (weight w), ``attention_bias`` on ``qkv`` and ``proj``
- musicflamingo: its ``text_config`` (Qwen2's by default); the audio encoder and its rotary time embedding in a note
- cohere_compass_text (cohere_compass): Cohere 2's layer with interleaved M-RoPE (half layout, default [24, 20, 20])
  or NoPE per layer type (``rope_parameters`` nested; an entry null: NoPE), the window on sliding layers,
  ``attention_bias`` on all four; vision_config: ``.vision``: Qwen3-VL's tower
- qwen4_exp_text (qwen4_exp): the attention layers only (``spec.index``): Qwen3.5's layer, interleaved M-RoPE
  (default [11, 11, 10], ``partial_rotary_factor`` default 1); the QSA indexer's picks (a mask), the delta nets and
  the hyper-connections in notes; vision_config: ``.vision``: Qwen3-VL's tower. In every interleaved
  family (Qwen3-VL(-MoE), Qwen3-Omni, Qwen3.5, Cohere Compass, Qwen4-Exp) an ``mrope_section`` that does not
  count R/2 frequencies, or whose temporal count is below the others, is read as HF assigns it, a note says so
- mlcd_vision_model (alone): the Qwen towers' 2-D RoPE, patches row-major, biases; its class token first, turned by
  learned angles (``AxialRotary(class_angles=True)``: positions ``axial_positions(h, w, class_token="first")``, HF's
  ``class_pos_emb[0]`` copied into each layer's ``scheme.class_pos_emb``); vision_config: lfm3_vl_vision (lfm3_vl): ``.vision``: the attention layers only
  (``spec.index``), 2-D RoPE ``"qwen"``, ``merge_positions``, GQA, q/k norm (weight w); the convolutions in a note
- inkling2_text (inkling2): ``minipos.inkling.InklingAttention`` per layer type, no RoPE: a relative bias each query
  mixes from its hidden state, causal convolutions of k and v, per-query sinks, the gate; sliding layers ("hybrid_
  sliding": ``swa_*`` sizes, the window, which is the bias's extent, static taps), full layers ("hybrid":
  ``rel_extent``, dynamic taps, the log scale); vision_config: ``.vision``: its tower (``minipos._config_sam``)
- qwen3_omni_moe_text takes HF's head dim, ``hidden_size // num_attention_heads`` floored

Conventions. Every ``rope_type`` of ``minipos.rope_scaling`` is read (``default``, ``linear``,
``dynamic``, ``yarn``, ``llama3``, ``longrope``), and ``proportional`` (p-RoPE, ``minipos.prope``),
from transformers 5's ``rope_parameters`` (flat, or nested per layer type) or transformers 4's
``rope_theta`` + ``rope_scaling``. The sliding window
is the model's own: HF's rule, the query at ``i`` sees keys ``i - W < j <= i`` (W keys, its own
included). Keys the config leaves out take the defaults of the family's transformers config class.
A key the reader does not understand raises ``ValueError`` naming the key and the model type, never
a silent default: an unknown ``model_type`` or ``rope_type``, a key of ``rope_parameters`` that its
type does not take, a setting no minipos layer models (Gemma 2's logit soft-capping, say). Settings
minipos does not read yet (``NOT_YET``: SAM 3 video's two models at once, SAM 3's window layers on a grid that is
not a multiple of the window, interleaved M-RoPE in a family whose M-RoPE is split) raise
``ValueError`` saying "not supported yet", naming what is missing; a vision tower the list above does not name
is named in ``.notes`` (with the reason, where one is known) and ``.vision`` is ``None``. Docs:
"What does my model do with positions?" (``docs/my-model.md``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import replace

from . import safe_io
from ._config_compass_qwen4 import FAMILIES as COMPASS_FAMILIES
from ._config_compass_qwen4 import TEXT_OF as COMPASS_TEXT_OF
from ._config_gemma import FAMILIES as GEMMA_FAMILIES
from ._config_gemma import TEXT_OF as GEMMA_TEXT_OF
from ._config_glm_more import FAMILIES as GLM_FAMILIES
from ._config_glm_more import TEXT_OF as GLM_TEXT_OF
from ._config_inkling import FAMILIES as INKLING_FAMILIES
from ._config_inkling import TEXT_OF as INKLING_TEXT_OF
from ._config_minimax_muse import FAMILIES as MUSE_FAMILIES
from ._config_minimax_muse import TEXT_OF as MUSE_TEXT_OF
from ._config_mla import FAMILIES as MLA_FAMILIES
from ._config_more import FAMILIES as MORE_FAMILIES_2
from ._config_more import TEXT_OF as MORE_TEXT_OF_2
from ._config_more import TEXT_RENAMED
from ._config_rope import (
    LAYER_TYPES,
    NOT_YET,
    checked_rope_type,
    dense_layers,
    describe_rope,
    layer_sizes,
    layer_types_of,
    make_rotary,
    named_errors,
    query_scale_args,
    refuse_keys,
    rope_parameters,
    window_of,
)
from ._config_sam import SAM_MODELS, read_sam
from ._config_towers import FAMILIES as MORE_FAMILIES
from ._config_towers import TEXT_OF as MORE_TEXT_OF
from ._config_towers import THINKER_OF
from ._config_types import Family, LayerSpec, Model
from ._config_types import FamilyConfig as _Config
from ._config_vision import VISION, VISION_OF, glm4v, qwen2_vl, qwen3_vl, read_vision
from .irope import llama4_layer, smollm3_layer
from .layer import MultiHeadAttention
from .local_global import gemma3_attention, gemma3_layer_types, gemma3_rope_parameters
from .qk_norm import QKNormAttention
from .query_scale import ScaledQueryRotary
from .rope_scaling import Rotary
from .seams import NoPE

__all__ = ["read", "Model", "LayerSpec", "FAMILIES", "NOT_YET"]


# --------------------------------------------------------------------------- the text families


def _llama(c):
    return dense_layers(c, bias="attention_bias", window="none")


def _mistral(c):
    return dense_layers(c, bias="none", window="all")


def _phi3(c):
    for key in ("rope_scaling", "rope_parameters"):             # Phi3Config: the older names of LongRoPE
        params = c.data.get(key)
        if isinstance(params, dict) and (params.get("rope_type") or params.get("type")) in ("su", "yarn"):
            c.data = {**c.data, key: {**{k: v for k, v in params.items() if k != "type"}, "rope_type": "longrope"}}
    return dense_layers(c, bias="none", window="all")


def _qwen2(c):
    return dense_layers(c, bias="qkv", window="types")


def _qwen3(c):
    return dense_layers(c, bias="attention_bias", window="types", qk_norm=True)


def _gemma3(c):
    refuse_keys(c, ("attn_logit_softcapping", "use_bidirectional_attention"))
    data = {**c.defaults, **{k: v for k, v in c.data.items() if v is not None}}   # Gemma3TextConfig's defaults
    if data.get("rope_parameters") is not None and not set(data["rope_parameters"]) & set(LAYER_TYPES):
        flat = dict(data["rope_parameters"])                                 # one dict for both layer types
        data["rope_parameters"] = {"full_attention": flat, "sliding_attention": flat}
    specs = []
    for i in range(c.int("num_hidden_layers", required=True)):
        kind = named_errors(c, lambda: gemma3_layer_types(data))[i]
        params = named_errors(c, lambda: gemma3_rope_parameters(data, kind))
        params = {"rope_type": checked_rope_type(c, params), **params}
        _, kwargs = named_errors(c, lambda: gemma3_attention({**data, "rope_parameters": {kind: params}}, i))
        kwargs = {**kwargs, "norm_eps": c.float("rms_norm_eps", 1e-6, positive=True), "norm_offset": 1.0}
        specs.append(LayerSpec(i, kind, QKNormAttention, kwargs, make_rotary(c, params, "half"),
                               describe_rope(params, "half"), (), ("q/k RMSNorm per head, weight 1 + w",)))
    return specs


def _lfm3(c):
    """LFM3's attention layers (HF ``Lfm3Attention``): per-head q/k RMSNorm (weight w), RoPE (half layout) and
    the window on the sliding layers, p-RoPE by default on the full ones; under ``use_attention_gate`` (its
    default) each head's output multiplied by ``sigmoid(x W_g)`` before ``o_proj`` (``g_proj``, one gate per head,
    no bias: ``gate="head"``, ``wg = g_proj.weight.T``); the ``conv`` layers are left out (``spec.index`` is each
    attention layer's place among all the layers) and named in a note. ``(specs, notes)``."""
    gated = c.flag("use_attention_gate", True)
    if c.data.get("rope_parameters") is None:                               # Lfm3Config's own
        c = _Config({**c.data, "rope_parameters": dict(_LFM3_ROPE)}, c.model_type, c.defaults)
    found = c.data["rope_parameters"]
    if not isinstance(found, dict) or not found or not set(found) <= set(LAYER_TYPES):
        raise c.error("config['rope_parameters'] must be nested per layer type ('sliding_attention', "
                      "'full_attention'), as Lfm3Config's")
    types = layer_types_of(c, lambda i: "full_attention" if i % 4 == 2 else "sliding_attention" if i % 4 == 0 and i
                           else "conv", allowed=("full_attention", "sliding_attention", "conv"))
    sizes, eps, specs = layer_sizes(c), c.float("norm_eps", c.float("rms_norm_eps", 1e-5, positive=True), positive=True), []
    for i, kind in enumerate(types):
        if kind == "conv":
            continue
        if not isinstance(found.get(kind), dict):
            raise c.error(f"config['rope_parameters'][{kind!r}] must be a dict of RoPE parameters, got "
                          f"{found.get(kind)!r}")
        theta = {"rope_theta": found[kind].get("rope_theta")}              # each layer type has its own
        params = rope_parameters(_Config({**c.data, **theta}, c.model_type, c.defaults), kind)
        bias = c.flag("attention_bias", False)
        kwargs = {**sizes, "bias": bias, "sliding_window": window_of(c, kind), "norm_eps": eps,
                  "gate": "head" if gated else None}
        notes = ("q/k RMSNorm per head (q_norm, k_norm)",) + (
            ("output gate per head: o_h * sigmoid(x wg)_h (g_proj, no bias)",) if gated else ())
        specs.append(LayerSpec(i, kind, QKNormAttention, kwargs, make_rotary(c, params, "half"),
                               describe_rope(params, "half"), ("bg",) if gated and bias else (), notes))
    convs = [i for i, t in enumerate(types) if t == "conv"]
    notes = [f"layers {', '.join(map(str, convs))} are short convolutions, not attention (Lfm3ShortConv: a causal "
             f"depthwise conv1d of conv_L_cache = {c.int('conv_L_cache')} taps, gated): they see the previous "
             "taps - 1 tokens by their order, position machinery minipos does not model; .layers holds the attention "
             "layers only, spec.index their place"] if convs else []
    return specs, notes


_LFM3_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
              "full_attention": {"rope_type": "proportional", "rope_theta": 1_000_000.0, "partial_rotary_factor": 0.5}}
"""``Lfm3Config``'s ``rope_parameters`` when a config gives none."""


def _exaone4(c):
    """EXAONE 4: per-head q/k RMSNorm (weight w) on every layer; with a ``sliding_window``, the sliding layers
    rotate (half layout) and see the window and the full layers are NoPE; without one, every layer rotates
    (HF ``Exaone4Attention``: ``if self.sliding_window is None or self.is_sliding``)."""
    windowed = c.has("sliding_window") or ("sliding_window" not in c.data and "sliding_window" in c.defaults)
    pattern = c.get("sliding_window_pattern", 4)
    if c.data.get("layer_types") is None and windowed and (isinstance(pattern, bool) or not isinstance(pattern, int)
                                                          or pattern < 1):
        raise c.error(f"config['sliding_window_pattern'] = {pattern!r}: without layer_types, Exaone4Config builds "
                      "them from an integer pattern >= 1 (every pattern-th layer full)")
    types = layer_types_of(c, lambda i: "sliding_attention" if windowed and (i + 1) % pattern else "full_attention")
    sizes, specs = layer_sizes(c), []
    norm = {"norm_eps": c.float("rms_norm_eps", 1e-5, positive=True)}
    for i, kind in enumerate(types):
        kwargs = {**sizes, **norm, "sliding_window": window_of(c, kind) if windowed else None}
        if kind == "sliding_attention" or not windowed:
            params = rope_parameters(c)
            scheme, position = make_rotary(c, params, "half"), describe_rope(params, "half")
        else:
            scheme, position = NoPE, "NoPE (no rotation)"
        specs.append(LayerSpec(i, kind, QKNormAttention, kwargs, scheme, position, (),
                               ("q/k RMSNorm per head (q_norm, k_norm)",)))
    return specs


def _cohere2(c):
    pattern = c.int("sliding_window_pattern") or 4
    types = layer_types_of(c, lambda i: "sliding_attention" if (i + 1) % pattern else "full_attention")
    sizes, specs = layer_sizes(c), []
    for i, kind in enumerate(types):
        kwargs = {**sizes, "bias": c.flag("attention_bias", False), "sliding_window": window_of(c, kind)}
        if kind == "sliding_attention":
            params = rope_parameters(c)
            specs.append(LayerSpec(i, kind, MultiHeadAttention, kwargs, make_rotary(c, params, "interleaved"),
                                   describe_rope(params, "interleaved")))
        else:
            specs.append(LayerSpec(i, kind, MultiHeadAttention, kwargs, NoPE, "NoPE (no rotation)"))
    return specs


def _smollm3(c):
    n = c.int("num_hidden_layers", required=True)
    specs = []
    for i in range(n):
        scheme, kwargs = named_errors(c, lambda: smollm3_layer(dict(c.data), i))
        if isinstance(scheme, Rotary):
            params = rope_parameters(c)
            specs.append(LayerSpec(i, "full_attention", MultiHeadAttention, kwargs, make_rotary(c, params, "half"),
                                   describe_rope(params, "half")))
        else:
            specs.append(LayerSpec(i, "full_attention", MultiHeadAttention, kwargs, NoPE, "NoPE (no_rope_layers)"))
    return specs


def _llama4(c):
    n = c.int("num_hidden_layers", required=True)
    qk_norm = c.flag("use_qk_norm", True)
    specs = []
    for i in range(n):
        scheme, kwargs = named_errors(c, lambda: llama4_layer(dict(c.data), i))
        kind = "chunked_attention" if kwargs["attention_chunk"] else "full_attention"
        if isinstance(scheme, Rotary):
            params = rope_parameters(c)
            make = make_rotary(c, params, "interleaved")
            if params["rope_type"] in ("yarn", "longrope") and qk_norm:
                raise c.error(f"use_qk_norm with rope_type {params['rope_type']!r}: its attention factor makes the L2 "
                              "norm after RoPE differ from the norm before it, which is the one minipos models")
            notes, cls = (), MultiHeadAttention
            if qk_norm:                      # L2 norm without weight, after RoPE = before it (rotations keep RMS)
                cls, kwargs = QKNormAttention, {**kwargs, "norm_eps": c.float("rms_norm_eps", 1e-5, positive=True)}
                notes = ("L2 q/k norm per head (no weight: q_norm = k_norm = 1)",)
            specs.append(LayerSpec(i, kind, cls, kwargs, make, describe_rope(params, "interleaved"), (), notes))
        elif type(scheme) is NoPE:
            specs.append(LayerSpec(i, kind, MultiHeadAttention, kwargs, NoPE, "NoPE"))
        else:
            t = (scheme.attn_scale, scheme.floor_scale)
            specs.append(LayerSpec(i, kind, MultiHeadAttention, kwargs,
                                   lambda t=t, cls=type(scheme): cls(attn_scale=t[0], floor_scale=t[1], float32=True),
                                   f"NoPE, temperature 1 + {t[0]:g} log1p(floor((i+1)/{t[1]:g}))"))
    return specs


def _gpt_oss(c):
    types = layer_types_of(c, lambda i: "sliding_attention" if i % 2 == 0 else "full_attention")
    sizes, specs = layer_sizes(c), []
    for i, kind in enumerate(types):
        params = rope_parameters(c)
        kwargs = {**sizes, "bias": c.flag("attention_bias", True), "sinks": True, "sliding_window": window_of(c, kind)}
        specs.append(LayerSpec(i, kind, MultiHeadAttention, kwargs, make_rotary(c, params, "half"),
                               describe_rope(params, "half")))
    return specs


def _ministral3(c):
    if c.data.get("rope_parameters") is None and c.data.get("rope_scaling") is None:   # the class's default
        c.data = {**c.data, "rope_parameters": dict(c.defaults["rope_parameters"])}
    params = rope_parameters(c)
    scale = query_scale_args(c, params)
    try:
        ScaledQueryRotary(layout="half", scaling=dict(params), **scale)
    except (ValueError, TypeError) as err:
        raise c.error(f"config['rope_parameters']: {err}") from None
    c.data = {**c.data, "rope_parameters": params}                          # what the RoPE itself reads
    position = (f"{describe_rope(params, 'half')}; queries x (1 + {scale['beta']:g} "
                f"ln(1 + floor(p/{scale['original_max_position_embeddings']})))")
    return [replace(s, scheme=lambda: ScaledQueryRotary(layout="half", scaling=dict(params), **scale),
                    position=position) for s in dense_layers(c, bias="none", window="all")]


_MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 16.0, "original_max_position_embeddings":
                    16384, "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                    "llama_4_scaling_beta": 0.1}
"""``Ministral3Config``'s ``rope_parameters`` when a config gives none."""


_LLAMA_DEFAULTS = {"rope_theta": 10000.0, "max_position_embeddings": 2048}
FAMILIES = {
    "llama": Family(_llama, _LLAMA_DEFAULTS),
    "mistral": Family(_mistral, {"rope_theta": 10000.0, "max_position_embeddings": 131072}),
    "phi3": Family(_phi3, {"rope_theta": 10000.0, "max_position_embeddings": 4096}),
    "qwen2": Family(_qwen2, {"rope_theta": 10000.0, "max_position_embeddings": 32768, "max_window_layers": 28}),
    "qwen3": Family(_qwen3, {"rope_theta": 10000.0, "max_position_embeddings": 32768, "max_window_layers": 28,
                             "head_dim": 128}),
    "gemma3_text": Family(_gemma3, {"rope_theta": 1_000_000.0, "num_attention_heads": 8, "num_key_value_heads": 4,
                                    "head_dim": 256, "rms_norm_eps": 1e-6, "max_position_embeddings": 131072}),
    "cohere2": Family(_cohere2, {"rope_theta": 10000.0, "max_position_embeddings": 8192}),
    "smollm3": Family(_smollm3, {"rope_theta": 2_000_000.0, "max_position_embeddings": 32768}),
    "llama4_text": Family(_llama4, {"rope_theta": 500_000.0, "max_position_embeddings": 131072, "head_dim": 128}),
    "gpt_oss": Family(_gpt_oss, {"rope_theta": 150_000.0, "max_position_embeddings": 131072, "head_dim": 64,
                                 "sliding_window": 128}),
    "ministral3": Family(_ministral3, {"rope_theta": 10000.0, "max_position_embeddings": 262144, "head_dim": 128,
                                      "rope_parameters": _MINISTRAL3_ROPE}),
    "qwen2_vl_text": Family(qwen2_vl, {"rope_theta": 1_000_000.0, "max_position_embeddings": 32768,
                                        "max_window_layers": 80}),
    "glm4v_text": Family(glm4v, {"rope_theta": 10000.0, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
                                  "max_position_embeddings": 32768}),
    "glm4v_moe_text": Family(lambda c: glm4v(c, moe=True), {"rope_theta": 10000.0, "num_key_value_heads": 8,
                                                             "max_position_embeddings": 65536}),
    "exaone4": Family(_exaone4, {"rope_theta": 10000.0, "max_position_embeddings": 2048, "sliding_window": 4096,
                                 "rms_norm_eps": 1e-5}),
    "lfm3": Family(_lfm3, {"num_attention_heads": 16, "num_key_value_heads": 4, "head_dim": 128, "sliding_window": 256,
                           "norm_eps": 1e-5, "max_position_embeddings": 128000, "conv_L_cache": 7}),
    "qwen3_vl_text": Family(qwen3_vl, {"rope_theta": 500_000.0, "max_position_embeddings": 128000, "head_dim": 128}),
    "qwen3_vl_moe_text": Family(qwen3_vl, {"rope_theta": 500_000.0, "max_position_embeddings": 128000}),
    "qwen2_5_vl_text": Family(qwen2_vl, {"rope_theta": 1_000_000.0, "max_position_embeddings": 32768,
                                          "max_window_layers": 80}),
}
"""``model_type`` -> ``Family``. A multimodal config (``gemma3``, ``llama4``, ``qwen2_vl``) is read
through its ``text_config`` (or, as Qwen2-VL's hub files have it, its top level)."""

TEXT_OF = {"gemma3": "gemma3_text", "llama4": "llama4_text", "qwen2_vl": "qwen2_vl_text"}
TEXT_OF.update({"qwen3_vl": "qwen3_vl_text", "qwen3_vl_moe": "qwen3_vl_moe_text",
                "glm4v": "glm4v_text", "glm4v_moe": "glm4v_moe_text"})
TEXT_OF.update({"lfm3_vl": "lfm3"})
TEXT_OF.update({"qwen2_5_vl": "qwen2_5_vl_text"})
FAMILIES.update(GEMMA_FAMILIES)               # minipos._config_gemma: Gemma 4, Gemma 3n, DiffusionGemma
TEXT_OF.update(GEMMA_TEXT_OF)
FAMILIES.update(MLA_FAMILIES)                 # minipos._config_mla: DeepSeek-V2, V3, V3.2, GLM-5
FAMILIES.update(MORE_FAMILIES)                # minipos._config_towers: Qwen3.5, the Omni thinkers
TEXT_OF.update(MORE_TEXT_OF)
FAMILIES.update(MORE_FAMILIES_2)              # minipos._config_more: PaddleOCR-VL
TEXT_OF.update(MORE_TEXT_OF_2)
FAMILIES.update(GLM_FAMILIES)                 # minipos._config_glm_more: GLM-OCR, GLM-Image (GLM-5.3-Flash's tower)
TEXT_OF.update(GLM_TEXT_OF)
FAMILIES.update(MUSE_FAMILIES)                # minipos._config_minimax_muse: MiniMax M3, Step 3.7, Muse, Dots 3
TEXT_OF.update(MUSE_TEXT_OF)
FAMILIES.update(COMPASS_FAMILIES)             # minipos._config_compass_qwen4: Cohere Compass, Qwen4-Exp, Qwen3-Omni
TEXT_OF.update(COMPASS_TEXT_OF)
FAMILIES.update(INKLING_FAMILIES)             # minipos._config_inkling: Inkling 2's decoder
TEXT_OF.update(INKLING_TEXT_OF)


# --------------------------------------------------------------------------- read

def _as_dict(config) -> dict:
    """A config as a dict: a path to a JSON file, a dict, or an object with ``to_dict()``."""
    if isinstance(config, (str, os.PathLike)):
        data = safe_io.read_json(config)
        if not isinstance(data, dict):
            raise ValueError(f"config: {os.fspath(config)!r} holds a JSON {type(data).__name__}, not an object")
        return data
    if isinstance(config, Mapping):
        return json.loads(json.dumps(dict(config)))                       # a deep copy, JSON values only
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        data = to_dict()
        if isinstance(data, Mapping):
            return json.loads(json.dumps(dict(data), default=str))
    raise TypeError(f"config must be a path to a config.json, a dict, or a transformers config object (with "
                    f"to_dict()), got {type(config).__name__}")


def read(config) -> Model:
    """The position machinery of the model ``config`` describes (module docstring): a ``Model``.

    config: a path to a ``config.json``, its dict, or a transformers config object (duck-typed:
    anything with ``to_dict()``). Raises ``ValueError`` naming the key and the model type for
    anything it does not understand or minipos does not model, ``TypeError`` for a value of the
    wrong type, ``OSError`` for a file it cannot read.
    """
    data = _as_dict(config)
    outer = data.get("model_type")
    if not isinstance(outer, str):
        raise ValueError(f"config['model_type'] is required (a string such as 'llama'), got {outer!r}")
    notes = []
    if outer in THINKER_OF:                                                # an Omni model: its thinker
        if not isinstance(data.get("thinker_config"), dict):
            raise ValueError(f"model_type {outer!r}: config['thinker_config'] is required (a dict: the thinker's text "
                             "decoder and towers)")
        talker = [k for k in ("audio_config",) if isinstance(data["thinker_config"].get(k), dict)] + \
            [k for k in ("talker_config", "token2wav_config", "code2wav_config") if data.get(k) is not None]
        data, outer = data["thinker_config"], data["thinker_config"].get("model_type") or THINKER_OF[outer]
        if talker:
            notes.append(f"the thinker's text decoder and vision tower are read; {', '.join(talker)} (the audio "
                         "encoder, the speech talker) are not")
    text, model_type = data, outer
    if data.get("text_config") is not None and not isinstance(data["text_config"], dict):
        raise TypeError(f"model_type {outer!r}: config['text_config'] must be an object (the text decoder's config), "
                        f"got {type(data['text_config']).__name__}")
    if outer in TEXT_OF or isinstance(data.get("text_config"), dict):
        if isinstance(data.get("text_config"), dict):
            text = data["text_config"]
        model_type = text.get("model_type") or TEXT_OF.get(outer, outer)
        model_type = TEXT_RENAMED.get((outer, model_type), model_type)     # as the outer config class renames it
        if outer in TEXT_OF and model_type == outer:
            model_type = TEXT_OF[outer]
    if outer in VISION:                                                    # a vision encoder's own config
        return read_vision(data)
    if outer in SAM_MODELS:                                                # SAM: memory attention, SAM 3's ViT
        return read_sam(data, read_vision)
    vision = data.get("vision_config")
    if isinstance(vision, dict) and outer in VISION_OF:                   # the tower its config class builds
        vision = {**vision, "model_type": VISION_OF[outer]}
    if isinstance(vision, dict) and vision.get("model_type") in NOT_YET:
        notes.append(f"the vision tower ({vision['model_type']}) is not read: it needs {NOT_YET[vision['model_type']]}, "
                     "which minipos does not support yet; .vision is None")
    elif isinstance(vision, dict) and vision.get("model_type") not in VISION:
        notes.append(f"the vision tower ({vision.get('model_type', 'vision_config')}) is not read (minipos reads "
                     f"those of {', '.join(VISION)}); .vision is None")
    for key in (outer, model_type):
        if key in NOT_YET:
            raise ValueError(f"model_type {key!r} needs {NOT_YET[key]}, which minipos does not support yet")
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not a family minipos reads; it reads "
                         f"{', '.join(sorted(FAMILIES))} (and {', '.join(sorted(TEXT_OF))} through their text config)")
    c = _Config(text, model_type, FAMILIES[model_type].defaults)
    specs = FAMILIES[model_type].read(c)
    if isinstance(specs, tuple):                                            # a family's own notes
        specs, extra = specs
        notes.extend(extra)
    audio = data.get("audio_config")
    if isinstance(audio, dict) and not any("audio" in n for n in notes):   # Gemma 3n's Conformer, say
        notes.append(f"the audio encoder ({audio.get('model_type', 'audio_config')}) is not read")
    tower = read_vision(vision) if isinstance(vision, dict) and vision.get("model_type") in VISION else None
    return Model(model_type, text, specs, notes, tower)
