"""Offline fonts for the characters a reader's system fonts may lack: the Chinese that the article-table
page quotes (and the example on "Why position at all") and the emoji of the article's verdicts.

Two small subsets, made with fontTools' subsetter, are committed in ``docs/assets/fonts/``:

- ``minipos-cjk.woff`` from Noto Sans CJK SC (Debian's ``fonts-noto-cjk``), the CJK characters;
- ``minipos-emoji.woff`` from Noto Color Emoji (Debian's ``fonts-noto-color-emoji``), the emoji;

both under the SIL Open Font License 1.1 (``docs/assets/fonts/OFL.txt``, shipped with the site).
``fonts.css`` declares them as one family, ``minipos-glyphs``, each face limited by ``unicode-range``
to the characters it holds, and puts that family first in the theme's text and code fonts
(``--md-text-font``, ``--md-code-font``, which Material for MkDocs and Zensical both read): every
other character falls through to the theme's own fonts.

``problems(site)`` is a build step: every character of a built page in the ranges below
(``RANGES``) must be in the subset that serves it, or the build fails naming the characters and the
pages. ``python -m docs.build fonts`` remakes the subsets and ``fonts.css`` from a built site (with
the two Debian packages installed), keeping the characters the subsets already hold, and says which
characters the source fonts lack.
"""

from __future__ import annotations

import functools
import io
import os
import tempfile
from pathlib import Path

from fontTools import subset
from fontTools.ttLib import TTCollection, TTFont

from .checks import pages, text_of

HERE = Path(__file__).resolve().parents[1] / "assets" / "fonts"     # docs/assets/fonts
SITE_FOLDER = "assets/fonts"
FAMILY = "minipos-glyphs"

# face -> (the code point ranges it serves, the source font, the index of the face in a collection)
RANGES = {
    "minipos-cjk": ([(0x2E80, 0x2FDF), (0x3000, 0x30FF), (0x3400, 0x4DBF), (0x4E00, 0x9FFF),
                     (0xF900, 0xFAFF), (0xFF00, 0xFFEF)],
                    "/usr/share/fonts/opentype/noto/NotoSansCJK-Regular.ttc", 2),     # Noto Sans CJK SC
    "minipos-emoji": ([(0x2600, 0x27BF), (0x2B00, 0x2BFF), (0x1F000, 0x1FAFF)],
                      "/usr/share/fonts/truetype/noto/NotoColorEmoji.ttf", None),
}
DEBIAN_PACKAGES = "fonts-noto-cjk fonts-noto-color-emoji"


def face_of(char: str) -> str | None:
    """The face that serves ``char``, or None for a character left to the theme's fonts."""
    code = ord(char)
    for face, (ranges, _, _) in RANGES.items():
        if any(lo <= code <= hi for lo, hi in ranges):
            return face
    return None


def needed(site: Path) -> dict[str, dict[str, set[str]]]:
    """Per face, each character of the built pages it must serve and the pages that show it."""
    site = Path(site)
    found = {face: {} for face in RANGES}
    for page in pages(site):
        name = page.relative_to(site).as_posix()
        for char in set(text_of(page.read_text(encoding="utf-8"))):
            face = face_of(char)
            if face:
                found[face].setdefault(char, set()).add(name)
    return found


@functools.lru_cache(maxsize=None)
def _cmap(path: Path, mtime: float) -> frozenset:
    return frozenset(TTFont(path).getBestCmap())


def covered(path: Path) -> frozenset:
    """The code points the font file ``path`` maps to a glyph (empty if the file is missing)."""
    return _cmap(path, path.stat().st_mtime) if path.is_file() else frozenset()


def problems(site: Path) -> list[str]:
    """One line per face of the site's ``assets/fonts`` that lacks a character a page shows."""
    site = Path(site)
    found = []
    for face, chars in needed(site).items():
        font = site / SITE_FOLDER / f"{face}.woff"
        missing = sorted(c for c in chars if ord(c) not in covered(font))
        if missing:
            shown = ", ".join(f"U+{ord(c):04X} {c} ({', '.join(sorted(chars[c])[:2])})" for c in missing[:8])
            found.append(f"{SITE_FOLDER}/{face}.woff lacks {len(missing)} character(s) the pages show: {shown}"
                         f"{' ...' if len(missing) > 8 else ''}; remake the subsets with python -m docs.build "
                         f"fonts (needs the Debian packages {DEBIAN_PACKAGES})")
    return found


def _ranges_css(codes: list[int]) -> str:
    spans, start = [], None
    for i, code in enumerate(codes):
        start = code if start is None else start
        if i + 1 == len(codes) or codes[i + 1] != code + 1:
            spans.append(f"U+{start:X}" if start == code else f"U+{start:X}-{code:X}")
            start = None
    return ", ".join(spans)


def _write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)


def _subset(source: str, index: int | None, codes: list[int]) -> tuple[bytes, list[int]]:
    """A WOFF subset of ``source`` holding ``codes`` (those it has), and the codes it holds."""
    font = TTCollection(source).fonts[index] if index is not None else TTFont(source)
    font.recalcTimestamp = False                   # the same characters give the same bytes
    have = sorted(set(codes) & set(font.getBestCmap()))
    options = subset.Options()
    options.flavor = "woff"                        # zlib: fontTools reads it back without brotli
    options.layout_features = ["*"]
    options.name_IDs = ["*"]                       # keeps the copyright and license notices
    options.notdef_outline = True
    sub = subset.Subsetter(options)
    sub.populate(unicodes=have)
    sub.subset(font)
    buf = io.BytesIO()
    font.flavor = "woff"
    font.save(buf)
    return buf.getvalue(), have


CSS_HEAD = """/* Offline fonts for the characters a reader's system may lack (docs/build/fonts.py; written by
   python -m docs.build fonts, do not edit): Noto Sans CJK SC and Noto Color Emoji, subset to the
   characters the pages show, SIL Open Font License 1.1 (OFL.txt). */
"""


def rebuild(site: Path, out: Path = HERE) -> list[str]:
    """Remake every face's subset and ``fonts.css`` in ``out`` from the characters of the built ``site``,
    keeping those the subset in ``out`` already holds: the characters a page shows can depend on the
    lab's records (the article-table's verdict marks), and one build without a mark must not make the
    next build, with it again, fail. The lines to report (what each face holds, and any character its
    source font lacks)."""
    report, css = [], [CSS_HEAD]
    for face, chars in needed(site).items():
        _, source, index = RANGES[face]
        if not Path(source).is_file():
            raise FileNotFoundError(f"{source} is missing: apt-get install {DEBIAN_PACKAGES}")
        kept = covered(out / f"{face}.woff") - {ord(" ")}
        codes = sorted({ord(c) for c in chars} | kept) or [ord(" ")]
        data, have = _subset(source, index, codes)
        _write(out / f"{face}.woff", data)
        lacking = sorted(set(codes) - set(have) - {ord(" ")})
        report.append(f"{face}.woff: {len(have)} characters, {len(data)} bytes, from {source}")
        if lacking:
            report.append(f"  the source font lacks {', '.join(f'U+{c:04X}' for c in lacking)}: write them "
                          "another way")
        css.append(f'@font-face {{\n  font-family: "{FAMILY}";\n  src: url("{face}.woff") format("woff");\n'
                   f"  unicode-range: {_ranges_css(have)};\n}}\n")
    css.append(f':root {{\n  --md-text-font: "{FAMILY}";\n  --md-code-font: "{FAMILY}";\n}}\n')
    _write(out / "fonts.css", "\n".join(css).encode("utf-8"))
    return report
