"""Elastic resume: an epoch's progress over every rank, and its rest re-partitioned at another
world size (the ``"blocks"`` and ``"epoch"`` samplers).

An elastic sampler's epoch runs in *generations*. Generation 0 partitions the epoch's steps over
the ranks it starts with; a resume at another world size starts the next generation, which
partitions the steps no rank has consumed yet over the new ranks. A generation is recorded as
``(world_size, positions)``: how many steps of its order each rank had consumed when it ended.
Each rank's order in a generation is a pure function of ``(seed, epoch, generation, rank,
world_size)`` and the steps left by the earlier generations, so the history (a few integers a
rank) says exactly which steps the epoch has consumed: :func:`replay` recomputes it. Nothing is
missed or repeated, whatever the world sizes and wherever the ranks stopped.

Every rank of a generation runs the same number of batches (DDP needs it): with ``world_size``
ranks sharing ``rest`` steps a rank gets ``ceil`` or ``floor(rest / world_size)`` of them, and
every rank runs ``ceil(ceil(rest / world_size) / batch_size)`` batches; a rank's batches are
full except its last one or two, which are shorter (:func:`next_batch_size`), never padded with
repeated steps. Only a rank with fewer steps than batches (``batch_size=1`` with uneven shares,
or fewer steps left than ranks after a resume) gets empty batches at its end.

A :class:`~rlds_cli.loader.Loader` under ``torch.distributed`` gathers every rank's sampler state
in :meth:`~rlds_cli.loader.Loader.state_dict` (``all_gather_object``: a collective call), so any
rank's checkpoint holds the whole epoch's progress; without it, :func:`merge_states` joins the
ranks' own states.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from rlds_cli.errors import LoaderStateError
from rlds_cli.loader.state_checks import check_loader_state, check_state

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
    (``rank=``/``world_size=`` given by hand, no ``torch.distributed``): a loader of any world
    size restores it with ``load_state_dict``. At the same world size, with every rank at the
    same batch, each rank continues its own order exactly; otherwise (another world size, or a
    rank that died earlier than the others) the epoch's unconsumed steps are partitioned over
    the new ranks (``"blocks"`` and ``"epoch"`` samplers).

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
    """Whether every rank's sampler state is at the same batch of the same epoch (as states
    gathered by a DDP loop are); ranks that stopped at different batches would then run
    different numbers of batches to the epoch's end."""
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
