"""The hand-written PyTorch backwards (``examples/torch_autograd_port.py``) against the gradient vectors.

The functions were written from ``spec/README.md`` and ``docs/porting.md`` without calling
minipos. ``spec/check_port.py`` runs each over its gradient family in float64 and, against the
float32 tolerance, in float32; ``torch.autograd.gradcheck`` checks each backward against finite
differences of its own forward in float64. Then the classic backward mistakes, made on purpose,
must fail the vectors: this is how a kernel author's tests should look.
"""

import importlib.util
import pathlib
import sys

import pytest

torch = pytest.importorskip("torch")

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _load(path, name):
    spec = importlib.util.spec_from_file_location(name, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


port = _load("examples/torch_autograd_port.py", "torch_autograd_port")
forward_port = _load("examples/torch_port.py", "torch_port")
check_port = _load("spec/check_port.py", "check_port")


def _tensors(inputs, dtype):
    return {k: (torch.from_numpy(v).to(dtype) if v.dtype.kind == "f" else torch.from_numpy(v))
            for k, v in inputs.items()}


def _attention_case(dtype):
    def adapt(inputs, params):
        return {**_tensors(inputs, dtype), **params}
    return adapt


def _t5_case(dtype):
    def adapt(inputs, params):
        t = _tensors(inputs, dtype)
        q, k = t["q_positions"], t["k_positions"]
        buckets = forward_port.relative_position_bucket(k[None, :] - q[:, None], **params)   # (T, S)
        return {"dbias": t["dbias"], "buckets": buckets, "num_buckets": params["num_buckets"]}
    return adapt


FAMILIES = [("attention_grad", port.attention_grad, _attention_case),
            ("rope_grad", port.rope_grad, _attention_case),
            ("t5_grad", port.t5_grad, _t5_case)]


@pytest.mark.parametrize("precision, dtype", [("float64", torch.float64), ("float32", torch.float32)])
@pytest.mark.parametrize("family, fn, adapt", FAMILIES, ids=[f for f, *_ in FAMILIES])
def test_hand_written_backwards_reproduce_the_gradient_vectors(family, fn, adapt, precision, dtype):
    report = check_port.assert_family(family, fn, adapt=adapt(dtype), precision=precision)
    assert not report.skipped


def test_attention_backward_passes_gradcheck_with_a_bias_a_mask_and_a_row_with_no_key():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, n, 3, generator=gen, dtype=torch.float64, requires_grad=True) for n in (4, 5, 5))
    bias = torch.randn(2, 4, 5, generator=gen, dtype=torch.float64, requires_grad=True)   # (H, T, S): shared
    mask = torch.ones(2, 1, 4, 5, dtype=torch.bool)
    mask[0, 0, 2] = False                                # a query with no key
    mask[1, 0, :, 3:] = False                            # padding
    for block in (1, 2, 5):
        assert torch.autograd.gradcheck(lambda q, k, v, b: port.Attention.apply(q, k, v, b, mask, 0.7, block)[0],
                                        (q, k, v, bias))


def test_rope_backward_passes_gradcheck_in_both_layouts_with_partial_rotary_and_a_factor():
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    positions = torch.tensor([0, 3, 100, 4097, -2])
    for layout in ("interleaved", "half"):
        for R, factor in ((None, 1.0), (4, 1.25)):
            assert torch.autograd.gradcheck(
                lambda x: port.Rope.apply(x, positions, layout, 10000.0, R, factor, None), (x,))


def test_t5_backward_passes_gradcheck_with_pairs_sharing_buckets():
    table = torch.randn(8, 3, dtype=torch.float64, requires_grad=True)
    q, k = torch.arange(6), torch.arange(6)
    buckets = forward_port.relative_position_bucket(k[None, :] - q[:, None], bidirectional=True, num_buckets=8,
                                                    max_distance=16)
    assert torch.autograd.gradcheck(lambda t: port.T5Bias.apply(t, buckets), (table,))


# --- the classic mistakes fail the vectors ---------------------------------------------------------

def _failed(family, fn, function, adapt=_attention_case):
    return check_port.run_family(family, lambda **kw: fn(**kw, function=function), adapt=adapt(torch.float64)).failed


def test_a_rope_backward_that_rotates_the_wrong_way_fails():
    class ForwardAgain(port.Rope):
        @staticmethod
        def backward(ctx, dy):  # R(m) dy instead of R(m)^T dy
            cos, sin = ctx.saved_tensors
            d = dy[..., :ctx.R]
            return (torch.cat([d * cos + port._rotate(d, ctx.layout) * sin, dy[..., ctx.R:]], -1), *[None] * 6)

    assert len(_failed("rope_grad", port.rope_grad, ForwardAgain)) == 4


def test_scale_forgotten_in_dq_and_dk_fails_wherever_the_scale_is_not_one():
    class NoScale(port.Attention):
        @staticmethod
        def backward(ctx, dout, dlse):  # dQ = dS K, dK = dS^T Q: dbias = dS is right, so it looks plausible
            dq, dk, *rest = port.Attention.backward(ctx, dout, dlse)
            return (dq / ctx.scale, dk / ctx.scale, *rest)

    assert _failed("attention_grad", port.attention_grad, NoScale) == [
        "causal_cached_T3_S5", "key_padding_no_bias_T5_S3", "padded_batch_full_bias"]   # the fourth has scale 1


def test_rowsum_dp_in_place_of_rowsum_do_o_fails():
    class RowsumDP(port.Attention):
        @staticmethod
        def backward(ctx, dout, dlse):
            q, k, v, bias, mask, out, lse = ctx.saved_tensors
            s = ctx.scale * q @ k.transpose(-1, -2) + (0 if bias is None else bias)
            s = s if mask is None else s.masked_fill(~mask, float("-inf"))
            p = torch.exp(s - lse[..., None])
            dp = dout @ v.transpose(-1, -2)
            ds = p * (dp - dp.sum(-1, keepdim=True))            # rowsum(dP), not rowsum(dP * P) = rowsum(dO * O)
            dbias = None if bias is None else port._reduce_to(ds, bias.shape)
            return ctx.scale * ds @ k, ctx.scale * ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ dout, dbias, \
                None, None, None

    assert len(_failed("attention_grad", port.attention_grad, RowsumDP)) == 4


def test_a_table_gradient_not_summed_per_bucket_fails():
    class Overwrites(port.T5Bias):
        @staticmethod
        def backward(ctx, dbias):  # dtable[b] = the dbias of one pair of the bucket: a scatter, not a scatter-add
            (buckets,) = ctx.saved_tensors
            H = dbias.shape[-3]
            dtable = torch.zeros(ctx.num_buckets, H, dtype=dbias.dtype)
            dtable[buckets.reshape(-1)] = dbias.permute(1, 2, 0).reshape(-1, H)
            return dtable, None

    assert len(_failed("t5_grad", port.t5_grad, Overwrites, _t5_case)) == 4


def test_lse_stored_as_minus_infinity_for_a_row_with_no_key_gives_nan_and_fails():
    class StoresMinusInf(port.Attention):
        @staticmethod
        def forward(ctx, q, k, v, bias, mask, scale, block_size):
            out, lse = port.Attention.forward(ctx, q, k, v, bias, mask, scale, block_size)
            ctx.save_for_backward(q, k, v, bias, mask, out, lse)   # -inf kept: exp(-inf - (-inf)) = NaN
            return out, lse

    assert _failed("attention_grad", port.attention_grad, StoresMinusInf) == [
        "padding_and_fully_masked_row_T4_S6", "padded_batch_full_bias"]
