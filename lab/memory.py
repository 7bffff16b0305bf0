"""Keep freed memory in the process: NumPy's temporaries of a training step are then reused, not
mapped afresh.

A step of the lab's model allocates and frees a few hundred arrays of 0.1-4 MiB. glibc's malloc
serves such sizes with ``mmap`` and returns them to the system on ``free``, so every step faults in
fresh zeroed pages; measured on a 2-core machine, that was about a third of a training step.
``keep_freed_memory()`` raises the ``mmap`` threshold to 32 MiB (glibc's largest) and the trim
threshold to 512 MiB, so those arrays come from the heap and freed pages are kept for the next
step. It changes no number, only where memory comes from; without glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

__all__ = ["keep_freed_memory"]

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3       # glibc's mallopt parameters (malloc.h)
_done = None


def keep_freed_memory(mmap_threshold: int = 32 << 20, trim_threshold: int = 512 << 20) -> bool:
    """Tune glibc's malloc for this process (once); True if it took effect."""
    global _done
    if _done is not None:
        return _done
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):                # not glibc (macOS, Windows, musl without mallopt)
        _done = False
        return _done
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    _done = bool(mallopt(M_MMAP_THRESHOLD, mmap_threshold)) and bool(mallopt(M_TRIM_THRESHOLD, trim_threshold))
    return _done
