"""A node-local, bounded on-disk cache of blocks of pushed datasets' files.

A remote read (zarr chunk ranges, frame ranges) asks for byte ranges of files; the cache serves
them from the blocks of the push's index (:meth:`rlds_cli.remote.store.FileEntry.layout`: blocks
of the index's block size, a frame file's cut where episodes begin), fetching the missing ones in
one batch of concurrent requests, each checked against the push's index before it enters.
Blocks, not whole files, because a frame column is one big file a limit could not bound. Blocks
fetched ahead of a read are also kept in memory until that read (:data:`MEMORY_BYTES`).

Layout of a cache folder ``DIR`` (``cache=DIR`` / ``$RLDS_REMOTE_CACHE``):

- ``DIR/blocks/<version>/<file-hash>.<n>``: block ``n`` of one file of one pushed version
  (``<version>`` is the URL's hash and the manifest's: another push is another folder;
  ``<file-hash>`` names the file's path and its blocks' layout);
- ``DIR/blocks.db`` and ``DIR/blocks.lock``: the ledger and the lock every change of it is made
  under (:mod:`rlds_cli.remote.block_ledger`).

Guarantees:

- **Never over the limit**, also when a process is killed at any step: the space of a block is
  reserved in the ledger (evicting least recently used blocks) before its ``.part`` file is
  written; a reservation of a dead process keeps counting until the next process that takes the
  lock reclaims it (removes its ``.part`` and its row). The limit bounds the folder: the block
  files' bytes, each with :data:`ROW_BYTES` for its rows, and :data:`LEDGER_BYTES` kept free for
  the ledger's files (a sixteenth of the limit where that is less: below the smallest limit
  allowed with 2 MiB blocks).
- **Never evicts what a read in flight needs**: a read pins its blocks (rows of ``pins`` with its
  pid) from the moment it finds or reserves them until it has copied its bytes out.
- **Reads planned ahead wait their turn** (:meth:`BlockCache.prefetch`): a prefetch waits for room
  instead of giving up, so a reader keeps the next batches' blocks fetched ahead in a cache of
  two or three batches. A process holds at most its share of the limit ahead (the limit over the
  live processes with blocks pinned). A read short of room releases this process's holds for
  later reads, newest first, so a process never waits on its own holds; still short after
  :data:`PASS_BY_SECONDS`, it reads the blocks it lacks into memory, checked, keeping none: no
  read waits on another process's read-ahead (a DDP rank waiting at a collective for this one).
- **One download per node**: a block being fetched by a live process is waited for, not
  fetched again (its ledger row is the per-block lock).
- **Content-checked**: a block enters only after it matches the push's index (its size and
  crc32c, or its sha256 in an index written before rlds recorded crc32c); its crc32c is
  recorded, and a process checks a block file against it the first time it reads it. A block that
  fails is reported (:class:`~rlds_cli.errors.CorruptDatasetError` naming the file, hint
  ``rlds gc --remote-cache``), never served. Blocks checked against the push need no re-read of
  the manifest to rule out a replacement: bytes of another version would fail their digest.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np

from rlds_cli._util.io import crc32c
from rlds_cli._util.locks import pid_alive
from rlds_cli.errors import CorruptDatasetError, DiskFullError, RemoteCacheFullError, is_disk_full
from rlds_cli.remote.block_ledger import (
    BLOCKS_DIR,
    LEDGER_BYTES,
    ROW_BYTES,
    USED_SQL,
    BlockLedger,
)
from rlds_cli.remote.store import BlockLayout

#: Bytes of blocks one read holds in memory at once while fetching (memory stays bounded).
FETCH_WINDOW = 256 * 1024 * 1024
#: Seconds a read waits for a block another process is fetching, and a read planned ahead for
#: room, before giving up.
WAIT_SECONDS = 120.0
#: Seconds a read short of room waits for other processes to let go of blocks before it reads
#: the blocks it lacks from the store into memory instead (checked, served, not kept).
PASS_BY_SECONDS = 1.0
#: Seconds between two looks at the ledger while waiting.
POLL_SECONDS = 0.01
#: Bytes of blocks a process keeps in memory from their fetch ahead until their read (served
#: without reading the block file back: a third of a learner core's fetch work).
MEMORY_BYTES = 256 * 1024 * 1024

GC_HINT = "rlds gc --remote-cache {root} removes damaged blocks; the next read fetches them again"

log = logging.getLogger(__name__)


class BlockSource(Protocol):
    """What the cache needs of one pushed version's files (see
    :class:`rlds_cli.remote.files.RemoteFiles`)."""

    #: The version's folder name under ``blocks/``.
    version: str
    #: Bytes of one block (of the push's per-block digests).
    block_bytes: int

    def layout(self, rel: str) -> BlockLayout | None:
        """The file's blocks from the push's index (``None``: no such file)."""
        ...

    def fetch(
        self, rels: Sequence[str], starts: Sequence[int], ends: Sequence[int], *, verify: bool = True
    ) -> list[bytes]:
        """Bytes ``[start, end)`` of each file, from the store, in one batch of requests
        (``verify=False``: unchecked, for a caller that checks each block itself)."""
        ...

    def verify_block(self, rel: str, block: int, data: bytes) -> int:
        """Raise unless ``data`` is block ``block`` of ``rel`` as pushed; its crc32c."""
        ...


@dataclass
class _Block:
    name: str
    rel: str
    index: int
    start: int
    size: int
    crc: int | None = None

    @property
    def charge(self) -> int:
        return charge(self.size)


def charge(size: int) -> int:
    """What a block of ``size`` bytes counts against the limit: its bytes and its rows in the
    ledger (as :data:`USED_SQL` counts them)."""
    return size + ROW_BYTES


#: Every block cache of this process, for :func:`_fresh_in_child`.
_CACHES: weakref.WeakSet[BlockCache] = weakref.WeakSet()


def _fresh_in_child() -> None:
    """A forked child's block caches start as a new process's: unheld locks (another thread of
    the parent may have held one at the fork, and no thread of the child would release it), no
    holds (its parent's pins name the parent's pid) and no block checked yet."""
    for cache in list(_CACHES):
        cache._ledger.renew_in_child()
        cache._held_mutex = threading.Lock()
        cache._held, cache._held_refs, cache._holds, cache._short_reads = 0, {}, {}, 0
        cache._verified, cache._in_memory, cache._in_memory_bytes = {}, {}, 0


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_fresh_in_child)


#: The block cache of each folder and limit in this process (:func:`shared_block_cache`).
_SHARED: weakref.WeakValueDictionary[tuple[str, int], BlockCache] = weakref.WeakValueDictionary()


def shared_block_cache(root: str | os.PathLike[str], limit: int) -> BlockCache:
    """This process's :class:`BlockCache` of the folder ``root`` with ``limit``: the readers of
    one process (a training and a validation loader of one URL) share one, so their holds are one
    process's and a read short of room releases the other's instead of waiting on it."""
    key = (os.path.realpath(Path(root).expanduser()), int(limit))
    cache = _SHARED.get(key)
    if cache is None:
        cache = _SHARED[key] = BlockCache(root, limit)
    return cache


class BlockCache:
    """The block cache in the folder ``root``, holding at most ``limit`` bytes of blocks.

    One object per process and folder is enough; it reopens its ledger in a forked child (a
    DataLoader worker). Threads of one process share it (one ledger change at a time).
    """

    def __init__(self, root: str | os.PathLike[str], limit: int) -> None:
        _CACHES.add(self)
        self.root = Path(root).expanduser()
        self.limit = int(limit)
        #: Bytes the blocks and their rows may take (the limit less room for the ledger's files).
        self.room = self.limit - min(LEDGER_BYTES, self.limit // 16)
        self.folder = self.root / BLOCKS_DIR
        self._ledger = BlockLedger(self.root)
        #: Bytes of blocks pinned ahead of their reads by this process (:meth:`prefetch`), and
        #: each such block's holds and size.
        self._held = 0
        self._held_refs: dict[str, tuple[int, int]] = {}
        self._held_mutex = threading.Lock()
        #: This process's holds not yet released, by number (taken in the order reads are planned).
        self._holds: dict[int, BlockHold] = {}
        self._hold_number = 0
        #: Reads of this process short of room: no prefetch claims room meanwhile.
        self._short_reads = 0
        #: Blocks this process checked against their crc: name -> (inode, mtime, size).
        self._verified: dict[str, tuple[int, int, int]] = {}
        #: Blocks fetched ahead and kept in memory until their hold is released (checked
        #: bytes, at most :data:`MEMORY_BYTES`), by name.
        self._in_memory: dict[str, bytes] = {}
        self._in_memory_bytes = 0
        self._warned_small = False

    def ledger(self) -> contextlib.AbstractContextManager[sqlite3.Connection]:
        """The ledger, in one transaction under the cache-wide lock (:meth:`BlockLedger.transaction`)."""
        return self._ledger.transaction()

    def block_path(self, name: str) -> Path:
        """The file of block ``name``."""
        return self.folder / name

    def _part(self, name: str, pid: int) -> Path:
        return self.folder / f"{name}.part.{pid}"

    def reclaim_dead(self, db: sqlite3.Connection) -> list[str]:
        """Remove the reservations and pins of dead processes (their ``.part`` files first)."""
        gone: list[str] = []
        me = os.getpid()  # alive: its own rows are no dead process's (and need no look at /proc)
        for name, owner in db.execute("SELECT name, owner FROM blocks WHERE ready = 0").fetchall():
            if owner != me and not pid_alive(owner):
                self._part(name, owner).unlink(missing_ok=True)
                self.block_path(name).unlink(missing_ok=True)  # renamed, but never marked ready
                db.execute("DELETE FROM blocks WHERE name = ?", (name,))
                gone.append(name)
        for (pid,) in db.execute("SELECT DISTINCT pid FROM pins").fetchall():
            if pid != me and not pid_alive(pid):
                db.execute("DELETE FROM pins WHERE pid = ?", (pid,))
        return gone

    def used_bytes(self) -> int:
        """Bytes the ledger counts: ready blocks and reservations, each with its rows (what
        :attr:`room` bounds)."""
        with self.ledger() as db:
            return int(db.execute(USED_SQL).fetchone()[0])

    # ------------------------------------------------------------------ reads

    def read_ranges(
        self, source: BlockSource, rels: Sequence[str], starts: Sequence[int], ends: Sequence[int]
    ) -> list[bytes]:
        """Bytes ``[start, end)`` of each file, from cached blocks (the missing ones fetched
        first, together, and checked against the push).

        A read whose blocks pass half the limit is served in passes of at most that many bytes,
        each pass's blocks pinned only while read: any read fits any limit of a block or more.

        Raises:
            RemoteCacheFullError: A block another process is fetching stayed unfinished past
                :data:`WAIT_SECONDS`.
            CorruptDatasetError: A cached block fails its checksum (names it), or the store's
                bytes differ from the push.
        """
        blocks = self._blocks_of(source, rels, starts, ends)
        budget = max(charge(source.block_bytes), self.room // 2)
        if sum(b.charge for b in blocks.values()) > budget:
            return self._read_in_passes(source, blocks, budget, rels, starts, ends)
        passed = self.ensure(source, list(blocks.values()))
        try:
            return self._slices(blocks, source, rels, starts, ends, passed)
        finally:
            self._unpin([name for name in blocks if name not in passed])

    def _read_in_passes(
        self,
        source: BlockSource,
        blocks: dict[str, _Block],
        budget: int,
        rels: Sequence[str],
        starts: Sequence[int],
        ends: Sequence[int],
    ) -> list[bytes]:
        """:meth:`read_ranges` of a read larger than ``budget`` bytes of blocks: the blocks in
        file order, in passes of at most ``budget`` bytes; each range's pieces joined at the end."""
        passes = _windows(sorted(blocks.values(), key=lambda b: (b.rel, b.index)), budget)
        pass_of = {(b.rel, b.index): k for k, group in enumerate(passes) for b in group}
        by_rel = {(b.rel, b.index): b for b in blocks.values()}
        # each range cut at block edges: (pass, range, piece start, piece end)
        cuts: list[tuple[int, int, int, int]] = []
        spans = _spans(source, rels, starts, ends)
        for k, (rel, start, end, span) in enumerate(zip(rels, starts, ends, spans, strict=True)):
            start, end = int(start), int(end)
            for index in span:
                block = by_rel[(rel, index)]
                lo, hi = max(start, block.start), min(end, block.start + block.size)
                cuts.append((pass_of[(rel, index)], k, lo, hi))
        pieces: list[list[bytes]] = [[] for _ in rels]
        cuts.sort()
        at = 0
        for k, group in enumerate(passes):
            mine = {b.name: b for b in group}
            todo: list[tuple[int, int, int]] = []
            while at < len(cuts) and cuts[at][0] == k:
                todo.append(cuts[at][1:])
                at += 1
            passed = self.ensure(source, group)
            try:
                got = self._slices(mine, source, [rels[r] for r, _, _ in todo], [lo for _, lo, _ in todo],
                                   [hi for _, _, hi in todo], passed)  # fmt: skip
            finally:
                self._unpin([name for name in mine if name not in passed])
            for (r, _, _), data in zip(todo, got, strict=True):
                pieces[r].append(data)  # passes run in file order: a range's pieces come in order
        return [p[0] if len(p) == 1 else b"".join(p) for p in pieces]

    def prefetch(self, source: BlockSource, rels: Sequence[str], starts: Sequence[int],
                 ends: Sequence[int], stop: threading.Event | None = None) -> BlockHold | None:  # fmt: skip
        """Fetch the blocks of these ranges no process has (checked against the push) and pin
        them with the ones present, without reading them.

        Waits (up to :data:`WAIT_SECONDS`, or until ``stop`` is set) while this process's holds
        plus these would pass its share (:meth:`hold_share`), or while the cache has no room.
        Returns the hold (:meth:`BlockHold.release` it once its read is done), or ``None`` when
        the blocks alone pass the share or the wait ended (the read then fetches what it needs).
        Blocks another process is fetching are left for the read to wait for."""
        blocks = list(self._blocks_of(source, rels, starts, ends).values())
        deadline = time.monotonic() + WAIT_SECONDS
        wait = stop.wait if stop is not None else time.sleep
        share = self.hold_share()

        def given_up() -> bool:
            return (stop is not None and stop.is_set()) or time.monotonic() > deadline

        while True:
            with self._held_mutex:  # a block two holds share counts once
                need = sum(b.charge for b in blocks if b.name not in self._held_refs)
                if need > share:
                    self._too_small(need, share)
                    return None
                if self._held + need <= share and not self._short_reads:
                    self._held += need
                    for b in blocks:
                        count, size = self._held_refs.get(b.name, (0, b.charge))
                        self._held_refs[b.name] = (count + 1, size)
                    self._hold_number += 1
                    hold = BlockHold(self, [], [b.name for b in blocks], self._hold_number)
                    self._holds[hold.number] = hold  # a read short of room may release it already
                    break
            if given_up():
                return None
            wait(POLL_SECONDS)
        try:
            todo = {b.name: b for b in blocks}
            while True:
                mine, waiting, no_room = self._claim(todo, reserve=not self._short_reads)
                reserved = [b.name for b in mine]
                pinned = [name for name in todo if name not in waiting and name not in reserved]  # ready
                try:
                    if mine:  # reserved: fetched even if the hold is let go meanwhile
                        hold.fetched += self._download(source, mine, hold)
                        pinned += reserved  # a failed download drops their reservations and pins itself
                finally:
                    with self._held_mutex:
                        let_go = hold.released
                        if not let_go:
                            hold.names += pinned
                    if let_go:  # released by a read short of room: these pins are this call's to undo
                        self._unpin(pinned)
                todo = {name: todo[name] for name in waiting}
                if let_go or not no_room or given_up():  # what is left another process is fetching
                    break
                wait(POLL_SECONDS)
        except BaseException:
            hold.release()
            raise
        return hold

    def hold_share(self) -> int:
        """Bytes this process may hold ahead of its reads: the limit split evenly with the other
        live processes that have blocks pinned (DataLoader workers, the ranks of a node)."""
        me = os.getpid()
        with self.ledger() as db:
            pids = {int(pid) for (pid,) in db.execute("SELECT DISTINCT pid FROM pins")}
        others = sum(1 for pid in pids - {me} if pid_alive(pid))
        return self.room // (others + 1)

    def _too_small(self, need: int, share: int) -> None:
        """Say once (a logged warning) that reads planned ahead cannot be held: each then waits
        for the store, at the store's latency."""
        if not self._warned_small:
            self._warned_small = True
            log.warning(
                "the remote cache %s (limit %s bytes) lets this process hold %s bytes of blocks ahead "
                "of its reads, and a read planned ahead needs %s: reads are not planned ahead, each "
                "waits for the store; give cache_limit at least %s bytes per process reading it "
                "(two reads' worth)",
                self.root, f"{self.limit:,}", f"{share:,}", f"{need:,}", f"{2 * need:,}",
            )  # fmt: skip

    def _release_newest_hold(self) -> bool:
        """Release the newest hold of this process (for the read planned furthest ahead);
        ``False`` when it has none."""
        with self._held_mutex:
            if not self._holds:
                return False
            hold = self._holds[max(self._holds)]
        hold.release()
        return True

    def _blocks_of(
        self, source: BlockSource, rels: Sequence[str], starts: Sequence[int], ends: Sequence[int]
    ) -> dict[str, _Block]:
        found: dict[str, set[int]] = {}  # the blocks of each file, by number
        for rel, span in zip(rels, _spans(source, rels, starts, ends), strict=True):
            if span:
                found.setdefault(rel, set()).update(span)
        out: dict[str, _Block] = {}
        for rel, numbers in found.items():
            layout = source.layout(rel)
            assert layout is not None  # _spans checked it
            for b in sorted(numbers):
                name = f"{source.version}/{layout.tag}.{b}"
                out[name] = _Block(name, rel, b, *layout.bounds(b))
        return out

    def ensure(self, source: BlockSource, blocks: list[_Block]) -> dict[str, bytes]:
        """Pin every one of ``blocks``, fetching those no process has; the caller unpins them
        (:meth:`_unpin`) once done (on an error nothing stays pinned). Short of room, it releases
        this process's holds for later reads; still short after :data:`PASS_BY_SECONDS`, it reads
        the missing blocks into memory (checked, never written) and returns them by name, unpinned."""
        need = sum(b.charge for b in blocks)
        if need > self.room:
            raise RemoteCacheFullError(
                f"the remote cache {self.root} is limited to {self.limit:,} bytes ({self.room:,} for "
                f"blocks), and one read needs {need:,} bytes of blocks of {source.block_bytes:,} bytes"
            )
        todo = {b.name: b for b in blocks}
        passed: dict[str, bytes] = {}
        deadline = time.monotonic() + WAIT_SECONDS
        short_since: float | None = None
        pinned: list[str] = []
        try:
            while todo:
                mine, waiting, no_room = self._claim(todo)
                reserved = [b.name for b in mine]
                pinned += [name for name in todo if name not in waiting and name not in reserved]
                if mine:
                    self._download(source, mine)  # on failure it drops their reservations and pins
                    pinned += reserved
                for name in [n for n in todo if n not in waiting]:
                    todo.pop(name)
                if no_room and self._release_for_room(todo):
                    continue
                if no_room:
                    short_since = time.monotonic() if short_since is None else short_since
                    if time.monotonic() - short_since >= PASS_BY_SECONDS:
                        passed.update(self._read_past(source, no_room))
                        for b in no_room:
                            todo.pop(b.name, None)
                        continue
                else:
                    short_since = None
                if todo:
                    if time.monotonic() > deadline:
                        raise RemoteCacheFullError(
                            f"the remote cache {self.root} ({self.limit:,} bytes): blocks another process "
                            f"is fetching stayed unfinished for {WAIT_SECONDS:g} s"
                        )
                    time.sleep(POLL_SECONDS)
        except BaseException:
            self._unpin(pinned)
            raise
        return passed

    def _read_past(self, source: BlockSource, blocks: list[_Block]) -> dict[str, bytes]:
        """``blocks`` read from the store into memory, each checked against the push, none kept
        (the cache has no room for them)."""
        return {b.name: data for window in _windows(blocks) for b, data in _fetch_checked(source, window)}

    def _release_for_room(self, todo: dict[str, _Block]) -> bool:
        """Release this process's holds for later reads, newest first, until ``todo`` fits or none
        is left (prefetches claim no room meanwhile). Returns whether to claim again at once."""
        with self._held_mutex:
            self._short_reads += 1
        try:
            released = False
            while self._release_newest_hold():
                released = True
                with self.ledger() as db:
                    if self._room(db, todo):
                        break
            return released
        finally:
            with self._held_mutex:
                self._short_reads -= 1

    def _room(self, db: sqlite3.Connection, todo: dict[str, _Block]) -> bool:
        """Whether the blocks of ``todo`` not in the ledger would fit (evicting unpinned ones)."""
        known = {row[0] for row in db.execute(
            f"SELECT name FROM blocks WHERE name IN ({','.join('?' * len(todo))})", list(todo)
        )}  # fmt: skip
        return self._make_room(
            db, sum(b.charge for name, b in todo.items() if name not in known), evict=False
        )

    def _claim(
        self, todo: dict[str, _Block], reserve: bool = True
    ) -> tuple[list[_Block], set[str], list[_Block]]:
        """Under the lock: pin the ready blocks of ``todo`` (their use noted); reserve and pin the
        absent ones for this process to fetch (all or none, evicting LRU unpinned blocks; none
        when ``reserve`` is false). Returns (blocks to fetch, names to wait for, absent blocks that
        found no room, also among those names)."""
        pid, now = os.getpid(), time.time()
        with self.ledger() as db:
            self.reclaim_dead(db)
            absent: list[_Block] = []
            waiting: set[str] = set()
            for name, block in todo.items():
                row = db.execute("SELECT ready, crc32c FROM blocks WHERE name = ?", (name,)).fetchone()
                if row is not None and row[0] and not self.block_path(name).is_file():
                    # evicted by a process killed before its ledger change was committed
                    db.execute("DELETE FROM blocks WHERE name = ?", (name,))
                    row = None
                if row is None:
                    absent.append(block)
                elif row[0]:
                    block.crc = int(row[1])
                    db.execute("UPDATE blocks SET used = ? WHERE name = ?", (now, name))
                    _pin(db, name, pid)
                else:
                    waiting.add(name)  # another live process is fetching it
            if not absent:
                return [], waiting, []
            if not reserve or not self._make_room(db, sum(b.charge for b in absent)):
                return [], waiting | {b.name for b in absent}, absent
            for b in absent:
                db.execute("INSERT INTO blocks VALUES (?, ?, ?, ?, 0, NULL)", (b.name, b.size, now, pid))
                _pin(db, b.name, pid)
            return absent, waiting, []

    def _make_room(self, db: sqlite3.Connection, need: int, *, evict: bool = True) -> bool:
        """Evict least recently used unpinned ready blocks until ``need`` more bytes fit
        (``evict=False``: only say whether they would)."""
        used = int(db.execute(USED_SQL).fetchone()[0])
        if used + need <= self.room:
            return True
        victims = db.execute(
            "SELECT name, size FROM blocks WHERE ready = 1 AND name NOT IN (SELECT name FROM pins) "
            "ORDER BY used"
        )
        chosen: list[tuple[str, int]] = []
        for name, size in victims:
            if used + need <= self.room:
                break
            chosen.append((name, int(size)))
            used -= charge(int(size))
        if used + need > self.room or not evict:
            return used + need <= self.room
        for name, _ in chosen:
            # the file goes first: a kill before the commit leaves a row without a file, counted
            # (never more than is there), dropped when next read
            self.block_path(name).unlink(missing_ok=True)
            db.execute("DELETE FROM blocks WHERE name = ?", (name,))
            self._verified.pop(name, None)
        return True

    def _download(self, source: BlockSource, blocks: list[_Block], hold: BlockHold | None = None) -> int:
        """Fetch ``blocks`` (reserved by this process), check each against the push, write it via
        its ``.part`` file and mark it ready (``hold``: keep its bytes in memory for the read it
        was fetched for, within :data:`MEMORY_BYTES`); on failure drop the reservations not yet
        ready."""
        pid = os.getpid()
        done: set[str] = set()
        fetched = 0
        try:
            for window in _windows(sorted(blocks, key=lambda b: (b.rel, b.index))):
                ready: list[tuple[str, int]] = []
                for b, data in _fetch_checked(source, window):
                    part = self._part(b.name, pid)
                    try:
                        part.parent.mkdir(parents=True, exist_ok=True)
                        with open(part, "wb") as fh:
                            fh.write(data)
                    except OSError as exc:  # not the store's damage: this disk's room
                        if is_disk_full(exc):
                            raise DiskFullError(
                                f"no space left on the disk of the remote cache {self.root} for a block",
                                hint="free space on that disk, or give a smaller cache_limit "
                                "(RLDS_REMOTE_CACHE_LIMIT) than the disk holds",
                            ) from None
                        raise
                    final = self.block_path(b.name)
                    os.replace(part, final)
                    # checked against the push as it was written: this process need not read it back
                    st = os.stat(final)
                    self._verified[b.name] = (st.st_ino, st.st_mtime_ns, st.st_size)
                    assert b.crc is not None  # set by _fetch_checked
                    ready.append((b.name, b.crc))
                    if hold is not None:
                        self._keep(hold, b.name, data)
                    fetched += len(data)
                with self.ledger() as db:
                    for name, crc in ready:
                        db.execute(
                            "UPDATE blocks SET ready = 1, owner = 0, crc32c = ? WHERE name = ?", (crc, name)
                        )
                done.update(name for name, _ in ready)
        finally:
            left = [b.name for b in blocks if b.name not in done]
            if left:
                with self.ledger() as db:
                    for name in left:
                        self._part(name, pid).unlink(missing_ok=True)
                        self.block_path(name).unlink(missing_ok=True)
                        db.execute("DELETE FROM blocks WHERE name = ? AND owner = ?", (name, pid))
                        db.execute("DELETE FROM pins WHERE name = ? AND pid = ?", (name, pid))
        return fetched

    def _unpin(self, names: list[str]) -> None:
        if not names:
            return
        pid = os.getpid()
        with self.ledger() as db:
            for name in names:
                db.execute("UPDATE pins SET n = n - 1 WHERE name = ? AND pid = ?", (name, pid))
            db.execute("DELETE FROM pins WHERE pid = ? AND n <= 0", (pid,))

    def _slices(
        self,
        blocks: dict[str, _Block],
        source: BlockSource,
        rels: Sequence[str],
        starts: Sequence[int],
        ends: Sequence[int],
        passed: dict[str, bytes],
    ) -> list[bytes]:
        """The bytes of each range, read from its (pinned, checked) block files, or from
        ``passed``: blocks read into memory, by name."""
        by_rel: dict[tuple[str, int], _Block] = {(b.rel, b.index): b for b in blocks.values()}
        fds: dict[str, int] = {}
        try:
            out = []
            for rel, start, end, span in zip(
                rels, starts, ends, _spans(source, rels, starts, ends), strict=True
            ):
                start, end = int(start), int(end)
                if not span:
                    out.append(b"")
                    continue
                pieces = []
                for b in span:
                    block = by_rel[(rel, b)]
                    lo = max(start, block.start) - block.start
                    hi = min(end, block.start + block.size) - block.start
                    data = passed.get(block.name, self._in_memory.get(block.name))
                    if data is not None:
                        pieces.append(data[lo:hi])
                        continue
                    fd = fds.get(block.name)
                    if fd is None:
                        fd = fds[block.name] = self._open_checked(block)
                    piece = os.pread(fd, hi - lo, lo)
                    if len(piece) != hi - lo:
                        raise self._damaged(block.name, "is shorter than the block fetched")
                    pieces.append(piece)
                out.append(pieces[0] if len(pieces) == 1 else b"".join(pieces))
            return out
        finally:
            for fd in fds.values():
                os.close(fd)

    def _keep(self, hold: BlockHold, name: str, data: bytes) -> None:
        with self._held_mutex:  # a hold already let go (its read short of room) keeps nothing
            fits = self._in_memory_bytes + len(data) <= MEMORY_BYTES
            if not hold.released and name not in self._in_memory and fits:
                self._in_memory[name] = data
                self._in_memory_bytes += len(data)
                hold.kept.append(name)

    def _open_checked(self, block: _Block) -> int:
        """An open descriptor of ``block``'s file, checked against its crc32c the first time this
        process reads that very file."""
        path = self.block_path(block.name)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise self._damaged(block.name, "is missing, though the cache's ledger lists it") from None
        st = os.fstat(fd)
        stamp = (st.st_ino, st.st_mtime_ns, st.st_size)
        if self._verified.get(block.name) != stamp:
            data = os.pread(fd, block.size + 1, 0)
            if len(data) != block.size or crc32c(data) != block.crc:
                os.close(fd)
                raise self._damaged(block.name, "differs from the block fetched (its checksum fails)")
            self._verified[block.name] = stamp
        return fd

    def _damaged(self, name: str, what: str) -> CorruptDatasetError:
        return CorruptDatasetError(
            f"remote cache block {self.block_path(name)} {what}", hint=GC_HINT.format(root=self.root)
        )


class BlockHold:
    """Blocks pinned ahead of a read by :meth:`BlockCache.prefetch` (never evicted until
    released)."""

    def __init__(self, cache: BlockCache, names: list[str], counted: list[str], number: int = 0) -> None:
        self.cache = cache
        #: Its place among the process's holds (later reads: higher).
        self.number = number
        #: The blocks pinned (those another process was still fetching are not).
        self.names = names
        self._counted = counted
        #: Bytes this prefetch fetched from the store.
        self.fetched = 0
        #: Its blocks the cache keeps in memory until it is released.
        self.kept: list[str] = []
        self._released = False

    @property
    def released(self) -> bool:
        """Whether its blocks were let go (by :meth:`release`, or by a read short of room)."""
        return self._released

    def release(self) -> None:
        """Unpin the blocks (once; a second call does nothing)."""
        cache = self.cache
        with cache._held_mutex:
            if self._released:
                return
            self._released = True
            cache._holds.pop(self.number, None)
        try:
            cache._unpin(self.names)
        finally:
            with cache._held_mutex:
                for name in self.kept:
                    data = cache._in_memory.pop(name, None)
                    cache._in_memory_bytes -= len(data) if data is not None else 0
                for name in self._counted:
                    if name not in cache._held_refs:  # a forked child's copy: it counts none
                        continue
                    count, size = cache._held_refs[name]
                    if count > 1:
                        cache._held_refs[name] = (count - 1, size)
                    else:
                        del cache._held_refs[name]
                        cache._held -= size


def _pin(db: sqlite3.Connection, name: str, pid: int) -> None:
    db.execute(
        "INSERT INTO pins VALUES (?, ?, 1) ON CONFLICT(name, pid) DO UPDATE SET n = n + 1", (name, pid)
    )


def _spans(
    source: BlockSource, rels: Sequence[str], starts: Sequence[int], ends: Sequence[int]
) -> list[range]:
    """The numbers of the blocks each range ``[start, end)`` lies in (an empty range: none), found
    in one search per file."""
    out: list[range] = [range(0)] * len(rels)
    of_file: dict[str, list[int]] = {}
    for k, (rel, start, end) in enumerate(zip(rels, starts, ends, strict=True)):
        if end > start:
            of_file.setdefault(rel, []).append(k)
    for rel, ks in of_file.items():
        layout = source.layout(rel)
        if layout is None:
            raise CorruptDatasetError(f"{rel} is not a file of the pushed version {source.version}")
        bad = [k for k in ks if int(starts[k]) < 0 or int(ends[k]) > layout.size]
        if bad:  # offsets (a frame file's ends, a shard index) that point past the file
            k = bad[0]
            raise CorruptDatasetError(
                f"{rel} of the pushed version {source.version} is asked for bytes {int(starts[k])}-"
                f"{int(ends[k])}, past its {layout.size:,} bytes"
            )
        firsts, stops = layout.spans(np.asarray([starts[k] for k in ks], np.int64),
                                     np.asarray([ends[k] for k in ks], np.int64))  # fmt: skip
        for k, first, stop in zip(ks, firsts.tolist(), stops.tolist(), strict=True):
            out[k] = range(first, stop)
    return out


def _windows(blocks: list[_Block], most: int = FETCH_WINDOW) -> list[list[_Block]]:
    """``blocks`` cut into runs of at most ``most`` bytes (a block larger alone is one run)."""
    out: list[list[_Block]] = [[]]
    total = 0
    for b in blocks:
        if out[-1] and total + b.charge > most:
            out.append([])
            total = 0
        out[-1].append(b)
        total += b.charge
    return [w for w in out if w]


def _fetch_checked(source: BlockSource, blocks: list[_Block]) -> list[tuple[_Block, bytes]]:
    """``blocks`` from the store in one batch of requests (the store's reader merges neighbours
    of one file), each checked against the push's index (its crc32c set)."""
    blocks = sorted(blocks, key=lambda b: (b.rel, b.index))
    ends = [b.start + b.size for b in blocks]
    # each block is checked here (its crc kept), so the fetch does not check it again
    blobs = source.fetch([b.rel for b in blocks], [b.start for b in blocks], ends, verify=False)
    for b, data in zip(blocks, blobs, strict=True):
        b.crc = source.verify_block(b.rel, b.index, data)
    return list(zip(blocks, blobs, strict=True))
