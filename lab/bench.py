"""How long one training step of the lab's model takes, against the same model in torch.

``step_ratio()`` builds the lab's model (NumPy, float32, ``minipos.fast`` attention) and the same
architecture in torch (eager, CPU, float32: embedding, pre-norm blocks with
``scaled_dot_product_attention(is_causal=True)`` and RoPE, GELU MLP, tied head, AdamW), runs a few
warm-up steps of each, then times them in alternation (so both see the same machine load) and
returns ``numpy time / torch time`` per step, the median over rounds. The torch model exists only to
time against; nothing else in the lab imports torch. The process's malloc is tuned first, as
``python -m lab`` tunes it (``lab.memory``): this holds for both sides of the comparison.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from .memory import keep_freed_memory
from .model import AdamW, Model, ModelConfig, clip_by_global_norm

__all__ = ["step_ratio", "step_ratios", "numpy_step_time", "torch_step_time", "torch_model", "load_weights"]


def _numpy_stepper(config: ModelConfig, batch: int, length: int, seed: int):
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


def torch_model(config: ModelConfig, length: int):
    """The lab's model in torch (RoPE, interleaved pairs; LayerNorm, GELU tanh, tied head), for timing
    and as an outside check of the NumPy model. Its weights map to the lab's by ``load_weights``."""
    import torch
    import torch.nn.functional as F

    d, H, V = config.d_model, config.num_heads, config.vocab
    D = d // H
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, D, 2, dtype=torch.float64) / D))
    angles = torch.arange(length, dtype=torch.float64)[:, None] * inv_freq[None]   # (T, D/2)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm1, self.norm2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
            self.qkv = torch.nn.Linear(d, 3 * d, bias=False)
            self.out = torch.nn.Linear(d, d, bias=False)
            self.fc1, self.fc2 = torch.nn.Linear(d, config.d_ff), torch.nn.Linear(config.d_ff, d)

        def rope(self, x):                                            # interleaved pairs, Eq. 34
            T = x.shape[-2]
            cos = angles[:T].cos().repeat_interleave(2, -1).to(x.dtype)
            sin = angles[:T].sin().repeat_interleave(2, -1).to(x.dtype)
            rot = torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
            return x * cos + rot * sin

        def forward(self, x):
            B, T, _ = x.shape
            q, k, v = self.qkv(self.norm1(x)).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(self.rope(q), self.rope(k), v, is_causal=True)
            x = x + self.out(a.transpose(1, 2).reshape(B, T, d))
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
SETTLE = 0.3
"""Seconds to wait before timing one side: OpenBLAS's idle threads keep spinning for a while after a
call (about 0.1 s), and would take a core from torch's threads if its timing started at once."""


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
                    repeats=10, warmup=3, seed=0) -> float | None:
    """Seconds per training step of the same model in torch (RoPE attention), or None without torch."""
    try:
        step = _torch_stepper(_config(vocab, d_model, num_heads, num_layers, d_ff, {"name": "rope"}),
                              batch, length, seed)
    except ImportError:
        return None
    for _ in range(warmup):
        step()
    return _time(step, repeats)


def step_ratio(*, vocab=32, d_model=64, num_heads=4, num_layers=2, d_ff=256, batch=32, length=64,
               scheme=None, rounds=5, repeats=8, warmup=3, seed=0, clock: str = "wall", details: bool = False):
    """``numpy seconds / torch seconds`` for one training step of the lab's model (median of ``rounds``).

    The default sizes are the protocol's (2 layers, d_model 64, 4 heads, d_ff 256, vocabulary 32,
    batch 32 at length 64); ``scheme`` is the lab model's spec (default RoPE, as the torch model).
    Returns ``None`` (with a note on stderr) when torch is not installed; with ``details=True`` a
    dict ``{"ratio", "numpy_s", "torch_s", "torch_threads"}`` instead of the ratio.

    ``clock="wall"`` times latency on the threads each library chooses; ``clock="process"`` counts
    the CPU time of the process instead, steadier on a loaded machine, and with one thread on both
    sides (``OPENBLAS_NUM_THREADS=1 MINIPOS_NUM_THREADS=1``, ``torch.set_num_threads(1)``) the
    ratio of the work each does.
    """
    if clock not in CLOCKS:
        raise ValueError(f"clock must be one of {', '.join(CLOCKS)}; got {clock!r}")
    try:
        import torch
    except ImportError:
        import sys
        print("lab.bench.step_ratio: torch is not installed; no ratio (pip install torch to compare)",
              file=sys.stderr)
        return None
    config = _config(vocab, d_model, num_heads, num_layers, d_ff, scheme or {"name": "rope"})
    ours = _numpy_stepper(config, batch, length, seed)
    theirs = _torch_stepper(config, batch, length, seed)
    for _ in range(warmup):
        ours()
        theirs()
    a, b = [], []
    for _ in range(rounds):                                          # alternate: the same load for both
        time.sleep(SETTLE)
        a.append(_time(ours, repeats, clock))
        time.sleep(SETTLE)
        b.append(_time(theirs, repeats, clock))
    ratio = statistics.median(x / y for x, y in zip(a, b))
    if details:
        return {"ratio": ratio, "numpy_s": statistics.median(a), "torch_s": statistics.median(b),
                "torch_threads": torch.get_num_threads()}
    return ratio


def step_ratios(schemes=None, *, length: int = 64, **kwargs) -> dict | None:
    """``step_ratio(details=True)`` for each scheme of the lab (by name, default ``lab.schemes.ORDER``,
    configured as the protocol configures it for ``length``), each against the same torch model (RoPE):
    ``{name: {"ratio", "numpy_s", "torch_s", "torch_threads"}}``, or ``None`` without torch."""
    from . import schemes as specs
    out = {}
    for name in specs.ORDER if schemes is None else schemes:
        got = step_ratio(scheme=specs.default_spec(name, length), length=length, details=True, **kwargs)
        if got is None:
            return None
        out[name] = got
    return out
