"""Interleaved timing and the result table."""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np


def interleaved(f, g, repeats: int) -> tuple[float, float, float]:
    """``(median t_f, median t_g, median of t_f / t_g)``: f and g alternate, each timed call right
    after an untimed call of the same function.

    The untimed call makes each side's time its own steady state. Without it, a side would pay
    for what the other left behind: after a threaded BLAS call OpenBLAS's idle threads spin for
    about 0.1 s (measured here: the fast kernel took 80-90 ms right after the floor's product and
    55 ms right after itself), which slows whatever runs next on the same cores. The alternation
    still spreads the machine's drift over both sides.
    """
    f(), g()
    tf, tg = [], []
    for _ in range(repeats):
        f()
        start = time.perf_counter()
        f()
        tf.append(time.perf_counter() - start)
        g()
        start = time.perf_counter()
        g()
        tg.append(time.perf_counter() - start)
    ratios = np.array(tf) / np.array(tg)
    return float(np.median(tf)), float(np.median(tg)), float(np.median(ratios))


@dataclass
class Row:
    """One line of the table: ``value`` / ``reference`` as times (s) or sizes (MiB)."""

    name: str
    value: float | None
    reference: float | None
    ratio: float | None
    target: str
    met: bool | None            # None: informational, or skipped
    unit: str = "s"
    note: str = ""


def _fmt(x: float | None, unit: str) -> str:
    if x is None:
        return "-"
    if unit == "s":
        return f"{x * 1e3:.2f} ms" if x < 1 else f"{x:.2f} s"
    return f"{x:.0f} {unit}"


def table(rows: list[Row], *, indicative: bool = False) -> str:
    """The rows as a markdown table (readable in a terminal too). ``indicative``: the sizes are not the
    ones the targets are set for (``--quick``), so a result says "indicative", met or not."""
    head = ["benchmark", "minipos", "reference", "ratio", "target", "result"]
    lines = [head]
    verdicts = ({True: "indicative: met", False: "indicative: not met"} if indicative else
                {True: "target met", False: "TARGET MISSED"})
    for r in rows:
        result = {**verdicts, None: r.note or "info"}[r.met]
        if r.met is not None and r.note:
            result += f" ({r.note})"
        ratio = "-" if r.ratio is None else f"{r.ratio:.3f}"
        lines.append([r.name, _fmt(r.value, r.unit), _fmt(r.reference, r.unit), ratio, r.target, result])
    widths = [max(len(line[c]) for line in lines) for c in range(len(head))]
    out = ["| " + " | ".join(c.ljust(w) for c, w in zip(line, widths)) + " |" for line in lines]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(out)
