"""``python -m benchmarks [--quick]``: print the machine, then one table of ratios.

While it measures, one progress line per group of rows goes to stderr (so that the table on stdout
stays clean when it is redirected). ``--quick`` runs small sizes, a smoke run: its targets are set
for the full sizes, so its results are marked indicative, never "TARGET MISSED". A closed pipe
(``python -m benchmarks | head``) ends it quietly.
"""

from __future__ import annotations

import os
import platform
import sys
import time

import numpy as np

from lab import record
from minipos import terminal
from minipos.fast import _threads

from . import cases
from ._timing import table

FULL = dict(attn=(2048, 8, 64), block=256, blocks=(128, 256, 512), rope=(32, 4096, 128), rope_def=(2048, 128),
            t5=(4096, 8), xl=(1024, 8, 64), deberta=(256, 8, 64, 256), long=(32768, 4, 64, 1024),
            dense_T=4096, decode=(1024, 2048, 4096, 8192), steps=9, repeats=7)
QUICK = dict(attn=(256, 2, 16), block=64, blocks=(), rope=(2, 128, 16), rope_def=(64, 16), t5=(128, 2),
             xl=(64, 2, 8), deberta=(32, 2, 8, 16), long=(1024, 2, 16, 256), dense_T=256, decode=(64, 128),
             steps=3, repeats=3)


def machine() -> str:
    """nproc, CPU model, load, library versions and the BLAS in use."""
    lines = [f"nproc {os.cpu_count()}, CPU {record.cpu()}, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}",
             f"python {platform.python_version()}, numpy {np.__version__}, torch {getattr(cases.torch, '__version__', 'not installed')}",
             f"OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}",
             f"minipos.fast blockwise workers: {_threads.default_workers()} (MINIPOS_NUM_THREADS="
             f"{os.environ.get('MINIPOS_NUM_THREADS', '(unset)')})"]
    try:
        from threadpoolctl import threadpool_info
        lines += [f"BLAS {p['internal_api']} {p['version']} ({p.get('architecture')}), {p['num_threads']} threads"
                  for p in threadpool_info() if p["user_api"] == "blas"]
    except ImportError:
        blas = np.__config__.CONFIG.get("Build Dependencies", {}).get("blas", {})
        lines.append(f"BLAS {blas.get('name')} {blas.get('version')} ({record.blas_core()}; threadpoolctl not installed)")
    return "\n".join(lines)


def groups(quick: bool) -> list:
    """``(label, measure)`` of each group of rows, in the table's order; ``measure()`` returns its rows."""
    c = QUICK if quick else FULL
    r = c["repeats"]
    return [
        ("attention forward", lambda: cases.attention_rows(*c["attn"], c["block"], r, c["blocks"])),
        ("attention backward", lambda: cases.backward_rows(*c["attn"], r)),
        ("RoPE", lambda: cases.rope_rows(*c["rope"], r)),
        ("RoPE, definitional form", lambda: [cases.rope_definitional_row(*c["rope_def"], r)]),
        ("T5 bias", lambda: [cases.t5_row(*c["t5"], r)]),
        ("Transformer-XL relative shift", lambda: [cases.xl_row(*c["xl"], r)]),
        ("DeBERTa", lambda: [cases.deberta_row(*c["deberta"], r)]),
        ("ALiBi bias per block", lambda: [cases.alibi_block_row(c["attn"][0], c["attn"][1], c["block"], r)]),
        ("memory", lambda: cases.memory_rows(c["long"][0], c["dense_T"], *c["long"][1:])),
        ("backward memory", lambda: [cases.backward_memory_row(*c["long"])]),
        ("lab training step", lambda: cases.lab_step_rows(quick)),
        ("decoding", lambda: cases.decode_rows(c["decode"], c["long"][1], c["long"][2], c["steps"])),
    ]


def run(quick: bool, progress=None) -> str:
    """Measure every group and return the table; ``progress(line)`` is called as each group starts."""
    rows, todo, start = [], groups(quick), time.perf_counter()
    for i, (label, measure) in enumerate(todo, 1):
        if progress is not None:
            progress(f"benchmarks: {i}/{len(todo)} {label} ({time.perf_counter() - start:.0f} s so far)")
        rows += measure()
    return table(rows, indicative=quick)


def main(argv=None) -> int:
    """Run ``python -m benchmarks``; return its exit status (a closed pipe ends it quietly)."""
    return terminal.run(_main, argv, prog="python -m benchmarks")


def _main(argv) -> int:
    parser = terminal.ArgumentParser(prog="python -m benchmarks", description=terminal.plain(__doc__.split("\n\n")[0]))
    parser.add_argument("--quick", action="store_true", help="small sizes, a few seconds; the results are indicative")
    args = parser.parse_args(argv)
    print(machine(), flush=True)
    if args.quick:
        print("--quick: small sizes for a smoke run; the targets are set for the full sizes, so each result is "
              "marked indicative", flush=True)
    print(run(args.quick, progress=lambda line: print(line, file=sys.stderr, flush=True)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
