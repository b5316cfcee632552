"""Export to a LeRobot dataset directory (v3.0, as lerobot 0.4 writes it, or v2.1 with
``--lerobot-version 2.1``), or a v3.0 export to a Hub dataset repo.

Export to a LeRobot v3.0 dataset directory, in the layout lerobot 0.4 writes, or to a Hub dataset repo.

Files (as in ``tests/fixtures/lerobot-v3-tiny/``): ``meta/info.json``, ``meta/tasks.parquet``,
``meta/stats.json``, ``meta/episodes/chunk-000/file-000.parquet``,
``data/chunk-000/file-000.parquet`` and ``videos/<key>/chunk-000/file-000.mp4``.

The rules (written out in ``docs/formats.md``, "Export to LeRobot"):

* One LeRobot row per TED step: the step's observations (``observation/<a>/<b>`` becomes
  ``observation.<a>.<b>``; a plain ``observation`` becomes ``observation.state``), ``action``,
  ``next.reward``, ``next.done`` and ``next.success`` (TED's ``next/terminated``, which the LeRobot
  reader reads back as terminated), ``info/<name>`` as ``<name>``, and the bookkeeping columns
  ``timestamp`` (``frame_index / fps``), ``frame_index``, ``episode_index``, ``index``,
  ``task_index`` (an ``info/<name>`` they would replace is refused, unless every row came from
  LeRobot). LeRobot keeps no observation after an episode's last row, so the final
  observations are not written.
* ``uint8`` observations of 3 dimensions with 3 channels (HWC, or CHW) and both sides at least 32
  pixels are cameras (smaller grids are data): encoded with
  PyAV into one AV1 mp4 per key (libsvtav1, ``yuv420p``, CRF 30, a keyframe every 2 frames as in the
  fixture lerobot wrote, and at every episode start), episodes back to back, each episode's span in
  the episodes table. AV1 is lossy: frames come back close, not equal.
* Other observation keys are parquet columns (nested lists for more than one dimension).
* ``fps`` is the dataset card's (a LeRobot source's rate, carried through views, merges and trims,
  divided by downsampling), else 30; a rate that is not a whole number is refused. The tasks are
  the dataset's language instructions (:attr:`~rlds_cli.cache.dataset.Dataset.instructions`: a
  LeRobot source's tasks, an RLDS source's ``language_instruction``, RoboCasa's ``lang``,
  LIBERO's ``problem_info``): the texts some row has, each once, numbered 0..n-1 in the order
  of the source's table (lerobot looks a row's task up by its position in ``tasks.parquet``),
  each row's ``task_index`` its step's (the RLDS index column is not written again); without
  any, one task, the dataset's name.
* Per-episode statistics (``stats/<feature>/{min,max,mean,std,count,q01,q10,q50,q90,q99}``, the
  columns lerobot writes) over the episode's rows for parquet columns, and per channel on at most
  100 evenly spaced frames, scaled to ``[0, 1]``, for cameras; ``meta/stats.json`` aggregates them
  over the dataset.

``rlds export NAME hf://datasets/ORG/REPO[/PATH] --to lerobot``: a LeRobot v3.0 export committed
to a Hub dataset repo, where LeRobot's loader (and ``rlds download hf://...``) reads it.

The export is written to a temporary folder in the cache's ``tmp/`` (removed whatever happens), then
committed to the repo in one commit by :func:`~rlds_cli.remote.hub_push.push_hub_folder` (the commit
code of ``rlds push``): the repo shows the whole export or none of it, only files that differ from
the branch's are sent, and an identical export sends nothing and makes no commit.

Export to a LeRobot v2.1 dataset directory (``--to lerobot --lerobot-version 2.1``), the layout
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
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlds_cli.cache.dataset import Dataset
from rlds_cli.cache.growing import private_build
from rlds_cli.cache.layout import HUB_EXPORT_MARK, entry_name, new_id
from rlds_cli.cache.root import CacheRoot
from rlds_cli.errors import ExportError
from rlds_cli.export import atomic_target
from rlds_cli.export.lerobot_common import (
    CHUNKS_SIZE,
    NONFINITE_STATS,
    QUANTILES,
    STATS_FRAMES,
    Camera,
    LeRobotPlan,
    arrow_column,
    as_list,
    episode_columns,
    feature_stats,
    hf_features,
    image_stats,
    import_writers,
    plan_export,
)

CODEBASE_VERSION = "v3.0"


DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"


VIDEO_PATH = "videos/{video_key}/chunk-{chunk_index:03d}/file-{file_index:03d}.mp4"


class StatsTotal:
    """Dataset statistics from the episodes' (``meta/stats.json``, as lerobot aggregates them),
    accumulated as each episode's row arrives, in memory of one row: min of the minima and max of
    the maxima (in their own dtype: an integer or bool feature stays one), count-weighted means and
    quantiles, and the pooled std combined pairwise (Chan et al.: the sums of squared deviations,
    never ``E[x^2] - mean^2``, which cancels for a large mean)."""

    def __init__(self) -> None:
        self._state: dict[str, dict[str, Any]] = {}

    @NONFINITE_STATS
    def add(self, row: dict[str, Any]) -> None:
        """Take one episode's row (``stats/<name>/<what>`` values)."""
        names = dict.fromkeys(k.split("/")[1] for k in row if k.startswith("stats/"))
        for name in names:
            got = {k.split("/")[2]: v for k, v in row.items() if k.startswith(f"stats/{name}/")}
            count = float(np.asarray(got["count"]).reshape(-1)[0])
            mean = np.asarray(got["mean"], np.float64)
            m2 = count * np.asarray(got["std"], np.float64) ** 2
            quantiles = {w: count * np.asarray(v, np.float64) for w, v in got.items() if w.startswith("q")}
            low, high = np.asarray(got["min"]), np.asarray(got["max"])
            s = self._state.get(name)
            if s is None:
                self._state[name] = {
                    "n": count,
                    "mean": mean,
                    "m2": m2,
                    "q": quantiles,
                    "min": low,
                    "max": high,
                }
                continue
            n, total = s["n"], s["n"] + count
            delta = mean - s["mean"]
            s["mean"] = s["mean"] + delta * (count / total)
            s["m2"] = s["m2"] + m2 + delta**2 * (n * count / total)
            s["n"] = total
            s["q"] = {w: s["q"][w] + v for w, v in quantiles.items()}
            s["min"], s["max"] = np.minimum(s["min"], low), np.maximum(s["max"], high)

    def result(self) -> dict[str, dict[str, np.ndarray]]:
        """Per feature, its dataset statistics."""
        out: dict[str, dict[str, np.ndarray]] = {}
        for name, s in sorted(self._state.items()):
            stats = {"min": s["min"], "max": s["max"], "mean": s["mean"], "std": np.sqrt(s["m2"] / s["n"])}
            stats["count"] = np.array([int(s["n"])], np.int64)
            for q in QUANTILES:
                what = f"q{round(q * 100):02d}"
                if what in s["q"]:
                    stats[what] = s["q"][what] / s["n"]
            out[name] = stats
        return out


#: Rows of the episodes' table written at a time.
INDEX_ROWS = 1024
#: Steps a row group of the data file holds at least (its last one aside): a row group an
#: episode kept each one's metadata in the writer until the end (~1.8 KB an episode of 10 steps);
#: the episodes waiting for their row group cost ~13 KB each, so not many more (measured: 80,000
#: episodes of 10 steps exported in 74 MB above the start, 64 MB for 20,000).
DATA_ROWS = 8_192
#: ... or at least these bytes (wide per-step arrays: memory stays this, not 8,192 steps of them).
DATA_BYTES = 64 << 20

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
            :func:`export_lerobot_v21`); both share :mod:`rlds_cli.export.lerobot_common`.

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
    with atomic_target(out, overwrite=overwrite, folder="meta/info.json") as tmp:
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
        pending: list[Any] = []
        pending_rows = pending_bytes = 0
        total = StatsTotal()
        # the episodes' table, written as it grows (held whole it took ~45 KB an episode)
        index_path = tmp / "meta" / "episodes" / "chunk-000" / "file-000.parquet"
        index_writer: Any = None
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
                # row groups of many episodes: one an episode kept its metadata in the writer's
                # footer (~1.8 KB an episode of 10 steps, held until the end)
                pending.append(table)
                pending_rows += table.num_rows
                pending_bytes += table.nbytes
                if pending_rows >= DATA_ROWS or pending_bytes >= DATA_BYTES or e == dataset.num_episodes - 1:
                    writer.write_table(pa.concat_tables(pending))
                    pending, pending_rows, pending_bytes = [], 0, 0
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
                        # a row of uint64 stays typed: as Python ints, 2**63 and more overflowed
                        # arrow's int64 guess (a recording's random reset seeds)
                        array = np.asarray(value)
                        row[f"stats/{name}/{what}"] = array if array.dtype == np.uint64 else as_list(array)
                row["meta/episodes/chunk_index"] = 0
                row["meta/episodes/file_index"] = 0
                total.add(row)
                episodes.append(row)
                if len(episodes) == INDEX_ROWS or e == dataset.num_episodes - 1:
                    rows = pa.Table.from_pylist(
                        episodes, schema=None if index_writer is None else index_writer.schema
                    )
                    if index_writer is None:
                        index_writer = pq.ParquetWriter(index_path, rows.schema)
                    index_writer.write_table(rows)
                    episodes.clear()
                if progress is not None:
                    progress(length)
        finally:
            for open_writer in (writer, index_writer):
                if open_writer is not None:
                    open_writer.close()
            for camera in videos.values():
                camera.close()
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
        overall = total.result()
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


#: Formats exported to a Hub repo, and the repo folders each owns: a replaced export's file there
#: that the new one lacks is deleted, other files stay; files there with no :data:`MARKER` are
#: another dataset's, deleted only with ``force``.
HUB_FORMATS: dict[str, tuple[str, ...]] = {"lerobot": ("meta/", "data/", "videos/")}


#: The file that tells one export from another (another one there needs ``force``).
MARKER = "meta/info.json"


@dataclass
class HubExportResult:
    """What :func:`export_to_hub` did.

    Attributes:
        name: The dataset exported.
        url: Where the export is now.
        format: The format written.
        num_steps: Steps of the dataset.
        files: Files of the export.
        uploaded: Files this run sent.
        skipped: Files the branch already held, unchanged.
        bytes_uploaded: Bytes this run sent.
        replaced: Another export was at ``url`` and was replaced (``force``).
        up_to_date: The branch held this export already: nothing was sent, no commit was made.
    """

    name: str
    url: str
    format: str
    num_steps: int
    files: int
    uploaded: int
    skipped: int
    bytes_uploaded: int
    replaced: bool
    up_to_date: bool

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def export_to_hub(
    dataset: Dataset,
    url: str,
    format: str = "lerobot",
    *,
    root: str | os.PathLike[str] | CacheRoot | None = None,
    force: bool = False,
    progress: Callable[[int], None] | None = None,
    options: dict[str, Any] | None = None,
) -> HubExportResult:
    """Export ``dataset`` as ``format`` and commit it to the Hub dataset repo folder ``url``.

    Args:
        dataset: An opened dataset.
        url: ``hf://datasets/ORG/REPO[/PATH][@BRANCH]`` (the repo made first; the token from
            ``HF_TOKEN`` or the client's token file).
        format: One of :data:`HUB_FORMATS`.
        root: The cache whose ``tmp/`` holds the export until it is committed.
        force: Replace another export already at ``url`` (or delete files of another dataset
            in the folders the export owns).
        progress: As :func:`~rlds_cli.export.export_dataset`'s (steps written).
        options: The format's options, as :func:`~rlds_cli.export.export_dataset` takes them
            (``{"version": "2.1"}`` for a LeRobot v2.1 export).

    Raises:
        ExportError: ``format`` cannot be exported to the Hub.
        RemoteExistsError: Another export (or another dataset's files in the folders the
            export owns) is at ``url`` and ``force`` is false.
        RemoteAccessError: No such repo or branch, no token that may write to it, the branch
            moved during the push, the Hub unreachable.
    """
    from rlds_cli.export import export_dataset
    from rlds_cli.remote.hub_push import check_branch, push_hub_folder

    owned = HUB_FORMATS.get(format)
    if owned is None:
        raise ExportError(
            f"cannot export {format!r} to {url}: only {', '.join(HUB_FORMATS)} is exported to the Hub",
            hint="export to a local path instead, or use --to lerobot",
        )
    check_branch(url)  # a wrong URL or token says so before the export, not after it
    cache = root if isinstance(root, CacheRoot) else CacheRoot(root)
    # a build of its own in tmp/: removed afterwards, and by rlds gc if this process is killed
    with private_build(cache, f"{entry_name(dataset.name)}{HUB_EXPORT_MARK}{new_id()}") as tmp:
        tmp.mkdir()
        out = export_dataset(dataset, tmp / "export", format, progress=progress, options=options)
        _write_card(dataset, out, url)
        counts = push_hub_folder(
            out,
            url,
            message=f"rlds export {dataset.name} --to {format}",
            marker=MARKER,
            owned=lambda rel: rel.startswith(owned),
            force=force,
        )
    return HubExportResult(name=dataset.name, url=url, format=format, num_steps=dataset.num_steps, **counts)


def _write_card(dataset: Dataset, out: Path, url: str) -> None:
    """The dataset card (``README.md``, with the data's licence and lineage) and Croissant
    metadata of the export, beside its files (see :mod:`rlds_cli.remote.hub_push`)."""
    from rlds_cli._util.io import sha256_file
    from rlds_cli.cache.card import dataset_card
    from rlds_cli.remote.hub_push import card_files

    files = {
        p.relative_to(out).as_posix(): (p.stat().st_size, sha256_file(p))
        for p in sorted(out.rglob("*"))
        if p.is_file()
    }
    read = f"`rlds download {url}` (a LeRobot dataset: LeRobot's `LeRobotDataset` reads it too)"
    for name, data in card_files(dataset.manifest, dataset_card(dataset), files, url, read).items():
        (out / name).write_bytes(data)


V21_CODEBASE_VERSION = "v2.1"


V21_DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"


V21_VIDEO_PATH = "videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4"


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
    with atomic_target(out, overwrite=overwrite, folder="meta/info.json") as tmp:
        (tmp / "meta").mkdir(parents=True)
        # one line an episode, written as it is made (memory stays one episode's)
        with (
            open(tmp / "meta" / "episodes.jsonl", "w", encoding="utf-8") as episodes,
            open(tmp / "meta" / "episodes_stats.jsonl", "w", encoding="utf-8") as episode_stats,
        ):
            for e in range(dataset.num_episodes):
                row, stats = _episode(dataset, plan, tmp, e, cameras, av, pa, pq, order)
                episodes.write(json.dumps(row, ensure_ascii=False) + "\n")
                episode_stats.write(json.dumps(stats, ensure_ascii=False) + "\n")
                if progress is not None:
                    progress(row["length"])
        _jsonl(tmp / "meta" / "tasks.jsonl", [{"task_index": i, "task": t} for i, t in plan.tasks.items()])
        info = {
            "codebase_version": V21_CODEBASE_VERSION,
            "robot_type": plan.robot_type,
            "total_episodes": dataset.num_episodes,
            "total_frames": dataset.num_steps,
            "total_tasks": len(plan.tasks),
            "total_videos": dataset.num_episodes * len(cameras),
            "total_chunks": -(-dataset.num_episodes // CHUNKS_SIZE),
            "chunks_size": CHUNKS_SIZE,
            "fps": plan.fps,
            "splits": {"train": f"0:{dataset.num_episodes}"},
            "data_path": V21_DATA_PATH,
            "video_path": V21_VIDEO_PATH if cameras else None,
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
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Write episode ``e``'s parquet file and videos; its ``episodes.jsonl`` and
    ``episodes_stats.jsonl`` lines."""
    start = int(dataset.episode_index["start"][e])
    length = int(dataset.episode_index["length"][e])
    chunk = e // CHUNKS_SIZE
    columns = episode_columns(dataset, plan, e)
    table = pa.table({name: arrow_column(pa, values) for name, values in columns.items()})
    metadata = {"huggingface": hf_features(plan.features, table.column_names, "Sequence")}
    path = tmp / V21_DATA_PATH.format(episode_chunk=chunk, episode_index=e)
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table.replace_schema_metadata(metadata), path)
    stats: dict[str, dict[str, Any]] = {}
    for k, layout in cameras.items():
        name = plan.names[k]
        column = dataset.column(k)
        video = tmp / V21_VIDEO_PATH.format(episode_chunk=chunk, video_key=name, episode_index=e)
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
    line = {
        "episode_index": e,
        "stats": {n: {w: as_list(v) for w, v in stats[n].items()} for n in sorted(stats, key=order.index)},
    }
    tasks = [plan.tasks.get(int(t), "") for t in np.unique(columns["task_index"])]
    return {"episode_index": e, "tasks": tasks, "length": length}, line
