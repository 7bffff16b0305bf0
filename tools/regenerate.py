"""Regenerate every file minipos derives from its scheme registry (``minipos/schemes.py``).

Run from the repository root after adding, changing or removing a registered scheme::

    python tools/regenerate.py            # rewrite what is stale, print what changed
    python tools/regenerate.py --check    # change nothing; exit 1 naming every stale file

What it writes (each file through a temp file and a rename):

- ``spec/vectors/<family>.json``: the golden vectors. The spec is additive: a case already committed
  is kept byte for byte (its values may differ in the last bits on another CPU, within tolerance); a
  case the builders make that the file lacks (the ``layer`` and ``layer_grad`` cases of a new scheme)
  is added; a case no builder makes any more (a scheme removed) is dropped. A committed case whose
  params or inputs the builders now make differently is an error: a changed case needs a new name.
  Building a backward family checks every gradient against finite differences first.
- ``spec/catalogue.md``: ``spec/catalogue.py``'s table of schemes and layer settings.
- The blocks between ``<!-- registry:NAME -->`` and ``<!-- /registry:NAME -->`` in ``README.md`` and
  ``docs/index.md``: the table of registered schemes and the table of seams with their schemes.

``tests/test_regenerate.py`` runs ``--check``'s logic, so the test suite (and CI) fails, naming this
command, whenever one of these files is stale.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from minipos import schemes, vectors                          # noqa: E402
from minipos.seams import SEAMS                                # noqa: E402
from minipos.vectors.files import _dumps                       # noqa: E402  the export's own format

COMMAND = "python tools/regenerate.py"
VECTORS = ROOT / "spec" / "vectors"
BLOCK = re.compile(r"(<!-- registry:(?P<name>[a-z-]+) -->\n)(?P<body>.*?)(<!-- /registry:(?P=name) -->)", re.S)

SEAM_WHAT = {
    "none": "nothing: attention without position is permutation-equivariant, and only a causal mask tells "
            "positions apart",
    "input": "adds a position vector to the token embeddings before the projections",
    "rotate": "maps $q_i$ and $k_j$ by a position-dependent transform before the dot product",
    "bias": "adds $b_h(i, j)$ to the logits, independent of content",
    "content-position": "adds terms that couple content with relative-position embeddings",
    "value": "adds a relative-position vector to each value the head averages",
}
"""What each seam changes (the seams' table of ``minipos.seams``), for the generated seam tables."""

PAGES = {"nope": "why-position.md#nope-no-position-scheme", "mrope": "mrope.md", "nope-temperature": "irope.md"}
"""The docs page of a scheme whose page is not ``docs/schemes/<name>.md`` (the rule for a new scheme)."""


class Stale(Exception):
    """Something the registry derives cannot be regenerated as asked (a committed case changed)."""


# --------------------------------------------------------------------------- the golden vectors

def merged_family(family: str, committed: dict | None) -> tuple[dict, list]:
    """``(document, changes)``: the family as the builders make it, every committed case kept as it is;
    ``changes`` lists the cases added and dropped (empty: the committed file is current)."""
    built = vectors.build_family(family)
    if committed is None:
        return built, [f"{family}: new family, {len(built['cases'])} cases"]
    old = {c["name"]: c for c in committed["cases"]}
    cases, added = [], []
    for case in built["cases"]:
        kept = old.get(case["name"])
        if kept is None:
            cases.append(case)
            added.append(case["name"])
        elif kept["params"] != case["params"] or kept["inputs"] != case["inputs"]:
            raise Stale(f"spec/vectors/{family}.json: the builders now make case {case['name']!r} with other params "
                        "or inputs; the spec is additive, so a changed case needs a new name (in its builder or its "
                        "scheme's registry example)")
        else:
            cases.append(kept)
    dropped = [name for name in old if name not in {c["name"] for c in built["cases"]}]
    changes = [f"{family}: case {n} added" for n in added] + [f"{family}: case {n} dropped" for n in dropped]
    if not changes:
        return committed, []
    doc = {**built, "cases": cases}
    new = [c for c in cases if c["name"] in added]
    mismatches = vectors.check_document({**doc, "cases": new}) if new else []
    if mismatches:
        raise Stale(f"spec/vectors/{family}.json: the new cases do not check: {vectors.format_mismatches(mismatches)}")
    return doc, changes


def vector_files() -> dict:
    """``path -> (text, changes)`` for every family file."""
    out = {}
    for family in vectors.FAMILIES:
        path = VECTORS / f"{family}.json"
        committed = json.loads(path.read_text(encoding="utf-8")) if path.exists() else None
        doc, changes = merged_family(family, committed)
        out[path] = (_dumps(doc) + "\n" if changes else None, changes)
    return out


# --------------------------------------------------------------------------- the catalogue

def catalogue_text() -> str:
    spec = importlib.util.spec_from_file_location("spec_catalogue", ROOT / "spec" / "catalogue.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.render()


# --------------------------------------------------------------------------- README and docs/index.md

def page_of(name: str) -> str | None:
    """The docs page of the registered scheme ``name`` (relative to ``docs/``), or ``None``."""
    if name in PAGES:
        return PAGES[name]
    page = f"schemes/{name}.md"
    return page if (ROOT / "docs" / page).exists() else None


def _summary(cls) -> str:
    """The first sentence of the class's docstring on one line (a sentence ends at a full stop before a
    capital, so "et al. 2022" does not end one), its ``code`` as Markdown's `code`."""
    paragraph = " ".join((cls.__doc__ or "").strip().split("\n\n")[0].split())
    sentence = re.split(r"(?<=\.)\s+(?=[A-Z])", paragraph)[0]
    return sentence.replace("``", "`").replace("|", "\\|")


def _link(name: str, prefix: str) -> str:
    page = page_of(name)
    return f"[`{name}`]({prefix}{page})" if page else f"`{name}`"


def schemes_table(prefix: str) -> str:
    """The registered schemes: name (linked to its page), class, seams, what it is."""
    rows = ["| scheme | class | seams | what it is |", "|---|---|---|---|"]
    for name, entry in schemes.ENTRIES.items():
        cls = entry.cls
        rows.append(f"| {_link(name, prefix)} | `{cls.__module__}.{cls.__name__}` | "
                    f"{', '.join(cls.seams) or 'none'} | {_summary(cls)} |")
    return "\n".join(rows) + "\n"


def seams_table(prefix: str) -> str:
    """Each seam, what it changes, and the registered schemes that use it."""
    rows = ["| seam | what it changes | schemes |", "|---|---|---|"]
    for seam in ("none", *SEAMS):
        names = [n for n, e in schemes.ENTRIES.items() if (seam in e.cls.seams if seam != "none" else not e.cls.seams)]
        rows.append(f"| {seam} | {SEAM_WHAT[seam]} | {', '.join(_link(n, prefix) for n in names) or '–'} |")
    return "\n".join(rows) + "\n"


GENERATORS = {"schemes": schemes_table, "seams": seams_table}
DOCUMENTS = {ROOT / "README.md": "docs/", ROOT / "docs" / "index.md": ""}
"""Files with generated blocks, and the prefix of a docs page's link from each."""


def with_blocks(text: str, prefix: str, path: Path) -> str:
    """``text`` with every ``<!-- registry:NAME -->`` block regenerated."""
    def body(match):
        name = match.group("name")
        if name not in GENERATORS:
            raise Stale(f"{path.relative_to(ROOT)}: unknown generated block registry:{name} "
                        f"(known: {', '.join(GENERATORS)})")
        return match.group(1) + GENERATORS[name](prefix) + match.group(4)
    return BLOCK.sub(body, text)


# --------------------------------------------------------------------------- all of it

def stale_files() -> dict:
    """``path -> (new text, what changed)`` for every derived file that differs from what the registry
    gives now (empty: everything is current)."""
    out = {path: found for path, found in vector_files().items() if found[1]}
    text = catalogue_text()
    path = ROOT / "spec" / "catalogue.md"
    if path.read_text(encoding="utf-8") != text:
        out[path] = (text, ["spec/catalogue.md regenerated"])
    for path, prefix in DOCUMENTS.items():
        old = path.read_text(encoding="utf-8")
        new = with_blocks(old, prefix, path)
        if new != old:
            out[path] = (new, [f"{path.relative_to(ROOT)}: the generated tables"])
    return out


def write_atomic(path: Path, text: str) -> None:
    """``text`` into ``path`` through a temp file in its directory and a rename."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog=COMMAND, description="Regenerate what minipos derives from its registry.")
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 naming every stale file")
    args = parser.parse_args(argv)
    try:
        stale = stale_files()
    except Stale as err:
        print(f"{COMMAND}: {err}", file=sys.stderr)
        return 1
    for path, (text, changes) in stale.items():
        for change in changes:
            print(("stale: " if args.check else "") + change)
        if not args.check:
            write_atomic(path, text)
    if args.check and stale:
        print(f"{len(stale)} file(s) are stale: run {COMMAND}", file=sys.stderr)
        return 1
    if not stale:
        print("everything derived from the registry is current")
    return 0


if __name__ == "__main__":
    sys.exit(main())
