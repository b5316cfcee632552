"""``rlds push``: a cached dataset copied to object storage (any fsspec URL), manifest last.

**Push** (``rlds push NAME URL``). Order of writes at the URL: every data file, then
``rlds-files.json`` (sizes and sha256 of the files, and the sha256 of the manifest they belong
to), then ``manifest.json``, the commit marker. A push killed at any point leaves no manifest of
the new version, so the URL never looks complete before it is. Replacing another version
(``force``) removes the old manifest (and index) first, so a reader sees the old version whole,
then no dataset, then the new one whole.

Resuming: a journal in the local cache (:mod:`rlds_cli.remote.journal`) records each uploaded
file's size and sha256, and what the store said of it then. A re-run skips a file only when the
store has it at that size, unchanged since, and the journal (or the committed remote index)
vouches for these bytes; every other file is uploaded again."""

from __future__ import annotations

import hashlib
import logging
import os
import posixpath
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util.progress import Progress
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.layout import (
    MANIFEST_FILE,
    SEGMENTED_LAYOUT,
)
from rlds_cli.cache.manifest import Manifest, manifest_json, parse_manifest
from rlds_cli.cache.opening import open_published
from rlds_cli.cache.root import CacheRoot, target_problem
from rlds_cli.errors import (
    CorruptDatasetError,
    DatasetReplacedError,
    NotPushableError,
    RemoteAccessError,
    RemoteCorruptError,
    RemoteExistsError,
)
from rlds_cli.remote import store
from rlds_cli.remote.journal import PushJournal, object_stamp, stamp_of
from rlds_cli.remote.store import BLOCK_BYTES, INDEX_FILE, FileEntry, RemoteIndex, TransferResult

logger = logging.getLogger(__name__)


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
        force: Replace another version already at ``url``; the same version has every file uploaded
            again (what mends files damaged on the store).
        storage_options: Keyword arguments of the fsspec filesystem (credentials...).
        endpoint_url: An S3-compatible server (else s3fs reads ``AWS_ENDPOINT_URL``).
        progress: Called with ``("start", total_bytes)`` then ``("advance", n)``.

    Raises:
        DatasetNotFoundError: No such dataset in the cache.
        NotPushableError: ``name`` is a view (it has no arrays of its own).
        CorruptDatasetError: A local file is missing or short, or a content digest differs: checked
            before anything is uploaded.
        RemoteExistsError: Another version is at ``url`` and ``force`` is false.
        RemoteAccessError: The store cannot be used (bucket, credentials, endpoint).
        DatasetReplacedError: The local dataset was rebuilt during the push (nothing committed).
    """
    from rlds_cli.catalog.registry import resolve_name

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
    _snapshot_of: Path | None = None,
) -> PushResult:
    """:func:`push` of a dataset folder (a published dataset, or a finished build such as a
    preprocessing job's output); the journal and lock live in ``cache``. Raises what :func:`push`
    raises."""
    from rlds_cli.cache.layout import COMPOSED_LAYOUT, SEGMENTED_LAYOUT, VIEW_LAYOUT

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
    if manifest.layout == SEGMENTED_LAYOUT and _snapshot_of is None:  # a growing dataset: as of one view
        from rlds_cli.cache.growing import GrowingDataset, snapshot_copy

        with snapshot_copy(GrowingDataset(directory), cache) as snapshot:
            return push_directory(
                snapshot, url, cache=cache, force=force, storage_options=storage_options,
                endpoint_url=endpoint_url, progress=progress, _snapshot_of=directory,
            )  # fmt: skip
    _verify_local(directory, manifest, _snapshot_of)
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
    if _is_local(fs):
        problem = target_problem(base, directory, name, cache.path)
        if problem is not None:
            raise RemoteAccessError(
                f"{url} {problem}: a push there would write over its files",
                hint="push to a folder of its own outside the cache, e.g. file:///data/rlds-store/NAME",
            )
    journal = PushJournal(cache, f"{endpoint_url or ''}|{fs.unstrip_protocol(base)}")
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
    journal: PushJournal,
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
        if committed != manifest_bytes and not force:
            raise RemoteExistsError(f"{url} holds {_describe(committed, name, url)}")
        result.replaced = committed != manifest_bytes
    known.update(journal.entries())
    # what pushes from this cache wrote or took over at url and did not commit (a push killed
    # after the old manifest's removal): rlds's own files, removed where this version lacks them
    journaled = set(journal.entries()) | journal.pending()
    stamps = journal.stamps()  # what the store said of each file this journal's push uploaded
    remote = store.list_files(fs, base, url)
    if committed is None and not force:
        store.refuse_foreign(
            url,
            _foreign_files(fs, base, url, remote, {*known, *journal.pending()}),
            "push",
            MANIFEST_FILE,
            hint="push to a folder of its own (the URL is the dataset's folder), or pass --force to write "
            "over them",
        )
    todo = []
    for rel, entry in sorted(local.items()):
        info = remote.get(rel)
        there = (
            not force
            and info is not None
            and int(info.get("size", -1)) == entry.size
            and known.get(rel) == entry
            and stamps.get(rel) in (None, object_stamp(info))  # not written since by another push
        )
        if there:
            result.skipped += 1
        else:
            todo.append(rel)
    if committed is not None and (force or committed != manifest_bytes or any(rel in remote for rel in todo)):
        # readers must never see the committed manifest over other files (a new version's, or
        # files written again: a growing dataset's log, a mended file): it goes first, so they see
        # the old version whole, then nothing, then the new one whole. The journal keeps what the
        # index said of the files left there: a push killed after this takes them up again
        if old_index is not None:  # only an index of the committed manifest says what is there
            journal.add_all({rel: old_index.files[rel] for rel in old_files if rel in remote})
        with store.translated(url):
            fs.rm_file(store.join(base, MANIFEST_FILE))
            if fs.exists(store.join(base, INDEX_FILE)):
                fs.rm_file(store.join(base, INDEX_FILE))
        committed = None
    if committed == manifest_bytes and not todo:
        if old_index is None or any(
            (e.blocks and not old_index.files[rel].blocks) or (e.crcs and not old_index.files[rel].crcs)
            for rel, e in local.items()
            if rel in old_index.files
        ):
            # an index without per-block digests or crc32c: rewrite the index alone (same
            # manifest), so a bounded remote cache can check each block it keeps, cheaply
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
        uploaded: dict[str, str | None] = {}  # this run's files, with the store's stamp of each
        looked = time.monotonic()
        for rel in todo:
            if time.monotonic() - looked > RACE_CHECK_SECONDS:  # another machine's push committed?
                _check_no_race(fs, base, url, committed, local, uploaded)
                looked = time.monotonic()
            journal.add_pending(rel)  # a kill mid-file leaves it ours, not another push's
            _upload_file(fs, directory / rel, store.join(base, rel), local[rel], progress)
            uploaded[rel] = stamp_of(fs, store.join(base, rel))
            journal.add(rel, local[rel], uploaded[rel])
            result.uploaded += 1
            result.bytes_uploaded += local[rel].size
        _check_no_race(fs, base, url, committed, local, uploaded)
        for rel in sorted((old_files | journaled) - set(local)):  # the replaced versions' files
            if fs.exists(store.join(base, rel)):
                fs.rm_file(store.join(base, rel))
        if not _unchanged(directory, manifest_bytes):
            raise DatasetReplacedError(
                f"dataset {name!r} was replaced or removed in the cache during the push; nothing was "
                f"committed at {url}",
                hint="run the push again: files already uploaded are kept when they did not change",
            )
        _check_no_race(fs, base, url, committed, local, uploaded)
        _put_bytes(fs, store.join(base, INDEX_FILE), index.to_json())
        _put_bytes(fs, store.join(base, MANIFEST_FILE), manifest_bytes)
        _check_committed(fs, base, url, manifest_bytes)
    journal.remove()
    return result


#: How often (seconds) a push looks, between its uploads, for a version another push committed.
RACE_CHECK_SECONDS = 1.0


def _check_no_race(
    fs: Any,
    base: str,
    url: str,
    committed: bytes | None,
    local: dict[str, FileEntry],
    uploaded: dict[str, str | None],
) -> None:
    """Stop a push when another push (another cache or machine: object stores have no lock)
    committed a version at ``url`` since this one began: before this push writes more, and
    never leaving that version read over this push's bytes.

    Raises:
        RemoteExistsError: Another version is committed. Where this push had written over files
            of it (its index names other bytes at a path whose object is still this push's, or
            the store gives no stamp to tell), its manifest and index are removed, so no mixed
            version is read, and the message says so.
    """
    now = store.read_bytes(fs, store.join(base, MANIFEST_FILE), url)
    if now == committed:
        return
    index = _read_index(fs, base, url)
    theirs = index.files if index is not None and now is not None else {}
    overwritten = sorted(
        rel
        for rel, stamp in uploaded.items()
        if (index is None or (rel in theirs and theirs[rel] != local[rel]))
        and (stamp is None or stamp_of(fs, store.join(base, rel)) == stamp)
    )
    if now is None or not overwritten:
        raise RemoteExistsError(
            f"another push committed a version at {url} during this one; nothing was committed",
            hint="push again once the other push is done (--force to replace its version)",
        )
    with store.translated(url):
        if store.read_bytes(fs, store.join(base, MANIFEST_FILE), url) == now:
            fs.rm_file(store.join(base, MANIFEST_FILE))
            if fs.exists(store.join(base, INDEX_FILE)):
                fs.rm_file(store.join(base, INDEX_FILE))
    shown = ", ".join(overwritten[:3]) + (f" (+{len(overwritten) - 3} more)" if len(overwritten) > 3 else "")
    raise RemoteExistsError(
        f"another push committed a version at {url} during this one, which had written over "
        f"{len(overwritten)} of its files ({shown}): that version's manifest was removed so that no "
        "mix of the two is read; the URL holds no version now",
        hint="push one of the two versions again (rlds push NAME URL --force)",
    )


def _foreign_files(
    fs: Any, base: str, url: str, remote: dict[str, dict[str, Any]], ours: set[str]
) -> list[str]:
    """The files at a URL without a manifest that no push wrote: not ``ours`` (this cache's journal:
    uploaded, or started by a push killed mid-file), nor in an index a killed push left there."""
    index = _read_index(fs, base, url)
    listed = index.files if index is not None else {}
    own = (INDEX_FILE, MANIFEST_FILE)
    return sorted(
        rel
        for rel in remote
        if rel not in own and rel not in ours and rel not in listed
        and not (rel.startswith(own) and rel.endswith(".part"))
    )  # fmt: skip


def _check_committed(fs: Any, base: str, url: str, manifest_bytes: bytes) -> None:
    """Read back the committed manifest and index (another machine's push may have written one)."""
    index = _read_index(fs, base, url)
    there = store.read_bytes(fs, store.join(base, MANIFEST_FILE), url)
    if (
        there != manifest_bytes
        or index is None
        or index.manifest_sha256 != store.manifest_sha256(manifest_bytes)
    ):
        raise RemoteExistsError(
            f"another push to {url} ran during this one: the URL does not hold this push's version",
            hint="run one push again once the other is done (--force to replace its version)",
        )


def _verify_local(directory: Path, manifest: Manifest, snapshot_of: Path | None) -> None:
    """Check the files and digests of the dataset at ``directory`` (a growing one's snapshot, named
    as ``snapshot_of``) before any upload: damaged bytes pushed with fresh sha256s would verify on
    the store. Raises ``CorruptDatasetError`` (the first problem named)."""
    from rlds_cli.cache.compose import verify_parent

    verify_parent(open_published(directory, manifest), shown_at=snapshot_of)


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
    """Every file of a published dataset but its manifest, with size and sha256 (and the
    blocks a bounded cache keeps: a frame file's cut where episodes begin)."""
    cuts = _episode_starts(directory)
    out: dict[str, FileEntry] = {}
    for path in sorted(directory.rglob("*")):
        if not path.is_file():
            continue
        rel = path.relative_to(directory).as_posix()
        if rel == MANIFEST_FILE:
            continue
        if not store.safe_relpath(rel):
            raise CorruptDatasetError(f"{path} is no file rlds writes in a dataset (a stray file?)")
        out[rel] = store.hash_file_blocks(path, store.INDEX_BLOCK_BYTES, cuts.get(rel))
    return out


def _episode_starts(directory: Path) -> dict[str, np.ndarray]:
    """The byte offset where each episode's frames begin in each frame file of the published
    dataset at ``directory`` (a growing one's: of each segment), by the file's path in it. A
    dataset these cannot be read from gets none: its files keep fixed blocks."""
    from rlds_cli.cache.backends.frames import frame_files
    from rlds_cli.cache.layout import SEGMENTS_DIR
    from rlds_cli.cache.reader import Episodes

    manifest = parse_manifest((directory / MANIFEST_FILE).read_bytes(), directory / MANIFEST_FILE)
    if manifest.layout == SEGMENTED_LAYOUT:
        segments = directory / SEGMENTS_DIR
        return {
            f"{SEGMENTS_DIR}/{segment.name}/{rel}": cuts
            for segment in sorted(segments.iterdir() if segments.is_dir() else ())
            if (segment / MANIFEST_FILE).is_file()
            for rel, cuts in _episode_starts(segment).items()
        }
    if not any(spec.frame_format is not None for spec in manifest.fields.values()):
        return {}
    try:
        ds = Dataset(directory)
        episodes = Episodes.of(ds)
        out = {}
        for key, spec in manifest.fields.items():
            if spec.frame_format is None:
                continue
            # an observation-like key's episode has its steps' rows and its last next one's
            flat = spec.storage == "flat"
            rows = episodes.flat_rows(episodes.starts) if flat else episodes.starts
            starts = np.asarray(ds.column(key).starts, np.int64)
            rel = frame_files(directory, key)[0].relative_to(directory).as_posix()
            out[rel] = starts[rows[rows < len(starts)]]
        return out
    except (CorruptDatasetError, OSError, ValueError, KeyError):
        return {}


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
    part = f"{target}.{uuid.uuid4().hex[:12]}.part"  # its own: another push's is never moved in
    fs.pipe_file(part, data)
    fs.mv(part, target)
