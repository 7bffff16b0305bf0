"""FIRE (minipos.fire): hand-worked values, the reference PyTorch module's values and gradients, the
scheme in the layer, bad input, and proofs fed a wrong formula. The contract suite
(test_contract.py) gives FIRE the rest: finite differences, fast, cache, blockwise, golden case."""

import math

import numpy as np
import pytest

from minipos import fire
from minipos.layer import MultiHeadAttention

MLP = {"w1": np.array([[1.0]]), "b1": np.array([0.0]), "w2": np.array([[2.0, -1.0]]), "b2": np.array([-1.0, 0.5])}


def test_hand_worked_distance_and_bias():
    # c = 1: ψ(x) = log(x + 1). L = 2, queries 3 and 1, keys 0, 1, 3 (ε = 1e-6 in the denominator):
    # i = 3 > L: normaliser log 4; u(3, 0) = log 4 / log 4 = 1, u(3, 1) = log 3 / log 4, u(3, 3) = 0.
    # i = 1 < L: normaliser log 3; u(1, 0) = log 2 / log 3, u(1, 1) = 0, u(1, 3) = log 3 / log 3 (|i - j| = 2).
    u = fire.fire_distance([3, 1], [0, 1, 3], c=1.0, threshold=2.0)
    want = np.array([[math.log(4), math.log(3), 0.0], [math.log(2), 0.0, math.log(3)]])
    want /= np.array([[math.log(4) + 1e-6], [math.log(3) + 1e-6]])
    np.testing.assert_allclose(u, want, rtol=1e-15)
    # One hidden unit, ReLU(u) = u here, two heads: 2u - 1 and -u + 0.5.
    bias = fire.fire_bias(MLP["w1"], MLP["b1"], MLP["w2"], MLP["b2"], [3, 1], [0, 1, 3], c=1.0, threshold=2.0)
    np.testing.assert_allclose(bias, np.stack([2 * want - 1, -want + 0.5]), rtol=1e-14, atol=1e-15)


def test_a_negative_c_acts_as_its_absolute_value_and_keys_ahead_count_their_distance():
    # The reference's log(|c x| + 1): c = -0.5 is c = 0.5, and j > i is |i - j|.
    np.testing.assert_array_equal(fire.fire_distance([4], [1, 7], c=-0.5, threshold=1.0),
                                  fire.fire_distance([4], [7, 1], c=0.5, threshold=1.0)[:, ::-1])


def test_the_layer_adds_the_bias_to_the_logits():
    # wq = 0: the logits are the bias alone; one head: softmax over j <= i of f(u(i, j)).
    scheme = fire.FIRE(mlp_width=1, init_L=2.0)
    layer = MultiHeadAttention(2, 1, scheme=scheme)
    layer.wq = np.zeros((2, 2))
    scheme.w1, scheme.b1, scheme.w2, scheme.b2 = MLP["w1"], MLP["b1"], MLP["w2"][:, :1], MLP["b2"][:1]
    scheme.c = 1.0
    _, w = layer(np.ones((1, 4, 2)), causal=True, return_weights=True)
    u = fire.fire_distance(np.arange(4), np.arange(4), c=1.0, threshold=2.0)
    logits = np.where(np.tril(np.ones((4, 4), bool)), 2 * u - 1, -np.inf)
    np.testing.assert_allclose(w[0, 0], np.exp(logits) / np.exp(logits).sum(-1, keepdims=True), rtol=1e-12)


def test_initialisation_and_parameters_follow_the_reference():
    layer = MultiHeadAttention(8, 4, scheme=fire.FIRE(), seed=3)
    sc = layer.scheme
    shapes = {k: v.shape for k, v in sc.parameters().items()}
    assert shapes == {"w1": (1, 32), "b1": (32,), "w2": (32, 4), "b2": (4,), "c": (), "L_multiplier": ()}
    assert float(sc.c) == 0.1 and float(sc.L_multiplier) == 1.0 and sc.threshold() == 512.0
    # nn.Linear(1, 32): uniform in ±1; nn.Linear(32, H): uniform in ±1/sqrt(32)
    assert np.abs(sc.w1).max() <= 1 and np.abs(sc.w2).max() <= 1 / math.sqrt(32) and np.abs(sc.w1).max() > 0.5
    sc.c = np.float32(0.25)                                             # a scalar becomes a 0-d array
    assert isinstance(sc.c, np.ndarray) and sc.c.shape == ()


def _torch_fire(num_heads, mlp_width, init_c, init_L, eps=1e-6):
    """The reference module, as the PyTorch listing that re-implementations reproduce writes it
    (``FIRE`` in mcleish7/arithmetic ``cramming/architectures/embeddings.py``), on positions
    ``arange(T)``: returns the bias ``(1, H, T, T)`` and the module."""
    import torch

    class FIRE(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mlp = torch.nn.Sequential(torch.nn.Linear(1, mlp_width), torch.nn.ReLU(),
                                           torch.nn.Linear(mlp_width, num_heads))
            self.c = torch.nn.Parameter(torch.tensor(init_c))
            self.init_L = torch.nn.Parameter(torch.tensor(init_L), requires_grad=False)
            self.L_multiplier = torch.nn.Parameter(torch.tensor(1.0))
            self.eps = eps

        def forward(self, seq_length):
            positions = torch.arange(seq_length, dtype=self.c.dtype)   # the listing: torch.float
            rel_distance = positions[:, None] - positions[None, :]
            threshold = torch.abs(self.L_multiplier * self.init_L)
            pos_normalizer = torch.max(positions, threshold)[:, None]
            rel_distance = torch.log(torch.abs(self.c * rel_distance) + 1)
            pos_normalizer = torch.log(torch.abs(self.c * pos_normalizer) + 1) + self.eps
            normalized_distance = rel_distance / pos_normalizer
            fire_bias = self.mlp(normalized_distance.unsqueeze(-1))
            return fire_bias.unsqueeze(0).permute(0, 3, 1, 2)
    return FIRE()


def test_bias_and_gradients_equal_the_reference_pytorch_module():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    T, H, W = 12, 3, 32
    ref = _torch_fire(H, W, 0.1, 5.0).double()                         # L = 5 < T: both regimes
    with torch.no_grad():
        ref.c.fill_(0.3)
        ref.L_multiplier.fill_(-0.9)                                   # |m L0| = 4.5: the absolute value
    bias = ref(T)
    dbias = torch.from_numpy(np.random.default_rng(1).standard_normal((1, H, T, T)))
    (bias * dbias).sum().backward()
    mlp = dict(w1=ref.mlp[0].weight.detach().numpy().T, b1=ref.mlp[0].bias.detach().numpy(),
               w2=ref.mlp[2].weight.detach().numpy().T, b2=ref.mlp[2].bias.detach().numpy())
    ours = fire.fire_bias(**mlp, q_positions=np.arange(T), k_positions=np.arange(T), c=0.3, threshold=4.5)
    np.testing.assert_allclose(ours, bias.detach().numpy()[0], rtol=1e-12, atol=1e-14)
    # Through the scheme: L_multiplier's gradient is dL times d|m L0|/dm = sign(m) L0.
    layer = MultiHeadAttention(6, H, scheme=fire.FIRE(mlp_width=W, init_L=5.0))
    sc = layer.scheme
    sc.w1, sc.b1, sc.w2, sc.b2 = (mlp[k].copy() for k in ("w1", "b1", "w2", "b2"))
    sc.c, sc.L_multiplier = 0.3, -0.9
    grads = sc.bias_backward(np.arange(T), np.arange(T), dbias.numpy())
    for ours_name, theirs in (("w1", ref.mlp[0].weight.grad.T), ("b1", ref.mlp[0].bias.grad),
                              ("w2", ref.mlp[2].weight.grad.T), ("b2", ref.mlp[2].bias.grad), ("c", ref.c.grad),
                              ("L_multiplier", ref.L_multiplier.grad)):
        np.testing.assert_allclose(grads[f"scheme.{ours_name}"], theirs.numpy(), rtol=1e-10, atol=1e-12,
                                   err_msg=ours_name)


def test_a_tie_at_the_threshold_gives_the_threshold_half_the_gradient_as_torch_max_does():
    torch = pytest.importorskip("torch")
    ref = _torch_fire(1, 4, 0.2, 3.0).double()                         # L = 3 = position 3 exactly
    bias = ref(6)
    bias.sum().backward()
    mlp = dict(w1=ref.mlp[0].weight.detach().numpy().T, b1=ref.mlp[0].bias.detach().numpy(),
               w2=ref.mlp[2].weight.detach().numpy().T, b2=ref.mlp[2].bias.detach().numpy())
    g = fire.fire_bias_backward(np.ones((1, 6, 6)), **mlp, q_positions=np.arange(6), k_positions=np.arange(6),
                                c=ref.c.item(), threshold=3.0)              # float32's 0.2, as torch holds it
    np.testing.assert_allclose(g["threshold"] * 3.0, ref.L_multiplier.grad.item(), rtol=1e-10)


@pytest.mark.parametrize("call, exc, words", [
    (lambda: fire.fire_distance([-1], [0]), ValueError, "q_positions"),
    (lambda: fire.fire_distance([1], [0], threshold=-1.0), ValueError, "threshold"),
    (lambda: fire.fire_distance([1], [0], eps=0.0), ValueError, "eps"),
    (lambda: fire.fire_distance([1], [0], c=float("nan")), ValueError, "c"),
    (lambda: fire.fire_bias(np.ones((2, 4)), np.ones(4), np.ones((4, 2)), np.ones(2), [0], [0]), ValueError, "w1"),
    (lambda: fire.fire_bias(np.ones((1, 4)), np.ones(3), np.ones((4, 2)), np.ones(2), [0], [0]), ValueError, "b1"),
    (lambda: fire.fire_bias(np.ones((1, 4)), np.ones(4), np.ones((3, 2)), np.ones(2), [0], [0]), ValueError, "w2"),
    (lambda: fire.fire_bias(np.ones((1, 4)), np.ones(4), np.ones((4, 2)), np.ones(3), [0], [0]), ValueError, "b2"),
    (lambda: fire.fire_bias_backward(np.ones((3, 1, 1)), np.ones((1, 4)), np.ones(4), np.ones((4, 2)), np.ones(2),
                                     [0], [0]), ValueError, "dbias"),
    (lambda: fire.FIRE(mlp_width=0), ValueError, "mlp_width"),
    (lambda: fire.FIRE(init_L=0.0), ValueError, "init_L"),
    (lambda: fire.FIRE(init_c="0.1"), TypeError, "init_c"),
    (lambda: setattr(MultiHeadAttention(4, 2, scheme=fire.FIRE()).scheme, "c", np.ones(2)), ValueError, "c"),
])
def test_bad_input_is_refused_naming_the_argument(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_the_proofs_fail_on_a_wrong_formula(monkeypatch):
    pytest.importorskip("sympy")
    from _proof_support import proof_failure
    from proofs.core import TieMismatch
    # ψ(max(L, i)) without the threshold (the plain query position): the tie of the distance fails.
    good = fire.fire_distance
    err = proof_failure("fire.distance.unit_interval", monkeypatch, fire, "fire_distance",
                        lambda q, k, c=0.1, threshold=512.0, eps=1e-6: good(q, k, c=c, threshold=0.0, eps=eps))
    assert isinstance(err, TieMismatch) and "fire.distance.unit_interval" in str(err)
    # dc with the sign of the second term flipped: the gradient tie fails.
    real = fire.fire_bias_backward

    def wrong(*a, **k):
        g = real(*a, **k)
        return {**g, "c": -g["c"]}
    err = proof_failure("fire.backward.c_and_L", monkeypatch, fire, "fire_bias_backward", wrong)
    assert isinstance(err, TieMismatch) and "dc of a u + b" in str(err)


def test_the_tour_measures_what_the_threshold_implies():
    # The tour's example sets L = seq_len / 4: its shift of seq_len / 2 moves queries past L, where
    # the normaliser ψ(i) changes with i, so the outputs change (FIRE is relative only below L); no
    # table to outgrow, so it runs at 4x. With L past every position the same shift changes nothing.
    from minipos import cli
    row = next(r for r in cli.tour(d_model=16, heads=2, seq_len=16) if r["scheme"] == "fire")
    assert (row["shift_invariant"], row["runs_at_4x"]) == (False, True)
    assert row["position_params"] == 32 + 32 + 32 * 2 + 2 + 2               # w1, b1, w2, b2, c, L_multiplier
    layer = MultiHeadAttention(16, 2, scheme=fire.FIRE(init_L=512.0), seed=1)
    x = np.random.default_rng(2).standard_normal((1, 8, 16))
    np.testing.assert_allclose(layer(x, positions=np.arange(8) + 100, causal=True), layer(x, causal=True),
                               rtol=1e-12, atol=1e-12)
