"""The metadata tables of a LeRobot dataset: the tasks and the episodes with each one's data and
video files, and the check that every file they name exists with the rows and columns stated.

Episodes table: v3.0 parquet files under ``meta/episodes/``, v2.1 ``meta/episodes.jsonl``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import ConversionReport
from rlds_cli.formats.lerobot.layout import (
    INCOMPLETE,
    INFO_FILE,
    FeaturePlan,
    fill_template,
    inside,
    resolve_file,
)
from rlds_cli.formats.untrusted import check_declared, check_json_size, declared_bytes


@dataclass
class Episode:
    """One episode: where its rows and frames are."""

    index: int
    length: int
    data_file: Path
    row_offset: int
    #: video key -> (file, from_timestamp, to_timestamp)
    videos: dict[str, tuple[Path, float, float]] = field(default_factory=dict)


def as_int(value: object, where: object, what: str, *, minimum: int = 0, hint: str | None = None) -> int:
    """``value`` as an int >= ``minimum``; a format error naming ``where`` and ``what`` (and
    ``hint``) otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < minimum:
        raise SourceFormatError(f"{where}: {what} is {value!r}, not an integer >= {minimum}", hint=hint)
    return int(value)


#: What to do about a ``meta/info.json`` whose counts contradict the episodes table.
COUNTS_HINT = (
    "the dataset is incomplete or its meta/info.json is damaged: download the whole dataset folder "
    "again (meta/, data/ and videos/)"
)
#: What to do about a ``chunks_size`` that no LeRobot layout can have.
CHUNKS_SIZE_HINT = (
    "chunks_size is how many episodes (v2.1) or files (v3.0) one chunk-NNN folder holds, an integer >= 1 "
    "(lerobot writes 1000): meta/info.json is damaged; get the dataset again from its source"
)


def chunks_size(info: dict[str, Any], info_path: Path) -> int | None:
    """``info.json``'s ``chunks_size`` (``None`` when absent). v2.1 computes every path from it; v3.0 does
    not need it, but a value no layout can have (0, negative, not an integer) is refused in both.
    """
    value = info.get("chunks_size")
    if value is None:
        return None
    return as_int(value, info_path, "chunks_size", minimum=1, hint=CHUNKS_SIZE_HINT)


def as_float(value: object, where: object, what: str) -> float:
    """``value`` as a finite float; a format error naming ``where`` and ``what`` otherwise."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.number) or not np.isfinite(value):
        raise SourceFormatError(f"{where}: {what} is {value!r}, not a finite number")
    return float(value)


class EpisodeTables:
    """Reads the tasks and episodes tables of the dataset at ``root`` (every file checked to be
    inside it), for the features ``plan``."""

    def __init__(
        self,
        root: Path,
        info: dict[str, Any],
        version: str,
        fps: float,
        plan: FeaturePlan,
        report: ConversionReport,
        pa: Any,
        pq: Any,
    ) -> None:
        self.root = root
        self.info = info
        self.info_path = root / INFO_FILE
        self.version = version
        self.fps = fps
        self.plan = plan
        self.report = report
        self.pa = pa
        self.pq = pq
        self.chunks_size = chunks_size(info, self.info_path)

    def read_episodes(self) -> list[Episode]:
        """Every episode, in ``episode_index`` order, with its files and its row offset."""
        return self._read_episodes_v3() if self.version == "v3.0" else self._read_episodes_v21()

    def _read_parquet(self, path: Path, columns: list[str] | None = None) -> Any:
        try:
            return self.pq.read_table(inside(self.root, path, None, "file"), columns=columns)
        except (OSError, ValueError, self.pa.ArrowException) as exc:
            raise SourceFormatError(f"{path} is not a readable parquet file: {exc}") from None

    def _read_jsonl(self, path: Path) -> list[dict[str, Any]]:
        inside(self.root, path, None, "file")
        if not path.is_file():
            raise SourceFormatError(f"{path} is missing; a LeRobot {self.version} dataset needs it")
        check_json_size(path)
        rows = []
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise SourceFormatError(f"{path}: line {number} is not JSON: {exc}") from None
            if not isinstance(row, dict):
                raise SourceFormatError(f"{path}: line {number} is not a JSON object")
            rows.append(row)
        return rows

    def read_tasks(self) -> dict[int, str]:
        """task_index -> task text (kept in the source metadata; text is not a step array)."""
        if self.version == "v2.1":
            path = self.root / "meta" / "tasks.jsonl"
            return {
                as_int(r.get("task_index"), path, "task_index"): str(r.get("task", ""))
                for r in self._read_jsonl(path)
            }
        path = self.root / "meta" / "tasks.parquet"
        if not path.is_file():
            self.report.notes.append("no meta/tasks.parquet: task texts unknown")
            return {}
        table = self._read_parquet(path)
        names = table.column_names
        if "task_index" not in names:
            raise SourceFormatError(f"{path} has no 'task_index' column")
        # lerobot writes the task text as the pandas index ('__index_level_0__') or a 'task' column
        text = "task" if "task" in names else next((n for n in names if n != "task_index"), None)
        if text is None:
            raise SourceFormatError(f"{path} has no task text column")
        indices = table.column("task_index").to_pylist()
        texts = table.column(text).to_pylist()
        return {as_int(i, path, "task_index"): str(t) for i, t in zip(indices, texts, strict=True)}

    def _data_file(self, values: dict[str, Any]) -> Path:
        rel = fill_template(self.info.get("data_path"), values, self.info_path, "data_path", self.version)
        return resolve_file(self.root, rel, self.info_path, "data_path")

    def _video_file(self, values: dict[str, Any]) -> Path:
        rel = fill_template(self.info.get("video_path"), values, self.info_path, "video_path", self.version)
        return resolve_file(self.root, rel, self.info_path, "video_path")

    def _read_episodes_v3(self) -> list[Episode]:
        folder = self.root / "meta" / "episodes"
        files = sorted(folder.glob("chunk-*/file-*.parquet")) if folder.is_dir() else []
        if not files:
            raise SourceFormatError(
                f"{self.root}: no meta/episodes/chunk-*/file-*.parquet; a LeRobot v3.0 dataset needs them"
            )
        base = ["episode_index", "length", "data/chunk_index", "data/file_index", "dataset_from_index"]
        video_cols = [
            f"videos/{v.name}/{c}"
            for v in self.plan.videos
            for c in ("chunk_index", "file_index", "from_timestamp", "to_timestamp")
        ]
        rows: list[dict[str, Any]] = []
        for path in files:
            schema_names = set(self._schema(path).names)
            missing = [c for c in (*base, *video_cols) if c not in schema_names]
            if missing:
                raise SourceFormatError(f"{path} has no {missing[0]!r} column (LeRobot v3.0 episodes table)")
            table = self._read_parquet(path, columns=[*base, *video_cols])
            rows += [{**r, "\0file": path} for r in table.to_pylist()]
        episodes: list[Episode] = []
        file_base: dict[Path, int] = {}
        seen: set[int] = set()
        for r in sorted(rows, key=lambda r: as_int(r["episode_index"], r["\0file"], "episode_index")):
            where = r["\0file"]
            index = as_int(r["episode_index"], where, "episode_index")
            if index in seen:
                raise SourceFormatError(f"{where}: episode_index {index} is listed twice")
            seen.add(index)
            what = f"episode {index}"
            data = self._data_file(
                {
                    "chunk_index": as_int(r["data/chunk_index"], where, f"{what} data/chunk_index"),
                    "file_index": as_int(r["data/file_index"], where, f"{what} data/file_index"),
                }
            )
            start = as_int(r["dataset_from_index"], where, f"{what} dataset_from_index")
            file_base[data] = min(file_base.get(data, start), start)
            ep = Episode(index, as_int(r["length"], where, f"{what} length"), data, start)
            for v in self.plan.videos:
                col = f"videos/{v.name}/"
                video = self._video_file(
                    {
                        "video_key": v.name,
                        "chunk_index": as_int(r[col + "chunk_index"], where, f"{what} {col}chunk_index"),
                        "file_index": as_int(r[col + "file_index"], where, f"{what} {col}file_index"),
                    }
                )
                lo = as_float(r[col + "from_timestamp"], where, f"{what} {col}from_timestamp")
                hi = as_float(r[col + "to_timestamp"], where, f"{what} {col}to_timestamp")
                if hi < lo:
                    raise SourceFormatError(
                        f"{where}: {what} ends at {hi} s in {video.name}, before it starts ({lo} s)"
                    )
                ep.videos[v.name] = (video, lo, hi)
            episodes.append(ep)
        for ep in episodes:  # dataset_from_index is global: the row within the file counts from its first
            ep.row_offset -= file_base[ep.data_file]
        return episodes

    def _read_episodes_v21(self) -> list[Episode]:
        path = self.root / "meta" / "episodes.jsonl"
        chunks = self.chunks_size
        if chunks is None:
            raise SourceFormatError(
                f"{self.info_path} has no chunks_size; LeRobot v2.1 paths are computed from it",
                hint=CHUNKS_SIZE_HINT,
            )
        episodes: list[Episode] = []
        seen: set[int] = set()
        for r in self._read_jsonl(path):
            index = as_int(r.get("episode_index"), path, "episode_index")
            if index in seen:
                raise SourceFormatError(f"{path}: episode_index {index} is listed twice")
            seen.add(index)
            values = {"episode_chunk": index // chunks, "episode_index": index}
            length = as_int(r.get("length"), path, f"episode {index} length")
            ep = Episode(index, length, self._data_file(values), 0)
            for v in self.plan.videos:  # one mp4 per episode and camera, starting at 0
                ep.videos[v.name] = (
                    self._video_file({**values, "video_key": v.name}),
                    0.0,
                    length / self.fps,
                )
            episodes.append(ep)
        if not episodes:
            raise SourceFormatError(f"{path} lists no episodes")
        return sorted(episodes, key=lambda e: e.index)

    def check_totals(self, episodes: list[Episode]) -> None:
        """Check info.json's declared totals against the whole episodes table ``episodes``.

        ``total_episodes`` and ``total_frames`` that are not counts, or differ from the table, are
        refused (fewer episodes than declared is an incomplete download). v2.1's ``total_chunks`` only
        summarises the layout: a mismatch is a note. Nothing is sized by a declared number.
        """
        held = {
            "total_episodes": (len(episodes), f"lists {len(episodes)} episode(s)"),
            "total_frames": (frames := sum(e.length for e in episodes), f"sums to {frames} frames"),
        }
        for name, (count, says) in held.items():
            if name not in self.info:
                continue
            declared = as_int(self.info[name], self.info_path, name, hint=COUNTS_HINT)
            if declared != count:
                raise SourceFormatError(
                    f"{self.info_path} says {name}={declared} but the episodes table {says}", hint=COUNTS_HINT
                )
        declared_chunks = self.info.get("total_chunks")
        if self.version != "v2.1" or declared_chunks is None or self.chunks_size is None:
            return
        found = len({e.index // self.chunks_size for e in episodes})
        if type(declared_chunks) is not int or declared_chunks != found:
            self.report.notes.append(
                f"{self.info_path} says total_chunks={declared_chunks!r} but the episodes lie in {found} "
                f"chunk folder(s) of chunks_size {self.chunks_size}; paths are computed from chunks_size, "
                "total_chunks was not used"
            )

    def _schema(self, path: Path) -> Any:
        try:
            return self.pq.read_schema(inside(self.root, path, None, "file"))
        except (OSError, ValueError, self.pa.ArrowException) as exc:
            raise SourceFormatError(f"{path} is not a readable parquet file: {exc}") from None

    def check_files(self, episodes: list[Episode], selected: list[Episode] | None = None) -> None:
        """Before anything is converted: every file the tables name for the ``selected`` episodes (default:
        all) exists, and every such data file has the columns and rows the whole episodes table says."""
        chosen = {id(ep) for ep in selected} if selected is not None else None
        wanted = {ep.data_file for ep in episodes if chosen is None or id(ep) in chosen}
        by_file: dict[Path, list[Episode]] = {}
        for ep in episodes:
            if ep.data_file in wanted:
                by_file.setdefault(ep.data_file, []).append(ep)
            if chosen is not None and id(ep) not in chosen:
                continue
            for video, _, _ in ep.videos.values():
                if not video.is_file():
                    raise SourceFormatError(
                        f"{video} is missing (named by {INFO_FILE.as_posix()}'s video_path for episode "
                        f"{ep.index})",
                        hint=INCOMPLETE,
                    )
        needed = [f.name for f in self.plan.columns]
        row_bytes = 0
        for path, eps in by_file.items():
            if not path.is_file():
                raise SourceFormatError(
                    f"{path} is missing (named by {INFO_FILE.as_posix()}'s data_path for episode "
                    f"{eps[0].index})",
                    hint=INCOMPLETE,
                )
            try:
                meta = self.pq.read_metadata(path)
            except (OSError, ValueError, self.pa.ArrowException) as exc:
                raise SourceFormatError(f"{path} is not a readable parquet file: {exc}") from None
            names = set(meta.schema.to_arrow_schema().names)
            missing = [c for c in needed if c not in names]
            if missing:
                raise SourceFormatError(
                    f"{path} has no {missing[0]!r} column, which {INFO_FILE.as_posix()} declares"
                )
            if "episode_index" not in names:
                raise SourceFormatError(f"{path} has no 'episode_index' column")
            rows = sum(e.length for e in eps)
            last = max(e.row_offset + e.length for e in eps)
            if meta.num_rows != rows or last > meta.num_rows:
                raise SourceFormatError(
                    f"{path} has {meta.num_rows} rows but the episodes table gives it {rows} "
                    f"(episodes {eps[0].index}..{eps[-1].index})"
                )
            if not row_bytes:
                row_bytes = sum(
                    declared_bytes(f.shape, np.dtype(np.float64)) for f in self.plan.columns
                ) + declared_bytes((), np.dtype(np.int64))
            # untrusted input: a small file cannot declare a vast number of rows (RLE of zeros)
            check_declared(
                path, "rows", meta.num_rows * row_bytes, path.stat().st_size, how="compresses into"
            )
