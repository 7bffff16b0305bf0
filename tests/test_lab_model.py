"""The lab's model: each hand-written backward against central finite differences in float64,
the whole model against torch autograd, and AdamW, the schedule and clipping against hand-worked
numbers and torch.optim.AdamW."""

import math

import numpy as np
import pytest

from lab import model as M
from lab.model import AdamW, Model, ModelConfig, clip_by_global_norm, learning_rate

RTOL = 1e-6


def numeric_grad(f, x, eps=1e-6, entries=None):
    """Central differences of the scalar ``f()`` with respect to the entries of ``x`` (changed in place):
    all of them, or the flat indices ``entries`` (the other entries of the result stay 0)."""
    g = np.zeros_like(x)
    for i in (np.ndindex(x.shape) if entries is None else (np.unravel_index(e, x.shape) for e in entries)):
        old = x[i]
        x[i] = old + eps
        up = f()
        x[i] = old - eps
        down = f()
        x[i] = old
        g[i] = (up - down) / (2 * eps)
    return g


def rel_err(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(a), np.linalg.norm(b), 1e-300))


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def test_layer_norm_backward(rng):
    x, g, b = rng.standard_normal((2, 3, 5)), rng.standard_normal(5), rng.standard_normal(5)
    w = rng.standard_normal((2, 3, 5))                               # loss = sum(w * y)
    loss = lambda: float((M.layer_norm(x, g, b)[0] * w).sum())       # noqa: E731
    dx, dg, db = M.layer_norm_backward(M.layer_norm(x, g, b)[1], w)
    for ana, arr in ((dx, x), (dg, g), (db, b)):
        assert rel_err(ana, numeric_grad(loss, arr)) <= RTOL


def test_rms_norm_backward(rng):
    x, g = rng.standard_normal((4, 6)), rng.standard_normal(6)
    w = rng.standard_normal((4, 6))
    loss = lambda: float((M.rms_norm(x, g)[0] * w).sum())            # noqa: E731
    dx, dg = M.rms_norm_backward(M.rms_norm(x, g)[1], w)
    assert rel_err(dx, numeric_grad(loss, x)) <= RTOL
    assert rel_err(dg, numeric_grad(loss, g)) <= RTOL


def test_layer_norm_matches_its_definition():
    # hand-worked: x = (1, 2, 3, 4): mean 2.5, var 1.25, xhat = (x - 2.5)/sqrt(1.25 + 1e-5)
    y, _ = M.layer_norm(np.array([1.0, 2.0, 3.0, 4.0]), np.ones(4), np.zeros(4))
    assert np.allclose(y, (np.array([1, 2, 3, 4]) - 2.5) / math.sqrt(1.25 + 1e-5), rtol=1e-12)


@pytest.mark.parametrize("activation", ["gelu", "relu"])
def test_mlp_backward(rng, activation):
    x = rng.standard_normal((5, 4))
    w1, b1 = rng.standard_normal((4, 7)), rng.standard_normal(7) * 0.1
    w2, b2 = rng.standard_normal((7, 4)), rng.standard_normal(4)
    if activation == "relu":                                          # keep h away from the kink
        h = x @ w1 + b1
        b1 += np.where(np.abs(h) < 1e-3, 1e-2, 0.0).max(axis=0)
    w = rng.standard_normal((5, 4))
    loss = lambda: float((M.mlp(x, w1, b1, w2, b2, activation)[0] * w).sum())  # noqa: E731
    grads = M.mlp_backward(M.mlp(x, w1, b1, w2, b2, activation)[1], w)
    for ana, arr in zip(grads, (x, w1, b1, w2, b2)):
        assert rel_err(ana, numeric_grad(loss, arr)) <= RTOL


def test_gelu_is_torch_tanh_gelu():
    # values of torch.nn.functional.gelu(x, approximate="tanh") in float64, printed with torch 2.13
    x = np.array([-3.0, -1.0, -0.1, 0.0, 0.5, 2.0])
    torch_values = np.array([-0.0036373920817729943, -0.15880800939172324, -0.04601724895456484, 0.0,
                             0.34571400982514394, 1.954597694087775])
    assert np.allclose(M.gelu(x)[0], torch_values, rtol=1e-12, atol=1e-15)


def test_gelu_across_chunks_gives_the_same_values(rng, monkeypatch):
    # gelu works _CHUNK elements at a time: chunks of 4 over 2-D input of 15 elements (a short last
    # chunk) give the torch values above and bit for bit what one chunk gives; the derivative
    # agrees with central differences.
    x = np.array([-3.0, -1.0, -0.1, 0.0, 0.5, 2.0])
    whole = rng.standard_normal((3, 5)) * 3
    y1, d1 = M.gelu(whole)
    monkeypatch.setattr(M, "_CHUNK", 4)
    assert np.allclose(M.gelu(x)[0], [-0.0036373920817729943, -0.15880800939172324, -0.04601724895456484, 0.0,
                                      0.34571400982514394, 1.954597694087775], rtol=1e-12, atol=1e-15)
    y4, d4 = M.gelu(whole)
    assert y4.shape == whole.shape and np.array_equal(y4, y1) and np.array_equal(d4, d1)
    h = 1e-6
    assert np.allclose(d4, (M.gelu(whole + h, grad=False)[0] - M.gelu(whole - h, grad=False)[0]) / (2 * h),
                       rtol=1e-6, atol=1e-8)


def test_embedding_backward_scatters_and_adds(rng):
    E = rng.standard_normal((6, 3))
    tokens = np.array([[1, 4, 1], [0, 1, 5]])                        # token 1 three times
    w = rng.standard_normal((2, 3, 3))
    loss = lambda: float((E[tokens] * w).sum())                      # noqa: E731
    assert rel_err(M.embedding_backward(tokens, w, 6), numeric_grad(loss, E)) <= RTOL
    assert np.allclose(M.embedding_backward(tokens, w, 6)[2], 0.0)   # no token 2: zero row


@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_backward(rng, weighted):
    logits, targets = rng.standard_normal((7, 5)) * 3, rng.integers(0, 5, 7)
    weights = (rng.random(7) < 0.5).astype(np.float64) if weighted else None
    if weighted:
        weights[0] = 1.0
    loss = lambda: M.weighted_mean(M.cross_entropy(logits, targets, weights)[0], weights)  # noqa: E731
    ana = M.cross_entropy_backward(M.cross_entropy(logits, targets, weights)[1])
    assert rel_err(ana, numeric_grad(loss, logits)) <= RTOL


def test_cross_entropy_value():
    # hand-worked: logits (0, ln 3) -> softmax (1/4, 3/4); -log(3/4) for target 1, -log(1/4) for target 0
    losses, _ = M.cross_entropy(np.array([[0.0, math.log(3)], [0.0, math.log(3)]]), np.array([1, 0]))
    assert np.allclose(losses, [-math.log(0.75), -math.log(0.25)], rtol=1e-14)


TINY = dict(vocab=7, d_model=8, num_heads=2, num_layers=2, d_ff=12)


def _perturbed(config, seed=3):
    m = Model(config, seed=seed, dtype=np.float64)
    rng = np.random.default_rng(seed)
    for name, p in m.params.items():                                  # away from init symmetries (b = 0, g = 1)
        p += rng.standard_normal(p.shape) * (0.3 if name.endswith((".g", ".b", "b1", "b2")) else 0.05)
    return m


@pytest.mark.parametrize("scheme,norm,activation,tied", [
    ({"name": "rope"}, "layernorm", "gelu", True),
    ({"name": "alibi"}, "rmsnorm", "relu", False),
    ({"name": "t5", "bidirectional": False}, "layernorm", "gelu", False),
    ({"name": "transformer-xl"}, "rmsnorm", "gelu", True),
    ({"name": "deberta", "position_buckets": 4, "max_relative_positions": 8}, "layernorm", "gelu", True),
    ({"name": "learned", "max_positions": 8}, "layernorm", "relu", True),
    ({"name": "xpos"}, "rmsnorm", "gelu", False),
    ({"name": "sinusoidal"}, "layernorm", "gelu", True),
    ({"name": "nope"}, "layernorm", "gelu", True),
    # the lab's layouts (lab.schemes.LAYOUT): T5's one table for every layer, absolute positions added once
    ({"name": "t5", "bidirectional": False, "num_buckets": 8, "max_distance": 16, "shared": True}, "layernorm",
     "gelu", True),
    ({"name": "learned", "max_positions": 8, "placement": "input"}, "rmsnorm", "gelu", True),
    ({"name": "sinusoidal", "placement": "input"}, "layernorm", "relu", False),
])
def test_model_backward_against_finite_differences(scheme, norm, activation, tied):
    m = _perturbed(ModelConfig(scheme=scheme, norm=norm, activation=activation, tied=tied, **TINY))
    rng = np.random.default_rng(1)
    tokens, targets = rng.integers(0, 7, (2, 5)), rng.integers(0, 7, (2, 5))
    weights = np.array([[1, 0, 1, 1, 0], [1, 1, 0, 1, 1]], np.float64)
    grads = m.backward(m.forward(tokens, targets, weights=weights)["context"])
    assert set(grads) == set(m.params)
    loss = lambda: m.forward(tokens, targets, weights=weights, keep=False)["loss"]  # noqa: E731
    pick = np.random.default_rng(4)
    for name, p in m.params.items():                                   # up to 10 entries of each parameter
        entries = pick.choice(p.size, size=min(p.size, 10), replace=False)
        num = numeric_grad(loss, p, entries=entries).ravel()[entries]
        assert rel_err(grads[name].ravel()[entries], num) <= RTOL, name


@pytest.mark.parametrize("scheme", [{"name": "rope"}, {"name": "transformer-xl"},
                                    {"name": "deberta", "position_buckets": 4, "max_relative_positions": 8}])
def test_model_matches_torch(scheme):
    # The torch model (lab.bench.torch_model) is written from the papers and HF's DeBERTa-v2 code in
    # torch ops, with autograd for the gradients: an outside check of the NumPy forward and backward.
    # DeBERTa at 4 buckets and 8 positions over 8 tokens: distances 3 ... 7 share log buckets.
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    from lab.bench import load_weights, torch_model, torch_scheme
    config = ModelConfig(scheme=scheme, **TINY)
    assert torch_scheme(config) == scheme["name"]
    m = _perturbed(config)
    rng = np.random.default_rng(2)
    tokens = rng.integers(0, 7, (3, 9))
    out = m.forward(tokens[:, :-1], tokens[:, 1:])
    grads = m.backward(out["context"])
    net = torch_model(config, 8).double()
    load_weights(net, m)
    t = torch.tensor(tokens)
    loss = F.cross_entropy(net(t[:, :-1]).reshape(-1, 7), t[:, 1:].reshape(-1))
    loss.backward()
    assert abs(out["loss"] - loss.item()) < 1e-12
    assert np.allclose(grads["embed"], net.embed.weight.grad.numpy(), rtol=1e-9, atol=1e-12)
    qkv = net.blocks[1].qkv.weight.grad.numpy().T                      # (d, 3d): [wq | wk | wv]
    assert np.allclose(grads["blocks.1.attn.wq"], qkv[:, :8], rtol=1e-9, atol=1e-12)
    assert np.allclose(grads["blocks.1.attn.wk"], qkv[:, 8:16], rtol=1e-9, atol=1e-12)
    assert np.allclose(grads["blocks.0.mlp.w1"], net.blocks[0].fc1.weight.grad.numpy().T, rtol=1e-9, atol=1e-12)
    blk = net.blocks[0]
    torch_grads = {}                                                   # the scheme's own parameters
    if scheme["name"] == "transformer-xl":
        torch_grads = {"u": blk.r_w_bias.grad, "v": blk.r_r_bias.grad, "w_r": blk.r_net.weight.grad.T}
    if scheme["name"] == "deberta":
        torch_grads = {"rel_embeddings": blk.rel_embeddings.grad}
    for name, g in torch_grads.items():
        want = g.numpy()
        assert np.abs(want).max() > 1e-6, name                         # the term is live
        assert np.allclose(grads["blocks.0.attn.scheme." + name], want, rtol=1e-9, atol=1e-12), name


def test_torch_model_takes_rope_for_the_schemes_it_does_not_implement():
    pytest.importorskip("torch")
    from lab.bench import torch_model, torch_scheme
    config = ModelConfig(scheme={"name": "alibi"}, **TINY)
    assert torch_scheme(config) == "rope"
    assert not any("r_net" in n or "rel_embeddings" in n for n, _ in torch_model(config, 8).named_parameters())


def test_torch_deberta_buckets_are_hf_and_minipos_at_the_lab_settings():
    # HF's make_log_bucket_position (float32 logs) against minipos's, at the protocol's lengths.
    torch = pytest.importorskip("torch")
    from lab import schemes
    from lab.bench import _torch_deberta_index
    from minipos import deberta
    for length in (8, 64, 128):
        spec = schemes.build(schemes.default_spec("deberta", length))
        c2p, p2c = _torch_deberta_index(torch, length, spec.position_buckets, spec.max_relative_positions,
                                        spec.att_span)
        rel = deberta.build_relative_position(length, length, bucket_size=spec.position_buckets,
                                              max_position=spec.max_relative_positions)
        want = np.clip(np.asarray(rel).reshape(length, length) + spec.att_span, 0, 2 * spec.att_span - 1)
        np.testing.assert_array_equal(c2p.numpy(), want)
        np.testing.assert_array_equal(p2c.numpy(), np.clip(2 * spec.att_span - want, 0, 2 * spec.att_span - 1))
        try:
            from transformers.models.deberta_v2.modeling_deberta_v2 import build_relative_position
        except ImportError:
            continue
        z = torch.zeros(1, length, 1)
        hf = build_relative_position(z, z, spec.position_buckets, spec.max_relative_positions)[0]
        np.testing.assert_array_equal(np.clip(hf.numpy() + spec.att_span, 0, 2 * spec.att_span - 1), want)


def test_model_is_deterministic_for_a_seed():
    a, b = Model(ModelConfig(**TINY), seed=5), Model(ModelConfig(**TINY), seed=5)
    assert all(np.array_equal(a.params[k], b.params[k]) for k in a.params)
    assert not np.array_equal(a.params["embed"], Model(ModelConfig(**TINY), seed=6).params["embed"])


def test_float32_model_keeps_float32():
    m = Model(ModelConfig(scheme={"name": "rope"}, **TINY), seed=0)
    rng = np.random.default_rng(0)
    out = m.forward(rng.integers(0, 7, (2, 4)), rng.integers(0, 7, (2, 4)))
    assert out["logits"].dtype == np.float32
    assert all(g.dtype == np.float32 for g in m.backward(out["context"]).values())


def test_learning_rate_schedule():
    kw = dict(lr=1.0, steps=110, warmup=10, min_ratio=0.1)
    assert learning_rate(0, **kw) == pytest.approx(0.1)                # first step: lr / warmup
    assert learning_rate(9, **kw) == pytest.approx(1.0)
    assert learning_rate(10, **kw) == pytest.approx(1.0)               # cosine starts at the top
    assert learning_rate(60, **kw) == pytest.approx(0.55)              # halfway: 0.1 + 0.9 * 0.5
    assert learning_rate(110, **kw) == pytest.approx(0.1)
    assert learning_rate(50, schedule="constant", **kw) == 1.0


def test_clip_by_global_norm():
    grads = {"a": np.array([3.0]), "b": np.array([[4.0]])}
    assert clip_by_global_norm(grads, 1.0) == pytest.approx(5.0)
    assert grads["a"][0] == pytest.approx(0.6, rel=1e-5) and grads["b"][0, 0] == pytest.approx(0.8, rel=1e-5)
    small = {"a": np.array([0.3])}
    clip_by_global_norm(small, 1.0)
    assert small["a"][0] == 0.3


def test_adamw_first_step_by_hand():
    # step 1: m = (1 - b1) g, v = (1 - b2) g^2, bias-corrected m/sqrt(v) = sign(g) (eps aside);
    # a matrix also decays: p <- p (1 - lr wd) - lr sign(g)
    p = {"w": np.array([[1.0, -2.0]]), "b": np.array([0.5])}
    AdamW(p, betas=(0.9, 0.99), eps=0.0, weight_decay=0.1).step({"w": np.array([[0.2, -5.0]]), "b": np.array([3.0])},
                                                                lr=0.01)
    assert np.allclose(p["w"], [[1.0 * 0.999 - 0.01, -2.0 * 0.999 + 0.01]], rtol=1e-12)
    assert np.allclose(p["b"], [0.5 - 0.01], rtol=1e-12)               # 1-D: no decay


def test_adamw_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((3, 4))
    p = {"w": w0.copy()}
    opt = AdamW(p, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    tw = torch.tensor(w0, requires_grad=True)
    topt = torch.optim.AdamW([tw], lr=0.01, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step in range(5):
        g = rng.standard_normal((3, 4))
        lr = 0.01 * (step + 1) / 5
        opt.step({"w": g}, lr)
        for group in topt.param_groups:
            group["lr"] = lr
        tw.grad = torch.tensor(g)
        topt.step()
    assert np.allclose(p["w"], tw.detach().numpy(), rtol=1e-12, atol=1e-14)


def test_copy_parameters_into_a_scaled_rope():
    from lab.model import copy_parameters
    src = Model(ModelConfig(scheme={"name": "rope"}, **TINY), seed=1)
    dst = Model(ModelConfig(scheme={"name": "rope", "scaling": {"rope_type": "linear", "factor": 2.0}}, **TINY), seed=2)
    copy_parameters(src, dst)
    assert all(np.array_equal(src.params[k], dst.params[k]) for k in src.params)
    assert np.array_equal(dst.layers[0].wq, src.params["blocks.0.attn.wq"])   # the layer itself changed
    with pytest.raises(ValueError, match="differ"):
        copy_parameters(src, Model(ModelConfig(scheme={"name": "t5"}, **TINY), seed=0))


def test_a_shared_table_is_one_parameter_that_every_layer_reads():
    """T5 computes its bias in the first layer and reuses it in every layer (HF T5: only block 0 has
    ``relative_attention_bias``): one parameter, and changing it changes every layer's bias."""
    m = Model(ModelConfig(scheme={"name": "t5", "bidirectional": False, "shared": True}, **TINY), seed=0)
    tables = [name for name in m.params if name.endswith("scheme.table")]
    assert tables == ["blocks.0.attn.scheme.table"]
    assert all(layer.scheme.table is m.params[tables[0]] for layer in m.layers)
    per_layer = Model(ModelConfig(scheme={"name": "t5", "bidirectional": False}, **TINY), seed=0)
    assert [n for n in per_layer.params if n.endswith("scheme.table")] == [
        "blocks.0.attn.scheme.table", "blocks.1.attn.scheme.table"]


def test_input_placement_adds_the_table_once_before_the_first_block():
    """With ``placement: "input"`` the blocks attend without position (NoPE) and the embedding of token
    t at position i is ``E[t] + P[i]``: set P to a known table and read it back from the first norm's input."""
    m = Model(ModelConfig(scheme={"name": "learned", "max_positions": 8, "placement": "input"}, **TINY), seed=0)
    assert all(layer.scheme.name == "nope" for layer in m.layers)
    assert [n for n in m.params if "scheme" in n] == ["input.scheme.table"]
    m.params["input.scheme.table"][...] = np.arange(8 * 8, dtype=np.float32).reshape(8, 8)
    seen = {}
    original = M.layer_norm
    try:
        M.layer_norm = lambda x, g, b: seen.setdefault("x", x.copy()) is not None and original(x, g, b)
        m.forward(np.array([[3, 3, 3]]))
    finally:
        M.layer_norm = original
    want = m.params["embed"][3][None, :] + np.arange(3 * 8, dtype=np.float32).reshape(3, 8)   # E[3] + P[0..2]
    assert np.array_equal(seen["x"][0], want)
