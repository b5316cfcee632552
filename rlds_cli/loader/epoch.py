"""Sampling without replacement: epochs in which every step comes exactly once.

The permutation of an epoch is a pure function of ``(seed, epoch)``, so the state is three
integers (no 8 MB permutation in a checkpoint), a resumed run continues mid-epoch exactly, and
data-parallel ranks (and DataLoader workers) agree on the permutation without talking: shard
``s`` of ``n`` takes every ``n``-th position of it. A state saved at one world size resumes at
another (:meth:`EpochSampler.resume`, :mod:`rlds_cli.loader.elastic`): the steps no rank consumed
are sharded over the new ranks (strided, without padding: a rank's last batches may be shorter).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_cli.errors import LoaderStateError
from rlds_cli.loader.distributed import check_shard, check_steps, rank_world, run_seed
from rlds_cli.loader.elastic import (
    Generation,
    batches_for,
    check_history,
    history_field,
    joined_history,
    next_batch_size,
    replay,
)
from rlds_cli.loader.samplers import positive_int
from rlds_cli.loader.state_checks import check_array, check_int, check_shard_fields, check_state

if TYPE_CHECKING:
    from rlds_cli.loader.view_change import ViewChange


def epoch_permutation(num_steps: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The order of the steps in ``epoch`` (the same for every process given the same seed)."""
    if not shuffle:
        return np.arange(num_steps, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(num_steps).astype(np.int64, copy=False)


def shard(order: np.ndarray, index: int, count: int) -> np.ndarray:
    """Shard ``index`` of ``count`` of an epoch's order.

    Every shard gets ``ceil(len / count)`` steps: shards that fall short take steps from the start
    of the order (as ``torch.utils.data.DistributedSampler`` pads), so data-parallel ranks run the
    same number of batches. With ``count == 1`` this is ``order`` itself.
    """
    if count == 1:
        return order
    per = -(-len(order) // count)
    part = order[index::count]
    if len(part) < per:
        part = np.concatenate([part, order[: per - len(part)]])
    return part


class EpochSampler:
    """Batches without replacement: each step exactly once per epoch, reshuffled every epoch.

    Args:
        num_steps: Size of the dataset.
        batch_size: Indices per batch.
        seed: Seed of the epochs' permutations, the same on every rank (``None``: ``$RLDS_SEED``,
            else a fresh one, broadcast from rank 0 under ``torch.distributed``; kept in the
            state). With ``world_size > 1`` outside ``torch.distributed`` a seed is required.
        drop_last: Skip an epoch's last batch when it would be short (then the next batch starts
            the next epoch); otherwise that batch is shorter.
        shuffle: ``False`` visits the steps in order (for evaluation passes).
        rank: This process's shard (data parallel), in ``[0, world_size)``.
        world_size: Number of shards; each gets ``ceil(num_steps / world_size)`` steps per epoch.
    """

    def __init__(
        self,
        num_steps: int,
        batch_size: int,
        seed: int | None = None,
        *,
        drop_last: bool = False,
        shuffle: bool = True,
        rank: int = 0,
        world_size: int = 1,
    ) -> None:
        if num_steps <= 0:
            raise ValueError(f"cannot sample from an empty dataset (num_steps={num_steps})")
        self.num_steps = int(num_steps)
        self.batch_size = positive_int("batch_size", batch_size)
        self.rank, self.world_size = rank_world(rank, world_size)
        self.seed = run_seed(seed, world_size=self.world_size, shared=True, what="EpochSampler")
        self.drop_last = bool(drop_last)
        self.shuffle = bool(shuffle)
        self.epoch = 0
        self.position = 0
        self._order: np.ndarray | None = None
        # the epoch in progress was carried over a refresh: _order is what is left of it, mapped
        # to the new view, and no longer the pure function of (seed, epoch) it started as
        self._carried = False
        # resumed at another world size (rlds_cli.loader.elastic): the epoch's earlier
        # generations, and in this one the batches drawn and the batches every rank runs
        self.history: list[Generation] = []
        self.batch = 0
        self._batches = 0
        if self.drop_last and self.steps_per_epoch < self.batch_size:
            raise ValueError(
                f"batch_size={self.batch_size} with drop_last=True is more than the "
                f"{self.steps_per_epoch} steps of an epoch: no batch would ever be drawn"
            )

    @property
    def steps_per_epoch(self) -> int:
        """Steps this shard visits per epoch."""
        return -(-self.num_steps // self.world_size)

    @property
    def batches_per_epoch(self) -> int:
        """Batches in one epoch (the short last one included unless ``drop_last``)."""
        n, b = self.steps_per_epoch, self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def order(self) -> np.ndarray:
        """This shard's steps in the current epoch, in the order they are drawn."""
        if self._order is None:
            if self.history:
                self._order, self._batches = self._plan(self.seed, self.epoch, self.history)
            else:
                full = epoch_permutation(self.num_steps, self.seed, self.epoch, self.shuffle)
                self._order = shard(full, self.rank, self.world_size)
        return self._order

    @property
    def planned_batches(self) -> int | None:
        """The batches every rank runs in an epoch resumed at another world size (its batches
        sized by :func:`~rlds_cli.loader.elastic.next_batch_size`); ``None`` for an epoch drawn
        from its start."""
        if not self.history:
            return None
        self.order()
        return self._batches

    def _plan(self, seed: int, epoch: int, history: Sequence[Generation]) -> tuple[np.ndarray, int]:
        """This rank's order in the generation after ``history`` and the batches each rank runs."""

        def orders(rest: np.ndarray, g: int, world: int) -> list[np.ndarray]:
            if g == 0:
                return [shard(rest, r, world) for r in range(world)]
            return [rest[r::world] for r in range(world)]

        full = epoch_permutation(self.num_steps, seed, epoch, self.shuffle)
        rest = replay(full, self.num_steps, history, orders, "EpochSampler")
        if self.drop_last:  # every rank the same number of whole batches; the rest is dropped
            batches = (len(rest) // self.world_size) // self.batch_size
        else:
            batches = batches_for(len(rest), self.world_size, self.batch_size)
        return rest[self.rank :: self.world_size], batches

    def set_epoch(self, epoch: int) -> None:
        """Jump to the start of ``epoch``."""
        self.epoch, self.position, self._order, self._carried = int(epoch), 0, None, False
        self.history, self.batch = [], 0

    def follow(self, change: ViewChange) -> None:
        """Go on over a refreshed view of a growing dataset. An epoch is a permutation of the
        view as of its first batch: the epoch in progress keeps its order, less the rows evicted
        since (never served), its rows renumbered in the new view; rows added during it wait for
        the next epoch, which permutes the view of its own first batch. An epoch not started
        yet (or just finished) is simply drawn from the new view. Needs one shard
        (``world_size=1``): ranks refresh at different moments and could not agree on a view."""
        if self.world_size != 1:
            raise ValueError("an epoch over a growing dataset needs world_size=1")
        started = self.position > 0 or self._carried
        if started:
            rest = change.map_rows(self.order()[self.position :])
            self._order, self.position, self._carried = rest[rest >= 0], 0, True
        else:
            self._order = None  # the permutation of the new view, made at the first batch
        self.num_steps = change.num_steps

    def epoch_done(self) -> bool:
        """Whether the current epoch has no batch left (the next ``sample`` starts a new one)."""
        if self.history:
            self.order()
            return self.batch >= self._batches
        end = len(self.order()) if self._carried else self.steps_per_epoch
        left = end - self.position
        return left <= 0 or (self.drop_last and left < self.batch_size)

    def sample(self, n: int | None = None) -> np.ndarray:
        """The next batch of the epoch (``n`` indices at most), moving on to the next epoch when
        this one is done."""
        n = self.batch_size if n is None else n
        if self.epoch_done():
            self.set_epoch(self.epoch + 1)
        if self.history:
            left = len(self.order()) - self.position
            n = min(n, next_batch_size(left, self._batches - self.batch, self.batch_size))
            self.batch += 1
        out = self.order()[self.position : self.position + n].copy()  # callers may write to it
        self.position += len(out)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The epoch, the position in it and the seed: a resumed run continues mid-epoch (and
        ``order``, the rest of an epoch carried over a refresh, when there is one)."""
        state: dict[str, Any] = {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "num_steps": self.num_steps,
            "rank": self.rank,
            "world_size": self.world_size,
        }
        if self._carried:
            state["order"] = np.array(self.order())
        if self.history:
            state["history"], state["batch"] = history_field(self.history), self.batch
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (refused from another dataset, rank or world
        size: :class:`~rlds_cli.errors.LoaderStateError`)."""
        what = "EpochSampler"
        check_shard_fields(check_state(state, what), what, seed=True)
        check_int(state, "epoch", what)
        carried = "order" in state
        if carried:
            order = np.asarray(state["order"])
            check_array(state, "order", what, kind="iu", length=len(order) if order.ndim == 1 else -1)
        check_steps(state, self.num_steps)
        check_shard(state, self.rank, self.world_size, what)
        history = check_history(state, what)
        batches = 0
        if history:
            if carried:
                raise LoaderStateError(
                    f"{what} state has both 'order' and 'history'",
                    hint="restore a state saved by state_dict()",
                )
            resumed, batches = self._plan(int(state["seed"]), int(state["epoch"]), history)
            end = len(resumed)
            check_int(state, "batch", what, high=batches)
        else:
            end = len(state["order"]) if carried else self.steps_per_epoch
        check_int(state, "position", what, high=end)  # a negative one drew forever
        if carried and len(order) and int(order.max()) >= self.num_steps:
            raise LoaderStateError(
                f"{what} state's order holds rows past the dataset's {self.num_steps} steps",
                hint="restore a state saved by a loader over the same view of the dataset",
            )
        self.seed = int(state["seed"])
        self.set_epoch(int(state["epoch"]))
        if carried:
            self._order, self._carried = np.asarray(state["order"], np.int64).copy(), True
        if history:
            self.history, self._order, self._batches = history, resumed, batches
            self.batch = int(state["batch"])
        self.position = int(state["position"])

    def resume(self, states: Sequence[dict[str, Any]]) -> None:
        """Go on from the states of every rank of a run (any world size, saved at the same batch):
        this rank's share (every ``world_size``-th step) of the epoch's steps none of them
        consumed. Refused for an epoch carried over a refresh (one rank only)."""
        what = "EpochSampler"
        first, history = joined_history(states, what, ())
        check_shard_fields(first, what, seed=True)
        check_int(first, "epoch", what)
        check_steps(dict(first), self.num_steps)
        if any("order" in s for s in states):
            raise LoaderStateError(
                f"{what} state carries an epoch over a refresh of a growing dataset: "
                "it resumes on one rank only"
            )
        order, batches = self._plan(int(first["seed"]), int(first["epoch"]), history)
        self.seed = int(first["seed"])
        self.set_epoch(int(first["epoch"]))
        self.history, self._order, self._batches = history, order, batches
