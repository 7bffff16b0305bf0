"""The schemes under test, as plain specs: ``{"name": ..., **keyword arguments of the minipos class}``.

A spec is what a record stores, so a record says exactly which scheme ran. ``build(spec)`` makes a
new scheme from it through ``minipos.schemes`` (one per layer: a scheme belongs to one layer).

``default_spec(name, train_length)`` sets the schemes that have a length-dependent configuration
the way their papers relate it to the training length:

- learned absolute: a table of ``train_length`` rows (GPT-2: ``n_positions`` = the context), so it
  cannot run past it;
- DeBERTa: v3's 256 log buckets and 512 relative positions belong to its 512-token training
  length; here both are scaled by ``train_length / 512`` (``L/2`` buckets, ``L`` positions);
- T5: the decoder's own configuration (32 buckets, max distance 128, unidirectional);
- the rest have no length in their configuration.

RoPE's context extensions (``EXTENSIONS``) are RoPE specs with a ``scaling`` dict as HF writes it.
"""

from __future__ import annotations

from minipos import schemes
from minipos.seams import Scheme

__all__ = ["ORDER", "EXTENSIONS", "default_spec", "build", "extension_spec", "label"]

ORDER = tuple(name for name, entry in schemes.ENTRIES.items() if entry.lab)
"""Every scheme of the protocol, by the ``name`` of its minipos class: the registry's ``lab`` entries."""

EXTENSIONS = ("linear", "ntk", "dynamic", "yarn")
"""RoPE extended to a longer length without training (``minipos.rope_scaling`` kinds)."""


def default_spec(name: str, train_length: int) -> dict:
    """The spec of scheme ``name`` for a model trained at ``train_length`` tokens."""
    if name not in ORDER:
        raise ValueError(f"scheme must be one of {', '.join(ORDER)}; got {name!r}")
    if name == "learned":
        return {"name": name, "max_positions": train_length}
    if name == "deberta":
        return {"name": name, "position_buckets": max(2, train_length // 2), "max_relative_positions": train_length}
    if name == "t5":
        return {"name": name, "num_buckets": 32, "max_distance": 128, "bidirectional": False}
    return {"name": name}


def extension_spec(kind: str, train_length: int, factor: float) -> dict:
    """RoPE with the ``kind`` scaling for a model trained at ``train_length``, stretched ``factor`` times.

    ``dynamic`` takes factor 1 here: it scales itself by the current length (HF's ``dynamic`` with
    ``factor = 1`` is NTK at ``seq_len / L`` whenever ``seq_len > L``).
    """
    if kind not in EXTENSIONS:
        raise ValueError(f"extension must be one of {', '.join(EXTENSIONS)}; got {kind!r}")
    scaling = {"rope_type": kind, "factor": float(max(factor, 1.0))}
    if kind == "dynamic":
        scaling["factor"] = 1.0
    if kind in ("dynamic", "yarn"):
        scaling["original_max_position_embeddings"] = train_length
    return {"name": "rope", "scaling": scaling}


def build(spec: dict) -> Scheme:
    """A new minipos scheme instance from its spec."""
    spec = dict(spec)
    return schemes.build(spec.pop("name"), spec)


def label(spec: dict) -> str:
    """A short readable name: ``rope``, ``rope+yarn x4``, ``learned(64)``."""
    name = spec["name"]
    scaling = spec.get("scaling")
    if scaling:
        return f"{name}+{scaling['rope_type']} x{scaling['factor']:g}"
    if name == "learned":
        return f"learned({spec['max_positions']})"
    return name
