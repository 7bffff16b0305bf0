"""One measurement in a fresh process, so that ``ru_maxrss`` is this measurement's peak alone.

``python -m benchmarks._worker KIND T H D BLOCK`` prints ``seconds peak_bytes``; KIND is
``layer`` (causal ALiBi through ``minipos.fast.MultiHeadAttention`` with ``block_size=BLOCK``, B=1,
float32), ``blockwise`` (``minipos.fast.attention.blockwise_attention``), ``backward`` (that forward, then
``blockwise_attention_backward``) or ``dense`` (the
reference ``attention`` with the causal mask) on random q, k, v, or ``baseline`` (the imports alone).
"""

from __future__ import annotations

import resource
import sys
import time

import numpy as np


def _peak_bytes() -> int:
    """This process's peak resident memory.

    Linux carries ``ru_maxrss`` across ``exec``, so a child of a large parent starts at the
    parent's size; ``VmHWM`` of ``/proc/self/status`` is the peak of this process alone. Without
    it, ``ru_maxrss`` (KiB on Linux).
    """
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def run(kind: str, T: int, H: int, D: int, block: int) -> tuple[float, int]:
    from minipos.attention import attention, causal_mask
    from minipos.fast import MultiHeadAttention
    from minipos.fast.attention import blockwise_attention, blockwise_attention_backward
    from minipos.layer import ALiBi

    rng = np.random.default_rng(0)
    if kind == "baseline":
        return 0.0, _peak_bytes()                                           # after the imports
    if kind == "layer":
        layer = MultiHeadAttention(H * D, H, scheme=ALiBi(), dtype=np.float32, block_size=block)
        x = rng.standard_normal((1, T, H * D), dtype=np.float32)
        run_once = lambda: layer(x, causal=True)                            # noqa: E731
    else:
        q, k, v = (rng.standard_normal((1, H, T, D), dtype=np.float32) for _ in range(3))
        if kind == "blockwise":
            run_once = lambda: blockwise_attention(q, k, v, causal=True, block_size=block)  # noqa: E731
        elif kind == "backward":
            def run_once():
                out, lse = blockwise_attention(q, k, v, causal=True, block_size=block, return_lse=True)
                blockwise_attention_backward(q, k, v, out, lse, out, causal=True, block_size=block)
        else:
            run_once = lambda: attention(q, k, v, mask=causal_mask(T, T))   # noqa: E731
    start = time.perf_counter()
    run_once()
    return time.perf_counter() - start, _peak_bytes()


if __name__ == "__main__":
    kind, *sizes = sys.argv[1:]
    seconds, peak = run(kind, *map(int, sizes))
    print(seconds, peak)
