"""Golden vectors: an exact, language-neutral record of what every minipos function returns.

A port of a position scheme (to PyTorch, JAX, C++, Rust, ...) tests itself against these files;
minipos checks that it still reproduces them, so a change of behaviour is a visible change of
the spec. ``export(directory)`` writes one JSON file per *family* (one function, e.g.
``rope`` = ``minipos.rope.apply_rope``); ``check(directory)`` recomputes every case with the
installed minipos and returns every mismatch. The format is described by ``spec/schema.json``
(JSON Schema, draft 2020-12) and ``spec/README.md``; in short::

    {"format": "minipos-vectors", "spec_version": "1.0.0", "minipos_version": "0.1.0",
     "family": "rope", "function": "minipos.rope.apply_rope", "description": "...",
     "cases": [{"name": ..., "description": ...,
                "params":   {JSON scalars, lists and objects: keyword arguments},
                "inputs":   {name: array},
                "expected": {name: array},
                "where":    {output name: boolean array of its shape: compare only there} (optional),
                "tolerance": {"float64": {"rtol": r, "atol": a}, "float32": {...}}}]}

A *gradient family* (``rope_grad`` = ``minipos.rope.apply_rope_backward``, ``layer_grad`` =
``MultiHeadAttention.backward``, ...) records a backward the same way: the output gradient
(``dout``, ``dy``, ``dbias``) is one of its inputs and the input gradients are its outputs.

An array is ``{"dtype": "float64" | "int64" | "bool", "shape": [...], "data": [row-major]}``;
a scalar output is an array of shape ``[]``. JSON has no infinity: a value that ``where`` leaves
out and that is not finite (the ``-inf`` log-sum-exp of a row with no key) is written as 0. A value matches when ``|got - expected| <= atol +
rtol * |expected|`` elementwise (NumPy's ``allclose``); integer and boolean outputs carry zero
tolerances, i.e. they must be equal. ``float64`` is the tolerance for a port computing in double
precision, ``float32`` for one computing in single precision (cos/sin and angles in float32); the
float32 tolerances are about ten times the measured error of such a port (``FLOAT32_TOLERANCE``).

Determinism: inputs are drawn with fixed seeds (``numpy.random.default_rng``) and rounded to
multiples of 2^-10, so every float input is exact in float32 as well; floats are written with
Python's ``repr`` (the shortest string that reads back to the same float64), keys in a fixed
order. Exporting twice gives byte-identical files on the same platform.

Trust: ``export`` replaces each file atomically (temp file + ``os.replace``). ``check`` reads a
directory it does not trust: each file is validated against ``SCHEMA`` (= ``spec/schema.json``)
and the caps (``MAX_FILE_BYTES``, ``MAX_DEPTH``, ``MAX_TOLERANCE``, ``MAX_ARRAY_VALUES``) before
a case runs, and every problem is a failed check naming the file; ``spec/README.md`` lists them.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import secrets
import stat
import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import __version__, alibi, deberta, mrope, rope, rope_scaling, shaw, sinusoidal, t5, transformer_xl, xpos
from .attention import attention, attention_backward, blockwise_attention, causal_mask
from .layer import SCHEMES, MRotary, MultiHeadAttention
from .mla import DecoupledRotary, MultiHeadLatentAttention
from .streaming import StreamingCache

__all__ = ["SPEC_VERSION", "FAMILIES", "SCHEMA", "MAX_FILE_BYTES", "MAX_DEPTH", "MAX_TOLERANCE",
           "MAX_ARRAY_VALUES", "MAX_NDIM", "FLOAT32_TOLERANCE", "Mismatch", "FamilyCheck", "SpecError",
           "encode", "decode", "validate", "parse", "family_cases", "build_family", "export", "check", "check_families", "check_document",
           "format_mismatches", "main"]

SPEC_VERSION = "1.0.0"
GRID = 1024  # inputs are multiples of 1/GRID: exact in float32 and float64


def tol(f64: float = 1e-9, f32: float | None = None) -> dict:
    """Tolerances for float64 and float32 ports (rtol = atol = the given value).

    ``f32=None`` leaves the float32 tolerance to ``FLOAT32_TOLERANCE``, filled in when the family
    is built.
    """
    return {"float64": {"rtol": f64, "atol": f64}, "float32": None if f32 is None else {"rtol": f32, "atol": f32}}


EXACT = tol(0.0, 0.0)

# The float32 tolerance of each family, and of the cases whose error is of another size (large
# positions): about ten times the largest error |got - expected| / (1 + |expected|) of a float32
# port, rounded up to 1, 2 or 5 times a power of ten, and at least 1e-6. The errors are measured,
# and these numbers checked against them, by tests/test_vectors_float32.py (its __main__ prints
# them): minipos run on float32 inputs, and ports that compute frequencies, angles, cos and sin in
# float32 as HF's LLaMA rotary embedding, torchscale's xPos and BLOOM's ALiBi do.
FLOAT32_TOLERANCE = {
    "sinusoidal_table": 5e-6, "alibi_slopes": 1e-6, "alibi_bias": 1e-6, "xl_scores": 2e-6,
    "deberta_scores": 1e-6, "rope": 2e-5, "rope_scaling": 1e-6, "xpos": 5e-6, "layer": 5e-6,
    "attention_grad": 5e-6, "rope_grad": 2e-5, "t5_grad": 1e-6, "alibi_grad": 1e-6, "xl_grad": 1e-6,
    "deberta_grad": 1e-6, "xpos_grad": 5e-6, "learned_grad": 1e-6, "layer_grad": 2e-5,
    "mla": 5e-6, "mla_grad": 2e-5,
    "mrope": 1e-5, "mrope_grad": 1e-5, "mrope_layer": 2e-6, "mrope_layer_grad": 2e-5,
    "shaw_logits": 1e-6, "shaw_values": 1e-6, "shaw_layer": 5e-6, "shaw_layer_grad": 2e-5,
    # positions up to 4096 / 4097 at the high frequencies: the float32 angle m * theta_i errs by
    # up to half an ulp of m * theta_i (1.5e-5 rad at 409.7)
    **{f"sinusoidal_table/{layout}_dim8": 2e-4 for layout in sinusoidal.LAYOUTS},
    **{f"{family}/{layout}_d8": 2e-4 for family in ("rope", "rope_grad") for layout in rope.LAYOUTS},
    "rope/half_heads_base_500000": 2e-4,
    "irope_layer": 2e-6, "irope_layer_grad": 1e-5,
    "local_global": 2e-6, "local_global_grad": 1e-5,
}


# --------------------------------------------------------------------------- arrays in JSON

ENCODED_DTYPES = ("float64", "int64", "bool")  # the only dtypes an encoded array may name
MAX_NDIM = 32                # dimensions of an encoded array
MAX_ARRAY_VALUES = 1 << 22   # values of one encoded array (32 MiB as float64)
_INT64 = np.iinfo(np.int64)


def _short(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error message never echoes a huge field."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def encode(a, name: str = "array") -> dict:
    """An array (or scalar) as ``{"dtype", "shape", "data"}`` with row-major ``data``.

    Booleans are written as ``bool``, integers as ``int64``, real floats as ``float64``. Raises
    ``TypeError`` for complex, string or object input and ``ValueError`` for NaN/inf, integers
    outside int64 and arrays of more than ``MAX_ARRAY_VALUES`` values or ``MAX_NDIM`` dims:
    everything ``encode`` writes, ``decode`` reads back unchanged.
    """
    a = np.asarray(a)
    if a.ndim > MAX_NDIM or a.size > MAX_ARRAY_VALUES:
        raise ValueError(f"{name} must have at most {MAX_NDIM} dims and {MAX_ARRAY_VALUES} values, "
                         f"got shape {a.shape}")
    if a.dtype == bool:
        return {"dtype": "bool", "shape": list(a.shape), "data": [bool(v) for v in a.ravel()]}
    if np.issubdtype(a.dtype, np.integer):
        if a.size and (int(a.max()) > _INT64.max or int(a.min()) < _INT64.min):
            raise ValueError(f"{name} holds integers outside int64 (min {int(a.min())}, max {int(a.max())})")
        return {"dtype": "int64", "shape": list(a.shape), "data": [int(v) for v in a.ravel()]}
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"{name} must be a bool, integer or real float array, got dtype {a.dtype}"
                        + (" (the imaginary part would be lost)" if np.issubdtype(a.dtype, np.complexfloating)
                           else ""))
    data = np.asarray(a, dtype=np.float64).ravel()
    if not np.all(np.isfinite(data)):
        raise ValueError(f"{name}: golden vectors must be finite (no NaN or inf after conversion to float64)")
    return {"dtype": "float64", "shape": list(a.shape), "data": [float(v) for v in data]}


_DATA_TYPES = {"float64": (numbers.Real, "real numbers"), "int64": (numbers.Integral, "integers"),
               "bool": ((bool, np.bool_), "true/false")}


def _decode_shape(shape, name: str) -> list:
    """``shape`` as a list of non-negative ints with a bounded product, or raise naming ``name``."""
    if not isinstance(shape, (list, tuple)):
        raise TypeError(f"{name}.shape must be a list of integers, got {type(shape).__name__} {_short(shape)}")
    if len(shape) > MAX_NDIM:
        raise ValueError(f"{name}.shape has {len(shape)} dims, more than the {MAX_NDIM} allowed")
    count = 1
    for n in shape:
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral):
            raise TypeError(f"{name}.shape must hold integers, got {type(n).__name__} {_short(n)}")
        if n < 0:
            raise ValueError(f"{name}.shape must hold non-negative integers, got {_short(shape)}")
        count *= int(n)
    if count > MAX_ARRAY_VALUES:
        raise ValueError(f"{name}.shape {_short(shape)} asks for {count} values, more than the "
                         f"{MAX_ARRAY_VALUES} allowed")
    return [int(n) for n in shape]


def decode(d: dict, name: str = "array") -> np.ndarray:
    """The array of an encoded ``{"dtype", "shape", "data"}`` (``name`` labels errors).

    Only what ``encode`` writes is read: dtype ``float64`` (finite real numbers), ``int64``
    (integers in range) or ``bool`` (true/false), a shape of at most ``MAX_NDIM`` non-negative
    ints whose product, at most ``MAX_ARRAY_VALUES``, is the length of ``data``. Anything else
    raises ``ValueError`` or ``TypeError`` naming the field, before anything is allocated.
    """
    if not isinstance(d, dict):
        raise TypeError(f"{name} must be an object with dtype, shape and data, got {type(d).__name__}")
    if set(d) != {"dtype", "shape", "data"}:
        missing, extra = {"dtype", "shape", "data"} - set(d), set(d) - {"dtype", "shape", "data"}
        raise ValueError(f"{name} must have exactly the keys dtype, shape and data"
                         + (f"; missing {sorted(missing)}" if missing else "")
                         + (f"; extra {_short(sorted(map(str, extra)))}" if extra else ""))
    dtype, data = d["dtype"], d["data"]
    if not isinstance(dtype, str) or dtype not in ENCODED_DTYPES:
        raise ValueError(f"{name}.dtype must be one of {list(ENCODED_DTYPES)}, got {_short(dtype)}")
    shape = _decode_shape(d["shape"], name)
    if not isinstance(data, list):
        raise TypeError(f"{name}.data must be a list, got {type(data).__name__}")
    if len(data) != math.prod(shape):
        raise ValueError(f"{name}.shape {shape} holds {math.prod(shape)} values but data has {len(data)}")
    allowed, words = _DATA_TYPES[dtype]
    for kind in set(map(type, data)):  # a handful of types, however long the data
        if not issubclass(kind, allowed) or (dtype != "bool" and issubclass(kind, (bool, np.bool_))):
            raise TypeError(f"{name}.data must hold only {words} for dtype {dtype}, got {kind.__name__}")
    try:
        arr = np.array([int(v) for v in data] if dtype == "int64" else data, dtype=dtype)
    except OverflowError:
        raise ValueError(f"{name}.data holds a number out of range for {dtype}") from None
    if dtype == "float64" and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}.data must be finite, got NaN or inf")
    return arr.reshape(shape)


def _grid(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    """Standard normal draws times ``scale``, rounded to multiples of 1/GRID (float32-exact)."""
    return np.round(rng.standard_normal(shape) * scale * GRID) / GRID


def _case(name: str, description: str, inputs: dict, params: dict, tolerance: dict = None,
          where: dict | None = None) -> dict:
    case = {"name": name, "description": description, "params": params, "inputs": inputs,
            "tolerance": tolerance or tol()}
    if where:
        case["where"] = where
    return case


def _distances(limit: int = 100_000, dense: int = 300, count: int = 48) -> np.ndarray:
    """All of -dense..dense plus log-spaced distances out to +-limit: int64, sorted."""
    far = np.unique(np.round(np.logspace(np.log10(dense + 1), np.log10(limit), count)).astype(np.int64))
    return np.concatenate([-far[::-1], np.arange(-dense, dense + 1), far])


@dataclass(frozen=True)
class Family:
    """A function of minipos, how its cases are built, and how a case is run."""

    function: str
    description: str
    build: Callable[[], list]          # -> [case without "expected"]
    run: Callable[[dict, dict], dict]  # (inputs, params) -> {output name: array}


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


# --------------------------------------------------------------------------- T5

T5_CONFIGS = ((True, 32, 128), (False, 32, 128), (True, 32, 256), (True, 64, 256), (False, 16, 64),
              (True, 128, 1024), (True, 33, 128), (False, 48, 300))


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


def _deberta_bucket_cases():
    r = _distances()
    return [_case(f"buckets_{b}_{m}", "relative positions -300..300 and log-spaced out to +-10^5; "
                  "float32 arithmetic as in transformers", {"relative_pos": r},
                  {"bucket_size": b, "max_position": m}, EXACT)
            for b, m in ((256, 512), (4, 8), (64, 128), (512, 1024), (10, 20))]


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


# --------------------------------------------------------------------------- RoPE

def _rope_cases():
    rng = np.random.default_rng(9)
    pos = np.array([0, 1, 2, 7, 100, 4097, -3])
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
    inv_freq, factor = rope_scaling.yarn(8, factor=4.0, original_max_position_embeddings=64)
    cases.append(_case("interleaved_inv_freq_and_factor", "frequencies and attention factor of a "
                       "scaling (YaRN, factor 4, L = 64): cos and sin times the factor",
                       {"x": x, "positions": pos, "inv_freq": inv_freq},
                       {"layout": "interleaved", "base": 10000.0, "rotary_dim": None,
                        "attention_factor": factor}, tol()))
    inv_freq, factor = rope_scaling.yarn(4, factor=4.0, original_max_position_embeddings=64)
    cases.append(_case("half_partial_4_of_8_attention_factor", "rotary_dim 4 with a scaling's frequencies "
                       "and attention factor (YaRN, factor 4, L = 64): cos and sin of the 4 rotated features "
                       "times the factor, the other 4 passed through unscaled",
                       {"x": x, "positions": pos, "inv_freq": inv_freq},
                       {"layout": "half", "base": 10000.0, "rotary_dim": 4, "attention_factor": factor},
                       tol()))
    return cases


def _rope_run(inputs, params):
    return {"out": rope.apply_rope(inputs["x"], inputs["positions"], inv_freq=inputs.get("inv_freq"), **params)}


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
    notes = {"yarn_ramp_clamped": "; the ramp's ends, floor(low) = -1 and ceil(high) = 8, clamped to 0 and "
                                  "dim - 1 = 7 (HF's find_correction_range clamps to dim - 1, not dim/2 - 1): "
                                  "ramp i/7 for i = 0 ... 3",
             "yarn_ramp_zero_width": "; both ends at 0 (floor(-0.50), ceil(-0.29)): HF's guard low == high "
                                     "-> high += 0.001, so the ramp is 0, 1, 1, 1"}
    return [_case(name, f"{kind}: (inv_freq, attention_factor)" + notes.get(name, ""), {},
                  {"kind": kind, "base": 10000.0, **kw}, tol(1e-12)) for name, kind, kw in specs]


def _rope_scaling_run(inputs, params):
    kw = dict(params)
    inv_freq, factor = rope_scaling.REGISTRY[kw.pop("kind")](kw.pop("dim"), **kw)
    return {"inv_freq": inv_freq, "attention_factor": np.float64(factor)}


def _xpos_cases():
    rng = np.random.default_rng(11)
    x = _grid(rng, (6, 8))
    specs = [("query", False, np.arange(6), 0), ("key", True, np.arange(6), 0),
             ("query_torchscale_offset", False, np.arange(6), 3), ("key_far_positions", True,
                                                                    np.array([0, 100, 1000, 2000, 3000, -50]), 0)]
    return [_case(name, "interleaved RoPE, pair i scaled by zeta_i^(+-(n - scale_offset)/scale_base)",
                  {"x": x, "positions": pos}, {"downscale": down, "scale_offset": off, "scale_base": 512.0,
                                               "base": 10000.0}, tol())
            for name, down, pos, off in specs]


def _xpos_run(inputs, params):
    return {"out": xpos.apply_xpos(inputs["x"], inputs["positions"], **params)}


# --------------------------------------------------------------------------- the layer

LAYER_SCHEMES = (
    ("nope", "nope", {}, False), ("sinusoidal", "sinusoidal", {"layout": "interleaved"}, False),
    ("learned", "learned", {"max_positions": 8}, False),
    ("rope_half", "rope", {"layout": "half"}, True),
    ("rope_interleaved_partial", "rope", {"layout": "interleaved", "rotary_dim": 2}, True),
    ("rope_yarn", "rope", {"layout": "half", "scaling": {"rope_type": "yarn", "factor": 4.0,
                                                         "original_max_position_embeddings": 4}}, True),
    ("rope_dynamic", "rope", {"layout": "half", "scaling": {"rope_type": "dynamic", "factor": 2.0,
                                                            "original_max_position_embeddings": 4}}, True),
    ("xpos", "xpos", {}, True), ("alibi", "alibi", {}, True), ("alibi_symmetric", "alibi", {"symmetric": True}, False),
    ("t5_encoder", "t5", {"num_buckets": 8, "max_distance": 8, "bidirectional": True}, False),
    ("t5_decoder", "t5", {"num_buckets": 8, "max_distance": 8, "bidirectional": False}, True),
    ("transformer_xl", "transformer-xl", {}, True),
    ("deberta", "deberta", {"position_buckets": 4, "max_relative_positions": 8}, False),
    ("rope_linear", "rope", {"layout": "half", "scaling": {"rope_type": "linear", "factor": 2.0}}, True),
    ("rope_ntk", "rope", {"layout": "half", "scaling": {"rope_type": "ntk", "factor": 4.0}}, True),
    ("rope_llama3", "rope", {"layout": "half", "scaling": {"rope_type": "llama3", "factor": 8.0,
                                                           "original_max_position_embeddings": 16,
                                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0}}, True),
    ("rope_longrope", "rope", {"layout": "half", "scaling": {"rope_type": "longrope", "short_factor": [1.0, 1.5],
                                                             "long_factor": [2.0, 8.0],
                                                             "original_max_position_embeddings": 4,
                                                             "max_position_embeddings": 16}}, True),
    ("rope_yarn_partial", "rope", {"layout": "half", "rotary_dim": 2,
                                   "scaling": {"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 4}}, True),
    ("alibi_default_bidirectional", "alibi", {}, False),
)
CACHED = ("rope_half", "rope_dynamic", "xpos", "alibi", "t5_decoder", "transformer_xl", "rope_longrope")
D_MODEL, HEADS, BATCH, LENGTH = 8, 2, 2, 7
SCHEME_CONFIGS = {label: (name, config) for label, name, config, _ in LAYER_SCHEMES}
# More forward cases: (label, scheme label, causal, bias, key padding, chunks)
LAYER_MORE = (
    ("nope_bias", "nope", False, True, None, [LENGTH]),
    ("rope_half_bias", "rope_half", True, True, None, [LENGTH]),
    ("t5_encoder_bias_padded", "t5_encoder", False, True, "right", [LENGTH]),
    ("alibi_default_padded", "alibi_default_bidirectional", False, False, "right", [LENGTH]),
    ("deberta_padded", "deberta", False, True, "right", [LENGTH]),
    ("rope_half_left_padded", "rope_half", True, False, "left", [LENGTH]),
    ("transformer_xl_left_padded", "transformer_xl", True, False, "left", [LENGTH]),
    ("alibi_left_padded_cached", "alibi", True, False, "left", [3, 1, 1, 2]),
)


def _padding(kind: str) -> np.ndarray:
    """A key padding mask ``(B, T)``: batch 0 unpadded, batch 1 with its last (``"right"``) or first
    (``"left"``) two tokens padding. Left padding under a causal mask leaves rows with no key."""
    mask = np.ones((BATCH, LENGTH), dtype=bool)
    mask[1, -2:] = kind != "right"
    mask[1, :2] = kind != "left"
    return mask


PADDING_NOTE = {"right": "key padding: the last two keys of batch 1 masked",
                "left": "key padding: the first two keys of batch 1 masked, so under the causal mask its "
                        "first two queries have no key (fully masked rows: zero output)"}


def _scheme(name: str, config: dict):
    config = dict(config)
    if "pos_att_type" in config:
        config["pos_att_type"] = tuple(config["pos_att_type"])
    return SCHEMES[name](**config)


def _layer_inputs(rng, scheme, with_bias: bool) -> dict:
    """x, the projections and the scheme's learned parameters, drawn at the layer's shapes."""
    layer = MultiHeadAttention(D_MODEL, HEADS, scheme=scheme, bias=with_bias)
    inputs = {"x": _grid(rng, (BATCH, LENGTH, D_MODEL))}
    for name in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"):
        w = getattr(layer, name)
        if w is not None:
            inputs[name] = _grid(rng, w.shape, 1 / np.sqrt(D_MODEL))
    for name, p in scheme.parameters().items():
        inputs[f"scheme.{name}"] = _grid(rng, p.shape, 0.5)
    return inputs


def _layer_cases():
    rng = np.random.default_rng(12)
    cases = []
    for label, name, config, causal in LAYER_SCHEMES:
        with_bias = name == "deberta"
        for chunks in ([LENGTH],) + (([3, 1, 1, 2],) if label in CACHED else ()):
            cached = len(chunks) > 1
            inputs = _layer_inputs(rng, _scheme(name, config), with_bias)
            params = {"d_model": D_MODEL, "num_heads": HEADS, "bias": with_bias, "scheme": name,
                      "scheme_config": config, "causal": causal, "chunks": chunks}
            note = (f"MultiHeadAttention with {name}; " + ("the input fed through a KV cache in chunks "
                    f"{chunks}, outputs concatenated" if cached else "one forward pass, positions 0 ... T-1"))
            cases.append(_case(f"{label}_cached" if cached else label, note, inputs, params, tol()))
    for label, scheme_label, causal, with_bias, padding, chunks in LAYER_MORE:
        name, config = SCHEME_CONFIGS[scheme_label]
        inputs = _layer_inputs(rng, _scheme(name, config), with_bias)
        notes = [f"MultiHeadAttention with {name}", "causal" if causal else "no causal mask"]
        if with_bias:
            notes.append("bias=True: bq, bk, bv, bo added after the projections")
        if padding:
            inputs["mask"] = _padding(padding)
            notes.append(PADDING_NOTE[padding])
        if len(chunks) > 1:
            notes.append(f"fed through a KV cache in chunks {chunks}, each chunk given the mask of the keys so far")
        params = {"d_model": D_MODEL, "num_heads": HEADS, "bias": with_bias, "scheme": name,
                  "scheme_config": config, "causal": causal, "chunks": chunks}
        cases.append(_case(label, "; ".join(notes), inputs, params, tol()))
    return cases


def _set_weights(layer, inputs, weights, extra=()):
    """Set ``layer``'s ``weights`` (names; ``scheme.<p>`` for the scheme's) from ``inputs``; any other
    input name than ``x`` and ``extra`` is refused, so a file cannot reach other attributes."""
    known = set(weights) | {"x"} | set(extra)
    if set(inputs) - known:
        raise ValueError(f"inputs: unknown names {sorted(set(inputs) - known)}; the layer takes {sorted(known)}")
    for name in set(weights) & set(inputs):
        target, attr = (layer.scheme, name[7:]) if name.startswith("scheme.") else (layer, name)
        setattr(target, attr, inputs[name])
    return layer


def _build_layer(inputs, params, extra=()):
    """The layer and scheme of a case, its weights set from ``inputs`` (names beyond them: ``extra``)."""
    scheme = _scheme(params["scheme"], params["scheme_config"])
    layer = MultiHeadAttention(params["d_model"], params["num_heads"], scheme=scheme, bias=params["bias"])
    weights = {"wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"} | {f"scheme.{p}" for p in scheme.parameters()}
    return _set_weights(layer, inputs, weights, extra)


def _key_padding(inputs, B: int, T: int):
    """The case's key padding mask ``(B, T)`` (``True`` = a real token), or None."""
    mask = inputs.get("mask")
    if mask is not None and (mask.dtype != bool or mask.shape != (B, T)):
        raise ValueError(f"inputs.mask must be a bool key padding mask of shape (B, T) = {(B, T)}, got "
                         f"{mask.dtype} {list(mask.shape)}")
    return mask


def _in_chunks(x, chunks, call) -> dict:
    """``{"y": (B, T, d_model)}``: ``call(token_slice)`` on each of ``chunks`` (positive lengths adding
    up to T, checked) of ``x`` in order, the outputs concatenated: a cached layer's prefill and decoding."""
    if (not isinstance(chunks, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                                for n in chunks) or sum(chunks) != x.shape[1]):
        raise ValueError(f"chunks must be a list of positive lengths adding up to T = {x.shape[1]}, "
                         f"got {_short(chunks)}")
    ends = np.cumsum(chunks)
    return {"y": np.concatenate([call(slice(int(e - n), int(e))) for n, e in zip(chunks, ends)], axis=1)}


def _many(chunks) -> bool:
    """More than one chunk: the case runs through a KV cache."""
    return isinstance(chunks, list) and len(chunks) > 1


def _layer_run(inputs, params):
    layer = _build_layer(inputs, params, extra=("mask",))
    x, mask = inputs["x"], _key_padding(inputs, *inputs["x"].shape[:2])
    cache = layer.new_cache() if _many(params["chunks"]) else None
    return _in_chunks(x, params["chunks"], lambda t: layer(                # mask (B, S): cached and new keys
        x[:, t], mask=None if mask is None else mask[:, :t.stop], causal=params["causal"], cache=cache))


# --------------------------------------------------------------------------- gradients
#
# Each gradient family records a backward: its inputs are the forward's inputs plus the gradient of
# the forward's output (``dout``, ``dy``, ``dbias``), its outputs the gradients of the inputs.

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


def _layer_grad_cases():
    rng = np.random.default_rng(22)
    cases = []
    runs = [(label, label, causal, name == "deberta", None) for label, name, _, causal in LAYER_SCHEMES]
    runs += [(f"{label}_{'bidirectional' if causal else 'causal'}_padded", label, not causal, name == "deberta",
              "right" if causal else "left") for label, name, _, causal in LAYER_SCHEMES]
    runs += [("nope_bias", "nope", False, True, None), ("rope_half_bias_padded", "rope_half", True, True, "left"),
             ("t5_encoder_bias_padded", "t5_encoder", False, True, "right")]
    for label, scheme_label, causal, with_bias, padding in runs:
        name, config = SCHEME_CONFIGS[scheme_label]
        inputs = _layer_inputs(rng, _scheme(name, config), with_bias)
        inputs["dy"] = _grid(rng, (BATCH, LENGTH, D_MODEL))
        notes = [f"layer.backward(ctx, dy) of MultiHeadAttention with {name}", "causal" if causal else
                 "no causal mask"]
        if with_bias:
            notes.append("bias=True")
        if padding:
            inputs["mask"] = _padding(padding)
            notes.append(PADDING_NOTE[padding])
        params = {"d_model": D_MODEL, "num_heads": HEADS, "bias": with_bias, "scheme": name,
                  "scheme_config": config, "causal": causal}
        cases.append(_case(label, "; ".join(notes), inputs, params))
    return cases


def _layer_grad_run(inputs, params):
    layer = _build_layer(inputs, params, extra=("dy", "mask"))
    x = inputs["x"]
    mask = _key_padding(inputs, *x.shape[:2])
    _, ctx = layer(x, mask=mask, causal=params["causal"], return_context=True)
    grads = layer.backward(ctx, inputs["dy"])
    order = ["x", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"]
    return {k: grads[k] for k in order + sorted(set(grads) - set(order)) if k in grads}


# --------------------------------------------------------------------------- multimodal RoPE (M-RoPE)

MROPE_TYPES = [0] * 2 + [1] * 6 + [0] * 2 + [1] * 3 + [0] * 2   # text, image 1x4x6, text, image 1x6x2, text
MROPE_IMAGES = [[1, 4, 6], [1, 6, 2]]
MROPE_LAYERS = (("qwen2_vl_split", [2, 1, 1], False), ("qwen3_vl_interleaved", [2, 1, 1], True))


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
    return [_case(label, f"{what}; angle of pair i = positions[stream(i)] * base^(-2i/D), {note}; positions of "
                  "text, two images, text and two decoded tokens",
                  {name: _grid(rng, (2, pos.shape[1], 2 * sum(section))), "positions": pos},
                  {"mrope_section": section, "interleaved": inter, "base": 10000.0})
            for label, section, inter, note in specs]


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
    for label, section, inter in MROPE_LAYERS:
        config = {"mrope_section": section, "interleaved": inter}
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
    return cases


def _mrope_layer_run(inputs, params):
    layer = _build_layer(inputs, params, extra=("positions",))
    x, pos = inputs["x"], inputs["positions"]
    cache = layer.new_cache() if _many(params["chunks"]) else None
    return _in_chunks(x, params["chunks"], lambda t: layer(x[:, t], positions=pos[:, t], causal=True, cache=cache))


# --------------------------------------------------------------------------- iRoPE (Llama 4, SmolLM3)
#
# NoPE layers with Llama 4's attention temperature, and chunked attention (attention_chunk), through the
# layer: forward passes (one pass and fed through a KV cache) and the layer's backward.

IROPE_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}
# (label, scheme name, scheme config, attention_chunk, causal)
IROPE_SCHEMES = (
    ("nope_temperature", "nope-temperature", {"attn_scale": 0.5, "floor_scale": 2}, None, True),
    ("nope_temperature_float32", "nope-temperature", {"attn_scale": 0.1, "floor_scale": 3, "float32": True}, None,
     True),
    ("rope_interleaved_llama3_chunked", "rope", {"layout": "interleaved", "scaling": IROPE_LLAMA3}, 3, True),
    ("nope_temperature_chunked", "nope-temperature", {"attn_scale": 0.5, "floor_scale": 2}, 4, True),
    ("nope_chunked_bidirectional", "nope", {}, 3, False),
)


def _irope_params(name, config, chunk, causal, **more):
    return {"d_model": D_MODEL, "num_heads": HEADS, "bias": False, "scheme": name, "scheme_config": config,
            "attention_chunk": chunk, "causal": causal, **more}


def _irope_note(name, config, chunk, causal):
    notes = [f"MultiHeadAttention with {name} {config}", "causal" if causal else "no causal mask"]
    if chunk is not None:
        notes.append(f"attention_chunk={chunk}: query i sees key j only if i // {chunk} == j // {chunk}")
    return notes


def _irope_layer_cases():
    rng = np.random.default_rng(23)
    cases = []
    for label, name, config, chunk, causal in IROPE_SCHEMES:
        for chunks in ([LENGTH],) + (([3, 1, 1, 2],) if causal else ()):
            inputs = _layer_inputs(rng, _scheme(name, config), False)
            notes = _irope_note(name, config, chunk, causal)
            notes.append("one forward pass, positions 0 ... T-1" if len(chunks) == 1 else
                         f"the input fed through a KV cache in chunks {chunks}, outputs concatenated")
            cases.append(_case(label if len(chunks) == 1 else f"{label}_cached", "; ".join(notes), inputs,
                               _irope_params(name, config, chunk, causal, chunks=chunks), tol()))
    return cases


def _irope_build(inputs, params, extra=()):
    """The layer of an iRoPE case (``attention_chunk`` from the params), its weights set from ``inputs``."""
    scheme = _scheme(params["scheme"], params["scheme_config"])
    layer = MultiHeadAttention(params["d_model"], params["num_heads"], scheme=scheme, bias=params["bias"],
                               attention_chunk=params["attention_chunk"])
    return _set_weights(layer, inputs, {"wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"}, extra)


def _irope_layer_run(inputs, params):
    layer = _irope_build(inputs, params)
    x, chunks = inputs["x"], params["chunks"]
    cache = layer.new_cache() if _many(chunks) else None
    return _in_chunks(x, chunks, lambda t: layer(x[:, t], causal=params["causal"], cache=cache))


def _mrope_layer_grad_run(inputs, params):
    layer = _build_layer(inputs, params, extra=("positions", "dy"))
    _, ctx = layer(inputs["x"], positions=inputs["positions"], causal=True, return_context=True)
    grads = layer.backward(ctx, inputs["dy"])
    return {k: grads[k] for k in ["x", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"]}


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


# (label, max_relative_position, causal, bias, key padding, chunks)
SHAW_LAYER = (
    ("bidirectional_k2", 2, False, False, None, [LENGTH]),
    ("causal_k2", 2, True, False, None, [LENGTH]),
    ("causal_k2_cached", 2, True, False, None, [3, 1, 1, 2]),
    ("bidirectional_k1_bias_padded", 1, False, True, "right", [LENGTH]),
    ("causal_k8_left_padded", 8, True, False, "left", [LENGTH]),
)


def _shaw_layer_cases(grad: bool):
    rng = np.random.default_rng(26 if grad else 25)
    cases = []
    for label, k, causal, with_bias, padding, chunks in SHAW_LAYER:
        if grad and len(chunks) > 1:
            continue
        config = {"max_relative_position": k}
        inputs = _layer_inputs(rng, _scheme("shaw", config), with_bias)
        notes = [("layer.backward(ctx, dy) of " if grad else "") + f"MultiHeadAttention with Shaw (k = {k}): "
                 "logits q_i . (k_j + w_k[clip(j - i, k) + k]) / sqrt(D), output sum_j p_ij (v_j + w_v[...])",
                 "causal" if causal else "no causal mask"]
        if with_bias:
            notes.append("bias=True")
        if padding:
            inputs["mask"] = _padding(padding)
            notes.append(PADDING_NOTE[padding])
        if len(chunks) > 1:
            notes.append(f"fed through a KV cache in chunks {chunks}")
        if grad:
            inputs["dy"] = _grid(rng, (BATCH, LENGTH, D_MODEL))
        params = {"d_model": D_MODEL, "num_heads": HEADS, "bias": with_bias, "scheme": "shaw",
                  "scheme_config": config, "causal": causal, **({} if grad else {"chunks": chunks})}
        cases.append(_case(label, "; ".join(notes), inputs, params))
    return cases


def _irope_grad_cases():
    rng = np.random.default_rng(24)
    cases = []
    for label, name, config, chunk, causal in IROPE_SCHEMES:
        inputs = _layer_inputs(rng, _scheme(name, config), False)
        inputs["dy"] = _grid(rng, (BATCH, LENGTH, D_MODEL))
        notes = ["layer.backward(ctx, dy)"] + _irope_note(name, config, chunk, causal)
        cases.append(_case(label, "; ".join(notes), inputs, _irope_params(name, config, chunk, causal)))
    return cases


def _irope_grad_run(inputs, params):
    layer = _irope_build(inputs, params, extra=("dy",))
    _, ctx = layer(inputs["x"], causal=params["causal"], return_context=True)
    grads = layer.backward(ctx, inputs["dy"])
    return {k: grads[k] for k in ("x", "wq", "wk", "wv", "wo")}


# --------------------------------------------------------------------------- local/global layers
#
# Sliding windows, a scale override, grouped-query heads and attention sinks through the layer
# (Mistral, Gemma 3's local and global layers, gpt-oss). Params beyond the ``layer`` family's:
# ``num_kv_heads``, ``sliding_window`` (null: none), ``scale`` (null: the scheme's), ``sinks``
# (then ``inputs.sinks`` ``(H,)``), ``mem_len`` of the cache (null: keep every key).

GEMMA3_LOCAL = ("rope", {"layout": "half", "base": 10000.0})
GEMMA3_GLOBAL = ("rope", {"layout": "half", "scaling": {"rope_type": "linear", "factor": 8.0,
                                                         "rope_theta": 1000000.0}})
# (label, (scheme, config), num_kv_heads, bias, sliding_window, scale, sinks, padding, chunks, mem_len)
LOCAL_GLOBAL = (
    ("window3_rope_half", SCHEME_CONFIGS["rope_half"], HEADS, False, 3, None, False, None, [LENGTH], None),
    ("window3_rope_half_rolling_cache", SCHEME_CONFIGS["rope_half"], HEADS, False, 3, None, False, None,
     [3, 1, 1, 2], 2),
    ("window2_alibi_left_padded", SCHEME_CONFIGS["alibi"], HEADS, False, 2, None, False, "left", [LENGTH], None),
    ("gemma3_local_gqa", GEMMA3_LOCAL, 1, False, 3, 0.25, False, None, [LENGTH], None),
    ("gemma3_global_gqa", GEMMA3_GLOBAL, 1, False, None, 0.25, False, None, [LENGTH], None),
    ("sinks_rope_half_bias", SCHEME_CONFIGS["rope_half"], 1, True, None, None, True, None, [LENGTH], None),
    ("sinks_window3_rolling_cache", SCHEME_CONFIGS["rope_half"], 1, True, 3, None, True, None, [3, 1, 1, 2], 2),
    ("sinks_left_padded", SCHEME_CONFIGS["rope_half"], HEADS, False, None, None, True, "left", [LENGTH], None),
)


def _local_global_layer(params):
    return MultiHeadAttention(params["d_model"], params["num_heads"], scheme=_scheme(params["scheme"],
                              params["scheme_config"]), bias=params["bias"], num_kv_heads=params["num_kv_heads"],
                              sliding_window=params["sliding_window"], scale=params["scale"], sinks=params["sinks"])


def _local_global_cases(grad: bool = False):
    rng = np.random.default_rng(23 if grad else 24)
    cases = []
    for label, (name, config), kv, with_bias, window, scale, sinks, padding, chunks, mem_len in LOCAL_GLOBAL:
        if grad and len(chunks) > 1:
            continue
        params = {"d_model": D_MODEL, "num_heads": HEADS, "num_kv_heads": kv, "bias": with_bias, "scheme": name,
                  "scheme_config": config, "causal": True, "sliding_window": window, "scale": scale,
                  "sinks": sinks}
        if not grad:
            params.update({"chunks": chunks, "mem_len": mem_len})
        layer = _local_global_layer(params)
        inputs = {"x": _grid(rng, (BATCH, LENGTH, D_MODEL))}
        for w in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"):
            if getattr(layer, w) is not None:
                inputs[w] = _grid(rng, getattr(layer, w).shape, 1 / np.sqrt(D_MODEL))
        notes = [("layer.backward(ctx, dy) of " if grad else "") + f"MultiHeadAttention with {name}, causal"]
        if window:
            notes.append(f"sliding_window={window}: query i sees keys i - {window} < j <= i")
        if scale is not None:
            notes.append(f"scale={scale} in place of 1/sqrt(D)")
        if kv != HEADS:
            notes.append(f"num_kv_heads={kv}")
        if sinks:
            inputs["sinks"] = _grid(rng, (HEADS,))
            notes.append("sinks: a per-head logit column appended before the softmax, dropped after")
        if padding:
            inputs["mask"] = _padding(padding)
            notes.append(PADDING_NOTE[padding])
        if len(chunks) > 1:
            notes.append(f"fed through a KV cache of mem_len={mem_len} in chunks {chunks}")
        if grad:
            inputs["dy"] = _grid(rng, (BATCH, LENGTH, D_MODEL))
        cases.append(_case(label, "; ".join(notes), inputs, params, tol()))
    if not grad:                                                     # StreamingLLM: positions within the cache
        name, config = SCHEME_CONFIGS["rope_half"]
        params = {"d_model": D_MODEL, "num_heads": HEADS, "num_kv_heads": HEADS, "bias": False, "scheme": name,
                  "scheme_config": config, "causal": True, "sliding_window": None, "scale": None, "sinks": False,
                  "chunks": [2, 1, 1, 1, 1, 1], "mem_len": None, "streaming": {"num_sinks": 1, "window": 3}}
        layer = _local_global_layer(params)
        inputs = {"x": _grid(rng, (BATCH, LENGTH, D_MODEL))}
        inputs.update({w: _grid(rng, getattr(layer, w).shape, 1 / np.sqrt(D_MODEL)) for w in ("wq", "wk", "wv", "wo")})
        note = ("MultiHeadAttention with rope, causal, through StreamingLLM's cache (minipos.streaming.StreamingCache, "
                "num_sinks=1, window=3) in chunks [2, 1, 1, 1, 1, 1]: a step sees token 0 and the last 3 tokens, "
                "its own included, at positions counted within the cache (token 6 at position 3)")
        cases.append(_case("streaming_sinks1_window3_rope_half", note, inputs, params, tol()))
    return cases


def _local_global_build(inputs, params, extra):
    layer = _local_global_layer(params)
    weights = {w for w in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "sinks") if getattr(layer, w) is not None}
    _set_weights(layer, inputs, weights, ("mask", *extra))
    return layer, _key_padding(inputs, *inputs["x"].shape[:2])


def _local_global_run(inputs, params):
    layer, mask = _local_global_build(inputs, params, ())
    x = inputs["x"]
    cache = layer.new_cache(mem_len=params["mem_len"]) if _many(params["chunks"]) else None
    if params.get("streaming") is not None:
        cache = StreamingCache(layer, **params["streaming"])

    def step(t):
        held = 0 if cache is None else cache.length                             # the keys the cache kept
        keys = None if mask is None else mask[:, t.start - held:t.stop]          # (B, S)
        return layer(x[:, t], mask=keys, causal=True, cache=cache)
    return _in_chunks(x, params["chunks"], step)


def _local_global_grad_run(inputs, params):
    layer, mask = _local_global_build(inputs, params, ("dy",))
    _, ctx = layer(inputs["x"], mask=mask, causal=True, return_context=True)
    grads = layer.backward(ctx, inputs["dy"])
    order = ["x", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "sinks"]
    return {k: grads[k] for k in order if k in grads}


# --------------------------------------------------------------------------- multi-head latent attention

MLA_CONFIGS = (  # (label, q_lora_rank or None, scheme_config, bias, causal, chunks)
    ("q_lora_interleaved", 4, {"layout": "interleaved"}, False, True, [LENGTH]),
    ("q_lora_interleaved_cached", 4, {"layout": "interleaved"}, False, True, [3, 1, 1, 2]),
    ("no_q_lora_half", None, {"layout": "half"}, False, True, [LENGTH]),
    ("q_lora_yarn_mscale_bias", 4, {"layout": "interleaved", "scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4, "mscale": 1.0,
        "mscale_all_dim": 0.5}}, True, True, [LENGTH]),
    ("no_q_lora_bidirectional", None, {"layout": "interleaved"}, False, False, [LENGTH]),
)
MLA_DIMS = {"kv_lora_rank": 3, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 3}


def _mla_params(q_lora_rank, config, with_bias, causal):
    params = {"d_model": D_MODEL, "num_heads": HEADS, **MLA_DIMS, "bias": with_bias, "scheme_config": config,
              "causal": causal}
    return params if q_lora_rank is None else {**params, "q_lora_rank": q_lora_rank}


def _build_mla(inputs, params, extra=()):
    """The MLA layer of a case, its weights set from ``inputs`` (names beyond them: ``extra``)."""
    config = dict(params["scheme_config"])
    layer = MultiHeadLatentAttention(params["d_model"], params["num_heads"], bias=params["bias"],
                                     q_lora_rank=params.get("q_lora_rank"), scheme=DecoupledRotary(**config),
                                     **{k: params[k] for k in MLA_DIMS})
    return _set_weights(layer, inputs, layer.weights(), extra)


def _mla_inputs(rng, params):
    layer = _build_mla({}, params)
    inputs = {"x": _grid(rng, (BATCH, LENGTH, D_MODEL))}
    for name, w in layer.weights().items():
        inputs[name] = _grid(rng, w.shape, 0.5) + (1.0 if name.endswith("_norm") else 0.0)
    return inputs


def _mla_cases():
    rng = np.random.default_rng(23)
    cases = []
    for label, q_lora_rank, config, with_bias, causal, chunks in MLA_CONFIGS:
        params = {**_mla_params(q_lora_rank, config, with_bias, causal), "chunks": chunks}
        notes = ["MultiHeadLatentAttention (DeepSeek-V2/V3 MLA, decoupled RoPE)",
                 "q = heads(x wq)" if q_lora_rank is None else "q = heads(RMSNorm(x wq_a) wq_b)",
                 f"RoPE layout {config['layout']}", "causal" if causal else "no causal mask"]
        if "scaling" in config:
            notes.append("YaRN: mscale/mscale_all_dim on cos and sin, mscale_all_dim^2 on the softmax scale")
        if with_bias:
            notes.append("bias=True: bq_a, bkv_a, bo")
        if len(chunks) > 1:
            notes.append(f"fed through a KV cache in chunks {chunks}, outputs concatenated")
        cases.append(_case(label, "; ".join(notes), _mla_inputs(rng, params), params, tol()))
    return cases


def _mla_run(inputs, params):
    layer = _build_mla(inputs, params)
    x, chunks = inputs["x"], params["chunks"]
    cache = layer.new_cache() if _many(chunks) else None
    return _in_chunks(x, chunks, lambda t: layer(x[:, t], causal=params["causal"], cache=cache))


def _mla_grad_cases():
    rng = np.random.default_rng(24)
    cases = []
    for label, q_lora_rank, config, with_bias, causal, chunks in MLA_CONFIGS:
        if len(chunks) > 1:
            continue
        params = _mla_params(q_lora_rank, config, with_bias, causal)
        inputs = _mla_inputs(rng, params)
        inputs["dy"] = _grid(rng, (BATCH, LENGTH, D_MODEL))
        note = (f"layer.backward(ctx, dy) of MultiHeadLatentAttention, RoPE layout {config['layout']}"
                + (", YaRN" if "scaling" in config else "") + (", bias=True" if with_bias else "")
                + ("" if causal else ", no causal mask"))
        cases.append(_case(label, note, inputs, params))
    return cases


def _mla_grad_run(inputs, params):
    layer = _build_mla(inputs, params, extra=("dy",))
    _, ctx = layer(inputs["x"], causal=params["causal"], return_context=True)
    grads = layer.backward(ctx, inputs["dy"])
    return {k: grads[k] for k in ["x", *layer.weights()]}


# --------------------------------------------------------------------------- the registry

FAMILIES = {
    "sinusoidal_table": Family("minipos.sinusoidal.sinusoidal_table", "absolute sinusoidal tables (T, D) "
                               "in the three layouts", _sinusoidal_cases, _sinusoidal_run),
    "alibi_slopes": Family("minipos.alibi.alibi_slopes", "ALiBi slopes (H,) for powers of two and other "
                           "head counts", _alibi_slopes_cases, _alibi_slopes_run),
    "alibi_bias": Family("minipos.alibi.alibi_bias", "ALiBi biases (H, T, S): -m (i - j), or -m |i - j| "
                         "when symmetric", _alibi_bias_cases, _alibi_bias_run),
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
}


# --------------------------------------------------------------------------- export

def _recordable(value, mask) -> np.ndarray:
    """An output as written: a value that is not compared (``mask`` False) and not finite is written as 0.

    JSON has no infinity; the one such value minipos returns is the ``-inf`` log-sum-exp of a row
    with no allowed key, which its case's ``where`` leaves out.
    """
    value = np.asarray(value)
    if mask is None or not np.issubdtype(value.dtype, np.floating):
        return value
    return np.where(mask | np.isfinite(value), value, 0.0)


def _encode_case(case: dict, expected: dict) -> dict:
    where = case.get("where", {})
    out = {"name": case["name"], "description": case["description"], "params": case["params"],
           "inputs": {k: encode(v) for k, v in case["inputs"].items()},
           "expected": {k: encode(_recordable(v, where.get(k))) for k, v in expected.items()}}
    if "where" in case:
        out["where"] = {k: encode(v) for k, v in case["where"].items()}
    out["tolerance"] = case["tolerance"]
    return out


def _check_family(name, argname: str = "name") -> str:
    """``name`` if it is a known family, else raise naming ``argname`` and the known families."""
    if not isinstance(name, str):
        raise TypeError(f"{argname} must be a family name (str), got {type(name).__name__} {_short(name)}")
    if name not in FAMILIES:
        raise ValueError(f"{argname}: unknown family {_short(name)}; the families are {sorted(FAMILIES)}")
    return name


def _check_families(families) -> list:
    """The family names to work on: every family for ``None``, else the given names, checked."""
    if families is None:
        return list(FAMILIES)
    if isinstance(families, (str, bytes)):
        raise TypeError(f"families must be a list of family names such as ['rope'], not the "
                        f"{type(families).__name__} {_short(families)}")
    try:
        names = list(families)
    except TypeError:
        raise TypeError(f"families must be a list of family names, got {type(families).__name__}") from None
    if not names:
        raise ValueError("families must name at least one family (None means every family)")
    for name in names:
        _check_family(name, "families")
    if len(set(names)) != len(names):
        raise ValueError(f"families lists a family twice: {names}")
    return names


def _check_directory(directory) -> str:
    """``directory`` as a str path, or raise ``TypeError`` naming the argument."""
    if not isinstance(directory, (str, os.PathLike)) or not isinstance(os.fspath(directory), str):
        raise TypeError(f"directory must be a path (str or os.PathLike), got {type(directory).__name__} "
                        f"{_short(directory)}")
    directory = os.fspath(directory)
    if not directory:
        raise ValueError("directory must be a non-empty path")
    return directory


def family_cases(name: str) -> list:
    """The cases of family ``name`` as built (arrays, not yet run), float32 tolerances filled in."""
    cases = FAMILIES[_check_family(name)].build()
    for case in cases:
        if case["tolerance"]["float32"] is None:
            value = FLOAT32_TOLERANCE.get(f"{name}/{case['name']}", FLOAT32_TOLERANCE[name])
            case["tolerance"] = {**case["tolerance"], "float32": {"rtol": value, "atol": value}}
    return cases


def build_family(name: str) -> dict:
    """The JSON document of family ``name``: every case with its inputs and expected outputs."""
    family = FAMILIES[_check_family(name)]
    cases = [_encode_case(case, family.run(case["inputs"], case["params"])) for case in family_cases(name)]
    doc = {"format": "minipos-vectors", "spec_version": SPEC_VERSION, "minipos_version": __version__,
           "family": name, "function": family.function, "description": family.description, "cases": cases}
    _decode_document(doc, name)  # export writes only what check accepts (schema, caps, unique names)
    return doc


def _dumps(obj, level: int = 0) -> str:
    """JSON with one key per line, and lists of scalars (array data, shapes) on a single line."""
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k)}: {_dumps(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return "[\n" + ",\n".join(inner + _dumps(v, level + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj, allow_nan=False)  # floats as repr: the shortest exact float64 string


_TEMP_FILE = re.compile(r"^\.[a-z0-9_]+\.json\.[0-9]+\.[0-9a-f]{8}\.tmp$")  # .rope.json.<pid>.<hex>.tmp


def _family_files() -> set:
    return {f"{name}.json" for name in FAMILIES}


def _check_export_target(directory: str) -> None:
    """Raise unless ``directory`` is absent, or a directory of family files (and export's temp files)."""
    if not os.path.lexists(directory):
        return
    if not os.path.isdir(directory):
        raise ValueError(f"directory {directory!r} exists and is not a directory")
    known = _family_files()
    strangers = sorted(e for e in os.listdir(directory) if not (_TEMP_FILE.match(e) or (
        e in known and not os.path.isdir(os.path.join(directory, e)))))
    if strangers:
        listed = ", ".join(strangers[:5]) + (f" and {len(strangers) - 5} more" if len(strangers) > 5 else "")
        raise ValueError(f"directory {directory!r} holds {listed}, which are not golden-vector family files; "
                         "export into a new or empty directory, or into a vectors directory")


def _write_temp(directory: str, name: str, text: str) -> str:
    """``text`` in a new hidden file beside ``<name>.json``, flushed to disk; return its path."""
    path = os.path.join(directory, f".{name}.json.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        _remove(path)
        raise
    return path


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _sync_directory(directory: str) -> None:
    """Flush the directory entry of renamed files to disk (POSIX; elsewhere a no-op)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def export(directory, families=None) -> list:
    """Write ``<family>.json`` for each family (default: all) into ``directory``; return the paths.

    Atomic per file: every family is built in memory first, written to a hidden temp file in
    ``directory`` (``.<family>.json.<pid>.<hex>.tmp``) and moved over its target with
    ``os.replace``, so an export that fails or is killed leaves each file either as it was or
    complete and new, never truncated. Temp files left by a killed export are removed by the next
    export and ignored by ``check``. ``directory`` must be absent, empty, or hold only family
    files (``ValueError`` otherwise); an unknown family raises before anything is written.
    """
    directory = _check_directory(directory)
    names = _check_families(families)
    _check_export_target(directory)
    texts = {name: _dumps(build_family(name)) + "\n" for name in names}  # may fail: nothing written yet
    os.makedirs(directory, exist_ok=True)
    for entry in os.listdir(directory):
        if _TEMP_FILE.match(entry):  # left by an export that was killed
            _remove(os.path.join(directory, entry))
    temps, paths = {}, []
    try:
        for name, text in texts.items():
            temps[name] = _write_temp(directory, name, text)
        for name in names:
            path = os.path.join(directory, f"{name}.json")
            os.replace(temps.pop(name), path)
            paths.append(path)
    finally:
        for path in temps.values():
            _remove(path)
    _sync_directory(directory)
    return paths


# --------------------------------------------------------------------------- reading a spec safely

MAX_FILE_BYTES = 64 * 2**20  # a family file larger than this is refused before it is read
MAX_DEPTH = 64               # JSON nesting (the format needs under 10)
MAX_TOLERANCE = {"float64": 1e-6, "float32": 1e-2}  # largest rtol and atol a case may carry

SCHEMA = {  # spec/schema.json, which a test keeps equal to this
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "minipos-vectors/1.0.0/schema.json",
    "title": "minipos golden vectors: one family of cases",
    "description": "One file per family (one function). Each case gives keyword parameters, input arrays, "
                   "expected output arrays and the tolerances for float64 and float32 ports. See spec/README.md.",
    "type": "object",
    "required": ["format", "spec_version", "minipos_version", "family", "function", "description", "cases"],
    "additionalProperties": False,
    "properties": {
        "format": {"const": "minipos-vectors"},
        "spec_version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"},
        "minipos_version": {"type": "string"},
        "family": {"type": "string", "pattern": "^[a-z0-9_]+$"},
        "function": {"type": "string", "description": "The minipos function whose behaviour the family records."},
        "description": {"type": "string"},
        "cases": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/case"}},
    },
    "$defs": {
        "case": {
            "type": "object",
            "required": ["name", "description", "params", "inputs", "expected", "tolerance"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_]+$"},
                "description": {"type": "string"},
                "params": {"type": "object", "description": "Keyword arguments: JSON numbers, strings, booleans, "
                                                            "null, lists and objects."},
                "inputs": {"type": "object", "additionalProperties": {"$ref": "#/$defs/array"}},
                "expected": {"type": "object", "minProperties": 1, "additionalProperties": {"$ref": "#/$defs/array"}},
                "where": {
                    "type": "object",
                    "description": "Optional, per output: a boolean array of the output's shape; compare only "
                                   "where it is true.",
                    "additionalProperties": {"$ref": "#/$defs/array"},
                },
                "tolerance": {
                    "type": "object",
                    "required": ["float64", "float32"],
                    "additionalProperties": False,
                    "properties": {
                        "float64": {"$ref": "#/$defs/tolerance_float64"},
                        "float32": {"$ref": "#/$defs/tolerance_float32"},
                    },
                },
            },
        },
        **{f"tolerance_{precision}": {
            "type": "object",
            "description": ("For a float64 port. A value matches when |got - expected| <= atol + rtol * |expected|; "
                            "0 and 0 mean equal. At most 1e-6 each." if precision == "float64" else
                            "For a float32 port, compared as for float64. At most 1e-2 each."),
            "required": ["rtol", "atol"],
            "additionalProperties": False,
            "properties": {key: {"type": "number", "minimum": 0, "maximum": cap} for key in ("rtol", "atol")},
        } for precision, cap in MAX_TOLERANCE.items()},
        "array": {
            "type": "object",
            "description": "An n-dimensional array: data in row-major (C) order; shape [] is a scalar.",
            "required": ["dtype", "shape", "data"],
            "additionalProperties": False,
            "properties": {
                "dtype": {"enum": list(ENCODED_DTYPES)},
                "shape": {"type": "array", "maxItems": MAX_NDIM, "items": {"type": "integer", "minimum": 0}},
                "data": {"type": "array", "items": {"type": ["number", "boolean"]}},
            },
        },
    },
}


class SpecError(ValueError):
    """A vectors file that ``check`` cannot trust: unreadable, malformed, or not what its name says."""


_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
               "number": (int, float), "integer": int}
_ANNOTATIONS = {"$schema", "$id", "$defs", "title", "description"}
SCHEMA_KEYWORDS = _ANNOTATIONS | {"$ref", "type", "const", "enum", "pattern", "minimum", "maximum", "required",
                                  "properties", "additionalProperties", "minProperties", "minItems", "maxItems",
                                  "items"}


def _type_is(kind: type, name: str) -> bool:
    """Whether values of Python type ``kind`` (as ``json`` parses them) are JSON Schema type ``name``."""
    return issubclass(kind, _JSON_TYPES[name]) and not (name in ("number", "integer") and issubclass(kind, bool))


def _json_name(value) -> str:
    return next((n for n in ("object", "array", "string", "boolean", "null", "integer", "number")
                 if _type_is(type(value), n)), type(value).__name__)


def validate(doc, schema: dict | None = None) -> None:
    """Raise ``SpecError`` at the first place ``doc`` breaks ``schema`` (default: ``SCHEMA``).

    Implements the part of JSON Schema (draft 2020-12) that ``spec/schema.json`` uses (the names
    in ``SCHEMA_KEYWORDS``; local ``$ref`` only), with one strictness more: ``integer`` is a JSON
    number written without a fraction or exponent. The message names the place as a path
    (``$.cases[3].tolerance.float64.rtol``).
    """
    root = SCHEMA if schema is None else schema
    _validate(doc, root, root, "$")


def _validate(value, schema: dict, root: dict, path: str) -> None:
    unknown = set(schema) - SCHEMA_KEYWORDS
    if unknown:
        raise NotImplementedError(f"the schema uses {sorted(unknown)}, which vectors.validate does not implement")
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].rsplit("/", 1)[-1]]
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_type_is(type(value), k) for k in kinds):
            raise SpecError(f"{path}: expected {' or '.join(kinds)}, got {_json_name(value)}")
    if "const" in schema and value != schema["const"]:
        raise SpecError(f"{path}: must be {schema['const']!r}, got {_short(value)}")
    if "enum" in schema and not any(value == v and type(value) is type(v) for v in schema["enum"]):
        raise SpecError(f"{path}: must be one of {schema['enum']}, got {_short(value)}")
    if "pattern" in schema and isinstance(value, str) and not re.search(schema["pattern"], value):
        raise SpecError(f"{path}: {_short(value)} does not match {schema['pattern']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and not value >= schema["minimum"]:  # NaN fails both bounds
            raise SpecError(f"{path}: {value!r} is below the minimum {schema['minimum']!r}")
        if "maximum" in schema and not value <= schema["maximum"]:
            raise SpecError(f"{path}: {value!r} is above the maximum {schema['maximum']!r}")
    if isinstance(value, dict):
        _validate_object(value, schema, root, path)
    if isinstance(value, list):
        _validate_array(value, schema, root, path)


def _validate_object(value: dict, schema: dict, root: dict, path: str) -> None:
    for key in schema.get("required", ()):
        if key not in value:
            raise SpecError(f"{path}: missing required field {key!r}")
    if len(value) < schema.get("minProperties", 0):
        raise SpecError(f"{path}: needs at least {schema['minProperties']} entry, has none")
    for key, item in value.items():
        sub = schema.get("properties", {}).get(key, schema.get("additionalProperties", True))
        if sub is False:
            raise SpecError(f"{path}: unexpected field {_short(key)}")
        if sub is not True:
            _validate(item, sub, root, f"{path}.{key}")


def _validate_array(value: list, schema: dict, root: dict, path: str) -> None:
    if len(value) < schema.get("minItems", 0):
        raise SpecError(f"{path}: needs at least {schema['minItems']} item(s), has {len(value)}")
    if len(value) > schema.get("maxItems", len(value)):
        raise SpecError(f"{path}: has {len(value)} items, more than {schema['maxItems']}")
    items = schema.get("items")
    if items is None:
        return
    if set(items) <= {"type"} | _ANNOTATIONS:  # a type only (array data): check each distinct type once
        kinds = [items["type"]] if isinstance(items["type"], str) else items["type"]
        for kind in set(map(type, value)):
            if not any(_type_is(kind, k) for k in kinds):
                i = next(i for i, v in enumerate(value) if type(v) is kind)
                raise SpecError(f"{path}[{i}]: expected {' or '.join(kinds)}, got {_json_name(value[i])}")
        return
    for i, item in enumerate(value):
        _validate(item, items, root, f"{path}[{i}]")


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a file"


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives
        return False


def _read_regular_file(path: str, root: str) -> bytes:
    """The bytes of ``path``, a regular file within ``root`` (real path) of at most ``MAX_FILE_BYTES``.

    Raises ``FileNotFoundError`` when there is no such entry and ``SpecError`` for a symlink out of
    ``root``, anything but a regular file (a FIFO is opened non-blocking, so it cannot hang the
    read) or a file above the size cap.
    """
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        real = os.path.realpath(path)
        if not _inside(real, root):
            raise SpecError(f"is a symbolic link to {real}, outside the directory")
        path = real
        try:
            info = os.stat(path)
        except OSError as err:
            raise SpecError(f"is a symbolic link to {real}, which cannot be read ({err.strerror})") from None
    if not stat.S_ISREG(info.st_mode):
        raise SpecError(f"is not a regular file ({_file_kind(info.st_mode)})")
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as err:
        raise SpecError(f"cannot be opened ({err.strerror or err})") from None
    try:
        info = os.fstat(fd)  # what was opened, which may not be what was looked at
        if not stat.S_ISREG(info.st_mode):
            raise SpecError(f"is not a regular file ({_file_kind(info.st_mode)})")
        if info.st_size > MAX_FILE_BYTES:
            raise SpecError(f"is {info.st_size} bytes, more than the {MAX_FILE_BYTES} a vectors file may have")
        chunks, size = [], 0
        while size <= MAX_FILE_BYTES:
            chunk = os.read(fd, min(1 << 20, MAX_FILE_BYTES + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > MAX_FILE_BYTES:
        raise SpecError(f"grew while read to more than the {MAX_FILE_BYTES} bytes a vectors file may have")
    return b"".join(chunks)


def _refuse_constant(name: str):
    raise SpecError(f"holds {name}, which is not JSON (numbers must be finite)")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise SpecError(f"holds the number {_short(text)}, which is out of range for float64")
    return value


def _object(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:  # parsers differ on which of two equal keys wins: refuse the ambiguity
            raise SpecError(f"has a duplicate key {_short(key)}")
        out[key] = value
    return out


def _check_depth(doc) -> None:
    """Raise ``SpecError`` if ``doc`` nests lists and objects deeper than ``MAX_DEPTH``."""
    level, depth = [doc] if isinstance(doc, (dict, list)) else [], 0
    while level:  # one level of containers at a time: no recursion, whatever the depth
        depth += 1
        if depth > MAX_DEPTH:
            raise SpecError(f"nests lists and objects deeper than {MAX_DEPTH} levels")
        level = [v for c in level for v in (c.values() if isinstance(c, dict) else c) if isinstance(v, (dict, list))]


def parse(data: bytes):
    """The JSON document in ``data``, or ``SpecError`` saying why it is not one ``check`` reads.

    Strict: UTF-8, standard JSON (no NaN or Infinity, no number beyond float64), no duplicate
    keys, at most ``MAX_DEPTH`` levels of nesting.
    """
    if not data:
        raise SpecError("is empty (0 bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise SpecError(f"is not UTF-8 text (byte {err.start}: {data[err.start:err.start + 1]!r})") from None
    try:
        doc = json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float,
                         object_pairs_hook=_object)
    except RecursionError:
        raise SpecError(f"nests lists and objects deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as err:
        raise SpecError(f"is not valid JSON ({err.msg} at line {err.lineno} column {err.colno}; "
                        "truncated?)") from None
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise SpecError(f"is not JSON minipos reads ({_short(str(err), 120)})") from None
    _check_depth(doc)
    return doc


# --------------------------------------------------------------------------- check

@dataclass(frozen=True)
class Mismatch:
    """One value (or one whole case, when ``index`` is None) that minipos no longer reproduces."""

    family: str
    case: str
    output: str = ""
    index: tuple | None = None
    expected: object = None
    got: object = None
    detail: str = ""

    def __str__(self) -> str:
        where = f"{self.family}/{self.case}" + (f": {self.output}" if self.output else "")
        if self.index is None:
            return f"{where}: {self.detail}"
        return f"{where}{list(self.index)}: expected {self.expected!r}, got {self.got!r}"


@dataclass(frozen=True)
class FamilyCheck:
    """What ``check`` found in one family file: cases run, values compared, and the mismatches."""

    family: str
    path: str
    cases: int = 0
    values: int = 0
    mismatches: tuple = ()

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def __str__(self) -> str:
        counts = f"{self.family}: {self.cases} cases, {self.values} values compared"
        return f"ok   {counts}" if self.ok else f"FAIL {counts}, {len(self.mismatches)} problem(s)"


def compare(family: str, case: str, output: str, expected: np.ndarray, got, tolerance: dict,
            where: np.ndarray | None = None) -> list:
    """Every element of ``got`` outside ``atol + rtol * |expected|`` of ``expected`` (only where ``where``)."""
    got = np.asarray(got)
    if got.shape != expected.shape:
        return [Mismatch(family, case, output, detail=f"shape {list(got.shape)}, expected {list(expected.shape)}")]
    e, g = expected.astype(np.float64), got.astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(g - e) <= tolerance["atol"] + tolerance["rtol"] * np.abs(e))  # NaN counts as bad
    if where is not None:
        bad &= where
    return [Mismatch(family, case, output, tuple(int(i) for i in idx), expected[idx].item(), got[idx].item())
            for idx in np.argwhere(bad).tolist() for idx in [tuple(idx)]]


def _decode_case(case: dict) -> dict:
    """A case (valid against the schema) with its arrays decoded and its masks checked."""
    label = f"case {case['name']!r}"
    out = {"name": case["name"], "params": case["params"], "tolerance": case["tolerance"]}
    for group in ("inputs", "expected", "where"):
        out[group] = {k: decode(v, f"{label}: {group}.{k}") for k, v in case.get(group, {}).items()}
    for name, mask in out["where"].items():
        if name not in out["expected"]:
            raise SpecError(f"{label}: where.{name} masks an output that expected does not have")
        if mask.dtype != bool:
            raise SpecError(f"{label}: where.{name} must be a bool array, got {mask.dtype}")
        if mask.shape != out["expected"][name].shape:
            raise SpecError(f"{label}: where.{name} has shape {list(mask.shape)}, but expected.{name} has "
                            f"{list(out['expected'][name].shape)}")
    for precision, cap in MAX_TOLERANCE.items():
        for key, value in case["tolerance"][precision].items():
            if not 0 <= value <= cap:  # the schema says so too; this holds for documents built in Python
                raise SpecError(f"{label}: tolerance.{precision}.{key} = {value!r} is outside [0, {cap}]")
    return out


def _decode_document(doc, name: str | None = None) -> list:
    """The decoded cases of a family document, or ``SpecError`` if it is not a faithful one.

    ``name`` (the file's stem) must be the document's ``family``; the family must be known, its
    ``function`` the one this minipos records, its major ``spec_version`` this one, and its case
    names unique.
    """
    validate(doc)
    family = doc["family"]
    if name is not None and family != name:
        raise SpecError(f"holds family {family!r}, but its file name says {name!r}")
    if family not in FAMILIES:
        raise SpecError(f"holds family {family!r}, which this minipos does not know; the families are "
                        f"{sorted(FAMILIES)}")
    if doc["function"] != FAMILIES[family].function:
        raise SpecError(f"says function {_short(doc['function'])}, but family {family!r} records "
                        f"{FAMILIES[family].function}")
    if doc["spec_version"].split(".")[0] != SPEC_VERSION.split(".")[0]:
        raise SpecError(f"has spec_version {doc['spec_version']!r}; this minipos reads {SPEC_VERSION}")
    seen = set()
    for case in doc["cases"]:
        if case["name"] in seen:
            raise SpecError(f"has a duplicate case name {case['name']!r}")
        seen.add(case["name"])
    return [_decode_case(case) for case in doc["cases"]]


def _run_case(family: str, case: dict, precision: str = "float64") -> tuple:
    """``(mismatches, values compared)`` of one decoded case, run with the installed minipos."""
    name = case["name"]
    try:
        got = FAMILIES[family].run(case["inputs"], case["params"])
    except Exception as err:  # a case that now raises is a mismatch, reported with the error
        return [Mismatch(family, name, detail=f"raised {type(err).__name__}: {err}")], 0
    out, values = [], 0
    for output, expected in case["expected"].items():
        if output not in got:
            out.append(Mismatch(family, name, output, detail="output missing"))
            continue
        mask = case["where"].get(output)
        values += expected.size if mask is None else int(np.count_nonzero(mask))
        out += compare(family, name, output, expected, got[output], case["tolerance"][precision], mask)
    for output in got:
        if output not in case["expected"]:
            out.append(Mismatch(family, name, output, detail="returned but not recorded in expected"))
    if values == 0:
        out.append(Mismatch(family, name, detail="compares no values (every output empty or masked out)"))
    return out, values


def check_case(family: str, case: dict, precision: str = "float64") -> list:
    """Run one case (as written in a family file) with the installed minipos; return its mismatches."""
    _check_family(family, "family")
    if precision not in MAX_TOLERANCE:
        raise ValueError(f"precision must be one of {list(MAX_TOLERANCE)}, got {_short(precision)}")
    _validate(case, SCHEMA["$defs"]["case"], SCHEMA, "$")
    return _run_case(family, _decode_case(case), precision)[0]


def _check_decoded(family: str, path: str, cases: list) -> FamilyCheck:
    mismatches, values = [], 0
    for case in cases:
        found, n = _run_case(family, case)
        mismatches += found
        values += n
    if values == 0:
        mismatches.append(Mismatch(family, "-", detail="0 values compared; a family must compare at least one value"))
    return FamilyCheck(family, path, len(cases), values, tuple(mismatches))


def check_document(doc) -> list:
    """Every mismatch of one family document (as written by ``export``), or why it cannot be checked."""
    try:
        cases = _decode_document(doc)
    except (SpecError, ValueError, TypeError) as err:
        family = doc.get("family") if isinstance(doc, dict) and isinstance(doc.get("family"), str) else "?"
        return [Mismatch(family, "-", detail=str(err))]
    return list(_check_decoded(doc["family"], "", cases).mismatches)


def _check_file(directory: str, root: str, name: str) -> FamilyCheck:
    """Read, validate and recompute ``<name>.json``; every problem is a mismatch naming the file."""
    path = os.path.join(directory, f"{name}.json")
    try:
        cases = _decode_document(parse(_read_regular_file(path, root)), name)
    except FileNotFoundError:
        return FamilyCheck(name, path, mismatches=(Mismatch(name, "-", detail=f"no file {path}"),))
    except OSError as err:
        return FamilyCheck(name, path, mismatches=(Mismatch(name, "-", detail=f"{path}: cannot be read "
                                                                              f"({err.strerror or err})"),))
    except (SpecError, ValueError, TypeError) as err:  # decode names the case and field
        return FamilyCheck(name, path, mismatches=(Mismatch(name, "-", detail=f"{path}: {err}"),))
    return _check_decoded(name, path, cases)


def check_families(directory, families=None) -> list:
    """One ``FamilyCheck`` per family: each file read safely, validated and recomputed.

    With ``families=None`` the directory must hold exactly the known families: a missing family
    file fails, and so does a ``*.json`` that is no known family (hidden files are ignored).
    Nothing in the directory can crash, hang or exhaust memory: an unreadable, oversized,
    malformed or unfaithful file is a failed ``FamilyCheck`` whose mismatch names the file and
    the reason. Raises only for bad arguments (``TypeError``/``ValueError``, e.g. no such directory).
    """
    directory = _check_directory(directory)
    names = _check_families(families)
    if not os.path.isdir(directory):
        raise ValueError(f"directory {directory!r} does not exist or is not a directory")
    root = os.path.realpath(directory)
    results = [_check_file(directory, root, name) for name in names]
    if families is None:
        for entry in sorted(os.listdir(directory)):
            stem, ext = os.path.splitext(entry)
            if ext == ".json" and not entry.startswith(".") and stem not in FAMILIES:
                path = os.path.join(directory, entry)
                results.append(FamilyCheck(stem, path, mismatches=(Mismatch(
                    stem, "-", detail=f"{path}: not a family this minipos knows; the families are "
                                      f"{sorted(FAMILIES)}"),)))
    return results


def check(directory, families=None) -> list:
    """Recompute every case of every family file in ``directory``; return all mismatches (empty = pass).

    See ``check_families`` for what is checked besides the values.
    """
    return [m for result in check_families(directory, families) for m in result.mismatches]


def format_mismatches(mismatches: list) -> str:
    """One line per mismatch, then the number of mismatched values per case that has any."""
    lines = [str(m) for m in mismatches]
    per_case = {}
    for m in mismatches:
        if m.index is not None:
            per_case[f"{m.family}/{m.case}"] = per_case.get(f"{m.family}/{m.case}", 0) + 1
    lines += [f"{key}: {n} mismatch(es)" for key, n in per_case.items()]
    return "\n".join(lines)


def main(args) -> int:
    """``minipos vectors export DIR`` / ``minipos vectors check DIR`` (``args`` from the CLI parser).

    Exit status 0 on success; 1 when a check fails or the directory cannot be used, with one line
    per problem and no traceback.
    """
    command = f"minipos vectors {args.vectors_command}"
    try:
        if args.vectors_command == "export":
            paths = export(args.dir)
        else:
            results = check_families(args.dir)
    except (ValueError, TypeError, OSError) as err:
        print(f"{command}: error: {err}", file=sys.stderr)
        return 1
    if args.vectors_command == "export":
        size = sum(os.path.getsize(p) for p in paths)
        print(f"wrote {len(paths)} families ({size / 1e6:.2f} MB) to {args.dir}, spec {SPEC_VERSION}")
        return 0
    mismatches = [m for r in results for m in r.mismatches]
    if mismatches:
        print(format_mismatches(mismatches))
    print("\n".join(str(r) for r in results))
    if mismatches:
        print(f"FAILED: {len(mismatches)} problem(s) in {sum(not r.ok for r in results)} of {len(results)} "
              f"families of {args.dir}")
        return 1
    print(f"ok: minipos {__version__} reproduces {sum(r.cases for r in results)} cases "
          f"({sum(r.values for r in results)} values) in {len(results)} families of {args.dir}")
    return 0
