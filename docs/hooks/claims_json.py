"""Write the ledger to ``claims.json`` at the root of the built site, and fail the build when a
sentence the site asserts rests on an entry that is not confirmed (``docs.hooks.ledger``)."""

from __future__ import annotations

from pathlib import Path

from mkdocs.exceptions import PluginError

from docs.hooks import ledger


def on_post_build(config, **kwargs) -> None:
    bad = ledger.unconfirmed()
    if bad:
        raise PluginError("the site asserts claims its evidence does not bear: " + "; ".join(
            f"{e.id} on {e.page} ({e.claim}): {e.verdict}" for e in bad))
    ledger.write_json(Path(config["site_dir"]) / "claims.json")
