"""Imports point down only, and every module stays small: the layering of docs/architecture.md,
held from the source.

The import graph is :mod:`tests.test_import_graph`'s (the AST of every module: module-level and
function-level imports, relative ones resolved; ``if TYPE_CHECKING:`` blocks left out), so a lazy
import inside a function counts as much as one at the top. Each module belongs to a *unit*: its
top-level package under ``rlds_cli/`` (``cache``, ``formats``, ...) or its top-level module
(``convert``, ``registry``, ...). :data:`MAY_IMPORT` is the rule: the units each unit may import.
The known exceptions are listed module by module in :data:`KNOWN_VIOLATIONS`, each with why it
remains; the test fails on any new violation and also when a listed one is gone (delete its line:
the list only shrinks).
"""

from __future__ import annotations

from pathlib import Path

from tests.test_import_graph import PACKAGE, import_graph, modules

#: The bottom layer: imports nothing of rlds above it.
#: (``tfds_layout``: an RLDS/TFDS folder's file names, the one rule of the reader's layout in
#: ``formats`` and of the Hub's download plan in ``net``, which may not import ``formats``.)
BOTTOM = frozenset(
    {"errors", "settings", "_io", "_version", "_lazy", "numbers", "rows", "plugins", "tfds_layout"}
)
#: Names, aliases and the registry's records: read by the front door's opener and by the services.
CATALOG = frozenset({"registry", "registry_schema", "registry_hub", "matching", "names", "envspec"})
#: Read-side services over a cached dataset (inspect, listing, scores, statistics).
SERVICES = frozenset({"normalization", "summary", "scores", "validate", "plot", "catalog"})

#: unit -> the other units it may import (its own modules are always allowed). The CLI and the
#: front door (``rlds_cli/__init__``, lazy) stand on everything.
MAY_IMPORT: dict[str, frozenset[str]] = {
    "errors": frozenset(),
    "_version": frozenset(),
    "_lazy": frozenset(),
    "settings": frozenset({"errors"}),
    **{unit: frozenset({"errors", "settings"}) for unit in ("_io", "numbers", "rows", "plugins")},
    "tfds_layout": frozenset({"errors"}),
    "archives": BOTTOM,
    "cache": BOTTOM,  # and cache/ted.py, cache/layout.py: the bottom's TED vocabulary and paths
    "registry_schema": BOTTOM | {"cache"},
    "matching": BOTTOM,
    "registry": BOTTOM | {"registry_schema", "matching"},
    "registry_hub": BOTTOM | {"registry_schema"},
    "names": BOTTOM | {"cache", "registry"},
    "envspec": BOTTOM | {"cache", "registry"},
    # the front door's opener (rlds_cli/opening.py): an alias resolved, a URL read where it lies
    "opening": BOTTOM | {"cache", "names", "remote"},
    "normalization": BOTTOM | {"cache", "opening"},  # from_dataset(NAME) opens any name
    "summary": BOTTOM | {"cache", "scores"},
    "scores": BOTTOM | {"cache", "names", "envspec", "registry"},
    "validate": BOTTOM | {"cache", "formats"},  # checks a source file with the readers
    "plot": BOTTOM | {"cache", "summary"},
    "catalog": BOTTOM | {"cache", "matching", "registry", "registry_hub", "net"},
    "loader": BOTTOM | {"cache", "normalization", "opening"},
    "write": BOTTOM | {"cache"},
    "formats": BOTTOM | {"cache", "archives"},
    "recording": BOTTOM | {"cache", "write", "formats"},
    "export": BOTTOM | {"cache", "recording", "remote"},  # export/hub.py commits an export to the Hub
    "net": BOTTOM | {"cache", "registry"},
    "remote": BOTTOM | {"cache", "write", "names", "net"},  # net/hub: the Hub client's URL, token, endpoint
    "preprocess": BOTTOM | {"cache", "remote", "opening"},
    "convert": BOTTOM | {"cache", "formats", "archives", "net"},
    "verify": BOTTOM | {"cache", "registry", "net", "formats"},  # rlds verify: hashes, sources
    "hub_download": BOTTOM | {"cache", "convert", "formats", "net"},
    "download": BOTTOM | {"cache", "convert", "formats", "net", "registry", "hub_download"},
    "demo": BOTTOM,
    "data": frozenset(),
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
    from tests.test_import_graph import cycles

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
    graph = {"rlds_cli.cache.x": {"rlds_cli.formats.keys"}, "rlds_cli.formats.keys": {"rlds_cli.cache.ted"}}
    assert violations(graph) == {("rlds_cli.cache.x", "rlds_cli.formats.keys")}


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
