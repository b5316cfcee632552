"""Sampling without replacement: epochs in which every step comes exactly once.

The permutation of an epoch is a pure function of ``(seed, epoch)``, so the state is three
integers (no 8 MB permutation in a checkpoint), a resumed run continues mid-epoch exactly, and
data-parallel ranks (and DataLoader workers) agree on the permutation without talking: shard
``s`` of ``n`` takes every ``n``-th position of it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlds_cli.loader.distributed import check_shard, check_steps, rank_world, run_seed
from rlds_cli.loader.samplers import positive_int
from rlds_cli.loader.state_checks import check_int, check_shard_fields, check_state


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
            full = epoch_permutation(self.num_steps, self.seed, self.epoch, self.shuffle)
            self._order = shard(full, self.rank, self.world_size)
        return self._order

    def set_epoch(self, epoch: int) -> None:
        """Jump to the start of ``epoch``."""
        self.epoch, self.position, self._order = int(epoch), 0, None

    def epoch_done(self) -> bool:
        """Whether the current epoch has no batch left (the next ``sample`` starts a new one)."""
        left = self.steps_per_epoch - self.position
        return left <= 0 or (self.drop_last and left < self.batch_size)

    def sample(self, n: int | None = None) -> np.ndarray:
        """The next batch of the epoch (``n`` indices at most), moving on to the next epoch when
        this one is done."""
        n = self.batch_size if n is None else n
        if self.epoch_done():
            self.set_epoch(self.epoch + 1)
        out = self.order()[self.position : self.position + n].copy()  # callers may write to it
        self.position += len(out)
        return out

    def state_dict(self) -> dict[str, Any]:
        """The epoch, the position in it and the seed: a resumed run continues mid-epoch."""
        return {
            "seed": self.seed,
            "epoch": self.epoch,
            "position": self.position,
            "num_steps": self.num_steps,
            "rank": self.rank,
            "world_size": self.world_size,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a state from :meth:`state_dict` (refused from another dataset, rank or world
        size: :class:`~rlds_cli.errors.LoaderStateError`)."""
        what = "EpochSampler"
        check_shard_fields(check_state(state, what), what, seed=True)
        check_int(state, "epoch", what)
        check_int(state, "position", what, high=self.steps_per_epoch)  # a negative one drew forever
        check_steps(state, self.num_steps)
        check_shard(state, self.rank, self.world_size, what)
        self.seed = int(state["seed"])
        self.set_epoch(int(state["epoch"]))
        self.position = int(state["position"])
