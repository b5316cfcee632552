"""A growing dataset (``layout: "segmented"``) read as one dataset over its segments; its settings; the
segments its log does not name; consistent copies of it for long reads.

:class:`GrowingDataset` is a :class:`~rlds_cli.cache.dataset.Dataset` over the live episodes of the segments
as of one commit-log position (:mod:`rlds_cli.cache.commit_log`). Its columns map rows to segments
(:mod:`rlds_cli.cache.growing_columns`); a single segment's columns are handed out directly. The view
changes only on :meth:`GrowingDataset.refresh`, so indices stay valid until then. Segments leaving the view
keep their files for ``grace_seconds``; a reader lagging further gets :class:`DatasetReplacedError`.

Settings live in the head manifest's ``source.growing`` and are checked in one place
(:func:`growing_settings`). ``capacity`` and ``min_size`` count unprotected steps (protected episodes are
never evicted); ``min_total`` counts every step. A manifest without ``min_total`` has its ``min_size``
(which counted every step) read as ``min_total``, with ``min_size`` 0.

**Unnamed segments** (:func:`unnamed`). A writer renames a sealed segment into ``segments/``, appends
its log record, then makes the segment's ``commit/recorded`` file (:mod:`rlds_cli.write.segments`); killed
between the rename and the record, it leaves one unnamed leftover without that file, which ``rlds
compact`` removes once the writer no longer runs. A log that lost records (emptied, cut, restored from
an old copy) also leaves unnamed segments, which are committed data: one with its ``commit/recorded`` file, or
(segments written before that file) several of one dead writer, or several beside an empty log, mean
lost records (:func:`unnamed`): ``rlds compact`` keeps them and ``rlds inspect --check`` reports it.

**Consistent copies** (:func:`snapshot_copy`, for long reads: ``rlds push``, ``rlds export``): a copy as of
one view is hard links to the live segments' files (segments never change) and the commit log up to the
view's position, in a build folder of ``tmp/``, removed afterwards. Writers, evictions and compactions go on
meanwhile; the links keep retired segments' files. The copy holds its own lock
(``locks/<entry>~snapshot-<id>.lock``; ``~`` is in no entry), so stale-build cleanup leaves it alone until
its process is gone.
"""

from __future__ import annotations

import logging
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from rlds_cli._util.locks import FileLock
from rlds_cli.cache.backends import get_backend
from rlds_cli.cache.commit_log import (
    RECORD_SIZE,
    LogState,
    SegmentEntry,
    damage_hint,
    seg_name,
    segment_damage_hint,
    unnamed,
)
from rlds_cli.cache.dataset import Dataset, manifest_of, version_identity
from rlds_cli.cache.growing_columns import SMALL_BYTES, SMALL_ROWS, ConcatColumn, TailRun
from rlds_cli.cache.integrity import schema_problem
from rlds_cli.cache.layout import (
    COMMIT_LOG_FILE,
    DATASETS_DIR,
    MANIFEST_FILE,
    SEGMENT_BUILDS_DIR,
    SEGMENTS_DIR,
    entry_name,
    new_id,
    segment_folders,
)
from rlds_cli.cache.log_checkpoint import load_state, verify_log
from rlds_cli.cache.manifest import FieldSpec, Manifest
from rlds_cli.cache.reader import Episodes
from rlds_cli.cache.root import CacheRoot
from rlds_cli.cache.ted import EPISODE_DTYPE
from rlds_cli.errors import CacheError, CorruptDatasetError, DatasetNotFoundError, DatasetReplacedError

log = logging.getLogger(__name__)

#: How long the files of evicted or compacted segments stay for readers of older views.
DEFAULT_GRACE_SECONDS = 60.0

_T = TypeVar("_T")


def _whole(value: Any) -> bool:
    return isinstance(value, int | np.integer) and not isinstance(value, bool)


def _settings_problem(got: dict[str, Any]) -> str | None:
    """What is wrong with the settings ``got`` (the keys of ``source.growing``), or ``None``."""
    for key in ("capacity", "capacity_episodes"):
        value = got.get(key)
        if value is not None and not (_whole(value) and value > 0):
            return f"{key} must be a whole number above 0 (or None: no capacity), not {value!r}"
    for key in ("min_size", "min_total"):
        value = got.get(key, 0)
        if value is not None and not (_whole(value) and value >= 0):
            return f"{key} must be a whole number of 0 or more, not {value!r}"
    return grace_problem(got.get("grace_seconds", DEFAULT_GRACE_SECONDS))


def grace_problem(value: Any, what: str = "grace_seconds") -> str | None:
    """What is wrong with ``value`` as a grace period (a number of 0 or more seconds), or ``None``;
    ``what`` names it as the caller was given it (a keyword, a CLI option)."""
    number = isinstance(value, int | float | np.integer | np.floating) and not isinstance(value, bool)
    if not (number and math.isfinite(value) and value >= 0):
        return f"{what} must be a number of 0 or more seconds, not {value!r}"
    return None


def creator_settings(
    name: str,
    *,
    capacity: Any,
    capacity_episodes: Any,
    min_size: Any,
    min_total: Any,
    grace_seconds: Any,
) -> dict[str, Any]:
    """The settings a writer creating dataset ``name`` records in ``source.growing`` (plain ints
    and a float; ``None`` capacities left out). Logs a warning when ``min_total`` is over
    ``capacity``: only protected episodes can make up the difference.

    Raises:
        ValueError: A setting out of range, or ``min_size`` over ``capacity`` (both count
            unprotected steps: the dataset would never be ready).
    """
    given = {
        "capacity": capacity,
        "capacity_episodes": capacity_episodes,
        "min_size": min_size,
        "min_total": min_total,
        "grace_seconds": grace_seconds,
    }
    problem = _settings_problem(given)
    for key in ("min_size", "min_total"):  # None is a capacity's "no limit", no size's
        if given[key] is None:
            problem = problem or f"{key} must be a whole number of 0 or more, not None"
    if problem is not None:
        raise ValueError(problem)
    if capacity is not None and min_size > capacity:
        raise ValueError(
            f"min_size={min_size} is over capacity={capacity}: both count unprotected steps, so "
            "the dataset would never be ready; min_total= counts the protected steps too"
        )
    if capacity is not None and min_total > capacity:
        log.warning(
            "dataset %r: min_total=%d is over capacity=%d steps: it is ready only once protected "
            "episodes make up the difference",
            name,
            min_total,
            capacity,
        )
    return {k: v for k, v in _plain(given).items() if v is not None}


def _plain(got: dict[str, Any]) -> dict[str, Any]:
    """Checked settings as plain ints and a float, defaults filled in (``None``: no capacity)."""
    return {
        "capacity": None if got.get("capacity") is None else int(got["capacity"]),
        "capacity_episodes": None if got.get("capacity_episodes") is None else int(got["capacity_episodes"]),
        "min_size": int(got.get("min_size", 0) or 0),
        "min_total": int(got.get("min_total", 0) or 0),
        "grace_seconds": float(got.get("grace_seconds", DEFAULT_GRACE_SECONDS)),
    }


def growing_settings(manifest: Manifest) -> dict[str, Any]:
    """The head manifest's settings (capacity, capacity_episodes, min_size, min_total,
    grace_seconds), with defaults.

    Raises:
        CorruptDatasetError: A setting is not a value rlds writes.
    """
    got = manifest.source.get("growing", {}) if isinstance(manifest.source, dict) else {}
    problem = "source.growing is not a table" if not isinstance(got, dict) else _settings_problem(got)
    if problem is not None:
        raise CorruptDatasetError(
            f"growing dataset {manifest.name!r}: its manifest's {problem}",
            hint="its head manifest was changed outside rlds; restore it from a copy, or copy the "
            "episodes to a new dataset",
        )
    settings = _plain(got)
    if "min_total" not in got:  # such a manifest's min_size counts every step
        settings["min_size"], settings["min_total"] = 0, settings["min_size"]
    return settings


def is_ready(settings: dict[str, Any], steps: int, protected_steps: int, evicted: int = 0) -> bool:
    """Whether a view is ready: at least one step, ``min_size`` unprotected steps (or eviction
    begun: the buffer holds what its capacity lets it, which whole episodes may keep under a
    ``min_size`` close to ``capacity``) and ``min_total`` steps in all."""
    full = steps - protected_steps >= settings["min_size"] or evicted > 0
    return steps > 0 and full and steps >= settings["min_total"]


def empty_episodes() -> Episodes:
    """An :class:`Episodes` of no episode (a growing dataset before its first commit)."""
    ep = Episodes.__new__(Episodes)
    ep.lengths = ep.ends = ep.starts = np.zeros(0, np.int64)
    ep.num_steps = 0
    ep.table = None
    return ep


#: Views made of a log read again when a segment was removed while one was made (a refresh).
REBUILD_ATTEMPTS = 5


class GrowingDataset(Dataset):
    """A growing dataset as of one commit-log position (see the module docstring).

    Args:
        directory: The dataset's directory (``datasets/<entry>``).
        manifest: Its head manifest (read from ``directory`` when ``None``).
        position: Follow the log only up to this byte (a snapshot made elsewhere); ``None``:
            to its end.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        manifest: Manifest | None = None,
        *,
        position: int | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.identity = version_identity(self.directory)
        self.head = manifest = manifest_of(self.directory, manifest)
        self.settings = growing_settings(manifest)
        self._backend = get_backend(manifest.backend)
        self._parent_checked = None
        self._segments: dict[bytes, Dataset] = {}
        self._tails: dict[str, TailRun] = {}
        self._facts: dict[bytes, tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = {}
        # (size, device, inode, ctime) of the log when last read whole: the same stat means no
        # append and no replaced log
        self._log_seen: tuple[int, int, int, int] | None = None
        self._log_path = str(self.directory / COMMIT_LOG_FILE)
        self._state = load_state(self.directory, until=position)
        if position is None:
            self._check_no_lost_records()
        self._behind = False
        self._rebuild_following(follow=position is None)
        self._check_not_replaced()

    def _check_no_lost_records(self) -> None:
        """Refuse a log that lost records (cut, emptied or restored from an older copy) where the
        segments on disk show it (:func:`unnamed`): its view would serve some episodes as all."""
        _, why = unnamed(self.directory, self._state)
        if why is not None:
            raise CorruptDatasetError(
                f"growing dataset {self.head.name!r} is damaged: {why}", hint=damage_hint(self.directory)
            )

    # ------------------------------------------------------------------ pickling (workers)

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": str(self.directory), "position": self._state.position}

    def __setstate__(self, state: dict[str, Any]) -> None:
        GrowingDataset.__init__(self, state["directory"], position=state["position"])

    # ------------------------------------------------------------------ the view

    @property
    def log_position(self) -> int:
        """The commit-log byte this view is as of."""
        return self._state.position

    @property
    def state(self) -> LogState:
        """The commit-log view (segments, eviction count), a copy."""
        return self._state.copy()

    @property
    def log_segments(self) -> list[SegmentEntry]:
        """The view's segments in log order, fully evicted ones included (shared entries: do not
        change them)."""
        return list(self._state.segments)

    def log_order(self) -> dict[bytes, int]:
        """Each of the view's segments' position in the log (fully evicted ones counted): a merge
        or compaction takes runs consecutive in it."""
        return {s.seg: i for i, s in enumerate(self._state.segments)}

    def refresh(self) -> bool:
        """Follow the commit log to its end; returns whether the view changed.

        Costs one ``stat`` when nothing was committed; otherwise the new records and each new
        segment's manifest and index. Indices taken before a refresh that changed the view are
        invalid after it; :attr:`episode_ids` maps episodes between views."""
        try:  # nothing committed: one stat, no open (a third of the full check)
            st = os.stat(self._log_path)
            seen = (st.st_size - st.st_size % RECORD_SIZE, st.st_dev, st.st_ino, st.st_ctime_ns)
        except OSError:
            seen = None
        if seen is not None and seen == self._log_seen:
            return False
        self._check_not_replaced()
        changed = self._state.follow(self.directory / COMMIT_LOG_FILE) != 0
        if seen is not None and seen[0] == self._state.position:
            self._log_seen = seen  # the same file, read to that size: the next stat says enough
        if not changed and not self._behind:
            return False
        self._rebuild_following(follow=True)
        return True

    def _rebuild_following(self, *, follow: bool) -> None:
        """Make the view of the log read so far; where one of its segments was removed meanwhile
        (a writer's eviction or merge with ``grace_seconds=0`` removes at once), read the log
        again and make the view of that (``follow``; :data:`REBUILD_ATTEMPTS` at most).

        Raises:
            DatasetReplacedError: Every attempt lost a segment (the view is made again at the
                next :meth:`refresh`).
        """
        for attempt in range(REBUILD_ATTEMPTS):
            self._behind = True
            try:
                self._rebuild()
            except DatasetReplacedError:
                self._part_ids: list[bytes] = []  # the failed build left the incremental state part-made
                if not follow or attempt + 1 == REBUILD_ATTEMPTS:
                    raise
                self._state.follow(self.directory / COMMIT_LOG_FILE)
                self._log_seen = None
                continue
            self._behind = False
            return

    #: Each live episode's number in the log (int64, increasing), the same in every view
    #: (:attr:`~rlds_cli.cache.commit_log.SegmentEntry.ordinal`).
    episode_ids: np.ndarray

    @property
    def ready(self) -> bool:
        """Whether the view reaches the dataset's ``min_size`` and ``min_total`` (:func:`is_ready`)."""
        protected = sum(e.steps for e, _ in self._state.live() if e.protected)  # never evicted: whole
        return is_ready(self.settings, self.num_steps, protected, self._state.evicted)

    def segment(self, seg: bytes) -> Dataset:
        """The opened segment ``seg`` (a plain :class:`Dataset`)."""
        ds = self._segments.get(seg)
        if ds is None:
            path = self.directory / SEGMENTS_DIR / seg_name(seg)
            try:
                ds = Dataset(path)
            except (DatasetNotFoundError, FileNotFoundError):
                self._check_not_replaced()
                raise self.removal_error(seg) from None
            except CorruptDatasetError:
                if path.is_dir():
                    raise
                self._check_not_replaced()  # moved out whole (retired) between two of its reads
                raise self.removal_error(seg) from None
            problem = schema_problem(self.head, ds.manifest)
            named = ds.manifest.source.get("segment")  # segments written before rlds named them: None
            if named is not None and named != seg_name(seg):
                problem = f"it holds the files of segment {named!r} (a folder copied or swapped)"
            if problem is not None:
                raise CorruptDatasetError(
                    f"segment {path}: {problem}", hint=segment_damage_hint(self.head.name)
                )
            self._segments[seg] = ds
        return ds

    def removal_error(self, seg: bytes) -> CacheError:
        """The error for missing segment ``seg``: :class:`DatasetReplacedError` if removed since
        this view, :class:`CorruptDatasetError` if the log still names it live."""
        latest = LogState()
        latest.follow(self.directory / COMMIT_LOG_FILE)
        if any(entry.seg == seg for entry, _ in latest.live()):
            return CorruptDatasetError(
                f"segment {seg_name(seg)} of growing dataset {self.head.name!r} is missing, and "
                f"{COMMIT_LOG_FILE} holds episodes of it",
                hint=segment_damage_hint(self.head.name),
            )
        return DatasetReplacedError(
            f"segment {seg_name(seg)} of growing dataset {self.head.name!r} was removed "
            "(evicted or compacted) after this reader's view was taken",
            hint="run the command again; a reader in Python: call refresh() more often than the "
            f"dataset's grace_seconds ({self.settings.get('grace_seconds')})",
        )

    def live_segments(self) -> list[tuple[SegmentEntry, int]]:
        """``(segment, episodes of its files skipped)`` for every segment in the view."""
        return [(s, skip - s.dropped) for s, skip in self._state.live()]

    def segment_datasets(self) -> list[Dataset]:
        """The live segments, opened, in log order (each a plain :class:`Dataset`)."""
        return [ds for ds, _ in self._parts]

    def growth(self) -> dict[str, Any]:
        """What ``rlds inspect`` shows of a growing dataset: segments, writers, eviction,
        readiness (JSON-able)."""
        writers: dict[str, dict[str, int]] = {}
        protected = 0
        for (entry, first), ds in zip(self.live_segments(), self.segment_datasets(), strict=True):
            who = ds.manifest.source.get("writer", {})
            label = f"{who.get('host', '?')}:{who.get('pid', '?')}" + (
                " (compacted)" if who.get("compacted") else ""
            )
            row = writers.setdefault(label, {"segments": 0, "episodes": 0, "steps": 0})
            row["segments"] += 1
            row["episodes"] += ds.num_episodes - first
            row["steps"] += ds.num_steps - int(ds.episode_index["start"][first])
            if entry.protected:
                protected += ds.num_episodes - first
        return {
            "segments": len(self._parts),
            "segments_on_disk": len(segment_folders(self.directory)),
            "log_records": self._state.records,
            "evicted_episodes": self._state.evicted,
            "protected_episodes": protected,
            "writers": writers,
            "ready": self.ready,
            **self.settings,
        }

    def _rebuild(self) -> None:
        live = self.live_segments()
        ids = [entry.seg for entry, _ in live]
        firsts = np.fromiter((first for _, first in live), np.int64, len(live))
        if not self._grow(live, ids, firsts):
            self._build(live, ids, firsts)
        self._part_ids = ids
        self._firsts = firsts
        lens = self.episode_index["length"]
        # episode number: segment ordinal + dropped + place among the segment's episodes
        counts = self._neps - firsts
        base = np.fromiter((e.ordinal + e.dropped for e, _ in live), np.int64, len(live)) + firsts
        self.episode_ids = np.repeat(base - (np.cumsum(counts) - counts), counts) + np.arange(
            int(counts.sum()), dtype=np.int64
        )
        # a segment's source ids are its episodes' places in it (writers have no source ids): the
        # dataset's are the episode numbers, which eviction and compaction leave unchanged
        self.episode_index["source_id"] = self.episode_ids
        self.episode_index["start"] = np.cumsum(lens) - lens
        self.episode_bounds = Episodes(lens) if len(lens) else empty_episodes()
        self.manifest = Manifest(
            name=self.head.name,
            backend=self.head.backend,
            num_steps=int(lens.sum()),
            num_episodes=len(lens),
            fields=self.head.fields,
            source=self.head.source,
            conversion=self.head.conversion,
            lineage=self.head.lineage,
            created_by=self.head.created_by,
            created_at=self.head.created_at,
            layout=self.head.layout,
        )
        self._columns = {}
        self._readers = {}
        self._episode_table = None  # of the last view: ds.episodes makes the new view's

    def _build(self, live: list[tuple[SegmentEntry, int]], ids: list[bytes], firsts: np.ndarray) -> None:
        """The view made whole from its segments (linear in the segments)."""
        keep = set(ids)
        for seg in [k for k in self._segments if k not in keep]:
            del self._segments[seg]
            self._facts.pop(seg, None)
        for entry, _ in live:
            if entry.seg not in self._facts:
                self._index_segment(entry)
        facts = self._facts
        n = len(ids)
        self._neps = np.fromiter((len(facts[seg][1]) for seg in ids), np.int64, n)
        self._nsteps = np.fromiter((self._segments[seg].num_steps for seg in ids), np.int64, n)
        pairs = list(zip(ids, firsts.tolist(), strict=True))
        self._step0 = np.fromiter((facts[seg][0][f] for seg, f in pairs), np.int64, n)
        self._parts = [(self._segments[seg], f) for seg, f in pairs]
        index = np.zeros(int((self._neps - firsts).sum()), EPISODE_DTYPE)
        if len(index):
            for field, k in (("length", 1), ("source_id", 2), ("final_known", 3)):
                index[field] = np.concatenate([facts[seg][k][f:] for seg, f in pairs])
        self.episode_index = index

    def _grow(self, live: list[tuple[SegmentEntry, int]], ids: list[bytes], firsts: np.ndarray) -> bool:
        """Extend the last view incrementally when it only lost front episodes and gained end
        segments (appends, FIFO eviction); ``False``, unchanged, for any other change."""
        old_ids: list[bytes] | None = getattr(self, "_part_ids", None)
        if not old_ids or not ids:
            return False
        try:
            d = 0 if old_ids[0] == ids[0] else old_ids.index(ids[0])
        except ValueError:
            return False
        m = len(old_ids) - d  # the old parts kept
        old_firsts = self._firsts
        if (
            m > len(ids)
            or old_ids[d:] != ids[:m]
            or not np.array_equal(old_firsts[d + 1 :], firsts[1:m])
            or firsts[0] < old_firsts[d]
        ):
            return False
        for entry, _ in live[m:]:
            self._index_segment(entry)
        facts = self._facts
        drop = int((self._neps[:d] - old_firsts[:d]).sum()) + int(firsts[0] - old_firsts[d])
        for seg in old_ids[:d]:
            del self._segments[seg]
            self._facts.pop(seg, None)
        new = list(zip(ids[m:], firsts[m:].tolist(), strict=True))
        self._neps = np.concatenate([self._neps[d:], [len(facts[seg][1]) for seg, _ in new]]).astype(np.int64)
        self._nsteps = np.concatenate(
            [self._nsteps[d:], [self._segments[seg].num_steps for seg, _ in new]]
        ).astype(np.int64)
        self._step0 = np.concatenate([self._step0[d:], [facts[seg][0][f] for seg, f in new]]).astype(np.int64)
        self._step0[0] = facts[ids[0]][0][firsts[0]]
        self._parts = [(self._segments[ids[0]], int(firsts[0])), *self._parts[d + 1 :]]
        self._parts += [(self._segments[seg], f) for seg, f in new]
        kept = len(self.episode_index) - drop
        grown = np.zeros(kept + sum(len(facts[seg][1]) - f for seg, f in new), EPISODE_DTYPE)
        grown[:kept] = self.episode_index[drop:]
        at = kept
        for seg, f in new:
            _, length, source_id, final_known = facts[seg]
            n = len(length) - f
            grown["length"][at : at + n] = length[f:]
            grown["source_id"][at : at + n] = source_id[f:]
            grown["final_known"][at : at + n] = final_known[f:]
            at += n
        self.episode_index = grown
        return True

    def _index_segment(self, entry: SegmentEntry) -> None:
        """Open a segment of the view and keep its episode index as plain arrays."""
        ds = self.segment(entry.seg)
        if (ds.num_episodes, ds.num_steps) != (entry.episodes - entry.dropped, entry.steps):
            raise CorruptDatasetError(
                f"segment {ds.directory} holds {ds.num_episodes} episodes of {ds.num_steps} steps, its "
                f"commit record says {entry.episodes - entry.dropped} of {entry.steps}",
                hint=segment_damage_hint(self.head.name),
            )
        index = ds.episode_index
        self._facts[entry.seg] = (
            np.asarray(index["start"], np.int64),
            np.asarray(index["length"], np.int64),
            np.asarray(index["source_id"], np.int64),
            np.asarray(index["final_known"], bool),
        )

    def _open_column(self, key: str, spec: FieldSpec) -> Any:
        flat = spec.storage == "flat"
        row_bytes = spec.row_bytes
        starts = self._step0 + self._firsts if flat else self._step0
        stops = self._nsteps + self._neps if flat else self._nsteps
        # the run of small segments at the end (the newest commits) is read from RAM, in one array
        big = np.flatnonzero(~((stops <= SMALL_ROWS) & (stops * row_bytes <= SMALL_BYTES)))
        cut = int(big[-1]) + 1 if len(big) else 0
        if spec.frame_format is not None:  # frames stay encoded in their segments: no tail in RAM
            cut = len(self._parts)
        # The tail skips evicted rows of its first segment only: a later partly evicted segment
        # starts the tail itself.
        partial = np.flatnonzero(starts[cut + 1 :] > 0)
        if len(partial):
            cut += 1 + int(partial[-1])
        pieces: list[tuple[Any, int, int]] = [
            (lambda ds=ds: ds.column(key), int(starts[i]), int(stops[i]))
            for i, (ds, _) in enumerate(self._parts[:cut])
        ]
        if cut < len(self._parts):
            run = self._tails.get(key)
            if run is None:
                run = self._tails[key] = TailRun(spec.shape, np.dtype(spec.dtype))
            tail = _TailSpec(self, key, cut, starts, stops)
            rows = run.view(tail)
            if not pieces:
                return rows  # the whole view in one array
            pieces.append((lambda rows=rows: rows, 0, len(rows)))
        if len(pieces) == 1 and pieces[0][1] == 0:
            return pieces[0][0]()  # one whole segment: its own column, as fast as converted
        return ConcatColumn(pieces, spec.shape, spec.dtype)

    def _reader_of(self, ds: Dataset, key: str, stop: int) -> Callable[[], np.ndarray]:
        """A reader of a small segment's whole column, keeping no file open."""

        spec = self.head.fields[key]

        def read() -> np.ndarray:
            try:
                rows = self._backend.read_column(ds.directory, key, stop)
            except (OSError, CorruptDatasetError):
                self._check_not_replaced()
                if ds.directory.is_dir():
                    raise  # there, and damaged
                raise self.removal_error(bytes.fromhex(ds.directory.name)) from None
            if rows.dtype != np.dtype(spec.dtype) or rows.shape[1:] != tuple(spec.shape):
                # read without the segment's manifest: its own file says what it holds
                raise CorruptDatasetError(
                    f"array {key!r} of segment {ds.directory} is {rows.dtype} {rows.shape[1:]}, the "
                    f"dataset's manifest says {spec.dtype} {tuple(spec.shape)}",
                    hint=segment_damage_hint(self.head.name),
                )
            return rows

        return read

    def _load_episode_index(self) -> np.ndarray:  # pragma: no cover - built by _rebuild
        return self.episode_index

    def check_files(self) -> list[str]:
        """Check every live segment's files (:meth:`Dataset.check_files`) after replaying the whole log
        (:func:`~rlds_cli.cache.log_checkpoint.verify_log`: :class:`CorruptDatasetError` on damage)."""
        _, why = unnamed(self.directory, verify_log(self.directory))  # the whole log, not the view's tail
        problems = (
            [f"{why}; it may not name every segment (rlds compact keeps the ones it does not)"] if why else []
        )
        for ds, found in self.check_segments(lambda segment: segment.check_files(), list):
            problems += [f"segment {ds.directory.name}: {p}" for p in found]
        self._check_not_replaced()
        return problems

    def check_segments(
        self, check: Callable[[Dataset], _T], problems: Callable[[_T], list[str]]
    ) -> list[tuple[Dataset, _T]]:
        """``(segment, check(segment))`` for each segment of this view, less those live no more in the
        log now (evicted or merged away since: their files may go meanwhile, no damage) whose check
        failed or found ``problems``. Raises :class:`CorruptDatasetError` if the log is damaged."""

        def retired(segment: Path) -> bool:
            (now := self._state.copy()).follow(self.directory / COMMIT_LOG_FILE)
            return all(seg_name(entry.seg) != segment.name for entry, _ in now.live())

        results = []
        for ds, _ in self._parts:
            try:
                found = check(ds)
            except (CacheError, OSError):  # its folder removed under the check
                if retired(ds.directory):
                    continue
                raise
            if not (problems(found) and retired(ds.directory)):
                results.append((ds, found))
        return results

    def __repr__(self) -> str:
        return (
            f"GrowingDataset(name={self.name!r}, steps={self.num_steps}, episodes={self.num_episodes}, "
            f"segments={len(self._parts)}, backend={self.manifest.backend!r})"
        )


class _TailSpec:
    """The small segments from part ``cut`` on, in the form :meth:`TailRun.view` takes."""

    def __init__(self, ds: GrowingDataset, key: str, cut: int, starts: np.ndarray, stops: np.ndarray) -> None:
        self._ds, self._key, self._cut = ds, key, cut
        self.ids = ds._part_ids[cut:]
        self.first_skip = int(starts[cut])
        self._stops = stops

    def read(self, i: int) -> np.ndarray:
        part, _ = self._ds._parts[self._cut + i]
        return self._ds._reader_of(part, self._key, int(self._stops[self._cut + i]))()

    def rows(self, i: int) -> int:
        return int(self._stops[self._cut + i])

    def merged(self, seg: bytes) -> tuple[bytes, ...] | None:
        return self._ds._state.merged.get(seg)


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
