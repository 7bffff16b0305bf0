"""The files: ``export`` writes one ``<family>.json`` per family, and ``parse`` reads one that ``check``
does not trust (with the caps ``MAX_FILE_BYTES`` and ``MAX_DEPTH``).

Floats are written with Python's ``repr`` (the shortest string that reads back to the same float64),
keys in a fixed order: exporting twice gives byte-identical files on the same platform.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import stat

import numpy as np

from .. import __version__, safe_io
from ._guards import _check_directory, _check_families, _check_family, _decode_document, _run_family
from .codec import encode
from . import model
from .registry import FAMILIES, FLOAT32_TOLERANCE, OPTIONAL_FAMILIES, SPEC_VERSION
from .schema import SpecError


# --------------------------------------------------------------------------- the shipped spec

_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))   # .../minipos


def spec_dir() -> str:
    """The directory of the golden vectors that come with this minipos, which ``minipos vectors check``
    checks when it is given no directory: ``minipos/spec/vectors`` inside an installed wheel (with
    ``schema.json``, ``formulas.md``, ``catalogue.md`` and ``README.md`` beside it), or ``spec/vectors`` next to the
    package in a checkout or an unpacked sdist. Raises ``FileNotFoundError`` naming both places when
    neither is a directory."""
    places = [os.path.join(_PACKAGE, "spec", "vectors"), os.path.join(os.path.dirname(_PACKAGE), "spec", "vectors")]
    for place in places:
        if os.path.isdir(place):
            return place
    raise FileNotFoundError(f"no golden vectors at {places[0]} (an installed wheel) or {places[1]} (a checkout); "
                            "give the directory to check")


# --------------------------------------------------------------------------- export

def _recordable(value, mask) -> np.ndarray:
    """An output as written: a value that is not compared (``mask`` False) and not finite is written as 0.

    JSON has no infinity; the one such value minipos returns is the ``-inf`` log-sum-exp of a row
    with no allowed key, which its case's ``where`` leaves out.
    """
    value = np.asarray(value)
    if mask is None or not np.issubdtype(value.dtype, np.floating):
        return value
    return np.where(mask | np.isfinite(value), value, 0.0)


def _encode_case(case: dict, expected: dict) -> dict:
    where = case.get("where", {})
    out = {"name": case["name"], "description": case["description"], "params": case["params"],
           "inputs": {k: encode(v) for k, v in case["inputs"].items()},
           "expected": {k: encode(_recordable(v, where.get(k))) for k, v in expected.items()}}
    if "where" in case:
        out["where"] = {k: encode(v) for k, v in case["where"].items()}
    out["tolerance"] = case["tolerance"]
    return out


def family_cases(name: str) -> list:
    """The cases of family ``name`` as built (arrays, not yet run), float32 tolerances filled in."""
    cases = FAMILIES[_check_family(name)].build()
    for case in cases:
        if case["tolerance"]["float32"] is None:
            value = FLOAT32_TOLERANCE.get(f"{name}/{case['name']}", FLOAT32_TOLERANCE[name])
            case["tolerance"] = {**case["tolerance"], "float32": {"rtol": value, "atol": value}}
    return cases


def build_family(name: str) -> dict:
    """The JSON document of family ``name``: every case with its inputs and expected outputs."""
    family = FAMILIES[_check_family(name)]
    cases = [_encode_case(case, _run_family(name, case["inputs"], case["params"])) for case in family_cases(name)]
    doc = {"format": "minipos-vectors", "spec_version": SPEC_VERSION, "minipos_version": __version__,
           "family": name, "function": family.function, "description": family.description, "cases": cases}
    _decode_document(doc, name)  # export writes only what check accepts (schema, caps, unique names)
    return doc


def _dumps(obj, level: int = 0) -> str:
    """JSON with one key per line, and lists of scalars (array data, shapes) on a single line."""
    pad, inner = "  " * level, "  " * (level + 1)
    if isinstance(obj, dict) and obj:
        items = [f"{inner}{json.dumps(k)}: {_dumps(v, level + 1)}" for k, v in obj.items()]
        return "{\n" + ",\n".join(items) + "\n" + pad + "}"
    if isinstance(obj, list) and any(isinstance(v, (dict, list)) for v in obj):
        return "[\n" + ",\n".join(inner + _dumps(v, level + 1) for v in obj) + "\n" + pad + "]"
    return json.dumps(obj, allow_nan=False)  # floats as repr: the shortest exact float64 string


_TEMP_FILE = re.compile(r"^\.[a-z0-9_]+\.json\.[0-9]+\.[0-9a-f]{8}\.tmp$")  # .rope.json.<pid>.<hex>.tmp


def _family_files() -> set:
    return {f"{name}.json" for name in (*FAMILIES, *OPTIONAL_FAMILIES)}


def _check_export_target(directory: str) -> None:
    """Raise unless ``directory`` is absent, or a directory of family files (and export's temp files)."""
    if not os.path.lexists(directory):
        return
    if not os.path.isdir(directory):
        raise ValueError(f"directory {directory!r} exists and is not a directory")
    known = _family_files()
    strangers = sorted(e for e in os.listdir(directory) if not (_TEMP_FILE.match(e) or (
        e in known and not os.path.isdir(os.path.join(directory, e)))))
    if strangers:
        listed = ", ".join(strangers[:5]) + (f" and {len(strangers) - 5} more" if len(strangers) > 5 else "")
        raise ValueError(f"directory {directory!r} holds {listed}, which are not golden-vector family files; "
                         "export into a new or empty directory, or into a vectors directory")


def _write_temp(directory: str, name: str, text: str) -> str:
    """``text`` in a new hidden file beside ``<name>.json``, flushed to disk; return its path."""
    path = os.path.join(directory, f".{name}.json.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as err:
        raise safe_io.cannot_write(err, os.path.join(directory, f"{name}.json")) from None
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
    except BaseException as err:
        _remove(path)
        if isinstance(err, OSError):   # a full disk, say: the message names the family file
            raise safe_io.cannot_write(err, os.path.join(directory, f"{name}.json")) from None
        raise
    return path


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


def _sync_directory(directory: str) -> None:
    """Flush the directory entry of renamed files to disk (POSIX; elsewhere a no-op)."""
    if os.name != "posix":
        return
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def export(directory, families=None) -> list:
    """Write ``<family>.json`` for each family (default: all) into ``directory``; return the paths.

    Atomic per file: every family is built in memory first, written to a hidden temp file in
    ``directory`` (``.<family>.json.<pid>.<hex>.tmp``) and moved over its target with
    ``os.replace``, so an export that fails or is killed leaves each file either as it was or
    complete and new, never truncated. Temp files left by a killed export are removed by the next
    export and ignored by ``check``. ``directory`` must be absent, empty, or hold only family
    files (``ValueError`` otherwise); an unknown family raises before anything is written.
    """
    directory = _check_directory(directory)
    names = _check_families(families)
    _check_export_target(directory)
    texts = {name: _dumps(build_family(name)) + "\n" for name in names}  # may fail: nothing written yet
    return _write_all(directory, texts)


def build_model_document(config) -> dict:
    """The JSON document of family ``model_layers`` for the model ``config`` describes (a path to its
    config.json, the dict, or a transformers config object): ``minipos.vectors.model``."""
    cases = [_encode_case(case, _run_family(model.FAMILY, case["inputs"], case["params"]))
             for case in model.cases(config)]
    doc = {"format": "minipos-vectors", "spec_version": SPEC_VERSION, "minipos_version": __version__,
           "family": model.FAMILY, "function": model.FUNCTION, "description": model.DESCRIPTION, "cases": cases}
    _decode_document(doc, model.FAMILY)  # export writes only what check accepts
    return doc


def export_model(directory, config) -> list:
    """Write ``model_layers.json``, the golden vectors of the model ``config`` describes, into
    ``directory`` (absent, empty, or holding only family files), atomically as ``export``; return
    its path in a list. ``minipos vectors check directory`` recomputes it."""
    directory = _check_directory(directory)
    _check_export_target(directory)
    texts = {model.FAMILY: _dumps(build_model_document(config)) + "\n"}
    return _write_all(directory, texts)


def _write_all(directory: str, texts: dict) -> list:
    """Each ``<name>.json`` of ``texts`` written through a temp file and a rename (``export``)."""
    names = list(texts)
    os.makedirs(directory, exist_ok=True)
    for entry in os.listdir(directory):
        if _TEMP_FILE.match(entry):  # left by an export that was killed
            _remove(os.path.join(directory, entry))
    temps, paths = {}, []
    try:
        for name, text in texts.items():
            temps[name] = _write_temp(directory, name, text)
        for name in names:
            path = os.path.join(directory, f"{name}.json")
            os.replace(temps.pop(name), path)
            paths.append(path)
    finally:
        for path in temps.values():
            _remove(path)
    _sync_directory(directory)
    return paths


# --------------------------------------------------------------------------- reading a spec safely

MAX_FILE_BYTES = safe_io.MAX_BYTES  # a family file larger than this is refused before it is read (64 MiB)
MAX_DEPTH = safe_io.MAX_DEPTH       # JSON nesting (the format needs under 10)


def _inside(path: str, root: str) -> bool:
    try:
        return os.path.commonpath([path, root]) == root
    except ValueError:  # different drives
        return False


def _read_regular_file(path: str, root: str) -> bytes:
    """The bytes of ``path``, a regular file within ``root`` (real path) of at most ``MAX_FILE_BYTES``.

    Raises ``FileNotFoundError`` when there is no such entry and ``SpecError`` for a symlink out of
    ``root``, anything but a regular file (a FIFO, a device: refused without a read, see
    ``minipos.safe_io.read_bytes``) or a file above the size cap.
    """
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        real = os.path.realpath(path)
        if not _inside(real, root):
            raise SpecError(f"is a symbolic link to {real}, outside the directory")
        if not os.path.exists(real):
            raise SpecError(f"is a symbolic link to {real}, which does not exist")
        path = real
    try:
        return safe_io.read_bytes(path, limit=MAX_FILE_BYTES, follow_symlinks=False)
    except safe_io.FileError as err:
        raise SpecError(err.reason) from None


def parse(data: bytes):
    """The JSON document in ``data`` (a file's bytes), or ``SpecError`` saying why it is not one ``check`` reads.

    Strict: UTF-8, standard JSON (no NaN or Infinity, no number beyond float64), no duplicate
    keys, at most ``MAX_DEPTH`` levels of nesting (``minipos.safe_io.loads_json``). ``TypeError``
    for anything but ``bytes`` or ``bytearray`` (a ``str``, a ``memoryview``, an int).
    """
    try:
        return safe_io.loads_json(data, max_depth=MAX_DEPTH)
    except safe_io.FileError as err:
        raise SpecError(err.reason) from None
