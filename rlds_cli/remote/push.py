"""``rlds push NAME URL``: copy a published dataset to object storage, manifest last.

Order of writes at the URL: every data file, then ``rlds-files.json`` (sizes and sha256 of
the files, and the sha256 of the manifest they belong to), then ``manifest.json``, the commit
marker. A push killed at any point leaves no manifest of the new version, so the URL never looks
complete before it is. Replacing another version (``force``) removes the old manifest (and
index) first, so a reader sees the old version whole, then no dataset, then the new one whole.

Resuming: a journal in the local cache (``tmp/.push-<id>.journal``, one per URL) records each
uploaded file's size and sha256. A re-run skips a file only when the store has it at that size and
the journal (or the committed remote index) vouches for these bytes; every other file is uploaded
again.
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlds_cli._util.locks import FileLock, Timeout
from rlds_cli._util.progress import Progress
from rlds_cli.cache.layout import MANIFEST_FILE
from rlds_cli.cache.manifest import manifest_json, parse_manifest
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import (
    CorruptDatasetError,
    DatasetReplacedError,
    LockTimeoutError,
    NotPushableError,
    RemoteCorruptError,
    RemoteExistsError,
)
from rlds_cli.remote import store
from rlds_cli.remote.store import BLOCK_BYTES, INDEX_FILE, FileEntry, RemoteIndex, TransferResult


@dataclass(kw_only=True)
class PushResult(TransferResult):
    """What :func:`push` did (the rest: :class:`~rlds_cli.remote.store.TransferResult`).

    Attributes:
        uploaded: Files uploaded by this run.
        bytes_uploaded: Bytes uploaded by this run.
    """

    uploaded: int = 0
    bytes_uploaded: int = 0


def push(
    name: str,
    url: str,
    *,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    force: bool = False,
    storage_options: dict[str, Any] | None = None,
    endpoint_url: str | None = None,
    progress: Progress | None = None,
) -> PushResult:
    """Copy the published dataset ``name`` to ``url`` (its own folder on the store).

    Args:
        name: A dataset in the cache (or a registry alias of one).
        url: Any fsspec URL: ``s3://bucket/prefix/NAME``, ``gcs://...``, ``file:///dir/NAME``, or a
            Hub dataset repo ``hf://datasets/ORG/REPO[/PATH][@BRANCH]`` (one commit, see
            :mod:`rlds_cli.remote.hub_push`; the token from ``HF_TOKEN`` or the client's token file).
        root: Cache root.
        force: Replace another version already at ``url``.
        storage_options: Keyword arguments of the fsspec filesystem (credentials...).
        endpoint_url: An S3-compatible server (else s3fs reads ``AWS_ENDPOINT_URL``).
        progress: Called with ``("start", total_bytes)`` then ``("advance", n)``.

    Raises:
        DatasetNotFoundError: No such dataset in the cache.
        NotPushableError: ``name`` is a view (it has no arrays of its own).
        RemoteExistsError: Another version is at ``url`` and ``force`` is false.
        RemoteAccessError: The store cannot be used (bucket, credentials, endpoint).
        DatasetReplacedError: The local dataset was rebuilt during the push (nothing committed).
    """
    from rlds_cli.catalog.names import resolve_name

    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    name = resolve_name(name, cache)
    return push_directory(
        cache.dataset_dir(name), url, cache=cache, force=force, storage_options=storage_options,
        endpoint_url=endpoint_url, progress=progress,
    )  # fmt: skip


def push_directory(
    directory: Path,
    url: str,
    *,
    cache: CacheRoot,
    force: bool = False,
    storage_options: dict[str, Any] | None = None,
    endpoint_url: str | None = None,
    progress: Progress | None = None,
    _snapshot: bool = False,
) -> PushResult:
    """:func:`push` of a dataset folder (a published dataset, or a finished build such as a
    preprocessing job's output); the journal and lock live in ``cache``. Raises what :func:`push`
    raises."""
    from rlds_cli.cache.composed import COMPOSED_LAYOUT
    from rlds_cli.cache.layout import SEGMENTED_LAYOUT, VIEW_LAYOUT

    started = time.monotonic()
    manifest_bytes = (directory / MANIFEST_FILE).read_bytes()
    manifest = parse_manifest(manifest_bytes, directory / MANIFEST_FILE)
    name = manifest.name
    if manifest.layout == VIEW_LAYOUT:
        parent = manifest.source.get("parent", "?")
        raise NotPushableError(
            f"dataset {name!r} is a view of {parent!r}: it holds no arrays of its own to push",
            hint=f"push its parent ('rlds push {parent} URL') and make the view again after pulling it, "
            f"or copy it into a dataset of its own first ('rlds export {name} DIR --to torchrl', then "
            f"'rlds download DIR --name NEW')",
        )
    if manifest.layout == COMPOSED_LAYOUT:
        parents = ", ".join(dict.fromkeys(str(p.get("name")) for p in manifest.lineage))
        raise NotPushableError(
            f"dataset {name!r} is made of the arrays of {parents} (rlds merge, trim or drop): it holds no "
            "arrays of its own to push",
            hint=f"copy it into a dataset of its own first ('rlds export {name} DIR --to torchrl', then "
            f"'rlds download DIR --name NEW'), or push its parents and make it again after pulling them",
        )
    if manifest.layout == SEGMENTED_LAYOUT and not _snapshot:  # a growing dataset: as of one view
        from rlds_cli.cache.growing import GrowingDataset
        from rlds_cli.cache.snapshot import snapshot_copy

        with snapshot_copy(GrowingDataset(directory), cache) as snapshot:
            return push_directory(
                snapshot, url, cache=cache, force=force, storage_options=storage_options,
                endpoint_url=endpoint_url, progress=progress, _snapshot=True,
            )  # fmt: skip
    local = _local_files(directory)
    if url.startswith("hf://"):  # a Hub dataset repo: one commit, not files then a manifest
        from rlds_cli.remote.hub_push import push_hub

        counts = push_hub(
            directory, url, name=name, manifest_bytes=manifest_bytes, local=local, force=force,
            progress=progress,
        )  # fmt: skip
        total = sum(e.size for e in local.values())
        result = PushResult(name, url, manifest.backend, len(local), bytes_total=total, **counts)
        return result.timed(started)
    fs, base = store.open_url(url, storage_options, endpoint_url)
    journal = _Journal(cache, f"{endpoint_url or ''}|{fs.unstrip_protocol(base)}")
    with journal.locked(url):
        result = _push(
            fs, base, url, name, manifest.backend, directory, manifest_bytes, local, journal, force, progress
        )
    return result.timed(started)


def _push(
    fs: Any,
    base: str,
    url: str,
    name: str,
    backend: str,
    directory: Path,
    manifest_bytes: bytes,
    local: dict[str, FileEntry],
    journal: _Journal,
    force: bool,
    progress: Progress | None,
) -> PushResult:
    total = sum(e.size for e in local.values())
    index = RemoteIndex(store.manifest_sha256(manifest_bytes), local, store.INDEX_BLOCK_BYTES)
    result = PushResult(name, url, backend, len(local), bytes_total=total)
    committed = store.read_bytes(fs, store.join(base, MANIFEST_FILE), url)
    known: dict[str, FileEntry] = {}  # remote files whose bytes are known (committed index)
    old_files: set[str] = set()
    old_index: RemoteIndex | None = None
    if committed is not None:
        old_index = _read_index(fs, base, url)
        if old_index is not None and old_index.manifest_sha256 == store.manifest_sha256(committed):
            known = dict(old_index.files)
            old_files = set(old_index.files)
        if committed != manifest_bytes:
            if not force:
                raise RemoteExistsError(f"{url} holds {_describe(committed, name, url)}")
            # readers must never see the old manifest over new files: it goes first
            with store.translated(url):
                fs.rm_file(store.join(base, MANIFEST_FILE))
                if fs.exists(store.join(base, INDEX_FILE)):
                    fs.rm_file(store.join(base, INDEX_FILE))
            result.replaced = True
    known.update(journal.entries())
    remote = store.list_files(fs, base, url)
    todo = []
    for rel, entry in sorted(local.items()):
        info = remote.get(rel)
        there = info is not None and int(info.get("size", -1)) == entry.size and known.get(rel) == entry
        if there:
            result.skipped += 1
        else:
            todo.append(rel)
    if committed == manifest_bytes and not todo:
        if old_index is None or any(
            e.blocks and not old_index.files[rel].blocks for rel, e in local.items() if rel in old_index.files
        ):
            # an index without per-block digests: rewrite the index alone (same manifest), so a
            # bounded remote cache can check each block it keeps
            with store.translated(url):
                _put_bytes(fs, store.join(base, INDEX_FILE), index.to_json())
        result.up_to_date = True
        journal.remove()
        return result
    if progress is not None:
        progress("start", sum(local[rel].size for rel in todo))
    with store.translated(url):
        # object stores have no directories; local and NFS targets do (never makedirs on a
        # bucket: s3fs would create a missing bucket instead of saying it is missing)
        if _is_local(fs):
            for folder in sorted({posixpath.dirname(store.join(base, rel)) for rel in local}):
                fs.makedirs(folder, exist_ok=True)
        for rel in todo:
            _upload_file(fs, directory / rel, store.join(base, rel), local[rel], progress)
            journal.add(rel, local[rel])
            result.uploaded += 1
            result.bytes_uploaded += local[rel].size
        for rel in sorted(old_files - set(local)):  # files of the replaced version only
            if fs.exists(store.join(base, rel)):
                fs.rm_file(store.join(base, rel))
        if not _unchanged(directory, manifest_bytes):
            raise DatasetReplacedError(
                f"dataset {name!r} was replaced or removed in the cache during the push; nothing was "
                f"committed at {url}",
                hint="run the push again: files already uploaded are kept when they did not change",
            )
        _put_bytes(fs, store.join(base, INDEX_FILE), index.to_json())
        _put_bytes(fs, store.join(base, MANIFEST_FILE), manifest_bytes)
    journal.remove()
    return result


def _unchanged(directory: Path, manifest_bytes: bytes) -> bool:
    """Whether the local dataset is still the version whose files were uploaded (a rebuild
    writes a new manifest: its creation time and digests differ)."""
    try:
        return (directory / MANIFEST_FILE).read_bytes() == manifest_bytes
    except OSError:
        return False


def _describe(manifest_bytes: bytes, pushing: str, url: str) -> str:
    """What ``url`` holds, against the dataset being pushed there (``pushing``: its name)."""
    try:  # any version of manifest, even one this rlds cannot read, names its dataset
        m = manifest_json(manifest_bytes, f"{url}/{MANIFEST_FILE}")
    except CorruptDatasetError:
        return "a dataset (its manifest is unreadable)"
    what = "another version of dataset" if m.get("name") == pushing else "another dataset,"
    return f"{what} {m.get('name')!r} (created {m.get('created_at')})"


def _read_index(fs: Any, base: str, url: str) -> RemoteIndex | None:
    data = store.read_bytes(fs, store.join(base, INDEX_FILE), url)
    if data is None:
        return None
    try:
        return RemoteIndex.from_json(data, f"{url}/{INDEX_FILE}")
    except RemoteCorruptError:
        return None  # an unreadable old index only means its files are uploaded again


def _local_files(directory: Path) -> dict[str, FileEntry]:
    """Every file of a published dataset but its manifest, with size and sha256."""
    out: dict[str, FileEntry] = {}
    for path in sorted(directory.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(directory).as_posix()
        if rel == MANIFEST_FILE:
            continue
        if not store.safe_relpath(rel):
            raise CorruptDatasetError(f"{path} is no file rlds writes in a dataset (a stray file?)")
        out[rel] = store.hash_file_blocks(path, store.INDEX_BLOCK_BYTES)
    return out


def _is_local(fs: Any) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
    return bool({"file", "local"} & set(protocols))


def _upload_file(fs: Any, source: Path, target: str, entry: FileEntry, progress: Progress | None) -> None:
    """Stream one file to the store, hashing the bytes as sent (read once); a digest other than
    the index's (a file rebuilt during the push) raises :class:`DatasetReplacedError`."""
    digest = hashlib.sha256()
    try:
        src = open(source, "rb")  # noqa: SIM115 - closed by the 'with' below
    except FileNotFoundError:
        raise DatasetReplacedError(
            f"{source} disappeared during the push (the dataset was rebuilt or removed); nothing "
            "was committed",
            hint="run the push again once the dataset is no longer being rebuilt",
        ) from None
    with src, fs.open(target, "wb") as dst:
        while block := src.read(BLOCK_BYTES):
            digest.update(block)
            dst.write(block)
            if progress is not None:
                progress("advance", len(block))
    if digest.hexdigest() != entry.sha256:
        raise DatasetReplacedError(
            f"{source} changed during the push; nothing was committed",
            hint="run the push again once the dataset is no longer being rebuilt",
        )


def _put_bytes(fs: Any, target: str, data: bytes) -> None:
    """Write a small file whole or not at all: to a temporary name, then moved into place (a
    rename on a filesystem, a server-side copy on an object store)."""
    part = f"{target}.part"
    fs.pipe_file(part, data)
    fs.mv(part, target)


class _Journal:
    """The files a push to one URL has uploaded, kept in the local cache between runs."""

    def __init__(self, cache: CacheRoot, key: str) -> None:
        ident = hashlib.sha256(key.encode()).hexdigest()[:16]
        self.cache = cache
        self.path = cache.layout.push_journal(ident)
        self.lock_path = cache.layout.lock_file(f".push-{ident}")

    @contextmanager
    def locked(self, url: str) -> Iterator[None]:
        """Hold the lock of this URL: two pushes to one URL would interleave their files."""
        lock = FileLock(self.lock_path, timeout=0)
        try:
            lock.acquire()
        except Timeout:
            raise LockTimeoutError(f"another rlds push to {url} is running") from None
        try:
            yield
        finally:
            lock.release()

    def entries(self) -> dict[str, FileEntry]:
        out: dict[str, FileEntry] = {}
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except FileNotFoundError:
            return out
        for line in lines:
            try:  # a line torn by a kill is skipped: its file is uploaded again
                rec = json.loads(line)
                out[str(rec["rel"])] = FileEntry(int(rec["size"]), str(rec["sha256"]))
            except (ValueError, KeyError, TypeError):
                continue
        return out

    def add(self, rel: str, entry: FileEntry) -> None:
        self.cache.tmp_dir.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"rel": rel, "size": entry.size, "sha256": entry.sha256})
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
