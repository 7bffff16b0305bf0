"""The docs hook that fails the build on a code block that raised, whatever the log level."""

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

mkdocs = pytest.importorskip("mkdocs")

HOOK = Path(__file__).resolve().parents[1] / "docs" / "hooks" / "exec_errors.py"
spec = importlib.util.spec_from_file_location("exec_errors_hook", HOOK)
hook = importlib.util.module_from_spec(spec)
spec.loader.exec_module(hook)
PAGE = SimpleNamespace(file=SimpleNamespace(src_path="comparison.md"))


def test_a_rendered_traceback_fails_with_the_exception_line():
    # what markdown-exec 1.x printed for a block whose claim failed (highlighted, one span per token)
    html = ('<p>before</p><div class="highlight"><pre><code><span class="n">Traceback</span> '
            '<span class="p">(</span><span class="n">most</span> <span class="n">recent</span> '
            '<span class="n">call</span> <span class="n">last</span><span class="p">):</span>\n'
            '  File "x", line 1\n'
            'docs.hooks.evidence.EvidenceError: the lab records no longer support: RoPE holds\n'
            '</code></pre></div>')
    with pytest.raises(mkdocs.exceptions.PluginError, match="comparison.md: .*EvidenceError: the lab records"):
        hook.on_page_content(html, PAGE, None, None)


def test_a_page_without_a_traceback_passes_unchanged():
    html = "<p>ValueError: dim must be even (a message printed on purpose)</p>"
    assert hook.on_page_content(html, PAGE, None, None) == html
