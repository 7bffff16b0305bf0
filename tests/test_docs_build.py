"""The docs' build steps (``docs/build``): each check on hand-made pages, then both generators on a
two-page site made from the real mkdocs.yml, which must carry the offline MathJax and fonts, fail on a
code block that raised and on a link to nowhere: mkdocs through its hook (even with ``-q``, which drops
markdown-exec's warning), Zensical through ``python -m docs.build zensical`` (skipped where Zensical
is not installed)."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mkdocs")
pytest.importorskip("fontTools")
yaml = pytest.importorskip("yaml")

from docs.build import BuildError, checks, finish, fonts, mathjax  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------- the checks, one by one

def test_a_rendered_traceback_is_found_with_its_exception_line():
    # what markdown-exec 1.x printed for a block whose claim failed (highlighted, one span per token)
    html = ('<p>before</p><div class="highlight"><pre><code><span class="n">Traceback</span> '
            '<span class="p">(</span><span class="n">most</span> <span class="n">recent</span> '
            '<span class="n">call</span> <span class="n">last</span><span class="p">):</span>\n'
            '  File "x", line 1\n'
            'docs.hooks.evidence.EvidenceError: the lab records no longer support: RoPE holds\n'
            '</code></pre></div>')
    assert checks.traceback(html) == "docs.hooks.evidence.EvidenceError: the lab records no longer support: RoPE holds"


def test_an_error_message_printed_on_purpose_is_not_a_traceback():
    assert checks.traceback("<p>ValueError: dim must be even (a message printed on purpose)</p>") is None


def test_unrewritten_source_links_are_found_and_rewritten_ones_pass():
    # what markdown-exec's output gave on the comparison page before the links moved out of the block
    html = '<p>see <a href="schemes/alibi.md">ALiBi</a> and <a href="extrapolation.md#table">here</a></p>'
    assert checks.source_links(html) == ["extrapolation.md", "schemes/alibi.md"]
    html = ('<a href="../schemes/alibi/">ALiBi</a> <a href="https://example.org/README.md">x</a> '
            '<a href="#notes">y</a>')
    assert checks.source_links(html) == []


def test_dead_links_are_the_local_ones_that_reach_no_file(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text("")
    (tmp_path / "img.svg").write_text("")
    page = tmp_path / "b" / "index.html"
    page.parent.mkdir()
    html = ('<a href="../a/">ok</a> <a href="../a/#x">ok</a> <img src="../img.svg"> <a href="/a/">ok</a> '
            '<a href="../gone/">no</a> <a href="../../../etc/passwd">out</a> <a href="https://x.org/y/">ext</a> '
            '<a href="mailto:a@b">mail</a> <a href="#top">anchor</a> <a href="//cdn.example/x.js">cdn</a>')
    assert checks.dead_links(html, page, tmp_path) == {"../gone/": "gone", "../../../etc/passwd": "outside the site"}


def test_every_problem_of_a_site_is_listed(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "index.html").write_text(
        "<pre>Traceback (most recent call last):\nValueError: no</pre>\n<a href='x'></a>"
        '<a href="q.md">q</a> <a href="../nowhere.css">css</a>')
    (tmp_path / "r.html").write_text('<link href="nowhere.css">')
    assert checks.problems(tmp_path) == [
        "p/index.html: a code block raised when the page was built: ValueError: no",
        "p/index.html: links to markdown sources left unrewritten (printed by a code block?): q.md; "
        "write them in the page's markdown instead",
        "nowhere.css: linked from 2 page(s) but not in the site: p/index.html (../nowhere.css), r.html",
    ]


def test_mathjax_is_installed_into_the_site(tmp_path):
    n = mathjax.install(tmp_path)
    dest = tmp_path / "assets" / "mathjax"
    assert (dest / "tex-svg-full.js").stat().st_size > 1_000_000         # the whole TeX-to-SVG bundle
    assert 'processHtmlClass: "arithmatex"' in (dest / "config.js").read_text()
    assert n == sum(1 for p in dest.rglob("*") if p.is_file())


def _site_with(tmp_path, text):
    (tmp_path / "index.html").write_text(f"<p>{text}</p>")
    shutil.copytree(ROOT / "docs" / "assets" / "fonts", tmp_path / "assets" / "fonts")
    return tmp_path


def test_the_font_subsets_hold_the_characters_the_pages_show(tmp_path):
    # 位置编码 from the article's title, its verdict marks, and ASCII (left to the theme's fonts)
    assert fonts.problems(_site_with(tmp_path, "位置编码 ✅ ❌ plain text")) == []


def test_a_character_the_subsets_lack_fails_naming_it(tmp_path):
    # 龍 (U+9F8D) and 🐉 (U+1F409) are on no page, so the subsets do not hold them
    found = fonts.problems(_site_with(tmp_path, "位置 龍 🐉"))
    assert len(found) == 2
    assert found[0].startswith("assets/fonts/minipos-cjk.woff lacks 1 character(s) the pages show: "
                               "U+9F8D 龍 (index.html)")
    assert found[1].startswith("assets/fonts/minipos-emoji.woff lacks 1 character(s) the pages show: U+1F409 🐉")
    assert "python -m docs.build fonts" in found[0]


@pytest.mark.skipif(not all(Path(src).is_file() for _, src, _ in fonts.RANGES.values()),
                    reason=f"the source fonts are not installed (Debian: {fonts.DEBIAN_PACKAGES})")
def test_remade_subsets_keep_what_they_held_and_add_what_a_page_shows(tmp_path):
    # A page that no longer shows ❌ (a verdict the lab's records changed) must not drop it from the
    # subset: the next build, where the mark is back, would fail. 龍 (U+9F8D) is on no committed page.
    out = tmp_path / "fonts"
    shutil.copytree(ROOT / "docs" / "assets" / "fonts", out)
    site = tmp_path / "site"
    site.mkdir()
    (site / "index.html").write_text("<p>龍 ✅</p>")
    before = {face: fonts.covered(out / f"{face}.woff") for face in fonts.RANGES}
    fonts.rebuild(site, out)
    for face in fonts.RANGES:
        assert before[face] - {ord(" ")} <= fonts.covered(out / f"{face}.woff")
    assert ord("龍") in fonts.covered(out / "minipos-cjk.woff")
    assert ord("❌") in fonts.covered(out / "minipos-emoji.woff")


def test_fonts_css_serves_each_subset_for_exactly_its_characters():
    css = (ROOT / "docs" / "assets" / "fonts" / "fonts.css").read_text()
    for face in fonts.RANGES:
        font = ROOT / "docs" / "assets" / "fonts" / f"{face}.woff"
        block = css[css.index(f'url("{face}.woff")'):]
        block = block[block.index("unicode-range: ") + len("unicode-range: "):]
        declared = block[:block.index(";")]
        assert declared == fonts._ranges_css(sorted(fonts.covered(font) - {ord(" ")}))
    assert '--md-text-font: "minipos-glyphs"' in css


def test_finish_installs_mathjax_then_raises_with_every_problem(tmp_path):
    (tmp_path / "index.html").write_text('<script src="assets/mathjax/tex-svg-full.js"></script>'
                                         '<a href="x.md">x</a>龍')
    with pytest.raises(BuildError) as error:
        finish(tmp_path)
    lines = str(error.value).splitlines()
    assert lines[0] == f"2 problem(s) in the built site {tmp_path}:"          # the script is found: installed
    assert "x.md" in lines[1] and "U+9F8D" in lines[2]


# ----------------------------------------------------------------------------- the two generators

def _project(tmp_path: Path, bad: bool) -> Path:
    """A copy of the real mkdocs.yml (hook, extensions, scripts, styles) over two small pages."""
    docs = tmp_path / "docs"
    shutil.copytree(ROOT / "docs" / "assets", docs / "assets")
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    config["hooks"] = [str(ROOT / hook) for hook in config["hooks"]]
    config["plugins"] = [p for p in config["plugins"] if not (isinstance(p, dict) and "mkdocstrings" in p)]
    config["nav"] = [{"Home": "index.md"}] + ([{"Bad": "bad.md"}] if bad else [])
    (docs / "index.md").write_text('# Home\n\n$$ R(m) R(n)^T = R(m - n) $$\n\n位置编码 ✅\n\n'
                                   '```python exec="on"\nprint("printed by a block")\n```\n', encoding="utf-8")
    if bad:
        (docs / "bad.md").write_text('# Bad\n\n```python exec="on"\nraise ValueError("a claim no longer holds")\n'
                                     '```\n\n```python exec="on"\nprint("[gone](gone.md)")\n```\n', encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return tmp_path


def _build(project: Path, generator: str) -> subprocess.CompletedProcess:
    if generator == "mkdocs":    # -q: markdown-exec's warning is dropped, the build step still fails
        command = [sys.executable, "-m", "mkdocs", "build", "-q", "-f", "mkdocs.yml"]
    else:
        command = [sys.executable, "-m", "docs.build", "zensical", "-f", "mkdocs.yml"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), NO_MKDOCS_2_WARNING="1")
    return subprocess.run(command, cwd=project, env=env, capture_output=True, text=True, timeout=120)


GENERATORS = ["mkdocs", pytest.param("zensical", marks=pytest.mark.skipif(
    importlib.util.find_spec("zensical") is None, reason="zensical is not installed (the zensical extra)"))]


@pytest.mark.parametrize("generator", GENERATORS)
def test_the_site_carries_offline_mathjax_and_fonts(tmp_path, generator):
    done = _build(_project(tmp_path, bad=False), generator)
    assert done.returncode == 0, done.stdout + done.stderr
    site = tmp_path / "site"
    page = (site / "index.html").read_text(encoding="utf-8")
    for script in ("assets/mathjax/config.js", "assets/mathjax/tex-svg-full.js"):
        assert f'src="{script}"' in page or f'src="./{script}"' in page
        assert (site / script).is_file()
    assert "arithmatex" in page and "printed by a block" in page
    assert "fonts.css" in page and (site / "assets" / "fonts" / "minipos-cjk.woff").is_file()
    assert "https://cdn" not in page and "mathjax@" not in page                 # nothing from a CDN


@pytest.mark.parametrize("generator", GENERATORS)
def test_a_block_that_raised_and_a_link_to_nowhere_fail_the_build(tmp_path, generator):
    done = _build(_project(tmp_path, bad=True), generator)
    assert done.returncode != 0
    out = done.stdout + done.stderr
    assert "bad/index.html: a code block raised when the page was built: ValueError: a claim no longer holds" in out
    # mkdocs leaves the printed link as gone.md; Zensical rewrites it to ../gone/, which the site lacks
    assert ("links to markdown sources left unrewritten (printed by a code block?): gone.md" in out
            or "gone: linked from 1 page(s) but not in the site: bad/index.html (../gone/)" in out)
