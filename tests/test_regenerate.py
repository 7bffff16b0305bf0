"""``python tools/regenerate.py``: every file written from the scheme registry is current, a new scheme
makes them stale, and regenerating adds its cases without touching a committed one."""

from __future__ import annotations

import copy
import importlib.util
import json
import pathlib

import numpy as np
import pytest

from minipos import schemes
from minipos.seams import Scheme

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("regenerate_under_test", ROOT / "tools" / "regenerate.py")
regenerate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(regenerate)


def _committed(family):
    return json.loads((ROOT / "spec" / "vectors" / f"{family}.json").read_text(encoding="utf-8"))


def test_everything_derived_from_the_registry_is_current():
    stale = regenerate.stale_files()
    changes = [change for _, found in stale.values() for change in found]
    assert not stale, f"stale: {'; '.join(changes)}; run python tools/regenerate.py"


class HalfDistance(Scheme):
    """A fixed bias ``-|i - j| / 2`` (a test registers it)."""

    name = "test-half-distance"
    seams = ("bias",)
    terms = ("content-content", "position-position")

    def bias(self, q_positions, k_positions):
        d = np.abs(q_positions[:, None] - k_positions[None, :]).astype(float)
        return np.broadcast_to(-0.5 * d, (self.num_heads, *d.shape))


@pytest.fixture
def half_distance():
    schemes.register(HalfDistance)
    yield HalfDistance
    schemes.unregister(HalfDistance.name)


def test_a_new_scheme_adds_its_cases_and_keeps_every_committed_one(half_distance):
    for family in ("layer", "layer_grad"):
        committed = _committed(family)
        doc, changes = regenerate.merged_family(family, copy.deepcopy(committed))
        assert changes == [f"{family}: case test_half_distance_example added"]
        new = [c for c in doc["cases"] if c["params"]["scheme"] == "test-half-distance"]
        assert [c["name"] for c in new] == ["test_half_distance_example"]
        assert [c for c in doc["cases"] if c not in new] == committed["cases"]   # as committed, in order
    table = regenerate.schemes_table("")
    assert "| `test-half-distance` | `test_regenerate.HalfDistance` | bias | A fixed bias `-\\|i - j\\| / 2`" in table
    assert "`test-half-distance`" in regenerate.seams_table("").splitlines()[5]   # the bias row
    assert "| `test-half-distance` | `test_regenerate.HalfDistance` |" in regenerate.catalogue_text()
    for path, prefix in regenerate.DOCUMENTS.items():                        # README.md and docs/index.md
        text = path.read_text(encoding="utf-8")
        assert "test-half-distance" not in text and "test-half-distance" in regenerate.with_blocks(text, prefix, path)


def test_a_removed_scheme_drops_its_cases_and_a_changed_case_is_refused():
    committed = _committed("layer")
    extra = {**copy.deepcopy(committed["cases"][0]), "name": "gone_example"}
    doc, changes = regenerate.merged_family("layer", {**committed, "cases": committed["cases"] + [extra]})
    assert changes == ["layer: case gone_example dropped"] and doc["cases"] == committed["cases"]
    changed = copy.deepcopy(committed)
    changed["cases"][3]["params"]["causal"] = not changed["cases"][3]["params"]["causal"]
    with pytest.raises(regenerate.Stale, match=f"case {changed['cases'][3]['name']!r}.*needs a new name"):
        regenerate.merged_family("layer", changed)


def test_check_changes_nothing_and_names_the_command(monkeypatch, capsys, tmp_path):
    target = tmp_path / "x.md"
    target.write_text("old", encoding="utf-8")
    monkeypatch.setattr(regenerate, "stale_files", lambda: {target: ("new", ["x.md: the generated tables"])})
    assert regenerate.main(["--check"]) == 1
    out, err = capsys.readouterr()
    assert "stale: x.md: the generated tables" in out and "run python tools/regenerate.py" in err
    assert target.read_text(encoding="utf-8") == "old"
    assert regenerate.main([]) == 0 and target.read_text(encoding="utf-8") == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["x.md"]                  # written through a temp file, renamed


def test_an_unknown_generated_block_is_refused():
    with pytest.raises(regenerate.Stale, match="registry:nosuch"):
        regenerate.with_blocks("<!-- registry:nosuch -->\nx\n<!-- /registry:nosuch -->\n", "", ROOT / "README.md")
