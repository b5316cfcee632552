"""Atari DQN replay logs (the DQN Replay Dataset): Dopamine's circular replay buffer, logged as
gzip'd ``.npy`` files, streamed in bounded memory.

A run folder (``<Game>/<run>/``) holds ``replay_logs/`` with six files per checkpoint ``N``, each
``np.save(allow_pickle=False)`` into a ``gzip.GzipFile``: ``$store$_observation_ckpt.N.gz``
(``(C, 84, 84)`` uint8 grey frames), ``$store$_action_ckpt.N.gz`` (``(C,)`` int32),
``$store$_reward_ckpt.N.gz`` (``(C,)`` float32), ``$store$_terminal_ckpt.N.gz`` (``(C,)`` uint8),
``add_count_ckpt.N.gz`` (0-d integer: rows ever added) and ``invalid_range_ckpt.N.gz`` (the slots
around the write cursor). Rules (``atari-dqn-v1``; ``docs/formats.md``, "Atari DQN replay logs"):

* **Rotation.** A checkpoint is a circular buffer of capacity ``C``: once full (``add_count >=
  C``) its oldest row is at slot ``add_count % C``, so it is read as slots ``[cursor, C)`` then
  ``[0, cursor)``; before that, rows ``[0, add_count)``. Row ``p`` of that order is the
  ``add_count - min(add_count, C) + p``-th row ever added (its *add index*).
* **Transitions.** Row ``i`` is ``(frame_i, action_i, reward_i, terminal_i)``: the frame the
  action was chosen on, and what the step returned. Its next frame is row ``i + 1``'s, unless
  ``terminal_i``: Dopamine never stores the frame after a terminal step, so the final
  observation repeats the last frame, ``final_known = false``.
* **Padding.** Dopamine adds ``stack_size - 1`` all-zero rows before each episode: the
  ``stack_size - 1`` rows after a terminal row, and rows with add index below ``stack_size - 1``,
  are dropped when all zero (one holding data is kept and counted in a note).
* **invalid_range.** Its rows straddle the write cursor (no next frame, or a frame stack mixing
  newest and oldest data): they are dropped, and the episode before them ends **truncated**, its
  final observation the dropped row's (real) frame. Where the next converted checkpoint continues
  this one, the cursor is bridged and the rows at that edge are kept. A row whose next frame is
  not in the conversion (end of data, a checkpoint not continued) is dropped the same way.
* **Across checkpoints.** Checkpoints are converted in order of ``N``; ``B`` continues ``A`` when
  ``B``'s first add index is at most ``A``'s ``add_count`` and ``B``'s ``add_count`` is larger
  (batch_rl logs every ``C`` adds, tiling them exactly). Rows of ``B`` already converted from
  ``A`` are skipped; otherwise episodes are cut (truncated) at the junction.
* **Keys.** ``observation`` (flat, stored once, dtype and frame shape kept; stacking is the
  loader's ``FrameStack``), ``action`` (integer dtype kept), ``next/reward`` (float32),
  ``next/terminated`` (``terminal``), ``next/truncated`` (the cuts above). Every checkpoint's
  ``add_count`` and ``invalid_range`` are kept in the manifest's source metadata.
* **Streaming.** A file is inflated front to back (zlib, CRC checked), never held whole; a
  checkpoint whose cursor is inside the data is read twice (the first pass inflates and discards
  the rows before the cursor).
"""

from __future__ import annotations

from rlds_cli.formats.atari_dqn.plan import (
    DEFAULT_STACK_SIZE,
    FILE_NAMES,
    LOGS_DIR,
    RULES,
    STORE_PREFIX,
    file_name,
    logs_folder,
    parse_checkpoints,
    sniff,
    source_files,
)
from rlds_cli.formats.atari_dqn.reader import AtariDQNOptions, AtariDQNReader
from rlds_cli.formats.base import BLOCK_BYTES

__all__ = [
    "BLOCK_BYTES",
    "DEFAULT_STACK_SIZE",
    "FILE_NAMES",
    "LOGS_DIR",
    "RULES",
    "STORE_PREFIX",
    "AtariDQNOptions",
    "AtariDQNReader",
    "file_name",
    "logs_folder",
    "parse_checkpoints",
    "sniff",
    "source_files",
]
