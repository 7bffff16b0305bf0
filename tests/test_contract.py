"""The contract, for every scheme of the registry: no list of schemes here, ``minipos.schemes`` is it.

Each entry of ``minipos.schemes.ENTRIES`` gets every check of ``_contract.CHECKS`` (its backward against
central differences, fast equal to reference, cached decoding equal to the full pass, blockwise equal to
dense, its seams' checks, its golden ``layer`` cases, its tour row) and a hypothesis property over random
shapes, paths and garbage in its seams. A scheme registered at run time gets the same (the last tests),
and a scheme whose backward is wrong fails it, as it fails the golden vectors' build.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minipos import schemes, vectors
from minipos.seams import Scheme
from minipos.t5 import T5Bias

import _contract
from _contract import CHECKS, PATHS, applicable_garbage, expect_refused

NAMES = list(schemes.ENTRIES)


@pytest.mark.parametrize("check", list(CHECKS))
@pytest.mark.parametrize("name", NAMES)
def test_contract(name, check):
    CHECKS[check](name)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=12, deadline=None)
@given(data=st.data(), batch=st.integers(1, 2), length=st.integers(1, 5), heads=st.integers(1, 2),
       start=st.integers(0, 6), path=st.sampled_from(sorted(PATHS)))
def test_garbage_in_any_seam_is_refused_naming_the_seam(name, data, batch, length, heads, start, path):
    kinds = applicable_garbage(name)
    seam = data.draw(st.sampled_from(sorted(kinds)), label="seam")
    kind = data.draw(st.sampled_from(kinds[seam]), label="garbage")
    expect_refused(name, seam, kind, path, batch=batch, length=length, heads=heads, start=start)


# --------------------------------------------------------------------------- a scheme registered at run time

class LearnedLogDistance(Scheme):
    """``b_h(i, j) = w_h log(1 + |i - j|)``, ``w`` ``(H,)`` learned: a bias scheme a test registers."""

    name = "test-learned-log-distance"
    seams = ("bias",)
    terms = ("content-content", "position-position")

    def __init__(self, *, init: float = -0.5):
        self.init = float(init)

    def bind(self, layer, rng):
        super().bind(layer, rng)
        self.w = (self.init + 0.1 * rng.standard_normal(self.num_heads)).astype(layer.dtype)

    def parameters(self):
        return {"w": self.w}

    def _distance(self, q_positions, k_positions):
        return np.log1p(np.abs(q_positions[:, None] - k_positions[None, :]))            # (T, S)

    def bias(self, q_positions, k_positions):
        return (self.w[:, None, None] * self._distance(q_positions, k_positions)).astype(self.w.dtype)

    def bias_backward(self, q_positions, k_positions, dbias):
        per_head = dbias.reshape(-1, *dbias.shape[-3:]).sum(axis=0)                     # (H, T, S)
        dw = np.einsum("hts,ts->h", per_head, self._distance(q_positions, k_positions))
        return {"scheme.w": dw.astype(self.w.dtype)}


class NegatedBackward(LearnedLogDistance):
    """The same scheme with its backward negated: the contract and the golden vectors must refuse it."""

    name = "test-negated-backward"

    def bias_backward(self, q_positions, k_positions, dbias):
        return {k: -v for k, v in super().bias_backward(q_positions, k_positions, dbias).items()}


@pytest.fixture
def registered():
    added = []

    def register(cls, **kw):
        schemes.register(cls, **kw)
        added.append(cls.name)
    yield register
    for name in added:
        schemes.unregister(name)


def test_a_scheme_registered_at_run_time_gets_the_whole_contract(registered):
    registered(LearnedLogDistance, example=lambda L: {"init": -0.25})
    for check in CHECKS.values():
        check(LearnedLogDistance.name)
    kinds = applicable_garbage(LearnedLogDistance.name)
    assert "bias_backward" in kinds                                     # its own backward seam is hardened too
    for seam in kinds:
        expect_refused(LearnedLogDistance.name, seam, kinds[seam][0], "fast blockwise")


def test_a_negated_backward_fails_the_contract_and_the_golden_vectors(registered):
    registered(NegatedBackward)
    with pytest.raises(AssertionError, match="scheme.w"):
        CHECKS["backward"](NegatedBackward.name)
    for check in ("fast", "cache", "blockwise", "tour"):                # the forward is right: only that fails
        CHECKS[check](NegatedBackward.name)
    with pytest.raises(ValueError, match="finite differences") as err:
        vectors.build_family("layer_grad")
    assert "test_negated_backward_example" in str(err.value) and "scheme.w" in str(err.value)


def test_a_wrong_backward_of_a_shipped_scheme_fails_too(registered):
    # A subclass of a real scheme whose table gradient is doubled: caught by the same check.
    class Doubled(T5Bias):
        name = "test-doubled-t5"

        def bias_backward(self, q_positions, k_positions, dbias):
            return {k: 2 * v for k, v in super().bias_backward(q_positions, k_positions, dbias).items()}
    registered(Doubled)
    with pytest.raises(AssertionError, match="scheme.table"):
        CHECKS["backward"](Doubled.name)


def test_the_checks_are_the_documented_ones():
    assert list(CHECKS) == ["backward", "fast", "cache", "blockwise", "seams", "golden", "tour"]
    assert _contract.REGENERATE == "python tools/regenerate.py"
