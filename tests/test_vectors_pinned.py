"""The spec 1.2.0 cases pin what a port written from the spec alone had to guess, and spec/formulas.md
states enough to pass them.

Each port here is a few lines of NumPy written from spec/formulas.md, without calling minipos, run by
``spec/check_port.py`` over the committed vectors: the port as the page states it passes every case,
and a port with the guess the page rules out (float64 DeBERTa buckets, a real ``D/2 - 1`` in the
tensor2tensor exponent, LongRoPE's ratio where an explicit factor is given, a recomputed attention
factor where one is given) fails exactly the cases that target that guess.

Values from outside minipos: transformers 5.24.0 (``T5Attention._relative_position_bucket``, DeBERTa-v2's
``make_log_bucket_position``, ``_compute_longrope_parameters``, Speech2Text's fairseq table
``get_embedding``), compared live where torch is installed; and worked by hand: LongRoPE's
``sqrt(1 + ln 8 / ln 4096) = sqrt(1 + 3/12)``; DeBERTa's ``111 = 37 * 3`` and ``999 = 37 * 27``, so
``ceil(36 ln 3 / ln 27) = 12`` exactly; T5 with 2 causal buckets: ``n < 0`` is bucket 1, the rest 0.
"""

import importlib.util
import json
import math
import pathlib
import sys

import numpy as np
import pytest

from _torch import needs_torch, torch
from minipos import deberta, rope_scaling, sinusoidal, t5

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_port", ROOT / "spec" / "check_port.py")
check_port = importlib.util.module_from_spec(_spec)
sys.modules["check_port"] = check_port  # its dataclasses look the module up there
_spec.loader.exec_module(check_port)
F32 = np.float32


def _cases(family):
    return {c["name"]: c for c in check_port.load_family(family)["cases"]}


def _decode(case, name, where="inputs"):
    return check_port.decode(case[where][name])


def _passes_only(report, failing, among=None):
    """The port ran every case (of ``among``, if given, else of the family) and failed exactly ``failing``."""
    names = set(_cases(report.family)) if among is None else set(among)
    assert sorted(report.failed) == sorted(failing), str(report)
    assert set(report.passed) | set(report.failed) >= names
    assert set(report.passed) >= names - set(failing)


# --- ports written from spec/formulas.md --------------------------------------------------------

def t5_port(relative_position, *, bidirectional, num_buckets, max_distance, exact):
    n = np.asarray(relative_position, dtype=np.int64)
    P = num_buckets // 2 if bidirectional else num_buckets
    offset, m = (np.where(n > 0, P, 0), np.abs(n)) if bidirectional else (0, np.maximum(-n, 0))
    E, W = P // 2, P - P // 2
    if exact:                                                   # b >= E + k iff m^W E^k >= M^k E^W
        def log_bucket(d):
            return E + max(k for k in range(W) if d ** W * E ** k >= max_distance ** k * E ** W)
        large = np.array([log_bucket(int(d)) for d in np.maximum(m, E).ravel()]).reshape(m.shape)
    else:                                                       # the float32 steps
        x = np.maximum(m, E).astype(F32) / F32(E)
        l = np.log(x.astype(np.float64)).astype(F32)
        l = l / F32(math.log(max_distance / E))
        l = l * F32(P - E)
        large = E + np.trunc(l).astype(np.int64)
    return offset + np.where(m < E, m, np.minimum(large, P - 1))


def deberta_port(relative_pos, *, bucket_size, max_position, f=F32):
    r = np.asarray(relative_pos, dtype=np.int64)
    mid = bucket_size // 2
    x = np.maximum(np.abs(r), mid).astype(f) / f(mid)
    a = np.log(x.astype(np.float64)).astype(f)
    c = f(np.log(np.float64(f((max_position - 1) / mid))))
    bucket = np.ceil(a / c * f(mid - 1)) + f(mid)
    return np.where(np.abs(r) <= mid, r, np.sign(r) * bucket.astype(np.int64))


def longrope_port(*, kind, ratio_always=False, recompute=False, **params):
    if kind != "longrope":
        raise NotImplementedError(kind)                         # the other kinds: not this port's
    return _longrope(**params, ratio_always=ratio_always, recompute=recompute)


def _longrope(*, base, dim, short_factor, long_factor, original_max_position_embeddings, max_position_embeddings,
              seq_len, factor=None, attention_factor=None, ratio_always, recompute):
    L = original_max_position_embeddings
    w = base ** (-2.0 * np.arange(dim // 2) / dim)
    s = max_position_embeddings / L if factor is None or ratio_always else factor
    if attention_factor is None or recompute:
        attention_factor = 1.0 if s <= 1 else math.sqrt(1 + math.log(s) / math.log(L))
    return {"inv_freq": w / np.asarray(long_factor if seq_len > L else short_factor),
            "attention_factor": np.float64(attention_factor)}


def sinusoidal_port(positions, *, dim, base, layout, real_half=False):
    p = np.asarray(positions, dtype=np.float64)[:, None]
    i = np.arange(dim // 2)
    if layout == "tensor2tensor":
        denominator = max(dim / 2 - 1, 1) if real_half else max(dim // 2 - 1, 1)
        w = base ** (-i / denominator)
    else:
        w = base ** (-2.0 * i / dim)
    sin, cos = np.sin(p * w), np.cos(p * w)
    if layout == "interleaved":
        return np.stack([sin, cos], -1).reshape(len(p), dim)
    table = np.concatenate([sin, cos], -1)
    return np.concatenate([table, np.zeros((len(p), dim % 2))], -1)


# --- the ports pass, the wrong guesses fail the cases that pin them --------------------------------

def test_the_t5_port_passes_every_case_the_smallest_configurations_included():
    _passes_only(check_port.run_family("t5_bucket", t5_port), [])


def test_a_float64_deberta_port_fails_the_float32_rounding_cases():
    _passes_only(check_port.run_family("deberta_log_bucket", deberta_port), [])
    report = check_port.run_family("deberta_log_bucket", lambda **kw: deberta_port(**kw, f=np.float64))
    _passes_only(report, ["float32_ceil_74_1000", "float32_ceil_19_22"])


def test_longrope_s_attention_factor_rules_each_have_a_case():
    longrope = [n for n, c in _cases("rope_scaling").items() if c["params"]["kind"] == "longrope"]
    _passes_only(check_port.run_family("rope_scaling", longrope_port), [], longrope)
    ratio = check_port.run_family("rope_scaling", lambda **kw: longrope_port(**kw, ratio_always=True))
    _passes_only(ratio, ["longrope_explicit_factor_8", "longrope_explicit_factor_1"], longrope)
    recompute = check_port.run_family("rope_scaling", lambda **kw: longrope_port(**kw, recompute=True))
    _passes_only(recompute, ["longrope_explicit_attention_factor"], longrope)


def test_the_tensor2tensor_exponent_is_the_integer_d_over_2_minus_1():
    _passes_only(check_port.run_family("sinusoidal_table", sinusoidal_port), [])
    report = check_port.run_family("sinusoidal_table", lambda **kw: sinusoidal_port(**kw, real_half=True))
    _passes_only(report, ["tensor2tensor_dim7"])


# --- the expected values, from outside minipos -------------------------------------------------------

NEW_T5 = ("causal_2_8", "causal_3_8", "bidirectional_4_8", "bidirectional_5_8", "bidirectional_32_9", "causal_32_17")
NEW_DEBERTA = ("float32_ceil_74_1000", "float32_ceil_19_22", "bucket_size_2", "bucket_size_3",
               "max_position_mid_plus_2")
NEW_LONGROPE = ("longrope_scale_1", "longrope_explicit_factor_8", "longrope_explicit_factor_1",
                "longrope_explicit_attention_factor")


def test_hand_worked_values_of_the_new_cases():
    t5c, deb, rs = _cases("t5_bucket"), _cases("deberta_log_bucket"), _cases("rope_scaling")
    n = _decode(t5c["causal_2_8"], "relative_position")
    np.testing.assert_array_equal(_decode(t5c["causal_2_8"], "bucket", "expected"), (n < 0).astype(int))
    n = _decode(t5c["bidirectional_4_8"], "relative_position")
    np.testing.assert_array_equal(_decode(t5c["bidirectional_4_8"], "bucket", "expected"),
                                  np.select([n < 0, n > 0], [1, 3], 0))
    for name in ("bucket_size_2", "bucket_size_3"):
        r = _decode(deb[name], "relative_pos")
        np.testing.assert_array_equal(_decode(deb[name], "bucket", "expected"), np.sign(r))
    case = deb["float32_ceil_74_1000"]
    got = dict(zip(_decode(case, "relative_pos").tolist(), _decode(case, "bucket", "expected").tolist()))
    assert (got[111], got[-111], got[333], got[-333]) == (37 + 12, -(37 + 12), 37 + 24, -(37 + 24))
    assert math.log(111 / 37) / math.log(999 / 37) * 36 > 12          # float64 rounds above 12, ceil gives 13
    case = deb["float32_ceil_19_22"]
    got = dict(zip(_decode(case, "relative_pos").tolist(), _decode(case, "bucket", "expected").tolist()))
    assert math.log(49 / 9) / math.log(21 / 9) * 8 == 16.0 and got[49] == 9 + 17   # float32 16.000002 -> 17
    factors = {name: float(_decode(rs[name], "attention_factor", "expected")) for name in NEW_LONGROPE}
    assert factors == {"longrope_scale_1": 1.0, "longrope_explicit_factor_8": pytest.approx(math.sqrt(1.25), rel=1e-15),
                       "longrope_explicit_factor_1": 1.0, "longrope_explicit_attention_factor": 1.25}


@needs_torch
def test_new_t5_cases_are_transformers_buckets():
    from transformers.models.t5.modeling_t5 import T5Attention
    for name in NEW_T5:
        case = _cases("t5_bucket")[name]
        p = {k: v for k, v in case["params"].items() if k != "exact"}
        theirs = T5Attention._relative_position_bucket(torch.tensor(_decode(case, "relative_position")), **p)
        np.testing.assert_array_equal(_decode(case, "bucket", "expected"), theirs.numpy(), name)


@needs_torch
def test_new_deberta_cases_are_transformers_buckets():
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position
    for name in NEW_DEBERTA:
        case = _cases("deberta_log_bucket")[name]
        theirs = make_log_bucket_position(torch.tensor(_decode(case, "relative_pos")), **case["params"])
        np.testing.assert_array_equal(_decode(case, "bucket", "expected"), theirs.long().numpy(), name)


@needs_torch
def test_new_longrope_cases_are_transformers_values():
    from transformers.configuration_utils import PreTrainedConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    for name in NEW_LONGROPE:
        p = dict(_cases("rope_scaling")[name]["params"])
        config = PreTrainedConfig()
        config.head_dim, config.hidden_size, config.num_attention_heads = p["dim"], 2 * p["dim"], 2
        config.max_position_embeddings = p["max_position_embeddings"]
        config.rope_parameters = {"rope_type": "longrope", "rope_theta": p["base"],
                                  **{k: p[k] for k in ("short_factor", "long_factor", "original_max_position_embeddings",
                                                       "factor", "attention_factor") if k in p}}
        inv_freq, factor = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=p["seq_len"])
        case = _cases("rope_scaling")[name]
        np.testing.assert_allclose(_decode(case, "inv_freq", "expected"), inv_freq.double().numpy(), rtol=1e-6)
        assert float(_decode(case, "attention_factor", "expected")) == pytest.approx(factor, rel=1e-15), name


@needs_torch
def test_the_odd_tensor2tensor_case_is_fairseq_s_table():
    from transformers.models.speech_to_text.modeling_speech_to_text import Speech2TextSinusoidalPositionalEmbedding
    case = _cases("sinusoidal_table")["tensor2tensor_dim7"]
    positions = _decode(case, "positions")
    theirs = Speech2TextSinusoidalPositionalEmbedding.get_embedding(int(positions.max()) + 1, 7).double().numpy()
    np.testing.assert_allclose(_decode(case, "table", "expected"), theirs[positions], rtol=1e-6, atol=1e-6)


# --- refused settings (spec/formulas.md, "Refused settings") -----------------------------------------

@pytest.mark.parametrize("call, name", [
    (lambda: t5.relative_position_bucket(0, bidirectional=False, num_buckets=1, max_distance=8), "num_buckets"),
    (lambda: t5.relative_position_bucket(0, bidirectional=True, num_buckets=3, max_distance=8), "num_buckets"),
    (lambda: t5.relative_position_bucket(0, bidirectional=True, num_buckets=32, max_distance=8), "max_distance"),
    (lambda: t5.relative_position_bucket(0, bidirectional=False, num_buckets=32, max_distance=16), "max_distance"),
    (lambda: deberta.make_log_bucket_position(np.arange(3), 1, 8), "bucket_size"),
    (lambda: deberta.relative_positions(3, 3, bucket_size=1, max_position=8), "bucket_size"),
    (lambda: deberta.spans_from_config(position_buckets=1, max_relative_positions=8), "position_buckets"),
    (lambda: deberta.make_log_bucket_position(np.arange(3), 4, 3), "max_position"),
    (lambda: rope_scaling.longrope(8, short_factor=[1.0] * 4, long_factor=[2.0] * 4, original_max_position_embeddings=4096,
                                   max_position_embeddings=8192, seq_len=1, factor=0.5), "factor"),
    (lambda: rope_scaling.longrope(8, short_factor=[1.0] * 4, long_factor=[2.0] * 4, original_max_position_embeddings=4096,
                                   max_position_embeddings=2048, seq_len=1), "max_position_embeddings"),
    (lambda: rope_scaling.linear(8, factor=0.5), "factor"),
    (lambda: rope_scaling.yarn(8, factor=0.5, original_max_position_embeddings=64), "factor"),
    (lambda: sinusoidal.sinusoidal_table(3, 7, layout="split"), "dim"),
])
def test_each_refused_setting_names_its_argument(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_the_refusal_table_lists_these_settings():
    text = (ROOT / "spec" / "formulas.md").read_text(encoding="utf-8")
    table = text[text.index("## Refused settings"):]
    for name in ("num_buckets", "max_distance", "bucket_size", "max_position", "factor", "max_position_embeddings",
                 "dim"):
        assert f"`{name}`" in table, name


# --- integers in the JSON files ---------------------------------------------------------------------------

def _integers(value):
    if isinstance(value, bool):
        return
    if isinstance(value, int):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _integers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _integers(v)


def test_every_integer_of_the_spec_is_within_2_to_the_53():
    largest = 0
    for path in sorted((ROOT / "spec" / "vectors").glob("*.json")):
        for case in json.loads(path.read_text(encoding="utf-8"))["cases"]:
            arrays = [a["data"] for a in (*case["inputs"].values(), *case["expected"].values()) if a["dtype"] == "int64"]
            largest = max([largest, *map(abs, _integers([case["params"], arrays]))])
    assert largest <= 2 ** 53
    assert largest == 131072          # spec/formulas.md names it
