"""The example PyTorch port (``examples/torch_port.py``) against the golden vectors.

The port was written from ``spec/README.md`` without calling minipos; ``spec/check_port.py``
runs it over every case of a family and compares with the recorded tolerance. This is the
pattern a port in any framework follows.
"""

import importlib.util
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


port = _load("examples/torch_port.py", "torch_port")
check_port = _load("spec/check_port.py", "check_port")


def _tensors(dtype=None):
    """``adapt`` for run_family: float arrays become torch tensors of ``dtype`` (default: as recorded)."""
    def adapt(inputs, params):
        def convert(a):
            t = torch.from_numpy(a)
            return t.to(dtype) if dtype is not None and t.is_floating_point() else t
        return {**{k: convert(v) for k, v in inputs.items()}, **params}
    return adapt


FAMILIES = [
    ("rope", port.apply_rope),
    ("alibi_slopes", port.alibi_slopes),
    ("alibi_bias", port.alibi_bias),
    ("t5_bucket", port.relative_position_bucket),
    ("t5_bias", port.t5_bias),
    ("deberta_relative_position", port.relative_positions),
    ("deberta_log_bucket", port.make_log_bucket_position),
]


@pytest.mark.parametrize("family, fn", FAMILIES, ids=[f for f, _ in FAMILIES])
def test_port_reproduces_the_vectors_in_float64(family, fn):
    report = check_port.assert_family(family, fn, adapt=_tensors())
    if family == "t5_bucket":  # the port implements the float32 reference, not exact=True
        assert report.skipped == ["causal_15_636_exact"]
    else:
        assert not report.skipped


def test_port_in_float32_meets_the_float32_tolerance():
    check_port.assert_family("rope", port.apply_rope, adapt=_tensors(torch.float32), precision="float32")


def test_a_port_with_the_other_rope_layout_is_caught():
    def swapped(x, positions, *, layout, **kw):
        return port.apply_rope(x, positions, layout={"half": "interleaved", "interleaved": "half"}[layout], **kw)

    report = check_port.run_family("rope", swapped, adapt=_tensors())
    failed = {line.split(":")[0] for line in report.mismatches}
    assert {"rope/interleaved_d8", "rope/half_d8", "rope/half_partial_4_of_8"} <= failed
    assert report.passed == []


def test_a_port_with_float64_t5_buckets_fails_only_the_float32_boundary():
    def float64_buckets(relative_position, *, exact, **kw):
        import numpy as np
        from math import log
        n = np.asarray(relative_position)
        b, K, M = kw["bidirectional"], kw["num_buckets"], kw["max_distance"]
        P = K // 2 if b else K
        off, m = ((n > 0) * P, np.abs(n)) if b else (0, np.maximum(-n, 0))
        E = P // 2
        large = np.minimum(P - 1, E + (np.log(np.maximum(m, 1) / E) / log(M / E) * (P - E)).astype(np.int64))
        return off + np.where(m < E, m, large)

    report = check_port.run_family("t5_bucket", float64_buckets)
    assert report.failed == ["causal_15_636_float32"]
    assert report.mismatches == ["t5_bucket/causal_15_636_float32: bucket: 1 of 50 values differ, max |got - expected| "
                                 "1 (tolerance atol 0 + rtol 0 |expected|); n = -206: expected 13, got 12"]
