"""The dataset registry: TOML files mapping ids (and aliases) to source files.

Registry files are read from the package (``registry/`` in a source checkout, copied into
the wheel as ``rlds_cli/_registry``) and from every file or folder in ``$RLDS_REGISTRY``; a
later file may not redefine an id or alias of an earlier one. Schema (one table per dataset)::

    [[dataset]]
    id = "pointmass-demo-v0"            # required, unique
    aliases = ["demo"]                  # other names for the same data
    format = "d4rl"                     # source format (see ``rlds_cli.formats``)
    description = "..."
    license = "..."
    max_episode_steps = 100             # optional reader hint
    options = { last_step = "transition" }   # optional reader options (the user's override them)

    [[dataset.files]]
    name = "pointmass-demo-v0.hdf5"     # local file name (may hold '/': "data/main_data.hdf5")
    urls = ["bundled:pointmass-demo-v0.hdf5"]   # mirrors, in order
    size = 345375                       # bytes, when known
    sha256 = "..."                      # when known; else recorded on first download

    [dataset.published]                 # optional: figures an upstream publishes, as rounded there
    steps = 1000000                     # approximate step count ("1M" in Minari's table)
    episodes = 4356
    size_bytes = 1077700000             # approximate download size ("1,077.7 MB")
    source = "Minari 'list remote' table (Minari#242)"

    [dataset.file_set]                  # instead of (or besides) files: many files as a pattern
    name = "logs/{part}_ckpt.{n}.gz"    # {var} fields; every variable must appear in the name
    urls = ["https://host/run/logs/{part}_ckpt.{n}.gz"]   # values are percent-encoded here
    vars = { n = { start = 0, stop = 51 }, part = ["obs", "action"] }   # first varies slowest
    options = { checkpoints = "n" }     # a reader option that narrows a variable's values

    [dataset.listing]                   # instead of (or besides) files: a Hugging Face folder
    hf_repo = "jdvakil/RoboSet_Sim"     # dataset repo, listed with the Hub's tree API
    path = "DAPG(expert)/door_v2d-v1"   # folder inside the repo
    suffix = ".h5"                      # keep files whose name ends so
    revision = "main"

A file set stands for every combination of its variables' values (the Atari DQN replay logs: 51
checkpoints x 6 files for each of 250 runs would be 13 MB of TOML written out). Its files are
expanded when an entry is used, never at load; an option it names (``--option checkpoints=0:2``)
picks which values, and so which files are downloaded, by :func:`rlds_cli._util.numbers.parse_numbers`'s
rule, the one the reader applies to the same option.

A file may start with a ``[defaults]`` table: its keys fill in every entry of that file that
does not set them (tables, such as ``file_set``, are merged one level deep).

Exact facts (a file's ``size`` and ``sha256``) are checked against every download; ``published``
figures are only shown (``rlds list --remote``, ``rlds info``), marked as approximate.
URLs with the ``bundled:`` scheme name a file shipped in ``rlds_cli/data``; the others must be
``http://`` or ``https://``. Any other key (``ids``, ``url_status``, counts, ...) is kept in
:attr:`RegistryEntry.extra` and shown by ``rlds info``.
"""

from __future__ import annotations

import difflib
import tomllib
from functools import cache
from pathlib import Path

from rlds_cli import settings
from rlds_cli.catalog.matching import match_rank
from rlds_cli.catalog.matching import (
    matches as matches,  # its old home: callers of registry.matches keep working
)
from rlds_cli.catalog.registry_schema import (
    BUNDLED_SCHEME,
    PublishedFigures,
    RegistryEntry,
    RegistryFile,
    RegistryFileSet,
    RegistryListing,
    parse_entry,
    with_defaults,
)
from rlds_cli.errors import RegistryFormatError, UnknownDatasetIdError

#: The entry types live in :mod:`rlds_cli.catalog.registry_schema`; they stay importable from here.
__all__ = [
    "BUNDLED_SCHEME",
    "PublishedFigures",
    "RegistryEntry",
    "RegistryFile",
    "RegistryFileSet",
    "RegistryListing",
    "entries",
    "is_known",
    "matches",
    "packaged_registry_dir",
    "resolve",
    "search",
    "suggestions",
]


def packaged_registry_dir() -> Path:
    """The registry folder of this installation (wheel copy, else the source checkout's)."""
    package = Path(__file__).resolve().parent.parent  # rlds_cli/
    shipped = package / "_registry"
    return shipped if shipped.is_dir() else package.parent / "registry"


def _registry_files() -> list[Path]:
    paths: list[Path] = []
    for base in (packaged_registry_dir(), *settings.extra_registry_paths()):
        if base.is_dir():
            paths.extend(sorted(base.glob("*.toml")))
        elif base.is_file():
            paths.append(base)
        else:
            raise RegistryFormatError(
                f"registry path {base} (from RLDS_REGISTRY) does not exist",
                hint="fix RLDS_REGISTRY: a list of .toml files or folders",
            )
    return paths


@cache
def _load(paths: tuple[Path, ...]) -> dict[str, RegistryEntry]:
    by_name: dict[str, RegistryEntry] = {}
    for path in paths:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise RegistryFormatError(f"cannot read registry file {path}: {exc}") from exc
        defaults = data.get("defaults", {})
        if not isinstance(defaults, dict):
            raise RegistryFormatError(f"registry file {path}: 'defaults' must be a table")
        for raw in data.get("dataset", []):
            entry = parse_entry(with_defaults(defaults, raw), path)
            for key in (entry.id, *entry.aliases):
                if key in by_name:
                    raise RegistryFormatError(
                        f"registry file {path}: {key!r} is already defined in {by_name[key].origin}"
                    )
                by_name[key] = entry
    return by_name


def entries() -> list[RegistryEntry]:
    """Every registry entry, sorted by id."""
    unique = {e.id: e for e in _load(tuple(_registry_files())).values()}
    return [unique[k] for k in sorted(unique)]


def resolve(dataset_id: str) -> RegistryEntry:
    """The entry for an id or alias.

    Raises:
        UnknownDatasetIdError: Neither an id nor an alias; the hint names close ones.
    """
    table = _load(tuple(_registry_files()))
    try:
        return table[dataset_id]
    except KeyError:
        close = suggestions(dataset_id)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise UnknownDatasetIdError(
            f"unknown dataset id {dataset_id!r}",
            hint=f"{hint}'rlds list --remote PATTERN' searches the registry's ids, aliases and descriptions",
        ) from None


def suggestions(name: str, limit: int = 3) -> list[str]:
    """Registry ids and aliases that look like ``name`` (for "did you mean" hints)."""
    keys = list(_load(tuple(_registry_files())))
    by_lower = {k.lower(): k for k in keys}
    close = difflib.get_close_matches(name.lower(), list(by_lower), n=limit, cutoff=0.8)
    return [by_lower[c] for c in close]


def search(pattern: str) -> list[RegistryEntry]:
    """Entries whose id, an alias or the description matches ``pattern`` (see
    :func:`~rlds_cli.catalog.matching.matches`), best matches first
    (:func:`~rlds_cli.catalog.matching.match_rank`:
    the id itself, ids that start with it, ids where it starts a word, ids that merely contain
    it, then descriptions), by id within a rank."""
    ranked = [
        (rank, e.id, e)
        for e in entries()
        if (rank := match_rank(pattern, [e.id, *e.aliases], e.description)) is not None
    ]
    return [e for _, _, e in sorted(ranked, key=lambda r: r[:2])]


def is_known(dataset_id: str) -> bool:
    """Whether an id or alias is in the registry."""
    return dataset_id in _load(tuple(_registry_files()))
