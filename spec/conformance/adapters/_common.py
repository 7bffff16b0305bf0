"""What every adapter shares: the component record, "not expressible", layouts and measurements.

An adapter module names its library (``LIBRARY``), the distributions whose versions a result
records (``DISTRIBUTIONS``), and lists ``COMPONENTS``: one ``Component`` per (library module,
golden-vector family). A component's ``run(inputs, params)`` takes a case as
``spec/check_port.py`` passes it (the input arrays decoded to NumPy, the params as JSON values) and
returns the family's outputs as the library computes them, or raises ``NotExpressible`` with the
reason when the library has no way to state the case. ``PROBES`` are the minimal inputs behind
each discrepancy that the conformance page explains: each returns what the library does on them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np


class NotExpressible(NotImplementedError):
    """The library cannot state this case (``check_port.py`` skips a ``NotImplementedError`` too)."""


@dataclass
class Component:
    """One library module run over one family, in float64 or float32 (whose tolerance is used)."""

    name: str            # the library's own name for it, e.g. "LlamaRotaryEmbedding"
    family: str          # the golden-vector family
    run: Callable        # (inputs: dict, params: dict) -> {output: array}
    precision: str = "float64"
    conventions: list = field(default_factory=list)   # one sentence each, shown on the page


def require(condition: bool, reason: str) -> None:
    """Raise ``NotExpressible(reason)`` unless ``condition``."""
    if not condition:
        raise NotExpressible(reason)


def nonnegative(positions, what: str = "the library indexes a table of positions 0, 1, ...") -> None:
    """Negative positions are not expressible where the library has none."""
    require(bool(np.all(np.asarray(positions) >= 0)), f"negative position ({what})")


def contiguous_from_zero(positions) -> bool:
    return bool(np.array_equal(positions, np.arange(len(positions))))


def pairs(layout: str, R: int) -> tuple[np.ndarray, np.ndarray]:
    """The two feature indices of each of the R/2 rotated pairs in ``layout``."""
    i = np.arange(R // 2)
    return (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + R // 2)


def layout_permutation(case_layout: str, library_layout: str, R: int, D: int) -> np.ndarray:
    """``p`` such that ``x[..., p]`` puts the case's pairs where the library pairs features.

    Features ``R ... D-1`` (passed through) keep their place. Rotating ``x[..., p]`` with the
    library and writing the result back at ``p`` is the case's rotation in its own layout.
    """
    p = np.arange(D)
    (la, lb), (ca, cb) = pairs(library_layout, R), pairs(case_layout, R)
    p[la], p[lb] = ca, cb
    return p


def in_layout(fn, x, case_layout: str, library_layout: str, R: int):
    """``fn`` (a rotation in ``library_layout``) applied to ``x`` as the case's layout means it.

    Indexing only, so it works on NumPy arrays and on tensors under autograd alike.
    """
    p = layout_permutation(case_layout, library_layout, R, x.shape[-1])
    return fn(x[..., p])[..., np.argsort(p)]


def angles_and_factor(rotate, R: int, layout: str):
    """(inv_freq (R/2,), attention_factor) read off a rotation's output, not its internals.

    ``rotate(x, positions)`` applies the library's RoPE to ``x`` of shape ``(T, R)``. With ``x`` the
    first feature of every pair set to 1, row 0 (position 0) is ``factor * x``, and row 1
    (position 1) holds ``factor * (cos w_i, sin w_i)`` in pair i, so ``w_i = atan2(sin, cos)``
    (every ``w_i`` is below pi).
    """
    a, b = pairs(layout, R)
    x = np.zeros((2, R))
    x[:, a] = 1.0
    y = np.asarray(rotate(x, np.array([0, 1])), dtype=np.float64)
    factor = y[0, a].mean()
    inv_freq = np.arctan2(y[1, b], y[1, a])
    return inv_freq, np.float64(factor)


def torch_vjp(fn, x: np.ndarray, dy: np.ndarray, dtype=None) -> np.ndarray:
    """The gradient of ``sum(fn(x) * dy)`` with respect to ``x``, by torch autograd (``fn`` maps tensors)."""
    import torch

    t = torch.tensor(x, dtype=dtype or torch.float64, requires_grad=True)
    out = fn(t)
    out.backward(torch.as_tensor(dy, dtype=out.dtype))
    return t.grad.double().numpy()


def tensor(a, dtype=None):
    """A torch tensor of a NumPy array (contiguous, as torch needs)."""
    import torch
    return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)


def lead_summed(dbias):
    """``dbias`` ``(..., H, T, S)`` as a tensor with any leading batch axes summed out."""
    lead = tuple(range(dbias.ndim - 3))
    return tensor(dbias).sum(dim=lead) if lead else tensor(dbias)


def table_layout(table: np.ndarray, native: str, wanted: str) -> np.ndarray:
    """A ``(T, D)`` sinusoidal table from ``native`` to ``wanted`` layout (``split`` <-> ``interleaved``).

    The two hold the same numbers: split is ``[sin ... | cos ...]``, interleaved ``sin, cos, ...``.
    """
    if native == wanted:
        return table
    D = table.shape[-1]
    if native == "interleaved":
        return np.concatenate([table[:, 0::2], table[:, 1::2]], axis=1)
    out = np.empty_like(table)
    out[:, 0::2], out[:, 1::2] = table[:, :D // 2], table[:, D // 2:]
    return out


def rope_family(rotate, native: str, grad: bool = False):
    """A ``rope`` (or ``rope_grad``) runner from ``rotate(x, positions, params, inv_freq)`` in ``native`` layout.

    ``rotate`` maps a float64 tensor ``(..., T, D)``; the case's other layout is stated by
    permuting each pair's features (``in_layout``). A rotation is linear, so its backward is the
    vector-Jacobian product at any point: ``rope_grad`` is torch autograd through ``rotate``.
    """
    def run(inputs, params):
        import torch
        x = inputs["dy" if grad else "x"]
        R = params["rotary_dim"] or x.shape[-1]
        fn = lambda t: in_layout(lambda u: rotate(u, inputs["positions"], params, inputs.get("inv_freq")), t,
                                 params["layout"], native, R)
        if grad:
            return {"dx": torch_vjp(fn, np.zeros_like(x), x)}
        return {"out": fn(tensor(x, torch.float64)).double().numpy()}
    return run


def mask_of_positions(k_positions) -> np.ndarray:
    """An attention mask whose ``(cumsum(mask) - 1) * mask`` is ``k_positions`` (BLOOM's and Falcon's key positions).

    A key at position 0 that is not the first counted token is padding (mask 0). Positions no
    mask gives (a jump, as ``0 1 2 1000``) are not expressible: those builders read a mask only.
    """
    k = np.asarray(k_positions)
    mask, count = np.zeros(len(k), dtype=np.int64), 0
    for s, p in enumerate(k):
        if p == count:
            mask[s], count = 1, count + 1
    require(np.array_equal((np.cumsum(mask) - 1) * mask, k),
            "the key positions are (cumsum(attention_mask) - 1) * attention_mask: no mask gives these")
    return mask


def cached_step(inputs) -> tuple[int, int]:
    """``(T, S)`` of a ``rope_scores``/``xpos_scores`` case, or not expressible.

    A library's cached path numbers the keys ``0 ... S-1`` and the queries ``S - T ... S - 1``.
    """
    q, k = inputs["q_positions"], inputs["k_positions"]
    T, S = len(q), len(k)
    require(contiguous_from_zero(k) and np.array_equal(q, np.arange(S - T, S)),
            "the cached path numbers keys 0 ... S-1 and queries S-T ... S-1")
    return T, S


def scores_family(rotate_qk, native: str):
    """A ``rope_scores`` runner from ``rotate_qk(q, k, inputs, params) -> (q', k')`` in ``native`` layout.

    ``q``, ``k`` are float64 tensors ``(H, T, D)``, ``(H, S, D)``. The case's other layout is
    stated by the same permutation of the features of q and of k, which leaves every dot product
    as it is: the scores are ``q' k'^T`` of the library's rotated q and k, unscaled.
    """
    def run(inputs, params):
        import torch
        cached_step(inputs)
        q, k = inputs["q"], inputs["k"]
        R = params.get("rotary_dim") or q.shape[-1]
        p = layout_permutation(params.get("layout", native), native, R, q.shape[-1])
        qr, kr = rotate_qk(tensor(q[..., p], torch.float64), tensor(k[..., p], torch.float64), inputs, params)
        return {"scores": (qr @ kr.transpose(-1, -2)).double().numpy()}
    return run
