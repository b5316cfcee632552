"""Which registry entries come from the Hugging Face Hub, and from which dataset repo.

An entry is Hub-hosted when its files are listed from a Hub folder (``[dataset.listing]``,
e.g. RoboSet's ``jdvakil/RoboSet_Sim``) or when every URL of every file is a Hub ``resolve`` URL
(``https://huggingface.co/datasets/ORG/REPO/resolve/REV/PATH``, e.g. Minari's
``farama-minari/D4RL``). Nothing is declared twice: the repo and folder are read from the URLs the
registry already holds (each from the reference notes on datasets), so no repo id is made up
here. :func:`hub_source` gives the entry's folder as an ``hf://`` URL, what
``rlds download hf://...`` takes; :func:`hub_repos` groups the registry's entries by repo.
"""

from __future__ import annotations

import posixpath
import re
import urllib.parse
from collections.abc import Iterable
from dataclasses import dataclass

from rlds_cli.catalog.registry_schema import RegistryEntry

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
            # the folder: the URL's path less the file's own name in the download folder
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
