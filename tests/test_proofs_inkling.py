"""proofs.inkling: each theorem fails when the code it is tied to is wrong.

The wrong versions are the mistakes a port makes: the forward distance j - p_i in the bias's gather, a log scale that
counts p in place of p + 1 (HF ``Inkling2LogScale`` counts ``position_ids + 1``), a clip backward without its radial
term, a convolution whose taps are read in the order of ``conv1d.weight`` (lag K - 1 first) without flipping them, and
per-query sinks read as one per head."""

import numpy as np
import pytest

pytest.importorskip("sympy")

from _proof_support import proof_failure  # noqa: E402

from minipos import attention, inkling  # noqa: E402
from proofs.core import ProofFailure, TieMismatch, select  # noqa: E402


def test_the_theorems_pass_as_the_code_is():
    for theorem in select(["inkling"]):
        assert theorem.prove().steps > 0


def test_the_forward_distance_fails_the_bias(monkeypatch):
    right = inkling.relative_bias

    def forward(rel, q_positions, k_positions):                          # j - p_i: keys after the query
        return right(rel, -np.asarray(q_positions), -np.asarray(k_positions))
    err = proof_failure("inkling.relative_bias", monkeypatch, inkling, "relative_bias", forward)
    assert isinstance(err, TieMismatch) and "relative_bias" in str(err)


def test_counting_p_fails_the_log_scale(monkeypatch):
    def counts_p(positions, *, alpha, n_floor):
        p = np.asarray(positions, dtype=float)
        return 1.0 + alpha * np.log(np.maximum(p / n_floor, 1.0))
    err = proof_failure("inkling.log_scale", monkeypatch, inkling, "log_scale", counts_p)
    assert isinstance(err, TieMismatch) and "log_scale" in str(err)


def test_a_clip_backward_without_its_radial_term_fails(monkeypatch):
    def scaled_only(a, threshold, d):
        n = np.linalg.norm(a, axis=-1, keepdims=True)
        return np.minimum(1.0, threshold / (n + inkling.CLIP_EPS)) * np.asarray(d)
    err = proof_failure("inkling.clip_backward", monkeypatch, inkling, "l2_clip_backward", scaled_only)
    assert isinstance(err, TieMismatch) and "l2_clip_backward" in str(err)


def test_taps_in_conv1d_order_fail_the_convolution(monkeypatch):
    right = inkling.short_conv

    def unflipped(u, history, taps, **kw):                               # conv1d.weight's order: lag K - 1 first
        return right(u, history, np.asarray(taps)[::-1], **kw)
    err = proof_failure("inkling.short_conv", monkeypatch, inkling, "short_conv", unflipped)
    assert isinstance(err, ProofFailure) and "short_conv" in str(err)


def test_per_query_sinks_read_per_head_fail(monkeypatch):
    right = attention.attention

    def per_head(q, k, v, *, sinks=None, **kw):                         # each head's first row's sink for all rows
        s = None if sinks is None else np.broadcast_to(np.asarray(sinks)[..., :1], np.shape(sinks))
        return right(q, k, v, sinks=s, **kw)
    err = proof_failure("inkling.sinks", monkeypatch, attention, "attention", per_head)
    assert isinstance(err, TieMismatch) and "attention" in str(err)
