"""Shared by the proof tests: break a minipos function and collect the failure it must cause."""

import pytest

from proofs.core import ProofFailure, select


def proof_failure(theorem_id, monkeypatch, module, name, broken):
    """Replace ``module.name`` by ``broken`` and return the ``ProofFailure`` the theorem raises.

    Fails the test if the theorem still passes: a proof that cannot see the break proves nothing.
    """
    monkeypatch.setattr(module, name, broken)
    with pytest.raises(ProofFailure) as err:
        select([theorem_id])[0].prove()
    return err.value
