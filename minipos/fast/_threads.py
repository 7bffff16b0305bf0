"""Worker threads for ``blockwise_attention``, with OpenBLAS's own threads paused while they run.

NumPy releases the GIL inside ufunc loops and matrix products, so independent blocks of
attention can run on several cores from Python threads. Two things decide whether that pays:

- The matrix products of one block are small (``block x D`` by ``D x block``), and a threaded
  BLAS called from two threads at once contends for its own worker threads: measured on a
  2-core machine, two Python threads each calling a 2-thread OpenBLAS ran no faster than one.
  So the worker threads run only while the BLAS is told to use one thread, which is possible
  where it is OpenBLAS (NumPy's wheels bundle it) through ``openblas_set_num_threads``. The
  setting is process-wide: it is lowered for the duration of the parallel section and restored
  after, under a lock, so nested or concurrent calls restore the value they found; a count that
  another thread set meanwhile (anything but 1) is left as it is. What cannot be helped: a
  ``threadpoolctl.threadpool_limits`` context that another thread enters during the section
  records the lowered count as the one to restore, so it restores 1 when it exits after the
  section. Measured here, a second Python thread calling a 2-thread OpenBLAS (no pause) made the
  kernel about 20 times slower on a loaded 2-core machine, which is why the pause stays; a process
  that changes BLAS threads from several threads sets ``MINIPOS_NUM_THREADS=1`` (no pause, one
  worker).
- Elsewhere (MKL, Accelerate, a BLAS that cannot be found) the default is one worker, and the
  BLAS keeps its own threading. ``workers=N`` asks for N threads regardless.

``MINIPOS_NUM_THREADS`` caps the default number of workers (``1`` turns threading off). ``copy``
shares a large copy among threads the same way (no BLAS involved, so on any platform), and
``matmul`` a large product's rows (the BLAS paused). ``one_blas_thread`` holds the BLAS at one
thread for a caller that runs its own threads or processes beside it (the lab's shards).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import numpy as np

from .._checks import check_positive_int

__all__ = ["cores", "default_workers", "copy", "matmul", "run", "one_blas_thread"]


def cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:                                    # not Linux
        return os.cpu_count() or 1


def _find_openblas():
    """``(get, set)`` of the OpenBLAS loaded in this process, or ``None``.

    NumPy's wheels load ``libscipy_openblas*`` (symbols prefixed ``scipy_openblas_`` and
    suffixed ``64_`` for 64-bit ints); a system NumPy may load ``libopenblas``. Found from the
    process's memory map (Linux only).
    """
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "openblas" in line.lower() and "/" in line}
    except OSError:
        return None
    for path in sorted(paths, key=lambda p: ("numpy" not in p, p)):        # NumPy's own first
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        for prefix, suffix in (("scipy_openblas_", "64_"), ("scipy_openblas_", ""), ("openblas_", "")):
            get = getattr(lib, f"{prefix}get_num_threads{suffix}", None)
            set_ = getattr(lib, f"{prefix}set_num_threads{suffix}", None)
            if get is not None and set_ is not None:
                get.restype, set_.restype, set_.argtypes = ctypes.c_int, None, [ctypes.c_int]
                return get, set_
    return None


_blas = None
_blas_found = False
_lock = threading.Lock()
_active = 0                 # parallel sections running now
_saved = None               # the BLAS thread count they found
_pools = {}                 # one pool per worker count
_PREFIX = "minipos-blockwise"


def _openblas():
    global _blas, _blas_found
    if not _blas_found:
        _blas, _blas_found = _find_openblas(), True
    return _blas


def default_workers() -> int:
    """Workers used when ``workers`` is not given: the cores (capped by ``MINIPOS_NUM_THREADS``),
    or 1 when the BLAS's own threads cannot be paused."""
    n = copy_workers()
    return n if n > 1 and _openblas() is not None else 1


def check_workers(workers) -> int:
    """``workers`` (a positive int, or ``None`` for ``default_workers()``) as an int."""
    return default_workers() if workers is None else check_positive_int(workers, "workers")


def _enter() -> None:
    global _active, _saved
    blas = _openblas()
    with _lock:
        if _active == 0 and blas is not None:
            _saved = blas[0]()
            blas[1](1)
        _active += 1


def _exit() -> None:
    global _active
    blas = _openblas()
    with _lock:
        _active -= 1
        if _active == 0 and blas is not None and _saved is not None and blas[0]() == 1:
            blas[1](_saved)                             # unless someone set another count meanwhile


@contextlib.contextmanager
def one_blas_thread():
    """Within the block the BLAS runs on one thread (nested sections and ``run``'s share the count
    saved by the first): for callers that run their own processes or threads beside it."""
    _enter()
    try:
        yield
    finally:
        _exit()


def _after_fork_in_child() -> None:
    """A forked child has none of the parent's threads: start from scratch, with the BLAS thread
    count a parallel section running in the parent at the fork had lowered put back."""
    global _lock, _active, _saved, _pools
    if _active and _saved is not None and _blas is not None:
        _blas[1](_saved)
    _lock, _active, _saved, _pools = threading.Lock(), 0, None, {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def copy_workers() -> int:
    """Threads for a large copy (no BLAS involved): the cores, capped by ``MINIPOS_NUM_THREADS``."""
    env = os.environ.get("MINIPOS_NUM_THREADS", "").strip()                 # ignored unless a positive int
    return min(cores(), int(env)) if env.isdigit() and int(env) > 0 else cores()


# Below this many bytes one thread copies faster than several.
_THREADED_COPY = 16 << 20


def copy(src):
    """A C-contiguous copy of ``src`` (ndim >= 2), its rows (axis -2) shared among threads when it
    is large: a fresh array's pages are zeroed by the kernel on first touch, and two threads
    fault them in and fill them about 1.5 times as fast as one on a 2-core machine."""
    out = np.empty(src.shape, src.dtype)
    workers = copy_workers()
    if out.nbytes < _THREADED_COPY or workers == 1 or src.shape[-2] < 2 * workers:
        np.copyto(out, src)
        return out
    rows = src.shape[-2]
    step = -(-rows // (2 * workers))
    tasks = [(slice(r, min(r + step, rows)),) for r in range(0, rows, step)]
    run(lambda r: np.copyto(out[..., r, :], src[..., r, :]), tasks, workers, pause_blas=False)
    return out


# Below this many multiply-adds a product is left to the BLAS as it is.
_THREADED_MATMUL = 1 << 24


def matmul(a, b, workers: int):
    """``a @ b`` for ``a`` ``(..., n, k)`` and a 2-D ``b`` ``(k, m)``, the rows of ``a`` shared
    among ``workers`` threads with the BLAS paused at one thread (``run``), when large.

    As fast as the BLAS's own threads on a large product, and unlike them it leaves no idle BLAS
    thread spinning after it: OpenBLAS's spin for about 0.1 s after each threaded call, and
    measured here they slowed a blockwise kernel started right after a projection from 55 to
    80 ms. The workers follow the caller's ``np.errstate``.
    """
    rows = a.reshape(-1, a.shape[-1])
    if workers == 1 or rows.shape[0] < 2 * workers or rows.shape[0] * a.shape[-1] * b.shape[-1] < _THREADED_MATMUL:
        return a @ b
    out = np.empty((rows.shape[0], b.shape[-1]), np.result_type(a.dtype, b.dtype))
    step = -(-rows.shape[0] // workers)
    err = np.geterr()

    def part(r):
        with np.errstate(**err):                                    # errstate is per thread
            np.matmul(rows[r], b, out=out[r])
    run(part, [(slice(i, i + step),) for i in range(0, rows.shape[0], step)], workers)
    return out.reshape(*a.shape[:-1], b.shape[-1])


def run(fn, tasks: list, workers: int, *, pause_blas: bool = True) -> None:
    """Call ``fn(*task)`` for every task: in order on this thread when ``workers == 1`` (or a
    single task, or when called from one of the workers, which must not wait on its own pool),
    else on up to ``workers`` threads (BLAS paused at one thread meanwhile). The first exception
    raised, in task order, is re-raised after every task has ended."""
    if workers == 1 or len(tasks) < 2 or threading.current_thread().name.startswith(_PREFIX):
        for task in tasks:
            fn(*task)
        return
    with _lock:
        if workers not in _pools:
            if len(_pools) >= 4:                        # a few sizes in use at most: drop the others
                for old in _pools.values():
                    old.shutdown(wait=False)
                _pools.clear()
            _pools[workers] = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=_PREFIX)
        pool = _pools[workers]
    futures = []
    if pause_blas:
        _enter()
    try:
        try:
            for task in tasks:
                futures.append(pool.submit(fn, *task))
        except RuntimeError:                            # the interpreter is shutting down: no new threads
            for task in tasks[len(futures):]:
                futures.append(_done(fn, task))
        errors = [f.exception() for f in futures]       # waits for every task, even after an error
    finally:
        for f in futures:
            f.exception()
        if pause_blas:
            _exit()
    for error in errors:
        if error is not None:
            raise error


def _done(fn, task) -> Future:
    """``fn(*task)`` run here, as a finished future."""
    future = Future()
    try:
        future.set_result(fn(*task))
    except BaseException as error:                      # handed on like a worker's
        future.set_exception(error)
    return future
