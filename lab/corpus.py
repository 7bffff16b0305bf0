"""The text tasks' corpora: real text that no one here wrote and every machine rebuilds bit for bit.

**Code** (task ``text``): the Python source of SymPy 1.14.0 (``pip install sympy==1.14.0``, the ``lab``
extra; SymPy is already what ``proofs/`` runs on), read as bytes: every ``.py`` file of the installed
package outside its ``tests`` folders, in sorted path order, each followed by one newline byte. Every
tenth file (by that order, the 10th, 20th, ...) is held out for evaluation; the rest train. About 35 %
of it is docstrings and comments: this corpus is code, not prose.

**Prose** (task ``prose``): Jane Austen's six completed novels, as Debian ships them in the package
``r-cran-janeaustenr`` 1.0.0-1 (Julia Silge's janeaustenr, MIT license; the texts are Project
Gutenberg's, in the public domain). ``python -m lab.corpus fetch`` downloads that package through
Debian's own client (``apt-get download``, no hub at run time), checks its SHA-256, reads the novels
from the package's R lazy-load database (``data/Rdata.rdx`` is an R serialization read by
``rdata.read_rds``; each entry of ``data/Rdata.rdb`` is a 4-byte length and a zlib stream that
``rdata.parser.parse_data`` reads), and writes one UTF-8 file per novel, its lines joined by newlines
and ended by one, into ``data_dir()``. The first 90 % of each novel's lines train and the last 10 %
are held out, so every novel is in both parts.

Modelling is byte level, over the bytes that occur (the vocabulary is the sorted set of bytes of the
whole corpus, so a held-out byte is never unknown). ``origin(name)`` names the source, its version,
the rule and the SHA-256 of the concatenated bytes, which every record of the task carries. A corpus
that does not hash to its pinned SHA-256 is refused by name rather than silently giving another text.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zlib
from importlib import metadata
from pathlib import Path

import numpy as np

from minipos import terminal

__all__ = ["PACKAGE", "VERSION", "SHA256", "HOLDOUT_EVERY", "ORIGIN", "files", "load", "PROSE", "data_dir",
           "fetch_prose", "prose_missing", "load_prose", "CORPORA", "main"]

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
    """The code corpus: ``{"train", "heldout"}`` (uint8 arrays of bytes), ``"files"`` per split, and ``"sha256"``;
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


# ----------------------------------------------------------------------------- prose: Jane Austen's novels

PROSE = {
    "package": "r-cran-janeaustenr", "version": "1.0.0-1",
    "deb_sha256": "df6bddf211906d1ff404f8ff662c21b34e6660e7f54a311084e749050c019c95",
    "sha256": "65b434d16a8755142bfa95ba19c5f9abd0d30cf3dffe3b6793e834f9f56dcc96",
    "novels": ("emma", "mansfieldpark", "northangerabbey", "persuasion", "prideprejudice", "sensesensibility"),
    "holdout": 0.1,
    "license": "MIT (the package, by Julia Silge); the texts are Project Gutenberg's, in the public domain",
}
"""The prose corpus: Debian's package, its pinned SHA-256, the SHA-256 of the prepared text (the six
novels in this order, each as written by ``fetch_prose``), and the share of each novel held out."""

PROSE_ORIGIN = (f"Jane Austen's six novels from Debian's {PROSE['package']} {PROSE['version']} (data/Rdata.rdb), "
                f"each novel's lines joined by '\\n' and ended by one, UTF-8 bytes, in the order "
                f"{', '.join(PROSE['novels'])}; the last {PROSE['holdout']:.0%} of each novel's lines held out")


def data_dir() -> Path:
    """Where the prepared prose corpus lives: ``$MINIPOS_LAB_DATA``, else ``~/.cache/minipos-lab``."""
    return Path(os.environ.get("MINIPOS_LAB_DATA") or Path.home() / ".cache" / "minipos-lab")


def _prose_dir() -> Path:
    return data_dir() / f"janeaustenr-{PROSE['version']}"


def _ar_members(data: bytes) -> dict:
    """The members of an ``ar`` archive (a Debian package), ``{name: bytes}``."""
    if not data.startswith(b"!<arch>\n"):
        raise ValueError("not a Debian package (no ar archive header)")
    out, at = {}, 8
    while at + 60 <= len(data):
        header = data[at:at + 60]
        name, size = header[:16].decode("ascii").strip().rstrip("/"), int(header[48:58].decode("ascii").strip())
        out[name] = data[at + 60:at + 60 + size]
        at += 60 + size + (size % 2)
    return out


def _novels_from_deb(deb: bytes) -> dict:
    """``{novel: text}`` from the package's bytes: its data tarball's R lazy-load database."""
    try:
        import rdata                                                   # the lab extra: only fetching needs it
    except ImportError:
        raise RuntimeError("reading the package's R data needs rdata: pip install rdata==1.1.0 "
                           "(or pip install -e '.[lab]')") from None
    members = _ar_members(deb)
    tarball = next((v for k, v in members.items() if k.startswith("data.tar")), None)
    if tarball is None:
        raise ValueError("the package has no data.tar member")
    base = "./usr/lib/R/site-library/janeaustenr/data/"
    with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:*") as tar:
        rdx, rdb = (tar.extractfile(base + name).read() for name in ("Rdata.rdx", "Rdata.rdb"))
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "Rdata.rdx").write_bytes(rdx)
        index = rdata.read_rds(Path(tmp) / "Rdata.rdx")
    novels = {}
    for name in PROSE["novels"]:
        start, size = (int(v) for v in index["variables"][name])
        raw = zlib.decompress(rdb[start + 4:start + size])              # a 4-byte length, then zlib
        lines = rdata.conversion.convert(rdata.parser.parse_data(raw, extension=".rds"))
        novels[name] = "\n".join(str(line) for line in lines) + "\n"
    return novels


def fetch_prose(deb: str | None = None, *, log=print) -> Path:
    """Download (``apt-get download``, unless ``deb`` names the package file), check and prepare the prose
    corpus into ``data_dir()``; return its folder. Refuses a package or a text whose SHA-256 differs."""
    with tempfile.TemporaryDirectory() as tmp:
        if deb is None:
            if shutil.which("apt-get") is None:
                raise RuntimeError(f"apt-get is not on this machine: get {PROSE['package']}_{PROSE['version']}_all.deb "
                                   "from a Debian mirror and pass it with --deb FILE")
            spec = f"{PROSE['package']}={PROSE['version']}"
            log(f"apt-get download {spec}")
            done = subprocess.run(["apt-get", "download", spec], cwd=tmp, capture_output=True, text=True)
            found = sorted(Path(tmp).glob("*.deb"))
            if done.returncode != 0 or not found:
                raise RuntimeError(f"apt-get download {spec} failed: {(done.stderr or done.stdout).strip()[-300:]}")
            deb = found[0]
        data = Path(deb).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != PROSE["deb_sha256"]:
        raise RuntimeError(f"{deb}: SHA-256 {digest}, not the pinned {PROSE['deb_sha256']} of "
                           f"{PROSE['package']} {PROSE['version']}")
    novels = _novels_from_deb(data)
    text_digest = hashlib.sha256(b"".join(novels[n].encode("utf-8") for n in PROSE["novels"])).hexdigest()
    if text_digest != PROSE["sha256"]:
        raise RuntimeError(f"the prepared novels hash to {text_digest}, not the pinned {PROSE['sha256']}")
    folder = _prose_dir()
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in novels.items():
        target = folder / f"{name}.txt"
        tmp = target.with_name(target.name + ".tmp")
        tmp.write_bytes(text.encode("utf-8"))
        os.replace(tmp, target)
    log(f"the prose corpus ({sum(len(t.encode()) for t in novels.values())} bytes, sha256 {text_digest}) is in {folder}")
    return folder


def prose_missing() -> Path | None:
    """The first novel file of the prose corpus that is not there (``python -m lab.corpus fetch`` writes them), or
    None when every one is: a check of presence only, which ``load_prose`` completes with the hash."""
    folder = _prose_dir()
    return next((folder / f"{name}.txt" for name in PROSE["novels"] if not (folder / f"{name}.txt").is_file()), None)


def load_prose() -> dict:
    """The prose corpus, as ``load`` gives the code corpus; ``RuntimeError`` naming the command that
    prepares it when it is missing, and when its bytes do not hash to ``PROSE["sha256"]``."""
    folder, digest, parts = _prose_dir(), hashlib.sha256(), {"train": [], "heldout": []}
    for name in PROSE["novels"]:
        path = folder / f"{name}.txt"
        if not path.is_file():
            raise RuntimeError(f"the prose corpus is not prepared ({path} is missing): python -m lab.corpus fetch")
        data = path.read_bytes()
        digest.update(data)
        lines = data.split(b"\n")[:-1]                                 # every line ends in b"\n"
        cut = len(lines) - round(PROSE["holdout"] * len(lines))
        parts["train"].append(b"".join(line + b"\n" for line in lines[:cut]))
        parts["heldout"].append(b"".join(line + b"\n" for line in lines[cut:]))
    if digest.hexdigest() != PROSE["sha256"]:
        raise RuntimeError(f"the prose corpus in {folder} hashes to {digest.hexdigest()}, not the pinned "
                           f"{PROSE['sha256']}: prepare it again with python -m lab.corpus fetch")
    return {"train": np.frombuffer(b"".join(parts["train"]), np.uint8),
            "heldout": np.frombuffer(b"".join(parts["heldout"]), np.uint8),
            "files": {k: len(v) for k, v in parts.items()}, "sha256": PROSE["sha256"]}


CORPORA = {
    "text": {"load": load, "origin": ORIGIN, "package": PACKAGE, "version": VERSION, "kind": "code"},
    "prose": {"load": load_prose, "origin": PROSE_ORIGIN, "package": PROSE["package"], "version": PROSE["version"],
              "kind": "prose"},
}
"""The corpus of each text task: how to load it and what its records say it is."""


USAGE = "usage: python -m lab.corpus fetch [--deb FILE]"


def main(argv=None) -> int:
    """``python -m lab.corpus fetch [--deb FILE]``: prepare the prose corpus (``fetch_prose``); a closed
    pipe ends it quietly, output onto a full disk is one line (``minipos.terminal.run``)."""
    return terminal.run(_main, argv, prog="python -m lab.corpus")


def _main(argv) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    deb = None
    if argv in (["--help"], ["-h"]):
        print(USAGE)
        return 0
    if argv[:1] != ["fetch"] or len(argv) not in (1, 3) or (len(argv) == 3 and argv[1] != "--deb"):
        print(USAGE, file=sys.stderr)
        return 2
    if len(argv) == 3:
        deb = argv[2]
        if not Path(deb).is_file():
            print(f"{USAGE}\n--deb {deb}: not a file", file=sys.stderr)
            return 2
    try:
        fetch_prose(deb)
    except (OSError, RuntimeError, ValueError) as error:
        print(f"python -m lab.corpus: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
