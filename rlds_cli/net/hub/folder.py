"""A registry entry's Hub folder (``[dataset.listing]``: RoboSet, V-D4RL) as files for the generic
fetcher, all at the commit the listing saw.

huggingface_hub lists the folder (:func:`~rlds_cli.net.hub.repo.resolve`: revision resolved to a
commit sha, paged, token sent, 429s waited out); each file becomes a
:class:`~rlds_cli.net.fetch.RemoteFile` whose URL is its ``resolve`` URL at that sha, so a branch
that moves meanwhile cannot mix two versions. :func:`rlds_cli.net.fetch.fetch_files` then fetches
them into the entry's folder (``.part`` resumed across runs, parallel, per-file locks, first-seen
hashes pinned after conversion). The listing and its commit are kept in ``.rlds/listing.json``
for offline use and for when the Hub cannot be reached.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlds_cli._util.io import atomic_write
from rlds_cli.errors import RegistryFormatError
from rlds_cli.net.fetch import RemoteFile
from rlds_cli.net.http import OriginAuth, origin_of
from rlds_cli.net.hub.fetch import file_url, local_name
from rlds_cli.net.hub.repo import HubPath, check_token, endpoint, resolve
from rlds_cli.net.layout import is_reserved, listing_path, stored_listing


@dataclass(frozen=True)
class FolderListing:
    """The files of a Hub folder at one commit.

    Attributes:
        where: The repo, the folder and the revision asked for.
        commit: The commit sha the files' URLs name (``None`` for a stored listing without one:
            its URLs name the branch).
        files: The files, named relative to the folder, sorted.
    """

    where: HubPath
    commit: str | None
    files: list[RemoteFile]

    def provenance(self) -> dict[str, Any]:
        """The source record: ``url`` (``hf://...@<sha>``) and ``hub`` (repo, path, revision asked
        for, commit), as ``hf://`` downloads record them; ``{}`` without a commit."""
        if self.commit is None:
            return {}
        w = self.where
        tail = f"/{w.path}" if w.path else ""
        return {
            "url": f"hf://datasets/{w.repo}{tail}@{self.commit}",
            "hub": {"repo": w.repo, "path": w.path, "revision": w.revision, "commit": self.commit},
        }


def list_folder(repo: str, path: str, *, revision: str = "main", suffix: str = "") -> FolderListing:
    """The files under ``path`` of dataset repo ``repo`` whose names end in ``suffix``, at the
    commit ``revision`` points at now; LFS files carry the sha256 and size the Hub publishes.

    Raises:
        HTTPStatusError: No such repo, revision or folder (404), or a gated/private repo without
            a token that may read it (401/403).
        DownloadFailedError: The Hub kept failing or cannot be reached.
        RegistryFormatError: The folder holds no file ending in ``suffix``.
        MissingExtraError: huggingface_hub is not installed.
    """
    where = HubPath(repo, path.strip("/"), revision)
    sha, listed = resolve(where)
    files = []
    for f in listed:
        name = local_name(where, f)
        if name.endswith(suffix) and not is_reserved(name):  # never a name in the bookkeeping folder
            files.append(RemoteFile(name, (file_url(where, sha, f.path),), f.size, f.sha256, "hub"))
    if not files:
        raise RegistryFormatError(
            f"the Hugging Face folder {repo}/{where.path} holds no file ending in {suffix!r}",
            hint="the repository layout may have changed; check the folder on the Hub",
        )
    return FolderListing(where, sha, sorted(files, key=lambda f: f.name))


def save_listing(folder: Path, listing: FolderListing) -> None:
    """Remember ``listing`` in ``folder``'s ``.rlds/listing.json``."""
    w = listing.where
    data = {
        "repo": w.repo,
        "path": w.path,
        "revision": w.revision,
        "commit": listing.commit,
        "files": [{**f.__dict__, "urls": list(f.urls)} for f in listing.files],
    }
    path = listing_path(folder)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps(data, indent=2) + "\n")


def read_listing(folder: Path, where: HubPath) -> FolderListing | None:
    """The listing kept in ``folder`` (``None`` if none); a stored plain JSON list of files has
    no commit."""
    known = stored_listing(folder)
    if known is None:
        return None
    data = json.loads(known.read_text(encoding="utf-8"))
    items, commit = (data, None) if isinstance(data, list) else (data["files"], data.get("commit"))
    files = [RemoteFile(**{**f, "urls": tuple(f["urls"])}) for f in items]
    return FolderListing(where, commit, files)


def token_auth() -> OriginAuth | None:
    """The token the Hub client would send (``HF_TOKEN``, else its token file; none when
    ``HF_HUB_DISABLE_IMPLICIT_TOKEN`` is set), bound to the Hub's origin, for rlds' own file
    requests; ``None`` without a token or without huggingface_hub."""
    try:
        from huggingface_hub.utils import build_hf_headers
    except ImportError:
        return None
    check_token()
    header = build_hf_headers().get("authorization")
    return OriginAuth(origin_of(endpoint()), header) if header else None
