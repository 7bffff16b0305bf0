"""The text task's corpus: real text that no one here wrote and every machine rebuilds bit for bit.

The corpus is the Python source of SymPy 1.14.0 (``pip install sympy==1.14.0``, the ``lab`` extra;
SymPy is already what ``proofs/`` runs on), read as bytes: every ``.py`` file of the installed
package outside its ``tests`` folders, in sorted path order, each followed by one newline byte. Every
tenth file (by that order, the 10th, 20th, ...) is held out for evaluation; the rest train. Modelling
is byte level, over the bytes that occur (the vocabulary is the sorted set of bytes of the whole
corpus, so a held-out byte is never unknown).

SymPy is BSD-licensed code written by its authors; ``ORIGIN`` names the version, the rule and the
SHA-256 of the concatenated bytes, which every record of the text task carries. A different SymPy
installed is refused by name rather than silently giving another corpus.
"""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

import numpy as np

__all__ = ["PACKAGE", "VERSION", "SHA256", "HOLDOUT_EVERY", "ORIGIN", "files", "load"]

PACKAGE, VERSION = "sympy", "1.14.0"
SHA256 = "5459d1a3880c29c26a38fff02d4c513e5f03a66d64b231c7e7e1cd0547efa7b7"
"""SHA-256 of the whole corpus (every file, train and held out, in order), as built on 2026-12-01."""
HOLDOUT_EVERY = 10

ORIGIN = (f"the .py files of {PACKAGE} {VERSION} outside tests/ folders, sorted by path, bytes, each + b'\\n'; "
          f"every {HOLDOUT_EVERY}th file held out")


def files() -> list[Path]:
    """The corpus's files in order; ``RuntimeError`` naming what to install if SymPy is not 1.14.0."""
    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise RuntimeError(f"the text task's corpus is {PACKAGE} {VERSION}'s source: "
                           f"pip install {PACKAGE}=={VERSION} (or pip install -e '.[lab]')") from None
    if dist.version != VERSION:
        raise RuntimeError(f"the text task's corpus is {PACKAGE} {VERSION}'s source, but {PACKAGE} {dist.version} "
                           f"is installed: pip install {PACKAGE}=={VERSION} (or pip install -e '.[lab]')")
    paths = []
    for f in dist.files or ():
        parts = Path(f).parts
        if parts and parts[0] == PACKAGE and f.suffix == ".py" and "tests" not in parts:
            paths.append(f)
    return [Path(dist.locate_file(f)) for f in sorted(paths, key=lambda p: Path(p).as_posix())]


def load() -> dict:
    """``{"train", "heldout"}`` (uint8 arrays of bytes), ``"files"`` per split, and ``"sha256"``;
    ``RuntimeError`` if the bytes do not hash to ``SHA256``."""
    paths = files()
    digest, parts = hashlib.sha256(), {"train": [], "heldout": []}
    for i, path in enumerate(paths):
        data = path.read_bytes() + b"\n"
        digest.update(data)
        parts["heldout" if (i + 1) % HOLDOUT_EVERY == 0 else "train"].append(data)
    if digest.hexdigest() != SHA256:
        raise RuntimeError(f"the {PACKAGE} {VERSION} source here hashes to {digest.hexdigest()}, not the corpus's "
                           f"{SHA256}: an installed file was changed; reinstall {PACKAGE}=={VERSION}")
    return {"train": np.frombuffer(b"".join(parts["train"]), np.uint8),
            "heldout": np.frombuffer(b"".join(parts["heldout"]), np.uint8),
            "files": {k: len(v) for k, v in parts.items()}, "sha256": SHA256}
