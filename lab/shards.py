"""Data parallelism for the training step: the batch in shards, the shards side by side in processes.

NumPy runs a training step of the lab's model on one core: its matrix products are small and its
thousand or so elementwise calls each run on one thread, holding the interpreter's lock. A second
thread in the same process gains nothing. A second *process* does: it runs half of the batch while
this one runs the other half.

The batch's loss is the weighted mean of its token losses, ``sum(w l) / W`` with ``W`` the total
weight (``lab.model.weight_total``: ``sum(w)``, at least 1). A shard's loss is its own weighted mean
``sum_s(w l) / W_s``, so ``W_s loss_s`` is its share of the numerator and::

    loss = sum_s (W_s / W) loss_s        grad = sum_s (W_s / W) grad_s

``gradients`` computes each shard with the model's own ``forward`` and ``backward`` and adds them,
shard 0 first. The number of shards is a setting of the run: it fixes the order of those sums, and
so the last bits of every number. Where the shards run is not: one after the other in this process
or side by side in forked workers, they give the same bits (the tests check it). One shard is the
plain step, bit for bit.

Workers are forked from this process when ``Shards`` starts (Linux and other systems with
``fork``; elsewhere the shards run here, one after the other). The fork copies a process that may
have threads (OpenBLAS's, minipos's idle pool), which Python 3.12+ warns about; the worker uses
none of them (``minipos.fast._threads`` starts a forked child afresh). Each worker holds the model
as it was at the fork; before a step this process writes the parameters into shared memory, each
worker copies them in, runs its shard and writes its gradients back into shared memory. (So change
nothing but the parameters while a ``Shards`` lives.) While the workers live, every process runs
its BLAS on one thread: OpenBLAS's idle threads spin for a while after each call, and one spinning
on the other core after the step's clipping took a third off the worker's speed.
"""

from __future__ import annotations

import mmap
import multiprocessing
import traceback

import numpy as np

from minipos.fast import _threads

from .model import Model, weight_total

__all__ = ["Shards", "shard_bounds"]


def shard_bounds(batch: int, shards: int) -> list[tuple[int, int]]:
    """``[(start, stop), ...]``: ``batch`` rows in ``shards`` contiguous parts, the first ones larger
    by one where they do not divide evenly (``numpy.array_split``'s rule)."""
    if not isinstance(shards, (int, np.integer)) or isinstance(shards, bool) or shards < 1:
        raise ValueError(f"shards must be a positive int, got {shards!r}")
    if batch < shards:
        raise ValueError(f"a batch of {batch} sequences cannot be split into {shards} shards (batch >= shards)")
    size, extra = divmod(batch, shards)
    bounds, start = [], 0
    for s in range(shards):
        stop = start + size + (s < extra)
        bounds.append((start, stop))
        start = stop
    return bounds


def _total(model: Model, x, w) -> float:
    """``W`` of a batch as the model's loss counts it (its weights in the model's dtype)."""
    return weight_total(None if w is None else w.reshape(-1).astype(model.dtype), x.size)


def _shard_step(model: Model, x, y, w):
    """``(loss, grads, W_s)`` of one shard: its weighted-mean loss, that loss's gradients, its total weight."""
    out = model.forward(x, y, weights=w)
    return out["loss"], model.backward(out["context"]), _total(model, x, w)


class _Flat:
    """Named float arrays laid end to end in shared buffers (one per process that writes them)."""

    def __init__(self, arrays: dict, count: int):
        self.slots, offset = {}, 0
        for name, a in arrays.items():
            self.slots[name] = (offset, a.shape, a.dtype)
            offset += -(-a.nbytes // 64) * 64                           # each array on its own cache lines
        self.buffers = [mmap.mmap(-1, max(offset, 1)) for _ in range(count)]   # anonymous: shared after fork

    def view(self, index: int, name: str) -> np.ndarray:
        offset, shape, dtype = self.slots[name]
        return np.ndarray(shape, dtype, buffer=self.buffers[index], offset=offset)

    def close(self) -> None:
        for b in self.buffers:
            try:
                b.close()
            except BufferError:                                         # a view still lives: freed with it
                pass


def _serve(conn, model: Model, params: _Flat, grads: _Flat, index: int) -> None:
    """A worker: for each shard sent, copy the parameters in, run it, write its gradients out."""
    with _threads.one_blas_thread():
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return
            if message is None:
                return
            try:
                for name, arr in model.params.items():
                    arr[...] = params.view(0, name)
                loss, g, weight = _shard_step(model, *message)
                for name, value in g.items():
                    grads.view(index, name)[...] = value
                conn.send(("ok", loss, weight, sorted(g)))
            except BaseException:                                   # noqa: BLE001 - reported to the parent
                conn.send(("error", traceback.format_exc()))


class _WorkerLost(RuntimeError):
    """A worker that cannot be reached or has ended: the shards go on in this process."""


class Shards:
    """The training step's loss and gradients, the batch split into ``shards`` (see the module docstring).

    ``workers`` processes run them (default: one per shard, at most the cores this process may use);
    ``workers=1`` runs every shard here. Use as a context manager, or call ``close()``: that ends the
    workers (after which the shards run here, with the same results).
    """

    def __init__(self, model: Model, shards: int = 1, *, workers: int | None = None):
        if not isinstance(model, Model):
            raise TypeError(f"model must be a lab.model.Model, got {type(model).__name__}")
        shard_bounds(shards, shards)                                   # checks shards
        if workers is None:
            workers = min(shards, _threads.cores())
        elif not isinstance(workers, (int, np.integer)) or isinstance(workers, bool) or workers < 1:
            raise ValueError(f"workers must be a positive int or None, got {workers!r}")
        if "fork" not in multiprocessing.get_all_start_methods():
            workers = 1
        self.model, self.shards, self.workers = model, int(shards), int(min(workers, shards))
        self._procs, self._conns, self._blas, self._params, self._grads = [], [], None, None, None
        if self.workers > 1:
            self._start()

    def _start(self) -> None:
        p = self.model.params
        self._params = _Flat(p, 1)
        self._grads = _Flat(p, self.workers)                            # buffer s: worker s's gradients (s >= 1)
        ctx = multiprocessing.get_context("fork")
        self._blas = _threads.one_blas_thread()
        self._blas.__enter__()                                          # until close(): see the module docstring
        try:
            for s in range(1, self.workers):
                here, there = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(there, self.model, self._params, self._grads, s),
                                   daemon=True, name=f"lab-shard-{s}")
                proc.start()
                there.close()
                self._procs.append(proc)
                self._conns.append(here)
        except BaseException:
            self.close()
            raise

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:                                               # noqa: BLE001 - at interpreter exit
            pass

    def close(self) -> None:
        """End the workers and put the BLAS thread count back (idempotent)."""
        for conn in self._conns:
            try:
                conn.send(None)
                conn.close()
            except OSError:
                pass
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
        self._procs, self._conns = [], []
        self.workers = min(self.workers, 1)
        for flat in (self._params, self._grads):
            if flat is not None:
                flat.close()
        self._params = self._grads = None
        blas, self._blas = self._blas, None
        if blas is not None:
            blas.__exit__(None, None, None)

    def gradients(self, x, y, w=None) -> tuple[float, dict]:
        """``(loss, grads)`` of the batch ``x``, ``y`` ``(B, T)`` with token weights ``w`` (``None`` or
        ``(B, T)``): the model's ``forward(x, y, weights=w)["loss"]`` and ``backward``'s gradients,
        computed shard by shard and added (bit for bit the plain step with one shard)."""
        x, y = np.asarray(x), np.asarray(y)
        w = None if w is None else np.asarray(w)
        if x.ndim != 2 or y.shape != x.shape:
            raise ValueError(f"x and y must be (B, T) of one shape, got {x.shape} and {y.shape}")
        if w is not None and w.shape != x.shape:
            raise ValueError(f"w must be None or {x.shape}, got {w.shape}")
        bounds = shard_bounds(x.shape[0], self.shards)
        parts = [(x[a:b], y[a:b], None if w is None else w[a:b]) for a, b in bounds]
        if self.shards == 1:
            loss, grads, _ = _shard_step(self.model, *parts[0])
            return loss, grads
        results = [None] * self.shards
        pending = []                                                    # (conn, shard) owing a reply
        try:
            if self._conns:
                for name, arr in self.model.params.items():
                    self._params.view(0, name)[...] = arr
            for conn, s in zip(self._conns, range(1, self.workers)):
                self._send(conn, s, parts[s])
                pending.append((conn, s))
            for s in [0] + list(range(self.workers, self.shards)):       # ours, and those no worker takes
                results[s] = _shard_step(self.model, *parts[s])
            replies = {}
            while pending:
                conn, s = pending[0]
                replies[s] = self._receive(conn, s)
                pending.pop(0)
        except BaseException as error:
            if isinstance(error, _WorkerLost) or not self._drain(pending):
                self.close()                                            # else a reply owed would answer the next step
            raise
        for s, reply in replies.items():
            if reply[0] == "error":
                raise RuntimeError(f"shard {s} failed in its worker:\n{reply[1]}")
            _, loss, weight, names = reply
            results[s] = loss, {name: self._grads.view(s, name) for name in names}, weight
        return self._combine(results, _total(self.model, x, w))

    @staticmethod
    def _send(conn, s: int, part) -> None:
        try:
            conn.send(part)
        except OSError as e:
            raise _WorkerLost(f"the worker running shard {s} cannot be reached ({e})") from None

    @staticmethod
    def _receive(conn, s: int):
        try:
            return conn.recv()
        except (EOFError, OSError):
            raise _WorkerLost(f"the worker running shard {s} ended unexpectedly") from None

    @staticmethod
    def _drain(pending) -> bool:
        """Read the replies still owed (after an error here); False if a worker cannot give one."""
        for conn, _ in pending:
            try:
                conn.recv()
            except (EOFError, OSError):
                return False
        return True

    @staticmethod
    def _combine(results, total: float):
        loss, grads = 0.0, {}
        for shard_loss, g, weight in results:                           # shard 0 first, always
            share = weight / total
            loss += share * shard_loss
            for name, value in g.items():
                if name in grads:
                    grads[name] += share * value
                else:
                    grads[name] = share * value                         # a new array, never the shared one
        return loss, grads
