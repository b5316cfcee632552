"""V-D4RL rows -> TED blocks: the dataset's one-step shift applied across chunks and files
(:class:`Stitcher`), and small blocks gathered into blocks of about :data:`BLOCK_BYTES`
(:class:`Packer`).

Row ``t`` holds the observation *after* action ``t`` (the dm_env/Dreamer convention), so the step
of a row that does not start an episode is ``obs[t - 1]``, ``action[t]``, ``reward[t]``; an
episode's last row is its final observation.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np

from rlds_cli.formats.base import StepBlock, column

#: Target source bytes per block (a 64px Dreamer episode is about 6 MB of frames).
BLOCK_BYTES = 8 * 1024 * 1024


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


class Packer:
    """Gathers small blocks (short episodes) into blocks of about :data:`BLOCK_BYTES` (or
    ``block_rows`` steps); a block that would overflow the pending ones goes out alone, so a
    full-size block is never copied."""

    def __init__(self, block_rows: int | None) -> None:
        self.block_rows = block_rows
        self.pending: list[StepBlock] = []
        self.bytes = 0
        self.steps = 0

    def _full(self, nbytes: int, steps: int, *, over: bool = False) -> bool:
        """Whether ``nbytes``/``steps`` reach the budget (``over``: go past it)."""
        rows = self.block_rows if self.block_rows is not None else steps + 1
        return (nbytes > BLOCK_BYTES or steps > rows) if over else (nbytes >= BLOCK_BYTES or steps >= rows)

    def add(self, block: StepBlock) -> Iterator[StepBlock]:
        nbytes = sum(v.nbytes for v in (*block.steps.values(), *block.observations.values()))
        if self.pending and self._full(self.bytes + nbytes, self.steps + block.num_steps, over=True):
            yield self._flush()
        self.pending.append(block)
        self.bytes += nbytes
        self.steps += block.num_steps
        if self._full(self.bytes, self.steps):
            yield self._flush()

    def finish(self) -> Iterator[StepBlock]:
        if self.pending:
            yield self._flush()

    def _flush(self) -> StepBlock:
        blocks, self.pending, self.bytes, self.steps = self.pending, [], 0, 0
        if len(blocks) == 1:
            return blocks[0]
        offsets = np.cumsum([0, *(b.num_steps for b in blocks[:-1])])
        return StepBlock(
            steps={k: np.concatenate([b.steps[k] for b in blocks]) for k in blocks[0].steps},
            observations={
                k: np.concatenate([b.observations[k] for b in blocks]) for k in blocks[0].observations
            },
            ends=np.concatenate([b.ends + o for b, o in zip(blocks, offsets, strict=True)]),
        )
