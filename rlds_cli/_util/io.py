"""File helpers for every writer: atomic replace, fsync, hashes, crc32c, free-space checks, disk use.

Imports nothing of rlds but its errors, so any layer may use it. Callers decide whether to fsync
(most pass :func:`rlds_cli.settings.fsync_enabled`, ``RLDS_FSYNC``).

**fsync waves** (:func:`fsync_wave`, :func:`start_fsyncs`): a build made durable in waves, from a
process-wide thread pool. Concurrent fsyncs share journal commits: a dozen in a row took 20 ms,
issued together 3 ms. The pool is made once per process and again in a forked child (which
inherits no threads). Once the interpreter is exiting, paths are synced one by one in the waiting
thread."""

from __future__ import annotations

import errno
import functools
import glob
import hashlib
import os
import re
import shutil
import stat
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

from rlds_cli.errors import DiskFullError, RldsError

if TYPE_CHECKING:
    from concurrent.futures import Future, ThreadPoolExecutor


#: Head room kept free on the disk besides what a download needs.
DISK_MARGIN = 64 * 1024 * 1024


def temp_path(path: Path, *, unique: bool = True, suffix: str = ".tmp", thread: int | None = None) -> Path:
    """Where ``path`` is written before its rename: ``.<name>.<pid>.<thread>.tmp`` beside it, or
    ``.<name>.tmp`` when not ``unique`` (for a writer that holds a lock, and a name that crash
    recovery looks for: see :meth:`rlds_cli.cache.root.CacheRoot.recover`). ``thread`` in place of
    the calling thread's id gives the same writer a second name."""
    writer = f".{os.getpid()}.{threading.get_ident() if thread is None else thread}" if unique else ""
    return path.with_name(f".{path.name}{writer}{suffix}")


#: The name :func:`temp_path` gives a unique temporary file (``.tmp`` or an export's ``.partial``).
_TEMP_NAME = re.compile(r"\.(.+)\.\d+\.\d+\.(?:tmp|partial)")


def named_by_temp(path: str | os.PathLike[str]) -> str:
    """The path a unique temporary name of :func:`temp_path` stands for (``dir/.out.npz.12.34.partial``
    -> ``dir/out.npz``), for messages: users never named the temporary one; any other path as it is."""
    text = os.fspath(path)
    head, _, name = text.rpartition("/")
    match = _TEMP_NAME.fullmatch(name)
    return text if match is None else f"{head}/{match.group(1)}" if head else match.group(1)


def temp_paths_of(path: Path, *, suffix: str = ".tmp") -> Iterator[tuple[Path, int]]:
    """The unique temporary names of :func:`temp_path` found beside ``path``, each with the pid of
    the process that made it (whether that process still runs is the caller's question)."""
    shape = re.compile(rf"\.{re.escape(path.name)}\.(\d+)\.\d+{re.escape(suffix)}")
    for found in path.parent.glob(f".{glob.escape(path.name)}.*{suffix}"):
        if (match := shape.fullmatch(found.name)) is not None:
            yield found, int(match.group(1))


def exchange(a: Path, b: Path) -> bool:
    """Swap the entries ``a`` and ``b`` (files or folders) in one step, so that each name holds one
    whole version at every moment (Linux ``renameat2(RENAME_EXCHANGE)``); ``False``, with nothing
    changed, where the system or the filesystem cannot.

    Raises:
        OSError: The swap failed for another reason (a name missing, permissions).
    """
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    renameat2 = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if renameat2 is None:  # a libc older than glibc 2.28
        return False
    at_fdcwd, rename_exchange = -100, 2  # linux/fcntl.h, linux/fs.h
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    code = ctypes.get_errno()
    if code in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP):  # no such call, or not on this filesystem
        return False
    raise OSError(code, os.strerror(code), str(a), None, str(b))


@contextmanager
def atomic_path(
    path: Path, *, unique: bool = True, suffix: str = ".tmp", sync_dir: bool = False
) -> Iterator[Path]:
    """Yield a temporary path beside ``path`` (for a file or a folder), renamed over ``path`` when
    the block succeeds (then the folder fsynced if ``sync_dir``), else removed. A crash before the
    rename leaves ``path`` unchanged."""
    tmp = temp_path(path, unique=unique, suffix=suffix)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        if tmp.is_dir() and not tmp.is_symlink():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise
    if sync_dir:
        fsync_dir(path.parent)


def atomic_write(
    path: Path,
    data: str | bytes | Callable[[BinaryIO], object],
    *,
    fsync: bool = False,
    sync_dir: bool = False,
    unique: bool = True,
) -> None:
    """Replace the file ``path`` by ``data`` whole or not at all (``str``: UTF-8; a callable writes
    into the open file, e.g. ``lambda fh: np.save(fh, a)``). ``fsync``: sync the temp file before
    the rename; ``sync_dir``: sync the folder after; ``unique``: see :func:`temp_path`."""
    with atomic_path(path, unique=unique, sync_dir=sync_dir) as tmp, open(tmp, "wb") as fh:
        if callable(data):
            data(fh)
        else:
            fh.write(data.encode("utf-8") if isinstance(data, str) else data)
        fh.flush()
        if fsync:
            os.fsync(fh.fileno())


def fsync_file(path: Path) -> None:
    """Flush a file's bytes to disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


#: What an fsync of a directory answers where the filesystem or the platform cannot sync one:
#: nothing to do there. Any other error (EIO: the disk lost the entries) is raised.
_DIR_FSYNC_UNSUPPORTED = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF, errno.EISDIR}


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (no-op where directories cannot be opened or
    synced; any other I/O error is raised)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in _DIR_FSYNC_UNSUPPORTED:
            raise
    finally:
        os.close(fd)


def file_digest(
    path: str | os.PathLike[str], algorithm: str = "sha256", stop: threading.Event | None = None
) -> str:
    """Hex digest of a file's bytes by one of :data:`DIGEST_ALGORITHMS` (hashlib and xxhash release
    the GIL while hashing).

    Raises:
        InterruptedError: ``stop`` was set (by another thread) before the whole file was read.
    """
    with open(path, "rb", buffering=0) as fh:
        if stop is None:
            return str(hashlib.file_digest(fh, lambda: new_hash(algorithm)).hexdigest())
        digest, buffer = new_hash(algorithm), bytearray(1 << 20)
        view = memoryview(buffer)
        while size := fh.readinto(buffer):
            if stop.is_set():
                raise InterruptedError(f"the hash of {path} was stopped")
            digest.update(view[:size])
        return str(digest.hexdigest())


def sha256_file(path: str | os.PathLike[str], stop: threading.Event | None = None) -> str:
    """Hex sha256 of a file's bytes: a source file's identity (what registries and the Hub publish);
    see :func:`file_digest`."""
    return file_digest(path, "sha256", stop)


#: The hash of the content digests this rlds writes (:mod:`rlds_cli.cache.digest`): XXH3-128
#: (xxhash), ~30 GB/s on one core against sha256's ~1.8 GB/s, so hashing no longer bounds appends
#: and compaction. A digest here detects damage (flipped bits, torn or swapped files), which a
#: 128-bit hash misses with odds of 2**-128; it is no defence against someone who can also
#: rewrite the manifest, nor was sha256.
DIGEST_ALGORITHM = "xxh3_128"
#: Every algorithm a manifest's content digest may name (sha256: what older rlds wrote).
DIGEST_ALGORITHMS = ("sha256", "xxh3_128")


def new_hash(algorithm: str = DIGEST_ALGORITHM) -> Any:
    """A fresh hash object (``update``, ``hexdigest``) of one of :data:`DIGEST_ALGORITHMS`."""
    if algorithm == "xxh3_128":
        import xxhash

        return xxhash.xxh3_128()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown digest algorithm {algorithm!r}")


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``: a block's check where sha256 would cost ten times more
    (google-crc32c, zarr's own dependency: ~20 GB/s on one core against sha256's ~1.6 GB/s).
    Detects every error burst of up to 32 bits; other damage passes with odds of 2**-32."""
    import google_crc32c

    return int(google_crc32c.value(data))


def check_disk(
    directory: Path, needed: int, what: str, *, hint: str | None = None, margin: int = DISK_MARGIN
) -> None:
    """Raise :class:`DiskFullError` (with ``hint``, else the class's) unless ``directory``'s disk
    has ``needed`` bytes free besides ``margin``; ``what`` names who needs them ("the download")."""
    if needed <= 0:
        return
    free = shutil.disk_usage(directory).free
    if free < needed + margin:
        spare = f" (plus {margin // 2**20} MiB kept spare)" if margin >= 2**20 else ""
        raise DiskFullError(
            f"not enough disk space in {directory}: {what} needs {needed:,} bytes and {free:,} are "
            f"free{spare}",
            hint,
        )


def file_bytes(path: Path) -> int:
    """Bytes a file takes on disk: its allocated blocks (less than its length for a sparse file,
    more for a tiny one); ``st_size`` where the platform reports no blocks (Windows)."""
    return _allocated(path.stat())


def _allocated(st: os.stat_result) -> int:
    blocks = getattr(st, "st_blocks", None)
    return st.st_size if blocks is None else blocks * 512


def tree_bytes(path: Path) -> int:
    """Disk use of a file or a directory tree (see :func:`file_bytes`; links are not followed);
    the size that ``rlds list``, ``inspect``, ``du``, ``rm`` and ``gc`` report. A file or folder
    removed while counted (a growing dataset's retired segment) counts 0."""
    try:
        if path.is_file():
            return file_bytes(path)
    except FileNotFoundError:
        return 0
    if not path.is_dir():
        return 0
    total = 0
    for folder, _, names in os.walk(path):  # os.walk passes over folders removed meanwhile
        for name in names:
            try:
                st = os.lstat(os.path.join(folder, name))
            except FileNotFoundError:
                continue
            if stat.S_ISREG(st.st_mode):
                total += _allocated(st)
    return total


#: Threads that fsync at once.
FSYNC_THREADS = 8

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def _forget_pool() -> None:
    global _pool, _pool_lock
    _pool, _pool_lock = None, threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool)


def _fsync_pool() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            from concurrent.futures import ThreadPoolExecutor  # not for readers, who never sync

            _pool = ThreadPoolExecutor(FSYNC_THREADS, thread_name_prefix="rlds-fsync")
        return _pool


def in_background(sync: Callable[..., Any], *args: Any) -> Future[Any]:
    """Run ``sync(*args)`` (an fsync) on the process's fsync threads."""
    return _fsync_pool().submit(sync, *args)


def tree_paths(root: Path) -> tuple[list[Path], list[Path]]:
    """The files (symlinks left out) and the folders under ``root``, ``root`` the last folder,
    deepest first."""
    paths = sorted(root.rglob("*"), key=lambda p: len(p.parts), reverse=True)
    files = [p for p in paths if p.is_file() and not p.is_symlink()]
    return files, [*(p for p in paths if p.is_dir()), root]


def start_fsyncs(files: list[Path], folders: list[Path]) -> Callable[[], None]:
    """Begin fsyncing all ``files`` and ``folders`` at once, unordered; returns a wait that
    raises the first error once all have ended (two paths or fewer are synced inline)."""
    if len(files) + len(folders) <= 2:
        for path in files:
            fsync_file(path)
        for path in folders:
            fsync_dir(path)
        return _nothing
    pool = _fsync_pool()
    waits: list[Callable[[], Any]] = []
    for sync, path in [*((fsync_file, p) for p in files), *((fsync_dir, p) for p in folders)]:
        try:
            waits.append(pool.submit(sync, path).result)
        except RuntimeError:  # interpreter exiting: an atexit commit after concurrent.futures'
            # exit hook, which takes no new work
            waits.append(functools.partial(sync, path))  # synced by the wait, in this thread

    def wait() -> None:
        error: BaseException | None = None
        for result in waits:
            try:
                result()
            except BaseException as exc:
                error = error or exc
        if error is not None:
            raise error

    return wait


def fsync_wave(files: list[Path], folders: list[Path]) -> None:
    """fsync every one of ``files`` and ``folders`` at once (see :func:`start_fsyncs`)."""
    start_fsyncs(files, folders)()


def fsync_tree(root: Path) -> None:
    """Make a finished build durable before its manifest commits it: all files, then all
    folders (``root`` included), each wave issued at once."""
    files, folders = tree_paths(root)
    fsync_wave(files, [])
    fsync_wave([], folders)


def _nothing() -> None:
    return None


#: Bytes of an existing output file's start and of its end searched for its writer's mark.
_MARK_WINDOW = 64 << 10


def refuse_foreign_output(
    path: Path, what: str, mark: bytes, error: type[RldsError], *, magic: bytes = b""
) -> None:
    """Raise ``error`` where the user-named output ``path`` holds a file that an earlier run of the
    command did not write: one that does not start with ``magic`` and hold ``mark`` in its first or
    last 64 KiB (an empty file, or none, may be written). Written over, the user's file was lost
    (``rlds show -o data.hdf5`` replaced a dataset's source with a page, exit 0). A file that cannot
    be read is left to the write, whose error names it."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(_MARK_WINDOW)
            size = os.fstat(fh.fileno()).st_size
            fh.seek(max(len(head), size - _MARK_WINDOW))
            tail = fh.read(_MARK_WINDOW)
    except OSError:
        return
    if not head or (head.startswith(magic) and (mark in head or mark in tail)):
        return
    raise error(
        f"cannot write {what} to {path}: the file there is not one this command wrote, and it would be lost",
        hint="remove it first, or name another file",
    )


def make_parent(path: Path, error: type[RldsError]) -> None:
    """Make ``path``'s folder, and those above it, where missing.

    Raises:
        error: A file stands where one of those folders should be (named with ``path``).
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise error(
            f"{path}: a part of the path ({path.parent}) is a file, not a folder", hint="pick another path"
        ) from None
