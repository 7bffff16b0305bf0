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
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .alibi import ALiBi
from .axial import AxialRotary
from .deberta import DeBERTa
from .decomposed import DecomposedRelPos
from .fire import FIRE
from .irope import NoPETemperature
from .mrope import MRotary
from .prope import ProportionalRotary
from .query_scale import ScaledQueryRotary
from .rope_scaling import Rotary
from .seams import SEAMS, TERMS, NoPE, Scheme
from .shaw import Shaw
from .sinusoidal import LearnedAbsolute, Sinusoidal
from .t5 import T5Bias
from .transformer_xl import TransformerXL
from .xpos import XPos

__all__ = ["Entry", "ENTRIES", "SCHEMES", "NAME_PATTERN", "EXAMPLE_LENGTHS", "register", "unregister", "build",
           "config_keys", "class_named"]


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


NAME_PATTERN = re.compile(r"[a-z][a-z0-9_-]{0,39}")
"""What a registered name looks like: a lowercase letter, then up to 39 lowercase letters, digits, ``-``
or ``_``. The name becomes a file name (the lab's records), a golden-vector case name and a command-line
word, so it holds no ``/``, ``..``, whitespace, ``+`` or ``@`` (the lab's variant marks)."""

EXAMPLE_LENGTHS = (1, 8, 64)
"""The training lengths ``register`` tries an ``example`` at (the tour's ``seq_len`` runs from 1 to 64)."""


def _check_name(cls) -> str:
    """``cls.name``: a string of ``NAME_PATTERN``, set by ``cls`` itself, not registered yet."""
    name = cls.__dict__.get("name")
    if name is None:
        raise ValueError(f"cls.name: {cls.__name__} must set its own class attribute name (the name the tour, "
                         f"the lab and the golden vectors use); it inherits {cls.name!r}")
    if not isinstance(name, str):
        raise TypeError(f"cls.name must be a str, got {type(name).__name__} {name!r}")
    if not NAME_PATTERN.fullmatch(name):
        raise ValueError(f"cls.name must be a lowercase letter then up to 39 lowercase letters, digits, '-' or '_' "
                         f"(no '/', '..', spaces, newlines, '+' or '@'), got {name!r}")
    if name in ENTRIES:
        raise ValueError(f"cls.name: {name!r} is registered already (by {ENTRIES[name].cls.__name__})")
    return name


def _check_class(cls) -> None:
    """``cls`` a ``Scheme`` subclass whose ``seams`` and ``terms`` are tuples of known names."""
    if not (isinstance(cls, type) and issubclass(cls, Scheme)):
        raise TypeError(f"cls must be a subclass of minipos.seams.Scheme, got {cls!r}")
    if cls is Scheme:
        raise TypeError("cls must be a subclass of minipos.seams.Scheme setting its own name, not Scheme itself "
                        "(NoPE is the registered scheme without position)")
    for attr, known in (("seams", SEAMS), ("terms", TERMS)):
        value = getattr(cls, attr)
        if not isinstance(value, tuple) or not all(isinstance(v, str) and v in known for v in value):
            raise ValueError(f"cls.{attr} must be a tuple of names from {known}, got {value!r}")


def _check_config_names(cls, config_names) -> dict:
    """``config_names`` as a dict of keyword argument of ``cls`` -> a non-empty string."""
    if config_names is None:
        return {}
    if not isinstance(config_names, Mapping):
        raise TypeError(f"config_names must be a mapping of keyword argument -> where a checkpoint's config keeps "
                        f"it, got {type(config_names).__name__}")
    keys = config_keys(cls)
    for key, where in config_names.items():
        if not isinstance(key, str) or key not in keys:
            raise ValueError(f"config_names: {key!r} is not a keyword argument of {cls.__name__} "
                             f"(it takes {', '.join(keys) or 'none'})")
        if not isinstance(where, str) or not where.strip():
            raise TypeError(f"config_names[{key!r}] must be a non-empty str (where a checkpoint's config keeps "
                            f"it), got {where!r}")
    return dict(config_names)


def _check_example(cls, example):
    """``example`` a callable whose ``example(L)``, at every ``EXAMPLE_LENGTHS`` L, is a dict of keyword
    arguments of ``cls`` with JSON values (a golden vector records it) that builds an instance."""
    if example is None:
        return _no_arguments
    if not callable(example) or isinstance(example, type):
        raise TypeError(f"example must be a function of the training length L returning a dict of keyword "
                        f"arguments of {cls.__name__}, got {type(example).__name__} {example!r}")
    for length in EXAMPLE_LENGTHS:
        try:
            config = example(length)
        except Exception as err:                                       # noqa: BLE001 - reported with its cause
            raise ValueError(f"example({length}) raised {type(err).__name__}: {err}") from err
        _check_config(cls, config, f"example({length})")
        try:
            json.dumps(config, allow_nan=False)
        except (TypeError, ValueError) as err:
            raise ValueError(f"example({length}) must hold JSON values (numbers, strings, booleans, None, lists, "
                             f"dicts: a golden vector records it), got {config!r} ({err})") from None
        try:
            cls(**config)
        except Exception as err:                                       # noqa: BLE001 - reported with its cause
            raise ValueError(f"example({length}) = {config!r} does not build {cls.__name__}: "
                             f"{type(err).__name__}: {err}") from err
    return example


def _check_config(cls, config, what: str) -> dict:
    """``config`` a mapping of keyword arguments of ``cls`` (``what`` names it in an error)."""
    if not isinstance(config, Mapping):
        raise TypeError(f"{what} must be a dict of keyword arguments of {cls.__name__}, got "
                        f"{type(config).__name__} {config!r}")
    keys = config_keys(cls)
    for key in config:
        if not isinstance(key, str) or key not in keys:
            raise ValueError(f"{what}: {key!r} is not a keyword argument of {cls.__name__} "
                             f"(it takes {', '.join(keys) or 'none'})")
    return dict(config)


def register(cls: type[Scheme], *, example: Callable[[int], dict] | None = None,
             config_names: Mapping[str, str] | None = None, lab: bool = False) -> Entry:
    """Add the scheme class ``cls`` under ``cls.name``; return its ``Entry``.

    Everything is checked here, before anything is added (an error names the argument):
    ``cls`` a ``Scheme`` subclass setting its own ``name`` (``NAME_PATTERN``, not registered yet), its
    ``seams`` and ``terms`` tuples of known names, built by ``cls()`` (every keyword has a default); ``example`` a function of the training length whose
    result, at each of ``EXAMPLE_LENGTHS``, is a dict of keyword arguments of ``cls`` with JSON values
    that builds an instance; ``config_names`` a mapping of keyword arguments of ``cls`` to non-empty
    strings; ``lab`` ``True`` or ``False``.
    """
    _check_class(cls)
    name = _check_name(cls)
    try:
        cls()
    except Exception as err:                                           # noqa: BLE001 - reported with its cause
        raise ValueError(f"{cls.__name__}() must build with its defaults (build(name) and the layer page's "
                         f"table construct every registered class without arguments): {type(err).__name__}: "
                         f"{err}") from err
    if not isinstance(lab, (bool, np.bool_)):
        raise TypeError(f"lab must be True or False, got {type(lab).__name__} {lab!r}")
    names = _check_config_names(cls, config_names)
    entry = Entry(cls, _check_example(cls, example), names, bool(lab))
    ENTRIES[name] = entry
    return entry


def unregister(name: str) -> None:
    """Remove the scheme registered as ``name`` (a scheme a test or a notebook added)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__} {name!r}")
    if name not in ENTRIES:
        raise ValueError(f"no scheme is registered as {name!r}; the schemes are {', '.join(ENTRIES)}")
    del ENTRIES[name]


def config_keys(cls: type[Scheme]) -> dict:
    """The keyword arguments of a scheme class and their defaults (``inspect.Parameter.empty``: none)."""
    if not (isinstance(cls, type) and issubclass(cls, Scheme)):
        raise TypeError(f"cls must be a subclass of minipos.seams.Scheme, got {type(cls).__name__} {cls!r}")
    params = inspect.signature(cls.__init__).parameters
    return {n: p.default for n, p in params.items() if n != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}


def class_named(class_name: str):
    """The registered scheme class called ``class_name`` (``"ALiBi"``), or ``None``."""
    if not isinstance(class_name, str):
        raise TypeError(f"class_name must be a str, got {type(class_name).__name__} {class_name!r}")
    return next((e.cls for e in ENTRIES.values() if e.cls.__name__ == class_name), None)


def build(name: str, config: Mapping | None = None) -> Scheme:
    """A new instance of the scheme registered as ``name``, with the keyword arguments ``config``
    (an unknown keyword raises ``ValueError`` naming it and the ones the class takes)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {type(name).__name__} {name!r}")
    if name not in ENTRIES:
        raise ValueError(f"unknown scheme {name!r}; minipos has {', '.join(ENTRIES)}")
    cls = ENTRIES[name].cls
    return cls(**_check_config(cls, {} if config is None else config, "config"))


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
register(MRotary, config_names={"mrope_section": "rope_parameters['mrope_section']", "base": "rope_theta",
                                "interleaved": "Qwen3-VL and later (rope_parameters['mrope_interleaved'])",
                                "rotary_dim": "int(head_dim * rope_parameters['partial_rotary_factor'])",
                                "layout": "'interleaved' for GLM-4V (rotate_half_llm), else 'half'"})
register(Shaw, example=lambda L: {"max_relative_position": 16},
         config_names={"max_relative_position": "max_relative_position (tensor2tensor hparams)"})
# Llama 4's temperature steps up every floor_scale positions (8192 there, a small share of its context);
# the example steps up every L // 8, so a tour at L sees it.
register(NoPETemperature, example=lambda L: {"floor_scale": max(1, L // 8)},
         config_names={"attn_scale": "attn_scale", "floor_scale": "floor_scale"})
# FIRE's threshold L starts at the reference code's 512 for 2048-token training, a quarter of the length.
register(FIRE, example=lambda L: {"init_L": L / 4}, lab=True,
         config_names={k: f"{k} (the reference FIRE module's argument)" for k in ("mlp_width", "init_c", "init_L")})
# p-RoPE: Gemma 4's global layers rotate a quarter of the frequencies; the example's half leaves one of the two
# pairs of the contract's head dim 4 rotating and one not.
register(ProportionalRotary, example=lambda L: {"partial_rotary_factor": 0.5},
         config_names={"base": "rope_parameters['rope_theta']",
                       "partial_rotary_factor": "rope_parameters['partial_rotary_factor'] (rope_type 'proportional')",
                       "factor": "rope_parameters['factor']"})
register(AxialRotary, config_names={"base": "vision_config.rope_parameters['rope_theta'] (rope_type 'axial')",
                                    "layout": "the vision tower's family: 'pixtral', 'gemma4', 'llama4', 'qwen', "
                                              "'kimi' or 'minimax_m3' (3-D: positions (3, T))",
                                    "position_scale": "SAM 3's global ViT layers: window_size / (image_size // "
                                                      "patch_size)",
                                    "class_angles": "MLCD's vision model (True): its class token, first, turned by "
                                                    "the learned class_pos_emb"})
# Ministral 3 scales its queries from original_max_position_embeddings = 16384 on (a 16th of its 256k context),
# with beta 0.1; the example steps every L // 4 positions, so the tour, the contract's T = 5 at L = 16 and the
# golden vectors' 7 positions all cross a step.
register(ScaledQueryRotary, example=lambda L: {"beta": 0.1, "original_max_position_embeddings": max(1, L // 4),
                                               "layout": "half"},
         config_names={"beta": "rope_parameters['llama_4_scaling_beta']",
                       "original_max_position_embeddings": "rope_parameters['original_max_position_embeddings']",
                       "base": "rope_parameters['rope_theta']",
                       "scaling": "rope_parameters (its YaRN keys; Ministral 3's rope_type is 'yarn')",
                       "layout": "'half' (HF's apply_rotary_pos_emb, rotate_half)"})
# SAM's decomposed relative position bias: a grid 4 patches wide holding the L patches (SAM ViT-B's window layers
# are 14 x 14, its global layers 64 x 64), so the contract's and the tour's positions cross rows.
register(DecomposedRelPos, example=lambda L: {"height": max(1, -(-L // 4)), "width": 4},
         config_names={"height": "vision_config window_size (window layers), else image_size // patch_size",
                       "width": "vision_config window_size (window layers), else image_size // patch_size"})
