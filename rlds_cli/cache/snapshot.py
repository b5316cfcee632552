"""A consistent copy of a growing dataset as of one view, for what reads or copies a dataset's
files for long (``rlds push``, ``rlds export``): hard links to the live segments' files
(segments never change) and the commit log up to the view's position, in a build folder of
the cache's ``tmp/``, removed afterwards.

Writers, evictions and compactions go on meanwhile, with any grace period: the copy's links
keep the files of the segments they retire. The copy holds a lock of its own for as long as
it lives (``locks/<entry>~snapshot-<id>.lock``; ``~`` is in no dataset's entry), so the
cleanup of stale builds that any other dataset's transaction (and ``rlds gc``) runs leaves
it alone; once its process is gone, the lock is free and the copy is a stale build.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlds_cli._util.locks import FileLock
from rlds_cli.cache.growing import GrowingDataset
from rlds_cli.cache.layout import (
    COMMIT_LOG_FILE,
    DATASETS_DIR,
    MANIFEST_FILE,
    SEGMENT_BUILDS_DIR,
    SEGMENTS_DIR,
    entry_name,
    new_id,
)
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import DatasetReplacedError

#: What separates the dataset's entry from the copy's id in the name of its lock and folder.
SNAPSHOT_MARK = "~snapshot-"
#: Views tried: a view whose segment is removed while it is linked (its retirement's grace
#: period, which may be 0, ran out) is refreshed and linked again.
ATTEMPTS = 5


def fixed_copy_hint(name: str) -> str:
    """What to do where a command needs a dataset that stays as it is and ``name`` is a growing
    one (a view, a preprocess job): export a snapshot and convert it."""
    return (
        f"export a snapshot and convert that: 'rlds export {name} DIR --to torchrl', then "
        "'rlds download DIR --name NAME'"
    )


@contextmanager
def snapshot_copy(ds: GrowingDataset, cache: CacheRoot | None = None) -> Iterator[Path]:
    """A folder holding the growing dataset ``ds`` as of its view (see the module docstring),
    in ``cache``'s ``tmp/`` (``None``: the cache ``ds`` is in; a dataset in no cache's
    ``datasets/`` folder is copied into a hidden folder beside it).

    When a segment of the view is removed while it is linked (retired by an eviction or a
    compaction longer than the grace period ago), ``ds`` is refreshed (as a reader that gets
    :class:`~rlds_cli.errors.DatasetReplacedError` would be) and the copy made again; the
    copy is of the view ``ds`` holds when this returns."""
    if cache is None and ds.directory.parent.name != DATASETS_DIR:
        with _private(ds) as build:
            yield build
        return
    cache = cache or CacheRoot(ds.directory.parent.parent)
    with private_build(cache, f"{entry_name(ds.name)}{SNAPSHOT_MARK}{new_id()}") as build:
        _copy(ds, build)
        yield build


@contextmanager
def private_build(cache: CacheRoot, owner: str) -> Iterator[Path]:
    """A build folder path in ``cache``'s ``tmp/`` (not made) that holds a lock of its own,
    ``locks/<owner>.lock``, for as long as it lives, and is removed afterwards, lock file too.
    ``owner`` holds a ``~`` (in no dataset's entry), so no transaction of a dataset takes the
    folder for its own stale build while its process runs; once that process is gone (killed),
    the lock is free and the cleanup of stale builds (``rlds gc``) removes the folder."""
    lock_path = cache.layout.lock_file(owner)
    cache.locks_dir.mkdir(parents=True, exist_ok=True)
    cache.tmp_dir.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(lock_path, timeout=0):  # taken before the folder exists: never stale
            build = cache.layout.build_dir(owner)
            try:
                yield build
            finally:
                shutil.rmtree(build, ignore_errors=True)
    finally:  # a build that failed leaves no lock file either
        lock_path.unlink(missing_ok=True)


@contextmanager
def _private(ds: GrowingDataset) -> Iterator[Path]:
    scratch = Path(tempfile.mkdtemp(prefix=f".{ds.directory.name}{SNAPSHOT_MARK}", dir=ds.directory.parent))
    try:
        _copy(ds, scratch / "copy")
        yield scratch / "copy"
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _copy(ds: GrowingDataset, build: Path) -> None:
    for _ in range(ATTEMPTS):
        build.mkdir()
        if _link(ds, build):
            return
        shutil.rmtree(build)
        ds.refresh()
    raise DatasetReplacedError(
        f"growing dataset {ds.name!r}: its segments were removed faster than they could be linked "
        f"({ATTEMPTS} views tried)",
        hint="try again, or give the dataset a longer grace_seconds",
    )


def _link(ds: GrowingDataset, build: Path) -> bool:
    """Link the view's files into ``build``; ``False`` when a segment was removed meanwhile (the
    copy is then incomplete). A segment's folder is never changed, only renamed away whole, so
    one still there after its files were linked was there, whole, all along."""
    (build / SEGMENTS_DIR).mkdir()
    (build / SEGMENT_BUILDS_DIR).mkdir()
    for part in ds.segment_datasets():
        try:
            for path in sorted(part.directory.rglob("*")):
                target = build / SEGMENTS_DIR / part.directory.name / path.relative_to(part.directory)
                if path.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        os.link(path, target)
                    except FileNotFoundError:
                        raise
                    except OSError:  # a filesystem without hard links: a copy
                        shutil.copy2(path, target)
        except FileNotFoundError:
            return False
        if not part.directory.is_dir():
            return False
    with open(ds.directory / COMMIT_LOG_FILE, "rb") as fh:
        log = fh.read(ds.log_position)
    (build / COMMIT_LOG_FILE).write_bytes(log)
    shutil.copy2(ds.directory / MANIFEST_FILE, build / MANIFEST_FILE)
    return True
