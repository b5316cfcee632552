"""What both LeRobot exports share (``export/lerobot.py``: v3.0 and v2.1).

The plan (fps, tasks, feature names, cameras, ``info.json``'s features), an episode's parquet
columns, a camera's AV1 encoder, the statistics lerobot computes, and the parquet schema metadata.
The rules are written out in ``docs/formats.md`` ("Export to LeRobot").
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.card import dataset_card, dataset_fps
from rlds_cli.cache.composed import ComposedDataset
from rlds_cli.cache.dataset import Dataset, Instructions
from rlds_cli.errors import ExportError, import_extra
from rlds_cli.export import flat_keys, refuse_complex, step_keys
from rlds_cli.frames.codecs import MIN_SIDE

DEFAULT_FPS = 30
CHUNKS_SIZE = 1000
#: Frames of an episode sampled for a camera's statistics (lerobot samples too).
STATS_FRAMES = 100
QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
#: Frames read from the cache at a time while encoding (memory: one chunk, not one episode).
FRAME_CHUNK = 256
#: Bookkeeping columns the exporter writes itself (an ``info/<name>`` of these names is not
#: written twice: a dataset converted from LeRobot carries them as info keys).
BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")


def feature_name(key: str) -> str:
    """The LeRobot name of an observation-like TED key."""
    if key == "observation":
        return "observation.state"
    parts = key.split("/")
    if parts[0] != "observation":
        parts = ["observation", *parts]
    return ".".join(parts)


def camera_layout(shape: tuple[int, ...], dtype: np.dtype) -> str | None:
    """``"HWC"``/``"CHW"`` for a uint8 RGB image per step with both sides at least
    :data:`~rlds_cli.frames.codecs.MIN_SIDE` (the frames rule: smaller grids, MiniGrid's, are
    data, which AV1 would change), else ``None`` (a parquet column, exact)."""
    if np.dtype(dtype) != np.uint8 or len(shape) != 3:
        return None
    if shape[-1] == 3:
        layout, sides = "HWC", shape[:2]
    elif shape[0] == 3:
        layout, sides = "CHW", shape[1:]
    else:
        return None
    return layout if min(sides) >= MIN_SIDE else None


#: Statistics of values that are not finite are NaN or infinite, as lerobot's own: no warning.
NONFINITE_STATS = np.errstate(invalid="ignore", over="ignore")


@NONFINITE_STATS
def feature_stats(values: np.ndarray, quantiles: bool = True) -> dict[str, Any]:
    """lerobot's per-feature statistics over axis 0 (lists, as its parquet and JSON hold them);
    ``quantiles``: also ``q01`` .. ``q99`` (lerobot 0.4, v3.0; v2.1 kept min, max, mean, std,
    count)."""
    as_float = values.astype(np.float64)
    out: dict[str, Any] = {
        "min": values.min(axis=0),
        "max": values.max(axis=0),
        "mean": as_float.mean(axis=0),
        "std": as_float.std(axis=0),
        "count": np.array([len(values)], np.int64),
    }
    for q in QUANTILES if quantiles else ():
        out[f"q{round(q * 100):02d}"] = np.quantile(as_float, q, axis=0)
    return out


def image_stats(frames: np.ndarray, layout: str) -> dict[str, Any]:
    """Per-channel statistics of sampled frames scaled to [0, 1], shaped ``(3, 1, 1)``."""
    chw = frames if layout == "CHW" else frames.transpose(0, 3, 1, 2)
    pixels = chw.transpose(1, 0, 2, 3).reshape(3, -1).T.astype(np.float64) / 255.0  # [pixels, 3]
    out = feature_stats(pixels)
    count = np.array([len(frames)], np.int64)
    return {k: (count if k == "count" else np.asarray(v).reshape(3, 1, 1)) for k, v in out.items()}


def as_list(value: np.ndarray) -> Any:
    return np.asarray(value).tolist()


@contextmanager
def scheduling_kept() -> Iterator[None]:
    """Run the body, then restore the calling thread's scheduling policy: SVT-AV1 (libsvtav1) moves
    the thread that drives it to SCHED_FIFO when run as root (seen: a 5-frame encode left a process
    real-time), which would leave a user's training process at real-time priority. (Lowering one's
    own policy is always allowed.)"""
    if not hasattr(os, "sched_getscheduler"):
        yield
        return
    policy, param = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        yield
    finally:
        if os.sched_getscheduler(0) != policy or os.sched_getparam(0) != param:
            with contextlib.suppress(OSError):
                os.sched_setscheduler(0, policy, param)


class Camera:
    """One camera's mp4: every episode's frames, back to back, encoded as they come (the
    caller's scheduling policy kept: :func:`scheduling_kept`)."""

    def __init__(self, av: Any, path: Path, shape: tuple[int, ...], layout: str, fps: int) -> None:
        self.av = av
        self.layout = layout
        height, width = (shape[1], shape[2]) if layout == "CHW" else (shape[0], shape[1])
        path.parent.mkdir(parents=True, exist_ok=True)
        # SVT-AV1 writes its banner and settings (~20 lines) to stderr at its default level, 3; 1 keeps
        # its errors (read when it first logs; a level the user set is kept)
        os.environ.setdefault("SVT_LOG", "1")
        with scheduling_kept():
            self.container = av.open(str(path), "w")
            self.stream = self.container.add_stream("libsvtav1", rate=fps)
        self.stream.width, self.stream.height = width, height
        self.stream.pix_fmt = "yuv420p"
        self.stream.codec_context.gop_size = 2
        self.stream.options = {"crf": "30"}
        self.time_base = Fraction(1, fps)
        self.frames = 0

    def add_episode(self, column: Any, start: int, length: int) -> tuple[float, float]:
        """Encode the frames ``column[start : start + length]`` (one episode, read
        :data:`FRAME_CHUNK` at a time); its (from_timestamp, to_timestamp)."""
        with scheduling_kept():
            return self._add_episode(column, start, length)

    def _add_episode(self, column: Any, start: int, length: int) -> tuple[float, float]:
        first = self.frames
        for lo in range(start, start + length, FRAME_CHUNK):
            for image in np.asarray(column[lo : min(lo + FRAME_CHUNK, start + length)]):
                rgb = image.transpose(1, 2, 0) if self.layout == "CHW" else image
                frame = self.av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")
                frame.pts, frame.time_base = self.frames, self.time_base
                if self.frames == first:  # every episode starts on a keyframe, so readers can seek to it
                    frame.pict_type = self.av.video.frame.PictureType.I
                for packet in self.stream.encode(frame):
                    self.container.mux(packet)
                self.frames += 1
        return float(first * self.time_base), float(self.frames * self.time_base)

    def close(self) -> None:
        with scheduling_kept():
            for packet in self.stream.encode():
                self.container.mux(packet)
            self.container.close()


@dataclass
class LeRobotPlan:
    """What a LeRobot export writes, whichever layout: the source's fps and task texts, each
    observation's feature name and camera layout (``None``: a parquet column), the other step
    keys' names, and ``info.json``'s features in lerobot's order."""

    fps: int
    tasks: dict[int, str]
    robot_type: str
    names: dict[str, str]
    cameras: dict[str, str | None]
    extra_names: dict[str, str]
    success_key: str | None
    instructions: Instructions | None  # the task of each row (None: one task, the dataset's name)
    task_numbers: np.ndarray | None  # instructions' text index -> task_index (-1: no row has it)
    features: dict[str, Any]


#: Feature names LeRobot's own columns take.
LEROBOT_OWN = ("action", "next.reward", "next.done", "next.success")


def plan_export(dataset: Dataset) -> LeRobotPlan:
    """The plan of a LeRobot export of ``dataset`` (the rules of the module docstring).

    Raises:
        ExportError: Two keys that map to one feature name.
    """
    source = dataset.source_metadata.get("lerobot")  # a view's are its parent's
    source = source if isinstance(source, dict) else {}
    card = dataset_card(dataset)
    # the card carries the rate through views, merges, trims and downsampling
    if "fps" in card and dataset_fps(dataset) is None:
        raise ExportError(
            f"{dataset.name}'s episodes have no one frame rate (it merges datasets of different rates, "
            "or some of none), and LeRobot's timestamps take one",
            hint="export its parents one by one, or merge datasets of one rate (rlds downsample first)",
        )
    fps_raw = float(dataset_fps(dataset) or DEFAULT_FPS)
    if not fps_raw.is_integer():
        raise ExportError(
            f"{dataset.name} runs at {fps_raw:g} frames a second; LeRobot's timestamps and videos take a "
            "whole number",
            hint="export the dataset it was downsampled from, or downsample by a divisor of its rate",
        )
    fps = int(fps_raw)
    instructions = dataset.instructions
    tasks, task_numbers = {0: dataset.name}, None
    if instructions is not None:
        # the texts some row has, each once, numbered from 0: lerobot reads a row's task at its
        # position in tasks.parquet (tasks.iloc[task_index]), indexed by the text
        used = instructions.used(dataset)
        texts = list(dict.fromkeys(instructions.texts[int(i)] for i in used))
        number = {text: k for k, text in enumerate(texts)}
        task_numbers = np.full(len(instructions.texts), -1, np.int64)
        task_numbers[used] = [number[instructions.texts[int(i)]] for i in used]
        tasks = dict(enumerate(texts))
    fields = dataset.stored_fields  # one 'action' array: export_dataset checked it
    refuse_complex(dataset, "LeRobot's parquet")
    cameras = {k: camera_layout(fields[k].shape, np.dtype(fields[k].dtype)) for k in flat_keys(dataset)}
    names = {k: feature_name(k) for k in flat_keys(dataset)}
    task_column = instructions.step_key if instructions is not None else None
    # a LeRobot source's bookkeeping is written anew (a trim renumbers it); anyone else's
    # info/timestamp (wall-clock time) or info/index is data, which those columns would replace
    regenerated = (*BOOKKEEPING, "next.success") if _from_lerobot(dataset) else ()
    extra = [k for k in step_keys(dataset) if k.removeprefix("info/") not in regenerated and k != task_column]
    # a dataset converted from LeRobot keeps the source's own success flags: write those back
    success_key = "info/next.success" if regenerated and "info/next.success" in fields else None
    extra_names = {k: k.removeprefix("info/").replace("/", ".") for k in extra}
    taken = list(names.values()) + list(extra_names.values())
    own = {*LEROBOT_OWN, *BOOKKEEPING}
    clashes = sorted({n for n in taken if taken.count(n) > 1} | set(taken) & own)
    if clashes:
        keys = sorted(k for k, n in {**names, **extra_names}.items() if n in clashes)
        raise ExportError(
            f"{dataset.name}: the keys {', '.join(map(repr, keys))} map to the LeRobot feature name(s) "
            f"{', '.join(map(repr, clashes))}, taken twice or by LeRobot's own columns",
            hint="rename one of them (a dataset of your own: write it under another key)",
        )
    given_names = source.get("names")
    axis_names: dict[str, Any] = given_names if isinstance(given_names, dict) else {}
    features = features_of(dataset, names, cameras, extra_names, fps, axis_names)
    robot_type = str(card.get("robot_type") or source.get("robot_type") or "unknown")
    return LeRobotPlan(
        fps, tasks, robot_type, names, cameras, extra_names, success_key, instructions, task_numbers, features
    )


def _from_lerobot(dataset: Dataset) -> bool:
    """Whether every row of ``dataset`` was converted from LeRobot (each part of a merge)."""
    if isinstance(dataset, ComposedDataset):
        return all(_from_lerobot(part) for part in dataset.segment_datasets())
    return isinstance(dataset.source_metadata.get("lerobot"), dict)


def episode_columns(dataset: Dataset, plan: LeRobotPlan, e: int) -> dict[str, np.ndarray]:
    """Episode ``e``'s parquet columns by feature name (cameras left out), one row per step."""
    start = int(dataset.episode_index["start"][e])
    length = int(dataset.episode_index["length"][e])
    rows = slice(start, start + length)
    flat = slice(start + e, start + e + length)  # each earlier episode adds a final obs
    columns: dict[str, np.ndarray] = {}
    for k, layout in plan.cameras.items():
        if layout is None:
            columns[plan.names[k]] = np.asarray(dataset.column(k)[flat])
    columns["action"] = np.asarray(dataset.column("action")[rows])
    columns["next.reward"] = np.asarray(dataset.column("next/reward")[rows])
    term = np.asarray(np.asarray(dataset.column("next/terminated")[rows]).reshape(length, -1).any(axis=1))
    trunc = np.asarray(dataset.column("next/truncated")[rows]).reshape(length, -1).any(axis=1)
    columns["next.done"] = np.asarray(term | trunc, bool)
    success = np.asarray(dataset.column(plan.success_key)[rows]) if plan.success_key else term
    flags = np.asarray(np.asarray(success, bool).reshape(length, -1).any(axis=1))
    # the last frame's flag is the ending readers take: the dataset's (a trim or downsample changes it)
    flags[-1:] = term[-1:]
    columns["next.success"] = flags
    for k, name in plan.extra_names.items():
        columns[name] = np.asarray(dataset.column(k)[rows])
    frame_index = np.arange(length, dtype=np.int64)
    columns["timestamp"] = (frame_index / plan.fps).astype(np.float32)
    columns["frame_index"] = frame_index
    columns["episode_index"] = np.full(length, e, np.int64)
    columns["index"] = np.arange(start, start + length, dtype=np.int64)
    columns["task_index"] = np.zeros(length, np.int64)
    if plan.instructions is not None and plan.task_numbers is not None:
        columns["task_index"] = plan.task_numbers[plan.instructions.of_steps(dataset, e, rows)]
    return columns


def import_writers() -> tuple[Any, Any, Any]:
    """``(av, pyarrow, pyarrow.parquet)``, or the extra to install."""
    modules = [
        import_extra(name, "exporting to LeRobot", hint="pip install 'rlds-cli[lerobot]'")
        for name in ("av", "pyarrow", "pyarrow.parquet")
    ]
    return modules[0], modules[1], modules[2]


def arrow_column(pa: Any, values: np.ndarray) -> Any:
    """A column as lerobot writes it: scalars for one value per row, fixed-size lists otherwise."""
    values = np.ascontiguousarray(values)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim == 1:
        return pa.array(values)
    inner = arrow_column(pa, values.reshape(-1, *values.shape[2:]))
    return pa.FixedSizeListArray.from_arrays(inner, values.shape[1])


def features_of(
    dataset: Dataset,
    names: dict[str, str],
    cameras: dict[str, str | None],
    extra_names: dict[str, str],
    fps: int,
    axis_names: dict[str, Any],
) -> dict[str, Any]:
    """``info.json``'s features, in lerobot's order (observations, action, outcomes, bookkeeping)."""
    fields = dataset.stored_fields

    def plain(dtype: Any, shape: tuple[int, ...], name: str = "") -> dict[str, Any]:
        # the source's axis names (kept at conversion from LeRobot) where they still fit
        given = axis_names.get(name)
        fits = isinstance(given, list) and len(shape) == 1 and len(given) == shape[0]
        return {"dtype": np.dtype(dtype).name, "shape": list(shape) or [1], "names": given if fits else None}

    out: dict[str, Any] = {}
    for k, name in names.items():
        spec = fields[k]
        layout = cameras[k]
        if layout is None:
            out[name] = plain(spec.dtype, tuple(spec.shape), name)
            continue
        shape = list(spec.shape)
        height, width = (shape[1], shape[2]) if layout == "CHW" else (shape[0], shape[1])
        out[name] = {
            "dtype": "video",
            "shape": shape,
            "names": ["channels", "height", "width"] if layout == "CHW" else ["height", "width", "channels"],
            "info": {
                "video.height": height,
                "video.width": width,
                "video.codec": "av1",
                "video.pix_fmt": "yuv420p",
                "video.is_depth_map": False,
                "video.fps": fps,
                "video.channels": 3,
                "has_audio": False,
            },
        }
    out["action"] = plain(fields["action"].dtype, tuple(fields["action"].shape), "action")
    out["next.reward"] = plain(fields["next/reward"].dtype, tuple(fields["next/reward"].shape))
    out["next.done"] = plain(bool, (1,))
    out["next.success"] = plain(bool, (1,))
    for k, name in extra_names.items():
        out[name] = plain(fields[k].dtype, tuple(fields[k].shape), name)
    out["timestamp"] = plain(np.float32, (1,))
    for name in ("frame_index", "episode_index", "index", "task_index"):
        out[name] = plain(np.int64, (1,))
    return out


def hf_features(features: dict[str, Any], columns: list[str], list_type: str = "List") -> str:
    """The ``huggingface`` schema metadata lerobot's data files carry (the features as the
    ``datasets`` library names them: ``Value``, fixed-length ``List``; ``list_type`` ``"Sequence"``
    for the ``datasets`` 3 that wrote v2.1's files), for the Hub's viewer and
    ``datasets.load_dataset``."""

    def spec(dtype: str, shape: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": dtype, "_type": "Value"}
        dims = shape[:-1] if shape and shape[-1] == 1 else shape  # as arrow_column drops a last axis of 1
        for length in reversed(dims):
            out = {"feature": out, "length": length, "_type": list_type}
        return out

    described = {name: spec(features[name]["dtype"], list(features[name]["shape"])) for name in columns}
    return json.dumps({"info": {"features": described}})
