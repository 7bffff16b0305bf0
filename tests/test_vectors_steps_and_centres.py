"""The spec 1.1.0 cases catch the ports they are meant to catch.

Each port here is written from spec/README.md in a few lines of NumPy, without calling minipos, and
run by ``spec/check_port.py`` over the committed vectors: the right port passes, a port with one
mistake (a wrong sign, an uncentred xPos exponent, a cached query at position 0, no negative
positions) fails the cases that target that mistake and no others.

Values from outside minipos: ALiBi's 4-head slopes 1/4, 1/16, 1/64, 1/256 (Press et al. 2022, §3:
2^(-8h/H)); Llama 3.1's frequency rule (HF ``_compute_llama3_parameters``: wavelengths above
L / low_freq_factor divided by the factor, below L / high_freq_factor kept, a linear blend between),
worked by hand for D = 8, base 10000, L = 1024, factor 8; the xPos centres read off torchscale
(``min_pos = -(length + offset) // 2``), x-transformers (``(t.max() + 1) // 2``) and
rotary-embedding-torch (``len(t) // 2``).
"""

import importlib.util
import math
import pathlib
import sys

import numpy as np
import pytest

from minipos import rope_scaling

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_port", ROOT / "spec" / "check_port.py")
check_port = importlib.util.module_from_spec(_spec)
sys.modules["check_port"] = check_port  # its dataclasses look the module up there
_spec.loader.exec_module(check_port)


def _cases(family):
    return {c["name"]: c for c in check_port.load_family(family)["cases"]}


# --- ports written from the spec ----------------------------------------------------------------

def _rotate(x, layout):
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        return np.stack([-b, a], axis=-1).reshape(x.shape)
    a, b = np.split(x, 2, axis=-1)
    return np.concatenate([-b, a], axis=-1)


def rope_port(x, positions, *, layout, base, rotary_dim=None, attention_factor=1.0, inv_freq=None, scaling=None):
    R = x.shape[-1] if rotary_dim is None else rotary_dim
    if inv_freq is None:
        inv_freq = base ** (-np.arange(0, R, 2) / R)                                   # theta_i = base^(-2i/R)
    angles = np.asarray(positions, dtype=np.float64)[:, None] * inv_freq              # (T, R/2)
    angles = np.repeat(angles, 2, -1) if layout == "interleaved" else np.concatenate([angles, angles], -1)
    rot = x[..., :R]
    out = attention_factor * (rot * np.cos(angles) + _rotate(rot, layout) * np.sin(angles))
    return np.concatenate([out, x[..., R:]], -1)


def xpos_port(x, positions, *, downscale, scale_offset, scale_base, base):
    D = x.shape[-1]
    zeta = (np.arange(0, D, 2) + 0.4 * D) / (1.4 * D)                                 # (D/2,)
    n = np.asarray(positions)
    scale = zeta[None, :] ** ((n - scale_offset)[:, None] / scale_base)              # (T, D/2)
    scale = np.repeat(1 / scale if downscale else scale, 2, -1)
    return rope_port(x, n, layout="interleaved", base=base) * scale


def _passes_only(report, failing):
    """The port ran every case of the family and failed exactly ``failing``."""
    assert sorted(report.failed) == sorted(failing), str(report)
    assert not report.skipped and set(report.passed) == set(_cases(report.family)) - set(failing)


# --- rope: where given frequencies came from, negative positions on their own ---------------------

def test_the_rope_port_passes_every_case():
    _passes_only(check_port.run_family("rope", rope_port), [])


def test_given_frequencies_are_rebuilt_from_their_scaling_params():
    cases = _cases("rope")
    given = [c for c in cases.values() if "inv_freq" in c["inputs"]]
    assert {c["name"] for c in given} == {c["name"] for c in cases.values() if "scaling" in c["params"]}
    for case in given:
        kw = dict(case["params"]["scaling"])
        kind, dim = kw.pop("kind"), kw.pop("dim")
        assert dim == (case["params"]["rotary_dim"] or check_port.decode(case["inputs"]["x"]).shape[-1])
        inv_freq, factor = rope_scaling.REGISTRY[kind](dim, **kw)
        np.testing.assert_array_equal(inv_freq, check_port.decode(case["inputs"]["inv_freq"]), case["name"])
        assert factor == case["params"]["attention_factor"]


def test_the_llama3_case_has_attention_factor_1_and_the_hand_worked_frequencies():
    case = _cases("rope")["half_inv_freq_llama3_factor_1"]
    assert case["params"]["attention_factor"] == 1.0
    # wavelengths 2 pi 10^k (k = 0..3) against L = 1024: 6.3 and 63 < L/4 kept, 6283 > L divided by
    # 8, 628 blended with s = (L / 628.3 - 1) / (4 - 1) = 0.20994: (1 - s) w / 8 + s w
    s = (1024 / (2 * math.pi * 100) - 1) / 3
    hand = [1.0, 0.1, 0.01 * ((1 - s) / 8 + s), 0.001 / 8]
    np.testing.assert_allclose(check_port.decode(case["inputs"]["inv_freq"]), hand, rtol=1e-12)


def test_a_port_without_negative_positions_fails_only_the_negative_cases():
    def no_negatives(x, positions, **kw):
        if np.min(positions) < 0:
            raise ValueError("positions must be >= 0")
        return rope_port(x, positions, **kw)

    report = check_port.run_family("rope", no_negatives)
    _passes_only(report, ["interleaved_negative_positions", "half_partial_4_of_8_negative_positions"])
    negative = [n for n, c in _cases("rope").items() if np.min(check_port.decode(c["inputs"]["positions"])) < 0]
    assert sorted(negative) == sorted(report.failed)


# --- xpos: the centres of the libraries -----------------------------------------------------------

CENTRES = {  # the centre each library takes for the positions t of a call (S = cache length + T)
    "torchscale": lambda t: -(-(int(t.max()) + 1) // 2),     # ceil(S / 2), S = offset + T = max t + 1
    "x_transformers": lambda t: (int(t.max()) + 1) // 2,
    "rotary_embedding_torch": lambda t: len(t) // 2,
}


def test_each_centred_xpos_case_is_at_its_library_centre_and_the_others_differ():
    cases = _cases("xpos")
    for name, case in cases.items():
        library = next((lib for lib in CENTRES if lib in name), None)
        if library is None or name == "query_torchscale_offset":   # that one: where all three agree
            continue
        t = check_port.decode(case["inputs"]["positions"])
        assert case["params"]["scale_offset"] == CENTRES[library](t), name
        others = {CENTRES[lib](t) for lib in CENTRES if lib != library}
        assert case["params"]["scale_offset"] not in others, f"{name}: another library gives the same centre"
    t = check_port.decode(cases["query_torchscale_offset"]["inputs"]["positions"])
    assert {f(t) for f in CENTRES.values()} == {cases["query_torchscale_offset"]["params"]["scale_offset"]}


def test_an_xpos_port_that_ignores_scale_offset_fails_every_centred_case():
    _passes_only(check_port.run_family("xpos", xpos_port), [])
    report = check_port.run_family("xpos", lambda **kw: xpos_port(**{**kw, "scale_offset": 0}))
    centred = [n for n, c in _cases("xpos").items() if c["params"]["scale_offset"] != 0]
    assert len(centred) >= 5
    _passes_only(report, centred)


# --- alibi_bias_key_only --------------------------------------------------------------------------

def test_key_only_alibi_by_hand():
    case = _cases("alibi_bias_key_only")["prefill_h4_S6"]
    slopes = check_port.decode(case["inputs"]["slopes"])
    np.testing.assert_array_equal(slopes, [1 / 4, 1 / 16, 1 / 64, 1 / 256])   # 2^(-8h/4)
    bias = check_port.decode(case["expected"]["bias"])
    assert bias.shape == (4, 1, 6)
    assert bias[0, 0, 5] == 5 / 4 and bias[3, 0, 2] == 2 / 256               # +m_h j


def test_a_key_only_alibi_port_with_the_wrong_sign_fails():
    right = lambda slopes, k_positions: (slopes[:, None, None] * k_positions[None, None, :])
    _passes_only(check_port.run_family("alibi_bias_key_only", right), [])
    wrong = lambda slopes, k_positions: -right(slopes, k_positions)
    _passes_only(check_port.run_family("alibi_bias_key_only", wrong), list(_cases("alibi_bias_key_only")))


def test_keras_hub_form_passes_once_its_per_head_constant_is_added_back():
    def keras_hub(slopes, k_positions):           # AlibiBias: m_h (j - (S - 1)), j = 0 ... S - 1
        return slopes[:, None, None] * (np.arange(len(k_positions)) - (len(k_positions) - 1))[None, None, :]

    cases = _cases("alibi_bias_key_only")
    keys = {n: check_port.decode(c["inputs"]["k_positions"]) for n, c in cases.items()}
    plain = [n for n, k in keys.items() if np.array_equal(k, np.arange(len(k)))]   # keras-hub takes j = 0 ... S - 1
    _passes_only(check_port.run_family("alibi_bias_key_only", keras_hub), list(cases))   # not equal as logits
    def adapted(slopes, k_positions):
        return keras_hub(slopes, k_positions) + slopes[:, None, None] * (len(k_positions) - 1)

    report = check_port.run_family("alibi_bias_key_only", adapted)
    assert sorted(report.passed) == sorted(plain) and set(report.failed) == set(cases) - set(plain)


# --- rope_scores, xpos_scores: a cached decoding step --------------------------------------------

def _rope_scores(q, k, q_positions, k_positions, **kw):
    return rope_port(q, q_positions, **kw) @ np.swapaxes(rope_port(k, k_positions, **kw), -1, -2)


def _xpos_scores(q, k, q_positions, k_positions, **kw):
    return xpos_port(q, q_positions, downscale=False, **kw) @ np.swapaxes(
        xpos_port(k, k_positions, downscale=True, **kw), -1, -2)


@pytest.mark.parametrize("family, port", [("rope_scores", _rope_scores), ("xpos_scores", _xpos_scores)])
def test_a_cached_step_is_the_matching_rows_of_the_full_pass(family, port):
    _passes_only(check_port.run_family(family, port), [])
    steps = set()
    for name, case in _cases(family).items():
        inputs = {k: check_port.decode(v) for k, v in case["inputs"].items()}
        H, T, D = inputs["q"].shape
        S = inputs["k"].shape[-2]
        np.testing.assert_array_equal(inputs["q_positions"], np.arange(S - T, S))
        full_q = np.concatenate([np.zeros((H, S - T, D)), inputs["q"]], axis=1)      # queries at 0 ... S - 1
        full = port(full_q, inputs["k"], np.arange(S), np.arange(S), **case["params"])  # (H, S, S)
        np.testing.assert_allclose(full[:, S - T:], check_port.decode(case["expected"]["scores"]), rtol=1e-12,
                                   atol=1e-12, err_msg=name)
        steps.add(T)
    assert 1 in steps and max(steps) > 1   # one token after S - 1 cached keys, and a multi-token step


@pytest.mark.parametrize("family, port", [("rope_scores", _rope_scores), ("xpos_scores", _xpos_scores)])
def test_a_cached_step_that_puts_the_query_at_position_0_fails(family, port):
    at_zero = lambda q, k, q_positions, k_positions, **kw: port(q, k, np.arange(len(q_positions)), k_positions, **kw)
    _passes_only(check_port.run_family(family, at_zero), list(_cases(family)))


def test_the_xpos_centre_cancels_in_the_scores():
    report = check_port.run_family("xpos_scores", lambda **kw: _xpos_scores(**{**kw, "scale_offset": 0}))
    _passes_only(report, [])
