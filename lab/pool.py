"""Runs side by side: one process per record, as many at a time as there are cores.

Each record is one command (``lab.run.command_for``); the protocol is a list of them. ``run_all``
starts each as its own ``python -m lab`` process with every thread count set to 1
(``MINIPOS_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1``, which the record's command then
carries, as it carries an ``OPENBLAS_CORETYPE`` set in this environment), ``jobs`` at a time, from a
standard-library thread pool whose threads only wait on their process. A record's numbers depend on
its own command alone, never on how many ran beside it; a grid larger than one machine runs under any
scheduler from ``python -m lab --print-commands``.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from .run import THREAD_VARIABLES, Settings, command_for, record_path

__all__ = ["ONE_THREAD", "default_jobs", "commands", "run_all"]

ONE_THREAD = {name: "1" for name in THREAD_VARIABLES}
"""The environment of every record's process: one thread each, so that ``jobs`` processes share the cores."""


def default_jobs() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def commands(settings: list[Settings], out) -> list[str]:
    """The shell command of each run, as its record will state it."""
    return [command_for(s, out, environ={**os.environ, **ONE_THREAD}) for s in settings]


def _argv(settings: Settings, out) -> list[str]:
    words = shlex.split(command_for(settings, out, environ={}))
    return [sys.executable, *words[1:], "--no-progress", "--no-summary"]


def run_all(settings: list[Settings], out, *, jobs: int, report=print) -> list[tuple[Settings, int, float]]:
    """Run every ``settings`` into ``out``, ``jobs`` processes at a time; ``[(settings, exit status,
    seconds)]`` in the order given. ``report`` gets one line per finished run."""
    root = Path(__file__).resolve().parent.parent
    env = {**{k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}, **ONE_THREAD}
    results = {}

    def one(i, s):
        start = time.perf_counter()
        done = subprocess.run(_argv(s, out), cwd=root, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
        return i, done.returncode, time.perf_counter() - start, done.stderr

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        futures = [pool.submit(one, i, s) for i, s in enumerate(settings)]
        try:
            for finished, future in enumerate(as_completed(futures), 1):
                i, status, seconds, stderr = future.result()
                results[i] = (settings[i], status, seconds)
                name = record_path(out, settings[i]).name
                tail = "" if status == 0 else f": failed (exit status {status}): {stderr.strip().splitlines()[-1:]}"
                report(f"[{finished}/{len(settings)}] {name} {seconds:.0f} s{tail}")
        except KeyboardInterrupt:
            for f in futures:
                f.cancel()
            raise
    return [results[i] for i in range(len(settings))]
