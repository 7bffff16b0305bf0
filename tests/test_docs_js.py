"""The JavaScript of the docs' interactive figures and port checker, under Node's test runner.

``tests/js/*.test.cjs`` feed ``docs/assets/figures/minipos.js`` (what the figures draw) and
``docs/assets/check-port.js`` (the "Check my port" page) the golden vectors of their families in
``spec/vectors``: the figures are a port of minipos, and the spec checks them like any other. This
runs ``node --test tests/js`` and fails with Node's report if any test fails; without Node 18 or
later (``node:test``) it skips, saying so.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
NODE = shutil.which("node") or shutil.which("nodejs")


def _node_major() -> int:
    out = subprocess.run([NODE, "--version"], capture_output=True, text=True, timeout=30).stdout
    m = re.match(r"v(\d+)", out.strip())
    return int(m.group(1)) if m else 0


@pytest.mark.skipif(NODE is None, reason="Node.js is not installed: the figures' JavaScript is not run")
def test_figures_javascript_passes_the_golden_vectors():
    if _node_major() < 18:
        pytest.skip("needs Node 18 or later for its built-in test runner (node --test)")
    files = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests" / "js").glob("*.test.cjs"))
    assert files, "no tests/js/*.test.cjs"
    proc = subprocess.run([NODE, "--test", *files], cwd=ROOT, capture_output=True, text=True, timeout=300)
    summary = dict(re.findall(r"^# (tests|pass|fail) (\d+)$", proc.stdout, re.M))
    assert proc.returncode == 0 and summary.get("fail") == "0", proc.stdout[-6000:] + proc.stderr[-2000:]
    assert int(summary.get("pass", 0)) >= 10, proc.stdout[-2000:]
