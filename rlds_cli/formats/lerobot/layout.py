"""A LeRobot dataset's files, features and metadata tables: where the files are, which may be
read, what each feature of ``info.json`` becomes, and the tasks and episodes tables.

The dataset directory is found from the folder or its ``meta/info.json``; ``data_path`` and
``video_path`` templates are filled by a restricted formatter (known fields, integer widths only);
every file named or found must stay inside the dataset directory once symlinks are followed (or
in a Hugging Face hub snapshot's repository ``blobs/``). Each feature gets a kind, a TED key and,
for a camera, an axis order (docs/formats.md, "LeRobot", "Keys").

**The metadata tables** (:class:`EpisodeTables`): the tasks and the episodes with each one's data
and video files, and the check that every file they name exists with the rows and columns stated.

Episodes table: v3.0 parquet files under ``meta/episodes/``, v2.1 ``meta/episodes.jsonl``.
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.errors import SourceFormatError
from rlds_cli.formats.base import ConversionReport, clean_keys, renamed_note, text_note
from rlds_cli.formats.untrusted import (
    UnsafeSourceError,
    check_declared,
    check_json_size,
    declared_bytes,
    read_json_file,
    require_shape,
)

#: ``codebase_version`` values this reader understands.
VERSIONS = ("v2.1", "v3.0")
INFO_FILE = Path("meta") / "info.json"
#: Fields a path template may use, per version, and the integer width a spec may ask for.
_TEMPLATE_FIELDS = {
    "v3.0": {"chunk_index", "file_index", "video_key"},
    "v2.1": {"episode_chunk", "episode_index", "video_key"},
}
_SPEC = re.compile(r"(0?[0-9]{1,2})?d")
INCOMPLETE = "the dataset is incomplete: download the whole dataset folder again (meta/, data/ and videos/)"


def dataset_root(path: Path) -> Path | None:
    """The LeRobot dataset directory of ``path`` (the directory, or its ``meta/info.json``)."""
    if path.is_dir() and (path / INFO_FILE).is_file():
        return path
    if path.is_file() and path.name == "info.json" and path.parent.name == "meta":
        return path.parent.parent
    return None


def is_lerobot(path: Path) -> bool:
    """Whether ``path`` looks like a LeRobot dataset: a ``meta/info.json`` with a ``codebase_version``
    (or one that does not parse or is no JSON object, so that this reader names the problem)."""
    root = dataset_root(path)
    if root is None:
        return False
    try:
        info = read_json_file(root / INFO_FILE)
    except SourceFormatError:
        return True
    return not isinstance(info, dict) or "codebase_version" in info


def _allowed_roots(root: Path) -> list[Path]:
    """Where the dataset's files may really be: its directory, and for a Hugging Face hub snapshot
    (``.../datasets--org--name/snapshots/<revision>/``, symlinks into ``blobs/``) that ``blobs/`` folder."""
    roots = [root.resolve()]
    blobs = root.parent.parent / "blobs"
    if root.parent.name == "snapshots" and blobs.is_dir():
        roots.append(blobs.resolve())
    return roots


def inside(root: Path, file: Path, where: object, what: str) -> Path:
    """``file`` if it stays inside ``root`` once symlinks are followed; refused otherwise
    (``where``: the metadata file that named it, ``None`` for a file found in the tree)."""
    try:
        real = file.resolve()
    except (OSError, RuntimeError) as exc:  # a symlink loop
        raise UnsafeSourceError(f"{where}: {what} {file} cannot be resolved: {exc}") from None
    if not any(real.is_relative_to(allowed) for allowed in _allowed_roots(root)):
        said = f"{where}: {what} {file}" if where is not None else str(file)
        raise UnsafeSourceError(
            f"{said} escapes the dataset directory {root} (to {real})",
            hint="rlds reads only files inside the dataset directory; the dataset is malicious or broken",
        )
    return file


def sniff(path: Path) -> bool:
    """Whether ``path`` is a LeRobot dataset (the folder or its ``meta/info.json``)."""
    return is_lerobot(path)


def source_files(paths: Sequence[Path]) -> list[Path]:
    """The files a conversion reads and hashes: everything under ``meta/``, ``data/`` and
    ``videos/`` of the dataset, in sorted order (a file linking outside it is refused)."""
    out: list[Path] = []
    for p in paths:
        root = dataset_root(p)
        if root is None:
            out += sorted(q for q in p.rglob("*") if q.is_file()) if p.is_dir() else [p]
            continue
        for sub in ("meta", "data", "videos"):
            if (root / sub).is_dir():
                files = sorted(q for q in (root / sub).rglob("*") if q.is_file())
                out += [inside(root, q, None, "file") for q in files]
    return out


def plan_files(names: Sequence[str]) -> list[str] | None:
    """Of a dataset folder's files, its metadata (``meta/``), which tells which data and video files
    hold each episode (``None`` for a listing without ``meta/info.json``)."""
    if INFO_FILE.as_posix() not in names:
        return None
    return [n for n in names if n.startswith("meta/")]


def fill_template(template: object, values: dict[str, Any], where: Path, what: str, version: str) -> str:
    """A path template filled like ``str.format``, but only with the known fields and integer widths
    (``str.format`` on an untrusted template could read attributes or ask for a gigabyte of padding)."""
    if not isinstance(template, str) or not template:
        raise SourceFormatError(f"{where}: {what} is {template!r}, not a path template")
    allowed = _TEMPLATE_FIELDS[version]
    out: list[str] = []
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise SourceFormatError(f"{where}: {what} {template!r} is not a valid template: {exc}") from None
    for literal, name, spec, conversion in parsed:
        out.append(literal)
        if name is None:
            continue
        if name not in allowed or conversion or (spec and not _SPEC.fullmatch(spec)):
            raise SourceFormatError(
                f"{where}: {what} {template!r} uses the field "
                f"{{{name}{'!' + conversion if conversion else ''}{':' + spec if spec else ''}}}; "
                f"LeRobot {version} templates use {sorted(allowed)} with integer widths only",
                hint="info.json is damaged or malicious: get the dataset from a trusted source",
            )
        value = values[name]
        if spec and not isinstance(value, int):
            raise SourceFormatError(f"{where}: {what} {template!r} gives the text field {name!r} a width")
        out.append(format(value, spec) if spec else str(value))
    return "".join(out)


def resolve_file(root: Path, rel: str, where: Path, what: str) -> Path:
    """The file a filled template names, refused when it leaves the dataset directory."""
    pure = Path(rel)
    if pure.is_absolute() or ".." in pure.parts or "\\" in rel or "\0" in rel:
        raise UnsafeSourceError(
            f"{where}: {what} {rel!r} escapes the dataset directory {root}",
            hint="rlds reads only files inside the dataset directory; the dataset is malicious or broken",
        )
    return inside(root, root / pure, where, what)


#: Columns the reader consumes itself (not stored as keys).
CONSUMED = ("next.done", "episode_index", "index")
#: TED keys the reader writes itself: reserved in the key cleaner.
_FIXED = ("next/reward", "next/terminated", "next/truncated", "next/done")


@dataclass
class Feature:
    """One feature of ``info.json`` and where it goes."""

    name: str
    kind: str  # "observation", "video", "image", "action", "reward", "info", "consumed"
    shape: tuple[int, ...]
    key: str = ""
    channels_first: bool = False
    #: the ``dtype`` ``info.json`` declares (``float32``, ``int64``, ``bool``, ...)
    declared: str = ""


def channels_first(name: str, shape: tuple[int, ...], names: object, where: Path) -> bool:
    """Whether a camera feature (video or image) is declared CHW (else HWC), from its ``names``
    or its shape."""
    if len(shape) != 3:
        raise SourceFormatError(f"{where}: camera feature {name!r} has shape {list(shape)}, not 3 dimensions")
    if isinstance(names, list) and len(names) == 3:
        axes = [str(n).lower() for n in names]
        if axes[0] in ("channel", "channels", "c"):
            return True
        if axes[-1] in ("channel", "channels", "c"):
            return False
    # no usable names: the axis of 1, 3 or 4 is the channel axis (HWC when both could be)
    return shape[-1] not in (1, 3, 4) and shape[0] in (1, 3, 4)


@dataclass
class FeaturePlan:
    """The dataset's features, planned: every kept feature with its key, the cameras, the parquet columns
    read, the axis names (for an export back to LeRobot), and whether ``next.success`` exists."""

    features: list[Feature]
    axis_names: dict[str, list[str]]
    success: bool

    @property
    def videos(self) -> list[Feature]:
        """The camera features (read from the mp4 files)."""
        return [f for f in self.features if f.kind == "video"]

    @property
    def columns(self) -> list[Feature]:
        """The features read from the parquet rows."""
        return [f for f in self.features if f.kind != "video"]


def plan_features(info: dict[str, Any], info_path: Path, report: ConversionReport) -> FeaturePlan:
    """Plan the ``features`` of ``info.json`` (notes about dropped or renamed names go to
    ``report``)."""
    features = info.get("features")
    if not isinstance(features, dict) or not features:
        raise SourceFormatError(f"{info_path}: no 'features' object")
    out: list[Feature] = []
    dropped: list[str] = []
    names_by_feature: dict[str, list[str]] = {}
    for name, spec in features.items():
        if not isinstance(spec, dict):
            raise SourceFormatError(f"{info_path}: feature {name!r} is not an object")
        dtype = spec.get("dtype")
        shape = require_shape(info_path, name, spec.get("shape"))
        axis_names = spec.get("names")
        if (
            isinstance(axis_names, list)
            and len(axis_names) <= 4096
            and all(isinstance(n, str) for n in axis_names)
        ):
            names_by_feature[name] = axis_names  # kept for an export back to LeRobot
        if dtype in ("video", "image"):  # a camera: mp4 files, or one image file a row in the parquet
            feat = Feature(name, dtype, shape)
            feat.channels_first = channels_first(name, shape, spec.get("names"), info_path)
        elif dtype == "string":
            dropped.append(name)
            continue
        elif name in CONSUMED:
            feat = Feature(name, "consumed", shape)
        elif name == "next.reward":
            feat = Feature(name, "reward", shape)
        elif name == "action" or name.startswith("action."):
            feat = Feature(name, "action", shape)
        elif name == "observation" or name.startswith("observation."):
            feat = Feature(name, "observation", shape)
        else:
            feat = Feature(name, "info", shape)
        feat.declared = dtype if isinstance(dtype, str) else ""
        out.append(feat)
    if not any(f.kind == "action" for f in out):
        raise SourceFormatError(f"{info_path}: no 'action' feature; rlds needs the actions")
    if not any(f.kind in ("observation", "video", "image") for f in out):
        raise SourceFormatError(f"{info_path}: no 'observation.*' feature")
    for name in dropped:
        report.notes.append(text_note(name, np.dtype(str)))
    wanted: dict[str, tuple[str, ...]] = {f"\0{k}": tuple(k.split("/")) for k in _FIXED}
    for f in out:
        if f.kind in ("observation", "video", "image"):
            rest = (
                f.name.removeprefix("observation").removeprefix(".")
                if f.name.startswith("observation")
                else f.name
            )
            wanted[f.name] = ("observation", *(rest.split(".") if rest else []))
        elif f.kind == "action":
            wanted[f.name] = ("action", *f.name.split(".")[1:])
        elif f.kind == "info":
            wanted[f.name] = ("info", f.name)
    cleaned = clean_keys(wanted)
    source = {k: v for k, v in wanted.items() if not k.startswith("\0")}
    renamed = renamed_note({k: cleaned[k] for k in source}, source)
    if renamed:
        report.notes.append(renamed)
    for f in out:
        f.key = cleaned.get(f.name, "next/reward" if f.kind == "reward" else "")
    return FeaturePlan(out, names_by_feature, "next.success" in features)


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


#: What to do about an episode's video span, or its rows' timestamps, that do not fit its frames.
SPAN_HINT = (
    "the episodes table, the data file and the video disagree on which frames are the episode's: the "
    "dataset is damaged or mixes files of different versions; download the whole dataset folder again "
    "(meta/, data/ and videos/)"
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
                self._check_span(where, ep, v.name, video, lo, hi)
                ep.videos[v.name] = (video, lo, hi)
            episodes.append(ep)
        for ep in episodes:  # dataset_from_index is global: the row within the file counts from its first
            ep.row_offset -= file_base[ep.data_file]
        return episodes

    def _check_span(self, where: Path, ep: Episode, key: str, video: Path, lo: float, hi: float) -> None:
        """A v3.0 episode's span of camera ``key`` holds one frame at ``fps`` per row of the episode,
        within half a frame (a muxer's rounding of the duration lerobot stores): a span cut short or
        too long, or another episode's span, would hand the rows frames that are not theirs."""
        frames = (hi - lo) * self.fps
        if abs(frames - ep.length) < 0.5:
            return
        raise SourceFormatError(
            f"{where}: episode {ep.index}'s span of {key!r} in {video.name}, {lo} s to {hi} s "
            f"(videos/{key}/from_timestamp, to_timestamp), holds {round(frames)} frames at {self.fps:g} "
            f"fps, but the episode has {ep.length} rows",
            hint=SPAN_HINT,
        )

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
                sizes = {f.name: declared_bytes(f.shape, np.dtype(np.float64)) for f in self.plan.columns}
                row_bytes = sum(sizes.values()) + declared_bytes((), np.dtype(np.int64))
                largest = max(self.plan.columns, key=lambda f: sizes[f.name], default=None)
                by = f"{INFO_FILE.as_posix()}'s shapes" + (
                    "" if largest is None else f", the largest {largest.name!r} {list(largest.shape)}"
                )
            # untrusted input: a small file cannot declare a vast number of rows (RLE of zeros),
            # nor info.json vast rows
            check_declared(
                f"{path} ({meta.num_rows:,} rows by {by})",
                None,
                meta.num_rows * row_bytes,
                path.stat().st_size,
                how="compresses into",
            )
