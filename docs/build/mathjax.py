"""Serve MathJax 3 from the site itself: nothing is loaded from another host.

The MathJax files come from the PyPI package ``django-static-mathjax`` (import name ``mathjax``;
Django is not needed). ``es5/tex-svg-full.js`` renders TeX as SVG paths, so no web font is needed
either. ``install(site)`` copies it into the built site under ``assets/mathjax/``, with the
components it may load on demand (accessibility, menu, speech rules), and writes
``assets/mathjax/config.js``; ``extra_javascript`` in mkdocs.yml loads the two, config first.
"""

from __future__ import annotations

import shutil
from pathlib import Path

DEST = "assets/mathjax"
ENTRY = "tex-svg-full.js"
ON_DEMAND = ("a11y", "ui", "sre", "input/tex/extensions")

CONFIG_JS = r"""// MathJax 3 settings for pymdownx.arithmatex (generic mode): typeset only its output.
window.MathJax = {
  tex: {
    inlineMath: [["\\(", "\\)"]],
    displayMath: [["\\[", "\\]"]],
    processEscapes: true,
    processEnvironments: true
  },
  options: {
    ignoreHtmlClass: ".*|",
    processHtmlClass: "arithmatex"
  },
  svg: { fontCache: "global" }
};
"""


def es5_dir() -> Path:
    """The ``es5`` folder of the installed django-static-mathjax (RuntimeError naming the extra if absent)."""
    try:
        import mathjax
    except ImportError as exc:
        raise RuntimeError("the docs need MathJax from the PyPI package django-static-mathjax: "
                           "python -m pip install -e '.[docs]'") from exc
    root = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (root / ENTRY).is_file():
        raise RuntimeError(f"django-static-mathjax has no {ENTRY} under {root}")
    return root


def install(site: Path) -> int:
    """Copy MathJax's entry point and on-demand components into ``site/assets/mathjax`` and write its
    ``config.js`` there; the number of files written."""
    root = es5_dir()
    paths = [root / ENTRY]
    for sub in ON_DEMAND:
        paths += sorted(p for p in (root / sub).rglob("*") if p.is_file())
    dest = Path(site) / DEST
    for path in paths:
        target = dest / path.relative_to(root)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
    (dest / "config.js").write_text(CONFIG_JS, encoding="utf-8")
    return len(paths) + 1
