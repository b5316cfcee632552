"""Reading a pushed zarr dataset where it lies: ``open_dataset("s3://bucket/prefix/NAME")``.

A :class:`RemoteDataset` is a :class:`~rlds_cli.cache.dataset.Dataset` whose arrays are read
from the store through the same chunk reader as a cached zarr dataset
(:class:`~rlds_cli.cache.zarr_chunks._ChunkReader`): a read fetches the index of each shard it
needs once (kept in memory), then the byte ranges of exactly the chunks it needs, adjacent ranges
merged and all of them requested together (concurrently on an async store such as s3fs), and
decodes them with Blosc on threads. What is read is what was pushed: the manifest, the files
index (``rlds-files.json``) and every small file (episode index, zarr metadata) are checked
against the index's sizes and sha256 when opened.

A local file cache (``cache=DIR``, or ``$RLDS_REMOTE_CACHE``) keeps whole files instead: each
shard a read needs is downloaded once, checked against its sha256, and memory-mapped from then
on, so a second epoch reads nothing from the store and runs at the speed of a cached dataset.
Its folder for one pushed version is ``DIR/<url-hash>-<manifest-hash>``: another push to the
URL gets another folder, never a mix. Delete the folder to reclaim the space.

Replacement: ``rlds push --force`` removes the old manifest before it writes a file, so a read
is known to be of the version opened when the manifest is still the same after it: the dataset
reads the manifest again after every read that fetched something from the store (one small
request), and raises :class:`~rlds_cli.errors.DatasetReplacedError` when it changed or is gone.
Reads served from the file cache need no such check (the files were checked by sha256).

Only zarr datasets can be read remotely: a memmap dataset is refused with a line that says to
``rlds pull`` it (its arrays are raw files meant to be memory-mapped).
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import re
import shutil
import tempfile
import threading
import uuid
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli import settings
from rlds_cli._io import atomic_write, sha256_file
from rlds_cli.cache.backends import Backend, ColumnWriter, RegionWriter, check_zarr_grid
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.layout import ARRAYS_DIR, EPISODES_FILE, MANIFEST_FILE, SOURCE_ARRAYS_FILE, VIEW_LAYOUT
from rlds_cli.cache.zarr_chunks import _ChunkReader
from rlds_cli.cache.zarr_read import ZarrColumn
from rlds_cli.cache.zarr_source import ALL_CHUNKS_ATTR, MissingChunkError
from rlds_cli.errors import (
    CorruptDatasetError,
    DatasetReplacedError,
    InvalidKeyError,
    RemoteError,
)
from rlds_cli.remote import store
from rlds_cli.remote.store import INDEX_FILE, RemoteIndex

#: Two byte ranges of one file closer than this are fetched as one request (the bytes between
#: them cost less than another round trip to an object store).
MERGE_GAP = 256 * 1024
#: Largest merged request.
MERGE_MAX = 32 * 1024 * 1024
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class RemoteNotReadableError(RemoteError, ValueError):
    """A dataset at a URL that cannot be read where it lies (a memmap dataset, a view)."""

    default_hint = "pull it into the cache first: rlds pull URL"


def is_url(name: str | os.PathLike[str]) -> bool:
    """Whether ``name`` is a URL (``s3://...``, ``file:///...``, ``memory://...``), not a name."""
    return isinstance(name, str) and bool(_URL.match(name))


def open_remote(
    url: str,
    *,
    cache: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    endpoint_url: str | None = None,
) -> RemoteDataset:
    """Open the zarr dataset pushed to ``url``, read-only (see :class:`RemoteDataset`)."""
    return RemoteDataset(url, cache=cache, storage_options=storage_options, endpoint_url=endpoint_url)


class RemoteFiles:
    """The files of one pushed version at a URL: sizes and sha256 from its index, ranged reads,
    and the optional local file cache.

    Args:
        url: The dataset's URL.
        index: Its files index.
        manifest_bytes: The manifest it belongs to.
        cache_dir: This version's folder in the file cache (``None``: no cache).
        storage_options: Keyword arguments of the fsspec filesystem.
        endpoint_url: An S3-compatible server.
    """

    def __init__(
        self,
        url: str,
        index: RemoteIndex,
        manifest_bytes: bytes,
        cache_dir: Path | None,
        storage_options: dict[str, Any] | None,
        endpoint_url: str | None,
    ) -> None:
        self.url = url
        self.index = index
        self.manifest_bytes = manifest_bytes
        self.cache_dir = cache_dir
        self._options = storage_options
        self._endpoint = endpoint_url
        self._fs, self.base = store.open_url(url, storage_options, endpoint_url)
        self._pid = os.getpid()
        self._lock = threading.Lock()
        #: Requests made to the store (a read that made any is checked against replacement).
        self.requests = 0
        #: Bytes fetched from the store.
        self.bytes_fetched = 0

    @property
    def fs(self) -> Any:
        """The filesystem, opened again in a forked process (fsspec's async ones are not
        fork-safe: a DataLoader worker would inherit a dead event loop)."""
        if self._pid != os.getpid():
            self._fs, self.base = store.open_url(self.url, self._options, self._endpoint)
            self._pid = os.getpid()
            self._lock = threading.Lock()
        return self._fs

    def where(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def _count(self, requests: int, nbytes: int) -> None:
        with self._lock:
            self.requests += requests
            self.bytes_fetched += nbytes

    def size(self, rel: str) -> int | None:
        entry = self.index.files.get(rel)
        return entry.size if entry is not None else None

    # ------------------------------------------------------------------ ranged reads

    def read_ranges(self, rels: Sequence[str], starts: Sequence[int], ends: Sequence[int]) -> list[bytes]:
        """Bytes ``[start, end)`` of each file, one batch of requests: ranges of one file that are
        near each other are merged into one request first.

        Raises:
            CorruptDatasetError: A file the index lists is gone, or shorter than pushed.
            RemoteAccessError: The store cannot be reached (names the URL).
        """
        order = sorted(range(len(rels)), key=lambda k: (rels[k], starts[k]))
        groups: list[tuple[str, int, int, list[int]]] = []  # rel, start, end, members
        for k in order:
            rel, start, end = rels[k], int(starts[k]), int(ends[k])
            if groups:
                g_rel, g_start, g_end, members = groups[-1]
                if g_rel == rel and start <= g_end + MERGE_GAP and max(end, g_end) - g_start <= MERGE_MAX:
                    groups[-1] = (g_rel, g_start, max(end, g_end), [*members, k])
                    continue
            groups.append((rel, start, end, [k]))
        fs = self.fs
        paths = [store.join(self.base, g[0]) for g in groups]
        with store.translated(self.url):
            blobs = fs.cat_ranges(paths, [g[1] for g in groups], [g[2] for g in groups], on_error="return")
        out: list[bytes] = [b""] * len(rels)
        total = 0
        for (rel, g_start, g_end, members), blob in zip(groups, blobs, strict=True):
            if isinstance(blob, FileNotFoundError):
                raise CorruptDatasetError(f"{self.where(rel)} is missing, though {INDEX_FILE} lists it")
            if isinstance(blob, BaseException):
                with store.translated(self.url):
                    raise blob
            if len(blob) != g_end - g_start:
                raise CorruptDatasetError(
                    f"{self.where(rel)} is shorter than the file pushed (bytes {g_start}-{g_end} asked, "
                    f"{len(blob)} read)"
                )
            total += len(blob)
            view = memoryview(blob)
            for k in members:
                out[k] = bytes(view[int(starts[k]) - g_start : int(ends[k]) - g_start])
        self._count(len(groups), total)
        return out

    def read_file(self, rel: str) -> bytes | None:
        """A whole (small) file, checked against its size and sha256 in the index; ``None`` when
        the index does not list it. With a file cache, kept there too."""
        entry = self.index.files.get(rel)
        if entry is None:
            return None
        if self.cache_dir is not None:
            path = self.local_file(rel)
            return path.read_bytes() if path is not None else None
        with store.translated(self.url):
            try:
                data = bytes(self.fs.cat_file(store.join(self.base, rel)))
            except FileNotFoundError:
                raise CorruptDatasetError(
                    f"{self.where(rel)} is missing, though {INDEX_FILE} lists it"
                ) from None
        self._count(1, len(data))
        self._verify(rel, len(data), hashlib.sha256(data).hexdigest())
        return data

    def _verify(self, rel: str, size: int, sha: str) -> None:
        entry = self.index.files[rel]
        if size != entry.size or sha != entry.sha256:
            found = f"{size} bytes" if size != entry.size else f"sha256 {sha[:16]}..."
            raise CorruptDatasetError(
                f"{self.where(rel)} differs from the file pushed: {found}, the push recorded "
                f"{entry.size} bytes, sha256 {entry.sha256[:16]}..."
            )

    # ------------------------------------------------------------------ the file cache

    def local_file(self, rel: str) -> Path | None:
        """The file's checked copy in the file cache, downloaded first if need be; ``None`` when
        the index does not list it."""
        assert self.cache_dir is not None
        if rel not in self.index.files:
            return None
        path = self.cache_dir / rel
        if not path.is_file():
            self.prepare([rel])
        return path

    def prepare(self, rels: Sequence[str]) -> None:
        """Download every file of ``rels`` the cache lacks, together (concurrently on an async
        store), each checked against its size and sha256, then renamed into place (a copy under
        its own name is always a complete, checked one)."""
        assert self.cache_dir is not None
        todo = [
            r for r in dict.fromkeys(rels) if r in self.index.files and not (self.cache_dir / r).is_file()
        ]
        if not todo:
            return
        tag = f"{os.getpid()}.{uuid.uuid4().hex[:8]}"
        parts = [self.cache_dir / f"{rel}.{tag}.part" for rel in todo]
        for part in parts:
            part.parent.mkdir(parents=True, exist_ok=True)
        try:
            with store.translated(self.url):
                try:
                    self.fs.get([store.join(self.base, r) for r in todo], [str(p) for p in parts])
                except FileNotFoundError as exc:
                    gone = next((r for r in todo if r in str(exc)), todo[0])
                    raise CorruptDatasetError(
                        f"{self.where(gone)} is missing, though {INDEX_FILE} lists it"
                    ) from None
            total = 0
            for rel, part in zip(todo, parts, strict=True):
                size = part.stat().st_size
                self._verify(rel, size, sha256_file(part))
                total += size
                os.replace(part, self.cache_dir / rel)
            self._count(len(todo), total)
        finally:
            for part in parts:
                part.unlink(missing_ok=True)

    def map(self, rel: str) -> memoryview | None:
        """The cached copy of ``rel``, memory-mapped (downloaded first if need be)."""
        path = self.local_file(rel)
        if path is None:
            return None
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                return memoryview(b"")
            return memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ))

    # ------------------------------------------------------------------ replacement

    def manifest_now(self) -> bytes | None:
        """The manifest at the URL now (``None``: gone, a push ``--force`` under way)."""
        data = store.read_bytes(self.fs, store.join(self.base, MANIFEST_FILE), self.url)
        self._count(1, len(data or b""))
        return data


class RemoteArrayFiles:
    """The files of one array of a remote dataset, as a
    :class:`~rlds_cli.cache.zarr_source.ByteSource` for the chunk reader."""

    remote = True

    def __init__(self, files: RemoteFiles, prefix: str) -> None:
        self.files = files
        self.prefix = prefix
        self.whole_files = files.cache_dir is not None

    def _rel(self, rel: str) -> str:
        return f"{self.prefix}/{rel}"

    def describe(self, rel: str) -> str:
        return self.files.where(self._rel(rel))

    def map(self, rel: str) -> memoryview | None:
        return self.files.map(self._rel(rel))

    def prepare(self, rels: Sequence[str]) -> None:
        self.files.prepare([self._rel(r) for r in rels])

    def size(self, rel: str) -> int | None:
        return self.files.size(self._rel(rel))

    def read_ranges(self, rels: Sequence[str], starts: Sequence[int], ends: Sequence[int]) -> list[bytes]:
        return self.files.read_ranges([self._rel(r) for r in rels], starts, ends)


def _metadata_store(files: RemoteFiles, prefix: str, meta: bytes, strict: bool) -> Any:
    """A read-only zarr store of one remote array: its checked ``zarr.json`` in memory, chunks
    by ranged reads (what zarr itself reads, for a layout the chunk reader does not know)."""
    from zarr.abc.store import OffsetByteRequest, RangeByteRequest, SuffixByteRequest
    from zarr.core.buffer import default_buffer_prototype
    from zarr.storage import MemoryStore

    class RemoteArrayStore(MemoryStore):
        async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
            if key == "zarr.json":
                return await super().get(key, prototype, byte_range)
            rel = f"{prefix}/{key}"
            size = files.size(rel)
            if size is None:
                if strict and "/c/" in f"/{key}":
                    raise MissingChunkError(f"zarr chunk {files.where(rel)} is missing")
                return None
            start, end = 0, size
            if isinstance(byte_range, RangeByteRequest):
                start, end = byte_range.start, min(byte_range.end, size)
            elif isinstance(byte_range, OffsetByteRequest):
                start = byte_range.offset
            elif isinstance(byte_range, SuffixByteRequest):
                start = max(0, size - byte_range.suffix)
            data = files.read_ranges([rel], [start], [end])[0]
            return (prototype or default_buffer_prototype()).buffer.from_bytes(data)

    proto = default_buffer_prototype()
    return RemoteArrayStore({"zarr.json": proto.buffer.from_bytes(meta)}, read_only=True)


class _CheckedColumn(ZarrColumn):
    """A remote zarr column whose whole-array reads (``np.asarray(column)``, what ``in_memory``
    loading does) are checked against replacement like every dataset read."""

    def __init__(self, array: Any, where: str, reader: _ChunkReader | None, check: Any) -> None:
        super().__init__(array, where, reader)
        self._check = check

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        data = super().__array__(dtype, copy)
        self._check()
        return data


class RemoteZarrBackend(Backend):
    """The zarr backend of one remote dataset: columns read through :class:`RemoteFiles`."""

    name = "zarr"
    stable_once_open = False

    def __init__(self, files: RemoteFiles, check: Any) -> None:
        self.files = files
        self._check = check

    def create_column(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...]
    ) -> ColumnWriter:
        raise self._read_only()

    def preallocate(
        self, dataset_dir: Path, key: str, dtype: np.dtype, row_shape: tuple[int, ...], rows: int
    ) -> None:
        raise self._read_only()

    def open_region(self, dataset_dir: Path, key: str, start: int, stop: int) -> RegionWriter:
        raise self._read_only()

    def _read_only(self) -> RemoteNotReadableError:
        return RemoteNotReadableError(
            f"{self.files.url} is read-only: rlds writes datasets into the cache, then pushes them",
            hint="build it locally, then rlds push NAME URL",
        )

    def open_column(self, dataset_dir: Path, key: str) -> ZarrColumn:
        import zarr

        from rlds_cli.formats.keys import key_problem

        problem = key_problem(key)
        if problem is not None:
            raise InvalidKeyError(f"array key {key!r} of {self.files.url} cannot be a file name: {problem}")
        prefix = f"{ARRAYS_DIR}/{key}"
        meta = self.files.read_file(f"{prefix}/zarr.json")
        if meta is None:
            raise CorruptDatasetError(f"zarr array {key!r} is missing under {self.files.where(ARRAYS_DIR)}")
        try:
            strict = bool(json.loads(meta).get("attributes", {}).get(ALL_CHUNKS_ATTR))
            array = zarr.open_array(
                store=_metadata_store(self.files, prefix, meta, strict), mode="r", zarr_format=3
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CorruptDatasetError(
                f"zarr metadata {self.files.where(prefix + '/zarr.json')} is unreadable: {exc}"
            ) from None
        reader = _ChunkReader.of(array, RemoteArrayFiles(self.files, prefix), strict=strict)
        return _CheckedColumn(array, self.files.where(prefix), reader, self._check)

    def check_column(self, dataset_dir: Path, key: str, rows: int, row_shape: tuple[int, ...]) -> str | None:
        """The column's shape, and every chunk (or shard) file of its grid in the pushed index
        (whether each one is at the URL is checked by :meth:`RemoteDataset.check_files`)."""
        try:
            array = self.open_column(dataset_dir, key)._array
        except CorruptDatasetError as exc:
            return exc.message

        def missing(index: tuple[int, ...]) -> str | None:
            rel = "/".join([ARRAYS_DIR, key, "c", *(str(i) for i in index)])
            if rel in self.files.index.files:
                return None
            return f"zarr chunk {self.files.where(rel)} is missing (not in {INDEX_FILE})"

        return check_zarr_grid(array, key, rows, row_shape, missing)


class RemoteDataset(Dataset):
    """A zarr dataset read where it was pushed (``s3://``, ``gs://``, ``file://``, ...).

    Everything a cached :class:`~rlds_cli.cache.dataset.Dataset` does, read-only: ``gather``,
    ``episode``, ``column``, ``check_files``, the content digests, the Loader (with
    ``in_memory=True`` the needed columns are fetched once, whole shards at a time). Its
    ``directory`` is a local folder with the checked small files (manifest, episode index); the
    arrays stay remote.

    Args:
        url: The dataset's folder on the store (what ``rlds push`` was given).
        cache: A folder for the file cache (default ``$RLDS_REMOTE_CACHE``; none: ranged reads).
        storage_options: Keyword arguments of the fsspec filesystem (credentials...).
        endpoint_url: An S3-compatible server (else s3fs reads ``AWS_ENDPOINT_URL``).

    Raises:
        RemoteNotReadableError: A memmap dataset (or a view): pull it instead.
        RemoteDatasetNotFoundError: No manifest at ``url``.
        RemoteCorruptError: The index is missing, or of another push.
        RemoteAccessError: The store cannot be used.
    """

    def __init__(
        self,
        url: str,
        *,
        cache: str | os.PathLike[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        endpoint_url: str | None = None,
    ) -> None:
        url = url.rstrip("/")
        fs, base = store.open_url(url, storage_options, endpoint_url)
        manifest_bytes, manifest, index = store.read_version(fs, base, url, then="open it")
        if manifest.backend != "zarr" or manifest.layout == VIEW_LAYOUT:
            what = "a view" if manifest.layout == VIEW_LAYOUT else f"a {manifest.backend} dataset"
            raise RemoteNotReadableError(
                f"{url} is {what}: only zarr datasets are read where they lie",
                hint=f"pull it into the cache first: rlds pull {url}",
            )
        self.url = url
        self._options = storage_options
        self._endpoint = endpoint_url
        self._cache_root = cache if cache is not None else settings.remote_cache()
        sha = store.manifest_sha256(manifest_bytes)
        mirror = self._mirror(fs, base, sha)
        self._files = RemoteFiles(url, index, manifest_bytes, mirror if self._cache_root else None,
                                  storage_options, endpoint_url)  # fmt: skip
        for rel in (EPISODES_FILE, SOURCE_ARRAYS_FILE):
            if rel in index.files and not (mirror / rel).is_file():
                data = self._files.read_file(rel)
                if data is not None and self._cache_root is None:
                    _write_atomic(mirror / rel, data)
        _write_atomic(mirror / MANIFEST_FILE, manifest_bytes)
        self._checked = self._files.requests  # the index pins these files to the manifest read
        super().__init__(mirror, manifest)
        self._backend = RemoteZarrBackend(self._files, self._check_not_replaced)

    def _mirror(self, fs: Any, base: str, manifest_sha: str) -> Path:
        """The local folder of this version's small files: in the file cache, else temporary
        (removed with the dataset)."""
        if self._cache_root:
            ident = hashlib.sha256(fs.unstrip_protocol(base).encode()).hexdigest()[:16]
            folder = Path(self._cache_root).expanduser() / f"{ident}-{manifest_sha[:16]}"
            folder.mkdir(parents=True, exist_ok=True)
            return folder
        folder = Path(tempfile.mkdtemp(prefix="rlds-remote-"))
        weakref.finalize(self, shutil.rmtree, folder, True)
        return folder

    # ------------------------------------------------------------------ pickling (workers)

    def __getstate__(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "cache": str(self._cache_root) if self._cache_root else None,
            "storage_options": self._options,
            "endpoint_url": self._endpoint,
            "manifest_sha256": self._files.index.manifest_sha256,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        RemoteDataset.__init__(
            self,
            state["url"],
            cache=state["cache"],
            storage_options=state["storage_options"],
            endpoint_url=state["endpoint_url"],
        )
        if self._files.index.manifest_sha256 != state["manifest_sha256"]:
            raise DatasetReplacedError(
                f"dataset {self.name!r} at {self.url} was replaced after it was opened"
            )

    # ------------------------------------------------------------------ replacement

    def _check_not_replaced(self) -> None:
        """After a read that asked the store for anything: the manifest is still the one
        opened (``push --force`` removes it before any file changes)."""
        files = getattr(self, "_files", None)
        if files is None or files.requests == self._checked:
            return
        now = files.manifest_now()
        self._checked = files.requests
        if now != files.manifest_bytes:
            raise DatasetReplacedError(
                f"dataset {self.name!r} at {self.url} was replaced (or removed) while it was open",
                hint="a push --force replaced it; open it again",
            )

    # ------------------------------------------------------------------ facts

    def __repr__(self) -> str:
        return f"RemoteDataset(url={self.url!r}, steps={self.num_steps}, episodes={self.num_episodes})"

    @property
    def requests(self) -> int:
        """Requests made to the store so far (reads, checks)."""
        return self._files.requests

    @property
    def bytes_fetched(self) -> int:
        """Bytes fetched from the store so far."""
        return self._files.bytes_fetched

    def size_bytes(self) -> int:
        """Bytes of the dataset's files on the store."""
        return sum(e.size for e in self._files.index.files.values()) + len(self._files.manifest_bytes)

    def stored_key_bytes(self, key: str) -> int:
        """Bytes the array ``key`` uses on the store."""
        prefix = f"{ARRAYS_DIR}/{key}/"
        return sum(e.size for rel, e in self._files.index.files.items() if rel.startswith(prefix))

    def fix_summary(self, info: dict[str, Any]) -> None:
        """Make a :func:`rlds_cli.summary.describe` of this dataset speak of the store: its
        path is the URL, each key's bytes are those of its files there."""
        info["path"] = self.url
        for key, entry in info.get("stored", {}).items():
            entry["bytes"] = self.stored_key_bytes(key)
            entry["compression_ratio"] = entry["logical_bytes"] / entry["bytes"] if entry["bytes"] else None

    def check_files(self) -> list[str]:
        """Every file the index lists at the URL at its size (one listing), and every chunk of
        every array in the index; returns the problems found (empty: complete)."""
        files = self._files
        problems: list[str] = []
        listing = store.list_files(files.fs, files.base, self.url)
        files._count(1, 0)
        for rel, entry in sorted(files.index.files.items()):
            info = listing.get(rel)
            if info is None:
                problems.append(f"{files.where(rel)} is missing, though {INDEX_FILE} lists it")
            elif int(info.get("size", -1)) != entry.size:
                problems.append(
                    f"{files.where(rel)} has {info.get('size')} bytes, the push recorded {entry.size}"
                )
        for key, spec in self.manifest.fields.items():
            rows = self.num_steps + (self.num_episodes if spec.storage == "flat" else 0)
            problem = self._backend.check_column(self.directory, key, rows, spec.shape)
            if problem is not None:
                problems.append(problem)
        self._check_not_replaced()
        return problems


def _write_atomic(path: Path, data: bytes) -> None:
    """Write a small file of the mirror unless it is there already (several readers of one URL
    may share the mirror: each writes its own temp file)."""
    if path.is_file() and path.stat().st_size == len(data):
        return
    atomic_write(path, data)
