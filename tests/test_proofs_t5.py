"""T5 proofs: every theorem passes; a shifted bucket or a wrong bias fails its theorem loudly."""

import numpy as np
import pytest

sp = pytest.importorskip("sympy")

import minipos.t5  # noqa: E402
from proofs import t5 as proofs_t5  # noqa: E402
from _proof_support import proof_failure  # noqa: E402
from proofs.core import StepFalse, Theorem, TieMismatch, select  # noqa: E402

THEOREMS = select(["t5"])


def test_the_family_is_registered():
    assert {t.id for t in THEOREMS} >= {"t5.bucket.first_distance", "t5.bucket.last_starts_at_91",
                                        "t5.bucket.monotone", "t5.score.terms"}


def test_closed_form_matches_printed_reference_first_distances():
    # Printed by transformers 5.24.0 `T5Attention._relative_position_bucket` (torch 2.13.0 CPU):
    # the smallest |n| landing in each log bucket, for n = key - query <= 0.
    bidirectional_32_128 = {8: 8, 9: 12, 10: 16, 11: 23, 12: 32, 13: 46, 14: 64, 15: 91}
    causal_32_128 = {17: 19, 18: 21, 19: 24, 20: 27, 21: 31, 22: 35, 23: 40, 24: 46, 25: 52, 26: 59,
                     27: 67, 28: 77, 29: 87, 30: 99, 31: 113}
    first = proofs_t5._thresholds(16, 128)
    assert {b: first[b] for b in bidirectional_32_128} == bidirectional_32_128
    first = proofs_t5._thresholds(32, 128)
    assert {b: first[b] for b in causal_32_128} == causal_32_128


def test_closed_form_buckets_match_transformers_live():
    torch = pytest.importorskip("torch")
    t5 = pytest.importorskip("transformers.models.t5.modeling_t5")
    n = np.arange(-300, 301)
    for bidirectional, K, M in [(True, 32, 128), (False, 32, 128), (True, 64, 256)]:
        ref = t5.T5Attention._relative_position_bucket(torch.tensor(n), bidirectional=bidirectional,
                                                       num_buckets=K, max_distance=M).numpy()
        ours = [proofs_t5._bucket(int(v), bidirectional, K, M) for v in n]
        np.testing.assert_array_equal(ours, ref)


def _fails(theorem_id, monkeypatch, name, broken):
    return proof_failure(theorem_id, monkeypatch, minipos.t5, name, broken)


def test_bucket_shifted_by_one_fails(monkeypatch):
    good = minipos.t5.relative_position_bucket

    def late(n, **kw):  # the log buckets start one distance late
        n = np.asarray(n)
        return good(n - np.sign(n) * (np.abs(n) >= 9), **kw)
    err = _fails("t5.bucket.first_distance", monkeypatch, "relative_position_bucket", late)
    assert isinstance(err, TieMismatch)
    assert ("theorem t5.bucket.first_distance, tie to minipos.t5.relative_position_bucket "
            "('every n in [-2M, 2M], (True, 32, 128, False)') [case config = (True, 32, 128, False)]") in str(err)
    err = _fails("t5.bucket.last_starts_at_91", monkeypatch, "relative_position_bucket", late)
    assert "tie to minipos.t5.relative_position_bucket ('n = -90, -91" in str(err)


def test_first_distance_of_the_last_bucket_at_128_fails(monkeypatch):
    good = minipos.t5.first_distance_of_bucket

    def at_max_distance(**kw):
        out = good(**kw).copy()
        out[out == out.max()] = kw.get("max_distance", 128)
        return out
    err = _fails("t5.bucket.last_starts_at_91", monkeypatch, "first_distance_of_bucket", at_max_distance)
    assert "theorem t5.bucket.last_starts_at_91, tie to minipos.t5.first_distance_of_bucket" in str(err)


def test_a_bucket_function_that_decreases_fails_monotone(monkeypatch):
    good = minipos.t5.relative_position_bucket
    err = _fails("t5.bucket.monotone", monkeypatch, "relative_position_bucket",
                 lambda n, **kw: np.where(np.asarray(n) == -20, 0, good(n, **kw)))
    assert "theorem t5.bucket.monotone, requirement ('keys before the query: non-decreasing in |n|" in str(err)


def test_query_minus_key_sign_fails_the_score(monkeypatch):
    good = minipos.t5.t5_bias
    err = _fails("t5.score.terms", monkeypatch, "t5_bias", lambda table, q, k, **kw: np.swapaxes(
        good(table, k, q, **kw), -1, -2))  # buckets of query - key instead of key - query
    assert ("theorem t5.score.terms, tie to minipos.t5.t5_bias "
            "('softmax(q.k + table[bucket(j - i), h]), the T5Bias scale')") in str(err)


def test_t5bias_scaled_by_one_over_sqrt_d_fails_the_score(monkeypatch):
    layer = pytest.importorskip("minipos.layer")
    monkeypatch.setattr(layer.T5Bias, "scale", lambda self, head_dim: 1.0 / np.sqrt(head_dim))
    with pytest.raises(TieMismatch) as err:
        select(["t5.score.terms"])[0].prove()
    assert ("theorem t5.score.terms, tie to minipos.layer.T5Bias ('T5Bias().scale(D) = 1, not 1/sqrt(D)')"
            in str(err.value))
    assert "at D = 4" in str(err.value)


def test_claiming_the_last_bucket_starts_at_128_is_false():
    def proof(p):
        p.claim(sp.ceiling(8 * sp.Integer(16) ** sp.Rational(7, 8), evaluate=False), 128,
                "the last bucket starts at max_distance", by="doit")
    with pytest.raises(StepFalse) as err:
        Theorem("t5.demo", "a popular claim", proof).prove()
    assert "theorem t5.demo, step 1 ('the last bucket starts at max_distance')" in str(err.value)
    assert "residual[0]: -37" in str(err.value)
