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
BOTTOM = frozenset({"errors", "settings", "_io", "_version", "_lazy", "numbers", "rows", "plugins"})
#: Names, aliases and the registry's records: read by the cache's opening and by the services.
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
    "archives": BOTTOM,
    "cache": BOTTOM,  # and cache/ted.py, cache/layout.py: the bottom's TED vocabulary and paths
    "registry_schema": BOTTOM | {"cache"},
    "matching": BOTTOM,
    "registry": BOTTOM | {"registry_schema", "matching"},
    "registry_hub": BOTTOM | {"registry_schema"},
    "names": BOTTOM | {"cache", "registry"},
    "envspec": BOTTOM | {"cache", "registry"},
    "normalization": BOTTOM | {"cache"},
    "summary": BOTTOM | {"cache", "scores"},
    "scores": BOTTOM | {"cache", "names", "envspec", "registry"},
    "validate": BOTTOM | {"cache", "formats"},  # checks a source file with the readers
    "plot": BOTTOM | {"cache", "summary"},
    "catalog": BOTTOM | {"cache", "matching", "registry", "registry_hub", "net"},
    "loader": BOTTOM | {"cache", "normalization"},
    "write": BOTTOM | {"cache"},
    "formats": BOTTOM | {"cache", "archives"},
    "recording": BOTTOM | {"cache", "write", "formats"},
    "export": BOTTOM | {"cache", "recording", "remote"},  # export/hub.py commits an export to the Hub
    "net": BOTTOM | {"cache", "registry"},
    "remote": BOTTOM | {"cache", "write", "names", "net"},  # net/hub: the Hub client's URL, token, endpoint
    "preprocess": BOTTOM | {"cache", "remote"},
    "convert": BOTTOM | {"cache", "formats", "archives", "net"},
    "hub_download": BOTTOM | {"cache", "convert", "formats", "net"},
    "download": BOTTOM | {"cache", "convert", "formats", "net", "registry", "hub_download"},
    "demo": BOTTOM,
    "data": frozenset(),
}
STANDS_ON_EVERYTHING = {"cli", "rlds_cli"}

#: (importer, imported) module pairs that break :data:`MAY_IMPORT` today, and why each remains.
KNOWN_VIOLATIONS: dict[tuple[str, str], str] = {
    # cache -> remote: opening a dataset by URL reads it with remote/reader.py (imported only
    # for a URL); moving that dispatch behind a plug point is still to do.
    ("rlds_cli.cache.opening", "rlds_cli.remote.reader"): "open_dataset(URL) dispatches to the remote reader",
    # cache -> names -> registry: open_dataset resolves an alias through the registry; the
    # resolution belongs above the cache (a resolver passed in), a change to open_dataset's callers.
    ("rlds_cli.cache.opening", "rlds_cli.names"): "alias resolution inside open_dataset",
    # cache -> envspec -> registry: Dataset.env_spec() looks the dataset's environment up in the
    # registry; to move with the alias resolution above.
    ("rlds_cli.cache.dataset", "rlds_cli.envspec"): "Dataset.env_spec() reads the registry",
    # net -> formats: `rlds verify` (net/verify.py) asks the readers which files a source has;
    # the check belongs above formats (beside download.py), a move of the module just split off
    # net/status.py by another change.
    ("rlds_cli.net.verify", "rlds_cli.formats"): "rlds verify asks the readers for source files",
    # recording -> the front door: the recorder reaches DatasetWriter and open_dataset lazily
    # through rlds_cli/__init__ instead of their modules.
    ("rlds_cli.recording.recorder", "rlds_cli"): "recorder imports from the front door",
}

#: Modules over the limit, each with the reason it is (none: every module is split).
MAX_LINES = 500
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


def test_the_check_sees_a_lazy_import_against_the_rule() -> None:
    """A function-level import of a format from the cache is a violation (the graph sees it)."""
    graph = {"rlds_cli.cache.x": {"rlds_cli.formats.keys"}, "rlds_cli.formats.keys": {"rlds_cli.cache.ted"}}
    assert violations(graph) == {("rlds_cli.cache.x", "rlds_cli.formats.keys")}


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_every_module_is_at_most_500_lines() -> None:
    root = PACKAGE.parent
    long = {p.relative_to(root).as_posix(): _lines(p) for p in modules().values() if _lines(p) > MAX_LINES}
    new = {p: n for p, n in long.items() if p not in KNOWN_LONG}
    gone = sorted(set(KNOWN_LONG) - set(long))
    assert not new, f"modules over {MAX_LINES} lines (split them along responsibilities): {new}"
    assert not gone, f"now short enough: remove these from KNOWN_LONG: {gone}"
