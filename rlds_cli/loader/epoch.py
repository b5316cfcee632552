"""Sampling without replacement: epochs in which every step comes exactly once, and their elastic
resume.

An epoch's permutation is a pure function of ``(seed, epoch)``: the state is three integers (no
8 MB permutation in a checkpoint), a resumed run continues mid-epoch exactly, and data-parallel
ranks (and DataLoader workers) agree on it without communicating: shard ``s`` of ``n`` takes
every ``n``-th position.

**Elastic resume** (``"blocks"`` and ``"epoch"`` samplers). An epoch runs in *generations*:
generation 0 partitions its steps over the starting ranks; a resume at another world size
(:meth:`EpochSampler.resume`) starts the next, partitioning the steps no rank consumed over the
new ranks (strided, unpadded). A generation is recorded as ``(world_size, positions)``: steps of
its order each rank consumed. Each rank's order is a pure function of ``(seed, epoch, generation,
rank, world_size)`` and the steps left earlier, so :func:`replay` recomputes exactly which steps
were consumed: nothing is missed or repeated, whatever the world sizes and stop points.

Every rank of a generation runs the same number of batches (DDP needs it):
``ceil(ceil(rest / world_size) / batch_size)``, with a rank holding ``ceil`` or
``floor(rest / world_size)`` steps; batches are full except the last one or two
(:func:`next_batch_size`), never padded with repeated steps. Only a rank with fewer steps than
batches gets empty batches at its end.

Under ``torch.distributed``, :meth:`~rlds_cli.loader.Loader.state_dict` gathers every rank's
sampler state (``all_gather_object``: a collective call), so any rank's checkpoint holds the whole
epoch's progress; otherwise :func:`merge_states` joins the ranks' own states.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from rlds_cli.errors import LoaderStateError
from rlds_cli.loader.run_state import (
    check_array,
    check_int,
    check_loader_state,
    check_shard,
    check_shard_fields,
    check_state,
    check_steps,
    rank_world,
    run_seed,
)
from rlds_cli.loader.samplers import positive_int

if TYPE_CHECKING:
    from rlds_cli.loader.samplers import ViewChange


#: One generation of an epoch: its world size and each rank's consumed steps.
Generation = tuple[int, tuple[int, ...]]
#: The orders of every rank of a generation: ``(rest, generation, world_size) -> [order per rank]``.
Orders = Callable[[np.ndarray, int, int], list[np.ndarray]]

_HINT = (
    "save the state with Loader.state_dict() on every rank at the same batch (under torch.distributed "
    "it gathers all ranks), or merge the ranks' own states with rlds_cli.loader.merge_states([...])"
)


def share_bounds(n: int, world_size: int) -> np.ndarray:
    """``world_size + 1`` bounds splitting ``n`` steps into contiguous shares of ``ceil`` or
    ``floor(n / world_size)`` steps (the first ``n % world_size`` shares are the longer ones)."""
    r = np.arange(world_size + 1, dtype=np.int64)
    return r * (n // world_size) + np.minimum(r, n % world_size)


def batches_for(rest: int, world_size: int, batch_size: int) -> int:
    """Batches every rank runs when ``world_size`` ranks share ``rest`` steps (0 when none)."""
    share = -(-rest // world_size)
    return -(-share // batch_size)


def next_batch_size(left: int, batches_left: int, batch_size: int) -> int:
    """Size of a rank's next batch with ``left`` steps for ``batches_left`` batches: full while
    that leaves a step for each batch after it, else what does; 0 only when no step is left."""
    if batches_left <= 0:
        return 0
    if left >= batches_left:
        return min(batch_size, left - (batches_left - 1))
    return min(left, 1)


def replay(
    base: np.ndarray, num_steps: int, history: Sequence[Generation], orders: Orders, what: str
) -> np.ndarray:
    """The steps of ``base`` (an epoch's steps in its order) that the generations of ``history``
    left unconsumed, in ``base``'s order.

    Raises:
        LoaderStateError: A rank's position is past its order in that generation.
    """
    rest = base
    for g, (world, positions) in enumerate(history):
        ranks = orders(rest, g, world)
        consumed = np.zeros(num_steps, np.bool_)
        for r, (order, p) in enumerate(zip(ranks, positions, strict=True)):
            if p > len(order):
                raise LoaderStateError(
                    f"{what} state: rank {r} of {world} consumed {p} steps in generation {g} of the "
                    f"epoch, but its share holds {len(order)}",
                    hint=_HINT,
                )
            consumed[order[:p]] = True
        rest = rest[~consumed[rest]]
    return rest


def check_history(state: Mapping[str, Any], what: str) -> list[Generation]:
    """The ``history`` field of an elastic sampler's state (absent: none), checked."""
    raw = state.get("history", [])
    out: list[Generation] = []
    if not isinstance(raw, list | tuple):
        raise LoaderStateError(f"{what} state field 'history' must be a list, got {type(raw).__name__}")
    for item in raw:
        ok = isinstance(item, list | tuple) and len(item) == 2
        world, positions = (item[0], item[1]) if ok else (None, None)
        ok = ok and _count(world, 1) and isinstance(positions, list | tuple) and len(positions) == world
        if not ok or not all(_count(p, 0) for p in positions):  # type: ignore[union-attr]
            raise LoaderStateError(
                f"{what} state field 'history' holds {item!r}; each entry must be "
                "[world_size, [steps consumed by each rank]]",
                hint=_HINT,
            )
        out.append((int(world), tuple(int(p) for p in positions)))  # type: ignore[arg-type, union-attr]
    return out


def _count(value: Any, low: int) -> bool:
    return not isinstance(value, bool) and isinstance(value, int | np.integer) and bool(value >= low)


def history_field(history: Sequence[Generation]) -> list[list[Any]]:
    """``history`` as a state stores it (plain lists: JSON and ``torch.load(weights_only=True)``)."""
    return [[w, list(p)] for w, p in history]


def every_rank(states: Any, what: str) -> list[Mapping[str, Any]]:
    """``states`` sorted by rank, checked to be one of each rank ``0..world_size - 1``."""
    if not isinstance(states, list | tuple) or not states:
        raise LoaderStateError(f"{what}: give the states of every rank, a non-empty list", hint=_HINT)
    checked = [check_state(s, what) for s in states]
    world = checked[0].get("world_size", 1)
    ranks = sorted(s.get("rank", 0) for s in checked)
    if ranks != list(range(world)) or any(s.get("world_size", 1) != world for s in checked):
        raise LoaderStateError(
            f"{what}: the states are of ranks {ranks} (world sizes "
            f"{sorted({s.get('world_size', 1) for s in checked})}); a resume needs one state of "
            f"each rank 0..{world - 1} of one run",
            hint=_HINT,
        )
    return sorted(checked, key=lambda s: int(s.get("rank", 0)))


def joined_history(
    states: Sequence[Any], what: str, same: Sequence[str]
) -> tuple[Mapping[str, Any], list[Generation]]:
    """Every rank's sampler state of one generation, checked to belong together, and the epoch's
    history with that generation appended.

    Args:
        states: Each rank's state (any order); each says its ``rank`` and ``world_size``.
        what: The sampler's name, for messages.
        same: Fields every state must agree on (besides seed, epoch, dataset size and history).

    Returns:
        Rank 0's state and the history to resume from.

    Raises:
        LoaderStateError: Missing or duplicated ranks, or states of different runs or epochs.
    """
    by_rank = every_rank(states, what)
    first = by_rank[0]
    for key in ("seed", "epoch", "num_steps", "history", *same):
        values = [s.get(key) for s in by_rank]
        if any(v != values[0] for v in values):
            raise LoaderStateError(
                f"{what}: the ranks' states differ in {key!r} ({values}); they must be saved "
                "at the same batch of one run",
                hint=_HINT,
            )
    history = check_history(first, what)
    positions = []
    for s in by_rank:
        p = s.get("position")
        if not _count(p, 0):
            raise LoaderStateError(f"{what} state field 'position' must be an integer >= 0, got {p!r}")
        positions.append(int(p))  # type: ignore[arg-type]
    return first, [*history, (len(by_rank), tuple(positions))]


def merge_states(states: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One :class:`~rlds_cli.loader.Loader` state from the last state each rank saved itself
    (``rank=``/``world_size=`` given by hand, no ``torch.distributed``), restorable by a loader of
    any world size. At the same world size with every rank at the same batch, each rank continues
    its own order exactly; otherwise the epoch's unconsumed steps are partitioned over the new
    ranks (``"blocks"`` and ``"epoch"`` samplers).

    Raises:
        LoaderStateError: A state that is not a loader state, or states that are not one of each
            rank of one run (the message says which).
    """
    if not isinstance(states, list | tuple) or not states:
        raise LoaderStateError("merge_states: give a non-empty list of each rank's Loader state", hint=_HINT)
    by_rank = every_rank([check_loader_state(s) for s in states], "merge_states")
    sampler_states = [s["sampler"] for s in by_rank]
    merged = dict(by_rank[0])
    merged["ranks"] = sampler_states
    merged["batches_drawn"] = min(int(s.get("batches_drawn", 0)) for s in by_rank)
    merged["epoch_end_pending"] = all(bool(s.get("epoch_end_pending", False)) for s in by_rank)
    return merged


def in_step(states: Sequence[Any]) -> bool:
    """Whether every rank's sampler state is at the same batch of the same epoch."""
    marks = {
        (s.get("epoch"), s.get("batch", s.get("position"))) if isinstance(s, Mapping) else None
        for s in states
    }
    return len(marks) == 1


def check_ranks_field(state: Mapping[str, Any]) -> list[Any] | None:
    """A loader state's ``ranks`` (every rank's sampler state, by rank), or ``None``."""
    ranks = state.get("ranks")
    if ranks is None:
        return None
    world = state.get("world_size", 1)
    if not isinstance(ranks, list | tuple) or len(ranks) != world:
        raise LoaderStateError(
            f"Loader state field 'ranks' must list the sampler state of each of its {world} ranks",
            hint=_HINT,
        )
    return list(ranks)


def epoch_permutation(num_steps: int, seed: int, epoch: int, shuffle: bool = True) -> np.ndarray:
    """The order of the steps in ``epoch`` (the same for every process given the same seed)."""
    if not shuffle:
        return np.arange(num_steps, dtype=np.int64)
    return np.random.default_rng([seed, epoch]).permutation(num_steps).astype(np.int64, copy=False)


def shard(order: np.ndarray, index: int, count: int) -> np.ndarray:
    """Shard ``index`` of ``count`` of an epoch's order.

    Every shard gets ``ceil(len / count)`` steps, short ones padded from the start of the order
    (as ``torch.utils.data.DistributedSampler``). With ``count == 1``: ``order`` itself.
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
        # epoch carried over a refresh: _order is its rest mapped to the new view, not (seed, epoch)'s
        self._carried = False
        # elastic resume: earlier generations; batches drawn and batches every rank runs in this one
        self.history: list[Generation] = []
        self.batch = 0
        self._batches = 0
        self.unserved = 0  # of the epoch, over every rank, as of its last plan (Elastic)
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
        """Batches every rank runs in an epoch resumed at another world size (sized by
        :func:`next_batch_size`); ``None`` for an epoch drawn from its start."""
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
        if self.drop_last and history and self._ran_out(full, history, orders):
            rest = rest[:0]  # every rank ran its last whole batch: the remainder was dropped
        self.unserved = len(rest)
        if self.drop_last:  # every rank the same number of whole batches; the rest is dropped
            batches = (len(rest) // self.world_size) // self.batch_size
        else:
            batches = batches_for(len(rest), self.world_size, self.batch_size)
        return rest[self.rank :: self.world_size], batches

    def _ran_out(self, full: np.ndarray, history: Sequence[Generation], orders: Orders) -> bool:
        """Whether every rank of ``history``'s last generation ran all its whole batches (with
        ``drop_last``: the epoch ended there, its remainder dropped, not owed to a later one)."""
        world, positions = history[-1]
        before = replay(full, self.num_steps, history[:-1], orders, "EpochSampler")
        shares = orders(before, len(history) - 1, world)
        if len(history) == 1:  # each rank its own share's whole batches
            ends = [len(s) // self.batch_size * self.batch_size for s in shares]
        else:  # every rank the same whole batches (see _plan)
            ends = [len(before) // world // self.batch_size * self.batch_size] * world
        return all(p >= end for p, end in zip(positions, ends, strict=True))

    def set_epoch(self, epoch: int) -> None:
        """Jump to the start of ``epoch``."""
        self.epoch, self.position, self._order, self._carried = int(epoch), 0, None, False
        self.history, self.batch = [], 0

    def follow(self, change: ViewChange) -> None:
        """Go on over a refreshed view of a growing dataset.

        An epoch permutes the view as of its first batch: an epoch in progress keeps its order,
        less rows evicted since (never served), renumbered in the new view; added rows wait for
        the next epoch. Needs ``world_size=1`` (ranks refresh at different moments)."""
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
        """The next batch of the epoch (at most ``n`` indices), starting the next epoch when this
        one is done."""
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
        """Seed, epoch and position in it (plus ``order``: the rest of an epoch carried over a
        refresh; ``history``/``batch`` after an elastic resume)."""
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
        """Go on from every rank's state of a run (any world size, saved at the same batch) with
        this rank's share (every ``world_size``-th step) of the epoch's unconsumed steps. Refused
        for an epoch carried over a refresh."""
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
