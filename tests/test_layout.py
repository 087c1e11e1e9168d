"""The package's shape: no import cycle between pomt's modules and none against the declared order of its
packages (imports inside functions included), no module over 400 lines, no class over 200."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pomt"
MOST_MODULE_LINES = 400
MOST_CLASS_LINES = 200

# The packages from the bottom up: a module may import pomt modules of its own level or below only.
# `pomt` itself (`__init__`, `__main__`) is the public face and may import anything.
PACKAGE_ORDER = [
    ["pomt.errors", "pomt.io", "pomt.options", "pomt.stats", "pomt.checks", "pomt.plots"],
    ["pomt.models", "pomt.device"],
    ["pomt.patching"],
    ["pomt.runtimes"],
    ["pomt.accuracy"],
    ["pomt.formats"],
    ["pomt.deploy"],
    ["pomt.measurement"],
    ["pomt.policies"],
    ["pomt.workload"],
    ["pomt.verification"],
    ["pomt.frontier"],
    ["pomt.offline"],
    ["pomt.bench", "pomt.digits", "pomt.crops"],
    ["pomt.cli"],
    ["pomt", "pomt.__main__"],
]


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports_of(path: Path, name: str, known: set[str]) -> set[str]:
    """pomt modules `path` imports anywhere in its code (a `from package import module` names the module)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, `level - 1` packages up
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports_of(path, name, set(known)) for name, path in known.items()}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of the graph as a path that returns to its start, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def level_of(name: str, order: list[list[str]]) -> int:
    """The level of the package `name` belongs to: its longest declared prefix."""
    best, level = -1, None
    for index, packages in enumerate(order):
        for package in packages:
            if (name == package or name.startswith(package + ".")) and len(package) > best:
                best, level = len(package), index
    if level is None:
        raise AssertionError(f"{name} belongs to no package of the declared order")
    return level


def upward_imports(graph: dict[str, set[str]], order: list[list[str]]) -> list[str]:
    """Each import of a module from a package above the importer's own, as `importer -> imported`."""
    return [f"{name} -> {target}" for name in sorted(graph) for target in sorted(graph[name])
            if level_of(target, order) > level_of(name, order)]


def test_upward_imports_sees_an_import_against_the_order():
    order = [["p.low"], ["p.mid"], ["p"]]
    graph = {"p.low.a": {"p.mid.b"}, "p.mid.b": {"p.low.a", "p.mid.c"}, "p.mid.c": set(), "p": {"p.mid.b"}}
    assert upward_imports(graph, order) == ["p.low.a -> p.mid.b"]
    assert upward_imports({"p.mid.b": {"p.low.a"}, "p.low.a": set()}, order) == []
    with pytest.raises(AssertionError, match="no package"):
        level_of("q.other", order)


def test_no_import_goes_against_the_package_order():
    violations = upward_imports(import_graph(), PACKAGE_ORDER)
    assert not violations, "imports against the package order:\n" + "\n".join(violations)


def test_find_cycle_sees_a_cycle_and_a_clean_graph():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None


def test_the_import_graph_sees_every_kind_of_import(tmp_path):
    source = tmp_path / "m.py"
    source.write_text("import pomt.a\nfrom pomt.b import thing\nfrom pomt import c\n"
                      "def f():\n    from pomt.d import x\n")
    known = {"pomt.a", "pomt.b", "pomt.c", "pomt.d", "pomt.m"}
    assert imports_of(source, "pomt.m", known) == {"pomt.a", "pomt.b", "pomt.c", "pomt.d"}


def test_pomt_has_no_import_cycle():
    assert find_cycle(import_graph()) is None


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_module_or_class_is_too_long(name):
    text = modules()[name].read_text(encoding="utf-8")
    lines = len(text.splitlines())
    assert lines <= MOST_MODULE_LINES, f"{name} has {lines} lines"
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.ClassDef):
            length = node.end_lineno - node.lineno + 1
            assert length <= MOST_CLASS_LINES, f"{name}.{node.name} has {length} lines"


def test_test_files_have_distinct_names():
    """pytest imports test files by their base name (tests/ has no packages): two of one name stop collection."""
    names = [p.name for p in Path(__file__).parent.rglob("test_*.py")]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []
