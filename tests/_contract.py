"""The contract every registered scheme gets, as functions of its registry name.

``test_contract.py`` runs each of ``CHECKS`` for every entry of ``minipos.schemes`` (and for a scheme a
test registers at run time), so a new scheme is covered by its registry line alone:

- ``backward``: every gradient of the layer (the input, the weights, the scheme's parameters)
  against central differences, reference and fast, dense and blockwise, causal and not, padded,
  and after a cache;
- ``fast``: ``minipos.fast.MultiHeadAttention`` equal to the reference (float64 and float32);
- ``cache``: decoding through a KV cache equal to the full causal pass;
- ``blockwise``: ``block_size`` equal to the dense pass, causal and bidirectional;
- ``seams``: what its seams return passes the layer's checks untouched, and garbage in each seam
  it uses (``garbage_scheme``) is refused naming the seam and the scheme;
- ``golden``: its ``layer`` and ``layer_grad`` cases are built from the registry and check clean;
- ``tour``: its row in ``minipos tour``.

Sizes are small (d_model 8, 2 heads, 5 tokens): the whole contract of a scheme takes about a second.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import minipos.fast as fast
from minipos import cli, schemes, vectors
from minipos.layer import MultiHeadAttention
from minipos.vectors import layers as vector_layers

from _gradcheck import after_a_cache, check_layer_gradients

D_MODEL, HEADS, B, T, LENGTH = 8, 2, 2, 5, 16
LAYERS = {"reference": MultiHeadAttention, "fast": fast.MultiHeadAttention}
REGENERATE = "python tools/regenerate.py"


def scheme_of(name: str):
    """A new instance of the registered ``name``, as its ``example(LENGTH)`` configures it."""
    entry = schemes.ENTRIES[name]
    return entry.cls(**entry.example(LENGTH))


def make(name_or_scheme, impl: str = "reference", *, d_model: int = D_MODEL, heads: int = HEADS, seed: int = 1,
         **kw):
    scheme = scheme_of(name_or_scheme) if isinstance(name_or_scheme, str) else name_or_scheme
    return LAYERS[impl](d_model, heads, scheme=scheme, seed=seed, **kw)


def _inputs(seed: int = 0, batch: int = B, length: int = T, d_model: int = D_MODEL):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((batch, length, d_model)), rng.standard_normal((batch, length, d_model))


def _padding(batch: int = B, length: int = T):
    mask = np.ones((batch, length), bool)
    mask[-1, length // 2:] = False                                     # the last sequence padded
    return mask


# --------------------------------------------------------------------------- the checks

def check_backward(name: str) -> None:
    """Every gradient against central differences (``_gradcheck``), in each path."""
    rng = np.random.default_rng(7)
    positions = 3 + np.arange(T)
    for impl, block, causal, pad in (("reference", None, True, False), ("reference", 2, False, True),
                                     ("fast", None, False, True), ("fast", 2, True, False)):
        layer = make(name, impl, bias=True, block_size=block)
        x, dy = _inputs(seed=len(impl) + (block or 0))
        mask = _padding() if pad else None

        def call(x, layer=layer, causal=causal, mask=mask, **kw):
            return layer(x, positions=positions, causal=causal, mask=mask, **kw)
        check_layer_gradients(layer, x, dy, call, rng)
    layer = make(name)
    x0, _ = _inputs(seed=3, length=3)
    x, dy = _inputs(seed=4, length=2)
    check_layer_gradients(layer, x, dy, after_a_cache(layer, x0), rng)   # a step after a cache


def check_fast(name: str) -> None:
    """The fast layer equals the reference: float64 to 1e-10, float32 to 1e-5."""
    x, _ = _inputs(seed=5)
    for dtype, tol in ((np.float64, 1e-10), (np.float32, 1e-5)):
        for block in (None, 2):
            for causal, mask in ((True, None), (False, _padding())):
                ref, quick = (make(name, impl, dtype=dtype, block_size=block) for impl in ("reference", "fast"))
                want = ref(x.astype(dtype), causal=causal, mask=mask)
                np.testing.assert_allclose(quick(x.astype(dtype), causal=causal, mask=mask), want, rtol=tol, atol=tol,
                                           err_msg=f"{name} fast, {np.dtype(dtype)}, block {block}, causal {causal}")


def check_cache(name: str) -> None:
    """Decoding in chunks (2, 1, 2) through a KV cache equals the full causal pass."""
    x, _ = _inputs(seed=6)
    for impl in ("reference", "fast"):
        for block in (None, 2):
            layer = make(name, impl, block_size=block)
            full = layer(x, causal=True)
            cache, steps, start = layer.new_cache(), [], 0
            for n in (2, 1, 2):
                steps.append(layer(x[:, start:start + n], causal=True, cache=cache))
                start += n
            np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-10, atol=1e-12,
                                       err_msg=f"{name} cached, {impl}, block {block}")


def check_blockwise(name: str) -> None:
    """``block_size`` 2 and 3 equal the dense pass, causal and bidirectional, padded or not."""
    x, _ = _inputs(seed=8)
    for causal, mask in ((True, None), (False, None), (True, _padding()), (False, _padding())):
        want = make(name)(x, causal=causal, mask=mask)
        for block in (2, 3):
            np.testing.assert_allclose(make(name, block_size=block)(x, causal=causal, mask=mask), want, rtol=1e-10,
                                       atol=1e-12, err_msg=f"{name} block {block}, causal {causal}")


def check_seams(name: str) -> None:
    """Every seam the layer calls, forward and backward, passes the checks as it is; garbage in each is
    refused naming the seam and the scheme (a fixed sample; test_contract.py draws more)."""
    for seam, kinds in applicable_garbage(name).items():
        for kind in kinds:
            for path in paths_for(seam)[:2]:
                expect_refused(name, seam, kind, path)


def check_golden(name: str) -> None:
    """The golden vectors built from the registry hold a ``layer`` and a ``layer_grad`` case with the
    scheme (or a family of its own), whose expected values a check recomputes without a mismatch."""
    own = vector_layers.OWN_FAMILIES.get(name)
    for family in ((own, f"{own}_grad") if own else ("layer", "layer_grad")):
        doc = _built(family, tuple(schemes.ENTRIES))
        cases = [c for c in doc["cases"] if c["params"].get("scheme") == name]
        assert cases, f"the {family} family builds no case with the scheme {name!r}"
        assert vectors.check_document({**doc, "cases": cases}) == [], (family, name)


def check_tour(name: str) -> None:
    """Its row in ``minipos tour``: the seams of its class, its parameters counted independently, the lab
    numbers where the lab recorded it."""
    rows = {r["scheme"]: r for r in _tour(tuple(schemes.ENTRIES))}
    assert name in rows, f"minipos tour has no row for {name!r}"
    row, entry = rows[name], schemes.ENTRIES[name]
    scheme = entry.cls(**entry.example(8))
    MultiHeadAttention(16, 2, scheme=scheme)
    assert row["seams"] == (list(entry.cls.seams) or ["none"])
    assert row["position_params"] == sum(int(np.size(p)) for p in scheme.parameters().values())
    assert row["config"] == repr(scheme)
    assert isinstance(row["shift_invariant"], bool) and isinstance(row["runs_at_4x"], bool)
    assert (row["lab_measured"] is None) == (name not in cli.lab_measured()["schemes"])


CHECKS = {"backward": check_backward, "fast": check_fast, "cache": check_cache, "blockwise": check_blockwise,
          "seams": check_seams, "golden": check_golden, "tour": check_tour}


@functools.lru_cache(maxsize=4)
def _built(family: str, registry: tuple) -> dict:
    """The family as built for the registry ``registry`` (its names: the cache key)."""
    return vectors.build_family(family)


@functools.lru_cache(maxsize=4)
def _tour(registry: tuple) -> tuple:
    return tuple(cli.tour(d_model=16, heads=2, seq_len=8))


# --------------------------------------------------------------------------- garbage in the seams

def _longer(a):
    """``a`` with its query/token axis doubled: the wrong length."""
    return np.concatenate([a, a], axis=-2)


def _with_nan(a):
    a = np.array(a, dtype=float, copy=True)
    a.flat[0] = np.nan
    return a


ARRAY_GARBAGE = {
    "wrong length": _longer,
    "a list": lambda a: a.tolist(),
    "a tuple": lambda a: tuple(a),
    "NaN": _with_nan,
    "inf": lambda a: np.full_like(a, np.inf),
    "another dtype": lambda a: a.astype(np.float32 if a.dtype == np.float64 else np.float64),
    "integers": lambda a: np.zeros(a.shape, np.int64),
    "None": lambda a: None,
}
"""What a seam returning an array ``a`` (in place of its input) may return instead."""


def _bias_garbage(kind):
    def bad(self, q_positions, k_positions):
        shape = (self.num_heads, len(q_positions), len(k_positions))
        return {"wrong length": lambda: np.zeros((shape[0], shape[1] + 1, shape[2])),
                "too many heads": lambda: np.zeros((shape[0] + 1, *shape[1:])),
                "a list": lambda: np.zeros(shape).tolist(),
                "NaN": lambda: np.full(shape, np.nan),
                "+inf": lambda: np.full(shape, np.inf),
                "integers": lambda: np.zeros(shape, np.int64)}[kind]()
    return bad


def _content_position_garbage(kind, base):
    def bad(self, q, k, q_positions, k_positions, **kw):
        q_c, extra = base.content_position(self, q, k, q_positions, k_positions, **kw)
        B, H, tq = q.shape[:3]
        if kind == "not a pair":
            return q_c
        if kind == "wrong length":
            return _longer(q_c), extra
        if kind == "NaN query":
            return _with_nan(q_c), extra
        shapes = {"extra of the wrong length": lambda qs, ks: np.zeros((B, H, qs.stop - qs.start + 1, ks.stop - ks.start)),
                  "extra NaN": lambda qs, ks: np.full((B, H, qs.stop - qs.start, ks.stop - ks.start), np.nan),
                  "extra a list": lambda qs, ks: np.zeros((B, H, qs.stop - qs.start, ks.stop - ks.start)).tolist(),
                  "extra not callable": None}
        return q_c, shapes[kind] if kind != "extra not callable" else 3.0
    return bad


def _value_garbage(kind):
    def bad(self, q_positions, k_positions):
        if kind == "not callable":
            return "value"
        def value(qs, ks, p):
            shape = (*p.shape[:-1], self.head_dim)                         # (B, H, tq, Dv)
            return {"wrong width": np.zeros((*p.shape[:-1], self.head_dim + 1)),
                    "NaN": np.full(shape, np.nan), "a list": np.zeros(shape).tolist()}[kind]
        return value
    return bad


def _scale_garbage(kind):
    value = {"zero": 0.0, "negative": -1.0, "NaN": float("nan"), "inf": float("inf"), "a str": "0.5",
             "an array": np.ones(2)}[kind]
    return lambda self, head_dim: value


def _array_seam(seam, kind, base):
    def bad(self, *args, **kw):
        return ARRAY_GARBAGE[kind](getattr(base, seam)(self, *args, **kw))
    return bad


def _bias_backward_garbage(kind, base):
    def bad(self, q_positions, k_positions, dbias):
        good = base.bias_backward(self, q_positions, k_positions, dbias)
        name = next(iter(good), "scheme.table")
        return {"a list": lambda: list(good.items()),
                "None": lambda: None,
                "wrong shape": lambda: {name: np.zeros((3, 7))},
                "unknown name": lambda: {"scheme.nosuch": np.zeros(1)},
                "NaN": lambda: {name: np.full(np.shape(good.get(name, 0.0)), np.nan)}}[kind]()
    return bad


def _extra_backward_garbage(kind, base):
    def bad(self, *args, **kw):
        dq, dk = base.extra_backward(self, *args, **kw)
        dq = np.broadcast_to(dq, args[0][..., args[4], :].shape)
        return {"not a pair": lambda: dq, "wrong length": lambda: (_longer(dq), dk),
                "NaN": lambda: (_with_nan(dq), dk), "a list": lambda: (dq.tolist(), dk)}[kind]()
    return bad


def _value_backward_garbage(kind, base):
    def bad(self, q_positions, k_positions, qs, ks, p, dout, add):
        dp = base.value_position_backward(self, q_positions, k_positions, qs, ks, p, dout, add)
        return {"wrong length": lambda: _longer(dp), "NaN": lambda: _with_nan(dp), "a list": lambda: dp.tolist()}[kind]()
    return bad


def _add_garbage(kind, base):
    def bad(self, dx, positions, add):
        if kind == "unknown name":
            add("scheme.nosuch", np.zeros(3))
        else:
            add("wq", np.zeros((1, 1)))
        return base.embed_backward(self, dx, positions, add)
    return bad


FORWARD = ("embed", "rotate_q", "rotate_k", "bias", "content_position", "value_position", "scale")
BACKWARD = ("embed_backward", "rotate_q_backward", "rotate_k_backward", "content_position_backward", "add",
            "bias_backward", "extra_backward", "value_position_backward")


def applicable_garbage(name: str) -> dict:
    """``seam -> garbage kinds`` for every seam the layer calls with the scheme ``name`` (a backward seam
    only where the scheme's forward makes the layer call it)."""
    seams = schemes.ENTRIES[name].cls.seams
    array_kinds = list(ARRAY_GARBAGE)
    out = {seam: array_kinds for seam in ("embed", "rotate_q", "rotate_k", "embed_backward", "rotate_q_backward",
                                          "rotate_k_backward", "content_position_backward")}
    out["bias"] = ["wrong length", "too many heads", "a list", "NaN", "+inf", "integers"]
    out["content_position"] = ["not a pair", "wrong length", "NaN query", "extra of the wrong length", "extra NaN",
                               "extra a list", "extra not callable"]
    out["value_position"] = ["not callable", "wrong width", "NaN", "a list"]
    out["scale"] = ["zero", "negative", "NaN", "inf", "a str", "an array"]
    out["add"] = ["unknown name", "wrong shape"]
    if "bias" in seams:
        learned = bool(make(name).scheme.parameters())                   # a shape to get wrong, a value to spoil
        out["bias_backward"] = ["a list", "None", "unknown name"] + (["wrong shape", "NaN"] if learned else [])
    if "content-position" in seams:
        out["extra_backward"] = ["not a pair", "wrong length", "NaN", "a list"]
    if "value" in seams:
        out["value_position_backward"] = ["wrong length", "NaN", "a list"]
    return out


def garbage_scheme(name: str, seam: str, kind: str):
    """An instance of the registered ``name`` (its ``example(LENGTH)``) whose seam ``seam`` returns the
    garbage ``kind`` instead of its value (a subclass named ``garbage-<name>``, not registered)."""
    base = schemes.ENTRIES[name].cls
    if seam in ("embed", "rotate_q", "rotate_k", "embed_backward", "rotate_q_backward", "rotate_k_backward",
                "content_position_backward"):
        method = _array_seam(seam, kind, base)
    else:
        method = {"bias": lambda: _bias_garbage(kind), "content_position": lambda: _content_position_garbage(kind, base),
                  "value_position": lambda: _value_garbage(kind), "scale": lambda: _scale_garbage(kind),
                  "bias_backward": lambda: _bias_backward_garbage(kind, base),
                  "extra_backward": lambda: _extra_backward_garbage(kind, base),
                  "value_position_backward": lambda: _value_backward_garbage(kind, base),
                  "add": lambda: _add_garbage(kind, base)}[seam]()
    attr = "embed_backward" if seam == "add" else seam
    method.__name__ = attr                                             # as a def in the subclass would name it
    cls = type(f"Garbage{base.__name__}", (base,), {attr: method, "name": f"garbage-{name}"})
    return cls(**schemes.ENTRIES[name].example(LENGTH))


PATHS = {
    "reference dense": dict(impl="reference"),
    "reference blockwise": dict(impl="reference", block_size=2),
    "reference bidirectional": dict(impl="reference", causal=False),
    "fast dense": dict(impl="fast"),
    "fast blockwise": dict(impl="fast", block_size=2),
    "fast bidirectional": dict(impl="fast", block_size=3, causal=False),
    "cached": dict(impl="reference", cached=True),
    "fast cached": dict(impl="fast", block_size=2, cached=True),
}


def paths_for(seam: str) -> list:
    """The paths a garbage ``seam`` is tried in: all of them (a backward seam: after each forward)."""
    return list(PATHS)


def run_path(scheme, path: str, *, backward: bool, batch: int = B, length: int = T, heads: int = HEADS,
             start: int = 0):
    """Run a layer with ``scheme`` along ``path`` (``PATHS``), and its backward when ``backward``."""
    spec = dict(PATHS[path])
    impl, cached, causal = spec.pop("impl"), spec.pop("cached", False), spec.pop("causal", True)
    layer = make(scheme, impl, d_model=4 * heads, heads=heads, **spec)
    x, dy = _inputs(seed=11, batch=batch, length=length, d_model=4 * heads)
    positions = start + np.arange(length)
    if cached:
        cache = layer.new_cache()
        split = length // 2                                            # a prefill, then the rest as a step
        if split:
            layer(x[:, :split], positions=positions[:split], causal=True, cache=cache)
        y, ctx = layer(x[:, split:], positions=positions[split:], causal=True, cache=cache, return_context=True)
        dy = dy[:, split:]
    else:
        y, ctx = layer(x, positions=positions, causal=causal, return_context=True)
    if backward:
        layer.backward(ctx, dy)
    return y


def expect_refused(name: str, seam: str, kind: str, path: str, **shape) -> None:
    """Garbage ``kind`` in ``seam`` of ``name`` along ``path``: a ``TypeError`` or ``ValueError`` whose
    message names the seam and the scheme."""
    scheme = garbage_scheme(name, seam, kind)
    with pytest.raises((TypeError, ValueError)) as err:
        run_path(scheme, path, backward=seam in BACKWARD, **shape)
    message = str(err.value)
    assert seam in message and f"garbage-{name}" in message, (seam, kind, path, message)
    if any(word in kind for word in ("length", "shape", "width", "heads")):
        assert "shape" in message, (seam, kind, path, message)          # the shape expected, and the one given
