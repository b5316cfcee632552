"""Fetching a Hub repo's files into a download folder, with rlds's guarantees on top of the client.

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
import os
from pathlib import Path
from urllib.parse import quote

from rlds_cli._util.io import sha256_file
from rlds_cli._util.locks import FileLock
from rlds_cli.errors import ChecksumMismatchError, DownloadFailedError, OfflineError
from rlds_cli.net.fetch import FetchResult
from rlds_cli.net.hashes import FileRecord, HashStore
from rlds_cli.net.hub.repo import HubFile, HubPath, endpoint, git_blob_id, translated
from rlds_cli.net.layout import meta_dir

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
