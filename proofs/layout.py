r"""Line breaking for the LaTeX of a derivation, so that a chain fits the width of a page.

MathJax 3 does not break a display formula into lines: a chain whose rows are wider than the text
column scrolls sideways. :func:`chain` lays out the rows of a chain (``start = e1 = e2 ...`` with a
reason per step) within a width given in ems:

- a row whose expression and reason fit side by side keeps the reason on its right;
- otherwise the reason goes on a line of its own under the expression (wrapped at word boundaries
  if it is long), and the expression is broken at its top-level ``+``, ``-`` and ``=`` signs,
  between the factors of a product (a continuation line starts with ``\cdot``), and, when one
  term is still too wide, inside its outermost parentheses (``\left( ... \right)`` become
  ``\Bigl( ... \Bigr)`` so that the pair can span lines).

:func:`width` estimates the rendered width of a LaTeX string in ems of the surrounding text: a small
TeX reader with per-glyph widths close to MathJax's TeX fonts (calibrated against MathJax's SVG
output in Chromium on every formula of ``python -m proofs``: the estimate errs on the wide side).
It is a layout heuristic, never a check: what a chain shows and what it checks are unchanged.
"""

from __future__ import annotations

import re

__all__ = ["width", "chain", "refutation", "break_expression"]

_TOKEN = re.compile(r"\\[a-zA-Z]+|\\.|[{}^_&]|\s+|.", re.S)

_GREEK = {"alpha", "beta", "gamma", "delta", "epsilon", "varepsilon", "zeta", "eta", "theta", "vartheta",
          "iota", "kappa", "lambda", "mu", "nu", "xi", "pi", "rho", "sigma", "tau", "upsilon", "phi",
          "varphi", "chi", "psi", "omega", "Gamma", "Delta", "Theta", "Lambda", "Xi", "Pi", "Sigma",
          "Phi", "Psi", "Omega", "ell", "partial", "nabla", "infty", "hbar", "imath"}
_NAMED = {"sin", "cos", "tan", "log", "ln", "exp", "min", "max", "arg", "det", "lim", "sup", "inf",
          "sinh", "cosh", "tanh", "arctan", "arcsin", "arccos"}
_BIN = {"cdot", "times", "circ", "odot", "otimes", "oplus", "pm", "mp", "ast", "star", "cup", "cap",
        "wedge", "vee", "setminus"}
_REL = {"neq", "ne", "le", "leq", "ge", "geq", "approx", "equiv", "sim", "simeq", "to", "mapsto",
        "rightarrow", "leftarrow", "Rightarrow", "Leftarrow", "iff", "in", "notin", "subset", "subseteq",
        "propto", "ll", "gg", "coloneqq", "mid"}
_SPACE = {",": 0.17, ":": 0.22, ";": 0.28, "!": -0.17, " ": 0.25, "quad": 1.0, "qquad": 2.0,
          "enspace": 0.5, "thinspace": 0.17}
_SIZED = {"big": 0.45, "Big": 0.55, "bigg": 0.65, "Bigg": 0.75, "bigl": 0.45, "bigr": 0.45, "Bigl": 0.55,
          "Bigr": 0.55, "biggl": 0.65, "biggr": 0.65, "Biggl": 0.75, "Biggr": 0.75}
_IGNORED = {"displaystyle", "textstyle", "scriptstyle", "limits", "nolimits", "left", "right",
            "mathrel", "mathbin", "mathop", "mathord", "boldsymbol", "mathbf", "mathit", "mathcal",
            "mathbb", "mathsf", "bm", "operatorname", "hat", "tilde", "bar", "vec", "dot", "ddot",
            "widehat", "widetilde", "overline", "underline", "color", "lvert", "rvert", "lVert", "rVert"}
_WIDE_CHARS = set("ABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _tokens(tex: str) -> list[str]:
    return _TOKEN.findall(tex)


class _Reader:
    """Reads a token list and returns widths in ems (at the current script scale)."""

    def __init__(self, tokens: list[str]):
        self.t, self.i = tokens, 0

    def peek(self):
        return self.t[self.i] if self.i < len(self.t) else None

    def take(self):
        tok = self.peek()
        self.i += 1
        return tok

    def group_tokens(self) -> list[str]:
        """The tokens of the next argument: a ``{...}`` group or one token."""
        while self.peek() is not None and self.peek().isspace():
            self.take()
        tok = self.take()
        if tok != "{":
            return [tok] if tok is not None else []
        depth, out = 1, []
        while self.peek() is not None:
            tok = self.take()
            if tok == "{":
                depth += 1
            elif tok == "}":
                depth -= 1
                if depth == 0:
                    break
            out.append(tok)
        return out

    def text_until_close(self) -> str:
        return "".join(self.group_tokens())


def _text_width(text: str) -> float:
    """A ``\\text{...}``: about half an em per character; ``$...$`` inside is math."""
    total = 0.0
    for k, part in enumerate(re.split(r"(\$[^$]*\$)", text)):
        if part.startswith("$") and part.endswith("$") and len(part) > 1:
            total += width(part[1:-1])
        else:
            plain = re.sub(r"\\([#%&_{}])", r"\1", part).replace(r"\^{}", "^")
            total += sum(0.72 if c in "MWmw" else 0.28 if c in "iljt.,;:'!|() " else 0.5 for c in plain)
    return total


_SIZE = {"D": 1.0, "T": 1.0, "S": 0.71, "SS": 0.5}
_FRAC = {"D": "T", "T": "S", "S": "SS", "SS": "SS"}       # the style of a fraction's parts
_SCRIPT = {"D": "S", "T": "S", "S": "SS", "SS": "SS"}     # the style of a sub- or superscript


def _environment(r: _Reader, name: str, style: str) -> float:
    """``matrix``-like environments: columns side by side; ``aligned``: rows, columns paired."""
    body, depth = [], 0
    while r.peek() is not None:
        tok = r.take()
        if tok == "\\begin":
            depth += 1
            body.append(tok)
            continue
        if tok == "\\end":
            env = r.group_tokens()
            if depth == 0 and "".join(env) == name:
                break
            depth -= 1
            body += [tok, "{", *env, "}"]
            continue
        body.append(tok)
    rows = _split(body, "\\\\")
    cells = [_split(row, "&") for row in rows]
    ncols = max((len(c) for c in cells), default=0)
    colw = [0.0] * ncols
    aligned = name in ("aligned", "align", "align*", "split", "gathered")
    for row in cells:
        for j, cell in enumerate(row):
            colw[j] = max(colw[j], _width_tokens(cell, "D" if aligned else _FRAC["D" if style == "D" else style]))
    size = _SIZE[style]
    if aligned:
        return sum(colw) + size * (1.0 * max(0, ncols // 2 - 1) + 0.5 * (ncols // 2))
    return sum(colw) + size * 1.0 * max(0, ncols - 1)


_NESTING = ("{", "}", "\\begin", "\\end")


def _nesting(tok: str, depth: int, env: int) -> tuple[int, int]:
    """The brace depth and the environment depth after ``tok``."""
    return depth + (tok == "{") - (tok == "}"), env + (tok == "\\begin") - (tok == "\\end")


def _split(tokens: list[str], sep: str) -> list[list[str]]:
    """Split at ``sep`` outside braces and nested environments."""
    out, cur, depth, env = [], [], 0, 0
    for tok in tokens:
        depth, env = _nesting(tok, depth, env)
        if tok == sep and depth == 0 and env == 0:
            out.append(cur)
            cur = []
        else:
            cur.append(tok)
    out.append(cur)
    return out


def _width_tokens(tokens: list[str], style: str = "D") -> float:
    r = _Reader(tokens)
    scale = _SIZE[style]
    total = 0.0
    last_was_atom = False
    while r.peek() is not None:
        tok = r.take()
        if tok.isspace() or tok in ("{", "}"):
            if tok == "{":              # a bare group: read it whole
                r.i -= 1
                total += _width_tokens(r.group_tokens(), style) / scale
            continue
        if tok in ("^", "_"):
            total += _width_tokens(r.group_tokens(), _SCRIPT[style]) / scale
            continue
        if tok.startswith("\\") and len(tok) > 1 and tok[1:].isalpha():
            name = tok[1:]
            if name == "frac" or name == "dfrac" or name == "tfrac":
                inner = _FRAC[style] if name != "dfrac" else "T"
                num, den = _width_tokens(r.group_tokens(), inner), _width_tokens(r.group_tokens(), inner)
                total += max(num, den) / scale + 0.24
            elif name == "sqrt":
                total += _width_tokens(r.group_tokens(), style) / scale + 0.85
            elif name in ("text", "mathrm", "textit", "textbf", "mbox", "texttt"):
                arg = r.text_until_close()
                total += _text_width(arg) if name.startswith("text") or name == "mbox" else 0.5 * len(arg)
            elif name == "begin":
                env = "".join(r.group_tokens())
                if env == "array":
                    r.group_tokens()                  # the column spec
                total += _environment(r, env, style) / scale
            elif name in ("left", "right"):
                delim = r.take()
                while delim is not None and delim.isspace():
                    delim = r.take()
                total += 0.12 if delim == "." else 0.47
            elif name in _SIZED:
                r.take()
                total += _SIZED[name]
            elif name in _GREEK:
                total += 0.6
            elif name in _NAMED:
                total += 0.5 * len(name) + 0.17
            elif name in _BIN:
                total += 0.78 + 0.44
            elif name in _REL:
                total += 0.78 + 0.56
            elif name in _SPACE:
                total += _SPACE[name]
            elif name in ("sum", "prod", "int"):
                total += 1.45
            elif name in ("ldots", "cdots", "dots", "vdots"):
                total += 1.17
            elif name in ("langle", "rangle", "lfloor", "rfloor", "lceil", "rceil", "vert", "|"):
                total += 0.39
            elif name in ("mathrm", "operatorname"):
                total += 0.5 * len(r.text_until_close())
            elif name in _IGNORED:
                continue
            else:
                total += 0.6
            continue
        if tok.startswith("\\"):                    # \, \; \! \\ \{ ...
            ch = tok[1:]
            total += _SPACE.get(ch, 0.5)
            continue
        if tok in "+-":
            total += 0.78 + (0.44 if last_was_atom else 0.0)
            last_was_atom = False
            continue
        if tok in "=<>":
            total += 0.78 + 0.56
            last_was_atom = False
            continue
        if tok == ",":
            total += 0.28 + 0.17
        elif tok in "()[]|":
            total += 0.39
        elif tok.isdigit():
            total += 0.5
        elif tok in _WIDE_CHARS:
            total += 0.75
        elif tok.isalpha():
            total += 0.55
        elif tok == "&":
            continue
        else:
            total += 0.5
        last_was_atom = True
    return total * scale


def width(tex: str) -> float:
    """The estimated width of ``tex`` rendered as display math, in ems of the surrounding text."""
    return _width_tokens(_tokens(tex))


# --------------------------------------------------------------------------- breaking

def _top_level(tokens: list[str]):
    """Indices where a line may break: before a top-level ``+``, ``-`` or relation (kind "op"), and
    between two top-level factors of a product (kind "mul"); "top level" is outside braces,
    environments and ``\\left ... \\right`` pairs."""
    points, depth, lr, env = [], 0, 0, 0
    prev_atom_end = False
    i = 0
    while i < len(tokens):
        tok = tokens[i]
        depth, env = _nesting(tok, depth, env)
        if tok in _NESTING:
            pass
        elif tok == "\\left":
            if depth == 0 and env == 0 and lr == 0 and prev_atom_end and i > 0:
                points.append((i, "mul"))
            lr += 1
        elif tok == "\\right":
            lr -= 1
            if depth == 0 and env == 0 and lr == 0:
                prev_atom_end = True
                i += 2                              # the delimiter
                continue
        elif depth == 0 and env == 0 and lr == 0:
            if tok in ("+", "-", "=") or tok in ("\\neq", "\\le", "\\ge", "\\leq", "\\geq", "\\approx"):
                if i > 0 and prev_atom_end:
                    points.append((i, "op"))
                prev_atom_end = False
                i += 1
                continue
            if not tok.isspace():
                prev_atom_end = True
        i += 1
    return points


def _join(tokens: list[str]) -> str:
    return "".join(tokens).strip()


def _pack(pieces: list[tuple[str, str]], budget: float, indent: float) -> list[str]:
    """Greedy: put pieces on a line while it fits (continuation lines are ``indent`` narrower); a
    line that starts at a "mul" break starts with ``\\cdot``."""
    lines, cur = [], ""
    for text, kind in pieces:
        trial = (cur + " " + text).strip() if cur else text
        limit = budget if not lines else budget - indent
        if cur and width(trial) > limit:
            lines.append(cur)
            cur = ("\\cdot " if kind == "mul" else "") + text
        else:
            cur = trial
    if cur:
        lines.append(cur)
    return lines


def _pieces(tex: str, kinds=("op", "mul")) -> list[tuple[str, str]]:
    """``tex`` split at its top-level break points of the given kinds: ``(text, kind of the break
    before it)``."""
    toks = _tokens(tex)
    points = [(i, k) for i, k in _top_level(toks) if k in kinds]
    bounds = [0] + [i for i, _ in points] + [len(toks)]
    before = dict(points)
    out = []
    for a, b in zip(bounds, bounds[1:]):
        piece = _join(toks[a:b])
        if piece:
            out.append((piece, before.get(a, "")))
    return out


def _open_outer(tex: str):
    """``(before, inner, after, open, close)`` for the widest top-level ``\\left( ... \\right)``
    (or ``[ ]``) group of ``tex``, or None."""
    toks = _tokens(tex)
    best, depth, lr, env, start = None, 0, 0, 0, None
    for i, tok in enumerate(toks):
        depth, env = _nesting(tok, depth, env)
        if tok in _NESTING:
            pass
        elif tok == "\\left" and depth == 0 and env == 0:
            if lr == 0:
                start = i if i + 1 < len(toks) and toks[i + 1] in ("(", "[") else None
            lr += 1
        elif tok == "\\right" and depth == 0 and env == 0:
            lr -= 1
            if lr == 0 and start is not None and i + 1 < len(toks) and toks[i + 1] in (")", "]"):
                inner = toks[start + 2: i]
                if best is None or width(_join(inner)) > width(_join(best[1])):
                    best = (toks[:start], inner, toks[i + 2:], toks[start + 1], toks[i + 1])
                start = None
    if best is None:
        return None
    before, inner, after, lo, hi = best
    return _join(before), _join(inner), _join(after), lo, hi


def break_expression(tex: str, budget: float, indent: float = 1.0, _depth: int = 0) -> list[str]:
    """``tex`` as lines of at most ``budget`` ems where it can be broken (see the module docstring);
    a part that cannot be broken is returned as it is. Lines after the first are to be indented by
    ``indent`` (the caller does); lines inside opened parentheses carry their own ``\\quad``."""
    if width(tex) <= budget or _depth > 6:
        return [tex]
    out = []
    for line in _pack(_pieces(tex, ("op",)), budget, indent):
        if width(line) <= budget - (indent if out else 0.0):
            out.append(line)
            continue
        out += _break_term(line, budget - (indent if out else 0.0), indent, _depth)
    return out


_MATRIX = re.compile(r"^(\\left\[\\begin\{matrix\})(.*)(\\end\{matrix\}\\right\])(\^\{T\})?$", re.S)


def _break_matrix(tex: str, budget: float, indent: float, depth: int) -> str | None:
    """A matrix too wide for ``budget`` with each cell broken into lines (an ``aligned`` block per
    cell), or None if ``tex`` is not one matrix."""
    m = _MATRIX.match(tex.strip())
    if m is None:
        return None
    body = _tokens(m.group(2))
    rows = [_split(row, "&") for row in _split(body, "\\\\")]
    ncols = max(len(r) for r in rows)
    cell_budget = (budget - 1.5 - 1.0 * (ncols - 1)) / ncols
    if cell_budget < 6:
        return None
    out_rows = []
    for row in rows:
        cells = []
        for cell in row:
            text = _join(cell)
            lines = break_expression(text, cell_budget, indent, depth + 1)
            if len(lines) == 1:
                cells.append(text)
            else:
                cells.append("\\begin{aligned}&" + " \\\\ &\\quad ".join(lines) + "\\end{aligned}")
        out_rows.append(" & ".join(cells))
    return m.group(1) + "\\\\".join(out_rows) + m.group(3) + (m.group(4) or "")


def _break_term(term: str, budget: float, indent: float, depth: int) -> list[str]:
    """One term too wide for ``budget``: between its factors if each fits, else inside its widest
    parenthesised sum, else each cell of a matrix, else between its factors anyway."""
    factors = _pieces(term, ("mul",))
    if len(factors) > 1 and all(width(f) <= budget - indent for f, _ in factors):
        return _pack(factors, budget, indent)
    matrix = _break_matrix(term, budget, indent, depth)
    if matrix is not None:
        return [matrix]
    opened = _open_outer(term)
    if opened is not None and _pieces(opened[1], ("op",))[1:]:
        before, inner, after, lo, hi = opened
        left = {"(": "\\Bigl(", "[": "\\Bigl["}[lo]
        right = {")": "\\Bigr)", "]": "\\Bigr]"}[hi]
        head = f"{before} {left}".strip()
        inner_lines = break_expression(inner, budget - indent - width(head), indent, depth + 1)
        lines = [f"{head} {inner_lines[0]}"] + [f"\\quad {x}" for x in inner_lines[1:]]
        lines[-1] = f"{lines[-1]} {right} {after}".strip()
        return lines
    if len(factors) > 1:
        lines = _pack(factors, budget, indent)
        return [x for line in lines
                for x in ([line] if width(line) <= budget or line == term or depth > 5
                          else _break_term(line, budget, indent, depth + 1))]
    return [term]


def _wrap_text(reason_tex: str, budget: float) -> list[str]:
    r"""A ``\text{...}`` reason wrapped at spaces (outside ``$...$``) into lines within ``budget``."""
    m = re.fullmatch(r"\\text\{(.*)\}", reason_tex, re.S)
    if m is None or width(reason_tex) <= budget:
        return [reason_tex]
    words = re.findall(r"\$[^$]*\$\S*|\S+", m.group(1))
    lines, cur = [], ""
    for w in words:
        trial = (cur + " " + w).strip()
        if cur and _text_width(trial) > budget:
            lines.append(cur)
            cur = w
        else:
            cur = trial
    lines.append(cur)
    return ["\\text{" + line + "}" for line in lines]


def chain(rows: list[tuple[str, str]], budget: float | None, start_alone: bool) -> str:
    r"""The ``aligned`` block of a chain: ``rows[0]`` is the start, the others follow with ``=``;
    each is ``(LaTeX, reason LaTeX or "")``. With ``budget=None`` every row is one line, its
    reason on the right (the form ``python -m proofs --latex`` prints). ``start_alone``: the
    start on a line of its own, flush with the ``=`` below it."""
    if budget is None or _fits_side_by_side(rows, budget) or len(rows) == 1 and width(rows[0][0]) <= budget:
        if start_alone:
            lines = [f"& {rows[0][0]} && {rows[0][1]}"]
            rest = rows[1:]
        else:
            lines = [f"{rows[0][0]} &= {rows[1][0]} && {rows[1][1]}"]
            rest = rows[2:]
        lines += [f" &= {tex} && {reason}" for tex, reason in rest]
        return "\\begin{aligned}\n" + " \\\\\n".join(lines) + "\n\\end{aligned}"
    rows = [(tex, "" if reason == "\\text{}" else reason) for tex, reason in rows]
    lines = []
    eq = width("{}={}") + 0.3
    for k, (tex, reason) in enumerate(rows):
        lead = "& " if k == 0 else "&= "
        parts = break_expression(tex, budget - (eq if k else 0.0))
        lines.append(lead + parts[0])
        lines += [f"& \\quad {p}" for p in parts[1:]]
        if reason:
            lines += [f"& \\qquad {p}" for p in _wrap_text(_small(reason), budget - 2.0)]
    return "\\begin{aligned}\n" + " \\\\\n".join(lines) + "\n\\end{aligned}"


def _small(reason: str) -> str:
    return reason


def _fits_side_by_side(rows, budget: float) -> bool:
    """Whether the widest expression column plus the widest reason column fits ``budget``."""
    exprs = max(width(tex) for tex, _ in rows) + width("{}={}")
    reasons = max((width(r) for _, r in rows if r), default=0.0)
    return exprs + reasons + 2.0 <= budget


def refutation(lhs: str, left: str, right: str, rhs: str, reason: str, budget: float) -> str:
    r"""``lhs = left \neq right = rhs`` for a counterexample, one side per line, within ``budget``."""
    lines = [f"& {p}" for p in break_expression(lhs, budget)]
    lines += [f"&= {p}" for p in break_expression(left, budget - 1.5)]
    lines += [f"&\\neq {p}" for p in break_expression(right, budget - 1.5)]
    lines += [f"&= {p}" for p in break_expression(rhs, budget - 1.5)]
    lines += [f"& \\qquad {p}" for p in _wrap_text(reason, budget - 2.0)]
    return "\\begin{aligned}\n" + " \\\\\n".join(lines) + "\n\\end{aligned}"
