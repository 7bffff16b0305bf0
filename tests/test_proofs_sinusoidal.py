"""The sinusoidal theorems pass, and fail readably on a wrong claim or broken code."""

import numpy as np
import pytest

sp = pytest.importorskip("sympy")
sinusoidal = pytest.importorskip("minipos.sinusoidal")

from proofs import core  # noqa: E402
from proofs.core import StepFalse, Theorem, TieMismatch, latex_of  # noqa: E402
from proofs.sinusoidal import k, pe, pos, shift_matrix  # noqa: E402

IDS = [t.id for t in core.select(["sinusoidal"])]


def test_headline_statements_verbatim():
    assert core.REGISTRY["sinusoidal.frequencies"].statement == (
        "w_i = base^(-2i/D) for i = 0 … D/2 - 1, wavelengths 2π / w_i forming a geometric "
        "progression from 2π to 2π · base^((D-2)/D)")
    assert "rope_inv_freq(D) equals the sinusoidal w_i" in core.REGISTRY["sinusoidal.rope_inv_freq"].statement


def test_shift_with_flipped_sign_is_false():
    def proof(p):
        p.claim(pe(pos + k, 4), shift_matrix(-k, 4) * pe(pos, 4), "rotate the other way", by="trig")
    with pytest.raises(StepFalse) as err:
        Theorem("sinusoidal.flipped", "s", proof).prove()
    msg = str(err.value)
    assert "theorem sinusoidal.flipped, step 1 ('rotate the other way') [FALSE]" in msg
    assert "counterexample: base = " in msg and "difference = " in msg


def test_wrong_frequency_exponent_fails_its_theorem(monkeypatch):
    # base^(-i/D) instead of base^(-2i/D): the index i mistaken for a column index.
    wrong = lambda dim, *, base=10000.0, layout="interleaved": base ** (-np.arange(dim // 2) / dim)  # noqa: E731
    monkeypatch.setattr(sinusoidal, "sinusoidal_frequencies", wrong)
    with pytest.raises(TieMismatch) as err:
        core.REGISTRY["sinusoidal.frequencies"].prove()
    msg = str(err.value)
    assert "theorem sinusoidal.frequencies, tie to minipos.sinusoidal.sinusoidal_frequencies" in msg
    assert "w_i = base^(-2i/D), D = 8, base = 10000" in msg


def test_table_with_swapped_sin_cos_fails(monkeypatch):
    real = sinusoidal.sinusoidal_table
    swapped = lambda *a, **kw: real(*a, **kw)[:, np.arange(8) ^ 1]  # noqa: E731  cos, sin pairs
    monkeypatch.setattr(sinusoidal, "sinusoidal_table", swapped)
    result = core.REGISTRY["sinusoidal.frequencies"].run()
    assert result.status == "MISMATCH"
    assert ("tie to minipos.sinusoidal.sinusoidal_table ('columns 2i, 2i + 1 = sin, cos(pos w_i) for "
            "i = 0 … D/2 - 1 fill all D columns') [case D = 8]") in result.message


def test_one_frequency_per_column_fails_the_shape(monkeypatch):
    # w = base^(-i/D) for i = 0 … D - 1: the index run over all D columns instead of D/2 pairs.
    wrong = lambda dim, *, base=10000.0, layout="interleaved": base ** (-np.arange(dim) / dim)  # noqa: E731
    monkeypatch.setattr(sinusoidal, "sinusoidal_frequencies", wrong)
    with pytest.raises(TieMismatch) as err:
        core.REGISTRY["sinusoidal.frequencies"].prove()
    msg = str(err.value)
    assert ("theorem sinusoidal.frequencies, tie to minipos.sinusoidal.sinusoidal_frequencies "
            "('one frequency per pair: shape (D/2,), i = 0 … D/2 - 1') [case D = 8]") in msg


def test_split_table_as_default_fails_the_interleaved_columns(monkeypatch):
    real = sinusoidal.sinusoidal_table
    monkeypatch.setattr(sinusoidal, "sinusoidal_table",
                        lambda positions, dim, **kw: real(positions, dim, layout="split"))
    with pytest.raises(TieMismatch, match=r"tie to minipos.sinusoidal.sinusoidal_table \('columns 2i, 2i \+ 1"):
        core.REGISTRY["sinusoidal.frequencies"].prove()


def test_rope_inv_freq_with_wrong_exponent_fails(monkeypatch):
    rope = pytest.importorskip("minipos.rope")
    monkeypatch.setattr(rope, "rope_inv_freq", lambda dim, *, base=10000.0: base ** (-2.0 * np.arange(dim // 2) / (dim - 2 or 1)))
    with pytest.raises(TieMismatch, match=r"theorem sinusoidal.rope_inv_freq, tie to minipos.rope.rope_inv_freq"):
        core.REGISTRY["sinusoidal.rope_inv_freq"].prove()


def test_latex_renders_headline():
    tex = latex_of(core.REGISTRY["sinusoidal.frequencies"].run())
    assert "2 \\pi base^{\\frac{D - 2}{D}}" in tex and "\\text{" in tex
