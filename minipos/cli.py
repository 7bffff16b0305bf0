"""The ``minipos`` command: ``minipos tour`` compares every position scheme, measured now and as the
lab recorded it; ``minipos vectors`` exports or checks the golden vectors (``--config``: one model's);
``minipos config CONFIG.json`` prints what a model does with positions, layer by layer.

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
farthest distance at 16L; the schemes without a record are listed as not measured. The file is
read as untrusted (``minipos.safe_io``) and checked field by field.

The text has two tables, one per training length (the tour's T, the lab's L), each followed by a
key that explains every column and every "no", and fits the terminal's width
(``minipos.terminal``): narrow columns wrap inside their cells. ``--json`` prints the same data.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from importlib import resources

import numpy as np

from . import __version__, safe_io, terminal, vectors
from . import config as model_config
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


MEASURED = ("data", "lab_measured.json")   # the shipped lab numbers, inside the package


def lab_measured() -> dict:
    """The lab's recorded numbers shipped with the package: ``{"source", "lengths", "far", "schemes"}``.

    ``schemes`` maps a scheme name to ``{"markov_excess": {length: {"mean", "sd", "se"} or "cannot run"},
    "retrieval_far": {"mean", "sd", "se"} or "cannot run"}`` (see ``lab.summary.measured``). The file
    is read as any untrusted file is (``minipos.safe_io``) and checked field by field: a damaged one
    raises ``ValueError`` naming the file and the field.
    """
    with resources.as_file(resources.files("minipos").joinpath(*MEASURED)) as path:
        data = safe_io.read_json(path)
        try:
            _check_measured(data)
        except ValueError as err:
            raise safe_io.FileError(path, f"is not the lab's measurements minipos ships ({err})") from None
    return data


def _need(ok: bool, where: str, what: str, value) -> None:
    if not ok:
        raise ValueError(f"{where} must be {what}, got {json.dumps(value)[:60]}")


def _is_number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _check_cell(cell, where: str) -> None:
    if cell == "cannot run":
        return
    _need(isinstance(cell, dict), where, '"cannot run" or an object with mean and se', cell)
    for key in ("mean", "se"):
        _need(_is_number(cell.get(key)), f"{where}.{key}", "a finite number", cell.get(key))


def _check_measured(data) -> None:
    """Raise ``ValueError`` naming the first field of ``data`` that the tour cannot show."""
    _need(isinstance(data, dict), "the file", "an object", data)
    for key in ("source", "lengths", "far", "schemes"):
        _need(key in data, key, "present", None)
    src, lengths, far = data["source"], data["lengths"], data["far"]
    _need(isinstance(src, dict), "source", "an object", src)
    for key, kind in (("records", str), ("model", str), ("train_length", int), ("steps", int),
                      ("commits", list), ("seeds", list)):
        _need(isinstance(src.get(key), kind) and not isinstance(src.get(key), bool), f"source.{key}",
              f"a {kind.__name__}", src.get(key))
    _need(isinstance(lengths, list) and len(lengths) == 3 and all(isinstance(n, int) and n > 0 for n in lengths),
          "lengths", "three positive integers", lengths)
    _need(isinstance(far, dict) and all(isinstance(far.get(k), int) for k in ("length", "offset")), "far",
          "an object with integers length and offset", far)
    _need(isinstance(data["schemes"], dict), "schemes", "an object", data["schemes"])
    for name, m in data["schemes"].items():
        _need(isinstance(m, dict) and isinstance(m.get("markov_excess"), dict), f"schemes.{name}",
              "an object with markov_excess", m)
        for n in map(str, lengths):
            _check_cell(m["markov_excess"].get(n), f"schemes.{name}.markov_excess.{n}")
        _check_cell(m.get("retrieval_far"), f"schemes.{name}.retrieval_far")
        for key in ("markov_learned", "retrieval_learned"):
            _need(isinstance(m.get(key, True), bool), f"schemes.{name}.{key}", "true or false", m.get(key))


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


def _measured_cells(m, lengths) -> list:
    """The recorded cells of one row: loss above the floor at each length, far retrieval (``*``: not learned)."""
    def show(v, fmt, learned):
        cell = "n/a" if v == "cannot run" else f"{format(v['mean'], fmt)}±{format(v['se'], fmt)}"
        return cell if learned else cell + " *"
    markov = [show(m["markov_excess"][str(n)], ".3f", m.get("markov_learned", True)) for n in lengths]
    return markov + [show(m["retrieval_far"], ".2f", m.get("retrieval_learned", True))]


def _steps(src) -> str:
    taken = src.get("steps_taken")
    if taken is None:
        return f"{src['steps']} steps"
    return f"{taken[0]} to {taken[1]} steps with the cool-down, a budget of {src['steps']} before it"


def _key(lines: list, width: int) -> list:
    """Key lines, each wrapped to ``width`` under a "Key:" heading."""
    return ["Key:"] + [w for line in lines for w in terminal.wrap(line, width, indent="  ", hang="    ")]


def _format_measured_now(rows, d_model, heads, seq_len, width) -> list:
    """The table measured now, at the tour's training length T, and its key."""
    abbrev = {"content-content": "cc", "content-position": "cp", "position-content": "pc",
              "position-position": "pp"}
    head = ("scheme", "seams", "params", "terms", "shift-inv.", "runs at 4T")
    table = [(r["scheme"], " + ".join(r["seams"]), str(r["position_params"]), " ".join(abbrev[t] for t in r["terms"]),
              f"{'yes' if r['shift_invariant'] else 'no'} {r['shift_gap']:.1e}", "yes" if r["runs_at_4x"] else "no")
             for r in rows]
    shift = seq_len // 2
    layers = ", ".join(label for label, _, _ in tour_layers(seq_len))
    lines = terminal.wrap(f"Measured now, at training length T = {seq_len}: each scheme in the same "
                          f"MultiHeadAttention layer (causal, d_model {d_model}, {heads} heads), one random input.",
                          width, hang="")
    lines += [""] + terminal.table(head, table, width) + [""]
    lines += _key([
        "seams: where position enters attention: input (added to the token embeddings), rotate (q and k turned "
        "by their positions), bias (added to the logits), content-position (terms that couple content with "
        "relative positions), value (added to the values); none: position comes from the causal mask alone.",
        f"params: learned position parameters at d_model {d_model} and {heads} heads (0: a fixed formula).",
        "terms: which of the four terms of (x_i + p_i) W_q W_k^T (x_j + p_j)^T the logits keep: cc "
        "content-content, cp content-position, pc position-content, pp position-position (rope and xpos keep cc "
        "only, with q and k rotated so that it depends on i - j).",
        f"shift-inv. (shift-invariant given the mask): yes: moving every position by {shift} changes the outputs "
        f"by less than {SHIFT_TOL:g} (the largest change is shown); no: they change, so the scheme reads "
        "absolute positions. The shifted input keeps the sequence start and the causal mask, so the test cannot "
        "see the absolute position a causal model reads from the mask (nope passes it and still knows where "
        "it is).",
        f"runs at 4T: yes: the forward pass runs at 4T = {4 * seq_len} positions; no: it raises (why, below). "
        "It says nothing about quality there: that is what the lab measured (the table after this one).",
        f"{layers}: layer settings, not schemes: DeepSeek's multi-head latent attention (RoPE on a separate "
        f"slice of each head), and RoPE with a sliding window of {max(1, seq_len // 4)}, attention in chunks of "
        f"{max(2, 3 * seq_len // 8)} (Llama 4) and attention sinks (gpt-oss).",
    ], width)
    notes = [f"{r['scheme']}: {r['runs_at_4x_note']}" for r in rows if r["runs_at_4x_note"]]
    if notes:
        lines += ["", "Why a scheme does not run at 4T:"]
        lines += [w for n in notes for w in terminal.wrap(n, width, indent="  ", hang="    ")]
    return lines


def _format_recorded(rows, width) -> list:
    """The table the lab recorded, at its own training length L, and its key."""
    lab = lab_measured()
    src, lengths, far = lab["source"], lab["lengths"], lab["far"]
    L = src["train_length"]
    head = ("scheme", f"excess at {lengths[0]}", *(f"at {n}" for n in lengths[1:]), f"recall {far['offset']} back")
    measured = [(r["scheme"], *_measured_cells(r["lab_measured"], lengths)) for r in rows if r["lab_measured"]]
    missing = [r["scheme"] for r in rows if not r["lab_measured"]]
    how = (f"until the held-out loss plateaued ({_steps(src)})" if src.get("schedule") == "plateau" else
           f"for {_steps(src)} (a {src.get('schedule', 'fixed')} schedule)")
    lines = terminal.wrap(f"Recorded by the lab, not run now: small models ({src['model']}) trained at training "
                          f"length L = {L} {how}, then tested at "
                          f"{', '.join(map(str, lengths))} tokens. Mean±standard error over seeds "
                          f"{', '.join(map(str, src['seeds']))}.", width, hang="")
    lines += [""] + terminal.table(head, measured, width)
    if missing:
        lines += [""] + terminal.wrap(f"Not measured by the lab: {', '.join(missing)}.", width, hang="  ")
    lines += [""] + _key([
        f"excess at N: the loss above the exact floor of an order-2 Markov source (nats) at N tokens (L, 4L "
        f"and 16L); n/a: the scheme cannot run at that length (a learned table of L rows stops at L).",
        f"recall {far['offset']} back: the accuracy of reading a value written {far['offset']} tokens back in "
        f"{far['length']} (chance 1/8); n/a: the scheme cannot run at {far['length']}.",
        "*: not learned: a run that did not reach its plateau or its task; no length conclusion is drawn from it.",
        f"Source: {src['records']} (python -m lab) at minipos commits "
        f"{', '.join(c[:7] for c in src['commits'])}; the docs page 'Past the training length' has the rest.",
    ], width)
    return lines


def _format(rows, d_model, heads, seq_len, width: int | None = None) -> str:
    """The tour as text: the table measured now (training length T), then the lab's (training length L),
    each with a key; no line wider than ``width`` (default: the terminal's) where the words allow it."""
    width = terminal.columns() if width is None else width
    lines = [f"minipos {__version__} tour", ""]
    lines += _format_measured_now(rows, d_model, heads, seq_len, width) + [""] + _format_recorded(rows, width)
    return "\n".join(lines)


def parser() -> argparse.ArgumentParser:
    """The ``minipos`` command line: ``tour`` and ``vectors export|check`` (each subparser is its
    namespace's ``command_parser``, for usage errors found after parsing)."""
    top = terminal.ArgumentParser(prog="minipos", description=terminal.plain(__doc__.split("\n\n")[0]))
    top.add_argument("--version", action="version", version=f"minipos {__version__}")
    sub = top.add_subparsers(dest="command", metavar="{tour,vectors,config}")
    p_tour = sub.add_parser("tour", help="run every scheme through one attention layer and compare",
                            description="Run every scheme through one attention layer and compare them, measured "
                            "now, beside what the lab recorded for small trained models. The sizes are limited so "
                            "that a tour takes seconds; the tables fit the terminal's width.")
    p_tour.set_defaults(command_parser=p_tour)
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
    p_vec = sub.add_parser("vectors", help="export or check the golden vectors of every scheme",
                           description="Export or check the golden vectors: one JSON file per family (one minipos "
                           "function), the spec a port tests itself against.")
    vec_sub = p_vec.add_subparsers(dest="vectors_command", required=True, metavar="{export,check}")
    p_export = vec_sub.add_parser("export", help="write one JSON file per family into DIR",
                                  description="Write one JSON file per family into DIR (new, empty, or holding only "
                                  "family files), each through a temp file and a rename.")
    p_check = vec_sub.add_parser("check", help="recompute DIR's vectors (default: those shipped with minipos); exit 1 "
                                 "on any mismatch",
                                 description="Recompute every case of DIR's family files (default: the spec shipped "
                                 "with minipos) with this minipos and list every mismatch; exit 1 on any. Each file is "
                                 "read as untrusted (regular files only, size and nesting caps, validated against the "
                                 "schema) before a case runs.")
    p_export.add_argument("dir", metavar="DIR", help="the directory to write")
    p_export.add_argument("--config", metavar="CONFIG.json", help="write instead the golden vectors of one model's "
                          "attention layers, read from its config.json (model_layers.json)")
    p_check.add_argument("dir", metavar="DIR", nargs="?", help="the directory of family files to check (default: the "
                         "spec shipped with minipos)")
    for p in (p_export, p_check):
        p.set_defaults(command_parser=p)
    p_config = sub.add_parser("config", help="print what a model does with positions, layer by layer, from its "
                              "config.json", description="Read a model's config.json (minipos.config.read) and print "
                              "its attention layers' position machinery, one row per decoder layer.")
    p_config.add_argument("path", metavar="CONFIG.json", help="the model's config.json")
    p_config.add_argument("--runs", action="store_true", help="one row for the layers that are alike, their "
                          "indices listed (0-4, 6-10)")
    p_config.set_defaults(command_parser=p_config)
    return top


def main(argv=None) -> int:
    """Run the ``minipos`` command (also ``python -m minipos``); return its exit status.

    Bad options are one-line usage errors (exit 2); a closed pipe (``minipos tour | head``) ends
    the command quietly (exit 1).
    """
    return terminal.run(_main, argv, prog="minipos")


def _main(argv) -> int:
    top = parser()
    args = top.parse_args(argv)
    if args.command is None:
        top.print_help()
        return 0
    if args.command == "vectors":
        return vectors.main(args)
    if args.command == "config":
        try:
            table = model_config.read(args.path).describe(width=terminal.columns(), runs=args.runs)
        except OSError as err:                                   # one line, no traceback
            print(f"minipos config: error: cannot read {args.path}: {err.strerror or err}", file=sys.stderr)
            return 1
        except (ValueError, TypeError) as err:
            print(f"minipos config: error: {err}", file=sys.stderr)
            return 1
        print(table)                                             # a closed pipe: terminal.run ends quietly
        return 0
    try:
        check_tour_args(args.d_model, args.heads, args.seq_len, args.seed,
                        names={k: f"--{k.replace('_', '-')}" for k in ("d_model", "heads", "seq_len", "seed")})
    except (ValueError, TypeError) as err:
        args.command_parser.error(str(err))  # usage and one line naming the option; exit status 2
    try:
        lab = lab_measured()
    except (ValueError, OSError) as err:      # a damaged or missing shipped file: one line, no traceback
        print(f"minipos tour: error: {err}", file=sys.stderr)
        return 1
    rows = tour(args.d_model, args.heads, args.seq_len, args.seed)
    if args.json:
        print(json.dumps({"d_model": args.d_model, "heads": args.heads, "seq_len": args.seq_len,
                          "lab_measured": {k: lab[k] for k in ("source", "lengths", "far")},
                          "schemes": rows}, indent=2))
    else:
        print(_format(rows, args.d_model, args.heads, args.seq_len))
    return 0


if __name__ == "__main__":
    sys.exit(main())
