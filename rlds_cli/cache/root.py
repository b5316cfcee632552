"""The cache root on disk: where datasets live, how they are named, locked and published.

Layout under the root::

    datasets/<entry>/        published datasets (one directory each, manifest.json inside)
    tmp/<entry>.<id>.incomplete   builds in progress (never read by anyone)
    tmp/<entry>.<id>.trash        a replaced dataset on its way out
    locks/<entry>.lock       one lock file per dataset name

``<entry>`` is the dataset name with ``/`` written as ``--`` (so ``D4RL/door/human-v2`` is
``D4RL--door--human-v2``), the same convention as the Hugging Face cache; ``--`` is therefore
not allowed inside a name.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from rlds_cli import settings
from rlds_cli.cache.manifest import MANIFEST_FILE, Manifest, read_manifest
from rlds_cli.errors import (
    CorruptDatasetError,
    DatasetExistsError,
    DatasetNotFoundError,
    InvalidNameError,
    LockTimeoutError,
)

if TYPE_CHECKING:
    from filelock import FileLock

# filelock is imported where a lock is taken: it costs ~40 ms to import, and processes that only
# read datasets (the workers of 'rlds preprocess') never lock.

logger = logging.getLogger(__name__)

_PART = r"[A-Za-z0-9][A-Za-z0-9._-]*"
_NAME_RE = re.compile(rf"^{_PART}(/{_PART})*$")
_BUILD_SUFFIXES = (".incomplete", ".trash")


def validate_name(name: str) -> str:
    """Return ``name`` if it can name a cache entry, else raise :class:`InvalidNameError`."""
    if not isinstance(name, str) or not _NAME_RE.match(name) or "--" in name or len(name) > 200:
        raise InvalidNameError(f"invalid dataset name {name!r}")
    return name


def _entry(name: str) -> str:
    return validate_name(name).replace("/", "--")


def fsync_dir(path: Path) -> None:
    """Make a rename inside ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class CacheRoot:
    """The local cache: a directory of converted datasets.

    Args:
        root: Explicit root directory; ``None`` uses ``$RLDS_HOME`` or the user cache dir.
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.path = settings.cache_root(root)

    def __repr__(self) -> str:
        return f"CacheRoot({str(self.path)!r})"

    @property
    def datasets_dir(self) -> Path:
        return self.path / "datasets"

    @property
    def tmp_dir(self) -> Path:
        return self.path / "tmp"

    @property
    def locks_dir(self) -> Path:
        return self.path / "locks"

    def dataset_dir(self, name: str) -> Path:
        """The directory a dataset of this name is (or would be) published at."""
        return self.datasets_dir / _entry(name)

    def exists(self, name: str) -> bool:
        """Whether a complete dataset of this name is published."""
        return (self.dataset_dir(name) / MANIFEST_FILE).is_file()

    def manifest(self, name: str) -> Manifest:
        """The manifest of a published dataset; raises :class:`DatasetNotFoundError`."""
        directory = self.dataset_dir(name)
        try:
            return read_manifest(directory)
        except FileNotFoundError:
            raise DatasetNotFoundError(f"no dataset named {name!r} in the cache at {self.path}") from None

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

    def lock(self, name: str, timeout: float = -1) -> FileLock:
        """The inter-process lock that serializes writers of one dataset name.

        Args:
            name: Dataset name.
            timeout: Seconds to wait when acquired; ``-1`` waits forever.
        """
        from filelock import FileLock

        self.locks_dir.mkdir(parents=True, exist_ok=True)
        return FileLock(str(self.locks_dir / f"{_entry(name)}.lock"), timeout=timeout)

    def new_build_dir(self, name: str) -> Path:
        """Create an empty private directory to build a dataset in (same filesystem as the
        final location, so publishing is a rename)."""
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        path = self.tmp_dir / f"{_entry(name)}.{uuid.uuid4().hex[:12]}.incomplete"
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
        from filelock import FileLock, Timeout

        removed: list[Path] = []
        if not self.tmp_dir.is_dir():
            return removed
        for child in sorted(self.tmp_dir.iterdir()):
            if not child.name.endswith(_BUILD_SUFFIXES):
                continue
            # "<entry>.<id>.incomplete": entries may contain dots, the id and suffix cannot
            entry = child.name.rsplit(".", 2)[0]
            if held is not None and entry == _entry(held):
                if not dry_run:
                    shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
                continue
            lock = FileLock(str(self.locks_dir / f"{entry}.lock"), timeout=0)
            try:
                with lock:
                    if not dry_run:
                        logger.info("removing stale build %s", child)
                        shutil.rmtree(child, ignore_errors=True)
                    removed.append(child)
            except Timeout:
                continue  # a live writer owns it
        return removed

    def publish(self, build_dir: Path, name: str, *, replace: bool, fsync: bool) -> Path:
        """Move a finished build into place. The caller must hold ``lock(name)``.

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
        if final.exists():
            if not replace:
                raise DatasetExistsError(f"dataset {name!r} already exists at {final}")
            trash = self.tmp_dir / f"{final.name}.{uuid.uuid4().hex[:12]}.trash"
            os.replace(final, trash)
            os.replace(build_dir, final)
            shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(build_dir, final)
        if fsync:
            fsync_dir(final.parent)
        return final

    def remove(self, name: str, timeout: float = 10.0) -> None:
        """Delete a published dataset (atomically invisible first, then removed)."""
        from filelock import Timeout

        final = self.dataset_dir(name)
        if not final.exists():
            raise DatasetNotFoundError(f"no dataset named {name!r} in the cache at {self.path}")
        try:
            with self.lock(name, timeout=timeout):
                self.tmp_dir.mkdir(parents=True, exist_ok=True)
                trash = self.tmp_dir / f"{final.name}.{uuid.uuid4().hex[:12]}.trash"
                os.replace(final, trash)
                shutil.rmtree(trash, ignore_errors=True)
        except Timeout:
            raise LockTimeoutError(f"dataset {name!r} is locked by another process") from None
