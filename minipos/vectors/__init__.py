"""Golden vectors: an exact, language-neutral record of what every minipos function returns.

A port of a position scheme (to PyTorch, JAX, C++, Rust, ...) tests itself against these files;
minipos checks that it still reproduces them, so a change of behaviour is a visible change of
the spec. ``export(directory)`` writes one JSON file per *family* (one function, e.g.
``rope`` = ``minipos.rope.apply_rope``); ``check(directory)`` recomputes every case with the
installed minipos and returns every mismatch. ``spec/README.md`` describes the files for porters.

The submodules, one job each:

- ``codec``: arrays in JSON (``encode``, ``decode``).
- ``cases``: what a case is: its tolerances (``tol``, ``EXACT``) and its float32-exact inputs.
- ``absolute_relative``, ``rotary``, ``gradients``, ``layers``: the cases of each family and how
  one is run, by group: the absolute, bias and relative schemes; RoPE, its scalings, xPos and
  M-RoPE; the gradients of the functions; the layers.
- ``registry``: ``FAMILIES``, ``FLOAT32_TOLERANCE`` and ``SPEC_VERSION``.
- ``schema``: ``SCHEMA`` (= ``spec/schema.json``) and ``validate``.
- ``files``: ``export``, the safe reading of a file (``parse``) and where the shipped vectors are
  (``spec_dir``).
- ``model``: the optional family ``model_layers``, one model's layers read from its config
  (``export_model``, ``minipos vectors export --config``); not part of the shipped spec.
- ``checker``: ``check``, ``check_families``, ``check_document`` and the ``minipos vectors``
  command (``main``).

``_text``, ``_layer_cases`` and ``_guards`` hold what several of them share.
"""

from .checker import FamilyCheck, Mismatch, check, check_document, check_families, format_mismatches, main
from .codec import MAX_ARRAY_VALUES, MAX_NDIM, decode, encode
from .files import MAX_DEPTH, MAX_FILE_BYTES, build_family, build_model_document, export, export_model, family_cases, parse, spec_dir
from .registry import FAMILIES, FLOAT32_TOLERANCE, OPTIONAL_FAMILIES, SPEC_VERSION
from .schema import MAX_TOLERANCE, SCHEMA, SpecError, validate

__all__ = ["SPEC_VERSION", "FAMILIES", "SCHEMA", "MAX_FILE_BYTES", "MAX_DEPTH", "MAX_TOLERANCE",
           "MAX_ARRAY_VALUES", "MAX_NDIM", "FLOAT32_TOLERANCE", "Mismatch", "FamilyCheck", "SpecError",
           "encode", "decode", "validate", "parse", "family_cases", "build_family", "export", "OPTIONAL_FAMILIES",
           "build_model_document", "export_model", "spec_dir", "check",
           "check_families", "check_document", "format_mismatches", "main"]
