"""The protocol: train at L, test at L, 2L, 4L, 8L, 16L, every scheme, several seeds.

One run = one (task, scheme, seed): train the model for ``steps`` AdamW steps on sequences of
``length`` L, then evaluate it on fresh sequences of each length ``L * f`` (``eval_factors``):

- ``markov``: loss against the source's exact floor, per length and per bin of positions;
- ``retrieval``: accuracy of recalling a value written ``offset`` tokens before it is read, the read
  block ending the sequence, for every offset that fits the length;
- ``text``: loss on the held-out part of the text (``lab.corpus``: SymPy 1.14.0's source as bytes, or
  ``--text FILE``), no floor;

and, at every length, the entropy of each head's attention weights and the mean distance it attends.
A learned absolute table "cannot run" past its rows: recorded as such, not as an error. RoPE is
also evaluated after extending it without training (``lab.schemes.EXTENSIONS``: a new model with
the scaled scheme, the trained weights copied in), stretched ``length / L`` times at each length
(``dynamic`` scales itself, and is run token by token with the KV cache, as in generation, so that
each query uses the frequencies of its own prefix), and after a short fine-tune at 2L with linear
interpolation by 2 (Chen et al. 2023, arXiv:2306.15595, Sec. 3: "PI" then fine-tune).

**Training stops at a plateau** (``Stopping``): after warm-up the learning rate is held at ``lr``
and the held-out loss at L is measured every ``plateau_every`` steps on ``plateau_sequences`` fixed
sequences; the run has reached its plateau when the best loss of the last ``plateau_window`` share of the
steps so far (at least ``plateau_min_window`` steps) is less than ``max(plateau_relative * best,
plateau_absolute)`` nats below the best before them. Then the rate falls linearly to ``min_lr_ratio * lr``
over ``cooldown`` times as many steps again, and training ends. A run that reaches ``steps`` (the
budget) without a plateau is cooled down the same way and recorded with ``converged: false``.

**Text trains a fixed budget** (schedule ``"budget"``, ``TASK_DEFAULTS``): the same rate, held-out
measurements and cool-down, but the cool-down always starts at ``steps``, so every scheme trains
exactly as long. On text the plateau rule measured noise, not a plateau: the held-out loss on the 64
sequences moves about 0.01 nats between measurements at the constant rate, three times the rule's
threshold, while a power law fitted to each curve still fell 0.6-1.3 % over the last quarter of the
steps; the rule fired between steps 8000 and 22200 in 8 of 11 runs and not at all in the other 3, whose
fitted trends were the same (``lab/README.md``). Models trained for lengths chosen by noise are not
compared fairly; models trained alike are.

Every random draw comes from ``numpy.random.default_rng`` seeded by ``(seed, purpose)``: model
initialisation by ``seed``, training batches by ``(seed, 0)``, the evaluation sequences at length n by
``(seed, 1, n)`` (the same for every scheme, so schemes are compared on the same sequences), the
fine-tune's by ``(seed, 2)``. ``record.comparable`` parts of a record are the same on a rerun.
"""

from __future__ import annotations

import math
import os
import shlex
import sys
import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import numpy as np

from . import record as records
from . import schemes as scheme_specs
from .memory import keep_freed_memory
from .model import AdamW, Model, ModelConfig, clip_by_global_norm, copy_parameters, learning_rate
from .tasks import KeyValueRecall, MarkovSource, TextSource

__all__ = ["Settings", "Stopping", "QUICK", "TASK_DEFAULTS", "TASK_SEEDS", "run_one", "train", "evaluate", "checkpoint_steps",
           "record_path", "command_for"]


@dataclass(frozen=True)
class Settings:
    """Every knob of a run; ``command_for`` spells each out, so a record's command reproduces it."""

    task: str = "markov"                 # markov | retrieval | text (code) | prose
    text: str | None = None              # the text file (task "text")
    scheme: str = "rope"
    seed: int = 0
    length: int = 64                     # L, the training length
    eval_factors: tuple = (1, 2, 4, 8, 16)
    # model
    d_model: int = 64
    num_heads: int = 4
    num_layers: int = 2
    d_ff: int = 256
    norm: str = "layernorm"
    activation: str = "gelu"
    tied: bool = True
    # training
    steps: int = 6000                    # the budget: steps before the cool-down, if no plateau comes first
    batch: int = 32
    lr: float = 3e-3
    warmup: int = 60
    schedule: str = "budget"             # budget (a fixed budget, see Stopping) | plateau (stop early) | cosine | constant
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.1
    clip: float = 1.0
    # the stopping rule (schedules "plateau" and "budget", see Stopping)
    plateau_every: int = 100             # steps between held-out measurements
    plateau_sequences: int = 64          # held-out sequences of length L measured each time
    plateau_window: float = 0.25         # the share of the steps so far that must improve ...
    plateau_min_window: int = 400        # ... and at least this many steps
    plateau_relative: float = 0.002      # by at least this fraction of the best loss before them
    plateau_absolute: float = 0.002      # or this many nats, whichever is larger
    cooldown: float = 0.2                # the cool-down's steps, as a share of the steps before it
    # markov source
    vocab: int = 32
    order: int = 2
    temperature: float = 0.5
    structure: str = "additive"          # additive | full (see MarkovSource)
    source_seed: int = 0
    # retrieval
    keys: int = 8
    values: int = 8
    filler: int = 16
    pairs: int = 4
    binding: str = "fused"               # fused | adjacent (see KeyValueRecall)
    # evaluation (standard errors are over sequences: the sd of the per-sequence means / sqrt(n))
    eval_tokens: int = 163840            # tokens per length (loss): eval_tokens / length sequences ...
    eval_sequences: int = 2              # ... and at least this many at every length
    eval_batch_tokens: int = 8192        # tokens per forward pass
    probes: int = 256                    # retrieval: sequences per (length, offset), ``pairs`` probes each
    attention_sequences: int = 4         # sequences whose attention weights are measured
    position_bins: int = 8               # bins per L in the per-position loss
    # the curves past L: every length evaluated at ``checkpoints`` steps spread over training
    checkpoints: int = 8                 # evaluations during training (the last at its end)
    history_tokens: int = 40960          # tokens per length at a checkpoint (at least eval_sequences sequences)
    history_probes: int = 32             # retrieval: sequences per (length, offset) at a checkpoint
    # RoPE
    extensions: bool = True              # evaluate RoPE's scalings and the PI fine-tune
    finetune_steps: int = 60
    finetune_lr: float = 1e-3
    finetune_factor: int = 2

    def model_config(self, vocab: int, scheme: dict | None = None) -> ModelConfig:
        return ModelConfig(vocab=vocab, scheme=scheme or scheme_specs.default_spec(self.scheme, self.length),
                           d_model=self.d_model, num_heads=self.num_heads, num_layers=self.num_layers, d_ff=self.d_ff,
                           norm=self.norm, activation=self.activation, tied=self.tied)

    def stopping(self) -> "Stopping | None":
        """The stopping rule of schedules ``plateau`` and ``budget`` (None for cosine and constant)."""
        if self.schedule not in records.HELDOUT_SCHEDULES:
            return None
        return Stopping(every=self.plateau_every, sequences=self.plateau_sequences, window=self.plateau_window,
                        min_window=self.plateau_min_window, relative=self.plateau_relative,
                        absolute=self.plateau_absolute, cooldown=self.cooldown)

    def make_task(self):
        if self.task == "markov":
            return MarkovSource(vocab=self.vocab, order=self.order, temperature=self.temperature, seed=self.source_seed,
                                structure=self.structure)
        if self.task == "retrieval":
            return KeyValueRecall(keys=self.keys, values=self.values, filler=self.filler, pairs=self.pairs,
                                  binding=self.binding)
        if self.task in ("text", "prose"):
            return TextSource(self.text, kind=self.task)                # text None: the corpus (lab.corpus)
        raise ValueError(f"task must be markov, retrieval, text or prose; got {self.task!r}")

    @property
    def finetune_batch(self) -> int:
        """Sequences per fine-tune step: ``batch / finetune_factor``, so a step holds as many tokens."""
        return max(1, self.batch // self.finetune_factor)

    def lengths(self) -> list[int]:
        return [self.length * int(f) for f in self.eval_factors]


# A task's own defaults where the shared one does not fit it (the protocol's command line leaves them
# out; a flag given overrides them, and ``--quick`` keeps its own). Every task trains a fixed budget
# (schedule ``budget``): the same number of steps for every scheme, then the cool-down (a fifth of it);
# seed 0 of every scheme of the synthetic tasks is also trained on twice the budget (``lab/README.md``,
# Budgets), to show what more training still changes past L. Text and prose evaluate 409600 symbols at
# each length, 6400 sequences at L (400 at 16 L), so that a loss at L has a standard error over sequences
# of about 0.01 nats per symbol or less (lab/README.md, Evaluation).
TASK_DEFAULTS = {
    "markov": {"steps": 4800},
    "retrieval": {"steps": 3600},
    "text": {"steps": 6000, "eval_tokens": 409600},
    "prose": {"steps": 6000, "eval_tokens": 409600},
}

TASK_SEEDS = {"markov": (0, 1, 2, 3, 4), "retrieval": (0, 1, 2, 3, 4), "text": (0, 1, 2), "prose": (0, 1, 2)}
"""The protocol's seeds of each task. The unit of every test over the records is the training run, so
with three seeds a test has 2 degrees of freedom: a one-sided p below 0.05 / 38 (the Holm bound of the
first rejection over the site's 38 tested claims) then needs t > 19.5. The synthetic tasks, where most of the
pages' orderings are drawn, get five seeds (t > 6.7 at 4 degrees of freedom); each text corpus, three."""

QUICK = dict(length=16, d_model=32, num_heads=2, num_layers=2, d_ff=64, steps=40, batch=16, lr=1e-2, warmup=4,
             plateau_every=10, plateau_sequences=8, plateau_min_window=20,
             eval_tokens=512, eval_batch_tokens=4096, probes=4, attention_sequences=2, position_bins=2,
             checkpoints=2, history_tokens=256, history_probes=2, finetune_steps=4, keys=8, values=8, filler=8, pairs=2, vocab=8)
"""The ``--quick`` settings: every step of the pipeline on a model too small to learn much."""


@dataclass(frozen=True)
class Stopping:
    """When training has reached its plateau (the module docstring states the rule in words)."""

    every: int = 100
    sequences: int = 64
    window: float = 0.25
    min_window: int = 400
    relative: float = 0.002
    absolute: float = 0.002
    cooldown: float = 0.2

    def rule(self) -> str:
        return (f"held-out loss at L on {self.sequences} fixed sequences every {self.every} steps; plateau when the "
                f"best of the last max({self.window:g} x steps, {self.min_window}) steps is less than "
                f"max({self.relative:g} x best before, {self.absolute:g} nats) below the best before them; then a "
                f"linear cool-down to min_lr_ratio x lr over {self.cooldown:g} x the steps so far")

    def fixed_rule(self) -> str:
        """The rule of schedule ``budget``: the same measurements, no early stop."""
        return (f"a fixed budget, the same for every run: held-out loss at L on {self.sequences} fixed sequences "
                f"every {self.every} steps, recorded but stopping nothing; at the budget a linear cool-down to "
                f"min_lr_ratio x lr over {self.cooldown:g} x the budget")

    def window_at(self, step: int) -> int:
        return max(self.min_window, math.ceil(self.window * step))

    def reached(self, history: list, step: int) -> bool:
        """Whether ``history`` ``[(step, loss), ...]`` (measured up to ``step``) shows the plateau."""
        start = step - self.window_at(step)
        before = [h for s, h in history if s <= start]
        recent = [h for s, h in history if start < s <= step]
        if start < 0 or not before or not recent:
            return False
        best = min(before)
        return best - min(recent) < max(self.relative * best, self.absolute)


THREAD_VARIABLES = ("MINIPOS_NUM_THREADS", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")
"""The thread counts: each can change a run's last bits."""

ENVIRONMENT = THREAD_VARIABLES + ("OPENBLAS_CORETYPE",)
"""The environment that can change a run's last bits, which a command repeats where it is set: the thread
counts, and ``OPENBLAS_CORETYPE``, the kernels NumPy's OpenBLAS runs (it picks them by CPU unless this
names them; a run made with one core's kernels is made again bit for bit on any CPU that can run them,
``lab/README.md``, Determinism)."""


def command_for(settings: Settings, out, environ=None) -> str:
    """``python -m lab ...`` with every setting of ``settings`` explicit, writing into ``out``, after
    the ``ENVIRONMENT`` variables set in ``environ`` (default ``os.environ``), e.g.
    ``MINIPOS_NUM_THREADS=1``."""
    environ = os.environ if environ is None else environ
    env = [f"{k}={shlex.quote(environ[k])}" for k in ENVIRONMENT if k in environ]
    args = ["python", "-m", "lab", "--out", str(out)]
    for f in fields(Settings):
        value = getattr(settings, f.name)
        flag = "--" + f.name.replace("_", "-")
        if f.name in ("task", "scheme", "seed"):
            flag += "s"                                                 # the protocol's list flags
        if value is None:
            continue
        if isinstance(value, bool):
            args.append(flag if value else "--no-" + flag[2:])
        elif isinstance(value, tuple):
            args += [flag, ",".join(str(v) for v in value)]
        else:
            args += [flag, repr(value) if isinstance(value, float) else str(value)]
    return " ".join(env + [shlex.join(args)])


def record_path(out, settings: Settings) -> Path:
    return Path(out) / f"{settings.task}-{settings.scheme}-s{settings.seed}.json"


# ----------------------------------------------------------------------------- progress

class Progress:
    """A one-line progress bar on stderr (rewritten in place on a terminal, every 10% otherwise)."""

    def __init__(self, label: str, total: int, *, stream=None, enabled: bool = True):
        self.label, self.total, self.stream, self.enabled = label, max(total, 1), stream or sys.stderr, enabled
        self.tty = getattr(self.stream, "isatty", lambda: False)()
        self.start, self.shown = time.perf_counter(), -1

    def update(self, done: int, note: str = "") -> None:
        if not self.enabled:
            return
        tenth = 10 * done // self.total
        if not self.tty and tenth == self.shown and done != self.total:
            return
        self.shown = tenth
        width = 24
        fill = width * done // self.total
        bar = "#" * fill + "." * (width - fill)
        line = f"{self.label} [{bar}] {done}/{self.total} {note} {time.perf_counter() - self.start:.0f}s"
        self.stream.write(("\r" + line + "\033[K") if self.tty else line + "\n")
        if self.tty and done == self.total:
            self.stream.write("\n")
        self.stream.flush()


# ----------------------------------------------------------------------------- training

def heldout_loss(model: Model, batch) -> float:
    """The model's mean loss on the held-out ``batch`` ``(x, y, w)`` (no gradients kept)."""
    x, y, w = batch
    return float(model.forward(x, y, weights=w, keep=False)["loss"])


def train(model: Model, task, rng, *, length, batch, steps, lr, warmup, schedule="cosine", min_lr_ratio=0.1,
          weight_decay=0.1, clip=1.0, stopping: Stopping | None = None, heldout=None,
          progress: Progress | None = None, checkpoint=None) -> dict:
    """AdamW steps on batches of ``task``; returns the curves and how training ended.

    ``schedule`` ``"cosine"`` or ``"constant"`` runs exactly ``steps`` steps. ``"plateau"`` and ``"budget"`` need
    ``stopping`` and ``heldout`` (a fixed batch ``(x, y, w)`` at ``length``): the rate is held after the
    warm-up until ``stopping.reached`` (or ``steps``; ``"budget"`` always until ``steps``), then falls
    linearly over the cool-down. The
    curve holds the mean training loss of each ``every`` steps (``steps // 50`` for the fixed
    schedules) and, with a stopping rule, the held-out loss measured at those steps. ``checkpoint(step)``,
    if given, is called after every step (the model is then as trained so far); the time it takes is not
    counted in ``seconds``."""
    held = schedule in records.HELDOUT_SCHEDULES
    if held and (stopping is None or heldout is None):
        raise ValueError(f"schedule {schedule!r} needs a stopping rule and a held-out batch")
    opt = AdamW(model.params, weight_decay=weight_decay)
    every = stopping.every if held else max(1, steps // 50)
    curve_step, curve_loss, acc, history = [], [], [], []
    if held:
        history.append((0, heldout_loss(model, heldout)))
    plateau, cool_from, end, start = None, None, steps, time.perf_counter()
    step = 0
    while step < end:
        if held:
            rate = _plateau_rate(step, lr=lr, warmup=warmup, cool_from=cool_from, end=end, min_ratio=min_lr_ratio)
        else:
            rate = learning_rate(step, lr=lr, steps=steps, warmup=warmup, schedule=schedule, min_ratio=min_lr_ratio)
        x, y, w = task.sample(rng, batch, length)
        out = model.forward(x, y, weights=w)
        loss = out["loss"]
        if not math.isfinite(loss):
            raise FloatingPointError(f"the training loss became {loss} at step {step}")
        grads = model.backward(out["context"])
        clip_by_global_norm(grads, clip)
        opt.step(grads, rate)
        acc.append(loss)
        step += 1
        if len(acc) == every or step == end:
            curve_step.append(step)
            curve_loss.append(float(np.mean(acc)))
            acc = []
        if held and cool_from is None and (step % every == 0 or step == steps):
            history.append((step, heldout_loss(model, heldout)))
            if schedule == "plateau" and stopping.reached(history, step):
                plateau = step
            if plateau is not None or step == steps:                    # the cool-down starts
                cool_from, end = step, step + math.ceil(stopping.cooldown * step)
        if progress is not None:
            progress.update(min(step, progress.total), f"loss {loss:.3f}")
        if checkpoint is not None:
            aside = time.perf_counter()
            checkpoint(step)
            start += time.perf_counter() - aside
    tail = curve_loss[-max(1, len(curve_loss) // 10):]
    out = {"curve": {"step": curve_step, "loss": curve_loss}, "final_loss": float(np.mean(tail)),
           "steps": step, "seconds": time.perf_counter() - start}
    if held:
        final = heldout_loss(model, heldout)
        rule = stopping.rule() if schedule == "plateau" else stopping.fixed_rule()
        out.update(converged=plateau is not None, heldout={"step": [s for s, _ in history] + [step],
                                                             "loss": [h for _, h in history] + [final]},
                   stopping={"rule": rule, **asdict(stopping), "budget": steps, "plateau_step": plateau,
                             "cooldown_steps": step - cool_from})
    return out


def _plateau_rate(step, *, lr, warmup, cool_from, end, min_ratio) -> float:
    """The plateau schedule's rate at ``step``: linear warm-up, ``lr``, then (from ``cool_from``) a linear
    fall to ``min_ratio * lr`` at ``end``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    if cool_from is None:
        return lr
    done = (step - cool_from + 1) / max(1, end - cool_from)
    return lr * (1 - (1 - min_ratio) * min(done, 1.0))


# ----------------------------------------------------------------------------- evaluation

def attention_stats(weights: list) -> dict:
    """Per layer, per head: the mean entropy (nats) of a query's attention weights and the mean
    distance ``i - j`` it attends, over queries; ``weights`` ``[(B, H, T, S), ...]`` with ``S = T``."""
    ent, dist = [], []
    for w in weights:
        w = w.astype(np.float64)
        T, S = w.shape[-2:]
        with np.errstate(divide="ignore", invalid="ignore"):
            plogp = np.where(w > 0, w * np.log(w), 0.0)
        ent.append((-plogp.sum(-1)).mean(axis=(0, 2)))                  # (H,)
        gap = (np.arange(T)[:, None] + (S - T)) - np.arange(S)[None]    # i - j
        dist.append((w * gap).sum(-1).mean(axis=(0, 2)))
    T = weights[0].shape[-2]
    uniform = float(np.mean(np.log(np.arange(1, T + 1))))               # causal: query i sees i + 1 keys
    return {"entropy": [e.tolist() for e in ent], "distance": [d.tolist() for d in dist], "uniform_entropy": uniform}


def _run_tokens(model: Model, x, y, w, *, decode_from: int | None = None):
    """Per-token losses and argmax hits, each ``(B, T)``: one forward pass, or (``decode_from``) the
    first ``decode_from`` tokens at once and then one token per call through the KV cache."""
    if decode_from is None or decode_from >= x.shape[1]:
        out = model.forward(x, y, weights=w, keep=False)
        return out["losses"], out["logits"].argmax(-1) == y
    caches, losses, hits = model.new_caches(), [], []
    for a, b in [(0, decode_from)] + [(t, t + 1) for t in range(decode_from, x.shape[1])]:
        out = model.forward(x[:, a:b], y[:, a:b], caches=caches, keep=False)
        losses.append(out["losses"])
        hits.append(out["logits"].argmax(-1) == y[:, a:b])
    return np.concatenate(losses, axis=1), np.concatenate(hits, axis=1)


DECODE_BATCH = 32
"""Decoding token by token (RoPE's ``dynamic``) takes ``DECODE_BATCH`` times more sequences per batch:
its cost is in the number of calls, not their size."""

SEQUENCE_DIGITS = 4
"""Decimals kept of each per-sequence number a record stores (``sequence_losses``, ``sequence_accuracy``):
the means and standard errors are computed before the rounding (5e-5 at most, far below any standard error)."""


def _in_batches(n, length, batch_tokens):
    """Batch sizes that cover ``n`` sequences of ``length`` with about ``batch_tokens`` tokens each."""
    per = max(1, batch_tokens // length)
    for start in range(0, n, per):
        yield min(per, n - start)


def _per_sequence(values, weights=None):
    """The mean of each row of ``values`` ``(B, T)`` over the tokens ``weights`` weighs (or all): ``(B,)``."""
    if weights is None:
        return values.mean(axis=1)
    return (values * weights).sum(axis=1) / weights.sum(axis=1)


def _mean_stderr(per_sequence) -> tuple[float, float]:
    """The mean of per-sequence values and its standard error over sequences, ``sd / sqrt(n)``."""
    n = len(per_sequence)
    sd = float(np.std(per_sequence, ddof=1)) if n > 1 else 0.0
    return float(np.mean(per_sequence)), sd / math.sqrt(n)


def _stored(per_sequence) -> list:
    return np.round(np.asarray(per_sequence, np.float64), SEQUENCE_DIGITS).tolist()


def _loss_summary(losses, floor_pos, settings, length):
    """Markov and text: the mean loss over sequences of ``length`` (``losses`` ``(B, T)``), its standard
    error over sequences, the per-sequence means (``sequence_losses``), the floor, and the loss per bin
    of ``settings.length / settings.position_bins`` positions."""
    per_seq = _per_sequence(losses)
    mean, se = _mean_stderr(per_seq)
    entry = {"loss": mean, "loss_stderr": se, "floor": None, "excess": None, "tokens": int(losses.size),
             "sequences": len(per_seq), "positions": None}
    if floor_pos is not None:
        entry["floor"] = float(floor_pos.mean())
        entry["excess"] = mean - entry["floor"]
    width = max(1, settings.length // settings.position_bins)
    edges = list(range(0, length, width)) + [length]
    spans = list(zip(edges[:-1], edges[1:]))
    entry["positions"] = {"edges": edges, "loss": [float(losses[:, a:b].mean()) for a, b in spans],
                          "floor": None if floor_pos is None else [float(floor_pos[a:b].mean()) for a, b in spans]}
    entry["sequence_losses"] = _stored(per_seq)
    return entry


def _sizes(settings: Settings, length: int, history: bool) -> tuple[int, int]:
    """``(sequences per length, retrieval sequences per offset)`` of a final evaluation or a checkpoint's."""
    tokens, probes = ((settings.history_tokens, settings.history_probes) if history
                      else (settings.eval_tokens, settings.probes))
    return max(tokens // length, settings.eval_sequences, 2), max(probes, 2)


def evaluate(model: Model, task, settings: Settings, length: int, *, decode_from: int | None = None,
             history: bool = False) -> dict:
    """The metrics of ``model`` at ``length`` (one per-length entry of a record). ``history``: a
    checkpoint's evaluation (``history_tokens``, ``history_probes``, its own sequences drawn from
    ``(seed, 4, length)``, no attention statistics) instead of the final one (``(seed, 1, length)``)."""
    rng = np.random.default_rng([settings.seed, 4 if history else 1, length])
    n, probes = _sizes(settings, length, history)
    if isinstance(task, KeyValueRecall):
        return _evaluate_retrieval(model, task, settings, length, rng, decode_from, probes, history)
    floor_pos = task.position_floor(length) if isinstance(task, MarkovSource) else None
    losses, first = [], None
    batch_tokens = settings.eval_batch_tokens * (1 if decode_from is None else DECODE_BATCH)
    for b in _in_batches(n, length, batch_tokens):
        if isinstance(task, TextSource):
            x, y, w = task.sample(rng, b, length, split="heldout")
        else:
            x, y, w = task.sample(rng, b, length)
        first = x[:settings.attention_sequences] if first is None else first
        losses.append(_run_tokens(model, x, y, w, decode_from=decode_from)[0])
    entry = {"length": length, "status": "ok", "seen_in_training": length <= settings.length,
             **_loss_summary(np.concatenate(losses).astype(np.float64), floor_pos, settings, length)}
    entry["attention"] = None if decode_from is not None or history else attention_stats(
        model.forward(first, keep=False, return_weights=True)["attention"])
    return entry


def _evaluate_retrieval(model, task: KeyValueRecall, settings, length, rng, decode_from, probes, history):
    """Accuracy per offset (read block at the end, written ``offset`` before) and loss on the targets,
    each with its standard error over sequences (``probes`` sequences per offset, ``pairs`` targets each)."""
    cells, all_loss, all_acc, last = [], [], [], None
    per = max(1, settings.eval_batch_tokens * (1 if decode_from is None else DECODE_BATCH) // length)
    for offset in task.offsets(length, settings.length):
        x, y, w, dist = task.sample_at(rng, probes, length, offset)
        got = [_run_tokens(model, x[s:s + per], y[s:s + per], w[s:s + per], decode_from=decode_from)
               for s in range(0, len(x), per)]
        losses = np.concatenate([g[0] for g in got]).astype(np.float64)
        hits = np.concatenate([g[1] for g in got]).astype(np.float64)
        seq_loss, seq_acc = _per_sequence(losses, w), _per_sequence(hits, w)          # (probes,) each
        acc, acc_se = _mean_stderr(seq_acc)
        loss, loss_se = _mean_stderr(seq_loss)
        cells.append({"offset": offset, "accuracy": acc, "accuracy_stderr": acc_se, "loss": loss,
                      "loss_stderr": loss_se, "sequences": len(seq_acc), "probes": int(w.sum()),
                      "distance_min": int(dist.min()), "distance_max": int(dist.max()),
                      "seen_in_training": offset <= task.max_offset(settings.length),
                      "sequence_losses": _stored(seq_loss), "sequence_accuracy": _stored(seq_acc)})
        all_loss.append(seq_loss)
        all_acc.append(seq_acc)
        last = x[:settings.attention_sequences]
    seq_loss, seq_acc = np.concatenate(all_loss), np.concatenate(all_acc)
    loss, loss_se = _mean_stderr(seq_loss)
    acc, acc_se = _mean_stderr(seq_acc)
    entry = {"length": length, "status": "ok", "seen_in_training": length <= settings.length,
             "loss": loss, "loss_stderr": loss_se, "floor": None, "excess": None,
             "tokens": int(sum(c["probes"] for c in cells)), "sequences": len(seq_acc), "positions": None,
             "accuracy": acc, "accuracy_stderr": acc_se, "offsets": cells}
    entry["attention"] = None if decode_from is not None or history else attention_stats(
        model.forward(last, keep=False, return_weights=True)["attention"])
    return entry


def _cannot_run(spec: dict, length: int):
    """The reason ``spec`` cannot run at ``length``, or None."""
    rows = spec.get("max_positions")
    if spec["name"] == "learned" and length > rows:
        return f"a learned absolute table has {rows} rows (positions 0..{rows - 1}); length {length} needs up to {length - 1}"
    return None


def _evaluate_all(model_for, task, settings, label, *, decode_from=None, verbose=True,
                  history=False) -> tuple[list, float]:
    """Evaluate at every length; ``model_for(length)`` gives the model (and its spec) for that length."""
    start, entries = time.perf_counter(), []
    lengths = settings.lengths()
    bar = Progress(f"{label} eval", len(lengths), enabled=verbose)
    for i, length in enumerate(lengths):
        model, spec = model_for(length)
        reason = _cannot_run(spec, length)
        if reason:
            entries.append({"length": length, "status": "cannot run", "reason": reason})
        else:
            entries.append(evaluate(model, task, settings, length, decode_from=decode_from, history=history))
        note = "cannot run" if reason else (f"loss {entries[-1]['loss']:.3f}" if task.kind != "retrieval"
                                             else f"acc {entries[-1]['accuracy']:.2f}")
        bar.update(i + 1, f"{length}: {note}")
    return entries, time.perf_counter() - start


def checkpoint_steps(settings: Settings) -> list[int]:
    """The steps after which every length is evaluated for the record's ``history``: ``checkpoints`` of
    them, evenly spread over the run, the last at its end. Under ``budget`` the run is the budget and
    its cool-down; under ``plateau`` the budget alone (a plateau ends the run sooner, and the checkpoints
    past its end are not reached: the end of training is then evaluated instead)."""
    total = settings.steps
    if settings.schedule == "budget":
        total += math.ceil(settings.cooldown * settings.steps)
    return sorted({max(1, round(k * total / settings.checkpoints)) for k in range(1, settings.checkpoints + 1)})


# ----------------------------------------------------------------------------- one run

def heldout_batch(task, settings: Settings):
    """The stopping rule's fixed held-out batch at L, drawn from ``(seed, 3)``."""
    rng = np.random.default_rng([settings.seed, 3])
    if isinstance(task, TextSource):
        return task.sample(rng, settings.plateau_sequences, settings.length, split="heldout")
    return task.sample(rng, settings.plateau_sequences, settings.length)


def run_one(settings: Settings, out=None, *, verbose: bool = True) -> dict:
    """Train and evaluate one (task, scheme, seed); write the record into ``out`` (if given); return it."""
    keep_freed_memory()
    t0 = time.perf_counter()
    task = settings.make_task()
    spec = scheme_specs.default_spec(settings.scheme, settings.length)
    config = settings.model_config(task.vocab_size, spec)
    model = Model(config, seed=settings.seed)
    label = f"[{settings.task} {scheme_specs.label(spec)} s{settings.seed}]"
    stopping = settings.stopping()
    history, marks = [], set(checkpoint_steps(settings))

    def checkpoint(step, force=False):
        if step in marks or force:
            entries, secs = _evaluate_all(lambda n: (model, spec), task, settings, label, verbose=False, history=True)
            history.append({"step": step, "lengths": entries, "seconds": secs})
    trained = train(model, task, np.random.default_rng([settings.seed, 0]), length=settings.length,
                    batch=settings.batch, steps=settings.steps, lr=settings.lr, warmup=settings.warmup,
                    schedule=settings.schedule, min_lr_ratio=settings.min_lr_ratio,
                    weight_decay=settings.weight_decay, clip=settings.clip, stopping=stopping,
                    heldout=heldout_batch(task, settings) if stopping else None,
                    progress=Progress(label + " train", settings.steps, enabled=verbose), checkpoint=checkpoint)
    if not history or history[-1]["step"] != trained["steps"]:
        checkpoint(trained["steps"], force=True)                       # a plateau ended training early
    results = {}
    entries, secs = _evaluate_all(lambda n: (model, spec), task, settings, label, verbose=verbose)
    results["base"] = {"spec": spec, "lengths": entries, "seconds": secs}
    if settings.scheme == "rope" and settings.extensions:
        results.update(_rope_extensions(model, task, settings, label, verbose))
    rec = {
        "schema": records.SCHEMA,
        "command": command_for(settings, out if out is not None else "OUT"),
        "settings": {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(settings).items()},
        "task": task.config(),
        "model": config.to_dict(),
        "scheme": spec,
        "seed": settings.seed,
        "versions": records.versions(),
        "floor": task.baselines() if isinstance(task, MarkovSource) else None,
        "train": trained,
        "history": history,
        "results": results,
        "seconds": time.perf_counter() - t0,
    }
    if out is not None:
        records.write(record_path(out, settings), rec)
    return rec


def _rope_extensions(model: Model, task, settings: Settings, label: str, verbose: bool) -> dict:
    """RoPE extended without training (each scaling, stretched length / L) and PI fine-tuned at 2L."""
    L, out = settings.length, {}
    for kind in scheme_specs.EXTENSIONS:
        built = {}

        def model_for(n, kind=kind, built=built):
            spec = scheme_specs.extension_spec(kind, L, n / L)
            key = repr(spec)
            if key not in built:
                built.clear()
                m = Model(replace(model.config, scheme=spec), seed=settings.seed)
                copy_parameters(model, m)
                built[key] = m
            return built[key], spec
        entries, secs = _evaluate_all(model_for, task, settings, f"{label} {kind}",
                                      decode_from=L if kind == "dynamic" else None, verbose=verbose)
        out[kind] = {"spec": scheme_specs.extension_spec(kind, L, settings.eval_factors[-1]), "lengths": entries,
                     "seconds": secs, "stretch": "length / L at each length" if kind != "dynamic"
                     else "by its own prefix length, token by token"}
    # PI: interpolate by finetune_factor, then fine-tune at finetune_factor * L (same tokens per step)
    s = settings.finetune_factor
    spec = {"name": "rope", "scaling": {"rope_type": "linear", "factor": float(s)}}
    tuned = Model(replace(model.config, scheme=spec), seed=settings.seed)
    copy_parameters(model, tuned)
    ft = train(tuned, task, np.random.default_rng([settings.seed, 2]), length=s * L, batch=settings.finetune_batch,
               steps=settings.finetune_steps, lr=settings.finetune_lr, warmup=max(1, settings.finetune_steps // 10),
               schedule="cosine", min_lr_ratio=settings.min_lr_ratio, weight_decay=settings.weight_decay,
               clip=settings.clip,
               progress=Progress(f"{label} pi-finetune", settings.finetune_steps, enabled=verbose))
    entries, secs = _evaluate_all(lambda n: (tuned, spec), task, settings, f"{label} pi-finetune", verbose=verbose)
    out["pi-finetune"] = {"spec": spec, "lengths": entries, "seconds": secs + ft["seconds"],
                          "finetune": {"length": s * L, "batch": settings.finetune_batch,
                                       "steps": settings.finetune_steps, "lr": settings.finetune_lr, **ft}}
    return out
