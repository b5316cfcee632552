"""A Hub repo's files into a download folder: which files a download needs, and fetching them with
rlds's guarantees on top of the client.

Which files of a Hub repo a download fetches: those a conversion needs, from the repo's layout;
a registry entry's Hub folder, from its listing.

**From the layout.** A LeRobot dataset (``meta/info.json`` at the folder's root) needs ``meta/``,
``data/`` and ``videos/`` only. An RLDS/TFDS dataset folder (``features.json`` next to
``<name>-<split>.tfrecord-NNNNN-of-NNNNN`` shards; Open X-Embodiment and its mirrors keep one per
``<name>/<version>/``, found at any depth below the folder named) needs its ``features.json``,
``dataset_info.json`` and the shards of the split read. Any other layout needs its files except
the Hub's own (``.gitattributes``) and the dataset card, and the format is then sniffed from the
downloaded files like a local folder's (Minari, D4RL HDF5, V-D4RL, npz).

The rules read file names only (nothing is downloaded to decide). TFDS dataset folders and shard
splits are recognised by :mod:`rlds_cli._util.tfds_layout`, as for a local folder.

**A registry entry's Hub folder** (``[dataset.listing]``: RoboSet, V-D4RL): files for the generic
fetcher, all at the commit the listing saw. huggingface_hub lists the folder
(:func:`~rlds_cli.net.hub.repo.resolve`: revision resolved to a commit sha, paged, token sent,
429s waited out); each file becomes a :class:`~rlds_cli.net.fetch.RemoteFile` whose URL is its
``resolve`` URL at that sha, so a branch that moves meanwhile cannot mix two versions.
:func:`rlds_cli.net.fetch.fetch_files` then fetches them into the entry's folder (``.part``
resumed across runs, parallel, per-file locks, first-seen hashes pinned after conversion). The
listing and its commit are kept in ``.rlds/listing.json`` for offline use and for when the Hub
cannot be reached.

Fetching a Hub repo's files into a download folder, with rlds's guarantees on top of the client.

``huggingface_hub.hf_hub_download`` does the transfer (endpoint, token, Xet/LFS redirects,
``Retry-After`` retries, resume within the run) into the staging folder ``<folder>/.rlds/hub/``.
Each file is checked against the size, and the LFS sha256 or git blob id, the Hub lists; only a
file that verifies is moved (one ``os.replace``) into the folder and recorded in ``hashes.json``;
one that does not is deleted and never seen by a conversion. Across runs, resume is per file: a
re-run fetches only the files not yet verified. The client's partial files are never resumed
across runs; those a killed run left are deleted by the next fetch, under the staging lock.
"""

from __future__ import annotations

import datetime
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

from rlds_cli._util.io import atomic_write, sha256_file
from rlds_cli._util.locks import FileLock
from rlds_cli._util.tfds_layout import FEATURES_FILE, INFO_FILE, is_shard_name, one_tfds_folder, shard_split
from rlds_cli.errors import (
    ChecksumMismatchError,
    DownloadFailedError,
    OfflineError,
    RegistryFormatError,
    SourceFormatError,
)
from rlds_cli.net.fetch import FetchResult, RemoteFile
from rlds_cli.net.http import OriginAuth, origin_of
from rlds_cli.net.hub.repo import HubFile, HubPath, check_token, endpoint, git_blob_id, resolve, translated
from rlds_cli.net.layout import FileRecord, HashStore, is_reserved, listing_path, meta_dir, stored_listing

#: Files a repo carries for the Hub, never for a reader: its git attributes and its dataset card
#: (the card's name is split in two so that it is not read as a docs pointer).
_HUB_FILES = {".gitattributes", "README" + ".md", "readme" + ".md"}


#: The folders of a LeRobot dataset that its reader reads.
_LEROBOT_DIRS = ("meta/", "data/", "videos/")


#: The metadata files of a TFDS dataset folder that the rlds reader reads.
_TFDS_META = (FEATURES_FILE, INFO_FILE)


def layout_format(where: HubPath, files: list[HubFile]) -> str | None:
    """The format the repo layout shows, when the files alone tell (else ``None``: sniffed later).

    Raises:
        SourceFormatError: The folder holds several RLDS/TFDS dataset folders (name one).
    """
    names = {local_name(where, f) for f in files}
    if "meta/info.json" in names:
        return "lerobot"
    return "rlds" if _tfds_folder(where, names) is not None else None


def dataset_folder(where: HubPath, files: list[HubFile], fmt: str | None) -> str:
    """The folder, relative to ``where.path``, that the reader of ``fmt`` is given: an RLDS
    dataset's TFDS folder (``name/version``, ``""`` when it is the folder named), else ``""``.

    Raises:
        SourceFormatError: The folder holds several RLDS/TFDS dataset folders (name one).
    """
    if fmt != "rlds":
        return ""
    return _tfds_folder(where, {local_name(where, f) for f in files}) or ""


def needed_files(
    where: HubPath, files: list[HubFile], fmt: str | None, options: dict[str, Any] | None = None
) -> list[HubFile]:
    """The files of ``files`` that a conversion in format ``fmt`` (with reader ``options``) reads."""
    if fmt == "lerobot":
        return [f for f in files if local_name(where, f).startswith(_LEROBOT_DIRS)]
    if fmt == "rlds" and _tfds_folder(where, {local_name(where, f) for f in files}) is not None:
        return _tfds_files(where, files, (options or {}).get("split"))
    return [f for f in files if local_name(where, f).rsplit("/", 1)[-1] not in _HUB_FILES]


def _split_dir(name: str) -> tuple[str, str]:
    folder, _, base = name.rpartition("/")
    return folder, base


def _tfds_folder(where: HubPath, names: set[str]) -> str | None:
    """The TFDS dataset folder among ``names`` (``""``: the folder named), ``None`` if none;
    several are refused (the user names one)."""
    base = f"hf://datasets/{where.repo}/" + (where.path.strip("/") + "/" if where.path.strip("/") else "")
    return one_tfds_folder(names, str(where), base)


def _tfds_files(where: HubPath, files: list[HubFile], split: object) -> list[HubFile]:
    """The TFDS folder's metadata and the shards of the split the reader reads: ``split`` when
    given, else ``train`` when present (the reader's default), else the only split.

    Raises:
        SourceFormatError: No shards of the split asked for, or several splits, none ``train``
            and none asked for (before anything is fetched).
    """
    root = _tfds_folder(where, {local_name(where, f) for f in files})
    mine = [(f, base) for f in files for d, base in [_split_dir(local_name(where, f))] if d == root]
    splits = sorted({shard_split(base) for _, base in mine if is_shard_name(base)})
    if isinstance(split, str) and split not in splits:
        raise SourceFormatError(
            f"{where}: {root or 'the folder'} has no shards of split {split!r} "
            f"(splits: {', '.join(map(repr, splits))})"
        )
    if not isinstance(split, str) and "train" not in splits and len(splits) > 1:
        raise SourceFormatError(
            f"{where}: {root or 'the folder'} holds the splits {', '.join(map(repr, splits))} "
            "and none is 'train'",
            hint=f"pick one: rlds download {where} --option split=NAME",
        )
    chosen = split if isinstance(split, str) else "train" if "train" in splits else None
    return [
        f for f, base in mine
        if base in _TFDS_META or (is_shard_name(base) and chosen in (None, shard_split(base)))
    ]  # fmt: skip


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


#: Staging folder of the client's downloads, inside the download folder's bookkeeping.
STAGING = "hub"


def file_url(where: HubPath, sha: str, path: str) -> str:
    """The ``resolve`` URL of one file at a commit (what provenance records; never a token)."""
    return f"{endpoint()}/datasets/{where.repo}/resolve/{sha}/{quote(path, safe='/')}"


def local_name(where: HubPath, file: HubFile) -> str:
    """A repo file's name in the download folder: its path below ``where.path``."""
    prefix = where.path.strip("/") + "/" if where.path.strip("/") else ""
    return file.path[len(prefix) :] if file.path.startswith(prefix) else file.path


def fetch_hub_files(
    where: HubPath,
    sha: str,
    files: list[HubFile],
    folder: Path,
    *,
    force: bool = False,
    offline: bool = False,
) -> list[FetchResult]:
    """Make every file of ``files`` (at commit ``sha``) present and verified under ``folder``.

    Raises:
        ChecksumMismatchError: The bytes served do not match the Hub's sha256 (or size).
        OfflineError: Offline, and a file is missing.
        HTTPStatusError: A gated/private repo without a token that may read it, or a missing file.
        DownloadFailedError: The Hub kept failing.
    """
    folder.mkdir(parents=True, exist_ok=True)
    staging = meta_dir(folder) / STAGING
    staging.mkdir(parents=True, exist_ok=True)
    # one fetch at a time per staging folder: a waiting one then finds the files verified, and
    # any partial file found now is a killed run's
    with FileLock(staging.with_name(f"{STAGING}.lock")):
        _remove_partials(staging)
        return _fetch_all(where, sha, files, folder, staging, force=force, offline=offline)


def _remove_partials(staging: Path) -> None:
    """Delete the client's partial files (``*.incomplete``, named anew per transfer, so never
    resumed) that a killed fetch left in ``staging``."""
    for path in staging.rglob("*.incomplete"):
        path.unlink(missing_ok=True)


def _fetch_all(
    where: HubPath, sha: str, files: list[HubFile], folder: Path, staging: Path, *, force: bool, offline: bool
) -> list[FetchResult]:
    store = HashStore(folder)
    results: list[FetchResult] = []
    for file in files:
        name = local_name(where, file)
        target = folder / name
        url = file_url(where, sha, file.path)
        record = None if force else _verified(store, name, target, file)
        if record is not None:
            results.append(
                FetchResult(name, target, record.sha256, record.size, url, "cached", record.origin)
            )
            continue
        if offline:
            raise OfflineError(f"{where} file {file.path!r} is not downloaded yet and offline mode is on")
        got = _download(where, sha, file, staging)
        digest = _check(where, file, got)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(got, target)  # only verified bytes reach the folder a conversion reads
        origin = "hub" if file.sha256 else "recorded"
        store.put(
            name,
            FileRecord(
                digest, file.size, origin, url, target.stat().st_mtime_ns,
                datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                pinned=file.sha256 is not None,
            ),
        )  # fmt: skip
        results.append(FetchResult(name, target, digest, file.size, url, "downloaded", origin))
    return results


def _verified(store: HashStore, name: str, target: Path, file: HubFile) -> FileRecord | None:
    """The record of a copy already there and unchanged since it verified, if it matches ``file``."""
    record = store.get(name)
    if record is None or not target.is_file():
        return None
    stat = target.stat()
    if stat.st_size != file.size or stat.st_mtime_ns != record.mtime_ns:
        return None
    if file.sha256 is not None and record.sha256 != file.sha256:
        return None
    return record


def _download(where: HubPath, sha: str, file: HubFile, staging: Path) -> Path:
    from huggingface_hub import hf_hub_download

    with translated(where, file.path):
        got = hf_hub_download(
            where.repo, file.path, repo_type="dataset", revision=sha, local_dir=staging, endpoint=endpoint()
        )
    path = Path(got)
    if not path.is_file():
        raise DownloadFailedError(f"the Hub client gave no file for {where} file {file.path!r}")
    return path


def _check(where: HubPath, file: HubFile, got: Path) -> str:
    """The sha256 of ``got``, after checking it against what the Hub lists (deleting it if not)."""
    size = got.stat().st_size
    digest = sha256_file(got)
    problem = ""
    if size != file.size:
        problem = f"{size} bytes, the Hub lists {file.size}"
    elif file.sha256 is not None and digest != file.sha256:
        problem = f"sha256 {digest}, the Hub lists {file.sha256}"
    elif file.git_oid is not None and (oid := git_blob_id(got.read_bytes())) != file.git_oid:
        problem = f"git blob {oid}, the Hub lists {file.git_oid}"  # a small file, kept in git
    if problem:
        got.unlink(missing_ok=True)  # the next run downloads it again instead of trusting it
        raise ChecksumMismatchError(
            f"{where} file {file.path!r} arrived as {problem}; nothing was converted",
            hint="run the same command again (a transfer error); if it persists, the repo's file is corrupt",
        )
    return digest
