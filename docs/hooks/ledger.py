"""The ledger: every claim the site makes from evidence, each with its test and verdict.

An entry is ``{page, claim, kind, verdict, evidence, records, test, p, p_holm}`` (``Entry``); the
docs build writes them all to ``claims.json`` at the root of the site, and ``docs/claims.md``
renders them. ``kind`` says what the evidence is:

- ``lab``: an ordering or a number read from the lab's records (``lab/results``). The unit of a lab
  test is the training run: each seed gives one value of the metric (loss above the floor on Markov,
  held-out loss on text and prose, accuracy on retrieval), itself a mean over evaluation sequences.
  The seeds are the task's (``lab.run.TASK_SEEDS``: five on Markov and retrieval, three on text and
  prose). Two schemes are compared by Welch's t-test on their seeds' values, one-sided; one scheme at two
  lengths, whose seeds are the same models, by the paired t-test on the per-seed differences,
  one-sided; a value against a stated threshold by the one-sample t-test, one-sided. The p-values of
  all the lab entries of the site are Holm-adjusted together (``holm``), and a lab claim is
  *confirmed* only when its adjusted p is below ``ALPHA`` and its records are complete (every seed
  of each row at the task's fixed budget). A claim about behaviour past the training length on the
  synthetic tasks is further checked on seed 0 trained on twice the budget (``lab/results/twice``):
  where the two budgets order the values differently the verdict is *moves with training*. Anything
  short of all that is *not resolved*, and the page shows both numbers.
- ``seed``: a statement of the article minipos grew from, with a verdict (confirmed, refuted,
  partly, untestable) and the evidence: other ledger entries, theorems, citations.
- ``cite``: a statement of a paper, with its section.
- ``proof``: a theorem of ``python -m proofs``, run when the ledger is built.

A page states a lab claim as a fact only through an entry whose ``asserted`` is true; ``check``
fails the build when such an entry is not confirmed, so a sentence whose evidence no longer holds
stops the site instead of standing on it.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab.run import TASK_DEFAULTS, TASK_SEEDS
from lab.summary import METRIC

ROOT = Path(__file__).resolve().parents[2]
FULL = ROOT / "lab" / "results" / "full"
TWICE = ROOT / "lab" / "results" / "twice"
ALPHA = 0.05
LENGTH_TASKS = ("markov", "retrieval")
"""The tasks whose past-L claims are checked on twice the budget."""

__all__ = ["Entry", "Value", "Less", "Below", "Above", "Fact", "LedgerError", "ALPHA", "student_sf", "welch", "paired",
           "one_sample", "holm", "seed_values", "build", "entries", "entry", "check", "href", "table", "unconfirmed",
           "write_json", "mark", "either",
           "FULL", "TWICE", "TASK_SEEDS"]


class LedgerError(AssertionError):
    """A page's statement is not borne out by its ledger entry (or names none)."""


# ----------------------------------------------------------------------------- the tests

def student_sf(t: float, df: float) -> float:
    """``P(T > t)`` for Student's t with ``df`` degrees of freedom: ``I_x(df/2, 1/2) / 2`` with
    ``x = df / (df + t^2)`` for ``t >= 0`` (the regularized incomplete beta, ``mpmath.betainc``)."""
    import mpmath                                                      # SymPy's own dependency
    if math.isinf(t):
        return 0.0 if t > 0 else 1.0
    tail = float(mpmath.betainc(df / 2, 0.5, 0, df / (df + t * t), regularized=True)) / 2
    return tail if t >= 0 else 1.0 - tail


def _mean_var(values):
    n = len(values)
    mean = sum(values) / n
    return mean, (sum((v - mean) ** 2 for v in values) / (n - 1) if n > 1 else 0.0), n


def _p(diff: float, se2: float, df: float) -> tuple[float, float]:
    """``(t, p)`` of the one-sided test that a difference ``diff`` with squared standard error ``se2``
    is above 0; a difference without spread is certain either way."""
    if se2 == 0.0:
        return (math.inf, 0.0) if diff > 0 else (-math.inf if diff < 0 else 0.0, 1.0)
    t = diff / math.sqrt(se2)
    return t, student_sf(t, df)


def welch(smaller, larger) -> dict:
    """Welch's t-test, one-sided: is the mean of ``larger`` above the mean of ``smaller`` (two independent
    samples)? ``{"t", "df", "p"}`` with the Welch-Satterthwaite degrees of freedom."""
    (ma, va, na), (mb, vb, nb) = _mean_var(smaller), _mean_var(larger)
    if na < 2 or nb < 2:
        raise LedgerError(f"Welch's test needs two values a side, got {na} and {nb}")
    sa, sb = va / na, vb / nb
    df = (sa + sb) ** 2 / ((sa * sa / (na - 1) if sa else 0.0) + (sb * sb / (nb - 1) if sb else 0.0) or 1.0)
    t, p = _p(mb - ma, sa + sb, df)
    return {"t": t, "df": df, "p": p}


def paired(smaller, larger) -> dict:
    """The paired t-test, one-sided: is ``larger - smaller`` above 0 on average (same units, in order)?"""
    if len(smaller) != len(larger) or len(smaller) < 2:
        raise LedgerError(f"the paired test needs two or more pairs, got {len(smaller)} and {len(larger)}")
    m, v, n = _mean_var([b - a for a, b in zip(smaller, larger)])
    t, p = _p(m, v / n, n - 1)
    return {"t": t, "df": n - 1, "p": p}


def one_sample(values, threshold: float, below: bool = True) -> dict:
    """The one-sample t-test, one-sided: is the mean of ``values`` below (or, ``below=False``, above)
    ``threshold``?"""
    m, v, n = _mean_var(values)
    if n < 2:
        raise LedgerError(f"the one-sample test needs two or more values, got {n}")
    t, p = _p(threshold - m if below else m - threshold, v / n, n - 1)
    return {"t": t, "df": n - 1, "p": p}


def holm(pvalues) -> list[float]:
    """Holm's step-down adjustment (Holm 1979): the i-th smallest of m p-values becomes
    ``max over j <= i of min(1, (m - j + 1) p_(j))``; a hypothesis is rejected at ``alpha`` when its
    adjusted p is below ``alpha``, which keeps the family-wise error rate at ``alpha``."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    m, out, running = len(pvalues), [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        out[i] = running
    return out


# ----------------------------------------------------------------------------- the records

def _record(task: str, scheme: str, seed: int, where: Path):
    """The record, or None when it is not written yet at the current schema (an earlier protocol's record
    is not evidence for this one)."""
    path = where / f"{task}-{scheme}-s{seed}.json"
    if not path.is_file():
        return None
    rec = _read(str(path))
    return rec if rec.get("schema") == "minipos-lab/3" else None


@functools.lru_cache(maxsize=None)
def _read(path: str) -> dict:
    return json.loads(Path(path).read_text(encoding="utf-8"))


def _split(row: str) -> tuple[str, str]:
    """``"rope +yarn"`` -> ``("rope", "yarn")``; ``"t5@source"`` -> ``("t5@source", "base")``."""
    name, _, variant = row.partition(" +")
    return name, variant or "base"


@dataclass(frozen=True)
class Value:
    """Where a metric is read: a task, a row (``"rope"``, ``"rope +yarn"``, ``"t5@source"``), a length
    and, for retrieval, an offset (``None``: the accuracy over every offset at that length)."""

    task: str
    row: str
    length: int
    offset: int | None = None

    def __str__(self) -> str:
        where = f"{self.task}/{self.row}/{self.length}"
        return where + (f"/offset {self.offset}" if self.offset is not None else "")


def _metric(rec: dict, v: Value):
    """The value ``v`` names in one record, or None where the scheme cannot run there."""
    _, variant = _split(v.row)
    entries = [e for e in rec["results"][variant]["lengths"] if e["length"] == v.length]
    if not entries:
        raise LedgerError(f"{v}: the record has no length {v.length}")
    e = entries[0]
    if e["status"] != "ok":
        return None
    if v.offset is None:
        return e[METRIC[v.task]]
    cells = [c for c in e["offsets"] if c["offset"] == v.offset]
    if not cells:
        raise LedgerError(f"{v}: no offset {v.offset} (offsets: {[c['offset'] for c in e['offsets']]})")
    return cells[0]["accuracy"]


def seed_values(v: Value, where: Path | None = None, seeds=None) -> list | None:
    """The metric of ``v`` for each seed (default: its task's ``TASK_SEEDS``) in ``where`` (default ``FULL``;
    None when any record is missing), each None where the scheme cannot run."""
    where = FULL if where is None else where
    seeds = TASK_SEEDS[v.task] if seeds is None else seeds
    scheme, _ = _split(v.row)
    out = []
    for s in seeds:
        rec = _record(v.task, scheme, s, where)
        if rec is None:
            return None
        out.append(_metric(rec, v))
    return out


def complete(v: Value, where: Path | None = None) -> bool:
    """Whether every seed of ``v``'s row is recorded at schema 3 and trained its task's whole fixed budget."""
    where = FULL if where is None else where
    scheme, _ = _split(v.row)
    budget = TASK_DEFAULTS[v.task]["steps"]
    for s in TASK_SEEDS[v.task]:
        rec = _record(v.task, scheme, s, where)
        if rec is None or rec["schema"] != "minipos-lab/3":
            return False
        st = rec["settings"]
        if st["schedule"] != "budget" or st["steps"] != budget:
            return False
        if rec["train"]["steps"] != budget + math.ceil(st["cooldown"] * budget):
            return False
    return True


# ----------------------------------------------------------------------------- entries

@dataclass
class Entry:
    """One claim of the site (see the module docstring)."""

    id: str
    page: str
    claim: str
    kind: str                      # lab | seed | cite | proof
    verdict: str = ""
    evidence: str = ""
    records: list = field(default_factory=list)
    test: str = ""
    p: float | None = None
    p_holm: float | None = None
    asserted: bool = False         # the page states it as a fact: the build fails unless it is confirmed
    numbers: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        out = asdict(self)
        for key in ("p", "p_holm"):
            if out[key] is not None and not math.isfinite(out[key]):
                out[key] = None
        return out


@dataclass(frozen=True)
class Less:
    """A lab claim: the metric at ``smaller`` is below the metric at ``larger``."""

    id: str
    page: str
    claim: str
    smaller: Value
    larger: Value
    asserted: bool = False

    def values(self):
        return (self.smaller, self.larger)


@dataclass(frozen=True)
class Below:
    """A lab claim: the metric at ``value`` is below ``threshold`` (``Above``: above it)."""

    id: str
    page: str
    claim: str
    value: Value
    threshold: float
    asserted: bool = False
    below = True

    def values(self):
        return (self.value,)


@dataclass(frozen=True)
class Above(Below):
    below = False


@dataclass(frozen=True)
class Fact:
    """A lab claim that no sampling can move, checked by reading the records: ``check(records)`` gets
    ``{str(value): per-seed values}`` for ``values`` (each None where a record is missing, each value None
    where the scheme cannot run) and returns whether the claim holds. "A learned table of L rows cannot
    run at 2L" is one; an ordering of two noisy numbers is not (``Less``)."""

    id: str
    page: str
    claim: str
    values_: tuple
    check: object
    asserted: bool = False

    def values(self):
        return self.values_


def _fmt(values) -> str:
    if values is None:
        return "not yet measured"
    if any(x is None for x in values):
        return "cannot run"
    return "[" + ", ".join(f"{x:.4g}" for x in values) + "]"


def _lab_entry(c) -> Entry:
    """The test of one lab claim, before the Holm adjustment."""
    e = Entry(c.id, c.page, c.claim, "lab", asserted=c.asserted)
    e.records = sorted({f"lab/results/full/{v.task}-{_split(v.row)[0]}-s{s}.json" for v in c.values()
                        for s in TASK_SEEDS[v.task]})
    got = [seed_values(v) for v in c.values()]
    e.numbers = {str(v): vals for v, vals in zip(c.values(), got)}
    if isinstance(c, Fact):
        e.test = "read from the records (no sampling can change it)"
        if any(g is None for g in got):
            e.verdict, e.evidence = "not yet measured", "the records are not all written yet"
        else:
            e.verdict = "confirmed" if c.check(e.numbers) else "refuted"
            e.evidence = "; ".join(f"{k}: {_fmt(v)}" for k, v in e.numbers.items())
        return e
    if any(g is None for g in got):
        e.verdict, e.evidence = "not yet measured", "the records are not all written yet"
        return e
    if any(x is None for g in got for x in g):
        e.verdict, e.evidence = "not resolved", "a scheme cannot run at one of these lengths"
        return e
    if isinstance(c, Less):
        a, b = got
        same = c.smaller.task == c.larger.task and _split(c.smaller.row)[0] == _split(c.larger.row)[0]
        result = paired(a, b) if same else welch(a, b)
        e.test = ("paired t-test over seeds, one-sided" if same else "Welch's t-test over seeds, one-sided") + \
            f" (t = {result['t']:.3g}, df = {result['df']:.3g})"
        e.evidence = f"{c.smaller}: {_fmt(a)} below {c.larger}: {_fmt(b)} (per seed)"
    else:
        (a,) = got
        result = one_sample(a, c.threshold, below=c.below)
        e.test = f"one-sample t-test over seeds against {c.threshold:g}, one-sided (t = {result['t']:.3g}, " \
                 f"df = {result['df']:.3g})"
        e.evidence = f"{c.value}: {_fmt(a)} {'below' if c.below else 'above'} {c.threshold:g} (per seed)"
    e.p = result["p"]
    e.numbers["complete"] = all(complete(v) for v in c.values())
    e.numbers["twice"] = _twice(c)
    return e


def _twice(c):
    """Seed 0 on twice the budget, for a claim past L on a synthetic task: ``{"values", "agrees"}``, or
    None where the check does not apply (``LENGTH_TASKS``, a length past L)."""
    vals = c.values()
    if not any(v.task in LENGTH_TASKS and v.length > _train_length(v) for v in vals):
        return None
    budget = [seed_values(v, FULL, (0,)) for v in vals]     # module globals, read at call time
    twice = [seed_values(v, TWICE, (0,)) for v in vals]
    if any(t is None or t[0] is None for t in twice) or any(b is None or b[0] is None for b in budget):
        return {"values": None, "agrees": None}
    b, t = [x[0] for x in budget], [x[0] for x in twice]
    if isinstance(c, Less):
        agrees = (b[0] < b[1]) == (t[0] < t[1])
    else:
        agrees = (t[0] < c.threshold) if c.below else (t[0] > c.threshold)
    return {"values": {"budget": b, "twice": t}, "agrees": bool(agrees)}


def _train_length(v: Value) -> int:
    scheme, _ = _split(v.row)
    rec = _record(v.task, scheme, 0, FULL)
    return rec["settings"]["length"] if rec else 64


def _verdicts(lab: list[Entry]) -> None:
    tested = [e for e in lab if e.p is not None]
    for e, q in zip(tested, holm([e.p for e in tested])):
        e.p_holm = q
        twice = e.numbers.get("twice")
        if not e.numbers.get("complete"):
            e.verdict = "not resolved"
            e.evidence += "; the records are not all at the fixed budget"
        elif q >= ALPHA:
            e.verdict = "not resolved"
        elif twice is not None and twice["agrees"] is None:
            e.verdict = "not resolved"
            e.evidence += "; seed 0 on twice the budget is not recorded yet"
        elif twice is not None and not twice["agrees"]:
            e.verdict = "moves with training"
            e.evidence += f"; on twice the budget seed 0 gives {twice['values']['twice']} against " \
                          f"{twice['values']['budget']}"
        else:
            e.verdict = "confirmed"


@functools.lru_cache(maxsize=None)
def build() -> dict:
    """Every entry of the ledger by id: the lab claims tested and Holm-adjusted together, then the
    article's statements, the citations and the theorems (``docs.hooks.claims``)."""
    from . import claims
    lab = [_lab_entry(c) for c in claims.LAB]
    _verdicts(lab)
    out = {}
    for e in lab + claims.other_entries({e.id: e for e in lab}):
        if e.id in out:
            raise LedgerError(f"the ledger has the id {e.id} twice")
        out[e.id] = e
    return out


def entries(page: str | None = None) -> list[Entry]:
    return [e for e in build().values() if page is None or e.page == page]


def entry(id: str) -> Entry:
    led = build()
    if id not in led:
        raise LedgerError(f"the ledger has no entry {id!r}")
    return led[id]


def check(page: str) -> None:
    """Fail (``LedgerError``) when an entry that ``page`` asserts is not confirmed."""
    bad = [e for e in entries(page) if e.asserted and e.verdict != "confirmed"]
    if bad:
        raise LedgerError("; ".join(f"{e.id} ({e.claim}): {e.verdict}, p_holm = {e.p_holm}" for e in bad))


def href(id: str, page: str) -> str:
    """The URL of entry ``id`` on the ledger page, relative to the built ``page`` (``"extrapolation.md"``,
    ``"schemes/alibi.md"``): markdown printed by a code block is not rewritten by mkdocs, so a link in it
    must be the built site's (directory URLs)."""
    from .links import site_url
    entry(id)
    return site_url(page, "claims", id.lower())


def mark(id: str, page: str) -> str:
    """The inline mark a sentence of ``page`` carries for the entry ``id`` it rests on: its verdict and,
    for a tested claim, the Holm-adjusted p, linked to the ledger (``[M10: confirmed, Holm p = 0.004](...)``).
    """
    e = entry(id)
    p = "" if e.p_holm is None else f", Holm p = {e.p_holm:.2g}"
    return f"([{id}: {e.verdict}{p}]({href(id, page)}))"


def either(id: str, page: str, holds: str, otherwise: str) -> str:
    """A page's sentence that rests on the lab entry ``id``: ``holds`` when the entry is confirmed, else
    ``otherwise`` (which states both numbers and draws no ordering), each followed by its ``mark``. A page
    draws an ordering this way, so that what it states follows the ledger's verdict instead of the build
    failing when more records move a p-value; an entry the page must state as a fact is ``asserted``
    instead (``check``)."""
    text = holds if entry(id).verdict == "confirmed" else otherwise
    return f"{text} {mark(id, page)}"


def table(page: str, kinds=("lab",), ids=None) -> str:
    """A markdown table of the entries of ``page`` (of ``kinds``, or exactly ``ids``): id, claim, verdict,
    the test and its p-values, linked to the ledger."""
    rows = [entry(i) for i in ids] if ids is not None else [e for e in entries(page) if e.kind in kinds]
    out = ["| | claim | verdict | per seed | test | p | p (Holm) |", "|---|---|---|---|---|---|---|"]
    for e in rows:
        p = "" if e.p is None else f"{e.p:.2g}"
        q = "" if e.p_holm is None else f"{e.p_holm:.2g}"
        nums = "; ".join(f"{k}: {_fmt(v)}" for k, v in e.numbers.items() if "/" in k)
        out.append(f"| [{e.id}]({href(e.id, page)}) | {e.claim} | **{e.verdict}** | {nums} | "
                   f"{e.test.split(' (')[0]} | {p} | {q} |")
    return "\n".join(out)


def unconfirmed() -> list[Entry]:
    """The asserted entries that are not confirmed: each a sentence of the site its evidence does not bear
    (an entry whose records are not written yet is left out: its page does not print the sentence yet)."""
    return [e for e in build().values() if e.asserted and e.verdict not in ("confirmed", "not yet measured")]


def write_json(path) -> Path:
    """``claims.json``: every entry, in order, through a temp file and a rename."""
    from lab.record import write_json as atomic
    return atomic(path, {"schema": "minipos-claims/1", "alpha": ALPHA,
                         "entries": [e.to_json() for e in build().values()]})
