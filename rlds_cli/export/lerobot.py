"""Export to a LeRobot v3.0 dataset directory, in the layout lerobot 0.4 writes (the files of
``tests/fixtures/lerobot-v3-tiny/``): ``meta/info.json``, ``meta/tasks.parquet``,
``meta/stats.json``, ``meta/episodes/chunk-000/file-000.parquet``,
``data/chunk-000/file-000.parquet`` and ``videos/<key>/chunk-000/file-000.mp4``.

The rules (written out in ``docs/formats.md``, "Export to LeRobot"):

* One LeRobot row per TED step: the step's observations (``observation/<a>/<b>`` becomes
  ``observation.<a>.<b>``; a plain ``observation`` becomes ``observation.state``), ``action``,
  ``next.reward``, ``next.done`` and ``next.success`` (TED's ``next/terminated``, which the LeRobot
  reader reads back as terminated), ``info/<name>`` as ``<name>``, and the bookkeeping columns
  ``timestamp`` (``frame_index / fps``), ``frame_index``, ``episode_index``, ``index``,
  ``task_index``. LeRobot keeps no observation after an episode's last row, so the final
  observations are not written.
* ``uint8`` observations of 3 dimensions with 3 channels (HWC, or CHW) are cameras: encoded with
  PyAV into one AV1 mp4 per key (libsvtav1, ``yuv420p``, CRF 30, a keyframe every 2 frames as in
  the fixture lerobot wrote, and at every episode start), episodes back to back, each episode's
  span in the episodes table. AV1 is lossy: frames come back close, not equal.
* Other observation keys are parquet columns (nested lists for more than one dimension).
* ``fps`` and the task texts come from the source when it was a LeRobot dataset
  (``source.metadata.lerobot``); otherwise ``fps`` is 30 and there is one task, the dataset's name.
* Per-episode statistics (``stats/<feature>/{min,max,mean,std,count,q01,q10,q50,q90,q99}``, the
  columns lerobot writes) over the episode's rows for parquet columns, and per channel on at most
  100 evenly spaced frames, scaled to ``[0, 1]``, for cameras; ``meta/stats.json`` aggregates
  them over the dataset.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.errors import ExportError, MissingExtraError
from rlds_cli.export.output_files import atomic_target, flat_keys, step_keys

CODEBASE_VERSION = "v3.0"
DEFAULT_FPS = 30
CHUNKS_SIZE = 1000
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"
#: Frames of an episode sampled for a camera's statistics (lerobot samples too).
STATS_FRAMES = 100
_QUANTILES = (0.01, 0.10, 0.50, 0.90, 0.99)
#: Frames read from the cache at a time while encoding (memory: one chunk, not one episode).
FRAME_CHUNK = 256
#: Bookkeeping columns the exporter writes itself (an ``info/<name>`` of these names is not
#: written twice: a dataset converted from LeRobot carries them as info keys).
_BOOKKEEPING = ("timestamp", "frame_index", "episode_index", "index", "task_index")


def _feature_name(key: str) -> str:
    """The LeRobot name of an observation-like TED key."""
    if key == "observation":
        return "observation.state"
    parts = key.split("/")
    if parts[0] != "observation":
        parts = ["observation", *parts]
    return ".".join(parts)


def _camera_layout(shape: tuple[int, ...], dtype: np.dtype) -> str | None:
    """``"HWC"``/``"CHW"`` for a uint8 RGB image per step, else ``None`` (a parquet column)."""
    if np.dtype(dtype) != np.uint8 or len(shape) != 3:
        return None
    if shape[-1] == 3:
        return "HWC"
    if shape[0] == 3:
        return "CHW"
    return None


def _stats(values: np.ndarray) -> dict[str, Any]:
    """lerobot's per-feature statistics over axis 0 (lists, as its parquet and JSON hold them)."""
    as_float = values.astype(np.float64)
    out: dict[str, Any] = {
        "min": values.min(axis=0),
        "max": values.max(axis=0),
        "mean": as_float.mean(axis=0),
        "std": as_float.std(axis=0),
        "count": np.array([len(values)], np.int64),
    }
    for q in _QUANTILES:
        out[f"q{round(q * 100):02d}"] = np.quantile(as_float, q, axis=0)
    return out


def _image_stats(frames: np.ndarray, layout: str) -> dict[str, Any]:
    """Per-channel statistics of sampled frames scaled to [0, 1], shaped ``(3, 1, 1)``."""
    chw = frames if layout == "CHW" else frames.transpose(0, 3, 1, 2)
    pixels = chw.transpose(1, 0, 2, 3).reshape(3, -1).T.astype(np.float64) / 255.0  # [pixels, 3]
    out = _stats(pixels)
    count = np.array([len(frames)], np.int64)
    return {k: (count if k == "count" else np.asarray(v).reshape(3, 1, 1)) for k, v in out.items()}


def _aggregate(episodes: list[dict[str, Any]], name: str) -> dict[str, np.ndarray]:
    """Dataset statistics from the episodes' (for ``meta/stats.json``, as lerobot aggregates):
    min of the minima, max of the maxima, count-weighted means and quantiles, pooled std."""

    def get(row: dict[str, Any], what: str) -> np.ndarray:
        return np.asarray(row[f"stats/{name}/{what}"], np.float64)

    counts = np.array([get(r, "count").reshape(-1)[0] for r in episodes])
    weights = counts / counts.sum()

    def weighted(what: str) -> np.ndarray:
        return np.asarray(sum(w * get(r, what) for w, r in zip(weights, episodes, strict=True)))

    mean = weighted("mean")
    variance = sum(
        w * (get(r, "std") ** 2 + (get(r, "mean") - mean) ** 2)
        for w, r in zip(weights, episodes, strict=True)
    )
    first = episodes[0]
    out: dict[str, np.ndarray] = {
        "min": np.min([np.asarray(r[f"stats/{name}/min"]) for r in episodes], axis=0),
        "max": np.max([np.asarray(r[f"stats/{name}/max"]) for r in episodes], axis=0),
        "mean": mean,
        "std": np.sqrt(np.asarray(variance)),
        "count": np.array([int(counts.sum())], np.int64),
    }
    for q in _QUANTILES:
        what = f"q{round(q * 100):02d}"
        if f"stats/{name}/{what}" in first:
            out[what] = weighted(what)
    return out


def _as_list(value: np.ndarray) -> Any:
    return np.asarray(value).tolist()


class _Camera:
    """One camera's mp4: every episode's frames, back to back, encoded as they come."""

    def __init__(self, av: Any, path: Path, shape: tuple[int, ...], layout: str, fps: int) -> None:
        self.av = av
        self.layout = layout
        height, width = (shape[1], shape[2]) if layout == "CHW" else (shape[0], shape[1])
        path.parent.mkdir(parents=True, exist_ok=True)
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
        for packet in self.stream.encode():
            self.container.mux(packet)
        self.container.close()


def export_lerobot(
    dataset: Dataset, out: Path, *, overwrite: bool = False, progress: Callable[[int], None] | None = None
) -> Path:
    """Write ``dataset`` as a LeRobot v3.0 directory at ``out`` (see the module docstring).

    Returns:
        ``out``.
    """
    try:
        import av
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise MissingExtraError(
            "exporting to LeRobot needs pyarrow and av, which are not installed",
            hint="pip install 'rlds-cli[lerobot]'",
        ) from None
    meta = dataset.manifest.source.get("metadata")
    source = meta.get("lerobot") if isinstance(meta, dict) else None
    source = source if isinstance(source, dict) else {}
    fps_raw = source.get("fps", DEFAULT_FPS)
    fps = int(fps_raw) if isinstance(fps_raw, int | float) and float(fps_raw).is_integer() else DEFAULT_FPS
    tasks_raw = source.get("tasks")
    tasks = (
        {int(k): str(v) for k, v in tasks_raw.items()}
        if isinstance(tasks_raw, dict) and tasks_raw
        else {0: dataset.name}
    )
    fields = dataset.stored_fields
    if "action" not in fields:
        raise ExportError(
            f"{dataset.name} has no single 'action' array (a dict action space?); LeRobot needs one",
            hint="export to torchrl or minari, which keep dict actions",
        )
    cameras = {k: _camera_layout(fields[k].shape, np.dtype(fields[k].dtype)) for k in flat_keys(dataset)}
    names = {k: _feature_name(k) for k in flat_keys(dataset)}
    extra = [k for k in step_keys(dataset) if k.removeprefix("info/") not in (*_BOOKKEEPING, "next.success")]
    # a dataset converted from LeRobot keeps the source's own success flags: write those back
    success_key = "info/next.success" if "info/next.success" in fields else None
    extra_names = {k: k.removeprefix("info/").replace("/", ".") for k in extra}
    taken = list(names.values()) + list(extra_names.values())
    if len(set(taken)) != len(taken) or set(taken) & {"action", "next.reward", "next.done", "next.success"}:
        raise ExportError(f"{dataset.name}: two keys map to the same LeRobot feature name ({sorted(taken)})")
    task_key = "info/task_index" if "info/task_index" in fields else None

    given_names = source.get("names")
    axis_names: dict[str, Any] = given_names if isinstance(given_names, dict) else {}
    features = _features(dataset, names, cameras, extra_names, fps, axis_names)
    order = list(features)
    with atomic_target(out, overwrite=overwrite) as tmp:
        (tmp / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
        (tmp / "data" / "chunk-000").mkdir(parents=True)
        videos = {
            k: _Camera(
                av,
                tmp / VIDEO_PATH.format(video_key=names[k], chunk_index=0, file_index=0),
                fields[k].shape,
                layout,
                fps,
            )
            for k, layout in cameras.items()
            if layout is not None
        }
        writer = None
        episodes: list[dict[str, Any]] = []
        try:
            for e in range(dataset.num_episodes):
                start = int(dataset.episode_index["start"][e])
                length = int(dataset.episode_index["length"][e])
                rows = slice(start, start + length)
                flat = slice(start + e, start + e + length)  # each earlier episode adds a final obs
                columns: dict[str, np.ndarray] = {}
                for k in flat_keys(dataset):
                    if cameras[k] is None:
                        columns[names[k]] = np.asarray(dataset.column(k)[flat])
                columns["action"] = np.asarray(dataset.column("action")[rows])
                columns["next.reward"] = np.asarray(dataset.column("next/reward")[rows])
                term = np.asarray(dataset.column("next/terminated")[rows]).reshape(length, -1).any(axis=1)
                trunc = np.asarray(dataset.column("next/truncated")[rows]).reshape(length, -1).any(axis=1)
                columns["next.done"] = np.asarray(term | trunc, bool)
                success = np.asarray(dataset.column(success_key)[rows]) if success_key else term
                columns["next.success"] = np.asarray(
                    np.asarray(success, bool).reshape(length, -1).any(axis=1)
                )
                for k in extra:
                    columns[extra_names[k]] = np.asarray(dataset.column(k)[rows])
                frame_index = np.arange(length, dtype=np.int64)
                columns["timestamp"] = (frame_index / fps).astype(np.float32)
                columns["frame_index"] = frame_index
                columns["episode_index"] = np.full(length, e, np.int64)
                columns["index"] = np.arange(start, start + length, dtype=np.int64)
                columns["task_index"] = (
                    np.asarray(dataset.column(task_key)[rows]).reshape(length).astype(np.int64)
                    if task_key
                    else np.zeros(length, np.int64)
                )
                table = pa.table({name: _arrow(pa, values) for name, values in columns.items()})
                if writer is None:
                    writer = pq.ParquetWriter(
                        tmp / DATA_PATH.format(chunk_index=0, file_index=0),
                        table.schema.with_metadata(
                            {"huggingface": _hf_features(features, table.column_names)}
                        ),
                    )
                writer.write_table(table)
                row: dict[str, Any] = {
                    "episode_index": e,
                    "tasks": [tasks.get(int(t), "") for t in np.unique(columns["task_index"])],
                    "length": length,
                    "data/chunk_index": 0,
                    "data/file_index": 0,
                    "dataset_from_index": start,
                    "dataset_to_index": start + length,
                }
                stats: dict[str, dict[str, Any]] = {}
                for k, camera in videos.items():
                    column = dataset.column(k)
                    lo, hi = camera.add_episode(column, flat.start, length)
                    prefix = f"videos/{names[k]}/"
                    row.update(
                        {
                            prefix + "chunk_index": 0,
                            prefix + "file_index": 0,
                            prefix + "from_timestamp": lo,
                            prefix + "to_timestamp": hi,
                        }
                    )
                    sample = np.unique(np.linspace(0, length - 1, min(length, STATS_FRAMES)).astype(np.int64))
                    frames = np.stack([np.asarray(column[flat.start + int(i)]) for i in sample])
                    stats[names[k]] = _image_stats(frames, camera.layout)
                for name, values in columns.items():
                    stats[name] = _stats(values.reshape(length, -1) if values.ndim == 1 else values)
                for name in sorted(stats, key=order.index):  # lerobot's order: info.json's features
                    for what, value in stats[name].items():
                        row[f"stats/{name}/{what}"] = _as_list(value)
                episodes.append(row)
                if progress is not None:
                    progress(length)
        finally:
            if writer is not None:
                writer.close()
            for camera in videos.values():
                camera.close()
        for row in episodes:
            row["meta/episodes/chunk_index"] = 0
            row["meta/episodes/file_index"] = 0
        pq.write_table(
            pa.Table.from_pylist(episodes), tmp / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
        )
        task_table = pa.table(
            {
                "task_index": list(tasks),
                "__index_level_0__": pa.array(list(tasks.values()), pa.large_string()),
            }
        )
        pq.write_table(
            task_table.replace_schema_metadata(_pandas_tasks(pa.__version__)), tmp / "meta" / "tasks.parquet"
        )
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": source.get("robot_type") or "unknown",
            "total_episodes": dataset.num_episodes,
            "total_frames": dataset.num_steps,
            "total_tasks": len(tasks),
            "chunks_size": CHUNKS_SIZE,
            "data_files_size_in_mb": 100,
            "video_files_size_in_mb": 200,
            "fps": fps,
            "splits": {"train": f"0:{dataset.num_episodes}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if videos else None,
            "features": features,
        }
        (tmp / "meta" / "info.json").write_text(json.dumps(info, indent=4))
        names_with_stats = (
            {k.split("/")[1] for k in episodes[0] if k.startswith("stats/")} if episodes else set()
        )
        overall = {name: _aggregate(episodes, name) for name in sorted(names_with_stats)}
        (tmp / "meta" / "stats.json").write_text(
            json.dumps({n: {w: _as_list(v) for w, v in s.items()} for n, s in overall.items()}, indent=4)
        )
    return out


def _arrow(pa: Any, values: np.ndarray) -> Any:
    """A column as lerobot writes it: scalars for one value per row, fixed-size lists otherwise."""
    values = np.ascontiguousarray(values)
    if values.ndim == 2 and values.shape[1] == 1:
        values = values[:, 0]
    if values.ndim == 1:
        return pa.array(values)
    inner = _arrow(pa, values.reshape(-1, *values.shape[2:]))
    return pa.FixedSizeListArray.from_arrays(inner, values.shape[1])


def _features(
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


def _pandas_tasks(pyarrow_version: str) -> dict[str, str]:
    """The ``pandas`` schema metadata of lerobot's ``meta/tasks.parquet`` (a DataFrame indexed by
    the task text): LeRobot reads the file with ``pd.read_parquet``, which makes
    ``__index_level_0__`` the index only when this says so (the task texts would else be lost)."""
    return {
        "pandas": json.dumps(
            {
                "index_columns": ["__index_level_0__"],
                "column_indexes": [
                    {
                        "name": None,
                        "field_name": None,
                        "pandas_type": "unicode",
                        "numpy_type": "str",
                        "metadata": {"encoding": "UTF-8"},
                    }
                ],
                "columns": [
                    {
                        "name": "task_index",
                        "field_name": "task_index",
                        "pandas_type": "int64",
                        "numpy_type": "int64",
                        "metadata": None,
                    },
                    {
                        "name": None,
                        "field_name": "__index_level_0__",
                        "pandas_type": "object",
                        "numpy_type": "str",
                        "metadata": None,
                    },
                ],
                "attributes": {},
                "creator": {"library": "pyarrow", "version": pyarrow_version},
            }
        )
    }


def _hf_features(features: dict[str, Any], columns: list[str]) -> str:
    """The ``huggingface`` schema metadata lerobot's data files carry (the features as the
    ``datasets`` library names them: ``Value``, fixed-length ``List``), for the Hub's viewer and
    ``datasets.load_dataset``."""

    def spec(dtype: str, shape: list[int]) -> dict[str, Any]:
        out: dict[str, Any] = {"dtype": dtype, "_type": "Value"}
        dims = shape[:-1] if shape and shape[-1] == 1 else shape  # as _arrow drops a last axis of 1
        for length in reversed(dims):
            out = {"feature": out, "length": length, "_type": "List"}
        return out

    described = {name: spec(features[name]["dtype"], list(features[name]["shape"])) for name in columns}
    return json.dumps({"info": {"features": described}})
