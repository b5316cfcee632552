"""``rlds pull``: a pushed dataset copied into the cache, checked, published atomically.

**Pull** (``rlds pull URL``). Files arrive in a build directory ``tmp/<entry>.<id>.incomplete``
whose ``id`` comes from the URL and the manifest's sha256, so a killed pull keeps its finished
files and the same pull continues. Each file is written to ``<file>.part`` and renamed once its
size and sha256 match the remote index; the manifest is written last, its content digests are
recomputed, and only then is the directory published by the conversion's atomic rename, under the
name's lock. Nothing is visible in the cache before that rename."""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlds_cli import settings
from rlds_cli._util import signals
from rlds_cli._util.io import atomic_write, fsync_tree, sha256_file
from rlds_cli._util.locks import Timeout
from rlds_cli._util.progress import Progress
from rlds_cli.cache.layout import (
    EPISODES_FILE,
    GROWING_FOLDERS,
    MANIFEST_FILE,
    SEGMENTED_LAYOUT,
    SOURCE_ARRAYS_FILE,
)
from rlds_cli.cache.manifest import Manifest, manifest_text
from rlds_cli.cache.opening import open_published
from rlds_cli.cache.root import CacheRoot, validate_name
from rlds_cli.errors import (
    CorruptDatasetError,
    DatasetExistsError,
    DatasetReplacedError,
    LockTimeoutError,
    RemoteCorruptError,
)
from rlds_cli.remote import store
from rlds_cli.remote.store import INDEX_FILE, FileEntry, RemoteIndex, TransferResult

logger = logging.getLogger(__name__)


@dataclass(kw_only=True)
class PullResult(TransferResult):
    """What :func:`pull` did (the rest: :class:`~rlds_cli.remote.store.TransferResult`; ``skipped``
    counts the files kept from an interrupted pull of the same version).

    Attributes:
        path: Its directory in the cache.
        downloaded: Files downloaded by this run.
        bytes_downloaded: Bytes downloaded by this run.
        digests_checked: The content digests were recomputed and matched (``False`` for a
            dataset without recorded digests, or when nothing was pulled).
    """

    path: str
    downloaded: int = 0
    bytes_downloaded: int = 0
    digests_checked: bool = False


def pull(
    url: str,
    name: str | None = None,
    *,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    force: bool = False,
    storage_options: dict[str, Any] | None = None,
    endpoint_url: str | None = None,
    progress: Progress | None = None,
    lock_timeout: float = 10.0,
) -> PullResult:
    """Download the dataset at ``url`` into the cache.

    Args:
        url: The dataset's folder on the store (what ``rlds push`` was given).
        name: Its name in the cache (default: the name it was pushed under); another name is
            written into the pulled manifest, nothing else changes.
        root: Cache root.
        force: Replace the dataset of that name in the cache; the same version is pulled again (what
            mends a local copy that fails its checks).
        storage_options: Keyword arguments of the fsspec filesystem (credentials...).
        endpoint_url: An S3-compatible server (else s3fs reads ``AWS_ENDPOINT_URL``).
        progress: Called with ``("start", bytes_to_fetch)`` then ``("advance", n)``.
        lock_timeout: Seconds to wait for another writer of the same name.

    Raises:
        RemoteDatasetNotFoundError: No manifest at ``url`` (not a dataset, or a push under way).
        RemoteCorruptError: A remote file differs from what was pushed (names the key).
        DatasetReplacedError: The remote version was replaced during the pull.
        DatasetExistsError: ``name`` holds another dataset and ``force`` is false.
        CorruptDatasetError: ``name`` holds this version with a file missing or resized, and
            ``force`` is false.
        RemoteAccessError: The store cannot be used (bucket, credentials, endpoint).
    """
    started = time.monotonic()
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    fs, base = store.open_url(url, storage_options, endpoint_url)
    remote_manifest, manifest, index = store.read_version(fs, base, url, then="pull")
    name = validate_name(manifest.name if name is None else name)
    local_manifest = remote_manifest if name == manifest.name else _renamed(manifest, name)
    total = sum(e.size for e in index.files.values())
    result = PullResult(
        name, url, manifest.backend, len(index.files), path=str(cache.dataset_dir(name)), bytes_total=total,
        # a growing dataset's digests are its segments' (checked at the end as a converted one's)
        digests_checked=bool(manifest.content_digest.get("columns")) or manifest.layout == SEGMENTED_LAYOUT,
    )  # fmt: skip
    if not force and _same_as_published(cache, name, url, local_manifest, manifest, index):
        result.up_to_date, result.digests_checked = True, False
        return result.timed(started)
    try:
        with cache.lock(name, timeout=lock_timeout):
            _pull_locked(cache, fs, base, manifest, local_manifest, index, force, progress, result)
    except Timeout:
        raise LockTimeoutError(f"dataset {name!r} is being written by another process") from None
    except RemoteCorruptError:
        # a file that differs from the index is damage only if the version is still the one
        # pulled: a push --force during the pull replaces files under it
        if store.read_bytes(fs, store.join(base, MANIFEST_FILE), url) != remote_manifest:
            raise DatasetReplacedError(
                f"dataset at {url} was replaced (or removed) during the pull; nothing was published",
                hint="run the pull again",
            ) from None
        raise
    return result.timed(started)


def _pull_locked(
    cache: CacheRoot,
    fs: Any,
    base: str,
    manifest: Manifest,
    local_manifest: bytes,
    index: RemoteIndex,
    force: bool,
    progress: Progress | None,
    result: PullResult,
) -> None:
    name, url = result.name, result.url
    entry = cache.dataset_dir(name).name
    cache.recover(entry)  # a replacement of this name a crash interrupted: finish it first
    if cache.exists(name):
        if not force and _same_as_published(cache, name, url, local_manifest, manifest, index):
            result.up_to_date, result.digests_checked = True, False
            return
        if not force:
            raise DatasetExistsError(
                f"dataset {name!r} already exists in the cache at {cache.dataset_dir(name)} (pulling {url})",
                hint="pass --force to replace it, or --name to pull it under another name",
            )
        result.replaced = True
    ident = hashlib.sha256(f"{fs.unstrip_protocol(base)}|{index.manifest_sha256}".encode()).hexdigest()[:12]
    # a build directory of its own per URL and version (not a CacheTransaction's fresh one):
    # an interrupted pull of the same version continues with the files it has
    build = cache.layout.build_dir(entry, ident)
    build.mkdir(parents=True, exist_ok=True)
    (build / MANIFEST_FILE).unlink(missing_ok=True)  # a check that failed last time wrote it
    todo = [rel for rel, e in sorted(index.files.items()) if not _kept_intact(build / rel, e)]
    result.skipped = len(index.files) - len(todo)
    if progress is not None:
        progress("start", sum(index.files[rel].size for rel in todo))
    for rel in todo:
        _download_file(fs, store.join(base, rel), build / rel, index.files[rel], url, rel, manifest, progress)
        result.downloaded += 1
        result.bytes_downloaded += index.files[rel].size
    for folder in GROWING_FOLDERS if manifest.layout == SEGMENTED_LAYOUT else ():  # no file to push
        (build / folder).mkdir(exist_ok=True)
    _check_build(build, local_manifest, url, manifest)
    if fsync := settings.fsync_enabled():
        fsync_tree(build)
    with signals.publishing(f"dataset {name!r}"):
        cache.publish(build, name, replace=force, fsync=fsync)


def _kept_intact(path: Path, entry: FileEntry) -> bool:
    """Whether ``path``, kept from an interrupted pull (each file is renamed to its name once
    checked), still is the file pushed: its size and sha256. One that changed on this disk since
    is removed, to be fetched again (its damage is this copy's: the store's was checked)."""
    if not path.is_file():
        return False
    if path.stat().st_size == entry.size and sha256_file(path) == entry.sha256:
        return True
    logger.warning("%s, kept from an interrupted pull, changed on this disk since: fetched again", path)
    path.unlink()
    return False


def _download_file(
    fs: Any,
    source: str,
    target: Path,
    entry: FileEntry,
    url: str,
    rel: str,
    manifest: Manifest,
    progress: Progress | None,
) -> None:
    """Fetch one file into ``<target>.part``, check its size and sha256 against the index, then
    rename it to ``target`` (so a file under its own name is always a verified one)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    part = target.with_name(target.name + ".part")
    checked = None
    with store.translated(url):
        try:
            # one GET per file (fs.open would ask for the object's size first)
            fs.get_file(source, str(part))
        except FileNotFoundError:
            raise RemoteCorruptError(
                f"{url}/{rel} ({_what(rel, manifest)}) is missing, though {INDEX_FILE} lists it"
            ) from None
        except OSError as exc:  # the Hub client checks the size itself, before rlds can
            checked = store.hub_size_check(exc)
            if checked is None or checked[0] == entry.size:
                raise
    size = checked[0] if checked is not None else part.stat().st_size
    sha = "" if checked is not None else sha256_file(part)
    if progress is not None:
        progress("advance", size)
    if size != entry.size or sha != entry.sha256:
        part.unlink(missing_ok=True)
        found = f"{size} bytes" if size != entry.size else f"sha256 {sha}"
        raise RemoteCorruptError(
            f"{url}/{rel} ({_what(rel, manifest)}) differs from the file pushed: {found}, the push "
            f"recorded {entry.size} bytes, sha256 {entry.sha256} in its files "
            "index (the file or the index is damaged)"
        )
    os.replace(part, target)


def _check_build(build: Path, manifest_bytes: bytes, url: str, manifest: Manifest) -> None:
    """Write the manifest into the build, check every file's size and recompute the content
    digests; on a mismatch delete the manifest and the bad files (a re-run fetches them)."""
    from rlds_cli.cache import digest

    atomic_write(build / MANIFEST_FILE, manifest_bytes, unique=False)
    problems: list[tuple[str, str]] = []
    try:
        ds = open_published(build, manifest)
        problems += [("files", p) for p in ds.check_files()]
        if not problems:
            problems += [(p.key, p.message) for p in digest.check_digests(ds).problems]
        del ds
    except CorruptDatasetError as exc:
        problems.append(("files", exc.message))
    if not problems:
        return
    (build / MANIFEST_FILE).unlink(missing_ok=True)
    for key, _ in problems:
        _discard_key(build, key, manifest)
    key, message = problems[0]
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    raise RemoteCorruptError(f"{url}: content digest of {key}: {message}{more}")


def _discard_key(build: Path, key: str, manifest: Manifest) -> None:
    from rlds_cli.cache.backends.frames import frame_files
    from rlds_cli.cache.digest import column_path

    if key == "episodes":
        (build / EPISODES_FILE).unlink(missing_ok=True)
    elif key == "source_arrays":
        (build / SOURCE_ARRAYS_FILE).unlink(missing_ok=True)
    elif key in manifest.fields and manifest.fields[key].frame_format is not None:
        for path in frame_files(build, key):
            path.unlink(missing_ok=True)
    elif key in manifest.fields:
        path = column_path(build, manifest.backend, key)
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _what(rel: str, manifest: Manifest) -> str:
    """The key a dataset file holds, for messages (``arrays/info/qpos.npy`` -> ``key info/qpos``)."""
    if rel == EPISODES_FILE:
        return "the episode index"
    if rel == SOURCE_ARRAYS_FILE:
        return "the source's arrays"
    from rlds_cli.cache.backends.frames import ENDS_SUFFIX, FRAMES_SUFFIX

    inner = rel.removeprefix("arrays/")
    for key in sorted(manifest.fields, key=len, reverse=True):
        suffixes = (".npy", FRAMES_SUFFIX, ENDS_SUFFIX)  # a memmap array, a frame column's two files
        if any(inner == f"{key}{suffix}" for suffix in suffixes) or inner.startswith(f"{key}/"):
            return f"key {key}"
    return "zarr metadata" if rel.endswith("zarr.json") else "a dataset file"


def _renamed(manifest: Manifest, name: str) -> bytes:
    """The manifest under another name, as ``write_manifest`` writes it."""
    manifest.name = name
    return manifest_text(manifest).encode()


def _same_as_published(
    cache: CacheRoot, name: str, url: str, manifest_bytes: bytes, manifest: Manifest, index: RemoteIndex
) -> bool:
    """Whether the cache's ``name`` is the pushed version at ``url``: the same manifest and every
    pushed file at its size (files only this copy has, such as a reader's log checkpoint, do not
    count).

    Raises:
        CorruptDatasetError: The manifest is the pushed one, but a file of a dataset that is not
            growing (a growing one's manifest stays the same as it grows) is missing or resized.
    """
    directory = cache.dataset_dir(name)
    try:
        if (directory / MANIFEST_FILE).read_bytes() != manifest_bytes:
            return False
    except OSError:
        return False
    for rel, entry in index.files.items():
        try:
            size: int | None = (directory / rel).stat().st_size
        except OSError:
            size = None
        if size == entry.size:
            continue
        if manifest.layout == SEGMENTED_LAYOUT:
            return False
        found = "is missing" if size is None else f"holds {size:,} bytes"
        raise CorruptDatasetError(
            f"dataset {name!r} in the cache is the version at {url}, but its file {rel} {found} where "
            f"the push has {entry.size:,}: the cache's copy is damaged",
            hint="pass --force to pull it again (it replaces the cache's copy)",
        )
    return True
