"""The built documentation site, opened in headless Chromium.

Runs only when the site has been built (``python -m mkdocs build --strict`` writes
``site/index.html``) and selenium with Debian's ``chromium`` and ``chromium-driver`` is present;
otherwise it skips. The site is served from ``site/`` on 127.0.0.1, and for the home page and
every scheme page it checks that:

- MathJax typeset every formula (one ``mjx-container`` per arithmatex element, and at least one
  on a scheme page) and no raw ``$$`` or ``\\begin{aligned}`` is left in the visible text;
- every ``<img>`` loaded (``naturalWidth > 0``) and every inline SVG figure has a size;
- no request left 127.0.0.1 (the browser's network log and ``performance.getEntries()``);
- the browser console holds no error.
"""

from __future__ import annotations

import functools
import http.server
import json
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest

SITE = Path(__file__).resolve().parent.parent / "site"
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
SCHEMES = sorted(p.stem for p in (Path(__file__).resolve().parent.parent / "docs" / "schemes").glob("*.md"))
PAGES = [("home", "")] + [(s, f"schemes/{s}/") for s in SCHEMES] + [("mla", "mla/")]
LOCAL_HOSTS = {"127.0.0.1"}
NETWORK_SCHEMES = {"http", "https", "ws", "wss", "ftp"}  # others (data:, blob:, chrome:) stay inside

if not (SITE / "index.html").is_file():
    pytest.skip("the site is not built (python -m mkdocs build --strict)", allow_module_level=True)
if not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()):
    pytest.skip("needs /usr/bin/chromium and /usr/bin/chromedriver", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver")

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
                 "--window-size=1200,2000",
                 f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(flag)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    drv = webdriver.Chrome(options=opts, service=Service(executable_path=str(CHROMEDRIVER)))
    drv.set_script_timeout(30)
    drv.set_page_load_timeout(60)
    yield drv
    drv.quit()


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


@pytest.mark.parametrize("name,path", PAGES, ids=[p[0] for p in PAGES])
def test_page_renders_offline(driver, base_url, name, path):
    driver.get_log("performance")                      # forget the previous page's requests
    driver.get_log("browser")
    driver.get(base_url + path)
    assert driver.execute_async_script(WAIT_FOR_MATHJAX) == "ok"
    facts = driver.execute_script(PAGE_FACTS)

    assert facts["mathjax"] == facts["arithmatex"], "some formulas were not typeset by MathJax"
    if name != "home":
        assert facts["mathjax"] > 0, f"{path} shows no typeset math"
    for raw in ("$$", "\\begin{aligned}"):
        assert raw not in facts["text"], f"raw {raw!r} left in the visible text of {path}"
    assert facts["badImages"] == [], "images that did not load"
    assert facts["emptyFigures"] == 0, f"{facts['emptyFigures']} inline SVG figure(s) have no size"

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
