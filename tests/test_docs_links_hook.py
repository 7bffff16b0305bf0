"""The docs hook that fails the build on links left pointing at ``.md`` sources."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

mkdocs = pytest.importorskip("mkdocs")

HOOK = Path(__file__).resolve().parents[1] / "docs" / "hooks" / "links.py"
spec = importlib.util.spec_from_file_location("links_hook", HOOK)
links = importlib.util.module_from_spec(spec)
spec.loader.exec_module(links)
PAGE = SimpleNamespace(file=SimpleNamespace(src_path="comparison.md"))


def test_unrewritten_source_link_fails_the_build():
    # what markdown-exec's output gave on the comparison page before the links moved out of the block
    html = '<p>see <a href="schemes/alibi.md">ALiBi</a> and <a href="extrapolation.md#table">here</a></p>'
    with pytest.raises(mkdocs.exceptions.PluginError, match="extrapolation.md, schemes/alibi.md"):
        links.on_post_page(html, PAGE, None)


def test_rewritten_and_external_links_pass():
    html = ('<a href="../schemes/alibi/">ALiBi</a> <a href="https://example.org/README.md">x</a> '
            '<a href="#notes">y</a>')
    assert links.on_post_page(html, PAGE, None) == html
