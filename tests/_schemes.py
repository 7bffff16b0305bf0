"""The schemes the tests run, read from the registry (``minipos.schemes``), never listed by hand.

``registered(L)``: every registered scheme, built as its entry's ``example(L)`` configures it for a
model trained at ``L`` tokens; a scheme registered later is in the next call's result.
``VARIANTS``: configurations the registry examples do not reach (a decoder's T5, partial or scaled
RoPE, ...), for the tests that want them beside the examples. ``SHIFT_INVARIANT``: a textbook fact of
the schemes it names; a scheme registered later states its facts in its own tests.
"""

from __future__ import annotations

from minipos import schemes

TRAIN_LENGTH = 16


def factory(name: str, length: int = TRAIN_LENGTH):
    """A function making a new instance of the registered ``name`` with its ``example(length)``."""
    entry = schemes.ENTRIES[name]
    return lambda: entry.cls(**entry.example(length))


def registered(length: int = TRAIN_LENGTH) -> dict:
    """``name -> factory`` of every registered scheme, in the registry's order."""
    return {name: factory(name, length) for name in schemes.ENTRIES}


def _build(name: str, **config):
    return lambda: schemes.build(name, config)


VARIANTS = {
    "t5_decoder": _build("t5", bidirectional=False),
    "alibi_raw": _build("alibi", symmetric=False),
    "rope_partial": _build("rope", rotary_dim=2),
    "rope_interleaved": _build("rope", layout="interleaved"),
    "rope_yarn": _build("rope", scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4}),
    "rope_dynamic": _build("rope", scaling={"rope_type": "dynamic", "factor": 2.0,
                                            "original_max_position_embeddings": 4}),
    "deberta_small": _build("deberta", position_buckets=4, max_relative_positions=8),
    "deberta_c2p": _build("deberta", position_buckets=4, max_relative_positions=8, pos_att_type="c2p"),
}
"""Configurations beyond the registry examples, each a function making a new instance."""


def with_variants(length: int = TRAIN_LENGTH) -> dict:
    """``registered(length)`` and ``VARIANTS``."""
    return {**registered(length), **VARIANTS}


SHIFT_INVARIANT = {
    "nope": True,
    "sinusoidal": False,              # absolute vectors added to the input
    "learned": False,
    "alibi": True,
    "t5": True,
    "transformer-xl": True,
    "deberta": True,
    "rope": True,
    "xpos": True,
    "mrope": True,                    # text positions: t = h = w, so M-RoPE is RoPE
    "shaw": True,
    "nope-temperature": False,        # query i scaled by tau(i): absolute
}
"""Whether the layer's outputs ignore a common shift of every position (under the same mask): the
textbook property of each scheme named, from its definition."""
