"""Serve MathJax 3 from the site itself: nothing is loaded from another host.

The MathJax files come from the PyPI package ``django-static-mathjax`` (import name
``mathjax``; Django is not needed). ``es5/tex-svg-full.js`` renders TeX as SVG paths, so no web
font is needed either. This hook adds it to the site under ``assets/mathjax/``, with the
components it may load on demand (accessibility, menu, speech rules), and writes
``assets/mathjax/config.js``, which ``extra_javascript`` loads before it.
"""

from __future__ import annotations

import os
from pathlib import Path

from mkdocs.structure.files import File, Files

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


def _es5_dir() -> Path:
    try:
        import mathjax
    except ImportError as exc:
        raise RuntimeError("the docs need MathJax from the PyPI package django-static-mathjax: "
                           "python -m pip install -e '.[docs]'") from exc
    root = Path(mathjax.__file__).parent / "static" / "mathjax" / "es5"
    if not (root / ENTRY).is_file():
        raise RuntimeError(f"django-static-mathjax has no {ENTRY} under {root}")
    return root


def on_config(config, **kwargs):
    # Figures are drawn at build time by markdown-exec blocks: no display needed.
    os.environ.setdefault("MPLBACKEND", "Agg")
    return config


def on_files(files: Files, config, **kwargs) -> Files:
    root = _es5_dir()
    paths = [root / ENTRY]
    for sub in ON_DEMAND:
        paths += sorted(p for p in (root / sub).rglob("*") if p.is_file())
    for path in paths:
        rel = path.relative_to(root).as_posix()
        files.append(File.generated(config, f"{DEST}/{rel}", abs_src_path=str(path)))
    files.append(File.generated(config, f"{DEST}/config.js", content=CONFIG_JS))
    return files
