"""The LeRobot reader: a v3.0 or v2.1 dataset directory's parquet rows and the video frames matched
to them, streamed into TED episode by episode.

:class:`LeRobotReader`: a LeRobot v3.0 or v2.1 dataset directory streamed in TED layout,
episode by episode (the rules: :mod:`rlds_cli.formats.lerobot`).

The rows of a LeRobot dataset: its parquet rows, the video frames matched to them, and how they
become TED transitions.

Rows are read in order, one batch in memory, as numeric arrays of the shapes ``info.json``
declares. Row ``t`` is ``(frame t, action t, next.reward[t]) -> frame t + 1``; an episode's last
row is kept with its final observation repeating the last frame (``last_step="keep"``) or dropped
with its reward and success moved onto the row before (``"drop"``); episodes end terminated where
``next.success`` is true on the last frame, else truncated (docs/formats.md, "LeRobot").

LeRobot video frames matched to parquet rows: each camera's mp4 decoded forward with PyAV, one
frame held at a time; row ``t`` gets the frame within :data:`TIMESTAMP_TOLERANCE_S` of
``from_timestamp + timestamp[t]`` (lerobot's rule), as uint8 RGB (``gray``: one channel), HWC or CHW.
That frame must lie inside the episode's span ``[from_timestamp, to_timestamp)`` (v2.1: ``[0,
length / fps)`` of the episode's own file) and be later than the previous row's, and the
timestamps must be finite and increase within the episode: with a span of one frame per row
(:meth:`EpisodeTables._check_span <rlds_cli.formats.lerobot.layout.EpisodeTables._check_span>`),
every frame of the span goes to exactly one row, in order.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlds_cli.errors import (
    FrameError,
    InvalidSelectionError,
    SourceFormatError,
    SourceNotFoundError,
    import_extra,
)
from rlds_cli.formats.base import (
    BlockPacker,
    ConversionReport,
    Piece,
    Reader,
    ReaderOptions,
    StepBlock,
    rows_per_block,
)
from rlds_cli.formats.lerobot.layout import (
    INFO_FILE,
    SPAN_HINT,
    VERSIONS,
    Episode,
    EpisodeTables,
    Feature,
    FeaturePlan,
    as_float,
    dataset_root,
    inside,
    plan_features,
    plan_files,
    sniff,
    source_files,
)
from rlds_cli.formats.untrusted import declared_bytes, read_json_file
from rlds_cli.frames.codecs import EncodedFrames, FrameFormat, image_format, join_rows


def column_array(pa: Any, column: Any, shape: tuple[int, ...], where: Path, name: str) -> np.ndarray:
    """One parquet column as ``[rows, *shape]`` numbers (nested lists flattened; ``(1,)``
    features, which lerobot stores as scalars, get their axis back)."""
    values = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    rows = len(values)
    if values.null_count:
        raise SourceFormatError(f"{where}: column {name!r} has {values.null_count} missing (null) values")
    while (
        pa.types.is_list(values.type)
        or pa.types.is_large_list(values.type)
        or pa.types.is_fixed_size_list(values.type)
    ):
        if not pa.types.is_fixed_size_list(values.type):
            lengths = values.value_lengths().to_numpy(zero_copy_only=False)
            if len(lengths) and (lengths != lengths[0]).any():
                raise SourceFormatError(f"{where}: column {name!r} holds lists of different lengths (ragged)")
        values = values.flatten()
        if values.null_count:
            raise SourceFormatError(f"{where}: column {name!r} has missing (null) values inside its lists")
    if not (
        pa.types.is_integer(values.type)
        or pa.types.is_floating(values.type)
        or pa.types.is_boolean(values.type)
    ):
        raise SourceFormatError(
            f"{where}: column {name!r} holds {values.type} values; rlds stores numeric arrays only "
            "(bool, integers, floats)"
        )
    flat = values.to_numpy(zero_copy_only=False)
    per_row = int(np.prod(shape, dtype=np.int64)) if shape else 1
    if flat.size != rows * per_row:
        raise SourceFormatError(
            f"{where}: column {name!r} has {flat.size // max(rows, 1)} values per row, but "
            f"{INFO_FILE.as_posix()} declares the shape {list(shape)}"
        )
    return flat.reshape(rows, *(shape or (1,)))


def image_column(
    pa: Any, column: Any, shape: tuple[int, ...], chw: bool, where: Path, name: str
) -> EncodedFrames:
    """An image feature's parquet column (the Hugging Face ``Image`` struct of ``bytes`` and ``path``
    lerobot writes), kept as image files: each row's header is checked to be a PNG or JPEG of the
    declared ``shape``; pixels are decoded when read."""
    values = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if not pa.types.is_struct(values.type) or values.type.get_field_index("bytes") < 0:
        raise SourceFormatError(
            f"{where}: image column {name!r} is {values.type}, not the struct of 'bytes' and 'path' "
            "lerobot writes"
        )
    files = values.field("bytes").to_pylist()
    if any(f is None for f in files):
        raise SourceFormatError(
            f"{where}: image column {name!r} names files by path without their bytes; rlds reads images "
            "stored in the parquet",
            hint="push the dataset with its images embedded (lerobot embeds them when it uploads to the Hub)",
        )
    try:
        fmt = FrameFormat("png", shape, chw)  # the codec is the files' own, below
        found = {image_format(data, chw) for data in files}
    except FrameError as exc:
        raise SourceFormatError(f"{where}: image column {name!r}: {exc}") from None
    if len(found) > 1 or (found and next(iter(found)).image_shape != fmt.image_shape):
        seen = sorted(f"{f.codec} {f.image_shape}" for f in found)
        raise SourceFormatError(
            f"{where}: image column {name!r} holds {', '.join(seen)} images; {INFO_FILE.as_posix()} declares "
            f"{list(shape)}"
        )
    codec = next(iter(found)).codec if found else "png"
    return EncodedFrames(files, FrameFormat(codec, shape, chw))


class ParquetCursor:
    """Reads a data file's rows in order, one batch at a time (memory: one batch)."""

    def __init__(self, pa: Any, pq: Any, columns: list[str], block_rows: int) -> None:
        """Read ``columns`` (those a file lacks are left out), ``block_rows`` rows a batch."""
        self.pa = pa
        self.pq = pq
        self.columns = columns
        self.block_rows = block_rows
        self.path: Path | None = None
        self.batches: Iterator[Any] | None = None
        self.buffer: Any = None
        self.pos = 0  # file row of self.buffer's first row
        self.file: Any = None

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
        self.file = self.batches = self.buffer = self.path = None

    def _open(self, path: Path) -> None:
        self.close()
        pq = self.pq
        columns = self.columns
        try:
            self.file = pq.ParquetFile(path)
            names = set(self.file.schema_arrow.names)
            self.batches = iter(
                self.file.iter_batches(
                    batch_size=self.block_rows,
                    columns=[c for c in dict.fromkeys(columns) if c in names],
                )
            )
        except (OSError, ValueError, self.pa.ArrowException) as exc:
            raise SourceFormatError(f"{path} is not a readable parquet file: {exc}") from None
        self.path, self.pos, self.buffer = path, 0, None

    def read(self, path: Path, offset: int, count: int) -> Any:
        """Rows ``offset .. offset + count`` of ``path`` as a pyarrow table."""
        pa = self.pa
        if path != self.path or offset < self.pos:
            self._open(path)
        parts: list[Any] = []
        need_from, need_to = offset, offset + count
        while need_from < need_to:
            if self.buffer is None or self.pos + self.buffer.num_rows <= need_from:
                if self.buffer is not None:
                    self.pos += self.buffer.num_rows
                try:
                    assert self.batches is not None
                    self.buffer = next(self.batches)
                except StopIteration:
                    raise SourceFormatError(f"{path} ends at row {self.pos}, before row {need_to}") from None
                except (OSError, ValueError, pa.ArrowException) as exc:
                    raise SourceFormatError(f"{path} is damaged near row {self.pos}: {exc}") from None
                continue
            lo = need_from - self.pos
            take = min(self.buffer.num_rows - lo, need_to - need_from)
            parts.append(self.buffer.slice(lo, take))
            need_from += take
        return pa.Table.from_batches(parts) if parts else None


def split_part(
    ep: Episode,
    seg: dict[str, np.ndarray],
    last: bool,
    plan: FeaturePlan,
    last_step: str,
    report: ConversionReport,
) -> Piece:
    """One segment as a piece of its episode: step and observation columns by TED key, the last-row rule
    applied, the end terminated where ``next.success`` is true on the last frame, else truncated."""
    steps = {f.name: seg[f.name] for f in plan.features if f.kind in ("action", "reward", "info")}
    obs = {f.name: seg[f.name] for f in plan.features if f.kind in ("observation", "video", "image")}
    success = last and plan.success and bool(np.asarray(seg["next.success"][-1]).any())
    if last and last_step == "drop":
        # the last row has no next frame: drop its transition, frame L-1 is the real final
        # observation, and its reward and success move onto transition L-2 (the return is kept)
        if "next.reward" in steps:
            reward = steps["next.reward"].copy()
            reward[-2] += reward[-1]
            steps["next.reward"] = reward
        if plan.success:
            flag = steps["next.success"].copy()
            flag[-2] |= flag[-1]
            steps["next.success"] = flag
        steps = {k: v[:-1] for k, v in steps.items()}
        report.dropped_rows += 1
    elif last:  # the final observation is not recorded: repeat the last frame (final_known = false)
        obs = {k: join_rows([v, v[-1:]]) for k, v in obs.items()}
    keyed_steps = {f.key: steps[f.name] for f in plan.features if f.kind in ("action", "reward", "info")}
    if "next/reward" not in keyed_steps:
        keyed_steps["next/reward"] = np.zeros((len(next(iter(steps.values()))), 1), np.float32)
    if last and last_step == "keep":
        report.synthesized_final_observations += 1
    return Piece(
        f"episode {ep.index}",
        {f.key: obs[f.name] for f in plan.features if f.kind in ("observation", "video", "image")},
        keyed_steps,
        success,
        source_id=ep.index,
        final_known=last_step == "drop",
        last=last,
    )


def rule_notes(plan: FeaturePlan, last_step: str, report: ConversionReport) -> None:
    """The notes that depend only on the dataset's columns, written before any block (``--episodes A:B``
    may stop reading early)."""
    if last_step == "drop":
        report.notes.append(
            "last_step='drop': each episode's last frame has no next frame, so its transition is "
            "dropped (counted in dropped_rows); that frame is the real final observation, and its "
            "next.reward and next.success move onto the transition before"
        )
    else:
        report.notes.append(
            "LeRobot stores no observation after an episode's last frame: its last transition is kept "
            "and the final observation repeats the last frame (final_known = false)"
        )
    if not any(f.kind == "reward" for f in plan.features):
        report.notes.append("no next.reward column: next/reward = 0")
    report.notes.append(
        "episode ends: terminated where next.success is true on the last frame, else truncated"
        if plan.success
        else "episode ends: no next.success column, so every episode ends truncated"
    )


#: lerobot's ``tolerance_s`` default: how far a frame's time may be from the row's timestamp.
TIMESTAMP_TOLERANCE_S = 1e-4
#: What to do about a data file whose timestamps cannot pick an episode's frames.
TIMESTAMPS_HINT = (
    "the data file's timestamp column is damaged: download the whole dataset folder again "
    "(meta/, data/ and videos/)"
)


class VideoCursor:
    """Decodes one camera's mp4 forward, one frame held at a time, and hands out the frames
    whose times match the rows' timestamps."""

    def __init__(self, av: Any, feature: Feature) -> None:
        self.av = av
        self.feature = feature
        self.path: Path | None = None
        self.container: Any = None
        self.decoder: Iterator[Any] | None = None
        self.current: Any = None
        self.current_time = -np.inf
        self.time_base: Any = None
        #: the last frame handed out: (file, episode, row, frame time, the row's time in the file)
        self.taken: tuple[Path, int, int, float, float] | None = None
        channels = feature.shape[0] if feature.channels_first else feature.shape[-1]
        formats = {1: "gray", 3: "rgb24", 4: "rgba"}
        if channels not in formats:
            raise SourceFormatError(
                f"video feature {feature.name!r} has {channels} channels; rlds decodes 1, 3 or 4"
            )
        self.pixel_format = formats[channels]
        # one converter for every frame: frame.to_ndarray(format=...) builds a swscale context per
        # frame, several times slower for bit-identical output
        self.reformatter = av.video.reformatter.VideoReformatter()

    def close(self) -> None:
        if self.container is not None:
            self.container.close()
        self.container = self.decoder = self.current = self.path = None

    def _open(self, path: Path) -> None:
        self.close()
        try:
            self.container = self.av.open(str(path))
            streams = self.container.streams.video
            if not streams:
                raise SourceFormatError(f"{path} has no video stream")
            stream = streams[0]
            stream.thread_type = "AUTO"  # frame threads: decoding, not our Python, is the cost
            height, width = stream.codec_context.height, stream.codec_context.width
            shape = self.feature.shape
            want = (shape[1], shape[2]) if self.feature.channels_first else (shape[0], shape[1])
            if (height, width) != want:
                raise SourceFormatError(
                    f"{path}: frames are {height}x{width}, but {INFO_FILE.as_posix()} declares "
                    f"{list(shape)} for {self.feature.name!r}"
                )
            self.time_base = stream.time_base
            self.decoder = iter(self.container.decode(stream))
        except self.av.error.FFmpegError as exc:
            self.close()
            raise SourceFormatError(f"{path} is not a readable video: {exc}") from None
        self.path, self.current, self.current_time = path, None, -np.inf
        self._advance()

    def _advance(self) -> None:
        assert self.decoder is not None
        try:
            frame = next(self.decoder)
        except StopIteration:
            self.current, self.current_time = None, np.inf
            return
        except self.av.error.FFmpegError as exc:
            raise SourceFormatError(f"{self.path} is damaged (decoding failed): {exc}") from None
        if frame.pts is None:
            raise SourceFormatError(f"{self.path}: a frame has no timestamp")
        self.current, self.current_time = frame, float(frame.pts * self.time_base)

    def _array(self) -> np.ndarray:
        image = self.reformatter.reformat(self.current, format=self.pixel_format).to_ndarray()
        if image.ndim == 2:
            image = image[:, :, None]
        if self.feature.channels_first:
            image = image.transpose(2, 0, 1)
        return np.ascontiguousarray(image, dtype=np.uint8)

    def frames(
        self,
        path: Path,
        times: np.ndarray,
        episode: int,
        start: float,
        stop: float,
        length: int,
        *,
        first_row: int = 0,
        span: str = "",
    ) -> np.ndarray:
        """The frames at ``times`` (seconds in the file; rows ``first_row ..`` of ``episode``, whose
        span is ``[start, stop)``, from ``span``), as ``[len(times), *shape]`` uint8. Each frame
        must lie inside the span (with the tolerance of the match) and after the previous row's."""
        tol = TIMESTAMP_TOLERANCE_S
        if path != self.path or (len(times) and times[0] < self.current_time - tol):
            self._open(path)
        out = np.empty((len(times), *self.feature.shape), np.uint8)
        for i, t in enumerate(times):
            # parquet timestamps are float32: allow their rounding on top of lerobot's tolerance
            slack = tol + 2 * float(np.spacing(np.float32(t)))
            while self.current is not None and self.current_time < t - slack:
                self._advance()
            if self.current is None or self.current_time > t + slack:
                raise self._missing(path, float(t), episode, start, stop, length)
            self._check_taken(path, episode, first_row + i, float(t), start, stop, slack, span)
            out[i] = self._array()
        return out

    def _check_taken(
        self, path: Path, episode: int, row: int, t: float, start: float, stop: float, slack: float, span: str
    ) -> None:
        """The frame matched to ``row`` (at file time ``t``) lies inside its episode's span, and after
        the frame of the row before: else the row holds another episode's frame, or a frame twice."""
        when, key = self.current_time, self.feature.name
        if not start - slack <= when < stop - slack:
            raise SourceFormatError(
                f"{path}: row {row} of episode {episode} ({key!r}) is matched to the frame at {when:.4f} s, "
                f"outside the episode's span {start:.3f} s to {stop:.3f} s ({span}; the row's timestamp "
                f"is {t - start:.4f} s)",
                hint=SPAN_HINT,
            )
        if self.taken is not None and self.taken[:2] == (path, episode) and when <= self.taken[3]:
            _, _, before, taken, stamp = self.taken
            which = "both matched to the frame" if when == taken else "matched to frames out of order,"
            raise SourceFormatError(
                f"{path}: rows {before} and {row} of episode {episode} ({key!r}) are {which} at "
                f"{when:.4f} s (timestamps {stamp - start:.5f} s and {t - start:.5f} s); each row needs a "
                "frame of its own",
                hint=TIMESTAMPS_HINT,
            )
        self.taken = (path, episode, row, when, t)

    def _missing(
        self, path: Path, t: float, episode: int, start: float, stop: float, length: int
    ) -> SourceFormatError:
        """The error for a row without its frame: count the episode's frames (packets, no decoding)."""
        found = 0
        try:
            with self.av.open(str(path)) as container:
                stream = container.streams.video[0]
                for packet in container.demux(stream):
                    if packet.pts is None:
                        continue
                    when = float(packet.pts * stream.time_base)
                    if start - TIMESTAMP_TOLERANCE_S <= when < stop - TIMESTAMP_TOLERANCE_S:
                        found += 1
        except self.av.error.FFmpegError:
            pass
        if found < length:
            return SourceFormatError(
                f"{path}: episode {episode} has {found} frames between {start:.3f} s and {stop:.3f} s, "
                f"but the parquet has {length} rows for it (no frame at {t:.4f} s)"
            )
        return SourceFormatError(
            f"{path}: episode {episode} has no frame within {TIMESTAMP_TOLERANCE_S} s of {t:.4f} s "
            "(the video's frame times do not match the parquet's timestamps)"
        )


#: What to install to read LeRobot datasets (their tables and their videos).
LEROBOT_EXTRA_HINT = "pip install 'rlds-cli[lerobot]' (pyarrow and av)"

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
        self.pa = import_extra("pyarrow", f"{root}: reading a LeRobot dataset", hint=LEROBOT_EXTRA_HINT)
        self.pq = importlib.import_module("pyarrow.parquet")
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
        #: the last timestamp read: (episode, its next row, timestamp), to compare across blocks
        self._stamp_tail: tuple[int, int, float] | None = None
        self._dtype_noted: set[str] = set()
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
            self._av = import_extra(
                "av", f"{self.root}: decoding LeRobot videos", hint=LEROBOT_EXTRA_HINT, package="PyAV (av)"
            )
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
                self._note_dtype(f, out[f.name].dtype, where)
        if self.tasks and "task_index" in out:
            self._check_tasks(out["task_index"], where)
        if self.videos:
            if "timestamp" not in table.column_names:
                raise SourceFormatError(f"{where} has no 'timestamp' column; video frames are matched by it")
            stamps = column_array(self.pa, table.column("timestamp"), (), where, "timestamp").reshape(-1)
            self._check_stamps(ep, start, stamps.astype(np.float64), where)
            for f in self.videos:
                video, lo, hi = ep.videos[f.name]
                times = lo + stamps.astype(np.float64)
                span = (
                    f"videos/{f.name}/from_timestamp, to_timestamp in meta/episodes"
                    if self.version == "v3.0"
                    else "0 s to length / fps: v2.1 gives each episode its own file"
                )
                out[f.name] = self._video(f).frames(
                    video, times, ep.index, lo, hi, ep.length, first_row=start, span=span
                )
        return out

    def _note_dtype(self, feature: Feature, held: np.dtype[Any], where: Path) -> None:
        """A note (once per feature) where the parquet holds another dtype than ``info.json``
        declares: the parquet's values are what is stored."""
        if feature.name in self._dtype_noted or not feature.declared:
            return
        try:
            declared = np.dtype(feature.declared)
        except TypeError:
            return  # a dtype numpy has no name for (lerobot's own): nothing to compare with
        if declared != held:
            self._dtype_noted.add(feature.name)
            self.report.notes.append(
                f"{where.name}: column {feature.name!r} holds {held}, {INFO_FILE.as_posix()} declares "
                f"{feature.declared}: the parquet's values are kept as {held}"
            )

    def _check_stamps(self, ep: Episode, start: int, stamps: np.ndarray, where: Path) -> None:
        """Rows ``start ..`` of ``ep`` have finite timestamps that increase within the episode (from
        the block before too): each row is matched to a video frame of its own by its timestamp, so
        a NaN would take the frame held, and a repeat the previous row's frame. Checked only where
        the dataset has video: without it the timestamp chooses nothing and is kept as data
        (``info/timestamp``), as stored."""
        bad = np.flatnonzero(~np.isfinite(stamps))
        if bad.size:
            i = int(bad[0])
            raise SourceFormatError(
                f"{where}: row {start + i} of episode {ep.index} (file row {ep.row_offset + start + i}) has "
                f"timestamp {stamps[i]}; video frames are matched by timestamp, so each must be a finite "
                "number of seconds",
                hint=TIMESTAMPS_HINT,
            )
        tail = self._stamp_tail
        before = tail is not None and tail[:2] == (ep.index, start)
        seq = np.concatenate([[tail[2]], stamps]) if tail is not None and before else stamps
        down = np.flatnonzero(np.diff(seq) <= 0)
        if down.size:
            j = int(down[0])
            row = start + j + (0 if before else 1)
            raise SourceFormatError(
                f"{where}: row {row} of episode {ep.index} (file row {ep.row_offset + row}) has timestamp "
                f"{seq[j + 1]:.4f} s, not after row {row - 1}'s {seq[j]:.4f} s; an episode's timestamps "
                "must increase, each row being matched to a video frame of its own",
                hint=TIMESTAMPS_HINT,
            )
        if len(stamps):
            self._stamp_tail = (ep.index, start + len(stamps), float(stamps[-1]))

    def _check_tasks(self, indices: np.ndarray, where: Path) -> None:
        """Every row's ``task_index`` is a task of the tasks table (lerobot looks each one up there)."""
        known = np.fromiter(self.tasks, np.int64, len(self.tasks))
        unknown = ~np.isin(indices.reshape(-1), known)
        if unknown.any():
            table = "tasks.jsonl" if self.version == "v2.1" else "tasks.parquet"
            raise SourceFormatError(
                f"{where}: a row has task_index {indices.reshape(-1)[np.flatnonzero(unknown)[0]]}, which "
                f"meta/{table} does not hold (its tasks: {len(self.tasks)})",
                hint=f"write the missing task into meta/{table}, or the task_index column again",
            )

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
