"""The dataset registry: TOML files mapping ids (and aliases) to source files; which entries live on
the Hub; how a search pattern matches.

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
"""

from __future__ import annotations

import difflib
import fnmatch
import posixpath
import re
import tomllib
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from rlds_cli import settings
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


#: The entry types live in :mod:`rlds_cli.catalog.registry_schema`; they stay importable from here.


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
