"""ALiBi proofs: every theorem passes, and wrong slopes or a wrong bias fail their theorem loudly."""

import numpy as np
import pytest

sp = pytest.importorskip("sympy")

import minipos.alibi  # noqa: E402
from proofs import alibi as proofs_alibi  # noqa: E402
from _proof_support import proof_failure  # noqa: E402
from proofs.core import StepFalse, Theorem, TieMismatch, select  # noqa: E402

THEOREMS = select(["alibi"])


def test_the_family_is_registered():
    assert {t.id for t in THEOREMS} >= {"alibi.slopes.power_of_two", "alibi.slopes.interleave",
                                        "alibi.bias.causal_equivalence", "alibi.bias.shift"}


def test_exact_reference_recursion_matches_printed_get_slopes():
    # Printed by the reference `get_slopes(n)` of github.com/ofirpress/attention_with_linear_biases.
    printed = {3: [0.0625, 0.00390625, 0.25], 6: [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125],
               12: [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,
                    0.7071067811865476, 0.35355339059327384, 0.17677669529663692, 0.08838834764831849]}
    for n, want in printed.items():
        np.testing.assert_allclose(proofs_alibi._as_floats(proofs_alibi._log2_reference(n)), want, rtol=1e-15)


def _fails(theorem_id, monkeypatch, name, broken):
    return proof_failure(theorem_id, monkeypatch, minipos.alibi, name, broken)


def test_slope_off_by_a_factor_fails_power_of_two(monkeypatch):
    good = minipos.alibi.alibi_slopes
    err = _fails("alibi.slopes.power_of_two", monkeypatch, "alibi_slopes", lambda H: 2 * good(H))
    assert isinstance(err, TieMismatch)
    assert "theorem alibi.slopes.power_of_two, tie to minipos.alibi.alibi_slopes ('powers of two')" in str(err)
    assert "at arg0 = 1" in str(err) and "disagrees with the symbolic result" in str(err)


def test_wrong_interleaving_fails_interleave(monkeypatch):
    good = minipos.alibi.alibi_slopes

    def odd_half(H):  # takes [1::2] of the 2P-head slopes: the slopes already used, not the new ones
        P = 1 << (H.bit_length() - 1)
        return np.concatenate([good(P), good(2 * P)[1::2][: H - P]]) if H != P else good(H)
    err = _fails("alibi.slopes.interleave", monkeypatch, "alibi_slopes", odd_half)
    assert "theorem alibi.slopes.interleave, tie to minipos.alibi.alibi_slopes ('non-powers of two')" in str(err)
    assert "at arg0 = 3" in str(err)


def test_flipped_bias_sign_fails_causal_equivalence(monkeypatch):
    good = minipos.alibi.alibi_bias
    err = _fails("alibi.bias.causal_equivalence", monkeypatch, "alibi_bias",
                 lambda *a, **k: -good(*a, **k))
    assert isinstance(err, TieMismatch)
    assert ("theorem alibi.bias.causal_equivalence, tie to minipos.alibi.alibi_bias "
            "('-m(i - j) masked = softmax of s + m j, T=3, S=3')") in str(err)


def test_key_only_with_the_wrong_sign_fails(monkeypatch):
    good = minipos.alibi.alibi_bias_key_only
    err = _fails("alibi.bias.causal_equivalence", monkeypatch, "alibi_bias_key_only",
                 lambda *a, **k: -good(*a, **k))
    assert "tie to minipos.alibi.alibi_bias_key_only ('+m j masked = softmax of s - m(i - j)" in str(err)


def test_distance_penalty_in_place_of_minus_m_i_minus_j_fails_without_a_mask(monkeypatch):
    good = minipos.alibi.alibi_bias  # -m|i - j| always: right under the causal mask, wrong for future keys
    err = _fails("alibi.bias.causal_equivalence", monkeypatch, "alibi_bias",
                 lambda s, q, k, **kw: good(s, q, k, symmetric=True))
    assert isinstance(err, TieMismatch)
    assert ("theorem alibi.bias.causal_equivalence, tie to minipos.alibi.alibi_bias "
            "('-m(i - j) with no mask = softmax of s + m j, T=3, S=3')") in str(err)


def test_bias_of_absolute_positions_fails_shift(monkeypatch):
    good = minipos.alibi.alibi_bias
    err = _fails("alibi.bias.shift", monkeypatch, "alibi_bias",  # a cached step that forgets the query offset
                 lambda s, q, k, **kw: good(s, len(q), k, **kw))
    assert "theorem alibi.bias.shift, tie to minipos.alibi.alibi_bias ('positions shifted by c')" in str(err)
    assert "at c = 1" in str(err)


def test_wrong_ratio_claim_is_false_with_counterexample():
    H, h = sp.Symbol("H", positive=True), sp.Symbol("h", integer=True, positive=True)

    def proof(p):
        p.claim(sp.Integer(2) ** (-8 * (h + 1) / H) / sp.Integer(2) ** (-8 * h / H), sp.Integer(2) ** (-4 / H),
                "a ratio of 2^(-4/H)", by=proofs_alibi._add_exponents)
    with pytest.raises(StepFalse) as err:
        Theorem("alibi.demo", "a wrong ratio", proof).prove()
    assert "theorem alibi.demo, step 1 ('a ratio of 2^(-4/H)')" in str(err.value)
    assert "counterexample: H = " in str(err.value)


def test_unmasked_equivalence_claim_is_false():
    m = sp.Symbol("m", positive=True)
    s = sp.symbols("s0:3", real=True)

    def proof(p):  # "-m|i - j| and +m j agree without a mask" for row 0
        p.claim(sp.Matrix(proofs_alibi._masked_softmax([s[k] - m * k for k in range(3)], [True] * 3)),
                sp.Matrix(proofs_alibi._masked_softmax([s[k] + m * k for k in range(3)], [True] * 3)),
                "shift invariance", by="cancel")
    with pytest.raises(StepFalse, match=r"theorem alibi.demo, step 1 \('shift invariance'\)"):
        Theorem("alibi.demo", "a false equivalence", proof).prove()
