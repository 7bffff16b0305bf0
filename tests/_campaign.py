"""What the bad-input campaigns share: the expectation of a call and the arrays of its result."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class Ok:
    """The call returns; every float array in the result is finite and ``check(result)`` passes."""
    check: Callable | None = None


@dataclass
class Named:
    """The call raises ``ValueError`` or ``TypeError`` (``exc``) naming ``name``."""
    name: str
    exc: tuple = (ValueError, TypeError)


def arrays(result):
    """Every NumPy array inside ``result`` (dicts, tuples and lists walked)."""
    if isinstance(result, dict):
        return [a for v in result.values() for a in arrays(v)]
    if isinstance(result, (tuple, list)):
        return [a for v in result for a in arrays(v)]
    return [result] if isinstance(result, np.ndarray) else []
