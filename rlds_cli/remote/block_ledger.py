"""The ledger of a block cache folder (:mod:`rlds_cli.remote.block_cache`): a SQLite database of
its blocks (size, last use, owner while being fetched, crc32c) and of the pins of the reads using
them, changed one transaction at a time under the folder's lock.

Layout of the folder: ``blocks.db`` (the ledger, in write-ahead-log mode), ``blocks.lock`` (the
cache-wide :class:`~rlds_cli._util.locks.FileLock` every change is made under) and ``blocks/``
(the block files). A folder whose ledger is gone keeps no block (files no ledger counts would pass
the limit unseen); a ledger an older rlds wrote (zlib crc32 checks, column ``crc``) starts again
empty. Damage (a ledger that is not a database, a path that is not what the cache keeps there, a
lock held past :data:`LOCK_WAIT_SECONDS`) is :class:`~rlds_cli.errors.RemoteCacheDamagedError`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

from rlds_cli._util.locks import FileLock, Timeout
from rlds_cli.errors import RemoteCacheDamagedError

#: Seconds a ledger change waits for the cache-wide lock (a change holds it for milliseconds).
LOCK_WAIT_SECONDS = 120.0
#: The ledger's write-ahead log is checkpointed every this many pages and truncated to
#: :data:`LEDGER_LOG_BYTES` (the ledger, beside the blocks, stays small: ~100 bytes a block).
LEDGER_CHECKPOINT_PAGES = 32
LEDGER_LOG_BYTES = LEDGER_CHECKPOINT_PAGES * 4096
#: Bytes the ledger's files take besides their rows (the log, its shared memory, the database's
#: first pages), 224 KiB: a cache's limit keeps them free (a sixteenth of the smallest limit of
#: 2 MiB blocks, 4 MiB, holds them), so the folder stays within it. The database gives back the
#: pages of rows deleted (auto_vacuum).
LEDGER_BYTES = LEDGER_LOG_BYTES + 32 * 1024 + 16 * 4096
#: Bytes each block counts besides its file: its rows in the ledger.
ROW_BYTES = 256
#: What the blocks of the ledger count against the limit (files and rows), in SQL.
USED_SQL = f"SELECT COALESCE(SUM(size), 0) + {ROW_BYTES} * COUNT(*) FROM blocks"

BLOCKS_DIR = "blocks"
LEDGER_FILE = "blocks.db"
LOCK_FILE = "blocks.lock"

_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS blocks(name TEXT PRIMARY KEY, size INTEGER NOT NULL, "
    "used REAL NOT NULL, owner INTEGER NOT NULL, ready INTEGER NOT NULL, crc32c INTEGER)",
    "CREATE TABLE IF NOT EXISTS pins(name TEXT NOT NULL, pid INTEGER NOT NULL, n INTEGER NOT NULL, "
    "PRIMARY KEY(name, pid))",
)


class BlockLedger:
    """The ledger of the cache folder ``root``: opened on first use, and again in a forked child
    (after :meth:`renew_in_child`). Threads of one process take turns (one transaction at a
    time: the file lock counts holds across threads)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._pid = -1
        self._conn: sqlite3.Connection | None = None
        self._file_lock: FileLock | None = None
        self._mutex = threading.Lock()

    def renew_in_child(self) -> None:
        """In a forked child: a lock of its own (another thread of the parent may have held the
        parent's at the fork, and no thread of the child would release it)."""
        self._mutex = threading.Lock()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
        """The ledger, in one transaction under the cache-wide lock.

        Raises:
            RemoteCacheDamagedError: The ledger or the folder is damaged, or another process
                holds the lock past :data:`LOCK_WAIT_SECONDS` (a stopped process).
        """
        with self._mutex:
            try:
                if self._pid != os.getpid():
                    self._open()
                assert self._conn is not None and self._file_lock is not None
                self._file_lock.acquire(timeout=LOCK_WAIT_SECONDS)
                try:
                    self._conn.execute("BEGIN IMMEDIATE")
                    try:
                        yield self._conn
                    except BaseException:
                        self._conn.execute("ROLLBACK")
                        raise
                    self._conn.execute("COMMIT")
                finally:
                    self._file_lock.release()
            except sqlite3.Error as exc:
                raise RemoteCacheDamagedError(
                    f"the remote cache {self.root}: its ledger {LEDGER_FILE} cannot be used ({exc})"
                ) from None
            except (IsADirectoryError, NotADirectoryError, FileExistsError) as exc:
                raise RemoteCacheDamagedError(
                    f"the remote cache {self.root}: {exc.filename or self.root} is not what the cache "
                    f"keeps there ({exc.strerror})"
                ) from None
            except Timeout:
                raise RemoteCacheDamagedError(
                    f"the remote cache {self.root}: {LOCK_FILE} stayed locked by another process for "
                    f"{LOCK_WAIT_SECONDS:g} s (a stopped or hung process: Ctrl-Z, a debugger?)",
                    hint="resume or end that process; no ledger change takes that long",
                ) from None

    def _open(self) -> None:
        folder = self.root / BLOCKS_DIR
        self.root.mkdir(parents=True, exist_ok=True)
        self._file_lock = FileLock(self.root / LOCK_FILE)
        self._file_lock.acquire(timeout=LOCK_WAIT_SECONDS)
        try:
            if not (self.root / LEDGER_FILE).exists() and folder.is_dir():
                shutil.rmtree(folder)
            self._conn = sqlite3.connect(self.root / LEDGER_FILE, isolation_level=None, timeout=60,
                                         check_same_thread=False)  # fmt: skip
            # set before the first table, so a new ledger's file shrinks as rows are deleted
            self._conn.execute("PRAGMA auto_vacuum=FULL")
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            # the ledger counts against the limit (LEDGER_BYTES): keep its log small
            self._conn.execute(f"PRAGMA wal_autocheckpoint={LEDGER_CHECKPOINT_PAGES}")
            self._conn.execute(f"PRAGMA journal_size_limit={LEDGER_LOG_BYTES}")
            columns = {row[1] for row in self._conn.execute("PRAGMA table_info(blocks)")}
            if columns and "crc32c" not in columns:
                # an older rlds's ledger (zlib crc32 checks): its blocks are fetched again (the
                # files go first: a kill between leaves the old ledger, to start again from)
                if folder.is_dir():
                    shutil.rmtree(folder)
                self._conn.execute("DROP TABLE IF EXISTS pins")
                self._conn.execute("DROP TABLE blocks")
            for statement in _SCHEMA:
                self._conn.execute(statement)
        finally:
            self._file_lock.release()
        self._pid = os.getpid()
