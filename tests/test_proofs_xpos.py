"""The xPos theorems pass, and fail readably on a wrong claim or broken code."""

import numpy as np
import pytest

sp = pytest.importorskip("sympy")

import minipos.xpos as xpos  # noqa: E402
from proofs import core  # noqa: E402
from proofs.core import StepFalse, Theorem, TieMismatch  # noqa: E402
from proofs.rope import m, n  # noqa: E402
from proofs.xpos import Z, g, zetas  # noqa: E402

THEOREMS = core.select(["xpos"])


def test_the_family_is_registered():
    assert {t.id for t in THEOREMS} == {"xpos.relative", "xpos.decay"}


def test_zetas_hand_worked():
    # ζ_i = (2i + 0.4 D)/(1.4 D): D = 4 -> 1.6/5.6 = 2/7, 3.6/5.6 = 9/14
    assert zetas(4) == [sp.Rational(2, 7), sp.Rational(9, 14)]


def test_wrong_exponent_sign_is_false():
    def proof(p):  # ζ^{n/γ} ζ^{-m/γ} = ζ^{(n-m)/γ}, not ζ^{(m-n)/γ}
        p.claim(Z(n / g, 4) * Z(-m / g, 4), Z((m - n) / g, 4), "powers combine")
    with pytest.raises(StepFalse) as err:
        Theorem("xpos.wrong", "s", proof).prove()
    msg = str(err.value)
    assert "theorem xpos.wrong, step 1 ('powers combine') [FALSE]" in msg and "counterexample:" in msg


def test_keys_upscaled_is_not_relative():
    def proof(p):  # both upscaled: the factor is ζ^{(n+m)/γ}, which a shift of both positions changes
        p.claim(Z(n / g, 2) * Z(m / g, 2), Z((n + 1) / g, 2) * Z((m - 1) / g, 2), "shift-invariant")
        p.claim(Z(n / g, 2) * Z(m / g, 2), Z((n + 1) / g, 2) * Z((m + 1) / g, 2), "shift both by 1")
    with pytest.raises(StepFalse, match=r"theorem xpos.upscaled, step 1 \('shift both by 1'\) \[FALSE\]"):
        Theorem("xpos.upscaled", "s", proof).prove()


def test_apply_xpos_ignoring_downscale_fails(monkeypatch):
    real = xpos.apply_xpos
    monkeypatch.setattr(xpos, "apply_xpos",
                        lambda x, positions, downscale=False, **kw: real(x, positions, **kw))
    with pytest.raises(TieMismatch) as err:
        core.REGISTRY["xpos.relative"].prove()
    msg = str(err.value)
    assert ("theorem xpos.relative, tie to minipos.xpos.apply_xpos ('score q_n . k_m = q^T Z^((n-m)/γ) "
            "R(m - n) k, for any scale_offset c, D = 8')") in msg
    assert "at n = 5, m = 3, c = 0" in msg


def test_wrong_zeta_fails(monkeypatch):
    monkeypatch.setattr(xpos, "xpos_zeta", lambda dim: (np.arange(0, dim, 2) + 0.5 * dim) / (1.5 * dim))
    with pytest.raises(TieMismatch,
                       match=r"tie to minipos.xpos.xpos_zeta \('ζ_i = \(2i \+ 0.4 D\)/\(1.4 D\), D = 8'\)"):
        core.REGISTRY["xpos.relative"].prove()


def test_growing_scale_fails_decay(monkeypatch):
    real = xpos.xpos_scale
    monkeypatch.setattr(xpos, "xpos_scale", lambda positions, dim, **kw: 1 / real(positions, dim, **kw))
    result = core.REGISTRY["xpos.decay"].run()
    assert result.status == "MISMATCH"
    assert ("theorem xpos.decay, tie to minipos.xpos.xpos_scale "
            "('ζ_i^(n/γ) < 1 for n > 0, D = 128, γ = 512')") in result.message
