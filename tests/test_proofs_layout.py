"""proofs.layout: the width estimate of a LaTeX string, and line breaking that keeps what is shown.

The widths below were measured in Chromium (Debian's chromium 13x, headless, 1280 px window) on the
built site: MathJax 3.2.2's SVG output of each string as display math in the text column, whose
font is 16 px (``MathJax.tex2svg(tex, {display: true})``, the ``<svg>``'s bounding width). The
estimate is in ems; the site renders about 19 px per estimated em, and the layout budgets assume at
most 22.7 (the largest ratio over every formula of ``python -m proofs``).
"""

from __future__ import annotations

import re

import pytest

from proofs import core, layout

MEASURED_PX = [
    (r"\cos{\left(\frac{m - n}{base^{\frac{2}{3}}} \right)} + \cos{\left(\frac{m - n}{\sqrt[3]{base}} \right)}"
     r" + \cos{\left(m - n \right)}", 376.9),
    (r"base^{- \frac{2 i}{D}} \left(s^{\frac{D}{D - 2}}\right)^{- \frac{2 i}{D}}", 148.0),
    (r"2 \cos{\left(\frac{\Delta}{100} \right)} + 2 \cos{\left(\Delta \right)}", 202.5),
    (r"\left(p_{i} + x_{i}\right) W_{q} W^{T}_{k} \left(p^{T}_{j} + x^{T}_{j}\right)", 216.2),
    (r"[\,q^C_i \mid q^R_i R(i)^\top\,] \cdot [\,k^C_j \mid k^R_j R(j)^\top\,]", 264.1),
    (r"\left[\begin{matrix}dS_{0}\\dS_{1}\\dS_{2}\end{matrix}\right]", 55.5),
]


@pytest.mark.parametrize("tex,px", MEASURED_PX)
def test_width_estimate_is_close_to_what_mathjax_draws(tex, px):
    ratio = px / layout.width(tex)
    assert 14.0 <= ratio <= 24.0, f"{ratio:.1f} px per estimated em"


def test_a_sum_breaks_before_its_signs_and_keeps_every_term():
    tex = " + ".join(f"a_{{{i}}} b_{{{i}}} c_{{{i}}}" for i in range(12)) + r" - \frac{x}{y}"
    lines = layout.break_expression(tex, budget=12)
    assert len(lines) > 1
    assert all(layout.width(line) <= 12 for line in lines)
    assert all(line.startswith(("+", "-")) for line in lines[1:])
    assert re.sub(r"\s+", "", "".join(lines)) == re.sub(r"\s+", "", tex)


def test_a_product_of_two_wide_factors_breaks_between_them_with_a_dot():
    a = r"\left(" + " + ".join(f"x_{{{i}}}" for i in range(6)) + r"\right)"
    b = r"\left(" + " + ".join(f"y_{{{i}}}" for i in range(6)) + r"\right)"
    lines = layout.break_expression(f"{a} {b}", budget=1.2 * layout.width(a))
    assert lines == [a, r"\cdot " + b]


def test_one_wide_term_is_opened_at_its_parentheses():
    inner = " + ".join(f"q_{{{i}}} \\sin{{\\left(m \\right)}}" for i in range(8))
    lines = layout.break_expression(rf"k_{{0}} \left({inner}\right)", budget=20)
    assert lines[0].startswith(r"k_{0} \Bigl(") and lines[-1].endswith(r"\Bigr)")
    assert all(r"\left(" not in line.split(r"\Bigl(")[0] for line in lines[:1])
    assert all(layout.width(line) <= 20 for line in lines)


def test_a_formula_that_fits_is_left_alone():
    assert layout.break_expression("a + b", budget=40) == ["a + b"]


def test_a_chain_without_a_width_is_the_one_line_form():
    """``python -m proofs --latex`` and every test of a chain's LaTeX see the form they always saw."""
    result = core.REGISTRY["rope.relative.headline"].run()
    chain = next(b for b in result.blocks if isinstance(b, core.Chain))
    one_line = chain.latex()
    assert one_line.count("&&") == one_line.count("\\\\\n") + 1      # every row carries its reason on the right
    assert chain.latex(width=None) == one_line


@pytest.mark.parametrize("theorem", ["xpos.relative", "rope.relative.headline", "gradients.online_softmax_backward_order"])
def test_a_laid_out_chain_fits_its_width_and_keeps_its_reasons(theorem):
    result = core.REGISTRY[theorem].run()
    for block in result.blocks:
        if not isinstance(block, core.Chain):
            continue
        tex = block.latex(width=36)
        rows = tex.split(" \\\\\n")
        for row in rows:
            body = row.replace("\\begin{aligned}\n", "").replace("\n\\end{aligned}", "")
            if "\\begin{matrix}" not in body:                 # a matrix row is measured cell by cell
                assert layout.width(body) <= 36.5, body[:120]
        for step in block.rows:
            words = [w for w in re.findall(r"[A-Za-z]{4,}", step.reason)]
            assert all(w in tex for w in words), f"reason {step.reason!r} lost"
