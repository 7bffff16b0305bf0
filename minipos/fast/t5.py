"""T5's bias, fast: each distinct distance bucketed once, the Toeplitz result copied by windows.

For positions ``q``, ``k`` the bias depends on ``k_s - q_t`` only, so the ``span`` distinct
distances (``T + S - 1`` for runs of consecutive positions) are bucketed once and looked up; for
runs the result is Toeplitz in (t, s), and row t is a window of the per-distance values, so it is
copied without an index array (by several threads when large). Equal to ``minipos.t5.t5_bias``
bit for bit.
"""

from __future__ import annotations

import numpy as np

from .. import t5 as reference
from .._checks import as_positions, check_alloc
from . import _threads
from ._runs import is_run

__all__ = ["t5_bias"]


def t5_bias(table, q_positions, k_positions, *, bidirectional: bool = True, num_buckets: int = 32,
            max_distance: int = 128, exact: bool = False) -> np.ndarray:
    """``minipos.t5.t5_bias``, computed per distinct distance (same arguments, result ``(H, T, S)``)."""
    reference.check_bucket_config(bidirectional, num_buckets, max_distance)
    table = reference.check_table(table, num_buckets)
    q = as_positions(q_positions, "q_positions")
    k = as_positions(k_positions, "k_positions")
    config = dict(bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance, exact=exact)
    if q.size == 0 or k.size == 0:
        return reference.t5_bias(table, q, k, **config)
    check_alloc((table.shape[1], q.size, k.size), table.dtype, "t5_bias(table, q_positions, k_positions)")
    lowest = int(k.min()) - int(q.max())
    span = int(k.max()) - int(q.min()) - lowest + 1                    # number of candidate distances
    if span > q.size * k.size:                                          # sparse positions: no saving
        return reference.t5_bias(table, q, k, **config)
    distances = np.arange(lowest, lowest + span)                        # (span,)
    per_distance = table[reference.relative_position_bucket(distances, **config)].T   # (H, span)
    if is_run(q) and is_run(k):                                         # Toeplitz: copy windows
        return _toeplitz(np.ascontiguousarray(per_distance), q.size, k.size)
    return per_distance[:, k[None, :] - q[:, None] - lowest]            # (H, T, S)


def _toeplitz(per_distance: np.ndarray, T: int, S: int) -> np.ndarray:
    """``out[h, t, s] = per_distance[h, s - t + T - 1]``, ``(H, T, S)``, one contiguous copy.

    Row t is the window of S distances starting at ``T - 1 - t``: the sliding windows of
    ``per_distance`` in reverse order, a view copied once (on several threads when large).
    """
    windows = np.lib.stride_tricks.sliding_window_view(per_distance, S, axis=-1)  # (H, span-S+1, S)
    return _threads.copy(windows[:, T - 1::-1, :])                       # (H, T, S)
