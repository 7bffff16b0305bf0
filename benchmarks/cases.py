"""The benchmark rows. Each function takes the sizes of a run and returns a list of ``Row``."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import minipos.fast as fast
from minipos import alibi, attention, deberta, rope, t5, transformer_xl
from minipos.layer import ALiBi, MultiHeadAttention

from ._timing import Row, interleaved

try:
    import torch
except ImportError:                                   # the torch rows are skipped with a note
    torch = None

NO_TORCH = "skipped: torch not installed"
ROOT = Path(__file__).resolve().parent.parent


def _ratio_row(name, f, g, repeats, target: float, *, note="", inclusive: bool = False) -> Row:
    tf, tg, ratio = interleaved(f, g, repeats)
    if inclusive:
        return Row(name, tf, tg, ratio, f"<= {target}", ratio <= target, note=note)
    return Row(name, tf, tg, ratio, f"< {target}", ratio < target, note=note)


def _info_row(name, f, g, repeats, *, note="") -> Row:
    tf, tg, ratio = interleaved(f, g, repeats)
    return Row(name, tf, tg, ratio, "(info)", None, note=note)


def _alibi_case(T: int, H: int, D: int):
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, H, T, D), dtype=np.float32) for _ in range(3))
    slopes, pos = alibi.alibi_slopes(H), np.arange(T)
    bias_fn = lambda qs, ks: fast.alibi.alibi_bias(slopes, pos[qs], pos[ks], dtype=np.float32)  # noqa: E731
    bound = lambda qs, ks: fast.alibi.alibi_bias_bound(slopes, pos[qs], pos[ks])                # noqa: E731
    return q, k, v, slopes, pos, bias_fn, bound


def attention_rows(T: int, H: int, D: int, block: int, repeats: int, blocks=()) -> list[Row]:
    """Causal ALiBi attention, reference and fast, against the floor and torch (public API only)."""
    q, k, v, slopes, pos, bias_fn, bound_fn = _alibi_case(T, H, D)
    floor = lambda: np.matmul(np.matmul(q, np.swapaxes(k, -1, -2)), v)     # noqa: E731  (q k^T) v
    bias = alibi.alibi_bias(slopes, pos, pos).astype(np.float32)           # (H, T, S), built before the call
    mask = attention.causal_mask(T, T)
    size = f"H={H} T=S={T} D={D} f32"
    rows = []
    for b in blocks:                                  # how the default block size was chosen
        fn = lambda b=b: fast.attention.blockwise_attention(q, k, v, bias_fn=bias_fn, causal=True,  # noqa: E731
                                                            block_size=b, bias_max_fn=bound_fn)
        tf, tg, ratio = interleaved(fn, floor, repeats)
        rows.append(Row(f"fast blockwise ALiBi block_size={b} / floor", tf, tg, ratio, "(choice)", None))
    dense_ref = lambda: attention.attention(q, k, v, bias=bias, mask=mask)          # noqa: E731
    dense_fast = lambda: fast.attention.attention(q, k, v, bias=bias, mask=mask)    # noqa: E731
    rows.append(_info_row(f"reference attention(bias, mask) causal ALiBi {size} / (q k^T) v", dense_ref, floor,
                          repeats))
    rows.append(_ratio_row(f"fast attention(bias, mask) causal ALiBi {size} / (q k^T) v", dense_fast, floor,
                           repeats, 1.6))
    blocked = lambda: fast.attention.blockwise_attention(q, k, v, bias_fn=bias_fn, causal=True,  # noqa: E731
                                                         bias_max_fn=bound_fn)
    rows.append(_info_row(f"reference blockwise_attention causal ALiBi {size} (bias per block) / (q k^T) v",
                          lambda: attention.blockwise_attention(q, k, v, bias_fn=bias_fn, causal=True), floor,
                          max(1, repeats // 3)))
    rows.append(_ratio_row(f"fast blockwise_attention causal ALiBi {size} (bias per block, bound, default block) "
                           f"/ (q k^T) v", blocked, floor, repeats, 1.6))
    layer_rows = _layer_rows(T, H, D, repeats)
    if torch is None:
        rows += layer_rows[:1]
        rows.append(Row("fast attention / torch sdpa (same float mask)", None, None, None, "<= 1.0", None,
                        note=NO_TORCH))
        rows.append(Row("fast layer / torch (projections + sdpa, same float mask)", None, None, None, "<= 1.0",
                        None, note=NO_TORCH))
        return rows
    tbias = torch.from_numpy(np.where(mask, bias, -np.inf).astype(np.float32)[None])         # (1, H, T, S)
    tq, tk, tv = (torch.from_numpy(a) for a in (q, k, v))
    sdpa = lambda: torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=tbias)  # noqa: E731
    rows.append(_info_row("reference attention / torch sdpa (same float mask)", dense_ref, sdpa, max(1, repeats // 3)))
    rows.append(_ratio_row("fast attention / torch sdpa (same float mask)", dense_fast, sdpa, repeats, 1.0,
                           inclusive=True))
    rows.append(_info_row("fast blockwise_attention (bias per block) / torch sdpa (same float mask)", blocked,
                          sdpa, repeats, note="info: the mask torch gets is built before the call"))
    one = lambda: fast.attention.blockwise_attention(q, k, v, bias_fn=bias_fn, causal=True,  # noqa: E731
                                                     bias_max_fn=bound_fn, workers=1)
    rows.append(_info_row("fast blockwise_attention, one thread / torch sdpa (same float mask)", one, sdpa, repeats,
                          note=f"info: torch uses {torch.get_num_threads()} threads"))
    return rows + layer_rows


def backward_rows(T: int, H: int, D: int, repeats: int) -> list[Row]:
    """The blockwise backward (causal ALiBi, float32): against its own forward and against torch's
    autograd through sdpa with the same float mask (the backward pass alone on both sides)."""
    q, k, v, slopes, pos, bias_fn, bound_fn = _alibi_case(T, H, D)
    dout = np.random.default_rng(8).standard_normal(q.shape, dtype=np.float32)
    kw = dict(bias_fn=bias_fn, causal=True, bias_max_fn=bound_fn)
    out, lse = fast.attention.blockwise_attention(q, k, v, return_lse=True, **kw)
    fwd = lambda: fast.attention.blockwise_attention(q, k, v, return_lse=True, **kw)              # noqa: E731
    bwd = lambda: fast.attention.blockwise_attention_backward(q, k, v, out, lse, dout, **kw)      # noqa: E731
    size = f"H={H} T=S={T} D={D} f32"
    rows = [_ratio_row(f"fast blockwise_attention_backward causal ALiBi {size} / its forward", bwd, fwd, repeats, 2.5)]
    small = slice(0, min(T, 512))
    ref = lambda: attention.blockwise_attention_backward(                                          # noqa: E731
        q[..., small, :], k[..., small, :], v[..., small, :], out[..., small, :], lse[..., small],
        dout[..., small, :], bias_fn=bias_fn, causal=True)
    rows.append(_info_row(f"reference blockwise_attention_backward (T=S={small.stop}) / fast (T=S={small.stop})",
                          ref, lambda: fast.attention.blockwise_attention_backward(
                              q[..., small, :], k[..., small, :], v[..., small, :], out[..., small, :],
                              lse[..., small], dout[..., small, :], **kw), max(1, repeats // 3)))
    if torch is None:
        rows.append(Row("fast blockwise backward / torch autograd backward through sdpa (same float mask)", None, None,
                        None, "<= 1.0", None, note=NO_TORCH))
        return rows
    bias = np.where(pos[None, :] <= pos[:, None], alibi.alibi_bias(slopes, pos, pos), -np.inf).astype(np.float32)
    tmask, tdout = torch.from_numpy(bias[None]), torch.from_numpy(dout)
    leaves = [torch.from_numpy(a).requires_grad_() for a in (q, k, v)]

    def torch_backward():
        """The backward pass alone: the forward is run first, outside the clock."""
        y = torch.nn.functional.scaled_dot_product_attention(*leaves, attn_mask=tmask)
        start = time.perf_counter()
        y.backward(tdout)
        return time.perf_counter() - start

    def ours():
        start = time.perf_counter()
        bwd()
        return time.perf_counter() - start
    tf, tg, ratio = _interleaved_clocks(ours, torch_backward, repeats)
    rows.append(Row("fast blockwise backward / torch autograd backward through sdpa (same float mask)", tf, tg, ratio,
                    "<= 1.0", ratio <= 1.0))
    return rows


def lab_step_rows(quick: bool) -> list[Row]:
    """One training step of the lab's model (the protocol's sizes) with each scheme (RoPE alone with
    ``quick``) against the same model in torch, eager, on the CPU (its attention the same scheme where
    ``lab.bench.TORCH_SCHEMES`` has it, else RoPE: the row names which)."""
    from lab import schemes
    names = ("rope",) if quick else schemes.NAMES
    title = ("lab: one training step (2 layers, d_model 64, 4 heads, batch 32, L = 64, {}) / torch eager {}, "
             "CPU time on one thread each")
    if torch is None:
        return [Row(title.format(name, "(same model)"), None, None, None, "<= 1.5", None, note=NO_TORCH)
                for name in names]
    sys.path.insert(0, str(ROOT))
    from lab.bench import step_ratios
    got = step_ratios(names, rounds=2 if quick else 5, repeats=2 if quick else 8, warmup=1 if quick else 3)
    return [Row(title.format(name, g["torch_scheme"]), g["numpy_s"], g["torch_s"], g["ratio"], "<= 1.5",
                g["ratio"] <= 1.5, note="the protocol runs one process per record, one thread each")
            for name, g in got.items()]


def _interleaved_clocks(f, g, repeats: int) -> tuple[float, float, float]:
    """``interleaved`` for functions that return the time of their own measured part."""
    f(), g()
    tf, tg = [], []
    for _ in range(repeats):
        tf.append(f())
        tg.append(g())
    return float(np.median(tf)), float(np.median(tg)), float(np.median(np.array(tf) / np.array(tg)))


def _layer_rows(T: int, H: int, D: int, repeats: int) -> list[Row]:
    """The whole layer call (causal ALiBi, float32): reference and fast against the products it must
    make (four projections and (q k^T) v) and against the same layer in torch."""
    d = H * D
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, T, d), dtype=np.float32)
    ref_layer = MultiHeadAttention(d, H, scheme=ALiBi(), dtype=np.float32)
    fast_layer = fast.MultiHeadAttention(d, H, scheme=ALiBi(), dtype=np.float32)
    w = [ref_layer.wq, ref_layer.wk, ref_layer.wv, ref_layer.wo]

    def products():
        q, k, v = ((x @ m).reshape(1, T, H, D).transpose(0, 2, 1, 3) for m in w[:3])
        out = (q @ np.swapaxes(k, -1, -2)) @ v
        return out.transpose(0, 2, 1, 3).reshape(1, T, d) @ w[3]
    size = f"H={H} T={T} D={D} f32"
    rows = [_info_row(f"reference layer causal ALiBi {size} / its products", lambda: ref_layer(x, causal=True),
                      products, max(1, repeats // 3)),
            _ratio_row(f"fast layer causal ALiBi {size} / its products (4 projections, (q k^T) v)",
                       lambda: fast_layer(x, causal=True), products, repeats, 1.6)]
    if torch is None:
        return rows
    pos = np.arange(T)
    bias = np.where(pos[None, :] <= pos[:, None], alibi.alibi_bias(alibi.alibi_slopes(H), pos, pos), -np.inf)
    tbias = torch.from_numpy(bias.astype(np.float32)[None])
    tx, tw = torch.from_numpy(x), [torch.from_numpy(m) for m in w]

    def torch_layer():
        q, k, v = ((tx @ m).view(1, T, H, D).transpose(1, 2) for m in tw[:3])
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=tbias)
        return out.transpose(1, 2).reshape(1, T, d) @ tw[3]
    rows.append(_ratio_row("fast layer / torch (projections + sdpa, same float mask)",
                           lambda: fast_layer(x, causal=True), torch_layer, repeats, 1.0, inclusive=True))
    return rows


def rope_rows(H: int, T: int, D: int, repeats: int) -> list[Row]:
    """``apply_rope`` against ``x.copy()`` and the HF PyTorch expression, both layouts."""
    x = np.random.default_rng(1).standard_normal((H, T, D), dtype=np.float32)
    rows = []
    for layout in ("half", "interleaved"):
        rows.append(_info_row(f"reference apply_rope {layout} H={H} T={T} D={D} f32 / x.copy()",
                              lambda layout=layout: rope.apply_rope(x, T, layout=layout), x.copy, repeats))
        ours = lambda layout=layout: fast.rope.apply_rope(x, T, layout=layout)  # noqa: E731
        rows.append(_ratio_row(f"fast apply_rope {layout} H={H} T={T} D={D} f32 / x.copy()", ours, x.copy,
                               repeats, 4.0))
        if torch is None:
            rows.append(Row(f"fast apply_rope {layout} / torch HF expression", None, None, None, "< 0.6", None,
                            note=NO_TORCH))
            continue
        angles = np.arange(T)[:, None] * rope.rope_inv_freq(D)[None, :]
        emb = torch.from_numpy(np.concatenate([angles, angles], axis=-1))
        cos, sin, tx = emb.cos().float(), emb.sin().float(), torch.from_numpy(x)

        def hf():
            x1, x2 = tx[..., : D // 2], tx[..., D // 2:]
            return tx * cos + torch.cat((-x2, x1), dim=-1) * sin                 # HF apply_rotary_pos_emb
        rows.append(_ratio_row(f"fast apply_rope {layout} / torch HF expression (cos, sin precomputed)",
                               ours, hf, repeats, 0.6))
    return rows


def rope_definitional_row(T: int, D: int, repeats: int) -> Row:
    """``apply_rope`` against R(m) x built per position (the definitional form, Eq. 15)."""
    x = np.random.default_rng(2).standard_normal((T, D))

    def definitional():
        R = np.stack([rope.rotation_matrix(m, D) for m in range(T)])             # (T, D, D)
        return np.einsum("tde,te->td", R, x)
    return _ratio_row(f"efficient/definitional: reference apply_rope (Eq. 34) / R(m) x per position, T={T} D={D}",
                      lambda: rope.apply_rope(x, T), definitional, repeats, 0.1)


def t5_row(T: int, H: int, repeats: int) -> Row:
    table = np.random.default_rng(3).standard_normal((32, H)).astype(np.float32)
    return _ratio_row(f"fast/reference: t5_bias Toeplitz / bucket per pair, T=S={T} H={H}",
                      lambda: fast.t5.t5_bias(table, T, T), lambda: t5.t5_bias(table, T, T), repeats, 0.1)


def xl_row(T: int, H: int, D: int, repeats: int) -> Row:
    """Terms (b) + (d): project R at S distances and shift, against the gather per pair."""
    rng = np.random.default_rng(4)
    d_model = H * D
    q = rng.standard_normal((1, H, T, D), dtype=np.float32)
    v = rng.standard_normal((H, D), dtype=np.float32) * 0.02
    w_r = (rng.standard_normal((d_model, H * D)) / np.sqrt(d_model)).astype(np.float32)
    pos = np.arange(T)

    def shift():
        r = transformer_xl.relative_heads(transformer_xl.relative_embeddings(T, d_model), w_r, H)
        return transformer_xl.position_scores(q, r.astype(np.float32), v)
    gather = lambda: transformer_xl.xl_position_logits(q, v, w_r, pos, pos)   # noqa: E731
    return _ratio_row(f"efficient/definitional: XL rel_shift / gather, T=S={T} H={H} D={D}", shift, gather,
                      repeats, 0.33)


def deberta_row(T: int, H: int, D: int, span: int, repeats: int) -> Row:
    rng = np.random.default_rng(5)
    q, k = (rng.standard_normal((1, H, T, D), dtype=np.float32) for _ in range(2))
    pk, pq = (rng.standard_normal((H, 2 * span, D), dtype=np.float32) for _ in range(2))
    rel = deberta.build_relative_position(T, T, bucket_size=span, max_position=4 * span)
    args = (q, k, pk, pq, rel)
    return _ratio_row(f"efficient/definitional: DeBERTa c2p+p2c (T x 2k + gather) / per pair, T={T}",
                      lambda: deberta.disentangled_scores(*args, att_span=span),
                      lambda: deberta.disentangled_scores_definitional(*args, att_span=span), repeats, 0.25)


def alibi_block_row(T: int, H: int, block: int, repeats: int) -> Row:
    """Every causal block of the bias in float32 (fast ``alibi_bias(dtype=float32)``) against the dense
    reference bias cast to float32."""
    slopes, pos = alibi.alibi_slopes(H), np.arange(T)

    def per_block():
        for i in range(0, T, block):
            for j in range(0, i + block, block):
                fast.alibi.alibi_bias(slopes, pos[i:i + block], pos[j:j + block], dtype=np.float32)
    dense = lambda: alibi.alibi_bias(slopes, pos, pos).astype(np.float32)    # noqa: E731
    return _ratio_row(f"fast/reference: ALiBi bias per causal block in float32 / dense, T={T} H={H}",
                      per_block, dense, repeats, 1.0)


def _worker(kind: str, T: int, H: int, D: int, block: int) -> tuple[float, int]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-m", "benchmarks._worker", kind, str(T), str(H), str(D), str(block)],
                         capture_output=True, text=True, check=True, env=env, cwd=ROOT).stdout.split()
    return float(out[0]), int(out[1])


def backward_memory_row(T: int, H: int, D: int, block: int) -> Row:
    """Peak resident memory of the fast blockwise backward (forward, then backward) at a long length."""
    mib = 2.0 ** 20
    seconds, peak = _worker("backward", T, H, D, block)
    return Row(f"peak RSS, fast blockwise forward + backward causal T=S={T} H={H} D={D} (ref: the dense (H, T, S) "
               f"f32 logits alone)", peak / mib, H * T * T * 4 / mib, peak / mib / (H * T * T * 4 / mib), "< 2048 MiB",
               peak / mib < 2048, unit="MiB", note=f"{seconds:.1f} s")


def memory_rows(T_long: int, T_dense: int, H: int, D: int, block: int) -> list[Row]:
    """Peak resident memory of fresh processes (``VmHWM``, i.e. ``ru_maxrss`` of the process alone).

    The blockwise/dense ratio compares what each adds to a process that only imported minipos.
    """
    mib = 2.0 ** 20
    _, base = _worker("baseline", 1, H, D, block)
    seconds, peak = _worker("layer", T_long, H, D, block)
    dense_logits = H * T_long * T_long * 4 / mib
    rows = [Row(f"peak RSS, layer causal ALiBi T=S={T_long} H={H} D={D} block={block} (ref: the dense "
                f"(H, T, S) f32 logits alone)", peak / mib, dense_logits, peak / mib / dense_logits,
                "< 1536 MiB", peak / mib < 1536, unit="MiB", note=f"{seconds:.1f} s")]
    tb, pb = _worker("blockwise", T_dense, H, D, block)
    td, pd = _worker("dense", T_dense, H, D, block)
    ratio = (pb - base) / (pd - base)
    rows.append(Row(f"peak RSS above the imports ({base / mib:.0f} MiB), blockwise / dense attention, "
                    f"T=S={T_dense} H={H}", (pb - base) / mib, (pd - base) / mib, ratio, "< 0.5", ratio < 0.5,
                    unit="MiB", note=f"{tb:.2f} s vs {td:.2f} s"))
    return rows


def decode_rows(lengths, H: int, D: int, steps: int) -> list[Row]:
    """One decoded token with a ``KVCache`` of each length: time per token, ratio to the first."""
    layer = fast.MultiHeadAttention(H * D, H, scheme=ALiBi(), dtype=np.float32)
    rng = np.random.default_rng(6)
    rows, first = [], None
    for L in lengths:
        cache = layer.new_cache()
        kv = rng.standard_normal((1, H, L, D), dtype=np.float32)
        cache.append(kv, kv, np.arange(L))                          # a prefilled cache of L keys
        x = rng.standard_normal((1, 1, H * D), dtype=np.float32)
        layer(x, cache=cache, causal=True)                          # warm-up
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            layer(x, cache=cache, causal=True)
            times.append(time.perf_counter() - start)
        t = float(np.median(times))
        first = first or (L, t)
        expected = L / first[0]
        ratio = t / first[1]
        rows.append(Row(f"fast layer: decode 1 token, cache length {L} (ref: length {first[0]})", t, first[1], ratio,
                        f"<= {1.5 * expected:g} (linear)", ratio <= 1.5 * expected))
    return rows
