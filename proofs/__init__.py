"""SymPy derivations of the identities minipos rests on, each tied to the code it justifies.

``python -m proofs`` (all), ``python -m proofs rope`` (a family or an id prefix), ``--json``,
``--latex``, from a checkout or from any folder once the wheel is installed with the ``proofs``
extra (SymPy). How to write a theorem: see the docstring of ``proofs.core``.

Every module named in ``FAMILIES`` is imported if it exists, and so is any other module of this
package; a family whose import fails is reported as a failing theorem ``<family>.import``, so
the other families still run.
"""

from __future__ import annotations

import importlib
import pkgutil
import traceback

try:
    from .core import REGISTRY, Theorem, latex_of, run, select, theorem  # noqa: F401
except ModuleNotFoundError as _err:  # one line, not a traceback from deep in core: as proofs' own failure
    # (name=__name__), `python -m proofs` reports it on one line ("Error while finding module specification")
    if not (_err.name or "").startswith("sympy"):
        raise
    raise ImportError(f"proofs needs the Python package {_err.name!r}, which is not installed: "
                      "pip install 'minipos[proofs]' (or pip install sympy)", name=__name__) from None

FAMILIES = (
    "attention", "sinusoidal", "rope", "alibi", "t5", "transformer_xl", "deberta", "online_softmax",
    "gradients",
)
_NOT_FAMILIES = {"core", "__main__"}


def _broken(family: str, text: str):
    """Register a theorem that fails with the import traceback of ``family``."""
    def _(p):
        raise RuntimeError(f"proofs.{family} failed to import:\n{text}")
    REGISTRY[f"{family}.import"] = Theorem(f"{family}.import", f"proofs.{family} imports", _)


def _load() -> None:
    found = {m.name for m in pkgutil.iter_modules(__path__)} - _NOT_FAMILIES
    extra = sorted(found - set(FAMILIES))
    for family in (*FAMILIES, *extra):
        if family not in found:
            continue
        try:
            importlib.import_module(f"{__name__}.{family}")
        except Exception:
            _broken(family, traceback.format_exc(limit=-4))


_load()
