"""Test a port of a position scheme against the minipos golden vectors.

Standalone: needs Python and NumPy only, not minipos. Copy this file next to the vectors (or
point ``directory`` at them) and, from your test suite::

    from check_port import run_family, assert_family

    def my_apply_rope(x, positions, layout, base, rotary_dim, attention_factor, inv_freq=None, scaling=None):
        ...                                   # your implementation, returning an array

    assert_family("rope", my_apply_rope)                          # raises listing every failed case
    report = run_family("rope", my_apply_rope, precision="float32", cast=True)   # or inspect the report

Each case calls ``fn(**inputs, **params)``: the case's input arrays (as NumPy arrays of the
recorded dtype) and its parameters (JSON values) as keyword arguments, bound this way:

- an input whose name is not a Python identifier is passed under one that is, each character
  other than a letter, digit or ``_`` replaced by ``_``: ``scheme.table`` -> ``scheme_table``,
  ``scheme.w_k`` -> ``scheme_w_k`` (a layer's learned scheme parameters);
- a parameter of the same name as an input gives way to the input: ``local_global``'s ``sinks``
  is a flag in ``params`` and, when true, the ``(H,)`` sink logits in ``inputs``, so ``fn`` gets
  the array, or ``False`` in a case without sinks;
- ``output_gradient="g"`` passes the output gradient of a gradient family (``dout``, ``dy`` or
  ``dbias``, by family: ``OUTPUT_GRADIENT``) as ``g``, so one backward signature serves every
  family; families not in ``OUTPUT_GRADIENT`` are bound as they are;
- ``cast=True`` converts the floating-point inputs to the dtype of ``precision`` first (a
  ``"float32"`` run then hands ``fn`` float32 arrays; integers and booleans are left alone).

``fn`` returns the outputs: a dict ``{output name: array}`` (a dotted name such as
``scheme.w_k`` may be given as the identifier ``scheme_w_k``), a tuple in the order of the
case's ``expected``, or a single array when the case has one output. Anything with ``__array__``
(a torch tensor on the CPU, say) is accepted. Raise ``NotImplementedError`` to skip a case your
port does not support; any other exception fails that case (reported with the error) and the
family goes on. ``adapt`` (optional) maps ``(inputs, params)`` to the keyword arguments of
``fn``, for ports whose signature differs from minipos; it gets the inputs under their recorded
names (after ``cast`` and ``output_gradient``) and its result is passed as it is. The comparison
is ``|got - expected| <= atol + rtol * |expected|`` with the case's tolerance for ``precision``
(``"float64"`` or ``"float32"``), only where the case's ``where`` mask is true.

A failed output is one line: how many values differ, the largest ``|got - expected|``, the
tolerance, and the first few differing values by their meaning (``n = -206`` for a T5 bucket,
``h = 0, t = 3, s = 5`` for a bias, with the positions the case gives), or by flat index where
the output's axes are not named here. A file of another major ``spec_version`` is refused.

A file is read as untrusted, before any case runs: only a regular file (a FIFO or a device is
refused at once, never read), at most ``MAX_FILE_BYTES``, strict JSON (UTF-8, no NaN or Infinity,
no duplicate key, at most ``MAX_DEPTH`` levels), and every case checked against the format: its
arrays (dtype ``float64``/``int64``/``bool``, a shape whose product is the length of ``data``),
its ``where`` masks (boolean, of their output's shape, comparing at least one value), and its
tolerances (finite, from 0 to ``MAX_TOLERANCE``). Each refusal is a ``ValueError`` or ``TypeError``
naming the file, the case and the field. A port that returns complex values fails its case: the
spec's outputs are real.

The same logic in any language: read the JSON, build arrays from ``dtype``/``shape``/``data``
(row-major), call your function, compare as above (see README.md)."""

from __future__ import annotations

import json
import math
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

VECTORS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "vectors")
SPEC_MAJOR = 1   # the major spec_version this checker reads
SHOWN = 3        # differing values shown per failed output
MAX_FILE_BYTES = 64 * 2**20   # a family file above this is refused before it is read
MAX_DEPTH = 64                # levels of JSON nesting (the format needs under 10)
MAX_TOLERANCE = {"float64": 1e-6, "float32": 1e-2}   # the largest rtol and atol a case may carry
DTYPES = ("float64", "int64", "bool")                 # the dtypes an array may name
MAX_NDIM, MAX_VALUES = 32, 1 << 22                    # dims and values of one array

# The trailing axes of each output, by letter: b batch, h head, t query, s key, d feature, k bucket,
# c relative-table row, p table row, i pair, n / r a relative position read from the input of that
# name. Axes before them (a leading batch, say) are shown as a plain index.
AXES = {
    "sinusoidal_table": {"table": "td"},
    "alibi_slopes": {"slopes": "h"},
    "alibi_bias": {"bias": "hts"},
    "alibi_bias_key_only": {"bias": "hts"},
    "t5_bucket": {"bucket": "n"},
    "t5_bias": {"bias": "hts"},
    "rel_shift": {"out": "ts"},
    "xl_scores": {"relative_embeddings": "sd", "scores": "hts"},
    "deberta_relative_position": {"relative_pos": "ts"},
    "deberta_log_bucket": {"bucket": "r"},
    "deberta_scores": {"scores": "hts"},
    "rope": {"out": "td"},
    "rope_scaling": {"inv_freq": "i"},
    "xpos": {"out": "td"},
    "rope_scores": {"scores": "hts"},
    "xpos_scores": {"scores": "hts"},
    "layer": {"y": "btd"},
    "attention_grad": {"out": "htd", "lse": "ht", "dq": "htd", "dk": "hsd", "dv": "hsd", "dbias": "hts"},
    "rope_grad": {"dx": "td"},
    "t5_grad": {"dtable": "kh"},
    "alibi_grad": {"dslopes": "h"},
    "rel_shift_grad": {"dx": "ts"},
    "xl_grad": {"dq": "htd", "dk": "hsd", "dr": "hsd", "du": "hd", "dv": "hd"},
    "deberta_grad": {"dq": "htd", "dk": "hsd", "dpos_key": "hcd", "dpos_query": "hcd"},
    "xpos_grad": {"dx": "td"},
    "learned_grad": {"dtable": "pd"},
    "layer_grad": {"x": "btd"},
    "mrope": {"out": "td"},
    "mrope_grad": {"dx": "td"},
    "mrope_positions": {"positions": "t"},
    "mrope_layer": {"y": "btd"},
    "mrope_layer_grad": {"x": "btd"},
    "shaw_logits": {"logits": "hts"},
    "shaw_values": {"out": "htd"},
    "shaw_layer": {"y": "btd"},
    "shaw_layer_grad": {"x": "btd", "scheme.w_k": "cd", "scheme.w_v": "cd"},
    "irope_layer": {"y": "btd"},
    "irope_layer_grad": {"x": "btd"},
    "local_global": {"y": "btd"},
    "local_global_grad": {"x": "btd", "sinks": "h"},
    "mla": {"y": "btd"},
    "mla_grad": {"x": "btd"},
    "axial_rope": {"out": "htd"},
    "axial_rope_grad": {"dx": "htd", "dclass_angles": "i"},
    "inkling": {"y": "btd"},
    "inkling_grad": {"x": "btd", "x_k": "btd", "x_v": "btd"},
}
POSITIONS = {"t": ("positions", "q_positions"), "s": ("k_positions",)}   # inputs that give an axis' positions
VALUES = {"n": "relative_position", "r": "relative_pos"}                 # axes named by an input's value

# The input that carries the gradient of the output, by gradient family (``output_gradient=``
# binds it under one name): ``dout`` of a kernel's output or of scores, ``dy`` of a rotated input or
# of a layer's output, ``dbias`` of an additive bias.
OUTPUT_GRADIENT = {
    "attention_grad": "dout",
    "rope_grad": "dy",
    "t5_grad": "dbias",
    "alibi_grad": "dbias",
    "rel_shift_grad": "dy",
    "xl_grad": "dout",
    "deberta_grad": "dout",
    "xpos_grad": "dy",
    "learned_grad": "dout",
    "layer_grad": "dy",
    "mrope_grad": "dy",
    "mrope_layer_grad": "dy",
    "shaw_layer_grad": "dy",
    "irope_layer_grad": "dy",
    "local_global_grad": "dy",
    "mla_grad": "dy",
    "axial_rope_grad": "dy",
    "inkling_grad": "dy",
}


def decode(d: dict, name: str = "array") -> np.ndarray:
    """An array from ``{"dtype", "shape", "data"}`` (data in row-major order), checked first.

    ``dtype`` one of ``DTYPES``; ``shape`` at most ``MAX_NDIM`` non-negative integers whose product,
    at most ``MAX_VALUES``, is the length of ``data``; ``data`` finite numbers for ``float64``,
    integers for ``int64``, true/false for ``bool``. Anything else raises ``ValueError`` or
    ``TypeError`` naming ``name`` and the field, before anything is allocated.
    """
    if not isinstance(d, Mapping) or set(d) != {"dtype", "shape", "data"}:
        raise TypeError(f"{name} must be an object with exactly dtype, shape and data, got "
                        f"{sorted(d) if isinstance(d, Mapping) else type(d).__name__}")
    dtype, shape, data = d["dtype"], d["shape"], d["data"]
    if dtype not in DTYPES:
        raise ValueError(f"{name}.dtype must be one of {list(DTYPES)}, got {dtype!r:.60}")
    if (not isinstance(shape, list) or len(shape) > MAX_NDIM
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)):
        raise ValueError(f"{name}.shape must be a list of at most {MAX_NDIM} non-negative integers, got {shape!r:.60}")
    count = math.prod(shape)
    if count > MAX_VALUES:
        raise ValueError(f"{name}.shape {shape} asks for {count} values, more than the {MAX_VALUES} allowed")
    if not isinstance(data, list) or len(data) != count:
        raise ValueError(f"{name}.shape {shape} holds {count} values but data has "
                         f"{len(data) if isinstance(data, list) else type(data).__name__}")
    allowed = {"float64": (int, float), "int64": (int,), "bool": (bool,)}[dtype]
    for kind in set(map(type, data)):   # a handful of types, however long the data
        if not issubclass(kind, allowed) or (dtype != "bool" and issubclass(kind, bool)):
            raise TypeError(f"{name}.data must hold only {dtype} values, got {kind.__name__}")
    try:
        arr = np.array(data, dtype=dtype)
    except OverflowError:
        raise ValueError(f"{name}.data holds an integer out of range for int64") from None
    if dtype == "float64" and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}.data must be finite, got NaN or inf")
    return arr.reshape(shape)


def _read(path: str) -> bytes:
    """The bytes of ``path``: a regular file of at most ``MAX_FILE_BYTES``, opened without blocking
    (a FIFO cannot hang the open) and refused, unread, if it is anything else."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0))
    except IsADirectoryError:
        raise ValueError(f"{path} is not a regular file (a directory)") from None
    except FileNotFoundError:
        raise
    except OSError as err:
        raise ValueError(f"{path} cannot be opened ({err.strerror or err})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = next((k for test, k in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                                           (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                                           (stat.S_ISSOCK, "a socket")) if test(info.st_mode)), "not a file")
            raise ValueError(f"{path} is not a regular file ({kind})")
        if info.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{path} is {info.st_size} bytes, more than the {MAX_FILE_BYTES} bytes a vectors file may have")
        data = os.read(fd, MAX_FILE_BYTES + 1)
        while len(data) <= MAX_FILE_BYTES:
            more = os.read(fd, MAX_FILE_BYTES + 1 - len(data))
            if not more:
                break
            data += more
    finally:
        os.close(fd)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{path} grew while it was read to more than the {MAX_FILE_BYTES} bytes allowed")
    return data


def _no_constant(name: str):
    raise ValueError(f"holds {name}, which is not JSON")


def _unique(pairs: list) -> dict:
    out = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"has a duplicate key {key!r:.60}")
        out[key] = value
    return out


def _parse(data: bytes, path: str):
    """The strict JSON document in ``data`` (``ValueError`` naming ``path`` and the reason)."""
    if not data:
        raise ValueError(f"{path} is empty (0 bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path} is not UTF-8 text (byte {err.start})") from None
    try:
        doc = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_unique)
    except RecursionError:
        raise ValueError(f"{path} nests lists and objects deeper than {MAX_DEPTH} levels") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err.msg} at line {err.lineno} column {err.colno}; "
                         "truncated?)") from None
    except ValueError as err:   # NaN, a duplicate key, an integer of too many digits
        raise ValueError(f"{path} {str(err)[:160]}") from None
    level, depth = [doc], 0
    while level:                # one level at a time: no recursion, whatever the depth
        depth += 1
        if depth > MAX_DEPTH:
            raise ValueError(f"{path} nests lists and objects deeper than {MAX_DEPTH} levels")
        level = [v for c in level if isinstance(c, (dict, list)) for v in (c.values() if isinstance(c, dict) else c)
                 if isinstance(v, (dict, list))]
    return doc


def _check_tolerance(tol, label: str) -> None:
    if not isinstance(tol, Mapping) or not set(MAX_TOLERANCE) <= set(tol):
        raise ValueError(f"{label}: tolerance must be an object with float64 and float32, got {tol!r:.80}")
    for precision, cap in MAX_TOLERANCE.items():
        t = tol[precision]
        for key in ("rtol", "atol"):
            value = t.get(key) if isinstance(t, Mapping) else None
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= cap:
                raise ValueError(f"{label}: tolerance.{precision}.{key} must be a number from 0 to {cap}, "
                                 f"got {value!r:.40}")


def check_case(case, label: str = "case") -> None:
    """Raise ``ValueError``/``TypeError`` naming ``label`` and the field unless ``case`` is a case of the
    format: a name, params, input and expected arrays, tolerances within ``MAX_TOLERANCE``, and ``where``
    masks that are boolean, of their output's shape, and compare at least one value each."""
    if not isinstance(case, Mapping):
        raise TypeError(f"{label} must be an object, got {type(case).__name__}")
    for key, kind in (("name", str), ("params", Mapping), ("inputs", Mapping), ("expected", Mapping)):
        if not isinstance(case.get(key), kind):
            raise ValueError(f"{label}: {key} must be {'a str' if kind is str else 'an object'}, got "
                             f"{'nothing' if key not in case else type(case[key]).__name__}")
    if not case["expected"]:
        raise ValueError(f"{label}: expected must name at least one output")
    _check_tolerance(case.get("tolerance"), label)
    for group in ("inputs", "expected"):
        for name, value in case[group].items():
            decode(value, f"{label}: {group}.{name}")
    where = case.get("where", {})
    if not isinstance(where, Mapping):
        raise ValueError(f"{label}: where must be an object, got {type(where).__name__}")
    for name, value in where.items():
        if name not in case["expected"]:
            raise ValueError(f"{label}: where.{name} masks an output that expected does not have")
        mask = decode(value, f"{label}: where.{name}")
        shape = list(case["expected"][name]["shape"])
        if mask.dtype != bool or list(mask.shape) != shape:
            raise ValueError(f"{label}: where.{name} must be a bool array of shape {shape}, got {mask.dtype} "
                             f"{list(mask.shape)}")
        if mask.size and not mask.any():
            raise ValueError(f"{label}: where.{name} masks out every value of expected.{name}")


def load_family(family: str, directory: str | None = None) -> dict:
    """The JSON document of ``family`` from ``directory`` (default: ``vectors/`` next to this file).

    Raises ``TypeError``/``ValueError`` naming the argument, the file or the case: a family name that
    is not one (``^[a-z0-9_]+$``), a missing file or directory, a file that is not a minipos vectors
    file of a major ``spec_version`` this checker reads, or that breaks the format (see the module
    docstring: ``check_case``).
    """
    if not isinstance(family, str):
        raise TypeError(f"family must be a family name (str), got {type(family).__name__}")
    if not re.fullmatch(r"[a-z0-9_]+", family):
        raise ValueError(f"family must be a family name such as 'rope' (a-z, 0-9, _), got {family!r:.60}")
    if directory is not None and (not isinstance(directory, (str, os.PathLike))
                                  or not isinstance(os.fspath(directory), str)):
        raise TypeError(f"directory must be a path (str or os.PathLike), got {type(directory).__name__}")
    directory = VECTORS if directory is None else os.fspath(directory)
    if not os.path.isdir(directory):
        raise ValueError(f"directory {directory!r} does not exist or is not a directory")
    path = os.path.join(directory, f"{family}.json")
    try:
        doc = _parse(_read(path), path)
    except FileNotFoundError:
        there = sorted(n[:-5] for n in os.listdir(directory) if n.endswith(".json") and not n.startswith("."))
        raise ValueError(f"no vectors file for family {family!r} in {directory} (it has "
                         f"{', '.join(there[:8]) + (', ...' if len(there) > 8 else '') or 'none'})") from None
    if not isinstance(doc, dict) or doc.get("format") != "minipos-vectors":
        raise ValueError(f"{path} is not a minipos vectors file (format must be 'minipos-vectors')")
    version = str(doc.get("spec_version", ""))
    if version.split(".")[0] != str(SPEC_MAJOR):
        raise ValueError(f"{path} has spec_version {version!r}; this check_port.py reads {SPEC_MAJOR}.x "
                         "(a newer major version may change what the fields mean: get its check_port.py)")
    cases = doc.get("cases")
    if not isinstance(cases, list) or not cases:
        raise ValueError(f"{path}: cases must be a non-empty list of cases, got "
                         f"{'nothing' if cases is None else repr(cases)[:40]}")
    for i, case in enumerate(cases):
        name = case.get("name") if isinstance(case, Mapping) else None
        check_case(case, f"{path}: case {name!r}" if isinstance(name, str) else f"{path}: cases[{i}]")
    return doc


@dataclass
class Report:
    """What ``run_family`` found: cases passed, skipped and failed, and one line per failed output."""

    family: str
    passed: list = field(default_factory=list)
    skipped: list = field(default_factory=list)
    failed: list = field(default_factory=list)
    mismatches: list = field(default_factory=list)

    def __str__(self) -> str:
        head = (f"{self.family}: {len(self.passed)} passed, {len(self.skipped)} skipped, "
                f"{len(self.failed)} failed")
        return "\n".join([head] + self.mismatches)


def _outputs(result, names: list) -> dict:
    """The port's result as ``{output name: array}``."""
    if isinstance(result, dict):
        got = {k: np.asarray(v) for k, v in result.items()}
        for name in names:   # a dotted output given under its identifier
            if name not in got and identifier(name) in got:
                got[name] = got[identifier(name)]
        return got
    if isinstance(result, tuple):
        return {k: np.asarray(v) for k, v in zip(names, result)}
    return {names[0]: np.asarray(result)}


def _name_index(family: str, output: str, index: tuple, shape: tuple, inputs: dict) -> str:
    """``index`` into ``output`` (of ``shape``) in words: ``h = 0, t = 3 (position 7), s = 5``, or a flat index."""
    letters = AXES.get(family, {}).get(output)
    if letters is None or len(letters) > len(index):
        return f"flat index {int(np.ravel_multi_index(index, shape))}" if shape else "the value"
    lead, named = index[:len(index) - len(letters)], index[len(index) - len(letters):]
    words = [f"[{', '.join(map(str, lead))}]"] if lead else []
    for letter, i in zip(letters, named):
        if letter in VALUES and VALUES[letter] in inputs:
            words.append(f"{letter} = {np.ravel(inputs[VALUES[letter]])[i]}")
            continue
        word = f"{letter} = {i}"
        for source in POSITIONS.get(letter, ()):
            pos = inputs.get(source)
            if pos is not None and np.ndim(pos) == 1 and i < len(pos):
                word += f" (position {pos[i]})"
                break
        words.append(word)
    return ", ".join(words)


def _compare(family: str, label: str, output: str, expected: np.ndarray, got: np.ndarray, tol: dict, mask,
             inputs: dict) -> list:
    """One line for an output that fails (empty if it passes)."""
    if got.shape != expected.shape:
        return [f"{label}: shape {list(got.shape)}, expected {list(expected.shape)}"]
    if np.iscomplexobj(got) or (got.dtype == object and any(isinstance(v, complex) for v in got.ravel())):
        return [f"{label}: the port returned complex values (dtype {got.dtype}); the spec's outputs are real"]
    e, g = expected.astype(np.float64), got.astype(np.float64)
    with np.errstate(invalid="ignore"):
        error = np.abs(g - e)
        bad = ~(error <= tol["atol"] + tol["rtol"] * np.abs(e))   # NaN is a mismatch
    compared = np.ones(e.shape, bool) if mask is None else mask
    bad &= compared
    if not bad.any():
        return []
    worst = error[bad]
    worst = "NaN" if np.isnan(worst).any() else f"{worst.max():.6g}"
    shown = [f"{_name_index(family, output, tuple(idx), e.shape, inputs)}: expected {expected[tuple(idx)].item()!r}, "
             f"got {got[tuple(idx)].item()!r}" for idx in np.argwhere(bad)[:SHOWN].tolist()]
    more = "; ..." if bad.sum() > SHOWN else ""
    return [f"{label}: {int(bad.sum())} of {int(compared.sum())} values differ, max |got - expected| {worst} "
            f"(tolerance atol {tol['atol']:g} + rtol {tol['rtol']:g} |expected|); " + "; ".join(shown) + more]


def identifier(name: str) -> str:
    """The keyword an input ``name`` is bound as: ``scheme.table`` -> ``scheme_table``.

    Each character other than an ASCII letter, digit or ``_`` becomes ``_``; an identifier is
    left as it is.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be an input name (str), got {type(name).__name__}")
    return re.sub(r"[^0-9A-Za-z_]", "_", name)


def bind(inputs: dict, params: dict) -> dict:
    """The keyword arguments of ``fn`` for a case: ``params``, then each input under its
    ``identifier`` (an input wins over a parameter of the same name).

    Raises ``ValueError`` when two inputs would be bound under one name.
    """
    kwargs = dict(params)
    for name, value in inputs.items():
        key = identifier(name)
        if key != name and key in inputs:
            raise ValueError(f"inputs {name!r} and {key!r} would both be bound as {key!r}")
        kwargs[key] = value
    return kwargs


def _prepare(family: str, inputs: dict, precision: str, cast: bool, output_gradient) -> dict:
    """The case's inputs after ``cast`` (floats to ``precision``) and ``output_gradient`` (the
    family's ``OUTPUT_GRADIENT`` input renamed), under their recorded names otherwise."""
    if cast:
        inputs = {k: v.astype(precision) if np.issubdtype(v.dtype, np.floating) else v for k, v in inputs.items()}
    source = OUTPUT_GRADIENT.get(family)
    if output_gradient is not None and source in inputs and output_gradient != source:
        if output_gradient in inputs:
            raise ValueError(f"output_gradient {output_gradient!r} is already an input of this case")
        inputs = {(output_gradient if k == source else k): v for k, v in inputs.items()}
    return inputs


def _check_options(precision, cast, output_gradient, fn=None, adapt=None) -> None:
    if not callable(fn):
        raise TypeError(f"fn must be your port's function (a callable), got {type(fn).__name__}")
    if adapt is not None and not callable(adapt):
        raise TypeError(f"adapt must be None or a callable (inputs, params) -> keyword arguments, got "
                        f"{type(adapt).__name__}")
    if precision not in ("float64", "float32"):
        raise ValueError(f"precision must be 'float64' or 'float32', got {precision!r}")
    if not isinstance(cast, bool):
        raise TypeError(f"cast must be True or False, got {cast!r}")
    if output_gradient is not None and not (isinstance(output_gradient, str) and output_gradient.isidentifier()):
        raise ValueError(f"output_gradient must be None or a Python identifier, got {output_gradient!r}")


def run_case(family: str, case: dict, fn, *, precision: str = "float64", adapt=None, cast: bool = False,
             output_gradient: str | None = None) -> list | None:
    """Failure lines of one case (empty: it passes), or None when ``fn`` skips it.

    ``cast`` and ``output_gradient``: see the module docstring. An exception other than
    ``NotImplementedError`` (from the binding, ``adapt``, ``fn`` or its result) is the case's
    failure, reported as one line.
    """
    _check_options(precision, cast, output_gradient, fn, adapt)
    if not isinstance(family, str):
        raise TypeError(f"family must be a family name (str), got {type(family).__name__}")
    check_case(case, f"case {case.get('name')!r} of {family}" if isinstance(case, Mapping) else "case")
    inputs = {k: decode(v) for k, v in case["inputs"].items()}
    label = f"{family}/{case['name']}"
    try:
        given = _prepare(family, inputs, precision, cast, output_gradient)
        kwargs = adapt(given, case["params"]) if adapt else bind(given, case["params"])
        if not isinstance(kwargs, Mapping):
            raise TypeError(f"adapt must return a dict of keyword arguments, got {type(kwargs).__name__}")
        got = _outputs(fn(**kwargs), list(case["expected"]))
    except NotImplementedError:
        return None
    except Exception as err:  # a port that crashes on one case fails that case; the family goes on
        return [f"{label}: raised {type(err).__name__}: {err}"]
    masks = {k: decode(v) for k, v in case.get("where", {}).items()}
    lines = []
    for name, value in case["expected"].items():
        if name not in got:
            lines.append(f"{label}: {name}: output missing")
            continue
        try:
            lines += _compare(family, f"{label}: {name}", name, decode(value), got[name],
                              case["tolerance"][precision], masks.get(name), inputs)
        except Exception as err:  # e.g. an output that is not numeric
            lines.append(f"{label}: {name}: cannot be compared ({type(err).__name__}: {err})")
    return lines


def run_family(family: str, fn, *, precision: str = "float64", directory: str | None = None,
               adapt=None, cast: bool = False, output_gradient: str | None = None) -> Report:
    """Run ``fn`` over every case of ``family``; return a ``Report`` of passes, skips and failures.

    ``cast=True``: floating-point inputs converted to ``precision`` first. ``output_gradient``:
    the name ``fn`` gets the family's output gradient under (``OUTPUT_GRADIENT``).
    """
    _check_options(precision, cast, output_gradient, fn, adapt)
    report = Report(family)
    for case in load_family(family, directory)["cases"]:
        lines = run_case(family, case, fn, precision=precision, adapt=adapt, cast=cast,
                         output_gradient=output_gradient)
        if lines is None:
            report.skipped.append(case["name"])
        elif lines:
            report.failed.append(case["name"])
            report.mismatches += lines
        else:
            report.passed.append(case["name"])
    return report


def assert_family(family: str, fn, **kwargs) -> Report:
    """``run_family``, raising ``AssertionError`` with every failure if there is one (or no case ran)."""
    report = run_family(family, fn, **kwargs)
    if report.failed or not report.passed:
        raise AssertionError(str(report))
    return report
