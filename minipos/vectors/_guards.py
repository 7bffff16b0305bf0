"""What export and check share: the checks of their arguments (family names, a directory), the
reading of a family document, decoded only if it is a faithful one, and the run of a case that
uses every input and parameter it records (``_run_family``).
"""

from __future__ import annotations

from collections.abc import Mapping

from .. import safe_io
from ._text import _short
from .codec import decode
from .registry import FAMILIES, OPTIONAL_FAMILIES, SPEC_VERSION, family_of
from .schema import MAX_TOLERANCE, SpecError, validate


def _check_family(name, argname: str = "name") -> str:
    """``name`` if it is a known family, else raise naming ``argname`` and the known families."""
    if not isinstance(name, str):
        raise TypeError(f"{argname} must be a family name (str), got {type(name).__name__} {_short(name)}")
    if name not in FAMILIES and name not in OPTIONAL_FAMILIES:
        raise ValueError(f"{argname}: unknown family {_short(name)}; the families are "
                         f"{sorted(FAMILIES) + sorted(OPTIONAL_FAMILIES)}")
    return name


def _check_families(families) -> list:
    """The family names to work on: every family for ``None``, else the given names, checked."""
    if families is None:
        return list(FAMILIES)
    if isinstance(families, (str, bytes)):
        raise TypeError(f"families must be a list of family names such as ['rope'], not the "
                        f"{type(families).__name__} {_short(families)}")
    try:
        names = list(families)
    except TypeError:
        raise TypeError(f"families must be a list of family names, got {type(families).__name__}") from None
    if not names:
        raise ValueError("families must name at least one family (None means every family)")
    for name in names:
        _check_family(name, "families")
    if len(set(names)) != len(names):
        raise ValueError(f"families lists a family twice: {names}")
    return names


def _check_directory(directory) -> str:
    """``directory`` as a str path, or raise ``TypeError``/``ValueError`` naming the argument."""
    return safe_io.check_path(directory, "directory")


class _Recorded(Mapping):
    """A case's ``inputs`` or ``params`` that remembers which names a family's runner read.

    Reading a name the case does not have raises ``SpecError`` saying it is missing (not a bare
    ``KeyError``); ``get`` and ``in`` look without complaint, as on a dict.
    """

    def __init__(self, data: dict, group: str, family: str):
        self._data, self._group, self._family, self.read = data, group, family, set()

    def __getitem__(self, key):
        if key not in self._data:
            raise SpecError(f"{self._group} is missing {key!r}, which family {self._family!r} reads")
        self.read.add(key)
        return self._data[key]

    def get(self, key, default=None):
        return self[key] if key in self._data else default

    def __contains__(self, key) -> bool:
        return key in self._data

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def _run_family(family: str, inputs: dict, params: dict) -> dict:
    """``FAMILIES[family].run(inputs, params)``, refusing a case that records a name the run never reads.

    An input or parameter that the family's function does not take would otherwise be carried in
    the file and ignored: a case could claim a setting it was never run with. Raises ``SpecError``
    naming the first such name, or a name the run needs and the case lacks.
    """
    recorded = {group: _Recorded(data, group, family) for group, data in (("inputs", inputs), ("params", params))}
    got = family_of(family).run(recorded["inputs"], recorded["params"])
    for group, seen in recorded.items():
        unread = [k for k in seen if k not in seen.read]
        if unread:
            raise SpecError(f"{group} holds {_short(unread[0])}, which family {family!r} does not read "
                            f"(it reads {sorted(seen.read)})")
    return got


def _decode_case(case: dict) -> dict:
    """A case (valid against the schema) with its arrays decoded and its masks checked."""
    label = f"case {case['name']!r}"
    out = {"name": case["name"], "params": case["params"], "tolerance": case["tolerance"]}
    for group in ("inputs", "expected", "where"):
        out[group] = {k: decode(v, f"{label}: {group}.{k}") for k, v in case.get(group, {}).items()}
    for name, mask in out["where"].items():
        if name not in out["expected"]:
            raise SpecError(f"{label}: where.{name} masks an output that expected does not have")
        if mask.dtype != bool:
            raise SpecError(f"{label}: where.{name} must be a bool array, got {mask.dtype}")
        if mask.shape != out["expected"][name].shape:
            raise SpecError(f"{label}: where.{name} has shape {list(mask.shape)}, but expected.{name} has "
                            f"{list(out['expected'][name].shape)}")
        if mask.size and not mask.any():                  # an output recorded but never compared
            raise SpecError(f"{label}: where.{name} masks out every value of expected.{name}; an output that "
                            "is not compared must not be recorded")
    for precision, cap in MAX_TOLERANCE.items():
        for key, value in case["tolerance"][precision].items():
            if not 0 <= value <= cap:  # the schema says so too; this holds for documents built in Python
                raise SpecError(f"{label}: tolerance.{precision}.{key} = {value!r} is outside [0, {cap}]")
    return out


def _decode_document(doc, name: str | None = None) -> list:
    """The decoded cases of a family document, or ``SpecError`` if it is not a faithful one.

    ``name`` (the file's stem) must be the document's ``family``; the family must be known, its
    ``function`` the one this minipos records, its major ``spec_version`` this one, and its case
    names unique.
    """
    validate(doc)
    family = doc["family"]
    if name is not None and family != name:
        raise SpecError(f"holds family {family!r}, but its file name says {name!r}")
    if family not in FAMILIES and family not in OPTIONAL_FAMILIES:
        raise SpecError(f"holds family {family!r}, which this minipos does not know; the families are "
                        f"{sorted(FAMILIES) + sorted(OPTIONAL_FAMILIES)}")
    if doc["function"] != family_of(family).function:
        raise SpecError(f"says function {_short(doc['function'])}, but family {family!r} records "
                        f"{family_of(family).function}")
    if doc["spec_version"].split(".")[0] != SPEC_VERSION.split(".")[0]:
        raise SpecError(f"has spec_version {doc['spec_version']!r}; this minipos reads {SPEC_VERSION}")
    seen = set()
    for case in doc["cases"]:
        if case["name"] in seen:
            raise SpecError(f"has a duplicate case name {case['name']!r}")
        seen.add(case["name"])
    return [_decode_case(case) for case in doc["cases"]]
