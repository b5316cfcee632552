""":class:`LeRobotReader`: a LeRobot v3.0 or v2.1 dataset directory streamed in TED layout,
episode by episode (the rules: :mod:`rlds_cli.formats.lerobot`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlds_cli.errors import InvalidSelectionError, MissingExtraError, SourceFormatError, SourceNotFoundError
from rlds_cli.formats.base import ConversionReport, Reader, ReaderOptions, StepBlock
from rlds_cli.formats.lerobot.layout import (
    INFO_FILE,
    VERSIONS,
    Episode,
    EpisodeTables,
    Feature,
    as_float,
    dataset_root,
    inside,
    plan_features,
    plan_files,
    sniff,
    source_files,
)
from rlds_cli.formats.lerobot.rows import (
    ParquetCursor,
    VideoCursor,
    column_array,
    image_column,
    rule_notes,
    split_part,
)
from rlds_cli.formats.packing import BlockPacker, rows_per_block
from rlds_cli.formats.untrusted import declared_bytes, read_json_file

#: Most rows a block holds, however small (blocks target ``packing.BLOCK_BYTES`` of decoded rows,
#: frames included).
BLOCK_ROWS = 1 << 16


@dataclass(frozen=True)
class LeRobotOptions(ReaderOptions):
    """Options of :class:`LeRobotReader` (its keyword arguments)."""

    last_step: Literal["keep", "drop"] = "keep"
    block_rows: int | None = None


class LeRobotReader(Reader):
    """Streams a LeRobot v3.0 or v2.1 dataset directory in TED layout, episode by episode."""

    format_name = "lerobot"
    expected_files = (
        "a LeRobot v3.0 or v2.1 dataset folder: meta/info.json (with codebase_version), data/, videos/"
    )
    Options = LeRobotOptions
    sniff = staticmethod(sniff)
    source_files = staticmethod(source_files)

    def __init__(
        self,
        path: str | Path | Sequence[str | Path],
        *,
        last_step: str = "keep",
        block_rows: int | None = None,
    ) -> None:
        """Plan a conversion of the dataset at ``path`` (its directory or its ``meta/info.json``).

        Args:
            path: The dataset directory.
            last_step: ``"keep"`` (default): each episode's last frame stays a transition and its
                final observation repeats that frame (``final_known = false``). ``"drop"``: that
                transition is dropped and the last frame is the real final observation, its
                reward and success moved onto the transition before (docs/formats.md, "LeRobot").
            block_rows: Rows per block (default: about ``packing.BLOCK_BYTES`` of decoded rows).
        """
        if last_step not in ("keep", "drop"):
            raise SourceFormatError(f"last_step is {last_step!r}; the lerobot format takes 'keep' or 'drop'")
        self.last_step = last_step
        if not isinstance(path, str | Path):
            raise SourceFormatError("the lerobot format reads one dataset directory, got several paths")
        self.path = Path(path)
        if not self.path.exists():
            raise SourceNotFoundError(f"source {self.path} does not exist")
        root = dataset_root(self.path)
        if root is None:
            raise SourceFormatError(
                f"{self.path} is not a LeRobot dataset (no meta/info.json)",
                hint="pass the dataset directory (the one holding meta/, data/ and videos/)",
            )
        self.root = root
        try:
            import pyarrow
            import pyarrow.parquet
        except ImportError:
            raise MissingExtraError(
                f"{root}: LeRobot datasets are read with pyarrow, which is not installed",
                hint="pip install 'rlds-cli[lerobot]' (pyarrow and av)",
            ) from None
        self.pa = pyarrow
        self.pq = pyarrow.parquet
        self.report = ConversionReport(rules="lerobot-v1")
        self.info_path = root / INFO_FILE
        info = read_json_file(inside(root, self.info_path, None, "file"))
        if not isinstance(info, dict):
            raise SourceFormatError(f"{self.info_path} is not a JSON object")
        self.info = info
        version = info.get("codebase_version")
        if version not in VERSIONS:
            raise SourceFormatError(
                f"{self.info_path}: codebase_version {version!r} is not one rlds reads "
                f"({', '.join(VERSIONS)})",
                hint="convert the dataset with lerobot's own conversion script to v3.0 first",
            )
        self.version = str(version)
        self.fps = as_float(info.get("fps"), self.info_path, "fps")
        if self.fps <= 0:
            raise SourceFormatError(f"{self.info_path}: fps is {self.fps}, not > 0")
        self.plan = plan_features(info, self.info_path, self.report)
        self.features, self.videos, self.columns = self.plan.features, self.plan.videos, self.plan.columns
        self.axis_names, self.success = self.plan.axis_names, self.plan.success
        tables = EpisodeTables(root, info, self.version, self.fps, self.plan, self.report, self.pa, self.pq)
        self.tasks = tables.read_tasks()
        self.episodes = tables.read_episodes()
        # the files are checked when read (blocks): a download of some episodes holds only theirs
        self._tables, self._checked, self._all = tables, False, list(self.episodes)
        self.n = sum(e.length for e in self.episodes)
        self.report.source_rows = self.n
        tables.check_totals(self.episodes)
        kept = sum(e.length - 1 for e in self.episodes if e.length) if last_step == "drop" else self.n
        self.report.expected = {"num_steps": kept, "num_episodes": len(self.episodes)}
        cameras = ("video", "image")
        row_bytes = sum(
            declared_bytes(f.shape, np.dtype(np.float64)) for f in self.features if f.kind not in cameras
        )
        row_bytes += sum(
            declared_bytes(f.shape, np.dtype(np.uint8)) for f in self.features if f.kind in cameras
        )
        self.block_rows: int = block_rows or rows_per_block(row_bytes, 1, BLOCK_ROWS)
        self._av: Any = None
        self._early_done = 0
        self._early_note: int | None = None
        rule_notes(self.plan, self.last_step, self.report)
        self._videos: dict[str, VideoCursor] = {}
        columns = [*(f.name for f in self.columns), "episode_index"]
        if self.videos and "timestamp" not in columns:
            columns.append("timestamp")
        self._data = ParquetCursor(self.pa, self.pq, list(dict.fromkeys(columns)), self.block_rows)

    # ------------------------------------------------------------------ reading

    plan_files = staticmethod(plan_files)

    def select_episodes(self, first: int, stop: int | None) -> int:
        """Read only the episodes at stream positions ``[first, stop)``: ``episode_index`` order, less the
        episodes the stream skips (no row; one row under ``last_step="drop"``)."""
        live = [i for i, ep in enumerate(self.episodes) if not self._skipped(ep)]
        if first >= len(live):
            span = f"numbered 0 to {len(live) - 1}" if live else "none holds a transition"
            raise InvalidSelectionError(
                f"episodes {first}:{'' if stop is None else stop} selects none of the {len(live)} "
                f"episodes of {self.root} ({span})",
                hint=f"ask for A:B with A < {len(live)}" if live else "the dataset has no episode to convert",
            )
        last = live[min(stop, len(live)) - 1] if stop is not None else len(self.episodes) - 1
        # count skipped episodes without a transition as a whole read would: the report (and
        # `rlds validate`'s subset check) takes the source's totals
        for ep in (*self.episodes[: live[first]], *self.episodes[last + 1 :]):
            if self._skipped(ep):
                self.report.dropped_episodes += 1
                self.report.dropped_rows += ep.length
        self.episodes = self.episodes[live[first] : last + 1]
        return first

    def episode_files(self) -> list[str]:
        """The data and video files of the selected episodes (a v3.0 file holding other episodes
        too is needed whole)."""
        files = {ep.data_file for ep in self.episodes}
        files.update(video for ep in self.episodes for video, _, _ in ep.videos.values())
        return sorted(f.relative_to(self.root).as_posix() for f in files)

    def total_rows(self) -> int:
        return sum(e.length for e in self.episodes)

    def source_metadata(self) -> dict[str, Any]:
        return {
            "lerobot": {
                "codebase_version": self.version,
                "fps": self.fps,
                "robot_type": self.info.get("robot_type"),
                # a licence info.json declares (rlds_cli.cache.card reads it into the card)
                **({"license": self.info["license"]} if self.info.get("license") else {}),
                "tasks": {str(k): v for k, v in sorted(self.tasks.items())},
                "keys": {f.name: f.key for f in self.features if f.key},
                "video_layout": {f.key: "CHW" if f.channels_first else "HWC" for f in self.videos},
                "names": {n: v for n, v in self.axis_names.items() if any(f.name == n for f in self.columns)},
            }
        }

    def source_arrays(self) -> dict[str, np.ndarray]:
        return {}

    def close(self) -> None:
        for cursor in self._videos.values():
            cursor.close()
        self._videos.clear()
        self._data.close()

    def _video(self, feature: Feature) -> VideoCursor:
        if self._av is None:
            try:
                import av
            except ImportError:
                raise MissingExtraError(
                    f"{self.root}: LeRobot videos are decoded with PyAV (av), which is not installed",
                    hint="pip install 'rlds-cli[lerobot]' (pyarrow and av)",
                ) from None
            self._av = av
        if feature.name not in self._videos:
            self._videos[feature.name] = VideoCursor(self._av, feature)
        return self._videos[feature.name]

    def _segment(self, ep: Episode, start: int, count: int) -> dict[str, Any]:
        """Rows ``start .. start + count`` of one episode: every column, frames included."""
        table = self._data.read(ep.data_file, ep.row_offset + start, count)
        where = ep.data_file
        ids = column_array(self.pa, table.column("episode_index"), (), where, "episode_index")
        if (ids.reshape(-1) != ep.index).any():
            bad = int(ids.reshape(-1)[np.flatnonzero(ids.reshape(-1) != ep.index)[0]])
            raise SourceFormatError(
                f"{where}: a row of episode {ep.index} (by the episodes table) has episode_index {bad}"
            )
        out: dict[str, Any] = {}
        for f in self.columns:
            if f.kind == "consumed" and f.name != "next.done":
                continue
            if f.kind == "image":
                out[f.name] = image_column(
                    self.pa, table.column(f.name), f.shape, f.channels_first, where, f.name
                )
            else:
                out[f.name] = column_array(self.pa, table.column(f.name), f.shape, where, f.name)
        if self.videos:
            if "timestamp" not in table.column_names:
                raise SourceFormatError(f"{where} has no 'timestamp' column; video frames are matched by it")
            stamps = column_array(self.pa, table.column("timestamp"), (), where, "timestamp").reshape(-1)
            for f in self.videos:
                video, lo, hi = ep.videos[f.name]
                times = lo + stamps.astype(np.float64)
                out[f.name] = self._video(f).frames(video, times, ep.index, lo, hi, ep.length)
        return out

    def _starts(self, length: int) -> list[int]:
        """Where each segment of an episode starts: every ``block_rows`` rows, never leaving a one-row last
        segment when that row is dropped (``last_step="drop"`` moves its reward onto the row before)."""
        starts = list(range(0, length, self.block_rows))
        if self.last_step == "drop" and len(starts) > 1 and length - starts[-1] == 1:
            starts.pop()
        return starts

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the episodes in ``episode_index`` order, as blocks of about ``packing.BLOCK_BYTES``."""
        packer = BlockPacker(self.block_rows)
        if not self._checked:
            self._tables.check_files(self._all, self.episodes)
            self._checked = True
        for ep in self.episodes:
            if self._skipped(ep):  # no transition to keep
                self.report.dropped_episodes += 1
                self.report.dropped_rows += ep.length
                if progress is not None and ep.length:
                    progress(ep.length)
                continue
            starts = self._starts(ep.length)
            for start, stop in zip(starts, [*starts[1:], ep.length], strict=True):
                count = stop - start
                seg = self._segment(ep, start, count)
                last = stop == ep.length
                if "next.done" in seg:
                    done = np.asarray(seg.pop("next.done")).reshape(count, -1).any(axis=1).reshape(count)
                    self._count_early_done(int(done[: count - 1 if last else count].sum()))
                yield from packer.add(split_part(ep, seg, last, self.plan, self.last_step, self.report))
                if progress is not None:
                    progress(count)
        yield from packer.finish()

    def _skipped(self, ep: Episode) -> bool:
        """Whether ``ep`` has no transition to keep (no row, or one row dropped as the last)."""
        return ep.length == 0 or (self.last_step == "drop" and ep.length == 1)

    def _count_early_done(self, count: int) -> None:
        """Add ``count`` frames whose ``next.done`` is set before their episode's last frame to
        the note that says so (kept current block by block)."""
        if not count:
            return
        self._early_done += count
        note = (
            f"next.done is true on {self._early_done} frame(s) that are not an episode's last; episodes "
            "are cut by episode_index only"
        )
        if self._early_note is None:
            self._early_note = len(self.report.notes)
            self.report.notes.append(note)
        else:
            self.report.notes[self._early_note] = note
