"""The derivations as the docs render them: every theorem shows mathematics, no step shows
``A = A``, the argument comes first and the explicit expansions are folded in a ``<details>``
block that Python-Markdown and MathJax handle inside the admonition, and wide display math
scrolls instead of being shrunk (the site's stylesheet)."""

from __future__ import annotations

import functools
import http.server
import re
import threading
from pathlib import Path

import numpy as np
import pytest

sp = pytest.importorskip("sympy")
markdown = pytest.importorskip("markdown")

from proofs import core  # noqa: E402
from proofs import markdown as proofs_markdown  # noqa: E402
from proofs.markdown import ProofNotPassed, derivation  # noqa: E402

# --dist loadgroup keeps this module on one worker, so every theorem is run once
pytestmark = pytest.mark.xdist_group("test_proofs_markdown")

ROOT = Path(__file__).resolve().parent.parent
CSS = ROOT / "docs" / "assets" / "extra.css"
SITE = ROOT / "site"
ALIGNED = re.compile(r"\\begin\{aligned\}\n(.*?)\n\\end\{aligned\}", re.S)
DISPLAY = re.compile(r"^\$\$\n(.*?)\n\$\$$", re.S | re.M)
# Theorems allowed a rendered step whose two sides SymPy evaluates to the same expression (the
# renderer merges such a row into the one before it): none; give the step a ``shown=`` form.
MERGED_ROWS_ALLOWED: set[str] = set()


@pytest.fixture(scope="module")
def results() -> dict[str, core.Result]:
    """Every registered theorem, run once."""
    out = {r.id: r for r in core.run()}
    failed = [r.message for r in out.values() if not r.ok]
    assert not failed, "\n\n".join(failed)
    return out


@pytest.fixture(scope="module")
def rendered(results) -> dict[str, str]:
    """Every registered theorem as the docs render it (what derivation() returns, unindented)."""
    return {tid: _dedent(proofs_markdown._render(r, None)) for tid, r in results.items()}


def _dedent(admonition: str) -> str:
    return "\n".join(line[4:] if line.startswith("    ") else line for line in admonition.splitlines())


def _steps(aligned: str):
    """(previous, next) display LaTeX of each ``=`` row of an aligned block."""
    prev = None
    for row in aligned.split(" \\\\\n"):
        if row.startswith("& "):                       # the start, on a line of its own
            prev = row[2:].rsplit(" && ", 1)[0]
        elif " &= " in row:
            head, rest = row.split(" &= ", 1)
            cur = rest.rsplit(" && ", 1)[0]
            if head.strip():
                prev = head
            yield prev, cur
            prev = cur


def _norm(tex: str) -> str:
    return re.sub(r"\s+", "", tex or "")


def test_every_theorem_renders_math_and_no_step_shows_a_equals_a(rendered):
    assert len(rendered) >= 48
    for tid, md in rendered.items():
        blocks = DISPLAY.findall(md)
        assert blocks, f"{tid} renders no display math"
        for block in blocks:
            for aligned in ALIGNED.findall(block):
                for prev, cur in _steps(aligned):
                    assert prev is not None and _norm(prev) != _norm(cur), (
                        f"{tid} renders a step of the form A = A:\n{cur[:300]}")


def test_the_a_equals_a_check_catches_one():
    x = sp.Symbol("x")

    def proof(p):
        p.derive((x + 1) ** 2).step((x + 1) ** 2, "nothing")  # shown as "= (x + 1)^2" alone
        p.derive(x).step(x, "nothing", shown="x")              # a display string repeating it

    r = core.Theorem("demo.same", "s", proof).run()
    tex = core.latex_of(r)
    assert all(_norm(a) != _norm(b) for blk in ALIGNED.findall(tex) for a, b in _steps(blk))
    rows = [line for line in tex.splitlines() if "&" in line]
    assert rows == ["& \\left(x + 1\\right)^{2} && \\text{nothing}", "& x && \\text{nothing}"]
    assert list(_steps("a &= a && \\text{r}")) == [("a", "a")]


def test_only_the_listed_theorems_merge_rows(results):
    """A rendered step whose display equals the previous one is merged away; outside the listed
    theorems every checked step of a rendered block shows its own row."""
    merged = set()
    for tid, r in results.items():
        for b in r.blocks:
            if not isinstance(b, core.Chain) or (b.case is not None and b.case[1] != b.case[2][0]):
                continue
            prev = core._tex(b.start if b.start_shown is None else b.start_shown)
            for row in b.rows:
                cur = core._tex(row.expr if row.shown is None else row.shown)
                if _norm(cur) == _norm(prev):
                    merged.add(tid)
                prev = cur
    assert merged <= MERGED_ROWS_ALLOWED, f"steps that render as A = A: {sorted(merged - MERGED_ROWS_ALLOWED)}"


@pytest.mark.parametrize("tid,objects", [
    ("sinusoidal.shift.linear", [r"PE(pos + k) = M(k)\,PE(pos)", r"\right] \left[\begin{matrix}"]),
    ("sinusoidal.layouts", [r"P\,PE_{interleaved}(pos)", r"\\0 & 0 & 1 & 0\\"]),
    ("rope.complex", [r"\operatorname{re}{\left(\left(x_{0} + i x_{1}\right) e^{i m \theta}\right)}"]),
    ("rope.layouts", [r"R_{half}(m) &= P\,R(m)\,P^\top", r"\end{matrix}\right]^{T}"]),
    ("rope.rotate_half", [r"\mathrm{rotate\_half}(x) &= J x", r"\circ"]),
    ("rope.abel", [r"h_{0} \left(S_{1} - S_{0}\right)"]),
    ("rope_scaling.linear.positions", [r"m \frac{\theta}{s}", r"\frac{m}{s} \theta"]),
    ("t5.bucket.monotone", [r"\mathrm{bucket}(n)", "- keys before the query"]),
])
def test_the_objects_are_shown(rendered, tid, objects):
    for text in objects:
        assert text in rendered[tid], f"{tid} does not show {text!r}"


def test_argument_first_expansions_folded(rendered):
    md = rendered["rope.relative.headline"]
    lead, _, rest = md.partition('<details class="minipos-checked">')
    assert rest, "the explicit expansions are not folded"
    assert r"\mathrm{Re}\Big[\sum_{i=0}^{D/2-1} q_{[i]}" in lead          # RoFormer's complex form
    assert "block i of $R(m) R(n)^T$" in lead                              # the general chain
    checked, _, status = rest.partition("</details>")
    assert checked.startswith("<summary>checked: D = 4 written out; also checked for D = 2, 6, 8; "
                              "the score at D = 4, entry by entry</summary>\n\n")
    assert "q_{0}" in checked and "q_{0}" not in lead                      # the D = 4 expansions
    assert status.lstrip().startswith("Status **PASS**")
    assert "<details" not in rendered["rope.block.group"]                 # nothing to fold
    for tid, text in rendered.items():
        assert "design.md" not in text, f"{tid} points to a page the site does not publish"


def test_headline_states_the_column_vector_score():
    st = core.REGISTRY["rope.relative.headline"].statement
    assert st.startswith("R(m) R(n)^T = R(m - n)") and "hence" not in st
    assert "<R(m) q, R(n) k> = q^T R(m)^T R(n) k = q^T R(n - m) k" in st


def test_the_headline_lead_holds_numerically():
    """The complex form the headline leads with: <R(m) q, R(n) k> = Re sum_i q_[i] conj(k_[i])
    e^{i (m - n) θ_i}, q_[i] = q_{2i} + i q_{2i+1}."""
    from minipos.rope import rotation_matrix

    rng = np.random.default_rng(0)
    D = 8
    theta = 10000.0 ** (-np.arange(D // 2) * 2 / D)
    for m, n in ((0, 0), (3, 7), (7, 3), (100, 4099)):
        q, k = rng.normal(size=D), rng.normal(size=D)
        score = (rotation_matrix(m, D) @ q) @ (rotation_matrix(n, D) @ k)
        qc, kc = q[0::2] + 1j * q[1::2], k[0::2] + 1j * k[1::2]
        assert np.isclose(score, np.real(np.sum(qc * np.conj(kc) * np.exp(1j * (m - n) * theta))))
        assert np.isclose(score, q @ rotation_matrix(n - m, D) @ k)


def test_details_survive_markdown_inside_the_admonition():
    """The admonition as the site's Python-Markdown (admonition, arithmatex) turns it into HTML:
    the math inside <details> is arithmatex's, the summary sits right after <details>."""
    md = markdown.Markdown(extensions=["admonition", "tables", "pymdownx.arithmatex", "pymdownx.superfences"],
                           extension_configs={"pymdownx.arithmatex": {"generic": True}})
    html = md.convert(derivation("rope.layouts"))
    assert html.count('<div class="admonition success">') == 1
    opened = html.index('<details class="minipos-checked"><summary>checked: ')
    closed = html.index("</details>")
    inside, outside = html[opened:closed], html[:opened] + html[closed:]
    assert inside.count('<div class="arithmatex">') == 2 and "$$" not in inside
    assert '<div class="arithmatex">' in outside                         # the lead
    assert outside.rstrip().endswith("</div>") and "Status <strong>PASS</strong>" in html[closed:]


def test_unknown_and_failing_theorems_raise(monkeypatch):
    with pytest.raises(KeyError, match="registered theorem id"):
        derivation("rope.no_such_theorem")

    def broken(p):
        p.claim(sp.Symbol("x"), sp.Symbol("x") + 1, "off by one")
    monkeypatch.setitem(core.REGISTRY, "demo.broken", core.Theorem("demo.broken", "s", broken))
    with pytest.raises(ProofNotPassed, match="off by one"):
        derivation("demo.broken")


# --------------------------------------------------------------------------- the stylesheet

def _rules(css: str) -> dict[str, str]:
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    return {" ".join(sel.split()): body for sel, body in re.findall(r"([^{}]+)\{([^}]*)\}", css)}


def _check_css(css: str) -> None:
    rules = _rules(css)
    container = 'mjx-container[jax="SVG"][display="true"]'
    box = rules.get(f".md-typeset {container}", "")
    svg = rules.get(f".md-typeset {container} > svg", "")
    assert re.search(r"overflow-x:\s*auto", box), "wide display math must scroll sideways"
    assert re.search(r"max-width:\s*none", svg), "display math must keep its natural width"


def test_stylesheet_keeps_display_math_at_its_size():
    _check_css(CSS.read_text(encoding="utf-8"))
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^extra_css:\n(?:  - .*\n)*  - assets/extra\.css$", config, re.M)


@pytest.mark.skipif(not (SITE / "index.html").is_file(), reason="the site is not built")
def test_built_site_carries_the_rule():
    _check_css((SITE / "assets" / "extra.css").read_text(encoding="utf-8"))
    for page in ("schemes/rope/index.html", "index.html"):
        assert 'href="' in (text := (SITE / page).read_text(encoding="utf-8"))
        assert re.search(r'<link[^>]+href="[./]*assets/extra\.css"', text), f"{page} does not load extra.css"


# --------------------------------------------------------------------------- in a browser

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")

MEASURE = """
document.querySelectorAll("details").forEach((d) => { d.open = true; });
return Array.from(document.querySelectorAll('mjx-container[display="true"]')).map((c) => {
  const svg = c.querySelector(":scope > svg");
  const probe = document.createElement("span");
  probe.style.cssText = "display:inline-block;width:100ex";
  c.appendChild(probe);
  const ex = probe.getBoundingClientRect().width / 100;
  probe.remove();
  return {natural: parseFloat(svg.getAttribute("width")) * ex, shown: svg.getBoundingClientRect().width,
          box: c.clientWidth, scroll: c.scrollWidth};
});
"""


@pytest.mark.skipif(not (SITE / "index.html").is_file(), reason="the site is not built")
@pytest.mark.skipif(not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()), reason="needs chromium")
def test_wide_derivations_scroll_at_full_size_in_a_browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    from selenium.webdriver.chrome.service import Service

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(SITE)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--window-size=1200,2000"):
        opts.add_argument(flag)
    drv = webdriver.Chrome(options=opts, service=Service(executable_path=str(CHROMEDRIVER)))
    try:
        drv.set_script_timeout(60)
        # A phone's width: at 1280 px the derivations are broken into lines that fit the column
        # (proofs.layout), so the wide ones to check are those of a narrow screen.
        drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                            {"width": 390, "height": 844, "deviceScaleFactor": 1, "mobile": True})
        drv.get(f"http://127.0.0.1:{server.server_address[1]}/schemes/rope/")
        assert drv.execute_async_script("""const done = arguments[arguments.length - 1];
            (function wait() { const mj = window.MathJax;
              if (mj && mj.startup && mj.startup.promise) mj.startup.promise.then(() => done("ok"));
              else setTimeout(wait, 50); })();""") == "ok"
        shown = drv.execute_script(MEASURE)
    finally:
        drv.quit()
        server.shutdown()
        server.server_close()
    assert shown, "no display math on the RoPE page"
    wide = [s for s in shown if s["natural"] > s["box"] + 1]
    assert wide, "no display equation on the RoPE page is wider than its column: nothing to check"
    for s in shown:
        assert s["shown"] >= s["natural"] - 1, f"a display equation is shrunk: {s}"
    for s in wide:
        assert s["scroll"] > s["box"], f"a wide equation does not scroll: {s}"
