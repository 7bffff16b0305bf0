"""The conformance results as the docs page shows them: read from the committed JSON, nothing run.

No torch and no library under test: ``docs/conformance.md`` calls these functions at build time,
and ``tests/test_conformance_results.py`` checks the same files and the same table. A result with
a failed case must have its explanation on the page: ``EXPLAINED`` maps it to the heading that
explains it, and ``table()`` refuses a failure that has none, which fails the strict docs build.

The files are read as untrusted (``minipos.safe_io``: regular files only, size and nesting caps,
strict JSON) and each result is checked for the fields the page shows: a missing or empty results
directory, or a damaged file, is a ``ValueError`` naming the file and the field, never an empty or
half-built table.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
if os.path.dirname(os.path.dirname(HERE)) not in sys.path:    # minipos (safe_io) from the checkout
    sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from minipos import safe_io  # noqa: E402

RESULTS = os.path.join(HERE, "results")
STATUSES = ("passed", "failed", "not_expressible")
ORDER = ["transformers", "torchtune", "keras_hub_torch", "keras_hub_jax", "x_transformers", "rotary_embedding_torch"]

# (run id, component, family) with a failed case -> the heading of docs/conformance.md that explains it
EXPLAINED = {
    ("transformers", "M2M100 get_embedding", "sinusoidal_table"): "get_embedding at dims 2 and 3",
    ("transformers", "Speech2Text get_embedding", "sinusoidal_table"): "get_embedding at dims 2 and 3",
    ("transformers", "Falcon build_alibi_tensor", "alibi_bias_key_only"): "Falcon ALiBi in bfloat16",
    ("rotary_embedding_torch", "RotaryEmbedding (use_xpos)", "xpos_scores"): "rotary-embedding-torch xPos in a cached step",
    ("transformers", "DeBERTa-v2 DisentangledSelfAttention", "deberta_scores"): "DeBERTa-v2 p2c with fewer queries than keys",
    ("transformers", "DeBERTa-v2 DisentangledSelfAttention", "deberta_grad"): "DeBERTa-v2 p2c with fewer queries than keys",
    ("keras_hub_torch", "RotaryEmbedding and subclasses", "rope_scaling"): "keras-hub dynamic is linear interpolation",
    ("keras_hub_jax", "RotaryEmbedding and subclasses", "rope_scaling"): "keras-hub dynamic is linear interpolation",
    ("keras_hub_jax", "SinePositionEncoding", "sinusoidal_table"): "Keras on jax computes sin of float64 in float32",
}


def slug(heading: str) -> str:
    """The anchor Python-Markdown's ``toc`` gives a heading (its default ``slugify``)."""
    text = unicodedata.normalize("NFKD", heading).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _directory(directory) -> str:
    """``directory`` as a path to an existing directory, or ``TypeError``/``ValueError`` naming it."""
    directory = safe_io.check_path(directory, "directory")
    if not os.path.isdir(directory):
        raise ValueError(f"results directory {directory!r} does not exist or is not a directory")
    return directory


def _check_result(doc, path: str) -> dict:
    """``doc`` if it has every field the page shows, with the right types, else ``ValueError`` naming the field."""
    def need(ok, field, what):
        if not ok:
            raise ValueError(f"{path}: {field} must be {what}")
    need(isinstance(doc, dict), "the result", "an object")
    need(doc.get("format") == "minipos-conformance", "format", "'minipos-conformance'")
    for key in ("library", "label", "component", "family", "precision", "run_date"):
        need(isinstance(doc.get(key), str), key, "a str")
    need(isinstance(doc.get("versions"), dict) and all(isinstance(v, str) for v in doc["versions"].values()),
         "versions", "an object of version strings")
    need(isinstance(doc.get("conventions"), list) and all(isinstance(c, str) for c in doc["conventions"]),
         "conventions", "a list of str")
    summary = doc.get("summary")
    need(isinstance(summary, dict) and all(isinstance(summary.get(s), int) and not isinstance(summary.get(s), bool)
                                           and summary[s] >= 0 for s in STATUSES),
         "summary", f"an object of counts {', '.join(STATUSES)}")
    cases = doc.get("cases")
    need(isinstance(cases, list) and all(isinstance(c, dict) and isinstance(c.get("name"), str)
                                         and c.get("status") in STATUSES for c in cases),
         "cases", f"a list of cases, each with a name and a status in {STATUSES}")
    for c in cases:
        where = f"cases[{c['name']!r}]"
        need(c["status"] != "not_expressible" or isinstance(c.get("reason"), str), f"{where}.reason", "a str")
        need(isinstance(c.get("mismatches", []), list), f"{where}.mismatches", "a list")
        for m in c.get("mismatches", []):
            need(isinstance(m, dict) and isinstance(m.get("output"), str) and isinstance(m.get("index"), list)
                 and all(_is_value(m.get(k)) for k in ("expected", "got")), f"{where}.mismatches[]",
                 "objects with output, index, expected and got")
    return doc


def _is_value(v) -> bool:
    """A recorded number: an int or float, or run.py's word for a NaN or an infinity."""
    return (isinstance(v, (int, float)) and not isinstance(v, bool)) or v in ("NaN", "Infinity", "-Infinity")


def load_results(directory: str = RESULTS) -> list[tuple[str, dict]]:
    """``(path relative to directory, result)`` of every result file, in the page's order.

    Raises ``ValueError`` for a directory that does not exist or holds no result, and for a file that
    cannot be read or lacks a field the page shows (naming the file and the field).
    """
    directory = _directory(directory)
    found = []
    for path in sorted(glob.glob(os.path.join(directory, "*", "*.json"))):
        if os.path.basename(path) == "probes.json":
            continue
        found.append((os.path.relpath(path, directory).replace(os.sep, "/"), _check_result(safe_io.read_json(path), path)))
    if not found:
        raise ValueError(f"results directory {directory!r} holds no result (<library>/<component>__<family>.json)")
    rank = lambda item: (ORDER.index(item[1]["library"]) if item[1]["library"] in ORDER else len(ORDER), item[0])
    return sorted(found, key=rank)


def load_probes(directory: str = RESULTS) -> dict[str, dict]:
    """``{run id: probes.json}`` of every library (``ValueError`` for a missing directory or a damaged file)."""
    directory = _directory(directory)
    out = {}
    for path in sorted(glob.glob(os.path.join(directory, "*", "probes.json"))):
        doc = safe_io.read_json(path)
        if not isinstance(doc, dict) or not isinstance(doc.get("probes"), list):
            raise ValueError(f"{path}: must be an object with a list of probes")
        out[os.path.basename(os.path.dirname(path))] = doc
    return out


def _results(results) -> list:
    """``results`` (default: the committed ones) checked as ``load_results`` checks its files."""
    if results is None:
        return load_results()
    if not isinstance(results, (list, tuple)):
        raise TypeError(f"results must be a list of (path, result) pairs as load_results returns, got "
                        f"{type(results).__name__}")
    for item in results:
        if not (isinstance(item, (list, tuple)) and len(item) == 2):
            raise TypeError(f"results must hold (path, result) pairs, got {type(item).__name__}")
        _check_result(item[1], str(item[0]))
    return list(results)


def _cell(text: str) -> str:
    return str(text).replace("|", "\\|")


def table(results=None) -> str:
    """The markdown table: one row per result file, failures linked to their explanation."""
    results = _results(results)
    rows = ["| library | component | family | passed | failed | not expressible | explained |",
            "|---|---|---|---:|---:|---:|---|"]
    for _, doc in results:
        s = doc["summary"]
        key = (doc["library"], doc["component"], doc["family"])
        note = "–"
        if s["failed"]:
            if key not in EXPLAINED:
                raise ValueError(f"{key}: {s['failed']} failed case(s) and no explanation on the page (EXPLAINED)")
            note = f"[{EXPLAINED[key]}](#{slug(EXPLAINED[key])})"
        rows.append(f"| {_cell(doc['label'])} | {_cell(doc['component'])} | `{doc['family']}` | {s['passed']} | "
                    f"{s['failed']} | {s['not_expressible']} | {note} |")
    return "\n".join(rows)


def totals(results=None) -> str:
    """Per library: case runs and how they ended, with the versions and the date of the run."""
    results = _results(results)
    by = {}
    for _, doc in results:
        entry = by.setdefault(doc["library"], {"label": doc["label"], "versions": doc["versions"],
                                               "dates": set(), "files": 0, **{s: 0 for s in STATUSES}})
        entry["files"] += 1
        entry["dates"].add(doc["run_date"])
        for s in STATUSES:
            entry[s] += doc["summary"][s]
    rows = ["| library | versions | run on | results | case runs | passed | failed | not expressible |",
            "|---|---|---|---:|---:|---:|---:|---:|"]
    grand = {s: 0 for s in STATUSES}
    for e in by.values():
        versions = ", ".join(f"{k} {v}" for k, v in e["versions"].items())
        runs = sum(e[s] for s in STATUSES)
        rows.append(f"| {_cell(e['label'])} | {versions} | {', '.join(sorted(e['dates']))} | {e['files']} | {runs} | "
                    f"{e['passed']} | {e['failed']} | {e['not_expressible']} |")
        for s in STATUSES:
            grand[s] += e[s]
    rows.append(f"| **all** | | | {len(results)} | {sum(grand.values())} | {grand['passed']} | {grand['failed']} | "
                f"{grand['not_expressible']} |")
    return "\n".join(rows)


def conventions(results=None) -> str:
    """Each component's conventions, as its adapter records them, one list per library."""
    results = _results(results)
    lines, seen = [], set()
    for _, doc in results:
        key = (doc["label"], doc["component"], tuple(doc["conventions"]))
        if key in seen or not doc["conventions"]:
            continue
        seen.add(key)
        lines.append(f"- **{doc['label']}**, {doc['component']} (`{doc['family']}`, {doc['precision']} tolerance): "
                     + "; ".join(doc["conventions"]) + ".")
    return "\n".join(lines)


def not_expressible(results=None) -> str:
    """The distinct reasons a library could not state a case, with the cases that gave each."""
    results = _results(results)
    rows = ["| library | component | family | cases | reason |", "|---|---|---|---|---|"]
    for _, doc in results:
        reasons = {}
        for case in doc["cases"]:
            if case["status"] == "not_expressible":
                reasons.setdefault(case["reason"], []).append(case["name"])
        for reason, names in reasons.items():
            rows.append(f"| {_cell(doc['label'])} | {_cell(doc['component'])} | `{doc['family']}` | "
                        f"{', '.join(names)} | {_cell(reason)} |")
    return "\n".join(rows)


def failures(run_id: str, family: str, results=None) -> str:
    """The failed cases of one library's family: the error, or the first differing values."""
    results = _results(results)
    lines = []
    for _, doc in results:
        if doc["library"] != run_id or doc["family"] != family:
            continue
        for case in doc["cases"]:
            if case["status"] != "failed":
                continue
            if case.get("error"):
                lines.append(f"{doc['component']} / {case['name']}: {case['error']}")
            for m in case["mismatches"][:3]:
                lines.append(f"{doc['component']} / {case['name']}: {m['output']}{m['index']} expected "
                             f"{_number(m['expected'])}, got {_number(m['got'])}")
            if case.get("differing_values"):
                lines.append(f"{doc['component']} / {case['name']}: differing values {case['differing_values']}")
    if not lines:
        raise ValueError(f"{run_id} / {family}: no failed case to show")
    return "```text\n" + "\n".join(lines) + "\n```"


def probe(run_id: str, name: str, probes=None) -> str:
    """One recorded probe: its input and what the library returned, as a text block."""
    probes = load_probes() if probes is None else probes
    if not isinstance(probes, dict):
        raise TypeError(f"probes must be a dict as load_probes returns, got {type(probes).__name__}")
    if run_id not in probes:
        raise ValueError(f"no probes of library {run_id!r}; there are {sorted(probes)}")
    found = [p for p in probes[run_id]["probes"] if isinstance(p, dict) and p.get("name") == name]
    if len(found) != 1:
        raise ValueError(f"{run_id}: no probe {name!r}")
    p = found[0]
    if "error" in p:
        raise ValueError(f"{run_id} / {name}: the probe itself failed: {p['error']}")
    lines = [p["input"]]
    for key, value in p.items():
        if key in ("name", "input"):
            continue
        if key == "output" and isinstance(value, dict):   # one line per entry of the output
            lines += [f"  {k}: {_compact(v)}" for k, v in value.items()]
        else:
            lines.append(f"{'->' if key == 'output' else key + ':'} {_compact(value)}")
    return "```text\n" + "\n".join(lines) + "\n```"


def _number(value) -> str:
    """A recorded value: a number to 9 digits, or the string run.py writes for a NaN or an infinity."""
    return value if isinstance(value, str) else f"{value:.9g}"


def _compact(value) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
