"""Bad input to the scheme modules (sinusoidal, xpos, transformer_xl, deberta, rope_scaling).

Each case was found by feeding every public function wrong types, NaN/inf, extreme integers,
empty or mismatched arrays and low-precision dtypes. The expected behaviour is worked out by hand
in the comments: a clear ValueError/TypeError naming the argument, or the exact result.
Memory checks run against a small pretend machine (``MAX_BYTES`` patched), so they are cheap.
"""

import math

import numpy as np
import pytest

import minipos._checks as checks

INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


@pytest.fixture
def small_machine(monkeypatch):
    """A machine with 1 MiB of memory: every output above it must be refused before allocation."""
    monkeypatch.setattr(checks, "MAX_BYTES", 1 << 20)


# --- sinusoidal ----------------------------------------------------------------------------

from minipos.sinusoidal import absolute_embedding, learned_table, sinusoidal_frequencies, sinusoidal_table  # noqa: E402


@pytest.mark.parametrize("call, exc, match", [
    # tensor2tensor's last frequency is 1/base = 1e300; 1e9 * 1e300 overflows, and sin(inf) is NaN.
    (lambda: sinusoidal_table(np.array([10 ** 9]), 4, base=1e-300, layout="tensor2tensor"), ValueError,
     "positions and base"),
    # 1 / 1e-320 is inf in float64.
    (lambda: sinusoidal_frequencies(8, base=1e-320, layout="tensor2tensor"), ValueError, "^base must"),
    # 2**60 is not exact in float64 once turned into an angle.
    (lambda: sinusoidal_table(np.array([2 ** 60]), 4), ValueError, r"positions must lie within \+-2\*\*53"),
    (lambda: learned_table(2, 2, dtype="foo"), TypeError, "^dtype must be a floating dtype"),
    # normal(0, 1e6) draws beyond float16's largest value 65504.
    (lambda: learned_table(4, 4, std=1e6, dtype=np.float16), ValueError, "^std"),
    # a subnormal std draws subnormal values.
    (lambda: learned_table(4, 4, std=1e-320), ValueError, "^std must be 0 or a normal"),
    # 10**9 x 10**6 float64 is 7.45e6 GiB: refused before anything is built.
    (lambda: sinusoidal_table(10 ** 9, 10 ** 6), ValueError, "^positions and dim"),
    (lambda: learned_table(10 ** 9, 10 ** 6), ValueError, "^num_positions and dim"),
])
def test_sinusoidal_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_sinusoidal_outputs_are_checked_against_memory_first(small_machine):
    # (10**5, 64) float64 is 51 MB, more than the 1 MiB machine; the positions alone (0.8 MB) fit.
    with pytest.raises(ValueError, match="^positions and dim asks"):
        sinusoidal_table(10 ** 5, 64)
    # arange(10**6) would need 8 MB; a 4-row table has no row 999999 anyway, and says so first.
    with pytest.raises(ValueError, match="cannot extrapolate"):
        absolute_embedding(np.zeros((4, 3)), 10 ** 6)


def test_sinusoidal_extreme_but_valid_input_still_works():
    # base 1e-300 in the interleaved layout, dim 4: w = (1, 1e150); position 2 gives angles (2, 2e150).
    table = sinusoidal_table([2], 4, base=1e-300)
    np.testing.assert_allclose(table, [[math.sin(2), math.cos(2), math.sin(2e150), math.cos(2e150)]])
    assert sinusoidal_table(0, 6).shape == (0, 6)
    assert learned_table(2, 3, std=0.0).tolist() == [[0.0] * 3] * 2
