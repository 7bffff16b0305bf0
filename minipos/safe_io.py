"""Reading and writing files that a tool does not trust: bounded reads, strict JSON, atomic writes.

Every file minipos's tools read (the golden vectors, the lab's shipped measurements, the
conformance results, the lab's records) goes through ``read_bytes`` or ``read_json``:

- only a regular file is read: a directory, a FIFO, a socket or a device (``/dev/zero``, a
  terminal) is refused at once, before a byte is read (the file is opened non-blocking, so a FIFO
  cannot hang the open, and what was opened is checked again with ``fstat``);
- at most ``limit`` bytes (default ``MAX_BYTES``): a larger file is refused from its size before it
  is read, and one that grows while it is read is refused too;
- JSON is strict: UTF-8, no ``NaN`` or ``Infinity``, no number beyond float64, no duplicate key,
  at most ``max_depth`` levels of nesting (default ``MAX_DEPTH``), checked without recursion.

``write_atomic`` writes through a temp file in the target's directory, flushed to disk and
renamed over the target, so a killed or failed write leaves the old file or the new one, never a
truncated one; a full disk is an ``OSError`` that says which file could not be written.

Every refusal is a ``FileError`` (a ``ValueError``) whose message names the file and the reason
on one line; a missing file is ``FileNotFoundError``. Standard library only.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import stat

__all__ = ["MAX_BYTES", "MAX_DEPTH", "FileError", "read_bytes", "loads_json", "read_json", "write_atomic",
           "check_path", "file_kind", "cannot_write"]

MAX_BYTES = 64 * 2**20   # a file above this is refused before it is read
MAX_DEPTH = 64           # levels of JSON nesting


class FileError(ValueError):
    """A file a tool will not read: not a regular file, too large, not UTF-8, not strict JSON, too deep.

    ``path`` is the file (or None for bytes read elsewhere), ``reason`` the text after it.
    """

    def __init__(self, path, reason: str):
        self.path, self.reason = (None if path is None else os.fspath(path)), reason
        super().__init__(reason if path is None else f"{self.path}: {reason}")


def check_path(path, argname: str = "path") -> str:
    """``path`` as a non-empty str, or ``TypeError``/``ValueError`` naming ``argname``."""
    if not isinstance(path, (str, os.PathLike)) or not isinstance(os.fspath(path), str):
        raise TypeError(f"{argname} must be a path (str or os.PathLike), got {type(path).__name__}")
    path = os.fspath(path)
    if not path:
        raise ValueError(f"{argname} must be a non-empty path")
    if "\x00" in path:
        raise ValueError(f"{argname} must not hold a NUL character, got {path!r}")
    return path


def _check_count(value, name: str, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{name} must be at least {minimum}, got {value}")


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words (``a FIFO``, ``a character device``, ...)."""
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "not a file"


def read_bytes(path, *, limit: int = MAX_BYTES, follow_symlinks: bool = True) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes.

    Raises ``FileNotFoundError`` when there is no such file, and ``FileError`` for anything but a
    regular file (a FIFO, a device, a directory), a file above ``limit`` bytes, and a file that
    cannot be opened (its reason, e.g. permission denied). ``follow_symlinks=False`` refuses a
    symbolic link instead of reading what it leads to.
    """
    path = check_path(path)
    _check_count(limit, "limit", 0)
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0) | getattr(os, "O_CLOEXEC", 0)
    if not follow_symlinks:
        flags |= getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise
    except IsADirectoryError:
        raise FileError(path, "is not a regular file (a directory)") from None
    except OSError as err:
        raise FileError(path, f"cannot be opened ({err.strerror or err})") from None
    try:
        info = os.fstat(fd)                      # what was opened, whatever the name pointed at before
        if not stat.S_ISREG(info.st_mode):
            raise FileError(path, f"is not a regular file ({file_kind(info.st_mode)})")
        if info.st_size > limit:
            raise FileError(path, f"is {info.st_size} bytes, more than the {limit} bytes allowed")
        chunks, size = [], 0
        while size <= limit:
            try:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            except OSError as err:
                raise FileError(path, f"cannot be read ({err.strerror or err})") from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise FileError(path, f"grew while it was read to more than the {limit} bytes allowed")
    return b"".join(chunks)


def _refuse_constant(name: str):
    raise ValueError(f"holds {name}, which is not JSON (numbers must be finite)")


_MAY_OVERFLOW = re.compile(r"[0-9.][eE][+-]?0*[0-9]{3}|[0-9]{200}")
"""A float literal that could exceed float64: a three-digit exponent, or 200 digits in a row (with an
exponent of two digits at most, fewer digits stay below 1e308). A string that looks like one (a hash
with ``3e123`` in it) only costs time. Only a document that holds one is parsed
with the per-number check (``_finite_float``), which costs a Python call per number; NaN and Infinity are
refused by ``parse_constant`` either way."""


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"holds the number {text[:40]}, which is out of range for float64")
    return value


def _object(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:  # parsers differ on which of two equal keys wins: refuse the ambiguity
            raise ValueError(f"has a duplicate key {key[:60]!r}")
        out[key] = value
    return out


def _depth_over(doc, max_depth: int) -> bool:
    """Whether ``doc`` nests lists and objects deeper than ``max_depth`` (one level at a time, no recursion)."""
    level, depth = [doc] if isinstance(doc, (dict, list)) else [], 0
    while level:
        depth += 1
        if depth > max_depth:
            return True
        level = [v for c in level for v in (c.values() if isinstance(c, dict) else c) if isinstance(v, (dict, list))]
    return False


def loads_json(data, *, max_depth: int = MAX_DEPTH, path=None):
    """The strict JSON document in ``data`` (bytes), or ``FileError`` saying why it is not one.

    UTF-8, standard JSON (no NaN or Infinity, no number beyond float64, no integer of more digits
    than Python converts), no duplicate keys, at most ``max_depth`` levels of nesting. ``path``
    names the file in the message. ``TypeError`` for ``data`` that is not ``bytes``/``bytearray``.
    """
    _check_count(max_depth, "max_depth", 1)
    if not isinstance(data, (bytes, bytearray)):
        raise TypeError(f"data must be bytes (a file's content), got {type(data).__name__}; "
                        "read the file in binary mode, or encode a str as UTF-8")
    if not data:
        raise FileError(path, "is empty (0 bytes)")
    try:
        text = bytes(data).decode("utf-8")
    except UnicodeDecodeError as err:
        raise FileError(path, f"is not UTF-8 text (byte {err.start}: {bytes(data[err.start:err.start + 1])!r})") from None
    try:
        floats = {"parse_float": _finite_float} if _MAY_OVERFLOW.search(text) else {}
        doc = json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_object, **floats)
    except RecursionError:  # the parser's own limit, about a thousand levels: refused, deep as it is
        raise FileError(path, f"nests lists and objects deeper than {max_depth} levels") from None
    except json.JSONDecodeError as err:
        raise FileError(path, f"is not valid JSON ({err.msg} at line {err.lineno} column {err.colno}; truncated?)") from None
    except ValueError as err:  # ours above, or an integer of more digits than Python converts
        reason = str(err)
        raise FileError(path, reason if reason.startswith(("holds", "has")) else f"is not JSON this tool reads ({reason[:120]})") from None
    if _depth_over(doc, max_depth):
        raise FileError(path, f"nests lists and objects deeper than {max_depth} levels")
    return doc


def read_json(path, *, limit: int = MAX_BYTES, max_depth: int = MAX_DEPTH):
    """``loads_json(read_bytes(path, limit=limit), max_depth=max_depth)``, errors naming ``path``."""
    return loads_json(read_bytes(path, limit=limit), max_depth=max_depth, path=check_path(path))


def write_atomic(path, data) -> None:
    """Write ``data`` (bytes, or str as UTF-8) to ``path`` through a temp file and a rename.

    The temp file (``.<name>.<pid>.<random>.tmp`` beside ``path``) is flushed to disk before it
    replaces ``path``, and removed if anything fails. Raises ``OSError`` of the same kind, naming
    ``path`` and the reason (a full disk: "No space left on device"), with the old file untouched.
    """
    path = check_path(path)
    if not isinstance(data, (str, bytes, bytearray)):
        raise TypeError(f"data must be bytes or str, got {type(data).__name__}")
    data = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    directory, name = os.path.split(os.path.abspath(path))
    tmp = os.path.join(directory, f".{name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    except OSError as err:
        raise cannot_write(err, path) from None
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as err:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        if isinstance(err, OSError):
            raise cannot_write(err, path) from None
        raise


def cannot_write(err: OSError, path) -> OSError:
    """``err`` as the same kind of ``OSError`` whose message names the file that could not be written."""
    return type(err)(err.errno, f"cannot write {path}: {err.strerror or err}")
