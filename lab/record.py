"""Results as data: one JSON record per run, written atomically, and its schema.

A record (``SCHEMA = "minipos-lab/3"``) holds everything needed to read and to reproduce a run::

    schema       "minipos-lab/3"
    command      the exact command that writes this record again (every setting explicit, after the
                 thread-count variables that were set, e.g. ``MINIPOS_NUM_THREADS=1``)
    settings     every setting of the run (what the command spells out)
    task         the task's configuration; model: the model's; scheme: the trained scheme's spec
    seed         the run's seed (model init, training batches, evaluation sequences)
    versions     python, numpy, minipos, the cores, the CPU model (``cpu``) and the kernels OpenBLAS
                 chose for it (``blas_core``, e.g. "Haswell"; each null where unknown), and the git
                 commit of the checkout (or null), ending in "+modified" when the code (``SOURCE``) had
                 uncommitted changes
    floor        markov: {"entropy_rate", "unigram", "order1"} in nats; otherwise null
    train        {"curve": {"step": [...], "loss": [...]}, "final_loss", "steps", "seconds"}; with the
                 budget and plateau schedules also "converged" (the plateau came before the budget;
                 always false with "budget", which trains every run the whole budget), "stopping"
                 (the rule in words and its numbers, "plateau_step", "cooldown_steps") and
                 "heldout" {"step", "loss"} (the held-out loss at L measured every ``plateau_every`` steps)
    history      [{"step", "lengths": [per-length entry, ...], "seconds"}, ...]: the base model evaluated at
                 every length during training (``lab.run.checkpoint_steps``), on the smaller checkpoint
                 sets (``history_tokens``, ``history_probes``) and without attention statistics
    results      {variant: {"spec", "lengths": [per-length entry, ...], "seconds", ...}}
    seconds      wall time of the whole run

``results`` has ``"base"`` (the trained model as is) and, for RoPE, the context extensions
(``"linear"``, ``"ntk"``, ``"dynamic"``, ``"yarn"``) and ``"pi-finetune"``. A per-length entry is
``{"length", "status": "ok", "seen_in_training"}`` (the length is at most L) plus the metrics, or
``{"length", "status": "cannot run", "reason"}``. Metrics of an ``ok`` entry: ``loss`` and
``loss_stderr`` (the mean over sequences and its standard error over them, ``sd / sqrt(n)``),
``sequences`` (n), ``floor`` (null without one), ``excess`` (= loss - floor), ``tokens``; markov and
text also ``sequence_losses`` (each sequence's mean loss, ``lab.run.SEQUENCE_DIGITS`` decimals) and
``positions`` ``{"edges", "loss", "floor"}`` (loss per bin of positions, ``edges`` has one more entry
than ``loss``; null for retrieval); ``attention`` ``{"entropy", "distance"}`` (per layer, per head:
mean entropy of a query's weights in nats, mean distance attended) with ``"uniform_entropy"`` (the
same for uniform causal weights), or null; retrieval adds ``accuracy`` and ``accuracy_stderr`` (over
sequences) and ``offsets`` (``[{"offset", "accuracy", "accuracy_stderr", "loss", "loss_stderr",
"sequences", "probes", "distance_min", "distance_max", "seen_in_training", "sequence_losses",
"sequence_accuracy"}, ...]``; an offset is seen in training when the task's training sequences at L
can hold it, ``KeyValueRecall.max_offset``). Records of schema ``minipos-lab/2`` (``OLD_SCHEMAS``) are
read as well: no ``history``, no per-sequence numbers, standard errors over tokens.

``validate(record)`` checks all of that and raises ``ValueError`` naming the first field that is wrong.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import platform
import re
import secrets
import subprocess
from pathlib import Path

import numpy as np

import minipos
from minipos import safe_io

__all__ = ["SCHEMA", "HELDOUT_SCHEDULES", "write", "write_json", "read", "validate", "versions", "source_commit",
           "cpu", "blas_core", "comparable", "SOURCE"]

SCHEMA = "minipos-lab/3"
OLD_SCHEMAS = ("minipos-lab/2",)
"""Earlier schemas still read (``lab/results/text-12000``): no ``history``, standard errors over tokens,
no per-sequence numbers."""
TOP = ("schema", "command", "settings", "task", "model", "scheme", "seed", "versions", "floor", "train", "results",
       "seconds")
TIMING = ("seconds",)
"""Fields that measure the machine, not the model: they differ between reruns."""

TASKS = ("markov", "retrieval", "text", "prose")
"""The tasks a record may be of (``lab.tasks``)."""

HELDOUT_SCHEDULES = ("plateau", "budget")
"""The schedules whose records hold a held-out curve, ``converged`` and ``stopping``: both measure the
held-out loss at L and end in the cool-down, ``plateau`` starting it at the plateau (or the budget),
``budget`` always at the budget."""


def cpu() -> str | None:
    """This machine's CPU model as the OS names it (Linux: ``model name`` in ``/proc/cpuinfo``), or
    ``platform.processor()``, or None. The BLAS picks its kernels by CPU, so a record's last bits
    are reproducible on the CPU that wrote it (``lab/README.md``, Determinism)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or None


def blas_core() -> str | None:
    """The kernels NumPy's OpenBLAS chose for this CPU (``openblas_get_corename``: "Haswell",
    "SkylakeX", "Zen", ...), or None where it cannot be asked (another BLAS, no ``/proc``). The kernels
    decide the BLAS's rounding, and a model name such as "AMD EPYC" covers several generations."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            paths = sorted({line.split()[-1] for line in f if "openblas" in line.lower() and "/" in line})
        for path in paths:
            lib = ctypes.CDLL(path)
            for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_",
                         "openblas_get_corename"):
                get = getattr(lib, name, None)
                if get is not None:
                    get.restype = ctypes.c_char_p
                    core = (get() or b"").decode(errors="replace").strip()
                    return core or None
    except OSError:
        pass
    return None


SOURCE = ("minipos", "lab", ":(exclude)lab/results")
"""What a record's ``commit`` covers: the code under ``minipos/`` and ``lab/``, not the records under
``lab/results`` (a run that writes beside other new records is still a run of the committed code)."""


def source_commit(root: Path) -> str | None:
    """``git rev-parse HEAD`` of the checkout at ``root``, with ``+modified`` when a tracked file of
    ``SOURCE`` differs from it; None outside a git checkout."""
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--",
                                *SOURCE], capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("+modified" if dirty else "")


def versions() -> dict:
    """The versions that decide a run's numbers."""
    out = {"python": platform.python_version(), "numpy": np.__version__, "minipos": minipos.__version__,
           "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
           "cpu": cpu(), "blas_core": blas_core()}
    out["commit"] = source_commit(Path(minipos.__file__).resolve().parent.parent)
    return out


def _clean(value):
    """JSON-ready: NumPy scalars and arrays to Python, non-finite floats refused."""
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    if isinstance(value, np.ndarray):
        return _clean(value.tolist())
    if isinstance(value, np.generic):
        return _clean(value.item())
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"a record cannot hold the non-finite number {value}")
    return value


def write(path, record: dict) -> Path:
    """Validate ``record`` and write it to ``path`` atomically (``write_json``)."""
    record = _clean(record)
    validate(record)
    return write_json(path, record)


def dumps(obj) -> str:
    """``obj`` as indented JSON, with every list of numbers on one line (a record holds thousands of
    per-sequence numbers: one a line would make it several times longer)."""
    nonce, lists = secrets.token_hex(8), []

    def fold(value):
        if isinstance(value, dict):
            return {k: fold(v) for k, v in value.items()}
        if isinstance(value, list):
            if value and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in value):
                lists.append(json.dumps(value, separators=(", ", ": ")))
                return f"@{nonce}:{len(lists) - 1}@"
            return [fold(v) for v in value]
        return value
    text = json.dumps(fold(obj), indent=1)
    return re.sub(f'"@{nonce}:([0-9]+)@"', lambda m: lists[int(m.group(1))], text)


def write_json(path, obj) -> Path:
    """Write ``obj`` as JSON to ``path`` through a temp file in the same directory, flushed and renamed
    over it (``minipos.safe_io.write_atomic``), so a reader never sees a torn file and an interrupted or
    failed write leaves the old one. The file gets the umask's mode, as any new file does. A full disk is
    an ``OSError`` whose one line names the file."""
    obj = _clean(obj)
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise safe_io.cannot_write(error, path) from None
    safe_io.write_atomic(path, dumps(obj) + "\n")
    return path


def read(path) -> dict:
    """The record at ``path``, validated. Raises ``OSError`` if there is no such file and ``ValueError``
    saying what is wrong (in words that do not repeat the path) if it cannot be read as a record: not a
    regular file (a directory, a FIFO, a device), larger than ``safe_io.MAX_BYTES``, empty, not UTF-8,
    not strict JSON (cut short or damaged, NaN, nested too deep), or not following the schema
    (``validate``). Reads go through ``minipos.safe_io``, so none of these can hang or exhaust memory."""
    try:
        data = safe_io.read_bytes(path)
    except safe_io.FileError as error:
        raise ValueError(error.reason) from None
    if not data.strip():
        raise ValueError("an empty file, not a record")
    try:
        record = safe_io.loads_json(data)
    except safe_io.FileError as error:
        reason = error.reason
        if reason.startswith("is not valid JSON"):
            reason = "not valid JSON, so cut short or damaged" + reason[len("is not valid JSON"):]
        elif reason.startswith("is not UTF-8"):
            reason = "not UTF-8 text, so not a record" + reason[len("is not UTF-8 text"):]
        raise ValueError(reason) from None
    validate(record)
    return record


def comparable(record: dict) -> dict:
    """The record without what measures the machine (wall times, versions): equal for a rerun."""
    def strip(value):
        if isinstance(value, dict):
            return {k: strip(v) for k, v in value.items() if k not in TIMING}
        if isinstance(value, list):
            return [strip(v) for v in value]
        return value
    out = strip(record)
    out.pop("versions", None)
    return out


# ----------------------------------------------------------------------------- validation

def _fail(where, what):
    raise ValueError(f"record field {where}: {what}")


def _number(value, where, *, lo=-math.inf, hi=math.inf, allow_none=False):
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        _fail(where, f"must be a finite number, got {value!r}")
    if not lo <= value <= hi:
        _fail(where, f"must be in [{lo}, {hi}], got {value}")


def _numbers(values, where, *, lo=-math.inf, hi=math.inf, allow_none=False):
    if not isinstance(values, list):
        _fail(where, f"must be a list, got {type(values).__name__}")
    if (not allow_none and {type(v) for v in values} <= {float, int} and all(map(math.isfinite, values))
            and (not values or lo <= min(values) and max(values) <= hi)):
        return                                    # the common case, checked at C speed
    for i, v in enumerate(values):                # else find the first bad one, for its message
        _number(v, f"{where}[{i}]", lo=lo, hi=hi, allow_none=allow_none)


def _keys(obj, keys, where):
    if not isinstance(obj, dict):
        _fail(where, f"must be an object, got {type(obj).__name__}")
    missing = [k for k in keys if k not in obj]
    if missing:
        _fail(where, f"lacks {', '.join(missing)}")


def _attention(att, where):
    if att is None:
        return
    _keys(att, ("entropy", "distance", "uniform_entropy"), where)
    _number(att["uniform_entropy"], where + ".uniform_entropy", lo=0)
    for key in ("entropy", "distance"):
        if not isinstance(att[key], list) or not att[key]:
            _fail(f"{where}.{key}", "must be a non-empty list (one per layer)")
        for i, layer in enumerate(att[key]):
            _numbers(layer, f"{where}.{key}[{i}]", lo=0)


def _sequences(entry, where, fields):
    """Schema 3: ``sequences`` and, for each of ``fields``, one number per sequence."""
    _number(entry["sequences"], where + ".sequences", lo=2)
    for name in fields:
        _numbers(entry[name], f"{where}.{name}")
        if len(entry[name]) != entry["sequences"]:
            _fail(f"{where}.{name}", f"must hold one number per sequence ({entry['sequences']}), "
                                     f"got {len(entry[name])}")


def _length_entry(entry, where, task, current=True):
    _keys(entry, ("length", "status"), where)
    _number(entry["length"], where + ".length", lo=1)
    if entry["status"] == "cannot run":
        _keys(entry, ("reason",), where)
        return
    if entry["status"] != "ok":
        _fail(where + ".status", f"must be 'ok' or 'cannot run', got {entry['status']!r}")
    _keys(entry, ("seen_in_training", "loss", "loss_stderr", "floor", "excess", "tokens", "positions", "attention"),
          where)
    if current:
        _keys(entry, ("sequences",) + (("sequence_losses",) if task != "retrieval" else ()), where)
        if task != "retrieval":
            _sequences(entry, where, ("sequence_losses",))
    if not isinstance(entry["seen_in_training"], bool):
        _fail(where + ".seen_in_training", f"must be true or false, got {entry['seen_in_training']!r}")
    _number(entry["loss"], where + ".loss", lo=0)
    _number(entry["loss_stderr"], where + ".loss_stderr", lo=0)
    _number(entry["floor"], where + ".floor", lo=0, allow_none=True)
    _number(entry["excess"], where + ".excess", allow_none=True)
    _number(entry["tokens"], where + ".tokens", lo=1)
    pos = entry["positions"]
    if pos is not None:
        _keys(pos, ("edges", "loss", "floor"), where + ".positions")
        _numbers(pos["edges"], where + ".positions.edges", lo=0)
        _numbers(pos["loss"], where + ".positions.loss", lo=0)
        if len(pos["edges"]) != len(pos["loss"]) + 1:
            _fail(where + ".positions", "edges must have one more entry than loss")
        if pos["floor"] is not None:
            _numbers(pos["floor"], where + ".positions.floor", lo=0)
    elif task != "retrieval":
        _fail(where + ".positions", "must be given (only retrieval, scored on its targets, has none)")
    _attention(entry["attention"], where + ".attention")
    if task == "retrieval":
        _keys(entry, ("accuracy", "accuracy_stderr", "offsets"), where)
        _number(entry["accuracy"], where + ".accuracy", lo=0, hi=1)
        _number(entry["accuracy_stderr"], where + ".accuracy_stderr", lo=0, hi=1)
        if not isinstance(entry["offsets"], list):
            _fail(where + ".offsets", f"must be a list, got {type(entry['offsets']).__name__}")
        for i, cell in enumerate(entry["offsets"]):
            w = f"{where}.offsets[{i}]"
            _keys(cell, ("offset", "accuracy", "accuracy_stderr", "probes", "distance_min", "distance_max",
                         "seen_in_training"), w)
            _number(cell["accuracy"], w + ".accuracy", lo=0, hi=1)
            _number(cell["accuracy_stderr"], w + ".accuracy_stderr", lo=0, hi=1)
            _number(cell["probes"], w + ".probes", lo=1)
            if current:
                _keys(cell, ("loss", "loss_stderr", "sequences", "sequence_losses", "sequence_accuracy"), w)
                _sequences(cell, w, ("sequence_losses", "sequence_accuracy"))


def _train(train, schedule) -> None:
    _keys(train, ("curve", "final_loss", "steps", "seconds"), "train")
    _keys(train["curve"], ("step", "loss"), "train.curve")
    _numbers(train["curve"]["step"], "train.curve.step", lo=0)
    _numbers(train["curve"]["loss"], "train.curve.loss", lo=0)
    _number(train["final_loss"], "train.final_loss", lo=0)
    _number(train["steps"], "train.steps", lo=1)
    if schedule not in HELDOUT_SCHEDULES:
        return
    _keys(train, ("converged", "stopping", "heldout"), "train")
    if not isinstance(train["converged"], bool):
        _fail("train.converged", f"must be true or false, got {train['converged']!r}")
    _keys(train["stopping"], ("rule", "budget", "plateau_step", "cooldown_steps"), "train.stopping")
    if train["converged"] != (train["stopping"]["plateau_step"] is not None):
        _fail("train.converged", "must say whether train.stopping.plateau_step is set")
    if schedule == "budget" and train["converged"]:
        _fail("train.converged", "must be false with schedule 'budget', which does not stop at a plateau")
    _keys(train["heldout"], ("step", "loss"), "train.heldout")
    _numbers(train["heldout"]["step"], "train.heldout.step", lo=0)
    _numbers(train["heldout"]["loss"], "train.heldout.loss", lo=0)


def validate(record: dict) -> None:
    """Raise ``ValueError`` naming the first field of ``record`` that does not follow the schema."""
    _keys(record, TOP, "(top)")
    if record["schema"] != SCHEMA and record["schema"] not in OLD_SCHEMAS:
        _fail("schema", f"must be {SCHEMA!r} (or an earlier {', '.join(map(repr, OLD_SCHEMAS))}), "
                        f"got {record['schema']!r}")
    current = record["schema"] == SCHEMA
    if not isinstance(record["command"], str) or not re.match(r"^([A-Z_]+=\S+ )*python -m lab ", record["command"]):
        _fail("command", "must be 'python -m lab ...', after any VARIABLE=value settings")
    _keys(record["settings"], ("task", "scheme", "seed"), "settings")
    _keys(record["versions"], ("python", "numpy", "minipos"), "versions")
    _keys(record["task"], ("name",), "task")
    _keys(record["scheme"], ("name",), "scheme")
    _keys(record["model"], ("vocab", "d_model", "num_heads", "num_layers"), "model")
    task = record["task"]["name"]
    if task not in TASKS:
        _fail("task.name", f"must be one of {', '.join(TASKS)}, got {task!r}")
    for key, value in (("task", task), ("seed", record["seed"])):    # settings.scheme may name a variant (t5@source)
        if record["settings"][key] != value or isinstance(record["settings"][key], bool):
            _fail(f"settings.{key}", f"must agree with the record's {key} ({value!r}), got {record['settings'][key]!r}")
    if isinstance(record["seed"], bool) or not isinstance(record["seed"], int) or record["seed"] < 0:
        _fail("seed", f"must be an integer >= 0, got {record['seed']!r}")
    if not isinstance(record["settings"]["scheme"], str) or not record["settings"]["scheme"]:
        _fail("settings.scheme", f"must be a non-empty string, got {record['settings']['scheme']!r}")
    if task == "markov":
        _keys(record["floor"], ("entropy_rate", "unigram", "order1"), "floor")
        for k in ("entropy_rate", "unigram", "order1"):
            _number(record["floor"][k], f"floor.{k}", lo=0)
    _train(record["train"], record["settings"].get("schedule"))
    _keys(record["train"]["curve"], ("step", "loss"), "train.curve")
    _number(record["seconds"], "seconds", lo=0)
    if not isinstance(record["results"], dict) or "base" not in record["results"]:
        _fail("results", "must be an object with a 'base' entry")
    for name, variant in record["results"].items():
        where = f"results.{name}"
        _keys(variant, ("spec", "lengths", "seconds"), where)
        if not isinstance(variant["lengths"], list) or not variant["lengths"]:
            _fail(where + ".lengths", "must be a non-empty list")
        for i, entry in enumerate(variant["lengths"]):
            _length_entry(entry, f"{where}.lengths[{i}]", task, current)
    if current:
        _history(record["history"] if "history" in record else _fail("(top)", "lacks history"), task)


def _history(history, task) -> None:
    """Schema 3: the evaluations during training, ``[{"step", "lengths", "seconds"}, ...]`` by step."""
    if not isinstance(history, list) or not history:
        _fail("history", "must be a non-empty list of checkpoints")
    steps = []
    for i, point in enumerate(history):
        where = f"history[{i}]"
        _keys(point, ("step", "lengths", "seconds"), where)
        _number(point["step"], where + ".step", lo=1)
        steps.append(point["step"])
        if not isinstance(point["lengths"], list) or not point["lengths"]:
            _fail(where + ".lengths", "must be a non-empty list")
        for j, entry in enumerate(point["lengths"]):
            _length_entry(entry, f"{where}.lengths[{j}]", task)
    if steps != sorted(set(steps)):
        _fail("history", f"checkpoints must come in increasing steps, got {steps}")
