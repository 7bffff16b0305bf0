"""The MLA and sink theorems can fail: each is fed a wrong formula or a broken minipos function."""

import numpy as np
import pytest

sp = pytest.importorskip("sympy")

import minipos.attention as attention_module  # noqa: E402
import minipos.mla as mla  # noqa: E402
import proofs.mla as proof_mla  # noqa: E402
from proofs.core import ProofFailure, select  # noqa: E402

from _proof_support import proof_failure  # noqa: E402


def test_mla_absorb_fails_for_a_rotation_that_is_not_relative(monkeypatch):
    # A rotation by the angle m^2 theta is orthogonal, but R(i)^T R(j) turns by (j^2 - i^2) theta, not
    # (j - i)^2 theta: the step "R(i)^T R(j) = R(j - i)" must fail.
    good = proof_mla.R
    monkeypatch.setattr(proof_mla, "R", lambda m, D: good(m * m, D))
    with pytest.raises(ProofFailure, match="R\\(j - i\\)"):
        select(["mla.absorb"])[0].prove()


def test_mla_decoupled_fails_when_mscale_ignores_mscale_all_dim(monkeypatch):
    # DeepSeek's mscale is 0.1 m ln s + 1; dropping m (a common port error) must fail the tie.
    broken = lambda factor, mscale=1.0: 1.0 if factor <= 1 else 0.1 * np.log(factor) + 1.0  # noqa: E731
    failure = proof_failure("mla.decoupled", monkeypatch, mla, "yarn_get_mscale", broken)
    assert "yarn_get_mscale" in str(failure) or "MultiHeadLatentAttention" in str(failure)


def test_mla_decoupled_fails_for_an_rms_norm_without_epsilon(monkeypatch):
    # at x = (1e-3, 0, 0), eps = 1e-6 the true output is 1e-3 / sqrt(1e-6 / 3 + 1e-6) = 0.866, not 1.732
    broken = lambda x, w, eps=1e-6: w * x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True))  # noqa: E731
    failure = proof_failure("mla.decoupled", monkeypatch, mla, "rms_norm", broken)
    assert "rms_norm" in str(failure)


def test_sink_theorem_fails_when_attention_drops_the_sink(monkeypatch):
    # attention that ignores the sink column is plain softmax: its weights sum to 1, not to 1 - p_sink.
    good = attention_module.attention
    broken = lambda q, k, v, **kw: good(q, k, v, **{**kw, "sinks": None})  # noqa: E731
    proof_failure("sinks.sink_softmax", monkeypatch, attention_module, "attention", broken)
