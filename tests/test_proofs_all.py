"""Every theorem of every family passes, each as its own test (family tests break them on purpose)."""

import pytest

pytest.importorskip("sympy")

from proofs import core  # noqa: E402


@pytest.mark.parametrize("tid", sorted(core.REGISTRY))
def test_theorem_passes(tid):
    assert core.REGISTRY[tid].prove().steps > 0


def test_every_family_is_present():
    families = {t.family for t in core.REGISTRY.values()}
    assert families >= {"attention", "sinusoidal", "rope", "alibi", "t5", "transformer_xl", "deberta",
                        "online_softmax", "rope_scaling", "xpos", "gradients", "mla", "sinks"}
