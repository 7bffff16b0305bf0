"""Check: recompute every case of a directory of family files with the installed minipos; and the
``minipos vectors`` command (``main``).

``check`` reads a directory it does not trust: each file is validated against ``SCHEMA`` and the caps
(``MAX_FILE_BYTES``, ``MAX_DEPTH``, ``MAX_TOLERANCE``, ``MAX_ARRAY_VALUES``) before a case runs, and
every problem is a failed check naming the file; ``spec/README.md`` lists them.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np

from .. import __version__
from ._guards import _check_directory, _check_families, _check_family, _decode_case, _decode_document, _run_family
from ._text import _short
from .files import _read_regular_file, export, export_model, parse, spec_dir
from .registry import FAMILIES, OPTIONAL_FAMILIES, SPEC_VERSION
from .schema import MAX_TOLERANCE, SCHEMA, SpecError, _validate


@dataclass(frozen=True)
class Mismatch:
    """One value (or one whole case, when ``index`` is None) that minipos no longer reproduces."""

    family: str
    case: str
    output: str = ""
    index: tuple | None = None
    expected: object = None
    got: object = None
    detail: str = ""

    def __str__(self) -> str:
        where = f"{self.family}/{self.case}" + (f": {self.output}" if self.output else "")
        if self.index is None:
            return f"{where}: {self.detail}"
        return f"{where}{list(self.index)}: expected {self.expected!r}, got {self.got!r}"


@dataclass(frozen=True)
class FamilyCheck:
    """What ``check`` found in one family file: cases run, values compared, and the mismatches."""

    family: str
    path: str
    cases: int = 0
    values: int = 0
    mismatches: tuple = ()

    @property
    def ok(self) -> bool:
        return not self.mismatches

    def __str__(self) -> str:
        counts = f"{self.family}: {self.cases} cases, {self.values} values compared"
        return f"ok   {counts}" if self.ok else f"FAIL {counts}, {len(self.mismatches)} problem(s)"


def compare(family: str, case: str, output: str, expected: np.ndarray, got, tolerance: dict,
            where: np.ndarray | None = None) -> list:
    """Every element of ``got`` outside ``atol + rtol * |expected|`` of ``expected`` (only where ``where``)."""
    got = np.asarray(got)
    if got.shape != expected.shape:
        return [Mismatch(family, case, output, detail=f"shape {list(got.shape)}, expected {list(expected.shape)}")]
    e, g = expected.astype(np.float64), got.astype(np.float64)
    with np.errstate(invalid="ignore"):
        bad = ~(np.abs(g - e) <= tolerance["atol"] + tolerance["rtol"] * np.abs(e))  # NaN counts as bad
    if where is not None:
        bad &= where
    return [Mismatch(family, case, output, tuple(int(i) for i in idx), expected[idx].item(), got[idx].item())
            for idx in np.argwhere(bad).tolist() for idx in [tuple(idx)]]


def _run_case(family: str, case: dict, precision: str = "float64") -> tuple:
    """``(mismatches, values compared)`` of one decoded case, run with the installed minipos."""
    name = case["name"]
    try:
        got = _run_family(family, case["inputs"], case["params"])
    except SpecError as err:  # a name the case records and the run does not read, or one it lacks
        return [Mismatch(family, name, detail=str(err))], 0
    except Exception as err:  # a case that now raises is a mismatch, reported with the error
        return [Mismatch(family, name, detail=f"raised {type(err).__name__}: {err}")], 0
    out, values = [], 0
    for output, expected in case["expected"].items():
        if output not in got:
            out.append(Mismatch(family, name, output, detail="output missing"))
            continue
        mask = case["where"].get(output)
        values += expected.size if mask is None else int(np.count_nonzero(mask))
        out += compare(family, name, output, expected, got[output], case["tolerance"][precision], mask)
    for output in got:
        if output not in case["expected"]:
            out.append(Mismatch(family, name, output, detail="returned but not recorded in expected"))
    if values == 0:
        out.append(Mismatch(family, name, detail="compares no values (every output empty or masked out)"))
    return out, values


def check_case(family: str, case: dict, precision: str = "float64") -> list:
    """Run one case (as written in a family file) with the installed minipos; return its mismatches."""
    _check_family(family, "family")
    if precision not in MAX_TOLERANCE:
        raise ValueError(f"precision must be one of {list(MAX_TOLERANCE)}, got {_short(precision)}")
    _validate(case, SCHEMA["$defs"]["case"], SCHEMA, "case")
    return _run_case(family, _decode_case(case), precision)[0]


def _check_decoded(family: str, path: str, cases: list) -> FamilyCheck:
    mismatches, values = [], 0
    for case in cases:
        found, n = _run_case(family, case)
        mismatches += found
        values += n
    if values == 0:
        mismatches.append(Mismatch(family, "-", detail="0 values compared; a family must compare at least one value"))
    return FamilyCheck(family, path, len(cases), values, tuple(mismatches))


def check_document(doc) -> list:
    """Every mismatch of one family document (as written by ``export``), or why it cannot be checked."""
    try:
        cases = _decode_document(doc)
    except (SpecError, ValueError, TypeError) as err:
        family = doc.get("family") if isinstance(doc, dict) and isinstance(doc.get("family"), str) else "?"
        return [Mismatch(family, "-", detail=str(err))]
    return list(_check_decoded(doc["family"], "", cases).mismatches)


def _check_file(directory: str, root: str, name: str) -> FamilyCheck:
    """Read, validate and recompute ``<name>.json``; every problem is a mismatch naming the file."""
    path = os.path.join(directory, f"{name}.json")
    try:
        cases = _decode_document(parse(_read_regular_file(path, root)), name)
    except FileNotFoundError:
        return FamilyCheck(name, path, mismatches=(Mismatch(name, "-", detail=f"no file {path}"),))
    except OSError as err:
        return FamilyCheck(name, path, mismatches=(Mismatch(name, "-", detail=f"{path}: cannot be read "
                                                                              f"({err.strerror or err})"),))
    except (SpecError, ValueError, TypeError) as err:  # decode names the case and field
        return FamilyCheck(name, path, mismatches=(Mismatch(name, "-", detail=f"{path}: {err}"),))
    return _check_decoded(name, path, cases)


def check_families(directory, families=None) -> list:
    """One ``FamilyCheck`` per family: each file read safely, validated and recomputed.

    With ``families=None`` the directory must hold exactly the known families: a missing family
    file fails, and so does a ``*.json`` that is no known family (hidden files are ignored).
    Nothing in the directory can crash, hang or exhaust memory: an unreadable, oversized,
    malformed or unfaithful file is a failed ``FamilyCheck`` whose mismatch names the file and
    the reason. Raises only for bad arguments (``TypeError``/``ValueError``, e.g. no such directory).
    """
    directory = _check_directory(directory)
    names = _check_families(families)
    if not os.path.isdir(directory):
        raise ValueError(f"directory {directory!r} does not exist or is not a directory")
    root = os.path.realpath(directory)
    if families is None:                               # an optional family (one model's) is checked when present
        present = {os.path.splitext(e)[0] for e in os.listdir(directory) if e.endswith(".json")}
        optional = [n for n in OPTIONAL_FAMILIES if n in present]
        names = optional if optional and not present & set(FAMILIES) else names + optional
    results = [_check_file(directory, root, name) for name in names]
    if families is None:
        for entry in sorted(os.listdir(directory)):
            stem, ext = os.path.splitext(entry)
            if ext == ".json" and not entry.startswith(".") and stem not in FAMILIES and stem not in OPTIONAL_FAMILIES:
                path = os.path.join(directory, entry)
                results.append(FamilyCheck(stem, path, mismatches=(Mismatch(
                    stem, "-", detail=f"{path}: not a family this minipos knows; the families are "
                                      f"{sorted(FAMILIES)}"),)))
    return results


def check(directory, families=None) -> list:
    """Recompute every case of every family file in ``directory``; return all mismatches (empty = pass).

    See ``check_families`` for what is checked besides the values.
    """
    return [m for result in check_families(directory, families) for m in result.mismatches]


def format_mismatches(mismatches: list) -> str:
    """One line per mismatch, then the number of mismatched values per case that has any."""
    lines = [str(m) for m in mismatches]
    per_case = {}
    for m in mismatches:
        if m.index is not None:
            per_case[f"{m.family}/{m.case}"] = per_case.get(f"{m.family}/{m.case}", 0) + 1
    lines += [f"{key}: {n} mismatch(es)" for key, n in per_case.items()]
    return "\n".join(lines)


def main(args) -> int:
    """``minipos vectors export DIR`` / ``minipos vectors check [DIR]`` (``args`` from the CLI parser;
    ``check`` without a directory checks the vectors that come with minipos, ``spec_dir()``).

    Exit status 0 on success; 1 when a check fails or the directory cannot be used, with one line
    per problem and no traceback.
    """
    command = f"minipos vectors {args.vectors_command}"
    directory = args.dir
    try:
        if args.vectors_command == "export" and getattr(args, "config", None) is not None:
            paths = export_model(directory, args.config)
        elif args.vectors_command == "export":
            paths = export(directory)
        else:
            directory = spec_dir() if directory is None else directory    # no DIR: the vectors shipped
            results = check_families(directory)
    except (ValueError, TypeError, OSError) as err:
        print(f"{command}: error: {err}", file=sys.stderr)
        return 1
    if args.vectors_command == "export" and getattr(args, "config", None) is not None:
        print(f"wrote {paths[0]}: the golden vectors of {args.config}'s attention layers; check them with "
              f"minipos vectors check {directory}")
        return 0
    if args.vectors_command == "export":
        size = sum(os.path.getsize(p) for p in paths)
        print(f"wrote {len(paths)} families ({size / 1e6:.2f} MB) to {directory}, spec {SPEC_VERSION}")
        return 0
    mismatches = [m for r in results for m in r.mismatches]
    if mismatches:
        print(format_mismatches(mismatches))
    print("\n".join(str(r) for r in results))
    if mismatches:
        print(f"FAILED: {len(mismatches)} problem(s) in {sum(not r.ok for r in results)} of {len(results)} "
              f"families of {directory}")
        return 1
    print(f"ok: minipos {__version__} reproduces {sum(r.cases for r in results)} cases "
          f"({sum(r.values for r in results)} values) in {len(results)} families of {directory}")
    return 0
