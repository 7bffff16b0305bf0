"""The RoPE-scaling theorems pass, and fail readably on a wrong claim or broken code."""

import math

import numpy as np
import pytest

sp = pytest.importorskip("sympy")

import minipos.rope as rope  # noqa: E402
import minipos.rope_scaling as rs  # noqa: E402
from proofs import core  # noqa: E402
from proofs.core import StepFalse, Theorem, TieMismatch, latex_of  # noqa: E402
from proofs.rope_scaling import D_, L, base, correction_index, r, s  # noqa: E402

THEOREMS = core.select(["rope_scaling"])


def test_the_family_is_registered():
    assert {t.id for t in THEOREMS} == {
        "rope_scaling.linear.positions", "rope_scaling.ntk.extremes",
        "rope_scaling.dynamic.original_length", "rope_scaling.yarn.correction_dim",
        "rope_scaling.yarn.attention_factor", "rope_scaling.llama3.continuous",
        "rope_scaling.longrope.factors", "rope_scaling.layout.weights"}


def _prove(tid):
    return core.REGISTRY[tid].prove()


# --- wrong claims -----------------------------------------------------------------------------

def test_ntk_with_exponent_one_does_not_divide_the_lowest_frequency_by_s():
    def proof(p):  # base b s instead of b s^(D/(D-2))
        p.claim((base * s) ** (-(D_ - 2) / D_), base ** (-(D_ - 2) / D_) / s, "the lowest frequency / s")
    with pytest.raises(StepFalse) as err:
        Theorem("rope_scaling.wrong_ntk", "s", proof).prove()
    msg = str(err.value)
    assert "theorem rope_scaling.wrong_ntk, step 1 ('the lowest frequency / s') [FALSE]" in msg
    assert "counterexample:" in msg


def test_yarn_index_without_two_pi_is_false():
    wrong = D_ * sp.log(L / r) / (2 * sp.log(base))  # the wavelength is 2π b^(2i/D), not b^(2i/D)

    def proof(p):
        p.claim(L / (2 * sp.pi * base ** (2 * wrong / D_)), r, "L / λ at the index", by="simplify")
    with pytest.raises(StepFalse, match=r"theorem rope_scaling.wrong_yarn, step 1 \('L / λ at the index'\)"):
        Theorem("rope_scaling.wrong_yarn", "s", proof).prove()
    # the right index gives 20.94 and 45.03 at D = 128, base 10000, L = 4096 (worked by hand:
    # 128 ln(4096 / (64π)) / (2 ln 10000) = 6.949 * 3.014, and 6.949 * ln(4096 / 2π))
    assert float(correction_index(32, 128, 10000, 4096)) == pytest.approx(20.94, abs=0.01)
    assert float(correction_index(1, 128, 10000, 4096)) == pytest.approx(45.03, abs=0.01)


def test_logits_scaled_by_f_not_f_squared_is_false():
    f = sp.Symbol("f", positive=True)

    def proof(p):
        p.claim((f * sp.cos(s)) * (f * sp.cos(s)) + (f * sp.sin(s)) * (f * sp.sin(s)), f, "scaled by f")
    with pytest.raises(StepFalse, match=r"step 1 \('scaled by f'\) \[FALSE\]"):
        Theorem("rope_scaling.wrong_factor", "s", proof).prove()


# --- broken implementations -------------------------------------------------------------------

def test_linear_multiplying_instead_of_dividing_fails(monkeypatch):
    real = rs.linear
    monkeypatch.setattr(rs, "linear",
                        lambda dim, *, factor, base=10000.0: (real(dim, base=base, factor=1.0)[0] * factor, 1.0))
    with pytest.raises(TieMismatch) as err:
        _prove("rope_scaling.linear.positions")
    msg = str(err.value)
    assert ("theorem rope_scaling.linear.positions, tie to minipos.rope_scaling.linear "
            "('inv_freq = θ_i / s, D = 8')") in msg
    assert "at s = 2" in msg


def test_ntk_exponent_one_fails(monkeypatch):
    monkeypatch.setattr(rs, "_ntk_exponent", lambda dim: 1.0)
    with pytest.raises(TieMismatch, match=r"rope_scaling.ntk.extremes, tie to minipos.rope_scaling.ntk "
                                          r"\('θ_i s\^\(-2i/\(D-2\)\), D = 8'\)"):
        _prove("rope_scaling.ntk.extremes")


def test_dynamic_without_the_minus_s_plus_1_fails(monkeypatch):
    def broken(dim, *, base=10000.0, factor, original_max_position_embeddings, seq_len):
        n = max(seq_len, original_max_position_embeddings)
        return rs.ntk(dim, base=base, factor=factor * n / original_max_position_embeddings)
    monkeypatch.setattr(rs, "dynamic", broken)
    result = core.REGISTRY["rope_scaling.dynamic.original_length"].run()
    assert result.status == "MISMATCH"
    assert "tie to minipos.rope_scaling.dynamic ('seq_len = L: plain RoPE, D = 8')" in result.message
    assert "at s = 2, L = 4096" in result.message


def test_yarn_correction_dim_without_two_pi_fails(monkeypatch):
    monkeypatch.setattr(rs, "_yarn_correction_dim",
                        lambda rot, dim, b, L: dim * math.log(L / rot) / (2 * math.log(b)))
    with pytest.raises(TieMismatch) as err:
        _prove("rope_scaling.yarn.correction_dim")
    msg = str(err.value)
    assert ("tie to minipos.rope_scaling.yarn ('last pair kept and first pair divided by s, "
            "D = 128, base = 10000, L = 4096')") in msg
    assert "expected: [[20]\n [46]]" in msg.replace(".", "")


def test_attention_factor_applied_once_fails(monkeypatch):
    real = rope.apply_rope

    def broken(x, positions, *, attention_factor=1.0, **kw):  # logits would scale by f, not f²
        return real(x, positions, **kw) * math.sqrt(attention_factor)
    monkeypatch.setattr(rope, "apply_rope", broken)
    with pytest.raises(TieMismatch, match=r"tie to minipos.rope.apply_rope \('score with attention_factor f = "
                                          r"f² q\^T R\(n - m\) k, interleaved, D = 8'\)"):
        _prove("rope_scaling.yarn.attention_factor")


def test_yarn_attention_factor_squared_fails(monkeypatch):
    monkeypatch.setattr(rs, "yarn_mscale", lambda scale, mscale=1.0: (0.1 * math.log(scale) + 1) ** 2)
    result = core.REGISTRY["rope_scaling.yarn.attention_factor"].run()
    assert result.status == "MISMATCH" and "('f = sqrt(1/t) = 0.1 ln s + 1')" in result.message


def test_llama3_hard_step_fails_continuity(monkeypatch):
    def broken(dim, *, base=10000.0, factor, original_max_position_embeddings, low_freq_factor=1.0,
               high_freq_factor=4.0):  # no smoothing: w below L / high, w / s above
        w = rope.rope_inv_freq(dim, base=base)
        short = 2 * np.pi / w < original_max_position_embeddings / high_freq_factor
        return np.where(short, w, w / factor), 1.0
    monkeypatch.setattr(rs, "llama3", broken)
    with pytest.raises(TieMismatch) as err:
        _prove("rope_scaling.llama3.continuous")
    msg = str(err.value)
    assert ("theorem rope_scaling.llama3.continuous, tie to minipos.rope_scaling.llama3 "
            "('pair 1 just inside / outside λ = L / high_freq_factor, D = 4')") in msg
    assert "at eps = 1e-09" in msg


def test_inverse_permutation_fails_the_layout_theorem_at_d8(monkeypatch):
    # D = 4: perm = [0, 2, 1, 3] is its own inverse, so the mistake shows only from D = 8 on
    monkeypatch.setattr(rope, "interleaved_to_half_weights", rope.half_to_interleaved_weights)
    with pytest.raises(TieMismatch, match=r"tie to minipos.rope.interleaved_to_half_weights "
                                          r"\('W = I, one head: the converted matrix is P\^T, D = 8'\)"):
        _prove("rope_scaling.layout.weights")


def test_latex_of_the_yarn_index():
    tex = latex_of(core.REGISTRY["rope_scaling.yarn.correction_dim"].run())
    assert "\\begin{aligned}" in tex and "e^{\\ln x} = x" in tex


def test_longrope_long_factors_from_seq_len_l_fail(monkeypatch):
    real = rs.longrope

    def switch_at_l(dim, *, seq_len, original_max_position_embeddings, **kw):  # ">=" where HF has ">"
        return real(dim, seq_len=seq_len + (seq_len == original_max_position_embeddings),
                    original_max_position_embeddings=original_max_position_embeddings, **kw)
    monkeypatch.setattr(rs, "longrope", switch_at_l)
    with pytest.raises(TieMismatch) as err:
        _prove("rope_scaling.longrope.factors")
    msg = str(err.value)
    assert ("theorem rope_scaling.longrope.factors, tie to minipos.rope_scaling.longrope "
            "('inv_freq = θ_i / short_factor_i for seq_len <= L = 4096, D = 8')") in msg
    assert "at seq_len = 4096" in msg


def test_longrope_attention_factor_over_ln_l_max_fails(monkeypatch):
    real = rs.longrope

    def over_ln_l_max(dim, **kw):  # sqrt(1 + ln s / ln L_max) instead of / ln L
        inv_freq, _ = real(dim, **kw)
        s = kw["max_position_embeddings"] / kw["original_max_position_embeddings"]
        return inv_freq, math.sqrt(1 + math.log(s) / math.log(kw["max_position_embeddings"]))
    monkeypatch.setattr(rs, "longrope", over_ln_l_max)
    with pytest.raises(TieMismatch) as err:
        _prove("rope_scaling.longrope.factors")
    assert ("tie to minipos.rope_scaling.longrope ('attention factor sqrt(1 + ln s / ln L), "
            "s = max_position_embeddings / L')") in str(err.value)
    assert "at L_max = 131072, L = 4096" in str(err.value)


def test_longrope_phi3_attention_factor_claimed_as_yarn_is_false():
    def proof(p):  # YaRN's 0.1 ln s + 1 at s = 32 is 1.3466, not LongRoPE's sqrt(17/12) = 1.1902
        p.claim(sp.sqrt(1 + sp.log(32) / sp.log(4096)), sp.Rational(1, 10) * sp.log(32) + 1, "as in YaRN")
    with pytest.raises(StepFalse, match=r"theorem rope_scaling.demo, step 1 \('as in YaRN'\) \[FALSE\]"):
        Theorem("rope_scaling.demo", "s", proof).prove()
