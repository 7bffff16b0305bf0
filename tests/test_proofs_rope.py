"""The RoPE theorems pass, and fail readably on a wrong claim or broken code."""

import numpy as np
import pytest

sp = pytest.importorskip("sympy")
rope = pytest.importorskip("minipos.rope")

from proofs import core  # noqa: E402
from proofs.core import StepFalse, Theorem, TieMismatch, latex_of  # noqa: E402
from proofs.rope import B, B_T, D_, R, i_, m, n, theta_i  # noqa: E402

IDS = [t.id for t in core.select(["rope"])]


def test_headline_statement_verbatim():
    assert core.REGISTRY["rope.relative.headline"].statement.startswith("R(m) R(n)^T = R(m - n)")


@pytest.mark.parametrize("wrong", ["R(n - m)", "R(m + n)"])
def test_wrong_relative_sign_is_false(wrong):
    rhs = R(n - m, 4) if wrong == "R(n - m)" else R(m + n, 4)

    def proof(p):
        p.claim(R(m, 4) * R(n, 4).T, rhs, f"claim {wrong}", by="trig")
    with pytest.raises(StepFalse) as err:
        Theorem("rope.wrong", "s", proof).prove()
    msg = str(err.value)
    assert f"theorem rope.wrong, step 1 ('claim {wrong}') [FALSE]" in msg
    assert "counterexample: base = " in msg


def test_clockwise_block_fails_the_headline(monkeypatch):
    real = rope.rotation_matrix
    monkeypatch.setattr(rope, "rotation_matrix", lambda *a, **kw: real(*a, **kw).T)  # [[cos, sin], [-sin, cos]]
    with pytest.raises(TieMismatch) as err:
        core.REGISTRY["rope.relative.headline"].prove()
    msg = str(err.value)
    assert "theorem rope.relative.headline, tie to minipos.rope.rotation_matrix ('R(m) R(n)^T, D = 4')" in msg
    assert "at m = 1, n = 0" in msg


def test_broken_rotate_half_fails(monkeypatch):
    monkeypatch.setattr(rope, "rotate_half", lambda x: -rope.rotate_every_two(x))
    result = core.REGISTRY["rope.rotate_half"].run()
    assert result.status == "MISMATCH"
    assert "theorem rope.rotate_half, tie to minipos.rope.rotate_half" in result.message


def test_apply_rope_ignoring_layout_fails(monkeypatch):
    real = rope.apply_rope
    monkeypatch.setattr(rope, "apply_rope", lambda x, positions, **kw: real(x, positions))
    result = core.REGISTRY["rope.layouts"].run()
    assert result.status == "MISMATCH" and "apply_rope(x[perm], half)" in result.message


def test_wrong_layout_permutation_fails(monkeypatch):
    monkeypatch.setattr(rope, "layout_permutation", lambda dim, **kw: np.arange(dim))
    with pytest.raises(TieMismatch, match=r"tie to minipos.rope.layout_permutation \('perm = evens then odds, D = 8'\)"):
        core.REGISTRY["rope.layouts"].prove()


def test_abel_with_wrong_sign_is_false():
    from proofs.rope import sp as _sp  # the same SymPy
    h = list(_sp.symbols("h0:3")) + [0]
    e = list(_sp.symbols("e0:3"))
    S = [sum(e[:j], 0) for j in range(4)]

    def proof(p):
        p.claim(sum(h[i] * e[i] for i in range(3)), sum(S[i + 1] * (h[i + 1] - h[i]) for i in range(3)),
                "Abel summation, sign dropped")
    with pytest.raises(StepFalse, match=r"step 1 \('Abel summation, sign dropped'\)"):
        Theorem("rope.abel_wrong", "s", proof).prove()


def test_latex_of_headline():
    tex = latex_of(core.REGISTRY["rope.relative.headline"].run())
    assert tex.count("\\begin{aligned}") >= 3 and "% shown for D = 4; checked for D in {4, 2, 6, 8}" in tex


@pytest.mark.parametrize("tid", ["rope.relative.headline", "rope.relative.transpose_left"])
def test_any_even_d_is_checked_with_symbolic_i_and_d(tid):
    chains = [b for b in core.REGISTRY[tid].run().blocks if hasattr(b, "rows")]
    symbolic = [c for c in chains if {i_, D_} <= c.start.free_symbols]
    assert symbolic and any("block-diagonal matrices multiply blockwise" in r.reason for r in symbolic[0].rows)


def test_block_step_with_the_wrong_sign_is_false_for_symbolic_i_and_d():
    def proof(p):
        (p.derive(sp.MatMul(B(m * theta_i), B_T(n * theta_i), evaluate=False), "block i of R(m) R(n)^T")
          .step(B((n - m) * theta_i), "block-diagonal matrices multiply blockwise", by="trig"))
    with pytest.raises(StepFalse) as err:
        Theorem("rope.block_sign", "s", proof).prove()
    msg = str(err.value)
    assert "theorem rope.block_sign, step 1 ('block-diagonal matrices multiply blockwise') [FALSE]" in msg
    assert "counterexample: D = " in msg and "i = " in msg


def test_transpose_step_renders_the_minus_sign():
    tex = latex_of(core.REGISTRY["rope.relative.headline"].run())
    assert "\\cos{\\left(- b \\right)}" in tex and "\\right]^{T}" in tex


def test_decay_claimed_as_the_expected_score_is_false():
    # The popular reading of RoFormer §3.4.3: E[q^T R(Δ) k] = 2 Σ cos(Δ θ_i) for independent q, k.
    # The expected value is 0 (independence and zero mean), so the claim must fail.
    from proofs.attention import _expect
    from proofs.rope import Delta, thetas
    q, k, Rd = sp.Matrix(sp.symbols("q0:2")), sp.Matrix(sp.symbols("k0:2")), R(Delta, 2, 10000)
    E = sp.Function("E")
    moments = {0: 1, 1: 0, 2: 1}

    def proof(p):
        p.claim(E((q.T * Rd * k)[0, 0]), 2 * sum(sp.cos(Delta * t) for t in thetas(2, 10000)),
                "the score decays on average", using={E: lambda e: _expect(e, list(q), list(k), moments, moments)})
    with pytest.raises(StepFalse, match=r"step 1 \('the score decays on average'\) \[FALSE\]"):
        Theorem("rope.decay_wrong", "s", proof).prove()


def test_variance_that_shrinks_with_distance_is_false():
    # Var[q^T R(Δ) k] = D cos²(Δ) would be a spread that shrinks with Δ; it is D (= 2 here).
    from proofs.attention import _expect
    from proofs.rope import Delta
    q, k, Rd = sp.Matrix(sp.symbols("q0:2")), sp.Matrix(sp.symbols("k0:2")), R(Delta, 2, 10000)
    E, s = sp.Function("E"), (q.T * Rd * k)[0, 0]
    moments = {0: 1, 1: 0, 2: 1}

    def proof(p):
        p.claim(E(s ** 2) - E(s) ** 2, 2 * sp.cos(Delta) ** 2, "spread shrinks with distance",
                using={E: lambda e: _expect(e, list(q), list(k), moments, moments)})
    with pytest.raises(StepFalse, match="counterexample: Delta = "):
        Theorem("rope.var_wrong", "s", proof).prove()


def test_long_term_decay_returning_the_bound_fails_the_expectation_tie(monkeypatch):
    real = rope.long_term_decay
    monkeypatch.setattr(rope, "long_term_decay", lambda *a, **kw: (real(*a, **kw)[0],) * 2)
    with pytest.raises(TieMismatch, match=r"(?s)tie to minipos.rope.long_term_decay .* at Delta = 0: .*expected: 8\."):
        core.REGISTRY["rope.score.expectation"].prove()
