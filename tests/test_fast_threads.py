"""Tests of minipos.fast._threads: the worker threads of blockwise attention and the BLAS pause."""

import threading

import pytest

from minipos.fast import _threads


def test_one_worker_runs_the_tasks_in_order_on_this_thread():
    seen = []
    _threads.run(lambda i: seen.append((i, threading.get_ident())), [(0,), (1,), (2,)], workers=1)
    assert seen == [(0, threading.get_ident()), (1, threading.get_ident()), (2, threading.get_ident())]


def test_several_workers_run_every_task_and_reraise_the_first_error_in_task_order():
    seen, lock = [], threading.Lock()

    def task(i):
        with lock:
            seen.append(i)
        if i in (3, 5):
            raise ValueError(f"task {i}")
    with pytest.raises(ValueError, match="task 3"):
        _threads.run(task, [(i,) for i in range(8)], workers=2)
    assert sorted(seen) == list(range(8))                 # the other tasks still ran to the end


def test_the_blas_thread_count_is_restored_after_a_parallel_run():
    blas = _threads._openblas()
    if blas is None:
        pytest.skip("the BLAS in this process is not OpenBLAS")
    get, _ = blas
    before = get()
    during = []
    _threads.run(lambda i: during.append(get()), [(0,), (1,)], workers=2)
    assert during == [1, 1]                               # paused at one thread meanwhile
    assert get() == before


def test_minipos_num_threads_caps_the_default(monkeypatch):
    monkeypatch.setenv("MINIPOS_NUM_THREADS", "1")
    assert _threads.default_workers() == 1
    monkeypatch.setenv("MINIPOS_NUM_THREADS", "not a number")  # ignored: the cores decide
    assert 1 <= _threads.default_workers() <= _threads.cores()


def test_without_a_pausable_blas_the_default_is_one_worker(monkeypatch):
    monkeypatch.setattr(_threads, "_openblas", lambda: None)
    monkeypatch.delenv("MINIPOS_NUM_THREADS", raising=False)
    assert _threads.default_workers() == 1


@pytest.mark.parametrize("workers, error", [(0, ValueError), (-1, ValueError), (2.0, TypeError)])
def test_check_workers_names_the_argument(workers, error):
    with pytest.raises(error, match="workers"):
        _threads.check_workers(workers)


def test_a_task_that_runs_tasks_itself_does_not_wait_on_its_own_pool():
    # A bias_fn that calls blockwise attention runs inside a worker; its inner tasks then run in
    # order on that worker instead of queueing behind it (which could wait forever).
    inner = []

    def outer(i):
        _threads.run(lambda j: inner.append((i, j)), [(0,), (1,)], workers=2)
    _threads.run(outer, [(0,), (1,), (2,)], workers=2)
    assert sorted(inner) == [(i, j) for i in range(3) for j in range(2)]


def test_a_forked_child_starts_without_the_parents_pools():
    import os
    _threads.run(lambda i: None, [(0,), (1,)], workers=2)      # the parent now has a pool
    if not hasattr(os, "fork"):
        pytest.skip("no fork on this platform")
    pid = os.fork()
    if pid == 0:                                               # child: must finish, not hang
        try:
            _threads.run(lambda i: None, [(0,), (1,)], workers=2)
            os._exit(0 if _threads._active == 0 else 1)
        except BaseException:
            os._exit(2)
    import signal
    import time
    deadline = time.monotonic() + 30
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung on the parent's pool")
        time.sleep(0.05)
    assert os.WEXITSTATUS(status) == 0


def test_when_no_thread_can_be_started_the_tasks_run_here(monkeypatch):
    # At interpreter shutdown ThreadPoolExecutor.submit raises RuntimeError: the tasks left run on
    # the calling thread instead, and an error among them still reaches the caller.
    from concurrent.futures import ThreadPoolExecutor

    def refuse(self, fn, *args, **kwargs):
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")
    monkeypatch.setattr(ThreadPoolExecutor, "submit", refuse)
    seen = []
    _threads.run(lambda i: seen.append((i, threading.get_ident())), [(0,), (1,)], workers=2)
    assert seen == [(0, threading.get_ident()), (1, threading.get_ident())]

    def fail(i):
        raise ValueError(f"task {i}")
    with pytest.raises(ValueError, match="task 0"):
        _threads.run(fail, [(0,), (1,)], workers=2)


def test_only_a_few_pools_are_kept():
    for workers in range(2, 9):
        _threads.run(lambda i: None, [(0,), (1,)], workers=workers)
    assert len(_threads._pools) <= 4


@pytest.mark.parametrize("shape", [(3, 40, 5), (40, 5), (2, 3, 17, 4)])
def test_copy_on_threads_is_an_exact_contiguous_copy(shape, monkeypatch):
    import numpy as np
    monkeypatch.setattr(_threads, "_THREADED_COPY", 0)
    monkeypatch.setattr(_threads, "copy_workers", lambda: 2)
    src = np.arange(np.prod(shape), dtype=np.float32).reshape(shape)[..., ::-1, :]   # a strided view
    out = _threads.copy(src)
    assert out.flags.c_contiguous and out.dtype == src.dtype
    np.testing.assert_array_equal(out, src)


def test_no_openblas_is_found_where_the_memory_map_cannot_be_read_or_loaded(monkeypatch, tmp_path):
    import builtins
    real_open = builtins.open

    def no_maps(path, *a, **kw):
        if path == "/proc/self/maps":
            raise OSError("no /proc")
        return real_open(path, *a, **kw)
    monkeypatch.setattr(builtins, "open", no_maps)
    assert _threads._find_openblas() is None
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 0:0 0 /nonexistent/libopenblas.so\n")
    monkeypatch.setattr(builtins, "open", lambda path, *a, **kw: real_open(maps if path == "/proc/self/maps" else path,
                                                                           *a, **kw))
    assert _threads._find_openblas() is None                           # listed, but not loadable


def test_a_count_set_by_another_thread_during_a_section_is_kept(monkeypatch):
    # The section lowers the BLAS count to 1 and restores the count it found, unless somebody set
    # another one meanwhile: that setting wins.
    state = {"n": 4}
    monkeypatch.setattr(_threads, "_openblas", lambda: (lambda: state["n"], lambda n: state.__setitem__("n", n)))
    _threads._enter()
    assert state["n"] == 1
    _threads._exit()
    assert state["n"] == 4                                    # restored
    _threads._enter()
    state["n"] = 3                                            # another thread's choice
    _threads._exit()
    assert state["n"] == 3


def test_one_blas_thread_nests_and_restores_even_after_an_error(monkeypatch):
    state = {"n": 4}
    monkeypatch.setattr(_threads, "_openblas", lambda: (lambda: state["n"], lambda n: state.__setitem__("n", n)))
    with _threads.one_blas_thread():
        assert state["n"] == 1
        with _threads.one_blas_thread():
            assert state["n"] == 1
        assert state["n"] == 1                                # the outer section still holds it
    assert state["n"] == 4
    with pytest.raises(KeyError):
        with _threads.one_blas_thread():
            raise KeyError("boom")
    assert state["n"] == 4 and _threads._active == 0


@pytest.mark.parametrize("shape", [(5, 7), (2, 3, 8), (1, 1)])
def test_matmul_on_threads_is_the_product(shape, monkeypatch):
    # Rows shared among workers give a @ b (each row is the same dot products, one thread each).
    import numpy as np
    monkeypatch.setattr(_threads, "_THREADED_MATMUL", 0)
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(shape), rng.standard_normal((shape[-1], 4))
    for workers in (1, 2, 3):
        got = _threads.matmul(a, b, workers)
        assert got.shape == (*shape[:-1], 4)
        np.testing.assert_allclose(got, a @ b, rtol=1e-13, atol=1e-13)


def test_matmul_workers_follow_the_callers_errstate(monkeypatch):
    import numpy as np
    monkeypatch.setattr(_threads, "_THREADED_MATMUL", 0)
    a, b = np.full((4, 2), 1e200), np.full((2, 2), 1e200)                   # 2e400: overflows
    with np.errstate(over="raise"):
        with pytest.raises(FloatingPointError):
            _threads.matmul(a, b, 2)
    with np.errstate(over="ignore"):
        assert np.isinf(_threads.matmul(a, b, 2)).all()
