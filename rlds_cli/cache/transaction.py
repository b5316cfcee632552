"""Atomic dataset writes: the steps every writer takes, in order, to publish into the cache.

Every writer (conversion, views, splits, preprocess jobs, pulls):

1. take the name's lock (writers of one name are serialized; readers never lock);
2. finish or clean what a killed writer of that name left (journals, builds, trash);
3. build in a private directory under ``tmp/`` on the same filesystem (nobody reads it);
4. commit: make every file durable (``fsync``), then write ``manifest.json`` (the commit
   record: a directory without it is no dataset);
5. publish by an atomic rename (or exchange, for a replacement; see
   :meth:`~rlds_cli.cache.root.CacheRoot.publish`).

A writer killed before step 5 leaves nothing visible; the next writer of the name (or ``rlds
gc``) removes its leftovers.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import TracebackType
from typing import Any

from rlds_cli import settings
from rlds_cli._util import signals
from rlds_cli._util.io import fsync_tree
from rlds_cli._util.locks import is_timeout
from rlds_cli.cache.layout import COMPOSED_LAYOUT, VIEW_LAYOUT, validate_name
from rlds_cli.cache.manifest import Manifest, write_manifest
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import DatasetExistsError, LockTimeoutError, RldsError

#: Layouts of datasets that read their parents' arrays (a replaced parent is read through them).
_READS_PARENTS = (VIEW_LAYOUT, COMPOSED_LAYOUT)


def seal(directory: Path, manifest: Manifest, *, fsync: bool) -> None:
    """Commit a finished build: its files made durable first, then its manifest written."""
    if fsync:
        fsync_tree(directory)
    write_manifest(directory, manifest, fsync=fsync)


class CacheTransaction:
    """Write one dataset atomically. Use as a context manager, then :meth:`commit`.

    Args:
        name: Dataset name in the cache.
        root: Cache root (a :class:`CacheRoot`, a path, or ``None`` for the default).
        replace: Replace a dataset of the same name when committing.
        lock_timeout: Seconds to wait for another writer of the same name (``-1``: forever).
        lock: A lock to hold instead of the name's (e.g. a preprocess job writing to a URL);
            stale builds of the name are then cleaned only where their writer is gone.
        what: How errors name what is written (default: ``dataset 'NAME'``).

    Attributes:
        existing: The manifest of the dataset already published under ``name`` (read once the
            lock is held), or ``None``.
        fsync: Whether this write is made durable (``RLDS_FSYNC``, read once).
    """

    def __init__(
        self,
        name: str,
        *,
        root: CacheRoot | str | os.PathLike[str] | None = None,
        replace: bool = False,
        lock_timeout: float = -1,
        lock: Any = None,
        what: str | None = None,
    ) -> None:
        self.name = validate_name(name)
        self.cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
        self.replace = replace
        self.existing: Manifest | None = None
        self.fsync = settings.fsync_enabled()
        self._what = what or f"dataset {self.name!r}"
        self._own_lock = lock is None
        self._lock = self.cache.lock(name, timeout=lock_timeout) if lock is None else lock
        self._dir: Path | None = None
        self._discard_on_abort = True
        self._committed = False

    def __enter__(self) -> CacheTransaction:
        try:
            self._lock.acquire()
        except Exception as exc:
            if not is_timeout(exc):  # the cache's lock, or a filelock.FileLock the caller gave
                raise
            raise LockTimeoutError(f"{self._what} is being written by another process") from None
        try:
            self.cache.clean_stale_builds(held=self.name if self._own_lock else None)
            if self.cache.exists(self.name):
                self.existing = self.cache.manifest(self.name)
        except BaseException:
            self._lock.release()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            if not self._committed and self._dir is not None and self._discard_on_abort:
                shutil.rmtree(self._dir, ignore_errors=True)
        finally:
            self._lock.release()

    @property
    def build_dir(self) -> Path:
        """The directory the dataset is built in (see :meth:`new_build_dir`, :meth:`adopt`)."""
        if self._dir is None:
            raise RuntimeError(f"the transaction of {self.name!r} has no build directory yet")
        return self._dir

    def new_build_dir(self) -> Path:
        """A fresh, empty build directory, removed unless the transaction commits."""
        self._dir = self.cache.new_build_dir(self.name)
        return self._dir

    def adopt(self, directory: Path) -> Path:
        """Build in ``directory`` (on the cache's filesystem), kept on failure (a preprocess
        job's output, for ``--resume``)."""
        self._dir = directory
        self._discard_on_abort = False
        return directory

    def check_free(self) -> None:
        """Raise :class:`DatasetExistsError` when the name is taken and not to be replaced."""
        if self.existing is not None and not self.replace:
            raise DatasetExistsError(
                f"dataset {self.name!r} already exists at {self.cache.dataset_dir(self.name)}"
            )

    def check_not_made_from(self, manifest: Manifest) -> None:
        """Raise :class:`DatasetExistsError` when the dataset replaced is one the new one (of
        ``manifest``) is made of: a parent it pins (its lineage), or, for a dataset that reads
        others' arrays (a view, a composed dataset), any dataset it reads through."""
        if self.existing is None:
            return
        seen: set[str] = set()
        todo: list[str] = manifest.parent_names()
        reads = manifest.layout in _READS_PARENTS
        while todo:
            parent = todo.pop()
            if parent in seen:
                continue
            if parent == self.name:
                raise DatasetExistsError(
                    f"dataset {self.name!r} cannot be replaced by a dataset made from it",
                    hint="give the new dataset another name",
                )
            seen.add(parent)
            if not reads:
                continue
            try:
                found = self.cache.manifest(parent)
            except RldsError:  # gone or unreadable: nothing further to follow
                continue
            if found.layout in _READS_PARENTS:
                todo += found.parent_names()

    def withdraw(self) -> None:
        """Delete the dataset this one replaces now, before :meth:`commit` (datasets published
        together: a kill between their commits leaves some missing, never old and new mixed)."""
        if self.existing is not None and self.replace:
            self.cache.withdraw(self.name)

    def seal(self, manifest: Manifest) -> None:
        """Make the build durable and write its manifest (:func:`seal`), after the checks of the
        name; :meth:`publish` then moves it into place."""
        self.check_free()
        self.check_not_made_from(manifest)
        seal(self.build_dir, manifest, fsync=self.fsync)

    def publish(self) -> Path:
        """Publish the sealed build under the name; returns the published directory."""
        with signals.publishing(f"dataset {self.name!r}"):
            final = self.cache.publish(self.build_dir, self.name, replace=self.replace, fsync=self.fsync)
            self._committed = True
        return final

    def commit(self, manifest: Manifest) -> Path:
        """Seal the build (durable files, then the manifest) and publish it under the name.

        Returns:
            The published directory.
        """
        self.seal(manifest)
        return self.publish()
