"""The data types of ``minipos.config``'s reader: a family (``Family``), a config with its family's
defaults (``FamilyConfig``, which ``minipos.config`` calls ``_Config``), how to build one attention
layer (``LayerSpec``) and the model read (``Model``, its layers built when indexed).
``minipos.config`` re-exports ``LayerSpec`` and ``Model``; its module docstring states the contract."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Callable

from . import terminal
from ._checks import check_float
from .mla import MultiHeadLatentAttention

__all__ = ["Family", "FamilyConfig", "LayerSpec", "Model"]


@dataclass(frozen=True)
class Family:
    """A family the reader knows: the function from a ``FamilyConfig`` to the layer specs, and the
    defaults of its transformers config class for keys a config.json may leave out."""

    read: Callable
    defaults: dict


class FamilyConfig:
    """A text config dict with its family's defaults; every error names the key and the model type."""

    LIMITS = {"num_hidden_layers": 2 ** 16}
    """The counts the reader makes one object for, one at a time (a layer spec per layer): bounded, so that a hostile
    config cannot make it loop for ever."""

    def __init__(self, data: dict, model_type: str, defaults: Mapping):
        self.data, self.model_type, self.defaults = data, model_type, defaults

    def error(self, message: str) -> ValueError:
        return ValueError(f"model_type {self.model_type!r}: {message}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, default=None, *, required: bool = False):
        """``config[key]``; absent or None: the family default, else ``default`` (or an error)."""
        if self.data.get(key) is not None:
            return self.data[key]
        if key in self.defaults:
            return self.defaults[key]
        if required:
            raise self.error(f"config[{key!r}] is required (its transformers config class has no default)")
        return default

    def int(self, key: str, **kw) -> int:
        value = self.get(key, **kw)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.error(f"config[{key!r}] must be an integer >= 1, got {value!r}")
        if value > self.LIMITS.get(key, value):
            raise self.error(f"config[{key!r}] = {value}: the reader makes one layer spec per layer and takes at most "
                             f"{self.LIMITS[key]}")
        return value

    def float(self, key: str, default=None, *, positive: bool = False) -> float:
        """``config[key]`` (absent or None: the family default, else ``default``) as a finite float, > 0 with
        ``positive``; else ``ValueError``/``TypeError`` naming the key and the model type."""
        value = self.get(key, default, required=default is None)
        try:
            return check_float(value, f"config[{key!r}]", positive=positive)
        except (ValueError, TypeError) as err:
            raise type(err)(f"model_type {self.model_type!r}: {err}") from None

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise TypeError(f"model_type {self.model_type!r}: config[{key!r}] must be true or false, got "
                            f"{type(value).__name__} {value!r}")
        return value


# --------------------------------------------------------------------------- one layer

@dataclass(frozen=True)
class LayerSpec:
    """How to build one decoder layer's attention: the class, its keyword arguments, the scheme
    (a function making a fresh one), the biases the model does not have (set to ``None`` after
    building: Qwen2 has q/k/v biases and none on the output), and what ``describe`` shows."""

    index: int
    layer_type: str
    cls: type
    kwargs: dict
    scheme: Callable
    position: str
    no_bias: tuple = ()
    notes: tuple = ()
    indexer: dict | None = None
    causal: bool = True
    patch_window: int | None = None    # a vision layer's square windows (Qwen2.5-VL): axial_window_mask(p, W)

    def build(self, seed: int = 0):
        """A new layer with random weights drawn with ``seed`` (the checkpoint's are copied in)."""
        layer = self.cls(scheme=self.scheme(), seed=seed, **self.kwargs)
        for name in self.no_bias:
            setattr(layer, name, None)
        return layer


class _Layers(Sequence):
    """``Model.layers``: layer ``i`` is built when first indexed, then kept."""

    def __init__(self, specs):
        self._specs, self._built = specs, {}

    def __len__(self):
        return len(self._specs)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        spec = self._specs[i]
        if spec.index not in self._built:
            self._built[spec.index] = spec.build(seed=spec.index)
        return self._built[spec.index]

    def __repr__(self):
        return f"<{len(self)} layers, {len(self._built)} built>"


@dataclass
class Model:
    """The position machinery of a model (``read``): ``layers`` (built when indexed), ``specs`` (how
    each is built), ``vision`` (the vision tower's ``Model``, ``kind`` "vision encoder", or None),
    ``model_type``, ``config`` (the text config read) and ``notes`` (what the reader saw but does not
    model: a vision tower it does not read, say)."""

    model_type: str
    config: dict
    specs: list
    notes: list = field(default_factory=list)
    vision: object = None
    kind: str = "decoder"

    def __post_init__(self):
        self.layers = _Layers(self.specs)

    def rows(self) -> list:
        """One row per layer: ``[layer, type, heads, position, mask, notes]`` as strings."""
        rows = []
        for s in self.specs:
            kw = s.kwargs
            heads = f"{kw['num_heads']}/{kw.get('num_kv_heads') or kw['num_heads']} x {kw.get('head_dim') or '-'}"
            if s.cls is MultiHeadLatentAttention:
                heads = f"{kw['num_heads']} x ({kw['qk_nope_head_dim']}+{kw['qk_rope_head_dim']})"
            mask = ["causal" if s.causal else "bidirectional (causal=False)"]
            if kw.get("sliding_window"):
                mask.append(f"window {kw['sliding_window']} (i-{kw['sliding_window']} < j <= i)")
            if kw.get("attention_chunk"):
                mask.append(f"chunks of {kw['attention_chunk']}")
            if s.patch_window:
                mask.append(f"windows of {s.patch_window} x {s.patch_window} patches")
            if s.indexer and s.indexer.get("shared_from") is not None:
                mask.append(f"layer {s.indexer['shared_from']}'s indexer's top {s.indexer['topk']}")
            elif s.indexer and s.indexer.get("blocks"):
                mask.append(f"the indexer's top {s.indexer['topk_blocks']} blocks of {s.indexer['block_size']} keys "
                            "per group of heads")
            elif s.indexer:
                mask.append(f"the indexer's top {s.indexer['topk']}")
            notes = list(s.notes)
            if kw.get("sinks"):
                notes.insert(0, "sinks")
            if kw.get("scale") is not None:
                notes.insert(0, f"scale {kw['scale']:.6g}")
            rows.append([str(s.index), s.layer_type, heads, s.position, ", ".join(mask), "; ".join(notes)])
        return rows

    def describe(self, width: int | None = None, *, runs: bool = False) -> str:
        """The per-layer table (heads shown as ``query/key-value x head_dim``), then the notes; at most
        ``width`` columns where the words allow (default 200). ``runs=True`` shows the layers that are
        alike as one row, their indices listed (``"0-4, 6-10"``, ``"1, 3, ..., 23"``)."""
        head = ["layer", "type", "heads", "position", "mask", "notes"]
        rows = self.rows()
        if runs:                                                # alike layers: one row, their indices listed
            groups = {}
            for row in rows:
                groups.setdefault(tuple(row[1:]), []).append(int(row[0]))
            rows = [[_indices(ix), *key] for key, ix in groups.items()]
        lines = [f"{self.model_type}: {len(self.specs)} {self.kind} layers"]
        lines += terminal.table(head, rows, width=width or 200, details=(5,))
        lines += [f"note: {n}" for n in self.notes]
        if self.vision is not None:                                     # the vision tower's own table
            lines += ["", self.vision.describe(width, runs=runs)]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Model(model_type={self.model_type!r}, layers={len(self.specs)})"


def _indices(ix: list) -> str:
    """Layer indices, short: ``"0-4, 6-10"``, or ``"1, 3, ..., 23"`` for a progression of 4 or more."""
    if len(ix) >= 4 and len({b - a for a, b in zip(ix, ix[1:])}) == 1 and ix[1] - ix[0] > 1:
        return f"{ix[0]}, {ix[1]}, ..., {ix[-1]}"
    runs, start = [], ix[0]
    for a, b in zip(ix, ix[1:] + [None]):
        if b != a + 1:
            runs.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(runs)
