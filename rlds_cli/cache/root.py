"""The cache root on disk: how datasets are locked, published, replaced, recovered and removed.

Every path is named in :mod:`rlds_cli.cache.layout`.
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
    DATASETS_DIR,
    JOURNAL_SUFFIX,
    LOCKS_DIR,
    MANIFEST_FILE,
    RAW_DIR,
    TMP_DIR,
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
    RldsError,
)

# Locks are rlds_cli._util.locks' (fcntl.flock on POSIX): filelock costs ~16 ms to import.

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


def overlap(path: str | os.PathLike[str], folder: str | os.PathLike[str]) -> str | None:
    """How ``path`` stands to ``folder``, links resolved: ``"is"``, ``"lies inside"``, ``"holds"``
    (``folder`` lies inside it), or ``None`` where they are apart. What writes ``path`` (a push's
    target, an export replaced with ``--force``) must stay apart from the cache and the dataset it
    reads: writing or removing it there writes over or removes their files."""
    mine, theirs = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    if mine == theirs:
        return "is"
    if mine.is_relative_to(theirs):
        return "lies inside"
    return "holds" if theirs.is_relative_to(mine) else None


def cache_overlap(path: str | os.PathLike[str], root: Path) -> str | None:
    """How writing ``path`` would reach the cache at ``root`` ("is the rlds cache (ROOT)", "lies
    inside the rlds cache's datasets/ folder (...)"): ``path`` is or holds the root, or is, lies in
    or holds one of the folders rlds keeps there (datasets, tmp, locks, raw); ``None`` otherwise
    (other folders under the root are the user's)."""
    how = overlap(path, root)
    if how in ("is", "holds"):
        return f"{how} the rlds cache ({root})"
    for name in (DATASETS_DIR, TMP_DIR, LOCKS_DIR, RAW_DIR):
        how = overlap(path, root / name)
        if how is not None:
            return f"{how} the rlds cache's {name}/ folder ({root / name})"
    return None


def refuse_cache_output(
    path: str | os.PathLike[str],
    root: str | os.PathLike[str] | CacheRoot | None,
    what: str,
    error: type[RldsError],
) -> None:
    """Raise ``error`` where writing the user-named file ``path`` (``what``: "the page", "the
    table") would reach the cache at ``root`` (``None``: the default one): :func:`cache_overlap`.
    Writing a page or table over a dataset's manifest destroyed the dataset and said it wrote."""
    how = cache_overlap(path, root.path if isinstance(root, CacheRoot) else settings.cache_root(root))
    if how is not None:
        raise error(
            f"cannot write {what} to {path}: it {how}, whose files it would write over",
            hint="write it outside the cache's own folders (datasets, tmp, locks, raw)",
        )


def target_problem(
    path: str | os.PathLike[str], dataset_dir: Path, name: str, cache: Path | None
) -> str | None:
    """How writing ``path`` (a push's local target, an export) would reach the dataset ``name`` at
    ``dataset_dir`` or the cache at ``cache`` (:func:`cache_overlap`; ``None``: not checked), or
    ``None`` where it stays apart from both."""
    how = overlap(path, dataset_dir)
    if how is not None:
        return f"{how} dataset {name!r} ({dataset_dir})"
    return cache_overlap(path, cache) if cache is not None else None


def enclosing_cache(directory: Path) -> Path | None:
    """The cache root a published dataset folder lies in (``ROOT/datasets/NAME``), else ``None``."""
    return directory.parent.parent if directory.parent.name == DATASETS_DIR else None


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
        # a root that cannot be made: a folder above it is a file (every write would fail later)
        above = next((p for p in self.path.parents if os.path.lexists(p)), None)
        if above is not None and not above.is_dir():
            raise CacheLocationError(f"the cache root {self.path} lies under {above}, which is a file")
        for folder in (DATASETS_DIR, TMP_DIR, LOCKS_DIR, RAW_DIR):  # a list would call it empty
            if os.path.lexists(self.path / folder) and not (self.path / folder).is_dir():
                raise CacheLocationError(
                    f"the cache root {self.path} is damaged: its {folder} folder is a file",
                    hint=f"move {self.path / folder} away (rlds makes the folder again)",
                )

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
        """Finish a crashed, journalled replacement of ``name`` (when no writer holds it);
        returns whether the dataset is now published."""
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
        """``(directory name, error)`` of each published dataset whose manifest cannot be read."""
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

        An entry whose name's lock can be taken at once is stale (its writer was killed).

        Args:
            held: A dataset name whose lock the caller holds: its leftovers are stale.
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

        A replacement is never without a findable version: the two are swapped atomically
        where the OS can (:func:`exchange_paths`), else a journal records both renames so
        :meth:`recover` rolls the replacement forward after a crash.

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
        """Replace ``final`` by ``build_dir`` in two journalled renames; returns where the old
        version went."""
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
        """Remove an old version: first renamed to a ``.trash`` entry (a crash leaves only
        stale trash), then its files."""
        if not path.name.endswith(TRASH_SUFFIX):
            trash = self.layout.trash_dir(entry)
            os.replace(path, trash)
            path = trash
        shutil.rmtree(path, ignore_errors=True)

    def recover(self, entry: str | None = None) -> list[str]:
        """Finish replacements that a crash interrupted (journals left in ``tmp/``).

        The caller must hold ``entry``'s lock, or pass ``None`` to recover each entry whose lock
        can be taken at once. Recovery rolls forward (a journalled build is complete); the old
        version is restored only when the new one is gone.

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

    def withdraw(self, name: str) -> None:
        """Delete the published dataset ``name`` (atomically invisible first, then removed); the
        caller holds ``lock(name)``. Nothing when there is none."""
        final = self.dataset_dir(name)
        if final.exists():
            self.tmp_dir.mkdir(parents=True, exist_ok=True)
            self._discard(final, final.name)

    def remove(self, name: str, timeout: float = 10.0) -> None:
        """Delete a published dataset (atomically invisible first, then removed)."""
        final = self.dataset_dir(name)
        if not final.exists():
            raise DatasetNotFoundError(f"no dataset named {name!r} in the cache at {self.path}")
        try:
            with self.lock(name, timeout=timeout):
                self.withdraw(name)
        except Timeout:
            raise LockTimeoutError(f"dataset {name!r} is locked by another process") from None
