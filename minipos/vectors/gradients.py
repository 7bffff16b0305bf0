"""The cases of the gradient families of minipos's functions: attention, RoPE, T5, ALiBi, the
Transformer-XL shift and logits, DeBERTa, xPos and a learned absolute table.

``registry`` says what a gradient family records; the layers' backwards are in ``layers`` and
``rotary``.
"""

from __future__ import annotations

import numpy as np

from .. import alibi, deberta, rope, rope_scaling, sinusoidal, t5, transformer_xl, xpos
from ..attention import attention, attention_backward, blockwise_attention, causal_mask
from .cases import EXACT, _case, _grid, tol


def _attention_grad_cases():
    rng = np.random.default_rng(13)
    B, H, D, Dv = 2, 2, 3, 4
    cases = []

    def add(name, note, T, S, bias_shape, mask, scale):
        inputs = {"q": _grid(rng, (B, H, T, D)), "k": _grid(rng, (B, H, S, D)), "v": _grid(rng, (B, H, S, Dv)),
                  "dout": _grid(rng, (B, H, T, Dv))}
        if bias_shape is not None:
            inputs["bias"] = _grid(rng, bias_shape, 0.5)
        if mask is not None:
            inputs["mask"] = mask
        rows = np.ones((B, H, T), bool) if mask is None else np.broadcast_to(mask, (B, H, T, S)).any(axis=-1)
        cases.append(_case(name, note, inputs, {"scale": scale}, tol(),
                           where=None if rows.all() else {"lse": rows}))

    T, S = 3, 5
    add("causal_cached_T3_S5", "causal mask of a step after a cache of 2 (key s seen by query t iff s <= t + 2), "
        "bias (H, T, S) shared by the batch: dbias summed over B; default scale 1/sqrt(D)",
        T, S, (H, T, S), causal_mask(T, S), None)
    T, S = 4, 6
    mask = np.ones((B, 1, T, S), bool)
    mask[0, 0, 1] = False                                   # batch 0, query 1: no key at all
    mask[1, 0, :, 4:] = False                               # batch 1: the last two keys are padding
    add("padding_and_fully_masked_row_T4_S6", "mask (B, 1, T, S): batch 0 query 1 sees no key (zero output, "
        "zero gradients, lse -inf: not compared), batch 1 has its last two keys padded; bias (H, T, S), "
        "scale 1 (T5)", T, S, (H, T, S), mask, 1.0)
    T, S = 5, 3
    mask = np.ones((B, 1, 1, S), bool)
    mask[1, ..., 0] = False
    add("key_padding_no_bias_T5_S3", "T > S, key padding mask (B, 1, 1, S) (batch 1's first key masked), no bias "
        "(no dbias), scale 0.75", T, S, None, mask, 0.75)
    T, S = 4, 4
    mask = np.ones((B, 1, 1, S), bool)
    mask[1] = False
    add("padded_batch_full_bias", "batch 1 has no key at all (every row fully masked: zero output and gradients); "
        "bias (B, H, T, S): dbias has the bias's own shape", T, S, (B, H, T, S), mask, None)
    return cases


def _attention_grad_run(inputs, params):
    q, k, v, dout = inputs["q"], inputs["k"], inputs["v"], inputs["dout"]
    bias, mask, scale = inputs.get("bias"), inputs.get("mask"), params["scale"]
    out = attention(q, k, v, bias=bias, mask=mask, scale=scale)
    dq, dk, dv, dbias = attention_backward(q, k, v, dout, bias=bias, mask=mask, scale=scale)
    full = (*q.shape[:-1], k.shape[-2])                                        # (B, H, T, S)
    bias_b = None if bias is None else np.broadcast_to(bias, full)
    mask_b = None if mask is None else np.broadcast_to(mask, full)
    _, lse = blockwise_attention(q, k, v, bias_fn=None if bias is None else lambda qs, ks: bias_b[..., qs, ks],
                                 mask_fn=None if mask is None else lambda qs, ks: mask_b[..., qs, ks],
                                 scale=scale, block_size=2, return_lse=True)  # (B, H, T)
    got = {"out": out, "lse": lse, "dq": dq, "dk": dk, "dv": dv}
    if dbias is not None:
        got["dbias"] = dbias
    return got


def _rope_grad_cases():
    rng = np.random.default_rng(14)
    pos = np.array([0, 1, 2, 7, 100, 4097, -3])
    dy = _grid(rng, (2, 7, 8))
    plain = {"base": 10000.0, "rotary_dim": None, "attention_factor": 1.0}
    cases = [_case(f"{layout}_d8", f"layout {layout!r}: dx = R(m)^T dy, the rotation by minus the angle",
                   {"dy": dy, "positions": pos}, {"layout": layout, **plain}) for layout in rope.LAYOUTS]
    inv_freq, factor = rope_scaling.yarn(4, factor=4.0, original_max_position_embeddings=64)
    cases += [_case(f"{layout}_partial_4_of_8_attention_factor", "rotary_dim 4, a scaling's frequencies and "
                    f"attention factor {factor:.6f}: the 4 rotated features get f R(m)^T dy, the other 4 pass dy "
                    "through unscaled", {"dy": dy, "positions": pos, "inv_freq": inv_freq},
                    {"layout": layout, "base": 10000.0, "rotary_dim": 4, "attention_factor": factor})
              for layout in rope.LAYOUTS]
    return cases


def _rope_grad_run(inputs, params):
    return {"dx": rope.apply_rope_backward(inputs["dy"], inputs["positions"], inv_freq=inputs.get("inv_freq"),
                                           **params)}


def _t5_grad_cases():
    rng = np.random.default_rng(15)
    specs = [("encoder_8_16", True, 8, 16, (2, 2), np.arange(7), np.arange(7), "every (t, s) pair of 7 positions"),
             ("encoder_odd_9_16", True, 9, 16, (2, 2), np.arange(7), np.arange(7), "odd K = 9: P = floor(9/2) = 4 "
              "buckets per direction, so rows 4 (n = +0) and 8 are never read and get 0"),
             ("decoder_step_8_16", False, 8, 16, (3,), np.array([20, 21]), np.arange(22),
              "causal, two queries after a cache of 20: future keys share bucket 0 with n = 0"),
             ("encoder_32_128_far", True, 32, 128, (2,), np.arange(4),
              np.array([0, 1, 2, 3, 7, 8, 11, 12, 50, 90, 91, 127, 128, 129, 200, 1000]),
              "far keys: every pair at |n| >= 91 sums into the last bucket")]
    cases = []
    for name, b, k, m, lead, q, s, note in specs:
        dbias = _grid(rng, (*lead, q.size, s.size))
        cases.append(_case(name, f"dtable[b, h] = sum of dbias[..., h, t, s] over the pairs in bucket b (a "
                           f"leading batch summed too); {note}", {"dbias": dbias, "q_positions": q, "k_positions": s},
                           {"bidirectional": b, "num_buckets": k, "max_distance": m}))
    return cases


def _t5_grad_run(inputs, params):
    return {"dtable": t5.t5_bias_backward(inputs["dbias"], inputs["q_positions"], inputs["k_positions"], **params)}


def _alibi_grad_cases():
    rng = np.random.default_rng(16)
    specs = [("causal_form_h4", (4,), np.arange(6), np.arange(6), False),
             ("symmetric_h3", (3,), np.arange(6), np.arange(6), True),
             ("cached_step_batch_h2", (2, 2), np.array([5, 6]), np.arange(7), False)]
    return [_case(name, "dslopes[h] = sum over (t, s) of dbias[..., h, t, s] r_ts with r = j - i "
                  "(-|i - j| when symmetric), leading dims summed", {"dbias": _grid(rng, (*lead, q.size, k.size)),
                                                                     "q_positions": q, "k_positions": k},
                  {"symmetric": sym}) for name, lead, q, k, sym in specs]


def _alibi_grad_run(inputs, params):
    return {"dslopes": alibi.alibi_bias_backward(inputs["dbias"], inputs["q_positions"], inputs["k_positions"],
                                                 symmetric=params["symmetric"])}


def _rel_shift_grad_cases():
    rng = np.random.default_rng(17)
    cases = []
    for name, lead, T, S in (("square_3x3", (), 3, 3), ("memory_3x5", (), 3, 5), ("heads_2x4x7", (2,), 4, 7)):
        dy = _grid(rng, (*lead, T, S)) * causal_mask(T, S)
        cases.append(_case(name, "dy zero where the causal mask removes the shifted garbage (as attention "
                           "gives it): dx[..., i, j + T - 1 - i] = dy[..., i, j] for j <= i + S - T, 0 elsewhere",
                           {"dy": dy}, {}, EXACT))
    cases.append(_case("dense_dy_4x6", "dy nonzero everywhere: the exact adjoint of the pad-reshape-slice view, "
                       "where dy on the garbage entries flows to the next row of x it was copied from (a port "
                       "that shifts by a gather of the causal entries only may skip this case)",
                       {"dy": _grid(rng, (4, 6))}, {}, EXACT))
    return cases


def _rel_shift_grad_run(inputs, params):
    return {"dx": transformer_xl.rel_shift_backward(inputs["dy"])}


def _xl_grad_cases():
    rng = np.random.default_rng(18)
    H, T, D = 2, 4, 3
    cases = []
    for M in (0, 3):
        S = M + T
        inputs = {"q": _grid(rng, (H, T, D)), "k": _grid(rng, (H, S, D)), "r": _grid(rng, (H, S, D), 0.5),
                  "u": _grid(rng, (H, D), 0.5), "v": _grid(rng, (H, D), 0.5),
                  "dout": _grid(rng, (H, T, S)) * causal_mask(T, S)}
        cases.append(_case(f"memory_{M}", f"T = {T} queries after a memory of {M}; r (H, S, D) the projected R "
                           "at descending distances; dout zero on the non-causal entries. dq = dout k + "
                           "shift^T(dout) r, du = sum_t dout k, dv = sum_t shift^T(dout) r", inputs, {}))
    return cases


def _xl_grad_run(inputs, params):
    names = ("dq", "dk", "dr", "du", "dv")
    grads = transformer_xl.xl_scores_backward(*(inputs[n] for n in ("q", "k", "r", "u", "v", "dout")))
    return dict(zip(names, grads))


def _deberta_grad_cases():
    rng = np.random.default_rng(19)
    H, D = 2, 4
    specs = [("c2p_p2c_buckets_4_8", ("c2p", "p2c"), np.arange(10), np.arange(10), 4, 8, 4),
             ("c2p_only_T3_S7", ("c2p",), np.arange(4, 7), np.arange(7), -1, -1, 3),
             ("p2c_only_T3_S7", ("p2c",), np.arange(4, 7), np.arange(7), -1, -1, 3),
             ("p2c_c2p_T4_S9_clipped", ("p2c", "c2p"), np.arange(5, 9), np.arange(9), 4, 8, 2)]
    cases = []
    for name, types, qp, kp, b, m, span in specs:
        T, S = qp.size, kp.size
        inputs = {"q": _grid(rng, (H, T, D)), "k": _grid(rng, (H, S, D))}
        if "c2p" in types:
            inputs["pos_key"] = _grid(rng, (H, 2 * span, D))
        if "p2c" in types:
            inputs["pos_query"] = _grid(rng, (H, 2 * span, D))
        inputs["relative_pos"] = deberta.relative_positions(qp, kp, bucket_size=b, max_position=m)
        inputs["dout"] = _grid(rng, (H, T, S))
        cases.append(_case(name, "gradients of (c2c + c2p + p2c) / sqrt(D (1 + #terms)); each gather's adjoint "
                           "a scatter-add, so pairs that read one table row (clipped or bucketed) sum there; "
                           f"queries at {qp[0]} ... {qp[-1]}, keys at 0 ... {S - 1}",
                           inputs, {"att_span": span, "pos_att_type": list(types)}))
    return cases


def _deberta_grad_run(inputs, params):
    dq, dk, dpk, dpq = deberta.disentangled_scores_backward(
        inputs["q"], inputs["k"], inputs.get("pos_key"), inputs.get("pos_query"), inputs["relative_pos"],
        inputs["dout"], att_span=params["att_span"], pos_att_type=tuple(params["pos_att_type"]))
    got = {"dq": dq, "dk": dk, "dpos_key": dpk, "dpos_query": dpq}
    return {k: v for k, v in got.items() if v is not None}


def _xpos_grad_cases():
    rng = np.random.default_rng(20)
    dy = _grid(rng, (6, 8))
    specs = [("query", False, np.arange(6), 0), ("key", True, np.arange(6), 0),
             ("key_torchscale_offset", True, np.arange(6), 3),
             ("query_far_positions", False, np.array([0, 100, 1000, 2000, 3000, -50]), 0)]
    return [_case(name, "dx = R(n)^T (s dy), s = zeta_i^(+-(n - scale_offset)/scale_base) per pair",
                  {"dy": dy, "positions": pos}, {"downscale": down, "scale_offset": off, "scale_base": 512.0,
                                                 "base": 10000.0}) for name, down, pos, off in specs]


def _xpos_grad_run(inputs, params):
    return {"dx": xpos.apply_xpos_backward(inputs["dy"], inputs["positions"], **params)}


def _learned_grad_cases():
    rng = np.random.default_rng(21)
    specs = [("positions_0_to_5", np.arange(6), (6,), "each row read once; rows 6, 7 get 0"),
             ("repeated_positions", np.array([3, 1, 3, 3, 0]), (5,), "position 3 read three times: its row sums"),
             ("batch_of_positions", np.array([[0, 1, 2, 3], [2, 3, 4, 5]]), (2, 4), "positions (B, T)")]
    return [_case(name, f"dtable[p] = sum of dout[t] over the t with positions[t] = p; {note}. table (P, D) "
                  "gives the shape only", {"table": _grid(rng, (8, 4)), "positions": pos,
                                           "dout": _grid(rng, (*shape, 4))}, {}) for name, pos, shape, note in specs]


def _learned_grad_run(inputs, params):
    return {"dtable": sinusoidal.absolute_embedding_backward(inputs["table"], inputs["positions"], inputs["dout"])}
