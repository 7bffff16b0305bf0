"""What a case is: its tolerances (``tol``, ``EXACT``) and its inputs, drawn on a float32-exact grid.

A case is a dict ``{"name", "description", "params", "inputs", "tolerance"}``, with ``"where"`` when
only part of an output is compared (``_case``); its expected outputs come from running it. Its
tolerance is ``{"float64": {"rtol": r, "atol": a}, "float32": {...}}``: a value matches when
``|got - expected| <= atol + rtol * |expected|`` elementwise (NumPy's ``allclose``). ``float64`` is
the tolerance for a port computing in double precision, ``float32`` for one computing in single
precision (cos/sin and angles in float32; the values are ``registry.FLOAT32_TOLERANCE``); integer
and boolean outputs carry zero tolerances (``EXACT``), i.e. they must be equal.

Determinism: inputs are drawn with fixed seeds (``numpy.random.default_rng``) and rounded to
multiples of 2^-10 (``_grid``), so every float input is exact in float32 as well.
"""

from __future__ import annotations

import numpy as np

GRID = 1024  # inputs are multiples of 1/GRID: exact in float32 and float64


def tol(f64: float = 1e-9, f32: float | None = None) -> dict:
    """Tolerances for float64 and float32 ports (rtol = atol = the given value).

    ``f32=None`` leaves the float32 tolerance to ``FLOAT32_TOLERANCE``, filled in when the family
    is built.
    """
    return {"float64": {"rtol": f64, "atol": f64}, "float32": None if f32 is None else {"rtol": f32, "atol": f32}}


EXACT = tol(0.0, 0.0)


def _grid(rng: np.random.Generator, shape, scale: float = 1.0) -> np.ndarray:
    """Standard normal draws times ``scale``, rounded to multiples of 1/GRID (float32-exact)."""
    return np.round(rng.standard_normal(shape) * scale * GRID) / GRID


def _case(name: str, description: str, inputs: dict, params: dict, tolerance: dict = None,
          where: dict | None = None) -> dict:
    case = {"name": name, "description": description, "params": params, "inputs": inputs,
            "tolerance": tolerance or tol()}
    if where:
        case["where"] = where
    return case


def _distances(limit: int = 100_000, dense: int = 300, count: int = 48) -> np.ndarray:
    """All of -dense..dense plus log-spaced distances out to +-limit: int64, sorted."""
    far = np.unique(np.round(np.logspace(np.log10(dense + 1), np.log10(limit), count)).astype(np.int64))
    return np.concatenate([-far[::-1], np.arange(-dense, dense + 1), far])
