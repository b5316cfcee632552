"""A consistent copy of a growing dataset as of one view, for what copies a dataset's files
(``rlds push``): hard links to the live segments' files (segments never change) and the commit
log up to the view's position, in a build folder of the cache, removed afterwards."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rlds_cli.cache.growing import GrowingDataset
from rlds_cli.cache.layout import COMMIT_LOG_FILE, MANIFEST_FILE, SEGMENT_BUILDS_DIR, SEGMENTS_DIR
from rlds_cli.cache.root import CacheRoot


@contextmanager
def snapshot_copy(ds: GrowingDataset, cache: CacheRoot) -> Iterator[Path]:
    """A folder holding the growing dataset ``ds`` as of its view (see the module docstring)."""
    build = cache.new_build_dir(ds.name)
    try:
        (build / SEGMENTS_DIR).mkdir()
        (build / SEGMENT_BUILDS_DIR).mkdir()
        for part in ds.segment_datasets():
            for path in sorted(part.directory.rglob("*")):
                target = build / SEGMENTS_DIR / part.directory.name / path.relative_to(part.directory)
                if path.is_dir():
                    target.mkdir(parents=True, exist_ok=True)
                else:
                    target.parent.mkdir(parents=True, exist_ok=True)
                    try:
                        os.link(path, target)
                    except OSError:  # a filesystem without hard links: a copy
                        shutil.copy2(path, target)
        with open(ds.directory / COMMIT_LOG_FILE, "rb") as fh:
            log = fh.read(ds.log_position)
        (build / COMMIT_LOG_FILE).write_bytes(log)
        shutil.copy2(ds.directory / MANIFEST_FILE, build / MANIFEST_FILE)
        yield build
    finally:
        shutil.rmtree(build, ignore_errors=True)
