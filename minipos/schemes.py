"""The schemes, listed once: name -> class, with what a checkpoint's config calls each setting.

``SCHEMES`` maps a scheme's ``name`` (the one ``minipos tour``, the lab's records and the golden
vectors' ``scheme`` parameter use) to its class; ``build(name, config)`` makes an instance from a
config of its keyword arguments. Everything that lists the schemes reads this registry:
``minipos.layer``'s exports, the tour (``minipos.cli``), the lab's protocol (``lab.schemes``), the
golden vectors' layer cases and the docs' catalogue of schemes. A new scheme is one ``register``
call here (docs: "Adding a scheme").

Each ``Entry`` holds the class and

- ``example(L)``: the keyword arguments of a typical instance for a model trained at ``L`` tokens
  (the tour's row, and the layer case of a scheme no family of the golden vectors covers);
- ``config_names``: for a keyword argument, where a checkpoint's config (HF transformers unless
  said otherwise) keeps its value;
- ``lab``: whether the lab's protocol trains it (the schemes of the article minipos grew from).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable

from .alibi import ALiBi
from .deberta import DeBERTa
from .irope import NoPETemperature
from .mrope import MRotary
from .rope_scaling import Rotary
from .seams import NoPE, Scheme
from .shaw import Shaw
from .sinusoidal import LearnedAbsolute, Sinusoidal
from .t5 import T5Bias
from .transformer_xl import TransformerXL
from .xpos import XPos

__all__ = ["Entry", "ENTRIES", "SCHEMES", "register", "unregister", "build", "config_keys", "class_named"]


def _no_arguments(train_length: int) -> dict:
    return {}


@dataclass(frozen=True)
class Entry:
    """One registered scheme (see the module docstring)."""

    cls: type
    example: Callable[[int], dict] = _no_arguments
    config_names: Mapping[str, str] = field(default_factory=dict)
    lab: bool = False

    @property
    def name(self) -> str:
        return self.cls.name


ENTRIES: dict[str, Entry] = {}
"""Every registered scheme by name, in the order the tour and the docs show them."""


class _Classes(Mapping):
    """``SCHEMES``: name -> class, a live view of ``ENTRIES``."""

    def __getitem__(self, name):
        return ENTRIES[name].cls

    def __iter__(self):
        return iter(ENTRIES)

    def __len__(self):
        return len(ENTRIES)

    def __repr__(self):
        return f"SCHEMES({', '.join(f'{n!r}: {e.cls.__name__}' for n, e in ENTRIES.items())})"


SCHEMES: Mapping[str, type] = _Classes()


def register(cls, *, example: Callable[[int], dict] | None = None, config_names: Mapping[str, str] | None = None,
             lab: bool = False) -> Entry:
    """Add the scheme class ``cls`` under ``cls.name``; return its ``Entry``.

    ``config_names`` may name only keyword arguments of ``cls``; a name already registered raises.
    """
    if not (isinstance(cls, type) and issubclass(cls, Scheme)):
        raise TypeError(f"cls must be a subclass of minipos.seams.Scheme, got {cls!r}")
    if not isinstance(cls.name, str) or not cls.name or cls.name in ENTRIES:
        raise ValueError(f"cls.name must be a new, non-empty name; {cls.name!r} is "
                         + ("registered already" if cls.name in ENTRIES else "not one"))
    unknown = sorted(set(config_names or {}) - set(config_keys(cls)))
    if unknown:
        raise ValueError(f"config_names: {unknown[0]!r} is not a keyword argument of {cls.__name__}")
    entry = Entry(cls, example or _no_arguments, dict(config_names or {}), bool(lab))
    ENTRIES[cls.name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove the scheme registered as ``name`` (a scheme a test or a notebook added)."""
    if name not in ENTRIES:
        raise ValueError(f"no scheme is registered as {name!r}; the schemes are {', '.join(ENTRIES)}")
    del ENTRIES[name]


def config_keys(cls) -> dict:
    """The keyword arguments of a scheme class and their defaults (``inspect.Parameter.empty``: none)."""
    params = inspect.signature(cls.__init__).parameters
    return {n: p.default for n, p in params.items() if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def class_named(class_name: str):
    """The registered scheme class called ``class_name`` (``"ALiBi"``), or ``None``."""
    return next((e.cls for e in ENTRIES.values() if e.cls.__name__ == class_name), None)


def build(name: str, config: Mapping | None = None) -> Scheme:
    """A new instance of the scheme registered as ``name``, with the keyword arguments ``config``."""
    if name not in ENTRIES:
        raise ValueError(f"unknown scheme {name!r}; minipos has {', '.join(ENTRIES)}")
    return ENTRIES[name].cls(**dict(config or {}))


# The registry: one line a scheme.
register(NoPE, lab=True)
register(Sinusoidal, lab=True)
register(LearnedAbsolute, example=lambda L: {"max_positions": L}, lab=True,
         config_names={"max_positions": "n_positions (GPT-2), max_position_embeddings (BERT)"})
register(ALiBi, lab=True)
register(T5Bias, lab=True, config_names={"num_buckets": "relative_attention_num_buckets",
                                         "max_distance": "relative_attention_max_distance",
                                         "bidirectional": "not is_decoder"})
register(TransformerXL, lab=True)
register(DeBERTa, lab=True, config_names={k: k for k in ("position_buckets", "max_relative_positions",
                                                         "pos_att_type", "max_position_embeddings")})
register(Rotary, example=lambda L: {"layout": "half"}, lab=True,
         config_names={"base": "rope_theta", "scaling": "rope_parameters (transformers 5), rope_scaling (4)"})
register(XPos, lab=True, config_names={"scale_base": "xpos_scale_base (torchscale)"})
register(MRotary, config_names={"mrope_section": "rope_parameters['mrope_section']", "base": "rope_theta"})
register(Shaw, example=lambda L: {"max_relative_position": 16},
         config_names={"max_relative_position": "max_relative_position (tensor2tensor hparams)"})
# Llama 4's temperature steps up every floor_scale positions (8192 there, a small share of its context);
# the example steps up every L // 8, so a tour at L sees it.
register(NoPETemperature, example=lambda L: {"floor_scale": max(1, L // 8)},
         config_names={"attn_scale": "attn_scale", "floor_scale": "floor_scale"})
