"""A hostile campaign over minipos's surfaces, generated systematically, with every outcome classified.

    python tools/campaign.py                 every call; the counts, then each call that is not clear or accepted
    python tools/campaign.py --surface lab   only the calls of the surfaces whose name holds "lab"
    python tools/campaign.py --list          the surfaces and how many calls each makes

The surfaces: the scheme registry (``minipos.schemes``), custom schemes' seams through the reference,
blockwise, non-causal, cached and fast layers and their backward, ``minipos.vectors`` (parse, check),
``spec/check_port.py``, the conformance report, the ``minipos`` command, ``python -m proofs``,
``python -m lab`` (flags, ``--verify``, ``--summarize``, ``--text``, ``--print-commands``; nothing is
trained), ``python -m benchmarks`` (arguments only), ``safe_io`` and the docs' evidence readers
(``docs/hooks/evidence.py``).

The hostile inputs come from tables crossed with each other: wrong types, NaN and infinity,
negative, zero and huge sizes, wrong shapes, garbage returned by a seam (each seam of a custom scheme
times each kind of garbage times each path of the layer), unreadable files (missing, a directory, a
FIFO, ``/dev/zero``, deep nesting, not UTF-8, empty, truncated, above the size cap) given to every
reader, a full disk (``os.write`` monkeypatched to fail with ``ENOSPC``) under every writer, and a
closed stdout pipe under every command.

Each call is sorted into one class:

- *clear*: refused with ``ValueError``/``TypeError`` (a command: a non-zero exit and one error line,
  no traceback) whose message names the argument or the thing, and what was expected;
- *accepted*: a correct result (finite, and passing the call's check);
- *silent*: garbage accepted, a wrong result, NaN or inf produced, or a failed call that changed state;
- *crash*: a traceback, a hang (each call runs under a deadline), or an internal error type
  (``KeyError``, ``AttributeError``, ``IndexError``, ``RecursionError``, ``MemoryError``, a raw ``OSError``...);
- *vague*: refused without naming the problem, or a valid input refused.

The exit status is 0 only if there is no silent call, no crash and at most 2 % vague calls.
``tests/test_campaign_surfaces.py`` runs this campaign as a test (``test_the_hostile_campaign``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import shutil
import sys
from collections import Counter
from typing import Callable

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
for _p in (str(ROOT), str(ROOT / "spec"), str(ROOT / "spec" / "conformance")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

import check_port  # noqa: E402
import report  # noqa: E402

import minipos.fast as fast  # noqa: E402
from minipos import safe_io, schemes, vectors  # noqa: E402
from minipos.alibi import ALiBi  # noqa: E402
from minipos.cli import main as minipos_main  # noqa: E402
from minipos.layer import MultiHeadAttention  # noqa: E402
from minipos.rope_scaling import Rotary  # noqa: E402
from minipos.seams import NoPE, Scheme  # noqa: E402
from minipos.shaw import Shaw  # noqa: E402
from minipos.sinusoidal import LearnedAbsolute  # noqa: E402
from minipos.t5 import T5Bias  # noqa: E402
from minipos.transformer_xl import TransformerXL  # noqa: E402
from tools.hostile import (KINDS, WORDS, Cli, ClosedPipe, Fails, Files, Named, Ok, Quiet, Runs,  # noqa: E402
                           StateChanged, Usage, WouldTrain, benchmarks_main, classify, edited, on_full_disk,
                           proofs_main, run_main, run_process)

__all__ = ["Named", "Ok", "Usage", "Runs", "Quiet", "Cli", "build", "classify", "run", "SURFACES"]

VAGUE_SHARE = 0.02


# --------------------------------------------------------------------------- the surfaces

SURFACES: dict[str, Callable] = {}


def surface(name):
    def add(fn):
        SURFACES[name] = fn
        return fn
    return add


def _registry_unchanged(call):
    """``call()``; a call that raises must leave ``schemes.ENTRIES`` as it was; one that registers is undone."""
    def go():
        before = dict(schemes.ENTRIES)
        try:
            result = call()
        except BaseException:
            if dict(schemes.ENTRIES) != before:
                for n in set(schemes.ENTRIES) - set(before):
                    del schemes.ENTRIES[n]
                raise StateChanged("the registry changed") from None
            raise
        for n in set(schemes.ENTRIES) - set(before):
            del schemes.ENTRIES[n]
        return result
    return go


def _scheme_class(name, base=Scheme, **attrs):
    return type(f"Custom_{abs(hash(repr(name))) % 10**6}", (base,), {"name": name, **attrs})


@surface("registry")
def _registry(case, files):
    nan = float("nan")
    for label, cls, words in [
        ("None", None, "cls"), ("an int", 3, "cls"), ("a str", "rope", "cls"), ("object", object, "cls"),
        ("an instance", NoPE(), "cls"), ("Scheme itself", Scheme, "name"), ("a subclass without a name",
                                                                            type("Nameless", (Scheme,), {}), "name"),
    ]:
        case(f"register cls {label}", _registry_unchanged(lambda cls=cls: schemes.register(cls)), Named(words))
    for name in ["", "../x", "a/b", "a\nb", "my scheme", "Rope", "1abc", "x" * 41, "a+b", "a@b", "é", "-a", "a.b",
                 "a\x00b", 3, None, b"x", 1.5, ("a",), "rope", "nope", "alibi"]:
        case(f"register a class named {name!r}", _registry_unchanged(
            lambda name=name: schemes.register(_scheme_class(name))), Named("name"))
    for attr, value in [("seams", ["input"]), ("seams", ("zzz",)), ("seams", "input"), ("seams", (3,)),
                        ("seams", None), ("terms", ("zzz",)), ("terms", "content-content"), ("terms", [None])]:
        case(f"register {attr}={value!r}", _registry_unchanged(
            lambda attr=attr, value=value: schemes.register(_scheme_class("campaign-x", **{attr: value}))),
            Named(attr))
    learned = _scheme_class("campaign-learned", LearnedAbsolute)
    for label, example in [
        ("an int", 3), ("a str", "x"), ("a class", dict), ("returning a list", lambda L: [L]),
        ("returning None", lambda L: None), ("raising", lambda L: 1 / 0), ("taking no argument", lambda: {}),
        ("with an unknown key", lambda L: {"zzz": L}), ("with NaN", lambda L: {"max_positions": nan}),
        ("with an object", lambda L: {"max_positions": object()}), ("that cannot build",
                                                                    lambda L: {"max_positions": -L}),
        ("with a key that is not a str", lambda L: {1: L}), ("with a str length", lambda L: {"max_positions": "64"}),
        ("returning a float", lambda L: 1.5),
    ]:
        case(f"register example {label}", _registry_unchanged(
            lambda example=example: schemes.register(learned, example=example)), Named("example"))
    case("register example that builds", _registry_unchanged(lambda: schemes.register(
        learned, example=lambda L: {"max_positions": L})), Ok(lambda e: e.name == "campaign-learned"))
    for label, names in [("an int", 3), ("a list", ["max_positions"]), ("an unknown key", {"zzz": "a"}),
                         ("an empty value", {"max_positions": ""}), ("an int value", {"max_positions": 3}),
                         ("an int key", {3: "a"}), ("a blank value", {"max_positions": "  "})]:
        case(f"register config_names {label}", _registry_unchanged(lambda names=names: schemes.register(
            learned, example=lambda L: {"max_positions": L}, config_names=names)), Named("config_names"))
    for value in ["no", "False", "True", nan, 1, 0, None, [True], np.array([True])]:
        case(f"register lab={value!r}", _registry_unchanged(lambda value=value: schemes.register(
            _scheme_class("campaign-lab"), lab=value)), Named("lab"))
    for value in [True, False, np.bool_(True)]:
        case(f"register lab={value!r} (valid)", _registry_unchanged(lambda value=value: schemes.register(
            _scheme_class("campaign-lab"), lab=value)), Ok(lambda e, value=value: e.lab is bool(value)))
    for value, words in [(3, "name"), (None, "name"), ("zzz", "zzz"), ("", "''"), (b"rope", "name")]:
        case(f"unregister {value!r}", _registry_unchanged(lambda value=value: schemes.unregister(value)),
             Named(words))
    for name, config, words in [
        (3, None, "name"), ("zzz", None, "zzz"), ("rope", 3, "config"), ("rope", {"zzz": 1}, "zzz"),
        ("rope", [], "config"), ("rope", {"base": nan}, "base"), ("rope", {"base": -1.0}, "base"),
        ("rope", {"base": "10000"}, "base"), ("alibi", {3: 1}, "3"), ("learned", {"max_positions": 0}, "max_positions"),
("t5", {"num_buckets": -1}, "num_buckets"),
        ("t5", {"max_distance": nan}, "max_distance"), ("deberta", {"position_buckets": 1.5}, "position_buckets"),
        ("rope", {"layout": "zzz"}, "layout"), ("rope", {"scaling": 3}, "scaling"),
    ]:
        case(f"build {name!r} {config!r}", lambda name=name, config=config: schemes.build(name, config),
             Named(words))
    case("a layer of build('learned', max_positions=2**63)", lambda: MultiHeadAttention(
        DM, H, scheme=schemes.build("learned", {"max_positions": 2**63})), Named("max_positions"))
    for name in schemes.ENTRIES:
        case(f"build {name} with its example", lambda name=name: schemes.build(
            name, schemes.ENTRIES[name].example(64)), Ok(lambda s: isinstance(s, Scheme)))
    for value in [3, "rope", None, int, NoPE()]:
        case(f"config_keys {value!r}", lambda value=value: schemes.config_keys(value), Named("cls"))
    for value in [3, None, b"ALiBi"]:
        case(f"class_named {value!r}", lambda value=value: schemes.class_named(value), Named("class_name"))
    case("class_named 'ALiBi'", lambda: schemes.class_named("ALiBi"), Ok(lambda c: c is ALiBi))
    case("class_named 'zzz'", lambda: schemes.class_named("zzz"), Ok(lambda c: c is None))


# --------------------------------------------------------------------------- custom schemes' seams

B, T, DM, H = 2, 5, 8, 2
X = np.random.default_rng(0).standard_normal((B, T, DM))


def _garble(kind: str, value):
    """``value`` made into one kind of garbage."""
    if kind == "None":
        return None
    if kind == "a list":
        return value.tolist()
    if kind == "a tuple":
        return tuple(value)
    if kind == "ints":
        return value.astype(np.int64)
    if kind == "complex":
        return value.astype(np.complex128)
    if kind == "float32":
        return value.astype(np.float32)
    if kind in ("NaN", "inf"):
        out = value.copy()
        out.flat[0] = np.nan if kind == "NaN" else np.inf
        return out
    if kind == "doubled first axis":
        return np.concatenate([value, value], axis=0)
    if kind == "a row short":
        return value[..., :-1, :] if value.ndim >= 2 else value[:-1]
    if kind == "a column short":
        return value[..., :-1]
    if kind == "a 0-d array":
        return np.array(1.0)
    if kind == "a str":
        return "abc"
    raise ValueError(kind)


GARBAGE = ("None", "a list", "a tuple", "ints", "complex", "float32", "NaN", "inf", "doubled first axis",
           "a row short", "a column short", "a 0-d array", "a str")


def _garbled(base, seam: str, kind: str):
    """A subclass of ``base`` whose ``seam`` returns garbage of ``kind`` (from the right value)."""
    original = getattr(base, seam.split()[0])
    if seam in ("content_position",):
        def method(self, *a, **k):
            q_c, extra = original(self, *a, **k)
            return _garble(kind, q_c), extra
    elif seam == "content_position extra":
        def method(self, *a, **k):
            q_c, extra = original(self, *a, **k)
            return q_c, (lambda qs, ks: _garble(kind, extra(qs, ks)))
        seam = "content_position"
    elif seam == "value_position":
        def method(self, *a, **k):
            fn = original(self, *a, **k)
            return lambda qs, ks, p: _garble(kind, fn(qs, ks, p))
    else:
        def method(self, *a, **k):
            return _garble(kind, original(self, *a, **k))
    return type(f"Garbled{base.__name__}", (base,), {seam: method})


SEAM_BASES = [("embed", LearnedAbsolute, {"max_positions": 16}), ("rotate_q", Rotary, {}), ("rotate_k", Rotary, {}),
              ("bias", ALiBi, {}), ("content_position", TransformerXL, {}),
              ("content_position extra", TransformerXL, {}), ("value_position", Shaw, {"max_relative_position": 4})]


def _path(path: str, scheme):
    """One call of a layer through ``path`` with ``scheme``."""
    if path == "dense causal":
        return MultiHeadAttention(DM, H, scheme=scheme)(X, causal=True)
    if path == "non-causal":
        return MultiHeadAttention(DM, H, scheme=scheme)(X)
    if path == "blockwise":
        return MultiHeadAttention(DM, H, scheme=scheme, block_size=2)(X, causal=True)
    if path == "fast":
        return fast.MultiHeadAttention(DM, H, scheme=scheme)(X, causal=True)
    if path == "fast blockwise":
        return fast.MultiHeadAttention(DM, H, scheme=scheme, block_size=2)(X)
    if path == "cached":
        layer = MultiHeadAttention(DM, H, scheme=scheme)
        cache = layer.new_cache()
        return [layer(X[:, :2], cache=cache, causal=True), layer(X[:, 2:], cache=cache, causal=True)]
    if path == "backward":
        layer = MultiHeadAttention(DM, H, scheme=scheme)
        y, ctx = layer(X, causal=True, return_context=True)
        return layer.backward(ctx, np.ones_like(y))
    raise ValueError(path)


PATHS = ("dense causal", "non-causal", "blockwise", "fast", "fast blockwise", "cached", "backward")


def _valid_garbage(seam: str, kind: str) -> bool:
    """Whether a seam may return this (``None`` is no bias and no extra logits; a 0-d or a row short
    bias broadcasts; a float32 bias is a floating array that broadcasts)."""
    if seam == "bias":
        return kind in ("None", "a 0-d array", "float32")
    if seam == "content_position extra":
        return kind in ("a 0-d array", "float32")
    if seam == "value_position":       # a floating term of another precision is cast, as a bias is
        return kind == "float32"
    return False


@surface("seams")
def _seams(case, files):
    for seam, base, config in SEAM_BASES:
        for kind in GARBAGE:
            cls = _garbled(base, seam, kind)
            for path in PATHS:
                if path in ("cached",) and base is Shaw:
                    continue
                expect = (Ok(lambda r: True) if _valid_garbage(seam, kind)
                          else Named((cls.__name__, seam.split()[0])))
                if (seam, kind, path) == ("content_position extra", "a 0-d array", "backward"):
                    expect = Named("dout")   # the forward broadcasts it; TransformerXL's backward wants full blocks
                case(f"seam {seam} returns {kind}, {path}",
                     lambda cls=cls, config=config, path=path: _path(path, cls(**config)), expect)
    # backward seams
    for seam, base, config, kinds in [
        ("embed_backward", LearnedAbsolute, {"max_positions": 16}, GARBAGE),
        ("rotate_q_backward", Rotary, {}, GARBAGE), ("rotate_k_backward", Rotary, {}, GARBAGE),
        ("content_position_backward", TransformerXL, {}, GARBAGE),
    ]:
        for kind in kinds:
            cls = _garbled(base, seam, kind)
            case(f"seam {seam} returns {kind}", lambda cls=cls, config=config: _path("backward", cls(**config)),
                 Named((cls.__name__, seam)))
    for label, grads in [("a list", [np.zeros((32, 2))]), ("None", None), ("an unknown key", {"scheme.zzz": 0}),
                         ("a wrong shape", {"scheme.table": np.zeros((3, 3))}),
                         ("NaN", {"scheme.table": np.full((32, 2), np.nan)}), ("a str", "x"),
                         ("ints", {"scheme.table": np.zeros((32, 2), np.int64)})]:
        cls = type("BadBiasBackward", (T5Bias,), {"bias_backward": lambda self, *a, grads=grads: grads})
        case(f"seam bias_backward returns {label}", lambda cls=cls: _path("backward", cls()),
             Named(("BadBiasBackward", "bias_backward")))
    for value in [0, -1, 0.0, float("nan"), float("inf"), "x", None, 1j, True, np.array([0.5]), [0.5]]:
        cls = type("BadScale", (NoPE,), {"scale": lambda self, d, value=value: value})
        for path in ("dense causal", "blockwise", "fast", "backward"):
            case(f"seam scale returns {value!r}, {path}", lambda cls=cls, path=path: _path(path, cls()),
                 Named(("BadScale", "scale")))
    for value in [0.5, np.float64(0.5), 2]:
        cls = type("OddScale", (NoPE,), {"scale": lambda self, d, value=value: value})
        case(f"seam scale returns {value!r} (valid)", lambda cls=cls: _path("dense causal", cls()),
             Ok(lambda y: y.shape == (B, T, DM)))
    for label, scheme in [("a class", NoPE), ("a str", "rope"), ("an int", 3), ("a dict", {})]:
        case(f"MultiHeadAttention scheme {label}", lambda scheme=scheme: MultiHeadAttention(DM, H, scheme=scheme),
             Named("scheme"))
    case("one scheme instance in two layers", lambda: [MultiHeadAttention(DM, H, scheme=s) for s in [NoPE()] * 2],
         Named("layer"))


# --------------------------------------------------------------------------- readers x hostile files

def _no_training(*args, **kwargs):
    raise WouldTrain("the command line was accepted and would train a model")


@contextlib.contextmanager
def never_training():
    """``python -m lab`` in this process with its runners replaced: a command line that would train raises
    ``WouldTrain`` (classified as a crash, or as silent where an error was expected) instead."""
    import lab.__main__ as lm
    saved = lm.run_one, lm.run_all
    lm.run_one = lm.run_all = _no_training
    try:
        yield
    finally:
        lm.run_one, lm.run_all = saved


def _lab_main(argv, cwd=None):
    from lab.__main__ import main
    with never_training():
        return run_main(main, argv, cwd=cwd)


def _evidence():
    sys.path.insert(0, str(ROOT))
    from docs.hooks import evidence
    return evidence


def _records_dir(files, kind: str, name: str = "markov-rope-s0.json") -> pathlib.Path:
    directory = files.fresh("records")
    files.make(kind, name, directory)
    return directory


def _rope_failed(out: str, words: str) -> bool:
    """Whether ``vectors check``'s report fails rope alone, on a line naming rope.json and ``words``."""
    failed = [line for line in out.splitlines() if "FAIL" in line and not line.startswith("FAILED")]
    return (len(failed) == 1 and "rope" in failed[0] and "Traceback" not in out
            and (words in out or not words) and ("rope.json" in out or "rope" in out))


def _spec_with(files, kind: str, name: str) -> pathlib.Path:
    """A copy of the shipped spec whose ``name`` is a file of ``kind`` (a copy: check refuses symbolic links)."""
    directory = files.fresh("spec")
    for path in (ROOT / "spec" / "vectors").iterdir():
        if path.name != name:
            shutil.copy(path, directory / path.name)
    files.make(kind, name, directory)
    return directory


def _result_dir(files, kind: str) -> pathlib.Path:
    directory = files.fresh("results")
    (directory / "torch").mkdir()
    files.make(kind, "rope__rope.json", directory / "torch")
    return directory


def _summary_dir(files, kind: str) -> pathlib.Path:
    directory = files.fresh("evidence")
    files.make(kind, "summary.json", directory)
    return directory


@surface("readers")
def _readers(case, files):
    from lab import record as lab_record
    from lab.tasks import TextSource

    def named(kind, *more):
        words = tuple(w for w in (WORDS[kind], *more) if w)
        return words

    for kind in KINDS:
        missing = kind == "missing"
        json_ok = kind == "a list"
        # safe_io, the root of every reader
        case(f"safe_io.read_json {kind}", lambda kind=kind: safe_io.read_json(files.make(kind)),
             Ok(lambda r: r == [1, 2, 3]) if json_ok else
             Named(named(kind, "file.json"), (FileNotFoundError,) if missing else (ValueError, TypeError)))
        # minipos.vectors
        case(f"vectors.check a rope.json that is {kind}", lambda kind=kind: vectors.check(
            _records_dir(files, kind, "rope.json"), ["rope"]),
            Ok(lambda r: r and all("rope" in str(m) for m in r)))
        case(f"minipos vectors check a spec whose rope.json is {kind}", lambda kind=kind: run_main(
            minipos_main, ["vectors", "check", str(_spec_with(files, kind, "rope.json"))]),
            Fails(lambda out, err, kind=kind: _rope_failed(out, "" if kind == "/dev/zero" else WORDS[kind])))  # a link: refused as one   # one line a family, rope's says why
        # check_port
        case(f"check_port.load_family a file that is {kind}", lambda kind=kind: check_port.load_family(
            "rope", str(_records_dir(files, kind, "rope.json"))),
            Named(named(kind, "rope.json") if not missing else ("'rope'",), (FileNotFoundError, ValueError, TypeError)))
        # the conformance report
        case(f"conformance report of a result that is {kind}", lambda kind=kind: report.load_results(
            str(_result_dir(files, kind))),
            Named(("rope__rope.json",) if not missing else ("holds no result",), (FileNotFoundError, ValueError,
                                                                                TypeError)))
        # the lab: a record
        case(f"lab record.read {kind}", lambda kind=kind: lab_record.read(files.make(kind)),   # the caller names the file
             Named(named(kind, "file.json") if missing else named(kind), (FileNotFoundError, ValueError, TypeError)))
        case(f"lab --verify a record that is {kind}", lambda kind=kind: _lab_main(
            ["--verify", str(files.make(kind, "markov-rope-s0.json"))]), Usage(named(kind, "markov-rope-s0.json")))
        case(f"lab --summarize a record that is {kind}", lambda kind=kind: _lab_main(
            ["--summarize", "--out", str(_records_dir(files, kind))]),
            Usage(("no records",)) if missing else Usage(named(kind, "markov-rope-s0.json")))
        text = kind == "deep nesting"           # UTF-8 text long enough for the lab's sequences: a corpus
        case(f"lab --text a file that is {kind}", lambda kind=kind: _lab_main(
            ["--text", str(files.make(kind, "text.txt")), "--print-commands", "--schemes", "rope", "--seeds", "0"]),
            Runs(lambda out, err: "--text" in out) if text else Usage(("--text", "text.txt")))
        case(f"lab TextSource of a file that is {kind}", lambda kind=kind: TextSource(files.make(kind, "t.txt")),
             Ok(lambda t: t.symbols >= 64) if kind in ("deep nesting", "NUL bytes") else Named(("t.txt",), (FileNotFoundError, ValueError, TypeError)))
        # the docs' evidence readers
        case(f"evidence.summary of a file that is {kind}", lambda kind=kind: _evidence().summary(
            _summary_dir(files, kind)), Named(("summary.json",), (_evidence().EvidenceError,)))
        case(f"evidence.record of a file that is {kind}", lambda kind=kind: _evidence().record(
            "markov", "rope", 0, _records_dir(files, kind)), Named(("markov-rope-s0.json",),
                                                                   (_evidence().EvidenceError,)))


# --------------------------------------------------------------------------- python -m lab

def _lab_tables():
    import lab.__main__ as lm
    return lm.AT_LEAST, lm.FLOATS, lm.CHOICES


LAB_SLICE = ["--tasks", "markov", "--schemes", "rope", "--seeds", "0", "--print-commands"]


@surface("lab")
def _lab(case, files):
    at_least, floats, choices = _lab_tables()
    for name, least in at_least.items():
        flag = "--" + name.replace("_", "-")
        bad = ["abc", "1.5", str(least - 1), "", "nan", "1e3"]
        if name in ("seeds", "eval_factors"):
            bad += ["1,,", "2,1" if name == "eval_factors" else "0,0"]
        for value in bad:
            case(f"lab {flag} {value!r}", lambda flag=flag, value=value: _lab_main([flag, value]),
                 Usage((flag,)))
    for name, (low, high, excluded) in floats.items():
        flag = "--" + name.replace("_", "-")
        bad = ["nan", "inf", "-inf", "abc", "1e400", str(low - 1)] + ([str(low)] if excluded else []) + \
              ([str(high + 1)] if high is not None else [])
        for value in bad:
            case(f"lab {flag} {value!r}", lambda flag=flag, value=value: _lab_main([flag, value]), Usage((flag,)))
    for name in choices:
        flag = "--" + name.replace("_", "-")
        for value in ("zzz", "", "LAYERNORM"):
            case(f"lab {flag} {value!r}", lambda flag=flag, value=value: _lab_main([flag, value]), Usage((flag,)))
    for label, argv, expect in [
        ("an unknown flag", ["--zzz"], Usage("--zzz")),
        ("--tasks zzz", ["--tasks", "zzz"], Usage("--tasks")),
        ("--schemes zzz", ["--schemes", "zzz"], Usage("--schemes")),
        ("--schemes ../x", ["--schemes", "../x"], Usage("--schemes")),
        ("--seeds twice", ["--seeds", "0", "--seeds", "1"], Usage("--seeds")),
        ("--out ''", ["--out", ""], Usage("--out")),
        ("--out a file", ["--out", str(ROOT / "README.md"), *LAB_SLICE], Usage("--out")),
        ("--out under a file", ["--out", str(ROOT / "README.md" / "x"), *LAB_SLICE], Usage("--out")),
        ("--out /dev/null", ["--out", "/dev/null", *LAB_SLICE], Usage("--out")),
        ("--verify ''", ["--verify", ""], Usage("--verify")),
        ("--verify with --quick", ["--verify", "x.json", "--quick"], Usage("--verify")),
        ("--verify twice the same", ["--verify", "x.json", "./x.json"], Usage("more than once")),
        ("--summarize with --seeds", ["--summarize", "--seeds", "0"], Usage("--summarize")),
        ("--summarize a missing --out", ["--summarize", "--out", "/nonexistent/x"], Usage("--out")),
        ("--summarize an --out that is a file", ["--summarize", "--out", str(ROOT / "README.md")], Usage("--out")),
        ("--text with --tasks markov", ["--text", str(ROOT / "README.md"), "--tasks", "markov"], Usage("--text")),
        ("--text a short file", ["--text", str(_short_text(files)), *LAB_SLICE[2:]], Usage("--text")),
        ("--d-model 10**6", ["--d-model", "1000000", *LAB_SLICE], Usage("memory")),
        ("--length 10**7", ["--length", "10000000", *LAB_SLICE], Usage("memory")),
        ("--batch 10**12", ["--batch", "1000000000000", *LAB_SLICE], Usage("--batch")),
        ("--eval-factors 1,10**9", ["--eval-factors", "1,1000000000", *LAB_SLICE], Usage("memory")),
        ("--vocab 10**6 --order 5", ["--vocab", "1000000", "--order", "5", *LAB_SLICE], Usage("--vocab")),
        ("--num-heads 3 of 64", ["--num-heads", "3", "--d-model", "64", *LAB_SLICE], Usage("num_heads")),
        ("--length 2**70", ["--length", str(2**70), *LAB_SLICE], Usage("--length")),
        ("--steps 10**30", ["--steps", str(10**30), *LAB_SLICE], Usage("--steps")),
        ("--seeds 2**70", ["--seeds", str(2**70), *LAB_SLICE[:4], "--print-commands"], Usage("--seeds")),
        ("--print-commands a slice", LAB_SLICE, Runs(lambda out, err: out.count("python -m lab") == 1)),
        ("--print-commands quick", ["--quick", "--print-commands", "--schemes", "rope"],
         Runs(lambda out, err: out.count("python -m lab") == 2)),
        ("--help", ["--help"], Runs(lambda out, err: "--verify" in out)),
    ]:
        case(f"lab {label}", lambda argv=argv: _lab_main(argv), expect)
    # records a summary must refuse: a seed twice, an unknown task, a record whose name lies
    for label, edit, words in [
        ("a copy named for another seed", lambda d: shutil.copy(d / "markov-rope-s0.json", d / "markov-rope-s1.json"),
         "markov-rope-s1.json"),
        ("an unknown task", lambda d: _edit_record(d / "markov-rope-s0.json", lambda r: r["task"].update(name="zzz")),
         "zzz"),
        ("a task name that disagrees with its settings", lambda d: _edit_record(
            d / "markov-rope-s0.json", lambda r: r["settings"].update(task="text")), "task"),
        ("a seed that disagrees with its settings", lambda d: _edit_record(
            d / "markov-rope-s0.json", lambda r: r.update(seed=7)), "seed"),
        ("a record named for another scheme", lambda d: shutil.move(d / "markov-rope-s0.json",
                                                                    d / "markov-alibi-s5.json"), "markov-alibi-s5"),
        ("a record whose metric is NaN as a string", lambda d: _edit_record(d / "markov-rope-s0.json", lambda r: r[
            "results"]["base"]["lengths"][0].update(excess="NaN")), "excess"),
        ("a record whose seconds are inf", lambda d: (d / "markov-rope-s0.json").write_text(
            (d / "markov-rope-s0.json").read_text().replace('"seconds": ', '"seconds": 1e999, "x": ', 1)), "1e999"),
    ]:
        case(f"lab --summarize {label}", lambda edit=edit: _lab_main(["--summarize", "--out", str(
            _real_records(files, edit))]), Usage(words))
    case("lab --summarize real records", lambda: _lab_main(["--summarize", "--out", str(_real_records(files))]),
         Runs(lambda out, err: "markov" in out and not err))
    case("lab --summarize onto a full disk", on_full_disk(lambda: _lab_main(
        ["--summarize", "--out", str(_real_records(files))])), Usage("No space left on device"))
    case("lab --print-commands onto a full --out", on_full_disk(lambda: _lab_main(
        ["--out", str(files.fresh()), *LAB_SLICE])), Usage(("--out", "No space left on device")))
    case("lab record.write_json onto a full disk", on_full_disk(lambda: _lab_record().write_json(
        files.fresh() / "x.json", {"a": 1})), Named("No space left on device", (OSError,)))
    case("lab --verify a damaged record beside a /dev/zero one", lambda: _lab_main(
        ["--verify", str(files.make("truncated", "a.json")), str(files.make("/dev/zero", "b.json"))]),
        Fails(lambda out, err: len(out.splitlines()) == 2 and "a.json: failed: not valid JSON" in out
              and "b.json: failed: is not a regular file (a character device)" in out))
    case("lab summary of one record twice", lambda: _summary_module().summarize(
        [_lab_record().read(ROOT / "lab" / "results" / "full" / "markov-rope-s0.json")] * 2),
        Named(("more than once", "markov-rope-s0")))
    case("lab summary of a record of an unknown task", lambda: _summary_module().summarize(
        [edited(_lab_record().read(ROOT / "lab" / "results" / "full" / "markov-rope-s0.json"),
                 lambda r: r["task"].update(name="zzz"))]), Named("zzz"))
    for label, command in [("not a lab command", "rm -rf /"), ("an unknown variable", "FOO=1 python -m lab --out x"),
                           ("no --out", "python -m lab --tasks markov"), ("a shell quote left open", "python -m lab '")]:
        case(f"lab --verify a record whose command is {label}", lambda command=command: _lab_main(
            ["--verify", str(_real_records(files, lambda d: _edit_record(
                d / "markov-rope-s0.json", lambda r: r.update(command=command))) / "markov-rope-s0.json")]),
            Usage("command"))


def _summary_module():
    from lab import summary
    return summary


def _lab_record():
    from lab import record
    return record


def _short_text(files) -> pathlib.Path:
    path = files.fresh() / "short.txt"
    path.write_text("abc" * 30)
    return path


def _edit_record(path, edit):
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc))


def _real_records(files, edit=None) -> pathlib.Path:
    directory = files.fresh("records")
    for seed in (0, 1):
        shutil.copy(ROOT / "lab" / "results" / "full" / f"markov-rope-s{seed}.json", directory)
    if edit is not None:
        edit(directory)
    return directory


# --------------------------------------------------------------------------- the docs' evidence readers

@surface("evidence")
def _evidence_surface(case, files):
    ev = _evidence()
    E = (ev.EvidenceError,)
    full = ev.FULL
    for label, call, expect in [
        ("cell of an unknown task", lambda: ev.cell("zzz", "rope", 64), Named("zzz", E)),
        ("cell of an unknown row", lambda: ev.cell("markov", "zzz", 64), Named("zzz", E)),
        ("cell of a task that is an int", lambda: ev.cell(3, "rope", 64), Named("task", E + (TypeError,))),
        ("cell of a row that is None", lambda: ev.cell("markov", None, 64), Named("row", E + (TypeError,))),
        ("cell at a length not measured", lambda: ev.cell("markov", "rope", 7), Named("7", E)),
        ("cell at length -1", lambda: ev.cell("markov", "rope", -1), Named("-1", E)),
        ("cell at a str length", lambda: ev.cell("markov", "rope", "64"), Named("length", E + (TypeError,))),
        ("cell at length 64.0", lambda: ev.cell("markov", "rope", 64.0), Named("length", E + (TypeError,))),
        ("cell at length NaN", lambda: ev.cell("markov", "rope", float("nan")), Named("length", E + (TypeError,))),
        ("cell at length True", lambda: ev.cell("markov", "rope", True), Named("length", E + (TypeError,))),
        ("cell where a str", lambda: ev.cell("markov", "rope", 64, str(full)), Named("where", E + (TypeError,))),
        ("cell where missing", lambda: ev.cell("markov", "rope", 64, pathlib.Path("/nonexistent")),
         Named("summary.json", E)),
        ("cell where a file", lambda: ev.cell("markov", "rope", 64, ROOT / "README.md"), Named("README.md", E)),
        ("offsets of an unknown row", lambda: ev.offsets("zzz", 64), Named("zzz", E)),
        ("offset_cell of an unknown offset", lambda: ev.offset_cell("rope", 64, 10**9), Named("1000000000", E)),
        ("offset_cell of a str offset", lambda: ev.offset_cell("rope", 64, "1"), Named("offset", E + (TypeError,))),
        ("entropy of an unknown task", lambda: ev.entropy("zzz", "rope", 64), Named("zzz", E)),
        ("spread at a missing length", lambda: ev.spread("markov", "rope", 3), Named("3", E)),
        ("seen at a missing offset", lambda: ev.seen(64, 10**9), Named("1000000000", E)),
        ("record of an unknown task", lambda: ev.record("zzz", "rope"), Named("zzz", E)),
        ("record of a scheme ../x", lambda: ev.record("markov", "../x"), Named("../x", E + (ValueError,))),
        ("record of seed -1", lambda: ev.record("markov", "rope", -1), Named("-1", E + (ValueError,))),
        ("record of seed 'x'", lambda: ev.record("markov", "rope", "x"), Named("seed", E + (TypeError,))),
        ("setting zzz", lambda: ev.setting("zzz"), Named("zzz", E)),
        ("setting of task zzz", lambda: ev.setting("length", "zzz"), Named("zzz", E)),
        ("attention_distance at a missing length", lambda: ev.attention_distance("markov", "rope", 3), Named("3", E)),
        ("position_loss of an unknown scheme", lambda: ev.position_loss("markov", "zzz", 64), Named("zzz", E)),
        ("position_loss of an unknown variant", lambda: ev.position_loss("markov", "rope", 64, "zzz"),
         Named("zzz", E)),
        ("position_change of bins that are not whole", lambda: ev.position_change("markov", "rope", 64, (0, 1), (1, 3)),
         Named("bins", E)),
        ("position_change before a str", lambda: ev.position_change("markov", "rope", 64, "ab", (0, 8)),
         Named("before", E + (TypeError,))),
        ("paired_change of one directory twice", lambda: ev.paired_change("markov", "rope", 64, full, full),
         Ok(lambda c: c.mean == 0)),
        ("paired_change where a str", lambda: ev.paired_change("markov", "rope", 64, str(full), str(full)),
         Named("before", E + (TypeError,))),
        ("history of an unknown task", lambda: ev.history("zzz", "rope", 64), Named("zzz", E)),
        ("history at a missing length", lambda: ev.history("markov", "rope", 3), Named("3", E)),
        ("twice_change of an unknown task", lambda: ev.twice_change("zzz", "rope", 64), Ok(lambda r: r is None)),
        ("ordered of None", lambda: ev.ordered(None, None, "x"), Named("cannot run", E)),
        ("ordered of floats", lambda: ev.ordered(1.0, 2.0, "x"), Named("Cell", E + (TypeError,))),
        ("resolved of NaN cells", lambda: ev.resolved(ev.Cell(float("nan"), 0.1, 3), ev.Cell(1.0, 0.1, 3)),
         Named("Cell.mean", E + (ValueError,))),
        ("claim of a str", lambda: ev.claim("yes", "x"), Named("holds", E + (TypeError,))),
        ("recorded of a str", lambda: ev.recorded("rope"), Named("names", E + (TypeError,))),
        ("present of a task zzz", lambda: ev.present("zzz", ["rope"]), Named("zzz", E)),
        ("ready of a task zzz", lambda: ev.ready("zzz", ["rope"]), Named("zzz", E)),
    ]:
        case(f"evidence {label}", call, expect)
    # damaged summary cells, each read by cell()
    for label, raw, words in [
        ("a NaN string mean", {"mean": "NaN", "sd": 0.1, "se": 0.1, "n": 3}, "mean"),
        ("a null mean", {"mean": None, "se": 0.1, "n": 3}, "mean"),
        ("a bool mean", {"mean": True, "se": 0.1, "n": 3}, "mean"),
        ("n zero", {"mean": 1.0, "se": 0.1, "n": 0}, "n"),
        ("n a str", {"mean": 1.0, "se": 0.1, "n": "3"}, "n"),
        ("n 2.5", {"mean": 1.0, "se": 0.1, "n": 2.5}, "n"),
        ("a negative se", {"mean": 1.0, "se": -0.1, "n": 3}, "se"),
        ("an se that is a str", {"mean": 1.0, "se": "0.1", "n": 3}, "se"),
        ("a negative sd", {"mean": 1.0, "sd": -0.3, "n": 3}, "sd"),
        ("one seed without se", {"mean": 1.0, "n": 1}, "standard error"),
        ("a list", [1.0, 2.0], "mean"),
        ("a str", "cannot", "mean"),
        ("a number", 1.0, "mean"),
        ("an empty object", {}, "mean"),
    ]:
        case(f"evidence cell of a summary with {label}", lambda raw=raw: ev.cell(
            "markov", "rope", 64, _damaged_summary(files, raw)), Named(words, E))
    for label, edit, words in [
        ("rows a list", lambda s: s["markov"].update(rows=[]), "rows"),
        ("no rows", lambda s: s["markov"].pop("rows"), "rows"),
        ("a task a str", lambda s: s.update(markov="x"), "markov"),
        ("seeds a str", lambda s: s["markov"]["rows"]["rope"].update(seeds="012"), "seeds"),
        ("converged a str", lambda s: s["markov"]["rows"]["rope"].update(converged="3"), "converged"),
        ("the whole file a list", None, "summary"),
    ]:
        case(f"evidence usable of a summary with {label}", lambda edit=edit: ev.usable(
            "markov", "rope", _edited_summary(files, edit)), Named(words, E))
    case("evidence cell of a summary with lengths a list", lambda: ev.cell("markov", "rope", 64, _edited_summary(
        files, lambda s: s["markov"]["rows"]["rope"].update(lengths=[1]))), Named("lengths", E))
    for label, edit, words in [
        ("a seed twice", lambda s: s["markov"]["rows"]["rope"].update(seeds=[0, 0, 1]), "seed"),
        ("seeds not ints", lambda s: s["markov"]["rows"]["rope"].update(seeds=["0", 1]), "seed"),
    ]:
        case(f"evidence seeds of a summary with {label}", lambda edit=edit: ev.seeds(
            "markov", "rope", _edited_summary(files, edit)), Named(words, E))


def _damaged_summary(files, raw) -> pathlib.Path:
    def edit(s):
        s["markov"]["rows"]["rope"]["lengths"]["64"] = raw
    return _edited_summary(files, edit)


def _edited_summary(files, edit) -> pathlib.Path:
    directory = files.fresh("evidence")
    doc = json.loads((_evidence().FULL / "summary.json").read_text())
    if edit is None:
        doc = [doc]
    else:
        edit(doc)
    (directory / "summary.json").write_text(json.dumps(doc))
    return directory


# --------------------------------------------------------------------------- the other commands

@surface("commands")
def _commands(case, files):
    for flag in ("--d-model", "--heads", "--seq-len", "--seed"):
        for value in ("0", "-1", "abc", "1e400", "99999999999999999999", "", "nan", "1.5"):
            if flag == "--seed" and value == "0":
                continue
            case(f"minipos tour {flag} {value!r}", lambda flag=flag, value=value: run_main(
                minipos_main, ["tour", flag, value]), Usage(flag))
    for label, argv, expect in [
        ("minipos with no command", [], Runs(lambda out, err: "minipos tour" in out)),   # its help
        ("minipos zzz", ["zzz"], Usage("zzz")),
        ("minipos tour --d-model 6 --heads 4", ["tour", "--d-model", "6", "--heads", "4"], Usage("--heads")),
        ("minipos vectors check a family zzz", ["vectors", "check", str(ROOT / "spec" / "vectors"), "zzz"],
         Usage("zzz")),
        ("minipos vectors export ''", ["vectors", "export", ""], Usage("directory")),
        ("minipos vectors export into a file", ["vectors", "export", str(ROOT / "README.md")], Usage("README.md")),
        ("proofs zzz", ["zzz"], Usage("zzz")),
        ("proofs alibi zzz", ["alibi", "zzz"], Usage("zzz")),
        ("proofs --zzz", ["--zzz"], Usage("--zzz")),
        ("proofs ''", [""], Usage("''")),
        ("proofs ../x", ["../x"], Usage("../x")),
        ("benchmarks --zzz", ["--zzz"], Usage("--zzz")),
        ("benchmarks a word", ["rope"], Usage("rope")),
        ("benchmarks --quick=1", ["--quick=1"], Usage("--quick")),
    ]:
        main = proofs_main() if label.startswith("proofs") else (
            benchmarks_main() if label.startswith("benchmarks") else minipos_main)
        case(label, lambda main=main, argv=argv: run_main(main, argv), expect)
    case("minipos vectors export onto a full disk", on_full_disk(lambda: run_main(
        minipos_main, ["vectors", "export", str(files.fresh() / "out")])),
        Usage("No space left on device"))
    case("vectors.export onto a full disk leaves nothing", lambda: _export_full_disk(files), Ok(lambda r: r == []))
    case("conformance write_json onto a full disk", on_full_disk(lambda: _conformance_run().write_json(
        str(files.fresh() / "x.json"), {"a": 1})), Named("No space left on device", (OSError,)))
    case("safe_io.write_atomic onto a full disk", on_full_disk(lambda: safe_io.write_atomic(
        files.fresh() / "x", b"abc")), Named("No space left on device", (OSError,)))
    for label, args in [
        ("python -m lab --help", ["-m", "lab", "--help"]),
        ("python -m lab --print-commands", ["-m", "lab", *LAB_SLICE]),
        ("python -m lab --summarize", ["-m", "lab", "--summarize", "--out", "lab/results/full"]),
        ("python -m minipos --help", ["-m", "minipos", "--help"]),
        ("python -m proofs --help", ["-m", "proofs", "--help"]),
        ("python -m benchmarks --help", ["-m", "benchmarks", "--help"]),
        ("python -m lab.corpus --help", ["-m", "lab.corpus", "--help"]),
    ]:
        case(f"{label} into a closed pipe", lambda args=args: run_process(args, close_stdout=True), Quiet())
    case("lab --print-commands to a closed stdout here", lambda: _lab_closed(LAB_SLICE), Quiet())
    case("lab --summarize to a closed stdout here", lambda: _lab_closed(
        ["--summarize", "--out", str(_real_records(files))]), Quiet())
    case("lab --help onto /dev/full", lambda: _lab_dev_full(["--help"]), Usage("No space left on device"))
    case("lab --print-commands onto /dev/full", lambda: _lab_dev_full(LAB_SLICE), Usage("No space left on device"))


def _lab_closed(argv) -> Cli:
    from lab.__main__ import main
    with never_training():
        return run_main(main, argv, stdout=ClosedPipe())


def _lab_dev_full(argv) -> Cli:
    from lab.__main__ import main
    with open("/dev/full", "w") as full, never_training():
        return run_main(main, argv, stdout=full)


def _conformance_run():
    import importlib
    return importlib.import_module("run")


def _export_full_disk(files):
    out = files.fresh() / "out"
    try:
        on_full_disk(lambda: vectors.export(out, ["alibi_slopes"]))()
    except OSError:
        pass
    return sorted(p.name for p in out.iterdir()) if out.exists() else []


# --------------------------------------------------------------------------- running the campaign

def build(selected=None) -> list:
    """Every call of the campaign: ``(surface, label, call, expect)``."""
    files = Files()
    cases = []
    for name, make in SURFACES.items():
        if selected and not any(s in name for s in selected):
            continue
        make(lambda label, call, expect, name=name: cases.append((name, label, call, expect)), files)
    return cases


def run(selected=None, *, out=sys.stdout, seconds: int = 60) -> Counter:
    counts, by_surface = Counter(), {}
    for name, label, call, expect in build(selected):
        kind, detail = classify(call, expect, seconds)
        counts[kind] += 1
        by_surface.setdefault(name, Counter())[kind] += 1
        if kind not in ("clear", "accepted"):
            print(f"{kind:7s} [{name}] {label}: {' '.join(detail.split())[:300]}", file=out, flush=True)
    total = sum(counts.values())
    for name, c in by_surface.items():
        print(f"  {name:10s} {sum(c.values()):4d} calls  " + "  ".join(f"{k} {c[k]}" for k in
              ("clear", "accepted", "silent", "crash", "vague")), file=out)
    print(f"{total} calls: " + ", ".join(f"{k} {counts[k]}" for k in ("clear", "accepted", "silent", "crash", "vague"))
          + f"; vague {100 * counts['vague'] / max(total, 1):.1f} %", file=out)
    return counts


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python tools/campaign.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--surface", action="append", help="run only the surfaces whose name holds this (repeatable)")
    p.add_argument("--list", action="store_true", help="list the surfaces and their number of calls")
    p.add_argument("--deadline", type=int, default=30, help="seconds a call may take before it counts as a hang")
    args = p.parse_args(argv)
    if args.list:
        for name, c in Counter(c[0] for c in build(args.surface)).items():
            print(f"{name:10s} {c}")
        return 0
    counts = run(args.surface, seconds=args.deadline)
    total = sum(counts.values())
    bad = counts["silent"] or counts["crash"] or counts["vague"] > VAGUE_SHARE * total
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
