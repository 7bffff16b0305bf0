"""The golden vectors in ``spec/vectors``: minipos reproduces them, they follow ``spec/schema.json``,
export is deterministic, and ``check`` names the case when an implementation detail changes.

Anchors from outside minipos: ALiBi's 8-head slopes 1/2 ... 1/256 (Press et al. 2022, §3); T5's
last bidirectional bucket starting at |n| = 91 for 32 buckets / max distance 128 (transformers
5.24.0 ``T5Attention._relative_position_bucket``, see tests/test_t5.py); DeBERTa's unbucketed
relative position ``i - j`` (``build_relative_position``); the float32 T5 boundary at n = -206 of
causal 15 / 636 (transformers 5.24.0 printed bucket 13). Every value of every family is also
compared with the reference implementations in tests/test_interop_reference.py.
"""

import json
import pathlib
import re

import numpy as np
import pytest

from minipos import __version__, alibi, deberta, rope, t5, transformer_xl, vectors
from minipos.cli import main

ROOT = pathlib.Path(__file__).resolve().parents[1]
SPEC = ROOT / "spec"
VECTORS = SPEC / "vectors"
SCHEMA = json.loads((SPEC / "schema.json").read_text())


def _doc(family):
    return json.loads((VECTORS / f"{family}.json").read_text())


def _case(family, name):
    case = next(c for c in _doc(family)["cases"] if c["name"] == name)
    return {k: vectors.decode(v) for k, v in case["inputs"].items()}, \
        {k: vectors.decode(v) for k, v in case["expected"].items()}


# --- a tiny JSON Schema (draft 2020-12) validator: the keywords spec/schema.json uses ------------

TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value, kind):
    if kind in ("number", "integer"):
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return ok and (kind == "number" or isinstance(value, int))
    return isinstance(value, TYPES[kind])


def validate(value, schema, root=SCHEMA, path="$"):
    """Raise AssertionError at the first place ``value`` breaks ``schema``."""
    if "$ref" in schema:
        schema = root["$defs"][schema["$ref"].split("/")[-1]]
    kinds = schema.get("type")
    if kinds is not None:
        assert any(_is(value, k) for k in ([kinds] if isinstance(kinds, str) else kinds)), f"{path}: type {kinds}"
    assert "const" not in schema or value == schema["const"], f"{path}: const"
    assert "enum" not in schema or value in schema["enum"], f"{path}: enum"
    assert "pattern" not in schema or re.search(schema["pattern"], value), f"{path}: pattern"
    assert "minimum" not in schema or value >= schema["minimum"], f"{path}: minimum"
    assert "maximum" not in schema or value <= schema["maximum"], f"{path}: maximum"
    if isinstance(value, dict):
        assert not set(schema.get("required", ())) - set(value), f"{path}: required"
        assert len(value) >= schema.get("minProperties", 0), f"{path}: minProperties"
        for key, item in value.items():
            sub = schema.get("properties", {}).get(key, schema.get("additionalProperties", True))
            assert sub is not False, f"{path}: unexpected key {key!r}"
            if sub is not True:
                validate(item, sub, root, f"{path}.{key}")
    if isinstance(value, list):
        assert len(value) >= schema.get("minItems", 0), f"{path}: minItems"
        assert len(value) <= schema.get("maxItems", len(value)), f"{path}: maxItems"
        for i, item in enumerate(value):
            validate(item, schema.get("items", {}), root, f"{path}[{i}]")


def test_the_validator_rejects_what_the_schema_forbids():
    good = _doc("alibi_slopes")
    validate(good, SCHEMA)
    tolerance = good["cases"][0]["tolerance"]
    for broken in ({**good, "extra": 1}, {**good, "format": "other"},
                   {**good, "cases": [{**good["cases"][0], "tolerance": {"float64": {"rtol": -1, "atol": 0}}}]},
                   {**good, "cases": [{**good["cases"][0], "tolerance": {**tolerance, "float64": {"rtol": 1e300,
                                                                                                  "atol": 0}}}]}):
        with pytest.raises(AssertionError):
            validate(broken, SCHEMA)


@pytest.mark.parametrize("family", sorted(vectors.FAMILIES))
def test_every_file_follows_the_schema_and_decodes(family):
    doc = _doc(family)
    validate(doc, SCHEMA)
    assert (doc["family"], doc["spec_version"], doc["minipos_version"]) == (family, vectors.SPEC_VERSION, __version__)
    for case in doc["cases"]:
        for arr in [*case["inputs"].values(), *case["expected"].values(), *case.get("where", {}).values()]:
            assert len(arr["data"]) == int(np.prod(arr["shape"])), case["name"]
        for name, mask in case.get("where", {}).items():
            assert mask["shape"] == case["expected"][name]["shape"] and mask["dtype"] == "bool"


def test_the_schema_minipos_checks_with_is_spec_schema_json():
    assert vectors.SCHEMA == SCHEMA


def test_schema_is_valid_for_jsonschema_too():
    jsonschema = pytest.importorskip("jsonschema")
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    for path in sorted(VECTORS.glob("*.json")):
        jsonschema.Draft202012Validator(SCHEMA).validate(json.loads(path.read_text()))


# --- the committed set: complete, small, reproduced ---------------------------------------------

def test_committed_set_is_every_family_and_small():
    assert sorted(p.stem for p in VECTORS.glob("*.json")) == sorted(vectors.FAMILIES)
    assert sum(p.stat().st_size for p in VECTORS.glob("*.json")) < 5_000_000


def test_check_passes_on_the_committed_vectors(capsys):
    assert main(["vectors", "check", str(VECTORS)]) == 0
    assert "reproduces" in capsys.readouterr().out


def test_export_is_byte_identical_across_runs(tmp_path):
    first, second = vectors.export(tmp_path / "a"), vectors.export(tmp_path / "b")
    assert [pathlib.Path(p).read_bytes() for p in first] == [pathlib.Path(p).read_bytes() for p in second]
    assert main(["vectors", "check", str(tmp_path / "a")]) == 0


def test_inputs_are_regenerated_exactly_from_the_seeds():
    for family in vectors.FAMILIES:  # the committed inputs are what the seeded generators give today
        fresh = [c["inputs"] for c in vectors.build_family(family)["cases"]]
        assert fresh == [c["inputs"] for c in _doc(family)["cases"]], family


def test_vectors_hold_the_facts_of_the_papers_and_references():
    _, out = _case("alibi_slopes", "heads_8")
    np.testing.assert_array_equal(out["slopes"], [2.0 ** -k for k in range(1, 9)])
    inputs, out = _case("t5_bucket", "bidirectional_32_128")
    n, b = inputs["relative_position"], out["bucket"]
    assert b[n == -90][0] == 14 and b[n == -91][0] == 15 and b[n == 91][0] == 31 and 16 not in b
    inputs, out = _case("t5_bucket", "causal_15_636_float32")
    assert out["bucket"][inputs["relative_position"] == -206][0] == 13
    _, out = _case("deberta_relative_position", "plain_5x5")
    np.testing.assert_array_equal(out["relative_pos"], np.subtract.outer(np.arange(5), np.arange(5)))


# --- check catches a changed implementation detail, naming the case ----------------------------

def _failing_cases(tmp_path=None):
    return {f"{m.family}/{m.case}" for m in vectors.check(VECTORS)}


def _wrong_slopes(num_heads):  # the odd-index ([1::2]) slopes of 2P heads instead of [0::2]
    P = 1 << (num_heads.bit_length() - 1)
    extra = 2.0 ** (-4.0 * np.arange(1, 2 * P + 1) / P)[1::2][: num_heads - P]
    return np.concatenate([2.0 ** (-8.0 * np.arange(1, P + 1) / P), extra])


def test_check_catches_a_changed_slope(monkeypatch, capsys):
    monkeypatch.setattr(alibi, "alibi_slopes", _wrong_slopes)
    failing = _failing_cases()
    assert {"alibi_slopes/heads_3", "alibi_slopes/heads_112"} <= failing
    assert "alibi_slopes/heads_4" not in failing and "alibi_slopes/heads_8" not in failing
    assert main(["vectors", "check", str(VECTORS)]) == 1
    out = capsys.readouterr().out
    assert "alibi_slopes/heads_3: slopes[2]: expected 0.25, got 0.0625" in out and "FAILED" in out


def test_check_catches_a_moved_bucket_boundary(monkeypatch):
    original = t5._first_distances

    def moved(per_dir, max_distance, exact):  # the last bucket from |n| = 92 instead of 91
        first = original(per_dir, max_distance, exact).copy()
        if (per_dir, max_distance) == (16, 128):
            first[15] = 92
        return first

    monkeypatch.setattr(t5, "_first_distances", moved)
    mismatches = vectors.check(VECTORS, ["t5_bucket"])
    assert sorted((m.case, m.expected, m.got) for m in mismatches) == [
        ("bidirectional_32_128", 15, 14), ("bidirectional_32_128", 31, 30),    # n = -91 and n = +91
        ("bidirectional_33_128", 15, 14), ("bidirectional_33_128", 31, 30)]


def test_check_catches_float64_t5_buckets(monkeypatch):
    original = t5.relative_position_bucket
    monkeypatch.setattr(t5, "relative_position_bucket", lambda n, **kw: original(n, **{**kw, "exact": True}))
    assert _failing_cases() == {"t5_bucket/causal_15_636_float32"}


def _rel_shift_wrong_sign(x):  # out[i, j] = x[i, j - (T - 1 - i)]: the shift in the wrong direction
    x = np.asarray(x, dtype=float)
    *_, T, S = x.shape
    idx = (np.arange(S)[None, :] - (T - 1 - np.arange(T))[:, None]) % S
    return np.take_along_axis(x, np.broadcast_to(idx, x.shape), axis=-1)


def test_check_catches_a_sign_in_the_relative_shift(monkeypatch):
    monkeypatch.setattr(transformer_xl, "rel_shift", _rel_shift_wrong_sign)
    failing = _failing_cases()
    assert {"rel_shift/memory_3x5", "rel_shift/heads_2x4x7", "xl_scores/memory_3", "xl_scores/memory_5"} <= failing
    assert all(name.startswith(("rel_shift/", "xl_scores/")) for name in failing)


def test_check_catches_the_rope_layout(monkeypatch):
    monkeypatch.setattr(rope, "rotate_half", rope.rotate_every_two)  # "half" pairs rotated as interleaved
    failing = _failing_cases()
    assert {"rope/half_d8", "rope/half_partial_4_of_8", "rope/half_heads_base_500000", "layer/rope_half",
            "layer/rope_half_cached", "layer/rope_yarn"} <= failing
    assert "rope/interleaved_d8" not in failing and "layer/rope_interleaved_partial" not in failing


def test_check_catches_the_papers_p2c_index(monkeypatch):
    code = deberta.p2c_term
    monkeypatch.setattr(deberta, "p2c_term", lambda k, pq, rel, span: code(k, pq, -np.asarray(rel), span))
    failing = _failing_cases()
    assert failing == {"deberta_scores/c2p_p2c_buckets_4_8", "deberta_scores/p2c_only",
                       "deberta_scores/p2c_c2p_clipped_span_3", "deberta_scores/cached_step_T3_S7_buckets_4_8",
                       "layer/deberta", "layer/deberta_padded", "layer_grad/deberta",
                       "layer_grad/deberta_causal_padded"}


def test_check_reports_a_raising_case_and_a_missing_file(monkeypatch, tmp_path):
    monkeypatch.setattr(alibi, "alibi_slopes", lambda num_heads: 1 / 0)
    lines = [str(m) for m in vectors.check(VECTORS, ["alibi_slopes"])]
    assert lines[0] == "alibi_slopes/heads_1: raised ZeroDivisionError: division by zero"
    assert [str(m) for m in vectors.check(tmp_path, ["rope"])] == [f"rope/-: no file {tmp_path / 'rope.json'}"]
