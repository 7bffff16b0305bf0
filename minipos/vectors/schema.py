"""The format of a family file: ``SCHEMA`` (= ``spec/schema.json``, JSON Schema draft 2020-12) and
``validate``, which checks a document against it. ``spec/README.md`` describes the format for porters;
in short::

    {"format": "minipos-vectors", "spec_version": "1.0.0", "minipos_version": "0.1.0",
     "family": "rope", "function": "minipos.rope.apply_rope", "description": "...",
     "cases": [{"name": ..., "description": ...,
                "params":   {JSON scalars, lists and objects: keyword arguments},
                "inputs":   {name: array},
                "expected": {name: array},
                "where":    {output name: boolean array of its shape: compare only there} (optional),
                "tolerance": {"float64": {"rtol": r, "atol": a}, "float32": {...}}}]}

where an array is as ``codec`` encodes it.
"""

from __future__ import annotations

import re

from ._text import _short
from .codec import ENCODED_DTYPES, MAX_NDIM

MAX_TOLERANCE = {"float64": 1e-6, "float32": 1e-2}  # largest rtol and atol a case may carry

SCHEMA = {  # spec/schema.json, which a test keeps equal to this
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "$id": "minipos-vectors/1.0.0/schema.json",
    "title": "minipos golden vectors: one family of cases",
    "description": "One file per family (one function). Each case gives keyword parameters, input arrays, "
                   "expected output arrays and the tolerances for float64 and float32 ports. See spec/README.md.",
    "type": "object",
    "required": ["format", "spec_version", "minipos_version", "family", "function", "description", "cases"],
    "additionalProperties": False,
    "properties": {
        "format": {"const": "minipos-vectors"},
        "spec_version": {"type": "string", "pattern": "^[0-9]+\\.[0-9]+\\.[0-9]+$"},
        "minipos_version": {"type": "string"},
        "family": {"type": "string", "pattern": "^[a-z0-9_]+$"},
        "function": {"type": "string", "description": "The minipos function whose behaviour the family records."},
        "description": {"type": "string"},
        "cases": {"type": "array", "minItems": 1, "items": {"$ref": "#/$defs/case"}},
    },
    "$defs": {
        "case": {
            "type": "object",
            "required": ["name", "description", "params", "inputs", "expected", "tolerance"],
            "additionalProperties": False,
            "properties": {
                "name": {"type": "string", "pattern": "^[A-Za-z0-9_]+$"},
                "description": {"type": "string"},
                "params": {"type": "object", "description": "Keyword arguments: JSON numbers, strings, booleans, "
                                                            "null, lists and objects."},
                "inputs": {"type": "object", "additionalProperties": {"$ref": "#/$defs/array"}},
                "expected": {"type": "object", "minProperties": 1, "additionalProperties": {"$ref": "#/$defs/array"}},
                "where": {
                    "type": "object",
                    "description": "Optional, per output: a boolean array of the output's shape; compare only "
                                   "where it is true.",
                    "additionalProperties": {"$ref": "#/$defs/array"},
                },
                "tolerance": {
                    "type": "object",
                    "required": ["float64", "float32"],
                    "additionalProperties": False,
                    "properties": {
                        "float64": {"$ref": "#/$defs/tolerance_float64"},
                        "float32": {"$ref": "#/$defs/tolerance_float32"},
                    },
                },
            },
        },
        **{f"tolerance_{precision}": {
            "type": "object",
            "description": ("For a float64 port. A value matches when |got - expected| <= atol + rtol * |expected|; "
                            "0 and 0 mean equal. At most 1e-6 each." if precision == "float64" else
                            "For a float32 port, compared as for float64. At most 1e-2 each."),
            "required": ["rtol", "atol"],
            "additionalProperties": False,
            "properties": {key: {"type": "number", "minimum": 0, "maximum": cap} for key in ("rtol", "atol")},
        } for precision, cap in MAX_TOLERANCE.items()},
        "array": {
            "type": "object",
            "description": "An n-dimensional array: data in row-major (C) order; shape [] is a scalar.",
            "required": ["dtype", "shape", "data"],
            "additionalProperties": False,
            "properties": {
                "dtype": {"enum": list(ENCODED_DTYPES)},
                "shape": {"type": "array", "maxItems": MAX_NDIM, "items": {"type": "integer", "minimum": 0}},
                "data": {"type": "array", "items": {"type": ["number", "boolean"]}},
            },
        },
    },
}


class SpecError(ValueError):
    """A vectors file that ``check`` cannot trust: unreadable, malformed, or not what its name says."""


_JSON_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
               "number": (int, float), "integer": int}
_ANNOTATIONS = {"$schema", "$id", "$defs", "title", "description"}
SCHEMA_KEYWORDS = _ANNOTATIONS | {"$ref", "type", "const", "enum", "pattern", "minimum", "maximum", "required",
                                  "properties", "additionalProperties", "minProperties", "minItems", "maxItems",
                                  "items"}


def _type_is(kind: type, name: str) -> bool:
    """Whether values of Python type ``kind`` (as ``json`` parses them) are JSON Schema type ``name``."""
    return issubclass(kind, _JSON_TYPES[name]) and not (name in ("number", "integer") and issubclass(kind, bool))


def _json_name(value) -> str:
    return next((n for n in ("object", "array", "string", "boolean", "null", "integer", "number")
                 if _type_is(type(value), n)), type(value).__name__)


def validate(doc, schema: dict | None = None) -> None:
    """Raise ``SpecError`` at the first place ``doc`` breaks ``schema`` (default: ``SCHEMA``).

    Implements the part of JSON Schema (draft 2020-12) that ``spec/schema.json`` uses (the names
    in ``SCHEMA_KEYWORDS``; local ``$ref`` only), with one strictness more: ``integer`` is a JSON
    number written without a fraction or exponent. The message names the place as a path
    (``$.cases[3].tolerance.float64.rtol``). A schema this cannot apply raises before it is used
    on the document's part it describes: ``TypeError`` for a schema that is not a dict,
    ``ValueError`` naming a ``$ref`` that is not ``#/$defs/<name>`` of an entry that exists (or
    that loops), an unknown ``type`` or a ``pattern`` that is not a regular expression, and
    ``NotImplementedError`` for a keyword outside ``SCHEMA_KEYWORDS``.
    """
    root = SCHEMA if schema is None else schema
    if not isinstance(root, dict):
        raise TypeError(f"schema must be a JSON Schema (a dict), got {type(root).__name__} {_short(root)}")
    _validate(doc, root, root, "$")


def _resolve(schema: dict, root: dict) -> dict:
    """``schema`` with its chain of ``$ref`` followed to a schema without one."""
    seen = []
    while "$ref" in schema:
        ref = schema["$ref"]
        name = ref[len("#/$defs/"):] if isinstance(ref, str) and ref.startswith("#/$defs/") else None
        if name is None or "/" in name:
            raise ValueError(f"schema: $ref {_short(ref)} is not a local reference '#/$defs/<name>', the only kind "
                             "vectors.validate follows")
        defs = root.get("$defs")
        if not isinstance(defs, dict) or not isinstance(defs.get(name), dict):
            raise ValueError(f"schema: $ref {ref!r} names no schema in $defs (it has {sorted(defs or {})})")
        if ref in seen:
            raise ValueError(f"schema: $ref {ref!r} loops ({' -> '.join(seen + [ref])})")
        seen.append(ref)
        schema = defs[name]
    return schema


def _pattern_matches(pattern, value: str) -> bool:
    try:
        return re.search(pattern, value) is not None
    except (re.error, TypeError) as err:
        raise ValueError(f"schema: pattern {_short(pattern)} is not a regular expression ({err})") from None


def _validate(value, schema: dict, root: dict, path: str) -> None:
    if not isinstance(schema, dict):
        raise TypeError(f"schema at {path} must be a dict, got {type(schema).__name__} {_short(schema)}")
    resolved = _resolve(schema, root)
    for part in (schema, resolved):
        unknown = set(part) - SCHEMA_KEYWORDS
        if unknown:
            raise NotImplementedError(f"the schema uses {sorted(unknown)}, which vectors.validate does not implement")
    schema = resolved
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        strange = [k for k in kinds if k not in _JSON_TYPES] if isinstance(kinds, list) else [kinds]
        if strange:
            raise ValueError(f"schema: type {_short(strange[0])} is not a JSON Schema type ({sorted(_JSON_TYPES)})")
        if not any(_type_is(type(value), k) for k in kinds):
            raise SpecError(f"{path}: expected {' or '.join(kinds)}, got {_json_name(value)}")
    if "const" in schema and value != schema["const"]:
        raise SpecError(f"{path}: must be {schema['const']!r}, got {_short(value)}")
    if "enum" in schema and not any(value == v and type(value) is type(v) for v in schema["enum"]):
        raise SpecError(f"{path}: must be one of {schema['enum']}, got {_short(value)}")
    if "pattern" in schema and isinstance(value, str) and not _pattern_matches(schema["pattern"], value):
        raise SpecError(f"{path}: {_short(value)} does not match {schema['pattern']}")
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if "minimum" in schema and not value >= schema["minimum"]:  # NaN fails both bounds
            raise SpecError(f"{path}: {value!r} is below the minimum {schema['minimum']!r}")
        if "maximum" in schema and not value <= schema["maximum"]:
            raise SpecError(f"{path}: {value!r} is above the maximum {schema['maximum']!r}")
    if isinstance(value, dict):
        _validate_object(value, schema, root, path)
    if isinstance(value, list):
        _validate_array(value, schema, root, path)


def _validate_object(value: dict, schema: dict, root: dict, path: str) -> None:
    for key in schema.get("required", ()):
        if key not in value:
            raise SpecError(f"{path}: missing required field {key!r}")
    if len(value) < schema.get("minProperties", 0):
        raise SpecError(f"{path}: needs at least {schema['minProperties']} entry, has none")
    for key, item in value.items():
        sub = schema.get("properties", {}).get(key, schema.get("additionalProperties", True))
        if sub is False:
            raise SpecError(f"{path}: unexpected field {_short(key)}")
        if sub is not True:
            _validate(item, sub, root, f"{path}.{key}")


def _validate_array(value: list, schema: dict, root: dict, path: str) -> None:
    if len(value) < schema.get("minItems", 0):
        raise SpecError(f"{path}: needs at least {schema['minItems']} item(s), has {len(value)}")
    if len(value) > schema.get("maxItems", len(value)):
        raise SpecError(f"{path}: has {len(value)} items, more than {schema['maxItems']}")
    items = schema.get("items")
    if items is None:
        return
    if set(items) <= {"type"} | _ANNOTATIONS:  # a type only (array data): check each distinct type once
        kinds = [items["type"]] if isinstance(items["type"], str) else items["type"]
        for kind in set(map(type, value)):
            if not any(_type_is(kind, k) for k in kinds):
                i = next(i for i, v in enumerate(value) if type(v) is kind)
                raise SpecError(f"{path}[{i}]: expected {' or '.join(kinds)}, got {_json_name(value[i])}")
        return
    for i, item in enumerate(value):
        _validate(item, items, root, f"{path}[{i}]")
