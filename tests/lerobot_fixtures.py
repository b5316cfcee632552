"""LeRobot source trees for the tests, built from the golden fixture ``tests/fixtures/lerobot-v3-tiny/``
(written by lerobot 0.4.4: 3 episodes of 20/25/30 frames, fps 10, one 64x64 AV1 camera, all in
one data file and one video file): its v2.1 rewrite (:func:`v21_tree`) and a v3.0 tree whose
last episode lies in files of its own (:func:`split_v3_tree`). Needs pyarrow and av (imported
when called: a test module skips first when they are missing).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "lerobot-v3-tiny"
VIDEO = Path("videos/observation.image/chunk-000/file-000.mp4")
DATA = Path("data/chunk-000/file-000.parquet")
EPISODES = Path("meta/episodes/chunk-000/file-000.parquet")
LENGTHS = [20, 25, 30]


def writable_v3(tmp_path: Path) -> Path:
    """A writable copy of the golden v3.0 tree under ``tmp_path``."""
    dst = tmp_path / "src" / "lerobot-v3-tiny"
    shutil.copytree(FIXTURE, dst)
    for p in dst.rglob("*"):
        p.chmod(0o755 if p.is_dir() else 0o644)
    return dst


def _info(root: Path) -> dict[str, Any]:
    return json.loads((root / "meta" / "info.json").read_text())


def episode_windows() -> list[tuple[float, float]]:
    """Each fixture episode's ``(from_timestamp, to_timestamp)`` in its video file."""
    import pyarrow.parquet as pq

    eps = pq.read_table(FIXTURE / EPISODES).to_pydict()
    col = "videos/observation.image/"
    return list(zip(eps[col + "from_timestamp"], eps[col + "to_timestamp"], strict=True))


def edit_column(path: Path, name: str, edit: Callable[[list[Any]], None]) -> None:
    """Rewrite the column ``name`` of the parquet file ``path`` in place: ``edit`` changes its values
    (a Python list, changed in place); the column keeps its arrow type, the file its other columns."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    i = table.schema.get_field_index(name)
    values = table.column(i).to_pylist()
    edit(values)
    table = table.set_column(i, table.schema.field(i), pa.array(values, type=table.schema.field(i).type))
    pq.write_table(table, path)


def remux(src: Path, dst: Path, start: float, stop: float, *, drop_last: int = 0) -> int:
    """Copy the packets of ``src`` timed in ``[start, stop)`` into ``dst``, shifted to start at 0
    (no re-encoding: the frames decode bit-identical). Returns the packets written."""
    import av

    dst.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(src)) as inp:
        stream = inp.streams.video[0]
        packets = [
            p
            for p in inp.demux(stream)
            if p.pts is not None and start - 1e-4 <= float(p.pts * stream.time_base) < stop - 1e-4
        ]
        packets = packets[: len(packets) - drop_last]
        assert packets[0].is_keyframe  # lerobot encodes each episode on its own: it starts on a keyframe
        offset = round(start / stream.time_base)
        with av.open(str(dst), "w") as out:
            ostream = out.add_stream_from_template(stream, opaque=True)
            for p in packets:
                p.pts -= offset
                p.dts -= offset
                p.stream = ostream
                out.mux(p)
    return len(packets)


def v21_tree(v3_root: Path, dst: Path) -> Path:
    """The v3 fixture rewritten in lerobot's v2.1 layout: ``data/chunk-000/episode_00000e.parquet``
    and ``videos/chunk-000/observation.image/episode_00000e.mp4`` per episode, ``meta/episodes.jsonl``
    and ``meta/tasks.jsonl``, and info.json with v2.1's templates."""
    import pyarrow.parquet as pq

    (dst / "meta").mkdir(parents=True)
    table = pq.read_table(v3_root / DATA)
    windows = episode_windows()
    tasks = pq.read_table(v3_root / "meta" / "tasks.parquet").to_pydict()
    with open(dst / "meta" / "tasks.jsonl", "w") as f:
        for index, text in zip(tasks["task_index"], tasks["__index_level_0__"], strict=True):
            f.write(json.dumps({"task_index": index, "task": text}) + "\n")
    start = 0
    with open(dst / "meta" / "episodes.jsonl", "w") as f:
        for e, length in enumerate(LENGTHS):
            f.write(json.dumps({"episode_index": e, "tasks": ["push the T"], "length": length}) + "\n")
            path = dst / "data" / "chunk-000" / f"episode_{e:06d}.parquet"
            path.parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(table.slice(start, length), path)
            video = dst / "videos" / "chunk-000" / "observation.image" / f"episode_{e:06d}.mp4"
            assert remux(v3_root / VIDEO, video, *windows[e]) == length
            start += length
    info = _info(v3_root)
    info.update(
        codebase_version="v2.1",
        total_chunks=1,
        total_videos=len(LENGTHS),
        data_path="data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet",
        video_path="videos/chunk-{episode_chunk:03d}/{video_key}/episode_{episode_index:06d}.mp4",
    )
    for key in ("data_files_size_in_mb", "video_files_size_in_mb"):
        info.pop(key)
    (dst / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    return dst


def split_v3_tree(root: Path) -> Path:
    """``root`` (a copy of the fixture) rewritten as lerobot writes a dataset once a file reaches
    its size limit: episodes 0-1 in ``file-000`` and episode 2 in ``file-001`` (parquet and mp4),
    the episodes table saying so."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pq.read_table(root / DATA)
    first = sum(LENGTHS[:2])
    pq.write_table(table.slice(0, first), root / DATA)
    pq.write_table(table.slice(first), root / DATA.with_name("file-001.parquet"))
    lo, hi = episode_windows()[2]
    remux(FIXTURE / VIDEO, root / VIDEO, 0.0, lo)
    remux(FIXTURE / VIDEO, root / VIDEO.with_name("file-001.mp4"), lo, hi)
    episodes = pq.read_table(root / EPISODES)
    col = "videos/observation.image/"
    for name, values in (
        ("data/file_index", [0, 0, 1]),
        (col + "file_index", [0, 0, 1]),
        (col + "from_timestamp", [0.0, 2.0, 0.0]),
        (col + "to_timestamp", [2.0, 4.5, hi - lo]),
    ):
        column = pa.array(values, episodes.schema.field(name).type)
        episodes = episodes.set_column(episodes.column_names.index(name), name, column)
    pq.write_table(episodes, root / EPISODES)
    return root


def state_only_tree(root: Path, rows: int) -> Path:
    """A camera-less v3.0 tree of one episode of ``rows`` all-zero frames (tiny once compressed)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    shutil.copytree(FIXTURE / "meta", root / "meta")
    shutil.rmtree(root / "meta" / "episodes")
    info = _info(root)
    del info["features"]["observation.image"]
    info.update(total_episodes=1, total_frames=rows)
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=4))
    zeros = pa.array(np.zeros(rows, np.float32))
    pair = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(2 * rows, np.float32)), 2)
    ints = pa.array(np.zeros(rows, np.int64))
    table = pa.table(
        {
            "observation.state": pair,
            "action": pair,
            "next.reward": zeros,
            "next.done": pa.array(np.zeros(rows, bool)),
            "next.success": pa.array(np.zeros(rows, bool)),
            "timestamp": zeros,
            "frame_index": ints,
            "episode_index": ints,
            "index": ints,
            "task_index": ints,
        }
    )
    (root / DATA).parent.mkdir(parents=True)
    pq.write_table(table, root / DATA)
    episodes = pa.table(
        {
            "episode_index": [0],
            "length": [rows],
            "data/chunk_index": [0],
            "data/file_index": [0],
            "dataset_from_index": [0],
            "dataset_to_index": [rows],
        }
    )
    (root / EPISODES).parent.mkdir(parents=True)
    pq.write_table(episodes, root / EPISODES)
    return root
