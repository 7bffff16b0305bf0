"""The float32 tolerances of the golden vectors, against what float32 ports really get.

Each case's ``float32`` tolerance is meant to be about ten times the error of a port that computes
in single precision, so that such a port passes and a port with a real mistake (a wrong sign, a
frequency off by one pair, a dropped factor) does not hide below it. This file measures that error
per case with two float32 ports and checks both sides:

* the port passes: its error is within the recorded float32 tolerance;
* the tolerance is tight: at most ``LOOSE`` times the larger of the measured error and ``FLOOR``
  (per family, over the cases that share a tolerance value).

The two ports (the larger error of the two counts):

* **the reference in float32**: the family's minipos function with every float input cast to
  float32 (minipos keeps the input's dtype, with angles, cos/sin and slopes in float64);
* **a port written in float32** for the families whose values do not come from float inputs alone:
  frequencies, angles, cos and sin in float32 as HF's LLaMA rotary embedding, torchscale's xPos and
  the usual sinusoidal tables compute them (``sinusoidal_table``, ``rope``, ``rope_grad``, ``xpos``,
  ``xpos_grad``, ``xl_scores``; the larger error wherever positions are large), BLOOM's float32
  ALiBi slopes, and the scalings' frequencies rounded to float32 as HF returns them.

The error of a value is ``|got - expected| / (1 + |expected|)``, the smallest ``rtol = atol`` that
passes it. The numbers are printed by ``python tests/test_vectors_float32.py``.
"""

import math
import pathlib
import sys

import numpy as np
import pytest

from minipos import vectors
from minipos.vectors.cases import EXACT

# --dist loadgroup keeps this module on one worker, so the float32 errors are measured once
pytestmark = pytest.mark.xdist_group("test_vectors_float32")

ROOT = pathlib.Path(__file__).resolve().parents[1]
LOOSE = 40      # a float32 tolerance may be at most this many times the measured error ...
FLOOR = 1e-7    # ... or this floor (about one float32 ulp at 1), whichever is larger
F32 = np.float32


def _f32(a):
    a = np.asarray(a)
    return a.astype(F32) if a.dtype == np.float64 else a


# --- ports that compute angles in float32 ---------------------------------------------------------

def _rotate(x, layout):
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        return np.stack([-b, a], axis=-1).reshape(x.shape)
    a, b = np.split(x, 2, axis=-1)
    return np.concatenate([-b, a], axis=-1)


def _rope_f32(x, positions, layout, base, rotary_dim, attention_factor=1.0, inv_freq=None, sign=1, scaling=None):
    """HF LLaMA's float32 rotary embedding: inv_freq, angles, cos and sin in float32 (``scaling`` only
    says where a given inv_freq came from)."""
    x = _f32(x)
    R = x.shape[-1] if rotary_dim is None else rotary_dim
    if inv_freq is None:
        inv_freq = F32(1.0) / (F32(base) ** (np.arange(0, R, 2).astype(F32) / F32(R)))
    angles = np.asarray(positions).astype(F32)[:, None] * _f32(inv_freq)[None, :]       # float32 product
    angles = np.repeat(angles, 2, -1) if layout == "interleaved" else np.concatenate([angles, angles], -1)
    cos, sin = np.cos(angles) * F32(attention_factor), np.sin(angles) * F32(attention_factor)
    rot = x[..., :R]
    return np.concatenate([rot * cos + sign * _rotate(rot, layout) * sin, x[..., R:]], -1)


def _xpos_f32(x, positions, downscale, scale_offset, scale_base, base, grad=False):
    """torchscale's XPOS in float32: zeta and its powers, angles, cos and sin in float32."""
    x = _f32(x)
    D = x.shape[-1]
    zeta = (np.arange(0, D, 2).astype(F32) + F32(0.4 * D)) / F32(1.4 * D)
    n = np.asarray(positions)
    scale = zeta[None, :] ** ((n - scale_offset).astype(F32)[:, None] / F32(scale_base))
    scale = np.repeat(F32(1) / scale if downscale else scale, 2, -1)
    inv_freq = F32(1.0) / (F32(base) ** (np.arange(0, D, 2).astype(F32) / F32(D)))
    angles = np.repeat(n.astype(F32)[:, None] * inv_freq[None, :], 2, -1)
    cos, sin = np.cos(angles), np.sin(angles)
    if grad:  # R(n)^T (s dy)
        y = x * scale
        return y * cos - _rotate(y, "interleaved") * sin
    return (x * cos + _rotate(x, "interleaved") * sin) * scale


def _sinusoidal_f32(positions, dim, base, layout):
    pos = np.asarray(positions).astype(F32)[:, None]
    if layout == "tensor2tensor":
        half = dim // 2
        inv = np.exp(np.arange(half).astype(F32) * F32(-math.log(base) / max(half - 1, 1)))
        table = np.concatenate([np.sin(pos * inv), np.cos(pos * inv)], -1)
        return np.concatenate([table, np.zeros((len(pos), dim % 2), F32)], -1)
    inv = F32(1.0) / (F32(base) ** (np.arange(0, dim, 2).astype(F32) / F32(dim)))
    s, c = np.sin(pos * inv), np.cos(pos * inv)
    if layout == "split":
        return np.concatenate([s, c], -1)
    return np.stack([s, c], -1).reshape(len(pos), dim)


def _xl_scores_f32(inputs, params):
    """Transformer-XL with the table R in float32 (angles in float32) and float32 products."""
    q, k, w_r, u, v = (_f32(inputs[n]) for n in ("q", "k", "w_r", "u", "v"))
    H, T, D = q.shape
    S = k.shape[-2]
    R = _sinusoidal_f32(np.arange(S - 1, -1, -1), params["d_model"], params["base"], "split")   # (S, d_model)
    r = (R @ w_r).reshape(S, H, D).transpose(1, 0, 2)                                          # (H, S, D)
    from minipos.transformer_xl import rel_shift
    bd = rel_shift((q + v[:, None]) @ np.swapaxes(r, -1, -2))
    return {"relative_embeddings": R, "scores": (q + u[:, None]) @ np.swapaxes(k, -1, -2) + bd}


def _alibi_slopes_f32(num_heads):
    """BLOOM's ``build_alibi_tensor`` slopes: powers of a float32 base, in float32."""
    P = 2 ** math.floor(math.log2(num_heads))
    base = F32(2 ** (-(2 ** -(math.log2(P) - 3))))
    slopes = base ** np.arange(1, P + 1).astype(F32)
    if P != num_heads:
        extra = F32(2 ** (-(2 ** -(math.log2(2 * P) - 3))))
        slopes = np.concatenate([slopes, extra ** np.arange(1, 2 * (num_heads - P), 2).astype(F32)])
    return slopes


def _rope_scaling_f32(inputs, params):
    """The scaling's frequencies and factor rounded to float32, as HF returns them (float32 tensors)."""
    return {k: _f32(v) for k, v in vectors.FAMILIES["rope_scaling"].run(inputs, params).items()}


def _mrope_f32(x, positions, mrope_section, interleaved, base, sign=1, layout="half"):
    """HF Qwen2-VL / Qwen3-VL's (and ERNIE-4.5-VL's) float32 rotary embedding: inv_freq, angles, cos and sin in
    float32, each frequency taking the position of its stream (the assignment read off HF, not minipos)."""
    x = _f32(x)
    D = x.shape[-1]
    inv_freq = F32(1.0) / (F32(base) ** (np.arange(0, D, 2).astype(F32) / F32(D)))
    if interleaved == "hw":                           # Ernie4_5_VLMoeTextRotaryEmbedding, section (h, w, t) there
        n_t, n_h, n_w = mrope_section
        hw = n_h + n_w
        inv_freq = np.concatenate([inv_freq[:hw][0::2], inv_freq[:hw][1::2], inv_freq[hw:]])   # inv_freq_3d
        freqs = np.asarray(positions).astype(F32)[:, :, None] * inv_freq
        f_h, f_w, f_t = (m[(i + 1) % 3] for i, m in enumerate(np.split(freqs, [n_h, hw], axis=-1)))
        angles = np.concatenate([np.stack([f_h, f_w], -1).reshape(f_h.shape[0], -1), f_t], -1)
        angles = np.repeat(angles, 2, axis=-1)                                     # repeat_interleave(2)
        return x * np.cos(angles) + sign * _rotate(x, layout) * np.sin(angles)
    freqs = np.asarray(positions).astype(F32)[:, :, None] * inv_freq              # (3, T, D/2) float32
    if interleaved:                                   # Qwen3VLTextRotaryEmbedding.recomposition_frequencies
        angles = freqs[0].copy()
        for dim in (1, 2):
            angles[:, dim:mrope_section[dim] * 3:3] = freqs[dim][:, dim:mrope_section[dim] * 3:3]
    else:                                             # Qwen2VLRotaryEmbedding.recomposition_frequencies
        cuts = np.cumsum(mrope_section)[:-1]
        angles = np.concatenate([m[i % 3] for i, m in enumerate(np.split(freqs, cuts, axis=-1))], axis=-1)
    angles = np.concatenate([angles, angles], -1)
    return x * np.cos(angles) + sign * _rotate(x, "half") * np.sin(angles)


ANGLE_PORTS = {
    "mrope": lambda i, p: {"out": _mrope_f32(i["x"], i["positions"], **p)},
    "mrope_grad": lambda i, p: {"dx": _mrope_f32(i["dy"], i["positions"], sign=-1, **p)},
    "alibi_slopes": lambda i, p: {"slopes": _alibi_slopes_f32(p["num_heads"])},
    "rope_scaling": _rope_scaling_f32,
    "sinusoidal_table": lambda i, p: {"table": _sinusoidal_f32(i["positions"], p["dim"], p["base"], p["layout"])},
    "rope": lambda i, p: {"out": _rope_f32(i["x"], i["positions"], inv_freq=i.get("inv_freq"), **p)},
    "rope_grad": lambda i, p: {"dx": _rope_f32(i["dy"], i["positions"], inv_freq=i.get("inv_freq"), sign=-1, **p)},
    "xpos": lambda i, p: {"out": _xpos_f32(i["x"], i["positions"], **p)},
    "xpos_grad": lambda i, p: {"dx": _xpos_f32(i["dy"], i["positions"], grad=True, **p)},
    "xl_scores": _xl_scores_f32,
    "rope_scores": lambda i, p: {"scores": _f32(_rope_f32(i["q"], i["q_positions"], **p)
                                                @ np.swapaxes(_rope_f32(i["k"], i["k_positions"], **p), -1, -2))},
    "xpos_scores": lambda i, p: {"scores": _xpos_f32(i["q"], i["q_positions"], False, **p)
                                 @ np.swapaxes(_xpos_f32(i["k"], i["k_positions"], True, **p), -1, -2)},
}


def _reference_f32(family, inputs, params):
    return vectors.FAMILIES[family].run({k: _f32(v) for k, v in inputs.items()}, params)


def _error(expected, got, mask) -> float:
    e, g = expected.astype(np.float64), np.asarray(got).astype(np.float64)
    with np.errstate(invalid="ignore"):  # -inf - -inf: the lse of a row with no key, masked out below
        err = np.abs(g - e) / (1 + np.abs(e))
    if mask is not None:
        err = err[mask]
    return float(err.max(initial=0.0))


def measure(family: str, case: dict) -> float:
    """The largest error of the float32 ports on one built case (expected from the float64 reference)."""
    expected = vectors.FAMILIES[family].run(case["inputs"], case["params"])
    where = case.get("where", {})
    worst = 0.0
    ports = [_reference_f32] + ([lambda f, i, p: ANGLE_PORTS[f](i, p)] if family in ANGLE_PORTS else [])
    for port in ports:
        got = port(family, case["inputs"], case["params"])
        for name, value in expected.items():
            if np.issubdtype(np.asarray(value).dtype, np.floating):
                worst = max(worst, _error(np.asarray(value), got[name], where.get(name)))
    return worst


def _float_cases():
    for family in vectors.FAMILIES:
        for case in vectors.family_cases(family):
            if case["tolerance"] != EXACT:
                yield family, case


CASES = list(_float_cases())


@pytest.fixture(scope="module")
def errors():
    return {(family, case["name"]): measure(family, case) for family, case in CASES}


@pytest.mark.parametrize("family, case", CASES, ids=[f"{f}/{c['name']}" for f, c in CASES])
def test_a_float32_port_passes(family, case, errors):
    tol = case["tolerance"]["float32"]
    assert tol["rtol"] == tol["atol"], "float32 tolerances are one number, rtol = atol"
    error = errors[family, case["name"]]
    assert error <= tol["rtol"], f"a float32 port errs by {error:.3g}, above the tolerance {tol['rtol']:g}"


def test_every_float32_tolerance_is_tight(errors):
    """Within a family, the cases that share a tolerance share it because their errors are alike:
    the tolerance is at most LOOSE times the largest of their errors (or of FLOOR)."""
    groups = {}
    for family, case in CASES:
        key = (family, case["tolerance"]["float32"]["rtol"])
        groups[key] = max(groups.get(key, 0.0), errors[family, case["name"]])
    loose = {f"{family} at {value:g}": f"{error:.3g}" for (family, value), error in groups.items()
             if value > LOOSE * max(error, FLOOR)}
    assert not loose, f"tolerances more than {LOOSE}x the float32 error they allow for: {loose}"


def test_the_float32_tolerances_are_those_of_the_table():
    for family, case in CASES:
        value = vectors.FLOAT32_TOLERANCE.get(f"{family}/{case['name']}", vectors.FLOAT32_TOLERANCE[family])
        assert case["tolerance"]["float32"] == {"rtol": value, "atol": value}
    names = {f"{family}/{case['name']}" for family, case in CASES} | set(vectors.FAMILIES)
    assert set(vectors.FLOAT32_TOLERANCE) <= names, "an entry of FLOAT32_TOLERANCE names no case"


def test_exact_cases_are_exact_in_float32_too():
    """Integer outputs and gathers of float32-exact inputs carry 0, 0: a float32 port gets them exactly."""
    for family in vectors.FAMILIES:
        for case in vectors.family_cases(family):
            if case["tolerance"] == EXACT:
                assert measure(family, case) == 0.0, f"{family}/{case['name']}"


if __name__ == "__main__":  # print the measured errors beside the recorded tolerances
    for family, case in CASES:
        error = measure(family, case)
        tol = case["tolerance"]["float32"]["rtol"]
        print(f"{family:18s} {case['name']:40s} error {error:9.2e}  tolerance {tol:7.1e}  ratio {tol / max(error, FLOOR):6.1f}")
    sys.exit(0)
