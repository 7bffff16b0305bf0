"""The schemes under test, as plain specs: ``{"name": ..., **keyword arguments of the minipos class}``.

A spec is what a record stores, so a record says exactly which scheme ran. ``build(spec)`` makes a
new scheme from it through ``minipos.schemes`` (one per layer: a scheme belongs to one layer).

**One rule for every length-like setting.** Each scheme's configuration starts from its source (the
paper's or the reference code's values, ``SOURCES``), and every setting measured in tokens is scaled by
``L / source_length``, the training length here over the source's: the learned table's rows, T5's
buckets and max distance, DeBERTa's buckets and span, xPos's ``scale_base``. Settings that are not
lengths (RoPE's and xPos's base 10000, ALiBi's slopes, Transformer-XL's frequencies) keep the source's
values. Where one such choice plausibly decides a result, ``VARIANTS`` runs the source's unscaled values
too (``t5@source``, ``xpos@source``).

**Initialisations as the source has them** (``source_init``): T5's bias table and its query as HF's
``T5PreTrainedModel._init_weights`` draws them; the other schemes' parameters as their minipos classes
draw them.

RoPE's context extensions (``EXTENSIONS``) are RoPE specs with a ``scaling`` dict as HF writes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from minipos import schemes
from minipos.seams import Scheme
from minipos.t5 import T5Bias

__all__ = ["ORDER", "NAMES", "VARIANTS", "SOURCES", "LAYOUT", "MODEL_KEYS", "EXTENSIONS", "default_spec", "build",
           "split_spec", "extension_spec", "label", "source_init", "config_table"]

ORDER = tuple(name for name, entry in schemes.ENTRIES.items() if entry.lab)
"""Every scheme of the protocol, by the ``name`` of its minipos class: the registry's ``lab`` entries."""


@dataclass(frozen=True)
class Source:
    """Where a scheme's configuration comes from: its values there, the length they belong to, and
    which of them are lengths (scaled by ``L / length``)."""

    values: dict
    length: int | None           # the source's training length (None: no setting of it is a length)
    lengths: tuple = ()          # the keys of ``values`` measured in tokens
    cite: str = ""
    rules: dict = field(default_factory=dict)   # key -> (value at a training length L, the rule in words)


SOURCES = {
    "nope": Source({}, None, cite="no parameters (Kazemnejad et al. 2023, arXiv:2305.19466)"),
    "sinusoidal": Source({}, None, cite="Vaswani et al. 2017, Sec. 3.5: base 10000, no length"),
    "learned": Source({"max_positions": 1024}, 1024, ("max_positions",),
                      cite="GPT-2: n_positions 1024 = its context (HF GPT2Config)"),
    "alibi": Source({}, None, cite="Press et al. 2022: slopes 2^(-8h/H), no length"),
    "transformer-xl": Source({"base": 10000.0}, None, cite="Dai et al. 2019: sinusoid table, base 10000"),
    "t5": Source({"num_buckets": 32, "max_distance": 128, "bidirectional": False}, 512, ("max_distance",),
                 cite="T5 decoder: relative_attention_num_buckets 32, max_distance 128, inputs of 512 tokens "
                      "(Raffel et al. 2020, Sec. 2.1 and 3.1.2; HF T5Config); one table, computed in the first "
                      "layer and shared by all (HF has_relative_attention_bias)",
                 rules={"max_distance": (lambda L: max(L // 2, 17),
                                         "max(L/2, 17): T5's 128/512 = L/4 would leave no log buckets")}),
    "deberta": Source({"position_buckets": 256, "max_relative_positions": 512}, 512,
                      ("position_buckets", "max_relative_positions"),
                      cite="DeBERTa-v3: position_buckets 256, max_relative_positions 512, 512-token pre-training "
                           "(HF microsoft/deberta-v3-base config)"),
    "rope": Source({"base": 10000.0}, None, cite="Su et al. 2021 (RoFormer): base 10000, no length"),
    "xpos": Source({"base": 10000.0, "scale_base": 512}, 1024, ("scale_base",),
                   cite="Sun et al. 2023 (LeX): scale_base 512 with 1024-token training (torchscale's xpos)"),
    "fire": Source({"init_L": 512.0, "init_c": 0.1, "mlp_width": 32}, 2048, ("init_L",),
                   cite="Li et al. 2023 (FIRE, arXiv:2310.04418): threshold init_L 512, c 0.1, MLP width 32 in "
                        "the reference FIRE module, for 2048-token training"),
}
"""Each lab scheme's source configuration (see the module docstring's rule)."""

LAYOUT = {"t5": {"shared": True}, "sinusoidal": {"placement": "input"}, "learned": {"placement": "input"}}
"""How the model holds a scheme, as its source does: keys of a spec that are not keyword arguments of the
minipos class (``MODEL_KEYS``). ``shared``: one table for every layer (T5 computes its bias in the first
layer and every layer reuses it). ``placement: "input"``: the position vector is added once, to the token
embeddings before the first block (Vaswani et al. 2017, Sec. 3.5; GPT-2's ``wpe``), not at each layer's
attention input as the minipos layer's input seam alone would."""

MODEL_KEYS = ("shared", "placement")

VARIANTS = {"t5@source": "t5", "xpos@source": "xpos"}
"""Extra runs with the source's length-like values unscaled: ``name -> scheme``."""

NAMES = ORDER + tuple(VARIANTS)
"""What ``--schemes`` takes: every scheme, then the variants."""

EXTENSIONS = ("linear", "ntk", "dynamic", "yarn")
"""RoPE extended to a longer length without training (``minipos.rope_scaling`` kinds)."""


def _scaled(source: Source, train_length: int, scale: bool) -> dict:
    out = {}
    for key, value in source.values.items():
        if scale and key in source.rules:
            value = source.rules[key][0](train_length)
        elif scale and key in source.lengths:
            value = max(2, round(value * train_length / source.length))
        out[key] = value
    return out


def split_spec(spec: dict) -> tuple[dict, dict]:
    """``(the minipos class's spec, the model's options)``: a spec without, and with only, ``MODEL_KEYS``."""
    return ({k: v for k, v in spec.items() if k not in MODEL_KEYS},
            {k: v for k, v in spec.items() if k in MODEL_KEYS})


def default_spec(name: str, train_length: int) -> dict:
    """The spec of scheme (or variant) ``name`` for a model trained at ``train_length`` tokens."""
    if name not in NAMES:
        raise ValueError(f"scheme must be one of {', '.join(NAMES)}; got {name!r}")
    scheme = VARIANTS.get(name, name)
    source = SOURCES.get(scheme, Source({}, None))
    return {"name": scheme, **_scaled(source, train_length, scale=name not in VARIANTS), **LAYOUT.get(scheme, {})}


def config_table(train_length: int) -> list[dict]:
    """One row per scheme and variant: ``{"name", "setting", "source", "value", "rule", "cite"}`` for each
    configured setting (what the extrapolation page's configuration table shows)."""
    rows = []
    for name in NAMES:
        scheme = VARIANTS.get(name, name)
        source = SOURCES.get(scheme, Source({}, None))
        spec = default_spec(name, train_length)
        if not source.values:
            rows.append({"name": name, "setting": "-", "source": "-", "value": "-", "rule": "none", "cite": source.cite})
        for key, value in source.values.items():
            scaled = key in source.lengths and name not in VARIANTS
            rule = (source.rules[key][1] if scaled and key in source.rules else
                    f"x {train_length}/{source.length}" if scaled else
                    "kept (a variant)" if key in source.lengths else "kept (not a length)")
            rows.append({"name": name, "setting": key, "source": value, "value": spec[key], "rule": rule,
                         "cite": source.cite})
    return rows


def source_init(layer, config_d_model: int) -> None:
    """Re-draw what the source initialises differently from minipos's defaults, in place.

    T5 (HF ``T5PreTrainedModel._init_weights``): ``relative_attention_bias ~ N(0, d_model^-1/2)`` and
    ``q ~ N(0, (d_model d_kv)^-1/2)`` where ``k``, ``v`` are ``N(0, d_model^-1/2)``: T5 has no
    ``1/sqrt(D)`` on its logits and folds it into the query's initialisation instead. minipos draws the
    table ``N(0, 1)`` and every projection alike, so the table is scaled by ``d_model^-1/2`` and the
    query by ``D^-1/2``, which makes T5's first logits the size of the other schemes'.
    """
    if isinstance(layer.scheme, T5Bias):
        layer.scheme.table *= layer.dtype.type(1 / math.sqrt(config_d_model))
        layer.wq *= layer.dtype.type(1 / math.sqrt(layer.head_dim))


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
    """A new minipos scheme instance from its spec (the model's options, ``MODEL_KEYS``, left out)."""
    spec = split_spec(spec)[0]
    return schemes.build(spec.pop("name"), spec)


def label(spec: dict) -> str:
    """A short readable name: ``rope``, ``rope+yarn x4``, ``learned(64)``, ``t5(4, 16)``, ``xpos(32)``."""
    name = spec["name"]
    scaling = spec.get("scaling")
    if scaling:
        return f"{name}+{scaling['rope_type']} x{scaling['factor']:g}"
    if name == "learned":
        return f"learned({spec['max_positions']})"
    if name == "t5":
        return f"t5({spec['num_buckets']}, {spec['max_distance']})"
    if name == "deberta":
        return f"deberta({spec['position_buckets']}, {spec['max_relative_positions']})"
    if name == "xpos":
        return f"xpos({spec['scale_base']:g})"
    return name
