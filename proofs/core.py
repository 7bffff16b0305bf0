r"""The derivation checker behind ``python -m proofs``.

A theorem is a statement plus the checks that establish it: chains of equal expressions, each
step with its reason; refutations by a concrete counterexample; identities checked exhaustively
for several small sizes; and ties to the minipos function the theorem justifies. Every check
either passes or raises a :class:`ProofFailure` naming the theorem and the step. No check ever
returns a bool.

Writing a theorem
-----------------
A family module ``proofs/<family>.py`` defines functions decorated with :func:`theorem`. The id
starts with the family name; the function receives a :class:`Proof` ``p`` and records its
checks on it::

    import sympy as sp
    from proofs.core import theorem

    @theorem("rope.block.compose", "R(a) R(b) = R(a + b)",
             checks=("minipos.rope.rotation_matrix",))
    def _(p):
        a, b = sp.symbols("a b", real=True)
        (p.derive(R(a) * R(b))                                  # the start of a chain
          .step(sp.Matrix(...), "multiply the 2x2 blocks")       # checked: equals the previous
          .step(R(a + b), "angle addition", by="trig"))          # ``by`` picks the strategy

        p.claim(lhs, rhs, "reason")                       # a one-step chain lhs = rhs
        p.refute(lhs, rhs, {a: 1}, "reason")              # lhs != rhs, shown at a = 1
        for D in p.cases(D=[2, 4, 6]):                    # exhaustive over small sizes;
            p.claim(big(D), other(D), "compose blocks")   # a failure names the case
        p.tie("minipos.rope.rotation_matrix",             # the code agrees with the math:
              expected=R(a), symbols=(a,), points=[(0.3,), (2.0,)],
              call=lambda f, a: f(a, 2))                  # f(...) vs lambdify(expected)(...)

Step options: ``by`` is a strategy name (``"expand"``, ``"trig"``, ``"pythagoras"``, ``"trigsimp"``, ``"doit"``,
``"cancel"``, ``"complex"``, ``"simplify"``), a list of them, or a callable applied to the residual; by default
the cheap ones are tried first and ``simplify`` last. ``using`` states hypotheses as
substitutions applied to the previous expression before comparing: ``{symbol: value}`` or
``{UndefinedFunction: callable}`` (e.g. ``{E_q: lambda i, j: KroneckerDelta(i, j)}``).

Matrices are compared elementwise. To show a product of explicit matrices as a product in the
LaTeX, pass it unevaluated: ``sp.MatMul(B(a), B(b), evaluate=False)`` (it is evaluated before
comparing).

What a step *shows* can differ from what it checks. ``shown=`` on :meth:`Proof.derive`,
:meth:`Chain.step` (and ``shown=(lhs, rhs)`` on :meth:`Proof.claim`, either may be ``None``)
replaces the expression in the LaTeX only; the check always uses the expression itself. Use it
where SymPy would print the evaluated form, so that ``M(k) PE(pos)`` or ``Re[(x0 + i x1) e^{imθ}]``
does not print as the vector it evaluates to. A SymPy display form is itself checked: after
``doit()`` it must equal the expression (else the step fails), so it cannot drift from what is
checked. A string is LaTeX notation SymPy cannot print (named matrices such as
``R_{half}(m) P q``), used verbatim and not checked; keep it next to the expression it names.

Rendering: blocks recorded inside ``p.cases(...)`` are the explicit instances (shown once, for
the first value); blocks recorded inside ``with p.folded("label"):`` are expansions too. The docs
(:mod:`proofs.markdown`) lead with the statement, the theorem's ``latex=`` argument and the
other blocks, and fold these into a "checked" block. :meth:`Proof.require` facts are listed
there too. Matrix expressions (``sp.MatrixSymbol``, with transposes) and
non-commutative symbols (``sp.symbols("X", commutative=False)``) work with the ``expand``
strategy; the probe substitutes random matrices for them.

Failure statuses
----------------
``FALSE``     a step does not follow: SymPy found a non-zero residual or the numeric probe found
              a counterexample (shown); or a refutation's point does not separate the two sides.
``UNPROVEN``  SymPy could not decide and the probe found no counterexample at random points:
              not a pass.
``MISMATCH``  a tie: the minipos function disagrees with the symbolic result (point shown).
``MISSING``   a tie's minipos function cannot be imported.
``ERROR``     the theorem raised something else (a bug in the proof itself).

Run with :func:`run` (returns :class:`Result` s, never raises for a failing theorem) or
:meth:`Theorem.prove` (raises the :class:`ProofFailure`; what the tests use). The recorded
checks render as LaTeX with :func:`latex_of`: each chain an ``aligned`` block whose rows carry
their reasons as ``\text{}``; a row that would show the same LaTeX as the row before it (an
``A = A``) is merged into that row, its reason appended.
"""

from __future__ import annotations

import contextlib
import importlib
import re
import time
import traceback
from dataclasses import dataclass, field

import numpy as np
import sympy as sp
from sympy.core.function import AppliedUndef, UndefinedFunction

from . import layout

__all__ = [
    "theorem", "Theorem", "Proof", "Chain", "Result", "REGISTRY",
    "ProofFailure", "StepFalse", "StepUnproven", "TieMismatch", "MissingCode",
    "run", "select", "latex_of", "PASS_STATUS",
]

PASS_STATUS = "PASS"
REGISTRY: dict[str, "Theorem"] = {}
_SHOW = 600  # characters of an expression shown in a failure message


# --------------------------------------------------------------------------- failures

class ProofFailure(AssertionError):
    """A check that did not hold. ``status``, ``theorem`` and ``step`` say which and where."""

    status = "FALSE"

    def __init__(self, theorem: str, step: str, detail: str):
        self.theorem, self.step, self.detail = theorem, step, detail
        super().__init__(f"theorem {theorem}, {step} [{self.status}]\n{detail}")


class StepFalse(ProofFailure):
    status = "FALSE"


class StepUnproven(ProofFailure):
    status = "UNPROVEN"


class TieMismatch(ProofFailure):
    status = "MISMATCH"


class MissingCode(ProofFailure):
    status = "MISSING"


def _show(x) -> str:
    s = sp.sstr(x) if isinstance(x, (sp.Basic, sp.MatrixBase)) else repr(x)
    return s if len(s) <= _SHOW else s[:_SHOW] + f" ... ({len(s)} chars)"


# --------------------------------------------------------------------------- deciding a step

def _expand_trig(e):
    return sp.expand(sp.expand_trig(sp.expand(e)))


def _complex(e):
    return sp.expand(sp.expand_complex(sp.expand(e.rewrite(sp.cos))))


def _pythagoras(e):
    """Replace sin(u)^(2j) by (1 - cos(u)^2)^j, then expand: cheap where trigsimp is slow."""
    even_sin = lambda x: (x.is_Pow and isinstance(x.base, sp.sin) and x.exp.is_Integer  # noqa: E731
                          and x.exp > 0 and x.exp % 2 == 0)
    e = sp.expand(sp.expand_trig(sp.expand(e)))
    return sp.expand(e.replace(even_sin, lambda x: (1 - sp.cos(x.base.args[0]) ** 2) ** (x.exp // 2)))


STRATEGIES = {
    "expand": sp.expand,
    "trig": _expand_trig,
    "pythagoras": _pythagoras,
    "trigsimp": lambda e: sp.trigsimp(sp.expand(e)),
    "doit": lambda e: sp.expand(e.doit()),
    "cancel": lambda e: sp.cancel(sp.expand(e)),
    "complex": _complex,
    "simplify": sp.simplify,
}
DEFAULT_STRATEGIES = ("expand", "trig", "pythagoras", "trigsimp", "doit", "cancel", "simplify")


def _strategies(by):
    if by is None:
        names = DEFAULT_STRATEGIES
    elif callable(by):
        return [("custom", by)]
    else:
        names = (by,) if isinstance(by, str) else tuple(by)
    unknown = [n for n in names if n not in STRATEGIES]
    if unknown:
        raise ValueError(f"by must name strategies among {sorted(STRATEGIES)}, got {unknown}")
    return [(n, STRATEGIES[n]) for n in names]


def _is_zero(e) -> bool:
    return e == 0 or getattr(e, "is_zero", None) is True or getattr(e, "is_ZeroMatrix", False)


def _entries(x):
    return list(x) if isinstance(x, sp.MatrixBase) else [x]


def _residual(prev, cur, by):
    """Return ``(None, strategy)`` if ``prev - cur`` is zero, else ``(residuals, tried)``."""
    if isinstance(prev, sp.MatrixBase) != isinstance(cur, sp.MatrixBase) or (
        isinstance(prev, sp.MatrixBase) and prev.shape != cur.shape
    ):
        shape = lambda x: x.shape if isinstance(x, sp.MatrixBase) else "scalar"  # noqa: E731
        return [sp.Symbol(f"<shape {shape(prev)} vs {shape(cur)}>")], "shape"
    left = [sp.sympify(d) for d in _entries(prev - cur)]
    used = "identity"
    for name, f in _strategies(by):
        if all(_is_zero(d) for d in left):
            return None, used
        left = [d if _is_zero(d) else f(d) for d in left]
        used = name
    if all(_is_zero(d) for d in left):
        return None, used
    return left, used


# --------------------------------------------------------------------------- numeric probe

def _sample(sym, rng):
    """A random value respecting the symbol's assumptions (integer, even, positive, ...);
    a random matrix for a MatrixSymbol or a non-commutative symbol (3 x 3)."""
    if isinstance(sym, sp.MatrixSymbol):
        return sp.ImmutableMatrix(rng.uniform(-2.0, 2.0, size=tuple(int(n) for n in sym.shape)))
    if not sym.is_commutative:
        return sp.ImmutableMatrix(rng.uniform(-2.0, 2.0, size=(3, 3)))
    if sym.is_integer:
        lo = 1 if sym.is_positive else (0 if sym.is_nonnegative else -6)
        v = int(rng.integers(lo, 8))
        if sym.is_even and v % 2:
            v += 1
        if sym.is_odd and not v % 2:
            v += 1
        return sp.Integer(v)
    if sym.is_positive:
        return sp.Float(rng.uniform(0.2, 3.0))
    if sym.is_nonnegative:
        return sp.Float(rng.uniform(0.0, 3.0))
    if sym.is_negative:
        return sp.Float(-rng.uniform(0.2, 3.0))
    return sp.Float(rng.uniform(-3.0, 3.0))


def _numbers(v) -> np.ndarray:
    v = v.doit() if hasattr(v, "doit") else v
    if isinstance(v, sp.MatrixBase):
        return np.array([complex(sp.N(e)) for e in v], dtype=complex)
    return np.array([complex(sp.N(v))], dtype=complex)


def _evaluate(exprs, point, rng, atoms):
    """Evaluate each expression at ``point`` as a flat complex array; Indexed entries and
    undefined function values left after ``doit`` get random values (the same value for the
    same atom across ``exprs``)."""
    out = []
    for e in exprs:
        v = sp.sympify(e).xreplace(point).doit()
        extra = v.atoms(sp.Indexed, AppliedUndef) | {s for s in v.free_symbols if isinstance(s, sp.Symbol)}
        for a in sorted(extra, key=sp.default_sort_key):
            if a not in atoms:
                atoms[a] = sp.Float(rng.uniform(-3.0, 3.0))
        out.append(_numbers(v.xreplace({a: atoms[a] for a in extra})))
    return out


def _probe(prev, cur, samples: int = 8, seed: int = 0):
    """Look for a point where ``prev != cur``. Returns (counterexample or None, points tried)."""
    pe, ce = _entries(prev), _entries(cur)
    syms = set()
    for e in pe + ce:
        syms |= {s for s in sp.sympify(e).free_symbols if isinstance(s, (sp.Symbol, sp.MatrixSymbol))}
    syms = sorted(syms, key=sp.default_sort_key)
    rng = np.random.default_rng(seed)
    tried = 0
    for _ in range(samples):
        point = {s: _sample(s, rng) for s in syms}
        atoms = {}
        try:
            a = _evaluate(pe, point, rng, atoms)
            b = _evaluate(ce, point, rng, atoms)
        except (TypeError, ValueError, ZeroDivisionError, OverflowError, AttributeError,
                sp.ShapeError, sp.NonSquareMatrixError):
            continue
        if any(x.shape != y.shape for x, y in zip(a, b)):
            continue
        if not all(np.all(np.isfinite(x)) for x in a + b):
            continue
        tried += 1
        for i, (x, y) in enumerate(zip(a, b)):
            bad = np.abs(x - y) > 1e-8 * (1.0 + np.abs(x) + np.abs(y))
            if bad.any():
                k = int(np.argmax(bad))
                return (point, atoms, i, x[k], y[k]), tried
        if not syms and not atoms:
            break
    return None, tried


def _fmt_value(v) -> str:
    if isinstance(v, sp.MatrixBase):
        return np.array2string(np.array(v, dtype=float), precision=3, separator=", ").replace("\n", "")
    return f"{float(v):.6g}" if v.is_Float else str(v)


def _fmt_num(z: complex) -> str:
    return f"{z.real:.6g}" if abs(z.imag) < 1e-12 else f"{z.real:.6g}{z.imag:+.6g}j"


# --------------------------------------------------------------------------- chains

@dataclass
class _Row:
    expr: object
    reason: str
    shown: object = None  # the display form (SymPy or a LaTeX string); None: show ``expr``


class Chain:
    """``start = e1 = e2 = ...``; :meth:`step` checks each new expression against the last."""

    def __init__(self, proof: "Proof", start, reason: str = "", shown=None):
        self.proof, self.start, self.reason = proof, _sym(start), reason
        self.rows: list[_Row] = []
        self.case, self.fold = proof._case, proof._fold
        self.start_shown = None if shown is None else _display(shown)
        if self.start_shown is not None:
            proof._check_shown("the start", self.start_shown, _value(self.start))

    @property
    def last(self):
        return _value(self.rows[-1].expr if self.rows else self.start)

    def step(self, expr, reason: str, *, by=None, using=None, shown=None) -> "Chain":
        """Claim ``expr`` equals the previous expression, for ``reason``. Raises if not.

        shown: what the LaTeX shows instead of ``expr`` (see the module docstring); the check
        uses ``expr``.
        """
        sym = _sym(expr)
        expr = _value(sym)
        prev = _apply(self.last, using) if using else self.last
        where = self.proof._where(f"step {len(self.rows) + 1} ({reason!r})")
        left, how = _residual(prev, expr, by)
        if left is not None:
            self.proof._fail_step(where, self.last, expr, left, how, prev)
        display = None if shown is None else _display(shown)
        if display is not None:
            self.proof._check_shown(f"step {len(self.rows) + 1} ({reason!r})", display, expr)
        self.rows.append(_Row(sym, reason, display))
        self.proof.steps += 1
        return self

    def latex(self, width: float | None = None) -> str:
        """An ``aligned`` block: the start, then ``= expr`` rows with their reasons; a row whose
        LaTeX equals the row before it is merged into that row (its reason appended). A start
        with a reason of its own is a line of its own, left-aligned with the ``=`` below it, so
        that a wide start does not push the rest of the chain to the right.

        width: fit the block within about this many ems (:func:`proofs.layout.chain`: reasons
        under their rows, long rows broken); ``None`` keeps every row on one line."""
        start = _tex(self.start if self.start_shown is None else self.start_shown)
        rows = [[start, self.reason]]              # [LaTeX, reason]; the first row is the start
        for row in self.rows:
            tex = _tex(row.expr if row.shown is None else row.shown)
            if _same_tex(tex, rows[-1][0]):
                rows[-1][1] = "; ".join(r for r in (rows[-1][1], row.reason) if r)
            else:
                rows.append([tex, row.reason])
        alone = len(rows) == 1 or bool(rows[0][1])   # the start on a line of its own, flush with the "="
        return layout.chain([(tex, _text(reason)) for tex, reason in rows], width, alone)


def _tex(x) -> str:
    """LaTeX of an expression, or a display string as it is."""
    return x if isinstance(x, str) else sp.latex(x)


def _same_tex(a: str, b: str) -> bool:
    return re.sub(r"\s+", "", a) == re.sub(r"\s+", "", b)


def _display(shown):
    """A display form: a LaTeX string as it is, else a SymPy object."""
    if isinstance(shown, str):
        if not shown.strip():
            raise ValueError("shown must be a non-empty LaTeX string or a SymPy object")
        return shown
    return _sym(shown)


def _sym(x):
    if isinstance(x, (list, tuple)):
        return sp.Matrix(x)
    return sp.sympify(x) if not isinstance(x, sp.MatrixBase) else sp.Matrix(x)


def _value(x):
    """What is compared: an unevaluated product of explicit matrices (kept so that the LaTeX
    shows ``B(a) B(b)`` as a product) is evaluated; symbolic matrix expressions stay as they are."""
    if isinstance(x, sp.MatrixExpr) and not x.atoms(sp.MatrixSymbol):
        return sp.Matrix(x.doit())
    return x


def _apply(expr, using: dict):
    """Substitute the hypotheses in ``using`` (symbols by value, functions by a callable)."""
    funcs = {k: v for k, v in using.items() if isinstance(k, UndefinedFunction)}
    plain = {k: v for k, v in using.items() if k not in funcs}
    for f, g in funcs.items():
        expr = expr.replace(f, g)
    return expr.subs(plain) if plain else expr


def _text(reason: str) -> str:
    """``\\text{...}`` for a reason; ``$...$`` segments stay math, the rest is escaped."""
    parts = re.split(r"(\$[^$]*\$)", reason)
    esc = lambda s: re.sub(r"([#%&_{}])", r"\\\1", s).replace("^", r"\^{}")  # noqa: E731
    return "\\text{" + "".join(p if p.startswith("$") else esc(p) for p in parts) + "}"


@dataclass
class _Refutation:
    lhs: object
    rhs: object
    at: dict
    left: object
    right: object
    reason: str
    case: object = None
    fold: object = None

    def latex(self, width: float | None = None) -> str:
        """``lhs|_at = left != right = rhs|_at`` with the reason; ``width`` as for :meth:`Chain.latex`
        (the two sides then on lines of their own)."""
        at = ", ".join(f"{sp.latex(k)} = {sp.latex(v)}" for k, v in self.at.items())
        lhs, rhs = f"\\left.{sp.latex(self.lhs)}\\right|_{{{at}}}", f"\\left.{sp.latex(self.rhs)}\\right|_{{{at}}}"
        one_line = (f"\\begin{{aligned}}\n{lhs} &= {sp.latex(self.left)}"
                    f" \\neq {sp.latex(self.right)} = {rhs}"
                    f" && {_text(self.reason)}\n\\end{{aligned}}")
        if width is None or layout.width(one_line) <= width:
            return one_line
        return layout.refutation(lhs, sp.latex(self.left), sp.latex(self.right), rhs, _text(self.reason), width)


@dataclass
class _Requirement:
    """A fact about concrete values that held (:meth:`Proof.require`); rendered as a sentence."""

    reason: str
    case: object = None
    fold: object = None

    def latex(self, width: float | None = None) -> str:
        return ""  # not mathematics: :func:`latex_of` leaves it out, the docs list it


# --------------------------------------------------------------------------- the proof context

class Proof:
    """What a theorem function receives: records and checks chains, refutations and ties."""

    def __init__(self, theorem: "Theorem"):
        self.theorem = theorem
        self.blocks: list = []        # Chains and _Refutations, in order, for rendering
        self.ties: list[str] = []     # dotted names of the minipos functions evaluated
        self.steps = 0
        self._case = None             # (name, value, all values) inside p.cases(...)
        self._fold = None             # the label inside ``with p.folded(label):``

    def _where(self, what: str) -> str:
        if self._case is None:
            return what
        return f"{what} [case {self._case[0]} = {self._case[1]}]"

    # ----- chains
    def derive(self, start, reason: str = "", *, shown=None) -> Chain:
        """Start a chain at ``start``; add checked steps with ``.step(expr, reason)``.

        shown: what the LaTeX shows instead of ``start`` (see the module docstring).
        """
        chain = Chain(self, start, reason, shown)
        self.blocks.append(chain)
        return chain

    def claim(self, lhs, rhs, reason: str, *, by=None, using=None, shown=None) -> Chain:
        """A one-step chain: ``lhs = rhs`` for ``reason``.

        shown: ``(lhs_shown, rhs_shown)``, what the LaTeX shows instead of each side (``None``
        keeps that side); the check uses ``lhs`` and ``rhs``.
        """
        if shown is None:
            shown = (None, None)
        if not (isinstance(shown, tuple) and len(shown) == 2):
            raise ValueError(f"shown must be a pair (lhs_shown, rhs_shown), got {shown!r}")
        return self.derive(lhs, shown=shown[0]).step(rhs, reason, by=by, using=using, shown=shown[1])

    def _check_shown(self, what: str, shown, value) -> None:
        """A SymPy display form must equal the value it stands for (after ``doit``); a LaTeX
        string is notation and is not checked."""
        if isinstance(shown, str):
            return
        got = _value(shown)
        got = got.doit() if hasattr(got, "doit") else got
        if isinstance(got, sp.MatrixBase) and got.shape == (1, 1) and not isinstance(value, sp.MatrixBase):
            got = got[0, 0]
        where = self._where(f"{what}: its display form")
        left, how = _residual(value, got, ("doit", "expand", "trig", "complex", "simplify"))
        if left is not None:
            self._fail_step(where + " differs from what is checked", value, got, left, how, value)

    @contextlib.contextmanager
    def folded(self, label: str):
        """``with p.folded("the score at D = 4, entry by entry"):`` marks the blocks recorded in
        the body as an expansion: the docs fold them under ``label``. Checks are unchanged."""
        if not label.strip():
            raise ValueError("label must say what the folded blocks check")
        outer, self._fold = self._fold, label
        try:
            yield
        finally:
            self._fold = outer

    def _fail_step(self, where, prev, cur, left, how, substituted):
        tid = self.theorem.id
        shown = "\n".join(f"  residual[{i}]: {_show(d)}" for i, d in enumerate(left) if not _is_zero(d))
        head = (f"  previous: {_show(prev)}\n"
                + (f"  with hypotheses: {_show(substituted)}\n" if substituted is not prev else "")
                + f"  claimed:  {_show(cur)}\n{shown}\n  (residual after strategy {how!r})")
        if how == "shape":
            raise StepFalse(tid, where, head + "\n  the two sides have different shapes")
        found, tried = _probe(substituted, cur)
        if found is not None:
            point, atoms, i, x, y = found
            at = ", ".join(f"{k} = {_fmt_value(v)}" for k, v in {**point, **atoms}.items())
            raise StepFalse(tid, where, head + f"\n  counterexample: {at or '(no free symbols)'}"
                            f"\n    entry {i}: previous = {_fmt_num(x)}, claimed = {_fmt_num(y)},"
                            f" difference = {_fmt_num(x - y)}")
        note = (f"no counterexample at {tried} random point(s)" if tried
                else "no numeric probe possible (non-commutative or unevaluable)")
        raise StepUnproven(tid, where, head + f"\n  SymPy could not decide; {note}: UNPROVEN, not a pass")

    # ----- refutations
    def refute(self, lhs, rhs, at: dict, reason: str) -> None:
        """``lhs`` and ``rhs`` differ: evaluated exactly at the point ``at``, they are unequal."""
        lhs, rhs = _sym(lhs), _sym(rhs)
        where = self._where(f"refutation ({reason!r})")
        left = _simplify_value(_apply(lhs, at))
        right = _simplify_value(_apply(rhs, at))
        if _residual(left, right, None)[0] is None:
            raise StepFalse(self.theorem.id, where,
                            f"  at {_show(at)} both sides equal {_show(left)}: not a counterexample\n"
                            f"  lhs: {_show(lhs)}\n  rhs: {_show(rhs)}")
        self.blocks.append(_Refutation(lhs, rhs, dict(at), left, right, reason, self._case, self._fold))
        self.steps += 1

    def require(self, condition, reason: str, detail: str = "") -> None:
        """A fact about concrete values (e.g. of an array) that must hold; raises if not."""
        if not bool(condition):
            raise StepFalse(self.theorem.id, self._where(f"requirement ({reason!r})"),
                            f"  does not hold{': ' + detail if detail else ''}")
        self.blocks.append(_Requirement(reason, self._case, self._fold))
        self.steps += 1

    # ----- exhaustive cases
    def cases(self, **named):
        """``for D in p.cases(D=[2, 4, 6]):`` runs the body once per value; failures name it."""
        ((name, values),) = named.items()
        values = list(values)
        for v in values:
            self._case = (name, v, values)
            try:
                yield v
            finally:
                self._case = None

    # ----- ties to code
    def tie(self, target, *, expected, points, call, symbols=(), rtol: float = 1e-9,
            atol: float = 1e-12, reason: str = "") -> None:
        """Evaluate the minipos function ``target`` at ``points`` and compare with ``expected``.

        target: dotted name ``"minipos.module.function"`` (imported now, so a monkeypatched
        function is the one checked) or a callable. expected: a SymPy expression/Matrix in
        ``symbols`` (lambdified) or a callable of a point's values. call: ``call(f, *point)``
        returns what the code gives at that point.
        """
        name, f = self._resolve(target, reason)
        where = self._where(f"tie to {name} ({reason!r})" if reason else f"tie to {name}")
        if callable(expected) and not isinstance(expected, (sp.Basic, sp.MatrixBase)):
            want_at = expected
        else:
            lam = sp.lambdify(tuple(symbols), _sym(expected), modules="numpy")
            want_at = lam
        for point in points:
            point = tuple(point) if isinstance(point, (tuple, list)) else (point,)
            want = np.asarray(want_at(*point), dtype=float if _real(want_at, point) else complex)
            try:
                got = np.asarray(call(f, *point))
            except Exception as exc:  # the code under test raised: a mismatch, not a proof bug
                raise TieMismatch(self.theorem.id, where,
                                  f"  at {_fmt_point(symbols, point)}: {name} raised "
                                  f"{type(exc).__name__}: {exc}") from exc
            self._compare(where, name, symbols, point, want, got, rtol, atol)
        if name not in self.ties:
            self.ties.append(name)
        self.steps += 1

    def _resolve(self, target, reason):
        if callable(target):
            return getattr(target, "__qualname__", repr(target)), target
        mod, _, attr = target.rpartition(".")
        try:
            return target, getattr(importlib.import_module(mod), attr)
        except (ImportError, AttributeError) as exc:
            if target not in self.ties:
                self.ties.append(target)
            raise MissingCode(self.theorem.id, self._where(f"tie to {target}"),
                              f"  cannot import {target}: {type(exc).__name__}: {exc}") from exc

    def _compare(self, where, name, symbols, point, want, got, rtol, atol):
        at = _fmt_point(symbols, point)
        if want.shape != got.shape:
            raise TieMismatch(self.theorem.id, where,
                              f"  at {at}: {name} gives shape {got.shape}, the theorem {want.shape}")
        if not np.allclose(got, want, rtol=rtol, atol=atol):
            with np.errstate(invalid="ignore", over="ignore"):
                diff = np.abs(got.astype(complex) - want)
            diff = np.where(np.isnan(diff), np.inf, diff)  # NaN from the code counts as a mismatch
            idx = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.ndim else ()
            raise TieMismatch(self.theorem.id, where,
                              f"  at {at}: {name} disagrees with the symbolic result\n"
                              f"  expected: {np.array2string(want, precision=6, threshold=40)}\n"
                              f"  got:      {np.array2string(got, precision=6, threshold=40)}\n"
                              f"  max |difference| = {diff.max():.3g} at index {tuple(int(i) for i in idx)}"
                              f" (rtol={rtol}, atol={atol})")


def _real(f, point) -> bool:
    return not np.iscomplexobj(np.asarray(f(*point)))


def _fmt_point(symbols, point) -> str:
    names = [str(s) for s in symbols] or [f"arg{i}" for i in range(len(point))]
    if len(names) != len(point):
        names = [f"arg{i}" for i in range(len(point))]
    return ", ".join(f"{n} = {v!r}" for n, v in zip(names, point))


def _simplify_value(x):
    if isinstance(x, sp.MatrixBase):
        return x.applyfunc(lambda e: sp.nsimplify(sp.simplify(e.doit())) if e.free_symbols else sp.simplify(e.doit()))
    x = sp.sympify(x).doit()
    return sp.simplify(x)


# --------------------------------------------------------------------------- theorems

@dataclass
class Result:
    """The outcome of one theorem: what ``python -m proofs`` prints."""

    id: str
    statement: str
    status: str
    seconds: float
    steps: int
    checks: list
    message: str = ""
    blocks: list = field(default_factory=list, repr=False)

    @property
    def ok(self) -> bool:
        return self.status == PASS_STATUS

    def as_json(self) -> dict:
        return {"id": self.id, "statement": self.statement, "status": self.status,
                "seconds": round(self.seconds, 4), "steps": self.steps, "checks": self.checks,
                "message": self.message}


@dataclass
class Theorem:
    """A statement, the function that proves it, and the minipos functions it is tied to."""

    id: str
    statement: str
    func: object
    checks: tuple = ()
    latex_statement: str = ""

    @property
    def family(self) -> str:
        return self.id.split(".", 1)[0]

    def prove(self, p: Proof | None = None) -> Proof:
        """Run the proof (recording into ``p`` if given); raise :class:`ProofFailure` on failure."""
        p = Proof(self) if p is None else p
        self.func(p)
        if not p.blocks and not p.ties and not p.steps:
            raise StepUnproven(self.id, "the whole theorem", "  it records no checks: UNPROVEN")
        return p

    def run(self) -> Result:
        """Run the proof and report; a failure becomes a :class:`Result`, never an exception."""
        t0 = time.perf_counter()
        p, status, message = Proof(self), PASS_STATUS, ""
        try:
            self.prove(p)
        except ProofFailure as exc:
            status, message = exc.status, str(exc)
        except Exception:  # a bug in the proof itself; report it and go on to the next theorem
            status = "ERROR"
            message = f"theorem {self.id} raised\n{traceback.format_exc(limit=-3)}"
        seconds = time.perf_counter() - t0
        checks = list(self.checks) + [c for c in p.ties if c not in self.checks]
        return Result(self.id, self.statement, status, seconds, p.steps, checks, message, p.blocks)


def theorem(id: str, statement: str, *, checks=(), latex: str = ""):
    """Register the decorated function as the proof of ``statement`` under ``id``.

    ``id`` is ``"<family>.<name>"``; ``checks`` lists the dotted names of the minipos
    functions the theorem is tied to (shown in the table even when the proof fails early).
    """
    if not re.fullmatch(r"[a-z0-9_]+(\.[A-Za-z0-9_\-]+)+", id):
        raise ValueError(f"id must look like 'family.name', got {id!r}")
    if id in REGISTRY:
        raise ValueError(f"theorem id {id!r} is already registered")

    def register(func):
        REGISTRY[id] = Theorem(id, statement, func, tuple(checks), latex)
        return func

    return register


def select(patterns=()) -> list[Theorem]:
    """Theorems whose family or id equals one of ``patterns``, or whose id starts with it as a
    dotted prefix (``rope.block`` selects ``rope.block.group``; ``rope`` does not select
    ``rope_scaling.*``). All theorems if ``patterns`` is empty."""
    ths = list(REGISTRY.values())
    if not patterns:
        return ths

    def matches(t, q):
        return t.family == q or t.id == q or t.id.startswith(q.rstrip(".") + ".")
    return [t for t in ths if any(matches(t, q) for q in patterns)]


def run(patterns=()) -> list[Result]:
    """Run the selected theorems independently; one failing does not stop the others."""
    return [t.run() for t in select(patterns)]


def latex_of(result: Result) -> str:
    """The derivations of a run theorem as LaTeX; a block from ``p.cases`` is shown once.
    :meth:`Proof.require` facts are not mathematics and are left out."""
    out, seen = [], set()
    for b in result.blocks:
        if isinstance(b, _Requirement):
            continue
        if b.case is not None:
            name, value, values = b.case
            if value != values[0]:
                continue
            if (name, tuple(values)) not in seen:
                seen.add((name, tuple(values)))
                vals = ", ".join(str(v) for v in values)
                out.append(f"% shown for {name} = {value}; checked for {name} in {{{vals}}}")
        out.append(b.latex())
    return "\n".join(out)
