"""The RoPE theorems pass, and fail readably on a wrong claim or broken code."""

import numpy as np
import pytest

sp = pytest.importorskip("sympy")
rope = pytest.importorskip("minipos.rope")

from proofs import core  # noqa: E402
from proofs.core import StepFalse, Theorem, TieMismatch, latex_of  # noqa: E402
from proofs.rope import R, m, n  # noqa: E402

IDS = [t.id for t in core.select(["rope"])]


@pytest.mark.parametrize("tid", IDS)
def test_theorem_passes(tid):
    core.REGISTRY[tid].prove()


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
