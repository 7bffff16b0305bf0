"""Gradient proofs: every theorem passes; each backward, broken the way backward passes break
(a dropped term, a forgotten scale, a wrong row sum, a per-block softmax, a rotation the wrong
way, a lost pair, a flipped sign), fails its theorem naming the theorem and the tie."""

import numpy as np
import pytest

sp = pytest.importorskip("sympy")

import minipos.alibi  # noqa: E402
import minipos.attention  # noqa: E402
import minipos.fast.attention  # noqa: E402
import minipos.rope  # noqa: E402
import minipos.t5  # noqa: E402
import minipos.transformer_xl  # noqa: E402
from _proof_support import proof_failure  # noqa: E402
from proofs import gradients as proofs_grad  # noqa: E402
from proofs.core import StepFalse, Theorem, TieMismatch, select  # noqa: E402

IDS = ["gradients.softmax_jacobian", "gradients.attention_ds", "gradients.rope_transpose",
       "gradients.rel_shift_adjoint", "gradients.t5_table", "gradients.online_softmax_backward_order",
       "gradients.alibi_slopes"]


def test_the_family_is_registered():
    assert {t.id for t in select(["gradients"])} == set(IDS)


@pytest.mark.parametrize("tid", IDS)
def test_theorem_passes_and_names_its_code(tid):
    result = select([tid])[0].run()
    assert result.status == "PASS", result.message
    assert result.checks and all(c.startswith("minipos.") for c in result.checks)


# ----------------------------------------------------------------- hand-worked values of the helpers

def test_softmax_vjp_on_a_hand_worked_case():
    # x = (ln 2, 0, 0): p = (1/2, 1/4, 1/4). dp = (1, 0, 0): sum(p dp) = 1/2, so
    # p * (dp - 1/2) = (1/4, -1/8, -1/8).
    x = sp.symbols("x0:3")
    J = proofs_grad._jacobian(proofs_grad._softmax(x)).subs({x[0]: sp.log(2), x[1]: 0, x[2]: 0})
    assert sp.simplify(J.T * sp.Matrix([1, 0, 0]) - sp.Matrix([sp.Rational(1, 4), -sp.Rational(1, 8),
                                                                -sp.Rational(1, 8)])) == sp.zeros(3, 1)


def test_rel_shift_adjoint_on_a_hand_worked_case():
    # T = 2, S = 3 (M = 1): out = [[x01, x02, 0], [x10, x11, x12]] (row 0 reads x[0, 1:], then the
    # pad), so the adjoint puts y00 at (0, 1), y01 at (0, 2), drops y02 and copies row 1.
    y = sp.Matrix([[1, 2, 3], [4, 5, 6]])
    assert proofs_grad._adjoint_formula(y) == sp.Matrix([[0, 1, 2], [4, 5, 6]])
    x = sp.Matrix(2, 3, lambda i, j: 10 * i + j + 1)
    assert proofs_grad._shift_by_trick(x) == sp.Matrix([[2, 3, 0], [11, 12, 13]])


def test_t5_small_config_buckets_by_hand():
    # 8 buckets, max distance 16, bidirectional: P = 4, E = 2, the one log threshold is
    # ceil(2 * 8^(1/2)) = 6, so |n| = 2..5 -> 2, |n| >= 6 -> 3; n > 0 adds 4.
    # Queries 0, 5 and keys 0, 2, 3, 9: n = [[0, 2, 3, 9], [-5, -3, -2, 4]].
    assert proofs_grad._t5_gradient((0, 5), (0, 2, 3, 9), 1, True, 8, 16)[2] == [[0, 6, 6, 7], [2, 2, 2, 6]]


# ----------------------------------------------------------------- broken code fails its theorem

def test_softmax_backward_without_the_row_sum_fails(monkeypatch):
    err = proof_failure("gradients.softmax_jacobian", monkeypatch, minipos.attention, "softmax_backward",
                        lambda p, dp, axis=-1: np.asarray(p) * np.asarray(dp))     # diag(p) dp only
    assert isinstance(err, TieMismatch)
    assert ("theorem gradients.softmax_jacobian, tie to minipos.attention.softmax_backward "
            "('J^T dp from the symbolic J, n = 3") in str(err)


def test_attention_backward_forgetting_scale_in_dq_fails(monkeypatch):
    good = minipos.attention.attention_backward

    def no_scale_in_dq(q, k, v, dout, *, bias=None, mask=None, scale=None):
        dq, dk, dv, dbias = good(q, k, v, dout, bias=bias, mask=mask, scale=scale)
        return dq / (1 / np.sqrt(np.shape(q)[-1]) if scale is None else scale), dk, dv, dbias
    err = proof_failure("gradients.attention_ds", monkeypatch, minipos.attention, "attention_backward",
                        no_scale_in_dq)
    assert isinstance(err, TieMismatch)
    assert ("theorem gradients.attention_ds, tie to minipos.attention.attention_backward "
            "('dq = sp.diff of <dO, O>, summed to the bias shape')") in str(err)
    assert "at seed = 0, mask = None" in str(err)


def test_blockwise_backward_with_rowsum_dp_instead_of_rowsum_do_o_fails(monkeypatch):
    good = minipos.attention.blockwise_attention_backward

    def rowsum_dp(q, k, v, out, lse, dout, **kw):
        # D_i is computed as rowsum(dO * out); handing it out = sum_j V_j makes it
        # rowsum(dO V^T) = rowsum(dP): the row sum of dP without the weights P.
        return good(q, k, v, np.broadcast_to(v.sum(-2, keepdims=True), out.shape), lse, dout, **kw)
    err = proof_failure("gradients.attention_ds", monkeypatch, minipos.attention, "blockwise_attention_backward",
                        rowsum_dp)
    assert ("theorem gradients.attention_ds, tie to minipos.attention.blockwise_attention_backward "
            "('dq (dS through bias_grad_fn) = sp.diff of <dO, O>')") in str(err)


def _per_block_softmax(good):
    """A blockwise backward that normalises P within each key block: the backward of each key block
    alone, run with that block's own out and lse."""
    def backward(q, k, v, out, lse, dout, *, bias_fn=None, mask_fn=None, causal=False, scale=None,
                 block_size=256, q_offset=None, bias_grad_fn=None, **extra):
        T, S = q.shape[-2], k.shape[-2]
        offset = S - T if q_offset is None else q_offset
        dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
        for j0 in range(0, S, block_size):
            ks = slice(j0, min(j0 + block_size, S))
            shift = lambda fn: None if fn is None else (  # noqa: E731
                lambda qs, kb: fn(qs, slice(kb.start + j0, kb.stop + j0)))
            kw = dict(bias_fn=shift(bias_fn), mask_fn=shift(mask_fn), causal=causal, scale=scale,
                      block_size=block_size, q_offset=offset - j0 if causal else None)
            o_b, lse_b = minipos.attention.blockwise_attention(q, k[..., ks, :], v[..., ks, :], return_lse=True, **kw)
            grad_fn = None if bias_grad_fn is None else (
                lambda qs, kb, ds: bias_grad_fn(qs, slice(kb.start + j0, kb.stop + j0), ds))
            g = good(q, k[..., ks, :], v[..., ks, :], o_b, lse_b, dout, bias_grad_fn=grad_fn, **kw, **extra)
            dq += g[0]
            dk[..., ks, :], dv[..., ks, :] = g[1], g[2]
        return dq, dk, dv
    return backward


@pytest.mark.parametrize("module", [minipos.attention, minipos.fast.attention], ids=["reference", "fast"])
def test_blockwise_backward_normalising_each_block_fails_the_order_theorem(monkeypatch, module):
    good = module.blockwise_attention_backward
    broken = _per_block_softmax(good)
    # one block is the whole row: there the broken form is right, so only the split is at fault
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.normal(size=(2, 3, 2)) for _ in range(4))
    out, lse = minipos.attention.blockwise_attention(q, k, v, block_size=3, return_lse=True)
    for a, b in zip(broken(q, k, v, out, lse, dout, block_size=3), good(q, k, v, out, lse, dout, block_size=3)):
        np.testing.assert_allclose(a, b, atol=1e-12)
    err = proof_failure("gradients.online_softmax_backward_order", monkeypatch, module,
                        "blockwise_attention_backward", broken)
    assert isinstance(err, TieMismatch)
    assert (f"theorem gradients.online_softmax_backward_order, tie to {module.__name__}."
            "blockwise_attention_backward ('(dq, dk, dv, dS) = sp.diff of <dO, O>, T = 4, S = 3')") in str(err)
    assert "block_size = 1" in str(err)


def test_apply_rope_backward_rotating_forward_fails(monkeypatch):
    err = proof_failure("gradients.rope_transpose", monkeypatch, minipos.rope, "apply_rope_backward",
                        minipos.rope.apply_rope)                              # R(m) dy instead of R(m)^T dy
    assert isinstance(err, TieMismatch)
    assert ("theorem gradients.rope_transpose, tie to minipos.rope.apply_rope_backward "
            "('R(m)^T dy, interleaved, D = 8')") in str(err)
    assert "at m = 5" in str(err)          # m = 0 is the identity either way


def test_apply_rope_backward_ignoring_the_attention_factor_fails(monkeypatch):
    good = minipos.rope.apply_rope_backward
    err = proof_failure("gradients.rope_transpose", monkeypatch, minipos.rope, "apply_rope_backward",
                        lambda dy, positions, *, attention_factor=1.0, **kw: good(dy, positions, **kw))
    assert ("tie to minipos.rope.apply_rope_backward "
            "('[f R(m)^T dy_rot; dy_pass], rotary_dim = 4 of D = 6, interleaved')") in str(err)
    assert "f = 1.5" in str(err)


def test_rel_shift_backward_that_drops_the_non_causal_entries_fails(monkeypatch):
    # the adjoint of "shift, then mask" is not the adjoint of the shift: dy beyond the pad
    # flows to the next row of x
    good = minipos.transformer_xl.rel_shift_backward

    def masked_first(dy):
        T, S = dy.shape[-2:]
        return good(np.where(minipos.attention.causal_mask(T, S), dy, 0.0))
    err = proof_failure("gradients.rel_shift_adjoint", monkeypatch, minipos.transformer_xl, "rel_shift_backward",
                        masked_first)
    assert isinstance(err, TieMismatch)
    assert ("theorem gradients.rel_shift_adjoint, tie to minipos.transformer_xl.rel_shift_backward "
            "('rel_shift_backward(y) = Π^T y, (2, T, S) = (2, 3, 3)') [case T_M = (3, 0)]") in str(err)


def test_missing_rel_shift_backward_is_reported_missing(monkeypatch):
    monkeypatch.delattr(minipos.transformer_xl, "rel_shift_backward")
    result = select(["gradients.rel_shift_adjoint"])[0].run()
    assert result.status == "MISSING"
    assert "theorem gradients.rel_shift_adjoint, tie to minipos.transformer_xl.rel_shift_backward" in result.message
    assert "minipos.transformer_xl.rel_shift_backward" in result.checks


def test_t5_bias_backward_keeping_one_pair_per_bucket_fails(monkeypatch):
    def first_pair_only(dbias, q_positions, k_positions, *, num_buckets=32, **kw):
        dbias = np.asarray(dbias, float).reshape(-1, *np.shape(dbias)[-3:]).sum(axis=0)     # (H, T, S)
        n = np.asarray(k_positions)[None, :] - np.asarray(q_positions)[:, None]             # key - query
        buckets = minipos.t5.relative_position_bucket(n, num_buckets=num_buckets, **kw)
        out = np.zeros((num_buckets, dbias.shape[0]))
        for b in range(num_buckets):
            pairs = np.argwhere(buckets == b)
            if len(pairs):
                out[b] = dbias[:, pairs[0][0], pairs[0][1]]
        return out
    err = proof_failure("gradients.t5_table", monkeypatch, minipos.t5, "t5_bias_backward", first_pair_only)
    assert isinstance(err, TieMismatch)
    assert ("theorem gradients.t5_table, tie to minipos.t5.t5_bias_backward "
            "('dtable = the per-bucket sum of dbias')") in str(err)


def test_alibi_bias_backward_with_the_distance_sign_flipped_fails(monkeypatch):
    good = minipos.alibi.alibi_bias_backward
    err = proof_failure("gradients.alibi_slopes", monkeypatch, minipos.alibi, "alibi_bias_backward",
                        lambda dbias, q, k, **kw: -good(dbias, q, k, **kw))     # r = i - j
    assert isinstance(err, TieMismatch)
    assert "theorem gradients.alibi_slopes, tie to minipos.alibi.alibi_bias_backward ('dm_h = sum dbias r')" in str(err)


def test_attention_backward_whose_ds_rows_do_not_sum_to_zero_fails_the_alibi_tie(monkeypatch):
    # dbias = P * dP (the row sum forgotten): the j - i and key-only slope gradients then differ
    good = minipos.attention.attention_backward

    def no_row_sum(q, k, v, dout, *, bias=None, mask=None, scale=None):
        dq, dk, dv, _ = good(q, k, v, dout, bias=bias, mask=mask, scale=scale)
        _, p = minipos.attention.attention(q, k, v, bias=bias, mask=mask, scale=scale, return_weights=True)
        return dq, dk, dv, p * (dout @ np.swapaxes(v, -1, -2))
    err = proof_failure("gradients.alibi_slopes", monkeypatch, minipos.attention, "attention_backward", no_row_sum)
    assert "dm is the key-only form's sum dS j" in str(err)


# ----------------------------------------------------------------- a wrong claim is FALSE

def test_claiming_the_softmax_jacobian_is_diagonal_is_false():
    x = sp.symbols("x0:3", real=True)
    P = proofs_grad._softmax(x)

    def proof(p):
        p.claim(sp.Matrix(3, 3, lambda i, j: proofs_grad.Derivative(P[i], x[j])), sp.diag(*P),
                "softmax acts elementwise", by=proofs_grad._exps_as_symbols)
    with pytest.raises(StepFalse) as err:
        Theorem("gradients.demo", "J = diag(p)", proof).prove()
    assert "theorem gradients.demo, step 1 ('softmax acts elementwise') [FALSE]" in str(err.value)
    assert "counterexample: x0 = " in str(err.value)


def test_claiming_the_block_row_sum_is_enough_is_false():
    s, dP = sp.symbols("S0:3", real=True), sp.symbols("dP0:3", real=True)
    P = proofs_grad._softmax(s)

    def proof(p):  # dS_0 with D from the block {0} only, claimed equal to the full-row dS_0
        p.claim(P[0] * (dP[0] - P[0] * dP[0]), P[0] * (dP[0] - sum(P[j] * dP[j] for j in range(3))),
                "the row sum of the block alone", by=proofs_grad._exps_as_symbols)
    with pytest.raises(StepFalse) as err:
        Theorem("gradients.demo", "block-local D", proof).prove()
    assert "theorem gradients.demo, step 1 ('the row sum of the block alone') [FALSE]" in str(err.value)
    assert "counterexample: " in str(err.value)
