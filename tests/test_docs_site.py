"""The built documentation site, opened in headless Chromium.

Runs only when the site has been built (``python -m mkdocs build --strict`` writes
``site/index.html``) and selenium with Debian's ``chromium`` and ``chromium-driver`` is present;
otherwise it skips. The site is served from ``site/`` on 127.0.0.1, and every page is opened at a
1280 x 800 window and again at a phone's 390 px. For each page it checks that:

- MathJax typeset every formula (one ``mjx-container`` per arithmatex element) and no raw ``$$``
  or ``\\begin{aligned}`` is left in the visible text;
- every ``<img>`` loaded and every inline SVG figure has a size;
- no request left 127.0.0.1 and the browser console holds no error;
- **at 1280 px** no display equation is wider than its box, no table is wider than its column (its
  scroll wrapper does not scroll) and the page does not scroll sideways;
- **at 390 px** the page does not scroll sideways, no table scrolls, and the only elements that
  scroll sideways inside themselves are display equations, and code blocks (a line of code is not
  wrapped);
- no raw reStructuredText is left in the text (````x````, ``:func:`` roles, ``.. x::`` directives,
  ``[1]_``), except on the source pages, which show the Python files as they are;
- a teaching page (not the API reference, the source pages or the port checker) has a picture
  (an inline SVG figure or an interactive figure) before its first derivation and before its first
  display equation of four lines or more.

Then: the pages with code beside their math show each pair side by side at 1280 px and stacked at
390 px, with a module link that resolves; the interactive figures draw and redraw when a control
moves; and the port checker reports the golden values as passing and a moved value as a mismatch.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

# --dist loadgroup keeps this module on one worker, so it starts one server and one browser
pytestmark = pytest.mark.xdist_group("test_docs_site")

SITE = Path(__file__).resolve().parent.parent / "site"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
LOCAL_HOSTS = {"127.0.0.1"}
NETWORK_SCHEMES = {"http", "https", "ws", "wss", "ftp"}  # others (data:, blob:, chrome:) stay inside
WIDE, PHONE = (1280, 800), (390, 844)

if not (SITE / "index.html").is_file():
    pytest.skip("the site is not built (python -m mkdocs build --strict)", allow_module_level=True)
if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
    pytest.skip("needs /usr/bin/chromium and /usr/bin/chromedriver", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver")

PAGES = sorted(str(p.parent.relative_to(SITE)).replace("\\", "/") for p in SITE.rglob("index.html"))
PAGES = ["" if p == "." else p + "/" for p in PAGES if not p.startswith(("assets", "search"))]
# The source pages are the Python files as highlighted code, all built by one block: one stands for them.
PAGES = [p for p in PAGES if not p.startswith("source/") or p == "source/attention/"]
NOT_TEACHING = ("api/", "source/", "check-port/", "claims/")   # reference pages: tables, not teaching
SOURCE_PAGES = sorted(str(p.parent.relative_to(SITE)) + "/" for p in (SITE / "source").glob("*/index.html"))
NO_PICTURE = {
    # The lab's pages: their content (and figures) belong to the lab's records and are edited there.
    "article-table/": "the article's table, measured row by row from the lab's records (no figure yet)",
}
CODE_BESIDE_MATH = ["schemes/sinusoidal/", "schemes/learned/", "schemes/alibi/", "schemes/transformer-xl/",
                    "schemes/t5/", "schemes/deberta/", "schemes/rope/", "schemes/rope-scaling/", "schemes/xpos/",
                    "schemes/fire/", "schemes/shaw/", "schemes/query-scale/", "schemes/inkling/", "rope-frequencies/",
                    "mrope/", "mla/", "local-global/", "irope/", "layer/"]
INTERACTIVE = {"schemes/rope/": "rope-rotation", "schemes/rope-scaling/": "rope-scaling", "schemes/alibi/": "alibi-heads",
               "schemes/t5/": "t5-buckets", "schemes/sinusoidal/": "sinusoidal-dot", "layer/": "attention-pattern"}

WAIT_FOR_MATHJAX = """
const done = arguments[arguments.length - 1];
const start = Date.now();
(function wait() {
  const mj = window.MathJax;
  if (mj && mj.startup && mj.startup.promise) {
    mj.startup.promise.then(() => done("ok"), (e) => done("MathJax failed: " + e));
  } else if (Date.now() - start > 20000) {
    done("MathJax never started");
  } else {
    setTimeout(wait, 50);
  }
})();
"""

PAGE_FACTS = """
const figures = Array.from(document.querySelectorAll("svg.minipos-figure"));
return {
  arithmatex: document.querySelectorAll(".arithmatex").length,
  mathjax: document.querySelectorAll("mjx-container").length,
  text: document.body.innerText,
  badImages: Array.from(document.images)
      .filter((img) => !(img.complete && img.naturalWidth > 0)).map((img) => img.src),
  figures: figures.length,
  emptyFigures: figures.filter((f) => {
      const r = f.getBoundingClientRect(); return !(r.width > 0 && r.height > 0); }).length,
  resources: performance.getEntriesByType("navigation").concat(
      performance.getEntriesByType("resource")).map((e) => e.name),
};
"""

# What overflows its box at the current window size.
LAYOUT = """
const out = {pageScroll: document.documentElement.scrollWidth > window.innerWidth + 1,
             wideEquations: [], wideTables: [], scrollers: []};
for (const item of MathJax.startup.document.math) {
  const box = item.typesetRoot;
  if (!box || box.getAttribute("display") !== "true" || !box.firstElementChild) continue;
  const w = box.firstElementChild.getBoundingClientRect().width;
  if (box.offsetParent !== null && w > box.clientWidth + 1)
    out.wideEquations.push([Math.round(w), box.clientWidth, item.math.trim().slice(0, 80)]);
}
for (const t of document.querySelectorAll(".md-typeset table")) {
  const wrap = t.closest(".md-typeset__scrollwrap") || t.parentElement;
  if (t.offsetParent !== null && wrap.scrollWidth > wrap.clientWidth + 1)
    out.wideTables.push(t.innerText.slice(0, 60));
}
for (const el of document.querySelectorAll(".md-content *")) {
  if (el.scrollWidth <= el.clientWidth + 1 || el.offsetParent === null) continue;
  const ox = getComputedStyle(el).overflowX;
  if (ox !== "auto" && ox !== "scroll") continue;
  const equation = el.tagName === "MJX-CONTAINER";
  const code = el.tagName === "PRE" || el.tagName === "CODE" || el.closest("pre") !== null;
  if (!equation && !code) out.scrollers.push(el.tagName + "." + String(el.className).slice(0, 40));
}
return out;
"""

# The position in the page of the first picture, the first derivation and the first long equation.
ORDER = """
const all = Array.from(document.querySelectorAll(".md-content *"));
const first = (pred) => { const i = all.findIndex(pred); return i < 0 ? null : i; };
const long = new Set();
for (const item of MathJax.startup.document.math) {
  if (item.display && (item.math.match(/\\\\\\\\/g) || []).length >= 3) long.add(item.typesetRoot);
}
return {
  picture: first((e) => (e.matches("svg.minipos-figure") || e.matches("[data-minipos-figure]"))),
  derivation: first((e) => e.matches(".admonition.success")),
  longEquation: first((e) => long.has(e)),
};
"""

RAW_REST = r"""
const text = document.querySelector("article").innerText;
const pats = {"double backticks": /``/, "role": /:(func|class|meth|mod|attr|data|exc|obj|ref|param|returns?|rtype|raises?):`/,
              "directive": /^\s*\.\. [a-z-]+::/m, "footnote reference": /\[\w+\]_/};
const found = {};
for (const [k, re] of Object.entries(pats)) { const m = text.match(re); if (m) found[k] = text.slice(Math.max(0, m.index - 40), m.index + 40); }
return found;
"""


class _Quiet(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def base_url():
    handler = functools.partial(_Quiet, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = str(CHROMIUM)
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--window-size=1280,800",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    drv = webdriver.Chrome(options=opts, service=Service(executable_path=str(CHROMEDRIVER)))
    drv.set_script_timeout(30)
    drv.set_page_load_timeout(60)
    yield drv
    drv.quit()


def _viewport(drv, size) -> None:
    w, h = size
    drv.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                        {"width": w, "height": h, "deviceScaleFactor": 1, "mobile": w < 600})
    drv.execute_async_script("const done = arguments[0]; requestAnimationFrame(() => setTimeout(done, 50));")


def _open(drv, url, size=WIDE) -> None:
    drv.get_log("performance")                      # forget the previous page's requests
    drv.get_log("browser")
    _viewport(drv, size)
    drv.get(url)
    assert drv.execute_async_script(WAIT_FOR_MATHJAX) == "ok"


def _requested_urls(drv) -> list[str]:
    """Every URL the browser asked for since the last call, from the DevTools network log."""
    urls = []
    for entry in drv.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg.get("method") == "Network.requestWillBeSent":
            urls.append(msg["params"]["request"]["url"])
    return urls


def _leaves_localhost(url: str) -> bool:
    u = urlparse(url)
    return u.scheme in NETWORK_SCHEMES and u.hostname not in LOCAL_HOSTS


@pytest.mark.parametrize("path", PAGES, ids=[p.rstrip("/") or "home" for p in PAGES])
def test_page_renders_offline_and_fits(driver, base_url, path):
    _open(driver, base_url + path)
    facts = driver.execute_script(PAGE_FACTS)

    assert facts["mathjax"] == facts["arithmatex"], "some formulas were not typeset by MathJax"
    if path.startswith("schemes/"):
        assert facts["mathjax"] > 0, f"{path} shows no typeset math"
    for raw in ("$$", "\\begin{aligned}"):
        assert raw not in facts["text"], f"raw {raw!r} left in the visible text of {path}"
    assert facts["badImages"] == [], "images that did not load"
    assert facts["emptyFigures"] == 0, f"{facts['emptyFigures']} inline SVG figure(s) have no size"

    wide = driver.execute_script(LAYOUT)
    assert wide["wideEquations"] == [], f"display equations wider than their column at 1280 px: {wide['wideEquations']}"
    assert wide["wideTables"] == [], f"tables wider than their column at 1280 px: {wide['wideTables']}"
    assert not wide["pageScroll"], "the page scrolls sideways at 1280 px"

    if not path.startswith("source/"):
        assert driver.execute_script(RAW_REST) == {}, "raw reStructuredText in the page's text"
    if not path.startswith(NOT_TEACHING) and path not in NO_PICTURE:
        order = driver.execute_script(ORDER)
        assert order["picture"] is not None, f"{path} is a teaching page without a picture"
        for what in ("derivation", "longEquation"):
            if order[what] is not None:
                assert order["picture"] < order[what], f"{path}: the first picture comes after the first {what}"

    _viewport(driver, PHONE)
    phone = driver.execute_script(LAYOUT)
    _viewport(driver, WIDE)
    assert not phone["pageScroll"], "the page scrolls sideways at 390 px"
    assert phone["wideTables"] == [], f"tables that scroll at 390 px: {phone['wideTables']}"
    assert phone["scrollers"] == [], f"elements other than equations and code that scroll at 390 px: {phone['scrollers']}"

    if path in CODE_BESIDE_MATH:
        _check_pairs(driver, path)
    if path in INTERACTIVE:
        _check_interactive(driver, INTERACTIVE[path])

    requested = _requested_urls(driver) + facts["resources"]
    assert [u for u in requested if _leaves_localhost(u)] == [], "requests that left 127.0.0.1"
    errors = [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert errors == [], f"console errors on {path}"


WAIT_FOR_FONTS = """
const done = arguments[arguments.length - 1];
document.fonts.ready.then(() => done(Array.from(document.fonts)
    .filter((f) => f.family.replace(/"/g, "") === "minipos-glyphs")
    .map((f) => [f.unicodeRange, f.status])));
"""


def test_the_article_table_page_shows_its_chinese_and_emoji_in_the_offline_fonts(driver, base_url):
    driver.get_log("performance")
    driver.get(base_url + "article-table/")
    faces = driver.execute_async_script(WAIT_FOR_FONTS)
    # two faces (the CJK subset, the emoji subset), both fetched and used because the page shows both
    assert len(faces) == 2 and all(status == "loaded" for _, status in faces), faces
    text = driver.execute_script("return document.body.innerText")
    assert "大模型中的位置编码" in text and "✅" in text
    fonts = [u for u in _requested_urls(driver) if u.endswith(".woff")]
    assert sorted(urlparse(u).path for u in fonts) == ["/assets/fonts/minipos-cjk.woff",
                                                        "/assets/fonts/minipos-emoji.woff"]


PAIRS = """
return Array.from(document.querySelectorAll(".minipos-pair")).map((p) => {
  const m = p.querySelector(".minipos-pair__math").getBoundingClientRect();
  const c = p.querySelector(".minipos-pair__code").getBoundingClientRect();
  const link = p.querySelector(".minipos-pair__head a");
  return {math: [m.left, m.top, m.right, m.bottom], code: [c.left, c.top, c.right, c.bottom],
          source: p.querySelector(".minipos-pair__code pre").innerText, href: link && link.href,
          map: p.querySelector(".minipos-pair__map").innerText};
});
"""


def _check_pairs(driver, path) -> None:
    """Each equation beside its code at 1280 px and above it at 390 px; the module link resolves."""
    pairs = driver.execute_script(PAIRS)
    assert pairs, f"{path} shows no equation beside its code"
    for p in pairs:
        assert p["source"].lstrip().startswith(("def ", "class ", "@")), p["source"][:80]
        assert p["map"].startswith("Symbols → code:"), p["map"]
        assert p["math"][2] <= p["code"][0] + 1, "at 1280 px the code is not beside the equation"
    _viewport(driver, PHONE)
    stacked = driver.execute_script(PAIRS)
    _viewport(driver, WIDE)
    for p in stacked:
        assert p["code"][1] >= p["math"][3] - 1, "at 390 px the code is not under the equation"
    target = pairs[0]["href"]
    page, _, anchor = target.partition("#")
    assert page.rstrip("/").rsplit("/", 1)[-1] in {p.rstrip("/").rsplit("/", 1)[-1] for p in SOURCE_PAGES}, target
    html = (SITE / page.split("/", 3)[-1] / "index.html").read_text(encoding="utf-8")
    assert f'id="{anchor}"' in html or f"name=\"{anchor}\"" in html, f"{target}: no such line anchor"


READOUT = """
const fig = document.querySelector(`[data-minipos-figure="${arguments[0]}"]`);
const svg = fig.querySelector("svg");
const r = svg.getBoundingClientRect();
return {readout: fig.querySelector(".minipos-interactive__readout").textContent,
        size: [r.width, r.height], marks: svg.querySelectorAll("*").length,
        controls: fig.querySelectorAll("input, select").length};
"""

MOVE = """
const fig = document.querySelector(`[data-minipos-figure="${arguments[0]}"]`);
const input = fig.querySelector('input[type="range"]');
input.value = String(Number(input.max) - Number(input.step || 1));
input.dispatchEvent(new Event("input"));
"""


def _check_interactive(driver, figure) -> None:
    """The figure has drawn an SVG with controls, and moving a slider changes what it reads out."""
    before = driver.execute_script(READOUT, figure)
    assert before["size"][0] > 100 and before["size"][1] > 100, before
    assert before["marks"] > 10 and before["controls"] >= 1, before
    driver.execute_script(MOVE, figure)
    after = driver.execute_script(READOUT, figure)
    assert after["readout"] != before["readout"], f"{figure}: moving a slider changed nothing"


def test_there_are_at_least_five_interactive_figures():
    found = set()
    for path in PAGES:
        text = (SITE / path / "index.html").read_text(encoding="utf-8")
        found |= {f for f in INTERACTIVE.values() if f'data-minipos-figure="{f}"' in text}
    assert len(found) >= 5 and found == set(INTERACTIVE.values())


def test_check_my_port(driver, base_url):
    _open(driver, base_url + "check-port/")
    summary = "return document.querySelector('.minipos-port__summary').dataset;"
    driver.find_element("id", "minipos-port-golden").click()
    ok = driver.execute_script(summary)
    assert ok["failed"] == "0" and int(ok["passed"]) > 0, ok
    driver.find_element("id", "minipos-port-broken").click()
    broken = driver.execute_script(summary)
    assert broken["failed"] == "1", broken
    rows = driver.execute_script("return document.querySelectorAll('.minipos-port__table tbody tr').length;")
    assert rows == 1
    requested = _requested_urls(driver)
    assert [u for u in requested if _leaves_localhost(u)] == []
