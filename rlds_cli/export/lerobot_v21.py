"""Export to a LeRobot v2.1 dataset directory (``--to lerobot --lerobot-version 2.1``), the layout
lerobot 0.1-0.3 writes and GR00T and openpi read.

One parquet file and one mp4 per camera for each episode, and JSON-lines metadata, as lerobot's
``LeRobotDataset.save_episode`` and ``LeRobotDatasetMetadata`` (``lerobot/common/datasets/``) write
them:

* ``meta/info.json``: ``codebase_version`` ``"v2.1"``, ``robot_type``, ``total_episodes``,
  ``total_frames``, ``total_tasks``, ``total_videos`` (episodes x cameras), ``total_chunks``,
  ``chunks_size`` (1000 episodes a chunk), ``fps``, ``splits``, ``data_path``, ``video_path``
  (:data:`DATA_PATH`, :data:`VIDEO_PATH`; ``null`` without cameras) and ``features``.
* ``meta/episodes.jsonl``: ``{"episode_index", "tasks", "length"}`` a line, ``tasks`` the texts of
  the episode's task indices; ``meta/tasks.jsonl``: ``{"task_index", "task"}``.
* ``meta/episodes_stats.jsonl``: ``{"episode_index", "stats": {feature: {min, max, mean, std,
  count}}}`` for every feature (lerobot 0.3's ``compute_episode_stats``: no quantiles); a camera's
  over sampled frames (:func:`sample_indices`, frames over 300 pixels strided down as lerobot does),
  per channel, divided by 255, shaped ``(3, 1, 1)``. No ``meta/stats.json``: lerobot 0.3 aggregates
  the episodes' statistics when it loads.
* ``data/chunk-CCC/episode_EEEEEE.parquet``: the episode's rows, the columns and feature rules of
  the v3.0 export (:func:`rlds_cli.export.lerobot_common.episode_columns`; the ``huggingface``
  metadata with ``datasets`` 3's ``Sequence``).
* ``videos/chunk-CCC/<key>/episode_EEEEEE.mp4``: the episode's frames, encoded as the v3.0 export
  encodes them (AV1, ``yuv420p``, CRF 30, a keyframe every 2 frames), timestamps from 0.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.export import atomic_target
from rlds_cli.export.lerobot_common import (
    CHUNKS_SIZE,
    Camera,
    LeRobotPlan,
    arrow_column,
    as_list,
    episode_columns,
    feature_stats,
    hf_features,
    import_writers,
    plan_export,
)

CODEBASE_VERSION = "v2.1"
DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"
VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"


def sample_indices(length: int) -> np.ndarray:
    """The frames of an episode of ``length`` lerobot 0.3 samples for a camera's statistics: at
    least 100 (or all), ``length ** 0.75`` for long episodes, at most 10,000, evenly spaced."""
    low = min(100, length)
    count = max(low, min(int(length**0.75), 10_000))
    return np.round(np.linspace(0, length - 1, count)).astype(np.int64)


def _downsampled(chw: np.ndarray) -> np.ndarray:
    """lerobot 0.3's ``auto_downsample_height_width``: frames of 300 pixels or more on a side are
    strided to about 150."""
    _, height, width = chw.shape[-3:]
    if max(width, height) < 300:
        return chw
    factor = int(width / 150) if width > height else int(height / 150)
    return chw[..., ::factor, ::factor]


def camera_stats(frames: np.ndarray, layout: str) -> dict[str, np.ndarray]:
    """A camera's statistics as lerobot 0.3 computes them: over the ``uint8`` frames' (sample,
    height, width) axes per channel, then divided by 255 (``count`` the frames sampled)."""
    chw = _downsampled(frames if layout == "CHW" else frames.transpose(0, 3, 1, 2))
    axes = (0, 2, 3)
    out = {
        "min": chw.min(axis=axes, keepdims=True) / 255.0,
        "max": chw.max(axis=axes, keepdims=True) / 255.0,
        "mean": chw.mean(axis=axes, keepdims=True) / 255.0,
        "std": chw.std(axis=axes, keepdims=True) / 255.0,
    }
    stats: dict[str, np.ndarray] = {k: np.squeeze(v, axis=0) for k, v in out.items()}
    stats["count"] = np.array([len(frames)], np.int64)
    return stats


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")


def export_lerobot_v21(
    dataset: Dataset, out: Path, *, overwrite: bool = False, progress: Callable[[int], None] | None = None
) -> Path:
    """Write ``dataset`` as a LeRobot v2.1 directory at ``out`` (see the module docstring).

    Returns:
        ``out``.
    """
    av, pa, pq = import_writers()
    plan = plan_export(dataset)
    order = list(plan.features)
    cameras = {k: layout for k, layout in plan.cameras.items() if layout is not None}
    with atomic_target(out, overwrite=overwrite) as tmp:
        (tmp / "meta").mkdir(parents=True)
        episodes: list[dict[str, Any]] = []
        episode_stats: list[dict[str, Any]] = []
        for e in range(dataset.num_episodes):
            episodes.append(_episode(dataset, plan, tmp, e, cameras, av, pa, pq, order, episode_stats))
            if progress is not None:
                progress(episodes[-1]["length"])
        _jsonl(tmp / "meta" / "episodes.jsonl", episodes)
        _jsonl(tmp / "meta" / "episodes_stats.jsonl", episode_stats)
        _jsonl(tmp / "meta" / "tasks.jsonl", [{"task_index": i, "task": t} for i, t in plan.tasks.items()])
        info = {
            "codebase_version": CODEBASE_VERSION,
            "robot_type": plan.robot_type,
            "total_episodes": dataset.num_episodes,
            "total_frames": dataset.num_steps,
            "total_tasks": len(plan.tasks),
            "total_videos": dataset.num_episodes * len(cameras),
            "total_chunks": -(-dataset.num_episodes // CHUNKS_SIZE),
            "chunks_size": CHUNKS_SIZE,
            "fps": plan.fps,
            "splits": {"train": f"0:{dataset.num_episodes}"},
            "data_path": DATA_PATH,
            "video_path": VIDEO_PATH if cameras else None,
            "features": plan.features,
        }
        (tmp / "meta" / "info.json").write_text(json.dumps(info, indent=4, ensure_ascii=False))
    return out


def _episode(
    dataset: Dataset,
    plan: LeRobotPlan,
    tmp: Path,
    e: int,
    cameras: dict[str, str],
    av: Any,
    pa: Any,
    pq: Any,
    order: list[str],
    episode_stats: list[dict[str, Any]],
) -> dict[str, Any]:
    """Write episode ``e``'s parquet file and videos; its ``episodes.jsonl`` line (its statistics
    appended to ``episode_stats``)."""
    start = int(dataset.episode_index["start"][e])
    length = int(dataset.episode_index["length"][e])
    chunk = e // CHUNKS_SIZE
    columns = episode_columns(dataset, plan, e)
    table = pa.table({name: arrow_column(pa, values) for name, values in columns.items()})
    metadata = {"huggingface": hf_features(plan.features, table.column_names, "Sequence")}
    path = tmp / DATA_PATH.format(episode_chunk=chunk, episode_index=e)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(metadata), path)
    stats: dict[str, dict[str, Any]] = {}
    for k, layout in cameras.items():
        name = plan.names[k]
        column = dataset.column(k)
        video = tmp / VIDEO_PATH.format(episode_chunk=chunk, video_key=name, episode_index=e)
        camera = Camera(av, video, dataset.stored_fields[k].shape, layout, plan.fps)
        try:
            camera.add_episode(column, start + e, length)
        finally:
            camera.close()
        frames = np.stack([np.asarray(column[start + e + int(i)]) for i in sample_indices(length)])
        stats[name] = camera_stats(frames, layout)
    for name, values in columns.items():
        stats[name] = feature_stats(
            values.reshape(length, -1) if values.ndim == 1 else values, quantiles=False
        )
    episode_stats.append(
        {
            "episode_index": e,
            "stats": {
                n: {w: as_list(v) for w, v in stats[n].items()} for n in sorted(stats, key=order.index)
            },
        }
    )
    tasks = [plan.tasks.get(int(t), "") for t in np.unique(columns["task_index"])]
    return {"episode_index": e, "tasks": tasks, "length": length}
