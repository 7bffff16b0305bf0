"""The cases of the rotary schemes: RoPE, its scalings, xPos, multimodal RoPE (M-RoPE) from its
positions to the layer (``mrope_layer``, ``mrope_layer_grad``), and the vision towers' 2-D RoPE
(``axial_rope``, ``axial_rope_grad``).
"""

from __future__ import annotations

import numpy as np

from .. import axial, mrope, rope, rope_scaling, xpos
from ..layer import MRotary, MultiHeadAttention
from ._layer_cases import BATCH, _agree_with_differences, _build_layer, _causal_only, _in_chunks, _many
from .cases import EXACT, GRID, _case, _grid, tol


# --------------------------------------------------------------------------- RoPE

def _scaled(kind: str, rotary_dim: int, **kw) -> tuple:
    """A scaling's ``(inv_freq, attention_factor)`` and its source as a ``rope_scaling`` case's params."""
    source = {"kind": kind, "base": 10000.0, "dim": rotary_dim, **kw}
    inv_freq, factor = rope_scaling.REGISTRY[kind](rotary_dim, **{k: v for k, v in source.items() if k not in
                                                                   ("kind", "dim")})
    return inv_freq, factor, source


def _rope_cases():
    rng = np.random.default_rng(9)
    pos = np.array([0, 1, 2, 7, 100, 4097, 3])
    negative = np.array([-3, -2, -1, 0, 1, 7, -100])
    x = _grid(rng, (7, 8))
    cases = [_case(f"{layout}_d8", f"layout {layout!r}, all features rotated", {"x": x, "positions": pos},
                   {"layout": layout, "base": 10000.0, "rotary_dim": None, "attention_factor": 1.0},
                   tol()) for layout in rope.LAYOUTS]
    cases += [_case(f"{layout}_partial_4_of_8", "rotary_dim 4: pairs within the first 4 features, "
                    "frequencies of a 4-dim RoPE, the rest passed through", {"x": x, "positions": pos},
                    {"layout": layout, "base": 10000.0, "rotary_dim": 4, "attention_factor": 1.0},
                    tol()) for layout in rope.LAYOUTS]
    heads = _grid(rng, (2, 5, 6))
    cases.append(_case("half_heads_base_500000", "(H, T, D) input, Llama 3 base, positions 4094..4098",
                       {"x": heads, "positions": np.arange(4094, 4099)},
                       {"layout": "half", "base": 500000.0, "rotary_dim": None, "attention_factor": 1.0},
                       tol()))
    given = (("interleaved_inv_freq_and_factor", "interleaved", None, "yarn",
              dict(factor=4.0, original_max_position_embeddings=64), "cos and sin times the factor"),
             ("half_partial_4_of_8_attention_factor", "half", 4, "yarn",
              dict(factor=4.0, original_max_position_embeddings=64), "rotary_dim 4: cos and sin of the 4 rotated "
              "features times the factor, the other 4 passed through unscaled"),
             ("half_inv_freq_llama3_factor_1", "half", None, "llama3",
              dict(factor=8.0, original_max_position_embeddings=1024, low_freq_factor=1.0, high_freq_factor=4.0),
              "attention factor 1: the frequencies alone change (pairs 0, 1 kept, 2 smoothed, 3 divided by 8)"))
    for name, layout, rotary_dim, kind, kw, note in given:
        inv_freq, factor, source = _scaled(kind, rotary_dim or 8, **kw)
        cases.append(_case(name, f"given frequencies and attention factor {factor:.6f} of a scaling, "
                           f"params.scaling = its rope_scaling params ({kind}); {note}",
                           {"x": x, "positions": pos, "inv_freq": inv_freq},
                           {"layout": layout, "base": 10000.0, "rotary_dim": rotary_dim,
                            "attention_factor": factor, "scaling": source}, tol()))
    cases += [_case(f"{layout}{'_partial_4_of_8' if r else ''}_negative_positions", f"layout {layout!r}, rotary_dim "
                    f"{r or 8}: negative positions "
                    "(turned clockwise, R(-m) = R(m)^T) beside 0, 1, 7", {"x": x, "positions": negative},
                    {"layout": layout, "base": 10000.0, "rotary_dim": r, "attention_factor": 1.0}, tol())
              for layout, r in (("interleaved", None), ("half", 4))]
    return cases


def _rope_run(inputs, params):
    kw = {k: v for k, v in params.items() if k != "scaling"}   # the scaling only says where inv_freq came from
    return {"out": rope.apply_rope(inputs["x"], inputs["positions"], inv_freq=inputs.get("inv_freq"), **kw)}


def _rope_scores_cases():
    rng = np.random.default_rng(27)
    specs = (("half_step_T1_S7", "half", 10000.0, None, 2, 1, 7, 8),
             ("interleaved_step_T3_S7", "interleaved", 10000.0, None, 2, 3, 7, 8),
             ("half_partial_4_of_8_step_T2_S9_base_500000", "half", 500000.0, 4, 3, 2, 9, 8))
    cases = []
    for name, layout, base, rotary_dim, H, T, S, D in specs:
        inputs = {"q": _grid(rng, (H, T, D)), "k": _grid(rng, (H, S, D)), "q_positions": np.arange(S - T, S),
                  "k_positions": np.arange(S)}
        cases.append(_case(name, f"a cached step: {T} quer{'y' if T == 1 else 'ies'} at positions {S - T} ... "
                           f"{S - 1} after a cache of {S - T}, keys 0 ... {S - 1}; scores = R(i) q_i . R(j) k_j, "
                           "unscaled: rows S - T ... S - 1 of the full pass", inputs,
                           {"layout": layout, "base": base, "rotary_dim": rotary_dim}))
    return cases


def _rope_scores_run(inputs, params):
    q = rope.apply_rope(inputs["q"], inputs["q_positions"], **params)   # (H, T, D): R(i) q
    k = rope.apply_rope(inputs["k"], inputs["k_positions"], **params)   # (H, S, D): R(j) k
    return {"scores": np.einsum("htd,hsd->hts", q, k)}                  # (H, T, S)


LONGROPE_PINNED = (  # spec 1.2.0: (name, seq_len, keys) of the attention factor's three sources
    ("scale_1", 4096, dict(max_position_embeddings=4096)),              # s = 4096 / 4096 = 1: factor 1
    ("explicit_factor_8", 4097, dict(max_position_embeddings=131072, factor=8.0)),   # s = 8, not 32
    ("explicit_factor_1", 4097, dict(max_position_embeddings=131072, factor=1.0)),   # s = 1, not 32
    ("explicit_attention_factor", 4097, dict(max_position_embeddings=131072, attention_factor=1.25)),
)


def _rope_scaling_cases():
    rng = np.random.default_rng(10)
    short, long = (np.round(rng.uniform(1.0, 2.0, 8) * GRID) / GRID).tolist(), \
        (np.round(rng.uniform(1.0, 40.0, 8) * GRID) / GRID).tolist()
    specs = [("linear", "linear", dict(dim=16, factor=4.0)),
             ("ntk", "ntk", dict(dim=16, factor=4.0))]
    specs += [(f"dynamic_seq_{n}", "dynamic", dict(dim=16, factor=2.0, original_max_position_embeddings=2048,
                                                   seq_len=n)) for n in (100, 2048, 2049, 4096, 16384)]
    specs += [("yarn", "yarn", dict(dim=64, factor=4.0, original_max_position_embeddings=4096)),
              ("yarn_no_truncate", "yarn", dict(dim=64, factor=4.0, original_max_position_embeddings=4096,
                                                truncate=False)),
              ("yarn_betas", "yarn", dict(dim=64, factor=16.0, original_max_position_embeddings=2048,
                                          beta_fast=16.0, beta_slow=2.0)),
              ("yarn_deepseek_mscales", "yarn", dict(dim=64, factor=40.0, original_max_position_embeddings=4096,
                                                     mscale=0.707, mscale_all_dim=0.707)),
              ("yarn_mscale_ratio", "yarn", dict(dim=64, factor=4.0, original_max_position_embeddings=4096,
                                                 mscale=1.0, mscale_all_dim=0.5)),
              ("yarn_attention_factor", "yarn", dict(dim=64, factor=4.0, original_max_position_embeddings=4096,
                                                     attention_factor=1.25)),
              ("llama3", "llama3", dict(dim=128, base=500000.0, factor=8.0, original_max_position_embeddings=8192,
                                        low_freq_factor=1.0, high_freq_factor=4.0))]
    specs += [(f"longrope_seq_{n}", "longrope", dict(dim=16, short_factor=short, long_factor=long,
                                                     original_max_position_embeddings=4096,
                                                     max_position_embeddings=131072, seq_len=n))
              for n in (1, 4096, 4097, 100000)]
    specs += [("yarn_ramp_clamped", "yarn", dict(dim=8, base=100.0, factor=4.0, original_max_position_embeddings=4096,
                                                 beta_fast=1024.0, beta_slow=0.125)),
              ("yarn_ramp_zero_width", "yarn", dict(dim=8, factor=4.0, original_max_position_embeddings=64,
                                                    beta_fast=32.0, beta_slow=20.0))]
    specs += [(f"longrope_{name}", "longrope", dict(dim=16, short_factor=short, long_factor=long,
                                                   original_max_position_embeddings=4096, seq_len=n, **kw))
              for name, n, kw in LONGROPE_PINNED]
    notes = {"yarn_ramp_clamped": "; the ramp's ends, floor(low) = -1 and ceil(high) = 8, clamped to 0 and "
                                  "dim - 1 = 7 (HF's find_correction_range clamps to dim - 1, not dim/2 - 1): "
                                  "ramp i/7 for i = 0 ... 3",
             "longrope_scale_1": "; max_position_embeddings = original_max_position_embeddings, so s = 1 and "
                                 "the attention factor is 1",
             "longrope_explicit_factor_8": "; an explicit factor 8 wins over max_position_embeddings / L = 32: "
                                           "sqrt(1 + ln 8 / ln 4096) = sqrt(1.25)",
             "longrope_explicit_factor_1": "; an explicit factor 1 wins over max_position_embeddings / L = 32: "
                                           "the attention factor is 1",
             "longrope_explicit_attention_factor": "; an explicit attention_factor 1.25 is returned as it is "
                                                   "(s = 32 would give sqrt(1 + 5/12))",
             "yarn_ramp_zero_width": "; both ends at 0 (floor(-0.50), ceil(-0.29)): HF's guard low == high "
                                     "-> high += 0.001, so the ramp is 0, 1, 1, 1"}
    return [_case(name, f"{kind}: (inv_freq, attention_factor)" + notes.get(name, ""), {},
                  {"kind": kind, "base": 10000.0, **kw}, tol(1e-12)) for name, kind, kw in specs]


def _rope_scaling_run(inputs, params):
    kw = dict(params)
    inv_freq, factor = rope_scaling.REGISTRY[kw.pop("kind")](kw.pop("dim"), **kw)
    return {"inv_freq": inv_freq, "attention_factor": np.float64(factor)}


XPOS_SPECS = (  # (name, downscale, positions, scale_offset, note)
    ("query", False, np.arange(6), 0, "scale_offset 0: the plain exponent n"),
    ("key", True, np.arange(6), 0, "scale_offset 0: the plain exponent n"),
    ("query_torchscale_offset", False, np.arange(6), 3, "centre 3, where the libraries agree for positions 0 ... 5: "
     "torchscale ceil(S/2), x-transformers (max t + 1) // 2, rotary-embedding-torch len(t) // 2"),
    ("key_far_positions", True, np.array([0, 100, 1000, 2000, 3000, -50]), 0, "far and negative positions"),
    ("query_step_torchscale", False, np.array([6]), 4, "torchscale's cached step: one query at 6 after 6 keys, "
     "centre ceil(S/2) = ceil(7/2) = 4 (x-transformers would take (6 + 1) // 2 = 3, rotary-embedding-torch "
     "1 // 2 = 0)"),
    ("key_centre_torchscale_odd", True, np.arange(7), 4, "torchscale's keys 0 ... 6: centre ceil(S/2) = 4 "
     "(x-transformers and rotary-embedding-torch take 3)"),
    ("query_centre_x_transformers", False, np.arange(3, 9), 4, "x-transformers' centre (max t + 1) // 2 = "
     "(8 + 1) // 2 = 4 for positions 3 ... 8 (rotary-embedding-torch len(t) // 2 = 3, torchscale "
     "ceil((3 + 6)/2) = 5)"),
    ("key_centre_rotary_embedding_torch", True, np.arange(3, 9), 3, "rotary-embedding-torch's centre "
     "len(t) // 2 = 6 // 2 = 3 for positions 3 ... 8 (x-transformers 4, torchscale 5)"),
)


def _xpos_cases():
    rng = np.random.default_rng(11)
    x = _grid(rng, (6, 8))
    wide = _grid(rng, (7, 8))
    return [_case(name, "interleaved RoPE, pair i scaled by zeta_i^(+-(n - scale_offset)/scale_base); " + note,
                  {"x": x if len(pos) == 6 else wide[:len(pos)], "positions": pos},
                  {"downscale": down, "scale_offset": off, "scale_base": 512.0, "base": 10000.0}, tol())
            for name, down, pos, off, note in XPOS_SPECS]


def _xpos_run(inputs, params):
    return {"out": xpos.apply_xpos(inputs["x"], inputs["positions"], **params)}


def _xpos_scores_cases():
    rng = np.random.default_rng(28)
    specs = (("step_T1_S7", 2, 1, 7, 8), ("step_T3_S7", 2, 3, 7, 8), ("step_T2_S12_d4", 3, 2, 12, 4))
    cases = []
    for name, H, T, S, D in specs:
        inputs = {"q": _grid(rng, (H, T, D)), "k": _grid(rng, (H, S, D)), "q_positions": np.arange(S - T, S),
                  "k_positions": np.arange(S)}
        cases.append(_case(name, f"a cached step: {T} quer{'y' if T == 1 else 'ies'} at positions {S - T} ... "
                           f"{S - 1}, keys 0 ... {S - 1}; scores = (zeta^((i - c)/g) R(i) q_i) . (zeta^(-(j - c)/g) "
                           f"R(j) k_j), unscaled, c = scale_offset = ceil(S/2) (torchscale; c cancels): rows "
                           "S - T ... S - 1 of the full pass", inputs,
                           {"scale_offset": -(-S // 2), "scale_base": 512.0, "base": 10000.0}))
    return cases


def _xpos_scores_run(inputs, params):
    q = xpos.apply_xpos(inputs["q"], inputs["q_positions"], **params)                  # (H, T, D)
    k = xpos.apply_xpos(inputs["k"], inputs["k_positions"], downscale=True, **params)  # (H, S, D)
    return {"scores": np.einsum("htd,hsd->hts", q, k)}                                # (H, T, S)


# --------------------------------------------------------------------------- multimodal RoPE (M-RoPE)

MROPE_TYPES = [0] * 2 + [1] * 6 + [0] * 2 + [1] * 3 + [0] * 2   # text, image 1x4x6, text, image 1x6x2, text
MROPE_IMAGES = [[1, 4, 6], [1, 6, 2]]
MROPE_LAYERS = (("qwen2_vl_split", [2, 1, 1], False), ("qwen3_vl_interleaved", [2, 1, 1], True),
                ("qwen3_5_interleaved_partial", [1, 1, 0], True, {"rotary_dim": 4}),
                ("glm4v_split_partial", [1, 0, 1], False, {"rotary_dim": 4, "layout": "interleaved"}),
                ("ernie4_5_vl_hw", [2, 1, 1], "hw", {"layout": "interleaved"}))
"""(label, mrope_section, interleaved[, the scheme's other keywords]) at d_model 16, 2 heads (head dim 8)."""


def _mrope_streams():
    """Positions (3, T) of ``MROPE_TYPES``, then two decoded tokens continuing at cache length + delta."""
    pos, delta = mrope.mrope_positions(MROPE_TYPES, image_grid_thw=MROPE_IMAGES)
    return np.concatenate([pos, mrope.mrope_decode_positions(pos.shape[1], 2, delta)], axis=1)   # (3, T + 2)


def _mrope_cases(grad: bool = False):
    rng = np.random.default_rng(23 if grad else 24)
    pos = _mrope_streams()
    name = "dy" if grad else "x"
    specs = [("qwen2_vl_split_d16", [2, 3, 3], False, "split: frequencies 0-1 temporal, 2-4 height, 5-7 width"),
             ("qwen3_vl_interleaved_d16", [4, 2, 2], True, "interleaved: T H W T H W T T"),
             ("qwen2_vl_split_d128", [16, 24, 24], False, "Qwen2-VL's section at head dim 128"),
             ("qwen3_vl_interleaved_d128", [24, 20, 20], True, "Qwen3-VL's section at head dim 128")]
    what = "dx = R^T dy, each pair rotated back by its angle" if grad else "x rotated in the half layout"
    cases = [_case(label, f"{what}; angle of pair i = positions[stream(i)] * base^(-2i/D), {note}; positions of "
                   "text, two images, text and two decoded tokens",
                   {name: _grid(rng, (2, pos.shape[1], 2 * sum(section))), "positions": pos},
                   {"mrope_section": section, "interleaved": inter, "base": 10000.0})
             for label, section, inter, note in specs]
    # ERNIE-4.5-VL, drawn after the cases above (each case keeps its values as the spec adds cases): H W H W H W T T
    # in pairs (2i, 2i + 1).
    what = "dx = R^T dy, each pair rotated back by its angle" if grad else "x rotated in the interleaved layout"
    cases.append(_case("ernie4_5_vl_hw_d16", f"{what} (pairs (2i, 2i + 1)); angle of pair i = positions[stream(i)] * "
                       "base^(-2i/D), interleaved 'hw' (ERNIE-4.5-VL): H W H W H W T T; positions of text, two "
                       "images, text and two decoded tokens", {name: _grid(rng, (2, pos.shape[1], 16)), "positions": pos},
                       {"mrope_section": [2, 3, 3], "interleaved": "hw", "base": 10000.0, "layout": "interleaved"}))
    return cases


def _mrope_run(inputs, params):
    return {"out": mrope.apply_mrope(inputs["x"], inputs["positions"], **params)}


def _mrope_grad_run(inputs, params):
    return {"dx": mrope.apply_mrope_backward(inputs["dy"], inputs["positions"], **params)}


def _mrope_positions_cases():
    video = [0] * 2 + [2] * 12 + [0] * 3 + [1] * 4 + [0]
    frames = [0] * 2 + [2] * 4 + [0] * 2 + [2] * 4 + [0] * 3
    specs = [("text_image_text", MROPE_TYPES, MROPE_IMAGES, None, None, "Qwen2-VL / 2.5-VL / 3-VL images"),
             ("video_time_step_6", video, [[1, 4, 4]], [[3, 4, 4]], [6.0],
              "Qwen2.5-VL video: temporal step tokens_per_second * second_per_grid_ts = 4 * 1.5"),
             ("video_frames_qwen3_vl", frames, None, [[1, 4, 4], [1, 4, 4]], None,
              "Qwen3-VL: each frame its own (1, h, w) grid after a timestamp"),
             ("text_only", [0] * 5, None, None, None, "text only: arange(T) in all three streams, delta 0")]
    cases = []
    for label, types, images, videos, steps, note in specs:
        inputs = {"token_types": np.array(types)}
        if images is not None:
            inputs["image_grid_thw"] = np.array(images)
        if videos is not None:
            inputs["video_grid_thw"] = np.array(videos)
        cases.append(_case(label, f"{note}; spatial_merge_size 2; positions (3, T) and delta = max + 1 - T",
                           inputs, {"spatial_merge_size": 2, "video_time_intervals": steps}, EXACT))
    return cases


def _mrope_positions_run(inputs, params):
    pos, delta = mrope.mrope_positions(inputs["token_types"], image_grid_thw=inputs.get("image_grid_thw"),
                                       video_grid_thw=inputs.get("video_grid_thw"), **params)
    return {"positions": pos, "delta": np.array(delta, dtype=np.int64)}


def _mrope_layer_cases(grad: bool = False):
    rng = np.random.default_rng(25 if grad else 26)
    pos = _mrope_streams()
    T = pos.shape[1]
    cases = []
    for label, section, inter, *extra in MROPE_LAYERS:
        config = {"mrope_section": section, "interleaved": inter, **(extra[0] if extra else {})}
        layer = MultiHeadAttention(16, 2, scheme=MRotary(**config), bias=True)
        inputs = {"x": _grid(rng, (BATCH, T, 16)), "positions": pos}
        inputs.update({n: _grid(rng, getattr(layer, n).shape, 0.25) for n in ("wq", "wk", "wv", "wo", "bq", "bk",
                                                                                "bv", "bo")})
        params = {"d_model": 16, "num_heads": 2, "bias": True, "scheme": "mrope", "scheme_config": config,
                  "causal": True}
        if grad:
            inputs["dy"] = _grid(rng, (BATCH, T, 16))
            cases.append(_case(label, "layer.backward(ctx, dy) of MultiHeadAttention with MRotary, causal, "
                               "positions (3, T) of text, two images, text, two decoded tokens", inputs, params))
            continue
        for chunks in ([T], [T - 2, 1, 1]):
            note = ("one forward pass" if len(chunks) == 1 else f"through a KV cache in chunks {chunks}: the last "
                    "two tokens decoded at cache length + delta, the mask in sequence order")
            cases.append(_case(label + ("_cached" if len(chunks) > 1 else ""), f"MultiHeadAttention with MRotary "
                               f"{config}, causal, positions (3, T); {note}", inputs, {**params, "chunks": chunks}))
    return _agree_with_differences("mrope_layer_grad", cases, _mrope_layer_grad_run, _mrope_layer_forward) if grad else cases


def _mrope_layer_forward(inputs, params):
    layer = _build_layer(inputs, params, extra=("positions", "dy"))
    return layer(inputs["x"], positions=inputs["positions"], causal=_causal_only(params))


def _mrope_layer_run(inputs, params):
    layer = _build_layer(inputs, params, extra=("positions",))
    x, pos = inputs["x"], inputs["positions"]
    cache = layer.new_cache() if _many(params["chunks"]) else None
    causal = _causal_only(params)
    return _in_chunks(x, params["chunks"], lambda t: layer(x[:, t], positions=pos[:, t], causal=causal, cache=cache))


def _mrope_layer_grad_run(inputs, params):
    layer = _build_layer(inputs, params, extra=("positions", "dy"))
    _, ctx = layer(inputs["x"], positions=inputs["positions"], causal=_causal_only(params), return_context=True)
    grads = layer.backward(ctx, inputs["dy"])
    return {k: grads[k] for k in ["x", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"]}


# --------------------------------------------------------------------------- 2-D (axial) RoPE

def _axial_cases(grad: bool = False):
    """Each layout on a 3 x 4 grid (rows, then columns), on Llama 4's grid counted from 1 with its class
    token at (0, 0), Qwen's on a 4 x 4 grid in 2 x 2 merge blocks, then SAM 3's scaled grid, Kimi K2.5's layout and
    MiniMax M3's 3-D one (positions ``(3, T)``); x or dy ``(H, T, D)``, D = 16."""
    rng = np.random.default_rng(27 if grad else 28)
    name = "dy" if grad else "x"
    what = "dx = R^T dy, each pair turned back" if grad else "x rotated"
    grids = {"pixtral": axial.axial_positions(3, 4), "gemma4": axial.axial_positions(3, 4),
             "llama4": axial.axial_positions(3, 3, start=1, class_token=True),
             "qwen": axial.merge_positions(4, 4, 2)}
    notes = {"pixtral": "pairs (i, i + D/2); rows the even RoPE frequencies base^(-4i/D), columns the odd ones",
             "gemma4": "each half of the head a D/2-dim half-layout RoPE, the first by the column, the second by "
                       "the row",
             "llama4": "complex pairs (2i, 2i + 1), columns first, f_i = base^(-4i/D) for both axes; positions from "
                       "1, the class token (last) at (0, 0): unrotated",
             "qwen": "pairs (i, i + D/2), rows first, f_i = base^(-4i/D) for both axes; the patches in 2 x 2 merge "
                     "blocks (merge_positions), not row-major"}
    order = {layout: "row-major" for layout in grids} | {"qwen": "block-major"}
    cases = [_case(f"{layout}_d16", f"{what}; layout {layout!r}: {notes[layout]}; positions (2, T) of a grid, "
                   f"{order[layout]}",
                   {name: _grid(rng, (2, pos.shape[1], 16)), "positions": pos}, {"layout": layout, "base": 100.0})
             for layout, pos in grids.items()]
    # SAM 3's global ViT layers (HF Sam3ViTLayer): the llama4 layout at the grid's coordinates times
    # window_size / grid_width, here 1/3 (window 24 on a 72 x 72 grid), drawn after the cases above.
    pos = axial.axial_positions(3, 4)
    cases.append(_case("llama4_scaled_d16", f"{what}; layout 'llama4' with position_scale 1/3 (SAM 3's global layers: "
                       "each angle (p / 3) f_i); positions (2, T) of a 3 x 4 grid, row-major",
                       {name: _grid(rng, (2, pos.shape[1], 16)), "positions": pos},
                       {"layout": "llama4", "base": 100.0, "position_scale": 1 / 3}))
    # Kimi K2.5's tower, drawn after the cases above (each case keeps its values as the spec adds cases).
    cases.append(_case("kimi_d16", f"{what}; layout 'kimi': pairs (i, i + D/2), pair 2j by the column and 2j + 1 by "
                       "the row, both at f_j = base^(-4j/D) (Kimi K2.5's tower); positions (2, T) of a 3 x 4 grid, "
                       "row-major", {name: _grid(rng, (2, pos.shape[1], 16)), "positions": pos},
                       {"layout": "kimi", "base": 100.0}))
    # MiniMax M3's 3-D tower, drawn after the cases above: two frames of a 2 x 4 grid in 2 x 2 merge blocks.
    pos = np.vstack([np.repeat([0, 1], 8), np.tile(axial.merge_positions(2, 4, 2), 2)])
    cases.append(_case("minimax_m3_d16", f"{what}; layout 'minimax_m3': positions (3, T), frames, rows, then columns; "
                       "F = (D // 3) // 2 = 2, pairs (i, i + 3F) for i < 3F, the frame's, the row's, then the "
                       "column's, each at phi_j = base^(-j/F); features 6F = 12 .. 15 pass through (MiniMax M3's "
                       "tower); two frames of a 2 x 4 grid in 2 x 2 merge blocks",
                       {name: _grid(rng, (2, pos.shape[1], 16)), "positions": pos},
                       {"layout": "minimax_m3", "base": 100.0}))
    # MLCD's tower, drawn after the cases above: the class token first at (0, 0), turned by learned angles; the
    # backward's case also gives the angles' gradient, for which it takes the forward's x.
    pos = axial.axial_positions(3, 4, class_token="first")
    inputs = {name: _grid(rng, (2, pos.shape[1], 16)), "positions": pos, "class_angles": _grid(rng, (8,), 2.0)}
    if grad:
        inputs["x"] = _grid(rng, (2, pos.shape[1], 16))
    cases.append(_case("qwen_class_angles_d16", f"{what}" + ("; dclass_angles = the gradient of class_angles for "
                       "out = apply_axial_rope(x, ...) and dy: token 0's pairs turned by class_angles + pi/2, dotted "
                       "with dy, summed over the heads" if grad else "") + "; layout 'qwen' with class_angles "
                       "(MLCD's class_pos_emb, one angle per pair): token 0, the class token, turns pair i by "
                       "class_angles[i] instead of by its position, whose column is the placeholder (0, 0); the "
                       "patches after it, a 3 x 4 grid row-major", inputs, {"layout": "qwen", "base": 100.0}))
    return cases


def _axial_run(inputs, params):
    return {"out": axial.apply_axial_rope(inputs["x"], inputs["positions"], class_angles=inputs.get("class_angles"),
                                          **params)}


def _axial_grad_run(inputs, params):
    theta = inputs.get("class_angles")
    out = {"dx": axial.apply_axial_rope_backward(inputs["dy"], inputs["positions"], class_angles=theta, **params)}
    if theta is not None:                                      # the class angles' gradient, from the forward's x
        out["dclass_angles"] = axial.class_angles_backward(inputs["x"], inputs["dy"], theta, layout=params["layout"])
    return out
