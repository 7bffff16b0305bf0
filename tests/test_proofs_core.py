"""The derivation checker: a false step is FALSE with a counterexample, a true step SymPy cannot
decide is UNPROVEN (never a pass), ties catch wrong code, and failures name theorem and step."""

import json
import subprocess
import sys

import numpy as np
import pytest

sp = pytest.importorskip("sympy")

from proofs import core  # noqa: E402
from proofs.core import (  # noqa: E402
    MissingCode, StepFalse, StepUnproven, Theorem, TieMismatch, latex_of,
)

x, y = sp.symbols("x y", real=True)


def _prove(func, id="demo.theorem"):
    return Theorem(id, "a demo statement", func).prove()


def test_true_chain_passes_and_counts_steps():
    def proof(p):
        (p.derive((x + y) ** 2)
          .step(x**2 + 2 * x * y + y**2, "expand the square")
          .step(sp.sin(x) ** 2 + sp.cos(x) ** 2 + x**2 + 2 * x * y + y**2 - 1, "$\\sin^2 + \\cos^2 = 1$"))
    assert _prove(proof).steps == 2


def test_false_step_is_false_with_counterexample():
    def proof(p):
        p.derive((x + y) ** 2).step(x**2 + y**2, "forget the cross term")
    with pytest.raises(StepFalse) as err:
        _prove(proof, "demo.false")
    msg = str(err.value)
    assert err.value.status == "FALSE"
    assert "theorem demo.false, step 1 ('forget the cross term')" in msg
    assert "claimed:  x**2 + y**2" in msg
    assert "residual[0]: 2*x*y" in msg
    assert "counterexample: x = " in msg


def test_true_step_sympy_cannot_decide_is_unproven_not_pass():
    # sin^2 + cos^2 = 1 is true, but 'expand' alone cannot show it: the probe finds no
    # counterexample and the step is reported UNPROVEN.
    def proof(p):
        p.derive(sp.sin(x) ** 2 + sp.cos(x) ** 2).step(1, "Pythagoras", by="expand")
    with pytest.raises(StepUnproven) as err:
        _prove(proof, "demo.unproven")
    assert "UNPROVEN, not a pass" in str(err.value)
    assert "no counterexample at 8 random point(s)" in str(err.value)
    assert Theorem("demo.unproven", "s", proof).run().status == "UNPROVEN"


def test_false_step_sympy_cannot_decide_is_still_false():
    def proof(p):
        p.derive(sp.sin(x) ** 2 + sp.cos(x) ** 2).step(sp.cos(2 * x), "a wrong identity", by="expand")
    with pytest.raises(StepFalse, match="counterexample: x = "):
        _prove(proof)


def test_matrix_steps_compare_elementwise_and_shapes():
    a = sp.Symbol("a", real=True)
    R = lambda t: sp.Matrix([[sp.cos(t), -sp.sin(t)], [sp.sin(t), sp.cos(t)]])  # noqa: E731

    def good(p):
        p.claim(R(a) * R(x), R(a + x), "angle addition", by="trig")

    def bad(p):
        p.claim(R(a) * R(x), R(a - x), "a flipped sign")

    def shape(p):
        p.claim(R(a), sp.Matrix([1, 2]), "wrong shape")
    _prove(good)
    with pytest.raises(StepFalse, match=r"step 1 \('a flipped sign'\)"):
        _prove(bad)
    with pytest.raises(StepFalse, match=r"shape \(2, 2\) vs \(2, 1\)"):
        _prove(shape)


def test_noncommutative_expansion():
    A, B, C = sp.symbols("A B C", commutative=False)
    _prove(lambda p: p.claim((A + B) * C, A * C + B * C, "distribute"))
    with pytest.raises(StepFalse, match=r"counterexample: A = \[\[") as err:
        _prove(lambda p: p.claim(A * B, B * A, "they do not commute"))
    assert "residual[0]: A*B - B*A" in str(err.value)


def test_matrix_expressions_with_transposes():
    X, Y = sp.MatrixSymbol("X", 1, 3), sp.MatrixSymbol("Y", 1, 3)
    W = sp.MatrixSymbol("W", 3, 3)
    _prove(lambda p: p.claim(X * W * (X + Y).T, X * W * X.T + X * W * Y.T, "distribute", by="expand"))
    with pytest.raises(StepFalse, match="counterexample: W = "):
        _prove(lambda p: p.claim(X * W * Y.T, Y * W * X.T, "W is not symmetric", by="expand"))


def test_hypotheses_by_substitution():
    E = sp.Function("E")
    i, j = sp.symbols("i j", integer=True)

    def proof(p):
        p.claim(E(i, j) * E(i, j), sp.KroneckerDelta(i, j) ** 2, "unit second moments",
                using={E: lambda a, b: sp.KroneckerDelta(a, b)})
    _prove(proof)


def test_refutation_needs_a_separating_point():
    def good(p):
        p.refute(x ** 2, 2 * x, {x: 3}, "not the same function")

    def bad(p):
        p.refute(x ** 2, 2 * x, {x: 2}, "equal at x = 2")
    pf = _prove(good)
    assert "\\neq" in pf.blocks[0].latex()
    with pytest.raises(StepFalse, match="not a counterexample"):
        _prove(bad, "demo.refute")


def test_cases_name_the_failing_size():
    def proof(p):
        for n in p.cases(n=[1, 2, 3]):
            xs = sp.symbols(f"x0:{n}", real=True)
            p.claim(sum(xs) ** 2, sum(v**2 for v in xs), "squares only")  # true only for n = 1
    with pytest.raises(StepFalse, match=r"\[case n = 2\]"):
        _prove(proof)


def test_tie_passes_mismatch_and_missing():
    def tied(f):
        def proof(p):
            p.tie(f, expected=sp.Matrix([sp.cos(x), sp.sin(x)]), symbols=(x,),
                  points=[(0.0,), (1.3,)], call=lambda g, t: g(t), reason="unit circle")
        return proof
    _prove(tied(lambda t: np.array([[np.cos(t)], [np.sin(t)]])))
    with pytest.raises(TieMismatch) as err:
        _prove(tied(lambda t: np.array([[np.cos(t)], [-np.sin(t)]])), "demo.tie")
    msg = str(err.value)
    assert "theorem demo.tie, tie to" in msg and "'unit circle'" in msg
    assert "at x = 1.3" in msg and "max |difference|" in msg
    with pytest.raises(TieMismatch, match="gives shape"):
        _prove(tied(lambda t: np.array([np.cos(t), np.sin(t)])))

    def missing(p):
        p.tie("minipos.no_such_module.f", expected=x, symbols=(x,), points=[(1.0,)], call=lambda g, t: g(t))
    with pytest.raises(MissingCode, match="cannot import minipos.no_such_module.f"):
        _prove(missing)


def test_a_theorem_without_checks_is_unproven():
    with pytest.raises(StepUnproven):
        _prove(lambda p: None)


def test_run_reports_failures_without_raising():
    def boom(p):
        raise KeyError("bug in the proof")
    r = Theorem("demo.error", "s", boom).run()
    assert r.status == "ERROR" and "KeyError" in r.message and not r.ok


def test_latex_is_an_aligned_block_with_reasons():
    def proof(p):
        p.derive((x + y) ** 2).step(x**2 + 2 * x * y + y**2, "expand the square_1 & more")
    r = Theorem("demo.latex", "s", proof).run()
    tex = latex_of(r)
    assert tex.startswith("\\begin{aligned}") and tex.endswith("\\end{aligned}")
    assert "&= x^{2} + 2 x y + y^{2} && \\text{expand the square\\_1 \\& more}" in tex


def test_registry_rejects_duplicates_and_bad_ids():
    with pytest.raises(ValueError, match="already registered"):
        core.theorem("attention.softmax.shift", "again")
    with pytest.raises(ValueError, match="family.name"):
        core.theorem("NoFamily", "s")


def test_cli_json_and_exit_status():
    out = subprocess.run([sys.executable, "-m", "proofs", "attention.softmax", "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = json.loads(out.stdout)
    assert rows[0]["id"] == "attention.softmax.shift" and rows[0]["status"] == "PASS"
    assert set(rows[0]) >= {"id", "statement", "status", "seconds", "checks"}
    none = subprocess.run([sys.executable, "-m", "proofs", "no_such_family"],
                          capture_output=True, text=True, timeout=60)
    assert none.returncode == 2


def test_unevaluated_matrix_product_is_checked_and_shown_as_a_product():
    A = sp.Matrix([[1, x], [0, 1]])

    def proof(p):
        p.derive(sp.MatMul(A, A, evaluate=False)).step(sp.Matrix([[1, 2 * x], [0, 1]]), "shears add")

    tex = latex_of(Theorem("demo.matmul", "s", proof).run())
    assert "\\end{matrix}\\right] \\left[\\begin{matrix}" in tex  # two factors side by side
    with pytest.raises(StepFalse, match="shears multiply"):
        _prove(lambda p: p.derive(sp.MatMul(A, A, evaluate=False)).step(sp.Matrix([[1, x**2], [0, 1]]), "shears multiply"))


def test_a_display_form_is_shown_while_the_expression_is_checked():
    A, v = sp.Matrix([[1, x], [0, 1]]), sp.Matrix([y, 1])

    def proof(p):
        (p.derive(A * v, "the product", shown=sp.MatMul(sp.ImmutableMatrix(A), sp.ImmutableMatrix(v), evaluate=False))
          .step(sp.Matrix([x + y, 1]), "multiply")
          .step(sp.Matrix([y + x, 1]), "name it", shown=r"S\,v"))               # notation, not checked
        p.claim(2 * x, x + x, "double", shown=(None, sp.Add(x, x, evaluate=False)))  # not 2 x = 2 x

    tex = latex_of(Theorem("demo.shown", "s", proof).run())
    assert "\\end{matrix}\\right] \\left[\\begin{matrix}y" in tex               # the product, unevaluated
    assert " &= S\\,v && \\text{name it}" in tex
    assert "2 x &= x + x && \\text{double}" in tex

    def wrong_display(p):
        p.derive(A * v).step(sp.Matrix([x + y, 1]), "multiply", shown=sp.Matrix([x - y, 1]))
    with pytest.raises(StepFalse, match="its display form differs from what is checked"):
        _prove(wrong_display)

    def wrong_step(p):  # a right display form does not rescue a wrong step
        p.derive(A * v).step(sp.Matrix([x - y, 1]), "multiply", shown=sp.Matrix([x + y, 1]))
    with pytest.raises(StepFalse, match="step 1 \\('multiply'\\)"):
        _prove(wrong_step)
    with pytest.raises(ValueError, match="pair"):
        _prove(lambda p: p.claim(x, x, "r", shown=x))
    with pytest.raises(ValueError, match="non-empty"):
        _prove(lambda p: p.derive(x, shown=" "))


def test_a_step_shown_like_the_previous_one_is_merged_into_it():
    def proof(p):
        (p.derive(x * (y + 1))
          .step(x * y + x, "distribute")
          .step(x + x * y, "reorder"))             # SymPy prints it as the row before

    tex = latex_of(Theorem("demo.merge", "s", proof).run())
    assert tex.count("&=") == 1 and "\\text{distribute; reorder}" in tex


def test_folded_blocks_and_facts_are_recorded_for_rendering():
    def proof(p):
        p.claim(x + x, 2 * x, "open")
        with p.folded("the expansion"):
            p.claim((x + y) ** 2, x**2 + 2 * x * y + y**2, "expand")
            p.refute(x, -x, {x: 1}, "not odd")
        for n in p.cases(n=[1, 2]):
            p.require(n > 0, "n is positive")

    r = Theorem("demo.folded", "s", proof).run()
    assert [getattr(b, "fold", None) for b in r.blocks] == [None, "the expansion", "the expansion", None, None]
    facts = [b for b in r.blocks if isinstance(b, core._Requirement)]
    assert [(f.reason, f.case[1]) for f in facts] == [("n is positive", 1), ("n is positive", 2)]
    assert "n is positive" not in latex_of(r) and latex_of(r).count("\\begin{aligned}") == 3
    with pytest.raises(ValueError, match="label"):
        _prove(lambda p: p.folded(" ").__enter__())
