"""Online-softmax proofs: every theorem passes; a merge without rescaling, a broken softmax or a
blockwise form that normalises per block fail loudly."""

import numpy as np
import pytest

sp = pytest.importorskip("sympy")

import minipos.attention  # noqa: E402
import minipos.fast.attention  # noqa: E402
from proofs import online_softmax as proofs_os  # noqa: E402
from proofs.core import ProofFailure, StepFalse, Theorem, TieMismatch, select  # noqa: E402

THEOREMS = select(["online_softmax"])


def test_the_family_is_registered():
    assert {t.id for t in THEOREMS} >= {"online_softmax.merge", "online_softmax.stream"}


def test_block_merge_on_a_hand_worked_case():
    # x = (0, ln 3 | ln 2, 0), v = (1, 0 | 0, 1): e^x = (1, 3 | 2, 1), total 7,
    # so the weights are (1, 3, 2, 1) / 7 and softmax(x) . v = (1 + 1) / 7 = 2/7.
    x, v = (0.0, np.log(3.0), np.log(2.0), 0.0), (1.0, 0.0, 0.0, 1.0)
    weights, o = proofs_os._blocks_via_softmax(minipos.attention.softmax, x, v, 2)
    np.testing.assert_allclose(weights, np.array([1, 3, 2, 1]) / 7)
    np.testing.assert_allclose(o, 2 / 7)


def test_merge_without_rescaling_is_false():
    m1, m2, m = sp.symbols("m_1 m_2 m", real=True)
    x = sp.symbols("x0:4", real=True)
    v = sp.symbols("v0:4", real=True)

    def proof(p):
        l1, _ = proofs_os._stats(x[:2], v[:2], m1)
        l2, _ = proofs_os._stats(x[2:], v[2:], m2)
        p.claim(l1 + l2, proofs_os._stats(x, v, m)[0], "add the block sums as they are", by="expand")
    with pytest.raises(StepFalse) as err:
        Theorem("online_softmax.demo", "no rescaling", proof).prove()
    assert "theorem online_softmax.demo, step 1 ('add the block sums as they are')" in str(err.value)
    assert "counterexample: m = " in str(err.value)


def test_unnormalised_softmax_fails_the_merge(monkeypatch):
    monkeypatch.setattr(minipos.attention, "softmax", lambda x, axis=-1: np.exp(np.asarray(x, float)))
    with pytest.raises(ProofFailure) as err:
        select(["online_softmax.merge"])[0].prove()
    assert isinstance(err.value, TieMismatch)
    assert ("theorem online_softmax.merge, tie to minipos.attention.softmax "
            "('rescaled block weights = softmax of the union, blocks 2 + 2')") in str(err.value)


def test_missing_blockwise_form_is_reported_missing(monkeypatch):
    monkeypatch.delattr(minipos.attention, "blockwise_attention")
    result = select(["online_softmax.merge"])[0].run()
    assert result.status == "MISSING"
    assert "theorem online_softmax.merge, tie to minipos.attention.blockwise_attention [MISSING]" in result.message
    assert "minipos.attention.blockwise_attention" in result.checks


def test_blockwise_that_normalises_each_block_fails(monkeypatch):
    def per_block(q, k, v, *, block_size, causal=False, scale=None, **kw):  # averages per-block softmax outputs
        S = k.shape[-2]
        mask = np.tril(np.ones((q.shape[-2], S), bool), S - q.shape[-2]) if causal else None
        outs = [minipos.attention.attention(q, k[..., s:s + block_size, :], v[..., s:s + block_size, :],
                                            mask=None if mask is None else mask[:, s:s + block_size], scale=scale)
                for s in range(0, S, block_size)]
        return sum(outs) / len(outs)
    monkeypatch.setattr(minipos.attention, "blockwise_attention", per_block)
    with pytest.raises(ProofFailure) as err:
        select(["online_softmax.merge"])[0].prove()
    assert ("theorem online_softmax.merge, tie to minipos.attention.blockwise_attention "
            "('equals softmax(scale q.k) v, for logits near 1 and near 1000')") in str(err.value)
    assert "at block_size = 1, causal = False, scale = 0.5" in str(err.value)


@pytest.mark.parametrize("module", ["reference", "fast"])
def test_blockwise_without_the_running_max_fallback_fails(monkeypatch, module):
    # A blockwise form that keeps the first block's max as a fixed reference and never falls
    # back overflows once a later block's logits rise ~1000 above it: the tie at scale 400 fails.
    def fixed_only(q, k, v, *, block_size, causal=False, scale=None):
        S = k.shape[-2]
        logits = np.einsum("...td,...sd->...ts", q, k) * scale
        if causal:
            logits = np.where(np.tril(np.ones((q.shape[-2], S), bool), S - q.shape[-2]), logits, -np.inf)
        m = np.max(logits[..., max(S - block_size, 0):], axis=-1, keepdims=True)   # the last key block's max
        m = np.where(np.isfinite(m), m, np.max(logits, axis=-1, keepdims=True))    # (a row it masks: the row's)
        with np.errstate(over="ignore", invalid="ignore"):
            w = np.exp(logits - m)
            return (w @ v) / w.sum(-1, keepdims=True)
    target = minipos.attention if module == "reference" else minipos.fast.attention
    monkeypatch.setattr(target, "blockwise_attention", fixed_only)
    with pytest.raises(ProofFailure) as err:
        select(["online_softmax.merge"])[0].prove()
    assert "scale = 400.0" in str(err.value)
    assert f"tie to {target.__name__}.blockwise_attention" in str(err.value)
