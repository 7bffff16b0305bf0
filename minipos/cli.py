"""The ``minipos`` command.

``minipos tour`` builds every position scheme, runs one input through a full
``MultiHeadAttention`` forward pass with each, and prints a comparison computed live:

- seams: where the scheme enters attention (from the scheme object);
- params: learned position parameters for the given d_model and heads (counted from the arrays);
- terms: which of the four content/position expansion terms the logits keep;
- shift-invariant given the mask: whether the outputs are unchanged when every position moves by
  the same offset (measured on the first half of the input moved by half the training length, so
  that every position stays inside a learned table: max |y(p) - y(p + offset)|). The shifted input
  still starts the sequence under the same causal mask, so the test cannot see the absolute
  position a causal model reads from the mask: NoPE passes it and can still count positions;
- runs at 4x: whether the layer's forward pass runs at four times the training length without a
  table to extend (it runs or raises). It says nothing about quality there: that is what the lab
  columns measure.

Beside them, and never computed by the tour, the lab's recorded measurements of quality past the
training length (``lab_measured()``, shipped as ``minipos/data/lab_measured.json`` and written from
the lab's ``summary.json`` by ``lab.summary.write_measured``): small models trained at L, their loss
above the exact floor of a Markov source at L, 4L and 16L, and their retrieval accuracy at the
farthest distance at 16L. A scheme without a record shows "not measured".
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib import resources

import numpy as np

from . import __version__, vectors
from ._checks import check_int
from .layer import MultiHeadAttention
from .mla import DecoupledRotary, MultiHeadLatentAttention
from .rope_scaling import Rotary
from .schemes import ENTRIES

SHIFT_TOL = 1e-9    # float64 round-off allowed in the shift-invariance measurement
TOUR_LIMITS = {"d_model": 512, "heads": 16, "seq_len": 64}  # a tour in seconds, in a few hundred MB
MAX_SEED = 2**32 - 1


def check_tour_args(d_model, heads, seq_len, seed, *, names=None) -> None:
    """Raise ``ValueError``/``TypeError`` naming the argument unless the tour can run these.

    Each size is an int from 1 to its ``TOUR_LIMITS`` entry (the 4x run attends over
    ``4 * seq_len`` positions in every head), ``heads`` divides ``d_model`` into an even head
    dim (RoPE and xPos rotate feature pairs), and ``seed`` is an int in ``0 ... MAX_SEED``.
    ``names`` maps an argument to the name an error shows (the CLI's ``--d-model``, say).
    """
    name = {"d_model": "d_model", "heads": "heads", "seq_len": "seq_len", "seed": "seed", **(names or {})}
    for key, value in (("d_model", d_model), ("heads", heads), ("seq_len", seq_len)):
        if check_int(value, name[key], minimum=1) > TOUR_LIMITS[key]:
            raise ValueError(f"{name[key]} must be at most {TOUR_LIMITS[key]}, got {value} "
                             "(the limit keeps a tour to seconds)")
    if check_int(seed, name["seed"], minimum=0) > MAX_SEED:
        raise ValueError(f"{name['seed']} must be at most {MAX_SEED}, got {seed}")
    if d_model % heads:
        raise ValueError(f"{name['heads']} ({heads}) must divide {name['d_model']} ({d_model})")
    if (d_model // heads) % 2:
        culprit = name["heads"] if d_model % 2 == 0 else name["d_model"]  # an odd d_model has no even head dim
        raise ValueError(f"{culprit}: the head dim {name['d_model']} / {name['heads']} = {d_model // heads} "
                         "must be even (RoPE and xPos rotate pairs of features)")


def tour_schemes(seq_len: int) -> list:
    """One instance of every registered scheme (``minipos.schemes``), as its entry's ``example``
    configures it for the training length ``seq_len``."""
    return [entry.cls(**entry.example(seq_len)) for entry in ENTRIES.values()]


def tour_layers(seq_len: int) -> list:
    """Layer configurations beside the schemes: ``(label, scheme, MultiHeadAttention keywords)``;
    DeepSeek's decoupled RoPE runs in its own layer (``tour_layer``)."""
    window = max(1, seq_len // 4)
    chunk = max(2, 3 * seq_len // 8)          # not a divisor of the tour's shift T/2: chunk borders move
    return [("mla-rope", DecoupledRotary(), {}),
            ("rope+window", Rotary(layout="half"), {"sliding_window": window}),   # Mistral, Gemma's local layers
            ("rope+chunks", Rotary(layout="interleaved"), {"attention_chunk": chunk}),   # Llama 4's RoPE layers
            ("rope+sinks", Rotary(layout="half"), {"sinks": True})]                # gpt-oss's full layers


def tour_layer(scheme, d_model, heads, seed, **kwargs):
    """The layer of a tour row: ``MultiHeadAttention``, or DeepSeek's latent attention for its
    decoupled RoPE (D_N = D - D_R, D_R = 2 floor(D/4) or 2, D_V = D, latent ranks d_model/4, d_model/2)."""
    if not isinstance(scheme, DecoupledRotary):
        return MultiHeadAttention(d_model, heads, scheme=scheme, seed=seed, **kwargs)
    D = d_model // heads
    rope_dim = 2 * max(1, D // 4)
    return MultiHeadLatentAttention(d_model, heads, kv_lora_rank=max(1, d_model // 4), q_lora_rank=max(1, d_model // 2),
                                    qk_nope_head_dim=max(1, D - rope_dim), qk_rope_head_dim=rope_dim, v_head_dim=D,
                                    scheme=scheme, seed=seed)


def _shift_gap(layer, x, causal):
    shift = x.shape[1] // 2
    part = x[:, : x.shape[1] - shift]                     # positions 0..T-shift-1 and shift..T-1
    T = part.shape[1]
    base = layer(part, positions=np.arange(T), causal=causal)
    moved = layer(part, positions=np.arange(T) + shift, causal=causal)
    return float(np.max(np.abs(base - moved)))


def _runs_longer(layer, x, factor=4):
    long_x = np.tile(x, (1, factor, 1))  # (B, factor * T, d_model)
    try:
        y = layer(long_x, causal=True)
    except ValueError as err:
        return False, str(err).split("\n")[0]
    return bool(np.all(np.isfinite(y))), ""


def lab_measured() -> dict:
    """The lab's recorded numbers shipped with the package: ``{"source", "lengths", "far", "schemes"}``.

    ``schemes`` maps a scheme name to ``{"markov_excess": {length: {"mean", "sd"} or "cannot run"},
    "retrieval_far": {"mean", "sd"} or "cannot run"}`` (see ``lab.summary.measured``).
    """
    text = resources.files("minipos").joinpath("data", "lab_measured.json").read_text(encoding="utf-8")
    return json.loads(text)


def tour(d_model: int = 64, heads: int = 4, seq_len: int = 32, seed: int = 0) -> list:
    """Run every scheme through the same input; return one dict of measured facts per scheme.

    Arguments are checked by ``check_tour_args`` (``ValueError``/``TypeError`` naming the bad one).
    """
    check_tour_args(d_model, heads, seq_len, seed)
    recorded = lab_measured()["schemes"]
    x = np.random.default_rng(seed).standard_normal((1, seq_len, d_model))
    rows = []
    for label, scheme, kwargs in [(s.name, s, {}) for s in tour_schemes(seq_len)] + tour_layers(seq_len):
        layer = tour_layer(scheme, d_model, heads, seed, **kwargs)
        causal = True
        y = layer(x, causal=causal)
        gap = _shift_gap(layer, x, causal)
        runs, why = _runs_longer(layer, x)
        rows.append({
            "scheme": label,
            "config": repr(scheme) + "".join(f", {k}={v!r}" for k, v in kwargs.items()),
            "seams": list(scheme.seams) or ["none"],
            "position_params": int(sum(p.size for p in scheme.parameters().values())),
            "terms": list(scheme.terms),
            "shift_gap": gap,
            "shift_invariant": gap < SHIFT_TOL,
            "runs_at_4x": runs,
            "runs_at_4x_note": why,
            "output_norm": float(np.linalg.norm(y)),
            "lab_measured": recorded.get(label),            # None: not measured (a layer setting: not trained)
        })
    return rows


def _measured_cells(m) -> tuple[str, str]:
    """The two recorded columns of one row: loss above the floor at each length, far retrieval."""
    if m is None:
        return "not measured", "not measured"

    def show(v, fmt):
        return "n/a" if v == "cannot run" else f"{format(v['mean'], fmt)}±{format(v['se'], fmt)}"

    def flag(key):
        return "" if m.get(key, True) else " (not learned)"
    return (" / ".join(show(v, ".3f") for v in m["markov_excess"].values()) + flag("markov_learned"),
            show(m["retrieval_far"], ".2f") + flag("retrieval_learned"))


def _steps(src) -> str:
    taken = src.get("steps_taken")
    if taken is None:
        return f"{src['steps']} steps"
    return f"{taken[0]} to {taken[1]} steps with the cool-down, a budget of {src['steps']} before it"


def _format(rows, d_model, heads, seq_len) -> str:
    abbrev = {"content-content": "cc", "content-position": "cp", "position-content": "pc",
              "position-position": "pp"}
    lab = lab_measured()
    src, lengths, far = lab["source"], lab["lengths"], lab["far"]
    head = ("scheme", "seams", "pos. params", "terms", "shift-invariant given the mask",
            f"runs at {4 * seq_len} (not quality)",
            "lab: above floor at " + "/".join(map(str, lengths)), f"lab: recall {far['offset']} back")
    table = [head]
    for r in rows:
        gap = f"{'yes' if r['shift_invariant'] else 'no'} ({r['shift_gap']:.1e})"
        table.append((r["scheme"], "+".join(r["seams"]), str(r["position_params"]),
                      " ".join(abbrev[t] for t in r["terms"]), gap, "yes" if r["runs_at_4x"] else "no",
                      *_measured_cells(r["lab_measured"])))
    widths = [max(len(row[i]) for row in table) for i in range(len(head))]
    lines = [f"minipos {__version__} tour: d_model={d_model}, heads={heads}, training length={seq_len}",
             "Each row is measured now on one random input through MultiHeadAttention (causal).", ""]
    for n, row in enumerate(table):
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines += ["", "terms: cc content-content, cp content-position, pc position-content, pp position-position",
              "  (rope and xpos keep cc only, with q and k rotated so that it depends on i - j)",
              "mla-rope: DeepSeek's multi-head latent attention, RoPE on a separate slice of each head",
              f"shift-invariant given the mask: max |y(p) - y(p + {seq_len // 2})| below {SHIFT_TOL:g} (value in "
              "brackets);",
              "  the shifted input keeps the sequence start and the causal mask, so the test cannot see the",
              "  absolute position a causal model reads from the mask (nope passes it and still knows where it is)",
              f"runs at {4 * seq_len} (not quality): the forward pass runs at 4x the training length; whether a "
              "trained model",
              "  still works there is what the lab columns measure",
              f"lab columns: recorded, not run now: models of {src['model']} trained at L = {src['train_length']} "
              f"until the held-out loss plateaued ({_steps(src)}),",
              f"  mean±standard error over seeds {', '.join(map(str, src['seeds']))}; (not learned): a run that "
              "did not reach its plateau or its task, from which no length conclusion is drawn;",
              f"  loss above the exact floor of an order-2 Markov source (nats) at {', '.join(map(str, lengths))} "
              "tokens, n/a where the scheme cannot run;",
              f"  accuracy of reading a value written {far['offset']} tokens back in {far['length']} (chance 1/8).",
              f"  Source: {src['records']} (python -m lab) at minipos commits "
              f"{', '.join(c[:7] for c in src['commits'])}; the docs page 'Past the training length' has the rest."]
    notes = [f"{r['scheme']}: {r['runs_at_4x_note']}" for r in rows if r["runs_at_4x_note"]]
    if notes:
        lines += ["", "Why a scheme does not run at 4x:"] + [f"  {n}" for n in notes]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="minipos", description=__doc__.split("\n")[0])
    parser.add_argument("--version", action="version", version=f"minipos {__version__}")
    sub = parser.add_subparsers(dest="command")
    p_tour = sub.add_parser("tour", help="run every scheme through one attention layer and compare",
                            description="Run every scheme through one attention layer and compare. The "
                            "sizes are limited so that a tour takes seconds.")
    p_tour.add_argument("--d-model", type=int, default=64,
                        help=f"model width, at most {TOUR_LIMITS['d_model']} (default 64)")
    p_tour.add_argument("--heads", type=int, default=4,
                        help=f"attention heads, at most {TOUR_LIMITS['heads']}; d_model / heads, the head dim, "
                        "must be a whole even number (default 4)")
    p_tour.add_argument("--seq-len", type=int, default=32,
                        help=f"training length, at most {TOUR_LIMITS['seq_len']}; the 4x run uses 4 times it "
                        "(default 32)")
    p_tour.add_argument("--seed", type=int, default=0, help=f"random seed, 0 to {MAX_SEED} (default 0)")
    p_tour.add_argument("--json", action="store_true", help="print the same data as JSON")
    p_vec = sub.add_parser("vectors", help="export or check the golden vectors of every scheme")
    vec_sub = p_vec.add_subparsers(dest="vectors_command", required=True)
    vec_sub.add_parser("export", help="write one JSON file per family into DIR").add_argument("dir", metavar="DIR")
    vec_sub.add_parser("check", help="recompute DIR's vectors (default: those shipped with minipos); exit 1 on "
                       "any mismatch").add_argument("dir", metavar="DIR", nargs="?")
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 0
    if args.command == "vectors":
        return vectors.main(args)
    try:
        check_tour_args(args.d_model, args.heads, args.seq_len, args.seed,
                        names={k: f"--{k.replace('_', '-')}" for k in ("d_model", "heads", "seq_len", "seed")})
    except (ValueError, TypeError) as err:
        p_tour.error(str(err))  # usage and one line naming the option; exit status 2
    rows = tour(args.d_model, args.heads, args.seq_len, args.seed)
    if args.json:
        lab = lab_measured()
        print(json.dumps({"d_model": args.d_model, "heads": args.heads, "seq_len": args.seq_len,
                          "lab_measured": {k: lab[k] for k in ("source", "lengths", "far")},
                          "schemes": rows}, indent=2))
    else:
        print(_format(rows, args.d_model, args.heads, args.seq_len))
    return 0


if __name__ == "__main__":
    sys.exit(main())
