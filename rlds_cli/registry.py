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
    name = "pointmass-demo-v0.hdf5"     # local file name
    urls = ["bundled:pointmass-demo-v0.hdf5"]   # mirrors, in order
    size = 345375                       # bytes, when known
    sha256 = "..."                      # when known

URLs with the ``bundled:`` scheme name a file shipped in ``rlds_cli/data``.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from rlds_cli import settings
from rlds_cli.errors import RegistryFormatError, UnknownDatasetIdError

BUNDLED_SCHEME = "bundled:"


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
_KNOWN_KEYS = {"id", "aliases", "format", "description", "license", "files", *_OPTION_KEYS}


def _check_lists(raw: Any) -> None:
    """Reject list fields given as something else (a string would be read letter by letter)."""
    files = raw["files"]
    if not isinstance(files, list) or not files:
        raise ValueError("'files' (a non-empty list of [[dataset.files]] tables)")
    for f in files:
        if not isinstance(f, dict) or not isinstance(f.get("urls"), list) or not f["urls"]:
            raise ValueError("'urls' (each file needs a non-empty list of URLs)")
    if not isinstance(raw.get("aliases", []), list):
        raise ValueError("'aliases' (a list of strings)")


def _parse_entry(raw: dict[str, Any], origin: Path) -> RegistryEntry:
    try:
        _check_lists(raw)
        files = tuple(
            RegistryFile(
                name=str(f["name"]),
                urls=tuple(str(u) for u in f["urls"]),
                size=int(f["size"]) if f.get("size") is not None else None,
                sha256=str(f["sha256"]).lower() if f.get("sha256") else None,
            )
            for f in raw["files"]
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
    """The entry for an id or alias."""
    table = _load(tuple(_registry_files()))
    try:
        return table[dataset_id]
    except KeyError:
        raise UnknownDatasetIdError(f"unknown dataset id {dataset_id!r}") from None


def is_known(dataset_id: str) -> bool:
    """Whether an id or alias is in the registry."""
    return dataset_id in _load(tuple(_registry_files()))
