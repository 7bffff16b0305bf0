"""docs/porting.md, "Porting with autodiff": a port that lets torch's autograd take the gradients
(no hand-written backward) meets the gradient vectors when it does the four things the page lists,
and the page's failure modes are real: an unguarded softmax, or a zero cotangent into ``lse`` where the
mask is added to the logits, gives NaN.

Written from spec/README.md, without minipos: each port is the forward, and the backward is
``torch.autograd.grad`` of ``sum(out * dout)``.
"""

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_port_autodiff", ROOT / "spec" / "check_port.py")
check_port = importlib.util.module_from_spec(_spec)
sys.modules["check_port_autodiff"] = check_port
_spec.loader.exec_module(check_port)


def _t(a, grad=False):
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.requires_grad_() if grad and t.is_floating_point() else t


def guarded_softmax(s):
    """softmax over the last axis; a row that is -inf throughout gives zeros, with zero gradients."""
    m = s.detach().amax(-1, keepdim=True)
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))          # all -inf: shift by 0
    e = torch.exp(s - m)                                                # 0 on masked entries
    total = e.sum(-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))   # the safe denominator: 0 / 1 = 0


def _logits(q, k, bias, mask, scale, additive):
    s = scale * q @ k.transpose(-1, -2) + (0 if bias is None else bias)   # (B, H, T, S)
    if mask is None:
        return s
    if additive:          # -inf added: a gradient reaching a masked entry flows on into q and k
        return s + torch.zeros(mask.shape, dtype=s.dtype).masked_fill(~mask, float("-inf"))
    return s.masked_fill(~mask, float("-inf"))   # selected: masked entries pass no gradient back


def attention_port(softmax=guarded_softmax, lse_in_graph=False, additive=False):
    def run(q, k, v, dout, scale, bias=None, mask=None):
        q, k, v = _t(q, True), _t(k, True), _t(v, True)
        b = None if bias is None else _t(bias, True)                   # the bias's own shape: broadcast
        m = None if mask is None else _t(mask)
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        s = _logits(q, k, b, m, scale, additive)
        out = softmax(s) @ v
        leaves = [x for x in (q, k, v, b) if x is not None]
        if lse_in_graph:      # lse differentiated too, with a zero cotangent
            lse = torch.logsumexp(s, -1)
            grads = torch.autograd.grad((out, lse), leaves, (_t(dout), torch.zeros_like(lse)))
        else:                 # lse kept out of the vjp
            with torch.no_grad():
                lse = torch.logsumexp(s, -1)
            grads = torch.autograd.grad(out, leaves, _t(dout))
        names = ["dq", "dk", "dv"] + ([] if bias is None else ["dbias"])
        return {"out": out.detach(), "lse": lse.detach(), **dict(zip(names, grads))}
    return run


def rel_shift(x):
    """Transformer-XL's pad-reshape-slice shift on the last two axes (..., T, S)."""
    *lead, T, S = x.shape
    padded = torch.nn.functional.pad(x, (1, 0))                        # (..., T, S+1): [0 | x]
    return padded.reshape(*lead, S + 1, T)[..., 1:, :].reshape(*lead, T, S)


def rel_shift_grad(x_like, dy):
    x = torch.zeros(dy.shape, dtype=torch.float64, requires_grad=True)
    return torch.autograd.grad(rel_shift(x), x, _t(dy))[0]


def test_autograd_with_a_guarded_softmax_and_lse_kept_out_meets_attention_grad():
    report = check_port.assert_family("attention_grad", attention_port(), output_gradient="dout")
    assert report.failed == [] and len(report.passed) == 4


@pytest.mark.parametrize("additive", [False, True])
def test_an_unguarded_softmax_gives_nan_on_the_fully_masked_rows(additive):
    report = check_port.run_family("attention_grad", attention_port(softmax=lambda s: torch.softmax(s, -1),
                                                                    additive=additive))
    # spec/README.md: out, dq and the masked rows' shares must be zero, not NaN
    assert "padding_and_fully_masked_row_T4_S6" in report.failed
    assert any("NaN" in line for line in report.mismatches)


def test_zeroing_the_rows_after_an_unguarded_softmax_leaves_nan_gradients_where_the_mask_is_added():
    def zeroed_after(s):
        has_key = torch.isfinite(s.detach()).any(-1, keepdim=True)
        return torch.where(has_key, torch.softmax(s, -1), torch.zeros_like(s))

    # with the mask selected (masked_fill), its backward drops the NaN at the masked entries
    assert check_port.run_family("attention_grad", attention_port(softmax=zeroed_after)).failed == []
    report = check_port.run_family("attention_grad", attention_port(softmax=zeroed_after, additive=True))
    lines = [m for m in report.mismatches if m.startswith("attention_grad/padding_and_fully_masked_row_T4_S6")]
    assert not any(": out:" in m for m in lines)          # the output is right ...
    assert any(": dq:" in m and "NaN" in m for m in lines)  # ... its gradient is not


def test_a_zero_cotangent_into_lse_gives_nan_where_the_mask_is_added():
    # logsumexp's backward on a row of -inf is 0 * exp(-inf - (-inf)) = NaN; a selected mask stops it
    assert check_port.run_family("attention_grad", attention_port(lse_in_graph=True)).failed == []
    report = check_port.run_family("attention_grad", attention_port(lse_in_graph=True, additive=True))
    assert "padding_and_fully_masked_row_T4_S6" in report.failed
    assert any("NaN" in line for line in report.mismatches)
    # kept out of the vjp, the added mask is harmless
    assert check_port.run_family("attention_grad", attention_port(additive=True)).failed == []


def test_autograd_of_the_pad_reshape_shift_is_its_adjoint_garbage_entries_included():
    report = check_port.assert_family("rel_shift_grad", lambda dy: rel_shift_grad(None, dy).numpy())
    assert report.failed == [] and "dense_dy_4x6" in report.passed


def test_a_shift_by_gather_has_another_adjoint_on_the_garbage_entries():
    def gather_grad(dy):
        *lead, T, S = dy.shape
        i, j = np.arange(T)[:, None], np.arange(S)[None, :]
        src = np.where(j <= i + S - T, j + T - 1 - i, 0)                  # out[i, j] = x[i, j + T-1-i], causal
        x = torch.zeros(dy.shape, dtype=torch.float64, requires_grad=True)
        idx = torch.from_numpy(np.broadcast_to(src, dy.shape).copy())
        out = torch.gather(x, -1, idx) * torch.from_numpy(j <= i + S - T)
        return torch.autograd.grad(out, x, _t(dy))[0].numpy()

    report = check_port.run_family("rel_shift_grad", gather_grad)
    assert report.failed == ["dense_dy_4x6"], str(report)
