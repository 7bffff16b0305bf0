"""DeBERTa proofs: every theorem passes; the paper's p2c index, a wrong scale or a shifted
bucket fail their theorem loudly."""

import numpy as np
import pytest

sp = pytest.importorskip("sympy")

import minipos.deberta  # noqa: E402
from proofs import deberta as proofs_deberta  # noqa: E402
from _proof_support import proof_failure  # noqa: E402
from proofs.core import StepFalse, Theorem, TieMismatch, select  # noqa: E402

THEOREMS = select(["deberta"])


def test_the_family_is_registered():
    assert {t.id for t in THEOREMS} >= {"deberta.terms.index", "deberta.scale.variance", "deberta.log_bucket"}


def test_exact_buckets_match_printed_reference():
    # Printed by transformers 5.24.0 `deberta_v2.modeling_deberta_v2.make_log_bucket_position`
    # (bucket_size 256, max_position 512): identity up to 131, then 131, and 255 at 511, 256 at 512.
    r = np.array([0, 1, 128, 129, 130, 131, 132, 511, 512, -129, -511])
    want = [0, 1, 128, 129, 130, 131, 131, 255, 256, -129, -255]
    np.testing.assert_array_equal(proofs_deberta._exact_log_bucket(r, 256, 512), want)


def test_exact_buckets_match_transformers_live():
    torch = pytest.importorskip("torch")
    ref = pytest.importorskip("transformers.models.deberta_v2.modeling_deberta_v2").make_log_bucket_position
    r = np.arange(-2000, 2001)
    for bs, mp in [(256, 512), (32, 128), (8, 32)]:
        np.testing.assert_array_equal(proofs_deberta._exact_log_bucket(r, bs, mp),
                                      ref(torch.tensor(r), bs, mp).numpy())


def _fails(theorem_id, monkeypatch, name, broken):
    return proof_failure(theorem_id, monkeypatch, minipos.deberta, name, broken)


def test_the_papers_p2c_index_in_the_code_fails(monkeypatch):
    good = minipos.deberta.p2c_term
    err = _fails("deberta.terms.index", monkeypatch, "p2c_term",  # delta(j, i) = clip(-(i - j) + k)
                 lambda k, pos_query, rel, span: good(k, pos_query, -np.asarray(rel), span))
    assert isinstance(err, TieMismatch)
    assert "theorem deberta.terms.index, tie to minipos.deberta.p2c_term ('k_j . Q^r[delta(i, j)], as in the code')" \
        in str(err)


def test_key_minus_query_relative_position_fails(monkeypatch):
    good = minipos.deberta.build_relative_position
    err = _fails("deberta.terms.index", monkeypatch, "build_relative_position",
                 lambda T, S, **kw: -good(T, S, **kw))  # key - query
    assert isinstance(err, TieMismatch)
    assert ("theorem deberta.terms.index, tie to minipos.deberta.build_relative_position "
            "('entry (i, j) = i - j, queries 0 … T-1, keys 0 … S-1')") in str(err)


def test_relative_positions_that_forget_the_cache_offset_fail(monkeypatch):
    good = minipos.deberta.relative_positions
    err = _fails("deberta.terms.index", monkeypatch, "relative_positions",
                 lambda q, k, **kw: good(np.arange(np.size(q)) if np.ndim(q) else q, k, **kw))
    assert ("theorem deberta.terms.index, tie to minipos.deberta.relative_positions "
            "('a cached step: queries c … c+2, keys 0 … c+4')") in str(err)
    assert "at cache = 7" in str(err)


def test_scale_sqrt_d_fails(monkeypatch):
    good = minipos.deberta.disentangled_scores

    def scaled_by_sqrt_d(*a, pos_att_type=("c2p", "p2c"), **kw):
        n = len(pos_att_type)
        return good(*a, pos_att_type=pos_att_type, **kw) * np.sqrt(1 + n)  # as if divided by sqrt(D)
    err = _fails("deberta.scale.variance", monkeypatch, "disentangled_scores", scaled_by_sqrt_d)
    assert "theorem deberta.scale.variance, tie to minipos.deberta.disentangled_scores" in str(err)
    assert "at seed = 3, n_terms = 2" in str(err)


def test_bucket_shifted_by_one_fails(monkeypatch):
    good = minipos.deberta.make_log_bucket_position

    def shifted(r, bs, mp, **kw):
        out = good(r, bs, mp, **kw)
        return out + np.sign(out) * (np.abs(out) > bs // 2)  # every log bucket one too high
    err = _fails("deberta.log_bucket", monkeypatch, "make_log_bucket_position", shifted)
    assert "theorem deberta.log_bucket, requirement ('2 mid - 1 at r = max_position - 1')" in str(err)
    assert "[case config = (256, 512)]" in str(err)


def test_identity_boundary_off_by_one_fails(monkeypatch):
    good = minipos.deberta.make_log_bucket_position

    def strict(r, bs, mp, **kw):  # identity only for |r| < mid: r = +-mid goes to the log branch
        r = np.asarray(r)
        out = good(r, bs, mp, **kw)
        return np.where(np.abs(r) == bs // 2, out + np.sign(r), out)
    err = _fails("deberta.log_bucket", monkeypatch, "make_log_bucket_position", strict)
    assert "requirement ('the identity for |r| <= bucket_size // 2')" in str(err)
    assert "r = [-128  128] -> [-129  129]" in str(err)


def test_claiming_the_papers_index_is_false():
    i, j = sp.symbols("i j", integer=True)
    k = sp.Symbol("k", integer=True, positive=True)

    def proof(p):
        p.claim(proofs_deberta._delta(i, j, k), proofs_deberta._delta(j, i, k), "delta is symmetric")
    with pytest.raises(StepFalse) as err:
        Theorem("deberta.demo", "the paper's index", proof).prove()
    assert "theorem deberta.demo, step 1 ('delta is symmetric')" in str(err.value)
    assert "counterexample: i = " in str(err.value)
