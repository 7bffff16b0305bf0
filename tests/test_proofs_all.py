"""Every theorem of every family passes, each as its own test (family tests break them on purpose)."""

import pytest

pytest.importorskip("sympy")

from proofs import core  # noqa: E402


@pytest.mark.parametrize("tid", sorted(core.REGISTRY))
def test_theorem_passes(tid):
    assert core.REGISTRY[tid].prove().steps > 0


def test_every_family_is_present():
    """Every module of ``proofs/`` that is not the machinery (core, markdown, layout) registers theorems, none of them a failed import."""
    import pkgutil

    import proofs
    modules = {f"proofs.{m.name}" for m in pkgutil.iter_modules(proofs.__path__)} - {
        "proofs.core", "proofs.markdown", "proofs.layout", "proofs.__main__"}
    registering = {t.func.__module__ for t in core.REGISTRY.values()}
    assert modules <= registering, sorted(modules - registering)
    assert not [tid for tid in core.REGISTRY if tid.endswith(".import")]
