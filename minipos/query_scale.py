"""The position-dependent query scale of ``llama_4_scaling_beta`` (Ministral 3, Mistral 4), on top of RoPE.

Source: transformers 5.24, ``models/ministral3/modeling_ministral3.py`` (``get_llama_4_attn_scale``, called
by ``Ministral3Attention.forward``) and ``models/mistral4/modeling_mistral4.py`` (the same function, after
MLA's rotation). With ``beta = rope_parameters["llama_4_scaling_beta"]`` and
``L = rope_parameters["original_max_position_embeddings"]`` (the pre-training length, not
``max_position_embeddings``), the query at position ``p`` is multiplied, after RoPE, by

    s(p) = 1 + beta * ln(1 + floor(p / L))

so every logit of that query's row is scaled by ``s(p)``; keys are not scaled. ``s = 1`` for
``p < L``, ``1 + beta ln 2`` for ``L <= p < 2L``, and so on: the logits sharpen in steps like
``beta ln(p / L)`` past the training length, the growth Scalable-Softmax (Nakanishi 2025,
arXiv:2501.19399) asks for. ``s(p)`` is one number per row, so it commutes with RoPE (a linear map of
each query): scaling before or after the rotation is the same.

Beside Llama 4's temperature (``minipos.irope.attn_temperature``,
``1 + attn_scale ln(1 + floor((i + 1) / floor_scale))``): the same shape, but Llama 4 counts
``i + 1`` and scales its NoPE layers only, while this counts ``p`` (HF's ``position_ids``) and scales
every RoPE layer. The two differ at the step: ``p = L - 1`` is scaled by Llama 4's rule, not by
this one.

Precision: HF computes ``s`` in float32 (``position_ids / L`` of an integer tensor); minipos takes the
floor in exact integer arithmetic (``p // L``) and the rest in float64. The two agree to float32
rounding (a relative 1e-7) for every position below 2^24.

Conventions: positions ``(T,)`` integers >= 0 (a cached step's queries start at the cache length);
q ``(..., T, D)``. ``QueryScaleMixin`` (the query scale on top of any RoPE scheme) and
``ScaledQueryRotary`` (the scheme the layer runs: ``Rotary`` whose queries are then scaled) are at the
bottom.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ._checks import as_float_array, as_positions, check_float, check_overflow, check_positive_int
from .rope_scaling import Rotary

__all__ = ["llama4_query_scale", "apply_query_scale", "apply_query_scale_backward", "QueryScaleMixin",
           "ScaledQueryRotary"]


def llama4_query_scale(positions: ArrayLike, *, beta: float, original_max_position_embeddings: int) -> np.ndarray:
    """``s(p) = 1 + beta * ln(1 + floor(p / L))`` for each position, float64 ``(T,)``.

    positions: ``(T,)`` integers >= 0 or an int T meaning ``arange(T)``. beta: >= 0 (0 gives s = 1).
    original_max_position_embeddings: L, an integer >= 1.
    """
    pos = as_positions(positions, "positions")
    beta = check_float(beta, "beta", minimum=0.0)
    L = check_positive_int(original_max_position_embeddings, "original_max_position_embeddings")
    big = L > np.iinfo(np.int64).max                                         # past every int64 position
    steps = (0 * pos if big else pos // L).astype(np.float64)                # floor(p / L), exact
    return 1.0 + beta * np.log1p(steps)                                      # (T,)


def _scaled(x, name, positions, beta, original_max_position_embeddings, what):
    x = as_float_array(x, name)
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape (..., T, D), got {x.shape}")
    s = llama4_query_scale(positions, beta=beta, original_max_position_embeddings=original_max_position_embeddings)
    if s.shape[0] != x.shape[-2]:
        raise ValueError(f"{name} must have T = {s.shape[0]} rows (one per position) in (..., T, D), got shape {x.shape}")
    with np.errstate(over="ignore", invalid="ignore"):                       # checked just below
        out = x * s[:, None].astype(x.dtype)                                 # (..., T, D)
    return check_overflow(out, what, f"{name} or beta")


def apply_query_scale(q: ArrayLike, positions: ArrayLike, *, beta: float,
                      original_max_position_embeddings: int) -> np.ndarray:
    """The queries ``q`` ``(..., T, D)`` scaled row by row, ``q_p * s(p)``, in q's floating dtype."""
    return _scaled(q, "q", positions, beta, original_max_position_embeddings, "the scaled queries q * s(p)")


def apply_query_scale_backward(dy: ArrayLike, positions: ArrayLike, *, beta: float,
                               original_max_position_embeddings: int) -> np.ndarray:
    """The gradient of ``apply_query_scale`` for ``dy`` ``(..., T, D)``: the map is diagonal, ``dq_p = s(p) dy_p``."""
    return _scaled(dy, "dy", positions, beta, original_max_position_embeddings, "the gradient of q, s(p) * dy")


class QueryScaleMixin:
    """The query scale ``s(p)`` on top of a RoPE scheme (a ``Rotary`` subclass): the rotated query at
    position p is multiplied by ``s(p)``, the keys are the scheme's own.

    Put it first among the bases (``class Scaled(QueryScaleMixin, SomeRotary)``) and let the class's
    ``__init__`` pass ``beta`` and ``original_max_position_embeddings`` to it with the scheme's own
    arguments; ``rotate_q`` and ``rotate_q_backward`` wrap the scheme's (``s(p) R(p) q`` and
    ``R(p)^T s(p) dq``), ``settings()`` adds beta and L, and ``repr`` shows them. ``ScaledQueryRotary``
    and MLA's ``ScaledDecoupledRotary`` are this mixin on ``Rotary`` and ``DecoupledRotary``.
    """

    def __init__(self, *, beta: float, original_max_position_embeddings: int, **scheme_arguments):
        super().__init__(**scheme_arguments)
        self.beta = check_float(beta, "beta", minimum=0.0)
        self.original_max_position_embeddings = check_positive_int(original_max_position_embeddings,
                                                                   "original_max_position_embeddings")

    def _kw(self):
        return dict(beta=self.beta, original_max_position_embeddings=self.original_max_position_embeddings)

    def rotate_q(self, q, positions, *, seq_len):  # s(p) R(p) q
        return apply_query_scale(super().rotate_q(q, positions, seq_len=seq_len), positions, **self._kw())

    def rotate_q_backward(self, dq, positions, *, seq_len):  # R(p)^T s(p) dq
        return super().rotate_q_backward(apply_query_scale_backward(dq, positions, **self._kw()), positions,
                                         seq_len=seq_len)

    def settings(self):
        return (*super().settings(), ("beta", self.beta),
                ("original_max_position_embeddings", self.original_max_position_embeddings))

    def __repr__(self) -> str:
        kind = f", scaling={self.scaling_kind!r}" if self.scaling_kind else ""
        return (f"{type(self).__name__}(layout={self.layout!r}{kind}, beta={self.beta:g}, "
                f"original_max_position_embeddings={self.original_max_position_embeddings})")


class ScaledQueryRotary(QueryScaleMixin, Rotary):
    """RoPE whose rotated query at position p is then multiplied by ``1 + beta ln(1 + floor(p / L))``.

    ``Rotary`` with every argument the same, then ``apply_query_scale`` on the queries: transformers'
    ``llama_4_scaling_beta`` (Ministral 3, Mistral 4).

    beta: ``rope_parameters['llama_4_scaling_beta']``; original_max_position_embeddings: L, the
    divisor of the position (HF reads ``rope_parameters['original_max_position_embeddings']``); the
    defaults are Ministral 3's, 0.1 and 16384.
    base, layout, rotary_dim, scaling: as ``Rotary``'s (Ministral 3: ``layout="half"``, its YaRN
    ``rope_parameters`` as ``scaling``). Keys are rotated as by ``Rotary``; the query scale is fixed, not
    learned (``QueryScaleMixin``).
    """

    name = "query-scale"
    sign_convention = ((r"as RoPE, times the query's own scale: $s(i)\, q^\top R(j - i)\, k$, "
                        r"$s(i) = 1 + \beta \ln(1 + \lfloor i / L \rfloor)$"),
                       r"transformers `get_llama_4_attn_scale` (Ministral 3, Mistral 4)")

    def __init__(self, *, beta: float = 0.1, original_max_position_embeddings: int = 16384, base: float = 10000.0,
                 layout: str = "interleaved", rotary_dim: int | None = None, scaling: dict | None = None):
        super().__init__(beta=beta, original_max_position_embeddings=original_max_position_embeddings, base=base,
                         layout=layout, rotary_dim=rotary_dim, scaling=scaling)
