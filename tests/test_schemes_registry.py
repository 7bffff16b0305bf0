"""The registry of schemes (``minipos.schemes``): one list, read by the layer's exports, the tour, the
lab and the golden vectors; a new scheme registered there reaches them without editing them."""

import ast
import inspect
import re
from pathlib import Path

import numpy as np
import pytest

import minipos
from minipos import cli, layer, schemes
from minipos.alibi import alibi_slopes
from minipos.seams import Scheme

ROOT = Path(__file__).resolve().parents[1]


class LogDistance(Scheme):
    """A throwaway bias-seam scheme: ``b_h(i, j) = -m_h log(1 + |i - j|)`` with ALiBi's slopes."""

    name = "test-log-distance"
    seams = ("bias",)
    terms = ("content-content", "position-position")

    def __init__(self, *, strength: float = 1.0):
        self.strength = float(strength)

    def bind(self, layer, rng):
        super().bind(layer, rng)
        self.slopes = alibi_slopes(self.num_heads)

    def bias(self, q_positions, k_positions):
        distance = np.abs(q_positions[:, None] - k_positions[None, :])                 # (T, S)
        return -self.strength * self.slopes[:, None, None] * np.log1p(distance)        # (H, T, S)


@pytest.fixture
def registered():
    entry = schemes.register(LogDistance, example=lambda L: {"strength": 0.5},
                             config_names={"strength": "not in any checkpoint (a test scheme)"})
    try:
        yield entry
    finally:
        schemes.unregister(LogDistance.name)


def _softmax(x):
    e = np.exp(x - x.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def test_a_registered_scheme_reaches_the_layer(registered):
    assert layer.LogDistance is LogDistance and minipos.LogDistance is LogDistance   # the exports
    assert schemes.SCHEMES["test-log-distance"] is LogDistance
    scheme = schemes.build("test-log-distance", {"strength": 2.0})
    mha = layer.MultiHeadAttention(8, 2, scheme=scheme, seed=1)
    x = np.random.default_rng(0).standard_normal((1, 5, 8))
    y = mha(x, causal=True)
    # By hand, from the definition: per head, softmax(q k^T / sqrt(D) - 2 m_h log(1 + i - j)) over j <= i.
    q, k, v = (x[0] @ w for w in (mha.wq, mha.wk, mha.wv))                          # (T, H*D)
    i = np.arange(5)
    heads = []
    for h, m in enumerate(alibi_slopes(2)):
        cols = slice(4 * h, 4 * h + 4)
        logits = q[:, cols] @ k[:, cols].T / 2.0 - 2.0 * m * np.log1p(np.abs(i[:, None] - i[None, :]))
        logits[i[None, :] > i[:, None]] = -np.inf
        heads.append(_softmax(logits) @ v[:, cols])
    np.testing.assert_allclose(y[0], np.concatenate(heads, axis=1) @ mha.wo, rtol=1e-12, atol=1e-12)


def test_a_registered_scheme_reaches_the_tour(registered):
    rows = {r["scheme"]: r for r in cli.tour(d_model=16, heads=2, seq_len=8)}
    row = rows["test-log-distance"]
    assert row["config"] == "LogDistance()" and row["seams"] == ["bias"] and row["position_params"] == 0
    assert row["shift_invariant"] and row["runs_at_4x"]                                # depends on |i - j| only


def test_a_registered_scheme_reaches_the_golden_vectors(registered):
    from minipos import vectors
    for family, kind in (("layer", "y"), ("layer_grad", "x")):
        doc = vectors.build_family(family)
        case = next(c for c in doc["cases"] if c["name"] == "test_log_distance_example")
        assert case["params"]["scheme"] == "test-log-distance" and case["params"]["scheme_config"] == {"strength": 0.5}
        assert kind in case["expected"]
        assert vectors.check_document(doc) == []                              # a port can check it
    # The cases before it keep their values: the explicit cases are those of the unregistered build.
    schemes.unregister(LogDistance.name)
    try:
        plain = vectors.build_family("layer")["cases"]
    finally:
        schemes.register(LogDistance, example=lambda L: {"strength": 0.5})
    with_it = vectors.build_family("layer")["cases"]
    assert with_it[:-1] == plain and len(with_it) == len(plain) + 1


def test_every_registered_scheme_has_layer_vectors():
    """The committed spec covers every scheme of the registry (in ``layer`` or a family of its own)."""
    import json
    from minipos.vectors import layers
    covered = set()
    for family in ("layer", *layers.OWN_FAMILIES.values()):
        doc = json.loads((ROOT / "spec" / "vectors" / f"{family}.json").read_text())
        covered |= {c["params"]["scheme"] for c in doc["cases"]}
    assert set(schemes.SCHEMES) <= covered


def test_unregistered_it_is_gone():
    assert "test-log-distance" not in schemes.SCHEMES
    with pytest.raises(AttributeError, match="LogDistance"):
        layer.LogDistance                                                                 # noqa: B018
    assert "test-log-distance" not in {r["scheme"] for r in cli.tour(d_model=16, heads=2, seq_len=8)}


def test_register_refuses_what_it_cannot_hold():
    with pytest.raises(ValueError, match="registered already"):
        schemes.register(schemes.SCHEMES["alibi"])
    with pytest.raises(TypeError, match="subclass of minipos.seams.Scheme"):
        schemes.register(dict)
    with pytest.raises(ValueError, match="'stregnth' is not a keyword argument of LogDistance"):
        schemes.register(LogDistance, config_names={"stregnth": "x"})
    assert "test-log-distance" not in schemes.SCHEMES                                    # nothing half-added

    class Undefaulted(LogDistance):
        name = "test-undefaulted"

        def __init__(self, *, strength: float):
            super().__init__(strength=strength)
    with pytest.raises(ValueError, match=r"Undefaulted\(\) must build with its defaults"):
        schemes.register(Undefaulted, example=lambda L: {"strength": 0.5})
    assert "test-undefaulted" not in schemes.SCHEMES
    with pytest.raises(ValueError, match="no scheme is registered as 'nosuch'"):
        schemes.unregister("nosuch")
    with pytest.raises(ValueError, match="unknown scheme 'nosuch'"):
        schemes.build("nosuch")


def _named(name, base=LogDistance):
    return type("Named", (base,), {"name": name})


@pytest.mark.parametrize("kwargs, exc, words", [
    # names that would become a path, a case name or a command-line word they cannot be
    (dict(cls=_named("../x")), ValueError, "cls.name must be a lowercase letter"),
    (dict(cls=_named("a/b")), ValueError, "no '/'"),
    (dict(cls=_named("a\nb")), ValueError, "cls.name"),
    (dict(cls=_named("my scheme")), ValueError, "cls.name"),
    (dict(cls=_named("")), ValueError, "cls.name"),
    (dict(cls=_named("Fire")), ValueError, "cls.name"),
    (dict(cls=_named("rope+yarn")), ValueError, "'@'"),
    (dict(cls=_named("x" * 41)), ValueError, "cls.name"),
    (dict(cls=_named(3)), TypeError, "cls.name must be a str"),
    (dict(cls=type("NoName", (Scheme,), {})), ValueError, "must set its own class attribute name"),
    (dict(cls=_named("test-bad-seams", type("S", (LogDistance,), {"seams": ["bias"]}))), ValueError, "cls.seams"),
    (dict(cls=_named("test-bad-terms", type("S", (LogDistance,), {"terms": ("content-content", "x")}))), ValueError,
     "cls.terms"),
    # example: checked now, not when the tour or the vectors meet it
    (dict(example=3), TypeError, "example must be a function"),
    (dict(example="lambda L: {}"), TypeError, "example must be a function"),
    (dict(example=dict), TypeError, "example must be a function"),
    (dict(example=lambda L: [("strength", 1.0)]), TypeError, "example(1) must be a dict"),
    (dict(example=lambda L: None), TypeError, "example(1) must be a dict"),
    (dict(example=lambda L: 1 / 0), ValueError, "example(1) raised ZeroDivisionError"),
    (dict(example=lambda L: {"stregnth": 1.0}), ValueError, "example(1): 'stregnth' is not a keyword argument"),
    (dict(example=lambda L: {"strength": float("nan")}), ValueError, "example(1) must hold JSON values"),
    (dict(example=lambda L: {"strength": np.float32(1)}), ValueError, "example(1) must hold JSON values"),
    (dict(example=lambda L: {"strength": "x"}), ValueError, "example(1) = {'strength': 'x'} does not build"),
    # lab: a real bool only
    (dict(lab="no"), TypeError, "lab must be True or False"),
    (dict(lab="False"), TypeError, "lab must be True or False"),
    (dict(lab=float("nan")), TypeError, "lab must be True or False"),
    (dict(lab=1), TypeError, "lab must be True or False"),
    # config_names: a mapping of real keywords to strings
    (dict(config_names=["strength"]), TypeError, "config_names must be a mapping"),
    (dict(config_names={"strength": 3}), TypeError, "config_names['strength'] must be a non-empty str"),
    (dict(config_names={"strength": " "}), TypeError, "config_names"),
    (dict(config_names={3: "x"}), ValueError, "config_names: 3 is not a keyword argument"),
])
def test_register_checks_every_argument_and_adds_nothing_on_error(kwargs, exc, words):
    before = dict(schemes.ENTRIES)
    kwargs = {"cls": LogDistance, **kwargs}
    with pytest.raises(exc, match=re.escape(words)):
        schemes.register(kwargs.pop("cls"), **kwargs)
    assert schemes.ENTRIES == before


@pytest.mark.parametrize("call, exc, words", [
    (lambda: schemes.config_keys(3), TypeError, "cls must be a subclass"),
    (lambda: schemes.config_keys(dict), TypeError, "cls must be a subclass"),
    (lambda: schemes.build("alibi", {"symmetric": True, "slopes": 1}), ValueError,
     "config: 'slopes' is not a keyword argument of ALiBi (it takes symmetric)"),
    (lambda: schemes.build("alibi", [("symmetric", True)]), TypeError, "config must be a dict"),
    (lambda: schemes.build(3), TypeError, "name must be a str"),
    (lambda: schemes.unregister(None), TypeError, "name must be a str"),
    (lambda: schemes.class_named(3), TypeError, "class_name must be a str"),
])
def test_the_other_registry_functions_check_their_arguments(call, exc, words):
    with pytest.raises(exc, match=re.escape(words)):
        call()


def test_every_scheme_class_of_the_reference_is_registered():
    """A class that subclasses Scheme in a reference module and is not in the registry would be
    missing from the tour, the vectors and the docs. Only MLA's seams are left out, DecoupledRotary
    and Mistral 4's ScaledDecoupledRotary: they run in their own layer (the tour shows MLA as a layer
    row)."""
    found = set()
    for path in sorted((ROOT / "minipos").glob("*.py")):
        module = __import__(f"minipos.{path.stem}", fromlist=["_"])
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, Scheme) and obj.__module__ == module.__name__ and obj is not Scheme:
                found.add(obj.__name__)
    registered = {cls.__name__ for cls in schemes.SCHEMES.values()}
    assert found - registered == {"DecoupledRotary", "ScaledDecoupledRotary"}
    assert registered <= found


def test_the_lab_reads_its_schemes_from_the_registry(registered):
    from lab import schemes as lab_schemes
    assert lab_schemes.ORDER == tuple(name for name, entry in schemes.ENTRIES.items() if entry.lab)
    assert set(lab_schemes.ORDER) <= set(lab_schemes.SOURCES)        # each protocol scheme cites its configuration
    assert "test-log-distance" not in lab_schemes.ORDER               # lab=False: the protocol does not train it
    assert lab_schemes.build({"name": "t5", "num_buckets": 8}).num_buckets == 8


def test_config_names_name_real_keywords():
    for name, entry in schemes.ENTRIES.items():
        assert set(entry.config_names) <= set(schemes.config_keys(entry.cls)), name
        entry.cls(**entry.example(32))                                                  # the example builds


def test_the_scheme_list_is_written_once():
    """No other module spells out the list of scheme classes (the registry is the one list)."""
    names = {cls.__name__ for cls in schemes.SCHEMES.values()}
    for path in [ROOT / "minipos" / "layer.py", ROOT / "minipos" / "__init__.py", ROOT / "minipos" / "cli.py",
                 ROOT / "lab" / "schemes.py"]:
        text = path.read_text()
        listed = {n.id for n in ast.walk(ast.parse(text)) if isinstance(n, ast.Name) and n.id in names}
        assert len(listed) <= 1, (path.name, sorted(listed))
