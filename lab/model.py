"""A small decoder-only transformer in NumPy, with its backward written out, and AdamW.

The model (pre-norm, GPT-2 shape; ``x`` is ``(B, T, d_model)`` throughout)::

    x = E[tokens]                                    embedding            (B, T, d)
    for each block:
        x = x + Attention(Norm1(x), causal=True)     the scheme under test (minipos.fast layer)
        x = x + W2 act(Norm2(x) W1 + b1) + b2        MLP, act = GELU (tanh form) or ReLU
    logits = NormF(x) E^T   (tied)  or  NormF(x) W_head                   (B, T, V)
    loss = mean over the weighted tokens of -log softmax(logits)[target]

Attention and its position scheme are minipos's (``minipos.fast.MultiHeadAttention``), gradients by
``layer.backward``; every other piece has its forward and backward here as plain functions, each
checked against central finite differences in float64 (``tests/test_lab_model.py``).

Parameters live in one flat dict ``model.params`` of NumPy arrays keyed by dotted names
(``"embed"``, ``"blocks.0.attn.wq"``, ``"blocks.0.attn.scheme.table"``, ``"blocks.1.mlp.w1"``, ...); the
attention entries are the layer's own arrays, so an in-place update (``AdamW.step``) changes the
layer. ``copy_parameters`` moves trained weights into a model built with another scheme of the same
shapes (a RoPE scaling).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from minipos.fast import MultiHeadAttention

from . import schemes
from .schemes import source_init

__all__ = [
    "ModelConfig", "Model", "AdamW", "learning_rate", "clip_by_global_norm",
    "layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward", "gelu", "gelu_backward",
    "relu", "relu_backward", "mlp", "mlp_backward", "embedding_backward", "cross_entropy",
    "cross_entropy_backward", "weight_total", "weighted_mean", "copy_parameters",
]

EPS = 1e-5  # the norms' epsilon (torch's LayerNorm default)


# ----------------------------------------------------------------------------- pieces

def _row_mean(a, ones):
    """The mean over the last axis as a matrix-vector product (``ones`` = 1/d), faster than ``mean``."""
    return (a @ ones)[..., None]


def layer_norm(x, g, b):
    """LayerNorm over the last axis: ``(x - mean) / sqrt(var + eps) * g + b``; returns ``(y, cache)``."""
    ones = np.full(x.shape[-1], 1.0 / x.shape[-1], x.dtype)
    xc = x - _row_mean(x, ones)
    rstd = 1.0 / np.sqrt(_row_mean(xc * xc, ones) + EPS)              # (..., 1)
    xhat = xc * rstd
    return xhat * g + b, (xhat, rstd, g, ones)


def _param_sum(a, b=None):
    """``sum(a * b)`` (or ``sum(a)``) over every axis but the last: a parameter's gradient."""
    a2 = a.reshape(-1, a.shape[-1])
    return a2.sum(axis=0) if b is None else np.einsum("nd,nd->d", a2, b.reshape(a2.shape))


def layer_norm_backward(cache, dy):
    """``(dx, dg, db)``: dx = rstd (dxhat - mean(dxhat) - xhat mean(dxhat xhat)), dxhat = dy g."""
    xhat, rstd, g, ones = cache
    dxhat = dy * g
    dx = rstd * (dxhat - _row_mean(dxhat, ones) - xhat * _row_mean(dxhat * xhat, ones))
    return dx, _param_sum(dy, xhat), _param_sum(dy)


def rms_norm(x, g):
    """RMSNorm (Zhang and Sennrich 2019): ``x / sqrt(mean(x^2) + eps) * g``; returns ``(y, cache)``."""
    ones = np.full(x.shape[-1], 1.0 / x.shape[-1], x.dtype)
    rstd = 1.0 / np.sqrt(_row_mean(x * x, ones) + EPS)
    xhat = x * rstd
    return xhat * g, (xhat, rstd, g, ones)


def rms_norm_backward(cache, dy):
    """``(dx, dg)``: dx = rstd (dxhat - xhat mean(dxhat xhat)), dxhat = dy g."""
    xhat, rstd, g, ones = cache
    dxhat = dy * g
    dx = rstd * (dxhat - xhat * _row_mean(dxhat * xhat, ones))
    return dx, _param_sum(dy, xhat)


_GELU_C = math.sqrt(2.0 / math.pi)
_GELU_A = 0.044715


_CHUNK = 32768
"""Elements per chunk of ``gelu``: its dozen passes over one chunk (128 KiB of float32) stay in the
core's cache instead of streaming the whole (N, d_ff) array through memory each time."""


def gelu(h, grad: bool = True):
    """GELU, tanh form (GPT-2; torch ``approximate="tanh"``): ``0.5 h (1 + tanh(c (h + a h^3)))``,
    c = sqrt(2/pi), a = 0.044715. Returns ``(y, dy/dh)`` (the derivative, elementwise, or None
    without ``grad``) in ``h``'s dtype:

        dy/dh = (1 + t)/2 + (h/2) (1 - t^2) c (1 + 3 a h^2),   t = tanh(c (h + a h^3))

    Computed ``_CHUNK`` elements at a time (every element takes the same operations in the same
    order, so the values do not depend on the chunking).
    """
    flat = np.ascontiguousarray(h).reshape(-1)
    y = np.empty_like(flat)
    deriv = np.empty_like(flat) if grad else None
    for i in range(0, flat.size, _CHUNK):
        part = slice(i, i + _CHUNK)
        _gelu_chunk(flat[part], y[part], None if deriv is None else deriv[part])
    return y.reshape(h.shape), None if deriv is None else deriv.reshape(h.shape)


def _gelu_chunk(h, y, deriv):
    """``gelu`` of the 1-D ``h`` into ``y`` (and ``deriv`` unless it is None), in place."""
    one = h.dtype.type
    h2 = h * h
    t = h2 * one(_GELU_C * _GELU_A)
    t += one(_GELU_C)
    t *= h                                                           # c (h + a h^3)
    np.tanh(t, out=t)
    half = t * one(0.5)
    half += one(0.5)                                                 # (1 + t)/2
    np.multiply(h, half, out=y)
    if deriv is None:
        return
    np.multiply(t, t, out=t)
    np.subtract(one(1), t, out=t)                                    # 1 - t^2
    h2 *= one(3 * _GELU_C * _GELU_A)
    h2 += one(_GELU_C)
    h2 *= h
    h2 *= one(0.5)                                                   # (h/2) c (1 + 3 a h^2)
    h2 *= t
    np.add(h2, half, out=deriv)


def gelu_backward(h, deriv, da):
    """``da * dy/dh`` (the derivative ``gelu`` returned)."""
    return da * deriv


def relu(h, grad: bool = True):
    return np.maximum(h, 0), None


def relu_backward(h, _, da):
    return da * (h > 0)


ACTIVATIONS = {"gelu": (gelu, gelu_backward), "relu": (relu, relu_backward)}


def mlp(x, w1, b1, w2, b2, activation: str = "gelu", grad: bool = True):
    """``act(x w1 + b1) w2 + b2`` on ``x`` ``(N, d)``; returns ``(y, cache)`` (``grad=False``: no backward)."""
    h = x @ w1
    h += b1                                                          # (N, d_ff)
    a, aux = ACTIVATIONS[activation][0](h, grad)
    return a @ w2 + b2, (x, h, aux, a, w1, w2, activation)          # (N, d)


def mlp_backward(cache, dy):
    """``(dx, dw1, db1, dw2, db2)`` of ``mlp`` for the output gradient ``dy`` ``(N, d)``."""
    x, h, aux, a, w1, w2, activation = cache
    dw2, db2 = a.T @ dy, dy.sum(axis=0)
    dh = ACTIVATIONS[activation][1](h, aux, dy @ w2.T)              # (N, d_ff)
    return dh @ w1.T, x.T @ dh, dh.sum(axis=0), dw2, db2


def embedding_backward(tokens, dx, vocab: int):
    """The gradient of ``E[tokens]`` with respect to ``E`` ``(V, d)``: a scatter-add of ``dx`` by token."""
    d = dx.shape[-1]
    out = np.zeros((vocab, d), dx.dtype)
    np.add.at(out, tokens.reshape(-1), dx.reshape(-1, d))
    return out


def cross_entropy(logits, targets, weights=None):
    """Per-token losses ``-log softmax(logits)[target]`` ``(N,)`` and the cache for the backward.

    logits ``(N, V)``, targets ``(N,)`` ints. ``weights`` ``(N,)`` (or None = all ones) weigh the mean
    that ``cross_entropy_backward`` differentiates: ``loss = sum(w l) / sum(w)``.
    """
    m = logits.max(axis=-1, keepdims=True)
    z = logits - m
    lse = np.log(np.exp(z).sum(axis=-1))                              # (N,)
    losses = lse - z[np.arange(len(targets)), targets]
    return losses, (z, lse, targets, weights)


def cross_entropy_backward(cache):
    """The gradient of the weighted mean loss w.r.t. the logits: ``w (softmax - onehot) / sum(w)``."""
    z, lse, targets, weights = cache
    p = np.exp(z - lse[:, None])
    p[np.arange(len(targets)), targets] -= 1.0
    if weights is None:
        return p / len(targets)
    return p * (weights / weight_total(weights, len(targets)))[:, None].astype(p.dtype)


def weight_total(weights, count: int) -> float:
    """The denominator of the weighted mean loss: ``sum(weights)``, at least 1 (so a batch without
    weight has loss 0, not NaN), or ``count`` tokens without weights."""
    return float(count) if weights is None else max(float(weights.sum()), 1.0)


def weighted_mean(losses, weights=None) -> float:
    if weights is None:
        return float(np.mean(losses, dtype=np.float64))
    return float(np.sum(losses * weights, dtype=np.float64) / weight_total(weights, len(losses)))


# ----------------------------------------------------------------------------- the model

@dataclass(frozen=True)
class ModelConfig:
    """Sizes and choices of the model. ``scheme`` is a scheme spec (``lab.schemes``), e.g.
    ``{"name": "rope"}`` or ``{"name": "learned", "max_positions": 64}``."""

    vocab: int
    scheme: dict = field(default_factory=lambda: {"name": "nope"})
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 256
    norm: str = "layernorm"          # or "rmsnorm"
    activation: str = "gelu"         # or "relu"
    tied: bool = True                # output head = embedding^T
    init_std: float = 0.02           # embedding (and untied head) init

    def to_dict(self) -> dict:
        return asdict(self)


class Model:
    """The decoder (see the module docstring), float32 by default, deterministic for a seed."""

    def __init__(self, config: ModelConfig, *, seed: int = 0, dtype=np.float32):
        if config.norm not in ("layernorm", "rmsnorm"):
            raise ValueError(f"norm must be 'layernorm' or 'rmsnorm', got {config.norm!r}")
        if config.activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {sorted(ACTIVATIONS)}, got {config.activation!r}")
        self.config, self.dtype = config, np.dtype(dtype)
        rng = np.random.default_rng(seed)
        d, f, V = config.d_model, config.d_ff, config.vocab
        normal = lambda shape, std: (rng.standard_normal(shape) * std).astype(self.dtype)  # noqa: E731
        p = {"embed": normal((V, d), config.init_std)}
        options = schemes.split_spec(config.scheme)[1]
        self.input_scheme, self.shared = None, bool(options.get("shared"))
        if options.get("placement") == "input":                        # once, into the embeddings
            owner = MultiHeadAttention(d, config.num_heads, scheme=schemes.build(config.scheme), dtype=self.dtype,
                                       seed=int(rng.integers(2 ** 31)))   # holds the scheme; never called
            self.input_scheme = owner.scheme
            for name, arr in owner.scheme.parameters().items():
                p["input.scheme." + name] = arr
        self.layers = []
        for i in range(config.num_layers):
            pre = f"blocks.{i}."
            p.update(self._norm_params(pre + "norm1"))
            scheme = schemes.build({"name": "nope"} if self.input_scheme else config.scheme)
            layer = MultiHeadAttention(d, config.num_heads, scheme=scheme, dtype=self.dtype,
                                       seed=int(rng.integers(2 ** 31)))
            source_init(layer, d)                                      # T5's bias and query as HF draws them
            self.layers.append(layer)
            for name in ("wq", "wk", "wv", "wo"):
                p[pre + "attn." + name] = getattr(layer, name)
            for name, arr in layer.scheme.parameters().items():
                if self.shared and i > 0:                              # the first layer's, every layer's
                    setattr(layer.scheme, name, self.layers[0].scheme.parameters()[name])
                    continue
                p[pre + "attn.scheme." + name] = arr
            p.update(self._norm_params(pre + "norm2"))
            p[pre + "mlp.w1"] = normal((d, f), 1 / math.sqrt(d))
            p[pre + "mlp.b1"] = np.zeros(f, self.dtype)
            p[pre + "mlp.w2"] = normal((f, d), 1 / math.sqrt(f) / math.sqrt(2 * config.num_layers))
            p[pre + "mlp.b2"] = np.zeros(d, self.dtype)
        p.update(self._norm_params("norm_f"))
        if not config.tied:
            p["head"] = normal((d, V), config.init_std)
        self.params = p

    def _norm_params(self, name):
        d = self.config.d_model
        out = {name + ".g": np.ones(d, self.dtype)}
        if self.config.norm == "layernorm":
            out[name + ".b"] = np.zeros(d, self.dtype)
        return out

    def _norm(self, name, x):
        p = self.params
        if self.config.norm == "layernorm":
            return layer_norm(x, p[name + ".g"], p[name + ".b"])
        return rms_norm(x, p[name + ".g"])

    def _norm_backward(self, name, cache, dy, grads):
        if self.config.norm == "layernorm":
            dx, grads[name + ".g"], grads[name + ".b"] = layer_norm_backward(cache, dy)
        else:
            dx, grads[name + ".g"] = rms_norm_backward(cache, dy)
        return dx

    def new_caches(self):
        """One empty KV cache per layer, for ``forward(..., caches=...)`` (incremental decoding)."""
        return [layer.new_cache() for layer in self.layers]

    def forward(self, tokens, targets=None, *, weights=None, caches=None, return_weights: bool = False,
                keep: bool = True):
        """Run the model on ``tokens`` ``(B, T)``.

        Returns a dict: ``logits`` ``(B, T, V)``; with ``targets`` ``(B, T)`` also ``losses`` ``(B, T)``
        and ``loss`` (their ``weights``-weighted mean); with ``return_weights`` the attention weights
        of every layer ``[(B, H, T, S), ...]``; with ``keep`` the context ``backward`` needs.
        ``caches`` (``new_caches()``) continues a sequence: positions go on from the cache length.
        """
        cfg, p = self.config, self.params
        B, T = tokens.shape
        x = p["embed"][tokens]                                           # (B, T, d)
        positions = None
        if self.input_scheme is not None:                                # absolute positions, added once
            start = 0 if caches is None else caches[0].length
            positions = np.arange(start, start + T)
            x = self.input_scheme.embed(x, positions)
        saved, attn_weights = [], []
        for i, layer in enumerate(self.layers):
            pre = f"blocks.{i}."
            h, c1 = self._norm(pre + "norm1", x)
            got = layer(h, causal=True, cache=None if caches is None else caches[i], return_weights=return_weights,
                        return_context=keep)
            got = got if isinstance(got, tuple) else (got,)
            a = got[0]
            if return_weights:
                attn_weights.append(got[1])
            x = x + a
            h2, c2 = self._norm(pre + "norm2", x)
            m, cm = mlp(h2.reshape(B * T, -1), p[pre + "mlp.w1"], p[pre + "mlp.b1"], p[pre + "mlp.w2"],
                        p[pre + "mlp.b2"], cfg.activation, grad=keep)
            x = x + m.reshape(B, T, -1)
            if keep:
                saved.append((c1, got[-1], c2, cm))
        hf, cf = self._norm("norm_f", x)
        head = p["embed"].T if cfg.tied else p["head"]
        logits = hf @ head                                               # (B, T, V)
        out = {"logits": logits}
        if return_weights:
            out["attention"] = attn_weights
        if targets is not None:
            w = None if weights is None else weights.reshape(-1).astype(self.dtype)
            losses, ce = cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1), w)
            out["losses"], out["loss"] = losses.reshape(B, T), weighted_mean(losses, w)
            if keep:
                out["context"] = (tokens, positions, saved, cf, hf, ce)
        return out

    def backward(self, context) -> dict:
        """Gradients of ``forward(...)["loss"]`` for every entry of ``params``, by the same names."""
        cfg, p = self.config, self.params
        tokens, positions, saved, cf, hf, ce = context
        B, T = tokens.shape
        grads = {}
        dlogits = cross_entropy_backward(ce).reshape(B, T, -1)            # (B, T, V)
        flat_h, flat_d = hf.reshape(B * T, -1), dlogits.reshape(B * T, -1)
        if cfg.tied:
            grads["embed"] = flat_d.T @ flat_h                          # logits = h E^T: dE = dlogits^T h
            dh = dlogits @ p["embed"]
        else:
            grads["head"] = flat_h.T @ flat_d
            dh = dlogits @ p["head"].T
        dx = self._norm_backward("norm_f", cf, dh, grads)               # (B, T, d)
        for i in reversed(range(len(self.layers))):
            pre = f"blocks.{i}."
            c1, actx, c2, cm = saved[i]
            dm, grads[pre + "mlp.w1"], grads[pre + "mlp.b1"], grads[pre + "mlp.w2"], grads[pre + "mlp.b2"] = \
                mlp_backward(cm, dx.reshape(B * T, -1))
            dx = dx + self._norm_backward(pre + "norm2", c2, dm.reshape(B, T, -1), grads)
            g = self.layers[i].backward(actx, dx)
            for name, value in g.items():
                if name == "x":
                    continue
                key = pre + "attn." + name
                if self.shared and name.startswith("scheme."):          # a shared table: the layers' sum
                    key = "blocks.0.attn." + name
                grads[key] = value if key not in grads else grads[key] + value
            dx = dx + self._norm_backward(pre + "norm1", c1, g["x"], grads)
        if self.input_scheme is not None:
            add = lambda name, g: grads.__setitem__("input." + name, g)  # noqa: E731
            dx = self.input_scheme.embed_backward(dx, positions, add)
        de = embedding_backward(tokens, dx, cfg.vocab)
        grads["embed"] = de if "embed" not in grads else grads["embed"] + de
        return {name: np.asarray(g, dtype=p[name].dtype) for name, g in grads.items()}

    def num_parameters(self) -> int:
        return int(sum(a.size for a in self.params.values()))


def copy_parameters(src: Model, dst: Model) -> None:
    """Copy every parameter of ``src`` into ``dst`` in place (same names and shapes)."""
    if set(src.params) != set(dst.params):
        raise ValueError(f"the models' parameters differ: {sorted(set(src.params) ^ set(dst.params))}")
    for name, arr in dst.params.items():
        if arr.shape != src.params[name].shape:
            raise ValueError(f"{name}: shape {src.params[name].shape} cannot go into {arr.shape}")
        arr[...] = src.params[name]


# ----------------------------------------------------------------------------- training

def learning_rate(step: int, *, lr: float, steps: int, warmup: int, schedule: str = "cosine",
                  min_ratio: float = 0.1) -> float:
    """Linear warm-up over ``warmup`` steps to ``lr``, then constant or cosine down to ``min_ratio * lr``.

    ``step`` counts from 0; the first step gets ``lr / warmup``.
    """
    if step < warmup:
        return lr * (step + 1) / warmup
    if schedule == "constant":
        return lr
    if schedule != "cosine":
        raise ValueError(f"schedule must be 'cosine' or 'constant', got {schedule!r}")
    done = (step - warmup) / max(1, steps - warmup)
    return lr * (min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(done, 1.0))))


def clip_by_global_norm(grads: dict, max_norm: float) -> float:
    """Scale every gradient in place so their global L2 norm is at most ``max_norm``; return the norm before."""
    total = math.sqrt(sum(float(np.dot(g.ravel().astype(np.float64), g.ravel().astype(np.float64)))
                          for g in grads.values()))
    if max_norm and total > max_norm:
        scale = max_norm / (total + 1e-6)
        for g in grads.values():
            g *= scale
    return total


class AdamW:
    """Adam with decoupled weight decay (Loshchilov and Hutter 2019), in place on ``params``.

    Weight decay applies to parameters with two or more axes (matrices, tables), not to gains and biases.
    """

    def __init__(self, params: dict, *, betas=(0.9, 0.95), eps: float = 1e-8, weight_decay: float = 0.1):
        self.params, self.betas, self.eps, self.weight_decay = params, tuple(betas), eps, weight_decay
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}
        self.t = 0

    def step(self, grads: dict, lr: float) -> None:
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for name, p in self.params.items():
            g = grads.get(name)
            if g is None:
                continue
            m, v = self.m[name], self.v[name]
            m *= b1
            m += (1 - b1) * g
            v *= b2
            v += (1 - b2) * (g * g)
            if self.weight_decay and p.ndim >= 2:
                p *= 1 - lr * self.weight_decay
            p -= (lr / c1) * m / (np.sqrt(v / c2) + self.eps)
