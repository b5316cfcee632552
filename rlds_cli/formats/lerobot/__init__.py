"""LeRobot datasets (codebase ``v3.0`` and ``v2.1``): parquet frames and mp4 videos, read without the
``lerobot`` package (pyarrow and PyAV: the ``lerobot`` extra).

A LeRobot dataset directory holds ``meta/info.json`` (``codebase_version``, ``fps``,
``features``, ``data_path``/``video_path`` templates, ``chunks_size``), the episodes table (v3.0:
``meta/episodes/chunk-*/file-*.parquet``; v2.1: ``meta/episodes.jsonl``), the tasks (v3.0:
``meta/tasks.parquet``; v2.1: ``meta/tasks.jsonl``), one parquet row per frame under ``data/``
and one mp4 stream per camera under ``videos/`` (v3.0: many episodes per file, back to back, each
spanning ``from_timestamp``/``to_timestamp``; v2.1: one parquet and one mp4 per episode). Rules
(``docs/formats.md``, "LeRobot"):

* **One row is one transition.** Row ``t`` is ``(frame t, action t, next.reward[t]) -> frame
  t + 1``. LeRobot records no observation after an episode's last row, so that transition is kept
  (its action and reward are real) and the final observation repeats the last frame,
  ``final_known = false`` (counted in ``synthesized_final_observations``).
* **Keys.** ``observation.<a>.<b>`` (parquet or video) -> ``observation/<a>/<b>``
  (observation-like); ``action`` -> ``action``; ``next.reward`` -> ``next/reward`` (0 with a note
  when absent); ``next.done`` is not stored (rlds computes ``next/done``; one set before the last
  row is noted; episodes are cut by ``episode_index`` only); ``episode_index`` (kept as the
  episode's source id) and ``index`` are not stored; other numeric columns ``<name>``
  (``timestamp``, ``frame_index``, ``task_index``, ``next.success``...) -> ``info/<name>``; text
  columns are dropped with a note. Names go through :mod:`rlds_cli.formats.base`.
* **Episode ends.** An episode's last row ends it: **terminated** when ``next.success`` exists and
  is true there, **truncated** otherwise.
* **Video.** Frames are decoded with PyAV into uint8 RGB (``gray`` for one channel), HWC or CHW as
  the feature's ``names`` say. Row ``t`` of episode ``e`` gets the frame whose presentation time
  is within :data:`TIMESTAMP_TOLERANCE_S` of ``from_timestamp(e) + timestamp[t]`` (lerobot's rule
  and tolerance); v2.1 videos start each episode at 0. One frame per camera is held at a time.
* **Untrusted input.** ``data_path``/``video_path`` are filled by a restricted formatter (known
  fields, integer widths only); every file read must stay inside the dataset directory (``..``
  templates, absolute paths, symlinks out are refused).

Modules: :mod:`~rlds_cli.formats.lerobot.layout` (the directory, ``sniff``, ``source_files``, path
templates, containment, what each feature becomes, the tasks and episodes tables);
:mod:`~rlds_cli.formats.lerobot.reader` (parquet rows and the video frames matched to them ->
transitions; :class:`LeRobotReader` and its options).
"""

from __future__ import annotations

from rlds_cli.formats.base import BLOCK_BYTES
from rlds_cli.formats.lerobot.layout import (
    INFO_FILE,
    VERSIONS,
    dataset_root,
    is_lerobot,
    sniff,
    source_files,
)
from rlds_cli.formats.lerobot.reader import BLOCK_ROWS, TIMESTAMP_TOLERANCE_S, LeRobotOptions, LeRobotReader
from rlds_cli.formats.untrusted import MAX_JSON_BYTES

__all__ = [
    "BLOCK_BYTES",
    "BLOCK_ROWS",
    "INFO_FILE",
    "MAX_JSON_BYTES",
    "TIMESTAMP_TOLERANCE_S",
    "VERSIONS",
    "LeRobotOptions",
    "LeRobotReader",
    "dataset_root",
    "is_lerobot",
    "sniff",
    "source_files",
]
