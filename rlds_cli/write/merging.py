"""Small commits merged as a writer goes, so a growing dataset of many small commits stays a
few segments: it opens, reads and takes disk like the same data in a few commits.

After each commit a writer looks at the segments of its view (the log it follows anyway; no
file opened). Where :data:`MERGE_FANIN` consecutive live segments are of one kind (protected or
not) and one merge generation, and together hold at most :func:`merge_cap` steps, it merges
the oldest :data:`MERGE_FANIN` of that run into one segment of the next generation: the verified
copy ``rlds compact`` makes (:func:`rlds_cli.write.compact.merge_run`), committed by a
``COMPACT`` record. Commits are generation 0, so the segments form a base-``MERGE_FANIN``
counter: every step is copied about ``log(commits) / log(MERGE_FANIN)`` times in all, and the
view holds at most about ``MERGE_FANIN`` segments per generation (10**5 one-episode commits:
3 copies, under 60 segments). Segments of ``rlds compact`` are never merged again by a writer.

One merge at a time: a writer takes the dataset's compaction lock without waiting, and skips
the merge where another writer or ``rlds compact`` holds it (its next commit looks again).
Under the lock the plan is made again on a fresh view. Generations never rise from one segment
to the next (a kind's segments go from the oldest, highest generation to the newest), and a
merge keeps it so: it takes the oldest of its generation's run, so its segment lands right
after the run of the next generation, and what other writers commit meanwhile (more than
:data:`MERGE_FANIN` while a merge runs) comes after it. So no segment is ever left between two
of a higher generation, unmerged for good. A merge that completes a generation's run is
followed by the merge of that run (a carry).
Merged segments are retired like compacted ones: their files stay for the dataset's grace
period, then the writers' collection removes them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from rlds_cli.cache.commit_log import FINAL_GENERATION, SegmentEntry
from rlds_cli.cache.growing import GrowingDataset
from rlds_cli.cache.manifest import Manifest
from rlds_cli.errors import CorruptDatasetError
from rlds_cli.write.compact import merge_run

#: Segments merged at once (and the most of one generation a view holds, less one).
MERGE_FANIN = 16
#: A merged segment holds at most this many bytes (its rows' size, all columns): merging is
#: for segments whose files' own cost (a folder, a manifest, a file a key, each a few KiB on
#: disk and a few opens to read) is a large share of them. Larger ones stay as written: a
#: copy of camera frames would cost a writer as much disk time again as its commits ...
MERGE_MAX_BYTES = 32 << 20
#: ... and at most this share of a dataset's capacity: a merged segment partly evicted keeps
#: its evicted rows on disk until it is evicted whole (or compacted), so a cap of 1/8 keeps
#: that under 1/8 of the capacity.
MERGE_CAPACITY_SHARE = 8


def merge_cap(head: Manifest, capacity: int | None) -> int:
    """The most steps a writer's merge may put in one segment of the dataset ``head``."""
    row_bytes = sum(spec.row_bytes for spec in head.fields.values())
    cap = MERGE_MAX_BYTES // max(row_bytes, 1)
    if capacity is not None:
        cap = min(cap, capacity // MERGE_CAPACITY_SHARE)
    return cap


def merge_plan(live: list[tuple[SegmentEntry, int]], cap: int) -> list[tuple[SegmentEntry, int]] | None:
    """The segments of ``live`` (a view's live segments, in log order) due for a merge, else
    ``None``: the oldest :data:`MERGE_FANIN` of the newest run of consecutive segments of one
    kind and one generation that holds at least that many, where together they hold at most
    ``cap`` steps (see the module docstring)."""
    end = len(live)
    while end >= MERGE_FANIN:
        last = live[end - 1][0]
        start = end - 1
        while start > 0 and (live[start - 1][0].protected, live[start - 1][0].generation) == (
            last.protected,
            last.generation,
        ):
            start -= 1
        run = live[start : start + MERGE_FANIN]
        if (
            end - start >= MERGE_FANIN
            and last.generation < FINAL_GENERATION
            and sum(entry.steps for entry, _ in run) <= cap
        ):
            return run
        end = start
    return None


class SmallSegmentMerger:
    """A writer's merges of its dataset's small segments (see the module docstring).

    Args:
        directory: The growing dataset's folder.
        try_lock: Takes the dataset's compaction lock without waiting: the lock held (to
            ``release()``), or ``None`` where someone else holds it.
        fsync: Make the merged segment durable before its record.
    """

    def __init__(self, directory: Path, try_lock: Callable[[], Any | None], *, fsync: bool) -> None:
        self.directory = directory
        self._try_lock = try_lock
        self.fsync = fsync
        self._view: GrowingDataset | None = None
        #: Merges this writer made.
        self.merges = 0
        #: Why this writer merges no more: a damaged segment found in a merge's input (raised
        #: once, by the merge that found it; the dataset's commits go on, unmerged).
        self.damage: CorruptDatasetError | None = None

    def after_commit(
        self, live: list[tuple[SegmentEntry, int]], head: Manifest, capacity: int | None
    ) -> bool:
        """Merge the newest segments where :func:`merge_plan` says so for ``live`` (the writer's
        view after its commit), then the run that merge completes, and so on; returns whether
        a merge was committed. The plan is made again on a view read under the lock: another
        merge may have taken the segments meanwhile."""
        cap = merge_cap(head, capacity)
        if self.damage is not None or merge_plan(live, cap) is None:
            return False
        lock = self._try_lock()
        if lock is None:
            return False
        merged = False
        try:
            view = self._fresh_view()
            while (run := merge_plan(view.live_segments(), cap)) is not None:
                merge_run(view, run, generation=run[0][0].generation + 1, fsync=self.fsync)
                self.merges += 1
                merged = True
                view.refresh()
        except CorruptDatasetError as exc:
            self.damage = exc
            raise
        finally:
            lock.release()
        return merged

    def _fresh_view(self) -> GrowingDataset:
        """The dataset's view at the log's end (opened once, then followed)."""
        if self._view is None:
            self._view = GrowingDataset(self.directory)
        else:
            self._view.refresh()
        return self._view


__all__ = ["MERGE_FANIN", "SmallSegmentMerger", "merge_cap", "merge_plan"]
