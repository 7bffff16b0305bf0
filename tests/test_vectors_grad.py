"""The gradient families of the golden vectors hold what a backward must satisfy, checked from outside.

Each check uses something other than the backward that wrote the numbers: the adjoint identity
<f(x), dy> = <x, f^T(dy)> with the recorded forward, central finite differences of the layer's
forward, hand-worked facts (a position-0 rotation is the identity, a bucket no pair reads gets 0,
rows of dS sum to zero, a row with no key has zero gradients), and a log-sum-exp computed
directly. Then ``check`` must name the cases when a backward makes one of the classic mistakes.
"""

import json
import pathlib

import numpy as np
import pytest

from minipos import rope, t5, transformer_xl, vectors
from minipos.attention import causal_mask
from minipos.transformer_xl import rel_shift

VECTORS = pathlib.Path(__file__).resolve().parents[1] / "spec" / "vectors"
GRADIENT_FAMILIES = ["attention_grad", "rope_grad", "t5_grad", "alibi_grad", "rel_shift_grad", "xl_grad",
                     "deberta_grad", "xpos_grad", "learned_grad", "layer_grad"]


def _cases(family):
    doc = json.loads((VECTORS / f"{family}.json").read_text())
    for case in doc["cases"]:
        yield (case["name"], {k: vectors.decode(v) for k, v in case["inputs"].items()}, case["params"],
               {k: vectors.decode(v) for k, v in case["expected"].items()},
               {k: vectors.decode(v) for k, v in case.get("where", {}).items()})


def _case(family, name):
    return next(c[1:] for c in _cases(family) if c[0] == name)


def test_every_gradient_family_is_recorded_and_names_its_backward():
    for family in GRADIENT_FAMILIES:
        doc = json.loads((VECTORS / f"{family}.json").read_text())
        assert doc["function"] == vectors.FAMILIES[family].function
        assert doc["function"].endswith("backward") or doc["function"].endswith(".backward")
        assert all(case["inputs"] for case in doc["cases"])


# --- hand-worked facts and identities --------------------------------------------------------------

def test_rope_grad_is_the_inverse_rotation_and_leaves_the_pass_through_alone():
    for name, inputs, params, out, _ in _cases("rope_grad"):
        dy, pos, dx = inputs["dy"], inputs["positions"], out["dx"]
        R, f = params["rotary_dim"] or dy.shape[-1], params["attention_factor"]
        np.testing.assert_allclose(dx[..., pos == 0, :R], f * dy[..., pos == 0, :R], rtol=1e-15)   # f R(0) = f I
        np.testing.assert_array_equal(dx[..., R:], dy[..., R:])          # not scaled by attention_factor
        x = np.random.default_rng(0).standard_normal(dy.shape)          # <R x, dy> = <x, R^T dy>
        y = rope.apply_rope(x, pos, inv_freq=inputs.get("inv_freq"), **params)
        assert np.vdot(y, dy) == pytest.approx(np.vdot(x, dx), rel=1e-12), name


def test_t5_grad_sums_every_pair_into_one_bucket_and_unused_buckets_get_zero():
    for name, inputs, params, out, _ in _cases("t5_grad"):
        dbias, dtable = inputs["dbias"], out["dtable"]
        per_head = dbias.reshape(-1, *dbias.shape[-3:]).sum(axis=(0, 2, 3))        # every pair counted once
        np.testing.assert_allclose(dtable.sum(axis=0), per_head, rtol=1e-12, atol=1e-12)
    _, _, out, _ = _case("t5_grad", "encoder_odd_9_16")
    np.testing.assert_array_equal(out["dtable"][[4, 8]], 0.0)  # K = 9: P = 4, bucket 4 (n = +0) and 8 unread


def test_learned_grad_sums_repeated_positions():
    inputs, _, out, _ = _case("learned_grad", "repeated_positions")
    d = inputs["dout"]
    np.testing.assert_array_equal(out["dtable"][3], d[0] + d[2] + d[3])
    np.testing.assert_array_equal(out["dtable"][[2, 4, 5, 6, 7]], 0.0)


def test_rel_shift_grad_is_the_adjoint_of_the_shift():
    rng = np.random.default_rng(1)
    for name, inputs, _, out, _ in _cases("rel_shift_grad"):
        x = rng.standard_normal(inputs["dy"].shape)
        assert np.vdot(rel_shift(x), inputs["dy"]) == pytest.approx(np.vdot(x, out["dx"]), rel=1e-12), name


def test_attention_grad_rows_of_a_masked_out_query_are_zero_and_lse_is_the_log_sum_exp():
    for name, inputs, params, out, where in _cases("attention_grad"):
        q, k, bias, mask = inputs["q"], inputs["k"], inputs.get("bias"), inputs.get("mask")
        scale = params["scale"] or 1 / np.sqrt(q.shape[-1])
        logits = scale * q @ np.swapaxes(k, -1, -2) + (0 if bias is None else bias)
        allowed = np.broadcast_to(True if mask is None else mask, logits.shape)
        rows = allowed.any(axis=-1)
        lse = np.log(np.where(allowed, np.exp(logits), 0).sum(axis=-1), where=rows, out=np.zeros(rows.shape))
        np.testing.assert_allclose(out["lse"][rows], lse[rows], rtol=1e-12)
        np.testing.assert_array_equal(where.get("lse", np.ones(rows.shape, bool)), rows)
        np.testing.assert_array_equal(out["out"][~rows], 0.0)
        np.testing.assert_array_equal(out["dq"][~rows], 0.0)
        if "dbias" in out:  # softmax ignores a constant per row: every row of dS sums to zero
            np.testing.assert_allclose(out["dbias"].sum(axis=-1), 0.0, atol=1e-12)


def test_xl_grad_and_deberta_grad_satisfy_the_adjoint_identity_of_their_linear_parts():
    rng = np.random.default_rng(2)
    for name, inputs, _, out, _ in _cases("xl_grad"):
        q, k, r, u, v, dout = (inputs[n] for n in ("q", "k", "r", "u", "v", "dout"))
        dk = rng.standard_normal(k.shape)  # the logits are linear in k: <f(k + dk) - f(k), dout> = <dk, dk_grad>
        diff = transformer_xl.xl_scores(q, k + dk, r, u, v) - transformer_xl.xl_scores(q, k, r, u, v)
        assert np.vdot(diff, dout) == pytest.approx(np.vdot(dk, out["dk"]), rel=1e-10), name
    from minipos import deberta
    for name, inputs, params, out, _ in _cases("deberta_grad"):
        args = [inputs["q"], inputs["k"], inputs.get("pos_key"), inputs.get("pos_query"), inputs["relative_pos"]]
        kw = {"att_span": params["att_span"], "pos_att_type": tuple(params["pos_att_type"])}
        for i, grad in ((2, "dpos_key"), (3, "dpos_query")):  # linear in each table
            if grad in out:
                moved = list(args)
                moved[i] = args[i] + (d := rng.standard_normal(args[i].shape))
                diff = deberta.disentangled_scores(*moved, **kw) - deberta.disentangled_scores(*args, **kw)
                assert np.vdot(diff, inputs["dout"]) == pytest.approx(np.vdot(d, out[grad]), rel=1e-10), name


@pytest.mark.parametrize("name, names", [("t5_encoder_bias_padded", ["scheme.table", "bk", "wq"]),
                                         ("rope_half_bias_padded", ["wk", "x"]),
                                         ("transformer_xl_bidirectional_padded", ["scheme.w_r", "scheme.u"]),
                                         ("deberta", ["scheme.rel_embeddings", "bq"])])
def test_layer_grad_matches_central_differences_of_the_forward(name, names):
    inputs, params, out, _ = _case("layer_grad", name)
    run = vectors.FAMILIES["layer"].run
    forward = {k: v for k, v in inputs.items() if k != "dy"}
    fparams = {**params, "chunks": [inputs["x"].shape[1]]}
    rng, h = np.random.default_rng(3), 1e-6
    for key in names:
        for _ in range(3):
            idx = tuple(int(rng.integers(n)) for n in forward[key].shape)
            plus, minus = ({**forward, key: forward[key].copy()} for _ in range(2))
            plus[key][idx] += h
            minus[key][idx] -= h
            numeric = np.vdot(run(plus, fparams)["y"] - run(minus, fparams)["y"], inputs["dy"]) / (2 * h)
            assert out[key][idx] == pytest.approx(numeric, rel=1e-6, abs=1e-8), (key, idx)


def test_lse_of_a_row_with_no_key_is_written_as_zero_and_left_out():
    doc = json.loads((VECTORS / "attention_grad.json").read_text())
    case = next(c for c in doc["cases"] if c["name"] == "padding_and_fully_masked_row_T4_S6")
    lse, where = vectors.decode(case["expected"]["lse"]), vectors.decode(case["where"]["lse"])
    assert not where[0, :, 1].any() and (lse[0, :, 1] == 0).all() and where.sum() == where.size - 2


# --- check names the cases when a backward makes a classic mistake ----------------------------------

def _failing(monkeypatch, module, name, wrong, families):
    monkeypatch.setattr(module, name, wrong)
    return {f"{m.family}/{m.case}" for m in vectors.check(VECTORS, families)}


def test_check_catches_a_rope_backward_that_rotates_the_wrong_way(monkeypatch):
    failing = _failing(monkeypatch, rope, "apply_rope_backward", rope.apply_rope, ["rope_grad", "layer_grad"])
    assert {f"rope_grad/{c[0]}" for c in _cases("rope_grad")} <= failing
    assert {"layer_grad/rope_half", "layer_grad/rope_yarn_partial"} <= failing
    assert "layer_grad/nope" not in failing and "layer_grad/t5_encoder" not in failing


def test_check_catches_a_t5_table_gradient_not_summed_per_bucket(monkeypatch):
    def last_pair_wins(dbias, q_positions, k_positions, **kw):  # dtable[b] = dbias of one pair, not the sum
        per_pair = dbias.reshape(-1, *dbias.shape[-3:]).sum(axis=0)
        buckets = t5.relative_position_bucket(np.subtract.outer(k_positions, q_positions).T, **kw)
        dtable = np.zeros((kw["num_buckets"], per_pair.shape[0]))
        dtable[buckets.ravel()] = per_pair.reshape(per_pair.shape[0], -1).T
        return dtable
    failing = _failing(monkeypatch, t5, "t5_bias_backward", last_pair_wins, ["t5_grad", "layer_grad"])
    assert {f"t5_grad/{c[0]}" for c in _cases("t5_grad")} == {f for f in failing if f.startswith("t5_grad/")}
    assert {"layer_grad/t5_encoder", "layer_grad/t5_decoder"} <= failing


def test_check_catches_the_shift_taken_as_its_own_adjoint(monkeypatch):
    failing = _failing(monkeypatch, transformer_xl, "rel_shift_backward", transformer_xl.rel_shift,
                       ["rel_shift_grad"])
    assert failing >= {"rel_shift_grad/memory_3x5", "rel_shift_grad/heads_2x4x7", "rel_shift_grad/dense_dy_4x6"}


def test_the_causal_dy_of_the_shift_reaches_only_the_entries_the_forward_read():
    inputs, _, out, _ = _case("rel_shift_grad", "memory_3x5")
    T, S = inputs["dy"].shape
    read = np.zeros((T, S), bool)
    for i in range(T):
        for j in range(S):
            if causal_mask(T, S)[i, j]:
                read[i, j + T - 1 - i] = True
    np.testing.assert_array_equal(out["dx"][~read], 0.0)
