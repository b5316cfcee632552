"""Reading a pushed zarr dataset where it lies: ``open_dataset("s3://bucket/prefix/NAME")``.

A :class:`RemoteDataset` is a :class:`~rlds_cli.cache.dataset.Dataset` whose arrays are read from
the store by the cached zarr datasets' chunk reader
(:class:`~rlds_cli.cache.backends.zarr.read.ChunkReader`) through :class:`RemoteZarrBackend`,
which refuses every write. A read fetches each shard index it needs once (kept in memory), then
the byte ranges of exactly the chunks it needs, nearby ranges merged and all requested together
(concurrently on an async store such as s3fs), and decodes them with Blosc on threads. The
manifest, the files index (``rlds-files.json``) and every small file a read uses (episode index,
each array's zarr metadata) are checked against the index's sizes and sha256 when opened; the
groups' metadata, which no read opens, by ``check_files`` (``rlds inspect URL --check``, a pull).

A local file cache (``cache=DIR``, or ``$RLDS_REMOTE_CACHE``) keeps whole files instead: each
shard a read needs is downloaded once, checked against its sha256 and memory-mapped, so a second
epoch reads nothing from the store. One pushed version's folder is
``DIR/<url-hash>-<manifest-hash>`` (another push to the URL gets another folder, never a mix);
delete it to reclaim the space. With ``cache_limit`` the folder keeps checked blocks instead
(:mod:`rlds_cli.remote.block_cache`).

Replacement: ``rlds push --force`` removes the old manifest before it writes a file, so after
every read that fetched from the store the dataset reads the manifest again (one small request)
and raises :class:`~rlds_cli.errors.DatasetReplacedError` when it changed or is gone. Reads served
from a cache need no such check (their bytes were checked by sha256).

Only zarr datasets can be read remotely: a memmap dataset (or a view) is refused with a hint to
``rlds pull`` it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import threading
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli import settings
from rlds_cli.cache.backends import Backend, ColumnWriter, RegionWriter, check_zarr_grid
from rlds_cli.cache.backends.frames import FramesColumn, frame_files
from rlds_cli.cache.backends.memmap import load_npy
from rlds_cli.cache.backends.zarr.read import ChunkReader, MissingChunkError, ZarrColumn, all_chunks_written
from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.layout import (
    ARRAYS_DIR,
    EPISODES_FILE,
    MANIFEST_FILE,
    SEGMENTED_LAYOUT,
    SOURCE_ARRAYS_FILE,
    VIEW_LAYOUT,
)
from rlds_cli.cache.layout import is_url as is_url  # re-exported: callers ask here too
from rlds_cli.cache.manifest import FieldSpec
from rlds_cli.cache.ted import key_problem
from rlds_cli.errors import (
    CorruptDatasetError,
    DatasetReplacedError,
    InvalidKeyError,
    RemoteError,
    SettingError,
)
from rlds_cli.remote import store
from rlds_cli.remote.block_cache import BlockHold, shared_block_cache
from rlds_cli.remote.files import REPUSH_HINT, RemoteArrayFiles, RemoteFiles, write_small_file
from rlds_cli.remote.store import INDEX_FILE


class RemoteNotReadableError(RemoteError, ValueError):
    """A dataset at a URL that cannot be read where it lies (a memmap dataset, a view)."""

    default_hint = "pull it into the cache first: rlds pull URL"


def _metadata_store(files: RemoteFiles, prefix: str, meta: bytes, strict: bool) -> Any:
    """A read-only zarr store of one remote array: its checked ``zarr.json`` in memory, chunks by
    ranged reads (for zarr's own reads of a layout the chunk reader does not handle)."""
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
    """A remote zarr column whose whole-array reads (``np.asarray(column)``, as ``in_memory``
    loading does) are checked against replacement."""

    def __init__(self, array: Any, where: str, reader: ChunkReader | None, check: Any) -> None:
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
        self,
        dataset_dir: Path,
        key: str,
        dtype: np.dtype,
        row_shape: tuple[int, ...],
        rows: int | None = None,
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

        problem = key_problem(key)
        if problem is not None:
            raise InvalidKeyError(f"array key {key!r} of {self.files.url} cannot be a file name: {problem}")
        prefix = f"{ARRAYS_DIR}/{key}"
        meta = self.files.read_file(f"{prefix}/zarr.json")
        if meta is None:
            raise CorruptDatasetError(f"zarr array {key!r} is missing under {self.files.where(ARRAYS_DIR)}")
        try:
            strict = all_chunks_written(
                json.loads(meta).get("attributes", {}), self.files.where(prefix + "/zarr.json")
            )
            array = zarr.open_array(
                store=_metadata_store(self.files, prefix, meta, strict), mode="r", zarr_format=3
            )
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise CorruptDatasetError(
                f"zarr metadata {self.files.where(prefix + '/zarr.json')} is unreadable: {exc}"
            ) from None
        reader = ChunkReader.of(array, RemoteArrayFiles(self.files, prefix), strict=strict)
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


def open_remote(
    url: str,
    *,
    cache: str | os.PathLike[str] | None = None,
    storage_options: dict[str, Any] | None = None,
    endpoint_url: str | None = None,
    cache_limit: int | str | None = None,
) -> RemoteDataset:
    """Open the zarr dataset pushed to ``url``, read-only (see :class:`RemoteDataset`)."""
    return RemoteDataset(
        url, cache=cache, storage_options=storage_options, endpoint_url=endpoint_url, cache_limit=cache_limit
    )


class RemoteDataset(Dataset):
    """A zarr dataset read where it was pushed (``s3://``, ``gs://``, ``file://``, ...).

    A read-only :class:`~rlds_cli.cache.dataset.Dataset` (``gather``, ``episode``, ``column``,
    ``check_files``, content digests, the Loader; ``in_memory=True`` fetches the needed columns
    once, whole shards at a time). Its ``directory`` is a local folder with the checked small
    files (manifest, episode index); the arrays stay remote.

    Args:
        url: The dataset's folder on the store (what ``rlds push`` was given).
        cache: A folder for the file cache (default ``$RLDS_REMOTE_CACHE``; none: ranged reads).
        storage_options: Keyword arguments of the fsspec filesystem (credentials...).
        endpoint_url: An S3-compatible server (else s3fs reads ``AWS_ENDPOINT_URL``).
        cache_limit: Bytes the cache folder may hold (an int, or ``"20G"``; default
            ``$RLDS_REMOTE_CACHE_LIMIT``): the cache then keeps checked blocks of files, evicted
            least recently used (:mod:`rlds_cli.remote.block_cache`), instead of whole files.

    Raises:
        RemoteNotReadableError: A memmap dataset (or a view): pull it instead.
        RemoteDatasetNotFoundError: No manifest at ``url``.
        RemoteCorruptError: The index is missing, or of another push.
        RemoteAccessError: The store cannot be used.
    """

    reads_checked = True  # every block a bulk read fetches, against the push's crc32c

    def __init__(
        self,
        url: str,
        *,
        cache: str | os.PathLike[str] | None = None,
        storage_options: dict[str, Any] | None = None,
        endpoint_url: str | None = None,
        cache_limit: int | str | None = None,
    ) -> None:
        url = url.rstrip("/")
        fs, base = store.open_url(url, storage_options, endpoint_url)
        manifest_bytes, manifest, index = store.read_version(fs, base, url, then="open it")
        if manifest.backend != "zarr" or manifest.layout in (VIEW_LAYOUT, SEGMENTED_LAYOUT):
            what = {
                VIEW_LAYOUT: "a view",
                SEGMENTED_LAYOUT: "a growing dataset's snapshot (its segments)",
            }.get(manifest.layout, f"a {manifest.backend} dataset")
            raise RemoteNotReadableError(
                f"{url} is {what}: only zarr datasets are read where they lie",
                hint=f"pull it into the cache first: rlds pull {url}",
            )
        self.url = url
        self._options = storage_options
        self._endpoint = endpoint_url
        self._cache_root = cache if cache is not None else settings.remote_cache()
        self._limit = _limit(cache_limit, self._cache_root)
        sha = store.manifest_sha256(manifest_bytes)
        version = f"{_url_ident(fs, base)}-{sha[:16]}"
        blocks = None
        if self._limit is not None:
            _require_block_digests(url, index)
            blocks = shared_block_cache(Path(str(self._cache_root)), self._limit)
        whole_files = bool(self._cache_root) and blocks is None
        mirror = self._mirror(version if whole_files else None)
        self._files = RemoteFiles(url, index, manifest_bytes, mirror if whole_files else None,
                                  storage_options, endpoint_url, blocks, version)  # fmt: skip
        for rel in (EPISODES_FILE, SOURCE_ARRAYS_FILE):
            if rel in index.files and whole_files:
                self._files.local_file(rel)  # a copy kept from an earlier open: checked first
            elif rel in index.files and not (mirror / rel).is_file():
                data = self._files.read_file(rel)
                if data is not None:
                    write_small_file(mirror / rel, data)
        write_small_file(mirror / MANIFEST_FILE, manifest_bytes)
        self._checked = self._files.requests  # the index pins these files to the manifest read
        super().__init__(mirror, manifest)
        self._backend = RemoteZarrBackend(self._files, self._check_not_replaced)

    def _mirror(self, version: str | None) -> Path:
        """The local folder of this version's small files: in the whole-file cache (``version``
        given), else a temporary one removed with the dataset."""
        if version is not None:
            folder = Path(str(self._cache_root)).expanduser() / version
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
            "cache_limit": self._limit,
            "manifest_sha256": self._files.index.manifest_sha256,
        }

    def __setstate__(self, state: dict[str, Any]) -> None:
        RemoteDataset.__init__(
            self,
            state["url"],
            cache=state["cache"],
            storage_options=state["storage_options"],
            endpoint_url=state["endpoint_url"],
            cache_limit=state.get("cache_limit"),
        )
        if self._files.index.manifest_sha256 != state["manifest_sha256"]:
            raise DatasetReplacedError(
                f"dataset {self.name!r} at {self.url} was replaced after it was opened"
            )

    # ------------------------------------------------------------------ replacement

    def _check_not_replaced(self) -> None:
        """After a read that made a request to the store, raise
        :class:`~rlds_cli.errors.DatasetReplacedError` unless the manifest is still the one opened."""
        files = getattr(self, "_files", None)
        # with a block cache every byte read was checked against the push's digests
        if files is None or files.requests == self._checked or files.blocks is not None:
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
        frames = {path.as_posix() for path in frame_files(Path(), key)}
        return sum(
            e.size for rel, e in self._files.index.files.items() if rel.startswith(prefix) or rel in frames
        )

    def _stored_column(self, directory: Path, key: str, spec: FieldSpec) -> Any:
        """A frame column read where it lies (its offsets fetched whole and checked against the
        files index, its frames by ranged reads); any other column through the zarr reader."""
        fmt = spec.frame_format
        if fmt is None:
            return super()._stored_column(directory, key, spec)
        rel_frames, rel_ends = (path.as_posix() for path in frame_files(Path(), key))
        data = self._files.read_file(rel_ends)
        size = self._files.size(rel_frames)
        if data is None or size is None:
            raise CorruptDatasetError(f"{self.url}: the frames of {key!r} are not in {INDEX_FILE}")
        local = self.directory / rel_ends  # checked against its sha256: the mirror's copy
        local.parent.mkdir(parents=True, exist_ok=True)
        write_small_file(local, data)
        ends = load_npy(local, mmap=False, what="offsets file")
        self._check_not_replaced()
        return RemoteFramesColumn(
            self._files, rel_frames, ends, fmt, f"{key!r} of dataset {self.name!r}", size
        )

    def prefetch(
        self, steps: Any, keys: Iterable[str] | None = None, *, stop: threading.Event | None = None
    ) -> BlockHold | None:
        """Fetch into the block cache, and pin, the blocks a gather of ``steps`` will read for the
        stored fields ``keys`` (``None``: all), in one batch of concurrent requests, decoding nothing.

        Call ``hold.release()`` once that gather is done (``hold.fetched``: bytes fetched). Waits
        for room (blocks of earlier reads pinned) until ``stop`` is set. ``None``: no bounded
        cache (``cache_limit``), nothing to read, the blocks alone exceed the limit, or the wait
        ended (the gather then fetches what it needs). Safe from a background thread."""
        if self._files.blocks is None:
            return None
        steps = np.asarray(steps, np.int64).reshape(-1)
        steps = np.unique(np.where(steps < 0, steps + self.num_steps, steps))
        if not len(steps):
            return None
        fields = self.manifest.fields
        rels: list[str] = []
        starts: list[int] = []
        ends: list[int] = []
        flat: np.ndarray | None = None
        for key in fields if keys is None else keys:
            spec = fields[key]
            rows = steps
            if spec.storage == "flat":  # observation t is row t + e(t), next observation the row after
                if flat is None:
                    at = steps + self.episode_of(steps)
                    flat = np.union1d(at, at + 1)
                rows = flat
            column = self.column(key)
            column = getattr(column, "column", column)  # the checked column's own
            if isinstance(column, RemoteFramesColumn):
                r, s, e = column.byte_ranges(rows)
            else:
                reader = getattr(column, "_reader", None)
                if reader is None or not hasattr(reader.source, "prefix"):
                    continue
                r, s, e = reader.row_ranges(rows)
                r = [f"{reader.source.prefix}/{rel}" for rel in r]
            rels += r
            starts += s
            ends += e
        return self._files.prefetch(rels, starts, ends, stop)

    def fix_summary(self, info: dict[str, Any]) -> None:
        """Point a :func:`rlds_cli.inspection.summary.describe` of this dataset at the store: its
        path is the URL, each key's bytes are those of its files there."""
        info["path"] = self.url
        for key, entry in info.get("stored", {}).items():
            entry["bytes"] = self.stored_key_bytes(key)
            entry["compression_ratio"] = entry["logical_bytes"] / entry["bytes"] if entry["bytes"] else None

    def location(self, path: str | os.PathLike[str]) -> str:
        """``path`` under the dataset's URL where it lies in the local mirror of its small files
        (a temporary folder means nothing to the user)."""
        try:
            rel = Path(path).relative_to(self.directory)
        except ValueError:
            return str(path)
        return f"{self.url}/{rel.as_posix()}" if rel.parts else self.url

    def check_files(self) -> list[str]:
        """Every file the index lists at the URL at its size (one listing), the zarr groups'
        metadata at its sha256, and every chunk of every array in the index; returns the problems
        found (empty: complete)."""
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
        for rel in sorted(files.index.files):  # the groups' metadata, which no read opens
            key = rel.removesuffix("zarr.json").rstrip("/").removeprefix(ARRAYS_DIR).lstrip("/")
            if rel.startswith(ARRAYS_DIR) and rel.endswith("zarr.json") and key not in self.manifest.fields:
                try:
                    files.read_file(rel)  # checked against the index's sha256
                except CorruptDatasetError as exc:
                    problems.append(exc.message)
        for key, spec in self.manifest.fields.items():
            if spec.frame_format is not None:  # its two files: listed and sized above
                continue
            rows = self.num_steps + (self.num_episodes if spec.storage == "flat" else 0)
            problem = self._backend.check_column(self.directory, key, rows, spec.shape)
            if problem is not None:
                problems.append(problem)
        self._check_not_replaced()
        return problems


def _url_ident(fs: Any, base: str) -> str:
    return hashlib.sha256(fs.unstrip_protocol(base).encode()).hexdigest()[:16]


def _limit(cache_limit: int | str | None, cache_root: Any) -> int | None:
    """The block cache's limit in bytes (``None``: no limit, whole files if a cache is set)."""
    if cache_limit is not None:
        limit: int | None = settings.size_value("cache_limit", cache_limit)
        what = "cache_limit"
    else:
        limit, what = settings.remote_cache_limit(), "RLDS_REMOTE_CACHE_LIMIT"
    if limit is not None and not cache_root:
        raise SettingError(
            f"{what} bounds a remote cache folder, and none is given",
            hint="pass cache=DIR (or set RLDS_REMOTE_CACHE) with it",
        )
    if limit is not None and limit < 2 * store.INDEX_BLOCK_BYTES:
        # a read in passes holds a block at a time, and the limit keeps room for the ledger too
        raise SettingError(
            f"{what}={limit:,} bytes is less than two cache blocks ({store.INDEX_BLOCK_BYTES:,} bytes each)",
            hint="give a limit of several batches' worth of blocks, e.g. 20G",
        )
    return limit


def _require_block_digests(url: str, index: Any) -> None:
    """Refuse, for a bounded cache (which checks each block it keeps), an index with no per-block
    digests for a file over one block."""
    size = index.block_bytes
    old = next((rel for rel, e in index.files.items() if e.size > size and e.blocks is None), None)
    if old is not None:
        raise RemoteNotReadableError(
            f"{url} was pushed without per-block digests ({old} has none in {INDEX_FILE}): a bounded "
            "cache (cache_limit) cannot check its blocks",
            hint="push it again with this rlds (rlds push NAME URL rewrites only the index), or open it "
            "without cache_limit",
        )


class RemoteFramesColumn(FramesColumn):
    """A frame column of a dataset read where it was pushed: frames fetched by ranged requests
    (nearby ones merged, all at once), or from the file cache's whole-file copy when there is one."""

    #: Reads the store at every access (each read is followed by the replacement check).
    stable_once_open = False
    damage_hint = REPUSH_HINT

    def __init__(self, files: RemoteFiles, rel: str, ends: Any, fmt: Any, label: str, size: int) -> None:
        super().__init__(files.where(rel), ends, fmt, label, size=size)
        self._files = files
        self._rel = rel
        self._mapped: memoryview | None = None  # the file cache's copy, mapped once

    def byte_ranges(self, rows: np.ndarray) -> tuple[list[str], list[int], list[int]]:
        """The byte ranges (file, start, end) of the frames at ``rows``."""
        first, end = self.starts[rows].tolist(), self.ends[rows].tolist()
        return [self._rel] * len(first), first, end

    def release(self, start: int, stop: int) -> None:
        """Nothing: the bytes are fetched by request, or mapped from the file cache's copy (where a
        read released them, :meth:`fetch` would download or map them again for nothing)."""

    def fetch(self, first_byte: list[int], end_byte: list[int]) -> Any:
        if self._files.cache_dir is not None:
            if self._mapped is None:  # downloaded and checked on the first read
                self._mapped = self._files.map(self._rel)
            mapped = self._mapped
            if mapped is not None:
                return lambda i: mapped[first_byte[i] : end_byte[i]]
        blobs = self._files.read_ranges([self._rel] * len(first_byte), first_byte, end_byte)
        return blobs.__getitem__
