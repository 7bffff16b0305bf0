"""The lab numbers the pages state, read from the committed records in one place.

Every page that quotes a measurement of ``lab/results/full`` reads it through this module
(``from docs.hooks.evidence import ...`` inside an ``exec`` block; the build runs from the
repository root; ``where=TEXT_12000`` reads the text records trained twice as long instead), and
every claim a page makes about the records is a ``claim(...)`` that raises ``EvidenceError`` when
the records no longer bear it out. markdown-exec turns the exception into a warning and ``mkdocs
build --strict`` into a failed build, so a number or a verdict that drifts stops the site instead of
standing on it.

What the records hold (``lab/results/full/summary.json`` and one ``<task>-<scheme>-s<seed>.json``
per run): per task, rows keyed by the row name (``"rope"``, ``"rope +yarn"``, ``"t5@source"``),
each with ``lengths`` (loss above the floor for ``markov``, accuracy for ``retrieval``, held-out loss
for ``text``) and, for retrieval, ``offsets``; every cell is ``{"mean", "sd", "n", ...}`` or
``"cannot run"``. A cell's standard error is its ``"se"`` when the summary has one, otherwise
``sd / sqrt(n)``. Records of schema ``minipos-lab/2`` also say, per row, on how many seeds the
training ``converged`` (or trained a ``fixed`` budget by design, as text does) and the model
``learned`` its task at L; a row whose every seed did both is *usable*, and only usable rows can be
ordered (``ordered``): a run that did not converge, or a model that did not learn the task, says
nothing about length. Older records (schema 1) do not say,
and their rows are not usable.
"""

from __future__ import annotations

import functools
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from lab.run import TASK_SEEDS
from lab.summary import METRIC
from minipos import safe_io

FULL = Path(__file__).resolve().parents[2] / "lab" / "results" / "full"
TEXT_12000 = FULL.parent / "text-12000"
"""The text records trained twice the protocol's budget (12000 steps and a 2400-step cool-down), with
the protocol's seeds: what longer training changes (``paired_change``)."""

__all__ = ["EvidenceError", "Cell", "summary", "record", "cell", "offset_cell", "offsets", "entropy",
           "floor", "setting", "lengths", "train_length", "far_offset", "chance", "seeds",
           "attention_distance", "position_excess", "position_loss", "position_change", "paired_change", "claim",
           "usable", "resolved", "ordered", "seen", "spread", "recorded", "not_yet_measured", "FULL", "TEXT_12000"]


class EvidenceError(AssertionError):
    """A page's statement about the lab records does not hold for the committed records."""


@dataclass(frozen=True)
class Cell:
    """One summary cell: the mean over seeds, its standard error and the number of seeds."""

    mean: float
    se: float
    n: int
    usable: bool = False
    """Whether every seed of the row converged and learned its task (schema 2); see ``usable``."""
    where: str = ""

    def __post_init__(self):
        for name in ("mean", "se"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise ValueError(f"Cell.{name} must be a finite number, got {value!r}")
        if self.se < 0:
            raise ValueError(f"Cell.se must be >= 0, got {self.se!r}")
        if isinstance(self.n, bool) or not isinstance(self.n, int) or self.n < 1:
            raise ValueError(f"Cell.n must be an integer >= 1 (seeds), got {self.n!r}")

    def __format__(self, spec: str) -> str:
        """``f"{c:.3f}"`` gives ``0.056 ± 0.004``; ``f"{c:.0%}"`` gives ``100% ± 0%``."""
        spec = spec or ".3f"
        return f"{format(self.mean, spec)} ± {format(self.se, spec)}"


def _where(where, name: str = "where") -> Path:
    """``where``, a ``Path``, or ``TypeError`` naming ``name`` (a str would miss the readers' cache)."""
    if isinstance(where, Path):
        return where
    raise TypeError(f"{name} must be a pathlib.Path (a directory of lab records), got {type(where).__name__} {where!r}")


def _read(path: Path):
    """The strict JSON document at ``path`` through ``safe_io`` (a regular file within the size and nesting
    caps), every refusal an ``EvidenceError`` naming the file."""
    try:
        return safe_io.read_json(path)
    except FileNotFoundError:
        raise EvidenceError(f"{path} is missing: the pages read the lab's committed records") from None
    except (safe_io.FileError, OSError) as error:
        raise EvidenceError(f"{path}: cannot be read: {getattr(error, 'reason', None) or error}") from None


@functools.lru_cache(maxsize=None)
def summary(where: Path = FULL) -> dict:
    """The ``summary.json`` of the records in ``where`` (default the protocol's, ``FULL``; raises
    ``EvidenceError`` if it is missing, unreadable or not a summary: an object of tasks, each with its
    ``rows``)."""
    path = _where(where) / "summary.json"
    doc = _read(path)
    if not isinstance(doc, dict):
        raise EvidenceError(f"{path}: a summary is an object of tasks, got {type(doc).__name__}")
    for task, value in doc.items():
        if not isinstance(value, dict) or not isinstance(value.get("rows"), dict):
            raise EvidenceError(f"{path}: task {task!r} must be an object with an object of rows")
    return doc


_NAME = re.compile(r"[a-z0-9][a-z0-9_@.-]*")


@functools.lru_cache(maxsize=None)
def record(task: str, scheme: str, seed: int = 0, where: Path = FULL) -> dict:
    """One run's record, ``<task>-<scheme>-s<seed>.json`` in ``where`` (an object; ``EvidenceError`` if it
    is missing or unreadable)."""
    for name, value in (("task", task), ("scheme", scheme)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__} {value!r}")
        if not _NAME.fullmatch(value) or ".." in value:
            raise ValueError(f"{name} must be a run's name (lowercase letters, digits, '_', '-', '@'), got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__} {seed!r}")
    if seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    path = _where(where) / f"{task}-{scheme}-s{seed}.json"
    doc = _read(path)
    if not isinstance(doc, dict):
        raise EvidenceError(f"{path}: a record is an object, got {type(doc).__name__}")
    return doc


def _row(task: str, row: str, where: Path = FULL) -> dict:
    for name, value in (("task", task), ("row", row)):
        if not isinstance(value, str):
            raise TypeError(f"{name} must be a str, got {type(value).__name__} {value!r}")
    doc = summary(where)
    if task not in doc:
        raise EvidenceError(f"the summary has no task {task!r} (tasks: {', '.join(doc)})")
    rows = doc[task]["rows"]
    if row not in rows:
        raise EvidenceError(f"the {task} summary has no row {row!r} (rows: {', '.join(rows)})")
    if not isinstance(rows[row], dict):
        raise EvidenceError(f"{task}/{row}: a row is an object, got {type(rows[row]).__name__}")
    return rows[row]


def _count(r: dict, key: str, where: str) -> int:
    value = r.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise EvidenceError(f"{where}: {key} must be a count of seeds (an integer >= 0), got {value!r}")
    return value


def recorded(names, where: Path = FULL) -> list:
    """The rows among ``names`` that every task of the summary in ``where`` has, in order: a scheme the
    registry puts in the protocol (``lab=True``) before the lab has run it has none yet, and a page
    lists it as not yet measured (``not_yet_measured``) instead of failing on its missing row."""
    if isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise TypeError(f"names must be a list of row names, got {names!r}")
    tasks = summary(where).values()
    return [n for n in names if all(n in t.get("rows", {}) for t in tasks)]


def not_yet_measured(names, where: Path = FULL) -> list:
    """The rows among ``names`` that some task of the summary in ``where`` lacks (see ``recorded``)."""
    have = set(recorded(names, where))
    return [n for n in names if n not in have]


def usable(task: str, row: str, where: Path = FULL) -> bool:
    """Whether every seed of ``row`` converged and learned ``task`` at L (schema-2 records say; older
    records do not, and their rows are not usable)."""
    r = _row(task, row, where)
    n = len(seeds(task, row, where))
    if "converged" not in r or "learned" not in r:
        return False
    counts = [_count(r, k, f"{task}/{row}") for k in ("converged", "fixed", "learned")]
    return n > 0 and counts[0] + counts[1] == n and counts[2] == n


def _cell(raw, where: str, ok: bool = False) -> Cell | None:
    if raw == "cannot run":
        return None
    if not isinstance(raw, dict) or "mean" not in raw:
        raise EvidenceError(f"{where}: expected a cell with a mean, got {raw!r}")
    n = raw.get("n")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise EvidenceError(f"{where}: expected a cell over n >= 1 seeds, got n = {n!r}")
    if "se" in raw:
        se = _finite(raw["se"], where + " se")
    elif n > 1 and "sd" in raw:
        se = _finite(raw["sd"], where + " sd") / math.sqrt(n)
    else:
        raise EvidenceError(f"{where}: a cell of {n} seed(s) without a standard error")
    if se < 0:
        raise EvidenceError(f"{where}: a standard error (se, or sd) must be >= 0, got {raw.get('se', raw.get('sd'))!r}")
    return Cell(_finite(raw["mean"], where + " mean"), se, n, ok, where)


def cell(task: str, row: str, length: int, where: Path = FULL) -> Cell | None:
    """Loss above the floor (``markov``), accuracy (``retrieval``) or held-out loss (``text``) of ``row``
    at ``length``, from the records in ``where``; ``None`` where the scheme cannot run there."""
    _length(length)
    cells = _row(task, row, where)["lengths"]
    if not isinstance(cells, dict):
        raise EvidenceError(f"{task}/{row}: lengths must be an object of length -> cell, got {cells!r}")
    if str(length) not in cells:
        raise EvidenceError(f"{task}/{row} has no length {length} (lengths: {', '.join(cells)})")
    return _cell(cells[str(length)], f"{task}/{row}/{length}", usable(task, row, where))


def _length(length, name: str = "length") -> int:
    if isinstance(length, bool) or not isinstance(length, int):
        raise TypeError(f"{name} must be an int (tokens), got {type(length).__name__} {length!r}")
    return length


def offsets(row: str, length: int) -> dict[int, Cell]:
    """Retrieval accuracy of ``row`` at ``length`` by offset (write block to read block)."""
    by = _row("retrieval", row).get("offsets", {}).get(str(length))
    if by is None:
        raise EvidenceError(f"retrieval/{row} has no offsets at length {length}")
    ok = usable("retrieval", row)
    return {int(o): _cell(v, f"retrieval/{row}/{length}/{o}", ok) for o, v in by.items()}


def offset_cell(row: str, length: int, offset: int) -> Cell:
    """Retrieval accuracy of ``row`` at ``length`` for one ``offset``."""
    by = offsets(row, length)
    if offset not in by:
        raise EvidenceError(f"retrieval/{row}/{length} has no offset {offset} (offsets: {sorted(by)})")
    return by[offset]


def entropy(task: str, row: str, length: int) -> Cell:
    """Mean attention entropy (nats, over layers and heads) of ``row`` at ``length``."""
    by = _row(task, row).get("attention_entropy", {})
    if str(length) not in by:
        raise EvidenceError(f"{task}/{row} has no attention entropy at {length}")
    return _cell(by[str(length)], f"{task}/{row}/entropy/{length}", usable(task, row))


def spread(task: str, row: str, length: int) -> Cell:
    """Mean attended distance ``i - j`` (tokens, over layers, heads and seeds) of ``row`` at ``length``."""
    by = _row(task, row).get("attention_distance", {})
    if str(length) not in by:
        raise EvidenceError(f"{task}/{row} has no attention distance at {length}")
    return _cell(by[str(length)], f"{task}/{row}/distance/{length}", usable(task, row))


def seen(length: int, offset: int | None = None, row: str = "rope") -> bool:
    """Whether evaluation ``length`` (or retrieval ``offset`` at ``length``) was within what training
    showed: lengths up to L; offsets as the records mark them (``seen_in_training``)."""
    if offset is None:
        return length <= train_length()
    by = _row("retrieval", row).get("seen", {}).get(str(length))
    if by is None or str(offset) not in by:
        raise EvidenceError(f"retrieval/{row} does not mark offset {offset} at length {length} as seen or not")
    return bool(by[str(offset)])


def seeds(task: str, row: str, where: Path = FULL) -> list[int]:
    """The seeds of ``row``'s records: distinct integers >= 0 (``EvidenceError`` otherwise)."""
    got = _row(task, row, where).get("seeds")
    if not isinstance(got, list) or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in got):
        raise EvidenceError(f"{task}/{row}: seeds must be a list of integers >= 0, got {got!r}")
    if len(set(got)) != len(got):
        raise EvidenceError(f"{task}/{row}: a seed is listed twice in {got} (each seed is one run)")
    return list(got)


def floor() -> dict:
    """The Markov source's entropies in nats: ``entropy_rate`` (the floor), ``order1`` (predicting from
    the previous symbol only) and ``unigram`` (from nothing)."""
    return dict(record("markov", "rope")["floor"])


def setting(name: str, task: str = "markov"):
    """One training setting of the runs (``length``, ``d_model``, ``steps``, ``values``...)."""
    s = record(task, "rope")["settings"]
    if name not in s:
        raise EvidenceError(f"the {task} records have no setting {name!r}")
    return s[name]


def train_length() -> int:
    return int(setting("length"))


def lengths() -> list[int]:
    """The evaluated lengths, ``L`` first."""
    return sorted(int(n) for n in _row("markov", "rope")["lengths"])


def far_offset(length: int | None = None) -> int:
    """The farthest retrieval offset at ``length`` (default the longest length)."""
    return max(offsets("rope", length or lengths()[-1]))


def chance() -> float:
    """Retrieval accuracy of a guess: ``1 / values``."""
    return 1.0 / setting("values", "retrieval")


def attention_distance(task: str, scheme: str, length: int) -> list[list[float]]:
    """Mean attended distance ``i - j`` (tokens) of each head of ``scheme``'s base model at ``length``,
    ``[layer][head]``, averaged over the seeds' records. A head attending uniformly under the causal
    mask averages ``(length - 1) / 4``."""
    per_seed = []
    for s in seeds(task, scheme):
        rows = [r for r in record(task, scheme, s)["results"]["base"]["lengths"] if r["length"] == length]
        if not rows or not (rows[0].get("attention") or {}).get("distance"):
            raise EvidenceError(f"{task}-{scheme}-s{s}: no attention distance at length {length}")
        per_seed.append(rows[0]["attention"]["distance"])
    return [[sum(p[layer][h] for p in per_seed) / len(per_seed) for h in range(len(per_seed[0][layer]))]
            for layer in range(len(per_seed[0]))]


def _position_seeds(task: str, scheme: str, length: int, variant: str = "base") -> tuple[list[int], list[list[float]]]:
    """The bin edges of ``scheme``'s per-position losses at ``length``, and per seed the loss in each bin
    less the bin's floor (the task's floor where it has one, as Markov does; text has none)."""
    per_seed, edges = [], None
    row = scheme if variant == "base" else f"{scheme} +{variant}"
    for s in seeds(task, row):
        rows = [r for r in record(task, scheme, s)["results"][variant]["lengths"] if r["length"] == length]
        if not rows or not rows[0].get("positions"):
            raise EvidenceError(f"{task}-{scheme}-s{s}: no per-position loss at length {length}")
        pos = rows[0]["positions"]
        edges = pos["edges"]
        floor = pos["floor"] or [0.0] * len(pos["loss"])
        per_seed.append([a - b for a, b in zip(pos["loss"], floor)])
    return edges, per_seed


def position_excess(scheme: str, length: int, variant: str = "base") -> list[tuple[int, int, float]]:
    """Markov loss above the per-position floor of ``scheme`` at ``length``, by position bin:
    ``[(start, end, excess)]``, the excess averaged over the seeds' records."""
    return position_loss("markov", scheme, length, variant)


def position_loss(task: str, scheme: str, length: int, variant: str = "base") -> list[tuple[int, int, float]]:
    """``scheme``'s loss at ``length`` by position bin, ``[(start, end, loss)]``, averaged over the seeds'
    records: above the per-position floor on Markov (``position_excess``), the held-out loss on text."""
    edges, per_seed = _position_seeds(task, scheme, length, variant)
    return [(edges[b], edges[b + 1], sum(p[b] for p in per_seed) / len(per_seed)) for b in range(len(edges) - 1)]


def position_change(task: str, scheme: str, length: int, before: tuple[int, int], after: tuple[int, int]) -> Cell:
    """How much ``scheme``'s mean loss over the positions ``after`` (``(start, end)``) exceeds its mean loss
    over the positions ``before``, at ``length``: per seed on that seed's own evaluation sequences (so
    the comparison is paired), as a ``Cell`` over the seeds. The records keep no per-position evaluation
    error, so ``se`` is the seeds' spread, ``sd / sqrt(n)``; each seed draws its own sequences, so the
    spread holds their sampling noise as well as the seeds'. On text, where a window of the corpus
    starts at a random byte, a model that reads a fixed number of tokens back has the same loss at every
    position past that number: a change past L is what the extra context did."""
    for name, span in (("before", before), ("after", after)):
        if not (isinstance(span, tuple) and len(span) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                   for v in span)):
            raise TypeError(f"{name} must be a (start, end) pair of ints, got {span!r}")
    edges, per_seed = _position_seeds(task, scheme, length)

    def mean(p, span):
        a, b = span
        bins = [i for i in range(len(edges) - 1) if a <= edges[i] and edges[i + 1] <= b]
        if a not in edges or b not in edges or not bins:
            raise EvidenceError(f"{task}/{scheme}/{length}: positions {a} to {b} are not whole bins "
                                f"(edges every {edges[1] - edges[0]})")
        return sum(p[i] for i in bins) / len(bins)

    values = [mean(p, after) - mean(p, before) for p in per_seed]
    n = len(values)
    m = sum(values) / n
    if n < 2:
        raise EvidenceError(f"{task}/{scheme}/{length}: a change over {n} seed has no spread to give its standard error")
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    return Cell(m, sd / math.sqrt(n), n, usable(task, scheme),
                f"{task}/{scheme}/{length}/positions {after[0]}-{after[1]} less {before[0]}-{before[1]}")


def paired_change(task: str, scheme: str, length: int, before: Path, after: Path) -> Cell:
    """How much ``scheme``'s base model at ``length`` changed from the records in ``before`` to those in
    ``after`` (``METRIC``: ``after`` less ``before``), per seed and then as a ``Cell`` over the seeds: the
    two sets must hold the same seeds. A seed's two runs share their initialisation and evaluation
    sequences (both are seeded by the seed alone), so the difference is paired and ``se`` is the spread
    of the differences, ``sd / sqrt(n)``. ``None`` where the scheme cannot run at ``length``."""
    before, after = _where(before, "before"), _where(after, "after")
    ours = seeds(task, scheme, before)
    if seeds(task, scheme, after) != ours:
        raise EvidenceError(f"{task}/{scheme}: {before.name} has seeds {ours}, {after.name} "
                            f"{seeds(task, scheme, after)}; a paired change needs the same")

    def value(where, s):
        rows = [r for r in record(task, scheme, s, where)["results"]["base"]["lengths"] if r["length"] == length]
        if not rows:
            raise EvidenceError(f"{where.name}/{task}-{scheme}-s{s}: no evaluation at length {length}")
        return rows[0][METRIC[task]] if rows[0]["status"] == "ok" else None      # the summary's metric

    pairs = [(value(before, s), value(after, s)) for s in ours]
    if any(a is None or b is None for a, b in pairs):
        return None
    values = [b - a for a, b in pairs]
    n = len(values)
    m = sum(values) / n
    if n < 2:
        raise EvidenceError(f"{task}/{scheme}/{length}: a change over {n} seed has no spread to give its standard error")
    sd = math.sqrt(sum((v - m) ** 2 for v in values) / (n - 1))
    return Cell(m, sd / math.sqrt(n), n, usable(task, scheme, before) and usable(task, scheme, after),
                f"{task}/{scheme}/{length}: {after.name} less {before.name}")


def resolved(smaller: Cell, larger: Cell) -> bool:
    """Whether ``smaller.mean < larger.mean`` by more than twice the difference's standard error,
    ``2 * sqrt(se_a**2 + se_b**2)``."""
    return larger.mean - smaller.mean > 2.0 * math.hypot(smaller.se, larger.se)


def ordered(smaller: Cell, larger: Cell, statement: str) -> None:
    """Fail the build unless ``smaller`` is below ``larger`` by more than twice the standard error of
    the difference, and both come from usable rows (every seed converged and learned its task).

    Every "lower than", "better than" or ranking on a page goes through here: an ordering the
    records cannot resolve, or one drawn from a run that did not converge, stops the site."""
    for c in (smaller, larger):
        if c is None:
            raise EvidenceError(f"cannot order a scheme that cannot run: {statement}")
        if not isinstance(c, Cell):
            raise TypeError(f"ordered compares two Cells (or None), got {type(c).__name__} {c!r}: {statement}")
        if not c.usable:
            raise EvidenceError(f"{c.where or 'a cell'} comes from runs that did not all converge and learn "
                                f"the task; no ordering is drawn from it: {statement}")
    if not resolved(smaller, larger):
        raise EvidenceError(f"not resolved ({smaller:.4f} against {larger:.4f}; the difference must exceed "
                            f"twice its standard error): {statement}")


def claim(holds: bool, statement: str) -> None:
    """Fail the build with ``statement`` unless the records bear it out."""
    if not isinstance(holds, (bool, np.bool_)):
        raise TypeError(f"holds must be a bool (the statement checked), got {type(holds).__name__} {holds!r}: {statement}")
    if not holds:
        raise EvidenceError(f"the lab records no longer support: {statement}")


# ----------------------------------------------------------------------------- schema 3: fixed budgets

TWICE = FULL.parent / "twice"
"""Seed 0 of every scheme of Markov and retrieval trained on twice the budget: the doubling check."""


def present(task: str, names, where: Path = FULL, seeds=None) -> list:
    """The rows among ``names`` whose every seed (default: the task's ``TASK_SEEDS``) has a record of
    ``task`` in ``where`` at schema 3."""
    if seeds is None:
        if task not in TASK_SEEDS:
            raise EvidenceError(f"task must be one of {', '.join(TASK_SEEDS)}, got {task!r}")
        seeds = TASK_SEEDS[task]
    out = []
    for n in names:
        scheme = n.partition(" +")[0]
        paths = [where / f"{task}-{scheme}-s{s}.json" for s in seeds]
        if all(p.is_file() for p in paths) and all(record(task, scheme, s, where)["schema"] == "minipos-lab/3"
                                                   for s in seeds):
            out.append(n)
    return out


def ready(task: str, names, where: Path = FULL) -> bool:
    """Whether every row of ``names`` has every seed of ``task`` (``TASK_SEEDS``) recorded at schema 3."""
    return len(present(task, names, where)) == len(list(names))


def _finite(value, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise EvidenceError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def _entry_at(rec: dict, variant: str, length: int, where: str) -> dict | None:
    rows = [e for e in rec["results"][variant]["lengths"] if e["length"] == length]
    if not rows:
        raise EvidenceError(f"{where}: no evaluation at length {length}")
    return rows[0] if rows[0]["status"] == "ok" else None


def _metric_of(entry: dict, task: str, offset: int | None, where: str) -> float:
    if offset is None:
        return _finite(entry[METRIC[task]], where)
    cells = [c for c in entry["offsets"] if c["offset"] == offset]
    if not cells:
        raise EvidenceError(f"{where}: no offset {offset}")
    return _finite(cells[0]["accuracy"], where)


def history(task: str, row: str, length: int, offset: int | None = None, where: Path = FULL,
            seeds=None) -> dict | None:
    """The metric of ``row`` at ``length`` (retrieval: at ``offset``, or over every offset) at each
    checkpoint of training: ``{"step": [...], "mean": [...], "low": [...], "high": [...]}`` over the
    seeds (default: the task's ``TASK_SEEDS``; their mean, least and greatest value), or None where the
    scheme cannot run there."""
    if seeds is None:
        if task not in TASK_SEEDS:
            raise EvidenceError(f"task must be one of {', '.join(TASK_SEEDS)}, got {task!r}")
        seeds = TASK_SEEDS[task]
    scheme = row.partition(" +")[0]
    steps, per_seed = None, []
    for s in seeds:
        rec = record(task, scheme, s, where)
        points = rec.get("history")
        if not points:
            raise EvidenceError(f"{task}-{scheme}-s{s}: no history (a record of schema 3 has one)")
        got = []
        for p in points:
            e = _entry_at({"results": {"base": {"lengths": p["lengths"]}}}, "base", length,
                          f"{task}-{scheme}-s{s} history step {p['step']}")
            if e is None:
                return None
            got.append(_metric_of(e, task, offset, f"{task}-{scheme}-s{s} step {p['step']}"))
        these = [p["step"] for p in points]
        if steps is not None and these != steps:
            raise EvidenceError(f"{task}/{row}: the seeds' checkpoints differ ({steps} against {these})")
        steps = these
        per_seed.append(got)
    cols = list(zip(*per_seed))
    return {"step": steps, "mean": [sum(c) / len(c) for c in cols], "low": [min(c) for c in cols],
            "high": [max(c) for c in cols]}


def twice_change(task: str, row: str, length: int, offset: int | None = None) -> dict | None:
    """Seed 0 of ``row`` at ``length`` on the budget (``FULL``) and on twice the budget (``TWICE``): both
    values and the change with its standard error. The two runs evaluate the same sequences (drawn from
    the seed and the length alone), so the change is paired sequence by sequence: its standard error is
    the sd of the per-sequence differences over sqrt(n). None where the scheme cannot run there, or where
    the twice-budget record is not written yet."""
    scheme, _, variant = row.partition(" +")
    variant = variant or "base"
    if not (TWICE / f"{task}-{scheme}-s0.json").is_file():
        return None
    a, b = (record(task, scheme, 0, w) for w in (FULL, TWICE))
    ea, eb = (_entry_at(r, variant, length, f"{task}-{scheme}-s0 ({w.name})") for r, w in ((a, FULL), (b, TWICE)))
    if ea is None or eb is None:
        return None
    if offset is None and task != "retrieval":
        xa, xb = ea["sequence_losses"], eb["sequence_losses"]
    else:
        pick = (lambda e: [c for c in e["offsets"] if c["offset"] == offset][0]["sequence_accuracy"]) \
            if offset is not None else (lambda e: [x for c in e["offsets"] for x in c["sequence_accuracy"]])
        xa, xb = pick(ea), pick(eb)
    if len(xa) != len(xb):
        raise EvidenceError(f"{task}/{row}/{length}: the two budgets evaluated {len(xa)} and {len(xb)} sequences")
    d = [y - x for x, y in zip(xa, xb)]
    n = len(d)
    mean = sum(d) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in d) / (n - 1)) if n > 1 else 0.0
    va, vb = _metric_of(ea, task, offset, "budget"), _metric_of(eb, task, offset, "twice")
    return {"budget": va, "twice": vb, "change": vb - va, "se": sd / math.sqrt(n), "sequences": n}
