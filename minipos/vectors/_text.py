"""Error-message text shared by the modules of ``minipos.vectors``."""

from __future__ import annotations


def _short(value, limit: int = 60) -> str:
    """``repr(value)``, cut to ``limit`` characters: an error message never echoes a huge field."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
