"""How long one training step of the lab's model takes, against the same model in torch.

``step_ratio()`` builds the lab's model (NumPy, float32, ``minipos.fast`` attention) and the same
model in torch (``torch_model``: eager, CPU, float32: embedding, pre-norm blocks with the scheme's
attention through ``scaled_dot_product_attention``, GELU MLP, tied head, AdamW), runs a few
warm-up steps of each, then times them in alternation (so both see the same machine load) and
returns ``numpy time / torch time`` per step, the median over rounds. The torch model implements
RoPE, Transformer-XL and DeBERTa attention (``TORCH_SCHEMES``); the model of any other scheme is
timed against the RoPE model of the same sizes (``torch_scheme``). It exists to time against and to
check the NumPy model (``tests/test_lab_model.py``); nothing else in the lab imports torch. The
process's malloc is tuned first, as ``python -m lab`` tunes it (``lab.memory``): this holds for both
sides of the comparison.
"""

from __future__ import annotations

import contextlib
import math
import os
import statistics
import time

import numpy as np

from minipos.fast import _threads

from . import schemes
from .memory import keep_freed_memory
from .model import AdamW, Model, ModelConfig, clip_by_global_norm

__all__ = ["step_ratio", "step_ratios", "numpy_step_time", "torch_step_time", "torch_model", "torch_scheme",
           "load_weights", "TORCH_SCHEMES"]


def _numpy_stepper(config: ModelConfig, batch: int, length: int, seed: int):
    """One training step as ``python -m lab`` takes it (forward, backward, clipping, AdamW)."""
    keep_freed_memory()                                              # as python -m lab does
    model = Model(config, seed=seed)
    opt = AdamW(model.params)
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, config.vocab, (batch, length + 1))

    def step():
        out = model.forward(tokens[:, :-1], tokens[:, 1:])
        grads = model.backward(out["context"])
        clip_by_global_norm(grads, 1.0)
        opt.step(grads, 1e-3)
    return step


@contextlib.contextmanager
def one_thread(torch=None):
    """Both sides on one thread: OpenBLAS's and minipos's pools held to one, torch's intra-op threads
    set to 1 (and each restored after)."""
    before = None if torch is None else torch.get_num_threads()
    previous = os.environ.get("MINIPOS_NUM_THREADS")
    os.environ["MINIPOS_NUM_THREADS"] = "1"
    try:
        if torch is not None:
            torch.set_num_threads(1)
        with _threads.one_blas_thread():
            yield
    finally:
        if torch is not None:
            torch.set_num_threads(before)
        if previous is None:
            os.environ.pop("MINIPOS_NUM_THREADS", None)
        else:
            os.environ["MINIPOS_NUM_THREADS"] = previous


TORCH_SCHEMES = ("rope", "transformer-xl", "deberta")
"""The schemes ``torch_model`` implements; it runs any other scheme's model with RoPE attention."""


def torch_scheme(config: ModelConfig) -> str:
    """The scheme ``torch_model(config, ...)`` attends with: the config's, or ``"rope"`` for a scheme
    it does not implement (then the comparison is with a RoPE model of the same sizes)."""
    name = (config.scheme or {}).get("name", "rope")
    return name if name in TORCH_SCHEMES else "rope"


def _torch_rope(torch, D, length):
    """``rope(x)`` on (B, H, T, D): interleaved pairs, Eq. 34, inverse frequencies 10000^(-2i/D)."""
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None]   # (T, D/2)
    cos_t, sin_t = angles.cos().repeat_interleave(2, -1), angles.sin().repeat_interleave(2, -1)   # (T, D)

    def rope(x):
        T = x.shape[-2]
        rot = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
        return x * cos_t[:T].to(x.dtype) + rot * sin_t[:T].to(x.dtype)
    return rope


def _torch_xl_table(torch, d, length, base):
    """R_n for n = length - 1 ... 0 (the paper's descending ``pos_seq``), split layout [sin | cos]
    with w_c = base^(-2c/d): (length, d), float64."""
    pos_seq = torch.arange(length - 1, -1, -1.0, dtype=torch.float64)
    inv_freq = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    angles = torch.outer(pos_seq, inv_freq)                                        # (T, d/2)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


def _torch_rel_shift(torch, x):
    """Transformer-XL's relative shift on (B, H, T, T) whose column c holds distance T - 1 - c: pad a
    zero column in front, view as (T + 1, T), drop the first row. Column j then holds distance i - j
    for j <= i (the entries above the diagonal are garbage, masked by the causal mask)."""
    B, H, T, S = x.shape
    padded = torch.nn.functional.pad(x, (1, 0))                                    # (B, H, T, S + 1)
    return padded.view(B, H, S + 1, T)[:, :, 1:].reshape(B, H, T, S)


def _torch_deberta_index(torch, length, buckets, max_position, span):
    """HF DeBERTa-v2's ``build_relative_position`` (log buckets, q - k, as HF computes them) and the
    c2p and p2c gather indices ``clamp(+-rel + span, 0, 2 span - 1)``: two (T, T) long tensors."""
    rel = torch.arange(length)[:, None] - torch.arange(length)[None, :]            # (T, T)  q - k
    if buckets > 0 and max_position > 0:                                          # make_log_bucket_position
        sign, mid = torch.sign(rel), buckets // 2
        abs_pos = torch.where((rel < mid) & (rel > -mid), torch.tensor(mid - 1).type_as(rel), torch.abs(rel))
        log_pos = torch.ceil(torch.log(abs_pos / mid) / torch.log(torch.tensor((max_position - 1) / mid))
                             * (mid - 1)) + mid
        rel = torch.where(abs_pos <= mid, rel.type_as(log_pos), log_pos * sign).to(torch.long)
    return torch.clamp(rel + span, 0, 2 * span - 1), torch.clamp(-rel + span, 0, 2 * span - 1)


def torch_model(config: ModelConfig, length: int):
    """The lab's model in torch (LayerNorm, GELU tanh, tied head), for timing and as an outside check
    of the NumPy model; its weights map to the lab's by ``load_weights``. Attention is the config's
    scheme where it is one of ``TORCH_SCHEMES``, RoPE otherwise (``torch_scheme``):

    - RoPE: interleaved pairs, ``scaled_dot_product_attention(is_causal=True)``;
    - Transformer-XL (Dai et al. 2019, Sec. 3.3; the authors' ``RelPartialLearnableMultiHeadAttn``):
      ``(q + r_w_bias) k^T + rel_shift((q + r_r_bias) r_net(R)^T)``, over ``sqrt(D)``;
    - DeBERTa (HF ``DebertaV2`` ``DisentangledSelfAttention``, ``share_att_key``, ``c2p|p2c``): c2c
      plus the gathered c2p and p2c terms, over ``sqrt(3 D)``, with the spec's log buckets.
    """
    import torch
    import torch.nn.functional as F

    d, H, V = config.d_model, config.num_heads, config.vocab
    D = d // H
    name = torch_scheme(config)
    spec = schemes.build(config.scheme) if name != "rope" else None               # its settings only
    rope = _torch_rope(torch, D, length)
    future = torch.ones(length, length, dtype=torch.bool).triu(1)                  # (T, T)  j > i
    if name == "transformer-xl":
        table = _torch_xl_table(torch, d, length, spec.base)                       # (T, d)
    if name == "deberta":
        if tuple(spec.pos_att_type) != ("c2p", "p2c"):
            raise ValueError(f"torch_model's DeBERTa has c2p and p2c, got pos_att_type {spec.pos_att_type}")
        span = spec.att_span
        c2p_pos, p2c_pos = _torch_deberta_index(torch, length, spec.position_buckets, spec.max_relative_positions,
                                                span)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
            self.out = torch.nn.Linear(d, d, bias=False)
            self.fc1, self.fc2 = torch.nn.Linear(d, config.d_ff), torch.nn.Linear(config.d_ff, d)
            if name == "transformer-xl":
                self.r_net = torch.nn.Linear(d, H * D, bias=False)
                self.r_w_bias = torch.nn.Parameter(torch.zeros(H, D))                 # u
                self.r_r_bias = torch.nn.Parameter(torch.zeros(H, D))                 # v
            if name == "deberta":
                self.rel_embeddings = torch.nn.Parameter(torch.zeros(2 * span, d))

        def attend(self, q, k, v):                                               # (B, H, T, D) each
            T = q.shape[-2]
            if name == "rope":
                return F.scaled_dot_product_attention(rope(q), rope(k), v, is_causal=True)
            if name == "transformer-xl":
                r = self.r_net(table[-T:].to(q.dtype)).view(T, H, D).transpose(0, 1)      # (H, T, D)
                bd = _torch_rel_shift(torch, (q + self.r_r_bias[:, None]) @ r.transpose(-1, -2))   # (B, H, T, T)
                bias = (bd / math.sqrt(D)).masked_fill(future[:T, :T], float("-inf"))
                return F.scaled_dot_product_attention(q + self.r_w_bias[:, None], k, v, attn_mask=bias)
            wq, wk = self.qkv.weight[:d], self.qkv.weight[d:2 * d]
            pos_query = F.linear(self.rel_embeddings, wq).view(2 * span, H, D).transpose(0, 1)   # (H, 2k, D)
            pos_key = F.linear(self.rel_embeddings, wk).view(2 * span, H, D).transpose(0, 1)
            B = q.shape[0]
            c2p = torch.gather(q @ pos_key.transpose(-1, -2), -1, c2p_pos[:T, :T].expand(B, H, T, T))
            p2c = torch.gather(k @ pos_query.transpose(-1, -2), -1, p2c_pos[:T, :T].expand(B, H, T, T))
            scale = math.sqrt(D * 3)                                             # 1 + two position terms
            bias = ((c2p + p2c.transpose(-1, -2)) / scale).masked_fill(future[:T, :T], float("-inf"))
            return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, scale=1 / scale)

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
            x = x + self.out(self.attend(q, k, v).transpose(1, 2).reshape(B, T, d))
            return x + self.fc2(F.gelu(self.fc1(self.norm2(x)), approximate="tanh"))

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = torch.nn.Embedding(V, d)
            self.blocks = torch.nn.ModuleList(Block() for _ in range(config.num_layers))
            self.norm = torch.nn.LayerNorm(d)

        def forward(self, tokens):
            x = self.embed(tokens)
            for block in self.blocks:
                x = block(x)
            return self.norm(x) @ self.embed.weight.T

    return Net()


def load_weights(net, model: Model) -> None:
    """Copy the NumPy model's parameters into ``torch_model``'s (``W`` is used as ``x @ W``: torch's is ``W.T``)."""
    import torch

    p = model.params
    dtype = next(net.parameters()).dtype
    t = lambda a: torch.tensor(np.asarray(a), dtype=dtype)  # noqa: E731
    with torch.no_grad():
        net.embed.weight.copy_(t(p["embed"]))
        net.norm.weight.copy_(t(p["norm_f.g"]))
        net.norm.bias.copy_(t(p["norm_f.b"]))
        for i, blk in enumerate(net.blocks):
            pre = f"blocks.{i}."
            blk.qkv.weight.copy_(t(np.concatenate([p[pre + "attn.wq"], p[pre + "attn.wk"], p[pre + "attn.wv"]], 1).T))
            blk.out.weight.copy_(t(p[pre + "attn.wo"].T))
            for norm, name in ((blk.norm1, "norm1"), (blk.norm2, "norm2")):
                norm.weight.copy_(t(p[pre + name + ".g"]))
                norm.bias.copy_(t(p[pre + name + ".b"]))
            blk.fc1.weight.copy_(t(p[pre + "mlp.w1"].T))
            blk.fc1.bias.copy_(t(p[pre + "mlp.b1"]))
            blk.fc2.weight.copy_(t(p[pre + "mlp.w2"].T))
            blk.fc2.bias.copy_(t(p[pre + "mlp.b2"]))
            if hasattr(blk, "r_net"):                                            # Transformer-XL
                blk.r_w_bias.copy_(t(p[pre + "attn.scheme.u"]))
                blk.r_r_bias.copy_(t(p[pre + "attn.scheme.v"]))
                blk.r_net.weight.copy_(t(p[pre + "attn.scheme.w_r"].T))
            if hasattr(blk, "rel_embeddings"):                                   # DeBERTa
                blk.rel_embeddings.copy_(t(p[pre + "attn.scheme.rel_embeddings"]))


def _torch_stepper(config: ModelConfig, batch: int, length: int, seed: int):
    import torch
    import torch.nn.functional as F

    torch.manual_seed(seed)
    V = config.vocab
    net = torch_model(config, length)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.95), weight_decay=0.1)
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, V, (batch, length + 1), generator=g)

    def step():
        logits = net(tokens[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, V), tokens[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()
    return step


CLOCKS = {"wall": time.perf_counter, "process": time.process_time}


def _time(step, repeats: int, clock: str = "wall") -> float:
    now = CLOCKS[clock]
    start = now()
    for _ in range(repeats):
        step()
    return (now() - start) / repeats


def _config(vocab, d_model, num_heads, num_layers, d_ff, scheme):
    return ModelConfig(vocab=vocab, d_model=d_model, num_heads=num_heads, num_layers=num_layers, d_ff=d_ff,
                       scheme=scheme)


def numpy_step_time(*, vocab=32, d_model=64, num_heads=4, num_layers=2, d_ff=256, batch=32, length=64,
                    scheme=None, repeats=10, warmup=3, seed=0) -> float:
    """Seconds per training step (forward, backward, clipping, AdamW) of the lab's model."""
    step = _numpy_stepper(_config(vocab, d_model, num_heads, num_layers, d_ff, scheme or {"name": "rope"}),
                          batch, length, seed)
    for _ in range(warmup):
        step()
    return _time(step, repeats)


def torch_step_time(*, vocab=32, d_model=64, num_heads=4, num_layers=2, d_ff=256, batch=32, length=64,
                    scheme=None, repeats=10, warmup=3, seed=0) -> float | None:
    """Seconds per training step of the same model in torch (``scheme``'s attention where
    ``torch_model`` implements it, RoPE otherwise), or None without torch."""
    try:
        step = _torch_stepper(_config(vocab, d_model, num_heads, num_layers, d_ff, scheme or {"name": "rope"}),
                              batch, length, seed)
    except ImportError:
        return None
    for _ in range(warmup):
        step()
    return _time(step, repeats)


def step_ratio(*, vocab=32, d_model=64, num_heads=4, num_layers=2, d_ff=256, batch=32, length=64,
               scheme=None, rounds=5, repeats=8, warmup=3, seed=0, details: bool = False):
    """``numpy CPU seconds / torch CPU seconds`` for one training step of the lab's model, each on one
    thread (``one_thread``), the median of ``rounds`` timed in alternation.

    One thread each because that is how the protocol runs: one process per record, one thread each,
    as many side by side as there are cores (``lab.pool``); CPU time (``time.process_time``) because it
    counts the work done whatever else the machine runs. The default sizes are the protocol's (2
    layers, d_model 64, 4 heads, d_ff 256, vocabulary 32, batch 32 at length 64); ``scheme`` is the
    lab model's spec (default RoPE). The torch model attends with the same scheme where it implements
    it (``torch_scheme``), with RoPE otherwise. Returns ``None`` (with a note on stderr) when torch is
    not installed; with ``details=True`` a dict ``{"ratio", "numpy_s", "torch_s", "threads",
    "torch_scheme"}`` instead of the ratio.
    """
    try:
        import torch
    except ImportError:
        import sys
        print("lab.bench.step_ratio: torch is not installed; no ratio (pip install torch to compare)",
              file=sys.stderr)
        return None
    config = _config(vocab, d_model, num_heads, num_layers, d_ff, scheme or {"name": "rope"})
    with one_thread(torch):
        ours = _numpy_stepper(config, batch, length, seed)
        theirs = _torch_stepper(config, batch, length, seed)
        for _ in range(warmup):
            ours()
            theirs()
        a, b = [], []
        for _ in range(rounds):                                      # alternate: the same load for both
            a.append(_time(ours, repeats, "process"))
            b.append(_time(theirs, repeats, "process"))
    ratio = statistics.median(x / y for x, y in zip(a, b))
    if details:
        return {"ratio": ratio, "numpy_s": statistics.median(a), "torch_s": statistics.median(b), "threads": 1,
                "torch_scheme": torch_scheme(config)}
    return ratio


def step_ratios(schemes=None, *, length: int = 64, **kwargs) -> dict | None:
    """``step_ratio(details=True)`` for each scheme of the lab (by name, default ``lab.schemes.ORDER``,
    configured as the protocol configures it for ``length``), each against its torch model (the same
    scheme, or RoPE where ``torch_model`` does not implement it, as ``"torch_scheme"`` says):
    ``{name: {"ratio", "numpy_s", "torch_s", "threads", "torch_scheme"}}``, or ``None``
    without torch."""
    from . import schemes as specs
    out = {}
    for name in specs.NAMES if schemes is None else schemes:
        got = step_ratio(scheme=specs.default_spec(name, length), length=length, details=True, **kwargs)
        if got is None:
            return None
        out[name] = got
    return out
