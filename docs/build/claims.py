"""The ledger of claims as a build step: ``claims.json`` at the root of the site, and a problem for
every sentence the site asserts whose ledger entry is not confirmed (``docs.hooks.ledger``)."""

from __future__ import annotations

from pathlib import Path


def write(site) -> list[str]:
    """Write ``claims.json`` into ``site``; return one problem per asserted entry that is not confirmed."""
    from docs.hooks import ledger
    ledger.write_json(Path(site) / "claims.json")
    return [f"{e.page}: asserts {e.id} ({e.claim}), whose verdict is {e.verdict}" for e in ledger.unconfirmed()]
