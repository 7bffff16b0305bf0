"""docs/_code.py (the code beside the math) and the docstring rendering of the API pages
(docs/hooks/rst_docstrings.py): hand-written inputs with their expected renderings."""

from __future__ import annotations

import ast
import inspect
import re

import pytest

pytest.importorskip("pygments")
griffe = pytest.importorskip("griffe")

from docs._code import beside, source_of, source_url  # noqa: E402
from docs.build.rst_docstrings import rst_to_markdown  # noqa: E402
from minipos import alibi  # noqa: E402


def test_the_source_shown_is_the_function_without_its_docstring():
    src, module, first = source_of("minipos.alibi.alibi_bias")
    full = inspect.getsource(alibi.alibi_bias)
    assert module == "minipos.alibi" and first == inspect.getsourcelines(alibi.alibi_bias)[1]
    assert alibi.alibi_bias.__doc__.strip().splitlines()[0] not in src
    doc = ast.parse(full).body[0].body[0]                                    # the docstring's statement
    lines = full.splitlines()
    assert src.splitlines() == lines[: doc.lineno - 1] + lines[doc.end_lineno:]   # only its lines went
    assert src.splitlines()[0].startswith("def alibi_bias(") and "rel = j[None, :] - i[:, None]" in src


def test_a_symbol_mapped_to_a_name_the_code_does_not_have_fails_the_build():
    with pytest.raises(ValueError, match="does not occur in the source of minipos.alibi.alibi_bias"):
        beside("b", "minipos.alibi.alibi_bias", page="schemes/alibi.md", symbols=[("m_h", "no_such_name")])
    with pytest.raises(ValueError, match="symbols must map"):
        beside("b", "minipos.alibi.alibi_bias", page="schemes/alibi.md", symbols=[])


def test_the_pair_links_the_module_source_page_from_where_it_is_printed():
    assert source_url("minipos.alibi", "schemes/alibi.md") == "../../source/alibi/"
    assert source_url("minipos.rope", "layer.md") == "../source/rope/"
    assert source_url("minipos.rope", "index.md") == "source/rope/"
    html = beside(r"b_h(i, j) = -m_h (i - j)", "minipos.alibi.alibi_bias", page="schemes/alibi.md",
                  symbols=[("m_h", "slopes")])
    first = inspect.getsourcelines(alibi.alibi_bias)[1]
    assert f'href="../../source/alibi/#L-{first}"' in html
    assert '<div class="arithmatex">\\[' in html and "<span class=\"arithmatex\">\\(m_h\\)</span>" in html


def test_a_rest_simple_table_becomes_a_markdown_table():
    text = """Intro:

=====  ==========================
name   meaning
=====  ==========================
``a``  the first ``x``, broken
       over two lines
``b``  a code span ``relative_
       attention_bias``
=====  ==========================

After."""
    out = rst_to_markdown(text)
    assert "| name | meaning |\n|---|---|" in out
    assert "| `a` | the first `x`, broken over two lines |" in out
    assert "| `b` | a code span `relative_attention_bias` |" in out
    assert "=====" not in out


def test_literal_blocks_lose_the_rest_marks_they_would_show():
    out = rst_to_markdown("One pass::\n\n    y = f(x)   # the ``scale``\n\nThen ``code`` again.")
    assert out.splitlines()[0] == "One pass:"
    assert "    y = f(x)   # the scale" in out
    assert "Then ``code`` again." in out                     # outside the block, markdown renders it


def test_roles_and_footnotes():
    out = rst_to_markdown("See :func:`minipos.rope.apply_rope` [1]_.\n\n.. [1] A note.")
    assert out == "See `minipos.rope.apply_rope` [1].\n\n[1] A note."
    assert not re.search(r":func:|\]_|\.\. \[", out)
