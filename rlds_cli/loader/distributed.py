"""Data-parallel defaults: the rank and world size, and the run seed every rank shares.

* **Rank and world size** come from the arguments, else from ``torch.distributed`` when it is
  initialised (``torchrun``), else ``(0, 1)``.
* **The run seed** is the seed given, else ``$RLDS_SEED``, else a fresh one, drawn on rank 0 and
  broadcast when ``torch.distributed`` is initialised (building a loader with ``seed=None`` is
  then a collective call). A fresh seed is logged (logger ``rlds_cli.loader``, INFO).
* **Per-rank streams**: samplers with replacement seed their generator with
  :func:`stream_seed` of ``(seed, rank)``. Epoch samplers share the seed's permutation and take
  disjoint shards of it.

Never imports torch: ``torch.distributed`` is consulted only when torch is already imported.
"""

from __future__ import annotations

import logging
import secrets
import sys
from typing import Any, cast

import numpy as np

from rlds_cli import settings
from rlds_cli.errors import LoaderStateError, SeedError, SettingError

logger = logging.getLogger("rlds_cli.loader")

#: Environment variable with the run seed used when ``seed=None`` (the same on every rank).
SEED_ENV = "RLDS_SEED"
#: Fresh seeds have this many bits: they fit an int64 (torch generators, tensors, JSON).
SEED_BITS = 63


def _dist() -> Any:
    """``torch.distributed`` when torch is imported and a process group is initialised."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    dist = getattr(torch, "distributed", None)
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return None
    return dist


def check_seed(seed: Any) -> int:
    """``seed`` as an int, or a :class:`SeedError` naming it."""
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise SeedError(f"seed must be a non-negative integer or None, got {seed!r}")
    return int(seed)


def rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    """``(rank, world_size)``: those given, else ``torch.distributed``'s when it is initialised,
    else ``(0, 1)``. Explicit arguments always win."""
    dist = _dist()
    if dist is not None:
        rank = dist.get_rank() if rank is None else rank
        world_size = dist.get_world_size() if world_size is None else world_size
    world = 1 if world_size is None else world_size
    if isinstance(world, bool) or not isinstance(world, int | np.integer) or world <= 0:
        raise ValueError(f"world_size must be a positive integer, got {world_size!r}")
    r = 0 if rank is None else rank
    if isinstance(r, bool) or not isinstance(r, int | np.integer) or not 0 <= r < world:
        raise ValueError(f"rank must be in [0, world_size={int(world)}), got {rank!r}")
    return int(r), int(world)


def run_seed(seed: int | None, *, world_size: int = 1, shared: bool = False, what: str = "loader") -> int:
    """The seed of a run: ``seed``, else ``$RLDS_SEED``, else a fresh one (logged).

    Args:
        seed: The seed given by the user (``None``: choose one).
        world_size: Ranks that take part.
        shared: The ranks must agree on the seed (epoch shards of one permutation); with
            ``world_size > 1`` outside ``torch.distributed`` and no ``$RLDS_SEED``: :class:`SeedError`.
        what: What the seed is for, in the log line.

    Raises:
        SeedError: A malformed seed or ``$RLDS_SEED``, or a shared seed that cannot be agreed on.
    """
    if seed is not None:
        return check_seed(seed)
    try:
        env = settings.seed()
    except SettingError as exc:
        raise SeedError(exc.message, hint=exc.hint) from None
    if env is not None:
        value = check_seed(env)
        logger.info("%s: seed %d from $%s", what, value, SEED_ENV)
        return value
    dist = _dist()
    if dist is not None and dist.get_world_size() > 1:
        box = [secrets.randbits(SEED_BITS) if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)  # a collective: every rank builds its loader
        value = int(cast(int, box[0]))  # rank 0's int, on every rank
        source = "drawn on rank 0 and broadcast"
    elif shared and world_size > 1:
        raise SeedError(
            f"seed=None with world_size={world_size} outside torch.distributed: the ranks cannot "
            "agree on a fresh seed, so their shards would overlap",
            hint=f"pass the same seed= on every rank, or set {SEED_ENV} (e.g. from your launcher)",
        )
    else:
        value = secrets.randbits(SEED_BITS)
        source = "fresh"
    logger.info("%s: %s seed %d (pass seed=%d or set %s=%d to repeat this run)", what, source, value, value,
                SEED_ENV, value)  # fmt: skip
    return value


def all_gather_objects(obj: Any, world_size: int) -> list[Any] | None:
    """Every rank's ``obj``, by rank (``all_gather_object``: a collective call, every rank makes
    it), when ``torch.distributed`` is initialised with ``world_size > 1`` ranks; else ``None``."""
    dist = _dist()
    if dist is None or world_size <= 1 or dist.get_world_size() != world_size:
        return None
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj)
    return out


def stream_seed(seed: int, rank: int, world_size: int) -> int:
    """The generator seed of ``rank``'s stream: ``seed`` itself on a single rank, else a 63-bit
    hash of ``(seed, rank)``."""
    if world_size == 1:
        return int(seed)
    words = np.random.SeedSequence([int(seed), int(rank)]).generate_state(2, np.uint32)
    return int((int(words[0]) << 32 | int(words[1])) >> (64 - SEED_BITS))


def check_shard(state: dict[str, Any], rank: int, world_size: int, what: str) -> None:
    """Refuse a state saved by another rank or for another world size.

    A state without ``rank``/``world_size`` counts as rank 0 of 1.

    Raises:
        LoaderStateError: The state's rank or world size differs.
    """
    saved = int(state.get("rank", 0)), int(state.get("world_size", 1))
    if saved != (rank, world_size):
        raise LoaderStateError(
            f"{what} state was saved by rank {saved[0]} of {saved[1]}; this is rank {rank} of {world_size}",
            hint="give each rank the state it saved itself; to resume on another world size, "
            "restore a Loader state that holds every rank's progress (Loader.state_dict() under "
            "torch.distributed, or rlds_cli.loader.merge_states([...])), with sampler 'epoch' or 'blocks'",
        )


def check_steps(state: dict[str, Any], num_steps: int) -> None:
    """Refuse a state saved on a dataset of another size.

    Raises:
        LoaderStateError: Naming both sizes.
    """
    if int(state["num_steps"]) != num_steps:
        raise LoaderStateError(
            f"state is for a dataset of {state['num_steps']} steps, not {num_steps}",
            hint="restore a state saved by a loader over the same dataset",
        )
