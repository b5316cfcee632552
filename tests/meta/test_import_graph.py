"""The package's import graph has no cycles, and reading the cache does not import its writers.

The graph is built from the source (AST), so it sees every import a module can run: module-level
and function-level ones, absolute and relative. Imports under ``if TYPE_CHECKING:`` never run and
are left out. ``from pkg import name`` is an edge to the module ``pkg.name`` when there is one,
else to ``pkg``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rlds_cli"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    """Every module of the package, by dotted name."""
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement that can run, at any depth (functions, methods, try blocks)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            yield from (i for child in node.orelse for i in _imports_in(child))
            continue
        yield from _imports_in(node)


def _imports_in(node: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    if isinstance(node, ast.Import | ast.ImportFrom):
        yield node
    else:
        yield from _imports(node)


def imported_modules(name: str, path: Path, known: set[str]) -> set[str]:
    """The modules of the package that module ``name`` (at ``path``) imports."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in _imports(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:  # relative: climb from this module's package
            anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
            base = ".".join([*anchor, *([base] if base else [])])
        for alias in node.names:
            child = f"{base}.{alias.name}"
            found.add(child if child in known else base)
    return {m for m in found if m in known and m != name}


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports."""
    mods = modules()
    known = set(mods)
    return {name: imported_modules(name, path, known) for name, path in mods.items()}


def benchmarks_graph() -> dict[str, set[str]]:
    """The benchmark scripts (top-level modules of ``benchmarks/``, which import each other by
    their bare names) -> the ones each imports."""
    mods = {p.stem: p for p in sorted((ROOT / "benchmarks").glob("*.py"))}
    return {name: imported_modules(name, path, set(mods)) for name, path in mods.items()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_graph_sees_every_kind_of_import() -> None:
    """The parser resolves what the cycle check relies on (on the package's own files)."""
    graph = import_graph()
    # function-level, absolute
    assert "rlds_cli.remote.reader" in graph["rlds_cli.loader.opening"]
    # `from pkg import mod` is the module, not the package
    assert "rlds_cli.cache.digest" in graph["rlds_cli.cache.builder"]
    assert "rlds_cli.cache" not in graph["rlds_cli.cache.builder"]
    assert "rlds_cli.settings" in graph["rlds_cli.cache.transaction"]  # from rlds_cli import settings
    # under `if TYPE_CHECKING:`: never runs, not an edge
    assert "rlds_cli.loader.loader" not in graph["rlds_cli.loader"]


def test_relative_imports_resolve(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import a\n")
    (pkg / "a.py").write_text("def f():\n    from .b import g\n")
    (pkg / "b.py").write_text("from pkg import a\nfrom . import c\n")
    known = {"pkg", "pkg.a", "pkg.b"}
    assert imported_modules("pkg", pkg / "__init__.py", known) == {"pkg.a"}
    assert imported_modules("pkg.a", pkg / "a.py", known) == {"pkg.b"}
    assert imported_modules("pkg.b", pkg / "b.py", known) == {"pkg.a", "pkg"}  # c is no module


def test_cycles_are_found() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert cycles(graph) == [["a", "b", "c"]]


def test_the_package_has_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def test_the_benchmarks_have_no_import_cycles() -> None:
    """Shared helpers live in benchmarks/_harness.py, which imports no section script."""
    graph = benchmarks_graph()
    assert "_harness" in graph["conversion_bench"] and "run_all" not in graph["conversion_bench"]
    found = cycles(graph)
    assert not found, "import cycles: " + "; ".join(" <-> ".join(c) for c in found)


def _imported_by(statement: str) -> set[str]:
    """The modules a fresh interpreter imports to run ``statement`` (``-X importtime``)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return {
        line.rsplit("|", 1)[-1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:")
    }


def test_opening_a_dataset_does_not_import_the_writers() -> None:
    loaded = _imported_by("import rlds_cli.cache.opening")
    assert {"rlds_cli", "rlds_cli.cache.manifest"} <= loaded, "the -X importtime output was not parsed"
    writers = loaded & {"rlds_cli.formats", "rlds_cli.cache.builder", "rlds_cli.cache.transaction"}
    assert not writers, sorted(writers)
