"""Mean and spread over seeds, from the records of a directory, and the sanity checks of ``--quick``.

``summarize(records)`` groups the records by task, scheme and variant and gives, per length, the
mean, sample standard deviation, minimum and maximum over seeds of the task's headline metric:
``excess`` (loss above the floor, nats) for ``markov``, ``loss`` for ``text``, ``accuracy`` for
``retrieval``; a length where the variant cannot run is reported as such. It is a pure function of
the records, so ``summary.json`` is rewritten identically from the same records.

``measured(summary, records)`` picks the few numbers ``minipos tour`` prints beside its live columns
(shipped in the wheel as ``minipos/data/lab_measured.json``, which has no ``lab/``); ``write_measured``
writes them: ``python -c "import lab.summary as s; s.write_measured('lab/results/full')"``.
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from . import schemes as scheme_specs

__all__ = ["METRIC", "STDERR", "LEARNED", "fixed_budget", "learned", "summarize", "format_table", "check_sane", "measured", "write_measured", "MEASURED_PATH"]

METRIC = {"markov": "excess", "text": "loss", "prose": "loss", "retrieval": "accuracy"}
MEASURED_PATH = Path(__file__).resolve().parent.parent / "minipos" / "data" / "lab_measured.json"
MEASURED_SCHEMA = "minipos-lab-measured/2"
TOUR_TASKS = ("markov", "retrieval")
"""The tasks whose numbers ``minipos tour`` prints (``measured``)."""


STDERR = {"excess": "loss_stderr", "loss": "loss_stderr", "accuracy": "accuracy_stderr"}
"""The field of a per-length entry (or retrieval offset cell) that holds the metric's standard error."""

LEARNED = {"markov": 0.1, "retrieval": 0.5}
"""When a run has learned its task at L (else no length conclusion is drawn from it): Markov, loss above
the floor at most this share of the order-1 baseline's (``order1 - entropy_rate``); retrieval, accuracy
at least this on the offsets seen in training. Text has no floor: every run that trained as its
schedule prescribes counts."""


def _spread(values, errors=None):
    """Mean, sd, min, max, n over seeds, and ``se``: the standard error of the mean, the larger of the
    seeds' spread (``sd / sqrt(n)``) and the evaluation noise (``sqrt(sum se_i^2) / n``)."""
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    n = len(values)
    noise = math.sqrt(sum(e * e for e in errors)) / n if errors else 0.0
    return {"mean": mean, "sd": sd, "se": max(sd / math.sqrt(n), noise), "min": min(values), "max": max(values),
            "n": n}


def fixed_budget(record: dict) -> bool:
    """Whether ``record`` trained a fixed budget by design (schedule ``budget``, as text does): it has no
    plateau to reach, so ``converged`` is false and says nothing against it."""
    return record["settings"].get("schedule") == "budget"


def learned(record: dict) -> bool:
    """Whether ``record``'s base model learned its task at L (``LEARNED``) and its training ended as its
    schedule prescribes (``fixed_budget``, or the plateau reached)."""
    train = record["train"]
    if train.get("converged") is False and not fixed_budget(record):
        return False
    task, L = record["task"]["name"], record["settings"]["length"]
    at_l = next(e for e in record["results"]["base"]["lengths"] if e["length"] == L)
    if task == "markov":
        floor = record["floor"]
        return at_l["excess"] <= LEARNED["markov"] * (floor["order1"] - floor["entropy_rate"])
    if task == "retrieval":
        seen = [c for c in at_l["offsets"] if c["seen_in_training"]]
        return bool(seen) and min(c["accuracy"] for c in seen) >= LEARNED["retrieval"]
    return True


def summarize(records: list) -> dict:
    """``{task: {"metric", "rows": {name: {"scheme", "label", "variant", "seeds", "lengths", ...}}}}``.

    A row is one ``--schemes`` name (a variant such as ``t5@source`` is its own row) and one result
    variant (``base``, or RoPE's extensions as ``rope +yarn``). ``lengths`` maps each length to the spread
    of the metric (or "cannot run"); ``attention_entropy`` and ``attention_distance`` to the spread of the
    mean over layers and heads; ``converged`` and ``learned`` count the seeds whose training converged and
    whose model learned the task (``learned``), ``fixed`` those that trained a fixed budget by design
    (``fixed_budget``); retrieval rows add ``offsets`` ``{length: {offset:
    spread}}`` and ``seen`` ``{length: {offset: seen in training}}``. A spread is ``_spread``'s dict.
    """
    runs = [(r["task"]["name"], r["settings"]["scheme"], r["seed"]) for r in records]
    twice = sorted({run for run in runs if runs.count(run) > 1})
    if twice:                                                             # a seed counted twice is not a spread
        raise ValueError("the records hold the same run more than once (a seed counted twice would narrow the "
                         "spread): " + ", ".join(f"{t}-{s}-s{n}" for t, s, n in twice))
    unknown = sorted({t for t, _, _ in runs if t not in METRIC})
    if unknown:
        raise ValueError(f"unknown task {', '.join(map(repr, unknown))} in the records; the tasks are "
                         f"{', '.join(METRIC)}")
    groups = {}
    for rec in sorted(records, key=lambda r: (r["task"]["name"], r["settings"]["scheme"], r["seed"])):
        task, name = rec["task"]["name"], rec["settings"]["scheme"]
        metric = METRIC[task]
        for variant, res in rec["results"].items():
            row = name + ("" if variant == "base" else f" +{variant}")
            g = groups.setdefault(task, {}).setdefault(row, {
                "scheme": rec["scheme"]["name"], "name": name, "label": scheme_specs.label(res["spec"]),
                "variant": variant, "seeds": [], "values": {}, "errors": {}, "converged": 0, "fixed": 0, "learned": 0})
            g["seeds"].append(rec["seed"])
            g["converged"] += rec["train"].get("converged", True) is True
            g["fixed"] += fixed_budget(rec)
            g["learned"] += learned(rec)
            for entry in res["lengths"]:
                n = str(entry["length"])
                ok = entry["status"] == "ok"
                g["values"].setdefault(n, []).append(entry.get(metric) if ok else "cannot run")
                if not ok:
                    continue
                g["errors"].setdefault(n, []).append(entry[STDERR[metric]])
                att = entry["attention"]
                if att is not None:                                      # mean over layers and heads
                    for key, field in (("entropy", "entropy"), ("distance", "distance")):
                        heads = [h for layer in att[field] for h in layer]
                        g.setdefault(key, {}).setdefault(n, []).append(sum(heads) / len(heads))
                for cell in entry.get("offsets", []):
                    d = str(cell["offset"])
                    g.setdefault("offsets", {}).setdefault(n, {}).setdefault(d, []).append(
                        (cell["accuracy"], cell["accuracy_stderr"]))
                    g.setdefault("seen", {}).setdefault(n, {})[d] = cell["seen_in_training"]
    out = {}
    order = {name: i for i, name in enumerate(scheme_specs.NAMES)}
    for task, rows in groups.items():
        out[task] = {"metric": METRIC[task], "rows": {}}
        for row, g in sorted(rows.items(), key=lambda kv: (order.get(kv[1]["name"], 99), kv[0])):
            lengths = {}
            for n, values in g["values"].items():
                lengths[n] = ("cannot run" if "cannot run" in values
                              else _spread([float(v) for v in values], g["errors"].get(n)))
            entry = {"scheme": g["scheme"], "label": g["label"], "variant": g["variant"], "seeds": g["seeds"],
                     "converged": g["converged"], "fixed": g["fixed"], "learned": g["learned"], "lengths": lengths,
                     "attention_entropy": {n: _spread(v) for n, v in g.get("entropy", {}).items()},
                     "attention_distance": {n: _spread(v) for n, v in g.get("distance", {}).items()}}
            if "offsets" in g:
                entry["offsets"] = {n: {d: _spread([a for a, _ in v], [e for _, e in v]) for d, v in cells.items()}
                                    for n, cells in g["offsets"].items()}
                entry["seen"] = g["seen"]
            out[task]["rows"][row] = entry
    return out


def format_table(summary: dict) -> str:
    """The summary as plain-text tables, one per task: mean ± sd over seeds at each length."""
    heads = {"excess": "loss above the floor (nats)", "loss": "held-out loss (nats)",
             "accuracy": "retrieval accuracy (mean over offsets)"}
    lines = []
    for task, block in summary.items():
        rows = block["rows"]
        lengths = sorted({int(n) for r in rows.values() for n in r["lengths"]})
        lines.append(f"{task}: {heads[block['metric']]}, mean ± standard error over seeds")
        lines.append(f"{'':24s}" + "".join(f"{n:>16d}" for n in lengths))
        for label, r in rows.items():
            cells = []
            for n in lengths:
                v = r["lengths"].get(str(n))
                if v is None:
                    cells.append(f"{'-':>16s}")
                elif v == "cannot run":
                    cells.append(f"{'cannot run':>16s}")
                else:
                    cells.append(f"{v['mean']:>9.3f} ±{v['se']:<5.3f}"[:16].rjust(16))
            trained = (f"fixed budget {r['fixed']}/{len(r['seeds'])}" if r.get("fixed") else
                       f"converged {r['converged']}/{len(r['seeds'])}")
            flags = f"{trained}, learned {r['learned']}/{len(r['seeds'])}"
            lines.append(f"{label[:24]:24s}" + "".join(cells) + f"   ({flags})")
        lines.append("")
        if block["metric"] == "accuracy":
            lines += _offset_table(rows, lengths[-1])
    return "\n".join(lines)


def _offset_table(rows: dict, length: int) -> list[str]:
    """Retrieval at the longest length: the accuracy at each offset (write to read), mean over seeds."""
    offsets = sorted({int(d) for r in rows.values() for d in r.get("offsets", {}).get(str(length), {})})
    if not offsets:
        return []
    out = [f"retrieval at length {length}: accuracy by offset (tokens from write to read), mean over seeds",
           f"{'':24s}" + "".join(f"{d:>8d}" for d in offsets)]
    for label, r in rows.items():
        cells = r.get("offsets", {}).get(str(length))
        if cells is None:
            out.append(f"{label[:24]:24s}" + f"{'cannot run':>10s}")
            continue
        out.append(f"{label[:24]:24s}" + "".join(f"{cells[str(d)]['mean']:>8.2f}" if str(d) in cells else f"{'-':>8s}"
                                                 for d in offsets))
    return out + [""]


def check_sane(record: dict) -> list[str]:
    """What is wrong with the numbers of ``record`` (an empty list when nothing is).

    Checked: the loss at every length is no further below the floor than five standard errors plus
    0.01 nats (an exact floor cannot be beaten, up to sampling noise); every accuracy is in [0, 1]; the
    training loss went down; every metric is finite (the record's validation refuses non-finite numbers).
    """
    problems = []
    curve = record["train"]["curve"]["loss"]
    if len(curve) > 1 and not curve[-1] < curve[0]:
        problems.append(f"the training loss did not go down ({curve[0]:.4f} -> {curve[-1]:.4f})")
    for variant, res in record["results"].items():
        for entry in res["lengths"]:
            if entry["status"] != "ok":
                continue
            where = f"{variant} at {entry['length']}"
            values = [entry["loss"]] + ([entry["accuracy"]] if "accuracy" in entry else [])
            if not all(math.isfinite(v) for v in values):
                problems.append(f"{where}: non-finite metric")
            if entry["floor"] is not None and entry["loss"] < entry["floor"] - 5 * entry["loss_stderr"] - 0.01:
                problems.append(f"{where}: loss {entry['loss']:.4f} is below the floor {entry['floor']:.4f}")
            for cell in entry.get("offsets", []):
                if not 0.0 <= cell["accuracy"] <= 1.0:
                    problems.append(f"{where}: accuracy {cell['accuracy']} outside [0, 1]")
    return problems


def _mean_sd(spread):
    return spread if spread == "cannot run" else {"mean": spread["mean"], "sd": spread["sd"], "se": spread["se"]}


def _all_learned(row) -> bool:
    """Whether every seed of a summary row converged (or trained a fixed budget by design) and learned its task."""
    n = len(row["seeds"])
    return n > 0 and row.get("converged", 0) + row.get("fixed", 0) == n and row.get("learned") == n


def measured(summary: dict, records: list, *, source: str = "lab/results/full") -> dict:
    """The numbers the tour ships: each scheme's base model, no extension, straight from ``summary``.

    Markov loss above the floor at L, 4L and 16L, and retrieval accuracy at the farthest offset at 16L
    (mean, sd and standard error over seeds, or ``"cannot run"``), and whether every seed's run converged
    and learned the task (``markov_learned``, ``retrieval_learned``); ``source`` names the record set, the minipos commits
    the records were made at, the seeds and the model, so the tour can say where its numbers come from.
    Only the records of ``TOUR_TASKS`` count: the tour shows no text column, so the text records' commits
    and steps are not its source.
    """
    records = [r for r in records if r["task"]["name"] in TOUR_TASKS]
    first = records[0]
    L, factors = first["settings"]["length"], first["settings"]["eval_factors"]
    lengths = [L, 4 * L, max(factors) * L]
    longest = str(lengths[-1])
    schemes = {}
    for key, row in summary["markov"]["rows"].items():
        if row["variant"] == "base" and key == row["scheme"]:            # not a variant such as t5@source
            schemes[row["scheme"]] = {"markov_excess": {str(n): _mean_sd(row["lengths"][str(n)]) for n in lengths},
                                      "markov_learned": _all_learned(row)}
    far = None
    for key, row in summary["retrieval"]["rows"].items():
        if row["variant"] != "base" or key != row["scheme"]:
            continue
        cells = row.get("offsets", {}).get(longest)
        if cells is None:
            schemes[row["scheme"]]["retrieval_far"] = "cannot run"
            continue
        far = max(int(d) for d in cells)
        schemes[row["scheme"]]["retrieval_far"] = _mean_sd(cells[str(far)])
        schemes[row["scheme"]]["retrieval_learned"] = _all_learned(row)
    model = first["model"]
    return {
        "schema": MEASURED_SCHEMA,
        "source": {"records": source, "commits": sorted({r["versions"]["commit"] for r in records}),
                   "seeds": sorted({r["seed"] for r in records}), "train_length": L,
                   "steps": first["settings"]["steps"], "schedule": first["settings"]["schedule"],
                   "steps_taken": [min(r["train"]["steps"] for r in records), max(r["train"]["steps"] for r in records)],
                   "model": f"{model['num_layers']} layers, d_model {model['d_model']}, {model['num_heads']} heads"},
        "lengths": lengths,
        "far": {"length": lengths[-1], "offset": far},
        "schemes": schemes,
    }


def write_measured(directory, path=MEASURED_PATH) -> dict:
    """Write ``measured`` of ``directory``'s ``summary.json`` and records to ``path`` (the tour's data)."""
    from . import record as records_io
    directory = Path(directory)
    records = [records_io.read(p) for p in sorted(directory.glob("*-s*.json"))]
    summary = json.loads((directory / "summary.json").read_text(encoding="utf-8"))
    data = measured(summary, records, source=directory.as_posix())
    records_io.write_json(path, data)                                 # a temp file and a rename
    return data
