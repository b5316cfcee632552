"""LeRobot datasets (codebase ``v3.0`` and ``v2.1``): parquet frames and mp4 videos, read
without the ``lerobot`` package (pyarrow for the parquet, PyAV for the video: the ``lerobot``
extra).

A LeRobot dataset is a directory with ``meta/info.json`` (``codebase_version``, ``fps``,
``features``, ``data_path``/``video_path`` templates, ``chunks_size``), the episodes table
(v3.0: ``meta/episodes/chunk-*/file-*.parquet``; v2.1: ``meta/episodes.jsonl``), the tasks
(v3.0: ``meta/tasks.parquet``; v2.1: ``meta/tasks.jsonl``), one parquet row per frame under
``data/`` and one mp4 stream per camera under ``videos/`` (v3.0: many episodes per file, back
to back, each episode's span given by ``from_timestamp``/``to_timestamp``; v2.1: one parquet
and one mp4 per episode). The rules below are written out in ``docs/formats.md`` ("LeRobot"):

* **One row is one transition.** Row ``t`` of an episode is ``(frame t, action t,
  next.reward[t]) -> frame t + 1``. LeRobot records no observation after an episode's last row,
  so that transition is kept (its action and reward are real data) and the episode's final
  observation repeats the last frame, marked ``final_known = false`` (counted in
  ``synthesized_final_observations``). Every parquet value is therefore stored, row for row.
* **Keys.** ``observation.<a>.<b>`` (parquet or video) becomes ``observation/<a>/<b>``
  (observation-like, stored once); ``action`` becomes ``action``; ``next.reward`` becomes
  ``next/reward`` (0 with a note when absent); ``next.done`` is not stored (rlds computes
  ``next/done``; a ``next.done`` set before an episode's last row is noted, episodes are cut by
  ``episode_index`` only); ``episode_index`` and ``index`` are not stored (the episode index keeps
  each episode's ``episode_index`` as its source id; ``index`` is the step's position); every
  other numeric column ``<name>`` (``timestamp``, ``frame_index``, ``task_index``,
  ``next.success``...) becomes the step key ``info/<name>``; text columns are dropped with a
  note. Names go through the key cleaner of every reader (:mod:`.keys`).
* **Episode ends.** The last row of each episode ends it: **terminated** when the dataset has
  ``next.success`` and it is true on that row, **truncated** otherwise (``next.done`` does not say
  which).
* **Video.** Frames are decoded with PyAV into uint8 RGB (``gray`` for one channel), laid out HWC
  or CHW as the feature's ``names`` say (``["height", "width", "channels"]`` is HWC). Row ``t``
  of episode ``e`` gets the frame whose presentation time is within
  :data:`TIMESTAMP_TOLERANCE_S` of ``from_timestamp(e) + timestamp[t]`` (lerobot's own rule and
  tolerance); v2.1 videos start each episode at 0. Decoding streams: one frame per camera is held
  at a time, never a whole video.
* **Untrusted input.** ``data_path``/``video_path`` are filled by a restricted formatter (known
  fields, integer widths only) and every file they name, like every file read, must stay inside
  the dataset directory (a ``..`` template, an absolute path or a symlink out is refused).
"""

from __future__ import annotations

import json
import re
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlds_cli.errors import MissingExtraError, SourceFormatError, SourceNotFoundError
from rlds_cli.formats.base import ConversionReport, Reader, ReaderOptions, StepBlock
from rlds_cli.formats.keys import clean_keys, renamed_note, text_note
from rlds_cli.formats.untrusted import UnsafeSourceError, check_declared, declared_bytes, require_shape

#: ``codebase_version`` values this reader understands.
VERSIONS = ("v2.1", "v3.0")
INFO_FILE = Path("meta") / "info.json"
#: Largest JSON metadata file read (info.json, episodes.jsonl, tasks.jsonl).
MAX_JSON_BYTES = 64 << 20
#: lerobot's ``tolerance_s`` default: how far a frame's time may be from the row's timestamp.
TIMESTAMP_TOLERANCE_S = 1e-4
#: Target source bytes per block (decoded frames included), as the other readers.
BLOCK_BYTES = 8 * 1024 * 1024
BLOCK_ROWS = 1 << 16
#: Columns the reader consumes itself (not stored as keys).
_CONSUMED = ("next.done", "episode_index", "index")
#: TED keys the reader writes itself: reserved in the key cleaner.
_FIXED = ("next/reward", "next/terminated", "next/truncated", "next/done")
#: Fields a path template may use, per version, and the integer width a spec may ask for.
_TEMPLATE_FIELDS = {
    "v3.0": {"chunk_index", "file_index", "video_key"},
    "v2.1": {"episode_chunk", "episode_index", "video_key"},
}
_SPEC = re.compile(r"(0?[0-9]{1,2})?d")
_INCOMPLETE = "the dataset is incomplete: download the whole dataset folder again (meta/, data/ and videos/)"


# --------------------------------------------------------------------------- layout helpers


def dataset_root(path: Path) -> Path | None:
    """The LeRobot dataset directory of ``path`` (the directory, or its ``meta/info.json``)."""
    if path.is_dir() and (path / INFO_FILE).is_file():
        return path
    if path.is_file() and path.name == "info.json" and path.parent.name == "meta":
        return path.parent.parent
    return None


def _read_json_file(path: Path) -> Any:
    try:
        size = path.stat().st_size
        if size > MAX_JSON_BYTES:
            raise SourceFormatError(
                f"{path} is {size:,} bytes, over the {MAX_JSON_BYTES:,} read for metadata"
            )
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SourceFormatError(f"{path} is not readable JSON: {exc}") from None


def is_lerobot(path: Path) -> bool:
    """Whether ``path`` looks like a LeRobot dataset: a ``meta/info.json`` with a
    ``codebase_version`` (or one that does not parse, so that this reader names the problem)."""
    root = dataset_root(path)
    if root is None:
        return False
    try:
        info = _read_json_file(root / INFO_FILE)
    except SourceFormatError:
        return True
    return isinstance(info, dict) and "codebase_version" in info


def _allowed_roots(root: Path) -> list[Path]:
    """Where the dataset's files may really be: its directory, and for a Hugging Face hub cache
    snapshot (``.../datasets--org--name/snapshots/<revision>/``), whose files are symlinks into
    that repository's own ``blobs/`` folder, that folder too."""
    roots = [root.resolve()]
    blobs = root.parent.parent / "blobs"
    if root.parent.name == "snapshots" and blobs.is_dir():
        roots.append(blobs.resolve())
    return roots


def _inside(root: Path, file: Path, where: object, what: str) -> Path:
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
                out += [_inside(root, q, None, "file") for q in files]
    return out


def _fill(template: object, values: dict[str, Any], where: Path, what: str, version: str) -> str:
    """A path template filled like ``str.format``, but only with the known fields and integer
    widths: ``str.format`` on an untrusted template could read attributes (``{x.__class__}``)
    or ask for a gigabyte of padding."""
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


def _resolve(root: Path, rel: str, where: Path, what: str) -> Path:
    """The file a filled template names, refused when it leaves the dataset directory."""
    pure = Path(rel)
    if pure.is_absolute() or ".." in pure.parts or "\\" in rel or "\0" in rel:
        raise UnsafeSourceError(
            f"{where}: {what} {rel!r} escapes the dataset directory {root}",
            hint="rlds reads only files inside the dataset directory; the dataset is malicious or broken",
        )
    return _inside(root, root / pure, where, what)


# --------------------------------------------------------------------------- the plan


@dataclass
class _Feature:
    """One feature of ``info.json`` and where it goes."""

    name: str
    kind: str  # "observation", "video", "action", "reward", "info", "consumed"
    shape: tuple[int, ...]
    key: str = ""
    channels_first: bool = False


@dataclass
class _Episode:
    """One episode: where its rows and frames are."""

    index: int
    length: int
    data_file: Path
    row_offset: int
    #: video key -> (file, from_timestamp, to_timestamp)
    videos: dict[str, tuple[Path, float, float]] = field(default_factory=dict)


def _int(value: object, where: object, what: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or int(value) < minimum:
        raise SourceFormatError(f"{where}: {what} is {value!r}, not an integer >= {minimum}")
    return int(value)


def _float(value: object, where: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | np.number) or not np.isfinite(value):
        raise SourceFormatError(f"{where}: {what} is {value!r}, not a finite number")
    return float(value)


def _channels_first(name: str, shape: tuple[int, ...], names: object, where: Path) -> bool:
    """Whether a video feature is declared CHW (else HWC), from its ``names`` or its shape."""
    if len(shape) != 3:
        raise SourceFormatError(f"{where}: video feature {name!r} has shape {list(shape)}, not 3 dimensions")
    if isinstance(names, list) and len(names) == 3:
        axes = [str(n).lower() for n in names]
        if axes[0] in ("channel", "channels", "c"):
            return True
        if axes[-1] in ("channel", "channels", "c"):
            return False
    # no usable names: the axis of 1, 3 or 4 is the channel axis (HWC when both could be)
    return shape[-1] not in (1, 3, 4) and shape[0] in (1, 3, 4)


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
            block_rows: Rows per block (default: about :data:`BLOCK_BYTES` of decoded rows).
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
        info = _read_json_file(_inside(root, self.info_path, None, "file"))
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
        self.fps = _float(info.get("fps"), self.info_path, "fps")
        if self.fps <= 0:
            raise SourceFormatError(f"{self.info_path}: fps is {self.fps}, not > 0")
        self._plan_features()
        self.tasks = self._read_tasks()
        self.episodes = self._read_episodes_v3() if self.version == "v3.0" else self._read_episodes_v21()
        self._check_files()
        self.n = sum(e.length for e in self.episodes)
        self.report.source_rows = self.n
        declared_frames = info.get("total_frames")
        if isinstance(declared_frames, int) and declared_frames != self.n:
            raise SourceFormatError(
                f"{self.info_path} says total_frames={declared_frames} but the episodes table sums "
                f"to {self.n}"
            )
        kept = sum(e.length - 1 for e in self.episodes if e.length) if last_step == "drop" else self.n
        self.report.expected = {"num_steps": kept, "num_episodes": len(self.episodes)}
        row_bytes = sum(
            declared_bytes(f.shape, np.dtype(np.float64)) for f in self.features if f.kind != "video"
        )
        row_bytes += sum(
            declared_bytes(f.shape, np.dtype(np.uint8)) for f in self.features if f.kind == "video"
        )
        self.block_rows: int = block_rows or int(np.clip(BLOCK_BYTES // max(row_bytes, 1), 1, BLOCK_ROWS))
        self._av: Any = None
        self._early_done = 0
        self._early_note: int | None = None
        self._rule_notes()
        self._videos: dict[str, _VideoCursor] = {}
        self._data = _ParquetCursor(self)

    # ------------------------------------------------------------------ features

    def _plan_features(self) -> None:
        features = self.info.get("features")
        if not isinstance(features, dict) or not features:
            raise SourceFormatError(f"{self.info_path}: no 'features' object")
        out: list[_Feature] = []
        dropped: list[str] = []
        self.axis_names: dict[str, list[str]] = {}
        for name, spec in features.items():
            if not isinstance(spec, dict):
                raise SourceFormatError(f"{self.info_path}: feature {name!r} is not an object")
            dtype = spec.get("dtype")
            shape = require_shape(self.info_path, name, spec.get("shape"))
            axis_names = spec.get("names")
            if (
                isinstance(axis_names, list)
                and len(axis_names) <= 4096
                and all(isinstance(n, str) for n in axis_names)
            ):
                self.axis_names[name] = axis_names  # kept for an export back to LeRobot
            if dtype == "video":
                feat = _Feature(name, "video", shape)
                feat.channels_first = _channels_first(name, shape, spec.get("names"), self.info_path)
            elif dtype == "image":
                raise SourceFormatError(
                    f"{self.info_path}: feature {name!r} holds images stored in the parquet (dtype 'image'); "
                    "rlds reads LeRobot cameras stored as video only",
                    hint="re-record or convert the dataset with video cameras (lerobot's use_videos=True)",
                )
            elif dtype == "string":
                dropped.append(name)
                continue
            elif name in _CONSUMED:
                feat = _Feature(name, "consumed", shape)
            elif name == "next.reward":
                feat = _Feature(name, "reward", shape)
            elif name == "action" or name.startswith("action."):
                feat = _Feature(name, "action", shape)
            elif name == "observation" or name.startswith("observation."):
                feat = _Feature(name, "observation", shape)
            else:
                feat = _Feature(name, "info", shape)
            out.append(feat)
        if not any(f.kind == "action" for f in out):
            raise SourceFormatError(f"{self.info_path}: no 'action' feature; rlds needs the actions")
        if not any(f.kind in ("observation", "video") for f in out):
            raise SourceFormatError(f"{self.info_path}: no 'observation.*' feature")
        for name in dropped:
            self.report.notes.append(text_note(name, np.dtype(str)))
        wanted: dict[str, tuple[str, ...]] = {f"\0{k}": tuple(k.split("/")) for k in _FIXED}
        for f in out:
            if f.kind in ("observation", "video"):
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
            self.report.notes.append(renamed)
        for f in out:
            f.key = cleaned.get(f.name, "next/reward" if f.kind == "reward" else "")
        self.features = out
        self.videos = [f for f in out if f.kind == "video"]
        self.columns = [f for f in out if f.kind != "video"]
        self.success = "next.success" in features

    # ------------------------------------------------------------------ metadata tables

    def _read_parquet(self, path: Path, columns: list[str] | None = None) -> Any:
        try:
            return self.pq.read_table(_inside(self.root, path, None, "file"), columns=columns)
        except (OSError, ValueError, self.pa.ArrowException) as exc:
            raise SourceFormatError(f"{path} is not a readable parquet file: {exc}") from None

    def _read_jsonl(self, path: Path) -> list[dict[str, Any]]:
        _inside(self.root, path, None, "file")
        if not path.is_file():
            raise SourceFormatError(f"{path} is missing; a LeRobot {self.version} dataset needs it")
        if path.stat().st_size > MAX_JSON_BYTES:
            raise SourceFormatError(f"{path} is over the {MAX_JSON_BYTES:,} bytes read for metadata")
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

    def _read_tasks(self) -> dict[int, str]:
        """task_index -> task text (kept in the source metadata; text is not a step array)."""
        if self.version == "v2.1":
            path = self.root / "meta" / "tasks.jsonl"
            return {
                _int(r.get("task_index"), path, "task_index"): str(r.get("task", ""))
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
        return {_int(i, path, "task_index"): str(t) for i, t in zip(indices, texts, strict=True)}

    def _data_file(self, values: dict[str, Any]) -> Path:
        rel = _fill(self.info.get("data_path"), values, self.info_path, "data_path", self.version)
        return _resolve(self.root, rel, self.info_path, "data_path")

    def _video_file(self, values: dict[str, Any]) -> Path:
        rel = _fill(self.info.get("video_path"), values, self.info_path, "video_path", self.version)
        return _resolve(self.root, rel, self.info_path, "video_path")

    def _read_episodes_v3(self) -> list[_Episode]:
        folder = self.root / "meta" / "episodes"
        files = sorted(folder.glob("chunk-*/file-*.parquet")) if folder.is_dir() else []
        if not files:
            raise SourceFormatError(
                f"{self.root}: no meta/episodes/chunk-*/file-*.parquet; a LeRobot v3.0 dataset needs them"
            )
        base = ["episode_index", "length", "data/chunk_index", "data/file_index", "dataset_from_index"]
        video_cols = [
            f"videos/{v.name}/{c}"
            for v in self.videos
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
        episodes: list[_Episode] = []
        file_base: dict[Path, int] = {}
        seen: set[int] = set()
        for r in sorted(rows, key=lambda r: _int(r["episode_index"], r["\0file"], "episode_index")):
            where = r["\0file"]
            index = _int(r["episode_index"], where, "episode_index")
            if index in seen:
                raise SourceFormatError(f"{where}: episode_index {index} is listed twice")
            seen.add(index)
            what = f"episode {index}"
            data = self._data_file(
                {
                    "chunk_index": _int(r["data/chunk_index"], where, f"{what} data/chunk_index"),
                    "file_index": _int(r["data/file_index"], where, f"{what} data/file_index"),
                }
            )
            start = _int(r["dataset_from_index"], where, f"{what} dataset_from_index")
            file_base[data] = min(file_base.get(data, start), start)
            ep = _Episode(index, _int(r["length"], where, f"{what} length"), data, start)
            for v in self.videos:
                col = f"videos/{v.name}/"
                video = self._video_file(
                    {
                        "video_key": v.name,
                        "chunk_index": _int(r[col + "chunk_index"], where, f"{what} {col}chunk_index"),
                        "file_index": _int(r[col + "file_index"], where, f"{what} {col}file_index"),
                    }
                )
                lo = _float(r[col + "from_timestamp"], where, f"{what} {col}from_timestamp")
                hi = _float(r[col + "to_timestamp"], where, f"{what} {col}to_timestamp")
                if hi < lo:
                    raise SourceFormatError(
                        f"{where}: {what} ends at {hi} s in {video.name}, before it starts ({lo} s)"
                    )
                ep.videos[v.name] = (video, lo, hi)
            episodes.append(ep)
        for ep in episodes:  # dataset_from_index is global: the row within the file counts from its first
            ep.row_offset -= file_base[ep.data_file]
        return episodes

    def _read_episodes_v21(self) -> list[_Episode]:
        path = self.root / "meta" / "episodes.jsonl"
        chunks = _int(self.info.get("chunks_size"), self.info_path, "chunks_size", minimum=1)
        episodes: list[_Episode] = []
        seen: set[int] = set()
        for r in self._read_jsonl(path):
            index = _int(r.get("episode_index"), path, "episode_index")
            if index in seen:
                raise SourceFormatError(f"{path}: episode_index {index} is listed twice")
            seen.add(index)
            values = {"episode_chunk": index // chunks, "episode_index": index}
            length = _int(r.get("length"), path, f"episode {index} length")
            ep = _Episode(index, length, self._data_file(values), 0)
            for v in self.videos:  # one mp4 per episode and camera, starting at 0
                ep.videos[v.name] = (
                    self._video_file({**values, "video_key": v.name}),
                    0.0,
                    length / self.fps,
                )
            episodes.append(ep)
        if not episodes:
            raise SourceFormatError(f"{path} lists no episodes")
        return sorted(episodes, key=lambda e: e.index)

    def _schema(self, path: Path) -> Any:
        try:
            return self.pq.read_schema(_inside(self.root, path, None, "file"))
        except (OSError, ValueError, self.pa.ArrowException) as exc:
            raise SourceFormatError(f"{path} is not a readable parquet file: {exc}") from None

    def _check_files(self) -> None:
        """Every file named by the tables exists; every data file has the columns and the rows
        the episodes table says (before anything is converted)."""
        by_file: dict[Path, list[_Episode]] = {}
        for ep in self.episodes:
            by_file.setdefault(ep.data_file, []).append(ep)
            for video, _, _ in ep.videos.values():
                if not video.is_file():
                    raise SourceFormatError(
                        f"{video} is missing (named by {INFO_FILE.as_posix()}'s video_path for episode "
                        f"{ep.index})",
                        hint=_INCOMPLETE,
                    )
        needed = [f.name for f in self.columns]
        row_bytes = 0
        for path, eps in by_file.items():
            if not path.is_file():
                raise SourceFormatError(
                    f"{path} is missing (named by {INFO_FILE.as_posix()}'s data_path for episode "
                    f"{eps[0].index})",
                    hint=_INCOMPLETE,
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
                    declared_bytes(f.shape, np.dtype(np.float64)) for f in self.columns
                ) + declared_bytes((), np.dtype(np.int64))
            # untrusted input: a small file cannot declare a vast number of rows (RLE of zeros)
            check_declared(
                path, "rows", meta.num_rows * row_bytes, path.stat().st_size, how="compresses into"
            )

    # ------------------------------------------------------------------ reading

    def total_rows(self) -> int:
        return self.n

    def source_metadata(self) -> dict[str, Any]:
        return {
            "lerobot": {
                "codebase_version": self.version,
                "fps": self.fps,
                "robot_type": self.info.get("robot_type"),
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

    def _video(self, feature: _Feature) -> _VideoCursor:
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
            self._videos[feature.name] = _VideoCursor(self._av, feature)
        return self._videos[feature.name]

    def _segment(self, ep: _Episode, start: int, count: int) -> dict[str, np.ndarray]:
        """Rows ``start .. start + count`` of one episode: every column, frames included."""
        table = self._data.read(ep.data_file, ep.row_offset + start, count)
        where = ep.data_file
        ids = _column_array(self.pa, table.column("episode_index"), (), where, "episode_index")
        if (ids.reshape(-1) != ep.index).any():
            bad = int(ids.reshape(-1)[np.flatnonzero(ids.reshape(-1) != ep.index)[0]])
            raise SourceFormatError(
                f"{where}: a row of episode {ep.index} (by the episodes table) has episode_index {bad}"
            )
        out: dict[str, np.ndarray] = {}
        for f in self.columns:
            if f.kind == "consumed" and f.name != "next.done":
                continue
            values = _column_array(self.pa, table.column(f.name), f.shape, where, f.name)
            out[f.name] = values
        if self.videos:
            if "timestamp" not in table.column_names:
                raise SourceFormatError(f"{where} has no 'timestamp' column; video frames are matched by it")
            stamps = _column_array(self.pa, table.column("timestamp"), (), where, "timestamp").reshape(-1)
            for f in self.videos:
                video, lo, hi = ep.videos[f.name]
                times = lo + stamps.astype(np.float64)
                out[f.name] = self._video(f).frames(video, times, ep.index, lo, hi, ep.length)
        return out

    def _starts(self, length: int) -> list[int]:
        """Where each segment of an episode starts: blocks of ``block_rows`` rows, never leaving
        the last segment one row long when that row is dropped (``last_step="drop"`` moves its
        reward onto the row before, which must be in the same segment)."""
        starts = list(range(0, length, self.block_rows))
        if self.last_step == "drop" and len(starts) > 1 and length - starts[-1] == 1:
            starts.pop()
        return starts

    def blocks(self, progress: Callable[[int], None] | None = None) -> Iterator[StepBlock]:
        """Yield the episodes in ``episode_index`` order, as blocks of about :data:`BLOCK_BYTES`."""
        pending: list[_Part] = []
        rows = steps = 0
        drop = self.last_step == "drop"
        for ep in self.episodes:
            if ep.length == 0 or (drop and ep.length == 1):  # no transition to keep
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
                part = self._part(ep, seg, last)
                pending.append(part)
                rows += count
                steps += part.num_steps
                if steps >= self.block_rows:
                    yield self._pack(pending)
                    if progress is not None:
                        progress(rows)
                    pending, rows, steps = [], 0, 0
        if pending:
            yield self._pack(pending)
            if progress is not None:
                progress(rows)

    def _part(self, ep: _Episode, seg: dict[str, np.ndarray], last: bool) -> _Part:
        """One segment split into step and observation columns, with the last-row rule applied."""
        steps = {f.name: seg[f.name] for f in self.features if f.kind in ("action", "reward", "info")}
        obs = {f.name: seg[f.name] for f in self.features if f.kind in ("observation", "video")}
        success = last and self.success and bool(np.asarray(seg["next.success"][-1]).any())
        if last and self.last_step == "drop":
            # the last row has no next frame: drop its transition, frame L-1 is the real final
            # observation, and its reward and success move onto transition L-2 (the return is kept)
            if "next.reward" in steps:
                reward = steps["next.reward"].copy()
                reward[-2] += reward[-1]
                steps["next.reward"] = reward
            if self.success:
                flag = steps["next.success"].copy()
                flag[-2] |= flag[-1]
                steps["next.success"] = flag
            steps = {k: v[:-1] for k, v in steps.items()}
            self.report.dropped_rows += 1
        elif last:  # the final observation is not recorded: repeat the last frame (final_known = false)
            obs = {k: np.concatenate([v, v[-1:]], axis=0) for k, v in obs.items()}
        return _Part(ep.index, steps, obs, last, success)

    def _rule_notes(self) -> None:
        """The notes that depend only on the dataset's columns, written before any block (a
        conversion of ``--episodes A:B`` stops reading early, so nothing waits for the end)."""
        if self.last_step == "drop":
            self.report.notes.append(
                "last_step='drop': each episode's last frame has no next frame, so its transition is "
                "dropped (counted in dropped_rows); that frame is the real final observation, and its "
                "next.reward and next.success move onto the transition before"
            )
        else:
            self.report.notes.append(
                "LeRobot stores no observation after an episode's last frame: its last transition is kept "
                "and the final observation repeats the last frame (final_known = false)"
            )
        if not any(f.kind == "reward" for f in self.features):
            self.report.notes.append("no next.reward column: next/reward = 0")
        self.report.notes.append(
            "episode ends: terminated where next.success is true on the last frame, else truncated"
            if self.success
            else "episode ends: no next.success column, so every episode ends truncated"
        )

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

    def _pack(self, parts: list[_Part]) -> StepBlock:
        n = sum(p.num_steps for p in parts)
        ends = np.cumsum([p.num_steps for p in parts]) - 1
        ends = ends[[p.last for p in parts]].astype(np.int64)
        success = np.array([p.success for p in parts if p.last], bool)
        steps: dict[str, np.ndarray] = {}
        observations: dict[str, np.ndarray] = {}
        for f in self.features:
            if f.kind in ("observation", "video"):
                observations[f.key] = np.concatenate([p.observations[f.name] for p in parts], axis=0)
            elif f.kind in ("action", "reward", "info"):
                steps[f.key] = np.concatenate([p.steps[f.name] for p in parts], axis=0)
        if "next/reward" not in steps:
            steps["next/reward"] = np.zeros((n, 1), np.float32)
        term = np.zeros((n, 1), bool)
        trunc = np.zeros((n, 1), bool)
        term[ends, 0] = success
        trunc[ends, 0] = ~success
        steps["next/terminated"] = term
        steps["next/truncated"] = trunc
        if self.last_step == "keep":
            self.report.synthesized_final_observations += len(ends)
        return StepBlock(
            steps=steps,
            observations=observations,
            ends=ends,
            final_known=np.full(len(ends), self.last_step == "drop"),
            episode_ids=np.array([p.episode for p in parts if p.last], np.int64),
        )


@dataclass
class _Part:
    """A run of rows of one episode, ready to pack: step columns and observation columns (plus
    the final observation when ``last``), by LeRobot feature name."""

    episode: int
    steps: dict[str, np.ndarray]
    observations: dict[str, np.ndarray]
    last: bool
    success: bool

    @property
    def num_steps(self) -> int:
        return len(next(iter(self.steps.values())))


# --------------------------------------------------------------------------- parquet rows


def _column_array(pa: Any, column: Any, shape: tuple[int, ...], where: Path, name: str) -> np.ndarray:
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


class _ParquetCursor:
    """Reads a data file's rows in order, one batch at a time (memory: one batch)."""

    def __init__(self, reader: LeRobotReader) -> None:
        self.reader = reader
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
        pq = self.reader.pq
        columns = [*(f.name for f in self.reader.columns), "episode_index"]
        if self.reader.videos and "timestamp" not in columns:
            columns.append("timestamp")
        try:
            self.file = pq.ParquetFile(path)
            names = set(self.file.schema_arrow.names)
            self.batches = iter(
                self.file.iter_batches(
                    batch_size=self.reader.block_rows,
                    columns=[c for c in dict.fromkeys(columns) if c in names],
                )
            )
        except (OSError, ValueError, self.reader.pa.ArrowException) as exc:
            raise SourceFormatError(f"{path} is not a readable parquet file: {exc}") from None
        self.path, self.pos, self.buffer = path, 0, None

    def read(self, path: Path, offset: int, count: int) -> Any:
        """Rows ``offset .. offset + count`` of ``path`` as a pyarrow table."""
        pa = self.reader.pa
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


# --------------------------------------------------------------------------- video frames


class _VideoCursor:
    """Decodes one camera's mp4 forward, one frame held at a time, and hands out the frames
    whose times match the rows' timestamps."""

    def __init__(self, av: Any, feature: _Feature) -> None:
        self.av = av
        self.feature = feature
        self.path: Path | None = None
        self.container: Any = None
        self.decoder: Iterator[Any] | None = None
        self.current: Any = None
        self.current_time = -np.inf
        self.time_base: Any = None
        channels = feature.shape[0] if feature.channels_first else feature.shape[-1]
        formats = {1: "gray", 3: "rgb24", 4: "rgba"}
        if channels not in formats:
            raise SourceFormatError(
                f"video feature {feature.name!r} has {channels} channels; rlds decodes 1, 3 or 4"
            )
        self.pixel_format = formats[channels]
        # one converter for every frame: frame.to_ndarray(format=...) sets up a new swscale
        # context per frame, several times slower at the same output (bit-identical)
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
        self, path: Path, times: np.ndarray, episode: int, start: float, stop: float, length: int
    ) -> np.ndarray:
        """The frames at ``times`` (seconds in the file), as ``[len(times), *shape]`` uint8."""
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
            out[i] = self._array()
        return out

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
