"""``sampler="blocks"``: an epoch order that suits chunked storage (zarr shards, object stores).

Episodes whose first step falls in rows ``[k * block_rows, (k + 1) * block_rows)`` form block
``k`` (whole episodes, contiguous rows, aligned with storage chunks of ``block_rows`` rows).
An epoch:

1. rotates the storage order to start at a block drawn from ``(seed, epoch)`` and gives each
   rank a contiguous share (``ceil`` or ``floor(steps / ranks)`` rows): a rank reads one run of
   storage, sharing at most two chunks per column with neighbours, and a node's consecutive
   ``torchrun`` ranks read one run together; the runs move every epoch;
2. permutes the blocks of each rank's share (from ``(seed, epoch, rank)``);
3. shuffles each rank's rows within windows of ``shuffle_window`` consecutive blocks (as Mosaic
   Streaming's block shuffle and WebDataset's shuffle buffer).

Each step is drawn exactly once per epoch over all ranks; every rank runs the same number of
batches (:mod:`rlds_cli.loader.epoch`: shorter last batches, never repeated steps). The state is
a few integers, and resumes at another world size (:meth:`BlockSampler.resume`).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np

from rlds_cli.cache.reader import Episodes
from rlds_cli.errors import LoaderStateError
from rlds_cli.loader.epoch import (
    Generation,
    batches_for,
    check_history,
    history_field,
    joined_history,
    next_batch_size,
    replay,
    share_bounds,
)
from rlds_cli.loader.run_state import (
    check_int,
    check_shard,
    check_shard_fields,
    check_state,
    check_steps,
    rank_world,
    run_seed,
)
from rlds_cli.loader.samplers import block_starts, positive_int

#: Rows a block holds when the storage says nothing (memory maps; one-row chunks of frames):
#: about this many bytes of the dataset's widest row, within the bounds below.
DEFAULT_BLOCK_BYTES = 8 << 20
BLOCK_ROWS_BOUNDS = (64, 65536)
#: Blocks shuffled together by default (see docs/loader.md for the randomness this gives).
DEFAULT_SHUFFLE_WINDOW = 16


def storage_block_rows(dataset: Any) -> int:
    """Block rows suited to ``dataset``'s storage: one chunk (a shard, for sharded zarr) of its
    widest stored column, else about :data:`DEFAULT_BLOCK_BYTES` of that column's stored rows."""
    fields = dataset.stored_fields
    if not fields:
        return BLOCK_ROWS_BOUNDS[1]
    key = max(fields, key=lambda k: fields[k].row_bytes)
    column = dataset.column(key)
    chunk = int(getattr(column, "chunk_rows", 0) or 0)
    if chunk > 1:
        return chunk
    row_bytes = fields[key].row_bytes
    stored = getattr(column, "ends", None)
    if stored is not None and len(stored):  # a frame column: its rows as stored (JPEG...), not decoded
        row_bytes = int(stored[-1]) // len(stored)
    rows = DEFAULT_BLOCK_BYTES // max(1, row_bytes)
    return int(np.clip(rows, *BLOCK_ROWS_BOUNDS))


def window_shuffle(
    share: np.ndarray, blocks: np.ndarray, window: int, rng: np.random.Generator
) -> np.ndarray:
    """``share`` (steps, grouped by block) with its steps permuted within each run of ``window``
    consecutive blocks (``blocks``: each step's block)."""
    out = share.copy()
    changes = np.flatnonzero(blocks[1:] != blocks[:-1]) + 1  # where each block after the first starts
    bounds = np.r_[0, changes[window - 1 :: window], len(share)]
    for a, b in itertools.pairwise(bounds):
        out[a:b] = out[a:b][rng.permutation(b - a)]
    return out


class BlockSampler:
    """Batches without replacement in an order that reads whole blocks of episodes (see the module
    docstring): each step exactly once per epoch over all ranks.

    Args:
        episode_lengths: Steps per episode, in dataset order.
        batch_size: Steps per batch (a rank's last batch or two of an epoch may be shorter).
        seed: The run seed, the same on every rank (``None``: ``$RLDS_SEED``, else a fresh one,
            broadcast from rank 0 under ``torch.distributed``).
        block_rows: Rows per block (the Loader's default: the dataset's storage chunk,
            :func:`storage_block_rows`).
        shuffle_window: Blocks whose rows are shuffled together (1: each block's rows shuffled
            among themselves, blocks one after another).
        rank, world_size: This process's share.
    """

    def __init__(
        self,
        episode_lengths: np.ndarray,
        batch_size: int,
        seed: int | None = None,
        *,
        block_rows: int = BLOCK_ROWS_BOUNDS[1],
        shuffle_window: int = DEFAULT_SHUFFLE_WINDOW,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        self.episodes = Episodes(episode_lengths)
        self.num_steps = self.episodes.num_steps
        self.batch_size = positive_int("batch_size", batch_size)
        self.block_rows = positive_int("block_rows", block_rows)
        self.shuffle_window = positive_int("shuffle_window", shuffle_window)
        self.rank, self.world_size = rank_world(rank, world_size)
        if self.num_steps < self.world_size:
            raise ValueError(
                f"{self.num_steps} steps cannot give each of {self.world_size} ranks a share of the epoch"
            )
        self.seed = run_seed(seed, world_size=self.world_size, shared=True, what="BlockSampler")
        self.starts = block_starts(self.episodes, self.block_rows)
        self.lengths = np.diff(np.r_[self.starts, self.num_steps])
        self.epoch = self.position = self.batch = 0
        self.history: list[Generation] = []
        self._order: np.ndarray | None = None
        self._batches = 0
        self.unserved = 0  # of the epoch, over every rank, as of its last plan (Elastic)

    @property
    def num_blocks(self) -> int:
        """Blocks of the dataset."""
        return len(self.starts)

    def block_of(self, steps: np.ndarray) -> np.ndarray:
        """The block of each step (int64)."""
        return np.searchsorted(self.starts, steps, side="right") - 1

    @property
    def batches_per_epoch(self) -> int:
        """Batches every rank runs in a whole epoch at this world size."""
        return batches_for(self.num_steps, self.world_size, self.batch_size)

    def sequence(self, epoch: int) -> np.ndarray:
        """Every step of ``epoch`` in storage order, rotated to start at a block drawn from
        ``(seed, epoch)``; ranks take contiguous shares of it."""
        first = int(np.random.default_rng([self.seed, epoch]).integers(self.num_blocks))
        return np.roll(np.arange(self.num_steps, dtype=np.int64), -int(self.starts[first]))

    def _rank_order(self, rest: np.ndarray, epoch: int, generation: int, world: int, rank: int) -> np.ndarray:
        """A rank's share of ``rest``: a contiguous slice, its blocks permuted, then its rows
        shuffled within each window of ``shuffle_window`` blocks."""
        bounds = share_bounds(len(rest), world)
        share = rest[bounds[rank] : bounds[rank + 1]]
        rng = np.random.default_rng([self.seed, epoch, generation + 1, rank])
        blocks = self.block_of(share)
        runs = np.flatnonzero(np.r_[True, blocks[1:] != blocks[:-1]])  # where each block's run starts
        lengths = np.diff(np.r_[runs, len(share)])
        perm = rng.permutation(len(runs))
        lengths = lengths[perm]
        take = np.repeat(runs[perm] - (np.cumsum(lengths) - lengths), lengths) + np.arange(len(share))
        return window_shuffle(share[take], blocks[take], self.shuffle_window, rng)

    def _orders(self, epoch: int) -> Any:
        def orders(rest: np.ndarray, g: int, world: int) -> list[np.ndarray]:
            return [self._rank_order(rest, epoch, g, world, r) for r in range(world)]

        return orders

    def _plan_with(self, seed: int, epoch: int, history: Sequence[Generation]) -> tuple[np.ndarray, int]:
        """:meth:`_plan` under another seed (the sampler's own is kept if that raises)."""
        old, self.seed = self.seed, seed
        try:
            return self._plan(epoch, history)
        except BaseException:
            self.seed = old
            raise

    def _plan(self, epoch: int, history: Sequence[Generation]) -> tuple[np.ndarray, int]:
        """This rank's order in the current generation and the batches every rank runs in it."""
        what = type(self).__name__
        rest = replay(self.sequence(epoch), self.num_steps, history, self._orders(epoch), what)
        self.unserved = len(rest)
        order = self._rank_order(rest, epoch, len(history), self.world_size, self.rank)
        return order, batches_for(len(rest), self.world_size, self.batch_size)

    def order(self) -> np.ndarray:
        """This rank's steps in the current generation of the epoch, in the order they are drawn."""
        if self._order is None:
            self._order, self._batches = self._plan(self.epoch, self.history)
        return self._order

    def set_epoch(self, epoch: int) -> None:
        """Jump to the start of ``epoch``."""
        self.epoch, self.position, self.batch, self.history, self._order = int(epoch), 0, 0, [], None

    def epoch_done(self) -> bool:
        """Whether this rank has run every batch of the epoch (the next ``sample`` starts a new one)."""
        self.order()
        return self.batch >= self._batches

    def sample(self) -> np.ndarray:
        """The next batch of the epoch, moving on to the next epoch when this one is done."""
        if self.epoch_done():
            self.set_epoch(self.epoch + 1)
            self.order()
        order = self.order()
        size = next_batch_size(len(order) - self.position, self._batches - self.batch, self.batch_size)
        out = order[self.position : self.position + size].copy()  # callers may write to it
        self.position += size
        self.batch += 1
        return out

    def state_dict(self) -> dict[str, Any]:
        """Seed, epoch, this rank's position and batch, earlier generations, and whose state it is."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "batch": self.batch,
            "history": history_field(self.history),
            "num_steps": self.num_steps,
            "block_rows": self.block_rows,
            "shuffle_window": self.shuffle_window,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def _check_common(self, state: Any) -> Any:
        what = type(self).__name__
        check_shard_fields(check_state(state, what), what, seed=True)
        check_int(state, "epoch", what)
        for key in ("block_rows", "shuffle_window"):
            if check_int(state, key, what, low=1) != getattr(self, key):
                raise LoaderStateError(
                    f"{what} state has {key}={state[key]}; this sampler has {key}={getattr(self, key)} "
                    "(other blocks or windows: another order)",
                    hint=f"build the sampler with {key}={state[key]}",
                )
        check_steps(state, self.num_steps)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore this rank's own state from :meth:`state_dict` (refused from another dataset,
        rank or world size: :class:`~rlds_cli.errors.LoaderStateError`; see :meth:`resume`)."""
        what = type(self).__name__
        self._check_common(state)
        check_shard(state, self.rank, self.world_size, what)
        history = check_history(state, what)
        old = self.seed
        order, batches = self._plan_with(int(state["seed"]), int(state["epoch"]), history)
        try:
            check_int(state, "position", what, high=len(order))
            check_int(state, "batch", what, high=batches)
        except LoaderStateError:
            self.seed = old
            raise
        self.set_epoch(int(state["epoch"]))
        self.history, self._order, self._batches = history, order, batches
        self.position, self.batch = int(state["position"]), int(state["batch"])

    def resume(self, states: Sequence[dict[str, Any]]) -> None:
        """Go on from every rank's state of a run (any world size, saved at the same batch) with
        this rank's share of the epoch's unconsumed steps."""
        what = type(self).__name__
        first, history = joined_history(states, what, ("block_rows", "shuffle_window"))
        self._check_common(first)
        epoch = int(first["epoch"])
        # raises on positions past a rank's share; takes the states' seed
        order, batches = self._plan_with(int(first["seed"]), epoch, history)
        self.set_epoch(epoch)
        self.history, self._order, self._batches = history, order, batches
