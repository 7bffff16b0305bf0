"""A campaign of hostile calls over M-RoPE, iRoPE's temperature, the Llama 4 / SmolLM3 / Gemma 3
config readers, Shaw's relative positions and the masks, as functions and through the layer.

Each row of ``CASES`` is one call and its expected outcome: ``Ok(check)``, a result that is finite
and passes ``check`` (an independent computation: the rotation pair by pair in a Python loop,
Shaw's Eq. 3 and 4 summed pair by pair, the temperature by ``math.log1p``, masks by their rule on
Python ints, adjoint identities for the backward passes, a cached pass against a full one; or a
value worked by hand), or ``Named(name)``, a ``ValueError`` or ``TypeError`` whose message names
the argument. ``classify`` sorts a call into one of four classes, as the campaign that found the
first findings did: *clear error* (raises, naming the argument), *accepted and checked correct*,
*silent* (a result where an error belongs, a result that fails its check, NaN or inf) and *vague*
(any other exception, or a message that does not name the argument). Every call must be in the
first two. The classes of bad input: wrong types, NaN/inf, 0 / negative / 2**31 / 2**63 / 10**9,
subnormal and 1e300, empty, wrong ndim and shapes, float16 / float32 / longdouble, bool for int,
sections that do not add up, head counts that do not divide, windows without causal.
``python tests/test_campaign_modern.py`` prints the counts.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
from tools.hostile import Named, Ok, close_to
import pytest

import minipos.fast as fast
from minipos import irope, masks, mrope, shaw
from minipos import local_global as lg
from minipos.layer import MultiHeadAttention
from minipos.rope import apply_rope
from minipos.rope_scaling import Rotary
from minipos.seams import NoPE


CASES: list = []


def case(label: str, call: Callable, expect) -> None:
    CASES.append((label, call, expect))


def classify(call, expect) -> tuple[str, str]:
    """``(class, detail)``: "clear error", "checked", "silent" or "vague"."""
    try:
        with np.errstate(over="raise", invalid="raise", divide="raise"):  # a stray warning is a finding too
            result = call()
    except Exception as err:                                            # noqa: BLE001 - every exception is judged
        if isinstance(expect, Ok):
            return "vague", f"expected a result, got {type(err).__name__}: {err}"
        if not isinstance(err, expect.exc):
            return "vague", f"{type(err).__name__} instead of {expect.exc}: {err}"
        fault = expect.fault(err)
        if fault:
            return "vague", fault
        return "clear error", str(err)
    if isinstance(expect, Named):
        return "silent", f"expected an error naming {expect.words!r}, got {str(result)[:200]}"
    wrong = expect.wrong(result)
    return ("silent", wrong) if wrong else ("checked", "")


def _plain(x):
    """Arrays as nested lists, tuples as lists: a value comparable with ``==``."""
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, (tuple, list)):
        return [_plain(a) for a in x]
    return x


def equals(want):
    def check(got):
        w = want() if callable(want) else want
        assert _plain(got) == _plain(w), f"{_plain(got)} != {_plain(w)}"
    return check


def shape_is(shape):
    def check(got):
        assert got.shape == shape, f"shape {got.shape}, expected {shape}"
    return check


RNG = np.random.default_rng(24)
I64 = np.iinfo(np.int64)

# --------------------------------------------------------------------------- M-RoPE, by a loop

D, T = 8, 5                                                             # D/2 = 4 frequencies
X = RNG.standard_normal((2, T, D))                                      # (H, T, D)
POS3 = np.array([[0, 1, 1, 1, 4], [0, 1, 1, 2, 4], [0, 1, 2, 1, 4]])    # (3, T): text, a 1 x 2 x 2 image, text
SECTION = [2, 1, 1]


def _owner(section, interleaved):
    """Which stream owns frequency i, by the rules of the Qwen2-VL and Qwen3-VL code, in a loop."""
    n_t, n_h, n_w = section
    if not interleaved:
        return [0] * n_t + [1] * n_h + [2] * n_w
    out = []
    for i in range(sum(section)):
        out.append(1 if i % 3 == 1 and i < 3 * n_h else 2 if i % 3 == 2 and i < 3 * n_w else 0)
    return out


def _mrope_loop(x, pos, section, *, base=10000.0, interleaved=False, factor=1.0, backward=False):
    """M-RoPE pair by pair: pair (i, i + D/2) rotated by pos[s(i), t] * base^(-2i/D) (R^T for backward)."""
    x = np.asarray(x, np.float64)
    pos = np.broadcast_to(np.asarray(pos), (3, x.shape[-2]))
    half = x.shape[-1] // 2
    owner = _owner(section, interleaved)
    y = np.empty_like(x)
    for t in range(x.shape[-2]):
        for i in range(half):
            a = int(pos[owner[i], t]) * base ** (-2 * i / (2 * half))
            c, s = factor * math.cos(a), factor * math.sin(a) * (-1 if backward else 1)
            u, v = x[..., t, i], x[..., t, i + half]
            y[..., t, i], y[..., t, i + half] = u * c - v * s, v * c + u * s
    return y


P = "apply_mrope"
case(f"{P} split", lambda: mrope.apply_mrope(X, POS3, SECTION), Ok(close_to(_mrope_loop(X, POS3, SECTION))))
case(f"{P} interleaved", lambda: mrope.apply_mrope(X, POS3, [2, 1, 1], interleaved=True),
     Ok(close_to(_mrope_loop(X, POS3, [2, 1, 1], interleaved=True))))
case(f"{P} lists", lambda: mrope.apply_mrope(X.tolist(), POS3.tolist(), SECTION),
     Ok(close_to(_mrope_loop(X, POS3, SECTION))))
case(f"{P} tuple section", lambda: mrope.apply_mrope(X, POS3, (2, 1, 1)), Ok(close_to(_mrope_loop(X, POS3, SECTION))))
case(f"{P} ndarray section", lambda: mrope.apply_mrope(X, POS3, np.array(SECTION)),
     Ok(close_to(_mrope_loop(X, POS3, SECTION))))
case(f"{P} text positions == rope half", lambda: mrope.apply_mrope(X, np.arange(T), SECTION),
     Ok(close_to(lambda: apply_rope(X, np.arange(T), layout="half"))))
case(f"{P} negative positions", lambda: mrope.apply_mrope(X, -POS3, SECTION), Ok(close_to(_mrope_loop(X, -POS3, SECTION))))
case(f"{P} float positions exact", lambda: mrope.apply_mrope(X, POS3.astype(float), SECTION),
     Ok(close_to(_mrope_loop(X, POS3, SECTION))))
case(f"{P} base 500000", lambda: mrope.apply_mrope(X, POS3, SECTION, base=5e5),
     Ok(close_to(_mrope_loop(X, POS3, SECTION, base=5e5))))
case(f"{P} factor 1.5", lambda: mrope.apply_mrope(X, POS3, SECTION, attention_factor=1.5),
     Ok(close_to(_mrope_loop(X, POS3, SECTION, factor=1.5))))
case(f"{P} inv_freq", lambda: mrope.apply_mrope(X, POS3, SECTION, inv_freq=10000.0 ** (-np.arange(4) / 4)),
     Ok(close_to(_mrope_loop(X, POS3, SECTION))))
case(f"{P} 4-D", lambda: mrope.apply_mrope(X[None], POS3, SECTION), Ok(close_to(_mrope_loop(X, POS3, SECTION)[None])))
case(f"{P} 2-D", lambda: mrope.apply_mrope(X[0], POS3, SECTION), Ok(close_to(_mrope_loop(X[0], POS3, SECTION))))
case(f"{P} positions 10**9", lambda: mrope.apply_mrope(X, POS3 + 10 ** 9, SECTION),
     Ok(close_to(_mrope_loop(X, POS3 + 10 ** 9, SECTION), rtol=1e-6, atol=1e-6)))
case(f"{P} positions 2**31", lambda: mrope.apply_mrope(X, POS3 + 2 ** 31, SECTION),
     Ok(close_to(_mrope_loop(X, POS3 + 2 ** 31, SECTION), rtol=1e-6, atol=1e-6)))
case(f"{P} subnormal x", lambda: mrope.apply_mrope(X * 1e-310, POS3, SECTION),
     Ok(close_to(_mrope_loop(X * 1e-310, POS3, SECTION), atol=1e-320)))
case(f"{P} 1e300 x", lambda: mrope.apply_mrope(X * 1e300, POS3, SECTION),
     Ok(close_to(_mrope_loop(X * 1e300, POS3, SECTION), rtol=1e-12, atol=0)))
case(f"{P} 1.7e308 overflows", lambda: mrope.apply_mrope(np.full((1, 1, 2), 1.7e308), [[1], [1], [1]], [1, 0, 0]),
     Named("x"))
for dtype, tol in ((np.float32, 1e-6), (np.float16, 2e-3), (np.longdouble, 1e-12)):
    case(f"{P} {np.dtype(dtype).name}", lambda d=dtype: mrope.apply_mrope(X.astype(d), POS3, SECTION),
         Ok(close_to(_mrope_loop(X.astype(dtype), POS3, SECTION), rtol=tol, atol=tol, dtype=np.dtype(dtype))))
case(f"{P} float16 overflow", lambda: mrope.apply_mrope(np.full((1, 1, 2), 65000, np.float16), [[1], [1], [1]], [1, 0, 0],
                                                       attention_factor=1.5), Named("x"))
case(f"{P} int x", lambda: mrope.apply_mrope(np.ones((1, 2, 2), int), [[0, 1]] * 3, [1, 0, 0]),
     Ok(close_to(_mrope_loop(np.ones((1, 2, 2)), [[0, 1]] * 3, [1, 0, 0]))))
case(f"{P} T=0", lambda: mrope.apply_mrope(X[:, :0], np.zeros((3, 0), int), SECTION), Ok(shape_is((2, 0, D))))
case(f"{P} H=0", lambda: mrope.apply_mrope(X[:0], POS3, SECTION), Ok(shape_is((0, T, D))))
case(f"{P} NaN x", lambda: mrope.apply_mrope(X * np.nan, POS3, SECTION), Named("x"))
case(f"{P} inf x", lambda: mrope.apply_mrope(np.where(X > 0, np.inf, X), POS3, SECTION), Named("x"))
case(f"{P} None x", lambda: mrope.apply_mrope(None, POS3, SECTION), Named("x", TypeError))
case(f"{P} str x", lambda: mrope.apply_mrope("x", POS3, SECTION), Named("x", TypeError))
case(f"{P} bool x", lambda: mrope.apply_mrope(X > 0, POS3, SECTION), Named("x", TypeError))
case(f"{P} complex x", lambda: mrope.apply_mrope(X + 1j, POS3, SECTION), Named("x", TypeError))
case(f"{P} 1-D x", lambda: mrope.apply_mrope(X[0, 0], POS3[:, :1], SECTION), Named("x"))
case(f"{P} odd D", lambda: mrope.apply_mrope(X[..., :7], POS3, SECTION), Named("D"))
case(f"{P} section short of D/2", lambda: mrope.apply_mrope(X, POS3, [1, 1, 1]), Named("mrope_section"))
case(f"{P} section over D/2", lambda: mrope.apply_mrope(X, POS3, [2, 2, 1]), Named("mrope_section"))
case(f"{P} section of 2", lambda: mrope.apply_mrope(X, POS3, [2, 2]), Named("mrope_section"))
case(f"{P} section of 4", lambda: mrope.apply_mrope(X, POS3, [1, 1, 1, 1]), Named("mrope_section"))
case(f"{P} section str", lambda: mrope.apply_mrope(X, POS3, "211"), Named("mrope_section"))
case(f"{P} section None", lambda: mrope.apply_mrope(X, POS3, None), Named("mrope_section"))
case(f"{P} section int", lambda: mrope.apply_mrope(X, POS3, 4), Named("mrope_section"))
case(f"{P} section float", lambda: mrope.apply_mrope(X, POS3, [2.0, 1, 1]), Named("mrope_section", TypeError))
case(f"{P} section bool", lambda: mrope.apply_mrope(X, POS3, [True, 2, 1]), Named("mrope_section", TypeError))
case(f"{P} section negative", lambda: mrope.apply_mrope(X, POS3, [5, -1, 0]), Named("mrope_section"))
for big in (2 ** 31, 2 ** 63, 10 ** 9):
    case(f"{P} section {big}", lambda b=big: mrope.apply_mrope(X, POS3, [b, 0, 0]), Named("mrope_section"))
case(f"{P} interleaved bad section", lambda: mrope.apply_mrope(X, POS3, [0, 2, 2], interleaved=True),
     Named("mrope_section"))
case(f"{P} interleaved str", lambda: mrope.apply_mrope(X, POS3, SECTION, interleaved="yes"), Named("interleaved", TypeError))
case(f"{P} positions (2, T)", lambda: mrope.apply_mrope(X, POS3[:2], SECTION), Named("positions"))
case(f"{P} positions (3, T-1)", lambda: mrope.apply_mrope(X, POS3[:, :4], SECTION), Named("positions"))
case(f"{P} positions (T-1,)", lambda: mrope.apply_mrope(X, np.arange(4), SECTION), Named("positions"))
case(f"{P} positions 3-D", lambda: mrope.apply_mrope(X, POS3[None], SECTION), Named("positions"))
case(f"{P} positions ragged", lambda: mrope.apply_mrope(X, [[0, 1], [0], [0, 1]], SECTION), Named("positions"))
case(f"{P} positions 0.5", lambda: mrope.apply_mrope(X, POS3 + 0.5, SECTION), Named("positions"))
case(f"{P} positions NaN", lambda: mrope.apply_mrope(X, np.where(POS3 > 1, np.nan, POS3), SECTION), Named("positions"))
case(f"{P} positions bool", lambda: mrope.apply_mrope(X, POS3 > 0, SECTION), Named("positions", TypeError))
case(f"{P} positions str", lambda: mrope.apply_mrope(X, "pos", SECTION), Named("positions", TypeError))
case(f"{P} positions None", lambda: mrope.apply_mrope(X, None, SECTION), Named("positions", TypeError))
case(f"{P} positions 1e19 float", lambda: mrope.apply_mrope(X, POS3 * 1e19, SECTION), Named("positions"))
case(f"{P} positions huge int64 x inv_freq", lambda: mrope.apply_mrope(X, POS3 * 2 ** 61, SECTION, inv_freq=[1e300] * 4),
     Named("angles"))
case(f"{P} base and inv_freq", lambda: mrope.apply_mrope(X, POS3, SECTION, base=5e5, inv_freq=np.ones(4)),
     Named("inv_freq"))
case(f"{P} inv_freq length", lambda: mrope.apply_mrope(X, POS3, SECTION, inv_freq=np.ones(3)), Named("inv_freq"))
case(f"{P} inv_freq NaN", lambda: mrope.apply_mrope(X, POS3, SECTION, inv_freq=[np.nan] * 4), Named("inv_freq"))
case(f"{P} inv_freq 2-D", lambda: mrope.apply_mrope(X, POS3, SECTION, inv_freq=np.ones((2, 2))), Named("inv_freq"))
for bad, exc in ((0.0, ValueError), (-1.0, ValueError), (np.nan, ValueError), (np.inf, ValueError), ("1", TypeError),
                 (1e-310, ValueError), (True, TypeError)):
    case(f"{P} base {bad!r}", lambda b=bad: mrope.apply_mrope(X, POS3, SECTION, base=b), Named("base", exc))
    case(f"{P} attention_factor {bad!r}", lambda b=bad: mrope.apply_mrope(X, POS3, SECTION, attention_factor=b),
         Named("attention_factor", exc))
case(f"{P} base 1e300", lambda: mrope.apply_mrope(X, POS3, SECTION, base=1e300),
     Ok(close_to(_mrope_loop(X, POS3, SECTION, base=1e300))))

DY = RNG.standard_normal(X.shape)
for inter, sec in ((False, SECTION), (True, [2, 1, 1])):
    case(f"apply_mrope_backward adjoint interleaved={inter}", lambda i=inter, s=sec: (
        np.sum(mrope.apply_mrope(X, POS3, s, interleaved=i) * DY),
        np.sum(X * mrope.apply_mrope_backward(DY, POS3, s, interleaved=i))),
        Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-12)))
case("apply_mrope_backward loop", lambda: mrope.apply_mrope_backward(DY, POS3, SECTION, attention_factor=0.5),
     Ok(close_to(_mrope_loop(DY, POS3, SECTION, factor=0.5, backward=True))))
case("apply_mrope_backward float32", lambda: mrope.apply_mrope_backward(DY.astype(np.float32), POS3, SECTION),
     Ok(close_to(_mrope_loop(DY, POS3, SECTION, backward=True), rtol=1e-5, atol=1e-6, dtype=np.dtype(np.float32))))
case("apply_mrope_backward NaN dy", lambda: mrope.apply_mrope_backward(DY * np.nan, POS3, SECTION), Named("dy"))
case("apply_mrope_backward dy shape", lambda: mrope.apply_mrope_backward(DY[:, :4], POS3, SECTION), Named("positions"))
case("apply_mrope_backward float16 overflow", lambda: mrope.apply_mrope_backward(
    np.full((1, 1, 2), 65000, np.float16), [[1], [1], [1]], [1, 0, 0], attention_factor=1.5), Named("dy"))

P = "mrope_streams"
case(f"{P} split", lambda: mrope.mrope_streams([16, 24, 24]), Ok(equals([0] * 16 + [1] * 24 + [2] * 24)))
case(f"{P} Qwen3-VL", lambda: mrope.mrope_streams([24, 20, 20], interleaved=True),
     Ok(equals(_owner([24, 20, 20], True))))
case(f"{P} one stream", lambda: mrope.mrope_streams([0, 0, 3]), Ok(equals([2, 2, 2])))
case(f"{P} all zero", lambda: mrope.mrope_streams([0, 0, 0]), Named("mrope_section"))
case(f"{P} interleaved str", lambda: mrope.mrope_streams(SECTION, interleaved="no"), Named("interleaved", TypeError))
case(f"{P} interleaved 1", lambda: mrope.mrope_streams(SECTION, interleaved=1), Named("interleaved", TypeError))
for big in (2 ** 63, 2 ** 70):
    case(f"{P} {big}", lambda b=big: mrope.mrope_streams([b, 0, 0]), Named("mrope_section"))
case(f"{P} 10**6", lambda: mrope.mrope_streams([10 ** 6, 0, 0]), Ok(equals([0] * 10 ** 6)))
case(f"{P} np.int64", lambda: mrope.mrope_streams(np.array([1, 1, 1])), Ok(equals([0, 1, 2])))
case("mrope_angles", lambda: mrope.mrope_angles(POS3, [1.0, 0.5, 0.25, 0.125], SECTION),
     Ok(close_to(np.stack([POS3[0] * 1.0, POS3[0] * 0.5, POS3[1] * 0.25, POS3[2] * 0.125], axis=-1))))
case("mrope_angles section vs inv_freq", lambda: mrope.mrope_angles(POS3, np.ones(5), SECTION), Named("mrope_section"))

# --------------------------------------------------------------------------- M-RoPE positions, by hand

P = "mrope_positions"
# text 2, image grid (1, 4, 6) merged by 2 (6 tokens: rows 0..1, columns 0..2), text 2 (HF get_rope_index, 5.24):
# c = 2 at the image, then c = 2 + max(4, 6) // 2 = 5.
IMG_POS = [[0, 1, 2, 2, 2, 2, 2, 2, 5, 6], [0, 1, 2, 2, 2, 3, 3, 3, 5, 6], [0, 1, 2, 3, 4, 2, 3, 4, 5, 6]]
IMG_TYPES = [0, 0, 1, 1, 1, 1, 1, 1, 0, 0]
case(f"{P} image", lambda: mrope.mrope_positions(IMG_TYPES, image_grid_thw=[[1, 4, 6]]),
     Ok(equals((IMG_POS, 7 - 10))))
case(f"{P} text only", lambda: mrope.mrope_positions([0, 0, 0]), Ok(equals(([[0, 1, 2]] * 3, 0))))
case(f"{P} empty", lambda: mrope.mrope_positions([]), Ok(lambda r: r[0].shape == (3, 0) and r[1] == 0 or pytest.fail(r)))
case(f"{P} ndarray types", lambda: mrope.mrope_positions(np.array(IMG_TYPES), image_grid_thw=np.array([[1, 4, 6]])),
     Ok(equals((IMG_POS, -3))))
# video grid (2, 2, 2) merged by 2: 2 tokens, one per frame, at c + floor(tau * step): step 0.5 gives 0, 0.
case(f"{P} video step 0.5", lambda: mrope.mrope_positions([0, 2, 2], video_grid_thw=[[2, 2, 2]],
                                                          video_time_intervals=[0.5]),
     Ok(equals(([[0, 1, 1], [0, 1, 1], [0, 1, 1]], 2 - 3))))
case(f"{P} video step 3", lambda: mrope.mrope_positions([0, 2, 2, 0], video_grid_thw=[[2, 2, 2]],
                                                        video_time_intervals=[3]),
     Ok(equals(([[0, 1, 4, 2], [0, 1, 1, 2], [0, 1, 1, 2]], 5 - 4))))
case(f"{P} video step 0", lambda: mrope.mrope_positions([2, 2], video_grid_thw=[[2, 2, 2]], video_time_intervals=[0.0]),
     Ok(equals(([[0, 0], [0, 0], [0, 0]], 1 - 2))))
case(f"{P} video step subnormal", lambda: mrope.mrope_positions([2, 2], video_grid_thw=[[2, 2, 2]],
                                                                video_time_intervals=[1e-310]),
     Ok(equals(([[0, 0], [0, 0], [0, 0]], -1))))
for bad in (1e300, 1e19, 2.0 ** 62):
    case(f"{P} video step {bad:g}", lambda b=bad: mrope.mrope_positions([0, 2, 2, 0], video_grid_thw=[[2, 2, 2]],
                                                                        video_time_intervals=[b]),
         Named("video_time_intervals"))
case(f"{P} video step 2**40", lambda: mrope.mrope_positions([2, 2], video_grid_thw=[[2, 2, 2]],
                                                            video_time_intervals=[2.0 ** 40]),
     Ok(equals(([[0, 2 ** 40], [0, 0], [0, 0]], 2 ** 40 + 1 - 2))))
for bad, exc in ((np.nan, ValueError), (np.inf, ValueError), (-1.0, ValueError), ("1", TypeError)):
    case(f"{P} video step {bad!r}", lambda b=bad: mrope.mrope_positions([2, 2], video_grid_thw=[[2, 2, 2]],
                                                                        video_time_intervals=[b]),
         Named("video_time_intervals", exc))
case(f"{P} video steps count", lambda: mrope.mrope_positions([2, 2], video_grid_thw=[[2, 2, 2]],
                                                             video_time_intervals=[1.0, 2.0]),
     Named("video_time_intervals"))
case(f"{P} types 3", lambda: mrope.mrope_positions([0, 3]), Named("token_types"))
case(f"{P} types -1", lambda: mrope.mrope_positions([0, -1]), Named("token_types"))
case(f"{P} types float", lambda: mrope.mrope_positions([0, 0.5]), Named("token_types"))
case(f"{P} types bool", lambda: mrope.mrope_positions([True, False]), Named("token_types", TypeError))
case(f"{P} types 2-D", lambda: mrope.mrope_positions([[0, 0]]), Named("token_types"))
case(f"{P} types ragged", lambda: mrope.mrope_positions([[0, 1], [0]]), Named("token_types"))
case(f"{P} types str", lambda: mrope.mrope_positions("0012"), Named("token_types", TypeError))
case(f"{P} types None", lambda: mrope.mrope_positions(None), Named("token_types", TypeError))
case(f"{P} types int", lambda: mrope.mrope_positions(3), Named("image_grid_thw"))      # arange(3): an image run
case(f"{P} image without grid", lambda: mrope.mrope_positions([0, 1]), Named("image_grid_thw"))
case(f"{P} grid without image", lambda: mrope.mrope_positions([0, 0], image_grid_thw=[[1, 2, 2]]), Named("image_grid_thw"))
case(f"{P} grid count wrong", lambda: mrope.mrope_positions([1, 1], image_grid_thw=[[1, 2, 2]]), Named("image_grid_thw"))
case(f"{P} grid huge", lambda: mrope.mrope_positions([1], image_grid_thw=[[1, 2 ** 40, 2 ** 40]]),
     Named("image_grid_thw"))
case(f"{P} grid 2**63", lambda: mrope.mrope_positions([1], image_grid_thw=[[1, 2 ** 63, 2]]), Named("image_grid_thw"))
case(f"{P} grid 0", lambda: mrope.mrope_positions([1], image_grid_thw=[[0, 2, 2]]), Named("image_grid_thw"))
case(f"{P} grid (N, 2)", lambda: mrope.mrope_positions([1], image_grid_thw=[[2, 2]]), Named("image_grid_thw"))
case(f"{P} grid 1-D", lambda: mrope.mrope_positions([1], image_grid_thw=[1, 2, 2]), Named("image_grid_thw"))
case(f"{P} grid float", lambda: mrope.mrope_positions([1], image_grid_thw=[[1, 2.5, 2]]), Named("image_grid_thw"))
case(f"{P} grid str", lambda: mrope.mrope_positions([1], image_grid_thw="122"), Named("image_grid_thw", TypeError))
for bad, exc in ((0, ValueError), (-2, ValueError), (2.0, TypeError), (True, TypeError), (None, TypeError)):
    case(f"{P} merge {bad!r}", lambda b=bad: mrope.mrope_positions(IMG_TYPES, image_grid_thw=[[1, 4, 6]],
                                                                   spatial_merge_size=b),
         Named("spatial_merge_size", exc))
case(f"{P} merge 2**63", lambda: mrope.mrope_positions(IMG_TYPES, image_grid_thw=[[1, 4, 6]], spatial_merge_size=2 ** 63),
     Named("image_grid_thw"))
case(f"{P} merge 1", lambda: mrope.mrope_positions([1, 1, 1, 1], image_grid_thw=[[1, 2, 2]], spatial_merge_size=1),
     Ok(equals(([[0, 0, 0, 0], [0, 0, 1, 1], [0, 1, 0, 1]], 2 - 4))))

P = "mrope_decode_positions"
case(f"{P}", lambda: mrope.mrope_decode_positions(10, 2, -3), Ok(equals([[7, 8]] * 3)))
case(f"{P} length 0", lambda: mrope.mrope_decode_positions(10, 0, 2 ** 70), Ok(shape_is((3, 0))))
case(f"{P} near 2**62", lambda: mrope.mrope_decode_positions(2 ** 62 - 2, 1, 0), Ok(equals([[2 ** 62 - 2]] * 3)))
case(f"{P} 10**9", lambda: mrope.mrope_decode_positions(10 ** 9, 3, 10 ** 9),
     Ok(equals([[2 * 10 ** 9, 2 * 10 ** 9 + 1, 2 * 10 ** 9 + 2]] * 3)))
for args, name in (((2 ** 63 - 2, 3, 0), "cache_length"), ((2 ** 63, 3, 0), "cache_length"), ((0, 3, 2 ** 62), "delta"),
                   ((0, 3, -2 ** 63), "delta"), ((0, 2 ** 63, 0), "length"), ((0, 10 ** 18, 0), "length"),
                   ((-1, 3, 0), "cache_length"), ((0, -1, 0), "length"), ((1.0, 3, 0), "cache_length"),
                   ((True, 3, 0), "cache_length"), ((0, "3", 0), "length"), ((0, 3, None), "delta")):
    case(f"{P} {args}", lambda a=args: mrope.mrope_decode_positions(*a), Named(name))

# --------------------------------------------------------------------------- M-RoPE in the layer

def _mrope_cached_equals_full():
    layer = MultiHeadAttention(16, 2, scheme=mrope.MRotary(mrope_section=[2, 1, 1]), seed=2)
    x = RNG.standard_normal((1, 10, 16))
    pos, delta = mrope.mrope_positions(IMG_TYPES, image_grid_thw=[[1, 4, 6]])
    full = layer(x, positions=pos, causal=True)
    cache = layer.new_cache()
    first = layer(x[:, :8], positions=pos[:, :8], causal=True, cache=cache)
    rest = layer(x[:, 8:], positions=pos[:, 8:], causal=True, cache=cache)
    return np.concatenate([first, rest], axis=1), full


case("MRotary cached == full", _mrope_cached_equals_full,
     Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-10, atol=1e-12)))
for section, name in (([2, 2, 1], "mrope_section"), ([0, 2, 2], "mrope_section"), ([2 ** 63, 0, 0], "mrope_section"),
                      ([1, 1], "mrope_section"), ("abc", "mrope_section")):
    case(f"MRotary section {section!r}", lambda s=section: MultiHeadAttention(16, 2, scheme=mrope.MRotary(
        mrope_section=s, interleaved=s == [0, 2, 2])), Named(name))
case("MRotary odd head dim", lambda: MultiHeadAttention(6, 2, scheme=mrope.MRotary()), Named("head"))
case("MRotary interleaved str", lambda: mrope.MRotary(interleaved="yes"), Named("interleaved", TypeError))
case("MRotary base 0", lambda: mrope.MRotary(base=0), Named("base"))
case("MRotary positions (2, T)", lambda: MultiHeadAttention(16, 2, scheme=mrope.MRotary())(
    np.ones((1, 3, 16)), positions=np.zeros((2, 3), int)), Named("positions"))
case("MRotary default section", lambda: MultiHeadAttention(16, 2, head_dim=128, scheme=mrope.MRotary()).scheme.mrope_section,
     Ok(equals([16, 24, 24])))
case("MRotary default interleaved", lambda: MultiHeadAttention(16, 2, head_dim=128, scheme=mrope.MRotary(
    interleaved=True)).scheme.mrope_section, Ok(equals([24, 20, 20])))

# --------------------------------------------------------------------------- iRoPE's temperature

def _tau(positions, attn_scale=0.1, floor_scale=8192):
    return [math.log1p(math.floor((int(i) + 1) / floor_scale)) * attn_scale + 1 for i in positions]


P = "attn_temperature"
TAU_POS = np.array([0, 3, 4, 8190, 8191, 16383, 10 ** 9])
case(f"{P} Llama 4", lambda: irope.attn_temperature(TAU_POS), Ok(close_to(_tau(TAU_POS), rtol=1e-15)))
case(f"{P} int T", lambda: irope.attn_temperature(6, attn_scale=0.5, floor_scale=2),
     Ok(close_to(_tau(range(6), 0.5, 2), rtol=1e-15)))
case(f"{P} float32", lambda: irope.attn_temperature(TAU_POS, float32=True),
     Ok(close_to(_tau(TAU_POS), rtol=1e-6)))
case(f"{P} int64 max", lambda: irope.attn_temperature(I64.max - np.arange(5)[::-1], floor_scale=2),
     Ok(close_to([math.log(1 + (int(i) + 1) // 2) * 0.1 + 1 for i in I64.max - np.arange(5)[::-1]], rtol=1e-15)))
case(f"{P} int64 max float32", lambda: irope.attn_temperature([I64.max], floor_scale=2, float32=True),
     Ok(close_to([math.log(2 ** 62) * 0.1 + 1], rtol=1e-6)))
case(f"{P} 2**62 float positions", lambda: irope.attn_temperature(np.array([2.0 ** 61])),
     Ok(close_to(_tau([2 ** 61]), rtol=1e-15)))
case(f"{P} attn_scale 0", lambda: irope.attn_temperature(TAU_POS, attn_scale=0), Ok(close_to(np.ones(7))))
case(f"{P} attn_scale subnormal", lambda: irope.attn_temperature(TAU_POS, attn_scale=1e-310), Named("attn_scale"))
case(f"{P} floor_scale subnormal", lambda: irope.attn_temperature(TAU_POS, floor_scale=1e-310), Named("floor_scale"))
case(f"{P} floor_scale 1e-300", lambda: irope.attn_temperature([0, 1], floor_scale=1e-300),
     Ok(close_to([math.log1p(1e300) * 0.1 + 1, math.log1p(2e300) * 0.1 + 1], rtol=1e-15)))
case(f"{P} floor_scale 1e300", lambda: irope.attn_temperature(TAU_POS, floor_scale=1e300), Ok(close_to(np.ones(7))))
case(f"{P} attn_scale 1e300", lambda: irope.attn_temperature([0, 8191], attn_scale=1e300),
     Ok(close_to([1.0, math.log(2) * 1e300 + 1], rtol=1e-15)))
case(f"{P} attn_scale 1e308", lambda: irope.attn_temperature([10 ** 6], attn_scale=1e308, floor_scale=1),
     Named("attn_scale"))
case(f"{P} attn_scale 1e300 float32", lambda: irope.attn_temperature([10 ** 6], attn_scale=1e300, float32=True,
                                                                      floor_scale=1), Named("attn_scale"))
case(f"{P} T=0", lambda: irope.attn_temperature(0), Ok(shape_is((0,))))
for bad, name, exc in ((-1.0, "attn_scale", ValueError), (np.nan, "attn_scale", ValueError), ("0.1", "attn_scale", TypeError),
                       (True, "attn_scale", TypeError), (np.inf, "attn_scale", ValueError)):
    case(f"{P} attn_scale {bad!r}", lambda b=bad: irope.attn_temperature(4, attn_scale=b), Named(name, exc))
for bad, exc in ((0, ValueError), (-8, ValueError), (np.nan, ValueError), ("8192", TypeError), (None, TypeError),
                 (2 ** 1100, ValueError)):
    case(f"{P} floor_scale {bad!r}", lambda b=bad: irope.attn_temperature(4, floor_scale=b), Named("floor_scale", exc))
case(f"{P} floor_scale 2**63", lambda: irope.attn_temperature(4, floor_scale=2 ** 63), Ok(close_to(np.ones(4))))
for bad, exc in (([-1, 0], ValueError), ([0.5], ValueError), ([[0, 1]], ValueError), ([[0, 1], [0]], ValueError),
                 ([True], TypeError), ("abc", TypeError), (None, TypeError), ([np.nan], ValueError), (-3, ValueError),
                 ([1e19], ValueError)):
    case(f"{P} positions {bad!r}", lambda b=bad: irope.attn_temperature(b), Named("positions", exc))
for bad in ("yes", 1, None):
    case(f"{P} float32 {bad!r}", lambda b=bad: irope.attn_temperature(4, float32=b), Named("float32", TypeError))

P = "apply_attn_temperature"
QT = RNG.standard_normal((2, 7, 4))
for fn, name in ((irope.apply_attn_temperature, "q"), (irope.apply_attn_temperature_backward, "dy")):
    p = fn.__name__
    case(f"{p}", lambda f=fn: f(QT, TAU_POS), Ok(close_to(QT * np.array(_tau(TAU_POS))[:, None], rtol=1e-15)))
    case(f"{p} int T", lambda f=fn: f(QT, 7, attn_scale=1, floor_scale=2),
         Ok(close_to(QT * np.array(_tau(range(7), 1, 2))[:, None], rtol=1e-15)))
    for dtype, tol in ((np.float32, 1e-6), (np.float16, 1e-3), (np.longdouble, 1e-15)):
        case(f"{p} {np.dtype(dtype).name}", lambda f=fn, d=dtype: f(QT.astype(d), TAU_POS),
             Ok(close_to(QT.astype(dtype).astype(np.float64) * np.array(_tau(TAU_POS))[:, None], rtol=tol, atol=tol,
                         dtype=np.dtype(dtype))))
    case(f"{p} float16 overflow", lambda f=fn: f(np.full((1, 3, 2), 60000, np.float16), np.arange(3) + 10 ** 6,
                                                 attn_scale=10, floor_scale=1), Named(name))
    case(f"{p} float64 overflow", lambda f=fn: f(np.full((1, 2), 1.7e308), [8191]), Named(name))   # tau = 1.069
    case(f"{p} float64 near the top", lambda f=fn: f(np.full((1, 2), 1e308), [8191]),
         Ok(close_to(np.full((1, 2), 1e308 * (1 + 0.1 * math.log(2))), rtol=1e-15)))
    case(f"{p} int64 max positions", lambda f=fn: f(np.ones((5, 2)), I64.max - np.arange(5)[::-1], floor_scale=2),
         Ok(close_to(np.array([math.log(1 + (int(i) + 1) // 2) * 0.1 + 1 for i in I64.max - np.arange(5)[::-1]])[:, None]
                     * np.ones((5, 2)), rtol=1e-15)))
    case(f"{p} subnormal", lambda f=fn: f(QT * 1e-310, TAU_POS),
         Ok(close_to(QT * 1e-310 * np.array(_tau(TAU_POS))[:, None], atol=1e-320)))
    case(f"{p} T=0", lambda f=fn: f(QT[:, :0], 0), Ok(shape_is((2, 0, 4))))
    case(f"{p} NaN", lambda f=fn: f(QT * np.nan, TAU_POS), Named(name))
    case(f"{p} bool", lambda f=fn: f(QT > 0, TAU_POS), Named(name, TypeError))
    case(f"{p} None", lambda f=fn: f(None, TAU_POS), Named(name, TypeError))
    case(f"{p} 1-D", lambda f=fn: f(QT[0, 0], 4), Named(name))
    case(f"{p} T mismatch", lambda f=fn: f(QT, 6), Named(name))
    case(f"{p} positions 2-D", lambda f=fn: f(QT, TAU_POS[None]), Named("positions"))
case("apply_attn_temperature adjoint", lambda: (
    np.sum(irope.apply_attn_temperature(QT, TAU_POS, attn_scale=2) * DY[:, :, :4].repeat(2, 1)[:, :7]),
    np.sum(QT * irope.apply_attn_temperature_backward(DY[:, :, :4].repeat(2, 1)[:, :7], TAU_POS, attn_scale=2))),
    Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-12)))


def _temperature_layer_equals_hand():
    """A NoPETemperature layer equals a plain NoPE layer fed queries scaled by tau (independent: the weights' q)."""
    x = RNG.standard_normal((1, 6, 8))
    hot = MultiHeadAttention(8, 2, scheme=irope.NoPETemperature(attn_scale=1.0, floor_scale=2), seed=4)
    tau = np.array(_tau(range(6), 1.0, 2))
    q = (x @ hot.wq).reshape(1, 6, 2, 4).transpose(0, 2, 1, 3) * tau[:, None]
    k = (x @ hot.wk).reshape(1, 6, 2, 4).transpose(0, 2, 1, 3)
    v = (x @ hot.wv).reshape(1, 6, 2, 4).transpose(0, 2, 1, 3)
    logits = np.einsum("bhtd,bhsd->bhts", q, k) / 2 + np.where(np.tril(np.ones((6, 6))) > 0, 0, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    out = ((w / w.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(1, 6, 8) @ hot.wo
    return hot(x, causal=True), out


case("NoPETemperature layer == by hand", _temperature_layer_equals_hand,
     Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-10, atol=1e-12)))
for kw, name, exc in (({"attn_scale": -1}, "attn_scale", ValueError), ({"floor_scale": 0}, "floor_scale", ValueError),
                      ({"float32": "no"}, "float32", TypeError), ({"attn_scale": "1"}, "attn_scale", TypeError)):
    case(f"NoPETemperature {kw}", lambda k=kw: irope.NoPETemperature(**k), Named(name, exc))

# --------------------------------------------------------------------------- masks, by their rule

MQ, MK = [0, 1, 2, 5, 9], [0, 1, 2, 3, 5, 8, 9]


def _rule(q, k, keep):
    return [[bool(keep(int(i), int(j))) for j in k] for i in q]


for W in (1, 2, 3, 10 ** 9, 2 ** 62):
    case(f"sliding_window_mask W={W}", lambda w=W: masks.sliding_window_mask(MQ, MK, w),
         Ok(equals(_rule(MQ, MK, lambda i, j, w=W: i - w < j <= i))))
for C in (1, 2, 3, 10 ** 9, 2 ** 62):
    case(f"chunk_mask C={C}", lambda c=C: masks.chunk_mask(MQ, MK, c),
         Ok(equals(_rule(MQ, MK, lambda i, j, c=C: i // c == j // c))))
case("chunk_mask int positions", lambda: masks.chunk_mask(4, 4, 2), Ok(equals(_rule(range(4), range(4),
                                                                                    lambda i, j: i // 2 == j // 2))))
case("chunk_mask int64 max", lambda: masks.chunk_mask([I64.max], [I64.max - 1, 0], 2 ** 62),
     Ok(equals([[True, False]])))
case("sliding_window_mask int64 max", lambda: masks.sliding_window_mask([I64.max], [I64.max - 1, 0], 2 ** 62),
     Ok(equals([[True, False]])))
case("chunk_mask empty", lambda: masks.chunk_mask([], [0, 1], 2), Ok(shape_is((0, 2))))
case("sliding_window_mask empty", lambda: masks.sliding_window_mask([0], [], 2), Ok(shape_is((1, 0))))
for fn, name in ((masks.chunk_mask, "chunk"), (masks.sliding_window_mask, "window")):
    p = fn.__name__
    for bad, exc in ((0, ValueError), (-1, ValueError), (2 ** 62 + 1, ValueError), (2 ** 63, ValueError),
                     (2 ** 70, ValueError), (2.0, TypeError), (True, TypeError), ("2", TypeError), (None, TypeError)):
        case(f"{p} {name} {bad!r}", lambda f=fn, b=bad: f(MQ, MK, b), Named(name, exc))
    for bad, exc in (([-1, 0], ValueError), ([0.5], ValueError), ([[0, 1], [0]], ValueError), ([[0, 1]], ValueError),
                     ([True], TypeError), ("ab", TypeError), ([np.inf], ValueError)):
        case(f"{p} q_positions {bad!r}", lambda f=fn, b=bad: f(b, MK, 2), Named("q_positions", exc))
        case(f"{p} k_positions {bad!r}", lambda f=fn, b=bad: f(MQ, b, 2), Named("k_positions", exc))


def _chunked_layer(causal):
    """A chunked layer against the dense attention of the same weights with the rule's mask built by hand."""
    x = RNG.standard_normal((1, 6, 8))
    layer = MultiHeadAttention(8, 2, attention_chunk=4, seed=6)
    allowed = np.array(_rule(range(6), range(6), (lambda i, j: i // 4 == j // 4 and j <= i) if causal
                             else (lambda i, j: i // 4 == j // 4)))
    q, k, v = ((x @ w).reshape(1, 6, 2, 4).transpose(0, 2, 1, 3) for w in (layer.wq, layer.wk, layer.wv))
    logits = np.where(allowed, np.einsum("bhtd,bhsd->bhts", q, k) / 2, -np.inf)
    w = np.exp(logits - logits.max(-1, keepdims=True))
    out = ((w / w.sum(-1, keepdims=True)) @ v).transpose(0, 2, 1, 3).reshape(1, 6, 8) @ layer.wo
    return layer(x, causal=causal), out


case("layer chunks causal == by hand", lambda: _chunked_layer(True),
     Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-10, atol=1e-12)))
case("layer chunks without causal == by hand", lambda: _chunked_layer(False),
     Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-10, atol=1e-12)))
case("layer window without causal", lambda: MultiHeadAttention(8, 2, sliding_window=2)(np.ones((1, 3, 8))),
     Named("causal"))
case("layer window 2**63", lambda: MultiHeadAttention(8, 2, sliding_window=2 ** 63), Named("sliding_window"))
case("layer chunk 2**63", lambda: MultiHeadAttention(8, 2, attention_chunk=2 ** 63), Named("attention_chunk"))

# --------------------------------------------------------------------------- Shaw, by Eq. 3 and 4 in loops

K_REL = 2
SQ, SK = np.array([0, 1, 2, 6]), np.array([0, 1, 3, 4, 5, 6])
QS = RNG.standard_normal((2, 4, 3))                                     # (H, T, D)
WK, WV = RNG.standard_normal((5, 3)), RNG.standard_normal((5, 3))        # (2k + 1, D)
WTS = RNG.random((2, 4, 6))                                              # (H, T, S)
DOUT_S = RNG.standard_normal((2, 4, 3))
DLOG = RNG.standard_normal((2, 4, 6))


def _bucket(i, j, k):
    return max(-k, min(k, int(j) - int(i))) + k


def _logits_loop(q, w_k, qp, kp, k):
    out = np.zeros((*q.shape[:-1], len(kp)))
    for h in range(q.shape[0]):
        for t, i in enumerate(qp):
            for s, j in enumerate(kp):
                out[h, t, s] = sum(q[h, t, d] * w_k[_bucket(i, j, k), d] for d in range(q.shape[-1]))
    return out


def _values_loop(wts, w_v, qp, kp, k):
    out = np.zeros((*wts.shape[:-1], w_v.shape[1]))
    for h in range(wts.shape[0]):
        for t, i in enumerate(qp):
            for s, j in enumerate(kp):
                out[h, t] += wts[h, t, s] * w_v[_bucket(i, j, k)]
    return out


case("relative_buckets", lambda: shaw.relative_buckets(SQ, SK, K_REL),
     Ok(equals([[_bucket(i, j, K_REL) for j in SK] for i in SQ])))
case("relative_buckets k=0", lambda: shaw.relative_buckets(SQ, SK, 0), Ok(equals([[0] * 6] * 4)))
case("relative_buckets int64 ends", lambda: shaw.relative_buckets([I64.min, I64.max], [I64.max, I64.min, 0], 2),
     Ok(equals([[4, 2, 4], [2, 0, 0]])))        # j - i = 2**64 - 1, 0, 2**63; 0, -(2**64 - 1), -(2**63 - 1)
case("relative_buckets k 2**62-1", lambda: shaw.relative_buckets([I64.min], [I64.max, I64.min], 2 ** 62 - 1),
     Ok(equals([[2 * (2 ** 62 - 1), 2 ** 62 - 1]])))
case("relative_buckets negative positions", lambda: shaw.relative_buckets([-5, 3], [-9, 0, 4], 3),
     Ok(equals([[_bucket(i, j, 3) for j in (-9, 0, 4)] for i in (-5, 3)])))
case("relative_buckets 10**9", lambda: shaw.relative_buckets([10 ** 9], [0, 10 ** 9 + 1], 10 ** 9),
     Ok(equals([[0, 10 ** 9 + 1]])))
case("relative_buckets empty", lambda: shaw.relative_buckets([], SK, 2), Ok(shape_is((0, 6))))
case("relative_buckets int T", lambda: shaw.relative_buckets(3, 2, 1), Ok(equals([[1, 2], [0, 1], [0, 0]])))
for bad, exc in ((-1, ValueError), (2 ** 62, ValueError), (2 ** 63, ValueError), (2 ** 70, ValueError), (1.0, TypeError),
                 (True, TypeError), ("2", TypeError), (None, TypeError)):
    case(f"relative_buckets k {bad!r}", lambda b=bad: shaw.relative_buckets(SQ, SK, b),
         Named("max_relative_position", exc))
for bad, exc in (([0.5], ValueError), ([[0, 1], [2]], ValueError), ([[0, 1]], ValueError), ([True], TypeError),
                 ("ab", TypeError), ([np.nan], ValueError), ([1e19], ValueError)):
    case(f"relative_buckets q_positions {bad!r}", lambda b=bad: shaw.relative_buckets(b, SK, 2), Named("q_positions", exc))
    case(f"relative_buckets k_positions {bad!r}", lambda b=bad: shaw.relative_buckets(SQ, b, 2), Named("k_positions", exc))

for fn in (shaw.relative_logits, shaw.relative_logits_pairwise):
    p = fn.__name__
    case(p, lambda f=fn: f(QS, WK, SQ, SK, max_relative_position=K_REL), Ok(close_to(_logits_loop(QS, WK, SQ, SK, K_REL))))
    for dtype, tol in ((np.float32, 1e-5), (np.float16, 1e-2), (np.longdouble, 1e-12)):
        case(f"{p} {np.dtype(dtype).name}", lambda f=fn, d=dtype: f(QS.astype(d), WK.astype(d), SQ, SK,
                                                                    max_relative_position=K_REL),
             Ok(close_to(_logits_loop(QS, WK, SQ, SK, K_REL), rtol=tol, atol=tol)))
    case(f"{p} 1e300 q", lambda f=fn: f(QS * 1e300, WK, SQ, SK, max_relative_position=K_REL),
         Ok(close_to(_logits_loop(QS * 1e300, WK, SQ, SK, K_REL), rtol=1e-12, atol=0)))
    case(f"{p} T=0", lambda f=fn: f(QS[:, :0], WK, [], SK, max_relative_position=K_REL), Ok(shape_is((2, 0, 6))))
    case(f"{p} NaN q", lambda f=fn: f(QS * np.nan, WK, SQ, SK, max_relative_position=K_REL), Named("q"))
    case(f"{p} NaN w_k", lambda f=fn: f(QS, WK * np.nan, SQ, SK, max_relative_position=K_REL), Named("w_k"))
    case(f"{p} w_k rows", lambda f=fn: f(QS, WK[:4], SQ, SK, max_relative_position=K_REL), Named("w_k"))
    case(f"{p} w_k D", lambda f=fn: f(QS, WK[:, :2], SQ, SK, max_relative_position=K_REL), Named("w_k"))
    case(f"{p} w_k 1-D", lambda f=fn: f(QS, WK[:, 0], SQ, SK, max_relative_position=K_REL), Named("w_k"))
    case(f"{p} q T", lambda f=fn: f(QS[:, :3], WK, SQ, SK, max_relative_position=K_REL), Named("q"))
    case(f"{p} q 1-D", lambda f=fn: f(QS[0, 0], WK, SQ, SK, max_relative_position=K_REL), Named("q"))
    case(f"{p} q bool", lambda f=fn: f(QS > 0, WK, SQ, SK, max_relative_position=K_REL), Named("q", TypeError))
    case(f"{p} k 2**70", lambda f=fn: f(QS, WK, SQ, SK, max_relative_position=2 ** 70), Named("max_relative_position"))
    case(f"{p} float32 overflow", lambda f=fn: f(QS.astype(np.float32) * 1e30, WK.astype(np.float32) * 1e30, SQ, SK,
                                                 max_relative_position=K_REL), Named("q"))
for fn in (shaw.relative_values, shaw.relative_values_pairwise):
    p = fn.__name__
    case(p, lambda f=fn: f(WTS, WV, SQ, SK, max_relative_position=K_REL), Ok(close_to(_values_loop(WTS, WV, SQ, SK, K_REL))))
    case(f"{p} float32", lambda f=fn: f(WTS.astype(np.float32), WV.astype(np.float32), SQ, SK,
                                        max_relative_position=K_REL),
         Ok(close_to(_values_loop(WTS, WV, SQ, SK, K_REL), rtol=1e-5, atol=1e-6)))
    case(f"{p} S=0", lambda f=fn: f(WTS[..., :0], WV, SQ, [], max_relative_position=K_REL), Ok(close_to(np.zeros((2, 4, 3)))))
    case(f"{p} NaN weights", lambda f=fn: f(WTS * np.nan, WV, SQ, SK, max_relative_position=K_REL), Named("weights"))
    case(f"{p} inf w_v", lambda f=fn: f(WTS, WV * np.inf, SQ, SK, max_relative_position=K_REL), Named("w_v"))
    case(f"{p} weights S", lambda f=fn: f(WTS[..., :5], WV, SQ, SK, max_relative_position=K_REL), Named("weights"))
    case(f"{p} w_v rows", lambda f=fn: f(WTS, WV[:3], SQ, SK, max_relative_position=K_REL), Named("w_v"))
    case(f"{p} float32 overflow", lambda f=fn: f(WTS.astype(np.float32) * 1e20, WV.astype(np.float32) * 1e20, SQ, SK,
                                                 max_relative_position=K_REL), Named("weights"))


def _adjoint(forward, backward, x, dout):
    """``<forward(x), dout> == <x, backward(dout)>`` for a linear map (Shaw's terms are linear in q, in weights)."""
    return lambda: (np.sum(forward(x) * dout), np.sum(x * backward(dout)))


ADJ = Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-12))
case("relative_logits_backward dq adjoint", _adjoint(
    lambda q: shaw.relative_logits(q, WK, SQ, SK, max_relative_position=K_REL),
    lambda d: shaw.relative_logits_backward(QS, WK, SQ, SK, d, max_relative_position=K_REL)[0], QS, DLOG), ADJ)
case("relative_logits_backward dw_k adjoint", _adjoint(
    lambda w: shaw.relative_logits(QS, w, SQ, SK, max_relative_position=K_REL),
    lambda d: shaw.relative_logits_backward(QS, WK, SQ, SK, d, max_relative_position=K_REL)[1], WK, DLOG), ADJ)
case("relative_values_backward dweights adjoint", _adjoint(
    lambda w: shaw.relative_values(w, WV, SQ, SK, max_relative_position=K_REL),
    lambda d: shaw.relative_values_backward(WTS, WV, SQ, SK, d, max_relative_position=K_REL)[0], WTS, DOUT_S), ADJ)
case("relative_values_backward dw_v adjoint", _adjoint(
    lambda w: shaw.relative_values(WTS, w, SQ, SK, max_relative_position=K_REL),
    lambda d: shaw.relative_values_backward(WTS, WV, SQ, SK, d, max_relative_position=K_REL)[1], WV, DOUT_S), ADJ)
case("relative_logits_backward dlogits shape", lambda: shaw.relative_logits_backward(
    QS, WK, SQ, SK, DLOG[..., :5], max_relative_position=K_REL), Named("dlogits"))
case("relative_logits_backward dlogits heads", lambda: shaw.relative_logits_backward(
    QS, WK, SQ, SK, DLOG[:1], max_relative_position=K_REL), Named("dlogits"))
case("relative_logits_backward dlogits NaN", lambda: shaw.relative_logits_backward(
    QS, WK, SQ, SK, DLOG * np.nan, max_relative_position=K_REL), Named("dlogits"))
case("relative_values_backward dout shape", lambda: shaw.relative_values_backward(
    WTS, WV, SQ, SK, DOUT_S[..., :2], max_relative_position=K_REL), Named("dout"))
case("relative_values_backward dout heads", lambda: shaw.relative_values_backward(
    WTS, WV, SQ, SK, DOUT_S[:1], max_relative_position=K_REL), Named("dout"))
case("relative_values_backward dout inf", lambda: shaw.relative_values_backward(
    WTS, WV, SQ, SK, DOUT_S * np.inf, max_relative_position=K_REL), Named("dout"))


def _shaw_cached_equals_full():
    layer = MultiHeadAttention(8, 2, scheme=shaw.Shaw(2), seed=8)
    x = RNG.standard_normal((1, 7, 8))
    cache = layer.new_cache()
    steps = [layer(x[:, a:b], causal=True, cache=cache) for a, b in ((0, 3), (3, 4), (4, 7))]
    return np.concatenate(steps, axis=1), layer(x, causal=True)


def _shaw_layer_by_hand():
    """The Shaw layer against Eq. 3-4 summed pair by pair over the layer's own weights and tables."""
    layer = MultiHeadAttention(8, 2, scheme=shaw.Shaw(1), seed=9)
    x = RNG.standard_normal((1, 4, 8))
    q, k, v = ((x @ w).reshape(4, 2, 4).transpose(1, 0, 2) for w in (layer.wq, layer.wk, layer.wv))
    out = np.zeros((2, 4, 4))
    for h in range(2):
        for i in range(4):
            e = [q[h, i] @ (k[h, j] + layer.scheme.w_k[_bucket(i, j, 1)]) / 2 for j in range(i + 1)]
            a = np.exp(np.array(e) - max(e))
            a /= a.sum()
            out[h, i] = sum(a[j] * (v[h, j] + layer.scheme.w_v[_bucket(i, j, 1)]) for j in range(i + 1))
    return layer(x, causal=True), out.transpose(1, 0, 2).reshape(1, 4, 8) @ layer.wo


case("Shaw cached == full", _shaw_cached_equals_full,
     Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-10, atol=1e-12)))
case("Shaw layer == Eq. 3-4 by hand", _shaw_layer_by_hand,
     Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-10, atol=1e-12)))
case("Shaw k=0 layer", lambda: MultiHeadAttention(8, 2, scheme=shaw.Shaw(0))(np.ones((1, 2, 8)), causal=True),
     Ok(shape_is((1, 2, 8))))
for bad, exc in ((-1, ValueError), (2 ** 62, ValueError), (2 ** 63, ValueError), (2 ** 70, ValueError),
                 (1.5, TypeError), (True, TypeError), ("16", TypeError), (None, TypeError)):
    case(f"Shaw({bad!r})", lambda b=bad: shaw.Shaw(b), Named("max_relative_position", exc))
case("Shaw(2**40) bind", lambda: MultiHeadAttention(8, 2, scheme=shaw.Shaw(2 ** 40)), Named("max_relative_position"))

# --------------------------------------------------------------------------- the Llama 4 / SmolLM3 readers

L4 = {"num_hidden_layers": 4, "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
      "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "attention_chunk_size": 8}
L4_TF4 = {"num_hidden_layers": 4, "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 4, "rope_theta": 500000.0, "rope_scaling": None, "attention_chunk_size": 8,
          "attn_temperature_tuning": 4}                                   # transformers 4.51's defaults


def _reads(reader, config, i, scheme_type, **want):
    def check(result):
        scheme, kw = result
        assert type(scheme) is scheme_type, scheme
        for key, value in want.items():
            got = kw[key] if key in kw else getattr(scheme, key)
            assert got == value, (key, got, value)
    return lambda: reader(config, i), Ok(check)


for name, config in (("tf5", L4), ("tf4", L4_TF4)):
    case(f"llama4_layer {name} rope layer", *_reads(irope.llama4_layer, config, 0, Rotary, base=500000.0,
                                                    attention_chunk=8, num_kv_heads=2, head_dim=4, bias=False,
                                                    layout="interleaved"))
    case(f"llama4_layer {name} nope layer", *_reads(irope.llama4_layer, config, 3, irope.NoPETemperature,
                                                    attention_chunk=None, attn_scale=0.1, floor_scale=8192))
    case(f"smollm3_layer {name} rope layer", *_reads(irope.smollm3_layer, config, 0, Rotary, base=500000.0,
                                                     layout="half", head_dim=4))
    case(f"smollm3_layer {name} nope layer", *_reads(irope.smollm3_layer, config, 3, NoPE))
case("llama4_layer scaling tf4", *_reads(irope.llama4_layer, {**L4_TF4, "rope_scaling": {
    "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192}}, 0, Rotary, base=500000.0, scaling_kind="llama3"))
case("llama4_layer scaling 'type'", *_reads(irope.llama4_layer, {**L4_TF4, "rope_scaling": {
    "type": "linear", "factor": 2.0}}, 0, Rotary, scaling_kind="linear"))
case("llama4_layer no theta", *_reads(irope.llama4_layer, {k: v for k, v in L4_TF4.items() if k != "rope_theta"}, 0,
                                      Rotary, base=500000.0))
case("smollm3_layer no theta", *_reads(irope.smollm3_layer, {k: v for k, v in L4_TF4.items() if k != "rope_theta"}, 0,
                                       Rotary, base=2000000.0))
case("llama4_layer temperature off", *_reads(irope.llama4_layer, {**L4, "attn_temperature_tuning": False}, 3, NoPE))
case("llama4_layer temperature 0", *_reads(irope.llama4_layer, {**L4, "attn_temperature_tuning": 0}, 3, NoPE))
case("llama4_layer temperature np.True_", *_reads(irope.llama4_layer, {**L4, "attn_temperature_tuning": np.True_}, 3,
                                                  irope.NoPETemperature))
case("llama4_layer layer_types", *_reads(irope.llama4_layer, {**L4, "layer_types": ["full_attention"] * 4}, 0, Rotary,
                                         attention_chunk=None))
case("llama4_layer layer_types tuple", *_reads(irope.llama4_layer, {**L4, "layer_types": ("chunked_attention",) * 4}, 3,
                                               irope.NoPETemperature, attention_chunk=8))
case("llama4_layer no_rope_layers", *_reads(irope.llama4_layer, {**L4, "no_rope_layers": [0, 1, 1, 1]}, 0,
                                            irope.NoPETemperature))
case("llama4_layer no_rope_layers ndarray", *_reads(irope.llama4_layer, {**L4, "no_rope_layers": np.array([1, 1, 0, 1])},
                                                    2, irope.NoPETemperature))
case("llama4_layer no_rope_layers []", *_reads(irope.llama4_layer, {**L4, "no_rope_layers": []}, 3, irope.NoPETemperature))
case("llama4_layer interval 2", *_reads(irope.llama4_layer, {**L4, "no_rope_layer_interval": 2}, 1,
                                        irope.NoPETemperature))
case("llama4_layer bias True", *_reads(irope.llama4_layer, {**L4, "attention_bias": True}, 0, Rotary, bias=True))
case("llama4_layer head_dim None", *_reads(irope.llama4_layer, {**L4, "head_dim": None}, 0, Rotary, head_dim=4))
case("llama4_layer kv None", *_reads(irope.llama4_layer, {**L4, "num_key_value_heads": None}, 0, Rotary, num_kv_heads=4))
case("llama4_layer chunk None", lambda: irope.llama4_layer({**L4, "attention_chunk_size": None}, 0),
     Named("attention_chunk_size"))                                       # HF's create_chunked_causal_mask refuses it
case("llama4_layer chunk None full layer", *_reads(irope.llama4_layer, {**L4, "attention_chunk_size": None}, 3,
                                                   irope.NoPETemperature, attention_chunk=None))
case("llama4_layer chunk absent", *_reads(irope.llama4_layer, {k: v for k, v in L4.items() if k != "attention_chunk_size"},
                                          0, Rotary, attention_chunk=8192))
case("llama4_layer chunk 2**62", *_reads(irope.llama4_layer, {**L4, "attention_chunk_size": 2 ** 62}, 0, Rotary,
                                         attention_chunk=2 ** 62))
case("llama4_layer builds", lambda: MultiHeadAttention(**irope.llama4_layer(L4_TF4, 0)[1], scheme=irope.llama4_layer(
    L4_TF4, 0)[0])(np.ones((1, 3, 16)), causal=True), Ok(shape_is((1, 3, 16))))
for change, name, exc in (
        ({"layer_types": "chunked_attention"}, "layer_types", TypeError),
        ({"layer_types": ["foo"] * 4}, "layer_types", ValueError),
        ({"layer_types": [None] * 4}, "layer_types", ValueError),
        ({"layer_types": ["chunked_attention"] * 3}, "layer_types", ValueError),
        ({"layer_types": ["chunked_attention"] * 5}, "layer_types", ValueError),
        ({"layer_types": []}, "layer_types", ValueError),
        ({"layer_types": 4}, "layer_types", TypeError),
        ({"attention_bias": "no"}, "attention_bias", TypeError),
        ({"attention_bias": "false"}, "attention_bias", TypeError),
        ({"attention_bias": 0}, "attention_bias", TypeError),
        ({"attn_temperature_tuning": "false"}, "attn_temperature_tuning", TypeError),
        ({"attn_temperature_tuning": 1.0}, "attn_temperature_tuning", TypeError),
        ({"attn_temperature_tuning": [True]}, "attn_temperature_tuning", TypeError),
        ({"no_rope_layers": 0}, "no_rope_layers", TypeError),
        ({"no_rope_layers": "1101"}, "no_rope_layers", TypeError),
        ({"no_rope_layers": [1, 1, 0]}, "no_rope_layers", ValueError),
        ({"no_rope_layers": [1, 1, 0, 2]}, "no_rope_layers", ValueError),
        ({"no_rope_layers": ["1"] * 4}, "no_rope_layers", ValueError),
        ({"no_rope_layers": np.array([[1, 1], [0, 1]])}, "no_rope_layers", ValueError),
        ({"no_rope_layer_interval": 0}, "no_rope_layer_interval", ValueError),
        ({"no_rope_layer_interval": 2.0}, "no_rope_layer_interval", TypeError),
        ({"num_hidden_layers": 0}, "num_hidden_layers", ValueError),
        ({"num_hidden_layers": "4"}, "num_hidden_layers", TypeError),
        ({"num_hidden_layers": True}, "num_hidden_layers", TypeError),
        ({"hidden_size": 0}, "hidden_size", ValueError),
        ({"hidden_size": 16.0}, "hidden_size", TypeError),
        ({"num_attention_heads": -4}, "num_attention_heads", ValueError),
        ({"num_key_value_heads": 0}, "num_key_value_heads", ValueError),
        ({"num_key_value_heads": "2"}, "num_key_value_heads", TypeError),
        ({"head_dim": 0}, "head_dim", ValueError),
        ({"head_dim": 4.0}, "head_dim", TypeError),
        ({"head_dim": None, "num_attention_heads": 32}, "head_dim", ValueError),
        ({"attention_chunk_size": 0}, "attention_chunk_size", ValueError),
        ({"attention_chunk_size": 2 ** 63}, "attention_chunk_size", ValueError),
        ({"attention_chunk_size": "8"}, "attention_chunk_size", TypeError),
        ({"rope_parameters": "default"}, "rope_parameters", TypeError),
        ({"rope_parameters": {"rope_type": "nosuch"}}, "rope_type", ValueError),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": -1.0}}, "rope_theta", ValueError),
        ({"rope_parameters": {"rope_type": "default", "rope_theta": "5e5"}}, "rope_theta", TypeError),
        ({"rope_parameters": {"rope_type": "default", "factor": 2.0}}, "factor", ValueError)):
    layer = 3 if "temperature" in str(change) else 0
    case(f"llama4_layer {change!r}"[:120], lambda c=change, i=layer: irope.llama4_layer({**L4, **c}, i), Named(name, exc))
for change, name, exc in (({"rope_theta": "big", "rope_parameters": None}, "rope_theta", TypeError),
                          ({"rope_theta": np.nan, "rope_parameters": None}, "rope_theta", ValueError),
                          ({"rope_scaling": [1, 2], "rope_parameters": None}, "rope_scaling", TypeError)):
    case(f"llama4_layer {change!r}", lambda c=change: irope.llama4_layer({**L4, **c}, 0), Named(name, exc))
for i, name, exc in ((4, "layer_idx", ValueError), (-1, "layer_idx", ValueError), (2 ** 63, "layer_idx", ValueError),
                     (1.0, "layer_idx", TypeError), (True, "layer_idx", TypeError), ("0", "layer_idx", TypeError)):
    case(f"llama4_layer layer_idx {i!r}", lambda j=i: irope.llama4_layer(L4, j), Named(name, exc))
    case(f"smollm3_layer layer_idx {i!r}", lambda j=i: irope.smollm3_layer(L4, j), Named(name, exc))
for config in (None, [("hidden_size", 16)], "config"):
    case(f"llama4_layer config {config!r}", lambda c=config: irope.llama4_layer(c, 0), Named("config", TypeError))
    case(f"smollm3_layer config {config!r}", lambda c=config: irope.smollm3_layer(c, 0), Named("config", TypeError))
    case(f"use_rope config {config!r}", lambda c=config: irope.use_rope(c, 0), Named("config", TypeError))
for change, name, exc in (({"use_sliding_window": True, "sliding_window": 8}, "use_sliding_window", ValueError),
                          ({"use_sliding_window": "false"}, "use_sliding_window", TypeError),
                          ({"layer_types": ["sliding_attention"] * 4}, "layer_types", ValueError),
                          ({"layer_types": ["chunked_attention"] * 4}, "layer_types", ValueError),
                          ({"layer_types": ["full_attention"] * 2}, "layer_types", ValueError),
                          ({"attention_bias": "yes"}, "attention_bias", TypeError),
                          ({"head_dim": -1}, "head_dim", ValueError)):
    case(f"smollm3_layer {change!r}", lambda c=change: irope.smollm3_layer({**L4_TF4, **c}, 0), Named(name, exc))
case("smollm3_layer full layer_types", *_reads(irope.smollm3_layer, {**L4_TF4, "layer_types": ["full_attention"] * 4}, 3,
                                               NoPE))
case("smollm3_layer use_sliding_window False", *_reads(irope.smollm3_layer, {**L4_TF4, "use_sliding_window": False}, 0,
                                                       Rotary))
case("llama4 GQA heads that do not divide", lambda: MultiHeadAttention(**irope.llama4_layer(
    {**L4, "num_key_value_heads": 3}, 0)[1]), Named("num_kv_heads"))
case("llama4 hidden not divisible without head_dim", *_reads(irope.llama4_layer, {**L4, "head_dim": None, "hidden_size": 18},
                                                             0, Rotary, head_dim=4))      # HF: hidden // heads

# --------------------------------------------------------------------------- the Gemma 3 readers

G3 = {"num_hidden_layers": 6, "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
      "query_pre_attn_scalar": 16, "sliding_window": 3, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
      "rope_scaling": {"rope_type": "linear", "factor": 8.0}}
G3_TF5 = {"num_hidden_layers": 6, "hidden_size": 16, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 4,
          "query_pre_attn_scalar": 16, "sliding_window": 3, "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
          "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                              "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6}}}
for name, config in (("legacy", G3), ("tf5", G3_TF5)):
    case(f"gemma3_attention {name} local", *_reads(lg.gemma3_attention, config, 0, Rotary, base=1e4, scaling_kind=None,
                                                   sliding_window=3, scale=0.25, layout="half", num_kv_heads=2))
    case(f"gemma3_attention {name} global", *_reads(lg.gemma3_attention, config, 5, Rotary, base=1e6,
                                                    scaling_kind="linear", sliding_window=None, scale=0.25))
case("gemma3_layer_types pattern 6", lambda: lg.gemma3_layer_types(G3),
     Ok(equals(["sliding_attention"] * 5 + ["full_attention"])))
case("gemma3_layer_types pattern 2", lambda: lg.gemma3_layer_types({**G3, "sliding_window_pattern": 2}),
     Ok(equals(["sliding_attention", "full_attention"] * 3)))
case("gemma3_layer_types pattern 10**9", lambda: lg.gemma3_layer_types({**G3, "sliding_window_pattern": 10 ** 9}),
     Ok(equals(["sliding_attention"] * 6)))
case("gemma3_layer_types ndarray", lambda: lg.gemma3_layer_types({**G3, "layer_types": np.array(
    ["full_attention"] * 6)}), Ok(equals(["full_attention"] * 6)))
case("gemma3_rope_parameters local", lambda: lg.gemma3_rope_parameters(G3, "sliding_attention"),
     Ok(equals({"rope_type": "default", "rope_theta": 1e4})))
case("gemma3_rope_parameters global", lambda: lg.gemma3_rope_parameters(G3, "full_attention"),
     Ok(equals({"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6})))
case("gemma3_rope_parameters defaults", lambda: lg.gemma3_rope_parameters({}, "full_attention"),
     Ok(equals({"rope_type": "default", "rope_theta": 1e6})))
case("gemma3_attention defaults", *_reads(lg.gemma3_attention, {"num_hidden_layers": 6, "hidden_size": 16,
                                                                "num_attention_heads": 4}, 0, Rotary,
                                          head_dim=256, sliding_window=4096, scale=1 / 16, num_kv_heads=4))
case("gemma3 layer builds and runs", lambda: MultiHeadAttention(scheme=lg.gemma3_attention(G3, 0)[0],
                                                                **lg.gemma3_attention(G3, 0)[1])(
    np.ones((1, 4, 16)), causal=True), Ok(shape_is((1, 4, 16))))
RP, LT, GA = lg.gemma3_rope_parameters, lg.gemma3_layer_types, lg.gemma3_attention
FULL, LOCAL = "full_attention", "sliding_attention"
for label, call, name, exc in (
        ("rope_parameters layer_type foo", lambda: RP({}, "foo"), "layer_type", ValueError),
        ("rope_parameters layer_type None", lambda: RP({}, None), "layer_type", TypeError),
        ("rope_parameters layer_type 0", lambda: RP({}, 0), "layer_type", TypeError),
        ("rope_parameters config None", lambda: RP(None, FULL), "config", TypeError),
        ("rope_parameters config str", lambda: RP("cfg", FULL), "config", TypeError),
        ("rope_parameters no entry for the type", lambda: RP({"rope_parameters": {FULL: {}}}, LOCAL),
         "rope_parameters", ValueError),
        ("rope_parameters a list", lambda: RP({"rope_parameters": [1]}, FULL), "rope_parameters", TypeError),
        ("rope_parameters entry None", lambda: RP({"rope_parameters": {FULL: None}}, FULL), "rope_parameters",
         TypeError),
        ("rope_parameters rope_scaling float", lambda: RP({"rope_scaling": 8.0}, FULL), "rope_scaling", TypeError),
        ("layer_types config None", lambda: LT(None), "config", TypeError),
        ("layer_types ints", lambda: LT({"layer_types": [1, 2]}), "layer_types", ValueError),
        ("layer_types int and str", lambda: LT({"layer_types": [1, "x"]}), "layer_types", ValueError),
        ("layer_types a string", lambda: LT({"layer_types": FULL}), "layer_types", TypeError),
        ("layer_types chunked", lambda: LT({"layer_types": ["chunked_attention"]}), "layer_types", ValueError),
        ("layer_types short", lambda: LT({**G3, "layer_types": [FULL] * 5}), "layer_types", ValueError),
        ("layer_types 0 layers", lambda: LT({"num_hidden_layers": 0}), "num_hidden_layers", ValueError),
        ("layer_types no count", lambda: LT({}), "num_hidden_layers", TypeError),
        ("layer_types pattern 0", lambda: LT({"num_hidden_layers": 6, "sliding_window_pattern": 0}),
         "sliding_window_pattern", ValueError),
        ("layer_types pattern str", lambda: LT({"num_hidden_layers": 6, "sliding_window_pattern": "6"}),
         "sliding_window_pattern", TypeError),
        ("attention config None", lambda: GA(None, 0), "config", TypeError),
        ("attention layer_idx 6", lambda: GA(G3, 6), "layer_idx", ValueError),
        ("attention layer_idx -1", lambda: GA(G3, -1), "layer_idx", ValueError),
        ("attention layer_idx True", lambda: GA(G3, True), "layer_idx", TypeError),
        ("attention layer_idx 2**63", lambda: GA(G3, 2 ** 63), "layer_idx", ValueError),
        ("attention short layer_types", lambda: GA({**G3, "layer_types": [FULL] * 2}, 3), "layer_types", ValueError),
        ("attention softcapping", lambda: GA({**G3, "attn_logit_softcapping": 50.0}, 0), "attn_logit_softcapping",
         ValueError),
        ("attention bidirectional", lambda: GA({**G3, "use_bidirectional_attention": True}, 0),
         "use_bidirectional_attention", ValueError)):
    case(f"gemma3 {label}", call, Named(name, exc))
for key, bad, exc in (("query_pre_attn_scalar", 0, ValueError), ("query_pre_attn_scalar", "abc", TypeError),
                      ("query_pre_attn_scalar", None, TypeError), ("query_pre_attn_scalar", -16, ValueError),
                      ("query_pre_attn_scalar", np.nan, ValueError), ("query_pre_attn_scalar", 1e-310, ValueError),
                      ("query_pre_attn_scalar", True, TypeError), ("query_pre_attn_scalar", 2 ** 1100, ValueError),
                      ("head_dim", 0, ValueError), ("head_dim", 4.0, TypeError), ("head_dim", "4", TypeError),
                      ("num_key_value_heads", 0, ValueError), ("num_key_value_heads", -2, ValueError),
                      ("num_attention_heads", None, TypeError), ("num_attention_heads", 0, ValueError),
                      ("hidden_size", None, TypeError), ("hidden_size", 2.5, TypeError),
                      ("attention_bias", "false", TypeError), ("attention_bias", 1, TypeError),
                      ("sliding_window", None, TypeError), ("sliding_window", 0, ValueError),
                      ("sliding_window", 2 ** 63, ValueError), ("sliding_window", 3.0, TypeError)):
    case(f"gemma3_attention {key}={bad!r}", lambda k=key, b=bad: lg.gemma3_attention({**G3, k: b}, 0), Named(key, exc))
case("gemma3_attention query_pre_attn_scalar 1e300", *_reads(lg.gemma3_attention, {**G3, "query_pre_attn_scalar": 1e300},
                                                             0, Rotary, scale=1e-150))
case("gemma3_attention query_pre_attn_scalar 1e-300", *_reads(lg.gemma3_attention, {**G3, "query_pre_attn_scalar": 1e-300},
                                                              0, Rotary, scale=1e150))
case("gemma3_attention global ignores a bad window", *_reads(lg.gemma3_attention, {**G3, "sliding_window": None}, 5,
                                                             Rotary, sliding_window=None))
case("gemma3 GQA heads that do not divide", lambda: MultiHeadAttention(**lg.gemma3_attention(
    {**G3, "num_key_value_heads": 3}, 0)[1]), Named("num_kv_heads"))
case("gemma3 local layer without causal", lambda: MultiHeadAttention(scheme=lg.gemma3_attention(G3, 0)[0],
                                                                     **lg.gemma3_attention(G3, 0)[1])(np.ones((1, 2, 16))),
     Named("causal"))


# --------------------------------------------------------------------------- through the layer: fast, gradients, dtypes

LAYER_SCHEMES = {
    "mrope": lambda: {"scheme": mrope.MRotary(mrope_section=[2, 1, 1])},
    "mrope-interleaved": lambda: {"scheme": mrope.MRotary(mrope_section=[2, 1, 1], interleaved=True)},
    "shaw": lambda: {"scheme": shaw.Shaw(2)},
    "temperature": lambda: {"scheme": irope.NoPETemperature(attn_scale=0.7, floor_scale=2)},
    "temperature-f32": lambda: {"scheme": irope.NoPETemperature(attn_scale=0.7, floor_scale=2, float32=True)},
    "chunks": lambda: {"scheme": Rotary(layout="interleaved"), "attention_chunk": 3},
    "window": lambda: {"scheme": Rotary(layout="half"), "sliding_window": 3},
    "gemma3-local": lambda: dict(zip(("scheme", "kw"), lg.gemma3_attention({**G3, "hidden_size": 16}, 0))),
}
XL = RNG.standard_normal((2, 7, 16))
DYL = RNG.standard_normal((2, 7, 16))


def _build(make, name, **extra):
    kw = LAYER_SCHEMES[name]()
    more = kw.pop("kw", {})
    return make(**{"d_model": 16, "num_heads": 4, "head_dim": 8, "seed": 11, **kw, **more, **extra})


def _fast_equals_reference(name, block_size=None):
    def run():
        return (_build(fast.MultiHeadAttention, name, block_size=block_size)(XL, causal=True),
                _build(MultiHeadAttention, name, block_size=block_size)(XL, causal=True))
    return run, Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-9, atol=1e-12))


def _grad_x_matches_fd(name, make=MultiHeadAttention, h=1e-6):
    """<dL/dx, E> from layer.backward against central differences of sum(layer(x) * dy) along E."""
    def run():
        layer = _build(make, name)
        _, ctx = layer(XL, causal=True, return_context=True)
        grad = layer.backward(ctx, DYL)["x"]
        e = np.random.default_rng(1).standard_normal(XL.shape)
        f = lambda x: np.sum(layer(x, causal=True) * DYL)             # noqa: E731
        return np.sum(grad * e), (f(XL + h * e) - f(XL - h * e)) / (2 * h)
    return run, Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-6))


def _cached_equals_full(name, steps=(3, 1, 3)):
    def run():
        layer = _build(MultiHeadAttention, name)
        cache, outs, start = layer.new_cache(), [], 0
        for n in steps:
            outs.append(layer(XL[:, start:start + n], causal=True, cache=cache))
            start += n
        return np.concatenate(outs, axis=1), layer(XL, causal=True)
    return run, Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-10, atol=1e-12))


def _dtype_run(name, dtype, tol):
    def run():
        low = _build(MultiHeadAttention, name, dtype=dtype)
        ref = _build(MultiHeadAttention, name)
        return low(XL.astype(dtype), causal=True), ref(XL, causal=True)

    def check(pair):
        assert pair[0].dtype == np.dtype(dtype), pair[0].dtype
        np.testing.assert_allclose(pair[0].astype(np.float64), pair[1], rtol=tol, atol=tol)
    return run, Ok(check)


for name in LAYER_SCHEMES:
    case(f"layer {name} fast == reference", *_fast_equals_reference(name))
    case(f"layer {name} fast == reference blockwise", *_fast_equals_reference(name, block_size=2))
    case(f"layer {name} grad x == central differences", *_grad_x_matches_fd(name))
    case(f"layer {name} fast grad x == central differences", *_grad_x_matches_fd(name, make=fast.MultiHeadAttention))
    case(f"layer {name} cached == full", *_cached_equals_full(name))
    for dtype, tol in ((np.float32, 2e-5), (np.longdouble, 1e-12)):
        case(f"layer {name} {np.dtype(dtype).name}", *_dtype_run(name, dtype, tol))
    case(f"layer {name} NaN x", lambda n=name: _build(MultiHeadAttention, n)(XL * np.nan, causal=True), Named("x"))
    case(f"layer {name} positions float", lambda n=name: _build(MultiHeadAttention, n)(
        XL, positions=np.arange(7) + 0.5, causal=True), Named("positions"))
    case(f"layer {name} positions ragged", lambda n=name: _build(MultiHeadAttention, n)(
        XL[:, :2], positions=[[0, 1], [0]], causal=True), Named("positions"))
    case(f"layer {name} backward dy shape", lambda n=name: (lambda layer: layer.backward(
        layer(XL, causal=True, return_context=True)[1], DYL[:, :6]))(_build(MultiHeadAttention, n)), Named("dy"))
case("Shaw backward dlogits overflow float32", lambda: shaw.relative_logits_backward(
    QS.astype(np.float32), WK.astype(np.float32) * 1e30, SQ, SK, DLOG.astype(np.float32) * 1e20,
    max_relative_position=K_REL), Named("dlogits"))
case("Shaw backward dout overflow float32", lambda: shaw.relative_values_backward(
    WTS.astype(np.float32), WV.astype(np.float32) * 1e30, SQ, SK, DOUT_S.astype(np.float32) * 1e20,
    max_relative_position=K_REL), Named("dout"))


# --------------------------------------------------------------------------- running it

@pytest.mark.parametrize("label, call, expect", CASES, ids=[c[0] for c in CASES])
def test_campaign(label, call, expect):
    kind, detail = classify(call, expect)
    assert kind in ("clear error", "checked"), f"{kind}: {detail}"


def test_the_campaign_counts_its_calls():
    # Each row of CASES is one call: grow the table, do not shrink it.
    assert len(CASES) >= 677, len(CASES)
    assert len({c[0] for c in CASES}) == len(CASES), "labels must be unique"


if __name__ == "__main__":
    from collections import Counter
    counts = Counter()
    for label, call, expect in CASES:
        kind, detail = classify(call, expect)
        counts[kind, "error expected" if isinstance(expect, Named) else "result expected"] += 1
        if kind in ("silent", "vague"):
            print(f"{kind:7s} {label}: {detail[:300]}")
    print(f"{len(CASES)} calls:", dict(counts))
