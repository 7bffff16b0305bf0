"""Test-run settings shared by every test module.

One BLAS thread per test process: pytest-xdist already runs one worker per core (``-n auto``), and
OpenBLAS's own threads on top of that oversubscribe the cores (two workers of two threads each on two
cores ran the largest tour of ``minipos tour`` 10x slower). Set before NumPy is first imported, which
is when OpenBLAS reads it; an explicit ``OPENBLAS_NUM_THREADS`` in the environment wins.
"""

import os
import sys

if "numpy" in sys.modules:                                   # too late to take effect: say so, once
    print("tests/conftest.py: NumPy was imported before OPENBLAS_NUM_THREADS could be set", file=sys.stderr)
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
