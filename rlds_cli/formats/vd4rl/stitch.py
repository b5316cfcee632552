"""V-D4RL rows -> TED blocks: the dataset's one-step shift applied across chunks and files
(:class:`Stitcher`); the reader gathers small blocks with
:class:`~rlds_cli.formats.packing.BlockPacker`.

Row ``t`` holds the observation *after* action ``t`` (the dm_env/Dreamer convention), so the step
of a row that does not start an episode is ``obs[t - 1]``, ``action[t]``, ``reward[t]``; an
episode's last row is its final observation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlds_cli.formats.base import StepBlock, column


@dataclass
class Chunk:
    """Consecutive source rows of one file, with where episodes start and end.

    ``start[r]``: row ``r`` begins an episode (its action and reward are not a transition's);
    ``end[r]``: row ``r`` is an episode's last (its observation is the final one);
    ``terminal[r]``: the environment terminated on row ``r``.
    """

    file: int
    obs: dict[str, np.ndarray]
    action: np.ndarray
    reward: np.ndarray
    start: np.ndarray
    end: np.ndarray
    terminal: np.ndarray


class Stitcher:
    """Turns chunks of rows into flat TED blocks, applying the shift: the step of row ``r``
    (not an episode's first) is ``obs[r - 1]``, ``action[r]``, ``reward[r]``. One observation
    row is carried from chunk to chunk while an episode continues."""

    def __init__(self, pixel_key: str, transpose: tuple[int, ...] | None) -> None:
        self.pixel_key = pixel_key
        self.transpose = transpose
        self.carry: dict[str, np.ndarray] | None = None
        self.start_file = -1
        #: Per episode emitted, the file where it started.
        self.episode_file: list[np.ndarray] = []

    def feed(self, c: Chunk) -> StepBlock | None:
        step = ~c.start
        rows = np.flatnonzero(step)
        ends_rows = np.flatnonzero(c.end & step)
        off = 0 if self.carry is None else 1
        if step[0] and self.carry is None:  # the flags say an episode continues but nothing was read
            raise AssertionError("vd4rl: a chunk continues an episode without its previous observation")
        # files of the episodes ending here: this chunk's file once an episode started in it
        opened = np.flatnonzero(c.start & ~c.end)
        first_open = int(opened[0]) if len(opened) else len(c.start)
        files = np.where(ends_rows > first_open, c.file, self.start_file).astype(np.int64)
        if len(opened):
            self.start_file = c.file
        carry = self.carry
        self.carry = None if c.end[-1] else {k: v[-1:].copy() for k, v in c.obs.items()}
        if not len(rows):
            return None
        self.episode_file.append(files)
        ends = np.searchsorted(rows, ends_rows)
        # the flat rows: each step's observation (row r - 1), and after an episode's last step
        # its final observation (row e); offset by one when the carried row leads
        idx = np.insert(rows - 1 + off, ends + 1, ends_rows + off)
        observations = {k: self._gather(k, v, carry, idx) for k, v in c.obs.items()}
        n = len(rows)
        term = np.zeros((n, 1), bool)
        trunc = np.zeros((n, 1), bool)
        term[ends, 0] = c.terminal[ends_rows]
        trunc[ends, 0] = ~c.terminal[ends_rows]
        steps = {
            "action": c.action[rows],
            "next/reward": column(c.reward[rows]),
            "next/terminated": term,
            "next/truncated": trunc,
        }
        return StepBlock(steps=steps, observations=observations, ends=ends.astype(np.int64))

    def _gather(
        self, key: str, rows: np.ndarray, carry: dict[str, np.ndarray] | None, idx: np.ndarray
    ) -> np.ndarray:
        if carry is None and len(idx) == len(rows) and idx[0] == 0 and idx[-1] == len(rows) - 1:
            out = rows  # idx is strictly increasing: it is every row, in order (no copy)
        else:
            out = (rows if carry is None else np.concatenate([carry[key], rows]))[idx]
        if key == self.pixel_key and self.transpose is not None:
            out = np.ascontiguousarray(out.transpose(self.transpose))
        return out
