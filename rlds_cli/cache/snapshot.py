"""A consistent copy of a growing dataset as of one view, for long reads (``rlds push``, ``rlds export``).

The copy is hard links to the live segments' files (segments never change) and the commit log
up to the view's position, in a build folder of ``tmp/``, removed afterwards. Writers, evictions
and compactions go on meanwhile; the links keep retired segments' files. The copy holds its own
lock (``locks/<entry>~snapshot-<id>.lock``; ``~`` is in no entry), so stale-build cleanup leaves
it alone until its process is gone.
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
#: Views tried: a view whose segment is removed while linked is refreshed and linked again.
ATTEMPTS = 5


def fixed_copy_hint(name: str) -> str:
    """The hint for a command that needs a fixed dataset given growing ``name``: export a
    snapshot and convert it."""
    return (
        f"export a snapshot and convert that: 'rlds export {name} DIR --to torchrl', then "
        "'rlds download DIR --name NAME'"
    )


@contextmanager
def snapshot_copy(ds: GrowingDataset, cache: CacheRoot | None = None) -> Iterator[Path]:
    """A folder holding growing dataset ``ds`` as of its view, in ``cache``'s ``tmp/``
    (``None``: ``ds``'s cache; outside a cache, a hidden folder beside it).

    If a segment is removed while linking, ``ds`` is refreshed and the copy remade (up to
    :data:`ATTEMPTS`); the copy is of the view ``ds`` holds when this yields.

    Raises:
        DatasetReplacedError: Every attempt lost a segment.
    """
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
    """A build folder path in ``cache``'s ``tmp/`` (not created) guarded by its own lock,
    ``locks/<owner>.lock``, held while it lives; both are removed afterwards. ``owner`` holds a
    ``~`` (in no entry), so only a dead process's folder is collected as stale."""
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
    """Link the view's files into ``build``; ``False`` when a segment was removed meanwhile.
    Segment folders are only ever removed whole, so one still there after linking was whole."""
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
