"""Imports point down only, and every module stays small: the layering of docs/architecture.md,
held from the source.

The import graph is :mod:`tests.meta.test_import_graph`'s (the AST of every module: module-level and
function-level imports, relative ones resolved; ``if TYPE_CHECKING:`` blocks left out), so a lazy
import inside a function counts as much as one at the top. Each module belongs to a *unit*: its
top-level package under ``rlds_cli/`` (``cache``, ``formats``, ...) or its top-level module
(``convert``, ``registry``, ...). :data:`MAY_IMPORT` is the rule: the units each unit may import.
The known exceptions are listed module by module in :data:`KNOWN_VIOLATIONS`, each with why it
remains; the test fails on any new violation and also when a listed one is gone (delete its line:
the list only shrinks).
"""

from __future__ import annotations

import ast
from pathlib import Path

from tests.meta.test_import_graph import PACKAGE, import_graph, modules

#: The bottom layer: imports nothing of rlds above it (``_util``: files written whole, lazy names,
#: plug points, file locks, number and row rules, an RLDS/TFDS folder's file names).
BOTTOM = frozenset({"errors", "settings", "_version", "_util"})

#: unit -> the other units it may import (its own modules are always allowed). The CLI and the
#: front door (``rlds_cli/__init__``, lazy) stand on everything.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "_version": frozenset(),
    "settings": frozenset({"errors"}),
    "_util": frozenset({"errors", "settings"}),
    # camera frames: the image codecs, the --frames modes, the threads that decode
    "frames": BOTTOM,
    "cache": BOTTOM | {"frames"},  # and cache/ted.py, cache/layout.py: the bottom's TED vocabulary and paths
    # names: the registry and what a name refers to
    "catalog": BOTTOM | {"cache", "frames"},
    "write": BOTTOM | {"cache", "frames"},
    "formats": BOTTOM | {"cache", "frames"},
    "recording": BOTTOM | {"cache", "frames", "write", "formats"},
    "net": BOTTOM | {"cache", "frames", "catalog"},
    # object stores and the Hub's write side
    "remote": BOTTOM | {"cache", "frames", "write", "catalog", "net"},
    # download, conversion, verification against the sources
    "sources": BOTTOM | {"cache", "frames", "catalog", "formats", "net"},
    # listing, summaries, TED checks (which read source files with the readers), plots
    "inspection": BOTTOM | {"cache", "frames", "catalog", "formats", "net"},
    # the read side's top: loader/opening.py opens any name (an alias, a URL read where it lies)
    "loader": BOTTOM | {"cache", "frames", "catalog", "remote"},
    # export/lerobot.py commits an export to the Hub; export/minari.py writes the reference scores
    # (catalog/scores.py); the RLDS and LeRobot exporters write with the
    # readers' own rules (formats/tfrecord_io.py, formats/tfds_features.py, formats/lerobot/)
    "export": BOTTOM | {"cache", "frames", "catalog", "recording", "remote", "formats"},
    "preprocess": BOTTOM
    | {"cache", "frames", "remote", "loader"},  # loader/opening.py: inputs opened by any name
}
#: The shipped contract suites (they import pytest) stand on every unit; no unit imports them.
MAY_IMPORT["testing"] = frozenset(MAY_IMPORT)
STANDS_ON_EVERYTHING = {"cli", "rlds_cli"}

#: (importer, imported) module pairs that break :data:`MAY_IMPORT` today, and why each remains.
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {}

#: A module is one concept, up to this many lines where the concept needs them (issue 39: the
#: cap of 500 split modules by length, not by concept). Modules over it, each with its reason.
MAX_LINES = 800
KNOWN_LONG: dict[str, str] = {}


def unit(module: str) -> str:
    """The unit of a package module: ``rlds_cli.cache.reader`` -> ``cache``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def violations(graph: dict[str, set[str]]) -> set[tuple[str, str]]:
    """The (importer, imported) pairs of ``graph`` that :data:`MAY_IMPORT` does not allow."""
    found = set()
    for importer, imported in graph.items():
        source = unit(importer)
        if source in STANDS_ON_EVERYTHING:
            continue
        allowed = MAY_IMPORT[source]
        found.update((importer, m) for m in imported if unit(m) != source and unit(m) not in allowed)
    return found


def test_every_unit_has_a_rule() -> None:
    units = {unit(m) for m in modules()}
    assert units - set(MAY_IMPORT) - STANDS_ON_EVERYTHING == set(), "add the new unit to MAY_IMPORT"
    assert set(MAY_IMPORT) - units == set(), "a unit of MAY_IMPORT no longer exists: remove it"


def test_the_rule_points_down() -> None:
    """The table itself has no cycle between units (a unit never allowed to import one above it)."""
    from tests.meta.test_import_graph import cycles

    graph = {u: set(allowed) for u, allowed in MAY_IMPORT.items()}
    assert cycles(graph) == []


def test_imports_point_down_only() -> None:
    found = violations(import_graph())
    new = sorted(found - set(KNOWN_VIOLATIONS))
    gone = sorted(set(KNOWN_VIOLATIONS) - found)
    assert not new, f"imports against the layering (docs/architecture.md): {new}"
    assert not gone, f"fixed: remove these from KNOWN_VIOLATIONS: {gone}"


def test_nothing_imports_the_contract_suites() -> None:
    """``rlds_cli.testing`` imports pytest: no module outside it (the CLI and the front door
    included) may import it, so ``rlds --help`` and the read path never load pytest."""
    graph = import_graph()
    importers = sorted(m for m, imported in graph.items() if unit(m) != "testing" and any(
        unit(i) == "testing" for i in imported))  # fmt: skip
    assert importers == [], f"rlds_cli.testing is for tests only: {importers} import it"
    assert any(unit(m) == "testing" for m in graph), "the check must see rlds_cli.testing"


def test_the_contract_suites_import_nothing_of_the_tests() -> None:
    """A third party runs the suites without rlds's ``tests/`` folder."""
    root = PACKAGE / "testing"
    for path in sorted(root.glob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert "from tests" not in text and "import tests" not in text, path


def test_the_check_sees_a_lazy_import_against_the_rule() -> None:
    """A function-level import of a format from the cache is a violation (the graph sees it)."""
    graph = {"rlds_cli.cache.x": {"rlds_cli.formats.base"}, "rlds_cli.formats.base": {"rlds_cli.cache.ted"}}
    assert violations(graph) == {("rlds_cli.cache.x", "rlds_cli.formats.base")}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_every_module_is_at_most_800_lines() -> None:
    root = PACKAGE.parent
    long = {p.relative_to(root).as_posix(): _lines(p) for p in modules().values() if _lines(p) > MAX_LINES}
    new = {p: n for p, n in long.items() if p not in KNOWN_LONG}
    gone = sorted(set(KNOWN_LONG) - set(long))
    assert not new, f"modules over {MAX_LINES} lines (one concept each: split along concepts): {new}"
    assert not gone, f"now short enough: remove these from KNOWN_LONG: {gone}"


def test_benchmark_and_script_modules_are_at_most_800_lines() -> None:
    """The same limit for the benchmark harness and sections and the maintenance scripts."""
    root = PACKAGE.parent
    files = [*(root / "benchmarks").glob("*.py"), *(root / "scripts").glob("*.py")]
    assert len(files) > 20  # the folders are where this test looks
    long = {p.relative_to(root).as_posix(): _lines(p) for p in files if _lines(p) > MAX_LINES}
    assert not long, f"modules over {MAX_LINES} lines (one concept each: split along concepts): {long}"


#: Packages of the bottom layer whose leading underscore keeps them out of the front door, not
#: out of the package: every layer imports them.
SHARED_PRIVATE_PACKAGES = ("rlds_cli._util", "rlds_cli._version")


def private_imports(package: Path = PACKAGE) -> list[str]:
    """``importer: module.name`` for every import, in ``package``, of another module's private
    name or of a private module (:data:`SHARED_PRIVATE_PACKAGES` apart)."""
    found = []
    for path in sorted(package.rglob("*.py")):
        parts = path.relative_to(package.parent).with_suffix("").parts
        importer = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(package.name):
                continue
            module = node.module or ""
            if module == importer:
                continue
            private_module = not module.startswith(SHARED_PRIVATE_PACKAGES) and any(
                part.startswith("_") for part in module.split(".")
            )
            for alias in node.names:
                name = alias.name
                if private_module or (name.startswith("_") and not name.startswith("__")):
                    found.append(f"{importer}: {module}.{name}")
                elif not module.startswith(SHARED_PRIVATE_PACKAGES) and name.startswith("_"):
                    found.append(f"{importer}: {module}.{name}")  # a private module by name
    return found


def test_no_module_imports_another_modules_private_names() -> None:
    """Issue 39: the 500-line cap split modules by length, and 57 imports of private names tied
    the halves together. A name used by another module is public, with its docstring."""
    assert private_imports() == [], "imports of another module's private names"


def test_the_private_import_check_finds_one(tmp_path: Path) -> None:
    package = tmp_path / "rlds_cli"
    (package / "_util").mkdir(parents=True)
    (package / "a.py").write_text("def _hidden():\n    pass\n")
    (package / "_util" / "io.py").write_text("def _inner():\n    pass\n")
    (package / "b.py").write_text(
        "from rlds_cli.a import _hidden\nfrom rlds_cli import _private_module\n"
        "from rlds_cli._util.io import _inner\nfrom rlds_cli._util import io\n"
    )
    assert private_imports(package) == [
        "rlds_cli.b: rlds_cli.a._hidden",
        "rlds_cli.b: rlds_cli._private_module",
        "rlds_cli.b: rlds_cli._util.io._inner",
    ]
