"""spec/README.md's sections on RoPE's base and scaling keys and on MLA's RMSNorm say what the code does."""

import inspect
import json
import math
import pathlib
import re

import numpy as np
import pytest

from minipos.layer import MultiHeadAttention
from minipos.mla import rms_norm
from minipos.rope_scaling import REGISTRY, Rotary

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "spec" / "README.md").read_text(encoding="utf-8")


def _scaling_table() -> dict:
    """``{kind: [key, ...]}`` from the README's table of scaling kinds."""
    start = README.index("| kind / `rope_type` | keys (default) |")
    rows = {}
    for line in README[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        kind, keys = [c.strip() for c in line.strip("|").split("|")][:2]
        rows[kind.strip("`")] = [k for k in re.findall(r"`([a-z_]+)`", keys) if k != "dim"]
    return rows


def test_the_scaling_table_lists_each_kind_s_keyword_arguments():
    rows = _scaling_table()
    assert rows.pop("all") == ["base"]
    assert set(rows) == set(REGISTRY)
    for kind, keys in rows.items():
        params = [n for n in inspect.signature(REGISTRY[kind]).parameters if n not in ("dim", "base")]
        assert sorted(keys) == sorted(params), kind


def test_rope_theta_inside_scaling_is_the_base_of_gemma3_s_global_case():
    doc = json.loads((ROOT / "spec" / "vectors" / "local_global.json").read_text())
    config = next(c for c in doc["cases"] if c["name"] == "gemma3_global_gqa")["params"]["scheme_config"]
    assert "base" not in config and config["scaling"]["rope_theta"] == 1000000.0
    rotary = Rotary(**config)
    assert rotary.base == 1000000.0
    D = 8
    MultiHeadAttention(16, 2, scheme=rotary)                # head_dim D = 8
    inv_freq, factor = rotary.inv_freq, rotary.attention_factor
    # the README's w_i = 1000000^(-2i/D) / 8
    assert np.allclose(inv_freq, [1000000.0 ** (-2 * i / D) / 8 for i in range(D // 2)], rtol=1e-15)
    assert factor == 1.0
    with pytest.raises(ValueError, match="contradicts base"):
        Rotary(base=500000.0, scaling=config["scaling"])
    assert Rotary(base=10000.0, scaling=config["scaling"]).base == 1000000.0   # the default is overridden
    assert Rotary(scaling={"rope_type": "default", "rope_theta": 5e5}).base == 5e5


def test_mla_rms_norm_is_the_readme_s_formula():
    x, g = np.array([[3.0, 4.0]]), np.array([1.0, 2.0])
    inv = 1 / math.sqrt((9 + 16) / 2 + 1e-6)      # by hand: mean of squares 12.5, eps 1e-6
    assert np.array_equal(rms_norm(x, g), g * (x * inv))   # x scaled first, then the weight
    for case in json.loads((ROOT / "spec" / "vectors" / "mla.json").read_text())["cases"]:
        assert case["params"].get("eps") == (1e-5 if case["name"].startswith("dots_") else None)   # 1.3.0's
        assert not np.allclose(case["inputs"]["kv_a_norm"]["data"], 1.0)   # "the norms are ... not ones"
