"""The extrapolation page's findings on a text corpus, set beside Press et al.'s WikiText-103 pattern.

Each sentence rests on one ledger entry (T1-T6 on code, P1-P6 on prose) and is chosen by its verdict
through ``ledger.either``: the ordering when the entry is confirmed, both numbers and "not resolved"
otherwise. So any sentence may stand beside a neighbour of either kind, and every sentence must read true
alone: it names its own subject, its comparison and its numbers, and refers to no other sentence.
``tests/test_docs_findings.py`` checks that under every combination of verdicts.
"""

from __future__ import annotations

from collections.abc import Callable

from . import ledger

PREFIX = {"text": "T", "prose": "P"}


def corpus_findings(task: str, mean: Callable[[str, int], float], page: str) -> str:
    """The findings paragraph of ``task`` (``"text"`` or ``"prose"``) for ``page``. ``mean(scheme, f)`` is
    the scheme's mean held-out loss over the seeds at f times the training length."""
    if task not in PREFIX:
        raise ValueError(f"task must be one of {sorted(PREFIX)}, got {task!r}")
    x = PREFIX[task]

    def v(name: str, f: int) -> str:
        return format(mean(name, f), ".3f")

    def say(n: int, holds: str, otherwise: str) -> str:
        return ledger.either(f"{x}{n}", page, holds, otherwise) + "."

    rise = {name: f"{v(name, 1)} at L, {v(name, 2)} at 2L" for name in ("sinusoidal", "rope")}
    out = [
        say(1, f"Sinusoidal's loss is already higher at 2L than at L ({rise['sinusoidal']})",
            f"Whether sinusoidal's loss is higher at 2L than at L ({rise['sinusoidal']}) is not resolved"),
        say(2, f"RoPE's loss is higher at 2L than at L ({rise['rope']})",
            f"Whether RoPE's loss is higher at 2L than at L ({rise['rope']}) is not resolved"),
        say(3, f"At 16L ALiBi's loss ({v('alibi', 16)}) is below RoPE's ({v('rope', 16)})",
            f"Whether ALiBi's loss at 16L ({v('alibi', 16)}) is below RoPE's ({v('rope', 16)}) is not resolved"),
        say(4, f"At 16L ALiBi's loss is below sinusoidal's ({v('sinusoidal', 16)})",
            f"Whether ALiBi's loss at 16L is below sinusoidal's ({v('sinusoidal', 16)}) is not resolved"),
        say(5, f"T5's loss rises between 2L and 16L ({v('t5', 2)} → {v('t5', 16)})",
            f"Whether T5's loss rises between 2L and 16L ({v('t5', 2)} → {v('t5', 16)}) is not resolved"),
        say(6, "At 16L ALiBi's loss is below T5's", "Whether ALiBi's loss at 16L is below T5's is not resolved"),
    ]
    held = all(ledger.entry(f"{x}{n}").verdict == "confirmed" for n in range(1, 7))
    close = ("Each of these is Press et al.'s pattern on WikiText-103" if held else
             "Where an entry is not resolved, these records neither show nor contradict Press et al.'s pattern "
             "on WikiText-103")
    return " ".join(out) + f" {close} ({ledger.mark('C5', page)[1:-1]}, {ledger.mark('C6', page)[1:-1]})."
