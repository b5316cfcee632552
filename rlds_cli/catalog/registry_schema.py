"""The registry's schema: the entry types and the parsing and checks of one ``[[dataset]]`` table.

Turns one parsed table into a checked, frozen :class:`RegistryEntry`; the TOML schema itself is
documented in :mod:`rlds_cli.catalog.registry`.
"""

from __future__ import annotations

import itertools
import re
import string
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import Any

from rlds_cli.errors import RegistryFormatError

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
class RegistryFileSet:
    """Many files of an entry written once as a pattern (see the module docstring).

    ``variables`` keeps the TOML order: the files are every combination of the values, the
    first variable varying slowest. ``options`` maps a reader option to the variable whose
    values it narrows."""

    name: str
    urls: tuple[str, ...]
    variables: tuple[tuple[str, tuple[str, ...]], ...]
    options: tuple[tuple[str, str], ...] = ()

    def expand(self, options: Mapping[str, Any] | None = None) -> tuple[RegistryFile, ...]:
        """The files, all of them or those the narrowing ``options`` pick.

        Raises:
            RegistryError: An option's value is not a number selection, or picks no value.
        """
        values = dict(self.variables)
        for option, var in self.options:
            spec = (options or {}).get(option)
            if spec is not None:
                values[var] = self._narrow(option, var, spec, values[var])
        names = [var for var, _ in self.variables]
        files = []
        for combo in itertools.product(*(values[var] for var in names)):
            fields = dict(zip(names, combo, strict=True))
            quoted = {k: urllib.parse.quote(v, safe="") for k, v in fields.items()}
            files.append(
                RegistryFile(self.name.format(**fields), tuple(u.format(**quoted) for u in self.urls))
            )
        return tuple(files)

    def _narrow(self, option: str, var: str, spec: object, values: tuple[str, ...]) -> tuple[str, ...]:
        from rlds_cli._util.numbers import parse_numbers
        from rlds_cli.errors import RegistryError

        try:
            keep, named = parse_numbers(spec)
        except ValueError:
            raise RegistryError(
                f"{option}={spec!r} is not a range 'A:B' or a list of numbers",
                hint=f"e.g. {option}=0:2 (A <= N < B) or {option}=49,50",
            ) from None
        picked = tuple(v for v in values if keep is None or keep(int(v)))
        missing = sorted(named - {int(v) for v in values}) if named else []
        if missing or not picked:
            raise RegistryError(
                f"{option}={spec!r} picks {'no file' if not picked else f'missing {var} {missing}'}: "
                f"this entry has {var} {values[0]}..{values[-1]}",
                hint=f"choose {option} among {values[0]}..{values[-1]}",
            )
        return picked


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
    listed_files: tuple[RegistryFile, ...]
    aliases: tuple[str, ...] = ()
    description: str = ""
    license: str = ""
    options: dict[str, Any] = field(default_factory=dict)
    origin: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    listing: RegistryListing | None = None
    published: PublishedFigures | None = None
    file_set: RegistryFileSet | None = None

    @cached_property
    def files(self) -> tuple[RegistryFile, ...]:
        """Every file: the listed ones, then the file set's (expanded on first use)."""
        return self.files_for()

    def files_for(self, options: Mapping[str, Any] | None = None) -> tuple[RegistryFile, ...]:
        """The files to download with these reader options: a file set's options (such as
        ``checkpoints``) pick which of its files; listed files are always all downloaded."""
        if self.file_set is None:
            return self.listed_files
        return self.listed_files + self.file_set.expand(options)

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
        return self.listing is None and self.file_set is None and all(f.is_bundled for f in self.listed_files)

    def env_entry(self) -> dict[str, Any] | None:
        """The manifest's ``env`` for a download of this entry (:mod:`rlds_cli.cache.env_spec`):
        for a D4RL entry its D4RL id (the ``gym`` environment id the ``d4rl`` package registers)
        and ``max_episode_steps``; ``None`` for any other entry."""
        ids = self.extra.get("ids")
        env_id = ids.get("d4rl") if self.format == "d4rl" and isinstance(ids, dict) else None
        if not isinstance(env_id, str) or not env_id:
            return None
        spec: dict[str, Any] = {"id": env_id}
        steps = self.options.get("max_episode_steps", self.extra.get("max_episode_steps"))
        if isinstance(steps, int) and not isinstance(steps, bool):
            spec["max_episode_steps"] = steps
        what = "D4RL id, registered as an environment by the d4rl package"
        return {"spec": spec, "origin": f"registry entry {self.id!r} ({what})", "source": "registry"}


_OPTION_KEYS = ("max_episode_steps",)
_KNOWN_KEYS = {
    "id", "aliases", "format", "description", "license", "files", "file_set", "listing", "published",
    "options", *_OPTION_KEYS,
}  # fmt: skip


def _check_lists(raw: Any) -> None:
    """Reject list fields given as something else (a string would be read letter by letter)."""
    elsewhere = "listing" in raw or "file_set" in raw
    files = raw.get("files", []) if elsewhere else raw["files"]
    if not isinstance(files, list) or (not files and not elsewhere):
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


def _reader_options(raw: dict[str, Any]) -> dict[str, Any]:
    """The entry's ``options`` table: reader options (checked against the format's options
    when the entry is converted, and overridden by the user's)."""
    options = raw.get("options", {})
    if not isinstance(options, dict):
        raise ValueError("'options' (a table of reader options, e.g. { last_step = \"transition\" })")
    return options


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


def _parse_file_set(raw: Any) -> RegistryFileSet | None:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        raise ValueError("'file_set' (a table with name, urls and vars)")
    urls = raw.get("urls")
    if not isinstance(urls, list) or not urls or not all(isinstance(u, str) for u in urls):
        raise ValueError("'file_set.urls' (a non-empty list of URL patterns)")
    variables = tuple((str(k), _file_set_values(k, _frozen(v))) for k, v in _table(raw, "vars").items())
    if not variables:
        raise ValueError("'file_set.vars' (a table of at least one variable)")
    known = dict(variables)
    for pattern in (raw["name"], *urls):
        if _fields(pattern) - set(known):
            raise ValueError(
                f"'file_set' ({pattern!r} uses {sorted(_fields(pattern) - set(known))}, not in vars)"
            )
    if set(known) - _fields(raw["name"]):
        raise ValueError(f"'file_set.name' (must use every variable, so names differ: {sorted(known)})")
    options = tuple((str(k), str(v)) for k, v in _table(raw, "options").items())
    for option, var in options:
        if var not in known or not all(v.isdigit() for v in known[var]):
            raise ValueError(f"'file_set.options' ({option!r} must name a variable of numbers)")
    file_set = RegistryFileSet(raw["name"], tuple(urls), variables, options)
    # check only the first and last files (each value is checked by _file_set_values): the Atari
    # registry expands to 76k files
    for pick in (0, -1):
        corner = RegistryFileSet(file_set.name, file_set.urls, tuple((k, (v[pick],)) for k, v in variables))
        _check_file(corner.expand()[0])
    return file_set


def _table(raw: dict[str, Any], key: str) -> dict[str, Any]:
    value = raw.get(key, {})
    if not isinstance(value, dict):
        raise ValueError(f"'file_set.{key}' (a table)")
    return value


@cache
def _fields(pattern: str) -> frozenset[str]:
    """The ``{field}`` names a pattern uses."""
    return frozenset(f for _, f, _, _ in string.Formatter().parse(pattern) if f is not None)


def _frozen(raw: Any) -> Any:
    """A TOML value as a hashable one (so a file's shared ``vars`` are checked once)."""
    if isinstance(raw, dict):
        return tuple(sorted((k, _frozen(v)) for k, v in raw.items()))
    if isinstance(raw, list):
        return ("list", *(_frozen(v) for v in raw))
    return raw


@cache
def _file_set_values(name: str, raw: Any) -> tuple[str, ...]:
    """A variable's values: a list, or ``{ start = A, stop = B }`` for the numbers A..B-1 (both
    given here as :func:`_frozen` made them)."""
    if isinstance(raw, tuple) and raw[:1] != ("list",):
        bounds = dict(raw)
        start, stop = bounds.get("start", 0), bounds.get("stop")
        if type(start) is not int or type(stop) is not int or not 0 <= start < stop:
            raise ValueError(f"'file_set.vars.{name}' ({{ start = A, stop = B }} with 0 <= A < B)")
        return tuple(str(n) for n in range(start, stop))
    items = raw[1:] if isinstance(raw, tuple) else None
    if not items or not all(isinstance(v, str | int) for v in items):
        raise ValueError(f"'file_set.vars.{name}' (a non-empty list, or {{ start = A, stop = B }})")
    values = tuple(str(v) for v in items)
    for value in values:
        # no separator and not only dots: no combination can climb out of the download folder
        if not value.strip(".") or "/" in value or "\\" in value:
            raise ValueError(f"'file_set.vars.{name}' ({value!r} is not a plain file-name part)")
    return values


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


def parse_entry(raw: dict[str, Any], origin: Path) -> RegistryEntry:
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
            listed_files=files,
            aliases=tuple(str(a) for a in raw.get("aliases", ())),
            description=str(raw.get("description", "")),
            license=str(raw.get("license", "")),
            options={**{k: raw[k] for k in _OPTION_KEYS if k in raw}, **_reader_options(raw)},
            origin=str(origin),
            extra={k: v for k, v in raw.items() if k not in _KNOWN_KEYS},
            listing=_parse_listing(raw.get("listing")),
            published=_parse_published(raw.get("published")),
            file_set=_parse_file_set(raw.get("file_set")),
        )
    except (KeyError, TypeError, ValueError) as exc:
        ident = raw.get("id", "?") if isinstance(raw, dict) else "?"
        raise RegistryFormatError(
            f"registry file {origin}: entry {ident!r} is missing or has a bad {exc}"
        ) from exc


def with_defaults(defaults: dict[str, Any], raw: Any) -> Any:
    """An entry with its file's ``[defaults]`` filled in: the entry's own keys win, and a table
    both give (``file_set``) is merged one level deep."""
    if not defaults or not isinstance(raw, dict):
        return raw
    merged = {**defaults, **raw}
    for key, value in defaults.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            merged[key] = {**value, **raw[key]}
    return merged
