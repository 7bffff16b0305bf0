"""Runs of consecutive positions: where a bias that depends on ``j - i`` only repeats."""

from __future__ import annotations

import numpy as np


def is_run(positions) -> bool:
    """Whether ``positions`` are consecutive integers ``p, p + 1, ...`` (fewer than two count)."""
    positions = np.asarray(positions)
    return positions.size < 2 or bool(np.all(np.diff(positions) == 1))
