"""``irope_layer``'s float32 temperature is float32 arithmetic at each step, not the float64 factor
rounded once to float32 (spec/README.md, the ``irope_layer`` row; HF computes
``log1p(floor((positions.float() + 1) / floor_scale)) * attn_scale + 1`` on a float32 tensor).

Two ports written from the spec, without minipos, run by ``spec/check_port.py`` with the float32
tolerance: the float32-arithmetic reading passes every float32 case, and the "rounded once" reading
fails the floor_scale 0.28 cases only. By hand: 0.28 is 0.28000000000000002665 in float64, so
7 / 0.28 = 24.999999999999996 (floor 24); 0.28f is 0.27999999523 and 7 / 0.28f = 25.0000004, which
rounds to the float32 25.0 (floor 25). tau(6) is 1 + 0.1 ln 26 in one reading, 1 + 0.1 ln 25 in the
other: 3.9e-3 apart. At floor_scale 3 (the older case) the quotients floor alike, and the readings
differ by an ulp of float32, within the tolerance.
"""

import importlib.util
import math
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_port", ROOT / "spec" / "check_port.py")
check_port = importlib.util.module_from_spec(_spec)
sys.modules["check_port"] = check_port  # its dataclasses look the module up there
_spec.loader.exec_module(check_port)

F32 = np.float32
FLOOR = ["nope_temperature_float32_floor", "nope_temperature_float32_floor_cached"]


def tau_float32(T, attn_scale, floor_scale):
    """Each step in float32: i + 1, the quotient, the floor, log1p, * attn_scale, + 1."""
    steps = np.floor((np.arange(T).astype(F32) + F32(1)) / F32(floor_scale))
    logs = np.log1p(steps.astype(np.float64)).astype(F32)
    return (logs * F32(attn_scale) + F32(1)).astype(np.float64)


def tau_rounded_once(T, attn_scale, floor_scale):
    """The other reading: tau in float64, rounded to float32 at the end."""
    tau = np.log1p(np.floor((np.arange(T) + 1.0) / floor_scale)) * attn_scale + 1.0
    return tau.astype(F32).astype(np.float64)


def irope_port(x, wq, wk, wv, wo, *, d_model, num_heads, scheme, scheme_config, attention_chunk, causal, bias,
               chunks=None, tau=tau_float32):
    """``irope_layer`` for the causal nope-temperature cases without chunks (a cached run gives the
    rows of the full pass: the temperature takes the cache index)."""
    if scheme != "nope-temperature" or not scheme_config.get("float32") or attention_chunk is not None or bias \
            or not causal:
        raise NotImplementedError(scheme)
    B, T, _ = x.shape
    H, D = num_heads, d_model // num_heads
    heads = lambda w: (x @ w).reshape(B, T, H, D).transpose(0, 2, 1, 3)
    q = heads(wq) * tau(T, scheme_config["attn_scale"], scheme_config["floor_scale"])[:, None]
    s = q @ np.swapaxes(heads(wk), -1, -2) / np.sqrt(D)
    s = np.where(np.tri(T, dtype=bool), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    out = (p / p.sum(-1, keepdims=True)) @ heads(wv)
    return out.transpose(0, 2, 1, 3).reshape(B, T, H * D) @ wo


def test_the_quotients_by_hand():
    assert math.floor(7 / 0.28) == 24 and 7 / 0.28 < 25
    assert F32(7) / F32(0.28) == F32(25.0)
    np.testing.assert_allclose(tau_float32(7, 0.1, 0.28)[6], 1 + 0.1 * math.log(26), rtol=2e-7)   # an ulp
    np.testing.assert_allclose(tau_rounded_once(7, 0.1, 0.28)[6], 1 + 0.1 * math.log(25), rtol=2e-7)
    assert tau_float32(7, 0.1, 0.28)[6] - tau_rounded_once(7, 0.1, 0.28)[6] > 3.9e-3           # 0.1 ln(26/25)
    np.testing.assert_allclose(tau_float32(6, 0.1, 0.28), tau_rounded_once(6, 0.1, 0.28), rtol=2e-7)
    cases = {c["name"]: c for c in check_port.load_family("irope_layer")["cases"]}
    assert all(cases[n]["params"]["scheme_config"] == {"attn_scale": 0.1, "floor_scale": 0.28, "float32": True}
               for n in FLOOR)


def test_float32_arithmetic_passes_and_the_factor_rounded_once_fails_only_the_floor_cases():
    right = check_port.run_family("irope_layer", irope_port, precision="float32")
    float32_cases = {"nope_temperature_float32", "nope_temperature_float32_cached", *FLOOR}
    assert set(right.passed) == float32_cases and not right.failed, str(right)
    wrong = check_port.run_family("irope_layer", lambda **kw: irope_port(**kw, tau=tau_rounded_once),
                                  precision="float32")
    assert sorted(wrong.failed) == sorted(FLOOR), str(wrong)
    assert set(wrong.passed) == float32_cases - set(FLOOR)             # floor_scale 3: within the tolerance
    assert all("t = 6" in line for line in wrong.mismatches), wrong.mismatches   # only the last query differs
