"""The layer's backward against central finite differences: shared by the layer and model tests."""

import numpy as np

WEIGHTS = ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "sinks")


def layer_parameters(layer) -> dict:
    """Every learned array of a ``MultiHeadAttention``, by the names ``layer.backward`` returns."""
    params = {name: getattr(layer, name) for name in WEIGHTS if getattr(layer, name, None) is not None}
    params.update({f"scheme.{name}": a for name, a in layer.scheme.parameters().items()})
    return params


def check_layer_gradients(layer, x, dy, call, rng, *, rtol=1e-6, params=None):
    """Each gradient of ``layer.backward`` against the central difference along a random direction.

    ``call(x, **kw)`` runs the layer's forward (with ``return_context=True`` passed through); the
    parameters are perturbed in place and restored. h = 1e-6 in float64: truncation h^2 |f'''| / 6
    ~ 1e-12 and rounding ~ 1e-16 / h = 1e-10 for outputs of order 1, far below ``rtol``.
    """
    _, ctx = call(x, return_context=True)
    grads = layer.backward(ctx, dy)
    params = layer_parameters(layer) if params is None else params
    assert set(grads) == {"x", *params}, sorted(set(grads) ^ {"x", *params})
    h = 1e-6
    for name in ["x", *params]:
        e = rng.standard_normal(x.shape if name == "x" else params[name].shape)
        if name == "x":
            plus, minus = call(x + h * e), call(x - h * e)
        else:
            a = params[name]
            saved = a.copy()
            a[...] = saved + h * e
            plus = call(x)
            a[...] = saved - h * e
            minus = call(x)
            a[...] = saved
        fd = float(np.sum((plus - minus) * dy)) / (2 * h)
        got = float(np.sum(grads[name] * e))
        assert abs(got - fd) <= rtol * max(1.0, abs(fd)), (name, got, fd)
        assert grads[name].shape == (x.shape if name == "x" else params[name].shape), name


def after_a_cache(layer, past):
    """``call(x, **kw)``: the layer on ``x`` (causal) after the keys and values of ``past``, held
    fixed: every call starts from a fresh cache holding a copy of them, so the finite differences
    perturb this call only (the cached keys and values are constants of its gradient)."""
    cache = layer.new_cache()
    layer(past, causal=True, cache=cache)
    k, v, pos = cache.k.copy(), cache.v.copy(), cache.positions.copy()

    def call(x, **kw):
        fresh = layer.new_cache()
        fresh.append(k, v, pos, tag=cache.tag)
        return layer(x, causal=True, cache=fresh, **kw)
    return call
