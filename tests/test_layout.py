"""The package's layout as design.md states it, read from the source with ``ast``.

No import cycle among minipos's modules; no import of a minipos module inside a function (the old
way of dodging a cycle); no private name of a module reached from outside its package (what several
modules use is public by name; ``_checks`` is the shared checks' module, named so; the modules of a
subpackage such as ``minipos.vectors`` share their private helpers); the reference never imports
``minipos.fast``; no reference file over 700 lines and the layer at most 600.
"""

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "minipos"
SHARED_MODULES = {"minipos._checks", "minipos.fast._threads", "minipos.fast._runs"}  # shared, named so


def _may_reach(module: str, target: str) -> bool:
    """Whether ``module`` may use ``target``'s private names: its own, a shared module's, or a
    sibling's inside a subpackage (not between the top-level modules, each its own unit)."""
    package = module.rsplit(".", 1)[0]
    return (target == module or target in SHARED_MODULES
            or (package != "minipos" and target.rsplit(".", 1)[0] == package))


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources():
    return {_module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports(module: str, path: Path, text: str | None = None):
    """``(target module, imported name or None, inside a function?)`` for every import of minipos
    (``text``: the source, read from ``path`` if not given)."""
    tree = ast.parse(path.read_text() if text is None else text)
    is_package = path.name == "__init__.py"
    known = _sources()
    found = []

    def visit(node, in_function):
        for child in ast.iter_child_nodes(node):
            inner = in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            if isinstance(child, ast.ImportFrom):
                target = _resolve(module, child, is_package)
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    if sub in known:                               # from . import alibi
                        found.append((sub, None, in_function))
                    elif target.startswith("minipos"):
                        found.append((target, alias.name, in_function))
            elif isinstance(child, ast.Import):
                found.extend((a.name, None, in_function) for a in child.names if a.name.startswith("minipos"))
            visit(child, inner)
    visit(tree, False)
    return found


def _graph():
    return {m: {t for t, _, _ in _imports(m, p) if t != m} for m, p in _sources().items()}


def find_cycles(graph: dict) -> list:
    """Every loop a depth-first walk of ``graph`` (module -> the modules it imports) closes."""
    state, cycles = {}, []

    def walk(node, stack):
        state[node] = "open"
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                walk(nxt, stack + [nxt])
        state[node] = "done"
    for node in sorted(graph):
        if node not in state:
            walk(node, [node])
    return cycles


def test_the_import_graph_has_no_cycle():
    assert find_cycles(_graph()) == []


def test_find_cycles_finds_the_old_cycle():
    """The check can fail: the cycle this layout removed (layer -> irope -> layer) is found."""
    old = {"minipos.layer": {"minipos.irope", "minipos.attention"}, "minipos.irope": {"minipos.layer"}}
    assert find_cycles(old) == [["minipos.irope", "minipos.layer", "minipos.irope"]]


def imports_inside_functions(module: str, path: Path, text: str | None = None) -> list:
    return [target for target, _, inside in _imports(module, path, text) if inside]


def private_reaches(module: str, path: Path, text: str | None = None) -> list:
    """Each private name of another module that ``module`` imports or reads as ``module._name``."""
    text = path.read_text() if text is None else text
    reached = [f"{module} imports {target}.{name}" for target, name, _ in _imports(module, path, text)
               if name and name.startswith("_") and not name.startswith("__") and not _may_reach(module, target)]
    tree = ast.parse(text)
    aliases = {a.asname or a.name: f"{_resolve(module, n, path.name == '__init__.py')}.{a.name}"
               for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) for a in n.names}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.attr.startswith("_")
                and not node.attr.startswith("__") and aliases.get(node.value.id, "") in _sources()
                and not _may_reach(module, aliases[node.value.id])):
            reached.append(f"{module} reaches {aliases[node.value.id]}.{node.attr}")
    return reached


def test_no_minipos_import_inside_a_function():
    inside = {m: found for m, p in _sources().items() if (found := imports_inside_functions(m, p))}
    assert inside == {}


def test_no_private_name_of_another_module_is_reached():
    reached = [line for m, p in _sources().items() for line in private_reaches(m, p)]
    assert not reached, "\n".join(reached)


def test_the_checks_find_what_the_old_layout_did():
    """Both checks can fail: the old layout's habits, as source, are found."""
    irope = PACKAGE / "irope.py"
    old = "def llama4_layer(config, i):\n    from .layer import NoPE\n    return NoPE()\n"
    assert imports_inside_functions("minipos.irope", irope, old) == ["minipos.layer"]
    fast = PACKAGE / "fast" / "rope.py"
    old = "from .. import rope as reference\nfrom ..irope import _chunks\ncos = reference._cos_sin(1)\n"
    assert private_reaches("minipos.fast.rope", fast, old) == ["minipos.fast.rope imports minipos.irope._chunks",
                                                               "minipos.fast.rope reaches minipos.rope._cos_sin"]
    inside = PACKAGE / "vectors" / "layers.py"                       # a subpackage's siblings share helpers
    assert private_reaches("minipos.vectors.layers", inside, "from .cases import _grid\n") == []


def test_the_reference_never_imports_fast():
    leaks = [(m, t) for m, p in _sources().items() if not m.startswith("minipos.fast")
             for t, _, _ in _imports(m, p) if t.startswith("minipos.fast")]
    assert not leaks


def test_file_sizes():
    sizes = {m: len(p.read_text().splitlines()) for m, p in _sources().items() if not m.startswith("minipos.fast")}
    assert sizes["minipos.layer"] <= 600
    assert {m: n for m, n in sizes.items() if n > 700} == {}
