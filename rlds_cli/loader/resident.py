"""``resident_window=``: uniform and slice sampling restricted to a window of resident blocks.

With chunked storage (zarr shards, an object store behind a bounded cache) a uniform draw over
the whole dataset fetches a chunk per row. A :class:`ResidentWindow` restricts a sampler with
replacement to ``window`` blocks (:func:`block_starts`, as ``sampler="blocks"``) at a time. Blocks
follow one permutation per cycle (from the run seed and rank); the oldest leaves once as many
steps have been drawn since the window last moved as it holds rows. Draws are uniform over the
window's rows, so over a cycle each step is drawn about once. State: two integers (position,
steps drawn since the last move) beside the sampler's generator.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_cli.cache.reader import Episodes
from rlds_cli.loader.state_checks import check_int, check_state


def block_starts(episodes: Episodes, block_rows: int) -> np.ndarray:
    """First step of each block: episodes grouped by the ``block_rows``-row chunk their first step
    falls in (whole episodes; a chunk where no episode starts adds no block)."""
    chunk = episodes.starts // block_rows
    first = np.flatnonzero(np.r_[True, chunk[1:] != chunk[:-1]])
    return episodes.starts[first]


class ResidentWindow:
    """``window`` blocks of episodes that a sampler draws from, advancing as it draws.

    Args:
        episodes: The dataset's episodes.
        block_rows: Rows per block (see :func:`block_starts`).
        window: Blocks resident at once (all of them when there are fewer).
        seed: The seed of the block order (a rank's stream seed: ranks walk different orders).
    """

    def __init__(self, episodes: Episodes, block_rows: int, window: int, seed: int) -> None:
        self.starts = block_starts(episodes, block_rows)
        self.num_blocks = len(self.starts)
        self.lengths = np.diff(np.r_[self.starts, episodes.num_steps])
        #: Each block's first episode; block ``k`` holds episodes ``[first[k], first[k + 1])``.
        bounds = np.r_[self.starts, episodes.num_steps]
        self.first_episode = np.asarray(np.searchsorted(episodes.starts, bounds), np.int64)
        self.window = min(int(window), self.num_blocks)
        self.block_rows = int(block_rows)
        self.seed = int(seed)
        self.position = 0  # sequence index of the oldest resident block
        self.drawn = 0  # steps drawn since the window last moved
        self._cycles: dict[int, np.ndarray] = {}

    def _block_at(self, q: int) -> int:
        cycle = q // self.num_blocks
        perm = self._cycles.get(cycle)
        if perm is None:
            self._cycles = {c: p for c, p in self._cycles.items() if c >= cycle - 1}  # at most two kept
            perm = self._cycles[cycle] = np.random.default_rng([self.seed, cycle]).permutation(
                self.num_blocks
            )
        return int(perm[q % self.num_blocks])

    def reseed(self, seed: int) -> None:
        """Walk the block order of another seed (a restored run's)."""
        self.seed, self._cycles = int(seed), {}

    def blocks(self) -> np.ndarray:
        """The resident blocks (distinct; fewer than ``window`` for a moment when the window
        spans two cycles and meets a block twice)."""
        ids = [self._block_at(q) for q in range(self.position, self.position + self.window)]
        return np.unique(np.array(ids, np.int64))

    def advance(self, n: int) -> None:
        """Count ``n`` steps drawn; the oldest block leaves when its rows' worth have been."""
        self.drawn += int(n)
        while self.drawn >= (size := int(self.lengths[self._block_at(self.position)])):
            self.drawn -= size
            self.position += 1

    def rows(self, k: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """Rows of the ``k``-th steps (in ``[0, rows of blocks)``) of ``blocks`` laid end to end."""
        lengths = self.lengths[blocks]
        ends = np.cumsum(lengths)
        b = np.searchsorted(ends, k, side="right")
        return self.starts[blocks][b] + k - (ends - lengths)[b]

    def state_dict(self) -> dict[str, int]:
        """The window's position and the steps drawn since it last moved."""
        return {"position": self.position, "drawn": self.drawn}

    def check_state(self, state: Any, what: str) -> None:
        """Refuse a malformed window state (a :class:`~rlds_cli.errors.LoaderStateError`)."""
        state = check_state(state, f"{what} resident window")
        check_int(state, "position", f"{what} resident window")
        check_int(state, "drawn", f"{what} resident window")

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Take a state :meth:`check_state` accepted."""
        self.position, self.drawn = int(state["position"]), int(state["drawn"])


def make_resident_window(
    episode_lengths: Any, num_steps: int, window: Any, block_rows: Any, seed: int
) -> ResidentWindow | None:
    """The :class:`ResidentWindow` a sampler's ``resident_window=`` asks for (``None``: none),
    its arguments checked (``ValueError`` naming them)."""
    if window is None:
        if block_rows is not None:
            raise ValueError("block_rows= sizes the blocks of resident_window=; pass resident_window too")
        return None
    for name, value in (("resident_window", window), ("block_rows", block_rows)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int | np.integer) or value <= 0
        ):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    lengths = np.asarray([num_steps] if episode_lengths is None else episode_lengths, np.int64)
    episodes = Episodes(lengths)
    if episodes.num_steps != num_steps:
        raise ValueError(f"episode lengths sum to {episodes.num_steps} steps, not the sampler's {num_steps}")
    return ResidentWindow(
        episodes, DEFAULT_RESIDENT_ROWS if block_rows is None else int(block_rows), int(window), seed
    )


#: Rows of a ``resident_window=`` block when neither the caller nor the Loader (the storage's
#: chunk rows) sizes it.
DEFAULT_RESIDENT_ROWS = 4096
