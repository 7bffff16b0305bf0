"""The cases of the absolute, bias and relative schemes' functions: sinusoidal tables, ALiBi, T5,
Transformer-XL, DeBERTa and Shaw et al.'s relative terms.
"""

from __future__ import annotations

import numpy as np

from .. import alibi, deberta, shaw, sinusoidal, t5, transformer_xl
from ..attention import causal_mask
from .cases import EXACT, _case, _distances, _grid, tol


# --------------------------------------------------------------------------- sinusoidal

def _sinusoidal_cases():
    pos = np.array([0, 1, 2, 7, 100, -3, 4096])
    cases = [_case(f"{layout}_dim8", f"layout {layout!r}, even dim, negative and large positions",
                   {"positions": pos}, {"dim": 8, "base": 10000.0, "layout": layout}, tol())
             for layout in sinusoidal.LAYOUTS]
    for dim in (7, 3, 2):
        cases.append(_case(f"tensor2tensor_dim{dim}", f"tensor2tensor, dim {dim}: zero column for odd "
                           "dim, max(D/2 - 1, 1) in the exponent", {"positions": pos[:5]},
                           {"dim": dim, "base": 10000.0, "layout": "tensor2tensor"}, tol()))
    cases.append(_case("split_dim6_base500", "split layout with base 500", {"positions": pos[:5]},
                       {"dim": 6, "base": 500.0, "layout": "split"}, tol()))
    return cases


def _sinusoidal_run(inputs, params):
    return {"table": sinusoidal.sinusoidal_table(inputs["positions"], params["dim"], base=params["base"],
                                                 layout=params["layout"])}


# --------------------------------------------------------------------------- ALiBi

ALIBI_HEADS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 20, 24, 32, 40, 64, 80, 96, 112)


def _alibi_slopes_cases():
    return [_case(f"heads_{h}", "power of two" if h & (h - 1) == 0 else "not a power of two: "
                  "interleaving rule", {}, {"num_heads": h}, tol(1e-12)) for h in ALIBI_HEADS]


def _alibi_slopes_run(inputs, params):
    return {"slopes": alibi.alibi_slopes(params["num_heads"])}


def _alibi_bias_cases():
    specs = [("causal_form_h4", 4, np.arange(6), np.arange(6), False, "-m (i - j) for every pair"),
             ("symmetric_h4", 4, np.arange(6), np.arange(6), True, "-m |i - j|"),
             ("cached_step_h3", 3, np.array([5, 6]), np.arange(7), False, "two queries after a cache of 5"),
             ("symmetric_cached_h6", 6, np.array([4]), np.arange(8), True, "one query, keys after it")]
    return [_case(name, note, {"slopes": alibi.alibi_slopes(h), "q_positions": q, "k_positions": k},
                  {"symmetric": sym}, tol(1e-12)) for name, h, q, k, sym, note in specs]


def _alibi_bias_run(inputs, params):
    return {"bias": alibi.alibi_bias(inputs["slopes"], inputs["q_positions"], inputs["k_positions"],
                                     symmetric=params["symmetric"])}


def _alibi_key_only_cases():
    padded = np.array([0, 0, 0, 1, 1, 1, 1])                  # left padding: BLOOM's attention_mask
    bloom = (np.cumsum(padded) - 1) * padded                   # (cumsum(mask) - 1) * mask = 0 0 0 0 1 2 3
    specs = [("prefill_h4_S6", 4, np.arange(6), "+m j for keys 0 ... 5: one row shared by every query"),
             ("cached_step_h3_S7", 3, np.arange(7), "no padding, S = 7 keys for T = 2 queries at 5, 6 (or "
              "any T): the row does not depend on the query"),
             ("left_padded_h12_bloom", 12, bloom, "BLOOM's k_positions (cumsum(mask) - 1) * mask for the mask "
              "0 0 0 1 1 1 1: padding at position 0"),
             ("far_keys_h6", 6, np.array([0, 1, 2, 1000, 4095]), "keys up to 4095: m j grows with S")]
    return [_case(name, note, {"slopes": alibi.alibi_slopes(h), "k_positions": k}, {}, tol(1e-12))
            for name, h, k, note in specs]


def _alibi_key_only_run(inputs, params):
    return {"bias": alibi.alibi_bias_key_only(inputs["slopes"], inputs["k_positions"])}


# --------------------------------------------------------------------------- T5

T5_CONFIGS = ((True, 32, 128), (False, 32, 128), (True, 32, 256), (True, 64, 256), (False, 16, 64),
              (True, 128, 1024), (True, 33, 128), (False, 48, 300))


T5_SMALLEST = (  # (bidirectional, num_buckets, max_distance, note): E = 1 exact bucket, or M = E + 1
    (False, 2, 8, "causal, 2 buckets (P = 2, E = 1): 0 for n >= 0, 1 for every n < 0"),
    (False, 3, 8, "causal, 3 buckets (P = 3, E = 1): one exact bucket, two log buckets"),
    (True, 4, 8, "bidirectional, 4 buckets (P = 2, E = 1): 0 for n = 0, 1 for n < 0, 3 for n > 0; bucket 2 "
     "(n = +0) unused"),
    (True, 5, 8, "bidirectional, 5 buckets: as 4 (P = floor(5/2) = 2), bucket 4 never used"),
    (True, 32, 9, "bidirectional, max_distance 9 = E + 1, the smallest allowed for 32 buckets"),
    (False, 32, 17, "causal, max_distance 17 = E + 1, the smallest allowed for 32 buckets"),
)


def _t5_bucket_cases():
    n = _distances()
    cases = [_case(f"{'bidirectional' if b else 'causal'}_{k}_{m}", "n = key - query: all of -300..300 "
                   "and log-spaced out to +-10^5", {"relative_position": n},
                   {"bidirectional": b, "num_buckets": k, "max_distance": m, "exact": False}, EXACT)
             for b, k, m in T5_CONFIGS]
    near = np.arange(-230, -180)
    for exact in (False, True):
        cases.append(_case(f"causal_15_636_{'exact' if exact else 'float32'}",
                           "a boundary within float32 rounding: n = -206 is bucket 13 in the float32 "
                           "reference, 12 in exact arithmetic", {"relative_position": near},
                           {"bidirectional": False, "num_buckets": 15, "max_distance": 636, "exact": exact},
                           EXACT))
    small = np.arange(-40, 41)
    for b, k, m, note in T5_SMALLEST:                          # spec 1.2.0: the smallest configurations defined
        cases.append(_case(f"{'bidirectional' if b else 'causal'}_{k}_{m}", f"{note}; n = -40 ... 40",
                           {"relative_position": small},
                           {"bidirectional": b, "num_buckets": k, "max_distance": m, "exact": False}, EXACT))
    return cases


def _t5_bucket_run(inputs, params):
    return {"bucket": t5.relative_position_bucket(inputs["relative_position"], **params)}


def _t5_bias_cases():
    rng = np.random.default_rng(5)
    far = np.array([0, 1, 2, 3, 7, 8, 11, 12, 50, 90, 91, 127, 128, 129, 200, 1000])
    specs = [("encoder_32_128", True, 32, 128, 2, np.arange(4), far, "bidirectional, far keys"),
             ("decoder_step_32_128", False, 32, 128, 3, np.array([200]), np.array([0, 9, 72, 73, 108, 109, 191,
                                                                                  192, 199, 200]), "cached step"),
             ("encoder_8_16", True, 8, 16, 2, np.arange(7), np.arange(7), "tiny config, every (t, s) pair")]
    return [_case(name, note, {"table": _grid(rng, (k, h)), "q_positions": q, "k_positions": s},
                  {"bidirectional": b, "num_buckets": k, "max_distance": m}, EXACT)
            for name, b, k, m, h, q, s, note in specs]


def _t5_bias_run(inputs, params):
    return {"bias": t5.t5_bias(inputs["table"], inputs["q_positions"], inputs["k_positions"], **params)}


# --------------------------------------------------------------------------- Transformer-XL

def _rel_shift_cases():
    rng = np.random.default_rng(6)
    cases = []
    for name, lead, T, S in (("square_3x3", (), 3, 3), ("memory_3x5", (), 3, 5), ("heads_2x4x7", (2,), 4, 7)):
        cases.append(_case(name, "out[..., i, j] = x[..., i, j + T - 1 - i] where j <= i + (S - T)",
                           {"x": _grid(rng, (*lead, T, S))}, {}, EXACT,
                           where={"out": np.broadcast_to(causal_mask(T, S), (*lead, T, S))}))
    return cases


def _rel_shift_run(inputs, params):
    return {"out": transformer_xl.rel_shift(inputs["x"])}


def _xl_scores_cases():
    rng = np.random.default_rng(7)
    H, T, D, d_model = 2, 4, 3, 6
    cases = []
    for M in (0, 3, 5):
        S = M + T
        inputs = {"q": _grid(rng, (H, T, D)), "k": _grid(rng, (H, S, D)),
                  "w_r": _grid(rng, (d_model, H * D), 0.5), "u": _grid(rng, (H, D), 0.5),
                  "v": _grid(rng, (H, D), 0.5)}
        cases.append(_case(f"memory_{M}", f"T = {T} queries after a memory of {M}: (q + u).k + (q + v).W_R R_(i-j), "
                           "unscaled; R at descending distances S-1 ... 0", inputs,
                           {"d_model": d_model, "base": 10000.0}, tol(),
                           where={"scores": np.broadcast_to(causal_mask(T, S), (H, T, S))}))
    return cases


def _xl_scores_run(inputs, params):
    H = inputs["u"].shape[0]
    S = inputs["k"].shape[-2]
    table = transformer_xl.relative_embeddings(S, params["d_model"], base=params["base"])  # (S, d_model)
    r = transformer_xl.relative_heads(table, inputs["w_r"], H)                              # (H, S, D)
    return {"relative_embeddings": table,
            "scores": transformer_xl.xl_scores(inputs["q"], inputs["k"], r, inputs["u"], inputs["v"])}


# --------------------------------------------------------------------------- DeBERTa

def _deberta_relative_cases():
    specs = [("plain_5x5", 5, 5, -1, -1, "i - j, no buckets"),
             ("buckets_4_8_12x12", 12, 12, 4, 8, "log buckets beyond |i - j| = 2"),
             ("v3_256_512_3x600", np.arange(3), np.arange(0, 600, 7), 256, 512, "v3 config, far keys"),
             ("cached_step_4_8", np.array([10, 11]), 12, 4, 8, "two queries after a cache of 10")]
    return [_case(name, note, {"q_positions": np.arange(q) if isinstance(q, int) else q,
                               "k_positions": np.arange(k) if isinstance(k, int) else k},
                  {"bucket_size": b, "max_position": m}, EXACT) for name, q, k, b, m, note in specs]


def _deberta_relative_run(inputs, params):
    return {"relative_pos": deberta.relative_positions(inputs["q_positions"], inputs["k_positions"], **params)}


DEBERTA_PINNED = (  # spec 1.2.0: (name, bucket_size, max_position, relative_pos, note)
    ("float32_ceil_74_1000", 74, 1000, np.concatenate([np.arange(-340, -325), np.arange(-115, -105),
                                                       np.arange(105, 115), np.arange(325, 340)]),
     "mid 37, (M - 1)/mid = 27: at |r| = 111 = 37 * 3 and 333 = 37 * 9 the real quotient is exactly 12 and 24, "
     "float32 gives 12 and 24 (buckets 49, 61), float64 gives 12.000000000000002 and 24.000000000000004 "
     "(buckets 50, 62)"),
    ("float32_ceil_19_22", 19, 22, np.arange(-52, 53),
     "mid 9, (M - 1)/mid = 7/3: at |r| = 49 the real quotient is exactly 16 (49/9 = (7/3)^2), float64 gives 16 "
     "(bucket 25), float32 gives 16.000002 (bucket 26)"),
    ("bucket_size_2", 2, 8, np.arange(-12, 13), "mid 1, mid - 1 = 0: every |r| >= 1 is bucket sign(r) * 1"),
    ("bucket_size_3", 3, 8, np.arange(-12, 13), "mid = 3 // 2 = 1, as bucket_size 2"),
    ("max_position_mid_plus_2", 4, 4, np.arange(-12, 13), "the smallest max_position allowed, mid + 2 = 4 "
     "(M - 1 = 3 > mid = 2)"),
)


def _deberta_bucket_cases():
    r = _distances()
    return [_case(f"buckets_{b}_{m}", "relative positions -300..300 and log-spaced out to +-10^5; "
                  "float32 arithmetic as in transformers", {"relative_pos": r},
                  {"bucket_size": b, "max_position": m}, EXACT)
            for b, m in ((256, 512), (4, 8), (64, 128), (512, 1024), (10, 20))] + [
        _case(name, note, {"relative_pos": r}, {"bucket_size": b, "max_position": m}, EXACT)
        for name, b, m, r, note in DEBERTA_PINNED]


def _deberta_bucket_run(inputs, params):
    return {"bucket": deberta.make_log_bucket_position(inputs["relative_pos"], params["bucket_size"],
                                                       params["max_position"])}


def _deberta_scores_cases():
    rng = np.random.default_rng(8)
    H, D = 2, 4
    specs = [("c2p_p2c_buckets_4_8", ("c2p", "p2c"), 10, 10, 4, 8, 4),
             ("c2p_only", ("c2p",), 6, 6, -1, -1, 3), ("p2c_only", ("p2c",), 6, 6, -1, -1, 3),
             ("p2c_c2p_clipped_span_3", ("p2c", "c2p"), 6, 6, -1, -1, 3)]
    cases = []
    for name, types, T, S, b, m, span in specs:
        inputs = {"q": _grid(rng, (H, T, D)), "k": _grid(rng, (H, S, D)),
                  "pos_key": _grid(rng, (H, 2 * span, D)), "pos_query": _grid(rng, (H, 2 * span, D)),
                  "relative_pos": deberta.relative_positions(T, S, bucket_size=b, max_position=m)}
        cases.append(_case(name, "(c2c + c2p + p2c) / sqrt(D (1 + #terms)); p2c indexed by delta(i, j) "
                           "as in the code", inputs, {"att_span": span, "pos_att_type": list(types)}))
    q_pos, k_pos = np.arange(4, 7), np.arange(7)
    inputs = {"q": _grid(rng, (H, 3, D)), "k": _grid(rng, (H, 7, D)),
              "pos_key": _grid(rng, (H, 8, D)), "pos_query": _grid(rng, (H, 8, D)),
              "relative_pos": deberta.relative_positions(q_pos, k_pos, bucket_size=4, max_position=8)}
    cases.append(_case("cached_step_T3_S7_buckets_4_8", "T != S: queries at positions 4 ... 6 after a cache, "
                       "keys 0 ... 6; relative_pos[i, j] = q_i - k_j log-bucketed (4, 8); p2c indexed by "
                       "delta(i, j)", inputs, {"att_span": 4, "pos_att_type": ["c2p", "p2c"]}))
    return cases


def _deberta_scores_run(inputs, params):
    return {"scores": deberta.disentangled_scores(inputs["q"], inputs["k"], inputs["pos_key"], inputs["pos_query"],
                                                  inputs["relative_pos"], att_span=params["att_span"],
                                                  pos_att_type=tuple(params["pos_att_type"]))}


# --------------------------------------------------------------------------- Shaw et al. 2018

SHAW_SPECS = (  # (name, q_positions, k_positions, k, note)
    ("square_k2", np.arange(6), np.arange(6), 2, "every pair of 6 positions; |j - i| > 2 clipped to rows 0 and 4"),
    ("cached_step_k3", np.array([20, 21]), np.arange(22), 3, "two queries after a cache of 20: only j - i "
     "matters, keys 3 or more before share row 0"),
    ("wide_k8", np.arange(5), np.arange(5), 8, "k = 8 beyond the length: no pair is clipped, rows 0-3 and "
     "13-16 unused"),
    ("k0", np.arange(4), np.arange(4), 0, "k = 0: one row for every pair"),
)


def _shaw_cases(argument: str, shape_of):
    rng = np.random.default_rng(23 if argument == "q" else 24)
    cases = []
    for name, q_pos, k_pos, k, note in SHAW_SPECS:
        table = "w_k" if argument == "q" else "w_v"
        inputs = {argument: _grid(rng, shape_of(len(q_pos), len(k_pos))), table: _grid(rng, (2 * k + 1, 4)),
                  "q_positions": q_pos, "k_positions": k_pos}
        what = ("q_i . w_k[clip(j - i, k) + k] (unscaled)" if argument == "q" else
                "sum_j weights_ij w_v[clip(j - i, k) + k]")
        cases.append(_case(name, f"{what}; {note}", inputs, {"max_relative_position": k}))
    return cases


def _shaw_logits_run(inputs, params):
    return {"logits": shaw.relative_logits(inputs["q"], inputs["w_k"], inputs["q_positions"], inputs["k_positions"],
                                           **params)}


def _shaw_values_run(inputs, params):
    return {"out": shaw.relative_values(inputs["weights"], inputs["w_v"], inputs["q_positions"],
                                        inputs["k_positions"], **params)}
