"""The grouped-query cases of ``layer`` and ``layer_grad`` catch a port that maps the heads by tiling.

With ``H`` query heads on ``KV`` key/value heads (``G = H // KV``), query head ``h`` reads key/value
head ``h // G``: HF's ``repeat_kv`` (``hidden_states[:, :, None].expand(B, KV, G, S, D).reshape(B, KV * G,
S, D)``, each key/value head repeated ``G`` times in place). A port that tiles them instead
(``h % KV``, ``np.tile`` / ``torch.Tensor.repeat``) agrees with it when ``KV`` is 1 or ``H``, which
was every grouped-query case before; 4 heads on 2 is the smallest split where the two differ.

Two ports are run by ``spec/check_port.py`` over the committed vectors: one written from
spec/README.md in NumPy (forward, RoPE and ALiBi), and minipos's own layer with the head map
patched to tiling (forward and backward). The right map passes, the tiled one fails exactly the
4-on-2 cases. Values from outside minipos: ALiBi's 4-head slopes 2^(-8h/4) (Press et al. 2022, §3),
RoPE's one pair at ``D = 2`` turning by ``m`` radians (theta_0 = base^0 = 1).
"""

import importlib.util
import pathlib
import sys

import numpy as np
import pytest

from minipos.layer import MultiHeadAttention
from minipos.vectors.registry import FAMILIES

ROOT = pathlib.Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("check_port", ROOT / "spec" / "check_port.py")
check_port = importlib.util.module_from_spec(_spec)
sys.modules["check_port"] = check_port  # its dataclasses look the module up there
_spec.loader.exec_module(check_port)


def _cases(family):
    return {c["name"]: c for c in check_port.load_family(family)["cases"]}


def _split(family):
    """The names of the family's cases with 1 < num_kv_heads < num_heads, and of the others."""
    split = {n for n, c in _cases(family).items() if 1 < (c["params"].get("num_kv_heads") or c["params"]["num_heads"])
             < c["params"]["num_heads"]}
    return split, set(_cases(family)) - split


def test_the_new_cases_put_4_query_heads_on_2_key_value_heads():
    for family, expected in (("layer", {"rope_half_gqa_h4_kv2", "rope_half_gqa_h4_kv2_cached", "alibi_gqa_h4_kv2"}),
                             ("layer_grad", {"rope_half_gqa_h4_kv2", "alibi_gqa_h4_kv2"})):
        split, _ = _split(family)
        assert split == expected, family
        for name in split:
            case = _cases(family)[name]
            assert (case["params"]["num_heads"], case["params"]["num_kv_heads"]) == (4, 2)
            assert case["inputs"]["wk"]["shape"] == case["inputs"]["wv"]["shape"] == [8, 4]   # (d_model, KV*D)
    # before them, no grouped-query case of any family could tell the two maps apart
    for family in ("local_global", "local_global_grad"):
        assert _split(family)[0] == set(), family


# --- a port written from the spec ---------------------------------------------------------------

def spec_layer(x, wq, wk, wv, wo, *, d_model, num_heads, scheme, scheme_config, causal, bias, num_kv_heads=None,
               tiled=False, **rest):
    """``layer`` for a causal rope (half layout) or alibi case without bias or mask; ``tiled`` maps head h
    to h % KV."""
    if (scheme not in ("rope", "alibi") or scheme_config not in ({}, {"layout": "half"}) or "mask" in rest
            or bias or not causal):
        raise NotImplementedError(scheme)
    B, T, _d = x.shape
    H, KV = num_heads, num_kv_heads or num_heads
    D = d_model // H
    heads = lambda a, n: a.reshape(B, T, n, D).transpose(0, 2, 1, 3)               # (B, n, T, D)
    q, k, v = heads(x @ wq, H), heads(x @ wk, KV), heads(x @ wv, KV)
    m = np.arange(T)                                                               # a cached run: the same rows
    if scheme == "rope":
        inv_freq = scheme_config.get("base", 10000.0) ** (-np.arange(0, D, 2) / D)   # D = 2: theta_0 = 1
        ang = np.concatenate([m[:, None] * inv_freq] * 2, -1)                       # half layout (T, D)
        rot = lambda a: a * np.cos(ang) + np.concatenate([-a[..., D // 2:], a[..., :D // 2]], -1) * np.sin(ang)
        q, k = rot(q), rot(k)
    kv_of = np.arange(H) % KV if tiled else np.arange(H) // (H // KV)
    s = q @ np.swapaxes(k[:, kv_of], -1, -2) / np.sqrt(D)                           # (B, H, T, T)
    if scheme == "alibi":
        slopes = 2.0 ** (-8.0 * np.arange(1, H + 1) / H)                           # 1/4, 1/16, 1/64, 1/256
        s = s - slopes[:, None, None] * (m[:, None] - m[None, :])
    s = np.where(m[None, :] <= m[:, None], s, -np.inf)                             # causal
    p = np.exp(s - s.max(-1, keepdims=True))
    out = (p / p.sum(-1, keepdims=True)) @ v[:, kv_of]                              # (B, H, T, D)
    return out.transpose(0, 2, 1, 3).reshape(B, T, H * D) @ wo


def test_the_spec_port_passes_the_split_cases_and_tiling_fails_them():
    split, _ = _split("layer")
    right = check_port.run_family("layer", spec_layer)
    assert set(right.passed) >= split and not set(right.failed), str(right)
    wrong = check_port.run_family("layer", lambda **kw: spec_layer(**kw, tiled=True))
    assert set(wrong.failed) == split, str(wrong)
    assert set(wrong.passed) == set(right.passed) - split       # where KV = H the maps agree


# --- minipos with the head map patched ------------------------------------------------------------

def _tile(self, a):                                   # (B, KV, S, D) -> (B, H, S, D): head h reads h % KV
    return np.tile(a, (1, self.num_heads // self.num_kv_heads, 1, 1))


def _tile_backward(self, d):                          # its adjoint: sum over the heads h = j, j + KV, ...
    return d.reshape(d.shape[0], self.num_heads // self.num_kv_heads, self.num_kv_heads, *d.shape[2:]).sum(axis=1)


def _minipos_port(family):
    run = FAMILIES[family].run
    return dict(fn=lambda inputs, params: run(inputs, params), adapt=lambda inputs, params: {"inputs": inputs,
                                                                                             "params": params})


@pytest.mark.parametrize("family", ["layer", "layer_grad"])
def test_minipos_passes_and_minipos_tiling_the_heads_fails_exactly_the_split_cases(family, monkeypatch):
    split, others = _split(family)
    right = check_port.run_family(family, **_minipos_port(family))
    assert not right.failed and not right.skipped and set(right.passed) == split | others, str(right)
    monkeypatch.setattr(MultiHeadAttention, "_repeat_kv", _tile)
    monkeypatch.setattr(MultiHeadAttention, "_repeat_kv_backward", _tile_backward)
    wrong = check_port.run_family(family, **_minipos_port(family))
    assert set(wrong.failed) == split and set(wrong.passed) == others, str(wrong)
    if family == "layer_grad":                        # x, wq, wk, wv and wo all see the wrong map
        failed = {line.split(":")[1].strip() for line in wrong.mismatches}
        assert failed >= {"x", "wq", "wk", "wv", "wo"}, wrong.mismatches


def test_the_tiled_adjoint_is_the_adjoint_of_tiling():
    # <tile(a), d> = <a, tile_backward(d)> for random a, d: the patched backward is a consistent
    # (wrong-map) port, so the failures above come from the map, not from a broken gradient
    layer = MultiHeadAttention(8, 4, num_kv_heads=2)
    rng = np.random.default_rng(0)
    a, d = rng.standard_normal((2, 2, 5, 2)), rng.standard_normal((2, 4, 5, 2))
    np.testing.assert_allclose(np.sum(_tile(layer, a) * d), np.sum(a * _tile_backward(layer, d)), rtol=1e-12)
    assert np.array_equal(_tile(layer, a)[:, 2], a[:, 0]) and np.array_equal(layer._repeat_kv(a)[:, 2], a[:, 1])
