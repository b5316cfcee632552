"""What push, pull and remote reads share: opening a store (any fsspec URL, or a Hub dataset repo
at one commit), store errors as one line (:func:`translated`), the remote files index
(``rlds-files.json``) and small file helpers.

fsspec (s3fs, gcsfs...), huggingface_hub and :mod:`rlds_cli.net` are imported when a transfer
starts, never when the CLI is imported.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import KW_ONLY, asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from rlds_cli._util.io import crc32c
from rlds_cli.cache.layout import MANIFEST_FILE
from rlds_cli.cache.manifest import Manifest, parse_manifest
from rlds_cli.errors import (
    CorruptDatasetError,
    DiskFullError,
    MissingExtraError,
    RemoteAccessError,
    RemoteCorruptError,
    RemoteDatasetNotFoundError,
    RemoteExistsError,
    RldsError,
    is_disk_full,
)
from rlds_cli.remote import refuse_offline

if TYPE_CHECKING:
    from rlds_cli.net.hub import HubPath

#: The remote files index: uploaded just before the manifest, read by pull.
INDEX_FILE = "rlds-files.json"
INDEX_FORMAT = "rlds-remote-files"
INDEX_VERSION = 1
#: The index's own digest: sha256 of its other fields (:func:`index_bytes`), so that damage
#: anywhere in it is found when it is read (an index an older rlds pushed has none).
INDEX_DIGEST_KEY = "index_sha256"
#: Bytes read or written at a time while copying (memory stays bounded for any file size).
BLOCK_BYTES = 8 * 1024 * 1024
EXTRA_HINT = "pip install 'rlds-cli[remote]' (fsspec and s3fs; gcs:// needs gcsfs, az:// adlfs)"

_PART = re.compile(r"^[A-Za-z0-9_.-]+$")
#: The last part of a frame column's two files (``<key>@frames``, ``<key>@ends.npy``).
_FRAME_FILE = re.compile(r"^[A-Za-z0-9_.-]+@(?:frames|ends\.npy)$")
_HUB_READ_HINT = (
    "accept the repo's terms on the Hub and set HF_TOKEN (or run `hf auth login`) with a token that may "
    "read it"
)
_HUB_WRITE_HINT = "set HF_TOKEN (or run `hf auth login`) with a token that may write to the repo"


def parse_storage_options(items: list[str] | None) -> dict[str, Any]:
    """``["anon=true", "client_kwargs={...}"]`` -> keyword arguments of the fsspec filesystem
    (each value read as JSON when it parses, else kept as a string)."""
    options: dict[str, Any] = {}
    for item in items or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise RemoteAccessError(
                f"storage option {item!r} is not KEY=VALUE",
                hint="e.g. --storage-option anon=true (values are read as JSON when they parse)",
            )
        try:
            options[key.strip()] = json.loads(value)
        except ValueError:
            options[key.strip()] = value
    return options


def open_url(
    url: str, storage_options: dict[str, Any] | None = None, endpoint_url: str | None = None
) -> tuple[Any, str]:
    """The fsspec filesystem and path of ``url``.

    Args:
        url: Any fsspec URL (``s3://bucket/prefix/name``, ``file:///data/x``, a local path).
        storage_options: Keyword arguments of the filesystem (credentials, ``anon``...).
        endpoint_url: An S3-compatible server (MinIO, Ceph...): passed to s3fs as
            ``endpoint_url``; s3fs also reads ``AWS_ENDPOINT_URL``.

    Raises:
        OfflineError: Offline mode is on and the URL needs the network (:func:`refuse_offline`).
        MissingExtraError: fsspec, or the package of the URL's protocol, is not installed.
        RemoteAccessError: The URL is empty or names no known protocol.
    """
    if not url.strip():
        raise RemoteAccessError(
            "the URL is empty", hint="name the dataset's folder, e.g. s3://bucket/prefix/NAME"
        )
    refuse_offline(url)
    try:
        import fsspec
    except ModuleNotFoundError:
        raise MissingExtraError(
            "pushing and pulling datasets needs fsspec, which is not installed", hint=EXTRA_HINT
        ) from None
    if url.startswith("hf://"):  # a Hub dataset repo, at the commit its revision points at now
        return open_hub(url, storage_options)
    options = dict(storage_options or {})
    if endpoint_url:
        options["endpoint_url"] = endpoint_url
    try:
        fs, path = fsspec.core.url_to_fs(url, **options)
    except ImportError as exc:
        raise MissingExtraError(f"{url}: {_first_line(exc)}", hint=EXTRA_HINT) from None
    except (ValueError, TypeError) as exc:
        raise RemoteAccessError(
            f"cannot open {url}: {_first_line(exc)}",
            hint="give an fsspec URL such as s3://bucket/prefix/NAME or file:///data/NAME; "
            "--storage-option KEY=VALUE passes options to its filesystem",
        ) from None
    except OSError as exc:  # a filesystem that connects when it is made (ftp, sftp): host unknown...
        raise RemoteAccessError(
            f"cannot reach {url}: {_first_line(exc)}",
            hint="check the URL's host and port, and that this machine reaches it",
        ) from None
    if not is_local(fs) and any(part in (".", "..") for part in path.split("/")):
        # an object store keeps them as they are: s3://b/a/../d is the folder 'a/../d', not 'd'
        raise RemoteAccessError(
            f"{url}: the path has a '.' or '..' part, which the store would keep as a folder's name",
            hint="name the dataset's folder without them, e.g. s3://bucket/prefix/NAME",
        )
    # a listing cached by an earlier call in this process may predate another process's writes
    fs.invalidate_cache()
    return fs, path.rstrip("/")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def open_hub(url: str, storage_options: dict[str, Any] | None = None) -> tuple[Any, str]:
    """``HfFileSystem`` and the path of ``url``'s folder at the commit its revision points at now:
    every later read is of that commit, so a push landing mid-pull or mid-read cannot mix versions.

    Raises:
        UnsupportedSourceError: ``url`` is not ``hf://datasets/ORG/REPO[/PATH][@REVISION]``.
        RemoteAccessError: See :func:`head_commit`.
    """
    from rlds_cli.net.hub import parse_hf_url

    where = parse_hf_url(url)
    sha = head_commit(where)
    fs = hub_filesystem(storage_options)
    fs.invalidate_cache()
    return fs, repo_path(where, sha)


def head_commit(where: HubPath, *, write: bool = False) -> str:
    """The commit sha ``where.revision`` points at now.

    Raises:
        OfflineError: Offline mode is on (``RLDS_OFFLINE``): every Hub call starts here.
        RemoteAccessError: No such repo or revision, no token that may read (or write) it, the
            Hub unreachable.
    """
    from rlds_cli.net.hub import hf_api, with_rate_limit

    refuse_offline(str(where))
    api = hf_api()
    with translated(str(where), write=write):
        info = with_rate_limit(lambda: api.dataset_info(where.repo, revision=where.revision))
    sha = str(getattr(info, "sha", "") or "")
    if len(sha) != 40:
        raise RemoteAccessError(f"the Hub gave no commit sha for {where}")
    return sha


def hub_filesystem(storage_options: dict[str, Any] | None = None, *, fresh: bool = False) -> Any:
    """An ``HfFileSystem`` on this process's endpoint.

    ``fresh``: bypass huggingface_hub's instance cache, which (unlike fsspec's) does not key on
    the process id; a forked DataLoader worker asks for one so as not to inherit the parent's
    instance and listings (the shared HTTP client is closed by huggingface_hub in a forked child).
    """
    from huggingface_hub import HfFileSystem

    from rlds_cli.net.hub import check_token, endpoint

    check_token()
    options = {"endpoint": endpoint(), **(storage_options or {})}
    if fresh:
        options["skip_instance_cache"] = True
    return HfFileSystem(**options)


def repo_path(where: HubPath, revision: str) -> str:
    """The ``HfFileSystem`` path of ``where``'s folder at ``revision`` (a sha, or a quoted ref)."""
    from urllib.parse import quote

    tail = f"/{where.path}" if where.path else ""
    return f"datasets/{where.repo}@{quote(revision, safe='')}{tail}"


@contextmanager
def translated(url: str, *, write: bool = False) -> Iterator[None]:
    """Turn what a store or the Hub's client raises into :func:`access_error` naming ``url``
    (``write``: a push to the Hub); a missing module becomes :class:`MissingExtraError`; rlds's
    own errors pass."""
    try:
        yield
    except RldsError:
        raise
    except ModuleNotFoundError as exc:
        raise MissingExtraError(f"{url}: needs {exc.name}, which is not installed", hint=EXTRA_HINT) from None
    except Exception as exc:
        if is_disk_full(exc):  # the local copy's disk, not the store
            where = getattr(exc, "filename", None)
            raise DiskFullError(
                f"no space left on a local disk copying {url}" + (f" ({where})" if where else ""),
                hint="free space on that disk (the cache's for a pull, cache=DIR's for a read), or "
                "give a smaller cache_limit",
            ) from None
        raise access_error(url, exc, write=write) from None


def access_error(url: str, exc: BaseException, *, write: bool = False) -> RemoteAccessError:
    """One line for what the store at ``url`` raised: missing credentials, access denied, not
    found, unreachable, or else its first line. For the Hub (``hf://``), the client's status in
    rlds's words (``write``: a push), never the client's text (it may quote request headers)."""
    if url.startswith("hf://"):
        from rlds_cli.net.hub import http_error, in_chain, is_client_error

        cause = http_error(exc) or in_chain(exc, is_client_error)
        if cause is not None:
            return _hub_error(url, cause, write)
    kind = type(exc).__name__
    text = _first_line(exc)
    if kind in ("NoCredentialsError", "PartialCredentialsError") or "credentials" in text.lower():
        hint = (
            "give credentials the way the store's library reads them: AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY (or AWS_PROFILE) for s3://, or --storage-option key=... "
            "secret=...; --storage-option anon=true reads a public bucket"
        )
        return RemoteAccessError(f"{url}: no credentials found ({text})", hint=hint)
    if isinstance(exc, PermissionError):
        return RemoteAccessError(
            f"{url}: access denied ({text})", hint="check the credentials and the bucket's permissions"
        )
    if isinstance(exc, FileNotFoundError):
        return RemoteAccessError(
            f"{url}: not found ({text})",
            hint="check the bucket and path; a bucket is not created by rlds: create it first",
        )
    if isinstance(exc, NotADirectoryError | FileExistsError | IsADirectoryError):  # a local path
        folder = isinstance(exc, IsADirectoryError)
        what = "a folder where a file is needed" if folder else "a file, not a folder"
        hint = "give the folder the dataset is (or goes) in"
        return RemoteAccessError(f"{url}: a part of the path is {what} ({text})", hint=hint)
    if kind in ("EndpointConnectionError", "ConnectTimeoutError", "ClientConnectorError") or isinstance(
        exc, ConnectionError | TimeoutError
    ):
        return RemoteAccessError(
            f"{url}: cannot reach the store ({text})",
            hint="check the network and the endpoint (--endpoint-url or AWS_ENDPOINT_URL)",
        )
    return RemoteAccessError(
        f"{url}: the store failed: {kind}: {text}",
        hint="check the URL, the endpoint and the credentials; RLDS_DEBUG=1 shows the traceback",
    )


_HUB_SIZE_CHECK = re.compile(
    r"Consistency check failed: file should be of size (\d+) but has size (\d+) \((.*)\)\."
)


def hub_size_check(exc: BaseException) -> tuple[int, str] | None:
    """The size found and the (tail of the) file's name when ``exc`` is huggingface_hub's own size
    check of a download failing (a plain ``OSError``; the file differs from what the Hub
    recorded), else ``None``."""
    found = _HUB_SIZE_CHECK.search(str(exc)) if isinstance(exc, OSError) else None
    return None if found is None else (int(found.group(2)), found.group(3).removeprefix("(\u2026)"))


def past_the_end(exc: BaseException) -> bool:
    """Whether ``exc`` is a store's answer that a range starts past the end of its file (HTTP 416:
    the file is shorter than asked)."""
    from rlds_cli.net.hub import http_error

    cause = http_error(exc) or exc
    return getattr(getattr(cause, "response", None), "status_code", None) == 416


def _hub_error(url: str, cause: BaseException, write: bool) -> RemoteAccessError:
    """:func:`access_error` of the Hub's client exception ``cause``."""
    from rlds_cli.net.hub import UNREACHABLE_HINT, unreachable_message

    status = getattr(getattr(cause, "response", None), "status_code", None)
    verb = "write to" if write else "read"
    if status in (401, 403):
        what = "no token, or one without write access" if write else "the repo is gated or private"
        return RemoteAccessError(
            f"the Hub refused to {verb} {url} (HTTP {status}): {what}",
            hint=_HUB_WRITE_HINT if write else _HUB_READ_HINT,
        )
    if status == 404:
        hint = (
            "check the repo id, the branch and the path (a private repo looks missing without a token "
            "that may read it: set HF_TOKEN)"
        )
        if write:
            hint += "; rlds does not create repos: hf repo create ORG/REPO --repo-type dataset"
        return RemoteAccessError(f"the Hub has no {url} (HTTP 404)", hint=hint)
    if status in (409, 412):
        return RemoteAccessError(
            f"{url} changed during the push (another commit landed first, HTTP {status}); nothing was "
            "committed",
            hint="run the push again",
        )
    if status is not None:
        again = "run the same command again later"
        return RemoteAccessError(
            f"the Hub answered HTTP {status} to {url}",
            hint=f"{again} (files already uploaded are not sent twice)" if write else again,
        )
    return RemoteAccessError(unreachable_message(url, cause), hint=UNREACHABLE_HINT)


def is_local(fs: Any) -> bool:
    """Whether ``fs`` is a filesystem with directories and renames (``file://``), not an
    object store."""
    protocols = fs.protocol if isinstance(fs.protocol, tuple | list) else (fs.protocol,)
    return bool({"file", "local"} & set(protocols))


def join(base: str, rel: str) -> str:
    """The remote path of the dataset file ``rel`` (always ``/``-separated)."""
    return f"{base}/{rel}" if base else rel


def safe_relpath(rel: str) -> bool:
    """Whether ``rel`` (a path from a remote index) stays inside the dataset directory: a
    hostile index must not make a pull write ``../../.bashrc``."""
    *folders, name = rel.split("/")
    return (
        bool(rel)
        and all(p not in ("", ".", "..") and _PART.match(p) for p in folders)
        and name not in ("", ".", "..")
        and bool(_PART.match(name) or _FRAME_FILE.match(name))
        and rel != MANIFEST_FILE
    )


@dataclass
class TransferResult:
    """What a push or a pull did (:class:`~rlds_cli.remote.push.PushResult` and
    :class:`~rlds_cli.remote.pull.PullResult` add what moved).

    Attributes:
        name: The dataset (its name in the cache).
        url: Where it is now (push) or came from (pull).
        backend: ``memmap`` or ``zarr``.
        files: Files of the dataset (the manifest and index not counted).
        skipped: Files already where they were going, complete (an interrupted run, or unchanged).
        bytes_total: Bytes of every file.
        replaced: Another version was replaced (``force``).
        up_to_date: This very version was already there: nothing was written.
        seconds: Wall time of the run.
    """

    name: str
    url: str
    backend: str
    files: int
    _: KW_ONLY
    skipped: int = 0
    bytes_total: int = 0
    replaced: bool = False
    up_to_date: bool = False
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        """The result as JSON-ready values (``rlds push/pull --json``)."""
        return asdict(self)

    def timed(self, started: float) -> Self:
        """The result, its :attr:`seconds` counted from ``started`` (a ``time.monotonic()``)."""
        self.seconds = round(time.monotonic() - started, 3)
        return self


#: The largest file size an index may give (1 PiB): anything above is damage, not data.
MAX_FILE_SIZE = 2**50


#: Bytes of one block of the index's per-block digests, and the most a block of a bounded remote
#: cache holds (:mod:`rlds_cli.remote.block_cache`); a file of at most one block has none (its
#: whole-file sha256 is its block's). 2 MiB: with fixed blocks an epoch through a cache of a tenth
#: of the dataset fetched 1.22-1.37x its bytes (8 MiB: 2.7x, shared blocks evicted early); frame
#: files' blocks are now cut where episodes begin (1.06x, the rest small files), and 1 MiB blocks
#: measured alike (`benchmarks/remote_scale_bench.py`).
INDEX_BLOCK_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True)
class FileEntry:
    """One dataset file in the remote index: size, sha256, the sha256 of each block of
    ``block_bytes`` (``None`` for a file of one block, or an index without per-block digests),
    and the crc32c of each block of the file's cache layout, a file of one block included
    (``None`` in an index written before rlds kept them).

    The cache layout is blocks of ``block_bytes``, or where ``starts`` is given, blocks that
    begin at those offsets (each at most ``block_bytes``): a frame file's blocks are cut where
    episodes begin, so a reader of whole episodes fetches no byte of a neighbour's
    (:func:`cut_starts`). A bounded cache checks each block it fetches against its crc32c where
    the index has them (a tenth of sha256's cost on the learner's cores), else its sha256."""

    size: int
    sha256: str
    # not compared: a push's journal records size and sha256 only, and they decide a file's bytes
    blocks: tuple[str, ...] | None = field(default=None, compare=False)
    crcs: tuple[int, ...] | None = field(default=None, compare=False)
    starts: tuple[int, ...] | None = field(default=None, compare=False)

    def layout(self, block_bytes: int, rel: str) -> BlockLayout:
        """The blocks a bounded cache keeps of this file (``rel``: its path, part of their names)."""
        if self.starts is None:
            return BlockLayout(self.size, block_bytes, None, _tag(rel, block_bytes, b""))
        starts = np.asarray(self.starts, np.int64)
        return BlockLayout(self.size, block_bytes, starts, _tag(rel, block_bytes, starts.tobytes()))


def _tag(rel: str, block_bytes: int, cuts: bytes) -> str:
    # the block size and cuts are part of a block's name: a version pushed again with other
    # blocks (an older rlds's 8 MiB, or fixed blocks) never finds the first push's blocks under
    # its numbers; fixed blocks keep the names rlds gave them before cuts
    text = f"{rel}\0{block_bytes}" + (f"\0{hashlib.sha256(cuts).hexdigest()}" if cuts else "")
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class BlockLayout:
    """Where the blocks of one pushed file begin: every ``block_bytes`` (``starts`` is
    ``None``), or at ``starts`` (the first 0, each block at most ``block_bytes``). ``tag`` names
    the file and its layout in a cache's block names."""

    size: int
    block_bytes: int
    starts: np.ndarray | None
    tag: str

    def spans(self, starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The first block and the block past the last that hold bytes ``[start, end)`` of each
        range (each ``end > start``)."""
        if self.starts is None:
            return starts // self.block_bytes, (ends - 1) // self.block_bytes + 1
        return np.searchsorted(self.starts, starts, "right") - 1, np.searchsorted(
            self.starts, ends - 1, "right"
        )

    def bounds(self, index: int) -> tuple[int, int]:
        """Block ``index``'s first byte and size."""
        if self.starts is None:
            first = index * self.block_bytes
            return first, max(0, min(self.block_bytes, self.size - first))
        first = int(self.starts[index])
        last = int(self.starts[index + 1]) if index + 1 < len(self.starts) else self.size
        return first, last - first


@dataclass(frozen=True)
class RemoteIndex:
    """``rlds-files.json``: the files of one pushed version, tied to its manifest's bytes."""

    manifest_sha256: str
    files: dict[str, FileEntry]
    #: Bytes of a block of the per-block digests (the default when the index gives none).
    block_bytes: int = INDEX_BLOCK_BYTES

    def to_json(self) -> bytes:
        data = {
            "format": INDEX_FORMAT,
            "version": INDEX_VERSION,
            "manifest_sha256": self.manifest_sha256,
            "files": {k: _entry_json(e) for k, e in sorted(self.files.items())},
        }
        if any(e.blocks for e in self.files.values()):
            data["block_bytes"] = self.block_bytes
        return index_bytes(data)

    @classmethod
    def from_json(cls, data: bytes, where: str) -> RemoteIndex:
        """Parse and check an index read from ``where`` (every path safe, every entry typed)."""
        try:
            doc = json.loads(data)
            if doc.get("format") != INDEX_FORMAT or int(doc["version"]) > INDEX_VERSION:
                raise ValueError("format")
            if INDEX_DIGEST_KEY in doc and doc[INDEX_DIGEST_KEY] != _index_digest(doc):
                raise RemoteCorruptError(
                    f"{where} is damaged: it fails its own digest ({INDEX_DIGEST_KEY})",
                    hint="push the dataset again (rlds push NAME URL --force)",
                )
            files = {str(rel): _entry(e) for rel, e in doc["files"].items()}
            block_bytes = doc.get("block_bytes", INDEX_BLOCK_BYTES)
            if type(block_bytes) is not int or not 1024 <= block_bytes <= 2**30:
                raise ValueError("block size")
            index = cls(str(doc["manifest_sha256"]), files, block_bytes)
        except RemoteCorruptError:
            raise
        except (ValueError, KeyError, TypeError, AttributeError):
            raise RemoteCorruptError(
                f"{where} is not a readable rlds files index",
                hint="push the dataset again (rlds push NAME URL --force)",
            ) from None
        bad = [rel for rel in index.files if not safe_relpath(rel)]
        if bad:
            raise RemoteCorruptError(f"{where} names the file {bad[0]!r}, which is no safe path")
        for rel, entry in index.files.items():
            # a size is used to seek, read and allocate: one no file can have (negative, huge,
            # a bool, a float) fails here, naming the index, not deep in a read
            if type(entry.size) is not int or not 0 <= entry.size <= MAX_FILE_SIZE:
                raise RemoteCorruptError(
                    f"{where} gives the file {rel!r} a size of {entry.size!r}, which no file can have "
                    f"(a whole number of bytes from 0 to 2**50)"
                )
        for rel, entry in index.files.items():
            problem = _bad_starts(entry, index.block_bytes)
            if problem:
                raise RemoteCorruptError(
                    f"{where} gives the file {rel!r} block starts that {problem}",
                    hint="push the dataset again (rlds push NAME URL --force)",
                )
            fixed = block_count(entry.size, index.block_bytes)
            cut = len(entry.starts) if entry.starts is not None else fixed
            for what, listed, want in (("digests", entry.blocks, fixed), ("crc32c values", entry.crcs, cut)):
                if listed is not None and len(listed) != want:
                    raise RemoteCorruptError(
                        f"{where} gives the file {rel!r} {len(listed)} block {what} where it has "
                        f"{want} blocks",
                        hint="push the dataset again (rlds push NAME URL --force)",
                    )
        return index


def index_bytes(doc: dict[str, Any]) -> bytes:
    """The bytes of the files index ``doc`` (its fields; any digest it holds is replaced), ending
    with its own digest (:data:`INDEX_DIGEST_KEY`)."""
    body = {k: v for k, v in doc.items() if k != INDEX_DIGEST_KEY}
    return (json.dumps({**body, INDEX_DIGEST_KEY: _index_digest(body)}, indent=1) + "\n").encode()


def _index_digest(doc: dict[str, Any]) -> str:
    """sha256 of ``doc``'s fields but the digest, as canonical JSON (whatever the layout)."""
    body = {k: v for k, v in doc.items() if k != INDEX_DIGEST_KEY}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def block_count(size: int, block_bytes: int) -> int:
    """Blocks of ``block_bytes`` in a file of ``size`` bytes (an empty file: one)."""
    return max(1, -(-size // block_bytes))


#: The index's keys of a file's per-block crc32c values and of where its blocks begin (read by
#: rlds since 2026-11-27; an older rlds ignores them and checks the per-block sha256).
CRC_KEY = "block_crc32c"
STARTS_KEY = "block_starts"


def _bad_starts(entry: FileEntry, block_bytes: int) -> str:
    """What is wrong with ``entry``'s block starts ("" when nothing, or when it has none)."""
    if entry.starts is None:
        return ""
    if entry.crcs is None:
        return f"come without their {CRC_KEY}"
    starts = np.asarray(entry.starts, np.int64)
    gaps = np.diff(np.append(starts, max(entry.size, 1)))
    if not len(starts) or starts[0] != 0 or np.any(gaps <= 0) or np.any(gaps > block_bytes):
        return f"do not cut its {entry.size:,} bytes into blocks of 1 to {block_bytes:,} bytes from 0"
    return ""


def cut_starts(size: int, block_bytes: int, cuts: np.ndarray) -> np.ndarray:
    """Where the blocks of a file of ``size`` bytes begin when they may end only at ``cuts``
    (offsets, e.g. the first byte of each episode's frames) or after ``block_bytes``: each
    block runs to the furthest cut within ``block_bytes`` of its start, else ``block_bytes``
    on. Blocks then hold whole episodes (an episode over ``block_bytes``: a run of its own),
    several short ones where they fit."""
    cuts = np.unique(np.asarray(cuts, np.int64))
    cuts = cuts[(cuts > 0) & (cuts < size)]
    out = [0]
    at = 0
    while size - at > block_bytes:
        k = int(np.searchsorted(cuts, at + block_bytes, "right")) - 1
        at = int(cuts[k]) if k >= 0 and cuts[k] > at else at + block_bytes
        out.append(at)
    return np.asarray(out, np.int64)


def _entry_json(entry: FileEntry) -> dict[str, Any]:
    out: dict[str, Any] = {"size": entry.size, "sha256": entry.sha256}
    if entry.blocks:
        out["blocks"] = list(entry.blocks)
    if entry.crcs is not None:
        out[CRC_KEY] = list(entry.crcs)
    if entry.starts is not None:
        out[STARTS_KEY] = list(entry.starts)
    return out


def _entry(doc: dict[str, Any]) -> FileEntry:
    blocks = doc.get("blocks")
    if blocks is not None and not (isinstance(blocks, list) and all(isinstance(b, str) for b in blocks)):
        raise ValueError("blocks")
    crcs = doc.get(CRC_KEY)
    if crcs is not None and not (
        isinstance(crcs, list) and all(type(c) is int and 0 <= c < 2**32 for c in crcs)
    ):
        raise ValueError(CRC_KEY)
    starts = doc.get(STARTS_KEY)
    if starts is not None and not (
        isinstance(starts, list) and all(type(c) is int and 0 <= c <= MAX_FILE_SIZE for c in starts)
    ):
        raise ValueError(STARTS_KEY)
    return FileEntry(
        doc["size"],
        str(doc["sha256"]),
        tuple(blocks) if blocks is not None else None,
        tuple(crcs) if crcs is not None else None,
        tuple(starts) if starts is not None else None,
    )


def hash_file_blocks(
    path: str | os.PathLike[str], block_bytes: int, cuts: np.ndarray | None = None
) -> FileEntry:
    """A local file's index entry: size, sha256, each block's sha256 when it has more than one
    block, and the crc32c of each block of its cache layout (blocks cut at ``cuts`` where given:
    :func:`cut_starts`), from one read of the file (memory: one block)."""
    import google_crc32c

    size = os.path.getsize(path)
    starts = cut_starts(size, block_bytes, cuts) if cuts is not None else None
    ends = np.append(starts[1:], size) if starts is not None else None  # where each cut block ends
    whole = hashlib.sha256()
    blocks: list[str] = []
    crcs: list[int] = []
    crc, done, read, at = 0, 0, 0, 0  # ``at``: the first byte of the crc under way
    with open(path, "rb") as fh:
        while block := fh.read(block_bytes):
            whole.update(block)
            blocks.append(hashlib.sha256(block).hexdigest())
            if ends is None:
                crcs.append(crc32c(block))
                continue
            base, read = read, read + len(block)  # the file's bytes [base, read) are in ``block``
            while done < len(ends) and ends[done] <= read:  # the cut blocks that end in it
                end = int(ends[done])
                crcs.append(google_crc32c.extend(crc, block[at - base : end - base]))
                at, crc, done = end, 0, done + 1
            crc = google_crc32c.extend(crc, block[at - base :])
            at = read
    if not crcs:  # an empty file: one empty block
        crcs.append(crc32c(b""))
    return FileEntry(
        size,
        whole.hexdigest(),
        tuple(blocks) if len(blocks) > 1 else None,
        tuple(crcs),
        tuple(int(x) for x in starts) if starts is not None else None,
    )


def read_bytes(fs: Any, path: str, url: str) -> bytes | None:
    """A small remote file's bytes, or ``None`` when it does not exist."""
    with translated(url):
        try:
            return bytes(fs.cat_file(path))
        except FileNotFoundError:
            # s3fs says FileNotFoundError for a missing bucket too: tell the two apart
            if not _parent_exists(fs, path):
                raise
            return None


#: Stores whose first path part is a bucket (fsspec's ``protocol`` is a name or a tuple of names,
#: in the implementation's order: s3fs ``("s3", "s3a")``, gcsfs ``("gs", "gcs")``).
BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs"})


def _parent_exists(fs: Any, path: str) -> bool:
    protocol = getattr(fs, "protocol", None)
    names = {protocol} if isinstance(protocol, str) else set(protocol or ())
    if names & BUCKET_PROTOCOLS:
        return bool(fs.exists(path.split("/", 1)[0]))
    return True


def require_manifest(fs: Any, base: str, url: str) -> bytes:
    """The remote manifest's bytes; a URL without one is no dataset (or a push in progress)."""
    data = read_bytes(fs, join(base, MANIFEST_FILE), url)
    if data is None:
        raise RemoteDatasetNotFoundError(
            f"{url} holds no {MANIFEST_FILE}: it is not an rlds dataset, or a push to it is still in "
            "progress (or was interrupted)"
        )
    return data


def manifest_sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def refuse_foreign(url: str, foreign: list[str], writer: str, marker: str, hint: str) -> None:
    """Refuse a push or export to ``url`` over ``foreign``: files there where the data goes that no
    ``writer`` wrote (it holds no ``marker``), another project's, which a push would write over or
    delete.

    Raises:
        RemoteExistsError: ``foreign`` is not empty (the first file named).
    """
    if foreign:
        raise RemoteExistsError(
            f"{url} holds {len(foreign)} file(s) where the {writer} goes that no {writer} wrote (no "
            f"{marker}), e.g. {foreign[0]}",
            hint=hint,
        )


def list_files(fs: Any, base: str, url: str) -> dict[str, dict[str, Any]]:
    """Remote files under ``base`` by relative path, with their fsspec info (size, stamps)."""
    with translated(url):
        try:
            found = fs.find(base, detail=True)
        except FileNotFoundError:
            return {}
    # fsspec may give paths with or without a leading slash (memory://): compare without it
    prefix = base.strip("/") + "/"
    out: dict[str, dict[str, Any]] = {}
    for path, info in found.items():
        name = str(path).lstrip("/")
        if info.get("type", "file") == "file" and name.startswith(prefix):
            out[name[len(prefix) :]] = info
    return out


def read_version(fs: Any, base: str, url: str, *, then: str) -> tuple[bytes, Manifest, RemoteIndex]:
    """The manifest (bytes and parsed) and files index of the version pushed to ``url``, checked
    to be of one push (``then``: what the hint says to do once the push is whole, e.g. "pull").

    Raises:
        RemoteDatasetNotFoundError: No manifest (no dataset, or a push under way).
        RemoteCorruptError: No index, an unreadable one, or one of another push.
    """
    manifest_bytes = require_manifest(fs, base, url)
    try:
        manifest = parse_manifest(manifest_bytes, f"{url}/{MANIFEST_FILE}")
    except CorruptDatasetError as exc:  # its hint speaks of the cache: this one is remote
        raise RemoteCorruptError(exc.message, hint=exc.hint if "upgrade" in exc.hint else None) from None
    index_bytes = read_bytes(fs, join(base, INDEX_FILE), url)
    if index_bytes is None:
        raise RemoteCorruptError(
            f"{url} has a manifest but no {INDEX_FILE}: it was not written by 'rlds push', or the "
            "index was removed since",
            hint="push the dataset with 'rlds push NAME URL' (it uploads the files index, then the manifest)",
        )
    index = RemoteIndex.from_json(index_bytes, f"{url}/{INDEX_FILE}")
    if index.manifest_sha256 != manifest_sha256(manifest_bytes):
        raise RemoteCorruptError(
            f"{url}: {INDEX_FILE} and {MANIFEST_FILE} belong to different pushes (a push to it is "
            "in progress or was interrupted, or one of them was replaced by another copy)",
            hint=f"wait for a running push to finish; else push it again ('rlds push NAME URL "
            f"--force'), then {then}",
        )
    return manifest_bytes, manifest, index
