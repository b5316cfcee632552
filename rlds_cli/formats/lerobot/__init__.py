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

The package, one module per job:
:mod:`~rlds_cli.formats.lerobot.layout`: the dataset directory, ``sniff``, ``source_files``, path
templates and the containment check; :mod:`~rlds_cli.formats.lerobot.layout`: what each feature
becomes; :mod:`~rlds_cli.formats.lerobot.tables`: the tasks and episodes tables;
:mod:`~rlds_cli.formats.lerobot.rows`: the parquet rows; :mod:`~rlds_cli.formats.lerobot.frames`:
how video frames are matched to rows; :mod:`~rlds_cli.formats.lerobot.rows`: rows -> TED
blocks (the last-row rule, episode ends); :mod:`~rlds_cli.formats.lerobot.reader`:
:class:`LeRobotReader` and its options.
"""

from __future__ import annotations

from rlds_cli.formats.lerobot.frames import TIMESTAMP_TOLERANCE_S
from rlds_cli.formats.lerobot.layout import (
    INFO_FILE,
    VERSIONS,
    dataset_root,
    is_lerobot,
    sniff,
    source_files,
)
from rlds_cli.formats.lerobot.reader import BLOCK_ROWS, LeRobotOptions, LeRobotReader
from rlds_cli.formats.packing import BLOCK_BYTES
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
