"""Check the order in which a write is made durable: every ``os.fsync`` (named by the path of
its file descriptor) and every rename, in the order they happened.

:class:`DurabilityTrace` records them; :func:`check_durable_publish` asserts what makes a
published dataset survive a power cut. The checks name paths and their order only, never the
functions that do the work, so they hold however the writers are arranged.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from rlds_cli.cache.layout import COMMITTED_FILE

#: A segment's commit mark, relative to it.
MARK = Path(COMMITTED_FILE)


class DurabilityTrace:
    """Records, in order, every ``os.fsync`` and every ``os.rename``/``os.replace``."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[tuple[str, Path, Path | None]] = []
        real_fsync, real_rename, real_replace = os.fsync, os.rename, os.replace

        def fsync(fd: int) -> None:
            self.events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}")), None))
            real_fsync(fd)

        def rename(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            real_rename(src, dst, *args, **kwargs)
            self.events.append(("rename", Path(src).resolve(), Path(dst).resolve()))

        def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            real_replace(src, dst, *args, **kwargs)
            self.events.append(("rename", Path(src).resolve(), Path(dst).resolve()))

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "rename", rename)
        monkeypatch.setattr(os, "replace", replace)

    def fsyncs(self) -> list[tuple[int, Path]]:
        """``(event index, path)`` of every fsync."""
        return [(i, path) for i, (kind, path, _) in enumerate(self.events) if kind == "fsync"]

    def where_it_ends(self, path: Path, index: int) -> Path:
        """Where the entry that ``path`` named at event ``index`` lies once every later rename
        is done (a temp file renamed to its name, a build folder renamed into place)."""
        for kind, src, dst in self.events[index + 1 :]:
            if kind == "rename" and dst is not None and path.is_relative_to(src):
                path = dst / path.relative_to(src)
        return path


def check_durable_publish(trace: DurabilityTrace, final: Path) -> None:
    """Assert the order that makes the dataset published at ``final`` survive a power cut:
    every file and folder of the build fsynced, each folder after the files in it, all of them
    (the build folder too) before the manifest's rename commits them; then the build folder
    again, after its last rename inside (the manifest's); then the rename into ``datasets/``;
    then an fsync of ``datasets/``."""
    final = final.resolve()
    publish = [i for i, (kind, _, dst) in enumerate(trace.events) if kind == "rename" and dst == final]
    assert len(publish) == 1, f"expected one rename onto {final}: {trace.events}"
    (at,) = publish
    build = trace.events[at][1]
    build_syncs = [i for i, path in trace.fsyncs() if i < at and path == build]
    assert build_syncs, f"the build folder {build} was never fsynced before its rename"
    last_build_sync = build_syncs[-1]
    # each fsync before the build folder's last one: where its entry ends up in the dataset
    synced: dict[Path, list[int]] = {}
    for i, path in trace.fsyncs():
        ends = trace.where_it_ends(path, i)
        if i <= last_build_sync and ends.is_relative_to(final):
            synced.setdefault(ends.relative_to(final), []).append(i)
    entries = {p.relative_to(final): p.is_dir() for p in final.rglob("*")}
    assert {Path("manifest.json"), Path("episodes.npy")} <= entries.keys()
    missing = sorted(str(p) for p in entries.keys() - synced.keys())
    assert not missing, f"not fsynced before the build folder: {missing}"
    manifest = final / "manifest.json"
    (commit,) = [
        i
        for i, (kind, _, dst) in enumerate(trace.events)
        if kind == "rename" and dst is not None and trace.where_it_ends(dst, i) == manifest
    ]
    uncommitted = sorted(
        str(p) for p in [Path("."), *entries] if p.name != manifest.name and min(synced[p]) > commit
    )
    assert not uncommitted, f"fsynced only after the manifest committed them: {uncommitted}"
    for folder in [Path("."), *(p for p, is_dir in entries.items() if is_dir)]:
        inside = [i for p, is_dir in entries.items() if p.parent == folder for i in synced[p] if not is_dir]
        assert not inside or max(synced[folder]) > max(inside), f"{folder} fsynced before its files"
    late = [
        (src.name, dst.name)
        for kind, src, dst in trace.events[last_build_sync:at]
        if kind == "rename" and dst is not None and dst.is_relative_to(build)
    ]
    assert not late, f"renamed inside the build folder after its last fsync: {late}"
    after = [path for i, path in trace.fsyncs() if i > at]
    assert final.parent in after, f"{final.parent} was not fsynced after the publish rename"


def check_durable_segment(trace: DurabilityTrace, directory: Path) -> None:
    """Assert the order that makes the one segment commit traced in the growing dataset at
    ``directory`` survive a power cut: every file and folder of the segment fsynced (each
    folder after the segment's rename and its last rename inside, ``segments/`` after the
    segment's rename into it), all of them before the commit log's fsync, which is the last
    event: the log's record is the segment's commit. Files and folders of one wave are synced
    together, in no order among them."""
    directory = directory.resolve()
    log = directory / "commits.log"
    fsyncs = trace.fsyncs()
    assert fsyncs and fsyncs[-1][1] == log, f"the commit log's fsync is not the last one: {fsyncs[-1:]}"
    commit = fsyncs[-1][0]
    (at,) = [
        i
        for i, (kind, _, dst) in enumerate(trace.events)
        if kind == "rename" and dst is not None and dst.parent == directory / "segments"
    ]
    final = trace.events[at][2]
    assert final is not None
    synced: dict[Path, list[int]] = {}
    for i, path in fsyncs[:-1]:
        ends = trace.where_it_ends(path, i)
        if ends.is_relative_to(final):
            synced.setdefault(ends.relative_to(final), []).append(i)
    # the commit mark is made after the record, unsynced: it only tells damage from a crash
    entries = {p.relative_to(final): p.is_dir() for p in final.rglob("*") if p.relative_to(final) != MARK}
    assert {Path("manifest.json"), Path("episodes.npy")} <= entries.keys()
    missing = sorted(str(p) for p in [Path("."), *entries] if p not in synced)
    assert not missing, f"not fsynced before the commit record: {missing}"
    # a folder's fsync makes its entries durable: it must come after the last one was made (the
    # files were written before the segment's rename; the manifest is renamed into place), not
    # after its files' data, which only has to be durable before the record
    for folder in [Path("."), *(p for p, is_dir in entries.items() if is_dir)]:
        renames = [
            i
            for i, (kind, _, dst) in enumerate(trace.events)
            if kind == "rename" and dst is not None and trace.where_it_ends(dst, i).parent == final / folder
        ]
        assert max(synced[folder]) > max([at, *renames]), f"{folder} fsynced before its last entry was made"
    parent = [i for i, path in fsyncs if path == final.parent and at < i < commit]
    assert parent, f"{final.parent} was not fsynced between the segment's rename and the commit record"
