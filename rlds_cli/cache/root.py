"""The cache root on disk: where datasets live (see :mod:`rlds_cli.cache.layout` for every
path), how they are locked, published, replaced, recovered and removed.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

from rlds_cli import settings
from rlds_cli._util.io import atomic_write, fsync_dir
from rlds_cli._util.locks import FileLock, Timeout
from rlds_cli.cache.layout import (
    BUILD_SUFFIX,
    JOURNAL_SUFFIX,
    MANIFEST_FILE,
    TRASH_SUFFIX,
    CacheLayout,
    entry_name,
    tmp_owner,
    validate_name,
)
from rlds_cli.cache.manifest import Manifest, read_manifest
from rlds_cli.errors import (
    CacheLocationError,
    CorruptDatasetError,
    DatasetExistsError,
    DatasetNotFoundError,
    LockTimeoutError,
)

# Locks are rlds_cli._util.locks' (fcntl.flock on POSIX, as filelock's): filelock costs ~16 ms
# to import, and processes that only read datasets (the workers of 'rlds preprocess') never lock.

logger = logging.getLogger(__name__)

_BUILD_SUFFIXES = (BUILD_SUFFIX, TRASH_SUFFIX)

__all__ = ["CacheRoot", "exchange_paths", "validate_name"]


_RENAME_EXCHANGE = 2  # linux/fs.h
_AT_FDCWD = -100


def exchange_paths(a: Path, b: Path) -> bool:
    """Swap two directory entries in one atomic step (Linux ``renameat2(RENAME_EXCHANGE)``).

    Returns:
        ``False`` where the OS or filesystem has no atomic exchange (nothing was changed);
        the caller then falls back to a journalled pair of renames.
    """
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):  # not glibc >= 2.28, or not Linux
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


class CacheRoot:
    """The local cache: a directory of converted datasets.

    Args:
        root: Explicit root directory; ``None`` uses ``$RLDS_HOME`` or the user cache dir.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.path = settings.cache_root(root)
        self.layout = CacheLayout(self.path)
        if self.path.exists() and not self.path.is_dir():
            raise CacheLocationError(f"the cache root {self.path} is a file, not a directory")

    def __repr__(self) -> str:
        return f"CacheRoot({str(self.path)!r})"

    @property
    def datasets_dir(self) -> Path:
        return self.layout.datasets_dir

    @property
    def tmp_dir(self) -> Path:
        return self.layout.tmp_dir

    @property
    def locks_dir(self) -> Path:
        return self.layout.locks_dir

    def dataset_dir(self, name: str) -> Path:
        """The directory a dataset of this name is (or would be) published at."""
        return self.layout.dataset_dir(name)

    def exists(self, name: str) -> bool:
        """Whether a complete dataset of this name is published."""
        return (self.dataset_dir(name) / MANIFEST_FILE).is_file()

    def manifest(self, name: str) -> Manifest:
        """The manifest of a published dataset; raises :class:`DatasetNotFoundError`."""
        directory = self.dataset_dir(name)
        try:
            return read_manifest(directory)
        except FileNotFoundError:
            pass
        if self._recover_if_journalled(name):
            return self.manifest(name)
        raise DatasetNotFoundError(f"no dataset named {name!r} in the cache at {self.path}")

    def _recover_if_journalled(self, name: str) -> bool:
        """A reader that finds a name missing while a crashed replacement of it has a journal
        finishes that replacement (when no writer holds the name) and says so."""
        entry = entry_name(name)
        if not self.tmp_dir.is_dir() or not any(self.tmp_dir.glob(f"{entry}.*{JOURNAL_SUFFIX}")):
            return False
        try:
            self.recover()
        except OSError:
            return False
        return (self.dataset_dir(name) / MANIFEST_FILE).is_file()

    def iter_manifests(self) -> Iterator[Manifest]:
        """Manifests of every published dataset, sorted by name (unreadable ones skipped)."""
        if not self.datasets_dir.is_dir():
            return
        for child in sorted(self.datasets_dir.iterdir()):
            if not (child / MANIFEST_FILE).is_file():
                continue
            try:
                yield read_manifest(child)
            except CorruptDatasetError:
                continue

    def damaged_manifests(self) -> list[tuple[str, CorruptDatasetError]]:
        """The published datasets whose manifest cannot be read (those :meth:`iter_manifests`
        skips), by directory name, with the error reading it gives."""
        damaged = []
        if self.datasets_dir.is_dir():
            for child in sorted(self.datasets_dir.iterdir()):
                if (child / MANIFEST_FILE).is_file():
                    try:
                        read_manifest(child)
                    except CorruptDatasetError as exc:
                        damaged.append((child.name, exc))
        return damaged

    def lock(self, name: str, timeout: float = -1) -> FileLock:
        """The inter-process lock that serializes writers of one dataset name.

        Args:
            name: Dataset name.
            timeout: Seconds to wait when acquired; ``-1`` waits forever (a timeout raises
                :class:`~rlds_cli._util.locks.Timeout`).
        """
        return FileLock(self.layout.lock_file(entry_name(name)), timeout=timeout)

    def new_build_dir(self, name: str) -> Path:
        """Create an empty private directory to build a dataset in (same filesystem as the
        final location, so publishing is a rename)."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        path = self.layout.build_dir(entry_name(name))
        path.mkdir()
        return path

    def clean_stale_builds(self, held: str | None = None, *, dry_run: bool = False) -> list[Path]:
        """Remove temporary build and trash directories whose writer is gone.

        A build belongs to a live writer exactly when that writer holds the name's lock, so an
        entry whose lock can be taken at once is stale (its process was killed).

        Args:
            held: A dataset name whose lock the caller holds: its leftovers are stale by
                definition (a second lock of the same file from this process would not succeed).
            dry_run: Only find them; remove nothing.

        Returns:
            The directories removed (or, with ``dry_run``, that would be).
        """
        removed: list[Path] = []
        if not self.tmp_dir.is_dir():
            return removed
        if not dry_run:  # a journalled replacement needs its build and trash: finish it first
            if held is not None:
                self.recover(entry_name(held))
            self.recover()
        # entries whose replacement could not be finished (dry run, or a live writer holds them)
        pending = {tmp_owner(p) for p in self.tmp_dir.glob(f"*{JOURNAL_SUFFIX}")}
        for child in sorted(self.tmp_dir.iterdir()):
            if not child.name.endswith(_BUILD_SUFFIXES) or tmp_owner(child) in pending:
                continue
            entry = tmp_owner(child)
            if held is not None and entry == entry_name(held):
                if not dry_run:
                    shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
                continue
            try:
                with FileLock(self.layout.lock_file(entry), timeout=0):
                    if not dry_run:
                        logger.info("removing stale build %s", child)
                        shutil.rmtree(child, ignore_errors=True)
                    removed.append(child)
            except Timeout:
                continue  # a live writer owns it
        return removed

    def publish(self, build_dir: Path, name: str, *, replace: bool, fsync: bool) -> Path:
        """Move a finished build into place. The caller must hold ``lock(name)``.

        A replacement never passes through a moment where neither version can be found: the
        new build and the old version are swapped in one atomic step where the OS can
        (after which the old version sits at ``build_dir`` and is removed like any stale
        build), else a journal records both renames so that :meth:`recover` (run by the next
        writer, ``rlds gc`` and a reader that finds the name missing) rolls the replacement
        forward after a crash.

        Args:
            build_dir: A directory from :meth:`new_build_dir` with its manifest written.
            name: Dataset name.
            replace: Replace an existing dataset of that name.
            fsync: Make the rename durable before returning.

        Returns:
            The published directory.
        """
        final = self.dataset_dir(name)
        final.parent.mkdir(parents=True, exist_ok=True)
        if not final.exists():
            os.replace(build_dir, final)
            if fsync:
                fsync_dir(final.parent)
            return final
        if not replace:
            raise DatasetExistsError(f"dataset {name!r} already exists at {final}")
        if exchange_paths(build_dir, final):
            old = build_dir  # the swap left the old version where the build was
            if fsync:
                fsync_dir(final.parent)
                fsync_dir(build_dir.parent)
        else:
            old = self._journalled_replace(build_dir, final, fsync)
        self._discard(old, final.name)
        return final

    def _journalled_replace(self, build_dir: Path, final: Path, fsync: bool) -> Path:
        """Replace ``final`` by ``build_dir`` in two renames, with a journal that says how to
        finish (or undo) them; returns where the old version went."""
        journal = self.layout.journal_file(final.name)
        trash = journal.with_name(journal.name.removesuffix(JOURNAL_SUFFIX) + TRASH_SUFFIX)
        # paths relative to the root: a preprocess job builds in a subdirectory of tmp/
        record = {k: os.path.relpath(p, self.path) for k, p in (("final", final), ("build", build_dir))}
        record["trash"] = os.path.relpath(trash, self.path)
        # a fixed temp name: recover() treats a left-over ".<journal>.tmp" as torn
        atomic_write(journal, json.dumps(record), fsync=fsync, sync_dir=fsync, unique=False)
        os.replace(final, trash)
        os.replace(build_dir, final)
        if fsync:
            fsync_dir(final.parent)
        journal.unlink()
        return trash

    def _discard(self, path: Path, entry: str) -> None:
        """Remove an old version: first out of reach of any name (an atomic rename to a
        ``.trash`` entry, so a crash leaves only stale trash), then its files."""
        if not path.name.endswith(TRASH_SUFFIX):
            trash = self.layout.trash_dir(entry)
            os.replace(path, trash)
            path = trash
        shutil.rmtree(path, ignore_errors=True)

    def recover(self, entry: str | None = None) -> list[str]:
        """Finish replacements that a crash interrupted (journals left in ``tmp/``).

        The caller must hold the lock of every entry it recovers (``entry``), or pass ``None``
        to recover each entry whose lock can be taken at once. A build that reached the
        journal is complete (its manifest was written first), so recovery rolls forward: the
        new version is renamed into place when it is still waiting; the old version is put
        back only when the new one is gone.

        Returns:
            The entries whose journal was processed.
        """
        done: list[str] = []
        if not self.tmp_dir.is_dir():
            return done
        # a journal's temp file (".<entry>.<id>.publish.tmp") is torn: no rename happened yet
        found = [*self.tmp_dir.glob(f".*{JOURNAL_SUFFIX}.tmp"), *self.tmp_dir.glob(f"*{JOURNAL_SUFFIX}")]
        for journal in sorted(found):
            owner = tmp_owner(journal)
            if entry is not None:
                if owner == entry:
                    self._roll_forward(journal)
                    done.append(owner)
                continue
            try:
                with FileLock(self.layout.lock_file(owner), timeout=0):
                    self._roll_forward(journal)
                    done.append(owner)
            except Timeout:
                continue  # its writer is alive and finishing it
        return done

    def _roll_forward(self, journal: Path) -> None:
        if journal.name.endswith(".tmp"):
            journal.unlink(missing_ok=True)
            return
        try:
            record = json.loads(journal.read_text(encoding="utf-8"))
            final, build, trash = (self.path / record[k] for k in ("final", "build", "trash"))
        except (OSError, ValueError, KeyError, TypeError):
            journal.unlink(missing_ok=True)  # torn journal: written before any rename happened
            return
        if not (final / MANIFEST_FILE).is_file():
            if (build / MANIFEST_FILE).is_file():
                logger.info("finishing the interrupted replacement of %s", final.name)
                os.replace(build, final)
            elif (trash / MANIFEST_FILE).is_file():
                logger.info("restoring %s: its replacement was lost", final.name)
                os.replace(trash, final)
            fsync_dir(final.parent)
        journal.unlink(missing_ok=True)

    def remove(self, name: str, timeout: float = 10.0) -> None:
        """Delete a published dataset (atomically invisible first, then removed)."""
        final = self.dataset_dir(name)
        if not final.exists():
            raise DatasetNotFoundError(f"no dataset named {name!r} in the cache at {self.path}")
        try:
            with self.lock(name, timeout=timeout):
                self.tmp_dir.mkdir(parents=True, exist_ok=True)
                self._discard(final, final.name)
        except Timeout:
            raise LockTimeoutError(f"dataset {name!r} is locked by another process") from None
