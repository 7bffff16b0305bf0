"""A campaign of hostile calls over the tools around the reference: ``minipos.vectors`` (parse,
codec, schema, check, export), the ``minipos`` command, ``spec/check_port.py``, the conformance
runner and report, ``python -m proofs`` and ``python -m benchmarks``.

Each row of ``CASES`` is one call and the outcome it must have (``Named``, ``Reported``, ``Ok``;
for a command line ``Usage``, ``Runs``, ``Quiet``), and ``classify`` sorts it into clear, accepted, silent,
crash or vague: both come from ``tools/hostile.py``, which ``tools/campaign.py`` shares. Every call must
be clear or accepted.

The classes of hostile input: wrong types (str, memoryview, int, None, bytes paths), wrong shapes
and dtypes, NaN and infinity, empty and huge values, unicode names, special files (a FIFO,
``/dev/zero``, a directory, a sparse file above the size cap), deep nesting, a full disk, closed
pipes, missing optional libraries, and bad flags. ``python tests/test_campaign_surfaces.py``
prints the counts and every call that is not clear or accepted.
"""

from __future__ import annotations

import copy
import json
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Callable

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
VECTORS = ROOT / "spec" / "vectors"
CONFORMANCE = ROOT / "spec" / "conformance"
for _path in (str(ROOT), str(ROOT / "spec"), str(CONFORMANCE)):
    if _path not in sys.path:
        sys.path.insert(0, _path)

import check_port  # noqa: E402
import report  # noqa: E402

from minipos import vectors  # noqa: E402
from minipos.vectors.checker import check_case  # noqa: E402
from minipos.cli import main as minipos_main  # noqa: E402
from tools.hostile import (Cli, ClosedPipe, Fails, Files, Named, Ok, Quiet, Reported, Runs, Usage,  # noqa: E402
                           benchmarks_main, classify, edited, fifo_in, on_full_disk, proofs_main, run_main,
                           run_process, sparse, written, zero_link)

FILES = Files()


CASES: list = []


def case(label: str, call: Callable, expect) -> None:
    CASES.append((label, call, expect))


def family_copy(family: str, edit=None, directory: pathlib.Path | None = None) -> pathlib.Path:
    """A directory holding ``family.json``, its document changed by ``edit(doc)`` if given."""
    directory = directory or FILES.fresh("spec")
    doc = json.loads((VECTORS / f"{family}.json").read_text())
    if edit is not None:
        edit(doc)
    (directory / f"{family}.json").write_text(json.dumps(doc))
    return directory


def full_copy(family: str | None = None, edit=None) -> pathlib.Path:
    directory = FILES.fresh("full")
    shutil.copytree(VECTORS, directory, dirs_exist_ok=True)
    if family is not None:
        family_copy(family, edit, directory)
    return directory


def is_error_free(result) -> bool:
    return result == []


def every_line_fits(width: int):
    return lambda out, err: bool(out) and max(len(line) for line in out.splitlines()) <= width


def no_rest(out, err) -> bool:
    return bool(out) and "``" not in out and ":func:" not in out and ":class:" not in out and ":meth:" not in out


DEEP = b"[" * 100_000 + b"]" * 100_000
CAP = 64 * 2**20

# --------------------------------------------------------------------------- minipos.vectors.parse

for label, data, expect in [
    ("str", '{"a": 1}', Named("bytes", (TypeError,))),
    ("memoryview", memoryview(b'{"a": 1}'), Named("bytes", (TypeError,))),
    ("int", 3, Named("bytes", (TypeError,))),
    ("None", None, Named("bytes", (TypeError,))),
    ("list", [b"{}"], Named("bytes", (TypeError,))),
    ("bytearray", bytearray(b'{"a": 1}'), Ok(lambda r: r == {"a": 1})),
    ("empty", b"", Named("empty")),
    ("whitespace", b"   \n", Named("JSON")),
    ("deep nesting", DEEP, Named("nest")),
    ("deep objects", b'{"a":' * 50_000 + b"1" + b"}" * 50_000, Named("nest")),
    ("NaN", b'{"a": NaN}', Named("NaN")),
    ("-Infinity", b'{"a": -Infinity}', Named("Infinity")),
    ("1e400", b'{"a": 1e400}', Named("1e400")),
    ("duplicate key", b'{"a": 1, "a": 2}', Named("duplicate key")),
    ("not UTF-8", b"\xff\xfe{}", Named("UTF-8")),
    ("UTF-8 BOM", b"\xef\xbb\xbf{}", Named("JSON")),
    ("5000 digits", b"1" * 5000, Named("digits")),
    ("truncated", b'{"a": [1, 2', Named("JSON")),
    ("NUL byte", b"\x00", Named("JSON")),
    ("lone surrogate", b'"\\ud800"', Ok(lambda r: isinstance(r, str))),
]:
    case(f"vectors.parse {label}", lambda data=data: vectors.parse(data), expect)

# --------------------------------------------------------------------------- encode / decode

ARRAY = {"dtype": "float64", "shape": [2], "data": [1.0, 2.0]}
for label, value, expect in [
    ("ints as float64", {**ARRAY, "data": [1, 2]}, Ok(lambda a: a.tolist() == [1.0, 2.0])),
    ("a str", "x", Named("x must be an object", (TypeError,))),
    ("a scalar", {"dtype": "float64", "shape": [], "data": [2.5]}, Ok(lambda a: a.shape == () and a == 2.5)),
    ("a huge shape", {**ARRAY, "shape": [2**62, 4]}, Named("shape")),
    ("shape None", {**ARRAY, "shape": None}, Named("shape")),
    ("shape 1.5", {**ARRAY, "shape": [1.5]}, Named("shape")),
    ("dtype None", {**ARRAY, "dtype": None}, Named("dtype")),
    ("dtype complex", {**ARRAY, "dtype": "complex128"}, Named("dtype")),
    ("data a dict", {**ARRAY, "data": {}}, Named("data")),
    ("data with a bool", {**ARRAY, "data": [1.0, True]}, Named("data")),
]:
    case(f"vectors.decode {label}", lambda value=value: vectors.decode(value, "x"), expect)

for label, value, expect in [
    ("complex", np.array([1 + 1j]), Named("complex", (TypeError,))),
    ("inf", np.array([np.inf]), Named("finite")),
    ("a str", "abc", Named("array", (TypeError,))),
    ("None", None, Named("array", (TypeError,))),
    ("ragged lists", [[1, 2], [3]], Named("array")),
    ("uint64 beyond int64", np.array(2**63, dtype=np.uint64), Named("int64")),
    ("float16", np.float16(1.5), Ok(lambda d: vectors.decode(d) == 1.5)),
    ("too many values", np.zeros(2**22 + 1), Named("values")),
]:
    case(f"vectors.encode {label}", lambda value=value: vectors.encode(value), expect)

# --------------------------------------------------------------------------- vectors.validate

for label, doc, schema, expect in [
    ("a dangling $ref", {}, {"$ref": "#/$defs/missing"}, Named("$ref")),
    ("a remote $ref", {}, {"$ref": "https://example.com/schema.json"}, Named("$ref")),
    ("a $ref loop", {}, {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}, Named("$ref")),
    ("a local $ref", 3, {"$ref": "#/$defs/n", "$defs": {"n": {"type": "integer"}}}, Ok(lambda r: r is None)),
    ("a schema that is a str", {}, "schema", Named("schema", (TypeError,))),
    ("an unknown type name", {}, {"type": "strnig"}, Named("strnig")),
    ("a broken pattern", "x", {"pattern": "("}, Named("pattern")),
    ("an unimplemented keyword", [1], {"uniqueItems": True}, Named("uniqueItems", (NotImplementedError,))),
]:
    case(f"vectors.validate {label}", lambda doc=doc, schema=schema: vectors.validate(doc, schema), expect)
case("vectors.validate the committed rope file", lambda: vectors.validate(json.loads(
    (VECTORS / "rope.json").read_text())), Ok(lambda r: r is None))


# --------------------------------------------------------------------------- vectors.check: edited files

def _case0(family, edit):
    def change(doc):
        edit(doc["cases"][0])
    return change


def _check_one(family, edit):
    return lambda: vectors.check(family_copy(family, _case0(family, edit)), [family])


for family, label, edit, words in [
    ("alibi_bias", "an extra param", lambda c: c["params"].update(foo=1), "foo"),
    ("alibi_bias", "an unexpected input", lambda c: c["inputs"].update(extra=c["inputs"]["slopes"]), "extra"),
    ("rel_shift", "an unexpected input", lambda c: c["inputs"].update(y=c["inputs"]["x"]), "'y'"),
    ("sinusoidal_table", "an extra param", lambda c: c["params"].update(scale=2.0), "scale"),
    ("alibi_slopes", "an extra param", lambda c: c["params"].update(heads=4), "heads"),
    ("rope", "an extra param", lambda c: c["params"].update(foo=1), "foo"),
    ("t5_bucket", "an extra param", lambda c: c["params"].update(foo=1), "foo"),
    ("xl_grad", "an unexpected input", lambda c: c["inputs"].update(w=c["inputs"]["u"]), "'w'"),
    ("alibi_bias", "a missing input", lambda c: c["inputs"].pop("slopes"), "slopes"),
    ("alibi_bias", "a missing input (words)", lambda c: c["inputs"].pop("slopes"), "missing"),
    ("alibi_slopes", "a missing param", lambda c: c["params"].pop("num_heads"), "missing"),
    ("layer", "a missing param", lambda c: c["params"].pop("chunks"), "chunks"),
    ("layer", "a missing param (words)", lambda c: c["params"].pop("chunks"), "missing"),
    ("layer", "a scheme name with a path", lambda c: c["params"].update(scheme="../x"), "../x"),
    ("layer", "an unknown scheme config key", lambda c: c["params"].update(scheme_config={"foo": 1}), "foo"),
    ("rope", "a wrong layout", lambda c: c["params"].update(layout=3), "layout"),
    ("alibi_slopes", "num_heads a str", lambda c: c["params"].update(num_heads="4"), "num_heads"),
    ("alibi_slopes", "num_heads 10**9", lambda c: c["params"].update(num_heads=10**9), "num_heads"),
    ("alibi_slopes", "num_heads NaN-free float", lambda c: c["params"].update(num_heads=4.0), "num_heads"),
    ("alibi_bias", "an output not computed", lambda c: c["expected"].update(zzz=c["expected"]["bias"]), "zzz"),
    ("rel_shift", "a where that masks everything",
     lambda c: c["where"]["out"].update(data=[False] * len(c["where"]["out"]["data"])), "masks out every value"),
    ("alibi_bias", "a unicode case name", lambda c: c.update(name="смещение"), "name"),
    ("alibi_bias", "a where for an unknown output", lambda c: c.update(where={"zzz": c["expected"]["bias"]}), "zzz"),
    ("alibi_bias", "an input of float dtype for positions",
     lambda c: c["inputs"].update(q_positions={"dtype": "float64", "shape": [6], "data": [0.5] * 6}), "q_positions"),
]:
    case(f"vectors.check {family}: {label}", _check_one(family, edit), Reported(words))
case("vectors.check a tolerance of -0.0", _check_one(
    "alibi_bias", lambda c: c["tolerance"]["float64"].update(atol=-0.0)), Ok(is_error_free))
case("vectors.check an untouched copy", lambda: vectors.check(family_copy("layer"), ["layer"]), Ok(is_error_free))


def _with_file(family: str, make) -> Callable:
    def call():
        directory = FILES.fresh("spec")
        make(directory / f"{family}.json")
        return vectors.check(directory, [family])
    return call


case("vectors.check a FIFO in place of a file", _with_file("rope", lambda p: os.mkfifo(p)), Reported("FIFO"))
case("vectors.check a file above the size cap", _with_file("rope", lambda p: sparse(p, CAP + 1)),
     Reported("more than"))
case("vectors.check a deeply nested file", _with_file("rope", lambda p: written(p, DEEP)), Reported("nest"))
case("vectors.check a file of NUL bytes", _with_file("rope", lambda p: sparse(p, 1000)), Reported("JSON"))
case("vectors.check a unicode family file", lambda: vectors.check(written(
    full_copy() / "ротация.json", (VECTORS / "rope.json").read_bytes()).parent), Reported("ротация"))

for label, directory, expect in [
    ("a FIFO as the directory", lambda: fifo_in(FILES.fresh(), "spec"), Named("directory")),
    ("/dev/zero as the directory", lambda: "/dev/zero", Named("directory")),
    ("an empty path", lambda: "", Named("directory")),
    ("a bytes path", lambda: b"spec/vectors", Named("directory", (TypeError,))),
    ("a missing directory", lambda: FILES.root / "missing" / "ünïcode", Named("does not exist")),
    ("a path with a NUL", lambda: "spec\x00vectors", Named("directory")),
]:
    case(f"vectors.check {label}", lambda directory=directory: vectors.check(directory(), ["rope"]), expect)

for label, families, expect in [
    ("a tuple of families", ("rope",), Ok(is_error_free)),
    ("an iterator of families", iter(["rope", "xpos"]), Ok(is_error_free)),
    ("bytes family names", [b"rope"], Named("families", (TypeError,))),
    ("an upper-case family", ["ROPE"], Named("families")),
    ("a family with a path", ["../rope"], Named("families")),
    ("a dict of families", {"rope": 1}, Ok(is_error_free)),
]:
    case(f"vectors.check {label}", lambda families=families: vectors.check(VECTORS, families), expect)

ROPE_CASE = json.loads((VECTORS / "rope.json").read_text())["cases"][0]
for label, args, expect in [
    ("precision float16", ("rope", ROPE_CASE, "float16"), Named("precision")),
    ("a case that is a str", ("rope", "case"), Named("case")),
    ("an unknown family", ("nope_family", ROPE_CASE), Named("family")),
    ("a committed case", ("rope", ROPE_CASE), Ok(is_error_free)),
    ("a case with an extra param", ("rope", {**ROPE_CASE, "params": {**ROPE_CASE["params"], "zz": 1}}), Reported("zz")),
    ("a case without inputs", ("rope", {k: v for k, v in ROPE_CASE.items() if k != "inputs"}), Named("inputs")),
]:
    case(f"vectors.check_case {label}", lambda args=args: check_case(*args), expect)

for label, doc, expect in [
    ("None", None, Reported("object")),
    ("a family that is an int", {"family": 3}, Reported("format")),
    ("the committed alibi_slopes", json.loads((VECTORS / "alibi_slopes.json").read_text()), Ok(is_error_free)),
]:
    case(f"vectors.check_document {label}", lambda doc=doc: vectors.check_document(doc), expect)

for label, call, expect in [
    ("into a FIFO", lambda: vectors.export(fifo_in(FILES.fresh(), "out")), Named("not a directory")),
    ("into /dev/null", lambda: vectors.export("/dev/null"), Named("not a directory")),
    ("into an empty path", lambda: vectors.export(""), Named("directory")),
    ("into a path with a NUL", lambda: vectors.export(str(FILES.fresh()) + "/a\x00b"), Named("directory")),
    ("one family into a new directory", lambda: vectors.export(FILES.fresh() / "new", ["alibi_slopes"]),
     Ok(lambda paths: len(paths) == 1 and os.path.isfile(paths[0]))),
    ("a family name with spaces", lambda: vectors.family_cases("rope "), Named("rope ")),
    ("a family name None", lambda: vectors.build_family(None), Named("name", (TypeError,))),
]:
    case(f"vectors.export {label}", call, expect)


case("vectors.export onto a full disk", on_full_disk(lambda: vectors.export(FILES.fresh() / "out", ["alibi_slopes"])),
     Named("No space left on device", (OSError,)))

# --------------------------------------------------------------------------- the minipos command: vectors

for label, argv, expect in [
    ("no subcommand", ["vectors"], Usage("vectors")),
    ("an empty directory argument", ["vectors", "check", ""], Usage("directory")),
    ("a missing directory", ["vectors", "check", str(FILES.root / "nope")], Usage("does not exist")),
    ("/dev/zero", ["vectors", "check", "/dev/zero"], Usage("/dev/zero")),
    ("vectors check with an extra argument", ["vectors", "check", str(VECTORS), "extra"], Usage("extra")),
    ("a bad flag", ["vectors", "check", "--bogus", str(VECTORS)], Usage("--bogus")),
    ("an unknown subcommand", ["vectors", "frobnicate"], Usage("frobnicate")),
    ("export to an empty path", ["vectors", "export", ""], Usage("directory")),
    ("export to /dev/null", ["vectors", "export", "/dev/null"], Usage("/dev/null")),
    ("a unicode directory", ["vectors", "check", str(FILES.root / "ünï∂")], Usage("ünï∂")),
    ("a NUL in the path", ["vectors", "export", "a\x00b"], Usage("directory")),
]:
    case(f"minipos {label}", lambda argv=argv: run_main(minipos_main, argv), expect)
case("minipos vectors check a FIFO directory", lambda: run_main(
    minipos_main, ["vectors", "check", str(fifo_in(FILES.fresh(), "d"))]), Usage("not a directory"))
case("minipos vectors export into a FIFO", lambda: run_main(
    minipos_main, ["vectors", "export", str(fifo_in(FILES.fresh(), "d"))]), Usage("not a directory"))
case("minipos vectors check an extra param", lambda: run_main(minipos_main, ["vectors", "check", str(full_copy(
    "alibi_bias", _case0("alibi_bias", lambda c: c["params"].update(foo=1))))]),
     Fails(lambda out, err: "foo" in out + err))       # a report, a line a family: the failing one names foo
case("minipos vectors export onto a full disk", on_full_disk(lambda: run_main(
    minipos_main, ["vectors", "export", str(FILES.fresh() / "out")])), Usage("No space left on device"))

# --------------------------------------------------------------------------- the minipos command: tour and help

TOUR = ["tour", "--d-model", "8", "--heads", "2", "--seq-len", "4"]
for label, argv, expect in [
    ("--d-model abc", ["tour", "--d-model", "abc"], Usage("--d-model")),
    ("--d-model 1e3", ["tour", "--d-model", "1e3"], Usage("--d-model")),
    ("--seed nan", ["tour", "--seed", "nan"], Usage("--seed")),
    ("--heads inf", ["tour", "--heads", "inf"], Usage("--heads")),
    ("--seq-len -5", ["tour", "--seq-len", "-5"], Usage("--seq-len")),
    ("--seq-len 10**23", ["tour", "--seq-len", "9" * 23], Usage("--seq-len")),
    ("--seq-len empty", ["tour", "--seq-len", ""], Usage("--seq-len")),
    ("--bogus", ["tour", "--bogus"], Usage("--bogus")),
    ("an extra argument", ["tour", "extra"], Usage("extra")),
    ("an unknown command", ["frobnicate"], Usage("frobnicate")),
    ("Arabic-Indic digits", ["tour", "--d-model", "٨", "--heads", "2", "--seq-len", "4"],
     Runs(lambda out, err: "nope" in out)),
    ("--json", [*TOUR, "--json"], Runs(lambda out, err: len(json.loads(out)["schemes"]) > 10)),
    ("the smallest tour", ["tour", "--d-model", "2", "--heads", "1", "--seq-len", "1"],
     Runs(lambda out, err: "rope" in out)),
    ("no arguments", [], Runs(no_rest)),
    ("--help", ["--help"], Runs(no_rest)),
    ("tour --help", ["tour", "--help"], Runs(no_rest)),
    ("vectors --help", ["vectors", "--help"], Runs(no_rest)),
    ("vectors check --help", ["vectors", "check", "--help"], Runs(no_rest)),
    ("vectors export --help", ["vectors", "export", "--help"], Runs(no_rest)),
    ("--version", ["--version"], Runs(lambda out, err: "minipos" in out)),
]:
    case(f"minipos {label}", lambda argv=argv: run_main(minipos_main, argv), expect)

for columns in (80, 100, 120):
    case(f"minipos tour at {columns} columns", lambda columns=columns: run_main(
        minipos_main, TOUR, env={"COLUMNS": str(columns)}), Runs(every_line_fits(columns)))
case("minipos tour at 80 columns explains every no", lambda: run_main(minipos_main, TOUR, env={"COLUMNS": "80"}),
     Runs(lambda out, err: "no:" in out or "no =" in out or "\"no\"" in out or "no means" in out))


def _damaged_measurements(text: str):
    """The tour with ``minipos/data/lab_measured.json`` replaced by ``text``."""
    def call():
        from importlib import resources
        package = FILES.fresh("package")
        written(package / "data" / "lab_measured.json", text)
        real = resources.files
        resources.files = lambda name: package if name == "minipos" else real(name)
        try:
            return run_main(minipos_main, TOUR)
        finally:
            resources.files = real
    return call


_MEASURED = json.loads((ROOT / "minipos" / "data" / "lab_measured.json").read_text())
for label, text in [
    ("not JSON", "{"),
    ("an empty object", "{}"),
    ("deep nesting", DEEP.decode()),
    ("a mean that is a str", json.dumps(edited(_MEASURED, lambda m: m["schemes"]["rope"]["markov_excess"]["64"].update(
        mean="x")))),
    ("no schemes", json.dumps({k: v for k, v in _MEASURED.items() if k != "schemes"})),
    ("lengths that are not a list", json.dumps({**_MEASURED, "lengths": 64})),
]:
    case(f"minipos tour with damaged lab measurements: {label}", _damaged_measurements(text),
         Usage("lab_measured.json"))

# --------------------------------------------------------------------------- spec/check_port.py


def alibi_bias(slopes, q_positions, k_positions, *, symmetric):     # the spec's -m (i - j), or -m |i - j|
    rel = np.subtract.outer(q_positions, k_positions).astype(float)
    return -slopes[:, None, None] * (np.abs(rel) if symmetric else rel)


def _port_report(report_) -> str:
    return "\n".join(report_.mismatches)


def _port(family: str, fn, edit=None, **kw) -> Callable:
    return lambda: check_port.run_family(family, fn, directory=str(family_copy(family, edit)), **kw)


def _port_file(family: str, make) -> Callable:
    def call():
        directory = FILES.fresh("port")
        make(directory / f"{family}.json")
        return check_port.run_family(family, alibi_bias, directory=str(directory))
    return call


for label, fn, expect in [
    ("complex outputs", lambda **kw: alibi_bias(**kw) + 1e-3j, Reported("complex", _port_report)),
    ("complex outputs with zero imaginary part", lambda **kw: alibi_bias(**kw).astype(complex),
     Reported("complex", _port_report)),
    ("str outputs", lambda **kw: np.full(alibi_bias(**kw).shape, "a"), Reported("bias", _port_report)),
    ("None", lambda **kw: None, Reported("bias", _port_report)),
    ("a wrong shape", lambda **kw: alibi_bias(**kw)[0], Reported("shape", _port_report)),
    ("NaN", lambda **kw: alibi_bias(**kw) * np.nan, Reported("NaN", _port_report)),
    ("inf", lambda **kw: alibi_bias(**kw) + np.inf, Reported("inf", _port_report)),
    ("a dict without the output", lambda **kw: {"other": alibi_bias(**kw)}, Reported("missing", _port_report)),
    ("an empty tuple", lambda **kw: (), Reported("missing", _port_report)),
    ("a bool array", lambda **kw: alibi_bias(**kw) > 0, Reported("bias", _port_report)),
    ("an object array of the right floats", lambda **kw: alibi_bias(**kw).astype(object),
     Ok(lambda r: len(r.passed) == 4 and not r.failed)),
    ("the right port", alibi_bias, Ok(lambda r: len(r.passed) == 4 and not r.failed)),
]:
    case(f"check_port a port returning {label}", _port("alibi_bias", fn), expect)

for label, kwargs, expect in [
    ("fn None", dict(fn=None), Named("fn", (TypeError,))),
    ("adapt 3", dict(fn=alibi_bias, adapt=3), Named("adapt", (TypeError,))),
    ("adapt returning a list", dict(fn=alibi_bias, adapt=lambda i, p: [1]), Reported("adapt", _port_report)),
    ("precision float16", dict(fn=alibi_bias, precision="float16"), Named("precision")),
    ("precision None", dict(fn=alibi_bias, precision=None), Named("precision")),
    ("cast 'yes'", dict(fn=alibi_bias, cast="yes"), Named("cast", (TypeError,))),
    ("output_gradient '1x'", dict(fn=alibi_bias, output_gradient="1x"), Named("output_gradient")),
    ("output_gradient 3", dict(fn=alibi_bias, output_gradient=3), Named("output_gradient")),
]:
    case(f"check_port run_family {label}", lambda kwargs=kwargs: check_port.run_family(
        "alibi_bias", directory=str(family_copy("alibi_bias")), **kwargs), expect)

for label, args, expect in [
    ("an unknown family", ("nope_family", str(VECTORS)), Named("nope_family")),
    ("a family with a path", ("../vectors/rope", str(VECTORS)), Named("family")),
    ("a family that is an int", (3, str(VECTORS)), Named("family", (TypeError,))),
    ("a directory that is an int", ("rope", 3), Named("directory", (TypeError,))),
    ("a missing directory", ("rope", str(FILES.root / "nope")), Named("nope")),
    ("the committed rope", ("rope", str(VECTORS)), Ok(lambda doc: doc["family"] == "rope")),
]:
    case(f"check_port load_family {label}", lambda args=args: check_port.load_family(*args), expect)

for label, make, expect in [
    ("a FIFO", lambda p: os.mkfifo(p), Named("FIFO")),
    ("deep nesting", lambda p: written(p, DEEP), Named("nest")),
    ("a file above the size cap", lambda p: sparse(p, CAP + 1), Named("bytes")),
    ("not UTF-8", lambda p: written(p, b"\xff\xfe{}"), Named("UTF-8")),
    ("truncated JSON", lambda p: written(p, (VECTORS / "alibi_bias.json").read_bytes()[:100]), Named("JSON")),
    ("an empty file", lambda p: written(p, b""), Named("empty")),
    ("a directory", lambda p: p.mkdir(), Named("directory")),
]:
    case(f"check_port a family file that is {label}", _port_file("alibi_bias", make), expect)
def _isolated(code: str) -> Callable:
    """``code`` in a subprocess of at most 2 GiB (reading ``/dev/zero`` must not take this machine's memory);
    a ``ValueError`` or ``TypeError`` it raises is printed as one line and exit status 1."""
    wrapped = (f"import sys\ntry:\n    {code}\nexcept (ValueError, TypeError) as err:\n"
               "    print('error:', err, file=sys.stderr)\n    sys.exit(1)\n")
    return lambda: run_process(["-c", wrapped], memory=2 << 30)


case("check_port a family file linked to /dev/zero", lambda: _isolated(
    "sys.path.insert(0, 'spec'); import check_port; "
    f"check_port.load_family('rope', {str(zero_link(FILES.fresh() / 'rope.json').parent)!r})")(), Usage("regular file"))

for label, edit, words in [
    ("without cases", lambda d: d.pop("cases"), "cases"),
    ("with cases an int", lambda d: d.update(cases=3), "cases"),
    ("with no cases", lambda d: d.update(cases=[]), "cases"),
    ("with a case without inputs", lambda d: d["cases"][0].pop("inputs"), "inputs"),
    ("with a case without expected", lambda d: d["cases"][0].pop("expected"), "expected"),
    ("with a case without tolerance", lambda d: d["cases"][0].pop("tolerance"), "tolerance"),
    ("with a case that is a list", lambda d: d["cases"].append([]), "case"),
    ("with atol inf", lambda d: d["cases"][0]["tolerance"]["float64"].update(atol=float("inf")), "Infinity"),
    ("with atol NaN", lambda d: d["cases"][0]["tolerance"]["float64"].update(atol=float("nan")), "NaN"),
    ("with atol -1", lambda d: d["cases"][0]["tolerance"]["float64"].update(atol=-1), "atol"),
    ("with atol a str", lambda d: d["cases"][0]["tolerance"]["float64"].update(atol="0"), "atol"),
    ("with rtol 1e300", lambda d: d["cases"][0]["tolerance"]["float64"].update(rtol=1e300), "rtol"),
    ("with an all-false where", lambda d: d["cases"][0].update(where={"bias": {
        "dtype": "bool", "shape": [4, 6, 6], "data": [False] * 144}}), "where"),
    ("with a where of the wrong shape", lambda d: d["cases"][0].update(where={"bias": {
        "dtype": "bool", "shape": [2], "data": [True, False]}}), "where"),
    ("with an int where", lambda d: d["cases"][0].update(where={"bias": {
        "dtype": "int64", "shape": [4, 6, 6], "data": [1] * 144}}), "where"),
    ("with a where for an unknown output", lambda d: d["cases"][0].update(where={"zzz": {
        "dtype": "bool", "shape": [1], "data": [True]}}), "zzz"),
    ("with a complex input", lambda d: d["cases"][0]["inputs"]["slopes"].update(dtype="complex128"), "dtype"),
    ("with an object input", lambda d: d["cases"][0]["inputs"]["slopes"].update(dtype="object"), "dtype"),
    ("with shape -1", lambda d: d["cases"][0]["inputs"]["slopes"].update(shape=[-1]), "shape"),
    ("with str data", lambda d: d["cases"][0]["inputs"]["slopes"].update(data=["a"] * 4), "data"),
    ("with data of the wrong length", lambda d: d["cases"][0]["inputs"]["slopes"].update(shape=[5]), "shape"),
    ("with a float16 expected", lambda d: d["cases"][0]["expected"]["bias"].update(dtype="float16"), "dtype"),
    ("of spec_version 2.0.0", lambda d: d.update(spec_version="2.0.0"), "spec_version"),
    ("without spec_version", lambda d: d.pop("spec_version"), "spec_version"),
    ("of another format", lambda d: d.update(format="other"), "format"),
]:
    case(f"check_port a family {label}", _port("alibi_bias", alibi_bias, edit), Named(words))
ALIBI_CASE = json.loads((VECTORS / "alibi_bias.json").read_text())["cases"][0]
for label, tol, words in [("atol inf", {"atol": float("inf")}, "atol"), ("atol NaN", {"atol": float("nan")}, "atol"),
                          ("rtol -0.5", {"rtol": -0.5}, "rtol"), ("rtol True", {"rtol": True}, "rtol")]:
    case(f"check_port run_case with {label}", lambda tol=tol: check_port.run_case("alibi_bias", {
        **ALIBI_CASE, "tolerance": {**ALIBI_CASE["tolerance"], "float64": {**ALIBI_CASE["tolerance"]["float64"], **tol}}},
        alibi_bias), Named(words))
case("check_port run_case of a committed case", lambda: check_port.run_case("alibi_bias", ALIBI_CASE, alibi_bias),
     Ok(lambda lines: lines == []))
case("check_port run_case with an empty case", lambda: check_port.run_case("alibi_bias", {}, alibi_bias),
     Named("case"))
case("check_port identifier of an int", lambda: check_port.identifier(3), Named("name", (TypeError,)))
case("check_port assert_family with nothing run", lambda: check_port.assert_family(
    "alibi_bias", lambda **kw: (_ for _ in ()).throw(NotImplementedError), directory=str(VECTORS)),
    Named("0 passed", (AssertionError,)))

# --------------------------------------------------------------------------- the conformance runner and report

RUN = str(CONFORMANCE / "run.py")
for label, argv, expect in [
    ("--out ''", ["--out", "", "--libraries", "torchtune"], Usage("--out")),
    ("--out /dev/null", ["--out", "/dev/null", "--libraries", "torchtune"], Usage("--out")),
    ("--out a file", ["--out", str(written(FILES.root / "a-file", b"x")), "--libraries", "torchtune"], Usage("--out")),
    ("--libraries bogus", ["--libraries", "bogus"], Usage("bogus")),
    ("--libraries without a name", ["--libraries"], Usage("--libraries")),
    ("--bogus", ["--bogus"], Usage("--bogus")),
    ("a library that is not installed", ["--libraries", "torchtune", "--out", "OUT"], Usage("torchtune")),
    ("a library that is not installed (says what to install)", ["--libraries", "x_transformers", "--out", "OUT"],
     Usage("requirements.txt")),
    ("--check with a library that is not installed", ["--check", "--libraries", "keras_hub_jax"], Usage("keras")),
    ("--help", ["--help"], Runs(no_rest)),
]:
    def _run(argv=argv):
        out = FILES.fresh("conformance")
        return run_main(_run_module().main, [str(out / "results") if a == "OUT" else a for a in argv])
    case(f"conformance run.py {label}", _run, expect)


def _results(files: dict) -> Callable:
    def call():
        directory = FILES.fresh("results")
        for name, make in files.items():
            make(directory / name)
        return report.load_results(str(directory))
    return call


GOOD_RESULT = json.loads(next((CONFORMANCE / "results" / "transformers").glob("*__alibi_bias_key_only.json")).read_text())
for label, call, expect in [
    ("a missing directory", lambda: report.load_results("/nonexistent"), Named("/nonexistent")),
    ("a file as the directory", lambda: report.load_results(str(written(FILES.root / "r-file", b"x"))), Named("directory")),
    ("an empty directory", lambda: report.load_results(str(FILES.fresh())), Named("no result")),
    ("a directory that is an int", lambda: report.load_results(3), Named("directory", (TypeError,))),
    ("a FIFO result", _results({"lib": lambda p: (p.mkdir(), os.mkfifo(p / "x.json"))}), Named("FIFO")),
    ("invalid JSON", _results({"lib": lambda p: written(p / "x.json", b"{")}), Named("x.json")),
    ("deep nesting", _results({"lib": lambda p: written(p / "x.json", DEEP)}), Named("nest")),
    ("an empty object", _results({"lib": lambda p: written(p / "x.json", b"{}")}), Named("format")),
    ("no summary", _results({"lib": lambda p: written(p / "x.json", json.dumps(
        {k: v for k, v in GOOD_RESULT.items() if k != "summary"}))}), Named("summary")),
    ("a summary count that is a str", _results({"lib": lambda p: written(p / "x.json", json.dumps(
        {**GOOD_RESULT, "summary": {**GOOD_RESULT["summary"], "failed": "x"}}))}), Named("summary")),
    ("not UTF-8", _results({"lib": lambda p: written(p / "x.json", b"\xff{}")}), Named("UTF-8")),
    ("a file above the size cap", _results({"lib": lambda p: sparse(p / "x.json", CAP + 1)}), Named("bytes")),
    ("one good result", _results({"transformers": lambda p: written(p / "x.json", json.dumps(GOOD_RESULT))}),
     Ok(lambda r: len(r) == 1)),
]:
    case(f"conformance report.load_results {label}", call, expect)
case("conformance report a /dev/zero result", lambda: _isolated(
    "sys.path.insert(0, 'spec/conformance'); import report; "
    f"report.load_results({str(zero_link(FILES.fresh() / 'lib' / 'x.json').parent.parent)!r})")(), Usage("regular file"))
for label, call, expect in [
    ("load_probes of a missing directory", lambda: report.load_probes("/nonexistent"), Named("/nonexistent")),
    ("probe of an unknown library", lambda: report.probe("nope", "x"), Named("nope")),
    ("probe of an unknown probe", lambda: report.probe("transformers", "zzz"), Named("zzz")),
    ("failures of an unknown library", lambda: report.failures("nope", "rope"), Named("nope")),
    ("table of an empty result", lambda: report.table([("x", {})]), Named("format")),
    ("table of a result without a summary", lambda: report.table([("x", {
        k: v for k, v in GOOD_RESULT.items() if k != "summary"})]), Named("summary")),
    ("table of an int", lambda: report.table(3), Named("results", (TypeError,))),
]:
    case(f"conformance report.{label}", call, expect)


def _run_module():
    import run
    return run


case("conformance write_json onto a full disk", on_full_disk(lambda: _run_module().write_json(
    str(FILES.fresh() / "x.json"), {"a": 1})), Named("No space left on device", (OSError,)))
case("conformance write_json of NaN", lambda: _run_module().write_json(str(FILES.fresh() / "x.json"), {"a": float("nan")}),
     Named("NaN"))

# --------------------------------------------------------------------------- python -m proofs and benchmarks


def _proofs(argv, env=None):
    return run_main(proofs_main(), argv, env=env)


for label, argv, expect in [
    ("a family and an unknown name", ["alibi", "zzz"], Usage("zzz")),
    ("an unknown name", ["zzz"], Usage("zzz")),
    ("an empty selector", [""], Usage("''")),
    ("an empty selector beside a family", ["attention.softmax", ""], Usage("''")),
    ("--bogus", ["--bogus"], Usage("--bogus")),
    ("--json and --latex", ["--json", "--latex"], Usage("--latex")),
    ("an upper-case family", ["ROPE"], Usage("ROPE")),
    ("a unicode selector", ["αβγ"], Usage("αβγ")),
    ("a selector with a trailing dot", ["attention.softmax."], Runs(lambda out, err: "PASS" in out)),
    ("one theorem as JSON", ["attention.softmax.shift", "--json"],
     Runs(lambda out, err: json.loads(out)[0]["status"] == "PASS")),
    ("one theorem as LaTeX", ["attention.softmax.shift", "--latex"], Runs(lambda out, err: "\\" in out)),
    ("a family twice", ["attention.softmax", "attention.softmax"],
     Runs(lambda out, err: out.count("attention.softmax.shift") == 1)),
    ("--help", ["--help"], Runs(no_rest)),
]:
    case(f"proofs {label}", lambda argv=argv: _proofs(argv), expect)
for columns in (80, 100):
    case(f"proofs at {columns} columns", lambda columns=columns: _proofs(
        ["attention", "sinusoidal.frequencies"], env={"COLUMNS": str(columns)}), Runs(every_line_fits(columns)))
def _without_sympy() -> Cli:
    """``python -m proofs`` where ``import sympy`` fails as it does when SymPy is not installed."""
    fake = FILES.fresh("nosympy")
    written(fake / "sympy" / "__init__.py", "raise ModuleNotFoundError(\"No module named 'sympy'\", name='sympy')\n")
    return run_process(["-m", "proofs", "attention"], env={"PYTHONPATH": f"{fake}{os.pathsep}{ROOT}"})


case("proofs without sympy", _without_sympy, Usage("sympy"))


def _benchmarks(argv):
    return run_main(benchmarks_main(), argv)


for label, argv, expect in [
    ("--bogus", ["--bogus"], Usage("--bogus")),
    ("an extra argument", ["--quick", "extra"], Usage("extra")),
    ("--help", ["--help"], Runs(no_rest)),
]:
    case(f"benchmarks {label}", lambda argv=argv: _benchmarks(argv), expect)

# --------------------------------------------------------------------------- closed pipes and the module alias

for label, args in [    # in a process of their own: what the interpreter does at exit counts too
    ("python -m minipos tour", ["-m", "minipos", "tour", "--d-model", "8", "--heads", "2", "--seq-len", "4"]),
    ("minipos vectors check", ["-m", "minipos", "vectors", "check", str(VECTORS)]),
    ("python -m proofs", ["-m", "proofs", "attention.softmax"]),
]:
    case(f"closed pipe: {label}", lambda args=args: run_process(args, close_stdout=True), Quiet())
for label, main, argv in [   # here, with a stdout that is a closed pipe
    ("minipos tour", lambda: minipos_main, TOUR),
    ("minipos --help", lambda: minipos_main, ["--help"]),
    ("minipos config", lambda: minipos_main, ["config", str(ROOT / "docs" / "configs" / "ministral-3-8b.json")]),
    ("python -m benchmarks --help", lambda: benchmarks_main(), ["--help"]),
    ("python -m proofs --json", lambda: proofs_main(), ["attention.softmax.shift", "--json"]),
    ("conformance run.py --help", lambda: _run_module().main, ["--help"]),
]:
    case(f"closed pipe: {label}", lambda main=main, argv=argv: run_main(main(), argv, stdout=ClosedPipe()), Quiet())
case("python -m minipos --version", lambda: run_process(["-m", "minipos", "--version"]),
     Runs(lambda out, err: out.startswith("minipos ")))


# --------------------------------------------------------------------------- a second round: what the first missed

for family, label, edit, words in [
    ("layer", "a huge d_model", lambda c: c["params"].update(d_model=10**6), "d_model"),
    ("layer", "num_heads 0", lambda c: c["params"].update(num_heads=0), "num_heads"),
    ("layer", "num_heads true", lambda c: c["params"].update(num_heads=True), "num_heads"),
    ("layer", "chunks empty", lambda c: c["params"].update(chunks=[]), "chunks"),
    ("layer", "chunks a str", lambda c: c["params"].update(chunks="7"), "chunks"),
    ("layer", "causal a str", lambda c: c["params"].update(causal="yes"), "causal"),
    ("layer", "scheme_config a list", lambda c: c["params"].update(scheme_config=[1]), "scheme_config"),
    ("rope", "rotary_dim a str", lambda c: c["params"].update(rotary_dim="4"), "rotary_dim"),
    ("local_global", "mem_len on one chunk", lambda c: c["params"].update(mem_len=3), "mem_len"),
    ("local_global", "causal false", lambda c: c["params"].update(causal=False), "causal"),
    ("mrope_layer", "causal false", lambda c: c["params"].update(causal=False), "causal"),
]:
    case(f"vectors.check {family}: {label}", _check_one(family, edit), Reported(words))


def _link_in(name: str, target) -> Callable:
    def call():
        directory = FILES.fresh("spec")
        (directory / f"{name}.json").symlink_to(target if target != "self" else directory / f"{name}.json")
        return vectors.check(directory, [name])
    return call


case("vectors.check a dangling symlink", _link_in("rope", "missing.json"), Reported("does not exist"))
case("vectors.check a symlink loop", _link_in("rope", "self"), Reported("rope.json"))

for label, call, expect in [
    ("read_bytes of an int", lambda: safe_io().read_bytes(3), Named("path", (TypeError,))),
    ("read_bytes of /dev/zero", lambda: safe_io().read_bytes("/dev/zero"), Named("character device")),
    ("read_bytes of a FIFO", lambda: safe_io().read_bytes(fifo_in(FILES.fresh(), "f")), Named("FIFO")),
    ("read_bytes of a directory", lambda: safe_io().read_bytes(FILES.fresh()), Named("directory")),
    ("read_bytes with a negative limit", lambda: safe_io().read_bytes(str(VECTORS / "rope.json"), limit=-1),
     Named("limit")),
    ("read_bytes with a limit below the size", lambda: safe_io().read_bytes(str(VECTORS / "rope.json"), limit=10),
     Named("more than the 10 bytes")),
    ("read_json of deep nesting", lambda: safe_io().read_json(written(FILES.fresh() / "d.json", DEEP)), Named("nest")),
    ("loads_json with max_depth 0", lambda: safe_io().loads_json(b"[]", max_depth=0), Named("max_depth")),
    ("loads_json of a str", lambda: safe_io().loads_json("[]"), Named("bytes", (TypeError,))),
    ("write_atomic of an int", lambda: safe_io().write_atomic(FILES.fresh() / "x", 3), Named("data", (TypeError,))),
    ("write_atomic onto a directory", lambda: safe_io().write_atomic(FILES.fresh(), b"x"),
     Named("cannot write", (OSError,))),
    ("write_atomic to an empty path", lambda: safe_io().write_atomic("", b"x"), Named("path")),
    ("write_atomic onto a full disk", on_full_disk(lambda: safe_io().write_atomic(FILES.fresh() / "x", b"x")),
     Named("No space left on device", (OSError,))),
    ("write_atomic leaves nothing behind on a full disk", lambda: _left_after_full_disk(),
     Ok(lambda left: left == ["old"])),
    ("write_atomic then read back", lambda: _round_trip(), Ok(lambda data: data == "ünïcode ∂")),
]:
    case(f"safe_io.{label}", call, expect)

for label, call, expect in [
    ("run_case with an int family", lambda: check_port.run_case(3, ALIBI_CASE, alibi_bias), Named("family")),
    ("run_family with a generator output", _port("alibi_bias", lambda **kw: (x for x in [1])),
     Reported("bias", _port_report)),
    ("run_family with an output_gradient that shadows an input", lambda: check_port.run_family(
        "rope_grad", lambda **kw: kw["positions"], output_gradient="positions", directory=str(VECTORS)),
     Reported("already an input", _port_report)),
    ("decode of a shape with 33 dims", lambda: check_port.decode({"dtype": "float64", "shape": [1] * 33,
                                                                 "data": [1.0]}), Named("shape")),
    ("decode of bools as int64", lambda: check_port.decode({"dtype": "int64", "shape": [1], "data": [True]}),
     Named("data")),
    ("decode of a huge shape", lambda: check_port.decode({"dtype": "bool", "shape": [2**40], "data": []}),
     Named("shape")),
    ("decode of an int beyond int64", lambda: check_port.decode({"dtype": "int64", "shape": [1], "data": [2**64]}),
     Named("int64")),
]:
    case(f"check_port {label}", call, expect)


def _bad_result(edit) -> Callable:
    def call():
        doc = copy.deepcopy(GOOD_RESULT)
        edit(doc)
        directory = FILES.fresh("results")
        written(directory / "lib" / "x.json", json.dumps(doc))
        return report.load_results(str(directory))
    return call


for label, edit, words in [
    ("a mismatch without got", lambda d: d["cases"][0].update(status="failed", mismatches=[{"output": "bias"}]),
     "mismatches"),
    ("a not_expressible case without a reason", lambda d: d["cases"][0].update(status="not_expressible"), "reason"),
    ("a case status that is unknown", lambda d: d["cases"][0].update(status="maybe"), "status"),
    ("a negative count", lambda d: d["summary"].update(passed=-1), "summary"),
    ("versions that are numbers", lambda d: d.update(versions={"torch": 2.1}), "versions"),
    ("a NaN value written as run.py writes it", lambda d: d["cases"][0].update(status="failed", mismatches=[{
        "output": "bias", "index": [0], "expected": 1.0, "got": "NaN", "abs_error": "NaN", "atol": 0, "rtol": 0}]),
     None),
]:
    case(f"conformance report.load_results {label}", _bad_result(edit),
         Ok(lambda r: len(r) == 1) if words is None else Named(words))
case("conformance report.probe with probes an int", lambda: report.probe("x", "y", probes=3),
     Named("probes", (TypeError,)))
def _transformers_absent() -> bool:
    from importlib.metadata import PackageNotFoundError, version
    try:
        version("transformers")
        version("torch")
    except PackageNotFoundError:
        return True
    return False


# where the library is absent (the test extra alone), the runner says so first, before it looks at --out
case("conformance run.py an --out it cannot make", lambda: run_process(
    [RUN, "--libraries", "transformers", "--out", "/proc/minipos-cannot-make"]),
    Usage("not installed" if _transformers_absent() else "minipos-cannot-make"))

case("output onto a full disk: python -m minipos tour", lambda: _to_dev_full(
    ["-m", "minipos", "tour", "--d-model", "8", "--heads", "2", "--seq-len", "4"]), Usage("No space left on device"))
for label, main, argv in [
    ("minipos vectors check", lambda: minipos_main, ["vectors", "check", str(VECTORS)]),
    ("minipos --help", lambda: minipos_main, ["--help"]),
    ("python -m proofs", lambda: proofs_main(), ["attention.softmax"]),
    ("python -m benchmarks --help", lambda: benchmarks_main(), ["--help"]),
    ("conformance run.py --help", lambda: _run_module().main, ["--help"]),
]:
    case(f"output onto a full disk: {label}", lambda main=main, argv=argv: _on_dev_full(main(), argv),
         Usage("No space left on device"))
for columns in ("abc", "0", "-5", "100000"):
    case(f"minipos tour with COLUMNS={columns}", lambda columns=columns: run_main(
        minipos_main, TOUR, env={"COLUMNS": columns}), Runs(lambda out, err: "Key:" in out))


def safe_io():
    from minipos import safe_io as module
    return module


def _left_after_full_disk() -> list:
    directory = FILES.fresh()
    written(directory / "old", b"old bytes")
    try:
        on_full_disk(lambda: safe_io().write_atomic(directory / "old", b"new bytes"))()
    except OSError:
        pass
    assert (directory / "old").read_bytes() == b"old bytes"
    return sorted(p.name for p in directory.iterdir())


def _round_trip() -> str:
    path = FILES.fresh() / "ü.txt"
    safe_io().write_atomic(path, "ünïcode ∂")
    return safe_io().read_bytes(path).decode("utf-8")


def _on_dev_full(main, argv) -> Cli:
    """``main(argv)`` here, its stdout ``/dev/full``."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    with open("/dev/full", "w") as full:
        return run_main(main, argv, stdout=full)


def _to_dev_full(args) -> Cli:
    """``python args`` with its output on ``/dev/full``: every write fails as on a full disk."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    with open("/dev/full", "w") as full:
        done = subprocess.run([sys.executable, *args], stdout=full, stderr=subprocess.PIPE, text=True, timeout=60,
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    return Cli(done.returncode, "", done.stderr)


# --------------------------------------------------------------------------- the second round: tools/campaign.py

def _round_two():
    """``tools/campaign.py``'s generated calls over the registry, the evidence readers, the lab's flags and
    records, and a custom scheme's garbage seam returns on the dense and blockwise paths (the others run
    ``python tools/campaign.py``): every one clear or accepted."""
    sys.path.insert(0, str(ROOT / "tools"))
    import campaign
    calls = campaign.build(["registry", "evidence", "lab", "seams"])
    fast_paths = [c for c in calls if c[0] != "seams" or c[1].endswith((", dense causal", ", blockwise"))]
    return campaign, fast_paths


def test_the_hostile_campaign_second_round():
    campaign, calls = _round_two()
    bad = []
    for surface, label, call, expect in calls:
        kind, detail = campaign.classify(call, expect, 30)
        if kind not in ("clear", "accepted"):
            bad.append(f"{kind} [{surface}] {label}: {detail[:200]}")
    assert len(calls) >= 550 and not bad, "\n".join(bad)


# --------------------------------------------------------------------------- running it

@pytest.mark.parametrize("label, call, expect", CASES, ids=[c[0] for c in CASES])
def test_campaign(label, call, expect):
    kind, detail = classify(call, expect)
    assert kind in ("clear", "accepted"), f"{kind}: {detail}"


def test_the_campaign_counts_its_calls():
    # Each row of CASES is one call: grow the table, do not shrink it.
    assert len(CASES) >= 330, len(CASES)
    assert len({c[0] for c in CASES}) == len(CASES), "labels must be unique"


if __name__ == "__main__":
    from collections import Counter
    counts = Counter()
    for label, call, expect in CASES:
        kind, detail = classify(call, expect)
        counts[kind] += 1
        if kind not in ("clear", "accepted"):
            print(f"{kind:7s} {label}: {' '.join(detail.split())[:300]}", flush=True)
    print(f"{len(CASES)} calls:", dict(counts))
