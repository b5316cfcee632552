"""``rlds gc --remote-cache DIR``: a block cache folder cleaned under its lock (what dead
processes left, blocks that fail their crc32c, files no ledger counts), with a report."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlds_cli._util.io import crc32c
from rlds_cli._util.locks import pid_alive
from rlds_cli.errors import RemoteCacheDamagedError
from rlds_cli.remote.block_cache import BlockCache
from rlds_cli.remote.block_ledger import BLOCKS_DIR, LEDGER_FILE, LOCK_FILE

#: A pushed version's folder (the URL's hash and the manifest's), in the file and block caches.
VERSION_FOLDER = re.compile(r"[0-9a-f]{16}-[0-9a-f]{16}")
#: A whole file being fetched: ``<rel>.<pid>.<tag>.part`` (:class:`~rlds_cli.remote.files.RemoteFiles`).
FILE_PART = re.compile(r".+\.(\d+)\.[0-9a-f]{8}\.part")
#: What rlds writes at the top of a cache folder besides version folders (SQLite's side files too).
_OWN = {BLOCKS_DIR, LOCK_FILE, *(LEDGER_FILE + end for end in ("", "-wal", "-shm", "-journal"))}


@dataclass
class GcReport:
    """What :func:`gc_blocks` did to one cache folder."""

    folder: str
    blocks: int = 0
    bytes: int = 0
    reclaimed: list[str] = field(default_factory=list)
    damaged: list[str] = field(default_factory=list)
    #: Block files no ledger counts (the ledger was lost or replaced).
    unledgered: list[str] = field(default_factory=list)
    freed_bytes: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "folder": self.folder, "blocks": self.blocks, "bytes": self.bytes,
            "reclaimed": self.reclaimed, "damaged": self.damaged, "unledgered": self.unledgered,
            "freed_bytes": self.freed_bytes,
        }  # fmt: skip


def gc_blocks(root: str | os.PathLike[str], *, dry_run: bool = False) -> GcReport:
    """Clean the remote cache folder ``root``: reclaim what dead processes left (reservations,
    ``.part`` files, pins; the whole-file cache's ``.part`` files too), check every block against
    its recorded crc32c and remove the damaged ones, drop ledger rows whose file is gone and
    files the ledger does not know. The ledger is changed under the cache-wide lock; the blocks
    are read outside it (readers are not held up by the scan). ``dry_run`` reports what it would
    remove and changes nothing."""
    cache = BlockCache(root, 0)
    report = GcReport(str(cache.root))

    def remove(path: Path) -> None:
        if not dry_run:
            path.unlink(missing_ok=True)

    if not cache.root.is_dir():
        if cache.root.exists():
            raise RemoteCacheDamagedError(f"the remote cache {cache.root} is not a folder")
        return report
    _refuse_foreign(cache.root)
    versions = [p for p in cache.root.iterdir() if p.is_dir() and VERSION_FOLDER.fullmatch(p.name)]
    for part in sorted(p for version in versions for p in version.rglob("*.part")):  # whole files
        match = FILE_PART.fullmatch(part.name)
        if match and part.is_file() and not pid_alive(int(match[1])):
            report.freed_bytes += part.stat().st_size
            remove(part)
            report.reclaimed.append(str(part))
    if not os.path.lexists(cache.root / LEDGER_FILE):  # no ledger: no block file is counted
        if cache.folder.is_dir():
            for path in sorted(p for p in cache.folder.rglob("*") if p.is_file()):
                report.freed_bytes += path.stat().st_size
                remove(path)
                report.unledgered.append(str(path))
        return report
    with cache.ledger() as db:
        if dry_run:
            dead = db.execute("SELECT name, owner FROM blocks WHERE ready = 0").fetchall()
            report.reclaimed += [str(cache.block_path(n)) for n, owner in dead if not pid_alive(owner)]
        else:
            report.reclaimed += [str(cache.block_path(n)) for n in cache.reclaim_dead(db)]
        ready = db.execute("SELECT name, size, crc32c FROM blocks WHERE ready = 1").fetchall()
    # every block read outside the lock (readers go on meanwhile); what fails is checked again
    # under it, against the ledger as it is then (a block evicted and fetched again is new)
    suspects = [(name, size, crc) for name, size, crc in ready if not _intact(cache, name, size, crc)]
    with cache.ledger() as db:
        gone: set[str] = set()
        for name, size, crc in suspects:
            row = db.execute(
                "SELECT size, crc32c FROM blocks WHERE name = ? AND ready = 1", (name,)
            ).fetchone()
            if row is None or tuple(row) != (size, crc) or _intact(cache, name, size, crc):
                continue
            gone.add(name)
            path = cache.block_path(name)
            if path.is_file():
                report.damaged.append(str(path))
                report.freed_bytes += path.stat().st_size
                remove(path)
            if not dry_run:
                db.execute("DELETE FROM blocks WHERE name = ?", (name,))
                db.execute("DELETE FROM pins WHERE name = ?", (name,))
        for name, size in db.execute("SELECT name, size FROM blocks WHERE ready = 1").fetchall():
            if name not in gone:  # a dry run leaves the damaged rows
                report.blocks += 1
                report.bytes += size
        known = {name for (name,) in db.execute("SELECT name FROM blocks")}
        owners = {int(o) for (o,) in db.execute("SELECT DISTINCT owner FROM blocks WHERE ready = 0")}
        if cache.folder.is_dir():
            for path in sorted(p for p in cache.folder.rglob("*") if p.is_file()):
                rel = path.relative_to(cache.folder).as_posix()
                stem, _, pid = rel.rpartition(".part.")
                if stem and pid.isdigit() and int(pid) in owners:
                    continue  # a live fetch's part
                if rel not in known:
                    report.freed_bytes += path.stat().st_size
                    remove(path)
                    (report.reclaimed if stem and pid.isdigit() else report.unledgered).append(str(path))
    return report


def _refuse_foreign(root: Path) -> None:
    """Refuse a folder holding what rlds never writes in a remote cache (a mistyped path: its
    files would be taken for leftovers and removed)."""
    foreign = [p.name for p in root.iterdir() if p.name not in _OWN and not VERSION_FOLDER.fullmatch(p.name)]
    blocks = root / BLOCKS_DIR
    if blocks.is_dir():
        inside = [p.name for p in blocks.iterdir() if not VERSION_FOLDER.fullmatch(p.name)]
        foreign += [f"{BLOCKS_DIR}/{name}" for name in inside]
    if foreign:
        shown = ", ".join(repr(name) for name in sorted(foreign)[:3]) + (", ..." if len(foreign) > 3 else "")
        raise RemoteCacheDamagedError(
            f"{root} is not an rlds remote cache: it holds {shown}, which rlds never writes there; "
            "nothing was removed",
            hint="pass the folder given as cache=DIR or $RLDS_REMOTE_CACHE (it holds blocks/, "
            "blocks.db and folders named <hash>-<hash>)",
        )


def _intact(cache: BlockCache, name: str, size: int, crc: int) -> bool:
    """Whether block ``name``'s file has the size and crc32c the ledger recorded (a missing file
    is not: its row goes)."""
    try:
        data = cache.block_path(name).read_bytes()
    except FileNotFoundError:
        return False
    return len(data) == size and crc32c(data) == crc
