"""Export to a LeRobot v3.0 dataset directory, in the layout lerobot 0.4 writes.

Files (as in ``tests/fixtures/lerobot-v3-tiny/``): ``meta/info.json``, ``meta/tasks.parquet``,
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
  PyAV into one AV1 mp4 per key (libsvtav1, ``yuv420p``, CRF 30, a keyframe every 2 frames as in the
  fixture lerobot wrote, and at every episode start), episodes back to back, each episode's span in
  the episodes table. AV1 is lossy: frames come back close, not equal.
* Other observation keys are parquet columns (nested lists for more than one dimension).
* ``fps`` and the task texts come from the source when it was a LeRobot dataset
  (``source.metadata.lerobot``); otherwise ``fps`` is 30 and there is one task, the dataset's name.
* Per-episode statistics (``stats/<feature>/{min,max,mean,std,count,q01,q10,q50,q90,q99}``, the
  columns lerobot writes) over the episode's rows for parquet columns, and per channel on at most
  100 evenly spaced frames, scaled to ``[0, 1]``, for cameras; ``meta/stats.json`` aggregates them
  over the dataset.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.errors import ExportError
from rlds_cli.export import atomic_target
from rlds_cli.export.lerobot_common import (
    CHUNKS_SIZE,
    QUANTILES,
    STATS_FRAMES,
    Camera,
    arrow_column,
    as_list,
    episode_columns,
    feature_stats,
    hf_features,
    image_stats,
    import_writers,
    plan_export,
)
from rlds_cli.export.lerobot_v21 import export_lerobot_v21

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"


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
    for q in QUANTILES:
        what = f"q{round(q * 100):02d}"
        if f"stats/{name}/{what}" in first:
            out[what] = weighted(what)
    return out


#: The layouts ``version`` takes.
VERSIONS = ("3.0", "2.1")


def export_lerobot(
    dataset: Dataset,
    out: Path,
    *,
    overwrite: bool = False,
    progress: Callable[[int], None] | None = None,
    version: str = "3.0",
) -> Path:
    """Write ``dataset`` as a LeRobot directory at ``out`` (see the module docstring).

    Args:
        version: ``"3.0"`` (lerobot 0.4's layout) or ``"2.1"`` (per-episode files:
            :mod:`rlds_cli.export.lerobot_v21`); both share :mod:`rlds_cli.export.lerobot_common`.

    Returns:
        ``out``.
    """
    version = str(version).removeprefix("v")
    if version not in VERSIONS:
        raise ExportError(
            f"LeRobot version {version!r}; rlds writes {' and '.join(VERSIONS)}",
            hint="--lerobot-version 3.0 (lerobot 0.4) or 2.1 (lerobot 0.1-0.3, GR00T, openpi)",
        )
    if version == "2.1":
        return export_lerobot_v21(dataset, out, overwrite=overwrite, progress=progress)
    av, pa, pq = import_writers()
    plan = plan_export(dataset)
    fps, tasks, names, cameras, features = plan.fps, plan.tasks, plan.names, plan.cameras, plan.features
    fields = dataset.stored_fields
    order = list(features)
    with atomic_target(out, overwrite=overwrite) as tmp:
        (tmp / "meta" / "episodes" / "chunk-000").mkdir(parents=True)
        (tmp / "data" / "chunk-000").mkdir(parents=True)
        videos = {
            k: Camera(
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
                flat = slice(start + e, start + e + length)  # each earlier episode adds a final obs
                columns = episode_columns(dataset, plan, e)
                table = pa.table({name: arrow_column(pa, values) for name, values in columns.items()})
                if writer is None:
                    writer = pq.ParquetWriter(
                        tmp / DATA_PATH.format(chunk_index=0, file_index=0),
                        table.schema.with_metadata(
                            {"huggingface": hf_features(features, table.column_names)}
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
                    stats[names[k]] = image_stats(frames, camera.layout)
                for name, values in columns.items():
                    stats[name] = feature_stats(values.reshape(length, -1) if values.ndim == 1 else values)
                for name in sorted(stats, key=order.index):  # lerobot's order: info.json's features
                    for what, value in stats[name].items():
                        row[f"stats/{name}/{what}"] = as_list(value)
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
            "robot_type": plan.robot_type,
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
            json.dumps({n: {w: as_list(v) for w, v in s.items()} for n, s in overall.items()}, indent=4)
        )
    return out


def _pandas_tasks(pyarrow_version: str) -> dict[str, str]:
    """The ``pandas`` schema metadata of lerobot's ``meta/tasks.parquet`` (a DataFrame indexed by
    the task text): LeRobot reads it with ``pd.read_parquet``, which makes ``__index_level_0__`` the
    index (the task texts) only when this says so."""
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
