"""``spec/check_port.py`` reports a wrong port the way a porter needs it, and refuses what it cannot read.

The ports here are deliberately wrong, written in NumPy from the spec (not from minipos): each
failure must be one line per case and output, with the count of differing values, the largest
error, the tolerance and the first few values named by what they mean; a port that raises fails
only its case; a spec of another major version is refused.
"""

import importlib.util
import json
import pathlib
import shutil
import sys

import numpy as np
import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
VECTORS = ROOT / "spec" / "vectors"


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


check_port = _load("spec/check_port.py", "check_port_under_test")


def alibi_bias(slopes, q_positions, k_positions, *, symmetric):  # the spec's -m (i - j), or -m |i - j|
    rel = np.subtract.outer(q_positions, k_positions).astype(float)
    return -slopes[:, None, None] * (np.abs(rel) if symmetric else rel)


def test_a_right_port_passes_every_case():
    report = check_port.assert_family("alibi_bias", alibi_bias)
    assert report.failed == [] and report.skipped == [] and len(report.passed) == 4


def test_a_wrong_sign_is_one_line_per_case_naming_head_query_and_key_by_position():
    def wrong_sign(slopes, q_positions, k_positions, *, symmetric):  # +m (i - j): rewards distance
        return -alibi_bias(slopes, q_positions, k_positions, symmetric=symmetric)

    report = check_port.run_family("alibi_bias", wrong_sign)
    assert report.failed == ["causal_form_h4", "symmetric_h4", "cached_step_h3", "symmetric_cached_h6"]
    assert len(report.mismatches) == 4 and report.passed == []
    line = next(m for m in report.mismatches if m.startswith("alibi_bias/cached_step_h3:"))
    # queries at positions 5, 6 after a cache; slope 2^-4 for head 0; i = j is 0 either way and passes
    assert line == ("alibi_bias/cached_step_h3: bias: 36 of 42 values differ, max |got - expected| 3 "
                    "(tolerance atol 1e-12 + rtol 1e-12 |expected|); "
                    "h = 0, t = 0 (position 5), s = 0 (position 0): expected -0.3125, got 0.3125; "
                    "h = 0, t = 0 (position 5), s = 1 (position 1): expected -0.25, got 0.25; "
                    "h = 0, t = 0 (position 5), s = 2 (position 2): expected -0.1875, got 0.1875; ..."), line


def test_a_t5_bucket_is_named_by_its_distance():
    def off_by_one_at_91(relative_position, *, bidirectional, num_buckets, max_distance, exact):
        if (bidirectional, num_buckets, max_distance) != (True, 32, 128) or exact:
            raise NotImplementedError
        n = np.asarray(relative_position)
        m, off = np.abs(n), (n > 0) * 16
        first = np.array([0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 23, 32, 46, 64, 92])   # 92 in place of 91
        return off + np.searchsorted(first, m, side="right") - 1

    report = check_port.run_family("t5_bucket", off_by_one_at_91)
    others = len(check_port.load_family("t5_bucket")["cases"]) - 1          # every other case is skipped
    assert report.failed == ["bidirectional_32_128"] and len(report.skipped) == others
    assert report.mismatches == [
        "t5_bucket/bidirectional_32_128: bucket: 2 of 697 values differ, max |got - expected| 1 (tolerance atol 0 "
        "+ rtol 0 |expected|); n = -91: expected 15, got 14; n = 91: expected 31, got 30"]


def test_an_exception_fails_its_case_and_the_family_goes_on():
    def crashes_on_three_heads(slopes, q_positions, k_positions, *, symmetric):
        if len(slopes) == 3:
            raise IndexError("head 3 of 3")
        return alibi_bias(slopes, q_positions, k_positions, symmetric=symmetric)

    report = check_port.run_family("alibi_bias", crashes_on_three_heads)
    assert report.failed == ["cached_step_h3"] and len(report.passed) == 3
    assert report.mismatches == ["alibi_bias/cached_step_h3: raised IndexError: head 3 of 3"]
    with pytest.raises(AssertionError, match="1 failed"):
        check_port.assert_family("alibi_bias", crashes_on_three_heads)


def test_not_implemented_skips_and_a_family_with_nothing_run_does_not_pass():
    def nothing(**kw):
        raise NotImplementedError

    report = check_port.run_family("alibi_bias", nothing)
    assert len(report.skipped) == 4 and not report.failed
    with pytest.raises(AssertionError, match="0 passed, 4 skipped"):
        check_port.assert_family("alibi_bias", nothing)


def test_shape_missing_outputs_and_nan_are_failures():
    report = check_port.run_family("alibi_slopes", lambda num_heads: np.zeros(num_heads + 1))
    assert report.mismatches[0] == "alibi_slopes/heads_1: slopes: shape [2], expected [1]"
    report = check_port.run_family("alibi_slopes", lambda num_heads: {"other": np.zeros(num_heads)})
    assert report.mismatches[0] == "alibi_slopes/heads_1: slopes: output missing"
    report = check_port.run_family("alibi_slopes", lambda num_heads: np.full(num_heads, np.nan))
    assert "max |got - expected| NaN" in report.mismatches[0] and len(report.failed) == 18


def test_a_gradient_port_with_a_classic_mistake_is_named_by_query_and_feature():
    """A RoPE backward that rotates by +angle (the forward again) instead of -angle."""
    def rotate(x, positions, *, layout, rotary_dim, attention_factor, inv_freq=None, base=10000.0, sign=1.0):
        R = rotary_dim or x.shape[-1]
        inv = base ** (-np.arange(0, R, 2) / R) if inv_freq is None else inv_freq
        ang = np.outer(positions, inv)
        cos, sin = attention_factor * np.cos(ang), sign * attention_factor * np.sin(ang)
        if layout == "interleaved":
            a, b = x[..., 0:R:2], x[..., 1:R:2]
            rot = np.stack([a * cos - b * sin, a * sin + b * cos], -1).reshape(*x.shape[:-1], R)
        else:
            a, b = x[..., :R // 2], x[..., R // 2:R]
            rot = np.concatenate([a * cos - b * sin, a * sin + b * cos], -1)
        return np.concatenate([rot, x[..., R:]], -1)

    right = check_port.run_family("rope_grad", lambda dy, positions, **kw: rotate(dy, positions, sign=-1.0, **kw))
    assert right.failed == [] and len(right.passed) == 4
    wrong = check_port.run_family("rope_grad", lambda dy, positions, **kw: rotate(dy, positions, **kw))
    assert wrong.failed == [c["name"] for c in json.loads((VECTORS / "rope_grad.json").read_text())["cases"]]
    line = wrong.mismatches[0]
    assert line.startswith("rope_grad/interleaved_d8: dx: ") and " values differ, max |got - expected| " in line
    assert "[0], t = 1 (position 1), d = 0: expected " in line   # batch 0; position 0 is R(0) = I and passes


def test_a_flat_index_names_a_value_of_an_output_without_named_axes(tmp_path):
    shutil.copy(VECTORS / "alibi_slopes.json", tmp_path / "alibi_slopes.json")
    doc = json.loads((tmp_path / "alibi_slopes.json").read_text())
    doc["family"] = "unknown_family"
    (tmp_path / "unknown_family.json").write_text(json.dumps(doc))
    report = check_port.run_family("unknown_family", lambda num_heads: np.zeros(num_heads), directory=tmp_path)
    assert report.mismatches[1].endswith("flat index 0: expected 0.0625, got 0.0; flat index 1: expected "
                                         "0.00390625, got 0.0")


@pytest.mark.parametrize("version, ok", [("1.0.0", True), ("1.7.2", True), ("2.0.0", False), ("0.9.0", False)])
def test_spec_version_of_another_major_is_refused(tmp_path, version, ok):
    doc = json.loads((VECTORS / "alibi_slopes.json").read_text())
    doc["spec_version"] = version
    (tmp_path / "alibi_slopes.json").write_text(json.dumps(doc))
    slopes = lambda num_heads: 2.0 ** (-8.0 * np.arange(1, num_heads + 1) / num_heads)  # noqa: E731
    if ok:
        check_port.run_family("alibi_slopes", slopes, directory=tmp_path)
    else:
        with pytest.raises(ValueError, match=f"spec_version '{version}'; this check_port.py reads 1.x"):
            check_port.run_family("alibi_slopes", slopes, directory=tmp_path)


def test_a_file_that_is_not_a_vectors_file_is_refused(tmp_path):
    (tmp_path / "alibi_slopes.json").write_text(json.dumps({"format": "other", "spec_version": "1.0.0"}))
    with pytest.raises(ValueError, match="not a minipos vectors file"):
        check_port.load_family("alibi_slopes", tmp_path)


def test_every_family_and_output_of_the_spec_has_named_axes():
    for path in sorted(VECTORS.glob("*.json")):
        doc = json.loads(path.read_text())
        axes = check_port.AXES.get(doc["family"], {})
        for case in doc["cases"]:
            for name, array in case["expected"].items():
                if name in axes:
                    assert len(axes[name]) <= len(array["shape"]), (doc["family"], name)
                elif array["shape"] and not (doc["family"].endswith("layer_grad") or doc["family"] in ("mla_grad", "inkling_grad") or
                                             doc["family"] == "local_global_grad" and name[0] in "wb"):
                    # a layer's weight gradients: flat
                    pytest.fail(f"{doc['family']}/{case['name']}: {name} has no named axes")


def _toy_family(tmp_path, family="toy"):
    """A one-case family written by hand: y = x * scheme.table, and dscheme.table the same product
    (so a port can return it under the identifier), with a parameter ``x`` that the input shadows."""
    doc = {"format": "minipos-vectors", "spec_version": "1.0.0", "family": family, "cases": [{
        "name": "dotted", "note": "", "params": {"x": "a parameter, shadowed by the input x", "k": 2.0},
        "inputs": {"x": {"dtype": "float64", "shape": [2], "data": [1.5, -2.0]},
                   "scheme.table": {"dtype": "float64", "shape": [2], "data": [3.0, 0.25]}},
        # 2 * [1.5 * 3, -2 * 0.25] = [9, -1], by hand
        "expected": {"y": {"dtype": "float64", "shape": [2], "data": [9.0, -1.0]},
                     "scheme.table": {"dtype": "float64", "shape": [2], "data": [9.0, -1.0]}},
        "tolerance": {"float64": {"rtol": 0, "atol": 0}, "float32": {"rtol": 0, "atol": 0}}}]}
    (tmp_path / f"{family}.json").write_text(json.dumps(doc))


def test_a_dotted_input_is_bound_as_an_identifier_and_an_input_wins_over_a_parameter(tmp_path):
    _toy_family(tmp_path)
    seen = {}

    def port(x, scheme_table, k):
        seen.update(x=x, scheme_table=scheme_table)
        y = k * x * scheme_table
        return {"y": y, "scheme_table": y}   # the dotted output under its identifier too

    report = check_port.run_family("toy", port, directory=tmp_path)
    assert report.passed == ["dotted"], str(report)
    assert seen["x"].tolist() == [1.5, -2.0] and seen["scheme_table"].tolist() == [3.0, 0.25]
    assert check_port.identifier("scheme.w_k") == "scheme_w_k" and check_port.identifier("dy") == "dy"
    # adapt still gets the recorded names, as before
    report = check_port.run_family("toy", port, directory=tmp_path,
                                   adapt=lambda i, p: {"x": i["x"], "scheme_table": i["scheme.table"], "k": p["k"]})
    assert report.passed == ["dotted"]


def test_two_inputs_bound_under_one_name_fail_their_case(tmp_path):
    _toy_family(tmp_path)
    doc = json.loads((tmp_path / "toy.json").read_text())
    doc["cases"][0]["inputs"]["scheme_table"] = doc["cases"][0]["inputs"]["scheme.table"]
    (tmp_path / "toy.json").write_text(json.dumps(doc))
    report = check_port.run_family("toy", lambda **kw: kw["x"], directory=tmp_path)
    assert report.mismatches == ["toy/dotted: raised ValueError: inputs 'scheme.table' and 'scheme_table' would "
                                 "both be bound as 'scheme_table'"]


def test_local_global_sinks_reach_the_port_as_the_array_of_logits():
    got = []

    def record(**kw):
        got.append(kw["sinks"])
        raise NotImplementedError

    check_port.run_family("local_global", record)
    doc = json.loads((VECTORS / "local_global.json").read_text())
    for case, sinks in zip(doc["cases"], got):
        if case["params"]["sinks"]:   # spec/README.md: sinks (H,) when sinks
            assert np.asarray(sinks).shape == tuple(case["inputs"]["sinks"]["shape"]), case["name"]
        else:
            assert sinks is False, case["name"]


def test_cast_hands_a_float32_run_float32_floats_and_leaves_integers():
    dtypes = []

    def in_float32(slopes, q_positions, k_positions, *, symmetric):
        dtypes.append((slopes.dtype.name, q_positions.dtype.name))
        rel = np.subtract.outer(q_positions, k_positions).astype(slopes.dtype)
        return -slopes[:, None, None] * (np.abs(rel) if symmetric else rel)

    report = check_port.assert_family("alibi_bias", in_float32, precision="float32", cast=True)
    assert len(report.passed) == 4 and set(dtypes) == {("float32", "int64")}
    dtypes.clear()
    check_port.assert_family("alibi_bias", in_float32, precision="float32")   # default: as recorded
    assert set(dtypes) == {("float64", "int64")}
    dtypes.clear()
    check_port.assert_family("alibi_bias", in_float32, cast=True)             # float64 run: nothing to do
    assert set(dtypes) == {("float64", "int64")}
    with pytest.raises(TypeError, match="cast must be True or False"):
        check_port.run_family("alibi_bias", in_float32, cast="float32")


def test_output_gradient_binds_every_family_s_gradient_under_one_name():
    def learned_backward(table, positions, grad):   # spec: dtable[p] = sum of dout over the tokens at p
        idx = np.broadcast_to(positions, grad.shape[:-1]).reshape(-1)
        dtable = np.zeros(table.shape)
        np.add.at(dtable, idx, grad.reshape(-1, grad.shape[-1]))
        return dtable

    report = check_port.assert_family("learned_grad", learned_backward, output_gradient="grad")
    assert report.failed == [] and report.passed
    # without it the recorded name (dout) is bound, as before
    report = check_port.assert_family("learned_grad", lambda table, positions, dout:
                                      learned_backward(table, positions, dout))
    assert report.failed == []
    # a family outside the table is bound as it is
    check_port.assert_family("alibi_bias", alibi_bias, output_gradient="grad")
    with pytest.raises(ValueError, match="output_gradient must be None or a Python identifier"):
        check_port.run_family("learned_grad", learned_backward, output_gradient="d.out")
    report = check_port.run_family("learned_grad", learned_backward, output_gradient="positions")
    assert report.mismatches[0].endswith("raised ValueError: output_gradient 'positions' is already an input "
                                         "of this case")


def test_the_output_gradient_table_names_an_input_of_every_case_of_every_gradient_family():
    grads = {p.stem for p in VECTORS.glob("*_grad.json")}
    assert set(check_port.OUTPUT_GRADIENT) == grads
    # spec/README.md's family table: each output gradient is dout, dy or dbias
    assert set(check_port.OUTPUT_GRADIENT.values()) == {"dout", "dy", "dbias"}
    for family, name in check_port.OUTPUT_GRADIENT.items():
        for case in json.loads((VECTORS / f"{family}.json").read_text())["cases"]:
            assert name in case["inputs"], (family, case["name"])


def test_the_readme_table_of_output_gradients_is_the_checker_s():
    readme = (ROOT / "spec" / "README.md").read_text()
    rows = {}
    for line in readme.splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if len(cells) == 2 and cells[0] in ("dout", "dy", "dbias"):
            rows.update({f.strip().strip("`"): cells[0] for f in cells[1].split(",")})
    assert rows == check_port.OUTPUT_GRADIENT
