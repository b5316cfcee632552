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

    [dataset.listing]                   # instead of (or besides) files: a Hugging Face folder
    hf_repo = "jdvakil/RoboSet_Sim"     # dataset repo, listed with the Hub's tree API
    path = "DAPG(expert)/door_v2d-v1"   # folder inside the repo
    suffix = ".h5"                      # keep files whose name ends so
    revision = "main"

Exact facts (a file's ``size`` and ``sha256``) are checked against every download; ``published``
figures are only shown (``rlds list --remote``, ``rlds info``), marked as approximate.
URLs with the ``bundled:`` scheme name a file shipped in ``rlds_cli/data``; the others must be
``http://`` or ``https://``. Any other key (``ids``, ``url_status``, counts, ...) is kept in
:attr:`RegistryEntry.extra` and shown by ``rlds info``.
"""

from __future__ import annotations

import difflib
import fnmatch
import re
import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from rlds_cli import settings
from rlds_cli.errors import RegistryFormatError, UnknownDatasetIdError

BUNDLED_SCHEME = "bundled:"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_URL_RE = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]+)?/\S*$")


@dataclass(frozen=True)
class RegistryFile:
    """One file of a registry entry."""

    name: str
    urls: tuple[str, ...]
    size: int | None = None
    sha256: str | None = None

    @property
    def is_bundled(self) -> bool:
        return all(u.startswith(BUNDLED_SCHEME) for u in self.urls)

    def bundled_path(self) -> Path:
        """Where a ``bundled:`` file lies inside the installed package."""
        from importlib.resources import files

        return Path(str(files("rlds_cli.data") / self.urls[0][len(BUNDLED_SCHEME) :]))


@dataclass(frozen=True)
class RegistryListing:
    """A Hugging Face dataset-repo folder whose files are found at download time."""

    hf_repo: str
    path: str
    suffix: str = ""
    revision: str = "main"


@dataclass(frozen=True)
class PublishedFigures:
    """Sizes and counts an upstream publishes for a dataset, rounded as published (shown with a
    ``~``, never used to check a download)."""

    source: str
    steps: int | None = None
    episodes: int | None = None
    size_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        """The figures as a JSON-ready dict."""
        return {
            "source": self.source,
            "steps": self.steps,
            "episodes": self.episodes,
            "size_bytes": self.size_bytes,
        }


@dataclass(frozen=True)
class RegistryEntry:
    """One dataset id and where its data comes from."""

    id: str
    format: str
    files: tuple[RegistryFile, ...]
    aliases: tuple[str, ...] = ()
    description: str = ""
    license: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    origin: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    listing: RegistryListing | None = None
    published: PublishedFigures | None = None

    @property
    def cache_name(self) -> str:
        """The default name in the cache: the id, or the first alias that is a valid name
        (RoboSet ids hold parentheses, which cache names cannot)."""
        from rlds_cli.cache.root import validate_name
        from rlds_cli.errors import InvalidNameError

        for candidate in (self.id, *self.aliases):
            try:
                return validate_name(candidate)
            except InvalidNameError:
                continue
        return validate_name(self.id)  # raises with the id in the message

    @property
    def is_bundled(self) -> bool:
        """Whether every file ships inside the package (nothing to download)."""
        return self.listing is None and all(f.is_bundled for f in self.files)


def packaged_registry_dir() -> Path:
    """The registry folder of this installation (wheel copy, else the source checkout's)."""
    here = Path(__file__).resolve().parent
    shipped = here / "_registry"
    return shipped if shipped.is_dir() else here.parent / "registry"


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


_OPTION_KEYS = ("max_episode_steps",)
_KNOWN_KEYS = {
    "id", "aliases", "format", "description", "license", "files", "listing", "published", *_OPTION_KEYS,
}  # fmt: skip


def _check_lists(raw: Any) -> None:
    """Reject list fields given as something else (a string would be read letter by letter)."""
    files = raw["files"] if "listing" not in raw else raw.get("files", [])
    if not isinstance(files, list) or (not files and "listing" not in raw):
        raise ValueError("'files' (a non-empty list of [[dataset.files]] tables)")
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("urls"), list) or not f["urls"]:
            raise ValueError("'urls' (each file needs a non-empty list of URLs)")
    if not isinstance(raw.get("aliases", []), list):
        raise ValueError("'aliases' (a list of strings)")


def _check_file(file: RegistryFile) -> RegistryFile:
    """Reject values that would fail only at download time, with the key in the message."""
    name = Path(file.name)
    if not file.name or name.is_absolute() or ".." in name.parts or "\\" in file.name:
        raise ValueError(f"'name' ({file.name!r} must be a relative path inside the download folder)")
    for url in file.urls:
        if not (url.startswith(BUNDLED_SCHEME) or _URL_RE.match(url)):
            raise ValueError(f"'urls' ({url!r} is neither http(s):// nor bundled:)")
    if file.sha256 is not None and not _SHA256_RE.match(file.sha256):
        raise ValueError(f"'sha256' ({file.sha256!r} is not 64 hex digits)")
    if file.size is not None and file.size < 0:
        raise ValueError(f"'size' ({file.size} is negative)")
    return file


def _parse_listing(raw: Any) -> RegistryListing | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw.get("hf_repo") or "path" not in raw:
        raise ValueError("'listing' (a table with hf_repo and path)")
    return RegistryListing(
        hf_repo=str(raw["hf_repo"]),
        path=str(raw["path"]).strip("/"),
        suffix=str(raw.get("suffix", "")),
        revision=str(raw.get("revision", "main")),
    )


def _parse_published(raw: Any) -> PublishedFigures | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("source"), str) or not raw["source"]:
        raise ValueError("'published' (a table with a 'source' saying where the figures come from)")
    figures: dict[str, int | None] = {}
    for key in ("steps", "episodes", "size_bytes"):
        value = raw.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value <= 0):
            raise ValueError(f"'published.{key}' ({value!r} is not a positive integer)")
        figures[key] = value
    return PublishedFigures(source=raw["source"], **figures)


def _parse_entry(raw: dict[str, Any], origin: Path) -> RegistryEntry:
    try:
        _check_lists(raw)
        files = tuple(
            _check_file(
                RegistryFile(
                    name=str(f["name"]),
                    urls=tuple(str(u) for u in f["urls"]),
                    size=int(f["size"]) if f.get("size") is not None else None,
                    sha256=str(f["sha256"]).lower() if f.get("sha256") else None,
                )
            )
            for f in raw.get("files", [])
        )
        return RegistryEntry(
            id=str(raw["id"]),
            format=str(raw["format"]),
            files=files,
            aliases=tuple(str(a) for a in raw.get("aliases", ())),
            description=str(raw.get("description", "")),
            license=str(raw.get("license", "")),
            options={k: raw[k] for k in _OPTION_KEYS if k in raw},
            origin=str(origin),
            extra={k: v for k, v in raw.items() if k not in _KNOWN_KEYS},
            listing=_parse_listing(raw.get("listing")),
            published=_parse_published(raw.get("published")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        ident = raw.get("id", "?") if isinstance(raw, dict) else "?"
        raise RegistryFormatError(
            f"registry file {origin}: entry {ident!r} is missing or has a bad {exc}"
        ) from exc


@cache
def _load(paths: tuple[Path, ...]) -> dict[str, RegistryEntry]:
    by_name: dict[str, RegistryEntry] = {}
    for path in paths:
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise RegistryFormatError(f"cannot read registry file {path}: {exc}") from exc
        for raw in data.get("dataset", []):
            entry = _parse_entry(raw, path)
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


def matches(pattern: str, *texts: str) -> bool:
    """Whether any of ``texts`` matches ``pattern``, ignoring case: as a glob over the whole text
    when the pattern holds ``*``, ``?`` or ``[`` (``D4RL/door/*``), else as a substring."""
    needle = pattern.lower()
    if any(ch in pattern for ch in "*?["):
        return any(fnmatch.fnmatchcase(t.lower(), needle) for t in texts)
    return any(needle in t.lower() for t in texts)


def search(pattern: str) -> list[RegistryEntry]:
    """Entries whose id, an alias or the description matches ``pattern`` (see :func:`matches`),
    sorted by id."""
    return [e for e in entries() if matches(pattern, e.id, *e.aliases, e.description)]


def is_known(dataset_id: str) -> bool:
    """Whether an id or alias is in the registry."""
    return dataset_id in _load(tuple(_registry_files()))
