"""What a scheme's seams return, checked by the layer: one place for every path.

``MultiHeadAttention`` (and ``minipos.fast.MultiHeadAttention``, which inherits the calls) passes
every value a scheme hands back through these functions: the input seam's ``x``, the rotated ``q``
and ``k``, the bias, the content-position seam's query and extra logits, the value seam's term,
the scale, every backward seam's gradient and the settings ``configuration()`` records, in the
dense, blockwise, non-causal, cached and fast paths alike. A value of the wrong type, shape or
dtype, or holding NaN or inf, raises ``TypeError`` or ``ValueError`` naming the seam, the scheme
and the shape expected, before it reaches attention.
The checks never change a value: a value that passes is returned as it came.
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping

import numpy as np

__all__ = ["seam_name", "check_like", "check_bias", "check_content_position", "checked_extra", "checked_value",
           "check_scale", "check_grads", "check_pair", "checked_add", "check_settings"]


def seam_name(scheme, seam: str) -> str:
    """``"ALiBi.bias (scheme 'alibi')"``: how an error names the seam ``seam`` of ``scheme``."""
    return f"{type(scheme).__name__}.{seam} (scheme {getattr(scheme, 'name', '?')!r})"


def _array(value, who: str, letters: str, shape) -> np.ndarray:
    """``value`` if it is a floating NumPy array, else ``TypeError`` naming ``who``."""
    want = f"a floating NumPy array of shape {letters} = {tuple(shape)}"
    if not isinstance(value, np.ndarray):
        hint = " (convert it with numpy.asarray)" if isinstance(value, (list, tuple)) else ""
        raise TypeError(f"{who} must return {want}, got {type(value).__name__}{hint}")
    if value.dtype.kind != "f":
        raise TypeError(f"{who} must return {want}, got dtype {value.dtype}")
    return value


def _finite(value: np.ndarray, who: str, *, allow_neginf: bool = False) -> np.ndarray:
    """``value`` unless it holds NaN or inf (``-inf`` allowed with ``allow_neginf``: a masked logit)."""
    bad = np.isnan(value) | (np.isposinf(value) if allow_neginf else np.isinf(value))
    if bad.any():
        what = "NaN or +inf" if allow_neginf else "NaN or inf"
        raise ValueError(f"{who} returned {int(bad.sum())} {what} value(s); a seam must return finite values"
                         + (" (-inf masks a key)" if allow_neginf else ""))
    return value


def check_like(value, scheme, seam: str, like: np.ndarray, letters: str) -> np.ndarray:
    """``value`` as a seam must return it in place of ``like``: a finite array of ``like``'s shape and dtype
    (the input seam's ``x``, the rotated ``q`` and ``k``, an input's gradient)."""
    who = seam_name(scheme, seam)
    value = _array(value, who, letters, like.shape)
    if value.shape != like.shape:
        raise ValueError(f"{who} must return shape {letters} = {like.shape}, got {value.shape}")
    if value.dtype != like.dtype:
        raise TypeError(f"{who} must return the dtype of its input, {like.dtype}, got {value.dtype}")
    return _finite(value, who)


def _broadcasts(shape, target) -> bool:
    """Whether ``shape`` broadcasts to ``target`` without enlarging it."""
    try:
        return len(shape) <= len(target) and np.broadcast_shapes(shape, target) == tuple(target)
    except ValueError:
        return False


def check_bias(value, scheme, target: tuple):
    """The bias seam's block: ``None``, or a floating array broadcasting to ``target`` = ``(H, tq, tk)``
    without enlarging it, free of NaN and ``+inf`` (``-inf`` masks a key)."""
    if value is None:
        return None
    who = seam_name(scheme, "bias(q_positions, k_positions)")
    value = _array(value, who, "(H, T, S)", target)
    if not _broadcasts(value.shape, target):
        raise ValueError(f"{who} must return None or shape (H, T, S) = {tuple(target)} (or one broadcasting to "
                         f"it), got {value.shape}")
    return _finite(value, who, allow_neginf=True)


def check_content_position(result, scheme, q: np.ndarray):
    """The content-position seam's ``(q_c, extra)``: ``q_c`` finite, of ``q``'s shape and dtype;
    ``extra`` ``None`` or a callable, wrapped by ``checked_extra``."""
    who = seam_name(scheme, "content_position(q, k, q_positions, k_positions)")
    if not isinstance(result, tuple) or len(result) != 2:
        raise TypeError(f"{who} must return a pair (the query used against content (B, H, T, D), extra logits "
                        f"function or None), got {type(result).__name__}")
    q_c, extra = result
    q_c = check_like(q_c, scheme, "content_position(...)[0] (the query used against content)", q, "(B, H, T, D)")
    return q_c, checked_extra(extra, scheme, q.shape[:2])


def checked_extra(extra, scheme, lead: tuple):
    """``extra(qs, ks)`` whose every block is checked: a finite floating array broadcasting to
    ``(*lead, tq, tk)`` = ``(B, H, tq, tk)``; ``None`` stays ``None``."""
    if extra is None:
        return None
    if not callable(extra):
        raise TypeError(f"{seam_name(scheme, 'content_position')} must return extra logits as a function "
                        f"extra(q_slice, k_slice) or None, got {type(extra).__name__}")

    def checked(qs, ks):
        target = (*lead, qs.stop - qs.start, ks.stop - ks.start)
        who = seam_name(scheme, f"content_position's extra(slice({qs.start}, {qs.stop}), slice({ks.start}, {ks.stop}))")
        block = _array(extra(qs, ks), who, "(B, H, tq, tk)", target)
        if not _broadcasts(block.shape, target):
            raise ValueError(f"{who} must return shape (B, H, tq, tk) = {target} (or one broadcasting to it), "
                             f"got {block.shape}")
        return _finite(block, who)
    return checked


def checked_value(value, scheme, lead: tuple, dv: int, *, grad=None):
    """The value seam's ``value(qs, ks, p)``, each term checked: a finite floating array of shape
    ``(*lead, tq, Dv)``; ``None`` stays ``None``. With ``grad`` (``value_position_backward`` of the
    same call, bound), also returns its checked backward: ``dp`` of the block's weights' shape."""
    if value is None:
        return (None, None) if grad is not None else None
    if not callable(value):
        raise TypeError(f"{seam_name(scheme, 'value_position')} must return a function value(q_slice, k_slice, p) "
                        f"or None, got {type(value).__name__}")

    def term(qs, ks, p):
        shape = (*lead, qs.stop - qs.start, dv)
        who = seam_name(scheme, f"value_position's value(slice({qs.start}, {qs.stop}), slice({ks.start}, {ks.stop}), p)")
        got = _array(value(qs, ks, p), who, "(B, H, tq, Dv)", shape)
        if got.shape != shape:
            raise ValueError(f"{who} must return shape (B, H, tq, Dv) = {shape}, got {got.shape}")
        return _finite(got, who)
    if grad is None:
        return term

    def term_grad(qs, ks, p, dout):
        who = seam_name(scheme, f"value_position_backward (block slice({qs.start}, {qs.stop}), "
                                f"slice({ks.start}, {ks.stop}))")
        got = _array(grad(qs, ks, p, dout), who, "(B, H, tq, tk)", p.shape)
        if got.shape != p.shape:
            raise ValueError(f"{who} must return the weights' block shape (B, H, tq, tk) = {p.shape}, got {got.shape}")
        return _finite(got, who)
    return term, term_grad


def check_scale(value, scheme, head_dim: int) -> float:
    """The scheme's ``scale(head_dim)``: a finite real number > 0, as a Python float."""
    who = seam_name(scheme, f"scale({head_dim})")
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real):
        raise TypeError(f"{who} must return a positive real number (the factor of q . k), got "
                        f"{type(value).__name__} {value!r}")
    value = float(value)
    if not (np.isfinite(value) and value > 0):
        raise ValueError(f"{who} must return a finite number > 0 (the factor of q . k), got {value}")
    return value


def check_grads(value, scheme, seam: str, shapes: Mapping) -> dict:
    """A backward seam's ``{"scheme.<name>": gradient}``: a dict whose every key is a learned parameter of
    the scheme (``shapes``: name -> shape) and whose every value is a finite array of that shape."""
    who = seam_name(scheme, seam)
    if not isinstance(value, Mapping):
        raise TypeError(f"{who} must return a dict {{'scheme.<parameter>': gradient}} ({{}} for none), got "
                        f"{type(value).__name__}")
    for name, grad in value.items():
        _grad(grad, scheme, seam, name, shapes)
    return dict(value)


def _grad(grad, scheme, seam: str, name, shapes: Mapping) -> np.ndarray:
    """One parameter gradient handed back by ``seam``: a known ``name``, a finite array of its shape."""
    who = seam_name(scheme, seam)
    if name not in shapes:
        raise ValueError(f"{who} gave a gradient for {name!r}, which is not a learned parameter here; "
                         + (f"they are {', '.join(sorted(shapes))}" if shapes else "there is none"))
    grad = _array(grad, f"{who} (the gradient of {name})", "the parameter's", shapes[name])
    if grad.shape != tuple(shapes[name]):
        raise ValueError(f"{who} gave the gradient of {name} the shape {grad.shape}; {name} has shape "
                         f"{tuple(shapes[name])}")
    return _finite(grad, f"{who} (the gradient of {name})")


def check_pair(value, scheme, seam: str, dq_shape: tuple, dk_shape: tuple):
    """``extra_backward``'s ``(dq, dk)`` of a block: each a finite floating array broadcasting to its
    shape, or a real number (``0.0``: the extra logits do not depend on it)."""
    who = seam_name(scheme, seam)
    if not isinstance(value, tuple) or len(value) != 2:
        raise TypeError(f"{who} must return a pair (dq (B, H, tq, D), dk (B, H, tk, D)), got {type(value).__name__}")
    out = []
    for part, shape, letters in ((value[0], dq_shape, "(B, H, tq, D)"), (value[1], dk_shape, "(B, H, tk, D)")):
        if isinstance(part, numbers.Real) and not isinstance(part, (bool, np.bool_)):
            if not np.isfinite(part):                                    # a constant (0.0: no dependence)
                raise ValueError(f"{who} returned {part} for {letters}; a seam must return finite values")
            out.append(part)
            continue
        part = _array(part, who, letters, shape)
        if not _broadcasts(part.shape, shape):
            raise ValueError(f"{who} must return shape {letters} = {tuple(shape)} (or a number), got shape {part.shape}")
        out.append(_finite(part, who))
    return tuple(out)


def _plain(value) -> bool:
    """Whether ``value`` is a plain setting: ``None``, a bool, a number, a string, or a tuple of them."""
    if isinstance(value, tuple):
        return all(_plain(v) for v in value)
    return value is None or isinstance(value, (bool, np.bool_, numbers.Number, str))


def check_settings(value, scheme) -> tuple:
    """The scheme's ``settings()`` as the layer's ``configuration()`` records them: ``("scheme.<name>",
    value)`` pairs, each name a distinct string and each value plain (``_plain``: compared by ``==``)."""
    who = seam_name(scheme, "settings()")
    want = "a tuple of (name, value) pairs, each value None, a bool, a number, a string or a tuple of them"
    if not isinstance(value, tuple) or not all(isinstance(p, tuple) and len(p) == 2 for p in value):
        raise TypeError(f"{who} must return {want}, got {value!r:.200}")
    for name, setting in value:
        if not isinstance(name, str) or not _plain(setting):
            raise TypeError(f"{who} must return {want}; got {name!r}: {type(setting).__name__} {setting!r:.100}")
    names = [name for name, _ in value]
    if len(set(names)) != len(names):
        raise ValueError(f"{who} names a setting twice: {names}")
    return tuple((f"scheme.{name}", setting) for name, setting in value)


def checked_add(add, scheme, shapes: Mapping):
    """``add(name, grad)`` for a scheme's backward seams: each gradient checked against ``shapes``
    (every learned parameter of the layer and its scheme, by the names ``backward`` returns)."""
    def checked(name, grad):
        add(name, _grad(grad, scheme, "backward's add(name, grad)", name, shapes))
    return checked
