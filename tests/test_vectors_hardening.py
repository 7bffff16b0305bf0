"""The golden-vector tooling refuses what would make it lie or hang.

``encode``/``decode`` refuse values that do not round-trip; the vectors API names a bad
argument; ``export`` is atomic; ``check`` cannot be fooled into "ok" by an edited spec, and
reports a malformed, hostile or missing file as a failed check naming it instead of crashing,
hanging or allocating gigabytes.
"""

import dataclasses
import json
import math
import os
import pathlib
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minipos import vectors
from minipos.cli import main
from minipos.vectors import cases, files

# --- encode / decode --------------------------------------------------------------------------


def test_encode_refuses_complex_instead_of_dropping_the_imaginary_part():
    with pytest.raises(TypeError, match="complex"):
        vectors.encode(np.array([1 + 2j]))
    with pytest.raises(TypeError, match="complex"):
        vectors.encode(1j)


def test_encode_refuses_integers_that_int64_cannot_hold():
    with pytest.raises(ValueError, match="int64"):
        vectors.encode(np.array([2**63], dtype=np.uint64))
    big = vectors.encode(np.array([2**63 - 1], dtype=np.uint64))  # the largest that fits is kept exactly
    assert vectors.decode(big)[0] == 2**63 - 1


@pytest.mark.parametrize("value", [np.array(["a"]), np.array([None], dtype=object), np.array([b"x"])])
def test_encode_refuses_non_numeric_arrays(value):
    with pytest.raises(TypeError):
        vectors.encode(value)


def test_encode_refuses_nan():
    with pytest.raises(ValueError, match="finite"):
        vectors.encode(np.array([1.0, np.nan]))


GOOD = {"dtype": "float64", "shape": [2], "data": [1.0, 2.0]}


@pytest.mark.parametrize("bad, error, words", [
    ({**GOOD, "dtype": "object"}, ValueError, "dtype"),
    ({**GOOD, "dtype": "S2000000000"}, ValueError, "dtype"),
    ({**GOOD, "dtype": "complex128"}, ValueError, "dtype"),
    ({**GOOD, "dtype": ["float64"]}, ValueError, "dtype"),
    ({**GOOD, "shape": [-1]}, ValueError, "shape"),
    ({**GOOD, "shape": [2.0]}, TypeError, "shape"),
    ({**GOOD, "shape": [True, 2]}, TypeError, "shape"),
    ({**GOOD, "shape": "2"}, TypeError, "shape"),
    ({**GOOD, "shape": [3]}, ValueError, "shape"),
    ({**GOOD, "shape": [2**40, 2**40], "data": []}, ValueError, "shape"),
    ({**GOOD, "shape": [1] * 100, "data": [1.0]}, ValueError, "shape"),
    ({**GOOD, "data": ["1", "2"]}, TypeError, "data"),
    ({**GOOD, "data": [1.0, [2.0]]}, TypeError, "data"),
    ({**GOOD, "data": [1.0, None]}, TypeError, "data"),
    ({**GOOD, "data": [1.0, True]}, TypeError, "data"),
    ({**GOOD, "data": [1.0, math.nan]}, ValueError, "finite"),
    ({**GOOD, "data": [1.0, math.inf]}, ValueError, "finite"),
    ({**GOOD, "data": [1.0, 10**400]}, ValueError, "data"),
    ({"dtype": "int64", "shape": [1], "data": [1.5]}, TypeError, "data"),
    ({"dtype": "int64", "shape": [1], "data": [2**63]}, ValueError, "int64"),
    ({"dtype": "bool", "shape": [1], "data": [1]}, TypeError, "data"),
    ({**GOOD, "extra": 1}, ValueError, "extra"),
    ({"dtype": "float64", "shape": [2]}, ValueError, "data"),
    ([1.0, 2.0], TypeError, "object"),
])
def test_decode_refuses_what_the_exporter_never_writes(bad, error, words):
    with pytest.raises(error, match=words) as info:
        vectors.decode(bad, "inputs.x")
    assert "inputs.x" in str(info.value)


def test_decode_reads_what_encode_writes_including_empty_and_scalar_arrays():
    for a in (np.float64(2.5), np.zeros((0, 3)), np.arange(6, dtype=np.int64).reshape(2, 3),
              np.array([True, False])):
        got = vectors.decode(json.loads(json.dumps(vectors.encode(a))))
        assert got.dtype == a.dtype and got.shape == a.shape
        np.testing.assert_array_equal(got, a)


_DTYPES = st.sampled_from([np.float64, np.float32, np.float16, np.int64, np.int32, np.int8, np.uint8,
                           np.uint32, np.bool_])


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(_DTYPES, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
                  elements={"allow_nan": False, "allow_infinity": False}))
def test_encode_then_decode_round_trips_through_json(a):
    doc = json.loads(json.dumps(vectors.encode(a), allow_nan=False))
    got = vectors.decode(doc)
    assert got.shape == a.shape
    kind = "bool" if a.dtype == bool else "int64" if np.issubdtype(a.dtype, np.integer) else "float64"
    assert got.dtype == np.dtype(kind)
    np.testing.assert_array_equal(got, a.astype(kind))


# --- the API names a bad argument ----------------------------------------------------------------

ROOT = pathlib.Path(__file__).resolve().parents[1]
VECTORS = ROOT / "spec" / "vectors"


def test_build_family_names_an_unknown_family():
    with pytest.raises(ValueError, match=r"name: unknown family 'foo'.*'rope'"):
        vectors.build_family("foo")
    with pytest.raises(TypeError, match="name must be a family name"):
        vectors.build_family(3)


@pytest.mark.parametrize("function", [vectors.check, vectors.export])
def test_families_must_be_a_list_of_known_names(function, tmp_path):
    with pytest.raises(TypeError, match="families must be a list of family names.*not the str 'rope'"):
        function(tmp_path, families="rope")
    with pytest.raises(TypeError, match="families must be a list"):
        function(tmp_path, families=3)
    with pytest.raises(ValueError, match="families: unknown family 'foo'"):
        function(tmp_path, families=["rope", "foo"])
    with pytest.raises(ValueError, match="at least one"):
        function(tmp_path, families=[])
    with pytest.raises(ValueError, match="twice"):
        function(tmp_path, families=["rope", "rope"])
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("function", [vectors.check, vectors.export])
@pytest.mark.parametrize("directory", [None, 3, b"spec/vectors", ["spec"]])
def test_directory_must_be_a_path(function, directory):
    with pytest.raises(TypeError, match="directory must be a path"):
        function(directory)


def test_check_refuses_a_directory_that_does_not_exist(tmp_path):
    with pytest.raises(ValueError, match="directory .*missing.* does not exist"):
        vectors.check(tmp_path / "missing")


# --- export is atomic ----------------------------------------------------------------------------

def _spec_copy(tmp_path) -> pathlib.Path:
    target = tmp_path / "spec"
    shutil.copytree(VECTORS, target)
    return target


def _snapshot(directory) -> dict:
    return {p.name: p.read_bytes() for p in sorted(pathlib.Path(directory).iterdir())}


def test_a_family_that_fails_to_build_leaves_the_spec_untouched(tmp_path, monkeypatch):
    spec = _spec_copy(tmp_path)
    before = _snapshot(spec)

    def boom():
        raise RuntimeError("cannot build")

    monkeypatch.setitem(vectors.FAMILIES, "rope", dataclasses.replace(vectors.FAMILIES["rope"], build=boom))
    with pytest.raises(RuntimeError, match="cannot build"):
        vectors.export(spec)
    assert _snapshot(spec) == before


def test_a_write_that_fails_leaves_the_spec_untouched_and_no_temp_file(tmp_path, monkeypatch):
    spec = _spec_copy(tmp_path)
    before = _snapshot(spec)
    calls, fsync = [], os.fsync

    def failing_fsync(fd):  # the disk fills up while the fifth family is written
        calls.append(fd)
        if len(calls) == 5:
            raise OSError(28, "No space left on device")
        return fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(OSError, match="No space"):
        vectors.export(spec)
    assert _snapshot(spec) == before


def test_an_unknown_family_raises_before_anything_is_written(tmp_path):
    spec = _spec_copy(tmp_path)
    before = _snapshot(spec)
    with pytest.raises(ValueError, match="'foo'"):
        vectors.export(spec, families=["rope", "foo"])
    assert _snapshot(spec) == before and not (spec / "foo.json").exists()
    with pytest.raises(ValueError, match="'foo'"):
        vectors.export(tmp_path / "new", families=["rope", "foo"])
    assert not (tmp_path / "new").exists()


def test_export_refuses_a_directory_that_is_not_a_vectors_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "rope.json").write_text("{}")
    with pytest.raises(ValueError, match=r"holds notes\.txt, which are not golden-vector family files"):
        vectors.export(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "rope.json"]
    assert (tmp_path / "rope.json").read_text() == "{}"
    with pytest.raises(ValueError, match="is not a directory"):
        vectors.export(tmp_path / "notes.txt")
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "rope.json").mkdir()   # a directory where a family file would go
    with pytest.raises(ValueError, match="rope.json"):
        vectors.export(tmp_path / "sub")


def test_export_writes_into_an_empty_or_new_directory_and_a_vectors_directory(tmp_path):
    (tmp_path / "empty").mkdir()
    for target in (tmp_path / "empty", tmp_path / "new" / "deeper", _spec_copy(tmp_path)):
        paths = vectors.export(target, families=["alibi_slopes"])
        assert paths == [str(target / "alibi_slopes.json")]
        assert json.loads((target / "alibi_slopes.json").read_text())["family"] == "alibi_slopes"
        assert not [p for p in target.iterdir() if p.name.startswith(".")]


def test_cli_export_into_a_foreign_directory_is_one_line_on_stderr(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["vectors", "export", str(tmp_path)]) == 1
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and "notes.txt" in captured.err and "Traceback" not in captured.err


# Every family but the slowest six (the layers' backwards, checked against finite differences, and the 36-case
# layer family): forty files written one after another, a third of the whole export's time. Atomicity is a
# property of each file's write, so these show it as well as all of them would.
_SLOW = {"layer_grad", "mrope_layer_grad", "inkling_grad", "layer", "local_global_grad", "mla_grad"}
_EXPORT = ("import sys; from minipos import vectors; "
           f"vectors.export(sys.argv[1], families=[f for f in vectors.FAMILIES if f not in {sorted(_SLOW)!r}])")


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_an_export_killed_at_any_moment_leaves_old_or_complete_files(tmp_path):
    # The export that times an uninterrupted run (a process like the killed ones) also gives the new
    # files: a second export of its own, in this process, only doubled the cost of that step.
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", _EXPORT, str(tmp_path / "fresh")], check=True)
    took = time.monotonic() - start
    new = _snapshot(tmp_path / "fresh")
    spec = _spec_copy(tmp_path)
    for path in spec.iterdir():  # old bytes that differ from what the export writes
        path.write_bytes(path.read_bytes().replace(b'"description": "', b'"description": "old: ', 1))
    old = _snapshot(spec)                        # the slow families' files too: no export may touch them
    rng = random.Random(20240601)
    killed = 0
    for attempt in range(8):
        for name, data in old.items():
            (spec / name).write_bytes(data)
        proc = subprocess.Popen([sys.executable, "-c", _EXPORT, str(spec)])
        time.sleep(rng.uniform(0.2, 1.1) * took)
        proc.send_signal(signal.SIGKILL)
        killed += proc.wait() == -signal.SIGKILL
        for name, data in _snapshot(spec).items():
            if name.startswith("."):
                assert re.fullmatch(r"\.[a-z_0-9]+\.json\.\d+\.[0-9a-f]{8}\.tmp", name), name
                continue
            assert data in (old[name], new.get(name)), f"attempt {attempt}: {name} is neither old nor new"
    assert killed, "every export finished before it was killed; the test did not exercise a kill"
    vectors.export(spec, families=[f for f in vectors.FAMILIES if f not in _SLOW])   # completes, clears temp files
    assert _snapshot(spec) == {**old, **new}


# --- check cannot be fooled into "ok" ------------------------------------------------------------

def _load(spec, family) -> dict:
    return json.loads((spec / f"{family}.json").read_text())


def _save(spec, family, doc, **dump) -> None:
    (spec / f"{family}.json").write_text(json.dumps(doc, **dump))


def _failures(spec, family) -> list:
    """The lines ``check`` reports for ``family``; the CLI must exit 1 on the same directory."""
    lines = [str(m) for m in vectors.check(spec, [family])]  # the family's lines of a full check
    assert main(["vectors", "check", str(spec)]) == 1
    return lines


def _scale_expected(doc, factor=3.0):
    for case in doc["cases"]:
        for arr in case["expected"].values():
            if arr["dtype"] == "float64":
                arr["data"] = [v * factor + 1.0 for v in arr["data"]]


def test_check_passes_a_faithful_copy_and_counts_values_per_family(tmp_path, capsys):
    spec = _spec_copy(tmp_path)
    results = vectors.check_families(spec)
    assert [r.family for r in results] == list(vectors.FAMILIES)
    for r in results:
        doc = _load(spec, r.family)
        values = 0
        for case in doc["cases"]:  # every expected value, or only where the case's mask is true
            for name, arr in case["expected"].items():
                mask = case.get("where", {}).get(name)
                values += sum(mask["data"]) if mask else len(arr["data"])
        assert (r.cases, r.values, r.mismatches) == (len(doc["cases"]), values, ())
    assert main(["vectors", "check", str(spec)]) == 0
    out = capsys.readouterr().out
    rel_shift = next(r for r in results if r.family == "rel_shift")
    assert f"rel_shift: {rel_shift.cases} cases, {rel_shift.values} values compared" in out
    assert f"reproduces {sum(r.cases for r in results)} cases ({sum(r.values for r in results)} values) in {len(vectors.FAMILIES)} families" in out


@pytest.mark.parametrize("raw", ["1e300", "Infinity", "1e400", "NaN"])
def test_a_raised_tolerance_beside_changed_values_fails(tmp_path, raw):
    spec = _spec_copy(tmp_path)
    doc = _load(spec, "rope")
    _scale_expected(doc)
    for case in doc["cases"]:
        case["tolerance"]["float64"] = {"rtol": 12345.0, "atol": 12345.0}
    (spec / "rope.json").write_text(json.dumps(doc).replace("12345.0", raw))
    lines = _failures(spec, "rope")
    assert len(lines) == 1 and str(spec / "rope.json") in lines[0], lines


def test_the_tolerance_cap_holds_for_every_committed_vector_and_is_enforced(tmp_path):
    for path in VECTORS.glob("*.json"):
        for case in json.loads(path.read_text())["cases"]:
            for precision, cap in vectors.MAX_TOLERANCE.items():
                assert max(case["tolerance"][precision].values()) <= cap, (path.name, case["name"])
    spec = _spec_copy(tmp_path)
    doc = _load(spec, "xpos")
    doc["cases"][0]["tolerance"]["float32"]["rtol"] = vectors.MAX_TOLERANCE["float32"] * 2
    _save(spec, "xpos", doc)
    assert "maximum" in _failures(spec, "xpos")[0]


@pytest.mark.parametrize("edit, words", [
    (lambda d: d.update(cases=[]), "at least 1"),
    (lambda d: d["cases"][1].update(expected={}), "at least 1"),
    (lambda d: d["cases"].append(dict(d["cases"][0])), "duplicate case name"),
    (lambda d: d.update(extra=1), "unexpected field 'extra'"),
    (lambda d: d["cases"][0].update(note="x"), "unexpected field 'note'"),
    (lambda d: d["cases"][0]["inputs"]["x"].update(order="F"), "unexpected field 'order'"),
    (lambda d: d["cases"][0]["tolerance"]["float64"].update(mode="ulp"), "unexpected field 'mode'"),
    (lambda d: d.pop("cases"), "missing required field 'cases'"),
    (lambda d: d.update(family="rope_scaling"), "family 'rope_scaling'"),
    (lambda d: d.update(function="minipos.alibi.alibi_bias"), "function"),
    (lambda d: d.update(spec_version="2.0.0"), "spec_version"),
])
def test_an_edited_family_fails_naming_file_and_reason(tmp_path, edit, words):
    spec = _spec_copy(tmp_path)
    doc = _load(spec, "rope")
    edit(doc)
    _save(spec, "rope", doc)
    lines = _failures(spec, "rope")
    assert lines and words in lines[0] and str(spec / "rope.json") in lines[0], lines


def test_masks_that_compare_nothing_fail(tmp_path):
    spec = _spec_copy(tmp_path)
    doc = _load(spec, "rel_shift")
    _scale_expected(doc)
    for case in doc["cases"]:
        case["where"]["out"]["data"] = [False] * len(case["where"]["out"]["data"])
    _save(spec, "rel_shift", doc)
    lines = _failures(spec, "rel_shift")
    assert lines and "where.out masks out every value of expected.out" in lines[0], lines


def test_an_output_masked_out_whole_fails_though_the_case_compares_others(tmp_path):
    """xl_scores: every `where` of `scores` set false and its values zeroed; the case still compares
    `relative_embeddings`, so only the rule on the mask itself catches the tamper."""
    spec = _spec_copy(tmp_path)
    doc = _load(spec, "xl_scores")
    for case in doc["cases"]:
        case["where"]["scores"]["data"] = [False] * len(case["where"]["scores"]["data"])
        case["expected"]["scores"]["data"] = [0.0] * len(case["expected"]["scores"]["data"])
        assert "relative_embeddings" in case["expected"]
    _save(spec, "xl_scores", doc)
    lines = _failures(spec, "xl_scores")
    assert lines and "where.scores masks out every value of expected.scores" in lines[0], lines


@pytest.mark.parametrize("edit, words", [
    (lambda c: c["where"].update(missing=c["where"]["scores"]), "where.missing"),
    (lambda c: c["where"]["scores"].update(dtype="int64", data=[int(v) for v in c["where"]["scores"]["data"]]),
     "where.scores must be a bool array"),
    (lambda c: c["where"]["scores"].update(shape=[1, *c["where"]["scores"]["shape"]]), "where.scores has shape"),
    (lambda c: (c["expected"].pop("scores"), c.pop("where")), "scores: returned but not recorded in expected"),
    (lambda c: c["expected"].update(other=c["expected"]["scores"]), "other: output missing"),
])
def test_masks_and_outputs_must_match_what_the_function_returns(tmp_path, edit, words):
    spec = _spec_copy(tmp_path)
    doc = _load(spec, "xl_scores")
    edit(doc["cases"][1])
    _save(spec, "xl_scores", doc)
    lines = _failures(spec, "xl_scores")
    assert lines and any(words in line for line in lines), lines


def test_another_familys_content_under_a_name_fails(tmp_path):
    spec = _spec_copy(tmp_path)
    shutil.copy(spec / "alibi_bias.json", spec / "rope.json")
    lines = _failures(spec, "rope")
    assert lines == [f"rope/-: {spec / 'rope.json'}: holds family 'alibi_bias', but its file name says 'rope'"]


def test_a_duplicate_key_fails(tmp_path):
    spec = _spec_copy(tmp_path)
    text = (spec / "xpos.json").read_text()
    (spec / "xpos.json").write_text(text.replace('"rtol": 1e-09,', '"rtol": 1e300, "rtol": 1e-09,', 1))
    assert "duplicate key 'rtol'" in _failures(spec, "xpos")[0]


def test_a_missing_or_unknown_family_file_fails_unless_families_are_named(tmp_path):
    spec = _spec_copy(tmp_path)
    (spec / "rope.json").unlink()
    shutil.copy(spec / "xpos.json", spec / "foo.json")
    lines = [str(m) for m in vectors.check(spec)]
    assert lines == [f"rope/-: no file {spec / 'rope.json'}",
                     f"foo/-: {spec / 'foo.json'}: not a family this minipos knows; the families are "
                     f"{sorted(vectors.FAMILIES)}"]
    assert vectors.check(spec, families=["xpos", "alibi_slopes"]) == []


def test_symlinks_inside_the_directory_are_followed_and_outside_it_refused(tmp_path):
    spec = _spec_copy(tmp_path)
    (spec / "sub").mkdir()
    (spec / "rope.json").rename(spec / "sub" / "rope.json")
    (spec / "rope.json").symlink_to(pathlib.Path("sub") / "rope.json")
    assert vectors.check(spec, families=["rope"]) == []
    outside = tmp_path / "elsewhere.json"
    shutil.copy(VECTORS / "rope.json", outside)   # a faithful file, but not one the directory holds
    (spec / "rope.json").unlink()
    (spec / "rope.json").symlink_to(outside)
    lines = _failures(spec, "rope")
    assert lines == [f"rope/-: {spec / 'rope.json'}: is a symbolic link to {outside}, outside the directory"]


# --- check reports what it cannot read, naming the file -----------------------------------------

def _expect_one_failure(spec, family, words, capsys):
    # the family's own check names the reason; the command over the whole spec reports that file once
    lines = [str(m) for m in vectors.check(spec, [family])]
    assert len(lines) == 1 and lines[0].startswith(f"{family}/-: {spec / (family + '.json')}: "), lines
    assert words in lines[0], lines
    capsys.readouterr()
    assert main(["vectors", "check", str(spec)]) == 1
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err and out.count(str(spec / f"{family}.json")) == 1


def _rewrite(spec, family, data: bytes):
    (spec / f"{family}.json").write_bytes(data)


@pytest.mark.parametrize("make, words", [
    (lambda b: b[: len(b) // 2], "not valid JSON"),
    (lambda b: b"", "empty"),
    (lambda b: b"\xff\xfe" + b, "not UTF-8"),
    (lambda b: b"[" * 200_000 + b"]" * 200_000, "nest"),
    (lambda b: b'{"cases": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", "nest"),
    (lambda b: b"[" * 100 + b"]" * 100, "nest"),
    (lambda b: b.replace(b'"dtype": "float64"', b'"dtype": "S2000000000"', 1), "dtype"),
    (lambda b: b.replace(b'"shape": [', b'"shape": [-1, ', 1), "shape"),
    (lambda b: b"[]", "expected object, got array"),
    (lambda b: b"3", "expected object, got integer"),
    (lambda b: b"null", "expected object, got null"),
    (lambda b: b.replace(b"0.0341796875", b"1" * 5000, 1), "digits"),
    (lambda b: b"[" + b + b"]", "expected object, got array"),
    (lambda b: json.dumps({k: v for k, v in json.loads(b).items() if k != "cases"}).encode(), "'cases'"),
    (lambda b: b.replace(b"0.0341796875", b"NaN", 1), "NaN"),
    (lambda b: b.replace(b"0.0341796875", b"1e400", 1), "1e400"),
    (lambda b: b.replace(b"0.0341796875", b'"0.0341796875"', 1), "data"),
])
def test_a_malformed_file_is_a_failed_check_not_a_crash(tmp_path, capsys, make, words):
    spec = _spec_copy(tmp_path)
    _rewrite(spec, "xpos", make((spec / "xpos.json").read_bytes()))
    _expect_one_failure(spec, "xpos", words, capsys)


def test_a_directory_in_place_of_a_file_is_a_failed_check(tmp_path, capsys):
    spec = _spec_copy(tmp_path)
    (spec / "xpos.json").unlink()
    (spec / "xpos.json").mkdir()
    _expect_one_failure(spec, "xpos", "not a regular file (a directory)", capsys)


def test_a_file_above_the_size_cap_is_refused_before_it_is_read(tmp_path, capsys, monkeypatch):
    spec = _spec_copy(tmp_path)
    with open(spec / "xpos.json", "r+b") as f:   # sparse: costs no disk
        f.truncate(vectors.MAX_FILE_BYTES + 1)
    _expect_one_failure(spec, "xpos", f"more than the {vectors.MAX_FILE_BYTES}", capsys)
    monkeypatch.setattr(files, "MAX_FILE_BYTES", 1000)  # the cap where the reader looks it up
    assert "more than the 1000" in str(vectors.check(spec, ["rope"])[0])


def _cli_check(spec) -> subprocess.CompletedProcess:
    """``minipos vectors check`` in a subprocess, killed if it runs a minute (a hang fails the test)."""
    return subprocess.run([sys.executable, "-m", "minipos.cli", "vectors", "check", str(spec)],
                          capture_output=True, text=True, timeout=60)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_in_place_of_a_file_does_not_hang_check(tmp_path):
    spec = _spec_copy(tmp_path)
    (spec / "xpos.json").unlink()
    os.mkfifo(spec / "xpos.json")
    done = _cli_check(spec)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"xpos/-: {spec / 'xpos.json'}: is not a regular file (a FIFO)" in done.stdout


@pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="needs /dev/zero")
def test_a_symlink_to_dev_zero_is_refused(tmp_path):
    spec = _spec_copy(tmp_path)
    (spec / "xpos.json").unlink()
    (spec / "xpos.json").symlink_to("/dev/zero")
    done = _cli_check(spec)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"xpos/-: {spec / 'xpos.json'}: is a symbolic link to /dev/zero, outside the directory" in done.stdout


# --- vectors.validate agrees with a second validator ---------------------------------------------

def _broken_documents():
    good = json.loads((VECTORS / "xl_scores.json").read_text())
    case = good["cases"][0]
    edits = [
        lambda d: d.update(extra=1), lambda d: d.update(format="other"), lambda d: d.pop("function"),
        lambda d: d.update(cases=[]), lambda d: d.update(cases={}), lambda d: d.update(family="Rope"),
        lambda d: d.update(spec_version="1.0"), lambda d: d["cases"][0].update(name="a b"),
        lambda d: d["cases"][0].update(expected={}), lambda d: d["cases"][0].pop("tolerance"),
        lambda d: d["cases"][0]["tolerance"]["float64"].update(rtol=-1.0),
        lambda d: d["cases"][0]["tolerance"]["float64"].update(rtol=2e-6),
        lambda d: d["cases"][0]["tolerance"]["float32"].update(atol=0.02),
        lambda d: d["cases"][0]["tolerance"].update(float16={"rtol": 0, "atol": 0}),
        lambda d: d["cases"][0]["inputs"]["q"].update(dtype="float32"),
        lambda d: d["cases"][0]["inputs"]["q"].update(shape=[-1]),
        lambda d: d["cases"][0]["inputs"]["q"].update(shape=[1] * 33),
        lambda d: d["cases"][0]["inputs"]["q"].update(data=["1"]),
        lambda d: d["cases"][0]["inputs"]["q"].update(data=[[1.0]]),
        lambda d: d["cases"][0]["inputs"]["q"].pop("data"),
        lambda d: d["cases"][0]["where"].update(scores=1), lambda d: d["cases"][0].update(params=[]),
    ]
    yield good, True
    for edit in edits:
        doc = json.loads(json.dumps(good))
        edit(doc)
        yield doc, False
    assert case  # the source document was not edited in place


def test_validate_agrees_with_jsonschema():
    jsonschema = pytest.importorskip("jsonschema")
    checker = jsonschema.Draft202012Validator(vectors.SCHEMA)
    for doc, valid in _broken_documents():
        assert checker.is_valid(doc) is valid, doc
        if valid:
            vectors.validate(doc)
        else:
            with pytest.raises(vectors.SpecError, match=r"^\$"):
                vectors.validate(doc)


def test_validate_refuses_a_schema_keyword_it_does_not_implement():
    with pytest.raises(NotImplementedError, match="uniqueItems"):
        vectors.validate([1], {"type": "array", "uniqueItems": True})


def test_build_family_refuses_a_case_that_check_would_refuse(monkeypatch):
    family = vectors.FAMILIES["alibi_slopes"]
    loose = lambda: [dict(c, tolerance=cases.tol(1e-3, 1e-3)) for c in family.build()]  # noqa: E731
    monkeypatch.setitem(vectors.FAMILIES, "alibi_slopes", dataclasses.replace(family, build=loose))
    with pytest.raises(vectors.SpecError, match="maximum"):
        vectors.build_family("alibi_slopes")


@pytest.mark.parametrize("edit, words", [
    (lambda c: c["params"].update(chunks=[1] * 100_000), "chunks must be a list of positive lengths"),
    (lambda c: c["params"].update(chunks=[3, -1, 5]), "chunks must be"),
    (lambda c: c["inputs"].update(forward=c["inputs"]["wq"]), "unknown names ['forward']"),
])
def test_the_layer_family_runs_only_what_a_case_can_mean(tmp_path, edit, words):
    spec = _spec_copy(tmp_path)
    doc = _load(spec, "layer")
    edit(doc["cases"][0])
    _save(spec, "layer", doc)
    lines = _failures(spec, "layer")
    assert len(lines) == 1 and lines[0].startswith(f"layer/{doc['cases'][0]['name']}: raised ValueError: ")
    assert words in lines[0]
