"""Test a port of a position scheme against the minipos golden vectors.

Standalone: needs Python and NumPy only, not minipos. Copy this file next to the vectors (or
point ``directory`` at them) and, from your test suite::

    from check_port import run_family, assert_family

    def my_apply_rope(x, positions, layout, base, rotary_dim, attention_factor, inv_freq=None):
        ...                                   # your implementation, returning an array

    assert_family("rope", my_apply_rope)                          # raises listing every mismatch
    report = run_family("rope", my_apply_rope, precision="float32")   # or inspect the report

Each case calls ``fn(**inputs, **params)``: the case's input arrays (as NumPy arrays of the
recorded dtype) and its parameters (JSON values) as keyword arguments. ``fn`` returns the
outputs: a dict ``{output name: array}``, a tuple in the order of the case's ``expected``, or a
single array when the case has one output. Anything with ``__array__`` (a torch tensor on the
CPU, say) is accepted. Raise ``NotImplementedError`` to skip a case your port does not support.
``adapt`` (optional) maps ``(inputs, params)`` to the keyword arguments of ``fn``, for ports
whose signature differs from minipos. The comparison is
``|got - expected| <= atol + rtol * |expected|`` with the case's tolerance for ``precision``
(``"float64"`` or ``"float32"``), only where the case's ``where`` mask is true.

The same logic in any language: read the JSON, build arrays from ``dtype``/``shape``/``data``
(row-major), call your function, compare as above (see README.md).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import numpy as np

VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors")


def decode(d: dict) -> np.ndarray:
    """An array from ``{"dtype", "shape", "data"}`` (data in row-major order)."""
    return np.array(d["data"], dtype=d["dtype"]).reshape(d["shape"])


def load_family(family: str, directory: str | None = None) -> dict:
    """The JSON document of ``family`` from ``directory`` (default: ``vectors/`` next to this file)."""
    with open(os.path.join(directory or VECTORS, f"{family}.json"), encoding="utf-8") as f:
        return json.load(f)


@dataclass
class Report:
    """What ``run_family`` found: cases passed, cases skipped, and one line per mismatch."""

    family: str
    passed: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    mismatches: list = field(default_factory=list)

    def __str__(self) -> str:
        head = (f"{self.family}: {len(self.passed)} passed, {len(self.skipped)} skipped, "
                f"{len(self.mismatches)} mismatch(es)")
        return "\n".join([head] + self.mismatches)


def _outputs(result, names: list) -> dict:
    """The port's result as ``{output name: array}``."""
    if isinstance(result, dict):
        return {k: np.asarray(v) for k, v in result.items()}
    if isinstance(result, tuple):
        return {k: np.asarray(v) for k, v in zip(names, result)}
    return {names[0]: np.asarray(result)}


def _compare(where_name: str, expected: np.ndarray, got: np.ndarray, tol: dict, mask) -> list:
    if got.shape != expected.shape:
        return [f"{where_name}: shape {list(got.shape)}, expected {list(expected.shape)}"]
    e, g = expected.astype(np.float64), got.astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(g - e) <= tol["atol"] + tol["rtol"] * np.abs(e))   # NaN is a mismatch
    if mask is not None:
        bad &= mask
    return [f"{where_name}{idx}: expected {expected[tuple(idx)].item()!r}, got {got[tuple(idx)].item()!r}"
            for idx in np.argwhere(bad).tolist()]


def run_case(family: str, case: dict, fn, *, precision: str = "float64", adapt=None) -> list | None:
    """Mismatch lines of one case (empty: it passes), or None when ``fn`` skips it."""
    inputs = {k: decode(v) for k, v in case["inputs"].items()}
    kwargs = adapt(inputs, case["params"]) if adapt else {**inputs, **case["params"]}
    try:
        got = _outputs(fn(**kwargs), list(case["expected"]))
    except NotImplementedError:
        return None
    masks = {k: decode(v) for k, v in case.get("where", {}).items()}
    lines = []
    for name, value in case["expected"].items():
        label = f"{family}/{case['name']}: {name}"
        if name not in got:
            lines.append(f"{label}: output missing")
            continue
        lines += _compare(label, decode(value), got[name], case["tolerance"][precision], masks.get(name))
    return lines


def run_family(family: str, fn, *, precision: str = "float64", directory: str | None = None,
               adapt=None) -> Report:
    """Run ``fn`` over every case of ``family``; return a ``Report`` of passes, skips and mismatches."""
    if precision not in ("float64", "float32"):
        raise ValueError(f"precision must be 'float64' or 'float32', got {precision!r}")
    report = Report(family)
    for case in load_family(family, directory)["cases"]:
        lines = run_case(family, case, fn, precision=precision, adapt=adapt)
        if lines is None:
            report.skipped.append(case["name"])
        elif lines:
            report.mismatches += lines
        else:
            report.passed.append(case["name"])
    return report


def assert_family(family: str, fn, **kwargs) -> Report:
    """``run_family``, raising ``AssertionError`` with every mismatch if there is one (or no case ran)."""
    report = run_family(family, fn, **kwargs)
    if report.mismatches or not report.passed:
        raise AssertionError(str(report))
    return report
