"""Run public implementations of the position schemes over the golden vectors.

    python spec/conformance/run.py [--libraries transformers torchtune ...] [--out spec/conformance/results]
    python spec/conformance/run.py --check      # run into a temp dir, compare with the committed results

Run it with the Python of the environment that ``requirements.txt`` installs (see
``docs/conformance.md``). Each library runs in a process of its own (keras-hub twice, on its torch
and on its jax backend, since ``KERAS_BACKEND`` is read once, at import). For every component of
an adapter (``adapters/<library>.py``) and every case of the component's family in
``spec/vectors``, the case's inputs go to the library and its outputs are compared with the
rule of ``spec/check_port.py``: ``|got - expected| <= atol + rtol * |expected|`` with the case's
tolerance for the component's precision, only where the case's ``where`` is true. A case is
``passed``, ``failed`` (with every differing value, or the error the library raised), or
``not_expressible`` (with the reason) when the library has no way to state it.

One JSON file per (library, component, family) goes to ``OUT/<library>/``, each written to a
temp file and renamed over the old one (``minipos.safe_io.write_atomic``), so a killed run leaves
every file old or new, never cut short; a full disk is one line naming the file. A value a library
returns that is NaN or infinite is recorded as the string ``"NaN"``, ``"Infinity"`` or
``"-Infinity"``: the files are strict JSON. Files of components a run no longer has are removed after the run has written the
others. ``OUT/<library>/probes.json`` holds the outputs of the minimal inputs behind each
discrepancy that the page explains.

Before any work the runner checks its arguments (``--out`` a directory or a path to make one) and
that every library it is asked to run is installed: a missing one is one line naming the packages
and ``requirements.txt``, not a traceback from a worker.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.metadata
import json
import math
import os
import platform
import re
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SPEC = os.path.dirname(HERE)
sys.path.insert(0, SPEC)   # check_port.py: the spec's own decoder and loader
sys.path.insert(0, HERE)   # adapters/
sys.path.insert(0, os.path.dirname(SPEC))   # minipos (safe_io, terminal) from the checkout

from check_port import decode, load_family  # noqa: E402
from minipos import safe_io, terminal  # noqa: E402

# run id -> (adapter module, extra environment, label shown on the page)
LIBRARIES = {
    "transformers": ("transformers", {}, "transformers"),
    "torchtune": ("torchtune", {}, "torchtune"),
    "keras_hub_torch": ("keras_hub", {"KERAS_BACKEND": "torch"}, "keras-hub (torch backend)"),
    "keras_hub_jax": ("keras_hub", {"KERAS_BACKEND": "jax"}, "keras-hub (jax backend)"),
    "x_transformers": ("x_transformers", {}, "x-transformers"),
    "rotary_embedding_torch": ("rotary_embedding_torch", {}, "rotary-embedding-torch"),
}
MAX_SHOWN = 500   # differing values recorded per output; the count is always exact
INSTALL = ("install the pinned set into an environment of its own: pip install -r spec/conformance/requirements.txt "
           "(docs/conformance.md)")


def slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-")


def write_json(path: str, doc) -> None:
    """Write ``doc`` to ``path`` through a temp file in the same directory and a rename.

    Strict JSON: ``ValueError`` naming ``path`` for a NaN or an infinity; ``OSError`` naming it when
    the disk is full (the old file, if any, is left as it was).
    """
    try:
        text = json.dumps(doc, indent=1, sort_keys=False, allow_nan=False) + "\n"
    except ValueError as err:
        raise ValueError(f"cannot write {path}: it holds a NaN or an infinity, which JSON has no word for "
                         f"({err})") from None
    safe_io.write_atomic(path, text)


def scalar(value):
    """A NumPy scalar as a JSON value (int for integer arrays, float otherwise; a NaN or an infinity
    as the string "NaN", "Infinity" or "-Infinity")."""
    value = np.asarray(value).item()
    if isinstance(value, (bool, int)):
        return value
    return _finite(float(value))


def _finite(x: float):
    return x if math.isfinite(x) else ("NaN" if x != x else "Infinity" if x > 0 else "-Infinity")


def compare(name: str, expected: np.ndarray, got, tol: dict, mask) -> tuple[list, int]:
    """(recorded mismatches, number of values that differ) of one output."""
    got = np.asarray(got)
    if got.shape != expected.shape:
        raise ValueError(f"{name}: shape {list(got.shape)}, expected {list(expected.shape)}")
    e, g = expected.astype(np.float64), got.astype(np.float64)
    with np.errstate(invalid="ignore"):
        error = np.abs(g - e)
        bad = ~(error <= tol["atol"] + tol["rtol"] * np.abs(e))   # NaN is a mismatch
    if mask is not None:
        bad &= mask
    rows = [{"output": name, "index": idx, "expected": scalar(expected[tuple(idx)]),
             "got": scalar(got[tuple(idx)]), "abs_error": _finite(float(error[tuple(idx)])),
             "atol": tol["atol"], "rtol": tol["rtol"]}
            for idx in np.argwhere(bad)[:MAX_SHOWN].tolist()]
    return rows, int(bad.sum())


def run_case(component, case: dict, NotExpressible) -> dict:
    inputs = {k: decode(v) for k, v in case["inputs"].items()}
    record = {"name": case["name"]}
    try:
        got = component.run(inputs, case["params"])
    except NotExpressible as err:
        return {**record, "status": "not_expressible", "reason": str(err)}
    except Exception as err:  # the library failed on a case it can state: a failure, with its error
        return {**record, "status": "failed", "error": f"{type(err).__name__}: {err}"[:2000], "mismatches": []}
    masks = {k: decode(v) for k, v in case.get("where", {}).items()}
    tol = case["tolerance"][component.precision]
    mismatches, differing, errors = [], {}, []
    for name, value in case["expected"].items():
        if name not in got:
            errors.append(f"{name}: output missing")
            continue
        try:
            rows, n = compare(name, decode(value), got[name], tol, masks.get(name))
        except Exception as err:
            errors.append(f"{type(err).__name__}: {err}")
            continue
        mismatches += rows
        if n:
            differing[name] = n
    status = "failed" if (mismatches or errors) else "passed"
    record.update(status=status, mismatches=mismatches)
    if differing:
        record["differing_values"] = differing
    if errors:
        record["error"] = "; ".join(errors)
    return record


def versions(distributions) -> dict:
    found = {"python": platform.python_version(), "numpy": np.__version__}
    for dist in distributions:
        found[dist] = importlib.metadata.version(dist)
    return found


def worker(run_id: str, out: str) -> None:
    """Run one library's adapter over every family it has; write its results and probes."""
    module_name, _, label = LIBRARIES[run_id]
    adapter = _adapter(run_id)
    common = importlib.import_module("adapters._common")
    directory = os.path.join(out, run_id)
    os.makedirs(directory, exist_ok=True)
    stamp = {"library": run_id, "label": label, "versions": versions(adapter.DISTRIBUTIONS),
             "run_date": datetime.date.today().isoformat()}
    written = set()
    for component in adapter.components():
        doc = load_family(component.family)
        cases = [run_case(component, case, common.NotExpressible) for case in doc["cases"]]
        counts = {s: sum(c["status"] == s for c in cases) for s in ("passed", "failed", "not_expressible")}
        result = {"format": "minipos-conformance", **stamp, "component": component.name,
                  "family": component.family, "precision": component.precision,
                  "spec_version": doc["spec_version"], "vectors_minipos_version": doc["minipos_version"],
                  "conventions": component.conventions, "summary": counts, "cases": cases}
        filename = f"{slug(component.name)}__{component.family}.json"
        write_json(os.path.join(directory, filename), result)
        written.add(filename)
        print(f"{label}: {component.name} / {component.family}: "
              + ", ".join(f"{n} {s.replace('_', ' ')}" for s, n in counts.items()))
    probes = []
    for probe in getattr(adapter, "PROBES", []):
        try:
            probes.append(probe())
        except Exception as err:   # a probe that breaks is reported, not hidden
            probes.append({"name": probe.__name__, "error": f"{type(err).__name__}: {err}"})
    write_json(os.path.join(directory, "probes.json"), {**stamp, "probes": probes})
    written.add("probes.json")
    for stale in set(os.listdir(directory)) - written:
        if stale.endswith(".json"):
            os.unlink(os.path.join(directory, stale))


RTOL, ATOL = 1e-9, 1e-12
"""Relative and absolute differences up to which two floats of a remade and a committed result are
the same (``math.isclose``: either one suffices, the absolute one for values near 0). A
library's float64 kernels pick their vector code by CPU (torch's ``sin``, ``cos`` and ``pow`` among
them), so the same call moves in its last bits from one machine to another; the failures and the
probes the page explains are many orders of magnitude larger."""


def same(a, b) -> bool:
    """Whether two JSON values agree: equal structure, strings, integers and booleans, floats within ``RTOL``/``ATOL``."""
    if isinstance(a, float) or isinstance(b, float):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool)
                and not isinstance(b, bool) and math.isclose(a, b, rel_tol=RTOL, abs_tol=ATOL))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b


def differences(made: str, committed: str, run_ids) -> list[str]:
    """Files of ``run_ids`` that differ between two result trees, ``run_date`` aside (floats within ``RTOL``/``ATOL``)."""
    def read(path):
        doc = safe_io.read_json(path)
        if isinstance(doc, dict):
            doc.pop("run_date", None)
        return doc
    out = []
    for run_id in run_ids:
        a, b = os.path.join(made, run_id), os.path.join(committed, run_id)
        names = set(os.listdir(a) if os.path.isdir(a) else []) | set(os.listdir(b) if os.path.isdir(b) else [])
        for name in sorted(n for n in names if n.endswith(".json")):
            pa, pb = os.path.join(a, name), os.path.join(b, name)
            if not os.path.exists(pa) or not os.path.exists(pb):
                out.append(f"{run_id}/{name}: {'not made by this run' if os.path.exists(pb) else 'not committed'}")
            elif not same(read(pa), read(pb)):
                out.append(f"{run_id}/{name}: differs")
    return out


def _adapter(run_id: str):
    """The adapter module of ``run_id`` (it imports its library only when a component runs)."""
    return importlib.import_module(f"adapters.{LIBRARIES[run_id][0]}")


def missing(run_ids) -> dict:
    """``{run id: [distributions not installed]}`` for each of ``run_ids`` that cannot run here."""
    out = {}
    for run_id in run_ids:
        absent = []
        for dist in _adapter(run_id).DISTRIBUTIONS:
            try:
                importlib.metadata.version(dist)
            except importlib.metadata.PackageNotFoundError:
                absent.append(dist)
        if absent:
            out[run_id] = absent
    return out


def _out_dir(value: str) -> str:
    """``--out``: a directory, or a path where one can be made (``argparse`` type)."""
    try:
        path = safe_io.check_path(value, "--out")
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
    path = os.path.abspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"{value!r} exists and is not a directory")
    return path


def parser() -> argparse.ArgumentParser:
    ap = terminal.ArgumentParser(prog="spec/conformance/run.py", description=terminal.plain(__doc__.split("\n\n")[0]))
    ap.add_argument("--libraries", nargs="+", choices=sorted(LIBRARIES), default=list(LIBRARIES), metavar="NAME",
                    help=f"the libraries to run (default all: {', '.join(sorted(LIBRARIES))})")
    ap.add_argument("--out", type=_out_dir, default=os.path.join(HERE, "results"),
                    help="the results directory (default spec/conformance/results)")
    ap.add_argument("--check", action="store_true",
                    help=f"run into a temp dir and compare with --out (the committed results), run_date aside, floats "
                    f"within a relative {RTOL:g} or an absolute {ATOL:g}")
    ap.add_argument("--worker", choices=sorted(LIBRARIES), help=argparse.SUPPRESS)
    return ap


def main(argv=None) -> int:
    """Run the libraries (each in a process of its own); return the exit status. A closed pipe ends it quietly."""
    return terminal.run(_main, argv, prog="spec/conformance/run.py")


def _main(argv) -> int:
    args = parser().parse_args(argv)
    out = args.out
    if args.worker:
        try:
            worker(args.worker, out)
        except ImportError as err:                # a library the adapter needs, missing in this environment
            print(f"conformance: {terminal.missing_library(err, args.worker, INSTALL)}", file=sys.stderr)
            return 3
        except (OSError, ValueError) as err:      # a full disk, an unreadable spec file: one line
            print(f"conformance: {args.worker}: {err}", file=sys.stderr)
            return 1
        return 0
    absent = missing(args.libraries)
    if absent:
        print("conformance: error: not installed: " + "; ".join(f"{', '.join(d)} (for {r})" for r, d in absent.items())
              + f"; {INSTALL}", file=sys.stderr)
        return 2
    if args.check:
        with tempfile.TemporaryDirectory() as made:
            status = _main([*(["--libraries", *args.libraries]), "--out", made])
            diff = differences(made, out, args.libraries)
        for line in diff:
            print(f"conformance: {line}")
        print(f"conformance: {len(args.libraries)} libraries, {len(diff)} result files differ from {out}")
        return status or int(bool(diff))
    status = 0
    for run_id in args.libraries:
        start = time.monotonic()
        env = {**os.environ, **LIBRARIES[run_id][1], "PYTHONHASHSEED": "0"}
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "--worker", run_id, "--out", out],
                              env=env)
        print(f"== {run_id}: exit {done.returncode}, {time.monotonic() - start:.0f} s", flush=True)
        status |= done.returncode
    return status


if __name__ == "__main__":
    sys.exit(main())
