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


_EXPORT = "import sys; from minipos import vectors; vectors.export(sys.argv[1])"


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_an_export_killed_at_any_moment_leaves_old_or_complete_files(tmp_path):
    fresh = tmp_path / "fresh"
    vectors.export(fresh)
    new = _snapshot(fresh)
    spec = _spec_copy(tmp_path)
    for path in spec.iterdir():  # old bytes that differ from what the export writes
        path.write_bytes(path.read_bytes().replace(b'"description": "', b'"description": "old: ', 1))
    old = _snapshot(spec)
    rng = random.Random(20240601)
    start = time.monotonic()
    subprocess.run([sys.executable, "-c", _EXPORT, str(tmp_path / "timing")], check=True)
    took = time.monotonic() - start
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
            assert data in (old[name], new[name]), f"attempt {attempt}: {name} is neither old nor new"
    assert killed, "every export finished before it was killed; the test did not exercise a kill"
    vectors.export(spec)  # the next export completes and clears any temp file a killed one left
    assert _snapshot(spec) == new
