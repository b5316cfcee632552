"""The dataset registry: TOML files mapping ids (and aliases) to source files, their schema; which
entries live on the Hub; how a search pattern matches.

What a dataset name given by a user refers to, for every command and the library: ``rlds inspect
demo``, ``open_dataset("demo")``, ``Loader("demo")`` and the rest resolve names through
:func:`resolve_name`, so a registry alias works wherever a cached dataset's name does.

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
    options = { last_step = "transition" }   # optional reader options (the user's options override them)

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

A file set stands for every combination of its variables' values (written out, the Atari DQN
replay logs would be 13 MB of TOML). Its files are expanded when an entry is used, never at load;
an option it names (``--option checkpoints=0:2``) picks which values, and so which files are
downloaded, by :func:`rlds_cli._util.numbers.parse_numbers` (the reader's rule for that option).

A file may start with a ``[defaults]`` table: its keys fill in every entry of that file that
does not set them (tables, such as ``file_set``, are merged one level deep).

Exact facts (a file's ``size`` and ``sha256``) are checked against every download; ``published``
figures are only shown (``rlds list --remote``, ``rlds info``), marked as approximate.
URLs with the ``bundled:`` scheme name a file shipped in ``rlds_cli/data``; the others must be
``http://`` or ``https://``. Any other key (``ids``, ``url_status``, counts, ...) is kept in
:attr:`RegistryEntry.extra` and shown by ``rlds info``.

**Search** (``rlds list [--remote] PATTERN``): a pattern holding ``*``, ``?`` or ``[`` is a glob
over the whole text, any other a substring; both ignore case. Registry results are ranked by
:func:`match_rank` (``hopper`` lists the Hopper datasets before ``atari_dqn/ChopperCommand/1``).

**Hub-hosted entries**: an entry is Hub-hosted when its files are listed from a Hub folder
(``[dataset.listing]``, e.g. ``jdvakil/RoboSet_Sim``) or every URL of every file is a Hub
``resolve`` URL (``https://huggingface.co/datasets/ORG/REPO/resolve/REV/PATH``, e.g.
``farama-minari/D4RL``). Repo and folder are read from those URLs, never declared separately.
:func:`hub_source` gives the entry's folder as an ``hf://`` URL (what ``rlds download hf://...``
takes); :func:`hub_repos` groups entries by repo.

**The schema in code**: one parsed table becomes a checked, frozen :class:`RegistryEntry`.
"""

from __future__ import annotations

import difflib
import fnmatch
import itertools
import os
import posixpath
import re
import string
import tomllib
import urllib.parse
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from functools import cache, cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlds_cli import settings
from rlds_cli.errors import DatasetNotFoundError, InvalidNameError, RegistryFormatError, UnknownDatasetIdError

if TYPE_CHECKING:
    from rlds_cli.cache.root import CacheRoot


__all__ = [
    "BUNDLED_SCHEME",
    "PublishedFigures",
    "RegistryEntry",
    "RegistryFile",
    "RegistryFileSet",
    "RegistryListing",
    "entries",
    "is_known",
    "match_rank",
    "matches",
    "packaged_registry_dir",
    "resolve",
    "search",
    "suggestions",
]


#: Ranks of :func:`match_rank`, best first.
EXACT, PREFIX, WORD, INSIDE, DESCRIPTION_WORD, DESCRIPTION = range(6)


def _is_glob(pattern: str) -> bool:
    return any(ch in pattern for ch in "*?[")


def matches(pattern: str, *texts: str) -> bool:
    """Whether any of ``texts`` matches ``pattern``, ignoring case: as a glob over the whole text
    when the pattern holds ``*``, ``?`` or ``[`` (``D4RL/door/*``), else as a substring."""
    needle = pattern.lower()
    if _is_glob(pattern):
        return any(fnmatch.fnmatchcase(t.lower(), needle) for t in texts)
    return any(needle in t.lower() for t in texts)


def _starts_word(text: str, at: int) -> bool:
    """Whether ``text[at:]`` begins a word: at the start, after a separator (``-``, ``/``,
    ``_``, a space, ...), or at a capital after a lower-case letter or a digit
    (``ChopperCommand``: ``Command`` starts a word, ``hopper`` does not)."""
    if at == 0:
        return True
    before, here = text[at - 1], text[at]
    if not before.isalnum():
        return True
    return here.isupper() and (before.islower() or before.isdigit())


def _word_match(needle: str, text: str) -> bool:
    """Whether ``needle`` (lower case) occurs in ``text`` at the start of a word."""
    lowered = text.lower()
    at = lowered.find(needle)
    while at >= 0:
        if _starts_word(text, at):
            return True
        at = lowered.find(needle, at + 1)
    return False


def match_rank(pattern: str, names: list[str], description: str = "") -> int | None:
    """How well an entry matches ``pattern`` (lower is better), or ``None`` when it does not.

    ``names`` are its id and aliases. Substring pattern: :data:`EXACT` (a name is the pattern),
    :data:`PREFIX`, :data:`WORD` (starts a word of a name: ``bullet-hopper-medium-v0``),
    :data:`INSIDE` (``ChopperCommand``), then :data:`DESCRIPTION_WORD` / :data:`DESCRIPTION` for
    the description alone. Glob: :data:`EXACT` when a name matches, else :data:`DESCRIPTION`.
    """
    needle = pattern.lower()
    if _is_glob(pattern):
        if any(fnmatch.fnmatchcase(n.lower(), needle) for n in names):
            return EXACT
        return DESCRIPTION if description and fnmatch.fnmatchcase(description.lower(), needle) else None
    lowered = [n.lower() for n in names]
    if needle in lowered:
        return EXACT
    if any(n.startswith(needle) for n in lowered):
        return PREFIX
    if any(_word_match(needle, n) for n in names):
        return WORD
    if any(needle in n for n in lowered):
        return INSIDE
    if _word_match(needle, description):
        return DESCRIPTION_WORD
    return DESCRIPTION if needle in description.lower() else None


_RESOLVE = re.compile(r"^https://huggingface\.co/datasets/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")


@dataclass(frozen=True)
class HubSource:
    """The Hub dataset repo, folder and revision an entry's files come from."""

    repo: str
    path: str
    revision: str = "main"

    @property
    def url(self) -> str:
        """``hf://datasets/ORG/REPO[/PATH]`` (``@REV`` when not ``main``)."""
        tail = f"/{self.path}" if self.path else ""
        rev = f"@{self.revision}" if self.revision != "main" else ""
        return f"hf://datasets/{self.repo}{tail}{rev}"


def hub_source(entry: RegistryEntry) -> HubSource | None:
    """Where on the Hub ``entry``'s files come from; ``None`` when any of them comes from
    elsewhere (or the entry has no files)."""
    if entry.listing is not None:
        return HubSource(entry.listing.hf_repo, entry.listing.path.strip("/"), entry.listing.revision)
    if entry.file_set is not None or not entry.listed_files:
        return None
    found: set[tuple[str, str, str]] = set()
    for f in entry.listed_files:
        for url in f.urls:
            m = _RESOLVE.match(url)
            if m is None:
                return None
            repo, rev, path = m.group(1), urllib.parse.unquote(m.group(2)), urllib.parse.unquote(m.group(3))
            # the file's name may hold '/', so strip it whole rather than take dirname
            folder = path[: -len(f.name)].rstrip("/") if path.endswith(f.name) else posixpath.dirname(path)
            found.add((repo, folder, rev))
    if len(found) != 1:
        return None  # files from several folders: no one hf:// URL names them
    repo, folder, rev = found.pop()
    return HubSource(repo, folder, rev)


def hub_repos(entries: Iterable[RegistryEntry]) -> dict[str, list[str]]:
    """The Hub dataset repos of ``entries``, each with the ids that come from it, sorted."""
    out: dict[str, list[str]] = {}
    for entry in entries:
        src = hub_source(entry)
        if src is not None:
            out.setdefault(src.repo, []).append(entry.id)
    return {repo: sorted(ids) for repo, ids in sorted(out.items())}


def matches_repo(pattern: str, entry: RegistryEntry) -> bool:
    """Whether ``pattern`` names ``entry``'s Hub repo (``farama-minari/D4RL``, case-insensitive,
    or the repo's ``hf://datasets/...`` URL, or a folder inside it)."""
    src = hub_source(entry)
    if src is None:
        return False
    wanted = pattern.strip().removeprefix("hf://").removeprefix("datasets/").rstrip("/").lower()
    here = f"{src.repo}/{src.path}".rstrip("/").lower()
    return bool(wanted) and "/" in wanted and (here == wanted or here.startswith(wanted + "/"))


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
    """Entries whose id, an alias or the description matches ``pattern``, best first by
    :func:`match_rank`, then by id."""
    ranked = [
        (rank, e.id, e)
        for e in entries()
        if (rank := match_rank(pattern, [e.id, *e.aliases], e.description)) is not None
    ]
    return [e for _, _, e in sorted(ranked, key=lambda r: r[:2])]


def is_known(dataset_id: str) -> bool:
    """Whether an id or alias is in the registry."""
    return dataset_id in _load(tuple(_registry_files()))


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
        """Where a ``bundled:`` file lies inside the installed package (``rlds_cli/data/``)."""
        return Path(__file__).resolve().parent.parent / "data" / self.urls[0][len(BUNDLED_SCHEME) :]


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
    if not name.parts or name.is_absolute() or ".." in name.parts or "\\" in file.name:
        raise ValueError(f"'name' ({file.name!r} must be a relative path inside the download folder)")
    for url in file.urls:
        if not (url.startswith(BUNDLED_SCHEME) or _URL_RE.match(url)):
            raise ValueError(f"'urls' ({url!r} is neither http(s):// nor bundled:)")
    if file.sha256 is not None and not _SHA256_RE.match(file.sha256):
        raise ValueError(f"'sha256' ({file.sha256!r} is not 64 hex digits)")
    if file.size is not None and file.size < 0:
        raise ValueError(f"'size' ({file.size} is negative)")
    return file


def _check_names_apart(files: tuple[RegistryFile, ...]) -> None:
    """Reject two files of one name (one URL's bytes stood for both) or a name that is another's
    folder ('a' and 'a/b.hdf5': one cannot be written beside the other)."""
    names = [Path(f.name).as_posix() for f in files]  # "./x.hdf5" is "x.hdf5"
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"'name' ({twice[0]!r} names two files: each file needs a name of its own)")
    folders = {"/".join(n.split("/")[:i]) for n in names for i in range(1, n.count("/") + 1)}
    clash = sorted(set(names) & folders)
    if clash:
        raise ValueError(f"'name' ({clash[0]!r} is a file and the folder of another file)")


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
        _check_names_apart(files)
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


__all__ = ["resolve_name"]


def resolve_name(name: str, root: str | os.PathLike[str] | CacheRoot | None = None) -> str:
    """The name in the cache that ``name`` refers to.

    In order:

    1. a dataset of that name in the cache: ``name`` itself (a local name always wins, so a
       dataset you named ``demo`` hides the registry alias ``demo``);
    2. a registry id or alias whose dataset is in the cache under the name ``rlds download``
       gives it: that name (``demo`` -> ``pointmass-demo-v0``).

    Args:
        name: What the user typed: a cache name, or a registry id or alias.
        root: Cache root (a path or a :class:`~rlds_cli.cache.root.CacheRoot`; default: the
            configured one).

    Returns:
        A name for which ``CacheRoot(root).exists(...)`` is true.

    Raises:
        DatasetNotFoundError: Nothing in the cache answers to ``name``; the hint says how to get
            it (``rlds download`` for a registry id) or names close matches.
        InvalidNameError: ``name`` can name no dataset and is no registry id or alias.
    """
    from rlds_cli.cache.root import CacheRoot
    from rlds_cli.catalog import registry

    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    invalid: InvalidNameError | None = None
    try:
        if cache.exists(name):
            return name
    except InvalidNameError as exc:
        invalid = exc  # not a cache name (e.g. a RoboSet id with parentheses); maybe a registry id
    entry = registry.resolve(name) if registry.is_known(name) else None
    if entry is None and invalid is not None:
        raise invalid  # no name of any dataset: say so, not "no dataset named"
    if entry is not None:
        if cache.exists(entry.cache_name):
            return entry.cache_name
        raise DatasetNotFoundError(
            f"no dataset named {name!r} in the cache at {cache.path} (registry id {entry.id!r}, "
            "not downloaded yet)",
            hint=f"download and convert it first: rlds download {name}",
        )
    cached = [m.name for m in cache.iter_manifests()]
    close = difflib.get_close_matches(name, cached, n=3, cutoff=0.6)
    hint = None
    if close:
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? ('rlds list' shows the cached datasets)"
    raise DatasetNotFoundError(f"no dataset named {name!r} in the cache at {cache.path}", hint=hint)
