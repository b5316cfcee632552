"""The files of one dataset version pushed to a URL, read with checks: sizes and sha256 from the
files index, ranged reads with nearby ranges merged, and an optional local file cache
(:mod:`rlds_cli.remote.reader` opens a dataset on them).

Ranged reads of a store's files by presigned URL, over a pool of plain HTTP connections.

fsspec's async object stores read a response in pieces on an event loop and join them: s3fs
over aiohttp spends ~3x the CPU of one urllib3 request per byte (300 MB in 4 MiB ranges, 8 at a
time, from moto on 127.0.0.1: 0.58-0.71 CPU-s against 0.19-0.20), CPU a learner's cores need for
decoding. Where the filesystem presigns a path (s3fs; gcsfs with a signing key) and the store
answers a ranged GET of that URL, :class:`SignedRanges` reads each range with one request of
its own, the body read into one buffer, requests in flight on a pool of threads. Any other
filesystem (the Hub, ``memory://``, a folder, a store that refuses the probe) keeps fsspec's
``cat_ranges``.

A URL is signed for :data:`SIGN_SECONDS` and signed again once most of that has passed, or when
the store answers 403 (an expired or revoked signature) once.
"""

from __future__ import annotations

import hashlib
import logging
import mmap
import os
import re
import threading
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli._util.io import atomic_write, crc32c, sha256_file
from rlds_cli.cache.layout import MANIFEST_FILE
from rlds_cli.errors import (
    CorruptDatasetError,
    DatasetReplacedError,
    RemoteCacheDamagedError,
    RemoteCorruptError,
)
from rlds_cli.remote import store
from rlds_cli.remote.block_cache import BlockCache, BlockHold
from rlds_cli.remote.store import INDEX_FILE, RemoteIndex

#: Held while an object rebuilds, in a forked child, what it cannot share with the parent
#: (filesystem, connections, threads): the first thread of the child rebuilds, the others wait for
#: it. Made anew in every child (one held across a fork would stay held there).
_FORK_LOCK = threading.Lock()


def _new_fork_lock() -> None:
    global _FORK_LOCK
    _FORK_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_fork_lock)

#: Two byte ranges of one file closer than this are fetched as one request (the bytes between
#: them cost less than another round trip to an object store).
MERGE_GAP = 256 * 1024
#: What mends a file damaged on the store (the cache's hint, rebuilding a dataset, does not apply).
REPUSH_HINT = RemoteCorruptError.default_hint
#: Largest merged request.
MERGE_MAX = 32 * 1024 * 1024


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
        blocks: BlockCache | None = None,
        version: str = "",
    ) -> None:
        self.url = url
        self.index = index
        self.manifest_bytes = manifest_bytes
        self.cache_dir = cache_dir
        #: The bounded block cache (``cache_limit``), or ``None``.
        self.blocks = blocks
        #: This version's folder name in the block cache.
        self.version = version
        #: Bytes of one block of the push's per-block digests.
        self.block_bytes = index.block_bytes
        self._options = storage_options
        self._endpoint = endpoint_url
        self._fs, self.base = store.open_url(url, storage_options, endpoint_url)
        self._pid = os.getpid()
        self._lock = threading.Lock()
        #: Requests made to the store (a read that made any is checked against replacement).
        self.requests = 0
        #: Bytes fetched from the store.
        self.bytes_fetched = 0
        #: Files of the file cache this process checked (fetched, or read back once), with its pid.
        self._checked: tuple[int, set[str]] = (os.getpid(), set())
        self._layouts: dict[str, store.BlockLayout] = {}
        #: Ranged reads by presigned URL (:class:`SignedRanges`), ``False`` where
        #: the store's cannot be signed, ``None`` before the first fetch asks.
        self._signed: SignedRanges | bool | None = None

    @property
    def fs(self) -> Any:
        """The filesystem, opened again in a forked process (fsspec's async ones are not
        fork-safe: a DataLoader worker would inherit a dead event loop)."""
        if self._pid != os.getpid():
            with _FORK_LOCK:
                if self._pid != os.getpid():
                    self._reopen()
        return self._fs

    def _reopen(self) -> None:
        # the path stays the one opened first: on the Hub it names the commit being read, so a
        # worker asks the Hub nothing to reopen it (no revision lookup per worker)
        if self.url.startswith("hf://"):
            self._fs = store.hub_filesystem(self._options, fresh=True)
        else:
            self._fs, _ = store.open_url(self.url, self._options, self._endpoint)
        self._lock = threading.Lock()
        self._signed = None  # its signer is the parent's filesystem: probe again with this one
        self._pid = os.getpid()  # last: a thread that sees it finds the rest in place

    def where(self, rel: str) -> str:
        return f"{self.url}/{rel}"

    def _count(self, requests: int, nbytes: int) -> None:
        with self._lock:
            self.requests += requests
            self.bytes_fetched += nbytes

    def size(self, rel: str) -> int | None:
        entry = self.index.files.get(rel)
        return entry.size if entry is not None else None

    def layout(self, rel: str) -> store.BlockLayout | None:
        """The blocks a bounded cache keeps of file ``rel`` (``None``: the index lists no such
        file)."""
        layout = self._layouts.get(rel)
        if layout is None:
            entry = self.index.files.get(rel)
            if entry is None:
                return None
            layout = self._layouts[rel] = entry.layout(self.block_bytes, rel)
        return layout

    # ------------------------------------------------------------------ ranged reads

    def read_ranges(self, rels: Sequence[str], starts: Sequence[int], ends: Sequence[int]) -> list[bytes]:
        """Bytes ``[start, end)`` of each file: from the bounded block cache when there is one
        (missing blocks fetched first, checked against the push), else from the store (:meth:`fetch`).
        """
        if self.blocks is not None:
            return self.blocks.read_ranges(self, rels, starts, ends)
        return self.fetch(rels, starts, ends)

    def prefetch(self, rels: Sequence[str], starts: Sequence[int], ends: Sequence[int],
                 stop: threading.Event | None = None) -> BlockHold | None:  # fmt: skip
        """Fetch the blocks of these ranges into the block cache and pin them
        (:meth:`BlockCache.prefetch`); ``None`` without a block cache."""
        if self.blocks is None:
            return None
        return self.blocks.prefetch(self, rels, starts, ends, stop)

    def verify_block(self, rel: str, block: int, data: bytes) -> int:
        """Raise unless ``data`` is block ``block`` of ``rel`` (of its :meth:`layout`) as pushed:
        its size and its crc32c where the index records them, else its per-block sha256 (the
        whole file's for a file of one block). Returns the block's crc32c (what the cache keeps to
        check its copy).

        Raises:
            DatasetReplacedError: The bytes differ and the manifest at the URL changed.
            CorruptDatasetError: The bytes differ from the push, the manifest did not.
        """
        entry = self.index.files[rel]
        crc = crc32c(data)
        layout = self.layout(rel)
        assert layout is not None
        size = layout.bounds(block)[1]
        if entry.crcs is not None:
            want, got = f"{entry.crcs[block]:08x}", f"{crc:08x}"
            what = "crc32c"
        elif entry.blocks is not None:
            want, got, what = entry.blocks[block], hashlib.sha256(data).hexdigest(), "sha256"
        elif block == 0 and entry.size <= self.block_bytes:
            want, got, what = entry.sha256, hashlib.sha256(data).hexdigest(), "sha256"
        else:
            raise CorruptDatasetError(f"{self.where(rel)} has no per-block digests in {INDEX_FILE}")
        if got == want and len(data) == size:
            return crc
        if len(data) != size:
            raise self.damage(
                f"{self.where(rel)} differs from the file pushed: block {block} has {len(data):,} bytes, "
                f"the push's index makes it {size:,}"
            )
        raise self.damage(
            f"{self.where(rel)} differs from the file pushed: block {block} has {what} {got}, "
            f"the push recorded {want} in its files index (the file or the index is damaged)"
        )

    def damage(self, message: str) -> CorruptDatasetError | DatasetReplacedError:
        """The error for a file of the store that is not as pushed (missing, short, other bytes):
        :class:`DatasetReplacedError` where the manifest at the URL changed since this dataset was
        opened (a ``push --force`` under the reader: open it again), else the damage ``message``
        with the hint to push again (``rlds verify`` takes a cached dataset, not a store)."""
        if self.manifest_now() != self.manifest_bytes:
            return DatasetReplacedError(
                f"dataset at {self.url} was replaced (or removed) while it was open",
                hint="a push --force replaced it; open it again",
            )
        return CorruptDatasetError(message, hint=REPUSH_HINT)

    def _missing(self, rel: str) -> CorruptDatasetError | DatasetReplacedError:
        return self.damage(f"{self.where(rel)} is missing, though {INDEX_FILE} lists it")

    def fetch(
        self, rels: Sequence[str], starts: Sequence[int], ends: Sequence[int], *, verify: bool = True
    ) -> list[bytes]:
        """Bytes ``[start, end)`` of each file from the store in one batch of requests, nearby
        ranges of one file merged (:data:`MERGE_GAP`, :data:`MERGE_MAX`); with ``verify``, widened to
        whole blocks where that is cheap and every whole block checked (:meth:`_whole_blocks`;
        ``False``: the caller checks each block itself, as the block cache does).

        Raises:
            CorruptDatasetError: A file the index lists is gone, shorter than pushed, or (``verify``)
                a block differs from the push.
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
        if verify:
            groups = [
                (rel, *self._whole_blocks(rel, start, end), members) for rel, start, end, members in groups
            ]
        fs = self.fs
        paths = [store.join(self.base, g[0]) for g in groups]
        with store.translated(self.url):
            if self._signed is None:  # once per opened dataset: can the store's URLs be signed?
                self._signed = SignedRanges.probe(fs, paths[0]) or False
            firsts, lasts = [g[1] for g in groups], [g[2] for g in groups]
            if isinstance(self._signed, SignedRanges):
                blobs = self._signed.cat_ranges(paths, firsts, lasts)
            else:
                blobs = fs.cat_ranges(paths, firsts, lasts, on_error="return")
        out: list[bytes] = [b""] * len(rels)
        total = 0
        for (rel, g_start, g_end, members), blob in zip(groups, blobs, strict=True):
            if isinstance(blob, FileNotFoundError):
                raise self._missing(rel)
            if isinstance(blob, BaseException) and store.past_the_end(blob):  # the Hub's 416
                blob = b""
            if isinstance(blob, BaseException):
                with store.translated(self.url):
                    raise blob
            if len(blob) != g_end - g_start:
                what = "is shorter than the file pushed" if len(blob) < g_end - g_start else (
                    "gave more bytes than asked")  # fmt: skip
                raise self.damage(
                    f"{self.where(rel)} {what} (bytes {g_start}-{g_end} asked, {len(blob)} read)"
                )
            if verify:
                self._verify_whole_blocks(rel, g_start, blob)
            total += len(blob)
            view = memoryview(blob)
            for k in members:
                out[k] = bytes(view[int(starts[k]) - g_start : int(ends[k]) - g_start])
        self._count(len(groups), total)
        return out

    def _whole_blocks(self, rel: str, start: int, end: int) -> tuple[int, int]:
        """``[start, end)`` widened to the bounds of the blocks it touches where that at most doubles
        the bytes fetched (bulk reads: every byte is then checked, :meth:`_verify_whole_blocks`);
        small scattered reads stay as asked."""
        layout = self.layout(rel)
        if layout is None or end <= start:
            return start, end
        first, past = layout.spans(np.array([start]), np.array([end]))
        lo = layout.bounds(int(first[0]))[0]
        last_start, last_size = layout.bounds(int(past[0]) - 1)
        hi = min(last_start + last_size, layout.size)
        return (lo, hi) if hi - lo <= 2 * (end - start) else (start, end)

    def _verify_whole_blocks(self, rel: str, start: int, blob: bytes) -> None:
        """Check every block of ``rel`` that ``blob`` (its bytes from ``start``) holds whole
        (:meth:`verify_block`), where the index records per-block digests: a read of whole files
        or blocks serves no damaged byte; a block read in part is checked where it is kept whole
        (the file and block caches, ``cache=``, ``cache_limit=``)."""
        entry, layout = self.index.files.get(rel), self.layout(rel)
        if entry is None or layout is None or (entry.crcs is None and entry.blocks is None) or not blob:
            return
        end = start + len(blob)
        first, past = layout.spans(np.array([start]), np.array([end]))
        for block in range(int(first[0]), int(past[0])):
            b_start, b_size = layout.bounds(block)
            if b_size and start <= b_start and b_start + b_size <= end:
                self.verify_block(rel, block, blob[b_start - start : b_start - start + b_size])

    def read_file(self, rel: str) -> bytes | None:
        """A whole (small) file, checked against its size and sha256 in the index; ``None`` when
        the index does not list it. With a file cache or a block cache, kept there too."""
        entry = self.index.files.get(rel)
        if entry is None:
            return None
        if self.cache_dir is not None:
            path = self.local_file(rel)
            return path.read_bytes() if path is not None else None
        if self.blocks is not None:  # kept as blocks too, each checked against the push
            return self.blocks.read_ranges(self, [rel], [0], [entry.size])[0]
        with store.translated(self.url):
            try:
                data = bytes(self.fs.cat_file(store.join(self.base, rel)))
            except FileNotFoundError:
                raise self._missing(rel) from None
        self._count(1, len(data))
        self._verify(rel, len(data), hashlib.sha256(data).hexdigest())
        return data

    def _verify(self, rel: str, size: int, sha: str) -> None:
        entry = self.index.files[rel]
        if size != entry.size or sha != entry.sha256:
            found = f"{size} bytes" if size != entry.size else f"sha256 {sha}"
            raise self.damage(
                f"{self.where(rel)} differs from the file pushed: {found}, the push recorded "
                f"{entry.size} bytes, sha256 {entry.sha256} in its files "
                "index (the file or the index is damaged)"
            )

    # ------------------------------------------------------------------ the file cache

    def local_file(self, rel: str) -> Path | None:
        """The file's checked copy in the file cache, downloaded first if need be; ``None`` when
        the index does not list it. A copy already there is checked against the push (size,
        sha256) the first time this object (one opened dataset, in one process) uses it.

        Raises:
            RemoteCacheDamagedError: The copy differs from the push (it is never served).
        """
        assert self.cache_dir is not None
        if rel not in self.index.files:
            return None
        path = self.cache_dir / rel
        if not path.is_file():
            self.prepare([rel])
        checked = self._checked_here()
        if rel not in checked:
            entry = self.index.files[rel]
            if path.stat().st_size != entry.size or sha256_file(path) != entry.sha256:
                raise RemoteCacheDamagedError(
                    f"the cached copy {path} of {self.where(rel)} differs from the file pushed",
                    hint=f"remove {path}: the next read fetches it again",
                )
            checked.add(rel)
        return path

    def _checked_here(self) -> set[str]:
        """The files this process checked (a forked child checks its own)."""
        if self._checked[0] != os.getpid():
            self._checked = (os.getpid(), set())
        return self._checked[1]

    def prepare(self, rels: Sequence[str]) -> None:
        """Download the files of ``rels`` the cache lacks in one batch, each checked against its
        size and sha256, then renamed into place (a file under its own name is always checked)."""
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
                    raise self._missing(next((r for r in todo if r in str(exc)), todo[0])) from None
                except OSError as exc:
                    checked = store.hub_size_check(exc)  # the Hub client's own size check
                    if checked is None:
                        raise
                    size, tail = checked
                    rel = next((r for r in todo if store.join(self.base, r).endswith(tail)), todo[0])
                    if size != self.index.files[rel].size:
                        self._verify(rel, size, "")  # raises: the size differs from the push
                    raise  # the Hub's record, not the push's, differs: the store's failure
            total = 0
            for rel, part in zip(todo, parts, strict=True):
                size = part.stat().st_size
                self._verify(rel, size, sha256_file(part))
                total += size
                os.replace(part, self.cache_dir / rel)
                self._checked_here().add(rel)
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
    :class:`~rlds_cli.cache.backends.zarr.read.ByteSource` for the chunk reader."""

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


def write_small_file(path: Path, data: bytes) -> None:
    """Write a small file of the mirror unless it is there already (several readers of one URL
    may share the mirror: each writes its own temp file)."""
    if path.is_file() and path.stat().st_size == len(data):
        return
    atomic_write(path, data)


class _Unsigned(logging.Filter):
    """urllib3 logs each retry with its URL, whose query is a presigned URL's signature (and a
    session's token): the query is left out of every record."""

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        if "?" in text:
            record.msg, record.args = re.sub(r"\?[^\s'\")]*", "?<signed>", text), ()
        return True


logging.getLogger("urllib3.connectionpool").addFilter(_Unsigned())


#: Seconds a presigned URL is asked to stay valid (signed again after 90% of it).
SIGN_SECONDS = 3600


#: Requests in flight at once, per process.
WORKERS = 16


#: Seconds to connect, and to wait for the next bytes of a response (as botocore's defaults).
CONNECT_SECONDS = 60.0


READ_SECONDS = 60.0


#: A request refused (connection) or answered 500-504 is tried again this many times, after
#: ``RETRY_BACKOFF * 2**n`` seconds.
RETRIES = 3


RETRY_BACKOFF = 0.2


class SignedRanges:
    """Ranged GETs of ``fs``'s files by presigned URL (see the module). Safe from several
    threads; a forked child makes its own connections and threads."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self._signed: dict[str, tuple[str, float]] = {}
        self._lock = threading.Lock()
        self._pid = -1
        self._http: Any = None
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def probe(cls, fs: Any, path: str) -> SignedRanges | None:
        """The signed reader of ``fs``'s files, or ``None`` where ``fs`` cannot presign ``path``,
        signs a URL that is not HTTP, or the store does not answer a one-byte ranged GET of it
        with those bytes (or "range not satisfiable", for an empty file)."""
        reader = cls(fs)
        try:
            url = reader._url(path)
            if not url.startswith(("http://", "https://")):
                return None
            response = reader._clients()[0].request(
                "GET", url, headers={"Range": "bytes=0-0"}, preload_content=False, decode_content=False
            )
            try:
                ok = response.status == 416 or (response.status == 206 and len(response.read()) == 1)
            finally:
                response.release_conn()
        except Exception:  # no signing (NotImplementedError, no key), unreachable: fsspec's way
            return None
        return reader if ok else None

    def cat_ranges(
        self, paths: Sequence[str], starts: Sequence[int], ends: Sequence[int]
    ) -> list[bytes | BaseException]:
        """Bytes ``[start, end)`` of each path, as fsspec's ``cat_ranges(..., on_error="return")``:
        a failed range is the exception in its place (``FileNotFoundError`` for a missing file,
        ``PermissionError`` for access denied, ``ConnectionError`` for an unreachable store)."""
        http, pool = self._clients()

        def one(k: int) -> bytes | BaseException:
            try:
                return self._get(http, paths[k], int(starts[k]), int(ends[k]))
            except Exception as exc:
                return exc

        if len(paths) == 1:
            return [one(0)]
        return list(pool.map(one, range(len(paths))))

    def _get(self, http: Any, path: str, start: int, end: int) -> bytes:
        import urllib3

        if end <= start:
            return b""
        for attempt in range(2):
            try:
                response = http.request(
                    "GET",
                    self._url(path, fresh=attempt > 0),
                    headers={"Range": f"bytes={start}-{end - 1}"},
                    decode_content=False,
                )
            except urllib3.exceptions.HTTPError as exc:  # retries spent: connection refused, timed out
                # never urllib3's text: it quotes the URL, whose query is the signature
                cause = getattr(exc, "reason", None) or exc
                raise ConnectionError(f"{path}: {type(cause).__name__} (retried {RETRIES} times)") from None
            if attempt == 0 and _expired(response):  # an expired signature: sign again, once
                continue
            break
        if response.status == 206:
            return bytes(response.data)
        if response.status == 200:
            raise OSError(
                f"{path}: the store ignored the byte range asked (HTTP 200 for bytes {start}-{end - 1})"
            )
        if response.status == 404:
            raise FileNotFoundError(f"{path}: not found (HTTP 404)")
        if response.status == 403:
            raise PermissionError(f"{path}: access denied (HTTP 403)")
        if response.status == 416:  # past the end: the caller reports the file shorter than pushed
            return b""
        raise OSError(f"{path}: HTTP {response.status} for bytes {start}-{end - 1}")

    def _url(self, path: str, fresh: bool = False) -> str:
        now = time.monotonic()
        with self._lock:
            signed = self._signed.get(path)
        if fresh or signed is None or signed[1] < now:
            signed = (str(self._fs.sign(path, expiration=SIGN_SECONDS)), now + 0.9 * SIGN_SECONDS)
            with self._lock:
                self._signed[path] = signed
        return signed[0]

    def _clients(self) -> tuple[Any, ThreadPoolExecutor]:
        if self._pid != os.getpid():  # a forked child: a lock, connections and threads of its own
            with _FORK_LOCK:
                if self._pid != os.getpid():
                    self._lock, self._pool = threading.Lock(), None
                    self._pid = os.getpid()
        with self._lock:
            if self._pool is None:
                import urllib3

                retries = urllib3.Retry(
                    total=RETRIES,
                    backoff_factor=RETRY_BACKOFF,
                    status_forcelist=(500, 502, 503, 504),
                    raise_on_status=False,
                )
                timeout = urllib3.Timeout(connect=CONNECT_SECONDS, read=READ_SECONDS)
                self._http = urllib3.PoolManager(maxsize=WORKERS, retries=retries, timeout=timeout)
                self._pool = ThreadPoolExecutor(WORKERS, thread_name_prefix="rlds-fetch")
            return self._http, self._pool


def _expired(response: Any) -> bool:
    """Whether the store refused a request for its signature's age (S3: 403, or 400
    ``ExpiredToken`` once the credentials' session ended; GCS: 400): sign again."""
    if response.status == 403:
        return True
    return response.status == 400 and b"xpired" in bytes(response.data or b"")[:4096]
