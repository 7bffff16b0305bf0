"""torch and transformers for the interop tests, which the README's test command does not install.

A module whose other tests need neither imports from here and marks its interop tests with
``needs_torch``, so that without torch those tests skip and the rest still run (a module-level
``pytest.importorskip`` halfway down a file would skip the whole file).
"""

import numpy as np
import pytest

try:
    import torch
    import transformers
except ImportError:
    torch = transformers = None

needs_torch = pytest.mark.skipif(torch is None, reason="torch and transformers are optional interop extras")


def _t(a, grad=False):
    """A float64-exact torch view of a NumPy array (``requires_grad`` with ``grad``)."""
    t = torch.from_numpy(np.ascontiguousarray(a))
    return t.requires_grad_() if grad else t


def _np(t):
    return t.detach().numpy()


def copy_projections(layer, ref):
    """An HF attention module's ``q/k/v/o_proj`` into a minipos layer: ``w = weight^T``, and each
    bias the module has."""
    for n in "qkvo":
        lin = getattr(ref, f"{n}_proj")
        setattr(layer, "w" + n, _np(lin.weight).T.copy())
        if lin.bias is not None:
            setattr(layer, "b" + n, _np(lin.bias).copy())
