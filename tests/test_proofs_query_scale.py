"""proofs.query_scale: each theorem fails when the code it is tied to is wrong.

The wrong versions are the mistakes a port makes: Llama 4's count i + 1 in place of p (transformers 5.24's
``Llama4TextAttention`` floors ``(positions + 1) / floor_scale``, so it scales p = L - 1; Ministral 3's
``get_llama_4_attn_scale`` floors ``position_ids / L`` and does not), a query scale that is never applied, keys
scaled like the queries, and a backward that divides by the scale instead of multiplying."""

import numpy as np
import pytest

pytest.importorskip("sympy")

from _proof_support import proof_failure  # noqa: E402

from minipos import query_scale  # noqa: E402
from proofs.core import TieMismatch, select  # noqa: E402


def test_the_theorems_pass_as_the_code_is():
    for theorem in select(["query_scale"]):
        assert theorem.prove().steps > 0


def test_counting_i_plus_one_fails_the_staircase(monkeypatch):
    def llama4_count(positions, *, beta, original_max_position_embeddings):       # Llama 4's i + 1
        pos = np.asarray(positions)
        return 1.0 + beta * np.log1p((pos + 1) // original_max_position_embeddings)
    err = proof_failure("query_scale.steps", monkeypatch, query_scale, "llama4_query_scale", llama4_count)
    # Ministral 3's p = 16383 = L - 1: 1 here, 1 + 0.1 ln 2 under the i + 1 count.
    assert isinstance(err, TieMismatch) and "query_scale.steps" in str(err) and "llama4_query_scale" in str(err)


def test_a_scale_never_applied_fails_the_score(monkeypatch):
    err = proof_failure("query_scale.score", monkeypatch, query_scale, "apply_query_scale",
                        lambda q, positions, **kw: np.asarray(q, dtype=float))
    assert isinstance(err, TieMismatch) and "apply_query_scale" in str(err)


def test_keys_scaled_too_fail_the_scheme_tie(monkeypatch):
    # The score would be s(m) s(n) q^T R(n - m) k: the tie through ScaledQueryRotary sees it.
    plain_k = query_scale.ScaledQueryRotary.rotate_k

    def scaled_k(self, k, positions, *, seq_len):
        return query_scale.apply_query_scale(plain_k(self, k, positions, seq_len=seq_len), positions,
                                             **self._kw())
    monkeypatch.setattr(query_scale.ScaledQueryRotary, "rotate_k", scaled_k)
    with pytest.raises(TieMismatch, match="ScaledQueryRotary"):
        select(["query_scale.score"])[0].prove()


def test_a_backward_that_divides_fails(monkeypatch):
    def divided(dy, positions, *, beta, original_max_position_embeddings):
        s = query_scale.llama4_query_scale(positions, beta=beta,
                                           original_max_position_embeddings=original_max_position_embeddings)
        return np.asarray(dy) / s[:, None]
    err = proof_failure("query_scale.backward", monkeypatch, query_scale, "apply_query_scale_backward", divided)
    assert isinstance(err, TieMismatch) and "apply_query_scale_backward" in str(err)
